/* codec_pipe: the C side of python/tests/test_codec.py. Reads rows*cols
 * fp32 values (little endian, raw) from stdin, creates the codec from the
 * spec, sets its stream to (tensor, rank), encodes `steps` times (each
 * encode of the same input, so error feedback and streams move on), and
 * writes every message to stdout, each preceded by its length as a
 * little-endian uint64, then the decode of the last message as raw fp32.
 *
 *   codec_pipe SPEC ROWS COLS TENSOR RANK STEPS < floats > messages
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "terse.h"

static int fail(const char *what, terse_status st)
{
    fprintf(stderr, "codec_pipe: %s: %s: %s\n", what, terse_status_name(st), terse_last_error());
    return 1;
}

int main(int argc, char **argv)
{
    if (argc != 7 || strcmp(argv[1], "--help") == 0) {
        fprintf(stderr, "usage: codec_pipe SPEC ROWS COLS TENSOR RANK STEPS < floats > messages\n");
        return argc == 2 ? 0 : 2;
    }
    size_t rows = strtoull(argv[2], NULL, 10), cols = strtoull(argv[3], NULL, 10);
    uint64_t tensor = strtoull(argv[4], NULL, 10);
    uint32_t rank = (uint32_t)strtoul(argv[5], NULL, 10);
    int steps = atoi(argv[6]);
    terse_codec *c = NULL;
    terse_status st = terse_codec_create(argv[1], rows, cols, &c);
    if (st != TERSE_OK)
        return fail("create", st);
    if ((st = terse_codec_set_stream(c, tensor, rank)) != TERSE_OK)
        return fail("set_stream", st);
    size_t n = rows * cols, cap = terse_codec_bound(c), len = 0;
    float *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y);
    unsigned char *msg = malloc(cap);
    if (!x || !y || !msg || fread(x, sizeof *x, n, stdin) != n) {
        fprintf(stderr, "codec_pipe: expected %zu floats on stdin\n", n);
        return 1;
    }
    for (int s = 0; s < steps; s++) {
        if ((st = terse_encode(c, x, msg, cap, &len)) != TERSE_OK)
            return fail("encode", st);
        uint64_t l = len;
        fwrite(&l, sizeof l, 1, stdout);
        fwrite(msg, 1, len, stdout);
    }
    if ((st = terse_decode(c, msg, len, y, 1.0f, 0)) != TERSE_OK)
        return fail("decode", st);
    fwrite(y, sizeof *y, n, stdout);
    free(x);
    free(y);
    free(msg);
    terse_codec_free(c);
    return fflush(stdout) == 0 ? 0 : 1;
}
