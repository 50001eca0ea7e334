/* The bootstrap store, with real processes over real TCP on 127.0.0.1:
 * exchange, authentication both ways, surviving garbage, and name
 * resolution that keeps to its deadline. Each rank is a
 * fork()ed child that reports through its exit code (0 = every check
 * passed) and explains any failure on stderr (store_procs.h). */
#include <netdb.h>
#include <stdatomic.h>

#include "plain_procs.h"
#include "store_procs.h"

/* ---- exchange ---- */

static uint8_t pattern(int round, int rank, size_t i) {
    return (uint8_t)(round * 71 + rank * 31 + (int)(i * 7));
}

/* Three allgathers of different sizes (including empty), then a key set by
 * one rank and read by the next. */
static int exchanging_rank(job *j, int idx) {
    terse__store *s = NULL;
    int rc = open_rank(j, idx, &s);
    if (rc) return rc;
    static const size_t lens[] = {64, 0, 4000};
    for (int round = 0; round < 3; round++) {
        size_t len = lens[round];
        uint8_t mine[4000], all[8 * 4000];
        for (size_t i = 0; i < len; i++) mine[i] = pattern(round, idx, i);
        REQUIRE_OK(terse__store_allgather(s, mine, len, all, 5000));
        for (int r = 0; r < j->nranks; r++)
            for (size_t i = 0; i < len; i++)
                REQUIRE(all[(size_t)r * len + i] == pattern(round, r, i), 12,
                        "round %d: byte %zu of rank %d's contribution is wrong", round, i, r);
    }
    char key[32], val[64], want[64];
    snprintf(key, sizeof key, "greeting/%d", idx);
    snprintf(val, sizeof val, "hello from rank %d", idx);
    REQUIRE_OK(terse__store_set(s, key, val, strlen(val) + 1));
    int from = (idx + 1) % j->nranks;
    snprintf(key, sizeof key, "greeting/%d", from);
    snprintf(want, sizeof want, "hello from rank %d", from);
    size_t len = sizeof val;
    REQUIRE_OK(terse__store_get(s, key, val, &len, 5000));
    REQUIRE(len == strlen(want) + 1 && strcmp(val, want) == 0, 13, "got '%s'", val);
    REQUIRE_OK(terse__store_check(s));
    terse__store_close(s);
    return 0;
}

static void run_exchange(int n) {
    job j = {.nranks = n, .nprocs = n};
    for (int i = 0; i < n; i++) j.fn[i] = exchanging_rank;
    run(&j, 20000);
    expect_all_zero(&j);
}

Test(store, two_ranks_exchange_through_allgather_and_keys) { run_exchange(2); }

/* ---- colocated notices (WGONE): a worker that gave up, an endpoint that
 * closed ---- */

/* What a colocated pair's notice says, and one scenario of notices: in each
 * phase the listed ranks tell, an allgather orders the notices (a rank's
 * notice reaches the server before its contribution, the server's relay
 * reaches the others before the allgather's answer), the readers copy the
 * generations ask_lo..ask_hi and compare with want, and a last allgather
 * keeps the next phase's notices until everyone looked (a rank keeps the
 * latest generation per rank). Every rank joined before the first notice:
 * the server relays a notice to the ranks connected when it comes (a
 * colocated pair exists only after init). Nobody is lost or dropped. */
enum { GAVE_UP, SERVER_CLOSED, WORKER_CLOSED };
typedef struct {
    int phases;
    struct {
        int rank, what;
        uint32_t gen;
    } tell[2][4];
    unsigned readers; /* bit r: rank r reads */
    uint32_t ask_lo, ask_hi;
    uint8_t want[2][5][3]; /* [phase][generation asked][rank] */
} notice_case;

static const notice_case *the_case; /* set before run() forks the ranks */

static int noticing_rank(job *j, int idx) {
    const notice_case *c = the_case;
    terse__store *s = NULL;
    int rc = open_rank(j, idx, &s);
    if (rc) return rc;
    uint8_t all[8], out[3];
    REQUIRE_OK(terse__store_allgather(s, &idx, 1, all, 5000));
    for (int ph = 0; ph < c->phases; ph++) {
        for (int k = 0; k < 4 && c->tell[ph][k].gen; k++) {
            if (c->tell[ph][k].rank != idx) continue;
            uint32_t gen = c->tell[ph][k].gen;
            int what = c->tell[ph][k].what;
            REQUIRE_OK(what == GAVE_UP
                           ? terse__store_tell_worker_gone(s, gen)
                           : terse__store_tell_endpoint_closed(s, gen, what == WORKER_CLOSED));
        }
        REQUIRE_OK(terse__store_allgather(s, &idx, 1, all, 5000));
        for (uint32_t ask = c->ask_lo; (c->readers >> idx & 1) && ask <= c->ask_hi; ask++) {
            REQUIRE_OK(terse__store_copy_wgone(s, ask, out));
            for (int r = 0; r < j->nranks; r++)
                REQUIRE(out[r] == c->want[ph][ask][r], 20,
                        "phase %d: rank %d reads %d for rank %d's pair %u, not %d", ph, idx,
                        out[r], r, ask, c->want[ph][ask][r]);
        }
        REQUIRE_OK(terse__store_allgather(s, &idx, 1, all, 5000));
    }
    REQUIRE_OK(terse__store_check(s)); /* nobody lost, nobody dropped */
    terse__store_close(s);
    return 0;
}

static void run_notices(const notice_case *c) {
    the_case = c;
    job j = {.nranks = 3, .nprocs = 3};
    for (int i = 0; i < 3; i++) j.fn[i] = noticing_rank;
    run(&j, 20000);
    expect_all_zero(&j);
}

/* Rank 1 says its worker of pair 1 gave up (twice: the second is no news
 * and not sent), then of pair 2. Ranks 0 and 2 see rank 1, and only rank
 * 1, for the generation it named and not for another (bit 1: gave up). */
Test(store, a_colocated_worker_that_gave_up_is_told_per_generation) {
    static const notice_case c = {
        .phases = 2,
        .tell = {{{1, GAVE_UP, 1}, {1, GAVE_UP, 1}}, {{1, GAVE_UP, 2}, {1, GAVE_UP, 2}}},
        .readers = 1u | 4u,
        .ask_lo = 1,
        .ask_hi = 3,
        .want = {{[1] = {0, 1, 0}}, {[2] = {0, 1, 0}}},
    };
    run_notices(&c);
}

/* Colocated endpoints that closed after a clean run (bits 2 and 4 of
 * terse__store_copy_wgone): rank 1 closes its server endpoint of pair 3,
 * then its worker endpoint; rank 2's worker of pair 3 gives up, then its
 * worker endpoint closes. Rank 0 reads each state, only for pair 3; the
 * growing values are accepted. */
Test(store, colocated_endpoints_closed_are_told_per_side_and_generation) {
    static const notice_case c = {
        .phases = 2,
        .tell = {{{1, SERVER_CLOSED, 3}, {2, GAVE_UP, 3}},
                 {{1, WORKER_CLOSED, 3}, {2, WORKER_CLOSED, 3}}},
        .readers = 1u,
        .ask_lo = 2,
        .ask_hi = 4,
        .want = {{[3] = {0, 2, 1}}, {[3] = {0, 6, 5}}},
    };
    run_notices(&c);
}
Test(store, four_ranks_exchange_through_allgather_and_keys) { run_exchange(4); }

/* ---- authentication ---- */

/* Claims rank 1 with the wrong token before the real rank 1 arrives. */
static int impostor(job *j, int idx) {
    terse__store *s = NULL;
    terse_status st = terse__store_open(j->addr, 1, j->nranks, "not-the-job-token", 3000, &s);
    REQUIRE(st == TERSE_ERR_AUTH, 20, "impostor got %s", terse_status_name(st));
    REQUIRE(s == NULL, 21, "impostor got a store");
    REQUIRE(strstr(terse_last_error(), "wrong token"), 22, "sentence does not say why");
    REQUIRE(!strstr(terse_last_error(), "not-the-job-token"), 23, "sentence leaks the token");
    return 0;
}

static int late_rank(job *j, int idx) {
    sleep_ms(300); /* the impostor knocks first */
    return exchanging_rank(j, idx);
}

Test(store, wrong_token_is_refused_and_the_real_ranks_still_join) {
    job j = {.nranks = 3, .nprocs = 4, .fn = {exchanging_rank, late_rank, late_rank, impostor}};
    snprintf(j.log, sizeof j.log, "/tmp/terse-store-log-%d", (int)getpid());
    run(&j, 20000);
    expect_all_zero(&j);
    char *log = slurp(j.log);
    cr_expect(strstr(log, "failed authentication claiming rank 1 (wrong token)"), "log: %s", log);
    cr_expect(strstr(log, "127.0.0.1:"), "the log names the peer: %s", log);
    cr_expect(!strstr(log, j.token), "the log leaks the token");
    free(log);
    unlink(j.log);
}

/* A fake store that greets, takes the client's proof, and answers with a
 * proof made from the wrong token. It exits 0 if the client then sends
 * nothing more (no key ever reaches it) and hangs up. */
static int fake_store(job *j, int idx) {
    int lfd = -1;
    REQUIRE(terse__store_listen(j->addr, now_ms() + 5000, &lfd) == TERSE_OK, ADDR_IN_USE,
            "listen");
    REQUIRE(write(j->notify[1], "l", 1) == 1, 30, "notify");
    REQUIRE(terse__store_wait_fd(lfd, POLLIN, now_ms() + 5000) == 1, 31, "no client came");
    int fd = accept(lfd, NULL, NULL);
    REQUIRE(fd >= 0, 32, "accept");
    uint8_t snonce[TERSE__STORE_NONCE] = {1, 2, 3}, hdr[TERSE__STORE_HDR];
    uint8_t auth[TERSE__STORE_AUTH_BODY], mac[TERSE__STORE_MAC];
    terse__put_u32(hdr, TERSE__STORE_NONCE);
    hdr[4] = TERSE__STORE_HELLO;
    REQUIRE(write(fd, hdr, sizeof hdr) == sizeof hdr &&
                write(fd, snonce, sizeof snonce) == sizeof snonce,
            33, "hello");
    size_t got = 0;
    uint8_t in[TERSE__STORE_HDR + TERSE__STORE_AUTH_BODY];
    while (got < sizeof in) {
        REQUIRE(terse__store_wait_fd(fd, POLLIN, now_ms() + 3000) == 1, 34, "no AUTH");
        ssize_t n = read(fd, in + got, sizeof in - got);
        REQUIRE(n > 0, 35, "client hung up before AUTH");
        got += (size_t)n;
    }
    memcpy(auth, in + TERSE__STORE_HDR, sizeof auth);
    REQUIRE(terse__store_server_mac("the-wrong-token", auth + 8, snonce, terse__get_u32(auth),
                                    mac) == TERSE_OK,
            36, "mac");
    terse__put_u32(hdr, TERSE__STORE_MAC);
    hdr[4] = TERSE__STORE_WELCOME;
    REQUIRE(write(fd, hdr, sizeof hdr) == sizeof hdr && write(fd, mac, sizeof mac) == sizeof mac,
            37, "welcome");
    REQUIRE(terse__store_wait_fd(fd, POLLIN, now_ms() + 3000) == 1, 38, "client stayed");
    REQUIRE(read(fd, in, sizeof in) == 0, 39, "the client sent more after a bad proof");
    close(fd);
    terse__store_close_fd(lfd);
    return 0;
}

static int trusting_client(job *j, int idx) {
    char b;
    REQUIRE(read(j->notify[0], &b, 1) == 1, 40, "fake store did not start");
    terse__store *s = NULL;
    uint64_t t0 = now_ms();
    terse_status st = terse__store_open(j->addr, 1, 2, j->token, 3000, &s);
    REQUIRE(st == TERSE_ERR_AUTH, 41, "client got %s", terse_status_name(st));
    REQUIRE(strstr(terse_last_error(), "could not prove"), 42, "wrong sentence");
    REQUIRE(strstr(terse_last_error(), j->addr), 43, "sentence lacks the address");
    REQUIRE(now_ms() - t0 < 2000, 44, "refusal took %llu ms", (unsigned long long)(now_ms() - t0));
    return 0;
}

Test(store, client_refuses_a_server_that_cannot_prove_the_token) {
    job j = {.nranks = 1, .nprocs = 2, .fn = {fake_store, trusting_client}};
    run(&j, 15000);
    expect_all_zero(&j);
}

/* ---- garbage ---- */

static int dial(const char *addr) {
    int fd = -1, connected = 0;
    char why[64];
    uint64_t end = now_ms() + 5000;
    while (!connected && now_ms() < end) {
        if (terse__store_connect(addr, end, &fd, &connected, why, sizeof why) != TERSE_OK)
            return -1;
        if (!connected) sleep_ms(20);
    }
    return connected ? fd : -1;
}

/* 1 if the server closes fd (EOF or reset) within timeout_ms. */
static int dropped_within(int fd, int timeout_ms) {
    uint64_t end = now_ms() + (uint64_t)timeout_ms;
    uint8_t b[512];
    while (terse__store_wait_fd(fd, POLLIN, end) == 1) {
        ssize_t n = read(fd, b, sizeof b);
        if (n <= 0) return n == 0 || errno == ECONNRESET;
    }
    return 0;
}

/* Opens six bad connections while the ranks join, checks that the store
 * drops every one, then tells rank 0 it may leave. */
static int vandal(job *j, int idx) {
    int fd[6];
    for (int i = 0; i < 6; i++) REQUIRE((fd[i] = dial(j->addr)) >= 0, 50, "connect %d", i);
    uint64_t t_silent = now_ms();
    uint8_t junk[1000], hdr[TERSE__STORE_HDR];
    for (size_t i = 0; i < sizeof junk; i++) junk[i] = (uint8_t)(i * 2654435761u >> 13);
    /* 0: random bytes. */
    REQUIRE(send(fd[0], junk, sizeof junk, MSG_NOSIGNAL) > 0, 51, "send junk");
    /* 1: a 4 GiB length prefix. */
    memset(hdr, 0xff, sizeof hdr);
    REQUIRE(send(fd[1], hdr, sizeof hdr, MSG_NOSIGNAL) == sizeof hdr, 52, "send prefix");
    /* 2: nothing at all (fd[2] stays silent). */
    /* 3: take the greeting, answer half of a handshake, hang up. (Reading
     * the greeting first makes the hang-up a clean FIN, not a reset.) */
    uint8_t hello[TERSE__STORE_HDR + TERSE__STORE_NONCE];
    size_t got = 0;
    while (got < sizeof hello && terse__store_wait_fd(fd[3], POLLIN, now_ms() + 3000) == 1) {
        ssize_t n = read(fd[3], hello + got, sizeof hello - got);
        REQUIRE(n > 0, 53, "no greeting");
        got += (size_t)n;
    }
    REQUIRE(got == sizeof hello && hello[4] == TERSE__STORE_HELLO, 53, "bad greeting");
    terse__put_u32(hdr, TERSE__STORE_AUTH_BODY);
    hdr[4] = TERSE__STORE_AUTH;
    REQUIRE(send(fd[3], hdr, sizeof hdr, MSG_NOSIGNAL) == sizeof hdr, 53, "half");
    REQUIRE(send(fd[3], junk, 20, MSG_NOSIGNAL) == 20, 54, "half");
    terse__store_close_fd(fd[3]);
    /* 4: a well-formed request that is not allowed before authenticating. */
    terse__put_u32(hdr, 10);
    hdr[4] = TERSE__STORE_SET;
    REQUIRE(send(fd[4], hdr, sizeof hdr, MSG_NOSIGNAL) == sizeof hdr &&
                send(fd[4], junk, 10, MSG_NOSIGNAL) == 10,
            55, "set");
    /* 5: a well-formed AUTH for rank 0 with a made-up proof. */
    uint8_t auth[TERSE__STORE_AUTH_BODY];
    memcpy(auth, junk, sizeof auth);
    terse__put_u32(auth, 0);
    terse__put_u32(auth + 4, (uint32_t)j->nranks);
    terse__put_u32(hdr, sizeof auth);
    hdr[4] = TERSE__STORE_AUTH;
    REQUIRE(send(fd[5], hdr, sizeof hdr, MSG_NOSIGNAL) == sizeof hdr &&
                send(fd[5], auth, sizeof auth, MSG_NOSIGNAL) == sizeof auth,
            56, "auth");
    int order[] = {0, 1, 4, 5, 2};
    /* the store drops a silent connection after 1.5 s; the margin above it
     * scales with the machine's load (plain_slack_ms) */
    const int limit_ms = 1500 + (int)plain_slack_ms(2000);
    for (int k = 0; k < 5; k++)
        REQUIRE(dropped_within(fd[order[k]], limit_ms), 57, "connection %d was not dropped",
                order[k]);
    uint64_t silent_ms = now_ms() - t_silent;
    REQUIRE(silent_ms >= 1500 && silent_ms < (uint64_t)limit_ms, 58,
            "silent connection dropped after %llu ms",
            (unsigned long long)silent_ms);
    for (int k = 0; k < 5; k++) terse__store_close_fd(fd[order[k]]);
    REQUIRE(write(j->notify[1], "d", 1) == 1, 59, "notify");
    return 0;
}

/* Joins late, exchanges, and (rank 0) keeps the store up until the vandal
 * has seen all of its connections dropped. */
static int patient_rank(job *j, int idx) {
    sleep_ms(100);
    terse__store *s = NULL;
    int rc = open_rank(j, idx, &s);
    if (rc) return rc;
    uint8_t mine[8], all[8 * 8];
    memset(mine, idx + 1, sizeof mine);
    REQUIRE_OK(terse__store_allgather(s, mine, sizeof mine, all, 5000));
    for (int r = 0; r < j->nranks; r++) REQUIRE(all[r * 8] == r + 1, 60, "rank %d's bytes", r);
    if (idx == 0) {
        char b;
        struct pollfd p = {.fd = j->notify[0], .events = POLLIN};
        REQUIRE(poll(&p, 1, 8000) == 1 && read(j->notify[0], &b, 1) == 1, 61,
                "vandal did not finish");
    }
    terse__store_close(s);
    return 0;
}

Test(store, garbage_connections_are_dropped_and_logged_while_ranks_join) {
    job j = {.nranks = 3, .nprocs = 4, .fn = {patient_rank, patient_rank, patient_rank, vandal}};
    snprintf(j.log, sizeof j.log, "/tmp/terse-store-log-%d", (int)getpid());
    run(&j, 20000);
    expect_all_zero(&j);
    char *log = slurp(j.log);
    cr_expect(strstr(log, "oversized frame (length 4294967295"), "log: %s", log);
    cr_expect(strstr(log, "sent no valid handshake within"), "log: %s", log);
    cr_expect(strstr(log, "closed the connection during the handshake"), "log: %s", log);
    cr_expect(strstr(log, "instead of AUTH"), "log: %s", log);
    cr_expect(strstr(log, "failed authentication claiming rank 0"), "log: %s", log);
    cr_expect(strstr(log, "dropped 127.0.0.1:"), "log: %s", log);
    cr_expect(!strstr(log, "lost"), "no rank was lost: %s", log);
    free(log);
    unlink(j.log);
}

/* ---- name resolution with a deadline ---- */

static atomic_int lookups;

/* Stand-ins for getaddrinfo on the helper thread: one that must not be
 * called, one that answers at once and one that answers after 1.5 s (both
 * with a real result for 127.0.0.1, which the abandoned helper must free). */
static int counting_lookup(const char *host, const char *port, const struct addrinfo *hints,
                           struct addrinfo **res) {
    (void)host, (void)port, (void)hints, (void)res;
    atomic_fetch_add(&lookups, 1);
    return EAI_FAIL;
}

static int quick_lookup(const char *host, const char *port, const struct addrinfo *hints,
                        struct addrinfo **res) {
    (void)host;
    atomic_fetch_add(&lookups, 1);
    struct addrinfo h = *hints;
    h.ai_flags |= AI_NUMERICHOST;
    return getaddrinfo("127.0.0.1", port, &h, res);
}

static int slow_lookup(const char *host, const char *port, const struct addrinfo *hints,
                       struct addrinfo **res) {
    sleep_ms(1500);
    return quick_lookup(host, port, hints, res);
}

Test(store, numeric_addresses_resolve_at_once_without_a_lookup) {
    terse__store_gai_hook = counting_lookup;
    const char *addrs[] = {"127.0.0.1:5000", "[::1]:5000", "0.0.0.0:1"};
    for (size_t i = 0; i < sizeof addrs / sizeof *addrs; i++) {
        struct addrinfo *ai = NULL;
        uint64_t t0 = now_ms();
        cr_expect_eq(terse__store_resolve(addrs[i], 0, t0 + 1000, &ai), TERSE_OK, "%s: %s",
                     addrs[i], terse_last_error());
        cr_expect_leq(now_ms() - t0, plain_slack_ms(50), "%s took %llu ms", addrs[i],
                      (unsigned long long)(now_ms() - t0));
        cr_expect_not_null(ai);
        if (ai) freeaddrinfo(ai);
    }
    /* Even with the deadline already past. */
    struct addrinfo *ai = NULL;
    cr_expect_eq(terse__store_resolve("127.0.0.1:5000", 1, 0, &ai), TERSE_OK);
    if (ai) freeaddrinfo(ai);
    cr_expect_eq(atomic_load(&lookups), 0, "a numeric address went to the name service");
    cr_expect_eq(terse__store_resolves_in_flight(), 0);
}

Test(store, a_name_is_looked_up_on_a_helper_thread) {
    terse__store_gai_hook = quick_lookup;
    struct addrinfo *ai = NULL;
    cr_assert_eq(terse__store_resolve("rank0.example:5000", 0, now_ms() + 1000, &ai), TERSE_OK,
                 "%s", terse_last_error());
    cr_expect_eq(atomic_load(&lookups), 1);
    cr_expect_eq(ai->ai_family, AF_INET);
    cr_expect_eq(ntohs(((struct sockaddr_in *)ai->ai_addr)->sin_port), 5000);
    freeaddrinfo(ai);
    uint64_t end = now_ms() + 2000;
    while (terse__store_resolves_in_flight() && now_ms() < end) sleep_ms(1);
    cr_expect_eq(terse__store_resolves_in_flight(), 0, "the helper did not end");
}

/* The name service here has no network behind it, so the real lookup of a
 * reserved name fails at once; elsewhere it may instead take until the
 * deadline. Either way it must not take longer, and must name the host. */
Test(store, an_unresolvable_name_fails_naming_it_within_the_deadline) {
    struct addrinfo *ai = NULL;
    uint64_t t0 = now_ms();
    terse_status st = terse__store_resolve("nonexistent.invalid:5000", 0, t0 + 1500, &ai);
    uint64_t dt = now_ms() - t0;
    cr_expect(st == TERSE_ERR_INVALID || st == TERSE_ERR_TIMEOUT, "got %s",
              terse_status_name(st));
    cr_expect_null(ai);
    cr_expect_leq(dt, 1500 + plain_slack_ms(250), "took %llu ms", (unsigned long long)dt);
    cr_expect(strstr(terse_last_error(), "nonexistent.invalid"), "%s", terse_last_error());
    if (st == TERSE_ERR_INVALID)
        cr_expect(strstr(terse_last_error(), "cannot resolve the store address "
                                             "nonexistent.invalid:5000: "),
                  "%s", terse_last_error());
}

Test(store, a_lookup_that_hangs_times_out_at_the_deadline_and_cleans_up_after_itself) {
    terse__store_gai_hook = slow_lookup;
    struct addrinfo *ai = NULL;
    uint64_t t0 = now_ms();
    cr_expect_eq(terse__store_resolve("slow.example:5000", 0, t0 + 200, &ai), TERSE_ERR_TIMEOUT);
    uint64_t dt = now_ms() - t0;
    cr_expect(dt >= 195 && dt < 700, "gave up after %llu ms", (unsigned long long)dt);
    cr_expect_null(ai);
    cr_expect(strstr(terse_last_error(), "'slow.example'"), "%s", terse_last_error());
    const char *in = strstr(terse_last_error(), "no answer in ");
    unsigned waited = 0;
    cr_expect(in && sscanf(in, "no answer in %u ms", &waited) == 1 && waited >= 150 &&
                  waited < 700,
              "the time waited: %s", terse_last_error());
    /* The abandoned helper is still looking; when it ends it frees the
     * lookup and its result (LeakSanitizer checks the latter). */
    cr_expect_eq(terse__store_resolves_in_flight(), 1);
    uint64_t end = now_ms() + 4000;
    while (terse__store_resolves_in_flight() && now_ms() < end) sleep_ms(10);
    cr_expect_eq(terse__store_resolves_in_flight(), 0, "the abandoned helper did not end");
}

Test(store, joining_through_a_name_that_does_not_resolve_in_time_times_out) {
    terse__store_gai_hook = slow_lookup;
    terse__store *s = NULL;
    uint64_t t0 = now_ms();
    cr_expect_eq(terse__store_open("slow.example:5000", 1, 2, "t", 300, &s), TERSE_ERR_TIMEOUT);
    uint64_t dt = now_ms() - t0;
    cr_expect_null(s);
    cr_expect(dt >= 295 && dt < 800, "gave up after %llu ms", (unsigned long long)dt);
    cr_expect(strstr(terse_last_error(), "slow.example"), "%s", terse_last_error());
}
