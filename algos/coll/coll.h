/* The collectives as the engine sees them: argument checks, the bodies
 * it runs between terse__comm_begin and terse__comm_end, and the
 * algorithms they choose among (one file each, gloo style).
 *
 * This layer sits on the communicator's services (algos/comm/comm.h) and
 * knows nothing of requests or the progress thread: the engine
 * (algos/engine/) calls down into it, never the other way. */
#ifndef TERSE_ALGOS_COLL_H
#define TERSE_ALGOS_COLL_H

#include "algos/comm/comm.h"

/* Argument checks done at start, on the caller's thread. */
terse_status terse__allreduce_check(terse_comm *c, float *buf, size_t n, terse_codec *codec,
                                    terse_op op);
terse_status terse__broadcast_check(terse_comm *c, void *buf, size_t bytes, int root);
terse_status terse__allgather_check(terse_comm *c, const void *send, size_t send_bytes,
                                    void *recv, size_t recv_cap);

/* The collectives themselves, run by the executor between
 * terse__comm_begin and terse__comm_end. */
terse_status terse__allreduce_run(terse_comm *c, float *buf, size_t n, terse_codec *codec,
                                  terse_op op);
terse_status terse__broadcast_run(terse_comm *c, void *buf, size_t bytes, int root);
terse_status terse__allgather_run(terse_comm *c, const void *send, size_t send_bytes, void *recv,
                                  size_t recv_cap, size_t *counts, int *keep_usable);
terse_status terse__barrier_run(terse_comm *c);

/* ---- algorithms (one file each) ---- */

/* Dense fp32 sum in place (any n, including 0). Chooses recursive doubling
 * for small buffers and the pipelined ring for large ones. If divide is
 * nonzero the result is divided by nranks (op average). */
terse_status terse__allreduce_dense(terse_comm *c, float *buf, size_t n, int divide);
terse_status terse__allreduce_ring(terse_comm *c, float *buf, size_t n, int divide);
terse_status terse__allreduce_rd(terse_comm *c, float *buf, size_t n, int divide);
/* The hierarchical one (hier_allreduce.c): reduce-scatter inside each host,
 * one rail per shard across hosts, all-gather inside each host. For several
 * hosts, some holding more than one rank, of any sizes, TERSE_TOPOLOGY not
 * flat; terse__hier_wanted: also above the recursive-doubling size under
 * auto (any size under hier). terse__hier_fits: the same, and hosts of
 * equal size (what the compressed hierarchical path needs). */
terse_status terse__allreduce_hier(terse_comm *c, float *buf, size_t n, int divide);
int terse__hier_fits(const terse_comm *c);
/* The same over each host's shared segment (seg_allreduce.c: the
 * intra-host phases in the segment, the rail through the transport), when
 * every host with several ranks made one (c->lseg_on) and fits: the
 * choice wherever terse__hier_wanted holds. */
terse_status terse__allreduce_hier_seg(terse_comm *c, float *buf, size_t n, int divide);
int terse__hier_seg_fits(const terse_comm *c);
/* Over the host's shared segment (seg_allreduce.c), at every size, when
 * every rank is on one host and init made one (c->seg, comm_segment.c). */
terse_status terse__allreduce_seg(terse_comm *c, float *buf, size_t n, int divide);
/* The barrier over the same segment (seg_allreduce.c). */
terse_status terse__barrier_seg(terse_comm *c);
/* The barrier over each host's segment and among the hosts' first ranks
 * (seg_allreduce.c), when c->lseg_on. */
terse_status terse__barrier_hier_seg(terse_comm *c);
int terse__hier_wanted(const terse_comm *c, size_t n);
/* local[j]: the rank of local rank j on this host; rail[g]: the rank of
 * this local rank on host g (this rank itself at its own slots). */
void terse__hier_peers(const terse_comm *c, int *local, int *rail);
/* The rank on host h with local rank l (-1 if host h has no such rank). */
int terse__hier_rank_at(const terse_comm *c, int h, int l);

/* The compressed hierarchical one (codec_hier_allreduce.c): for codecs
 * whose messages travel and whose tensor can be cut into local_size
 * segments, where terse__hier_wanted holds for the codec's element count
 * and TERSE_COMPRESSED_ALGO is auto: exact fp32 reduce-scatter inside the
 * host, each segment's host sum encoded once by its owner and exchanged
 * along its rail, fp32 all-gather inside the host. */
int terse__codec_hier_wanted(const terse_comm *c, const terse_codec *codec);
/* How many segments it cuts the codec into: local_size, or local_size x T
 * chunks for a fixed-size codec whose shards would exceed two ring chunks
 * (pipelined). */
uint32_t terse__codec_hier_parts(const terse_comm *c, const terse_codec *codec);
/* Over each host's segment (seg_allreduce.c), for fixed-size codecs with
 * c->lseg_on: terse__codec_hier_seg_ok says whether a codec takes it
 * (every rank alike), terse__codec_hier_seg_fits whether the prepared cut
 * fits (every chunk of S segments within a segment step). */
struct terse__segments;
int terse__codec_hier_seg_ok(const terse_comm *c, const terse_codec *codec);
int terse__codec_hier_seg_fits(const terse_comm *c, const struct terse__segments *g);
terse_status terse__allreduce_codec_hier_seg(terse_comm *c, float *buf, terse_codec *codec,
                                             terse_op op, const struct terse__segments *g);
/* The rank this rank passes for the cut: its local rank if it owns segments
 * (local rank < S, the fewest ranks a host holds), else 0 (it owns none). */
static inline uint32_t terse__codec_hier_cut_rank(const terse_comm *c) {
    return (uint32_t)(c->local_rank < c->local_min ? c->local_rank : 0);
}
terse_status terse__allreduce_codec_hier(terse_comm *c, float *buf, size_t n, terse_codec *codec,
                                         terse_op op);

/* Buffers at most this many bytes take recursive doubling (TERSE_RD_MAX_BYTES). */
static inline size_t terse__rd_max_bytes(const terse_comm *c) { return c->params.rd_max_bytes; }

/* Compressed paths, chosen by terse_allreduce from the codec's table
 * (compress/aggregate.h). */
terse_status terse__allreduce_gather(terse_comm *c, float *buf, size_t n, terse_codec *codec,
                                     terse_op op);
terse_status terse__allreduce_rs(terse_comm *c, float *buf, size_t n, terse_codec *codec,
                                 terse_op op);
/* The pipelined all-gather (pipe_allreduce.c): p is the codec's cut into
 * pieces, or NULL for one whole message. terse__pipe_fits says whether N
 * ranks' requests fit the communicator for such a codec. */
int terse__pipe_fits(int N, int fixed);
struct terse__pieces;
terse_status terse__allreduce_pipe(terse_comm *c, float *buf, size_t n, terse_codec *codec,
                                   terse_op op, const struct terse__pieces *p);
terse_status terse__allreduce_summable(terse_comm *c, float *buf, size_t n, terse_codec *codec,
                                       terse_op op);
terse_status terse__allreduce_rounds(terse_comm *c, float *buf, size_t n, terse_codec *codec,
                                     terse_op op);

/* Exchange `bytes` per rank (framing): all + r * bytes = rank r's `mine`. */
terse_status terse__allgather_fixed(terse_comm *c, const void *mine, size_t bytes, void *all);

/* Exchange one 8-byte value per rank (framing): all[r] = rank r's value. */
terse_status terse__allgather_u64(terse_comm *c, uint64_t mine, uint64_t *all);

/* Ring all-gather of variable blocks already sized: block r lives at
 * buf + off[r] and is len[r] bytes; this rank's block is already in place.
 * Counts as payload. */
terse_status terse__allgatherv_ring(terse_comm *c, uint8_t *buf, const size_t *off,
                                    const size_t *len);

#endif
