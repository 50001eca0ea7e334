/* Fuzz terse_encode: the data, repeated to fill the tensor, is the gradient
 * (every float bit pattern: NaN, Inf, denormals, ties). The message must
 * fit terse_codec_bound, carry the right header, and decode.
 *
 * Mode bits (input byte 2, see fuzz_common.h):
 *   bit 0  ef=1
 *   bit 1  encode a second step (sees the residual / warm start of the first)
 *   bit 2  stream: tensor 7, rank 3 instead of 0, 0
 *
 * A fresh codec per input: encoding changes codec state. */
#include <stdlib.h>
#include <string.h>

#include "compress/wire.h"
#include "fuzz_common.h"

static void step(terse_codec *c, const float *x, uint8_t *msg, size_t cap, float *y, float *z) {
    const char *spec = terse_codec_spec(c);
    size_t n = terse_codec_elements(c), len = 0;
    terse_status s = terse_encode(c, x, msg, cap, &len);
    if (s != TERSE_OK)
        fz_fail("%s: encode gave %s (%s)", spec, terse_status_name(s), terse_last_error());
    if (len > cap || len < TERSE_WIRE_HEADER_SIZE)
        fz_fail("%s: message of %zu bytes, bound %zu", spec, len, cap);
    terse_codec_traits t = TERSE_CODEC_TRAITS_INIT;
    terse_wire_info info;
    if (terse_codec_get_traits(c, &t) != TERSE_OK ||
        terse_wire_inspect(msg, len, &info) != TERSE_OK || info.codec_id != t.id ||
        info.count != n || info.payload_len != len - TERSE_WIRE_HEADER_SIZE)
        fz_fail("%s: the message header is wrong", spec);
    s = terse_decode(c, msg, len, y, 1.0f, 0);
    if (s != TERSE_OK)
        fz_fail("%s: its own message gave %s (%s)", spec, terse_status_name(s), terse_last_error());
    if (terse_decode(c, msg, len, z, 1.0f, 0) != TERSE_OK || memcmp(y, z, n * sizeof *y) != 0)
        fz_fail("%s: decoding the same message twice gave different results", spec);
    if (t.id == 1 && !t.error_feedback && memcmp(x, y, n * sizeof *x) != 0)
        fz_fail("%s: 'none' is not lossless", spec);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < FZ_PREFIX) return 0;
    unsigned mode = data[2];
    terse_codec *c = fz_codec_new(data[0], data[1], mode & 1);
    if (!c) return 0;
    if (mode & 4) terse_codec_set_stream(c, 7, 3);
    const uint8_t *body = data + FZ_PREFIX;
    size_t blen = size - FZ_PREFIX, n = terse_codec_elements(c), cap = terse_codec_bound(c);
    float *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y), *z = malloc(n * sizeof *z);
    uint8_t *msg = malloc(cap), *xb = (uint8_t *)x;
    for (size_t k = 0; k < n * sizeof *x; k++) xb[k] = blen ? body[k % blen] : 0;
    step(c, x, msg, cap, y, z);
    if (mode & 2) step(c, x, msg, cap, y, z);
    free(x), free(y), free(z), free(msg);
    terse_codec_free(c);
    return 0;
}
