/* Tests for kernels/cpu/backend_cpu: compile a unit with two kernels and
 * call them; a compile error (the compiler's message in the log); a missing
 * compiler (fails fast, "not found"); a missing symbol; invalid requests;
 * the persistent cache (a second backend loads without running the
 * compiler, a corrupt cached .so and an unloadable one are recompiled); the
 * test hooks; dump_dir; units shared by key (also when 4 threads compile
 * one at once); compiles from 4 threads at once; no fd, child or
 * temporary left behind on any path; and timings. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
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

#include "base/error.h"
#include "jit/runtime.h"
#include "kernels/cpu/backend_cpu.h"
#include "tests/util.h"

/* -- Helpers --------------------------------------------------------------- */

typedef tu_fixture fixture; /* its log: the backend's lines, kept for the checks */

static int setup(void **state) { return tu_fixture_setup(state, "sjcpu-test"); }
static int teardown(void **state) { return tu_fixture_teardown(state); }

static sj_backend *make(fixture *f, const char *cc, sj_cache *cache) {
    sj_cpu_backend_config cfg = {0};
    cfg.cc = cc;
    cfg.cache = cache;
    cfg.log = &f->rt.log;
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
    return (sj_compile_req){src, strlen(src), SYMS, 2, tag, NULL, 0, false, false};
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
    tu_compile_fresh(b, &req, &r);
    check_kernels(&r);
    assert_true(tu_logged(&f->log, "cpu: t.e0.static: compiled in"));
    /* the same request twice: same key, the loaded unit shared */
    tu_check_second_compile(b, &req, &r, check_kernels);
    print_message("identity: %s\ncompile_ms (cc, %zu bytes of C): %.1f\n", id, strlen(SRC), r.compile_ms);
    b->destroy(b);
}

/* The runtime header compiled as generated kernels are (-march=native:
 * 64-, 32- or 16-byte vectors by machine), its row max checked like the
 * tests' own build of it: the width-dependent code runs here. */
static void test_rt_max_native_width(void **state) {
    fixture *f = *state;
    sj_backend *b = make(f, NULL, NULL);
    sj_compile_result r;
    float (*k_max)(const float *, int64_t) = (float (*)(const float *, int64_t))tu_compile_rt_unit(
        b, "float k_max(const float *x, int64_t n) { return sj_rt_max_f32(x, n); }\n", "k_max", "rt_max", &r);
    tu_check_max_f32(k_max, "-march=native");
    b->unload(b, r.module);
    b->destroy(b);
}

static void test_compile_error(void **state) {
    fixture *f = *state;
    sj_backend *b = make(f, NULL, NULL);
    const char *bad = "void k0(float *y) { y[0] = undeclared_thing; }\n";
    sj_compile_req req = {bad, strlen(bad), SYMS, 1, "broken", NULL, 0, false, false};
    sj_compile_result r;
    assert_int_equal(b->compile(b, &req, &r), SJ_EBACKEND);
    assert_null(r.module);
    assert_non_null(strstr(r.log, "undeclared_thing"));
    assert_non_null(strstr(sj_last_error(), "compile failed"));
    assert_non_null(strstr(sj_last_error(), "undeclared_thing")); /* the error line, not "In function" */
    assert_true(tu_logged(&f->log, "cpu: broken: compile failed"));
    b->destroy(b);
}

static void test_missing_compiler(void **state) {
    fixture *f = *state;
    sj_backend *b = make(f, "/nonexistent/cc", NULL);
    assert_true(tu_logged(&f->log, "compiler '/nonexistent/cc' not found"));
    assert_non_null(strstr(b->identity(b), "not found"));
    sj_compile_req req = req_of(SRC, "nocc");
    sj_compile_result r;
    for (int i = 0; i < 3; i++) { /* every compile fails, fast, without retrying */
        double t0 = tu_now_ms();
        assert_int_equal(b->compile(b, &req, &r), SJ_EBACKEND);
        assert_true(tu_now_ms() - t0 < 50);
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
    sj_compile_req req = {SRC, strlen(SRC), syms, 2, "nosym", NULL, 0, false, false};
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
    tu_check_invalid_requests(b, req_of(SRC, "x"));
    sj_cpu_backend_config cfg = {.test_delay_ms = -1};
    sj_backend *nb = (sj_backend *)1;
    assert_int_equal(sj_cpu_backend_create(&cfg, &nb), SJ_EINVAL);
    assert_null(nb);
    assert_int_equal(sj_cpu_backend_create(NULL, NULL), SJ_EINVAL);
    /* a source without a NUL at source_len is fine (only the length counts) */
    char buf[sizeof SRC + 8];
    sj_compile_req req = tu_unterminated(req_of(SRC, "unterminated"), buf);
    sj_compile_result r;
    assert_int_equal(b->compile(b, &req, &r), SJ_OK);
    check_kernels(&r);
    b->unload(b, r.module);
    b->destroy(b);
}

/* -- Persistent cache ----------------------------------------------------------- */

static void test_cache_second_backend(void **state) {
    fixture *f = *state;
    char cc[PATH_MAX], cclog[PATH_MAX];
    make_wrapper(f, cc, sizeof cc, cclog, sizeof cclog);
    char cdir[PATH_MAX];
    sj_cache *cache = tu_open_cache(f->dir, cdir);

    sj_backend *a = make(f, cc, cache);
    sj_compile_req req = req_of(SRC, "cached");
    sj_compile_result r;
    double cold = tu_compile_timed(a, &req, &r);
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
    double warm = tu_compile_cached(b, &req, &r2, r.key);
    assert_int_equal(compiler_runs(cclog), 1);
    check_kernels(&r2);
    assert_true(tu_logged(&f->log, "cpu: cached: cache hit"));
    print_message("compile (cold, %zu bytes of C): %.1f ms; cache hit load: %.2f ms\n", strlen(SRC), cold, warm);
    b->unload(b, r2.module);
    /* used from memory (shared) still counts as used for the LRU order */
    tu_check_shared_touches_cache(b, cdir, &req, "so", check_kernels);

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
    char cdir[PATH_MAX];
    sj_cache *cache = tu_open_cache(f->dir, cdir);
    sj_backend *b = make(f, NULL, cache);
    sj_compile_req req = req_of(SRC, "corrupt");
    /* a byte of the cached shared object flipped; then an entry that
     * verifies but does not load (not an ELF) */
    tu_check_corrupt_cache(b, cache, cdir, &req, "so", "not an ELF file", 15, &f->log, check_kernels, false);
    b->destroy(b);
    sj_cache_close(cache);
}

/* The attack of issue 25: someone who can write the cache directory plants
 * a valid shared object that also holds the real kernels, with a matching
 * meta, under the key of a unit the runtime will load. In a keyed cache the
 * forger lacks the key: the entry is refused, its constructor never runs,
 * the unit is compiled anew and the kernels are right. */
static void test_planted_shared_object_refused(void **state) {
    fixture *f = *state;
    char cdir[PATH_MAX], marker[PATH_MAX], evil_c[PATH_MAX], evil_so[PATH_MAX];
    snprintf(cdir, sizeof cdir, "%s/cache", f->dir);
    sj_cache *keyed, *forger;
    assert_int_equal(sj_cache_open_keyed(cdir, 0, "the operator's secret", NULL, &keyed), SJ_OK);
    assert_int_equal(sj_cache_open(cdir, 0, &forger), SJ_OK); /* writes the dir, lacks the key */
    sj_backend *b = make(f, NULL, keyed);
    sj_compile_req req = req_of(SRC, "planted");
    sj_compile_result r;
    assert_int_equal(b->compile(b, &req, &r), SJ_OK);
    char key[65];
    memcpy(key, r.key, sizeof key);
    b->unload(b, r.module);
    b->destroy(b);

    /* the forged unit: the real kernels plus a constructor that leaves a mark */
    snprintf(marker, sizeof marker, "%s/constructor-ran", f->dir);
    snprintf(evil_c, sizeof evil_c, "%s/evil.c", f->dir);
    snprintf(evil_so, sizeof evil_so, "%s/evil.so", f->dir);
    FILE *fp = fopen(evil_c, "w");
    assert_non_null(fp);
    fprintf(fp, "%s\n#include <stdio.h>\n__attribute__((constructor)) static void planted(void) {\n"
                "    FILE *m = fopen(\"%s\", \"w\"); if (m) fclose(m);\n}\n", SRC, marker);
    assert_int_equal(fclose(fp), 0);
    char cmd[3 * PATH_MAX];
    snprintf(cmd, sizeof cmd, "cc -O1 -fPIC -shared -o '%s' '%s' -lm", evil_so, evil_c);
    assert_int_equal(system(cmd), 0);
    assert_int_equal(sj_cache_store_file(forger, key, "so", evil_so), SJ_OK);

    sj_backend *b2 = make(f, NULL, keyed);
    assert_int_equal(b2->compile(b2, &req, &r), SJ_OK);
    assert_false(r.from_cache); /* refused, compiled anew */
    check_kernels(&r);
    assert_int_equal(access(marker, F_OK), -1); /* the planted constructor never ran */
    sj_cache_stats st;
    sj_cache_get_stats(keyed, &st);
    assert_int_equal(st.corrupt, 1);
    b2->unload(b2, r.module);
    b2->destroy(b2);
    sj_cache_close(forger);
    sj_cache_close(keyed);
}

/* A unit loaded from the cache is loaded from the bytes that were verified:
 * replacing the artifact after a store changes nothing a later load sees
 * unless the digest matches. */
static void test_cache_hit_loads_verified_bytes(void **state) {
    fixture *f = *state;
    char cdir[PATH_MAX];
    sj_cache *cache = tu_open_cache(f->dir, cdir);
    sj_backend *b = make(f, NULL, cache);
    sj_compile_req req = req_of(SRC, "verified");
    sj_compile_result r;
    assert_int_equal(b->compile(b, &req, &r), SJ_OK);
    b->unload(b, r.module);
    b->destroy(b);
    sj_backend *b2 = make(f, NULL, cache);
    assert_int_equal(b2->compile(b2, &req, &r), SJ_OK);
    assert_true(r.from_cache);
    check_kernels(&r);
    b2->unload(b2, r.module);
    b2->destroy(b2);
    sj_cache_close(cache);
}

/* Two different units loaded from the cache one after the other are two
 * units: dlopen returns an object already loaded under the same name, so
 * the loader must never reuse a name (a memfd's /proc/self/fd/N did, once
 * N was reused, and the second unit's kernels were the first's). */
static void test_cache_hits_of_two_units(void **state) {
    fixture *f = *state;
    char cdir[PATH_MAX];
    sj_cache *cache = tu_open_cache(f->dir, cdir);
    static const char SRC2[] = "#include <math.h>\n"
                               "void k0(float *y, const float *x, long n) {\n"
                               "    for (long i = 0; i < n; i++) y[i] = 3.0f * x[i] - 1.0f;\n"
                               "}\n"
                               "void k1(float *y, const float *x, long n) {\n"
                               "    for (long i = 0; i < n; i++) y[i] = -x[i];\n"
                               "}\n";
    sj_backend *a = make(f, NULL, cache);
    sj_compile_req r1 = req_of(SRC, "unit1"), r2 = req_of(SRC2, "unit2");
    sj_compile_result x, y;
    assert_int_equal(a->compile(a, &r1, &x), SJ_OK);
    assert_int_equal(a->compile(a, &r2, &y), SJ_OK);
    a->unload(a, x.module);
    a->unload(a, y.module);
    a->destroy(a);
    for (int round = 0; round < 3; round++) {
        sj_backend *b = make(f, NULL, cache);
        assert_int_equal(b->compile(b, &r1, &x), SJ_OK);
        assert_int_equal(b->compile(b, &r2, &y), SJ_OK);
        assert_true(x.from_cache && y.from_cache);
        check_kernels(&x);
        float in[4] = {1, 2, -3, 0.5f}, out[4];
        ((kernel)y.fns[0])(out, in, 4);
        for (int i = 0; i < 4; i++) assert_float_equal(out[i], 3.0f * in[i] - 1.0f, 1e-6);
        b->unload(b, x.module);
        b->unload(b, y.module);
        b->destroy(b);
    }
    sj_cache_close(cache);
}

/* -- Hooks and dumps ------------------------------------------------------------- */

static void test_hooks(void **state) {
    fixture *f = *state;
    char cc[PATH_MAX], cclog[PATH_MAX];
    make_wrapper(f, cc, sizeof cc, cclog, sizeof cclog);
    sj_cpu_backend_config cfg = {.cc = cc, .log = &f->rt.log, .test_fail = 1};
    sj_backend *b;
    assert_int_equal(sj_cpu_backend_create(&cfg, &b), SJ_OK);
    sj_compile_req req = req_of(SRC, "hooked");
    sj_compile_result r;
    tu_check_hook_failure(b, &req, &r);
    assert_int_equal(compiler_runs(cclog), 0);
    b->destroy(b);

    cfg = (sj_cpu_backend_config){.log = &f->rt.log, .test_delay_ms = 150};
    assert_int_equal(sj_cpu_backend_create(&cfg, &b), SJ_OK);
    tu_compile_delayed(b, &req, &r, 150);
    check_kernels(&r);
    b->unload(b, r.module);
    b->destroy(b);
}

static void test_dump_dir(void **state) {
    fixture *f = *state;
    char dump[PATH_MAX], path[PATH_MAX];
    snprintf(dump, sizeof dump, "%s/dumps/nested", f->dir);
    sj_cpu_backend_config cfg = {.log = &f->rt.log, .dump_dir = dump};
    sj_backend *b;
    assert_int_equal(sj_cpu_backend_create(&cfg, &b), SJ_OK);
    sj_compile_req req = req_of(SRC, "enc.e1.sym");
    sj_compile_result r;
    assert_int_equal(b->compile(b, &req, &r), SJ_OK);
    b->unload(b, r.module);
    snprintf(path, sizeof path, "%s/enc.e1.sym.c", dump);
    tu_expect_file(path, SRC, strlen(SRC));
    /* a tag with a slash stays inside the dump dir */
    req.tag = "../escape";
    assert_int_equal(b->compile(b, &req, &r), SJ_OK);
    b->unload(b, r.module);
    snprintf(path, sizeof path, "%s/_._escape.c", dump);
    assert_int_equal(access(path, F_OK), 0);
    /* a name with a newline stays one file name without it */
    req.tag = "two\nlines";
    assert_int_equal(b->compile(b, &req, &r), SJ_OK);
    b->unload(b, r.module);
    snprintf(path, sizeof path, "%s/two_lines.c", dump);
    assert_int_equal(access(path, F_OK), 0);
    /* a planted symlink where a dump goes: replaced, its target untouched */
    char victim[PATH_MAX];
    snprintf(victim, sizeof victim, "%s/victim", f->dir);
    FILE *vf = fopen(victim, "w");
    assert_non_null(vf);
    fputs("precious", vf);
    fclose(vf);
    snprintf(path, sizeof path, "%s/enc.e1.sym.c", dump);
    assert_int_equal(unlink(path), 0);
    assert_int_equal(symlink(victim, path), 0);
    req.tag = "enc.e1.sym";
    assert_int_equal(b->compile(b, &req, &r), SJ_OK);
    b->unload(b, r.module);
    tu_expect_file(victim, "precious", 8);
    tu_expect_file(path, SRC, strlen(SRC));
    struct stat lst;
    assert_int_equal(lstat(path, &lst), 0);
    assert_true(S_ISREG(lst.st_mode));
    b->destroy(b);
    /* a dump dir writable by others: refused (logged), the compile works */
    char open_dir[PATH_MAX];
    snprintf(open_dir, sizeof open_dir, "%s/opendump", f->dir);
    assert_int_equal(mkdir(open_dir, 0777), 0);
    assert_int_equal(chmod(open_dir, 0777), 0);
    cfg.dump_dir = open_dir;
    assert_int_equal(sj_cpu_backend_create(&cfg, &b), SJ_OK);
    assert_int_equal(b->compile(b, &req, &r), SJ_OK);
    b->unload(b, r.module);
    assert_true(tu_logged(&f->log, "writable by group or others"));
    b->destroy(b);
    /* a dump dir that cannot be made: logged, the compile still works */
    snprintf(path, sizeof path, "%s/dumps/nested/enc.e1.sym.c/sub", f->dir);
    cfg.dump_dir = path;
    assert_int_equal(sj_cpu_backend_create(&cfg, &b), SJ_OK);
    assert_int_equal(b->compile(b, &req, &r), SJ_OK);
    assert_true(tu_logged(&f->log, "cannot dump"));
    b->unload(b, r.module);
    b->destroy(b);
}

/* -- Shared units ------------------------------------------------------------------ */

/* A unit whose key is loaded already is shared, not compiled again; a
 * request for a symbol it lacks fails without harming it; it is unloaded
 * with its last user, and the next compile runs the compiler again. */
static void test_shared_units(void **state) {
    fixture *f = *state;
    char cc[PATH_MAX], cclog[PATH_MAX];
    make_wrapper(f, cc, sizeof cc, cclog, sizeof cclog);
    sj_backend *b = make(f, cc, NULL); /* no persistent cache */
    sj_compile_req req = req_of(SRC, "first");
    sj_compile_result ra, rb, rc;
    tu_compile_fresh(b, &req, &ra);
    req.tag = "second";
    assert_int_equal(b->compile(b, &req, &rb), SJ_OK);
    assert_int_equal(compiler_runs(cclog), 1);
    assert_true(rb.shared && rb.from_cache);
    assert_true(rb.compile_ms == 0);
    assert_ptr_equal(rb.module, ra.module);
    assert_true(tu_logged(&f->log, "cpu: second: shares the unit loaded already"));

    const char *const syms[] = {"k1", "k_missing"};
    sj_compile_req bad = {SRC, strlen(SRC), syms, 2, "third", NULL, 0, false, false};
    assert_int_equal(b->compile(b, &bad, &rc), SJ_EBACKEND);
    assert_null(rc.module);
    assert_non_null(strstr(rc.log, "k_missing"));
    assert_int_equal(compiler_runs(cclog), 1);

    b->unload(b, ra.module);
    check_kernels(&rb); /* still loaded: rb holds it */
    b->unload(b, rb.module);
    req.tag = "again";
    tu_compile_fresh(b, &req, &rc); /* the last user unloaded it: compiled anew */
    assert_false(rc.shared);
    assert_int_equal(compiler_runs(cclog), 2);
    check_kernels(&rc);
    b->unload(b, rc.module);
    b->destroy(b);
}

typedef struct same_job {
    sj_backend *b;
    pthread_barrier_t *all_compiled;
    sj_status st;
    sj_compile_result r;
} same_job;

static void *compile_same(void *p) {
    same_job *j = p;
    sj_compile_req req = req_of(SRC, "same");
    j->st = j->b->compile(j->b, &req, &j->r);
    pthread_barrier_wait(j->all_compiled); /* nobody unloads before all have compiled */
    return NULL;
}

/* Four threads compile one unit at once: the compiler runs once, the others
 * wait for it and share its module. */
static void test_shared_concurrent(void **state) {
    fixture *f = *state;
    char cc[PATH_MAX], cclog[PATH_MAX];
    make_wrapper(f, cc, sizeof cc, cclog, sizeof cclog);
    sj_backend *b = make(f, cc, NULL);
    enum { N = 4 };
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, N);
    same_job jobs[N];
    pthread_t th[N];
    for (int i = 0; i < N; i++) {
        jobs[i] = (same_job){.b = b, .all_compiled = &bar, .st = SJ_EINTERNAL};
        assert_int_equal(pthread_create(&th[i], NULL, compile_same, &jobs[i]), 0);
    }
    int shared = 0;
    for (int i = 0; i < N; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(jobs[i].st, SJ_OK);
        assert_ptr_equal(jobs[i].r.module, jobs[0].r.module);
        shared += jobs[i].r.shared;
        check_kernels(&jobs[i].r);
    }
    pthread_barrier_destroy(&bar);
    assert_int_equal(compiler_runs(cclog), 1);
    assert_int_equal(shared, N - 1);
    for (int i = 0; i < N; i++) b->unload(b, jobs[i].r.module);
    b->destroy(b);
}

/* -- Concurrency ------------------------------------------------------------------ */

static void *compile_thread(void *p) {
    tu_compile_job *j = p;
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
    sj_cache *cache = tu_open_cache(f->dir, NULL);
    sj_backend *b = make(f, NULL, cache);
    tu_check_concurrent_compiles(b, cache, compile_thread, false);
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
    char tmp[PATH_MAX];
    snprintf(tmp, sizeof tmp, "%s/tmp", f->dir);
    assert_int_equal(mkdir(tmp, 0700), 0);
    const char *old_tmp = getenv("TMPDIR");
    char *saved = old_tmp ? strdup(old_tmp) : NULL;
    setenv("TMPDIR", tmp, 1);
    sj_cache *cache = tu_open_cache(f->dir, NULL);
    sj_backend *b = make(f, NULL, cache), *nocc = make(f, "/nonexistent/cc", NULL);
    int fds = count_entries("/proc/self/fd", "");
    const char *bad = "int k0(void) { return nope; }\n";
    const char *const syms[] = {"k0", "k_missing"};
    sj_compile_req reqs[] = {req_of(SRC, "ok"), {bad, strlen(bad), SYMS, 1, "err", NULL, 0, false, false}, {SRC, strlen(SRC), syms, 2, "sym", NULL, 0, false, false}};
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
        T(test_compile_and_call),    T(test_rt_max_native_width), T(test_compile_error),        T(test_missing_compiler),
        T(test_missing_symbol),      T(test_invalid_requests),     T(test_cache_second_backend),
        T(test_cache_corrupt_recompiled), T(test_hooks),           T(test_dump_dir),
        T(test_planted_shared_object_refused), T(test_cache_hit_loads_verified_bytes),
        T(test_cache_hits_of_two_units),
        T(test_shared_units),        T(test_shared_concurrent),
        T(test_concurrent_compiles), T(test_no_leaks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
