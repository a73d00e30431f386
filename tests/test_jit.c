/* The JIT end to end on the CPU backend: fused tiers through sj_call,
 * background compilation and the hot swap, sync and off modes, compile
 * failures (missing compiler, compile errors), the persistent cache (warm
 * start, corrupt files), concurrent calls during compiles, destroy during a
 * compile, specialization of hot shapes, cold jobs. Every fused result is
 * compared with an eager run of the same function. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cblas.h>

#include "jit/compile.h"
#include "jit/runtime.h"
#include "jit/shapejit.h"
#include "kernels/cpu/eager.h"
#include "tests/util.h"

/* -- Models ------------------------------------------------------------------------ */

/* w1: gelu(x*a + b) * sigmoid(x) */
static sj_status m_w1(sj_tracer *t, const sj_val *in, int n, void *u) {
    sj_val x = in[0];
    return sj_output(t, sj_mul(t, sj_gelu(t, sj_add(t, sj_mul(t, x, in[1]), in[2])), sj_sigmoid(t, x)));
}

/* w2: h = x + r; y = gelu(layer_norm(h)*g + b); outputs y, h */
static sj_status m_w2(sj_tracer *t, const sj_val *in, int n, void *u) {
    sj_val h = sj_add(t, in[0], in[1]);
    sj_output(t, sj_gelu(t, sj_layer_norm(t, h, in[2], in[3], 1e-5)));
    return sj_output(t, h);
}

/* a matmul, its bias and activation, then a softmax over rows */
static sj_status m_mlp(sj_tracer *t, const sj_val *in, int n, void *u) {
    sj_val h = sj_relu(t, sj_add(t, sj_matmul(t, in[0], in[1]), in[2]));
    return sj_output(t, sj_softmax(t, sj_mul(t, h, sj_scalar(t, 0.5)), -1));
}

/* -- Harness ---------------------------------------------------------------------------- */

static char cache_dir[256];

/* The tests' configuration: the CPU backend (the C compiler is its
 * concern; a GPU machine's default is CUDA), quiet, 2 kernel threads. */
static sj_runtime_config config(sj_compile_mode mode, const char *cc, const char *cache) {
    sj_runtime_config cfg = tu_cpu_config();
    cfg.compile_mode = mode;
    cfg.cc = cc;
    cfg.cache_dir = cache;
    cfg.exec_threads = 2;
    return cfg;
}

static sj_runtime *create(const sj_runtime_config *cfg) {
    sj_runtime *rt = NULL;
    assert_int_equal(sj_runtime_create(cfg, &rt), SJ_OK);
    return rt;
}

static sj_runtime *runtime(sj_compile_mode mode, const char *cc, const char *cache) {
    sj_runtime_config cfg = config(mode, cc, cache);
    return create(&cfg);
}

static sj_fn *make(sj_runtime *rt, const char *name, int n_in, sj_model_fn m, sj_dynamic dyn, int hot) {
    sj_fn_options o;
    sj_fn_options_init(&o);
    o.dynamic = dyn;
    o.hot_threshold = hot;
    sj_fn *fn = NULL;
    assert_int_equal(sj_fn_create(rt, name, n_in, m, NULL, &o, &fn), SJ_OK);
    return fn;
}

/* Outputs of one call, runtime-allocated, checked against an eager run. */
static sj_runtime *eager_rt; /* compile off: the reference runs */

static void call_and_compare(sj_runtime *rt, sj_fn *fn, sj_model_fn m, const sj_tensor *in, int n_in, int n_out,
                             double tol) {
    if (!eager_rt) eager_rt = runtime(SJ_COMPILE_OFF, NULL, NULL);
    sj_tensor out[4] = {{0}}, ref[4] = {{0}};
    sj_status st = sj_call(fn, in, n_in, out, n_out);
    if (st) fail_msg("sj_call: %s", sj_last_error());
    sj_fn *e = make(eager_rt, "eager", n_in, m, SJ_DYNAMIC_STATIC, 1000000);
    assert_int_equal(sj_call(e, in, n_in, ref, n_out), SJ_OK);
    sj_fn_destroy(e);
    for (int i = 0; i < n_out; i++) {
        int64_t n = tu_numel(&ref[i]);
        double *r = malloc(sizeof(double) * (size_t)(n ? n : 1));
        for (int64_t k = 0; k < n; k++) r[k] = tu_get(&ref[i], k);
        if (!tu_check(&out[i], r, tol, "fused vs eager")) fail_msg("output %d differs from eager", i);
        free(r);
        sj_tensor_free(rt, &out[i]);
        sj_tensor_free(eager_rt, &ref[i]);
    }
}

static void w1_inputs(sj_tensor *in, int64_t S) {
    int64_t H = 256;
    in[0] = tu_tensor(SJ_F32, 2, (int64_t[]){S, H});
    in[1] = tu_tensor(SJ_F32, 1, &H);
    in[2] = tu_tensor(SJ_F32, 1, &H);
    for (int i = 0; i < 3; i++) tu_fill_random(&in[i]);
}

static void w2_inputs(sj_tensor *in, int64_t S, int64_t H) {
    in[0] = tu_tensor(SJ_F32, 2, (int64_t[]){S, H});
    in[1] = tu_tensor(SJ_F32, 2, (int64_t[]){S, H});
    in[2] = tu_tensor(SJ_F32, 1, &H);
    in[3] = tu_tensor(SJ_F32, 1, &H);
    for (int i = 0; i < 4; i++) tu_fill_random(&in[i]);
}

static sj_stats stats(const sj_fn *fn) {
    sj_stats s;
    sj_fn_stats(fn, &s);
    return s;
}

static int teardown_each(void **state) {
    tu_free_all();
    return 0;
}

static int setup_group(void **state) { return tu_mkdtemp(cache_dir, sizeof cache_dir, "sj_test_jit"); }

static int teardown_group(void **state) {
    sj_runtime_destroy(eager_rt);
    tu_rmtree(cache_dir);
    return 0;
}

/* Does some file of dir contain needle? */
static bool dir_has(const char *dir, const char *needle) {
    DIR *d = opendir(dir);
    assert_non_null(d);
    struct dirent *de;
    bool found = false;
    char path[512];
    while (!found && (de = readdir(d))) {
        if (de->d_name[0] == '.') continue;
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        FILE *f = fopen(path, "rb");
        if (!f) continue;
        static char text[1 << 20];
        size_t n = fread(text, 1, sizeof text - 1, f);
        fclose(f);
        text[n] = 0;
        found = strstr(text, needle) != NULL;
    }
    closedir(d);
    return found;
}

/* -- Tiers -------------------------------------------------------------------------------- */

static void test_sync_fused_static_and_symbolic(void **state) {
    sj_runtime *rt = runtime(SJ_COMPILE_SYNC, NULL, NULL);
    sj_fn *fn = make(rt, "w1", 3, m_w1, SJ_DYNAMIC_AUTO, 1);
    sj_tensor in[3];
    w1_inputs(in, 7);
    call_and_compare(rt, fn, m_w1, in, 3, 1, 1e-5); /* static entry, compiled before it runs */
    sj_stats s = stats(fn);
    assert_int_equal(s.compiles, 1);
    assert_int_equal(s.fused_specialized_calls, 1);
    assert_int_equal(s.eager_calls, 0);
    int64_t sizes[] = {9, 33, 1, 130};
    for (int i = 0; i < 4; i++) { /* AUTO: symbolic in S after the first change */
        w1_inputs(in, sizes[i]);
        call_and_compare(rt, fn, m_w1, in, 3, 1, 1e-5);
    }
    s = stats(fn);
    assert_int_equal(s.eager_calls, 0);
    assert_true(s.fused_symbolic_calls >= 3);
    sj_entry_info info[4];
    int n = sj_fn_entries(fn, info, 4);
    assert_true(n >= 2);
    assert_string_equal(info[n - 1].tier, "fused specialized");
    bool sym = false;
    for (int i = 0; i < n; i++) sym |= !strcmp(info[i].tier, "fused symbolic");
    assert_true(sym);
    sj_runtime_destroy(rt);
}

static void test_two_outputs_row_group(void **state) {
    sj_runtime *rt = runtime(SJ_COMPILE_SYNC, NULL, NULL);
    sj_fn *fn = make(rt, "w2", 4, m_w2, SJ_DYNAMIC_SYMBOLIC, 1);
    int64_t shapes[][2] = {{5, 48}, {17, 48}, {2, 48}, {3, 200}};
    for (int i = 0; i < 4; i++) {
        sj_tensor in[4];
        w2_inputs(in, shapes[i][0], shapes[i][1]);
        call_and_compare(rt, fn, m_w2, in, 4, 2, 1e-5);
    }
    sj_stats s = stats(fn);
    assert_int_equal(s.eager_calls, 0);
    assert_int_equal(s.traces, 1);
    sj_entry_info info;
    sj_fn_entries(fn, &info, 1);
    assert_true(info.planned_bytes <= info.naive_bytes);
    sj_runtime_destroy(rt);
}

/* stream_min_bytes reaches the generated kernels: 1 streams every f32
 * output (results still right, on 2 threads), -1 never. */
static void test_streaming_config(void **state) {
    for (int pass = 0; pass < 2; pass++) {
        char dump[256];
        assert_int_equal(tu_mkdtemp(dump, sizeof dump, "sj_test_dump"), 0);
        sj_runtime_config cfg = config(SJ_COMPILE_SYNC, NULL, NULL);
        cfg.dump_dir = dump;
        cfg.stream_min_bytes = pass ? -1 : 1;
        sj_runtime *rt = create(&cfg);
        sj_fn *fn = make(rt, "w2", 4, m_w2, SJ_DYNAMIC_SYMBOLIC, 1);
        int64_t shapes[][2] = {{37, 200}, {5, 1000}, {300, 33}};
        for (int i = 0; i < 3; i++) {
            sj_tensor in[4];
            w2_inputs(in, shapes[i][0], shapes[i][1]);
            call_and_compare(rt, fn, m_w2, in, 4, 2, 1e-5);
        }
        assert_int_equal(stats(fn).eager_calls, 0);
        sj_runtime_destroy(rt);
        assert_int_equal(dir_has(dump, "sj_rt_stream_f32(P"), pass == 0);
        assert_int_equal(dir_has(dump, "const int nt = "), pass == 0);
        assert_int_equal(dir_has(dump, " > 1;\n"), pass == 0); /* the threshold itself */
        tu_rmtree(dump);
    }
}

#if defined(__SANITIZE_THREAD__)
#define TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define TSAN 1
#endif
#endif
#ifndef TSAN
#define TSAN 0
#endif

/* blas_threads: 0 sets OpenBLAS to one thread and splits products over the
 * kernel threads, n > 0 gives OpenBLAS n threads and splits nothing, -1
 * leaves OpenBLAS alone (and splits nothing while it has threads). Eager
 * and fused calls alike (the product is a library call inside the fused
 * plan), checked against the reference runtime's eager run. */
static void test_blas_threads(void **state) {
    if (!eager_rt) eager_rt = runtime(SJ_COMPILE_OFF, NULL, NULL); /* before: it sets OpenBLAS too */
    int was = openblas_get_num_threads();
    const int settings[] = {0, 3, -1};
    const int want[] = {1, 3, 2};
    for (int i = 0; i < 3; i++) {
        openblas_set_num_threads(2);
        for (int mode = 0; mode < 2; mode++) {
            sj_runtime_config cfg = config(mode ? SJ_COMPILE_SYNC : SJ_COMPILE_OFF, NULL, NULL);
            cfg.exec_threads = 4;
            cfg.blas_threads = settings[i];
            sj_runtime *rt = create(&cfg);
            assert_int_equal(openblas_get_num_threads(), want[i]);
            if (TSAN && settings[i] != 0) { /* OpenBLAS's own threads sync where TSan cannot see */
                sj_runtime_destroy(rt);
                continue;
            }
            sj_fn *fn = make(rt, "mlp", 3, m_mlp, SJ_DYNAMIC_SYMBOLIC, 1);
            sj_tensor in[3] = {tu_tensor(SJ_F32, 2, (int64_t[]){203, 128}),
                               tu_tensor(SJ_F32, 2, (int64_t[]){128, 161}), tu_tensor(SJ_F32, 1, (int64_t[]){161})};
            for (int k = 0; k < 3; k++) tu_fill_random(&in[k]);
            uint64_t before = sj_cpu_split_count();
            /* 1e-4, not 1e-5: h = 0.5 relu(x w + b) reaches ~20 over 128
             * terms, and softmax turns h's rounding into relative error;
             * each run alone is 1.3e-5 from a float64 reference (AMD EPYC,
             * where the fused and eager products sum in other orders) */
            call_and_compare(rt, fn, m_mlp, in, 3, 1, 1e-4);
            assert_int_equal(stats(fn).eager_calls, mode ? 0 : 1);
            /* this call's product and the reference run's are split
             * exactly when OpenBLAS is left single-threaded */
            assert_int_equal(sj_cpu_split_count() - before, settings[i] == 0 ? 2 : 0);
            sj_fn_destroy(fn);
            sj_runtime_destroy(rt);
        }
    }
    sj_runtime_config cfg = config(SJ_COMPILE_OFF, NULL, NULL);
    cfg.blas_threads = -2;
    sj_runtime *rt = NULL;
    assert_int_equal(sj_runtime_create(&cfg, &rt), SJ_EINVAL);
    assert_null(rt);
    assert_non_null(strstr(sj_last_error(), "blas_threads -2"));
    openblas_set_num_threads(was);
}

static void test_matmul_chain_and_caller_outputs(void **state) {
    sj_runtime *rt = runtime(SJ_COMPILE_SYNC, NULL, NULL);
    sj_fn *fn = make(rt, "mlp", 3, m_mlp, SJ_DYNAMIC_SYMBOLIC, 1);
    for (int64_t M = 2; M <= 20; M += 9) {
        sj_tensor in[3] = {tu_tensor(SJ_F32, 2, (int64_t[]){M, 24}), tu_tensor(SJ_F32, 2, (int64_t[]){24, 40}),
                           tu_tensor(SJ_F32, 1, (int64_t[]){40})};
        for (int i = 0; i < 3; i++) tu_fill_random(&in[i]);
        call_and_compare(rt, fn, m_mlp, in, 3, 1, 1e-5);
        /* a caller output that is not contiguous: served eagerly, still right */
        sj_tensor wide = tu_tensor(SJ_F32, 2, (int64_t[]){M, 80});
        sj_tensor out = wide;
        out.shape[1] = 40;
        out.stride[1] = 2;
        tu_poison(&wide);
        assert_int_equal(sj_call(fn, in, 3, &out, 1), SJ_OK);
        sj_tensor got = {0};
        assert_int_equal(sj_call(fn, in, 3, &got, 1), SJ_OK);
        for (int64_t r = 0; r < M; r++)
            for (int64_t c = 0; c < 40; c++)
                assert_float_equal(tu_get(&out, r * 40 + c), ((float *)got.data)[r * 40 + c], 1e-6);
        sj_tensor_free(rt, &got);
    }
    sj_runtime_destroy(rt);
}

static void test_off_mode(void **state) {
    sj_runtime *rt = runtime(SJ_COMPILE_OFF, NULL, NULL);
    sj_fn *fn = make(rt, "off", 3, m_w1, SJ_DYNAMIC_AUTO, 1);
    sj_tensor in[3];
    for (int i = 0; i < 5; i++) {
        w1_inputs(in, 4 + i);
        call_and_compare(rt, fn, m_w1, in, 3, 1, 1e-5);
    }
    sj_stats s = stats(fn);
    assert_int_equal(s.compiles, 0);
    assert_int_equal(s.eager_calls, 5);
    assert_int_equal(sj_fn_wait_idle(fn, 0), SJ_OK);
    sj_runtime_destroy(rt);
}

/* -- Background compiles ---------------------------------------------------------------- */

typedef struct hammer {
    sj_fn *fn;
    int id, bad;
} hammer;

static void *hammer_main(void *arg) {
    hammer *h = arg;
    float x[300], a[300], b[300], y[300];
    for (int it = 0; it < 60; it++) {
        int64_t S = 1 + (h->id + it) % 3, H = 100;
        for (int i = 0; i < S * H; i++) x[i] = 0.01f * (float)((i * 7 + h->id) % 200) - 1.0f;
        for (int i = 0; i < H; i++) a[i] = 0.5f + 0.001f * i, b[i] = -0.2f + 0.002f * i;
        sj_tensor in[3] = {sj_tensor_make(x, SJ_F32, 2, (int64_t[]){S, H}), sj_tensor_make(a, SJ_F32, 1, &H),
                           sj_tensor_make(b, SJ_F32, 1, &H)};
        sj_tensor out = sj_tensor_make(y, SJ_F32, 2, (int64_t[]){S, H});
        if (sj_call(h->fn, in, 3, &out, 1)) {
            h->bad++;
            continue;
        }
        for (int i = 0; i < S * H; i++) {
            double v = x[i] * a[i % H] + b[i % H];
            double want = 0.5 * v * (1 + erf(v / sqrt(2.0))) / (1 + exp(-x[i]));
            if (fabs(y[i] - want) > 1e-5 * (1 + fabs(want))) h->bad++;
        }
    }
    return NULL;
}

/* A slow compile: calls are served eagerly meanwhile, then swap to fused;
 * 8 threads call throughout. */
static void test_async_slow_compile_hot_swap(void **state) {
    sj_runtime *rt = runtime(SJ_COMPILE_ASYNC, NULL, NULL);
    sj_runtime_test_hooks(rt, 400, 0);
    sj_fn *fn = make(rt, "slow", 3, m_w1, SJ_DYNAMIC_SYMBOLIC, 1);
    pthread_t th[8];
    hammer h[8];
    for (int i = 0; i < 8; i++) {
        h[i] = (hammer){fn, i, 0};
        pthread_create(&th[i], NULL, hammer_main, &h[i]);
    }
    for (int i = 0; i < 8; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(h[i].bad, 0);
    }
    sj_stats s = stats(fn);
    assert_true(s.eager_calls > 0); /* served while the compile was in flight */
    assert_int_equal(sj_fn_wait_idle(fn, 10000), SJ_OK);
    s = stats(fn);
    assert_int_equal(s.compile_failures, 0);
    assert_true(s.compiles >= 1);
    uint64_t fused_before = s.fused_symbolic_calls + s.fused_specialized_calls;
    sj_tensor in[3];
    w1_inputs(in, 2);
    call_and_compare(rt, fn, m_w1, in, 3, 1, 1e-5);
    s = stats(fn);
    assert_int_equal(s.fused_symbolic_calls + s.fused_specialized_calls, fused_before + 1); /* swapped in */
    sj_entry_info info;
    sj_fn_entries(fn, &info, 1);
    assert_true(info.time_to_fused_ms >= 400);
    sj_runtime_destroy(rt);
}

static void test_wait_idle_timeout(void **state) {
    sj_runtime *rt = runtime(SJ_COMPILE_ASYNC, NULL, NULL);
    sj_runtime_test_hooks(rt, 500, 0);
    sj_fn *fn = make(rt, "timeout", 3, m_w1, SJ_DYNAMIC_STATIC, 1);
    sj_tensor in[3];
    w1_inputs(in, 3);
    call_and_compare(rt, fn, m_w1, in, 3, 1, 1e-5);
    assert_int_equal(sj_fn_wait_idle(fn, 10), SJ_ETIMEOUT);
    assert_int_equal(sj_fn_wait_idle(NULL, 10), SJ_EINVAL);
    assert_int_equal(sj_fn_wait_idle(fn, -1), SJ_OK);
    sj_runtime_destroy(rt);
}

static void test_destroy_during_compile(void **state) {
    sj_runtime *rt = runtime(SJ_COMPILE_ASYNC, NULL, NULL);
    sj_runtime_test_hooks(rt, 300, 0);
    sj_fn *f1 = make(rt, "gone", 3, m_w1, SJ_DYNAMIC_STATIC, 1), *f2 = make(rt, "queued", 3, m_w1, SJ_DYNAMIC_STATIC, 1);
    sj_tensor in[3];
    w1_inputs(in, 3);
    call_and_compare(rt, f1, m_w1, in, 3, 1, 1e-5); /* its compile starts */
    call_and_compare(rt, f2, m_w1, in, 3, 1, 1e-5); /* queued behind it */
    sj_fn_destroy(f2);                                /* drops the queued job */
    sj_fn_destroy(f1);                                /* waits for its compile */
    sj_fn *f3 = make(rt, "left", 3, m_w1, SJ_DYNAMIC_STATIC, 1);
    call_and_compare(rt, f3, m_w1, in, 3, 1, 1e-5);
    sj_runtime_destroy(rt); /* with f3's compile in flight */
}

static void test_cold_job_dropped(void **state) {
    sj_runtime *rt = runtime(SJ_COMPILE_ASYNC, NULL, NULL);
    sj_runtime_test_hooks(rt, 300, 0);
    sj_compiler_set_cold_ms(rt->compiler, 50);
    sj_fn *fn = make(rt, "cold", 3, m_w1, SJ_DYNAMIC_STATIC, 1);
    sj_tensor a[3], b[3];
    w1_inputs(a, 3);
    w1_inputs(b, 4);
    call_and_compare(rt, fn, m_w1, a, 3, 1, 1e-5); /* compiling for 300 ms */
    /* b must queue behind a's compile: were both queued at once, the queue
     * (ordered by value) could compile b first and drop a */
    sj_entry_info info;
    for (int i = 0; i < 5000; i++) {
        sj_fn_entries(fn, &info, 1);
        if (strcmp(info.tier, "queued")) break;
        usleep(1000);
    }
    assert_string_equal(info.tier, "compiling");
    call_and_compare(rt, fn, m_w1, b, 3, 1, 1e-5); /* queued, then never called again */
    assert_int_equal(sj_fn_wait_idle(fn, 5000), SJ_OK);
    sj_stats s = stats(fn);
    assert_int_equal(s.compiles_dropped, 1);
    assert_int_equal(s.compiles, 1);
    sj_compiler_set_cold_ms(rt->compiler, 60000);
    call_and_compare(rt, fn, m_w1, b, 3, 1, 1e-5); /* hot again: queued again */
    assert_int_equal(sj_fn_wait_idle(fn, 5000), SJ_OK);
    assert_int_equal(stats(fn).compiles, 2);
    sj_runtime_destroy(rt);
}

/* -- Failures ------------------------------------------------------------------------------ */

static void test_missing_compiler(void **state) {
    sj_runtime *rt = runtime(SJ_COMPILE_SYNC, "/nonexistent/cc", NULL);
    sj_fn *fn = make(rt, "nocc", 3, m_w1, SJ_DYNAMIC_AUTO, 1);
    sj_tensor in[3];
    for (int i = 0; i < 3; i++) {
        w1_inputs(in, 3 + i);
        call_and_compare(rt, fn, m_w1, in, 3, 1, 1e-5);
    }
    sj_stats s = stats(fn);
    assert_int_equal(s.eager_calls, 3);
    assert_int_equal(s.compile_failures, 2); /* one per entry: within their 1 s penalty */
    sj_entry_info info;
    sj_fn_entries(fn, &info, 1);
    assert_string_equal(info.tier, "compile failed");
    char *text = tu_explain(fn);
    assert_non_null(strstr(text, "compile failed: "));
    assert_non_null(strstr(text, "not found"));
    free(text);
    sj_runtime_destroy(rt);
}

static void test_compile_error_injected(void **state) {
    sj_runtime *rt = runtime(SJ_COMPILE_ASYNC, NULL, NULL);
    sj_runtime_test_hooks(rt, 0, 1);
    sj_fn *fn = make(rt, "broken", 4, m_w2, SJ_DYNAMIC_AUTO, 1);
    sj_tensor in[4];
    w2_inputs(in, 3, 16);
    call_and_compare(rt, fn, m_w2, in, 4, 2, 1e-5);
    assert_int_equal(sj_fn_wait_idle(fn, 5000), SJ_OK);
    call_and_compare(rt, fn, m_w2, in, 4, 2, 1e-5);
    sj_stats s = stats(fn);
    assert_int_equal(s.compile_failures, 1);
    assert_int_equal(s.eager_calls, 2);
    sj_runtime_destroy(rt);
}

/* -- The persistent cache -------------------------------------------------------------------- */

static int count_files(const char *dir, const char *ext) {
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *de;
    while (d && (de = readdir(d))) n += strlen(de->d_name) > strlen(ext) && !strcmp(de->d_name + strlen(de->d_name) - strlen(ext), ext);
    if (d) closedir(d);
    return n;
}

static void first_file(const char *dir, const char *ext, char *path, size_t n) {
    DIR *d = opendir(dir);
    struct dirent *de;
    path[0] = '\0';
    while (d && (de = readdir(d)))
        if (strlen(de->d_name) > strlen(ext) && !strcmp(de->d_name + strlen(de->d_name) - strlen(ext), ext)) {
            snprintf(path, n, "%s/%s", dir, de->d_name);
            break;
        }
    if (d) closedir(d);
}

static void test_cache_warm_and_corrupt(void **state) {
    sj_tensor in[4];
    w2_inputs(in, 6, 64);
    /* cold: compiles and stores */
    sj_runtime *rt = runtime(SJ_COMPILE_SYNC, NULL, cache_dir);
    sj_fn *fn = make(rt, "cached", 4, m_w2, SJ_DYNAMIC_STATIC, 1);
    call_and_compare(rt, fn, m_w2, in, 4, 2, 1e-5);
    assert_int_equal(stats(fn).compile_cache_hits, 0);
    sj_runtime_destroy(rt);
    assert_int_equal(count_files(cache_dir, ".so"), 1);

    /* warm: a new runtime reaches fused code without running the compiler */
    rt = runtime(SJ_COMPILE_SYNC, NULL, cache_dir);
    fn = make(rt, "cached", 4, m_w2, SJ_DYNAMIC_STATIC, 1);
    call_and_compare(rt, fn, m_w2, in, 4, 2, 1e-5);
    sj_stats s = stats(fn);
    assert_int_equal(s.compiles, 1);
    assert_int_equal(s.compile_cache_hits, 1);
    assert_int_equal(s.compile_failures, 0);
    assert_int_equal(s.fused_specialized_calls, 1);
    sj_runtime_destroy(rt);

    /* corrupt the artifact: detected, deleted, recompiled */
    char so[512];
    first_file(cache_dir, ".so", so, sizeof so);
    FILE *f = fopen(so, "r+b");
    assert_non_null(f);
    fseek(f, 100, SEEK_SET);
    fputc(0x5a, f);
    fputc(0xa5, f);
    fclose(f);
    rt = runtime(SJ_COMPILE_SYNC, NULL, cache_dir);
    fn = make(rt, "cached", 4, m_w2, SJ_DYNAMIC_STATIC, 1);
    call_and_compare(rt, fn, m_w2, in, 4, 2, 1e-5);
    s = stats(fn);
    assert_int_equal(s.compiles, 1);
    assert_int_equal(s.compile_cache_hits, 0);
    assert_int_equal(s.fused_specialized_calls, 1);
    sj_runtime_destroy(rt);

    /* truncated: the same */
    first_file(cache_dir, ".so", so, sizeof so);
    assert_int_equal(truncate(so, 64), 0);
    rt = runtime(SJ_COMPILE_SYNC, NULL, cache_dir);
    fn = make(rt, "cached", 4, m_w2, SJ_DYNAMIC_STATIC, 1);
    call_and_compare(rt, fn, m_w2, in, 4, 2, 1e-5);
    assert_int_equal(stats(fn).compile_cache_hits, 0);
    sj_runtime_destroy(rt);
}

/* The runtime and the cache's trust rules: a directory others may write
 * is refused with one warning and the function still gets fused kernels
 * (compiled, not loaded); with cache_key, entries are signed and another
 * key's entries are recompiled. */
static void test_cache_trust_in_runtime(void **state) {
    sj_tensor in[4];
    w2_inputs(in, 5, 32);
    char open_dir[300], keyed[300];
    snprintf(open_dir, sizeof open_dir, "%s/open", cache_dir);
    snprintf(keyed, sizeof keyed, "%s/keyed", cache_dir);
    assert_int_equal(mkdir(open_dir, 0700), 0);
    assert_int_equal(chmod(open_dir, 0777), 0);
    tu_logbook log = {0};
    pthread_mutex_init(&log.lock, NULL);
    sj_runtime_config cfg = config(SJ_COMPILE_SYNC, NULL, open_dir);
    cfg.log_mask = SJ_LOG_WARN;
    cfg.log_fn = tu_log_sink;
    cfg.log_user = &log;
    sj_runtime *rt = create(&cfg);
    assert_true(tu_logged(&log, "no persistent kernel cache"));
    assert_true(tu_logged(&log, "writable by group or others"));
    sj_fn *fn = make(rt, "refused", 4, m_w2, SJ_DYNAMIC_STATIC, 1);
    call_and_compare(rt, fn, m_w2, in, 4, 2, 1e-5);
    assert_int_equal(stats(fn).fused_specialized_calls, 1);
    sj_runtime_destroy(rt);
    assert_int_equal(count_files(open_dir, ".so"), 0);

    /* signed with one key: a hit under it, a recompile under another */
    const char *keys[3] = {"alpha", "alpha", "beta"};
    const uint64_t hits[3] = {0, 1, 0};
    for (int i = 0; i < 3; i++) {
        cfg = config(SJ_COMPILE_SYNC, NULL, keyed);
        cfg.cache_key = keys[i];
        rt = create(&cfg);
        fn = make(rt, "signed", 4, m_w2, SJ_DYNAMIC_STATIC, 1);
        call_and_compare(rt, fn, m_w2, in, 4, 2, 1e-5);
        if (stats(fn).compile_cache_hits != hits[i]) fail_msg("key %d (%s): %llu cache hits, want %llu", i, keys[i], (unsigned long long)stats(fn).compile_cache_hits, (unsigned long long)hits[i]);
        assert_int_equal(stats(fn).fused_specialized_calls, 1);
        sj_runtime_destroy(rt);
    }
    /* SHAPEJIT_CACHE_KEY is read into cache_key */
    setenv("SHAPEJIT_CACHE_KEY", "from the environment", 1);
    sj_runtime_config_init(&cfg);
    assert_string_equal(cfg.cache_key, "from the environment");
    unsetenv("SHAPEJIT_CACHE_KEY");
    tu_free_all();
    pthread_mutex_destroy(&log.lock);
}

/* -- Specialization of hot shapes ------------------------------------------------------------- */

static void test_hot_shapes_specialized(void **state) {
    sj_runtime *rt = runtime(SJ_COMPILE_SYNC, NULL, NULL);
    sj_fn_options o;
    sj_fn_options_init(&o);
    o.dynamic = SJ_DYNAMIC_SYMBOLIC;
    o.hot_threshold = 1;
    o.specialize_threshold = 3;
    o.specialize_budget = 1;
    sj_fn *fn;
    assert_int_equal(sj_fn_create(rt, "spec", 3, m_w1, NULL, &o, &fn), SJ_OK);
    sj_tensor a[3], b[3];
    w1_inputs(a, 5);
    w1_inputs(b, 6);
    for (int i = 0; i < 2; i++) call_and_compare(rt, fn, m_w1, a, 3, 1, 1e-5);
    sj_stats s = stats(fn);
    assert_int_equal(s.fused_symbolic_calls, 2);
    call_and_compare(rt, fn, m_w1, a, 3, 1, 1e-5); /* third: specialized (sync) */
    s = stats(fn);
    assert_int_equal(s.fused_specialized_calls, 1);
    assert_int_equal(s.compiles, 2);
    for (int i = 0; i < 4; i++) call_and_compare(rt, fn, m_w1, b, 3, 1, 1e-5); /* over budget: symbolic */
    s = stats(fn);
    assert_int_equal(s.fused_specialized_calls, 1);
    assert_int_equal(s.fused_symbolic_calls, 6);
    sj_entry_info info;
    sj_fn_entries(fn, &info, 1);
    assert_int_equal(info.specialized_shapes, 1);
    sj_runtime_destroy(rt);
}

/* Buckets' symbolic kernels are one unit: with no persistent cache the
 * compiler still runs once, later entries share the loaded unit, and a
 * second function of the same model shares it too and keeps it loaded when
 * the first is destroyed. */
static void test_identical_units_shared(void **state) {
    sj_runtime *rt = runtime(SJ_COMPILE_SYNC, NULL, NULL);
    sj_fn *fn = make(rt, "buckets", 3, m_w1, SJ_DYNAMIC_AUTO, 1);
    assert_int_equal(sj_set_buckets_pow2(fn, 0, 0, 16, 256), SJ_OK);
    sj_tensor in[3];
    int64_t sizes[] = {20, 40, 70, 150};
    for (int i = 0; i < 4; i++) {
        w1_inputs(in, sizes[i]);
        call_and_compare(rt, fn, m_w1, in, 3, 1, 1e-5);
    }
    sj_stats s = stats(fn);
    assert_int_equal(s.entries, 4);
    assert_int_equal(s.fused_symbolic_calls, 4);
    assert_int_equal(s.compiles, 4);
    assert_int_equal(s.compile_cache_hits, 3); /* compiled once */

    sj_fn *other = make(rt, "other", 3, m_w1, SJ_DYNAMIC_AUTO, 1);
    assert_int_equal(sj_set_buckets_pow2(other, 0, 0, 16, 256), SJ_OK);
    w1_inputs(in, 33);
    call_and_compare(rt, other, m_w1, in, 3, 1, 1e-5);
    assert_int_equal(stats(other).compile_cache_hits, 1);
    sj_fn_destroy(fn);
    w1_inputs(in, 60);
    call_and_compare(rt, other, m_w1, in, 3, 1, 1e-5);
    assert_int_equal(stats(other).fused_symbolic_calls, 2);
    sj_runtime_destroy(rt);
}

int main(void) {
#define T(f) cmocka_unit_test_teardown(f, teardown_each)
    const struct CMUnitTest tests[] = {
        T(test_sync_fused_static_and_symbolic), T(test_two_outputs_row_group), T(test_matmul_chain_and_caller_outputs),
        T(test_off_mode),                       T(test_async_slow_compile_hot_swap), T(test_wait_idle_timeout),
        T(test_destroy_during_compile),         T(test_cold_job_dropped),       T(test_missing_compiler),
        T(test_compile_error_injected),         T(test_cache_warm_and_corrupt), T(test_cache_trust_in_runtime),
        T(test_hot_shapes_specialized),
        T(test_streaming_config),
        T(test_blas_threads),                   T(test_identical_units_shared),
    };
    return cmocka_run_group_tests_name("jit", tests, setup_group, teardown_group);
}
