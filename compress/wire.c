#include "compress/wire.h"

#include "common/bytes.h"
#include "common/crc32c.h"
#include "common/error.h"
#include "compress/codec_internal.h"

void terse__wire_seal(uint8_t *msg, uint32_t codec_id, uint64_t count, uint64_t payload_len) {
    terse__put_u32(msg, TERSE_WIRE_MAGIC);
    msg[4] = (uint8_t)TERSE_WIRE_VERSION;
    msg[5] = 0;
    terse__put_u16(msg + 6, (uint16_t)codec_id);
    terse__put_u64(msg + 8, count);
    terse__put_u64(msg + 16, payload_len);
    terse__put_u32(msg + 24, 0);
    terse__put_u32(msg + 28, 0);
    uint32_t crc = terse__crc32c_update(0, msg, TERSE_WIRE_HEADER_SIZE);
    crc = terse__crc32c_update(crc, msg + TERSE_WIRE_HEADER_SIZE, (size_t)payload_len);
    terse__put_u32(msg + 24, crc);
}

/* Checks run from the cheapest and most specific to the checksum, so each
 * fault gets the status that names it. Lengths are compared before any
 * payload byte is read. */
terse_status terse__wire_open(const uint8_t *msg, size_t len, uint32_t want_id,
                              uint64_t want_count, uint64_t max_payload,
                              terse_wire_info *info) {
    if (!msg && len) return TERSE_ERROR(TERSE_ERR_INVALID, "message pointer is NULL");
    if (len < TERSE_WIRE_HEADER_SIZE)
        return TERSE_ERROR(TERSE_ERR_TRUNCATED,
                           "message is %zu bytes, shorter than the %u-byte header", len,
                           TERSE_WIRE_HEADER_SIZE);
    uint32_t magic = terse__get_u32(msg);
    if (magic != TERSE_WIRE_MAGIC)
        return TERSE_ERROR(TERSE_ERR_MAGIC, "bad magic 0x%08x at byte 0 (want 0x%08x)", magic,
                           TERSE_WIRE_MAGIC);
    if (msg[4] != TERSE_WIRE_VERSION)
        return TERSE_ERROR(TERSE_ERR_VERSION,
                           "wire format version %u at byte 4; this library reads version %u",
                           msg[4], TERSE_WIRE_VERSION);
    if (msg[5] != 0)
        return TERSE_ERROR(TERSE_ERR_CORRUPT, "reserved flags byte 5 is 0x%02x, must be 0", msg[5]);
    if (terse__get_u32(msg + 28) != 0)
        return TERSE_ERROR(TERSE_ERR_CORRUPT, "reserved bytes 28..31 are not zero");
    uint32_t id = terse__get_u16(msg + 6);
    uint64_t count = terse__get_u64(msg + 8);
    uint64_t plen = terse__get_u64(msg + 16);
    if (want_id && id != want_id)
        return TERSE_ERROR(TERSE_ERR_CODEC_MISMATCH,
                           "message codec id %u ('%s') at byte 6, but this codec is '%s' (id %u)",
                           id, terse__registry_name_of(id), terse__registry_name_of(want_id),
                           want_id);
    if (want_count && count != want_count)
        return TERSE_ERROR(TERSE_ERR_SHAPE,
                           "message holds %llu elements (byte 8), but the codec is bound to %llu",
                           (unsigned long long)count, (unsigned long long)want_count);
    uint64_t avail = (uint64_t)len - TERSE_WIRE_HEADER_SIZE;
    if (plen > avail)
        return TERSE_ERROR(TERSE_ERR_TRUNCATED,
                           "header says %llu payload bytes (byte 16) but only %llu follow",
                           (unsigned long long)plen, (unsigned long long)avail);
    if (plen < avail)
        return TERSE_ERROR(TERSE_ERR_CORRUPT,
                           "header says %llu payload bytes (byte 16) but %llu follow",
                           (unsigned long long)plen, (unsigned long long)avail);
    if (plen > max_payload)
        return TERSE_ERROR(TERSE_ERR_CORRUPT,
                           "payload of %llu bytes exceeds this codec's bound of %llu",
                           (unsigned long long)plen, (unsigned long long)max_payload);
    uint32_t want_crc = terse__get_u32(msg + 24);
    uint8_t head[TERSE_WIRE_HEADER_SIZE];
    for (unsigned i = 0; i < TERSE_WIRE_HEADER_SIZE; i++) head[i] = msg[i];
    terse__put_u32(head + 24, 0);
    uint32_t crc = terse__crc32c_update(0, head, sizeof head);
    crc = terse__crc32c_update(crc, msg + TERSE_WIRE_HEADER_SIZE, (size_t)plen);
    if (crc != want_crc)
        return TERSE_ERROR(TERSE_ERR_CORRUPT, "CRC32C mismatch: header says 0x%08x, data gives 0x%08x",
                           want_crc, crc);
    if (info) {
        info->codec_id = id;
        info->count = count;
        info->payload_len = plen;
    }
    return TERSE_OK;
}

terse_status terse_wire_inspect(const void *src, size_t len, terse_wire_info *info) {
    return terse__wire_open(src, len, 0, 0, UINT64_MAX, info);
}
