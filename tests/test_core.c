/* The codec core: status strings, spec parsing, the registry, the wire
 * header, CRC32C and the `none` codec. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/crc32c.h"
#include "compress/spec.h"
#include "terse_plugin.h"
#include "testutil.h"

Test(status, every_status_has_a_name_and_a_sentence) {
    for (int s = 0; s <= TERSE_ERR_NONFINITE; s++) {
        cr_expect_str_neq(terse_strerror((terse_status)s), "unknown status");
        cr_expect_eq(strncmp(terse_status_name((terse_status)s), "TERSE_", 6), 0);
    }
    cr_expect_str_eq(terse_strerror((terse_status)9999), "unknown status");
}

Test(version, runtime_matches_header) {
    cr_expect_eq(terse_version(), TERSE_VERSION_NUMBER);
    cr_expect_str_eq(terse_version_string(), "0.1.0");
}

Test(crc32c, matches_the_standard_check_value) {
    /* CRC-32C("123456789") = 0xe3069283 (RFC 3720 test vector family). */
    cr_expect_eq(terse__crc32c_sw(0, "123456789", 9), 0xe3069283u);
    cr_expect_eq(terse__crc32c_update(0, "123456789", 9), 0xe3069283u);
}

Test(crc32c, hardware_equals_software_at_every_length_and_split) {
    size_t n = 3 * 4096 * 2 + 77;
    uint8_t *buf = malloc(n);
    for (size_t i = 0; i < n; i++) buf[i] = (uint8_t)(i * 131 + (i >> 7));
    for (size_t len = 0; len <= n; len += (len < 64 ? 1 : 997)) {
        uint32_t a = terse__crc32c_sw(0, buf, len), b = terse__crc32c_sse42(0, buf, len);
        cr_assert_eq(a, b, "length %zu", len);
        size_t h = len / 3;
        cr_assert_eq(terse__crc32c_update(terse__crc32c_update(0, buf, h), buf + h, len - h), a);
    }
    free(buf);
}

Test(spec, parses_name_and_options) {
    terse_spec s;
    cr_assert_eq(terse__spec_parse("topk:ratio=0.01,ef=1", &s), TERSE_OK);
    cr_expect_str_eq(s.name, "topk");
    cr_expect_eq(s.nopts, 2);
    double r;
    cr_expect_eq(terse_spec_get_double(&s, "ratio", 1, 0, 1, &r), TERSE_OK);
    cr_expect_float_eq(r, 0.01, 1e-12);
    cr_expect_str_eq(terse__spec_unused(&s), "ef");
}

Test(spec, bad_specs_are_invalid_and_name_the_token) {
    tu_expect_bad_spec("foo", "foo");
    tu_expect_bad_spec("", "empty");
    tu_expect_bad_spec("none:", "no options");
    tu_expect_bad_spec("none:ef", "ef");
    tu_expect_bad_spec("none:ef=", "ef=");
    tu_expect_bad_spec("none:ef=2", "ef=2");
    tu_expect_bad_spec("none:ef=1,ef=0", "ef");
    tu_expect_bad_spec("none:colour=red", "colour");
    tu_expect_bad_spec("none:seed=1", "seed"); /* none draws no random numbers */
    tu_expect_bad_spec("none:ef=1,", "','");
    tu_expect_bad_spec("None", "None");
    tu_expect_bad_spec("none:ef=-1", "ef=-1");
    tu_expect_bad_spec("none:ef=99999999999999999999999", "ef=");
}

Test(codec, shapes_out_of_range_are_refused_without_allocating) {
    terse_codec *c = NULL;
    cr_expect_eq(terse_codec_create("none", 0, 5, &c), TERSE_ERR_INVALID);
    cr_expect_eq(terse_codec_create("none", (size_t)UINT32_MAX, (size_t)UINT32_MAX, &c),
                 TERSE_ERR_INVALID);
    cr_expect_eq(terse_codec_create("none", SIZE_MAX, 1, &c), TERSE_ERR_INVALID);
    cr_expect_eq(terse_codec_create("none", 2, SIZE_MAX / 2 + 1, &c), TERSE_ERR_INVALID);
    cr_expect_null(c);
}

Test(codec, none_round_trips_exactly_and_accumulates) {
    size_t n = 1000;
    float x[1000], y[1000], z[1000];
    tu_fill_gauss(x, n, 1);
    terse_codec *c;
    cr_assert_eq(terse_codec_create("none", n, 1, &c), TERSE_OK);
    cr_expect_str_eq(terse_codec_spec(c), "none:ef=0");
    cr_expect_eq(terse_codec_bound(c), 32 + 4 * n);
    uint8_t *msg;
    size_t len = tu_encode(c, x, &msg);
    cr_assert_eq(len, 32 + 4 * n);
    cr_assert_eq(terse_decode(c, msg, len, y, 1.0f, 0), TERSE_OK);
    cr_expect_eq(memcmp(x, y, sizeof x), 0);
    for (size_t i = 0; i < n; i++) z[i] = 1.0f;
    cr_assert_eq(terse_decode(c, msg, len, z, 0.5f, 1), TERSE_OK);
    for (size_t i = 0; i < n; i++) cr_assert_eq(z[i], 1.0f + 0.5f * x[i]);
    terse_wire_info info;
    cr_assert_eq(terse_wire_inspect(msg, len, &info), TERSE_OK);
    cr_expect_eq(info.codec_id, 1);
    cr_expect_eq(info.count, n);
    cr_expect_eq(info.payload_len, 4 * n);
    free(msg);
    terse_codec_free(c);
}

Test(codec, small_destination_is_refused_before_any_write) {
    float x[16] = {1};
    uint8_t buf[64];
    memset(buf, 0xab, sizeof buf);
    terse_codec *c;
    cr_assert_eq(terse_codec_create("none:ef=1", 16, 1, &c), TERSE_OK);
    size_t len = 7;
    cr_expect_eq(terse_encode(c, x, buf, sizeof buf, &len), TERSE_ERR_DST_TOO_SMALL);
    cr_expect_eq(len, 0);
    cr_expect_eq(buf[0], 0xab);
    cr_expect_eq(terse_codec_step(c), 0);
    cr_expect_not_null(strstr(terse_last_error(), "96"));
    terse_codec_free(c);
}

Test(codec, free_accepts_null) { terse_codec_free(NULL); }

/* ---- plugins ---- */

typedef struct {
    size_t n;
    float scale;
} twice;

static terse_status tw_create(terse_spec *spec, size_t rows, size_t cols, void **self, char *canon,
                              size_t cap) {
    double k;
    terse_status s = terse_spec_get_double(spec, "k", 2.0, 0.5, 8.0, &k);
    if (s) return s;
    twice *t = malloc(sizeof *t);
    t->n = rows * cols;
    t->scale = (float)k;
    snprintf(canon, cap, "k=%g", k);
    *self = t;
    return TERSE_OK;
}
static void tw_destroy(void *self) { free(self); }
static size_t tw_bound(const void *self) { return ((const twice *)self)->n * 4; }
static terse_status tw_encode(void *self, const terse_encode_ctx *ctx, const float *x, uint8_t *p,
                              size_t cap, size_t *len) {
    (void)ctx;
    (void)cap;
    twice *t = self;
    for (size_t i = 0; i < t->n; i++) {
        float v = x[i] * t->scale;
        memcpy(p + 4 * i, &v, 4);
    }
    *len = t->n * 4;
    return TERSE_OK;
}
static terse_status tw_decode(void *self, const uint8_t *p, size_t len, float *dst, float alpha,
                              int acc) {
    twice *t = self;
    if (len != t->n * 4) return terse_plugin_error(TERSE_ERR_CORRUPT, "twice: bad length %zu", len);
    for (size_t i = 0; i < t->n; i++) {
        float v;
        memcpy(&v, p + 4 * i, 4);
        v /= t->scale;
        dst[i] = acc ? dst[i] + alpha * v : alpha * v;
    }
    return TERSE_OK;
}

static const terse_codec_ops twice_ops = {
    .size = sizeof(terse_codec_ops),
    .id = 0x8001,
    .name = "twice",
    .flags = TERSE_CODEC_SUMMABLE,
    .create = tw_create,
    .destroy = tw_destroy,
    .bound = tw_bound,
    .encode = tw_encode,
    .decode = tw_decode,
};

Test(plugin, registers_and_round_trips_with_error_feedback) {
    cr_assert_eq(terse_codec_register(&twice_ops), TERSE_OK, "%s", terse_last_error());
    terse_codec *c;
    cr_assert_eq(terse_codec_create("twice:k=4,ef=1", 10, 1, &c), TERSE_OK, "%s", terse_last_error());
    cr_expect_str_eq(terse_codec_spec(c), "twice:k=4,ef=1");
    float x[10], y[10];
    tu_fill_gauss(x, 10, 3);
    uint8_t *msg;
    size_t len = tu_encode(c, x, &msg);
    cr_assert_eq(terse_decode(c, msg, len, y, 1.0f, 0), TERSE_OK);
    for (int i = 0; i < 10; i++) cr_expect_float_eq(y[i], x[i], 1e-6f);
    free(msg);
    terse_codec_free(c);
    terse_codec_traits t = TERSE_CODEC_TRAITS_INIT;
    cr_assert_eq(terse_codec_create("twice", 10, 1, &c), TERSE_OK);
    cr_assert_eq(terse_codec_get_traits(c, &t), TERSE_OK);
    cr_expect_eq(t.summable, 1);
    cr_expect_eq(t.id, 0x8001);
    cr_expect_float_eq(t.bits_per_element, 32.0, 1e-9);
    terse_codec_free(c);
}

Test(plugin, duplicate_id_or_name_and_reserved_ids_are_refused) {
    cr_assert_eq(terse_codec_register(&twice_ops), TERSE_OK);
    cr_expect_eq(terse_codec_register(&twice_ops), TERSE_ERR_EXISTS);
    terse_codec_ops o = twice_ops;
    o.id = 0x8002;
    cr_expect_eq(terse_codec_register(&o), TERSE_ERR_EXISTS); /* same name */
    cr_expect_not_null(strstr(terse_last_error(), "twice"));
    o.name = "none";
    cr_expect_eq(terse_codec_register(&o), TERSE_ERR_EXISTS); /* a built-in's name */
    o.name = "thrice";
    o.id = 5;
    cr_expect_eq(terse_codec_register(&o), TERSE_ERR_INVALID); /* reserved id */
    o.id = 0;
    cr_expect_eq(terse_codec_register(&o), TERSE_ERR_INVALID);
    o.id = 0xffff;
    cr_expect_eq(terse_codec_register(&o), TERSE_ERR_INVALID);
    o.id = 0x8003;
    o.decode = NULL;
    cr_expect_eq(terse_codec_register(&o), TERSE_ERR_INVALID);
    o = twice_ops;
    o.id = 0x8004;
    o.name = "Bad Name";
    cr_expect_eq(terse_codec_register(&o), TERSE_ERR_INVALID);
    o.name = "older_table";
    o.size = offsetof(terse_codec_ops, state_size); /* a plugin built against an older header */
    cr_expect_eq(terse_codec_register(&o), TERSE_OK, "%s", terse_last_error());
}

Test(registry, lists_every_builtin_in_id_order) {
    const char *want[] = {"none", "fp16", "bf16", "int8", "qsgd", "terngrad",
                          "sign", "topk", "randk", "powersgd", "vq"};
    cr_assert_geq(terse_codec_count(), 11);
    for (size_t i = 0; i < 11; i++) cr_expect_str_eq(terse_codec_name(i), want[i]);
}
