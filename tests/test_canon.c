/* The canonical order of traced graphs (jit/ir/canon.c): one graph made by
 * model functions that call the same ops in different orders (C leaves the
 * order of a call's arguments unspecified, so nested op calls trace in
 * whichever order the compiler chose) gives byte-identical generated
 * source, C and CUDA C (the CUDA generator runs without a GPU), and so the
 * same kernel cache keys.
 *
 * - A model (a product with a bias, gelu, sigmoid, scalars, a softmax, a
 *   node no output needs) written three ways: one op per statement with
 *   its chain first, the same with the sigmoid, the parameters and the
 *   dead node first, and nested as users write it; traced static and
 *   symbolic: the same graph listing, parameters and constants in the
 *   same order, the same source.
 * - Slices made in either order: their sizes (atoms of the expression
 *   pool, numbered as made) print the same in generated source.
 * - Random programs of elementwise ops, scalars, parameters, softmax and
 *   mean (exact duplicates and dead nodes included), each traced in two
 *   random topological orders: the same listing and source.
 * - Through the public API: each variant in a runtime of its own sharing
 *   one disk cache (the first compiles; the others load every kernel from
 *   it and store nothing), the SHAPEJIT_DUMP files byte-identical, the
 *   outputs equal to eager and to a float64 reference; the same for random
 *   programs in two orders against a float64 interpreter.
 */
/* cmocka.h needs these first, in this order */
/* clang-format off */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
/* clang-format on */

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jit/shapejit.h"
#include "jit/trace.h"
#include "specialize/codegen.h"
#include "specialize/codegen_cuda.h"
#include "specialize/fusion.h"
#include "tests/util.h"
#include "tests/util_patterns.h"

#define H 48 /* the hidden size the parameters fix */

/* -- The model, three ways ------------------------------------------------------ */

/* W, V, bm [H], M [H, H] */
static sj_tensor W, V, M, BM;

/* h = a @ M + bm; y = gelu(h * W + c) * sigmoid(a * V);
 * outputs y + 0.5, tanh(a) * 2, softmax(y * 2); exp(c) is made and unused */
static sj_status m_chain_first(sj_tracer *t, const sj_val *in, int n, void *u) {
    sj_val a = in[0], c = in[1];
    sj_val w = sj_param(t, &W), v = sj_param(t, &V), m = sj_param(t, &M), bm = sj_param(t, &BM);
    sj_val mm = sj_matmul(t, a, m);
    sj_val h = sj_add(t, mm, bm);
    sj_val hw = sj_mul(t, h, w);
    sj_val s = sj_add(t, hw, c);
    sj_val g = sj_gelu(t, s);
    sj_val av = sj_mul(t, a, v);
    sj_val sg = sj_sigmoid(t, av);
    sj_val y = sj_mul(t, g, sg);
    sj_val half = sj_scalar(t, 0.5), two = sj_scalar(t, 2.0);
    sj_val o0 = sj_add(t, y, half);
    sj_val th = sj_tanh(t, a);
    sj_val o1 = sj_mul(t, th, two);
    sj_val y2 = sj_mul(t, y, two);
    sj_val o2 = sj_softmax(t, y2, -1);
    sj_exp(t, c); /* dead */
    sj_output(t, o0);
    sj_output(t, o1);
    return sj_output(t, o2);
}

/* the same graph: the dead node, the scalars, the sigmoid and tanh first,
 * the parameters made in the opposite order */
static sj_status m_sigmoid_first(sj_tracer *t, const sj_val *in, int n, void *u) {
    sj_val a = in[0], c = in[1];
    sj_exp(t, c); /* dead */
    sj_val two = sj_scalar(t, 2.0), half = sj_scalar(t, 0.5);
    sj_val th = sj_tanh(t, a);
    sj_val o1 = sj_mul(t, th, two);
    sj_val bm = sj_param(t, &BM), v = sj_param(t, &V);
    sj_val av = sj_mul(t, a, v);
    sj_val sg = sj_sigmoid(t, av);
    sj_val m = sj_param(t, &M);
    sj_val mm = sj_matmul(t, a, m);
    sj_val h = sj_add(t, mm, bm);
    sj_val w = sj_param(t, &W);
    sj_val hw = sj_mul(t, h, w);
    sj_val s = sj_add(t, hw, c);
    sj_val g = sj_gelu(t, s);
    sj_val y = sj_mul(t, g, sg);
    sj_val y2 = sj_mul(t, y, two);
    sj_val o2 = sj_softmax(t, y2, -1);
    sj_val o0 = sj_add(t, y, half);
    sj_output(t, o0);
    sj_output(t, o1);
    return sj_output(t, o2);
}

/* the same graph nested, as users write it: the order is the compiler's */
static sj_status m_nested(sj_tracer *t, const sj_val *in, int n, void *u) {
    sj_val a = in[0], c = in[1], two = sj_scalar(t, 2.0);
    sj_val y = sj_mul(t, sj_gelu(t, sj_add(t, sj_mul(t, sj_add(t, sj_matmul(t, a, sj_param(t, &M)), sj_param(t, &BM)),
                                                    sj_param(t, &W)),
                                             c)),
                      sj_sigmoid(t, sj_mul(t, a, sj_param(t, &V))));
    sj_exp(t, c); /* dead */
    sj_output(t, sj_add(t, y, sj_scalar(t, 0.5)));
    sj_output(t, sj_mul(t, sj_tanh(t, a), two));
    return sj_output(t, sj_softmax(t, sj_mul(t, y, two), -1));
}

static const sj_model_fn variants[] = {m_chain_first, m_sigmoid_first, m_nested};
static const char *const variant_names[] = {"chain_first", "sigmoid_first", "nested"};
#define N_VARIANTS 3

static void make_params(void) {
    int64_t h = H;
    W = tu_tensor(SJ_F32, 1, &h);
    V = tu_tensor(SJ_F32, 1, &h);
    BM = tu_tensor(SJ_F32, 1, &h);
    M = tu_tensor(SJ_F32, 2, (int64_t[]){H, H});
    tu_fill_random(&W);
    tu_fill_random(&V);
    tu_fill_random(&BM);
    tu_fill_range(&M, -0.2, 0.2);
}

static void model_inputs(sj_tensor *in, int64_t S) {
    in[0] = tu_tensor(SJ_F32, 2, (int64_t[]){S, H});
    in[1] = tu_tensor(SJ_F32, 2, (int64_t[]){S, H});
    tu_fill_random(&in[0]);
    tu_fill_random(&in[1]);
}

/* The model's three outputs in float64 (out[k]: S*H each). */
static void model_ref(const sj_tensor *in, int64_t S, double *out[3]) {
    for (int64_t i = 0; i < S; i++) {
        double y[H], mx = -INFINITY, sum = 0;
        for (int j = 0; j < H; j++) {
            double h = tu_get(&BM, j);
            for (int k = 0; k < H; k++) h += tu_get(&in[0], i * H + k) * tu_get(&M, k * H + j);
            double a = tu_get(&in[0], i * H + j);
            double s = h * tu_get(&W, j) + tu_get(&in[1], i * H + j);
            y[j] = tu_ref_unary1(SJ_OP_GELU, s) * tu_ref_unary1(SJ_OP_SIGMOID, a * tu_get(&V, j));
            out[0][i * H + j] = y[j] + 0.5;
            out[1][i * H + j] = tanh(a) * 2.0;
            mx = fmax(mx, 2.0 * y[j]);
        }
        for (int j = 0; j < H; j++) sum += exp(2.0 * y[j] - mx);
        for (int j = 0; j < H; j++) out[2][i * H + j] = exp(2.0 * y[j] - mx) / sum;
    }
}

/* -- Tracing and generating -------------------------------------------------------- */

typedef struct traced {
    sj_graph *g;
    sj_fplan *p;
    int64_t sv[64];
    char *listing;            /* sj_graph_dump */
    char *src[4];             /* C spec, C sym, CUDA spec, CUDA sym (sym: NULL when static) */
} traced;

static void trace_one(sj_model_fn model, void *user, const sj_tensor *ins, int n_in, bool sym, traced *tr) {
    static const int64_t fixed[] = {H, 0};
    tu_pol pl = {.sym = sym, .fixed = fixed};
    sj_trace_req req = {.fn_name = "canon", .model = model, .user = user, .inputs = ins, .n_inputs = n_in,
                        .dim_policy = tu_policy, .dim_ctx = &pl};
    sj_trace_result res;
    memset(tr, 0, sizeof *tr);
    sj_status st = sj_trace(&req, &res);
    if (st) fail_msg("trace: %s", sj_last_error());
    free(res.facts);
    tr->g = res.graph;
    for (int s = 0; s < pl.n; s++) tr->sv[s] = ins[pl.in[s]].shape[pl.ax[s]];
    size_t len;
    FILE *f = open_memstream(&tr->listing, &len);
    assert_non_null(f);
    sj_graph_dump(tr->g, f);
    fclose(f);
    tr->p = sj_fuse(tr->g, ins);
    assert_non_null(tr->p);
    tr->src[0] = sj_codegen_c(tr->g, tr->p, tr->sv, NULL, NULL);
    tr->src[2] = sj_codegen_cuda(tr->g, tr->p, tr->sv, NULL, NULL);
    assert_non_null(tr->src[0]);
    assert_non_null(tr->src[2]);
    if (sym) {
        tr->src[1] = sj_codegen_c(tr->g, tr->p, NULL, NULL, NULL);
        tr->src[3] = sj_codegen_cuda(tr->g, tr->p, NULL, NULL, NULL);
        assert_non_null(tr->src[1]);
        assert_non_null(tr->src[3]);
    }
}

static void traced_free(traced *tr) {
    for (int i = 0; i < 4; i++) free(tr->src[i]);
    free(tr->listing);
    sj_fplan_free(tr->p);
    sj_graph_destroy(tr->g);
}

/* The first line where a and b differ, for the failure message. */
static void first_diff(const char *a, const char *b, char *out, size_t n) {
    const char *la = a, *lb = b;
    while (*a && *a == *b) {
        if (*a == '\n') la = a + 1, lb = b + 1;
        a++, b++;
    }
    int ea = (int)strcspn(la, "\n"), eb = (int)strcspn(lb, "\n");
    snprintf(out, n, "\n  < %.*s\n  > %.*s", ea > 200 ? 200 : ea, la, eb > 200 ? 200 : eb, lb);
}

/* Two traces of one graph: the same listing, parameters, constants and
 * generated source. */
static void assert_same(const traced *a, const traced *b, const char *what) {
    static const char *const forms[] = {"C spec", "C sym", "CUDA spec", "CUDA sym"};
    char d[512];
    if (strcmp(a->listing, b->listing)) {
        first_diff(a->listing, b->listing, d, sizeof d);
        fail_msg("%s: graph listings differ:%s\n%s-----\n%s", what, d, a->listing, b->listing);
    }
    assert_int_equal(a->g->n_params, b->g->n_params);
    for (int k = 0; k < a->g->n_params; k++)
        if (a->g->params[k].data != b->g->params[k].data) fail_msg("%s: parameter %d differs", what, k);
    assert_int_equal(a->g->n_consts, b->g->n_consts);
    for (int k = 0; k < a->g->n_consts; k++)
        if (a->g->consts[k].bits != b->g->consts[k].bits) fail_msg("%s: constant %d differs", what, k);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(!a->src[i], !b->src[i]);
        if (a->src[i] && strcmp(a->src[i], b->src[i])) {
            first_diff(a->src[i], b->src[i], d, sizeof d);
            fail_msg("%s: %s source differs:%s", what, forms[i], d);
        }
    }
}

static void test_model_variants(void **state) {
    make_params();
    for (int sym = 0; sym < 2; sym++) {
        sj_tensor in[2];
        model_inputs(in, 37);
        traced tr[N_VARIANTS];
        for (int v = 0; v < N_VARIANTS; v++) trace_one(variants[v], NULL, in, 2, sym, &tr[v]);
        /* the product's bias add is folded, the dead exp kept */
        int folded = 0, exps = 0;
        for (int i = 0; i < tr[0].g->n_nodes; i++) {
            folded += tr[0].g->nodes[i].fold == SJ_FOLDED;
            exps += tr[0].g->nodes[i].op == SJ_OP_EXP;
        }
        assert_int_equal(folded, 1);
        assert_int_equal(exps, 1);
        for (int v = 1; v < N_VARIANTS; v++) {
            char what[96];
            snprintf(what, sizeof what, "%s vs %s (%s)", variant_names[0], variant_names[v], sym ? "symbolic" : "static");
            assert_same(&tr[0], &tr[v], what);
        }
        for (int v = 0; v < N_VARIANTS; v++) traced_free(&tr[v]);
    }
}

/* Sizes a trace derives (a slice's min, a reshape's floordiv) are atoms of
 * the expression pool, numbered as made; printed in kernels, they must not
 * follow that order either (shapes/expr.c prints by structure). */
static sj_status m_slices(sj_tracer *t, const sj_val *in, int n, void *u) {
    bool b_first = u != NULL;
    sj_val a = SJ_NONE, b = SJ_NONE;
    if (b_first) b = sj_slice(t, in[0], 0, 1, 9, 1);
    a = sj_slice(t, in[0], 0, 0, 5, 1);
    if (!b_first) b = sj_slice(t, in[0], 0, 1, 9, 1);
    sj_val xs[2] = {a, b};
    sj_val cat = sj_concat(t, xs, 2, 0);
    return sj_output(t, sj_mul(t, sj_tanh(t, cat), sj_sigmoid(t, cat)));
}

static void test_derived_sizes(void **state) {
    sj_tensor in[2];
    model_inputs(in, 20);
    traced a, b;
    trace_one(m_slices, NULL, in, 1, true, &a);
    trace_one(m_slices, (void *)1, in, 1, true, &b);
    assert_non_null(strstr(a.listing, "min(s0, 5)"));
    assert_same(&a, &b, "slices made in either order");
    traced_free(&a);
    traced_free(&b);
}

/* -- Random programs ------------------------------------------------------------------- */

enum { P_UNARY, P_BINARY, P_SCALAR, P_PARAM, P_SOFTMAX, P_MEAN };
#define P_MAX 24
#define P_PARAMS 3
#define P_SCALARS 3

typedef struct pop {
    int kind;
    sj_op op;
    int a, b;    /* operands: op index (>= 0) or input -1 - i; b: BINARY only */
    int leaf;    /* SCALAR, PARAM: which one */
    int left;    /* SCALAR, PARAM: the leaf is the first operand */
    bool narrow; /* the result is [S, 1] (a mean, and what only reads means) */
    double bound;
} pop;

typedef struct prog {
    int n;
    pop ops[P_MAX];
    int n_out, outs[3];
    double scalars[P_SCALARS];
} prog;

typedef struct emission {
    const prog *p;
    int order[P_MAX]; /* a topological order of p's ops */
} emission;

static sj_tensor pparams[P_PARAMS];

static const sj_op unary_ops[] = {SJ_OP_NEG, SJ_OP_ABS, SJ_OP_TANH, SJ_OP_SIGMOID, SJ_OP_GELU, SJ_OP_SILU, SJ_OP_RELU};
static const sj_op binary_ops[] = {SJ_OP_ADD, SJ_OP_SUB, SJ_OP_MUL, SJ_OP_MAXIMUM, SJ_OP_MINIMUM};
#define NELEM(a) ((int)(sizeof(a) / sizeof((a)[0])))

static int pick_operand(const prog *p, int i) {
    int r = (int)tu_randint(0, i + 1); /* inputs count twice as often as one op */
    if (r >= i) return -1 - (r - i);
    return (int)tu_randint(r, i - 1); /* lean towards recent ops */
}

static bool operand_narrow(const prog *p, int a) { return a >= 0 && p->ops[a].narrow; }
static double operand_bound(const prog *p, int a) { return a >= 0 ? p->ops[a].bound : 2.0; }

static void random_prog(prog *p) {
    memset(p, 0, sizeof *p);
    p->n = (int)tu_randint(4, P_MAX);
    for (int k = 0; k < P_SCALARS; k++) p->scalars[k] = tu_uniform(-2, 2);
    for (int i = 0; i < p->n; i++) {
        pop *o = &p->ops[i];
        if (i > 1 && tu_randint(0, 6) == 0) { /* an exact duplicate of an earlier op */
            *o = p->ops[tu_randint(0, i - 1)];
            continue;
        }
        int r = (int)tu_randint(0, 9);
        o->kind = r < 3 ? P_UNARY : r < 6 ? P_BINARY : r < 7 ? P_SCALAR : r < 8 ? P_PARAM : r < 9 ? P_SOFTMAX : P_MEAN;
        o->a = pick_operand(p, i);
        o->b = pick_operand(p, i);
        o->leaf = (int)tu_randint(0, o->kind == P_PARAM ? P_PARAMS - 1 : P_SCALARS - 1);
        o->left = (int)tu_randint(0, 1);
        o->op = o->kind == P_UNARY ? unary_ops[tu_randint(0, NELEM(unary_ops) - 1)]
                                   : binary_ops[tu_randint(0, NELEM(binary_ops) - 1)];
        double ba = operand_bound(p, o->a), bb = o->kind == P_BINARY ? operand_bound(p, o->b) : 2.0;
        o->bound = o->kind == P_SOFTMAX ? 1.0
                   : o->kind == P_MEAN  ? ba
                   : o->kind == P_UNARY ? (o->op == SJ_OP_TANH || o->op == SJ_OP_SIGMOID ? 1.0 : ba + 1.0)
                   : o->op == SJ_OP_MUL ? ba * bb
                                        : ba + bb;
        if (o->bound > 1e3) { /* keep values in a range where f32 stays close to float64 */
            o->kind = P_UNARY;
            o->op = SJ_OP_TANH;
            o->bound = 1.0;
        }
        bool na = operand_narrow(p, o->a);
        o->narrow = o->kind == P_MEAN || (na && (o->kind == P_UNARY || o->kind == P_SOFTMAX || o->kind == P_SCALAR)) ||
                    (o->kind == P_BINARY && na && operand_narrow(p, o->b));
    }
    p->outs[0] = p->n - 1;
    p->n_out = 1 + (int)tu_randint(0, 2);
    for (int k = 1; k < p->n_out; k++) p->outs[k] = (int)tu_randint(0, p->n - 2);
}

/* A random topological order: any op whose operands are made may come next. */
static void random_order(const prog *p, int *order) {
    bool done[P_MAX] = {0};
    for (int k = 0; k < p->n; k++) {
        int ready[P_MAX], nr = 0;
        for (int i = 0; i < p->n; i++) {
            const pop *o = &p->ops[i];
            bool deps = (o->a < 0 || done[o->a]) && (o->kind != P_BINARY || o->b < 0 || done[o->b]);
            if (!done[i] && deps) ready[nr++] = i;
        }
        assert_true(nr > 0);
        order[k] = ready[tu_randint(0, nr - 1)];
        done[order[k]] = true;
    }
}

static sj_val unary_call(sj_tracer *t, sj_op op, sj_val x) {
    switch (op) {
    case SJ_OP_NEG: return sj_neg(t, x);
    case SJ_OP_ABS: return sj_abs(t, x);
    case SJ_OP_TANH: return sj_tanh(t, x);
    case SJ_OP_SIGMOID: return sj_sigmoid(t, x);
    case SJ_OP_GELU: return sj_gelu(t, x);
    case SJ_OP_SILU: return sj_silu(t, x);
    default: return sj_relu(t, x);
    }
}

static sj_val binary_call(sj_tracer *t, sj_op op, sj_val a, sj_val b) {
    switch (op) {
    case SJ_OP_ADD: return sj_add(t, a, b);
    case SJ_OP_SUB: return sj_sub(t, a, b);
    case SJ_OP_MUL: return sj_mul(t, a, b);
    case SJ_OP_MAXIMUM: return sj_maximum(t, a, b);
    default: return sj_minimum(t, a, b);
    }
}

/* The program's ops in the emission's order; parameters and scalars made
 * where first used. */
static sj_status m_prog(sj_tracer *t, const sj_val *in, int n, void *user) {
    const emission *e = user;
    const prog *p = e->p;
    sj_val v[P_MAX], par[P_PARAMS], sc[P_SCALARS];
    bool have_p[P_PARAMS] = {0}, have_s[P_SCALARS] = {0};
#define OPERAND(x) ((x) < 0 ? in[-1 - (x)] : v[(x)])
    for (int k = 0; k < p->n; k++) {
        int i = e->order[k];
        const pop *o = &p->ops[i];
        sj_val a = OPERAND(o->a), leaf = SJ_NONE;
        if (o->kind == P_PARAM) {
            if (!have_p[o->leaf]) par[o->leaf] = sj_param(t, &pparams[o->leaf]), have_p[o->leaf] = true;
            leaf = par[o->leaf];
        } else if (o->kind == P_SCALAR) {
            if (!have_s[o->leaf]) sc[o->leaf] = sj_scalar(t, p->scalars[o->leaf]), have_s[o->leaf] = true;
            leaf = sc[o->leaf];
        }
        switch (o->kind) {
        case P_UNARY: v[i] = unary_call(t, o->op, a); break;
        case P_BINARY: v[i] = binary_call(t, o->op, a, OPERAND(o->b)); break;
        case P_SCALAR:
        case P_PARAM: v[i] = o->left ? binary_call(t, o->op, leaf, a) : binary_call(t, o->op, a, leaf); break;
        case P_SOFTMAX: v[i] = sj_softmax(t, a, -1); break;
        default: v[i] = sj_mean(t, a, -1, 1); break;
        }
    }
    for (int k = 0; k < p->n_out; k++) sj_output(t, v[p->outs[k]]);
#undef OPERAND
    return SJ_OK;
}

/* The program in float64: vals[i] holds op i over [S, H] (a narrow op's
 * value repeated along each row). */
static void prog_ref(const prog *p, const sj_tensor *in, int64_t S, double *vals /* [P_MAX][S*H] */) {
    int64_t n = S * H;
    for (int i = 0; i < p->n; i++) {
        const pop *o = &p->ops[i];
        double *r = vals + (size_t)i * (size_t)n;
#define AT(x, e) ((x) < 0 ? tu_get(&in[-1 - (x)], (e)) : vals[(size_t)(x) * (size_t)n + (size_t)(e)])
        for (int64_t e = 0; e < n; e++) {
            double a = AT(o->a, e), l = o->kind == P_PARAM ? tu_get(&pparams[o->leaf], e % H) : p->scalars[o->leaf];
            switch (o->kind) {
            case P_UNARY: r[e] = tu_ref_unary1(o->op, a); break;
            case P_BINARY: r[e] = tu_ref_binary1(o->op, a, AT(o->b, e)); break;
            case P_SCALAR:
            case P_PARAM: r[e] = o->left ? tu_ref_binary1(o->op, l, a) : tu_ref_binary1(o->op, a, l); break;
            default: r[e] = a; break; /* rows below */
            }
        }
        if (o->kind == P_SOFTMAX || o->kind == P_MEAN)
            for (int64_t row = 0; row < S; row++) {
                double *x = r + row * H, mx = -INFINITY, sum = 0;
                bool narrow_in = operand_narrow(p, o->a);
                for (int j = 0; j < H; j++) mx = fmax(mx, x[j]), sum += x[j];
                if (o->kind == P_MEAN) {
                    for (int j = 0; j < H; j++) x[j] = narrow_in ? x[0] : sum / H;
                } else if (narrow_in) {
                    for (int j = 0; j < H; j++) x[j] = 1.0; /* softmax over an axis of 1 */
                } else {
                    double se = 0;
                    for (int j = 0; j < H; j++) se += exp(x[j] - mx);
                    for (int j = 0; j < H; j++) x[j] = exp(x[j] - mx) / se;
                }
            }
#undef AT
    }
}

static void make_pparams(void) {
    int64_t h = H;
    for (int k = 0; k < P_PARAMS; k++) {
        pparams[k] = tu_tensor(SJ_F32, 1, &h);
        tu_fill_random(&pparams[k]);
    }
}

static void test_random_orders(void **state) {
    make_pparams();
    for (int trial = 0; trial < 40; trial++) {
        prog p;
        random_prog(&p);
        emission e1 = {.p = &p}, e2 = {.p = &p};
        random_order(&p, e1.order);
        random_order(&p, e2.order);
        sj_tensor in[2];
        model_inputs(in, tu_randint(2, 40));
        for (int sym = 0; sym < 2; sym++) {
            traced a, b;
            trace_one(m_prog, &e1, in, 2, sym, &a);
            trace_one(m_prog, &e2, in, 2, sym, &b);
            char what[64];
            snprintf(what, sizeof what, "program %d (%d ops, %s)", trial, p.n, sym ? "symbolic" : "static");
            assert_same(&a, &b, what);
            traced_free(&a);
            traced_free(&b);
        }
        tu_free_all();
        make_pparams();
    }
}

/* -- Through the public API -------------------------------------------------------------- */

static sj_runtime *runtime(sj_compile_mode mode, const char *cache, const char *dump) {
    sj_runtime_config cfg;
    sj_runtime_config_init(&cfg);
    cfg.backend = SJ_BACKEND_CPU;
    cfg.log_mask = 0;
    cfg.compile_mode = mode;
    cfg.cache_dir = cache;
    cfg.dump_dir = dump;
    cfg.exec_threads = 2;
    sj_runtime *rt = NULL;
    assert_int_equal(sj_runtime_create(&cfg, &rt), SJ_OK);
    return rt;
}

static sj_fn *make_fn(sj_runtime *rt, sj_model_fn m, void *user) {
    sj_fn_options o;
    sj_fn_options_init(&o);
    o.dynamic = SJ_DYNAMIC_SYMBOLIC;
    o.hot_threshold = 1;
    sj_fn *fn = NULL;
    assert_int_equal(sj_fn_create(rt, "canon", 2, m, user, &o, &fn), SJ_OK);
    return fn;
}

static int count_files(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)))
        if (de->d_name[0] != '.') n++;
    closedir(d);
    return n;
}

static char *read_all(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *s = NULL;
    size_t cap = 0, len = 0, got;
    do {
        if (len + 4096 > cap) s = realloc(s, cap = (cap + 4096) * 2);
        got = fread(s + len, 1, cap - len - 1, f);
        len += got;
    } while (got > 0);
    fclose(f);
    s[len] = '\0';
    return s;
}

/* Every file of dump directory a is in b with the same bytes, and b has
 * no others. Returns how many. */
static int assert_same_dumps(const char *a, const char *b, const char *what) {
    DIR *d = opendir(a);
    assert_non_null(d);
    struct dirent *de;
    int n = 0;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.') continue;
        char pa[600], pb[600], diff[512];
        snprintf(pa, sizeof pa, "%s/%s", a, de->d_name);
        snprintf(pb, sizeof pb, "%s/%s", b, de->d_name);
        char *sa = read_all(pa), *sb = read_all(pb);
        if (!sb) fail_msg("%s: %s has no %s", what, b, de->d_name);
        if (strcmp(sa, sb)) {
            first_diff(sa, sb, diff, sizeof diff);
            fail_msg("%s: dumped %s differs:%s", what, de->d_name, diff);
        }
        free(sa);
        free(sb);
        n++;
    }
    closedir(d);
    assert_int_equal(count_files(b), n);
    return n;
}

/* Outputs of fn on in, checked against an eager run of model and against
 * ref (n_out outputs of S*H or, narrow, S values; NULL: eager only). */
static void call_and_check(sj_runtime *rt, sj_runtime *eager, sj_fn *fn, sj_model_fn model, void *user, const sj_tensor *in,
                           int n_out, double *const *ref, double tol, const char *what) {
    sj_tensor out[3] = {{0}}, eo[3] = {{0}};
    if (sj_call(fn, in, 2, out, n_out)) fail_msg("%s: sj_call: %s", what, sj_last_error());
    sj_fn *e = NULL;
    sj_fn_options o;
    sj_fn_options_init(&o);
    o.dynamic = SJ_DYNAMIC_STATIC;
    assert_int_equal(sj_fn_create(eager, "eager", 2, model, user, &o, &e), SJ_OK);
    if (sj_call(e, in, 2, eo, n_out)) fail_msg("%s: eager sj_call: %s", what, sj_last_error());
    sj_fn_destroy(e);
    for (int k = 0; k < n_out; k++) {
        int64_t n = tu_numel(&eo[k]);
        double *r = malloc(sizeof(double) * (size_t)(n ? n : 1));
        for (int64_t i = 0; i < n; i++) r[i] = tu_get(&eo[k], i);
        char label[160];
        snprintf(label, sizeof label, "%s: output %d vs eager", what, k);
        if (!tu_check(&out[k], r, 1e-5, label)) fail_msg("%s", label);
        if (ref) {
            snprintf(label, sizeof label, "%s: output %d vs float64", what, k);
            if (!tu_check(&out[k], ref[k], tol, label)) fail_msg("%s", label);
        }
        free(r);
        sj_tensor_free(eager, &eo[k]);
    }
    for (int k = 0; k < n_out; k++) sj_tensor_free(rt, &out[k]);
}

static void test_public_api(void **state) {
    make_params();
    char cache[256], dump[N_VARIANTS][256];
    assert_int_equal(tu_mkdtemp(cache, sizeof cache, "sj_canon_cache"), 0);
    sj_runtime *eager = runtime(SJ_COMPILE_OFF, NULL, NULL);
    const int64_t sizes[] = {37, 5, 64};
    int stored = 0;
    for (int v = 0; v < N_VARIANTS; v++) {
        assert_int_equal(tu_mkdtemp(dump[v], sizeof dump[v], "sj_canon_dump"), 0);
        sj_runtime *rt = runtime(SJ_COMPILE_SYNC, cache, dump[v]);
        sj_fn *fn = make_fn(rt, variants[v], NULL);
        for (int r = 0; r < 3; r++) {
            sj_tensor in[2];
            model_inputs(in, sizes[r]);
            double *ref[3];
            for (int k = 0; k < 3; k++) ref[k] = malloc(sizeof(double) * (size_t)(sizes[r] * H));
            model_ref(in, sizes[r], ref);
            char what[96];
            snprintf(what, sizeof what, "%s S=%lld", variant_names[v], (long long)sizes[r]);
            call_and_check(rt, eager, fn, variants[v], NULL, in, 3, ref, 1e-4, what);
            for (int k = 0; k < 3; k++) free(ref[k]);
        }
        sj_stats s;
        sj_fn_stats(fn, &s);
        assert_int_equal(s.eager_calls, 0);
        assert_true(s.compiles >= 1);
        if (v == 0) {
            stored = count_files(cache);
            assert_true(stored >= 1);
        } else { /* every kernel from the first variant's cache entries, nothing new stored */
            assert_int_equal(s.compile_cache_hits, s.compiles);
            assert_int_equal(count_files(cache), stored);
        }
        sj_runtime_destroy(rt);
        if (v > 0) {
            char what[96];
            snprintf(what, sizeof what, "%s vs %s", variant_names[0], variant_names[v]);
            assert_true(assert_same_dumps(dump[0], dump[v], what) >= 1);
        }
    }
    for (int v = 0; v < N_VARIANTS; v++) tu_rmtree(dump[v]);
    tu_rmtree(cache);
    sj_runtime_destroy(eager);
}

static void test_public_api_random(void **state) {
    make_pparams();
    sj_runtime *eager = runtime(SJ_COMPILE_OFF, NULL, NULL);
    for (int trial = 0; trial < 6; trial++) {
        prog p;
        random_prog(&p);
        emission e[2] = {{.p = &p}, {.p = &p}};
        random_order(&p, e[0].order);
        random_order(&p, e[1].order);
        char cache[256];
        assert_int_equal(tu_mkdtemp(cache, sizeof cache, "sj_canon_cache"), 0);
        int stored = 0;
        for (int k = 0; k < 2; k++) {
            sj_runtime *rt = runtime(SJ_COMPILE_SYNC, cache, NULL);
            sj_fn *fn = make_fn(rt, m_prog, &e[k]);
            int64_t S = tu_randint(2, 40);
            sj_tensor in[2];
            model_inputs(in, S);
            double *vals = malloc(sizeof(double) * (size_t)(P_MAX * S * H));
            prog_ref(&p, in, S, vals);
            double *ref[3];
            for (int o = 0; o < p.n_out; o++) {
                const pop *op = &p.ops[p.outs[o]];
                ref[o] = malloc(sizeof(double) * (size_t)(S * H));
                for (int64_t i = 0; i < S * (op->narrow ? 1 : H); i++)
                    ref[o][i] = vals[(size_t)p.outs[o] * (size_t)(S * H) + (size_t)(op->narrow ? i * H : i)];
            }
            char what[96];
            snprintf(what, sizeof what, "program %d (%d ops), order %d", trial, p.n, k);
            call_and_check(rt, eager, fn, m_prog, &e[k], in, p.n_out, ref, 1e-4, what);
            for (int o = 0; o < p.n_out; o++) free(ref[o]);
            free(vals);
            sj_stats s;
            sj_fn_stats(fn, &s);
            assert_int_equal(s.eager_calls, 0);
            if (k == 0) {
                stored = count_files(cache);
            } else {
                assert_int_equal(s.compile_cache_hits, s.compiles);
                assert_int_equal(count_files(cache), stored);
            }
            sj_runtime_destroy(rt);
        }
        tu_rmtree(cache);
        tu_free_all();
        make_pparams();
    }
    sj_runtime_destroy(eager);
}

int main(void) {
    const char *seed = getenv("SJ_TEST_SEED");
    tu_seed(seed ? strtoull(seed, NULL, 0) : 0xca70);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_model_variants, tu_teardown),
        cmocka_unit_test_teardown(test_derived_sizes, tu_teardown),
        cmocka_unit_test_teardown(test_random_orders, tu_teardown),
        cmocka_unit_test_teardown(test_public_api, tu_teardown),
        cmocka_unit_test_teardown(test_public_api_random, tu_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
