/* What the backends share: writing files, dumping generated sources, units
 * shared by key, the compile driver (declared in kernels/backend.h). */
#include "base/alloc.h"
#include "kernels/backend.h"

#include <assert.h>
#include <errno.h>
#include <stdatomic.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "kernels/cache.h"
#include "kernels/remote.h"
#include "base/clock.h"
#include "base/error.h"
#include "base/log.h"

int sj_backend_write_fd(int fd, const char *data, size_t len) {
    while (len > 0) {
        ssize_t w = write(fd, data, len);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            if (!w) errno = EIO;
            return -1;
        }
        data += w, len -= (size_t)w;
    }
    return 0;
}

int sj_backend_write_file(const char *path, const char *data, size_t len) {
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) return -1;
    if (sj_backend_write_fd(fd, data, len)) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    return close(fd);
}

/* Creates the missing directories of dir, 0700. */
static int mkdir_p(const char *dir) {
    char p[PATH_MAX];
    if (snprintf(p, sizeof p, "%s", dir) >= (int)sizeof p) return errno = ENAMETOOLONG, -1;
    for (char *s = p + 1;; s++) {
        if (*s && *s != '/') continue;
        char was = *s;
        *s = '\0';
        if (mkdir(p, 0700) && errno != EEXIST) return -1;
        *s = was;
        if (!was) break;
    }
    return 0;
}

/* The dump writer trusts the directory no more than the cache does: it is
 * opened without following a symlink and must be the user's and writable
 * by nobody else; a file is written as a new temporary there and renamed
 * over the name (so a planted symlink is replaced, never written through,
 * and no file the writer did not create is truncated). Names keep
 * [A-Za-z0-9._-] and turn anything else (a '/', a newline) into '_'. */
void sj_backend_dump(const sj_log_sink *log, const char *who, const char *dir, const char *tag, const char *ext,
                     const char *src, size_t len) {
    char name[256], tmp[300];
    snprintf(name, sizeof name, "%s%s", tag, ext);
    for (char *s = name; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') || *s == '.' ||
              *s == '-' || *s == '_'))
            *s = '_';
    if (name[0] == '.') name[0] = '_';
    const char *why = NULL;
    struct stat ds;
    int dfd = -1, fd = -1;
    if (mkdir_p(dir) || (dfd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)) < 0 || fstat(dfd, &ds))
        why = errno == ELOOP ? "it is a symbolic link" : strerror(errno);
    else if (ds.st_uid != geteuid()) why = "owned by another user";
    else if (ds.st_mode & (S_IWGRP | S_IWOTH)) why = "writable by group or others";
    if (!why) {
        static _Atomic unsigned long n;
        snprintf(tmp, sizeof tmp, ".sjdump.%ld.%lu", (long)getpid(), atomic_fetch_add(&n, 1));
        fd = openat(dfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
        if (fd < 0 || sj_backend_write_fd(fd, src, len) || close(fd) || renameat(dfd, tmp, dfd, name)) {
            why = strerror(errno);
            if (fd >= 0) unlinkat(dfd, tmp, 0);
        }
    }
    if (dfd >= 0) close(dfd);
    if (why) sj_log_write(log, SJ_LOG_WARN, "%s: cannot dump %s to %s: %s", who, name, dir, why);
}

sj_status sj_backend_fail(const sj_log_sink *log, const char *who, sj_compile_result *out, const char *tag,
                          const char *what) {
    out->module = NULL;
    memset(out->fns, 0, sizeof out->fns);
    sj_log_write(log, SJ_LOG_COMPILE, "%s: %s: %s", who, tag, what);
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
    *src = sj_malloc(req->source_len + 1);
    if (!*src) return sj_seterr(SJ_ENOMEM, "%s backend: out of memory", who);
    memcpy(*src, req->source, req->source_len);
    (*src)[req->source_len] = '\0';
    return SJ_OK;
}

/* -- Units shared by key ------------------------------------------------------- */

typedef struct share_slot {
    char key[65];
    sj_module *m; /* NULL while its first compile runs */
    int refs;
} share_slot;

struct sj_modshare {
    pthread_mutex_t lock;
    pthread_cond_t changed; /* a slot was filled or removed */
    share_slot *slots;
    int n, cap;
};

sj_modshare *sj_modshare_create(void) {
    sj_modshare *s = sj_calloc(1, sizeof *s);
    if (!s) return NULL;
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->changed, NULL);
    return s;
}

void sj_modshare_destroy(sj_modshare *s) {
    if (!s) return;
    assert(s->n == 0);
    pthread_mutex_destroy(&s->lock);
    pthread_cond_destroy(&s->changed);
    free(s->slots);
    free(s);
}

static int find_key(const sj_modshare *s, const char *key) {
    for (int i = 0; i < s->n; i++)
        if (!strcmp(s->slots[i].key, key)) return i;
    return -1;
}

static void remove_slot(sj_modshare *s, int i) { s->slots[i] = s->slots[--s->n]; }

/* A reference to the module loaded under key (true), or false with
 * *reserved set when this thread now compiles it (another thread asking
 * for the key waits until share_publish). Out of memory: false, not
 * reserved (the unit is then compiled and not shared). */
static bool share_acquire(sj_modshare *s, const char *key, sj_module **m, bool *reserved) {
    *reserved = false;
    pthread_mutex_lock(&s->lock);
    for (int i; (i = find_key(s, key)) >= 0;) {
        if (s->slots[i].m) {
            s->slots[i].refs++;
            *m = s->slots[i].m;
            pthread_mutex_unlock(&s->lock);
            return true;
        }
        pthread_cond_wait(&s->changed, &s->lock);
    }
    if (s->n == s->cap) {
        int cap = s->cap ? 2 * s->cap : 16;
        share_slot *ns = sj_realloc(s->slots, (size_t)cap * sizeof *ns);
        if (ns) s->slots = ns, s->cap = cap;
    }
    if (s->n < s->cap) {
        share_slot *sl = &s->slots[s->n++];
        snprintf(sl->key, sizeof sl->key, "%s", key);
        sl->m = NULL;
        sl->refs = 0;
        *reserved = true;
    }
    pthread_mutex_unlock(&s->lock);
    return false;
}

/* The reserved key's compile finished: m (its first reference), or NULL
 * when it failed (a waiter then compiles it itself). */
static void share_publish(sj_modshare *s, const char *key, sj_module *m) {
    pthread_mutex_lock(&s->lock);
    int i = find_key(s, key);
    assert(i >= 0 && !s->slots[i].m);
    if (m) s->slots[i].m = m, s->slots[i].refs = 1;
    else remove_slot(s, i);
    pthread_cond_broadcast(&s->changed);
    pthread_mutex_unlock(&s->lock);
}

bool sj_modshare_release(sj_modshare *s, sj_module *m) {
    if (!s || !m) return true;
    bool last = true;
    pthread_mutex_lock(&s->lock);
    for (int i = 0; i < s->n; i++) {
        if (s->slots[i].m != m) continue;
        if (--s->slots[i].refs > 0) last = false;
        else remove_slot(s, i);
        break;
    }
    pthread_mutex_unlock(&s->lock);
    return last;
}

/* A compile served by a module loaded already (a reference held). */
static sj_status use_shared(const sj_backend_driver *d, const sj_compile_req *req, const char *tag, sj_module *m,
                            sj_compile_result *out) {
    if (!d->resolve(d->self, m, req, out)) {
        if (sj_modshare_release(d->share, m)) d->drop(d->self, m);
        return sj_backend_fail(d->log, d->who, out, tag, out->log);
    }
    sj_cache_touch(d->cache, out->key, d->cache_ext); /* used: not the next to evict */
    out->module = m;
    out->from_cache = out->shared = true;
    out->log[0] = '\0';
    sj_log_write(d->log, SJ_LOG_COMPILE, "%s: %s: shares the unit loaded already (key %.16s)", d->who, tag, out->key);
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

/* The second level: fetch key from the remote cache (verified there),
 * keep it in the disk cache and load it. 1 loaded, 0 not there, -1 there
 * but not loadable (out->log says why). */
static int load_remote(const sj_backend_driver *d, const sj_compile_req *req, const char *tag, sj_compile_result *out) {
    void *data = NULL;
    size_t len = 0;
    if (!sj_remote_get(d->remote, out->key, d->cache_ext, &data, &len)) return 0;
    if (d->cache && sj_cache_store(d->cache, out->key, d->cache_ext, data, len))
        sj_log_write(d->log, SJ_LOG_COMPILE, "%s: %s: remote hit not kept in the disk cache: %s", d->who, tag,
                     sj_last_error());
    int r;
    if (d->load_bytes) r = d->load_bytes(d->self, data, len, req, out);
    else if (d->cache) r = d->load_cached(d->self, req, out) > 0 ? 1 : -1;
    else r = -1, snprintf(out->log, sizeof out->log, "no disk cache to load the remote artifact through");
    free(data);
    return r;
}

/* A fresh compile went to the disk cache: read it back (verified) and push
 * it to the remote cache. */
static void push_remote(const sj_backend_driver *d, const char *key) {
    void *data = NULL;
    size_t len = 0;
    if (!d->cache || !sj_cache_read(d->cache, key, d->cache_ext, &data, &len)) return;
    sj_remote_put(d->remote, key, d->cache_ext, data, len);
    free(data);
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
    if (d->dump_dir) sj_backend_dump(d->log, d->who, d->dump_dir, tag, d->ext, src, req->source_len);

    sj_module *shared = NULL;
    bool reserved = false;
    if (!d->test_fail && d->share && share_acquire(d->share, out->key, &shared, &reserved)) {
        st = use_shared(d, req, tag, shared, out);
        free(src);
        return st;
    }
    char note[sizeof out->log + 64] = "", why[256];
    const char *refused = NULL;
    int cached = d->test_fail ? 0 : d->load_cached(d->self, req, out);
    if (cached < 0) snprintf(note, sizeof note, "; cached artifact unusable: %s", out->log);
    int remote = 0;
    if (cached == 0 && !d->test_fail && d->remote && d->cache_ext) {
        remote = load_remote(d, req, tag, out);
        if (remote < 0) snprintf(note, sizeof note, "; remote artifact unusable: %s", out->log);
    }
    if (d->test_fail) {
        snprintf(out->log, sizeof out->log, "compile failed (test hook)");
        st = sj_backend_fail(d->log, d->who, out, tag, out->log);
    } else if (cached > 0) {
        out->from_cache = true;
        out->log[0] = '\0';
        sj_log_write(d->log, SJ_LOG_COMPILE, "%s: %s: cache hit (key %.16s)", d->who, tag, out->key);
        st = SJ_OK;
    } else if (remote > 0) {
        out->from_cache = out->from_remote = true;
        out->log[0] = '\0';
        sj_log_write(d->log, SJ_LOG_COMPILE, "%s: %s: remote cache hit (key %.16s)", d->who, tag, out->key);
        st = SJ_OK;
    } else if (d->lookup_only) {
        snprintf(out->log, sizeof out->log, "not loaded or cached");
        st = SJ_OK; /* (no module: a miss) */
    } else if (d->refuse && (refused = d->refuse(d->self, why, sizeof why))) {
        snprintf(out->log, sizeof out->log, "%s", refused);
        st = sj_backend_fail(d->log, d->who, out, tag, out->log);
    } else {
        out->log[0] = '\0'; /* a failed cache load is just a miss */
        out->module = NULL;
        memset(out->fns, 0, sizeof out->fns);
        st = d->compile_fresh(d->self, req, src, tag, note, out);
        if (!st && d->remote) push_remote(d, out->key);
    }
    if (reserved) share_publish(d->share, out->key, st ? NULL : out->module);
    free(src);
    return st;
}
