/* Errors: status names and the thread-local message. */
#include "base/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define SJ_ERRMSG_MAX 1024

static _Thread_local char errmsg[SJ_ERRMSG_MAX];

const char *sj_status_name(sj_status s) {
    switch (s) {
#define SJ_X(name, value, desc)                                                                    \
    case name:                                                                                     \
        return #name;
        SJ_STATUS_LIST(SJ_X)
#undef SJ_X
    }
    return "SJ_E?";
}

bool sj_status_known(sj_status s) {
    switch (s) {
#define SJ_X(name, value, desc)                                                                    \
    case name:                                                                                     \
        return true;
        SJ_STATUS_LIST(SJ_X)
#undef SJ_X
    }
    return false;
}

const char *sj_last_error(void) { return errmsg; }

void sj_clearerr(void) { errmsg[0] = '\0'; }

sj_status sj_seterr(sj_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(errmsg, sizeof errmsg, fmt, ap);
    va_end(ap);
    return status;
}

void sj_err_prefix(const char *fmt, ...) {
    char prefix[256], old[SJ_ERRMSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, errmsg, sizeof old);
    size_t n = strlen(prefix);
    if (n >= sizeof errmsg) n = sizeof errmsg - 1;
    memcpy(errmsg, prefix, n);
    size_t rest = strlen(old);
    if (rest > sizeof errmsg - 1 - n) rest = sizeof errmsg - 1 - n;
    memcpy(errmsg + n, old, rest);
    errmsg[n + rest] = '\0';
}
