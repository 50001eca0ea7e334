/* The store's key-value table: open addressing with linear probing (keys
 * are never deleted during a job, so no tombstones are needed). Allgather at
 * scale sets nranks keys and parks up to nranks^2 GETs, so lookups and
 * parking are O(1) rather than scans. */
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "transport/store_table.h"

/* FNV-1a: keys are short ASCII strings chosen by authenticated ranks, so
 * there is no adversary to defend against with a keyed hash. */
static uint64_t hash_key(const char *key, size_t klen) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < klen; i++) h = (h ^ (uint8_t)key[i]) * 1099511628211ull;
    return h;
}

static terse__store_entry *probe(terse__store_entry *e, size_t cap, const char *key,
                                 size_t klen) {
    size_t i = (size_t)hash_key(key, klen) & (cap - 1);
    for (;; i = (i + 1) & (cap - 1)) {
        if (!e[i].key) return &e[i];
        if (e[i].klen == klen && memcmp(e[i].key, key, klen) == 0) return &e[i];
    }
}

void terse__store_table_free(terse__store_table *t) {
    for (size_t i = 0; i < t->cap; i++) {
        free(t->e[i].key);
        free(t->e[i].val);
        free(t->e[i].waiters);
    }
    free(t->e);
    t->e = NULL;
    t->cap = t->used = 0;
}

/* Double the bucket array, rehashing every entry; entries move by value. */
static terse_status grow(terse__store_table *t) {
    size_t cap = t->cap ? t->cap * 2 : 64;
    terse__store_entry *e = calloc(cap, sizeof *e);
    if (!e) return TERSE_ERROR(TERSE_ERR_NOMEM, "cannot grow the store table to %zu keys", cap);
    for (size_t i = 0; i < t->cap; i++)
        if (t->e[i].key) *probe(e, cap, t->e[i].key, t->e[i].klen) = t->e[i];
    free(t->e);
    t->e = e;
    t->cap = cap;
    return TERSE_OK;
}

terse_status terse__store_table_find(terse__store_table *t, const char *key, size_t klen,
                                     int create, terse__store_entry **out) {
    *out = NULL;
    if (t->cap) {
        terse__store_entry *e = probe(t->e, t->cap, key, klen);
        if (e->key || !create) {
            *out = e->key ? e : NULL;
            return TERSE_OK;
        }
    }
    if (!create) return TERSE_OK;
    /* Keep the load factor at or below one half so probes stay short. */
    if (2 * (t->used + 1) > t->cap) TERSE_CHECK(grow(t));
    terse__store_entry *e = probe(t->e, t->cap, key, klen);
    char *k = malloc(klen + 1);
    if (!k) return TERSE_ERROR(TERSE_ERR_NOMEM, "cannot store a %zu-byte key", klen);
    memcpy(k, key, klen);
    k[klen] = '\0';
    memset(e, 0, sizeof *e);
    e->key = k;
    e->klen = klen;
    t->used++;
    *out = e;
    return TERSE_OK;
}

terse_status terse__store_entry_set(terse__store_entry *e, const void *val, size_t len) {
    /* malloc(0) may return NULL; an empty value still needs a valid copy. */
    uint8_t *v = malloc(len ? len : 1);
    if (!v) return TERSE_ERROR(TERSE_ERR_NOMEM, "cannot store a %zu-byte value", len);
    if (len) memcpy(v, val, len);
    free(e->val);
    e->val = v;
    e->len = len;
    e->has_value = 1;
    return TERSE_OK;
}

terse_status terse__store_entry_park(terse__store_entry *e, terse__store_waiter w) {
    if (e->nwaiters == e->capwaiters) {
        size_t cap = e->capwaiters ? 2 * e->capwaiters : 4;
        terse__store_waiter *p = realloc(e->waiters, cap * sizeof *p);
        if (!p) return TERSE_ERROR(TERSE_ERR_NOMEM, "cannot park a GET on key '%s'", e->key);
        e->waiters = p;
        e->capwaiters = cap;
    }
    e->waiters[e->nwaiters++] = w;
    return TERSE_OK;
}
