#include "compress/spec.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"

static int valid_ident(const char *s) {
    if (!*s) return 0;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= '0' && *s <= '9') || *s == '_')) return 0;
    return 1;
}

terse_status terse__spec_parse(const char *text, terse_spec *spec) {
    memset(spec, 0, sizeof *spec);
    if (!text) return TERSE_ERROR(TERSE_ERR_INVALID, "codec spec is NULL");
    size_t n = strlen(text);
    if (n == 0) return TERSE_ERROR(TERSE_ERR_INVALID, "codec spec is empty");
    if (n >= sizeof spec->text)
        return TERSE_ERROR(TERSE_ERR_INVALID, "codec spec is %zu characters; the limit is %d", n,
                           TERSE_SPEC_MAX_TEXT - 1);
    memcpy(spec->text, text, n + 1);
    char *colon = strchr(spec->text, ':');
    if (colon) *colon = '\0';
    spec->name = spec->text;
    if (!valid_ident(spec->name))
        return TERSE_ERROR(TERSE_ERR_INVALID, "codec name '%s' in spec '%s' is not [a-z0-9_]+",
                           spec->name, text);
    if (!colon) return TERSE_OK;
    char *p = colon + 1;
    if (!*p) return TERSE_ERROR(TERSE_ERR_INVALID, "spec '%s' has ':' but no options", text);
    for (;;) {
        char *comma = strchr(p, ',');
        if (comma) *comma = '\0';
        char *eq = strchr(p, '=');
        if (!eq)
            return TERSE_ERROR(TERSE_ERR_INVALID, "option '%s' in spec '%s' has no '=value'", p, text);
        *eq = '\0';
        const char *key = p, *value = eq + 1;
        if (!valid_ident(key))
            return TERSE_ERROR(TERSE_ERR_INVALID, "option key '%s' in spec '%s' is not [a-z0-9_]+",
                               key, text);
        if (!*value)
            return TERSE_ERROR(TERSE_ERR_INVALID, "option '%s=' in spec '%s' has an empty value", key,
                               text);
        for (size_t i = 0; i < spec->nopts; i++)
            if (strcmp(spec->opt[i].key, key) == 0)
                return TERSE_ERROR(TERSE_ERR_INVALID, "option '%s' appears twice in spec '%s'", key,
                                   text);
        if (spec->nopts == TERSE_SPEC_MAX_OPTS)
            return TERSE_ERROR(TERSE_ERR_INVALID, "spec '%s' has more than %d options", text,
                               TERSE_SPEC_MAX_OPTS);
        spec->opt[spec->nopts].key = key;
        spec->opt[spec->nopts].value = value;
        spec->nopts++;
        if (!comma) break;
        p = comma + 1;
        if (!*p) return TERSE_ERROR(TERSE_ERR_INVALID, "spec '%s' ends with ','", text);
    }
    return TERSE_OK;
}

static int find(const terse_spec *spec, const char *key) {
    for (size_t i = 0; i < spec->nopts; i++)
        if (strcmp(spec->opt[i].key, key) == 0) return (int)i;
    return -1;
}

int terse_spec_has(const terse_spec *spec, const char *key) {
    return spec && key && find(spec, key) >= 0;
}

int terse_spec_error_feedback(const terse_spec *spec) { return spec ? spec->ef : 0; }

const char *terse__spec_unused(const terse_spec *spec) {
    for (size_t i = 0; i < spec->nopts; i++)
        if (!spec->opt[i].used) return spec->opt[i].key;
    return NULL;
}

terse_status terse_spec_get_double(terse_spec *spec, const char *key, double dflt, double min,
                                   double max, double *out) {
    if (!spec || !key || !out) return TERSE_ERROR(TERSE_ERR_INVALID, "NULL argument");
    int i = find(spec, key);
    if (i < 0) {
        *out = dflt;
        return TERSE_OK;
    }
    spec->opt[i].used = 1;
    const char *v = spec->opt[i].value;
    char *end;
    errno = 0;
    double d = strtod(v, &end);
    if (end == v || *end || errno == ERANGE || !isfinite(d))
        return TERSE_ERROR(TERSE_ERR_INVALID, "option '%s=%s' of codec '%s': '%s' is not a number",
                           key, v, spec->name, v);
    if (d < min || d > max)
        return TERSE_ERROR(TERSE_ERR_INVALID,
                           "option '%s=%s' of codec '%s' is out of range [%g, %g]", key, v,
                           spec->name, min, max);
    *out = d;
    return TERSE_OK;
}

terse_status terse_spec_get_u64(terse_spec *spec, const char *key, uint64_t dflt, uint64_t min,
                                uint64_t max, uint64_t *out) {
    if (!spec || !key || !out) return TERSE_ERROR(TERSE_ERR_INVALID, "NULL argument");
    int i = find(spec, key);
    if (i < 0) {
        *out = dflt;
        return TERSE_OK;
    }
    spec->opt[i].used = 1;
    const char *v = spec->opt[i].value;
    if (*v < '0' || *v > '9')
        return TERSE_ERROR(TERSE_ERR_INVALID,
                           "option '%s=%s' of codec '%s': '%s' is not an unsigned integer", key, v,
                           spec->name, v);
    char *end;
    errno = 0;
    unsigned long long u = strtoull(v, &end, 10);
    if (*end || errno == ERANGE)
        return TERSE_ERROR(TERSE_ERR_INVALID,
                           "option '%s=%s' of codec '%s': '%s' is not an unsigned integer", key, v,
                           spec->name, v);
    if (u < min || u > max)
        return TERSE_ERROR(TERSE_ERR_INVALID,
                           "option '%s=%s' of codec '%s' is out of range [%llu, %llu]", key, v,
                           spec->name, (unsigned long long)min, (unsigned long long)max);
    *out = u;
    return TERSE_OK;
}

terse_status terse__spec_get_choice(terse_spec *spec, const char *key, unsigned dflt,
                                    const char *const *choices, unsigned *out) {
    if (!spec || !key || !choices || !out) return TERSE_ERROR(TERSE_ERR_INVALID, "NULL argument");
    int i = find(spec, key);
    if (i < 0) {
        *out = dflt;
        return TERSE_OK;
    }
    spec->opt[i].used = 1;
    const char *v = spec->opt[i].value;
    for (unsigned c = 0; choices[c]; c++)
        if (strcmp(v, choices[c]) == 0) {
            *out = c;
            return TERSE_OK;
        }
    /* The words, for the sentence: "a, b or c". */
    char list[128] = "";
    size_t used = 0;
    for (unsigned c = 0; choices[c] && used < sizeof list; c++) {
        const char *sep = c == 0 ? "" : choices[c + 1] ? ", " : " or ";
        int w = snprintf(list + used, sizeof list - used, "%s%s", sep, choices[c]);
        if (w < 0) break;
        used += (size_t)w;
    }
    return TERSE_ERROR(TERSE_ERR_INVALID, "option '%s=%s' of codec '%s': '%s' is not %s", key, v,
                       spec->name, v, list);
}
