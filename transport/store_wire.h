/* The bootstrap store's wire: frames, the HMAC handshake, and the socket
 * helpers shared by the client (store.c) and the server (store_server.c).
 * Internal to transport/.
 *
 * A frame is a 4-byte little-endian body length, one type byte, then the
 * body. The length is checked against a hard maximum (which is tiny until a
 * connection has authenticated) before any byte of the body is buffered, so
 * a peer can never make either side allocate what it asks for.
 *
 * Handshake, in order:
 *   server -> HELLO   snonce[32]
 *   client -> AUTH    u32 rank, u32 nranks, cnonce[32],
 *                     HMAC-SHA256(token, snonce || "terse-store-v1" || u32 rank)
 *   server -> WELCOME HMAC-SHA256(token, cnonce || snonce || "terse-store-v1/server" || u32 rank)
 *          or REFUSE  u8 reason, text
 * The two directions use different labels so that one side's proof can never
 * be replayed as the other's. After WELCOME the client sends SET / GET / BYE
 * (each request carries an id that its reply echoes) and the server sends
 * OK / VALUE replies and LOST notices at any time.
 *
 * Every frame after WELCOME, in both directions, ends with a 16-byte tag:
 * HMAC-SHA256(K_dir, u64 seq || u8 type || u32 body length || body), cut
 * to 16 bytes, where seq counts the direction's keyed frames from 0 and
 *   K_c2s = HMAC-SHA256(token, "terse-store-v1/c2s" || snonce || cnonce || u32 rank)
 *   K_s2c = HMAC-SHA256(token, "terse-store-v1/s2c" || snonce || cnonce || u32 rank)
 * so a relay that passed the handshake through can neither alter, insert,
 * drop, reorder nor replay a later frame: the receiver's next tag fails and
 * it treats the connection as broken (the server drops it -- the rank is
 * lost -- and the client reports the store gone). */
#ifndef TERSE_TRANSPORT_STORE_WIRE_H
#define TERSE_TRANSPORT_STORE_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "terse.h"

enum {
    TERSE__STORE_HDR = 5,            /* u32 length + u8 type */
    TERSE__STORE_NONCE = 32,
    TERSE__STORE_MAC = 32,           /* SHA-256 */
    TERSE__STORE_MAX_KEY = 255,
    TERSE__STORE_MAX_VALUE = 65536,
    /* SET: u32 id, u16 key length, key, value -- the largest body. */
    TERSE__STORE_MAX_BODY = 4 + 2 + TERSE__STORE_MAX_KEY + TERSE__STORE_MAX_VALUE,
    TERSE__STORE_AUTH_BODY = 4 + 4 + TERSE__STORE_NONCE + TERSE__STORE_MAC,
    TERSE__STORE_MAX_RANKS = 1 << 20,
    TERSE__STORE_MAX_TOKEN = 255,
    TERSE__STORE_TAG = 16,           /* the tag on every frame after WELCOME */
    TERSE__STORE_MAX_BACK = 1024,    /* a replacement's announcement */
    TERSE__STORE_MAX_FAILED = 400,   /* a FAILED notice's text */
};
/* In AUTH's rank field: join as the replacement of this lost rank. */
#define TERSE__STORE_REJOIN_BIT 0x80000000u

typedef enum terse__store_frame {
    TERSE__STORE_HELLO = 1,   /* S->C snonce */
    TERSE__STORE_AUTH = 2,    /* C->S see above */
    TERSE__STORE_WELCOME = 3, /* S->C server proof */
    TERSE__STORE_REFUSE = 4,  /* S->C u8 reason, text; then the server closes */
    TERSE__STORE_SET = 5,     /* C->S u32 id, u16 klen, key, value */
    TERSE__STORE_GET = 6,     /* C->S u32 id, u16 klen, key (parked until the key exists) */
    TERSE__STORE_OK = 7,      /* S->C u32 id (a SET is stored) */
    TERSE__STORE_VALUE = 8,   /* S->C u32 id, value */
    TERSE__STORE_LOST = 9,    /* S->C u32 rank: that rank dropped without BYE */
    TERSE__STORE_BYE = 10,    /* C->S empty: an orderly leave, not a loss */
    /* C->S blob (a replacement, once); S->C u32 rank, u32 incarnation, blob:
     * a lost rank is back, and how to reach it */
    TERSE__STORE_BACK = 11,
    TERSE__STORE_LEFT = 12,   /* S->C u32 rank: that rank said BYE and left */
    /* C->S u32 status, text: this rank's collective failed for a reason
     * every rank should hear (the ranks' arguments disagree); S->C u32 rank,
     * u32 status, text: relayed to every other rank, once per rank */
    TERSE__STORE_FAILED = 13,
    /* C->S u32 generation: this rank's worker of its colocated parameter
     * server number `generation` (1, 2, ... per communicator) failed and
     * will never finish (algos/ps/ps_colocate.c); S->C u32 rank, u32
     * generation: relayed to every other rank, generations increasing, so
     * their servers stop waiting for it */
    TERSE__STORE_WGONE = 14,
} terse__store_frame;

typedef enum terse__store_refusal {
    TERSE__STORE_REFUSE_AUTH = 1,      /* wrong token */
    TERSE__STORE_REFUSE_DUPLICATE = 2, /* this rank has already joined */
    TERSE__STORE_REFUSE_SHAPE = 3,     /* rank out of range or job size mismatch */
} terse__store_refusal;

/* ---- handshake proofs (store_auth.c), OpenSSL libcrypto ---- */

/* Fill a nonce from the OpenSSL CSPRNG. TERSE_ERR_INTERNAL if it fails. */
terse_status terse__store_nonce(uint8_t nonce[TERSE__STORE_NONCE]);
/* The client's proof: HMAC(token, snonce || "terse-store-v1" || u32 rank). */
terse_status terse__store_client_mac(const char *token, const uint8_t *snonce, uint32_t rank,
                                     uint8_t mac[TERSE__STORE_MAC]);
/* The server's proof: HMAC(token, cnonce || snonce || "terse-store-v1/server" || u32 rank). */
terse_status terse__store_server_mac(const char *token, const uint8_t *cnonce,
                                     const uint8_t *snonce, uint32_t rank,
                                     uint8_t mac[TERSE__STORE_MAC]);
/* The two directions' frame keys of one authenticated connection. */
terse_status terse__store_session_keys(const char *token, const uint8_t *snonce,
                                       const uint8_t *cnonce, uint32_t rank, uint8_t c2s[32],
                                       uint8_t s2c[32]);
/* Constant-time comparison of two MACs: 1 if equal. */
int terse__store_mac_equal(const uint8_t *a, const uint8_t *b);

/* ---- frame buffers (store_frame.c) ---- */

/* Bytes received but not yet consumed. cap is fixed by the caller (it bounds
 * the largest frame this side accepts). */
typedef struct terse__store_rx {
    uint8_t *buf;
    size_t len, cap;
    int keyed;        /* frames carry tags (after WELCOME); 2: from the next one */
    uint64_t seq;     /* of the next keyed frame */
    uint8_t key[32];
} terse__store_rx;

/* Bytes queued for sending (grows; head is the first unsent byte). */
typedef struct terse__store_tx {
    uint8_t *buf;
    size_t head, len, cap;
    int keyed;
    uint64_t seq;
    uint8_t key[32];
} terse__store_tx;

terse_status terse__store_rx_init(terse__store_rx *rx, size_t max_body);
terse_status terse__store_rx_grow(terse__store_rx *rx, size_t max_body);
void terse__store_rx_free(terse__store_rx *rx);
/* recv what the socket has into free space: >0 bytes read, 0 the peer
 * closed, -1 nothing available (EAGAIN), -2 a socket error (errno set). */
long terse__store_rx_read(terse__store_rx *rx, int fd);
/* The first complete frame: 1 and (*type, *body, *blen) pointing into the
 * buffer (a keyed frame's tag checked and left out of *blen); 0 if
 * incomplete; -1 if its length exceeds max_body (*blen holds the claimed
 * length); -2 if its tag does not check. The frame stays until
 * terse__store_rx_consume. */
int terse__store_rx_peek(const terse__store_rx *rx, size_t max_body, uint8_t *type,
                         const uint8_t **body, size_t *blen);
void terse__store_rx_consume(terse__store_rx *rx);

void terse__store_tx_free(terse__store_tx *tx);
/* From now on frames carry tags under key (copied; the caller wipes its).
 * after_current: the frame being handled (still buffered) is the last
 * untagged one, and tagging starts with the next. */
void terse__store_rx_key(terse__store_rx *rx, const uint8_t key[32], int after_current);
void terse__store_tx_key(terse__store_tx *tx, const uint8_t key[32]);
/* Queue one frame whose body is the concatenation of up to three parts
 * (NULL/0 parts are skipped). TERSE_ERR_NOMEM if the queue cannot grow. */
terse_status terse__store_tx_frame(terse__store_tx *tx, uint8_t type, const void *a, size_t alen,
                                   const void *b, size_t blen, const void *c, size_t clen);
size_t terse__store_tx_pending(const terse__store_tx *tx);
/* send what the socket takes: 0 when all or some was sent or the socket is
 * full (EAGAIN), -1 on a socket error (errno set). Never raises SIGPIPE. */
int terse__store_tx_flush(terse__store_tx *tx, int fd);

/* ---- sockets and time (store_net.c) ---- */

/* CLOCK_MONOTONIC in milliseconds. */
uint64_t terse__store_now_ms(void);
/* Split "host:port" or "[v6]:port" into host and a port in 1..65535. The
 * error sentence names `what` (e.g. "TERSE_ADDR") and the string. */
terse_status terse__store_split_addr(const char *addr, const char *what, char *host,
                                     size_t host_cap, unsigned *port);
/* Resolve host:port (passive: for bind) into a list for freeaddrinfo,
 * giving up at deadline_ms. A numeric address is converted at once; a name
 * is looked up on a detached helper thread, and if the lookup is still
 * running at the deadline, TERSE_ERR_TIMEOUT names the host and the time
 * waited and the thread frees its result whenever it ends. A name that does
 * not resolve is TERSE_ERR_INVALID. */
struct addrinfo;
terse_status terse__store_resolve(const char *addr, int passive, uint64_t deadline_ms,
                                  struct addrinfo **out);
/* Tests only: the lookup the helper thread calls (getaddrinfo when NULL),
 * read when a lookup starts; and the number of helper threads that have
 * not yet ended (each frees its lookup when it does). */
typedef int (*terse__store_gai_fn)(const char *host, const char *port,
                                   const struct addrinfo *hints, struct addrinfo **res);
extern terse__store_gai_fn terse__store_gai_hook;
int terse__store_resolves_in_flight(void);
/* Listen on exactly host:port (SO_REUSEADDR, non-blocking, close-on-exec),
 * resolving it by deadline_ms. Close *fd with terse__store_close_fd. */
terse_status terse__store_listen(const char *addr, uint64_t deadline_ms, int *fd);
/* One non-blocking connect attempt to addr that gives up at deadline_ms
 * (name resolution included): 1 and *fd connected (close it with
 * terse__store_close_fd), 0 if refused/unreachable/timed out (reason in
 * why[]), or a status if addr cannot be used at all (TERSE_ERR_TIMEOUT if
 * its host name did not resolve by the deadline). */
terse_status terse__store_connect(const char *addr, uint64_t deadline_ms, int *fd, int *connected,
                                  char *why, size_t why_cap);
/* "ip:port" of the peer (or "unknown peer"). */
void terse__store_peer_name(int fd, char *buf, size_t cap);
/* Wait until fd is readable/writable (events as for poll) or deadline_ms:
 * 1 ready, 0 timed out, -1 error. */
int terse__store_wait_fd(int fd, short events, uint64_t deadline_ms);

/* ---- store fds across fork() (store_fork.c) ---- */

/* Every store fd is made and closed through these, which keep the set of
 * live ones: a pthread_atfork child handler (installed once, before the
 * first fd exists) closes all of them in a forked child, so a child never
 * keeps a dead rank's connection to the store open, and changes the value
 * of terse__store_fork_gen() in the child. All fds are non-blocking and
 * close-on-exec. Each returns -1 with errno set on failure. */
int terse__store_socket(int family, int type);
int terse__store_accept(int listen_fd);
int terse__store_pipe(int fds[2]);
/* At the descriptor limit: accept one waiting connection on a spare
 * descriptor and close it at once (0), so it is refused rather than left
 * waiting; -1 when there was none or no spare. keep_spare takes the spare
 * early (the server does at start). */
int terse__store_refuse(int listen_fd);
void terse__store_keep_spare(void);
/* Forget and close fd (< 0: nothing). */
void terse__store_close_fd(int fd);
/* Hold the store's descriptor registry: no store descriptor is opened or
 * closed meanwhile (the fabric's reaper holds it while it looks at the
 * process's descriptors, so that a number it checked is not closed and
 * reused by the store's thread before it acts on it). Short holds only. */
void terse__store_fds_lock(void);
void terse__store_fds_unlock(void);
/* Changes in every child forked from this process: an object that recorded
 * another value was inherited across fork() and its fds are gone. */
unsigned terse__store_fork_gen(void);

/* ---- the server thread (store_server.c), run inside rank 0 ---- */

typedef struct terse__store_server terse__store_server;

/* Bind addr, then serve nranks ranks that know token on a new thread.
 * linger_ms also bounds the resolution of addr. */
terse_status terse__store_server_start(const char *addr, int nranks, const char *token,
                                       int linger_ms, terse__store_server **out);
/* Stop accepting; unless abandon, wait (at most linger_ms) until every
 * authenticated rank has disconnected; abandon 2: the same for at most
 * 2 s (rank 0 failed and told the others why: the notice goes out first);
 * then end the thread and free. NULL
 * is accepted. Never called in a child forked after the start (the thread
 * is not there; store.c checks terse__store_fork_gen). */
void terse__store_server_stop(terse__store_server *srv, int abandon);
/* Rank 0's own client is about to leave without a goodbye (after a failure
 * of its own): its connection's end is not logged as a lost rank. */
void terse__store_server_owner_leaving(terse__store_server *srv);

#endif
