/* sj_attention_varlen (issue 26: packed batches) through the public API:
 * B = 1..8 sequences of 1..100 tokens packed as [T, H, D] with i32
 * offsets, causal and not, f32/f16/bf16, eager and fused (an opaque node
 * between fused groups), symbolic T and B served by one entry, against a
 * float64 reference on random (never zero) inputs, eager against fused
 * directly; bad offsets (not starting at 0, decreasing, a last entry other
 * than T, the wrong dtype or rank) fail with a message naming the fault
 * and leave the function usable. The same on a CUDA device, with a CUDA
 * graph; without one those cases print "skipped: no CUDA device". */
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
#ifdef SJ_WITH_CUDA
#include "kernels/cuda/eager_cuda.h" /* sj_cuda_attention_tc_calls */
#endif

#define H 3
#define D 8
#define DV 6

typedef struct vl_spec {
    double scale;
    int causal;
} vl_spec;

/* inputs q [T,H,D], k [T,H,D], v [T,H,Dv], offsets i32 [B+1]; outputs the
 * attention and exp(attention) * 0.5 + 1 (a fused group after the node),
 * the attention reading q * 1.5 (a fused group before it). */
static sj_status vl_model(sj_tracer *t, const sj_val *in, int n, void *u) {
    const vl_spec *sp = u;
    (void)n;
    sj_val q = sj_mul(t, in[0], sj_scalar(t, 1.5));
    sj_val y = sj_attention_varlen(t, q, in[1], in[2], in[3], sp->scale, sp->causal);
    sj_val y2 = sj_add(t, sj_mul(t, sj_exp(t, y), sj_scalar(t, 0.5)),
                       sj_scalar(t, 1.0));
    sj_status st = sj_output(t, y);
    return st ? st : sj_output(t, y2);
}

/* float64 attention of every (token, head), each token seeing only its
 * own sequence's keys; q scaled by 1.5 as the model does (in q's dtype). */
static void vl_ref(const sj_tensor *q, const sj_tensor *k, const sj_tensor *v, const int32_t *off, int64_t B,
                   const vl_spec *sp, double *y0, double *y1) {
    sj_dtype dt = q->dtype;
    for (int64_t b = 0; b < B; b++) {
        int64_t s = off[b], e = off[b + 1];
        for (int64_t i = s; i < e; i++)
            for (int64_t h = 0; h < H; h++) {
                int64_t lim = sp->causal ? i + 1 : e;
                double *sc = calloc((size_t)(e - s), sizeof(double)), m = -INFINITY, l = 0;
                for (int64_t j = s; j < lim; j++) {
                    double dot = 0;
                    for (int64_t d = 0; d < D; d++)
                        dot += tu_round(dt, 1.5 * tu_get(q, (i * H + h) * D + d)) * tu_get(k, (j * H + h) * D + d);
                    sc[j - s] = dot * sp->scale;
                    if (sc[j - s] > m) m = sc[j - s];
                }
                for (int64_t j = s; j < lim; j++) l += sc[j - s] = exp(sc[j - s] - m);
                for (int64_t d = 0; d < DV; d++) {
                    double a = 0;
                    for (int64_t j = s; j < lim; j++) a += sc[j - s] * tu_get(v, (j * H + h) * DV + d);
                    a /= l;
                    y0[(i * H + h) * DV + d] = a;
                    y1[(i * H + h) * DV + d] = exp(tu_round(dt, a)) * 0.5 + 1.0;
                }
                free(sc);
            }
    }
}

static sj_runtime *runtime(sj_backend_kind be, sj_compile_mode mode) {
    sj_runtime_config cfg;
    sj_runtime_config_init(&cfg);
    cfg.backend = be;
    cfg.compile_mode = mode;
    cfg.cache_dir = NULL;
    cfg.log_mask = 0;
    sj_runtime *rt = NULL;
    if (sj_runtime_create(&cfg, &rt)) return NULL;
    return rt;
}

static sj_fn *vl_fn(sj_runtime *rt, const vl_spec *sp, sj_dynamic dyn) {
    sj_fn_options o;
    sj_fn_options_init(&o);
    o.dynamic = dyn;
    o.hot_threshold = 1;
    o.specialize_threshold = 1000;
    sj_fn *fn;
    if (sj_fn_create(rt, "varlen", 4, vl_model, (void *)sp, &o, &fn)) fail_msg("fn: %s", sj_last_error());
    return fn;
}

/* A batch: B sequences of random lengths in [1, maxlen] (or the given
 * ones), packed. */
typedef struct batch {
    int64_t B, T;
    int32_t off[9];
    sj_tensor q, k, v, o;
} batch;

static batch make_batch(sj_dtype dt, int64_t B, const int64_t *lens, int64_t maxlen) {
    batch x = {.B = B};
    x.off[0] = 0;
    for (int64_t b = 0; b < B; b++) x.off[b + 1] = x.off[b] + (int32_t)(lens ? lens[b] : tu_randint(1, maxlen));
    x.T = x.off[B];
    x.q = tu_random(dt, 3, (int64_t[]){x.T, H, D}, TU_CONTIG);
    x.k = tu_random(dt, 3, (int64_t[]){x.T, H, D}, TU_CONTIG);
    x.v = tu_random(dt, 3, (int64_t[]){x.T, H, DV}, TU_CONTIG);
    x.o = tu_tensor(SJ_I32, 1, (int64_t[]){B + 1});
    for (int64_t b = 0; b <= B; b++) tu_seti(&x.o, b, x.off[b]);
    return x;
}

/* -- CPU ------------------------------------------------------------------ */

/* Eager and fused runtimes, symbolic and static, every dtype, causal and
 * not: each call against float64, and eager against fused. */
static void test_varlen_cpu(void **state) {
    (void)state;
    static const int64_t fixed[][9] = {{1, 1}, {2, 1, 100}, {8, 1, 1, 1, 1, 1, 1, 1, 1}, {3, 100, 1, 37}};
    tu_seed(2626);
    sj_runtime *rte = runtime(SJ_BACKEND_CPU, SJ_COMPILE_OFF), *rtf = runtime(SJ_BACKEND_CPU, SJ_COMPILE_SYNC);
    assert_non_null(rte);
    assert_non_null(rtf);
    for (int d = 0; d < 3; d++)
        for (int causal = 0; causal < 2; causal++)
            for (int dyn = SJ_DYNAMIC_STATIC; dyn <= SJ_DYNAMIC_SYMBOLIC; dyn++) {
                sj_dtype dt = d == 0 ? SJ_F32 : d == 1 ? SJ_F16 : SJ_BF16;
                vl_spec sp = {0.35, causal};
                sj_fn *fe = vl_fn(rte, &sp, (sj_dynamic)dyn), *ff = vl_fn(rtf, &sp, (sj_dynamic)dyn);
                const int n_calls = dyn == SJ_DYNAMIC_SYMBOLIC ? 14 : 5, nf = (int)(sizeof fixed / sizeof fixed[0]);
                uint64_t warm_entries = 0;
                for (int c = 0; c < n_calls; c++) {
                    if (c == nf) {
                        sj_stats s0;
                        sj_fn_stats(ff, &s0);
                        warm_entries = s0.entries;
                    }
                    /* past the fixed cases, sizes that equal no other (T > 9;
                     * B + 1 not 3, 6 or 8) so that duck sizing and the
                     * specialized sizes 0 and 1 make no new entry */
                    static const int64_t bs[] = {1, 3, 4, 6, 8};
                    batch x = c < nf ? make_batch(dt, fixed[c][0], fixed[c] + 1, 0)
                                     : make_batch(dt, bs[tu_randint(0, 4)], NULL, 100);
                    while (c >= nf && x.T <= 9) x = make_batch(dt, x.B, NULL, 100);
                    sj_tensor in[4] = {x.q, x.k, x.v, x.o}, oe[2] = {{0}}, of[2] = {{0}};
                    char what[128];
                    snprintf(what, sizeof what, "varlen %s causal=%d %s call %d (B=%lld T=%lld)", sj_dtype_name(dt),
                             causal, dyn == SJ_DYNAMIC_STATIC ? "static" : "symbolic", c, (long long)x.B,
                             (long long)x.T);
                    if (sj_call(fe, in, 4, oe, 2)) fail_msg("%s eager: %s", what, sj_last_error());
                    if (sj_call(ff, in, 4, of, 2)) fail_msg("%s fused: %s", what, sj_last_error());
                    int64_t n = x.T * H * DV;
                    double *r0 = calloc((size_t)n, sizeof(double)), *r1 = calloc((size_t)n, sizeof(double));
                    double *fe0 = calloc((size_t)n, sizeof(double));
                    vl_ref(&x.q, &x.k, &x.v, x.off, x.B, &sp, r0, r1);
                    for (int o = 0; o < 2; o++) {
                        double tol = 2 * tu_tol(dt);
                        if (!tu_check(&oe[o], o ? r1 : r0, tol, tu_label("%s eager output %d", what, o)) ||
                            !tu_check(&of[o], o ? r1 : r0, tol, tu_label("%s fused output %d", what, o)))
                            fail_msg("%s: mismatch against float64", what);
                    }
                    for (int64_t i = 0; i < n; i++) fe0[i] = tu_get(&oe[0], i);
                    if (!tu_check(&of[0], fe0, 2 * tu_tol(dt), tu_label("%s fused against eager", what)))
                        fail_msg("%s: fused differs from eager", what);
                    free(r0), free(r1), free(fe0);
                    for (int o = 0; o < 2; o++) {
                        sj_tensor_free(rte, &oe[o]);
                        sj_tensor_free(rtf, &of[o]);
                    }
                }
                sj_stats se, sf;
                sj_fn_stats(fe, &se);
                sj_fn_stats(ff, &sf);
                assert_int_equal(se.eager_calls, n_calls);
                assert_int_equal(sf.eager_calls, 0);
                if (dyn == SJ_DYNAMIC_SYMBOLIC) {
                    /* the fixed cases take a few entries (T = 1 and sizes
                     * equal to H, D or Dv are specialized or duck-sized);
                     * then one entry serves every T and B: no recompile
                     * per length */
                    assert_true(warm_entries >= 1 && warm_entries <= 4);
                    assert_int_equal(sf.entries, warm_entries);
                    assert_int_equal(se.entries, warm_entries);
                    assert_int_equal(sf.traces, warm_entries);
                }
                sj_fn_destroy(fe);
                sj_fn_destroy(ff);
                tu_free_all();
            }
    sj_runtime_destroy(rte);
    sj_runtime_destroy(rtf);
}

/* Bad offsets fail the call with SJ_EINDEX and a message naming the
 * fault; the wrong dtype or rank fail the trace; a good call follows each. */
static void bad_calls(sj_runtime *rt, sj_fn *fn, sj_tensor (*to_dev)(sj_runtime *, const sj_tensor *),
                      void (*release)(sj_runtime *, sj_tensor *)) {
    batch x = make_batch(SJ_F32, 3, (int64_t[]){4, 2, 5}, 0);
    static const struct {
        int32_t off[4];
        const char *msg;
    } bad[] = {
        {{0, 4, 3, 11}, "decrease"},       /* not monotone */
        {{0, 4, 6, 10}, "expected T = 11"}, /* last != T */
        {{-2, 4, 6, 11}, "offsets[0]"},     /* negative start */
        {{0, 4, 6, 12}, "expected T = 11"}, /* past T */
    };
    for (size_t c = 0; c < sizeof bad / sizeof bad[0] + 1; c++) {
        sj_tensor off = tu_tensor(SJ_I32, 1, (int64_t[]){4});
        for (int b = 0; b < 4; b++) tu_seti(&off, b, c < sizeof bad / sizeof bad[0] ? bad[c].off[b] : x.off[b]);
        sj_tensor hin[4] = {x.q, x.k, x.v, off}, in[4], out[2] = {{0}};
        for (int i = 0; i < 4; i++) in[i] = to_dev ? to_dev(rt, &hin[i]) : hin[i];
        sj_status st = sj_call(fn, in, 4, out, 2);
        if (c < sizeof bad / sizeof bad[0]) {
            if (st != SJ_EINDEX) fail_msg("bad offsets case %d: status %s (%s)", (int)c, sj_status_name(st),
                                          sj_last_error());
            /* on a device the message says what, not which entry */
            if (!to_dev && !strstr(sj_last_error(), bad[c].msg))
                fail_msg("bad offsets case %d: message '%s' lacks '%s'", (int)c, sj_last_error(), bad[c].msg);
            if (!strstr(sj_last_error(), "attention_varlen: offsets"))
                fail_msg("bad offsets case %d: message '%s'", (int)c, sj_last_error());
        } else {
            if (st) fail_msg("good offsets after bad ones: %s", sj_last_error());
            for (int o = 0; o < 2; o++) sj_tensor_free(rt, &out[o]);
        }
        if (to_dev)
            for (int i = 0; i < 4; i++) release(rt, &in[i]);
    }
    /* i64 offsets, and offsets of rank 2, fail the trace */
    sj_tensor o64 = tu_tensor(SJ_I64, 1, (int64_t[]){4}), o2 = tu_tensor(SJ_I32, 2, (int64_t[]){4, 1});
    for (int b = 0; b < 4; b++) tu_seti(&o64, b, x.off[b]), tu_seti(&o2, b, x.off[b]);
    sj_tensor *wrong[2] = {&o64, &o2};
    sj_status want[2] = {SJ_EDTYPE, SJ_ESHAPE};
    for (int c = 0; c < 2; c++) {
        sj_tensor hin[4] = {x.q, x.k, x.v, *wrong[c]}, in[4], out[2] = {{0}};
        for (int i = 0; i < 4; i++) in[i] = to_dev ? to_dev(rt, &hin[i]) : hin[i];
        sj_status st = sj_call(fn, in, 4, out, 2);
        if (st != want[c] || !strstr(sj_last_error(), "offsets"))
            fail_msg("wrong offsets %d: status %s (%s)", c, sj_status_name(st), sj_last_error());
        if (to_dev)
            for (int i = 0; i < 4; i++) release(rt, &in[i]);
    }
    sj_tensor hin[4] = {x.q, x.k, x.v, x.o}, in[4], out[2] = {{0}};
    for (int i = 0; i < 4; i++) in[i] = to_dev ? to_dev(rt, &hin[i]) : hin[i];
    if (sj_call(fn, in, 4, out, 2)) fail_msg("a good call after the wrong ones: %s", sj_last_error());
    for (int o = 0; o < 2; o++) sj_tensor_free(rt, &out[o]);
    if (to_dev)
        for (int i = 0; i < 4; i++) release(rt, &in[i]);
}

static void test_varlen_bad_offsets(void **state) {
    (void)state;
    tu_seed(2627);
    for (int mode = 0; mode < 2; mode++) {
        sj_runtime *rt = runtime(SJ_BACKEND_CPU, mode ? SJ_COMPILE_SYNC : SJ_COMPILE_OFF);
        vl_spec sp = {0.5, 0};
        sj_fn *fn = vl_fn(rt, &sp, SJ_DYNAMIC_SYMBOLIC);
        bad_calls(rt, fn, NULL, NULL);
        sj_fn_destroy(fn);
        sj_runtime_destroy(rt);
    }
    tu_free_all();
}

/* Trace-time checks: ranks, dtypes, sizes that differ. */
static sj_status bad_trace_model(sj_tracer *t, const sj_val *in, int n, void *u) {
    (void)n, (void)u;
    return sj_output(t, sj_attention_varlen(t, in[0], in[1], in[1], in[2], 1.0, 0));
}

static void test_varlen_bad_trace(void **state) {
    (void)state;
    sj_runtime *rt = runtime(SJ_BACKEND_CPU, SJ_COMPILE_OFF);
    sj_fn *fn;
    assert_int_equal(sj_fn_create(rt, "bad", 3, bad_trace_model, NULL, NULL, &fn), SJ_OK);
    sj_tensor q4 = tu_random(SJ_F32, 4, (int64_t[]){1, 5, 2, 4}, TU_CONTIG);
    sj_tensor q = tu_random(SJ_F32, 3, (int64_t[]){5, 2, 4}, TU_CONTIG);
    sj_tensor k6 = tu_random(SJ_F32, 3, (int64_t[]){6, 2, 4}, TU_CONTIG);
    sj_tensor qi = tu_random(SJ_I32, 3, (int64_t[]){5, 2, 4}, TU_CONTIG);
    sj_tensor off = tu_tensor(SJ_I32, 1, (int64_t[]){2}), off1 = tu_tensor(SJ_I32, 1, (int64_t[]){1});
    tu_seti(&off, 0, 0), tu_seti(&off, 1, 5), tu_seti(&off1, 0, 5);
    struct {
        sj_tensor a, b, o;
        sj_status st;
        const char *msg;
    } cases[] = {
        {q4, q4, off, SJ_ESHAPE, "rank 3"},
        {q, k6, off, SJ_ESHAPE, "total tokens T differs"},
        {qi, qi, off, SJ_EDTYPE, "attention_varlen"},
        {q, q, off1, SJ_ESHAPE, "at least 2"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        sj_tensor in[3] = {cases[c].a, cases[c].b, cases[c].o}, out = {0};
        sj_status st = sj_call(fn, in, 3, &out, 1);
        if (st != cases[c].st || !strstr(sj_last_error(), cases[c].msg))
            fail_msg("case %d: %s (%s), expected %s with '%s'", (int)c, sj_status_name(st), sj_last_error(),
                     sj_status_name(cases[c].st), cases[c].msg);
    }
    sj_tensor in[3] = {q, q, off}, out = {0};
    if (sj_call(fn, in, 3, &out, 1)) fail_msg("a good call: %s", sj_last_error());
    sj_tensor_free(rt, &out);
    sj_fn_destroy(fn);
    sj_runtime_destroy(rt);
    tu_free_all();
}

/* -- CUDA ----------------------------------------------------------------- */

static sj_tensor to_device(sj_runtime *rt, const sj_tensor *h) {
    sj_tensor d = *h;
    d.device = SJ_CUDA;
    d.data = NULL;
    if (sj_tensor_alloc(rt, &d) || sj_tensor_copy(rt, &d, h)) fail_msg("to device: %s", sj_last_error());
    return d;
}

static void release_device(sj_runtime *rt, sj_tensor *d) { sj_tensor_free(rt, d); }

static sj_tensor to_host(sj_runtime *rt, const sj_tensor *d) {
    sj_tensor h = tu_tensor(d->dtype, d->rank, d->shape);
    if (sj_tensor_copy(rt, &h, d)) fail_msg("to host: %s", sj_last_error());
    return h;
}

/* Eager and fused on the device, every dtype, causal and not, symbolic;
 * then repeated calls with the same buffers (a CUDA graph may serve them)
 * and bad offsets on the device. */
static void test_varlen_cuda(void **state) {
    (void)state;
    sj_runtime *probe = runtime(SJ_BACKEND_CUDA, SJ_COMPILE_OFF);
    if (!probe) {
        print_message("skipped: no CUDA device (%s)\n", sj_last_error());
        return;
    }
    sj_runtime_destroy(probe);
    tu_seed(2628);
    for (int mode = 0; mode < 2; mode++) {
        sj_runtime *rt = runtime(SJ_BACKEND_CUDA, mode ? SJ_COMPILE_SYNC : SJ_COMPILE_OFF);
        assert_non_null(rt);
        for (int d = 0; d < 3; d++)
            for (int causal = 0; causal < 2; causal++) {
                sj_dtype dt = d == 0 ? SJ_F32 : d == 1 ? SJ_F16 : SJ_BF16;
                vl_spec sp = {0.35, causal};
                sj_fn *fn = vl_fn(rt, &sp, SJ_DYNAMIC_SYMBOLIC);
                for (int c = 0; c < 8; c++) {
                    batch x = c == 0 ? make_batch(dt, 1, (int64_t[]){1}, 0) : make_batch(dt, tu_randint(1, 8), NULL, 100);
                    sj_tensor hin[4] = {x.q, x.k, x.v, x.o}, in[4], out[2] = {{0}};
                    for (int i = 0; i < 4; i++) in[i] = to_device(rt, &hin[i]);
                    char what[128];
                    snprintf(what, sizeof what, "cuda varlen %s %s causal=%d call %d (B=%lld T=%lld)",
                             mode ? "fused" : "eager", sj_dtype_name(dt), causal, c, (long long)x.B, (long long)x.T);
                    if (sj_call(fn, in, 4, out, 2)) fail_msg("%s: %s", what, sj_last_error());
                    int64_t n = x.T * H * DV;
                    double *r0 = calloc((size_t)n, sizeof(double)), *r1 = calloc((size_t)n, sizeof(double));
                    vl_ref(&x.q, &x.k, &x.v, x.off, x.B, &sp, r0, r1);
                    for (int o = 0; o < 2; o++) {
                        sj_tensor h = to_host(rt, &out[o]);
                        if (!tu_check(&h, o ? r1 : r0, 2 * tu_tol(dt), tu_label("%s output %d", what, o)))
                            fail_msg("%s: mismatch against float64", what);
                        sj_tensor_free(rt, &out[o]);
                    }
                    free(r0), free(r1);
                    for (int i = 0; i < 4; i++) sj_tensor_free(rt, &in[i]);
                }
                sj_stats s;
                sj_fn_stats(fn, &s);
                /* random B and T: a batch of 1 or a T equal to H, D or Dv gets
                 * an entry of its own, as on the CPU (3 seen on the H100) */
                assert_true(s.entries >= 1 && s.entries <= 4);
                sj_fn_destroy(fn);
                tu_free_all();
            }
        /* the same buffers again and again (caller's outputs): CUDA graphs
         * may serve them; a bad offsets tensor in the same buffer still fails */
        vl_spec sp = {0.5, 1};
        sj_fn *fn = vl_fn(rt, &sp, SJ_DYNAMIC_SYMBOLIC);
        batch x = make_batch(SJ_F16, 4, (int64_t[]){7, 1, 30, 12}, 0);
        sj_tensor hin[4] = {x.q, x.k, x.v, x.o}, in[4], out[2];
        for (int i = 0; i < 4; i++) in[i] = to_device(rt, &hin[i]);
        for (int o = 0; o < 2; o++) {
            out[o] = (sj_tensor){.dtype = SJ_F16, .rank = 3, .device = SJ_CUDA, .shape = {x.T, H, DV}};
            if (sj_tensor_alloc(rt, &out[o])) fail_msg("alloc: %s", sj_last_error());
        }
        for (int c = 0; c < 64; c++)
            if (sj_call(fn, in, 4, out, 2)) fail_msg("repeated call %d: %s", c, sj_last_error());
        int64_t n = x.T * H * DV;
        double *r0 = calloc((size_t)n, sizeof(double)), *r1 = calloc((size_t)n, sizeof(double));
        vl_ref(&x.q, &x.k, &x.v, x.off, x.B, &sp, r0, r1);
        sj_tensor h = to_host(rt, &out[0]);
        if (!tu_check(&h, r0, 2 * tu_tol(SJ_F16), "cuda varlen repeated")) fail_msg("repeated: mismatch");
        sj_tensor bad = tu_tensor(SJ_I32, 1, (int64_t[]){5});
        int32_t bo[5] = {0, 7, 6, 38, 50};
        for (int b = 0; b < 5; b++) tu_seti(&bad, b, bo[b]);
        if (sj_tensor_copy(rt, &in[3], &bad)) fail_msg("copy: %s", sj_last_error());
        sj_status st = sj_call(fn, in, 4, out, 2);
        if (st != SJ_EINDEX || !strstr(sj_last_error(), "decrease"))
            fail_msg("bad offsets in a repeated buffer: %s (%s)", sj_status_name(st), sj_last_error());
        if (sj_tensor_copy(rt, &in[3], &x.o)) fail_msg("copy: %s", sj_last_error());
        if (sj_call(fn, in, 4, out, 2)) fail_msg("after bad offsets: %s", sj_last_error());
        sj_stats s;
        sj_fn_stats(fn, &s);
        print_message("cuda varlen %s: %llu of %llu calls served by CUDA graphs\n", mode ? "fused" : "eager",
                      (unsigned long long)s.graph_calls, (unsigned long long)s.calls);
        free(r0), free(r1);
        for (int o = 0; o < 2; o++) sj_tensor_free(rt, &out[o]);
        for (int i = 0; i < 4; i++) sj_tensor_free(rt, &in[i]);
        sj_fn_destroy(fn);
        /* the error cases of the CPU test, on the device */
        fn = vl_fn(rt, &sp, SJ_DYNAMIC_SYMBOLIC);
        bad_calls(rt, fn, to_device, release_device);
        sj_fn_destroy(fn);
        sj_runtime_destroy(rt);
        tu_free_all();
    }
}

/* -- CUDA tensor cores --------------------------------------------------------
 * f16 and bf16 with D = Dv = 64 and 128 run the register kernels over
 * tiles of queries of one sequence (eager_varlen.cuh): sequences of 1, 3,
 * 64, 130 and 257 tokens packed in two orders (tiles that end, start and
 * fall inside 64-token chunks; a sequence of one token), causal and not,
 * against float64; each call takes the tensor-core kernel
 * (sj_cuda_attention_tc_calls). Bad offsets on that path still fail the
 * call with SJ_EINDEX and the check kernel's message. */

static sj_status vl_plain(sj_tracer *t, const sj_val *in, int n, void *u) {
    const vl_spec *sp = u;
    (void)n;
    return sj_output(t, sj_attention_varlen(t, in[0], in[1], in[2], in[3], sp->scale, sp->causal));
}

/* float64 attention of q, k, v [T, h, d] (contiguous) by sequence. */
/* (mag NULL, or each output's sum of |p v| over its keys: the scale of a
 * tensor-core kernel's rounding, whose probabilities are halves before
 * they meet v, as tu_ref_attention's) */
static void vl_ref_hd(const sj_tensor *q, const sj_tensor *k, const sj_tensor *v, const int32_t *off, int64_t B,
                      int64_t h, int64_t d, const vl_spec *sp, double *y, double *mag) {
    for (int64_t b = 0; b < B; b++) {
        int64_t s = off[b], e = off[b + 1];
        double *sc = malloc(sizeof(double) * (size_t)(e - s + 1));
        for (int64_t i = s; i < e; i++)
            for (int64_t hh = 0; hh < h; hh++) {
                int64_t lim = sp->causal ? i + 1 : e;
                double m = -INFINITY, l = 0;
                for (int64_t j = s; j < lim; j++) {
                    double dot = 0;
                    for (int64_t c = 0; c < d; c++) dot += tu_get(q, (i * h + hh) * d + c) * tu_get(k, (j * h + hh) * d + c);
                    sc[j - s] = dot * sp->scale;
                    if (sc[j - s] > m) m = sc[j - s];
                }
                for (int64_t j = s; j < lim; j++) l += sc[j - s] = exp(sc[j - s] - m);
                for (int64_t c = 0; c < d; c++) {
                    double a = 0, am = 0;
                    for (int64_t j = s; j < lim; j++) {
                        double t = sc[j - s] * tu_get(v, (j * h + hh) * d + c);
                        a += t, am += fabs(t);
                    }
                    y[(i * h + hh) * d + c] = a / l;
                    if (mag) mag[(i * h + hh) * d + c] = am / l;
                }
            }
        free(sc);
    }
}

static void test_varlen_cuda_tc(void **state) {
    (void)state;
    sj_runtime *rt = runtime(SJ_BACKEND_CUDA, SJ_COMPILE_OFF);
    if (!rt) {
        print_message("skipped: no CUDA device (%s)\n", sj_last_error());
        return;
    }
#ifdef SJ_WITH_CUDA
    static const int64_t orders[2][5] = {{1, 3, 64, 130, 257}, {257, 1, 130, 3, 64}};
    const int64_t h = 2;
    tu_seed(2629);
    for (int d = 1; d < 3; d++)
        for (int hd = 64; hd <= 128; hd += 64)
            for (int causal = 0; causal < 2; causal++) {
                sj_dtype dt = d == 1 ? SJ_F16 : SJ_BF16;
                vl_spec sp = {1.0 / sqrt((double)hd), causal};
                sj_fn_options o;
                sj_fn_options_init(&o);
                o.dynamic = SJ_DYNAMIC_SYMBOLIC;
                sj_fn *fn;
                if (sj_fn_create(rt, "varlen_tc", 4, vl_plain, &sp, &o, &fn)) fail_msg("fn: %s", sj_last_error());
                for (int ord = 0; ord < 2; ord++) {
                    int32_t off[6] = {0};
                    for (int b = 0; b < 5; b++) off[b + 1] = off[b] + (int32_t)orders[ord][b];
                    int64_t T = off[5];
                    sj_tensor q = tu_random(dt, 3, (int64_t[]){T, h, hd}, TU_CONTIG);
                    sj_tensor k = tu_random(dt, 3, (int64_t[]){T, h, hd}, TU_CONTIG);
                    sj_tensor v = tu_random(dt, 3, (int64_t[]){T, h, hd}, TU_CONTIG);
                    sj_tensor ot = tu_tensor(SJ_I32, 1, (int64_t[]){6});
                    for (int b = 0; b <= 5; b++) tu_seti(&ot, b, off[b]);
                    sj_tensor hin[4] = {q, k, v, ot}, in[4], out = {0};
                    for (int i = 0; i < 4; i++) in[i] = to_device(rt, &hin[i]);
                    char what[128];
                    snprintf(what, sizeof what, "cuda tc varlen %s D=%d causal=%d order %d", sj_dtype_name(dt), hd,
                             causal, ord);
                    uint64_t m0, m1, v0, v1;
                    sj_cuda_attention_tc_calls(&m0, &v0);
                    if (sj_call(fn, in, 4, &out, 1)) fail_msg("%s: %s", what, sj_last_error());
                    sj_cuda_attention_tc_calls(&m1, &v1);
                    if (v1 != v0 + 1) fail_msg("%s: %llu tensor-core varlen launches, expected 1", what,
                                               (unsigned long long)(v1 - v0));
                    double *r = calloc((size_t)(T * h * hd), sizeof(double)), *mg = calloc((size_t)(T * h * hd), sizeof(double));
                    vl_ref_hd(&q, &k, &v, off, 5, h, hd, &sp, r, mg);
                    sj_tensor y = to_host(rt, &out);
                    if (!tu_check_mag(&y, r, mg, 2 * tu_tol(dt), what)) fail_msg("%s: mismatch against float64", what);
                    free(mg);
                    free(r);
                    sj_tensor_free(rt, &out);
                    /* bad offsets (decreasing, past T, not from 0) on the tensor-core
                     * path: the call fails with SJ_EINDEX naming the fault, the
                     * kernel reads nothing outside [0, T) (clamped), and a good
                     * call follows */
                    static const int32_t bad[3][6] = {{0, 300, 200, 400, 450, 455},
                                                      {0, 1, 4, 68, 198, 500},
                                                      {5, 6, 9, 73, 203, 455}};
                    static const char *const bad_msg[3] = {"decrease", "offsets[B]", "offsets[0]"};
                    for (int c = 0; c < 3; c++) {
                        sj_tensor bo = tu_tensor(SJ_I32, 1, (int64_t[]){6});
                        for (int b = 0; b <= 5; b++) tu_seti(&bo, b, bad[c][b]);
                        if (sj_tensor_copy(rt, &in[3], &bo)) fail_msg("copy: %s", sj_last_error());
                        out = (sj_tensor){0};
                        sj_status st = sj_call(fn, in, 4, &out, 1);
                        if (st != SJ_EINDEX || !strstr(sj_last_error(), "attention_varlen: offsets") ||
                            !strstr(sj_last_error(), bad_msg[c]))
                            fail_msg("%s: bad offsets %d: %s (%s)", what, c, sj_status_name(st), sj_last_error());
                    }
                    if (sj_tensor_copy(rt, &in[3], &ot)) fail_msg("copy: %s", sj_last_error());
                    out = (sj_tensor){0};
                    if (sj_call(fn, in, 4, &out, 1)) fail_msg("%s: a good call after bad offsets: %s", what,
                                                              sj_last_error());
                    y = to_host(rt, &out);
                    r = calloc((size_t)(T * h * hd), sizeof(double));
                    double *mg2 = calloc((size_t)(T * h * hd), sizeof(double));
                    vl_ref_hd(&q, &k, &v, off, 5, h, hd, &sp, r, mg2);
                    if (!tu_check_mag(&y, r, mg2, 2 * tu_tol(dt), what))
                        fail_msg("%s: after bad offsets: mismatch", what);
                    free(r);
                    free(mg2);
                    sj_tensor_free(rt, &out);
                    for (int i = 0; i < 4; i++) sj_tensor_free(rt, &in[i]);
                }
                sj_fn_destroy(fn);
                tu_free_all();
            }
#endif
    sj_runtime_destroy(rt);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_varlen_cpu),
        cmocka_unit_test(test_varlen_bad_offsets),
        cmocka_unit_test(test_varlen_bad_trace),
        cmocka_unit_test(test_varlen_cuda),
        cmocka_unit_test(test_varlen_cuda_tc),
    };
    return cmocka_run_group_tests_name("varlen", tests, NULL, NULL);
}
