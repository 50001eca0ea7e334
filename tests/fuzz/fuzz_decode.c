/* Fuzz terse_decode (and terse_wire_inspect) for every codec.
 *
 * Mode bits (input byte 2, see fuzz_common.h):
 *   bit 0     reseal: the data is a payload only. The harness puts a valid
 *             header in front (this codec's id, the shape's count, the
 *             payload length) with a correct CRC, so what gets fuzzed is
 *             the codec's own payload validation -- a peer can always
 *             recompute a CRC. Without it the data is a whole message and
 *             mostly exercises the envelope.
 *   bit 1     accumulate
 *   bits 2-3  alpha: 1, -1, 0.5, 0
 *
 * Findings (abort): a status terse_decode may not return for the input; a
 * header or checksum fault that wrote to dst; a successful decode that
 * gives other bits the second time; whatever the sanitizers catch. */
#include <stdlib.h>
#include <string.h>

#include "compress/wire.h"
#include "fuzz_common.h"

/* Faults the core detects from the header alone (or its checksum), before
 * the codec runs: dst must be untouched. */
static int envelope_fault(terse_status s, terse_status inspected) {
    return s == TERSE_ERR_TRUNCATED || s == TERSE_ERR_MAGIC || s == TERSE_ERR_VERSION ||
           s == TERSE_ERR_CODEC_MISMATCH || s == TERSE_ERR_SHAPE ||
           (s == TERSE_ERR_CORRUPT && inspected != TERSE_OK);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < FZ_PREFIX) return 0;
    terse_codec *c = fz_codec(data[0], data[1], 0);
    if (!c) return 0;
    unsigned mode = data[2];
    const uint8_t *body = data + FZ_PREFIX;
    size_t blen = size - FZ_PREFIX, n = terse_codec_elements(c), len;
    uint8_t *msg;
    if (mode & 1) {
        terse_codec_traits t = TERSE_CODEC_TRAITS_INIT;
        if (terse_codec_get_traits(c, &t) != TERSE_OK) fz_fail("get_traits failed");
        len = TERSE_WIRE_HEADER_SIZE + blen;
        msg = malloc(len);
        if (blen) memcpy(msg + TERSE_WIRE_HEADER_SIZE, body, blen);
        terse__wire_seal(msg, t.id, n, blen);
    } else {
        len = blen; /* an exact-size copy, so ASan sees reads past the end */
        msg = malloc(len ? len : 1);
        if (len) memcpy(msg, body, len);
    }
    static const float alphas[4] = {1.0f, -1.0f, 0.5f, 0.0f};
    float alpha = alphas[(mode >> 2) & 3];
    int acc = (mode >> 1) & 1;
    float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b), *init = malloc(n * sizeof *init);
    for (size_t j = 0; j < n; j++) init[j] = a[j] = b[j] = 0.25f * (float)j - 1.0f;

    terse_wire_info info;
    terse_status si = terse_wire_inspect(msg, len, &info);
    terse_status s = terse_decode(c, msg, len, a, alpha, acc);
    const char *spec = terse_codec_spec(c);
    if (mode & 1) {
        if (s != TERSE_OK && s != TERSE_ERR_CORRUPT)
            fz_fail("%s: resealed payload of %zu bytes gave %s (%s)", spec, blen,
                    terse_status_name(s), terse_last_error());
    } else if (s != TERSE_OK && s != TERSE_ERR_CORRUPT && s != TERSE_ERR_TRUNCATED &&
               s != TERSE_ERR_MAGIC && s != TERSE_ERR_VERSION && s != TERSE_ERR_CODEC_MISMATCH &&
               s != TERSE_ERR_SHAPE) {
        fz_fail("%s: message of %zu bytes gave %s (%s)", spec, len, terse_status_name(s),
                terse_last_error());
    }
    if (s == TERSE_OK && si != TERSE_OK)
        fz_fail("%s: decode accepted what terse_wire_inspect refused (%s)", spec,
                terse_status_name(si));
    if (envelope_fault(s, si) && memcmp(a, init, n * sizeof *a) != 0)
        fz_fail("%s: decode wrote dst although the envelope was bad (%s)", spec,
                terse_status_name(s));
    if (s == TERSE_OK) {
        terse_status s2 = terse_decode(c, msg, len, b, alpha, acc);
        if (s2 != TERSE_OK || memcmp(a, b, n * sizeof *a) != 0)
            fz_fail("%s: decoding the same message twice gave different results", spec);
    }
    free(a), free(b), free(init), free(msg);
    return 0;
}
