/* Allocation counting for test_noalloc (see alloc_counter.c). */
#ifndef TERSE_TEST_ALLOC_COUNTER_H
#define TERSE_TEST_ALLOC_COUNTER_H

#include <stddef.h>

/* Nonzero when this build also counts allocations made inside shared
 * libraries (no sanitizers). */
extern const int ac_counts_shared_libs;

/* Start counting from zero. */
void ac_arm(void);
/* Stop counting. Returns the allocation calls made by the static library
 * (and the test itself) since ac_arm; *all gets the calls made anywhere in
 * the process (0 when ac_counts_shared_libs is 0). */
size_t ac_disarm(size_t *all);

#endif
