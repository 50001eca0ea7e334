/*
 * terse.h -- the public C ABI of terse, a library that makes data-parallel
 * training send fewer bytes.
 *
 * This header is the manual. Every function states its contract, what it
 * returns, and who owns what. Nothing here requires reading the sources.
 *
 * Conventions
 *   - Public names start with terse_ / TERSE_. Everything else is private.
 *   - Every fallible call returns a terse_status; TERSE_OK (0) is success.
 *     On failure, terse_last_error() returns a sentence with context (which
 *     codec, which spec token, which byte offset) for the calling thread.
 *   - Objects are opaque handles with a create/free pair; free accepts NULL.
 *   - No function keeps a pointer to a caller's buffer after it returns.
 *
 * Threading
 *   A codec is used by one thread at a time. Different codecs may be used
 *   from different threads at once; they share nothing mutable except the
 *   codec registry, which is locked.
 *
 * Copyright 2026 the terse authors. SPDX-License-Identifier: Apache-2.0
 */
#ifndef TERSE_H
#define TERSE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define TERSE_API
#elif defined(__GNUC__) || defined(__clang__)
#define TERSE_API __attribute__((visibility("default")))
#else
#define TERSE_API
#endif

/* ------------------------------------------------------------------------ */
/* Version                                                                  */
/* ------------------------------------------------------------------------ */

#define TERSE_VERSION_MAJOR 0
#define TERSE_VERSION_MINOR 1
#define TERSE_VERSION_PATCH 0
/* MAJOR*10000 + MINOR*100 + PATCH, comparable with terse_version(). */
#define TERSE_VERSION_NUMBER \
    (TERSE_VERSION_MAJOR * 10000 + TERSE_VERSION_MINOR * 100 + TERSE_VERSION_PATCH)

/* The version of the library actually loaded, as TERSE_VERSION_NUMBER. */
TERSE_API unsigned terse_version(void);
/* The same as a static string, e.g. "0.1.0". */
TERSE_API const char *terse_version_string(void);

/* ------------------------------------------------------------------------ */
/* Status codes                                                             */
/* ------------------------------------------------------------------------ */

/*
 * Values are fixed forever: new codes are appended, none is renumbered.
 * X(name, value, description) -- the same list generates the strings.
 */
#define TERSE_STATUS_LIST(X)                                                   \
    X(TERSE_OK, 0, "success")                                                  \
    X(TERSE_ERR_INVALID, 1, "invalid argument or spec string")                 \
    X(TERSE_ERR_NOMEM, 2, "out of memory")                                     \
    X(TERSE_ERR_TRUNCATED, 3, "message is shorter than its header says")       \
    X(TERSE_ERR_CORRUPT, 4, "message is corrupt (checksum or field mismatch)") \
    X(TERSE_ERR_VERSION, 5, "message has an unsupported format version")       \
    X(TERSE_ERR_MAGIC, 6, "not a terse message (bad magic)")                   \
    X(TERSE_ERR_CODEC_MISMATCH, 7, "message was made by a different codec")    \
    X(TERSE_ERR_SHAPE, 8, "element count does not match the codec's shape")   \
    X(TERSE_ERR_DST_TOO_SMALL, 9, "destination buffer is too small")           \
    X(TERSE_ERR_EXISTS, 10, "a codec with that id or name already exists")    \
    X(TERSE_ERR_NOT_FOUND, 11, "no such codec")                                \
    X(TERSE_ERR_UNSUPPORTED, 12, "operation not supported")                    \
    X(TERSE_ERR_INTERNAL, 13, "internal error (a bug in terse)")               \
    X(TERSE_ERR_TIMEOUT, 14, "operation timed out")                            \
    X(TERSE_ERR_PEER_LOST, 15, "a peer rank was lost")                         \
    X(TERSE_ERR_TRANSPORT, 16, "transport (libfabric) error")                  \
    X(TERSE_ERR_AUTH, 17, "authentication failed")                             \
    X(TERSE_ERR_IO, 18, "input/output error")                                 \
    X(TERSE_ERR_ABORTED, 19, "the communicator was aborted")                  \
    X(TERSE_ERR_STALE, 20, "a parameter-server push came too late or too stale")      \
    X(TERSE_ERR_NONFINITE, 21, "a value is NaN or infinite")

typedef enum terse_status {
#define TERSE_STATUS_ENUM_(name, value, text) name = value,
    TERSE_STATUS_LIST(TERSE_STATUS_ENUM_)
#undef TERSE_STATUS_ENUM_
} terse_status;

/* A static, never-NULL description of a status ("unknown status" for values
 * this version does not know). */
TERSE_API const char *terse_strerror(terse_status status);

/* The symbolic name of a status, e.g. "TERSE_ERR_CORRUPT". */
TERSE_API const char *terse_status_name(terse_status status);

/*
 * A sentence describing the last error raised on the calling thread, with
 * context (codec, spec token, byte offset, source location). Valid until the
 * next terse call on this thread that fails; "" if none has failed.
 */
TERSE_API const char *terse_last_error(void);

/* ------------------------------------------------------------------------ */
/* Codecs                                                                   */
/* ------------------------------------------------------------------------ */

/*
 * A codec compresses one tensor of fp32 values, shaped rows x cols (row
 * major; a vector is n x 1). It owns per-tensor state: the error-feedback
 * residual, PowerSGD's warm-start factor, the random stream position. Keep
 * one codec per parameter tensor (or bucket).
 *
 * Spec grammar (what a user types on a command line):
 *
 *     spec   := name [ ':' option { ',' option } ]
 *     option := key '=' value
 *
 * Whitespace is not allowed. Keys may appear once. Every codec accepts
 *     ef=0|1        error feedback (default 0): each encode sends C(g + e)
 *                   and keeps e = (g + e) - D(C(g + e)).
 * Codecs that draw random numbers also accept
 *     seed=N        64-bit seed (default 0). Streams are keyed by
 *                   (seed, step, tensor, rank); see terse_codec_set_stream.
 *
 * Built-in codecs (bits per element are nominal, excluding the 32-byte
 * header):
 *
 *   none                  fp32 passthrough, the baseline. 32 bits.
 *   fp16                  IEEE binary16, round to nearest even. 16 bits.
 *                         Overflow (|x| >= 65520) becomes +-Inf, NaN stays
 *                         NaN (quiet, same sign), |x| below 2^-14 rounds
 *                         on the subnormal grid of step 2^-24 (|error| <=
 *                         2^-25; |x| <= 2^-25 gives a signed 0), exactly
 *                         as the IEEE conversion does. Rel. error <= 2^-11
 *                         for normal-range values.
 *   bf16                  bfloat16, round to nearest even. 16 bits. Same
 *                         exponent range as fp32: only values within half
 *                         a bf16 ulp of FLT_MAX round to Inf; NaN stays
 *                         NaN (quiet, same sign); fp32 subnormals round to
 *                         bf16 subnormals, never flushed. Rel. error <=
 *                         2^-8 for normal-range values.
 *                         Neither is summable: payloads cannot be added
 *                         without decoding them to fp32.
 *   int8:bucket=B         per-bucket absmax scale s = max|x|/127, q =
 *                         round_even(x/s), deterministic. B in [8, 2^24],
 *                         default 512. 8 + 32/B bits. |error| <= s/2
 *                         (up to fp32 rounding). A bucket holding Inf or
 *                         NaN decodes to all NaN.
 *   qsgd:bits=b,bucket=B,lsq=0|1,round=stochastic|nearest,norm=l2|max
 *                         QSGD. Per bucket: norm ||x||_2 (fp32); each
 *                         element is stochastically rounded to one of 2^b - 1
 *                         symmetric levels {-L..L}/L * norm, L = 2^(b-1)-1,
 *                         unbiased (to 2^-24 of a level), b bits packed.
 *                         E||D(E(x)) - x||^2 <= min(B/L^2, sqrt(B)/L) ||x||^2
 *                         per bucket; where that factor exceeds 1 it need
 *                         not be a contraction, and error feedback can
 *                         diverge.
 *                         lsq=1 draws the same levels l but sends the
 *                         least-squares scale L <x,l> / ||l||^2 instead of
 *                         the norm: biased, but ||D(E(x)) - x|| <= ||x||
 *                         in every bucket (up to fp32 rounding), a
 *                         contraction, which is what error feedback wants.
 *                         Same message size and format; any qsgd codec of
 *                         the shape decodes either. Default: lsq=0, or 1
 *                         when ef=1.
 *                         round=nearest replaces the stochastic rounding by
 *                         rounding to the nearest level (ties up): no
 *                         draws, so messages do not depend on seed or
 *                         step; biased, but each element's error is at
 *                         most min(|x|, norm/(2L)) (up to fp32 rounding),
 *                         and it adds no variance. Error feedback carries the rounding
 *                         error to the next step anyway, so there the
 *                         stochastic noise only costs accuracy (4 points
 *                         on a Fashion-MNIST MLP at 4 bits, bucket 512,
 *                         seeds 1-2; docs/training.md). Default:
 *                         stochastic, or nearest when ef=1. Format
 *                         unchanged.
 *                         norm=max scales by max|x| instead of ||x||_2
 *                         (the levels are {-L..L}/L * max|x|). Nearest
 *                         rounding against the L2 norm never sends a flat
 *                         bucket (each element is 1/sqrt(B) of the norm,
 *                         under half a level unless L > sqrt(B)/2), and
 *                         error feedback cannot fix that (the residual
 *                         stays flat); against max|x| the largest element
 *                         is always a whole level. Default: l2, or max
 *                         when round=nearest. Format unchanged.
 *                         b in [2, 8] (default 4), B in [8,
 *                         2^24] (default 512). A bucket holding Inf or NaN,
 *                         or whose norm overflows fp32, decodes to NaN
 *                         throughout; other buckets are unaffected.
 *                         Accepts seed=.
 *   terngrad:bucket=B,lsq=0|1,round=stochastic|nearest
 *                         TernGrad. Per bucket: scale s = max|x| (fp32); each
 *                         element becomes s*sign(x) with probability |x|/s,
 *                         else 0: unbiased, 2 bits packed. Not a
 *                         contraction in general: the expected error
 *                         sum |x|(s - |x|) exceeds ||x||^2 on Gaussian
 *                         buckets of 512.
 *                         lsq=1 keeps the same draws but sends as s the
 *                         mean |x| of the elements kept (the least-squares
 *                         scale): biased, a contraction per bucket, for
 *                         error feedback; format unchanged. Default: lsq=0,
 *                         or 1 when ef=1.
 *                         round=nearest keeps an element exactly when
 *                         |x| >= max|x|/2, instead of drawing: biased,
 *                         deterministic, for error feedback, as in qsgd.
 *                         Default: stochastic, or nearest when ef=1.
 *                         B in [8, 2^24], default 512.
 *                         Inf/NaN buckets decode to NaN, as in qsgd.
 *                         Accepts seed=.
 *   sign:bucket=B         scaled sign (EF-signSGD's compressor): 1 bit per
 *                         element plus one fp32 scale per bucket, the mean
 *                         |x| of the bucket; decodes to +-mean, with +0, -0
 *                         and NaN taken as positive. B in [8, 2^24],
 *                         default 1024. A bucket holding Inf decodes to
 *                         +-Inf, one holding NaN to NaN. Biased: use with
 *                         ef=1.
 *   topk:ratio=r | k=K    the exact k largest magnitudes (k = max(1,
 *                         round(r*n)) or K), selected in O(n) time. Ties
 *                         go to the lower index; NaN counts as larger than
 *                         Inf, Inf larger than any finite value. The k
 *                         values travel as fp32 (bit-exact), the indices
 *                         as delta varints or as a bitmap, whichever is
 *                         smaller. r in (0, 1], K in [1, n]; give one of
 *                         them, or neither for ratio=0.01. Biased: use
 *                         with ef=1.
 *   randk:ratio=r|k=K,unbiased=0|1
 *                         k coordinates (k as for topk, default
 *                         ratio=0.01) drawn from a counter-based RNG
 *                         keyed by (seed, step, tensor) -- not rank -- so
 *                         every rank draws the same indices and messages
 *                         add linearly (summable). Stratified: the tensor
 *                         is split into k nearly equal strata and one
 *                         index is drawn uniformly from each. Only the
 *                         values travel. unbiased=1 scales each value by
 *                         its stratum size (E[D(E(x))] = x); unbiased=0
 *                         sends them unscaled (a contraction, which is what
 *                         error feedback wants). Default: unbiased=1, or 0
 *                         when ef=1. Accepts seed=.
 *   powersgd:rank=R       PowerSGD: one power iteration with a warm-started
 *                         Q (P = M Q, orthonormalise P by QR, Q = M^T P);
 *                         the message carries P (rows x R) and Q (cols x R)
 *                         in fp32 and decodes to P Q^T. R in [1, 1024],
 *                         default 4. Vectors, and matrices where (rows +
 *                         cols) * R * 2 >= rows * cols, fall back to dense
 *                         fp32 as PyTorch's PowerSGD hook does (so do
 *                         shapes with a side above INT_MAX, the BLAS index
 *                         limit). Accepts seed= (initial Q). Messages are
 *                         deterministic on one machine but may differ in
 *                         the last bits between CPU types (BLAS kernels).
 *   vq:dim=d,bits=b,bucket=B
 *                         vector quantization: blocks of d coordinates are
 *                         each mapped to the nearest (by angle) of 2^b
 *                         fixed unit codewords, scaled by one least-squares
 *                         gain per bucket of B elements (rounded down to
 *                         whole blocks, at least one). b/d + 32/B bits per
 *                         element, so below 1 bit per element when b < d.
 *                         d in [2, 64] (default 8), b in [1, 12] (default
 *                         8), B in [1, 2^24] (default 1024). The codebook
 *                         is generated from a fixed seed, identical on
 *                         every machine, and never travels; messages are
 *                         identical on every machine too. Relative error
 *                         on Gaussian data ~0.59 at d=8,b=8 and ~0.77 at
 *                         d=16,b=8 (table in compress/vq.c). Biased: use
 *                         with ef=1.
 *
 * A bad spec fails with TERSE_ERR_INVALID and terse_last_error() names the
 * offending token.
 */
typedef struct terse_codec terse_codec;

/* The largest tensor a codec accepts: 2^36 elements (256 GiB of fp32). */
#define TERSE_MAX_ELEMENTS ((uint64_t)1 << 36)

/*
 * Create a codec from a spec for a rows x cols tensor (rows, cols >= 1,
 * rows * cols <= TERSE_MAX_ELEMENTS). All scratch memory that encode and
 * decode need is allocated here: terse's encode and decode allocate nothing.
 * (powersgd and vq call OpenBLAS's sgemm, which itself allocates per call
 * when OpenBLAS runs multi-threaded; with OPENBLAS_NUM_THREADS=1 nothing
 * allocates after OpenBLAS's first call. The test suite checks both.)
 * On success *out owns a codec to release with terse_codec_free; on failure
 * *out is NULL.
 */
TERSE_API terse_status terse_codec_create(const char *spec, size_t rows,
                                          size_t cols, terse_codec **out);

/* Release a codec and its state. NULL is accepted and ignored. */
TERSE_API void terse_codec_free(terse_codec *codec);

/* The exact worst-case size in bytes of one encoded message, header
 * included. A buffer of this size always suffices for terse_encode. */
TERSE_API size_t terse_codec_bound(const terse_codec *codec);

/* The number of elements (rows * cols) the codec is bound to. */
TERSE_API size_t terse_codec_elements(const terse_codec *codec);

/* The canonical spec of the codec, every option spelled out (e.g.
 * "qsgd:bits=4,bucket=512,lsq=0,round=stochastic,norm=l2,ef=0,seed=0"). Owned by
 * the codec. */
TERSE_API const char *terse_codec_spec(const terse_codec *codec);

/*
 * Random streams are keyed by (seed, step, tensor, rank). The step advances
 * by one on every terse_encode. Set the tensor id (distinct per codec in a
 * model, so two tensors do not share randomness) and this process's rank
 * (so ranks round independently). Defaults: tensor 0, rank 0, step 0.
 * randk ignores rank by design: its indices must agree across ranks.
 */
TERSE_API terse_status terse_codec_set_stream(terse_codec *codec,
                                              uint64_t tensor, uint32_t rank);

/* The current step (number of encodes so far, or as restored). */
TERSE_API uint64_t terse_codec_step(const terse_codec *codec);

/*
 * Encode grad (terse_codec_elements() floats) into dst, which has cap bytes.
 * On success *len is the message size (<= terse_codec_bound). With error
 * feedback the residual is updated. Returns TERSE_ERR_DST_TOO_SMALL if cap
 * may be too small (cap < terse_codec_bound) -- nothing is written and no
 * state changes. grad and dst must not overlap.
 */
TERSE_API terse_status terse_encode(terse_codec *codec, const float *grad,
                                    void *dst, size_t cap, size_t *len);

/*
 * Decode the message src[0..len) into dst (terse_codec_elements() floats):
 *     accumulate == 0:  dst  = alpha * decoded
 *     accumulate != 0:  dst += alpha * decoded
 * The message must have been produced by a codec of the same spec and
 * shape (on any rank). Everything is validated before use: a short buffer
 * returns TERSE_ERR_TRUNCATED, a bad magic TERSE_ERR_MAGIC, an unknown
 * format version TERSE_ERR_VERSION, another codec's message
 * TERSE_ERR_CODEC_MISMATCH, a wrong element count TERSE_ERR_SHAPE, and a
 * checksum or field inconsistency TERSE_ERR_CORRUPT. On any error dst may
 * have been partially written only if the checksum matched (a crafted
 * message); a message that fails its checksum never touches dst.
 * Decoding does not change the codec's state.
 */
TERSE_API terse_status terse_decode(terse_codec *codec, const void *src,
                                    size_t len, float *dst, float alpha,
                                    int accumulate);

/* What the collectives need to know about a codec. */
typedef struct terse_codec_traits {
    size_t size;           /* set to sizeof(terse_codec_traits) before the call */
    uint32_t id;           /* registry id */
    const char *name;      /* "topk", ... (static) */
    int summable;          /* messages of equal shape add linearly (decoded sum
                              == decode of element-wise summed payloads) */
    int error_feedback;    /* ef=1 */
    int randomized;        /* may draw random numbers (qsgd and terngrad
                              with round=nearest draw none, and still say 1) */
    double bits_per_element; /* nominal, header excluded, at this shape */
    /* Added after 0.1.0 (filled only if size covers them): */
    int fixed_size;        /* every message is exactly terse_codec_bound bytes */
    size_t segment_align;  /* the collectives may cut the tensor into pieces of
                              whole blocks of this many elements (its bucket);
                              0: never cut (docs/collectives.md has the cuts) */
    int segment_options;   /* a segment's codec takes other options than the
                              tensor's (topk scales k): the pipelined
                              all-gather does not cut it */
} terse_codec_traits;

#define TERSE_CODEC_TRAITS_INIT {sizeof(terse_codec_traits), 0, NULL, 0, 0, 0, 0.0, 0, 0, 0}

/* Fill *traits (whose size field the caller set). */
TERSE_API terse_status terse_codec_get_traits(const terse_codec *codec,
                                              terse_codec_traits *traits);

/*
 * Codec state (error-feedback residual, warm-start factors, step, stream)
 * as a self-checking byte string, for checkpoints. Loading it into a codec
 * of the same spec and shape resumes bit-identically.
 *   terse_codec_state_size: exact bytes terse_codec_state_save will write.
 *   terse_codec_state_load: validates everything it records (magic,
 *   version, codec, shape, ef, seed, length, checksum) before changing
 *   anything; on error the codec is unchanged. Other options (bits, ratio,
 *   lsq, round...) are not recorded: load a state into a codec created from
 *   the same spec.
 */
TERSE_API size_t terse_codec_state_size(const terse_codec *codec);
TERSE_API terse_status terse_codec_state_save(const terse_codec *codec,
                                              void *dst, size_t cap,
                                              size_t *len);
TERSE_API terse_status terse_codec_state_load(terse_codec *codec,
                                              const void *src, size_t len);

/* Zero the error-feedback residual (if any); other state is kept. */
TERSE_API void terse_codec_reset_residual(terse_codec *codec);

/*
 * The error-feedback residual e (terse_codec_elements() floats), read only,
 * or NULL when the codec has no error feedback (or codec is NULL). Valid
 * until the codec is freed. terse_encode (and so terse_allreduce),
 * terse_codec_state_load and terse_codec_reset_residual write it; reading
 * it while another thread does is a data race. It must not be the input of
 * terse_encode or terse_allreduce (terse_encode refuses it with
 * TERSE_ERR_INVALID). Uses: watching ||e|| during training, and DGC-style
 * momentum masking: after an encode with topk, or randk with unbiased=0,
 * e[i] == 0 for every coordinate i that was sent (values travel bit-exact);
 * it is also 0 where g + e was 0, which was then sent or not to no effect.
 */
TERSE_API const float *terse_codec_residual(const terse_codec *codec);

/* ------------------------------------------------------------------------ */
/* Wire format                                                              */
/* ------------------------------------------------------------------------ */

/*
 * Every message starts with this 32-byte header, all fields little endian:
 *
 *   offset size field
 *        0    4 magic            "TRS\x01" = 0x01535254
 *        4    1 version          TERSE_WIRE_VERSION
 *        5    1 flags            0 (reserved; nonzero is corrupt)
 *        6    2 codec id         registry id of the producing codec
 *        8    8 count            number of elements
 *       16    8 payload length   bytes that follow the header
 *       24    4 crc32c           CRC32C of the header (this field as 0) and
 *                                the payload
 *       28    4 reserved         0
 */
#define TERSE_WIRE_MAGIC 0x01535254u
#define TERSE_WIRE_VERSION 1u
#define TERSE_WIRE_HEADER_SIZE 32u

typedef struct terse_wire_info {
    uint32_t codec_id;
    uint64_t count;
    uint64_t payload_len;
} terse_wire_info;

/*
 * Validate a message's header and checksum without decoding it (e.g. to
 * route it). Returns the same statuses as terse_decode for header faults.
 */
TERSE_API terse_status terse_wire_inspect(const void *src, size_t len,
                                          terse_wire_info *info);

/* ------------------------------------------------------------------------ */
/* Communicator and collectives                                             */
/* ------------------------------------------------------------------------ */

/*
 * A communicator joins the ranks of one job over libfabric. Every collective
 * is called (or started) by every rank in the same order with matching
 * arguments.
 *
 * Determinism: after any collective every rank holds bitwise-identical
 * results, and the same inputs, seeds and rank count reproduce them run to
 * run (reductions happen in a fixed order). A non-blocking collective gives
 * bitwise the result of its blocking form.
 *
 * Failure: no call blocks forever. A dead or silent peer makes every
 * collective in flight return TERSE_ERR_PEER_LOST or TERSE_ERR_TIMEOUT
 * within the timeout, and terse_last_error() names the peer. The timeout is
 * one of inactivity: a call fails when nothing it waits for has moved for
 * timeout_ms, so a long transfer that keeps moving never times out. After
 * any error the communicator can only be freed.
 *
 * Arguments that differ between ranks: every collective first tells the
 * next rank its kind, element (or byte) count, op (or root) and codec name
 * in a 64-byte call descriptor (counted in control_bytes of
 * terse_comm_stats). A rank whose neighbour passed something else fails at
 * once with TERSE_ERR_SHAPE (sizes), TERSE_ERR_CODEC_MISMATCH (codecs) or
 * TERSE_ERR_INVALID (op, root, or another collective), naming both values
 * and the rank, and tells the other ranks through the bootstrap store, so
 * they fail with the same sentence instead of waiting out their timeout.
 * A broadcast's root may return TERSE_OK before anyone found it (it only
 * sends, and its buffer is its own). Over shm the data waits for the
 * previous rank's descriptor (one hop of latency; libfabric 1.17's shm
 * spins when a longer message than was posted arrives) -- except in a
 * barrier over the hosts' shared segments in a job over several hosts,
 * which sends nothing through shm; elsewhere the descriptor travels beside
 * the data. Options of the same codec (bucket,
 * bits) are not compared: the data path finds those (TERSE_ERR_CORRUPT).
 *
 * Threading: start calls (blocking or _start), terse_group_start/_end and
 * terse_comm_free come from one thread at a time (any thread, one after the
 * other). terse_request_test, _wait and _free may be called from different
 * threads on different requests. terse_comm_abort may be called from any
 * thread at any time, also while another thread is inside a call.
 * terse_comm_get_stats may be called from any thread. Codecs handed to a
 * collective belong to it until the collective completes.
 *
 * Fork: a process may fork after terse_comm_init (PyTorch's DataLoader
 * workers do). The child at once closes its copies of the communicator's
 * bootstrap-store sockets, so that if the parent dies the other ranks are
 * still told within about a second that it was lost. The communicator
 * belongs to the parent: in the child every call on it fails with
 * TERSE_ERR_INVALID ("used in a child process forked after
 * terse_comm_init"), terse_comm_free does nothing, and no goodbye is sent.
 */
typedef struct terse_comm terse_comm;

/*
 * Creation-time configuration. Start from TERSE_COMM_CONFIG_INIT and set
 * what you need; every field left at its default is taken from the
 * environment:
 *   rank, nranks  TERSE_RANK / TERSE_SIZE, else torchrun's RANK /
 *                 WORLD_SIZE, Open MPI's OMPI_COMM_WORLD_RANK / _SIZE,
 *                 PMI_RANK / PMI_SIZE, Slurm's SLURM_PROCID / SLURM_NTASKS.
 *   addr          "host:port" where rank 0 runs the bootstrap store and the
 *                 others find it: TERSE_ADDR, else MASTER_ADDR:MASTER_PORT.
 *                 Rank 0 binds to exactly this address.
 *   provider      TERSE_PROVIDER: "shm", "tcp" (libfabric's own TCP RDM
 *                 provider, "net": it leaves a message no receive matches
 *                 in the socket, so a stranger's flood costs a rank no
 *                 memory; SECURITY.md), "rxm" (tcp;ofi_rxm, the tcp of
 *                 terse before 2026-12: it queues such messages without
 *                 bound), "verbs" (verbs;ofi_rxm), "efa", "net" (the same
 *                 as tcp), or "auto" (default: an RDMA provider if
 *                 present, else tcp; shm when all ranks share one host).
 *   token         TERSE_TOKEN: the job's shared secret, at least 16 bytes;
 *                 every connection to the store proves it knows the token
 *                 (HMAC-SHA256 challenge-response), and the keys that
 *                 authenticate data messages derive from it (TERSE_WIRE).
 *                 Required when nranks > 1. terse wipes its copies after
 *                 init; unset TERSE_TOKEN once init returns, so that
 *                 children do not inherit it. SECURITY.md has the threat
 *                 model.
 *   timeout_ms    TERSE_TIMEOUT_MS, default 60000: how long a call waits
 *                 for a peer that makes no progress before failing (an
 *                 inactivity timeout).
 *   init_timeout_ms TERSE_INIT_TIMEOUT_MS, default max(timeout_ms, 30000):
 *                 one deadline for every step of terse_comm_init (store
 *                 connection and name lookup included), long enough for
 *                 ranks that launchers start seconds apart.
 *
 * Progress: TERSE_PROGRESS=thread (default) gives every communicator a
 * progress thread that runs started collectives -- transfers, reductions
 * and codec work -- while the caller computes. It sleeps while nothing is
 * in flight; while a collective runs it polls the network (spinning
 * briefly, then yielding, then napping 20 us after 10 ms without a
 * completion), so it costs up to one core during transfers and nothing
 * between them. TERSE_PROGRESS=caller starts no thread: collectives run
 * only inside terse_request_test / _wait (and the blocking calls), on the
 * caller's thread, so terse_request_test runs the queued collectives up to
 * the one asked about and returns when they are done. Blocking calls made
 * when nothing else is in flight run on the caller's thread in either mode
 * -- except on libfabric's shm, where they go to the progress thread (its
 * watchdog can give up on a thread stuck in a dead peer's lock), unless
 * they are dense all-reduces or barriers over the host's shared segment
 * (TERSE_SHM_SEGMENT), which touch no libfabric.
 *
 * Tuning variables (environment only; set them alike on every rank). Each
 * is read once per communicator, strictly: a malformed value (a typo, an
 * unknown suffix, out of range) fails terse_comm_init with
 * TERSE_ERR_INVALID naming it. TERSE_RD_MAX_BYTES, TERSE_RING_CHUNK_BYTES,
 * TERSE_CHUNK_BYTES, TERSE_WIRE, TERSE_COMPRESSED_ALGO and
 * TERSE_PIPELINE_BYTES change how messages are cut, framed or routed:
 * init compares them across ranks and fails on every rank, naming the
 * variable and both values, when any two differ. Byte counts take k, m, g
 * suffixes (powers of 1024).
 *   TERSE_HOST              this rank's host, for grouping ranks by host
 *                           (see terse_comm_topology); default: the host
 *                           identity.
 *   TERSE_TOPOLOGY          auto (default) | flat | hier: auto and hier route
 *                           per peer (shm inside a host, the network
 *                           between hosts) when there are several hosts,
 *                           and run the hierarchical all-reduce, dense
 *                           or compressed (auto: above TERSE_RD_MAX_BYTES;
 *                           hier: at any size); flat keeps one provider for every pair
 *                           and the flat algorithms (see
 *                           terse_comm_topology). Compared at init.
 *   TERSE_SHM_SEGMENT       auto (default) | off: with every rank on one
 *                           host over shm (and TERSE_WIRE not mac or
 *                           seal), the ranks make a shared-memory segment
 *                           of their own at init (mode 0600, a random
 *                           name, unlinked once every rank has it) and
 *                           the dense all-reduce runs over it instead of
 *                           libfabric's shm (terse_allreduce_algorithm:
 *                           "dense-seg"): each element summed in rank
 *                           order, nothing through the transport, so
 *                           terse_comm_stats counts no bytes for it. A
 *                           rank killed or stopped in it is named within
 *                           the store's grace or the timeout, as on the
 *                           transport. In a job over several hosts (not
 *                           TERSE_TOPOLOGY=flat; TERSE_WIRE auto or none),
 *                           each host with several ranks makes one the same
 *                           way, and the hierarchical dense all-reduce runs
 *                           its intra-host phases over it ("dense-hier-seg";
 *                           the bits are those of "dense-hier", and only
 *                           the bytes between hosts go through the
 *                           transport and are counted). off keeps
 *                           libfabric's shm. Compared at init.
 *   TERSE_SEGMENT_STEP_BYTES what one step of the segment's all-reduce
 *                           moves (4 KiB .. 16 MiB; default 256 KiB with
 *                           every rank on one host, 1 MiB in a job over
 *                           several hosts, where a step's shard is also a
 *                           message between hosts; the segment holds
 *                           2 (ranks + 1) steps). Compared at init.
 *   TERSE_CHECK_CALLS       on (default) | off: off sends no call
 *                           descriptors (see "Arguments that differ
 *                           between ranks" above), saving one small message
 *                           each way per collective -- measurable only on
 *                           small calls (docs/collectives.md gives the
 *                           figures) -- at the price of a mismatch showing
 *                           up as a timeout, a MAC failure or corrupt data.
 *                           Compared at init.
 *   TERSE_IFACE             network interface (tcp) or device (verbs, efa)
 *                           to use; default: loopback when all ranks share
 *                           a host, else libfabric's first choice.
 *   TERSE_CHUNK_BYTES       transport chunk size (default 1 MiB; K/M suffix).
 *   TERSE_RING_CHUNK_BYTES  ring pipeline chunk (default 512 KiB).
 *   TERSE_RD_MAX_BYTES      dense buffers up to this size use recursive
 *                           doubling instead of the ring (default 64 KiB).
 *   TERSE_WIRE              auto (default) | mac | seal | none. mac: every data
 *                           chunk carries a 16-byte Poly1305 tag under
 *                           per-pair keys; a chunk that fails is dropped
 *                           and counted (stats.auth_failures) and, if the
 *                           real one never comes, the call fails with
 *                           TERSE_ERR_AUTH naming the peer. auto = mac on
 *                           tcp, verbs and efa, none on shm (its regions
 *                           are private to the user). seal: mac, and the
 *                           bytes are ChaCha20-encrypted too, for links
 *                           others can read (ChaCha20-Poly1305 under the
 *                           same per-pair keys, derived from the job token
 *                           and fresh nonces: without the token the bytes
 *                           cannot be read; sends pass through 16 staging
 *                           buffers of one chunk each; not with providers
 *                           that need registered buffers; its cost against
 *                           mac: SECURITY.md). "encrypt", its earlier
 *                           name, is the same mode. Compared at init.
 *   TERSE_PIPELINE_BYTES    the all-gather of compressed messages cuts the
 *                           tensor into pieces of this many fp32 bytes
 *                           (default 256k; rounded to the codec's buckets;
 *                           0: never) and encodes piece s + 1 while piece
 *                           s travels and s - 1 is decoded. Deterministic
 *                           codecs (fp16, bf16, int8, sign, vq) give the
 *                           same bits cut or not; randomized ones draw
 *                           other (equally distributed) numbers per piece;
 *                           topk is never cut (its k is chosen over the
 *                           whole tensor). Compared at init.
 *   TERSE_COMPRESSED_ALGO   auto (default) | gather | rs: how terse_allreduce
 *                           moves the messages of a codec that is neither
 *                           summable nor multi-round (fp16 ... vq): an
 *                           all-gather of whole messages, or a compressed
 *                           reduce-scatter + all-gather of re-encoded
 *                           segment sums. auto: rs from 4 ranks when the
 *                           all-gather would move more bytes than dense
 *                           (see terse_allreduce); rs is faster from 4
 *                           ranks but re-encodes the sums (a second
 *                           quantization). gather or rs also keep such
 *                           codecs off the compressed hierarchical
 *                           all-reduce ("codec-hier", see
 *                           terse_comm_topology), which auto takes with
 *                           several hosts. Compared at init.
 *   TERSE_PROGRESS          thread (default) | caller: see Progress below.
 *   TERSE_FABRIC_REGISTER=1 register every buffer even when the provider
 *                           does not require it (for testing).
 *   TERSE_SWEEP=1           rxm (tcp;ofi_rxm): drop messages from addresses that
 *                           are no rank (rxm queues them forever; counted in
 *                           stats.stranger_drops). Experimental and off by
 *                           default: under a flood on a loaded machine a
 *                           rank crashed inside rxm in some runs (SECURITY.md).
 *   TERSE_SHM_RESCUE=1      shm on libfabric 1.17: release a region lock that
 *                           a dead process of the job left taken, instead
 *                           of giving up on the transport (so a parameter
 *                           server's failover survives such a kill).
 *                           Experimental and off by default: a live holder
 *                           descheduled long enough could be let into its
 *                           section twice (SECURITY.md, "Failure contract").
 *   TERSE_SIMD              scalar | avx2: cap the SIMD level of the codecs.
 *   TERSE_TRACE_TAGS=1      one stderr line per transport chunk posted and
 *                           completed (rank, peer, tag): to find a message
 *                           that no receive matches, which stalls its
 *                           connection on tcp.
 */
typedef struct terse_comm_config {
    size_t size;          /* sizeof(terse_comm_config) */
    int rank;             /* -1: from the environment */
    int nranks;           /* -1: from the environment */
    const char *addr;     /* NULL: from the environment */
    const char *provider; /* NULL: from the environment, else "auto" */
    const char *token;    /* NULL: from the environment */
    int timeout_ms;       /* 0: from the environment, else 60000 */
    int init_timeout_ms;  /* 0: from the environment, else max(timeout_ms, 30000) */
    /* 1: join a running job as the replacement of rank `rank`, which the
     * store announced lost (-1: from TERSE_REJOIN, else 0). Start the
     * replacement exactly like the lost process (same TERSE_RANK, size,
     * address and token) with TERSE_REJOIN=1. Rank 0, which holds the
     * store, cannot be replaced. A replacement's communicator serves a
     * parameter server with replicas 2 (terse_ps_create; it takes its
     * slots back from the servers that stood in); collectives on it fail
     * with TERSE_ERR_INVALID, since the others' collectives went on
     * without it. */
    int rejoin;
} terse_comm_config;

#define TERSE_COMM_CONFIG_INIT {sizeof(terse_comm_config), -1, -1, NULL, NULL, NULL, 0, 0, -1}

/* Join the job: rendezvous at rank 0's store, open the libfabric endpoint,
 * exchange addresses. Blocks until every rank has joined or the timeout
 * passes. On failure *out is NULL.
 * Signals: Debian's libfabric loads libpsm-infinipath, whose constructor
 * replaces the handlers of SIGSEGV, SIGBUS, SIGABRT, SIGILL, SIGINT and
 * SIGTERM with one that prints a backtrace and calls exit(1). The first
 * endpoint opened restores the default action of each such signal whose
 * handler is still that library's (handlers the program installed are
 * left alone). Setting IPATH_NO_BACKTRACE=1 before the process starts
 * keeps them from being installed at all (terse-run and the Python
 * package do). */
TERSE_API terse_status terse_comm_init(const terse_comm_config *config, terse_comm **out);

/* Leave the job and release everything. NULL is accepted. Not collective:
 * a rank may free after an error without the others. On tcp (libfabric's
 * net) a rank whose calls all succeeded first waits until each peer it
 * sent to has read everything sent to it -- net forgets what it still
 * holds when the endpoint closes -- which takes as long as those peers
 * take to make their next terse call or free: at most the timeout, and
 * never more than 5 s (then a line on stderr names one of them). */
TERSE_API void terse_comm_free(terse_comm *comm);

TERSE_API int terse_comm_rank(const terse_comm *comm);
TERSE_API int terse_comm_size(const terse_comm *comm);
/* The libfabric provider in use, e.g. "net" (for "tcp"), "tcp;ofi_rxm" (for
 * "rxm") or "shm"; "shm+net" etc. when peers are routed per host (see
 * terse_comm_topology). */
TERSE_API const char *terse_comm_provider(const terse_comm *comm);

/* Hosts. At init every rank learns its host -- TERSE_HOST when set (1 to
 * 127 printable characters; containers, tests, network namespaces on one
 * machine), else its host identity: boot id, network and PID namespaces,
 * the /dev/shm mount and the host name -- and the ranks are grouped
 * through the store (hosts may hold different numbers of ranks). Hosts
 * are numbered by their lowest rank; a rank's local rank is its position
 * among its host's ranks in rank order. Init fails with TERSE_ERR_INVALID
 * and a sentence, on every rank alike, when
 *   - ranks share a TERSE_HOST value but could not share memory (different
 *     boot id, PID namespace or /dev/shm), or a TERSE_HOST is malformed;
 *   - a launcher's local variables contradict the grouping: TERSE_LOCAL_RANK
 *     / TERSE_LOCAL_SIZE (terse-run), LOCAL_RANK / LOCAL_WORLD_SIZE
 *     (torchrun), OMPI_COMM_WORLD_LOCAL_RANK / _LOCAL_SIZE (Open MPI),
 *     SLURM_LOCALID (Slurm). Each is checked only when the same launcher's
 *     rank and size variables (TERSE_RANK / TERSE_SIZE, RANK / WORLD_SIZE,
 *     OMPI_COMM_WORLD_RANK / _SIZE, SLURM_PROCID / SLURM_NTASKS) name this
 *     very rank and size: left over from an outer job, they are ignored.
 * With one host nothing changes: provider "auto" picks shm as before.
 * With several hosts the provider (TERSE_PROVIDER: tcp, rxm, verbs, efa,
 * auto -- auto never picks shm then) carries the pairs on different hosts,
 * and a rank whose host holds other ranks also opens an shm endpoint for
 * them: messages are routed per peer, both completion queues are driven by
 * the one progress loop, and terse_comm_provider says "shm+net" (etc.).
 * Failure detection, timeouts and abort hold on both; TERSE_WIRE auto puts
 * MACs on the network side only (mac or seal: on both). A lost rank's
 * replacement (rejoin) opens no shm endpoint: the others reach it through
 * the network from then on. TERSE_TOPOLOGY=flat keeps one provider for
 * every pair (the behaviour before 0.4). When every rank is in one network
 * namespace (TERSE_HOST on one machine), tcp uses loopback.
 * Collectives: with several hosts, some holding more than one rank, the
 * dense all-reduce above TERSE_RD_MAX_BYTES (at any size with
 * TERSE_TOPOLOGY=hier) is hierarchical -- reduce-scatter inside each host
 * into S shards (S: the fewest ranks any host holds; local ranks 0..S-1
 * own them; not with S = 1 beside a host of more than 4 ranks), the
 * shards summed across hosts (one rail per shard, all at once), all-gather
 * inside each host; terse_allreduce_algorithm says
 * "dense-hier", or "dense-hier-seg" with the intra-host phases over each
 * host's shared segment (TERSE_SHM_SEGMENT) -- and so are the
 * dense sums inside codecs with rounds (powersgd) or a summable view
 * (randk). Codecs whose messages travel (fp16, bf16, int8, qsgd, sign,
 * ...) and that can be cut into S >= 2 segments on their buckets (S: the
 * fewest ranks a host holds) take
 * the compressed hierarchical all-reduce under the same conditions (and
 * TERSE_COMPRESSED_ALGO auto): an exact fp32 reduce-scatter inside each
 * host, each segment's host sum encoded once by the local rank that owns
 * it (error feedback: the codec's residual over that segment, kept by its
 * owner) and exchanged along its rail, decoded in host order, then an
 * fp32 all-gather inside each host; compression only between hosts, one
 * encode per host sum instead of one per rank; terse_allreduce_algorithm
 * says "codec-hier" ("codec-hier-seg" for fixed-size codecs with the
 * hosts' shared segments, where the codec's cut gives chunks that fit a
 * segment step: the fp32 phases in the segment). Every rank still ends with the same bits (not the
 * flat paths': another summation order). Broadcast and the rings (the
 * all-gather, the message exchanges of compressed all-reduces, the dense
 * ring) run over the ranks in host order, so they cross between hosts once
 * per host wherever the launcher put the ranks; the all-gather is
 * hierarchical (each block to one rank on each other host -- along the
 * rails with hosts of equal size -- then inside each host), so each block
 * crosses to each other host once. Where the hosts have their shared
 * segments (TERSE_SHM_SEGMENT; the conditions of the hierarchical dense
 * all-reduce) the barrier is hierarchical too (arrivals in the segment, a
 * dissemination barrier among the hosts' first ranks). Other
 * codecs and the parameter server run their flat algorithms over the
 * routed pairs. terse_comm_topology gives this rank's host index, local
 * rank, local size and the number of hosts (any pointer may be NULL; a
 * single rank is host 0 of 1, local rank 0 of 1). terse_comm_host_of gives
 * any rank's host index (-1 for a rank out of range). (Added in 0.4.) */
TERSE_API terse_status terse_comm_topology(const terse_comm *comm, int *host_index,
                                           int *local_rank, int *local_size, int *nhosts);
TERSE_API int terse_comm_host_of(const terse_comm *comm, int rank);

typedef enum terse_op {
    TERSE_OP_SUM = 0, /* buf = sum over ranks */
    TERSE_OP_AVG = 1, /* buf = sum over ranks / nranks */
} terse_op;

/*
 * All-reduce n floats in place. With codec == NULL the exchange is dense
 * fp32 (a pipelined ring for large buffers, recursive doubling for small
 * ones). With a codec (bound to n elements; each rank passes its own), the
 * algorithm follows the codec's function table (terse_plugin.h; plugins
 * get every path the built-ins get):
 *   - codecs with rounds (none; powersgd: P, then Q) sum their round
 *     vectors with the dense algorithms;
 *   - summable codecs with a view (randk) sum their values inside the
 *     messages with the dense algorithms, then decode once;
 *   - the others (fp16, bf16, int8, qsgd, terngrad, sign, topk, vq) move
 *     messages: by default every rank's message is all-gathered and
 *     decoded in rank order ((N-1) x message bytes per rank), pipelined
 *     (TERSE_PIPELINE_BYTES: piece by piece, each rank sending each piece
 *     to every other as soon as it is encoded, and decoding each piece as
 *     its messages arrive, so codec and wire overlap) up to 8 ranks; from 4
 *     ranks, when that would move more bytes than dense fp32 (N x message
 *     bytes > 8 n: fp16 from 4 ranks, int8 from 8) and a message's 1/N
 *     share is >= 16 KiB, or with TERSE_COMPRESSED_ALGO=rs, a compressed
 *     reduce-scatter instead: each rank
 *     owns a segment of the tensor (cut on the codec's buckets), decodes
 *     and sums every rank's piece of it in rank order, re-encodes the sum
 *     with the same codec, and the sums are all-gathered (about
 *     2 (N-1)/N x message bytes per rank). The re-encode adds its own
 *     error, at most the codec's bound on the sum; with ef=1 the segment's
 *     owner keeps it in a second residual and sends it later (that
 *     residual is in no checkpoint: terse_codec_state_load and
 *     terse_codec_reset_residual zero it). topk re-encodes a summed
 *     segment, denser than any piece, with the same k share.
 * Every rank ends with the same bits. Each rank's codec keeps its own
 * error-feedback state.
 */
TERSE_API terse_status terse_allreduce(terse_comm *comm, float *buf, size_t n,
                                       terse_codec *codec, terse_op op);

/*
 * The algorithm terse_allreduce runs for n floats with this codec (NULL:
 * dense) on this communicator, for logs and benchmarks: "dense-seg" (the
 * host's shared segment: TERSE_SHM_SEGMENT), "dense-rd"
 * (recursive doubling), "dense-ring", "dense-hier" (hierarchical:
 * terse_comm_topology), "dense-hier-seg" (the same, inside each host over
 * its shared segment), "codec-hier-seg" (a fixed-size codec's messages
 * between hosts, fp32 inside each host's shared segment), "codec-hier" (a codec's messages between hosts
 * only: terse_comm_topology), "rounds", "summable", "gather",
 * "gather-pipe" (the all-gather, pipelined in pieces), "rs"
 * (the compressed reduce-scatter), "local" (one rank, dense), or "invalid"
 * for a NULL communicator. Thread-safe; no communication.
 */
TERSE_API const char *terse_allreduce_algorithm(const terse_comm *comm,
                                                const terse_codec *codec, size_t n);

/* Copy bytes from root's buf into every other rank's buf. */
TERSE_API terse_status terse_broadcast(terse_comm *comm, void *buf, size_t bytes, int root);

/*
 * Gather variable-size contributions: recv receives every rank's send
 * buffer concatenated in rank order; counts (nranks entries, may be NULL)
 * receives each rank's byte count. If any rank's recv_cap is smaller than
 * the total, every rank returns TERSE_ERR_DST_TOO_SMALL (sizes are exchanged
 * first; counts is still filled, so the caller can size recv and call
 * again) and the communicator remains usable.
 */
TERSE_API terse_status terse_allgather(terse_comm *comm, const void *send, size_t send_bytes,
                                       void *recv, size_t recv_cap, size_t *counts);

/* Return once every rank has entered the barrier. */
TERSE_API terse_status terse_barrier(terse_comm *comm);

/* ------------------------------------------------------------------------ */
/* Non-blocking collectives                                                 */
/* ------------------------------------------------------------------------ */

/*
 * terse_X_start starts the collective terse_X with the same arguments and
 * returns at once with a request; terse_request_wait completes it with the
 * status terse_X would have returned, and the same result, bitwise.
 *
 *   - Arguments are checked at start; a bad one returns its status there
 *     (no request is made, *req is NULL) and fails the communicator, like
 *     the blocking call.
 *   - Several requests may be in flight on one communicator. Every rank
 *     starts them in the same order. They run in start order.
 *   - Buffers (and the codec) belong to terse from start until the request
 *     completes -- successfully or not: after a failure terse cancels and
 *     drains every receive it posted before the request reports done, so
 *     no late write can land in memory the caller has reused or freed.
 *   - A request that fails leaves every codec it touched as before the
 *     call (error-feedback residual, step, stream, PowerSGD's Q). This is
 *     per rank: a collective that failed on one rank may have completed on
 *     another, whose codec moved on; after a failure, reload every rank's
 *     codec state from one common checkpoint before training on. (randk's
 *     stream is checked across ranks at every call; PowerSGD's Q is not.)
 *     One exception: on shm, when the engine's watchdog gave up on a
 *     transport stuck on a dead peer's lock (TERSE_ERR_TIMEOUT, "spun
 *     inside" in the sentence; TERSE_SHM_RESCUE), the thread that holds the
 *     codec never returns to restore it, so the codec is as that thread
 *     left it: free the communicator and reload the codec state.
 *   - Requests still in flight when the communicator fails complete with
 *     the first failure's status; requests started after it fail at start.
 */
typedef struct terse_request terse_request;

TERSE_API terse_status terse_allreduce_start(terse_comm *comm, float *buf, size_t n,
                                             terse_codec *codec, terse_op op,
                                             terse_request **req);
TERSE_API terse_status terse_broadcast_start(terse_comm *comm, void *buf, size_t bytes,
                                             int root, terse_request **req);
TERSE_API terse_status terse_allgather_start(terse_comm *comm, const void *send,
                                             size_t send_bytes, void *recv, size_t recv_cap,
                                             size_t *counts, terse_request **req);
TERSE_API terse_status terse_barrier_start(terse_comm *comm, terse_request **req);

/* *done = 1 and the request's status once it has completed; else *done = 0
 * and TERSE_OK. Never blocks with TERSE_PROGRESS=thread; with =caller it
 * runs the queue up to this request (see Progress above). May be called
 * again after completion (same status). */
TERSE_API terse_status terse_request_test(terse_request *req, int *done);
/* Block until the request completes; returns its status (terse_last_error()
 * holds its sentence on this thread). May be called again after completion. */
TERSE_API terse_status terse_request_wait(terse_request *req);
/* Release a request. One still in flight is waited for first (it cannot be
 * cancelled: the other ranks run it too), except inside an unended group,
 * where it is released once it has run. NULL is accepted. A request may be
 * freed after its communicator. */
TERSE_API void terse_request_free(terse_request *req);

/*
 * Groups: starts between terse_group_start and terse_group_end are held and
 * submitted together at the end (groups nest; the outermost end submits).
 * Every rank must open and close its groups around the same starts, and a
 * group's members must be independent (no member reads a buffer another
 * member writes): fused members run first.
 * Dense allreduces (codec NULL) of at most TERSE_RD_MAX_BYTES each are
 * fused, per op, into one exchange per peer over their concatenation (up to
 * 4 MiB per exchange) -- e.g. 150 bias vectors cost one round trip, not
 * 150 -- with each result bitwise what its own call would give. The other
 * members run after them, in start order. Blocking calls and waiting on a
 * member are refused (TERSE_ERR_INVALID) until the group has ended. A
 * failure fails every member with the first failure's status.
 */
TERSE_API terse_status terse_group_start(terse_comm *comm);
TERSE_API terse_status terse_group_end(terse_comm *comm);

/*
 * Abort: from any thread, at any time before terse_comm_free is called
 * (not during or after it, and not from a signal handler). Every request
 * in flight and every later call on comm returns TERSE_ERR_ABORTED; one
 * waiting on the network returns within 100 ms (measured: under 40 ms on
 * tcp and shm), but a codec pass already running finishes first -- one
 * encode, or one decode per rank, of one tensor: up to about 1.5 s for
 * top-k or PowerSGD on 64M floats on this 2-core machine, where dense and
 * qsgd return within 60 ms. Afterwards the communicator can only be freed; its
 * freeing tells the other ranks this rank is gone, so their calls fail
 * with TERSE_ERR_PEER_LOST at once rather than at their timeout. NULL is
 * accepted. terse_comm_free with requests still in flight aborts them.
 */
TERSE_API void terse_comm_abort(terse_comm *comm);

/* What this rank has done since init (or the last reset). */
typedef struct terse_comm_stats {
    size_t size;                 /* sizeof(terse_comm_stats) */
    uint64_t ops;                /* collectives completed */
    uint64_t payload_bytes_sent; /* collective data handed to the transport */
    uint64_t payload_bytes_recv;
    uint64_t wire_bytes_sent;    /* payload plus terse's own framing (libfabric's
                                    provider headers are not visible to us) */
    uint64_t wire_bytes_recv;
    double codec_seconds;        /* encode, decode and reduction arithmetic */
    double network_seconds;      /* waiting for sends and receives */
    uint64_t auth_failures;      /* chunks dropped: they failed authentication
                                    (TERSE_WIRE=mac) */
    uint64_t stranger_drops;     /* messages dropped that came from an address
                                    that is no rank of this job (TERSE_SWEEP
                                    on rxm, which would otherwise queue them
                                    forever) */
    uint64_t control_bytes_sent; /* call descriptors, not in wire_bytes: every
                                    collective tells the next rank its kind,
                                    size, op or root and codec in a 64-byte
                                    message, so ranks that passed different
                                    arguments fail at once (TERSE_ERR_SHAPE,
                                    _CODEC_MISMATCH or _INVALID naming both
                                    values and the rank; the others hear it
                                    through the store) */
    uint64_t control_bytes_recv;
} terse_comm_stats;

#define TERSE_COMM_STATS_INIT {sizeof(terse_comm_stats), 0, 0, 0, 0, 0, 0.0, 0.0, 0, 0, 0, 0}

TERSE_API terse_status terse_comm_get_stats(const terse_comm *comm, terse_comm_stats *stats);
TERSE_API void terse_comm_reset_stats(terse_comm *comm);

/* ------------------------------------------------------------------------ */
/* Parameter server                                                         */
/* ------------------------------------------------------------------------ */

/*
 * Roles. Ranks [0, num_servers) are servers, the others workers (a rank
 * is one or the other; see docs/ps.md), unless colocate = 1 (Colocated
 * servers below: every rank both). Every rank calls
 * terse_ps_create with the same config (checked: a difference fails with
 * TERSE_ERR_INVALID naming the rank and field), then terse_ps_declare for
 * the same keys in the same order with the same arguments. Servers then
 * call terse_ps_serve, which returns once every worker has called
 * terse_ps_finish (or was lost); workers push, pull and clock, then
 * finish. While a parameter server exists the communicator runs nothing
 * else: no collectives between create and free.
 *
 * Placement. A tensor is cut into chunks of chunk_bytes; chunks are placed
 * on servers by consistent hashing with `vnodes` virtual nodes per server
 * and bounded loads (a server takes a chunk only while its bytes stay
 * within 1.25x the mean of what is placed, rounded up to whole chunks, so
 * a small model still spreads over the servers, ps-lite #119; and a server
 * holds at most ceil(chunks / S) of one key's chunks), in
 * declaration order; a change in the server set moves about 1/S of the
 * chunks. terse_ps_placement reports the bytes per server. A worker whose
 * declaration of any key differs is refused for that key and every later
 * one (placement depends on them all).
 *
 * Compression. A key's push_spec is the codec workers encode with (its
 * error feedback lives on each worker, per chunk); its pull_spec the codec
 * the server encodes what it sends with (its error feedback lives on the
 * server, per chunk: every worker pulling a version receives the same
 * bytes, so sync-mode workers hold bitwise-identical values). NULL or
 * "none" is dense fp32. Codecs need no second round: powersgd is refused
 * (TERSE_ERR_UNSUPPORTED).
 *
 * What a pull returns: with update TERSE_PS_UPDATE_NONE, the aggregate of
 * the last closed step (BytePS style: the workers run their optimizer);
 * with TERSE_PS_UPDATE_SGD the parameters the server holds, initialised
 * from declare's init and updated with x -= lr * v, v = momentum * v + g.
 *
 * Modes (terse_ps_config.mode; terse_ps_config_parse reads them as text):
 *   "sync"           a step closes when every active worker has pushed
 *                    it; the aggregate is formed in worker-rank order,
 *                    whatever the arrival order, and a pull for step t
 *                    waits for it. Workers hold bitwise-identical results.
 *   "sync:quorum=K"  backup workers: a step closes on the first K pushes
 *                    to arrive (or on every worker left, when fewer than K
 *                    have not finished or been lost), aggregated in rank
 *                    order whatever the arrival order; a later push for
 *                    that step is refused with TERSE_ERR_STALE and counted
 *                    (dropped: not folded into the worker's residual); the
 *                    worker pulls the newer version and goes on. With
 *                    TERSE_PS_QUORUM_LOG=path each server appends, per
 *                    closed step, "server key step worker,worker,..." so a
 *                    run can be replayed.
 *   "sync:deadline_ms=D"  rounds (federated learning's): a step also
 *                    closes D ms after it opened (the previous step closed:
 *                    D must cover the workers' compute), with the pushes it
 *                    has; one closed with none changes no parameters (update
 *                    none: its aggregate is zero);
 *                    a push that comes later is refused with TERSE_ERR_STALE
 *                    and counted (late_dropped, deadline_closes). Combine
 *                    with quorum=K for rounds of K sampled workers: the
 *                    others call terse_ps_clock without pushing, and a pull
 *                    by a worker at clock c waits until step c - 1 closed.
 *   "async"          every push is applied on arrival, weighted 1/workers;
 *                    a pull returns at once. Its staleness is the number of
 *                    updates the shard took since that worker's last pull;
 *   "async:max_staleness=S,lr_scale=1"  pushes staler than S are refused
 *                    with TERSE_ERR_STALE (counted); lr_scale=1 divides the
 *                    step of a push by max(1, staleness) (the same as
 *                    update=step, below).
 *   "ssp:S"          stale synchronous parallel (Petuum): pushes are
 *                    applied on arrival; a worker at clock c may pull only
 *                    once every active worker has pushed clock c - S (its
 *                    pull waits otherwise). ssp:0 is bulk synchronous.
 *                    Options after the bound: "ssp:2,update=amom".
 * async and ssp need update "sgd" (the server must hold the parameters).
 *
 * Stale pushes (terse_ps_config.stale_rule, or "async:update=R" and
 * "ssp:S,update=R"; async and ssp only). A push applied on arrival was
 * computed at the parameters x_p the worker last pulled (of that shard),
 * while the server is at x; its staleness s is the number of updates the
 * shard took in between. With W workers, weight 1/W, learning rate lr and
 * momentum mu the server applies v = mu' v + (1/W) c g'; x -= lr v, where
 * g', c and mu' are those of the rule (flags; combine them with "+", e.g.
 * "update=amom+step"):
 *   "plain"  (TERSE_PS_STALE_PLAIN) g' = g, c = 1, mu' = mu: the push as
 *            if it were fresh (what async did before 0.5).
 *   "step"   (TERSE_PS_STALE_STEP) staleness-aware step (Zhang, Gupta,
 *            Lian and Liu, "Staleness-aware async-SGD for distributed
 *            deep learning", IJCAI 2016): c = 1 / max(1, s).
 *   "dc"     (TERSE_PS_STALE_DC) delay compensation (DC-ASGD: Zheng et al.,
 *            "Asynchronous stochastic gradient descent with delay
 *            compensation", ICML 2017, its constant-lambda form):
 *            g' = g + lambda g * g * (x - x_p), elementwise; lambda is
 *            dc_lambda ("lambda=L" in text; 0: 0.04; negative or not
 *            finite: refused). The server keeps, per shard, a copy of
 *            what each worker last pulled (the server's value at that
 *            pull, before the pull codec): nfloats x 4 bytes per worker
 *            and shard, allocated at the worker's first pull of it (so a
 *            server holding P floats keeps up to W x P x 4 bytes more;
 *            terse_ps_stats.dc_copy_bytes counts them). A push from a
 *            worker that never pulled that shard has no copy: it is
 *            applied uncompensated (g' = g; it computed at the initial
 *            value, which the server no longer tells apart). Each shard's
 *            copy is that shard's own: a worker that pulled one shard at
 *            an older version than another is compensated per shard.
 *   "amom"   asynchrony-aware momentum (Mitliagkas, Zhang, Hadjis and Re,
 *            "Asynchrony begets momentum", Allerton 2016): W workers
 *            applying on arrival add an implicit momentum of about
 *            1 - 1/W, so the explicit one is reduced to keep the sum the
 *            configured one: mu' = max(0, mu - (1 - 1/W)).
 *   "dana"   (TERSE_PS_STALE_DANA) momentum per worker, pulls at the
 *            parameters' estimated future position (DANA-Zero: Hakimi,
 *            Barkai, Gabel and Schuster, "Taming momentum in a distributed
 *            asynchronous environment", 2019). The server keeps a momentum
 *            v_w per worker and shard; a push of worker w applies
 *            v_w = mu v_w + (1/W) g; x -= lr v_w, so that a round of one
 *            push per worker moves x as far as a synchronous step would
 *            (the sum of the v_w decays by mu per round, as sync's
 *            momentum does per step, where one shared momentum would decay
 *            by mu^W). A pull returns x - lr mu sum_w v_w, where x will be
 *            after the next round if every worker's momentum just coasts:
 *            a gradient computed there is less stale when it arrives.
 *            Memory: nfloats x 4 bytes per worker and shard, allocated at
 *            the worker's first push of it (terse_ps_stats.dc_copy_bytes
 *            counts what was allocated), and the sum; the shared momentum
 *            of the other rules is not kept. A worker that finished or
 *            was lost pushes no more, so its momentum would never coast:
 *            it is taken out of the sum and freed (the movement it had
 *            left is dropped). Combines with no other rule.
 * The default (stale_rule 0) is the rule that measured best for a user who
 * switches sync to async or ssp with the same lr and momentum (docs/ps.md,
 * "Rules for stale pushes"): TERSE_PS_STALE_DEFAULT_RULE below, "dana"
 * (in 0.5 "step"; before 0.5 async applied "plain"); it costs the server
 * a momentum per worker (W x its shards' floats x 4 bytes): where the
 * server's memory is short, choose "step", which keeps nothing per worker. lr_scale=1
 * without a rule is "step". A rule given in sync mode, an unknown flag,
 * "plain" or "dana" combined with another, or a dc_lambda without "dc" is
 * refused by terse_ps_create (TERSE_ERR_INVALID and a
 * sentence naming it), on every rank.
 *
 * Learning-rate schedule (terse_ps_config.lr_schedule, lr_steps,
 * lr_warmup; every mode with update sgd). The rate of step k (0-based) of
 * a run of T = lr_steps steps with a warm-up of U = lr_warmup steps is
 *   lr (k + 1) / U                               for k < U,
 *   lr (1 + cos(pi (k - U) / (T - U))) / 2       after, for cosine,
 *   0                                            for k >= T,
 * (TERSE_PS_LR_COSINE; TERSE_PS_LR_CONSTANT, the default, keeps lr). A
 * shard's step k is the number of steps it closed in sync mode, and the
 * number of pushes it applied divided by the workers (rounded down) in
 * async and ssp. The step count travels with the shard's state, so a
 * replica or a replacement that takes a slot over goes on with the rate
 * the head would have used. Cosine needs lr_steps >= 1 and lr_warmup <
 * lr_steps (else TERSE_ERR_INVALID at terse_ps_create).
 *
 * Aggregators (terse_ps_config.aggregator, a spec; sync mode only, except
 * "mean"): how the server combines the pushes of a step, in worker-rank
 * order (the result does not depend on arrival order). Each refuses at
 * terse_ps_create, with TERSE_ERR_INVALID and a sentence, a configuration
 * that cannot hold for the number of workers (the quorum, if set):
 *   "mean"               the average (default)
 *   "median"             coordinate-wise median (mean of the two middle
 *                        values for an even count)
 *   "trimmed_mean:b=B"   coordinate-wise: drop the B largest and B smallest,
 *                        average the rest; needs >= 2B+1 workers (B: 1)
 *   "krum:f=F[,m=M]"     Krum (Blanchard et al. 2017): the push closest to
 *                        its n-F-2 nearest others; with M > 1 Multi-Krum,
 *                        the mean of the M best; needs n >= 2F+3 and
 *                        M <= n-F (F: 1, M: 1)
 *   "cclip:tau=T[,iters=L]"  centered clipping (Karimireddy, He and Jaggi
 *                        2021): from the last step's aggregate v, L times
 *                        v += mean_i (x_i - v) min(1, T/||x_i - v||) (T: 10,
 *                        L: 1); meant for workers that push momentum
 *   "signvote"           the sign of the majority of the pushes' signs (-1,
 *                        0 on a tie, +1; signSGD with majority vote): the
 *                        server's lr sets the step size
 * A step that has fewer pushes than the aggregator was configured for (a
 * worker lost or left out) shrinks B, F and M to what it can bear. Krum
 * and cclip measure distances over the part of a key each server holds:
 * with several servers they act per shard. A push holding a NaN or an
 * infinity never reaches the parameters, whatever the aggregator: sync
 * mode leaves it out of its step's aggregate (the step still closes, and
 * the worker's clock moves on as after TERSE_ERR_STALE), the others do
 * not apply it; the worker's request fails with TERSE_ERR_NONFINITE
 * naming the element, and refused_nonfinite counts it.
 *
 * Steps. A worker's clock starts at 0; terse_ps_clock ends its step. Each
 * push carries the clock. In sync mode a worker pushes a key once per
 * step and pulls before its next push of it; a pull that returns a newer
 * version than the worker's step (it fell behind a quorum) moves its next
 * clock to that version; after a push refused for any reason but
 * TERSE_ERR_STALE or TERSE_ERR_NONFINITE, terse_ps_clock keeps the worker
 * at the same step so it can push again. A key held by several servers is pushed to each: a
 * refusal by one does not undo what another applied.
 *
 * Failure. A refusal by the server -- unknown key, wrong size, a
 * declaration that differs, a push for a step already closed or too
 * stale, a message from a rank that is not a worker, a corrupt payload --
 * fails that request with its status and the server's sentence, is
 * counted in the server's terse_ps_stats and logged once per kind, and
 * leaves the communicator usable. A worker lost in sync mode without a
 * quorum fails every worker's pulls of the steps it can no longer close
 * -- and every later request -- with TERSE_ERR_PEER_LOST naming it (with
 * a quorum, and in async and ssp, the others go on without it). A worker
 * stopped (not dead) holds sync steps open: their pulls fail with
 * TERSE_ERR_TIMEOUT naming the workers missing, after 3/4 of the
 * communicator's timeout; one silent in the middle of a message for the
 * timeout is counted lost. Servers end serving with TERSE_ERR_TIMEOUT when
 * no worker has sent anything for the timeout (a worker that exits
 * without terse_ps_finish; or compute between requests longer than the
 * timeout -- raise it). With replicas 1 (the default) a server lost fails
 * the worker's request with TERSE_ERR_PEER_LOST naming it,
 * and the worker's communicator with it.
 *
 * Replication (terse_ps_config.replicas = 2, or "sync:replicas=2"; sync
 * mode, 2 or more servers). Placement gives every chunk a slot, the server
 * index s that holds it (its head); rank (s + 1) mod S keeps a replica of
 * everything slot s holds. When the head closes a step of a key it sends
 * the shard's new state (parameters, momentum, the aggregator's center) to
 * the replica and answers that step's pulls only once the replica
 * acknowledged it (stats: replicated). When the store announces a head's
 * loss (within about a second of its death), the replica takes the slot
 * over from its last acknowledged step (takeovers); each worker moves the
 * slot to it and resends the pushes no pull has covered yet, which the new
 * head applies at most once (duplicates counts the resends it already
 * had). Pushes are aggregated in worker-rank order, so in plain sync mode
 * training goes on with the same bits as if nobody had died (tested with
 * SIGKILL over tcp and shm); with a quorum or a deadline the new head
 * closes on the resends that come first. A replica that dies leaves its head serving alone; a slot
 * whose head and replica are both lost fails the workers' requests with
 * TERSE_ERR_PEER_LOST naming the slot. Limits: pull codecs must be dense
 * (a pull codec's server-side state would not be on the replica:
 * terse_ps_declare refuses others with TERSE_ERR_UNSUPPORTED); replicas 3
 * and more are refused (TERSE_ERR_UNSUPPORTED); on shm every message then
 * travels in chunks within shm's inject size (4 KiB), since libfabric
 * 1.17's shm never completes a larger send to a process that died, and
 * stalls every later large send behind it.
 *
 * Replacing a lost server (replicas 2). Start a new process exactly like
 * the lost one (the same program, TERSE_RANK, TERSE_SIZE, TERSE_ADDR and
 * TERSE_TOKEN) with TERSE_REJOIN=1 (or terse_comm_config.rejoin = 1;
 * terse-run --replace does it for the ranks it names). Its
 * terse_comm_init joins the running job as that rank: the store admits a
 * lost rank once per loss (a rank that is connected, left with a goodbye,
 * or never joined is refused, and so is rank 0, whose process held the
 * store) and tells every rank where the replacement is. Its
 * terse_ps_create, terse_ps_declare and terse_ps_serve are the lost
 * server's; it then gets its slots back:
 *   - the server that took its slot over sends it the slot's state at the
 *     last closed step and which workers finished, and is the slot's
 *     replica again; requests that reach it for that slot from then on are
 *     answered with where the slot went, so each worker moves the slot
 *     back and resends the pushes no pull has covered (as after a
 *     failover: in plain sync mode the result keeps its bits, tested);
 *   - the head of the slot it replicated sends it that slot's state, and
 *     it is the replica again once every key arrived (until then that slot
 *     cannot fail over to it: if its head dies first, the slot is lost).
 * The replacement holds requests until its slot's state is in. Its
 * communicator serves the parameter server only: collectives on it fail
 * with TERSE_ERR_INVALID (the others' went on without it), and so does a
 * replacement that is a worker or runs replicas 1. If the server standing
 * in dies before the slot is back, the slot is lost: the replacement's
 * terse_ps_serve fails with TERSE_ERR_PEER_LOST saying so; if the slot
 * does not come back within the timeout (the job ended before the
 * replacement joined), with TERSE_ERR_TIMEOUT.
 *
 * Partitions and the window (replicas 1). A key travels as partitions of
 * partition_bytes (whole chunks; default 1 MiB, TERSE_PS_PARTITION_BYTES),
 * each placed, stepped and answered on its own: the server acknowledges a
 * partition's push when it has it, closes that partition's step when its
 * last push is in, and answers its parked pulls at once, while later
 * partitions still arrive (BytePS). A worker keeps up to `window` pushes
 * and `window` pulls in flight per server (default 4, TERSE_PS_WINDOW),
 * on conversations of their own, and pulls a partition as soon as its
 * push was acknowledged: so both directions of every link are busy. Its
 * executor runs the parameter-server requests queued behind the one it
 * runs together with it, in priority order (terse_ps_set_priority); each
 * completes when its last partition is done. Everything above holds per
 * partition: a step, a quorum, a deadline, staleness and an aggregator's
 * view (Krum and cclip measure distances within a partition) are a
 * partition's; sync mode aggregates each partition in worker-rank order,
 * so workers stay bitwise identical. Every rank must use the same
 * partition size and window (checked at terse_ps_create). A server takes
 * at most 8 x window requests per worker at a time (window push lanes, 7 x
 * window pull lanes), and only push lanes carry payloads (one on a pull
 * lane is refused unread, refused_window): so a worker's requests in
 * flight cost a server at most window x max(a partition's push bound, a
 * transport chunk) beyond the shard's state, whatever it sends. A message
 * on a lane beyond the last is never received (over tcp its connection
 * stalls: the sender's problem; over shm it waits in a fixed store that
 * every peer shares: docs/ps.md). With replicas 2 partitions go one at a
 * time per server (window 1), through the failover path.
 *
 * Colocated servers (terse_ps_config.colocate = 1, or "colocate=1" in the
 * mode text, e.g. "sync:colocate=1", "ssp:2,colocate=1"; num_servers is
 * then ignored). Every rank is a worker and a server, BytePS style: at
 * terse_ps_create (collective) each rank opens two more endpoints of the
 * same provider, a server's and a worker's, each with a progress thread of
 * its own, and the parameter server runs on them as a job of N servers and
 * N workers -- everything above holds as for separate servers, and the
 * communicator passed in carries none of its traffic (its
 * terse_comm_get_stats adds in the two endpoints' bytes and seconds). The
 * caller's handle is the worker: terse_ps_is_server is 0 on every rank,
 * and terse_ps_serve is refused (TERSE_ERR_INVALID): a rank's server
 * starts serving at its worker's first request (push, pull, pushpull or
 * finish), so every key is declared before that (a later declare fails
 * with TERSE_ERR_INVALID). Sync (with quorum, deadline_ms), async, ssp
 * and every aggregator work colocated (tested; sync gives the bits of
 * separate servers); replicas 2 is refused at create with
 * TERSE_ERR_UNSUPPORTED (a death would take a server and a worker at once,
 * which failover does not handle). Sentences number ranks virtually: rank
 * r's server is "rank r", its worker "rank N + r"; terse_ps_placement
 * fills N entries and terse_ps_chunk_server names ranks. terse_ps_free waits
 * until this rank's server is done serving, i.e. until every worker has
 * finished or was lost (or the timeout: after a death in sync mode the
 * survivors' workers cannot say goodbye, so their servers wait up to the
 * timeout for each other), then closes both endpoints. terse_ps_get_stats
 * gives the worker's counters, and the server's once it is done serving.
 * A colocated rank killed: the survivors' requests fail with
 * TERSE_ERR_PEER_LOST naming it (as a server) within about a second
 * (tested over tcp and shm). terse_comm_abort of the communicator passed
 * in does not stop the colocated server: the timeout does.
 *
 * Threading: calls on one terse_ps from one thread at a time; requests
 * may be tested and waited for as the engine allows. A request belongs to
 * the clock at its start (terse_ps_clock may follow before it completes).
 * terse_ps_get_stats reads counters that requests in flight update: read
 * them once those have completed.
 */
typedef struct terse_ps terse_ps;

typedef enum terse_ps_mode {
    TERSE_PS_SYNC = 0,
    TERSE_PS_ASYNC = 1,
    TERSE_PS_SSP = 2
} terse_ps_mode;

typedef enum terse_ps_update {
    TERSE_PS_UPDATE_NONE = 0, /* pull returns the aggregate */
    TERSE_PS_UPDATE_SGD = 1   /* the server holds parameters: SGD with momentum */
} terse_ps_update;

/* terse_ps_config.stale_rule: flags (see Stale pushes above). */
#define TERSE_PS_STALE_PLAIN 1 /* apply a stale push as if fresh */
#define TERSE_PS_STALE_STEP 2  /* step / max(1, staleness) (Zhang et al. 2016) */
#define TERSE_PS_STALE_DC 4    /* delay compensation (DC-ASGD, Zheng et al. 2017) */
#define TERSE_PS_STALE_AMOM 8  /* momentum reduced by 1 - 1/workers (Mitliagkas et al. 2016) */
#define TERSE_PS_STALE_DANA 16 /* per-worker momentum, pulls at the look-ahead (Hakimi et al. 2019) */
/* What stale_rule 0 means in async and ssp (measured: docs/ps.md). */
#define TERSE_PS_STALE_DEFAULT_RULE (TERSE_PS_STALE_DANA)

typedef enum terse_ps_lr_schedule {
    TERSE_PS_LR_CONSTANT = 0,
    TERSE_PS_LR_COSINE = 1 /* linear warm-up, then cosine decay to 0 */
} terse_ps_lr_schedule;

typedef struct terse_ps_config {
    size_t size;           /* sizeof(terse_ps_config) */
    int num_servers;       /* ranks [0, num_servers) serve; default 1 */
    size_t chunk_bytes;    /* placement unit; default 1 MiB (0: default) */
    int vnodes;            /* virtual nodes per server; default 64 */
    terse_ps_mode mode;    /* default TERSE_PS_SYNC */
    int quorum;            /* sync: close a step on the first K pushes (0: all) */
    int staleness;         /* ssp: S */
    int max_staleness;     /* async: refuse pushes staler than this (0: none) */
    int lr_scale;          /* async: divide a push's step by its staleness */
    terse_ps_update update; /* default TERSE_PS_UPDATE_NONE */
    float lr, momentum;    /* TERSE_PS_UPDATE_SGD */
    const char *aggregator; /* "mean" (default), "median", "trimmed_mean:b=1",
                             * "krum:f=1,m=1", "cclip:tau=10,iters=1",
                             * "signvote": see Aggregators above */
    int deadline_ms;       /* sync: a step closes this long after it opened,
                            * with the pushes it has (0: no deadline) */
    int replicas;          /* servers holding each chunk: 1 (default; 0 means
                            * 1) or 2 (sync mode, 2 or more servers): see
                            * Replication */
    /* appended in 0.4: see Partitions and the window */
    size_t partition_bytes; /* a key travels in partitions of this many bytes,
                             * rounded up to whole chunks (0: the environment's
                             * TERSE_PS_PARTITION_BYTES, else 1 MiB) */
    int window;            /* partitions in flight per worker and server, each
                            * way, 1..32 (0: TERSE_PS_WINDOW, else 4;
                            * replicas 2: 1) */
    /* appended in 0.4: see Colocated servers */
    int colocate;          /* 1: every rank is a worker and a server (BytePS
                            * style); num_servers is then ignored (0: off) */
    /* appended in 0.5: see Stale pushes and Learning-rate schedule */
    int stale_rule;        /* async, ssp: TERSE_PS_STALE_* flags (0: the
                            * mode's default, TERSE_PS_STALE_DEFAULT_RULE) */
    float dc_lambda;       /* TERSE_PS_STALE_DC: lambda (0: 0.04) */
    terse_ps_lr_schedule lr_schedule; /* default TERSE_PS_LR_CONSTANT */
    uint64_t lr_steps;     /* cosine: the run's steps T */
    uint64_t lr_warmup;    /* cosine: steps of linear warm-up U (< T) */
} terse_ps_config;

#define TERSE_PS_CONFIG_INIT                                                      \
    {sizeof(terse_ps_config), 1, 0, 64, TERSE_PS_SYNC, 0, 0, 0, 0, TERSE_PS_UPDATE_NONE, \
     0.0f, 0.0f, NULL, 0, 1, 0, 0, 0, 0, 0.0f, TERSE_PS_LR_CONSTANT, 0, 0}

/* Set mode, quorum, staleness, max_staleness, lr_scale, deadline_ms,
 * replicas, colocate, stale_rule and dc_lambda of *cfg from a spec
 * ("sync", "sync:quorum=3", "async", "async:max_staleness=8,lr_scale=1",
 * "ssp:2", "sync:deadline_ms=500", "sync:replicas=2", "sync:colocate=1",
 * "async:update=dc,lambda=0.1", "ssp:2,update=amom+step"; what the spec
 * leaves out is reset: 0, and replicas 1; colocate is kept unless the
 * spec names it); other fields are kept. A bad spec fails with
 * TERSE_ERR_INVALID naming
 * the token. */
TERSE_API terse_status terse_ps_config_parse(const char *spec, terse_ps_config *cfg);

/* Check an aggregator spec (terse_ps_config.aggregator; NULL is "mean")
 * for steps of `workers` pushes (the workers, or the quorum if one is
 * set): TERSE_OK, or TERSE_ERR_INVALID with the sentence terse_ps_create
 * would give (a bad token, or a configuration that cannot hold). Local. */
TERSE_API terse_status terse_ps_aggregator_check(const char *spec, int workers);

/* Create on every rank of comm (collective: checks the config agrees).
 * On failure *out is NULL. */
TERSE_API terse_status terse_ps_create(terse_comm *comm, const terse_ps_config *cfg,
                                       terse_ps **out);
/* 1 if this rank is a server. */
TERSE_API int terse_ps_is_server(const terse_ps *ps);

/* Register tensor `key` (keys are 0, 1, 2, ... in declaration order: key
 * must equal the number declared so far) of n floats. init (n floats, or
 * NULL for zeros) is the server's initial value under update sgd. Local:
 * no communication; every rank must declare alike (the server refuses a
 * worker whose declaration differs). */
TERSE_API terse_status terse_ps_declare(terse_ps *ps, size_t key, size_t n,
                                        const char *push_spec, const char *pull_spec,
                                        const float *init);

/* A key's priority (local, on workers; default 0): partitions of keys of
 * higher priority go out first, and among equal priorities the key
 * declared first goes first (the next forward pass needs the first layers
 * first). A request started later with a higher priority overtakes the
 * partitions of earlier requests not yet sent. */
TERSE_API terse_status terse_ps_set_priority(terse_ps *ps, size_t key, int priority);

/* Worker requests (see Non-blocking collectives for the request rules):
 * push grad (n floats; read until the request completes), pull into out,
 * or both in one round trip (buf: the gradient in, the pulled value out).
 * With req NULL the call blocks until done. A request runs on the
 * communicator's progress thread while the caller computes; requests run
 * in start order, each talking to every server that holds a chunk of its
 * key at once. A refusal (see Failure above) completes the request with
 * its status and leaves the communicator usable; a refused push is
 * dropped (its gradient is lost; error feedback keeps only the encoding
 * error, as after any push). */
TERSE_API terse_status terse_ps_push(terse_ps *ps, size_t key, const float *grad,
                                     terse_request **req);
/* A push that counts `weight` times in its step's mean (federated
 * averaging weights each client by its examples): the step's aggregate is
 * sum(weight_i x push_i) / sum(weight_i) over the pushes the step closed
 * with (summed in double), so a client dropped from the round takes its
 * weight with it. weight: positive and finite (else TERSE_ERR_INVALID).
 * Sync mode with the mean aggregator only: elsewhere TERSE_ERR_INVALID
 * with a sentence (robust aggregators do not weight their inputs). A step
 * whose pushes all weigh 1 is aggregated exactly as terse_ps_push's. */
TERSE_API terse_status terse_ps_push_weighted(terse_ps *ps, size_t key, const float *grad,
                                              double weight, terse_request **req);
TERSE_API terse_status terse_ps_pull(terse_ps *ps, size_t key, float *out,
                                     terse_request **req);
TERSE_API terse_status terse_ps_pushpull(terse_ps *ps, size_t key, float *buf,
                                         terse_request **req);
/* End this worker's step (local). */
TERSE_API terse_status terse_ps_clock(terse_ps *ps);
/* This worker's clock. */
TERSE_API uint64_t terse_ps_worker_clock(const terse_ps *ps);
/* A worker is done: tells every server (blocking). Idempotent. */
TERSE_API terse_status terse_ps_finish(terse_ps *ps);

/* Server: serve until every worker finished or was lost (blocking; it
 * runs on the communicator's progress thread, or with TERSE_PROGRESS=caller
 * on the calling thread). TERSE_OK when every worker finished; a lost
 * worker gives TERSE_ERR_PEER_LOST naming it (serving went on without it
 * where the mode allows); terse_comm_abort ends it with TERSE_ERR_ABORTED. */
TERSE_API terse_status terse_ps_serve(terse_ps *ps);

/* Bytes of the declared tensors placed on each server: bytes[s] for
 * s < num_servers (the caller's array has num_servers entries). */
TERSE_API terse_status terse_ps_placement(const terse_ps *ps, uint64_t *bytes);
/* The server that holds chunk `chunk` of key (chunks of chunk_bytes). */
TERSE_API int terse_ps_chunk_server(const terse_ps *ps, size_t key, size_t chunk);

typedef struct terse_ps_stats {
    size_t size;               /* sizeof(terse_ps_stats) */
    /* worker */
    uint64_t pushes, pulls;    /* completed */
    uint64_t stale_refused;    /* pushes the servers refused as late or stale */
    /* server (counted per partition: a key in P partitions on this server
     * counts P pushes and P steps for each worker's push and each step) */
    uint64_t pushes_applied;   /* pushes aggregated or applied */
    uint64_t steps_closed;     /* sync: shard steps closed */
    uint64_t late_dropped;     /* sync quorum: pushes for a closed step */
    uint64_t refused_stale;    /* async: over max_staleness */
    uint64_t refused_key;      /* unknown key, wrong size or declaration */
    uint64_t refused_step;     /* a push for a step not open (duplicate, ahead) */
    uint64_t refused_role;     /* a message from a rank that is not a worker */
    uint64_t refused_corrupt;  /* a malformed header or payload */
    uint64_t staleness_max;    /* async/ssp: largest staleness applied */
    double staleness_mean;
    uint64_t workers_lost;
    /* server (appended in 0.2): pushes holding a NaN or an infinity, left
     * out of their step's aggregate (sync) or not applied (async, ssp) */
    uint64_t refused_nonfinite;
    uint64_t deadline_closes;  /* sync deadline_ms: shard steps closed by it */
    /* replicas 2 (appended in 0.3) */
    uint64_t replicated;       /* head: shard steps its replica acknowledged */
    uint64_t takeovers;        /* replica: shards of a lost head it took over */
    uint64_t duplicates;       /* new head: resent pushes it had already applied */
    /* appended in 0.5 (server) */
    uint64_t dc_copy_bytes;    /* update dc: bytes of the workers' pulled copies kept;
                                * update dana: of the workers' momenta */
    /* appended after 0.5 (server): payloads on a pull lane, a worker past
     * its window of pushes (refused unreceived; docs/ps.md) */
    uint64_t refused_window;
} terse_ps_stats;

TERSE_API terse_status terse_ps_get_stats(const terse_ps *ps, terse_ps_stats *stats);

/* Free (a worker that has not finished finishes first, best effort).
 * NULL is accepted. */
TERSE_API void terse_ps_free(terse_ps *ps);

/* ------------------------------------------------------------------------ */
/* Registry                                                                 */
/* ------------------------------------------------------------------------ */

/* Number of registered codecs, and the name of the i-th (0-based, in id
 * order), or NULL past the end. */
TERSE_API size_t terse_codec_count(void);
TERSE_API const char *terse_codec_name(size_t i);

#ifdef __cplusplus
}
#endif

#endif /* TERSE_H */
