/* Helpers every benchmark program shares: a monotonic clock, sorting for
 * medians, random fills (never zero: ../shared/workloads/README.md),
 * integer lists from the command line. */
#ifndef SJ_BENCH_UTIL_H
#define SJ_BENCH_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "jit/shapejit.h"

static inline double bench_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* qsort comparator for doubles. */
static inline int bench_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* n floats uniform in [lo, hi), zeros replaced by (lo + hi) / 2 (or 0.5),
 * from the xorshift state *rng. */
static inline void bench_fill_rand(float *p, size_t n, float lo, float hi, uint64_t *rng) {
    float mid = (lo + hi) / 2 != 0.0f ? (lo + hi) / 2 : 0.5f;
    for (size_t i = 0; i < n; i++) {
        uint64_t r = *rng;
        r ^= r << 13, r ^= r >> 7, r ^= r << 17;
        *rng = r;
        p[i] = lo + (hi - lo) * (float)((r >> 40) * (1.0 / 16777216.0));
        if (p[i] == 0.0f) p[i] = mid;
    }
}

/* A comma-separated list of integers ("1,2,4") into out, at most max of
 * them; how many were read. */
static inline int bench_parse_ints(const char *s, int *out, int max) {
    int n = 0;
    while (*s && n < max) {
        out[n++] = atoi(s);
        const char *c = strchr(s, ',');
        if (!c) break;
        s = c + 1;
    }
    return n;
}

/* -- The workloads' models (../shared/workloads/README.md) ---------------- */

/* w0: y = x + 1 */
static inline sj_status bench_w0_model(sj_tracer *t, const sj_val *in, int n, void *u) {
    (void)n, (void)u;
    return sj_output(t, sj_add(t, in[0], sj_scalar(t, 1.0)));
}
/* w1: y = gelu(x*a + b) * sigmoid(x) */
static inline sj_status bench_w1_model(sj_tracer *t, const sj_val *in, int n, void *u) {
    (void)n, (void)u;
    sj_val x = in[0];
    return sj_output(t, sj_mul(t, sj_gelu(t, sj_add(t, sj_mul(t, x, in[1]), in[2])), sj_sigmoid(t, x)));
}
/* w2: h = x + r; y = gelu(layernorm(h) g + b); outputs y, h */
static inline sj_status bench_w2_model(sj_tracer *t, const sj_val *in, int n, void *u) {
    (void)n, (void)u;
    sj_val h = sj_add(t, in[0], in[1]);
    sj_output(t, sj_gelu(t, sj_layer_norm(t, h, in[2], in[3], 1e-5)));
    return sj_output(t, h);
}
/* w3: softmax(scores * 0.125 + mask) over the last axis */
static inline sj_status bench_w3_model(sj_tracer *t, const sj_val *in, int n, void *u) {
    (void)n, (void)u;
    return sj_output(t, sj_softmax(t, sj_add(t, sj_mul(t, in[0], sj_scalar(t, 0.125)), in[1]), -1));
}

/* w4/w5: one BERT-base post-LN encoder layer (hidden 768, 12 heads of 64,
 * FFN 3072), as ../shared/peers/torch_peer.py writes it:
 *   qkv = x Wqkv + b, its three column blocks viewed as q, k, v
 *   [B, 12, S, 64]; a = attention(q, k, v), scale 1/8, not causal;
 *   x1 = LN(x + proj(a)); y = LN(x1 + fc2(gelu(fc1(x1)))).
 * The weights (any dtype, any device) are the model's user pointer. */
enum { BENCH_H = 768, BENCH_NH = 12, BENCH_HD = 64, BENCH_FF = 3072 };
typedef struct bench_encoder {
    sj_tensor wqkv, bqkv, wo, bo, g1, b1, w1, bf1, w2, bf2, g2, b2;
} bench_encoder;

static inline sj_val bench_linear(sj_tracer *t, sj_val x, const sj_tensor *w, const sj_tensor *b) {
    return sj_add(t, sj_matmul(t, x, sj_param(t, w)), sj_param(t, b));
}

static inline sj_status bench_w4_model(sj_tracer *t, const sj_val *in, int n, void *u) {
    (void)n;
    const bench_encoder *w = u;
    sj_val x = in[0]; /* [B, S, H] */
    sj_dim b = sj_dim_of(t, x, 0), s = sj_dim_of(t, x, 1);
    sj_val qkv = bench_linear(t, x, &w->wqkv, &w->bqkv);
    sj_val qkv3[3]; /* columns [i H, (i + 1) H) as [B, NH, S, HD] */
    for (int i = 0; i < 3; i++) {
        sj_dim d4[4] = {b, s, sj_dim_const(t, BENCH_NH), sj_dim_const(t, BENCH_HD)};
        sj_val part = sj_slice(t, qkv, 2, i * BENCH_H, (i + 1) * BENCH_H, 1);
        qkv3[i] = sj_permute(t, sj_reshape(t, part, 4, d4), (int[]){0, 2, 1, 3});
    }
    sj_val a = sj_attention(t, qkv3[0], qkv3[1], qkv3[2], SJ_NONE, 0.125, 0);
    sj_dim d3[3] = {b, s, sj_dim_const(t, BENCH_H)};
    a = sj_reshape(t, sj_permute(t, a, (int[]){0, 2, 1, 3}), 3, d3);
    sj_val x1 = sj_layer_norm(t, sj_add(t, x, bench_linear(t, a, &w->wo, &w->bo)), sj_param(t, &w->g1),
                              sj_param(t, &w->b1), 1e-5);
    sj_val f = bench_linear(t, sj_gelu(t, bench_linear(t, x1, &w->w1, &w->bf1)), &w->w2, &w->bf2);
    return sj_output(t, sj_layer_norm(t, sj_add(t, x1, f), sj_param(t, &w->g2), sj_param(t, &w->b2), 1e-5));
}

/* -- Modes ---------------------------------------------------------------- */

/* eager (no compiling), fused_static (each size its own entry, every size a
 * constant), fused_symbolic (one entry, sizes passed at run time; hot-shape
 * specialization off). Compiles are synchronous, out of the timed region. */
typedef enum { BENCH_EAGER, BENCH_STATIC, BENCH_SYMBOLIC } bench_mode;
static const char *const bench_mode_names[] = {"eager", "fused_static", "fused_symbolic"};

static inline void bench_die(const char *what) {
    fprintf(stderr, "%s: %s\n", what, sj_last_error());
    exit(1);
}

static inline sj_runtime *bench_runtime(sj_backend_kind backend, bench_mode m) {
    sj_runtime_config cfg;
    sj_runtime_config_init(&cfg);
    cfg.backend = backend;
    cfg.compile_mode = m == BENCH_EAGER ? SJ_COMPILE_OFF : SJ_COMPILE_SYNC;
    cfg.cache_dir = NULL;
    sj_runtime *rt;
    if (sj_runtime_create(&cfg, &rt)) bench_die("sj_runtime_create");
    return rt;
}

static inline sj_fn *bench_fn_user(sj_runtime *rt, const char *name, int n_in, sj_model_fn model, void *user,
                                   bench_mode m) {
    sj_fn_options o;
    sj_fn_options_init(&o);
    o.dynamic = m == BENCH_SYMBOLIC ? SJ_DYNAMIC_SYMBOLIC : SJ_DYNAMIC_STATIC;
    o.hot_threshold = 1;
    o.recompile_limit = 64;
    o.specialize_threshold = 1000000; /* the symbolic mode measures the symbolic kernels */
    sj_fn *fn;
    if (sj_fn_create(rt, name, n_in, model, user, &o, &fn)) bench_die("sj_fn_create");
    return fn;
}

static inline sj_fn *bench_fn(sj_runtime *rt, const char *name, int n_in, sj_model_fn model, bench_mode m) {
    return bench_fn_user(rt, name, n_in, model, NULL, m);
}

#endif
