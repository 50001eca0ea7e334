/* Codec state for checkpoints: the layout is documented in state.c. */
#ifndef TERSE_COMPRESS_STATE_H
#define TERSE_COMPRESS_STATE_H

/* Bytes before the residual (which is followed by the codec's own state
 * and a CRC32C). Tests read the residual at this offset. */
#define TERSE__STATE_HEAD 72u

#endif
