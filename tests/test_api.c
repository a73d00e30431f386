/* The public API: argument checks, errors and recovery, outputs, the
 * signature memo, logging, configuration, concurrency. */
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

uint16_t tu_f32_to_f16_ref(float f); /* tests/util_ref.c */

#include "jit/shapejit.h"
#include "tests/util.h"

/* -- Fixtures and models --------------------------------------------------------- */

static sj_runtime *rt;

/* A quiet CPU runtime without a kernel cache. */
static sj_status quiet_runtime(sj_compile_mode mode, sj_runtime **out) {
    sj_runtime_config cfg;
    sj_runtime_config_init(&cfg);
    cfg.backend = SJ_BACKEND_CPU;
    cfg.compile_mode = mode;
    cfg.cache_dir = NULL;
    cfg.log_mask = 0;
    return sj_runtime_create(&cfg, out);
}

/* eager only: this suite is not about fused kernels (but for the fused
 * path's own checks, which make a runtime of their own) */
static int setup(void **state) { return quiet_runtime(SJ_COMPILE_OFF, &rt) == SJ_OK ? 0 : -1; }

static int teardown(void **state) {
    sj_runtime_destroy(rt);
    rt = NULL;
    return 0;
}

/* y = x * 2 + 1 */
static sj_status affine_model(sj_tracer *t, const sj_val *in, int n, void *u) {
    return sj_output(t, sj_add(t, sj_mul(t, in[0], sj_scalar(t, 2.0)), sj_scalar(t, 1.0)));
}

/* y = a + b (broadcasting) */
static sj_status add_model(sj_tracer *t, const sj_val *in, int n, void *u) {
    return sj_output(t, sj_add(t, in[0], in[1]));
}

static sj_tensor f32(float *p, int rank, const int64_t *shape) { return sj_tensor_make(p, SJ_F32, rank, shape); }

static void fill(float *p, int n, float base) {
    for (int i = 0; i < n; i++) p[i] = base + 0.25f * (float)i - 1.3f;
}

/* Runs affine on [n] and checks the result. */
static void check_affine(sj_fn *fn, int n) {
    float x[64], y[64];
    fill(x, n, 0.7f);
    sj_tensor in = f32(x, 1, (int64_t[]){n}), out = f32(y, 1, (int64_t[]){n});
    assert_int_equal(sj_call(fn, &in, 1, &out, 1), SJ_OK);
    for (int i = 0; i < n; i++) assert_float_equal(y[i], x[i] * 2.0f + 1.0f, 1e-6);
}

static sj_fn *make_fn(const char *name, int n_in, sj_model_fn m, void *user) {
    sj_fn *fn = NULL;
    assert_int_equal(sj_fn_create(rt, name, n_in, m, user, NULL, &fn), SJ_OK);
    assert_non_null(fn);
    return fn;
}

static void assert_msg_has(const char *needle) {
    const char *msg = sj_last_error();
    if (!strstr(msg, needle)) fail_msg("message \"%s\" lacks \"%s\"", msg, needle);
}

/* -- Runtime and configuration ------------------------------------------------------- */

static void test_runtime_args(void **state) {
    assert_int_equal(sj_runtime_create(NULL, NULL), SJ_EINVAL);
    assert_msg_has("rt is NULL");
    sj_runtime_config cfg;
    sj_runtime_config_init(&cfg);
    cfg.compile_mode = SJ_COMPILE_OFF, cfg.cache_dir = NULL;
    cfg.backend = (sj_backend_kind)42;
    sj_runtime *r = (sj_runtime *)0x1;
    assert_int_equal(sj_runtime_create(&cfg, &r), SJ_EINVAL);
    assert_null(r);
    assert_msg_has("backend 42");
    sj_runtime_config_init(&cfg);
    cfg.compile_mode = SJ_COMPILE_OFF, cfg.cache_dir = NULL;
    cfg.log_mask = 1u << 30;
    assert_int_equal(sj_runtime_create(&cfg, &r), SJ_EINVAL);
    sj_runtime_config_init(&cfg);
    cfg.compile_mode = SJ_COMPILE_OFF, cfg.cache_dir = NULL;
    cfg.allocator.free = NULL;
    assert_int_equal(sj_runtime_create(&cfg, &r), SJ_EINVAL);
    assert_msg_has("allocator");
    sj_runtime_config_init(&cfg);
    cfg.compile_mode = SJ_COMPILE_OFF, cfg.cache_dir = NULL;
    cfg.cuda_graphs = -1;
    assert_int_equal(sj_runtime_create(&cfg, &r), SJ_EINVAL);
    assert_msg_has("cuda_graphs -1 out of range (0 .. 1000000)");
    /* NVRTC options are checked whichever backend the runtime gets */
    sj_runtime_config_init(&cfg);
    cfg.compile_mode = SJ_COMPILE_OFF, cfg.cache_dir = NULL;
    cfg.nvrtc_flags = "-DA -DB -DC -DD -DE -DF -DG -DH -DI -DJ -DK -DL -DM -DN -DO -DP -DQ";
    assert_int_equal(sj_runtime_create(&cfg, &r), SJ_EINVAL);
    assert_null(r);
    assert_msg_has("sj_runtime_create: nvrtc_flags: more than 16 options");
    cfg.nvrtc_flags = "-DA -DB -DC -DD -DE -DF -DG -DH -DI -DJ -DK -DL -DM -DN -DO -DP";
    assert_int_equal(sj_runtime_create(&cfg, &r), SJ_OK);
    sj_runtime_destroy(r);
    r = NULL;
    sj_runtime_destroy(NULL); /* no-op */
    sj_fn_destroy(NULL);
}

static void test_runtime_cuda_unavailable(void **state) {
    sj_runtime_config cfg;
    sj_runtime_config_init(&cfg);
    cfg.compile_mode = SJ_COMPILE_OFF, cfg.cache_dir = NULL;
    cfg.backend = SJ_BACKEND_CUDA;
    sj_runtime *r = NULL;
    assert_int_equal(sj_runtime_create(&cfg, &r), SJ_EBACKEND);
    assert_null(r);
    assert_msg_has("CUDA");
    cfg.backend = SJ_BACKEND_AUTO;
    assert_int_equal(sj_runtime_create(&cfg, &r), SJ_OK);
    assert_int_equal(sj_runtime_backend(r), SJ_BACKEND_CPU);
    sj_runtime_destroy(r);
}

/* The default config with environment variable var set to val (NULL:
 * unset). */
static sj_runtime_config config_with(const char *var, const char *val) {
    if (val) setenv(var, val, 1);
    else unsetenv(var);
    sj_runtime_config cfg;
    sj_runtime_config_init(&cfg);
    return cfg;
}

static void test_config_env(void **state) {
    sj_runtime_config cfg;
    unsetenv("SHAPEJIT_LOG");
    unsetenv("SHAPEJIT_BACKEND");
    sj_runtime_config_init(&cfg);
    cfg.compile_mode = SJ_COMPILE_OFF, cfg.cache_dir = NULL;
    assert_int_equal(cfg.log_mask, SJ_LOG_WARN);
    assert_int_equal(cfg.backend, SJ_BACKEND_AUTO);
    setenv("SHAPEJIT_LOG", "recompiles,guards", 1);
    setenv("SHAPEJIT_BACKEND", "cpu", 1);
    sj_runtime_config_init(&cfg);
    cfg.compile_mode = SJ_COMPILE_OFF, cfg.cache_dir = NULL;
    assert_int_equal(cfg.log_mask, SJ_LOG_RECOMPILES | SJ_LOG_GUARDS);
    assert_int_equal(cfg.backend, SJ_BACKEND_CPU);
    setenv("SHAPEJIT_LOG", "all", 1);
    sj_runtime_config_init(&cfg);
    cfg.compile_mode = SJ_COMPILE_OFF, cfg.cache_dir = NULL;
    assert_int_equal(cfg.log_mask, SJ_LOG_ALL);
    setenv("SHAPEJIT_LOG", "bogus", 1); /* ignored, with a note on stderr */
    setenv("SHAPEJIT_BACKEND", "tpu", 1);
    sj_runtime_config_init(&cfg);
    cfg.compile_mode = SJ_COMPILE_OFF, cfg.cache_dir = NULL;
    assert_int_equal(cfg.log_mask, SJ_LOG_WARN);
    assert_int_equal(cfg.backend, SJ_BACKEND_AUTO);
    unsetenv("SHAPEJIT_LOG");
    unsetenv("SHAPEJIT_BACKEND");
    /* streaming stores: default 0 (the cache size), -1 never, junk ignored */
    const char *sm = "SHAPEJIT_STREAM_MIN_BYTES";
    assert_int_equal(config_with(sm, NULL).stream_min_bytes, 0);
    assert_int_equal(config_with(sm, "-1").stream_min_bytes, -1);
    assert_true(config_with(sm, "68719476736").stream_min_bytes == INT64_C(68719476736));
    assert_int_equal(config_with(sm, "12MB").stream_min_bytes, 0);
    /* BLAS threads: default 0 (ours), -1 leave OpenBLAS alone, below -1 ignored */
    const char *bt = "SHAPEJIT_BLAS_THREADS";
    assert_int_equal(config_with(bt, NULL).blas_threads, 0);
    assert_int_equal(config_with(bt, "4").blas_threads, 4);
    assert_int_equal(config_with(bt, "-1").blas_threads, -1);
    assert_int_equal(config_with(bt, "-2").blas_threads, 0);
    /* CUDA graphs: default 64, 0 none, negative ignored */
    const char *cg = "SHAPEJIT_CUDA_GRAPHS";
    assert_int_equal(config_with(cg, NULL).cuda_graphs, 64);
    assert_int_equal(config_with(cg, "0").cuda_graphs, 0);
    assert_int_equal(config_with(cg, "200").cuda_graphs, 200);
    assert_int_equal(config_with(cg, "-3").cuda_graphs, 64);
    /* NVRTC options: taken as given (checked by sj_runtime_create) */
    const char *nf = "SHAPEJIT_NVRTC_FLAGS";
    assert_null(config_with(nf, NULL).nvrtc_flags);
    assert_null(config_with(nf, "").nvrtc_flags);
    assert_string_equal(config_with(nf, "-Xptxas=-O1 -DX").nvrtc_flags, "-Xptxas=-O1 -DX");
    unsetenv(nf);
    unsetenv(sm);
    unsetenv(bt);
    unsetenv(cg);
}

typedef struct log_sink {
    int lines;
    unsigned topics;
    char last[256];
} log_sink;

static void sink_fn(void *user, unsigned topic, const char *msg) {
    log_sink *s = user;
    s->lines++;
    s->topics |= topic;
    snprintf(s->last, sizeof s->last, "%s", msg);
}

static void test_log_callback(void **state) {
    sj_runtime_config cfg;
    sj_runtime_config_init(&cfg);
    cfg.compile_mode = SJ_COMPILE_OFF, cfg.cache_dir = NULL;
    log_sink sink = {0};
    cfg.log_mask = SJ_LOG_TRACE;
    cfg.log_fn = sink_fn;
    cfg.log_user = &sink;
    sj_runtime *r;
    assert_int_equal(sj_runtime_create(&cfg, &r), SJ_OK);
    sj_fn *fn;
    assert_int_equal(sj_fn_create(r, "logged", 1, affine_model, NULL, NULL, &fn), SJ_OK);
    float x[4] = {1, 2, 3, 4}, y[4];
    sj_tensor in = f32(x, 1, (int64_t[]){4}), out = f32(y, 1, (int64_t[]){4});
    assert_int_equal(sj_call(fn, &in, 1, &out, 1), SJ_OK);
    assert_int_equal(sink.lines, 1);
    assert_int_equal(sink.topics, SJ_LOG_TRACE);
    assert_non_null(strstr(sink.last, "logged"));
    assert_int_equal(sj_call(fn, &in, 1, &out, 1), SJ_OK); /* memo hit: no new trace line */
    assert_int_equal(sink.lines, 1);
    sj_runtime_destroy(r); /* destroys fn too */
}

typedef struct counting_alloc {
    int allocs, frees;
} counting_alloc;

static void *ca_alloc(void *u, size_t n, size_t align) {
    ((counting_alloc *)u)->allocs++;
    return aligned_alloc(align, (n + align - 1) / align * align);
}
static void ca_free(void *u, void *p) {
    ((counting_alloc *)u)->frees++;
    free(p);
}

static void test_allocator_and_runtime_outputs(void **state) {
    counting_alloc ca = {0};
    sj_runtime_config cfg;
    sj_runtime_config_init(&cfg);
    cfg.compile_mode = SJ_COMPILE_OFF, cfg.cache_dir = NULL;
    cfg.allocator = (sj_allocator){ca_alloc, ca_free, &ca};
    sj_runtime *r;
    assert_int_equal(sj_runtime_create(&cfg, &r), SJ_OK);
    sj_fn *fn;
    assert_int_equal(sj_fn_create(r, "alloc", 1, affine_model, NULL, NULL, &fn), SJ_OK);
    float x[6] = {1, 2, 3, 4, 5, 6};
    sj_tensor in = f32(x, 2, (int64_t[]){2, 3});
    sj_tensor out = {0};
    assert_int_equal(sj_call(fn, &in, 1, &out, 1), SJ_OK);
    assert_non_null(out.data);
    assert_int_equal(out.dtype, SJ_F32);
    assert_int_equal(out.rank, 2);
    assert_int_equal(out.shape[0], 2);
    assert_int_equal(out.shape[1], 3);
    assert_int_equal(out.stride[0], 3);
    assert_int_equal(out.stride[1], 1);
    for (int i = 0; i < 6; i++) assert_float_equal(((float *)out.data)[i], x[i] * 2 + 1, 1e-6);
    sj_tensor_free(r, &out);
    assert_null(out.data);
    sj_tensor_free(r, &out); /* no-op */
    sj_tensor_free(r, NULL);
    sj_fn_destroy(fn);
    sj_runtime_destroy(r);
    assert_true(ca.allocs > 0);
    assert_int_equal(ca.allocs, ca.frees);
}

/* After warm-up, a call that hits the memo allocates nothing through the
 * runtime (arenas come from the pool, outputs are the caller's). */
static void test_no_allocation_on_hit(void **state) {
    counting_alloc ca = {0};
    for (int mode = 0; mode < 2; mode++) { /* eager, then fused (compiled synchronously when hot) */
    sj_runtime_config cfg;
    sj_runtime_config_init(&cfg);
    cfg.compile_mode = mode ? SJ_COMPILE_SYNC : SJ_COMPILE_OFF, cfg.cache_dir = NULL;
    cfg.allocator = (sj_allocator){ca_alloc, ca_free, &ca};
    sj_runtime *r;
    assert_int_equal(sj_runtime_create(&cfg, &r), SJ_OK);
    sj_fn *fn;
    assert_int_equal(sj_fn_create(r, "hit", 1, affine_model, NULL, NULL, &fn), SJ_OK);
    float x[8] = {1, 2, 3, 4, 5, 6, 7, 8}, y[8];
    sj_tensor in = f32(x, 1, (int64_t[]){8}), out = f32(y, 1, (int64_t[]){8});
    for (int i = 0; i < 3; i++) assert_int_equal(sj_call(fn, &in, 1, &out, 1), SJ_OK);
    int warm = ca.allocs;
    for (int i = 0; i < 1000; i++) assert_int_equal(sj_call(fn, &in, 1, &out, 1), SJ_OK);
    assert_int_equal(ca.allocs, warm);
    sj_stats s;
    sj_fn_stats(fn, &s);
    assert_int_equal(s.memo_hits, 1002);
    assert_int_equal(mode ? s.fused_specialized_calls : s.eager_calls, mode ? 1002 : 1003);
    sj_fn_destroy(fn);
    sj_runtime_destroy(r);
    assert_int_equal(ca.allocs, ca.frees);
    }
}

/* -- Function and call arguments --------------------------------------------------- */

static void test_fn_create_args(void **state) {
    sj_fn *fn = (sj_fn *)0x1;
    assert_int_equal(sj_fn_create(NULL, "x", 1, affine_model, NULL, NULL, &fn), SJ_EINVAL);
    assert_null(fn);
    assert_int_equal(sj_fn_create(rt, "x", 1, NULL, NULL, NULL, &fn), SJ_EINVAL);
    assert_msg_has("model");
    assert_int_equal(sj_fn_create(rt, "x", -1, affine_model, NULL, NULL, &fn), SJ_EINVAL);
    assert_int_equal(sj_fn_create(rt, "x", SJ_MAX_INPUTS + 1, affine_model, NULL, NULL, &fn), SJ_EINVAL);
    assert_msg_has("n_inputs");
    assert_int_equal(sj_fn_create(rt, "x", 1, affine_model, NULL, NULL, NULL), SJ_EINVAL);
    assert_int_equal(sj_fn_create(rt, NULL, 1, affine_model, NULL, NULL, &fn), SJ_OK); /* name defaults */
    sj_fn_destroy(fn);
}

static void test_call_bad_arguments_then_good(void **state) {
    sj_fn *fn = make_fn("args", 1, affine_model, NULL);
    float x[4] = {1, 2, 3, 4}, y[4];
    sj_tensor in = f32(x, 1, (int64_t[]){4}), out = f32(y, 1, (int64_t[]){4});

    assert_int_equal(sj_call(NULL, &in, 1, &out, 1), SJ_EINVAL);
    assert_int_equal(sj_call(fn, &in, 2, &out, 1), SJ_EINVAL);
    assert_msg_has("called with 2 inputs, expected 1");
    check_affine(fn, 4);
    assert_int_equal(sj_call(fn, NULL, 1, &out, 1), SJ_EINVAL);
    assert_msg_has("inputs is NULL");
    check_affine(fn, 4);
    assert_int_equal(sj_call(fn, &in, 1, NULL, 1), SJ_EINVAL);
    assert_int_equal(sj_call(fn, &in, 1, &out, -1), SJ_EINVAL);

    sj_tensor bad = in;
    bad.dtype = (sj_dtype)99;
    assert_int_equal(sj_call(fn, &bad, 1, &out, 1), SJ_EINVAL);
    assert_msg_has("input 0: dtype 99");
    bad = in;
    bad.rank = SJ_MAX_RANK + 1;
    assert_int_equal(sj_call(fn, &bad, 1, &out, 1), SJ_EINVAL);
    assert_msg_has("rank 9");
    bad = in;
    bad.stride[0] = -1;
    assert_int_equal(sj_call(fn, &bad, 1, &out, 1), SJ_EINVAL);
    assert_msg_has("stride -1 at axis 0");
    bad = in;
    bad.shape[0] = -3;
    assert_int_equal(sj_call(fn, &bad, 1, &out, 1), SJ_EINVAL);
    assert_msg_has("size -3 at axis 0");
    bad = in;
    bad.data = NULL;
    assert_int_equal(sj_call(fn, &bad, 1, &out, 1), SJ_EINVAL);
    assert_msg_has("data is NULL");
    bad = in;
    bad.device = SJ_CUDA;
    assert_int_equal(sj_call(fn, &bad, 1, &out, 1), SJ_EINVAL);
    assert_msg_has("device memory");
    sj_tensor bad_rank = sj_tensor_make(x, SJ_F32, SJ_MAX_RANK + 2, (int64_t[]){1});
    assert_int_equal(bad_rank.rank, -1);
    assert_int_equal(sj_call(fn, &bad_rank, 1, &out, 1), SJ_EINVAL);

    check_affine(fn, 4);
    sj_stats s;
    sj_fn_stats(fn, &s);
    assert_int_equal(s.traces, 1); /* no bad call made an entry */
    assert_int_equal(s.entries, 1);
    assert_true(s.errors >= 10);
    sj_fn_destroy(fn);
}

static void test_output_checks(void **state) {
    sj_fn *fn = make_fn("outs", 1, affine_model, NULL);
    float x[6] = {1, 2, 3, 4, 5, 6}, y[8];
    sj_tensor in = f32(x, 2, (int64_t[]){2, 3});
    sj_tensor out = f32(y, 2, (int64_t[]){2, 4});
    assert_int_equal(sj_call(fn, &in, 1, &out, 1), SJ_ESHAPE);
    assert_msg_has("output 0 size mismatch at axis 1: expected 3, actual 4");
    out = f32(y, 1, (int64_t[]){6});
    assert_int_equal(sj_call(fn, &in, 1, &out, 1), SJ_ESHAPE);
    assert_msg_has("rank 1, expected 2");
    out = sj_tensor_make(y, SJ_I32, 2, (int64_t[]){2, 3});
    assert_int_equal(sj_call(fn, &in, 1, &out, 1), SJ_EDTYPE);
    assert_msg_has("dtype i32, expected f32");
    sj_tensor two[2] = {f32(y, 2, (int64_t[]){2, 3}), {0}};
    assert_int_equal(sj_call(fn, &in, 1, two, 2), SJ_EINVAL);
    assert_msg_has("2 outputs, the model produces 1");
    assert_null(two[1].data);

    /* strided caller output: write into every other column of a [2, 6] buffer */
    float wide[12];
    for (int i = 0; i < 12; i++) wide[i] = -99.0f;
    sj_tensor so = {.data = wide, .dtype = SJ_F32, .rank = 2, .shape = {2, 3}, .stride = {6, 2}};
    assert_int_equal(sj_call(fn, &in, 1, &so, 1), SJ_OK);
    for (int r = 0; r < 2; r++)
        for (int c = 0; c < 6; c++) {
            float want = c % 2 ? -99.0f : x[r * 3 + c / 2] * 2 + 1;
            assert_float_equal(wide[r * 6 + c], want, 1e-6);
        }
    sj_fn_destroy(fn);
}

/* -- Tracing errors ---------------------------------------------------------------- */

static void test_trace_shape_error_then_good(void **state) {
    sj_fn *fn = make_fn("bcast", 2, add_model, NULL);
    float a[12], b[12], y[12];
    fill(a, 12, 0.1f);
    fill(b, 12, 0.9f);
    sj_tensor in[2] = {f32(a, 2, (int64_t[]){3, 4}), f32(b, 2, (int64_t[]){3, 3})};
    sj_tensor out = {0};
    assert_int_equal(sj_call(fn, in, 2, &out, 1), SJ_ESHAPE);
    assert_msg_has("fn 'bcast'");
    assert_msg_has("add(f32[3, 4], f32[3, 3])");
    assert_msg_has("axis 1: 4 vs 3");
    assert_null(out.data);

    in[1] = f32(b, 1, (int64_t[]){4}); /* row broadcast: valid */
    sj_tensor o = f32(y, 2, (int64_t[]){3, 4});
    assert_int_equal(sj_call(fn, in, 2, &o, 1), SJ_OK);
    for (int r = 0; r < 3; r++)
        for (int c = 0; c < 4; c++) assert_float_equal(y[r * 4 + c], a[r * 4 + c] + b[c], 1e-6);
    sj_stats s;
    sj_fn_stats(fn, &s);
    assert_int_equal(s.trace_errors, 1);
    assert_int_equal(s.traces, 1);
    assert_int_equal(s.entries, 1);
    sj_fn_destroy(fn);
}

static void test_trace_dtype_error(void **state) {
    sj_fn *fn = make_fn("dt", 2, add_model, NULL);
    float a[4] = {1, 2, 3, 4};
    int32_t b[4] = {1, 2, 3, 4};
    sj_tensor in[2] = {f32(a, 1, (int64_t[]){4}), sj_tensor_make(b, SJ_I32, 1, (int64_t[]){4})};
    sj_tensor out = {0};
    assert_int_equal(sj_call(fn, in, 2, &out, 1), SJ_EDTYPE);
    assert_msg_has("sj_cast");
    sj_fn_destroy(fn);
}

static sj_status rejecting_model(sj_tracer *t, const sj_val *in, int n, void *u) {
    int64_t len = sj_size(t, in[0], 0);
    if (len > 4) return sj_trace_fail(t, SJ_ECONSTRAINT, "sequence length %lld exceeds 4", (long long)len);
    return sj_output(t, sj_neg(t, in[0]));
}

static sj_status silent_fail_model(sj_tracer *t, const sj_val *in, int n, void *u) { return SJ_EMODEL; }
static sj_status not_a_status_model(sj_tracer *t, const sj_val *in, int n, void *u) { return (sj_status)999; }
static sj_status null_tracer_model(sj_tracer *t, const sj_val *in, int n, void *u) { return sj_output(NULL, in[0]); }
static sj_status null_fmt_model(sj_tracer *t, const sj_val *in, int n, void *u) {
    const char *fmt = u; /* NULL: through a variable, as a caller's bug would pass it */
#if defined(__clang__)
#pragma clang diagnostic push
#pragma clang diagnostic ignored "-Wformat-security"
#endif
    return sj_trace_fail(t, SJ_ESHAPE, fmt);
#if defined(__clang__)
#pragma clang diagnostic pop
#endif
}
static sj_status no_output_model(sj_tracer *t, const sj_val *in, int n, void *u) {
    sj_neg(t, in[0]);
    return SJ_OK;
}

/* An op error is sticky: later ops and the model's own SJ_OK don't hide it. */
static sj_status sticky_model(sj_tracer *t, const sj_val *in, int n, void *u) {
    sj_val bad = sj_matmul(t, in[0], in[0]); /* [2, 3] @ [2, 3]: inner sizes differ */
    sj_val y = sj_exp(t, bad);
    assert_int_equal(sj_trace_status(t), SJ_ESHAPE);
    sj_output(t, y);
    return SJ_OK;
}

static void test_model_errors(void **state) {
    float x[8] = {1, 2, 3, 4, 5, 6, 7, 8}, y[8];
    sj_fn *fn = make_fn("reject", 1, rejecting_model, NULL);
    sj_tensor in = f32(x, 1, (int64_t[]){8}), out = {0};
    assert_int_equal(sj_call(fn, &in, 1, &out, 1), SJ_ECONSTRAINT);
    assert_msg_has("sequence length 8 exceeds 4");
    in = f32(x, 1, (int64_t[]){3});
    sj_tensor o = f32(y, 1, (int64_t[]){3});
    assert_int_equal(sj_call(fn, &in, 1, &o, 1), SJ_OK);
    assert_float_equal(y[2], -3.0f, 0);
    sj_fn_destroy(fn);

    /* models that fail on their own: the status, and what the message says */
    static const struct {
        const char *name;
        sj_model_fn model;
        sj_status want;
        const char *msg[2];
    } bad[] = {
        {"silent", silent_fail_model, SJ_EMODEL, {"returned SJ_EMODEL"}},
        /* a model bug: a return value that is no sj_status becomes SJ_EMODEL, named */
        {"not_status", not_a_status_model, SJ_EMODEL, {"returned 999, which is not an sj_status"}},
        /* an sj_ function called without the tracer said why; the message keeps it */
        {"null_tracer", null_tracer_model, SJ_EINVAL, {"returned SJ_EINVAL (its last error: ", "sj_output"}},
        {"null_fmt", null_fmt_model, SJ_ESHAPE, {"fmt is NULL"}},
        {"nothing", no_output_model, SJ_EMODEL, {"no outputs"}},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        fn = make_fn(bad[i].name, 1, bad[i].model, NULL);
        assert_int_equal(sj_call(fn, &in, 1, &o, 1), bad[i].want);
        for (int k = 0; k < 2 && bad[i].msg[k]; k++) assert_msg_has(bad[i].msg[k]);
        sj_fn_destroy(fn);
    }

    fn = make_fn("sticky", 1, sticky_model, NULL);
    in = f32(x, 2, (int64_t[]){2, 3});
    assert_int_equal(sj_call(fn, &in, 1, &o, 1), SJ_ESHAPE);
    assert_msg_has("matmul(f32[2, 3], f32[2, 3]): inner sizes differ: 3 vs 2");
    sj_fn_destroy(fn);
}

/* Bad op arguments each give a clear error. */
typedef struct op_case {
    int which;
    sj_status want;
    const char *msg;
} op_case;

static sj_status bad_op_model(sj_tracer *t, const sj_val *in, int n, void *u) {
    const op_case *c = u;
    sj_val x = in[0], r = SJ_NONE;
    switch (c->which) {
    case 0: r = sj_sum(t, x, 5, 0); break;
    case 1: r = sj_permute(t, x, (int[]){0, 0}); break;
    case 2: r = sj_reshape_i(t, x, 2, (int64_t[]){-1, 4}); break;
    case 3: r = sj_reshape_i(t, x, 2, (int64_t[]){-1, -1}); break;
    case 4: r = sj_slice(t, x, 0, 0, 2, 0); break;
    case 5: r = sj_concat(t, (sj_val[]){x, sj_transpose(t, x, 0, 1)}, 2, 0); break;
    case 6: r = sj_gather(t, x, x); break;
    case 7: r = sj_layer_norm(t, x, x, SJ_NONE, 1e-5); break;
    case 8: r = sj_add(t, x, SJ_NONE); break;
    case 9: r = sj_add(t, x, (sj_val){12345}); break;
    case 10: r = sj_exp(t, sj_cast(t, x, SJ_I32)); break;
    case 11: r = sj_attention(t, x, x, x, SJ_NONE, 1.0, 0); break;
    case 12: r = sj_where(t, x, x, x); break;
    case 13: r = sj_mean(t, sj_cast(t, x, SJ_I64), 0, 0); break;
    case 14: r = sj_concat(t, NULL, 0, 0); break;
    case 15: { /* a weight in device memory, on the CPU backend */
        static float w[3] = {1, 2, 3};
        sj_tensor d = sj_tensor_make(w, SJ_F32, 1, (int64_t[]){3});
        d.device = SJ_CUDA;
        r = sj_add(t, x, sj_param(t, &d));
        break;
    }
    }
    return sj_output(t, r);
}

static void test_op_argument_errors(void **state) {
    static const op_case cases[] = {
        {0, SJ_EINVAL, "axis 5 out of range for rank 2"},
        {1, SJ_ESHAPE, "perm repeats axis 0"},
        {2, SJ_ESHAPE, "6 elements do not divide into sizes multiplying to 4"},
        {3, SJ_ESHAPE, "more than one inferred size"},
        {4, SJ_ESHAPE, "step 0 must be >= 1"},
        {5, SJ_ESHAPE, "operand 1 differs at axis 1: 2 vs 3"},
        {6, SJ_EDTYPE, "idx is f32[2, 3], expected i32 or i64"},
        {7, SJ_ESHAPE, "g must be f32[last size of x]"},
        {8, SJ_EINVAL, "operand 'b' is missing"},
        {9, SJ_EINVAL, "not a value of this trace"},
        {10, SJ_EDTYPE, "exp(i32[2, 3]): dtype i32 not supported"},
        {11, SJ_ESHAPE, "rank 4"},
        {12, SJ_EDTYPE, "cond is f32[2, 3], expected bool"},
        {13, SJ_EDTYPE, "expects f32, f16 or bf16"},
        {14, SJ_EINVAL, "0 operands"},
        {15, SJ_EINVAL, "sj_param: w is a device tensor, and this runtime's backend is the CPU"},
    };
    float x[6] = {1, 2, 3, 4, 5, 6}, y[64];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        sj_fn *fn = make_fn("ops", 1, bad_op_model, (void *)&cases[i]);
        sj_tensor in = f32(x, 2, (int64_t[]){2, 3}), out = {0};
        sj_status st = sj_call(fn, &in, 1, &out, 1);
        if (st != cases[i].want) fail_msg("case %d: status %s, want %s: %s", cases[i].which, sj_status_name(st),
                                          sj_status_name(cases[i].want), sj_last_error());
        assert_msg_has(cases[i].msg);
        assert_null(out.data);
        sj_fn_destroy(fn);
    }
    (void)y;
}

/* -- The signature memo ------------------------------------------------------------- */

static void test_memo_by_signature(void **state) {
    sj_fn *fn = make_fn("memo", 1, affine_model, NULL);
    sj_stats s;
    check_affine(fn, 4);
    check_affine(fn, 4);
    check_affine(fn, 4);
    sj_fn_stats(fn, &s);
    assert_int_equal(s.traces, 1);
    assert_int_equal(s.memo_hits, 2);
    check_affine(fn, 5); /* new shape: new trace (AUTO: symbolic in axis 0) */
    check_affine(fn, 4);
    sj_fn_stats(fn, &s);
    assert_int_equal(s.traces, 2);
    assert_int_equal(s.entries, 2);
    assert_int_equal(s.calls, 5);
    assert_int_equal(s.eager_calls, 5);

    /* same sizes, other strides: another signature, still right */
    float buf[16], y[8];
    for (int i = 0; i < 16; i++) buf[i] = (float)i * 0.5f - 2.0f;
    sj_tensor in = {.data = buf, .dtype = SJ_F32, .rank = 1, .shape = {4}, .stride = {3}};
    sj_tensor out = f32(y, 1, (int64_t[]){4});
    assert_int_equal(sj_call(fn, &in, 1, &out, 1), SJ_OK);
    for (int i = 0; i < 4; i++) assert_float_equal(y[i], buf[3 * i] * 2 + 1, 1e-6);
    sj_fn_stats(fn, &s);
    assert_int_equal(s.traces, 3);

    /* explain lists every entry */
    char *text = tu_explain(fn);
    assert_non_null(strstr(text, "fn 'memo'"));
    assert_non_null(strstr(text, "entry 0: static"));
    assert_non_null(strstr(text, "entry 1: symbolic in in0.size(0)")); /* [5] after [4]: AUTO */
    assert_non_null(strstr(text, "entry 2: symbolic in in0.size(0)")); /* strided: a layout guard failed */
    assert_non_null(strstr(text, "input 0 layout mismatch"));
    free(text);
    sj_fn_destroy(fn);
}

/* -- Outputs of every kind ---------------------------------------------------------- */

/* outputs: x itself, a view of x, a computed value twice, a constant */
static sj_status many_outputs_model(sj_tracer *t, const sj_val *in, int n, void *u) {
    sj_val x = in[0];
    sj_val y = sj_exp(t, x);
    sj_output(t, x);
    sj_output(t, sj_transpose(t, x, 0, 1));
    sj_output(t, y);
    sj_output(t, y);
    return sj_output(t, sj_scalar(t, 3.5));
}

static void test_output_kinds(void **state) {
    sj_fn *fn = make_fn("many", 1, many_outputs_model, NULL);
    float x[6] = {0.1f, -0.2f, 0.3f, 0.4f, -0.5f, 0.6f};
    sj_tensor in = f32(x, 2, (int64_t[]){2, 3});
    sj_tensor out[5] = {{0}};
    assert_int_equal(sj_call(fn, &in, 1, out, 5), SJ_OK);
    const float *o0 = out[0].data, *o1 = out[1].data, *o2 = out[2].data, *o3 = out[3].data, *o4 = out[4].data;
    assert_int_equal(out[1].shape[0], 3);
    assert_int_equal(out[1].shape[1], 2);
    assert_int_equal(out[4].rank, 0);
    for (int r = 0; r < 2; r++)
        for (int c = 0; c < 3; c++) {
            assert_float_equal(o0[r * 3 + c], x[r * 3 + c], 0);
            assert_float_equal(o1[c * 2 + r], x[r * 3 + c], 0);
            assert_float_equal(o2[r * 3 + c], expf(x[r * 3 + c]), 1e-6);
            assert_float_equal(o3[r * 3 + c], expf(x[r * 3 + c]), 1e-6);
        }
    assert_float_equal(o4[0], 3.5f, 0);
    for (int i = 0; i < 5; i++) sj_tensor_free(rt, &out[i]);
    sj_fn_destroy(fn);
}

/* -- Data-dependent errors -------------------------------------------------------------- */

static sj_status gather_model(sj_tracer *t, const sj_val *in, int n, void *u) {
    return sj_output(t, sj_gather(t, in[0], in[1]));
}

static void test_gather_index_error_then_good(void **state) {
    sj_fn *fn = make_fn("emb", 2, gather_model, NULL);
    float table[8] = {0, 1, 10, 11, 20, 21, 30, 31};
    int32_t idx[3] = {2, 7, 0};
    sj_tensor in[2] = {f32(table, 2, (int64_t[]){4, 2}), sj_tensor_make(idx, SJ_I32, 1, (int64_t[]){3})};
    sj_tensor out = {0};
    assert_int_equal(sj_call(fn, in, 2, &out, 1), SJ_EINDEX);
    assert_msg_has("fn 'emb'");
    assert_msg_has("index 7");
    assert_null(strstr(sj_last_error(), "gather: gather:")); /* the op named once */
    assert_null(out.data); /* nothing left allocated for the caller */
    idx[1] = 3;
    assert_int_equal(sj_call(fn, in, 2, &out, 1), SJ_OK);
    const float *o = out.data;
    float want[6] = {20, 21, 30, 31, 0, 1};
    for (int i = 0; i < 6; i++) assert_float_equal(o[i], want[i], 0);
    sj_tensor_free(rt, &out);
    sj_fn_destroy(fn);
}

/* -- Sizes in the model ------------------------------------------------------------------- */

/* [B, S, 4] -> [B, S*2, 2] via symbolic dims, plus a reshape with -1 */
static sj_status dims_model(sj_tracer *t, const sj_val *in, int n, void *u) {
    sj_val x = in[0];
    sj_dim d[3] = {sj_dim_of(t, x, 0), sj_dim_mul(t, sj_dim_of(t, x, 1), sj_dim_const(t, 2)), sj_dim_const(t, 2)};
    sj_val y = sj_reshape(t, x, 3, d);
    sj_val z = sj_reshape_i(t, x, 2, (int64_t[]){-1, 4});
    sj_dim half = sj_dim_div(t, sj_dim_of(t, x, 2), sj_dim_const(t, 2));
    sj_val w = sj_reshape(t, x, 4, (sj_dim[]){sj_dim_of(t, x, 0), SJ_DIM_INFER, half, sj_dim_const(t, 2)});
    assert_int_equal(sj_val_rank(t, w), 4);
    assert_int_equal(sj_val_dtype(t, w), SJ_F32);
    assert_int_equal(sj_size(t, y, -2), 2 * sj_size(t, x, 1));
    sj_output(t, y);
    sj_output(t, w);
    return sj_output(t, z);
}

static void test_dims_and_reshape(void **state) {
    sj_fn *fn = make_fn("dims", 1, dims_model, NULL);
    float x[24];
    fill(x, 24, 0.3f);
    sj_tensor in = f32(x, 3, (int64_t[]){2, 3, 4});
    sj_tensor out[3] = {{0}};
    assert_int_equal(sj_call(fn, &in, 1, out, 3), SJ_OK);
    assert_int_equal(out[0].rank, 3);
    assert_int_equal(out[0].shape[1], 6);
    assert_int_equal(out[0].shape[2], 2);
    assert_int_equal(out[1].shape[1], 3);
    assert_int_equal(out[2].shape[0], 6);
    for (int i = 0; i < 24; i++) {
        assert_float_equal(((float *)out[0].data)[i], x[i], 0);
        assert_float_equal(((float *)out[1].data)[i], x[i], 0);
        assert_float_equal(((float *)out[2].data)[i], x[i], 0);
    }
    for (int i = 0; i < 3; i++) sj_tensor_free(rt, &out[i]);
    sj_fn_destroy(fn);
}

/* -- Sizes past the element limit (2^48) --------------------------------------------------- */

static sj_status huge_reshape_model(sj_tracer *t, const sj_val *in, int n, void *u) {
    const int64_t *dims = u; /* rank 2 or 3 (a -1 last) */
    return sj_output(t, sj_reshape_i(t, in[0], dims[2] ? 3 : 2, dims));
}

static void test_sizes_past_the_limit(void **state) {
    float x[8];
    fill(x, 8, 0.4f);
    /* descriptors: no overflow building them, a clear error using them */
    sj_tensor big = f32(x, 2, (int64_t[]){INT64_MAX, 2});
    assert_true(big.rank == 2 && big.stride[1] == 1 && big.stride[0] == 2);
    sj_fn *fn = make_fn("huge", 1, affine_model, NULL);
    assert_int_equal(sj_call(fn, &big, 1, NULL, 0), SJ_EINVAL);
    /* an empty tensor whose other sizes multiply past 2^48: its output's
     * strides would overflow, so it is refused too */
    sj_tensor empty = f32(x, 3, (int64_t[]){0, 1, 2});
    empty.shape[1] = INT64_MAX;
    sj_tensor out = {0};
    assert_int_equal(sj_call(fn, &empty, 1, &out, 1), SJ_EINVAL);
    assert_msg_has("input 0: too many elements: the sizes multiply past 2^48 at axis 1");
    assert_null(out.data);
    empty.shape[1] = 1 << 20; /* a legal empty tensor: an empty result */
    assert_int_equal(sj_call(fn, &empty, 1, &out, 1), SJ_OK);
    assert_true(out.rank == 3 && out.shape[0] == 0 && out.shape[1] == 1 << 20 && out.stride[0] == 2 << 20);
    sj_tensor_free(rt, &out);
    check_affine(fn, 8);

    /* sj_tensor_alloc: a rank past 8 is an error and writes nothing */
    sj_tensor r10 = {.dtype = SJ_F32, .rank = 10, .shape = {1, 1}, .stride = {7, 7}};
    assert_int_equal(sj_tensor_alloc(rt, &r10), SJ_EINVAL);
    assert_msg_has("rank 10 out of range");
    assert_true(r10.stride[0] == 7 && r10.stride[1] == 7 && !r10.data);
    sj_fn_destroy(fn);

    /* a reshape to sizes whose product wraps int64 */
    static const int64_t wrap1[3] = {(INT64_C(1) << 62) + 1, 4, 0}, wrap2[3] = {INT64_MAX / 2, 4, -1};
    const int64_t *cases[2] = {wrap1, wrap2};
    for (int i = 0; i < 2; i++) {
        fn = make_fn("reshape_wrap", 1, huge_reshape_model, (void *)cases[i]);
        sj_tensor in = f32(x, 1, (int64_t[]){4});
        out = (sj_tensor){0};
        assert_int_equal(sj_call(fn, &in, 1, &out, 1), SJ_ESHAPE);
        assert_msg_has("reshape: the result's size at axis 0 would be");
        assert_null(out.data);
        sj_fn_destroy(fn);
    }

    /* a bucket multiple past 2^48 is refused; the function keeps its sizes */
    fn = make_fn("bucket_mult", 1, affine_model, NULL);
    assert_int_equal(sj_set_buckets_multiple(fn, 0, 0, INT64_MAX), SJ_EINVAL);
    assert_msg_has("multiple 9223372036854775807 out of range [1, 2^48]");
    assert_int_equal(sj_set_buckets_multiple(fn, 0, 0, INT64_C(1) << 48), SJ_OK);
    check_affine(fn, 5);
    check_affine(fn, 8);
    sj_fn_destroy(fn);

    /* host copies may overlap (memmove) */
    float buf[10];
    for (int i = 0; i < 10; i++) buf[i] = (float)i + 0.5f;
    sj_tensor src = f32(buf, 1, (int64_t[]){6}), dst = f32(buf + 2, 1, (int64_t[]){6});
    assert_int_equal(sj_tensor_copy(rt, &dst, &src), SJ_OK);
    for (int i = 0; i < 10; i++) assert_float_equal(buf[i], i < 2 || i >= 8 ? (float)i + 0.5f : (float)(i - 2) + 0.5f, 0);
}

/* The fused path (kernels ready) reports errors as the eager path does: a
 * caller's output with an invalid rank is named, not read out of bounds; a
 * gather index out of range names the op once. The function keeps serving. */
static void test_fused_path_errors(void **state) {
    sj_runtime *r2;
    assert_int_equal(quiet_runtime(SJ_COMPILE_SYNC, &r2), SJ_OK);
    sj_fn *fn, *fg;
    assert_int_equal(sj_fn_create(r2, "fused_out", 1, affine_model, NULL, NULL, &fn), SJ_OK);
    assert_int_equal(sj_fn_create(r2, "fused_emb", 2, gather_model, NULL, NULL, &fg), SJ_OK);
    float x[6], y[6], table[8] = {0, 1, 10, 11, 20, 21, 30, 31};
    int32_t idx[3] = {2, 3, 0};
    fill(x, 6, 0.2f);
    sj_tensor in = f32(x, 1, (int64_t[]){6}), out = f32(y, 1, (int64_t[]){6});
    sj_tensor gin[2] = {f32(table, 2, (int64_t[]){4, 2}), sj_tensor_make(idx, SJ_I32, 1, (int64_t[]){3})};
    sj_tensor gout = {0};
    for (int i = 0; i < 3; i++) {
        assert_int_equal(sj_call(fn, &in, 1, &out, 1), SJ_OK);
        assert_int_equal(sj_call(fg, gin, 2, &gout, 1), SJ_OK);
        sj_tensor_free(r2, &gout);
    }
    sj_stats st, sg;
    sj_fn_stats(fn, &st);
    sj_fn_stats(fg, &sg);
    if (st.fused_specialized_calls + st.fused_symbolic_calls == 0 ||
        sg.fused_specialized_calls + sg.fused_symbolic_calls == 0) {
        /* no C compiler here: the fused path cannot be reached */
        sj_fn_destroy(fn);
        sj_fn_destroy(fg);
        sj_runtime_destroy(r2);
        skip();
    }
    out.rank = 12;
    assert_int_equal(sj_call(fn, &in, 1, &out, 1), SJ_ESHAPE);
    assert_msg_has("output 0 has rank 12, expected 1");
    out.rank = 1;
    assert_int_equal(sj_call(fn, &in, 1, &out, 1), SJ_OK);
    for (int i = 0; i < 6; i++) assert_float_equal(y[i], x[i] * 2 + 1, 1e-6);

    uint64_t fused0 = sg.fused_specialized_calls + sg.fused_symbolic_calls;
    idx[1] = 7; /* the same signature: the same (fused) code as the good calls */
    assert_int_equal(sj_call(fg, gin, 2, &gout, 1), SJ_EINDEX);
    assert_msg_has("fn 'fused_emb': gather: index 7 out of range");
    assert_null(gout.data);
    idx[1] = 3;
    assert_int_equal(sj_call(fg, gin, 2, &gout, 1), SJ_OK);
    assert_float_equal(((float *)gout.data)[2], 30.0f, 0);
    sj_tensor_free(r2, &gout);
    sj_fn_stats(fg, &sg);
    assert_true(sg.fused_specialized_calls + sg.fused_symbolic_calls == fused0 + 1); /* the fused path, still */
    sj_fn_destroy(fn);
    sj_fn_destroy(fg);
    sj_runtime_destroy(r2);
}

/* sum(a @ b, -1) and sum(a * b, -1) for a [n, 1], b [1, m]: each result
 * grows as n * m from inputs of n and m elements. */
static sj_status outer_model(sj_tracer *t, const sj_val *in, int n, void *u) {
    sj_val p = u ? sj_matmul(t, in[0], in[1]) : sj_mul(t, in[0], in[1]);
    return sj_output(t, sj_sum(t, sj_exp(t, p), -1, 0));
}

/* Valid inputs whose broadcast or matrix product would pass 2^48 elements
 * (sizes whose products wrap int64 on the way to an arena size) are refused
 * per signature by an entry that otherwise serves them, on the eager and
 * the fused path; the function keeps serving, and the refusal is not
 * memoised as a pass. */
static void test_results_past_the_limit(void **state) {
    sj_runtime *r2;
    assert_int_equal(quiet_runtime(SJ_COMPILE_SYNC, &r2), SJ_OK);
    sj_runtime *rts[2] = {rt, r2};
    float a[5], b[7];
    fill(a, 5, 0.1f);
    fill(b, 7, -0.2f);
    for (int r = 0; r < 2; r++) {
        for (int mm = 0; mm < 2; mm++) {
            sj_fn *fn;
            assert_int_equal(sj_fn_create(rts[r], mm ? "outer_mm" : "outer_mul", 2, outer_model, mm ? a : NULL,
                                          NULL, &fn), SJ_OK);
            /* two sizes of each: a symbolic entry; then hot enough to compile */
            for (int k = 0; k < 6; k++) {
                int64_t n = 4 + k % 2, m = 6 + k % 2;
                sj_tensor in[2] = {f32(a, 2, (int64_t[]){n, 1}), f32(b, 2, (int64_t[]){1, m})}, out = {0};
                assert_int_equal(sj_call(fn, in, 2, &out, 1), SJ_OK);
                for (int i = 0; i < n; i++) {
                    double want = 0;
                    for (int j = 0; j < m; j++) want += exp((double)a[i] * b[j]);
                    assert_float_equal(((float *)out.data)[i], want, 1e-5 * want);
                }
                sj_tensor_free(rts[r], &out);
            }
            sj_stats s0;
            sj_fn_stats(fn, &s0);
            assert_int_equal(s0.symbolic_entries, 1);
            /* 2^31 * 2^31 f32 is 2^64 bytes: an arena size of 0 if it wrapped */
            int64_t big = INT64_C(1) << 31;
            for (int rep = 0; rep < 2; rep++) { /* the second time: the same signature again */
                sj_tensor in[2] = {f32(a, 2, (int64_t[]){big, 1}), f32(b, 2, (int64_t[]){1, big})}, out = {0};
                assert_int_equal(sj_call(fn, in, 2, &out, 1), SJ_ESHAPE);
                assert_msg_has(mm ? "matmul: for these inputs the result would be f32[2147483648, 2147483648], more than 2^48 elements at axis 1"
                                  : "mul: for these inputs the result would be f32[2147483648, 2147483648], more than 2^48 elements at axis 1");
                assert_null(out.data);
            }
            sj_stats s1;
            sj_fn_stats(fn, &s1);
            assert_int_equal(s1.symbolic_entries + s1.static_entries, s0.symbolic_entries + s0.static_entries);
            assert_int_equal(s1.errors, s0.errors + 2);
            /* and it still serves, on the path it served before */
            sj_tensor in[2] = {f32(a, 2, (int64_t[]){5, 1}), f32(b, 2, (int64_t[]){1, 7})}, out = {0};
            assert_int_equal(sj_call(fn, in, 2, &out, 1), SJ_OK);
            double want = 0;
            for (int j = 0; j < 7; j++) want += exp((double)a[4] * b[j]);
            assert_float_equal(((float *)out.data)[4], want, 1e-5 * want);
            sj_tensor_free(rts[r], &out);
            sj_stats s2;
            sj_fn_stats(fn, &s2);
            assert_int_equal(s2.eager_calls, s0.eager_calls + (s0.eager_calls == s0.calls ? 1 : 0));
            sj_fn_destroy(fn);
        }
    }
    sj_runtime_destroy(r2);
}

/* -- Concurrency ------------------------------------------------------------------------- */

typedef struct worker {
    sj_fn *fn;
    int id, failures;
} worker;

static void *worker_main(void *arg) {
    worker *w = arg;
    for (int it = 0; it < 300; it++) {
        int n = 1 + (w->id * 7 + it) % 13; /* several shapes, shared between threads */
        float x[16], y[16];
        for (int i = 0; i < n; i++) x[i] = (float)(w->id + 1) * 0.01f * (float)(i + it % 5) - 0.3f;
        sj_tensor in = f32(x, 1, (int64_t[]){n}), out = f32(y, 1, (int64_t[]){n});
        if (sj_call(w->fn, &in, 1, &out, 1) != SJ_OK) {
            w->failures++;
            continue;
        }
        for (int i = 0; i < n; i++)
            if (fabsf(y[i] - (x[i] * 2 + 1)) > 1e-6f) w->failures++;
    }
    return NULL;
}

static void test_concurrent_calls(void **state) {
    sj_fn_options o;
    sj_fn_options_init(&o);
    o.dynamic = SJ_DYNAMIC_STATIC;
    o.recompile_limit = 64;
    sj_fn *fn = NULL;
    assert_int_equal(sj_fn_create(rt, "threads", 1, affine_model, NULL, &o, &fn), SJ_OK);
    pthread_t th[8];
    worker w[8];
    for (int i = 0; i < 8; i++) {
        w[i] = (worker){fn, i, 0};
        assert_int_equal(pthread_create(&th[i], NULL, worker_main, &w[i]), 0);
    }
    for (int i = 0; i < 8; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(w[i].failures, 0);
    }
    sj_stats s;
    sj_fn_stats(fn, &s);
    assert_int_equal(s.calls, 8 * 300);
    assert_int_equal(s.traces, 13); /* each shape traced exactly once */
    assert_int_equal(s.entries, 13);
    sj_fn_destroy(fn);
}

static void test_names(void **state) {
    assert_string_equal(sj_status_name(SJ_ESHAPE), "SJ_ESHAPE");
    assert_string_equal(sj_status_name((sj_status)999), "SJ_E?");
    assert_string_equal(sj_dtype_name(SJ_BF16), "bf16");
    assert_string_equal(sj_dtype_name((sj_dtype)77), "?");
    assert_int_equal(sj_dtype_size(SJ_I64), 8);
    assert_int_equal(sj_dtype_size(SJ_BOOL), 1);
    assert_int_equal(sj_dtype_size((sj_dtype)-1), 0);
    sj_tensor t = sj_tensor_make(NULL, SJ_F16, 3, (int64_t[]){2, 0, 5});
    assert_int_equal(sj_tensor_numel(&t), 0);
    assert_int_equal(t.stride[0], 5);
    assert_int_equal(sj_tensor_numel(NULL), 0);
}

/* sj_tensor_alloc / sj_tensor_copy / sj_tensor_free on the CPU runtime:
 * a round trip, and every bad argument a clear error that changes nothing. */
static void test_tensor_helpers(void **state) {
    sj_tensor a = {.dtype = SJ_F32, .rank = 2, .shape = {3, 5}, .stride = {7, 7}};
    assert_int_equal(sj_tensor_alloc(rt, &a), SJ_OK);
    assert_non_null(a.data);
    assert_true(a.stride[0] == 5 && a.stride[1] == 1); /* made contiguous */
    float src[15], back[15];
    for (int i = 0; i < 15; i++) src[i] = 0.25f * (float)i - 1.5f;
    sj_tensor hs = f32(src, 2, (int64_t[]){3, 5}), hb = f32(back, 2, (int64_t[]){3, 5});
    assert_int_equal(sj_tensor_copy(rt, &a, &hs), SJ_OK);
    assert_int_equal(sj_tensor_copy(rt, &hb, &a), SJ_OK);
    assert_memory_equal(src, back, sizeof src);

    /* shape, dtype, layout and device errors name what is wrong */
    sj_tensor wrong = f32(back, 2, (int64_t[]){5, 3});
    assert_int_equal(sj_tensor_copy(rt, &wrong, &a), SJ_ESHAPE);
    assert_msg_has("size mismatch at axis 0: 3 vs 5");
    /* dtypes may differ: converted as sj_cast does */
    int32_t iv[15];
    sj_tensor ints = sj_tensor_make(iv, SJ_I32, 2, (int64_t[]){3, 5});
    assert_int_equal(sj_tensor_copy(rt, &ints, &a), SJ_OK);
    for (int i = 0; i < 15; i++) assert_int_equal(iv[i], (int32_t)src[i]); /* toward zero */
    uint16_t hv[15], bv[15];
    float fv[15];
    sj_tensor h16 = sj_tensor_make(hv, SJ_F16, 2, (int64_t[]){3, 5}), b16 = sj_tensor_make(bv, SJ_BF16, 2, (int64_t[]){3, 5});
    sj_tensor f32b = f32(fv, 2, (int64_t[]){3, 5});
    assert_int_equal(sj_tensor_copy(rt, &h16, &hs), SJ_OK);
    assert_int_equal(sj_tensor_copy(rt, &b16, &h16), SJ_OK);
    assert_int_equal(sj_tensor_copy(rt, &f32b, &b16), SJ_OK);
    for (int i = 0; i < 15; i++) {
        assert_int_equal(hv[i], tu_f32_to_f16_ref(src[i]));
        assert_true(fv[i] == src[i]); /* quarter steps survive f16 and bf16 */
    }
    uint8_t bools[15];
    sj_tensor bt = sj_tensor_make(bools, SJ_BOOL, 2, (int64_t[]){3, 5});
    assert_int_equal(sj_tensor_copy(rt, &bt, &hs), SJ_OK);
    for (int i = 0; i < 15; i++) assert_int_equal(bools[i], src[i] != 0.0f);
    sj_tensor tr = hb;
    tr.shape[0] = 5, tr.shape[1] = 3, tr.stride[0] = 1, tr.stride[1] = 5; /* a transposed view */
    sj_tensor a53 = f32(src, 2, (int64_t[]){5, 3});
    assert_int_equal(sj_tensor_copy(rt, &tr, &a53), SJ_EINVAL);
    assert_msg_has("contiguous");
    sj_tensor dev = {.dtype = SJ_F32, .rank = 1, .shape = {4}, .device = SJ_CUDA};
    assert_int_equal(sj_tensor_alloc(rt, &dev), SJ_EINVAL);
    assert_msg_has("device memory asked of a CPU runtime");
    assert_null(dev.data);
    sj_tensor bad = {.dtype = SJ_F32, .rank = 2, .shape = {3, -1}, .stride = {9, 9}};
    assert_int_not_equal(sj_tensor_alloc(rt, &bad), SJ_OK);
    assert_null(bad.data);
    assert_true(bad.stride[0] == 9 && bad.stride[1] == 9); /* unchanged on error */
    assert_int_equal(sj_tensor_alloc(NULL, &a), SJ_EINVAL);

    /* a device pointer handed to a CPU runtime is not freed (nor crashed on) */
    sj_tensor fake = {.data = (void *)(uintptr_t)0x1000, .dtype = SJ_F32, .rank = 1, .shape = {1}, .device = SJ_CUDA};
    sj_tensor_free(rt, &fake);
    assert_non_null(fake.data);
    sj_tensor_free(rt, &a);
    assert_null(a.data);
    sj_tensor_free(rt, &a); /* twice: a no-op */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_runtime_args),
        cmocka_unit_test(test_runtime_cuda_unavailable),
        cmocka_unit_test(test_config_env),
        cmocka_unit_test(test_log_callback),
        cmocka_unit_test(test_allocator_and_runtime_outputs),
        cmocka_unit_test(test_no_allocation_on_hit),
        cmocka_unit_test(test_fn_create_args),
        cmocka_unit_test(test_call_bad_arguments_then_good),
        cmocka_unit_test(test_output_checks),
        cmocka_unit_test(test_trace_shape_error_then_good),
        cmocka_unit_test(test_trace_dtype_error),
        cmocka_unit_test(test_model_errors),
        cmocka_unit_test(test_op_argument_errors),
        cmocka_unit_test(test_memo_by_signature),
        cmocka_unit_test(test_output_kinds),
        cmocka_unit_test(test_gather_index_error_then_good),
        cmocka_unit_test(test_dims_and_reshape),
        cmocka_unit_test(test_sizes_past_the_limit),
        cmocka_unit_test(test_fused_path_errors),
        cmocka_unit_test(test_results_past_the_limit),
        cmocka_unit_test(test_concurrent_calls),
        cmocka_unit_test(test_tensor_helpers),
    };
    return cmocka_run_group_tests_name("api", tests, setup, teardown);
}
