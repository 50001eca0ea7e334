/* The tab-separated records that carry results from worker processes (and
 * from the Open MPI peer) back to the launcher: one line per record, one
 * field per tab. */
#include <string.h>

#include "bench.h"

void bench_field_copy(char *dst, size_t cap, const char *src) {
    size_t i = 0;
    for (; src[i] && i + 1 < cap; i++)
        dst[i] = (src[i] == '\t' || src[i] == '\n' || src[i] == '\r') ? ' ' : src[i];
    dst[i] = '\0';
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
