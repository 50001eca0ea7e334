/* Where rank, size, address, provider, token and timeout come from: the
 * config, then TERSE_*, torchrun, Open MPI, PMI, Slurm. Criterion runs each
 * test in its own process, so setenv here never leaks into another test. */
#include <criterion/criterion.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "transport/launch_env.h"

static const char *const all_vars[] = {
    "TERSE_RANK",
    "TERSE_SIZE",
    "TERSE_ADDR",
    "TERSE_PROVIDER",
    "TERSE_TOKEN",
    "TERSE_TIMEOUT_MS",
    "RANK",
    "WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "PMI_RANK",
    "PMI_SIZE",
    "SLURM_PROCID",
    "SLURM_NTASKS",
};

/* Start from an environment with no launcher in it, whatever ran us. */
static void clear_env(void) {
    for (size_t i = 0; i < sizeof all_vars / sizeof all_vars[0]; i++) unsetenv(all_vars[i]);
}

TestSuite(launch, .init = clear_env);

static terse__launch resolve_ok(const terse_comm_config *cfg) {
    terse__launch l;
    terse_status st = terse__launch_resolve(cfg, &l);
    cr_assert_eq(st, TERSE_OK, "%s", terse_last_error());
    return l;
}

/* Resolving fails with TERSE_ERR_INVALID and the sentence holds `a` (and
 * `b` if given). */
static void expect_invalid(const terse_comm_config *cfg, const char *a, const char *b) {
    terse__launch l;
    cr_expect_eq(terse__launch_resolve(cfg, &l), TERSE_ERR_INVALID, "resolved: rank %d of %d",
                 l.rank, l.nranks);
    cr_expect(strstr(terse_last_error(), a), "'%s' not in: %s", a, terse_last_error());
    if (b) cr_expect(strstr(terse_last_error(), b), "'%s' not in: %s", b, terse_last_error());
}

static void job_env(const char *rank_var, const char *rank, const char *size_var,
                    const char *size) {
    setenv(rank_var, rank, 1);
    setenv(size_var, size, 1);
}

Test(launch, no_launcher_means_one_process_without_address_or_token) {
    terse__launch l = resolve_ok(NULL);
    cr_expect_eq(l.rank, 0);
    cr_expect_eq(l.nranks, 1);
    cr_expect_str_eq(l.provider, "auto");
    cr_expect_eq(l.timeout_ms, 60000);
    cr_expect_str_eq(l.addr, "");
    cr_expect_str_eq(l.token, "");
    terse_comm_config cfg = TERSE_COMM_CONFIG_INIT;
    l = resolve_ok(&cfg);
    cr_expect_eq(l.nranks, 1);
}

Test(launch, terse_variables) {
    job_env("TERSE_RANK", "2", "TERSE_SIZE", "4");
    setenv("TERSE_ADDR", "node7:29500", 1);
    setenv("TERSE_TOKEN", "s3cret", 1);
    setenv("TERSE_PROVIDER", "shm", 1);
    setenv("TERSE_TIMEOUT_MS", "4000", 1);
    terse__launch l = resolve_ok(NULL);
    cr_expect_eq(l.rank, 2);
    cr_expect_eq(l.nranks, 4);
    cr_expect_str_eq(l.addr, "node7:29500");
    cr_expect_str_eq(l.token, "s3cret");
    cr_expect_str_eq(l.provider, "shm");
    cr_expect_eq(l.timeout_ms, 4000);
    cr_expect_str_eq(l.source, "terse");
}

Test(launch, torchrun_variables_and_master_address) {
    job_env("RANK", "3", "WORLD_SIZE", "8");
    setenv("MASTER_ADDR", "10.1.2.3", 1);
    setenv("MASTER_PORT", "29500", 1);
    setenv("TERSE_TOKEN", "t", 1);
    terse__launch l = resolve_ok(NULL);
    cr_expect_eq(l.rank, 3);
    cr_expect_eq(l.nranks, 8);
    cr_expect_str_eq(l.addr, "10.1.2.3:29500");
    cr_expect_str_eq(l.source, "torchrun");
    /* An IPv6 MASTER_ADDR gets brackets, so the port stays unambiguous. */
    setenv("MASTER_ADDR", "::1", 1);
    l = resolve_ok(NULL);
    cr_expect_str_eq(l.addr, "[::1]:29500");
    /* TERSE_ADDR beats MASTER_ADDR:MASTER_PORT. */
    setenv("TERSE_ADDR", "127.0.0.1:1234", 1);
    l = resolve_ok(NULL);
    cr_expect_str_eq(l.addr, "127.0.0.1:1234");
}

Test(launch, open_mpi_pmi_and_slurm_variables) {
    setenv("TERSE_ADDR", "127.0.0.1:5000", 1);
    setenv("TERSE_TOKEN", "t", 1);
    static const struct {
        const char *rank, *size, *source;
    } l3[] = {{"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "Open MPI"},
              {"PMI_RANK", "PMI_SIZE", "PMI"},
              {"SLURM_PROCID", "SLURM_NTASKS", "Slurm"}};
    for (int i = 0; i < 3; i++) {
        clear_env();
        setenv("TERSE_ADDR", "127.0.0.1:5000", 1);
        setenv("TERSE_TOKEN", "t", 1);
        job_env(l3[i].rank, "1", l3[i].size, "3");
        terse__launch l = resolve_ok(NULL);
        cr_expect_eq(l.rank, 1, "%s", l3[i].source);
        cr_expect_eq(l.nranks, 3, "%s", l3[i].source);
        cr_expect_str_eq(l.source, l3[i].source);
    }
}

Test(launch, precedence_is_terse_torchrun_open_mpi_pmi_slurm) {
    setenv("TERSE_ADDR", "127.0.0.1:5000", 1);
    setenv("TERSE_TOKEN", "t", 1);
    /* Every launcher at once, each with its own rank (and size 10 + i). */
    static const char *const vars[][2] = {{"TERSE_RANK", "TERSE_SIZE"},
                                          {"RANK", "WORLD_SIZE"},
                                          {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},
                                          {"PMI_RANK", "PMI_SIZE"},
                                          {"SLURM_PROCID", "SLURM_NTASKS"}};
    char r[8], n[8];
    for (int i = 0; i < 5; i++) {
        snprintf(r, sizeof r, "%d", i);
        snprintf(n, sizeof n, "%d", 10 + i);
        job_env(vars[i][0], r, vars[i][1], n);
    }
    /* Remove the highest one at a time: the next one takes over. */
    for (int i = 0; i < 5; i++) {
        terse__launch l = resolve_ok(NULL);
        cr_expect_eq(l.rank, i);
        cr_expect_eq(l.nranks, 10 + i);
        unsetenv(vars[i][0]);
        unsetenv(vars[i][1]);
    }
}

Test(launch, config_fields_beat_the_environment) {
    job_env("TERSE_RANK", "1", "TERSE_SIZE", "2");
    setenv("TERSE_ADDR", "127.0.0.1:5000", 1);
    setenv("TERSE_TOKEN", "env-token", 1);
    setenv("TERSE_PROVIDER", "shm", 1);
    setenv("TERSE_TIMEOUT_MS", "4000", 1);
    terse_comm_config cfg = TERSE_COMM_CONFIG_INIT;
    cfg.rank = 3;
    cfg.nranks = 5;
    cfg.addr = "127.0.0.2:6000";
    cfg.token = "cfg-token";
    cfg.provider = "tcp";
    cfg.timeout_ms = 777;
    terse__launch l = resolve_ok(&cfg);
    cr_expect_eq(l.rank, 3);
    cr_expect_eq(l.nranks, 5);
    cr_expect_str_eq(l.addr, "127.0.0.2:6000");
    cr_expect_str_eq(l.token, "cfg-token");
    cr_expect_str_eq(l.provider, "tcp");
    cr_expect_eq(l.timeout_ms, 777);
    cr_expect_str_eq(l.source, "the config");
    /* A rank from the config and a size from the environment mix. */
    cfg.nranks = -1;
    cfg.rank = 0;
    l = resolve_ok(&cfg);
    cr_expect_eq(l.nranks, 2);
    cr_expect(strstr(l.source, "TERSE_SIZE"), "%s", l.source);
}

Test(launch, a_config_from_an_older_header_leaves_later_fields_to_the_environment) {
    job_env("TERSE_RANK", "1", "TERSE_SIZE", "2");
    setenv("TERSE_ADDR", "127.0.0.1:5000", 1);
    setenv("TERSE_TOKEN", "env-token", 1);
    terse_comm_config cfg = TERSE_COMM_CONFIG_INIT;
    cfg.size = offsetof(terse_comm_config, addr); /* knew only size, rank, nranks */
    cfg.rank = 0;
    cfg.addr = "garbage that must not be read";
    terse__launch l = resolve_ok(&cfg);
    cr_expect_eq(l.rank, 0);
    cr_expect_str_eq(l.addr, "127.0.0.1:5000");
    cfg.size = 0;
    expect_invalid(&cfg, "TERSE_COMM_CONFIG_INIT", NULL);
}

Test(launch, malformed_numbers_name_the_variable_and_value) {
    static const char *const bad[] = {"abc", "-1", " 1",          "1 ",  "1x",
                                      "+1",  "",   "99999999999", "0x10"};
    setenv("WORLD_SIZE", "4", 1);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        setenv("RANK", bad[i], 1);
        char want[64];
        snprintf(want, sizeof want, "RANK='%s'", bad[i]);
        expect_invalid(NULL, want, NULL);
    }
    setenv("RANK", "0", 1);
    setenv("WORLD_SIZE", "0", 1);
    expect_invalid(NULL, "WORLD_SIZE='0'", "at least 1");
    setenv("WORLD_SIZE", "4", 1);
    setenv("TERSE_TIMEOUT_MS", "5s", 1);
    expect_invalid(NULL, "TERSE_TIMEOUT_MS='5s'", NULL);
    setenv("TERSE_TIMEOUT_MS", "0", 1);
    expect_invalid(NULL, "TERSE_TIMEOUT_MS='0'", NULL);
}

Test(launch, rank_must_be_below_the_size) {
    job_env("SLURM_PROCID", "4", "SLURM_NTASKS", "4");
    expect_invalid(NULL, "rank 4 (from SLURM_PROCID)", "job size 4 (from SLURM_NTASKS)");
    terse_comm_config cfg = TERSE_COMM_CONFIG_INIT;
    cfg.rank = 7;
    cfg.nranks = 2;
    expect_invalid(&cfg, "rank 7", "job size 2");
}

Test(launch, half_a_launcher_is_refused) {
    setenv("RANK", "1", 1);
    expect_invalid(NULL, "no job size", "RANK");
    unsetenv("RANK");
    setenv("PMI_SIZE", "3", 1);
    expect_invalid(NULL, "no rank", "PMI_SIZE");
    /* A job of one needs no rank variable. */
    setenv("PMI_SIZE", "1", 1);
    terse__launch l = resolve_ok(NULL);
    cr_expect_eq(l.rank, 0);
    cr_expect_eq(l.nranks, 1);
}

Test(launch, more_than_one_rank_needs_an_address_and_a_token) {
    job_env("TERSE_RANK", "0", "TERSE_SIZE", "2");
    setenv("TERSE_TOKEN", "t", 1);
    expect_invalid(NULL, "TERSE_ADDR", "MASTER_ADDR");
    setenv("MASTER_ADDR", "localhost", 1);
    expect_invalid(NULL, "MASTER_PORT is not", NULL);
    setenv("MASTER_PORT", "abc", 1);
    expect_invalid(NULL, "MASTER_PORT='abc'", NULL);
    setenv("MASTER_PORT", "70000", 1);
    expect_invalid(NULL, "MASTER_PORT='70000'", NULL);
    setenv("TERSE_ADDR", "localhost", 1);
    expect_invalid(NULL, "TERSE_ADDR='localhost'", "port");
    setenv("TERSE_ADDR", "localhost:0", 1);
    expect_invalid(NULL, "TERSE_ADDR='localhost:0'", "port 0");
    setenv("TERSE_ADDR", ":5000", 1);
    expect_invalid(NULL, "TERSE_ADDR=':5000'", "empty host");
    setenv("TERSE_ADDR", "localhost:5000", 1);
    unsetenv("TERSE_TOKEN");
    expect_invalid(NULL, "TERSE_TOKEN", "rank 0 of 2");
    setenv("TERSE_TOKEN", "", 1);
    expect_invalid(NULL, "TERSE_TOKEN is empty", NULL);
}

Test(launch, the_token_is_never_printed) {
    job_env("TERSE_RANK", "0", "TERSE_SIZE", "2");
    setenv("TERSE_ADDR", "localhost:5000", 1);
    char tok[400];
    memset(tok, 'Q', sizeof tok - 1);
    tok[sizeof tok - 1] = '\0';
    setenv("TERSE_TOKEN", tok, 1);
    terse__launch l;
    cr_expect_eq(terse__launch_resolve(NULL, &l), TERSE_ERR_INVALID);
    cr_expect(strstr(terse_last_error(), "399 bytes"), "%s", terse_last_error());
    cr_expect(!strstr(terse_last_error(), "QQQQ"), "%s", terse_last_error());
    cr_expect_str_eq(l.token, "");
}

Test(launch, provider_must_be_a_known_name) {
    static const char *const good[] = {"shm", "tcp", "verbs", "efa", "auto"};
    for (size_t i = 0; i < 5; i++) {
        setenv("TERSE_PROVIDER", good[i], 1);
        cr_expect_str_eq(resolve_ok(NULL).provider, good[i]);
    }
    static const char *const bad[] = {"TCP", "tcp;ofi_rxm", "sockets", "", "shm "};
    for (size_t i = 0; i < 5; i++) {
        setenv("TERSE_PROVIDER", bad[i], 1);
        char want[64];
        snprintf(want, sizeof want, "TERSE_PROVIDER='%s'", bad[i]);
        expect_invalid(NULL, want, "shm, tcp, rxm, verbs, efa, net or auto");
    }
    unsetenv("TERSE_PROVIDER");
    terse_comm_config cfg = TERSE_COMM_CONFIG_INIT;
    cfg.provider = "ib";
    expect_invalid(&cfg, "config provider='ib'", NULL);
}

Test(launch, bad_config_values_are_refused) {
    terse_comm_config cfg = TERSE_COMM_CONFIG_INIT;
    cfg.rank = -2;
    expect_invalid(&cfg, "config rank -2", NULL);
    cfg.rank = -1;
    cfg.nranks = 0;
    expect_invalid(&cfg, "config nranks 0", NULL);
    cfg.nranks = -1;
    cfg.timeout_ms = -5;
    expect_invalid(&cfg, "config timeout_ms -5", NULL);
    cr_expect_eq(terse__launch_resolve(&cfg, NULL), TERSE_ERR_INVALID);
}

Test(launch_env, token_shorter_than_16_bytes_is_refused) {
    const char *keep = getenv("TERSE_ALLOW_SHORT_TOKEN");
    unsetenv("TERSE_ALLOW_SHORT_TOKEN");
    terse_comm_config cfg = TERSE_COMM_CONFIG_INIT;
    cfg.rank = 0, cfg.nranks = 2, cfg.addr = "127.0.0.1:1", cfg.token = "fifteen-bytes!!";
    terse__launch L;
    cr_expect_eq(terse__launch_resolve(&cfg, &L), TERSE_ERR_INVALID);
    cr_expect(strstr(terse_last_error(), "at least 16"), "%s", terse_last_error());
    cr_expect(!strstr(terse_last_error(), "fifteen"), "the sentence quotes the token");
    cfg.token = "sixteen-bytes!!!";
    cr_expect_eq(terse__launch_resolve(&cfg, &L), TERSE_OK, "%s", terse_last_error());
    if (keep) setenv("TERSE_ALLOW_SHORT_TOKEN", keep, 1);
}
