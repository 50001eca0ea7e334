/* How a codec aggregates, as the collectives see it (compress/aggregate.c).
 *
 * algos/ drives every codec through these calls, which read only the
 * codec's function table (terse_plugin.h, "How the collectives
 * aggregate"): no codec id, no codec's private header. The built-in codecs
 * and plugins take the same paths. */
#ifndef TERSE_COMPRESS_AGGREGATE_H
#define TERSE_COMPRESS_AGGREGATE_H

#include <stddef.h>
#include <stdint.h>

#include "terse.h"

typedef enum {
    TERSE__AGG_ROUNDS,   /* the codec's rounds of dense sums */
    TERSE__AGG_SUMMABLE, /* sum the values inside the messages */
    TERSE__AGG_MESSAGES  /* the messages travel: gather or reduce-scatter */
} terse__agg_kind;

terse__agg_kind terse__codec_agg_kind(const terse_codec *c);

/* ---- rounds ---- */

unsigned terse__codec_rounds(const terse_codec *c);
/* Round r's vector to sum, for this codec (its ctx: seed, step, stream,
 * residual) in a job of nranks. */
terse_status terse__codec_round_vector(terse_codec *c, uint32_t nranks, unsigned r, float *x,
                                       float **vec, size_t *count);
/* x = alpha * the aggregate; the codec's step advances. */
terse_status terse__codec_round_finish(terse_codec *c, uint32_t nranks, float *x, float alpha);

/* ---- summable messages ---- */

/* Where the values sit in msg (a whole message of len bytes this codec just
 * encoded): *values_off from the message's first byte, 4-aligned. Checks
 * the view against the message (TERSE_ERR_INTERNAL naming the codec if it
 * is out of bounds). */
terse_status terse__codec_summable_view(const terse_codec *c, const uint8_t *msg, size_t len,
                                        size_t *values_off, size_t *count);
/* A 64-bit digest of the message's bytes outside [values_off, +4 count)
 * and of its length: equal on every rank when the messages may be added. */
uint64_t terse__message_frame_digest(const uint8_t *msg, size_t len, size_t values_off,
                                     size_t count);
/* Recompute the header checksum of msg after its values were changed. */
void terse__codec_reseal(const terse_codec *c, uint8_t *msg, size_t len);

/* ---- segments (the compressed reduce-scatter) ---- */

/* The cut of a codec's tensor into nranks segments, one per rank. */
typedef struct terse__segments {
    uint32_t nranks, rank;
    size_t *off, *len;   /* nranks each, in elements */
    terse_codec **child; /* nranks codecs of 1 x len[s], ef=0 */
    float *hop;          /* ef=1: len[rank] floats, the owner's re-encode residual */
    size_t max_bound;    /* the largest child's terse_codec_bound */
} terse__segments;

/* Nonzero if the codec's tensor can be cut into nranks non-empty
 * segments (segment_align given, and at least nranks buckets). */
int terse__codec_can_cut(const terse_codec *c, uint32_t nranks);
/* The largest span, in elements, of `group` consecutive segments (chunk t:
 * segments t group .. t group + group - 1) of the cut terse__codec_segments
 * makes with nranks parts; SIZE_MAX if it cannot cut so. No allocation. */
size_t terse__codec_cut_max_span(const terse_codec *c, uint32_t nranks, uint32_t group);

/* Prepare (or reuse) the cut for nranks ranks, this one being `rank`:
 * *out = NULL (and TERSE_OK) when the codec cannot be cut -- no
 * segment_align, or a segment would be empty. Call it before the codec is
 * snapshotted: the hop residual is part of the snapshot. */
terse_status terse__codec_segments(terse_codec *c, uint32_t nranks, uint32_t rank,
                                   const terse__segments **out);

/* Encode this rank's x, segment by segment, into msgs + s * slot (slot >=
 * max_bound), lengths in len[s]; with ef=1 the codec's residual is applied
 * and updated exactly as terse_encode would for the whole tensor. On
 * failure the residual is left part-way: restore the snapshot. */
terse_status terse__codec_encode_segments(terse_codec *c, const float *x, uint8_t *msgs,
                                          size_t slot, size_t *len);
/* A digest of what every rank's codec must agree on for the cut to
 * match: its canonical spec, element count and segments (prepared). */
uint64_t terse__codec_cut_digest(const terse_codec *c);
/* The owner's re-encode of its segment's sum (len[rank] floats; with ef=1
 * through the hop residual) into msg (cap >= max_bound). */
terse_status terse__codec_requantize(terse_codec *c, const float *sum, uint8_t *msg, size_t cap,
                                     size_t *len);
/* Encode `x`, the len[s] floats of segment s (not the whole tensor), as
 * this rank's message for that segment; with ef=1 through the parent's
 * residual over the segment's elements (terse_encode's rule on them; the
 * rest of the residual is untouched). For the compressed hierarchical
 * all-reduce: the owner of segment s encodes its host's sum. On failure
 * restore the snapshot. */
terse_status terse__codec_encode_segment(terse_codec *c, uint32_t s, const float *x, uint8_t *msg,
                                         size_t cap, size_t *len);
/* Decode piece msg of segment s into dst (len[s] floats). */
terse_status terse__codec_decode_segment(terse_codec *c, uint32_t s, const uint8_t *msg,
                                         size_t len, float *dst, float alpha, int accumulate);
/* The collective is done: the codec's step advances. */
void terse__codec_segments_done(terse_codec *c);

/* ---- pieces (the pipelined all-gather) ---- */

/* The cut of a codec's tensor into pieces of about piece_elems elements,
 * at multiples of segment_align, each coded by a child codec as a
 * segment is (above), so that piece s of every rank can travel and be
 * decoded while piece s + 1 is encoded. Pieces have no owner and no
 * residual of their own: error feedback stays the parent's. */
typedef struct terse__pieces {
    size_t count;        /* >= 2 */
    size_t elems;        /* the piece_elems it was cut for */
    size_t *off, *len;   /* count each, in elements */
    terse_codec **child; /* count pointers; pieces of equal length share one */
    size_t max_bound;    /* the largest child's terse_codec_bound */
} terse__pieces;

/* Prepare (or reuse) the cut into pieces of piece_elems: *out = NULL (and
 * TERSE_OK) when the codec is not cut -- no segment_align, a
 * segment_options (a piece's message would then not say what the whole
 * message says: topk's k would be chosen per piece), state, or fewer than
 * two pieces. No state of its own: prepare it at any time. */
terse_status terse__codec_pieces(terse_codec *c, size_t piece_elems, const terse__pieces **out);
/* How many pieces terse__codec_pieces would cut: 1 when it would not cut. */
size_t terse__codec_piece_count(const terse_codec *c, size_t piece_elems);
/* Encode piece s of x (the whole tensor) into msg; with ef=1 through the
 * parent's residual for those elements, terse_encode's rule. Call for
 * s = 0, 1, ... in order within one collective; then
 * terse__codec_segments_done. On failure restore the snapshot. */
terse_status terse__codec_encode_piece(terse_codec *c, size_t s, const float *x, uint8_t *msg,
                                       size_t cap, size_t *len);
/* Decode a message of piece s into its elements of x (the whole tensor). */
terse_status terse__codec_decode_piece(terse_codec *c, size_t s, const uint8_t *msg, size_t len,
                                       float *x, float alpha, int accumulate);
/* A digest of what every rank's codec must agree on for its pieces to be
 * decoded by the others: canonical spec, element count and the cut
 * (p as prepared, or NULL: one whole message). */
uint64_t terse__codec_pieces_digest(const terse_codec *c, const terse__pieces *p);

/* Nonzero if every message of the codec is exactly terse_codec_bound
 * bytes (TERSE_CODEC_FIXED_SIZE): receivers then know the size. */
int terse__codec_fixed_size(const terse_codec *c);
/* TERSE_ERR_INTERNAL naming the codec if it declares fixed sizes and a
 * message it just encoded is len bytes where its bound is bound. */
terse_status terse__codec_check_fixed(const terse_codec *c, int rank, size_t len, size_t bound);

/* ---- transactional state ---- */

/* A codec's mutable state (step, residual, the codec's own state such as
 * PowerSGD's Q) copied out and back, for collectives that must leave a
 * codec as it was when they fail (compress/state.c). No header and no
 * checksum: a snapshot never leaves the process. */
size_t terse__codec_snapshot_size(const terse_codec *c);
terse_status terse__codec_snapshot(const terse_codec *c, void *dst);
terse_status terse__codec_restore(terse_codec *c, const void *src);

#endif
