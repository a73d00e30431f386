/* Fusion and C code generation through the real pipeline: model functions
 * are traced (every size >= 2 symbolic, or every size constant), fused,
 * generated in both forms, compiled by the CPU backend, run by the fused
 * executor (inline and on a thread pool) and compared with eager execution
 * of the same graph on the same inputs (outputs poisoned first), on random
 * shapes; a few patterns against float64 references too. Plan-level tests
 * check group structure, loads and stores, and the arena plan.
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

#include "jit/exec.h"
#include "jit/runtime.h"
#include "jit/threads.h"
#include "jit/trace.h"
#include "kernels/cpu/backend_cpu.h"
#include "specialize/codegen.h"
#include "specialize/fusion.h"
#include "tests/util.h"

#define S(...) ((const int64_t[]){__VA_ARGS__})
#define MAXD 4

/* -- Environment ---------------------------------------------------------- */

static sj_runtime *rt;
static sj_backend *be;
static sj_threads *pool4;
static sj_pool arena_pool;

static int setup_all(void **state) {
    const char *seed = getenv("SJ_TEST_SEED");
    tu_seed(seed ? strtoull(seed, NULL, 0) : 0x5eed);
    if (sj_runtime_create(NULL, &rt)) return -1;
    /* the kernels' compiler and flags, e.g. to sanitize them */
    sj_cpu_backend_config bc = {.cc = getenv("SJ_TEST_KCC"), .cflags = getenv("SJ_TEST_KCFLAGS")};
    if (sj_cpu_backend_create(&bc, &be)) return -1;
    pool4 = sj_threads_create(4);
    sj_pool_init(&arena_pool, rt);
    return 0;
}

static int teardown_all(void **state) {
    sj_pool_destroy(&arena_pool);
    sj_threads_destroy(pool4);
    if (be) be->destroy(be);
    sj_runtime_destroy(rt);
    return 0;
}

static int teardown(void **state) {
    tu_free_all();
    return 0;
}

/* -- Dim policy: equal sizes share a symbol -------------------------------- */

typedef struct pol {
    bool sym;
    const int64_t *fixed; /* sizes kept constant (0 ends), e.g. a hidden
                             size that parameters fix anyway */
    int n;
    int64_t size[64];
    int sym_of[64];
    int in[64], ax[64]; /* where each symbol was first seen */
} pol;

static sj_expr policy(void *ctx, sj_exprs *ex, int input, int axis, int64_t size) {
    pol *p = ctx;
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

/* -- Patterns -------------------------------------------------------------- */

typedef void (*make_fn)(const int64_t *d, sj_dtype dt, sj_tensor *ins);
typedef void (*ref_fn)(const sj_tensor *ins, double *out);

typedef struct pattern {
    const char *name;
    sj_model_fn model;
    int n_in;
    make_fn make;
    int n_dims;
    int64_t lo[MAXD], hi[MAXD];
    bool vary;      /* the symbolic plan may run at other sizes */
    ref_fn ref;     /* float64 reference of output 0, or NULL */
    int64_t fixed[4]; /* sizes the policy keeps constant */
} pattern;

static sj_dtype g_dt = SJ_F32; /* dtype the float patterns use */
static sj_tensor params[8];    /* parameters the models capture */

static sj_tensor rnd(sj_dtype dt, int rank, const int64_t *shape) {
    sj_tensor t = tu_tensor(dt, rank, shape);
    tu_fill_random(&t);
    return t;
}

/* -- Harness ---------------------------------------------------------------- */

typedef struct unit {
    void *fns[256];
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
    for (int i = 0; i < n; i++) u->fns[gi_of[i]] = res->fns[i];
    free(res);
}

static void unit_free(unit *u) {
    if (u->mod) be->unload(be, u->mod);
}

static double tol_of(sj_dtype dt) {
    return dt == SJ_F32 ? 1e-5 : dt == SJ_F16 ? 1e-2 : dt == SJ_BF16 ? 6e-2 : 0.0;
}

/* Run g eagerly and through the plan (inline and threaded) on ins; compare
 * every output, and output 0 with the float64 reference when given. */
static void run_and_compare(const sj_graph *g, const sj_fplan *p, void *const *fns, const sj_tensor *ins,
                            const int64_t *sv, ref_fn ref, const char *what) {
    sj_tensor eo[16], fo[16];
    assert_true(g->n_outputs <= 16);
    for (int i = 0; i < g->n_outputs; i++) {
        const sj_value *v = &g->vals[g->outputs[i]];
        int64_t shape[SJ_MAX_RANK];
        for (int a = 0; a < v->rank; a++) shape[a] = sj_ex_eval(g->ex, v->shape[a], sv);
        eo[i] = tu_tensor(v->dtype, v->rank, shape);
        fo[i] = tu_tensor(v->dtype, v->rank, shape);
    }
    _Atomic size_t hint = 0;
    if (getenv("SJ_TEST_VERBOSE")) fprintf(stderr, "  run %s\n", what);
    sj_exec x = {.rt = rt, .g = g, .fn_name = what, .inputs = ins, .outputs = eo, .sym_vals = sv,
                 .pool = &arena_pool, .arena_hint = &hint, .ops = &sj_cpu_exec_ops};
    sj_status st = sj_exec_eager(&x);
    if (st) fprintf(stderr, "%s: eager: %s\n", what, sj_last_error());
    assert_int_equal(st, SJ_OK);
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < g->n_outputs; i++) tu_poison(&fo[i]);
        x.outputs = fo;
        x.ops_ctx = pass ? pool4 : NULL;
        st = sj_exec_fused(&x, p, fns);
        if (st) fprintf(stderr, "%s: fused: %s\n", what, sj_last_error());
        assert_int_equal(st, SJ_OK);
        for (int i = 0; i < g->n_outputs; i++) {
            int64_t n = tu_numel(&eo[i]);
            double *r = tu_refbuf(0, n > 0 ? n : 1);
            for (int64_t k = 0; k < n; k++) r[k] = tu_get(&eo[i], k);
            /* halves: eager rounds every intermediate, fused code only its
             * results, so errors scale with the output, not each element */
            double *mag = NULL, ss = 0;
            if (fo[i].dtype == SJ_F16 || fo[i].dtype == SJ_BF16) {
                mag = tu_refbuf(1, n > 0 ? n : 1);
                for (int64_t k = 0; k < n; k++) ss += isfinite(r[k]) ? r[k] * r[k] : 0;
                for (int64_t k = 0; k < n; k++) mag[k] = fabs(r[k]) + sqrt(ss / (double)n);
            }
            const char *lb = tu_label("%s out%d%s", what, i, pass ? " threads" : "");
            if (!tu_check_mag(&fo[i], r, mag, tol_of(fo[i].dtype), lb))
                fail_msg("%s: output %d differs from eager", what, i);
        }
    }
    if (ref) {
        double *r = tu_refbuf(1, tu_numel(&fo[0]));
        ref(ins, r);
        if (!tu_check(&fo[0], r, fo[0].dtype == SJ_F32 ? 2e-5 : tol_of(fo[0].dtype), tu_label("%s ref", what)))
            fail_msg("%s: output 0 differs from the float64 reference", what);
    }
}

/* Are the input sizes of `ins` consistent with the trace's symbols? */
static bool same_signature(const pol *pl, const sj_tensor *a, const sj_tensor *b, int n) {
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

static void random_dims(const pattern *pt, int64_t *d) {
    for (int k = 0; k < pt->n_dims; k++) d[k] = tu_randint(pt->lo[k], pt->hi[k]);
}

/* Trace pt at random sizes (static or symbolic), fuse, generate, compile;
 * run at the traced sizes and, symbolic, at other random sizes. */
static void run_pattern(const pattern *pt, bool symbolic, sj_dtype dt, const int64_t *force) {
    g_dt = dt;
    int64_t d[MAXD];
    sj_tensor tin[16], rin[16];
    random_dims(pt, d);
    if (force) memcpy(d, force, sizeof(int64_t) * (size_t)pt->n_dims);
    pt->make(d, dt, tin);
    pol pl = {.sym = symbolic, .fixed = pt->fixed};
    sj_trace_req req = {.fn_name = pt->name, .model = pt->model, .inputs = tin, .n_inputs = pt->n_in,
                        .dim_policy = policy, .dim_ctx = &pl};
    sj_trace_result res;
    sj_status st = sj_trace(&req, &res);
    if (st) fprintf(stderr, "%s: %s\n", pt->name, sj_last_error());
    assert_int_equal(st, SJ_OK);
    sj_graph *g = res.graph;
    sj_fplan *p = sj_fuse(g, tin);
    assert_non_null(p);
    int64_t sv[64] = {0};
    for (int s = 0; s < pl.n; s++) sv[s] = tin[pl.in[s]].shape[pl.ax[s]];
    /* specialized at the traced sizes */
    size_t len;
    char *src = sj_codegen_c(g, p, sv, "spec_", &len);
    assert_non_null(src);
    unit us, uy = {0};
    compile(p, src, len, "spec_", &us);
    free(src);
    char what[96];
    snprintf(what, sizeof what, "%s %s %s spec", pt->name, sj_dtype_name(dt), symbolic ? "sym" : "static");
    run_and_compare(g, p, us.fns, tin, sv, pt->ref, what);
    if (symbolic) {
        src = sj_codegen_c(g, p, NULL, "sym_", &len);
        assert_non_null(src);
        compile(p, src, len, "sym_", &uy);
        free(src);
        snprintf(what, sizeof what, "%s %s sym", pt->name, sj_dtype_name(dt));
        run_and_compare(g, p, uy.fns, tin, sv, pt->ref, what);
        for (int r = 0; r < (pt->vary && !force ? 3 : 0); r++) {
            int64_t e[MAXD];
            int tries = 0;
            do {
                random_dims(pt, e);
                if (r == 0) e[0] = 2; /* a size-2 edge */
                pt->make(e, dt, rin);
            } while (!same_signature(&pl, tin, rin, pt->n_in) && ++tries < 100);
            if (tries == 100) {
                fprintf(stderr, "%s: no sizes with the traced signature; run %d skipped\n", pt->name, r);
                continue;
            }
            for (int s = 0; s < pl.n; s++) sv[s] = rin[pl.in[s]].shape[pl.ax[s]];
            snprintf(what, sizeof what, "%s %s sym (run %d: %lld)", pt->name, sj_dtype_name(dt), r, (long long)e[0]);
            run_and_compare(g, p, uy.fns, rin, sv, pt->ref, what);
        }
    }
    unit_free(&us);
    unit_free(&uy);
    sj_fplan_free(p);
    sj_graph_destroy(g);
    free(res.facts);
}

static void run_both(const pattern *pt, sj_dtype dt) {
    run_pattern(pt, false, dt, NULL);
    run_pattern(pt, true, dt, NULL);
}

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

/* bias + gelu after a matmul (W [24, 40], bias [40] parameters) */
static sj_status m_mmgelu(sj_tracer *t, const sj_val *in, int n, void *u) {
    sj_val m = sj_matmul(t, in[0], sj_param(t, &params[0]));
    return sj_output(t, sj_gelu(t, sj_add(t, m, sj_param(t, &params[1]))));
}
static void mk_mmgelu(const int64_t *d, sj_dtype dt, sj_tensor *in) { in[0] = rnd(dt, 2, S(d[0], 24)); }

/* a pointwise chain over a transposed input and a slice with a symbolic
 * end; x [A, B], z [B, A + 4] */
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

/* softmax over a non-last axis: a NODE group between pointwise ones */
static sj_status m_softmax0(sj_tracer *t, const sj_val *in, int n, void *u) {
    sj_val s = sj_softmax(t, sj_mul(t, in[0], sj_scalar(t, 2.0)), 0);
    return sj_output(t, sj_add(t, s, sj_scalar(t, 1.0)));
}
static void mk_2d(const int64_t *d, sj_dtype dt, sj_tensor *in) { in[0] = rnd(dt, 2, S(d[0], d[1])); }

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

/* RMS norm with and without g; softmax, layer norm and mean; rows of
 * 9061 .. 9090 (long: past the stack buffer) or 7 .. 60 */
static sj_status m_rows(sj_tracer *t, const sj_val *in, int n, void *u) {
    sj_val x = in[0];
    sj_output(t, sj_rms_norm(t, sj_mul(t, x, sj_scalar(t, 2.0)), in[1], 1e-6));
    sj_output(t, sj_add(t, sj_rms_norm(t, x, SJ_NONE, 1e-5), sj_scalar(t, 1.0)));
    sj_val x3 = sj_mul(t, x, sj_scalar(t, 3.0)), sm = sj_softmax(t, x3, -1);
    sj_output(t, sm);
    sj_output(t, sj_add(t, sm, x3)); /* the epilogue reads the prologue */
    sj_val x1 = sj_add(t, x, sj_scalar(t, 1.0));
    sj_output(t, sj_mul(t, sj_layer_norm(t, x1, SJ_NONE, in[1], 1e-5), x1));
    return sj_output(t, sj_mean(t, x, -1, 0));
}
static void mk_rows(const int64_t *d, sj_dtype dt, sj_tensor *in) {
    int64_t N = d[1] > 60 ? 9000 + d[1] : d[1];
    in[0] = rnd(dt, 2, S(d[0], N));
    in[1] = rnd(dt, 1, S(N));
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

/* an output that is an input, one listed twice, a view, a constant */
static sj_status m_outs(sj_tracer *t, const sj_val *in, int n, void *u) {
    sj_val y = sj_mul(t, in[0], sj_scalar(t, 2.0));
    sj_output(t, in[0]);
    sj_output(t, y);
    sj_output(t, y);
    sj_output(t, sj_transpose(t, y, 0, 1));
    sj_output(t, sj_scalar(t, 3.0));
    sj_output(t, sj_mul(t, sj_scalar(t, 2.0), sj_scalar(t, 3.0))); /* rank 0, computed */
    sj_dim all[1] = {sj_dim_mul(t, sj_dim_of(t, in[0], 0), sj_dim_of(t, in[0], 1))};
    sj_output(t, sj_add(t, sj_sum(t, sj_reshape(t, in[0], 1, all), -1, 0), sj_scalar(t, 1.0)));
    return sj_output(t, sj_slice(t, in[0], 1, 1, 1000, 1));
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
    sj_val m = sj_matmul(t, a, sj_param(t, &params[2]));
    sj_output(t, sj_add(t, a, m));
    return sj_output(t, sj_mul(t, sj_sigmoid(t, m), sj_neg(t, a)));
}
static void mk_cycle(const int64_t *d, sj_dtype dt, sj_tensor *in) { in[0] = rnd(dt, 2, S(d[0], 16)); }

/* the encoder layer of samples/varlen_encoder (sizes from params[3..]) */
enum { EH = 64, ENH = 4, EHD = 16, EFF = 128 };
typedef struct enc_w {
    sj_tensor wqkv, bqkv, wo, bo, g1, b1, w1, bf1, w2, bf2, g2, b2;
} enc_w;
static enc_w encw;
static int enc_h = EH, enc_nh = ENH, enc_hd = EHD;

static sj_val enc_heads(sj_tracer *t, sj_val qkv, int64_t off) {
    sj_val part = sj_slice(t, qkv, 2, off, off + enc_h, 1);
    sj_dim d[4] = {sj_dim_of(t, qkv, 0), sj_dim_of(t, qkv, 1), sj_dim_const(t, enc_nh), sj_dim_const(t, enc_hd)};
    return sj_permute(t, sj_reshape(t, part, 4, d), (const int[]){0, 2, 1, 3});
}
static sj_val enc_linear(sj_tracer *t, sj_val x, const sj_tensor *w, const sj_tensor *b) {
    return sj_add(t, sj_matmul(t, x, sj_param(t, w)), sj_param(t, b));
}
static sj_status m_encoder(sj_tracer *t, const sj_val *in, int n, void *u) {
    const enc_w *w = &encw;
    sj_val x = in[0];
    sj_val qkv = enc_linear(t, x, &w->wqkv, &w->bqkv);
    sj_val q = enc_heads(t, qkv, 0), k = enc_heads(t, qkv, enc_h), v = enc_heads(t, qkv, 2 * enc_h);
    sj_val a = sj_attention(t, q, k, v, SJ_NONE, 1.0 / sqrt((double)enc_hd), 0);
    sj_dim d[3] = {sj_dim_of(t, x, 0), sj_dim_of(t, x, 1), sj_dim_const(t, enc_h)};
    a = sj_reshape(t, sj_permute(t, a, (const int[]){0, 2, 1, 3}), 3, d);
    sj_val x1 = sj_layer_norm(t, sj_add(t, x, enc_linear(t, a, &w->wo, &w->bo)), sj_param(t, &w->g1),
                              sj_param(t, &w->b1), 1e-5);
    sj_val f = enc_linear(t, sj_gelu(t, enc_linear(t, x1, &w->w1, &w->bf1)), &w->w2, &w->bf2);
    return sj_output(t, sj_layer_norm(t, sj_add(t, x1, f), sj_param(t, &w->g2), sj_param(t, &w->b2), 1e-5));
}
static void mk_encoder(const int64_t *d, sj_dtype dt, sj_tensor *in) { in[0] = rnd(dt, 3, S(1, d[0], enc_h)); }

static sj_tensor small_param(sj_dtype dt, int rank, const int64_t *shape, double scale) {
    sj_tensor t = rnd(dt, rank, shape);
    for (int64_t i = 0; i < tu_numel(&t); i++) tu_set(&t, i, tu_get(&t, i) * scale);
    return t;
}

static pattern P_ENCODER; /* below */

static void enc_init(int h, int nh, int ff) {
    enc_h = h, enc_nh = nh, enc_hd = h / nh;
    P_ENCODER.fixed[0] = h;
    double si = 0.5 / sqrt((double)h), sf = 0.5 / sqrt((double)ff);
    encw.wqkv = small_param(SJ_F32, 2, S(h, 3 * h), si), encw.bqkv = small_param(SJ_F32, 1, S(3 * h), 0.01);
    encw.wo = small_param(SJ_F32, 2, S(h, h), si), encw.bo = small_param(SJ_F32, 1, S(h), 0.01);
    encw.g1 = small_param(SJ_F32, 1, S(h), 1), encw.b1 = small_param(SJ_F32, 1, S(h), 0.01);
    encw.w1 = small_param(SJ_F32, 2, S(h, ff), si), encw.bf1 = small_param(SJ_F32, 1, S(ff), 0.01);
    encw.w2 = small_param(SJ_F32, 2, S(ff, h), sf), encw.bf2 = small_param(SJ_F32, 1, S(h), 0.01);
    encw.g2 = small_param(SJ_F32, 1, S(h), 1), encw.b2 = small_param(SJ_F32, 1, S(h), 0.01);
}

/* -- Pattern table ------------------------------------------------------------ */

static const pattern P_W1 = {"w1", m_w1, 3, mk_w1, 2, {2, 3}, {40, 200}, true, ref_w1, {0}};
static const pattern P_W1_BIG = {"w1 big", m_w1, 3, mk_w1, 2, {33, 4096}, {45, 4096}, true, ref_w1, {0}};
static const pattern P_W2 = {"w2", m_w2, 4, mk_w2, 2, {2, 3}, {200, 300}, true, ref_w2, {0}};
static const pattern P_W3 = {"w3", m_w3, 2, mk_w3, 2, {2, 3}, {14, 70}, true, ref_w3, {0}};
static const pattern P_MMGELU = {"matmul bias gelu", m_mmgelu, 1, mk_mmgelu, 1, {2}, {23}, true, NULL, {24}};
static const pattern P_VIEWS = {"views", m_views, 2, mk_views, 2, {2, 40}, {30, 70}, true, NULL, {0}};
static const pattern P_STRIDED = {"strided", m_strided, 1, mk_strided, 2, {3, 5}, {9, 30}, false, NULL, {0}};
static const pattern P_RESHAPE = {"reshape", m_reshape, 2, mk_reshape, 3, {2, 50, 70}, {45, 60, 90}, true, NULL, {0}};
static const pattern P_SOFTMAX0 = {"softmax axis 0", m_softmax0, 1, mk_2d, 2, {2, 3}, {30, 90}, true, NULL, {0}};
static const pattern P_REDUCE = {"reduce", m_reduce, 4, mk_reduce, 2, {2, 3}, {30, 300}, true, NULL, {0}};
static const pattern P_ROWS = {"rows", m_rows, 2, mk_rows, 2, {2, 7}, {6, 60}, true, NULL, {0}};
static const pattern P_ROWS_LONG = {"long rows", m_rows, 2, mk_rows, 2, {2, 61}, {6, 90}, true, NULL, {0}};
static const pattern P_CASTS = {"casts", m_casts, 1, mk_2d, 2, {2, 3}, {30, 90}, true, NULL, {0}};
static const pattern P_INTS = {"ints", m_ints, 4, mk_ints, 2, {2, 3}, {30, 90}, true, NULL, {0}};
static const pattern P_SHARED = {"shared", m_shared, 1, mk_2d, 2, {2, 3}, {30, 90}, true, NULL, {0}};
static const pattern P_OUTS = {"outputs", m_outs, 1, mk_2d, 2, {2, 3}, {30, 90}, true, NULL, {0}};
static const pattern P_SQUARE = {"square", m_square, 2, mk_square, 1, {2}, {70}, true, NULL, {0}};
static const pattern P_CYCLE = {"cycle", m_cycle, 1, mk_cycle, 1, {2}, {40}, true, NULL, {16}};
static pattern P_ENCODER = {"encoder", m_encoder, 1, mk_encoder, 1, {2}, {40}, true, NULL, {EH}};

/* -- Differential tests ---------------------------------------------------------- */

static void test_w1(void **state) {
    run_both(&P_W1, SJ_F32);
    run_both(&P_W1_BIG, SJ_F32);
}
static void test_w2(void **state) { run_both(&P_W2, SJ_F32); }
static void test_w3(void **state) { run_both(&P_W3, SJ_F32); }
static void test_matmul_gelu(void **state) {
    params[0] = small_param(SJ_F32, 2, S(24, 40), 0.3);
    params[1] = small_param(SJ_F32, 1, S(40), 1);
    run_both(&P_MMGELU, SJ_F32);
}
static void test_views(void **state) {
    run_both(&P_VIEWS, SJ_F32);
    run_both(&P_STRIDED, SJ_F32);
    run_both(&P_RESHAPE, SJ_F32);
}
static void test_softmax_axis0(void **state) { run_both(&P_SOFTMAX0, SJ_F32); }
static void test_reduce(void **state) { run_both(&P_REDUCE, SJ_F32); }
static void test_rows(void **state) {
    run_both(&P_ROWS, SJ_F32);
    run_both(&P_ROWS_LONG, SJ_F32);
}
static void test_casts_where(void **state) { run_both(&P_CASTS, SJ_F32); }
static void test_ints(void **state) { run_both(&P_INTS, SJ_F32); }
static void test_half(void **state) {
    run_both(&P_W1, SJ_F16);
    run_both(&P_W2, SJ_BF16);
    run_both(&P_W3, SJ_F16);
    run_both(&P_REDUCE, SJ_BF16);
    run_both(&P_ROWS, SJ_F16);
    run_both(&P_ROWS_LONG, SJ_BF16);
}
static void test_shared_value(void **state) { run_both(&P_SHARED, SJ_F32); }
static void test_outputs(void **state) {
    run_both(&P_OUTS, SJ_F32);
    run_both(&P_SQUARE, SJ_F32);
}

/* sizes 0: nothing to run, outputs still right (empty) */
static sj_status m_sum0(sj_tracer *t, const sj_val *in, int n, void *u) {
    sj_output(t, sj_add(t, sj_sum(t, in[0], -1, 0), sj_scalar(t, 1.0)));
    return sj_output(t, sj_mean(t, in[0], -1, 1));
}
static const pattern P_SUM0 = {"sum0", m_sum0, 1, mk_2d, 2, {2, 3}, {30, 90}, true, NULL, {0}};

static void test_empty(void **state) {
    run_pattern(&P_W1, false, SJ_F32, S(0, 7));
    run_pattern(&P_W2, false, SJ_F32, S(0, 7));
    run_pattern(&P_W2, true, SJ_F32, S(0, 7));
    run_pattern(&P_REDUCE, true, SJ_F32, S(0, 5));
    run_pattern(&P_SUM0, false, SJ_F32, S(3, 0)); /* rows of 0: sum 0, mean NaN */
}
static void test_cycle(void **state) {
    params[2] = small_param(SJ_F32, 2, S(16, 16), 0.3);
    run_both(&P_CYCLE, SJ_F32);
}
static void test_encoder(void **state) {
    enc_init(EH, ENH, EFF);
    run_both(&P_ENCODER, SJ_F32);
}

/* -- Plan-level tests ----------------------------------------------------------- */

/* Trace pt once (symbolic) at dims d and fuse. */
static sj_fplan *plan_of(const pattern *pt, const int64_t *d, sj_graph **g) {
    sj_tensor in[16];
    pt->make(d, SJ_F32, in);
    pol pl = {.sym = true, .fixed = pt->fixed};
    sj_trace_req req = {.fn_name = pt->name, .model = pt->model, .inputs = in, .n_inputs = pt->n_in,
                        .dim_policy = policy, .dim_ctx = &pl};
    sj_trace_result res;
    assert_int_equal(sj_trace(&req, &res), SJ_OK);
    free(res.facts);
    *g = res.graph;
    sj_fplan *p = sj_fuse(*g, in);
    assert_non_null(p);
    return p;
}

static void count_kinds(const sj_fplan *p, int *k) {
    k[0] = k[1] = k[2] = 0;
    for (int i = 0; i < p->n_groups; i++) k[p->groups[i].kind]++;
}

/* pt fuses into one group of this kind, loads and stores. */
static void expect_one(const pattern *pt, const int64_t *d, sj_group_kind kind, int loads, int stores) {
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
    expect_one(&P_W1, S(9, 4096), SJ_G_POINTWISE, 3, 1);
    expect_one(&P_W2, S(9, 768), SJ_G_ROW, 4, 2);
    expect_one(&P_W3, S(12, 9), SJ_G_ROW, 2, 1);

    /* the encoder layer (hidden size constant): matmul x4 and attention
     * are NODE groups; the qkv bias add, the head merge (a copying reshape)
     * and bias + gelu pointwise; both bias + residual + layer norms ROW */
    enc_init(768, 12, 3072);
    p = plan_of(&P_ENCODER, S(9), &g);
    count_kinds(p, k);
    sj_fplan_print(g, p, NULL, stdout, "  ");
    assert_int_equal(k[SJ_G_NODE], 5);
    assert_int_equal(k[SJ_G_POINTWISE], 3);
    assert_int_equal(k[SJ_G_ROW], 2);
    assert_true(sj_ex_hint(g->ex, p->arena_bytes) < sj_ex_hint(g->ex, p->naive_bytes));
    sj_fplan_free(p);
    sj_graph_destroy(g);

    /* the cycle: a's group cannot take a + m (nor merge with the group of
     * sigmoid(m)), which run after the matmul */
    params[2] = small_param(SJ_F32, 2, S(16, 16), 0.3);
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
static const pattern P_CHAIN = {"chain", m_chain, 1, mk_2d, 2, {2, 3}, {30, 90}, true, NULL, {0}};
static const pattern P_MIXED = {"mixed", m_mixed, 3, mk_mixed, 3, {2, 20, 40}, {9, 30, 60}, true, NULL, {0}};

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
            vals[nv++] = n->out;
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
    const pattern *pts[] = {&P_MIXED, &P_ENCODER, &P_SHARED, &P_CHAIN, &P_REDUCE};
    enc_init(EH, ENH, EFF);
    for (size_t t = 0; t < sizeof pts / sizeof pts[0]; t++) {
        sj_graph *g;
        int64_t d[MAXD];
        random_dims(pts[t], d);
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
static const pattern P_LONG_CHAIN = {"long chain", m_long_chain, 1, mk_long_chain, 1, {2}, {30}, true, NULL, {40}};

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
    pol pl = {.sym = true, .fixed = P_ENCODER.fixed};
    sj_trace_req req = {.fn_name = "enc", .model = m_encoder, .inputs = in, .n_inputs = 1, .dim_policy = policy,
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

/* the generated source: both forms are plain C over the runtime header */
static void test_codegen_text(void **state) {
    sj_graph *g;
    sj_fplan *p = plan_of(&P_W2, S(9, 768), &g);
    int64_t sv[2] = {9, 768};
    char *spec = sj_codegen_c(g, p, sv, "w2_", NULL), *sym = sj_codegen_c(g, p, NULL, "w2_", NULL);
    assert_non_null(spec);
    assert_non_null(sym);
    assert_non_null(strstr(spec, "void w2_k0(void *const *p, const int64_t *s, int64_t begin, int64_t end)"));
    assert_non_null(strstr(spec, "sj_rt_geluf"));
    assert_non_null(strstr(sym, "const int64_t s0 = s[0], s1 = s[1];"));
    assert_null(strstr(spec, "s[0]"));
    if (getenv("SJ_SHOW_CODE"))
        printf("%s\n-----\n%s\n", strstr(spec, "/* -- generated"), strstr(sym, "/* -- generated"));
    free(spec);
    free(sym);
    sj_fplan_free(p);
    sj_graph_destroy(g);
}

int main(void) {
#define T(f) cmocka_unit_test_teardown(f, teardown)
    const struct CMUnitTest tests[] = {
        T(test_plan_benchmarks), T(test_plan_arena), T(test_plan_overlap), T(test_long_chain), T(test_fuse_oom),
        T(test_codegen_text),
        T(test_w1), T(test_w2), T(test_w3), T(test_matmul_gelu), T(test_views), T(test_softmax_axis0),
        T(test_reduce), T(test_rows), T(test_casts_where), T(test_ints), T(test_half), T(test_shared_value),
        T(test_outputs), T(test_empty), T(test_cycle), T(test_encoder),
    };
    return cmocka_run_group_tests(tests, setup_all, teardown_all);
}
