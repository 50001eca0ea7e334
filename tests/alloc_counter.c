/* Two allocation counters for test_noalloc, active only between ac_arm and
 * ac_disarm.
 *
 * lib: tests/CMakeLists.txt links test_noalloc with -Wl,--wrap=malloc (and
 *      calloc, realloc, posix_memalign, aligned_alloc): every call to those
 *      from the static library and the test objects is bound to __wrap_*
 *      below, which counts and forwards to the real function.
 * all: without sanitizers (which own malloc), this file also replaces
 *      malloc and friends for the whole process -- glibc supports that, and
 *      keeps its own implementation reachable as __libc_* -- so allocations
 *      inside OpenBLAS, LAPACKE or libc's printf are counted too. The
 *      replacements must be exported from the executable to interpose, hence
 *      default visibility. They live in this file, apart from the test, so
 *      the compiler cannot bind the test's own malloc calls to them directly
 *      and bypass the --wrap. */
#include "alloc_counter.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdint.h>

static atomic_int armed;
static atomic_size_t lib_allocs, all_allocs;

void ac_arm(void) {
    lib_allocs = 0;
    all_allocs = 0;
    armed = 1;
}

size_t ac_disarm(size_t *all) {
    armed = 0;
    *all = all_allocs;
    return lib_allocs;
}

void *__real_malloc(size_t size);
void *__real_calloc(size_t count, size_t size);
void *__real_realloc(void *p, size_t size);
int __real_posix_memalign(void **p, size_t align, size_t size);
void *__real_aligned_alloc(size_t align, size_t size);

void *__wrap_malloc(size_t size);
void *__wrap_calloc(size_t count, size_t size);
void *__wrap_realloc(void *p, size_t size);
int __wrap_posix_memalign(void **p, size_t align, size_t size);
void *__wrap_aligned_alloc(size_t align, size_t size);

void *__wrap_malloc(size_t size) {
    if (armed) lib_allocs++;
    return __real_malloc(size);
}
void *__wrap_calloc(size_t count, size_t size) {
    if (armed) lib_allocs++;
    return __real_calloc(count, size);
}
void *__wrap_realloc(void *p, size_t size) {
    if (armed) lib_allocs++;
    return __real_realloc(p, size);
}
int __wrap_posix_memalign(void **p, size_t align, size_t size) {
    if (armed) lib_allocs++;
    return __real_posix_memalign(p, align, size);
}
void *__wrap_aligned_alloc(size_t align, size_t size) {
    if (armed) lib_allocs++;
    return __real_aligned_alloc(align, size);
}

#if TERSE_NOALLOC_INTERPOSE
const int ac_counts_shared_libs = 1;

#define EXPORT __attribute__((visibility("default")))
void *__libc_malloc(size_t size);
void *__libc_calloc(size_t count, size_t size);
void *__libc_realloc(void *p, size_t size);
void *__libc_memalign(size_t align, size_t size);

EXPORT void *malloc(size_t size) {
    if (armed) all_allocs++;
    return __libc_malloc(size);
}
EXPORT void *calloc(size_t count, size_t size) {
    if (armed) all_allocs++;
    return __libc_calloc(count, size);
}
EXPORT void *realloc(void *p, size_t size) {
    if (armed) all_allocs++;
    return __libc_realloc(p, size);
}
EXPORT void *memalign(size_t align, size_t size);
EXPORT void *memalign(size_t align, size_t size) {
    if (armed) all_allocs++;
    return __libc_memalign(align, size);
}
EXPORT void *aligned_alloc(size_t align, size_t size) {
    if (armed) all_allocs++;
    return __libc_memalign(align, size);
}
EXPORT int posix_memalign(void **p, size_t align, size_t size) {
    if (armed) all_allocs++;
    if (align < sizeof(void *) || (align & (align - 1))) return EINVAL;
    void *q = __libc_memalign(align, size);
    if (!q) return ENOMEM;
    *p = q;
    return 0;
}
#else
const int ac_counts_shared_libs = 0;
#endif
