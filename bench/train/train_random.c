/* The trainer's random streams: every draw (sharding, shuffling, DP noise)
 * comes from splitmix64 keyed by the run's seed and a purpose, so runs repeat
 * exactly on every machine. */
#include <math.h>
#include <stdint.h>

#include "train/train.h"

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

uint64_t train_stream_key(uint64_t seed, uint64_t a, uint64_t b) {
    uint64_t s = seed ^ 0x7472616e6974ull; /* a different stream from the model's init */
    s = splitmix(&s) ^ a;
    s = splitmix(&s) ^ b;
    return splitmix(&s);
}

/* Fisher-Yates with 64-bit draws (the modulo bias is below 2^-40). */
void train_shuffle(size_t *v, size_t n, uint64_t key) {
    for (size_t i = n; i > 1; i--) {
        size_t j = (size_t)(splitmix(&key) % i);
        size_t t = v[i - 1];
        v[i - 1] = v[j];
        v[j] = t;
    }
}

/* Standard normal draws, Box-Muller on 53-bit uniforms. */
static double uniform01(uint64_t *s) {
    return ((double)(splitmix(s) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

void train_add_gaussian(float *x, size_t n, double sd, uint64_t *s) {
    for (size_t i = 0; i < n; i += 2) {
        double r = sqrt(-2.0 * log(uniform01(s))), t = 6.283185307179586 * uniform01(s);
        x[i] += (float)(sd * r * cos(t));
        if (i + 1 < n) x[i + 1] += (float)(sd * r * sin(t));
    }
}

double train_uniform(uint64_t *s) { return uniform01(s); }

static double normal01(uint64_t *s) {
    return sqrt(-2.0 * log(uniform01(s))) * cos(6.283185307179586 * uniform01(s));
}

double train_gamma(double a, uint64_t *s) {
    if (a < 1.0) /* boost: Gamma(a) = Gamma(a + 1) U^(1/a) */
        return train_gamma(a + 1.0, s) * pow(uniform01(s), 1.0 / a);
    const double d = a - 1.0 / 3.0, c = 1.0 / sqrt(9.0 * d);
    for (;;) {
        double x = normal01(s), v = 1.0 + c * x;
        if (v <= 0) continue;
        v = v * v * v;
        if (log(uniform01(s)) < 0.5 * x * x + d - d * v + d * log(v)) return d * v;
    }
}
