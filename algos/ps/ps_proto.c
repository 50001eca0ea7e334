/* The parameter server's two headers (algos/ps/ps.h has the protocol).
 * Little endian, fixed size:
 *   request  [0,4) "TPSQ"  [4] op  [5] PULL_AFTER: the lane of the push it
 *            follows  [6,8) ...and the low 16 bits of that push's seq (0
 *            for other ops)  [8,16) key  [16,24) clock
 *            [24,32) payload length  [32,40) seq  [40,48) floats
 *            [48,52) declaration hash  [52,56) weight (binary32; 0 bits:
 *            unweighted, 1)  [56,60) epoch (replicas 2: 1 once the slot's
 *            replica serves it)  [60,64) crc32c of [0,60)
 *   reply    [0,4) "TPSR"  [4,8) status  [8,16) version  [16,24) payload
 *            length  [24,32) seq  [32,36) staleness (saturated)
 *            [36,40) crc32c of [0,36) and the text  [40,256) text, NUL padded
 * The checksum catches a header that is not one (the transport's MAC, on
 * by default over tcp, is what stops forgery). */
#include <string.h>

#include "algos/ps/ps.h"
#include "common/bytes.h"
#include "common/crc32c.h"
#include "common/error.h"

#define REQ_MAGIC 0x51535054u /* "TPSQ" */
#define REP_MAGIC 0x52535054u /* "TPSR" */

void terse__ps_put_hdr(uint8_t *b, const terse__ps_hdr *h) {
    memset(b, 0, TERSE__PS_HDR_BYTES);
    terse__put_u32(b, REQ_MAGIC);
    b[4] = (uint8_t)h->op;
    b[5] = h->after_lane;
    terse__put_u16(b + 6, h->after_seq);
    terse__put_u64(b + 8, h->key);
    terse__put_u64(b + 16, h->clock);
    terse__put_u64(b + 24, h->payload_len);
    terse__put_u64(b + 32, h->seq);
    terse__put_u64(b + 40, h->nfloats);
    terse__put_u32(b + 48, h->decl_hash);
    uint32_t wbits = 0;
    if (h->weight != 1.0f) memcpy(&wbits, &h->weight, 4);
    terse__put_u32(b + 52, wbits);
    terse__put_u32(b + 56, h->epoch);
    terse__put_u32(b + 60, terse__crc32c_update(0, b, 60));
}

terse_status terse__ps_get_hdr(const uint8_t *b, terse__ps_hdr *h) {
    if (terse__get_u32(b) != REQ_MAGIC)
        return TERSE_ERROR(TERSE_ERR_MAGIC, "not a parameter-server request (magic %#x)",
                           terse__get_u32(b));
    if (terse__get_u32(b + 60) != terse__crc32c_update(0, b, 60))
        return TERSE_ERROR(TERSE_ERR_CORRUPT, "request header fails its checksum");
    static const uint8_t zero[8] = {0};
    if (b[4] != TERSE__PS_PULL_AFTER && memcmp(b + 5, zero, 3) != 0)
        return TERSE_ERROR(TERSE_ERR_CORRUPT, "request header has nonzero reserved bytes");
    memset(h, 0, sizeof *h);
    h->op = b[4];
    h->after_lane = b[5];
    h->after_seq = terse__get_u16(b + 6);
    h->key = terse__get_u64(b + 8);
    h->clock = terse__get_u64(b + 16);
    h->payload_len = terse__get_u64(b + 24);
    h->seq = terse__get_u64(b + 32);
    h->nfloats = terse__get_u64(b + 40);
    h->decl_hash = terse__get_u32(b + 48);
    h->epoch = terse__get_u32(b + 56);
    if (h->epoch > TERSE__PS_MAX_EPOCH)
        return TERSE_ERROR(TERSE_ERR_CORRUPT, "request header has epoch %u (at most %u)",
                           h->epoch, TERSE__PS_MAX_EPOCH);
    uint32_t wbits = terse__get_u32(b + 52);
    h->weight = 1.0f;
    if (wbits) memcpy(&h->weight, &wbits, 4);
    if (h->op < TERSE__PS_PUSH || h->op > TERSE__PS_PULL_AFTER)
        return TERSE_ERROR(TERSE_ERR_CORRUPT, "request header has unknown op %d", h->op);
    return TERSE_OK;
}

static uint32_t rep_crc(const uint8_t *b) {
    return terse__crc32c_update(terse__crc32c_update(0, b, 36), b + 40, TERSE__PS_REP_TEXT);
}

void terse__ps_put_rep(uint8_t *b, const terse__ps_rep *r) {
    memset(b, 0, TERSE__PS_REP_BYTES);
    terse__put_u32(b, REP_MAGIC);
    terse__put_u32(b + 4, (uint32_t)r->status);
    terse__put_u64(b + 8, r->version);
    terse__put_u64(b + 16, r->payload_len);
    terse__put_u64(b + 24, r->seq);
    terse__put_u32(b + 32, r->staleness > UINT32_MAX ? UINT32_MAX : (uint32_t)r->staleness);
    size_t n = strnlen(r->text, TERSE__PS_REP_TEXT - 1);
    memcpy(b + 40, r->text, n);
    terse__put_u32(b + 36, rep_crc(b));
}

terse_status terse__ps_get_rep(const uint8_t *b, terse__ps_rep *r) {
    if (terse__get_u32(b) != REP_MAGIC)
        return TERSE_ERROR(TERSE_ERR_MAGIC, "not a parameter-server reply (magic %#x)",
                           terse__get_u32(b));
    if (terse__get_u32(b + 36) != rep_crc(b))
        return TERSE_ERROR(TERSE_ERR_CORRUPT, "reply header fails its checksum");
    memset(r, 0, sizeof *r);
    r->status = (terse_status)terse__get_u32(b + 4);
    r->version = terse__get_u64(b + 8);
    r->payload_len = terse__get_u64(b + 16);
    r->seq = terse__get_u64(b + 24);
    r->staleness = terse__get_u32(b + 32);
    memcpy(r->text, b + 40, TERSE__PS_REP_TEXT - 1);
    r->text[TERSE__PS_REP_TEXT - 1] = 0;
    if ((uint32_t)r->status > 64)
        return TERSE_ERROR(TERSE_ERR_CORRUPT, "reply header has status %u", (unsigned)r->status);
    return TERSE_OK;
}

terse_status terse__ps_msg_len(const uint8_t *p, size_t avail, size_t *len) {
    if (avail < TERSE_WIRE_HEADER_SIZE)
        return TERSE_ERROR(TERSE_ERR_TRUNCATED, "%zu bytes left where a message header (%u) was due",
                           avail, TERSE_WIRE_HEADER_SIZE);
    uint64_t n = terse__get_u64(p + 16);
    if (n > avail - TERSE_WIRE_HEADER_SIZE)
        return TERSE_ERROR(TERSE_ERR_TRUNCATED,
                           "a message claims %llu payload bytes where %zu are left",
                           (unsigned long long)n, avail - TERSE_WIRE_HEADER_SIZE);
    *len = (size_t)n + TERSE_WIRE_HEADER_SIZE;
    return TERSE_OK;
}
