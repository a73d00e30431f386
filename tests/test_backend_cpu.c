/* Tests for kernels/cpu/backend_cpu: compile a unit with two kernels and
 * call them; a compile error (the compiler's message in the log); a missing
 * compiler (fails fast, "not found"); a missing symbol; invalid requests;
 * the persistent cache (a second backend loads without running the
 * compiler, a corrupt cached .so and an unloadable one are recompiled); the
 * test hooks; dump_dir; compiles from 4 threads at once; no fd, child or
 * temporary left behind on any path; and timings. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <ftw.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "jit/error.h"
#include "jit/runtime.h"
#include "kernels/cpu/backend_cpu.h"

/* -- Helpers --------------------------------------------------------------- */

/* Log lines from the backend, kept for the checks (any thread). */
typedef struct logbook {
    pthread_mutex_t lock;
    char text[16384];
    size_t len;
} logbook;

static void log_sink(void *user, unsigned topic, const char *msg) {
    logbook *lb = user;
    (void)topic;
    pthread_mutex_lock(&lb->lock);
    int w = snprintf(lb->text + lb->len, sizeof lb->text - lb->len, "%s\n", msg);
    if (w > 0) lb->len += (size_t)w < sizeof lb->text - lb->len ? (size_t)w : sizeof lb->text - 1 - lb->len;
    pthread_mutex_unlock(&lb->lock);
}

typedef struct fixture {
    char dir[PATH_MAX];
    sj_runtime rt; /* only its log configuration is used */
    logbook log;
} fixture;

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

static int setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    if (!f) return -1;
    const char *tmp = getenv("TMPDIR");
    snprintf(f->dir, sizeof f->dir, "%s/sjcpu-test-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(f->dir)) return -1;
    pthread_mutex_init(&f->log.lock, NULL);
    f->rt.cfg.log_mask = SJ_LOG_ALL;
    f->rt.cfg.log_fn = log_sink;
    f->rt.cfg.log_user = &f->log;
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    nftw(f->dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
    pthread_mutex_destroy(&f->log.lock);
    free(f);
    return 0;
}

static bool logged(fixture *f, const char *what) {
    pthread_mutex_lock(&f->log.lock);
    bool found = strstr(f->log.text, what) != NULL;
    pthread_mutex_unlock(&f->log.lock);
    return found;
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static sj_backend *make(fixture *f, const char *cc, sj_cache *cache) {
    sj_cpu_backend_config cfg = {0};
    cfg.cc = cc;
    cfg.cache = cache;
    cfg.rt = &f->rt;
    sj_backend *b = NULL;
    assert_int_equal(sj_cpu_backend_create(&cfg, &b), SJ_OK);
    assert_non_null(b);
    return b;
}

static const char SRC[] = "#include <math.h>\n"
                          "#include <stdint.h>\n"
                          "void k0(float *y, const float *x, long n) {\n"
                          "    for (long i = 0; i < n; i++) y[i] = 2.0f * x[i] + 1.0f;\n"
                          "}\n"
                          "void k1(float *y, const float *x, long n) {\n"
                          "    for (long i = 0; i < n; i++) y[i] = expf(x[i]);\n"
                          "}\n";
static const char *const SYMS[] = {"k0", "k1"};

typedef void (*kernel)(float *, const float *, long);

static sj_compile_req req_of(const char *src, const char *tag) {
    return (sj_compile_req){src, strlen(src), SYMS, 2, tag};
}

/* Calls k0 and k1 of a result built from SRC and checks them. */
static void check_kernels(const sj_compile_result *r) {
    float x[100], y[100];
    for (int i = 0; i < 100; i++) x[i] = (float)i / 10.0f - 5.0f;
    ((kernel)r->fns[0])(y, x, 100);
    for (int i = 0; i < 100; i++) assert_float_equal(y[i], 2.0f * x[i] + 1.0f, 1e-6);
    ((kernel)r->fns[1])(y, x, 100);
    for (int i = 0; i < 100; i++) assert_float_equal(y[i], expf(x[i]), 1e-5f * expf(x[i]));
}

/* A compiler wrapper that records each invocation, then runs cc. */
static void make_wrapper(const fixture *f, char *path, size_t n, char *logpath, size_t ln) {
    snprintf(path, n, "%s/mycc", f->dir);
    snprintf(logpath, ln, "%s/mycc.log", f->dir);
    FILE *fp = fopen(path, "w");
    assert_non_null(fp);
    fprintf(fp, "#!/bin/sh\necho \"$*\" >> '%s'\nexec cc \"$@\"\n", logpath);
    assert_int_equal(fclose(fp), 0);
    assert_int_equal(chmod(path, 0755), 0);
}

/* Invocations in the wrapper's log other than the --version probes. */
static int compiler_runs(const char *logpath) {
    FILE *fp = fopen(logpath, "r");
    if (!fp) return 0;
    char line[4096];
    int n = 0;
    while (fgets(line, sizeof line, fp))
        if (!strstr(line, "--version")) n++;
    fclose(fp);
    return n;
}

/* -- Compiling ---------------------------------------------------------------- */

static void test_compile_and_call(void **state) {
    fixture *f = *state;
    sj_backend *b = make(f, NULL, NULL);
    assert_string_equal(b->name, "cpu");
    const char *id = b->identity(b);
    assert_non_null(strstr(id, "cc ("));
    assert_non_null(strstr(id, "-march=native"));
    assert_non_null(strstr(id, "cpu:"));
    sj_compile_req req = req_of(SRC, "t.e0.static");
    sj_compile_result r;
    assert_int_equal(b->compile(b, &req, &r), SJ_OK);
    assert_non_null(r.module);
    assert_false(r.from_cache);
    assert_true(r.compile_ms > 0);
    assert_int_equal(strlen(r.key), 64);
    check_kernels(&r);
    assert_true(logged(f, "cpu: t.e0.static: compiled in"));
    /* the same request twice: same key, independent modules */
    sj_compile_result r2;
    assert_int_equal(b->compile(b, &req, &r2), SJ_OK);
    assert_string_equal(r.key, r2.key);
    b->unload(b, r.module);
    check_kernels(&r2);
    b->unload(b, r2.module);
    b->unload(b, NULL);
    print_message("identity: %s\ncompile_ms (cc, %zu bytes of C): %.1f\n", id, strlen(SRC), r.compile_ms);
    b->destroy(b);
}

static void test_compile_error(void **state) {
    fixture *f = *state;
    sj_backend *b = make(f, NULL, NULL);
    const char *bad = "void k0(float *y) { y[0] = undeclared_thing; }\n";
    sj_compile_req req = {bad, strlen(bad), SYMS, 1, "broken"};
    sj_compile_result r;
    assert_int_equal(b->compile(b, &req, &r), SJ_EBACKEND);
    assert_null(r.module);
    assert_non_null(strstr(r.log, "undeclared_thing"));
    assert_non_null(strstr(sj_last_error(), "compile failed"));
    assert_non_null(strstr(sj_last_error(), "undeclared_thing")); /* the error line, not "In function" */
    assert_true(logged(f, "cpu: broken: compile failed"));
    b->destroy(b);
}

static void test_missing_compiler(void **state) {
    fixture *f = *state;
    sj_backend *b = make(f, "/nonexistent/cc", NULL);
    assert_true(logged(f, "compiler '/nonexistent/cc' not found"));
    assert_non_null(strstr(b->identity(b), "not found"));
    sj_compile_req req = req_of(SRC, "nocc");
    sj_compile_result r;
    for (int i = 0; i < 3; i++) { /* every compile fails, fast, without retrying */
        double t0 = now_ms();
        assert_int_equal(b->compile(b, &req, &r), SJ_EBACKEND);
        assert_true(now_ms() - t0 < 50);
        assert_null(r.module);
        assert_non_null(strstr(r.log, "compiler '/nonexistent/cc' not found"));
    }
    b->destroy(b);
    /* a name searched in PATH that does not exist */
    b = make(f, "sj-no-such-compiler", NULL);
    assert_int_equal(b->compile(b, &req, &r), SJ_EBACKEND);
    assert_non_null(strstr(r.log, "not found"));
    b->destroy(b);
}

static void test_missing_symbol(void **state) {
    fixture *f = *state;
    sj_backend *b = make(f, NULL, NULL);
    const char *const syms[] = {"k0", "k_missing"};
    sj_compile_req req = {SRC, strlen(SRC), syms, 2, "nosym"};
    sj_compile_result r;
    assert_int_equal(b->compile(b, &req, &r), SJ_EBACKEND);
    assert_null(r.module);
    assert_non_null(strstr(r.log, "k_missing"));
    assert_non_null(strstr(sj_last_error(), "k_missing"));
    b->destroy(b);
}

static void test_invalid_requests(void **state) {
    fixture *f = *state;
    sj_backend *b = make(f, NULL, NULL);
    sj_compile_result r;
    assert_int_equal(b->compile(b, NULL, &r), SJ_EINVAL);
    sj_compile_req req = req_of(SRC, "x");
    req.n_symbols = 65;
    assert_int_equal(b->compile(b, &req, &r), SJ_EINVAL);
    req = req_of(SRC, "x");
    req.source_len = sizeof SRC; /* includes the NUL */
    assert_int_equal(b->compile(b, &req, &r), SJ_EINVAL);
    assert_int_equal(b->compile(b, &req, NULL), SJ_EINVAL);
    sj_cpu_backend_config cfg = {.test_delay_ms = -1};
    sj_backend *nb = (sj_backend *)1;
    assert_int_equal(sj_cpu_backend_create(&cfg, &nb), SJ_EINVAL);
    assert_null(nb);
    assert_int_equal(sj_cpu_backend_create(NULL, NULL), SJ_EINVAL);
    /* a source without a NUL at source_len is fine (only the length counts) */
    char buf[sizeof SRC + 8];
    memcpy(buf, SRC, sizeof SRC - 1);
    memcpy(buf + sizeof SRC - 1, "garbage", 8);
    req = req_of(SRC, "unterminated");
    req.source = buf;
    req.source_len = sizeof SRC - 1;
    assert_int_equal(b->compile(b, &req, &r), SJ_OK);
    check_kernels(&r);
    b->unload(b, r.module);
    b->destroy(b);
}

/* -- Persistent cache ----------------------------------------------------------- */

static void test_cache_second_backend(void **state) {
    fixture *f = *state;
    char cdir[PATH_MAX], cc[PATH_MAX], cclog[PATH_MAX];
    snprintf(cdir, sizeof cdir, "%s/cache", f->dir);
    make_wrapper(f, cc, sizeof cc, cclog, sizeof cclog);
    sj_cache *cache;
    assert_int_equal(sj_cache_open(cdir, 0, &cache), SJ_OK);

    sj_backend *a = make(f, cc, cache);
    sj_compile_req req = req_of(SRC, "cached");
    sj_compile_result r;
    double t0 = now_ms();
    assert_int_equal(a->compile(a, &req, &r), SJ_OK);
    double cold = now_ms() - t0;
    assert_false(r.from_cache);
    assert_int_equal(compiler_runs(cclog), 1);
    check_kernels(&r);
    a->unload(a, r.module); /* so that the hit below really loads the file */
    sj_cache_stats s;
    sj_cache_get_stats(cache, &s);
    assert_int_equal(s.stores, 1);

    /* A second backend (another process, in effect) with the same toolchain:
     * once it is created, take the compiler away. */
    sj_backend *b = make(f, cc, cache);
    assert_string_equal(a->identity(a), b->identity(b));
    assert_int_equal(unlink(cc), 0);
    sj_compile_result r2;
    t0 = now_ms();
    assert_int_equal(b->compile(b, &req, &r2), SJ_OK);
    double warm = now_ms() - t0;
    assert_true(r2.from_cache);
    assert_true(r2.compile_ms == 0);
    assert_string_equal(r.key, r2.key);
    assert_int_equal(compiler_runs(cclog), 1);
    check_kernels(&r2);
    assert_true(logged(f, "cpu: cached: cache hit"));
    print_message("compile (cold, %zu bytes of C): %.1f ms; cache hit load: %.2f ms\n", strlen(SRC), cold, warm);
    b->unload(b, r2.module);

    /* /nonexistent/cc is another toolchain identity: another key, a miss */
    sj_backend *c = make(f, "/nonexistent/cc", cache);
    assert_int_equal(c->compile(c, &req, &r2), SJ_EBACKEND);
    assert_non_null(strstr(r2.log, "not found"));
    c->destroy(c);
    a->destroy(a);
    b->destroy(b);
    sj_cache_close(cache);
}

static void test_cache_corrupt_recompiled(void **state) {
    fixture *f = *state;
    char cdir[PATH_MAX], so[PATH_MAX];
    snprintf(cdir, sizeof cdir, "%s/cache", f->dir);
    sj_cache *cache;
    assert_int_equal(sj_cache_open(cdir, 0, &cache), SJ_OK);
    sj_backend *b = make(f, NULL, cache);
    sj_compile_req req = req_of(SRC, "corrupt");
    sj_compile_result r;
    assert_int_equal(b->compile(b, &req, &r), SJ_OK);
    b->unload(b, r.module);
    /* flip a byte of the cached shared object */
    snprintf(so, sizeof so, "%s/%s.so", cdir, r.key);
    FILE *fp = fopen(so, "r+b");
    assert_non_null(fp);
    assert_int_equal(fseek(fp, 100, SEEK_SET), 0);
    int ch = fgetc(fp);
    assert_int_equal(fseek(fp, 100, SEEK_SET), 0);
    fputc(ch ^ 0xff, fp);
    assert_int_equal(fclose(fp), 0);
    assert_int_equal(b->compile(b, &req, &r), SJ_OK);
    assert_false(r.from_cache);
    check_kernels(&r);
    b->unload(b, r.module);
    sj_cache_stats s;
    sj_cache_get_stats(cache, &s);
    assert_int_equal(s.corrupt, 1);
    assert_int_equal(s.stores, 2);
    /* re-stored: the next compile hits */
    assert_int_equal(b->compile(b, &req, &r), SJ_OK);
    assert_true(r.from_cache);
    b->unload(b, r.module);
    /* an entry that verifies but does not load (not an ELF): a miss, recompiled */
    assert_int_equal(sj_cache_store(cache, r.key, "so", "not an ELF file", 15), SJ_OK);
    assert_int_equal(b->compile(b, &req, &r), SJ_OK);
    assert_false(r.from_cache);
    assert_true(logged(f, "cached artifact unusable"));
    check_kernels(&r);
    b->unload(b, r.module);
    assert_int_equal(b->compile(b, &req, &r), SJ_OK);
    assert_true(r.from_cache);
    b->unload(b, r.module);
    b->destroy(b);
    sj_cache_close(cache);
}

/* -- Hooks and dumps ------------------------------------------------------------- */

static void test_hooks(void **state) {
    fixture *f = *state;
    char cc[PATH_MAX], cclog[PATH_MAX];
    make_wrapper(f, cc, sizeof cc, cclog, sizeof cclog);
    sj_cpu_backend_config cfg = {.cc = cc, .rt = &f->rt, .test_fail = 1};
    sj_backend *b;
    assert_int_equal(sj_cpu_backend_create(&cfg, &b), SJ_OK);
    sj_compile_req req = req_of(SRC, "hooked");
    sj_compile_result r;
    assert_int_equal(b->compile(b, &req, &r), SJ_EBACKEND);
    assert_null(r.module);
    assert_string_equal(r.log, "compile failed (test hook)");
    assert_int_equal(compiler_runs(cclog), 0);
    b->destroy(b);

    cfg = (sj_cpu_backend_config){.rt = &f->rt, .test_delay_ms = 150};
    assert_int_equal(sj_cpu_backend_create(&cfg, &b), SJ_OK);
    double t0 = now_ms();
    assert_int_equal(b->compile(b, &req, &r), SJ_OK);
    assert_true(now_ms() - t0 >= 150);
    check_kernels(&r);
    b->unload(b, r.module);
    b->destroy(b);
}

static void test_dump_dir(void **state) {
    fixture *f = *state;
    char dump[PATH_MAX], path[PATH_MAX];
    snprintf(dump, sizeof dump, "%s/dumps/nested", f->dir);
    sj_cpu_backend_config cfg = {.rt = &f->rt, .dump_dir = dump};
    sj_backend *b;
    assert_int_equal(sj_cpu_backend_create(&cfg, &b), SJ_OK);
    sj_compile_req req = req_of(SRC, "enc.e1.sym");
    sj_compile_result r;
    assert_int_equal(b->compile(b, &req, &r), SJ_OK);
    b->unload(b, r.module);
    snprintf(path, sizeof path, "%s/enc.e1.sym.c", dump);
    FILE *fp = fopen(path, "r");
    assert_non_null(fp);
    char text[sizeof SRC + 16];
    size_t n = fread(text, 1, sizeof text, fp);
    fclose(fp);
    assert_int_equal(n, strlen(SRC));
    assert_memory_equal(text, SRC, n);
    /* a tag with a slash stays inside the dump dir */
    req.tag = "../escape";
    assert_int_equal(b->compile(b, &req, &r), SJ_OK);
    b->unload(b, r.module);
    snprintf(path, sizeof path, "%s/.._escape.c", dump);
    assert_int_equal(access(path, F_OK), 0);
    b->destroy(b);
    /* a dump dir that cannot be made: logged, the compile still works */
    snprintf(path, sizeof path, "%s/dumps/nested/enc.e1.sym.c/sub", f->dir);
    cfg.dump_dir = path;
    assert_int_equal(sj_cpu_backend_create(&cfg, &b), SJ_OK);
    assert_int_equal(b->compile(b, &req, &r), SJ_OK);
    assert_true(logged(f, "cannot dump"));
    b->unload(b, r.module);
    b->destroy(b);
}

/* -- Concurrency ------------------------------------------------------------------ */

typedef struct job {
    sj_backend *b;
    int id;
    sj_status st;
    int wrong;
} job;

static void *compile_thread(void *p) {
    job *j = p;
    char src[512], tag[32];
    snprintf(src, sizeof src,
             "void k0(float *y, const float *x, long n) { for (long i = 0; i < n; i++) y[i] = x[i] * %d.0f; }\n"
             "void k1(float *y, const float *x, long n) { for (long i = 0; i < n; i++) y[i] = x[i] + %d.0f; }\n",
             j->id + 2, j->id);
    snprintf(tag, sizeof tag, "thread%d", j->id);
    sj_compile_req req = req_of(src, tag);
    sj_compile_result r;
    j->st = j->b->compile(j->b, &req, &r);
    if (j->st) return NULL;
    float x[16], y[16];
    for (int i = 0; i < 16; i++) x[i] = (float)i;
    ((kernel)r.fns[0])(y, x, 16);
    for (int i = 0; i < 16; i++) j->wrong += y[i] != x[i] * (float)(j->id + 2);
    ((kernel)r.fns[1])(y, x, 16);
    for (int i = 0; i < 16; i++) j->wrong += y[i] != x[i] + (float)j->id;
    j->b->unload(j->b, r.module);
    return NULL;
}

static void test_concurrent_compiles(void **state) {
    fixture *f = *state;
    char cdir[PATH_MAX];
    snprintf(cdir, sizeof cdir, "%s/cache", f->dir);
    sj_cache *cache;
    assert_int_equal(sj_cache_open(cdir, 0, &cache), SJ_OK);
    sj_backend *b = make(f, NULL, cache);
    for (int round = 0; round < 2; round++) { /* compiled, then from the cache */
        enum { N = 4 };
        pthread_t th[N];
        job jobs[N];
        for (int i = 0; i < N; i++) {
            jobs[i] = (job){b, i, SJ_EINTERNAL, 0};
            assert_int_equal(pthread_create(&th[i], NULL, compile_thread, &jobs[i]), 0);
        }
        for (int i = 0; i < N; i++) {
            pthread_join(th[i], NULL);
            assert_int_equal(jobs[i].st, SJ_OK);
            assert_int_equal(jobs[i].wrong, 0);
        }
    }
    sj_cache_stats s;
    sj_cache_get_stats(cache, &s);
    assert_int_equal(s.stores, 4);
    assert_int_equal(s.hits, 4);
    b->destroy(b);
    sj_cache_close(cache);
}

/* -- Leaks ---------------------------------------------------------------------- */

static int count_entries(const char *dir, const char *prefix) {
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)))
        if (!strncmp(de->d_name, prefix, strlen(prefix))) n++;
    closedir(d);
    return n;
}

/* Every path (success, compile error, missing symbol, missing compiler,
 * cache hit, corrupt cache) leaves no fd, child or temporary behind. */
static void test_no_leaks(void **state) {
    fixture *f = *state;
    char cdir[PATH_MAX], tmp[PATH_MAX];
    snprintf(cdir, sizeof cdir, "%s/cache", f->dir);
    snprintf(tmp, sizeof tmp, "%s/tmp", f->dir);
    assert_int_equal(mkdir(tmp, 0700), 0);
    const char *old_tmp = getenv("TMPDIR");
    char *saved = old_tmp ? strdup(old_tmp) : NULL;
    setenv("TMPDIR", tmp, 1);
    sj_cache *cache;
    assert_int_equal(sj_cache_open(cdir, 0, &cache), SJ_OK);
    sj_backend *b = make(f, NULL, cache), *nocc = make(f, "/nonexistent/cc", NULL);
    int fds = count_entries("/proc/self/fd", "");
    const char *bad = "int k0(void) { return nope; }\n";
    const char *const syms[] = {"k0", "k_missing"};
    sj_compile_req reqs[] = {req_of(SRC, "ok"), {bad, strlen(bad), SYMS, 1, "err"}, {SRC, strlen(SRC), syms, 2, "sym"}};
    for (int rep = 0; rep < 3; rep++) {
        for (size_t i = 0; i < sizeof reqs / sizeof reqs[0]; i++) {
            sj_compile_result r;
            if (b->compile(b, &reqs[i], &r) == SJ_OK) b->unload(b, r.module);
            assert_int_equal(nocc->compile(nocc, &reqs[i], &r), SJ_EBACKEND);
        }
    }
    assert_int_equal(count_entries("/proc/self/fd", ""), fds);
    assert_int_equal(count_entries(tmp, ""), 2); /* . and .. */
    assert_int_equal(waitpid(-1, NULL, WNOHANG), -1);
    b->destroy(b);
    nocc->destroy(nocc);
    sj_cache_close(cache);
    if (saved) setenv("TMPDIR", saved, 1);
    else unsetenv("TMPDIR");
    free(saved);
}

int main(void) {
#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(test_compile_and_call),    T(test_compile_error),        T(test_missing_compiler),
        T(test_missing_symbol),      T(test_invalid_requests),     T(test_cache_second_backend),
        T(test_cache_corrupt_recompiled), T(test_hooks),           T(test_dump_dir),
        T(test_concurrent_compiles), T(test_no_leaks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
