/* The libfabric transport's private state, shared by fabric.c (open, close,
 * addresses), fabric_info.c (provider selection), fabric_msg.c (posting,
 * chunking, completion progress), fabric_sweep.c (rxm's strangers),
 * fabric_wait.c (waiting, cancelling, quiesce, flush), fabric_mac.c and
 * fabric_shm.c. Nothing outside transport/fabric*.c includes this. */
#ifndef TERSE_TRANSPORT_FABRIC_IMPL_H
#define TERSE_TRANSPORT_FABRIC_IMPL_H

#include <sys/types.h>

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_tagged.h>

#include "transport/fabric.h"

/* The libfabric API version we are written against (the oldest with every
 * call and flag used here); the headers may be newer. */
#define TERSE__FI_VERSION FI_VERSION(1, 17)

/* Callers own the low 48 tag bits; chunk indices live in the high 16.
 * Chunk index 0xffff is never used: the sweep's markers carry it
 * (fabric_sweep.c, "Strangers"). */
#define TERSE__TAG_BITS 48
#define TERSE__MAX_CHUNKS (((size_t)1 << (64 - TERSE__TAG_BITS)) - 1)
#define TERSE__MARKER_CHUNK ((uint64_t)0xffff << TERSE__TAG_BITS)

/* Chunks of one request in flight at once. Eight 1 MiB chunks keep a
 * pipeline deep enough to hide per-chunk latency on shm and tcp while
 * bounding queue use per request (measured: see fabric_msg.c). */
#define TERSE__FABRIC_WINDOW 8

/* Completions read per fi_cq_read call (fabric_msg.c's progress rounds,
 * fabric_wait.c's quiesce). */
#define TERSE__CQ_BATCH 16

/* The name blob terse__fabric_name hands out: fixed size, so every rank's
 * blob has the same length whatever the provider's address length (shm's
 * addresses are strings whose length depends on the pid). Little endian:
 *   [0,4) magic "TFAB"   [4,8) addrlen   [8,16) chunk bytes
 *   [16,48) provider name, NUL padded    [48,256) address, zero padded
 * Carrying the chunk size and provider lets set_peers refuse ranks that
 * would split or route messages differently, which would otherwise surface
 * as truncation or silent hangs. */
#define TERSE__FABRIC_NAME_BYTES 256
#define TERSE__NAME_PROV_OFF 16
#define TERSE__NAME_PROV_LEN 32
#define TERSE__NAME_ADDR_OFF 48
#define TERSE__NAME_ADDR_MAX (TERSE__FABRIC_NAME_BYTES - TERSE__NAME_ADDR_OFF)

/* Memory-registration modes we can honour. LOCAL: we register each
 * request's buffer and pass its descriptor. ENDPOINT: we bind that
 * registration to the endpoint. HMEM: only device memory must be
 * registered and we only move host memory. VIRT_ADDR, ALLOCATED, PROV_KEY
 * and RAW govern remote keys, which we never hand out (no RMA). We cannot
 * honour MMU_NOTIFY, RMA_EVENT or COLLECTIVE. */
#define TERSE__MR_SUPPORTED                                                              \
    (FI_MR_LOCAL | FI_MR_ENDPOINT | FI_MR_HMEM | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | \
     FI_MR_PROV_KEY | FI_MR_RAW)

typedef struct terse__fabric_op terse__fabric_op;

/* A shm rank's region: its file under /dev/shm and its owner's pid. */
typedef struct terse__fabric_shm_peer {
    char file[TERSE__NAME_ADDR_MAX];
    pid_t pid;
} terse__fabric_shm_peer;
#define TERSE__SHM_GONE_MAX 16

/* fabric_shm.c: remember rank r's region (its address from the name
 * blob), at set_peers and at a replacement. */
void terse__fabric_shm_note_peer(terse__fabric *f, int r, const uint8_t *addr, size_t alen);

/* One posted chunk: the libfabric operation context. ctx comes first so
 * the pointer libfabric hands back in a completion is the slot itself, and
 * is a fi_context2 so providers asking for FI_CONTEXT or FI_CONTEXT2 may
 * use it as scratch while the operation is posted. */
typedef struct terse__fabric_slot {
    struct fi_context2 ctx;
    terse__fabric_op *op;
    size_t chunk;
    struct terse__fabric_slot *next_free;
    uint8_t mac[TERSE__WIRE_MAC]; /* the chunk's tag, sent or received as a 2nd iov */
    uint8_t *stage;               /* encrypt: the ciphertext of a send being posted */
    size_t local_got;             /* filled from the early store: the bytes it had */
    struct terse__fabric_slot *local_next; /* ... and the next such slot to complete */
} terse__fabric_slot;

/* A rank's message that a drain moved out of the provider's unexpected
 * queue into terse's memory (fabric_sweep.c, "Strangers"), kept until the
 * receive it belongs to is posted. ctx first: the provider hands it back
 * in the claim's completions. */
typedef struct terse__fabric_early {
    struct fi_context2 ctx;
    struct terse__fabric_early *next;
    int peer;
    int state; /* TERSE__EARLY_* */
    uint64_t tag;
    size_t len, got;
    uint8_t data[];
} terse__fabric_early;

/* Claims whose bytes are still on the way, at most (each may produce a
 * completion the CQ must have room for). */
#define TERSE__EARLY_RECEIVING_MAX 32

enum { TERSE__EARLY_CLAIMING, TERSE__EARLY_RECEIVING, TERSE__EARLY_READY, TERSE__EARLY_DISCARDING };

typedef struct evp_cipher_ctx_st EVP_CIPHER_CTX;

/* The transport's side of a request, alive from isend/irecv until the
 * last chunk completes. It is owned by the fabric (not the caller's req)
 * so close can release registrations even after the caller has dropped
 * its requests following an error. */
struct terse__fabric_op {
    terse__fabric_req *req;
    terse__fabric_op *prev, *next; /* the fabric's active list */
    struct fid_mr *mr;             /* when the provider demands registration */
    void *desc;
    size_t chunk_bytes;
    size_t inflight;
    size_t bytes_done;
};

struct terse__fabric {
    int rank, nranks;
    char provider[TERSE__NAME_PROV_LEN]; /* "net", "tcp;ofi_rxm", "shm", ... */
    char domain_name[64];                /* interface or device, for messages */

    struct fi_info *info;
    struct fid_fabric *fabric;
    struct fid_domain *domain;
    struct fid_av *av;
    struct fid_cq *cq;
    struct fid_ep *ep;
    fi_addr_t *addrs; /* rank -> AV address, once set_peers ran */

    size_t chunk_bytes; /* min(TERSE_CHUNK_BYTES, max_msg_size) */
    size_t open_chunk_bytes; /* the same at open (small_chunks_on_shm may lower chunk_bytes) */
    size_t max_msg;
    size_t inject_bytes; /* 0: never inject */
    int register_mr;     /* FI_MR_LOCAL (or TERSE_FABRIC_REGISTER=1) */
    int mr_endpoint;     /* FI_MR_ENDPOINT: bind registrations to the ep */
    int mr_prov_key;
    uint64_t next_mr_key;

    /* Posted-chunk contexts, one pool per direction so queued sends can
     * never starve receives of slots (and vice versa); their sizes are the
     * provider's tx/rx queue depths, which therefore bound what we post. */
    terse__fabric_slot *slots;
    terse__fabric_slot *tx_free, *rx_free;
    size_t tx_slots, rx_slots;

    terse__fabric_op *active_head, *active_tail; /* oldest first */
    terse__fabric_op *op_free;

    uint64_t bytes_sent, bytes_recv;
    terse_status failed; /* sticky: after an error only close is allowed */
    int tolerant;        /* a request's error fails only that request (ps server) */
    /* requests given up on (terse__fabric_give_up): heap copies their ops
     * now point at, freed at close */
    struct terse__fabric_orphan *orphans;

    /* TERSE_WIRE=mac (fabric_mac.c): per-peer AES-256-GCM contexts keyed
     * for each direction, dropped chunks per peer, the epoch, the slot
     * array's registration (the MACs live there), receives to post again
     * after a forged chunk consumed them, and the tests' tamper hook. */
    int mac, encrypt;
    EVP_CIPHER_CTX **tx_ctx, **rx_ctx;
    uint8_t wire_t[32];                   /* T: the token's extract (fabric_mac.c) */
    uint8_t wire_nonce[TERSE__WIRE_NONCE]; /* this rank's */
    uint8_t **stage_free; /* encrypt: free staging buffers (a stack) */
    size_t nstage_free, nstage;
    void *stage_mem;
    uint64_t *auth_fail;
    /* The last dropped chunk whose length was not the expected one (its
     * payload bytes, and the expected), and from which peer (-1: none):
     * honest ranks that disagree on a size look like this too. */
    int forged_len_peer;
    size_t forged_len_got, forged_len_want;
    uint32_t epoch;
    struct fid_mr *slots_mr;
    void *slots_desc;
    terse__fabric_slot *repost;
    unsigned tamper_every, tamper_count;

    /* Strangers (fabric_sweep.c): tcp;ofi_rxm queues a message from an
     * address that is no rank forever, so a sweep (TERSE_SWEEP=1) drops them. The peek in
     * flight (its answer: found, tag, length); the early store (oldest
     * first) and its bytes; receives filled from it, to complete; counts. */
    int sweep, sweeping;
    size_t rxm_eager; /* rxm's eager limit: larger messages are read from their sender */
    uint64_t sweep_last_ns;
    struct fi_context2 peek_ctx;
    void *peek_wait;
    int peek_state; /* 0 waiting, 1 found, 2 none */
    uint64_t peek_tag;
    size_t peek_len;
    terse__fabric_early *early_head, *early_tail;
    size_t early_bytes, early_receiving;
    terse__fabric_slot *local_done;
    uint64_t stranger_drops, early_evicted;
    /* The drain: its marker (tag; pending: sent, not yet dropped) and
     * until when strangers count as present. */
    uint64_t marker_rng, marker_tag, marker_sent_ns;
    int marker_pending;
    uint64_t attack_until_ns;

    /* The provider call in progress (a watchdog reads these from another
     * thread): when it started (0: none), which peer it concerns (-1: the
     * CQ), and what it is. abandoned: a watchdog gave up on this fabric;
     * whatever returns from the provider afterwards fails at once. */
    _Atomic uint64_t call_since;
    _Atomic int call_peer;
    const char *_Atomic call_what;
    _Atomic int abandoned;

    /* shm (fabric_shm.c): every rank's region file and pid, the pids
     * replacements took over from, and the stuck call last tried (its
     * call_since). */
    int shm_rescue; /* TERSE_SHM_RESCUE=1 */
    int keep_open;  /* quiesce leaves the endpoint open (terse__fabric_keep_open) */
    int trace_tags; /* TERSE_TRACE_TAGS=1 */
    /* net's flush at close (terse__fabric_flush): per peer, anything sent
     * to it; the flush's sends and their state (1 posted, 2 acknowledged
     * or failed) */
    uint8_t *sent_to;
    struct fi_context2 *flush_ctx;
    uint8_t *flush_state;
    terse__fabric_shm_peer *shm;
    pid_t shm_gone[TERSE__SHM_GONE_MAX];
    int shm_ngone;
    uint64_t shm_tried;
    /* net: the connections it accepted and let go of (fabric_reap.c) */
    struct terse__fabric_reap *reap;

    /* Per-peer routing (issue 28): a second endpoint (shm) for the peers
     * with via_side[peer] set, owned by this one and progressed by its
     * waits (terse__fabric_attach_side). NULL: every peer is ours. */
    terse__fabric *side;
    uint8_t *via_side;
};

/* The fabric that carries messages to and from peer. */
static inline terse__fabric *terse__fabric_route(terse__fabric *f, int peer) {
    return f && f->side && peer >= 0 && peer < f->nranks && f->via_side[peer] ? f->side : f;
}

/* fabric_info.c: resolve a user provider name ("shm", "tcp", ..., "auto")
 * to a chosen fi_info (a fresh copy the caller frees with fi_freeinfo).
 * Fails with TERSE_ERR_INVALID for an unknown name and TERSE_ERR_TRANSPORT,
 * naming what fi_getinfo offers, when the provider is absent or demands
 * what we cannot do. */
terse_status terse__fabric_select(const char *provider, int same_host, int rank,
                                  struct fi_info **out);

/* Bracket a provider call for the watchdog (fabric_wait.c). */
static inline void terse__fabric_enter(terse__fabric *f, int peer, const char *what) {
    atomic_store_explicit(&f->call_peer, peer, memory_order_relaxed);
    atomic_store_explicit(&f->call_what, what, memory_order_relaxed);
    atomic_store_explicit(&f->call_since, terse__now_ns(), memory_order_release);
}
static inline void terse__fabric_leave(terse__fabric *f) {
    atomic_store_explicit(&f->call_since, 0, memory_order_release);
}

/* fabric_mac.c: the chunk's GMAC into out (1 on success), and whether a
 * received one checks; release the keys. */
int terse__fabric_mac(terse__fabric *f, const terse__fabric_req *r, size_t chunk,
                      const uint8_t *p, size_t n, uint8_t out[TERSE__WIRE_MAC]);
int terse__fabric_mac_ok(terse__fabric *f, const terse__fabric_req *r, size_t chunk,
                         const uint8_t *p, size_t n, const uint8_t *got);
/* encrypt: ciphertext of p[0..n) into out and its tag; and decryption in
 * place, 1 only if the tag checks (the bytes are garbage otherwise). */
int terse__fabric_seal(terse__fabric *f, const terse__fabric_req *r, size_t chunk,
                       const uint8_t *p, size_t n, uint8_t *out, uint8_t tag[TERSE__WIRE_MAC]);
int terse__fabric_open_sealed(terse__fabric *f, const terse__fabric_req *r, size_t chunk,
                              uint8_t *p, size_t n, const uint8_t *tag);
void terse__fabric_free_keys(terse__fabric *f);

/* fabric_wait.c: drop every request's state (close calls it after the
 * endpoint is gone, so nothing can complete any more). */
void terse__fabric_release_ops(terse__fabric *f);

/* fabric_msg.c, for fabric_sweep.c and fabric_wait.c. fail: a failure
 * leaves operations posted that point at caller memory, so the fabric
 * refuses everything but close from then on (the first status sticks;
 * returns st). fail_abandoned: the failure for a watchdog having given up
 * on the fabric while we were inside the provider. */
terse_status terse__fabric_fail(terse__fabric *f, terse_status st);
terse_status terse__fabric_fail_abandoned(terse__fabric *f);
/* "sending to" or "receiving from", for messages. */
const char *terse__fabric_dir_text(const terse__fabric_req *r);
/* r's op (NULL once nothing of r is active); unlink, release and recycle
 * an op. */
terse__fabric_op *terse__fabric_op_of(const terse__fabric *f, const terse__fabric_req *r);
void terse__fabric_op_put(terse__fabric *f, terse__fabric_op *op);
/* A slot back to its direction's pool (its staging buffer too); whether a
 * completion's context is one of the slots. */
void terse__fabric_slot_put(terse__fabric *f, terse__fabric_slot *s, int is_send);
int terse__fabric_is_slot(const terse__fabric *f, const void *ctx);
/* Drain the CQ; *events counts our chunks' completions. */
terse_status terse__fabric_read_cq(terse__fabric *f, size_t *events);
/* A progress round's reading half: receives filled from the early store
 * complete, then (rxm) the sweep, then the CQ is drained. */
terse_status terse__fabric_poll(terse__fabric *f, size_t *events);
/* Give every active request its chance to post, oldest first. */
terse_status terse__fabric_post_pending(terse__fabric *f);

/* fabric_sweep.c, for fabric_msg.c. early_take: the chunk (peer, tag)
 * from the early store into p (n bytes) and mac: 1 and its length in
 * *got, 0 while its bytes are still coming, -1 when the store has none.
 * early_done: a claim's bytes arrived (or failed: the entry goes).
 * sweep: a progress round's look at rxm's unexpected queue ("Strangers"
 * there), draining it when a stranger's message heads it. */
int terse__fabric_early_take(terse__fabric *f, int peer, uint64_t tag, uint8_t *p, size_t n,
                             uint8_t *mac, size_t *got);
void terse__fabric_early_done(terse__fabric *f, void *ctx, size_t len, int failed);
terse_status terse__fabric_sweep(terse__fabric *f);

/* fabric_reap.c (net only; nothing on other providers): init after the
 * endpoint is enabled, free at close; reap after a progress round closes
 * the accepted connections net let go of and shuts down silent ones past
 * their time ("Strangers' connections" there). */
void terse__fabric_reap_init(terse__fabric *f);
void terse__fabric_reap_free(terse__fabric *f);
void terse__fabric_reap(terse__fabric *f);

#endif
