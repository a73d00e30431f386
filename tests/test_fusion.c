/* Fusion and C code generation through the real pipeline: model functions
 * are traced (every size >= 2 symbolic, or every size constant), fused,
 * generated in both forms, compiled by the CPU backend, run by the fused
 * executor (inline and on a thread pool) and compared with eager execution
 * of the same graph on the same inputs (outputs poisoned first), on random
 * shapes; a few patterns against float64 references too. Plan-level tests
 * check group structure, loads and stores, and the arena plan;
 * test_launch_desc the flat launch descriptor the executor hands the
 * device's launch slot (the host's split, and CUDA's grid without a GPU).
 * The patterns shared with test_codegen_cuda (tu_pat_*) and the harness
 * that traces them are in tests/util_patterns.c; this test's own are
 * below.
 */
/* cmocka.h needs these first, in this order */
/* clang-format off */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
/* clang-format on */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/sj_kernel_rt.h"
#include "jit/exec.h"
#include "jit/runtime.h"
#include "kernels/cpu/threads.h"
#include "jit/trace.h"
#include "kernels/cache.h"
#include "kernels/cpu/backend_cpu.h"
#include "kernels/cpu/eager.h"
#include "kernels/cpu/prepack.h"
#include "specialize/codegen.h"
#include "specialize/codegen_cuda.h"
#include "specialize/fusion.h"
#include "tests/util_encoder.h"
#include "tests/util_patterns.h"

#define S(...) ((const int64_t[]){__VA_ARGS__})
#define rnd tu_rnd

/* -- Environment ---------------------------------------------------------- */

static sj_runtime *rt;
static sj_backend *be;
static sj_cache *kcache;
static sj_threads *pool4;
static sj_pool arena_pool;

static int setup_all(void **state) {
    const char *seed = getenv("SJ_TEST_SEED");
    tu_seed(seed ? strtoull(seed, NULL, 0) : 0x5eed);
    if (sj_runtime_create(NULL, &rt)) return -1;
    /* SJ_TEST_KCACHE: a kernel cache directory (make test sets one, emptied
     * by the plain pass, which compiles every kernel; the sanitizer passes
     * load the same kernels from it instead of running the compiler again:
     * this test is about plans, generated code and the fused executor, and
     * the compiler path under the sanitizers is test_backend_cpu's and
     * test_jit's). Unset: every kernel is compiled. */
    const char *kc = getenv("SJ_TEST_KCACHE");
    if (kc && *kc && sj_cache_open(kc, 0, &kcache)) return -1;
    /* the kernels' compiler and flags, e.g. to sanitize them */
    sj_cpu_backend_config bc = {.cc = getenv("SJ_TEST_KCC"), .cflags = getenv("SJ_TEST_KCFLAGS"), .cache = kcache};
    if (sj_cpu_backend_create(&bc, &be)) return -1;
    pool4 = sj_threads_create(4);
    sj_pool_init(&arena_pool, rt);
    return 0;
}

static int teardown_all(void **state) {
    sj_pool_destroy(&arena_pool);
    sj_threads_destroy(pool4);
    if (be) be->destroy(be);
    sj_cache_close(kcache); /* after the backend, which borrows it */
    sj_runtime_destroy(rt);
    return 0;
}

/* -- Harness ---------------------------------------------------------------- */

typedef struct unit {
    void *fns[256 * SJ_CG_VARIANTS_MAX]; /* per group, by launch variant (sj_compiled's layout) */
    sj_module *mod;
} unit;

/* Compile the plan's generated groups with the CPU backend. */
static void compile(const sj_fplan *p, const char *src, size_t len, const char *prefix, unit *u) {
    const char *names[64];
    char buf[64][48];
    int gi_of[64], n = 0;
    memset(u, 0, sizeof *u);
    for (int gi = 0; gi < p->n_groups; gi++) {
        if (p->groups[gi].kind == SJ_G_NODE) continue;
        assert_true(n < 64);
        snprintf(buf[n], sizeof buf[n], "%s%s", prefix, p->groups[gi].name);
        names[n] = buf[n];
        gi_of[n++] = gi;
    }
    if (n == 0) return;
    sj_compile_req req = {.source = src, .source_len = len, .symbols = names, .n_symbols = n, .tag = prefix};
    sj_compile_result *res = calloc(1, sizeof *res);
    assert_non_null(res);
    sj_status st = be->compile(be, &req, res);
    if (st) fprintf(stderr, "compile failed: %s\n%s\n", sj_last_error(), res->log);
    assert_int_equal(st, SJ_OK);
    u->mod = res->module;
    assert_true(p->n_groups <= 256);
    for (int i = 0; i < n; i++) /* the C generator: one function per group, for every variant */
        for (int v = 0; v < SJ_CG_VARIANTS_MAX; v++) u->fns[gi_of[i] * SJ_CG_VARIANTS_MAX + v] = res->fns[i];
    free(res);
}

static void unit_free(unit *u) {
    if (u->mod) be->unload(be, u->mod);
}

/* A check of a fused pass's outputs fo (eo: eager's; what names the pass). */
typedef void (*pass_check)(const sj_graph *g, const sj_tensor *ins, const sj_tensor *fo, const sj_tensor *eo,
                           const char *what);

/* Run g eagerly, then through the plan inline and threaded on ins (the
 * outputs poisoned before each), each pass checked by check; the fused
 * outputs of the last pass stay in fo. */
static void run_passes(const sj_graph *g, const sj_fplan *p, void *const *fns, const sj_tensor *ins,
                       const int64_t *sv, const char *what, pass_check check, sj_tensor *fo) {
    sj_tensor eo[16];
    sj_exec x;
    tu_pattern_eager(rt, &arena_pool, g, ins, sv, what, &x, eo, fo);
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < g->n_outputs; i++) tu_poison(&fo[i]);
        x.outputs = fo;
        x.ops_ctx = pass ? pool4 : NULL;
        sj_status st = sj_exec_fused(&x, p, fns);
        if (st) fprintf(stderr, "%s: fused: %s\n", what, sj_last_error());
        assert_int_equal(st, SJ_OK);
        check(g, ins, fo, eo, tu_label("%s%s", what, pass ? " threads" : ""));
    }
}

/* Every output like eager's. */
static void like_eager(const sj_graph *g, const sj_tensor *ins, const sj_tensor *fo, const sj_tensor *eo,
                       const char *what) {
    (void)ins;
    for (int i = 0; i < g->n_outputs; i++)
        if (!tu_check_like_eager(&fo[i], &eo[i], tu_label("%s out%d", what, i)))
            fail_msg("%s: output %d differs from eager", what, i);
}

/* Run g eagerly and through the plan (inline and threaded) on ins; compare
 * every output, and output 0 with the float64 reference when given. */
static void run_and_compare(const sj_graph *g, const sj_fplan *p, void *const *fns, const sj_tensor *ins,
                            const int64_t *sv, tu_ref_fn ref, const char *what) {
    sj_tensor fo[16];
    run_passes(g, p, fns, ins, sv, what, like_eager, fo);
    if (ref) {
        double *r = tu_refbuf(1, tu_numel(&fo[0]));
        ref(ins, r);
        if (!tu_check(&fo[0], r, fo[0].dtype == SJ_F32 ? 2e-5 : tu_fused_tol(fo[0].dtype), tu_label("%s ref", what)))
            fail_msg("%s: output 0 differs from the float64 reference", what);
    }
}

/* The C form of every plan: generated, compiled with the CPU backend and
 * run inline and on the thread pool. */

static unit units[2]; /* per form: specialized, symbolic */
/* sj_codegen_opts.stream_min_bytes: 0, a quarter of the cache (the tests' shapes
 * stay under it: the chunked store loops without streaming); test_streamed
 * sets 1 (every f32 output streamed). */
static int64_t stream_min;

static void build_c(const sj_graph *g, const sj_fplan *p, const int64_t *sv, int form, const char *what) {
    const char *prefix = form ? "sym_" : "spec_";
    size_t len;
    int nv[256];
    assert_true(p->n_groups <= 256);
    for (int gi = 0; gi < p->n_groups; gi++) nv[gi] = -1;
    char *src = sj_codegen_c(g, p, sv, &(sj_codegen_opts){.prefix = prefix, .stream_min_bytes = stream_min, .variants = nv},
                             &len);
    assert_non_null(src);
    for (int gi = 0; gi < p->n_groups; gi++) /* one function per generated group */
        assert_int_equal(nv[gi], p->groups[gi].kind == SJ_G_NODE ? -1 : 1);
    compile(p, src, len, prefix, &units[form]);
    free(src);
}

static void run_c(const sj_graph *g, const sj_fplan *p, int form, const sj_tensor *ins, const int64_t *sv,
                  tu_ref_fn ref, const char *what) {
    run_and_compare(g, p, units[form].fns, ins, sv, ref, what);
}

static void unload_c(int form) { unit_free(&units[form]); }

static const tu_pattern_target cpu_target = {build_c, run_c, unload_c, true};

/* Trace pt at random sizes (static or symbolic), fuse, generate, compile;
 * run at the traced sizes and, symbolic, at other random sizes. */
static void run_pattern(const tu_pattern *pt, bool symbolic, sj_dtype dt, const int64_t *force) {
    tu_run_pattern(pt, symbolic, dt, force, &cpu_target);
}

static void run_both(const tu_pattern *pt, sj_dtype dt) {
    run_pattern(pt, false, dt, NULL);
    run_pattern(pt, true, dt, NULL);
}

/* -- Models of this test ---------------------------------------------------- */

/* softmax over a non-last axis: a NODE group between pointwise ones */
static sj_status m_softmax0(sj_tracer *t, const sj_val *in, int n, void *u) {
    sj_val s = sj_softmax(t, sj_mul(t, in[0], sj_scalar(t, 2.0)), 0);
    return sj_output(t, sj_add(t, s, sj_scalar(t, 1.0)));
}

/* a load both spaces of a reduction would read (v over rows in the
 * prologue, per row in the epilogue): the epilogue stays out */
static sj_status m_square(sj_tracer *t, const sj_val *in, int n, void *u) {
    sj_val r = sj_sum(t, sj_add(t, in[0], in[1]), -1, 0);
    return sj_output(t, sj_mul(t, r, in[1]));
}
static void mk_square(const int64_t *d, sj_dtype dt, sj_tensor *in) {
    in[0] = rnd(dt, 2, S(d[0], d[0]));
    in[1] = rnd(dt, 1, S(d[0]));
}

/* naive merging would make a cycle: a = exp(x); m = a @ W; y = a + m */
static sj_status m_cycle(sj_tracer *t, const sj_val *in, int n, void *u) {
    sj_val a = sj_exp(t, sj_mul(t, in[0], sj_scalar(t, 0.1)));
    sj_val m = sj_matmul(t, a, sj_param(t, &tu_params[2]));
    sj_output(t, sj_add(t, a, m));
    return sj_output(t, sj_mul(t, sj_sigmoid(t, m), sj_neg(t, a)));
}
static void mk_cycle(const int64_t *d, sj_dtype dt, sj_tensor *in) { in[0] = rnd(dt, 2, S(d[0], 16)); }

/* the encoder layer of samples/varlen_encoder (tests/util_encoder; sizes
 * from enc_init) */
enum { EH = 64, ENH = 4, EFF = 128 };
static tu_encoder encw;
static sj_status m_encoder(sj_tracer *t, const sj_val *in, int n, void *u) { return tu_encoder_model(t, in, n, &encw); }
static void mk_encoder(const int64_t *d, sj_dtype dt, sj_tensor *in) { in[0] = rnd(dt, 3, S(1, d[0], encw.h)); }

static sj_tensor small_param(sj_dtype dt, int rank, const int64_t *shape, double scale) {
    sj_tensor t = rnd(dt, rank, shape);
    for (int64_t i = 0; i < tu_numel(&t); i++) tu_set(&t, i, tu_get(&t, i) * scale);
    return t;
}

static tu_pattern P_ENCODER; /* below */

static void enc_init(int h, int nh, int ff) {
    tu_encoder_init(&encw, SJ_F32, h, nh, ff);
    P_ENCODER.fixed[0] = h;
}

/* -- This test's patterns (the shared ones: tu_pat_*) --------------------------------- */

static const tu_pattern P_SOFTMAX0 = {"softmax axis 0", m_softmax0, 1, tu_mk_2d, 2, {2, 3}, {30, 90}, true, NULL, {0}};
static const tu_pattern P_SQUARE = {"square", m_square, 2, mk_square, 1, {2}, {70}, true, NULL, {0}};
static const tu_pattern P_CYCLE = {"cycle", m_cycle, 1, mk_cycle, 1, {2}, {40}, true, NULL, {16}};
static tu_pattern P_ENCODER = {"encoder", m_encoder, 1, mk_encoder, 1, {2}, {40}, true, NULL, {EH}};

/* -- Differential tests ---------------------------------------------------------- */

static void test_w1(void **state) {
    run_both(&tu_pat_w1, SJ_F32);
    run_both(&tu_pat_w1_big, SJ_F32);
}
static void test_w2(void **state) { run_both(&tu_pat_w2, SJ_F32); }
static void test_w3(void **state) { run_both(&tu_pat_w3, SJ_F32); }
static void test_matmul_gelu(void **state) {
    tu_params[0] = small_param(SJ_F32, 2, S(24, 40), 0.3);
    tu_params[1] = small_param(SJ_F32, 1, S(40), 1);
    run_both(&tu_pat_mmgelu, SJ_F32);
}
/* bias adds after products, in f32, f16 and bf16 (parameters of the
 * dtype): the epilogue's on the CPU kernel, against eager (which adds in a
 * kernel of its own) and float64; the plan: two products take their add,
 * two do not (test_plan_bias) */
static void test_matmul_bias(void **state) {
    static const sj_dtype dts[3] = {SJ_F32, SJ_F16, SJ_BF16};
    for (int d = 0; d < 3; d++) {
        tu_params[0] = small_param(dts[d], 2, S(24, 40), 0.3);
        tu_params[1] = small_param(dts[d], 1, S(40), 1);
        run_both(&tu_pat_mmbias, dts[d]);
    }
}
static void test_views(void **state) {
    run_both(&tu_pat_views, SJ_F32);
    run_both(&tu_pat_strided, SJ_F32);
    run_both(&tu_pat_reshape, SJ_F32);
}
static void test_softmax_axis0(void **state) { run_both(&P_SOFTMAX0, SJ_F32); }
static void test_reduce(void **state) { run_both(&tu_pat_reduce, SJ_F32); }
static void test_rows(void **state) {
    run_both(&tu_pat_rows, SJ_F32);
    run_both(&tu_pat_rows_long, SJ_F32);
    run_both(&tu_pat_ln_offset, SJ_F32);
}
static void test_casts_where(void **state) { run_both(&tu_pat_casts, SJ_F32); }
static void test_ints(void **state) { run_both(&tu_pat_ints, SJ_F32); }
static void test_half(void **state) {
    run_both(&tu_pat_w1, SJ_F16);
    run_both(&tu_pat_w2, SJ_BF16);
    run_both(&tu_pat_w3, SJ_F16);
    run_both(&tu_pat_reduce, SJ_BF16);
    run_both(&tu_pat_rows, SJ_F16);
    run_both(&tu_pat_rows_long, SJ_BF16);
    /* f16 unit-stride accesses convert by chunk (test_half_bits): long rows
     * (chunked passes), reductions, the norm with GELU, strided views */
    run_both(&tu_pat_rows_long, SJ_F16);
    run_both(&tu_pat_reduce, SJ_F16);
    run_both(&tu_pat_w2, SJ_F16);
    run_both(&tu_pat_strided, SJ_F16);
}
/* f16 accesses with unit inner stride are converted a chunk at a time
 * (sj_rt_f16_load / sj_rt_f16_store: F16C where the kernels' -march=native
 * has it): every f16 bit pattern, signalling NaNs included, widened by a
 * generated kernel must be sj_f16_to_f32's, and f32 results narrowed
 * sj_f32_to_f16's, bit for bit, in rows whose length is no multiple of a
 * vector or of the 256-element chunk (and, symbolic, at other lengths too).
 * y0 = f32(x); y1 = x * w in f16 (the f32 product of two f16 is exact, so
 * its rounding is the store's: ties, subnormals, overflow, NaN payloads;
 * w is never NaN, whose operand order would decide the payload); y2 = -x
 * in f16; y3 = the row's layer norm of x + f16(z) in f16 (a ROW group's
 * passes) against float64. */
static sj_status m_h16bits(sj_tracer *t, const sj_val *in, int n, void *u) {
    sj_val x = in[0], z = in[1], w = in[2];
    sj_output(t, sj_cast(t, x, SJ_F32));
    sj_output(t, sj_mul(t, x, w));
    sj_output(t, sj_neg(t, x));
    return sj_output(t, sj_layer_norm(t, sj_add(t, x, sj_cast(t, z, SJ_F16)), SJ_NONE, SJ_NONE, 1e-5));
}
static uint64_t h16_rng = 0x9E3779B97F4A7C15ull;
static uint32_t h16_next(void) {
    h16_rng = h16_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(h16_rng >> 32);
}
/* Even rows: x every f16 pattern in turn (from a random start; then
 * random ones), z f32 halfway cases, subnormal and overflow edges, NaNs
 * and random bits. Odd rows, finite for the norm: x in (-4, 4), z halfway
 * between two f16 in +-[0.5, 2). */
static void mk_h16bits(const int64_t *d, sj_dtype dt, sj_tensor *in) {
    (void)dt;
    in[0] = tu_tensor(SJ_F16, 2, S(d[0], d[1]));
    in[1] = tu_tensor(SJ_F32, 2, S(d[0], d[1]));
    in[2] = tu_tensor(SJ_F16, 2, S(d[0], d[1]));
    uint16_t *x = in[0].data, *w = in[2].data;
    float *z = in[1].data;
    uint32_t h = h16_next(), seen = 0;
    for (int64_t i = 0; i < d[0] * d[1]; i++) {
        uint32_t r = h16_next(), b;
        w[i] = (uint16_t)h16_next();
        if ((w[i] & 0x7c00u) == 0x7c00u && (w[i] & 0x3ffu)) w[i] = (uint16_t)(w[i] & 0xfc00u); /* NaN: inf */
        if ((i / d[1]) % 2) {
            x[i] = sj_f32_to_f16((float)((int32_t)(r >> 8) - (1 << 23)) * 0x1p-21f);
            b = (r & 0x80000000u) | (0x3f000000u + (r & 0x00ffe000u)) | 0x00001000u;
        } else {
            x[i] = (uint16_t)(seen++ < 65536 ? h++ : h16_next());
            switch (r % 6) {
            case 0: b = (r & 0x8fffe000u) | 0x00001000u; break; /* halfway between two f16 */
            case 1: b = 0x33000000u + (r >> 20); break;           /* around half the smallest subnormal */
            case 2: b = 0x477fe000u + (r >> 19); break;           /* around 65504 and 65520 */
            case 3: b = 0x7f800001u + (r >> 9); break;            /* NaNs, both kinds */
            default: b = r; break;
            }
        }
        memcpy(&z[i], &b, sizeof b);
    }
}
static const tu_pattern P_H16BITS = {"f16 bits", m_h16bits, 3, mk_h16bits, 2, {2, 9}, {40, 700}, true, NULL, {0}};

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static void h16_check(const sj_tensor *ins, const sj_tensor *fo, const char *what) {
    int64_t R = ins[0].shape[0], C = ins[0].shape[1], n = R * C;
    const uint16_t *x = ins[0].data, *w = ins[2].data, *y1 = fo[1].data, *y2 = fo[2].data;
    const float *z = ins[1].data, *y0 = fo[0].data;
    for (int64_t i = 0; i < n; i++) {
        if (f32_bits(y0[i]) != f32_bits(sj_f16_to_f32(x[i])))
            fail_msg("%s: f32(f16 %04x) at %lld: %08x, not %08x", what, x[i], (long long)i, f32_bits(y0[i]),
                     f32_bits(sj_f16_to_f32(x[i])));
        uint16_t p = sj_f32_to_f16(sj_f16_to_f32(x[i]) * sj_f16_to_f32(w[i]));
        if (y1[i] != p)
            fail_msg("%s: f16 %04x * %04x at %lld: %04x, not %04x", what, x[i], w[i], (long long)i, y1[i], p);
        if (y2[i] != sj_f32_to_f16(-sj_f16_to_f32(x[i])))
            fail_msg("%s: -(f16 %04x) at %lld: %04x", what, x[i], (long long)i, y2[i]);
    }
    /* the norm against float64 over the rows without inf or NaN */
    double *r = tu_refbuf(0, C);
    const uint16_t *y3 = fo[3].data;
    int64_t rows = 0;
    for (int64_t i = 0; i < R; i++) {
        double s = 0, ss = 0;
        bool ok = true;
        for (int64_t j = 0; j < C; j++) {
            r[j] = (double)sj_f16_to_f32(x[i * C + j]) + (double)sj_f16_to_f32(sj_f32_to_f16(z[i * C + j]));
            ok &= isfinite(r[j]) && fabs(r[j]) < 1e4;
            s += r[j];
        }
        if (!ok) continue;
        rows++;
        double mean = s / (double)C;
        for (int64_t j = 0; j < C; j++) ss += (r[j] - mean) * (r[j] - mean);
        double rs = 1.0 / sqrt(ss / (double)C + 1e-5);
        for (int64_t j = 0; j < C; j++) {
            double want = (r[j] - mean) * rs, got = sj_f16_to_f32(y3[i * C + j]);
            if (!(fabs(got - want) <= 4e-3 * (1 + fabs(want))))
                fail_msg("%s: layer norm row %lld col %lld: %g, float64 %g", what, (long long)i, (long long)j, got, want);
        }
    }
    assert_true(rows >= R / 2); /* the odd rows at least */
}

static void h16_pass(const sj_graph *g, const sj_tensor *ins, const sj_tensor *fo, const sj_tensor *eo,
                     const char *what) {
    (void)g, (void)eo;
    h16_check(ins, fo, what);
}

static void h16_run(const sj_graph *g, const sj_fplan *p, int form, const sj_tensor *ins, const int64_t *sv,
                    const char *what) {
    sj_tensor fo[16];
    run_passes(g, p, units[form].fns, ins, sv, what, h16_pass, fo);
}

static void test_half_bits(void **state) {
    for (int symbolic = 0; symbolic < 2; symbolic++) {
        int64_t d[2] = {0, 0};
        sj_tensor tin[3], rin[3];
        tu_random_dims(&P_H16BITS, d);
        if (!symbolic) d[0] = 2 * (65536 / 331 + 1), d[1] = 331; /* every f16 pattern */
        mk_h16bits(d, SJ_F16, tin);
        tu_pol pl = {.sym = symbolic, .fixed = P_H16BITS.fixed};
        sj_graph *g;
        int64_t sv[64] = {0};
        sj_fplan *p = tu_pattern_plan(&P_H16BITS, tin, &pl, &g, sv);
        size_t len;
        char *src = sj_codegen_c(g, p, symbolic ? NULL : sv, &(sj_codegen_opts){.prefix = "h_"}, &len);
        assert_non_null(src); /* the chunked conversions are what is under test */
        assert_non_null(strstr(src, "sj_rt_f16_load(H"));
        assert_non_null(strstr(src, "sj_rt_f16_store(P"));
        free(src);
        build_c(g, p, symbolic ? NULL : sv, symbolic, "f16 bits");
        h16_run(g, p, symbolic, tin, sv, symbolic ? "f16 bits sym" : "f16 bits static");
        for (int rep = 0; symbolic && rep < 3; rep++) {
            int64_t e[2];
            tu_random_dims(&P_H16BITS, e);
            mk_h16bits(e, SJ_F16, rin);
            for (int s = 0; s < pl.n; s++) sv[s] = rin[pl.in[s]].shape[pl.ax[s]];
            h16_run(g, p, 1, rin, sv, tu_label("f16 bits sym %lld x %lld", (long long)e[0], (long long)e[1]));
        }
        unload_c(symbolic);
        sj_fplan_free(p);
        sj_graph_destroy(g);
    }
}

static void test_shared_value(void **state) { run_both(&tu_pat_shared, SJ_F32); }
static void test_outputs(void **state) {
    run_both(&tu_pat_outs, SJ_F32);
    run_both(&P_SQUARE, SJ_F32);
}

/* sizes 0: nothing to run, outputs still right (empty) */
static void test_empty(void **state) {
    run_pattern(&tu_pat_w1, false, SJ_F32, S(0, 7));
    run_pattern(&tu_pat_w2, false, SJ_F32, S(0, 7));
    run_pattern(&tu_pat_w2, true, SJ_F32, S(0, 7));
    run_pattern(&tu_pat_reduce, true, SJ_F32, S(0, 5));
    run_pattern(&tu_pat_sum0, false, SJ_F32, S(3, 0)); /* rows of 0: sum 0, mean NaN */
}
/* -- The launch descriptor ------------------------------------------------------------
 * The fused executor hands each generated group to the device's launch slot
 * as a flat descriptor (kernels/device.h's sj_dev_launch) it fills from the
 * group and the call's sizes. A recording device checks every field
 * against the group's expected launch: on the host the one function of the
 * C generator, its work items and chunk (the recorder then runs it: the
 * outputs equal eager's); on a device with a grid (a table that says
 * SJ_CUDA and units multiprocessors; nothing runs, so no GPU is needed)
 * the function of sj_cuda_launch's variant with its grid, block and shared
 * memory, for 132, 16 and 0 units. Both: the group's base pointers (the
 * inputs', the outputs', the arena's), the symbol values, and one launch
 * per non-empty group, in plan order. */

#define REC_MAX 64
#define REC_PTRS 256
static struct {
    int n;
    bool run; /* run the launch on the CPU after recording it */
    struct {
        sj_dev_launch d;
        void *ptrs[REC_PTRS];
        int64_t syms[64];
    } r[REC_MAX];
} rec;

static sj_status rec_launch(void *c, const sj_dev_launch *d) {
    assert_true(rec.n < REC_MAX);
    assert_true(d->n_ptrs >= 0 && d->n_ptrs <= REC_PTRS && d->n_syms >= 0 && d->n_syms <= 64);
    rec.r[rec.n].d = *d;
    memcpy(rec.r[rec.n].ptrs, d->ptrs, sizeof(void *) * (size_t)d->n_ptrs);
    if (d->n_syms) memcpy(rec.r[rec.n].syms, d->syms, sizeof(int64_t) * (size_t)d->n_syms);
    rec.n++;
    return rec.run ? sj_cpu_exec_ops.launch(c, d) : SJ_OK;
}

/* The recorded launches of one run of p against what its groups expect at
 * sv (units < 0: the host's rule; else the CUDA generator's for units). */
static int n_fallbacks; /* launches of a split row kernel's fallback (check_launches) */

static void check_launches(const sj_graph *g, const sj_fplan *p, void *const *fns, const sj_tensor *ins,
                           const sj_tensor *outs, const int64_t *sv, int units, const char *what) {
    int n_ex = sj_ex_count(g->ex), n_syms = sj_sym_count(g->ex), k = 0;
    int64_t *exv = malloc(sizeof(int64_t) * (size_t)(n_ex ? n_ex : 1));
    assert_non_null(exv);
    sj_ex_eval_all(g->ex, sv, exv);
    for (int gi = 0; gi < p->n_groups; gi++) {
        const sj_group *gr = &p->groups[gi];
        if (gr->kind == SJ_G_NODE) continue;
        sj_launch L = {0};
        int64_t items = 0, chunk = 0, elems = 0;
        if (units >= 0) {
            if (!sj_cuda_launch(gr, exv, units, &L)) continue;
        } else {
            items = gr->kind == SJ_G_ROW ? exv[gr->rows] : exv[gr->numel];
            if (items <= 0) continue;
            int64_t row = gr->kind == SJ_G_ROW ? exv[gr->shape[gr->rank - 1]] : 1;
            chunk = gr->kind == SJ_G_ROW ? (row > 0 ? (32768 + row - 1) / row : 1) : 32768;
            elems = row > 0 ? row : 1;
        }
        void *fn = fns[(size_t)gi * SJ_CG_VARIANTS_MAX + (size_t)L.variant];
        /* a row kernel with its unaligned path split off: that kernel where
         * the vector path's test fails for the launch's pointers */
        void *fb = units >= 0 ? fns[(size_t)gi * SJ_CG_VARIANTS_MAX + SJ_CG_FALLBACK] : NULL;
        if (fb && k < rec.n && !sj_cuda_vec_ok(g, gr, exv, rec.r[k].ptrs)) fn = fb, n_fallbacks++;
        /* a product's epilogue group the product ran inside it (the host's matmul_epi) */
        if (gr->epilogue_of >= 0 && units < 0 && (k >= rec.n || rec.r[k].d.fn != fn)) continue;
        if (k >= rec.n) fail_msg("%s (units %d): group %s not launched", what, units, gr->name);
        const sj_dev_launch *d = &rec.r[k].d;
        const char *lb = tu_label("%s (units %d) group %s", what, units, gr->name);
        if (d->fn != fn) fail_msg("%s: function", lb);
        if (d->items != items || d->min_chunk != chunk || d->item_elems != elems)
            fail_msg("%s: items %lld chunk %lld elements an item %lld, expected %lld %lld %lld", lb, (long long)d->items,
                     (long long)d->min_chunk, (long long)d->item_elems, (long long)items, (long long)chunk,
                     (long long)elems);
        for (int i = 0; i < 3; i++)
            if (d->grid[i] != L.grid[i] || d->block[i] != L.block[i])
                fail_msg("%s: grid %u %u %u block %u %u %u, expected %u %u %u / %u %u %u", lb, d->grid[0], d->grid[1],
                         d->grid[2], d->block[0], d->block[1], d->block[2], L.grid[0], L.grid[1], L.grid[2],
                         L.block[0], L.block[1], L.block[2]);
        if (d->smem != L.smem) fail_msg("%s: shared memory %u, expected %u", lb, d->smem, L.smem);
        assert_int_equal(d->n_ptrs, gr->n_loads + gr->n_stores);
        assert_int_equal(d->n_syms, n_syms);
        for (int i = 0; i < n_syms; i++) assert_int_equal(rec.r[k].syms[i], sv[i]);
        for (int a = 0; a < d->n_ptrs; a++) {
            const sj_store *so = &p->stores[a < gr->n_loads ? gr->loads[a].store : gr->stores[a - gr->n_loads].store];
            void *want = so->kind == SJ_ST_INPUT ? ins[so->index].data
                         : so->kind == SJ_ST_OUTPUT ? outs[so->index].data
                         : so->kind == SJ_ST_PARAM ? g->params[so->index].data
                                                   : rec.r[k].ptrs[a]; /* the arena's: somewhere in it */
            if (rec.r[k].ptrs[a] != want || !want) fail_msg("%s: base pointer %d (store kind %d)", lb, a, so->kind);
        }
        k++;
    }
    if (k != rec.n) fail_msg("%s (units %d): %d launches, %d expected", what, units, rec.n, k);
    free(exv);
}

static void run_launch(const sj_graph *g, const sj_fplan *p, int form, const sj_tensor *ins, const int64_t *sv,
                       tu_ref_fn ref, const char *what) {
    (void)ref;
    sj_tensor eo[16], fo[16], din[16];
    sj_exec x;
    tu_pattern_eager(rt, &arena_pool, g, ins, sv, what, &x, eo, fo);
    /* the host: recorded, then run (inline and on the pool) */
    sj_backend host = sj_cpu_exec_ops;
    host.launch = rec_launch;
    x.ops = &host;
    x.outputs = fo;
    rec.run = true;
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < g->n_outputs; i++) tu_poison(&fo[i]);
        rec.n = 0;
        x.ops_ctx = pass ? pool4 : NULL;
        if (sj_exec_fused(&x, p, units[form].fns)) fail_msg("%s: fused: %s", what, sj_last_error());
        check_launches(g, p, units[form].fns, ins, fo, sv, -1, what);
        for (int i = 0; i < g->n_outputs; i++)
            if (!tu_check_like_eager(&fo[i], &eo[i], tu_label("%s out%d", what, i)))
                fail_msg("%s: output %d differs from eager", what, i);
    }
    /* a device with a grid: recorded only (the memory is the host's, tagged
     * as the device's); a function per group and variant */
    static char marks[256 * SJ_CG_VARIANTS_MAX];
    void *gfns[256 * SJ_CG_VARIANTS_MAX];
    assert_true(p->n_groups <= 256 && g->n_inputs <= 16 && g->n_outputs <= 16);
    for (int i = 0; i < p->n_groups * SJ_CG_VARIANTS_MAX; i++) gfns[i] = &marks[i];
    for (int i = 0; i < g->n_inputs; i++) din[i] = ins[i], din[i].device = SJ_CUDA;
    for (int i = 0; i < g->n_outputs; i++) fo[i].device = SJ_CUDA;
    sj_backend grid = sj_cpu_exec_ops;
    grid.device = SJ_CUDA;
    grid.launch = rec_launch;
    grid.k.matmul_epi = NULL; /* as on CUDA: a product's epilogue group is launched after it */
    x.ops = &grid;
    x.ops_ctx = NULL;
    x.inputs = din;
    rec.run = false;
    static const int sms[] = {132, 16, 0};
    for (int u = 0; u < 3; u++) {
        grid.units = sms[u];
        rec.n = 0;
        if (sj_exec_fused(&x, p, gfns)) fail_msg("%s: fused on the grid device: %s", what, sj_last_error());
        check_launches(g, p, gfns, din, fo, sv, sms[u], what);
    }
}

static const tu_pattern_target launch_target = {build_c, run_launch, unload_c, true};

static void test_launch_desc(void **state) {
    /* pointwise: one chunk and many, rows of one; ROW: rows in each of the
     * CUDA generator's length classes (its four symbolic variants), few
     * rows and many; static and symbolic; then random sizes */
    static const int64_t w1[][2] = {{7, 5000}, {2, 3}, {300, 40}};
    static const int64_t rows[][2] = {{5, 40}, {3, 700}, {2, 1500}, {2, 3000}, {400, 9}};
    for (int sym = 0; sym < 2; sym++) {
        for (size_t i = 0; i < sizeof w1 / sizeof w1[0]; i++) tu_run_pattern(&tu_pat_w1, sym, SJ_F32, w1[i], &launch_target);
        for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
            tu_run_pattern(&tu_pat_rows, sym, SJ_F32, rows[i], &launch_target);
        tu_run_pattern(&tu_pat_w2, sym, SJ_F32, NULL, &launch_target);
        tu_params[0] = small_param(SJ_F32, 2, S(24, 40), 0.3); /* products: NODE groups between */
        tu_params[1] = small_param(SJ_F32, 1, S(40), 1);
        tu_run_pattern(&tu_pat_mmbias, sym, SJ_F32, NULL, &launch_target);
        tu_run_pattern(&tu_pat_w2, sym, SJ_F32, S(0, 7), &launch_target); /* empty: no launch */
    }
    assert_true(n_fallbacks > 0); /* rows of 9: split kernels' fallbacks launched (the table has every slot) */
}

/* Non-temporal stores on every f32 output (through the stack chunks, with
 * the unaligned heads and tails of random shapes), on one thread and four. */
static int stream_all(void **state) {
    stream_min = 1;
    return 0;
}
static int stream_default(void **state) {
    stream_min = 0;
    return tu_teardown(state);
}
/* The default kernel flags turn streaming on where the CPU can stream
 * (else every streamed pattern below would run the plain variant). */
static void expect_stream_compiled(void) {
    sj_compile_result *res = calloc(1, sizeof *res);
    assert_non_null(res);
    int (*have_stream)(void) = (int (*)(void))tu_compile_rt_unit(
        be, "\nint sj_have_stream(void);\nint sj_have_stream(void) { return SJ_RT_HAVE_STREAM; }\n",
        "sj_have_stream", "have_stream", res);
    int have = have_stream();
#if defined(__x86_64__)
    if (!getenv("SJ_TEST_KCFLAGS")) assert_int_equal(have, __builtin_cpu_supports("avx") ? 1 : 0);
#endif
    print_message("  streaming stores in generated kernels: %s\n", have ? "yes" : "no (plain copies)");
    be->unload(be, res->module);
    free(res);
}

static void test_streamed(void **state) {
    expect_stream_compiled();
    run_both(&tu_pat_w1, SJ_F32);
    run_both(&tu_pat_w1_big, SJ_F32);
    run_both(&tu_pat_w2, SJ_F32);
    run_both(&tu_pat_w3_masked, SJ_F32);
    run_both(&tu_pat_views, SJ_F32);
    run_both(&tu_pat_strided, SJ_F32);
    run_both(&tu_pat_reduce, SJ_F32);
    run_both(&tu_pat_reduce_long, SJ_F32);
    run_both(&tu_pat_rows, SJ_F32);
    run_both(&tu_pat_rows_mid, SJ_F32);
    run_both(&tu_pat_rows_long, SJ_F32);
    run_both(&tu_pat_casts, SJ_F32);
    run_both(&tu_pat_shared, SJ_F32);
    run_both(&tu_pat_outs, SJ_F32);
    run_both(&tu_pat_w2, SJ_BF16); /* nothing staged: the plain loops */
    test_half_bits(state); /* f16 loads by chunk, the f32 store streamed */
}

static void test_cycle(void **state) {
    tu_params[2] = small_param(SJ_F32, 2, S(16, 16), 0.3);
    run_both(&P_CYCLE, SJ_F32);
}
static void test_encoder(void **state) {
    enc_init(EH, ENH, EFF);
    run_both(&P_ENCODER, SJ_F32);
}


/* -- Epilogues inside products ------------------------------------------------------ *
 * A product's elementwise consumer runs inside the CPU product, per block
 * of finished rows and panels (sj_group.epilogue, the device's matmul_epi kernel):
 * through packed weights (sj_exec_prepack, as a traced entry does) and
 * through sgemm (b an input), inline and on four threads, static and
 * symbolic M; against eager, against the same plan with the epilogue run
 * as its own pass (bit for bit), and against float64. K and N stay
 * constant (EK, EN: 13 panels, the last half full, so a thread's panels
 * come in several chunks); M up to 333 makes two blocks of rows. */

enum { EK = 256, EN = 200 };

/* relu(a @ W + c): W a parameter [EK, EN], c [M, EN] an input */
static sj_status m_epi_relu(sj_tracer *t, const sj_val *in, int n, void *u) {
    sj_val m = sj_matmul(t, in[0], sj_param(t, &tu_params[3]));
    return sj_output(t, sj_relu(t, sj_add(t, m, in[1])));
}
static void mk_epi_relu(const int64_t *d, sj_dtype dt, sj_tensor *in) {
    in[0] = rnd(dt, 2, S(d[0], EK));
    in[1] = rnd(dt, 2, S(d[0], EN));
}
static void ref_epi_relu(const sj_tensor *in, double *out);

/* relu(a @ b + c) with b an input (sgemm), and the same cast to f16 */
static sj_status m_epi_relu_act(sj_tracer *t, const sj_val *in, int n, void *u) {
    sj_val y = sj_relu(t, sj_add(t, sj_matmul(t, in[0], in[2]), in[1]));
    sj_output(t, y);
    return sj_output(t, sj_cast(t, y, SJ_F16));
}
static void mk_epi_relu_act(const int64_t *d, sj_dtype dt, sj_tensor *in) {
    mk_epi_relu(d, dt, in);
    in[2] = tu_params[3];
}

/* gelu(x @ W + b) + r over a batch of 2: x [2, M, EK], r [2, M, EN]; the
 * bias add is the product's own (sj_group.bias), the rest its epilogue */
static sj_status m_epi_gelu(sj_tracer *t, const sj_val *in, int n, void *u) {
    sj_val h = sj_add(t, sj_matmul(t, in[0], sj_param(t, &tu_params[3])), sj_param(t, &tu_params[4]));
    return sj_output(t, sj_add(t, sj_gelu(t, h), in[1]));
}
static void mk_epi_gelu(const int64_t *d, sj_dtype dt, sj_tensor *in) {
    in[0] = rnd(dt, 3, S(2, d[0], EK));
    in[1] = rnd(dt, 3, S(2, d[0], EN));
}
static void ref_epi_gelu(const sj_tensor *in, double *out);

/* h = exp(a / 4) in the arena, read by the product only; t = relu(h @ b +
 * c) in the arena too, then t @ W2: t must not take h's bytes, which the
 * product still reads while its epilogue writes t (b an input: sgemm
 * reads h in place, part by part) */
static sj_status m_epi_arena(sj_tracer *t, const sj_val *in, int n, void *u) {
    sj_val h = sj_exp(t, sj_mul(t, in[0], sj_scalar(t, 0.25)));
    sj_val r = sj_relu(t, sj_add(t, sj_matmul(t, h, in[2]), in[1]));
    return sj_output(t, sj_matmul(t, r, sj_param(t, &tu_params[5])));
}
static void ref_epi_arena(const sj_tensor *in, double *out) {
    int64_t M = in[0].shape[0];
    double *h = calloc((size_t)(M * EK), sizeof *h), *r = calloc((size_t)(M * EN), sizeof *r);
    assert_true(h && r);
    for (int64_t i = 0; i < M * EK; i++) h[i] = exp(tu_get(&in[0], i) * 0.25);
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < EN; j++) {
            double acc = 0;
            for (int64_t k = 0; k < EK; k++) acc += h[i * EK + k] * tu_get(&in[2], k * EN + j);
            r[i * EN + j] = fmax(acc + tu_get(&in[1], i * EN + j), 0.0);
        }
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < EN; j++) {
            double acc = 0;
            for (int64_t k = 0; k < EN; k++) acc += r[i * EN + k] * tu_get(&tu_params[5], k * EN + j);
            out[i * EN + j] = acc;
        }
    free(h);
    free(r);
}

/* y = a @ W (square) read with its transpose: no epilogue */
static sj_status m_epi_view(sj_tracer *t, const sj_val *in, int n, void *u) {
    sj_val y = sj_matmul(t, in[0], sj_param(t, &tu_params[5]));
    return sj_output(t, sj_add(t, y, sj_transpose(t, y, 0, 1)));
}
static void mk_epi_view(const int64_t *d, sj_dtype dt, sj_tensor *in) { in[0] = rnd(dt, 2, S(EN, EN)); }

static const tu_pattern P_EPI_RELU = {"epi relu", m_epi_relu, 2, mk_epi_relu, 1, {2}, {333}, true, ref_epi_relu, {EK, EN}};
static const tu_pattern P_EPI_ACT = {"epi relu act", m_epi_relu_act, 3, mk_epi_relu_act, 1, {2}, {333}, true, ref_epi_relu, {EK, EN}};
static const tu_pattern P_EPI_GELU = {"epi gelu", m_epi_gelu, 2, mk_epi_gelu, 1, {3}, {170}, true, ref_epi_gelu, {EK, EN}};
static const tu_pattern P_EPI_ARENA = {"epi arena", m_epi_arena, 3, mk_epi_relu_act, 1, {2}, {333}, true, ref_epi_arena, {EK, EN}};
static const tu_pattern P_EPI_VIEW = {"epi view", m_epi_view, 1, mk_epi_view, 1, {EN}, {EN}, false, NULL, {EN}};

/* a @ W over the rows of a (any leading axes), W tu_params[3], in double */
static void ref_rows(const sj_tensor *a, double *out) {
    const sj_tensor *w = &tu_params[3];
    int64_t rows = tu_numel(a) / EK;
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < EN; j++) {
            double acc = 0;
            for (int64_t k = 0; k < EK; k++) acc += tu_get(a, i * EK + k) * tu_get(w, k * EN + j);
            out[i * EN + j] = acc;
        }
}
static void ref_epi_relu(const sj_tensor *in, double *out) {
    ref_rows(&in[0], out);
    for (int64_t i = 0; i < tu_numel(&in[1]); i++) out[i] = fmax(out[i] + tu_get(&in[1], i), 0.0);
}
static void ref_epi_gelu(const sj_tensor *in, double *out) {
    ref_rows(&in[0], out);
    for (int64_t i = 0; i < tu_numel(&in[1]); i++)
        out[i] = tu_ref_unary1(SJ_OP_GELU, out[i] + tu_get(&tu_params[4], i % EN)) + tu_get(&in[1], i);
}

static int n_epilogues(const sj_fplan *p) {
    int n = 0;
    for (int i = 0; i < p->n_groups; i++) {
        const sj_group *G = &p->groups[i];
        if (G->epilogue < 0) continue;
        n++;
        assert_int_equal(G->kind, SJ_G_NODE);
        assert_int_equal(G->epilogue, i + 1);
        assert_int_equal(p->groups[i + 1].kind, SJ_G_POINTWISE);
        assert_int_equal(p->groups[i + 1].epilogue_of, i);
    }
    return n;
}

/* Run the plan at ins (eager; fused with the epilogue inside the product
 * and as its own pass, inline and threaded) and compare. */
static void epi_compare(const sj_graph *g, const sj_fplan *p, void *const *fns, const sj_tensor *ins,
                        const int64_t *sv, tu_ref_fn ref, const char *what) {
    sj_tensor eo[16], et[16], fo[16], so[16];
    sj_exec x;
    tu_pattern_eager(rt, &arena_pool, g, ins, sv, what, &x, eo, fo);
    for (int i = 0; i < g->n_outputs; i++) {
        so[i] = tu_tensor(eo[i].dtype, eo[i].rank, eo[i].shape);
        et[i] = tu_tensor(eo[i].dtype, eo[i].rank, eo[i].shape);
    }
    /* eager on the threads too: a product split over them may round
     * differently (sgemm's blocks), and the epilogue's cancellations show it */
    x.outputs = et;
    x.ops_ctx = pool4;
    assert_int_equal(sj_exec_eager(&x), SJ_OK);
    for (int pass = 0; pass < 4; pass++) {
        bool inside = !(pass & 1); /* inside, then apart, inline then threaded */
        sj_tensor *o = inside ? fo : so;
        rt->cfg.fuse_epilogue = inside;
        for (int i = 0; i < g->n_outputs; i++) tu_poison(&o[i]);
        x.outputs = o;
        x.ops_ctx = pass >= 2 ? pool4 : NULL;
        uint64_t before = sj_cpu_fused_epilogues();
        sj_status st = sj_exec_fused(&x, p, fns);
        if (st) fprintf(stderr, "%s: fused: %s\n", what, sj_last_error());
        assert_int_equal(st, SJ_OK);
        /* every product with an epilogue took it inside, or none did */
        assert_int_equal(sj_cpu_fused_epilogues() - before, inside ? (uint64_t)n_epilogues(p) : 0);
        for (int i = 0; i < g->n_outputs; i++) {
            const char *lb = tu_label("%s out%d%s%s", what, i, pass >= 2 ? " threads" : "", inside ? "" : " apart");
            if (!tu_check_like_eager(&o[i], pass >= 2 ? &et[i] : &eo[i], lb)) fail_msg("%s", lb);
            if (!inside) /* the same arithmetic on the same values as inside, same threads */
                assert_memory_equal(so[i].data, fo[i].data, (size_t)tu_numel(&fo[i]) * sj_dtype_size(fo[i].dtype));
        }
    }
    rt->cfg.fuse_epilogue = 1;
    if (ref) {
        double *r = tu_refbuf(1, tu_numel(&fo[0]));
        ref(ins, r);
        if (!tu_check(&fo[0], r, 1e-4, tu_label("%s ref", what))) fail_msg("%s: differs from float64", what);
    }
}

/* Trace pt at M = d0 (static or symbolic), pack its weights or not, fuse,
 * compile; run at d0 and, symbolic, at other M. */
static void run_epi(const tu_pattern *pt, bool symbolic, bool pack, int64_t d0, int want) {
    sj_tensor tin[8];
    pt->make(&d0, SJ_F32, tin);
    tu_pol pl = {.sym = symbolic, .fixed = pt->fixed};
    sj_graph *g;
    int64_t sv[64] = {0};
    sj_fplan *p = tu_pattern_plan(pt, tin, &pl, &g, sv);
    sj_cpu_pack_cache *cache = NULL;
    if (pack) {
        cache = sj_cpu_pack_cache_create();
        assert_true(sj_exec_prepack(g, cache, UINT64_C(1) << 26) > 0);
    }
    assert_int_equal(n_epilogues(p), want);
    char what[128];
    snprintf(what, sizeof what, "%s M=%lld %s%s", pt->name, (long long)d0, symbolic ? "sym" : "static",
             pack ? " packed" : "");
    int form = symbolic ? 1 : 0;
    build_c(g, p, symbolic ? NULL : sv, form, what);
    epi_compare(g, p, units[form].fns, tin, sv, pt->ref, what);
    for (int r = 0; symbolic && r < 3; r++) {
        int64_t e = r == 0 ? 333 : tu_randint(2, 333), sv2[64] = {0};
        sj_tensor in2[8];
        pt->make(&e, SJ_F32, in2);
        if (!tu_same_signature(&pl, tin, in2, pt->n_in)) continue;
        for (int s = 0; s < pl.n; s++) sv2[s] = in2[pl.in[s]].shape[pl.ax[s]];
        snprintf(what, sizeof what, "%s M=%lld sym at %lld%s", pt->name, (long long)d0, (long long)e,
                 pack ? " packed" : "");
        epi_compare(g, p, units[form].fns, in2, sv2, pt->ref, what);
    }
    unit_free(&units[form]);
    sj_fplan_free(p);
    sj_graph_destroy(g);
    sj_cpu_pack_cache_destroy(cache);
}

static void test_epilogue(void **state) {
    tu_params[3] = small_param(SJ_F32, 2, S(EK, EN), 0.1);
    tu_params[4] = small_param(SJ_F32, 1, S(EN), 1);
    static const int64_t ms[] = {1, 7, 64, 333};
    for (int i = 0; i < 4; i++) {
        for (int pack = 0; pack < 2; pack++) {
            run_epi(&P_EPI_RELU, false, pack, ms[i], 1);
            run_epi(&P_EPI_GELU, false, pack, ms[i], 1);
        }
        run_epi(&P_EPI_ACT, false, false, ms[i], 1);
    }
    for (int pack = 0; pack < 2; pack++) {
        run_epi(&P_EPI_RELU, true, pack, tu_randint(2, 333), 1);
        run_epi(&P_EPI_GELU, true, pack, tu_randint(3, 170), 1);
    }
    run_epi(&P_EPI_ACT, true, false, tu_randint(2, 333), 1);
    tu_params[5] = small_param(SJ_F32, 2, S(EN, EN), 0.1);
    run_epi(&P_EPI_ARENA, false, false, 333, 1);
    run_epi(&P_EPI_ARENA, true, false, tu_randint(2, 333), 1);
    /* an epilogue reading a view of the product is none */
    run_epi(&P_EPI_VIEW, false, true, EN, 0);
}

/* -- Plan-level tests ----------------------------------------------------------- */

/* Trace pt once (symbolic) at dims d and fuse. */
static sj_fplan *plan_of(const tu_pattern *pt, const int64_t *d, sj_graph **g) {
    sj_tensor in[16];
    pt->make(d, SJ_F32, in);
    tu_pol pl = {.sym = true, .fixed = pt->fixed};
    return tu_pattern_plan(pt, in, &pl, g, NULL);
}

static void count_kinds(const sj_fplan *p, int *k) {
    k[0] = k[1] = k[2] = 0;
    for (int i = 0; i < p->n_groups; i++) k[p->groups[i].kind]++;
}

/* pt fuses into one group of this kind, loads and stores. */
static void expect_one(const tu_pattern *pt, const int64_t *d, sj_group_kind kind, int loads, int stores) {
    sj_graph *g;
    sj_fplan *p = plan_of(pt, d, &g);
    sj_fplan_print(g, p, NULL, stdout, "  ");
    assert_int_equal(p->n_groups, 1);
    assert_int_equal(p->groups[0].kind, kind);
    assert_int_equal(p->groups[0].n_loads, loads);
    assert_int_equal(p->groups[0].n_stores, stores);
    for (int i = 0; i < g->n_outputs; i++) assert_false(p->output_copy[i]);
    sj_fplan_free(p);
    sj_graph_destroy(g);
}

static void test_plan_benchmarks(void **state) {
    sj_graph *g;
    sj_fplan *p;
    int k[3];
    expect_one(&tu_pat_w1, S(9, 4096), SJ_G_POINTWISE, 3, 1);
    expect_one(&tu_pat_w2, S(9, 768), SJ_G_ROW, 4, 2);
    expect_one(&tu_pat_w3, S(12, 9), SJ_G_ROW, 2, 1);

    /* the encoder layer (hidden size constant): matmul x4 (each with its
     * bias add) and attention are NODE groups; gelu pointwise; both
     * residual + layer norms ROW. Attention writes its result in the
     * head-merged order, so the reshape after it is a view, not a copy. */
    enc_init(768, 12, 3072);
    p = plan_of(&P_ENCODER, S(9), &g);
    count_kinds(p, k);
    sj_fplan_print(g, p, NULL, stdout, "  ");
    assert_int_equal(k[SJ_G_NODE], 5);
    assert_int_equal(k[SJ_G_POINTWISE], 1);
    assert_int_equal(k[SJ_G_ROW], 2);
    /* every bias add is its product's epilogue; no product reaches memory */
    int biased = 0;
    for (int i = 0; i < p->n_groups; i++) {
        const sj_group *G = &p->groups[i];
        if (G->kind != SJ_G_NODE || g->nodes[G->nodes[0]].op != SJ_OP_MATMUL) continue;
        assert_int_equal(G->n_nodes, 2);
        assert_int_equal(g->vals[G->bias].kind, SJ_VAL_PARAM);
        assert_int_equal(p->layouts[g->nodes[G->nodes[0]].out].store, -1);
        biased++;
    }
    assert_int_equal(biased, 4);
    for (int i = 0; i < p->n_groups; i++) {
        const sj_node *n = &g->nodes[p->groups[i].nodes[0]];
        if (n->op != SJ_OP_ATTENTION) continue;
        const sj_layout *l = &p->layouts[n->out]; /* [B, NH, S, HD] strides (S NH HD, HD, NH HD, 1) */
        const int64_t want[4] = {9 * 768, 64, 768, 1};
        for (int a = 0; a < 4; a++) assert_int_equal(sj_ex_hint(g->ex, l->stride[a]), want[a]);
    }
    assert_true(sj_ex_hint(g->ex, p->arena_bytes) < sj_ex_hint(g->ex, p->naive_bytes));
    sj_fplan_free(p);
    sj_graph_destroy(g);

    /* the cycle: a's group cannot take a + m (nor merge with the group of
     * sigmoid(m)), which run after the matmul */
    tu_params[2] = small_param(SJ_F32, 2, S(16, 16), 0.3);
    p = plan_of(&P_CYCLE, S(9), &g);
    count_kinds(p, k);
    sj_fplan_print(g, p, NULL, stdout, "  ");
    assert_int_equal(k[SJ_G_NODE], 1);
    assert_int_equal(k[SJ_G_POINTWISE], 3);
    assert_int_equal(p->groups[0].kind, SJ_G_POINTWISE); /* mul exp (neg) */
    assert_int_equal(p->groups[1].kind, SJ_G_NODE);
    for (int i = 0; i < p->groups[0].n_nodes; i++)
        assert_int_not_equal(g->nodes[p->groups[0].nodes[i]].op, SJ_OP_ADD);
    sj_fplan_free(p);
    sj_graph_destroy(g);
}

/* Which bias adds become a product's epilogue (tu_pat_mmbias), in the
 * graph's marks and in the plan: out0's and the batched out1's; not out2's
 * (the product is read twice) nor out5's (the product is an output). */
static void test_plan_bias(void **state) {
    sj_graph *g;
    tu_params[0] = small_param(SJ_F32, 2, S(24, 40), 0.3);
    tu_params[1] = small_param(SJ_F32, 1, S(40), 1);
    sj_fplan *p = plan_of(&tu_pat_mmbias, S(9), &g);
    sj_fplan_print(g, p, NULL, stdout, "  ");
    int with = 0, without = 0;
    for (int i = 0; i < p->n_groups; i++) {
        const sj_group *G = &p->groups[i];
        if (G->kind != SJ_G_NODE) {
            assert_int_equal(G->bias, -1);
            continue;
        }
        int32_t out = sj_group_out(g, G);
        if (G->n_nodes == 2) {
            with++;
            assert_int_equal(g->nodes[G->nodes[1]].op, SJ_OP_ADD);
            /* the group writes out0 or out1 itself */
            assert_true(out == g->outputs[0] || out == g->outputs[1]);
            assert_true(G->bias >= 0 && g->vals[G->bias].kind != SJ_VAL_NODE);
        } else {
            without++;
            assert_int_equal(G->bias, -1);
        }
    }
    assert_int_equal(with, 2);
    assert_int_equal(without, 2);
    /* the graph's marks, which eager execution follows: the same two */
    int marked = 0, folded = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        const sj_node *n = &g->nodes[i];
        if (n->fold >= 0) {
            marked++;
            assert_int_equal(n->op, SJ_OP_MATMUL);
            assert_int_equal(g->nodes[n->fold].fold, SJ_FOLDED);
            int32_t out = g->nodes[n->fold].out;
            assert_true(out == g->outputs[0] || out == g->outputs[1]);
        }
        folded += n->fold == SJ_FOLDED;
    }
    assert_int_equal(marked, 2);
    assert_int_equal(folded, 2);
    sj_fplan_free(p);
    sj_graph_destroy(g);
}

/* a chain of NODE softmaxes: four buffers, two live at a time */
static sj_status m_chain(sj_tracer *t, const sj_val *in, int n, void *u) {
    sj_val x = in[0];
    for (int i = 0; i < 5; i++) x = sj_softmax(t, x, 0);
    return sj_output(t, x);
}

/* values of many symbolic sizes, with NODE groups between them */
static sj_status m_mixed(sj_tracer *t, const sj_val *in, int n, void *u) {
    sj_val a = in[0], b = in[1], c = in[2]; /* [A, B], [B, C], [A, C] */
    sj_val e = sj_exp(t, a), sb = sj_softmax(t, b, 0);
    sj_val m = sj_matmul(t, e, sb);
    sj_val r = sj_sum(t, sj_softmax(t, sj_add(t, m, c), 0), -1, 1);
    sj_val q = sj_matmul(t, sj_transpose(t, sj_softmax(t, e, 0), 0, 1), sj_softmax(t, sj_mul(t, c, r), 0));
    sj_output(t, sj_softmax(t, q, 0));
    return sj_output(t, sj_softmax(t, sj_transpose(t, e, 0, 1), 0));
}
static void mk_mixed(const int64_t *d, sj_dtype dt, sj_tensor *in) {
    in[0] = rnd(dt, 2, S(d[0], d[1]));
    in[1] = rnd(dt, 2, S(d[1], d[2]));
    in[2] = rnd(dt, 2, S(d[0], d[2]));
}
static const tu_pattern P_CHAIN = {"chain", m_chain, 1, tu_mk_2d, 2, {2, 3}, {30, 90}, true, NULL, {0}};
static const tu_pattern P_MIXED = {"mixed", m_mixed, 3, mk_mixed, 3, {2, 20, 40}, {9, 30, 60}, true, NULL, {0}};

static void test_plan_arena(void **state) {
    sj_graph *g;
    sj_fplan *p = plan_of(&P_CHAIN, S(7, 19), &g);
    int n_arena = 0;
    for (int s = 0; s < p->n_stores; s++) n_arena += p->stores[s].kind == SJ_ST_ARENA;
    assert_int_equal(n_arena, 4);
    int64_t buf = ((7 * 19 * 4 + 63) / 64) * 64;
    assert_int_equal(sj_ex_hint(g->ex, p->naive_bytes), 4 * buf);
    assert_int_equal(sj_ex_hint(g->ex, p->arena_bytes), 2 * buf);
    sj_fplan_print(g, p, NULL, stdout, "  ");
    sj_fplan_free(p);
    sj_graph_destroy(g);
    run_both(&P_CHAIN, SJ_F32);
    run_both(&P_MIXED, SJ_F32);
}

/* Lifetimes from the plan itself: a store is live from the first group
 * that touches it to the last (output copies: past the end). */
static void lifetimes(const sj_graph *g, const sj_fplan *p, int *first, int *last) {
    for (int s = 0; s < p->n_stores; s++) first[s] = INT32_MAX, last[s] = -1;
    for (int k = 0; k < p->n_groups; k++) {
        const sj_group *G = &p->groups[k];
        int32_t vals[64];
        int nv = 0;
        if (G->kind == SJ_G_NODE) {
            const sj_node *n = &g->nodes[G->nodes[0]];
            for (int a = 0; a < n->n_in; a++)
                if (sj_node_ins(g, n)[a] >= 0) vals[nv++] = sj_node_ins(g, n)[a];
            if (G->bias >= 0) vals[nv++] = G->bias;
            vals[nv++] = sj_group_out(g, G);
        } else {
            for (int i = 0; i < G->n_loads; i++) vals[nv++] = G->loads[i].val;
            for (int i = 0; i < G->n_stores; i++) vals[nv++] = G->stores[i].val;
        }
        for (int i = 0; i < nv; i++) {
            int s = p->layouts[vals[i]].store;
            if (s < 0) continue;
            if (k < first[s]) first[s] = k;
            if (k > last[s]) last[s] = k;
        }
    }
    for (int i = 0; i < g->n_outputs; i++) {
        int s = p->layouts[g->outputs[i]].store;
        if (p->output_copy[i] && s >= 0) last[s] = p->n_groups;
    }
}

static void test_plan_overlap(void **state) {
    const tu_pattern *pts[] = {&P_MIXED, &P_ENCODER, &tu_pat_shared, &P_CHAIN, &tu_pat_reduce};
    enc_init(EH, ENH, EFF);
    for (size_t t = 0; t < sizeof pts / sizeof pts[0]; t++) {
        sj_graph *g;
        int64_t d[TU_MAXD];
        tu_random_dims(pts[t], d);
        sj_fplan *p = plan_of(pts[t], d, &g);
        int first[512], last[512], ns = sj_sym_count(g->ex);
        assert_true(p->n_stores <= 512);
        lifetimes(g, p, first, last);
        for (int trial = 0; trial < 200; trial++) {
            int64_t sv[64];
            for (int s = 0; s < ns; s++) sv[s] = tu_randint(2, trial < 100 ? 50 : 5000);
            for (int a = 0; a < p->n_stores; a++) {
                const sj_store *A = &p->stores[a];
                if (A->kind != SJ_ST_ARENA) continue;
                int64_t ao = sj_ex_eval(g->ex, A->offset, sv), ab = sj_ex_eval(g->ex, A->bytes, sv);
                assert_true(ao % 64 == 0 && ab % 64 == 0 && ab > 0);
                assert_true(ao + ab <= sj_ex_eval(g->ex, p->arena_bytes, sv));
                for (int b = a + 1; b < p->n_stores; b++) {
                    const sj_store *B = &p->stores[b];
                    if (B->kind != SJ_ST_ARENA || last[a] < first[b] || last[b] < first[a]) continue;
                    int64_t bo = sj_ex_eval(g->ex, B->offset, sv), bb = sj_ex_eval(g->ex, B->bytes, sv);
                    if (!(ao + ab <= bo || bo + bb <= ao))
                        fail_msg("%s: stores %d and %d overlap in time and memory", pts[t]->name, a, b);
                }
            }
        }
        sj_fplan_free(p);
        sj_graph_destroy(g);
    }
}

/* a pointwise chain over 100 parameters: groups stop growing at the
 * executor's access limit */
static sj_tensor chain_w[100];
static sj_status m_long_chain(sj_tracer *t, const sj_val *in, int n, void *u) {
    sj_val x = in[0];
    for (int i = 0; i < 100; i++) x = sj_add(t, sj_mul(t, x, sj_scalar(t, 0.5)), sj_param(t, &chain_w[i]));
    return sj_output(t, x);
}
static void mk_long_chain(const int64_t *d, sj_dtype dt, sj_tensor *in) { in[0] = rnd(dt, 2, S(d[0], 40)); }
static const tu_pattern P_LONG_CHAIN = {"long chain", m_long_chain, 1, mk_long_chain, 1, {2}, {30}, true, NULL, {40}};

static void test_long_chain(void **state) {
    for (int i = 0; i < 100; i++) chain_w[i] = rnd(SJ_F32, 1, S(40));
    sj_graph *g;
    sj_fplan *p = plan_of(&P_LONG_CHAIN, S(7), &g);
    assert_true(p->n_groups > 1);
    for (int k = 0; k < p->n_groups; k++)
        assert_true(p->groups[k].n_loads + p->groups[k].n_stores <= 2 * SJ_MAX_INPUTS + 64);
    sj_fplan_free(p);
    sj_graph_destroy(g);
    run_both(&P_LONG_CHAIN, SJ_F32);
}

/* allocation failures anywhere in planning give NULL, never a crash or a
 * leak (the sanitizer build checks the leaks) */
static void test_fuse_oom(void **state) {
    enc_init(EH, ENH, EFF);
    sj_tensor in[1];
    mk_encoder(S(9), SJ_F32, in);
    tu_pol pl = {.sym = true, .fixed = P_ENCODER.fixed};
    sj_trace_req req = {.fn_name = "enc", .model = m_encoder, .inputs = in, .n_inputs = 1, .dim_policy = tu_policy,
                        .dim_ctx = &pl};
    sj_trace_result res;
    assert_int_equal(sj_trace(&req, &res), SJ_OK);
    free(res.facts);
    int failed = 0;
    for (long n = 0; n < 400; n += 3) {
        sj_ex_fail_allocs_after(n);
        sj_fplan *p = sj_fuse(res.graph, in);
        sj_ex_fail_allocs_after(-1);
        failed += !p;
        sj_fplan_free(p);
    }
    assert_true(failed > 0);
    sj_fplan *p = sj_fuse(res.graph, in);
    assert_non_null(p);
    sj_fplan_free(p);
    sj_graph_destroy(res.graph);
}

/* w2 at 9x768, generated specialized with so and symbolic with yo. */
static void w2_sources(const sj_codegen_opts *so, const sj_codegen_opts *yo, char **spec, char **sym, sj_fplan **p,
                       sj_graph **g) {
    *p = plan_of(&tu_pat_w2, S(9, 768), g);
    *spec = sj_codegen_c(*g, *p, S(9, 768), so, NULL);
    *sym = sj_codegen_c(*g, *p, NULL, yo, NULL);
    assert_non_null(*spec);
    assert_non_null(*sym);
}

/* the generated source: both forms are plain C over the runtime header */
static void test_codegen_text(void **state) {
    sj_graph *g;
    sj_fplan *p;
    char *spec, *sym;
    const sj_codegen_opts o = {.prefix = "w2_"};
    w2_sources(&o, &o, &spec, &sym, &p, &g);
    assert_non_null(strstr(spec, "void w2_k0(void *const *p, const int64_t *s, int64_t begin, int64_t end)"));
    assert_non_null(strstr(spec, "sj_rt_geluf"));
    assert_non_null(strstr(sym, "const int64_t s0 = s[0], s1 = s[1];"));
    assert_null(strstr(spec, "s[0]"));
    /* nt from the sizes (a 9x768 w2 stays under the cache size: the
     * compiler drops the streaming variant) */
    assert_non_null(strstr(spec, "const int nt = SJ_RT_HAVE_STREAM && 16.0 * (double)n0 * (double)n1 > "));
    assert_non_null(strstr(spec, "if (nt) {"));
    /* the norm's output pass prefetches the next row of x and r (not of g
     * and b, the same for every row) */
    assert_non_null(strstr(spec, "__builtin_prefetch(P0 + st0_0 + c0 + q)"));
    assert_non_null(strstr(spec, "__builtin_prefetch(P1 + st1_0 + c0 + q)"));
    assert_null(strstr(spec, "__builtin_prefetch(P2"));
    tu_codegen_done(spec, sym, p, g);
    /* streaming forced: the chunks go out through sj_rt_stream_f32, then a
     * fence; never: the plain loops */
    const sj_codegen_opts all = {.prefix = "w2_", .stream_min_bytes = 1}, never = {.prefix = "w2_", .stream_min_bytes = -1};
    w2_sources(&all, &never, &spec, &sym, &p, &g);
    assert_non_null(strstr(spec, " > 1;\n"));
    assert_non_null(strstr(spec, "sj_rt_stream_f32(P"));
    assert_non_null(strstr(spec, "SB5[jj] = v"));
    assert_non_null(strstr(spec, "if (nt) sj_rt_sfence();"));
    assert_null(strstr(sym, "const int nt"));
    assert_null(strstr(sym, "sj_rt_stream_f32(P"));
    tu_codegen_done(spec, sym, p, g);
    /* the default: a quarter of the last-level cache (32 MiB when unknown) */
    const sj_codegen_opts dflt = {.prefix = "w2_"};
    w2_sources(&dflt, &never, &spec, &sym, &p, &g);
    long llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
    if (llc <= 0) llc = sysconf(_SC_LEVEL2_CACHE_SIZE);
    char want[64];
    snprintf(want, sizeof want, " > %.17g;\n", (llc > 0 ? (double)llc : 32.0 * 1024 * 1024) / 4);
    assert_non_null(strstr(spec, want));
    tu_codegen_done(spec, sym, p, g);
}

int main(void) {
#define T(f) cmocka_unit_test_teardown(f, tu_teardown)
    const struct CMUnitTest tests[] = {
        T(test_plan_benchmarks), T(test_plan_bias), T(test_plan_arena), T(test_plan_overlap), T(test_long_chain), T(test_fuse_oom),
        T(test_codegen_text),
        T(test_w1), T(test_w2), T(test_w3), T(test_matmul_gelu), T(test_matmul_bias), T(test_views), T(test_softmax_axis0),
        T(test_reduce), T(test_rows), T(test_casts_where), T(test_ints), T(test_half), T(test_half_bits), T(test_shared_value),
        T(test_outputs), T(test_empty), T(test_launch_desc), T(test_cycle), T(test_encoder), T(test_epilogue),
        cmocka_unit_test_setup_teardown(test_streamed, stream_all, stream_default),
    };
    const char *only = getenv("SJ_TEST_FILTER");
    if (only) cmocka_set_test_filter(only); /* e.g. "test_epilogue" */
    return cmocka_run_group_tests(tests, setup_all, teardown_all);
}
