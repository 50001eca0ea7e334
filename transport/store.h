/* The bootstrap store: a small TCP key-value service run by rank 0, through
 * which ranks exchange their libfabric addresses (gloo's Store, in C).
 *
 * Every connection is authenticated before it may do anything: the server
 * sends a random 32-byte nonce, the client answers with
 * HMAC-SHA256(token, nonce || "terse-store-v1" || rank) and its own nonce,
 * the server answers with HMAC over both nonces under a different label
 * (mutual proof: a client sends nothing more to a server that cannot
 * prove it knows the token), all with OpenSSL's libcrypto. Wire details
 * are in store_wire.h. A wrong answer, a malformed frame, an oversized
 * value or a silent client is dropped and logged to stderr; the server
 * keeps serving legitimate ranks. The server binds only to the address it is
 * given.
 *
 * Every frame after the handshake carries an HMAC-SHA256 tag under a
 * per-connection, per-direction key (store_wire.h), so a relay that passed
 * the handshake through can alter nothing later. Unauthenticated
 * connections beyond 128 evict the oldest of them.
 *
 * The server runs on a thread inside rank 0 for the communicator's
 * lifetime. Each client keeps its connection open: when a rank's
 * connection drops, the server tells the remaining ranks ("rank r lost"),
 * which terse__store_check reports as TERSE_ERR_PEER_LOST.
 *
 * Fork. A process may fork after opening a store (PyTorch's DataLoader
 * forks its workers after the communicator exists). The child must not
 * keep the store's sockets open: if the parent then died, the server would
 * never see its connection end and nobody would be told the rank was lost.
 * So a pthread_atfork child handler, installed once before the first store
 * socket exists, closes in the child every store fd this process holds (the
 * client connection and, on rank 0, the server's listener and accepted
 * connections), and every store the child inherited becomes unusable:
 * set, get, allgather and check return TERSE_ERR_INVALID ("used in a child
 * process forked after terse_comm_init"), and close/abandon only free the
 * client's memory -- no goodbye is sent (the parent is still the rank), no
 * fd is closed again, and the server, whose thread exists only in the
 * parent, is left untouched (its memory stays allocated in the child). The
 * parent's store is unaffected. A child may open a store of its own.
 *
 * Name resolution never outlasts the caller's deadline: a host name is
 * looked up on a helper thread (numeric addresses are converted at once),
 * and a lookup still running at the deadline fails with TERSE_ERR_TIMEOUT
 * naming the host and the time waited. */
#ifndef TERSE_TRANSPORT_STORE_H
#define TERSE_TRANSPORT_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "terse.h"

typedef struct terse__store terse__store;

/* Rank 0: start the server on host:port (port 0 is refused: the others must
 * know it) and connect to it as a client. Others: connect, retrying until
 * timeout_ms (resolving the host name included). token must be non-empty.
 * A host name that does not resolve fails with TERSE_ERR_INVALID, one whose
 * lookup does not finish within timeout_ms with TERSE_ERR_TIMEOUT. */
terse_status terse__store_open(const char *addr, int rank, int nranks, const char *token,
                               int timeout_ms, terse__store **out);
/* The same; rejoin: as the replacement of rank `rank`, which the store
 * announced lost (refused otherwise, and always for rank 0, whose process
 * held the store). A replacement's requests do not fail for the job's
 * lost ranks: it joins a job that has some. */
terse_status terse__store_open_ex(const char *addr, int rank, int nranks, const char *token,
                                  int timeout_ms, int rejoin, terse__store **out);
/* Say goodbye (so the others are not told this rank was lost) and
 * disconnect. On rank 0 this also stops the server, after waiting up to
 * timeout_ms for the other ranks to disconnect, so that no rank loses the
 * store while it still reads the last allgather. NULL is accepted. */
void terse__store_close(terse__store *s);
/* Leave after an error, at once: no goodbye, so the others are told this
 * rank was lost (on rank 0 the server stops without waiting, and the others
 * lose the store). NULL is accepted. */
void terse__store_abandon(terse__store *s);

/* Set key (1..255 bytes) to value (<= 64 KiB); get blocks until the key
 * exists or the timeout passes (*len in: capacity, out: size; a larger
 * value gives TERSE_ERR_DST_TOO_SMALL with *len set; timeout_ms <= 0 means
 * the timeout given to terse__store_open). After a rank or the store is
 * lost every call returns TERSE_ERR_PEER_LOST. In a child forked after
 * the open, every call returns TERSE_ERR_INVALID (see Fork above). */
terse_status terse__store_set(terse__store *s, const char *key, const void *val, size_t len);
terse_status terse__store_get(terse__store *s, const char *key, void *val, size_t *len,
                              int timeout_ms);

/* Every rank contributes `len` bytes (<= 64 KiB); all receive nranks*len
 * bytes in rank order. Built on set/get: rank r sets "ag/<seq>/<r>" and
 * gets every rank's key; seq counts calls, so every rank must call it the
 * same number of times. A contribution of another length fails with
 * TERSE_ERR_INVALID naming the rank. */
terse_status terse__store_allgather(terse__store *s, const void *mine, size_t len, void *all,
                                    int timeout_ms);

/* Non-blocking: TERSE_ERR_PEER_LOST (naming the rank) if the server has
 * reported a lost rank or the server itself is gone; else TERSE_OK. Usable
 * as a terse__fabric_alive_fn. */
terse_status terse__store_check(void *store);
/* A FAILED notice from a rank (the first one) is reported by
 * terse__store_check as that rank's status and sentence from then on, also
 * once that rank, or any other, has left or been lost: the notice is the
 * first cause, and the ranks that heard it leave without a goodbye. */

/* A colocated parameter server (algos/ps/ps_colocate.c): tell every other
 * rank that this rank's worker of colocated pair `gen` (1, 2, ... in the
 * order the communicator made them) failed and will never finish, so their
 * servers count it lost instead of waiting for it (once per generation;
 * waits at most 1 s to send). terse__store_copy_wgone sets out[r] (nranks
 * bytes) for the ranks that announced generation `gen`, after taking in
 * the notices that have arrived. */
terse_status terse__store_tell_worker_gone(terse__store *s, uint32_t gen);
/* The same pair's endpoint (the worker's if worker, else the server's)
 * closed after a clean run: it reads nothing more, so a peer endpoint's
 * flush before its own close stops waiting for it (a colocated endpoint
 * has no goodbye of its own: its store is its rank's). */
terse_status terse__store_tell_endpoint_closed(terse__store *s, uint32_t gen, int worker);
/* out[r]: bit 0, rank r's worker of pair gen gave up; bit 1, its server
 * endpoint closed; bit 2, its worker endpoint closed. Notices from one
 * rank arrive in the order it sent them. */
terse_status terse__store_copy_wgone(terse__store *s, uint32_t gen, uint8_t *out);

/* Tell every other rank, through the server, that this rank's collective
 * failed with `status` for a reason they should hear (their arguments
 * disagree with this rank's): `why` (cut to 400 bytes) reaches them as
 * the sentence of their current call. Waits at most 1 s to send it. */
terse_status terse__store_tell_failed(terse__store *s, terse_status status, const char *why);

/* Non-blocking, and not sticky like terse__store_check: take in the loss
 * notices that have arrived; *map (nranks bytes, owned by the store) has
 * 1 for every rank reported lost so far. TERSE_ERR_PEER_LOST only when the
 * store itself is gone (rank 0 or its connection). The parameter server
 * uses it to go on without a lost worker. */
terse_status terse__store_poll_lost(terse__store *s, const uint8_t **map);
/* The same, but *map has 1 for every rank that will read nothing more:
 * lost, or left with a goodbye (terse__store_close). A closing rank's flush
 * waits for no such peer. */
terse_status terse__store_poll_gone(terse__store *s, const uint8_t **map);
/* Poll, then copy the lost map (gone 0) or the gone map (gone 1) into out
 * (nranks bytes) while holding the store's lock: for a thread other than
 * the one that owns the communicator (a colocated server's). */
terse_status terse__store_copy_map(terse__store *s, int gone, uint8_t *out);

/* Replacements. A replacement announces itself once, with an opaque blob
 * (<= 1024 bytes: how to reach it); every other rank's client receives it
 * as a BACK notice (taken in by poll_lost and the requests' waits), which
 * clears the rank's entry in the lost map and raises its incarnation
 * (1 at the first join). take_back hands out the notices oldest first; the
 * caller frees each. */
typedef struct terse__store_back {
    struct terse__store_back *next;
    int rank;
    uint32_t incarnation;
    size_t len;
    uint8_t blob[];
} terse__store_back;
terse_status terse__store_announce_back(terse__store *s, const void *blob, size_t len);
terse__store_back *terse__store_take_back(terse__store *s);
uint32_t terse__store_incarnation(const terse__store *s, int rank);
/* Count rank as lost again (a replacement this rank cannot reach). */
void terse__store_mark_lost(terse__store *s, int rank);

#endif
