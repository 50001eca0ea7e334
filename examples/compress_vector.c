/* The smallest useful terse program: compress a gradient with top-k and
 * error feedback, decode it, and report size and error.
 *
 *   compress_vector [SPEC] [N]     (default "topk:ratio=0.01,ef=1", 1000000) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <terse.h>

int main(int argc, char **argv) {
    if (argc > 1 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
        printf("usage: %s [SPEC] [N]\ncompress N floats with codec SPEC and report ratio and "
               "error\n", argv[0]);
        return 0;
    }
    const char *spec = argc > 1 ? argv[1] : "topk:ratio=0.01,ef=1";
    size_t n = argc > 2 ? strtoull(argv[2], NULL, 10) : 1000000;
    terse_codec *codec;
    terse_status s = terse_codec_create(spec, n, 1, &codec);
    if (s != TERSE_OK) {
        fprintf(stderr, "terse_codec_create: %s\n", terse_last_error());
        return 1;
    }
    float *grad = malloc(n * sizeof *grad), *out = malloc(n * sizeof *out);
    size_t cap = terse_codec_bound(codec), len = 0;
    void *msg = malloc(cap);
    for (size_t i = 0; i < n; i++) grad[i] = sinf((float)i * 0.001f) / (1.0f + (float)(i % 97));
    if ((s = terse_encode(codec, grad, msg, cap, &len)) != TERSE_OK ||
        (s = terse_decode(codec, msg, len, out, 1.0f, 0)) != TERSE_OK) {
        fprintf(stderr, "terse: %s\n", terse_last_error());
        return 1;
    }
    double err = 0, nrm = 0;
    for (size_t i = 0; i < n; i++) {
        err += (double)(grad[i] - out[i]) * (grad[i] - out[i]);
        nrm += (double)grad[i] * grad[i];
    }
    printf("terse %s  codec %s  %zu floats -> %zu bytes (%.1fx)  rel.error %.4f\n",
           terse_version_string(), terse_codec_spec(codec), n, len, 4.0 * (double)n / (double)len,
           sqrt(err / nrm));
    free(grad);
    free(out);
    free(msg);
    terse_codec_free(codec);
    return 0;
}
