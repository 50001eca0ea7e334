/* Codec state for checkpoints.
 *
 * Layout (little endian):
 *   0  u32 magic "TRSS"      4  u32 version (1)
 *   8  u32 codec id         12  u32 flags (bit 0: residual present)
 *  16  u64 elements         24  u64 seed
 *  32  u64 step             40  u64 tensor
 *  48  u32 rank             52  u32 reserved (0)
 *  56  u64 codec state length L
 *  64  u64 rows (cols = elements / rows), so a transposed shape is refused
 *  72  residual (elements * 4 bytes, when flagged), then L bytes of codec
 *      state, then u32 CRC32C of everything before it. */
#include <string.h>

#include "common/bytes.h"
#include "common/crc32c.h"
#include "common/error.h"
#include "compress/aggregate.h"
#include "compress/codec_internal.h"

#include "compress/state.h"

#define STATE_MAGIC 0x53535254u /* "TRSS" */
#define STATE_VERSION 1u
#define STATE_HEAD TERSE__STATE_HEAD

static size_t hop_bytes(const terse_codec *c);

static size_t plugin_state_size(const terse_codec *c) {
    return c->ops.state_size ? c->ops.state_size(c->self) : 0;
}

size_t terse_codec_state_size(const terse_codec *c) {
    if (!c) return 0;
    return STATE_HEAD + (c->ef ? c->n * sizeof(float) : 0) + plugin_state_size(c) + 4;
}

terse_status terse_codec_state_save(const terse_codec *c, void *dst, size_t cap, size_t *len) {
    if (!c || !dst || !len) return TERSE_ERROR(TERSE_ERR_INVALID, "NULL argument");
    size_t need = terse_codec_state_size(c);
    *len = 0;
    if (cap < need)
        return TERSE_ERROR(TERSE_ERR_DST_TOO_SMALL, "codec state needs %zu bytes, buffer has %zu",
                           need, cap);
    uint8_t *p = dst;
    size_t ps = plugin_state_size(c);
    memset(p, 0, STATE_HEAD);
    terse__put_u32(p, STATE_MAGIC);
    terse__put_u32(p + 4, STATE_VERSION);
    terse__put_u32(p + 8, c->ops.id);
    terse__put_u32(p + 12, c->ef ? 1u : 0u);
    terse__put_u64(p + 16, c->n);
    terse__put_u64(p + 24, c->seed);
    terse__put_u64(p + 32, c->step);
    terse__put_u64(p + 40, c->tensor);
    terse__put_u32(p + 48, c->rank);
    terse__put_u64(p + 56, ps);
    terse__put_u64(p + 64, c->rows);
    size_t off = STATE_HEAD;
    if (c->ef) {
        memcpy(p + off, c->residual, c->n * sizeof(float));
        off += c->n * sizeof(float);
    }
    if (ps) {
        TERSE_CHECK(c->ops.state_save(c->self, p + off));
        off += ps;
    }
    terse__put_u32(p + off, terse__crc32c_update(0, p, off));
    *len = off + 4;
    return TERSE_OK;
}

terse_status terse_codec_state_load(terse_codec *c, const void *src, size_t len) {
    if (!c || (!src && len)) return TERSE_ERROR(TERSE_ERR_INVALID, "NULL argument");
    const uint8_t *p = src;
    if (len < STATE_HEAD + 4)
        return TERSE_ERROR(TERSE_ERR_TRUNCATED, "codec state is %zu bytes, shorter than its header",
                           len);
    if (terse__get_u32(p) != STATE_MAGIC)
        return TERSE_ERROR(TERSE_ERR_MAGIC, "not a terse codec state (bad magic at byte 0)");
    if (terse__get_u32(p + 4) != STATE_VERSION)
        return TERSE_ERROR(TERSE_ERR_VERSION, "codec state version %u; this library reads %u",
                           terse__get_u32(p + 4), STATE_VERSION);
    uint32_t id = terse__get_u32(p + 8), flags = terse__get_u32(p + 12);
    uint64_t n = terse__get_u64(p + 16), seed = terse__get_u64(p + 24);
    uint64_t ps = terse__get_u64(p + 56);
    if (id != c->ops.id)
        return TERSE_ERROR(TERSE_ERR_CODEC_MISMATCH, "state is of codec '%s' (id %u), this codec is '%s' (%u)",
                           terse__registry_name_of(id), id, c->ops.name, c->ops.id);
    uint64_t rows = terse__get_u64(p + 64);
    if (n != c->n || rows != c->rows)
        return TERSE_ERROR(TERSE_ERR_SHAPE,
                           "state is for %llu elements in %llu rows, this codec has %zu x %zu",
                           (unsigned long long)n, (unsigned long long)rows, c->rows, c->cols);
    if (flags > 1 || terse__get_u32(p + 52) != 0)
        return TERSE_ERROR(TERSE_ERR_CORRUPT, "codec state has unknown flags or reserved bits");
    if ((flags & 1u) != (c->ef ? 1u : 0u))
        return TERSE_ERROR(TERSE_ERR_INVALID, "state was saved with ef=%u, this codec has ef=%d",
                           flags & 1u, c->ef);
    if (seed != c->seed)
        return TERSE_ERROR(TERSE_ERR_INVALID, "state was saved with seed=%llu, this codec has seed=%llu",
                           (unsigned long long)seed, (unsigned long long)c->seed);
    size_t want_ps = plugin_state_size(c);
    if (ps != want_ps)
        return TERSE_ERROR(TERSE_ERR_CORRUPT, "codec state length %llu, expected %zu",
                           (unsigned long long)ps, want_ps);
    size_t need = terse_codec_state_size(c);
    if (len < need)
        return TERSE_ERROR(TERSE_ERR_TRUNCATED, "codec state is %zu bytes, expected %zu", len, need);
    if (len > need)
        return TERSE_ERROR(TERSE_ERR_CORRUPT, "codec state is %zu bytes, expected %zu", len, need);
    size_t body = need - 4;
    if (terse__crc32c_update(0, p, body) != terse__get_u32(p + body))
        return TERSE_ERROR(TERSE_ERR_CORRUPT, "codec state CRC32C mismatch");
    size_t off = STATE_HEAD + (c->ef ? c->n * sizeof(float) : 0);
    if (ps) TERSE_CHECK(c->ops.state_load(c->self, p + off, (size_t)ps));
    if (c->ef) memcpy(c->residual, p + STATE_HEAD, c->n * sizeof(float));
    if (hop_bytes(c)) memset(c->segs->hop, 0, hop_bytes(c)); /* not in checkpoints */
    c->step = terse__get_u64(p + 32);
    c->tensor = terse__get_u64(p + 40);
    c->rank = terse__get_u32(p + 48);
    return TERSE_OK;
}

/* ---- snapshots for transactional collectives (no header, no checksum:
 * they never leave the process). The reduce-scatter's hop residual is
 * part of them: terse__codec_segments allocates it before the snapshot. */

static size_t hop_bytes(const terse_codec *c) {
    return c->segs && c->segs->hop ? c->segs->len[c->segs->rank] * sizeof(float) : 0;
}

size_t terse__codec_snapshot_size(const terse_codec *c) {
    return sizeof(uint64_t) + (c->ef ? c->n * sizeof(float) : 0) + hop_bytes(c) +
           plugin_state_size(c);
}

terse_status terse__codec_snapshot(const terse_codec *c, void *dst) {
    uint8_t *p = dst;
    memcpy(p, &c->step, sizeof(uint64_t));
    p += sizeof(uint64_t);
    if (c->ef) {
        memcpy(p, c->residual, c->n * sizeof(float));
        p += c->n * sizeof(float);
    }
    if (hop_bytes(c)) {
        memcpy(p, c->segs->hop, hop_bytes(c));
        p += hop_bytes(c);
    }
    return plugin_state_size(c) ? c->ops.state_save(c->self, p) : TERSE_OK;
}

terse_status terse__codec_restore(terse_codec *c, const void *src) {
    const uint8_t *p = src;
    size_t ps = plugin_state_size(c);
    const uint8_t *ep = p + sizeof(uint64_t), *hp = ep + (c->ef ? c->n * sizeof(float) : 0);
    const uint8_t *pp = hp + hop_bytes(c);
    if (ps) TERSE_CHECK(c->ops.state_load(c->self, pp, ps));
    memcpy(&c->step, p, sizeof(uint64_t));
    if (c->ef) memcpy(c->residual, ep, c->n * sizeof(float));
    if (hop_bytes(c)) memcpy(c->segs->hop, hp, hop_bytes(c));
    return TERSE_OK;
}
