/* A local process that is not part of the job attacks a running 2-rank
 * job over tcp (libfabric's net, the default) or rxm (tcp;ofi_rxm)
 * (tests/fabric_intruder, its own libfabric endpoint of the same provider):
 *
 *  - flood: 100,000 messages of 4 KiB from an address that is not a rank.
 *    net stops reading such a connection; tcp;ofi_rxm queues them as
 *    unexpected, forever and without bound (measured before terse dropped
 *    them: 70,000 grew a rank by 1.1 GB, and the queue's length starved
 *    the rank until its peer timed out). Every allreduce during the flood
 *    must give the right sum.
 *  - impersonate: the intruder claims rank 1's port. rxm, and net on a rank
 *    that opened its connection to rank 1, take its messages for rank 1's
 *    and drop rank 1's connection; net on a rank that accepted it refuses
 *    the claim (see impersonate()). Every call gives the right sum or a
 *    specific error naming rank 1; never TERSE_OK with the intruder's
 *    values.
 *
 * Bounded in count and time; the intruder targets only this test's rank. */
#include <fcntl.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include "algos/comm/comm.h"
#include "endpoint_port.h"
#include "ranks.h"

#ifndef TERSE_INTRUDER_PATH
#error "TERSE_INTRUDER_PATH: the fabric_intruder binary"
#endif

#define N_FLOATS (1u << 16)
extern char **environ;

typedef struct attack {
    int impersonate;
    long count;
    long bytes;
    const char *tags;
    const char *seconds;  /* how long it sends (NULL: 8 s impersonating, else 20) */
    const char *provider; /* its libfabric provider: the job's */
    long conns;           /* connections it opens (0: one) */
} attack;

/* u[0]: first failing status; u[1]: OK calls with a wrong sum; u[2]: calls;
 * u[3]: intruder exit status ok; u[4]: messages it sent; u[5]: dropped
 * from addresses that are not ranks; u[6]: its sends refused; u[7]:
 * connections it opened; u[8]: its connection requests refused (net,
 * impersonating); u[10]: port; val[0], val[1]: RSS before and at most
 * during the attack (MB). */
static int attack_body(terse_comm *c, tr_out *o, const void *arg) {
    const attack *a = arg;
    const int r = terse_comm_rank(c);
    o->u[10] = (uint64_t)endpoint_port(c);
    if (!o->u[10]) return tr_fail(o, TERSE_ERR_INTERNAL, "endpoint_port");
    tr_out *all = o - r;
    float *x = calloc(N_FLOATS, sizeof(float));
    for (int k = 0; k < 20; k++) /* warm: buffers and pools at their working size */
        TR_CALL(o, terse_allreduce(c, x, N_FLOATS, NULL, TERSE_OP_SUM));
    TR_CALL(o, terse_barrier(c));
    o->val[0] = o->val[1] = plain_rss_mb();
    pid_t pid = -1;
    char out[64];
    snprintf(out, sizeof out, "/tmp/terse-intruder-%d.txt", (int)getpid());
    if (r == 0) {
        char sport[16], sclaim[16], scount[24], sbytes[24], sconns[24];
        snprintf(sport, sizeof sport, "%llu", (unsigned long long)all[0].u[10]);
        snprintf(sclaim, sizeof sclaim, "%llu", (unsigned long long)all[1].u[10]);
        snprintf(scount, sizeof scount, "%ld", a->count);
        snprintf(sbytes, sizeof sbytes, "%ld", a->bytes);
        const char *secs = a->seconds ? a->seconds : a->impersonate ? "8" : "20";
        snprintf(sconns, sizeof sconns, "%ld", a->conns ? a->conns : 1);
        char *argv[20] = {TERSE_INTRUDER_PATH, "--port", sport, "--count", scount, "--bytes",
                          sbytes, "--seconds", (char *)secs, "--tags", (char *)a->tags,
                          "--provider", (char *)a->provider, "--conns", sconns, NULL};
        if (a->impersonate) argv[15] = "--claim-port", argv[16] = sclaim;
        /* net keeps reconnecting behind a refused claim: count the refusals */
        if (a->impersonate && !strcmp(a->provider, "net")) argv[17] = "--count-refusals";
        posix_spawn_file_actions_t fa;
        posix_spawn_file_actions_init(&fa);
        posix_spawn_file_actions_addopen(&fa, 1, out, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (posix_spawn(&pid, TERSE_INTRUDER_PATH, &fa, NULL, argv, environ) != 0) pid = -1;
        posix_spawn_file_actions_destroy(&fa);
        o->u[20] = 1; /* started */
    }
    /* Allreduce until the intruder is done (and a second more), at most 40 s. */
    double end = tr_now_ms() + 40000, after = 0;
    for (int k = 0; tr_now_ms() < end; k++) {
        if (tr_pattern_allreduce(c, o, x, N_FLOATS, k, after && tr_now_ms() > after) != 0) break;
        double m = plain_rss_mb();
        if (m > o->val[1]) o->val[1] = m;
        if (r == 0 && pid > 0 && !o->u[21]) {
            int st;
            if (waitpid(pid, &st, WNOHANG) == pid) {
                o->u[3] = WIFEXITED(st) && WEXITSTATUS(st) == 0;
                o->u[21] = 1; /* the intruder is done */
                pid = -1;
            }
        }
        if (r == 0 && !after && o->u[21]) after = tr_now_ms() + 1000;
    }
    if (r == 0 && pid > 0) { /* this rank failed first: the intruder may still be at it */
        int st = 0;
        double until = tr_now_ms() + 30000; /* it stops by itself (--count, --seconds) */
        while (waitpid(pid, &st, WNOHANG) != pid && tr_now_ms() < until) usleep(10000);
        if (tr_now_ms() >= until) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
        }
        o->u[3] = WIFEXITED(st) && WEXITSTATUS(st) == 0;
        o->u[21] = 1;
    }
    if (r == 0) {
        FILE *f = fopen(out, "r");
        long sent = 0, bytes = 0, refused = 0, conns = 0, cm_refused = 0;
        double secs_taken = 0;
        if (f) {
            if (fscanf(f, "fabric_intruder: sent %ld messages of %ld bytes (%ld failed) in %lf s "
                          "over %ld connections (%ld connection requests refused)",
                       &sent, &bytes, &refused, &secs_taken, &conns, &cm_refused) != 6)
                sent = refused = conns = cm_refused = 0;
            fclose(f);
        }
        unlink(out);
        o->u[4] = (uint64_t)sent;
        o->u[6] = (uint64_t)refused;
        o->u[7] = (uint64_t)conns;
        o->u[8] = (uint64_t)cm_refused;
    }
    terse_comm_stats st = TERSE_COMM_STATS_INIT;
    if (terse_comm_get_stats(c, &st) == TERSE_OK) o->u[5] = st.stranger_drops;
    free(x);
    return 0;
}

/* Both ranks' calls all returned TERSE_OK with the right sums. */
static void expect_every_sum_right(const tr_out *o) {
    for (int r = 0; r < 2; r++) {
        cr_expect_eq(o[r].u[0], TERSE_OK, "rank %d failed during the flood: %s: %s", r,
                     terse_status_name((terse_status)o[r].u[0]), o[r].err);
        cr_expect_eq(o[r].u[1], 0, "rank %d: %llu calls returned TERSE_OK with a wrong sum", r,
                     (unsigned long long)o[r].u[1]);
    }
}

/* Not in the default suite: the sweep it tests is experimental (opt-in),
 * and on a loaded machine this test fails now and then -- a rank's early
 * message at the head of the queue can keep the sweep from ever draining
 * (seen once in CI and once in 4 runs beside a CPU hog). Run it with
 * TERSE_TEST_FLOOD=1 build/tests/test_intruder. */
Test(intruder, a_flood_from_an_address_that_is_no_rank_is_dropped_tcp) {
    if (!getenv("TERSE_TEST_FLOOD"))
        cr_skip_test("the experimental sweep's flood test: TERSE_TEST_FLOOD=1 runs it");
    unsetenv("TERSE_WIRE");
    setenv("TERSE_SWEEP", "1", 1);
    attack a = {0, 100000, 4096, "random", NULL, "tcp;ofi_rxm", 0};
    tr_job job = {"rxm", 2, 5000, 90, -1};
    /* Seen alone in none of about 40 runs; with two floods at once on 2
     * cores, in about half: the reason the sweep is off by default. */
    tr_known_segv = "under a flood on a loaded machine a rank with TERSE_SWEEP=1 crashed inside "
                    "rxm; the cause is not found (SECURITY.md)";
    tr_out *o = tr_run(&job, attack_body, &a);
    tr_known_segv = NULL;
    unsetenv("TERSE_SWEEP");
    if (!o[0].finished || !o[1].finished) {
        tr_release(o);
        return; /* a known crash, reported above; nothing left to check */
    }
    if (!o[0].finished) { /* rxm's crash above, reported by tr_run as the known limitation */
        tr_release(o);
        return;
    }
    cr_assert_eq(o[0].u[3], 1, "the intruder did not run to completion");
    cr_log_info("intruder sent %llu messages; rank 0 dropped %llu from strangers; rank 0 "
                "resident %.1f MB before, at most %.1f MB during; %llu calls",
                (unsigned long long)o[0].u[4], (unsigned long long)o[0].u[5], o[0].val[0],
                o[0].val[1], (unsigned long long)o[0].u[2]);
    cr_expect_eq(o[0].u[4], 100000, "the intruder sent %llu of its 100000 messages",
                 (unsigned long long)o[0].u[4]);
    expect_every_sum_right(o);
    cr_expect_gt(o[0].u[5], 90000, "rank 0 dropped only %llu of the intruder's messages",
                 (unsigned long long)o[0].u[5]);
    /* Memory is reported, not asserted: see SECURITY.md ("Not done yet")
     * for why the peak still follows the flood's rate. */
    tr_release(o);
}

/* The same flood against ranks on tcp (libfabric's net provider), which
 * stops reading a connection whose next message no posted receive
 * matches: the stranger's bytes stay in the kernel's socket buffers and
 * its own send queue, so the rank holds nothing for it. Every allreduce
 * must give the right sum, and the rank's resident memory may grow by at
 * most 64 MB. */
Test(intruder, a_flood_from_an_address_that_is_no_rank_costs_a_tcp_rank_no_memory) {
    unsetenv("TERSE_WIRE");
    attack a = {0, 100000, 4096, "random", "10", "net", 0};
    tr_job job = {"tcp", 2, 5000, 90, -1};
    tr_out *o = tr_run(&job, attack_body, &a);
    cr_assert_eq(o[0].u[3], 1, "the intruder did not run to completion");
    fprintf(stderr, "net flood: the intruder's sends completed: %llu of 100000; rank 0 resident "
                    "%.1f MB before, at most %.1f MB during; %llu allreduces on rank 0\n",
            (unsigned long long)o[0].u[4], o[0].val[0], o[0].val[1],
            (unsigned long long)o[0].u[2]);
    expect_every_sum_right(o);
    for (int r = 0; r < 2; r++)
        cr_expect_lt(o[r].val[1] - o[r].val[0], 64.0, "rank %d grew by %.1f MB during the flood",
                     r, o[r].val[1] - o[r].val[0]);
    tr_release(o);
}

/* Every call of both ranks: the right sum, or a specific error naming the
 * other rank; never TERSE_OK with the intruder's values. */
static void expect_no_sum_of_the_intruders(const tr_out *o) {
    for (int r = 0; r < 2; r++) {
        terse_status s = (terse_status)o[r].u[0];
        cr_log_info("rank %d: %llu calls, then %s: %s", r, (unsigned long long)o[r].u[2],
                    terse_status_name(s), o[r].err);
        cr_expect_eq(o[r].u[1], 0, "rank %d: %llu calls returned TERSE_OK with a wrong sum", r,
                     (unsigned long long)o[r].u[1]);
        if (s != TERSE_OK) {
            cr_expect(s == TERSE_ERR_AUTH || s == TERSE_ERR_PEER_LOST || s == TERSE_ERR_TIMEOUT,
                      "rank %d: %s: %s", r, terse_status_name(s), o[r].err);
            cr_expect(strstr(o[r].err, r ? "rank 0" : "rank 1"),
                      "rank %d does not name its peer: %s", r, o[r].err);
        }
    }
}

/* What libfabric 1.17 does with the claim (SECURITY.md):
 * - rxm, and net on a rank that opened the connection to the claimed
 *   rank itself, replace that connection with the claimant's; the real
 *   rank reconnects and replaces it back, and the claimant's sends fail;
 * - net on a rank that accepted the claimed rank's connection refuses
 *   every claim, as a rule (the process id it compares is overwritten by
 *   one read from an event that carries none, which was 0 whenever a
 *   claim was refused), and the claimant's net silently reconnects, so
 *   its sends neither complete nor fail: the intruder counts the refusals
 *   in libfabric's log (--count-refusals).
 * Which side opened the connection is a race, so a run sees either. */
static void impersonate(const char *provider, const char *intruder_provider) {
    unsetenv("TERSE_WIRE");
    attack a = {1, 20000, 4096, "low", NULL, intruder_provider, 0};
    tr_job job = {provider, 2, 3000, 90, -1};
    /* Seen once in about 40 runs: rank 0 crashed inside rxm. */
    if (!strcmp(provider, "rxm"))
        tr_known_segv = "libfabric 1.17's rxm keeps the queued messages of the connection it "
                        "tore down for the impersonator, and crashes when a later receive "
                        "matches a large one (SECURITY.md)";
    tr_out *o = tr_run(&job, attack_body, &a);
    tr_known_segv = NULL;
    if (!o[0].finished) { /* rxm's crash above, reported by tr_run as the known limitation */
        tr_release(o);
        return;
    }
    cr_assert_eq(o[0].u[3], 1, "the intruder did not run to completion");
    fprintf(stderr, "%s impersonation: the intruder's sends as rank 1: %llu completed, %llu "
                    "failed; its connection requests refused: %llu\n",
            provider, (unsigned long long)o[0].u[4], (unsigned long long)o[0].u[6],
            (unsigned long long)o[0].u[8]);
    /* the claim was taken (sends went out), or refused (the sends failed,
     * or net refused the connection requests): never ignored */
    cr_expect(o[0].u[4] > 0 || o[0].u[6] > 0 || o[0].u[8] > 0,
              "the intruder's claim was neither taken nor refused");
    expect_no_sum_of_the_intruders(o);
    tr_release(o);
}

/* A stranger opens 2,000 connections to a tcp rank (each its own net
 * endpoint, each sending one small message the rank never matches). net
 * keeps an endpoint with two 9,000-byte socket buffers per connection and
 * the message aside: the rank's growth is reported per connection, and the
 * job must stay right. The bound is the process's file-descriptor limit
 * times that cost (SECURITY.md). */
Test(intruder, a_stranger_with_2000_connections_costs_a_tcp_rank_a_bounded_amount) {
    /* each of the intruder's endpoints also listens: two descriptors each */
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_max < 4200)
        cr_skip_test("needs 4,200 file descriptors (ulimit -n); the hard limit is lower");
    if (rl.rlim_cur < 4200) {
        rl.rlim_cur = 4200;
        cr_assert_eq(setrlimit(RLIMIT_NOFILE, &rl), 0, "setrlimit");
    }
    unsetenv("TERSE_WIRE");
    attack a = {0, 10, 64, "random", "10", "net", 2000};
    tr_job job = {"tcp", 2, 5000, 120, -1};
    tr_out *o = tr_run(&job, attack_body, &a);
    cr_assert_eq(o[0].u[3], 1, "the intruder did not run to completion");
    cr_assert_eq(o[0].u[7], 2000, "the intruder opened %llu connections of 2000",
                 (unsigned long long)o[0].u[7]);
    double grew = o[0].val[1] - o[0].val[0];
    fprintf(stderr, "net, 2000 connections: rank 0 resident %.1f MB before, at most %.1f MB "
                    "during (%.1f KB per connection); %llu allreduces on rank 0\n",
            o[0].val[0], o[0].val[1], grew * 1024.0 / 2000.0, (unsigned long long)o[0].u[2]);
    expect_every_sum_right(o);
    cr_expect_lt(grew, 2000 * 64.0 / 1024.0, "rank 0 grew by %.1f MB: over 64 KB a connection",
                 grew);
    tr_release(o);
}

Test(intruder, a_process_claiming_a_ranks_port_gets_no_wrong_sum_accepted_tcp) {
    impersonate("tcp", "net");
}

Test(intruder, a_process_claiming_a_ranks_port_gets_no_wrong_sum_accepted_rxm) {
    impersonate("rxm", "tcp;ofi_rxm");
}
