/* The bootstrap store's server: one thread inside rank 0 that serves every
 * connection with poll() and never blocks on any one of them.
 *
 * Each connection moves through two states. Unauthenticated, it may send
 * exactly one small AUTH frame within TERSE__STORE_HANDSHAKE_MS; anything
 * else (garbage, a wrong HMAC, an oversized length, silence) gets it dropped
 * and logged to stderr with its address and the reason. Authenticated, it
 * is a rank: it may SET and GET keys (a GET of a missing key is parked on
 * the key and answered by the SET that creates it) and says BYE before it
 * leaves. A rank whose connection ends without BYE is lost, and every other
 * rank is told so with a LOST frame; one that said BYE, with a LEFT frame.
 *
 * Every fd (listener, connections, wake pipe) is made and closed through
 * store_fork.c, so a child forked from rank 0 closes them all at once and
 * keeps none of the job's connections alive; the child never runs or
 * touches this server (the thread does not exist there). */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/crypto.h>

#include "common/bytes.h"
#include "common/error.h"
#include "transport/store_table.h"
#include "transport/store_wire.h"

enum { J_NEVER, J_IN, J_LEFT, J_LOST };

enum {
    TERSE__STORE_HANDSHAKE_MS = 2000, /* a legitimate client answers HELLO at once */
    MAX_PENDING = 128,                /* unauthenticated connections at one time */
    MAX_QUEUED = 8 << 20,             /* bytes queued for a rank that does not read */
    ACCEPT_REST_MS = 100,             /* the listener's rest after a failed accept */
    NOISE_BURST = 20,                 /* noise lines logged before rate limiting */
    NOISE_PERIOD_MS = 1000,           /* then one summary line per period */
};

typedef struct conn {
    int fd; /* -1: free slot */
    uint64_t gen;
    char peer[64];
    int authed, rank, said_bye;
    int rejoined, announced; /* a replacement; it sent its BACK */
    int failed; /* it sent a FAILED notice (relayed); its leaving is no news */
    uint32_t wgone_gen; /* the last WGONE value it sent (relayed; 4 gen + mask), 0: none */
    int loud; /* its drop is always logged (a failed authentication, a refusal) */
    uint64_t hs_deadline;
    uint8_t snonce[TERSE__STORE_NONCE];
    terse__store_rx rx;
    terse__store_tx tx;
} conn;

struct terse__store_server {
    int lfd, wake[2];
    _Atomic int owner_leaving; /* rank 0, this process, leaves without a goodbye */
    pthread_t thread;
    int nranks, linger_ms;
    char token[TERSE__STORE_MAX_TOKEN + 1];
    char addr[256];
    conn *c;
    size_t nslots, npending, nauthed;
    uint64_t next_gen;
    /* joined[rank]: J_NEVER, J_IN (connected), J_LEFT (said BYE) or J_LOST.
     * A rank joins once; a lost one may join again as its replacement
     * (TERSE_REJOIN), once per loss. incarnation[rank] counts its joins. */
    uint8_t *joined;
    uint32_t *incarnation;
    terse__store_table table;
    unsigned noise_logged;      /* noise lines printed so far */
    unsigned long noise_held;   /* noise events not printed since the last summary */
    uint64_t noise_since_ms;    /* start of the current summary period */
    struct pollfd *pfd;
    size_t *pslot;
    size_t pcap;
    int at_limit;           /* accept failed for want of descriptors; not since */
    uint64_t rest_until_ms; /* the listener is not polled until then */
};

/* Two kinds of log line. Events that matter -- a rank lost, a failed
 * authentication, a refusal, the store stopping -- are always printed.
 * Noise from connections that never authenticate (silent, garbage,
 * evicted) is printed NOISE_BURST times, then summarised with a count once
 * per NOISE_PERIOD_MS, so that a flood can neither fill stderr nor hide a
 * rank loss behind a "stopped logging" line. */
static void vlog(terse__store_server *s, const char *fmt, va_list ap) {
    char msg[384];
    vsnprintf(msg, sizeof msg, fmt, ap);
    fprintf(stderr, "terse store %s: %s\n", s->addr, msg);
}

static void slog(terse__store_server *s, const char *fmt, ...) TERSE__PRINTF(2, 3);
static void slog(terse__store_server *s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vlog(s, fmt, ap);
    va_end(ap);
}

static void noise_flush(terse__store_server *s, uint64_t now) {
    if (s->noise_held && now - s->noise_since_ms >= NOISE_PERIOD_MS) {
        fprintf(stderr, "terse store %s: %lu more unauthenticated connections dropped in the "
                        "last %.1f s (not logged one by one)\n",
                s->addr, s->noise_held, (double)(now - s->noise_since_ms) / 1e3);
        s->noise_held = 0;
    }
    if (!s->noise_held) s->noise_since_ms = now;
}

static void snoise(terse__store_server *s, const char *fmt, ...) TERSE__PRINTF(2, 3);
static void snoise(terse__store_server *s, const char *fmt, ...) {
    uint64_t now = terse__store_now_ms();
    if (s->noise_logged < NOISE_BURST) {
        s->noise_logged++;
        s->noise_since_ms = now;
        va_list ap;
        va_start(ap, fmt);
        vlog(s, fmt, ap);
        va_end(ap);
        return;
    }
    s->noise_held++;
    noise_flush(s, now);
}

/* ---- connections ---- */

static void drop(terse__store_server *s, size_t slot, const char *fmt, ...) TERSE__PRINTF(3, 4);

/* Queue a frame for slot; a connection whose queue cannot grow is dropped. */
static void queue(terse__store_server *s, size_t slot, uint8_t type, const void *a, size_t alen,
                  const void *b, size_t blen) {
    conn *c = &s->c[slot];
    if (terse__store_tx_frame(&c->tx, type, a, alen, b, blen, NULL, 0) != TERSE_OK)
        drop(s, slot, "out of memory queueing a reply");
    else if (terse__store_tx_pending(&c->tx) > MAX_QUEUED)
        drop(s, slot, "has %zu bytes of replies queued and is not reading them",
             terse__store_tx_pending(&c->tx));
}

/* Close slot. fmt (NULL for an orderly leave) is the reason logged. An
 * authenticated rank that leaves is announced to the others: LOST without
 * BYE, LEFT with it. */
static void drop(terse__store_server *s, size_t slot, const char *fmt, ...) {
    conn *c = &s->c[slot];
    if (c->fd < 0) return;
    char why[256] = "";
    if (fmt) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why, sizeof why, fmt, ap);
        va_end(ap);
    }
    int lost = c->authed && !c->said_bye;
    if (lost && c->rank == 0 && atomic_load(&s->owner_leaving))
        ; /* rank 0 is this process, leaving after a failure of its own: not news */
    else if (lost && c->failed)
        slog(s, "rank %d (%s) left after its failure (above)", c->rank, c->peer);
    else if (lost)
        slog(s, "rank %d (%s) lost: %s; telling the other ranks", c->rank, c->peer,
             fmt ? why : "connection closed without goodbye");
    else if (fmt && (c->authed || c->loud))
        slog(s, "dropped %s%s: %s", c->peer, c->authed ? "" : " (unauthenticated)", why);
    else if (fmt)
        snoise(s, "dropped %s (unauthenticated): %s", c->peer, why);
    /* One last non-blocking try, so a REFUSE reaches the client. */
    (void)terse__store_tx_flush(&c->tx, c->fd);
    terse__store_close_fd(c->fd);
    c->fd = -1;
    terse__store_rx_free(&c->rx);
    terse__store_tx_free(&c->tx);
    if (c->authed) {
        s->nauthed--;
        s->joined[c->rank] = lost ? J_LOST : J_LEFT;
    } else {
        s->npending--;
    }
    if (!c->authed) return;
    /* Lost, or left with a goodbye: either way it reads nothing more, which
     * a rank flushing its last messages at close needs to know (the flush
     * would otherwise wait its whole budget for a reader that is gone). */
    uint8_t r[4];
    terse__put_u32(r, (uint32_t)c->rank);
    for (size_t i = 0; i < s->nslots; i++)
        if (s->c[i].fd >= 0 && s->c[i].authed)
            queue(s, i, lost ? TERSE__STORE_LOST : TERSE__STORE_LEFT, r, 4, NULL, 0);
}

static void refuse(terse__store_server *s, size_t slot, uint8_t reason, const char *text) {
    conn *c = &s->c[slot];
    (void)terse__store_tx_frame(&c->tx, TERSE__STORE_REFUSE, &reason, 1, text, strlen(text),
                                NULL, 0);
}

/* Evict the oldest unauthenticated connection rather than refuse the
 * newest: a legitimate rank answers HELLO within a round trip, so to
 * starve it an attacker would have to open MAX_PENDING connections inside
 * that round trip, again and again, instead of merely holding MAX_PENDING
 * silent ones. 1 if there was one. */
static int evict_oldest(terse__store_server *s, const char *why) {
    size_t oldest = s->nslots;
    for (size_t i = 0; i < s->nslots; i++)
        if (s->c[i].fd >= 0 && !s->c[i].authed &&
            (oldest == s->nslots || s->c[i].gen < s->c[oldest].gen))
            oldest = i;
    if (oldest == s->nslots) return 0;
    drop(s, oldest, why, s->npending);
    return 1;
}

static void accept_one(terse__store_server *s, int fd) {
    char peer[64];
    terse__store_peer_name(fd, peer, sizeof peer);
    if (s->npending >= MAX_PENDING)
        evict_oldest(s, "evicted: the oldest of %zu unauthenticated connections");
    size_t slot = 0;
    while (slot < s->nslots && s->c[slot].fd >= 0) slot++;
    if (slot == s->nslots) {
        conn *p = realloc(s->c, (s->nslots + 1) * sizeof *p);
        if (!p) {
            slog(s, "dropped %s: out of memory", peer);
            terse__store_close_fd(fd);
            return;
        }
        s->c = p;
        s->c[s->nslots++].fd = -1;
    }
    conn *c = &s->c[slot];
    memset(c, 0, sizeof *c);
    c->fd = fd;
    c->gen = ++s->next_gen;
    c->rank = -1;
    snprintf(c->peer, sizeof c->peer, "%s", peer);
    c->hs_deadline = terse__store_now_ms() + TERSE__STORE_HANDSHAKE_MS;
    s->npending++;
    int one = 1;
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    /* Until it authenticates, a connection can make us buffer one AUTH
     * frame and nothing more. */
    if (terse__store_rx_init(&c->rx, TERSE__STORE_AUTH_BODY) != TERSE_OK ||
        terse__store_nonce(c->snonce) != TERSE_OK) {
        drop(s, slot, "out of memory or randomness");
        return;
    }
    queue(s, slot, TERSE__STORE_HELLO, c->snonce, TERSE__STORE_NONCE, NULL, 0);
}

/* ---- the handshake ---- */

static void handle_auth(terse__store_server *s, size_t slot, uint8_t type, const uint8_t *b,
                        size_t n) {
    conn *c = &s->c[slot];
    if (type != TERSE__STORE_AUTH || n != TERSE__STORE_AUTH_BODY) {
        drop(s, slot, "sent frame type %u of %zu bytes instead of AUTH", type, n);
        return;
    }
    /* The rank field's top bit asks to rejoin as a lost rank's
     * replacement; the proofs and keys cover the field as sent. */
    uint32_t wire_rank = terse__get_u32(b), nranks = terse__get_u32(b + 4);
    uint32_t rank = wire_rank & ~TERSE__STORE_REJOIN_BIT;
    int rejoin = (wire_rank & TERSE__STORE_REJOIN_BIT) != 0;
    /* A copy: growing the receive buffer below may move the frame. */
    uint8_t cnonce[TERSE__STORE_NONCE];
    memcpy(cnonce, b + 8, sizeof cnonce);
    const uint8_t *mac = b + 8 + TERSE__STORE_NONCE;
    uint8_t want[TERSE__STORE_MAC];
    if (terse__store_client_mac(s->token, c->snonce, wire_rank, want) != TERSE_OK) {
        drop(s, slot, "HMAC computation failed");
        return;
    }
    /* Check the proof first: an unauthenticated peer learns nothing about
     * the job (its size, which ranks joined) from our answer. */
    int good = terse__store_mac_equal(mac, want);
    OPENSSL_cleanse(want, sizeof want);
    if (!good) {
        c->loud = 1;
        refuse(s, slot, TERSE__STORE_REFUSE_AUTH, "wrong token");
        drop(s, slot, "failed authentication claiming rank %u (wrong token)", rank);
        return;
    }
    char text[128];
    if (rank >= (uint32_t)s->nranks || nranks != (uint32_t)s->nranks) {
        snprintf(text, sizeof text, "rank %u of %u does not fit this job of %d ranks", rank,
                 nranks, s->nranks);
        c->loud = 1;
        refuse(s, slot, TERSE__STORE_REFUSE_SHAPE, text);
        drop(s, slot, "refused: %s", text);
        return;
    }
    static const char *const state[] = {"never joined", "is connected", "left with a goodbye",
                                        ""};
    if (rejoin && rank == 0) {
        c->loud = 1;
        refuse(s, slot, TERSE__STORE_REFUSE_DUPLICATE, "rank 0 cannot rejoin: it holds the store");
        drop(s, slot, "refused: a rejoin as rank 0");
        return;
    }
    if (rejoin ? s->joined[rank] != J_LOST : s->joined[rank] != J_NEVER) {
        if (rejoin)
            snprintf(text, sizeof text, "rank %u cannot rejoin: only a lost rank can be "
                     "replaced, and it %s", rank, state[s->joined[rank]]);
        else
            snprintf(text, sizeof text, "rank %u has already joined%s", rank,
                     s->joined[rank] == J_LOST ? " and was lost (a replacement sets "
                                                 "TERSE_REJOIN=1)" : "");
        c->loud = 1;
        refuse(s, slot, TERSE__STORE_REFUSE_DUPLICATE, text);
        drop(s, slot, "refused: %s", text);
        return;
    }
    uint8_t proof[TERSE__STORE_MAC];
    if (terse__store_server_mac(s->token, cnonce, c->snonce, wire_rank, proof) != TERSE_OK ||
        terse__store_rx_grow(&c->rx, TERSE__STORE_MAX_BODY) != TERSE_OK) {
        drop(s, slot, "out of memory or HMAC failure after authentication");
        return;
    }
    uint8_t c2s[32], s2c[32];
    if (terse__store_session_keys(s->token, c->snonce, cnonce, wire_rank, c2s, s2c) != TERSE_OK) {
        drop(s, slot, "HMAC failure deriving the session keys");
        return;
    }
    c->authed = 1;
    c->rank = (int)rank;
    c->rejoined = rejoin;
    s->joined[rank] = J_IN;
    s->incarnation[rank]++;
    s->npending--;
    s->nauthed++;
    if (rejoin)
        slog(s, "rank %u (%s) rejoined as the replacement of the lost rank (incarnation %u)",
             rank, c->peer, s->incarnation[rank]);
    queue(s, slot, TERSE__STORE_WELCOME, proof, sizeof proof, NULL, 0);
    /* Every later frame, both ways, is tagged (store_wire.h). */
    terse__store_tx_key(&c->tx, s2c);
    terse__store_rx_key(&c->rx, c2s, 1);
    OPENSSL_cleanse(c2s, sizeof c2s);
    OPENSSL_cleanse(s2c, sizeof s2c);
    /* A rank that joins after others were lost hears of them too. */
    for (int r = 0; r < s->nranks && s->c[slot].fd >= 0; r++) {
        uint8_t rb[4];
        terse__put_u32(rb, (uint32_t)r);
        if (s->joined[r] == J_LOST) queue(s, slot, TERSE__STORE_LOST, rb, 4, NULL, 0);
        if (s->joined[r] == J_LEFT) queue(s, slot, TERSE__STORE_LEFT, rb, 4, NULL, 0);
    }
}

/* A replacement's BACK: its new endpoint (an opaque blob), relayed to every
 * other rank with its rank and incarnation. Once per connection. */
static void handle_back(terse__store_server *s, size_t slot, const uint8_t *b, size_t n) {
    conn *c = &s->c[slot];
    if (!c->rejoined || c->announced || n == 0 || n > TERSE__STORE_MAX_BACK) {
        drop(s, slot, "rank %d sent a BACK it may not send (%zu bytes; %s)", c->rank, n,
             !c->rejoined ? "it did not rejoin" : c->announced ? "a second one" : "bad length");
        return;
    }
    c->announced = 1;
    uint8_t hdr[8];
    terse__put_u32(hdr, (uint32_t)c->rank);
    terse__put_u32(hdr + 4, s->incarnation[c->rank]);
    for (size_t i = 0; i < s->nslots; i++)
        if (i != slot && s->c[i].fd >= 0 && s->c[i].authed)
            queue(s, i, TERSE__STORE_BACK, hdr, sizeof hdr, b, n);
}

/* A rank's collective failed for a reason the others should hear: relay
 * (rank, status, text) to every other rank, once per connection. */
static void handle_failed(terse__store_server *s, size_t slot, const uint8_t *b, size_t n) {
    conn *c = &s->c[slot];
    if (c->failed || n < 4 || n > 4 + TERSE__STORE_MAX_FAILED) {
        drop(s, slot, "rank %d sent a FAILED it may not send (%zu bytes; %s)", c->rank, n,
             c->failed ? "a second one" : "bad length");
        return;
    }
    c->failed = 1;
    char text[TERSE__STORE_MAX_FAILED + 1]; /* printable only: it goes into logs */
    size_t len = n - 4;
    for (size_t i = 0; i < len; i++) text[i] = b[4 + i] >= 0x20 && b[4 + i] < 0x7f ? (char)b[4 + i] : '?';
    text[len] = 0;
    slog(s, "rank %d (%s) failed its call: %s; telling the other ranks", c->rank, c->peer, text);
    uint8_t hdr[8];
    terse__put_u32(hdr, (uint32_t)c->rank);
    memcpy(hdr + 4, b, 4);
    for (size_t i = 0; i < s->nslots; i++)
        if (i != slot && s->c[i].fd >= 0 && s->c[i].authed)
            queue(s, i, TERSE__STORE_FAILED, hdr, sizeof hdr, text, len);
}

/* A rank's colocated worker gave up unfinished, or its colocated
 * endpoints closed (4 gen + mask, store.c): relay it to every other rank;
 * the values one connection sends only grow. */
static void handle_wgone(terse__store_server *s, size_t slot, const uint8_t *b, size_t n) {
    conn *c = &s->c[slot];
    uint32_t gen = n == 4 ? terse__get_u32(b) : 0;
    if (n != 4 || gen <= c->wgone_gen) {
        drop(s, slot, "rank %d sent a WGONE it may not send (%zu bytes; %s)", c->rank, n,
             n != 4 ? "bad length" : "a generation not above its last");
        return;
    }
    c->wgone_gen = gen;
    if (!(gen & 3)) /* a clean close is not news worth a line */
        slog(s, "rank %d (%s): the worker of its colocated parameter server #%u failed and "
                "stopped; telling the other ranks", c->rank, c->peer, gen >> 2);
    uint8_t hdr[8];
    terse__put_u32(hdr, (uint32_t)c->rank);
    terse__put_u32(hdr + 4, gen);
    for (size_t i = 0; i < s->nslots; i++)
        if (i != slot && s->c[i].fd >= 0 && s->c[i].authed)
            queue(s, i, TERSE__STORE_WGONE, hdr, sizeof hdr, NULL, 0);
}

/* ---- requests from authenticated ranks ---- */

/* Parse "u32 id, u16 klen, key" at the front of a SET or GET body. */
static int parse_key(const uint8_t *b, size_t n, uint32_t *id, const char **key, size_t *klen) {
    if (n < 6) return 0;
    *id = terse__get_u32(b);
    *klen = terse__get_u16(b + 4);
    *key = (const char *)b + 6;
    return *klen >= 1 && *klen <= TERSE__STORE_MAX_KEY && 6 + *klen <= n &&
           !memchr(*key, '\0', *klen);
}

static void handle_set(terse__store_server *s, size_t slot, const uint8_t *b, size_t n) {
    uint32_t id;
    const char *key;
    size_t klen;
    if (!parse_key(b, n, &id, &key, &klen) || n - 6 - klen > TERSE__STORE_MAX_VALUE) {
        drop(s, slot, "rank %d sent a malformed SET", s->c[slot].rank);
        return;
    }
    terse__store_entry *e;
    if (terse__store_table_find(&s->table, key, klen, 1, &e) != TERSE_OK ||
        terse__store_entry_set(e, key + klen, n - 6 - klen) != TERSE_OK) {
        drop(s, slot, "out of memory storing key '%.*s'", (int)klen, key);
        return;
    }
    /* Answer every GET parked on this key whose connection is still the
     * one that asked (same slot and generation). */
    for (size_t i = 0; i < e->nwaiters; i++) {
        terse__store_waiter w = e->waiters[i];
        uint8_t idb[4];
        terse__put_u32(idb, w.req);
        if (w.slot < s->nslots && s->c[w.slot].fd >= 0 && s->c[w.slot].gen == w.gen)
            queue(s, w.slot, TERSE__STORE_VALUE, idb, 4, e->val, e->len);
    }
    e->nwaiters = 0;
    uint8_t idb[4];
    terse__put_u32(idb, id);
    if (s->c[slot].fd >= 0) queue(s, slot, TERSE__STORE_OK, idb, 4, NULL, 0);
}

static void handle_get(terse__store_server *s, size_t slot, const uint8_t *b, size_t n) {
    uint32_t id;
    const char *key;
    size_t klen;
    if (!parse_key(b, n, &id, &key, &klen) || n != 6 + klen) {
        drop(s, slot, "rank %d sent a malformed GET", s->c[slot].rank);
        return;
    }
    terse__store_entry *e;
    if (terse__store_table_find(&s->table, key, klen, 1, &e) != TERSE_OK) {
        drop(s, slot, "out of memory parking a GET of '%.*s'", (int)klen, key);
        return;
    }
    uint8_t idb[4];
    terse__put_u32(idb, id);
    if (e->has_value) {
        queue(s, slot, TERSE__STORE_VALUE, idb, 4, e->val, e->len);
        return;
    }
    terse__store_waiter w = {(uint32_t)slot, id, s->c[slot].gen};
    if (terse__store_entry_park(e, w) != TERSE_OK)
        drop(s, slot, "out of memory parking a GET of '%.*s'", (int)klen, key);
}

static void handle_request(terse__store_server *s, size_t slot, uint8_t type, const uint8_t *b,
                           size_t n) {
    conn *c = &s->c[slot];
    if (type == TERSE__STORE_SET) handle_set(s, slot, b, n);
    else if (type == TERSE__STORE_GET) handle_get(s, slot, b, n);
    else if (type == TERSE__STORE_BYE && n == 0) c->said_bye = 1;
    else if (type == TERSE__STORE_BACK) handle_back(s, slot, b, n);
    else if (type == TERSE__STORE_FAILED) handle_failed(s, slot, b, n);
    else if (type == TERSE__STORE_WGONE) handle_wgone(s, slot, b, n);
    else drop(s, slot, "rank %d sent an unexpected frame type %u (%zu bytes)", c->rank, type, n);
}

/* Read what slot has sent and act on every complete frame. */
static void serve_input(terse__store_server *s, size_t slot) {
    conn *c = &s->c[slot];
    long r = terse__store_rx_read(&c->rx, c->fd);
    if (r == 0) {
        if (c->authed) drop(s, slot, c->said_bye ? NULL : "connection closed without goodbye");
        else drop(s, slot, "closed the connection during the handshake");
        return;
    }
    if (r == -2) {
        drop(s, slot, "socket error: %s", strerror(errno));
        return;
    }
    for (;;) {
        c = &s->c[slot];
        if (c->fd < 0) return;
        size_t max = c->authed ? TERSE__STORE_MAX_BODY : TERSE__STORE_AUTH_BODY;
        uint8_t type = 0;
        const uint8_t *body = NULL;
        size_t n = 0;
        int k = terse__store_rx_peek(&c->rx, max, &type, &body, &n);
        if (k == 0) return;
        if (k == -2) {
            drop(s, slot, "rank %d's frame failed authentication (altered, dropped or inserted "
                          "on the way)", c->rank);
            return;
        }
        if (k < 0) {
            drop(s, slot, "sent an oversized frame (length %zu, limit %zu)", n, max);
            return;
        }
        if (c->authed) handle_request(s, slot, type, body, n);
        else handle_auth(s, slot, type, body, n);
        if (s->c[slot].fd >= 0) terse__store_rx_consume(&s->c[slot].rx);
    }
}

/* ---- the loop ---- */

/* Accept every waiting connection. Out of descriptors (EMFILE, ENFILE),
 * make room by dropping the oldest unauthenticated connection, else refuse
 * the newcomer (accepted on the spare descriptor and closed at once), so
 * that it neither waits unanswered nor makes poll spin on the listener;
 * say so once, and once more when accepting works again. Any other
 * failure, or a refusal that could not be made, rests the listener for
 * ACCEPT_REST_MS. */
static void accept_all(terse__store_server *s) {
    for (unsigned n = 0; n < 4096; n++) {
        int fd = terse__store_accept(s->lfd);
        if (fd >= 0) {
            if (s->at_limit) slog(s, "descriptors are free again: accepting connections");
            s->at_limit = 0;
            accept_one(s, fd);
            continue;
        }
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return;
        const int limit = errno == EMFILE || errno == ENFILE;
        if (limit && !s->at_limit) {
            s->at_limit = 1;
            slog(s, "this process is at its file-descriptor limit (%s; ulimit -n): refusing "
                    "connections until descriptors are free, unauthenticated ones dropped "
                    "first to make room",
                 errno == EMFILE ? "RLIMIT_NOFILE" : "the system's file table");
        } else if (!limit) {
            slog(s, "accept failed: %s; the listener rests %d ms", strerror(errno),
                 ACCEPT_REST_MS);
        }
        if (limit && evict_oldest(s, "dropped to make room at the descriptor limit (%zu "
                                     "unauthenticated)"))
            continue;
        if (!limit || terse__store_refuse(s->lfd) != 0) {
            s->rest_until_ms = terse__store_now_ms() + ACCEPT_REST_MS;
            return;
        }
    }
}

static int build_pollset(terse__store_server *s) {
    size_t need = 2 + s->nslots;
    if (need > s->pcap) {
        struct pollfd *p = realloc(s->pfd, need * sizeof *p);
        if (p) s->pfd = p;
        size_t *q = realloc(s->pslot, need * sizeof *q);
        if (q) s->pslot = q;
        if (!p || !q) return -1;
        s->pcap = need;
    }
    s->pfd[0] = (struct pollfd){.fd = s->wake[0], .events = POLLIN};
    const int resting = terse__store_now_ms() < s->rest_until_ms;
    s->pfd[1] = (struct pollfd){.fd = resting ? -1 : s->lfd, .events = POLLIN};
    int n = 2;
    for (size_t i = 0; i < s->nslots; i++) {
        conn *c = &s->c[i];
        if (c->fd < 0) continue;
        short ev = POLLIN;
        if (terse__store_tx_pending(&c->tx)) ev |= POLLOUT;
        s->pfd[n] = (struct pollfd){.fd = c->fd, .events = ev};
        s->pslot[n++] = i;
    }
    return n;
}

static void *serve(void *arg) {
    terse__store_server *s = arg;
    int draining = 0;
    uint64_t drain_deadline = 0;
    for (;;) {
        /* 1. Drop connections that did not authenticate in time. */
        uint64_t now = terse__store_now_ms(), next = draining ? drain_deadline : UINT64_MAX;
        noise_flush(s, now);
        if (s->noise_held && s->noise_since_ms + NOISE_PERIOD_MS < next)
            next = s->noise_since_ms + NOISE_PERIOD_MS;
        if (now < s->rest_until_ms && s->rest_until_ms < next) next = s->rest_until_ms;
        for (size_t i = 0; i < s->nslots; i++) {
            conn *c = &s->c[i];
            if (c->fd < 0 || c->authed) continue;
            if (now >= c->hs_deadline)
                drop(s, i, "sent no valid handshake within %d ms", TERSE__STORE_HANDSHAKE_MS);
            else if (c->hs_deadline < next)
                next = c->hs_deadline;
        }
        /* 2. After stop: leave once every rank is gone or the linger ends. */
        if (draining && (s->nauthed == 0 || now >= drain_deadline)) break;
        /* 3. Wait for sockets, the wake pipe, or the next deadline. */
        int n = build_pollset(s);
        if (n < 0) {
            slog(s, "out of memory; the store stops");
            break;
        }
        int ms = next == UINT64_MAX ? -1 : next - now > 60000 ? 60000 : (int)(next - now);
        if (poll(s->pfd, (nfds_t)n, ms) < 0) {
            if (errno == EINTR) continue;
            slog(s, "poll failed: %s; the store stops", strerror(errno));
            break;
        }
        if (s->pfd[0].revents) {
            char b = 0;
            if (read(s->wake[0], &b, 1) == 1 && b == 'a') break;
            draining = 1;
            /* 'f': rank 0 failed and told the others why: long enough for
             * that notice to go out (its queue is flushed below), no more */
            uint64_t linger = b == 'f' && s->linger_ms > 2000 ? 2000 : (uint64_t)s->linger_ms;
            drain_deadline = terse__store_now_ms() + linger;
            terse__store_close_fd(s->lfd);
            s->lfd = -1;
        }
        /* 4. Accept every waiting connection and greet it. */
        if (s->lfd >= 0 && s->pfd[1].fd >= 0 && (s->pfd[1].revents & POLLIN)) accept_all(s);
        /* 5. Serve every connection that has input or room for output. The
         * slot may have been dropped (and its fd closed) earlier in this
         * pass, which the fd comparison catches. */
        for (int i = 2; i < n; i++) {
            size_t slot = s->pslot[i];
            if (!s->pfd[i].revents || s->c[slot].fd != s->pfd[i].fd) continue;
            if (s->pfd[i].revents & (POLLIN | POLLHUP | POLLERR)) serve_input(s, slot);
        }
        /* 6. Send what was queued (replies, parked values, LOST notices). */
        for (size_t i = 0; i < s->nslots; i++) {
            conn *c = &s->c[i];
            if (c->fd >= 0 && terse__store_tx_pending(&c->tx) &&
                terse__store_tx_flush(&c->tx, c->fd) != 0)
                drop(s, i, "socket error while sending: %s", strerror(errno));
        }
    }
    return NULL;
}

/* ---- start and stop ---- */

static void destroy(terse__store_server *s) {
    for (size_t i = 0; i < s->nslots; i++) {
        terse__store_close_fd(s->c[i].fd);
        terse__store_rx_free(&s->c[i].rx);
        terse__store_tx_free(&s->c[i].tx);
    }
    terse__store_close_fd(s->lfd);
    terse__store_close_fd(s->wake[0]);
    terse__store_close_fd(s->wake[1]);
    terse__store_table_free(&s->table);
    OPENSSL_cleanse(s->token, sizeof s->token);
    free(s->c);
    free(s->joined);
    free(s->incarnation);
    free(s->pfd);
    free(s->pslot);
    free(s);
}

terse_status terse__store_server_start(const char *addr, int nranks, const char *token,
                                       int linger_ms, terse__store_server **out) {
    *out = NULL;
    terse__store_server *s = calloc(1, sizeof *s);
    if (!s) return TERSE_ERROR(TERSE_ERR_NOMEM, "cannot allocate the bootstrap store");
    s->lfd = s->wake[0] = s->wake[1] = -1;
    s->nranks = nranks;
    s->linger_ms = linger_ms;
    snprintf(s->token, sizeof s->token, "%s", token);
    snprintf(s->addr, sizeof s->addr, "%s", addr);
    terse_status st;
    s->joined = calloc((size_t)nranks, 1);
    s->incarnation = calloc((size_t)nranks, sizeof *s->incarnation);
    if (!s->joined || !s->incarnation)
        TERSE_FAIL_GOTO(st, fail, TERSE_ERR_NOMEM, "cannot allocate the store's rank table");
    uint64_t resolve_by = terse__store_now_ms() + (uint64_t)linger_ms;
    TERSE_CHECK_GOTO(terse__store_listen(addr, resolve_by, &s->lfd), st, fail);
    terse__store_keep_spare(); /* for refusing connections at the descriptor limit */
    if (terse__store_pipe(s->wake) != 0)
        TERSE_FAIL_GOTO(st, fail, TERSE_ERR_IO, "cannot create the store's wake pipe: %s",
                        strerror(errno));
    /* The thread takes no signals: they belong to the application's threads. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    int rc = pthread_create(&s->thread, NULL, serve, s);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0)
        TERSE_FAIL_GOTO(st, fail, TERSE_ERR_INTERNAL, "cannot start the store thread: %s",
                        strerror(rc));
    *out = s;
    return TERSE_OK;
fail:
    destroy(s);
    return st;
}

void terse__store_server_owner_leaving(terse__store_server *s) {
    if (s) atomic_store(&s->owner_leaving, 1);
}

void terse__store_server_stop(terse__store_server *s, int abandon) {
    if (!s) return;
    /* The byte says how to stop: 'a' at once, 'x' after the linger, 'f'
     * after at most 2 s of it. The pipe is empty (stop is called once), so
     * the write cannot fail for space. */
    ssize_t w = write(s->wake[1], abandon == 2 ? "f" : abandon ? "a" : "x", 1);
    (void)w;
    pthread_join(s->thread, NULL);
    destroy(s);
}
