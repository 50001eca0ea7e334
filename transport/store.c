/* The bootstrap store's client: join (with the mutual HMAC handshake), set,
 * blocking get, allgather, and liveness checks. Rank 0 also starts the
 * server (store_server.c) and then joins it like everybody else.
 *
 * One request is outstanding at a time. Frames that arrive while waiting
 * for a reply are notices -- LOST (recorded, and the wait fails), LEFT (an
 * orderly leave: recorded for the close's flush, not a failure), BACK --
 * or stale replies to a request that already timed out (ids never repeat,
 * so they are recognised and discarded). */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <openssl/crypto.h>
#include <poll.h>

#include "common/bytes.h"
#include "common/error.h"
#include "transport/store.h"
#include "transport/store_wire.h"

struct terse__store {
    int fd;
    int rank, nranks, timeout_ms;
    char addr[256];
    terse__store_rx rx;
    terse__store_tx tx;
    uint32_t next_id, ag_seq;
    unsigned fork_gen; /* terse__store_fork_gen() when opened */
    int lost_rank;     /* first rank the server reported lost, or -1 */
    uint8_t *lost_map; /* every rank the server reported lost (nranks) */
    uint8_t *gone_map; /* every rank reported lost or left with a goodbye (nranks) */
    uint32_t *wgone_gen; /* per rank: the last colocated pair whose worker gave up (WGONE),
                            then (nranks on) the last WGONE that closed endpoints: 4 gen +
                            mask */
    uint32_t told_wgone; /* the last WGONE value this rank sent (4 gen + mask) */
    int gone;          /* the connection to the server has ended */
    int rejoin;        /* joined as a lost rank's replacement: losses are
                          recorded, never sticky (the job it joins has some) */
    uint32_t *incarnation;  /* per rank: joins announced (1 until a BACK) */
    terse__store_back *backs; /* BACK notices not taken yet, oldest first */
    char gone_why[128];
    terse__store_server *server; /* rank 0 only */
    /* The first FAILED notice: a rank whose collective failed for a reason
     * every rank should hear (its arguments disagreed with its neighbour's). */
    int failed_rank; /* -1: none */
    int told_failed;     /* this rank sent one */
    terse_status failed_status;
    char failed_why[TERSE__STORE_MAX_FAILED + 1];
};

/* The sticky failure once a rank or the store itself is gone. */
static terse_status fail_lost(const terse__store *s) {
    if (s->lost_rank >= 0)
        return TERSE_ERROR(TERSE_ERR_PEER_LOST,
                           "rank %d was lost: its connection to the bootstrap store at %s "
                           "dropped without a goodbye (noticed by rank %d)",
                           s->lost_rank, s->addr, s->rank);
    return TERSE_ERROR(TERSE_ERR_PEER_LOST, "rank %d lost the bootstrap store at %s (rank 0): %s",
                       s->rank, s->addr, s->gone_why);
}

/* A lost rank makes every later request fail, except on a replacement. */
static int sticky(const terse__store *s) {
    return s->gone || (s->lost_rank >= 0 && !s->rejoin);
}

/* A LOST, LEFT or BACK notice from the server: recorded (1), or not one (0). */
static int take_notice(terse__store *s, uint8_t type, const uint8_t *b, size_t len) {
    if (type == TERSE__STORE_LOST && len == 4) {
        uint32_t r = terse__get_u32(b);
        if (s->lost_rank < 0) s->lost_rank = r < (uint32_t)s->nranks ? (int)r : s->nranks;
        if (r < (uint32_t)s->nranks) s->lost_map[r] = s->gone_map[r] = 1;
        return 1;
    }
    if (type == TERSE__STORE_LEFT && len == 4) { /* an orderly leave: not a failure */
        uint32_t r = terse__get_u32(b);
        if (r < (uint32_t)s->nranks) s->gone_map[r] = 1;
        return 1;
    }
    if (type == TERSE__STORE_WGONE && len == 8) {
        uint32_t r = terse__get_u32(b), v = terse__get_u32(b + 4);
        if (r >= (uint32_t)s->nranks) return 1;
        if (!(v & 3) && v >> 2 > s->wgone_gen[r]) s->wgone_gen[r] = v >> 2;
        if ((v & 3) && v > s->wgone_gen[s->nranks + r]) s->wgone_gen[s->nranks + r] = v;
        return 1;
    }
    if (type == TERSE__STORE_FAILED && len >= 8 && len <= 8 + TERSE__STORE_MAX_FAILED) {
        uint32_t r = terse__get_u32(b), st = terse__get_u32(b + 4);
        if (r >= (uint32_t)s->nranks || (int)r == s->rank) return 1;
        if (s->failed_rank >= 0) return 1;
        /* a status the library knows, else the generic one */
        s->failed_status = st != TERSE_OK &&
                                   strcmp(terse_status_name((terse_status)st), "TERSE_ERR_UNKNOWN")
                               ? (terse_status)st : TERSE_ERR_INTERNAL;
        for (size_t i = 8; i < len; i++)
            s->failed_why[i - 8] = b[i] >= 0x20 && b[i] < 0x7f ? (char)b[i] : '?';
        s->failed_why[len - 8] = 0;
        s->failed_rank = (int)r;
        return 1;
    }
    if (type != TERSE__STORE_BACK || len < 8 || len > 8 + TERSE__STORE_MAX_BACK) return 0;
    uint32_t r = terse__get_u32(b), inc = terse__get_u32(b + 4);
    if (r >= (uint32_t)s->nranks || inc <= s->incarnation[r]) return 1; /* stale: ignored */
    terse__store_back *n = malloc(sizeof *n + len - 8);
    if (!n) return 1; /* the replacement stays unknown here: it fails as lost */
    n->rank = (int)r;
    n->incarnation = inc;
    n->len = len - 8;
    n->next = NULL;
    memcpy(n->blob, b + 8, len - 8);
    terse__store_back **tail = &s->backs;
    while (*tail) tail = &(*tail)->next;
    *tail = n;
    s->incarnation[r] = inc;
    s->lost_map[r] = s->gone_map[r] = 0;
    /* The sticky failure names the first rank still lost, if any. */
    s->lost_rank = -1;
    for (int i = 0; i < s->nranks && s->lost_rank < 0; i++)
        if (s->lost_map[i]) s->lost_rank = i;
    return 1;
}

/* 1 if s was inherited across fork(): its fds were closed in the child
 * (store_fork.c) and, on rank 0, the server thread does not exist here. */
static int forked(const terse__store *s) { return s->fork_gen != terse__store_fork_gen(); }

static terse_status fail_forked(const terse__store *s) {
    return TERSE_ERROR(TERSE_ERR_INVALID,
                       "rank %d's bootstrap store (%s) was used in a child process forked after "
                       "terse_comm_init; the communicator belongs to the parent process, and "
                       "the child's copies of its store sockets were closed at the fork",
                       s->rank, s->addr);
}

static void mark_gone(terse__store *s, const char *why) {
    if (!s->gone) snprintf(s->gone_why, sizeof s->gone_why, "%s", why);
    s->gone = 1;
}

enum { F_FRAME, F_EOF, F_TIMEOUT, F_OVERSIZED, F_ERROR, F_FORGED };

/* The next complete frame from the server, reading until deadline_ms (0:
 * only what has already arrived). The frame stays buffered until
 * terse__store_rx_consume. */
static int next_frame(terse__store *s, uint64_t deadline_ms, uint8_t *type, const uint8_t **body,
                      size_t *n) {
    for (;;) {
        int k = terse__store_rx_peek(&s->rx, TERSE__STORE_MAX_BODY, type, body, n);
        if (k > 0) return F_FRAME;
        if (k == -2) return F_FORGED;
        if (k < 0) return F_OVERSIZED;
        long r = terse__store_rx_read(&s->rx, s->fd);
        if (r > 0) continue;
        if (r == 0) return F_EOF;
        if (r == -2) return F_ERROR;
        int w = terse__store_wait_fd(s->fd, POLLIN, deadline_ms);
        if (w == 0) return F_TIMEOUT;
        if (w < 0) return F_ERROR;
    }
}

/* Wait for the reply of type `want` to request `id` (want 0: just take in
 * what has arrived). On TERSE_OK with want != 0, body and n give the reply
 * after its id, and the caller consumes it. TERSE_ERR_TIMEOUT is returned
 * without a sentence: the caller knows what it was waiting for. */
static terse_status await(terse__store *s, uint32_t id, uint8_t want, uint64_t deadline_ms,
                          const uint8_t **body, size_t *n) {
    if (sticky(s)) return fail_lost(s);
    for (;;) {
        uint8_t type = 0;
        const uint8_t *b = NULL;
        size_t len = 0;
        int f = next_frame(s, deadline_ms, &type, &b, &len);
        if (f == F_TIMEOUT) return want ? TERSE_ERR_TIMEOUT : TERSE_OK;
        if (f == F_EOF) mark_gone(s, "the connection was closed");
        if (f == F_ERROR) mark_gone(s, strerror(errno));
        if (f == F_OVERSIZED) mark_gone(s, "it sent an oversized frame");
        if (f == F_FORGED)
            mark_gone(s, "a frame from it failed authentication (something between this rank "
                         "and the store altered, dropped or inserted data)");
        if (f != F_FRAME) return fail_lost(s);
        if (take_notice(s, type, b, len)) {
            terse__store_rx_consume(&s->rx);
            if (sticky(s)) return fail_lost(s);
            continue;
        }
        if ((type == TERSE__STORE_OK || type == TERSE__STORE_VALUE) && len >= 4) {
            if (want && type == want && terse__get_u32(b) == id) {
                *body = b + 4;
                *n = len - 4;
                return TERSE_OK;
            }
            terse__store_rx_consume(&s->rx); /* a reply to a request that timed out */
            continue;
        }
        mark_gone(s, "it sent a malformed frame");
        return TERSE_ERROR(TERSE_ERR_CORRUPT,
                           "the bootstrap store at %s sent rank %d an unexpected frame "
                           "(type %u, %zu bytes)",
                           s->addr, s->rank, type, len);
    }
}

/* Queue one frame and send all of it before deadline_ms. */
static terse_status send_frame(terse__store *s, uint8_t type, const void *a, size_t alen,
                               const void *b, size_t blen, const void *c, size_t clen,
                               uint64_t deadline_ms) {
    TERSE_CHECK(terse__store_tx_frame(&s->tx, type, a, alen, b, blen, c, clen));
    for (;;) {
        if (terse__store_tx_flush(&s->tx, s->fd) != 0) {
            mark_gone(s, strerror(errno));
            return fail_lost(s);
        }
        if (!terse__store_tx_pending(&s->tx)) return TERSE_OK;
        int w = terse__store_wait_fd(s->fd, POLLOUT, deadline_ms);
        if (w <= 0) {
            /* A half-sent frame would desynchronise the stream: give up on it. */
            mark_gone(s, w == 0 ? "a send timed out" : strerror(errno));
            return TERSE_ERROR(TERSE_ERR_TIMEOUT,
                               "rank %d could not send to the bootstrap store at %s within %d ms",
                               s->rank, s->addr, s->timeout_ms);
        }
    }
}

/* ---- joining ---- */

/* One handshake on a fresh connection. *retry is set when the failure may
 * be transient (the server closed or stayed silent), so the caller tries
 * again until its deadline; why[] says what happened. */
static terse_status handshake(terse__store *s, const char *token, uint64_t deadline, int *retry,
                              char *why, size_t why_cap) {
    uint8_t type = 0, snonce[TERSE__STORE_NONCE], cnonce[TERSE__STORE_NONCE];
    uint8_t mac[TERSE__STORE_MAC], hdr[8];
    const uint8_t *b = NULL;
    size_t n = 0;
    *retry = 0;
    s->rx.len = 0;
    s->tx.head = s->tx.len = 0;
    /* 1. The server's challenge. */
    int f = next_frame(s, deadline, &type, &b, &n);
    if (f != F_FRAME && f != F_OVERSIZED) {
        *retry = 1;
        snprintf(why, why_cap, "no greeting from the store (%s)",
                 f == F_TIMEOUT ? "timed out" : "connection closed");
        return TERSE_OK;
    }
    if (f == F_OVERSIZED || type != TERSE__STORE_HELLO || n != TERSE__STORE_NONCE)
        return TERSE_ERROR(TERSE_ERR_CORRUPT,
                           "the server at %s is not a terse bootstrap store (its first frame "
                           "is not a greeting)",
                           s->addr);
    memcpy(snonce, b, TERSE__STORE_NONCE);
    terse__store_rx_consume(&s->rx);
    /* 2. Our proof and our own challenge. */
    TERSE_CHECK(terse__store_nonce(cnonce));
    const uint32_t wire_rank = (uint32_t)s->rank | (s->rejoin ? TERSE__STORE_REJOIN_BIT : 0);
    TERSE_CHECK(terse__store_client_mac(token, snonce, wire_rank, mac));
    terse__put_u32(hdr, wire_rank);
    terse__put_u32(hdr + 4, (uint32_t)s->nranks);
    TERSE_CHECK(terse__store_tx_frame(&s->tx, TERSE__STORE_AUTH, hdr, 8, cnonce, sizeof cnonce,
                                      mac, sizeof mac));
    while (terse__store_tx_pending(&s->tx)) {
        if (terse__store_tx_flush(&s->tx, s->fd) != 0 ||
            (terse__store_tx_pending(&s->tx) &&
             terse__store_wait_fd(s->fd, POLLOUT, deadline) <= 0)) {
            *retry = 1;
            snprintf(why, why_cap, "the handshake could not be sent");
            return TERSE_OK;
        }
    }
    /* 3. The server's answer: a refusal, or its proof that it knows the token. */
    f = next_frame(s, deadline, &type, &b, &n);
    if (f != F_FRAME && f != F_OVERSIZED) {
        *retry = 1;
        snprintf(why, why_cap, "the store closed the connection during the handshake");
        return TERSE_OK;
    }
    if (f == F_FRAME && type == TERSE__STORE_REFUSE && n >= 1) {
        int reason = b[0];
        if (reason == TERSE__STORE_REFUSE_AUTH)
            return TERSE_ERROR(TERSE_ERR_AUTH,
                               "the bootstrap store at %s refused rank %d: wrong token "
                               "(TERSE_TOKEN differs from rank 0's)",
                               s->addr, s->rank);
        return TERSE_ERROR(TERSE_ERR_INVALID, "the bootstrap store at %s refused rank %d: %.*s",
                           s->addr, s->rank, (int)(n - 1 > 120 ? 120 : n - 1),
                           (const char *)b + 1);
    }
    if (f != F_FRAME || type != TERSE__STORE_WELCOME || n != TERSE__STORE_MAC)
        return TERSE_ERROR(TERSE_ERR_CORRUPT,
                           "the server at %s answered rank %d's handshake with a malformed frame",
                           s->addr, s->rank);
    TERSE_CHECK(terse__store_server_mac(token, cnonce, snonce, wire_rank, mac));
    int good = terse__store_mac_equal(mac, b);
    OPENSSL_cleanse(mac, sizeof mac);
    terse__store_rx_consume(&s->rx);
    if (!good)
        return TERSE_ERROR(TERSE_ERR_AUTH,
                           "the server at %s could not prove it knows the job token; rank %d "
                           "refuses to use it (another job's store or an impostor on that port?)",
                           s->addr, s->rank);
    /* Every later frame, both ways, is tagged (store_wire.h). */
    uint8_t c2s[32], s2c[32];
    TERSE_CHECK(terse__store_session_keys(token, snonce, cnonce, wire_rank, c2s, s2c));
    terse__store_tx_key(&s->tx, c2s);
    terse__store_rx_key(&s->rx, s2c, 0);
    OPENSSL_cleanse(c2s, sizeof c2s);
    OPENSSL_cleanse(s2c, sizeof s2c);
    return TERSE_OK;
}

/* Connect and authenticate, retrying with backoff until the deadline:
 * rank 0 may start its server after the others start knocking. */
static terse_status join(terse__store *s, const char *token) {
    uint64_t deadline = terse__store_now_ms() + (uint64_t)s->timeout_ms;
    unsigned backoff = 10;
    char why[160] = "nobody answered";
    for (;;) {
        int connected = 0;
        TERSE_CHECK(terse__store_connect(s->addr, deadline, &s->fd, &connected, why, sizeof why));
        if (connected) {
            int retry = 0;
            terse_status st = handshake(s, token, deadline, &retry, why, sizeof why);
            if (st == TERSE_OK && !retry) return TERSE_OK;
            /* Refused, or refusing: hang up without another word (no BYE). */
            terse__store_close_fd(s->fd);
            s->fd = -1;
            if (st != TERSE_OK) return st;
        }
        uint64_t now = terse__store_now_ms();
        if (now >= deadline)
            return TERSE_ERROR(TERSE_ERR_TIMEOUT,
                               "rank %d could not join the bootstrap store at %s within %d ms "
                               "(last attempt: %s)",
                               s->rank, s->addr, s->timeout_ms, why);
        uint64_t wait = deadline - now < backoff ? deadline - now : backoff;
        struct timespec ts = {(time_t)(wait / 1000), (long)(wait % 1000) * 1000000L};
        nanosleep(&ts, NULL);
        backoff = backoff * 2 > 500 ? 500 : backoff * 2;
    }
}

terse_status terse__store_open(const char *addr, int rank, int nranks, const char *token,
                               int timeout_ms, terse__store **out) {
    return terse__store_open_ex(addr, rank, nranks, token, timeout_ms, 0, out);
}

terse_status terse__store_open_ex(const char *addr, int rank, int nranks, const char *token,
                                  int timeout_ms, int rejoin, terse__store **out) {
    if (!out) return TERSE_ERROR(TERSE_ERR_INVALID, "terse__store_open: out is NULL");
    *out = NULL;
    if (!addr || strlen(addr) >= 256)
        return TERSE_ERROR(TERSE_ERR_INVALID, "the store address is missing or too long");
    if (nranks < 1 || nranks > TERSE__STORE_MAX_RANKS || rank < 0 || rank >= nranks)
        return TERSE_ERROR(TERSE_ERR_INVALID, "rank %d of %d is not a valid place in a job",
                           rank, nranks);
    if (!token || !*token || strlen(token) > TERSE__STORE_MAX_TOKEN)
        return TERSE_ERROR(TERSE_ERR_INVALID, "the job token must be 1 to %d bytes long",
                           TERSE__STORE_MAX_TOKEN);
    if (timeout_ms <= 0)
        return TERSE_ERROR(TERSE_ERR_INVALID, "store timeout %d ms is not positive", timeout_ms);
    char host[256];
    unsigned port;
    TERSE_CHECK(terse__store_split_addr(addr, "the store address", host, sizeof host, &port));

    if (rejoin && rank == 0)
        return TERSE_ERROR(TERSE_ERR_INVALID,
                           "rank 0 cannot rejoin: it holds the bootstrap store, which ended "
                           "with it");
    terse_status st;
    terse__store *s = calloc(1, sizeof *s);
    if (!s) return TERSE_ERROR(TERSE_ERR_NOMEM, "cannot allocate the store client");
    s->fd = -1;
    s->failed_rank = -1;
    s->rank = rank;
    s->nranks = nranks;
    s->timeout_ms = timeout_ms;
    s->lost_rank = -1;
    s->rejoin = rejoin;
    s->lost_map = calloc((size_t)(nranks > 0 ? nranks : 1), 1);
    s->gone_map = calloc((size_t)(nranks > 0 ? nranks : 1), 1);
    s->wgone_gen = calloc(2 * (size_t)(nranks > 0 ? nranks : 1), sizeof *s->wgone_gen);
    s->incarnation = calloc((size_t)(nranks > 0 ? nranks : 1), sizeof *s->incarnation);
    if (!s->lost_map || !s->gone_map || !s->wgone_gen || !s->incarnation) {
        free(s->lost_map);
        free(s->gone_map);
        free(s->wgone_gen);
        free(s->incarnation);
        free(s);
        return TERSE_ERROR(TERSE_ERR_NOMEM, "cannot allocate the store client");
    }
    for (int r = 0; r < nranks; r++) s->incarnation[r] = 1;
    s->next_id = 1;
    s->fork_gen = terse__store_fork_gen();
    snprintf(s->addr, sizeof s->addr, "%s", addr);
    TERSE_CHECK_GOTO(terse__store_rx_init(&s->rx, TERSE__STORE_MAX_BODY), st, fail);
    /* Rank 0 lingers at close for up to the timeout, so that no rank loses
     * the store while it is still reading the last allgather. */
    if (rank == 0)
        TERSE_CHECK_GOTO(terse__store_server_start(addr, nranks, token, timeout_ms, &s->server),
                         st, fail);
    TERSE_CHECK_GOTO(join(s, token), st, fail);
    *out = s;
    return TERSE_OK;
fail:
    terse__store_abandon(s);
    return st;
}

/* In a forked child: the fds are already closed (and their numbers may be
 * reused), and the server is the parent's: touch neither, send nothing. The
 * server's memory stays allocated in the child; its state may have been
 * mid-update on the thread that the child does not have. */
static void free_client(terse__store *s) {
    terse__store_rx_free(&s->rx);
    terse__store_tx_free(&s->tx);
    while (s->backs) {
        terse__store_back *n = s->backs->next;
        free(s->backs);
        s->backs = n;
    }
    free(s->lost_map);
    free(s->gone_map);
    free(s->wgone_gen);
    free(s->incarnation);
    free(s);
}

static void leave_forked(terse__store *s) { free_client(s); }

static void leave(terse__store *s, int orderly) {
    if (!s) return;
    if (forked(s)) {
        leave_forked(s);
        return;
    }
    if (orderly && s->fd >= 0 && !s->gone) {
        /* Say goodbye, half-close, and wait briefly for the server to close
         * its end: then the BYE has certainly been read, and our close
         * cannot turn into a reset that loses it. */
        uint64_t deadline = terse__store_now_ms() + (s->timeout_ms < 2000 ? s->timeout_ms : 2000);
        if (terse__store_tx_frame(&s->tx, TERSE__STORE_BYE, NULL, 0, NULL, 0, NULL, 0) ==
            TERSE_OK) {
            while (terse__store_tx_pending(&s->tx) && terse__store_tx_flush(&s->tx, s->fd) == 0 &&
                   terse__store_wait_fd(s->fd, POLLOUT, deadline) > 0) {}
            shutdown(s->fd, SHUT_WR);
            for (;;) {
                s->rx.len = 0; /* whatever is still arriving no longer matters */
                long r = terse__store_rx_read(&s->rx, s->fd);
                if (r == 0 || r == -2) break;
                if (r == -1 && terse__store_wait_fd(s->fd, POLLIN, deadline) <= 0) break;
            }
        }
    }
    if (!orderly) terse__store_server_owner_leaving(s->server);
    terse__store_close_fd(s->fd);
    /* Rank 0 that told the others why it failed: its server stays until
     * they have the notice (2 s at most), not a moment less. */
    terse__store_server_stop(s->server, orderly ? 0 : s->told_failed ? 2 : 1);
    free_client(s);
}

static terse_status poll_notices(terse__store *s);

static terse_status impl_poll_lost(terse__store *s, const uint8_t **map) {
    if (map) *map = s ? s->lost_map : NULL;
    return poll_notices(s);
}

static terse_status impl_poll_gone(terse__store *s, const uint8_t **map) {
    if (map) *map = s ? s->gone_map : NULL;
    return poll_notices(s);
}

static terse_status poll_notices(terse__store *s) {
    if (!s) return TERSE_OK;
    if (forked(s)) return fail_forked(s);
    while (!s->gone) {
        uint8_t type = 0;
        const uint8_t *b = NULL;
        size_t len = 0;
        int f = next_frame(s, 0, &type, &b, &len);
        if (f == F_TIMEOUT) break;
        if (f == F_EOF) mark_gone(s, "the connection was closed");
        if (f == F_ERROR) mark_gone(s, strerror(errno));
        if (f == F_OVERSIZED) mark_gone(s, "it sent an oversized frame");
        if (f == F_FORGED) mark_gone(s, "a frame from it failed authentication");
        if (f != F_FRAME) break;
        (void)take_notice(s, type, b, len);
        terse__store_rx_consume(&s->rx); /* or replies to requests that timed out */
    }
    if (s->gone)
        return TERSE_ERROR(TERSE_ERR_PEER_LOST,
                           "rank %d lost the bootstrap store at %s (rank 0): %s", s->rank,
                           s->addr, s->gone_why);
    return TERSE_OK;
}

void terse__store_close(terse__store *s) { leave(s, 1); }
void terse__store_abandon(terse__store *s) { leave(s, 0); }

/* ---- keys ---- */

static terse_status check_key(const terse__store *s, const char *key) {
    if (!s) return TERSE_ERROR(TERSE_ERR_INVALID, "the store is NULL");
    if (forked(s)) return fail_forked(s);
    if (!key || !*key || strlen(key) > TERSE__STORE_MAX_KEY)
        return TERSE_ERROR(TERSE_ERR_INVALID, "a store key must be 1 to %d bytes long",
                           TERSE__STORE_MAX_KEY);
    return TERSE_OK;
}

/* Send a SET or GET of key (with an optional value) and return its id. */
static terse_status request(terse__store *s, uint8_t type, const char *key, const void *val,
                            size_t len, uint64_t deadline, uint32_t *id) {
    uint8_t hdr[6];
    size_t klen = strlen(key);
    *id = s->next_id++;
    terse__put_u32(hdr, *id);
    terse__put_u16(hdr + 4, (uint16_t)klen);
    return send_frame(s, type, hdr, sizeof hdr, key, klen, val, len, deadline);
}

static terse_status impl_set(terse__store *s, const char *key, const void *val, size_t len) {
    TERSE_CHECK(check_key(s, key));
    if (len > TERSE__STORE_MAX_VALUE || (len && !val))
        return TERSE_ERROR(TERSE_ERR_INVALID,
                           "the value for store key '%s' is %zu bytes%s; at most %d are allowed",
                           key, len, len && !val ? " at NULL" : "", TERSE__STORE_MAX_VALUE);
    uint64_t deadline = terse__store_now_ms() + (uint64_t)s->timeout_ms;
    uint32_t id;
    const uint8_t *b;
    size_t n;
    if (sticky(s)) return fail_lost(s);
    TERSE_CHECK(request(s, TERSE__STORE_SET, key, val, len, deadline, &id));
    terse_status st = await(s, id, TERSE__STORE_OK, deadline, &b, &n);
    if (st == TERSE_ERR_TIMEOUT)
        return TERSE_ERROR(TERSE_ERR_TIMEOUT,
                           "rank %d: the bootstrap store at %s did not confirm key '%s' within "
                           "%d ms",
                           s->rank, s->addr, key, s->timeout_ms);
    if (st != TERSE_OK) return st;
    terse__store_rx_consume(&s->rx);
    return TERSE_OK;
}

static terse_status impl_get(terse__store *s, const char *key, void *val, size_t *len,
                              int timeout_ms) {
    TERSE_CHECK(check_key(s, key));
    if (!len || (*len && !val))
        return TERSE_ERROR(TERSE_ERR_INVALID, "no buffer for the value of store key '%s'", key);
    if (timeout_ms <= 0) timeout_ms = s->timeout_ms;
    uint64_t deadline = terse__store_now_ms() + (uint64_t)timeout_ms;
    uint32_t id;
    const uint8_t *b;
    size_t n;
    if (sticky(s)) return fail_lost(s);
    TERSE_CHECK(request(s, TERSE__STORE_GET, key, NULL, 0, deadline, &id));
    terse_status st = await(s, id, TERSE__STORE_VALUE, deadline, &b, &n);
    if (st == TERSE_ERR_TIMEOUT)
        return TERSE_ERROR(TERSE_ERR_TIMEOUT,
                           "rank %d waited %d ms for key '%s' in the bootstrap store at %s, "
                           "and no rank set it",
                           s->rank, timeout_ms, key, s->addr);
    if (st != TERSE_OK) return st;
    size_t cap = *len;
    *len = n;
    if (n > cap) {
        terse__store_rx_consume(&s->rx);
        return TERSE_ERROR(TERSE_ERR_DST_TOO_SMALL,
                           "store key '%s' holds %zu bytes but the buffer has room for %zu", key,
                           n, cap);
    }
    if (n) memcpy(val, b, n);
    terse__store_rx_consume(&s->rx);
    return TERSE_OK;
}

static terse_status impl_allgather(terse__store *s, const void *mine, size_t len, void *all,
                                    int timeout_ms) {
    if (!s) return TERSE_ERROR(TERSE_ERR_INVALID, "the store is NULL");
    if (forked(s)) return fail_forked(s);
    if (len > TERSE__STORE_MAX_VALUE || (len && (!mine || !all)))
        return TERSE_ERROR(TERSE_ERR_INVALID,
                           "store allgather of %zu bytes per rank (at most %d, buffers non-NULL)",
                           len, TERSE__STORE_MAX_VALUE);
    if (timeout_ms <= 0) timeout_ms = s->timeout_ms;
    uint64_t deadline = terse__store_now_ms() + (uint64_t)timeout_ms;
    /* Every rank calls allgather in the same order, so the sequence number
     * names the same round on every rank and rounds never mix. */
    unsigned seq = ++s->ag_seq;
    char key[48];
    snprintf(key, sizeof key, "ag/%u/%d", seq, s->rank);
    TERSE_CHECK(impl_set(s, key, mine, len));
    for (int r = 0; r < s->nranks; r++) {
        snprintf(key, sizeof key, "ag/%u/%d", seq, r);
        uint64_t now = terse__store_now_ms();
        int left = now >= deadline ? 1 : (int)(deadline - now);
        size_t got = len;
        terse_status st =
            impl_get(s, key, (uint8_t *)all + (size_t)r * len, &got, left);
        /* The first round is terse_comm_init's: a rank missing from it is
         * one that never got that far. */
        if (st == TERSE_ERR_TIMEOUT && seq == 1)
            return TERSE_ERROR(TERSE_ERR_TIMEOUT,
                               "rank %d of %d never joined the job at %s: rank %d waited %d ms "
                               "for it in terse_comm_init's first exchange (not started, started "
                               "with another TERSE_ADDR, TERSE_SIZE or TERSE_TOKEN, or died "
                               "before; store allgather #1, key '%s')",
                               r, s->nranks, s->addr, s->rank, timeout_ms, key);
        if (st == TERSE_ERR_TIMEOUT)
            return TERSE_ERROR(TERSE_ERR_TIMEOUT,
                               "rank %d waited %d ms in store allgather #%u for rank %d's "
                               "contribution (key '%s' at %s)",
                               s->rank, timeout_ms, seq, r, key, s->addr);
        if (st == TERSE_ERR_DST_TOO_SMALL || (st == TERSE_OK && got != len))
            return TERSE_ERROR(TERSE_ERR_INVALID,
                               "store allgather #%u: rank %d contributed %zu bytes but rank %d "
                               "expected %zu",
                               seq, r, got, s->rank, len);
        if (st != TERSE_OK) return st;
    }
    return TERSE_OK;
}

static terse_status impl_check(void *store) {
    terse__store *s = store;
    if (!s) return TERSE_ERROR(TERSE_ERR_INVALID, "terse__store_check: the store is NULL");
    if (forked(s)) return fail_forked(s);
    const uint8_t *b;
    size_t n;
    /* Deadline 0: take in only what has already arrived, never wait. */
    terse_status st = await(s, 0, 0, 0, &b, &n);
    /* A rank that said why it failed: its reason, also once it or any
     * other rank has left. The notice is the first cause: the ranks that
     * heard it give up and leave without a goodbye (as a failed rank
     * does), and a rank still in its call may see one of them vanish
     * before it reads the notice that preceded the loss on this socket. */
    if (s->failed_rank >= 0 && (st == TERSE_OK || st == TERSE_ERR_PEER_LOST))
        return TERSE_ERROR(s->failed_status, "rank %d failed its call and told the job why: %s",
                           s->failed_rank, s->failed_why);
    return st;
}

static terse_status impl_tell_failed(terse__store *s, terse_status status, const char *why) {
    if (!s || forked(s) || s->gone) return TERSE_OK; /* nobody to tell */
    uint8_t st[4];
    terse__put_u32(st, (uint32_t)status);
    size_t len = strlen(why);
    if (len > TERSE__STORE_MAX_FAILED) len = TERSE__STORE_MAX_FAILED;
    uint64_t budget = (uint64_t)(s->timeout_ms < 1000 ? s->timeout_ms : 1000);
    s->told_failed = 1;
    return send_frame(s, TERSE__STORE_FAILED, st, 4, why, len, NULL, 0,
                      terse__store_now_ms() + budget);
}

/* WGONE carries 4 gen + mask: mask 0, the worker of pair gen gave up;
 * else the endpoints of pair gen closed so far (1: the server's, 2: the
 * worker's; each close adds its bit, so the values a rank sends only
 * grow, as the server requires). */
static terse_status impl_tell_wgone(terse__store *s, uint32_t gen, uint32_t mask) {
    if (!s || forked(s) || s->gone || gen > UINT32_MAX / 4) return TERSE_OK; /* nobody to tell */
    if (mask && s->told_wgone >> 2 == gen) mask |= s->told_wgone & 3;
    const uint32_t v = 4 * gen + mask;
    if (v <= s->told_wgone) return TERSE_OK; /* told already */
    uint64_t budget = (uint64_t)(s->timeout_ms < 1000 ? s->timeout_ms : 1000);
    uint8_t g[4];
    terse__put_u32(g, v);
    s->told_wgone = v;
    return send_frame(s, TERSE__STORE_WGONE, g, 4, NULL, 0, NULL, 0,
                      terse__store_now_ms() + budget);
}

terse_status terse__store_announce_back(terse__store *s, const void *blob, size_t len) {
    if (!s || !s->rejoin || !blob || !len || len > TERSE__STORE_MAX_BACK)
        return TERSE_ERROR(TERSE_ERR_INVALID, "store BACK: only a replacement announces itself, "
                                              "with 1 to %d bytes", TERSE__STORE_MAX_BACK);
    if (forked(s)) return fail_forked(s);
    if (s->gone) return fail_lost(s);
    return send_frame(s, TERSE__STORE_BACK, blob, len, NULL, 0, NULL, 0,
                      terse__store_now_ms() + (uint64_t)s->timeout_ms);
}

static terse__store_back *impl_take_back(terse__store *s) {
    if (!s || !s->backs) return NULL;
    terse__store_back *n = s->backs;
    s->backs = n->next;
    n->next = NULL;
    return n;
}

static void impl_mark_lost(terse__store *s, int rank) {
    if (!s || rank < 0 || rank >= s->nranks) return;
    s->lost_map[rank] = s->gone_map[rank] = 1;
    if (s->lost_rank < 0) s->lost_rank = rank;
}

uint32_t terse__store_incarnation(const terse__store *s, int rank) {
    return s && rank >= 0 && rank < s->nranks ? s->incarnation[rank] : 0;
}

/* ---- one thread at a time ----
 * A colocated parameter server (algos/engine/engine_twin.c) drives three
 * communicators on one store from up to three threads: every entry point
 * that reads or writes the client's state holds this lock. One lock for
 * every store of the process: they are few, and the calls made while a
 * job runs are short (allgather, the one that waits, is made at init). A
 * forked child, whose copy of the lock may be held, takes no lock: its
 * calls fail at once as forked. */
static pthread_mutex_t store_mu = PTHREAD_MUTEX_INITIALIZER;
static int lock_store(const terse__store *s) {
    if (s && forked(s)) return 0;
    pthread_mutex_lock(&store_mu);
    return 1;
}
static void unlock_store(int held) {
    if (held) pthread_mutex_unlock(&store_mu);
}

terse_status terse__store_poll_lost(terse__store *s, const uint8_t **map) {
    int h = lock_store(s);
    terse_status r = impl_poll_lost(s, map);
    unlock_store(h);
    return r;
}
terse_status terse__store_poll_gone(terse__store *s, const uint8_t **map) {
    int h = lock_store(s);
    terse_status r = impl_poll_gone(s, map);
    unlock_store(h);
    return r;
}
terse_status terse__store_copy_map(terse__store *s, int gone, uint8_t *out) {
    int h = lock_store(s);
    const uint8_t *m = NULL;
    terse_status r = gone ? impl_poll_gone(s, &m) : impl_poll_lost(s, &m);
    if (m) memcpy(out, m, (size_t)s->nranks);
    else if (s) memset(out, 0, (size_t)s->nranks);
    unlock_store(h);
    return r;
}
terse_status terse__store_set(terse__store *s, const char *key, const void *val, size_t len) {
    int h = lock_store(s);
    terse_status r = impl_set(s, key, val, len);
    unlock_store(h);
    return r;
}
terse_status terse__store_get(terse__store *s, const char *key, void *val, size_t *len,
                              int timeout_ms) {
    int h = lock_store(s);
    terse_status r = impl_get(s, key, val, len, timeout_ms);
    unlock_store(h);
    return r;
}
terse_status terse__store_allgather(terse__store *s, const void *mine, size_t len, void *all,
                                    int timeout_ms) {
    int h = lock_store(s);
    terse_status r = impl_allgather(s, mine, len, all, timeout_ms);
    unlock_store(h);
    return r;
}
terse_status terse__store_check(void *store) {
    int h = lock_store(store);
    terse_status r = impl_check(store);
    unlock_store(h);
    return r;
}
terse__store_back *terse__store_take_back(terse__store *s) {
    int h = lock_store(s);
    terse__store_back *r = impl_take_back(s);
    unlock_store(h);
    return r;
}
void terse__store_mark_lost(terse__store *s, int rank) {
    int h = lock_store(s);
    impl_mark_lost(s, rank);
    unlock_store(h);
}
terse_status terse__store_tell_worker_gone(terse__store *s, uint32_t gen) {
    int h = lock_store(s);
    terse_status r = impl_tell_wgone(s, gen, 0);
    unlock_store(h);
    return r;
}
terse_status terse__store_tell_endpoint_closed(terse__store *s, uint32_t gen, int worker) {
    int h = lock_store(s);
    terse_status r = impl_tell_wgone(s, gen, worker ? 2u : 1u);
    unlock_store(h);
    return r;
}
terse_status terse__store_copy_wgone(terse__store *s, uint32_t gen, uint8_t *out) {
    int h = lock_store(s);
    terse_status r = poll_notices(s);
    for (int i = 0; s && i < s->nranks; i++) {
        const uint32_t closed = s->wgone_gen[s->nranks + i];
        out[i] = (uint8_t)((s->wgone_gen[i] == gen ? 1u : 0u) |
                           (closed >> 2 == gen ? (closed & 3u) << 1 : 0u));
    }
    unlock_store(h);
    return r;
}
terse_status terse__store_tell_failed(terse__store *s, terse_status status, const char *why) {
    int h = lock_store(s);
    terse_status r = impl_tell_failed(s, status, why);
    unlock_store(h);
    return r;
}
