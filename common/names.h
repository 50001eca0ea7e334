/* The names plugins register under (codecs, aggregators): 1..31 of
 * [a-z0-9_], so a spec string can name them. */
#ifndef TERSE_COMMON_NAMES_H
#define TERSE_COMMON_NAMES_H

static inline int terse__plugin_name_ok(const char *s) {
    unsigned n = 0;
    for (; s[n]; n++)
        if (!((s[n] >= 'a' && s[n] <= 'z') || (s[n] >= '0' && s[n] <= '9') || s[n] == '_'))
            return 0;
    return n > 0 && n <= 31;
}

#endif
