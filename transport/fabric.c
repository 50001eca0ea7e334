/* The libfabric endpoint's life: open (fabric, domain, CQ, AV, endpoint,
 * sized from what the provider reports), the address blob ranks exchange,
 * filling the AV in rank order, and close. Posting and progress live in
 * fabric_msg.c, waiting and quiesce in fabric_wait.c, provider selection
 * in fabric_info.c. */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "common/bytes.h"
#include "common/env.h"
#include "common/error.h"
#include "transport/fabric_impl.h"

#define DEFAULT_CHUNK_BYTES ((size_t)1 << 20)
/* Slot pools are sized by the provider's queue depths but capped: beyond
 * a few hundred operations in flight nothing gets faster, and the cap keeps
 * the pools (and the CQ) small. */
#define MAX_SLOTS_PER_DIRECTION 1024
/* Used when a provider reports a queue depth of 0 ("no limit stated"). */
#define FALLBACK_SLOTS 64

static const uint8_t name_magic[4] = {'T', 'F', 'A', 'B'};

uint64_t terse__now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* A size rxm reads from the environment (its defaults otherwise). */
static size_t env_size(const char *name, size_t dflt) {
    const char *v = getenv(name);
    char *end = NULL;
    unsigned long long x = v ? strtoull(v, &end, 10) : 0;
    return v && end != v && *end == '\0' ? (size_t)x : dflt;
}

static size_t queue_slots(size_t depth) {
    if (depth == 0) return FALLBACK_SLOTS;
    return depth < MAX_SLOTS_PER_DIRECTION ? depth : MAX_SLOTS_PER_DIRECTION;
}

/* Carve the slot array into the two free lists. */
static terse_status make_slots(terse__fabric *f) {
    f->tx_slots = queue_slots(f->info->tx_attr->size);
    f->rx_slots = queue_slots(f->info->rx_attr->size);
    f->slots = calloc(f->tx_slots + f->rx_slots, sizeof *f->slots);
    if (!f->slots)
        return TERSE_ERROR(TERSE_ERR_NOMEM, "rank %d: no memory for %zu operation contexts",
                           f->rank, f->tx_slots + f->rx_slots);
    for (size_t i = 0; i < f->tx_slots + f->rx_slots; i++) {
        terse__fabric_slot **list = i < f->tx_slots ? &f->tx_free : &f->rx_free;
        f->slots[i].next_free = *list;
        *list = &f->slots[i];
    }
    return TERSE_OK;
}

#define FI_TRY(call, what)                                                              \
    do {                                                                                \
        int fi_ret_ = (call);                                                           \
        if (fi_ret_ != 0) {                                                             \
            st = TERSE_ERROR(TERSE_ERR_TRANSPORT, "rank %d: %s on provider %s failed: %s", \
                             f->rank, what, f->provider, fi_strerror(-fi_ret_));        \
            goto fail;                                                                  \
        }                                                                               \
    } while (0)

/* shm names its region in /dev/shm after the pid and a per-process
 * counter ("PID:UID:0"). A region left by a SIGKILLed process keeps its
 * file; when a later process gets the same pid, libfabric 1.17 finds the
 * file, sees the pid it records alive (the newcomer itself) and refuses
 * fi_enable with EBUSY -- seen in CI after the kill tests. A process of
 * the same user could also plant the predictable file to stop a job
 * joining. So the region gets a name of our own before enable: still
 * starting "PID:" (tests and operators find a dead rank's leftovers by
 * pid), then 128 random bits. Peers learn it through the store. */
static terse_status name_shm_region(terse__fabric *f) {
    uint8_t rnd[16];
    if (getrandom(rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd)
        return TERSE_ERROR(TERSE_ERR_TRANSPORT, "rank %d: getrandom for the shm region's name failed",
                           f->rank);
    char name[96];
    int used = snprintf(name, sizeof name, "fi_shm://%d:%u:terse-", (int)getpid(),
                        (unsigned)getuid());
    for (size_t i = 0; i < sizeof rnd; i++)
        used += snprintf(name + used, sizeof name - (size_t)used, "%02x", rnd[i]);
    int ret = fi_setname(&f->ep->fid, name, (size_t)used + 1);
    if (ret != 0)
        return TERSE_ERROR(TERSE_ERR_TRANSPORT, "rank %d: naming the shm region failed: %s",
                           f->rank, fi_strerror(-ret));
    return TERSE_OK;
}

/* Open the objects in dependency order: fabric -> domain -> CQ and AV ->
 * endpoint bound to both -> enable. */
static terse_status open_objects(terse__fabric *f) {
    terse_status st = TERSE_OK;
    struct fi_info *info = f->info;
    FI_TRY(fi_fabric(info->fabric_attr, &f->fabric, NULL), "fi_fabric");
    FI_TRY(fi_domain(f->fabric, info, &f->domain, NULL), "fi_domain");

    /* Every posted chunk produces exactly one completion, and at most
     * tx_slots + rx_slots are posted, so this CQ cannot overrun. No wait
     * object: we poll (manual progress). */
    struct fi_cq_attr cq_attr = {0};
    cq_attr.format = FI_CQ_FORMAT_TAGGED;
    cq_attr.size = f->tx_slots + f->rx_slots + TERSE__EARLY_RECEIVING_MAX + 1;
    cq_attr.wait_obj = FI_WAIT_NONE;
    FI_TRY(fi_cq_open(f->domain, &cq_attr, &f->cq, NULL), "fi_cq_open");

    /* FI_AV_TABLE: addresses are indices in insertion (= rank) order. */
    struct fi_av_attr av_attr = {0};
    av_attr.type = FI_AV_TABLE;
    av_attr.count = (size_t)f->nranks;
    FI_TRY(fi_av_open(f->domain, &av_attr, &f->av, NULL), "fi_av_open");

    FI_TRY(fi_endpoint(f->domain, info, &f->ep, NULL), "fi_endpoint");
    FI_TRY(fi_ep_bind(f->ep, &f->av->fid, 0), "binding the AV to the endpoint");
    FI_TRY(fi_ep_bind(f->ep, &f->cq->fid, FI_TRANSMIT | FI_RECV),
           "binding the CQ to the endpoint");
    if (strcmp(f->provider, "shm") == 0) TERSE_CHECK_GOTO(name_shm_region(f), st, fail);
    FI_TRY(fi_enable(f->ep), "fi_enable");
fail:
    return st;
}

/* The slots hold each chunk's MAC, sent and received as a second iov
 * entry: where the provider wants local buffers registered, so are they. */
static terse_status register_slots(terse__fabric *f) {
    uint64_t key = f->mr_prov_key ? 0 : f->next_mr_key++;
    size_t bytes = (f->tx_slots + f->rx_slots) * sizeof *f->slots;
    int ret = fi_mr_reg(f->domain, f->slots, bytes, FI_SEND | FI_RECV, 0, key, 0, &f->slots_mr,
                        NULL);
    if (ret == 0 && f->mr_endpoint) {
        ret = fi_mr_bind(f->slots_mr, &f->ep->fid, 0);
        if (ret == 0) ret = fi_mr_enable(f->slots_mr);
    }
    if (ret != 0)
        return TERSE_ERROR(TERSE_ERR_TRANSPORT, "rank %d: registering the MAC slots on %s failed: %s",
                           f->rank, f->provider, fi_strerror(-ret));
    f->slots_desc = fi_mr_desc(f->slots_mr);
    return TERSE_OK;
}

/* Debian's libfabric links libpsm-infinipath, whose constructor (run when
 * libfabric loads, before main) installs one handler for SIGSEGV, SIGBUS,
 * SIGABRT, SIGILL, SIGINT and SIGTERM that prints a backtrace and calls
 * exit(1): a crash then looks like an ordinary failure, no core is
 * written, SIGTERM and Ctrl-C end the process with status 1, and Python's
 * KeyboardInterrupt never comes. IPATH_NO_BACKTRACE=1 in the environment
 * before the process starts prevents it (terse-run and the Python package
 * set it). For programs started otherwise, the first fabric open puts back
 * the default action of every such signal whose handler is still that
 * library's -- a handler the program installed itself is left alone. */
static void undo_psm_handlers(void) {
    static const int sigs[] = {SIGSEGV, SIGBUS, SIGABRT, SIGILL, SIGINT, SIGTERM, SIGFPE};
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) {
        struct sigaction sa;
        if (sigaction(sigs[i], NULL, &sa) != 0) continue;
        void *h = (sa.sa_flags & SA_SIGINFO) ? (void *)sa.sa_sigaction : (void *)sa.sa_handler;
        if (h == (void *)SIG_DFL || h == (void *)SIG_IGN) continue;
        Dl_info d;
        if (dladdr(h, &d) && d.dli_fname && strstr(d.dli_fname, "libinfinipath")) {
            struct sigaction dfl;
            memset(&dfl, 0, sizeof dfl);
            dfl.sa_handler = SIG_DFL;
            sigemptyset(&dfl.sa_mask);
            sigaction(sigs[i], &dfl, NULL);
        }
    }
}

static pthread_once_t psm_once = PTHREAD_ONCE_INIT;

terse_status terse__fabric_open(const char *provider, int same_host, int rank, int nranks,
                                terse__fabric **out) {
    terse_status st;
    pthread_once(&psm_once, undo_psm_handlers);
    if (!out) return TERSE_ERROR(TERSE_ERR_INVALID, "fabric_open: out is NULL");
    *out = NULL;
    if (!provider)
        return TERSE_ERROR(TERSE_ERR_INVALID, "rank %d: fabric_open: provider is NULL", rank);
    if (nranks < 1 || rank < 0 || rank >= nranks)
        return TERSE_ERROR(TERSE_ERR_INVALID, "fabric_open: rank %d is not in [0, %d)", rank,
                           nranks);
    size_t chunk;
    TERSE_CHECK(terse__env_bytes("TERSE_CHUNK_BYTES", DEFAULT_CHUNK_BYTES, 1, SIZE_MAX, &chunk));
    static const char *const flags[] = {"0", "1", NULL};
    int force_mr = 0;
    TERSE_CHECK(terse__env_choice("TERSE_FABRIC_REGISTER", flags, 0, &force_mr));

    terse__fabric *f = calloc(1, sizeof *f);
    if (!f) return TERSE_ERROR(TERSE_ERR_NOMEM, "rank %d: no memory for the fabric", rank);
    f->rank = rank;
    f->nranks = nranks;
    TERSE_CHECK_GOTO(terse__fabric_select(provider, same_host, rank, &f->info), st, fail);
    snprintf(f->provider, sizeof f->provider, "%s", f->info->fabric_attr->prov_name);
    /* rxm accepts connections from any address and queues their messages
     * forever: TERSE_SWEEP=1 sweeps its unexpected queue (fabric_sweep.c,
     * "Strangers"; off by default, see terse.h). */
    int sweep = 0;
    TERSE_CHECK_GOTO(terse__env_choice("TERSE_SWEEP", flags, 0, &sweep), st, fail);
    f->sweep = sweep && strstr(f->provider, "ofi_rxm") != NULL;
    /* shm: TERSE_SHM_RESCUE=1 releases a lock a dead process left taken
     * (fabric_shm.c; off by default, see terse.h). */
    int rescue = 0;
    TERSE_CHECK_GOTO(terse__env_choice("TERSE_SHM_RESCUE", flags, 0, &rescue), st, fail);
    f->shm_rescue = rescue && strcmp(f->provider, "shm") == 0;
    /* TERSE_TRACE_TAGS=1: one stderr line per chunk posted and completed
     * (finding a message no receive matches; terse.h). */
    TERSE_CHECK_GOTO(terse__env_choice("TERSE_TRACE_TAGS", flags, 0, &f->trace_tags), st, fail);
    /* rxm's eager limit: its buffer size, or the eager limit if set lower. */
    const size_t rxm_buffer = env_size("FI_OFI_RXM_BUFFER_SIZE", 16384);
    const size_t rxm_limit = env_size("FI_OFI_RXM_EAGER_LIMIT", rxm_buffer);
    f->rxm_eager = rxm_limit < rxm_buffer ? rxm_limit : rxm_buffer;
    snprintf(f->domain_name, sizeof f->domain_name, "%s",
             f->info->domain_attr->name ? f->info->domain_attr->name : "?");

    /* Obey the limits the provider reports. */
    f->max_msg = f->info->ep_attr->max_msg_size ? f->info->ep_attr->max_msg_size : SIZE_MAX;
    f->chunk_bytes = chunk < f->max_msg ? chunk : f->max_msg;
    f->open_chunk_bytes = f->chunk_bytes;
    f->inject_bytes = f->info->tx_attr->inject_size;
    uint64_t mr_mode = (uint64_t)f->info->domain_attr->mr_mode;
    if (mr_mode & ~(uint64_t)TERSE__MR_SUPPORTED) {
        /* The hints exclude these bits, so a conforming provider never
         * returns them; refuse rather than run with a mode we ignore. */
        TERSE_FAIL_GOTO(st, fail, TERSE_ERR_TRANSPORT,
                        "rank %d: provider %s returned mr_mode %#llx, which terse cannot honour",
                        rank, f->provider, (unsigned long long)mr_mode);
    }
    f->register_mr = (mr_mode & FI_MR_LOCAL) || force_mr == 1;
    f->mr_endpoint = (mr_mode & FI_MR_ENDPOINT) != 0;
    f->mr_prov_key = (mr_mode & FI_MR_PROV_KEY) != 0;

    TERSE_CHECK_GOTO(make_slots(f), st, fail);
    TERSE_CHECK_GOTO(open_objects(f), st, fail);
    if (f->register_mr) TERSE_CHECK_GOTO(register_slots(f), st, fail);
    terse__fabric_reap_init(f);
    *out = f;
    return TERSE_OK;
fail:
    terse__fabric_close(f);
    return st;
}

static void close_fid(struct fid *fid) {
    if (fid) fi_close(fid);
}

void terse__fabric_close(terse__fabric *f) {
    if (!f) return;
    terse__fabric_close(f->side);
    free(f->via_side);
    /* Close the endpoint first: that discards whatever is still posted
     * (after a timeout or a lost peer there may be much), with no
     * completions to wait for, so close returns promptly even when a peer
     * is dead. A provider that refuses (registrations bound to the
     * endpoint) gets them released first, then a second try. */
    int ret = f->ep ? fi_close(&f->ep->fid) : 0;
    terse__fabric_release_ops(f);
    if (ret == -FI_EBUSY) fi_close(&f->ep->fid);
    if (f->slots_mr) fi_close(&f->slots_mr->fid);
    terse__fabric_reap_free(f);
    terse__fabric_free_keys(f);
    close_fid(f->av ? &f->av->fid : NULL);
    close_fid(f->cq ? &f->cq->fid : NULL);
    close_fid(f->domain ? &f->domain->fid : NULL);
    close_fid(f->fabric ? &f->fabric->fid : NULL);
    if (f->info) fi_freeinfo(f->info);
    free(f->slots);
    free(f->addrs);
    free(f->sent_to);
    free(f->flush_ctx);
    free(f->flush_state);
    free(f->shm);
    free(f);
}

const char *terse__fabric_provider(const terse__fabric *f) { return f ? f->provider : ""; }

/* The blob (layout in fabric_impl.h): our address plus what every rank
 * must agree on. */
terse_status terse__fabric_name(terse__fabric *f, void *buf, size_t *len) {
    if (!f || !buf || !len) return TERSE_ERROR(TERSE_ERR_INVALID, "fabric_name: NULL argument");
    if (*len < TERSE__FABRIC_NAME_BYTES)
        return TERSE_ERROR(TERSE_ERR_DST_TOO_SMALL,
                           "rank %d: an endpoint name needs %d bytes, the buffer has %zu",
                           f->rank, TERSE__FABRIC_NAME_BYTES, *len);
    uint8_t *b = buf;
    memset(b, 0, TERSE__FABRIC_NAME_BYTES);
    size_t alen = TERSE__NAME_ADDR_MAX - 1; /* keep a NUL after string addresses */
    int ret = fi_getname(&f->ep->fid, b + TERSE__NAME_ADDR_OFF, &alen);
    if (ret != 0 || alen == 0 || alen >= TERSE__NAME_ADDR_MAX) {
        memset(b, 0, TERSE__FABRIC_NAME_BYTES);
        return TERSE_ERROR(TERSE_ERR_TRANSPORT,
                           "rank %d: fi_getname on provider %s failed: %s (address of %zu bytes, "
                           "room for %d)",
                           f->rank, f->provider, ret ? fi_strerror(-ret) : "empty address", alen,
                           TERSE__NAME_ADDR_MAX - 1);
    }
    memcpy(b, name_magic, 4);
    terse__put_u32(b + 4, (uint32_t)alen);
    terse__put_u64(b + 8, (uint64_t)f->open_chunk_bytes); /* as configured, not as tuned since */
    memcpy(b + TERSE__NAME_PROV_OFF, f->provider, strlen(f->provider));
    *len = TERSE__FABRIC_NAME_BYTES;
    return TERSE_OK;
}

/* Check rank r's blob against ours before trusting anything in it. */
static terse_status check_name(const terse__fabric *f, int r, const uint8_t *b) {
    if (memcmp(b, name_magic, 4) != 0)
        return TERSE_ERROR(TERSE_ERR_INVALID, "rank %d: rank %d's endpoint name is malformed",
                           f->rank, r);
    uint32_t alen = terse__get_u32(b + 4);
    if (alen == 0 || alen >= TERSE__NAME_ADDR_MAX)
        return TERSE_ERROR(TERSE_ERR_INVALID,
                           "rank %d: rank %d's endpoint name has a bad address length %u",
                           f->rank, r, alen);
    /* Padding must be padding: after the provider's NUL, and after the
     * address, every byte is zero (a blob with more in it is not ours). */
    size_t plen = strnlen((const char *)b + TERSE__NAME_PROV_OFF, TERSE__NAME_PROV_LEN);
    int padded = plen < TERSE__NAME_PROV_LEN;
    for (size_t i = TERSE__NAME_PROV_OFF + plen; padded && i < TERSE__NAME_ADDR_OFF; i++)
        padded = b[i] == 0;
    for (size_t i = TERSE__NAME_ADDR_OFF + alen; padded && i < TERSE__FABRIC_NAME_BYTES; i++)
        padded = b[i] == 0;
    if (!padded)
        return TERSE_ERROR(TERSE_ERR_INVALID,
                           "rank %d: rank %d's endpoint name has non-zero padding (not a terse "
                           "endpoint name)",
                           f->rank, r);
    char prov[TERSE__NAME_PROV_LEN + 1] = {0};
    memcpy(prov, b + TERSE__NAME_PROV_OFF, TERSE__NAME_PROV_LEN);
    if (strcmp(prov, f->provider) != 0)
        return TERSE_ERROR(TERSE_ERR_INVALID,
                           "rank %d uses provider %s but rank %d uses %.32s; every rank must "
                           "use the same (set TERSE_PROVIDER alike)",
                           f->rank, f->provider, r, prov);
    uint64_t chunk = terse__get_u64(b + 8);
    if (chunk != f->open_chunk_bytes)
        return TERSE_ERROR(TERSE_ERR_INVALID,
                           "rank %d splits messages into %zu-byte chunks but rank %d into %llu; "
                           "set TERSE_CHUNK_BYTES alike on every rank",
                           f->rank, f->open_chunk_bytes, r, (unsigned long long)chunk);
    return TERSE_OK;
}

terse_status terse__fabric_set_peers(terse__fabric *f, const void *names, size_t name_len) {
    return terse__fabric_set_peers_among(f, names, name_len, NULL);
}

void terse__fabric_attach_side(terse__fabric *f, terse__fabric *side, uint8_t *via_side) {
    f->side = side;
    f->via_side = via_side;
}

terse__fabric *terse__fabric_side(const terse__fabric *f) { return f ? f->side : NULL; }

terse_status terse__fabric_set_peers_among(terse__fabric *f, const void *names, size_t name_len,
                                           const uint8_t *member) {
    if (!f || !names) return TERSE_ERROR(TERSE_ERR_INVALID, "fabric_set_peers: NULL argument");
    if (member && !member[f->rank])
        return TERSE_ERROR(TERSE_ERR_INVALID, "rank %d: fabric_set_peers_among without this rank",
                           f->rank);
    if (f->addrs)
        return TERSE_ERROR(TERSE_ERR_INVALID, "rank %d: fabric peers are already set", f->rank);
    if (name_len != TERSE__FABRIC_NAME_BYTES)
        return TERSE_ERROR(TERSE_ERR_INVALID,
                           "rank %d: endpoint names are %d bytes each, not %zu", f->rank,
                           TERSE__FABRIC_NAME_BYTES, name_len);
    const uint8_t *all = names;
    for (int r = 0; r < f->nranks; r++)
        if (!member || member[r]) TERSE_CHECK(check_name(f, r, all + (size_t)r * name_len));

    /* Our own entry must be our address: catches names passed out of rank
     * order, which would otherwise send every message to the wrong rank. */
    uint8_t mine[TERSE__FABRIC_NAME_BYTES];
    size_t mlen = sizeof mine;
    TERSE_CHECK(terse__fabric_name(f, mine, &mlen));
    if (memcmp(mine, all + (size_t)f->rank * name_len, name_len) != 0)
        return TERSE_ERROR(TERSE_ERR_INVALID,
                           "rank %d: entry %d of the address list is not this endpoint "
                           "(names must be in rank order)",
                           f->rank, f->rank);

    fi_addr_t *addrs = calloc((size_t)f->nranks, sizeof *addrs);
    if (!addrs) return TERSE_ERROR(TERSE_ERR_NOMEM, "rank %d: no memory for the AV", f->rank);
    if (!f->sent_to && !(f->sent_to = calloc((size_t)f->nranks, 1))) {
        free(addrs);
        return TERSE_ERROR(TERSE_ERR_NOMEM, "rank %d: no memory for the AV", f->rank);
    }
    /* One insert per rank: address lengths may differ between ranks. */
    for (int r = 0; r < f->nranks; r++) {
        const uint8_t *addr = all + (size_t)r * name_len + TERSE__NAME_ADDR_OFF;
        if (member && !member[r]) { /* routed elsewhere: no address here */
            addrs[r] = FI_ADDR_NOTAVAIL;
            continue;
        }
        int ret = fi_av_insert(f->av, addr, 1, &addrs[r], 0, NULL);
        if (ret != 1) {
            free(addrs);
            return TERSE_ERROR(TERSE_ERR_TRANSPORT,
                               "rank %d: inserting rank %d's address into the %s AV failed: %s",
                               f->rank, r, f->provider,
                               ret < 0 ? fi_strerror(-ret) : "address rejected");
        }
    }
    f->addrs = addrs;
    for (int r = 0; r < f->nranks; r++) {
        const uint8_t *b = all + (size_t)r * name_len;
        if (member && !member[r]) continue;
        terse__fabric_shm_note_peer(f, r, b + TERSE__NAME_ADDR_OFF, terse__get_u32(b + 4));
    }
    return TERSE_OK;
}

terse_status terse__fabric_replace_peer(terse__fabric *f, int peer, const void *name,
                                        size_t name_len, const uint8_t *nonce) {
    if (!f || !name || !f->addrs || peer < 0 || peer >= f->nranks || peer == f->rank)
        return TERSE_ERROR(TERSE_ERR_INVALID, "fabric_replace_peer: no peer %d to replace", peer);
    if (name_len != TERSE__FABRIC_NAME_BYTES)
        return TERSE_ERROR(TERSE_ERR_INVALID,
                           "rank %d: rank %d's new endpoint name is %zu bytes, not %d", f->rank,
                           peer, name_len, TERSE__FABRIC_NAME_BYTES);
    TERSE_CHECK(check_name(f, peer, name));
    /* What is still posted to the old process is let go first: nothing of
     * it may match the new one. A peer routed through the side endpoint
     * comes back through this one (a replacement announces one name and
     * opens no side endpoint: comm_join.c). */
    for (int pass = f->side && f->via_side[peer] ? 0 : 1; pass < 2; pass++)
    for (;;) { /* from the head each time: a cancel runs progress, which recycles ops */
        terse__fabric_op *op = pass == 0 ? f->side->active_head : f->active_head;
        while (op && !(op->req && op->req->peer == peer && !op->req->error)) op = op->next;
        if (!op) break;
        terse__fabric_req *r = op->req;
        if (!terse__fabric_cancel(f, r) && !terse__fabric_give_up(f, r)) {
            r->error = TERSE_ERR_ABORTED; /* post nothing more of it */
            break;
        }
        if (!r->error) r->error = TERSE_ERR_ABORTED;
    }
    if (f->side) f->via_side[peer] = 0;
    fi_addr_t old = f->addrs[peer];
    (void)fi_av_remove(f->av, &old, 1, 0); /* the old process is gone */
    fi_addr_t a = FI_ADDR_NOTAVAIL;
    int ret = fi_av_insert(f->av, (const uint8_t *)name + TERSE__NAME_ADDR_OFF, 1, &a, 0, NULL);
    if (ret != 1)
        return TERSE_ERROR(TERSE_ERR_TRANSPORT,
                           "rank %d: inserting the address of rank %d's replacement into the %s "
                           "AV failed: %s",
                           f->rank, peer, f->provider,
                           ret < 0 ? fi_strerror(-ret) : "address rejected");
    f->addrs[peer] = a;
    terse__fabric_shm_note_peer(f, peer, (const uint8_t *)name + TERSE__NAME_ADDR_OFF,
                                terse__get_u32((const uint8_t *)name + 4));
    return terse__fabric_rekey_peer(f, peer, nonce);
}

void terse__fabric_counters(const terse__fabric *f, uint64_t *sent, uint64_t *recv) {
    if (sent) *sent = f ? f->bytes_sent + (f->side ? f->side->bytes_sent : 0) : 0;
    if (recv) *recv = f ? f->bytes_recv + (f->side ? f->side->bytes_recv : 0) : 0;
}
