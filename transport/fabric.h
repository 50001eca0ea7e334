/* The libfabric transport: tagged byte buffers between ranks. It knows
 * nothing of codecs or collectives (DESIGN.md).
 *
 * One FI_EP_RDM endpoint per rank with FI_TAGGED | FI_DIRECTED_RECV and
 * manual progress, one AV holding every rank's address in rank order.
 *
 * Messages: a send of `len` bytes matches exactly one receive of the same
 * (peer, tag) whose length is the same `len` -- both sides know the size
 * (collectives exchange sizes first when they vary). Messages larger than
 * the provider's max_msg_size (or TERSE_CHUNK_BYTES, default 1 MiB) are
 * split into chunks internally, with a bounded number in flight; callers
 * see one request. Tags: callers use the low 48 bits; the transport owns
 * the high 16 (chunk index).
 *
 * Receives should be posted before the matching sends where the algorithm
 * allows (collectives post all receives of a step first). -FI_EAGAIN is
 * handled by progressing the CQ and retrying until the deadline. */
#ifndef TERSE_TRANSPORT_FABRIC_H
#define TERSE_TRANSPORT_FABRIC_H

#include <stddef.h>
#include <stdatomic.h>
#include <stdint.h>

#include "terse.h"

typedef struct terse__fabric terse__fabric;

/* Open the endpoint. provider: "shm", "tcp", "verbs", "efa" or "auto" (see
 * terse.h; "auto" with all ranks on one host picks shm -- the caller passes
 * same_host). An unknown name fails with TERSE_ERR_INVALID; an absent
 * provider with TERSE_ERR_TRANSPORT and a sentence listing what fi_getinfo
 * offers.
 * Environment: TERSE_IFACE names the interface (tcp) or device (verbs,
 * efa) to use -- e.g. the veth of a network namespace; without it tcp uses
 * loopback when same_host, else libfabric's first choice. TERSE_CHUNK_BYTES
 * (default 1 MiB, k/m/g suffixes) must be equal on every rank (set_peers
 * checks). TERSE_FABRIC_REGISTER=1 registers buffers even where the
 * provider does not ask (tests the FI_MR_LOCAL path). */
terse_status terse__fabric_open(const char *provider, int same_host, int rank, int nranks,
                                terse__fabric **out);
/* (same_host: 0 ranks on several hosts; 1 every rank on this host; 2
 * several hosts -- TERSE_HOST -- in one network namespace: loopback
 * reaches them all, but "auto" does not pick shm.) */
void terse__fabric_close(terse__fabric *f);
/* Before an orderly close on net: wait (at most budget_ns) until every
 * peer this rank sent to has read everything sent to it, or is marked in
 * lost_map(arg) (a rank that reads nothing more: lost, or gone with a goodbye;
 * polled each millisecond; NULL: no news) (fabric_wait.c
 * says why). Other providers: nothing. */
void terse__fabric_flush(terse__fabric *f, uint64_t budget_ns,
                         const uint8_t *(*lost_map)(void *), void *arg);

/* "net", "tcp;ofi_rxm", "shm", ... */
const char *terse__fabric_provider(const terse__fabric *f);

/* This endpoint's address (fi_getname) plus what ranks must agree on;
 * *len in: capacity, out: size, which is the same on every rank (256). */
terse_status terse__fabric_name(terse__fabric *f, void *buf, size_t *len);

/* Insert every rank's address (nranks names of name_len bytes each, in rank
 * order, this rank's included) into the AV. */
terse_status terse__fabric_set_peers(terse__fabric *f, const void *names, size_t name_len);

/* Per-peer routing (issue 28): set_peers with only the ranks member[r] != 0
 * inserted (the others get no address: nothing may be sent to them here),
 * for a side endpoint among one host's ranks. */
terse_status terse__fabric_set_peers_among(terse__fabric *f, const void *names, size_t name_len,
                                           const uint8_t *member);
/* From now on messages to and from the peers with via_side[peer] != 0 go
 * through side (an shm endpoint whose peers are set), everything else
 * through f. f owns side and via_side (nranks bytes, malloc'ed) and frees
 * them at close; its waits and progress rounds drive both completion
 * queues, and quiesce, abandon, tolerant mode, epochs and counters apply
 * to both. Call before any message. */
void terse__fabric_attach_side(terse__fabric *f, terse__fabric *side, uint8_t *via_side);
/* The side endpoint (NULL: none). */
terse__fabric *terse__fabric_side(const terse__fabric *f);

/* A request. Owned by the caller (stack or array); it must stay valid and
 * unmoved until completed by terse__fabric_wait. */
typedef struct terse__fabric_req {
    int peer;
    int is_send;
    uint64_t tag;
    uint8_t *buf;
    size_t len;
    size_t chunks, posted, done; /* chunk bookkeeping */
    int error;                   /* a terse_status once failed */
    int sink;                    /* every chunk lands at buf (one chunk in flight) */
    uint32_t epoch;              /* the fabric's epoch when started (wire MACs) */
} terse__fabric_req;

/* Start a send/receive of len bytes (len may be 0). tag < 2^48; keep
 * (peer, tag) distinct among messages in flight at once. Never blocks:
 * what the provider cannot take yet is posted by terse__fabric_wait. */
terse_status terse__fabric_isend(terse__fabric *f, int peer, uint64_t tag, const void *buf,
                                 size_t len, terse__fabric_req *req);
terse_status terse__fabric_irecv(terse__fabric *f, int peer, uint64_t tag, void *buf, size_t len,
                                 terse__fabric_req *req);

/* Progress until every request in reqs[0..n) completes, or until
 * deadline_ns (CLOCK_MONOTONIC) passes: then TERSE_ERR_TIMEOUT naming the
 * first incomplete peer and direction. A completion error (peer gone)
 * returns TERSE_ERR_PEER_LOST naming the peer. `alive` (may be NULL) is
 * called between polls; a non-OK status from it aborts the wait with that
 * status (the bootstrap store uses it to report a lost rank early). After
 * any error or timeout the fabric refuses everything but close, which
 * returns promptly even with operations posted to a dead peer. */
typedef terse_status (*terse__fabric_alive_fn)(void *arg);
terse_status terse__fabric_wait(terse__fabric *f, terse__fabric_req *reqs, size_t n,
                                uint64_t deadline_ns, terse__fabric_alive_fn alive, void *arg);

/* The general wait: like terse__fabric_wait, with
 *   deadline_ns  absolute CLOCK_MONOTONIC limit (UINT64_MAX: none);
 *   idle_ns      an inactivity limit: TERSE_ERR_TIMEOUT once no completion
 *                of any kind arrived for this long (0: none), so a long
 *                transfer that keeps moving never times out;
 *   abort        when *abort becomes nonzero (any thread may set it) the
 *                wait stops with TERSE_ERR_ABORTED within one progress
 *                round (microseconds).
 * terse__fabric_wait is this with only a deadline. */
typedef struct terse__fabric_wait_opts {
    uint64_t deadline_ns;
    uint64_t idle_ns;
    const _Atomic int *abort;
    terse__fabric_alive_fn alive;
    void *arg;
    uint64_t alive_period_ns; /* call alive at most this often (0: every round) */
    uint64_t nap_after_ns;    /* silence before napping between rounds (0: 10 ms) */
} terse__fabric_wait_opts;
terse_status terse__fabric_wait_ex(terse__fabric *f, terse__fabric_req *reqs, size_t n,
                                   const terse__fabric_wait_opts *opts);

/* Tolerant mode (the parameter server, which must outlive any one
 * worker): from now on an error that concerns one request -- its peer
 * lost, a message of the wrong size -- sets that request's error and
 * leaves the fabric usable for every other peer; only errors that concern
 * no request (the completion queue itself) still fail the fabric. A
 * failed request's buffer may still be written by chunks posted before
 * the error until terse__fabric_quiesce or close: keep it alive. */
void terse__fabric_set_tolerant(terse__fabric *f);
/* One progress round without waiting: read completions, post what the
 * windows allow. *events counts completions seen. */
terse_status terse__fabric_progress(terse__fabric *f, size_t *events);
/* Tolerant mode: cancel what is posted of r and wait (at most 100 ms) for
 * it to come back; 1 when nothing of r is posted any more (its buffer is
 * free), 0 otherwise (then only terse__fabric_quiesce makes it safe). */
int terse__fabric_cancel(terse__fabric *f, terse__fabric_req *r);
/* Tolerant mode, after terse__fabric_cancel gave 0 for a request to a
 * peer known dead (shm may never return a transfer to a dead process):
 * give r up. What is still posted of it now stands for a placeholder the
 * fabric owns, so r may be reused at once; its buffer must stay allocated
 * (the provider may still hold it) but receives nothing (a dead peer
 * sends nothing). 0 if the fabric is not tolerant. */
int terse__fabric_give_up(terse__fabric *f, terse__fabric_req *r);
/* shm (libfabric 1.17) completes a send larger than its inject size only
 * when the receiver answers, and answers in order: one send to a process
 * that died unanswered stalls every later large send's completion for
 * good. Keep every chunk within the inject size, so no send waits for an
 * answer (the parameter server with replicas, which must outlive a
 * server). Call on every rank alike, with nothing in flight: both sides
 * chunk a message alike from its length. No-op on other providers. */
void terse__fabric_small_chunks_on_shm(terse__fabric *f);
/* 1 once r completed or failed (r->error). */
int terse__fabric_req_done(const terse__fabric_req *r);
/* Tolerant mode: 1 once r completed, or failed and nothing of it is posted
 * any more (a failed request's other chunks are cancelled at its failure
 * and come back later): only then may r and its buffer be reused. */
int terse__fabric_req_idle(const terse__fabric *f, const terse__fabric_req *r);
/* Receive a message of len bytes and throw it away, through a buffer of
 * min(len, chunk size) bytes (terse__fabric_sink_bytes), one chunk at a
 * time: so a refused message of any size can be drained. */
terse_status terse__fabric_irecv_sink(terse__fabric *f, int peer, uint64_t tag, void *buf,
                                      size_t len, terse__fabric_req *req);
size_t terse__fabric_sink_bytes(const terse__fabric *f);

/* After a failure: cancel every operation still posted, give the
 * cancellations a short bounded time (at most 20 ms) to come back, then
 * close the endpoint, so that nothing the provider still held can write
 * into a caller's buffer once this returns. Only terse__fabric_close may
 * follow. Idempotent; NULL is accepted. */
void terse__fabric_quiesce(terse__fabric *f);
/* From now on quiesce cancels and collects but leaves the endpoint open
 * for terse__fabric_close. For two endpoints of one process that talk to
 * each other (a colocated parameter server's): shm writes straight into a
 * peer endpoint of its own process, so one that closed early would be
 * written to after its memory went away. */
void terse__fabric_keep_open(terse__fabric *f);

/* The watchdog (any thread). libfabric's shm provider spins, inside
 * fi_tsend / fi_cq_read, on a lock in a peer's shared region; a peer
 * SIGKILLed or SIGSTOPped while holding it never releases it, and the
 * spinning thread cannot be interrupted. terse__fabric_call_age says how
 * long the provider call in progress has lasted (0: none; *peer is the
 * peer it concerns, -1 for the completion queue; *what names the call).
 * terse__fabric_abandon gives up on the fabric: a call that ever returns
 * fails at once, and the fabric may never be closed or freed (its thread
 * may still be inside the provider). */
uint64_t terse__fabric_call_age(terse__fabric *f, int *peer, const char **what);
/* TERSE_SHM_RESCUE=1, shm on libfabric 1.17 only (fabric_shm.c says what
 * it risks): if the call in progress has spun 300 ms or more on a region
 * lock while a process of the job is dead and none is stopped, release
 * that lock (once per stuck call) and say so on stderr; 1 if it did. */
int terse__fabric_shm_rescue(terse__fabric *f);
void terse__fabric_abandon(terse__fabric *f);
int terse__fabric_is_abandoned(const terse__fabric *f);

/* Authenticated messages (fabric_mac.c has the construction). */
#define TERSE__WIRE_MAC 16   /* bytes of GMAC after every chunk */
#define TERSE__WIRE_NONCE 32 /* random bytes each rank publishes at init */

/* From now on every chunk carries a Poly1305 tag under per-pair keys
 * derived from token and every rank's nonce (nranks x TERSE__WIRE_NONCE
 * bytes, rank order); with encrypt (TERSE_WIRE=seal), its bytes are also encrypted
 * (ChaCha20), through a bounded pool of staging buffers on the send side
 * and in place on the receive side. Call after set_peers and before any
 * message; every rank must, alike. */
terse_status terse__fabric_set_keys(terse__fabric *f, const char *token, const uint8_t *nonces,
                                    int encrypt);
/* The same for a second endpoint of this process (a colocated parameter
 * server's, algos/engine/engine_twin.c): the token's secret and the
 * encryption choice come from `from`, an endpoint that has its keys. */
terse_status terse__fabric_set_keys_from(terse__fabric *f, const terse__fabric *from,
                                         const uint8_t *nonces);
/* The high bits of the collective sequence number, which the tag leaves
 * out; bound into every MAC so that a chunk replayed 2^20 phases later
 * fails. Every rank sets the same value at the same point. */
void terse__fabric_set_epoch(terse__fabric *f, uint32_t epoch);
/* Chunks from peer (or from anyone, peer = -1) dropped because they failed
 * authentication. */
uint64_t terse__fabric_auth_failures(const terse__fabric *f, int peer);
/* A lost rank's replacement: its endpoint name (as terse__fabric_name
 * gives, checked like set_peers' entries) takes the old one's place in
 * the AV, what was still posted to the old process is cancelled or given
 * up, and with TERSE_WIRE=mac its keys are derived from its new nonce. */
terse_status terse__fabric_replace_peer(terse__fabric *f, int peer, const void *name,
                                        size_t name_len, const uint8_t *nonce);
terse_status terse__fabric_rekey_peer(terse__fabric *f, int peer, const uint8_t *nonce);
/* Messages dropped that came from an address that is no rank (fabric_sweep.c,
 * "Strangers"). */
uint64_t terse__fabric_stranger_drops(const terse__fabric *f);
/* Tests only: corrupt one byte of every k-th chunk sent after its MAC was
 * computed (0: never), as a relay flipping bits would. */
void terse__fabric_test_tamper(terse__fabric *f, unsigned every_k);

/* Bytes handed to libfabric so far (payload) -- for terse_comm_stats. */
void terse__fabric_counters(const terse__fabric *f, uint64_t *sent, uint64_t *recv);

/* CLOCK_MONOTONIC in nanoseconds. */
uint64_t terse__now_ns(void);

/* net: strangers' connections terse closed after net let go of them, or
 * shut down silent (transport/fabric_reap.c); 0 on other providers. */
uint64_t terse__fabric_reaped(const terse__fabric *f);

#endif
