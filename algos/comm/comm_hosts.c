/* Hosts: which ranks share a machine (issue 28, stage 1).
 *
 * At init every rank publishes one fixed-size record through the store:
 *   - its group key: "env:" + TERSE_HOST when that is set (containers,
 *     tests, network namespaces on one machine), else its host identity
 *     (boot id, network namespace, PID namespace, /dev/shm, host name);
 *   - its reach key: what two processes must share for libfabric's shm to
 *     connect them (boot id, PID namespace -- shm reads a peer's memory by
 *     PID -- and the /dev/shm mount);
 *   - what its launcher says of its local rank and local size (torchrun's
 *     LOCAL_RANK / LOCAL_WORLD_SIZE, terse-run's TERSE_LOCAL_RANK /
 *     TERSE_LOCAL_SIZE, Open MPI's OMPI_COMM_WORLD_LOCAL_RANK / _SIZE,
 *     Slurm's SLURM_LOCALID), each only when that launcher's own rank and
 *     size variables name this very rank and size (variables left over
 *     from an outer job describe that job, not this one).
 * Every rank then derives the same grouping from the same table: hosts are
 * numbered by their lowest rank, a rank's local rank is its position among
 * the ranks of its host in rank order. Every check below is a function of
 * the table alone, so a contradiction fails every rank at init with the
 * same sentence rather than one rank with a guess. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "algos/comm/comm.h"
#include "common/bytes.h"
#include "common/error.h"

#define KEY_BYTES 256
#define REACH_BYTES 128
#define NCLAIMS 4
#define NET_BYTES 112
#define REC_BYTES (KEY_BYTES + REACH_BYTES + 4 + NCLAIMS * 8 + NET_BYTES)
#define NET_OFF (KEY_BYTES + REACH_BYTES + 4 + NCLAIMS * 8)
#define HOST_MAX 127 /* longest TERSE_HOST value */

/* Claim values: a number >= 0, or one of these. */
#define CLAIM_NONE (-1) /* the variable is not set (or describes another job) */
#define CLAIM_BAD (-2)  /* set, but not a number */

static const struct {
    const char *rank_var, *size_var; /* the launcher's own: must name this job */
    const char *local_rank, *local_size;
} claims[NCLAIMS] = {
    {"TERSE_RANK", "TERSE_SIZE", "TERSE_LOCAL_RANK", "TERSE_LOCAL_SIZE"},
    {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
    {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"},
    {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", NULL},
};

static void read_line(const char *path, char *out, size_t cap) {
    snprintf(out, cap, "?");
    FILE *f = fopen(path, "r");
    if (!f) return;
    if (!fgets(out, (int)cap, f)) snprintf(out, cap, "?");
    out[strcspn(out, "\n")] = 0;
    fclose(f);
}

static void read_link(const char *path, char *out, size_t cap) {
    ssize_t n = readlink(path, out, cap - 1);
    out[n > 0 ? n : 0] = 0;
    if (n <= 0) snprintf(out, cap, "?");
}

/* boot id | PID namespace | /dev/shm's device and inode */
static void reach_key(char out[REACH_BYTES]) {
    char boot[64], pidns[64];
    read_line("/proc/sys/kernel/random/boot_id", boot, sizeof boot);
    read_link("/proc/self/ns/pid", pidns, sizeof pidns);
    struct stat st;
    unsigned long long dev = 0, ino = 0;
    if (stat("/dev/shm", &st) == 0) {
        dev = (unsigned long long)st.st_dev;
        ino = (unsigned long long)st.st_ino;
    }
    memset(out, 0, REACH_BYTES);
    snprintf(out, REACH_BYTES, "%.40s|%.40s|%llx:%llx", boot, pidns, dev, ino);
}

/* A decimal in [0, INT_MAX], or CLAIM_BAD. */
static int parse_claim(const char *v) {
    if (!v || !*v) return CLAIM_BAD;
    errno = 0;
    char *end;
    long x = strtol(v, &end, 10);
    if (errno || *end || x < 0 || x > INT_MAX) return CLAIM_BAD;
    return (int)x;
}

/* 1 if the launcher's rank and size variables name this rank and size. */
static int names_this_job(int k, int rank, int nranks) {
    const char *r = getenv(claims[k].rank_var), *s = getenv(claims[k].size_var);
    return r && s && parse_claim(r) == rank && parse_claim(s) == nranks;
}

/* Fill this rank's record. *bad_host: TERSE_HOST is set but malformed. */
static void my_record(const terse_comm *c, uint8_t rec[REC_BYTES]) {
    memset(rec, 0, REC_BYTES);
    char *key = (char *)rec;
    const char *h = getenv("TERSE_HOST");
    char reach[REACH_BYTES];
    reach_key(reach);
    uint32_t bad_host = 0;
    if (h && *h) {
        size_t n = strlen(h);
        for (size_t i = 0; i < n; i++)
            if (h[i] < 0x21 || h[i] > 0x7e) bad_host = 1;
        if (n > HOST_MAX) bad_host = 1;
        if (!bad_host) snprintf(key, KEY_BYTES, "env:%s", h);
    }
    if (!(h && *h) || bad_host) {
        char netns[64], name[96];
        read_link("/proc/self/ns/net", netns, sizeof netns);
        if (gethostname(name, sizeof name - 1) != 0) snprintf(name, sizeof name, "?");
        name[sizeof name - 1] = 0;
        snprintf(key, KEY_BYTES, "id:%.100s|%.40s|%.95s", reach, netns, name);
    }
    memcpy(rec + KEY_BYTES, reach, REACH_BYTES);
    terse__put_u32(rec + KEY_BYTES + REACH_BYTES, bad_host);
    uint8_t *cl = rec + KEY_BYTES + REACH_BYTES + 4;
    for (int k = 0; k < NCLAIMS; k++) {
        int lr = CLAIM_NONE, ls = CLAIM_NONE;
        if (names_this_job(k, c->rank, c->nranks)) {
            const char *a = getenv(claims[k].local_rank);
            const char *b = claims[k].local_size ? getenv(claims[k].local_size) : NULL;
            if (a) lr = parse_claim(a);
            if (b) ls = parse_claim(b);
        }
        terse__put_u32(cl + 8 * k, (uint32_t)lr);
        terse__put_u32(cl + 8 * k + 4, (uint32_t)ls);
    }
    char boot[64], netns[40];
    read_line("/proc/sys/kernel/random/boot_id", boot, sizeof boot);
    read_link("/proc/self/ns/net", netns, sizeof netns);
    snprintf((char *)rec + NET_OFF, NET_BYTES, "%.60s|%.40s", boot, netns);
}

/* The host name a record shows in sentences: TERSE_HOST's value, or the
 * host name at the end of the identity. */
static const char *shown(const uint8_t *rec) {
    const char *key = (const char *)rec;
    if (!strncmp(key, "env:", 4)) return key + 4;
    const char *bar = strrchr(key, '|');
    return bar ? bar + 1 : key;
}

/* "0, 2, 5" (at most cap bytes) */
static void ranks_of(const int *host_of, int nranks, int h, char *buf, size_t cap) {
    size_t used = 0;
    buf[0] = 0;
    for (int r = 0; r < nranks; r++) {
        if (host_of[r] != h) continue;
        int n = snprintf(buf + used, cap - used, "%s%d", used ? ", " : "", r);
        if (n < 0 || (size_t)n >= cap - used) break;
        used += (size_t)n;
    }
}

/* c->ring_at and ring_pos from c->host_of (comm.h). */
static terse_status ring_order(terse_comm *c, int nhosts) {
    free(c->ring_at);
    c->ring_at = NULL;
    c->ring_pos = c->rank;
    if (nhosts < 2 || c->params.topology == 1) return TERSE_OK;
    int *at = malloc((size_t)c->nranks * sizeof *at);
    if (!at) return TERSE_ERROR(TERSE_ERR_NOMEM, "rank %d: allocating the ring order", c->rank);
    int p = 0, moved = 0;
    for (int h = 0; h < nhosts; h++)
        for (int r = 0; r < c->nranks; r++) {
            if (c->host_of[r] != h) continue;
            if (r == c->rank) c->ring_pos = p;
            moved |= r != p;
            at[p++] = r;
        }
    if (!moved) { /* ranks in blocks: the rank order already */
        free(at);
        return TERSE_OK;
    }
    c->ring_at = at;
    return TERSE_OK;
}

/* Group the table and check it; fills c's topology on success. */
static terse_status group(terse_comm *c, const uint8_t *all) {
    const int N = c->nranks;
    const size_t R = REC_BYTES;
    int *host_of = malloc((size_t)N * sizeof *host_of);
    int *local = malloc((size_t)N * sizeof *local);
    int *size_of = calloc((size_t)N, sizeof *size_of);
    terse_status s = TERSE_OK;
    if (!host_of || !local || !size_of)
        TERSE_FAIL_GOTO(s, out, TERSE_ERR_NOMEM, "rank %d: allocating the host table", c->rank);
    for (int r = 0; r < N; r++) { /* strings end inside their fields */
        const uint8_t *rec = all + (size_t)r * R;
        if (rec[KEY_BYTES - 1] || rec[KEY_BYTES + REACH_BYTES - 1] || rec[NET_OFF + NET_BYTES - 1])
            TERSE_FAIL_GOTO(s, out, TERSE_ERR_CORRUPT, "rank %d's host record is malformed", r);
    }
    for (int r = 0; r < N; r++)
        if (terse__get_u32(all + (size_t)r * R + KEY_BYTES + REACH_BYTES))
            TERSE_FAIL_GOTO(s, out, TERSE_ERR_INVALID,
                            "rank %d's TERSE_HOST is not a host name terse accepts (1 to %d "
                            "printable characters, no spaces)",
                            r, HOST_MAX);
    int nhosts = 0;
    for (int r = 0; r < N; r++) {
        host_of[r] = -1;
        for (int q = 0; q < r && host_of[r] < 0; q++)
            if (!memcmp(all + (size_t)q * R, all + (size_t)r * R, KEY_BYTES)) {
                host_of[r] = host_of[q];
                if (memcmp(all + (size_t)q * R + KEY_BYTES, all + (size_t)r * R + KEY_BYTES,
                           REACH_BYTES) != 0)
                    TERSE_FAIL_GOTO(s, out, TERSE_ERR_INVALID,
                                    "ranks %d and %d are grouped on host '%s' but cannot share "
                                    "memory (different boot id, PID namespace or /dev/shm): "
                                    "shared memory could not connect them; give them "
                                    "different TERSE_HOST values",
                                    q, r, shown(all + (size_t)r * R));
            }
        if (host_of[r] < 0) host_of[r] = nhosts++;
        local[r] = size_of[host_of[r]]++;
    }
    for (int r = 0; r < N; r++) {
        const uint8_t *cl = all + (size_t)r * R + KEY_BYTES + REACH_BYTES + 4;
        for (int k = 0; k < NCLAIMS; k++) {
            int lr = (int)terse__get_u32(cl + 8 * k), ls = (int)terse__get_u32(cl + 8 * k + 4);
            int want_ls = size_of[host_of[r]];
            if (lr == CLAIM_BAD || ls == CLAIM_BAD)
                TERSE_FAIL_GOTO(s, out, TERSE_ERR_INVALID,
                                "rank %d: %s%s%s is not a number", r,
                                lr == CLAIM_BAD ? claims[k].local_rank : "",
                                lr == CLAIM_BAD && ls == CLAIM_BAD ? " or " : "",
                                ls == CLAIM_BAD ? claims[k].local_size : "");
            if ((lr == CLAIM_NONE || lr == local[r]) && (ls == CLAIM_NONE || ls == want_ls))
                continue;
            char members[160];
            ranks_of(host_of, N, host_of[r], members, sizeof members);
            char said[96];
            if (ls == CLAIM_NONE)
                snprintf(said, sizeof said, "%s=%d", claims[k].local_rank, lr);
            else if (lr == CLAIM_NONE)
                snprintf(said, sizeof said, "%s=%d", claims[k].local_size, ls);
            else
                snprintf(said, sizeof said, "%s=%d and %s=%d", claims[k].local_rank, lr,
                         claims[k].local_size, ls);
            TERSE_FAIL_GOTO(s, out, TERSE_ERR_INVALID,
                            "rank %d: its launcher says %s, but grouping the ranks by host "
                            "(%s) makes it local rank %d of %d on host '%s' (ranks %s); "
                            "set TERSE_HOST alike on the ranks of one machine, or fix the "
                            "launcher's variables",
                            r, said,
                            strncmp((const char *)all + (size_t)r * R, "env:", 4)
                                ? "host identity: boot id, namespaces, host name"
                                : "TERSE_HOST",
                            local[r], want_ls, shown(all + (size_t)r * R), members);
        }
    }
    c->nhosts = nhosts;
    c->uniform_hosts = 1;
    c->local_min = c->local_max = size_of[0];
    for (int g = 0; g < nhosts; g++) {
        if (size_of[g] != size_of[0]) c->uniform_hosts = 0;
        if (size_of[g] < c->local_min) c->local_min = size_of[g];
        if (size_of[g] > c->local_max) c->local_max = size_of[g];
    }
    c->one_net = 1;
    for (int r = 1; r < N; r++)
        if (memcmp(all + NET_OFF, all + (size_t)r * R + NET_OFF, NET_BYTES) != 0) c->one_net = 0;
    c->host_index = host_of[c->rank];
    c->local_rank = local[c->rank];
    c->local_size = size_of[c->host_index];
    free(c->host_of);
    c->host_of = host_of;
    host_of = NULL;
    s = ring_order(c, nhosts);
out:
    free(host_of);
    free(local);
    free(size_of);
    return s;
}

void terse__comm_hosts_single(terse_comm *c) {
    c->nhosts = 1;
    c->host_index = 0;
    c->local_rank = 0;
    c->local_size = 1;
    c->uniform_hosts = 1;
    c->local_min = c->local_max = 1;
    c->one_net = 1;
}

terse_status terse__comm_hosts(terse_comm *c, int timeout_ms) {
    uint8_t mine[REC_BYTES];
    my_record(c, mine);
    uint8_t *all = malloc((size_t)c->nranks * REC_BYTES);
    if (!all) return TERSE_ERROR(TERSE_ERR_NOMEM, "rank %d: allocating host records", c->rank);
    terse_status s = terse__store_allgather(c->store, mine, REC_BYTES, all, timeout_ms);
    if (s == TERSE_OK) s = group(c, all);
    free(all);
    return s;
}

terse_status terse_comm_topology(const terse_comm *c, int *host_index, int *local_rank,
                                 int *local_size, int *nhosts) {
    if (!c) return TERSE_ERROR(TERSE_ERR_INVALID, "terse_comm_topology: comm is NULL");
    if (host_index) *host_index = c->host_index;
    if (local_rank) *local_rank = c->local_rank;
    if (local_size) *local_size = c->local_size;
    if (nhosts) *nhosts = c->nhosts;
    return TERSE_OK;
}

int terse_comm_host_of(const terse_comm *c, int rank) {
    if (!c || rank < 0 || rank >= c->nranks) return -1;
    return c->host_of ? c->host_of[rank] : 0;
}
