/* Guard sets compiled into a flat check program (see guard.h).
 *
 * Program
 *   One instruction per guard, in a fixed order. For each input, in order:
 *     INPUT    dtype | rank << 8 | device << 16 == one packed word (the
 *              packing of sj_sig_pack), one compare; then the layout:
 *              row-major contiguous, or the exact strides;
 *     per axis SIZE     size == constant,
 *              BIND     first occurrence of a symbol: sym_vals[s] = size,
 *                       then lo <= size <= hi (the pool's range at build),
 *              DUCK     size == sym_vals[s] (bound earlier: duck sizing).
 *   Then the sizes whose expression is neither a constant nor a symbol
 *   (SIZE_EX, once every symbol is bound; the tracer never makes them), and
 *   then the facts in their given order:
 *     DIVSYM / DIVSYM2  a symbol divisible by k (k a power of two: a mask),
 *     DIV      an expression divisible by k,
 *     REL      any other relation, lhs and rhs through sj_ex_eval (sides
 *              that are constants are stored as values).
 *   Facts whose sides are both constants are decided here: true ones are
 *   dropped, a false one stays as a REL of two constants that always fails.
 *
 * Evaluation stops at the first failing instruction, so the failure reported
 * is the first one in this order (within INPUT: dtype, rank, device, then
 * the layout at the lowest axis), whatever the thread or the call. The loop
 * never formats text: on failure a cold function re-reads the instruction
 * and the input and fills sj_guard_failure. On failure sym_vals may hold
 * values of the symbols bound before the failing guard.
 *
 * Symbols that no input size binds are never written: facts using them see
 * whatever the caller left in sym_vals (the runtime never makes such facts).
 *
 * Unnamed inputs (names NULL, or a NULL or empty name) are "input 0", ... in
 * messages and in sj_guard_print, and their failures have input_name "".
 */
#include "base/alloc.h"
#include "guards/guard.h"

#include <assert.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* -- Instructions -------------------------------------------------------- */

/* X(op, failure kind) */
#define OP_LIST(X)                                                              \
    X(OP_INPUT, SJ_GUARD_DTYPE)                                                 \
    X(OP_SIZE, SJ_GUARD_SIZE)                                                   \
    X(OP_BIND, SJ_GUARD_RANGE)                                                  \
    X(OP_DUCK, SJ_GUARD_DUCK)                                                   \
    X(OP_SIZE_EX, SJ_GUARD_SIZE)                                                \
    X(OP_DIVSYM, SJ_GUARD_DIVISIBLE)                                            \
    X(OP_DIVSYM2, SJ_GUARD_DIVISIBLE)                                           \
    X(OP_DIV, SJ_GUARD_DIVISIBLE)                                               \
    X(OP_REL, SJ_GUARD_RELATION)

enum {
#define SJ_X(op, kind) op,
    OP_LIST(SJ_X)
#undef SJ_X
    OP_COUNT
};

/* Fields by op:
 *   INPUT   axis = rank, a = packed word, flag = contiguous (else the exact
 *           strides are the input's, in gs->inputs)
 *   SIZE    a = the constant
 *   BIND    arg = symbol, a = lo, b = hi
 *   DUCK    arg = symbol, a/b = input/axis that bound it
 *   SIZE_EX arg = expression
 *   DIVSYM  arg = symbol, a = k, b = fact; input/axis: where the symbol is
 *           bound (NO_INPUT when nowhere). DIVSYM2: a = k - 1 (a mask).
 *   DIV     arg = expression, a = k, b = fact
 *   REL     arg = fact, a/b = lhs/rhs (ids, or values per flag) */
typedef struct instr {
    uint8_t op, input, axis, flag;
    int32_t arg;
    int64_t a, b;
} instr;

enum { REL_MASK = 3, LHS_CONST = 4, RHS_CONST = 8 }; /* REL flag: rel | these */
enum { NO_INPUT = 255, MAX_INPUTS = 254, TEXT_MAX = 512 };

typedef struct gin {
    char name[32]; /* "" when unnamed */
    char who[48];  /* in messages: "input 'x'", or "input 0" when unnamed */
    sj_guard_input in;
} gin;

typedef struct gfact {
    sj_fact f;
    char *rel_text; /* "s0 % 2 == 0" */
    char *e_text;   /* divisibility: the expression, "s0 + s1" */
} gfact;

struct sj_guard_set {
    const sj_exprs *ex;
    int entry, n_facts, n;
    gin *inputs;
    gfact *facts;
    instr prog[];
};

static const char *const kind_names[] = {
#define SJ_X(name, text) text,
    SJ_GUARD_KIND_LIST(SJ_X)
#undef SJ_X
};
_Static_assert(sizeof ((gin *)0)->name == sizeof ((sj_guard_failure *)0)->input_name, "names");
_Static_assert(sizeof kind_names / sizeof kind_names[0] == SJ_GUARD_KIND_COUNT, "guard kind names");

static const char *const rel_ops[] = {[SJ_REL_EQ] = "==", [SJ_REL_NE] = "!=", [SJ_REL_LT] = "<",
                                      [SJ_REL_GE] = ">="};
_Static_assert((int)SJ_REL_GE <= (int)REL_MASK, "rel fits the flag");

SJ_API const char *sj_guard_kind_name(sj_guard_kind k) {
    return (unsigned)k < SJ_GUARD_KIND_COUNT ? kind_names[k] : "?";
}

static int64_t pack_meta(sj_dtype dt, int rank, sj_device dev) {
    return (int64_t)dt | (int64_t)rank << 8 | (int64_t)dev << 16;
}

static bool rel_holds(int rel, int64_t l, int64_t r) {
    switch (rel) {
    case SJ_REL_EQ: return l == r;
    case SJ_REL_NE: return l != r;
    case SJ_REL_LT: return l < r;
    default: return l >= r;
    }
}

/* -- Recognising divisibility ------------------------------------------- */

static bool match_mod(const sj_exprs *ex, sj_expr e, sj_expr *arg, int64_t *k) {
    return sj_ex_is_mod_const(ex, e, arg, k);
}

/* -- Building ------------------------------------------------------------ */

/* Fault injection (sj_guard_fail_allocs_after): allocations this thread has
 * left before every allocation fails; negative: never. */
static _Thread_local long allocs_left = -1;

void sj_guard_fail_allocs_after(long n) { allocs_left = n; }

static void *alloc(size_t n, bool zero) {
    if (allocs_left == 0) return NULL;
    if (allocs_left > 0) allocs_left--;
    return zero ? sj_calloc(1, n) : sj_malloc(n);
}

static bool valid_id(const sj_exprs *ex, sj_expr e) { return e >= 0 && e < sj_ex_count(ex); }

/* e printed into a new string. */
static char *expr_text(const sj_exprs *ex, sj_expr e) {
    int n = sj_ex_print(ex, e, NULL, 0);
    char *s = n >= 0 ? alloc((size_t)n + 1, false) : NULL;
    if (s) sj_ex_print(ex, e, s, (size_t)n + 1);
    return s;
}

static char *rel_text(const sj_exprs *ex, const sj_fact *f) {
    char *l = expr_text(ex, f->lhs), *r = expr_text(ex, f->rhs), *s = NULL;
    if (l && r) {
        size_t n = strlen(l) + strlen(r) + 6;
        if ((s = alloc(n, false))) snprintf(s, n, "%s %s %s", l, rel_ops[f->rel], r);
    }
    free(l), free(r);
    return s;
}

static void emit(sj_guard_set *gs, int op, int input, int axis, int32_t arg, int64_t a, int64_t b) {
    gs->prog[gs->n++] = (instr){(uint8_t)op, (uint8_t)input, (uint8_t)axis, 0, arg, a, b};
}

/* One fact: dropped (constant and true), DIVSYM/DIV, or REL. */
static bool build_fact(sj_guard_set *gs, int fi, const int32_t *site) {
    const sj_exprs *ex = gs->ex;
    gfact *gf = &gs->facts[fi];
    const sj_fact *f = &gf->f;
    int64_t lv = 0, rv = 0, k;
    bool lc = sj_ex_is_const(ex, f->lhs, &lv), rc = sj_ex_is_const(ex, f->rhs, &rv);
    sj_expr e;
    int s;
    if (lc && rc && rel_holds(f->rel, lv, rv)) return true;
    if (!(gf->rel_text = rel_text(ex, f))) return false;
    if (f->rel == SJ_REL_EQ && (lc || rc) && (lc ? lv : rv) == 0 &&
        match_mod(ex, lc ? f->rhs : f->lhs, &e, &k)) {
        if (!(gf->e_text = expr_text(ex, e))) return false;
        if (sj_ex_is_sym(ex, e, &s)) {
            bool pow2 = (k & (k - 1)) == 0;
            int at = site[s];
            emit(gs, pow2 ? OP_DIVSYM2 : OP_DIVSYM, at < 0 ? NO_INPUT : at >> 8, at < 0 ? 0 : at & 255,
                 s, pow2 ? k - 1 : k, fi);
        } else {
            emit(gs, OP_DIV, 0, 0, e, k, fi);
        }
        return true;
    }
    emit(gs, OP_REL, 0, 0, fi, lc ? lv : f->lhs, rc ? rv : f->rhs);
    gs->prog[gs->n - 1].flag = (uint8_t)(f->rel | (lc ? LHS_CONST : 0) | (rc ? RHS_CONST : 0));
    return true;
}

sj_guard_set *sj_guard_build(const sj_exprs *ex, const sj_guard_input *ins, int n_inputs,
                             const sj_fact *facts, int n_facts, const char *const *names,
                             int entry_id) {
    if (!ex || n_inputs < 0 || n_inputs > MAX_INPUTS || (n_inputs && !ins) || n_facts < 0 ||
        (n_facts && !facts))
        return NULL;
    size_t cap = (size_t)n_facts;
    for (int i = 0; i < n_inputs; i++) {
        if (ins[i].rank < 0 || ins[i].rank > SJ_MAX_RANK) return NULL;
        cap += 1 + (size_t)ins[i].rank;
    }
    for (int i = 0; i < n_facts; i++)
        if (!valid_id(ex, facts[i].lhs) || !valid_id(ex, facts[i].rhs) ||
            (unsigned)facts[i].rel > SJ_REL_GE)
            return NULL;
    int n_syms = sj_sym_count(ex);
    sj_guard_set *gs = alloc(sizeof *gs + cap * sizeof(instr), true);
    int32_t *site = alloc((size_t)(n_syms > 0 ? n_syms : 1) * sizeof *site, false); /* input << 8 | axis */
    if (!gs || !site) goto fail;
    gs->ex = ex;
    gs->entry = entry_id;
    gs->inputs = alloc((size_t)(n_inputs ? n_inputs : 1) * sizeof *gs->inputs, true);
    gs->facts = alloc((size_t)(n_facts ? n_facts : 1) * sizeof *gs->facts, true);
    if (!gs->inputs || !gs->facts) goto fail;
    gs->n_facts = n_facts;
    for (int s = 0; s < n_syms; s++) site[s] = -1;

    for (int i = 0; i < n_inputs; i++) {
        const sj_guard_input *in = &ins[i];
        gin *g = &gs->inputs[i];
        g->in = *in;
        if (names && names[i]) snprintf(g->name, sizeof g->name, "%s", names[i]);
        if (g->name[0])
            snprintf(g->who, sizeof g->who, "input '%s'", g->name);
        else
            snprintf(g->who, sizeof g->who, "input %d", i);
        emit(gs, OP_INPUT, i, in->rank, 0, pack_meta(in->dtype, in->rank, in->device), 0);
        gs->prog[gs->n - 1].flag = in->contiguous;
        for (int a = 0; a < in->rank; a++) {
            sj_expr d = in->dim[a];
            int64_t c, lo, hi;
            int s;
            if (!valid_id(ex, d)) goto fail;
            if (sj_ex_is_const(ex, d, &c)) {
                emit(gs, OP_SIZE, i, a, 0, c, 0);
            } else if (sj_ex_is_sym(ex, d, &s) && site[s] >= 0) {
                emit(gs, OP_DUCK, i, a, s, site[s] >> 8, site[s] & 255);
            } else if (sj_ex_is_sym(ex, d, &s)) {
                sj_sym_range(ex, s, &lo, &hi);
                site[s] = i << 8 | a;
                emit(gs, OP_BIND, i, a, s, lo, hi);
            }
        }
    }
    for (int i = 0; i < n_inputs; i++)
        for (int a = 0; a < ins[i].rank; a++)
            if (!sj_ex_is_const(ex, ins[i].dim[a], NULL) && !sj_ex_is_sym(ex, ins[i].dim[a], NULL))
                emit(gs, OP_SIZE_EX, i, a, ins[i].dim[a], 0, 0);
    for (int i = 0; i < n_facts; i++) {
        gs->facts[i].f = facts[i];
        if (!build_fact(gs, i, site)) goto fail;
    }
    assert((size_t)gs->n <= cap);
    free(site);
    return gs;
fail:
    free(site);
    sj_guard_free(gs);
    return NULL;
}

void sj_guard_free(sj_guard_set *gs) {
    if (!gs) return;
    for (int i = 0; gs->facts && i < gs->n_facts; i++) {
        free(gs->facts[i].rel_text);
        free(gs->facts[i].e_text);
    }
    free(gs->facts);
    free(gs->inputs);
    free(gs);
}

int sj_guard_size(const sj_guard_set *gs) { return gs ? gs->n : 0; }

/* -- Failure reports -----------------------------------------------------
 * Cold: the evaluation loop only finds the failing instruction; this fills
 * the record from it, the input and sym_vals, without allocating. */

#if defined(__GNUC__)
#define COLD __attribute__((noinline, cold))
#define PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define COLD
#define PRINTF(f, a)
#endif

static const sj_guard_kind op_kinds[] = {
#define SJ_X(op, kind) kind,
    OP_LIST(SJ_X)
#undef SJ_X
};
_Static_assert(sizeof op_kinds / sizeof op_kinds[0] == OP_COUNT, "op kind table");

static const char *device_name(int64_t d) {
    return d == SJ_HOST ? "host" : d == SJ_CUDA ? "cuda" : "?";
}

/* The high end of a range [lo, hi]: "16]", or "inf)" for INT64_MAX. */
static const char *range_end(int64_t hi, char num[24]) {
    if (hi == INT64_MAX) return "inf)";
    snprintf(num, 24, "%" PRId64 "]", hi);
    return num;
}

/* In sj_guard_print: "x", or "input 0" when unnamed. */
static const char *bare_name(const gin *g) { return g->name[0] ? g->name : g->who; }

static PRINTF(3, 4) void say(sj_guard_failure *f, size_t *pos, const char *fmt, ...) {
    if (*pos >= sizeof f->message - 1) return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(f->message + *pos, sizeof f->message - *pos, fmt, ap);
    va_end(ap);
    if (n > 0) *pos += (size_t)n;
}

static void say_why(sj_guard_failure *f, size_t *pos, const gfact *gf) {
    if (gf->f.why[0]) say(f, pos, " (from %.*s)", (int)sizeof gf->f.why, gf->f.why);
}

/* Is symbol s in the printed text (a token "s<n>")? For symbols >= 63,
 * which the pool's masks lump together. */
static bool text_has_sym(const char *text, int s) {
    char tok[16];
    int n = snprintf(tok, sizeof tok, "s%d", s);
    for (const char *p = strstr(text, tok); p; p = strstr(p + 1, tok)) {
        bool before = p > text && ((p[-1] >= 'a' && p[-1] <= 'z') || (p[-1] >= '0' && p[-1] <= '9'));
        if (!before && !(p[n] >= '0' && p[n] <= '9')) return true;
    }
    return false;
}

/* INPUT: dtype, rank, device, then the layout at the lowest axis off it. */
static void report_input(const sj_guard_set *gs, const instr *ip, const sj_tensor *t,
                         sj_guard_failure *f, size_t *pos, const char *in_who) {
    const sj_guard_input *g = &gs->inputs[ip->input].in;
    int64_t want[SJ_MAX_RANK];
    uint64_t s = 1;
    if (t->dtype != g->dtype) {
        f->expected = g->dtype, f->actual = t->dtype;
        say(f, pos, "%s dtype mismatch: expected %s, actual %s", in_who, sj_dtype_name(g->dtype),
            sj_dtype_name(t->dtype));
        return;
    }
    if (t->rank != g->rank) {
        f->kind = SJ_GUARD_RANK, f->expected = g->rank, f->actual = t->rank;
        say(f, pos, "%s rank mismatch: expected %d, actual %d", in_who, g->rank, (int)t->rank);
        return;
    }
    if (t->device != g->device) {
        f->kind = SJ_GUARD_DEVICE, f->expected = g->device, f->actual = t->device;
        say(f, pos, "%s device mismatch: expected %s, actual %s", in_who, device_name(g->device),
            device_name(t->device));
        return;
    }
    f->kind = SJ_GUARD_STRIDE;
    for (int i = g->rank - 1; i >= 0; i--)
        want[i] = g->contiguous ? (int64_t)s : g->stride[i], s *= (uint64_t)t->shape[i];
    for (int i = 0; i < g->rank && f->axis < 0; i++)
        if (t->stride[i] != want[i] && !(g->contiguous && t->shape[i] == 1))
            f->axis = i, f->expected = want[i], f->actual = t->stride[i];
    assert(f->axis >= 0);
    if (g->contiguous)
        say(f, pos, "%s layout mismatch: expected contiguous, actual stride %" PRId64
            " at axis %d (contiguous stride %" PRId64 ")", in_who, f->actual, f->axis, f->expected);
    else
        say(f, pos, "%s stride mismatch at axis %d: expected %" PRId64 ", actual %" PRId64, in_who,
            f->axis, f->expected, f->actual);
}

static COLD void report(const sj_guard_set *gs, const instr *ip, const sj_tensor *inputs,
                        const int64_t *sym_vals, sj_guard_failure *f) {
    const char *in_who = NULL;
    char num[24];
    size_t pos = 0;
    const sj_tensor *t = ip->op <= OP_SIZE_EX ? &inputs[ip->input] : NULL;
    bool has_input = t || (ip->op <= OP_DIVSYM2 && ip->input != NO_INPUT);
    memset(f, 0, sizeof *f);
    f->entry = gs->entry;
    f->kind = op_kinds[ip->op];
    f->input = has_input ? ip->input : -1;
    f->axis = has_input && ip->op != OP_INPUT ? ip->axis : -1;
    if (has_input) {
        in_who = gs->inputs[ip->input].who;
        memcpy(f->input_name, gs->inputs[ip->input].name, sizeof f->input_name);
    }
    switch (ip->op) {
    case OP_INPUT:
        report_input(gs, ip, t, f, &pos, in_who);
        break;
    case OP_SIZE:
    case OP_SIZE_EX:
        f->expected = ip->op == OP_SIZE ? ip->a : sj_ex_eval(gs->ex, ip->arg, sym_vals);
        f->actual = t->shape[ip->axis];
        say(f, &pos, "%s size mismatch at axis %d: expected %" PRId64 ", actual %" PRId64, in_who,
            ip->axis, f->expected, f->actual);
        break;
    case OP_BIND:
        f->expected = ip->a, f->expected_hi = ip->b, f->actual = t->shape[ip->axis];
        say(f, &pos, "%s size at axis %d out of range: expected [%" PRId64 ", %s, actual %" PRId64,
            in_who, ip->axis, ip->a, range_end(ip->b, num), f->actual);
        break;
    case OP_DUCK:
        f->expected = sym_vals[ip->arg], f->actual = t->shape[ip->axis];
        say(f, &pos, "%s size mismatch at axis %d: expected %" PRId64 " (equal to %s axis %d), actual %" PRId64,
            in_who, ip->axis, f->expected, gs->inputs[ip->a].who, (int)ip->b,
            f->actual);
        break;
    case OP_DIVSYM:
    case OP_DIVSYM2:
    case OP_DIV: {
        const gfact *gf = &gs->facts[ip->b];
        f->expected = ip->op == OP_DIVSYM2 ? ip->a + 1 : ip->a;
        f->actual = ip->op == OP_DIV ? sj_ex_eval(gs->ex, ip->arg, sym_vals) : sym_vals[ip->arg];
        if (has_input)
            say(f, &pos, "%s size at axis %d", in_who, ip->axis);
        else
            say(f, &pos, "%s", gf->e_text);
        say(f, &pos, " not divisible by %" PRId64 ": actual %" PRId64, f->expected, f->actual);
        say_why(f, &pos, gf);
        break;
    }
    default: { /* OP_REL */
        const gfact *gf = &gs->facts[ip->arg];
        uint64_t mask = sj_ex_syms(gs->ex, gf->f.lhs) | sj_ex_syms(gs->ex, gf->f.rhs);
        int n_syms = sj_sym_count(gs->ex), listed = 0;
        f->actual = ip->flag & LHS_CONST ? ip->a : sj_ex_eval(gs->ex, gf->f.lhs, sym_vals);
        f->expected = ip->flag & RHS_CONST ? ip->b : sj_ex_eval(gs->ex, gf->f.rhs, sym_vals);
        say(f, &pos, "relation failed: %s", gf->rel_text);
        for (int s = 0; s < n_syms && s < 64; s++) {
            if (!(mask >> s & 1)) continue;
            for (int u = s; u < (s == 63 ? n_syms : s + 1); u++)
                if (s < 63 || text_has_sym(gf->rel_text, u))
                    say(f, &pos, "%s s%d = %" PRId64, listed++ ? "," : " with", u, sym_vals[u]);
        }
        say_why(f, &pos, gf);
        break;
    }
    }
    if (f->kind != SJ_GUARD_RANGE) f->expected_hi = f->expected;
}

/* -- Evaluation ---------------------------------------------------------- */

/* Row-major contiguous: size-1 axes may have any stride; any size 0 makes
 * every layout contiguous. Unsigned products: with a size 0 present the
 * other sizes are unchecked and may overflow (the answer is then true). */
static inline bool contiguous(const sj_tensor *t, int rank) {
    uint64_t s = 1;
    bool ok = true, empty = false;
    for (int i = rank - 1; i >= 0; i--) {
        int64_t n = t->shape[i];
        ok &= n == 1 || (uint64_t)t->stride[i] == s;
        empty |= n == 0;
        s *= (uint64_t)n;
    }
    return ok || empty;
}

/* The layout guard of an input that passed its meta check (rank known). */
static inline bool layout_ok(const sj_guard_set *gs, const instr *ip, const sj_tensor *t) {
    if (ip->flag) return contiguous(t, ip->axis);
    const int64_t *want = gs->inputs[ip->input].in.stride;
    for (int i = 0; i < ip->axis; i++)
        if (t->stride[i] != want[i]) return false;
    return true;
}

bool sj_guard_check(const sj_guard_set *gs, const sj_tensor *inputs, int64_t *sym_vals,
                    sj_guard_failure *fail) {
    assert(gs);
    const instr *ip = gs->prog, *end = ip + gs->n;
    for (; ip < end; ip++) {
        switch (ip->op) {
        case OP_INPUT: {
            const sj_tensor *t = &inputs[ip->input];
            if (pack_meta(t->dtype, t->rank, t->device) != ip->a || !layout_ok(gs, ip, t)) goto failed;
            break;
        }
        case OP_SIZE:
            if (inputs[ip->input].shape[ip->axis] != ip->a) goto failed;
            break;
        case OP_BIND: {
            int64_t v = inputs[ip->input].shape[ip->axis];
            sym_vals[ip->arg] = v;
            if (v < ip->a || v > ip->b) goto failed;
            break;
        }
        case OP_DUCK:
            if (inputs[ip->input].shape[ip->axis] != sym_vals[ip->arg]) goto failed;
            break;
        case OP_SIZE_EX:
            if (inputs[ip->input].shape[ip->axis] != sj_ex_eval(gs->ex, ip->arg, sym_vals)) goto failed;
            break;
        case OP_DIVSYM:
            if (sym_vals[ip->arg] % ip->a != 0) goto failed;
            break;
        case OP_DIVSYM2:
            if (sym_vals[ip->arg] & ip->a) goto failed;
            break;
        case OP_DIV:
            if (sj_ex_eval(gs->ex, ip->arg, sym_vals) % ip->a != 0) goto failed;
            break;
        case OP_REL: {
            int64_t l = ip->flag & LHS_CONST ? ip->a : sj_ex_eval(gs->ex, (sj_expr)ip->a, sym_vals);
            int64_t r = ip->flag & RHS_CONST ? ip->b : sj_ex_eval(gs->ex, (sj_expr)ip->b, sym_vals);
            if (!rel_holds(ip->flag & REL_MASK, l, r)) goto failed;
            break;
        }
        default: assert(!"bad guard op"); goto failed;
        }
    }
    return true;
failed:
    if (fail) report(gs, ip, inputs, sym_vals, fail);
    return false;
}

/* -- Printing ------------------------------------------------------------ */

void sj_guard_print(const sj_guard_set *gs, FILE *out, const char *indent) {
    char buf[TEXT_MAX], num[24];
    const char *name = "";
    if (!gs || !out) return;
    if (!indent) indent = "";
    for (const instr *ip = gs->prog; ip < gs->prog + gs->n; ip++) {
        if (ip->op <= OP_SIZE_EX) name = bare_name(&gs->inputs[ip->input]);
        switch (ip->op) {
        case OP_INPUT: {
            const sj_guard_input *g = &gs->inputs[ip->input].in;
            fprintf(out, "%s%s: %s, rank %d, %s, ", indent, name, sj_dtype_name(g->dtype), g->rank,
                    device_name(g->device));
            fputs(g->contiguous ? "contiguous" : "strides [", out);
            for (int a = 0; !g->contiguous && a < g->rank; a++)
                fprintf(out, "%s%" PRId64, a ? ", " : "", g->stride[a]);
            fputs(g->contiguous ? "\n" : "]\n", out);
            break;
        }
        case OP_SIZE:
            fprintf(out, "%s%s.size(%d) == %" PRId64 "\n", indent, name, ip->axis, ip->a);
            break;
        case OP_BIND:
            fprintf(out, "%s%s.size(%d) = s%d in [%" PRId64 ", %s\n", indent, name, ip->axis,
                    (int)ip->arg, ip->a, range_end(ip->b, num));
            break;
        case OP_DUCK:
            fprintf(out, "%s%s.size(%d) == s%d\n", indent, name, ip->axis, (int)ip->arg);
            break;
        case OP_SIZE_EX:
            sj_ex_print(gs->ex, ip->arg, buf, sizeof buf);
            fprintf(out, "%s%s.size(%d) == %s\n", indent, name, ip->axis, buf);
            break;
        default: {
            const gfact *gf = &gs->facts[ip->op == OP_REL ? ip->arg : (int)ip->b];
            fprintf(out, "%s%s", indent, gf->rel_text);
            if (gf->f.why[0]) fprintf(out, "   (from %.*s)", (int)sizeof gf->f.why, gf->f.why);
            fputc('\n', out);
        }
        }
    }
}
