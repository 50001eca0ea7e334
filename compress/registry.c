/* The codec registry. Built-in codecs register through the same call a
 * plugin uses; the only difference is that they may take reserved ids. */
#include <pthread.h>
#include <string.h>

#include "common/error.h"
#include "common/names.h"
#include "compress/codec_internal.h"

#define MAX_CODECS 256

static terse_codec_ops table[MAX_CODECS];
static size_t ntable;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t builtins_once = PTHREAD_ONCE_INIT;

static terse_status register_locked(const terse_codec_ops *ops, int builtin) {
    if (!ops) return TERSE_ERROR(TERSE_ERR_INVALID, "codec ops is NULL");
    if (ops->size < offsetof(terse_codec_ops, state_size))
        return TERSE_ERROR(TERSE_ERR_INVALID, "codec ops size %zu is smaller than any known table",
                           ops->size);
    /* Copy what the caller's header version knew; newer entries stay NULL.
     * Every entry after `flags` is a pointer, so a size that is not a
     * whole number of pointers is rounded down: never half an entry. */
    terse_codec_ops c;
    memset(&c, 0, sizeof c);
    size_t known = ops->size < sizeof c ? ops->size : sizeof c;
    known -= (known - offsetof(terse_codec_ops, create)) % sizeof(void (*)(void));
    memcpy(&c, ops, known);
    c.size = sizeof c;
    if (!c.name || !terse__plugin_name_ok(c.name))
        return TERSE_ERROR(TERSE_ERR_INVALID, "codec name '%s' is not [a-z0-9_]{1,31}",
                           c.name ? c.name : "(null)");
    if (!c.create || !c.destroy || !c.bound || !c.encode || !c.decode)
        return TERSE_ERROR(TERSE_ERR_INVALID,
                           "codec '%s' lacks a required entry (create, destroy, bound, encode, "
                           "decode)",
                           c.name);
    if ((c.state_size != NULL) != (c.state_save != NULL) ||
        (c.state_size != NULL) != (c.state_load != NULL))
        return TERSE_ERROR(TERSE_ERR_INVALID,
                           "codec '%s' must give all of state_size/save/load or none", c.name);
    if (c.rounds && (!c.round_vector || !c.round_finish))
        return TERSE_ERROR(TERSE_ERR_INVALID,
                           "codec '%s' gives rounds but not both round_vector and round_finish",
                           c.name);
    if ((c.round_vector || c.round_finish) && !c.rounds)
        return TERSE_ERROR(TERSE_ERR_INVALID,
                           "codec '%s' gives round_vector or round_finish without rounds",
                           c.name);
    if (c.summable_view && !(c.flags & TERSE_CODEC_SUMMABLE))
        return TERSE_ERROR(TERSE_ERR_INVALID,
                           "codec '%s' gives summable_view without TERSE_CODEC_SUMMABLE", c.name);
    if (c.segment_options && !c.segment_align)
        return TERSE_ERROR(TERSE_ERR_INVALID,
                           "codec '%s' gives segment_options without segment_align", c.name);
    int user = c.id >= TERSE_CODEC_ID_USER_MIN && c.id <= TERSE_CODEC_ID_USER_MAX;
    int reserved = c.id >= 1 && c.id < TERSE_CODEC_ID_USER_MIN;
    if (!(user || (builtin && reserved)))
        return TERSE_ERROR(TERSE_ERR_INVALID,
                           "codec '%s' has id %u; plugins must use ids in [0x%x, 0x%x]", c.name,
                           c.id, TERSE_CODEC_ID_USER_MIN, TERSE_CODEC_ID_USER_MAX);
    for (size_t i = 0; i < ntable; i++) {
        if (table[i].id == c.id)
            return TERSE_ERROR(TERSE_ERR_EXISTS, "codec id %u is already taken by '%s'", c.id,
                               table[i].name);
        if (strcmp(table[i].name, c.name) == 0)
            return TERSE_ERROR(TERSE_ERR_EXISTS, "a codec named '%s' is already registered",
                               c.name);
    }
    if (ntable == MAX_CODECS)
        return TERSE_ERROR(TERSE_ERR_NOMEM, "the codec registry is full (%d codecs)", MAX_CODECS);
    /* Keep the table sorted by id so enumeration order is stable. */
    size_t at = ntable;
    while (at > 0 && table[at - 1].id > c.id) {
        table[at] = table[at - 1];
        at--;
    }
    table[at] = c;
    ntable++;
    return TERSE_OK;
}

static void register_builtins(void) {
    static const terse_codec_ops *const builtins[] = {
        &terse__codec_none,  &terse__codec_fp16,     &terse__codec_bf16,  &terse__codec_int8,
        &terse__codec_qsgd,  &terse__codec_terngrad, &terse__codec_sign,  &terse__codec_topk,
        &terse__codec_randk, &terse__codec_powersgd, &terse__codec_vq,
    };
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < sizeof builtins / sizeof builtins[0]; i++)
        (void)register_locked(builtins[i], 1); /* a failure here is caught by tests */
    pthread_mutex_unlock(&lock);
}

terse_status terse_codec_register(const terse_codec_ops *ops) {
    pthread_once(&builtins_once, register_builtins);
    pthread_mutex_lock(&lock);
    terse_status s = register_locked(ops, 0);
    pthread_mutex_unlock(&lock);
    return s;
}

terse_status terse__registry_find(const char *name, terse_codec_ops *ops) {
    pthread_once(&builtins_once, register_builtins);
    pthread_mutex_lock(&lock);
    terse_status s = TERSE_ERR_NOT_FOUND;
    for (size_t i = 0; i < ntable; i++)
        if (strcmp(table[i].name, name) == 0) {
            *ops = table[i];
            s = TERSE_OK;
            break;
        }
    pthread_mutex_unlock(&lock);
    return s;
}

size_t terse_codec_count(void) {
    pthread_once(&builtins_once, register_builtins);
    pthread_mutex_lock(&lock);
    size_t n = ntable;
    pthread_mutex_unlock(&lock);
    return n;
}

const char *terse_codec_name(size_t i) {
    pthread_once(&builtins_once, register_builtins);
    pthread_mutex_lock(&lock);
    const char *name = i < ntable ? table[i].name : NULL;
    pthread_mutex_unlock(&lock);
    return name;
}

/* "none, fp16, ..." into buf (cut short with "..." if it does not fit). */
void terse__registry_names(char *buf, size_t size) {
    pthread_once(&builtins_once, register_builtins);
    if (!size) return;
    buf[0] = 0;
    size_t at = 0;
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < ntable; i++) {
        size_t len = strlen(table[i].name), sep = i ? 2 : 0;
        if (at + sep + len + 4 >= size) {
            memcpy(buf + at, "...", 4);
            break;
        }
        if (sep) memcpy(buf + at, ", ", 2);
        memcpy(buf + at + sep, table[i].name, len + 1);
        at += sep + len;
    }
    pthread_mutex_unlock(&lock);
}

/* The registered name of codec id, or "unregistered". Names live as long
 * as the process (the table never shrinks). */
const char *terse__registry_name_of(uint32_t id) {
    pthread_once(&builtins_once, register_builtins);
    const char *name = "unregistered";
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < ntable; i++)
        if (table[i].id == id) name = table[i].name;
    pthread_mutex_unlock(&lock);
    return name;
}
