/* Errors: the thread-local message behind sj_last_error(). */
#ifndef SJ_ERROR_H
#define SJ_ERROR_H

#include <stdbool.h>

#include "jit/shapejit.h"

/* Set this thread's error message (printf-style) and return `status`, so
 * callers can write `return sj_seterr(SJ_EINVAL, "...", ...)`. */
sj_status sj_seterr(sj_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* Is s one of the sj_status values? (A model function may return anything.) */
bool sj_status_known(sj_status s);

/* Clear this thread's message (at the start of each public call). */
void sj_clearerr(void);

/* Prefix the current message with printf-style context ("fn 'enc': ..."). */
void sj_err_prefix(const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;

#endif
