/* CRC32C (Castagnoli), as in iSCSI/ext4: reflected polynomial 0x82f63b78,
 * initial value and final xor 0xffffffff. terse__crc32c_update continues a
 * running CRC: crc = update(update(0, a), b) == crc32c(a || b). */
#ifndef TERSE_COMMON_CRC32C_H
#define TERSE_COMMON_CRC32C_H

#include <stddef.h>
#include <stdint.h>

uint32_t terse__crc32c_update(uint32_t crc, const void *buf, size_t len);

/* Portable reference, and the hardware version where the build has one. */
uint32_t terse__crc32c_sw(uint32_t crc, const void *buf, size_t len);
uint32_t terse__crc32c_sse42(uint32_t crc, const void *buf, size_t len);

#endif
