/* Tests for kernels/cache: key determinism and sensitivity (part
 * boundaries), store and lookup from memory and from a file (copied),
 * the trust rules (another owner's or a group-writable directory refused
 * without a key; modes 0700/0600 whatever the umask; symlinks, FIFOs and
 * other owners' entries refused; keyed digests), corrupt / truncated / orphaned / garbage entries are misses
 * and are deleted, the size cap evicts least-recently-used first (a lookup
 * refreshes), two caches on one directory, 8 threads storing and loading at
 * once, files that are not ours left alone, stale temporaries swept, and
 * open failures. Each test runs in a fresh temporary directory. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "kernels/cache.h"
#include "tests/util.h"

/* -- Helpers --------------------------------------------------------------- */

typedef struct fixture {
    char dir[PATH_MAX]; /* the test's private temporary directory */
    char cdir[PATH_MAX]; /* the cache directory inside it */
} fixture;

static int setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    if (!f) return -1;
    if (tu_mkdtemp(f->dir, sizeof f->dir, "sjcache-test")) {
        free(f);
        return -1;
    }
    snprintf(f->cdir, sizeof f->cdir, "%s/cache", f->dir);
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    tu_rmtree(f->dir);
    free(f);
    return 0;
}

static void key_of(char out[65], const char *s) {
    const char *parts[] = {s};
    sj_cache_key(out, parts, 1);
}

static void path_of(char *buf, size_t n, const fixture *f, const char *key, const char *ext) {
    snprintf(buf, n, "%s/%s.%s", f->cdir, key, ext);
}

static bool exists(const char *path) { return access(path, F_OK) == 0; }

static void write_bytes(const char *path, const void *data, size_t len) {
    FILE *fp = fopen(path, "wb");
    assert_non_null(fp);
    assert_int_equal(fwrite(data, 1, len, fp), len);
    assert_int_equal(fclose(fp), 0);
}

static void set_mtime(const char *path, time_t when) {
    struct timespec ts[2] = {{when, 0}, {when, 0}};
    assert_int_equal(utimensat(AT_FDCWD, path, ts, 0), 0);
}

static time_t mtime_of(const char *path) {
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    return st.st_mtime;
}

static sj_cache_stats stats_of(const sj_cache *c) {
    sj_cache_stats s;
    sj_cache_get_stats(c, &s);
    return s;
}

/* -- Keys ------------------------------------------------------------------ */

static void test_key(void **state) {
    (void)state;
    char a[65], b[65];
    const char *p1[] = {"source", "cpu", "gcc 12"};
    sj_cache_key(a, p1, 3);
    sj_cache_key(b, p1, 3);
    assert_string_equal(a, b);
    assert_int_equal(strlen(a), 64);
    for (int i = 0; i < 64; i++) assert_non_null(strchr("0123456789abcdef", a[i]));
    /* boundaries matter */
    const char *x1[] = {"ab", "c"}, *x2[] = {"a", "bc"}, *x3[] = {"abc"}, *x4[] = {"abc", ""};
    char k1[65], k2[65], k3[65], k4[65], k0[65];
    sj_cache_key(k1, x1, 2);
    sj_cache_key(k2, x2, 2);
    sj_cache_key(k3, x3, 1);
    sj_cache_key(k4, x4, 2);
    sj_cache_key(k0, NULL, 0);
    assert_string_not_equal(k1, k2);
    assert_string_not_equal(k1, k3);
    assert_string_not_equal(k3, k4);
    assert_string_not_equal(k0, k3);
    /* one changed byte changes about half of the bits of every lane */
    char s[200];
    memset(s, 'x', sizeof s - 1);
    s[sizeof s - 1] = '\0';
    key_of(a, s);
    s[100] = 'y';
    key_of(b, s);
    for (int lane = 0; lane < 4; lane++) assert_memory_not_equal(a + 16 * lane, b + 16 * lane, 16);
    /* many similar keys never collide */
    char seen[512][65];
    for (int i = 0; i < 512; i++) {
        char txt[32];
        snprintf(txt, sizeof txt, "kernel %d", i);
        key_of(seen[i], txt);
        for (int j = 0; j < i; j++) assert_string_not_equal(seen[i], seen[j]);
    }
}

/* -- Store and lookup ------------------------------------------------------- */

static void test_store_lookup_memory(void **state) {
    fixture *f = *state;
    sj_cache *c;
    assert_int_equal(sj_cache_open(f->cdir, 0, &c), SJ_OK);
    assert_string_equal(sj_cache_dir(c), f->cdir);
    char key[65], path[PATH_MAX], want[PATH_MAX];
    key_of(key, "mem");
    assert_false(sj_cache_lookup(c, key, "so", path, sizeof path));
    const char data[] = "\x7f" "ELF pretend shared object";
    assert_int_equal(sj_cache_store(c, key, "so", data, sizeof data), SJ_OK);
    assert_true(sj_cache_lookup(c, key, "so", path, sizeof path));
    path_of(want, sizeof want, f, key, "so");
    assert_string_equal(path, want);
    void *got = NULL;
    size_t len = 0;
    assert_true(sj_cache_load(c, key, "so", &got, &len));
    assert_int_equal(len, sizeof data);
    assert_memory_equal(got, data, sizeof data);
    free(got);
    /* another ext of the same key is a different artifact: a miss */
    assert_false(sj_cache_lookup(c, key, "cubin", path, sizeof path));
    /* an empty artifact is fine */
    char k2[65];
    key_of(k2, "empty");
    assert_int_equal(sj_cache_store(c, k2, "cubin", "", 0), SJ_OK);
    assert_true(sj_cache_load(c, k2, "cubin", &got, &len));
    assert_int_equal(len, 0);
    free(got);
    /* a path buffer too small is a plain false */
    assert_false(sj_cache_lookup(c, key, "so", path, 10));
    sj_cache_stats s = stats_of(c);
    assert_int_equal(s.stores, 2);
    assert_int_equal(s.hits, 3);
    assert_int_equal(s.misses, 2);
    assert_int_equal(s.corrupt, 0);
    /* one artifact a key: the miss of another extension above left the
     * first one's meta alone, and a store of another extension under the
     * key is refused (it would replace that meta), the first intact */
    assert_true(sj_cache_load(c, key, "so", &got, &len));
    free(got);
    assert_int_equal(sj_cache_store(c, key, "cubin", "other", 5), SJ_EINVAL);
    assert_non_null(strstr(sj_last_error(), "holds a .so artifact already"));
    assert_true(sj_cache_load(c, key, "so", &got, &len));
    assert_int_equal(len, sizeof data);
    assert_memory_equal(got, data, sizeof data);
    free(got);
    assert_false(sj_cache_lookup(c, key, "cubin", path, sizeof path));
    assert_int_equal(stats_of(c).corrupt, 0);
    /* the same extension again replaces it */
    assert_int_equal(sj_cache_store(c, key, "so", "new", 3), SJ_OK);
    assert_true(sj_cache_load(c, key, "so", &got, &len));
    assert_int_equal(len, 3);
    free(got);
    sj_cache_close(c);
    sj_cache_close(NULL);
}

static void test_store_file(void **state) {
    fixture *f = *state;
    sj_cache *c;
    assert_int_equal(sj_cache_open(f->cdir, 0, &c), SJ_OK);
    char key[65], src[PATH_MAX], path[PATH_MAX];
    key_of(key, "file");
    unsigned char data[100000];
    for (size_t i = 0; i < sizeof data; i++) data[i] = (unsigned char)(i * 131 + 7);
    snprintf(src, sizeof src, "%s/k.so", f->dir);
    write_bytes(src, data, sizeof data);
    assert_int_equal(sj_cache_store_file(c, key, "so", src), SJ_OK);
    assert_true(exists(src)); /* copied: the bytes digested are the bytes written into the cache */
    assert_true(sj_cache_lookup(c, key, "so", path, sizeof path));
    void *got;
    size_t len;
    assert_true(sj_cache_load(c, key, "so", &got, &len));
    assert_int_equal(len, sizeof data);
    assert_memory_equal(got, data, sizeof data);
    free(got);
    /* a missing source file is an error, and harmless */
    assert_int_equal(sj_cache_store_file(c, key, "so", "/nonexistent/file"), SJ_EBACKEND);
    assert_true(sj_cache_lookup(c, key, "so", path, sizeof path));
    /* bad keys and extensions never reach the filesystem */
    assert_int_equal(sj_cache_store(c, "../../etc/passwd", "so", "x", 1), SJ_EINVAL);
    assert_int_equal(sj_cache_store(c, key, "meta", "x", 1), SJ_EINVAL);
    assert_int_equal(sj_cache_store(c, key, "s/o", "x", 1), SJ_EINVAL);
    assert_false(sj_cache_lookup(c, "zz", "so", path, sizeof path));

    /* from another filesystem (tmpfs), the file is copied */
    char shm[PATH_MAX] = "/dev/shm/sjcache-test-XXXXXX";
    int fd = mkstemp(shm);
    if (fd >= 0) {
        assert_int_equal(write(fd, data, 5000), 5000);
        close(fd);
        char k2[65];
        key_of(k2, "shm");
        assert_int_equal(sj_cache_store_file(c, k2, "so", shm), SJ_OK);
        assert_true(exists(shm)); /* copied */
        assert_true(sj_cache_load(c, k2, "so", &got, &len));
        assert_int_equal(len, 5000);
        assert_memory_equal(got, data, 5000);
        free(got);
        unlink(shm);
    }
    sj_cache_close(c);
}

/* -- Damage ------------------------------------------------------------------ */

enum { FLIP, TRUNCATE, NO_META, GARBAGE_META, NO_ARTIFACT, WRONG_EXT_META };

static void damage_case(fixture *f, int how) {
    sj_cache *c;
    assert_int_equal(sj_cache_open(f->cdir, 0, &c), SJ_OK);
    char key[65], art[PATH_MAX], meta[PATH_MAX], path[PATH_MAX];
    key_of(key, "damaged");
    path_of(art, sizeof art, f, key, "so");
    path_of(meta, sizeof meta, f, key, "meta");
    unsigned char data[4096];
    for (size_t i = 0; i < sizeof data; i++) data[i] = (unsigned char)(i ^ 0x5a);
    assert_int_equal(sj_cache_store(c, key, "so", data, sizeof data), SJ_OK);
    assert_true(exists(art) && exists(meta));
    switch (how) {
    case FLIP:
        data[1234] ^= 0x10;
        write_bytes(art, data, sizeof data);
        break;
    case TRUNCATE:
        assert_int_equal(truncate(art, 1000), 0);
        break;
    case NO_META:
        assert_int_equal(unlink(meta), 0);
        break;
    case GARBAGE_META:
        write_bytes(meta, "this is not a meta file\n", 24);
        break;
    case NO_ARTIFACT:
        assert_int_equal(unlink(art), 0);
        break;
    case WRONG_EXT_META: { /* a meta that describes another extension */
        char m[256];
        FILE *fp = fopen(meta, "rb");
        assert_non_null(fp);
        size_t n = fread(m, 1, sizeof m - 1, fp);
        fclose(fp);
        m[n] = '\0';
        char *e = strstr(m, "ext so");
        assert_non_null(e);
        e[4] = 'x';
        write_bytes(meta, m, n);
        break;
    }
    }
    assert_false(sj_cache_lookup(c, key, "so", path, sizeof path));
    assert_false(exists(art));
    assert_false(exists(meta));
    sj_cache_stats s = stats_of(c);
    assert_int_equal(s.hits, 0);
    assert_int_equal(s.misses, 1);
    assert_int_equal(s.corrupt, how == NO_META || how == NO_ARTIFACT ? 0 : 1);
    /* storing again repairs it */
    data[1234] = (unsigned char)(1234 ^ 0x5a);
    assert_int_equal(sj_cache_store(c, key, "so", data, sizeof data), SJ_OK);
    void *got;
    size_t len;
    assert_true(sj_cache_load(c, key, "so", &got, &len));
    assert_int_equal(len, sizeof data);
    assert_memory_equal(got, data, sizeof data);
    free(got);
    sj_cache_close(c);
}

static void test_corrupt_flipped(void **state) { damage_case(*state, FLIP); }
static void test_corrupt_truncated(void **state) { damage_case(*state, TRUNCATE); }
static void test_missing_meta(void **state) { damage_case(*state, NO_META); }
static void test_garbage_meta(void **state) { damage_case(*state, GARBAGE_META); }
static void test_orphaned_meta(void **state) { damage_case(*state, NO_ARTIFACT); }
static void test_meta_for_other_ext(void **state) { damage_case(*state, WRONG_EXT_META); }

/* -- Eviction ----------------------------------------------------------------- */

static void test_lru_eviction(void **state) {
    fixture *f = *state;
    sj_cache *c;
    /* each entry: 1000 bytes + a meta of under 100: three fit, four do not */
    assert_int_equal(sj_cache_open(f->cdir, 3500, &c), SJ_OK);
    char keys[5][65], art[5][PATH_MAX], meta[5][PATH_MAX], path[PATH_MAX];
    char data[1000];
    memset(data, 'a', sizeof data);
    time_t base = time(NULL) - 100000;
    for (int i = 0; i < 3; i++) {
        char name[16];
        snprintf(name, sizeof name, "entry%d", i);
        key_of(keys[i], name);
        path_of(art[i], sizeof art[i], f, keys[i], "so");
        path_of(meta[i], sizeof meta[i], f, keys[i], "meta");
        assert_int_equal(sj_cache_store(c, keys[i], "so", data, sizeof data), SJ_OK);
        set_mtime(art[i], base + 1000 * i); /* entry0 oldest */
    }
    assert_int_equal(stats_of(c).evictions, 0);
    /* a lookup refreshes entry0 and a touch (a unit used from memory)
     * entry1: entry2 becomes the least recently used */
    assert_true(sj_cache_lookup(c, keys[0], "so", path, sizeof path));
    assert_true(mtime_of(art[0]) >= time(NULL) - 5);
    sj_cache_touch(c, keys[1], "so");
    assert_true(mtime_of(art[1]) >= time(NULL) - 5);
    sj_cache_touch(c, keys[2], "cubin"); /* no such artifact: nothing */
    sj_cache_touch(c, "not a key", "so");
    sj_cache_touch(NULL, keys[2], "so");
    assert_true(mtime_of(art[2]) == base + 2000);
    assert_int_equal(stats_of(c).hits, 1);
    key_of(keys[3], "entry3");
    path_of(art[3], sizeof art[3], f, keys[3], "so");
    assert_int_equal(sj_cache_store(c, keys[3], "so", data, sizeof data), SJ_OK);
    assert_false(exists(art[2]));
    assert_false(exists(meta[2]));
    assert_true(exists(art[0]) && exists(art[1]) && exists(art[3]));
    assert_int_equal(stats_of(c).evictions, 1);
    /* an artifact larger than the whole cap evicts everything older, then itself */
    char big[5000];
    memset(big, 'b', sizeof big);
    set_mtime(art[0], base), set_mtime(art[1], base + 1), set_mtime(art[3], base + 2);
    key_of(keys[4], "big");
    path_of(art[4], sizeof art[4], f, keys[4], "so");
    assert_int_equal(sj_cache_store(c, keys[4], "so", big, sizeof big), SJ_OK);
    assert_false(exists(art[0]) || exists(art[1]) || exists(art[3]) || exists(art[4]));
    assert_int_equal(stats_of(c).evictions, 5);
    sj_cache_close(c);
}

static void test_foreign_files_left_alone(void **state) {
    fixture *f = *state;
    assert_int_equal(mkdir(f->cdir, 0755), 0);
    char key[65], p[PATH_MAX];
    key_of(key, "foreign");
    const char *names[] = {"README", "notes.so", "ABCDEF.meta", ".hidden", NULL, NULL};
    char upper[80], tilde[80];
    snprintf(upper, sizeof upper, "%.64s.so", "0123456789ABCDEF0123456789ABCDEF0123456789ABCDEF0123456789ABCDEF");
    snprintf(tilde, sizeof tilde, "%s.so~", key);
    names[4] = upper, names[5] = tilde;
    char big[20000];
    memset(big, 'z', sizeof big);
    for (int i = 0; i < 6; i++) {
        snprintf(p, sizeof p, "%s/%s", f->cdir, names[i]);
        write_bytes(p, big, sizeof big); /* each alone is over the cap */
        set_mtime(p, 1000);
    }
    /* our temporaries: a stale one is swept, a fresh one is not */
    char stale[PATH_MAX], fresh[PATH_MAX];
    snprintf(stale, sizeof stale, "%s/.sjtmp.1.2.3", f->cdir);
    snprintf(fresh, sizeof fresh, "%s/.sjtmp.4.5.6", f->cdir);
    write_bytes(stale, "x", 1);
    write_bytes(fresh, "x", 1);
    set_mtime(stale, time(NULL) - 7200);
    sj_cache *c;
    assert_int_equal(sj_cache_open(f->cdir, 4000, &c), SJ_OK);
    assert_false(exists(stale));
    assert_true(exists(fresh));
    assert_int_equal(sj_cache_store(c, key, "so", "data", 4), SJ_OK);
    char path[PATH_MAX];
    assert_true(sj_cache_lookup(c, key, "so", path, sizeof path));
    for (int i = 0; i < 6; i++) {
        snprintf(p, sizeof p, "%s/%s", f->cdir, names[i]);
        assert_true(exists(p));
    }
    assert_int_equal(stats_of(c).evictions, 0);
    sj_cache_close(c);
}

/* -- Sharing -------------------------------------------------------------------- */

static void test_two_caches_one_dir(void **state) {
    fixture *f = *state;
    sj_cache *a, *b;
    assert_int_equal(sj_cache_open(f->cdir, 0, &a), SJ_OK);
    assert_int_equal(sj_cache_open(f->cdir, 0, &b), SJ_OK);
    char k1[65], k2[65], path[PATH_MAX];
    key_of(k1, "from a");
    key_of(k2, "from b");
    assert_int_equal(sj_cache_store(a, k1, "so", "AAAA", 4), SJ_OK);
    assert_true(sj_cache_lookup(b, k1, "so", path, sizeof path));
    assert_int_equal(sj_cache_store(b, k2, "so", "BBBB", 4), SJ_OK);
    void *got;
    size_t len;
    assert_true(sj_cache_load(a, k2, "so", &got, &len));
    assert_memory_equal(got, "BBBB", 4);
    free(got);
    /* b replaces a's artifact: a sees the new one, verified */
    assert_int_equal(sj_cache_store(b, k1, "so", "CCCCCC", 6), SJ_OK);
    assert_true(sj_cache_load(a, k1, "so", &got, &len));
    assert_int_equal(len, 6);
    free(got);
    /* one deletes under the other: a miss, not a crash */
    char art[PATH_MAX];
    path_of(art, sizeof art, f, k2, "so");
    unlink(art);
    assert_false(sj_cache_lookup(a, k2, "so", path, sizeof path));
    assert_false(sj_cache_lookup(b, k2, "so", path, sizeof path));
    assert_int_equal(stats_of(a).stores, 1);
    assert_int_equal(stats_of(b).stores, 2);
    sj_cache_close(a);
    sj_cache_close(b);
}

typedef struct worker_arg {
    sj_cache *c;
    int id;
    int bad; /* a hit with the wrong bytes */
} worker_arg;

/* Content is a function of the key number, so every hit can be checked. */
static size_t content(int k, unsigned char *buf) {
    size_t n = 500 + (size_t)k * 37;
    for (size_t i = 0; i < n; i++) buf[i] = (unsigned char)(k * 31 + i);
    return n;
}

static void *worker(void *p) {
    worker_arg *a = p;
    unsigned char buf[4096];
    for (int rep = 0; rep < 300; rep++) {
        int k = (a->id * 7 + rep * 13) % 40;
        char name[16], key[65], path[PATH_MAX];
        snprintf(name, sizeof name, "k%d", k);
        key_of(key, name);
        size_t n = content(k, buf);
        void *got;
        size_t len;
        if (rep % 3 == 0) {
            sj_cache_store(a->c, key, "so", buf, n);
        } else if (rep % 3 == 1) {
            if (sj_cache_load(a->c, key, "so", &got, &len)) {
                if (len != n || memcmp(got, buf, n)) a->bad++;
                free(got);
            }
        } else {
            sj_cache_lookup(a->c, key, "so", path, sizeof path);
        }
    }
    return NULL;
}

static void concurrent(fixture *f, uint64_t cap) {
    sj_cache *c[2];
    assert_int_equal(sj_cache_open(f->cdir, cap, &c[0]), SJ_OK);
    assert_int_equal(sj_cache_open(f->cdir, cap, &c[1]), SJ_OK);
    enum { THREADS = 8 };
    pthread_t th[THREADS];
    worker_arg args[THREADS];
    for (int i = 0; i < THREADS; i++) {
        args[i] = (worker_arg){c[i % 2], i, 0};
        assert_int_equal(pthread_create(&th[i], NULL, worker, &args[i]), 0);
    }
    for (int i = 0; i < THREADS; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(args[i].bad, 0);
    }
    for (int i = 0; i < 2; i++) {
        sj_cache_stats s = stats_of(c[i]);
        assert_int_equal(s.corrupt, 0);
        assert_true(s.hits + s.misses == THREADS / 2 * 200);
        if (!cap) assert_int_equal(s.evictions, 0);
        sj_cache_close(c[i]);
    }
}

static void test_concurrent(void **state) { concurrent(*state, 0); }
static void test_concurrent_capped(void **state) { concurrent(*state, 8000); }

/* -- Open ------------------------------------------------------------------------ */

static void test_open_errors(void **state) {
    fixture *f = *state;
    sj_cache *c = (sj_cache *)1;
    assert_int_equal(sj_cache_open(NULL, 0, &c), SJ_EINVAL);
    assert_null(c);
    assert_int_equal(sj_cache_open("", 0, &c), SJ_EINVAL);
    assert_int_equal(sj_cache_open(f->cdir, 0, NULL), SJ_EINVAL);
    /* under a regular file: cannot be created */
    char file[PATH_MAX], under[PATH_MAX];
    snprintf(file, sizeof file, "%s/plain", f->dir);
    write_bytes(file, "x", 1);
    snprintf(under, sizeof under, "%s/sub/cache", file);
    assert_int_equal(sj_cache_open(under, 0, &c), SJ_EINVAL);
    assert_int_equal(sj_cache_open(file, 0, &c), SJ_EINVAL);
    /* not writable (root may write anywhere, so only as a user) */
    if (geteuid() != 0) {
        char ro[PATH_MAX];
        snprintf(ro, sizeof ro, "%s/ro", f->dir);
        assert_int_equal(mkdir(ro, 0555), 0);
        assert_int_equal(sj_cache_open(ro, 0, &c), SJ_EINVAL);
        chmod(ro, 0755);
    }
    /* parents are created, trailing slashes are fine */
    char deep[PATH_MAX];
    snprintf(deep, sizeof deep, "%s/a/b/c/", f->dir);
    assert_int_equal(sj_cache_open(deep, 0, &c), SJ_OK);
    assert_int_equal(sj_cache_dir(c)[strlen(sj_cache_dir(c)) - 1], 'c');
    sj_cache_close(c);
    sj_cache_stats s;
    sj_cache_get_stats(NULL, &s);
    assert_int_equal(s.hits, 0);
}

/* -- Trust ----------------------------------------------------------------------- */

/* A user that is not the test's (tests run as root in CI; as a user, the
 * chown checks need root and are skipped). */
#define OTHER_UID 65534

static void test_dir_of_another_user(void **state) {
    fixture *f = *state;
    if (geteuid() != 0) {
        print_message("skipped: chown to another user needs root\n");
        return;
    }
    assert_int_equal(mkdir(f->cdir, 0700), 0);
    assert_int_equal(chown(f->cdir, OTHER_UID, OTHER_UID), 0);
    sj_cache *c = NULL;
    assert_int_equal(sj_cache_open(f->cdir, 0, &c), SJ_EINVAL);
    assert_null(c);
    assert_non_null(strstr(sj_last_error(), "owned by uid 65534"));
    assert_non_null(strstr(sj_last_error(), "SHAPEJIT_CACHE_KEY"));
    /* with a key, a shared directory is used (entries are verified by it) */
    assert_int_equal(sj_cache_open_keyed(f->cdir, 0, "team secret", NULL, &c), SJ_OK);
    assert_true(sj_cache_keyed(c));
    sj_cache_close(c);
}

static void test_dir_writable_by_others(void **state) {
    fixture *f = *state;
    assert_int_equal(mkdir(f->cdir, 0700), 0);
    assert_int_equal(chmod(f->cdir, 0777), 0);
    sj_cache *c = NULL;
    assert_int_equal(sj_cache_open(f->cdir, 0, &c), SJ_EINVAL);
    assert_non_null(strstr(sj_last_error(), "writable by group or others (mode 777"));
    assert_int_equal(chmod(f->cdir, 0770), 0);
    assert_int_equal(sj_cache_open(f->cdir, 0, &c), SJ_EINVAL);
    assert_int_equal(chmod(f->cdir, 0755), 0);
    assert_int_equal(sj_cache_open(f->cdir, 0, &c), SJ_OK);
    sj_cache_close(c);
    /* a symlink to a good directory is not followed */
    char link[PATH_MAX];
    snprintf(link, sizeof link, "%s/link", f->dir);
    assert_int_equal(symlink(f->cdir, link), 0);
    assert_int_equal(sj_cache_open(link, 0, &c), SJ_EINVAL);
    assert_non_null(strstr(sj_last_error(), "symbolic link"));
}

static mode_t mode_of(const char *path) {
    struct stat st;
    assert_int_equal(lstat(path, &st), 0);
    return st.st_mode & 07777;
}

static void test_modes_whatever_the_umask(void **state) {
    fixture *f = *state;
    mode_t old = umask(0);
    char deep[PATH_MAX], art[PATH_MAX], meta[PATH_MAX], key[65], src[PATH_MAX];
    snprintf(deep, sizeof deep, "%s/made/here", f->dir);
    sj_cache *c;
    assert_int_equal(sj_cache_open(deep, 0, &c), SJ_OK);
    umask(old);
    assert_int_equal(mode_of(deep), 0700);
    snprintf(art, sizeof art, "%s/made", f->dir);
    assert_int_equal(mode_of(art), 0700);
    umask(0);
    key_of(key, "modes");
    assert_int_equal(sj_cache_store(c, key, "cubin", "abc", 3), SJ_OK);
    snprintf(art, sizeof art, "%s/%s.cubin", deep, key);
    snprintf(meta, sizeof meta, "%s/%s.meta", deep, key);
    assert_int_equal(mode_of(art), 0600);
    assert_int_equal(mode_of(meta), 0600);
    /* a compiler's output of mode 0777 is stored 0600 */
    snprintf(src, sizeof src, "%s/k.so", f->dir);
    write_bytes(src, "so bytes", 8);
    assert_int_equal(chmod(src, 0777), 0);
    key_of(key, "modes2");
    assert_int_equal(sj_cache_store_file(c, key, "so", src), SJ_OK);
    snprintf(art, sizeof art, "%s/%s.so", deep, key);
    assert_int_equal(mode_of(art), 0600);
    umask(old);
    sj_cache_close(c);
}

/* Each way an entry's file can be something other than what the cache
 * wrote: refused (a miss, counted as corrupt, removed), never followed,
 * never blocking. */
enum { SYMLINK_ART, SYMLINK_META, FIFO_ART, OTHER_OWNER_ART, GROUP_WRITABLE_ART };

static void refused_case(fixture *f, int how) {
    sj_cache *c;
    assert_int_equal(sj_cache_open(f->cdir, 0, &c), SJ_OK);
    char key[65], art[PATH_MAX], meta[PATH_MAX], elsewhere[PATH_MAX];
    key_of(key, "refused");
    path_of(art, sizeof art, f, key, "so");
    path_of(meta, sizeof meta, f, key, "meta");
    assert_int_equal(sj_cache_store(c, key, "so", "real bytes", 10), SJ_OK);
    snprintf(elsewhere, sizeof elsewhere, "%s/elsewhere", f->dir);
    switch (how) {
    case SYMLINK_ART: /* the same valid bytes, through a link */
        assert_int_equal(rename(art, elsewhere), 0);
        assert_int_equal(symlink(elsewhere, art), 0);
        break;
    case SYMLINK_META:
        assert_int_equal(rename(meta, elsewhere), 0);
        assert_int_equal(symlink(elsewhere, meta), 0);
        break;
    case FIFO_ART:
        assert_int_equal(unlink(art), 0);
        assert_int_equal(mkfifo(art, 0600), 0);
        break;
    case OTHER_OWNER_ART:
        if (geteuid() != 0) {
            print_message("skipped: chown needs root\n");
            sj_cache_close(c);
            return;
        }
        assert_int_equal(chown(art, OTHER_UID, OTHER_UID), 0);
        break;
    case GROUP_WRITABLE_ART:
        assert_int_equal(chmod(art, 0620), 0);
        break;
    }
    alarm(20); /* a FIFO that blocked the open would hang here */
    void *got = NULL;
    size_t len = 0;
    assert_false(sj_cache_load(c, key, "so", &got, &len));
    alarm(0);
    assert_int_equal(stats_of(c).corrupt, 1);
    struct stat st;
    assert_true(lstat(art, &st) != 0 || how == SYMLINK_META); /* removed (a link itself, not its target) */
    assert_true(exists(elsewhere) || how == FIFO_ART || how == OTHER_OWNER_ART || how == GROUP_WRITABLE_ART);
    /* the slot is usable again */
    assert_int_equal(sj_cache_store(c, key, "so", "new bytes!", 10), SJ_OK);
    assert_true(sj_cache_load(c, key, "so", &got, &len));
    assert_memory_equal(got, "new bytes!", 10);
    free(got);
    sj_cache_close(c);
}

static void test_symlinked_artifact(void **state) { refused_case(*state, SYMLINK_ART); }
static void test_symlinked_meta(void **state) { refused_case(*state, SYMLINK_META); }
static void test_fifo_artifact(void **state) { refused_case(*state, FIFO_ART); }
static void test_artifact_of_another_user(void **state) { refused_case(*state, OTHER_OWNER_ART); }
static void test_group_writable_artifact(void **state) { refused_case(*state, GROUP_WRITABLE_ART); }

/* With a key, an entry written without it, or under another key, is
 * refused: whoever can write the directory cannot forge an entry. */
static void test_keyed_digests(void **state) {
    fixture *f = *state;
    sj_cache *plain, *k1, *k2;
    assert_int_equal(sj_cache_open(f->cdir, 0, &plain), SJ_OK);
    assert_int_equal(sj_cache_open_keyed(f->cdir, 0, "key one", NULL, &k1), SJ_OK);
    assert_int_equal(sj_cache_open_keyed(f->cdir, 0, "key two", NULL, &k2), SJ_OK);
    char key[65];
    void *got;
    size_t len;
    key_of(key, "keyed");
    assert_int_equal(sj_cache_store(k1, key, "so", "signed", 6), SJ_OK);
    assert_true(sj_cache_load(k1, key, "so", &got, &len));
    free(got);
    assert_false(sj_cache_load(k2, key, "so", &got, &len)); /* another key: refused and removed */
    assert_int_equal(stats_of(k2).corrupt, 1);
    assert_false(sj_cache_load(k1, key, "so", &got, &len));
    /* a forger without the key writes a consistent unkeyed entry */
    assert_int_equal(sj_cache_store(plain, key, "so", "forged", 6), SJ_OK);
    assert_true(sj_cache_load(plain, key, "so", &got, &len));
    free(got);
    assert_false(sj_cache_load(k1, key, "so", &got, &len));
    /* the digest binds the entry's key: bytes moved to another key's name
     * are refused */
    char key2[65], a1[PATH_MAX], m1[PATH_MAX], a2[PATH_MAX], m2[PATH_MAX];
    key_of(key2, "keyed2");
    assert_int_equal(sj_cache_store(k1, key, "so", "first", 5), SJ_OK);
    path_of(a1, sizeof a1, f, key, "so"), path_of(m1, sizeof m1, f, key, "meta");
    path_of(a2, sizeof a2, f, key2, "so"), path_of(m2, sizeof m2, f, key2, "meta");
    assert_int_equal(rename(a1, a2), 0);
    assert_int_equal(rename(m1, m2), 0);
    assert_false(sj_cache_load(k1, key2, "so", &got, &len));
    sj_cache_close(plain);
    sj_cache_close(k1);
    sj_cache_close(k2);
}

int main(void) {
#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_key),
        T(test_store_lookup_memory),
        T(test_store_file),
        T(test_corrupt_flipped),
        T(test_corrupt_truncated),
        T(test_missing_meta),
        T(test_garbage_meta),
        T(test_orphaned_meta),
        T(test_meta_for_other_ext),
        T(test_lru_eviction),
        T(test_foreign_files_left_alone),
        T(test_two_caches_one_dir),
        T(test_concurrent),
        T(test_concurrent_capped),
        T(test_open_errors),
        T(test_dir_of_another_user),
        T(test_dir_writable_by_others),
        T(test_modes_whatever_the_umask),
        T(test_symlinked_artifact),
        T(test_symlinked_meta),
        T(test_fifo_artifact),
        T(test_artifact_of_another_user),
        T(test_group_writable_artifact),
        T(test_keyed_digests),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
