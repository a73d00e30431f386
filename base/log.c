/* Logging: one line per message, to a sink's callback or stderr. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "base/log.h"

static const struct {
    const char *name;
    unsigned bit;
} topics[] = {
#define SJ_X(name, bit, str) {str, bit},
    SJ_LOG_TOPIC_LIST(SJ_X)
#undef SJ_X
};

long sj_log_parse(const char *s, char *bad, size_t n) {
    unsigned mask = 0;
    while (*s) {
        size_t len = strcspn(s, ",");
        if (len == 3 && !strncmp(s, "all", 3)) mask |= SJ_LOG_ALL;
        else if (len == 4 && !strncmp(s, "none", 4)) mask = 0;
        else if (len > 0) {
            unsigned found = 0;
            for (size_t i = 0; i < sizeof topics / sizeof topics[0]; i++)
                if (strlen(topics[i].name) == len && !strncmp(s, topics[i].name, len)) found = topics[i].bit;
            if (!found) {
                snprintf(bad, n, "%.*s", (int)len, s);
                return -1;
            }
            mask |= found;
        }
        s += len;
        if (*s == ',') s++;
    }
    return (long)mask;
}

/* One message is one line: control characters of the text (a compiler's
 * multi-line diagnostics, a function name with a newline) are escaped as
 * \n, \r, \t or \xHH, so a log reader can trust line boundaries. */
static void escape_line(const char *in, char *out, size_t n) {
    static const char hex[] = "0123456789abcdef";
    size_t w = 0;
    for (const unsigned char *p = (const unsigned char *)in; *p && w + 5 < n; p++) {
        unsigned char ch = *p;
        if (ch >= 0x20 && ch != 0x7f) {
            out[w++] = (char)ch;
            continue;
        }
        out[w++] = '\\';
        if (ch == '\n') out[w++] = 'n';
        else if (ch == '\r') out[w++] = 'r';
        else if (ch == '\t') out[w++] = 't';
        else out[w++] = 'x', out[w++] = hex[ch >> 4], out[w++] = hex[ch & 15];
    }
    out[w] = '\0';
}

void sj_log_write(const sj_log_sink *s, unsigned topic, const char *fmt, ...) {
    if (!sj_log_enabled(s, topic)) return;
    char raw[1024], line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(raw, sizeof raw, fmt, ap);
    va_end(ap);
    size_t len = strlen(raw);
    while (len && (raw[len - 1] == '\n' || raw[len - 1] == '\r')) raw[--len] = '\0'; /* a final newline is the line's */
    escape_line(raw, line, sizeof line);
    if (s->fn) {
        s->fn(s->user, topic, line);
    } else {
        const char *name = "log";
        for (size_t i = 0; i < sizeof topics / sizeof topics[0]; i++)
            if (topics[i].bit == topic) name = topics[i].name;
        fprintf(stderr, "shapejit[%s]: %s\n", name, line);
    }
}

/* -- Structured events ------------------------------------------------------------- */

static const char *const event_names[] = {
#define SJ_X(name, text) text,
    SJ_EVENT_LIST(SJ_X)
#undef SJ_X
};
_Static_assert(sizeof event_names / sizeof event_names[0] == SJ_EVENT_COUNT, "one name per event kind");

const char *sj_event_name(sj_event_kind k) { return (unsigned)k < SJ_EVENT_COUNT ? event_names[k] : "?"; }

void sj_log_event(const sj_log_sink *s, const sj_event *ev) {
    if (!sj_log_wants_events(s)) return;
    sj_event e = *ev;
    if (!e.fn) e.fn = "";
    if (!e.shape) e.shape = "";
    if (!e.error) e.error = "";
    s->event_fn(s->event_user, &e);
}
