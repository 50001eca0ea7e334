/* How a codec aggregates (compress/aggregate.h): the codec core's side of
 * the entries terse_plugin.h appends for the collectives.
 *
 * Segments. The compressed reduce-scatter cuts a tensor of n elements into
 * one segment per rank, at multiples of the codec's segment_align (its
 * bucket): ceil(n / align) blocks split as evenly as terse__part would, the
 * first blocks % N segments one block longer, the last segment ending at
 * n. Each segment is coded by a child codec of the same name, 1 x len, ef=0,
 * with the options segment_options gives (or the parent's own). Error
 * feedback stays with the parent:
 *
 *   - this rank's contribution: the parent's residual e absorbs x, each
 *     segment of e is encoded by its child, and each message is decoded
 *     back into its segment of e with alpha = -1 -- terse_encode's rule,
 *     segment by segment, so e = p - D(C(p)) over the whole tensor;
 *   - the owner's re-encode of its segment's sum: the same rule on a
 *     second residual, `hop`, of the owned segment's length;
 *   - the compressed hierarchical all-reduce's owner (cut into local_size
 *     segments): its host's sum of segment s encoded through the parent's
 *     residual over that segment only (terse__codec_encode_segment); the
 *     hop residual is allocated with the cut but unused there.
 *
 * Random streams: a child codes segment s with tensor id
 * mix(tensor, s + 1) and the parent's rank, and the owner's re-encode with
 * rank | 2^31, so no two messages of a step share random numbers. The
 * child's step is the parent's. A cut is kept for the next call with the
 * same rank count and rank; another one frees it (and restarts hop at 0). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/rng.h"
#include "compress/aggregate.h"
#include "compress/codec_internal.h"
#include "compress/wire.h"

#define HOP_RANK_BIT 0x80000000u

terse__agg_kind terse__codec_agg_kind(const terse_codec *c) {
    if (c->ops.rounds && c->ops.rounds(c->self) > 0) return TERSE__AGG_ROUNDS;
    if ((c->ops.flags & TERSE_CODEC_SUMMABLE) && c->ops.summable_view) return TERSE__AGG_SUMMABLE;
    return TERSE__AGG_MESSAGES;
}

/* ---- rounds ---- */

unsigned terse__codec_rounds(const terse_codec *c) {
    return c->ops.rounds ? c->ops.rounds(c->self) : 0;
}

static terse_round_ctx round_ctx(const terse_codec *c, uint32_t nranks) {
    terse_round_ctx ctx = {sizeof ctx, c->seed, c->step, c->tensor, c->rank, nranks, c->residual};
    return ctx;
}

terse_status terse__codec_round_vector(terse_codec *c, uint32_t nranks, unsigned r, float *x,
                                       float **vec, size_t *count) {
    terse_round_ctx ctx = round_ctx(c, nranks);
    *vec = NULL;
    *count = 0;
    TERSE_CHECK(c->ops.round_vector(c->self, &ctx, r, x, vec, count));
    if (*count && !*vec)
        return TERSE_ERROR(TERSE_ERR_INTERNAL, "codec '%s': round %u gave %zu floats at NULL",
                           c->ops.name, r, *count);
    if (*count > TERSE_MAX_ELEMENTS ||
        (*vec >= x && *vec < x + c->n && *count > (size_t)(x + c->n - *vec)))
        return TERSE_ERROR(TERSE_ERR_INTERNAL,
                           "codec '%s': round %u gave %zu floats, more than %s holds", c->ops.name,
                           r, *count, *vec >= x && *vec < x + c->n ? "the input" : "allowed");
    return TERSE_OK;
}

terse_status terse__codec_round_finish(terse_codec *c, uint32_t nranks, float *x, float alpha) {
    terse_round_ctx ctx = round_ctx(c, nranks);
    TERSE_CHECK(c->ops.round_finish(c->self, &ctx, x, alpha));
    c->step++;
    return TERSE_OK;
}

/* ---- summable messages ---- */

terse_status terse__codec_summable_view(const terse_codec *c, const uint8_t *msg, size_t len,
                                        size_t *values_off, size_t *count) {
    if (len < TERSE_WIRE_HEADER_SIZE)
        return TERSE_ERROR(TERSE_ERR_INTERNAL, "codec '%s': a %zu-byte message", c->ops.name, len);
    const size_t plen = len - TERSE_WIRE_HEADER_SIZE;
    terse_summable_view v = {sizeof v, 0, 0};
    TERSE_CHECK(c->ops.summable_view(c->self, msg + TERSE_WIRE_HEADER_SIZE, plen, &v));
    if (v.values_off % 4 != 0 || v.values_off > plen || v.count > (plen - v.values_off) / 4)
        return TERSE_ERROR(TERSE_ERR_INTERNAL,
                           "codec '%s': its summable view (%zu floats at payload offset %zu) "
                           "does not fit a %zu-byte payload on 4-byte alignment",
                           c->ops.name, v.count, v.values_off, plen);
    *values_off = TERSE_WIRE_HEADER_SIZE + v.values_off;
    *count = v.count;
    return TERSE_OK;
}

static uint64_t fnv1a(uint64_t h, const void *p, size_t n) {
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

uint64_t terse__message_frame_digest(const uint8_t *msg, size_t len, size_t values_off,
                                     size_t count) {
    /* The header is left out: its checksum covers the values. */
    uint64_t h = fnv1a(0xcbf29ce484222325ull, &len, sizeof len);
    h = fnv1a(h, &values_off, sizeof values_off);
    h = fnv1a(h, &count, sizeof count);
    const size_t vend = values_off + 4 * count;
    h = fnv1a(h, msg + TERSE_WIRE_HEADER_SIZE, values_off - TERSE_WIRE_HEADER_SIZE);
    return fnv1a(h, msg + vend, len - vend);
}

void terse__codec_reseal(const terse_codec *c, uint8_t *msg, size_t len) {
    terse__wire_seal(msg, c->ops.id, c->n, len - TERSE_WIRE_HEADER_SIZE);
}

/* ---- segments ---- */

static void free_segments(terse__segments *g) {
    if (!g) return;
    if (g->child)
        for (uint32_t s = 0; s < g->nranks; s++) terse_codec_free(g->child[s]);
    free(g->child);
    free(g->off);
    free(g->hop);
    free(g);
}

static void free_pieces(terse__pieces *p) {
    if (!p) return;
    if (p->child)
        for (size_t s = 0; s < p->count; s++)
            if (s == 0 || p->child[s] != p->child[s - 1]) terse_codec_free(p->child[s]);
    free(p->child);
    free(p->off);
    free(p);
}

void terse__codec_free_segments(terse_codec *c) {
    free_segments(c->segs);
    c->segs = NULL;
    free_pieces(c->pieces);
    c->pieces = NULL;
}

/* The child codec for `len` elements. */
static terse_status make_child(const terse_codec *c, size_t len, terse_codec **out) {
    char opts[256];
    if (c->ops.segment_options) {
        opts[0] = '\0';
        TERSE_CHECK(c->ops.segment_options(c->self, len, opts, sizeof opts));
    } else {
        snprintf(opts, sizeof opts, "%s", c->options);
    }
    char spec[400];
    int w;
    if (c->ops.flags & TERSE_CODEC_RANDOMIZED)
        w = snprintf(spec, sizeof spec, "%s:%s%sef=0,seed=%llu", c->ops.name, opts,
                     opts[0] ? "," : "", (unsigned long long)c->seed);
    else
        w = snprintf(spec, sizeof spec, "%s:%s%sef=0", c->ops.name, opts, opts[0] ? "," : "");
    if (w < 0 || (size_t)w >= sizeof spec)
        return TERSE_ERROR(TERSE_ERR_INTERNAL, "codec '%s': a segment's spec is too long",
                           c->ops.name);
    terse_status s = terse_codec_create(spec, 1, len, out);
    if (s != TERSE_OK) {
        char why[300];
        snprintf(why, sizeof why, "%s", terse_last_error());
        return TERSE_ERROR(s, "codec '%s': creating the codec '%s' for a %zu-element segment: %s",
                           c->spec, spec, len, why);
    }
    return TERSE_OK;
}

int terse__codec_can_cut(const terse_codec *c, uint32_t nranks) {
    /* a stateful codec's children would keep state outside its snapshots
     * and checkpoints, advanced differently on different ranks */
    if (c->ops.state_size && c->ops.state_size(c->self) > 0) return 0;
    size_t align = c->ops.segment_align ? c->ops.segment_align(c->self) : 0;
    if (align == 0 || nranks < 2) return 0;
    size_t blocks = c->n / align + (c->n % align != 0);
    return blocks >= nranks; /* else a segment would be empty */
}

size_t terse__codec_cut_max_span(const terse_codec *c, uint32_t nranks, uint32_t group) {
    if (!terse__codec_can_cut(c, nranks) || group == 0 || nranks % group) return SIZE_MAX;
    const size_t align = c->ops.segment_align(c->self);
    const size_t blocks = c->n / align + (c->n % align != 0);
    const size_t q = blocks / nranks, rem = blocks % nranks;
    size_t b = 0, worst = 0;
    for (uint32_t i = 0; i < nranks; i += group) { /* as terse__codec_segments cuts */
        size_t nb = 0;
        for (uint32_t j = i; j < i + group; j++) nb += q + (j < rem ? 1 : 0);
        const size_t start = b * align, end = (b + nb) * align;
        const size_t span = (end < c->n ? end : c->n) - start;
        if (span > worst) worst = span;
        b += nb;
    }
    return worst;
}

terse_status terse__codec_segments(terse_codec *c, uint32_t nranks, uint32_t rank,
                                   const terse__segments **out) {
    *out = NULL;
    if (c->segs && c->segs->nranks == nranks && c->segs->rank == rank) {
        *out = c->segs;
        return TERSE_OK;
    }
    /* Another cut (another communicator): the new one is built first and
     * replaces the old only once complete, so a failure changes nothing.
     * The old owner's residual is dropped with it (docs: a codec keeps the
     * re-encode residual of one communicator). */
    if (!terse__codec_can_cut(c, nranks)) return TERSE_OK;
    size_t align = c->ops.segment_align(c->self);
    size_t blocks = c->n / align + (c->n % align != 0);

    terse_status s = TERSE_OK;
    terse__segments *g = calloc(1, sizeof *g);
    if (!g) return TERSE_ERROR(TERSE_ERR_NOMEM, "allocating a codec's segments");
    g->nranks = nranks;
    g->rank = rank;
    g->off = calloc(2 * (size_t)nranks, sizeof(size_t));
    g->child = calloc(nranks, sizeof *g->child);
    if (!g->off || !g->child) TERSE_FAIL_GOTO(s, fail, TERSE_ERR_NOMEM, "allocating segments");
    g->len = g->off + nranks;
    size_t q = blocks / nranks, rem = blocks % nranks, b = 0;
    for (uint32_t i = 0; i < nranks; i++) {
        size_t nb = q + (i < rem ? 1 : 0), end = (b + nb) * align;
        g->off[i] = b * align;
        g->len[i] = (end < c->n ? end : c->n) - g->off[i];
        b += nb;
    }
    for (uint32_t i = 0; i < nranks; i++) {
        TERSE_CHECK_GOTO(make_child(c, g->len[i], &g->child[i]), s, fail);
        size_t bound = terse_codec_bound(g->child[i]);
        if (bound > g->max_bound) g->max_bound = bound;
    }
    if (c->ef) {
        g->hop = calloc(g->len[rank], sizeof(float));
        if (!g->hop)
            TERSE_FAIL_GOTO(s, fail, TERSE_ERR_NOMEM, "allocating a %zu-element hop residual",
                            g->len[rank]);
    }
    terse__codec_free_segments(c);
    c->segs = g;
    *out = g;
    return TERSE_OK;
fail:
    free_segments(g);
    return s;
}

uint64_t terse__codec_cut_digest(const terse_codec *c) {
    const terse__segments *g = c->segs;
    uint64_t h = fnv1a(0xcbf29ce484222325ull, c->spec, strlen(c->spec));
    h = fnv1a(h, &c->n, sizeof c->n);
    h = fnv1a(h, g->off, g->nranks * sizeof(size_t));
    return fnv1a(h, g->len, g->nranks * sizeof(size_t));
}

static void child_stream(terse_codec *child, const terse_codec *c, uint64_t s, uint32_t rank) {
    child->step = c->step;
    child->tensor = terse__mix64(c->tensor ^ terse__mix64(s + 1));
    child->rank = rank;
}

terse_status terse__codec_encode_segments(terse_codec *c, const float *x, uint8_t *msgs,
                                          size_t slot, size_t *len) {
    const terse__segments *g = c->segs;
    const float *src = x;
    TERSE_CHECK(terse__codec_check_input(c, x));
    if (c->ef) {
        for (size_t i = 0; i < c->n; i++) c->residual[i] += x[i];
        src = c->residual;
    }
    terse_status st = TERSE_OK;
    uint32_t s = 0;
    for (; st == TERSE_OK && s < g->nranks; s++) {
        terse_codec *child = g->child[s];
        uint8_t *m = msgs + (size_t)s * slot;
        child_stream(child, c, s, c->rank);
        st = terse_encode(child, src + g->off[s], m, slot, &len[s]);
        if (st == TERSE_OK && c->ef)
            st = terse_decode(child, m, len[s], c->residual + g->off[s], -1.0f, 1);
    }
    /* On failure e is left part-way; the collective puts back its
     * snapshot (algos/coll/allreduce.c), as for every state it touches. */
    return st;
}

terse_status terse__codec_requantize(terse_codec *c, const float *sum, uint8_t *msg, size_t cap,
                                     size_t *len) {
    const terse__segments *g = c->segs;
    const uint32_t r = g->rank;
    terse_codec *child = g->child[r];
    const float *src = sum;
    if (g->hop) {
        for (size_t i = 0; i < g->len[r]; i++) g->hop[i] += sum[i];
        src = g->hop;
    }
    child_stream(child, c, r, c->rank | HOP_RANK_BIT);
    TERSE_CHECK(terse_encode(child, src, msg, cap, len));
    if (g->hop) TERSE_CHECK(terse_decode(child, msg, *len, g->hop, -1.0f, 1));
    return TERSE_OK;
}

terse_status terse__codec_encode_segment(terse_codec *c, uint32_t s, const float *x, uint8_t *msg,
                                         size_t cap, size_t *len) {
    const terse__segments *g = c->segs;
    const size_t off = g->off[s], n = g->len[s];
    const float *src = x;
    if (c->ef) {
        float *e = c->residual + off;
        if (x < e + n && e < x + n)
            return TERSE_ERROR(TERSE_ERR_INVALID,
                               "codec '%s': a segment's input overlaps the codec's residual",
                               c->ops.name);
        for (size_t i = 0; i < n; i++) e[i] += x[i];
        src = e;
    }
    terse_codec *child = g->child[s];
    child_stream(child, c, s, c->rank);
    TERSE_CHECK(terse_encode(child, src, msg, cap, len));
    if (c->ef) TERSE_CHECK(terse_decode(child, msg, *len, c->residual + off, -1.0f, 1));
    return TERSE_OK;
}

terse_status terse__codec_decode_segment(terse_codec *c, uint32_t s, const uint8_t *msg,
                                         size_t len, float *dst, float alpha, int accumulate) {
    return terse_decode(c->segs->child[s], msg, len, dst, alpha, accumulate);
}

void terse__codec_segments_done(terse_codec *c) { c->step++; }

/* ---- pieces ---- */

int terse__codec_fixed_size(const terse_codec *c) {
    return (c->ops.flags & TERSE_CODEC_FIXED_SIZE) != 0;
}

terse_status terse__codec_check_fixed(const terse_codec *c, int rank, size_t len, size_t bound) {
    if (!terse__codec_fixed_size(c) || len == bound) return TERSE_OK;
    return TERSE_ERROR(TERSE_ERR_INTERNAL,
                       "rank %d: codec '%s' declares TERSE_CODEC_FIXED_SIZE but wrote a "
                       "%zu-byte message where its bound is %zu",
                       rank, c->spec, len, bound);
}

/* Blocks of segment_align a piece holds, and how many pieces: 0 if the
 * codec is not cut into pieces. */
static size_t piece_blocks(const terse_codec *c, size_t piece_elems, size_t *count) {
    *count = 0;
    if (c->ops.segment_options || piece_elems == 0 || !terse__codec_can_cut(c, 2)) return 0;
    const size_t align = c->ops.segment_align(c->self);
    const size_t blocks = c->n / align + (c->n % align != 0);
    const size_t per = piece_elems / align > 0 ? piece_elems / align : 1;
    *count = blocks / per + (blocks % per != 0);
    if (*count < 2) *count = 0;
    return per;
}

size_t terse__codec_piece_count(const terse_codec *c, size_t piece_elems) {
    size_t count;
    piece_blocks(c, piece_elems, &count);
    return count > 1 ? count : 1;
}

terse_status terse__codec_pieces(terse_codec *c, size_t piece_elems, const terse__pieces **out) {
    *out = NULL;
    if (c->pieces && c->pieces->elems == piece_elems) {
        *out = c->pieces;
        return TERSE_OK;
    }
    size_t count;
    const size_t per = piece_blocks(c, piece_elems, &count);
    if (count < 2) return TERSE_OK;
    const size_t align = c->ops.segment_align(c->self);

    terse_status s = TERSE_OK;
    terse__pieces *p = calloc(1, sizeof *p);
    if (!p) return TERSE_ERROR(TERSE_ERR_NOMEM, "allocating a codec's pieces");
    p->count = count;
    p->elems = piece_elems;
    p->off = calloc(2 * count, sizeof(size_t));
    p->child = calloc(count, sizeof *p->child);
    if (!p->off || !p->child) TERSE_FAIL_GOTO(s, fail, TERSE_ERR_NOMEM, "allocating %zu pieces",
                                             count);
    p->len = p->off + count;
    for (size_t i = 0; i < count; i++) {
        p->off[i] = i * per * align;
        p->len[i] = p->off[i] + per * align < c->n ? per * align : c->n - p->off[i];
        if (i > 0 && p->len[i] == p->len[i - 1]) {
            p->child[i] = p->child[i - 1];
            continue;
        }
        TERSE_CHECK_GOTO(make_child(c, p->len[i], &p->child[i]), s, fail);
        size_t bound = terse_codec_bound(p->child[i]);
        if (bound > p->max_bound) p->max_bound = bound;
    }
    free_pieces(c->pieces);
    c->pieces = p;
    *out = p;
    return TERSE_OK;
fail:
    free_pieces(p);
    return s;
}

uint64_t terse__codec_pieces_digest(const terse_codec *c, const terse__pieces *p) {
    uint64_t h = fnv1a(0xcbf29ce484222325ull, c->spec, strlen(c->spec));
    h = fnv1a(h, &c->n, sizeof c->n);
    size_t count = p ? p->count : 1;
    h = fnv1a(h, &count, sizeof count);
    if (p) h = fnv1a(h, p->len, count * sizeof(size_t)); /* offsets follow from lengths */
    return h;
}

terse_status terse__codec_encode_piece(terse_codec *c, size_t s, const float *x, uint8_t *msg,
                                       size_t cap, size_t *len) {
    const terse__pieces *p = c->pieces;
    const size_t off = p->off[s], n = p->len[s];
    TERSE_CHECK(terse__codec_check_input(c, x));
    const float *src = x + off;
    if (c->ef) {
        float *e = c->residual + off;
        for (size_t i = 0; i < n; i++) e[i] += src[i];
        src = e;
    }
    terse_codec *child = p->child[s];
    child_stream(child, c, s, c->rank);
    TERSE_CHECK(terse_encode(child, src, msg, cap, len));
    if (c->ef) TERSE_CHECK(terse_decode(child, msg, *len, c->residual + off, -1.0f, 1));
    return TERSE_OK;
}

terse_status terse__codec_decode_piece(terse_codec *c, size_t s, const uint8_t *msg, size_t len,
                                       float *x, float alpha, int accumulate) {
    const terse__pieces *p = c->pieces;
    return terse_decode(p->child[s], msg, len, x + p->off[s], alpha, accumulate);
}
