/* One runtime per GPU (issue 31): two runtimes on devices 0 and 1 in one
 * process, sharing one kernel cache. Results on both devices match a
 * float64 reference on random inputs; the second device compiles nothing
 * (every unit comes from the cache the first filled: the cache is keyed by
 * architecture, not by device); both serve concurrently from their own
 * threads. With fewer than 2 devices it prints "skipped: ..." and passes. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jit/shapejit.h"

#define MAXN (64 * 512)

static char cache_dir[64];

static sj_status m_rows(sj_tracer *t, const sj_val *in, int n, void *u) {
    (void)n, (void)u;
    sj_val y = sj_add(t, sj_mul(t, sj_gelu(t, in[0]), sj_scalar(t, 2.0)), sj_scalar(t, 1.0));
    return sj_output(t, sj_softmax(t, y, -1));
}

static void reference(const float *x, int64_t R, int64_t C, double *y) {
    for (int64_t r = 0; r < R; r++) {
        double mx = -INFINITY, sum = 0;
        for (int64_t c = 0; c < C; c++) {
            double v = x[r * C + c];
            y[r * C + c] = 0.5 * v * (1.0 + erf(v / sqrt(2.0))) * 2 + 1;
            mx = fmax(mx, y[r * C + c]);
        }
        for (int64_t c = 0; c < C; c++) sum += y[r * C + c] = exp(y[r * C + c] - mx);
        for (int64_t c = 0; c < C; c++) y[r * C + c] /= sum;
    }
}

static sj_runtime *gpu(int device) {
    sj_runtime_config cfg;
    sj_runtime_config_init(&cfg);
    cfg.backend = SJ_BACKEND_CUDA;
    cfg.cuda_device = device;
    cfg.compile_mode = SJ_COMPILE_SYNC;
    cfg.cache_dir = cache_dir;
    cfg.log_mask = 0;
    sj_runtime *rt = NULL;
    return sj_runtime_create(&cfg, &rt) ? NULL : rt;
}

/* One call on [R, C] random floats (seeded), checked; 0 when right. */
static int call_checked(sj_runtime *rt, sj_fn *fn, int64_t R, int64_t C, unsigned seed) {
    float *x = malloc(MAXN * sizeof(float)), *y = malloc(MAXN * sizeof(float));
    double *ref = malloc(MAXN * sizeof(double));
    for (int64_t i = 0; i < R * C; i++) x[i] = (float)((int)((seed = seed * 1103515245u + 12345u) >> 16) % 4001 - 2000) / 1000.0f;
    int bad = 0;
    sj_tensor hx = sj_tensor_make(x, SJ_F32, 2, (int64_t[]){R, C}), hy = sj_tensor_make(y, SJ_F32, 2, (int64_t[]){R, C});
    sj_tensor dx = hx, dy;
    dx.device = SJ_CUDA;
    dx.data = NULL;
    memset(&dy, 0, sizeof dy);
    if (sj_tensor_alloc(rt, &dx) || sj_tensor_copy(rt, &dx, &hx) || sj_call(fn, &dx, 1, &dy, 1) ||
        sj_tensor_copy(rt, &hy, &dy)) {
        bad = 1;
    } else {
        reference(x, R, C, ref);
        for (int64_t i = 0; i < R * C; i++) bad |= fabs((double)y[i] - ref[i]) > 1e-5;
    }
    sj_tensor_free(rt, &dx);
    sj_tensor_free(rt, &dy);
    free(x), free(y), free(ref);
    return bad;
}

static sj_fn *make_fn(sj_runtime *rt) {
    sj_fn_options o;
    sj_fn_options_init(&o);
    o.hot_threshold = 1;
    o.dynamic = SJ_DYNAMIC_STATIC;
    o.recompile_limit = 64;
    sj_fn *fn = NULL;
    assert_int_equal(sj_fn_create(rt, "rows", 1, m_rows, NULL, &o, &fn), SJ_OK);
    return fn;
}

static const int64_t shapes[][2] = {{3, 40}, {16, 128}, {7, 768}, {64, 512}, {1, 33}};
#define N_SHAPES (int)(sizeof shapes / sizeof shapes[0])

static void second_device_compiles_nothing(void **state) {
    (void)state;
    sj_runtime *rt0 = gpu(0), *rt1 = gpu(1);
    assert_non_null(rt0);
    assert_non_null(rt1);
    sj_fn *f0 = make_fn(rt0), *f1 = make_fn(rt1);
    for (int s = 0; s < N_SHAPES; s++) assert_int_equal(call_checked(rt0, f0, shapes[s][0], shapes[s][1], 1 + s), 0);
    for (int s = 0; s < N_SHAPES; s++) assert_int_equal(call_checked(rt1, f1, shapes[s][0], shapes[s][1], 7 + s), 0);
    sj_stats s0, s1;
    sj_fn_stats(f0, &s0);
    sj_fn_stats(f1, &s1);
    assert_int_equal(s0.compiles, N_SHAPES);
    assert_int_equal(s1.compiles, N_SHAPES);
    assert_int_equal(s1.compile_cache_hits, N_SHAPES); /* not one compiler run on device 1 */
    assert_int_equal(s1.fused_specialized_calls, N_SHAPES);
    sj_runtime_destroy(rt0);
    sj_runtime_destroy(rt1);
}

typedef struct job {
    sj_runtime *rt;
    sj_fn *fn;
    int device, bad;
} job;

static void *serve(void *p) {
    job *j = p;
    for (int i = 0; i < 60; i++) j->bad += call_checked(j->rt, j->fn, shapes[i % N_SHAPES][0], shapes[i % N_SHAPES][1], (unsigned)(i * 31 + j->device));
    return NULL;
}

static void both_devices_serve_concurrently(void **state) {
    (void)state;
    job j[2];
    pthread_t th[2];
    for (int d = 0; d < 2; d++) {
        j[d].rt = gpu(d);
        assert_non_null(j[d].rt);
        j[d].fn = make_fn(j[d].rt);
        j[d].device = d, j[d].bad = 0;
    }
    for (int d = 0; d < 2; d++) assert_int_equal(pthread_create(&th[d], NULL, serve, &j[d]), 0);
    for (int d = 0; d < 2; d++) pthread_join(th[d], NULL);
    for (int d = 0; d < 2; d++) {
        assert_int_equal(j[d].bad, 0);
        sj_stats s;
        sj_fn_stats(j[d].fn, &s);
        assert_int_equal(s.errors, 0);
        assert_true(s.fused_specialized_calls > 0);
        sj_runtime_destroy(j[d].rt);
    }
}

int main(void) {
    snprintf(cache_dir, sizeof cache_dir, "/tmp/sj-multi-XXXXXX");
    if (!mkdtemp(cache_dir)) return 1;
    sj_runtime *probe0 = gpu(0), *probe1 = probe0 ? gpu(1) : NULL;
    int ok = probe0 && probe1;
    if (!ok) printf("skipped: needs 2 CUDA devices (%s)\n", sj_last_error());
    sj_runtime_destroy(probe0);
    sj_runtime_destroy(probe1);
    int r = 0;
    if (ok) {
        const struct CMUnitTest tests[] = {
            cmocka_unit_test(second_device_compiles_nothing),
            cmocka_unit_test(both_devices_serve_concurrently),
        };
        r = cmocka_run_group_tests_name("cuda_multi", tests, NULL, NULL);
    }
    char cmd[96];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", cache_dir);
    if (system(cmd)) {
    }
    return r;
}
