/* The host's shared-memory segment (life cycle and layout in segment.h). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/error.h"
#include "transport/segment.h"

#define SEG_MAGIC 0x3147455345535254ull /* "TRSESEG1" */
#define PAGE 4096u

typedef struct {
    uint64_t magic, cookie;
    uint64_t members, step_floats, bytes;
} seg_header;

struct terse__seg {
    uint8_t *base;
    size_t bytes;
    int members;
    size_t step_floats;
    size_t flags_off, desc_off, data_off;
    char name[TERSE__SEG_NAME];
    int linked; /* the creator, before terse__seg_unlink */
};

static size_t round_page(size_t x) { return (x + PAGE - 1) & ~(size_t)(PAGE - 1); }

/* The layout for these sizes; 0 on overflow. */
static size_t layout(terse__seg *s, int members, size_t step_floats) {
    s->members = members;
    s->step_floats = step_floats;
    s->flags_off = PAGE;
    s->desc_off = s->flags_off + round_page((size_t)members * sizeof(terse__seg_flags));
    s->data_off = s->desc_off + round_page((size_t)members * ((size_t)members + 1) *
                                           TERSE__SEG_DESC_BYTES);
    size_t blocks = 2 * ((size_t)members + 1);
    if (step_floats > ((size_t)1 << 40) / blocks / sizeof(float)) return 0;
    s->bytes = s->data_off + round_page(blocks * step_floats * sizeof(float));
    return s->bytes;
}

/* Map fd (closed here) as s's segment, kept out of forked children. */
static terse_status map_fd(terse__seg *s, int rank, int fd) {
    void *p = mmap(NULL, s->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    int err = errno;
    close(fd);
    if (p == MAP_FAILED)
        return TERSE_ERROR(TERSE_ERR_TRANSPORT, "rank %d: mapping the shared segment (%zu "
                           "bytes): %s", rank, s->bytes, strerror(err));
    (void)madvise(p, s->bytes, MADV_DONTFORK); /* a forked child is no member */
    s->base = p;
    return TERSE_OK;
}

terse_status terse__seg_create(int rank, int members, size_t step_floats,
                               char name[TERSE__SEG_NAME], uint64_t *cookie, terse__seg **out) {
    *out = NULL;
    terse__seg *s = calloc(1, sizeof *s);
    if (!s) return TERSE_ERROR(TERSE_ERR_NOMEM, "rank %d: allocating the shared segment", rank);
    if (members < 2 || step_floats == 0 || !layout(s, members, step_floats)) {
        free(s);
        return TERSE_ERROR(TERSE_ERR_INVALID, "rank %d: a shared segment for %d members of %zu "
                           "floats a step is not possible", rank, members, step_floats);
    }
    uint8_t rnd[24];
    if (getrandom(rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd) {
        free(s);
        return TERSE_ERROR(TERSE_ERR_TRANSPORT, "rank %d: getrandom for the shared segment's "
                           "name failed: %s", rank, strerror(errno));
    }
    int k = snprintf(s->name, sizeof s->name, "/terse-seg-");
    for (int i = 0; i < 16; i++) k += snprintf(s->name + k, sizeof s->name - (size_t)k, "%02x", rnd[i]);
    memcpy(cookie, rnd + 16, 8);
    int fd = shm_open(s->name, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) {
        terse_status st = TERSE_ERROR(TERSE_ERR_TRANSPORT, "rank %d: creating the shared segment "
                                      "%s: %s", rank, s->name, strerror(errno));
        free(s);
        return st;
    }
    /* the umask may have taken bits away; 0600 exactly, whatever it is.
     * posix_fallocate, not ftruncate alone: tmpfs reserves nothing for a
     * sparse file, and a full /dev/shm (a container's 64 MiB) would then
     * kill a rank with SIGBUS mid-collective instead of failing here, where
     * the ranks fall back to libfabric's shm */
    int err = 0;
    if (fchmod(fd, 0600) != 0 || ftruncate(fd, (off_t)s->bytes) != 0) err = errno;
    else err = posix_fallocate(fd, 0, (off_t)s->bytes);
    if (err) {
        errno = err;
        terse_status st = TERSE_ERROR(TERSE_ERR_TRANSPORT, "rank %d: sizing the shared segment "
                                      "%s to %zu bytes: %s", rank, s->name, s->bytes,
                                      strerror(errno));
        close(fd);
        shm_unlink(s->name);
        free(s);
        return st;
    }
    terse_status st = map_fd(s, rank, fd);
    if (st != TERSE_OK) {
        shm_unlink(s->name);
        free(s);
        return st;
    }
    s->linked = 1;
    seg_header *h = (seg_header *)(void *)s->base;
    h->cookie = *cookie;
    h->members = (uint64_t)members;
    h->step_floats = (uint64_t)step_floats;
    h->bytes = (uint64_t)s->bytes;
    __atomic_store_n(&h->magic, SEG_MAGIC, __ATOMIC_RELEASE);
    memcpy(name, s->name, TERSE__SEG_NAME);
    *out = s;
    return TERSE_OK;
}

terse_status terse__seg_attach(int rank, const char *name, int members, size_t step_floats,
                               uint64_t cookie, terse__seg **out) {
    *out = NULL;
    terse__seg *s = calloc(1, sizeof *s);
    if (!s) return TERSE_ERROR(TERSE_ERR_NOMEM, "rank %d: allocating the shared segment", rank);
    if (members < 2 || step_floats == 0 || !layout(s, members, step_floats) ||
        strncmp(name, "/terse-seg-", 11) != 0 || strlen(name) != 43) {
        free(s);
        return TERSE_ERROR(TERSE_ERR_INVALID, "rank %d: the shared segment's description "
                           "(%d members, %zu floats a step) is not one terse makes", rank,
                           members, step_floats);
    }
    snprintf(s->name, sizeof s->name, "%s", name);
    int fd = shm_open(s->name, O_RDWR | O_NOFOLLOW | O_CLOEXEC, 0);
    if (fd < 0) {
        terse_status st = TERSE_ERROR(TERSE_ERR_TRANSPORT, "rank %d: opening the shared segment "
                                      "%s: %s", rank, s->name, strerror(errno));
        free(s);
        return st;
    }
    struct stat sb;
    const char *bad = NULL;
    if (fstat(fd, &sb) != 0) bad = "cannot be examined";
    else if (!S_ISREG(sb.st_mode)) bad = "is not a regular file";
    else if (sb.st_uid != geteuid()) bad = "belongs to another user";
    else if ((sb.st_mode & 07777) != 0600) bad = "is not private to its user (mode 0600)";
    else if ((size_t)sb.st_size != s->bytes) bad = "has another size than the job's";
    if (bad) {
        close(fd);
        terse_status st = TERSE_ERROR(TERSE_ERR_TRANSPORT, "rank %d: the shared segment %s %s",
                                      rank, s->name, bad);
        free(s);
        return st;
    }
    terse_status st = map_fd(s, rank, fd);
    if (st != TERSE_OK) {
        free(s);
        return st;
    }
    seg_header *h = (seg_header *)(void *)s->base;
    if (__atomic_load_n(&h->magic, __ATOMIC_ACQUIRE) != SEG_MAGIC || h->cookie != cookie ||
        h->members != (uint64_t)members || h->step_floats != (uint64_t)step_floats ||
        h->bytes != (uint64_t)s->bytes) {
        munmap(s->base, s->bytes);
        free(s);
        return TERSE_ERROR(TERSE_ERR_TRANSPORT, "rank %d: the shared segment %s is not the one "
                           "the host's first rank made (its header differs)", rank, name);
    }
    *out = s;
    return TERSE_OK;
}

void terse__seg_unlink(terse__seg *s) {
    if (!s || !s->linked) return;
    shm_unlink(s->name);
    s->linked = 0;
}

void terse__seg_close(terse__seg *s) {
    if (!s) return;
    terse__seg_unlink(s);
    munmap(s->base, s->bytes);
    free(s);
}

static void progress_key(terse__seg *s, int q, uint64_t k[5]) {
    terse__seg_flags *f = terse__seg_flags_of(s, q);
    k[0] = atomic_load(&f->desc_seq);
    k[1] = atomic_load(&f->in);
    k[2] = atomic_load(&f->out);
    k[3] = atomic_load(&f->done);
    k[4] = atomic_load(&f->bar);
}

static int key_less(const uint64_t a[5], const uint64_t b[5]) {
    for (int i = 0; i < 5; i++)
        if (a[i] != b[i]) return a[i] < b[i];
    return 0;
}

int terse__seg_laggard(terse__seg *s, int me, int prefer) {
    int best = -1;
    uint64_t bk[5] = {0}, k[5];
    for (int q = 0; q < s->members; q++) {
        if (q == me) continue;
        progress_key(s, q, k);
        if (best < 0 || key_less(k, bk)) {
            best = q;
            memcpy(bk, k, sizeof bk);
        }
    }
    if (prefer >= 0 && prefer != me && prefer != best) {
        progress_key(s, prefer, k);
        if (!key_less(bk, k)) best = prefer; /* not strictly behind it: no other name */
    }
    return best;
}

int terse__seg_members(const terse__seg *s) { return s->members; }
size_t terse__seg_step_floats(const terse__seg *s) { return s->step_floats; }

terse__seg_flags *terse__seg_flags_of(terse__seg *s, int member) {
    return (terse__seg_flags *)(void *)(s->base + s->flags_off) + member;
}

int terse__seg_descs(const terse__seg *s) { return s->members + 1; }

uint8_t *terse__seg_desc(terse__seg *s, int member, int slot) {
    return s->base + s->desc_off +
           ((size_t)member * ((size_t)s->members + 1) + (size_t)slot) * TERSE__SEG_DESC_BYTES;
}

float *terse__seg_in(terse__seg *s, int parity, int member) {
    size_t block = (size_t)parity * ((size_t)s->members + 1) + (size_t)member;
    return (float *)(void *)(s->base + s->data_off) + block * s->step_floats;
}

float *terse__seg_out(terse__seg *s, int parity) {
    return terse__seg_in(s, parity, s->members);
}
