/* CRC32C with the SSE4.2 crc32 instruction. Compiled with -msse4.2 only on
 * x86; called only when CPUID says the instruction exists.
 *
 * Large buffers run three independent streams (the instruction has latency
 * 3, throughput 1), then fold them together with the carry-less shift
 * operator computed by table-free exponentiation (zlib's crc32_combine
 * idea, specialised to fixed block lengths and computed once). */
#if defined(__x86_64__) || defined(__i386__)
#include <nmmintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "common/crc32c.h"

#define BLOCK 4096 /* bytes per stream per round */

/* Multiply a and b modulo the CRC polynomial (reflected). */
static uint32_t gf2_mul(uint32_t a, uint32_t b) {
    uint32_t m = 1u << 31, p = 0;
    for (;;) {
        if (a & m) {
            p ^= b;
            if ((a & (m - 1)) == 0) break;
        }
        m >>= 1;
        b = (b & 1) ? (b >> 1) ^ 0x82f63b78u : b >> 1;
    }
    return p;
}

/* x^(8*n) mod P, reflected. */
static uint32_t x8n(size_t n) {
    uint32_t result = 1u << 31, sq = 1u << 23; /* x^0, x^8 */
    while (n) {
        if (n & 1) result = gf2_mul(sq, result);
        sq = gf2_mul(sq, sq);
        n >>= 1;
    }
    return result;
}

static uint32_t shift_block, shift_2block;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static void init_shifts(void) {
    shift_block = x8n(BLOCK);
    shift_2block = x8n(2 * BLOCK);
}

static uint64_t run(uint64_t c, const uint8_t *p, size_t n) {
    for (; n >= 8; n -= 8, p += 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        c = _mm_crc32_u64(c, v);
    }
    for (; n; n--) c = _mm_crc32_u8((uint32_t)c, *p++);
    return c;
}

uint32_t terse__crc32c_sse42(uint32_t crc, const void *buf, size_t len) {
    const uint8_t *p = buf;
    uint64_t c0 = (uint32_t)~crc;
    if (len >= 3 * BLOCK) pthread_once(&once, init_shifts);
    while (len >= 3 * BLOCK) {
        uint64_t c1 = 0, c2 = 0;
        for (size_t i = 0; i < BLOCK; i += 8) {
            uint64_t a, b, d;
            memcpy(&a, p + i, 8);
            memcpy(&b, p + BLOCK + i, 8);
            memcpy(&d, p + 2 * BLOCK + i, 8);
            c0 = _mm_crc32_u64(c0, a);
            c1 = _mm_crc32_u64(c1, b);
            c2 = _mm_crc32_u64(c2, d);
        }
        /* crc(A||B||C) = shift(c0, 2B) ^ shift(c1, B) ^ c2, on raw states. */
        c0 = gf2_mul(shift_2block, (uint32_t)c0) ^ gf2_mul(shift_block, (uint32_t)c1) ^ (uint32_t)c2;
        p += 3 * BLOCK;
        len -= 3 * BLOCK;
    }
    return ~(uint32_t)run(c0, p, len);
}
#endif
