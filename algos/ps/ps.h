/* The parameter server's internals, shared by its files (DESIGN.md,
 * "Parameter server"):
 *   ps.c            create, declare, config, stats, free
 *   ps_placement.c  chunks on servers: consistent hashing, bounded loads
 *   ps_rules.c      the aggregator and update-rule tables
 *   ps_proto.c      the message headers both sides read and write
 *   ps_worker.c     push, pull, pushpull, finish as engine requests
 *   ps_pipe.c       replicas 1: a request's partitions pipelined over lanes
 *   ps_failover.c   the worker's side of replicas 2: waits, slots that move
 *   ps_server.c     the server's side of a request, header to reply
 *   ps_step.c       shards; closing a sync step
 *   ps_loop.c       the server loop: losses, failovers, timeouts
 *                   (ps_server.h: what the server's three files share)
 *
 * Protocol. A declared key is one or more partitions, each an internal
 * key (ps->keys; ps->ukeys maps the declared ones). Between each worker w
 * and server s there are `lanes` conversations (1 with replicas 2), each
 * one message at a time: message k of a lane uses sequence number k in its
 * tags (and the lane), so nothing can match out of turn. With replicas 1
 * lanes [0, push_lanes) carry pushes, the others pulls (ps_pipe.c).
 *   worker -> server  HDR(k)   a 64-byte request header
 *                     DATA(k)  its payload (push: the key's chunks on s,
 *                              each one encoded message, in chunk order)
 *   server -> worker  REP(k)   a 256-byte reply header (status, version,
 *                              payload length, the server's sentence)
 *                     RDATA(k) the reply payload (pull: encoded chunks)
 * Every length is known to the receiver before it posts (the header says
 * it, and the receiver checks it against its own bound first). */
#ifndef TERSE_ALGOS_PS_H
#define TERSE_ALGOS_PS_H

#include <stddef.h>
#include <stdint.h>

#include "algos/comm/comm.h"
#include "terse.h"

#define TERSE__PS_HDR_BYTES 64
/* A worker's request waits on three transfers per server at once. */
#define TERSE__PS_MAX_SERVERS (TERSE__COMM_MAX_REQS / 3)
#define TERSE__PS_REP_BYTES 256
#define TERSE__PS_REP_TEXT (TERSE__PS_REP_BYTES - 40)

/* PULL_AFTER: a pull sent on its own lane right behind the worker's push
 * of the same key and clock (ps_pipe.c): the server answers it once that
 * push is in its step's result (sync: the step closed; async, ssp: the push
 * applied), or refuses it if the push was refused. */
enum {
    TERSE__PS_PUSH = 1, TERSE__PS_PULL = 2, TERSE__PS_PUSHPULL = 3, TERSE__PS_FINISH = 4,
    TERSE__PS_PULL_AFTER = 5
};
enum {
    TERSE__PS_TAG_HDR = 0, TERSE__PS_TAG_DATA = 1, TERSE__PS_TAG_REP = 2, TERSE__PS_TAG_RDATA = 3,
    TERSE__PS_TAG_REPL = 4, TERSE__PS_TAG_REPLDATA = 5, TERSE__PS_TAG_ACK = 6
};

/* [47] 1  [44,47) kind  [39,44) slot: the server index whose chunks the
 * conversation is about (its replica serves them after it died)
 * [33,39) lane: which of the pair's conversations (the credit window)
 * [0,33) sequence number (the header carries all 64 bits) */
#define TERSE__PS_MAX_LANES 64
static inline uint64_t terse__ps_tag_lane(int slot, int lane, int kind, uint64_t seq) {
    return (1ull << 47) | ((uint64_t)kind << 44) | ((uint64_t)slot << 39) |
           ((uint64_t)lane << 33) | (seq & ((1ull << 33) - 1));
}
static inline uint64_t terse__ps_tag(int slot, int kind, uint64_t seq) {
    return terse__ps_tag_lane(slot, 0, kind, seq);
}

/* A request header, decoded. */
typedef struct terse__ps_hdr {
    int op;
    uint64_t key;
    uint64_t clock;
    uint64_t payload_len;
    uint64_t seq;
    uint64_t nfloats;   /* floats of the key on this server */
    uint32_t decl_hash; /* the worker's declaration of the key */
    float weight;       /* push: its weight in a weighted mean (1: unweighted) */
    uint32_t epoch;     /* replicas 2: the slot's epoch (0 at its head; each move adds 1) */
    uint8_t after_lane; /* PULL_AFTER: the push it follows, its lane */
    uint16_t after_seq; /* ...and the low 16 bits of its seq */
} terse__ps_hdr;

/* A reply header, decoded. */
typedef struct terse__ps_rep {
    terse_status status;
    uint64_t version;
    uint64_t payload_len;
    uint64_t seq;
    uint64_t staleness;
    char text[TERSE__PS_REP_TEXT];
} terse__ps_rep;

void terse__ps_put_hdr(uint8_t *b, const terse__ps_hdr *h);
/* TERSE_ERR_MAGIC / TERSE_ERR_CORRUPT for a malformed header. */
terse_status terse__ps_get_hdr(const uint8_t *b, terse__ps_hdr *h);
void terse__ps_put_rep(uint8_t *b, const terse__ps_rep *r);
terse_status terse__ps_get_rep(const uint8_t *b, terse__ps_rep *r);

/* The length of the encoded message at p (its header's payload length
 * plus the header), checked against the avail bytes there. Payloads are
 * such messages back to back; terse_decode then validates each. */
terse_status terse__ps_msg_len(const uint8_t *p, size_t avail, size_t *len);

/* A pull payload shared by every worker that pulls one version. */
typedef struct terse__ps_blob {
    int refs;
    uint64_t version;
    size_t len;
    uint8_t *data;
} terse__ps_blob;

/* The part of a key one server holds (server side). */
typedef struct terse__ps_shard {
    size_t nchunks;
    size_t *chunks;     /* the key's chunk indices, ascending */
    size_t *offs;       /* each chunk's offset in value[] */
    size_t nfloats;
    float *value, *mom; /* the aggregate or the parameters; momentum */
    float *center;      /* the aggregator's (cclip: the last aggregate), or NULL */
    uint64_t version;   /* sync: steps closed; async/ssp: pushes applied */
    uint64_t opened_ns; /* sync: when the open step opened (deadline_ms) */
    terse_codec **dec;  /* per chunk: decodes pushes */
    terse_codec **enc;  /* per chunk: encodes pulls (server-side error feedback) */
    size_t push_bound, pull_bound;
    /* per rank (workers' entries used) */
    uint8_t **rx;
    size_t *rx_cap;
    float **got;        /* sync: the decoded push of the open step */
    float *wt;          /* sync: its weight (terse_ps_push_weighted; 1 otherwise) */
    uint8_t *has;
    int count;
    uint64_t *pushed;   /* ssp: pushes applied from each worker (its next clock) */
    uint64_t *pulled;   /* async: version each worker last pulled */
    float **kept;       /* update dc: per worker, the value at its last pull (NULL: none) */
    float **wmom;       /* update dana: per worker, its momentum (NULL: none yet) */
    float *vsum;        /* update dana: the sum of the workers' momenta */
    int ahead_dirty;    /* update dana: a worker's momentum left; cur is stale */
    uint64_t *prefused; /* each worker's last push refused, 1 + (lane << 16 | seq & 0xffff) */
    terse__ps_blob *cur;
    /* replicas 2 (ps_replica.c). Head: the step's state on its way to the
     * replica; pulls wait until it acknowledged (repl_pending). Replica:
     * ack is what it sent back. */
    int repl_pending;
    uint64_t repl_rseq, repl_ns; /* its message number; when it was sent */
    uint8_t repl_hdr[TERSE__PS_HDR_BYTES];
    uint8_t *repl_buf;
    size_t repl_cap;
    uint8_t ack[16];
    terse__fabric_req repl_hreq, repl_dreq, ack_req;
    uint8_t rack[16];           /* replica side: the ack it sends back */
    terse__fabric_req rack_req;
} terse__ps_shard;

typedef struct terse__ps_key {
    size_t index; /* the internal key (a partition of a declared key) */
    size_t ukey, part, off; /* the declared key, which partition, its first float */
    size_t nparts;          /* the declared key's partitions */
    size_t n, nchunks, chunk_floats;
    char push_spec[160], pull_spec[160];
    uint32_t decl_hash;
    int *server; /* per chunk */
    /* worker side */
    terse_codec **push_enc; /* per chunk */
    terse_codec **pull_dec; /* per chunk */
    size_t *srv_nchunks;    /* per server */
    size_t *srv_floats, *srv_push_bound, *srv_pull_bound;
    /* server side: what this rank holds (NULL if none) */
    terse__ps_shard *shard;
    /* worker side, replicas 2: per server slot, the last push not yet
     * covered by a pull of a later step (resent to the replica if the
     * slot's head dies) */
    struct terse__ps_unacked *unacked;
    /* worker side, pipelined requests (ps_pipe.c): per server, units of
     * this key in flight (one at a time: a key's requests keep their order) */
    uint8_t *pipe_busy;
    uint32_t *pipe_mark;
} terse__ps_key;

/* A declared key: its partitions are internal keys first .. first+nparts-1. */
typedef struct terse__ps_ukey {
    size_t first, nparts, n;
    struct terse__ps_key **parts; /* its partitions (never moves: a request keeps it) */
    int priority; /* terse_ps_set_priority; ties go to the key declared first */
} terse__ps_ukey;

typedef struct terse__ps_unacked {
    uint8_t *buf;
    size_t len, cap;
    uint64_t clock;
    float weight;
    int valid;
} terse__ps_unacked;

/* The aggregator table (ps_aggregate.c; the aggregators one family per
 * file: ps_coordwise.c, ps_krum.c, ps_cclip.c). */
#define TERSE__PS_AGG_SPEC_MAX 64
typedef struct terse_ps_aggregator_ops terse_ps_aggregator_ops;
typedef struct terse__ps_agg_params {
    const terse_ps_aggregator_ops *plugin; /* a registered aggregator's table, or NULL */
    char options[TERSE__PS_AGG_SPEC_MAX];  /* the spec after its ':' (plugins read it) */
    int b;      /* trimmed_mean: values dropped at each end (default 1) */
    int f, m;   /* krum: Byzantine workers tolerated (1), pushes averaged (1) */
    int iters;  /* cclip: clipping iterations (1) */
    double tau; /* cclip: clipping radius (10) */
} terse__ps_agg_params;

/* out[0..n) from in[0..k)[0..n), the inputs in worker-rank order, all
 * finite (the server leaves out pushes that are not). center (n floats,
 * kept per shard across steps, zero at the first) is given to aggregators
 * that declare needs_center, NULL to the rest. Fixed arithmetic order:
 * the same inputs give the same bits. */
typedef terse_status (*terse__ps_agg_fn)(const terse__ps_agg_params *p, const float *const *in,
                                         size_t k, size_t n, float *out, float *center);
typedef struct terse__ps_aggregator {
    const char *name;
    const char *options; /* the option names, for error sentences */
    terse__ps_agg_fn aggregate;
    /* Refuse a configuration that cannot hold with this many pushes a step. */
    terse_status (*check)(const terse__ps_agg_params *p, int workers);
    int needs_center;
} terse__ps_aggregator;

terse_status terse__ps_parse_aggregator(const char *spec, const terse__ps_aggregator **agg,
                                        terse__ps_agg_params *p);
const terse__ps_aggregator *terse__ps_find_aggregator_name(const char *name);
size_t terse__ps_first_nonfinite(const float *x, size_t n);
/* An integer option of a spec (ps.c): what names the spec's kind for the
 * sentence ("aggregator", "parameter-server mode"). */
terse_status terse__ps_parse_int(const char *what, const char *spec, const char *tok,
                                 const char *v, int lo, int hi, int *out);

/* Sum of wt[j] in[j] over sum of wt[j] (pushes weighted by examples,
 * terse_ps_push_weighted), in double, in input order. */
void terse__ps_agg_weighted_mean(const float *const *in, const float *wt, size_t k, size_t n,
                                 float *out);
terse_status terse__ps_agg_mean(const terse__ps_agg_params *p, const float *const *in, size_t k,
                                size_t n, float *out, float *center);
terse_status terse__ps_agg_median(const terse__ps_agg_params *p, const float *const *in, size_t k,
                                  size_t n, float *out, float *center);
terse_status terse__ps_agg_trimmed_mean(const terse__ps_agg_params *p, const float *const *in,
                                        size_t k, size_t n, float *out, float *center);
terse_status terse__ps_agg_signvote(const terse__ps_agg_params *p, const float *const *in,
                                    size_t k, size_t n, float *out, float *center);
terse_status terse__ps_agg_krum(const terse__ps_agg_params *p, const float *const *in, size_t k,
                                size_t n, float *out, float *center);
terse_status terse__ps_agg_cclip(const terse__ps_agg_params *p, const float *const *in, size_t k,
                                 size_t n, float *out, float *center);

/* The update-rule table (ps_rules.c). */
typedef struct terse__ps_update_rule {
    const char *name;
    /* Apply g (n floats) with weight w to the shard's value and momentum,
     * at rate lr and momentum mu. */
    void (*apply)(float lr, float mu, float *x, float *mom, const float *g, size_t n, float w);
} terse__ps_update_rule;

const terse__ps_update_rule *terse__ps_rule(terse_ps_update u);
/* The rate of a shard's step k under the config's schedule (terse.h,
 * Learning-rate schedule). */
float terse__ps_lr_at(const terse_ps_config *c, uint64_t k);
/* DC-ASGD: g += lambda g * g * (x - kept), elementwise. */
void terse__ps_dc_compensate(float *g, const float *x, const float *kept, size_t n, float lambda);
/* DANA: v = mu v + w g; vsum += the change; x -= lr v. */
void terse__ps_dana_apply(float lr, float mu, float *x, float *v, float *vsum, const float *g,
                          size_t n, float w);
/* update dana: worker w finished or was lost; take its momentum out of
 * every shard's look-ahead (it would never coast as the look-ahead assumes). */
void terse__ps_dana_forget(terse_ps *ps, int w);
/* DANA's pull: out = x - lr mu vsum. */
void terse__ps_dana_ahead(float *out, const float *x, const float *vsum, size_t n, float lr_mu);
/* Parse a stale-push rule ("amom+step", ...) into TERSE_PS_STALE_* flags:
 * TERSE_OK, or TERSE_ERR_INVALID naming the spec and the word. */
terse_status terse__ps_parse_stale_rule(const char *spec, const char *v, int *out);

/* Per-conversation server state (ps_server.c, ps_loop.c; its states in
 * ps_server.h): ps->peers[w * lanes + lane]. The worker's own state --
 * lost, finished, by_roster -- lives in its lane 0 (terse__ps_wk). */
typedef struct terse__ps_peer {
    int state;
    uint64_t seq;
    uint8_t hdr[TERSE__PS_HDR_BYTES];
    uint8_t rep[TERSE__PS_REP_BYTES];
    terse__fabric_req hreq, preq, rreq, rpreq;
    terse__ps_hdr h;      /* the request being served */
    terse__ps_blob *blob; /* what its reply sends */
    uint64_t parked_ns;
    uint64_t since_ns;    /* when it entered DATA, DRAIN or REPLY */
    int finished, lost;
    int by_roster;        /* finished by the word of the slot's other server: its own
                             goodbye may still come (and is answered), or never */
    int pend;             /* the kind of refusal sent once the payload is drained */
    int hdr_early;        /* the next header's receive went out with the reply */
    char pend_text[TERSE__PS_REP_TEXT];
    uint8_t *drain;       /* where a refused payload is received */
    size_t drain_cap;
} terse__ps_peer;

struct terse_ps {
    terse_comm *comm;
    terse_ps_config cfg;
    char aggregator_name[TERSE__PS_AGG_SPEC_MAX];
    const terse__ps_aggregator *agg;
    terse__ps_agg_params agg_params;
    const terse__ps_update_rule *rule;
    int stale_rule;       /* async, ssp: TERSE_PS_STALE_* flags in force (0 in sync) */
    float dc_lambda;      /* update dc: lambda in force */
    float stale_mu;       /* async, ssp: the momentum in force (amom reduces it) */
    int rank, nranks, nservers, nworkers, is_server;
    int slot;             /* server: the server index whose chunks this instance serves */
    size_t chunk_floats;

    terse__ps_key **keys; /* pointers: a request in flight keeps its key across a declare */
    size_t nkeys, keys_cap;
    terse__ps_ukey *ukeys; /* the declared keys (each one or more internal keys) */
    size_t nukeys, ukeys_cap;
    size_t part_floats;   /* a partition: whole chunks (partition_bytes rounded up) */
    int lanes;            /* conversations per worker-server pair (1 with replicas 2) */
    int push_lanes;       /* lanes [0, push_lanes) carry pushes, the rest pulls */
    uint64_t *lseq;       /* worker: per server and lane >= 1, next message number */
    uint8_t **lsbuf, **lrbuf; /* worker: per server and lane, push and pull payloads */
    size_t *lsbuf_cap, *lrbuf_cap;
    uint8_t *lhdr, *lrep; /* worker: per server and lane, headers */
    struct terse__ps_pipe *pipe; /* ps_pipe.c: the batch's units and requests */
    uint32_t pipe_pass;   /* ps_pipe.c: scheduling passes (pipe_mark's generation) */
    uint64_t pipe_order;  /* ps_pipe.c: requests taken, in order */
    uint64_t *placed; /* bytes per server */
    /* terse_ps_declare, while it places a declared key's partitions: that
     * key's chunks in all, and how many of them each server took so far
     * (NULL otherwise: terse__ps_place counts one internal key alone) */
    size_t place_chunks;
    size_t *place_mine;
    /* consistent-hash ring: nservers * vnodes points, sorted */
    uint64_t *ring_hash;
    int *ring_server;
    size_t ring_len;

    /* worker */
    uint64_t clock;             /* the caller's thread only */
    _Atomic uint64_t clock_floor; /* raised by the executor, read by terse_ps_clock */
    _Atomic int step_refused;     /* sync: a push of this step was refused (not as late) */
    uint64_t *seq;        /* per server: next message number */
    uint8_t **sbuf;       /* per server: push payload */
    size_t *sbuf_cap;
    uint8_t **rbuf;       /* per server: pull payload */
    size_t *rbuf_cap;
    uint8_t *whdr, *wrep; /* per server: headers */
    /* replicas 2: a request's transfers, four per server at most (header,
     * payload, reply header and, posted as that comes in, pull payload) */
    terse__fabric_req wq[4 * TERSE__PS_MAX_SERVERS];
    terse__ps_rep *reps;
    int finished;
    int created;          /* terse_ps_create succeeded: free may say goodbye */
    uint64_t alive_ns;

    /* server */
    terse__ps_peer *peers;
    float *scratch;
    size_t scratch_cap;
    const float **inputs;
    float *wts;           /* close_step: the inputs' weights */
    uint64_t heard_ns;    /* when a worker's request last arrived */
    int served;           /* terse_ps_serve ran: it runs once */
    char broken[400];     /* sync without a quorum after a loss */
    terse_status broken_status;
    uint64_t staleness_sum;
    uint64_t logged;      /* kinds of refusal already logged */
    void *quorum_log;     /* FILE* with TERSE_PS_QUORUM_LOG */

    terse_ps_stats stats;

    /* replicas 2 (ps_replica.c). A server runs two instances: this one for
     * its own slot (head), and `mirror` for slot (rank - 1) mod S, whose
     * replica it is; the head of slot s sends each closed step to rank
     * (s + 1) mod S. */
    terse_ps *mirror;     /* head instance: its replica instance, or NULL */
    int backup;           /* head instance: its replica's rank (-1: none or lost) */
    uint64_t rseq;        /* head: next replication message */
    int promoted;         /* replica instance: its head was lost; it serves the slot */
    int abandoned;        /* replica instance: its head stopped replicating to it */
    uint8_t abandon_hdr[TERSE__PS_HDR_BYTES]; /* head: the message that says so */
    terse__fabric_req abandon_req;
    uint64_t rseq_next;   /* replica: next replication message expected */
    int rstate;           /* replica: 0 header posted, 1 payload posted */
    size_t rkey;          /* replica: the key whose payload is posted */
    uint64_t rversion;
    uint32_t rcrc;
    uint8_t rhdr[TERSE__PS_HDR_BYTES];
    uint8_t *rbuf_state;
    size_t rstate_cap;
    terse__fabric_req rhreq, rdreq;
    int listening;        /* replica side: its first header is posted */
    /* Epochs and replacements (TERSE_REJOIN). A slot's epoch counts its
     * moves: even epochs are served by its head (rank s), odd ones by its
     * replica (rank s + 1 mod S); a failover and a hand-back each add one. */
    uint32_t epoch_cur;   /* server instance: the epoch its requests carry */
    uint32_t moved_epoch; /* mirror: the slot was handed back at this epoch
                             (0: never); older requests are told MOVED */
    uint32_t moved_inc;   /* ...to this incarnation of the slot's head */
    int handing;          /* mirror: the hand-back's acks are still due */
    int hand_failed;      /* ...and one of its transfers failed (logged once) */
    int awaiting;         /* a replacement's head: the slot's state is due */
    int catching;         /* replica side: keys not yet received take any version */
    int took_over;        /* serves a slot after its earlier server: a resend of
                             a push already applied is answered as a duplicate */
    int repl_src;         /* replica side: the rank whose replication it takes */
    uint32_t repl_epoch;  /* head side: the epoch its replication headers carry */
    int backup_fresh;     /* head: its replica is a replacement (told DONE at the end) */
    uint8_t *caught;      /* replica side, catching: per key, received */
    size_t ncaught;
    uint8_t roster_hdr[TERSE__PS_HDR_BYTES]; /* head side: the roster on its way */
    uint8_t *roster;
    terse__fabric_req roster_hreq, roster_dreq;
    /* worker, replicas 2: per slot, the rank serving it, the epoch, and the
     * next message number of the conversation with the slot's other server;
     * stale: the serving rank was replaced (its process died unnoticed) */
    int *target;
    uint32_t *epoch;
    uint64_t *mseq;
    uint8_t *stale;
    uint64_t wait_limit_ns; /* worker: wait_slots' limit without progress (0: the timeout) */
    /* colocated (ps_colocate.c): the caller's handle is the worker instance,
     * and this holds the server instance and both endpoints */
    struct terse__ps_colo *colo;
    int colo_rank; /* colocated: the caller's rank (ps->rank is virtual) */
    _Atomic int colo_worker_gone; /* server instance: its rank's worker failed unfinished */
};

/* Worker w's lane-0 record (lost, finished, by_roster); a conversation's
 * worker and lane. */
static inline terse__ps_peer *terse__ps_wk(terse_ps *ps, int w) {
    return &ps->peers[(size_t)w * (size_t)ps->lanes];
}
static inline const terse__ps_peer *terse__ps_wk_c(const terse_ps *ps, int w) {
    return &ps->peers[(size_t)w * (size_t)ps->lanes];
}
static inline int terse__ps_cv_rank(const terse_ps *ps, int cv) { return cv / ps->lanes; }
static inline int terse__ps_cv_lane(const terse_ps *ps, int cv) { return cv % ps->lanes; }

/* ps_pipe.c: a worker request of replicas 1 with its partitions pipelined
 * over the lanes, absorbing the parameter-server requests queued behind it. */
terse_status terse__ps_pipe_run(terse_ps *ps, terse_request *r, int *keep_usable);
void terse__ps_pipe_free(terse_ps *ps);

/* A reply status of the protocol's own (never a terse_status a caller
 * sees): the slot moved back to its head's replacement. The reply's
 * version is the new epoch, its staleness the head's incarnation. */
#define TERSE__PS_MOVED 63
/* A slot moves at most this often (each failover and hand-back is one). */
#define TERSE__PS_MAX_EPOCH 1024u

/* Room for one more key in ps->keys (ps.c). */
terse_status terse__ps_keys_reserve(terse_ps *ps);

/* ps_replica.c */
terse_status terse__ps_mirror_create(terse_ps *ps);
terse_status terse__ps_mirror_declare(terse_ps *ps, terse__ps_key *k, const float *init);
void terse__ps_mirror_free(terse_ps *ps);
/* Head: send key's closed step to the replica (its pulls wait for the ack). */
terse_status terse__ps_replicate(terse_ps *ps, size_t key);
/* Head: collect acks; replica: receive steps and acknowledge them. */
terse_status terse__ps_repl_progress(terse_ps *ps);
/* Head: its replica was lost; the chain is the head alone from now on. */
terse_status terse__ps_backup_lost(terse_ps *ps, const char *how, int maybe_alive);
void terse__ps_repl_cancel(terse_ps *ps);
/* Replacements. Mirror: give the slot back to its head's replacement
 * (incarnation inc): the state of every key at its last closed step goes
 * there, and older requests are told MOVED from now on. Head: its replica's
 * replacement r catches up (the roster, then every key's state). */
terse_status terse__ps_hand_back(terse_ps *m, uint32_t inc);
terse_status terse__ps_backup_add(terse_ps *ps, int r);
/* Mirror: the replacement it was handing the slot to died; let the
 * hand-back's transfers go. */
void terse__ps_stop_handing(terse_ps *m);
/* Head: tell a replacement replica that serving ended (every worker done). */
void terse__ps_tell_done(terse_ps *ps);
/* ps_loop.c, for ps_replica.c: a roster (per rank: bit 0 finished) and
 * the end of a replacement's wait for its slot. */
terse_status terse__ps_take_roster(terse_ps *ps, const uint8_t *roster);
terse_status terse__ps_caught_up(terse_ps *ps);
/* ps_step.c, for ps_replica.c */
terse_status terse__ps_wake(terse_ps *ps, size_t key);
terse_status terse__ps_maybe_close(terse_ps *ps, size_t key);
/* ps_replica.c: the bytes of a shard's replicated state */
size_t terse__ps_state_bytes(const terse_ps *ps, const terse__ps_shard *sh);

/* ps_colocate.c: colocated servers (terse_ps_config.colocate). */
typedef terse_status (*terse__ps_create_fn)(terse_comm *comm, const terse_ps_config *cfg, int inner,
                                            terse_ps **out);
/* What colocation refuses, with its sentence (before the comparison). */
terse_status terse__ps_colo_check(terse_comm *comm, const terse_ps_config *cfg);
/* Open the endpoints, create both instances (cfg: the inner config, every
 * rank a server and a worker), hand back the worker instance. */
terse_status terse__ps_colo_create(terse_comm *comm, const terse_ps_config *cfg,
                                   terse__ps_create_fn create, terse_ps **out);
terse_status terse__ps_colo_declare(terse_ps *ps, size_t key, size_t n, const char *push_spec,
                                    const char *pull_spec, const float *init);
/* Start serving (once: at the worker's first request). */
terse_status terse__ps_colo_serve(terse_ps *ps);
void terse__ps_colo_stats(const terse_ps *ps, terse_ps_stats *st);
/* Wait until the server is done serving (every worker finished or lost). */
void terse__ps_colo_stop(terse_ps *ps);
void terse__ps_colo_free(struct terse__ps_colo *colo);

/* ps_placement.c */
terse_status terse__ps_ring_build(terse_ps *ps);
/* Place key's chunks (bounded loads over what is placed so far). */
terse_status terse__ps_place(terse_ps *ps, terse__ps_key *k);
uint64_t terse__ps_mix(uint64_t x);

/* ps_worker.c / ps_loop.c / ps_step.c */
terse_status terse__ps_worker_run(terse_comm *c, terse_request *r, int *keep_usable);
terse_status terse__ps_serve_run(terse_comm *c, terse_request *r, int *keep_usable);
terse_status terse__ps_shard_init(terse_ps *ps, terse__ps_key *k, const float *init);
void terse__ps_shard_free(terse_ps *ps, terse__ps_shard *sh);
void terse__ps_worker_free(terse_ps *ps);

/* A worker's waits nap after this long without an event. */
#define TERSE__PS_NAP_AFTER_NS 200000u
/* ps_worker.c, for ps_pipe.c: encode key k's chunks on server s into
 * *buf (grown as needed); decode server s's pull payload p (its chunks of
 * k, in order) into out, the partition's floats (key: for sentences). */
terse_status terse__ps_encode_for(terse__ps_key *k, int s, const float *grad, uint8_t **buf,
                                  size_t *cap, size_t *len);
terse_status terse__ps_decode_from(terse_ps *ps, terse__ps_key *k, int s, const uint8_t *p,
                                   size_t key, float *out, size_t len);
/* ps_worker.c, for ps_pipe.c: the first refusal as this worker's error. */
const char *terse__ps_op_name(int op);
/* ps_worker.c, for ps_failover.c: *buf holds at least want bytes. */
terse_status terse__ps_grow(uint8_t **buf, size_t *cap, size_t want);
/* ps_failover.c, for ps_worker.c (replicas 2). early_pulls: the pull
 * payloads a wait posts as their reply headers come in. After a failover one server serves two slots, and its reply header
 * for the second follows the first's payload on the same connection: a
 * provider that stops reading a connection at a message no receive
 * matches yet (net) would wait for ever if that payload's receive were
 * posted only once every header is in (rxm queues it instead). */
typedef struct terse__ps_early_pulls {
    terse__ps_key *k;
    int *qslot;
    size_t nq;                          /* the wait's requests, these included */
    int rep_at[TERSE__PS_MAX_SERVERS];  /* slot s's reply header in the wait, or -1 */
    uint8_t posted[TERSE__PS_MAX_SERVERS]; /* 1: its payload's receive is in the wait */
} terse__ps_early_pulls;
terse_status terse__ps_wait_slots(terse_ps *ps, terse__fabric_req *q, size_t nq, const int *qslot,
                                  uint8_t *failed, int loss_ok, terse__ps_early_pulls *early);
terse_status terse__ps_move_slot(terse_ps *ps, int s, int why, uint32_t epoch, uint32_t inc,
                                 size_t cur, int cur_pushes);
terse_status terse__ps_finish_replicated(terse_ps *ps);

/* Tests: send server `server` a hand-made request (a header as
 * terse__ps_put_hdr writes it, whose seq is filled in, and len payload
 * bytes) and receive its reply header into *rep (blocking). Lets a test
 * play a worker that lies, or a rank that is not a worker. */
terse_status terse__ps_test_raw(terse_ps *ps, int server, terse__ps_hdr *h, const void *payload,
                                size_t len, terse__ps_rep *rep);
/* The same to the replica of slot's head (replicas 2, before a failover). */
terse_status terse__ps_test_raw_replica(terse_ps *ps, int slot, terse__ps_hdr *h,
                                        const void *payload, size_t len, terse__ps_rep *rep);

#endif
