/* Replays inputs through a fuzz target's LLVMFuzzerTestOneInput without
 * libFuzzer, so the seed corpus and saved crash inputs run in every build
 * (CTest) and under any sanitizer.
 *
 *     usage: <target>_replay PATH...
 *
 * A PATH is a file or a directory, walked recursively in sorted order.
 * Every input is copied into an allocation of exactly its size, so an ASan
 * build reports a read one byte past the end. A path that cannot be read
 * fails the run; a finding aborts it. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz_common.h"

static int replay_file(const char *path, size_t *count) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "cannot open %s\n", path);
        return 1;
    }
    size_t cap = 4096, len = 0;
    uint8_t *buf = malloc(cap);
    size_t got;
    while (buf && (got = fread(buf + len, 1, cap - len, f)) > 0) {
        len += got;
        if (len == cap) {
            cap *= 2;
            uint8_t *grown = realloc(buf, cap);
            if (!grown) free(buf);
            buf = grown;
        }
    }
    int bad = ferror(f) || !buf;
    fclose(f);
    if (bad) {
        fprintf(stderr, "cannot read %s\n", path);
        free(buf);
        return 1;
    }
    uint8_t *exact = malloc(len ? len : 1);
    if (len) memcpy(exact, buf, len);
    free(buf);
    LLVMFuzzerTestOneInput(exact, len);
    free(exact);
    ++*count;
    return 0;
}

static int replay_path(const char *path, size_t *count) {
    struct stat st;
    if (stat(path, &st) != 0) {
        fprintf(stderr, "no such file or directory: %s\n", path);
        return 1;
    }
    if (!S_ISDIR(st.st_mode)) return replay_file(path, count);
    struct dirent **names;
    int n = scandir(path, &names, NULL, alphasort);
    if (n < 0) {
        fprintf(stderr, "cannot list %s\n", path);
        return 1;
    }
    int failed = 0;
    for (int i = 0; i < n; i++) {
        const char *name = names[i]->d_name;
        if (name[0] != '.') { /* skips ., .. and hidden files such as .gitkeep */
            size_t need = strlen(path) + strlen(name) + 2;
            char *child = malloc(need);
            snprintf(child, need, "%s/%s", path, name);
            failed |= replay_path(child, count);
            free(child);
        }
        free(names[i]);
    }
    free(names);
    return failed;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s FILE_OR_DIR...\n", argv[0]);
        return 2;
    }
    size_t count = 0;
    int failed = 0;
    for (int i = 1; i < argc; i++) failed |= replay_path(argv[i], &count);
    fprintf(stderr, "%s: replayed %zu inputs%s\n", argv[0], count,
            failed ? ", some unreadable" : "");
    return failed;
}
