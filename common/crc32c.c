#include "common/crc32c.h"

#include "common/cpu.h"

/* Slicing-by-8 tables, built once. */
static uint32_t table[8][256];

static void build_tables(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0x82f63b78u & (0u - (c & 1u)));
        table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++) table[t][i] = (table[t - 1][i] >> 8) ^ table[0][table[t - 1][i] & 0xff];
}

#include <pthread.h>
static pthread_once_t tables_once = PTHREAD_ONCE_INIT;

uint32_t terse__crc32c_sw(uint32_t crc, const void *buf, size_t len) {
    pthread_once(&tables_once, build_tables);
    const uint8_t *p = buf;
    crc = ~crc;
    while (len >= 8) {
        uint32_t lo = crc ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
        crc = table[7][lo & 0xff] ^ table[6][(lo >> 8) & 0xff] ^ table[5][(lo >> 16) & 0xff] ^
              table[4][lo >> 24] ^ table[3][p[4]] ^ table[2][p[5]] ^ table[1][p[6]] ^ table[0][p[7]];
        p += 8;
        len -= 8;
    }
    while (len--) crc = (crc >> 8) ^ table[0][(crc ^ *p++) & 0xff];
    return ~crc;
}

#if !(defined(__x86_64__) || defined(__i386__))
uint32_t terse__crc32c_sse42(uint32_t crc, const void *buf, size_t len) {
    return terse__crc32c_sw(crc, buf, len);
}
#endif

uint32_t terse__crc32c_update(uint32_t crc, const void *buf, size_t len) {
    if (terse__cpu_features() & TERSE_CPU_SSE42) return terse__crc32c_sse42(crc, buf, len);
    return terse__crc32c_sw(crc, buf, len);
}
