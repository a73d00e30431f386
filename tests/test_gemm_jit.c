/* Generated tensor-core products in CUDA fused plans (issue 29;
 * cfg.cuda_gemm, specialize/fusion.h's "Generated products").
 *
 * Everywhere (no GPU needed): the plan's marks. With sj_fuse_opts.gemm an
 * f16 product over a contiguous operand and a [K, N] parameter is a
 * generated product (the first tile of sj_gemm_cuda_tiles that divides N
 * and K) with its epilogue chain inside (ReLU, GELU, residual add, cast);
 * without it (the CPU, or cuda_gemm 0) nothing is marked and an f16
 * product has no epilogue group, as before. Refusals: a transposed weight
 * (a view), N that no tile divides, f32, an epilogue the kernel cannot do
 * (it runs after: not an epilogue then), a product result read twice. The
 * CUDA generator reports one function for a generated product's group.
 *
 * On a CUDA device (else "skipped: no CUDA device"): relu(x @ W + b),
 * gelu(x @ W + b) + r, cast(relu(x @ W + b), f32) and the MiniLM
 * feed-forward block (H 384, FF 1536: gelu(x @ W1 + b1) @ W2 + b2 + x)
 * with SHAPEJIT_CUDA_GEMM 2 .. 5 (each tile variant forced) and 1 (tuned:
 * the tuner's times and choice in the perf log), symbolic M (odd sizes
 * included) and static, against float64 and against the CPU's eager run;
 * the explain output names the generated product (its tile, the epilogue
 * inside) and the calls are fused; with cuda_gemm 0 the same graphs name
 * none.
 *
 * Also without a GPU: the executor's wiring through a host gemm slot (the
 * kernel's contract computed on the CPU), the variant picks (none, -1,
 * the last), the misaligned fallback, and the tuner's cache record.
 *
 * A LayerNorm inside (cfg.cuda_gemm_ln): layer_norm(x + (x @ W + b)) and
 * the feed-forward block ending in layer_norm(x + ...) are marked
 * (SJ_GEMM_LN, the row group's layer norm; none without the option; not
 * gelu(layer_norm(...)), a row group the kernel cannot do); through the
 * host slot the counters are zero at the product (also on an arena block
 * scribbled over) and the row group is skipped; on the device every mode
 * above runs them against float64, and test_ln_graphs runs them forced
 * under per-shape and bucket CUDA graphs, every call checked. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/tensor.h"
#include "jit/exec.h"
#include "jit/graphs.h"
#include "jit/runtime.h"
#include "jit/shapejit.h"
#include "jit/trace.h"
#include "specialize/codegen_cuda.h"
#include "specialize/codegen_gemm_cuda.h"
#include "specialize/fusion.h"
#include "specialize/policy.h"
#include "kernels/cpu/backend_cpu.h"
#include "tests/util.h"
#include "tests/util_patterns.h"

#ifdef SJ_WITH_CUDA
#include "kernels/cuda/cuda_dev.h"
#include "kernels/cuda/exec_cuda.h"
#include "kernels/cuda/nvrtc.h"
#endif

#define S(...) ((const int64_t[]){__VA_ARGS__})

/* -- Models ------------------------------------------------------------------------ */

enum {
    M_RELU,      /* relu(x @ W + b) */
    M_GELU_RES,  /* gelu(x @ W + b) + r (inputs x, r) */
    M_CAST,      /* cast(relu(x @ W + b), f32) */
    M_FFN,       /* gelu(x @ W1 + b1) @ W2 + b2 + x */
    M_TRANS,     /* relu(x @ permute(Wt) + b): a view of the weight */
    M_SIGMOID,   /* sigmoid(x @ W + b): an epilogue the kernel cannot do */
    M_TWICE,     /* relu(y) + y, y = x @ W + b: the product's result read twice */
    M_LN,        /* layer_norm(x + (x @ W + b), g, beta), K = N: the attention block's end */
    M_FFN_LN,    /* layer_norm(x + gelu(x @ W1 + b1) @ W2 + b2, g, beta): the feed-forward block's */
    M_LN_GELU,   /* gelu(layer_norm(x @ W + b + x, g, beta)): a row group the kernel cannot do */
};
#define GM_EPS 1e-5

typedef struct gm {
    int kind;
    sj_dtype dt;
    int64_t K, N, N2;
    sj_tensor w, b, w2, b2, lg, lb; /* lg, lb: a LayerNorm's gamma and beta */
} gm;

static bool gm_ffn(int kind) { return kind == M_FFN || kind == M_FFN_LN; }
static bool gm_ln(int kind) { return kind == M_LN || kind == M_FFN_LN || kind == M_LN_GELU; }

static void gm_init(gm *m, int kind, sj_dtype dt, int64_t K, int64_t N) {
    memset(m, 0, sizeof *m);
    m->kind = kind;
    m->dt = dt;
    m->K = K;
    m->N = N;
    m->w = kind == M_TRANS ? tu_tensor(dt, 2, S(N, K)) : tu_tensor(dt, 2, S(K, N));
    m->b = tu_tensor(dt, 1, S(N));
    double s = 1.0 / sqrt((double)K);
    tu_fill_range(&m->w, -s, s);
    tu_fill_range(&m->b, -0.5, 0.5);
    if (gm_ln(kind)) { /* over the output's N (the FFN's: K) */
        int64_t n = gm_ffn(kind) ? K : N;
        m->lg = tu_tensor(dt, 1, S(n));
        m->lb = tu_tensor(dt, 1, S(n));
        tu_fill_range(&m->lg, 0.5, 1.5);
        tu_fill_range(&m->lb, -0.5, 0.5);
    }
    if (gm_ffn(kind)) { /* back to K */
        m->N2 = K;
        m->w2 = tu_tensor(dt, 2, S(N, K));
        m->b2 = tu_tensor(dt, 1, S(K));
        tu_fill_range(&m->w2, -1.0 / sqrt((double)N), 1.0 / sqrt((double)N));
        tu_fill_range(&m->b2, -0.5, 0.5);
    }
}

static int gm_inputs(const gm *m) { return m->kind == M_GELU_RES ? 2 : 1; }

static sj_status gm_model(sj_tracer *t, const sj_val *in, int n, void *u) {
    (void)n;
    const gm *m = u;
    sj_val w = sj_param(t, &m->w);
    if (m->kind == M_TRANS) w = sj_permute(t, w, (int[]){1, 0});
    sj_val y = sj_add(t, sj_matmul(t, in[0], w), sj_param(t, &m->b));
    switch (m->kind) {
    case M_RELU:
    case M_TRANS: return sj_output(t, sj_relu(t, y));
    case M_GELU_RES: return sj_output(t, sj_add(t, sj_gelu(t, y), in[1]));
    case M_CAST: return sj_output(t, sj_cast(t, sj_relu(t, y), SJ_F32));
    case M_SIGMOID: return sj_output(t, sj_sigmoid(t, y));
    case M_TWICE: return sj_output(t, sj_add(t, sj_relu(t, y), y));
    case M_LN:
        return sj_output(t, sj_layer_norm(t, sj_add(t, in[0], y), sj_param(t, &m->lg), sj_param(t, &m->lb), GM_EPS));
    case M_LN_GELU:
        return sj_output(
            t, sj_gelu(t, sj_layer_norm(t, sj_add(t, y, in[0]), sj_param(t, &m->lg), sj_param(t, &m->lb), GM_EPS)));
    default: break;
    }
    sj_val h = sj_add(t, sj_matmul(t, sj_gelu(t, y), sj_param(t, &m->w2)), sj_param(t, &m->b2));
    if (m->kind == M_FFN_LN)
        return sj_output(t, sj_layer_norm(t, sj_add(t, in[0], h), sj_param(t, &m->lg), sj_param(t, &m->lb), GM_EPS));
    return sj_output(t, sj_add(t, h, in[0]));
}

/* -- float64 reference ------------------------------------------------------------- */

static double gelu64(double v) { return 0.5 * v * (1.0 + erf(v / sqrt(2.0))); }

/* y[M, N] = x[M, K] @ w + b (values as stored), mag = sum |x||w| + |b|. */
static void ref_linear(const double *x, int64_t M, int64_t K, const sj_tensor *w, const sj_tensor *b, int64_t N,
                       double *y, double *mag) {
    double *wd = malloc(sizeof(double) * (size_t)(K * N)); /* w read once (the MiniLM FFN at M 1024) */
    assert_non_null(wd);
    for (int64_t i = 0; i < K * N; i++) wd[i] = tu_get(w, i);
    for (int64_t i = 0; i < M; i++) {
        double *yi = y + i * N, *mi = mag + i * N;
        for (int64_t j = 0; j < N; j++) yi[j] = tu_get(b, j), mi[j] = fabs(yi[j]);
        for (int64_t k = 0; k < K; k++) {
            double xv = x[i * K + k];
            const double *wk = wd + k * N;
            for (int64_t j = 0; j < N; j++) {
                double p = xv * wk[j];
                yi[j] += p;
                mi[j] += fabs(p);
            }
        }
    }
    free(wd);
}

/* v (M rows of n) := layer_norm(v, m's gamma and beta) in float64; mag
 * (the sums' magnitudes) scaled by the row's 1 / std and gamma, plus
 * |beta| and the result's own. */
static void ref_norm(const gm *m, double *v, double *mag, int64_t M, int64_t n) {
    for (int64_t r = 0; r < M; r++) {
        double *x = v + r * n, *mg = mag + r * n, mean = 0, var = 0;
        for (int64_t i = 0; i < n; i++) mean += x[i];
        mean /= (double)n;
        for (int64_t i = 0; i < n; i++) var += (x[i] - mean) * (x[i] - mean);
        double rstd = 1.0 / sqrt(var / (double)n + GM_EPS);
        for (int64_t i = 0; i < n; i++) {
            double g = tu_get(&m->lg, i), b = tu_get(&m->lb, i);
            x[i] = (x[i] - mean) * rstd * g + b;
            mg[i] = (mg[i] * rstd + 1) * fabs(g) + fabs(b) + fabs(x[i]);
        }
    }
}

/* The model's output in float64 for inputs in (host), M rows; ref and mag
 * M x (the output's last size). */
static void gm_ref(const gm *m, const sj_tensor *in, int64_t M, double *ref, double *mag) {
    int64_t K = m->K, N = m->N;
    double *x = malloc(sizeof(double) * (size_t)(M * K)), *y = malloc(sizeof(double) * (size_t)(M * N)),
           *ym = malloc(sizeof(double) * (size_t)(M * N));
    assert_true(x && y && ym);
    for (int64_t i = 0; i < M * K; i++) x[i] = tu_get(&in[0], i);
    ref_linear(x, M, K, &m->w, &m->b, N, y, ym);
    if (gm_ffn(m->kind)) {
        for (int64_t i = 0; i < M * N; i++) y[i] = gelu64(y[i]);
        ref_linear(y, M, N, &m->w2, &m->b2, K, ref, mag);
        for (int64_t i = 0; i < M * K; i++) {
            ref[i] += x[i];
            mag[i] += fabs(x[i]) + fabs(ref[i]);
        }
        if (m->kind == M_FFN_LN) ref_norm(m, ref, mag, M, K);
    } else if (gm_ln(m->kind)) {
        for (int64_t i = 0; i < M * N; i++) {
            ref[i] = y[i] + x[i];
            mag[i] = ym[i] + fabs(x[i]) + fabs(ref[i]);
        }
        ref_norm(m, ref, mag, M, N);
        if (m->kind == M_LN_GELU)
            for (int64_t i = 0; i < M * N; i++) {
                ref[i] = gelu64(ref[i]);
                mag[i] += fabs(ref[i]);
            }
    } else {
        for (int64_t i = 0; i < M * N; i++) {
            double v = y[i];
            if (m->kind == M_GELU_RES) v = gelu64(v) + tu_get(&in[1], i);
            else if (m->kind == M_SIGMOID) v = 1.0 / (1.0 + exp(-v));
            else v = v > 0 ? v : 0;
            ref[i] = v;
            mag[i] = ym[i] + fabs(v) + (m->kind == M_GELU_RES ? fabs(tu_get(&in[1], i)) : 0);
        }
    }
    free(x), free(y), free(ym);
}

/* -- The plan's marks (no GPU) ------------------------------------------------------- */

static sj_expr seq_policy(void *ctx, sj_exprs *ex, int input, int axis, int64_t size) {
    int *sym = ctx;
    (void)input;
    if (!sym || axis != 1 || size < 2) return sj_ex_const(ex, size);
    if (*sym < 0) *sym = sj_sym_new(ex, size, 2, SJ_EX_INF);
    return sj_ex_sym(ex, *sym);
}

/* The runtime's default policy: every size >= 2 a symbol, equal sizes
 * sharing one (duck sizing). ctx: int64_t [16][2] rows (size, symbol) from
 * row 1, the count in [0][0]. */
static sj_expr every_policy(void *ctx, sj_exprs *ex, int input, int axis, int64_t size) {
    int64_t(*seen)[2] = ctx;
    (void)input, (void)axis;
    if (size < 2) return sj_ex_const(ex, size);
    for (int64_t i = 1; i <= seen[0][0]; i++)
        if (seen[i][0] == size) return sj_ex_sym(ex, (int)seen[i][1]);
    int s = sj_sym_new(ex, size, 2, SJ_EX_INF);
    seen[++seen[0][0]][0] = size;
    seen[seen[0][0]][1] = s;
    return sj_ex_sym(ex, s);
}

typedef struct traced {
    sj_graph *g;
    sj_fplan *p;
    sj_tensor in[2];
} traced;

/* The device's compute capability the plans are made for (0: unknown, no
 * split-K tiles; test_plan_split sets 90). */
static int plan_arch;
/* plans made without sj_fuse_opts.gemm_ln (cfg.cuda_gemm_ln 0) */
static bool no_ln;

/* symbolic: 0 static; 1 the sequence axis a symbol; 2 every size a
 * symbol (the runtime's default), the plan told which the trace's facts
 * pin (as jit/call.c does) unless unpinned */
static void trace_gm_ex(gm *m, int64_t S_, int symbolic, bool gemm, bool unpinned, traced *tr) {
    int sym = -1;
    int64_t seen[16][2] = {{0}};
    tr->in[0] = tu_tensor(m->dt, 3, S(2, S_, m->K));
    tr->in[1] = tu_tensor(m->dt, 3, S(2, S_, m->N));
    sj_trace_req req = {.fn_name = "gemm", .model = gm_model, .user = m, .inputs = tr->in,
                        .n_inputs = gm_inputs(m), .dim_policy = symbolic == 2 ? every_policy : seq_policy,
                        .dim_ctx = symbolic == 2 ? (void *)seen : symbolic == 1 ? (void *)&sym : NULL};
    sj_trace_result res;
    if (sj_trace(&req, &res)) fail_msg("trace: %s", sj_last_error());
    uint64_t pinned = 0;
    for (int s = 0; !unpinned && s < sj_sym_count(res.graph->ex) && s < 64; s++)
        if (sj_plan_sym_pinned(res.graph->ex, res.facts, res.n_facts, s)) pinned |= UINT64_C(1) << s;
    free(res.facts);
    tr->g = res.graph;
    tr->p = sj_fuse_ex(tr->g, tr->in,
                       &(sj_fuse_opts){.gemm = gemm, .gemm_ln = gemm && gm_ln(m->kind) && !no_ln, .gemm_arch = plan_arch,
                                       .gemm_units = 132, .pinned = pinned});
    assert_non_null(tr->p);
}

static void trace_gm(gm *m, int64_t S_, int symbolic, bool gemm, traced *tr) {
    trace_gm_ex(m, S_, symbolic, gemm, false, tr);
}

static void untrace(traced *tr) {
    sj_fplan_free(tr->p);
    sj_graph_destroy(tr->g);
}

/* The plan's generated products: their count; the first's group in *first. */
static int gemms(const sj_fplan *p, const sj_group **first) {
    int n = 0;
    *first = NULL;
    for (int i = 0; i < p->n_groups; i++) {
        const sj_group *G = &p->groups[i];
        if (G->gemm_tile < 0) continue;
        assert_int_equal(G->kind, SJ_G_NODE);
        if (!n) *first = G;
        n++;
    }
    assert_int_equal(n, p->n_gemm);
    return n;
}

static char *plan_text(const traced *tr) {
    char *s = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&s, &n);
    assert_non_null(f);
    sj_fplan_print(tr->g, tr->p, NULL, f, "");
    fclose(f);
    return s;
}

static void test_plan_marks(void **state) {
    (void)state;
    for (int symbolic = 0; symbolic < 3; symbolic++) {
        struct {
            int kind;
            sj_dtype dt;
            int64_t K, N;
            int n_gemm;      /* generated products with gemm on */
            uint32_t epi;    /* the first's gemm_epi */
        } cases[] = {
            {M_RELU, SJ_F16, 64, 128, 1, SJ_GEMM_EPI | SJ_GEMM_RELU},
            {M_GELU_RES, SJ_F16, 64, 128, 1, SJ_GEMM_EPI | SJ_GEMM_GELU | SJ_GEMM_RES},
            {M_CAST, SJ_F16, 96, 192, 1, SJ_GEMM_EPI | SJ_GEMM_RELU},
            {M_FFN, SJ_F16, 384, 1536, 2, SJ_GEMM_EPI | SJ_GEMM_GELU},
            {M_TRANS, SJ_F16, 64, 128, 0, 0},
            {M_RELU, SJ_F16, 64, 100, 0, 0}, /* no tile divides N */
            {M_RELU, SJ_F32, 64, 128, 0, 0},
            {M_SIGMOID, SJ_F16, 64, 128, 1, 0},
            {M_TWICE, SJ_F16, 64, 128, 1, 0},
            {M_LN, SJ_F16, 128, 128, 1, SJ_GEMM_LN | SJ_GEMM_RES},
            {M_FFN_LN, SJ_F16, 384, 1536, 2, SJ_GEMM_EPI | SJ_GEMM_GELU}, /* the second: LN */
            {M_LN_GELU, SJ_F16, 128, 128, 1, 0},
        };
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
            gm m;
            gm_init(&m, cases[c].kind, cases[c].dt, cases[c].K, cases[c].N);
            traced on, off;
            trace_gm(&m, 33, symbolic, true, &on);
            trace_gm(&m, 33, symbolic, false, &off);
            const sj_group *G;
            char what[64];
            snprintf(what, sizeof what, "case %zu (%s)", c, symbolic == 2 ? "every size symbolic" : symbolic ? "symbolic" : "static");
            if (symbolic == 2 && cases[c].n_gemm) { /* the inner size pinned by the weight: needed */
                traced un;
                trace_gm_ex(&m, 33, 2, true, true, &un);
                const sj_group *U;
                /* (the feed-forward block's second product reads the first's output, whose inner
                 * size is the weight's constant: that one is marked either way) */
                if (gemms(un.p, &U) >= cases[c].n_gemm)
                    fail_msg("%s: the first generated product with the inner size unpinned", what);
                untrace(&un);
            }
            if (gemms(on.p, &G) != cases[c].n_gemm) fail_msg("%s: %d generated products", what, on.p->n_gemm);
            /* off: nothing marked, and an f16 product keeps no epilogue */
            const sj_group *G0;
            assert_int_equal(gemms(off.p, &G0), 0);
            for (int i = 0; i < off.p->n_groups; i++) {
                const sj_group *H = &off.p->groups[i];
                assert_int_equal(H->gemm_epi, 0);
                if (cases[c].dt == SJ_F16) assert_int_equal(H->epilogue, -1);
            }
            char *t_off = plan_text(&off), *t_on = plan_text(&on);
            assert_null(strstr(t_off, "generated product"));
            if (cases[c].n_gemm) assert_non_null(strstr(t_on, "generated product, tile 64x64x32"));
            free(t_off), free(t_on);
            if (!G) goto next;
            assert_int_equal(G->gemm_tile, 0);
            if ((G->gemm_epi & ~(uint32_t)SJ_GEMM_ROUNDS) != cases[c].epi)
                fail_msg("%s: gemm_epi %u, not %u", what, G->gemm_epi, cases[c].epi);
            /* f16 values on the way: all of them in these graphs */
            if (G->gemm_epi & SJ_GEMM_EPI) {
                uint32_t want = SJ_GEMM_R_PROD | (G->gemm_epi & (SJ_GEMM_GELU | SJ_GEMM_RELU) ? SJ_GEMM_R_ACT : 0) |
                                (G->gemm_epi & SJ_GEMM_RES ? SJ_GEMM_R_RES : 0);
                assert_int_equal(G->gemm_epi & SJ_GEMM_ROUNDS, want);
            }
            int gi = (int)(G - on.p->groups);
            if (G->gemm_epi & SJ_GEMM_EPI) {
                assert_int_equal(G->epilogue, gi + 1);
                const sj_group *E = &on.p->groups[gi + 1];
                assert_int_equal(E->epilogue_of, gi);
                assert_int_equal(E->n_stores, 1);
                assert_int_equal(G->gemm_out, E->stores[0].val);
                if (cases[c].kind == M_CAST) assert_int_equal(on.g->vals[G->gemm_out].dtype, SJ_F32);
                if (G->gemm_epi & SJ_GEMM_RES) assert_int_equal(on.g->vals[G->gemm_res].kind, SJ_VAL_INPUT);
            } else {
                assert_int_equal(G->epilogue, -1); /* f16: runs after, not an epilogue */
                assert_int_equal(G->gemm_out, sj_group_out(on.g, G));
            }
            /* a LayerNorm inside: the next group's row op, the residual the input */
            const sj_group *L = G;
            for (int i = gi + 1; cases[c].kind == M_FFN_LN && i < on.p->n_groups; i++)
                if (on.p->groups[i].gemm_tile >= 0) L = &on.p->groups[i];
            bool want_ln = cases[c].kind == M_LN || cases[c].kind == M_FFN_LN;
            assert_int_equal((L->gemm_epi & SJ_GEMM_LN) != 0, want_ln);
            assert_int_equal(on.p->n_gemm_ln, want_ln);
            if (want_ln) {
                const sj_group *R = L + 1;
                assert_int_equal(R->kind, SJ_G_ROW);
                assert_int_equal(L->gemm_ln, R->row_node);
                assert_int_equal(on.g->nodes[L->gemm_ln].op, SJ_OP_LAYER_NORM);
                assert_int_equal(L->gemm_epi & SJ_GEMM_ROUNDS, SJ_GEMM_R_PROD | SJ_GEMM_R_RES);
                assert_int_equal(on.g->vals[L->gemm_res].kind, SJ_VAL_INPUT);
                assert_int_equal(L->gemm_out, sj_group_out(on.g, L));
                char *t = plan_text(&on);
                assert_non_null(strstr(t, "layer_norm inside"));
                free(t);
                traced off_ln; /* opt-in: without cuda_gemm_ln the row group runs after */
                no_ln = true;
                trace_gm(&m, 33, symbolic, true, &off_ln);
                no_ln = false;
                assert_int_equal(off_ln.p->n_gemm_ln, 0);
                assert_int_equal(off_ln.p->n_gemm, on.p->n_gemm);
                for (int i = 0; i < off_ln.p->n_groups; i++)
                    assert_int_equal(off_ln.p->groups[i].gemm_epi & SJ_GEMM_LN, 0);
                untrace(&off_ln);
            } else {
                assert_int_equal(L->gemm_ln, -1);
            }
            /* the CUDA generator: one function for the product's group */
            int variants[64] = {0};
            assert_true(on.p->n_groups <= 64);
            char *src = sj_codegen_cuda(on.g, on.p, NULL, &(sj_codegen_opts){.prefix = "sj_", .variants = variants},
                                        NULL);
            assert_non_null(src);
            for (int i = 0; i < on.p->n_groups; i++) {
                const sj_group *H = &on.p->groups[i];
                int want = H->kind != SJ_G_NODE ? -1 : H->gemm_tile >= 0 ? H->gemm_nv : 0;
                if (want >= 0) assert_int_equal(variants[i], want);
                else assert_true(variants[i] >= 1);
            }
            /* the variants: the first tiles that fit, in the table's order */
            int nt;
            const sj_gemm_tile *tiles = sj_gemm_cuda_tiles(&nt);
            assert_true(G->gemm_nv >= 1 && G->gemm_nv <= SJ_CG_VARIANTS_MAX);
            for (int v = 0; v < G->gemm_nv; v++) {
                assert_true(v == 0 || G->gemm_tiles[v] > G->gemm_tiles[v - 1]);
                sj_gemm_spec sp = {.N = m.N, .K = m.K, .out_dtype = SJ_F16, .tile = tiles[G->gemm_tiles[v]]};
                assert_int_equal(sj_gemm_cuda_check(&sp), SJ_OK);
                char sig[64];
                if (G->gemm_nv > 1) snprintf(sig, sizeof sig, "sj_%s_v%d(const unsigned short", G->name, v);
                else snprintf(sig, sizeof sig, "sj_%s(const unsigned short", G->name);
                assert_non_null(strstr(src, sig));
            }
            /* the tuner's record: a pick per size class, round trip and refusals */
            enum { C = SJ_GEMM_CLASSES };
            int8_t pick[64 * C], back[64 * C];
            memset(pick, -1, sizeof pick);
            for (int k = 0; k < C; k++) pick[gi * C + k] = (int8_t)(k == 1 ? -1 : (G->gemm_nv - 1 + k) % G->gemm_nv);
            char rec[1024];
            size_t rl = sj_gemm_picks_format(on.p, pick, rec, sizeof rec);
            assert_true(rl > 0 && rl == strlen(rec));
            memset(back, 7, sizeof back);
            assert_true(sj_gemm_picks_parse(on.p, rec, rl, back));
            assert_memory_equal(back, pick, (size_t)on.p->n_groups * C);
            assert_int_equal(sj_gemm_picks_format(on.p, pick, rec, 8), 0); /* does not fit */
            rl = sj_gemm_picks_format(on.p, pick, rec, sizeof rec);
            char bad[1100];
            char old[600]; /* a record of one pick a group (before size classes): timed again */
            snprintf(old, sizeof old, "sjgp1 %d", on.p->n_groups);
            for (int i = 0; i < on.p->n_groups; i++) snprintf(old + strlen(old), sizeof old - strlen(old), " -1");
            const char *refused[] = {"", "junk", "sjgp2", "sjgp2 999 -1", old};
            for (size_t b = 0; b < sizeof refused / sizeof refused[0]; b++)
                assert_false(sj_gemm_picks_parse(on.p, refused[b], strlen(refused[b]), back));
            pick[gi * C + 2] = (int8_t)G->gemm_nv; /* past the variants, in the last class */
            rl = sj_gemm_picks_format(on.p, pick, bad, sizeof bad);
            assert_false(sj_gemm_picks_parse(on.p, bad, rl, back));
            for (int k = 0; k < C; k++) pick[gi * C + k] = -1;
            pick[(gi == 0 ? 1 : 0) * C] = 0; /* a pick for a group that is no product */
            rl = sj_gemm_picks_format(on.p, pick, bad, sizeof bad);
            bool other_is_gemm = on.p->groups[gi == 0 ? 1 : 0].gemm_tile >= 0;
            if (!other_is_gemm) {
                /* format writes -1 there; a record that says otherwise is refused */
                assert_true(sj_gemm_picks_parse(on.p, bad, rl, back));
                snprintf(bad, sizeof bad, "sjgp2 %d", on.p->n_groups);
                for (int i = 0; i < on.p->n_groups * C; i++)
                    snprintf(bad + strlen(bad), sizeof bad - strlen(bad), " %d", i == (gi == 0 ? 1 : 0) * C ? 0 : -1);
                assert_false(sj_gemm_picks_parse(on.p, bad, strlen(bad), back));
            }
            /* the size classes: rows up to 48, to 256, past it */
            assert_int_equal(sj_gemm_class(1), 0);
            assert_int_equal(sj_gemm_class(48), 0);
            assert_int_equal(sj_gemm_class(49), 1);
            assert_int_equal(sj_gemm_class(256), 1);
            assert_int_equal(sj_gemm_class(257), 2);
            rl = strlen(rec);
            memcpy(bad, rec, rl);
            bad[rl] = 'x'; /* trailing junk */
            assert_false(sj_gemm_picks_parse(on.p, bad, rl + 1, back));
            assert_false(sj_gemm_picks_parse(on.p, rec, rl - 3, back)); /* cut */
            if (G->gemm_epi & SJ_GEMM_RELU) assert_non_null(strstr(src, "v0 > 0.0f ? v0 : 0.0f"));
            if (on.p->n_gemm_ln) { /* its kernels take the counters and elect the last block */
                assert_non_null(strstr(src, "unsigned *__restrict__ cnt"));
                assert_non_null(strstr(src, "arrive(cnt + blockIdx.y"));
            } else {
                assert_null(strstr(src, "arrive("));
            }
            if (G->gemm_epi & SJ_GEMM_GELU) assert_non_null(strstr(src, "gelu_erf(v0)"));
            free(src);
        next:
            untrace(&on);
            untrace(&off);
            tu_free_all();
        }
    }
}

/* For sm_90 the plan's variants are a split-K cluster (static: at the
 * entry's rows; symbolic: at 16), two warpgroup tiles and a tile of one
 * block, each fitting N and K, named by explain, compiled with their
 * cluster dims and wgmma; without the arch, tiles of one block only. */
static void test_plan_split(void **state) {
    (void)state;
    int nt;
    const sj_gemm_tile *tiles = sj_gemm_cuda_tiles(&nt);
    for (int symbolic = 0; symbolic < 2; symbolic++) {
        gm m;
        gm_init(&m, M_GELU_RES, SJ_F16, 384, 1536);
        traced tr;
        plan_arch = 90;
        trace_gm(&m, 9, symbolic, true, &tr);
        plan_arch = 0;
        const sj_group *G;
        assert_int_equal(gemms(tr.p, &G), 1);
        assert_int_equal(G->gemm_nv, 4);
        for (int v = 0; v < 4; v++) { /* split-K, two warpgroup tiles, one of one block */
            const sj_gemm_tile *t = &tiles[G->gemm_tiles[v]];
            assert_true(v == 0 ? t->splitk > 1 && !t->wg : v < 3 ? t->wg : t->splitk <= 1 && !t->wg);
            sj_gemm_spec sp = {.N = 1536, .K = 384, .out_dtype = SJ_F16, .tile = *t};
            assert_int_equal(sj_gemm_cuda_check(&sp), SJ_OK);
        }
        assert_int_equal(G->gemm_tile, G->gemm_tiles[0]);
        char *text = plan_text(&tr);
        assert_non_null(strstr(text, "split-K"));
        free(text);
        char *src = sj_codegen_cuda(tr.g, tr.p, NULL, &(sj_codegen_opts){.prefix = "sj_"}, NULL);
        assert_non_null(src);
        assert_non_null(strstr(src, "__cluster_dims__(1, 1, SK)"));
        assert_non_null(strstr(src, "wgmma.mma_async.sync.aligned.m64n"));
        /* each variant's kernel under the quick unit's macro, a stub of its
         * name in its place (SJ_CUDA_QUICK_MACRO) */
        for (int v = 0; v < 4; v++) {
            char stub[128];
            snprintf(stub, sizeof stub, "#else\nextern \"C\" __global__ void sj_%s_v%d() { __trap(); }\n#endif\n",
                     G->name, v);
            const char *at = strstr(src, stub);
            if (!at) fail_msg("no quick stub for variant %d", v);
            /* the real kernel before it, after its own #ifndef */
            char ns[64];
            snprintf(ns, sizeof ns, "#ifndef " SJ_CUDA_QUICK_MACRO "\nnamespace gemm_%s_v%d {", G->name, v);
            const char *open = strstr(src, ns);
            assert_true(open && open < at);
            if (getenv("SJ_TEST_DUMP_CU") && v == 0 && symbolic) {
                FILE *f = fopen(getenv("SJ_TEST_DUMP_CU"), "w");
                if (f) fputs(src, f), fclose(f);
            }
        }
        free(src);
        untrace(&tr);
        /* unknown arch: no split-K, no warpgroup tile */
        trace_gm(&m, 9, symbolic, true, &tr);
        assert_int_equal(gemms(tr.p, &G), 1);
        for (int v = 0; v < G->gemm_nv; v++)
            assert_true(tiles[G->gemm_tiles[v]].splitk <= 1 && !tiles[G->gemm_tiles[v]].wg);
        untrace(&tr);
    }
}

/* -- The executor's wiring, on the CPU (no GPU) ---------------------------------------
 * The plan's generated products run through a gemm slot of the test's own
 * (the CUDA kernel's contract, computed on the host from the f16 and f32
 * bits): the executor passes the operands, the bias, the residual and the
 * epilogue's store, M from the call's sizes, and skips the epilogue group
 * it ran; the results equal the eager run's. An operand the kernel could
 * not read aligned (x one element past a 16-byte boundary) takes the
 * device's product and the epilogue group after it, with the same
 * results. */

static struct {
    int calls, lns;
    int64_t M;
    uint32_t flags;
    int tile;
} slot;

static float hval(const void *p, sj_dtype dt, int64_t i) {
    return dt == SJ_F16 ? (float)tu_f16_value(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

static sj_status host_gemm(void *c, const sj_dev_gemm *d) {
    (void)c;
    slot.calls++;
    slot.M = d->M;
    slot.flags = d->flags;
    slot.tile = d->tile;
    assert_true((uintptr_t)d->a % 16 == 0 && (uintptr_t)d->b % 16 == 0);
    for (int64_t i = 0; i < d->M; i++)
        for (int64_t j = 0; j < d->N; j++) {
            float v = 0;
            for (int64_t k = 0; k < d->K; k++) v += hval(d->a, SJ_F16, i * d->K + k) * hval(d->b, SJ_F16, k * d->N + j);
            if (d->bias) v += hval(d->bias, d->bias_dtype, j);
#define RND(f) if (d->flags & (f)) v = (float)tu_f16_value(tu_f16_bits(v))
            RND(SJ_GEMM_R_PROD);
            if (d->flags & SJ_GEMM_GELU) v = (float)gelu64(v);
            if (d->flags & SJ_GEMM_RELU) v = v > 0 ? v : 0;
            if (d->flags & (SJ_GEMM_GELU | SJ_GEMM_RELU)) RND(SJ_GEMM_R_ACT);
            if (d->flags & SJ_GEMM_RES) v += hval(d->r, d->r_dtype, i * d->N + j);
            if (d->flags & SJ_GEMM_RES) RND(SJ_GEMM_R_RES);
#undef RND
            if (d->c_dtype == SJ_F16) ((uint16_t *)d->c)[i * d->N + j] = tu_f16_bits(v);
            else ((float *)d->c)[i * d->N + j] = v;
        }
    if (d->flags & SJ_GEMM_LN) { /* the kernel's LayerNorm, on zeroed counters */
        slot.lns++;
        assert_non_null(d->cnt);
        assert_non_null(d->ln_y);
        for (int64_t i = 0; i < sj_gemm_ln_counters(d->M); i++) assert_int_equal(d->cnt[i], 0);
        for (int64_t i = 0; i < d->M; i++) {
            double mean = 0, var = 0;
            for (int64_t j = 0; j < d->N; j++) mean += hval(d->c, d->c_dtype, i * d->N + j);
            mean /= (double)d->N;
            for (int64_t j = 0; j < d->N; j++) {
                double e = hval(d->c, d->c_dtype, i * d->N + j) - mean;
                var += e * e;
            }
            double rstd = 1.0 / sqrt(var / (double)d->N + d->ln_eps);
            for (int64_t j = 0; j < d->N; j++) {
                double g = d->ln_g ? hval(d->ln_g, d->ln_g_dtype, j) : 1, b = d->ln_b ? hval(d->ln_b, d->ln_b_dtype, j) : 0;
                float y = (float)((hval(d->c, d->c_dtype, i * d->N + j) - mean) * rstd * g + b);
                if (d->ln_y_dtype == SJ_F16) ((uint16_t *)d->ln_y)[i * d->N + j] = tu_f16_bits(y);
                else ((float *)d->ln_y)[i * d->N + j] = y;
            }
        }
    } /* (the counters left zero, as the kernel leaves them) */
    return SJ_OK;
}

static void test_exec_wiring(void **state) {
    (void)state;
    sj_runtime *rt = NULL;
    sj_backend *be = NULL;
    assert_int_equal(sj_runtime_create(NULL, &rt), SJ_OK);
    assert_int_equal(sj_cpu_backend_create(&(sj_cpu_backend_config){0}, &be), SJ_OK);
    sj_pool pool;
    sj_pool_init(&pool, rt);
    sj_backend ops = sj_cpu_exec_ops;
    ops.gemm = host_gemm;
    ops.k.matmul_epi = NULL; /* as on CUDA: an epilogue not inside runs after */
    const int kinds[] = {M_RELU, M_GELU_RES, M_CAST, M_FFN, M_SIGMOID, M_LN, M_FFN_LN};
    for (size_t kk = 0; kk < sizeof kinds / sizeof kinds[0]; kk++)
        for (int symbolic = 0; symbolic < 2; symbolic++)
            for (int misalign = 0; misalign < 2; misalign++)
                for (int pk = 0; pk < (misalign ? 1 : 3); pk++) { /* picks: none (0), -1, the last variant */
                gm m;
                bool ffn = gm_ffn(kinds[kk]);
                /* (a LayerNorm inside: N a multiple of 64; M_LN's K is its N) */
                gm_init(&m, kinds[kk], SJ_F16, ffn ? 64 : kinds[kk] == M_LN ? 128 : 96, ffn ? 256 : 128);
                traced tr;
                trace_gm(&m, 24, symbolic, true, &tr);
                const sj_group *G;
                int ng = gemms(tr.p, &G);
                assert_true(ng >= 1);
                /* the C unit of the generated groups; the products' slots a mark */
                size_t len;
                char *src = sj_codegen_c(tr.g, tr.p, NULL, &(sj_codegen_opts){.prefix = "u_"}, &len);
                assert_non_null(src);
                const char *names[64];
                char buf[64][32];
                int gi_of[64], n = 0;
                void *fns[64 * SJ_CG_VARIANTS_MAX] = {0};
                assert_true(tr.p->n_groups <= 64);
                for (int gi = 0; gi < tr.p->n_groups; gi++) {
                    if (tr.p->groups[gi].kind == SJ_G_NODE) {
                        for (int v = 0; v < tr.p->groups[gi].gemm_nv; v++) fns[gi * SJ_CG_VARIANTS_MAX + v] = &slot;
                        continue;
                    }
                    snprintf(buf[n], sizeof buf[n], "u_%s", tr.p->groups[gi].name);
                    names[n] = buf[n];
                    gi_of[n++] = gi;
                }
                sj_module *mod = NULL;
                if (n) {
                    sj_compile_req req = {.source = src, .source_len = len, .symbols = names, .n_symbols = n,
                                          .tag = "gemm_exec"};
                    sj_compile_result *res = calloc(1, sizeof *res);
                    assert_non_null(res);
                    if (be->compile(be, &req, res)) fail_msg("compile: %s\n%s", sj_last_error(), res->log);
                    mod = res->module;
                    for (int i = 0; i < n; i++)
                        for (int v = 0; v < SJ_CG_VARIANTS_MAX; v++) fns[gi_of[i] * SJ_CG_VARIANTS_MAX + v] = res->fns[i];
                    free(res);
                }
                free(src);
                /* inputs at the traced sizes, S = 24 (M = 48); misaligned: x one element in */
                sj_tensor in[2] = {tr.in[0], tr.in[1]};
                sj_tensor xb = tu_tensor(SJ_F16, 1, S(2 * 24 * m.K + 8));
                in[0].data = (uint16_t *)xb.data + (misalign ? 1 : 0);
                tu_fill_range(&in[0], -1, 1);
                tu_fill_range(&in[1], -1, 1);
                int64_t sv[4] = {24, 24, 24, 24};
                sj_tensor eo[2], fo[2];
                sj_exec x;
                tu_pattern_eager(rt, &pool, tr.g, in, symbolic ? sv : NULL, "gemm exec", &x, eo, fo);
                tu_poison(&fo[0]);
                x.outputs = fo;
                x.ops = &ops;
                x.ops_ctx = NULL;
                /* a pick per size class: M 48 is class 0's; the other
                 * classes say cuBLASLt, so a call that read them runs none */
                int8_t picks[64 * SJ_GEMM_CLASSES];
                for (int gi = 0; gi < tr.p->n_groups; gi++)
                    for (int k = 0; k < SJ_GEMM_CLASSES; k++)
                        picks[gi * SJ_GEMM_CLASSES + k] =
                            (int8_t)(pk == 1 || k != sj_gemm_class(48) ? -1 : tr.p->groups[gi].gemm_nv - 1);
                x.gemm_pick = pk ? picks : NULL;
                memset(&slot, 0, sizeof slot);
                sj_status st = sj_exec_fused(&x, tr.p, fns);
                if (st) fail_msg("fused: %s", sj_last_error());
                char what[96];
                snprintf(what, sizeof what, "exec model %d %s%s pick %d", m.kind, symbolic ? "sym" : "static",
                         misalign ? " misaligned" : "", pk);
                assert_int_equal(slot.calls, misalign || pk == 1 ? 0 : ng);
                if (slot.calls) {
                    assert_int_equal(slot.M, 48);
                    /* the last product's flags and tile */
                    const sj_group *L = NULL;
                    for (int gi = 0; gi < tr.p->n_groups; gi++)
                        if (tr.p->groups[gi].gemm_tile >= 0) L = &tr.p->groups[gi];
                    assert_int_equal(slot.flags, L->gemm_epi);
                    assert_int_equal(slot.tile, L->gemm_tiles[pk ? L->gemm_nv - 1 : 0]);
                }
                /* a cast to f32 inside the product: the f16 steps rounded as eager rounds them, so
                 * the f32 output holds f16 values, compared at f16's tolerance (an H100 host's CPU
                 * put 3 of 6144 elements 1 f16 ulp from eager: the sums' order differs) */
                if (!tu_check_like_eager_as(&fo[0], &eo[0], m.kind == M_CAST ? SJ_F16 : fo[0].dtype, what))
                    fail_msg("%s: differs from eager", what);
                int want_lns = !misalign && pk != 1 && tr.p->n_gemm_ln ? 1 : 0;
                assert_int_equal(slot.lns, want_lns);
                if (want_lns) {
                    /* again on an arena block scribbled over: the executor zeroes the counters */
                    sj_block *blk = sj_pool_get(&pool, 1);
                    assert_non_null(blk);
                    memset(sj_block_data(blk), 0x5a, blk->cap);
                    sj_pool_put(&pool, blk);
                    tu_poison(&fo[0]);
                    if (sj_exec_fused(&x, tr.p, fns)) fail_msg("fused again: %s", sj_last_error());
                    assert_int_equal(slot.lns, 2);
                    if (!tu_check_like_eager_as(&fo[0], &eo[0], fo[0].dtype, what))
                        fail_msg("%s: differs from eager the second time", what);
                }
                if (mod) be->unload(be, mod);
                untrace(&tr);
                tu_free_all();
            }
    sj_pool_destroy(&pool);
    be->destroy(be);
    sj_runtime_destroy(rt);
}

#ifdef SJ_WITH_CUDA

/* -- On the device ----------------------------------------------------------------- */

static sj_runtime *cpu; /* the eager reference */

static sj_runtime *gpu_runtime_in(int cuda_gemm, const char *cache_dir) {
    sj_runtime_config cfg = tu_cuda_config();
    cfg.cache_dir = cache_dir;
    cfg.compile_mode = SJ_COMPILE_SYNC;
    cfg.log_mask = cuda_gemm == 1 ? SJ_LOG_PERF : 0; /* the tuner's times and choices */
    if (cache_dir) cfg.log_mask |= SJ_LOG_WARN | SJ_LOG_COMPILE; /* what the cache did */
    cfg.cuda_graphs = 0;
    cfg.cuda_gemm = cuda_gemm;
    cfg.cuda_gemm_ln = 1; /* (the LayerNorm models' products take it inside) */
    sj_runtime *rt = NULL;
    if (sj_runtime_create(&cfg, &rt)) fail_msg("CUDA runtime: %s", sj_last_error());
    return rt;
}

static sj_runtime *gpu_runtime(int cuda_gemm) { return gpu_runtime_in(cuda_gemm, NULL); }

static sj_tensor to_dev(sj_runtime *rt, const sj_tensor *h) {
    sj_tensor d = *h;
    sj_cuda *cu = sj_cuda_of(rt->backend);
    size_t bytes = (size_t)tu_numel(h) * sj_dtype_size(h->dtype);
    CUdeviceptr p = sj_cuda_alloc(cu, bytes ? bytes : 16, cu->stream);
    assert_true(p != 0);
    if (bytes) assert_int_equal(sj_cuda_to_device(cu, p, h->data, bytes), SJ_OK);
    d.data = (void *)(uintptr_t)p;
    d.device = SJ_CUDA;
    return d;
}

static sj_tensor to_host(sj_runtime *rt, const sj_tensor *d) {
    sj_tensor h = tu_tensor(d->dtype, d->rank, d->shape);
    size_t bytes = (size_t)tu_numel(&h) * sj_dtype_size(d->dtype);
    sj_cuda_bind(sj_cuda_of(rt->backend));
    if (bytes)
        assert_int_equal(sj_cuda_to_host(sj_cuda_of(rt->backend), h.data, (CUdeviceptr)(uintptr_t)d->data, bytes),
                         SJ_OK);
    return h;
}

static bool explains(const sj_fn *fn, const char *what) {
    char *s = tu_explain(fn);
    bool r = strstr(s, what) != NULL;
    if (!r && getenv("SJ_TEST_VERBOSE")) fprintf(stderr, "%s\n", s);
    free(s);
    return r;
}

/* One call of fn on rt (device inputs din) and of cfn on the CPU (the
 * same inputs on the host, in): the device's result against float64 (ref,
 * mag: n values) and the CPU's eager run. */
static void gm_check_call(sj_runtime *rt, sj_fn *fn, sj_fn *cfn, const gm *m, sj_tensor *din, sj_tensor *in,
                          const double *ref, const double *mag, int64_t n, const char *what) {
    sj_tensor gout = {0}, cout = {0};
    if (sj_call(fn, din, gm_inputs(m), &gout, 1)) fail_msg("%s: GPU: %s", what, sj_last_error());
    if (sj_call(cfn, in, gm_inputs(m), &cout, 1)) fail_msg("%s: CPU: %s", what, sj_last_error());
    sj_tensor h = to_host(rt, &gout);
    if (!tu_check_mag(&h, ref, mag, 4e-3, what)) fail_msg("%s: differs from float64", what);
    double *eg = malloc(sizeof(double) * (size_t)n);
    assert_non_null(eg);
    for (int64_t i = 0; i < n; i++) eg[i] = tu_get(&cout, i);
    if (!tu_check_mag(&h, eg, mag, 4e-3, what)) fail_msg("%s: differs from the CPU's eager run", what);
    free(eg);
    sj_tensor_free(rt, &gout);
    sj_tensor_free(cpu, &cout);
}

/* m as a function of rt under policy dyn, hot at its first call and never
 * specialized, and as the eager reference on the CPU. */
static void gm_fns(sj_runtime *rt, gm *m, sj_dynamic dyn, sj_fn **fn, sj_fn **cfn) {
    sj_fn_options o;
    sj_fn_options_init(&o);
    o.dynamic = dyn;
    o.hot_threshold = 1;
    o.specialize_threshold = 1000000;
    assert_int_equal(sj_fn_create(rt, "gemm", gm_inputs(m), gm_model, m, &o, fn), SJ_OK);
    sj_fn_options_init(&o);
    o.dynamic = SJ_DYNAMIC_STATIC;
    assert_int_equal(sj_fn_create(cpu, "ref", gm_inputs(m), gm_model, m, &o, cfn), SJ_OK);
}

/* Calls of m at each S (x [2, S, K]) on rt, against float64 and the CPU's
 * eager run; want_tune 1 / 0: whether the products must have been timed
 * (-1: either); *st_out (if not NULL) the function's statistics at the
 * end. */
static void run_gm_st(sj_runtime *rt, gm *m, sj_dynamic dyn, const int64_t *seqs, int n_seqs, bool want_gemm,
                      int want_tune, sj_stats *st_out) {
    sj_fn *fn, *cfn;
    gm_fns(rt, m, dyn, &fn, &cfn);
    for (int s = 0; s < n_seqs; s++) {
        int64_t Sq = seqs[s], M = 2 * Sq, Nout = gm_ffn(m->kind) ? m->K : m->N;
        sj_tensor in[2] = {tu_tensor(m->dt, 3, S(2, Sq, m->K)), tu_tensor(m->dt, 3, S(2, Sq, m->N))};
        tu_fill_range(&in[0], -1, 1);
        tu_fill_range(&in[1], -1, 1);
        sj_tensor din[2] = {to_dev(rt, &in[0]), to_dev(rt, &in[1])};
        double *ref = malloc(sizeof(double) * (size_t)(M * Nout)), *mag = malloc(sizeof(double) * (size_t)(M * Nout));
        assert_true(ref && mag);
        gm_ref(m, in, M, ref, mag);
        char what[96];
        snprintf(what, sizeof what, "model %d %s S=%lld gemm %d", m->kind, dyn == SJ_DYNAMIC_SYMBOLIC ? "sym" : "static",
                 (long long)Sq, want_gemm);
        for (int rep = 0; rep < 2; rep++) /* the first call compiles (sync), both run fused */
            gm_check_call(rt, fn, cfn, m, din, in, ref, mag, M * Nout, what);
        free(ref), free(mag);
        /* not tu_free_all() here: the model's weights (gm_init's) are
         * tu_ tensors too, read by the next length's reference; freeing
         * them made the reference read freed memory (the first H100 run
         * failed at the second length with reference values no K=64
         * product of these inputs can reach) */
        sj_cuda *cu = sj_cuda_of(rt->backend);
        for (int i = 0; i < 2; i++) sj_cuda_free(cu, (CUdeviceptr)(uintptr_t)din[i].data, cu->stream);
    }
    sj_stats st;
    sj_fn_stats(fn, &st);
    if (st.fused_symbolic_calls + st.fused_specialized_calls == 0) fail_msg("model %d: no fused call", m->kind);
    bool named = explains(fn, "generated product, tile ");
    if (named != want_gemm) fail_msg("model %d: explain %s the generated product", m->kind, named ? "names" : "lacks");
    if (want_gemm && m->kind != M_SIGMOID && m->kind != M_LN && !explains(fn, "epilogue inside"))
        fail_msg("model %d: the epilogue is not inside", m->kind);
    if (want_gemm && (m->kind == M_LN || m->kind == M_FFN_LN) && !explains(fn, "layer_norm inside"))
        fail_msg("model %d: the LayerNorm is not inside", m->kind);
    /* the tuner's time is counted where it ran, and only there */
    if (want_tune >= 0 && (st.tune_ms > 0) != (want_tune == 1))
        fail_msg("model %d: %.3f ms timing products with cuda_gemm %d", m->kind, st.tune_ms, rt->cfg.cuda_gemm);
    printf("  model %d %s: %llu fused calls, generated product %s, %.1f ms timing products\n", m->kind,
           dyn == SJ_DYNAMIC_SYMBOLIC ? "symbolic" : "static",
           (unsigned long long)(st.fused_symbolic_calls + st.fused_specialized_calls), named ? "on" : "off", st.tune_ms);
    if (st_out) *st_out = st;
    sj_fn_destroy(fn);
    sj_fn_destroy(cfn);
}

static void run_gm(sj_runtime *rt, gm *m, sj_dynamic dyn, const int64_t *seqs, int n_seqs, bool want_gemm) {
    run_gm_st(rt, m, dyn, seqs, n_seqs, want_gemm, rt->cfg.cuda_gemm == 1, NULL);
}

static void test_gemm_on_device(void **state) {
    (void)state;
    static const int64_t seqs[] = {16, 33, 128, 512};
    struct {
        int kind;
        int64_t K, N;
    } cases[] = {{M_RELU, 64, 128},   {M_GELU_RES, 128, 256}, {M_CAST, 96, 192}, {M_FFN, 384, 1536},
                 {M_SIGMOID, 64, 128}, {M_LN, 768, 768},       {M_FFN_LN, 384, 1536}};
    /* 2 .. 5: every tile variant forced; 1: tuned (the choice in the perf
     * log); 0: off */
    /* SJ_GEMM_MODE=k: mode k alone (a GPU session runs each mode in a
     * process of its own, to see every mode's verdict) */
    const char *only = getenv("SJ_GEMM_MODE");
    for (int mode = 5; mode >= 0; mode--) {
        if (only && *only && atoi(only) != mode) continue;
        printf("SHAPEJIT_CUDA_GEMM=%d\n", mode);
        sj_runtime *rt = gpu_runtime(mode);
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
            gm m;
            gm_init(&m, cases[c].kind, SJ_F16, cases[c].K, cases[c].N);
            run_gm(rt, &m, SJ_DYNAMIC_SYMBOLIC, seqs, 4, mode != 0);
            if (mode <= 2) run_gm(rt, &m, SJ_DYNAMIC_STATIC, seqs, 2, mode != 0);
            tu_free_all(); /* the case's weights and inputs */
        }
        sj_runtime_destroy(rt);
    }
}

/* The tuner's choice is kept in the kernel cache: a second process (here
 * a second runtime on the same directory) loads the units and their
 * choice and times nothing (tune_ms 0), with the same results. */
static void test_tune_cached(void **state) {
    (void)state;
    char dir[256];
    assert_int_equal(tu_mkdtemp(dir, sizeof dir, "sj_gemm_tune"), 0);
    static const int64_t seqs[] = {16, 200};
    sj_stats st[2];
    for (int run = 0; run < 2; run++) {
        sj_runtime *rt = gpu_runtime_in(1, dir);
        if (!rt->cache) fail_msg("no kernel cache in %s: %s", dir, rt->cache_error);
        gm m;
        gm_init(&m, M_GELU_RES, SJ_F16, 128, 256);
        run_gm_st(rt, &m, SJ_DYNAMIC_SYMBOLIC, seqs, 2, true, run == 0, &st[run]);
        tu_free_all();
        sj_runtime_destroy(rt);
    }
    printf("  cold: %llu compiles, %.1f ms timing products; warm: %llu of %llu from the cache, %.1f ms\n",
           (unsigned long long)st[0].compiles, st[0].tune_ms, (unsigned long long)st[1].compile_cache_hits,
           (unsigned long long)st[1].compiles, st[1].tune_ms);
    assert_true(st[0].tune_ms > 0);
    assert_int_equal(st[0].compile_cache_hits, 0);
    assert_true(st[1].compiles > 0);
    assert_int_equal(st[1].compile_cache_hits, st[1].compiles);
    assert_true(st[1].tune_ms == 0);
    tu_rmtree(dir);
}

/* Two functions of one model, one after the other in one runtime, no
 * cache: the second's unit is the first's (the same source, the same
 * key), and its products' choice comes from the device's memo: nothing
 * timed (as for the symbolic entries of a warm-up's buckets, which share
 * one unit). */
static void test_tune_shared(void **state) {
    (void)state;
    static const int64_t seqs[] = {16, 200};
    sj_runtime *rt = gpu_runtime(1);
    gm m;
    gm_init(&m, M_GELU_RES, SJ_F16, 128, 256);
    sj_stats st[2];
    for (int f = 0; f < 2; f++) run_gm_st(rt, &m, SJ_DYNAMIC_SYMBOLIC, seqs, 2, true, f == 0, &st[f]);
    printf("  first: %.1f ms timing products; second: %llu compile, %.1f ms\n", st[0].tune_ms,
           (unsigned long long)st[1].compiles, st[1].tune_ms);
    assert_true(st[0].tune_ms > 0);
    assert_int_equal(st[1].compiles, 1);
    assert_true(st[1].tune_ms == 0);
    tu_free_all();
    sj_runtime_destroy(rt);
}

/* A quick unit (cfg.compile_quick, background compiles) holds its
 * products as stubs that trap (SJ_CUDA_QUICK_MACRO: most of a unit's
 * compile time saved) and no function for them: its calls run the
 * device's products and nothing is timed for it, even with a variant
 * forced (cuda_gemm 2); the full unit
 * that replaces it is timed (cuda_gemm 1) or forced and runs its
 * generated products. Every call against float64 and the CPU's eager run
 * (a stub that ran would fail the call). */
static void test_quick_units(void **state) {
    (void)state;
    for (int mode = 1; mode <= 2; mode++) {
        sj_runtime_config cfg = tu_cuda_config();
        cfg.compile_mode = SJ_COMPILE_ASYNC;
        cfg.compile_quick = 1;
        cfg.cuda_graphs = 0;
        cfg.cuda_gemm = mode;
        sj_runtime *rt = NULL;
        if (sj_runtime_create(&cfg, &rt)) fail_msg("CUDA runtime: %s", sj_last_error());
        const sj_cuda *cu = sj_cuda_of(rt->backend);
        if (cu->nvrtc_major * 100 + cu->nvrtc_minor < SJ_NVRTC_QUICK_SINCE) {
            printf("  skipped: NVRTC %d.%d has no quick compile\n", cu->nvrtc_major, cu->nvrtc_minor);
            sj_runtime_destroy(rt);
            return;
        }
        gm m;
        gm_init(&m, M_GELU_RES, SJ_F16, 128, 256);
        sj_fn *fn, *cfn;
        gm_fns(rt, &m, SJ_DYNAMIC_SYMBOLIC, &fn, &cfn);
        const int64_t Sq = 40, M = 2 * Sq;
        sj_tensor in[2] = {tu_tensor(m.dt, 3, S(2, Sq, m.K)), tu_tensor(m.dt, 3, S(2, Sq, m.N))};
        tu_fill_range(&in[0], -1, 1);
        tu_fill_range(&in[1], -1, 1);
        sj_tensor din[2] = {to_dev(rt, &in[0]), to_dev(rt, &in[1])};
        double *ref = malloc(sizeof(double) * (size_t)(M * m.N)), *mag = malloc(sizeof(double) * (size_t)(M * m.N));
        assert_true(ref && mag);
        gm_ref(&m, in, M, ref, mag);
        const char *what = tu_label("quick unit, cuda_gemm %d", mode);
        gm_check_call(rt, fn, cfn, &m, din, in, ref, mag, M * m.N, what); /* eager: the compile queued */
        sj_stats st;
        sj_fn_stats(fn, &st);
        for (int i = 0; i < 30000 && st.compiles == 0; i++) {
            usleep(1000);
            sj_fn_stats(fn, &st);
        }
        assert_int_equal(st.compiles, 1);
        assert_int_equal(st.quick_compiles, 1);
        assert_true(st.tune_ms == 0); /* nothing timed for the quick unit */
        gm_check_call(rt, fn, cfn, &m, din, in, ref, mag, M * m.N, what); /* the quick unit */
        sj_fn_stats(fn, &st);
        assert_int_equal(st.eager_calls, 1);
        /* (the full unit takes hundreds of ms: still the quick one) */
        assert_int_equal(st.quick_replaced, 0);
        assert_int_equal(sj_fn_wait_idle(fn, 60000), SJ_OK);
        gm_check_call(rt, fn, cfn, &m, din, in, ref, mag, M * m.N, what); /* the full unit */
        sj_fn_stats(fn, &st);
        assert_int_equal(st.quick_replaced, 1);
        assert_int_equal(st.eager_calls, 1);
        if ((st.tune_ms > 0) != (mode == 1)) fail_msg("%s: %.3f ms timing products", what, st.tune_ms);
        if (!explains(fn, "generated product, tile ")) fail_msg("%s: the full unit names no generated product", what);
        printf("  cuda_gemm %d: quick unit, then the full one (%.1f ms timing products)\n", mode, st.tune_ms);
        sj_cuda *c = sj_cuda_of(rt->backend);
        for (int i = 0; i < 2; i++) sj_cuda_free(c, (CUdeviceptr)(uintptr_t)din[i].data, c->stream);
        free(ref), free(mag);
        sj_fn_destroy(fn);
        sj_fn_destroy(cfn);
        tu_free_all();
        sj_runtime_destroy(rt);
    }
}

/* A LayerNorm inside the product under CUDA graphs (cuda_gemm 2: variant
 * 0 forced, so the LayerNorm kernels run whatever the tuner would choose;
 * cuda_gemm_ln 1): a graph per shape (static), captured once its buffers
 * came back SJ_GRAPH_AFTER times and replayed (the counters' memset one
 * of its nodes); and bucket graphs (symbolic, buckets up to 24 and 48
 * tokens), captured at the bucket's edge and replayed at smaller sizes
 * (the memset recorded and checked, not queued again). Every call's
 * result against float64 (a counter left nonzero by one call would make
 * the next one's LayerNorm run early or never: wrong rows). */
static void test_ln_graphs(void **state) {
    (void)state;
    sj_runtime_config cfg = tu_cuda_config();
    cfg.compile_mode = SJ_COMPILE_SYNC;
    cfg.cuda_graphs = 1;
    cfg.cuda_gemm = 2;
    cfg.cuda_gemm_ln = 1;
    sj_runtime *rt = NULL;
    if (sj_runtime_create(&cfg, &rt)) fail_msg("CUDA runtime: %s", sj_last_error());
    sj_cuda *cu = sj_cuda_of(rt->backend);
    static const int kinds[] = {M_LN, M_FFN_LN};
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++)
        for (int dyn = 0; dyn < 2; dyn++) {
            gm m;
            gm_init(&m, kinds[k], SJ_F16, kinds[k] == M_LN ? 768 : 384, kinds[k] == M_LN ? 768 : 1536);
            sj_fn_options o;
            sj_fn_options_init(&o);
            o.dynamic = dyn ? SJ_DYNAMIC_SYMBOLIC : SJ_DYNAMIC_STATIC;
            o.hot_threshold = 1;
            o.specialize_threshold = 1000000;
            sj_fn *fn;
            assert_int_equal(sj_fn_create(rt, "ln_graphs", 1, gm_model, &m, &o, &fn), SJ_OK);
            if (dyn) assert_int_equal(sj_set_buckets(fn, 0, 1, (const int64_t[]){24, 48}, 2), SJ_OK);
            /* static: one length; symbolic: three lengths of the first bucket, in turn */
            const int64_t seqs[3] = {16, dyn ? 20 : 16, dyn ? 24 : 16};
            sj_tensor hin[3], din[3], dout[3];
            double *ref[3], *mag[3];
            int64_t Nout = gm_ffn(m.kind) ? m.K : m.N;
            for (int s = 0; s < 3; s++) {
                int64_t M = 2 * seqs[s];
                hin[s] = tu_tensor(m.dt, 3, S(2, seqs[s], m.K));
                tu_fill_range(&hin[s], -1, 1);
                din[s] = to_dev(rt, &hin[s]);
                sj_tensor ho = tu_tensor(m.dt, 3, S(2, seqs[s], Nout));
                dout[s] = to_dev(rt, &ho);
                ref[s] = malloc(sizeof(double) * (size_t)(M * Nout));
                mag[s] = malloc(sizeof(double) * (size_t)(M * Nout));
                assert_true(ref[s] && mag[s]);
                gm_ref(&m, &hin[s], M, ref[s], mag[s]);
            }
            const char *what = tu_label("ln graphs, model %d %s", m.kind, dyn ? "symbolic, buckets" : "static");
            for (int i = 0; i < 3 * SJ_GRAPH_AFTER + 9; i++) {
                int s = i % 3;
                if (sj_call(fn, &din[s], 1, &dout[s], 1)) fail_msg("%s: call %d: %s", what, i, sj_last_error());
                sj_tensor h = to_host(rt, &dout[s]);
                if (!tu_check_mag(&h, ref[s], mag[s], 4e-3, what)) fail_msg("%s: call %d differs from float64", what, i);
                if (i == 3 * SJ_GRAPH_AFTER) assert_int_equal(sj_fn_wait_idle(fn, -1), SJ_OK);
            }
            sj_stats st;
            sj_fn_stats(fn, &st);
            printf("  %s: %llu graphs (%llu bucket graphs), %llu calls from them\n", what, (unsigned long long)st.graphs,
                   (unsigned long long)st.bucket_graphs, (unsigned long long)st.graph_calls);
            if (!explains(fn, "layer_norm inside")) fail_msg("%s: the LayerNorm is not inside", what);
            assert_true(st.graphs >= 1);
            assert_true(st.graph_calls >= 3);
            assert_int_equal(st.graph_failures, 0);
            for (int s = 0; s < 3; s++) {
                sj_cuda_free(cu, (CUdeviceptr)(uintptr_t)din[s].data, cu->stream);
                sj_cuda_free(cu, (CUdeviceptr)(uintptr_t)dout[s].data, cu->stream);
                free(ref[s]), free(mag[s]);
            }
            sj_fn_destroy(fn);
            tu_free_all();
        }
    sj_runtime_destroy(rt);
}

#endif /* SJ_WITH_CUDA */

int main(void) {
    const char *seed = getenv("SJ_TEST_SEED");
    tu_seed(seed ? strtoull(seed, NULL, 0) : 0x9e33);
    const struct CMUnitTest cpu_tests[] = {cmocka_unit_test(test_plan_marks), cmocka_unit_test(test_plan_split),
                                           cmocka_unit_test(test_exec_wiring)};
    int r = cmocka_run_group_tests_name("gemm_jit (plan)", cpu_tests, NULL, NULL);
#ifdef SJ_WITH_CUDA
    if (!tu_cuda_present()) return r;
    sj_runtime_config cfg = tu_cuda_config(); /* the same settings on the CPU, eager only */
    cfg.backend = SJ_BACKEND_CPU;
    cfg.compile_mode = SJ_COMPILE_OFF;
    if (sj_runtime_create(&cfg, &cpu)) return 1;
    const struct CMUnitTest gpu_tests[] = {cmocka_unit_test(test_gemm_on_device), cmocka_unit_test(test_tune_cached),
                                           cmocka_unit_test(test_tune_shared), cmocka_unit_test(test_quick_units),
                                           cmocka_unit_test(test_ln_graphs)};
    r |= cmocka_run_group_tests_name("gemm_jit (device)", gpu_tests, NULL, NULL);
    sj_runtime_destroy(cpu);
#else
    printf("skipped: no CUDA device (built without the CUDA backend)\n");
#endif
    return r;
}
