/* The bootstrap store's key-value table (server side): an open-addressing
 * hash table whose entries also hold the GET requests parked on a key that
 * does not exist yet. Internal to transport/. */
#ifndef TERSE_TRANSPORT_STORE_TABLE_H
#define TERSE_TRANSPORT_STORE_TABLE_H

#include <stddef.h>
#include <stdint.h>

#include "terse.h"

/* A parked GET: which connection (slot and generation, so a reused slot is
 * never answered by mistake) and the request id to echo. */
typedef struct terse__store_waiter {
    uint32_t slot, req;
    uint64_t gen;
} terse__store_waiter;

typedef struct terse__store_entry {
    char *key; /* NUL-terminated; NULL: empty bucket */
    size_t klen;
    uint8_t *val;
    size_t len;
    int has_value; /* 0: only waiters so far */
    terse__store_waiter *waiters;
    size_t nwaiters, capwaiters;
} terse__store_entry;

typedef struct terse__store_table {
    terse__store_entry *e;
    size_t cap, used; /* cap is a power of two */
} terse__store_table;

void terse__store_table_free(terse__store_table *t);
/* The entry for key (klen bytes, no NUL inside), or NULL if absent and
 * !create. With create, a missing key gets an entry without a value;
 * TERSE_ERR_NOMEM leaves *out NULL. */
terse_status terse__store_table_find(terse__store_table *t, const char *key, size_t klen,
                                     int create, terse__store_entry **out);
/* Replace the entry's value with a copy of val. */
terse_status terse__store_entry_set(terse__store_entry *e, const void *val, size_t len);
terse_status terse__store_entry_park(terse__store_entry *e, terse__store_waiter w);

#endif
