/* C code generation for the generated groups of a fused plan.
 *
 * A unit is the runtime header's text followed by one function per
 * POINTWISE or ROW group (signature in codegen.h). Every size, stride and
 * offset is a local `const int64_t`: a literal in the specialized form, the
 * expression's C form over s0, s1, ... in the symbolic one.
 *
 * POINTWISE: `begin` is decomposed into an index tuple once; then segment by
 * segment along the last axis: each access gets its segment's base pointer
 * (restrict), loads whose innermost stride is 0 are read once, and the
 * innermost loop indexes x[i] (stride 1) or x[i * stride], so gcc -O3
 * vectorizes it (only static inline calls inside, but for libm's logf,
 * powf and sqrtf, which the eager kernels use too). Then the indices
 * carry.
 *
 * ROW: a loop over rows with the same pointer set-up. Softmax and the norms
 * keep the row's input (the prologue's result) in a stack buffer when the
 * row has at most ROWBUF elements, and run the eager kernels' passes over
 * it with the same sj_rt_ functions; longer rows recompute the prologue in
 * every pass, in chunks of CHUNK (a multiple of the partial-sum width, so
 * the sums come out bit-identical). A symbolic row length gets both, chosen
 * at run time. Reductions are one chunked pass; their epilogue runs once
 * per row.
 *
 * Streaming: a group whose accesses move more bytes than the threshold
 * (sj_codegen_opts.stream_min_bytes) writes its f32 unit-stride outputs
 * with non-temporal stores. A loop that stores one comes in two variants
 * under `if (nt)`: the plain one, and one in chunks of SCHUNK elements (a
 * prologue's chunk in long rows) that writes each such output to a stack
 * chunk SB<k>, then streams the chunk out (sj_rt_stream_f32), so both stay
 * plain C for the vectorizer. Small chunks keep the streamed bursts short
 * enough for the core to go on computing while they drain. `nt` is
 * computed once per call from the sizes (a constant when specialized, which
 * drops the other variant); a streaming call ends with sj_rt_sfence.
 *
 * Values: float for f32/f16/bf16, int64_t for i32/i64/bool (bool as 0/1);
 * an i32 result wraps at once, as the eager kernels' i32 stores do. f16 and
 * bf16 intermediates are not rounded (only explicit casts round).
 */
#include "base/alloc.h"
#include "specialize/codegen.h"

#include <assert.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/sj_kernel_rt.h"
#include "specialize/codegen_int.h"

#define ROWBUF 8192 /* floats a row keeps on the stack */
#define STR_(x) #x
#define STR(x) STR_(x)
#define CHUNK 2048  /* recomputed prologue per pass, a multiple of SJ_RT_LANES */
#define RCHUNK 256  /* reductions: the eager kernel's chunk */
#define SBUF 2048   /* a streamed output's stack chunk, in floats */
#define SCHUNK 256  /* elements a streaming loop computes between two streamed chunks */
_Static_assert(CHUNK % SJ_RT_LANES == 0 && RCHUNK % SJ_RT_LANES == 0, "chunks keep sums bit-identical");
_Static_assert(CHUNK <= SBUF && RCHUNK <= SBUF && SCHUNK <= SBUF, "a chunk fits a stream buffer");
_Static_assert(RCHUNK <= SCHUNK && SCHUNK <= CHUNK, "an f16 chunk H<k> holds its group's longest chunk");

/* The C generator's own state (sj_cg.user). */
typedef struct cstate {
    double stream_min;              /* bytes; < 0: never stream */
    bool staged[SJ_CG_MAX_ACC];     /* per access of the group: an f32 unit-stride store */
    bool any;                       /* the group has one: it declares nt and SB<k> */
    bool on;                        /* stores of staged accesses go to SB<k>[jj] */
    bool h16[SJ_CG_MAX_ACC];        /* per access: f16 with unit inner stride, converted by chunk */
    bool any16;                     /* the group has one: its loops run in chunks, H<k> declared */
    bool on16;                      /* a chunk's body: h16 accesses are H<k>[jj] */
    bool used16[SJ_CG_MAX_ACC];     /* the h16 accesses the chunk's body read or wrote */
    int hlen;                       /* floats in each H<k>: the group's longest chunk */
} cstate;

/* -- Output buffer ----------------------------------------------------------- */

void sj_cg_vput(sj_sbuf *b, const char *fmt, va_list ap0) {
    if (b->oom) return;
    if (!b->s) {
        b->cap = 1 << 16;
        if (!(b->s = sj_malloc(b->cap))) {
            b->oom = true;
            return;
        }
    }
    for (;;) {
        va_list ap;
        va_copy(ap, ap0);
        int n = vsnprintf(b->s + b->len, b->cap - b->len, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->oom = true;
            return;
        }
        if (b->len + (size_t)n < b->cap) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = b->cap * 2 + (size_t)n + 1;
        char *s = sj_realloc(b->s, cap);
        if (!s) {
            b->oom = true;
            return;
        }
        b->s = s;
        b->cap = cap;
    }
}

void sj_cg_put(sj_sbuf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    sj_cg_vput(b, fmt, ap);
    va_end(ap);
}
#define put sj_cg_put

/* -- Context ------------------------------------------------------------------ */

typedef sj_cg cg; /* codegen_int.h */

bool sj_cg_kconst(const cg *c, sj_expr e, int64_t *v) {
    if (c->sym) {
        *v = sj_ex_eval(c->g->ex, e, c->sym);
        return true;
    }
    return sj_ex_is_const(c->g->ex, e, v);
}

void sj_cg_put_ex(cg *c, sj_expr e) {
    int64_t v;
    if (sj_cg_kconst(c, e, &v)) {
        put(&c->o, "INT64_C(%" PRId64 ")", v);
        return;
    }
    int n = sj_ex_print_c(c->g->ex, e, "s", NULL, 0);
    char *s = sj_malloc((size_t)n + 1);
    if (!s) {
        c->o.oom = true;
        return;
    }
    sj_ex_print_c(c->g->ex, e, "s", s, (size_t)n + 1);
    put(&c->o, "(%s)", s);
    free(s);
}

static bool is_f(sj_dtype dt) { return dt == SJ_F32 || dt == SJ_F16 || dt == SJ_BF16; }
const char *sj_cg_ctype(sj_dtype dt) { return is_f(dt) ? "float" : "int64_t"; }

const char *sj_cg_stype(sj_dtype dt) {
    switch (dt) {
    case SJ_F32: return "float";
    case SJ_F16:
    case SJ_BF16: return "uint16_t";
    case SJ_I32: return "int32_t";
    case SJ_I64: return "int64_t";
    default: return "uint8_t";
    }
}

sj_dtype sj_cg_acc_dtype(const cg *c, int k) { return c->g->vals[c->acc[k]->val].dtype; }
static int last_axis(const cg *c) { return c->G->rank - 1; }

int sj_cg_inner(const cg *c, int k) {
    int64_t v;
    if (!sj_cg_kconst(c, c->acc[k]->stride[last_axis(c)], &v)) return -1;
    return v == 0 ? 0 : v == 1 ? 1 : -1;
}

/* Element `ix` of access k: "P3[i]", "P3[i * st3_1]", "P3[0]". */
static void put_elem(cg *c, int k, const char *ix) {
    cstate *cs = c->user;
    if (cs->on16 && ix && cs->h16[k]) {
        cs->used16[k] = true;
        put(&c->o, "H%d[jj]", k);
        return;
    }
    if (cs->on && cs->staged[k]) {
        put(&c->o, "SB%d[jj]", k);
        return;
    }
    int in = sj_cg_inner(c, k);
    if (!ix || in == 0) put(&c->o, "P%d[0]", k);
    else if (in == 1) put(&c->o, "P%d[%s]", k, ix);
    else put(&c->o, "P%d[%s * st%d_%d]", k, ix, k, last_axis(c));
}

/* c->f32_elem: an h16 access inside a chunk's body is its f32 chunk. */
static bool f32_elem(cg *c, int k, const char *ix) {
    const cstate *cs = c->user;
    return cs->on16 && ix && cs->h16[k];
}

void sj_cg_put_load(cg *c, int k, const char *ix) {
    sj_dtype dt = sj_cg_acc_dtype(c, k);
    if (c->f32_elem && c->f32_elem(c, k, ix)) dt = SJ_F32;
    put(&c->o, "const %s L%d = ", sj_cg_ctype(dt), k);
    switch (dt) {
    case SJ_F32: c->elem(c, k, ix); break;
    case SJ_F16: put(&c->o, "sj_f16_to_f32("), c->elem(c, k, ix), put(&c->o, ")"); break;
    case SJ_BF16: put(&c->o, "sj_bf16_to_f32("), c->elem(c, k, ix), put(&c->o, ")"); break;
    case SJ_BOOL: put(&c->o, "(int64_t)("), c->elem(c, k, ix), put(&c->o, " != 0)"); break;
    default: put(&c->o, "(int64_t)"), c->elem(c, k, ix); break;
    }
    put(&c->o, ";\n");
}

void sj_cg_put_store(cg *c, int k, const char *ix) {
    sj_dtype dt = sj_cg_acc_dtype(c, k);
    int32_t v = c->acc[k]->val;
    char skew[40] = ""; /* tests only: sj_codegen_opts.test_skew */
    if (c->test_skew != 0) snprintf(skew, sizeof skew, " + %.9ef", (double)c->test_skew);
    if (c->f32_elem && c->f32_elem(c, k, ix)) dt = SJ_F32;
    c->elem(c, k, ix);
    switch (dt) {
    case SJ_F32: put(&c->o, " = v%d%s;\n", v, skew); break;
    case SJ_F16: put(&c->o, " = sj_f32_to_f16(v%d%s);\n", v, skew); break;
    case SJ_BF16: put(&c->o, " = sj_f32_to_bf16(v%d%s);\n", v, skew); break;
    case SJ_I32: put(&c->o, " = sj_rt_wrap32(v%d);\n", v); break;
    case SJ_I64: put(&c->o, " = v%d;\n", v); break;
    default: put(&c->o, " = (uint8_t)(v%d != 0);\n", v); break;
    }
}

/* -- Values ---------------------------------------------------------------------- */

static int load_of(const cg *c, int32_t u) {
    for (int k = 0; k < c->G->n_loads; k++)
        if (c->acc[k]->val == u) return k;
    return -1;
}

void sj_cg_put_float(cg *c, float f) {
    if (f != f) put(&c->o, "NAN");
    else if (f == INFINITY) put(&c->o, "INFINITY");
    else if (f == -INFINITY) put(&c->o, "(-INFINITY)");
    else put(&c->o, "(%af)", (double)f);
}

void sj_cg_put_ref(cg *c, int32_t u) {
    const sj_value *v = &c->g->vals[u];
    if (v->kind == SJ_VAL_CONST) {
        int64_t bits = c->g->consts[v->index].bits;
        uint16_t h;
        memcpy(&h, &bits, sizeof h);
        switch (v->dtype) {
        case SJ_F32: {
            float f;
            memcpy(&f, &bits, sizeof f);
            sj_cg_put_float(c, f);
            break;
        }
        case SJ_F16: sj_cg_put_float(c, sj_f16_to_f32(h)); break;
        case SJ_BF16: sj_cg_put_float(c, sj_bf16_to_f32(h)); break;
        case SJ_I32: {
            int32_t i;
            memcpy(&i, &bits, sizeof i);
            put(&c->o, "INT64_C(%" PRId32 ")", i);
            break;
        }
        case SJ_I64: put(&c->o, "INT64_C(%" PRId64 ")", bits); break;
        default: put(&c->o, "INT64_C(%d)", (int)((uint8_t)bits != 0)); break;
        }
    } else if (c->vpos[u] >= 0) {
        put(&c->o, "v%d", (int)u);
    } else {
        int k = load_of(c, u);
        assert(k >= 0);
        put(&c->o, "L%d", k);
    }
}

static const char *const f_fn[SJ_OP_COUNT] = {
    [SJ_OP_ABS] = "fabsf",          [SJ_OP_EXP] = "sj_rt_expf",   [SJ_OP_LOG] = "logf",
    [SJ_OP_SQRT] = "sqrtf",         [SJ_OP_TANH] = "sj_rt_tanhf", [SJ_OP_SIGMOID] = "sj_rt_sigmoidf",
    [SJ_OP_RELU] = "sj_rt_reluf",   [SJ_OP_GELU] = "sj_rt_geluf", [SJ_OP_GELU_TANH] = "sj_rt_gelu_tanhf",
    [SJ_OP_SILU] = "sj_rt_siluf",   [SJ_OP_MAXIMUM] = "sj_rt_maxf", [SJ_OP_MINIMUM] = "sj_rt_minf",
    [SJ_OP_POW] = "powf",
};
static const char *const i_fn[SJ_OP_COUNT] = {
    [SJ_OP_NEG] = "sj_rt_ineg", [SJ_OP_ABS] = "sj_rt_iabs", [SJ_OP_ADD] = "sj_rt_iadd",
    [SJ_OP_SUB] = "sj_rt_isub", [SJ_OP_MUL] = "sj_rt_imul", [SJ_OP_DIV] = "sj_rt_idiv",
    [SJ_OP_POW] = "sj_rt_ipow",
};
static const char *const infix[SJ_OP_COUNT] = {
    [SJ_OP_ADD] = "+", [SJ_OP_SUB] = "-", [SJ_OP_MUL] = "*", [SJ_OP_DIV] = "/",
    [SJ_OP_EQ] = "==", [SJ_OP_NE] = "!=", [SJ_OP_LT] = "<", [SJ_OP_LE] = "<=", [SJ_OP_GT] = ">", [SJ_OP_GE] = ">=",
};

static void put_cast(cg *c, int32_t x, sj_dtype from, sj_dtype to) {
    if (is_f(to)) {
        const char *pre = to == SJ_F16    ? "sj_f16_to_f32(sj_f32_to_f16("
                          : to == SJ_BF16 ? "sj_bf16_to_f32(sj_f32_to_bf16("
                                          : "(";
        put(&c->o, "%s%s", pre, is_f(from) ? "" : "(float)");
        sj_cg_put_ref(c, x);
        put(&c->o, to == SJ_F32 ? ")" : "))");
    } else if (to == SJ_BOOL) {
        put(&c->o, "(int64_t)(");
        sj_cg_put_ref(c, x);
        put(&c->o, is_f(from) ? " != 0.0f)" : " != 0)");
    } else if (is_f(from)) {
        put(&c->o, "sj_rt_f32_to_int(");
        sj_cg_put_ref(c, x);
        put(&c->o, ", %d)", to == SJ_I32);
    } else {
        sj_cg_put_ref(c, x);
    }
}

void sj_cg_put_node(cg *c, const sj_node *n) {
    const int32_t *in = sj_node_ins(c->g, n);
    sj_dtype dt = c->g->vals[n->out].dtype, xt = c->g->vals[in[0]].dtype;
    bool f = is_f(xt), wrap = dt == SJ_I32;
    put(&c->o, "const %s v%d = %s", sj_cg_ctype(dt), (int)n->out, wrap ? "sj_rt_wrap32(" : "");
    switch (sj_op_kind_of(n->op)) {
    case SJ_K_UNARY:
        if (n->op == SJ_OP_NEG) {
            put(&c->o, f ? "(-" : "sj_rt_ineg(");
            sj_cg_put_ref(c, in[0]);
            put(&c->o, ")");
        } else if (n->op == SJ_OP_RSQRT) {
            put(&c->o, "(1.0f / sqrtf(");
            sj_cg_put_ref(c, in[0]);
            put(&c->o, "))");
        } else if (!f && n->op == SJ_OP_RELU) {
            put(&c->o, "("), sj_cg_put_ref(c, in[0]), put(&c->o, " < 0 ? 0 : "), sj_cg_put_ref(c, in[0]), put(&c->o, ")");
        } else {
            put(&c->o, "%s(", f ? f_fn[n->op] : i_fn[n->op]);
            sj_cg_put_ref(c, in[0]);
            put(&c->o, ")");
        }
        break;
    case SJ_K_BINARY:
    case SJ_K_COMPARE: {
        bool cmp = sj_op_kind_of(n->op) == SJ_K_COMPARE;
        if (cmp || (f && infix[n->op])) {
            put(&c->o, cmp ? "(int64_t)(" : "(");
            sj_cg_put_ref(c, in[0]), put(&c->o, " %s ", infix[n->op]), sj_cg_put_ref(c, in[1]);
            put(&c->o, ")");
        } else if (!f && (n->op == SJ_OP_MAXIMUM || n->op == SJ_OP_MINIMUM)) {
            const char *op = n->op == SJ_OP_MAXIMUM ? ">" : "<";
            put(&c->o, "("), sj_cg_put_ref(c, in[0]), put(&c->o, " %s ", op), sj_cg_put_ref(c, in[1]);
            put(&c->o, " ? "), sj_cg_put_ref(c, in[0]), put(&c->o, " : "), sj_cg_put_ref(c, in[1]), put(&c->o, ")");
        } else {
            put(&c->o, "%s(", f ? f_fn[n->op] : i_fn[n->op]);
            sj_cg_put_ref(c, in[0]), put(&c->o, ", "), sj_cg_put_ref(c, in[1]);
            put(&c->o, ")");
        }
        break;
    }
    case SJ_K_WHERE:
        put(&c->o, "("), sj_cg_put_ref(c, in[0]), put(&c->o, " ? "), sj_cg_put_ref(c, in[1]), put(&c->o, " : ");
        sj_cg_put_ref(c, in[2]), put(&c->o, ")");
        break;
    case SJ_K_CAST:
        put_cast(c, in[0], xt, dt);
        break;
    case SJ_K_VIEW: /* a copying view: element for element */
        sj_cg_put_ref(c, in[0]);
        break;
    default:
        assert(!"not an elementwise node");
        break;
    }
    put(&c->o, "%s;\n", wrap ? ")" : "");
}

/* -- Blocks ----------------------------------------------------------------------
 *
 * A block computes some of the group's values at one element (see
 * codegen_int.h).
 */

void sj_cg_want_val(cg *c, int32_t u) {
    int q = u >= 0 ? c->vpos[u] : -1;
    if (q >= 0 && !c->avail[q]) c->want[q] = true;
}

void sj_cg_close_want(cg *c) {
    for (int q = c->G->n_nodes - 1; q >= 0; q--) {
        if (!c->want[q] || q == c->rp) continue;
        const sj_node *n = &c->g->nodes[c->G->nodes[q]];
        for (int a = 0; a < n->n_in; a++) sj_cg_want_val(c, sj_node_ins(c->g, n)[a]);
    }
}

void sj_cg_reset_want(cg *c) {
    memset(c->want, 0, (size_t)c->G->n_nodes * sizeof *c->want);
    memset(c->avail, 0, (size_t)c->G->n_nodes * sizeof *c->avail);
}

void sj_cg_want_stores(cg *c, int lo, int hi) {
    for (int k = c->G->n_loads; k < c->n_acc; k++) {
        int q = c->vpos[c->acc[k]->val];
        if (q >= lo && q < hi) c->want[q] = true;
    }
}

bool sj_cg_hoisted(const cg *c, int k) { return sj_cg_inner(c, k) == 0; }

void sj_cg_mark_loads(cg *c, const int32_t *extra, int n_extra) {
    const sj_graph *g = c->g;
    memset(c->lw, 0, sizeof c->lw);
    for (int q = 0; q < c->G->n_nodes; q++) {
        if (!c->want[q] || q == c->rp) continue;
        const sj_node *n = &g->nodes[c->G->nodes[q]];
        for (int a = 0; a < n->n_in; a++) {
            int32_t u = sj_node_ins(g, n)[a];
            int k = u >= 0 && c->vpos[u] < 0 ? load_of(c, u) : -1;
            if (k >= 0) c->lw[k] = true;
        }
    }
    for (int i = 0; i < n_extra; i++) {
        int k = extra[i] >= 0 && c->vpos[extra[i]] < 0 ? load_of(c, extra[i]) : -1;
        if (k >= 0) c->lw[k] = true;
    }
}

/* The loads a block reads at element ix (hoisted ones are already
 * defined). */
void sj_cg_put_loads(cg *c, const char *ix, const int32_t *extra, int n_extra) {
    sj_cg_mark_loads(c, extra, n_extra);
    for (int k = 0; k < c->G->n_loads; k++)
        if (c->lw[k] && !sj_cg_hoisted(c, k)) sj_cg_put_load(c, k, ix);
}

void sj_cg_put_nodes(cg *c, int lo, int hi) {
    for (int q = lo; q < hi; q++)
        if (c->want[q] && q != c->rp) sj_cg_put_node(c, &c->g->nodes[c->G->nodes[q]]);
}

void sj_cg_put_stores(cg *c, int lo, int hi, const char *ix) {
    for (int k = c->G->n_loads; k < c->n_acc; k++) {
        int q = c->vpos[c->acc[k]->val];
        if (q >= lo && q < hi) sj_cg_put_store(c, k, ix);
    }
}

/* -- Function frame ----------------------------------------------------------------- */

static void put_head(cg *c, const char *prefix) {
    const sj_group *G = c->G;
    int ns = sj_sym_count(c->g->ex);
    put(&c->o, "\nvoid %s%s(void *const *p, const int64_t *s, int64_t begin, int64_t end);\n", prefix, G->name);
    put(&c->o, "void %s%s(void *const *p, const int64_t *s, int64_t begin, int64_t end) {\n", prefix, G->name);
    put(&c->o, "(void)s;\n");
    if (!c->sym && ns > 0) {
        put(&c->o, "const int64_t ");
        for (int i = 0; i < ns; i++) put(&c->o, "%ss%d = s[%d]", i ? ", " : "", i, i);
        put(&c->o, ";\n");
        for (int i = 0; i < ns; i++) put(&c->o, "(void)s%d;\n", i);
    }
    put(&c->o, "if (begin >= end) return;\n");
    for (int a = 0; a < G->rank; a++) {
        put(&c->o, "const int64_t n%d = ", a);
        sj_cg_put_ex(c, G->shape[a]);
        put(&c->o, "; (void)n%d;\n", a);
    }
    for (int k = 0; k < c->n_acc; k++) {
        const sj_access *x = c->acc[k];
        bool ld = k < G->n_loads;
        sj_dtype dt = sj_cg_acc_dtype(c, k);
        put(&c->o, "%s%s *const B%d = (%s%s *)p[%d] + ", ld ? "const " : "", sj_cg_stype(dt), k, ld ? "const " : "",
            sj_cg_stype(dt), k);
        sj_cg_put_ex(c, x->offset);
        put(&c->o, ";\n");
        for (int a = 0; a < G->rank; a++) {
            put(&c->o, "const int64_t st%d_%d = ", k, a);
            sj_cg_put_ex(c, x->stride[a]);
            put(&c->o, "; (void)st%d_%d;\n", k, a);
        }
    }
}

/* The index tuple ix[0 .. r) of work item `begin` over axes [0, r). */
static void put_decompose(cg *c, int r) {
    if (r <= 0) return;
    put(&c->o, "int64_t ix[%d];\n{\nint64_t t = begin;\n", r);
    for (int a = r - 1; a > 0; a--) put(&c->o, "ix[%d] = t %% n%d;\nt /= n%d;\n", a, a, a);
    put(&c->o, "ix[0] = t;\n}\n");
}

/* Base pointers P<k> of the segment or row at ix (axes [0, r) of them). */
static void put_pointers(cg *c, int r) {
    for (int k = 0; k < c->n_acc; k++) {
        bool ld = k < c->G->n_loads;
        const char *t = sj_cg_stype(sj_cg_acc_dtype(c, k));
        put(&c->o, "%s%s *restrict P%d = B%d", ld ? "const " : "", t, k, k);
        for (int a = 0; a < r; a++) put(&c->o, " + ix[%d] * st%d_%d", a, k, a);
        put(&c->o, ";\n");
    }
    for (int k = 0; k < c->G->n_loads; k++)
        if (sj_cg_hoisted(c, k)) {
            sj_cg_put_load(c, k, NULL);
            put(&c->o, "(void)L%d;\n", k);
        }
}

/* Advance ix over axes [0, top] by one (the outermost never wraps). */
static void put_carry(cg *c, int top) {
    for (int a = top; a > 0; a--) put(&c->o, "if (++ix[%d] == n%d) { ix[%d] = 0;\n", a, a, a);
    if (top >= 0) put(&c->o, "++ix[0];\n");
    for (int a = top; a > 0; a--) put(&c->o, "}\n");
}

/* -- Streaming stores ------------------------------------------------------------------ */

/* Which of G's stores are staged, from the threshold and their types. */
static void stream_setup(cg *c) {
    cstate *cs = c->user;
    cs->any = cs->on = cs->any16 = cs->on16 = false;
    for (int k = 0; k < c->n_acc; k++) {
        cs->staged[k] = cs->stream_min >= 0 && k >= c->G->n_loads && sj_cg_acc_dtype(c, k) == SJ_F32 &&
                        sj_cg_inner(c, k) == 1;
        cs->any |= cs->staged[k];
        cs->h16[k] = sj_cg_acc_dtype(c, k) == SJ_F16 && sj_cg_inner(c, k) == 1;
        cs->any16 |= cs->h16[k];
    }
    /* loops run in chunks of SCHUNK (RCHUNK in a reduction), but a norm's or
     * softmax's row that is not buffered (longer than ROWBUF, or of a
     * symbolic length) recomputes its prologue in chunks of CHUNK */
    cs->hlen = SCHUNK;
    if (c->G->kind == SJ_G_ROW) {
        int64_t nl;
        bool reduce = sj_op_kind_of(c->g->nodes[c->G->row_node].op) == SJ_K_REDUCE;
        if (!reduce && !(sj_cg_kconst(c, c->G->shape[last_axis(c)], &nl) && nl <= ROWBUF)) cs->hlen = CHUNK;
    }
}

/* An access's bytes per element of the iteration space: 0 when it is
 * broadcast along some axis (a known zero stride). */
static int access_bytes(cg *c, int k) {
    for (int a = 0; a < c->G->rank; a++) {
        int64_t v;
        if (sj_cg_kconst(c, c->acc[k]->stride[a], &v) && v == 0) return 0;
    }
    return (int)sj_dtype_size(sj_cg_acc_dtype(c, k));
}

/* `nt` (does this call stream?) and the stack chunks, after put_head. */
static void put_stream_head(cg *c) {
    const cstate *cs = c->user;
    for (int k = 0; k < c->n_acc; k++)
        if (cs->h16[k]) put(&c->o, "_Alignas(64) float H%d[%d];\n", k, cs->hlen);
    if (!cs->any) return;
    int bytes = 0;
    for (int k = 0; k < c->n_acc; k++) bytes += access_bytes(c, k);
    put(&c->o, "const int nt = SJ_RT_HAVE_STREAM && %d.0", bytes);
    for (int a = 0; a < c->G->rank; a++) put(&c->o, " * (double)n%d", a);
    put(&c->o, " > %.17g;\n", cs->stream_min);
    for (int k = 0; k < c->n_acc; k++)
        if (cs->staged[k]) put(&c->o, "_Alignas(64) float SB%d[%d];\n", k, SBUF);
}

static void put_stream_tail(cg *c) {
    if (((const cstate *)c->user)->any) put(&c->o, "if (nt) sj_rt_sfence();\n");
}

/* Does a block storing the values of positions [lo, hi) store a staged
 * access? */
static bool staged_in(const cg *c, int k, int lo, int hi) {
    int q = c->vpos[c->acc[k]->val];
    return ((const cstate *)c->user)->staged[k] && q >= lo && q < hi;
}

static bool stages(const cg *c, int lo, int hi) {
    for (int k = c->G->n_loads; k < c->n_acc; k++)
        if (staged_in(c, k, lo, hi)) return true;
    return false;
}

/* `for` over chunks of n elements of [0, len): c0 the chunk's start, k its
 * length; the caller closes the brace. */
static void put_chunk_head(cg *c, const char *len, int n) {
    put(&c->o, "for (int64_t c0 = 0; c0 < %s; c0 += %d) {\n", len, n);
    put(&c->o, "const int64_t k = %s - c0 < %d ? %s - c0 : %d;\n", len, n, len, n);
}

/* A loop body: emitted once per variant of its loop. */
typedef void (*body_fn)(cg *c, const void *ctx);

static void put_jj_body(cg *c, const char *ix, body_fn body, const void *ctx) {
    put(&c->o, "for (int64_t jj = 0; jj < k; jj++) {\nconst int64_t %s = c0 + jj;\n", ix);
    body(c, ctx);
    put(&c->o, "}\n");
}

/* The loop over a chunk. In a group with f16 unit-stride accesses the body
 * reads and writes them as f32 chunks H<k>[jj]: the loads it reads are
 * converted into theirs before the loop, the stores it writes out of theirs
 * after it (sj_rt_f16_load / sj_rt_f16_store, 8 at a time where the target
 * has F16C; an element-by-element sj_f16_to_f32 costs a dozen vector
 * instructions per vector, which made f16 norms and GELU 2-4x slower than
 * f32's). The body is generated first, so only what it touches converts. */
static void put_jj_loop(cg *c, const char *ix, body_fn body, const void *ctx) {
    cstate *cs = c->user;
    if (!cs->any16) {
        put_jj_body(c, ix, body, ctx);
        return;
    }
    sj_sbuf outer = c->o;
    c->o = (sj_sbuf){0};
    memset(cs->used16, 0, sizeof cs->used16);
    cs->on16 = true;
    put_jj_body(c, ix, body, ctx);
    cs->on16 = false;
    sj_sbuf loop = c->o;
    c->o = outer;
    c->o.oom |= loop.oom;
    for (int k = 0; k < c->G->n_loads; k++)
        if (cs->used16[k]) put(&c->o, "sj_rt_f16_load(H%d, P%d + c0, k);\n", k, k);
    if (loop.s) put(&c->o, "%s", loop.s);
    free(loop.s);
    for (int k = c->G->n_loads; k < c->n_acc; k++)
        if (cs->used16[k]) put(&c->o, "sj_rt_f16_store(P%d + c0, H%d, k);\n", k, k);
}

/* The streaming variant of a chunk's loop: the staged stores go to
 * SB<k>[jj]; then the chunks are streamed out. */
static void put_jj_staged(cg *c, const char *ix, int lo, int hi, body_fn body, const void *ctx) {
    cstate *cs = c->user;
    cs->on = true;
    put_jj_loop(c, ix, body, ctx);
    cs->on = false;
    for (int k = c->G->n_loads; k < c->n_acc; k++)
        if (staged_in(c, k, lo, hi)) put(&c->o, "sj_rt_stream_f32(P%d + c0, SB%d, k);\n", k, k);
}

/* A loop over the current chunk [c0, c0 + k) (jj within, ix = c0 + jj)
 * whose body stores the values of positions [lo, hi). When that stores a
 * staged access: two variants, the streaming one under `if (nt)` (so each
 * is a plain loop for the vectorizer; specialized, nt is a constant). */
static void put_chunk_loop(cg *c, const char *ix, int lo, int hi, body_fn body, const void *ctx) {
    if (!stages(c, lo, hi)) {
        put_jj_loop(c, ix, body, ctx);
        return;
    }
    put(&c->o, "if (nt) {\n");
    put_jj_staged(c, ix, lo, hi, body, ctx);
    put(&c->o, "} else {\n");
    put_jj_loop(c, ix, body, ctx);
    put(&c->o, "}\n");
}

/* -- Prefetching the next row ------------------------------------------------------ */

/* Does load k advance along the row axis (a next row to prefetch, read
 * element by element)? */
static bool row_prefetched(cg *c, int k) {
    int64_t v;
    int a = last_axis(c) - 1;
    return a >= 0 && sj_cg_inner(c, k) == 1 && !(sj_cg_kconst(c, c->acc[k]->stride[a], &v) && v == 0);
}

static bool any_row_prefetched(cg *c) {
    for (int k = 0; k < c->G->n_loads; k++)
        if (row_prefetched(c, k)) return true;
    return false;
}

/* After a chunk [c0, c0 + k) of a row's heaviest pass: prefetch the same
 * span of the next row's inputs, so that the next row's first pass finds
 * them in the cache while this row's arithmetic hides the memory latency
 * (at a carry the address is another row's: prefetches never fault). */
static void put_prefetch_next(cg *c) {
    int a = last_axis(c) - 1;
    put(&c->o, "if (row + 1 < end) {\n");
    for (int k = 0; k < c->G->n_loads; k++)
        if (row_prefetched(c, k))
            put(&c->o, "for (int64_t q = 0; q < k; q += %d) __builtin_prefetch(P%d + st%d_%d + c0 + q);\n",
                (int)(64 / sj_dtype_size(sj_cg_acc_dtype(c, k))), k, k, a);
    put(&c->o, "}\n");
}

/* A loop over [0, len) with index ix, as put_chunk_loop: the streaming
 * variant runs in chunks of SCHUNK. pf: prefetch the next row after each
 * chunk (both variants then run in chunks). */
static void put_loop(cg *c, const char *len, const char *ix, int lo, int hi, body_fn body, const void *ctx, bool pf) {
    bool st = stages(c, lo, hi), chunked = ((const cstate *)c->user)->any16;
    pf = pf && any_row_prefetched(c);
    if (st) {
        /* whole chunks (a constant trip count, as a specialized kernel's
         * loops have), then the rest */
        put(&c->o, "if (nt) {\nint64_t c0 = 0;\nfor (; c0 + %d <= %s; c0 += %d) {\n", SCHUNK, len, SCHUNK);
        put(&c->o, "const int64_t k = %d;\n", SCHUNK);
        put_jj_staged(c, ix, lo, hi, body, ctx);
        if (pf) put_prefetch_next(c);
        put(&c->o, "}\nif (c0 < %s) {\nconst int64_t k = %s - c0;\n", len, len);
        put_jj_staged(c, ix, lo, hi, body, ctx);
        if (pf) put_prefetch_next(c);
        put(&c->o, "}\n} else {\n");
    }
    if (pf || chunked) {
        put_chunk_head(c, len, SCHUNK);
        put_jj_loop(c, ix, body, ctx);
        if (pf) put_prefetch_next(c);
        put(&c->o, "}\n");
    } else {
        put(&c->o, "for (int64_t %s = 0; %s < %s; %s++) {\n", ix, ix, len, ix);
        body(c, ctx);
        put(&c->o, "}\n");
    }
    if (st) put(&c->o, "}\n");
}

/* The row's length, "n<L>". */
typedef struct rowlen {
    char s[16];
} rowlen;

static rowlen row_len(const cg *c) {
    rowlen r;
    snprintf(r.s, sizeof r.s, "n%d", last_axis(c));
    return r;
}

/* put_loop over the row: j in [0, n<L>). */
static void put_row_loop(cg *c, int lo, int hi, body_fn body, const void *ctx, bool pf) {
    put_loop(c, row_len(c).s, "j", lo, hi, body, ctx, pf);
}

/* -- POINTWISE ---------------------------------------------------------------------- */

static void pointwise_body(cg *c, const void *ctx) {
    (void)ctx;
    sj_cg_put_loads(c, "i", NULL, 0);
    sj_cg_put_nodes(c, 0, c->G->n_nodes);
    sj_cg_put_stores(c, 0, c->G->n_nodes, "i");
}

static void gen_pointwise(cg *c) {
    int r = c->G->rank, L = r - 1;
    put_decompose(c, r);
    put(&c->o, "int64_t left = end - begin;\nfor (;;) {\n");
    put(&c->o, "int64_t cnt = n%d - ix[%d];\nif (cnt > left) cnt = left;\n", L, L);
    put_pointers(c, r);
    sj_cg_reset_want(c);
    sj_cg_want_stores(c, 0, c->G->n_nodes);
    sj_cg_close_want(c);
    put_loop(c, "cnt", "i", 0, c->G->n_nodes, pointwise_body, NULL, false);
    put(&c->o, "left -= cnt;\nif (left <= 0) break;\nix[%d] = 0;\n", L);
    put_carry(c, L - 1);
    put(&c->o, "}\n");
}

/* -- ROW ------------------------------------------------------------------------------- */

typedef sj_cg_rowop rowop;

sj_cg_rowop sj_cg_row_op(sj_cg *c) {
    sj_cg_rowop R = {.n = &c->g->nodes[c->G->row_node]};
    const int32_t *in = sj_node_ins(c->g, R.n);
    R.x = in[0];
    R.gw = R.n->n_in > 1 ? in[1] : -1;
    R.bw = R.n->n_in > 2 ? in[2] : -1;
    R.dt = c->g->vals[R.x].dtype;
    R.reduce = sj_op_kind_of(R.n->op) == SJ_K_REDUCE;
    c->rp = c->vpos[R.n->out];
    return R;
}

/* Operand u at the current element, or dflt when absent (a norm's g and b
 * default to 1 and 0). */
static void put_opt(cg *c, int32_t u, const char *dflt) {
    if (u < 0) put(&c->o, "%s", dflt);
    else sj_cg_put_ref(c, u);
}

typedef struct fill_ctx {
    const rowop *R;
    const char *dst;
    bool chunked, stores;
} fill_ctx;

static void fill_body(cg *c, const void *ctx) {
    const fill_ctx *f = ctx;
    sj_cg_put_loads(c, "j", &f->R->x, 1);
    sj_cg_put_nodes(c, 0, c->rp);
    put(&c->o, "%s[%s] = ", f->dst, f->chunked ? "jj" : "j");
    sj_cg_put_ref(c, f->R->x);
    put(&c->o, ";\n");
    if (f->stores) sj_cg_put_stores(c, 0, c->rp, "j");
}

/* A loop filling dst with the row op's input (the prologue's result),
 * storing the prologue's stored values when `stores`: over the whole row
 * into dst[j], or (chunked) over [c0, c0 + k) into dst[jj]. */
static void put_fill(cg *c, const rowop *R, const char *dst, bool chunked, bool stores) {
    sj_cg_reset_want(c);
    sj_cg_want_val(c, R->x);
    if (stores) sj_cg_want_stores(c, 0, c->rp);
    sj_cg_close_want(c);
    int hi = stores ? c->rp : 0; /* the stores this pass makes: [0, hi) */
    fill_ctx f = {R, dst, chunked, stores};
    if (chunked) put_chunk_loop(c, "j", 0, hi, fill_body, &f);
    else put_row_loop(c, 0, hi, fill_body, &f, false);
}

/* Chunked pass: for each chunk, fill cb then run `then`. */
static void put_chunks(cg *c, const rowop *R, int chunk, bool stores, const char *then) {
    put_chunk_head(c, row_len(c).s, chunk);
    put_fill(c, R, "cb", true, stores);
    put(&c->o, "%s}\n", then);
}

typedef struct out_ctx {
    const rowop *R;
    bool buffered, softmax, x_in_buf;
    int32_t extra[3];
} out_ctx;

static void out_body(cg *c, const void *ctx) {
    const out_ctx *o = ctx;
    const rowop *R = o->R;
    if (o->x_in_buf && c->vpos[R->x] >= 0) put(&c->o, "const float v%d = buf[j];\n", (int)R->x);
    sj_cg_put_loads(c, "j", o->extra, 3);
    sj_cg_put_nodes(c, 0, c->rp);
    put(&c->o, "const float v%d = ", (int)R->n->out);
    if (o->softmax) {
        if (o->buffered) put(&c->o, "buf[j] * inv;\n");
        else put(&c->o, "sj_rt_exp_shifted("), sj_cg_put_ref(c, R->x), put(&c->o, " - m) * inv;\n");
    } else { /* in f32, with the eager kernels' functions (kernels/cpu/reduce.c) */
        bool ln = R->n->op == SJ_OP_LAYER_NORM;
        put(&c->o, ln ? "sj_rt_layer_norm1(" : "(");
        if (o->x_in_buf && c->vpos[R->x] < 0) put(&c->o, "buf[j]");
        else sj_cg_put_ref(c, R->x);
        put(&c->o, ln ? ", mhi, mlo, frs, " : " * fr * ");
        put_opt(c, R->gw, "1.0f");
        if (ln) put(&c->o, ", "), put_opt(c, R->bw, "0.0f");
        put(&c->o, ");\n");
    }
    sj_cg_put_nodes(c, c->rp + 1, c->G->n_nodes);
    sj_cg_put_stores(c, c->rp, c->G->n_nodes, "j");
}

/* The per-element output pass of softmax and the norms: the row op's value
 * (from buf[j] when buffered, else recomputed), the epilogue, the stores. */
static void put_out_pass(cg *c, const rowop *R, bool buffered) {
    int n_pos = c->G->n_nodes;
    out_ctx o = {R, buffered, R->n->op == SJ_OP_SOFTMAX, false, {buffered ? -1 : R->x, R->gw, R->bw}};
    o.x_in_buf = buffered && !o.softmax; /* buf holds x (softmax: exp) */
    sj_cg_reset_want(c);
    c->want[c->rp] = true;
    sj_cg_want_stores(c, c->rp + 1, n_pos);
    if (o.x_in_buf && c->vpos[R->x] >= 0) c->avail[c->vpos[R->x]] = true;
    for (int i = 0; i < 3; i++) sj_cg_want_val(c, o.extra[i]);
    sj_cg_close_want(c);
    /* a norm's output pass is its row's heaviest (softmax: the exp pass) */
    put_row_loop(c, c->rp, n_pos, out_body, &o, buffered && !o.softmax);
}

static void exp_body(cg *c, const void *ctx) {
    (void)ctx;
    put(&c->o, "buf[j] = sj_rt_exp_shifted(buf[j] - m);\n");
}

/* Softmax or a norm over one row, buffered or recomputing. */
static void put_row_body(cg *c, const rowop *R, bool buffered, const char *buflen) {
    int L = last_axis(c);
    char eps[64];
    snprintf(eps, sizeof eps, "%.17g", R->n->a.f);
    if (buffered) {
        put(&c->o, "float buf[%s];\n", buflen);
        put_fill(c, R, "buf", false, true);
    } else {
        put(&c->o, "float cb[%d];\n", CHUNK);
    }
    switch (R->n->op) {
    case SJ_OP_SOFTMAX:
        if (buffered) {
            put(&c->o, "float m = sj_rt_max_f32(buf, n%d), inv;\n", L);
            put(&c->o, "if (m == -INFINITY) {\nfor (int64_t j = 0; j < n%d; j++) buf[j] = 0.0f;\n", L);
            put(&c->o, "inv = 0.0f;\n} else {\n");
            put_row_loop(c, 0, 0, exp_body, NULL, true); /* softmax's heaviest pass */
            put(&c->o, "inv = (float)(1.0 / sj_rt_sum_f32(buf, n%d));\n}\n", L);
        } else {
            put(&c->o, "float m = -INFINITY, inv;\n");
            put_chunks(c, R, CHUNK, true, "m = sj_rt_max_combine(m, sj_rt_max_f32(cb, k));\n");
            put(&c->o, "if (m == -INFINITY) {\ninv = 0.0f;\nm = 0.0f;\n} else {\n");
            put(&c->o, "sj_rt_dsum acc;\nsj_rt_dsum_init(&acc);\n");
            put_chunks(c, R, CHUNK, false,
                       "for (int64_t jj = 0; jj < k; jj++) cb[jj] = sj_rt_exp_shifted(cb[jj] - m);\n"
                       "sj_rt_dsum_add(&acc, cb, k);\n");
            put(&c->o, "inv = (float)(1.0 / sj_rt_dsum_get(&acc));\n}\n");
        }
        break;
    case SJ_OP_LAYER_NORM:
        if (buffered) {
            put(&c->o, "const double mean = sj_rt_sum_f32(buf, n%d) / (double)n%d;\n", L, L);
            put(&c->o, "const double var = sj_rt_sumsq_f32(buf, mean, n%d) / (double)n%d;\n", L, L);
        } else {
            put(&c->o, "sj_rt_dsum acc, acc2;\nsj_rt_dsum_init(&acc);\nsj_rt_dsum_init(&acc2);\n");
            put_chunks(c, R, CHUNK, true, "sj_rt_dsum_add(&acc, cb, k);\n");
            put(&c->o, "const double mean = sj_rt_dsum_get(&acc) / (double)n%d;\n", L);
            put_chunks(c, R, CHUNK, false, "sj_rt_dsum_addsq(&acc2, cb, mean, k);\n");
            put(&c->o, "const double var = sj_rt_dsum_get(&acc2) / (double)n%d;\n", L);
        }
        put(&c->o, "float mlo;\nconst float mhi = sj_rt_split(mean, &mlo);\n");
        put(&c->o, "const float frs = (float)(1.0 / sqrt(var + %s));\n", eps);
        break;
    default: /* RMS norm */
        if (buffered) {
            put(&c->o, "const double ms = sj_rt_sumsq_f32(buf, 0.0, n%d) / (double)n%d;\n", L, L);
        } else {
            put(&c->o, "sj_rt_dsum acc;\nsj_rt_dsum_init(&acc);\n");
            put_chunks(c, R, CHUNK, true, "sj_rt_dsum_addsq(&acc, cb, 0.0, k);\n");
            put(&c->o, "const double ms = sj_rt_dsum_get(&acc) / (double)n%d;\n", L);
        }
        put(&c->o, "const float fr = (float)(1.0 / sqrt(ms + %s));\n", eps);
        break;
    }
    put_out_pass(c, R, buffered);
}

/* An integer sum or amax's pass over the row. */
static void ireduce_body(cg *c, const void *ctx) {
    const rowop *R = ctx;
    bool amax = R->n->op == SJ_OP_AMAX;
    sj_cg_put_loads(c, "j", &R->x, 1);
    sj_cg_put_nodes(c, 0, c->rp);
    put(&c->o, amax ? "im = " : "us += (uint64_t)");
    sj_cg_put_ref(c, R->x);
    if (amax) put(&c->o, " > im ? "), sj_cg_put_ref(c, R->x), put(&c->o, " : im");
    put(&c->o, ";\n");
    sj_cg_put_stores(c, 0, c->rp, "j");
}

/* sum / mean / amax: one chunked pass, then the epilogue once per row. */
static void put_reduce_body(cg *c, const rowop *R) {
    int L = last_axis(c), n_pos = c->G->n_nodes;
    int32_t y = R->n->out;
    sj_dtype dt = R->dt;
    if (is_f(dt)) {
        put(&c->o, "float cb[%d];\ndouble sum = 0.0;\nfloat m = -INFINITY;\n(void)sum;\n(void)m;\n", RCHUNK);
        put_chunks(c, R, RCHUNK, true,
                   R->n->op == SJ_OP_AMAX ? "m = sj_rt_max_combine(m, sj_rt_max_f32(cb, k));\n"
                                          : "sum += sj_rt_sum_f32(cb, k);\n");
        if (R->n->op == SJ_OP_AMAX) put(&c->o, "const float v%d = m;\n", (int)y);
        else if (R->n->op == SJ_OP_MEAN)
            put(&c->o, "const float v%d = (float)(n%d ? sum / (double)n%d : NAN);\n", (int)y, L, L);
        else put(&c->o, "const float v%d = (float)sum;\n", (int)y);
    } else {
        bool amax = R->n->op == SJ_OP_AMAX;
        put(&c->o, "uint64_t us = 0;\nint64_t im = INT64_MIN;\n(void)us;\n(void)im;\n");
        sj_cg_reset_want(c);
        sj_cg_want_val(c, R->x);
        sj_cg_want_stores(c, 0, c->rp);
        sj_cg_close_want(c);
        put_row_loop(c, 0, c->rp, ireduce_body, R, false);
        put(&c->o, "const int64_t v%d = %s(%s);\n", (int)y, dt == SJ_I32 ? "sj_rt_wrap32" : "",
            amax ? "im" : "sj_rt_i64_from_u(us)");
    }
    sj_cg_reset_want(c);
    c->avail[c->rp] = true;
    sj_cg_want_stores(c, c->rp + 1, n_pos);
    sj_cg_close_want(c);
    sj_cg_put_loads(c, NULL, NULL, 0);
    sj_cg_put_nodes(c, c->rp + 1, n_pos);
    sj_cg_put_stores(c, c->rp, n_pos, NULL);
}

static void gen_row(cg *c) {
    const sj_group *G = c->G;
    int r = G->rank, L = r - 1;
    rowop R = sj_cg_row_op(c);
    put_decompose(c, L);
    put(&c->o, "for (int64_t row = begin; row < end; row++) {\n");
    put_pointers(c, L);
    if (R.reduce) {
        put_reduce_body(c, &R);
    } else {
        int64_t nl;
        if (sj_cg_kconst(c, G->shape[L], &nl)) {
            char len[32];
            snprintf(len, sizeof len, "%" PRId64, nl > 0 ? nl : 1);
            put_row_body(c, &R, nl <= ROWBUF, len);
        } else {
            put(&c->o, "if (n%d <= %d) {\n", L, ROWBUF);
            put_row_body(c, &R, true, STR(ROWBUF));
            put(&c->o, "} else {\n");
            put_row_body(c, &R, false, NULL);
            put(&c->o, "}\n");
        }
    }
    put_carry(c, L - 1);
    put(&c->o, "}\n");
}

/* -- Context set-up (codegen_int.h) ------------------------------------------------------ */

void sj_cg_init(cg *c, const sj_graph *g, const sj_fplan *p, const int64_t *sym_vals) {
    memset(c, 0, sizeof *c);
    c->g = g;
    c->p = p;
    c->sym = sym_vals;
    c->vpos = sj_malloc(((size_t)g->n_vals + 1) * sizeof *c->vpos);
    c->want = sj_malloc(((size_t)g->n_nodes + 1) * sizeof *c->want);
    c->avail = sj_malloc(((size_t)g->n_nodes + 1) * sizeof *c->avail);
    if (!c->vpos || !c->want || !c->avail) c->o.oom = true;
}

void sj_cg_group(cg *c, const sj_group *G) {
    const sj_graph *g = c->g;
    c->G = G;
    c->rp = -1;
    c->n_acc = 0;
    for (int k = 0; k < G->n_loads; k++) c->acc[c->n_acc++] = &G->loads[k];
    for (int k = 0; k < G->n_stores; k++) c->acc[c->n_acc++] = &G->stores[k];
    for (int32_t v = 0; v < g->n_vals; v++) c->vpos[v] = -1;
    for (int q = 0; q < G->n_nodes; q++) c->vpos[g->nodes[G->nodes[q]].out] = q;
}

void sj_cg_fini(cg *c) {
    free(c->vpos);
    free(c->want);
    free(c->avail);
    c->vpos = NULL;
    c->want = c->avail = NULL;
}

/* -- Entry point ------------------------------------------------------------------------- */

char *sj_cg_take(cg *c, size_t *len) {
    sj_cg_fini(c);
    if (c->o.oom) {
        free(c->o.s);
        return NULL;
    }
    if (len) *len = c->o.len;
    return c->o.s;
}

/* The default streaming threshold: a quarter of the last-level cache (32
 * MiB when the system does not say). Other cores, processes and virtual
 * machines share that cache, so a call's data that fills more than a
 * fraction of it is gone before anything reads it again: on a 2-vCPU VM
 * whose host reports 105 MiB, calls moving 50-100 MB ran 1.2-1.4x faster
 * streamed (w2 S = 4096, w3 S = 1024; bench/RESULTS.md, fifteenth stop). */
static double stream_default(void) {
    long v = -1;
#ifdef _SC_LEVEL3_CACHE_SIZE
    v = sysconf(_SC_LEVEL3_CACHE_SIZE);
    if (v <= 0) v = sysconf(_SC_LEVEL2_CACHE_SIZE);
#endif
    return (v > 0 ? (double)v : 32.0 * 1024 * 1024) / 4;
}

char *sj_codegen_c(const sj_graph *g, const sj_fplan *p, const int64_t *sym_vals, const sj_codegen_opts *o,
                   size_t *len) {
    cg c;
    cstate cs = {0};
    sj_cg_init(&c, g, p, sym_vals);
    c.elem = put_elem;
    c.f32_elem = f32_elem;
    c.user = &cs;
    c.test_skew = o ? o->test_skew : 0;
    const char *prefix = o && o->prefix ? o->prefix : "";
    int64_t sm = o ? o->stream_min_bytes : 0;
    cs.stream_min = sm < 0 ? -1.0 : sm == 0 ? stream_default() : (double)sm;
    put(&c.o, "%s", sj_kernel_rt_text);
    put(&c.o, "\n/* -- generated: %d groups, %s form -- */\n", p->n_generated, sym_vals ? "specialized" : "symbolic");
    for (int gi = 0; gi < p->n_groups && !c.o.oom; gi++) {
        const sj_group *G = &p->groups[gi];
        if (G->kind == SJ_G_NODE) continue;
        if (o && o->variants) o->variants[gi] = 1;
        sj_cg_group(&c, G);
        stream_setup(&c);
        put_head(&c, prefix);
        put_stream_head(&c);
        if (G->kind == SJ_G_POINTWISE) gen_pointwise(&c);
        else gen_row(&c);
        put_stream_tail(&c);
        put(&c.o, "}\n");
    }
    return sj_cg_take(&c, len);
}
