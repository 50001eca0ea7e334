/* vq: vector quantization with a fixed spherical codebook and one
 * least-squares gain per bucket -- b/d bits per element, so below one bit
 * when b < d.
 *
 * Spec: vq:dim=d,bits=b,bucket=B
 *   d in [2, 64] (default 8): coordinates per block; the last block is
 *     zero padded.
 *   b in [1, 12] (default 8): bits per block index, 2^b codewords.
 *   B in [1, 2^24] (default 1024): elements per gain, rounded down to a
 *     whole number of blocks G = max(1, floor(B / d)); the canonical spec
 *     shows G * d. Bits per element: b/d + 32/(G d).
 *
 * Codebook. 2^b unit vectors in R^d, never sent: H = 2^(b-1) base vectors
 * v_k and their negatives (index k is v_k, index k + H is -v_k). Antipodal
 * pairs halve the search (max |<x, v_k>| over H products instead of 2H) and
 * guarantee every block a codeword with <x, c> >= 0, so gains are never
 * negative. v_k's coordinates are sums of four 16-bit uniform integers from
 * common/rng.h (Irwin-Hall, nearly Gaussian, so directions are nearly
 * uniform on the sphere), centred; the squared norm is an exact integer in
 * a double, sqrt and the division are correctly rounded IEEE operations, and
 * the result is rounded once to float: bit-identical on every IEEE machine
 * with no libm call but sqrt, which IEEE 754 requires to be correctly
 * rounded. (A test pins the codebook's CRC32C.)
 *
 * Encode, per chunk of blocks:
 *   1. Scores S = X V^T by cblas_sgemm (chunk x d times d x H), into
 *      scratch allocated at create.
 *   2. Per block, the candidate set: every k with |S_k| >= max |S| - tol.
 *      tol = (d + 1) 2^-20 ||x||_1 + d 2^-120 bounds (eight times over) how
 *      far two fp32 dot products of the same vectors, summed in any order,
 *      with or without FMA or denormal flushing, can drift apart -- so the
 *      set always contains the canonical winner (step 3) whatever kernel
 *      OpenBLAS chose. The max and the scan compare |S_k| as integers
 *      (compress/vq_kernels.h, with AVX2 and AVX-512 twins).
 *   3. Each candidate is rescored canonically: sum_i (double)x_i v_ki, in
 *      index order. Float products are exact in double, so a contracted and
 *      an uncontracted sum give the same bits: the score is a pure function
 *      of x on every machine. The winner is the largest canonical |score|,
 *      ties to the lower codeword index; its sign picks v_k or -v_k.
 *   Usually the set is one codeword, so this costs d multiply-adds per block
 *   besides the sgemm. Messages are therefore identical across CPUs and
 *   OpenBLAS kernels. Special blocks skip the sgemm result: all-zero blocks
 *   take index 0; blocks holding NaN or Inf take index 0 (their canonical
 *   score is NaN or Inf, so that bucket's gain is too: a non-finite input
 *   poisons its own bucket only); blocks with ||x||_1 >= 2^120, where fp32
 *   scores could overflow, are searched canonically over all H codewords.
 *   4. Per bucket, the least-squares gain for fixed codewords,
 *      g = (sum_j <x_j, c_j>) / (blocks in the bucket), summed in double in
 *      block order (a gain past FLT_MAX becomes +Inf). x_j ~ g c_j.
 *
 * Payload (little endian): nbuckets fp32 gains, then nblocks indices of b
 * bits each, packed LSB first, padded with zero bits to a whole byte.
 * Decode checks the exact length and that the padding bits are zero; every
 * b-bit field is a valid index. A crafted non-finite gain decodes to Inf or
 * NaN in its bucket.
 *
 * Relative error ||x - x^|| / ||x||, measured on 2^20 elements (Gaussian by
 * Box-Muller; Student t with 3 degrees of freedom), bucket=1024:
 *
 *   d   b   bits/element  Gaussian  Student t3
 *   2   1       0.53        0.83       0.88
 *   8   4       0.53        0.82       0.86
 *  16   8       0.53        0.77       0.82
 *   2   2       1.03        0.69       0.79
 *   4   4       1.03        0.65       0.77
 *   8   8       1.03        0.59       0.70   (the default)
 *   8  12       1.53        0.44       0.60
 *  32  12       0.41        0.81       0.84
 *  64  12       0.22        0.90       0.91
 *   8   8       5.00        0.55       0.56   (bucket=8: one gain per block)
 *   scaled sign, 1.03 bits:  0.60       0.77
 * The per-bucket gain cannot follow block norms, which alone costs
 * sqrt(1 - E[|x|]^2 / E[|x|^2]) ~ 0.25 at d = 8 on Gaussian data even with a
 * perfect direction. A codebook trained by spherical k-means (Lloyd) would
 * gain about 3% at d=8,b=8 and up to 15% for tiny codebooks (d=2,b=2), at
 * the price of a slow, cached construction; the random one is kept simple.
 *
 * Speed: encode costs the sgemm (2^b flops per element) plus the per-block
 * selection, about as much again: at the default, 0.25-0.35 GB/s of input
 * on one AVX-512 core against 10-12 GB/s memcpy; decode is a gather,
 * ~5.5 GB/s at d = 8 (slower at small d, where per-block work dominates).
 * Each chunk's sgemm is small: with OpenBLAS threading on, its thread start-up
 * (and a malloc OpenBLAS makes per threaded call) costs more than it saves,
 * so OPENBLAS_NUM_THREADS=1 is advised when one thread encodes per tensor.
 *
 * Biased (E[x^] != x): use with ef=1. */
#include "compress/vq.h"

#include <cblas.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/bytes.h"
#include "common/error.h"
#include "common/rng.h"
#include "compress/codec_internal.h"
#include "compress/vq_kernels.h"

/* The codebook's fixed seed ("vq codebook" in ASCII, truncated). */
#define VQ_SEED 0x7671636f6465626fULL
#define VQ_MAX_H 2048u /* 2^(12 - 1) */

typedef struct {
    size_t n, d, b, h; /* h = 2^(b-1) base codewords */
    size_t g;          /* blocks per bucket */
    size_t nblocks, nbuckets, idx_bytes;
    size_t chunk; /* blocks per sgemm */
    float *v;     /* h x d base codewords, row major */
    float *s;     /* chunk x h scores */
    float *pad;   /* the zero-padded last block */
    terse__vq_absmax_fn absmax;
    terse__vq_above_fn above;
} vq_codec;

void terse__vq_codeword(size_t d, uint32_t k, float *v) {
    uint64_t key = terse__rng_key(VQ_SEED, d, 0, 0);
    int32_t y[64];
    uint64_t norm2 = 0;
    for (size_t i = 0; i < d; i++) {
        uint64_t u = terse__rng_u64(key, (uint64_t)k * d + i);
        y[i] = (int32_t)(u & 0xffff) + (int32_t)((u >> 16) & 0xffff) +
               (int32_t)((u >> 32) & 0xffff) + (int32_t)(u >> 48) - 131070;
        norm2 += (uint64_t)((int64_t)y[i] * y[i]); /* < 64 * 2^34: exact */
    }
    if (norm2 == 0) { /* never happens for d >= 2 in practice; no NaN if it does */
        for (size_t i = 0; i < d; i++) v[i] = i == k % d ? 1.0f : 0.0f;
        return;
    }
    double norm = sqrt((double)norm2);
    for (size_t i = 0; i < d; i++) v[i] = (float)((double)y[i] / norm);
}

static void vq_destroy(void *self) {
    vq_codec *c = self;
    if (!c) return;
    free(c->v);
    free(c->s);
    free(c->pad);
    free(c);
}

static terse_status vq_create(terse_spec *spec, size_t rows, size_t cols, void **self,
                              char *canon, size_t canon_cap) {
    uint64_t d, b, bucket;
    TERSE_CHECK(terse_spec_get_u64(spec, "dim", 8, 2, 64, &d));
    TERSE_CHECK(terse_spec_get_u64(spec, "bits", 8, 1, 12, &b));
    TERSE_CHECK(terse_spec_get_u64(spec, "bucket", 1024, 1, (uint64_t)1 << 24, &bucket));
    terse_status s = TERSE_OK;
    vq_codec *c = calloc(1, sizeof *c);
    if (!c) return TERSE_ERROR(TERSE_ERR_NOMEM, "allocating codec 'vq'");
    c->n = rows * cols;
    c->d = (size_t)d;
    c->b = (size_t)b;
    c->h = (size_t)1 << (b - 1);
    c->g = bucket / d ? (size_t)(bucket / d) : 1;
    c->nblocks = (c->n + c->d - 1) / c->d;
    c->nbuckets = (c->nblocks + c->g - 1) / c->g;
    c->idx_bytes = (c->nblocks * c->b + 7) / 8; /* nblocks < 2^36: no overflow */
    /* Keep the score block near 256 KiB, so it stays in L2 for the scan. */
    size_t chunk = 65536 / c->h;
    chunk = chunk < 16 ? 16 : chunk > 1024 ? 1024 : chunk;
    c->chunk = chunk < c->nblocks ? chunk : c->nblocks;
    c->v = malloc(c->h * c->d * sizeof(float));
    c->s = malloc(c->chunk * c->h * sizeof(float));
    c->pad = malloc(c->d * sizeof(float));
    if (!c->v || !c->s || !c->pad)
        TERSE_FAIL_GOTO(s, fail, TERSE_ERR_NOMEM, "vq: allocating a %zu x %zu codebook and scratch",
                        c->h, c->d);
    c->absmax = terse__vq_absmax_kernel();
    c->above = terse__vq_above_kernel();
    for (size_t k = 0; k < c->h; k++) terse__vq_codeword(c->d, (uint32_t)k, c->v + k * c->d);
    snprintf(canon, canon_cap, "dim=%zu,bits=%zu,bucket=%zu", c->d, c->b, c->g * c->d);
    *self = c;
    return TERSE_OK;
fail:
    vq_destroy(c);
    return s;
}

static size_t vq_bound(const void *self) {
    const vq_codec *c = self;
    return 4 * c->nbuckets + c->idx_bytes;
}

static double vq_bits(const void *self) {
    const vq_codec *c = self;
    return (double)c->b / (double)c->d + 32.0 / (double)(c->g * c->d);
}

/* The canonical score: exact float products summed in double, in order. */
static double canon_dot(const float *x, const float *v, size_t d) {
    double s = 0;
    for (size_t i = 0; i < d; i++) {
        double p = (double)x[i] * (double)v[i];
        s += p;
    }
    return s;
}

typedef struct {
    double score; /* canonical |<x, c>| of the best so far, -1 if none */
    uint32_t idx;
} vq_best;

static void consider(const vq_codec *c, const float *x, uint32_t k, vq_best *best) {
    double sc = canon_dot(x, c->v + (size_t)k * c->d, c->d);
    uint32_t idx = sc >= 0 ? k : k + (uint32_t)c->h;
    double a = fabs(sc);
    if (a > best->score || (a == best->score && idx < best->idx)) {
        best->score = a;
        best->idx = idx;
    }
}

/* Choose block x's codeword from its fp32 scores s (h of them); return the
 * index and store the canonical |<x, c>| in *score. See step 2 above. */
static uint32_t vq_select(const vq_codec *c, const float *x, const float *s, double *score) {
    const size_t d = c->d, h = c->h;
    double l1 = 0;
    for (size_t i = 0; i < d; i++) l1 += fabs((double)x[i]);
    vq_best best = {-1.0, UINT32_MAX};
    if (!(l1 <= DBL_MAX) || l1 == 0) { /* NaN/Inf, or all zero */
        *score = fabs(canon_dot(x, c->v, d));
        return 0;
    }
    if (l1 >= 0x1p120) { /* fp32 scores might overflow: search canonically */
        for (uint32_t k = 0; k < h; k++) consider(c, x, k, &best);
        *score = best.score;
        return best.idx;
    }
    uint32_t top = c->absmax(s, h);
    float topf;
    memcpy(&topf, &top, 4);
    double tol = (double)(d + 1) * 0x1p-20 * l1 + (double)d * 0x1p-120;
    double t = (double)topf - tol;
    uint32_t thr = 0; /* also when t is NaN: then every codeword is a candidate */
    if (t > 0) {
        float tf = (float)t;
        memcpy(&thr, &tf, 4);
        thr = thr ? thr - 1 : 0; /* one ulp of slack for the rounding to float */
    }
    uint32_t cand[VQ_MAX_H + 16];
    size_t nc = c->above(s, h, thr, cand);
    for (size_t q = 0; q < nc; q++) consider(c, x, cand[q], &best);
    *score = best.score;
    return best.idx;
}

/* Least-squares gain of a bucket. A mean past FLT_MAX is +Inf (converting
 * it to float directly would be undefined behaviour in C); a NaN is sent as
 * the one quiet NaN 0x7fc00000, since which NaN payload an addition
 * propagates differs between CPUs. */
static float bucket_gain(double sum, size_t count) {
    double g = sum / (double)count;
    if (g != g) {
        uint32_t qnan = 0x7fc00000u;
        float f;
        memcpy(&f, &qnan, 4);
        return f;
    }
    return g > FLT_MAX ? INFINITY : (float)g;
}

static terse_status vq_encode(void *self, const terse_encode_ctx *ctx, const float *x,
                              uint8_t *payload, size_t cap, size_t *len) {
    (void)ctx;
    (void)cap;
    vq_codec *c = self;
    const size_t d = c->d, h = c->h, nfull = c->n / d;
    uint8_t *out = payload + 4 * c->nbuckets;
    uint64_t acc = 0; /* bit writer: < 8 + 12 bits pending */
    unsigned nacc = 0;
    double sum = 0;
    size_t in_bucket = 0, bucket = 0;
    for (size_t j0 = 0; j0 < c->nblocks;) {
        const float *xb;
        size_t cnt;
        if (j0 < nfull) {
            cnt = nfull - j0 < c->chunk ? nfull - j0 : c->chunk;
            xb = x + j0 * d;
        } else { /* the last, partial block */
            size_t rest = c->n - j0 * d;
            memset(c->pad, 0, d * sizeof(float));
            memcpy(c->pad, x + j0 * d, rest * sizeof(float));
            cnt = 1;
            xb = c->pad;
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)cnt, (int)h, (int)d, 1.0f, xb,
                    (int)d, c->v, (int)d, 0.0f, c->s, (int)h);
        for (size_t i = 0; i < cnt; i++) {
            double score;
            uint32_t idx = vq_select(c, xb + i * d, c->s + i * h, &score);
            acc |= (uint64_t)idx << nacc;
            nacc += (unsigned)c->b;
            while (nacc >= 8) {
                *out++ = (uint8_t)acc;
                acc >>= 8;
                nacc -= 8;
            }
            sum += score;
            if (++in_bucket == c->g || j0 + i + 1 == c->nblocks) {
                terse__put_f32(payload + 4 * bucket, bucket_gain(sum, in_bucket));
                bucket++;
                sum = 0;
                in_bucket = 0;
            }
        }
        j0 += cnt;
    }
    if (nacc) *out++ = (uint8_t)acc;
    *len = (size_t)(out - payload);
    return TERSE_OK;
}

/* The decode loop, written once and instantiated for common d (and each
 * accumulate mode) so the per-block copy is unrolled: at small d the
 * per-block overhead is the cost. Full blocks first, then the partial one. */
static inline void decode_blocks(const vq_codec *c, const uint8_t *gains, const uint8_t *in,
                                 float *dst, float alpha, const int accumulate, const size_t d) {
    const size_t h = c->h, b = c->b, nfull = c->n / d;
    const uint32_t mask = ((uint32_t)1 << b) - 1;
    uint64_t acc = 0; /* bit reader; it never reads past the index bytes */
    unsigned nacc = 0;
    size_t left = 0, q = 0;
    float ag = 0;
    for (size_t j = 0; j < c->nblocks; j++) {
        if (left == 0) { /* next bucket */
            ag = alpha * terse__get_f32(gains + 4 * q++);
            left = c->g;
        }
        left--;
        while (nacc < b) {
            acc |= (uint64_t)*in++ << nacc;
            nacc += 8;
        }
        uint32_t idx = (uint32_t)acc & mask;
        acc >>= b;
        nacc -= (unsigned)b;
        const float a = idx >= h ? -ag : ag;
        const float *v = c->v + (idx & (h - 1)) * d;
        float *y = dst + j * d;
        size_t e = j < nfull ? d : c->n - j * d;
        if (accumulate) {
            for (size_t i = 0; i < e; i++) {
                float t = a * v[i]; /* its own statement: no FMA contraction */
                y[i] += t;
            }
        } else {
            for (size_t i = 0; i < e; i++) y[i] = a * v[i];
        }
    }
}

static terse_status vq_decode(void *self, const uint8_t *payload, size_t len, float *dst,
                              float alpha, int accumulate) {
    vq_codec *c = self;
    size_t want = vq_bound(c);
    if (len != want)
        return TERSE_ERROR(TERSE_ERR_CORRUPT, "vq: payload is %zu bytes, expected %zu", len, want);
    const uint8_t *in = payload + 4 * c->nbuckets;
    unsigned padbits = (unsigned)(8 * c->idx_bytes - c->nblocks * c->b);
    if (padbits && (in[c->idx_bytes - 1] >> (8 - padbits)) != 0)
        return TERSE_ERROR(TERSE_ERR_CORRUPT,
                           "vq: padding bits of the last index byte (payload offset %zu) are not "
                           "zero",
                           4 * c->nbuckets + c->idx_bytes - 1);
#define VQ_DECODE_D(D)                                                   \
    case D:                                                              \
        if (accumulate)                                                  \
            decode_blocks(c, payload, in, dst, alpha, 1, D);             \
        else                                                             \
            decode_blocks(c, payload, in, dst, alpha, 0, D);             \
        break;
    switch (c->d) {
        VQ_DECODE_D(2)
        VQ_DECODE_D(4)
        VQ_DECODE_D(8)
        VQ_DECODE_D(16)
    default:
        decode_blocks(c, payload, in, dst, alpha, accumulate != 0, c->d);
    }
#undef VQ_DECODE_D
    return TERSE_OK;
}

/* Cut at gain-bucket boundaries (whole blocks, each bucket its own gain). */
static size_t vq_segment_align(const void *self) {
    const vq_codec *c = self;
    return c->g * c->d;
}

const terse_codec_ops terse__codec_vq = {
    .size = sizeof(terse_codec_ops),
    .id = TERSE_ID_VQ,
    .name = "vq",
    .flags = TERSE_CODEC_FIXED_SIZE,
    .create = vq_create,
    .destroy = vq_destroy,
    .bound = vq_bound,
    .bits_per_element = vq_bits,
    .encode = vq_encode,
    .decode = vq_decode,
    .segment_align = vq_segment_align,
};
