/* The persistent kernel cache (see cache.h).
 *
 * Files in the directory:
 *   <key>.<ext>          the artifact, byte for byte as the backend loads it
 *   <key>.meta           "shapejit-cache 2", the ext, the size and the
 *                        digest of the artifact, one per line
 *   .sjtmp.<pid>.<n>.<t> a temporary being written; renamed into place
 * Anything else is not ours and is never touched.
 *
 * Trust (README "The kernel cache's trust rules"): the directory is opened
 * once, without following a symlink, and checked: a private cache must be
 * owned by the effective user and writable by nobody else; a directory
 * that is not (shared between users) is used only with a key. Every file
 * is opened relative to that directory handle with O_NOFOLLOW|O_NONBLOCK,
 * checked on its handle (a regular file; without a key also owned by the
 * user and writable by nobody else; a bounded size) and read through that
 * handle only. The digest is BLAKE2b-256 (libsodium) over a domain tag,
 * the entry's cache key, its extension and its bytes, keyed with a key
 * derived from cache_key when one is set (then a forged entry cannot carry
 * a valid digest). Callers get the verified bytes (sj_cache_load), never a
 * path to open again. Files are created 0600 (0644 in a keyed cache, which
 * other users may read), directories 0700, whatever the umask.
 *
 * A store writes the artifact first and the meta second, each through a
 * temporary and rename(2), so a reader sees either nothing, an artifact
 * without a meta (a miss), or both complete. Races between processes can
 * only cost a recompile: a lookup trusts nothing that it has not verified
 * against the meta, and a file deleted under us is a miss.
 *
 * Locks: `lock` guards the counters only; `evict_lock` serialises this
 * process's eviction scans. They are never held together.
 */
#include "kernels/cache.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <sodium.h>

#include "base/error.h"
#include "base/log.h"

#define META_MAGIC "shapejit-cache 2"
#define DIGEST_TAG "shapejit kernel cache entry v2"
/* The most bytes an artifact may have; a larger file is refused. */
#define ARTIFACT_MAX (UINT64_C(1) << 30)
#define TMP_PREFIX ".sjtmp."
#define TMP_MAX_AGE_S 3600
#define EXT_MAX 15

struct sj_cache {
    char *dir;
    int dfd;               /* the directory, opened once and checked */
    bool keyed;            /* a key is set: digests are keyed; shared dirs allowed */
    uint8_t mac_key[crypto_generichash_KEYBYTES];
    const sj_log_sink *log;
    _Atomic bool warned;   /* one warning per cache for refused entries */
    bool readonly;         /* sj_cache_set_readonly: nothing is written or deleted */
    uint64_t max_bytes;
    pthread_mutex_t lock; /* guards stats */
    pthread_mutex_t evict_lock;
    sj_cache_stats stats;
};

/* Distinguishes temporaries of several caches (or threads) in one process. */
static _Atomic unsigned long tmp_counter;

/* -- Hashing ---------------------------------------------------------------
 * BLAKE2b (libsodium's crypto_generichash) for keys and digests. */

static pthread_once_t sodium_once = PTHREAD_ONCE_INIT;
static int sodium_ok;

static void sodium_start(void) { sodium_ok = sodium_init() >= 0; }

static bool crypto_ready(void) {
    pthread_once(&sodium_once, sodium_start);
    return sodium_ok;
}

static void to_hex(char *out, const uint8_t *h, size_t n) {
    static const char hex[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) out[2 * i] = hex[h[i] >> 4], out[2 * i + 1] = hex[h[i] & 15];
    out[2 * n] = '\0';
}

void sj_cache_key(char out[65], const char *const *parts, int n_parts) {
    crypto_ready();
    crypto_generichash_state s;
    crypto_generichash_init(&s, NULL, 0, 32);
    for (int i = 0; i < n_parts; i++) {
        const char *p = parts && parts[i] ? parts[i] : "";
        uint64_t len = strlen(p);
        uint8_t lb[8];
        for (int b = 0; b < 8; b++) lb[b] = (uint8_t)(len >> (8 * b));
        crypto_generichash_update(&s, lb, 8);
        crypto_generichash_update(&s, (const uint8_t *)p, (size_t)len);
    }
    uint8_t h[32];
    crypto_generichash_final(&s, h, sizeof h);
    to_hex(out, h, sizeof h);
}

/* The digest of an entry: keyed when the cache has a key, bound to the
 * entry's cache key and extension so bytes cannot move between entries.
 * The remote cache and bundles use the same digest (sj_cache_digest). */
static void digest_start(const uint8_t *mac_key, crypto_generichash_state *s, const char *key, const char *ext) {
    crypto_generichash_init(s, mac_key, mac_key ? SJ_CACHE_MAC_BYTES : 0, 32);
    crypto_generichash_update(s, (const uint8_t *)DIGEST_TAG, sizeof DIGEST_TAG);
    crypto_generichash_update(s, (const uint8_t *)key, 65);
    crypto_generichash_update(s, (const uint8_t *)ext, strlen(ext) + 1);
}

static void digest_init(const sj_cache *c, crypto_generichash_state *s, const char *key, const char *ext) {
    digest_start(c->keyed ? c->mac_key : NULL, s, key, ext);
}

_Static_assert(SJ_CACHE_MAC_BYTES == crypto_generichash_KEYBYTES, "the MAC key is a BLAKE2b key");

bool sj_cache_mac_key(uint8_t out[SJ_CACHE_MAC_BYTES], const char *secret) {
    if (!secret || !*secret || !crypto_ready()) return false;
    crypto_generichash(out, SJ_CACHE_MAC_BYTES, (const uint8_t *)secret, strlen(secret), NULL, 0);
    return true;
}

void sj_cache_digest(const uint8_t *mac_key, const char *key, const char *ext, const void *data, size_t len,
                     uint8_t out[32]) {
    crypto_ready();
    crypto_generichash_state s;
    digest_start(mac_key, &s, key, ext);
    crypto_generichash_update(&s, data, len);
    crypto_generichash_final(&s, out, 32);
}

static void digest_final(crypto_generichash_state *s, char out[65]) {
    uint8_t h[32];
    crypto_generichash_final(s, h, sizeof h);
    to_hex(out, h, sizeof h);
}

/* -- Names and paths -------------------------------------------------------- */

static bool is_hex64(const char *s) {
    for (int i = 0; i < 64; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return false;
    return true;
}

static bool valid_ext(const char *ext) {
    size_t n = ext ? strlen(ext) : 0;
    if (n == 0 || n > EXT_MAX || !strcmp(ext, "meta")) return false;
    for (size_t i = 0; i < n; i++)
        if (!((ext[i] >= 'a' && ext[i] <= 'z') || (ext[i] >= '0' && ext[i] <= '9'))) return false;
    return true;
}

static bool valid_key(const char *key) { return key && strlen(key) == 64 && is_hex64(key); }

bool sj_cache_valid_name(const char *key, const char *ext) { return valid_key(key) && valid_ext(ext); }

enum { NAME_OTHER, NAME_ARTIFACT, NAME_META, NAME_TMP };

static int classify(const char *name) {
    if (!strncmp(name, TMP_PREFIX, strlen(TMP_PREFIX))) return NAME_TMP;
    if (strlen(name) < 66 || !is_hex64(name) || name[64] != '.') return NAME_OTHER;
    if (!strcmp(name + 65, "meta")) return NAME_META;
    return valid_ext(name + 65) ? NAME_ARTIFACT : NAME_OTHER;
}

/* The entry's file name (relative to the directory handle). */
static bool make_name(char *buf, size_t n, const char *key, const char *ext) {
    int w = snprintf(buf, n, "%s.%s", key, ext);
    return w > 0 && (size_t)w < n;
}

static void count(sj_cache *c, uint64_t *field) {
    pthread_mutex_lock(&c->lock);
    (*field)++;
    pthread_mutex_unlock(&c->lock);
}

/* One warning per cache for a refused entry (a symlink, another owner, a
 * FIFO, a bad digest): the call is served without it. */
static void refuse(sj_cache *c, const char *name, const char *why) {
    if (!atomic_exchange(&c->warned, true))
        sj_log_write(c->log, SJ_LOG_WARN, "kernel cache %s: refused %s: %s (further refusals are not logged)",
                     c->dir, name, why);
}

/* -- File helpers ------------------------------------------------------------ */

static int write_all(int fd, const void *data, size_t len) {
    const char *p = data;
    while (len > 0) {
        ssize_t w = write(fd, p, len);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        p += w, len -= (size_t)w;
    }
    return 0;
}

static mode_t file_mode(const sj_cache *c) { return c->keyed ? 0644 : 0600; }

/* A fresh temporary in the cache dir, opened for writing with the cache's
 * file mode (whatever the umask); its name in name. -1 on failure. */
static int open_tmp(const sj_cache *c, char *name, size_t n) {
    for (int attempt = 0; attempt < 16; attempt++) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        unsigned long k = atomic_fetch_add(&tmp_counter, 1);
        int w = snprintf(name, n, TMP_PREFIX "%ld.%lu.%lx", (long)getpid(), k, (unsigned long)ts.tv_nsec);
        if (w < 0 || (size_t)w >= n) return -1;
        int fd = openat(c->dfd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
        if (fd >= 0) {
            if (fchmod(fd, file_mode(c))) {
                close(fd);
                unlinkat(c->dfd, name, 0);
                return -1;
            }
            return fd;
        }
        if (errno != EEXIST) return fd;
    }
    return -1;
}

/* Write data to the entry `dest` through a temporary and rename. */
static sj_status write_atomic(const sj_cache *c, const char *dest, const void *data, size_t len) {
    char tmp[128];
    int fd = open_tmp(c, tmp, sizeof tmp);
    if (fd < 0) return sj_seterr(SJ_EBACKEND, "cache: cannot create a temporary in %s: %s", c->dir, strerror(errno));
    int bad = write_all(fd, data, len);
    int err = errno;
    if (close(fd) && !bad) bad = -1, err = errno;
    if (!bad && renameat(c->dfd, tmp, c->dfd, dest)) bad = -1, err = errno;
    if (bad) {
        unlinkat(c->dfd, tmp, 0);
        return sj_seterr(SJ_EBACKEND, "cache: cannot write %s/%s: %s", c->dir, dest, strerror(err));
    }
    return SJ_OK;
}

static int format_meta(char *buf, size_t n, const char *ext, uint64_t size, const char *digest) {
    return snprintf(buf, n, META_MAGIC "\next %s\nsize %llu\ndigest %s\n", ext, (unsigned long long)size, digest);
}

/* Opens an entry's file relative to the directory without following a
 * symlink or blocking on a FIFO, and checks it on its handle: a regular
 * file of at most max bytes; without a key, owned by the effective user
 * and writable by nobody else. Returns the fd, or -1 with *why set (NULL
 * when the file is simply absent). */
static int open_checked(const sj_cache *c, const char *name, uint64_t max, struct stat *st, const char **why) {
    *why = NULL;
    int fd = openat(c->dfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ELOOP) *why = "a symbolic link";
        else if (errno != ENOENT) *why = strerror(errno);
        return -1;
    }
    if (fstat(fd, st)) *why = strerror(errno);
    else if (!S_ISREG(st->st_mode)) *why = "not a regular file";
    else if (!c->keyed && st->st_uid != geteuid()) *why = "owned by another user";
    else if (!c->keyed && (st->st_mode & (S_IWGRP | S_IWOTH))) *why = "writable by group or others";
    else if ((uint64_t)st->st_size > max) *why = "too large";
    if (*why) {
        close(fd);
        return -1;
    }
    return fd;
}

/* Reads and parses a meta. 1: valid (and for `ext`); 0: missing; -1:
 * garbage or refused (*why says which when refused), or valid for another
 * extension (then named in other_ext, EXT_MAX + 2 bytes, when not NULL;
 * else it is ""); -2: unreadable. */
static int read_meta(const sj_cache *c, const char *name, const char *ext, uint64_t *size, char digest[65],
                     const char **why, char *other_ext) {
    if (other_ext) other_ext[0] = '\0';
    struct stat st;
    int fd = open_checked(c, name, 255, &st, why);
    if (fd < 0) return *why ? -1 : 0;
    char buf[256];
    size_t got = 0;
    for (;;) {
        ssize_t r = read(fd, buf + got, sizeof buf - 1 - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += (size_t)r;
        if (got == sizeof buf - 1) break;
    }
    close(fd);
    buf[got] = '\0';
    char e[EXT_MAX + 2];
    unsigned long long sz;
    if (sscanf(buf, META_MAGIC "\next %16s\nsize %llu\ndigest %64s\n", e, &sz, digest) != 3) return -1;
    /* Strict: the text must be exactly what a store writes. */
    char canon[256];
    int w = format_meta(canon, sizeof canon, e, sz, digest);
    if (w <= 0 || (size_t)w != got || memcmp(canon, buf, got) || strlen(digest) != 64 || !is_hex64(digest))
        return -1;
    if (strcmp(e, ext)) {
        if (other_ext) snprintf(other_ext, EXT_MAX + 2, "%s", e);
        return -1;
    }
    *size = sz;
    return 1;
}

/* -- Lookup ------------------------------------------------------------------ */

/* Deletes a bad entry; the artifact only if it is still the file we read
 * (or, with no file read, whatever stands under its name: a link, a FIFO). */
static void drop_entry(const sj_cache *c, const char *art, const char *meta, const struct stat *seen) {
    if (c->readonly) return;
    struct stat now;
    if (!fstatat(c->dfd, art, &now, AT_SYMLINK_NOFOLLOW) &&
        (!seen || (now.st_dev == seen->st_dev && now.st_ino == seen->st_ino)))
        unlinkat(c->dfd, art, 0);
    unlinkat(c->dfd, meta, 0);
}

/* counted: the lookup counts in the stats (sj_cache_read's does not). */
static bool lookup(sj_cache *c, const char *key, const char *ext, char *path, size_t n, void **data,
                   size_t *len, bool counted) {
    char art[96], meta[96];
    if (!c || !valid_key(key) || !valid_ext(ext) || !make_name(art, sizeof art, key, ext) ||
        !make_name(meta, sizeof meta, key, "meta"))
        return false;
    if (path && strlen(c->dir) + 1 + strlen(art) >= n) return false;

    const char *why = NULL;
    struct stat st;
    int fd = open_checked(c, art, ARTIFACT_MAX, &st, &why);
    if (fd < 0) {
        if (why) { /* refused: a link, another owner, a FIFO ... */
            refuse(c, art, why);
            drop_entry(c, art, meta, NULL);
            pthread_mutex_lock(&c->lock);
            if (counted) c->stats.misses++, c->stats.corrupt++;
            pthread_mutex_unlock(&c->lock);
            return false;
        }
        /* an orphaned meta (its artifact gone) is dropped; one that names
         * another extension is another artifact's, and stays */
        uint64_t sz;
        char dg[65], other[EXT_MAX + 2];
        const char *mwhy = NULL;
        if (!c->readonly && read_meta(c, meta, ext, &sz, dg, &mwhy, other) != 0 && !other[0])
            unlinkat(c->dfd, meta, 0);
        if (counted) count(c, &c->stats.misses);
        return false;
    }
    bool ok = false, corrupt = false;
    uint64_t want_size = 0;
    char want[65] = "", got_digest[65];
    uint8_t *buf = NULL;
    int m = read_meta(c, meta, ext, &want_size, want, &why, NULL);
    if (m == 0) { /* an artifact without its meta is an orphan */
        drop_entry(c, art, meta, &st);
        goto done;
    }
    if (m == -2) goto done;
    if (m < 0 || (uint64_t)st.st_size != want_size) {
        if (why) refuse(c, meta, why);
        corrupt = true;
        goto done;
    }
    size_t cap = (size_t)want_size + 1;
    if (!(buf = malloc(cap))) goto done;
    crypto_generichash_state h;
    digest_init(c, &h, key, ext);
    uint64_t total = 0;
    for (;;) {
        ssize_t r = read(fd, buf + total, cap - (size_t)total);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) goto done;
        if (r == 0) break;
        crypto_generichash_update(&h, buf + total, (size_t)r);
        total += (uint64_t)r;
        if (total == cap) break; /* grew under us: mismatch below */
    }
    digest_final(&h, got_digest);
    if (total != want_size || sodium_memcmp(got_digest, want, 64)) {
        refuse(c, art, "its digest does not match (tampered, corrupt, or written under another key)");
        corrupt = true;
        goto done;
    }
    ok = true;
    if (!c->readonly) futimens(fd, NULL); /* LRU: refresh the mtime; a read-only cache just skips it */
    if (path) snprintf(path, n, "%s/%s", c->dir, art);
    if (data) *data = buf, *len = (size_t)total, buf = NULL;
done:
    close(fd);
    free(buf);
    if (corrupt) drop_entry(c, art, meta, &st);
    pthread_mutex_lock(&c->lock);
    if (counted && ok) c->stats.hits++;
    else if (counted) c->stats.misses++;
    if (corrupt) c->stats.corrupt++;
    pthread_mutex_unlock(&c->lock);
    return ok;
}

bool sj_cache_lookup(sj_cache *c, const char *key, const char *ext, char *path, size_t n) {
    if (!path || n == 0) return false;
    return lookup(c, key, ext, path, n, NULL, NULL, true);
}

bool sj_cache_load(sj_cache *c, const char *key, const char *ext, void **data, size_t *len) {
    if (!data || !len) return false;
    return lookup(c, key, ext, NULL, 0, data, len, true);
}

bool sj_cache_read(sj_cache *c, const char *key, const char *ext, void **data, size_t *len) {
    if (!data || !len) return false;
    return lookup(c, key, ext, NULL, 0, data, len, false);
}

void sj_cache_touch(sj_cache *c, const char *key, const char *ext) {
    char art[96];
    if (!c || c->readonly || !valid_key(key) || !valid_ext(ext) || !make_name(art, sizeof art, key, ext)) return;
    utimensat(c->dfd, art, NULL, AT_SYMLINK_NOFOLLOW);
}

/* -- Quarantine ----------------------------------------------------------------- */

void sj_cache_quarantine(sj_cache *c, const char *key) {
    static const char *const exts[] = {"so", "cubin"};
    char art[96], meta[96], aside[112];
    if (!c || !valid_key(key) || !make_name(meta, sizeof meta, key, "meta")) return;
    for (size_t i = 0; i < sizeof exts / sizeof exts[0]; i++) {
        if (!make_name(art, sizeof art, key, exts[i])) continue;
        snprintf(aside, sizeof aside, "%s-rejected", art);
        if (!renameat(c->dfd, art, c->dfd, aside)) count(c, &c->stats.quarantined);
    }
    unlinkat(c->dfd, meta, 0);
}

/* -- Eviction ---------------------------------------------------------------- */

typedef struct entry {
    char name[64 + 2 + EXT_MAX + 1];
    int kind;
    uint64_t size; /* artifact: with its meta's size added */
    struct timespec mtime;
} entry;

static int by_name(const void *a, const void *b) { return strcmp(((const entry *)a)->name, ((const entry *)b)->name); }

static int by_age(const void *a, const void *b) {
    const entry *x = a, *y = b;
    if (x->mtime.tv_sec != y->mtime.tv_sec) return x->mtime.tv_sec < y->mtime.tv_sec ? -1 : 1;
    if (x->mtime.tv_nsec != y->mtime.tv_nsec) return x->mtime.tv_nsec < y->mtime.tv_nsec ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* Lists our files (deleting stale temporaries on the way unless keep_tmp)
 * into *out. */
static int scan_dir(int dfd, entry **out, size_t *count_out, uint64_t *total, bool keep_tmp) {
    int fd2 = fcntl(dfd, F_DUPFD_CLOEXEC, 0);
    if (fd2 < 0) return -1;
    DIR *d = fdopendir(fd2);
    if (!d) {
        close(fd2);
        return -1;
    }
    entry *v = NULL;
    size_t n = 0, cap = 0;
    time_t now = time(NULL);
    struct dirent *de;
    while ((de = readdir(d))) {
        int kind = classify(de->d_name);
        struct stat st;
        if (kind == NAME_OTHER || fstatat(dfd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) || !S_ISREG(st.st_mode))
            continue;
        if (kind == NAME_TMP) {
            if (!keep_tmp && now - st.st_mtime > TMP_MAX_AGE_S) unlinkat(dfd, de->d_name, 0);
            continue;
        }
        if (n == cap) {
            size_t nc = cap ? cap * 2 : 64;
            entry *nv = realloc(v, nc * sizeof *nv);
            if (!nv) {
                free(v);
                closedir(d);
                return -1;
            }
            v = nv, cap = nc;
        }
        snprintf(v[n].name, sizeof v[n].name, "%s", de->d_name);
        v[n].kind = kind;
        v[n].size = (uint64_t)st.st_size;
        v[n].mtime = st.st_mtim;
        *total += (uint64_t)st.st_size;
        n++;
    }
    closedir(d);
    *out = v, *count_out = n;
    return 0;
}

static int scan(int dfd, entry **out, size_t *n, uint64_t *total) { return scan_dir(dfd, out, n, total, false); }
static int scan_only(int dfd, entry **out, size_t *n, uint64_t *total) { return scan_dir(dfd, out, n, total, true); }

static void evict(sj_cache *c) {
    pthread_mutex_lock(&c->evict_lock);
    int dfd = openat(c->dfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC); /* its own read position */
    entry *v = NULL;
    size_t n = 0;
    uint64_t total = 0, evicted = 0;
    if (dfd < 0 || scan(dfd, &v, &n, &total) || c->max_bytes == 0 || total <= c->max_bytes) goto out;
    /* Fold each meta into its artifacts (same key: adjacent by name); a meta
     * with no artifact sorts first. */
    qsort(v, n, sizeof *v, by_name);
    for (size_t i = 0, j; i < n; i = j) {
        size_t meta = n, artifacts = 0;
        for (j = i; j < n && !strncmp(v[j].name, v[i].name, 64); j++) {
            if (v[j].kind == NAME_META) meta = j;
            else artifacts++;
        }
        if (meta == n) continue;
        for (size_t k = i; k < j && artifacts; k++)
            if (v[k].kind == NAME_ARTIFACT) v[k].size += v[meta].size;
        if (artifacts) v[meta].kind = NAME_OTHER;
        else v[meta].mtime = (struct timespec){0, 0};
    }
    qsort(v, n, sizeof *v, by_age);
    for (size_t i = 0; i < n && total > c->max_bytes; i++) {
        if (v[i].kind == NAME_OTHER) continue;
        if (v[i].kind == NAME_ARTIFACT) {
            if (!unlinkat(dfd, v[i].name, 0)) evicted++;
            char meta[64 + 6];
            snprintf(meta, sizeof meta, "%.64s.meta", v[i].name);
            unlinkat(dfd, meta, 0);
        } else {
            unlinkat(dfd, v[i].name, 0);
        }
        total -= v[i].size < total ? v[i].size : total;
    }
out:
    free(v);
    if (dfd >= 0) close(dfd);
    pthread_mutex_unlock(&c->evict_lock);
    if (evicted) {
        pthread_mutex_lock(&c->lock);
        c->stats.evictions += evicted;
        pthread_mutex_unlock(&c->lock);
    }
}

/* -- Store ------------------------------------------------------------------- */

static sj_status check_store(const sj_cache *c, const char *key, const char *ext, char *art, char *meta) {
    if (!c) return sj_seterr(SJ_EINVAL, "cache: NULL cache");
    if (c->readonly) return sj_seterr(SJ_EINVAL, "cache: %s is open read-only", c->dir);
    if (!valid_key(key)) return sj_seterr(SJ_EINVAL, "cache: key is not 64 hex digits");
    if (!valid_ext(ext)) return sj_seterr(SJ_EINVAL, "cache: bad artifact extension '%s'", ext ? ext : "(null)");
    make_name(art, 96, key, ext);
    make_name(meta, 96, key, "meta");
    /* one artifact a key: a store of another extension would replace the
     * meta that makes the first one visible */
    uint64_t sz;
    char dg[65], other[EXT_MAX + 2];
    const char *why = NULL;
    if (read_meta(c, meta, ext, &sz, dg, &why, other) < 0 && other[0]) {
        char oart[96];
        make_name(oart, sizeof oart, key, other);
        struct stat st;
        if (!fstatat(c->dfd, oart, &st, AT_SYMLINK_NOFOLLOW)) /* (a meta whose artifact is gone: replaced) */
            return sj_seterr(SJ_EINVAL, "cache: key %.16s holds a .%s artifact already; a .%s artifact needs a key "
                             "of its own", key, other, ext);
    }
    return SJ_OK;
}

/* The meta goes last: it is what makes the artifact visible to lookups. */
static sj_status finish_store(sj_cache *c, const char *ext, const char *art, const char *meta, uint64_t size,
                              const char *digest) {
    char text[256];
    int w = format_meta(text, sizeof text, ext, size, digest);
    sj_status st = write_atomic(c, meta, text, (size_t)w);
    if (st) {
        unlinkat(c->dfd, art, 0); /* no orphan left behind */
        return st;
    }
    count(c, &c->stats.stores);
    if (c->max_bytes > 0) evict(c);
    return SJ_OK;
}

sj_status sj_cache_store(sj_cache *c, const char *key, const char *ext, const void *data, size_t len) {
    char art[96], meta[96];
    sj_status st = check_store(c, key, ext, art, meta);
    if (st) return st;
    if (!data && len) return sj_seterr(SJ_EINVAL, "cache: NULL data");
    if (len > ARTIFACT_MAX) return sj_seterr(SJ_EINVAL, "cache: %zu-byte artifact over the limit", len);
    if ((st = write_atomic(c, art, data, len))) return st;
    crypto_generichash_state h;
    digest_init(c, &h, key, ext);
    crypto_generichash_update(&h, data, len);
    char digest[65];
    digest_final(&h, digest);
    return finish_store(c, ext, art, meta, len, digest);
}

sj_status sj_cache_store_file(sj_cache *c, const char *key, const char *ext, const char *file) {
    char art[96], meta[96];
    sj_status st = check_store(c, key, ext, art, meta);
    if (st) return st;
    if (!file) return sj_seterr(SJ_EINVAL, "cache: NULL file");
    /* The file is read once, through one handle, into a temporary of the
     * cache's own (the bytes digested are the bytes stored). */
    int in = open(file, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (in < 0) return sj_seterr(SJ_EBACKEND, "cache: cannot open %s: %s", file, strerror(errno));
    struct stat sb;
    if (fstat(in, &sb) || !S_ISREG(sb.st_mode) || (uint64_t)sb.st_size > ARTIFACT_MAX) {
        close(in);
        return sj_seterr(SJ_EBACKEND, "cache: %s is not a regular file of at most 1 GiB", file);
    }
    char tmp[128], buf[65536];
    int out = open_tmp(c, tmp, sizeof tmp);
    if (out < 0) {
        int err = errno;
        close(in);
        return sj_seterr(SJ_EBACKEND, "cache: cannot create a temporary in %s: %s", c->dir, strerror(err));
    }
    crypto_generichash_state h;
    digest_init(c, &h, key, ext);
    uint64_t total = 0;
    int bad = 0, err = 0;
    for (;;) {
        ssize_t r = read(in, buf, sizeof buf);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) bad = 1, err = errno;
        if (r <= 0) break;
        if (write_all(out, buf, (size_t)r)) {
            bad = 1, err = errno;
            break;
        }
        crypto_generichash_update(&h, (const uint8_t *)buf, (size_t)r);
        total += (uint64_t)r;
    }
    close(in);
    if (close(out) && !bad) bad = 1, err = errno;
    if (!bad && renameat(c->dfd, tmp, c->dfd, art)) bad = 1, err = errno;
    if (bad) {
        unlinkat(c->dfd, tmp, 0);
        return sj_seterr(SJ_EBACKEND, "cache: cannot store %s: %s", file, strerror(err));
    }
    char digest[65];
    digest_final(&h, digest);
    return finish_store(c, ext, art, meta, total, digest);
}

/* -- Lifecycle ---------------------------------------------------------------- */

/* Creates the missing directories of path, each 0700 whatever the umask. */
static int mkdir_p(char *path) {
    for (char *p = path + 1;; p++) {
        if (*p && *p != '/') continue;
        char was = *p;
        *p = '\0';
        int r = mkdir(path, 0700);
        if (!r) chmod(path, 0700);
        *p = was;
        if (r && errno != EEXIST) return -1;
        if (!was) break;
    }
    return 0;
}

sj_status sj_cache_open(const char *dir, uint64_t max_bytes, sj_cache **out) {
    return sj_cache_open_keyed(dir, max_bytes, NULL, NULL, out);
}

sj_status sj_cache_open_keyed(const char *dir, uint64_t max_bytes, const char *key, const sj_log_sink *log,
                              sj_cache **out) {
    if (!out) return sj_seterr(SJ_EINVAL, "sj_cache_open: out is NULL");
    *out = NULL;
    if (!dir || !*dir) return sj_seterr(SJ_EINVAL, "sj_cache_open: no directory given");
    if (!crypto_ready()) return sj_seterr(SJ_EBACKEND, "sj_cache_open: libsodium failed to initialise");
    size_t len = strlen(dir);
    if (len + 1 + 64 + 1 + EXT_MAX + 1 >= PATH_MAX) return sj_seterr(SJ_EINVAL, "sj_cache_open: path too long");
    sj_cache *c = calloc(1, sizeof *c);
    if (!c || !(c->dir = strdup(dir))) {
        free(c);
        return sj_seterr(SJ_ENOMEM, "sj_cache_open: out of memory");
    }
    c->dfd = -1;
    c->log = log;
    if (key && *key) {
        c->keyed = true;
        sj_cache_mac_key(c->mac_key, key);
    }
    while (len > 1 && c->dir[len - 1] == '/') c->dir[--len] = '\0';
    sj_status st = SJ_OK;
    struct stat ds;
    struct stat ls;
    if (!lstat(c->dir, &ls) && S_ISLNK(ls.st_mode)) {
        st = sj_seterr(SJ_EINVAL, "sj_cache_open: refusing %s: it is a symbolic link", dir);
    } else if (mkdir_p(c->dir) || (c->dfd = open(c->dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)) < 0 ||
               fstat(c->dfd, &ds) || faccessat(c->dfd, ".", W_OK | X_OK, AT_EACCESS)) {
        st = sj_seterr(SJ_EINVAL, "sj_cache_open: cannot use directory %s: %s", dir,
                       errno == ELOOP ? "it is a symbolic link" : strerror(errno));
    } else if (!c->keyed && ds.st_uid != geteuid()) {
        st = sj_seterr(SJ_EINVAL,
                       "sj_cache_open: refusing %s: owned by uid %u, not this process's uid %u (a cache shared "
                       "between users needs a key: SHAPEJIT_CACHE_KEY or cache_key)",
                       dir, (unsigned)ds.st_uid, (unsigned)geteuid());
    } else if (!c->keyed && (ds.st_mode & (S_IWGRP | S_IWOTH))) {
        st = sj_seterr(SJ_EINVAL,
                       "sj_cache_open: refusing %s: writable by group or others (mode %03o; chmod 700 it, or "
                       "share it with a key: SHAPEJIT_CACHE_KEY or cache_key)",
                       dir, (unsigned)(ds.st_mode & 0777));
    }
    bool locked = !st && !pthread_mutex_init(&c->lock, NULL);
    if (!st && (!locked || pthread_mutex_init(&c->evict_lock, NULL))) {
        if (locked) pthread_mutex_destroy(&c->lock);
        st = sj_seterr(SJ_ENOMEM, "sj_cache_open: cannot create a mutex");
    }
    if (st) {
        if (c->dfd >= 0) close(c->dfd);
        sodium_memzero(c->mac_key, sizeof c->mac_key);
        free(c->dir);
        free(c);
        return st;
    }
    c->max_bytes = max_bytes;
    /* Sweep stale temporaries (and trim to the cap) once at open. */
    evict(c);
    *out = c;
    return SJ_OK;
}

void sj_cache_close(sj_cache *c) {
    if (!c) return;
    pthread_mutex_destroy(&c->evict_lock);
    pthread_mutex_destroy(&c->lock);
    if (c->dfd >= 0) close(c->dfd);
    sodium_memzero(c->mac_key, sizeof c->mac_key);
    free(c->dir);
    free(c);
}

void sj_cache_get_stats(const sj_cache *c, sj_cache_stats *out) {
    if (!out) return;
    memset(out, 0, sizeof *out);
    if (!c) return;
    sj_cache *m = (sj_cache *)c; /* the lock is not part of the logical state */
    pthread_mutex_lock(&m->lock);
    *out = c->stats;
    pthread_mutex_unlock(&m->lock);
}

const char *sj_cache_dir(const sj_cache *c) { return c ? c->dir : NULL; }

void sj_cache_set_readonly(sj_cache *c) {
    if (c) c->readonly = true;
}

/* -- Listing ------------------------------------------------------------------ */

int sj_cache_list(sj_cache *c, void (*fn)(void *user, const char *key, const char *ext), void *user) {
    if (!c || !fn) return -1;
    int dfd = openat(c->dfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    entry *v = NULL;
    size_t n = 0;
    uint64_t total = 0;
    if (dfd < 0) return -1;
    /* scan() deletes stale temporaries: not in a read-only cache */
    int r = c->readonly ? scan_only(dfd, &v, &n, &total) : scan(dfd, &v, &n, &total);
    close(dfd);
    if (r) return -1;
    qsort(v, n, sizeof *v, by_name);
    int listed = 0;
    for (size_t i = 0; i < n; i++) {
        if (v[i].kind != NAME_ARTIFACT) continue;
        char key[65];
        memcpy(key, v[i].name, 64);
        key[64] = '\0';
        fn(user, key, v[i].name + 65);
        listed++;
    }
    free(v);
    return listed;
}

bool sj_cache_keyed(const sj_cache *c) { return c && c->keyed; }
