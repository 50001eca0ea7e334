/* The vq codec's fixed codebook, exposed for its tests. */
#ifndef TERSE_COMPRESS_VQ_H
#define TERSE_COMPRESS_VQ_H

#include <stddef.h>
#include <stdint.h>

/* Base codeword k (d floats, unit norm) of dimension d, 2 <= d <= 64. The
 * codebook of vq:dim=d,bits=b is v_0..v_{H-1} followed by -v_0..-v_{H-1},
 * H = 2^(b-1): index k < H is v_k, index k >= H is -v_{k-H}. v_k does not
 * depend on b, so a smaller codebook is a prefix of a larger one. */
void terse__vq_codeword(size_t d, uint32_t k, float *v);

#endif
