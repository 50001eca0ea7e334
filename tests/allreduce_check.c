/* allreduce_check: one rank of a small job that checks terse_allreduce end
 * to end through the public API only. Launch it as any launcher would
 * (terse-run, also with --hosts across network namespaces as
 * tests/netns_two_hosts.sh does, or TERSE_RANK/TERSE_SIZE/TERSE_ADDR/
 * TERSE_TOKEN by hand).
 *
 * Each rank contributes x_i = (rank + 1) * (i % 13 + 1), small integers
 * whose sums are exact in fp32 in any order, so the dense result must equal
 * (i % 13 + 1) * N(N+1)/2 exactly. Sizes cover the empty buffer, one
 * element, a prime, and one large enough for the pipelined ring's chunks.
 * A compressed allreduce (topk) then checks that every rank holds the same
 * bits (a hash compared through terse_allgather).
 *
 * Prints "topology rank R host H of NH local L of LS" (terse_comm_topology)
 * and "OK rank R of N over PROVIDER" and exits 0, or says what failed
 * and exits 1. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <terse.h>

static int fail(int rank, const char *what, terse_status s) {
    fprintf(stderr, "allreduce_check rank %d: %s failed: %s: %s\n", rank, what,
            terse_status_name(s), terse_last_error());
    return 1;
}

/* FNV-1a over the bytes: equal buffers give equal hashes on every rank. */
static uint64_t hash_bytes(const void *p, size_t n) {
    const unsigned char *b = p;
    uint64_t h = 0xcbf29ce484222325u;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3u;
    return h;
}

static int check_dense(terse_comm *comm, size_t n) {
    int rank = terse_comm_rank(comm), nranks = terse_comm_size(comm);
    float *buf = malloc((n ? n : 1) * sizeof(float));
    if (!buf) {
        fprintf(stderr, "allreduce_check rank %d: out of memory for %zu floats\n", rank, n);
        return 1;
    }
    for (size_t i = 0; i < n; i++) buf[i] = (float)((rank + 1) * (int)(i % 13 + 1));
    terse_status s = terse_allreduce(comm, buf, n, NULL, TERSE_OP_SUM);
    if (s != TERSE_OK) {
        free(buf);
        return fail(rank, "dense allreduce", s);
    }
    const int tri = nranks * (nranks + 1) / 2;
    for (size_t i = 0; i < n; i++) {
        float want = (float)(tri * (int)(i % 13 + 1));
        if (buf[i] != want) {
            fprintf(stderr, "allreduce_check rank %d: n=%zu: element %zu is %.9g, want %.9g\n",
                    rank, n, i, (double)buf[i], (double)want);
            free(buf);
            return 1;
        }
    }
    free(buf);
    return 0;
}

/* Every rank's result has the same hash. */
static int check_identical(terse_comm *comm, const float *buf, size_t n, const char *what) {
    int rank = terse_comm_rank(comm), nranks = terse_comm_size(comm);
    uint64_t mine = hash_bytes(buf, n * sizeof(float));
    uint64_t *all = calloc((size_t)nranks, sizeof *all);
    if (!all) return 1;
    terse_status s = terse_allgather(comm, &mine, sizeof mine, all, (size_t)nranks * sizeof mine,
                                     NULL);
    int bad = s != TERSE_OK ? fail(rank, "allgather of result hashes", s) : 0;
    for (int k = 0; !bad && k < nranks; k++)
        if (all[k] != mine) {
            fprintf(stderr, "allreduce_check rank %d: %s: rank %d holds different bits\n", rank,
                    what, k);
            bad = 1;
        }
    free(all);
    return bad;
}

static int check_topk(terse_comm *comm, size_t n) {
    int rank = terse_comm_rank(comm);
    terse_codec *codec = NULL;
    float *buf = malloc(n * sizeof(float));
    terse_status s = terse_codec_create("topk:ratio=0.05,ef=1", n, 1, &codec);
    if (s == TERSE_OK) s = terse_codec_set_stream(codec, 0, (uint32_t)rank);
    if (s != TERSE_OK || !buf) {
        free(buf);
        terse_codec_free(codec);
        return s != TERSE_OK ? fail(rank, "creating topk", s) : 1;
    }
    /* Distinct magnitudes per rank, so each picks different coordinates. */
    for (size_t i = 0; i < n; i++)
        buf[i] = (float)((i * 7919u + (size_t)rank * 104729u) % 10007u) - 5003.0f;
    s = terse_allreduce(comm, buf, n, codec, TERSE_OP_AVG);
    int bad = s != TERSE_OK ? fail(rank, "topk allreduce", s) : 0;
    if (!bad) bad = check_identical(comm, buf, n, "topk allreduce");
    terse_codec_free(codec);
    free(buf);
    return bad;
}

int main(void) {
    terse_comm_config cfg = TERSE_COMM_CONFIG_INIT;
    terse_comm *comm = NULL;
    terse_status s = terse_comm_init(&cfg, &comm);
    if (s != TERSE_OK) return fail(-1, "terse_comm_init", s);
    int rank = terse_comm_rank(comm);
    static const size_t sizes[] = {0, 1, 10007, (size_t)1 << 20 | 3};
    int bad = 0;
    for (size_t k = 0; !bad && k < sizeof sizes / sizeof sizes[0]; k++)
        bad = check_dense(comm, sizes[k]);
    if (!bad) bad = check_topk(comm, 10007);
    if (!bad && (s = terse_barrier(comm)) != TERSE_OK) bad = fail(rank, "final barrier", s);
    int host = -1, local = -1, local_size = -1, nhosts = -1;
    if (!bad && (s = terse_comm_topology(comm, &host, &local, &local_size, &nhosts)) != TERSE_OK)
        bad = fail(rank, "terse_comm_topology", s);
    if (!bad) printf("topology rank %d host %d of %d local %d of %d\n", rank, host, nhosts, local,
                     local_size);
    if (!bad) printf("OK rank %d of %d over %s\n", rank, terse_comm_size(comm),
                     terse_comm_provider(comm));
    terse_comm_free(comm);
    return bad;
}
