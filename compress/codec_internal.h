/* Internals shared by the codec core (codec.c, registry.c, state.c). */
#ifndef TERSE_COMPRESS_CODEC_INTERNAL_H
#define TERSE_COMPRESS_CODEC_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "terse_plugin.h"

struct terse_codec {
    terse_codec_ops ops; /* a copy of the registered table */
    void *self;          /* the codec's own state */
    size_t rows, cols, n;
    size_t payload_bound;
    int ef;
    float *residual; /* n floats when ef, else NULL */
    uint64_t seed, step, tensor;
    uint32_t rank;
    char spec[320]; /* canonical */
    char options[256]; /* the codec's own canonical options (create's canon) */
    struct terse__segments *segs; /* the reduce-scatter's cut (aggregate.c), or NULL */
    struct terse__pieces *pieces; /* the pipelined all-gather's cut (aggregate.c), or NULL */
};

/* TERSE_ERR_INVALID if grad overlaps the codec's residual (an input of
 * terse_encode and of the segment encoder). */
terse_status terse__codec_check_input(const terse_codec *c, const float *grad);

/* Free what aggregate.c attached to a codec (its segments and pieces). */
void terse__codec_free_segments(terse_codec *c);

/* Look a codec up by name; copies its table into *ops. */
terse_status terse__registry_find(const char *name, terse_codec_ops *ops);
/* The registered names, comma separated, for error messages. */
void terse__registry_names(char *buf, size_t size);
/* The name registered for a codec id, or "unregistered". */
const char *terse__registry_name_of(uint32_t id);

/* The built-in codecs, one file each under compress/. */
extern const terse_codec_ops terse__codec_none;
extern const terse_codec_ops terse__codec_fp16;
extern const terse_codec_ops terse__codec_bf16;
extern const terse_codec_ops terse__codec_int8;
extern const terse_codec_ops terse__codec_qsgd;
extern const terse_codec_ops terse__codec_terngrad;
extern const terse_codec_ops terse__codec_sign;
extern const terse_codec_ops terse__codec_topk;
extern const terse_codec_ops terse__codec_randk;
extern const terse_codec_ops terse__codec_powersgd;
extern const terse_codec_ops terse__codec_vq;

/* Built-in ids, fixed forever (they are on the wire). */
enum {
    TERSE_ID_NONE = 1,
    TERSE_ID_FP16 = 2,
    TERSE_ID_BF16 = 3,
    TERSE_ID_INT8 = 4,
    TERSE_ID_QSGD = 5,
    TERSE_ID_TERNGRAD = 6,
    TERSE_ID_SIGN = 7,
    TERSE_ID_TOPK = 8,
    TERSE_ID_RANDK = 9,
    TERSE_ID_POWERSGD = 10,
    TERSE_ID_VQ = 11,
};

/* Snapshots for transactional collectives: compress/aggregate.h. */

#endif
