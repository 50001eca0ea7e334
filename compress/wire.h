/* The 32-byte message header (layout documented in terse.h). */
#ifndef TERSE_COMPRESS_WIRE_H
#define TERSE_COMPRESS_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "terse.h"

/* Fill the header at msg (payload already at msg + 32) and its CRC. */
void terse__wire_seal(uint8_t *msg, uint32_t codec_id, uint64_t count, uint64_t payload_len);

/* Validate header fields and checksum of msg[0..len). If want_id/want_count
 * are nonzero they must match. max_payload bounds the payload length. */
terse_status terse__wire_open(const uint8_t *msg, size_t len, uint32_t want_id,
                              uint64_t want_count, uint64_t max_payload,
                              terse_wire_info *info);

#endif
