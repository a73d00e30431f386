/* Symbolic integer expressions: a pool of hash-consed canonical polynomials
 * over atoms (symbols, floordiv, mod, min, max).
 *
 * Representation
 *   nodes[]  the compact array sj_ex_eval_all walks; a node's operands always
 *            have smaller ids than the node.
 *   terms[]  the terms of every POLY node, contiguous per node.
 *   facs[]   the factors (atom, exponent) of every term, contiguous per term.
 *   side arrays, one entry per node, never touched by evaluation: content
 *            hash, symbol mask, value at the hints, range.
 *   table    open addressing with linear probing: node ids by content hash.
 *
 * Canonical polynomial: a constant c plus terms coef * monomial with coef != 0
 * and distinct monomials, sorted by degree (descending), then by factors
 * (atom id ascending, exponent descending, shorter first). A monomial's
 * factors are atoms (never CONST or POLY), sorted by id, exponent >= 1.
 * No terms is a CONST node; exactly 1*atom (c == 0) is the atom itself.
 *
 * floordiv and mod by a positive constant k keep only a canonical remainder
 * part in the atom: terms whose coefficients are multiples of k leave it
 * ((k*A + R)//k == A + R//k, (k*A + R) % k == R % k), its constant lies in
 * [0, k-1], and the gcd of k and its coefficients is 1.
 *
 * Arithmetic wraps modulo 2^64 (never UB); polynomial identities hold in that
 * ring. Ranges and the simplifications decided by ranges assume that values
 * do not overflow int64, as sympy's unbounded integers do.
 */
#include "base/alloc.h"
#include "shapes/expr.h"

#include <assert.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* -- Representation ------------------------------------------------------ */

enum { OP_CONST, OP_SYM, OP_POLY, OP_FLOORDIV, OP_MOD, OP_MIN, OP_MAX, OP_COUNT };

typedef struct node {
    int32_t op;
    int32_t a, b; /* operand ids; SYM: a = symbol; POLY: a = first term, b = term count */
    int64_t c;    /* CONST: the value; POLY: the constant term; else 0 */
} node;

typedef struct term {
    int64_t coef;
    int32_t fac, nfac; /* factors fac .. fac + nfac - 1 */
} term;

typedef struct factor {
    int32_t atom, exp;
} factor;

struct sj_exprs {
    int32_t nsyms, capsyms;
    int64_t *sym_hint, *sym_lo, *sym_hi;

    int32_t n, cap; /* nodes, and the side arrays below */
    node *nodes;
    uint64_t *hash, *mask;
    int64_t *hintv;
    struct ival *rg; /* ranges */

    int32_t nterms, capterms;
    term *terms;
    int32_t nfacs, capfacs;
    factor *facs;

    int32_t *table; /* node ids, -1 when empty */
    size_t tcap;    /* a power of two, at least twice the node count */
};

#define NEG_INF INT64_MIN /* open ends of ranges */
#define POS_INF INT64_MAX
#define MAX_COUNT (INT32_MAX / 2) /* nodes, terms, factors, symbols */
#define MAX_POLY_TERMS (1 << 20)  /* products that would expand further fail */
#define MEMO_SIZE 64

static bool is_atom_op(int op) { return op == OP_SYM || op >= OP_FLOORDIV; }

/* -- Integer helpers ----------------------------------------------------- */

static int64_t wadd(int64_t a, int64_t b) { return (int64_t)((uint64_t)a + (uint64_t)b); }
static int64_t wmul(int64_t a, int64_t b) { return (int64_t)((uint64_t)a * (uint64_t)b); }
static uint64_t mag(int64_t a) { return a < 0 ? 0 - (uint64_t)a : (uint64_t)a; }
static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

/* Python a // b; 0 when b == 0; INT64_MIN // -1 wraps to INT64_MIN. */
static int64_t pydiv(int64_t a, int64_t b) {
    if (b == 0) return 0;
    if (b == -1) return (int64_t)(0 - (uint64_t)a);
    int64_t q = a / b, r = a % b;
    if (r != 0 && ((r < 0) != (b < 0))) q--;
    return q;
}

/* Python a % b (sign of b); 0 when b == 0. */
static int64_t pymod(int64_t a, int64_t b) {
    if (b == 0 || b == -1) return 0;
    int64_t r = a % b;
    if (r != 0 && ((r < 0) != (b < 0))) r += b;
    return r;
}

static uint64_t upow(uint64_t b, int32_t e) {
    uint64_t r = 1;
    if (e == 1) return b;
    while (e > 0) {
        if (e & 1) r *= b;
        e >>= 1;
        if (e) b *= b;
    }
    return r;
}

static uint64_t gcd_u64(uint64_t a, uint64_t b) {
    while (b) {
        uint64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

/* -- Interval arithmetic -------------------------------------------------
 * Bounds are int64 with INT64_MIN and INT64_MAX standing for -inf and +inf;
 * every operation saturates to them. */

typedef struct ival {
    int64_t lo, hi;
} ival;

static const ival EMPTY = {POS_INF, NEG_INF}, FULL = {NEG_INF, POS_INF};

static bool is_inf(int64_t x) { return x == NEG_INF || x == POS_INF; }
static int64_t neg_ext(int64_t x) { return x == NEG_INF ? POS_INF : x == POS_INF ? NEG_INF : -x; }
static ival ineg(ival a) { return (ival){neg_ext(a.hi), neg_ext(a.lo)}; }
static ival hull(ival a, ival b) { return (ival){min64(a.lo, b.lo), max64(a.hi, b.hi)}; }
static ival hull4(int64_t a, int64_t b, int64_t c, int64_t d) {
    return (ival){min64(min64(a, b), min64(c, d)), max64(max64(a, b), max64(c, d))};
}

/* a + b; `pref` is the infinity that wins when both appear. */
static int64_t add_ext(int64_t a, int64_t b, int64_t pref) {
    int64_t r;
    if (a == pref || b == pref) return pref;
    if (is_inf(a)) return a;
    if (is_inf(b)) return b;
    if (__builtin_add_overflow(a, b, &r) || is_inf(r)) return a > 0 ? POS_INF : NEG_INF;
    return r;
}

static int64_t mul_ext(int64_t a, int64_t b) {
    int64_t r;
    if (a == 0 || b == 0) return 0;
    if (is_inf(a) || is_inf(b) || __builtin_mul_overflow(a, b, &r) || is_inf(r))
        return ((a < 0) != (b < 0)) ? NEG_INF : POS_INF;
    return r;
}

static int64_t pow_ext(int64_t x, int32_t e) {
    int64_t r = 1;
    for (; e > 0; e >>= 1) {
        if (e & 1) r = mul_ext(r, x);
        if (e > 1) x = mul_ext(x, x);
    }
    return r;
}

static ival imul(ival a, ival b) {
    return hull4(mul_ext(a.lo, b.lo), mul_ext(a.lo, b.hi), mul_ext(a.hi, b.lo),
                 mul_ext(a.hi, b.hi));
}

static ival ipow(ival a, int32_t e) {
    int64_t plo = pow_ext(a.lo, e), phi = pow_ext(a.hi, e);
    if ((e & 1) || a.lo >= 0) return (ival){plo, phi};
    if (a.hi <= 0) return (ival){phi, plo};
    return (ival){0, max64(plo, phi)};
}

/* x // y for y >= 1. */
static int64_t div_ext(int64_t x, int64_t y) {
    if (y == POS_INF) return x >= 0 ? 0 : -1;
    return is_inf(x) ? x : pydiv(x, y);
}

/* a // b or a % b for 1 <= b.lo <= b.hi. floor(a/b) is monotone in each
 * operand, so its extremes lie at the corners. */
static ival divmod_pos(int op, ival a, ival b) {
    if (b.lo == POS_INF) return FULL;
    if (op == OP_FLOORDIV)
        return hull4(div_ext(a.lo, b.lo), div_ext(a.lo, b.hi), div_ext(a.hi, b.lo),
                     div_ext(a.hi, b.hi));
    if (a.lo >= 0 && a.hi < b.lo) return a;
    if (b.lo == b.hi && !is_inf(a.lo) && !is_inf(a.hi) && pydiv(a.lo, b.lo) == pydiv(a.hi, b.lo))
        return (ival){pymod(a.lo, b.lo), pymod(a.hi, b.lo)};
    ival r = {0, b.hi == POS_INF ? POS_INF : b.hi - 1};
    if (a.lo >= 0 && a.hi < r.hi) r.hi = a.hi;
    return r;
}

/* a // b or a % b: the union over b's negative part, zero and positive part. */
static ival range_divmod(int op, ival a, ival b) {
    ival r = EMPTY;
    if (b.lo <= 0 && b.hi >= 0) r = (ival){0, 0}; /* b == 0 gives 0 */
    if (b.hi >= 1) r = hull(r, divmod_pos(op, a, (ival){max64(b.lo, 1), b.hi}));
    if (b.lo <= -1) { /* a // b == (-a) // (-b), a % b == -((-a) % (-b)) */
        ival q = divmod_pos(op, ineg(a), (ival){max64(neg_ext(b.hi), 1), neg_ext(b.lo)});
        r = hull(r, op == OP_MOD ? ineg(q) : q);
    }
    return r;
}

/* c + sum of terms t[0..nt-1] (factor offsets into f), from atoms' ranges. */
static ival poly_range(const sj_exprs *p, int64_t c, const term *t, int32_t nt,
                       const factor *f) {
    ival r = {c, c};
    for (int32_t i = 0; i < nt; i++) {
        ival tr = {t[i].coef, t[i].coef};
        for (int32_t j = 0; j < t[i].nfac; j++)
            tr = imul(tr, ipow(p->rg[f[t[i].fac + j].atom], f[t[i].fac + j].exp));
        r = (ival){add_ext(r.lo, tr.lo, NEG_INF), add_ext(r.hi, tr.hi, POS_INF)};
    }
    return r;
}

/* The range of a node from its operands' stored ranges. */
static ival node_range(const sj_exprs *p, const node *nd) {
    ival a = nd->op >= OP_FLOORDIV ? p->rg[nd->a] : FULL;
    ival b = nd->op >= OP_FLOORDIV ? p->rg[nd->b] : FULL;
    switch (nd->op) {
    case OP_CONST: return (ival){nd->c, nd->c};
    case OP_SYM: return (ival){p->sym_lo[nd->a], p->sym_hi[nd->a]};
    case OP_POLY: return poly_range(p, nd->c, p->terms + nd->a, nd->b, p->facs);
    case OP_MIN: return (ival){min64(a.lo, b.lo), min64(a.hi, b.hi)};
    case OP_MAX: return (ival){max64(a.lo, b.lo), max64(a.hi, b.hi)};
    default: return range_divmod(nd->op, a, b);
    }
}

/* -- Node values --------------------------------------------------------- */

/* The value of nd given every smaller id's value in v[]. */
static inline int64_t node_value(const sj_exprs *p, const node *nd, const int64_t *v,
                                 const int64_t *sv) {
    switch (nd->op) {
    case OP_CONST: return nd->c;
    case OP_SYM: return sv[nd->a];
    case OP_POLY: {
        uint64_t acc = (uint64_t)nd->c;
        const term *t = p->terms + nd->a, *te = t + nd->b;
        for (; t < te; t++) {
            uint64_t m = (uint64_t)t->coef;
            const factor *f = p->facs + t->fac, *fe = f + t->nfac;
            for (; f < fe; f++)
                m *= upow((uint64_t)v[f->atom], f->exp);
            acc += m;
        }
        return (int64_t)acc;
    }
    case OP_FLOORDIV: return pydiv(v[nd->a], v[nd->b]);
    case OP_MOD: return pymod(v[nd->a], v[nd->b]);
    case OP_MIN: return min64(v[nd->a], v[nd->b]);
    case OP_MAX: return max64(v[nd->a], v[nd->b]);
    }
    assert(!"bad op");
    return 0;
}

/* -- Pool and hash table ------------------------------------------------- */

/* Fault injection (sj_ex_fail_allocs_after): allocations this thread has
 * left before every allocation fails; negative: never. */
static _Thread_local long allocs_left = -1;

void sj_ex_fail_allocs_after(long n) { allocs_left = n; }

/* Every allocation of the module goes through here. */
static void *resize(void *old, size_t count, size_t elem) {
    if (count > SIZE_MAX / elem || allocs_left == 0) return NULL;
    if (allocs_left > 0) allocs_left--;
    return sj_realloc(old, count * elem);
}

#define RESIZE(obj, field, count)                                                                  \
    do {                                                                                           \
        void *q_ = resize((obj)->field, (size_t)(count), sizeof *(obj)->field);                    \
        if (!q_) return false;                                                                     \
        (obj)->field = q_;                                                                         \
    } while (0)

/* A capacity >= need (doubling from cap), or -1 when need is over the limit. */
static int32_t new_cap(int32_t cap, int64_t need) {
    if (need > MAX_COUNT) return -1;
    int64_t c = cap ? cap : 16;
    while (c < need)
        c *= 2;
    return (int32_t)min64(c, MAX_COUNT);
}

static bool reserve_nodes(sj_exprs *p, int64_t need) {
    if (need <= p->cap) return true;
    int32_t nc = new_cap(p->cap, need);
    if (nc < 0) return false;
    RESIZE(p, nodes, nc);
    RESIZE(p, hash, nc);
    RESIZE(p, mask, nc);
    RESIZE(p, hintv, nc);
    RESIZE(p, rg, nc);
    p->cap = nc;
    return true;
}

static bool reserve_terms(sj_exprs *p, int64_t nterms, int64_t nfacs) {
    int32_t ct = new_cap(p->capterms, nterms), cf = new_cap(p->capfacs, nfacs);
    if (ct < 0 || cf < 0) return false;
    if (nterms > p->capterms) {
        RESIZE(p, terms, ct);
        p->capterms = ct;
    }
    if (nfacs > p->capfacs) {
        RESIZE(p, facs, cf);
        p->capfacs = cf;
    }
    return true;
}

static uint64_t mix(uint64_t h, uint64_t v) {
    h ^= v + 0x9e3779b97f4a7c15u;
    h *= 0xff51afd7ed558ccdu;
    return h ^ (h >> 32);
}

static uint64_t pair(int32_t a, int32_t b) { return (uint64_t)(uint32_t)a << 32 | (uint32_t)b; }

/* Hash of a node's content; for POLY, t is the term array nd->a indexes and
 * f the factor array the terms index. */
static uint64_t hash_node(const node *nd, const term *t, const factor *f) {
    uint64_t h = mix(mix(0x243f6a8885a308d3u, (uint64_t)nd->op), (uint64_t)nd->c);
    h = mix(h, pair(nd->op == OP_POLY ? 0 : nd->a, nd->b));
    for (int32_t i = 0; nd->op == OP_POLY && i < nd->b; i++) {
        const term *ti = &t[nd->a + i];
        h = mix(mix(h, (uint64_t)ti->coef), (uint64_t)ti->nfac);
        for (int32_t j = 0; j < ti->nfac; j++)
            h = mix(h, pair(f[ti->fac + j].atom, f[ti->fac + j].exp));
    }
    return h;
}

static bool same_node(const node *x, const term *tx, const factor *fx, const node *y,
                      const term *ty, const factor *fy) {
    if (x->op != y->op || x->c != y->c || x->b != y->b) return false;
    if (x->op != OP_POLY) return x->a == y->a;
    for (int32_t i = 0; i < x->b; i++) {
        const term *a = &tx[x->a + i], *b = &ty[y->a + i];
        if (a->coef != b->coef || a->nfac != b->nfac) return false;
        for (int32_t j = 0; j < a->nfac; j++)
            if (fx[a->fac + j].atom != fy[b->fac + j].atom ||
                fx[a->fac + j].exp != fy[b->fac + j].exp)
                return false;
    }
    return true;
}

static size_t free_slot(const sj_exprs *p, uint64_t h) {
    size_t m = p->tcap - 1, i = (size_t)h & m;
    while (p->table[i] >= 0)
        i = (i + 1) & m;
    return i;
}

static bool table_grow(sj_exprs *p) {
    size_t nc = p->tcap * 2;
    int32_t *t = resize(NULL, nc, sizeof *t), *old = p->table;
    if (!t) return false;
    for (size_t i = 0; i < nc; i++)
        t[i] = -1;
    p->table = t, p->tcap = nc;
    for (int32_t id = 0; id < p->n; id++)
        t[free_slot(p, p->hash[id])] = id;
    free(old);
    return true;
}

/* Symbol mask, hint value and range of a node, from its operands'. */
static uint64_t node_mask(const sj_exprs *p, const node *nd) {
    uint64_t m = 0;
    if (nd->op == OP_SYM) return 1ull << (nd->a < 63 ? nd->a : 63);
    if (nd->op >= OP_FLOORDIV) return p->mask[nd->a] | p->mask[nd->b];
    for (int32_t i = 0; nd->op == OP_POLY && i < nd->b; i++) {
        const term *t = &p->terms[nd->a + i];
        for (int32_t j = 0; j < t->nfac; j++)
            m |= p->mask[p->facs[t->fac + j].atom];
    }
    return m;
}

/* The id of the node with this content, appended if new. For POLY, t and f
 * hold the terms (from nd->a) and their factors. */
static sj_expr intern(sj_exprs *p, const node *nd, const term *t, const factor *f) {
    uint64_t h = hash_node(nd, t, f);
    size_t m = p->tcap - 1;
    assert(nd->op < OP_FLOORDIV || (nd->a < nd->b ? nd->b : nd->a) < p->n);
    assert(nd->op != OP_POLY || nd->b > 0);
    for (size_t i = (size_t)h & m; p->table[i] >= 0; i = (i + 1) & m) {
        int32_t id = p->table[i];
        if (p->hash[id] == h && same_node(&p->nodes[id], p->terms, p->facs, nd, t, f)) return id;
    }
    /* New: reserve everything first so that a failure changes nothing. */
    int32_t nt = nd->op == OP_POLY ? nd->b : 0;
    int64_t nfac = 0;
    for (int32_t i = 0; i < nt; i++)
        nfac += t[nd->a + i].nfac;
    if (!reserve_nodes(p, (int64_t)p->n + 1) ||
        !reserve_terms(p, (int64_t)p->nterms + nt, (int64_t)p->nfacs + nfac))
        return SJ_EX_NONE;
    if ((size_t)(p->n + 1) * 2 > p->tcap && !table_grow(p)) return SJ_EX_NONE;
    int32_t id = p->n++;
    node *to = &p->nodes[id];
    *to = *nd;
    if (nd->op == OP_POLY) to->a = p->nterms;
    for (int32_t i = 0; i < nt; i++) {
        const term *ti = &t[nd->a + i];
        p->terms[p->nterms++] = (term){ti->coef, p->nfacs, ti->nfac};
        memcpy(&p->facs[p->nfacs], &f[ti->fac], (size_t)ti->nfac * sizeof *f);
        p->nfacs += ti->nfac;
    }
    p->hash[id] = h;
    p->table[free_slot(p, h)] = id;
    p->mask[id] = node_mask(p, to);
    p->hintv[id] = node_value(p, to, p->hintv, p->sym_hint);
    p->rg[id] = node_range(p, to);
    return id;
}

static sj_expr make_node(sj_exprs *p, int op, int32_t a, int32_t b, int64_t c) {
    node nd = {op, a, b, c};
    return intern(p, &nd, NULL, NULL);
}

sj_exprs *sj_exprs_create(void) {
    sj_exprs *p = resize(NULL, 1, sizeof *p);
    if (!p) return NULL;
    memset(p, 0, sizeof *p);
    p->tcap = 64;
    p->table = resize(NULL, p->tcap, sizeof *p->table);
    if (!p->table) {
        free(p);
        return NULL;
    }
    memset(p->table, 0xff, p->tcap * sizeof *p->table); /* all -1 */
    return p;
}

void sj_exprs_destroy(sj_exprs *p) {
    if (!p) return;
    free(p->sym_hint), free(p->sym_lo), free(p->sym_hi);
    free(p->nodes), free(p->hash), free(p->mask), free(p->hintv), free(p->rg);
    free(p->terms), free(p->facs), free(p->table);
    free(p);
}

/* -- Symbols ------------------------------------------------------------- */

static bool reserve_syms(sj_exprs *p, int64_t need) {
    if (need <= p->capsyms) return true;
    int32_t nc = new_cap(p->capsyms, need);
    if (nc < 0) return false;
    RESIZE(p, sym_hint, nc);
    RESIZE(p, sym_lo, nc);
    RESIZE(p, sym_hi, nc);
    p->capsyms = nc;
    return true;
}

/* An empty range is bad input: -1. */
int sj_sym_new(sj_exprs *p, int64_t hint, int64_t lo, int64_t hi) {
    if (!p || lo > hi || !reserve_syms(p, (int64_t)p->nsyms + 1)) return -1;
    int s = p->nsyms++;
    p->sym_hint[s] = hint, p->sym_lo[s] = lo, p->sym_hi[s] = hi;
    return s;
}

int sj_sym_count(const sj_exprs *p) { return p ? p->nsyms : 0; }

static bool ok_sym(const sj_exprs *p, int s) { return p && s >= 0 && s < p->nsyms; }

int64_t sj_sym_hint(const sj_exprs *p, int sym) { return ok_sym(p, sym) ? p->sym_hint[sym] : 0; }

void sj_sym_range(const sj_exprs *p, int sym, int64_t *lo, int64_t *hi) {
    bool ok = ok_sym(p, sym);
    if (lo) *lo = ok ? p->sym_lo[sym] : NEG_INF;
    if (hi) *hi = ok ? p->sym_hi[sym] : POS_INF;
}

/* An empty intersection (a contradiction) leaves the range unchanged. Nodes
 * built earlier keep their form (it stays valid on a narrower range); their
 * ranges are recomputed in one forward pass. */
void sj_sym_narrow(sj_exprs *p, int sym, int64_t lo, int64_t hi) {
    if (!ok_sym(p, sym)) return;
    lo = max64(lo, p->sym_lo[sym]), hi = min64(hi, p->sym_hi[sym]);
    if (lo > hi || (lo == p->sym_lo[sym] && hi == p->sym_hi[sym])) return;
    p->sym_lo[sym] = lo, p->sym_hi[sym] = hi;
    for (int32_t id = 0; id < p->n; id++)
        p->rg[id] = node_range(p, &p->nodes[id]);
}

/* -- Polynomial builder -------------------------------------------------- */

/* A polynomial under construction, in the stored layout (terms index f). */
typedef struct poly {
    int64_t c;
    term *t;
    factor *f;
    int32_t nt, capt, nf, capf;
    bool bad; /* allocation failure, or over a limit */
} poly;

static void poly_free(poly *x) {
    free(x->t), free(x->f);
    memset(x, 0, sizeof *x);
}

static bool poly_reserve(poly *x, int64_t nfac) {
    int32_t ct = new_cap(x->capt, x->nt + 1), cf = new_cap(x->capf, x->nf + nfac);
    if (x->nt >= MAX_POLY_TERMS || ct < 0 || cf < 0) return false;
    if (x->nt == x->capt) {
        RESIZE(x, t, ct);
        x->capt = ct;
    }
    if (x->nf + nfac > x->capf) {
        RESIZE(x, f, cf);
        x->capf = cf;
    }
    return true;
}

/* Append a term with room for nfac factors; returns them, NULL on failure. */
static factor *poly_term(poly *x, int64_t coef, int64_t nfac) {
    if (x->bad || !poly_reserve(x, nfac)) {
        x->bad = true;
        return NULL;
    }
    x->t[x->nt++] = (term){coef, x->nf, (int32_t)nfac};
    x->nf += (int32_t)nfac;
    return x->f + x->nf - nfac;
}

/* x += k * e */
static void poly_add_scaled(const sj_exprs *p, poly *x, sj_expr e, int64_t k) {
    assert(e >= 0 && e < p->n);
    const node *nd = &p->nodes[e];
    if (nd->op == OP_CONST || nd->op == OP_POLY) x->c = wadd(x->c, wmul(k, nd->c));
    for (int32_t i = 0; nd->op == OP_POLY && i < nd->b; i++) {
        const term *t = &p->terms[nd->a + i];
        factor *fs = poly_term(x, wmul(k, t->coef), t->nfac);
        if (fs) memcpy(fs, &p->facs[t->fac], (size_t)t->nfac * sizeof *fs);
    }
    if (is_atom_op(nd->op)) {
        factor *fs = poly_term(x, k, 1);
        if (fs) fs[0] = (factor){e, 1};
    }
}

/* z += coef * (monomial a) * (monomial b); both sorted by atom. */
static void push_product(poly *z, int64_t coef, const factor *fa, int32_t na, const factor *fb,
                         int32_t nb) {
    factor *out = coef ? poly_term(z, coef, (int64_t)na + nb) : NULL;
    int32_t i = 0, j = 0, k = 0;
    if (!out) return;
    while (i < na || j < nb) {
        if (j == nb || (i < na && fa[i].atom < fb[j].atom)) {
            out[k++] = fa[i++];
        } else if (i == na || fb[j].atom < fa[i].atom) {
            out[k++] = fb[j++];
        } else {
            int64_t e = (int64_t)fa[i].exp + fb[j].exp;
            if (e > INT32_MAX) z->bad = true;
            out[k++] = (factor){fa[i++].atom, (int32_t)e};
            j++;
        }
    }
    z->t[z->nt - 1].nfac = k;
    z->nf = z->t[z->nt - 1].fac + k;
}

/* z = x * y (z empty). */
static void poly_mul(poly *z, const poly *x, const poly *y) {
    z->bad = x->bad || y->bad || (int64_t)(x->nt + 1) * (y->nt + 1) > MAX_POLY_TERMS;
    if (z->bad) return;
    z->c = wmul(x->c, y->c);
    for (int32_t i = 0; i < x->nt; i++)
        push_product(z, wmul(x->t[i].coef, y->c), x->f + x->t[i].fac, x->t[i].nfac, NULL, 0);
    for (int32_t j = 0; j < y->nt; j++)
        push_product(z, wmul(y->t[j].coef, x->c), y->f + y->t[j].fac, y->t[j].nfac, NULL, 0);
    for (int32_t i = 0; i < x->nt; i++)
        for (int32_t j = 0; j < y->nt; j++)
            push_product(z, wmul(x->t[i].coef, y->t[j].coef), x->f + x->t[i].fac,
                         x->t[i].nfac, y->f + y->t[j].fac, y->t[j].nfac);
}

typedef struct skey {
    const factor *f;
    int64_t coef, deg;
    int32_t nf;
} skey;

/* Monomial order: degree descending, then factors (atom ascending, exponent
 * descending), shorter first. */
static int mono_cmp(const factor *fa, int32_t na, int64_t da, const factor *fb, int32_t nb,
                    int64_t db) {
    if (da != db) return da > db ? -1 : 1;
    for (int32_t i = 0; i < na && i < nb; i++) {
        if (fa[i].atom != fb[i].atom) return fa[i].atom < fb[i].atom ? -1 : 1;
        if (fa[i].exp != fb[i].exp) return fa[i].exp > fb[i].exp ? -1 : 1;
    }
    return (na > nb) - (na < nb);
}

static int skey_cmp(const void *a, const void *b) {
    const skey *x = a, *y = b;
    return mono_cmp(x->f, x->nf, x->deg, y->f, y->nf, y->deg);
}

static int64_t mono_deg(const factor *f, int32_t n) {
    int64_t d = 0;
    for (int32_t i = 0; i < n; i++)
        d += f[i].exp;
    return d;
}

/* Sort the terms, merge equal monomials, drop zero coefficients. */
static void poly_normalize(poly *x) {
    if (x->bad || x->nt == 0) return;
    skey *k = resize(NULL, (size_t)x->nt, sizeof *k);
    poly y = {.c = x->c, .bad = !k};
    for (int32_t i = 0; k && i < x->nt; i++) {
        const term *t = &x->t[i];
        k[i] = (skey){x->f + t->fac, t->coef, mono_deg(x->f + t->fac, t->nfac), t->nfac};
    }
    if (k) qsort(k, (size_t)x->nt, sizeof *k, skey_cmp);
    for (int32_t i = 0, j; k && i < x->nt; i = j) {
        int64_t coef = k[i].coef;
        for (j = i + 1; j < x->nt && skey_cmp(&k[i], &k[j]) == 0; j++)
            coef = wadd(coef, k[j].coef);
        factor *fs = coef ? poly_term(&y, coef, k[i].nf) : NULL;
        if (fs) memcpy(fs, k[i].f, (size_t)k[i].nf * sizeof *fs);
    }
    free(k);
    poly_free(x);
    *x = y;
}

/* The canonical id of x (normalized here). */
static sj_expr poly_intern(sj_exprs *p, poly *x) {
    poly_normalize(x);
    if (x->bad) return SJ_EX_NONE;
    if (x->nt == 0) return make_node(p, OP_CONST, 0, 0, x->c);
    if (x->nt == 1 && x->c == 0 && x->t[0].coef == 1 && x->t[0].nfac == 1 &&
        x->f[x->t[0].fac].exp == 1)
        return x->f[x->t[0].fac].atom;
    node nd = {OP_POLY, 0, x->nt, x->c};
    return intern(p, &nd, x->t, x->f);
}

/* ka * a + kb * b; b may be SJ_EX_NONE for "no second operand". */
static sj_expr lin(sj_exprs *p, sj_expr a, int64_t ka, sj_expr b, int64_t kb) {
    poly x = {0};
    if (a == SJ_EX_NONE) return SJ_EX_NONE;
    poly_add_scaled(p, &x, a, ka);
    if (b != SJ_EX_NONE) poly_add_scaled(p, &x, b, kb);
    sj_expr r = poly_intern(p, &x);
    poly_free(&x);
    return r;
}

/* -- Building ------------------------------------------------------------ */

static bool ok_id(const sj_exprs *p, sj_expr e) { return e >= 0 && e < p->n; }

static bool cval(const sj_exprs *p, sj_expr e, int64_t *v) {
    if (p->nodes[e].op != OP_CONST) return false;
    *v = p->nodes[e].c;
    return true;
}

sj_expr sj_ex_const(sj_exprs *p, int64_t c) {
    return p ? make_node(p, OP_CONST, 0, 0, c) : SJ_EX_NONE;
}

sj_expr sj_ex_sym(sj_exprs *p, int sym) {
    return ok_sym(p, sym) ? make_node(p, OP_SYM, sym, 0, 0) : SJ_EX_NONE;
}

#define CHECK_OPERANDS(p, a, b)                                                                    \
    do {                                                                                           \
        if (!(p) || !ok_id((p), (a)) || !ok_id((p), (b))) return SJ_EX_NONE;                      \
    } while (0)

sj_expr sj_ex_add(sj_exprs *p, sj_expr a, sj_expr b) {
    CHECK_OPERANDS(p, a, b);
    return lin(p, a, 1, b, 1);
}

sj_expr sj_ex_sub(sj_exprs *p, sj_expr a, sj_expr b) {
    CHECK_OPERANDS(p, a, b);
    return lin(p, a, 1, b, -1);
}

sj_expr sj_ex_mul(sj_exprs *p, sj_expr a, sj_expr b) {
    int64_t k;
    CHECK_OPERANDS(p, a, b);
    if (cval(p, a, &k)) return lin(p, b, k, SJ_EX_NONE, 0);
    if (cval(p, b, &k)) return lin(p, a, k, SJ_EX_NONE, 0);
    poly x = {0}, y = {0}, z = {0};
    poly_add_scaled(p, &x, a, 1);
    poly_add_scaled(p, &y, b, 1);
    poly_mul(&z, &x, &y);
    sj_expr r = poly_intern(p, &z);
    poly_free(&x), poly_free(&y), poly_free(&z);
    return r;
}

/* a as k*d + r: d takes a's terms whose coefficients are multiples of k
 * (divided by k) and c // k; r keeps the other terms and c % k. */
static void split(const sj_exprs *p, sj_expr a, int64_t k, poly *d, poly *r) {
    poly x = {0};
    poly_add_scaled(p, &x, a, 1);
    d->bad = r->bad = x.bad;
    d->c = pydiv(x.c, k), r->c = pymod(x.c, k);
    for (int32_t i = 0; i < x.nt; i++) {
        const term *t = &x.t[i];
        bool mult = t->coef % k == 0;
        factor *fs = poly_term(mult ? d : r, mult ? t->coef / k : t->coef, t->nfac);
        if (fs) memcpy(fs, x.f + t->fac, (size_t)t->nfac * sizeof *fs);
    }
    poly_free(&x);
}

/* a // k or a % k for a constant k >= 2, as a canonical polynomial:
 *   a = k*d + r  (split)          a // k = d + r // k,   a % k = r % k
 *   r within [q*k, q*k + k-1]     r // k = q,            r % k = r - q*k
 *   g = gcd(k, r's numbers) > 1   r // k = (r/g) // (k/g), r % k = g*((r/g) % (k/g))
 *   r == x // j                   r // k = x // (j*k)
 *   r == x % j, k divides j                              r % k = x % k    */
static sj_expr divmod_const(sj_exprs *p, int op, sj_expr a, int64_t k) {
    poly d = {0}, r = {0};
    sj_expr res = SJ_EX_NONE, ri, x;
    bool div = op == OP_FLOORDIV;
    int64_t g, j, q;
    const node *rn;
    ival rr;
    assert(k >= 2);
    if (a == SJ_EX_NONE) return SJ_EX_NONE;
    split(p, a, k, &d, &r);
    if (d.bad || r.bad) goto done;
    rr = poly_range(p, r.c, r.t, r.nt, r.f); /* r.nt == 0: r.c in [0, k-1], q = 0 */
    if (!is_inf(rr.lo) && !is_inf(rr.hi) && pydiv(rr.lo, k) == pydiv(rr.hi, k)) {
        q = pydiv(rr.lo, k);
        if (div)
            d.c = wadd(d.c, q);
        else
            r.c = wadd(r.c, wmul(-q, k));
        res = poly_intern(p, div ? &d : &r);
        goto done;
    }
    g = (int64_t)gcd_u64((uint64_t)k, mag(r.c));
    for (int32_t i = 0; i < r.nt && g > 1; i++)
        g = (int64_t)gcd_u64((uint64_t)g, mag(r.t[i].coef));
    if (g > 1) {
        r.c /= g;
        for (int32_t i = 0; i < r.nt; i++)
            r.t[i].coef /= g;
    }
    ri = poly_intern(p, &r);
    if (ri == SJ_EX_NONE) goto done;
    rn = &p->nodes[ri];
    if (g > 1)
        res = divmod_const(p, op, ri, k / g);
    else if (rn->op == op && cval(p, rn->b, &j) && j > 0 && (div ? j <= INT64_MAX / k : j % k == 0))
        res = divmod_const(p, op, rn->a, div ? j * k : k);
    else if ((x = sj_ex_const(p, k)) != SJ_EX_NONE)
        res = make_node(p, op, ri, x, 0);
    if (div && res != SJ_EX_NONE) {
        poly_add_scaled(p, &d, res, 1);
        res = poly_intern(p, &d);
    } else if (!div && g > 1) {
        res = lin(p, res, g, SJ_EX_NONE, 0);
    }
done:
    poly_free(&d), poly_free(&r);
    return res;
}

static sj_expr divmod(sj_exprs *p, int op, sj_expr a, sj_expr b) {
    int64_t ca, cb;
    bool div = op == OP_FLOORDIV;
    CHECK_OPERANDS(p, a, b);
    bool ac = cval(p, a, &ca), bc = cval(p, b, &cb);
    if (bc && cb == 0) return SJ_EX_NONE;
    if (ac && bc) return sj_ex_const(p, div ? pydiv(ca, cb) : pymod(ca, cb));
    if (bc && (cb == 1 || cb == -1)) return div ? lin(p, a, cb, SJ_EX_NONE, 0) : sj_ex_const(p, 0);
    if (bc && cb > 1) return divmod_const(p, op, a, cb);
    if (bc && cb != INT64_MIN) { /* a // -k == (-a) // k, a % -k == -((-a) % k) */
        sj_expr r = divmod_const(p, op, lin(p, a, -1, SJ_EX_NONE, 0), -cb);
        return div ? r : lin(p, r, -1, SJ_EX_NONE, 0);
    }
    if (ac && ca == 0) return a; /* 0 // b and 0 % b are 0, also for b == 0 */
    if (!div && a == b) return sj_ex_const(p, 0);
    if (div && a == b && (p->rg[b].lo > 0 || p->rg[b].hi < 0)) return sj_ex_const(p, 1);
    if (p->rg[b].lo >= 1 && p->rg[a].lo >= 0 && p->rg[a].hi < p->rg[b].lo)
        return div ? sj_ex_const(p, 0) : a;
    return make_node(p, op, a, b, 0);
}

sj_expr sj_ex_floordiv(sj_exprs *p, sj_expr a, sj_expr b) { return divmod(p, OP_FLOORDIV, a, b); }
sj_expr sj_ex_mod(sj_exprs *p, sj_expr a, sj_expr b) { return divmod(p, OP_MOD, a, b); }

static sj_expr minmax(sj_exprs *p, int op, sj_expr a, sj_expr b) {
    int64_t ca, cb;
    CHECK_OPERANDS(p, a, b);
    if (a == b) return a;
    bool ac = cval(p, a, &ca), bc = cval(p, b, &cb);
    if (ac && bc) return (op == OP_MIN) == (ca < cb) ? a : b;
    if (ac || (!bc && a > b)) { /* canonical order: by id, constants last */
        sj_expr t = a;
        a = b, b = t;
    }
    const node *na = &p->nodes[a], *nb = &p->nodes[b];
    int dual = op == OP_MIN ? OP_MAX : OP_MIN;
    if (nb->op == op && (nb->a == a || nb->b == a)) return b; /* min(x, min(x, y)) */
    if (na->op == op && (na->a == b || na->b == b)) return a;
    if (nb->op == dual && (nb->a == a || nb->b == a)) return a; /* min(x, max(x, y)) */
    if (na->op == dual && (na->a == b || na->b == b)) return b;
    /* Decide by the range of a - b. */
    poly x = {0};
    poly_add_scaled(p, &x, a, 1);
    poly_add_scaled(p, &x, b, -1);
    poly_normalize(&x);
    ival d = x.bad ? FULL : poly_range(p, x.c, x.t, x.nt, x.f);
    poly_free(&x);
    if (d.hi <= 0) return op == OP_MIN ? a : b; /* a <= b */
    if (d.lo >= 0) return op == OP_MIN ? b : a; /* a >= b */
    return make_node(p, op, a, b, 0);
}

sj_expr sj_ex_min(sj_exprs *p, sj_expr a, sj_expr b) { return minmax(p, OP_MIN, a, b); }
sj_expr sj_ex_max(sj_exprs *p, sj_expr a, sj_expr b) { return minmax(p, OP_MAX, a, b); }

/* -- Inspecting ---------------------------------------------------------- */

sj_expr sj_ex_primitive(sj_exprs *p, sj_expr e) {
    if (!p || !ok_id(p, e) || p->nodes[e].op != OP_POLY) return e;
    const node *nd = &p->nodes[e];
    uint64_t g = mag(nd->c);
    for (int32_t i = 0; i < nd->b; i++) g = gcd_u64(g, mag(p->terms[nd->a + i].coef));
    if (g <= 1 || g > (uint64_t)INT64_MAX) return e;
    return sj_ex_floordiv(p, e, sj_ex_const(p, (int64_t)g));
}

bool sj_ex_is_mod_const(const sj_exprs *p, sj_expr e, sj_expr *a, int64_t *k) {
    if (!p || !ok_id(p, e)) return false;
    const node *nd = &p->nodes[e];
    uint64_t c = 1;
    if (nd->op == OP_POLY) { /* c * (x % k): one term, one factor, no constant */
        if (nd->c != 0 || nd->b != 1) return false;
        const term *t = &p->terms[nd->a];
        if (t->nfac != 1 || p->facs[t->fac].exp != 1) return false;
        c = mag(t->coef);
        nd = &p->nodes[p->facs[t->fac].atom];
    }
    int64_t kv;
    if (nd->op != OP_MOD || !cval(p, nd->b, &kv) || kv < 2) return false;
    if (c == 0 || c > (uint64_t)INT64_MAX / (uint64_t)(kv - 1)) return false; /* c*(x%k) must not wrap */
    *a = nd->a;
    *k = kv;
    return true;
}

int sj_ex_count(const sj_exprs *p) { return p ? p->n : 0; }

bool sj_ex_is_const(const sj_exprs *p, sj_expr e, int64_t *value) {
    int64_t v;
    if (!p || !ok_id(p, e) || !cval(p, e, &v)) return false;
    if (value) *value = v;
    return true;
}

bool sj_ex_is_sym(const sj_exprs *p, sj_expr e, int *sym) {
    if (!p || !ok_id(p, e) || p->nodes[e].op != OP_SYM) return false;
    if (sym) *sym = p->nodes[e].a;
    return true;
}

uint64_t sj_ex_syms(const sj_exprs *p, sj_expr e) { return p && ok_id(p, e) ? p->mask[e] : 0; }

void sj_ex_range(const sj_exprs *p, sj_expr e, int64_t *lo, int64_t *hi) {
    ival r = p && ok_id(p, e) ? p->rg[e] : FULL;
    if (lo) *lo = r.lo;
    if (hi) *hi = r.hi;
}

/* -- Evaluating ---------------------------------------------------------- */

/* Recent results of non-polynomial atoms: keeps shared subexpressions (a DAG)
 * from being evaluated an exponential number of times. */
typedef struct memo {
    int32_t id[MEMO_SIZE];
    int64_t val[MEMO_SIZE];
} memo;

static int64_t eval_rec(const sj_exprs *p, sj_expr e, const int64_t *sv, memo *m) {
    const node *nd = &p->nodes[e];
    unsigned slot = (unsigned)e % MEMO_SIZE;
    if (nd->op == OP_CONST || nd->op == OP_SYM) return node_value(p, nd, NULL, sv);
    if (nd->op == OP_POLY) {
        uint64_t acc = (uint64_t)nd->c;
        const term *t = p->terms + nd->a, *te = t + nd->b;
        for (; t < te; t++) {
            uint64_t v = (uint64_t)t->coef;
            const factor *f = p->facs + t->fac, *fe = f + t->nfac;
            for (; f < fe; f++)
                v *= upow((uint64_t)eval_rec(p, f->atom, sv, m), f->exp);
            acc += v;
        }
        return (int64_t)acc;
    }
    if (m->id[slot] == e) return m->val[slot];
    int64_t v[2] = {eval_rec(p, nd->a, sv, m), eval_rec(p, nd->b, sv, m)};
    node tmp = {nd->op, 0, 1, 0}; /* the operands renumbered into v[] */
    m->id[slot] = e;
    return m->val[slot] = node_value(p, &tmp, v, sv);
}

int64_t sj_ex_eval(const sj_exprs *p, sj_expr e, const int64_t *sym_vals) {
    if (!p || !ok_id(p, e) || (!sym_vals && p->mask[e])) return 0;
    memo m;
    memset(m.id, 0xff, sizeof m.id); /* all -1 */
    return eval_rec(p, e, sym_vals, &m);
}

int64_t sj_ex_hint(const sj_exprs *p, sj_expr e) { return p && ok_id(p, e) ? p->hintv[e] : 0; }

void sj_ex_eval_all(const sj_exprs *p, const int64_t *sym_vals, int64_t *out) {
    if (!p || !out) return;
    if (!sym_vals && p->nsyms > 0) {
        memset(out, 0, (size_t)p->n * sizeof *out);
        return;
    }
    const node *nd = p->nodes;
    for (int32_t i = 0, n = p->n; i < n; i++)
        out[i] = node_value(p, &nd[i], out, sym_vals);
}

/* -- Printing ------------------------------------------------------------
 * One printer for both forms. Human: "2*s0 + 1", "s0//4", "(s0 + 1) % 4",
 * "s0**2". C (prefix set): polynomials always in parentheses, atoms as macro
 * calls, constants as INT64_C(m), -INT64_C(m) or INT64_MIN (INT64_C takes an
 * unsuffixed constant only), powers as repeated products. */

typedef struct out {
    char *buf;
    size_t n, len;      /* capacity; length of the full text */
    const char *prefix; /* C variables; NULL for the human form */
} out;

static void put_mem(out *o, const char *s, size_t k) {
    if (o->n > 0 && o->len < o->n - 1) {
        size_t room = o->n - 1 - o->len, c = k < room ? k : room;
        memcpy(o->buf + o->len, s, c);
        o->buf[o->len + c] = '\0';
    }
    o->len += k;
}

static void put(out *o, const char *s) { put_mem(o, s, strlen(s)); }

static void put_u64(out *o, uint64_t v) {
    char tmp[24];
    put_mem(o, tmp, (size_t)snprintf(tmp, sizeof tmp, "%" PRIu64, v));
}

/* |c|, its sign already written (INT64_MIN keeps its own in C). */
static void put_mag(out *o, int64_t c) {
    bool min = o->prefix && c == INT64_MIN;
    put(o, min ? "INT64_MIN" : o->prefix ? "INT64_C(" : "");
    if (!min) put_u64(o, mag(c));
    put(o, o->prefix && !min ? ")" : "");
}

static void print_node(const sj_exprs *p, sj_expr e, out *o, bool paren);

/* The print order of atoms and terms: by structure, never by id. Ids follow
 * the order expressions were made in, and a trace makes derived atoms
 * (floordiv, mod, min, max) in the order its model function made its ops,
 * which C leaves unspecified for nested calls; generated kernels print
 * sizes, so their source (and cache key) must not depend on it. Symbols
 * (made in input order, before a model runs) come first, by number; other
 * atoms by kind, then by a hash of their structure (operands of min and
 * max as an unordered pair); equal hashes of different atoms, never seen,
 * fall back to ids. Within that, terms print as the pool sorts them:
 * degree descending, then factors, shorter first. */
static uint64_t shash(const sj_exprs *p, sj_expr e, int depth) {
    const node *nd = &p->nodes[e];
    if (depth > 24) return mix(0x5eedu, (uint64_t)e); /* bounded work on deep sharing */
    uint64_t h = mix(0x13198a2e03707344u, (uint64_t)nd->op);
    switch (nd->op) {
    case OP_CONST:
        return mix(h, (uint64_t)nd->c);
    case OP_SYM:
        return mix(h, (uint64_t)nd->a);
    case OP_POLY: { /* the sum of the terms' hashes: their order does not count */
        uint64_t sum = mix(h, (uint64_t)nd->c);
        for (int32_t i = 0; i < nd->b; i++) {
            const term *t = &p->terms[nd->a + i];
            uint64_t th = 0;
            for (int32_t j = 0; j < t->nfac; j++) {
                const factor *f = &p->facs[t->fac + j];
                th += mix(shash(p, f->atom, depth + 1), (uint64_t)f->exp);
            }
            sum += mix(th, (uint64_t)t->coef);
        }
        return sum;
    }
    case OP_MIN:
    case OP_MAX:
        return mix(h, shash(p, nd->a, depth + 1) + shash(p, nd->b, depth + 1));
    default:
        return mix(mix(h, shash(p, nd->a, depth + 1)), shash(p, nd->b, depth + 1));
    }
}

static int atom_cmp(const sj_exprs *p, int32_t a, int32_t b) {
    if (a == b) return 0;
    const node *x = &p->nodes[a], *y = &p->nodes[b];
    if (x->op != y->op) return x->op < y->op ? -1 : 1; /* OP_SYM first */
    if (x->op == OP_SYM) return x->a < y->a ? -1 : 1;
    uint64_t hx = shash(p, a, 0), hy = shash(p, b, 0);
    if (hx != hy) return hx < hy ? -1 : 1;
    return a < b ? -1 : 1;
}

#define PRINT_TERMS 64 /* larger sums print in the pool's order */
#define PRINT_FACS 8

typedef struct pterm {
    int64_t coef, deg;
    int32_t nfac;
    factor f[PRINT_FACS];
} pterm;

static int pterm_cmp(const sj_exprs *p, const pterm *x, const pterm *y) {
    if (x->deg != y->deg) return x->deg > y->deg ? -1 : 1;
    for (int32_t i = 0; i < x->nfac && i < y->nfac; i++) {
        int c = atom_cmp(p, x->f[i].atom, y->f[i].atom);
        if (c) return c;
        if (x->f[i].exp != y->f[i].exp) return x->f[i].exp > y->f[i].exp ? -1 : 1;
    }
    return (x->nfac > y->nfac) - (x->nfac < y->nfac);
}

/* nd's terms in print order into t (false: too many to sort here). */
static bool print_order(const sj_exprs *p, const node *nd, pterm *t) {
    if (nd->b > PRINT_TERMS) return false;
    for (int32_t i = 0; i < nd->b; i++) {
        const term *src = &p->terms[nd->a + i];
        if (src->nfac > PRINT_FACS) return false;
        t[i].coef = src->coef;
        t[i].nfac = src->nfac;
        t[i].deg = 0;
        for (int32_t j = 0; j < src->nfac; j++) { /* insertion sort: a handful of factors */
            factor f = p->facs[src->fac + j];
            int32_t k = j;
            for (; k > 0 && atom_cmp(p, t[i].f[k - 1].atom, f.atom) > 0; k--) t[i].f[k] = t[i].f[k - 1];
            t[i].f[k] = f;
            t[i].deg += f.exp;
        }
    }
    for (int32_t i = 1; i < nd->b; i++) { /* insertion sort: at most PRINT_TERMS */
        pterm x = t[i];
        int32_t k = i;
        for (; k > 0 && pterm_cmp(p, &t[k - 1], &x) > 0; k--) t[k] = t[k - 1];
        t[k] = x;
    }
    return true;
}

static void print_poly(const sj_exprs *p, const node *nd, out *o) {
    bool c = o->prefix != NULL;
    pterm sorted[PRINT_TERMS];
    bool ord = print_order(p, nd, sorted);
    for (int32_t i = 0; i < nd->b; i++) {
        const term *t = &p->terms[nd->a + i];
        int64_t coef = ord ? sorted[i].coef : t->coef;
        int32_t nfac = ord ? sorted[i].nfac : t->nfac;
        const factor *f = ord ? sorted[i].f : &p->facs[t->fac];
        bool neg = coef < 0 && !(c && coef == INT64_MIN), first = true;
        put(o, i == 0 ? (neg ? "-" : "") : (neg ? " - " : " + "));
        if (mag(coef) != 1) put_mag(o, coef), first = false;
        /* a lone "x//k" or "x % k" needs no parentheses in a sum */
        bool lone = mag(coef) == 1 && nfac == 1 && f[0].exp == 1 && !(i == 0 && neg);
        for (int32_t j = 0; j < nfac; j++) {
            for (int32_t k = 0; k < (c ? f[j].exp : 1); k++, first = false) {
                put(o, first ? "" : "*");
                print_node(p, f[j].atom, o, !lone);
            }
            if (!c && f[j].exp > 1) put(o, "**"), put_u64(o, (uint64_t)f[j].exp);
        }
    }
    if (nd->c != 0) {
        put(o, nd->c < 0 && !(c && nd->c == INT64_MIN) ? " - " : " + ");
        put_mag(o, nd->c);
    }
}

/* paren (human form): parenthesize sums, floordiv, mod, negative constants. */
static void print_node(const sj_exprs *p, sj_expr e, out *o, bool paren) {
    static const char *const fn[2][OP_COUNT] = {
        {[OP_MIN] = "min(", [OP_MAX] = "max("},
        {[OP_FLOORDIV] = "SJ_FLOORDIV(", [OP_MOD] = "SJ_MOD(", [OP_MIN] = "SJ_MIN(",
         [OP_MAX] = "SJ_MAX("},
    };
    const node *nd = &p->nodes[e];
    bool c = o->prefix != NULL, neg = nd->op == OP_CONST && nd->c < 0;
    bool par = c ? nd->op == OP_POLY || (neg && nd->c != INT64_MIN)
                 : paren && (nd->op == OP_POLY || nd->op == OP_FLOORDIV || nd->op == OP_MOD || neg);
    put(o, par ? "(" : "");
    if (nd->op == OP_CONST) {
        put(o, neg && !(c && nd->c == INT64_MIN) ? "-" : "");
        put_mag(o, nd->c);
    } else if (nd->op == OP_SYM) {
        put(o, c ? o->prefix : "s");
        put_u64(o, (uint64_t)nd->a);
    } else if (nd->op == OP_POLY) {
        print_poly(p, nd, o);
    } else if (fn[c][nd->op]) { /* a call */
        /* min and max: operands in print order, a constant last as stored */
        bool swap = (nd->op == OP_MIN || nd->op == OP_MAX) && p->nodes[nd->a].op != OP_CONST &&
                    p->nodes[nd->b].op != OP_CONST && atom_cmp(p, nd->a, nd->b) > 0;
        put(o, fn[c][nd->op]);
        print_node(p, swap ? nd->b : nd->a, o, false);
        put(o, ", ");
        print_node(p, swap ? nd->a : nd->b, o, false);
        put(o, ")");
    } else { /* human floordiv and mod */
        print_node(p, nd->a, o, true);
        put(o, nd->op == OP_MOD ? " % " : "//");
        print_node(p, nd->b, o, true);
    }
    put(o, par ? ")" : "");
}

int sj_ex_print(const sj_exprs *p, sj_expr e, char *buf, size_t n) {
    out o = {buf, buf ? n : 0, 0, NULL};
    if (o.n > 0) buf[0] = '\0';
    if (!p || !ok_id(p, e))
        put(&o, "<none>");
    else
        print_node(p, e, &o, false);
    return o.len > INT_MAX ? -1 : (int)o.len;
}

int sj_ex_print_c(const sj_exprs *p, sj_expr e, const char *prefix, char *buf, size_t n) {
    out o = {buf, buf ? n : 0, 0, prefix};
    if (o.n > 0) buf[0] = '\0';
    if (!p || !ok_id(p, e) || !prefix) return -1;
    print_node(p, e, &o, false);
    return o.len > INT_MAX ? -1 : (int)o.len;
}

/* -- Checking ------------------------------------------------------------ */

static bool check_poly(const sj_exprs *p, int32_t id, const node *nd, int64_t *nterms,
                       int64_t *nfacs) {
    const term *t = &p->terms[nd->a];
    if (nd->a != *nterms || nd->b < 1) return false;
    if (nd->b == 1 && nd->c == 0 && t[0].coef == 1 && t[0].nfac == 1 && p->facs[t[0].fac].exp == 1)
        return false; /* 1*atom is the atom */
    for (int32_t i = 0; i < nd->b; i++) {
        const factor *f = &p->facs[t[i].fac];
        if (t[i].coef == 0 || t[i].nfac < 1 || t[i].fac != *nfacs) return false;
        for (int32_t j = 0; j < t[i].nfac; j++)
            if (f[j].exp < 1 || f[j].atom < 0 || f[j].atom >= id ||
                !is_atom_op(p->nodes[f[j].atom].op) || (j > 0 && f[j - 1].atom >= f[j].atom))
                return false;
        const factor *pf = &p->facs[t[max64(i - 1, 0)].fac];
        int32_t pn = t[max64(i - 1, 0)].nfac;
        if (i > 0 && mono_cmp(pf, pn, mono_deg(pf, pn), f, t[i].nfac, mono_deg(f, t[i].nfac)) >= 0)
            return false; /* sorted, no duplicates */
        *nfacs += t[i].nfac;
    }
    *nterms += nd->b;
    return true;
}

bool sj_ex_check(const sj_exprs *p) {
    if (!p) return false;
    int64_t nterms = 0, nfacs = 0, k;
    for (int32_t id = 0; id < p->n; id++) {
        const node *nd = &p->nodes[id];
        bool binary = nd->op >= OP_FLOORDIV && nd->op < OP_COUNT;
        if (nd->op < 0 || nd->op >= OP_COUNT) return false;
        if (nd->op == OP_CONST && (nd->a || nd->b)) return false;
        if (nd->op == OP_SYM && (nd->a < 0 || nd->a >= p->nsyms || nd->b || nd->c)) return false;
        if (nd->op == OP_POLY && !check_poly(p, id, nd, &nterms, &nfacs)) return false;
        if (binary && (nd->a < 0 || nd->a >= id || nd->b < 0 || nd->b >= id || nd->c))
            return false;
        if (binary && nd->op <= OP_MOD && cval(p, nd->b, &k) && k == 0) return false;
        if (binary && nd->op >= OP_MIN && /* ordered by id, constants last */
            (cval(p, nd->a, &k) || (p->nodes[nd->b].op != OP_CONST && nd->a >= nd->b)))
            return false;
        /* side data, and the table finds the node again */
        ival r = node_range(p, nd);
        if (r.lo != p->rg[id].lo || r.hi != p->rg[id].hi || node_mask(p, nd) != p->mask[id] ||
            node_value(p, nd, p->hintv, p->sym_hint) != p->hintv[id])
            return false;
        uint64_t h = hash_node(nd, p->terms, p->facs);
        size_t m = p->tcap - 1, i = (size_t)h & m;
        if (h != p->hash[id]) return false;
        while (p->table[i] >= 0 && p->table[i] != id)
            i = (i + 1) & m;
        if (p->table[i] != id) return false;
    }
    return nterms == p->nterms && nfacs == p->nfacs && (size_t)p->n * 2 <= p->tcap;
}
