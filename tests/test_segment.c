/* The host's shared segment (transport/segment.h) and the dense all-reduce
 * over it (algos/coll/seg_allreduce.c), over real rank processes on one
 * host: exact sums in rank order and the same bits on every rank, across
 * step boundaries and both parities; nothing through the transport; the
 * segment private (0600, this user) and unlinked once every rank attached;
 * a segment that is not the job's refused; TERSE_SHM_SEGMENT=off and its
 * disagreement; a rank killed or stopped inside the segment's steps named by
 * every survivor within the timeout. (tests/shm_faults runs kill and stop
 * trials on both the segment and libfabric's shm.) */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ranks.h"
#include "testutil.h"
#include "transport/segment.h"

#define TIMEOUT_MS 3000
#define SLACK_MS 1500

static void input(float *x, size_t n, int rank, size_t salt) {
    tu_fill_uniform(x, n, 7919 * salt + (uint64_t)rank, -1.0f, 1.0f);
}

/* A step of 4 KiB (1024 floats) in one job, the default in the other. */
static const size_t sizes[] = {1, 2, 5, 1023, 1024, 1025, 2048, 3 * 1024 + 7, 100003, 300001};
#define NSIZES (sizeof sizes / sizeof sizes[0])
#define MAXN 300001u

/* For each size and op: u[k] = 1 if the result equals the sum formed in rank
 * order (then divided by N for the average) bit for bit, hash[k] the
 * result's hash; u[60] the payload bytes sent, hash[60] 1 if every call
 * named dense-seg. */
static int sums_body(terse_comm *c, tr_out *o, const void *arg) {
    (void)arg;
    const int N = terse_comm_size(c), r = terse_comm_rank(c);
    float *y = malloc(MAXN * sizeof(float)), *x = malloc(MAXN * sizeof(float)),
          *want = malloc(MAXN * sizeof(float));
    terse_comm_reset_stats(c);
    int named = 1;
    for (size_t k = 0; k < NSIZES; k++)
        for (int op = TERSE_OP_SUM; op <= TERSE_OP_AVG; op++) {
            const size_t n = sizes[k], slot = 2 * k + (size_t)op;
            named = named && !strcmp(terse_allreduce_algorithm(c, NULL, n), "dense-seg");
            input(y, n, r, slot);
            TR_CALL(o, terse_allreduce(c, y, n, NULL, (terse_op)op));
            input(want, n, 0, slot);
            for (int q = 1; q < N; q++) {
                input(x, n, q, slot);
                for (size_t i = 0; i < n; i++) want[i] += x[i];
            }
            if (op == TERSE_OP_AVG)
                for (size_t i = 0; i < n; i++) want[i] /= (float)N;
            o->u[slot] = memcmp(y, want, n * sizeof(float)) == 0;
            o->hash[slot] = tr_hash(y, n * sizeof(float));
        }
    terse_comm_stats st = TERSE_COMM_STATS_INIT;
    TR_CALL(o, terse_comm_get_stats(c, &st));
    o->u[60] = st.payload_bytes_sent + st.payload_bytes_recv;
    o->hash[60] = (uint64_t)named;
    free(y);
    free(x);
    free(want);
    return 0;
}

static void check_sums(int N, const char *step) {
    if (step) setenv("TERSE_SEGMENT_STEP_BYTES", step, 1);
    tr_job job = {"shm", N, 10000, 60, -1};
    tr_out *o = tr_run(&job, sums_body, NULL);
    unsetenv("TERSE_SEGMENT_STEP_BYTES");
    for (int r = 0; r < N; r++) {
        cr_expect_eq(o[r].hash[60], 1, "N %d rank %d: not every call took dense-seg", N, r);
        cr_expect_eq(o[r].u[60], 0, "N %d rank %d: %llu payload bytes went through the transport",
                     N, r, (unsigned long long)o[r].u[60]);
        for (size_t k = 0; k < 2 * NSIZES; k++) {
            cr_expect_eq(o[r].u[k], 1, "N %d step %s rank %d: n = %zu %s differs from the sum in "
                         "rank order", N, step ? step : "default", r, sizes[k / 2],
                         k % 2 ? "avg" : "sum");
            cr_expect_eq(o[r].hash[k], o[0].hash[k], "N %d rank %d: n = %zu: other bits than "
                         "rank 0's", N, r, sizes[k / 2]);
        }
    }
    tr_release(o);
}

Test(segment, sums_in_rank_order_with_the_same_bits_on_every_rank) {
    check_sums(2, NULL);
    check_sums(3, "4096");
    check_sums(4, "4096");
}

/* What /proc/self/maps says of the segment: hash[0] 1 if one mapping of
 * /dev/shm/terse-seg-<32 hex> is there, marked deleted; u[1] its mode, u[2]
 * its owner (through /proc/self/map_files), u[3] 1 if the name no longer
 * opens. */
static int private_body(terse_comm *c, tr_out *o, const void *arg) {
    (void)arg;
    float y[64] = {0};
    TR_CALL(o, terse_allreduce(c, y, 64, NULL, TERSE_OP_SUM));
    FILE *f = fopen("/proc/self/maps", "r");
    char line[512];
    while (f && fgets(line, sizeof line, f)) {
        char *p = strstr(line, "/dev/shm/terse-seg-");
        if (!p) continue;
        size_t hex = strspn(p + 19, "0123456789abcdef");
        o->hash[0] = hex == 32 && strstr(p, "(deleted)") != NULL;
        char name[64];
        snprintf(name, sizeof name, "/terse-seg-%.32s", p + 19);
        int fd = shm_open(name, O_RDONLY, 0);
        o->u[3] = fd < 0;
        if (fd >= 0) close(fd);
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx", &lo, &hi) == 2) {
            char mf[128];
            snprintf(mf, sizeof mf, "/proc/self/map_files/%lx-%lx", lo, hi);
            struct stat sb;
            if (stat(mf, &sb) == 0) {
                o->u[1] = sb.st_mode & 07777;
                o->u[2] = sb.st_uid;
            } else {
                o->u[4] = 1; /* map_files needs CAP_SYS_ADMIN: not readable here */
            }
        }
        break;
    }
    if (f) fclose(f);
    return 0;
}

Test(segment, is_private_to_the_user_and_unlinked_once_every_rank_attached) {
    tr_job job = {"shm", 3, 10000, 30, -1};
    tr_out *o = tr_run(&job, private_body, NULL);
    for (int r = 0; r < 3; r++) {
        cr_expect_eq(o[r].hash[0], 1, "rank %d: no deleted /dev/shm/terse-seg-<32 hex> mapping",
                     r);
        if (o[r].u[4]) { /* attach_refuses_... checks the mode without privilege */
            cr_log_warn("rank %d: /proc/self/map_files unreadable without CAP_SYS_ADMIN: mode "
                        "and owner not read back", r);
        } else {
            cr_expect_eq(o[r].u[1], 0600, "rank %d: mode %llo", r, (unsigned long long)o[r].u[1]);
            cr_expect_eq(o[r].u[2], (uint64_t)geteuid(), "rank %d: owner %llu", r,
                         (unsigned long long)o[r].u[2]);
        }
        cr_expect_eq(o[r].u[3], 1, "rank %d: the name still opens after init", r);
    }
    tr_release(o);
}

/* In-process: what attach accepts and what it refuses. */
Test(segment, attach_refuses_what_is_not_the_jobs_segment) {
    umask(022);
    char name[TERSE__SEG_NAME];
    uint64_t cookie = 0;
    terse__seg *a = NULL, *b = NULL;
    cr_assert_eq(terse__seg_create(0, 3, 1024, name, &cookie, &a), TERSE_OK, "%s",
                 terse_last_error());
    cr_assert_eq(strlen(name), 43);
    {
        int fd0 = shm_open(name, O_RDONLY, 0);
        struct stat sb;
        cr_assert_geq(fd0, 0);
        cr_assert_eq(fstat(fd0, &sb), 0);
        close(fd0);
        cr_expect_eq(sb.st_mode & 07777, 0600, "mode %o under umask 022", sb.st_mode & 07777);
        cr_expect_eq(sb.st_uid, geteuid());
    }
    cr_expect_eq(terse__seg_attach(1, name, 3, 1024, cookie, &b), TERSE_OK, "%s",
                 terse_last_error());
    /* the same blocks seen from both mappings */
    terse__seg_in(a, 1, 2)[5] = 42.0f;
    cr_expect_eq(terse__seg_in(b, 1, 2)[5], 42.0f);
    terse__seg_close(b);
    cr_expect_eq(terse__seg_attach(1, name, 3, 1024, cookie ^ 1, &b), TERSE_ERR_TRANSPORT);
    cr_expect(strstr(terse_last_error(), "header differs"), "%s", terse_last_error());
    cr_expect_eq(terse__seg_attach(1, name, 4, 1024, cookie, &b), TERSE_ERR_TRANSPORT);
    cr_expect(strstr(terse_last_error(), "size"), "%s", terse_last_error());
    cr_expect_eq(terse__seg_attach(1, "/etc-passwd-xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx", 3, 1024,
                                   cookie, &b), TERSE_ERR_INVALID);
    /* someone made it readable by others: refused */
    int fd = shm_open(name, O_RDWR, 0);
    cr_assert_geq(fd, 0);
    cr_assert_eq(fchmod(fd, 0644), 0);
    close(fd);
    cr_expect_eq(terse__seg_attach(1, name, 3, 1024, cookie, &b), TERSE_ERR_TRANSPORT);
    cr_expect(strstr(terse_last_error(), "0600"), "%s", terse_last_error());
    cr_expect_null(b);
    terse__seg_unlink(a);
    cr_expect_eq(terse__seg_attach(1, name, 3, 1024, cookie, &b), TERSE_ERR_TRANSPORT,
                 "an unlinked name opened");
    terse__seg_close(a);
}

/* u[0]: 1 if the algorithm is not dense-seg at 1 M floats; the sum is checked
 * against rank order as well (exact for N = 2 whatever the order). */
static int off_body(terse_comm *c, tr_out *o, const void *arg) {
    (void)arg;
    const size_t n = 1u << 20;
    float *y = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) y[i] = (float)(i % 1000) + (float)terse_comm_rank(c);
    TR_CALL(o, terse_allreduce(c, y, n, NULL, TERSE_OP_SUM));
    snprintf(o->err, sizeof o->err, "%s", terse_allreduce_algorithm(c, NULL, n));
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += y[i] != 2.0f * (float)(i % 1000) + 1.0f;
    o->u[0] = strcmp(o->err, "dense-seg") != 0;
    o->u[1] = bad;
    terse_comm_stats st = TERSE_COMM_STATS_INIT;
    TR_CALL(o, terse_comm_get_stats(c, &st));
    o->u[2] = st.payload_bytes_sent;
    free(y);
    return 0;
}

Test(segment, off_sends_through_the_transport) {
    setenv("TERSE_SHM_SEGMENT", "off", 1);
    tr_job job = {"shm", 2, 10000, 30, -1};
    tr_out *o = tr_run(&job, off_body, NULL);
    unsetenv("TERSE_SHM_SEGMENT");
    for (int r = 0; r < 2; r++) {
        cr_expect_eq(o[r].u[0], 1, "rank %d: still %s", r, o[r].err);
        cr_expect_eq(o[r].u[1], 0, "rank %d: %llu wrong sums", r, (unsigned long long)o[r].u[1]);
        cr_expect_gt(o[r].u[2], 0, "rank %d: nothing went through the transport", r);
    }
    tr_release(o);
}

static void seg_off_on_rank_1(int rank, const void *arg) {
    (void)arg;
    if (rank == 1) setenv("TERSE_SHM_SEGMENT", "off", 1);
    else unsetenv("TERSE_SHM_SEGMENT");
}

/* Ranks that disagree would run different all-reduces: init refuses, on
 * every rank, with a sentence naming the variable. Run in a child so that
 * tr_run's "every rank exited 0" does not stop the test. */
Test(segment, disagreement_fails_init_on_every_rank) {
    const int N = 2;
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", tr_free_port());
    tr_out *o = mmap(NULL, sizeof(tr_out) * N, PROT_READ | PROT_WRITE,
                     MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(o, MAP_FAILED);
    memset(o, 0, sizeof(tr_out) * N);
    pid_t pid[2];
    for (int r = 0; r < N; r++) {
        fflush(NULL);
        pid[r] = fork();
        cr_assert_geq(pid[r], 0);
        if (pid[r] == 0) {
            alarm(60);
            seg_off_on_rank_1(r, NULL);
            terse_comm_config cfg = TERSE_COMM_CONFIG_INIT;
            cfg.rank = r, cfg.nranks = N, cfg.addr = addr, cfg.provider = "shm";
            cfg.token = "segment-test-token-0123", cfg.timeout_ms = 10000;
            terse_comm *c = NULL;
            terse_status s = terse_comm_init(&cfg, &c);
            o[r].status = (int)s;
            snprintf(o[r].err, sizeof o[r].err, "%s", terse_last_error());
            if (c) terse_comm_free(c);
            _exit(0);
        }
    }
    for (int r = 0; r < N; r++) waitpid(pid[r], NULL, 0);
    for (int r = 0; r < N; r++) {
        cr_expect_eq(o[r].status, TERSE_ERR_INVALID, "rank %d: %s", r, o[r].err);
        cr_expect(strstr(o[r].err, "TERSE_SHM_SEGMENT"), "rank %d: %s", r, o[r].err);
    }
    munmap(o, sizeof(tr_out) * N);
}

/* The last rank stops (SIGSTOP) or dies (SIGKILL) on its own, 100 ms into a
 * loop of 4 MiB all-reduces (16 steps each); the survivors report u[0]
 * status, val[0] how long the failing call took, hash[1] 1 if the call took
 * the segment. The survivors wait for each other before they leave, and the
 * last one to fail kills a stopped victim (its pid in its output's u[50]),
 * so that the job ends with it SIGKILLed either way. */
typedef struct { int sig, between; } stop_arg;

static void *stopper(void *p) {
    const stop_arg *a = p;
    usleep(100 * 1000);
    raise(a->sig);
    return NULL;
}

static int stop_body(terse_comm *c, tr_out *o, const void *arg) {
    const stop_arg *a = arg;
    const int N = terse_comm_size(c), r = terse_comm_rank(c);
    tr_out *all = o - r; /* one shared array */
    const size_t n = 1u << 20;
    float *y = calloc(n, sizeof(float));
    TR_CALL(o, terse_allreduce(c, y, n, NULL, TERSE_OP_SUM));
    o->hash[1] = !strcmp(terse_allreduce_algorithm(c, NULL, n), "dense-seg");
    if (r == N - 1) __atomic_store_n(&o->u[50], (uint64_t)getpid(), __ATOMIC_RELEASE);
    tr_say_ready(o);
    tr_wait_all_ready(c, o);
    int failed;
    if (a->between && r == N - 1) { /* between two calls: the others wait for its descriptor */
        for (int i = 0; i < 20; i++) TR_CALL(o, terse_allreduce(c, y, n, NULL, TERSE_OP_SUM));
        raise(a->sig);
        failed = 0;
    } else {
        if (r == N - 1) {
            pthread_t t;
            pthread_create(&t, NULL, stopper, (void *)arg);
            pthread_detach(t);
        }
        failed = tr_allreduce_until_failure(c, o, y, n, NULL, TERSE_OP_SUM, 100000, NULL);
    }
    free(y);
    /* no survivor leaves (and is reported lost to the other) before both
     * have failed; then the last one kills a stopped victim */
    uint64_t k = __atomic_add_fetch(&all[N - 1].u[51], 1, __ATOMIC_ACQ_REL);
    const double until = tr_now_ms() + 60000;
    while (__atomic_load_n(&all[N - 1].u[51], __ATOMIC_ACQUIRE) < (uint64_t)(N - 1) &&
           tr_now_ms() < until)
        usleep(1000);
    if (a->sig == SIGSTOP && k == (uint64_t)(N - 1))
        kill((pid_t)__atomic_load_n(&all[N - 1].u[50], __ATOMIC_ACQUIRE), SIGKILL);
    if (failed) return 0;
    return tr_fail(o, TERSE_OK, "100000 all-reduces succeeded although a rank stopped");
}

static void check_stop(int sig, int between) {
    const int N = 3;
    stop_arg a = {sig, between};
    tr_job job = {"shm", N, TIMEOUT_MS, 40, N - 1};
    tr_out *o = tr_run(&job, stop_body, &a);
    int timeouts = 0;
    for (int r = 0; r < N - 1; r++) {
        terse_status s = (terse_status)o[r].u[0];
        cr_expect_eq(o[r].hash[1], 1, "survivor %d: the all-reduce did not take dense-seg", r);
        timeouts += s == TERSE_ERR_TIMEOUT;
        cr_expect(s == TERSE_ERR_PEER_LOST || s == TERSE_ERR_TIMEOUT, "survivor %d: %s (%s)",
                  r, terse_status_name(s), o[r].err);
        cr_expect(strstr(o[r].err, "rank 2"), "survivor %d does not name rank 2: %s", r,
                  o[r].err);
        cr_expect_leq(o[r].val[0], TIMEOUT_MS + plain_slack_ms(SLACK_MS),
                      "survivor %d took %.0f ms (timeout %d ms)", r, o[r].val[0], TIMEOUT_MS);
        fprintf(stderr, "%s: survivor %d: %s after %.0f ms: %s\n", strsignal(sig), r,
                terse_status_name(s), o[r].val[0], o[r].err);
    }
    /* a stopped rank is noticed by the timeout, by every survivor (neither
     * leaves, nor kills it, before both have failed) */
    if (sig == SIGSTOP) cr_expect_eq(timeouts, N - 1, "not every survivor timed out on it");
    tr_release(o);
}

Test(segment, a_killed_rank_is_named_by_every_survivor) { check_stop(SIGKILL, 0); }
Test(segment, a_stopped_rank_is_named_by_every_survivor_at_the_timeout) { check_stop(SIGSTOP, 0); }
/* Stopped between calls: rank 0 waits for its call descriptor, rank 1 for
 * rank 0's input -- and names the rank furthest behind too. */
Test(segment, a_rank_stopped_between_calls_is_named_by_every_survivor) {
    check_stop(SIGSTOP, 1);
}

/* With TERSE_CHECK_CALLS=off (no call descriptors) ranks that pass other
 * counts, or other ops, must still fail -- TERSE_ERR_SHAPE from the step
 * that shows it -- never return TERSE_OK with mixed data. u[0]: the status. */
typedef struct { size_t n_odd; int op_odd; } odd_call;

static int odd_body(terse_comm *c, tr_out *o, const void *arg) {
    const odd_call *a = arg;
    const int odd = terse_comm_rank(c) == 1;
    const size_t n = odd ? a->n_odd : 3u << 16; /* 3 steps of 256 KiB */
    float *y = calloc(n, sizeof(float));
    terse_status s = terse_allreduce(c, y, n, NULL,
                                     odd && a->op_odd ? TERSE_OP_AVG : TERSE_OP_SUM);
    o->u[0] = (uint64_t)s;
    snprintf(o->err, sizeof o->err, "%s", terse_last_error());
    free(y);
    return 0;
}

static void check_odd(size_t n_odd, int op_odd) {
    setenv("TERSE_CHECK_CALLS", "off", 1);
    odd_call a = {n_odd, op_odd};
    tr_job job = {"shm", 3, 3000, 30, -1};
    tr_out *o = tr_run(&job, odd_body, &a);
    unsetenv("TERSE_CHECK_CALLS");
    for (int r = 0; r < 3; r++) {
        cr_expect_neq(o[r].u[0], TERSE_OK, "rank %d returned TERSE_OK from calls that differ", r);
        cr_expect(o[r].u[0] == TERSE_ERR_SHAPE || o[r].u[0] == TERSE_ERR_TIMEOUT ||
                      o[r].u[0] == TERSE_ERR_PEER_LOST,
                  "rank %d: %s", r, o[r].err);
        fprintf(stderr, "odd call (n %zu, op %d): rank %d: %s\n", n_odd, op_odd, r, o[r].err);
    }
    int shape = 0;
    for (int r = 0; r < 3; r++) shape += o[r].u[0] == TERSE_ERR_SHAPE;
    cr_expect_geq(shape, 1, "no rank named the difference");
    tr_release(o);
}

Test(segment, calls_that_differ_fail_without_call_descriptors) {
    check_odd((3u << 16) + 5, 0); /* one more step, a short one */
    check_odd(2u << 16, 0);       /* one step fewer, all steps full */
    check_odd(3u << 16, 1);       /* the same count, average against sum */
}
