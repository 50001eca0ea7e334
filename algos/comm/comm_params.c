/* The tuning variables that change how ranks cut and route their
 * messages. Ranks that disagree on any of them would post receives of
 * other sizes or run other algorithms than their peers, which shows up as
 * truncation, corrupt data or a hang far from the cause; so each rank reads
 * them once, at init, and the ranks compare them through the store before
 * any collective runs. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "algos/comm/comm.h"
#include "common/bytes.h"
#include "common/env.h"
#include "common/error.h"

#define NPARAMS 10

static const char *const names[NPARAMS] = {"TERSE_RD_MAX_BYTES", "TERSE_RING_CHUNK_BYTES",
                                           "TERSE_CHUNK_BYTES", "TERSE_WIRE",
                                           "TERSE_COMPRESSED_ALGO", "TERSE_PIPELINE_BYTES",
                                           "TERSE_TOPOLOGY", "TERSE_CHECK_CALLS",
                                           "TERSE_SHM_SEGMENT", "TERSE_SEGMENT_STEP_BYTES"};

static void as_array(const terse__params *p, uint64_t v[NPARAMS]) {
    v[0] = p->rd_max_bytes;
    v[1] = p->ring_chunk_bytes;
    v[2] = p->chunk_bytes;
    v[3] = p->wire;
    v[4] = p->compressed_algo;
    v[5] = p->pipeline_bytes;
    v[6] = p->topology;
    v[7] = p->check_calls_off;
    v[8] = p->shm_segment;
    v[9] = p->segment_step_bytes;
}

terse_status terse__params_read(int rank, terse__params *p) {
    terse_status s;
    memset(p, 0, sizeof *p);
    s = terse__env_bytes(names[0], (size_t)64 << 10, 0, (size_t)1 << 40, &p->rd_max_bytes);
    if (s == TERSE_OK)
        s = terse__env_bytes(names[1], (size_t)512 << 10, 4096, (size_t)1 << 30,
                             &p->ring_chunk_bytes);
    if (s == TERSE_OK)
        s = terse__env_bytes(names[2], (size_t)1 << 20, 1, SIZE_MAX, &p->chunk_bytes);
    static const char *const modes[] = {"thread", "caller", NULL};
    static const char *const simd[] = {"scalar", "avx2", NULL};
    int simd_cap = 0;
    if (s == TERSE_OK) s = terse__env_choice("TERSE_PROGRESS", modes, 0, &p->progress_caller);
    if (s == TERSE_OK) s = terse__env_choice("TERSE_SIMD", simd, 0, &simd_cap);
    /* seal (issue 28's name) and encrypt (its name before) are one mode */
    static const char *const wires[] = {"auto", "none", "mac", "seal", "encrypt", NULL};
    int wire = 0;
    if (s == TERSE_OK) s = terse__env_choice("TERSE_WIRE", wires, 0, &wire);
    p->wire = (size_t)(wire == 4 ? 3 : wire);
    static const char *const algos[] = {"auto", "gather", "rs", NULL};
    int algo = 0;
    if (s == TERSE_OK) s = terse__env_choice("TERSE_COMPRESSED_ALGO", algos, 0, &algo);
    p->compressed_algo = (size_t)algo;
    static const char *const topos[] = {"auto", "flat", "hier", NULL};
    int topo = 0;
    if (s == TERSE_OK) s = terse__env_choice("TERSE_TOPOLOGY", topos, 0, &topo);
    p->topology = (size_t)topo;
    static const char *const onoff[] = {"on", "off", NULL};
    int calls_off = 0;
    if (s == TERSE_OK) s = terse__env_choice("TERSE_CHECK_CALLS", onoff, 0, &calls_off);
    p->check_calls_off = (size_t)calls_off;
    static const char *const segs[] = {"auto", "off", NULL};
    int seg = 0;
    if (s == TERSE_OK) s = terse__env_choice("TERSE_SHM_SEGMENT", segs, 0, &seg);
    p->shm_segment = (size_t)seg;
    if (s == TERSE_OK)
        s = terse__env_bytes(names[9], 0, 4096, (size_t)16 << 20, &p->segment_step_bytes);
    if (s == TERSE_OK)
        s = terse__env_bytes(names[5], TERSE__PIPELINE_BYTES_DEFAULT, 0, (size_t)1 << 40,
                             &p->pipeline_bytes);
    if (s != TERSE_OK) {
        char why[400];
        snprintf(why, sizeof why, "%s", terse__comm_last_sentence());
        return TERSE_ERROR(s, "rank %d: %s", rank, why);
    }
    p->ring_chunk_bytes &= ~(size_t)63; /* whole cache lines, and whole floats */
    p->segment_step_bytes &= ~(size_t)63;
    return TERSE_OK;
}

terse_status terse__params_agree(terse_comm *c, int timeout_ms) {
    uint64_t mine[NPARAMS];
    as_array(&c->params, mine);
    uint8_t blob[8 * NPARAMS];
    for (int i = 0; i < NPARAMS; i++) terse__put_u64(blob + 8 * i, mine[i]);
    uint8_t *all = malloc((size_t)c->nranks * sizeof blob);
    if (!all) return TERSE_ERROR(TERSE_ERR_NOMEM, "rank %d: allocating parameters", c->rank);
    terse_status s = terse__store_allgather(c->store, blob, sizeof blob, all, timeout_ms);
    for (int r = 0; s == TERSE_OK && r < c->nranks; r++)
        for (int i = 0; i < NPARAMS; i++) {
            uint64_t theirs = terse__get_u64(all + (size_t)r * sizeof blob + 8 * (size_t)i);
            if (theirs == mine[i]) continue;
            if (i == 3) {
                static const char *const w[] = {"auto", "none", "mac", "seal"};
                s = TERSE_ERROR(TERSE_ERR_INVALID,
                                "TERSE_WIRE is %s on rank %d but %s on rank %d; set it alike on "
                                "every rank (or unset it everywhere)",
                                w[mine[i] % 4], c->rank, w[theirs % 4], r);
                break;
            }
            if (i == 4 || i == 6 || i == 7 || i == 8) { /* choices */
                static const char *const a[] = {"auto", "gather", "rs"};
                static const char *const t[] = {"auto", "flat", "hier"};
                static const char *const k[] = {"on", "off", "?"};
                static const char *const g[] = {"auto", "off", "?"};
                const char *const *v = i == 4 ? a : i == 6 ? t : i == 7 ? k : g;
                s = TERSE_ERROR(TERSE_ERR_INVALID,
                                "%s is %s on rank %d but %s on rank %d; ranks that disagree "
                                "would %s: set it alike on every rank (or unset it everywhere)",
                                names[i], v[mine[i] % 3], c->rank, v[theirs % 3], r,
                                i == 4   ? "run different algorithms"
                                : i == 6 ? "route and run collectives differently"
                                : i == 8 ? "run different all-reduce algorithms"
                                         : "send different messages");
                break;
            }
            /* 0: unset (TERSE_SEGMENT_STEP_BYTES's default depends on the hosts) */
            char a[32] = "unset", b[32] = "unset";
            if (mine[i]) snprintf(a, sizeof a, "%" PRIu64, mine[i]);
            if (theirs) snprintf(b, sizeof b, "%" PRIu64, theirs);
            s = TERSE_ERROR(TERSE_ERR_INVALID,
                            "%s is %s on rank %d but %s on rank %d; ranks "
                            "that disagree would cut messages differently: set it alike on "
                            "every rank (or unset it everywhere)",
                            names[i], a, c->rank, b, r);
            break;
        }
    free(all);
    return s;
}
