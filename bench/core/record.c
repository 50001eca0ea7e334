/* The tab-separated records that carry results from worker processes (and
 * from the Open MPI peer) back to the launcher: one line per record, one
 * field per tab. Each benchmark parses its own fields; reading a file of
 * them into a growing array is shared, and so is quoting a text field of
 * the CSV the launchers print. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/bench.h"

const char *bench_field_copy(char *dst, size_t cap, const char *src) {
    size_t i = 0;
    for (; src[i] && i + 1 < cap; i++)
        dst[i] = (src[i] == '\t' || src[i] == '\n' || src[i] == '\r') ? ' ' : src[i];
    dst[i] = '\0';
    return dst;
}

void bench_csv_quoted(const char *s) {
    putchar('"');
    for (; *s; s++) {
        if (*s == '"') putchar('"');
        putchar(*s);
    }
    putchar('"');
}

int bench_split_tabs(char *line, char **fields, int cap) {
    char *nl = strchr(line, '\n');
    if (nl) *nl = '\0';
    int n = 0;
    char *p = line;
    while (n < cap) {
        fields[n++] = p;
        char *tab = strchr(p, '\t');
        if (!tab) break;
        *tab = '\0';
        p = tab + 1;
    }
    return n;
}

int bench_records_read(const char *who, const char *path, bench_record_parse parse,
                       bench_records *set) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char line[2048];
    int got = 0;
    while (fgets(line, sizeof line, f)) {
        if (set->n == set->cap) {
            int cap = set->cap ? 2 * set->cap : 64;
            void *grown = realloc(set->items, (size_t)cap * set->size);
            if (!grown) {
                fprintf(stderr, "%s: out of memory reading %s; keeping the first %d records\n",
                        who, path, set->n);
                break;
            }
            set->items = grown;
            set->cap = cap;
        }
        if (parse(line, (char *)set->items + (size_t)set->n * set->size) == 0) {
            set->n++;
            got++;
        }
    }
    fclose(f);
    return got;
}

void bench_records_free(bench_records *set) {
    free(set->items);
    set->items = NULL;
    set->n = set->cap = 0;
}
