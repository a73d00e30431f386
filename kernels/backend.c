/* What the backends share: writing files, dumping generated sources, the
 * compile driver (declared in kernels/backend.h). */
#include "kernels/backend.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "jit/cache.h"
#include "jit/clock.h"
#include "jit/error.h"
#include "jit/runtime.h"

int sj_backend_write_file(const char *path, const char *data, size_t len) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return -1;
    while (len > 0) {
        ssize_t w = write(fd, data, len);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            int e = errno;
            close(fd);
            errno = e ? e : EIO;
            return -1;
        }
        data += w, len -= (size_t)w;
    }
    return close(fd);
}

static int mkdir_p(const char *dir) {
    char p[PATH_MAX];
    if (snprintf(p, sizeof p, "%s", dir) >= (int)sizeof p) return errno = ENAMETOOLONG, -1;
    for (char *s = p + 1; *s; s++) {
        if (*s != '/') continue;
        *s = '\0';
        if (mkdir(p, 0755) && errno != EEXIST) return -1;
        *s = '/';
    }
    return mkdir(p, 0755) && errno != EEXIST ? -1 : 0;
}

void sj_backend_dump(const sj_runtime *rt, const char *who, const char *dir, const char *tag, const char *ext,
                     const char *src, size_t len) {
    char name[256], path[PATH_MAX];
    snprintf(name, sizeof name, "%s", tag);
    for (char *s = name; *s; s++)
        if (*s == '/') *s = '_';
    if (mkdir_p(dir) || snprintf(path, sizeof path, "%s/%s%s", dir, name, ext) >= (int)sizeof path ||
        sj_backend_write_file(path, src, len))
        sj_logf(rt, SJ_LOG_WARN, "%s: cannot dump %s to %s: %s", who, tag, dir, strerror(errno));
}

sj_status sj_backend_fail(const sj_runtime *rt, const char *who, sj_compile_result *out, const char *tag,
                          const char *what) {
    out->module = NULL;
    memset(out->fns, 0, sizeof out->fns);
    sj_logf(rt, SJ_LOG_COMPILE, "%s: %s: %s", who, tag, what);
    return sj_seterr(SJ_EBACKEND, "%s backend: %s: %s", who, tag, what);
}

const char *sj_backend_error_line(const char *log, int *len) {
    const char *line = log;
    for (const char *p = log; *p; p += strcspn(p, "\n"), p += *p == '\n') {
        int n = (int)strcspn(p, "\n");
        if (memmem(p, (size_t)n, "error", 5)) {
            line = p;
            break;
        }
    }
    *len = (int)strcspn(line, "\n");
    return line;
}

sj_status sj_backend_take_request(const char *who, const sj_compile_req *req, sj_compile_result *out,
                                  const char **tag, char **src) {
    *src = NULL;
    *tag = "unit";
    if (!req || !req->source || req->n_symbols < 0 || req->n_symbols > SJ_COMPILE_SYMBOLS_MAX || (req->n_symbols && !req->symbols)) {
        snprintf(out->log, sizeof out->log, "invalid compile request");
        return sj_seterr(SJ_EINVAL, "%s backend: invalid compile request", who);
    }
    for (int i = 0; i < req->n_symbols; i++)
        if (!req->symbols[i]) return sj_seterr(SJ_EINVAL, "%s backend: symbol %d is NULL", who, i);
    if (req->tag && req->tag[0]) *tag = req->tag;
    if (memchr(req->source, '\0', req->source_len))
        return sj_seterr(SJ_EINVAL, "%s backend: %s: the source contains a NUL byte", who, *tag);
    *src = malloc(req->source_len + 1);
    if (!*src) return sj_seterr(SJ_ENOMEM, "%s backend: out of memory", who);
    memcpy(*src, req->source, req->source_len);
    (*src)[req->source_len] = '\0';
    return SJ_OK;
}

/* -- The compile driver --------------------------------------------------------- */

static void sleep_ms(int ms) {
    double end = sj_now_ms() + ms;
    for (double left; (left = end - sj_now_ms()) > 0;) {
        double step = left < 5 ? left : 5;
        struct timespec ts = {0, (long)(step * 1e6)};
        nanosleep(&ts, NULL);
    }
}

sj_status sj_backend_compile(const sj_backend_driver *d, const sj_compile_req *req, sj_compile_result *out) {
    if (!out) return sj_seterr(SJ_EINVAL, "%s backend: compile: out is NULL", d->who);
    memset(out, 0, sizeof *out);
    if (d->test_delay_ms > 0) sleep_ms(d->test_delay_ms);
    const char *tag;
    char *src;
    sj_status st = sj_backend_take_request(d->who, req, out, &tag, &src);
    if (st) return st;
    const char *parts[8] = {src};
    int n = 1;
    assert(d->n_key_parts < 8);
    for (int i = 0; i < d->n_key_parts; i++) parts[n++] = d->key_parts[i];
    sj_cache_key(out->key, parts, n);
    if (d->dump_dir) sj_backend_dump(d->rt, d->who, d->dump_dir, tag, d->ext, src, req->source_len);

    char note[sizeof out->log + 64] = "", why[256];
    const char *refused = NULL;
    int cached = d->test_fail ? 0 : d->load_cached(d->self, req, out);
    if (cached < 0) snprintf(note, sizeof note, "; cached artifact unusable: %s", out->log);
    if (d->test_fail) {
        snprintf(out->log, sizeof out->log, "compile failed (test hook)");
        st = sj_backend_fail(d->rt, d->who, out, tag, out->log);
    } else if (cached > 0) {
        out->from_cache = true;
        out->log[0] = '\0';
        sj_logf(d->rt, SJ_LOG_COMPILE, "%s: %s: cache hit (key %.16s)", d->who, tag, out->key);
        st = SJ_OK;
    } else if (d->refuse && (refused = d->refuse(d->self, why, sizeof why))) {
        snprintf(out->log, sizeof out->log, "%s", refused);
        st = sj_backend_fail(d->rt, d->who, out, tag, out->log);
    } else {
        out->log[0] = '\0'; /* a failed cache load is just a miss */
        out->module = NULL;
        memset(out->fns, 0, sizeof out->fns);
        st = d->compile_fresh(d->self, req, src, tag, note, out);
    }
    free(src);
    return st;
}
