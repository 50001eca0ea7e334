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
/* Decode piece msg of segment s into dst (len[s] floats). */
terse_status terse__codec_decode_segment(terse_codec *c, uint32_t s, const uint8_t *msg,
                                         size_t len, float *dst, float alpha, int accumulate);
/* The collective is done: the codec's step advances. */
void terse__codec_segments_done(terse_codec *c);

/* ---- transactional state ---- */

/* A codec's mutable state (step, residual, the codec's own state such as
 * PowerSGD's Q) copied out and back, for collectives that must leave a
 * codec as it was when they fail (compress/state.c). No header and no
 * checksum: a snapshot never leaves the process. */
size_t terse__codec_snapshot_size(const terse_codec *c);
terse_status terse__codec_snapshot(const terse_codec *c, void *dst);
terse_status terse__codec_restore(terse_codec *c, const void *src);

#endif
