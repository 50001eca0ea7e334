/* Fuzz terse_codec_state_load for every codec, with and without ef.
 *
 * Mode bits (input byte 2, see fuzz_common.h):
 *   bit 0  ef=1
 *   bit 1  reseal: the data is [step u64, tensor u64, rank u32] followed by
 *          the residual and codec-private bytes. The harness writes this
 *          codec's own header (magic, version, id, flags, count, seed,
 *          private length) and a correct checksum, so what gets fuzzed is
 *          the codec's private state_load validation and what encode then
 *          does with the state. Without it the data is a whole state.
 *
 * Findings (abort): an unexpected status; a refused load that changed the
 * codec; a loaded state the codec cannot encode from; sanitizer reports.
 * After a successful load the codec is restored, so inputs stay independent. */
#include <stdlib.h>
#include <string.h>

#include "common/bytes.h"
#include "common/crc32c.h"
#include "fuzz_common.h"

#include "compress/state.h"
#define STATE_HEAD TERSE__STATE_HEAD

static uint8_t *save(terse_codec *c, size_t *len) {
    size_t size = terse_codec_state_size(c);
    uint8_t *buf = malloc(size);
    if (terse_codec_state_save(c, buf, size, len) != TERSE_OK || *len != size)
        fz_fail("%s: state_save failed: %s", terse_codec_spec(c), terse_last_error());
    return buf;
}

static void expect_state(terse_codec *c, const uint8_t *want, size_t len, const char *what) {
    size_t l;
    uint8_t *now = save(c, &l);
    if (l != len || memcmp(now, want, len) != 0)
        fz_fail("%s: %s changed the codec", terse_codec_spec(c), what);
    free(now);
}

/* The loaded state must be usable: one encode and decode. */
static void use(terse_codec *c) {
    size_t n = terse_codec_elements(c), cap = terse_codec_bound(c), len;
    float *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y);
    uint8_t *msg = malloc(cap);
    for (size_t j = 0; j < n; j++) x[j] = (float)((j * 37) % 11) - 5.0f;
    terse_status s = terse_encode(c, x, msg, cap, &len);
    if (s != TERSE_OK)
        fz_fail("%s: encode after a successful load gave %s (%s)", terse_codec_spec(c),
                terse_status_name(s), terse_last_error());
    s = terse_decode(c, msg, len, y, 1.0f, 0);
    if (s != TERSE_OK)
        fz_fail("%s: decode after a successful load gave %s (%s)", terse_codec_spec(c),
                terse_status_name(s), terse_last_error());
    free(x), free(y), free(msg);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < FZ_PREFIX) return 0;
    unsigned mode = data[2];
    terse_codec *c = fz_codec(data[0], data[1], mode & 1);
    if (!c) return 0;
    const uint8_t *body = data + FZ_PREFIX;
    size_t blen = size - FZ_PREFIX, plen;
    uint8_t *pristine = save(c, &plen), *blob;
    size_t len;
    if (mode & 2) {
        len = plen;
        blob = calloc(1, len);
        memcpy(blob, pristine, STATE_HEAD);
        size_t k = 0;
        for (size_t at = 32; at < 52 && k < blen; at++) blob[at] = body[k++];
        for (size_t at = STATE_HEAD; at < len - 4 && k < blen; at++) blob[at] = body[k++];
        terse__put_u32(blob + len - 4, terse__crc32c_update(0, blob, len - 4));
    } else {
        len = blen;
        blob = malloc(len ? len : 1);
        if (len) memcpy(blob, body, len);
    }
    terse_status s = terse_codec_state_load(c, blob, len);
    const char *spec = terse_codec_spec(c);
    int allowed = s == TERSE_OK || s == TERSE_ERR_CORRUPT || s == TERSE_ERR_INVALID;
    if (!(mode & 2))
        allowed |= s == TERSE_ERR_TRUNCATED || s == TERSE_ERR_MAGIC || s == TERSE_ERR_VERSION ||
                   s == TERSE_ERR_CODEC_MISMATCH || s == TERSE_ERR_SHAPE;
    if (!allowed)
        fz_fail("%s: state_load gave %s (%s)", spec, terse_status_name(s), terse_last_error());
    if (s == TERSE_OK) {
        use(c);
        if (terse_codec_state_load(c, pristine, plen) != TERSE_OK)
            fz_fail("%s: cannot restore the pristine state: %s", spec, terse_last_error());
    }
    expect_state(c, pristine, plen, s == TERSE_OK ? "restoring" : "a refused load");
    free(blob), free(pristine);
    return 0;
}
