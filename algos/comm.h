/* The communicator as the algorithms see it, and the few services every
 * collective shares: the per-call deadline, tags, posting with byte
 * accounting, waiting with liveness checks, and failure bookkeeping.
 *
 * Algorithms (one per file, gloo style) include only this header and
 * transport/fabric.h's request type; they never touch libfabric. */
#ifndef TERSE_ALGOS_COMM_H
#define TERSE_ALGOS_COMM_H

#include <pthread.h>
#include <sys/types.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "terse.h"
#include "transport/fabric.h"
#include "transport/store.h"

/* Requests in flight at once for one collective. They live in the
 * communicator, not on an algorithm's stack: after an aborted wait the
 * transport may still hold pointers to them until terse_comm_free closes
 * the endpoint. */
#define TERSE__COMM_MAX_REQS 64

/* Scratch buffers an algorithm may hold at once (grow-only, kept between
 * calls so steady-state collectives do not allocate). */
#define TERSE__COMM_SCRATCH 6
#define TERSE__SCRATCH_GROUP 4 /* a group's fused dense buffers (engine.c) */
#define TERSE__SCRATCH_STATE 5 /* a codec's state before the call (allreduce.c) */

/* Tags: the low 48 bits belong to us (the transport owns the high 16).
 * seq (20 bits, the collective's sequence number on this communicator)
 * keeps consecutive collectives from ever matching each other's messages;
 * the message index (28 bits) keeps the messages of one collective apart.
 * Both wrap harmlessly: two messages with the same tag would have to be
 * 2^20 collectives or 2^28 messages apart and in flight together. */
#define TERSE__TAG_SEQ_BITS 20
#define TERSE__TAG_MSG_BITS 28

/* How bytes count in terse_comm_stats: the collective's data, or terse's
 * own framing around it (size exchanges). */
typedef enum { TERSE__BYTES_PAYLOAD = 0, TERSE__BYTES_FRAMING = 1 } terse__bytes_kind;

/* What a request runs (engine.c). */
typedef enum {
    TERSE__OP_ALLREDUCE,
    TERSE__OP_BROADCAST,
    TERSE__OP_ALLGATHER,
    TERSE__OP_BARRIER,
    TERSE__OP_GROUP, /* internal: the members of one terse_group_end */
    TERSE__OP_EXT    /* a parameter-server operation (algos/ps_*.c) */
} terse__op_kind;

/* An EXT request's body: run by the executor like a collective, between
 * begin and end; *keep_usable = 1 for a failure that concerns only this
 * request (a server's refusal), which leaves the communicator usable.
 * The engine does not poll the store for lost ranks before it: the
 * operation decides which ranks matter. */
typedef terse_status (*terse__ext_fn)(terse_comm *c, terse_request *r, int *keep_usable);

struct terse_request {
    terse_comm *comm;
    terse__op_kind kind;
    union {
        struct { float *buf; size_t n; terse_codec *codec; terse_op op; } ar;
        struct { void *buf; size_t bytes; int root; } bc;
        struct { const void *send; size_t send_bytes; void *recv; size_t recv_cap;
                 size_t *counts; } ag;
        struct { terse__ext_fn run; void *obj; void *item; int op; size_t key; float *buf;
                 uint64_t clock; float weight; const char *name; } ext;
    } a;
    terse_request *next;    /* the queue, or the next member of a group */
    terse_request *members; /* TERSE__OP_GROUP: its members, in start order */
    int in_group;           /* started inside a group not yet ended */
    int orphan;             /* freed inside its open group: free once run */
    pid_t pid;              /* the process that started it */
    _Atomic int done;       /* set (release) after status and error are final */
    terse_status status;
    char error[512];        /* terse_last_error() of a failure, for the waiter */
};

/* Tuning that changes the algorithm or the framing: read from the
 * environment once per communicator (common/env.h) and checked equal on
 * every rank at init (comm_params.c). */
typedef struct terse__params {
    size_t rd_max_bytes;     /* TERSE_RD_MAX_BYTES, default 64 KiB */
    size_t ring_chunk_bytes; /* TERSE_RING_CHUNK_BYTES, default 512 KiB */
    size_t chunk_bytes;      /* TERSE_CHUNK_BYTES (transport), default 1 MiB */
    int progress_caller;     /* TERSE_PROGRESS=caller (rank-local: not agreed) */
    size_t wire;             /* TERSE_WIRE: 0 auto, 1 none, 2 mac, 3 encrypt (agreed) */
    size_t compressed_algo;  /* TERSE_COMPRESSED_ALGO: 0 auto, 1 gather, 2 rs (agreed) */
    size_t pipeline_bytes;   /* TERSE_PIPELINE_BYTES: fp32 bytes a piece of the pipelined
                                all-gather holds (0: never cut), default 256 KiB (agreed) */
} terse__params;

/* 256 KiB: the transport moves a piece only between encodes (one progress
 * round per piece), and a piece message above rxm's eager size needs a
 * rendezvous round trip, so a piece must encode quickly: at 1 MiB, vq
 * (about 13 ns an element here) left a 64 MiB all-gather 24% waiting; at
 * 256 KiB no codec waits, and fp16 ... sign were as fast as at 1 MiB
 * (docs/collectives.md, "The pipelined all-gather"). */
#define TERSE__PIPELINE_BYTES_DEFAULT ((size_t)256 << 10)

/* Read them (a malformed value fails with TERSE_ERR_INVALID). */
terse_status terse__params_read(int rank, terse__params *p);

struct terse_comm {
    int rank, nranks;
    int timeout_ms;
    terse__params params;
    terse__store *store;   /* NULL for a single rank */
    terse__fabric *fabric; /* NULL for a single rank */
    char provider[64];

    uint64_t seq;         /* bumped once per collective phase, on every rank */
    uint64_t store_lost_ns; /* when the store first reported a loss (0: never) */
    uint64_t alive_checked_ns; /* when the store was last polled */
    int store_said;         /* the wait failed because the store reported a loss */

    int failed;
    char failure[512]; /* the sentence of the first error */

    terse_status fail_status; /* the first error's status */

    terse_comm_stats stats;
    pthread_mutex_t stats_lock; /* stats are written by the executor, read by anyone */

    /* Engine (engine.c). lock guards the queue, busy, stop, the group and
     * failed/failure/fail_status; `work` wakes the progress thread, `idle`
     * wakes waiters when a request completes. Only the one executor (the
     * thread that set busy) touches the fabric, seq, reqs and scratch. */
    pthread_mutex_t lock;
    pthread_cond_t work, idle;
    pthread_t thread;
    int has_thread;      /* TERSE_PROGRESS=thread (the default) */
    int busy;            /* an executor is running a request */
    int stop;            /* the progress thread should exit */
    _Atomic int aborted; /* terse_comm_abort was called */
    _Atomic int abandoned; /* the watchdog gave up on a stuck executor */
    int watched;         /* shm: blocking calls too go to the progress thread */
    int wire_mac;        /* data messages carry MACs (TERSE_WIRE) */
    int rejoined;        /* joined as a lost rank's replacement (TERSE_REJOIN) */
    uint8_t wire_nonce[32]; /* this rank's, published at init (mac) */
    terse_request *running; /* what the executor holds */
    int inflight;        /* requests started and not yet done */
    int waiters;         /* threads inside drive() */
    int refusing;        /* a start failed on this rank: refuse later starts */
    terse_request *q_head, *q_tail; /* started, not yet run */
    _Atomic unsigned enqueued; /* bumped (under lock) by every enqueue: for spinners */
    int group_depth;
    terse_request *group_head, *group_tail; /* members of the open group */
    int engine_ready;    /* lock, conds (and thread) exist */
    pid_t pid;           /* the process that created it: a forked child must not use it */

    terse__fabric_req reqs[TERSE__COMM_MAX_REQS];
    void *scratch[TERSE__COMM_SCRATCH];
    size_t scratch_cap[TERSE__COMM_SCRATCH];
};

/* Start a collective: refuse an aborted communicator (TERSE_ERR_ABORTED)
 * or a failed one (TERSE_ERR_INVALID, quoting the first failure). */
terse_status terse__comm_begin(terse_comm *c, const char *what);

/* TERSE_ERR_ABORTED if terse_comm_abort was called: for long codec work
 * between waits (`where` says what was interrupted). */
terse_status terse__comm_poll_abort(terse_comm *c, const char *where);

/* Record the first failure (status s, sentence terse_last_error()): the
 * communicator can only be freed from now on. c->lock held; a later
 * failure keeps the first one's sentence. */
void terse__comm_fail_locked(terse_comm *c, terse_status s);
/* Refuse every later start (a start failed on this rank only, so it
 * skips a collective the others run); requests already queued still run.
 * c->lock held. */
void terse__comm_refuse_locked(terse_comm *c);
/* TERSE_ERR_ABORTED with the sentence every call after an abort gives. */
terse_status terse__comm_aborted_error(const terse_comm *c, const char *what);

/* Poll the store for loss notices (rate-limited to once a millisecond);
 * a notice older than its grace fails with TERSE_ERR_PEER_LOST. */
terse_status terse__comm_check_alive(terse_comm *c);

/* Finish a collective with status s: on success count the op; on any
 * error except a consistent TERSE_ERR_DST_TOO_SMALL (keep_usable) remember
 * the sentence and mark the communicator failed. Returns s. */
terse_status terse__comm_end(terse_comm *c, terse_status s, int keep_usable);

/* Start a new phase: a fresh sequence number for its tags. Every rank runs
 * the same phases in the same order, so the numbers agree. */
void terse__comm_next_phase(terse_comm *c);

/* The tag of message `msg` in the current phase. */
uint64_t terse__comm_tag(const terse_comm *c, uint64_t msg);

/* Post a send / receive through the transport, counting its bytes. */
terse_status terse__comm_isend(terse_comm *c, int peer, uint64_t tag, const void *buf,
                               size_t len, terse__bytes_kind kind, terse__fabric_req *req);
terse_status terse__comm_irecv(terse_comm *c, int peer, uint64_t tag, void *buf, size_t len,
                               terse__bytes_kind kind, terse__fabric_req *req);

/* Wait for reqs[0..n), checking the store for lost ranks and the abort
 * flag; fails with TERSE_ERR_TIMEOUT after timeout_ms with no completion
 * (an inactivity timeout). The time spent counts as network time. */
terse_status terse__comm_wait(terse_comm *c, terse__fabric_req *reqs, size_t n);

/* One progress round without waiting (the transport moves what it can;
 * for work between waits, e.g. a codec's next piece), with the same
 * liveness, abort and failure handling as terse__comm_wait. */
terse_status terse__comm_progress(terse_comm *c);
/* The next lost rank the store announced back (a replacement joined as
 * it): its new address and keys are installed in the fabric and *rank is
 * set; -1 if none is waiting. Call on the thread that drives the fabric,
 * after terse__store_poll_lost took the notices in. */
terse_status terse__comm_take_back(terse_comm *c, int *rank);

/* Scratch buffer `slot` of at least `bytes` (64-byte aligned), or NULL
 * after recording TERSE_ERR_NOMEM. Contents are not preserved across
 * growth. */
void *terse__comm_scratch(terse_comm *c, int slot, size_t bytes);

/* terse_last_error() without its leading status name, for quoting one
 * sentence inside another. */
const char *terse__comm_last_sentence(void);

/* Add the time since t0_ns to codec_seconds. */
void terse__comm_codec_time(terse_comm *c, uint64_t t0_ns);

/* Exchange the parameters through the store; a difference fails on every
 * rank with a sentence naming the variable and both values. */
terse_status terse__params_agree(terse_comm *c, int timeout_ms);

/* ---- engine (engine.c) ---- */

/* Start the progress thread (unless TERSE_PROGRESS=caller) and the locks. */
terse_status terse__engine_init(terse_comm *c);
/* Abort what is in flight, stop the thread, complete every request still
 * queued with TERSE_ERR_ABORTED. */
void terse__engine_shutdown(terse_comm *c);

/* Start an EXT request (tmpl->kind TERSE__OP_EXT): refused on an aborted,
 * failed or forked communicator, but a refusal does not refuse later
 * starts (EXT operations are not collectives). *out NULL on failure. */
terse_status terse__engine_start_ext(terse_comm *c, const terse_request *tmpl,
                                     terse_request **out);
/* An EXT request as a blocking call. */
terse_status terse__engine_run_ext(terse_comm *c, terse_request *r);
/* A request template for c. */
terse_request terse__engine_make(terse_comm *c, terse__op_kind kind);

/* Argument checks done at start, on the caller's thread. */
terse_status terse__allreduce_check(terse_comm *c, float *buf, size_t n, terse_codec *codec,
                                    terse_op op);
terse_status terse__broadcast_check(terse_comm *c, void *buf, size_t bytes, int root);
terse_status terse__allgather_check(terse_comm *c, const void *send, size_t send_bytes,
                                    void *recv, size_t recv_cap);

/* The collectives themselves, run by the executor between
 * terse__comm_begin and terse__comm_end. */
terse_status terse__allreduce_run(terse_comm *c, float *buf, size_t n, terse_codec *codec,
                                  terse_op op);
terse_status terse__broadcast_run(terse_comm *c, void *buf, size_t bytes, int root);
terse_status terse__allgather_run(terse_comm *c, const void *send, size_t send_bytes, void *recv,
                                  size_t recv_cap, size_t *counts, int *keep_usable);
terse_status terse__barrier_run(terse_comm *c);

/* ---- algorithms (one file each) ---- */

/* Dense fp32 sum in place (any n, including 0). Chooses recursive doubling
 * for small buffers and the pipelined ring for large ones. If divide is
 * nonzero the result is divided by nranks (op average). */
terse_status terse__allreduce_dense(terse_comm *c, float *buf, size_t n, int divide);
terse_status terse__allreduce_ring(terse_comm *c, float *buf, size_t n, int divide);
terse_status terse__allreduce_rd(terse_comm *c, float *buf, size_t n, int divide);

/* Buffers at most this many bytes take recursive doubling (TERSE_RD_MAX_BYTES). */
static inline size_t terse__rd_max_bytes(const terse_comm *c) { return c->params.rd_max_bytes; }

/* Compressed paths, chosen by terse_allreduce from the codec's table
 * (compress/aggregate.h). */
terse_status terse__allreduce_gather(terse_comm *c, float *buf, size_t n, terse_codec *codec,
                                     terse_op op);
terse_status terse__allreduce_rs(terse_comm *c, float *buf, size_t n, terse_codec *codec,
                                 terse_op op);
/* The pipelined all-gather (pipe_allreduce.c): p is the codec's cut into
 * pieces, or NULL for one whole message. terse__pipe_fits says whether N
 * ranks' requests fit the communicator for such a codec. */
int terse__pipe_fits(int N, int fixed);
struct terse__pieces;
terse_status terse__allreduce_pipe(terse_comm *c, float *buf, size_t n, terse_codec *codec,
                                   terse_op op, const struct terse__pieces *p);
terse_status terse__allreduce_summable(terse_comm *c, float *buf, size_t n, terse_codec *codec,
                                       terse_op op);
terse_status terse__allreduce_rounds(terse_comm *c, float *buf, size_t n, terse_codec *codec,
                                     terse_op op);

/* Exchange `bytes` per rank (framing): all + r * bytes = rank r's `mine`. */
terse_status terse__allgather_fixed(terse_comm *c, const void *mine, size_t bytes, void *all);

/* Exchange one 8-byte value per rank (framing): all[r] = rank r's value. */
terse_status terse__allgather_u64(terse_comm *c, uint64_t mine, uint64_t *all);

/* Ring all-gather of variable blocks already sized: block r lives at
 * buf + off[r] and is len[r] bytes; this rank's block is already in place.
 * Counts as payload. */
terse_status terse__allgatherv_ring(terse_comm *c, uint8_t *buf, const size_t *off,
                                    const size_t *len);

#endif
