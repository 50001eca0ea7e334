/* Provider selection: from the name a user types (TERSE_PROVIDER) to one
 * fi_info describing the fabric, domain and endpoint we will open.
 *
 * We ask fi_getinfo for an FI_EP_RDM endpoint with FI_TAGGED |
 * FI_DIRECTED_RECV, manual progress, FI_THREAD_DOMAIN (a communicator is
 * used by one thread at a time), operation contexts we supply (FI_CONTEXT,
 * FI_CONTEXT2) and only the memory-registration modes we can honour. The
 * provider answers with what it really gives, which fabric.c then obeys
 * (queue depths, message and inject sizes, mr_mode). */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "transport/fabric_impl.h"

/* The names a user may type, and the libfabric provider each one means.
 * The libfabric spelling is accepted too, so the string
 * terse_comm_provider() returns can be fed back. tcp is libfabric's net
 * provider: it stops reading a connection at a message no posted receive
 * matches (keeping at most 4 small ones aside per connection), where
 * tcp;ofi_rxm queues every such message without bound -- a stranger's
 * flood would grow a rank's memory as fast as it sends (SECURITY.md).
 * terse's protocols post each receive before its message can block
 * anything behind it on the same connection (algos/ps/ps_failover.c). */
static const struct {
    const char *user, *prov;
} known_providers[] = {
    {"shm", "shm"},
    {"tcp", "net"},
    {"rxm", "tcp;ofi_rxm"},
    {"verbs", "verbs;ofi_rxm"},
    {"efa", "efa"},
    {"net", "net"},
};
#define NKNOWN (sizeof known_providers / sizeof known_providers[0])

/* Every mr_mode bit libfabric 1.17 defines, to learn whether an absent
 * provider is really absent or only wants a mode we cannot honour. */
#define MR_ALL_BITS                                                                        \
    (TERSE__MR_SUPPORTED | FI_MR_MMU_NOTIFY | FI_MR_RMA_EVENT | FI_MR_COLLECTIVE)

static struct fi_info *make_hints(const char *prov_name, uint64_t mr_mode, int manual) {
    struct fi_info *h = fi_allocinfo();
    if (!h) return NULL;
    h->caps = FI_TAGGED | FI_DIRECTED_RECV;
    h->mode = FI_CONTEXT | FI_CONTEXT2;
    h->ep_attr->type = FI_EP_RDM;
    h->domain_attr->mr_mode = (int)mr_mode;
    h->domain_attr->threading = FI_THREAD_DOMAIN;
    if (manual) {
        h->domain_attr->data_progress = FI_PROGRESS_MANUAL;
        h->domain_attr->control_progress = FI_PROGRESS_MANUAL;
    }
    if (prov_name) {
        h->fabric_attr->prov_name = strdup(prov_name);
        if (!h->fabric_attr->prov_name) {
            fi_freeinfo(h);
            return NULL;
        }
    }
    return h;
}

/* fi_getinfo for prov_name (NULL: any). Manual progress is what we drive,
 * so ask for it first; a provider that only offers automatic progress is
 * still usable (our polling is then merely redundant), so accept it on a
 * second try. Returns 0, -FI_ENODATA when nothing matches, or another
 * negative fi_errno. */
static int query(const char *prov_name, uint64_t mr_mode, struct fi_info **out) {
    *out = NULL;
    int ret = -FI_ENODATA;
    for (int manual = 1; manual >= 0 && ret == -FI_ENODATA; manual--) {
        struct fi_info *h = make_hints(prov_name, mr_mode, manual);
        if (!h) return -FI_ENOMEM;
        ret = fi_getinfo(TERSE__FI_VERSION, NULL, NULL, 0, h, out);
        fi_freeinfo(h);
    }
    return ret;
}

/* "tcp;ofi_rxm, shm, udp;ofi_rxd" -- what this machine's libfabric offers
 * for our endpoint type, each provider once, for error sentences. */
static void offered_list(char *buf, size_t cap) {
    struct fi_info *list = NULL;
    snprintf(buf, cap, "nothing");
    if (query(NULL, MR_ALL_BITS, &list) != 0) return;
    size_t used = 0;
    buf[0] = '\0';
    for (struct fi_info *i = list; i; i = i->next) {
        const char *name = i->fabric_attr->prov_name;
        int seen = 0;
        for (struct fi_info *j = list; j != i && !seen; j = j->next)
            seen = strcmp(j->fabric_attr->prov_name, name) == 0;
        if (seen) continue;
        int n = snprintf(buf + used, cap - used, "%s%s", used ? ", " : "", name);
        if (n < 0 || (size_t)n >= cap - used) break; /* keep what fit */
        used += (size_t)n;
    }
    fi_freeinfo(list);
}

static void mr_bits_text(uint64_t bits, char *buf, size_t cap) {
    static const struct {
        uint64_t bit;
        const char *name;
    } names[] = {{FI_MR_MMU_NOTIFY, "FI_MR_MMU_NOTIFY"},
                 {FI_MR_RMA_EVENT, "FI_MR_RMA_EVENT"},
                 {FI_MR_COLLECTIVE, "FI_MR_COLLECTIVE"}};
    size_t used = 0;
    buf[0] = '\0';
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
        if (!(bits & names[k].bit)) continue;
        int n = snprintf(buf + used, cap - used, "%s%s", used ? " | " : "", names[k].name);
        if (n < 0 || (size_t)n >= cap - used) break;
        used += (size_t)n;
    }
}

static int is_loopback(const struct fi_info *i) {
    if (!i->src_addr) return 0;
    if (i->addr_format == FI_SOCKADDR_IN && i->src_addrlen >= sizeof(struct sockaddr_in)) {
        const struct sockaddr_in *sin = i->src_addr;
        return (ntohl(sin->sin_addr.s_addr) >> 24) == 127;
    }
    if (i->addr_format == FI_SOCKADDR_IN6 && i->src_addrlen >= sizeof(struct sockaddr_in6)) {
        const struct sockaddr_in6 *sin6 = i->src_addr;
        return IN6_IS_ADDR_LOOPBACK(&sin6->sin6_addr);
    }
    return 0;
}

/* Pick one entry of a provider's answer. fi_getinfo lists one entry per
 * interface (tcp) or device (verbs, efa):
 *   1. TERSE_IFACE names the domain (interface or device) to use -- how a
 *      job spanning hosts, or network namespaces joined by a veth pair,
 *      says which link carries its traffic. shm has one domain and ignores
 *      it.
 *   2. Otherwise, with every rank on one host, a loopback entry if there is
 *      one: traffic that never leaves the host belongs on loopback.
 *   3. Otherwise libfabric's first choice (FI_TCP_IFACE etc. still apply). */
static terse_status choose_domain(struct fi_info *list, const char *prov, int same_host,
                                  int rank, struct fi_info **chosen) {
    const char *iface = getenv("TERSE_IFACE");
    *chosen = list;
    if (iface && *iface && strcmp(prov, "shm") != 0) {
        for (struct fi_info *i = list; i; i = i->next)
            if (i->domain_attr->name && strcmp(i->domain_attr->name, iface) == 0) {
                *chosen = i;
                return TERSE_OK;
            }
        char names[200] = "";
        size_t used = 0;
        for (struct fi_info *i = list; i; i = i->next) {
            const char *d = i->domain_attr->name ? i->domain_attr->name : "?";
            if (strstr(names, d)) continue; /* one mention each is enough */
            int n = snprintf(names + used, sizeof names - used, "%s%s", used ? ", " : "", d);
            if (n < 0 || (size_t)n >= sizeof names - used) break;
            used += (size_t)n;
        }
        return TERSE_ERROR(TERSE_ERR_TRANSPORT,
                           "rank %d: TERSE_IFACE='%s' is not an interface provider %s offers "
                           "(it offers: %s)",
                           rank, iface, prov, names);
    }
    if (same_host)
        for (struct fi_info *i = list; i; i = i->next)
            if (is_loopback(i)) {
                *chosen = i;
                return TERSE_OK;
            }
    return TERSE_OK;
}

/* Find prov (a libfabric name) with the hints we support. On success
 * *out is a single-entry copy. Absent: -FI_ENODATA and nothing recorded, so
 * "auto" can move on to the next candidate. */
static int find(const char *prov, int same_host, int rank, struct fi_info **out,
                terse_status *st) {
    struct fi_info *list = NULL;
    *out = NULL;
    *st = TERSE_OK;
    int ret = query(prov, TERSE__MR_SUPPORTED, &list);
    if (ret != 0) return ret;
    struct fi_info *chosen;
    *st = choose_domain(list, prov, same_host, rank, &chosen);
    if (*st == TERSE_OK) {
        /* fi_dupinfo copies the whole chain from chosen on; cut it. */
        struct fi_info *rest = chosen->next;
        chosen->next = NULL;
        *out = fi_dupinfo(chosen);
        chosen->next = rest;
        if (!*out) *st = TERSE_ERROR(TERSE_ERR_NOMEM, "rank %d: fi_dupinfo failed", rank);
    }
    fi_freeinfo(list);
    return 0;
}

/* prov is absent under our hints: say why, naming what is on offer. */
static terse_status absent(const char *user, const char *prov, int rank) {
    char offers[240];
    offered_list(offers, sizeof offers);
    struct fi_info *any = NULL;
    if (query(prov, MR_ALL_BITS, &any) == 0) {
        char bits[96];
        mr_bits_text((uint64_t)any->domain_attr->mr_mode & ~(uint64_t)TERSE__MR_SUPPORTED, bits,
                      sizeof bits);
        fi_freeinfo(any);
        return TERSE_ERROR(TERSE_ERR_TRANSPORT,
                           "rank %d: provider '%s' (%s) requires memory-registration modes "
                           "terse cannot honour (%s); fi_getinfo offers: %s",
                           rank, user, prov, bits, offers);
    }
    return TERSE_ERROR(TERSE_ERR_TRANSPORT,
                       "rank %d: provider '%s' (%s) is not available; fi_getinfo offers: %s",
                       rank, user, prov, offers);
}

static terse_status find_or_fail(const char *user, const char *prov, int same_host, int rank,
                                 struct fi_info **out) {
    terse_status st;
    int ret = find(prov, same_host, rank, out, &st);
    if (ret == -FI_ENODATA) return absent(user, prov, rank);
    if (ret != 0)
        return TERSE_ERROR(TERSE_ERR_TRANSPORT, "rank %d: fi_getinfo for provider %s failed: %s",
                           rank, prov, fi_strerror(-ret));
    return st;
}

terse_status terse__fabric_select(const char *provider, int same_host, int rank,
                                  struct fi_info **out) {
    *out = NULL;
    for (size_t k = 0; k < NKNOWN; k++)
        if (strcmp(provider, known_providers[k].user) == 0 ||
            strcmp(provider, known_providers[k].prov) == 0)
            return find_or_fail(known_providers[k].user, known_providers[k].prov, same_host,
                                rank, out);
    if (strcmp(provider, "auto") != 0)
        return TERSE_ERROR(TERSE_ERR_INVALID,
                           "rank %d: unknown provider '%s' (TERSE_PROVIDER takes shm, tcp, "
                           "rxm, verbs, efa, net or auto)",
                           rank, provider);

    /* auto: shm when every rank shares this host (same_host 1; 2 is
     * several hosts in one network namespace: loopback, never shm); otherwise RDMA if the
     * machine has it (verbs, then efa), else tcp. */
    static const char *const order[] = {"shm", "verbs;ofi_rxm", "efa", "net"};
    for (size_t k = same_host == 1 ? 0 : 1; k < sizeof order / sizeof order[0]; k++) {
        terse_status st;
        int ret = find(order[k], same_host, rank, out, &st);
        if (ret == 0) return st;
        if (ret != -FI_ENODATA)
            return TERSE_ERROR(TERSE_ERR_TRANSPORT,
                               "rank %d: fi_getinfo for provider %s failed: %s", rank, order[k],
                               fi_strerror(-ret));
    }
    return absent("auto", "net", rank);
}
