/* The JIT on the CUDA backend, through the public API: every op eagerly on
 * the device against the CPU runtime, fused patterns (static and symbolic)
 * against the CPU and float64, the background compile and hot swap, NVRTC
 * failures, buckets, limits, the stream API, bad input, CUDA graphs,
 * warm-up (first call fused; a graph from the warm-up). Without a CUDA
 * device it prints "skipped: no CUDA device" and passes. */
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
#include <unistd.h>

#include "jit/runtime.h"
#include "jit/shapejit.h"
#include "base/tensor.h"
#include "tests/util.h"
#include "tests/util_encoder.h"
#include "tests/util_graphapi.h"

#ifdef SJ_WITH_CUDA
#include "base/bounded.h"
#include "jit/graphs.h"
#include "kernels/cuda/exec_cuda.h"
#include "kernels/cuda/cuda_dev.h"
#include "kernels/cuda/nvrtc.h"

static sj_runtime *cpu;  /* the reference */

/* A CUDA runtime keeping at most `graphs` CUDA graphs. */
static sj_runtime *gpu_runtime_graphs(sj_compile_mode mode, int graphs) {
    sj_runtime_config cfg = tu_cuda_config();
    cfg.compile_mode = mode;
    cfg.cuda_graphs = graphs;
    sj_runtime *rt = NULL;
    sj_status st = sj_runtime_create(&cfg, &rt);
    if (st) fail_msg("CUDA runtime: %s", sj_last_error());
    return rt;
}

static sj_runtime *gpu_runtime(sj_compile_mode mode) { return gpu_runtime_graphs(mode, 64); }

/* A function `name` of model (n_in inputs) on rt, hot from its first call
 * (the rest of its options the defaults). */
static sj_fn *hot_fn(sj_runtime *rt, const char *name, int n_in, sj_model_fn model) {
    sj_fn_options o;
    sj_fn_options_init(&o);
    o.hot_threshold = 1;
    sj_fn *fn;
    assert_int_equal(sj_fn_create(rt, name, n_in, model, NULL, &o, &fn), SJ_OK);
    return fn;
}

/* A device copy of a host test tensor, layout kept (the whole underlying
 * buffer is copied, so strided views stay views). */
typedef struct dbuf {
    sj_tensor t;
    CUdeviceptr base;
} dbuf;

static int64_t extent_elems(const sj_tensor *t) {
    int64_t e = 1;
    for (int i = 0; i < t->rank; i++) {
        if (t->shape[i] == 0) return 0;
        e += (t->shape[i] - 1) * t->stride[i];
    }
    return e;
}

static dbuf to_dev(sj_runtime *rt, const sj_tensor *h) {
    dbuf d = {*h, 0};
    size_t es = sj_dtype_size(h->dtype), bytes = (size_t)extent_elems(h) * es;
    d.base = sj_cuda_alloc(sj_cuda_of(rt->backend), bytes ? bytes : 16, sj_cuda_of(rt->backend)->stream);
    assert_true(d.base != 0);
    if (bytes) assert_int_equal(sj_cuda_to_device(sj_cuda_of(rt->backend), d.base, h->data, bytes), SJ_OK);
    d.t.data = (void *)(uintptr_t)d.base;
    d.t.device = SJ_CUDA;
    return d;
}

static void free_dev(sj_runtime *rt, dbuf *d) { sj_cuda_free(sj_cuda_of(rt->backend), d->base, sj_cuda_of(rt->backend)->stream); }

/* A device output back on the host (contiguous), as a tu tensor. */
static sj_tensor to_host(sj_runtime *rt, const sj_tensor *d) {
    sj_tensor h = tu_tensor(d->dtype, d->rank, d->shape);
    size_t bytes = (size_t)tu_numel(&h) * sj_dtype_size(d->dtype);
    sj_cuda_bind(sj_cuda_of(rt->backend));
    if (bytes) assert_int_equal(sj_cuda_to_host(sj_cuda_of(rt->backend), h.data, (CUdeviceptr)(uintptr_t)d->data, bytes), SJ_OK);
    return h;
}

/* Run model on the GPU runtime and on the CPU, compare every output. */
static void compare(sj_runtime *rt, sj_fn *gfn, sj_model_fn model, void *user, const sj_tensor *in, int n_in,
                    int n_out, double tol, const char *what) {
    dbuf d[8];
    sj_tensor din[8], gout[4] = {{0}}, cout[4] = {{0}};
    for (int i = 0; i < n_in; i++) d[i] = to_dev(rt, &in[i]), din[i] = d[i].t;
    sj_status st = sj_call(gfn, din, n_in, gout, n_out);
    if (st) fail_msg("%s: GPU: %s", what, sj_last_error());
    sj_fn *cfn;
    sj_fn_options o;
    sj_fn_options_init(&o);
    o.dynamic = SJ_DYNAMIC_STATIC;
    assert_int_equal(sj_fn_create(cpu, "ref", n_in, model, user, &o, &cfn), SJ_OK);
    if (sj_call(cfn, in, n_in, cout, n_out)) fail_msg("%s: CPU: %s", what, sj_last_error());
    for (int k = 0; k < n_out; k++) {
        assert_int_equal(gout[k].device, SJ_CUDA);
        sj_tensor h = to_host(rt, &gout[k]);
        int64_t n = tu_numel(&cout[k]);
        double *ref = malloc(sizeof(double) * (size_t)(n ? n : 1));
        for (int64_t j = 0; j < n; j++) ref[j] = tu_get(&cout[k], j);
        if (!tu_check(&h, ref, tol, what)) fail_msg("%s: output %d differs from the CPU", what, k);
        free(ref);
        sj_tensor_free(rt, &gout[k]);
        sj_tensor_free(cpu, &cout[k]);
    }
    sj_fn_destroy(cfn);
    for (int i = 0; i < n_in; i++) free_dev(rt, &d[i]);
}

/* The test encoder (random weights of dt into w) as a function of rt, hot
 * (compiled) on its first call, never specialized per shape. */
static sj_fn *encoder_fn(sj_runtime *rt, tu_encoder *w, sj_dtype dt, sj_dynamic dyn, const char *name) {
    tu_encoder_init(w, dt, 64, 4, 128);
    sj_fn_options o;
    sj_fn_options_init(&o);
    o.dynamic = dyn;
    o.hot_threshold = 1;
    o.specialize_threshold = 1000;
    sj_fn *fn;
    assert_int_equal(sj_fn_create(rt, name, 1, tu_encoder_model, w, &o, &fn), SJ_OK);
    return fn;
}

/* -- Models ---------------------------------------------------------------------- */

typedef struct op_spec {
    int which;
    sj_dtype dt;
} op_spec;

static sj_status op_model(sj_tracer *t, const sj_val *in, int n, void *u) {
    const op_spec *s = u;
    sj_val x = in[0], y = n > 1 ? in[1] : SJ_NONE, r;
    switch (s->which) {
    case 0: r = sj_neg(t, x); break;
    case 1: r = sj_abs(t, x); break;
    case 2: r = sj_exp(t, x); break;
    case 3: r = sj_log(t, sj_abs(t, x)); break;
    case 4: r = sj_sqrt(t, sj_abs(t, x)); break;
    case 5: r = sj_rsqrt(t, sj_add(t, sj_abs(t, x), sj_scalar(t, 0.5))); break;
    case 6: r = sj_tanh(t, x); break;
    case 7: r = sj_sigmoid(t, x); break;
    case 8: r = sj_relu(t, x); break;
    case 9: r = sj_gelu(t, x); break;
    case 10: r = sj_gelu_tanh(t, x); break;
    case 11: r = sj_silu(t, x); break;
    case 12: r = sj_add(t, x, y); break;
    case 13: r = sj_sub(t, x, y); break;
    case 14: r = sj_mul(t, x, y); break;
    case 15: r = sj_div(t, x, y); break;
    case 16: r = sj_maximum(t, x, y); break;
    case 17: r = sj_minimum(t, x, y); break;
    case 18: r = sj_pow(t, sj_abs(t, x), y); break;
    case 19: r = sj_cast(t, sj_lt(t, x, y), s->dt); break;
    case 20: r = sj_where(t, sj_ge(t, x, y), x, y); break;
    case 21: r = sj_sum(t, x, 1, 0); break;
    case 22: r = sj_mean(t, x, -1, 1); break;
    case 23: r = sj_amax(t, x, 0, 0); break;
    case 24: r = sj_softmax(t, x, -1); break;
    case 25: r = sj_softmax(t, x, 0); break;
    case 26: r = sj_layer_norm(t, x, y, y, 1e-5); break;
    case 27: r = sj_rms_norm(t, x, y, 1e-6); break;
    case 28: r = sj_matmul(t, x, y); break;
    case 29: r = sj_transpose(t, sj_mul(t, sj_slice(t, x, 1, 1, -1, 2), sj_scalar(t, 3.0)), 0, 1); break;
    case 30: r = sj_concat(t, (sj_val[]){x, sj_exp(t, x)}, 2, -1); break;
    case 31: r = sj_cast(t, x, s->dt); break;
    default: return sj_trace_fail(t, SJ_EINVAL, "no op %d", s->which);
    }
    return sj_output(t, r);
}

static void test_every_op_eager(void **state) {
    sj_runtime *rt = gpu_runtime(SJ_COMPILE_OFF);
    tu_seed(11);
    static const sj_dtype floats[] = {SJ_F32, SJ_F16, SJ_BF16};
    for (int w = 0; w <= 31; w++)
        for (int d = 0; d < 3; d++) {
            op_spec s = {w, w == 19 ? SJ_F32 : w == 31 ? SJ_BF16 : floats[d]};
            sj_dtype dt = floats[d];
            int64_t rows = 7, cols = 33;
            sj_tensor in[2];
            in[0] = tu_tensor_layout(dt, 2, (int64_t[]){rows, cols}, d == 1 ? TU_GAP : TU_CONTIG);
            tu_fill_random(&in[0]);
            int n_in = 2;
            if (w >= 12 && w <= 20) in[1] = tu_tensor(dt, 1, &cols); /* row broadcast */
            else if (w == 26 || w == 27) in[1] = tu_tensor(dt, 1, &cols);
            else if (w == 28) in[1] = tu_tensor(dt, 2, (int64_t[]){cols, 5});
            else n_in = 1;
            if (n_in == 2) tu_fill_random(&in[1]);
            sj_fn *fn;
            assert_int_equal(sj_fn_create(rt, "op", n_in, op_model, &s, NULL, &fn), SJ_OK);
            char what[32];
            snprintf(what, sizeof what, "op %d %s", w, sj_dtype_name(dt));
            double tol = dt == SJ_F32 ? (w == 28 ? 1e-4 : 1e-5) : dt == SJ_F16 ? 4e-3 : 3e-2;
            compare(rt, fn, op_model, &s, in, n_in, 1, tol, what);
            sj_fn_destroy(fn);
            tu_free_all();
        }
    sj_runtime_destroy(rt);
}

static sj_status att_model(sj_tracer *t, const sj_val *in, int n, void *u) {
    return sj_output(t, sj_attention(t, in[0], in[1], in[2], in[3], 0.125, *(int *)u));
}

static sj_status gather_model(sj_tracer *t, const sj_val *in, int n, void *u) {
    return sj_output(t, sj_gather(t, in[0], in[1]));
}

static void test_attention_and_gather(void **state) {
    sj_runtime *rt = gpu_runtime(SJ_COMPILE_OFF);
    tu_seed(12);
    for (int causal = 0; causal < 2; causal++) {
        int64_t B = 2, H = 3, S = 37, D = 64;
        sj_tensor in[4] = {tu_tensor(SJ_F32, 4, (int64_t[]){B, H, S, D}), tu_tensor(SJ_F32, 4, (int64_t[]){B, H, S, D}),
                           tu_tensor(SJ_F32, 4, (int64_t[]){B, H, S, D}), tu_tensor(SJ_I32, 1, &B)};
        for (int i = 0; i < 3; i++) tu_fill_random(&in[i]);
        tu_seti(&in[3], 0, 30);
        tu_seti(&in[3], 1, 0);
        sj_fn *fn;
        assert_int_equal(sj_fn_create(rt, "att", 4, att_model, &causal, NULL, &fn), SJ_OK);
        compare(rt, fn, att_model, &causal, in, 4, 1, 1e-4, "attention");
        sj_fn_destroy(fn);
        tu_free_all();
    }
    sj_tensor in[2] = {tu_tensor(SJ_F32, 2, (int64_t[]){10, 16}), tu_tensor(SJ_I64, 1, (int64_t[]){6})};
    tu_fill_random(&in[0]);
    tu_fill_range(&in[1], 0, 9);
    sj_fn *fn;
    assert_int_equal(sj_fn_create(rt, "gather", 2, gather_model, NULL, NULL, &fn), SJ_OK);
    compare(rt, fn, gather_model, NULL, in, 2, 1, 0, "gather");
    tu_seti(&in[1], 3, 10); /* out of range: SJ_EINDEX, then fine again */
    dbuf d0 = to_dev(rt, &in[0]), d1 = to_dev(rt, &in[1]);
    sj_tensor din[2] = {d0.t, d1.t}, out = {0};
    assert_int_equal(sj_call(fn, din, 2, &out, 1), SJ_EINDEX);
    assert_null(out.data);
    free_dev(rt, &d1);
    tu_seti(&in[1], 3, 9);
    compare(rt, fn, gather_model, NULL, in, 2, 1, 0, "gather after the error");
    free_dev(rt, &d0);
    sj_fn_destroy(fn);
    tu_free_all();
    sj_runtime_destroy(rt);
}

/* -- Fused ------------------------------------------------------------------------------ */

static sj_status w1_model(sj_tracer *t, const sj_val *in, int n, void *u) {
    sj_val x = in[0];
    return sj_output(t, sj_mul(t, sj_gelu(t, sj_add(t, sj_mul(t, x, in[1]), in[2])), sj_sigmoid(t, x)));
}

static sj_status w2_model(sj_tracer *t, const sj_val *in, int n, void *u) {
    sj_val h = sj_add(t, in[0], in[1]);
    sj_output(t, sj_gelu(t, sj_layer_norm(t, h, in[2], in[3], 1e-5)));
    return sj_output(t, h);
}

static sj_status w3_model(sj_tracer *t, const sj_val *in, int n, void *u) {
    return sj_output(t, sj_softmax(t, sj_add(t, sj_mul(t, in[0], sj_scalar(t, 0.125)), in[1]), -1));
}

static sj_status mlp_model(sj_tracer *t, const sj_val *in, int n, void *u) {
    sj_val h = sj_gelu(t, sj_add(t, sj_matmul(t, in[0], in[1]), in[2]));
    return sj_output(t, sj_rms_norm(t, sj_sum(t, sj_reshape_i(t, h, 3, (int64_t[]){-1, 2, 16}), 1, 0), SJ_NONE, 1e-6));
}

typedef struct wl {
    const char *name;
    sj_model_fn model;
    int n_in, n_out;
} wl;

/* Random inputs of workload k (w1, w2, w3, mlp) at size S. */
static void make_inputs(int k, int64_t S, sj_tensor *in) {
    int n;
    switch (k) {
    case 0: {
        int64_t H = 1027;
        in[0] = tu_tensor(SJ_F32, 2, (int64_t[]){S, H});
        in[1] = tu_tensor(SJ_F32, 1, &H);
        in[2] = tu_tensor(SJ_F32, 1, &H);
        n = 3;
        break;
    }
    case 1: {
        int64_t H = 768;
        in[0] = tu_tensor(SJ_F32, 2, (int64_t[]){S, H});
        in[1] = tu_tensor(SJ_F32, 2, (int64_t[]){S, H});
        in[2] = tu_tensor(SJ_F32, 1, &H);
        in[3] = tu_tensor(SJ_F32, 1, &H);
        n = 4;
        break;
    }
    case 2:
        in[0] = tu_tensor(SJ_F32, 3, (int64_t[]){3, S, S + 5});
        in[1] = tu_tensor(SJ_F32, 3, (int64_t[]){3, 1, S + 5});
        n = 2;
        break;
    default:
        in[0] = tu_tensor(SJ_F32, 2, (int64_t[]){S, 48});
        in[1] = tu_tensor(SJ_F32, 2, (int64_t[]){48, 64});
        in[2] = tu_tensor(SJ_F32, 1, (int64_t[]){64});
        n = 3;
    }
    for (int i = 0; i < n; i++) tu_fill_random(&in[i]);
}

/* make_inputs' workloads, by k */
static const wl wls[] = {{"w1", w1_model, 3, 1}, {"w2", w2_model, 4, 2}, {"w3", w3_model, 2, 1}, {"mlp", mlp_model, 3, 1}};

/* fn, workload k (w1 or w2), called at each of the n sizes in order, each
 * result compared with the CPU's. */
static void compare_at_sizes(sj_runtime *rt, sj_fn *fn, int k, const int64_t *sizes, int n, const char *what) {
    for (int i = 0; i < n; i++) {
        sj_tensor in[4];
        make_inputs(k, sizes[i], in);
        compare(rt, fn, wls[k].model, NULL, in, wls[k].n_in, wls[k].n_out, 1e-5, what);
        tu_free_all();
    }
}

static void test_fused_patterns(void **state) {
    static const int64_t sizes[] = {2, 17, 130, 1000};
    sj_runtime *rt = gpu_runtime(SJ_COMPILE_SYNC);
    tu_seed(13);
    for (int k = 0; k < 4; k++)
        for (int dyn = SJ_DYNAMIC_STATIC; dyn <= SJ_DYNAMIC_SYMBOLIC; dyn++) {
            sj_fn_options o;
            sj_fn_options_init(&o);
            o.dynamic = dyn;
            o.hot_threshold = 1;
            o.recompile_limit = 16;
            sj_fn *fn;
            assert_int_equal(sj_fn_create(rt, wls[k].name, wls[k].n_in, wls[k].model, NULL, &o, &fn), SJ_OK);
            for (int s = 0; s < 4; s++) {
                sj_tensor in[4];
                make_inputs(k, sizes[s], in);
                char what[48];
                snprintf(what, sizeof what, "%s %s S=%lld", wls[k].name, dyn == SJ_DYNAMIC_STATIC ? "static" : "symbolic",
                         (long long)sizes[s]);
                compare(rt, fn, wls[k].model, NULL, in, wls[k].n_in, wls[k].n_out, k == 3 ? 1e-4 : 1e-5, what);
                tu_free_all();
            }
            sj_stats st;
            sj_fn_stats(fn, &st);
            if (st.eager_calls != 0) fail_msg("%s: %llu eager calls (compile failures %llu)", wls[k].name,
                                              (unsigned long long)st.eager_calls, (unsigned long long)st.compile_failures);
            assert_int_equal(st.fused_symbolic_calls + st.fused_specialized_calls, 4);
            sj_fn_destroy(fn);
        }
    sj_runtime_destroy(rt);
}

/* -- Parameters: host (any layout, copied with their strides) or device (in place) ----- */

typedef struct pm {
    sj_tensor w, b, s; /* w [K, N] for a product, b [N] and s [N] for the fused epilogue */
} pm;

static sj_status param_model(sj_tracer *t, const sj_val *in, int n, void *u) {
    const pm *p = u;
    sj_val h = sj_add(t, sj_matmul(t, in[0], sj_param(t, &p->w)), sj_param(t, &p->b));
    return sj_output(t, sj_mul(t, sj_gelu(t, h), sj_param(t, &p->s)));
}

static void test_params_on_device(void **state) {
    enum { K = 24, N = 40 };
    tu_seed(17);
    /* layout 0 contiguous; 1 and 2 strided (w a transposed view, b and s
     * every other element), 2 in device memory, used in place */
    for (int layout = 0; layout < 3; layout++)
        for (int mode = 0; mode < 3; mode++) { /* eager; fused static; fused symbolic */
            pm host;
            if (layout == 0) {
                host.w = tu_tensor(SJ_F32, 2, (int64_t[]){K, N});
                host.b = tu_tensor(SJ_F32, 1, (int64_t[]){N});
                host.s = tu_tensor(SJ_F32, 1, (int64_t[]){N});
            } else {
                sj_tensor wt = tu_tensor(SJ_F32, 2, (int64_t[]){N, K});
                host.w = tu_transpose(&wt, 0, 1);
                host.b = tu_tensor_layout(SJ_F32, 1, (int64_t[]){N}, TU_GAP);
                host.s = tu_tensor_layout(SJ_F32, 1, (int64_t[]){N}, TU_GAP);
            }
            tu_fill_random(&host.w);
            tu_fill_random(&host.b);
            tu_fill_random(&host.s);
            assert_true(layout == 0 || host.s.stride[0] == 2);
            sj_runtime *rt = gpu_runtime(mode ? SJ_COMPILE_SYNC : SJ_COMPILE_OFF);
            dbuf dw = {0}, db = {0}, ds = {0};
            pm gpu = host;
            if (layout == 2) {
                dw = to_dev(rt, &host.w), db = to_dev(rt, &host.b), ds = to_dev(rt, &host.s);
                gpu.w = dw.t, gpu.b = db.t, gpu.s = ds.t;
            }
            sj_fn_options o;
            sj_fn_options_init(&o);
            o.dynamic = mode == 2 ? SJ_DYNAMIC_SYMBOLIC : SJ_DYNAMIC_STATIC;
            o.hot_threshold = 1;
            sj_fn *fn;
            assert_int_equal(sj_fn_create(rt, "params", 1, param_model, &gpu, &o, &fn), SJ_OK);
            for (int64_t rows = 3; rows <= 33; rows += 30) {
                sj_tensor x = tu_tensor(SJ_F32, 2, (int64_t[]){rows, K});
                tu_fill_random(&x);
                char what[64];
                snprintf(what, sizeof what, "params layout %d mode %d rows %lld", layout, mode, (long long)rows);
                compare(rt, fn, param_model, &host, &x, 1, 1, 1e-4, what); /* the CPU uses the host weights */
            }
            sj_stats st;
            sj_fn_stats(fn, &st);
            assert_int_equal(st.eager_calls, mode ? 0 : 2);
            sj_fn_destroy(fn);
            if (layout == 2) free_dev(rt, &dw), free_dev(rt, &db), free_dev(rt, &ds);
            sj_runtime_destroy(rt);
            tu_free_all();
        }
}

/* -- TF32 (cuda_tf32) ------------------------------------------------------------------- */

static sj_status mm_model(sj_tracer *t, const sj_val *in, int n, void *u) {
    (void)n, (void)u;
    return sj_output(t, sj_matmul(t, in[0], in[1]));
}

/* An f32 product [M, K] x [K, N] against float64: full f32 by default
 * (relative error near f32's rounding), TF32 with cuda_tf32 = 1 (an error
 * that only 10-bit mantissa inputs make: the tensor cores are really taken,
 * yet within 3e-3); eager and fused alike. */
static void test_tf32_products(void **state) {
    (void)state;
    enum { M = 96, K = 512, N = 160 };
    tu_seed(29);
    sj_tensor a = tu_tensor(SJ_F32, 2, (int64_t[]){M, K}), b = tu_tensor(SJ_F32, 2, (int64_t[]){K, N});
    tu_fill_range(&a, -1, 1);
    tu_fill_range(&b, -1, 1);
    double *ref = malloc(sizeof(double) * M * N);
    assert_non_null(ref);
    tu_ref_matmul(&a, &b, ref, NULL);
    double ref_ss = 0;
    for (int64_t i = 0; i < (int64_t)M * N; i++) ref_ss += ref[i] * ref[i];
    for (int tf32 = 0; tf32 <= 1; tf32++)
        for (int mode = 0; mode < 2; mode++) { /* eager; fused */
            sj_runtime_config cfg = tu_cuda_config();
            cfg.compile_mode = mode ? SJ_COMPILE_SYNC : SJ_COMPILE_OFF;
            cfg.cuda_tf32 = tf32;
            sj_runtime *rt = NULL;
            if (sj_runtime_create(&cfg, &rt)) fail_msg("CUDA runtime: %s", sj_last_error());
            sj_fn_options o;
            sj_fn_options_init(&o);
            o.hot_threshold = 1;
            sj_fn *fn;
            assert_int_equal(sj_fn_create(rt, "mm", 2, mm_model, NULL, &o, &fn), SJ_OK);
            dbuf da = to_dev(rt, &a), db = to_dev(rt, &b);
            sj_tensor din[2] = {da.t, db.t}, out = {0};
            for (int rep = 0; rep < 2; rep++) { /* the second call runs the fused tier in mode 1 */
                if (sj_call(fn, din, 2, &out, 1)) fail_msg("tf32 %d: %s", tf32, sj_last_error());
                if (rep == 0) sj_tensor_free(rt, &out);
            }
            sj_tensor h = to_host(rt, &out);
            double ess = 0;
            for (int64_t i = 0; i < (int64_t)M * N; i++) {
                double d = tu_get(&h, i) - ref[i];
                ess += d * d;
            }
            double rel = sqrt(ess / ref_ss);
            sj_stats st;
            sj_fn_stats(fn, &st);
            printf("  f32 product %dx%dx%d, cuda_tf32 %d, %s: relative error %.2e\n", M, K, N, tf32,
                   mode ? "fused" : "eager", rel);
            if (mode) assert_true(st.fused_symbolic_calls + st.fused_specialized_calls > 0);
            if (!tf32 && rel > 1e-5) fail_msg("full f32: relative error %.2e > 1e-5", rel);
            if (tf32 && (rel < 2e-5 || rel > 3e-3))
                fail_msg("TF32: relative error %.2e, not within [2e-5, 3e-3]: %s", rel,
                         rel < 2e-5 ? "the tensor cores were not taken" : "too large");
            sj_tensor_free(rt, &out);
            free_dev(rt, &da), free_dev(rt, &db);
            sj_fn_destroy(fn);
            sj_runtime_destroy(rt);
        }
    free(ref);
    tu_free_all();
}

/* -- The encoder layer (w4's model, small): fused on the device against the CPU ------------ */

/* tests/util_encoder's layer, hidden 64 in 4 heads of 16 (so f16 attention
 * runs on tensor cores); fused plans write its attention in head-merged
 * order */
static void test_encoder_fused(void **state) {
    static const sj_dtype dts[] = {SJ_F32, SJ_F16};
    sj_runtime *rt = gpu_runtime(SJ_COMPILE_SYNC);
    tu_seed(18);
    for (int d = 0; d < 2; d++)
        for (int dyn = SJ_DYNAMIC_STATIC; dyn <= SJ_DYNAMIC_SYMBOLIC; dyn++) {
            sj_dtype dt = dts[d];
            tu_encoder w;
            sj_fn *fn = encoder_fn(rt, &w, dt, (sj_dynamic)dyn, "encoder");
            for (int64_t S = 5; S <= 200; S += 65) { /* 5, 70 (two query blocks), 135, 200 */
                sj_tensor x = tu_tensor(dt, 3, (int64_t[]){1, S, w.h});
                tu_fill_random(&x);
                char what[64];
                snprintf(what, sizeof what, "encoder %s %s S=%lld", sj_dtype_name(dt),
                         dyn == SJ_DYNAMIC_STATIC ? "static" : "symbolic", (long long)S);
                compare(rt, fn, tu_encoder_model, &w, &x, 1, 1, dt == SJ_F32 ? 1e-4 : 2e-2, what);
            }
            sj_stats st;
            sj_fn_stats(fn, &st);
            assert_int_equal(st.eager_calls, 0);
            sj_fn_destroy(fn);
            tu_free_all();
        }
    sj_runtime_destroy(rt);
}

/* -- CUDA graphs ---------------------------------------------------------------------- */

/* One encoder call into fixed device buffers, x fresh random data each
 * time, checked against float64. Returns the call's status. */
static sj_status graph_call_on(sj_runtime *rt, sj_fn *fn, const tu_encoder *w, const dbuf *dx, const sj_tensor *y,
                               CUstream s, const char *what) {
    sj_tensor hx = tu_tensor(dx->t.dtype, 3, dx->t.shape);
    tu_fill_random(&hx);
    assert_int_equal(sj_cuda_to_device(sj_cuda_of(rt->backend), dx->base, hx.data, (size_t)tu_numel(&hx) * sj_dtype_size(hx.dtype)),
                     SJ_OK);
    sj_tensor out = *y;
    sj_status st = s ? sj_call_stream(fn, &dx->t, 1, &out, 1, (void *)s) : sj_call(fn, &dx->t, 1, &out, 1);
    if (st) return st;
    if (s) assert_int_equal(sj_cuda_of(rt->backend)->api.StreamSynchronize(s), CUDA_SUCCESS);
    sj_tensor h = to_host(rt, y);
    double *ref = malloc(sizeof(double) * (size_t)tu_numel(&h));
    tu_encoder_ref(w, &hx, NULL, ref);
    if (!tu_check(&h, ref, hx.dtype == SJ_F32 ? 1e-4 : 2e-2, what)) fail_msg("%s: differs from float64", what);
    free(ref);
    return SJ_OK;
}

static sj_status graph_call(sj_runtime *rt, sj_fn *fn, const tu_encoder *w, const dbuf *dx, const sj_tensor *y,
                            const char *what) {
    return graph_call_on(rt, fn, w, dx, y, NULL, what);
}

static sj_stats stats_of(const sj_fn *fn) {
    sj_stats s;
    sj_fn_stats(fn, &s);
    return s;
}

/* -- Programmatic dependent launch (cuda_pdl) ---------------------------------------- */

/* The encoder with and without programmatic dependent launch, on the same
 * weights and the same random inputs of four lengths: eagerly (compiles
 * off: one kernel an op, cuBLASLt's products between ours), then fused and
 * replayed from CUDA graphs (compiled sync, SJ_GRAPH_AFTER + 8 calls a
 * length into fixed buffers, so the last ones are graph replays): every
 * output bit-identical between the two runtimes and within the dtype's
 * tolerance of float64. A kernel that read its predecessor's output before
 * that was written would differ. On a 9.0+ device whose driver has
 * cuLaunchKernelEx the runtime asked for it really launches that way. */
static void test_pdl_same_results(void **state) {
    tu_seed(29);
    for (int mode = 0; mode < 2; mode++)
        for (int d = 0; d < 2; d++) {
            sj_dtype dt = d ? SJ_F16 : SJ_F32;
            sj_runtime *rt[2];
            sj_fn *fn[2];
            tu_encoder w;
            tu_encoder_init(&w, dt, 64, 4, 128);
            for (int k = 0; k < 2; k++) {
                sj_runtime_config cfg = tu_cuda_config();
                cfg.compile_mode = mode ? SJ_COMPILE_SYNC : SJ_COMPILE_OFF;
                cfg.cuda_pdl = k == 0;
                if (sj_runtime_create(&cfg, &rt[k])) fail_msg("CUDA runtime: %s", sj_last_error());
                const sj_cuda *cu = sj_cuda_of(rt[k]->backend);
                assert_int_equal(cu->pdl, k == 0 && cu->cc_major >= 9 && cu->api.LaunchKernelEx != NULL);
                sj_fn_options o;
                sj_fn_options_init(&o);
                o.dynamic = SJ_DYNAMIC_SYMBOLIC;
                o.hot_threshold = 1;
                o.specialize_threshold = 1000;
                assert_int_equal(sj_fn_create(rt[k], "pdl", 1, tu_encoder_model, &w, &o, &fn[k]), SJ_OK);
            }
            if (!d && !mode) print_message("  programmatic dependent launch: %s\n", sj_cuda_of(rt[0]->backend)->pdl ? "on" : "not on this device");
            int calls = mode ? SJ_GRAPH_AFTER + 8 : 6;
            for (int64_t S = 5; S <= 200; S += 65) {
                sj_tensor hx = tu_tensor(dt, 3, (int64_t[]){1, S, w.h});
                dbuf dx[2], dy[2];
                for (int k = 0; k < 2; k++) dx[k] = to_dev(rt[k], &hx), dy[k] = to_dev(rt[k], &hx);
                double *ref = malloc(sizeof(double) * (size_t)tu_numel(&hx));
                for (int i = 0; i < calls; i++) {
                    tu_fill_random(&hx);
                    sj_tensor h[2];
                    for (int k = 0; k < 2; k++) {
                        sj_cuda *cu = sj_cuda_of(rt[k]->backend);
                        size_t bytes = (size_t)tu_numel(&hx) * sj_dtype_size(dt);
                        assert_int_equal(sj_cuda_to_device(cu, dx[k].base, hx.data, bytes), SJ_OK);
                        sj_tensor out = dy[k].t;
                        if (sj_call(fn[k], &dx[k].t, 1, &out, 1)) fail_msg("pdl %d: %s", k == 0, sj_last_error());
                        h[k] = to_host(rt[k], &dy[k].t);
                    }
                    char what[96];
                    snprintf(what, sizeof what, "pdl %s %s S=%lld call %d", mode ? "fused" : "eager",
                             sj_dtype_name(dt), (long long)S, i);
                    if (memcmp(h[0].data, h[1].data, (size_t)tu_numel(&hx) * sj_dtype_size(dt)))
                        fail_msg("%s: differs from the same call without programmatic dependent launch", what);
                    tu_encoder_ref(&w, &hx, NULL, ref);
                    if (!tu_check(&h[0], ref, dt == SJ_F32 ? 1e-4 : 2e-2, what)) fail_msg("%s: differs from float64", what);
                }
                free(ref);
                for (int k = 0; k < 2; k++) free_dev(rt[k], &dx[k]), free_dev(rt[k], &dy[k]);
            }
            for (int k = 0; k < 2; k++) {
                sj_stats st = stats_of(fn[k]);
                if (mode) assert_true(st.graph_calls > 0);
                else assert_int_equal(st.eager_calls, st.calls);
                sj_fn_destroy(fn[k]);
                sj_runtime_destroy(rt[k]);
            }
            tu_free_all();
        }
}

static sj_status gather2_model(sj_tracer *t, const sj_val *in, int n, void *u) {
    return sj_output(t, sj_add(t, sj_mul(t, sj_gather(t, in[0], in[1]), sj_scalar(t, 2)), sj_scalar(t, 1)));
}

/* Fused calls whose shapes and buffers repeat run as one CUDA graph:
 * captured (a job of the compile queue) after the SJ_GRAPH_AFTER-th call with the
 * same buffers, replayed after, with
 * new data each time; other buffers or another stream get graphs of their
 * own; a plan that needs memory mid-call (gather) is not captured and
 * still reports bad indices. */

/* sj_arange and sj_slice_dim on the device (issue 26): eager and fused,
 * static and symbolic, against float64; the symbolic function traces once
 * for every length. */
static void test_arange_slice_dim_on_device(void **state) {
    static const int64_t lengths[] = {5, 9, 3, 12, 7, 9};
    const int n_len = (int)(sizeof lengths / sizeof lengths[0]);
    tu_seed(2602);
    for (int mode = 0; mode < 2; mode++) {
        sj_runtime *rt = gpu_runtime(mode ? SJ_COMPILE_SYNC : SJ_COMPILE_OFF);
        for (int d = 0; d < 3; d++)
            for (int dyn = SJ_DYNAMIC_STATIC; dyn <= SJ_DYNAMIC_SYMBOLIC; dyn++) {
                sj_dtype dt = d == 0 ? SJ_F32 : d == 1 ? SJ_F16 : SJ_BF16;
                sj_fn_options o;
                sj_fn_options_init(&o);
                o.dynamic = (sj_dynamic)dyn;
                o.hot_threshold = 1;
                o.specialize_threshold = 1000;
                sj_fn *fn;
                assert_int_equal(sj_fn_create(rt, "pos", 2, tu_pos_model, NULL, &o, &fn), SJ_OK);
                for (int li = 0; li < n_len; li++) {
                    int64_t S = lengths[li], B = 2, H = 6, P = 16;
                    sj_tensor x = tu_random(dt, 3, (int64_t[]){B, S, H}, TU_CONTIG);
                    sj_tensor table = tu_random(dt, 2, (int64_t[]){P, H}, TU_GAP);
                    dbuf dx = to_dev(rt, &x), dt_ = to_dev(rt, &table);
                    sj_tensor in[2] = {dx.t, dt_.t}, out[TU_POS_OUTPUTS] = {{0}};
                    if (sj_call(fn, in, 2, out, TU_POS_OUTPUTS))
                        fail_msg("pos on device S=%lld: %s", (long long)S, sj_last_error());
                    for (int k = 0; k < TU_POS_OUTPUTS; k++) {
                        sj_tensor h = to_host(rt, &out[k]);
                        int64_t n = tu_numel(&h);
                        double *ref = calloc((size_t)(n ? n : 1), sizeof(double));
                        tu_pos_ref(&x, &table, k, ref);
                        const char *what = tu_label("pos %s %s %s S=%lld output %d", mode ? "fused" : "eager",
                                                    sj_dtype_name(dt), dyn == SJ_DYNAMIC_STATIC ? "static" : "symbolic",
                                                    (long long)S, k);
                        if (!tu_check(&h, ref, k == 4 ? 0 : tu_tol(dt), what)) fail_msg("%s: mismatch", what);
                        free(ref);
                        sj_tensor_free(rt, &out[k]);
                    }
                    free_dev(rt, &dx);
                    free_dev(rt, &dt_);
                }
                sj_stats s = stats_of(fn);
                if (dyn == SJ_DYNAMIC_SYMBOLIC) {
                    assert_int_equal(s.traces, 1);
                    if (mode) assert_int_equal(s.fused_symbolic_calls, n_len);
                } else if (mode) {
                    assert_int_equal(s.fused_specialized_calls, n_len);
                }
                if (!mode) assert_int_equal(s.eager_calls, n_len);
                sj_fn_destroy(fn);
            }
        sj_runtime_destroy(rt);
    }
    tu_free_all();
}


/* sj_attention_mask on the device (issue 26): float masks of q's dtype
 * and f32, bool masks, a 0/1 padding mask made in the graph; eager and
 * fused, static and symbolic, against float64. */
static void test_attention_mask_on_device(void **state) {
    static const int64_t lengths[] = {5, 9, 2, 70}; /* 70: more than one key chunk */
    tu_seed(2604);
    for (int mode = 0; mode < 2; mode++) {
        sj_runtime *rt = gpu_runtime(mode ? SJ_COMPILE_SYNC : SJ_COMPILE_OFF);
        for (int c = 0; c < 3; c++)
            for (int d = 0; d < 3; d++)
                for (int dyn = SJ_DYNAMIC_STATIC; dyn <= SJ_DYNAMIC_SYMBOLIC; dyn++) {
                    sj_dtype dt = d == 0 ? SJ_F32 : d == 1 ? SJ_F16 : SJ_BF16;
                    tu_mask_spec sp = {0.4, c == 1};
                    sj_fn_options o;
                    sj_fn_options_init(&o);
                    o.dynamic = (sj_dynamic)dyn;
                    o.hot_threshold = 1;
                    o.specialize_threshold = 1000;
                    sj_fn *fn;
                    assert_int_equal(sj_fn_create(rt, "mask", 5, tu_mask_model, &sp, &o, &fn), SJ_OK);
                    for (int li = 0; li < 4; li++) {
                        const int64_t B = 2, H = 3, D = 64, Dv = 64, S = lengths[li];
                        sj_tensor q = tu_random(dt, 4, (int64_t[]){B, H, S, D}, TU_CONTIG);
                        sj_tensor k = tu_random(dt, 4, (int64_t[]){B, H, S, D}, TU_CONTIG);
                        sj_tensor v = tu_random(dt, 4, (int64_t[]){B, H, S, Dv}, TU_CONTIG);
                        sj_tensor mask = c == 0   ? tu_random_mask(dt, 4, (int64_t[]){B, 1, 1, S})
                                         : c == 1 ? tu_random_mask(SJ_F32, 2, (int64_t[]){S, S})
                                                  : tu_random_mask(SJ_BOOL, 4, (int64_t[]){B, H, S, S});
                        sj_tensor keep = tu_tensor(SJ_I32, 2, (int64_t[]){B, S});
                        sj_tensor keepb = tu_tensor(SJ_BOOL, 4, (int64_t[]){B, 1, 1, S});
                        for (int64_t i = 0; i < B * S; i++) {
                            tu_seti(&keep, i, i % S > i / S);
                            tu_seti(&keepb, i, i % S > i / S);
                        }
                        sj_tensor hin[5] = {q, k, v, mask, keep}, din[5], out[2] = {{0}};
                        dbuf db[5];
                        for (int i = 0; i < 5; i++) db[i] = to_dev(rt, &hin[i]), din[i] = db[i].t;
                        if (sj_call(fn, din, 5, out, 2))
                            fail_msg("mask on device S=%lld: %s", (long long)S, sj_last_error());
                        for (int r = 0; r < 2; r++) {
                            sj_tensor h = to_host(rt, &out[r]);
                            double *ref = calloc((size_t)tu_numel(&h), sizeof(double));
                            tu_ref_attention_mask(&q, &k, &v, r ? &keepb : &mask, sp.scale, r ? 0 : sp.causal, ref);
                            const char *what = tu_label("attention_mask on device %s case %d %s %s S=%lld output %d",
                                                        mode ? "fused" : "eager", c, sj_dtype_name(dt),
                                                        dyn == SJ_DYNAMIC_STATIC ? "static" : "symbolic", (long long)S, r);
                            if (!tu_check(&h, ref, 2 * tu_tol(dt), what)) fail_msg("%s: mismatch", what);
                            free(ref);
                            sj_tensor_free(rt, &out[r]);
                        }
                        for (int i = 0; i < 5; i++) free_dev(rt, &db[i]);
                    }
                    sj_stats s = stats_of(fn);
                    assert_int_equal(s.eager_calls, mode ? 0 : 4);
                    sj_fn_destroy(fn);
                }
        sj_runtime_destroy(rt);
    }
    tu_free_all();
}


/* sj_tensor_copy with a dtype change (issue 26): every pair of dtypes,
 * host -> device (converted on the host), device -> device (the cast
 * kernel) and device -> host, each against tu_ref_cast exactly. */
static void test_tensor_copy_convert_on_device(void **state) {
    static const sj_dtype dts[] = {SJ_F32, SJ_F16, SJ_BF16, SJ_I32, SJ_I64, SJ_BOOL};
    sj_runtime *rt = gpu_runtime(SJ_COMPILE_OFF);
    tu_seed(2606);
    for (int a = 0; a < 6; a++)
        for (int b = 0; b < 6; b++) {
            int64_t shape[2] = {5, 13};
            sj_tensor x = tu_random(dts[a], 2, shape, TU_CONTIG);
            if (dts[a] == SJ_F32) tu_set(&x, 0, 70000.5), tu_set(&x, 1, -3.75), tu_set(&x, 2, NAN);
            if (dts[a] == SJ_I64) tu_seti(&x, 0, 16777217), tu_seti(&x, 1, ((int64_t)1 << 33) + 5);
            double *ref = calloc(65, sizeof(double));
            tu_ref_cast(&x, dts[b], ref);
            /* host x -> device (dtype b) -> host (dtype b) */
            sj_tensor d1 = {.dtype = dts[b], .rank = 2, .shape = {5, 13}, .device = SJ_CUDA};
            assert_int_equal(sj_tensor_alloc(rt, &d1), SJ_OK);
            assert_int_equal(sj_tensor_copy(rt, &d1, &x), SJ_OK);
            sj_tensor h1 = tu_tensor(dts[b], 2, shape);
            assert_int_equal(sj_tensor_copy(rt, &h1, &d1), SJ_OK);
            const char *what = tu_label("copy host %s -> device %s", sj_dtype_name(dts[a]), sj_dtype_name(dts[b]));
            if (!tu_check(&h1, ref, 0, what)) fail_msg("%s: mismatch", what);
            /* device (dtype a) -> device (dtype b): the cast kernel */
            sj_tensor d0 = {.dtype = dts[a], .rank = 2, .shape = {5, 13}, .device = SJ_CUDA};
            sj_tensor d2 = {.dtype = dts[b], .rank = 2, .shape = {5, 13}, .device = SJ_CUDA};
            assert_int_equal(sj_tensor_alloc(rt, &d0), SJ_OK);
            assert_int_equal(sj_tensor_alloc(rt, &d2), SJ_OK);
            assert_int_equal(sj_tensor_copy(rt, &d0, &x), SJ_OK);
            assert_int_equal(sj_tensor_copy(rt, &d2, &d0), SJ_OK);
            sj_tensor h2 = tu_tensor(dts[b], 2, shape);
            assert_int_equal(sj_tensor_copy(rt, &h2, &d2), SJ_OK);
            what = tu_label("copy device %s -> device %s", sj_dtype_name(dts[a]), sj_dtype_name(dts[b]));
            if (!tu_check(&h2, ref, 0, what)) fail_msg("%s: mismatch", what);
            /* device (dtype a) -> host (dtype b) */
            sj_tensor h3 = tu_tensor(dts[b], 2, shape);
            assert_int_equal(sj_tensor_copy(rt, &h3, &d0), SJ_OK);
            what = tu_label("copy device %s -> host %s", sj_dtype_name(dts[a]), sj_dtype_name(dts[b]));
            if (!tu_check(&h3, ref, 0, what)) fail_msg("%s: mismatch", what);
            sj_tensor_free(rt, &d0);
            sj_tensor_free(rt, &d1);
            sj_tensor_free(rt, &d2);
            free(ref);
        }
    sj_runtime_destroy(rt);
    tu_free_all();
}


/* A plan with a gather is captured into a CUDA graph (issue 26): its error
 * flag lives in the graph's memory. Outputs against float64; an index out
 * of range in the graph's own buffers still fails the call (SJ_EINDEX),
 * and the graph serves the next good call. */
static sj_status gather_graph_model(sj_tracer *t, const sj_val *in, int n, void *u) {
    return sj_output(t, sj_mul(t, sj_gather(t, in[0], in[1]), sj_scalar(t, 3.0)));
}

static void test_gather_graph_captured(void **state) {
    sj_runtime *rt = gpu_runtime(SJ_COMPILE_SYNC);
    tu_seed(2607);
    const int64_t V = 50, H = 32, B = 2, S = 11;
    sj_tensor table = tu_random(SJ_F32, 2, (int64_t[]){V, H}, TU_CONTIG);
    sj_tensor idx = tu_tensor(SJ_I64, 2, (int64_t[]){B, S});
    for (int64_t i = 0; i < B * S; i++) tu_seti(&idx, i, tu_randint(0, V - 1));
    sj_tensor y = tu_tensor(SJ_F32, 3, (int64_t[]){B, S, H});
    dbuf dt_ = to_dev(rt, &table), di = to_dev(rt, &idx), dy = to_dev(rt, &y);
    sj_fn *fn = hot_fn(rt, "gather_graph", 2, gather_graph_model);
    sj_tensor in[2] = {dt_.t, di.t};
    for (int i = 0; i < SJ_GRAPH_AFTER; i++) assert_int_equal(sj_call(fn, in, 2, &dy.t, 1), SJ_OK);
    assert_int_equal(sj_fn_wait_idle(fn, -1), SJ_OK);
    for (int i = 0; i < 3; i++) assert_int_equal(sj_call(fn, in, 2, &dy.t, 1), SJ_OK);
    sj_stats s = stats_of(fn);
    assert_int_equal(s.graph_failures, 0);
    assert_int_equal(s.graphs, 1);
    assert_true(s.graph_calls >= 3);
    sj_tensor h = to_host(rt, &dy.t);
    double *ref = calloc((size_t)(B * S * H), sizeof(double));
    for (int64_t p = 0; p < B * S; p++)
        for (int64_t j = 0; j < H; j++) ref[p * H + j] = 3.0 * tu_get(&table, tu_geti(&idx, p) * H + j);
    if (!tu_check(&h, ref, tu_tol(SJ_F32), "gather graph")) fail_msg("gather graph: mismatch");
    /* a bad index in the same buffer: the graph's call fails, and says why */
    tu_seti(&idx, 5, V);
    sj_cuda_bind(sj_cuda_of(rt->backend));
    assert_int_equal(sj_cuda_to_device(sj_cuda_of(rt->backend), di.base, idx.data, (size_t)(B * S) * 8), SJ_OK);
    uint64_t before = stats_of(fn).graph_calls;
    assert_int_equal(sj_call(fn, in, 2, &dy.t, 1), SJ_EINDEX);
    assert_non_null(strstr(sj_last_error(), "out of range"));
    /* fixed again: served by the graph, right */
    tu_seti(&idx, 5, 7);
    assert_int_equal(sj_cuda_to_device(sj_cuda_of(rt->backend), di.base, idx.data, (size_t)(B * S) * 8), SJ_OK);
    assert_int_equal(sj_call(fn, in, 2, &dy.t, 1), SJ_OK);
    assert_true(stats_of(fn).graph_calls > before);
    h = to_host(rt, &dy.t);
    for (int64_t j = 0; j < H; j++) ref[5 * H + j] = 3.0 * tu_get(&table, 7 * H + j);
    if (!tu_check(&h, ref, tu_tol(SJ_F32), "gather graph after a bad index")) fail_msg("mismatch");
    free(ref);
    sj_fn_destroy(fn);
    free_dev(rt, &dt_);
    free_dev(rt, &di);
    free_dev(rt, &dy);
    sj_runtime_destroy(rt);
    tu_free_all();
}

static void test_cuda_graphs(void **state) {
    sj_runtime *rt = gpu_runtime(SJ_COMPILE_SYNC);
    tu_seed(21);
    for (int d = 0; d < 2; d++)
        for (int dyn = SJ_DYNAMIC_STATIC; dyn <= SJ_DYNAMIC_SYMBOLIC; dyn++) {
            sj_dtype dt = d ? SJ_F16 : SJ_F32;
            tu_encoder w; /* one piece of code per shape throughout */
            sj_fn *fn = encoder_fn(rt, &w, dt, (sj_dynamic)dyn, "graphs");
            int64_t S = 37;
            sj_tensor hx = tu_tensor(dt, 3, (int64_t[]){1, S, w.h});
            dbuf dx = to_dev(rt, &hx), dy = to_dev(rt, &hx), dy2 = to_dev(rt, &hx);
            char what[96];
            snprintf(what, sizeof what, "graphs %s %s", sj_dtype_name(dt), dyn == SJ_DYNAMIC_STATIC ? "static" : "symbolic");
            /* call 1 compiles (fused); the SJ_GRAPH_AFTER-th with the same
             * buffers runs kernel by kernel, then (sync compile mode) captures
             * its graph itself; later calls run as the graph */
            for (int i = 0; i < SJ_GRAPH_AFTER; i++)
                assert_int_equal(graph_call(rt, fn, &w, &dx, &dy.t, what), SJ_OK);
            assert_int_equal(stats_of(fn).graph_calls, 0);
            assert_int_equal(sj_fn_wait_idle(fn, -1), SJ_OK);
            for (int i = 0; i < 2; i++) assert_int_equal(graph_call(rt, fn, &w, &dx, &dy.t, what), SJ_OK);
            sj_stats s = stats_of(fn);
            assert_int_equal(s.eager_calls, 0);
            assert_int_equal(s.graphs, 1);
            assert_int_equal(s.graph_calls, 2);
            assert_int_equal(s.graph_failures, 0);
            /* another output buffer: kernel by kernel, then its own graph;
             * calls with the first buffers in between keep their graph */
            for (int i = 0; i < SJ_GRAPH_AFTER - 1; i++) {
                assert_int_equal(graph_call(rt, fn, &w, &dx, &dy2.t, what), SJ_OK);
                assert_int_equal(graph_call(rt, fn, &w, &dx, &dy.t, what), SJ_OK);
            }
            assert_int_equal(stats_of(fn).graph_calls, 2 + SJ_GRAPH_AFTER - 1);
            assert_int_equal(graph_call(rt, fn, &w, &dx, &dy2.t, what), SJ_OK); /* asks */
            assert_int_equal(sj_fn_wait_idle(fn, -1), SJ_OK);
            assert_int_equal(graph_call(rt, fn, &w, &dx, &dy2.t, what), SJ_OK);
            s = stats_of(fn);
            assert_int_equal(s.graphs, 2);
            assert_int_equal(s.graph_calls, 2 + SJ_GRAPH_AFTER);
            /* the graph's buffer with a wrong output shape: no match, the
             * usual check names it, every time; failed calls do not count
             * towards a capture (one would fail and close the signature to
             * graphs); the next good call is a graph again */
            sj_tensor bad = dy.t;
            bad.shape[1] = S - 1;
            sj_tensor_set_contiguous(&bad);
            for (int i = 0; i < SJ_GRAPH_AFTER; i++) {
                assert_int_equal(sj_call(fn, &dx.t, 1, &bad, 1), SJ_ESHAPE);
                assert_non_null(strstr(sj_last_error(), "output 0 size mismatch at axis 1"));
            }
            assert_int_equal(sj_fn_wait_idle(fn, -1), SJ_OK);
            s = stats_of(fn);
            assert_int_equal(s.graph_failures, 0);
            assert_int_equal(s.graphs, 2);
            assert_int_equal(graph_call(rt, fn, &w, &dx, &dy.t, what), SJ_OK);
            assert_int_equal(stats_of(fn).graph_calls, 3 + SJ_GRAPH_AFTER);
            /* the same buffers on a caller's stream: a graph of their own */
            CUstream s2;
            sj_cuda_bind(sj_cuda_of(rt->backend));
            assert_int_equal(sj_cuda_of(rt->backend)->api.StreamCreate(&s2, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
            sj_tensor out = dy.t;
            for (int i = 0; i < SJ_GRAPH_AFTER; i++)
                assert_int_equal(sj_call_stream(fn, &dx.t, 1, &out, 1, (void *)s2), SJ_OK);
            assert_int_equal(sj_cuda_of(rt->backend)->api.StreamSynchronize(s2), CUDA_SUCCESS);
            assert_int_equal(stats_of(fn).graph_calls, 3 + SJ_GRAPH_AFTER);
            assert_int_equal(sj_fn_wait_idle(fn, -1), SJ_OK);
            for (int i = 0; i < 2; i++) assert_int_equal(graph_call_on(rt, fn, &w, &dx, &dy.t, s2, what), SJ_OK);
            sj_cuda_of(rt->backend)->api.StreamDestroy(s2);
            s = stats_of(fn);
            assert_int_equal(s.graphs, 3);
            assert_int_equal(s.graph_calls, 5 + SJ_GRAPH_AFTER);
            /* outputs the library allocates: never a graph */
            for (int i = 0; i < 3; i++) {
                sj_tensor o2 = {0};
                assert_int_equal(sj_call(fn, &dx.t, 1, &o2, 1), SJ_OK);
                sj_tensor_free(rt, &o2);
            }
            s = stats_of(fn);
            assert_int_equal(s.graph_calls, 5 + SJ_GRAPH_AFTER);
            assert_int_equal(s.graphs, 3);
            char *text = tu_explain(fn);
            char want[96];
            snprintf(want, sizeof want, "CUDA graphs: 3 captured, 0 failed captures, %d calls served by one",
                     5 + SJ_GRAPH_AFTER);
            if (!strstr(text, want)) fail_msg("explain lacks \"%s\":\n%s", want, text);
            free(text);
            sj_fn_destroy(fn); /* with its graphs */
            free_dev(rt, &dx);
            free_dev(rt, &dy);
            free_dev(rt, &dy2);
            tu_free_all();
        }
    assert_int_equal(atomic_load(&rt->cuda_graphs), 0);

    /* gather's error flag has its home in the graph's memory: captured */
    sj_fn *fn = hot_fn(rt, "gather2", 2, gather2_model);
    sj_tensor in[2] = {tu_tensor(SJ_F32, 2, (int64_t[]){10, 16}), tu_tensor(SJ_I64, 1, (int64_t[]){6})};
    tu_fill_random(&in[0]);
    tu_fill_range(&in[1], 0, 9);
    dbuf d0 = to_dev(rt, &in[0]), d1 = to_dev(rt, &in[1]);
    sj_tensor hy = tu_tensor(SJ_F32, 2, (int64_t[]){6, 16});
    dbuf dy = to_dev(rt, &hy);
    sj_tensor din[2] = {d0.t, d1.t};
    for (int i = 0; i < SJ_GRAPH_AFTER + 1; i++) {
        sj_tensor out = dy.t;
        assert_int_equal(sj_call(fn, din, 2, &out, 1), SJ_OK);
    }
    assert_int_equal(sj_fn_wait_idle(fn, -1), SJ_OK);
    sj_stats s = stats_of(fn);
    assert_true(s.fused_specialized_calls >= SJ_GRAPH_AFTER);
    assert_int_equal(s.graph_failures, 0);
    assert_int_equal(s.graphs, 1);
    {
        sj_tensor out1 = dy.t;
        assert_int_equal(sj_call(fn, din, 2, &out1, 1), SJ_OK);
        assert_true(stats_of(fn).graph_calls > 0);
    }
    sj_tensor h = to_host(rt, &dy.t);
    for (int64_t r = 0; r < 6; r++)
        for (int64_t c = 0; c < 16; c++)
            assert_true(fabs(tu_get(&h, r * 16 + c) - (2 * tu_get(&in[0], tu_geti(&in[1], r) * 16 + c) + 1)) < 1e-6);
    int64_t bad_idx = 10;
    assert_int_equal(sj_cuda_to_device(sj_cuda_of(rt->backend), d1.base + 3 * sizeof(int64_t), &bad_idx, sizeof bad_idx), SJ_OK);
    sj_tensor out = dy.t;
    uint64_t served = stats_of(fn).graph_calls;
    assert_int_equal(sj_call(fn, din, 2, &out, 1), SJ_EINDEX); /* by the graph, which reads its flag */
    assert_int_equal(stats_of(fn).graph_calls, served);       /* a failed call is not counted as served */
    sj_fn_destroy(fn);
    free_dev(rt, &d0);
    free_dev(rt, &d1);
    free_dev(rt, &dy);
    tu_free_all();
    sj_runtime_destroy(rt);

    /* cuda_graphs = 0: none */
    rt = gpu_runtime_graphs(SJ_COMPILE_SYNC, 0);
    tu_encoder w;
    fn = encoder_fn(rt, &w, SJ_F32, SJ_DYNAMIC_STATIC, "nographs");
    sj_tensor hx = tu_tensor(SJ_F32, 3, (int64_t[]){1, 9, w.h});
    dbuf dx = to_dev(rt, &hx), dy2 = to_dev(rt, &hx);
    for (int i = 0; i < 4; i++) assert_int_equal(graph_call(rt, fn, &w, &dx, &dy2.t, "no graphs"), SJ_OK);
    s = stats_of(fn);
    assert_int_equal(s.graphs + s.graph_calls + s.graph_failures, 0);
    assert_true(s.fused_specialized_calls + s.fused_symbolic_calls == 4);
    sj_fn_destroy(fn);
    free_dev(rt, &dx);
    free_dev(rt, &dy2);
    tu_free_all();
    sj_runtime_destroy(rt);
}

/* 8 threads call one function with buffers of their own, new data each
 * call: two of them have graphs, the rest run kernel by kernel, every
 * result matches float64 (references computed beforehand:
 * the tu helpers are not thread-safe). This is what found that cuBLASLt
 * must be called by one thread at a time (eager_cuda.c) and that a graph
 * needs a cuBLASLt workspace of its own (kernels/cuda/graph_cuda.c). */
typedef struct graph_job {
    sj_runtime *rt;
    sj_fn *fn;
    sj_tensor hx[2];
    double *ref[2];
    dbuf dx, dy;
    int bad, failures;
} graph_job;

static void *graph_thread(void *p) {
    graph_job *j = p;
    int64_t n = tu_numel(&j->hx[0]);
    size_t bytes = (size_t)n * sizeof(float);
    float *y = malloc(bytes);
    for (int it = 0; it < 12 && y; it++) {
        const sj_tensor *hx = &j->hx[it % 2];
        const double *ref = j->ref[it % 2];
        sj_tensor out = j->dy.t;
        if (sj_cuda_to_device(sj_cuda_of(j->rt->backend), j->dx.base, hx->data, bytes) || sj_call(j->fn, &j->dx.t, 1, &out, 1) ||
            sj_cuda_to_host(sj_cuda_of(j->rt->backend), y, j->dy.base, bytes)) {
            j->failures++;
            continue;
        }
        for (int64_t i = 0; i < n; i++) j->bad += fabs(y[i] - ref[i]) > 1e-4 * (1 + fabs(ref[i]));
    }
    j->failures += !y;
    free(y);
    return NULL;
}

/* Each of T jobs of fn: two random inputs of [1, S0 + dS * t, h] with their
 * float64 results, device input and output buffers. */
static void graph_jobs_make(sj_runtime *rt, sj_fn *fn, const tu_encoder *w, graph_job *jobs, int T, int64_t S0,
                            int64_t dS) {
    for (int t = 0; t < T; t++) {
        int64_t S = S0 + dS * t;
        jobs[t] = (graph_job){.rt = rt, .fn = fn};
        for (int k = 0; k < 2; k++) {
            jobs[t].hx[k] = tu_tensor(SJ_F32, 3, (int64_t[]){1, S, w->h});
            tu_fill_random(&jobs[t].hx[k]);
            jobs[t].ref[k] = malloc(sizeof(double) * (size_t)tu_numel(&jobs[t].hx[k]));
            tu_encoder_ref(w, &jobs[t].hx[k], NULL, jobs[t].ref[k]);
        }
        jobs[t].dx = to_dev(rt, &jobs[t].hx[0]);
        jobs[t].dy = to_dev(rt, &jobs[t].hx[0]);
    }
}

/* Run the T jobs on threads of their own, all joined before any assertion;
 * every call served and right. */
static void graph_jobs_run(graph_job *jobs, int T) {
    pthread_t th[16];
    assert_true(T <= 16);
    for (int t = 0; t < T; t++) assert_int_equal(pthread_create(&th[t], NULL, graph_thread, &jobs[t]), 0);
    for (int t = 0; t < T; t++) pthread_join(th[t], NULL);
    for (int t = 0; t < T; t++) {
        assert_int_equal(jobs[t].failures, 0);
        assert_int_equal(jobs[t].bad, 0);
    }
}

/* fn, the jobs' buffers and references, the test tensors, and rt. */
static void graph_jobs_end(sj_runtime *rt, sj_fn *fn, graph_job *jobs, int T) {
    sj_fn_destroy(fn);
    for (int t = 0; t < T; t++) {
        free_dev(rt, &jobs[t].dx);
        free_dev(rt, &jobs[t].dy);
        free(jobs[t].ref[0]);
        free(jobs[t].ref[1]);
    }
    tu_free_all();
    sj_runtime_destroy(rt);
}

static void test_cuda_graphs_threads(void **state) {
    enum { T = 8 };
    sj_runtime *rt = gpu_runtime(SJ_COMPILE_SYNC);
    tu_seed(22);
    tu_encoder w;
    sj_fn *fn = encoder_fn(rt, &w, SJ_F32, SJ_DYNAMIC_STATIC, "graph_threads");
    graph_job jobs[T];
    graph_jobs_make(rt, fn, &w, jobs, T, 21, 0);
    /* compiled before the threads start, and graphs for the buffers of
     * threads 0 and 1 (asked for by the SJ_GRAPH_AFTER-th call); the
     * others make too few calls to be captured */
    for (int t = 0; t < 2; t++) {
        for (int i = 0; i < SJ_GRAPH_AFTER; i++) {
            sj_tensor out = jobs[t].dy.t;
            assert_int_equal(sj_call(fn, &jobs[t].dx.t, 1, &out, 1), SJ_OK);
        }
        assert_int_equal(sj_fn_wait_idle(fn, -1), SJ_OK); /* one capture at a time per shape */
    }
    assert_int_equal(stats_of(fn).graphs, 2);
    graph_jobs_run(jobs, T);
    sj_stats s = stats_of(fn);
    assert_int_equal(s.eager_calls, 0);
    assert_int_equal(s.graphs, 2);
    assert_true(s.graph_calls >= 2 * 12);
    assert_int_equal(s.graph_failures, 0);
    print_message("8 threads x 12 calls: %llu graphs, %llu graph calls\n", (unsigned long long)s.graphs,
                  (unsigned long long)s.graph_calls);
    graph_jobs_end(rt, fn, jobs, T);
}

/* A bucket graph replayed from 8 threads at once (sj_call on lanes), each
 * thread with its own size in the bucket and its own buffers: a replay
 * that finds the graph busy runs kernel by kernel, one on another lane
 * waits for the last replay (the staging buffers are shared); every
 * result against float64. */
static void test_bucket_graphs_threads(void **state) {
    (void)state;
    enum { T = 8 };
    sj_runtime *rt = gpu_runtime(SJ_COMPILE_SYNC);
    tu_seed(23);
    tu_encoder w;
    sj_fn *fn = encoder_fn(rt, &w, SJ_F32, SJ_DYNAMIC_SYMBOLIC, "bucket_threads");
    assert_int_equal(sj_set_buckets_pow2(fn, 0, 1, 16, 128), SJ_OK);
    graph_job jobs[T];
    graph_jobs_make(rt, fn, &w, jobs, T, 33, 4); /* S 33, 37, ..., 61: (32, 64] */
    for (int i = 0; i < SJ_GRAPH_AFTER; i++) { /* the bucket's graph, from calls of every thread's size */
        graph_job *j = &jobs[i % T];
        sj_tensor out = j->dy.t;
        assert_int_equal(sj_call(fn, &j->dx.t, 1, &out, 1), SJ_OK);
    }
    assert_int_equal(sj_fn_wait_idle(fn, -1), SJ_OK);
    assert_int_equal(stats_of(fn).bucket_graphs, 1);
    graph_jobs_run(jobs, T);
    sj_stats s = stats_of(fn);
    assert_int_equal(s.eager_calls, 0);
    assert_true(s.bucket_graph_calls >= 1);
    assert_int_equal(s.graph_failures, 0);
    print_message("8 threads x 12 calls of 8 sizes: %llu served by the bucket graph\n",
                  (unsigned long long)s.bucket_graph_calls);
    graph_jobs_end(rt, fn, jobs, T);
}

/* The graph memory budget on the device (graph_max_bytes): a real graph
 * reports its bytes (the allocator's block for its workspace, error flag
 * and arena: at least the 4 MiB cuBLASLt workspace of a plan with
 * products); a budget of one and a half such graphs keeps one: the second
 * buffer set's graph evicts the first (least recently replayed), whose
 * calls run kernel by kernel again, right; a budget under one graph keeps
 * none (not kept, counted, backed off). Every call against float64. */
static sj_runtime *gpu_runtime_graph_budget(uint64_t max) {
    sj_runtime_config cfg;
    sj_runtime_config_init(&cfg);
    cfg.backend = SJ_BACKEND_CUDA;
    cfg.compile_mode = SJ_COMPILE_SYNC;
    cfg.cache_dir = NULL;
    cfg.log_mask = 0;
    cfg.graph_max_bytes = max;
    sj_runtime *rt = NULL;
    if (sj_runtime_create(&cfg, &rt)) fail_msg("CUDA runtime: %s", sj_last_error());
    return rt;
}

static void test_cuda_graph_budget(void **state) {
    (void)state;
    tu_seed(23);
    int64_t S = 19;
    uint64_t one = 0; /* one graph's bytes, from a runtime without a budget */
    for (int round = 0; round < 3; round++) {
        sj_runtime *rt = gpu_runtime_graph_budget(round == 0 ? 0 : round == 1 ? one + one / 2 : one / 2);
        tu_encoder w;
        sj_fn *fn = encoder_fn(rt, &w, SJ_F32, SJ_DYNAMIC_STATIC, "graph_budget");
        sj_tensor hx = tu_tensor(SJ_F32, 3, (int64_t[]){1, S, w.h});
        dbuf dx = to_dev(rt, &hx), dy = to_dev(rt, &hx), dy2 = to_dev(rt, &hx);
        const char *what = tu_label("graph budget round %d", round);
        /* call 1 compiles; the SJ_GRAPH_AFTER-th with these buffers captures (sync mode: at its end) */
        for (int i = 0; i < SJ_GRAPH_AFTER; i++) assert_int_equal(graph_call(rt, fn, &w, &dx, &dy.t, what), SJ_OK);
        assert_int_equal(graph_call(rt, fn, &w, &dx, &dy.t, what), SJ_OK);
        sj_stats s = stats_of(fn);
        if (round == 0) {
            assert_int_equal(s.graphs, 1);
            assert_int_equal(s.graph_calls, 1);
            one = s.graph_bytes;
            assert_true(one >= ((uint64_t)4 << 20)); /* the workspace at least */
            print_message("one encoder graph at S=%lld holds %llu bytes\n", (long long)S, (unsigned long long)one);
        } else if (round == 1) {
            assert_int_equal(s.graphs, 1);
            assert_int_equal(s.graph_bytes, one);
            /* another output buffer: its graph evicts the first */
            for (int i = 0; i < SJ_GRAPH_AFTER; i++)
                assert_int_equal(graph_call(rt, fn, &w, &dx, &dy2.t, what), SJ_OK);
            s = stats_of(fn);
            assert_int_equal(s.graphs, 2);
            assert_int_equal(s.graph_evictions, 1);
            assert_int_equal(s.graph_bytes, one);
            assert_int_equal(atomic_load(&rt->cuda_graphs), 1);
            uint64_t before = s.graph_calls;
            assert_int_equal(graph_call(rt, fn, &w, &dx, &dy2.t, what), SJ_OK); /* a graph */
            assert_int_equal(graph_call(rt, fn, &w, &dx, &dy.t, what), SJ_OK);  /* evicted: kernel by kernel */
            assert_int_equal(stats_of(fn).graph_calls, before + 1);
        } else {
            assert_int_equal(s.graphs, 0);
            assert_int_equal(s.graph_calls, 0);
            assert_int_equal(s.graphs_over_budget, 1);
            assert_int_equal(s.graph_failures, 1);
            assert_int_equal(s.graph_bytes, 0);
            assert_int_equal(atomic_load(&rt->cuda_graphs), 0);
        }
        sj_fn_destroy(fn);
        free_dev(rt, &dx);
        free_dev(rt, &dy);
        free_dev(rt, &dy2);
        tu_free_all();
        sj_runtime_destroy(rt);
    }
}

/* -- Lanes: sj_call from several threads at once ------------------------------------------ */

static sj_status lane_model(sj_tracer *t, const sj_val *in, int n, void *u) {
    (void)n, (void)u;
    return sj_output(t, sj_add(t, sj_mul(t, in[0], sj_scalar(t, 3.0)), sj_tanh(t, in[0])));
}

typedef struct lane_job {
    sj_fn *fn;
    sj_cuda *cu;
    dbuf dx, dy;
    const float *x; /* host input */
    int64_t n;
    int bad, failures;
} lane_job;

static void *lane_thread(void *p) {
    lane_job *j = p;
    float *y = malloc(sizeof(float) * (size_t)j->n);
    for (int it = 0; it < 20 && y; it++) {
        sj_tensor out = j->dy.t;
        if (sj_call(j->fn, &j->dx.t, 1, &out, 1) || sj_cuda_to_host(j->cu, y, j->dy.base, sizeof(float) * (size_t)j->n)) {
            j->failures++;
            continue;
        }
        for (int64_t i = 0; i < j->n; i++) {
            double ref = 3.0 * j->x[i] + tanh(j->x[i]);
            j->bad += !(fabs(y[i] - ref) <= 1e-5 * (1 + fabs(ref)));
        }
    }
    j->failures += !y;
    free(y);
    return NULL;
}

/* A call that finds another in flight runs on a lane, a stream of the
 * runtime's, and still sees the work queued on the runtime's stream before
 * it: here an input written by a copy queued behind a 1 GiB memset, which
 * a lane not ordered after the runtime's stream would read before it lands
 * (the input is NaN until then). Then 12 threads at once, more than the
 * lanes made at start, each result checked. */
static void test_lanes(void **state) {
    sj_runtime *rt = gpu_runtime(SJ_COMPILE_SYNC);
    sj_cuda *cu = sj_cuda_of(rt->backend);
    sj_fn *fn;
    assert_int_equal(sj_fn_create(rt, "lanes", 1, lane_model, NULL, NULL, &fn), SJ_OK);
    tu_seed(31);
    enum { N = 1 << 20, T = 12 };
    const size_t SCRATCH = (size_t)1 << 30;
    sj_tensor hx = tu_tensor(SJ_F32, 1, (int64_t[]){N}), poison = tu_tensor(SJ_F32, 1, (int64_t[]){N});
    tu_fill_random(&hx);
    memset(poison.data, 0xFF, sizeof(float) * N);
    dbuf src = to_dev(rt, &hx), dx = to_dev(rt, &poison), dy = to_dev(rt, &poison);
    CUdeviceptr scratch = sj_cuda_alloc(cu, SCRATCH, cu->stream);
    assert_true(scratch != 0);
    float *y = malloc(sizeof(float) * N);
    assert_non_null(y);
    const float *x = hx.data;
    uint64_t taken0 = sj_cuda_lanes_taken(rt->backend);
    sj_cuda_lanes_test_busy(rt->backend, 1); /* as if another call were in flight */
    for (int round = 0; round < 3; round++) {
        assert_int_equal(sj_cuda_to_device(cu, dx.base, poison.data, sizeof(float) * N), SJ_OK);
        sj_cuda_bind(cu);
        assert_int_equal(cu->api.MemsetD8Async(scratch, (unsigned char)round, SCRATCH, cu->stream), CUDA_SUCCESS);
        assert_int_equal(cu->api.MemcpyDtoDAsync(dx.base, src.base, sizeof(float) * N, cu->stream), CUDA_SUCCESS);
        sj_tensor out = dy.t;
        assert_int_equal(sj_call(fn, &dx.t, 1, &out, 1), SJ_OK);
        assert_int_equal(sj_cuda_to_host(cu, y, dy.base, sizeof(float) * N), SJ_OK);
        for (int64_t i = 0; i < N; i++) {
            double ref = 3.0 * x[i] + tanh(x[i]);
            if (!(fabs(y[i] - ref) <= 1e-5 * (1 + fabs(ref))))
                fail_msg("round %d: element %lld is %.9g, expected %.9g", round, (long long)i, y[i], ref);
        }
    }
    assert_int_equal(sj_cuda_lanes_taken(rt->backend) - taken0, 3);

    /* 12 threads, each its own buffers and length, all on lanes */
    lane_job jobs[T];
    pthread_t th[T];
    for (int t = 0; t < T; t++) {
        int64_t n = 1000 + 997 * t;
        sj_tensor h = hx;
        h.shape[0] = n;
        jobs[t] = (lane_job){.fn = fn, .cu = cu, .dx = to_dev(rt, &h), .dy = to_dev(rt, &h), .x = x, .n = n};
    }
    for (int t = 0; t < T; t++) assert_int_equal(pthread_create(&th[t], NULL, lane_thread, &jobs[t]), 0);
    for (int t = 0; t < T; t++) pthread_join(th[t], NULL);
    for (int t = 0; t < T; t++) {
        assert_int_equal(jobs[t].failures, 0);
        assert_int_equal(jobs[t].bad, 0);
        free_dev(rt, &jobs[t].dx);
        free_dev(rt, &jobs[t].dy);
    }
    assert_int_equal(sj_cuda_lanes_taken(rt->backend) - taken0, 3 + T * 20);

    /* alone again: the runtime's stream */
    sj_cuda_lanes_test_busy(rt->backend, -1);
    sj_tensor out = dy.t;
    assert_int_equal(sj_call(fn, &dx.t, 1, &out, 1), SJ_OK);
    assert_int_equal(sj_cuda_lanes_taken(rt->backend) - taken0, 3 + T * 20);
    assert_int_equal(stats_of(fn).errors, 0);
    free(y);
    sj_cuda_free(cu, scratch, cu->stream);
    free_dev(rt, &src);
    free_dev(rt, &dx);
    free_dev(rt, &dy);
    sj_fn_destroy(fn);
    sj_runtime_destroy(rt);
    tu_free_all();
}

/* -- Background compile, faults, streams ------------------------------------------------- */

static void test_async_hot_swap_and_faults(void **state) {
    sj_runtime *rt = gpu_runtime(SJ_COMPILE_ASYNC);
    sj_runtime_test_hooks(rt, 300, 0);
    sj_fn *fn = hot_fn(rt, "slow", 3, w1_model);
    tu_seed(14);
    sj_tensor in[4];
    make_inputs(0, 64, in);
    compare(rt, fn, w1_model, NULL, in, 3, 1, 1e-5, "eager while compiling");
    sj_stats s;
    sj_fn_stats(fn, &s);
    assert_int_equal(s.eager_calls, 1);
    assert_int_equal(sj_fn_wait_idle(fn, 20000), SJ_OK);
    compare(rt, fn, w1_model, NULL, in, 3, 1, 1e-5, "fused after the swap");
    sj_fn_stats(fn, &s);
    assert_int_equal(s.fused_specialized_calls, 1);
    sj_runtime_destroy(rt);
    tu_free_all();

    rt = gpu_runtime(SJ_COMPILE_SYNC);
    sj_runtime_test_hooks(rt, 0, 1); /* every NVRTC compile fails */
    fn = hot_fn(rt, "broken", 3, w1_model);
    make_inputs(0, 9, in);
    compare(rt, fn, w1_model, NULL, in, 3, 1, 1e-5, "eager after a failed compile");
    sj_fn_stats(fn, &s);
    assert_int_equal(s.compile_failures, 1);
    assert_int_equal(s.eager_calls, 1);
    sj_runtime_destroy(rt);
    tu_free_all();
}

/* NVRTC cannot be killed: past compile_timeout_ms the compile is abandoned
 * (it finishes on its own thread), the call is served eagerly and right,
 * and destroy does not wait for it. */
static void test_nvrtc_timeout(void **state) {
    for (int mode = 0; mode < 2; mode++) {
        sj_runtime_config cfg = tu_cuda_config();
        cfg.compile_mode = mode ? SJ_COMPILE_ASYNC : SJ_COMPILE_SYNC;
        cfg.compile_timeout_ms = 1; /* any NVRTC compile takes longer */
        sj_runtime *rt = NULL;
        assert_int_equal(sj_runtime_create(&cfg, &rt), SJ_OK);
        sj_fn *fn = hot_fn(rt, "nvrtc_slow", 3, w1_model);
        tu_seed(31 + mode);
        sj_tensor in[4];
        make_inputs(0, 77, in);
        compare(rt, fn, w1_model, NULL, in, 3, 1, 1e-5, "eager past the NVRTC timeout");
        if (mode == 0) {
            sj_stats s;
            sj_fn_stats(fn, &s);
            assert_int_equal(s.compile_failures, 1);
            assert_int_equal(s.eager_calls, 1);
            char *text = tu_explain(fn);
            assert_non_null(strstr(text, "NVRTC did not finish in 1 ms"));
            free(text);
        }
        double t0 = tu_now_ms();
        sj_fn_destroy(fn); /* async: a compile may be running; not waited for */
        sj_runtime_destroy(rt);
        assert_true(tu_now_ms() - t0 < 5000);
        tu_free_all();
    }
    /* the abandoned compiles end on their own and free their work */
    for (int i = 0; i < 600 && sj_bounded_abandoned() > 0; i++) nanosleep(&(struct timespec){0, 50 * 1000000}, NULL);
    assert_int_equal(sj_bounded_abandoned(), 0);
}

/* The validated swap on the device: kernels made wrong by the test hook
 * never reach the caller (sj_call and sj_call_stream), right ones serve
 * after their checks. */
static void test_validated_swap_on_device(void **state) {
    for (int wrong = 1; wrong >= 0; wrong--) {
        sj_runtime_config cfg = tu_cuda_config();
        cfg.compile_mode = SJ_COMPILE_SYNC;
        cfg.validate_calls = 2;
        sj_runtime *rt = NULL;
        assert_int_equal(sj_runtime_create(&cfg, &rt), SJ_OK);
        sj_runtime_test_wrong_kernels(rt, wrong ? 0.25f : 0);
        sj_fn *fn = hot_fn(rt, "validated", 3, w1_model);
        tu_seed(41 + wrong);
        sj_tensor in[4];
        make_inputs(0, 300, in);
        for (int i = 0; i < 6; i++) compare(rt, fn, w1_model, NULL, in, 3, 1, 1e-5, "validated swap");
        sj_stats s;
        sj_fn_stats(fn, &s);
        if (wrong) {
            assert_int_equal(s.validation_failures, 1);
            assert_int_equal(s.validations, 1);
            assert_int_equal(s.fused_specialized_calls + s.fused_symbolic_calls, 0);
            sj_entry_info info;
            sj_fn_entries(fn, &info, 1);
            assert_string_equal(info.tier, "rejected by validation");
        } else {
            assert_int_equal(s.validation_failures, 0);
            assert_int_equal(s.validations, 2);
            assert_int_equal(s.fused_specialized_calls + s.fused_symbolic_calls, 4);
        }
        sj_runtime_destroy(rt);
        tu_free_all();
    }
}

static void test_stream_api_and_bad_input(void **state) {
    sj_runtime *rt = gpu_runtime(SJ_COMPILE_SYNC);
    sj_fn *fn;
    assert_int_equal(sj_fn_create(rt, "stream", 3, w1_model, NULL, NULL, &fn), SJ_OK);
    tu_seed(15);
    sj_tensor in[4];
    make_inputs(0, 5, in);
    /* host inputs on the CUDA backend: a clear error, then a good call */
    sj_tensor out = {0};
    assert_int_equal(sj_call(fn, in, 3, &out, 1), SJ_EINVAL);
    if (!strstr(sj_last_error(), "host memory; the CUDA backend takes device")) fail_msg("%s", sj_last_error());
    /* the caller's stream, outputs ready once it is synchronised */
    CUstream s2;
    sj_cuda_bind(sj_cuda_of(rt->backend));
    assert_int_equal(sj_cuda_of(rt->backend)->api.StreamCreate(&s2, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    dbuf d[3];
    sj_tensor din[3];
    for (int i = 0; i < 3; i++) d[i] = to_dev(rt, &in[i]), din[i] = d[i].t;
    for (int rep = 0; rep < 3; rep++) {
        sj_tensor o = {0};
        assert_int_equal(sj_call_stream(fn, din, 3, &o, 1, (void *)s2), SJ_OK);
        assert_int_equal(sj_cuda_of(rt->backend)->api.StreamSynchronize(s2), CUDA_SUCCESS);
        sj_tensor h = to_host(rt, &o);
        sj_tensor ref = {0};
        assert_int_equal(sj_call(fn, din, 3, &ref, 1), SJ_OK);
        sj_tensor hr = to_host(rt, &ref);
        /* the two calls may run different tiers (eager, then fused) */
        const float *a = h.data, *b = hr.data;
        for (int64_t k = 0; k < tu_numel(&h); k++)
            if (!(fabsf(a[k] - b[k]) <= 1e-5f * (1.0f + fabsf(b[k]))))
                fail_msg("stream call differs at %lld: %.9g vs %.9g", (long long)k, a[k], b[k]);
        sj_tensor_free(rt, &o);
        sj_tensor_free(rt, &ref);
    }
    for (int i = 0; i < 3; i++) free_dev(rt, &d[i]);
    sj_cuda_of(rt->backend)->api.StreamDestroy(s2);
    assert_true(sj_runtime_stream(rt) != NULL);
    /* sj_tensor_alloc / sj_tensor_copy round trip */
    sj_tensor dt = {.dtype = SJ_F32, .rank = 1, .shape = {100}, .device = SJ_CUDA};
    assert_int_equal(sj_tensor_alloc(rt, &dt), SJ_OK);
    sj_tensor h = tu_tensor(SJ_F32, 1, (int64_t[]){100}), back = tu_tensor(SJ_F32, 1, (int64_t[]){100});
    tu_fill_random(&h);
    assert_int_equal(sj_tensor_copy(rt, &dt, &h), SJ_OK);
    assert_int_equal(sj_tensor_copy(rt, &back, &dt), SJ_OK);
    assert_memory_equal(h.data, back.data, 400);
    sj_tensor_free(rt, &dt);
    sj_runtime_destroy(rt);
    tu_free_all();
}

static void test_buckets_on_device(void **state) {
    sj_runtime *rt = gpu_runtime(SJ_COMPILE_SYNC);
    sj_fn *fn = hot_fn(rt, "buckets", 4, w2_model);
    assert_int_equal(sj_set_buckets_pow2(fn, 0, 0, 16, 512), SJ_OK);
    tu_seed(16);
    compare_at_sizes(rt, fn, 1, (const int64_t[]){17, 31, 32, 100, 600, 3}, 6, "bucketed w2");
    sj_stats s;
    sj_fn_stats(fn, &s);
    assert_int_equal(s.eager_calls, 0);
    assert_int_equal(s.entries, 4); /* (16,32] for 17, 31, 32; (64,128]; (512,inf); (0,16] for 3 */
    sj_runtime_destroy(rt);
}

/* One encoder call of S tokens on buffers dx, dy made for more: x fresh
 * random data, the result checked against float64. */
static void bucket_call(sj_runtime *rt, sj_fn *fn, const tu_encoder *w, const dbuf *dx, const dbuf *dy, int64_t S,
                        const char *what) {
    dbuf x = *dx, y = *dy;
    x.t.shape[1] = S, x.t.stride[0] = S * w->h;
    y.t.shape[1] = S, y.t.stride[0] = S * w->h;
    char at[128];
    snprintf(at, sizeof at, "%s S=%lld", what, (long long)S);
    sj_status st = graph_call(rt, fn, w, &x, &y.t, at);
    if (st) fail_msg("%s: %s", at, sj_last_error());
}

/* Graphs that serve a whole bucket (cfg.bucket_graphs, issue 28): the
 * encoder with S in pow2 buckets. After SJ_GRAPH_AFTER calls of a bucket
 * ran kernel by kernel (sizes that never repeat, so no shape's own graph),
 * the bucket's graph is captured (sync compile mode: by the call that
 * asked), and then every call of any size in that bucket is one replay,
 * its results equal to float64 (every size of the bucket, in random order,
 * repeated sizes too; the update skipped for a repeat); another bucket
 * gets its own; with bucket_graphs 0 none is captured. Also after a
 * warm-up of the buckets: the first calls are replays. */
static void test_bucket_graphs(void **state) {
    (void)state;
    for (int d = 0; d < 2; d++)
        for (int on = 1; on >= 0; on--) {
            sj_runtime_config cfg = tu_cuda_config();
            cfg.compile_mode = SJ_COMPILE_SYNC;
            cfg.bucket_graphs = on;
            sj_runtime *rt = NULL;
            if (sj_runtime_create(&cfg, &rt)) fail_msg("CUDA runtime: %s", sj_last_error());
            sj_dtype dt = d ? SJ_F16 : SJ_F32;
            tu_seed(40 + d);
            tu_encoder w;
            sj_fn *fn = encoder_fn(rt, &w, dt, SJ_DYNAMIC_SYMBOLIC, "bucket_graphs");
            assert_int_equal(sj_set_buckets_pow2(fn, 0, 1, 16, 128), SJ_OK);
            sj_tensor hx = tu_tensor(dt, 3, (int64_t[]){1, 128, w.h});
            dbuf dx = to_dev(rt, &hx), dy = to_dev(rt, &hx);
            char what[96];
            snprintf(what, sizeof what, "bucket graphs %s on=%d", sj_dtype_name(dt), on);
            /* (64, 128]: 65..112, each size once, then the bucket's graph */
            for (int i = 0; i < SJ_GRAPH_AFTER; i++) bucket_call(rt, fn, &w, &dx, &dy, 65 + i, what);
            assert_int_equal(stats_of(fn).graph_calls, 0);
            assert_int_equal(sj_fn_wait_idle(fn, -1), SJ_OK);
            int served = 0;
            for (int64_t S = 128; S > 64; S -= 3, served++) bucket_call(rt, fn, &w, &dx, &dy, S, what);
            for (int i = 0; i < 3; i++, served++) bucket_call(rt, fn, &w, &dx, &dy, 99, what); /* repeats */
            for (int i = 0; i < 12; i++, served++) bucket_call(rt, fn, &w, &dx, &dy, tu_randint(65, 128), what);
            sj_stats s = stats_of(fn);
            assert_int_equal(s.eager_calls, 0);
            assert_int_equal(s.bucket_graphs, on ? 1 : 0);
            assert_int_equal(s.bucket_graph_calls, on ? served : 0);
            assert_int_equal(s.graph_calls, on ? served : 0);
            /* (32, 64] runs kernel by kernel until its own bucket graph */
            for (int i = 0; i < SJ_GRAPH_AFTER; i++) bucket_call(rt, fn, &w, &dx, &dy, 33 + (i % 32), what);
            for (int64_t S = 33; S <= 64; S += 5) bucket_call(rt, fn, &w, &dx, &dy, S, what);
            s = stats_of(fn);
            assert_int_equal(s.bucket_graphs, on ? 2 : 0);
            assert_int_equal(s.bucket_graph_calls, on ? served + 7 : 0);
            assert_int_equal(s.graph_failures, 0);
            sj_fn_destroy(fn);

            /* a warm-up of the buckets asks for their graphs at once */
            fn = encoder_fn(rt, &w, dt, SJ_DYNAMIC_SYMBOLIC, "bucket_graphs_warm");
            assert_int_equal(sj_set_buckets_pow2(fn, 0, 1, 16, 128), SJ_OK);
            sj_tensor tmpl = hx;
            tmpl.data = NULL;
            sj_warmup_spec spec = {.walk = &tmpl, .walk_max = 128};
            assert_int_equal(sj_fn_warmup(fn, &spec, 0), SJ_OK);
            for (int64_t S = 2; S <= 128; S += 9) bucket_call(rt, fn, &w, &dx, &dy, S, what);
            s = stats_of(fn);
            assert_int_equal(s.eager_calls, 0);
            assert_int_equal(s.bucket_graphs, on ? 4 : 0);
            assert_int_equal(s.bucket_graph_calls, on ? 15 : 0);
            sj_fn_destroy(fn);
            free_dev(rt, &dx);
            free_dev(rt, &dy);
            tu_free_all();
            sj_runtime_destroy(rt);
        }
}

/* A bucket graph's copies (cfg.bucket_graph_execs, issue 28): with 3
 * copies (2 instantiated beside the captured one, at the capture), the
 * sizes A B C update one copy each, A B C again replay with no update, D
 * updates the least recently replayed (A's), A then updates B's, C is
 * still held, B updates D's: 6 updates. With 1 copy every change of size
 * updates (10). Every call has fresh random inputs (the graph's input
 * copy kernels must read the caller's buffer on a replay with no update)
 * and is checked against float64, so a copy replayed with another size's
 * kernels fails. */
static void test_bucket_graph_copies(void **state) {
    (void)state;
    const int64_t seq[] = {70, 99, 128, 70, 99, 128, 81, 70, 128, 99};
    const int n = (int)(sizeof seq / sizeof seq[0]);
    for (int copies = 3; copies >= 1; copies -= 2) {
        sj_runtime_config cfg = tu_cuda_config();
        cfg.compile_mode = SJ_COMPILE_SYNC;
        cfg.bucket_graph_execs = copies;
        sj_runtime *rt = NULL;
        if (sj_runtime_create(&cfg, &rt)) fail_msg("CUDA runtime: %s", sj_last_error());
        sj_cuda *cu = sj_cuda_of(rt->backend);
        tu_seed(43);
        tu_encoder w;
        sj_fn *fn = encoder_fn(rt, &w, SJ_F16, SJ_DYNAMIC_SYMBOLIC, "bucket_graph_copies");
        assert_int_equal(sj_set_buckets_pow2(fn, 0, 1, 16, 128), SJ_OK);
        sj_tensor hx = tu_tensor(SJ_F16, 3, (int64_t[]){1, 128, w.h});
        dbuf dx = to_dev(rt, &hx), dy = to_dev(rt, &hx);
        const char *what = tu_label("bucket graph copies %d", copies);
        uint64_t i0 = atomic_load(&cu->bg_instantiated);
        for (int i = 0; i < SJ_GRAPH_AFTER; i++) bucket_call(rt, fn, &w, &dx, &dy, 65 + i, what);
        assert_int_equal(sj_fn_wait_idle(fn, -1), SJ_OK);
        assert_int_equal(stats_of(fn).bucket_graphs, 1);
        assert_int_equal(atomic_load(&cu->bg_instantiated) - i0, copies - 1);
        uint64_t u0 = atomic_load(&cu->bg_updates);
        for (int i = 0; i < n; i++) bucket_call(rt, fn, &w, &dx, &dy, seq[i], what);
        sj_stats s = stats_of(fn);
        assert_int_equal(s.bucket_graph_calls, n);
        assert_int_equal(s.eager_calls, 0);
        assert_int_equal(atomic_load(&cu->bg_updates) - u0, copies == 3 ? 6 : n);
        assert_int_equal(atomic_load(&cu->bg_instantiated) - i0, copies - 1);
        sj_fn_destroy(fn);
        free_dev(rt, &dx);
        free_dev(rt, &dy);
        tu_free_all();
        sj_runtime_destroy(rt);
    }
}

/* Quick compiles on the device (cfg.compile_quick, issue 28): the
 * encoder's entry, whose first call ran eagerly, gets a quick NVRTC unit
 * first (where NVRTC has its fast compile) whose fused results equal
 * float64; its full unit replaces it by the end of sj_fn_wait_idle, and
 * the results equal float64 again; then its calls get a graph as usual.
 * compile_quick 0: the full unit only. */
static void test_quick_then_full_on_device(void **state) {
    (void)state;
    for (int on = 1; on >= 0; on--) {
        sj_runtime_config cfg = tu_cuda_config();
        cfg.compile_mode = SJ_COMPILE_ASYNC;
        cfg.compile_quick = on;
        sj_runtime *rt = NULL;
        if (sj_runtime_create(&cfg, &rt)) fail_msg("CUDA runtime: %s", sj_last_error());
        const sj_cuda *cu = sj_cuda_of(rt->backend);
        bool has = on && cu->nvrtc_major * 100 + cu->nvrtc_minor >= SJ_NVRTC_QUICK_SINCE;
        tu_seed(44 + on);
        tu_encoder w;
        sj_fn *fn = encoder_fn(rt, &w, SJ_F16, SJ_DYNAMIC_SYMBOLIC, "quick");
        sj_tensor hx = tu_tensor(SJ_F16, 3, (int64_t[]){1, 40, w.h});
        dbuf dx = to_dev(rt, &hx), dy = to_dev(rt, &hx);
        const char *what = tu_label("quick %d", on);
        assert_int_equal(graph_call(rt, fn, &w, &dx, &dy.t, what), SJ_OK); /* eager: the compile queued */
        for (int i = 0; i < 30000 && stats_of(fn).compiles == 0; i++) usleep(1000);
        sj_stats s = stats_of(fn);
        assert_int_equal(s.compiles, 1);
        assert_int_equal(s.quick_compiles, has);
        assert_int_equal(graph_call(rt, fn, &w, &dx, &dy.t, what), SJ_OK); /* fused: the quick unit, or the full */
        assert_int_equal(sj_fn_wait_idle(fn, 60000), SJ_OK);
        s = stats_of(fn);
        assert_int_equal(s.quick_replaced, has);
        assert_int_equal(s.eager_calls, 1);
        for (int i = 0; i < SJ_GRAPH_AFTER + 2; i++) assert_int_equal(graph_call(rt, fn, &w, &dx, &dy.t, what), SJ_OK);
        assert_int_equal(sj_fn_wait_idle(fn, 60000), SJ_OK);
        assert_int_equal(graph_call(rt, fn, &w, &dx, &dy.t, what), SJ_OK);
        s = stats_of(fn);
        assert_true(s.graphs >= 1);
        assert_true(s.graph_calls >= 1);
        assert_int_equal(s.eager_calls, 1);
        sj_fn_destroy(fn);
        free_dev(rt, &dx);
        free_dev(rt, &dy);
        tu_free_all();
        sj_runtime_destroy(rt);
    }
}

/* Warm-up on the device (sj_fn_warmup, issue 28): after a blocking walk of
 * the buckets, the first call of every warmed size (and of sizes inside
 * its bucket) is fused, with no compile and no trace during the calls and
 * results equal to float64; warm-up runs are not calls. A shape warmed with
 * the caller's buffers is captured into a CUDA graph at once (not after
 * SJ_GRAPH_AFTER calls), and the first sj_call with those buffers is one
 * graph launch; SJ_WARMUP_NO_GRAPHS captures none. Destroying a function
 * during a background warm-up returns. */
static void test_warmup_on_device(void **state) {
    (void)state;
    /* graphs of exact shapes alone (test_bucket_graphs warms bucket graphs) */
    sj_runtime_config cfg = tu_cuda_config();
    cfg.compile_mode = SJ_COMPILE_ASYNC;
    cfg.bucket_graphs = 0;
    sj_runtime *rt = NULL;
    if (sj_runtime_create(&cfg, &rt)) fail_msg("CUDA runtime: %s", sj_last_error());
    tu_seed(28);
    tu_encoder w;
    sj_fn *fn = encoder_fn(rt, &w, SJ_F32, SJ_DYNAMIC_AUTO, "warm");
    assert_int_equal(sj_set_buckets_pow2(fn, 0, 1, 16, 64), SJ_OK);
    sj_tensor tpl = sj_tensor_make(NULL, SJ_F32, 3, (int64_t[]){1, 16, w.h});
    sj_warmup_spec spec = {.walk = &tpl};
    if (sj_fn_warmup(fn, &spec, 0)) fail_msg("warm-up: %s", sj_last_error());
    assert_int_equal(sj_fn_ready(fn), 1);
    sj_warmup_status ws;
    sj_fn_warmup_status(fn, &ws);
    assert_int_equal(ws.total, 3); /* S edges 16, 32, 64 */
    assert_int_equal(ws.prepared, 3);
    sj_stats s0 = stats_of(fn);
    assert_int_equal(s0.calls, 0);
    assert_int_equal(s0.warmup_runs, 3);
    assert_int_equal(s0.compiles, 3);
    const int64_t sizes[] = {16, 32, 64, 20, 50};
    for (int i = 0; i < 5; i++) {
        sj_tensor hx = tu_tensor(SJ_F32, 3, (int64_t[]){1, sizes[i], w.h});
        dbuf dx = to_dev(rt, &hx), dy = to_dev(rt, &hx);
        const char *what = tu_label("warmed S=%lld", (long long)sizes[i]);
        assert_int_equal(graph_call(rt, fn, &w, &dx, &dy.t, what), SJ_OK);
        free_dev(rt, &dx);
        free_dev(rt, &dy);
    }
    sj_stats s1 = stats_of(fn);
    assert_int_equal(s1.calls, 5);
    assert_int_equal(s1.eager_calls, 0);
    assert_int_equal(s1.fused_symbolic_calls + s1.fused_specialized_calls, 5);
    assert_int_equal(s1.compiles, s0.compiles);
    assert_int_equal(s1.traces, s0.traces);
    assert_int_equal(s1.graph_calls, 0);

    /* the caller's buffers: a graph for them before the first call */
    sj_tensor hx = tu_tensor(SJ_F32, 3, (int64_t[]){1, 24, w.h});
    tu_fill_random(&hx);
    dbuf dx = to_dev(rt, &hx), dy = to_dev(rt, &hx), dy2 = to_dev(rt, &hx);
    sj_warmup_spec mine = {.n_shapes = 1, .shapes = &dx.t, .outputs = &dy.t, .n_outputs = 1};
    if (sj_fn_warmup(fn, &mine, 0)) fail_msg("warm-up with buffers: %s", sj_last_error());
    sj_warmup_shape_info si;
    assert_int_equal(sj_fn_warmup_shape(fn, 0, &si), SJ_OK);
    assert_int_equal(si.graph, 1);
    sj_stats s2 = stats_of(fn);
    assert_int_equal(s2.graphs, 1);
    assert_int_equal(s2.graph_calls, 0);
    assert_int_equal(graph_call(rt, fn, &w, &dx, &dy.t, "warmed graph"), SJ_OK);
    s2 = stats_of(fn);
    assert_int_equal(s2.graph_calls, 1);
    assert_int_equal(s2.eager_calls, 0);
    /* SJ_WARMUP_NO_GRAPHS: other buffers, none captured */
    mine.outputs = &dy2.t;
    assert_int_equal(sj_fn_warmup(fn, &mine, SJ_WARMUP_NO_GRAPHS), SJ_OK);
    assert_int_equal(stats_of(fn).graphs, 1);
    assert_int_equal(graph_call(rt, fn, &w, &dx, &dy2.t, "no graph"), SJ_OK);
    assert_int_equal(stats_of(fn).graph_calls, 1);
    free_dev(rt, &dx);
    free_dev(rt, &dy);
    free_dev(rt, &dy2);
    sj_fn_destroy(fn);

    /* destroy during a background warm-up (an NVRTC compile in flight is
     * abandoned) */
    fn = encoder_fn(rt, &w, SJ_F32, SJ_DYNAMIC_AUTO, "warm2");
    assert_int_equal(sj_set_buckets_pow2(fn, 0, 1, 16, 256), SJ_OK);
    assert_int_equal(sj_fn_warmup(fn, &spec, SJ_WARMUP_BACKGROUND), SJ_OK);
    sj_fn_destroy(fn);
    sj_runtime_destroy(rt);
    tu_free_all();
}

/* Recompile limits on the device: STATIC entries up to the limit, then the
 * fallback entry serves every other size (results still right); with
 * limit_is_error, SJ_ELIMIT and the function stays usable. */
static void test_limits_on_device(void **state) {
    sj_runtime *rt = gpu_runtime(SJ_COMPILE_SYNC);
    sj_fn_options o;
    sj_fn_options_init(&o);
    o.dynamic = SJ_DYNAMIC_STATIC;
    o.recompile_limit = 2;
    o.hot_threshold = 1;
    sj_fn *fn;
    assert_int_equal(sj_fn_create(rt, "limits", 4, w2_model, NULL, &o, &fn), SJ_OK);
    tu_seed(17);
    compare_at_sizes(rt, fn, 1, (const int64_t[]){3, 5, 7, 9, 3, 11}, 6, "limited w2");
    sj_stats s;
    sj_fn_stats(fn, &s);
    assert_true(s.limit_hits >= 1); /* 7 went past the two static entries */
    assert_int_equal(s.entries, 3); /* two static, one symbolic fallback for 7, 9, 11 */
    sj_fn_destroy(fn);

    o.limit_is_error = 1;
    assert_int_equal(sj_fn_create(rt, "limits_err", 4, w2_model, NULL, &o, &fn), SJ_OK);
    int64_t err_sizes[] = {3, 5, 7, 3};
    for (int i = 0; i < 4; i++) {
        sj_tensor in[4];
        make_inputs(1, err_sizes[i], in);
        if (i == 2) {
            dbuf d[4];
            sj_tensor din[4], out[2] = {{0}};
            for (int k = 0; k < 4; k++) d[k] = to_dev(rt, &in[k]), din[k] = d[k].t;
            assert_int_equal(sj_call(fn, din, 4, out, 2), SJ_ELIMIT);
            assert_null(out[0].data);
            for (int k = 0; k < 4; k++) free_dev(rt, &d[k]);
        } else {
            compare(rt, fn, w2_model, NULL, in, 4, 2, 1e-5, "limited w2 (error mode)");
        }
        tu_free_all();
    }
    sj_fn_destroy(fn);
    sj_runtime_destroy(rt);
}

/* Past the limit, a call that no entry (the fallback included) takes runs
 * on a one-off entry that is freed after the call; through sj_call_stream
 * its results must still be right once the caller's stream is done. */
static void test_transient_entry_on_stream(void **state) {
    sj_runtime *rt = gpu_runtime(SJ_COMPILE_SYNC);
    sj_fn_options o;
    sj_fn_options_init(&o);
    o.dynamic = SJ_DYNAMIC_STATIC;
    o.recompile_limit = 1;
    sj_fn *fn;
    assert_int_equal(sj_fn_create(rt, "transient", 3, w1_model, NULL, &o, &fn), SJ_OK);
    tu_seed(18);
    compare_at_sizes(rt, fn, 0, (const int64_t[]){3, 5}, 2, "limited w1");
    sj_stats s;
    sj_fn_stats(fn, &s);
    uint64_t entries = s.entries;
    /* rank 3: neither entry's guards pass */
    int64_t H = 1027;
    sj_tensor in[3] = {tu_tensor(SJ_F32, 3, (int64_t[]){2, 7, H}), tu_tensor(SJ_F32, 1, &H), tu_tensor(SJ_F32, 1, &H)};
    for (int k = 0; k < 3; k++) tu_fill_random(&in[k]);
    CUstream s2;
    sj_cuda_bind(sj_cuda_of(rt->backend));
    assert_int_equal(sj_cuda_of(rt->backend)->api.StreamCreate(&s2, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    dbuf d[3];
    sj_tensor din[3];
    for (int k = 0; k < 3; k++) d[k] = to_dev(rt, &in[k]), din[k] = d[k].t;
    sj_tensor out = {0};
    assert_int_equal(sj_call_stream(fn, din, 3, &out, 1, (void *)s2), SJ_OK);
    assert_int_equal(sj_cuda_of(rt->backend)->api.StreamSynchronize(s2), CUDA_SUCCESS);
    sj_tensor h = to_host(rt, &out);
    sj_fn *cfn;
    sj_fn_options co;
    sj_fn_options_init(&co);
    assert_int_equal(sj_fn_create(cpu, "transient_ref", 3, w1_model, NULL, &co, &cfn), SJ_OK);
    sj_tensor ref = {0};
    assert_int_equal(sj_call(cfn, in, 3, &ref, 1), SJ_OK);
    int64_t n = tu_numel(&ref);
    double *r = malloc(sizeof(double) * (size_t)n);
    for (int64_t j = 0; j < n; j++) r[j] = tu_get(&ref, j);
    assert_true(tu_check(&h, r, 1e-5, "transient entry on a stream"));
    free(r);
    sj_fn_stats(fn, &s);
    /* past the limit, a shape the fallback entry cannot serve (another
     * rank) gets an entry of its own (up to 8 such), no longer a one-off */
    assert_int_equal(s.entries, entries + 1);
    sj_tensor_free(cpu, &ref);
    sj_fn_destroy(cfn);
    sj_tensor_free(rt, &out);
    for (int k = 0; k < 3; k++) free_dev(rt, &d[k]);
    sj_cuda_of(rt->backend)->api.StreamDestroy(s2);
    sj_fn_destroy(fn);
    sj_runtime_destroy(rt);
    tu_free_all();
}

int main(void) {
    if (!tu_cuda_present()) return 0;
    sj_runtime_config cfg = tu_cuda_config(); /* the same settings on the CPU, eager only */
    cfg.backend = SJ_BACKEND_CPU;
    cfg.compile_mode = SJ_COMPILE_OFF;
    if (sj_runtime_create(&cfg, &cpu)) return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_op_eager),    cmocka_unit_test(test_attention_and_gather),
        cmocka_unit_test(test_fused_patterns),    cmocka_unit_test(test_async_hot_swap_and_faults),
        cmocka_unit_test(test_stream_api_and_bad_input), cmocka_unit_test(test_buckets_on_device),
        cmocka_unit_test(test_limits_on_device),        cmocka_unit_test(test_transient_entry_on_stream),
        cmocka_unit_test(test_params_on_device),  cmocka_unit_test(test_encoder_fused),
        cmocka_unit_test(test_cuda_graphs),       cmocka_unit_test(test_cuda_graphs_threads), cmocka_unit_test(test_lanes),
        cmocka_unit_test(test_cuda_graph_budget),
        cmocka_unit_test(test_arange_slice_dim_on_device), cmocka_unit_test(test_attention_mask_on_device),
        cmocka_unit_test(test_tensor_copy_convert_on_device), cmocka_unit_test(test_gather_graph_captured),
        cmocka_unit_test(test_nvrtc_timeout),     cmocka_unit_test(test_validated_swap_on_device),
        cmocka_unit_test(test_warmup_on_device),  cmocka_unit_test(test_tf32_products),
        cmocka_unit_test(test_bucket_graphs),
        cmocka_unit_test(test_bucket_graph_copies),
        cmocka_unit_test(test_quick_then_full_on_device),
        cmocka_unit_test(test_bucket_graphs_threads),
        cmocka_unit_test(test_pdl_same_results),
    };
    int r = cmocka_run_group_tests_name("cuda_jit", tests, NULL, NULL);
    sj_runtime_destroy(cpu);
    return r;
}

#else /* built without the CUDA toolkit */

int main(void) {
    printf("skipped: no CUDA device (built without the CUDA backend)\n");
    return 0;
}

#endif
