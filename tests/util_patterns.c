/* The fusion patterns and their harness, shared by test_fusion and
 * test_codegen_cuda; see tests/util_patterns.h. */
/* cmocka.h needs these first, in this order */
/* clang-format off */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
/* clang-format on */

#include "tests/util_patterns.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define S(...) ((const int64_t[]){__VA_ARGS__})

sj_tensor tu_params[8];

sj_tensor tu_rnd(sj_dtype dt, int rank, const int64_t *shape) { return tu_random(dt, rank, shape, TU_CONTIG); }

#define rnd tu_rnd
#define mk_2d tu_mk_2d

/* -- Models ----------------------------------------------------------------- */

/* w1: y = gelu(x*a + b) * sigmoid(x); x [S, H], a, b [H] */
static sj_status m_w1(sj_tracer *t, const sj_val *in, int n, void *u) {
    sj_val y = sj_mul(t, sj_gelu(t, sj_add(t, sj_mul(t, in[0], in[1]), in[2])), sj_sigmoid(t, in[0]));
    return sj_output(t, y);
}
static void mk_w1(const int64_t *d, sj_dtype dt, sj_tensor *in) {
    in[0] = rnd(dt, 2, S(d[0], d[1]));
    in[1] = rnd(dt, 1, S(d[1]));
    in[2] = rnd(dt, 1, S(d[1]));
}
static double d_gelu(double x) { return 0.5 * x * (1.0 + erf(x / sqrt(2.0))); }
static void ref_w1(const sj_tensor *in, double *out) {
    int64_t S0 = in[0].shape[0], H = in[0].shape[1];
    for (int64_t i = 0; i < S0 * H; i++) {
        double x = tu_get(&in[0], i), a = tu_get(&in[1], i % H), b = tu_get(&in[2], i % H);
        out[i] = d_gelu(x * a + b) / (1.0 + exp(-x));
    }
}

/* w2: h = x + r; y = gelu(layer_norm(h, g, b)); outputs y, h */
static sj_status m_w2(sj_tracer *t, const sj_val *in, int n, void *u) {
    sj_val h = sj_add(t, in[0], in[1]);
    sj_output(t, sj_gelu(t, sj_layer_norm(t, h, in[2], in[3], 1e-5)));
    return sj_output(t, h);
}
static void mk_w2(const int64_t *d, sj_dtype dt, sj_tensor *in) {
    in[0] = rnd(dt, 2, S(d[0], d[1]));
    in[1] = rnd(dt, 2, S(d[0], d[1]));
    in[2] = rnd(dt, 1, S(d[1]));
    in[3] = rnd(dt, 1, S(d[1]));
}
static void ref_w2(const sj_tensor *in, double *out) {
    int64_t R = in[0].shape[0], N = in[0].shape[1];
    for (int64_t r = 0; r < R; r++) {
        double m = 0, v = 0;
        for (int64_t j = 0; j < N; j++) m += tu_get(&in[0], r * N + j) + tu_get(&in[1], r * N + j);
        m /= (double)N;
        for (int64_t j = 0; j < N; j++) {
            double h = tu_get(&in[0], r * N + j) + tu_get(&in[1], r * N + j);
            v += (h - m) * (h - m);
        }
        v /= (double)N;
        for (int64_t j = 0; j < N; j++) {
            double h = tu_get(&in[0], r * N + j) + tu_get(&in[1], r * N + j);
            out[r * N + j] = d_gelu((h - m) / sqrt(v + 1e-5) * tu_get(&in[2], j) + tu_get(&in[3], j));
        }
    }
}

/* layer norm of rows whose mean is large against their spread (see
 * test_cpu_kernels' test_layer_norm_offset): x = 4000 + U(-1, 1) [S, N] */
static sj_status m_ln(sj_tracer *t, const sj_val *in, int n, void *u) {
    return sj_output(t, sj_layer_norm(t, in[0], in[1], in[2], 1e-5));
}
static void mk_ln_offset(const int64_t *d, sj_dtype dt, sj_tensor *in) {
    in[0] = rnd(dt, 2, S(d[0], d[1]));
    for (int64_t i = 0; i < tu_numel(&in[0]); i++) tu_set(&in[0], i, 4000.0 + tu_get(&in[0], i));
    in[1] = rnd(dt, 1, S(d[1]));
    in[2] = rnd(dt, 1, S(d[1]));
}
static void ref_ln(const sj_tensor *in, double *out) { tu_ref_layer_norm(&in[0], &in[1], &in[2], 1e-5, out); }

/* w3: softmax(scores * 0.125 + mask [NH, 1, S], -1) */
static sj_status m_w3(sj_tracer *t, const sj_val *in, int n, void *u) {
    return sj_output(t, sj_softmax(t, sj_add(t, sj_mul(t, in[0], sj_scalar(t, 0.125)), in[1]), -1));
}
static void mk_w3(const int64_t *d, sj_dtype dt, sj_tensor *in) {
    in[0] = rnd(dt, 3, S(d[0], d[1], d[1]));
    in[1] = rnd(dt, 3, S(d[0], 1, d[1]));
}
static void ref_w3(const sj_tensor *in, double *out) {
    int64_t NH = in[0].shape[0], N = in[0].shape[1];
    for (int64_t h = 0; h < NH; h++)
        for (int64_t i = 0; i < N; i++) {
            double *o = out + (h * N + i) * N, m = -INFINITY, s = 0;
            for (int64_t j = 0; j < N; j++) {
                o[j] = tu_get(&in[0], (h * N + i) * N + j) * 0.125 + tu_get(&in[1], h * N + j);
                m = o[j] > m ? o[j] : m;
            }
            for (int64_t j = 0; j < N; j++) s += o[j] = exp(o[j] - m);
            for (int64_t j = 0; j < N; j++) o[j] /= s;
        }
}

/* w3 with a mask of -inf: head 0 entirely (its rows softmax to zeros),
 * every third column elsewhere */
static void mk_w3_masked(const int64_t *d, sj_dtype dt, sj_tensor *in) {
    mk_w3(d, dt, in);
    for (int64_t i = 0; i < tu_numel(&in[1]); i++)
        if (i < d[1] || i % 3 == 0) tu_set(&in[1], i, -INFINITY);
}

/* bias + gelu after a matmul (W [24, 40], bias [40] parameters) */
static sj_status m_mmgelu(sj_tracer *t, const sj_val *in, int n, void *u) {
    sj_val m = sj_matmul(t, in[0], sj_param(t, &tu_params[0]));
    return sj_output(t, sj_gelu(t, sj_add(t, m, sj_param(t, &tu_params[1]))));
}
static void mk_mmgelu(const int64_t *d, sj_dtype dt, sj_tensor *in) { in[0] = rnd(dt, 2, S(d[0], 24)); }

/* matrix products and bias adds (W [24, 40], bias [40]: tu_params[0], [1]):
 *   out0 = x @ W + bias                 the add becomes the product's epilogue
 *   out1 = xb @ W + bi                  batched, bias an input [1, 40]: too
 *   out2 = m + bias, out3 = m * 2       m = (x / 2) @ W read twice: not
 *   out4 = p, out5 = p + bias           p = x @ W an output: not
 * x [d0, 24], xb [3, d0, 24], bi [1, 40] */
static sj_status m_mmbias(sj_tracer *t, const sj_val *in, int n, void *u) {
    sj_val w = sj_param(t, &tu_params[0]), bias = sj_param(t, &tu_params[1]);
    sj_output(t, sj_add(t, sj_matmul(t, in[0], w), bias));
    sj_output(t, sj_add(t, sj_matmul(t, in[1], w), in[2]));
    sj_val m = sj_matmul(t, sj_mul(t, in[0], sj_scalar(t, 0.5)), w);
    sj_output(t, sj_add(t, bias, m));
    sj_output(t, sj_mul(t, m, sj_scalar(t, 2.0)));
    sj_val p = sj_matmul(t, in[0], w);
    sj_output(t, p);
    return sj_output(t, sj_add(t, p, bias));
}
static void mk_mmbias(const int64_t *d, sj_dtype dt, sj_tensor *in) {
    in[0] = rnd(dt, 2, S(d[0], 24));
    in[1] = rnd(dt, 3, S(3, d[0], 24));
    in[2] = rnd(dt, 2, S(1, 40));
}
static void ref_mmbias(const sj_tensor *in, double *out) {
    int64_t R = in[0].shape[0];
    for (int64_t r = 0; r < R; r++)
        for (int64_t j = 0; j < 40; j++) {
            double s = tu_get(&tu_params[1], j);
            for (int64_t k = 0; k < 24; k++) s += tu_get(&in[0], r * 24 + k) * tu_get(&tu_params[0], k * 40 + j);
            out[r * 40 + j] = s;
        }
}

/* a transposed input and a slice with a symbolic end; x [A, B], z [B, A + 4] */
static sj_status m_views(sj_tracer *t, const sj_val *in, int n, void *u) {
    sj_val xt = sj_transpose(t, in[0], 0, 1);
    sj_val zs = sj_slice(t, in[1], 1, 2, -2, 1);
    sj_val y = sj_relu(t, sj_add(t, sj_mul(t, xt, sj_scalar(t, 2.0)), zs));
    sj_output(t, y);
    sj_output(t, sj_softmax(t, xt, -1)); /* a row op over strided rows */
    return sj_output(t, sj_exp(t, sj_neg(t, xt)));
}
static void mk_views(const int64_t *d, sj_dtype dt, sj_tensor *in) {
    in[0] = rnd(dt, 2, S(d[0], d[1]));
    in[1] = rnd(dt, 2, S(d[1], d[0] + 4));
}

/* a non-contiguous input (exact strides), a permute and a stepped slice */
static sj_status m_strided(sj_tracer *t, const sj_val *in, int n, void *u) {
    sj_val xt = sj_permute(t, in[0], (const int[]){1, 0});
    sj_val s = sj_slice(t, xt, 0, 1, 1000, 2);
    return sj_output(t, sj_add(t, sj_exp(t, s), sj_scalar(t, 1.0)));
}
static void mk_strided(const int64_t *d, sj_dtype dt, sj_tensor *in) {
    in[0] = tu_tensor_layout(dt, 2, S(d[0], d[1]), TU_GAP);
    tu_fill_random(&in[0]);
}

/* a reshape after a slice (a view) and a reshape needing a copy;
 * x [S, 48], u [A, B] */
static sj_status m_reshape(sj_tracer *t, const sj_val *in, int n, void *u) {
    sj_val sl = sj_slice(t, in[0], 1, 16, 32, 1);
    sj_dim d3[3] = {sj_dim_of(t, in[0], 0), sj_dim_const(t, 4), sj_dim_const(t, 4)};
    sj_output(t, sj_mul(t, sj_reshape(t, sl, 3, d3), sj_scalar(t, 2.0)));
    sj_val ut = sj_transpose(t, in[1], 0, 1);
    sj_dim d1[1] = {sj_dim_mul(t, sj_dim_of(t, in[1], 0), sj_dim_of(t, in[1], 1))};
    return sj_output(t, sj_add(t, sj_reshape(t, ut, 1, d1), sj_scalar(t, 1.0)));
}
static void mk_reshape(const int64_t *d, sj_dtype dt, sj_tensor *in) {
    in[0] = rnd(dt, 2, S(d[0], 48));
    in[1] = rnd(dt, 2, S(d[1], d[2]));
}

/* sum / mean / amax over the last axis, keepdim 0 and 1, with epilogues;
 * x [S, N], c [S], c1 [S, 1], xi i32 [S, N] */
static sj_status m_reduce(sj_tracer *t, const sj_val *in, int n, void *u) {
    sj_val x = in[0];
    sj_val e = sj_exp(t, sj_mul(t, x, sj_scalar(t, 0.5)));
    sj_output(t, sj_add(t, sj_mul(t, sj_sum(t, e, -1, 0), sj_scalar(t, 2.0)), in[1]));
    sj_output(t, sj_sub(t, sj_mean(t, x, -1, 1), in[2]));
    sj_output(t, sj_add(t, sj_amax(t, sj_add(t, x, sj_scalar(t, 1.0)), -1, 0), sj_scalar(t, 3.0)));
    sj_output(t, sj_sum(t, x, -1, 1));
    sj_output(t, sj_sum(t, sj_mul(t, in[3], sj_scalar(t, 2.0)), -1, 0));
    return sj_output(t, sj_add(t, sj_amax(t, in[3], -1, 1), sj_scalar(t, 1.0)));
}
static void mk_reduce(const int64_t *d, sj_dtype dt, sj_tensor *in) {
    in[0] = rnd(dt, 2, S(d[0], d[1]));
    in[1] = rnd(dt, 1, S(d[0]));
    in[2] = rnd(dt, 2, S(d[0], 1));
    in[3] = rnd(SJ_I32, 2, S(d[0], d[1]));
}

/* RMS norm with and without g; softmax (its epilogue reads the prologue),
 * layer norm and mean; x [S, N], g [N] */
static sj_status m_rows(sj_tracer *t, const sj_val *in, int n, void *u) {
    sj_val x = in[0];
    sj_output(t, sj_rms_norm(t, sj_mul(t, x, sj_scalar(t, 2.0)), in[1], 1e-6));
    sj_output(t, sj_add(t, sj_rms_norm(t, x, SJ_NONE, 1e-5), sj_scalar(t, 1.0)));
    sj_val x3 = sj_mul(t, x, sj_scalar(t, 3.0)), sm = sj_softmax(t, x3, -1);
    sj_output(t, sm);
    sj_output(t, sj_add(t, sm, x3));
    sj_val x1 = sj_add(t, x, sj_scalar(t, 1.0));
    sj_output(t, sj_mul(t, sj_layer_norm(t, x1, SJ_NONE, in[1], 1e-5), x1));
    return sj_output(t, sj_mean(t, x, -1, 0));
}
static void mk_rows(const int64_t *d, sj_dtype dt, sj_tensor *in) {
    in[0] = rnd(dt, 2, S(d[0], d[1]));
    in[1] = rnd(dt, 1, S(d[1]));
    /* Rows of two: values of opposite signs, at least 0.2 apart. The norms
     * of two close values (|x0 - x1| near sqrt(eps)) amplify f32 rounding
     * about 100-fold, past any f32 tolerance between two correct kernels
     * (the CUDA form once failed against eager that way: 5e-5 relative). */
    for (int64_t i = 0; d[1] == 2 && i < tu_numel(&in[0]); i++)
        tu_set(&in[0], i, (i % 2 ? 1 : -1) * tu_uniform(0.1, 1.0));
}

/* casts and where in one group */
static sj_status m_casts(sj_tracer *t, const sj_val *in, int n, void *u) {
    sj_val x = in[0];
    sj_val m = sj_gt(t, x, sj_scalar(t, 0.0));
    sj_val back = sj_cast(t, sj_cast(t, sj_mul(t, x, sj_scalar(t, 100.0)), SJ_I32), SJ_F32);
    sj_val w = sj_where(t, m, back, sj_mul(t, x, sj_scalar(t, 0.5)));
    sj_val h = sj_cast(t, sj_cast(t, x, SJ_F16), SJ_F32);
    sj_output(t, sj_add(t, w, h));
    sj_output(t, sj_cast(t, sj_mul(t, x, sj_scalar(t, 3.0)), SJ_BF16));
    sj_output(t, sj_cast(t, sj_mul(t, x, sj_scalar(t, 1e10)), SJ_I32));
    sj_output(t, sj_cast(t, sj_log(t, x), SJ_I64));
    return sj_output(t, sj_cast(t, x, SJ_BOOL));
}
void tu_mk_2d(const int64_t *d, sj_dtype dt, sj_tensor *in) { in[0] = rnd(dt, 2, S(d[0], d[1])); }

/* integer and bool ops; a, b i32, bb bool, l i64, all [S, N] */
static sj_status m_ints(sj_tracer *t, const sj_val *in, int n, void *u) {
    sj_val a = in[0], b = in[1], bb = in[2], l = in[3];
    sj_val s = sj_mul(t, sj_add(t, a, b), a);
    sj_val p = sj_pow(t, a, sj_scalar(t, 20));
    sj_val mx = sj_maximum(t, sj_neg(t, a), sj_abs(t, b));
    sj_val c = sj_lt(t, a, b);
    sj_val e = sj_eq(t, bb, c);
    sj_val w = sj_where(t, e, mx, p);
    sj_output(t, w);
    sj_output(t, sj_div(t, s, b));
    sj_output(t, sj_div(t, a, sj_sub(t, a, a)));
    sj_output(t, sj_relu(t, sj_sub(t, sj_minimum(t, a, b), sj_scalar(t, 1))));
    sj_output(t, e);
    sj_output(t, sj_mul(t, sj_add(t, l, sj_cast(t, a, SJ_I64)), l));
    sj_output(t, sj_pow(t, l, sj_neg(t, sj_abs(t, l))));
    sj_output(t, sj_cast(t, w, SJ_BOOL));
    return sj_output(t, sj_cast(t, sj_add(t, sj_cast(t, bb, SJ_I32), p), SJ_F32));
}
static void mk_ints(const int64_t *d, sj_dtype dt, sj_tensor *in) {
    in[0] = rnd(SJ_I32, 2, S(d[0], d[1]));
    in[1] = rnd(SJ_I32, 2, S(d[0], d[1]));
    in[2] = rnd(SJ_BOOL, 2, S(d[0], d[1]));
    in[3] = rnd(SJ_I64, 2, S(d[0], d[1]));
}

/* a value used by two groups (a NODE softmax and a ROW sum) */
static sj_status m_shared(sj_tracer *t, const sj_val *in, int n, void *u) {
    sj_val tt = sj_exp(t, sj_mul(t, in[0], sj_scalar(t, 0.1)));
    sj_val sm = sj_softmax(t, tt, 0);
    sj_val v = sj_sum(t, tt, -1, 1);
    sj_output(t, sj_mul(t, sm, v));
    return sj_output(t, v);
}

/* an output that is an input, one listed twice, a view, constants, and a
 * sum over a rank-1 value (a ROW group of one row) */
static sj_status m_outs(sj_tracer *t, const sj_val *in, int n, void *u) {
    sj_val y = sj_mul(t, in[0], sj_scalar(t, 2.0));
    sj_output(t, in[0]);
    sj_output(t, y);
    sj_output(t, y);
    sj_output(t, sj_transpose(t, y, 0, 1));
    sj_output(t, sj_scalar(t, 3.0));
    sj_output(t, sj_mul(t, sj_scalar(t, 2.0), sj_scalar(t, 3.0)));
    sj_dim all[1] = {sj_dim_mul(t, sj_dim_of(t, in[0], 0), sj_dim_of(t, in[0], 1))};
    sj_output(t, sj_add(t, sj_sum(t, sj_reshape(t, in[0], 1, all), -1, 0), sj_scalar(t, 1.0)));
    return sj_output(t, sj_slice(t, in[0], 1, 1, 1000, 1));
}

/* sum (keepdim 0, with an epilogue) and mean (keepdim 1) of rows that may
 * be empty: sum 0, mean NaN */
static sj_status m_sum0(sj_tracer *t, const sj_val *in, int n, void *u) {
    sj_output(t, sj_add(t, sj_sum(t, in[0], -1, 0), sj_scalar(t, 1.0)));
    return sj_output(t, sj_mean(t, in[0], -1, 1));
}

/* -- Pattern table ---------------------------------------------------------------- */

const tu_pattern tu_pat_w1 = {"w1", m_w1, 3, mk_w1, 2, {2, 3}, {40, 200}, true, ref_w1, {0}};
const tu_pattern tu_pat_w1_big = {"w1 big", m_w1, 3, mk_w1, 2, {33, 4096}, {45, 4096}, true, ref_w1, {0}};
const tu_pattern tu_pat_w2 = {"w2", m_w2, 4, mk_w2, 2, {2, 3}, {200, 300}, true, ref_w2, {0}};
const tu_pattern tu_pat_ln_offset = {"layer norm, mean 4000", m_ln, 3, mk_ln_offset, 2, {2, 5}, {9, 900}, true, ref_ln, {0}};
const tu_pattern tu_pat_ln_offset_long = {"layer norm, mean 4000, long rows", m_ln, 3, mk_ln_offset, 2, {2, 1025}, {4, 9090}, true, ref_ln, {0}};
const tu_pattern tu_pat_w3 = {"w3", m_w3, 2, mk_w3, 2, {2, 3}, {14, 70}, true, ref_w3, {0}};
const tu_pattern tu_pat_w3_masked = {"w3 masked", m_w3, 2, mk_w3_masked, 2, {2, 3}, {14, 70}, true, NULL, {0}};
const tu_pattern tu_pat_mmgelu = {"matmul bias gelu", m_mmgelu, 1, mk_mmgelu, 1, {2}, {23}, true, NULL, {24}};
const tu_pattern tu_pat_mmbias = {"matmul bias", m_mmbias, 3, mk_mmbias, 1, {2}, {23}, true, ref_mmbias, {24, 40}};
const tu_pattern tu_pat_views = {"views", m_views, 2, mk_views, 2, {2, 40}, {30, 70}, true, NULL, {0}};
const tu_pattern tu_pat_strided = {"strided", m_strided, 1, mk_strided, 2, {3, 5}, {9, 30}, false, NULL, {0}};
const tu_pattern tu_pat_reshape = {"reshape", m_reshape, 2, mk_reshape, 3, {2, 50, 70}, {45, 60, 90}, true, NULL, {0}};
const tu_pattern tu_pat_reduce = {"reduce", m_reduce, 4, mk_reduce, 2, {2, 3}, {30, 300}, true, NULL, {0}};
const tu_pattern tu_pat_reduce_long = {"reduce long", m_reduce, 4, mk_reduce, 2, {2, 1500}, {6, 5000}, true, NULL, {0}};
const tu_pattern tu_pat_rows = {"rows", m_rows, 2, mk_rows, 2, {2, 7}, {6, 60}, true, NULL, {0}};
const tu_pattern tu_pat_rows_mid = {"mid rows", m_rows, 2, mk_rows, 2, {2, 1025}, {6, 8192}, true, NULL, {0}};
const tu_pattern tu_pat_rows_long = {"long rows", m_rows, 2, mk_rows, 2, {2, 9061}, {6, 9090}, true, NULL, {0}};
const tu_pattern tu_pat_casts = {"casts", m_casts, 1, mk_2d, 2, {2, 3}, {30, 90}, true, NULL, {0}};
const tu_pattern tu_pat_ints = {"ints", m_ints, 4, mk_ints, 2, {2, 3}, {30, 90}, true, NULL, {0}};
const tu_pattern tu_pat_shared = {"shared", m_shared, 1, mk_2d, 2, {2, 3}, {30, 90}, true, NULL, {0}};
const tu_pattern tu_pat_outs = {"outputs", m_outs, 1, mk_2d, 2, {2, 3}, {30, 90}, true, NULL, {0}};
const tu_pattern tu_pat_sum0 = {"sum0", m_sum0, 1, mk_2d, 2, {2, 3}, {30, 90}, true, NULL, {0}};

/* -- Tracing and fusing ------------------------------------------------------------ */

sj_expr tu_policy(void *ctx, sj_exprs *ex, int input, int axis, int64_t size) {
    tu_pol *p = ctx;
    bool fixed = false;
    for (int i = 0; p->fixed && p->fixed[i]; i++) fixed |= p->fixed[i] == size;
    if (!p->sym || size < 2 || fixed) return sj_ex_const(ex, size);
    for (int i = 0; i < p->n; i++)
        if (p->size[i] == size) return sj_ex_sym(ex, p->sym_of[i]);
    int s = sj_sym_new(ex, size, 2, SJ_EX_INF);
    p->size[p->n] = size;
    p->sym_of[p->n] = s;
    p->in[s] = input;
    p->ax[s] = axis;
    p->n++;
    return sj_ex_sym(ex, s);
}

void tu_random_dims(const tu_pattern *pt, int64_t *d) {
    for (int k = 0; k < pt->n_dims; k++) d[k] = tu_randint(pt->lo[k], pt->hi[k]);
}

bool tu_same_signature(const tu_pol *pl, const sj_tensor *a, const sj_tensor *b, int n) {
    for (int i = 0; i < n; i++)
        for (int x = 0; x < a[i].rank; x++)
            for (int j = 0; j < n; j++)
                for (int y = 0; y < a[j].rank; y++) {
                    bool eq_a = a[i].shape[x] == a[j].shape[y], eq_b = b[i].shape[x] == b[j].shape[y];
                    if (eq_a != eq_b || (a[i].shape[x] < 2) != (b[i].shape[x] < 2)) return false;
                    if (!pl->sym && a[i].shape[x] != b[i].shape[x]) return false;
                }
    return true;
}

sj_fplan *tu_pattern_plan(const tu_pattern *pt, const sj_tensor *ins, tu_pol *pl, sj_graph **g, int64_t *sv) {
    sj_trace_req req = {.fn_name = pt->name, .model = pt->model, .inputs = ins, .n_inputs = pt->n_in,
                        .dim_policy = tu_policy, .dim_ctx = pl};
    sj_trace_result res;
    sj_status st = sj_trace(&req, &res);
    if (st) fprintf(stderr, "%s: %s\n", pt->name, sj_last_error());
    assert_int_equal(st, SJ_OK);
    free(res.facts);
    *g = res.graph;
    if (sv)
        for (int s = 0; s < pl->n; s++) sv[s] = ins[pl->in[s]].shape[pl->ax[s]];
    sj_fplan *p = sj_fuse(*g, ins);
    assert_non_null(p);
    return p;
}

void tu_codegen_done(char *spec, char *sym, sj_fplan *p, sj_graph *g) {
    if (getenv("SJ_SHOW_CODE"))
        printf("%s\n-----\n%s\n", strstr(spec, "/* -- generated"), strstr(sym, "/* -- generated"));
    free(spec);
    free(sym);
    sj_fplan_free(p);
    sj_graph_destroy(g);
}

/* -- Running ------------------------------------------------------------------------ */

static _Atomic size_t eager_hint; /* the arena hint of the current run */

void tu_pattern_eager(sj_runtime *rt, sj_pool *pool, const sj_graph *g, const sj_tensor *ins, const int64_t *sv,
                      const char *what, sj_exec *x, sj_tensor *eo, sj_tensor *fo) {
    assert_true(g->n_outputs <= 16);
    for (int i = 0; i < g->n_outputs; i++) {
        const sj_value *v = &g->vals[g->outputs[i]];
        int64_t shape[SJ_MAX_RANK];
        for (int a = 0; a < v->rank; a++) shape[a] = sj_ex_eval(g->ex, v->shape[a], sv);
        eo[i] = tu_tensor(v->dtype, v->rank, shape);
        fo[i] = tu_tensor(v->dtype, v->rank, shape);
    }
    eager_hint = 0;
    if (getenv("SJ_TEST_VERBOSE")) fprintf(stderr, "  run %s\n", what);
    *x = (sj_exec){.rt = rt, .g = g, .fn_name = what, .inputs = ins, .outputs = eo, .sym_vals = sv,
                   .pool = pool, .arena_hint = &eager_hint, .ops = &sj_cpu_exec_ops};
    sj_status st = sj_exec_eager(x);
    if (st) fprintf(stderr, "%s: eager: %s\n", what, sj_last_error());
    assert_int_equal(st, SJ_OK);
}

double tu_fused_tol(sj_dtype dt) {
    return dt == SJ_F32 ? 1e-5 : dt == SJ_F16 ? 1e-2 : dt == SJ_BF16 ? 6e-2 : 0.0;
}

int tu_check_like_eager_as(const sj_tensor *out, const sj_tensor *e, sj_dtype prec, const char *label) {
    int64_t n = tu_numel(e);
    double *r = tu_refbuf(0, n > 0 ? n : 1);
    for (int64_t k = 0; k < n; k++) r[k] = tu_get(e, k);
    double *mag = NULL, ss = 0;
    if (prec == SJ_F16 || prec == SJ_BF16) {
        mag = tu_refbuf(1, n > 0 ? n : 1);
        for (int64_t k = 0; k < n; k++) ss += isfinite(r[k]) ? r[k] * r[k] : 0;
        for (int64_t k = 0; k < n; k++) mag[k] = fabs(r[k]) + sqrt(ss / (double)n);
    }
    return tu_check_mag(out, r, mag, tu_fused_tol(prec), label);
}

int tu_check_like_eager(const sj_tensor *out, const sj_tensor *e, const char *label) {
    return tu_check_like_eager_as(out, e, out->dtype, label);
}

void tu_run_pattern(const tu_pattern *pt, bool symbolic, sj_dtype dt, const int64_t *force,
                    const tu_pattern_target *tg) {
    int64_t d[TU_MAXD];
    sj_tensor tin[16], rin[16];
    tu_random_dims(pt, d);
    if (force) memcpy(d, force, sizeof(int64_t) * (size_t)pt->n_dims);
    pt->make(d, dt, tin);
    tu_pol pl = {.sym = symbolic, .fixed = pt->fixed};
    sj_graph *g;
    int64_t sv[64] = {0};
    sj_fplan *p = tu_pattern_plan(pt, tin, &pl, &g, sv);
    char what[128];
    snprintf(what, sizeof what, "%s %s %s spec", pt->name, sj_dtype_name(dt), symbolic ? "sym" : "static");
    tg->build(g, p, sv, 0, what);
    if (tg->runs) tg->run(g, p, 0, tin, sv, pt->ref, what);
    if (symbolic) {
        snprintf(what, sizeof what, "%s %s sym", pt->name, sj_dtype_name(dt));
        tg->build(g, p, NULL, 1, what);
        if (tg->runs) tg->run(g, p, 1, tin, sv, pt->ref, what);
        for (int r = 0; r < (tg->runs && pt->vary && !force ? 3 : 0); r++) {
            int64_t e[TU_MAXD];
            int tries = 0;
            do {
                tu_random_dims(pt, e);
                if (r == 0) e[0] = 2; /* a size-2 edge */
                pt->make(e, dt, rin);
            } while (!tu_same_signature(&pl, tin, rin, pt->n_in) && ++tries < 100);
            if (tries == 100) {
                fprintf(stderr, "%s: no sizes with the traced signature; run %d skipped\n", pt->name, r);
                continue;
            }
            for (int s = 0; s < pl.n; s++) sv[s] = rin[pl.in[s]].shape[pl.ax[s]];
            snprintf(what, sizeof what, "%s %s sym (run %d: %lld)", pt->name, sj_dtype_name(dt), r, (long long)e[0]);
            tg->run(g, p, 1, rin, sv, pt->ref, what);
        }
    }
    tg->unload(0);
    if (symbolic) tg->unload(1);
    sj_fplan_free(p);
    sj_graph_destroy(g);
}
