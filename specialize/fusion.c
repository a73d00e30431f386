/* Fusion: views folded into layouts, then nodes gathered into groups.
 *
 * Pass 1 (layouts) walks the values in order and gives each a virtual
 * layout (offset and strides over its shape, no store yet): inputs
 * contiguous over their symbolic sizes or with their exact strides, params
 * with theirs, node results contiguous, and views derived from their
 * operand. A reshape that cannot be a view, and any view of a constant,
 * is marked to copy: a POINTWISE group of its own over the operand's shape,
 * an identity whose contiguous result is, element for element in row-major
 * order, the reshaped value. (Not a NODE group: sj_exec_node copies with
 * sj_cpu_copy, which needs equal shapes.)
 *
 * Pass 2 (groups) walks the nodes in order. A bias add the graph marks as
 * its product's (sj_node.fold) joins the product's NODE group: the
 * product's kernel adds the bias as it writes (cuBLASLt's bias epilogue;
 * on the CPU, each part of the product while its block is in cache), the
 * same kernels eager execution runs. An elementwise node joins the
 * groups of its producers that are POINTWISE over its shape (merging them
 * when it has several, as long as no cycle between groups appears), or the
 * ROW group whose row op output it extends (epilogue); otherwise it starts
 * a POINTWISE group. A row op takes the POINTWISE group producing its input
 * as its prologue when the shapes agree. Everything else is a NODE group.
 * Groups keep their direct dependencies as bitsets (and, apart, those read
 * through a view, which can never be fused since a view needs the value in
 * memory); a merge is refused when a path between two merged groups runs
 * through a group outside them.
 *
 * Pass 3 (fusion_plan.c) orders the groups, decides stores, plans the arena
 * and builds accesses.
 */
#include "base/alloc.h"
#include "specialize/fusion.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "base/tensor.h"
#include "specialize/fusion_int.h"

/* -- Expressions ----------------------------------------------------------- */

/* Every builder below records an allocation failure in b->oom and returns
 * a harmless expression, so callers check once at the end. */

sj_expr sj_fuse_chk(sj_fuse_st *b, sj_expr e) {
    if (e == SJ_EX_NONE) {
        b->oom = true;
        return 0;
    }
    return e;
}

sj_expr sj_fuse_const(sj_fuse_st *b, int64_t c) { return sj_fuse_chk(b, sj_ex_const(b->ex, c)); }
sj_expr sj_fuse_mul(sj_fuse_st *b, sj_expr x, sj_expr y) { return sj_fuse_chk(b, sj_ex_mul(b->ex, x, y)); }
sj_expr sj_fuse_add(sj_fuse_st *b, sj_expr x, sj_expr y) { return sj_fuse_chk(b, sj_ex_add(b->ex, x, y)); }

bool sj_fuse_is_one(const sj_fuse_st *b, sj_expr e) {
    int64_t v;
    return sj_ex_is_const(b->ex, e, &v) && v == 1;
}

/* Row-major contiguous strides of shape[0 .. rank). */
void sj_fuse_contig(sj_fuse_st *b, int rank, const sj_expr *shape, sj_expr *stride) {
    sj_expr s = sj_fuse_const(b, 1);
    for (int i = rank - 1; i >= 0; i--) {
        stride[i] = s;
        s = sj_fuse_mul(b, s, shape[i]);
    }
}

static bool same_shape(const sj_value *a, int rank, const sj_expr *shape) {
    if (a->rank != rank) return false;
    for (int i = 0; i < rank; i++)
        if (a->shape[i] != shape[i]) return false;
    return true;
}

/* -- Layouts ----------------------------------------------------------------- */

static bool is_contig(sj_fuse_st *b, const sj_value *v, const sj_expr *st) {
    sj_expr c[SJ_MAX_RANK];
    sj_fuse_contig(b, v->rank, v->shape, c);
    for (int i = 0; i < v->rank; i++)
        if (!sj_fuse_is_one(b, v->shape[i]) && st[i] != c[i]) return false;
    return true;
}

/* torch's view rule over expressions: the operand's axes fall into chunks
 * that are contiguous within themselves; the new axes, taken from the
 * right, must multiply to each chunk's size (compared by id; size-1 axes
 * are free). Fills out (strides over the new shape); false: must copy. */
static bool reshape_view(sj_fuse_st *b, const sj_value *x, const sj_expr *xs, const sj_value *y, sj_expr *out) {
    if (is_contig(b, x, xs)) {
        sj_fuse_contig(b, y->rank, y->shape, out);
        return true;
    }
    if (x->rank == 0) {
        for (int i = 0; i < y->rank; i++) out[i] = sj_fuse_const(b, 0);
        return true;
    }
    int vd = y->rank - 1;
    sj_expr base = xs[x->rank - 1], tn = sj_fuse_const(b, 1), vn = tn;
    for (int d = x->rank - 1; d >= 0; d--) {
        tn = sj_fuse_mul(b, tn, x->shape[d]);
        if (d > 0 && (sj_fuse_is_one(b, x->shape[d - 1]) || xs[d - 1] == sj_fuse_mul(b, tn, base))) continue;
        while (vd >= 0 && (vn != tn || sj_fuse_is_one(b, y->shape[vd]))) {
            out[vd] = sj_fuse_mul(b, vn, base);
            vn = sj_fuse_mul(b, vn, y->shape[vd]);
            vd--;
        }
        if (vn != tn || b->oom) return false;
        if (d > 0) {
            base = xs[d - 1];
            tn = vn = sj_fuse_const(b, 1);
        }
    }
    return vd == -1;
}

static void layout_input(sj_fuse_st *b, int32_t v) {
    const sj_value *val = &b->g->vals[v];
    sj_expr *st = &b->vst[(size_t)v * SJ_MAX_RANK];
    const sj_tensor *t = b->traced ? &b->traced[val->index] : NULL;
    if (val->kind == SJ_VAL_INPUT && (!t || sj_tensor_is_contiguous(t))) {
        sj_fuse_contig(b, val->rank, val->shape, st);
        return;
    }
    if (val->kind == SJ_VAL_PARAM) t = &b->g->params[val->index];
    for (int i = 0; i < val->rank; i++) st[i] = sj_fuse_const(b, t->stride[i]);
}

/* The layout of a view node's result from its operand's. */
static void layout_view(sj_fuse_st *b, const sj_node *n) {
    const sj_graph *g = b->g;
    int32_t x = sj_node_ins(g, n)[0], y = n->out;
    const sj_value *xv = &g->vals[x], *yv = &g->vals[y];
    const sj_expr *xs = &b->vst[(size_t)x * SJ_MAX_RANK];
    sj_expr *ys = &b->vst[(size_t)y * SJ_MAX_RANK];
    b->voff[y] = b->voff[x];
    b->root[y] = b->root[x];
    switch (n->op) {
    case SJ_OP_PERMUTE:
        for (int i = 0; i < yv->rank; i++) ys[i] = xs[n->a.perm[i]];
        return;
    case SJ_OP_SLICE:
        for (int i = 0; i < yv->rank; i++) ys[i] = xs[i];
        b->voff[y] = sj_fuse_add(b, b->voff[x], sj_fuse_mul(b, n->a.start, xs[n->a.axis]));
        ys[n->a.axis] = sj_fuse_mul(b, xs[n->a.axis], sj_fuse_const(b, n->a.step));
        return;
    default:
        assert(n->op == SJ_OP_RESHAPE);
        if (reshape_view(b, xv, xs, yv, ys)) return;
        b->copy[y] = true;
        b->root[y] = y;
        b->voff[y] = sj_fuse_const(b, 0);
        sj_fuse_contig(b, yv->rank, yv->shape, ys);
        return;
    }
}

/* An attention result whose one reader is a permute that a reshape reads
 * (the heads merged back into one axis) is written in the permuted order:
 * the permute's result is then contiguous and the reshape folds into a view
 * instead of a copy. The attention kernels take any output strides; a
 * result that is a function output keeps the contiguous layout its output
 * tensor has. Fills st and returns true when it applies. */
static bool permuted_result(sj_fuse_st *b, int32_t v, sj_expr *st) {
    const sj_graph *g = b->g;
    const sj_value *val = &g->vals[v];
    for (int i = 0; i < g->n_outputs; i++)
        if (g->outputs[i] == v) return false;
    const sj_node *perm = NULL;
    bool reshaped = false;
    for (int32_t k = 0; k < g->n_nodes; k++) {
        const sj_node *n = &g->nodes[k];
        const int32_t *in = sj_node_ins(g, n);
        for (int a = 0; a < n->n_in; a++) {
            if (in[a] == v) {
                if (perm || n->op != SJ_OP_PERMUTE) return false;
                perm = n;
            } else if (perm && in[a] == perm->out && n->op == SJ_OP_RESHAPE) {
                reshaped = true; /* nodes are in trace order: readers of the permute come after it */
            }
        }
    }
    if (!perm || !reshaped) return false;
    sj_expr ps[SJ_MAX_RANK], cs[SJ_MAX_RANK];
    for (int i = 0; i < val->rank; i++) ps[i] = val->shape[perm->a.perm[i]];
    sj_fuse_contig(b, val->rank, ps, cs);
    for (int i = 0; i < val->rank; i++) st[perm->a.perm[i]] = cs[i];
    return true;
}

static void layouts(sj_fuse_st *b) {
    const sj_graph *g = b->g;
    for (int32_t v = 0; v < g->n_vals && !b->oom; v++) {
        const sj_value *val = &g->vals[v];
        sj_expr *st = &b->vst[(size_t)v * SJ_MAX_RANK];
        b->root[v] = v;
        b->voff[v] = sj_fuse_const(b, 0);
        switch (val->kind) {
        case SJ_VAL_INPUT:
        case SJ_VAL_PARAM:
            layout_input(b, v);
            break;
        case SJ_VAL_CONST:
            for (int i = 0; i < val->rank; i++) st[i] = sj_fuse_const(b, 0);
            break;
        default: {
            const sj_node *n = &g->nodes[val->index];
            int32_t x = n->n_in > 0 ? sj_node_ins(g, n)[0] : -1;
            if (sj_op_kind_of(n->op) == SJ_K_VIEW && g->vals[b->root[x]].kind != SJ_VAL_CONST) {
                layout_view(b, n);
            } else {
                /* a computed value; a view of a constant is copied (no memory
                 * to point into) */
                b->copy[v] = sj_op_kind_of(n->op) == SJ_K_VIEW;
                if (n->op != SJ_OP_ATTENTION || !permuted_result(b, v, st))
                    sj_fuse_contig(b, val->rank, val->shape, st);
            }
            break;
        }
        }
    }
}

/* -- Group bookkeeping ----------------------------------------------------------- */

static uint64_t *dep_of(sj_fuse_st *b, int gi) { return &b->dep[(size_t)gi * (size_t)b->words]; }
static uint64_t *vdep_of(sj_fuse_st *b, int gi) { return &b->vdep[(size_t)gi * (size_t)b->words]; }
static void bit_set(uint64_t *s, int i) { s[i >> 6] |= 1ull << (i & 63); }
static bool bit_get(const uint64_t *s, int i) { return (s[i >> 6] >> (i & 63)) & 1; }

static int add_node(sj_fuse_st *b, int gi, int32_t ni) {
    sj_fuse_grp *gr = &b->gr[gi];
    if (gr->n_nodes == gr->cap) {
        int cap = gr->cap ? gr->cap * 2 : 8;
        int32_t *nn = sj_realloc(gr->nodes, (size_t)cap * sizeof *nn);
        if (!nn) {
            b->oom = true;
            return -1;
        }
        gr->nodes = nn;
        gr->cap = cap;
    }
    gr->nodes[gr->n_nodes++] = ni;
    gr->cost += b->g->nodes[ni].n_in + 1;
    b->vgroup[b->g->nodes[ni].out] = gi;
    return 0;
}

static int new_group(sj_fuse_st *b, sj_group_kind kind, int32_t ni, int rank, const sj_expr *shape) {
    int gi = b->n_gr++;
    sj_fuse_grp *gr = &b->gr[gi];
    memset(gr, 0, sizeof *gr);
    gr->kind = kind;
    gr->alive = true;
    gr->row_node = -1;
    gr->rank = rank;
    memcpy(gr->shape, shape, sizeof(sj_expr) * (size_t)rank);
    return add_node(b, gi, ni) ? -1 : gi;
}

/* The group whose memory operand u is read from (through views), or -1;
 * *via_view: u is a view of it. */
static int producer(const sj_fuse_st *b, int32_t u, bool *via_view) {
    int32_t r = b->root[u];
    *via_view = r != u;
    return b->g->vals[r].kind == SJ_VAL_NODE ? b->vgroup[r] : -1;
}

/* Record n's operands as dependencies of group gi. */
static void add_deps(sj_fuse_st *b, int gi, const sj_node *n) {
    const int32_t *in = sj_node_ins(b->g, n);
    for (int k = 0; k < n->n_in; k++) {
        bool view;
        int h = in[k] >= 0 ? producer(b, in[k], &view) : -1;
        if (h < 0 || h == gi) continue;
        bit_set(dep_of(b, gi), h);
        if (view) bit_set(vdep_of(b, gi), h);
    }
}

/* Can any group in `from` reach a member of `set` through direct
 * dependencies? (Groups form a DAG; a depth-first walk over the words.) */
static bool reaches(sj_fuse_st *b, const uint64_t *from, const uint64_t *set) {
    int W = b->words;
    uint64_t *seen = b->scratch, *stack_set = b->scratch + W;
    memset(seen, 0, sizeof(uint64_t) * (size_t)W);
    memcpy(stack_set, from, sizeof(uint64_t) * (size_t)W);
    for (;;) {
        int pick = -1;
        for (int w = 0; w < W && pick < 0; w++)
            if (stack_set[w]) pick = w * 64 + __builtin_ctzll(stack_set[w]);
        if (pick < 0) return false;
        stack_set[pick >> 6] &= ~(1ull << (pick & 63));
        if (bit_get(seen, pick)) continue;
        bit_set(seen, pick);
        if (bit_get(set, pick)) return true;
        const uint64_t *d = dep_of(b, pick);
        for (int w = 0; w < W; w++) stack_set[w] |= d[w] & ~seen[w];
    }
}

/* Would putting node n into the union of the groups in `set` make a cycle,
 * read a view of a member, or risk more accesses than the executor takes? */
static bool merge_blocked(sj_fuse_st *b, const uint64_t *set, const sj_node *n) {
    int W = b->words, cost = n->n_in + 1;
    uint64_t *out = b->scratch + 2 * W;
    memset(out, 0, sizeof(uint64_t) * (size_t)W);
    for (int gi = 0; gi < b->n_gr; gi++) {
        if (!bit_get(set, gi)) continue;
        if ((cost += b->gr[gi].cost) > SJ_FUSE_MAX_ACCESSES) return true;
        const uint64_t *d = dep_of(b, gi), *vd = vdep_of(b, gi);
        for (int w = 0; w < W; w++) {
            if (vd[w] & set[w]) return true;
            out[w] |= d[w];
        }
    }
    const int32_t *in = sj_node_ins(b->g, n);
    for (int k = 0; k < n->n_in; k++) {
        bool view;
        int h = in[k] >= 0 ? producer(b, in[k], &view) : -1;
        if (h < 0) continue;
        if (bit_get(set, h)) {
            if (view) return true;
        } else {
            bit_set(out, h);
        }
    }
    for (int w = 0; w < W; w++) out[w] &= ~set[w];
    return reaches(b, out, set);
}

/* Merge every group of `set` into its lowest member; returns it. */
static int merge(sj_fuse_st *b, const uint64_t *set) {
    int W = b->words, into = -1;
    for (int gi = 0; gi < b->n_gr; gi++) {
        if (!bit_get(set, gi)) continue;
        if (into < 0) {
            into = gi;
            continue;
        }
        sj_fuse_grp *src = &b->gr[gi];
        for (int k = 0; k < src->n_nodes; k++)
            if (add_node(b, into, src->nodes[k])) return -1;
        uint64_t *d = dep_of(b, into), *vd = vdep_of(b, into);
        for (int w = 0; w < W; w++) {
            d[w] |= dep_of(b, gi)[w];
            vd[w] |= vdep_of(b, gi)[w];
        }
        free(src->nodes);
        src->nodes = NULL;
        src->n_nodes = 0;
        src->alive = false;
    }
    assert(into >= 0);
    for (int w = 0; w < W; w++) {
        uint64_t keep = ~set[w];
        dep_of(b, into)[w] &= keep;
        vdep_of(b, into)[w] &= keep;
    }
    /* groups that depended on a merged member now depend on `into` */
    for (int gi = 0; gi < b->n_gr; gi++) {
        if (!b->gr[gi].alive || gi == into) continue;
        uint64_t *d = dep_of(b, gi), *vd = vdep_of(b, gi);
        bool hit = false, vhit = false;
        for (int w = 0; w < W; w++) {
            hit |= (d[w] & set[w]) != 0;
            vhit |= (vd[w] & set[w]) != 0;
            d[w] &= ~set[w];
            vd[w] &= ~set[w];
        }
        if (hit) bit_set(d, into);
        if (vhit) bit_set(vd, into);
    }
    return into;
}

/* -- Grouping ----------------------------------------------------------------- */

static bool is_elementwise(sj_op op) {
    sj_op_kind k = sj_op_kind_of(op);
    return k == SJ_K_UNARY || k == SJ_K_BINARY || k == SJ_K_COMPARE || k == SJ_K_WHERE || k == SJ_K_CAST;
}

bool sj_fuse_is_row_op(const sj_graph *g, const sj_node *n) {
    if (n->n_in < 1 || sj_node_ins(g, n)[0] < 0) return false;
    const sj_value *x = &g->vals[sj_node_ins(g, n)[0]];
    int64_t last;
    if (x->rank < 1 || (sj_ex_is_const(g->ex, x->shape[x->rank - 1], &last) && last == 0)) return false;
    switch (n->op) {
    case SJ_OP_LAYER_NORM:
    case SJ_OP_RMS_NORM:
        return true;
    case SJ_OP_SOFTMAX:
    case SJ_OP_SUM:
    case SJ_OP_MEAN:
    case SJ_OP_AMAX:
        return n->a.axis == x->rank - 1;
    default:
        return false;
    }
}

/* Does a reduce-without-keepdim ROW group already read u in its prologue?
 * (Its epilogue addresses values over the reduced shape, so one value
 * cannot be read in both spaces.) */
static bool prologue_reads(const sj_fuse_st *b, const sj_fuse_grp *gr, int32_t u) {
    const sj_node *rn = &b->g->nodes[gr->row_node];
    if (sj_op_kind_of(rn->op) != SJ_K_REDUCE || rn->a.keepdim) return false;
    for (int k = 0; k < gr->n_nodes; k++) {
        if (gr->nodes[k] > gr->row_node) continue;
        const sj_node *m = &b->g->nodes[gr->nodes[k]];
        for (int j = 0; j < m->n_in; j++)
            if (sj_node_ins(b->g, m)[j] == u) return true;
    }
    return false;
}

/* May elementwise node n extend ROW group gi as epilogue? */
static bool epilogue_ok(sj_fuse_st *b, int gi, const sj_node *n) {
    const sj_fuse_grp *gr = &b->gr[gi];
    const sj_value *o = &b->g->vals[n->out];
    const sj_value *ro = &b->g->vals[b->g->nodes[gr->row_node].out];
    if (!same_shape(o, ro->rank, ro->shape)) return false;
    const int32_t *in = sj_node_ins(b->g, n);
    for (int k = 0; k < n->n_in; k++) {
        bool view;
        if (producer(b, in[k], &view) != gi && b->g->vals[in[k]].kind != SJ_VAL_CONST &&
            prologue_reads(b, gr, in[k]))
            return false;
    }
    return true;
}

static int join_single(sj_fuse_st *b, int gi, const sj_node *n) {
    uint64_t *set = b->scratch + 3 * b->words;
    memset(set, 0, sizeof(uint64_t) * (size_t)b->words);
    bit_set(set, gi);
    return merge_blocked(b, set, n) ? -1 : gi;
}

static int group_elementwise(sj_fuse_st *b, int32_t ni) {
    const sj_graph *g = b->g;
    const sj_node *n = &g->nodes[ni];
    const sj_value *o = &g->vals[n->out];
    const int32_t *in = sj_node_ins(g, n);
    int W = b->words, cands[8], nc = 0, row = -1;
    for (int k = 0; k < n->n_in; k++) {
        bool view;
        int h = producer(b, in[k], &view);
        if (h < 0 || view) continue;
        const sj_fuse_grp *gr = &b->gr[h];
        if (gr->kind == SJ_G_POINTWISE && same_shape(o, gr->rank, gr->shape)) {
            bool dup = false;
            for (int c = 0; c < nc; c++) dup |= cands[c] == h;
            if (!dup) cands[nc++] = h;
        } else if (gr->kind == SJ_G_ROW && row < 0 && epilogue_ok(b, h, n)) {
            row = h;
        }
    }
    int gi = -1;
    if (row >= 0) gi = join_single(b, row, n);
    if (gi < 0 && nc > 1) {
        uint64_t *set = b->scratch + 3 * W;
        memset(set, 0, sizeof(uint64_t) * (size_t)W);
        for (int c = 0; c < nc; c++) bit_set(set, cands[c]);
        if (!merge_blocked(b, set, n)) gi = merge(b, set);
        if (b->oom) return -1;
    }
    for (int c = 0; c < nc && gi < 0; c++) gi = join_single(b, cands[c], n);
    if (gi < 0) {
        gi = new_group(b, SJ_G_POINTWISE, ni, o->rank, o->shape);
        if (gi < 0) return -1;
    } else if (add_node(b, gi, ni)) {
        return -1;
    }
    add_deps(b, gi, n);
    return 0;
}

static int group_row(sj_fuse_st *b, int32_t ni) {
    const sj_graph *g = b->g;
    const sj_node *n = &g->nodes[ni];
    int32_t x = sj_node_ins(g, n)[0];
    const sj_value *xv = &g->vals[x];
    bool view;
    int p = producer(b, x, &view), gi = -1;
    if (p >= 0 && !view && b->gr[p].kind == SJ_G_POINTWISE && same_shape(xv, b->gr[p].rank, b->gr[p].shape))
        gi = join_single(b, p, n);
    if (gi < 0) {
        gi = new_group(b, SJ_G_ROW, ni, xv->rank, xv->shape);
        if (gi < 0) return -1;
    } else if (add_node(b, gi, ni)) {
        return -1;
    }
    b->gr[gi].kind = SJ_G_ROW;
    b->gr[gi].row_node = ni;
    add_deps(b, gi, n);
    return 0;
}

static int group_nodes(sj_fuse_st *b) {
    const sj_graph *g = b->g;
    for (int32_t ni = 0; ni < g->n_nodes; ni++) {
        const sj_node *n = &g->nodes[ni];
        int st;
        if (sj_op_kind_of(n->op) == SJ_K_VIEW) {
            if (!b->copy[n->out]) continue;
            /* a copy: a generated identity over the operand's shape, whose
             * contiguous result is the reshaped value's memory */
            const sj_value *x = &g->vals[sj_node_ins(g, n)[0]];
            st = new_group(b, SJ_G_POINTWISE, ni, x->rank, x->shape) < 0 ? -1 : 0;
            if (!st) add_deps(b, b->n_gr - 1, n);
        } else if (n->fold == SJ_FOLDED) {
            /* the product is the operand whose node folds this add */
            const int32_t *in = sj_node_ins(g, n);
            int32_t u = in[0];
            if (g->vals[u].kind != SJ_VAL_NODE || g->nodes[g->vals[u].index].fold != ni) u = in[1];
            int gm = b->vgroup[u];
            assert(gm >= 0 && b->gr[gm].kind == SJ_G_NODE && b->gr[gm].n_nodes == 1);
            st = add_node(b, gm, ni);
            if (!st) add_deps(b, gm, n);
        } else if (is_elementwise(n->op)) {
            st = group_elementwise(b, ni);
        } else if (sj_fuse_is_row_op(g, n)) {
            st = group_row(b, ni);
        } else {
            const sj_value *o = &g->vals[n->out];
            st = new_group(b, SJ_G_NODE, ni, o->rank, o->shape) < 0 ? -1 : 0;
            if (!st) add_deps(b, b->n_gr - 1, n);
        }
        if (st || b->oom) return -1;
    }
    return 0;
}

/* -- Entry point ---------------------------------------------------------------- */

static void fz_free(sj_fuse_st *b) {
    for (int i = 0; i < b->n_gr; i++) free(b->gr[i].nodes);
    free(b->gr);
    free(b->root);
    free(b->vgroup);
    free(b->voff);
    free(b->vst);
    free(b->copy);
    free(b->dep);
    free(b->vdep);
    free(b->scratch);
}

sj_fplan *sj_fuse(sj_graph *g, const sj_tensor *traced) { return sj_fuse_ex(g, traced, NULL); }

sj_fplan *sj_fuse_ex(sj_graph *g, const sj_tensor *traced, const sj_fuse_opts *o) {
    sj_fuse_st b = {.g = g, .ex = g->ex, .traced = traced, .gemm = o && o->gemm, .gemm_ln = o && o->gemm && o->gemm_ln,
                    .gemm_arch = o ? o->gemm_arch : 0, .gemm_units = o ? o->gemm_units : 0,
                    .pinned = o ? o->pinned : 0};
    size_t nv = (size_t)g->n_vals + 1, nn = (size_t)g->n_nodes + 1;
    b.words = (int)((nn + 63) / 64);
    b.root = sj_malloc(nv * sizeof *b.root);
    b.vgroup = sj_malloc(nv * sizeof *b.vgroup);
    b.voff = sj_malloc(nv * sizeof *b.voff);
    b.vst = sj_calloc(nv * SJ_MAX_RANK, sizeof *b.vst);
    b.copy = sj_calloc(nv, sizeof *b.copy);
    b.gr = sj_calloc(nn, sizeof *b.gr);
    b.dep = sj_calloc(nn * (size_t)b.words, sizeof *b.dep);
    b.vdep = sj_calloc(nn * (size_t)b.words, sizeof *b.vdep);
    b.scratch = sj_calloc(4 * (size_t)b.words, sizeof *b.scratch);
    sj_fplan *p = NULL;
    if (b.root && b.vgroup && b.voff && b.vst && b.copy && b.gr && b.dep && b.vdep && b.scratch) {
        for (size_t v = 0; v < nv; v++) b.vgroup[v] = -1;
        layouts(&b);
        if (!b.oom && !group_nodes(&b) && !b.oom) p = sj_fuse_finish(&b);
    }
    fz_free(&b);
    return p;
}
