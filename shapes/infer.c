/* Per-op shape inference over symbolic sizes (see infer.h). */
#include "base/alloc.h"
#include "shapes/infer.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* -- Facts and decisions -------------------------------------------------- */

void sj_infer_init(sj_infer *c, sj_exprs *ex) {
    memset(c, 0, sizeof *c);
    c->ex = ex;
}

void sj_infer_free(sj_infer *c) {
    free(c->facts);
    c->facts = NULL;
    c->n_facts = c->cap_facts = 0;
}

static void add_fact(sj_infer *c, sj_expr lhs, sj_rel rel, sj_expr rhs) {
    int64_t k;
    if ((rel == SJ_REL_EQ || rel == SJ_REL_NE) && sj_ex_is_const(c->ex, rhs, &k) && k == 0) {
        /* 4*(s0 % 2) == 0 is s0 % 2 == 0: keeps divisibility facts recognisable */
        sj_expr p = sj_ex_primitive(c->ex, lhs);
        if (p != SJ_EX_NONE) lhs = p;
    }
    for (int i = 0; i < c->n_facts; i++) {
        const sj_fact *f = &c->facts[i];
        if (f->lhs == lhs && f->rhs == rhs && f->rel == rel) return;
    }
    if (c->n_facts == c->cap_facts) {
        int cap = c->cap_facts ? 2 * c->cap_facts : 8;
        sj_fact *nf = sj_realloc(c->facts, (size_t)cap * sizeof *nf);
        if (!nf) return; /* a lost fact only costs a guard: callers re-check on ENOMEM paths */
        c->facts = nf;
        c->cap_facts = cap;
    }
    sj_fact *f = &c->facts[c->n_facts++];
    f->lhs = lhs;
    f->rhs = rhs;
    f->rel = rel;
    snprintf(f->why, sizeof f->why, "%s", c->why ? c->why : "");
}

static sj_status fail(sj_infer *c, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->msg, sizeof c->msg, fmt, ap);
    va_end(ap);
    return SJ_ESHAPE;
}

/* The sign of a - b when the ranges settle it: -1, 0, 1; 2 when unknown. */
static int known_cmp(sj_infer *c, sj_expr a, sj_expr b) {
    if (a == b) return 0;
    sj_expr d = sj_ex_sub(c->ex, a, b);
    int64_t lo, hi, k;
    if (d == SJ_EX_NONE) return 2;
    if (sj_ex_is_const(c->ex, d, &k)) return k < 0 ? -1 : k > 0;
    sj_ex_range(c->ex, d, &lo, &hi);
    if (lo > 0) return 1;
    if (hi < 0) return -1;
    if (lo == 0 && hi == 0) return 0;
    return 2;
}

bool sj_infer_eq(sj_infer *c, sj_expr a, sj_expr b) {
    int k = known_cmp(c, a, b);
    if (k != 2) return k == 0;
    bool eq = sj_ex_hint(c->ex, a) == sj_ex_hint(c->ex, b);
    add_fact(c, a, eq ? SJ_REL_EQ : SJ_REL_NE, b);
    return eq;
}

bool sj_infer_lt(sj_infer *c, sj_expr a, sj_expr b) {
    int k = known_cmp(c, a, b);
    if (k != 2) return k < 0;
    bool lt = sj_ex_hint(c->ex, a) < sj_ex_hint(c->ex, b);
    add_fact(c, a, lt ? SJ_REL_LT : SJ_REL_GE, b);
    return lt;
}

bool sj_infer_is_one(sj_infer *c, sj_expr a) { return sj_infer_eq(c, a, sj_ex_const(c->ex, 1)); }

int sj_axis_norm(int axis, int rank) {
    if (axis < -rank || axis >= rank) return -1;
    return axis < 0 ? axis + rank : axis;
}

/* -- Printing ------------------------------------------------------------- */

char *sj_shape_str(const sj_exprs *ex, const sj_shape *s, char *buf, size_t n) {
    size_t used = 0;
    if (n == 0) return buf;
    buf[0] = '\0';
    used += (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < s->rank && used < n; i++) {
        if (i) used += (size_t)snprintf(buf + used, n - used, ", ");
        if (used < n) used += (size_t)sj_ex_print(ex, s->d[i], buf + used, n - used);
    }
    if (used < n) snprintf(buf + used, n - used, "]");
    return buf;
}

/* A size in an error message: its value in the call being traced. */
static const char *dstr(sj_infer *c, sj_expr e, char *buf, size_t n) {
    snprintf(buf, n, "%lld", (long long)sj_ex_hint(c->ex, e));
    return buf;
}

/* -- Per-op inference ------------------------------------------------------ */

sj_expr sj_shape_numel(sj_exprs *ex, const sj_shape *s) {
    sj_expr n = sj_ex_const(ex, 1);
    for (int i = 0; i < s->rank; i++) n = sj_ex_mul(ex, n, s->d[i]);
    return n;
}

sj_status sj_infer_broadcast(sj_infer *c, const sj_shape *const *in, int n, sj_shape *out) {
    int rank = 0;
    for (int i = 0; i < n; i++)
        if (in[i]->rank > rank) rank = in[i]->rank;
    out->rank = rank;
    for (int ax = 0; ax < rank; ax++) {
        sj_expr d = SJ_EX_NONE; /* the non-1 size seen so far */
        sj_expr one = sj_ex_const(c->ex, 1);
        for (int i = 0; i < n; i++) {
            int k = ax - (rank - in[i]->rank);
            if (k < 0) continue;
            sj_expr e = in[i]->d[k];
            if (sj_infer_is_one(c, e)) continue;
            if (d == SJ_EX_NONE) {
                d = e;
            } else if (!sj_infer_eq(c, d, e)) {
                char b1[64], b2[64];
                return fail(c, "cannot broadcast at axis %d: %s vs %s", ax, dstr(c, d, b1, sizeof b1),
                            dstr(c, e, b2, sizeof b2));
            }
        }
        out->d[ax] = d == SJ_EX_NONE ? one : d;
    }
    return SJ_OK;
}

sj_status sj_infer_reduce(sj_infer *c, const sj_shape *in, int axis, int keepdim, sj_shape *out) {
    int r = 0;
    for (int i = 0; i < in->rank; i++) {
        if (i == axis) {
            if (keepdim) out->d[r++] = sj_ex_const(c->ex, 1);
        } else {
            out->d[r++] = in->d[i];
        }
    }
    out->rank = r;
    return SJ_OK;
}

sj_status sj_infer_matmul(sj_infer *c, const sj_shape *a, const sj_shape *b, sj_shape *out) {
    char b1[64], b2[64];
    if (a->rank < 2 || b->rank < 2) return fail(c, "both operands need rank >= 2");
    sj_expr ka = a->d[a->rank - 1], kb = b->d[b->rank - 2];
    if (!sj_infer_eq(c, ka, kb))
        return fail(c, "inner sizes differ: %s vs %s", dstr(c, ka, b1, sizeof b1),
                    dstr(c, kb, b2, sizeof b2));
    sj_shape ba = {a->rank - 2, {0}}, bb = {b->rank - 2, {0}}, bo;
    memcpy(ba.d, a->d, sizeof(sj_expr) * (size_t)ba.rank);
    memcpy(bb.d, b->d, sizeof(sj_expr) * (size_t)bb.rank);
    const sj_shape *pair[2] = {&ba, &bb};
    sj_status st = sj_infer_broadcast(c, pair, 2, &bo);
    if (st) return st;
    *out = bo;
    out->d[out->rank++] = a->d[a->rank - 2];
    out->d[out->rank++] = b->d[b->rank - 1];
    return SJ_OK;
}

sj_status sj_infer_reshape(sj_infer *c, const sj_shape *in, int rank, const sj_expr *dims,
                           sj_shape *out) {
    int infer_at = -1;
    sj_expr known = sj_ex_const(c->ex, 1);
    char b1[64], b2[64];
    if (rank < 0 || rank > SJ_MAX_RANK) return fail(c, "rank %d out of range [0, %d]", rank, SJ_MAX_RANK);
    for (int i = 0; i < rank; i++) {
        if (dims[i] == SJ_EX_NONE) {
            if (infer_at >= 0) return fail(c, "more than one inferred size (axes %d and %d)", infer_at, i);
            infer_at = i;
            continue;
        }
        int64_t lo, hi;
        sj_ex_range(c->ex, dims[i], &lo, &hi);
        if (hi < 0 || sj_ex_hint(c->ex, dims[i]) < 0)
            return fail(c, "size %s at axis %d is negative", dstr(c, dims[i], b1, sizeof b1), i);
        known = sj_ex_mul(c->ex, known, dims[i]);
    }
    sj_expr total = sj_shape_numel(c->ex, in);
    out->rank = rank;
    memcpy(out->d, dims, sizeof(sj_expr) * (size_t)rank);
    if (infer_at >= 0) {
        if (sj_infer_eq(c, known, sj_ex_const(c->ex, 0)))
            return fail(c, "cannot infer a size when the other sizes multiply to 0");
        sj_expr rem = sj_ex_mod(c->ex, total, known);
        if (!sj_infer_eq(c, rem, sj_ex_const(c->ex, 0)))
            return fail(c, "%s elements do not divide into sizes multiplying to %s",
                        dstr(c, total, b1, sizeof b1), dstr(c, known, b2, sizeof b2));
        out->d[infer_at] = sj_ex_floordiv(c->ex, total, known);
    } else if (!sj_infer_eq(c, known, total)) {
        return fail(c, "%s elements cannot be viewed as %s elements", dstr(c, total, b1, sizeof b1),
                    dstr(c, known, b2, sizeof b2));
    }
    for (int i = 0; i < rank; i++)
        if (out->d[i] == SJ_EX_NONE) return SJ_ENOMEM;
    return SJ_OK;
}

sj_status sj_infer_permute(sj_infer *c, const sj_shape *in, const int *perm, sj_shape *out) {
    unsigned seen = 0;
    for (int i = 0; i < in->rank; i++) {
        int p = perm[i];
        if (p < 0 || p >= in->rank) return fail(c, "perm[%d] = %d is not an axis of a rank-%d value", i, p, in->rank);
        if (seen & (1u << p)) return fail(c, "perm repeats axis %d", p);
        seen |= 1u << p;
        out->d[i] = in->d[p];
    }
    out->rank = in->rank;
    return SJ_OK;
}

/* Python's clamping of a slice bound against a size. */
static sj_expr clamp_bound(sj_exprs *ex, int64_t v, sj_expr size) {
    if (v >= 0) return sj_ex_min(ex, sj_ex_const(ex, v), size);
    return sj_ex_max(ex, sj_ex_add(ex, size, sj_ex_const(ex, v)), sj_ex_const(ex, 0));
}

sj_status sj_infer_slice(sj_infer *c, const sj_shape *in, int axis, int64_t start, int64_t end,
                         int64_t step, sj_shape *out, sj_expr *start_out) {
    if (step < 1) return fail(c, "step %lld must be >= 1", (long long)step);
    sj_exprs *ex = c->ex;
    sj_expr size = in->d[axis];
    sj_expr s = clamp_bound(ex, start, size);
    sj_expr e = clamp_bound(ex, end, size);
    /* len = max(0, ceil((e - s) / step)) */
    sj_expr len = sj_ex_floordiv(ex, sj_ex_add(ex, sj_ex_sub(ex, e, s), sj_ex_const(ex, step - 1)),
                                 sj_ex_const(ex, step));
    len = sj_ex_max(ex, len, sj_ex_const(ex, 0));
    if (len == SJ_EX_NONE || s == SJ_EX_NONE) return SJ_ENOMEM;
    *out = *in;
    out->d[axis] = len;
    *start_out = s;
    return SJ_OK;
}

sj_status sj_infer_slice_dim(sj_infer *c, const sj_shape *in, int axis, sj_expr start, sj_expr end,
                             sj_shape *out, sj_expr *start_out) {
    sj_exprs *ex = c->ex;
    sj_expr size = in->d[axis];
    /* both bounds are sizes (>= 0): clamp to [0, size], length max(0, e - s) */
    sj_expr s = sj_ex_min(ex, start, size), e = sj_ex_min(ex, end, size);
    sj_expr len = sj_ex_max(ex, sj_ex_sub(ex, e, s), sj_ex_const(ex, 0));
    if (len == SJ_EX_NONE || s == SJ_EX_NONE) return SJ_ENOMEM;
    *out = *in;
    out->d[axis] = len;
    *start_out = s;
    return SJ_OK;
}

sj_status sj_infer_concat(sj_infer *c, const sj_shape *const *in, int n, int axis, sj_shape *out) {
    char b1[64], b2[64];
    *out = *in[0];
    sj_expr total = in[0]->d[axis];
    for (int i = 1; i < n; i++) {
        if (in[i]->rank != in[0]->rank)
            return fail(c, "operand %d has rank %d, operand 0 has rank %d", i, in[i]->rank, in[0]->rank);
        for (int ax = 0; ax < in[0]->rank; ax++) {
            if (ax == axis) continue;
            if (!sj_infer_eq(c, in[0]->d[ax], in[i]->d[ax]))
                return fail(c, "operand %d differs at axis %d: %s vs %s", i, ax,
                            dstr(c, in[i]->d[ax], b1, sizeof b1), dstr(c, in[0]->d[ax], b2, sizeof b2));
        }
        total = sj_ex_add(c->ex, total, in[i]->d[axis]);
    }
    if (total == SJ_EX_NONE) return SJ_ENOMEM;
    out->d[axis] = total;
    return SJ_OK;
}

sj_status sj_infer_gather(sj_infer *c, const sj_shape *table, const sj_shape *idx, sj_shape *out) {
    if (table->rank < 1) return fail(c, "table must have rank >= 1");
    int rank = idx->rank + table->rank - 1;
    if (rank > SJ_MAX_RANK) return fail(c, "result rank %d exceeds %d", rank, SJ_MAX_RANK);
    out->rank = 0;
    for (int i = 0; i < idx->rank; i++) out->d[out->rank++] = idx->d[i];
    for (int i = 1; i < table->rank; i++) out->d[out->rank++] = table->d[i];
    return SJ_OK;
}

sj_status sj_infer_attention(sj_infer *c, const sj_shape *q, const sj_shape *k, const sj_shape *v,
                             const sj_shape *lengths, sj_shape *out) {
    char b1[64], b2[64];
    static const char *names[] = {"B", "H"};
    if (q->rank != 4 || k->rank != 4 || v->rank != 4)
        return fail(c, "q, k, v must have rank 4 ([B, H, S, D]); got ranks %d, %d, %d", q->rank, k->rank,
                    v->rank);
    for (int ax = 0; ax < 2; ax++) {
        if (!sj_infer_eq(c, q->d[ax], k->d[ax]) || !sj_infer_eq(c, q->d[ax], v->d[ax]))
            return fail(c, "%s differs: q %s, k %s", names[ax], dstr(c, q->d[ax], b1, sizeof b1),
                        dstr(c, k->d[ax], b2, sizeof b2));
    }
    if (!sj_infer_eq(c, q->d[3], k->d[3]))
        return fail(c, "head size differs: q %s vs k %s", dstr(c, q->d[3], b1, sizeof b1),
                    dstr(c, k->d[3], b2, sizeof b2));
    if (!sj_infer_eq(c, k->d[2], v->d[2]))
        return fail(c, "key length differs: k %s vs v %s", dstr(c, k->d[2], b1, sizeof b1),
                    dstr(c, v->d[2], b2, sizeof b2));
    if (lengths) {
        if (lengths->rank != 1) return fail(c, "lengths must have rank 1 ([B]), got rank %d", lengths->rank);
        if (!sj_infer_eq(c, lengths->d[0], q->d[0]))
            return fail(c, "lengths has %s entries, batch is %s", dstr(c, lengths->d[0], b1, sizeof b1),
                        dstr(c, q->d[0], b2, sizeof b2));
    }
    *out = *q;
    out->d[3] = v->d[3];
    return SJ_OK;
}

sj_status sj_infer_attention_varlen(sj_infer *c, const sj_shape *q, const sj_shape *k, const sj_shape *v,
                                    const sj_shape *offsets, sj_shape *out) {
    char b1[64], b2[64], b3[64];
    static const char *names[] = {"total tokens T", "heads H"};
    if (q->rank != 3 || k->rank != 3 || v->rank != 3)
        return fail(c, "q, k, v must have rank 3 ([T, H, D], packed); got ranks %d, %d, %d", q->rank, k->rank,
                    v->rank);
    for (int ax = 0; ax < 2; ax++) {
        if (!sj_infer_eq(c, q->d[ax], k->d[ax]) || !sj_infer_eq(c, q->d[ax], v->d[ax]))
            return fail(c, "%s differs: q %s, k %s, v %s", names[ax], dstr(c, q->d[ax], b1, sizeof b1),
                        dstr(c, k->d[ax], b2, sizeof b2), dstr(c, v->d[ax], b3, sizeof b3));
    }
    if (!sj_infer_eq(c, q->d[2], k->d[2]))
        return fail(c, "head size differs: q %s vs k %s", dstr(c, q->d[2], b1, sizeof b1),
                    dstr(c, k->d[2], b2, sizeof b2));
    if (offsets->rank != 1) return fail(c, "offsets must have rank 1 ([B+1]), got rank %d", offsets->rank);
    int64_t n;
    if (sj_ex_is_const(c->ex, offsets->d[0], &n) && n < 2)
        return fail(c, "offsets has %lld entries, at least 2 ([B+1] with B >= 1)", (long long)n);
    *out = *q;
    out->d[2] = v->d[2];
    return SJ_OK;
}
