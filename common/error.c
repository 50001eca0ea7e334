#include "common/error.h"
#include "terse_plugin.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char last_error[512];

const char *terse_strerror(terse_status status) {
    switch (status) {
#define TERSE_STATUS_TEXT_(name, value, text) \
    case name:                                \
        return text;
        TERSE_STATUS_LIST(TERSE_STATUS_TEXT_)
#undef TERSE_STATUS_TEXT_
    }
    return "unknown status";
}

const char *terse_status_name(terse_status status) {
    switch (status) {
#define TERSE_STATUS_NAME_(name, value, text) \
    case name:                                \
        return #name;
        TERSE_STATUS_LIST(TERSE_STATUS_NAME_)
#undef TERSE_STATUS_NAME_
    }
    return "TERSE_ERR_UNKNOWN";
}

const char *terse_last_error(void) { return last_error; }

static terse_status error_v(const char *file, int line, terse_status status,
                            const char *fmt, va_list ap) {
    char msg[400];
    vsnprintf(msg, sizeof msg, fmt, ap);
    const char *base = file ? strrchr(file, '/') : NULL;
    base = base ? base + 1 : file;
    if (base)
        snprintf(last_error, sizeof last_error, "%s: %s (%s:%d)",
                 terse_status_name(status), msg, base, line);
    else
        snprintf(last_error, sizeof last_error, "%s: %s", terse_status_name(status), msg);
    return status;
}

terse_status terse__error_at(const char *file, int line, terse_status status,
                             const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    error_v(file, line, status, fmt, ap);
    va_end(ap);
    return status;
}

terse_status terse_plugin_error(terse_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    error_v(NULL, 0, status, fmt, ap);
    va_end(ap);
    return status;
}

void terse__error_restore(const char *text) {
    snprintf(last_error, sizeof last_error, "%s", text ? text : "");
}
