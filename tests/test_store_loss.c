/* The bootstrap store's failure paths, with real processes over real TCP
 * on 127.0.0.1: a lost rank or store is reported in time, refusals, and
 * timeouts that name what they waited for (store_procs.h runs the ranks). */
#include "store_procs.h"

/* ---- liveness ---- */

/* Exchange, then the victim dies with SIGKILL (or abandons the store and
 * exits); the survivors poll terse__store_check and must hear of it within
 * a second. */
typedef struct loss {
    int victim, abandon;
} loss;

static int victim_or_survivor(job *j, int idx) {
    const loss *how = j->arg;
    int victim = how->victim;
    terse__store *s = NULL;
    int rc = open_rank(j, idx, &s);
    if (rc) return rc;
    uint8_t mine = (uint8_t)idx, all[8];
    REQUIRE_OK(terse__store_allgather(s, &mine, 1, all, 5000));
    /* The victim dies only once every survivor has finished exchanging
     * (each says so with a key), so it is not lost mid-allgather. The
     * victim may die before a survivor's SET is confirmed (rank 0 hosts
     * the server): the SET then reports the loss itself, just as well. */
    char key[32];
    if (idx == victim) {
        for (int r = 0; r < j->nranks; r++) {
            size_t n = 0;
            snprintf(key, sizeof key, "ready/%d", r);
            if (r != victim) REQUIRE_OK(terse__store_get(s, key, NULL, &n, 5000));
        }
        if (!how->abandon) raise(SIGKILL);
        uint64_t t0 = now_ms();
        terse__store_abandon(s); /* must not wait for the others */
        REQUIRE(now_ms() - t0 < 500, 75, "abandon took %llu ms",
                (unsigned long long)(now_ms() - t0));
        return 0;
    }
    uint64_t t0 = now_ms();
    snprintf(key, sizeof key, "ready/%d", idx);
    terse_status st = terse__store_set(s, key, "", 0);
    while (st == TERSE_OK && now_ms() - t0 < 3000) {
        st = terse__store_check(s);
        if (st == TERSE_OK) sleep_ms(5);
    }
    uint64_t dt = now_ms() - t0;
    REQUIRE(st == TERSE_ERR_PEER_LOST, 70, "check returned %s", terse_status_name(st));
    REQUIRE(dt < 1000, 71, "the loss took %llu ms to notice", (unsigned long long)dt);
    char want[128];
    if (victim == 0)
        snprintf(want, sizeof want, "lost the bootstrap store at %s (rank 0)", j->addr);
    else
        snprintf(want, sizeof want, "rank %d was lost", victim);
    /* Rank 0's own client may be reported lost a moment before its store
     * goes: both sentences name rank 0. */
    REQUIRE(strstr(terse_last_error(), want) ||
                (victim == 0 && strstr(terse_last_error(), "rank 0 was lost")),
            72, "the sentence does not say '%s'", want);
    /* The failure is sticky: later calls fail the same way, promptly. */
    size_t len = 1;
    REQUIRE(terse__store_get(s, "anything", &mine, &len, 2000) == TERSE_ERR_PEER_LOST, 73,
            "get after loss");
    REQUIRE(terse__store_check(s) == TERSE_ERR_PEER_LOST, 74, "check after loss");
    terse__store_close(s);
    return 0;
}

static void run_loss(int victim, int abandon) {
    loss how = {victim, abandon};
    job j = {.nranks = 3, .nprocs = 3, .arg = &how};
    for (int i = 0; i < 3; i++) j.fn[i] = victim_or_survivor;
    run(&j, 20000);
    for (int i = 0; i < 3; i++) {
        int want = i == victim && !abandon ? 128 + SIGKILL : 0;
        cr_expect_eq(j.codes[i], want, "process %d exited %d", i, j.codes[i]);
    }
}

Test(store, a_killed_rank_is_reported_to_the_others_within_a_second) { run_loss(2, 0); }
Test(store, a_killed_rank_0_is_reported_as_the_lost_store) { run_loss(0, 0); }
Test(store, a_rank_that_abandons_the_store_is_reported_lost) { run_loss(1, 1); }
Test(store, rank_0_abandoning_stops_the_store_at_once) { run_loss(0, 1); }

/* ---- refusals and timeouts ---- */

/* Rank 0 holds the store open until the parent says the others are done. */
static int holding_rank0(job *j, int idx) {
    terse__store *s = NULL;
    int rc = open_rank(j, idx, &s);
    if (rc) return rc;
    wait_eof(j->hold[0], 10000);
    terse__store_close(s);
    return 0;
}

/* Returns 0 when it joined, 3 when refused as a duplicate. */
static int rank1_claimant(job *j, int idx) {
    terse__store *s = NULL;
    terse_status st = terse__store_open(j->addr, 1, j->nranks, j->token, 5000, &s);
    if (st == TERSE_OK) {
        sleep_ms(500); /* stay joined while the other claimant tries */
        terse__store_close(s);
        return 0;
    }
    REQUIRE(st == TERSE_ERR_INVALID, 80, "claimant got %s", terse_status_name(st));
    REQUIRE(strstr(terse_last_error(), "rank 1 has already joined"), 81, "wrong sentence");
    return 3;
}

static int wrong_size_rank(job *j, int idx) {
    terse__store *s = NULL;
    terse_status st = terse__store_open(j->addr, 2, j->nranks + 2, j->token, 5000, &s);
    REQUIRE(st == TERSE_ERR_INVALID, 82, "wrong-size rank got %s", terse_status_name(st));
    REQUIRE(strstr(terse_last_error(), "does not fit this job of 3 ranks"), 83, "wrong sentence");
    return 0;
}

Test(store, a_second_rank_1_and_a_wrong_job_size_are_refused) {
    job j = {.nranks = 3,
             .nprocs = 4,
             .fn = {holding_rank0, rank1_claimant, rank1_claimant, wrong_size_rank}};
    run(&j, 20000);
    cr_expect_eq(j.codes[0], 0);
    cr_expect_eq(j.codes[1] + j.codes[2], 3, "one claimant joins, one is refused: %d %d",
                 j.codes[1], j.codes[2]);
    cr_expect_eq(j.codes[3], 0);
}

/* Two ranks in the test process (nothing here blocks on the other): a
 * missing key times out and names itself, and a reply that arrives after
 * its request timed out is never mistaken for the next one. */
Test(store, get_of_a_missing_key_times_out_naming_the_key) {
    terse__store *s = NULL, *s1 = NULL;
    char addr[64];
    terse_status st = TERSE_ERR_IO;
    for (int attempt = 0; attempt < 5 && st == TERSE_ERR_IO; attempt++) {
        snprintf(addr, sizeof addr, "127.0.0.1:%d", free_port());
        st = terse__store_open(addr, 0, 2, "pair-token", 3000, &s);
    }
    cr_assert_eq(st, TERSE_OK, "%s", terse_last_error());
    cr_assert_eq(terse__store_open(addr, 1, 2, "pair-token", 3000, &s1), TERSE_OK, "%s",
                 terse_last_error());
    char v[16];
    size_t len = sizeof v;
    uint64_t t0 = now_ms();
    cr_expect_eq(terse__store_get(s, "no/such/key", v, &len, 300), TERSE_ERR_TIMEOUT);
    uint64_t dt = now_ms() - t0;
    cr_expect(dt >= 290 && dt < 1500, "timed out after %llu ms", (unsigned long long)dt);
    cr_expect(strstr(terse_last_error(), "'no/such/key'"), "%s", terse_last_error());
    /* Rank 1 now sets the key: the server answers rank 0's parked GET,
     * which timed out; rank 0's next GET must skip that stale answer. */
    cr_expect_eq(terse__store_set(s1, "no/such/key", "stale", 6), TERSE_OK, "%s",
                 terse_last_error());
    cr_expect_eq(terse__store_set(s1, "other", "1234567890", 11), TERSE_OK);
    len = sizeof v;
    cr_expect_eq(terse__store_get(s, "other", v, &len, 1000), TERSE_OK, "%s", terse_last_error());
    cr_expect_eq(len, 11);
    cr_expect_str_eq(v, "1234567890");
    /* A buffer too small reports the size. */
    len = 4;
    cr_expect_eq(terse__store_get(s, "other", v, &len, 1000), TERSE_ERR_DST_TOO_SMALL);
    cr_expect_eq(len, 11);
    /* Limits are checked before anything is sent. */
    static uint8_t big[TERSE__STORE_MAX_VALUE + 1];
    cr_expect_eq(terse__store_set(s, "big", big, sizeof big), TERSE_ERR_INVALID);
    cr_expect_eq(terse__store_set(s, "max", big, sizeof big - 1), TERSE_OK);
    len = sizeof big;
    cr_expect_eq(terse__store_get(s1, "max", big, &len, 1000), TERSE_OK);
    cr_expect_eq(len, sizeof big - 1);
    char longkey[300];
    memset(longkey, 'k', sizeof longkey - 1);
    longkey[sizeof longkey - 1] = '\0';
    cr_expect_eq(terse__store_set(s, longkey, "x", 1), TERSE_ERR_INVALID);
    cr_expect_eq(terse__store_check(s), TERSE_OK, "%s", terse_last_error());
    cr_expect_eq(terse__store_check(s1), TERSE_OK, "%s", terse_last_error());
    terse__store_close(s1);
    terse__store_close(s);
}

Test(store, joining_when_nobody_listens_times_out) {
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", free_port());
    terse__store *s = NULL;
    uint64_t t0 = now_ms();
    cr_expect_eq(terse__store_open(addr, 1, 2, "some-token", 500, &s), TERSE_ERR_TIMEOUT);
    uint64_t dt = now_ms() - t0;
    cr_expect_null(s);
    cr_expect(dt >= 490 && dt < 2000, "gave up after %llu ms", (unsigned long long)dt);
    cr_expect(strstr(terse_last_error(), addr), "%s", terse_last_error());
    cr_expect(strstr(terse_last_error(), "refused"), "the last reason is given: %s",
              terse_last_error());
}

Test(store, bad_arguments_are_invalid) {
    terse__store *s = (terse__store *)1;
    cr_expect_eq(terse__store_open("127.0.0.1:0", 0, 1, "t", 1000, &s), TERSE_ERR_INVALID);
    cr_expect_null(s);
    cr_expect(strstr(terse_last_error(), "port 0"), "%s", terse_last_error());
    cr_expect_eq(terse__store_open("127.0.0.1", 0, 1, "t", 1000, &s), TERSE_ERR_INVALID);
    cr_expect_eq(terse__store_open("127.0.0.1:99999", 0, 1, "t", 1000, &s), TERSE_ERR_INVALID);
    cr_expect_eq(terse__store_open("127.0.0.1:5000", 2, 2, "t", 1000, &s), TERSE_ERR_INVALID);
    cr_expect_eq(terse__store_open("127.0.0.1:5000", 0, 2, "", 1000, &s), TERSE_ERR_INVALID);
    cr_expect_eq(terse__store_open("127.0.0.1:5000", 0, 2, "t", 0, &s), TERSE_ERR_INVALID);
    cr_expect_eq(terse__store_check(NULL), TERSE_ERR_INVALID);
    terse__store_close(NULL);
}

Test(store, rank_0_reports_an_address_already_in_use) {
    int fd = -1;
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", free_port());
    cr_assert_eq(terse__store_listen(addr, now_ms() + 5000, &fd), TERSE_OK, "%s",
                 terse_last_error());
    terse__store *s = NULL;
    cr_expect_eq(terse__store_open(addr, 0, 2, "t", 1000, &s), TERSE_ERR_IO);
    cr_expect_null(s);
    cr_expect(strstr(terse_last_error(), addr), "%s", terse_last_error());
    cr_expect(strstr(terse_last_error(), "in use"), "%s", terse_last_error());
    terse__store_close_fd(fd);
}

/* Replacements. Five ranks in the test process: rank 1 stays, rank 2 is
 * lost (and replaced), rank 3 leaves with a goodbye, rank 4 is lost for
 * good. Only a lost rank may rejoin, once per loss, and never rank 0; the
 * replacement hears of the losses before it, its requests work in a job
 * that has lost ranks, and every other rank receives its announcement. */
static int polled_until(terse__store *s, int rank, int want) {
    const uint8_t *lost = NULL;
    for (int i = 0; i < 200; i++) {
        if (terse__store_poll_lost(s, &lost) != TERSE_OK) return 0;
        if (lost[rank] == want) return 1;
        usleep(5000);
    }
    return 0;
}

Test(store, only_a_lost_rank_rejoins_and_every_rank_hears_of_it) {
    terse__store *s[5] = {0}, *x = NULL;
    char addr[64];
    const char *tok = "rejoin-test-token";
    terse_status st = TERSE_ERR_IO;
    for (int attempt = 0; attempt < 5 && st == TERSE_ERR_IO; attempt++) {
        snprintf(addr, sizeof addr, "127.0.0.1:%d", free_port());
        st = terse__store_open(addr, 0, 5, tok, 3000, &s[0]);
    }
    cr_assert_eq(st, TERSE_OK, "%s", terse_last_error());
    for (int r = 1; r < 5; r++)
        cr_assert_eq(terse__store_open(addr, r, 5, tok, 3000, &s[r]), TERSE_OK, "%s",
                     terse_last_error());
    terse__store_close(s[3]);
    terse__store_abandon(s[2]);
    terse__store_abandon(s[4]);
    s[2] = s[3] = s[4] = NULL;
    cr_assert(polled_until(s[1], 2, 1) && polled_until(s[1], 4, 1), "losses not announced");

    struct { int rank, rejoin; const char *says; } no[] = {
        {1, 1, "cannot rejoin: only a lost rank can be replaced, and it is connected"},
        {3, 1, "cannot rejoin: only a lost rank can be replaced, and it left with a goodbye"},
        {2, 0, "has already joined and was lost (a replacement sets TERSE_REJOIN=1)"},
        {0, 1, "rank 0 cannot rejoin"},
    };
    for (size_t i = 0; i < sizeof no / sizeof no[0]; i++) {
        cr_expect_eq(terse__store_open_ex(addr, no[i].rank, 5, tok, 3000, no[i].rejoin, &x),
                     TERSE_ERR_INVALID, "rank %d (rejoin %d) was let in", no[i].rank,
                     no[i].rejoin);
        cr_expect(strstr(terse_last_error(), no[i].says), "%s", terse_last_error());
    }
    cr_expect_eq(terse__store_open_ex(addr, 2, 5, "wrong-token-entirely", 3000, 1, &x),
                 TERSE_ERR_AUTH, "a replacement with a wrong token was let in");

    terse__store *r2 = NULL;
    cr_assert_eq(terse__store_open_ex(addr, 2, 5, tok, 3000, 1, &r2), TERSE_OK, "%s",
                 terse_last_error());
    /* the replacement hears of rank 4's loss, and still gets and sets */
    cr_expect(polled_until(r2, 4, 1), "rank 4's earlier loss was not replayed to the replacement");
    cr_expect_eq(terse__store_set(r2, "after", "1", 2), TERSE_OK, "%s", terse_last_error());
    char v[8];
    size_t len = sizeof v;
    cr_expect_eq(terse__store_get(r2, "after", v, &len, 1000), TERSE_OK, "%s",
                 terse_last_error());
    /* a second replacement while this one lives is refused */
    cr_expect_eq(terse__store_open_ex(addr, 2, 5, tok, 3000, 1, &x), TERSE_ERR_INVALID);
    cr_expect(strstr(terse_last_error(), "is connected"), "%s", terse_last_error());
    /* only a replacement announces itself */
    cr_expect_eq(terse__store_announce_back(s[1], "x", 1), TERSE_ERR_INVALID);
    cr_assert_eq(terse__store_announce_back(r2, "hello", 6), TERSE_OK, "%s", terse_last_error());
    for (int r = 0; r < 2; r++) {
        cr_expect(polled_until(s[r], 2, 0), "rank %d still counts rank 2 lost", r);
        terse__store_back *b = terse__store_take_back(s[r]);
        cr_assert(b, "rank %d got no announcement", r);
        cr_expect_eq(b->rank, 2);
        cr_expect_eq(b->incarnation, 2);
        cr_expect(b->len == 6 && !memcmp(b->blob, "hello", 6), "rank %d: wrong blob", r);
        cr_expect_eq(terse__store_incarnation(s[r], 2), 2);
        cr_expect_eq(terse__store_incarnation(s[r], 1), 1);
        free(b);
        cr_expect_null(terse__store_take_back(s[r]), "rank %d: a second announcement", r);
    }
    terse__store_close(r2);
    terse__store_close(s[1]);
    terse__store_close(s[0]);
}
