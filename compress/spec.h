/* The parsed form of a codec spec string: "name:key=value,key=value". */
#ifndef TERSE_COMPRESS_SPEC_H
#define TERSE_COMPRESS_SPEC_H

#include <stddef.h>

#include "terse_plugin.h"

#define TERSE_SPEC_MAX_OPTS 16
#define TERSE_SPEC_MAX_TEXT 256

struct terse_spec {
    char text[TERSE_SPEC_MAX_TEXT]; /* a copy, split in place */
    const char *name;
    size_t nopts;
    struct {
        const char *key;
        const char *value;
        int used;
    } opt[TERSE_SPEC_MAX_OPTS];
    int ef; /* from ef=, consumed by the core */
};

/* Split `text` into name and options; checks only syntax (empty name,
 * missing '=', empty value, duplicate key, too many options). */
terse_status terse__spec_parse(const char *text, terse_spec *spec);

/* The first option nobody consumed, or NULL. */
const char *terse__spec_unused(const terse_spec *spec);

/* Read option `key`, whose value must be one of the words in `choices` (a
 * NULL-terminated list): *out is the index of the word given, or dflt when
 * the key is absent. Any other value is TERSE_ERR_INVALID with a sentence
 * naming the token and listing the words. Reading marks the key as
 * consumed, as terse_spec_get_u64 does. */
terse_status terse__spec_get_choice(terse_spec *spec, const char *key, unsigned dflt,
                                    const char *const *choices, unsigned *out);

#endif
