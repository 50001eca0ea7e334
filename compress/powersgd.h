/* PowerSGD's steps, for the all-reduce (algos/powersgd_allreduce.c).
 *
 * terse_encode runs both of PowerSGD's rounds on one rank's matrix. An
 * all-reduce must sum P over the ranks between them -- the sum of P Q^T
 * over ranks is not (sum P)(sum Q)^T -- so it calls the steps one by one
 * on the codec's own factors instead:
 *
 *     project(M)          P = M Q        (Q: the warm start, or drawn from
 *                                         the seed on the first step)
 *     ... all-reduce P ...
 *     orthonormalise()    P = QR(P).Q
 *     back_project(M)     Q = M^T P
 *     ... all-reduce Q ...
 *     expand(alpha, dst)  dst (+)= alpha P Q^T
 *     end_step()          keep Q as the next warm start; step + 1
 *
 * Only for codecs whose factors_of reports rank > 0; at rank 0 the shape
 * travels dense. Internal to terse. */
#ifndef TERSE_COMPRESS_POWERSGD_H
#define TERSE_COMPRESS_POWERSGD_H

#include <stddef.h>

#include "terse.h"

typedef struct terse__powersgd_factors {
    size_t rows, cols;
    size_t rank; /* effective rank; 0: this shape travels dense */
    float *p;    /* rows x rank, column major (owned by the codec) */
    float *q;    /* cols x rank, column major: the warm start (owned by the codec) */
    float *residual; /* rows x cols error-feedback residual, NULL without ef */
} terse__powersgd_factors;

/* Describe codec's factors. TERSE_ERR_INVALID if it is not powersgd. */
terse_status terse__powersgd_factors_of(terse_codec *codec, terse__powersgd_factors *f);

void terse__powersgd_project(terse_codec *codec, const float *m);
terse_status terse__powersgd_orthonormalise(terse_codec *codec);
void terse__powersgd_back_project(terse_codec *codec, const float *m);
void terse__powersgd_expand(terse_codec *codec, float alpha, int accumulate, float *dst);
/* Keep Q as the warm start if it is finite and nonzero, else redraw it
 * from the seed next step (as encode does); advance the step. Also for
 * rank 0 (dense), where it only advances the step. */
void terse__powersgd_end_step(terse_codec *codec);

#endif
