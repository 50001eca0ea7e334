/* The IDX reader: Fashion-MNIST's files, gzip-compressed or raw, checked
 * byte by byte so that a damaged or hostile file gives a sentence, never a
 * crash or a huge allocation. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "train/train.h"

#define IDX_TYPE_UBYTE 0x08
#define IDX_MAX_DIMS 4
/* The data buffer starts at this size and doubles up to what the header
 * promises, so a 20-byte file that claims 4 GiB costs 1 MiB, not 4 GiB. */
#define IDX_FIRST_CHUNK ((size_t)1 << 20)
/* gzread takes an unsigned and returns an int: never ask for more. */
#define IDX_MAX_READ ((size_t)1 << 30)
/* Trailing bytes are counted up to here; past it the message says "at
 * least", so that a gzip bomb after the data is not inflated to the end. */
#define IDX_MAX_TRAILING ((size_t)1 << 20)

static void fail(char *err, size_t cap, const char *fmt, ...) {
    if (!err || cap == 0) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, cap, fmt, ap);
    va_end(ap);
}

/* Why a gzread returned -1, from zlib's own account. */
static void fail_gz(const char *path, gzFile gz, char *err, size_t cap) {
    int errnum = Z_OK;
    const char *msg = gzerror(gz, &errnum);
    if (errnum == Z_ERRNO)
        fail(err, cap, "%s: read failed: %s", path, strerror(errno));
    else if (errnum == Z_MEM_ERROR)
        fail(err, cap, "%s: out of memory while decompressing", path);
    else
        fail(err, cap, "%s: gzip stream is corrupt (%s)", path, msg ? msg : "unknown zlib error");
}

/* Reads up to len bytes (len <= IDX_MAX_READ): how many arrived, fewer only
 * at the end of the data; -1 (with err written) on a read or gzip error. */
static long read_some(const char *path, gzFile gz, uint8_t *buf, size_t len, char *err,
                      size_t cap) {
    size_t got = 0;
    while (got < len) {
        int n = gzread(gz, buf + got, (unsigned)(len - got));
        if (n < 0) {
            fail_gz(path, gz, err, cap);
            return -1;
        }
        if (n == 0) break;
        got += (size_t)n;
    }
    return (long)got;
}

/* Opens PATH for gzread, which passes a file without the gzip magic through
 * unchanged. A directory opens fine under Linux and only fails on the first
 * read, with a less helpful message, so it is refused here. */
static gzFile open_idx(const char *path, char *err, size_t cap) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        fail(err, cap, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        fail(err, cap, "%s: cannot stat: %s", path, strerror(errno));
        close(fd);
        return NULL;
    }
    if (S_ISDIR(st.st_mode)) {
        fail(err, cap, "%s: is a directory, not an IDX file", path);
        close(fd);
        return NULL;
    }
    gzFile gz = gzdopen(fd, "rb");
    if (!gz) {
        fail(err, cap, "%s: cannot open: out of memory for the zlib state", path);
        close(fd);
        return NULL;
    }
    gzbuffer(gz, 128 * 1024);
    return gz;
}

/* Checks the first got (<= 4) bytes of the magic, as far as they go, so
 * that a short file of the wrong kind is called that rather than truncated. */
static int check_magic(const char *path, const uint8_t *m, size_t got, char *err, size_t cap) {
    if ((got > 0 && m[0] != 0) || (got > 1 && m[1] != 0)) {
        if (got == 1)
            fail(err, cap, "%s: is not an IDX file (its one byte is 0x%02x, an IDX file starts "
                 "with 0x00 0x00)", path, m[0]);
        else
            fail(err, cap, "%s: is not an IDX file (it starts with 0x%02x 0x%02x, where an IDX "
                 "file starts with 0x00 0x00)", path, m[0], m[1]);
        return -1;
    }
    if (got > 2 && m[2] != IDX_TYPE_UBYTE) {
        fail(err, cap, "%s: type 0x%02x is not supported, only unsigned bytes (0x08)", path, m[2]);
        return -1;
    }
    if (got > 3 && (m[3] < 1 || m[3] > IDX_MAX_DIMS)) {
        fail(err, cap, "%s: has %u dimensions, an IDX file here has 1 to %d", path, m[3],
             IDX_MAX_DIMS);
        return -1;
    }
    return 0;
}

/* Reads and checks the magic and the sizes; fills ndims, dims and count. */
static int read_header(const char *path, gzFile gz, idx_array *a, char *err, size_t cap) {
    uint8_t head[4 + 4 * IDX_MAX_DIMS];
    long got = read_some(path, gz, head, 4, err, cap);
    if (got < 0) return -1;
    if (check_magic(path, head, (size_t)got, err, cap)) return -1;
    size_t need = 4;
    if (got == 4) {
        a->ndims = head[3];
        need += 4 * (size_t)a->ndims;
        long more = read_some(path, gz, head + 4, need - 4, err, cap);
        if (more < 0) return -1;
        got += more;
    }
    if ((size_t)got < need) {
        fail(err, cap, "%s: is truncated inside its header (%ld bytes%s, the header needs %zu)",
             path, got, got < 4 ? " of the magic" : "", need);
        return -1;
    }
    size_t count = 1;
    int overflow = 0;
    for (unsigned d = 0; d < a->ndims; d++) {
        const uint8_t *p = head + 4 + 4 * d;
        a->dims[d] = (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
        if (a->dims[d] == 0) {
            fail(err, cap, "%s: dimension %u of %u is 0", path, d + 1, a->ndims);
            return -1;
        }
        if (count > SIZE_MAX / a->dims[d]) overflow = 1;
        else count *= a->dims[d];
    }
    char shape[64];
    int len = 0;
    for (unsigned d = 0; d < a->ndims; d++)
        len += snprintf(shape + len, sizeof shape - (size_t)len, "%s%u", d ? " x " : "",
                        (unsigned)a->dims[d]);
    if (overflow) {
        fail(err, cap, "%s: its dimensions %s multiply past the range of size_t", path, shape);
        return -1;
    }
    if (count > IDX_MAX_BYTES) {
        fail(err, cap, "%s: its dimensions %s promise %zu bytes, more than the limit of %zu",
             path, shape, count, IDX_MAX_BYTES);
        return -1;
    }
    a->count = count;
    return 0;
}

/* Reads the count bytes the header promised into a buffer that grows as
 * they arrive (see IDX_FIRST_CHUNK). */
static int read_data(const char *path, gzFile gz, idx_array *a, char *err, size_t cap) {
    size_t capacity = a->count < IDX_FIRST_CHUNK ? a->count : IDX_FIRST_CHUNK;
    a->data = malloc(capacity);
    if (!a->data) {
        fail(err, cap, "%s: out of memory for %zu bytes", path, capacity);
        return -1;
    }
    size_t got = 0;
    while (got < a->count) {
        if (got == capacity) {
            size_t grown = capacity > a->count / 2 ? a->count : 2 * capacity;
            uint8_t *p = realloc(a->data, grown);
            if (!p) {
                fail(err, cap, "%s: out of memory for %zu bytes", path, grown);
                return -1;
            }
            a->data = p;
            capacity = grown;
        }
        size_t want = capacity - got < IDX_MAX_READ ? capacity - got : IDX_MAX_READ;
        long n = read_some(path, gz, a->data + got, want, err, cap);
        if (n < 0) return -1;
        got += (size_t)n;
        if ((size_t)n < want) break;
    }
    if (got < a->count) {
        fail(err, cap, "%s: is truncated: its header promises %zu bytes of data, the file has "
             "only %zu", path, a->count, got);
        return -1;
    }
    return 0;
}

/* After the data: nothing may follow, and a gzip stream must have ended
 * properly. Reading on is also what makes zlib check the gzip trailer's
 * CRC and length, so a corrupt stream whose data happened to inflate is
 * caught here. */
static int check_end(const char *path, gzFile gz, char *err, size_t cap) {
    uint8_t buf[4096];
    size_t extra = 0;
    for (;;) {
        long n = read_some(path, gz, buf, sizeof buf, err, cap);
        if (n < 0) return -1;
        extra += (size_t)n;
        if ((size_t)n < sizeof buf || extra >= IDX_MAX_TRAILING) break;
    }
    if (extra > 0) {
        fail(err, cap, "%s: has %s%zu trailing bytes after its data", path,
             extra >= IDX_MAX_TRAILING ? "at least " : "", extra);
        return -1;
    }
    /* zlib reports a gzip stream cut short as end of file, and says so only
     * through gzerror: without this a file cut inside its 8-byte trailer
     * would load. */
    int errnum = Z_OK;
    gzerror(gz, &errnum);
    if (errnum == Z_BUF_ERROR) {
        fail(err, cap, "%s: is truncated: its gzip stream ends before the gzip trailer", path);
        return -1;
    }
    return 0;
}

int idx_read(const char *path, idx_array *out, char *err, size_t cap) {
    memset(out, 0, sizeof *out);
    gzFile gz = open_idx(path, err, cap);
    if (!gz) return -1;
    int rc = -1;
    if (read_header(path, gz, out, err, cap) == 0 && read_data(path, gz, out, err, cap) == 0 &&
        check_end(path, gz, err, cap) == 0)
        rc = 0;
    gzclose_r(gz);
    if (rc) idx_free(out);
    return rc;
}

void idx_free(idx_array *a) {
    if (!a) return;
    free(a->data);
    memset(a, 0, sizeof *a);
}

/* ---- the Fashion-MNIST pair */

/* Which of DIR/NAME.gz and DIR/NAME to read: the .gz if it exists (or if
 * it cannot be told, so that idx_read says why), else the raw file. */
static int find_file(const char *dir, const char *name, char *path, size_t len, char *err,
                     size_t cap) {
    char raw[PATH_MAX];
    int n = snprintf(path, len, "%s/%s.gz", dir, name);
    if (n < 0 || (size_t)n >= len || (size_t)n >= sizeof raw) {
        fail(err, cap, "%s/%s.gz: the path is too long", dir, name);
        return -1;
    }
    snprintf(raw, sizeof raw, "%s/%s", dir, name);
    struct stat st;
    if (stat(path, &st) == 0 || (errno != ENOENT && errno != ENOTDIR)) return 0;
    if (stat(raw, &st) == 0 || (errno != ENOENT && errno != ENOTDIR)) {
        snprintf(path, len, "%s", raw);
        return 0;
    }
    fail(err, cap,
         "%s: no such file (nor without .gz); install Fashion-MNIST with `apt-get install "
         "dataset-fashion-mnist`, or point --data DIR at a directory that has it",
         path);
    return -1;
}

static int check_labels(const char *path, const idx_array *lab, char *err, size_t cap) {
    for (size_t i = 0; i < lab->count; i++)
        if (lab->data[i] >= 10) {
            fail(err, cap, "%s: label %zu is %u, a label must be 0 to 9", path, i,
                 (unsigned)lab->data[i]);
            return -1;
        }
    return 0;
}

int dataset_load(const char *dir, const char *prefix, dataset *out, char *err, size_t cap) {
    memset(out, 0, sizeof *out);
    char img_path[PATH_MAX], lab_path[PATH_MAX], name[256];
    idx_array img = {0}, lab = {0};
    snprintf(name, sizeof name, "%s-images-idx3-ubyte", prefix);
    if (find_file(dir, name, img_path, sizeof img_path, err, cap)) return -1;
    snprintf(name, sizeof name, "%s-labels-idx1-ubyte", prefix);
    if (find_file(dir, name, lab_path, sizeof lab_path, err, cap)) return -1;
    if (idx_read(img_path, &img, err, cap)) return -1;
    if (idx_read(lab_path, &lab, err, cap)) goto fail;
    if (img.ndims != 3) {
        fail(err, cap, "%s: has %u dimensions, images need 3 (count x rows x cols)", img_path,
             img.ndims);
        goto fail;
    }
    if (lab.ndims != 1) {
        fail(err, cap, "%s: has %u dimensions, labels need 1 (count)", lab_path, lab.ndims);
        goto fail;
    }
    if (lab.dims[0] != img.dims[0]) {
        fail(err, cap, "%s: has %u labels, but %s has %u images", lab_path,
             (unsigned)lab.dims[0], img_path, (unsigned)img.dims[0]);
        goto fail;
    }
    if (check_labels(lab_path, &lab, err, cap)) goto fail;
    out->n = img.dims[0];
    out->rows = img.dims[1];
    out->cols = img.dims[2];
    out->pixels = img.data;
    out->labels = lab.data;
    return 0;
fail:
    idx_free(&img);
    idx_free(&lab);
    return -1;
}

void dataset_free(dataset *d) {
    if (!d) return;
    free(d->pixels);
    free(d->labels);
    memset(d, 0, sizeof *d);
}
