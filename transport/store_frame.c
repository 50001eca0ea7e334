/* Frame buffers for the bootstrap store: a bounded receive buffer that
 * yields whole frames, and a growing send queue, both over non-blocking
 * sockets. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <openssl/crypto.h>
#include <openssl/core_names.h>
#include <openssl/evp.h>
#include <openssl/params.h>

#include "common/bytes.h"
#include "common/error.h"
#include "transport/store_wire.h"

/* The tag of a keyed frame (store_wire.h): HMAC-SHA256 cut to 16 bytes. */
static int frame_tag(const uint8_t key[32], uint64_t seq, uint8_t type, const uint8_t *body,
                     size_t n, uint8_t tag[TERSE__STORE_TAG]) {
    uint8_t head[13], full[32];
    terse__put_u64(head, seq);
    head[8] = type;
    terse__put_u32(head + 9, (uint32_t)n);
    /* EVP_MAC: OpenSSL 3's HMAC (frames are few: init and notices). */
    EVP_MAC *mac = EVP_MAC_fetch(NULL, "HMAC", NULL);
    EVP_MAC_CTX *h = mac ? EVP_MAC_CTX_new(mac) : NULL;
    char digest[] = "SHA256";
    OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
                           OSSL_PARAM_construct_end()};
    size_t out = 0;
    int ok = h && EVP_MAC_init(h, key, 32, params) == 1 &&
             EVP_MAC_update(h, head, sizeof head) == 1 && (n == 0 || EVP_MAC_update(h, body, n) == 1) &&
             EVP_MAC_final(h, full, &out, sizeof full) == 1 && out == 32;
    EVP_MAC_CTX_free(h);
    EVP_MAC_free(mac);
    memcpy(tag, full, TERSE__STORE_TAG);
    OPENSSL_cleanse(full, sizeof full);
    return ok;
}

void terse__store_rx_key(terse__store_rx *rx, const uint8_t key[32], int after_current) {
    memcpy(rx->key, key, 32);
    rx->keyed = after_current ? 2 : 1;
    rx->seq = 0;
}

void terse__store_tx_key(terse__store_tx *tx, const uint8_t key[32]) {
    memcpy(tx->key, key, 32);
    tx->keyed = 1;
    tx->seq = 0;
}

terse_status terse__store_rx_init(terse__store_rx *rx, size_t max_body) {
    rx->buf = NULL;
    rx->len = rx->cap = 0;
    return terse__store_rx_grow(rx, max_body);
}

terse_status terse__store_rx_grow(terse__store_rx *rx, size_t max_body) {
    size_t cap = TERSE__STORE_HDR + max_body + TERSE__STORE_TAG;
    if (cap <= rx->cap) return TERSE_OK;
    uint8_t *p = realloc(rx->buf, cap);
    if (!p) return TERSE_ERROR(TERSE_ERR_NOMEM, "cannot allocate a %zu-byte store buffer", cap);
    rx->buf = p;
    rx->cap = cap;
    return TERSE_OK;
}

void terse__store_rx_free(terse__store_rx *rx) {
    free(rx->buf);
    rx->buf = NULL;
    rx->len = rx->cap = 0;
    OPENSSL_cleanse(rx->key, sizeof rx->key);
    rx->keyed = 0;
}

long terse__store_rx_read(terse__store_rx *rx, int fd) {
    /* The buffer holds at most one frame of the largest accepted size, and
     * a complete frame is consumed before the next read, so free space is
     * only zero if the caller forgot to peek -- report that as "nothing". */
    if (rx->len >= rx->cap) return -1;
    for (;;) {
        ssize_t n = recv(fd, rx->buf + rx->len, rx->cap - rx->len, 0);
        if (n > 0) {
            rx->len += (size_t)n;
            return (long)n;
        }
        if (n == 0) return 0;
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return -1;
        return -2;
    }
}

int terse__store_rx_peek(const terse__store_rx *rx, size_t max_body, uint8_t *type,
                         const uint8_t **body, size_t *blen) {
    if (rx->len < TERSE__STORE_HDR) return 0;
    uint32_t n = terse__get_u32(rx->buf);
    *blen = n;
    const size_t tag = rx->keyed == 1 ? TERSE__STORE_TAG : 0;
    /* The length is judged before anything else is done with it. */
    if (n < tag || n - tag > max_body || TERSE__STORE_HDR + (size_t)n > rx->cap) return -1;
    if (rx->len < TERSE__STORE_HDR + (size_t)n) return 0;
    *type = rx->buf[4];
    *body = rx->buf + TERSE__STORE_HDR;
    if (tag) {
        uint8_t want[TERSE__STORE_TAG];
        size_t m = n - tag;
        if (!frame_tag(rx->key, rx->seq, *type, *body, m, want) ||
            CRYPTO_memcmp(want, *body + m, tag) != 0)
            return -2;
        *blen = m;
    }
    return 1;
}

void terse__store_rx_consume(terse__store_rx *rx) {
    if (rx->len < TERSE__STORE_HDR) return;
    size_t n = TERSE__STORE_HDR + terse__get_u32(rx->buf);
    if (n > rx->len) return;
    memmove(rx->buf, rx->buf + n, rx->len - n);
    rx->len -= n;
    if (rx->keyed == 1) rx->seq++;
    else if (rx->keyed == 2) rx->keyed = 1; /* the untagged frame is gone */
}

void terse__store_tx_free(terse__store_tx *tx) {
    free(tx->buf);
    tx->buf = NULL;
    tx->head = tx->len = tx->cap = 0;
    OPENSSL_cleanse(tx->key, sizeof tx->key);
    tx->keyed = 0;
}

size_t terse__store_tx_pending(const terse__store_tx *tx) { return tx->len - tx->head; }

terse_status terse__store_tx_frame(terse__store_tx *tx, uint8_t type, const void *a, size_t alen,
                                   const void *b, size_t blen, const void *c, size_t clen) {
    const size_t tag = tx->keyed ? TERSE__STORE_TAG : 0;
    size_t body = alen + blen + clen + tag;
    if (body - tag > TERSE__STORE_MAX_BODY)
        return TERSE_ERROR(TERSE_ERR_INTERNAL, "store frame body of %zu bytes exceeds %d", body,
                           (int)TERSE__STORE_MAX_BODY);
    /* Reclaim the sent prefix before growing. */
    if (tx->head == tx->len) {
        tx->head = tx->len = 0;
    } else if (tx->head > 0 && tx->len + TERSE__STORE_HDR + body > tx->cap) {
        memmove(tx->buf, tx->buf + tx->head, tx->len - tx->head);
        tx->len -= tx->head;
        tx->head = 0;
    }
    size_t need = tx->len + TERSE__STORE_HDR + body;
    if (need > tx->cap) {
        size_t cap = tx->cap ? tx->cap : 256;
        while (cap < need) cap *= 2;
        uint8_t *p = realloc(tx->buf, cap);
        if (!p)
            return TERSE_ERROR(TERSE_ERR_NOMEM, "cannot grow a store send queue to %zu bytes",
                               cap);
        tx->buf = p;
        tx->cap = cap;
    }
    uint8_t *o = tx->buf + tx->len;
    terse__put_u32(o, (uint32_t)body);
    o[4] = type;
    o += TERSE__STORE_HDR;
    if (alen) memcpy(o, a, alen);
    if (blen) memcpy(o + alen, b, blen);
    if (clen) memcpy(o + alen + blen, c, clen);
    if (tag) {
        size_t m = body - tag;
        if (!frame_tag(tx->key, tx->seq, type, o, m, o + m))
            return TERSE_ERROR(TERSE_ERR_INTERNAL, "HMAC-SHA256 (OpenSSL) failed on a store frame");
        tx->seq++;
    }
    tx->len = need;
    return TERSE_OK;
}

int terse__store_tx_flush(terse__store_tx *tx, int fd) {
    while (tx->head < tx->len) {
        ssize_t n = send(fd, tx->buf + tx->head, tx->len - tx->head, MSG_NOSIGNAL);
        if (n > 0) {
            tx->head += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
        return -1;
    }
    tx->head = tx->len = 0;
    return 0;
}
