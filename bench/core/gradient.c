/* The benchmark's input: a fixed pseudo-random Gaussian-like gradient, made
 * here rather than with a library RNG so the input never changes when terse's
 * own RNG does. */
#include "core/bench.h"

/* splitmix64 of a counter: every element is a pure function of (seed, i). */
static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
}

void bench_gradient_fill(float *x, size_t n, uint64_t seed) {
    /* Irwin-Hall: the sum of four 16-bit uniforms is close to normal. Each
     * has variance (2^32 - 1) / 12, so the sum has standard deviation
     * 2^16 / sqrt(3) (to 1e-10); centre it and scale to unit variance. */
    const double mean = 4.0 * 65535.0 / 2.0;
    const double inv_sd = 1.7320508075688772 / 65536.0;
    uint64_t base = mix64(seed ^ 0x7e55e0b5e4c4a11bu);
    for (size_t i = 0; i < n; i++) {
        uint64_t r = mix64(base + 0x9e3779b97f4a7c15u * (uint64_t)(i + 1));
        uint32_t s = (uint32_t)(r & 0xffff) + (uint32_t)((r >> 16) & 0xffff) +
                     (uint32_t)((r >> 32) & 0xffff) + (uint32_t)(r >> 48);
        x[i] = (float)(((double)s - mean) * inv_sd);
    }
}
