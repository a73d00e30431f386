/* The validated swap (issue 30): compiled kernels are checked against eager
 * execution on their first calls (validate_calls), then 1 in
 * validate_every, before they serve alone. A test hook makes every
 * compiled kernel wrong (sj_runtime_test_wrong_kernels: a skew added to
 * each stored float): no caller ever gets a wrong result, the unit is
 * rejected once, logged once, counted, explained and quarantined in the
 * kernel cache. With right kernels, validation costs exactly its calls and
 * the kernels then serve alone. Inputs are random; results are checked
 * against a float64 reference computed here. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jit/runtime.h"
#include "jit/shapejit.h"
#include "tests/util.h"

#define MAXN 4096

static char cache_dir[256];
static atomic_int warn_lines, reject_lines;

static void log_count(void *user, unsigned topic, const char *msg) {
    (void)user;
    if (topic == SJ_LOG_WARN) atomic_fetch_add(&warn_lines, 1);
    if (strstr(msg, "rejected")) atomic_fetch_add(&reject_lines, 1);
}

/* y = softmax(gelu(x) * 2 + 1) over rows of x [R, C]: a fused row kernel. */
static sj_status m_rows(sj_tracer *t, const sj_val *in, int n, void *u) {
    (void)n, (void)u;
    sj_val y = sj_add(t, sj_mul(t, sj_gelu(t, in[0]), sj_scalar(t, 2.0)), sj_scalar(t, 1.0));
    return sj_output(t, sj_softmax(t, y, -1));
}

static void reference(const float *x, int64_t R, int64_t C, double *y) {
    for (int64_t r = 0; r < R; r++) {
        double mx = -INFINITY;
        for (int64_t c = 0; c < C; c++) {
            double v = x[r * C + c];
            double g = 0.5 * v * (1.0 + erf(v / sqrt(2.0)));
            y[r * C + c] = g * 2 + 1;
            if (y[r * C + c] > mx) mx = y[r * C + c];
        }
        double sum = 0;
        for (int64_t c = 0; c < C; c++) sum += y[r * C + c] = exp(y[r * C + c] - mx);
        for (int64_t c = 0; c < C; c++) y[r * C + c] /= sum;
    }
}

static sj_runtime *runtime(int validate_calls, int validate_every, float skew) {
    sj_runtime_config cfg;
    sj_runtime_config_init(&cfg);
    cfg.backend = SJ_BACKEND_CPU;
    cfg.compile_mode = SJ_COMPILE_SYNC;
    cfg.cache_dir = cache_dir;
    cfg.exec_threads = 1;
    cfg.hot_threshold = 1;
    cfg.log_fn = log_count;
    cfg.log_mask = SJ_LOG_ALL;
    cfg.validate_calls = validate_calls;
    cfg.validate_every = validate_every;
    sj_runtime *rt = NULL;
    assert_int_equal(sj_runtime_create(&cfg, &rt), SJ_OK);
    sj_runtime_test_wrong_kernels(rt, skew);
    return rt;
}

/* A function `name` of m_rows on rt, with the given dynamic policy. */
static sj_fn *rows_fn(sj_runtime *rt, const char *name, sj_dynamic dynamic) {
    sj_fn_options o;
    sj_fn_options_init(&o);
    o.dynamic = dynamic;
    sj_fn *fn = NULL;
    assert_int_equal(sj_fn_create(rt, name, 1, m_rows, NULL, &o, &fn), SJ_OK);
    return fn;
}

/* One call on random [R, C] input, checked against the float64 reference.
 * Returns 1 if it was served fused, 0 if eagerly. */
static int call_checked(sj_fn *fn, int64_t R, int64_t C) {
    static float x[MAXN], y[MAXN];
    static double ref[MAXN];
    for (int64_t i = 0; i < R * C; i++) x[i] = (float)((rand() % 4001) - 2000) / 1000.0f, y[i] = NAN;
    sj_tensor in = sj_tensor_make(x, SJ_F32, 2, (int64_t[]){R, C});
    sj_tensor out = sj_tensor_make(y, SJ_F32, 2, (int64_t[]){R, C});
    sj_stats a, b;
    sj_fn_stats(fn, &a);
    assert_int_equal(sj_call(fn, &in, 1, &out, 1), SJ_OK);
    reference(x, R, C, ref);
    for (int64_t i = 0; i < R * C; i++) assert_true(fabs((double)y[i] - ref[i]) < 1e-5);
    sj_fn_stats(fn, &b);
    return b.eager_calls == a.eager_calls;
}

static int count_rejected_files(void) {
    DIR *d = opendir(cache_dir);
    assert_non_null(d);
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)))
        if (strstr(de->d_name, "-rejected")) n++;
    closedir(d);
    return n;
}

static int setup(void **state) {
    (void)state;
    const char *tmp = getenv("TMPDIR");
    snprintf(cache_dir, sizeof cache_dir, "%s/sj-validate-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    assert_non_null(mkdtemp(cache_dir));
    atomic_store(&warn_lines, 0);
    atomic_store(&reject_lines, 0);
    srand(11);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", cache_dir);
    if (system(cmd)) {
    }
    return 0;
}

/* -- Wrong kernels never reach a caller ----------------------------------------- */

static void wrong_kernels_are_rejected(void **state) {
    (void)state;
    sj_runtime *rt = runtime(2, 0, 0.25f);
    sj_fn *fn = rows_fn(rt, "skewed", SJ_DYNAMIC_STATIC);
    for (int i = 0; i < 20; i++) assert_int_equal(call_checked(fn, 7, 33), 0); /* every result right, all eager */
    sj_stats s;
    sj_fn_stats(fn, &s);
    assert_int_equal(s.compiles, 1);
    assert_int_equal(s.validations, 1); /* the first check found it: never used again */
    assert_int_equal(s.validation_failures, 1);
    assert_int_equal(s.fused_specialized_calls + s.fused_symbolic_calls, 0);
    sj_entry_info info;
    sj_fn_entries(fn, &info, 1);
    assert_string_equal(info.tier, "rejected by validation");
    char *text = tu_explain(fn);
    assert_non_null(strstr(text, "rejected by validation (results differ from eager): output 0: largest error"));
    assert_non_null(strstr(text, "1 units rejected"));
    free(text);
    assert_int_equal(atomic_load(&reject_lines), 1); /* logged once */
    assert_int_equal(count_rejected_files(), 1);     /* quarantined */
    /* a new shape: a new entry, a new (wrong) unit, rejected too; the
     * function's warning is not repeated */
    for (int i = 0; i < 5; i++) assert_int_equal(call_checked(fn, 3, 65), 0);
    sj_fn_stats(fn, &s);
    assert_int_equal(s.validation_failures, 2);
    assert_int_equal(atomic_load(&reject_lines), 1);
    assert_int_equal(count_rejected_files(), 2);
    sj_runtime_destroy(rt);

    /* the quarantined artifact is not loaded by the next runtime: with right
     * kernels it compiles anew (no cache hit) and validates */
    rt = runtime(2, 0, 0);
    fn = rows_fn(rt, "skewed", SJ_DYNAMIC_STATIC);
    for (int i = 0; i < 4; i++) call_checked(fn, 7, 33);
    sj_fn_stats(fn, &s);
    assert_int_equal(s.validation_failures, 0);
    assert_int_equal(s.validations, 2);
    sj_runtime_destroy(rt);
}

/* Without validation the same wrong kernels would be served: the hook
 * really makes them wrong (so the test above proves something). */
static void wrong_kernels_without_validation_are_wrong(void **state) {
    (void)state;
    sj_runtime *rt = runtime(0, 0, 0.25f);
    sj_fn *fn = NULL;
    assert_int_equal(sj_fn_create(rt, "unchecked", 1, m_rows, NULL, NULL, &fn), SJ_OK);
    float x[4 * 8], y[4 * 8];
    for (int i = 0; i < 32; i++) x[i] = (float)i / 10.0f;
    sj_tensor in = sj_tensor_make(x, SJ_F32, 2, (int64_t[]){4, 8});
    sj_tensor out = sj_tensor_make(y, SJ_F32, 2, (int64_t[]){4, 8});
    assert_int_equal(sj_call(fn, &in, 1, &out, 1), SJ_OK); /* compiled (sync), served fused */
    double ref[32];
    reference(x, 4, 8, ref);
    double worst = 0;
    for (int i = 0; i < 32; i++) worst = fmax(worst, fabs((double)y[i] - ref[i]));
    assert_true(worst > 0.2);
    sj_runtime_destroy(rt);
}

/* -- Right kernels: validation costs its calls, then they serve alone ------------------ */

static void right_kernels_validate_then_serve(void **state) {
    (void)state;
    sj_runtime *rt = runtime(3, 0, 0);
    sj_fn *fn = rows_fn(rt, "right", SJ_DYNAMIC_STATIC);
    for (int i = 0; i < 3; i++) assert_int_equal(call_checked(fn, 5, 40), 0);
    for (int i = 0; i < 10; i++) assert_int_equal(call_checked(fn, 5, 40), 1);
    sj_stats s;
    sj_fn_stats(fn, &s);
    assert_int_equal(s.validations, 3);
    assert_int_equal(s.validation_failures, 0);
    assert_int_equal(s.fused_specialized_calls, 10);
    assert_int_equal(atomic_load(&warn_lines), 0);
    sj_runtime_destroy(rt);
}

/* validate_every: after validation, 1 call in K (one thread: exactly the
 * calls whose count is a multiple of K). */
static void sampled_checks(void **state) {
    (void)state;
    sj_runtime *rt = runtime(1, 4, 0);
    sj_fn *fn = rows_fn(rt, "sampled", SJ_DYNAMIC_STATIC);
    int fused = 0;
    for (int i = 0; i < 17; i++) fused += call_checked(fn, 2, 16);
    sj_stats s;
    sj_fn_stats(fn, &s);
    /* call 1 validates the new unit; calls 4, 8, 12, 16 are sampled */
    assert_int_equal(s.validations, 5);
    assert_int_equal(fused, 12);
    sj_runtime_destroy(rt);
}

/* A symbolic entry's kernels checked from many threads at once: each
 * result right, one rejection. */
typedef struct worker {
    sj_fn *fn;
    int id;
} worker;

static void *churn(void *p) {
    worker *w = p;
    float x[4 * 64], y[4 * 64];
    for (int i = 0; i < 40; i++) {
        int64_t C = 8 + (w->id * 7 + i) % 50;
        for (int k = 0; k < 4 * C; k++) x[k] = (float)((k * 37 + i * 11 + w->id) % 200 - 100) / 50.0f;
        sj_tensor in = sj_tensor_make(x, SJ_F32, 2, (int64_t[]){4, C});
        sj_tensor out = sj_tensor_make(y, SJ_F32, 2, (int64_t[]){4, C});
        if (sj_call(w->fn, &in, 1, &out, 1) != SJ_OK) return (void *)1;
        double ref[4 * 64];
        reference(x, 4, C, ref);
        for (int k = 0; k < 4 * C; k++)
            if (fabs((double)y[k] - ref[k]) > 1e-5) return (void *)1;
    }
    return NULL;
}

static void threads_never_see_a_wrong_result(void **state) {
    (void)state;
    sj_runtime *rt = runtime(2, 3, 0.5f);
    sj_fn *fn = rows_fn(rt, "threads", SJ_DYNAMIC_SYMBOLIC);
    enum { T = 4 };
    pthread_t th[T];
    worker w[T];
    for (int i = 0; i < T; i++) {
        w[i] = (worker){fn, i};
        assert_int_equal(pthread_create(&th[i], NULL, churn, &w[i]), 0);
    }
    for (int i = 0; i < T; i++) {
        void *r;
        pthread_join(th[i], &r);
        assert_null(r);
    }
    sj_stats s;
    sj_fn_stats(fn, &s);
    assert_true(s.validation_failures >= 1);
    assert_int_equal(s.fused_specialized_calls + s.fused_symbolic_calls, 0);
    assert_int_equal(atomic_load(&reject_lines), 1);
    sj_runtime_destroy(rt);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(wrong_kernels_are_rejected, setup, teardown),
        cmocka_unit_test_setup_teardown(wrong_kernels_without_validation_are_wrong, setup, teardown),
        cmocka_unit_test_setup_teardown(right_kernels_validate_then_serve, setup, teardown),
        cmocka_unit_test_setup_teardown(sampled_checks, setup, teardown),
        cmocka_unit_test_setup_teardown(threads_never_see_a_wrong_result, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
