/* The libfabric transport within one process: provider selection and its
 * sentences, name checks, argument checks, chunking and registration over
 * self-messages, and the state after a timeout. Multi-process behaviour is
 * in test_fabric.c. */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "transport/fabric.h"
#include "transport/fabric_impl.h"

#define NAME_CAP 1024

static uint64_t in_ms(int ms) { return terse__now_ns() + (uint64_t)ms * 1000000u; }

static uint8_t pattern(size_t j, uint64_t tag) { return (uint8_t)(j * 131 + (j >> 11) + tag * 7); }

Test(fabric_local, unknown_provider_is_invalid_and_named) {
    terse__fabric *f = (terse__fabric *)1;
    cr_assert_eq(terse__fabric_open("carrier-pigeon", 1, 0, 1, &f), TERSE_ERR_INVALID);
    cr_expect_null(f);
    cr_expect(strstr(terse_last_error(), "carrier-pigeon"), "%s", terse_last_error());
    cr_expect_eq(terse__fabric_open(NULL, 1, 0, 1, &f), TERSE_ERR_INVALID);
    cr_expect_eq(terse__fabric_open("shm", 1, 2, 2, &f), TERSE_ERR_INVALID);
}

static void expect_absent(const char *prov) {
    terse__fabric *f = NULL;
    cr_assert_eq(terse__fabric_open(prov, 0, 0, 2, &f), TERSE_ERR_TRANSPORT, "%s",
                 terse_last_error());
    cr_expect_null(f);
    const char *e = terse_last_error();
    cr_expect(strstr(e, prov), "%s", e);
    cr_expect(strstr(e, "fi_getinfo offers: "), "%s", e);
    cr_expect(strstr(e, "tcp;ofi_rxm") && strstr(e, "shm"), "%s", e);
}

/* This machine has neither (the tests are about the message, so they
 * would need revisiting on one that does). */
Test(fabric_local, absent_verbs_fails_listing_what_is_offered) { expect_absent("verbs"); }
Test(fabric_local, absent_efa_fails_listing_what_is_offered) { expect_absent("efa"); }

Test(fabric_local, auto_picks_shm_on_one_host_and_a_network_otherwise) {
    terse__fabric *f = NULL;
    cr_assert_eq(terse__fabric_open("auto", 1, 0, 2, &f), TERSE_OK, "%s", terse_last_error());
    cr_expect_str_eq(terse__fabric_provider(f), "shm");
    terse__fabric_close(f);
    cr_assert_eq(terse__fabric_open("auto", 0, 0, 2, &f), TERSE_OK, "%s", terse_last_error());
    cr_expect_str_neq(terse__fabric_provider(f), "shm");
    terse__fabric_close(f);
    cr_assert_eq(terse__fabric_open("tcp;ofi_rxm", 1, 0, 2, &f), TERSE_OK); /* libfabric's name */
    cr_expect_str_eq(terse__fabric_provider(f), "tcp;ofi_rxm");
    terse__fabric_close(f);
}

static uint32_t name_ipv4(terse__fabric *f) {
    uint8_t name[NAME_CAP];
    size_t len = sizeof name;
    cr_assert_eq(terse__fabric_name(f, name, &len), TERSE_OK);
    struct sockaddr_in sin;
    memcpy(&sin, name + TERSE__NAME_ADDR_OFF, sizeof sin);
    cr_assert_eq(sin.sin_family, AF_INET);
    return ntohl(sin.sin_addr.s_addr);
}

Test(fabric_local, tcp_interface_comes_from_terse_iface) {
    terse__fabric *f = NULL;
    setenv("TERSE_IFACE", "lo", 1);
    cr_assert_eq(terse__fabric_open("tcp", 0, 0, 2, &f), TERSE_OK, "%s", terse_last_error());
    cr_expect_eq(name_ipv4(f), 0x7f000001u);
    terse__fabric_close(f);
    setenv("TERSE_IFACE", "nosuch0", 1);
    cr_assert_eq(terse__fabric_open("tcp", 1, 0, 2, &f), TERSE_ERR_TRANSPORT);
    cr_expect(strstr(terse_last_error(), "nosuch0") && strstr(terse_last_error(), "lo"), "%s",
              terse_last_error());
    unsetenv("TERSE_IFACE");
    /* one host and no TERSE_IFACE: loopback */
    cr_assert_eq(terse__fabric_open("tcp", 1, 0, 2, &f), TERSE_OK, "%s", terse_last_error());
    cr_expect_eq(name_ipv4(f) >> 24, 127u);
    terse__fabric_close(f);
}

Test(fabric_local, bad_chunk_size_is_invalid) {
    terse__fabric *f = NULL;
    setenv("TERSE_CHUNK_BYTES", "lots", 1);
    cr_assert_eq(terse__fabric_open("shm", 1, 0, 1, &f), TERSE_ERR_INVALID);
    cr_expect(strstr(terse_last_error(), "TERSE_CHUNK_BYTES"), "%s", terse_last_error());
    setenv("TERSE_CHUNK_BYTES", "0", 1);
    cr_expect_eq(terse__fabric_open("shm", 1, 0, 1, &f), TERSE_ERR_INVALID);
}

/* Two endpoints of a 2-rank job in this process; set_peers checks names. */
Test(fabric_local, set_peers_refuses_disagreeing_or_misordered_names) {
    terse__fabric *a = NULL, *b = NULL;
    uint8_t names[2 * TERSE__FABRIC_NAME_BYTES], swapped[2 * TERSE__FABRIC_NAME_BYTES];
    size_t len = TERSE__FABRIC_NAME_BYTES;
    cr_assert_eq(terse__fabric_open("shm", 1, 0, 2, &a), TERSE_OK);
    setenv("TERSE_CHUNK_BYTES", "64k", 1);
    cr_assert_eq(terse__fabric_open("shm", 1, 1, 2, &b), TERSE_OK);
    cr_assert_eq(terse__fabric_name(a, names, &len), TERSE_OK);
    cr_assert_eq(terse__fabric_name(b, names + len, &len), TERSE_OK);
    cr_expect_eq(terse__fabric_set_peers(a, names, len), TERSE_ERR_INVALID);
    cr_expect(strstr(terse_last_error(), "TERSE_CHUNK_BYTES"), "%s", terse_last_error());
    terse__fabric_close(b);
    unsetenv("TERSE_CHUNK_BYTES");
    cr_assert_eq(terse__fabric_open("shm", 1, 1, 2, &b), TERSE_OK);
    cr_assert_eq(terse__fabric_name(b, names + len, &len), TERSE_OK);
    memcpy(swapped, names + len, len);
    memcpy(swapped + len, names, len);
    cr_expect_eq(terse__fabric_set_peers(a, swapped, len), TERSE_ERR_INVALID);
    cr_expect(strstr(terse_last_error(), "rank order"), "%s", terse_last_error());
    cr_expect_eq(terse__fabric_set_peers(a, names, len - 1), TERSE_ERR_INVALID);
    cr_expect_eq(terse__fabric_set_peers(a, names, len), TERSE_OK, "%s", terse_last_error());
    cr_expect_eq(terse__fabric_set_peers(a, names, len), TERSE_ERR_INVALID); /* twice */
    terse__fabric_close(a);
    terse__fabric_close(b);
}

/* A one-rank job: the endpoint is its own peer. */
static void join_self(terse__fabric *f) {
    uint8_t name[NAME_CAP];
    size_t len = sizeof name;
    cr_assert_eq(terse__fabric_name(f, name, &len), TERSE_OK);
    cr_assert_eq(terse__fabric_set_peers(f, name, len), TERSE_OK, "%s", terse_last_error());
}

static terse__fabric *open_self(const char *prov) {
    terse__fabric *f = NULL;
    cr_assert_eq(terse__fabric_open(prov, 1, 0, 1, &f), TERSE_OK, "%s", terse_last_error());
    join_self(f);
    return f;
}

/* Send an 8-byte string to ourselves (tag 1) and check it arrives. */
static void echo_self(terse__fabric *f, const char *msg) {
    uint8_t in[8] = {0};
    terse__fabric_req r[2];
    cr_assert_eq(terse__fabric_irecv(f, 0, 1, in, 8, &r[0]), TERSE_OK);
    cr_assert_eq(terse__fabric_isend(f, 0, 1, msg, 8, &r[1]), TERSE_OK);
    cr_assert_eq(terse__fabric_wait(f, r, 2, in_ms(5000), NULL, NULL), TERSE_OK, "%s",
                 terse_last_error());
    cr_expect_str_eq((char *)in, msg);
}

/* A file under the name libfabric's shm would give our region
 * ("PID:UID:N" in /dev/shm): what a SIGKILLed process whose pid we got
 * leaves behind, or what a local process plants to keep a job from
 * starting. libfabric 1.17 refuses fi_enable with EBUSY over such a file;
 * terse names its regions itself, so the endpoint opens, works, and
 * leaves the planted files alone. */
Test(fabric_local, shm_opens_over_a_dead_or_planted_region_under_its_default_name) {
    char path[8][64];
    for (int k = 0; k < 8; k++) {
        snprintf(path[k], sizeof path[k], "/%d:%u:%d", (int)getpid(), (unsigned)getuid(), k);
        int fd = shm_open(path[k], O_RDWR | O_CREAT | O_TRUNC, 0600);
        cr_assert(fd >= 0, "shm_open %s", path[k]);
        cr_assert_eq(ftruncate(fd, 4096), 0);
        close(fd);
    }
    terse__fabric *f = NULL;
    terse_status st = terse__fabric_open("shm", 1, 0, 1, &f);
    char why[300];
    snprintf(why, sizeof why, "%s", st == TERSE_OK ? "" : terse_last_error());
    int kept = 0;
    for (int k = 0; k < 8; k++) { /* the files are left as they were; then removed */
        int fd = shm_open(path[k], O_RDONLY, 0);
        kept += fd >= 0;
        if (fd >= 0) close(fd);
        shm_unlink(path[k]);
    }
    cr_assert_eq(st, TERSE_OK, "%s", why);
    cr_expect_eq(kept, 8);
    join_self(f);
    echo_self(f, "planted");
    terse__fabric_close(f);
}

Test(fabric_local, misuse_is_invalid_and_leaves_the_fabric_usable) {
    terse__fabric *f = NULL;
    terse__fabric_req q;
    uint8_t b[8] = {0};
    cr_assert_eq(terse__fabric_open("shm", 1, 0, 1, &f), TERSE_OK);
    cr_expect_eq(terse__fabric_isend(f, 0, 1, b, 8, &q), TERSE_ERR_INVALID); /* no peers yet */
    terse__fabric_close(f);
    f = open_self("shm");
    cr_expect_eq(terse__fabric_isend(f, 1, 1, b, 8, &q), TERSE_ERR_INVALID);
    cr_expect_eq(terse__fabric_irecv(f, -1, 1, b, 8, &q), TERSE_ERR_INVALID);
    cr_expect_eq(terse__fabric_isend(f, 0, (uint64_t)1 << 48, b, 8, &q), TERSE_ERR_INVALID);
    cr_expect(strstr(terse_last_error(), "top 16 bits"), "%s", terse_last_error());
    cr_expect_eq(terse__fabric_irecv(f, 0, 1, NULL, 8, &q), TERSE_ERR_INVALID);
    echo_self(f, "abcdefg");
    terse__fabric_close(f);
}

static void self_chunks(const char *prov, const char *force_mr) {
    setenv("TERSE_CHUNK_BYTES", "1000", 1);
    if (force_mr) setenv("TERSE_FABRIC_REGISTER", force_mr, 1);
    terse__fabric *f = open_self(prov);
    size_t n = 20 * 1000 + 1; /* 21 chunks, more than a window */
    uint8_t *out = malloc(n), *in = calloc(n, 1), z;
    for (size_t j = 0; j < n; j++) out[j] = pattern(j, 4);
    terse__fabric_req r[4];
    cr_assert_eq(terse__fabric_irecv(f, 0, 4, in, n, &r[0]), TERSE_OK);
    cr_assert_eq(terse__fabric_irecv(f, 0, 5, &z, 0, &r[1]), TERSE_OK);
    cr_assert_eq(terse__fabric_isend(f, 0, 5, NULL, 0, &r[2]), TERSE_OK);
    cr_assert_eq(terse__fabric_isend(f, 0, 4, out, n, &r[3]), TERSE_OK);
    cr_expect_eq(r[0].chunks, 21);
    cr_assert_eq(terse__fabric_wait(f, r, 4, in_ms(10000), NULL, NULL), TERSE_OK, "%s",
                 terse_last_error());
    for (size_t j = 0; j < n; j++) cr_assert_eq(in[j], pattern(j, 4), "byte %zu", j);
    uint64_t sent, recv;
    terse__fabric_counters(f, &sent, &recv);
    cr_expect_eq(sent, n);
    cr_expect_eq(recv, n);
    /* a deadline already past still reports completed requests as done */
    cr_expect_eq(terse__fabric_wait(f, r, 4, 0, NULL, NULL), TERSE_OK);
    terse__fabric_close(f);
    free(out);
    free(in);
}

Test(fabric_local, shm_self_messages_chunk_and_zero_length_work) { self_chunks("shm", NULL); }
Test(fabric_local, tcp_self_messages_chunk_and_zero_length_work) { self_chunks("tcp", NULL); }
Test(fabric_local, registered_self_messages_work) { self_chunks("shm", "1"); }

Test(fabric_local, after_a_timeout_only_close_is_allowed) {
    terse__fabric *f = open_self("shm");
    uint8_t b[16];
    terse__fabric_req q;
    cr_assert_eq(terse__fabric_irecv(f, 0, 9, b, sizeof b, &q), TERSE_OK);
    cr_assert_eq(terse__fabric_wait(f, &q, 1, in_ms(50), NULL, NULL), TERSE_ERR_TIMEOUT);
    cr_expect(strstr(terse_last_error(), "receiving from rank 0 (tag 0x9, 0 of 16 bytes done"),
              "%s", terse_last_error());
    cr_expect_eq(terse__fabric_isend(f, 0, 9, b, sizeof b, &q), TERSE_ERR_TIMEOUT);
    cr_expect(strstr(terse_last_error(), "only be closed"), "%s", terse_last_error());
    terse__fabric_close(f); /* with the receive still posted */
}

/* fi_tinject 1000 bytes to ourselves; a wait on no requests is one
 * progress round, which the provider may need before it takes them. */
static ssize_t inject(terse__fabric *f, const uint8_t *p, uint64_t tag) {
    ssize_t ret;
    uint64_t deadline = in_ms(5000);
    while ((ret = fi_tinject(f->ep, p, 1000, f->addrs[0], tag)) == -FI_EAGAIN &&
           terse__now_ns() < deadline)
        cr_assert_eq(terse__fabric_wait(f, NULL, 0, deadline, NULL, NULL), TERSE_OK);
    return ret;
}

/* The wire contract: chunk i of a message travels as tag | i << 48, so a
 * provider that reorders chunks cannot mix them up. shm and tcp keep order,
 * so play the reordering provider: inject chunk 1 before chunk 0 by hand. */
Test(fabric_local, chunks_are_matched_by_index_not_arrival_order) {
    setenv("TERSE_CHUNK_BYTES", "1000", 1);
    terse__fabric *f = open_self("shm");
    cr_assert_geq(f->inject_bytes, 1000);
    uint8_t out[2000], in[2000] = {0};
    for (size_t j = 0; j < sizeof out; j++) out[j] = pattern(j, 7);
    terse__fabric_req r;
    cr_assert_eq(terse__fabric_irecv(f, 0, 7, in, sizeof in, &r), TERSE_OK);
    cr_assert_eq(r.chunks, 2);
    cr_assert_eq(inject(f, out + 1000, 7 | (uint64_t)1 << 48), 0);
    cr_assert_eq(inject(f, out, 7), 0);
    cr_assert_eq(terse__fabric_wait(f, &r, 1, in_ms(5000), NULL, NULL), TERSE_OK, "%s",
                 terse_last_error());
    cr_expect_arr_eq(in, out, sizeof out);
    terse__fabric_close(f);
}
