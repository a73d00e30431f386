/* A log sink: where a module's log lines go (the runtime's mask, callback
 * and its user pointer), a handle lower floors hold without knowing the
 * runtime. One call, one line: the message is formatted into a bounded
 * buffer and handed to the callback, or printed as "shapejit[topic]: ...". */
#ifndef SJ_BASE_LOG_H
#define SJ_BASE_LOG_H

#include <stddef.h>

#include "jit/shapejit.h"

typedef struct sj_log_sink {
    unsigned mask; /* topics enabled (SJ_LOG_*) */
    sj_log_fn fn;  /* NULL: stderr */
    void *user;
    sj_event_fn event_fn; /* structured events; NULL: none */
    void *event_user;
} sj_log_sink;

/* Write one line under `topic` if s enables it; s may be NULL (nothing). */
void sj_log_write(const sj_log_sink *s, unsigned topic, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* Send a structured event if s has an event callback (s may be NULL).
 * NULL strings are sent as "". */
void sj_log_event(const sj_log_sink *s, const sj_event *ev);

static inline int sj_log_wants_events(const sj_log_sink *s) { return s && s->event_fn; }

static inline int sj_log_enabled(const sj_log_sink *s, unsigned topic) { return s && (s->mask & topic) != 0; }

/* Parse a SHAPEJIT_LOG value into a mask; -1 if a name is unknown (the
 * unknown name is copied to bad). */
long sj_log_parse(const char *s, char *bad, size_t n);

#endif
