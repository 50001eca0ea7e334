/* Chunks on servers: consistent hashing with virtual nodes and bounded
 * loads (Mirrokni, Thorup, Zadimoghaddam 2018). Each server owns `vnodes`
 * points on a 64-bit ring; a chunk hashes to a point and goes to the first
 * server clockwise whose load, in bytes, stays within 1.25x the mean of
 * everything placed so far including this chunk -- so ten equal tensors
 * on three servers land 4/4/2 at worst, never 10/0/0 (ps-lite #119,
 * #156), and adding a server moves about 1/S of the chunks. Everything is
 * a pure function of (key, chunk, sizes, declaration order), so every rank
 * computes the same placement without talking. */
#include <math.h>
#include <stdlib.h>

#include "algos/ps/ps.h"
#include "common/error.h"

#define LOAD_FACTOR 1.25

uint64_t terse__ps_mix(uint64_t x) { /* splitmix64's finaliser */
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static int by_hash(const void *a, const void *b, void *ring) {
    const uint64_t *h = ring;
    uint64_t x = h[*(const size_t *)a], y = h[*(const size_t *)b];
    return x < y ? -1 : x > y;
}

terse_status terse__ps_ring_build(terse_ps *ps) {
    size_t n = (size_t)ps->nservers * (size_t)ps->cfg.vnodes;
    uint64_t *h = malloc(n * sizeof *h);
    size_t *idx = malloc(n * sizeof *idx);
    ps->ring_hash = malloc(n * sizeof *ps->ring_hash);
    ps->ring_server = malloc(n * sizeof *ps->ring_server);
    if (!h || !idx || !ps->ring_hash || !ps->ring_server) {
        free(h), free(idx);
        return TERSE_ERROR(TERSE_ERR_NOMEM, "no memory for the placement ring");
    }
    for (size_t i = 0; i < n; i++) {
        int s = (int)(i / (size_t)ps->cfg.vnodes);
        uint64_t v = i % (size_t)ps->cfg.vnodes;
        h[i] = terse__ps_mix(((uint64_t)s << 32 | v) ^ 0x7073726e67ull);
        idx[i] = i;
    }
    qsort_r(idx, n, sizeof *idx, by_hash, h);
    for (size_t i = 0; i < n; i++) {
        ps->ring_hash[i] = h[idx[i]];
        ps->ring_server[i] = (int)(idx[i] / (size_t)ps->cfg.vnodes);
    }
    ps->ring_len = n;
    free(h), free(idx);
    return TERSE_OK;
}

/* First ring point at or after x (wrapping). */
static size_t ring_find(const terse_ps *ps, uint64_t x) {
    size_t lo = 0, hi = ps->ring_len;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (ps->ring_hash[mid] < x) lo = mid + 1;
        else hi = mid;
    }
    return lo == ps->ring_len ? 0 : lo;
}

/* The first server clockwise from ring point `at` that takes `bytes`
 * within `cap` and, when `mine` is given, holds fewer than `per_key` of
 * this key's chunks; -1 if none. */
static int walk(const terse_ps *ps, size_t at, uint64_t bytes, double cap, const size_t *mine,
                size_t per_key) {
    for (size_t step = 0; step < ps->ring_len; step++) {
        int s = ps->ring_server[(at + step) % ps->ring_len];
        if ((double)(ps->placed[s] + bytes) <= cap && (!mine || mine[s] < per_key)) return s;
    }
    return -1;
}

terse_status terse__ps_place(terse_ps *ps, terse__ps_key *k) {
    uint64_t total = 0;
    for (int s = 0; s < ps->nservers; s++) total += ps->placed[s];
    /* A declared key's chunks are spread evenly too, at most ceil(chunks /
     * S) on a server: every worker pushes a key's partitions at the same
     * moment, so the busiest server's share of one key is the time its
     * link needs (the global bound alone put 9 of a 16-chunk key on one of
     * 2). The count runs over all of the declared key's partitions
     * (terse_ps_declare sets place_mine), else over this internal key. */
    size_t *mine = ps->place_mine, chunks = ps->place_chunks;
    if (!mine) {
        if (!(mine = calloc((size_t)ps->nservers, sizeof *mine)))
            return TERSE_ERROR(TERSE_ERR_NOMEM, "no memory to place a key");
        chunks = k->nchunks;
    }
    size_t per_key = (chunks + (size_t)ps->nservers - 1) / (size_t)ps->nservers;
    size_t key = k->index;
    for (size_t c = 0; c < k->nchunks; c++) {
        size_t len = c + 1 < k->nchunks ? k->chunk_floats : k->n - c * k->chunk_floats;
        uint64_t bytes = (uint64_t)len * sizeof(float);
        total += bytes;
        /* The bound in whole chunks, rounded up, so the first chunks fit. */
        double unit = (double)k->chunk_floats * sizeof(float);
        double cap = unit * ceil(LOAD_FACTOR * (double)total / ps->nservers / unit);
        size_t at = ring_find(ps, terse__ps_mix((uint64_t)key << 40 ^ (uint64_t)c));
        int chosen = walk(ps, at, bytes, cap, mine, per_key);
        if (chosen < 0) chosen = walk(ps, at, bytes, cap, NULL, 0);
        if (chosen < 0) { /* every server full: the least loaded */
            chosen = 0;
            for (int s = 1; s < ps->nservers; s++)
                if (ps->placed[s] < ps->placed[chosen]) chosen = s;
        }
        k->server[c] = chosen;
        ps->placed[chosen] += bytes;
        mine[chosen]++;
    }
    if (mine != ps->place_mine) free(mine);
    return TERSE_OK;
}
