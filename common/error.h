/* Error flow: one set of macros that record file:line and a sentence into the
 * thread-local terse_last_error(), and a single `goto fail` cleanup path. */
#ifndef TERSE_COMMON_ERROR_H
#define TERSE_COMMON_ERROR_H

#include "terse.h"

#if defined(__GNUC__) || defined(__clang__)
#define TERSE__PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define TERSE__PRINTF(a, b)
#endif

/* Record a sentence for terse_last_error() and return status. */
terse_status terse__error_at(const char *file, int line, terse_status status,
                             const char *fmt, ...) TERSE__PRINTF(4, 5);

/* Replace this thread's terse_last_error() with text verbatim: carries a
 * sentence recorded on the progress thread to the thread that waits. */
void terse__error_restore(const char *text);

#define TERSE_ERROR(status, ...) terse__error_at(__FILE__, __LINE__, (status), __VA_ARGS__)

/* Evaluate a call returning terse_status; on failure return its status (the
 * callee has already recorded the sentence). */
#define TERSE_CHECK(call)                          \
    do {                                           \
        terse_status terse__s = (call);            \
        if (terse__s != TERSE_OK) return terse__s; \
    } while (0)

/* Same, but jump to `label` with the status stored in `res`. */
#define TERSE_CHECK_GOTO(call, res, label) \
    do {                                   \
        (res) = (call);                    \
        if ((res) != TERSE_OK) goto label; \
    } while (0)

/* Raise an error and jump. */
#define TERSE_FAIL_GOTO(res, label, status, ...)       \
    do {                                               \
        (res) = TERSE_ERROR((status), __VA_ARGS__);    \
        goto label;                                    \
    } while (0)

#endif
