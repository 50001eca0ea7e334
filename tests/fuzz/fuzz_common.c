#include "fuzz_common.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Small buckets and blocks so that small shapes still hold several of them
 * and a partial tail; both index encodings of topk; both PowerSGD modes. */
const char *const fz_specs[] = {
    "none",
    "fp16",
    "bf16",
    "int8:bucket=8",
    "int8:bucket=512",
    "qsgd:bits=2,bucket=8",
    "qsgd:bits=5,bucket=16",
    "qsgd:bits=8,bucket=512",
    "terngrad:bucket=8",
    "terngrad",
    "sign:bucket=8",
    "sign",
    "topk:ratio=0.1",
    "topk:ratio=0.6",
    "topk:k=1",
    "randk:ratio=0.2",
    "randk:k=3,unbiased=0",
    "powersgd:rank=1",
    "powersgd:rank=2",
    "vq:dim=2,bits=1",
    "vq:dim=8,bits=8",
    "vq:dim=5,bits=12",
};
const size_t fz_nspecs = sizeof fz_specs / sizeof fz_specs[0];

const fz_shape fz_shapes[] = {
    {1, 1}, {2, 1}, {7, 1},   {8, 1},  {33, 1}, {100, 1}, {1, 9},
    {3, 5}, {5, 3}, {16, 16}, {9, 31}, {64, 2}, {37, 11}, {12, 40},
};
const size_t fz_nshapes = sizeof fz_shapes / sizeof fz_shapes[0];

#define MAX_SPECS 32
#define MAX_SHAPES 16

void fz_spec_text(char *buf, size_t cap, size_t spec, int ef) {
    const char *s = fz_specs[spec % fz_nspecs];
    snprintf(buf, cap, "%s%s", s, ef ? (strchr(s, ':') ? ",ef=1" : ":ef=1") : "");
}

terse_codec *fz_codec_new(size_t spec, size_t shape, int ef) {
    char text[128];
    fz_spec_text(text, sizeof text, spec, ef);
    const fz_shape *sh = &fz_shapes[shape % fz_nshapes];
    terse_codec *c = NULL;
    if (terse_codec_create(text, sh->rows, sh->cols, &c) != TERSE_OK) return NULL;
    return c;
}

terse_codec *fz_codec(size_t spec, size_t shape, int ef) {
    static terse_codec *cache[MAX_SPECS][MAX_SHAPES][2];
    static unsigned char tried[MAX_SPECS][MAX_SHAPES][2];
    spec %= fz_nspecs;
    shape %= fz_nshapes;
    ef = !!ef;
    if (!tried[spec][shape][ef]) {
        tried[spec][shape][ef] = 1;
        cache[spec][shape][ef] = fz_codec_new(spec, shape, ef);
    }
    return cache[spec][shape][ef];
}

void fz_fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("FUZZ FINDING: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    abort();
}

/* The tables must fit the cache. */
_Static_assert(sizeof fz_specs / sizeof fz_specs[0] <= MAX_SPECS, "grow MAX_SPECS");
_Static_assert(sizeof fz_shapes / sizeof fz_shapes[0] <= MAX_SHAPES, "grow MAX_SHAPES");
