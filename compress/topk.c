/* topk: not implemented yet (stub: creation fails with UNSUPPORTED). */
#include "common/error.h"
#include "compress/codec_internal.h"

static terse_status stub_create(terse_spec *spec, size_t rows, size_t cols, void **self,
                                char *canon, size_t canon_cap) {
    (void)spec; (void)rows; (void)cols; (void)self; (void)canon; (void)canon_cap;
    return TERSE_ERROR(TERSE_ERR_UNSUPPORTED, "codec 'topk' is not implemented yet");
}
static void stub_destroy(void *self) { (void)self; }
static size_t stub_bound(const void *self) { (void)self; return 0; }
static terse_status stub_encode(void *self, const terse_encode_ctx *ctx, const float *x,
                                uint8_t *payload, size_t cap, size_t *len) {
    (void)self; (void)ctx; (void)x; (void)payload; (void)cap; (void)len;
    return TERSE_ERR_UNSUPPORTED;
}
static terse_status stub_decode(void *self, const uint8_t *payload, size_t len, float *dst,
                                float alpha, int accumulate) {
    (void)self; (void)payload; (void)len; (void)dst; (void)alpha; (void)accumulate;
    return TERSE_ERR_UNSUPPORTED;
}
const terse_codec_ops terse__codec_topk = {
    .size = sizeof(terse_codec_ops), .id = TERSE_ID_TOPK, .name = "topk",
    .create = stub_create, .destroy = stub_destroy, .bound = stub_bound,
    .encode = stub_encode, .decode = stub_decode,
};
