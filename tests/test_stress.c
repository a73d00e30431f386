/* Stress (issue 25, item 5): 16 threads churn shapes on two functions
 * with background compiles (async, hot threshold 1, short cold time), for a
 * few seconds; every result is checked against a plain C reference. Run
 * under ThreadSanitizer by `make test-tsan`. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "jit/shapejit.h"

#define THREADS 16
#define SECONDS 3.0
#define MAXN 64

/* f: relu(x * 2 + y) with y broadcast over rows; g: x - mean over the last axis */
static sj_status m_f(sj_tracer *t, const sj_val *in, int n, void *u) {
    (void)n, (void)u;
    return sj_output(t, sj_relu(t, sj_add(t, sj_mul(t, in[0], sj_scalar(t, 2.0)), in[1])));
}

static sj_status m_g(sj_tracer *t, const sj_val *in, int n, void *u) {
    (void)n, (void)u;
    return sj_output(t, sj_sub(t, in[0], sj_mean(t, in[0], -1, 1)));
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

typedef struct shared {
    sj_fn *f, *g;
    double until;
    _Atomic long calls, errors;
} shared;

static uint64_t next(uint64_t *s) {
    *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
    return *s;
}

static void *worker(void *arg) {
    shared *sh = arg;
    static _Atomic int ids;
    uint64_t rng = 0x9E3779B97F4A7C15ull * (uint64_t)(atomic_fetch_add(&ids, 1) + 1);
    float x[MAXN * MAXN], y[MAXN], o[MAXN * MAXN];
    while (now_s() < sh->until) {
        int64_t r = (int64_t)(next(&rng) % 6), c = (int64_t)(1 + next(&rng) % 12);
        if (next(&rng) % 4 == 0) r = (int64_t)(next(&rng) % MAXN), c = (int64_t)(1 + next(&rng) % MAXN);
        for (int64_t i = 0; i < r * c; i++) x[i] = (float)((int64_t)(next(&rng) % 200) - 100) / 16;
        for (int64_t i = 0; i < c; i++) y[i] = (float)((int64_t)(next(&rng) % 200) - 100) / 16;
        bool use_f = next(&rng) & 1;
        sj_tensor in[2] = {sj_tensor_make(x, SJ_F32, 2, (int64_t[]){r, c}), sj_tensor_make(y, SJ_F32, 1, (int64_t[]){c})};
        sj_tensor out = sj_tensor_make(o, SJ_F32, 2, (int64_t[]){r, c});
        sj_status st = use_f ? sj_call(sh->f, in, 2, &out, 1) : sj_call(sh->g, in, 1, &out, 1);
        if (st) {
            fprintf(stderr, "stress: %s\n", sj_last_error());
            atomic_fetch_add(&sh->errors, 1);
            continue;
        }
        for (int64_t i = 0; i < r; i++) {
            double mean = 0;
            if (!use_f) {
                for (int64_t j = 0; j < c; j++) mean += x[i * c + j];
                mean /= (double)c;
            }
            for (int64_t j = 0; j < c; j++) {
                double want = use_f ? fmax(0.0, 2.0 * x[i * c + j] + y[j]) : x[i * c + j] - mean;
                if (fabs(o[i * c + j] - want) > 1e-4 * (1 + fabs(want))) {
                    fprintf(stderr, "stress: %s [%lld,%lld] at (%lld,%lld): %g, want %g\n", use_f ? "f" : "g",
                            (long long)r, (long long)c, (long long)i, (long long)j, o[i * c + j], want);
                    atomic_fetch_add(&sh->errors, 1);
                    i = r;
                    break;
                }
            }
        }
        atomic_fetch_add(&sh->calls, 1);
    }
    return NULL;
}

static void stress_two_functions(void **state) {
    (void)state;
    sj_runtime_config cfg;
    sj_runtime_config_init(&cfg);
    cfg.backend = SJ_BACKEND_CPU;
    cfg.log_mask = 0;
    cfg.compile_mode = SJ_COMPILE_ASYNC;
    cfg.compile_threads = 2;
    cfg.cache_dir = NULL;
    cfg.exec_threads = 2;
    cfg.hot_threshold = 1;
    cfg.specialize_threshold = 4;
    sj_runtime *rt;
    assert_int_equal(sj_runtime_create(&cfg, &rt), SJ_OK);
    shared sh = {0};
    assert_int_equal(sj_fn_create(rt, "f", 2, m_f, NULL, NULL, &sh.f), SJ_OK);
    assert_int_equal(sj_fn_create(rt, "g", 1, m_g, NULL, NULL, &sh.g), SJ_OK);
    sh.until = now_s() + SECONDS;
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++) assert_int_equal(pthread_create(&t[i], NULL, worker, &sh), 0);
    for (int i = 0; i < THREADS; i++) pthread_join(t[i], NULL);
    sj_stats sf, sg;
    sj_fn_stats(sh.f, &sf);
    sj_fn_stats(sh.g, &sg);
    printf("stress: %ld calls in %.0f s from %d threads; f: %llu entries, %llu compiles, %llu fused calls; "
           "g: %llu entries, %llu compiles, %llu fused calls\n",
           atomic_load(&sh.calls), SECONDS, THREADS, (unsigned long long)sf.entries, (unsigned long long)sf.compiles,
           (unsigned long long)(sf.fused_symbolic_calls + sf.fused_specialized_calls), (unsigned long long)sg.entries,
           (unsigned long long)sg.compiles, (unsigned long long)(sg.fused_symbolic_calls + sg.fused_specialized_calls));
    assert_int_equal(atomic_load(&sh.errors), 0);
    assert_true(atomic_load(&sh.calls) > 0);
    sj_runtime_destroy(rt); /* with compiles possibly still running */
}

int main(void) {
    alarm(120);
    const struct CMUnitTest tests[] = {cmocka_unit_test(stress_two_functions)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
