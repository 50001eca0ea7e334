/* Where rank, size, address, provider, token and timeout come from when the
 * caller leaves them unset: the environment real launchers set (terse.h,
 * terse_comm_config). */
#ifndef TERSE_TRANSPORT_LAUNCH_ENV_H
#define TERSE_TRANSPORT_LAUNCH_ENV_H

#include "terse.h"

typedef struct terse__launch {
    int rank, nranks;
    char addr[256];     /* host:port */
    char provider[32];
    char token[256];
    int timeout_ms;
    char source[64];    /* which launcher's variables were used, for messages */
} terse__launch;

/* Fill *out from cfg, then the environment for anything cfg leaves unset.
 * Contradictions (e.g. rank >= nranks, a malformed number, nranks > 1
 * without a token or address) fail with TERSE_ERR_INVALID and a sentence
 * naming the variable. */
terse_status terse__launch_resolve(const terse_comm_config *cfg, terse__launch *out);

#endif
