/* The IDX reader (bench/train/idx.c): Debian's Fashion-MNIST files load with the
 * right shapes and balanced labels; small files round-trip raw and gzipped;
 * and every kind of damage -- each possible truncation, bad headers, sizes
 * that overflow or exceed the cap, trailing bytes, corrupt gzip -- gives a
 * sentence that starts with the path, never a crash or a huge allocation.
 * Each test writes its files into its own mkdtemp directory, removed after. */
#include <criterion/criterion.h>
#include <ftw.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>
#include <zlib.h>

#include "train/train.h"
#include "../sanitizer.h"

/* ---- scratch files */

static char tmpdir[4096];

static void make_tmpdir(void) {
    const char *base = getenv("TMPDIR");
    snprintf(tmpdir, sizeof tmpdir, "%s/terse-idx-XXXXXX", base && *base ? base : "/tmp");
    cr_assert_not_null(mkdtemp(tmpdir), "mkdtemp in %s failed", tmpdir);
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

static void remove_tmpdir(void) {
    if (tmpdir[0]) nftw(tmpdir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* No .timeout here: Criterion 2.4 leaks its timeout records in the parent
 * when tests run in parallel (--jobs 2), which fails the ASan build; ctest's
 * TIMEOUT bounds the whole executable instead. */
TestSuite(idx, .init = make_tmpdir, .fini = remove_tmpdir);
TestSuite(dataset, .init = make_tmpdir, .fini = remove_tmpdir);

/* tmpdir/NAME, in a static buffer of four rotating slots. */
static const char *tmp_path(const char *fmt, ...) {
    static char bufs[4][sizeof tmpdir + 256];
    static int next;
    char name[128];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    char *p = bufs[next++ % 4];
    snprintf(p, sizeof bufs[0], "%s/%s", tmpdir, name);
    return p;
}

static void write_raw(const char *path, const uint8_t *bytes, size_t len) {
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f, "cannot create %s", path);
    cr_assert_eq(fwrite(bytes, 1, len, f), len);
    cr_assert_eq(fclose(f), 0);
}

static void write_gz(const char *path, const uint8_t *bytes, size_t len) {
    gzFile gz = gzopen(path, "wb");
    cr_assert_not_null(gz, "cannot create %s", path);
    if (len) cr_assert_eq(gzwrite(gz, bytes, (unsigned)len), (int)len);
    cr_assert_eq(gzclose(gz), Z_OK);
}

/* The whole of a file, malloc'ed; its length in *len. */
static uint8_t *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "cannot open %s", path);
    uint8_t *buf = malloc(1 << 16);
    *len = fread(buf, 1, 1 << 16, f);
    fclose(f);
    return buf;
}

/* ---- IDX images in memory */

static void put_be32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24), p[1] = (uint8_t)(v >> 16), p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

/* An IDX file of ndims dims with data byte i = (i * 37 + 11) % 251, which
 * neither repeats with the dims nor compresses to nothing. */
static size_t make_idx(uint8_t *out, unsigned ndims, const uint32_t *dims) {
    out[0] = 0, out[1] = 0, out[2] = 0x08, out[3] = (uint8_t)ndims;
    size_t count = 1, at = 4 + 4 * (size_t)ndims;
    for (unsigned d = 0; d < ndims; d++) {
        put_be32(out + 4 + 4 * d, dims[d]);
        count *= dims[d];
    }
    for (size_t i = 0; i < count; i++) out[at + i] = (uint8_t)((i * 37 + 11) % 251);
    return at + count;
}

/* A header alone (no data), for the size checks. */
static size_t make_header(uint8_t *out, unsigned ndims, const uint32_t *dims) {
    out[0] = 0, out[1] = 0, out[2] = 0x08, out[3] = (uint8_t)ndims;
    for (unsigned d = 0; d < ndims; d++) put_be32(out + 4 + 4 * d, dims[d]);
    return 4 + 4 * (size_t)ndims;
}

/* idx_read must fail on PATH with a sentence that starts with the path and
 * contains WORD, and leave the array empty. */
static void expect_failure(const char *path, const char *word) {
    idx_array a;
    memset(&a, 0xA5, sizeof a);
    char err[512] = "";
    cr_assert_eq(idx_read(path, &a, err, sizeof err), -1, "%s loaded, it should not", path);
    cr_assert_eq(strncmp(err, path, strlen(path)), 0, "error does not start with the path: %s",
                 err);
    cr_assert_not_null(strstr(err, word), "error lacks \"%s\": %s", word, err);
    cr_assert_null(a.data);
    cr_assert_eq(a.count, 0);
    idx_free(&a);
}

static void expect_bytes_fail(const uint8_t *bytes, size_t len, const char *word) {
    const char *path = tmp_path("bad-%zu", len);
    write_raw(path, bytes, len);
    expect_failure(path, word);
}

static void expect_roundtrip(const char *path, const uint8_t *file, unsigned ndims,
                             const uint32_t *dims, size_t count) {
    idx_array a;
    char err[512] = "";
    cr_assert_eq(idx_read(path, &a, err, sizeof err), 0, "%s", err);
    cr_assert_eq(a.ndims, ndims);
    for (unsigned d = 0; d < ndims; d++) cr_assert_eq(a.dims[d], dims[d]);
    cr_assert_eq(a.count, count);
    cr_assert_arr_eq(a.data, file + 4 + 4 * ndims, count);
    idx_free(&a);
    cr_assert_null(a.data);
    idx_free(&a); /* twice is fine */
}

/* ---- good files */

Test(idx, small_files_round_trip_raw_and_gzipped_for_every_dimension_count) {
    static const uint32_t dims[4] = {3, 5, 7, 2};
    uint8_t file[512];
    for (unsigned nd = 1; nd <= 4; nd++) {
        size_t len = make_idx(file, nd, dims), count = len - 4 - 4 * nd;
        const char *raw = tmp_path("good-%u", nd), *gz = tmp_path("good-%u.gz", nd);
        write_raw(raw, file, len);
        write_gz(gz, file, len);
        expect_roundtrip(raw, file, nd, dims, count);
        expect_roundtrip(gz, file, nd, dims, count);
    }
}

Test(idx, a_file_of_a_megabyte_and_more_reads_back_exactly) {
    /* Past the reader's first 1 MiB buffer, so the growing path runs. */
    static const uint32_t dims[3] = {1500, 28, 28};
    size_t cap = 16 + 1500 * 784;
    uint8_t *file = malloc(cap);
    size_t len = make_idx(file, 3, dims);
    cr_assert_eq(len, cap);
    write_raw(tmp_path("big"), file, len);
    write_gz(tmp_path("big.gz"), file, len);
    expect_roundtrip(tmp_path("big"), file, 3, dims, 1500 * 784);
    expect_roundtrip(tmp_path("big.gz"), file, 3, dims, 1500 * 784);
    free(file);
}

/* ---- truncation */

/* Cut the raw file short at every length; the same cut, gzipped. A cut in
 * the 16-byte header says so; a cut in the data says what was promised. */
Test(idx, every_truncation_fails_and_says_whether_it_is_in_the_header_or_the_data) {
    static const uint32_t dims[3] = {2, 3, 5};
    uint8_t file[64];
    size_t len = make_idx(file, 3, dims);
    for (size_t cut = 0; cut < len; cut++) {
        const char *word = cut < 16 ? "truncated inside its header" : "header promises 30 bytes";
        const char *raw = tmp_path("cut-%zu", cut), *gz = tmp_path("cut-%zu.gz", cut);
        write_raw(raw, file, cut);
        write_gz(gz, file, cut);
        expect_failure(raw, word);
        expect_failure(gz, word);
    }
}

/* Cut the gzip file itself at every length, including inside its 8-byte
 * trailer, where all the data has inflated and only zlib's end-of-stream
 * error tells. One byte (0x1f) is not gzip yet, so it is read raw. */
Test(idx, every_truncation_of_a_gzip_file_fails) {
    static const uint32_t dims[3] = {2, 3, 5};
    uint8_t file[64];
    size_t len = make_idx(file, 3, dims), gzlen;
    write_gz(tmp_path("whole.gz"), file, len);
    uint8_t *gz = slurp(tmp_path("whole.gz"), &gzlen);
    for (size_t cut = 0; cut < gzlen; cut++) {
        const char *path = tmp_path("gzcut-%zu.gz", cut);
        write_raw(path, gz, cut);
        expect_failure(path, cut == 1 ? "not an IDX file" : "truncated");
    }
    free(gz);
}

/* ---- bad headers */

Test(idx, wrong_magic_is_not_an_idx_file) {
    const uint8_t text[] = "hello, world";
    expect_bytes_fail(text, sizeof text - 1, "not an IDX file");
    const uint8_t one[] = {0x01, 0x00, 0x08, 0x01, 0, 0, 0, 1, 7};
    expect_bytes_fail(one, sizeof one, "not an IDX file");
    const uint8_t two[] = {0x00, 0x02, 0x08, 0x01, 0, 0, 0, 1, 7};
    expect_bytes_fail(two, sizeof two, "not an IDX file");
    expect_bytes_fail((const uint8_t *)"x", 1, "not an IDX file");
}

Test(idx, a_type_other_than_unsigned_bytes_is_refused) {
    const uint8_t floats[] = {0, 0, 0x0D, 1, 0, 0, 0, 1, 0, 0, 0x80, 0x3f};
    expect_bytes_fail(floats, sizeof floats, "type 0x0d is not supported");
    const uint8_t sbytes[] = {0, 0, 0x09, 1, 0, 0, 0, 1, 7};
    expect_bytes_fail(sbytes, sizeof sbytes, "type 0x09 is not supported");
}

Test(idx, zero_or_more_than_four_dimensions_are_refused) {
    const uint8_t none[] = {0, 0, 8, 0, 7};
    expect_bytes_fail(none, sizeof none, "has 0 dimensions");
    uint8_t five[4 + 20 + 1] = {0, 0, 8, 5};
    for (int d = 0; d < 5; d++) five[4 + 4 * d + 3] = 1;
    five[24] = 9;
    expect_bytes_fail(five, sizeof five, "has 5 dimensions");
    const uint8_t many[] = {0, 0, 8, 255};
    expect_bytes_fail(many, sizeof many, "has 255 dimensions");
}

Test(idx, a_zero_dimension_is_refused) {
    static const uint32_t dims[3] = {4, 0, 2};
    uint8_t file[64];
    size_t len = make_header(file, 3, dims);
    expect_bytes_fail(file, len, "dimension 2 of 3 is 0");
}

/* Caps this test process's address space at what it uses now plus 256 MiB,
 * so that an allocation of gigabytes fails (and the reader says "out of
 * memory" instead of what the test expects). Criterion runs each test in its
 * own process, so the cap ends with the test. Not under ASan, which reserves
 * terabytes of shadow memory up front. */
static void cap_address_space(void) {
#if !UNDER_ASAN
    unsigned long pages = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    cr_assert_not_null(f);
    cr_assert_eq(fscanf(f, "%lu", &pages), 1);
    fclose(f);
    rlim_t now = (rlim_t)pages * (rlim_t)sysconf(_SC_PAGESIZE);
    struct rlimit lim = {now + ((rlim_t)256 << 20), now + ((rlim_t)256 << 20)};
    cr_assert_eq(setrlimit(RLIMIT_AS, &lim), 0);
#endif
}

/* These headers promise more than any machine has; the reader must refuse
 * them from the header alone, allocating nothing. */
Test(idx, sizes_that_overflow_or_pass_the_cap_fail_without_allocating) {
    cap_address_space();
    static const uint32_t huge[4] = {0xFFFFFFFFu, 0xFFFFFFFFu, 0xFFFFFFFFu, 0xFFFFFFFFu};
    uint8_t file[32];
    size_t len = make_header(file, 4, huge);
    expect_bytes_fail(file, len, "multiply past the range of size_t");
    static const uint32_t over[2] = {65536, 65537};
    len = make_header(file, 2, over);
    expect_bytes_fail(file, len, "more than the limit");
    static const uint32_t over2[2] = {0xFFFFFFFFu, 0xFFFFFFFFu}; /* just fits in 64 bits */
    len = make_header(file, 2, over2);
    expect_bytes_fail(file, len, "more than the limit");
}

/* Exactly IDX_MAX_BYTES is allowed, but a file with no data behind it must
 * not cost 4 GiB: it is read as it arrives and found truncated. */
Test(idx, the_largest_promise_with_no_data_is_truncated_not_allocated) {
    cap_address_space();
    static const uint32_t max[2] = {65536, 65536};
    uint8_t file[64];
    size_t len = make_header(file, 2, max);
    file[len] = 42;
    expect_bytes_fail(file, len + 1,
                      "header promises 4294967296 bytes of data, the file has only 1");
}

Test(idx, trailing_bytes_after_the_data_are_refused_raw_and_gzipped) {
    static const uint32_t dims[2] = {4, 4};
    uint8_t file[64];
    size_t len = make_idx(file, 2, dims);
    memcpy(file + len, "abc", 3);
    expect_bytes_fail(file, len + 1, "has 1 trailing bytes");
    write_gz(tmp_path("trail.gz"), file, len + 3);
    expect_failure(tmp_path("trail.gz"), "has 3 trailing bytes");
}

Test(idx, many_trailing_bytes_are_counted_only_up_to_a_megabyte) {
    static const uint32_t dims[1] = {10};
    size_t big = 3u << 20;
    uint8_t *file = calloc(1, 64 + big);
    size_t len = make_idx(file, 1, dims);
    write_gz(tmp_path("bomb.gz"), file, len + big);
    expect_failure(tmp_path("bomb.gz"), "has at least 1048576 trailing bytes");
    free(file);
}

/* ---- corrupt gzip */

static uint8_t *good_gz(size_t *gzlen) {
    static const uint32_t dims[3] = {2, 16, 16};
    uint8_t file[600];
    size_t len = make_idx(file, 3, dims);
    write_gz(tmp_path("src.gz"), file, len);
    return slurp(tmp_path("src.gz"), gzlen);
}

Test(idx, a_wrong_gzip_checksum_is_reported_as_corrupt) {
    size_t gzlen;
    uint8_t *gz = good_gz(&gzlen);
    gz[gzlen - 8] ^= 0x01; /* the CRC-32 in the trailer */
    write_raw(tmp_path("crc.gz"), gz, gzlen);
    expect_failure(tmp_path("crc.gz"), "gzip stream is corrupt");
    free(gz);
}

/* Flip each byte of the deflate data in turn (between the 10-byte gzip
 * header and the 8-byte trailer). What the damage decodes to varies --
 * a bad code, a CRC mismatch, a garbled IDX header -- so only failure with
 * the path in front is asserted, for every position. */
Test(idx, every_flipped_byte_in_the_deflate_stream_fails_cleanly) {
    size_t gzlen;
    uint8_t *gz = good_gz(&gzlen);
    int corrupt = 0;
    for (size_t at = 10; at + 8 < gzlen; at++) {
        gz[at] ^= 0xFF;
        const char *path = tmp_path("flip-%zu.gz", at);
        write_raw(path, gz, gzlen);
        gz[at] ^= 0xFF;
        idx_array a;
        char err[512] = "";
        cr_assert_eq(idx_read(path, &a, err, sizeof err), -1, "flipped byte %zu loaded", at);
        cr_assert_eq(strncmp(err, path, strlen(path)), 0, "%s", err);
        corrupt += strstr(err, "corrupt") != NULL;
        remove(path);
    }
    cr_assert_gt(corrupt, 0, "no flip was reported as a corrupt gzip stream");
    free(gz);
}

/* ---- the file itself */

Test(idx, a_missing_file_cannot_be_opened) {
    expect_failure(tmp_path("absent"), "cannot open: No such file or directory");
}

Test(idx, a_directory_is_not_a_file) { expect_failure(tmpdir, "is a directory"); }

Test(idx, an_empty_file_is_truncated) {
    const uint8_t nothing[1] = {0};
    write_raw(tmp_path("empty"), nothing, 0);
    expect_failure(tmp_path("empty"), "truncated inside its header");
}

Test(idx, a_tiny_error_buffer_is_respected_and_a_null_one_tolerated) {
    char err[8];
    memset(err, 'z', sizeof err);
    idx_array a;
    cr_assert_eq(idx_read(tmp_path("absent"), &a, err, 5), -1);
    cr_assert_eq(strlen(err), 4);
    cr_assert_eq(err[5], 'z');
    cr_assert_eq(idx_read(tmp_path("absent"), &a, NULL, 0), -1);
}

/* ---- dataset_load */

/* Writes DIR/PREFIX-images-idx3-ubyte and -labels-idx1-ubyte (with .gz if
 * gz), n images of 2 x 3 with the given labels. */
static void write_pair(const char *prefix, int gz, uint32_t n_images, const uint8_t *labels,
                       uint32_t n_labels) {
    uint8_t *file = malloc(64 + 6 * (size_t)n_images);
    const uint32_t idims[3] = {n_images, 2, 3};
    size_t len = make_idx(file, 3, idims);
    const char *ip = tmp_path("%s-images-idx3-ubyte%s", prefix, gz ? ".gz" : "");
    (gz ? write_gz : write_raw)(ip, file, len);
    const uint32_t ldims[1] = {n_labels};
    len = make_header(file, 1, ldims);
    memcpy(file + len, labels, n_labels);
    const char *lp = tmp_path("%s-labels-idx1-ubyte%s", prefix, gz ? ".gz" : "");
    (gz ? write_gz : write_raw)(lp, file, len + n_labels);
    free(file);
}

static void expect_load_failure(const char *dir, const char *prefix, const char *word) {
    dataset d;
    memset(&d, 0xA5, sizeof d);
    char err[512] = "";
    cr_assert_eq(dataset_load(dir, prefix, &d, err, sizeof err), -1, "loaded, should not");
    cr_assert_not_null(strstr(err, word), "error lacks \"%s\": %s", word, err);
    cr_assert_null(d.pixels);
    cr_assert_null(d.labels);
    dataset_free(&d);
}

Test(dataset, debian_fashion_mnist_loads_with_balanced_labels) {
    static const struct { const char *prefix; size_t n; } sets[] = {{"t10k", 10000},
                                                                      {"train", 60000}};
    for (size_t s = 0; s < 2; s++) {
        dataset d;
        char err[512] = "";
        cr_assert_eq(dataset_load(TRAIN_DEFAULT_DATA, sets[s].prefix, &d, err, sizeof err), 0,
                     "%s", err);
        cr_assert_eq(d.n, sets[s].n);
        cr_assert_eq(d.rows, 28);
        cr_assert_eq(d.cols, 28);
        size_t hist[10] = {0};
        for (size_t i = 0; i < d.n; i++) hist[d.labels[i]]++;
        for (int c = 0; c < 10; c++)
            cr_assert_eq(hist[c], d.n / 10, "%s: class %d has %zu images", sets[s].prefix, c,
                         hist[c]);
        /* Not all black: the first image has ink, and some pixel is 255. */
        size_t ink = 0, full = 0;
        for (size_t i = 0; i < 784; i++) ink += d.pixels[i] != 0;
        for (size_t i = 0; i < d.n * 784; i++) full += d.pixels[i] == 255;
        cr_assert_gt(ink, 50);
        cr_assert_gt(full, 0);
        dataset_free(&d);
        cr_assert_null(d.pixels);
        dataset_free(&d);
    }
}

Test(dataset, a_small_pair_loads_raw_or_gzipped_and_gzip_wins_when_both_exist) {
    const uint8_t raw_labels[4] = {0, 9, 3, 3}, gz_labels[4] = {1, 2, 5, 8};
    write_pair("raw", 0, 4, raw_labels, 4);
    write_pair("both", 0, 4, raw_labels, 4);
    write_pair("both", 1, 4, gz_labels, 4);
    dataset d;
    char err[512] = "";
    cr_assert_eq(dataset_load(tmpdir, "raw", &d, err, sizeof err), 0, "%s", err);
    cr_assert_eq(d.n, 4);
    cr_assert_eq(d.rows, 2);
    cr_assert_eq(d.cols, 3);
    cr_assert_arr_eq(d.labels, raw_labels, 4);
    for (size_t i = 0; i < 24; i++) cr_assert_eq(d.pixels[i], (uint8_t)((i * 37 + 11) % 251));
    dataset_free(&d);
    cr_assert_eq(dataset_load(tmpdir, "both", &d, err, sizeof err), 0, "%s", err);
    cr_assert_arr_eq(d.labels, gz_labels, 4);
    dataset_free(&d);
}

Test(dataset, a_missing_directory_names_the_gz_path_and_the_debian_package) {
    const char *dir = tmp_path("no-such-dir");
    expect_load_failure(dir, "train", "dataset-fashion-mnist");
    expect_load_failure(dir, "train", "no-such-dir/train-images-idx3-ubyte.gz");
    expect_load_failure(dir, "train", "--data DIR");
}

Test(dataset, images_without_labels_name_the_missing_labels_file) {
    const uint8_t labels[2] = {1, 2};
    write_pair("half", 1, 2, labels, 2);
    remove(tmp_path("half-labels-idx1-ubyte.gz"));
    expect_load_failure(tmpdir, "half", "half-labels-idx1-ubyte.gz: no such file");
}

Test(dataset, a_label_of_ten_or_more_is_named_by_index) {
    const uint8_t labels[3] = {1, 12, 3};
    write_pair("badlabel", 1, 3, labels, 3);
    expect_load_failure(tmpdir, "badlabel", "label 1 is 12");
}

Test(dataset, image_and_label_counts_must_agree) {
    const uint8_t labels[4] = {1, 2, 3, 4};
    write_pair("mismatch", 1, 3, labels, 4);
    expect_load_failure(tmpdir, "mismatch", "has 4 labels, but");
}

Test(dataset, labels_must_be_one_dimensional_and_images_three) {
    const uint8_t labels[3] = {1, 2, 3};
    write_pair("lab3", 0, 3, labels, 3);
    static const uint32_t ldims[3] = {3, 1, 1};
    uint8_t file[64];
    size_t len = make_idx(file, 3, ldims);
    for (size_t i = 0; i < 3; i++) file[len - 3 + i] = (uint8_t)i;
    write_raw(tmp_path("lab3-labels-idx1-ubyte"), file, len);
    expect_load_failure(tmpdir, "lab3", "labels need 1");

    write_pair("img2", 0, 3, labels, 3);
    static const uint32_t idims[2] = {3, 6};
    len = make_idx(file, 2, idims);
    write_raw(tmp_path("img2-images-idx3-ubyte"), file, len);
    expect_load_failure(tmpdir, "img2", "images need 3");
}

Test(dataset, a_damaged_file_is_reported_through_dataset_load) {
    const uint8_t labels[3] = {1, 2, 3};
    write_pair("cut", 0, 3, labels, 3);
    write_raw(tmp_path("cut-images-idx3-ubyte"), (const uint8_t *)"\0\0\x08\x03", 4);
    expect_load_failure(tmpdir, "cut", "cut-images-idx3-ubyte: is truncated inside its header");
}

Test(dataset, dataset_free_is_safe_on_a_zeroed_struct_and_twice) {
    dataset d = {0};
    dataset_free(&d);
    dataset_free(&d);
    dataset_free(NULL);
    idx_free(NULL);
}
