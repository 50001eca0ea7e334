/* Where rank, size, address, provider, token and timeout come from when the
 * caller leaves them unset: the environment real launchers set (terse.h,
 * terse_comm_config). */
#ifndef TERSE_TRANSPORT_LAUNCH_ENV_H
#define TERSE_TRANSPORT_LAUNCH_ENV_H

#include "terse.h"

#define TERSE__MIN_TOKEN 16

typedef struct terse__launch {
    int rank, nranks;
    char addr[256];     /* host:port */
    char provider[32];
    char token[256];
    int timeout_ms; /* (token: at least TERSE__MIN_TOKEN bytes) */
    int init_timeout_ms;
    char source[64];    /* which launcher's variables were used, for messages */
    int rejoin;         /* cfg->rejoin, or TERSE_REJOIN */
} terse__launch;

/* Fill *out from cfg (NULL: all from the environment), then the environment
 * for anything cfg leaves unset. Rank and size are each taken from the
 * first of: cfg, TERSE_RANK/TERSE_SIZE, RANK/WORLD_SIZE (torchrun),
 * OMPI_COMM_WORLD_RANK/_SIZE, PMI_RANK/PMI_SIZE, SLURM_PROCID/SLURM_NTASKS;
 * with none of them set the job is one process (rank 0 of 1). With
 * nranks == 1 there is no store, so addr and token are left empty and not
 * required. Contradictions (e.g. rank >= nranks, a malformed number,
 * nranks > 1 without a token or address) fail with TERSE_ERR_INVALID and a
 * sentence naming the variable and its value (never the token's value). */
terse_status terse__launch_resolve(const terse_comm_config *cfg, terse__launch *out);

#endif
