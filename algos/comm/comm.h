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
#define TERSE__COMM_SCRATCH 7
#define TERSE__SCRATCH_GROUP 4 /* a group's fused dense buffers (engine.c) */
#define TERSE__SCRATCH_STATE 5 /* a codec's state before the call (allreduce.c) */
#define TERSE__SCRATCH_PLAN 6  /* the hierarchical all-gather's host plan (allgather.c) */

/* Tags: the low 48 bits belong to us (the transport owns the high 16).
 * seq (20 bits, the collective's sequence number on this communicator)
 * keeps consecutive collectives from ever matching each other's messages;
 * the message index (28 bits) keeps the messages of one collective apart.
 * Both wrap harmlessly: two messages with the same tag would have to be
 * 2^20 collectives or 2^28 messages apart and in flight together. */
#define TERSE__TAG_SEQ_BITS 20
#define TERSE__TAG_MSG_BITS 28

/* How bytes count in terse_comm_stats: the collective's data, terse's own
 * framing around it (size exchanges), or control (call descriptors). */
typedef enum {
    TERSE__BYTES_PAYLOAD = 0,
    TERSE__BYTES_FRAMING = 1,
    TERSE__BYTES_CONTROL = 2
} terse__bytes_kind;

/* A call descriptor's size (comm_desc.c). */
#define TERSE__COMM_DESC_BYTES 64

/* What a request runs (algos/engine/engine.c). */
typedef enum {
    TERSE__OP_ALLREDUCE,
    TERSE__OP_BROADCAST,
    TERSE__OP_ALLGATHER,
    TERSE__OP_BARRIER,
    TERSE__OP_GROUP, /* internal: the members of one terse_group_end */
    TERSE__OP_EXT    /* a parameter-server operation (algos/ps/ps_*.c) */
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
                 uint64_t clock; float weight; const char *name; int prio; } ext;
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
    size_t wire;             /* TERSE_WIRE: 0 auto, 1 none, 2 mac, 3 seal (agreed) */
    size_t compressed_algo;  /* TERSE_COMPRESSED_ALGO: 0 auto, 1 gather, 2 rs (agreed) */
    size_t pipeline_bytes;   /* TERSE_PIPELINE_BYTES: fp32 bytes a piece of the pipelined
                                all-gather holds (0: never cut), default 256 KiB (agreed) */
    size_t topology;         /* TERSE_TOPOLOGY: 0 auto, 1 flat, 2 hier (agreed) */
    size_t check_calls_off;  /* TERSE_CHECK_CALLS=off: no call descriptors (agreed) */
    size_t shm_segment;      /* TERSE_SHM_SEGMENT: 0 auto, 1 off (agreed) */
    size_t segment_step_bytes; /* TERSE_SEGMENT_STEP_BYTES: what one step of the shared
                                  segment's all-reduce moves; 0 (unset): the default,
                                  terse__comm_seg_step_bytes (agreed) */
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

    /* Hosts (comm_hosts.c): this rank's host (numbered by lowest rank),
     * its rank among its host's ranks (in rank order), how many ranks its
     * host has, how many hosts the job spans, and every rank's host
     * (NULL for a single rank: host 0). */
    int host_index, local_rank, local_size, nhosts;
    int uniform_hosts; /* every host holds local_size ranks */
    int local_min, local_max; /* the fewest and the most ranks a host holds */
    int one_net; /* every rank in this rank's network namespace (loopback reaches all) */
    int *host_of;
    /* The rings' order (ring.c): ring_at[p] is the rank at position p and
     * ring_pos this rank's position; hosts in index order, each host's
     * ranks ascending, so a ring crosses between hosts once per host
     * wherever the launcher put the ranks. NULL (rank order) when that is
     * the rank order, with one host, or under TERSE_TOPOLOGY=flat. */
    int *ring_at;
    int ring_pos;

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

    /* The call descriptor (comm_desc.c): ours, sent to the next rank, and
     * the previous rank's; the executor's only. */
    int desc_on, desc_checked, desc_failed, desc_kind;
    int desc_block; /* shm: the data waits for the previous rank's descriptor */
    int desc_unblocked; /* this call sends nothing through shm: it need not
                           (set by the engine before each call's start) */
    uint8_t desc_mine[TERSE__COMM_DESC_BYTES], desc_theirs[TERSE__COMM_DESC_BYTES];
    terse__fabric_req desc_req[2];
    /* With the host's segment (seg below) the descriptors go through it
     * instead (comm_desc.c): desc_calls numbers this rank's calls. */
    uint64_t desc_calls;
    int same_host;       /* every rank on this host (join's step 3) */
    /* The host's shared segment (transport/segment.h; comm_segment.c): set
     * when every rank is on this host and the ranks agreed to use it; the
     * dense all-reduce then runs over it (seg_allreduce.c). seg_step: the
     * steps run over it so far, the same on every rank. */
    struct terse__seg *seg;
    uint64_t seg_step, seg_bar; /* steps and barriers run over it */
    /* In a job over several hosts: this host's segment (members: its local
     * ranks, this rank member local_rank; NULL on a host of one rank) and
     * lseg_on, the same on every rank: every host that has several ranks
     * made and attached one, and the hierarchical dense all-reduce runs
     * its intra-host phases over them (seg_allreduce.c). lseg_step: its
     * steps so far, the same on every rank of the host. */
    struct terse__seg *lseg;
    int lseg_on;
    uint64_t lseg_step, lseg_bar; /* its steps and barriers so far */
    /* A colocated parameter server's communicators (engine_twin.c): they
     * share parent's store (not owned) and number their ranks virtually,
     * [0, vreal) the ranks' server endpoints, [vreal, 2 vreal) their worker
     * endpoints: rank r's are r and vreal + r. vmap: the store's lost or
     * gone map in virtual ranks (2 vreal), then the store's (vreal). */
    terse_comm *parent;
    int vreal;
    uint8_t *vmap;
    uint32_t vgen; /* which of the parent's colocated pairs (1, 2, ...; every
                      rank makes them in the same order): the generation a
                      worker's WGONE names (terse__store_tell_worker_gone) */
    uint32_t colo_gen; /* the parent's side: colocated pairs made so far */
    /* the parent's side: its colocated communicators, whose bytes and
     * seconds its terse_comm_get_stats adds in (under stats_lock) */
    terse_comm *twin[2];

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

/* A request kind's name for sentences ("terse_allreduce", ...). */
const char *terse__comm_kind_name(int kind);

/* The store's word on a failure s (the first cause: a rank lost, or one
 * that told why it failed), waited for up to grace_ns: that cause, with s's
 * sentence as how it surfaced here; else s, its sentence unchanged.
 * told_only: only a told failure, never a loss. */
terse_status terse__comm_explain(terse_comm *c, terse_status s, uint64_t grace_ns,
                                 int told_only);

/* The call descriptor (comm_desc.c). start: a fresh phase, then post this
 * call's descriptor to the next rank and the receive of the previous
 * rank's (kind: a terse__op_kind; count: elements or bytes, 0 where sizes
 * may differ; arg: the op or the root; codec: its spec or NULL). check:
 * once the previous rank's has arrived, compare it (called between polls
 * by every wait); a mismatch fails with its sentence. end: with the call's
 * status s: on success wait for both and compare; on a failure prefer a
 * mismatch as the cause; a mismatch this rank found is told to the other
 * ranks through the store. Returns the call's status. */
terse_status terse__comm_desc_start(terse_comm *c, int kind, uint64_t count, uint32_t arg,
                                    const char *codec);
terse_status terse__comm_desc_check(terse_comm *c);
terse_status terse__comm_desc_end(terse_comm *c, terse_status s);

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

/* The store's lost map (rank -> 1 once lost) in this communicator's
 * ranks (a colocated one's are virtual), after polling it; *map NULL
 * without a store. Call on the executor's thread. */
terse_status terse__comm_poll_lost(terse_comm *c, const uint8_t **map);
/* The same for the gone map (lost, or left with a goodbye). */
terse_status terse__comm_poll_gone(terse_comm *c, const uint8_t **map);

/* ---- hosts (comm_hosts.c) ---- */

/* Learn every rank's host through the store (TERSE_HOST, else the host
 * identity), group them and check the launcher's local-rank variables
 * against the grouping; a contradiction fails with TERSE_ERR_INVALID and
 * the same sentence on every rank. */
terse_status terse__comm_hosts(terse_comm *c, int timeout_ms);
/* A single rank: host 0 of 1, local rank 0 of 1. */
void terse__comm_hosts_single(terse_comm *c);

/* Whether the hierarchical dense all-reduce can run (hier_allreduce.c),
 * from the job's host table and agreed parameters only, so every rank
 * answers alike; and whether it can run over each host's segment
 * (seg_allreduce.c: two steps' rail requests in reqs). comm_segment.c makes
 * the hosts' segments only where it can. */
static inline int terse__comm_hier_dense_fits(const terse_comm *c) {
    if (c->params.topology == 1 || c->nhosts < 2 || c->local_max < 2 || !c->host_of) return 0;
    /* a leader per host (S = 1) takes in and gives out local_max - 1 whole
     * copies over shm: measured to pay at 2 + 1 ranks, not for large hosts
     * (a ring in host order there) */
    if (c->local_min == 1 && c->local_max > 4) return 0;
    /* the requests of one round (three phases) must fit the communicator's */
    return 4 * (c->local_max - 1) + 2 * (c->nhosts - 1) <= TERSE__COMM_MAX_REQS;
}
static inline int terse__comm_hier_seg_fits(const terse_comm *c) {
    return terse__comm_hier_dense_fits(c) && 4 * (c->nhosts - 1) <= TERSE__COMM_MAX_REQS &&
           c->nhosts <= 64;
}

/* ---- the host's shared segment (comm_segment.c) ---- */

/* What one step over a segment moves: TERSE_SEGMENT_STEP_BYTES, else 256 KiB
 * with every rank on one host (where 64 KiB and 1 MiB measured slower) and
 * 1 MiB in a job over several hosts (a step's shard is also one message of
 * the rail between hosts: at 256 KiB a 2 x 4 job on 1 Gbit/s links ran
 * 6% slower; docs/collectives.md). The same on every rank. */
static inline size_t terse__comm_seg_step_bytes(const terse_comm *c) {
    if (c->params.segment_step_bytes) return c->params.segment_step_bytes;
    return c->nhosts > 1 ? (size_t)1 << 20 : (size_t)256 << 10;
}

/* At init, after the wire is set up (two store all-gathers on every rank
 * of a job of several, a replacement's included): when every rank is on
 * this host, TERSE_SHM_SEGMENT is not off, the wire is not authenticated
 * (TERSE_WIRE auto or none on shm) and this is not a replacement, the
 * ranks make and attach the segment; if any rank cannot, none uses it (the
 * rank that could not says why on stderr). In a job over several hosts
 * with several ranks on some (the routed pair shm+net, not
 * TERSE_TOPOLOGY=flat), each such host's ranks make one of their own
 * (lseg), under the same conditions on the shm side (TERSE_WIRE auto or
 * none: the network side's MAC stays), all or none. Fails only if the
 * store does. */
terse_status terse__comm_segment_setup(terse_comm *c, int rejoin, int timeout_ms);
/* Unmap it (terse_comm_free; not while an executor may be inside it). */
void terse__comm_segment_close(terse_comm *c);

/* ---- joining and leaving (comm_join.c) ---- */

/* Everything of terse_comm_init but the engine: resolve the launch, open
 * the store and the endpoint, exchange names and wire keys. On failure the
 * half-built communicator is already freed (*out NULL). */
terse_status terse__comm_join(const terse_comm_config *config, terse_comm **out);
/* Everything of terse_comm_free after the engine is shut down: flush and
 * close the endpoint, leave the store (with a goodbye after a clean run),
 * free. */
void terse__comm_leave(terse_comm *c);

#endif
