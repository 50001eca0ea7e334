/* Counter-based random numbers: a value is a pure function of (key, counter),
 * so any rank can reproduce any draw without sharing state, and a stream can
 * be split across threads or SIMD lanes with no sequencing.
 *
 * Keys come from terse__rng_key(seed, step, tensor, rank). Within a key,
 * 64-bit draws use the SplitMix64 output function on key + counter * golden
 * (Steele et al., "Fast splittable pseudorandom number generators", 2014).
 * For SIMD kernels, terse__rng_u32(subkey32, i) is a 32-bit integer hash
 * (Wellons' "lowbias32" finaliser) that needs only 32-bit multiplies; each
 * bucket of a tensor derives its own subkey with terse__rng_subkey so that
 * i stays below 2^32. */
#ifndef TERSE_COMMON_RNG_H
#define TERSE_COMMON_RNG_H

#include <stdint.h>

static inline uint64_t terse__mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static inline uint64_t terse__rng_key(uint64_t seed, uint64_t step,
                                      uint64_t tensor, uint64_t rank) {
    uint64_t k = terse__mix64(seed + 0x9e3779b97f4a7c15ULL);
    k = terse__mix64(k ^ (step + 0x632be59bd9b4e019ULL));
    k = terse__mix64(k ^ (tensor + 0x8cb92ba72f3d8dd7ULL));
    return terse__mix64(k ^ (rank + 0xd1b54a32d192ed03ULL));
}

/* The i-th 64-bit draw of stream `key`. */
static inline uint64_t terse__rng_u64(uint64_t key, uint64_t i) {
    return terse__mix64(key + (i + 1) * 0x9e3779b97f4a7c15ULL);
}

/* A 32-bit subkey for bucket b of stream `key`. */
static inline uint32_t terse__rng_subkey(uint64_t key, uint64_t b) {
    return (uint32_t)(terse__rng_u64(key ^ 0x5851f42d4c957f2dULL, b) >> 32);
}

/* The i-th 32-bit draw of sub-stream `subkey`. Lanes vectorise this
 * directly (two 32-bit multiplies, three shifts, xors, one add). */
static inline uint32_t terse__rng_u32(uint32_t subkey, uint32_t i) {
    uint32_t x = subkey + i * 0x9e3779b9u;
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    return x;
}

/* Uniform in [0, 1) with 24 bits. */
static inline float terse__rng_unit(uint32_t r) {
    return (float)(r >> 8) * (1.0f / 16777216.0f);
}

#endif
