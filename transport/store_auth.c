/* The store handshake's proofs: HMAC-SHA256 and nonces from OpenSSL's
 * libcrypto. Nothing here is hand-rolled crypto: we only lay out the bytes
 * that get MACed. */
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <string.h>

#include "common/bytes.h"
#include "common/error.h"
#include "transport/store_wire.h"

static const char client_label[] = "terse-store-v1";
static const char server_label[] = "terse-store-v1/server";

terse_status terse__store_nonce(uint8_t nonce[TERSE__STORE_NONCE]) {
    if (RAND_bytes(nonce, TERSE__STORE_NONCE) != 1)
        return TERSE_ERROR(TERSE_ERR_INTERNAL, "OpenSSL RAND_bytes could not produce a nonce");
    return TERSE_OK;
}

/* HMAC-SHA256(token, msg) into mac; the message is at most two nonces, a
 * label and a rank, so it is built on the stack. */
static terse_status hmac(const char *token, const uint8_t *msg, size_t len, uint8_t *mac) {
    size_t klen = strlen(token);
    unsigned int out = 0;
    if (klen == 0 || klen > TERSE__STORE_MAX_TOKEN)
        return TERSE_ERROR(TERSE_ERR_INVALID, "the job token must be 1 to %d bytes long",
                           TERSE__STORE_MAX_TOKEN);
    if (!HMAC(EVP_sha256(), token, (int)klen, msg, len, mac, &out) || out != TERSE__STORE_MAC)
        return TERSE_ERROR(TERSE_ERR_INTERNAL, "OpenSSL HMAC-SHA256 failed");
    return TERSE_OK;
}

terse_status terse__store_client_mac(const char *token, const uint8_t *snonce, uint32_t rank,
                                     uint8_t mac[TERSE__STORE_MAC]) {
    uint8_t msg[TERSE__STORE_NONCE + sizeof client_label + 4];
    size_t n = 0;
    memcpy(msg + n, snonce, TERSE__STORE_NONCE);
    n += TERSE__STORE_NONCE;
    memcpy(msg + n, client_label, sizeof client_label - 1);
    n += sizeof client_label - 1;
    terse__put_u32(msg + n, rank);
    n += 4;
    return hmac(token, msg, n, mac);
}

terse_status terse__store_server_mac(const char *token, const uint8_t *cnonce,
                                     const uint8_t *snonce, uint32_t rank,
                                     uint8_t mac[TERSE__STORE_MAC]) {
    uint8_t msg[2 * TERSE__STORE_NONCE + sizeof server_label + 4];
    size_t n = 0;
    memcpy(msg + n, cnonce, TERSE__STORE_NONCE);
    n += TERSE__STORE_NONCE;
    memcpy(msg + n, snonce, TERSE__STORE_NONCE);
    n += TERSE__STORE_NONCE;
    memcpy(msg + n, server_label, sizeof server_label - 1);
    n += sizeof server_label - 1;
    terse__put_u32(msg + n, rank);
    n += 4;
    return hmac(token, msg, n, mac);
}

int terse__store_mac_equal(const uint8_t *a, const uint8_t *b) {
    /* Constant time, so a forger learns nothing from how long a refusal takes. */
    return CRYPTO_memcmp(a, b, TERSE__STORE_MAC) == 0;
}

static terse_status session_key(const char *token, const char *label, const uint8_t *snonce,
                                const uint8_t *cnonce, uint32_t rank, uint8_t key[32]) {
    uint8_t msg[2 * TERSE__STORE_NONCE + 32 + 4];
    size_t n = 0, l = strlen(label);
    memcpy(msg + n, label, l);
    n += l;
    memcpy(msg + n, snonce, TERSE__STORE_NONCE);
    n += TERSE__STORE_NONCE;
    memcpy(msg + n, cnonce, TERSE__STORE_NONCE);
    n += TERSE__STORE_NONCE;
    terse__put_u32(msg + n, rank);
    n += 4;
    return hmac(token, msg, n, key);
}

terse_status terse__store_session_keys(const char *token, const uint8_t *snonce,
                                       const uint8_t *cnonce, uint32_t rank, uint8_t c2s[32],
                                       uint8_t s2c[32]) {
    TERSE_CHECK(session_key(token, "terse-store-v1/c2s", snonce, cnonce, rank, c2s));
    return session_key(token, "terse-store-v1/s2c", snonce, cnonce, rank, s2c);
}
