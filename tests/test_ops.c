/* Every op through the public API (tracer + shape inference + eager
 * executor), checked against float64 references on random inputs:
 * broadcasting, strided and transposed inputs, size-0 and size-1 axes,
 * f16/bf16 tolerances, views folded into later ops, and a small encoder
 * layer against a hand-written double implementation. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jit/shapejit.h"
#include "tests/util.h"
#include "tests/util_encoder.h"

static sj_runtime *rt;

static int setup(void **state) {
    sj_runtime_config cfg;
    sj_runtime_config_init(&cfg);
    cfg.backend = SJ_BACKEND_CPU;
    cfg.compile_mode = SJ_COMPILE_OFF; /* eager only: this suite is not about fused kernels */
    cfg.cache_dir = NULL;
    return sj_runtime_create(&cfg, &rt) == SJ_OK ? 0 : -1;
}
static int teardown(void **state) {
    sj_runtime_destroy(rt);
    return 0;
}
static int each_teardown(void **state) {
    tu_free_all();
    return 0;
}

/* -- One op as a model ---------------------------------------------------------- */

typedef struct spec {
    sj_op op;
    int axis, keepdim, causal;
    double f;
    sj_dtype dt;
    int perm[SJ_MAX_RANK];
    int64_t start, end, step;
    int n_in;      /* inputs of the model */
    int absent[4]; /* operand i is SJ_NONE */
} spec;

static sj_status op_model(sj_tracer *t, const sj_val *in, int n, void *u) {
    const spec *s = u;
    sj_val a = n > 0 ? in[0] : SJ_NONE, b = n > 1 ? in[1] : SJ_NONE, c = n > 2 ? in[2] : SJ_NONE,
           d = n > 3 ? in[3] : SJ_NONE;
    if (s->absent[1]) b = SJ_NONE;
    if (s->absent[2]) c = SJ_NONE;
    if (s->absent[3]) d = SJ_NONE;
    sj_val r;
    switch (s->op) {
#define U(OP, f)                                                                                   \
    case OP:                                                                                       \
        r = f(t, a);                                                                               \
        break;
        U(SJ_OP_NEG, sj_neg) U(SJ_OP_ABS, sj_abs) U(SJ_OP_EXP, sj_exp) U(SJ_OP_LOG, sj_log)
        U(SJ_OP_SQRT, sj_sqrt) U(SJ_OP_RSQRT, sj_rsqrt) U(SJ_OP_TANH, sj_tanh) U(SJ_OP_SIGMOID, sj_sigmoid)
        U(SJ_OP_RELU, sj_relu) U(SJ_OP_GELU, sj_gelu) U(SJ_OP_GELU_TANH, sj_gelu_tanh) U(SJ_OP_SILU, sj_silu)
#undef U
#define B(OP, f)                                                                                   \
    case OP:                                                                                       \
        r = f(t, a, b);                                                                            \
        break;
        B(SJ_OP_ADD, sj_add) B(SJ_OP_SUB, sj_sub) B(SJ_OP_MUL, sj_mul) B(SJ_OP_DIV, sj_div)
        B(SJ_OP_MAXIMUM, sj_maximum) B(SJ_OP_MINIMUM, sj_minimum) B(SJ_OP_POW, sj_pow) B(SJ_OP_EQ, sj_eq)
        B(SJ_OP_NE, sj_ne) B(SJ_OP_LT, sj_lt) B(SJ_OP_LE, sj_le) B(SJ_OP_GT, sj_gt) B(SJ_OP_GE, sj_ge)
        B(SJ_OP_MATMUL, sj_matmul) B(SJ_OP_GATHER, sj_gather)
#undef B
    case SJ_OP_WHERE: r = sj_where(t, a, b, c); break;
    case SJ_OP_CAST: r = sj_cast(t, a, s->dt); break;
    case SJ_OP_SUM: r = sj_sum(t, a, s->axis, s->keepdim); break;
    case SJ_OP_MEAN: r = sj_mean(t, a, s->axis, s->keepdim); break;
    case SJ_OP_AMAX: r = sj_amax(t, a, s->axis, s->keepdim); break;
    case SJ_OP_SOFTMAX: r = sj_softmax(t, a, s->axis); break;
    case SJ_OP_LAYER_NORM: r = sj_layer_norm(t, a, b, c, s->f); break;
    case SJ_OP_RMS_NORM: r = sj_rms_norm(t, a, b, s->f); break;
    case SJ_OP_ATTENTION: r = sj_attention(t, a, b, c, d, s->f, s->causal); break;
    case SJ_OP_PERMUTE: r = sj_permute(t, a, s->perm); break;
    case SJ_OP_SLICE: r = sj_slice(t, a, s->axis, s->start, s->end, s->step); break;
    case SJ_OP_CONCAT: r = sj_concat(t, in, n, s->axis); break;
    default: return sj_trace_fail(t, SJ_EINVAL, "op %d not in the test model", (int)s->op);
    }
    return sj_output(t, r);
}

/* Run the one-op model on ins; return the runtime-allocated output. */
static sj_tensor run(const spec *s, const sj_tensor *ins, int n) {
    sj_fn *fn;
    assert_int_equal(sj_fn_create(rt, sj_op_name(s->op), n, op_model, (void *)s, NULL, &fn), SJ_OK);
    sj_tensor out = {0};
    sj_status st = sj_call(fn, ins, n, &out, 1);
    if (st) fail_msg("%s: %s: %s", sj_op_name(s->op), sj_status_name(st), sj_last_error());
    sj_fn_destroy(fn);
    return out;
}

static double *ref_buf(const sj_tensor *out) {
    int64_t n = tu_numel(out);
    return calloc((size_t)(n ? n : 1), sizeof(double));
}

static void check_and_free(sj_tensor *out, double *ref, double tol, const char *what) {
    if (!tu_check(out, ref, tol, what)) fail_msg("%s: mismatch against the float64 reference", what);
    free(ref);
    sj_tensor_free(rt, out);
}

static const sj_dtype floats[] = {SJ_F32, SJ_F16, SJ_BF16};

/* Layouts of an input: 0 contiguous, 1 strided with gaps, 2 axes reversed
 * in memory (a transposed layout) with gaps. */
static sj_tensor make_input(sj_dtype dt, int rank, const int64_t *shape, int layout) {
    static const int layouts[] = {TU_CONTIG, TU_GAP, TU_REVGAP};
    sj_tensor t = tu_tensor_layout(dt, rank, shape, layouts[layout]);
    tu_fill_random(&t);
    return t;
}

/* -- Elementwise ------------------------------------------------------------------ */

static void test_unary_all(void **state) {
    static const sj_op ops[] = {SJ_OP_NEG, SJ_OP_ABS, SJ_OP_EXP, SJ_OP_LOG, SJ_OP_SQRT, SJ_OP_RSQRT,
                                SJ_OP_TANH, SJ_OP_SIGMOID, SJ_OP_RELU, SJ_OP_GELU, SJ_OP_GELU_TANH, SJ_OP_SILU};
    static const int64_t shapes[][3] = {{3, 5, 7}, {1, 4, 1}, {2, 0, 3}};
    tu_seed(101);
    for (size_t o = 0; o < sizeof ops / sizeof ops[0]; o++)
        for (int d = 0; d < 5; d++) {
            sj_dtype dt = d < 3 ? floats[d] : d == 3 ? SJ_I32 : SJ_I64;
            bool int_ok = ops[o] == SJ_OP_NEG || ops[o] == SJ_OP_ABS || ops[o] == SJ_OP_RELU;
            if (d >= 3 && !int_ok) continue;
            for (int s = 0; s < 3; s++)
                for (int layout = 0; layout < 3; layout++) {
                    sj_tensor x = make_input(dt, 3, shapes[s], layout);
                    if (ops[o] == SJ_OP_LOG || ops[o] == SJ_OP_SQRT || ops[o] == SJ_OP_RSQRT)
                        tu_fill_range(&x, 0.05, 3.0);
                    spec sp = {.op = ops[o]};
                    sj_tensor out = run(&sp, &x, 1);
                    double *ref = ref_buf(&out);
                    tu_ref_unary(ops[o], &x, ref);
                    char what[64];
                    snprintf(what, sizeof what, "%s %s shape %d layout %d", sj_op_name(ops[o]), sj_dtype_name(dt), s,
                             layout);
                    check_and_free(&out, ref, tu_tol(dt), what);
                }
        }
    /* rank 0 */
    sj_tensor x = tu_tensor(SJ_F32, 0, NULL);
    tu_fill_random(&x);
    spec sp = {.op = SJ_OP_EXP};
    sj_tensor out = run(&sp, &x, 1);
    assert_int_equal(out.rank, 0);
    assert_float_equal(*(float *)out.data, exp(tu_get(&x, 0)), 1e-5 * exp(tu_get(&x, 0)));
    sj_tensor_free(rt, &out);
}

/* Broadcast patterns: (rank_a, shape_a, rank_b, shape_b). */
typedef struct bcase {
    int ra;
    int64_t a[4];
    int rb;
    int64_t b[4];
} bcase;
static const bcase bcases[] = {
    {2, {3, 4}, 2, {3, 4}}, {2, {3, 4}, 1, {4}},       {2, {3, 1}, 2, {1, 4}},
    {0, {0}, 2, {2, 3}},    {3, {2, 1, 4}, 2, {3, 1}}, {2, {0, 4}, 1, {4}},
};

static void test_binary_all(void **state) {
    static const sj_op ops[] = {SJ_OP_ADD, SJ_OP_SUB, SJ_OP_MUL, SJ_OP_DIV, SJ_OP_MAXIMUM, SJ_OP_MINIMUM, SJ_OP_POW,
                                SJ_OP_EQ,  SJ_OP_NE,  SJ_OP_LT,  SJ_OP_LE,  SJ_OP_GT,      SJ_OP_GE};
    static const sj_dtype dts[] = {SJ_F32, SJ_F16, SJ_BF16, SJ_I32, SJ_I64};
    tu_seed(202);
    for (size_t o = 0; o < sizeof ops / sizeof ops[0]; o++)
        for (size_t d = 0; d < 5; d++)
            for (size_t c = 0; c < sizeof bcases / sizeof bcases[0]; c++)
                for (int layout = 0; layout < 2; layout++) {
                    const bcase *bc = &bcases[c];
                    sj_tensor in[2] = {make_input(dts[d], bc->ra, bc->a, layout),
                                       make_input(dts[d], bc->rb, bc->b, 2 * layout)};
                    if (ops[o] == SJ_OP_POW && d < 3) tu_fill_range(&in[0], 0.1, 2.0);
                    if (ops[o] == SJ_OP_POW && d >= 3) tu_fill_range(&in[1], -1, 4);
                    spec sp = {.op = ops[o]};
                    sj_tensor out = run(&sp, in, 2);
                    sj_tensor ea = tu_broadcast(&in[0], out.rank, out.shape),
                              eb = tu_broadcast(&in[1], out.rank, out.shape);
                    double *ref = ref_buf(&out);
                    tu_ref_binary(ops[o], &ea, &eb, ref);
                    char what[80];
                    snprintf(what, sizeof what, "%s %s case %zu layout %d", sj_op_name(ops[o]), sj_dtype_name(dts[d]),
                             c, layout);
                    bool cmp = ops[o] >= SJ_OP_EQ;
                    assert_int_equal(out.dtype, cmp ? SJ_BOOL : dts[d]);
                    check_and_free(&out, ref, cmp ? 0 : tu_tol(dts[d]), what);
                }
}

static sj_status scalar_model(sj_tracer *t, const sj_val *in, int n, void *u) {
    /* (x * 3 - 0.5) / 2 + maximum(x, 1) with weak scalars on both sides */
    sj_val x = in[0];
    sj_val y = sj_div(t, sj_sub(t, sj_mul(t, sj_scalar(t, 3.0), x), sj_scalar(t, 0.5)), sj_scalar(t, 2.0));
    return sj_output(t, sj_add(t, y, sj_maximum(t, x, sj_scalar(t, 1.0))));
}

static void test_weak_scalars(void **state) {
    static const sj_dtype dts[] = {SJ_F32, SJ_F16, SJ_BF16};
    tu_seed(303);
    for (int d = 0; d < 3; d++) {
        sj_tensor x = make_input(dts[d], 2, (int64_t[]){4, 6}, 1);
        sj_fn *fn;
        assert_int_equal(sj_fn_create(rt, "scalars", 1, scalar_model, NULL, NULL, &fn), SJ_OK);
        sj_tensor out = {0};
        assert_int_equal(sj_call(fn, &x, 1, &out, 1), SJ_OK);
        assert_int_equal(out.dtype, dts[d]);
        double *ref = ref_buf(&out);
        for (int64_t i = 0; i < 24; i++) {
            double v = tu_get(&x, i);
            /* each op rounds to the dtype, as eager execution does */
            double y = tu_round(dts[d], tu_round(dts[d], tu_round(dts[d], 3.0 * v) - 0.5) / 2.0);
            ref[i] = y + fmax(v, 1.0);
        }
        check_and_free(&out, ref, 2 * tu_tol(dts[d]), "weak scalars");
        sj_fn_destroy(fn);
    }
}

static void test_where_and_cast(void **state) {
    static const sj_dtype all[] = {SJ_F32, SJ_F16, SJ_BF16, SJ_I32, SJ_I64, SJ_BOOL};
    tu_seed(404);
    for (int d = 0; d < 5; d++) {
        sj_tensor in[3] = {make_input(SJ_BOOL, 2, (int64_t[]){3, 1}, 0), make_input(all[d], 2, (int64_t[]){3, 5}, 1),
                           make_input(all[d], 1, (int64_t[]){5}, 0)};
        spec sp = {.op = SJ_OP_WHERE};
        sj_tensor out = run(&sp, in, 3);
        sj_tensor c = tu_broadcast(&in[0], 2, out.shape), a = tu_broadcast(&in[1], 2, out.shape),
                  b = tu_broadcast(&in[2], 2, out.shape);
        double *ref = ref_buf(&out);
        tu_ref_where(&c, &a, &b, ref);
        check_and_free(&out, ref, 0, "where");
    }
    for (int from = 0; from < 6; from++)
        for (int to = 0; to < 6; to++) {
            sj_tensor x = make_input(all[from], 2, (int64_t[]){4, 3}, 2);
            if (from < 3) tu_fill_range(&x, -300, 300);
            spec sp = {.op = SJ_OP_CAST, .dt = all[to]};
            sj_tensor out = run(&sp, &x, 1);
            assert_int_equal(out.dtype, all[to]);
            double *ref = ref_buf(&out);
            tu_ref_cast(&x, all[to], ref);
            check_and_free(&out, ref, 0, "cast");
        }
}

/* -- Reductions and normalisations ---------------------------------------------------- */

static void test_reductions(void **state) {
    static const sj_op ops[] = {SJ_OP_SUM, SJ_OP_MEAN, SJ_OP_AMAX};
    static const sj_dtype dts[] = {SJ_F32, SJ_F16, SJ_BF16, SJ_I32, SJ_I64};
    int64_t shape[3] = {3, 5, 4};
    tu_seed(505);
    for (int o = 0; o < 3; o++)
        for (int d = 0; d < 5; d++) {
            if (ops[o] == SJ_OP_MEAN && d >= 3) continue;
            for (int axis = -3; axis < 3; axis++)
                for (int keep = 0; keep < 2; keep++) {
                    sj_tensor x = make_input(dts[d], 3, shape, (axis + 3) % 3);
                    spec sp = {.op = ops[o], .axis = axis, .keepdim = keep};
                    sj_tensor out = run(&sp, &x, 1);
                    assert_int_equal(out.rank, keep ? 3 : 2);
                    double *ref = ref_buf(&out);
                    tu_ref_reduce(ops[o], &x, (axis + 3) % 3, ref);
                    check_and_free(&out, ref, tu_tol(dts[d]), sj_op_name(ops[o]));
                }
        }
    /* an empty axis: sum 0, mean NaN */
    sj_tensor x = tu_tensor(SJ_F32, 2, (int64_t[]){3, 0});
    spec sp = {.op = SJ_OP_SUM, .axis = 1};
    sj_tensor out = run(&sp, &x, 1);
    for (int i = 0; i < 3; i++) assert_float_equal(((float *)out.data)[i], 0.0f, 0);
    sj_tensor_free(rt, &out);
    sp.op = SJ_OP_MEAN;
    out = run(&sp, &x, 1);
    for (int i = 0; i < 3; i++) assert_true(isnan(((float *)out.data)[i]));
    sj_tensor_free(rt, &out);
}

static void test_softmax_and_norms(void **state) {
    tu_seed(606);
    for (int d = 0; d < 3; d++) {
        sj_dtype dt = floats[d];
        for (int axis = 0; axis < 3; axis++) {
            sj_tensor x = make_input(dt, 3, (int64_t[]){2, 7, 33}, axis == 1 ? 2 : 0);
            tu_fill_range(&x, -6, 6);
            spec sp = {.op = SJ_OP_SOFTMAX, .axis = axis};
            sj_tensor out = run(&sp, &x, 1);
            double *ref = ref_buf(&out);
            tu_ref_softmax(&x, axis, ref);
            check_and_free(&out, ref, tu_tol(dt), "softmax");
        }
        for (int variant = 0; variant < 4; variant++) {
            int64_t D = variant == 3 ? 1 : 48;
            sj_tensor in[3] = {make_input(dt, 3, (int64_t[]){2, 5, D}, variant == 2 ? 1 : 0),
                               make_input(dt, 1, &D, 0), make_input(dt, 1, &D, 0)};
            spec sp = {.op = SJ_OP_LAYER_NORM, .f = 1e-5, .absent = {0, variant == 1, variant >= 1}};
            sj_tensor out = run(&sp, in, 3);
            double *ref = ref_buf(&out);
            tu_ref_layer_norm(&in[0], sp.absent[1] ? NULL : &in[1], sp.absent[2] ? NULL : &in[2], 1e-5, ref);
            check_and_free(&out, ref, tu_tol(dt), "layer_norm");

            spec sr = {.op = SJ_OP_RMS_NORM, .f = 1e-6, .absent = {0, variant == 1}};
            out = run(&sr, in, 2);
            ref = ref_buf(&out);
            tu_ref_rms_norm(&in[0], sr.absent[1] ? NULL : &in[1], 1e-6, ref);
            check_and_free(&out, ref, tu_tol(dt), "rms_norm");
        }
    }
}

/* -- Matrix products and attention ----------------------------------------------------- */

typedef struct mcase {
    int ra;
    int64_t a[4];
    int rb;
    int64_t b[4];
    int transpose_b;
} mcase;

static void test_matmul(void **state) {
    static const mcase cases[] = {
        {2, {5, 7}, 2, {7, 3}, 0},       {2, {1, 9}, 2, {9, 1}, 0},       {3, {2, 4, 6}, 2, {6, 5}, 0},
        {4, {2, 1, 3, 4}, 3, {5, 4, 6}, 0}, {2, {6, 8}, 2, {3, 8}, 1},   {2, {3, 0}, 2, {0, 4}, 0},
        {3, {0, 3, 4}, 2, {4, 2}, 0},
    };
    static const sj_dtype dts[] = {SJ_F32, SJ_F16, SJ_BF16, SJ_I32, SJ_I64};
    tu_seed(707);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (int d = 0; d < 5; d++) {
            const mcase *mc = &cases[c];
            sj_tensor a = make_input(dts[d], mc->ra, mc->a, c % 2);
            sj_tensor b = make_input(dts[d], mc->rb, mc->b, 0);
            if (mc->transpose_b) b = tu_transpose(&b, 0, 1); /* a column-major view */
            sj_tensor in[2] = {a, b};
            spec sp = {.op = SJ_OP_MATMUL};
            sj_tensor out = run(&sp, in, 2);
            double *ref = ref_buf(&out), *mag = ref_buf(&out);
            int64_t bs[SJ_MAX_RANK];
            memcpy(bs, out.shape, sizeof bs);
            int64_t as[SJ_MAX_RANK];
            memcpy(as, out.shape, sizeof as);
            as[out.rank - 1] = a.shape[a.rank - 1];
            bs[out.rank - 2] = b.shape[b.rank - 2];
            sj_tensor ea = tu_broadcast(&a, out.rank, as), eb = tu_broadcast(&b, out.rank, bs);
            tu_ref_matmul(&ea, &eb, ref, mag);
            char what[64];
            snprintf(what, sizeof what, "matmul case %zu %s", c, sj_dtype_name(dts[d]));
            if (!tu_check_mag(&out, ref, mag, tu_tol(dts[d]), what)) fail_msg("%s", what);
            free(ref);
            free(mag);
            sj_tensor_free(rt, &out);
        }
}

static void test_attention(void **state) {
    tu_seed(808);
    for (int d = 0; d < 3; d++)
        for (int variant = 0; variant < 4; variant++) {
            int64_t B = 2, H = 3, Sq = variant == 3 ? 4 : 6, Sk = 6, D = 8, Dv = 5;
            sj_dtype dt = floats[d];
            sj_tensor q = make_input(dt, 4, (int64_t[]){B, H, Sq, D}, variant % 2);
            sj_tensor k = make_input(dt, 4, (int64_t[]){B, H, Sk, D}, 0);
            sj_tensor v = make_input(dt, 4, (int64_t[]){B, H, Sk, Dv}, 0);
            sj_tensor len = tu_tensor(variant == 2 ? SJ_I64 : SJ_I32, 1, &B);
            tu_seti(&len, 0, variant == 2 ? 0 : 3); /* 0: a batch with no keys gives zeros */
            tu_seti(&len, 1, 9);                    /* > Sk: clamped */
            sj_tensor in[4] = {q, k, v, len};
            spec sp = {.op = SJ_OP_ATTENTION, .f = 0.35, .causal = variant >= 2, .absent = {0, 0, 0, variant == 0}};
            sj_tensor out = run(&sp, in, 4);
            double *ref = ref_buf(&out), *mag = ref_buf(&out);
            tu_ref_attention(&q, &k, &v, variant == 0 ? NULL : &len, 0.35, sp.causal, ref, mag);
            if (!tu_check_mag(&out, ref, mag, tu_tol(dt), "attention")) fail_msg("attention variant %d", variant);
            free(ref);
            free(mag);
            sj_tensor_free(rt, &out);
        }
}

/* -- Views and data movement -------------------------------------------------------------- */

static void test_permute_slice(void **state) {
    tu_seed(909);
    int64_t shape[4] = {2, 3, 4, 5};
    sj_tensor x = make_input(SJ_F32, 4, shape, 1);
    spec sp = {.op = SJ_OP_PERMUTE, .perm = {2, 0, 3, 1}};
    sj_tensor out = run(&sp, &x, 1);
    assert_int_equal(out.shape[0], 4);
    assert_int_equal(out.shape[3], 3);
    for (int64_t a = 0; a < 4; a++)
        for (int64_t b = 0; b < 2; b++)
            for (int64_t c = 0; c < 5; c++)
                for (int64_t d = 0; d < 3; d++) {
                    float got = ((float *)out.data)[((a * 2 + b) * 5 + c) * 3 + d];
                    assert_float_equal(got, tu_get(&x, ((b * 3 + d) * 4 + a) * 5 + c), 0);
                }
    sj_tensor_free(rt, &out);

    /* Python slicing: start, end, step, negatives, clamping, empty */
    static const int64_t sl[][3] = {{1, 4, 1}, {-3, 100, 2}, {0, -1, 3}, {-100, 2, 1}, {3, 1, 1}, {4, 5, 1}};
    for (size_t i = 0; i < sizeof sl / sizeof sl[0]; i++) {
        spec ss = {.op = SJ_OP_SLICE, .axis = -1, .start = sl[i][0], .end = sl[i][1], .step = sl[i][2]};
        out = run(&ss, &x, 1);
        int64_t s0 = sl[i][0] < 0 ? (sl[i][0] + 5 < 0 ? 0 : sl[i][0] + 5) : (sl[i][0] > 5 ? 5 : sl[i][0]);
        int64_t e0 = sl[i][1] < 0 ? (sl[i][1] + 5 < 0 ? 0 : sl[i][1] + 5) : (sl[i][1] > 5 ? 5 : sl[i][1]);
        int64_t len = e0 > s0 ? (e0 - s0 + sl[i][2] - 1) / sl[i][2] : 0;
        assert_int_equal(out.shape[3], len);
        for (int64_t r = 0; r < 24; r++)
            for (int64_t j = 0; j < len; j++)
                assert_float_equal(((float *)out.data)[r * len + j], tu_get(&x, r * 5 + s0 + j * sl[i][2]), 0);
        sj_tensor_free(rt, &out);
    }
}

/* reshape of a non-contiguous view (a copy), then compute on it */
static sj_status reshape_model(sj_tracer *t, const sj_val *in, int n, void *u) {
    sj_val x = sj_transpose(t, in[0], 0, 1); /* [4, 3] view of [3, 4] */
    sj_val y = sj_reshape_i(t, x, 2, (int64_t[]){2, -1});
    return sj_output(t, sj_mul(t, y, sj_scalar(t, 2.0)));
}

static void test_reshape_noncontiguous(void **state) {
    tu_seed(1010);
    sj_tensor x = make_input(SJ_F32, 2, (int64_t[]){3, 4}, 1);
    sj_fn *fn;
    assert_int_equal(sj_fn_create(rt, "reshape", 1, reshape_model, NULL, NULL, &fn), SJ_OK);
    sj_tensor out = {0};
    assert_int_equal(sj_call(fn, &x, 1, &out, 1), SJ_OK);
    assert_int_equal(out.shape[0], 2);
    assert_int_equal(out.shape[1], 6);
    for (int64_t i = 0; i < 12; i++) {
        int64_t r = i / 3, c = i % 3; /* element i of the [4, 3] transpose */
        assert_float_equal(((float *)out.data)[i], 2 * tu_get(&x, c * 4 + r), 1e-6);
    }
    sj_tensor_free(rt, &out);
    sj_fn_destroy(fn);
}

static void test_concat_gather(void **state) {
    static const sj_dtype all[] = {SJ_F32, SJ_F16, SJ_BF16, SJ_I32, SJ_I64, SJ_BOOL};
    tu_seed(1111);
    for (int d = 0; d < 6; d++)
        for (int axis = 0; axis < 2; axis++) {
            int64_t s0[2] = {3, 4}, s1[2] = {3, 4}, s2[2] = {3, 4};
            s0[axis] = 2, s1[axis] = 0, s2[axis] = 5;
            sj_tensor in[3] = {make_input(all[d], 2, s0, 0), make_input(all[d], 2, s1, 0), make_input(all[d], 2, s2, 2)};
            spec sp = {.op = SJ_OP_CONCAT, .axis = axis - 2};
            sj_tensor out = run(&sp, in, 3);
            assert_int_equal(out.shape[axis], 7);
            double *ref = ref_buf(&out);
            tu_ref_concat(in, 3, axis, ref);
            check_and_free(&out, ref, 0, "concat");
        }
    for (int d = 0; d < 6; d++) {
        sj_tensor table = make_input(all[d], 3, (int64_t[]){10, 2, 3}, 1);
        sj_tensor idx = tu_tensor(d % 2 ? SJ_I64 : SJ_I32, 2, (int64_t[]){2, 4});
        tu_fill_range(&idx, 0, 9);
        sj_tensor in[2] = {table, idx};
        spec sp = {.op = SJ_OP_GATHER};
        sj_tensor out = run(&sp, in, 2);
        assert_int_equal(out.rank, 4);
        double *ref = ref_buf(&out);
        tu_ref_gather(&table, &idx, ref);
        check_and_free(&out, ref, 0, "gather");
    }
}

/* -- A small encoder layer against a double implementation ------------------------------ */

/* tests/util_encoder's layer, eager, with per-batch lengths that mask keys */
static void test_encoder_layer(void **state) {
    tu_seed(1212);
    tu_encoder w;
    tu_encoder_init(&w, SJ_F32, 16, 4, 32);
    sj_fn *fn;
    assert_int_equal(sj_fn_create(rt, "encoder", 2, tu_encoder_model, &w, NULL, &fn), SJ_OK);
    const int64_t B = 2;
    for (int64_t S = 3; S <= 9; S += 3) {
        sj_tensor x = tu_tensor(SJ_F32, 3, (int64_t[]){B, S, w.h});
        tu_fill_random(&x);
        sj_tensor len = tu_tensor(SJ_I32, 1, &B);
        tu_seti(&len, 0, S);
        tu_seti(&len, 1, S - 1);
        sj_tensor in[2] = {x, len}, out = {0};
        assert_int_equal(sj_call(fn, in, 2, &out, 1), SJ_OK);
        double *ref = malloc(sizeof(double) * (size_t)tu_numel(&out));
        tu_encoder_ref(&w, &x, &len, ref);
        if (!tu_check(&out, ref, 1e-4, "encoder")) fail_msg("encoder S=%lld", (long long)S);
        free(ref);
        sj_tensor_free(rt, &out);
    }
    sj_fn_destroy(fn);
}

int main(void) {
#define T(f) cmocka_unit_test_teardown(f, each_teardown)
    const struct CMUnitTest tests[] = {
        T(test_unary_all),      T(test_binary_all),         T(test_weak_scalars),  T(test_where_and_cast),
        T(test_reductions),     T(test_softmax_and_norms),  T(test_matmul),        T(test_attention),
        T(test_permute_slice),  T(test_reshape_noncontiguous), T(test_concat_gather), T(test_encoder_layer),
    };
    return cmocka_run_group_tests_name("ops", tests, setup, teardown);
}
