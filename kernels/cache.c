/* The persistent kernel cache (see cache.h).
 *
 * Files in the directory:
 *   <key>.<ext>          the artifact, byte for byte as the backend loads it
 *   <key>.meta           "shapejit-cache 1", the ext, the size and a 64-bit
 *                        checksum of the artifact, one per line
 *   .sjtmp.<pid>.<n>.<t> a temporary being written; renamed into place
 * Anything else is not ours and is never touched.
 *
 * A store writes the artifact first and the meta second, each through a
 * temporary and rename(2) (sj_cache_store_file renames the caller's file
 * straight into place when it is on the same filesystem), so a reader sees either nothing, an artifact
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

#include "base/error.h"

#define META_MAGIC "shapejit-cache 1"
#define TMP_PREFIX ".sjtmp."
#define TMP_MAX_AGE_S 3600
#define EXT_MAX 15

struct sj_cache {
    char *dir;
    uint64_t max_bytes;
    pthread_mutex_t lock; /* guards stats */
    pthread_mutex_t evict_lock;
    sj_cache_stats stats;
};

/* Distinguishes temporaries of several caches (or threads) in one process. */
static _Atomic unsigned long tmp_counter;

/* -- Hashing ---------------------------------------------------------------
 * Four 64-bit lanes, each a multiply-rotate round over 8-byte words with its
 * own constants, then a finalizer that mixes every lane with its neighbour
 * and the total length. Not cryptographic; keys are not adversarial. */

typedef struct hasher {
    uint64_t h[4];
    uint8_t buf[8];
    size_t nbuf;
    uint64_t total;
} hasher;

static const uint64_t LANE_MUL[4] = {0x9E3779B185EBCA87ull, 0xC2B2AE3D27D4EB4Full, 0x165667B19E3779F9ull,
                                     0x85EBCA77C2B2AE63ull};
static const uint64_t LANE_ADD[4] = {0x27D4EB2F165667C5ull, 0xFF51AFD7ED558CCDull, 0xC4CEB9FE1A85EC53ull,
                                     0x94D049BB133111EBull};
static const int LANE_ROT[4] = {31, 27, 33, 29};

static uint64_t rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

static uint64_t fmix64(uint64_t k) {
    k ^= k >> 33;
    k *= 0xFF51AFD7ED558CCDull;
    k ^= k >> 33;
    k *= 0xC4CEB9FE1A85EC53ull;
    k ^= k >> 33;
    return k;
}

static void hash_init(hasher *s) {
    memset(s, 0, sizeof *s);
    for (int i = 0; i < 4; i++) s->h[i] = LANE_ADD[i] ^ ((uint64_t)(i + 1) * 0x9E3779B97F4A7C15ull);
}

static void hash_word(hasher *s, uint64_t w) {
    for (int i = 0; i < 4; i++) s->h[i] = rotl64(s->h[i] + w * LANE_MUL[i], LANE_ROT[i]) * LANE_MUL[3 - i] + LANE_ADD[i];
}

static uint64_t load64le(const uint8_t *p) {
    uint64_t w = 0;
    for (int i = 7; i >= 0; i--) w = (w << 8) | p[i];
    return w;
}

static void hash_update(hasher *s, const void *data, size_t len) {
    const uint8_t *p = data;
    s->total += len;
    while (len > 0 && s->nbuf > 0) {
        s->buf[s->nbuf++] = *p++, len--;
        if (s->nbuf == 8) hash_word(s, load64le(s->buf)), s->nbuf = 0;
    }
    for (; len >= 8; p += 8, len -= 8) hash_word(s, load64le(p));
    while (len > 0) s->buf[s->nbuf++] = *p++, len--;
}

static void hash_final(hasher *s, uint64_t out[4]) {
    if (s->nbuf > 0) {
        memset(s->buf + s->nbuf, 0, 8 - s->nbuf);
        hash_word(s, load64le(s->buf) ^ ((uint64_t)s->nbuf << 56));
    }
    hash_word(s, s->total);
    for (int i = 0; i < 4; i++) out[i] = fmix64(s->h[i] ^ rotl64(s->h[(i + 1) & 3], 17) ^ s->total);
}

void sj_cache_key(char out[65], const char *const *parts, int n_parts) {
    hasher s;
    hash_init(&s);
    for (int i = 0; i < n_parts; i++) {
        const char *p = parts && parts[i] ? parts[i] : "";
        uint64_t len = strlen(p);
        uint8_t lb[8];
        for (int b = 0; b < 8; b++) lb[b] = (uint8_t)(len >> (8 * b));
        hash_update(&s, lb, 8);
        hash_update(&s, p, (size_t)len);
    }
    uint64_t h[4];
    hash_final(&s, h);
    for (int i = 0; i < 4; i++) snprintf(out + 16 * i, 17, "%016llx", (unsigned long long)h[i]);
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

enum { NAME_OTHER, NAME_ARTIFACT, NAME_META, NAME_TMP };

static int classify(const char *name) {
    if (!strncmp(name, TMP_PREFIX, strlen(TMP_PREFIX))) return NAME_TMP;
    if (strlen(name) < 66 || !is_hex64(name) || name[64] != '.') return NAME_OTHER;
    if (!strcmp(name + 65, "meta")) return NAME_META;
    return valid_ext(name + 65) ? NAME_ARTIFACT : NAME_OTHER;
}

static bool make_path(char *buf, size_t n, const sj_cache *c, const char *key, const char *ext) {
    int w = snprintf(buf, n, "%s/%s.%s", c->dir, key, ext);
    return w > 0 && (size_t)w < n;
}

static void count(sj_cache *c, uint64_t *field) {
    pthread_mutex_lock(&c->lock);
    (*field)++;
    pthread_mutex_unlock(&c->lock);
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

/* A fresh temporary in the cache dir, opened for writing; -1 on failure. */
static int open_tmp(const sj_cache *c, char *path, size_t n) {
    for (int attempt = 0; attempt < 16; attempt++) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        unsigned long k = atomic_fetch_add(&tmp_counter, 1);
        int w = snprintf(path, n, "%s/" TMP_PREFIX "%ld.%lu.%lx", c->dir, (long)getpid(), k,
                         (unsigned long)ts.tv_nsec);
        if (w < 0 || (size_t)w >= n) return -1;
        int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (fd >= 0 || errno != EEXIST) return fd;
    }
    return -1;
}

/* Write data to dest through a temporary and rename. */
static sj_status write_atomic(const sj_cache *c, const char *dest, const void *data, size_t len) {
    char tmp[PATH_MAX];
    int fd = open_tmp(c, tmp, sizeof tmp);
    if (fd < 0) return sj_seterr(SJ_EBACKEND, "cache: cannot create a temporary in %s: %s", c->dir, strerror(errno));
    int bad = write_all(fd, data, len);
    int err = errno;
    if (close(fd) && !bad) bad = -1, err = errno;
    if (!bad && rename(tmp, dest)) bad = -1, err = errno;
    if (bad) {
        unlink(tmp);
        return sj_seterr(SJ_EBACKEND, "cache: cannot write %s: %s", dest, strerror(err));
    }
    return SJ_OK;
}

static int format_meta(char *buf, size_t n, const char *ext, uint64_t size, uint64_t sum) {
    return snprintf(buf, n, META_MAGIC "\next %s\nsize %llu\nsum %016llx\n", ext, (unsigned long long)size,
                    (unsigned long long)sum);
}

/* Reads and parses a meta. 1: valid (and for `ext`); 0: missing; -1:
 * garbage; -2: unreadable. */
static int read_meta(const char *path, const char *ext, uint64_t *size, uint64_t *sum) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return errno == ENOENT ? 0 : -2;
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
    unsigned long long sz, cs;
    if (sscanf(buf, META_MAGIC "\next %16s\nsize %llu\nsum %llx\n", e, &sz, &cs) != 3) return -1;
    /* Strict: the text must be exactly what a store writes. */
    char canon[256];
    int w = format_meta(canon, sizeof canon, e, sz, cs);
    if (w <= 0 || (size_t)w != got || memcmp(canon, buf, got) || strcmp(e, ext)) return -1;
    *size = sz, *sum = cs;
    return 1;
}

/* -- Lookup ------------------------------------------------------------------ */

/* Deletes a bad entry; the artifact only if it is still the file we read. */
static void drop_entry(const char *art, const char *meta, const struct stat *seen) {
    struct stat now;
    if (!stat(art, &now) && now.st_dev == seen->st_dev && now.st_ino == seen->st_ino) unlink(art);
    unlink(meta);
}

static bool lookup(sj_cache *c, const char *key, const char *ext, char *path, size_t n, void **data,
                   size_t *len) {
    char art[PATH_MAX], meta[PATH_MAX];
    if (!c || !valid_key(key) || !valid_ext(ext) || !make_path(art, sizeof art, c, key, ext) ||
        !make_path(meta, sizeof meta, c, key, "meta"))
        return false;
    if (path && strlen(art) >= n) return false;

    int fd = open(art, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT) unlink(meta); /* orphaned meta */
        count(c, &c->stats.misses);
        return false;
    }
    bool ok = false, corrupt = false;
    struct stat st;
    uint64_t want_size = 0, want_sum = 0;
    uint8_t *buf = NULL;
    int m = read_meta(meta, ext, &want_size, &want_sum);
    if (fstat(fd, &st)) goto done;
    if (m == 0) { /* an artifact without its meta is an orphan */
        drop_entry(art, meta, &st);
        goto done;
    }
    if (m == -2) goto done;
    if (m < 0 || !S_ISREG(st.st_mode) || (uint64_t)st.st_size != want_size || want_size > SIZE_MAX - 1) {
        corrupt = true;
        goto done;
    }
    size_t cap = data ? (size_t)want_size + 1 : 65536;
    if (!(buf = malloc(cap))) goto done;
    hasher h;
    hash_init(&h);
    uint64_t total = 0;
    for (;;) {
        size_t room = data ? cap - (size_t)total : cap;
        ssize_t r = read(fd, data ? buf + total : buf, room);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) goto done;
        if (r == 0) break;
        hash_update(&h, data ? buf + total : buf, (size_t)r);
        total += (uint64_t)r;
        if (data && total == cap) break; /* grew under us: mismatch below */
    }
    uint64_t sum[4];
    hash_final(&h, sum);
    if (total != want_size || sum[0] != want_sum) {
        corrupt = true;
        goto done;
    }
    ok = true;
    futimens(fd, NULL); /* LRU: refresh the mtime; a read-only cache just skips it */
    if (path) snprintf(path, n, "%s", art);
    if (data) *data = buf, *len = (size_t)total, buf = NULL;
done:
    close(fd);
    free(buf);
    if (corrupt) drop_entry(art, meta, &st);
    pthread_mutex_lock(&c->lock);
    if (ok) c->stats.hits++;
    else c->stats.misses++;
    if (corrupt) c->stats.corrupt++;
    pthread_mutex_unlock(&c->lock);
    return ok;
}

bool sj_cache_lookup(sj_cache *c, const char *key, const char *ext, char *path, size_t n) {
    if (!path || n == 0) return false;
    return lookup(c, key, ext, path, n, NULL, NULL);
}

bool sj_cache_load(sj_cache *c, const char *key, const char *ext, void **data, size_t *len) {
    if (!data || !len) return false;
    return lookup(c, key, ext, NULL, 0, data, len);
}

void sj_cache_touch(sj_cache *c, const char *key, const char *ext) {
    char art[PATH_MAX];
    if (!c || !valid_key(key) || !valid_ext(ext) || !make_path(art, sizeof art, c, key, ext)) return;
    utimensat(AT_FDCWD, art, NULL, 0);
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

/* Lists our files (deleting stale temporaries on the way) into *out. */
static int scan(int dfd, entry **out, size_t *count_out, uint64_t *total) {
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
            if (now - st.st_mtime > TMP_MAX_AGE_S) unlinkat(dfd, de->d_name, 0);
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

static void evict(sj_cache *c) {
    pthread_mutex_lock(&c->evict_lock);
    int dfd = open(c->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
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
    if (!valid_key(key)) return sj_seterr(SJ_EINVAL, "cache: key is not 64 hex digits");
    if (!valid_ext(ext)) return sj_seterr(SJ_EINVAL, "cache: bad artifact extension '%s'", ext ? ext : "(null)");
    if (!make_path(art, PATH_MAX, c, key, ext) || !make_path(meta, PATH_MAX, c, key, "meta"))
        return sj_seterr(SJ_EINVAL, "cache: path too long in %s", c->dir);
    return SJ_OK;
}

/* The meta goes last: it is what makes the artifact visible to lookups. */
static sj_status finish_store(sj_cache *c, const char *ext, const char *art, const char *meta, uint64_t size,
                              uint64_t sum) {
    char text[256];
    int w = format_meta(text, sizeof text, ext, size, sum);
    sj_status st = write_atomic(c, meta, text, (size_t)w);
    if (st) {
        unlink(art); /* no orphan left behind */
        return st;
    }
    count(c, &c->stats.stores);
    if (c->max_bytes > 0) evict(c);
    return SJ_OK;
}

sj_status sj_cache_store(sj_cache *c, const char *key, const char *ext, const void *data, size_t len) {
    char art[PATH_MAX], meta[PATH_MAX];
    sj_status st = check_store(c, key, ext, art, meta);
    if (st) return st;
    if (!data && len) return sj_seterr(SJ_EINVAL, "cache: NULL data");
    if ((st = write_atomic(c, art, data, len))) return st;
    hasher h;
    hash_init(&h);
    hash_update(&h, data, len);
    uint64_t sum[4];
    hash_final(&h, sum);
    return finish_store(c, ext, art, meta, len, sum[0]);
}

/* Copies fd (from its start) into a temporary and renames that to art. */
static int copy_into(const sj_cache *c, int in, const char *art) {
    char tmp[PATH_MAX], buf[65536];
    if (lseek(in, 0, SEEK_SET) < 0) return -1;
    int out = open_tmp(c, tmp, sizeof tmp);
    if (out < 0) return -1;
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
    }
    if (close(out) && !bad) bad = 1, err = errno;
    if (!bad && rename(tmp, art)) bad = 1, err = errno;
    if (bad) {
        unlink(tmp);
        errno = err;
        return -1;
    }
    return 0;
}

sj_status sj_cache_store_file(sj_cache *c, const char *key, const char *ext, const char *file) {
    char art[PATH_MAX], meta[PATH_MAX];
    sj_status st = check_store(c, key, ext, art, meta);
    if (st) return st;
    if (!file) return sj_seterr(SJ_EINVAL, "cache: NULL file");
    int in = open(file, O_RDONLY | O_CLOEXEC);
    if (in < 0) return sj_seterr(SJ_EBACKEND, "cache: cannot open %s: %s", file, strerror(errno));
    struct stat sb;
    if (fstat(in, &sb) || !S_ISREG(sb.st_mode)) {
        close(in);
        return sj_seterr(SJ_EBACKEND, "cache: %s is not a regular file", file);
    }
    hasher h;
    hash_init(&h);
    uint64_t total = 0;
    char buf[65536];
    int bad = 0;
    for (;;) {
        ssize_t r = read(in, buf, sizeof buf);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) bad = 1;
        if (r <= 0) break;
        hash_update(&h, buf, (size_t)r);
        total += (uint64_t)r;
    }
    /* Move it into place; on another filesystem, copy it. */
    if (!bad && rename(file, art)) bad = errno != EXDEV || copy_into(c, in, art);
    int err = errno;
    close(in);
    if (bad) return sj_seterr(SJ_EBACKEND, "cache: cannot store %s: %s", file, strerror(err));
    uint64_t sum[4];
    hash_final(&h, sum);
    return finish_store(c, ext, art, meta, total, sum[0]);
}

/* -- Lifecycle ---------------------------------------------------------------- */

static int mkdir_p(char *path) {
    for (char *p = path + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        int r = mkdir(path, 0755);
        *p = '/';
        if (r && errno != EEXIST) return -1;
    }
    if (mkdir(path, 0755) && errno != EEXIST) return -1;
    struct stat st;
    return !stat(path, &st) && S_ISDIR(st.st_mode) ? 0 : -1;
}

sj_status sj_cache_open(const char *dir, uint64_t max_bytes, sj_cache **out) {
    if (!out) return sj_seterr(SJ_EINVAL, "sj_cache_open: out is NULL");
    *out = NULL;
    if (!dir || !*dir) return sj_seterr(SJ_EINVAL, "sj_cache_open: no directory given");
    size_t len = strlen(dir);
    if (len + 1 + 64 + 1 + EXT_MAX + 1 >= PATH_MAX) return sj_seterr(SJ_EINVAL, "sj_cache_open: path too long");
    sj_cache *c = calloc(1, sizeof *c);
    if (!c || !(c->dir = strdup(dir))) {
        free(c);
        return sj_seterr(SJ_ENOMEM, "sj_cache_open: out of memory");
    }
    while (len > 1 && c->dir[len - 1] == '/') c->dir[--len] = '\0';
    if (mkdir_p(c->dir) || access(c->dir, W_OK | X_OK)) {
        int err = errno;
        free(c->dir);
        free(c);
        return sj_seterr(SJ_EINVAL, "sj_cache_open: cannot use directory %s: %s", dir, strerror(err));
    }
    bool locked = !pthread_mutex_init(&c->lock, NULL);
    if (!locked || pthread_mutex_init(&c->evict_lock, NULL)) {
        if (locked) pthread_mutex_destroy(&c->lock);
        free(c->dir);
        free(c);
        return sj_seterr(SJ_ENOMEM, "sj_cache_open: cannot create a mutex");
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
