/* Writes a seed corpus for each fuzz target into OUT/<target>/: for every
 * spec in fz_specs, at three shapes, valid messages (whole, and payload only
 * for reseal mode), gradients for the round trip, and saved states with and
 * without ef after two steps. CTest runs it before the replay tests;
 * run.sh uses it to seed a campaign. Seeds are regenerated rather than
 * committed because they must follow the codecs' current formats.
 *
 *     usage: make_corpus OUT */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/rng.h"
#include "compress/wire.h"
#include "compress/state.h"
#include "fuzz_common.h"

static const char *out_dir;
static size_t written;

static void make_dir(const char *path) {
    if (mkdir(path, 0755) != 0 && errno != EEXIST) {
        perror(path);
        exit(1);
    }
}

/* OUT/target/sSS-hHH-mMM[-tag].bin = prefix bytes + a + b. */
static void put(const char *target, size_t s, size_t h, unsigned mode, const void *a, size_t alen,
                const void *b, size_t blen) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s/s%02zu-h%02zu-m%02x.bin", out_dir, target, s, h, mode);
    FILE *f = fopen(path, "wb");
    if (!f) {
        perror(path);
        exit(1);
    }
    uint8_t prefix[FZ_PREFIX] = {(uint8_t)s, (uint8_t)h, (uint8_t)mode};
    fwrite(prefix, 1, sizeof prefix, f);
    if (alen) fwrite(a, 1, alen, f);
    if (blen) fwrite(b, 1, blen, f);
    if (fclose(f) != 0) {
        perror(path);
        exit(1);
    }
    written++;
}

static void gradient(float *x, size_t n, uint64_t seed) {
    uint64_t key = terse__rng_key(seed, 0, 0, 0);
    for (size_t i = 0; i < n; i++)
        x[i] = (float)((int64_t)(terse__rng_u64(key, i) >> 40) - (1 << 23)) / (float)(1 << 22);
}

static void seeds_for(size_t s, size_t h) {
    terse_codec *c = fz_codec_new(s, h, 0);
    if (!c) return; /* a stub, or the spec does not fit the shape */
    size_t n = terse_codec_elements(c), cap = terse_codec_bound(c), len;
    float *x = malloc(n * sizeof *x);
    uint8_t *msg = malloc(cap);
    gradient(x, n, s * 100 + h);
    if (terse_encode(c, x, msg, cap, &len) != TERSE_OK) {
        fprintf(stderr, "encode %s failed: %s\n", terse_codec_spec(c), terse_last_error());
        exit(1);
    }
    put("fuzz_decode", s, h, 0, msg, len, NULL, 0);
    put("fuzz_decode", s, h, 1, msg + TERSE_WIRE_HEADER_SIZE, len - TERSE_WIRE_HEADER_SIZE, NULL,
        0);
    /* A handful of floats is enough: the round trip repeats them. */
    put("fuzz_roundtrip", s, h, 3, x, (n < 24 ? n : 24) * sizeof *x, NULL, 0);
    terse_codec_free(c);
    for (int ef = 0; ef <= 1; ef++) {
        c = fz_codec_new(s, h, ef);
        if (!c) continue;
        for (int t = 0; t < 2; t++)
            if (terse_encode(c, x, msg, cap, &len) != TERSE_OK) exit(1);
        size_t size = terse_codec_state_size(c);
        uint8_t *st = malloc(size);
        if (terse_codec_state_save(c, st, size, &len) != TERSE_OK) exit(1);
        put("fuzz_state", s, h, (unsigned)ef, st, len, NULL, 0);
        /* reseal mode: step/tensor/rank, then everything after the header */
        put("fuzz_state", s, h, (unsigned)ef | 2u, st + 32, 20, st + TERSE__STATE_HEAD, len - TERSE__STATE_HEAD - 4);
        free(st);
        terse_codec_free(c);
    }
    free(x), free(msg);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
        return 2;
    }
    out_dir = argv[1];
    make_dir(out_dir);
    static const char *const targets[] = {"fuzz_decode", "fuzz_state", "fuzz_roundtrip"};
    for (size_t t = 0; t < 3; t++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", out_dir, targets[t]);
        make_dir(path);
    }
    for (size_t s = 0; s < fz_nspecs; s++) {
        /* a vector, a small matrix, and one shape that moves with s */
        seeds_for(s, 4);
        seeds_for(s, 10);
        if (s % fz_nshapes != 4 && s % fz_nshapes != 10) seeds_for(s, s % fz_nshapes);
    }
    printf("make_corpus: wrote %zu seeds to %s\n", written, out_dir);
    return 0;
}
