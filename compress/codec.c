/* Codec lifecycle, the message envelope, and error feedback.
 *
 * Error feedback wraps any codec, plugins included, using only its encode
 * and decode: the residual buffer e first absorbs the gradient (e = g + e,
 * the vector actually compressed), then the message is decoded into it with
 * alpha = -1, leaving e = p - D(C(p)). No second buffer is needed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "compress/aggregate.h"
#include "compress/codec_internal.h"
#include "compress/spec.h"
#include "compress/wire.h"

unsigned terse_version(void) { return TERSE_VERSION_NUMBER; }

#define STR2_(x) #x
#define STR_(x) STR2_(x)
const char *terse_version_string(void) {
    return STR_(TERSE_VERSION_MAJOR) "." STR_(TERSE_VERSION_MINOR) "." STR_(TERSE_VERSION_PATCH);
}

terse_status terse_codec_create(const char *spec_text, size_t rows, size_t cols,
                                terse_codec **out) {
    if (!out) return TERSE_ERROR(TERSE_ERR_INVALID, "out pointer is NULL");
    *out = NULL;
    if (rows == 0 || cols == 0)
        return TERSE_ERROR(TERSE_ERR_INVALID, "tensor shape %zu x %zu has no elements", rows, cols);
    if (rows > TERSE_MAX_ELEMENTS || cols > TERSE_MAX_ELEMENTS / rows)
        return TERSE_ERROR(TERSE_ERR_INVALID,
                           "tensor shape %zu x %zu exceeds TERSE_MAX_ELEMENTS (2^36)", rows, cols);
    terse_spec spec;
    TERSE_CHECK(terse__spec_parse(spec_text, &spec));

    terse_status s;
    terse_codec *c = calloc(1, sizeof *c);
    if (!c) return TERSE_ERROR(TERSE_ERR_NOMEM, "allocating a codec");
    if (terse__registry_find(spec.name, &c->ops) != TERSE_OK) {
        char known[512];
        terse__registry_names(known, sizeof known);
        TERSE_FAIL_GOTO(s, fail, TERSE_ERR_INVALID, "unknown codec '%s' in spec '%s' (known: %s)",
                        spec.name, spec_text, known);
    }
    c->rows = rows;
    c->cols = cols;
    c->n = rows * cols;

    uint64_t ef = 0;
    TERSE_CHECK_GOTO(terse_spec_get_u64(&spec, "ef", 0, 0, 1, &ef), s, fail);
    c->ef = spec.ef = (int)ef;
    if (c->ops.flags & TERSE_CODEC_RANDOMIZED)
        TERSE_CHECK_GOTO(terse_spec_get_u64(&spec, "seed", 0, 0, UINT64_MAX, &c->seed), s, fail);

    char *canon = c->options;
    TERSE_CHECK_GOTO(c->ops.create(&spec, rows, cols, &c->self, canon, sizeof c->options), s,
                     fail);
    const char *unused = terse__spec_unused(&spec);
    if (unused)
        TERSE_FAIL_GOTO(s, fail, TERSE_ERR_INVALID, "codec '%s' has no option '%s' (spec '%s')",
                        spec.name, unused, spec_text);

    c->payload_bound = c->ops.bound(c->self);
    if (c->payload_bound > SIZE_MAX - TERSE_WIRE_HEADER_SIZE)
        TERSE_FAIL_GOTO(s, fail, TERSE_ERR_INTERNAL, "codec '%s' bound overflows", spec.name);
    if (c->ef) {
        c->residual = calloc(c->n, sizeof(float));
        if (!c->residual)
            TERSE_FAIL_GOTO(s, fail, TERSE_ERR_NOMEM, "allocating a %zu-element residual", c->n);
    }
    int w;
    if (c->ops.flags & TERSE_CODEC_RANDOMIZED)
        w = snprintf(c->spec, sizeof c->spec, "%s%s%s%sef=%d,seed=%llu", spec.name, ":", canon,
                     canon[0] ? "," : "", c->ef, (unsigned long long)c->seed);
    else
        w = snprintf(c->spec, sizeof c->spec, "%s:%s%sef=%d", spec.name, canon, canon[0] ? "," : "",
                     c->ef);
    (void)w;
    *out = c;
    return TERSE_OK;
fail:
    terse_codec_free(c);
    return s;
}

void terse_codec_free(terse_codec *c) {
    if (!c) return;
    terse__codec_free_segments(c);
    if (c->self) c->ops.destroy(c->self);
    free(c->residual);
    free(c);
}

size_t terse_codec_bound(const terse_codec *c) {
    return c ? c->payload_bound + TERSE_WIRE_HEADER_SIZE : 0;
}

size_t terse_codec_elements(const terse_codec *c) { return c ? c->n : 0; }

const char *terse_codec_spec(const terse_codec *c) { return c ? c->spec : ""; }

terse_status terse_codec_set_stream(terse_codec *c, uint64_t tensor, uint32_t rank) {
    if (!c) return TERSE_ERROR(TERSE_ERR_INVALID, "codec is NULL");
    c->tensor = tensor;
    c->rank = rank;
    return TERSE_OK;
}

uint64_t terse_codec_step(const terse_codec *c) { return c ? c->step : 0; }

const float *terse_codec_residual(const terse_codec *c) { return c ? c->residual : NULL; }

void terse_codec_reset_residual(terse_codec *c) {
    if (c && c->residual) memset(c->residual, 0, c->n * sizeof(float));
    if (c && c->segs && c->segs->hop)
        memset(c->segs->hop, 0, c->segs->len[c->segs->rank] * sizeof(float));
}

terse_status terse_codec_get_traits(const terse_codec *c, terse_codec_traits *t) {
    if (!c || !t) return TERSE_ERROR(TERSE_ERR_INVALID, "NULL argument");
    if (t->size < offsetof(terse_codec_traits, bits_per_element) + sizeof(double))
        return TERSE_ERROR(TERSE_ERR_INVALID, "traits size %zu is too small", t->size);
    t->id = c->ops.id;
    t->name = c->ops.name;
    t->summable = (c->ops.flags & TERSE_CODEC_SUMMABLE) != 0;
    t->error_feedback = c->ef;
    t->randomized = (c->ops.flags & TERSE_CODEC_RANDOMIZED) != 0;
    t->bits_per_element = c->ops.bits_per_element
                              ? c->ops.bits_per_element(c->self)
                              : 8.0 * (double)c->payload_bound / (double)c->n;
    if (t->size >= offsetof(terse_codec_traits, segment_options) + sizeof(int)) {
        t->fixed_size = terse__codec_fixed_size(c);
        t->segment_align = terse__codec_can_cut(c, 2) ? c->ops.segment_align(c->self) : 0;
        t->segment_options = c->ops.segment_options != NULL;
    }
    return TERSE_OK;
}

terse_status terse__codec_check_input(const terse_codec *c, const float *grad) {
    if (c->residual && grad < c->residual + c->n && c->residual < grad + c->n)
        return TERSE_ERROR(TERSE_ERR_INVALID,
                           "codec '%s': the gradient overlaps the codec's own residual "
                           "(terse_codec_residual is read only)",
                           c->ops.name);
    return TERSE_OK;
}

terse_status terse_encode(terse_codec *c, const float *grad, void *dst, size_t cap, size_t *len) {
    if (!c || !grad || !dst || !len) return TERSE_ERROR(TERSE_ERR_INVALID, "NULL argument");
    *len = 0;
    size_t bound = c->payload_bound + TERSE_WIRE_HEADER_SIZE;
    if (cap < bound)
        return TERSE_ERROR(TERSE_ERR_DST_TOO_SMALL,
                           "codec '%s' needs %zu bytes (terse_codec_bound), buffer has %zu",
                           c->ops.name, bound, cap);
    uint8_t *msg = dst;
    const float *x = grad;
    TERSE_CHECK(terse__codec_check_input(c, grad));
    if (c->ef) {
        float *e = c->residual;
        for (size_t i = 0; i < c->n; i++) e[i] += grad[i];
        x = e;
    }
    terse_encode_ctx ctx = {sizeof ctx, c->seed, c->step, c->tensor, c->rank};
    size_t plen = 0;
    terse_status s = c->ops.encode(c->self, &ctx, x, msg + TERSE_WIRE_HEADER_SIZE,
                                   c->payload_bound, &plen);
    if (s == TERSE_OK && plen > c->payload_bound)
        s = TERSE_ERROR(TERSE_ERR_INTERNAL, "codec '%s' wrote %zu bytes past its bound %zu",
                        c->ops.name, plen, c->payload_bound);
    if (s == TERSE_OK && c->ef)
        s = c->ops.decode(c->self, msg + TERSE_WIRE_HEADER_SIZE, plen, c->residual, -1.0f, 1);
    if (s != TERSE_OK) {
        if (c->ef) /* undo the absorb so a failed call changes nothing */
            for (size_t i = 0; i < c->n; i++) c->residual[i] -= grad[i];
        return s;
    }
    terse__wire_seal(msg, c->ops.id, c->n, plen);
    c->step++;
    *len = plen + TERSE_WIRE_HEADER_SIZE;
    return TERSE_OK;
}

terse_status terse_decode(terse_codec *c, const void *src, size_t len, float *dst, float alpha,
                          int accumulate) {
    if (!c || !dst) return TERSE_ERROR(TERSE_ERR_INVALID, "NULL argument");
    terse_wire_info info;
    TERSE_CHECK(terse__wire_open(src, len, c->ops.id, c->n, c->payload_bound, &info));
    return c->ops.decode(c->self, (const uint8_t *)src + TERSE_WIRE_HEADER_SIZE,
                         (size_t)info.payload_len, dst, alpha, accumulate);
}
