/* Hosts (issue 28, stage 1): grouping ranks by TERSE_HOST or host
 * identity at init, terse_comm_topology, and the refusals -- a malformed
 * TERSE_HOST, ranks grouped on one "host" that cannot share memory, and
 * launcher variables that contradict the grouping -- each on every rank
 * alike with a sentence, never a guess. Real processes (tests/ranks.h). */
#include <sched.h>
#include <sys/mount.h>

#include <math.h>

#include "algos/comm/comm.h"
#include "ranks.h"

/* Per test: each rank's TERSE_HOST (NULL: unset) and extra variables. */
typedef struct {
    const char *host[TR_MAX_RANKS];
    const char *var, *val[TR_MAX_RANKS]; /* one more variable per rank */
    int own_shm_rank;                     /* this rank gets a /dev/shm of its own (-1: none) */
} host_setup;

static void set_host(int rank, const void *arg) {
    const host_setup *h = arg;
    char buf[16];
    snprintf(buf, sizeof buf, "%d", rank);
    setenv("TERSE_RANK", buf, 1); /* a launcher's rank and size naming this job */
    setenv("RANK", buf, 1);       /* torchrun's too (counts only with WORLD_SIZE) */
    if (getenv("TOPO_SIZE_OVERRIDE")) setenv("TERSE_SIZE", getenv("TOPO_SIZE_OVERRIDE"), 1);
    unsetenv("TERSE_LOCAL_RANK");
    unsetenv("TERSE_LOCAL_SIZE");
    if (h->host[rank])
        setenv("TERSE_HOST", h->host[rank], 1);
    else
        unsetenv("TERSE_HOST");
    if (h->var && h->val[rank]) setenv(h->var, h->val[rank], 1);
    if (h->own_shm_rank == rank) {
        /* a mount namespace with its own tmpfs on /dev/shm: shm could not
         * reach this rank from the others */
        if (unshare(CLONE_NEWNS) != 0 ||
            mount("none", "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0 ||
            mount("tmpfs", "/dev/shm", "tmpfs", 0, "mode=1777") != 0)
            _exit(77);
    }
}

static int topo_body(terse_comm *c, tr_out *o, const void *arg) {
    (void)arg;
    int h = -9, lr = -9, ls = -9, nh = -9;
    TR_CALL(o, terse_comm_topology(c, &h, &lr, &ls, &nh));
    o->u[0] = (uint64_t)h;
    o->u[1] = (uint64_t)lr;
    o->u[2] = (uint64_t)ls;
    o->u[3] = (uint64_t)nh;
    for (int r = 0; r < terse_comm_size(c); r++) o->u[8 + r] = (uint64_t)terse_comm_host_of(c, r);
    snprintf(o->err, sizeof o->err, "%s", terse_comm_provider(c));
    /* the flat path still sums right over the grouping */
    float x[1000];
    for (int i = 0; i < 1000; i++) x[i] = (float)(terse_comm_rank(c) + 1) * (float)i;
    TR_CALL(o, terse_allreduce(c, x, 1000, NULL, TERSE_OP_SUM));
    const int N = terse_comm_size(c);
    for (int i = 0; i < 1000; i++)
        if (x[i] != (float)(N * (N + 1) / 2) * (float)i) return tr_fail(o, TERSE_ERR_INTERNAL, "sum");
    return 0;
}

static void setenv_size(int n) {
    char buf[16];
    snprintf(buf, sizeof buf, "%d", n);
    setenv("TERSE_SIZE", buf, 1);
}

static tr_out *run_topo(const char *provider, int n, host_setup *h) {
    setenv_size(n);
    tr_before_init = set_host;
    tr_job job = {provider, n, 20000, 60, -1};
    return tr_run(&job, topo_body, h);
}

static void expect_rank(const tr_out *o, int r, int host, int lr, int ls, int nh) {
    cr_expect_eq((int)o[r].u[0], host, "rank %d host %d", r, (int)o[r].u[0]);
    cr_expect_eq((int)o[r].u[1], lr, "rank %d local rank %d", r, (int)o[r].u[1]);
    cr_expect_eq((int)o[r].u[2], ls, "rank %d local size %d", r, (int)o[r].u[2]);
    cr_expect_eq((int)o[r].u[3], nh, "rank %d hosts %d", r, (int)o[r].u[3]);
}

Test(topology, two_hosts_of_two_interleaved) {
    host_setup h = {.host = {"b", "a", "b", "a"}, .own_shm_rank = -1};
    tr_out *o = run_topo("tcp", 4, &h);
    /* hosts are numbered by their lowest rank: "b" is host 0 */
    expect_rank(o, 0, 0, 0, 2, 2);
    expect_rank(o, 1, 1, 0, 2, 2);
    expect_rank(o, 2, 0, 1, 2, 2);
    expect_rank(o, 3, 1, 1, 2, 2);
    for (int r = 0; r < 4; r++)
        for (int q = 0; q < 4; q++) cr_expect_eq((int)o[r].u[8 + q], q % 2);
    tr_release(o);
}

Test(topology, uneven_three_and_one_with_launcher_variables_that_agree) {
    host_setup h = {.host = {"x", "x", "y", "x"},
                    .var = "TERSE_LOCAL_RANK",
                    .val = {"0", "1", "0", "2"},
                    .own_shm_rank = -1};
    tr_out *o = run_topo("tcp", 4, &h);
    expect_rank(o, 0, 0, 0, 3, 2);
    expect_rank(o, 1, 0, 1, 3, 2);
    expect_rank(o, 2, 1, 0, 1, 2);
    expect_rank(o, 3, 0, 2, 3, 2);
    tr_release(o);
}

Test(topology, one_host_auto_is_shm_as_before) {
    host_setup h = {.own_shm_rank = -1};
    tr_out *o = run_topo("auto", 3, &h);
    for (int r = 0; r < 3; r++) {
        expect_rank(o, r, 0, r, 3, 1);
        cr_expect_str_eq(o[r].err, "shm");
    }
    tr_release(o);
}

Test(topology, single_rank) {
    terse_comm_config cfg = TERSE_COMM_CONFIG_INIT;
    cfg.rank = 0;
    cfg.nranks = 1;
    terse_comm *c = NULL;
    cr_assert_eq(terse_comm_init(&cfg, &c), TERSE_OK, "%s", terse_last_error());
    int h = -9, lr = -9, ls = -9, nh = -9;
    cr_expect_eq(terse_comm_topology(c, &h, &lr, &ls, &nh), TERSE_OK);
    cr_expect(h == 0 && lr == 0 && ls == 1 && nh == 1);
    cr_expect_eq(terse_comm_topology(c, NULL, NULL, NULL, NULL), TERSE_OK);
    cr_expect_eq(terse_comm_host_of(c, 0), 0);
    cr_expect_eq(terse_comm_host_of(c, 1), -1);
    cr_expect_eq(terse_comm_host_of(c, -1), -1);
    terse_comm_free(c);
    cr_expect_eq(terse_comm_topology(NULL, &h, NULL, NULL, NULL), TERSE_ERR_INVALID);
    cr_expect_eq(terse_comm_host_of(NULL, 0), -1);
}

/* ---- refusals: every rank's init fails alike ---- */

typedef struct {
    int status;
    int exited; /* 77: the setup could not run (no root) */
    char err[768];
} init_out;

/* n ranks run terse_comm_init after set_host; outs[r] says how it went. */
static init_out *run_inits(int n, host_setup *h) {
    init_out *outs = mmap(NULL, sizeof(init_out) * TR_MAX_RANKS, PROT_READ | PROT_WRITE,
                          MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(outs, MAP_FAILED);
    memset(outs, 0, sizeof(init_out) * TR_MAX_RANKS);
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", tr_free_port());
    setenv_size(n);
    pid_t pids[TR_MAX_RANKS];
    fflush(NULL);
    for (int r = 0; r < n; r++) {
        pids[r] = fork();
        cr_assert_geq(pids[r], 0);
        if (pids[r] == 0) {
            set_host(r, h);
            terse_comm_config cfg = TERSE_COMM_CONFIG_INIT;
            cfg.rank = r;
            cfg.nranks = n;
            cfg.addr = addr;
            cfg.provider = "tcp";
            cfg.token = "collectives-test-token";
            cfg.timeout_ms = 20000;
            terse_comm *c = NULL;
            terse_status s = terse_comm_init(&cfg, &c);
            outs[r].status = (int)s;
            snprintf(outs[r].err, sizeof outs[r].err, "%s", terse_last_error());
            terse_comm_free(c);
            _exit(0);
        }
    }
    double until = tr_now_ms() + 60000;
    int left = n, st[TR_MAX_RANKS];
    for (int r = 0; r < n; r++) st[r] = -1;
    while (left && tr_now_ms() < until) {
        for (int r = 0; r < n; r++)
            if (st[r] == -1 && waitpid(pids[r], &st[r], WNOHANG) == pids[r]) left--;
        if (left) usleep(2000);
    }
    for (int r = 0; r < n; r++)
        if (st[r] == -1) {
            kill(pids[r], SIGKILL);
            waitpid(pids[r], &st[r], 0);
        }
    cr_assert_eq(left, 0, "init hung");
    for (int r = 0; r < n; r++) outs[r].exited = WIFEXITED(st[r]) ? WEXITSTATUS(st[r]) : -1;
    return outs;
}

/* Every rank's init failed with TERSE_ERR_INVALID and a sentence holding
 * a and b. */
static void expect_refused(const init_out *o, int n, const char *a, const char *b) {
    for (int r = 0; r < n; r++) {
        cr_expect_eq(o[r].exited, 0, "rank %d exited %d", r, o[r].exited);
        cr_expect_eq(o[r].status, TERSE_ERR_INVALID, "rank %d: %s: %s", r,
                     terse_status_name(o[r].status), o[r].err);
        cr_expect(strstr(o[r].err, a), "rank %d: '%s' not in: %s", r, a, o[r].err);
        if (b) cr_expect(strstr(o[r].err, b), "rank %d: '%s' not in: %s", r, b, o[r].err);
    }
}

Test(topology, launcher_local_rank_contradicting_the_grouping_fails_every_rank) {
    /* torchrun's variables say 2 ranks a host; TERSE_HOST groups 3 + 1 */
    host_setup h = {.host = {"p", "p", "p", "q"},
                    .var = "LOCAL_WORLD_SIZE",
                    .val = {"2", "2", "2", "2"},
                    .own_shm_rank = -1};
    setenv("WORLD_SIZE", "4", 1); /* with RANK (set_host): torchrun names this job */
    setenv("LOCAL_RANK", "0", 1); /* rank 0 agrees on its local rank */
    init_out *o = run_inits(4, &h);
    expect_refused(o, 4, "LOCAL_WORLD_SIZE=2", "local rank 0 of 3 on host 'p'");
    munmap(o, sizeof(init_out) * TR_MAX_RANKS);
}

Test(topology, terse_local_rank_contradicting_fails_every_rank) {
    host_setup h = {.host = {"p", "p", "q"},
                    .var = "TERSE_LOCAL_RANK",
                    .val = {"0", "0", "0"}, /* rank 1 is local rank 1 of host p */
                    .own_shm_rank = -1};
    init_out *o = run_inits(3, &h);
    expect_refused(o, 3, "rank 1: its launcher says TERSE_LOCAL_RANK=0",
                   "local rank 1 of 2 on host 'p' (ranks 0, 1)");
    munmap(o, sizeof(init_out) * TR_MAX_RANKS);
}

Test(topology, variables_of_another_job_are_ignored) {
    /* TERSE_SIZE names another size: its TERSE_LOCAL_RANK is not ours */
    host_setup h = {.host = {"p", "p"},
                    .var = "TERSE_LOCAL_RANK",
                    .val = {"5", "5"},
                    .own_shm_rank = -1};
    init_out *o = run_inits(2, &h); /* sets TERSE_SIZE=2 ... */
    for (int r = 0; r < 2; r++) cr_expect_eq(o[r].status, TERSE_ERR_INVALID, "%s", o[r].err);
    munmap(o, sizeof(init_out) * TR_MAX_RANKS);
    setenv("TOPO_SIZE_OVERRIDE", "7", 1); /* ... so run again with TERSE_SIZE=7 */
    o = run_inits(2, &h);
    for (int r = 0; r < 2; r++)
        cr_expect_eq(o[r].status, TERSE_OK, "rank %d: %s", r, o[r].err);
    munmap(o, sizeof(init_out) * TR_MAX_RANKS);
}

Test(topology, malformed_terse_host_fails_every_rank) {
    host_setup h = {.host = {"ok", "has space"}, .own_shm_rank = -1};
    init_out *o = run_inits(2, &h);
    expect_refused(o, 2, "rank 1's TERSE_HOST", "printable");
    munmap(o, sizeof(init_out) * TR_MAX_RANKS);
}

Test(topology, one_host_value_over_separate_shared_memory_fails_every_rank) {
    if (geteuid() != 0) {
        fprintf(stderr, "[NOTE] topology: not root: the /dev/shm mount namespace test did "
                        "not run\n");
        return;
    }
    host_setup h = {.host = {"same", "same"}, .own_shm_rank = 1};
    init_out *o = run_inits(2, &h);
    if (o[1].exited == 77) {
        fprintf(stderr, "[NOTE] topology: unshare/mount of /dev/shm refused here: the "
                        "separate-/dev/shm test did not run\n");
        munmap(o, sizeof(init_out) * TR_MAX_RANKS);
        return;
    }
    expect_refused(o, 2, "ranks 0 and 1 are grouped on host 'same' but cannot share memory",
                   NULL);
    munmap(o, sizeof(init_out) * TR_MAX_RANKS);
}

/* ---- stage 2: two endpoints, routed per peer ---- */

/* Collectives over shm (same host) and the network (other hosts) at once:
 * dense sums exact against an integer reference, compressed results equal
 * bit for bit on every rank. u[4]: 1 if the provider is the routed pair. */
static int routed_body(terse_comm *c, tr_out *o, const void *arg) {
    (void)arg;
    const int r = terse_comm_rank(c), N = terse_comm_size(c);
    o->u[4] = (uint64_t)(strcmp(terse_comm_provider(c), "shm+net") == 0);
    snprintf(o->err, sizeof o->err, "%s", terse_comm_provider(c));
    static const size_t sizes[] = {7, 5000, 1 << 20}; /* rd, small ring, chunked ring */
    for (size_t k = 0; k < 3; k++) {
        size_t n = sizes[k];
        float *x = malloc(n * sizeof *x);
        if (!x) return tr_fail(o, TERSE_ERR_NOMEM, "malloc");
        for (size_t i = 0; i < n; i++) x[i] = (float)((int)(i % 1000) - 500 + r * 7);
        TR_CALL(o, terse_allreduce(c, x, n, NULL, TERSE_OP_SUM));
        for (size_t i = 0; i < n; i++) {
            double want = 0; /* the float64 reference (exact: small integers) */
            for (int q = 0; q < N; q++) want += (double)((int)(i % 1000) - 500 + q * 7);
            if ((double)x[i] != want) {
                free(x);
                return tr_fail(o, TERSE_ERR_INTERNAL, "dense sum differs from the reference");
            }
        }
        free(x);
    }
    const char *algo = terse_allreduce_algorithm(c, NULL, 1 << 20);
    o->u[5] = (uint64_t)(strncmp(algo, "dense-hier", 10) == 0);
    o->u[6] = (uint64_t)(strcmp(algo, "dense-hier-seg") == 0);
    /* codecs of three families (messages, rounds, summable): every rank
     * the same bits */
    static const char *const specs[] = {"int8", "powersgd:rank=4", "randk:ratio=0.1"};
    const size_t n = 300 * 400;
    float *g = malloc(n * sizeof *g);
    for (int k = 0; k < 3; k++) {
        terse_codec *codec = NULL;
        TR_CALL(o, terse_codec_create(specs[k], 300, 400, &codec));
        for (int step = 0; step < 2; step++) {
            for (size_t i = 0; i < n; i++) g[i] = sinf((float)(i + 1) * 0.001f * (float)(r + 1));
            TR_CALL(o, terse_allreduce(c, g, n, codec, TERSE_OP_AVG));
        }
        o->hash[k == 0 ? 0 : 1 + k] = tr_hash(g, n * sizeof *g);
        terse_codec_free(codec);
    }
    free(g);
    /* broadcast from the last rank, allgather, barrier */
    size_t bytes = 3u << 20;
    uint8_t *b = malloc(bytes);
    for (size_t i = 0; i < bytes; i++) b[i] = (uint8_t)(r == N - 1 ? i * 31 + 7 : 0);
    TR_CALL(o, terse_broadcast(c, b, bytes, N - 1));
    o->hash[1] = tr_hash(b, bytes);
    free(b);
    int mine = 1000 + r, all[TR_MAX_RANKS];
    TR_CALL(o, terse_allgather(c, &mine, sizeof mine, all, sizeof all, NULL));
    for (int q = 0; q < N; q++)
        if (all[q] != 1000 + q) return tr_fail(o, TERSE_ERR_INTERNAL, "allgather");
    TR_CALL(o, terse_barrier(c));
    return 0;
}

/* routed: bit r set if rank r should have the routed pair */
/* hier: bit r set if rank r should run 1M floats on the hierarchical path,
 * over the hosts' shared segments unless TERSE_SHM_SEGMENT=off (segment) */
static void check_routed_seg(const char *topology, const char *segment, int n, host_setup *h,
                             unsigned routed, unsigned hier) {
    setenv_size(n);
    if (topology) setenv("TERSE_TOPOLOGY", topology, 1);
    if (segment) setenv("TERSE_SHM_SEGMENT", segment, 1);
    const int seg = !segment || strcmp(segment, "off") != 0;
    tr_before_init = set_host;
    tr_job job = {"tcp", n, 20000, 90, -1};
    tr_out *o = tr_run(&job, routed_body, h);
    for (int r = 0; r < n; r++) {
        cr_expect_eq((unsigned)o[r].u[4], (routed >> r) & 1u, "rank %d: provider %s", r, o[r].err);
        cr_expect_eq(o[r].hash[0], o[0].hash[0], "rank %d's int8 result differs from rank 0's", r);
        cr_expect_eq(o[r].hash[1], o[0].hash[1], "rank %d's broadcast differs", r);
        cr_expect_eq(o[r].hash[2], o[0].hash[2], "rank %d's powersgd result differs", r);
        cr_expect_eq(o[r].hash[3], o[0].hash[3], "rank %d's randk result differs", r);
        cr_expect_eq((unsigned)o[r].u[5], (hier >> r) & 1u, "rank %d: hierarchical %d", r,
                     (int)o[r].u[5]);
        cr_expect_eq((unsigned)o[r].u[6], seg ? (hier >> r) & 1u : 0u,
                     "rank %d: over the hosts' segments %d", r, (int)o[r].u[6]);
    }
    tr_release(o);
    unsetenv("TERSE_SHM_SEGMENT");
}

static void check_routed(const char *topology, int n, host_setup *h, unsigned routed,
                         unsigned hier) {
    check_routed_seg(topology, NULL, n, h, routed, hier);
}

Test(routed, two_hosts_of_two_shm_inside_net_between) {
    host_setup h = {.host = {"a", "a", "b", "b"}, .own_shm_rank = -1};
    check_routed(NULL, 4, &h, 0xf, 0xf);
}

Test(routed, two_hosts_of_two_without_the_segments) {
    /* TERSE_SHM_SEGMENT=off: the intra-host phases over libfabric's shm */
    host_setup h = {.host = {"a", "a", "b", "b"}, .own_shm_rank = -1};
    check_routed_seg(NULL, "off", 4, &h, 0xf, 0xf);
}

Test(routed, uneven_two_and_three_without_the_segments) {
    host_setup h = {.host = {"b", "a", "b", "a", "b"}, .own_shm_rank = -1};
    check_routed_seg(NULL, "off", 5, &h, 0x1f, 0x1f);
}

Test(routed, uneven_three_and_one) {
    /* rank 1 is alone on its host: the network only; hosts of unequal size
     * take the hierarchical all-reduce with one shard (a leader a host) */
    host_setup h = {.host = {"a", "b", "a", "a"}, .own_shm_rank = -1};
    check_routed(NULL, 4, &h, 0xd, 0xf);
}

Test(routed, uneven_two_and_three_interleaved) {
    /* two shards: local ranks 0 and 1 own them, host b's third rank none */
    host_setup h = {.host = {"b", "a", "b", "a", "b"}, .own_shm_rank = -1};
    check_routed(NULL, 5, &h, 0x1f, 0x1f);
}

Test(routed, one_rank_a_host_is_not_routed) {
    host_setup h = {.host = {"a", "b", "c"}, .own_shm_rank = -1};
    check_routed(NULL, 3, &h, 0, 0);
}

Test(routed, topology_flat_keeps_one_provider) {
    host_setup h = {.host = {"a", "a", "b", "b"}, .own_shm_rank = -1};
    check_routed("flat", 4, &h, 0, 0);
}

Test(routed, topology_hier_at_every_size_three_hosts_of_two) {
    host_setup h = {.host = {"a", "b", "c", "a", "b", "c"}, .own_shm_rank = -1};
    check_routed("hier", 6, &h, 0x3f, 0x3f);
}

/* Broadcast in host order: with the hosts interleaved (ranks 0 and 2 on
 * host a, 1 and 3 on b, as mpirun --map-by node deals them), every root's
 * buffer crosses between the hosts exactly once, small (binomial) or large
 * (chain) -- in rank order the chain crossed at every hop (3 times) -- and
 * arrives whole. u[0]: bytes this rank sent through the network endpoint
 * during the broadcasts; u[1]: their total size; u[2]: wrong buffers. */
#include "transport/fabric_impl.h"

static int bcast_order_body(terse_comm *c, tr_out *o, const void *arg) {
    (void)arg;
    const int r = terse_comm_rank(c), N = terse_comm_size(c);
    static const size_t sizes[] = {1000, 3u << 20};
    uint8_t *b = malloc(3u << 20);
    if (!b) return tr_fail(o, TERSE_ERR_NOMEM, "malloc");
    for (int root = 0; root < N; root++)
        for (size_t k = 0; k < 2; k++) {
            const size_t bytes = sizes[k];
            for (size_t i = 0; i < bytes; i++)
                b[i] = (uint8_t)(r == root ? i * 31 + 7 * (size_t)root + k : 0);
            TR_CALL(o, terse_barrier(c));
            const uint64_t before = c->fabric->bytes_sent;
            TR_CALL(o, terse_broadcast(c, b, bytes, root));
            o->u[0] += c->fabric->bytes_sent - before;
            o->u[1] += bytes;
            for (size_t i = 0; i < bytes; i++)
                if (b[i] != (uint8_t)(i * 31 + 7 * (size_t)root + k)) {
                    o->u[2]++;
                    break;
                }
        }
    free(b);
    return 0;
}

/* Run n ranks on the hosts of h over tcp, with the call checks' 64-byte
 * descriptors off (the byte-counting tests below would count them too). */
static tr_out *run_counting(host_setup *h, int n,
                            int (*body)(terse_comm *, tr_out *, const void *)) {
    setenv_size(n);
    setenv("TERSE_CHECK_CALLS", "off", 1);
    tr_before_init = set_host;
    tr_job job = {"tcp", n, 20000, 90, -1};
    tr_out *o = tr_run(&job, body, h);
    unsetenv("TERSE_CHECK_CALLS");
    return o;
}

static void check_bcast_order(uint64_t crossings) {
    host_setup h = {.host = {"a", "b", "a", "b"}, .own_shm_rank = -1};
    tr_out *o = run_counting(&h, 4, bcast_order_body);
    uint64_t net = 0;
    for (int r = 0; r < 4; r++) {
        cr_expect_eq(o[r].u[2], 0, "rank %d: %llu broadcasts arrived wrong", r,
                     (unsigned long long)o[r].u[2]);
        net += o[r].u[0];
    }
    cr_expect_eq(net, crossings * o[0].u[1],
                 "the broadcasts sent %llu bytes between the hosts, for %llu bytes "
                 "broadcast (want %llu times that)",
                 (unsigned long long)net,
                 (unsigned long long)o[0].u[1], (unsigned long long)crossings);
    tr_release(o);
}

Test(routed, broadcast_crosses_between_hosts_once_whatever_the_placement) {
    check_bcast_order(1);
}

/* 6 ranks on hosts a b a b a a (4 + 2, interleaved). The all-gather
 * is hierarchical although the hosts differ in size (allgather.c,
 * hier_gather): each block crosses to the other host once, N blocks in all,
 * where a ring in host order (0 2 4 5 1 3, crossing at 2 of its 6 hops)
 * would carry 2 hops' worth, N - 1 blocks each; the 16-byte size records
 * still go round that ring. The dense all-reduce is hierarchical although the
 * hosts differ in size (2 shards, owned by local ranks 0 and 1 of each
 * host): each host's sum crosses once each way, 2 x n floats in all --
 * against 2 hops' worth of a ring in host order (2 x 2 (N-1)/N n) and 4 in
 * rank order. The results are exact. u[0], u[1]: network bytes this rank
 * sent in the all-reduce and the all-gather; u[2]: wrong results; u[3]:
 * the all-reduce's path is dense-hier. */
#define RING_N ((size_t)6 * 196608) /* floats: 6 equal segments */
#define RING_B 300000u              /* all-gather block bytes */

static int ring_order_body(terse_comm *c, tr_out *o, const void *arg) {
    (void)arg;
    const int r = terse_comm_rank(c), N = terse_comm_size(c);
    float *x = malloc(RING_N * sizeof *x);
    uint8_t *all = malloc((size_t)N * RING_B), *mine = malloc(RING_B);
    if (!x || !all || !mine) return tr_fail(o, TERSE_ERR_NOMEM, "malloc");
    for (size_t i = 0; i < RING_N; i++) x[i] = (float)((int)(i % 977) + 3 * r);
    o->u[3] = strncmp(terse_allreduce_algorithm(c, NULL, RING_N), "dense-hier", 10) == 0;
    TR_CALL(o, terse_barrier(c));
    uint64_t before = c->fabric->bytes_sent;
    TR_CALL(o, terse_allreduce(c, x, RING_N, NULL, TERSE_OP_SUM));
    o->u[0] = c->fabric->bytes_sent - before;
    for (size_t i = 0; i < RING_N; i++)
        if (x[i] != (float)(N * (int)(i % 977) + 3 * N * (N - 1) / 2)) {
            o->u[2]++;
            break;
        }
    for (size_t i = 0; i < RING_B; i++) mine[i] = (uint8_t)(i * 13 + (size_t)r);
    TR_CALL(o, terse_barrier(c));
    before = c->fabric->bytes_sent;
    TR_CALL(o, terse_allgather(c, mine, RING_B, all, (size_t)N * RING_B, NULL));
    o->u[1] = c->fabric->bytes_sent - before;
    for (int q = 0; q < N; q++)
        for (size_t i = 0; i < RING_B; i++)
            if (all[(size_t)q * RING_B + i] != (uint8_t)(i * 13 + (size_t)q)) {
                o->u[2]++;
                q = N;
                break;
            }
    free(x), free(all), free(mine);
    return 0;
}

Test(routed, uneven_interleaved_hosts_cross_once_per_host_allgather_and_allreduce) {
    host_setup h = {.host = {"a", "b", "a", "b", "a", "a"}, .own_shm_rank = -1};
    tr_out *o = run_counting(&h, 6, ring_order_body);
    const uint64_t N = 6, hops = 2;
    uint64_t ar = 0, ag = 0;
    for (int r = 0; r < 6; r++) {
        cr_expect_eq(o[r].u[2], 0, "rank %d: a wrong result", r);
        cr_expect_eq(o[r].u[3], 1, "rank %d: the all-reduce is not dense-hier", r);
        ar += o[r].u[0], ag += o[r].u[1];
    }
    const uint64_t want_ar = 2 * RING_N * 4; /* H (H - 1) host sums of n floats */
    /* blocks: each crosses to the other host once (hierarchical); size
     * records: the ring in host order */
    const uint64_t want_ag = N * (uint64_t)RING_B + hops * (N - 1) * 16;
    cr_expect_eq(ar, want_ar, "the all-reduce sent %llu bytes between hosts, want %llu (a ring "
                              "in host order: %llu)", (unsigned long long)ar,
                 (unsigned long long)want_ar,
                 (unsigned long long)(hops * 2 * (N - 1) * (RING_N / N) * 4));
    cr_expect_eq(ag, want_ag, "the all-gather sent %llu bytes between hosts, want %llu (a ring "
                              "in host order: %llu)", (unsigned long long)ag,
                 (unsigned long long)want_ag,
                 (unsigned long long)(hops * (N - 1) * (RING_B + 16)));
    tr_release(o);
}

/* The hierarchical all-gather (allgather.c, hier_gather): 2 hosts of 2,
 * interleaved (a b a b). Every block crosses to the other host once: the
 * network endpoints carry the 4 blocks (and the ring in host order that
 * exchanges the 16-byte size records: 2 crossing hops of 3 records),
 * where a ring in host order would carry 6 blocks. Blocks of unequal size
 * and an empty one arrive whole. u[0]: network bytes of the even-sized
 * gather; u[2]: wrong blocks. */
static int hier_gather_body(terse_comm *c, tr_out *o, const void *arg) {
    (void)arg;
    const int r = terse_comm_rank(c), N = terse_comm_size(c);
    size_t sizes[TR_MAX_RANKS];
    uint8_t *all = malloc((size_t)N * (RING_B + 64)), *mine = malloc(RING_B + 64);
    if (!all || !mine) return tr_fail(o, TERSE_ERR_NOMEM, "malloc");
    for (int round = 0; round < 2; round++) {
        for (int q = 0; q < N; q++)
            sizes[q] = round == 0 ? RING_B : (q == 1 ? 0 : RING_B / 3 + (size_t)q * 7);
        for (size_t i = 0; i < sizes[r]; i++) mine[i] = (uint8_t)(i * 11 + (size_t)r + 40 * round);
        TR_CALL(o, terse_barrier(c));
        const uint64_t before = c->fabric->bytes_sent;
        size_t counts[TR_MAX_RANKS];
        TR_CALL(o, terse_allgather(c, mine, sizes[r], all, (size_t)N * (RING_B + 64), counts));
        if (round == 0) o->u[0] = c->fabric->bytes_sent - before;
        size_t at = 0;
        for (int q = 0; q < N; q++) {
            if (counts[q] != sizes[q]) o->u[2]++;
            for (size_t i = 0; i < sizes[q]; i++)
                if (all[at + i] != (uint8_t)(i * 11 + (size_t)q + 40 * round)) {
                    o->u[2]++;
                    break;
                }
            at += sizes[q];
        }
    }
    free(all), free(mine);
    return 0;
}

Test(routed, allgather_between_hosts_sends_each_block_across_once) {
    host_setup h = {.host = {"a", "b", "a", "b"}, .own_shm_rank = -1};
    tr_out *o = run_counting(&h, 4, hier_gather_body);
    uint64_t net = 0;
    for (int r = 0; r < 4; r++) {
        cr_expect_eq(o[r].u[2], 0, "rank %d: %llu wrong blocks or counts", r,
                     (unsigned long long)o[r].u[2]);
        net += o[r].u[0];
    }
    const uint64_t want = 4 * (uint64_t)RING_B + 2 * 3 * 16;
    cr_expect_eq(net, want, "the all-gather sent %llu bytes between hosts, want %llu (a ring in "
                            "host order: %llu)", (unsigned long long)net,
                 (unsigned long long)want, (unsigned long long)(2 * 3 * (RING_B + 16)));
    tr_release(o);
}

/* Rank 3 dies mid-loop: rank 2 reaches it through shm, ranks 0 and 1
 * through the network; every survivor fails naming it. */
static int routed_kill_body(terse_comm *c, tr_out *o, const void *arg) {
    (void)arg;
    const size_t n = 1 << 18;
    float *y = calloc(n, sizeof(float));
    TR_CALL(o, terse_allreduce(c, y, n, NULL, TERSE_OP_SUM));
    tr_say_ready(o);
    tr_wait_all_ready(c, o);
    tr_last_rank_dies_in(c, 100);
    if (tr_allreduce_until_failure(c, o, y, n, NULL, TERSE_OP_SUM, 100000, NULL)) {
        free(y);
        return 0;
    }
    free(y);
    return tr_fail(o, TERSE_OK, "every all-reduce succeeded although a rank was killed");
}

Test(routed, a_killed_rank_is_named_by_survivors_on_both_endpoints) {
    host_setup h = {.host = {"a", "a", "b", "b"}, .own_shm_rank = -1};
    setenv_size(4);
    tr_before_init = set_host;
    const int timeout_ms = 4000;
    tr_job job = {"tcp", 4, timeout_ms, 60, 3};
    tr_out *o = tr_run(&job, routed_kill_body, &h);
    for (int r = 0; r < 3; r++) {
        terse_status s = (terse_status)o[r].u[0];
        cr_expect(s == TERSE_ERR_PEER_LOST || s == TERSE_ERR_TIMEOUT, "survivor %d got %s (%s)",
                  r, terse_status_name(s), o[r].err);
        cr_expect(strstr(o[r].err, "rank 3"), "survivor %d does not name rank 3: %s", r,
                  o[r].err);
    }
    tr_release(o);
}

/* Rank 2's network chunks carry altered MACs (a relay flipping bits on the
 * link between the hosts): its rail partner, rank 0, fails naming it; no
 * rank returns TERSE_OK with a wrong sum. u[0] status of the tampered call,
 * u[1] wrong elements after TERSE_OK, u[2] auth failures counted. */
static int routed_tamper_body(terse_comm *c, tr_out *o, const void *arg) {
    (void)arg;
    const int r = terse_comm_rank(c);
    const size_t n = 1 << 20;
    float *x = malloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++) x[i] = (float)(r + 1);
    TR_CALL(o, terse_allreduce(c, x, n, NULL, TERSE_OP_SUM));
    if (r == 2) terse__fabric_test_tamper(c->fabric, 1);
    for (size_t i = 0; i < n; i++) x[i] = (float)(r + 1);
    o->u[0] = (uint64_t)terse_allreduce(c, x, n, NULL, TERSE_OP_SUM);
    snprintf(o->err, sizeof o->err, "%s", terse_last_error());
    if (o->u[0] == TERSE_OK)
        for (size_t i = 0; i < n; i++) o->u[1] += x[i] != 10.0f;
    terse_comm_stats st = TERSE_COMM_STATS_INIT;
    TR_CALL(o, terse_comm_get_stats(c, &st));
    o->u[2] = st.auth_failures;
    free(x);
    return 0;
}

Test(routed, an_altered_chunk_between_hosts_is_refused_naming_its_sender) {
    host_setup h = {.host = {"a", "a", "b", "b"}, .own_shm_rank = -1};
    setenv_size(4);
    unsetenv("TERSE_WIRE");
    tr_before_init = set_host;
    tr_job job = {"tcp", 4, 2000, 60, -1};
    tr_out *o = tr_run(&job, routed_tamper_body, &h);
    cr_expect_eq(o[0].u[0], TERSE_ERR_AUTH, "rank 0 returned %s: %s",
                 terse_status_name((terse_status)o[0].u[0]), o[0].err);
    cr_expect(strstr(o[0].err, "rank 2"), "rank 0 does not name rank 2: %s", o[0].err);
    cr_expect_gt(o[0].u[2], 0, "no authentication failure counted on rank 0");
    for (int r = 0; r < 4; r++)
        cr_expect_eq(o[r].u[1], 0, "rank %d: %llu wrong elements with TERSE_OK", r,
                     (unsigned long long)o[r].u[1]);
    tr_release(o);
}

/* Rank 3 stops (SIGSTOP) mid-loop: nothing closes, so only timeouts can
 * tell. Every survivor's call fails (TIMEOUT, or PEER_LOST once another
 * survivor left), none hangs, and the first to time out -- rank 2, its
 * shm peer, or a rank waiting on it across hosts -- names rank 3. Rank 0
 * kills the stopped rank once it has failed (its pid in u[7]). */
static int routed_stop_body(terse_comm *c, tr_out *o, const void *arg) {
    (void)arg;
    const int r = terse_comm_rank(c);
    const size_t n = 1 << 18;
    float *y = calloc(n, sizeof(float));
    o->u[7] = (uint64_t)getpid();
    TR_CALL(o, terse_allreduce(c, y, n, NULL, TERSE_OP_SUM));
    tr_say_ready(o);
    tr_wait_all_ready(c, o);
    if (r == 3) {
        terse_allreduce(c, y, n, NULL, TERSE_OP_SUM);
        raise(SIGSTOP); /* killed by rank 0 below */
    }
    int failed = tr_allreduce_until_failure(c, o, y, n, NULL, TERSE_OP_SUM, 100000, NULL);
    free(y);
    if (r == 0) {
        tr_out *all = o - r;
        kill((pid_t)all[3].u[7], SIGKILL);
    }
    return failed ? 0 : tr_fail(o, TERSE_OK, "every all-reduce succeeded with a rank stopped");
}

Test(routed, a_stopped_rank_fails_every_survivor_by_timeout_never_a_hang) {
    host_setup h = {.host = {"a", "a", "b", "b"}, .own_shm_rank = -1};
    setenv_size(4);
    tr_before_init = set_host;
    tr_job job = {"tcp", 4, 3000, 60, 3};
    tr_out *o = tr_run(&job, routed_stop_body, &h);
    int named = 0;
    for (int r = 0; r < 3; r++) {
        terse_status s = (terse_status)o[r].u[0];
        cr_expect(s == TERSE_ERR_TIMEOUT || s == TERSE_ERR_PEER_LOST, "survivor %d got %s (%s)",
                  r, terse_status_name(s), o[r].err);
        named += strstr(o[r].err, "rank 3") != NULL;
    }
    cr_expect_gt(named, 0, "no survivor names rank 3: %s | %s | %s", o[0].err, o[1].err,
                 o[2].err);
    tr_release(o);
}

/* Rank 3 passes another size (issue 31's call descriptor, over the routed
 * pairs; the data waits for the descriptor since some peers are on shm):
 * every rank fails with TERSE_ERR_SHAPE, none hangs or returns TERSE_OK. */
static int routed_mismatch_body(terse_comm *c, tr_out *o, const void *arg) {
    (void)arg;
    const int r = terse_comm_rank(c);
    const size_t n = r == 3 ? 300001 : 250000;
    float *y = calloc(n, sizeof(float));
    /* every rank past init: a rank that fails fast and leaves must not
     * fail another's init */
    tr_say_ready(o);
    tr_wait_all_ready(c, o);
    o->u[0] = (uint64_t)terse_allreduce(c, y, n, NULL, TERSE_OP_SUM);
    snprintf(o->err, sizeof o->err, "%s", terse_last_error());
    free(y);
    return 0;
}

Test(routed, ranks_passing_different_sizes_all_fail_with_shape) {
    host_setup h = {.host = {"a", "a", "b", "b"}, .own_shm_rank = -1};
    setenv_size(4);
    tr_before_init = set_host;
    tr_job job = {"tcp", 4, 20000, 60, -1};
    tr_out *o = tr_run(&job, routed_mismatch_body, &h);
    for (int r = 0; r < 4; r++)
        cr_expect_eq(o[r].u[0], TERSE_ERR_SHAPE, "rank %d: %s: %s", r,
                     terse_status_name((terse_status)o[r].u[0]), o[r].err);
    tr_release(o);
}

/* ---- the hierarchical all-reduce over each host's shared segment ---- */

#include <pthread.h>
#include <signal.h>

/* The bodies' argument: the hosts first (set_host reads it), then theirs. */
typedef struct {
    host_setup h;
    int want_seg, sig;
} hs_arg;

/* A float in [-1, 1) from (salt, rank, i): every rank can form any rank's. */
static float hs_input(size_t salt, int rank, size_t i) {
    uint64_t z = (salt * 0x9E3779B97F4A7C15ull) ^ ((uint64_t)rank << 40) ^ i;
    z ^= z >> 33, z *= 0xff51afd7ed558ccdull, z ^= z >> 33, z *= 0xc4ceb9fe1a85ec53ull;
    z ^= z >> 33;
    return (float)(z >> 40) / (float)(1u << 23) - 1.0f;
}

/* Sizes across the 4 KiB steps (1024 floats) of the first job, under
 * TERSE_TOPOLOGY=hier (the hierarchical path at every size). */
static const size_t hs_sizes[] = {1, 5, 1023, 1024, 1025, 2049, 3 * 1024 + 7, 100003,
                                  2 * 262144 + 17}; /* the last: 3 default steps */
#define HS_N (sizeof hs_sizes / sizeof hs_sizes[0])
#define HS_MAX (2u * 262144u + 17u)

/* For each size and op: u[k] 1 if the result is, bit for bit, the sum over
 * hosts in host order of each host's sum in local-rank order (then divided
 * by N for the average), hash[k] its hash; u[40] 1 if every call named the
 * path the test expects (arg: 1 dense-hier-seg, 0 dense-hier). */
static int hs_sums_body(terse_comm *c, tr_out *o, const void *arg) {
    const int want_seg = ((const hs_arg *)arg)->want_seg;
    const int N = terse_comm_size(c), r = terse_comm_rank(c), H = c->nhosts;
    float *y = malloc(HS_MAX * sizeof(float)), *want = malloc(HS_MAX * sizeof(float)),
          *hsum = malloc(HS_MAX * sizeof(float));
    if (!y || !want || !hsum) return tr_fail(o, TERSE_ERR_NOMEM, "malloc");
    int named = 1;
    for (size_t k = 0; k < HS_N; k++)
        for (int op = TERSE_OP_SUM; op <= TERSE_OP_AVG; op++) {
            const size_t n = hs_sizes[k], slot = 2 * k + (size_t)op;
            named = named && !strcmp(terse_allreduce_algorithm(c, NULL, n),
                                     want_seg ? "dense-hier-seg" : "dense-hier");
            for (size_t i = 0; i < n; i++) y[i] = hs_input(slot, r, i);
            TR_CALL(o, terse_allreduce(c, y, n, NULL, (terse_op)op));
            for (int g = 0; g < H; g++) {
                int first = 1;
                for (int q = 0; q < N; q++) { /* host g's ranks in rank (= local) order */
                    if (c->host_of[q] != g) continue;
                    for (size_t i = 0; i < n; i++)
                        hsum[i] = first ? hs_input(slot, q, i) : hsum[i] + hs_input(slot, q, i);
                    first = 0;
                }
                for (size_t i = 0; i < n; i++) want[i] = g == 0 ? hsum[i] : want[i] + hsum[i];
            }
            if (op == TERSE_OP_AVG)
                for (size_t i = 0; i < n; i++) want[i] /= (float)N;
            o->u[slot] = memcmp(y, want, n * sizeof(float)) == 0;
            o->hash[slot] = tr_hash(y, n * sizeof(float));
        }
    o->u[40] = (uint64_t)named;
    free(y), free(want), free(hsum);
    return 0;
}

static tr_out *hs_run_sums(host_setup *h, int n, const char *segment, const char *step,
                           int want_seg) {
    setenv_size(n);
    setenv("TERSE_TOPOLOGY", "hier", 1);
    setenv("TERSE_SHM_SEGMENT", segment, 1);
    if (step) setenv("TERSE_SEGMENT_STEP_BYTES", step, 1);
    tr_before_init = set_host;
    tr_job job = {"tcp", n, 20000, 90, -1};
    hs_arg a = {*h, want_seg, 0};
    tr_out *o = tr_run(&job, hs_sums_body, &a);
    unsetenv("TERSE_TOPOLOGY");
    unsetenv("TERSE_SHM_SEGMENT");
    unsetenv("TERSE_SEGMENT_STEP_BYTES");
    return o;
}

/* Hosts of 3 and 2 ranks, interleaved (2 shards: host a's third rank owns
 * none): exact in host-then-local order, the same bits on every rank and
 * the same as the path over libfabric's shm; 4 KiB steps and the default. */
Test(hier_seg, sums_in_host_then_local_order_and_the_bits_of_the_shm_path) {
    host_setup h = {.host = {"a", "b", "a", "a", "b"}, .own_shm_rank = -1};
    tr_out *seg = hs_run_sums(&h, 5, "auto", "4096", 1);
    tr_out *big = hs_run_sums(&h, 5, "auto", NULL, 1);
    tr_out *off = hs_run_sums(&h, 5, "off", NULL, 0);
    for (int r = 0; r < 5; r++) {
        cr_expect_eq(seg[r].u[40], 1, "rank %d: not every call took dense-hier-seg", r);
        cr_expect_eq(off[r].u[40], 1, "rank %d: off did not take dense-hier", r);
        for (size_t k = 0; k < 2 * HS_N; k++) {
            cr_expect_eq(seg[r].u[k], 1, "rank %d: n = %zu %s (4 KiB steps) is not the sum in "
                         "host-then-local order", r, hs_sizes[k / 2], k % 2 ? "avg" : "sum");
            cr_expect_eq(big[r].u[k], 1, "rank %d: n = %zu %s (default steps) differs", r,
                         hs_sizes[k / 2], k % 2 ? "avg" : "sum");
            cr_expect_eq(seg[r].hash[k], seg[0].hash[k], "rank %d: n = %zu: other bits than "
                         "rank 0's", r, hs_sizes[k / 2]);
            cr_expect_eq(off[r].hash[k], seg[r].hash[k], "rank %d: n = %zu: the shm path's bits "
                         "differ from the segment's", r, hs_sizes[k / 2]);
        }
    }
    tr_release(seg);
    tr_release(big);
    tr_release(off);
}

/* Hosts of 3 and 1 (a leader a host; the lone rank has no segment). */
Test(hier_seg, a_host_of_one_rank_beside_a_segment) {
    host_setup h = {.host = {"a", "b", "a", "a"}, .own_shm_rank = -1};
    tr_out *o = hs_run_sums(&h, 4, "auto", "4096", 1);
    for (int r = 0; r < 4; r++) {
        cr_expect_eq(o[r].u[40], 1, "rank %d: not every call took dense-hier-seg", r);
        for (size_t k = 0; k < 2 * HS_N; k++) {
            cr_expect_eq(o[r].u[k], 1, "rank %d: n = %zu %s differs", r, hs_sizes[k / 2],
                         k % 2 ? "avg" : "sum");
            cr_expect_eq(o[r].hash[k], o[0].hash[k], "rank %d: other bits than rank 0's", r);
        }
    }
    tr_release(o);
}

/* Rank 3 (host b, with rank 2) stops or dies on its own 100 ms into a loop
 * of 4 MiB all-reduces (4 segment steps each): every survivor fails
 * within the timeout and a little; rank 2, its segment partner, names it
 * (the timeout, or the store's loss notice); so does every survivor when
 * it is killed. u[0] status, val[0] the failing call's time. The last
 * survivor to fail kills a stopped rank. */
#define HS_TIMEOUT_MS 3000

static void *hs_stopper(void *p) {
    usleep(100 * 1000);
    raise(((const hs_arg *)p)->sig);
    return NULL;
}

static int hs_stop_body(terse_comm *c, tr_out *o, const void *arg) {
    const int sig = ((const hs_arg *)arg)->sig;
    const int r = terse_comm_rank(c);
    tr_out *all = o - r;
    const size_t n = 1u << 20;
    float *y = calloc(n, sizeof(float));
    TR_CALL(o, terse_allreduce(c, y, n, NULL, TERSE_OP_SUM));
    o->hash[1] = !strcmp(terse_allreduce_algorithm(c, NULL, n), "dense-hier-seg");
    if (r == 3) __atomic_store_n(&o->u[50], (uint64_t)getpid(), __ATOMIC_RELEASE);
    tr_say_ready(o);
    tr_wait_all_ready(c, o);
    if (r == 3) {
        pthread_t t;
        pthread_create(&t, NULL, hs_stopper, (void *)arg);
        pthread_detach(t);
    }
    int failed = tr_allreduce_until_failure(c, o, y, n, NULL, TERSE_OP_SUM, 100000, NULL);
    free(y);
    uint64_t k = __atomic_add_fetch(&all[3].u[51], 1, __ATOMIC_ACQ_REL);
    const double until = tr_now_ms() + 60000;
    while (__atomic_load_n(&all[3].u[51], __ATOMIC_ACQUIRE) < 3 && tr_now_ms() < until)
        usleep(1000);
    if (sig == SIGSTOP && k == 3)
        kill((pid_t)__atomic_load_n(&all[3].u[50], __ATOMIC_ACQUIRE), SIGKILL);
    return failed ? 0 : tr_fail(o, TERSE_OK, "100000 all-reduces succeeded with a rank stopped");
}

static void hs_check_stop(int sig) {
    static hs_arg a = {.h = {.host = {"a", "a", "b", "b"}, .own_shm_rank = -1}};
    a.sig = sig;
    setenv_size(4);
    tr_before_init = set_host;
    tr_job job = {"tcp", 4, HS_TIMEOUT_MS, 60, 3};
    tr_out *o = tr_run(&job, hs_stop_body, &a);
    for (int r = 0; r < 3; r++) {
        terse_status s = (terse_status)o[r].u[0];
        cr_expect_eq(o[r].hash[1], 1, "survivor %d: the all-reduce is not dense-hier-seg", r);
        cr_expect(s == TERSE_ERR_TIMEOUT || s == TERSE_ERR_PEER_LOST, "survivor %d got %s (%s)",
                  r, terse_status_name(s), o[r].err);
        cr_expect_leq(o[r].val[0], HS_TIMEOUT_MS + 2000, "survivor %d took %.0f ms", r,
                      o[r].val[0]);
        if (r == 2 || sig == SIGKILL)
            cr_expect(strstr(o[r].err, "rank 3"), "survivor %d does not name rank 3: %s", r,
                      o[r].err);
        fprintf(stderr, "hier-seg %s: survivor %d: %s after %.0f ms: %s\n", strsignal(sig), r,
                terse_status_name(s), o[r].val[0], o[r].err);
    }
    tr_release(o);
}

Test(hier_seg, a_killed_local_rank_is_named_by_every_survivor) { hs_check_stop(SIGKILL); }
Test(hier_seg, a_local_rank_stopped_mid_step_is_named_by_its_host) { hs_check_stop(SIGSTOP); }

/* TERSE_CHECK_CALLS=off (no call descriptors): rank 3 passes another count;
 * its host partner fails with TERSE_ERR_SHAPE from the segment's step, and
 * no rank returns TERSE_OK. */
static int hs_odd_body(terse_comm *c, tr_out *o, const void *arg) {
    (void)arg;
    const char *odd = getenv("HS_ODD"); /* set_host: host_setup's var */
    const size_t n = odd && !strcmp(odd, "1") ? (3u << 16) + 5 : 3u << 16;
    float *y = calloc(n, sizeof(float));
    tr_say_ready(o);
    tr_wait_all_ready(c, o);
    o->u[0] = (uint64_t)terse_allreduce(c, y, n, NULL, TERSE_OP_SUM);
    snprintf(o->err, sizeof o->err, "%s", terse_last_error());
    free(y);
    return 0;
}

/* 2 + 2 hosts without call descriptors, HS_ODD per rank (odd: "1"); every
 * rank must fail. */
static tr_out *hs_run_odd(const char *const odd[4], const char *what) {
    host_setup h = {.host = {"a", "a", "b", "b"}, .var = "HS_ODD", .own_shm_rank = -1};
    for (int r = 0; r < 4; r++) h.val[r] = odd[r];
    setenv_size(4);
    setenv("TERSE_CHECK_CALLS", "off", 1);
    tr_before_init = set_host;
    tr_job job = {"tcp", 4, 3000, 60, -1};
    tr_out *o = tr_run(&job, hs_odd_body, &h);
    unsetenv("TERSE_CHECK_CALLS");
    for (int r = 0; r < 4; r++) {
        cr_expect_neq(o[r].u[0], TERSE_OK, "rank %d returned TERSE_OK from calls that differ", r);
        fprintf(stderr, "hier-seg %s: rank %d: %s\n", what, r, o[r].err);
    }
    return o;
}

Test(hier_seg, calls_that_differ_fail_without_call_descriptors) {
    static const char *const odd[4] = {"0", "0", "0", "1"};
    tr_out *o = hs_run_odd(odd, "odd call");
    cr_expect(o[2].u[0] == TERSE_ERR_SHAPE || o[3].u[0] == TERSE_ERR_SHAPE,
              "neither rank of host b names the difference: %s | %s", o[2].err, o[3].err);
    tr_release(o);
}

/* The barrier over each host's segment and among the hosts' first ranks:
 * 20 barriers, before each a rank-dependent nap (a different rank is the
 * last to arrive each time); no rank may leave a barrier before the last
 * one entered it. f[2i], f[2i + 1]: this rank's entry and exit of barrier i
 * (ms on CLOCK_MONOTONIC, shared by the processes), minus a base. */
#define HB_ROUNDS 20

static int hb_body(terse_comm *c, tr_out *o, const void *arg) {
    (void)arg;
    const int r = terse_comm_rank(c), N = terse_comm_size(c);
    TR_CALL(o, terse_barrier(c));
    o->u[0] = (uint64_t)c->lseg_on;
    const double base = tr_now_ms();
    for (int i = 0; i < HB_ROUNDS; i++) {
        if ((i + r) % N == 0) usleep(20 * 1000); /* the last to arrive */
        o->f[2 * i] = (float)(tr_now_ms() - base);
        TR_CALL(o, terse_barrier(c));
        o->f[2 * i + 1] = (float)(tr_now_ms() - base);
    }
    o->val[0] = base;
    return 0;
}

static void hb_check(host_setup *h, int n) {
    setenv_size(n);
    tr_before_init = set_host;
    tr_job job = {"tcp", n, 20000, 60, -1};
    tr_out *o = tr_run(&job, hb_body, h);
    for (int r = 0; r < n; r++) /* the barrier over the hosts' segments ran */
        cr_expect_eq(o[r].u[0], 1, "rank %d: the hosts' segments are not in use", r);
    for (int i = 0; i < HB_ROUNDS; i++) {
        double last_in = -1e18, first_out = 1e18;
        for (int r = 0; r < n; r++) {
            double in = o[r].val[0] + o[r].f[2 * i], out = o[r].val[0] + o[r].f[2 * i + 1];
            if (in > last_in) last_in = in;
            if (out < first_out) first_out = out;
        }
        /* float ms offsets from each rank's own base: well under 0.1 ms */
        cr_expect_geq(first_out + 0.1, last_in, "barrier %d: a rank left %.3f ms before the last "
                      "one entered", i, last_in - first_out);
    }
    tr_release(o);
}

Test(hier_seg, barrier_nobody_leaves_before_everyone_entered) {
    host_setup a = {.host = {"a", "a", "b", "b"}, .own_shm_rank = -1};
    hb_check(&a, 4);
    host_setup b = {.host = {"a", "b", "a", "c", "a"}, .own_shm_rank = -1}; /* 3 + 1 + 1 */
    hb_check(&b, 5);
}

/* Rank 3 stops before a barrier: every survivor's barrier fails (timeout,
 * or the store's word once another survivor failed) and its host partner,
 * rank 2, names it. */
static int hb_stop_body(terse_comm *c, tr_out *o, const void *arg) {
    (void)arg;
    const int r = terse_comm_rank(c);
    tr_out *all = o - r;
    TR_CALL(o, terse_barrier(c));
    if (r == 3) __atomic_store_n(&o->u[50], (uint64_t)getpid(), __ATOMIC_RELEASE);
    tr_say_ready(o);
    tr_wait_all_ready(c, o);
    if (r == 3) raise(SIGSTOP);
    const double t0 = tr_now_ms();
    terse_status s = terse_barrier(c);
    o->val[0] = tr_now_ms() - t0;
    o->u[0] = (uint64_t)s;
    snprintf(o->err, sizeof o->err, "%s", terse_last_error());
    uint64_t k = __atomic_add_fetch(&all[3].u[51], 1, __ATOMIC_ACQ_REL);
    const double until = tr_now_ms() + 60000;
    while (__atomic_load_n(&all[3].u[51], __ATOMIC_ACQUIRE) < 3 && tr_now_ms() < until)
        usleep(1000);
    if (k == 3) kill((pid_t)__atomic_load_n(&all[3].u[50], __ATOMIC_ACQUIRE), SIGKILL);
    return 0;
}

Test(hier_seg, a_rank_stopped_before_a_barrier_fails_every_survivor) {
    host_setup h = {.host = {"a", "a", "b", "b"}, .own_shm_rank = -1};
    setenv_size(4);
    tr_before_init = set_host;
    tr_job job = {"tcp", 4, HS_TIMEOUT_MS, 60, 3};
    tr_out *o = tr_run(&job, hb_stop_body, &h);
    for (int r = 0; r < 3; r++) {
        terse_status s = (terse_status)o[r].u[0];
        cr_expect(s == TERSE_ERR_TIMEOUT || s == TERSE_ERR_PEER_LOST, "survivor %d got %s (%s)",
                  r, terse_status_name(s), o[r].err);
        cr_expect_leq(o[r].val[0], HS_TIMEOUT_MS + 2000, "survivor %d took %.0f ms", r,
                      o[r].val[0]);
        fprintf(stderr, "hier barrier, rank 3 stopped: survivor %d: %s after %.0f ms: %s\n", r,
                terse_status_name(s), o[r].val[0], o[r].err);
    }
    cr_expect(strstr(o[2].err, "rank 3"), "rank 2 does not name rank 3: %s", o[2].err);
    tr_release(o);
}

/* The same where each host agrees within itself but the hosts differ (host
 * b's ranks both pass the other count): the rail's messages differ in
 * length, which the transport refuses; no rank returns TERSE_OK. */
Test(hier_seg, hosts_that_differ_fail_without_call_descriptors) {
    static const char *const odd[4] = {"0", "0", "1", "1"};
    tr_release(hs_run_odd(odd, "hosts differ"));
}

/* The hierarchical all-gather on hosts of unequal size: 2 + 3 interleaved
 * (b a b a b): every block crosses to the other host once (5 blocks, and
 * the size records' ring in host order, 2 crossing hops of 4 records);
 * 3 + 2 + 1 (a b a c a b): blocks of unequal sizes and an empty one
 * arrive whole. */
Test(routed, allgather_on_hosts_of_unequal_size_sends_each_block_across_once) {
    host_setup h = {.host = {"b", "a", "b", "a", "b"}, .own_shm_rank = -1};
    tr_out *o = run_counting(&h, 5, hier_gather_body);
    uint64_t net = 0;
    for (int r = 0; r < 5; r++) {
        cr_expect_eq(o[r].u[2], 0, "rank %d: %llu wrong blocks or counts", r,
                     (unsigned long long)o[r].u[2]);
        net += o[r].u[0];
    }
    const uint64_t want = 5 * (uint64_t)RING_B + 2 * 4 * 16;
    cr_expect_eq(net, want, "the all-gather sent %llu bytes between hosts, want %llu (a ring in "
                            "host order: %llu)", (unsigned long long)net,
                 (unsigned long long)want, (unsigned long long)(2 * 4 * (RING_B + 16)));
    tr_release(o);
    host_setup t = {.host = {"a", "b", "a", "c", "a", "b"}, .own_shm_rank = -1};
    o = run_counting(&t, 6, hier_gather_body);
    net = 0;
    for (int r = 0; r < 6; r++) {
        cr_expect_eq(o[r].u[2], 0, "3 + 2 + 1: rank %d: %llu wrong blocks or counts", r,
                     (unsigned long long)o[r].u[2]);
        net += o[r].u[0];
    }
    /* each block to each of the 2 other hosts; the size records' ring in
     * host order crosses 3 times */
    const uint64_t want3 = 2 * 6 * (uint64_t)RING_B + 3 * 5 * 16;
    cr_expect_eq(net, want3, "3 + 2 + 1: the all-gather sent %llu bytes between hosts, want %llu",
                 (unsigned long long)net, (unsigned long long)want3);
    tr_release(o);
}

/* With call descriptors on, host b passes an average where host a passes a
 * sum (the same count): every host agrees within itself and the rail's
 * messages are of the same length, so only the descriptors can tell --
 * and no rank may return TERSE_OK before they did (a rank whose previous
 * rank agrees once could, when the data did not wait for the descriptor). */
static int hs_op_body(terse_comm *c, tr_out *o, const void *arg) {
    (void)arg;
    const char *odd = getenv("HS_ODD");
    const int avg = odd && !strcmp(odd, "1");
    const size_t n = 20000; /* one quick step: the data can be done before the descriptor */
    float *y = calloc(n, sizeof(float));
    o->u[1] = !strcmp(terse_allreduce_algorithm(c, NULL, n), "dense-hier-seg");
    tr_say_ready(o);
    tr_wait_all_ready(c, o);
    o->u[0] = (uint64_t)terse_allreduce(c, y, n, NULL, avg ? TERSE_OP_AVG : TERSE_OP_SUM);
    snprintf(o->err, sizeof o->err, "%s", terse_last_error());
    free(y);
    return 0;
}

Test(hier_seg, hosts_whose_ops_differ_all_fail_with_call_descriptors) {
    host_setup h = {.host = {"a", "a", "b", "b"},
                    .var = "HS_ODD",
                    .val = {"0", "0", "1", "1"},
                    .own_shm_rank = -1};
    setenv_size(4);
    tr_before_init = set_host;
    for (int k = 0; k < 5; k++) {
        tr_job job = {"tcp", 4, 5000, 60, -1};
        tr_out *o = tr_run(&job, hs_op_body, &h);
        for (int r = 0; r < 4; r++) {
            cr_expect_eq(o[r].u[1], 1, "rank %d: not dense-hier-seg", r);
            cr_expect_neq(o[r].u[0], TERSE_OK, "job %d: rank %d returned TERSE_OK although host "
                          "b averaged where host a summed", k, r);
        }
        tr_release(o);
    }
}
