/*
 * terse_plugin.h -- register your own codec.
 *
 * A codec is a function table (terse_codec_ops). The built-in codecs are
 * registered through exactly this interface, so a plugin gets everything a
 * built-in gets: spec parsing, the wire header and its checksum, error
 * feedback (ef=1), state save/load, and the collectives.
 *
 * What terse does around your functions:
 *   - parses the spec, hands you the options through terse_spec_get_*; any
 *     option you did not read makes creation fail with TERSE_ERR_INVALID
 *     naming it ("ef" is always taken by terse, "seed" when you declare
 *     TERSE_CODEC_RANDOMIZED);
 *   - writes and validates the 32-byte header (magic, version, id, count,
 *     payload length, CRC32C), so your decode sees only a payload whose
 *     checksum matched and whose length is <= your bound;
 *   - implements error feedback by calling your encode and decode.
 *
 * What you must do:
 *   - allocate all scratch in create: encode and decode must not allocate;
 *   - in decode, trust nothing in the payload: check every count, index and
 *     length against payload_len and the shape before using it, and return
 *     TERSE_ERR_CORRUPT (with terse_plugin_error for the sentence) when a
 *     field is inconsistent. The checksum only stops accidents, not a peer
 *     that recomputes it.
 *
 * Copyright 2026 the terse authors. SPDX-License-Identifier: Apache-2.0
 */
#ifndef TERSE_PLUGIN_H
#define TERSE_PLUGIN_H

#include "terse.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Ids 1..0x7fff are reserved for terse's built-in codecs; plugins take ids in
 * [TERSE_CODEC_ID_USER_MIN, TERSE_CODEC_ID_USER_MAX]. 0 is never valid. */
#define TERSE_CODEC_ID_USER_MIN 0x8000u
#define TERSE_CODEC_ID_USER_MAX 0xfffeu

/* Codec flags. */
#define TERSE_CODEC_SUMMABLE 0x1u   /* payloads of equal shape add linearly */
#define TERSE_CODEC_RANDOMIZED 0x2u /* draws random numbers; accepts seed= */
/* Every payload is exactly bound() bytes, whatever the input: receivers
 * then post that size and the collectives exchange no lengths (terse
 * checks each message it sends and fails with TERSE_ERR_INTERNAL naming
 * the codec if one is shorter). Added after 0.1.0; a clear bit is always
 * safe. */
#define TERSE_CODEC_FIXED_SIZE 0x4u

/* The parsed spec, as handed to create. Opaque. */
typedef struct terse_spec terse_spec;

/*
 * Read option `key`. If it is absent, *out = dflt and TERSE_OK. If present,
 * it must parse completely and lie in [min, max], otherwise
 * TERSE_ERR_INVALID with a sentence naming the token. Reading marks the
 * key as consumed.
 */
TERSE_API terse_status terse_spec_get_double(terse_spec *spec, const char *key,
                                             double dflt, double min,
                                             double max, double *out);
TERSE_API terse_status terse_spec_get_u64(terse_spec *spec, const char *key,
                                          uint64_t dflt, uint64_t min,
                                          uint64_t max, uint64_t *out);
/* Nonzero if option `key` was given (does not consume it). */
TERSE_API int terse_spec_has(const terse_spec *spec, const char *key);
/* Nonzero if the spec asked for error feedback (ef=1). */
TERSE_API int terse_spec_error_feedback(const terse_spec *spec);

/* Context of one encode. */
typedef struct terse_encode_ctx {
    size_t size;     /* sizeof(terse_encode_ctx) */
    uint64_t seed;   /* from seed= (0 if not randomized) */
    uint64_t step;   /* encodes before this one */
    uint64_t tensor; /* from terse_codec_set_stream */
    uint32_t rank;   /* from terse_codec_set_stream */
} terse_encode_ctx;

/* Where the values that add linearly sit in a summable codec's payload
 * (the summable_view entry below). */
typedef struct terse_summable_view {
    size_t size;       /* sizeof(terse_summable_view), set by terse */
    size_t values_off; /* payload offset of the first value: a multiple of 4 */
    size_t count;      /* fp32 values (little endian) from there */
} terse_summable_view;

/* Context of one aggregation round (the rounds entries below). */
typedef struct terse_round_ctx {
    size_t size;     /* sizeof(terse_round_ctx) */
    uint64_t seed;   /* from seed= (0 if not randomized) */
    uint64_t step;   /* aggregations and encodes before this one */
    uint64_t tensor; /* from terse_codec_set_stream */
    uint32_t rank;   /* from terse_codec_set_stream */
    uint32_t nranks; /* ranks whose vectors are summed */
    float *residual; /* ef=1: the codec's rows*cols error-feedback residual,
                        which the rounds keep themselves; else NULL */
} terse_round_ctx;

typedef struct terse_codec_ops {
    size_t size;      /* sizeof(terse_codec_ops) of the header you built with */
    uint32_t id;      /* unique; see the id ranges above */
    const char *name; /* unique, [a-z0-9_]+, <= 31 chars; must outlive registration */
    uint32_t flags;   /* TERSE_CODEC_* */

    /* Parse options from spec, allocate state and all scratch for a rows x
     * cols tensor, store it in *self. Canonical spec text for the options
     * (e.g. "bits=4,bucket=512") is written to canon (cap bytes, "" if none). */
    terse_status (*create)(terse_spec *spec, size_t rows, size_t cols,
                           void **self, char *canon, size_t canon_cap);
    void (*destroy)(void *self);

    /* Worst-case payload bytes (header excluded). */
    size_t (*bound)(const void *self);
    /* Nominal bits per element, payload only. */
    double (*bits_per_element)(const void *self);

    /* Encode x (rows*cols floats) into payload (cap >= bound bytes). */
    terse_status (*encode)(void *self, const terse_encode_ctx *ctx,
                           const float *x, uint8_t *payload, size_t cap,
                           size_t *payload_len);
    /* dst (+)= alpha * decode(payload). payload_len <= bound, checksum ok. */
    terse_status (*decode)(void *self, const uint8_t *payload,
                           size_t payload_len, float *dst, float alpha,
                           int accumulate);

    /* Optional (NULL if stateless): codec-private state for checkpoints. */
    size_t (*state_size)(const void *self);
    terse_status (*state_save)(const void *self, uint8_t *dst);
    terse_status (*state_load)(void *self, const uint8_t *src, size_t len);

    /* ---- How the collectives aggregate (appended after 0.1.0; optional:
     * NULL, as in a table built with an older header, means not offered) ----
     *
     * terse_allreduce drives every codec through these entries alone; it
     * never knows a codec by name or id. It takes the first that applies:
     *
     *   1. rounds(self) > 0: the codec's own multi-round protocol.
     *   2. TERSE_CODEC_SUMMABLE and summable_view: every rank encodes, the
     *      ranks check that their messages agree outside the values, the
     *      values are summed by the dense ring inside the message, and the
     *      summed message is decoded once.
     *   3. Otherwise the messages themselves travel: an all-gather of every
     *      rank's message, decoded in rank order, or, from 4 ranks when
     *      that would move more bytes than dense (see terse_allreduce in
     *      terse.h), a compressed reduce-scatter (each rank decodes and
     *      sums its own segment of everyone's message, re-encodes the sum,
     *      and the sums are all-gathered); the latter only if
     *      segment_align allows the tensor to be cut. See
     *      docs/collectives.md for the rule.
     *
     * A codec that declares TERSE_CODEC_SUMMABLE without summable_view takes
     * path 3: terse cannot know where its values sit. */

    /* 2. Where the values are in this payload (one this codec encoded). Every
     * byte outside them must be the same on every rank for the messages to
     * add (terse checks a hash of them), and adding the values must add the
     * decoded tensors. */
    terse_status (*summable_view)(const void *self, const uint8_t *payload,
                                  size_t payload_len, terse_summable_view *view);

    /* 1. Multi-round aggregation (PowerSGD: sum P, orthonormalise, sum Q).
     * rounds(self) = R > 0 rounds. For r = 0 .. R-1 terse calls
     * round_vector, which points *vec at `*count` floats (codec-owned
     * memory, or x itself) that terse then sums over the ranks in place,
     * bitwise identically on every rank; after the last sum,
     * round_finish writes alpha times the aggregate into x (alpha is 1 for
     * a sum, 1/nranks for an average: dividing by ctx->nranks instead
     * gives bitwise what the dense average gives). x is this
     * rank's input until round_finish overwrites it. With ef=1 the rounds
     * keep ctx->residual themselves (absorb the input, leave in it what
     * this rank wanted to send minus what it contributed). R and every
     * count must follow from the spec and shape alone (all ranks agree).
     * Must not allocate. rounds(self) == 0: not for this shape. */
    unsigned (*rounds)(const void *self);
    terse_status (*round_vector)(void *self, const terse_round_ctx *ctx,
                                 unsigned round, float *x, float **vec,
                                 size_t *count);
    terse_status (*round_finish)(void *self, const terse_round_ctx *ctx,
                                 float *x, float alpha);

    /* 3. Cutting, for the compressed reduce-scatter (one segment per rank)
     * and the pipelined all-gather (pieces of TERSE_PIPELINE_BYTES; only
     * codecs without segment_options, whose pieces then say what the whole
     * message says). terse may cut the
     * tensor into contiguous segments at multiples of segment_align(self)
     * elements and code each with a codec of the same name created for
     * 1 x len elements, ef=0 (terse keeps the residuals), from the
     * options create wrote to canon -- so canon must recreate the same
     * codec. Codecs with state (state_size > 0) are never cut. Return the
     * granularity at which a piece's message says what the whole message
     * says of those elements (a bucket), >= 1; 0: never cut.
     * segment_options (optional) writes the canonical options for a
     * segment of len of the tensor's elements, as create writes canon
     * (e.g. topk scales a fixed k=); NULL: the segment takes the tensor's
     * options. */
    size_t (*segment_align)(const void *self);
    terse_status (*segment_options)(const void *self, size_t len, char *canon,
                                    size_t cap);
} terse_codec_ops;

/*
 * Register a codec. ops is copied (entries your header version does not
 * know are treated as NULL; required entries: create, destroy, bound,
 * encode, decode). Returns TERSE_ERR_EXISTS for a duplicate id or name,
 * TERSE_ERR_INVALID for an id outside the user range (built-ins excepted)
 * or a malformed table.
 */
TERSE_API terse_status terse_codec_register(const terse_codec_ops *ops);

/*
 * Parameter-server aggregators. A plugin aggregator joins the built-in
 * table (mean, median, ...; terse.h, "Aggregators") under its own name and
 * is named in terse_ps_config.aggregator like them: "name" or
 * "name:OPTIONS", OPTIONS handed to you as text (everything after the
 * first ':', "" without one). The server calls it for each sync step,
 * with the step's pushes decoded and in worker-rank order (the same on
 * every run whatever the arrival order), every value finite (pushes
 * holding NaN or an infinity are left out before you see them), and k >= 1.
 */
typedef struct terse_ps_aggregator_ops {
    size_t size;      /* sizeof(terse_ps_aggregator_ops) of the header you built with */
    const char *name; /* unique among aggregators, [a-z0-9_]+, <= 31 chars; must outlive
                         registration */
    int needs_center; /* 1: aggregate gets `center`, n floats the server keeps per shard
                         (zero at the first step); 0: center is NULL */
    /* Refuse options or a worker count that cannot hold (TERSE_ERR_INVALID
     * and a sentence through terse_plugin_error); called by terse_ps_create
     * on every rank and by terse_ps_aggregator_check. NULL: takes no
     * options (any given are refused) and holds for any count. */
    terse_status (*check)(const char *options, int workers, void *user);
    /* out[0..n) from in[0..k)[0..n). Must not keep pointers to in or out.
     * A non-OK status fails the server (it cannot close the step). */
    terse_status (*aggregate)(const char *options, const float *const *in, size_t k, size_t n,
                              float *out, float *center, void *user);
    void *user;       /* handed back to check and aggregate */
} terse_ps_aggregator_ops;

#define TERSE_PS_AGGREGATOR_OPS_INIT {sizeof(terse_ps_aggregator_ops), NULL, 0, NULL, NULL, NULL}

/* Register an aggregator (ops is copied; at most 32 plugins per process).
 * TERSE_ERR_EXISTS for a name already taken (built-ins included),
 * TERSE_ERR_INVALID for a bad name, no aggregate, or a table smaller than
 * the first version's. Thread-safe; there is no unregistering. */
TERSE_API terse_status terse_ps_register_aggregator(const terse_ps_aggregator_ops *ops);

/* Record a sentence for terse_last_error() from inside a plugin, printf
 * style, and return status (for `return terse_plugin_error(...)`). */
TERSE_API terse_status terse_plugin_error(terse_status status, const char *fmt,
                                          ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

#ifdef __cplusplus
}
#endif

#endif /* TERSE_PLUGIN_H */
