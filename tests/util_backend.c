/* Checks shared by the backend tests (test_backend_cpu, test_cuda_dev);
 * see tests/util.h. */
/* cmocka.h needs these first, in this order */
/* clang-format off */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
/* clang-format on */

#include "tests/util.h"

#include "specialize/codegen.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

sj_cache *tu_open_cache(const char *dir, char *cdir) {
    char own[PATH_MAX];
    char *p = cdir ? cdir : own;
    snprintf(p, PATH_MAX, "%s/cache", dir);
    sj_cache *cache;
    assert_int_equal(sj_cache_open(p, 0, &cache), SJ_OK);
    return cache;
}

void *tu_compile_rt_unit(sj_backend *b, const char *tail, const char *symbol, const char *tag, sj_compile_result *r) {
    size_t n = strlen(sj_kernel_rt_text), k = strlen(tail);
    char *src = malloc(n + k + 1);
    assert_non_null(src);
    memcpy(src, sj_kernel_rt_text, n);
    memcpy(src + n, tail, k + 1);
    const char *names[] = {symbol};
    sj_compile_req req = {.source = src, .source_len = n + k, .symbols = names, .n_symbols = 1, .tag = tag};
    assert_int_equal(b->compile(b, &req, r), SJ_OK);
    free(src);
    return r->fns[0];
}

void tu_compile_fresh(sj_backend *b, const sj_compile_req *req, sj_compile_result *r) {
    assert_int_equal(b->compile(b, req, r), SJ_OK);
    assert_non_null(r->module);
    assert_false(r->from_cache);
    assert_true(r->compile_ms > 0);
    assert_int_equal(strlen(r->key), 64);
}

double tu_compile_timed(sj_backend *b, const sj_compile_req *req, sj_compile_result *r) {
    double t0 = tu_now_ms();
    assert_int_equal(b->compile(b, req, r), SJ_OK);
    return tu_now_ms() - t0;
}

double tu_compile_cached(sj_backend *b, const sj_compile_req *req, sj_compile_result *r, const char *key) {
    double ms = tu_compile_timed(b, req, r);
    assert_true(r->from_cache);
    assert_true(r->compile_ms == 0);
    assert_string_equal(key, r->key);
    return ms;
}

void tu_check_invalid_requests(sj_backend *b, sj_compile_req valid) {
    sj_compile_result r;
    assert_int_equal(b->compile(b, NULL, &r), SJ_EINVAL);
    sj_compile_req req = valid;
    req.n_symbols = SJ_COMPILE_SYMBOLS_MAX + 1; /* past the limit: refused before any symbol is read */
    assert_int_equal(b->compile(b, &req, &r), SJ_EINVAL);
    req = valid;
    req.source_len = valid.source_len + 1; /* includes the NUL */
    assert_int_equal(b->compile(b, &req, &r), SJ_EINVAL);
    assert_int_equal(b->compile(b, &req, NULL), SJ_EINVAL);
}

sj_compile_req tu_unterminated(sj_compile_req valid, char *buf) {
    memcpy(buf, valid.source, valid.source_len);
    memcpy(buf + valid.source_len, "garbage", 8);
    valid.source = buf;
    return valid;
}

void tu_check_second_compile(sj_backend *b, const sj_compile_req *req, const sj_compile_result *r,
                             tu_kernels_check check) {
    sj_compile_result r2;
    assert_int_equal(b->compile(b, req, &r2), SJ_OK);
    assert_string_equal(r->key, r2.key);
    /* the unit loaded already, shared: it stays loaded until both unload */
    assert_true(r2.shared);
    assert_true(r2.from_cache);
    assert_ptr_equal(r2.module, r->module);
    assert_memory_equal(r2.fns, r->fns, (size_t)req->n_symbols * sizeof r->fns[0]);
    b->unload(b, r->module);
    check(&r2);
    b->unload(b, r2.module);
    b->unload(b, NULL);
}

void tu_check_shared_touches_cache(sj_backend *b, const char *cdir, const sj_compile_req *req, const char *ext,
                                   tu_kernels_check check) {
    sj_compile_result r1, r2;
    assert_int_equal(b->compile(b, req, &r1), SJ_OK);
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s.%s", cdir, r1.key, ext);
    time_t hour_ago = time(NULL) - 3600;
    const struct timespec old[2] = {{hour_ago, 0}, {hour_ago, 0}};
    assert_int_equal(utimensat(AT_FDCWD, path, old, 0), 0);
    assert_int_equal(b->compile(b, req, &r2), SJ_OK);
    assert_true(r2.shared);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_true(st.st_mtime > hour_ago + 1800);
    b->unload(b, r1.module);
    check(&r2);
    b->unload(b, r2.module);
}

void tu_check_corrupt_cache(sj_backend *b, sj_cache *cache, const char *cdir, const sj_compile_req *req,
                            const char *ext, const void *junk, size_t junk_len, tu_logbook *log,
                            tu_kernels_check check, bool check_hit) {
    sj_compile_result r;
    char path[PATH_MAX];
    assert_int_equal(b->compile(b, req, &r), SJ_OK);
    b->unload(b, r.module);
    snprintf(path, sizeof path, "%s/%s.%s", cdir, r.key, ext);
    tu_flip_byte(path, 100);
    assert_int_equal(b->compile(b, req, &r), SJ_OK);
    assert_false(r.from_cache);
    check(&r);
    b->unload(b, r.module);
    sj_cache_stats s;
    sj_cache_get_stats(cache, &s);
    assert_int_equal(s.corrupt, 1);
    assert_int_equal(s.stores, 2);
    /* re-stored: the next compile hits */
    assert_int_equal(b->compile(b, req, &r), SJ_OK);
    assert_true(r.from_cache);
    b->unload(b, r.module);
    assert_int_equal(sj_cache_store(cache, r.key, ext, junk, junk_len), SJ_OK);
    assert_int_equal(b->compile(b, req, &r), SJ_OK);
    assert_false(r.from_cache);
    assert_true(tu_logged(log, "cached artifact unusable"));
    check(&r);
    b->unload(b, r.module);
    assert_int_equal(b->compile(b, req, &r), SJ_OK);
    assert_true(r.from_cache);
    if (check_hit) check(&r);
    b->unload(b, r.module);
}

void tu_check_hook_failure(sj_backend *b, const sj_compile_req *req, sj_compile_result *r) {
    assert_int_equal(b->compile(b, req, r), SJ_EBACKEND);
    assert_null(r->module);
    assert_string_equal(r->log, "compile failed (test hook)");
}

void tu_compile_delayed(sj_backend *b, const sj_compile_req *req, sj_compile_result *r, double ms) {
    double t0 = tu_now_ms();
    assert_int_equal(b->compile(b, req, r), SJ_OK);
    assert_true(tu_now_ms() - t0 >= ms);
}

void tu_check_concurrent_compiles(sj_backend *b, sj_cache *cache, void *(*fn)(void *), bool check_from_cache) {
    for (int round = 0; round < 2; round++) { /* compiled, then from the cache */
        enum { N = 4 };
        tu_compile_job jobs[N];
        for (int i = 0; i < N; i++) jobs[i] = (tu_compile_job){b, i, SJ_EINTERNAL, 0, false};
        tu_run_threads(N, fn, jobs, sizeof jobs[0]);
        for (int i = 0; i < N; i++) {
            assert_int_equal(jobs[i].st, SJ_OK);
            assert_int_equal(jobs[i].wrong, 0);
            if (check_from_cache) assert_int_equal(jobs[i].from_cache, round == 1);
        }
    }
    sj_cache_stats s;
    sj_cache_get_stats(cache, &s);
    assert_int_equal(s.stores, 4);
    assert_int_equal(s.hits, 4);
}
