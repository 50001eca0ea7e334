/* A rank that forks after joining (PyTorch's DataLoader does) and then
 * dies must still be reported lost: the child it left behind must not hold
 * the rank's connection to the bootstrap store open. And the child must
 * not be able to use the store it inherited, nor send a goodbye from it.
 *
 * The forked child is a grandchild of the test process, which makes itself
 * a child subreaper so that the orphan is re-parented to it, and kills and
 * reaps it at the end of every test; if a failed assertion ends the test
 * first, the child notices within 20 ms that the test process is gone and
 * leaves. A child is never left behind. Survivors' shm regions are removed as
 * in ranks.h (a SIGKILLed pid cannot remove its own). */
#include <fcntl.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/prctl.h>

#include "ranks.h"
#include "store_procs.h"

#define CHILD_SLEEP_MS 20000
/* The survivors' own timeout: far beyond the bound below, so that only the
 * store's loss notice can explain a fast failure. */
#define LONG_TIMEOUT_MS 30000
#define NOTICE_MS 2000

static pid_t tester; /* the test process */

/* The forked child: sleep, but leave at once if the test process is gone
 * (a failed assertion ends it before it can kill us). */
static void sleep_then_exit(void) {
    for (int waited = 0; waited < CHILD_SLEEP_MS; waited += 20) {
        if (kill(tester, 0) != 0) break;
        sleep_ms(20);
    }
    _exit(0);
}

/* Make orphans of this process's children ours, so they can be reaped. */
static void become_subreaper(void) {
    tester = getpid();
    cr_assert_eq(prctl(PR_SET_CHILD_SUBREAPER, 1), 0, "PR_SET_CHILD_SUBREAPER");
}

static void kill_child(pid_t pid) {
    if (pid <= 0) return;
    kill(pid, SIGKILL);
    (void)waitpid(pid, NULL, 0);
    tr_remove_shm_of(pid);
}

/* ---- the store alone ---- */

/* Shared (MAP_SHARED) between the test process, the ranks and the child. */
typedef struct fork_case {
    int victim;
    pid_t child;
    atomic_int child_done;
    int check, set, allgather, fds_intact;
    char sentence[512];
} fork_case;

/* In the forked child: every call fails as misuse, close sends nothing and
 * closes no fd again (a pipe opened meanwhile reuses the freed numbers). */
static void child_uses_inherited_store(terse__store *s, fork_case *fc) {
    fc->check = terse__store_check(s);
    snprintf(fc->sentence, sizeof fc->sentence, "%s", terse_last_error());
    fc->set = terse__store_set(s, "from/child", "x", 1);
    uint8_t mine = 9, all[8];
    fc->allgather = terse__store_allgather(s, &mine, 1, all, 1000);
    int p[2];
    int have_pipe = pipe(p) == 0;
    terse__store_close(s);
    fc->fds_intact = have_pipe && fcntl(p[0], F_GETFD) >= 0 && fcntl(p[1], F_GETFD) >= 0;
    atomic_store(&fc->child_done, 1);
    sleep_then_exit();
}

static int forking_victim(job *j, int idx, terse__store *s, fork_case *fc) {
    pid_t pid = fork();
    REQUIRE(pid >= 0, 90, "fork");
    if (pid == 0) child_uses_inherited_store(s, fc);
    fc->child = pid;
    uint64_t end = now_ms() + 5000;
    while (!atomic_load(&fc->child_done) && now_ms() < end) sleep_ms(2);
    REQUIRE(atomic_load(&fc->child_done), 91, "the child did not report");
    /* The parent's store is unaffected by the child. */
    REQUIRE_OK(terse__store_check(s));
    char key[32];
    for (int r = 0; r < j->nranks; r++) {
        size_t n = 0;
        snprintf(key, sizeof key, "ready/%d", r);
        if (r != idx) REQUIRE_OK(terse__store_get(s, key, NULL, &n, 5000));
    }
    raise(SIGKILL);
    return 92;
}

static int fork_victim_or_survivor(job *j, int idx) {
    fork_case *fc = j->arg;
    terse__store *s = NULL;
    int rc = open_rank(j, idx, &s);
    if (rc) return rc;
    uint8_t mine = (uint8_t)idx, all[8];
    REQUIRE_OK(terse__store_allgather(s, &mine, 1, all, 5000));
    if (idx == fc->victim) return forking_victim(j, idx, s, fc);
    char key[32];
    snprintf(key, sizeof key, "ready/%d", idx);
    uint64_t t0 = now_ms();
    terse_status st = terse__store_set(s, key, "", 0);
    while (st == TERSE_OK && now_ms() - t0 < 3000) {
        st = terse__store_check(s);
        if (st == TERSE_OK) sleep_ms(5);
    }
    uint64_t dt = now_ms() - t0;
    REQUIRE(st == TERSE_ERR_PEER_LOST, 70, "check returned %s", terse_status_name(st));
    REQUIRE(dt < 1000, 71, "the loss took %llu ms to notice", (unsigned long long)dt);
    char want[64];
    snprintf(want, sizeof want, "rank %d was lost", fc->victim);
    REQUIRE(strstr(terse_last_error(), want) ||
                (fc->victim == 0 && strstr(terse_last_error(), "lost the bootstrap store")),
            72, "the sentence does not name rank %d", fc->victim);
    terse__store_close(s);
    return 0;
}

static void run_store_fork(int victim) {
    become_subreaper();
    fork_case *fc = mmap(NULL, sizeof *fc, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                         -1, 0);
    cr_assert_neq(fc, MAP_FAILED);
    memset(fc, 0, sizeof *fc);
    fc->victim = victim;
    job j = {.nranks = 3, .nprocs = 3, .arg = fc};
    for (int i = 0; i < 3; i++) j.fn[i] = fork_victim_or_survivor;
    run(&j, 20000);
    kill_child(fc->child);
    for (int i = 0; i < 3; i++)
        cr_expect_eq(j.codes[i], i == victim ? 128 + SIGKILL : 0, "process %d exited %d", i,
                     j.codes[i]);
    cr_expect_eq(fc->check, TERSE_ERR_INVALID, "check in the child: %d", fc->check);
    cr_expect(strstr(fc->sentence, "used in a child process forked after terse_comm_init"),
              "%s", fc->sentence);
    cr_expect_eq(fc->set, TERSE_ERR_INVALID, "set in the child: %d", fc->set);
    cr_expect_eq(fc->allgather, TERSE_ERR_INVALID, "allgather in the child: %d", fc->allgather);
    cr_expect(fc->fds_intact, "closing the inherited store closed the child's own fds");
    munmap(fc, sizeof *fc);
}

Test(fork, a_rank_that_forked_and_died_is_reported_lost_by_the_store) { run_store_fork(1); }
Test(fork, a_rank_0_that_forked_and_died_is_reported_as_the_lost_store) { run_store_fork(0); }

/* ---- a whole communicator ---- */

/* Rank 1 forks a child that sleeps (u[0]: its pid), stops taking part, and
 * kills itself 300 ms later (val[1]: when) while the others wait in a
 * barrier. The survivors report u[1] the status, val[0] when it came. */
static int comm_body(terse_comm *c, tr_out *o, const void *arg) {
    (void)arg;
    for (int i = 0; i < 20; i++) TR_CALL(o, terse_barrier(c));
    if (terse_comm_rank(c) == 1) {
        fflush(NULL);
        pid_t pid = fork();
        if (pid < 0) return tr_fail(o, TERSE_ERR_INTERNAL, "fork");
        if (pid == 0) sleep_then_exit();
        o->u[0] = (uint64_t)pid;
        usleep(300 * 1000);
        o->val[1] = tr_now_ms();
        raise(SIGKILL);
    }
    for (int i = 0; i < 1000000; i++) {
        terse_status s = terse_barrier(c);
        if (s == TERSE_OK) continue;
        o->val[0] = tr_now_ms();
        o->u[1] = (uint64_t)s;
        snprintf(o->err, sizeof o->err, "%s", terse_last_error());
        return 0;
    }
    return tr_fail(o, TERSE_OK, "a million barriers succeeded without rank 1");
}

static void check_comm_fork(const char *provider) {
    become_subreaper();
    /* wall_s is below the timeout: without the notice, the test fails. */
    tr_job tj = {provider, 3, LONG_TIMEOUT_MS, 15, 1};
    tr_out *o = tr_run(&tj, comm_body, NULL);
    kill_child((pid_t)o[1].u[0]);
    cr_expect_gt(o[1].u[0], 0, "rank 1 did not fork");
    for (int r = 0; r < 3; r += 2) {
        terse_status s = (terse_status)o[r].u[1];
        double dt = o[r].val[0] - o[1].val[1];
        fprintf(stderr, "%s survivor %d: %s %.0f ms after the kill: %s\n", provider, r,
                terse_status_name(s), dt, o[r].err);
        cr_expect_eq(s, TERSE_ERR_PEER_LOST, "%s: survivor %d got %s (%s)", provider, r,
                     terse_status_name(s), o[r].err);
        cr_expect(strstr(o[r].err, "rank 1 was lost"), "%s: survivor %d: %s", provider, r,
                  o[r].err);
        cr_expect(dt >= 0 && dt < NOTICE_MS, "%s: survivor %d noticed after %.0f ms", provider,
                  r, dt);
    }
    tr_release(o);
}

Test(fork, a_forked_child_does_not_hide_its_dead_parent_tcp) { check_comm_fork("tcp"); }
Test(fork, a_forked_child_does_not_hide_its_dead_parent_shm) { check_comm_fork("shm"); }
