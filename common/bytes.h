/* Little-endian loads and stores that never assume alignment. */
#ifndef TERSE_COMMON_BYTES_H
#define TERSE_COMMON_BYTES_H

#include <stdint.h>
#include <string.h>

static inline void terse__put_u16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static inline void terse__put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline void terse__put_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline uint16_t terse__get_u16(const uint8_t *p) {
    return (uint16_t)(p[0] | (p[1] << 8));
}
static inline uint32_t terse__get_u32(const uint8_t *p) {
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}
static inline uint64_t terse__get_u64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}
static inline void terse__put_f32(uint8_t *p, float f) {
    uint32_t v;
    memcpy(&v, &f, 4);
    terse__put_u32(p, v);
}
static inline float terse__get_f32(const uint8_t *p) {
    uint32_t v = terse__get_u32(p);
    float f;
    memcpy(&f, &v, 4);
    return f;
}

/* Host is little endian on every target we build for (x86-64, aarch64);
 * bulk float arrays are therefore memcpy'd. This guard keeps it honest. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "terse assumes a little-endian host for bulk payload copies"
#endif

#endif
