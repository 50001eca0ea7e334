/* What the fuzz targets, their replay drivers and make_corpus share.
 *
 * Every target reads its input the same way:
 *   byte 0   spec index  (mod fz_nspecs)
 *   byte 1   shape index (mod fz_nshapes)
 *   byte 2   mode bits, defined by each target
 *   byte 3.. the target's data
 * so one fuzzer explores every codec, and a crash input names its codec in
 * its first two bytes. */
#ifndef TERSE_FUZZ_COMMON_H
#define TERSE_FUZZ_COMMON_H

#include <stddef.h>
#include <stdint.h>

#include "terse.h"

#define FZ_PREFIX 3u

/* The libFuzzer entry point each target defines. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

extern const char *const fz_specs[];
extern const size_t fz_nspecs;

typedef struct {
    size_t rows, cols;
} fz_shape;
extern const fz_shape fz_shapes[];
extern const size_t fz_nshapes;

/* The spec text of entry `spec`, with ",ef=1" (or ":ef=1") when ef. */
void fz_spec_text(char *buf, size_t cap, size_t spec, int ef);

/* A codec for (spec, shape, ef), created on first use and kept for the
 * life of the process (creation dominates a fuzz iteration otherwise).
 * NULL when it cannot be created: a stub, or options that do not fit the
 * shape (k > n). Callers must leave it as they found it. */
terse_codec *fz_codec(size_t spec, size_t shape, int ef);

/* A fresh codec the caller frees (for targets that change codec state). */
terse_codec *fz_codec_new(size_t spec, size_t shape, int ef);

/* Report a finding and abort, so libFuzzer saves the input. */
void fz_fail(const char *fmt, ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 1, 2), noreturn))
#endif
    ;

#endif
