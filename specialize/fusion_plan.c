/* Fusion, second half: from groups to a plan.
 *
 * Order   groups are sorted topologically over their dependencies (ties:
 *         the group with the earliest node first).
 * Stores  a computed value is stored when another group reads it (directly
 *         or through a view), a view of it is read at all, it is an output,
 *         or a NODE group computes it. An output computed by a group goes
 *         to the caller's buffer at its first position; every other output
 *         position is copied after the groups run. The rest go to the
 *         arena.
 * Arena   a buffer lives from its writing group to its last reader (output
 *         copies read after the last group). Buffers are placed greedily in
 *         group order into slots: a slot is reused once the lifetime of its
 *         last buffer has ended before the new one starts; its size is the
 *         symbolic max of what it holds, and offsets are prefix sums, so
 *         buffers whose lifetimes overlap are disjoint for every value of
 *         the symbols.
 * Epilogue a POINTWISE group right after a float product's NODE group that
 *         reads the product's result contiguously over exactly its shape
 *         (fusion.h); its stores then live from the product on.
 * Access  every load and store of a generated group over its iteration
 *         space: shapes right-aligned (a reduction without keepdim
 *         addresses its epilogue over the reduced shape, with stride 0 on
 *         the row), stride 0 where the value broadcasts; then size-1 axes
 *         dropped and neighbours merged where every access allows.
 */
#include <assert.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "specialize/codegen_gemm_cuda.h"
#include "specialize/fusion.h"
#include "specialize/fusion_int.h"

/* -- Order ------------------------------------------------------------------ */

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* Kahn's algorithm over the live groups; ord[k] = builder group of plan
 * group k, pos[builder group] = k. Returns the count. */
static int order_groups(sj_fuse_st *b, int *ord, int *pos) {
    int n = 0, done = 0;
    for (int i = 0; i < b->n_gr; i++) {
        pos[i] = -1;
        if (!b->gr[i].alive) continue;
        qsort(b->gr[i].nodes, (size_t)b->gr[i].n_nodes, sizeof(int32_t), cmp_i32);
        n++;
    }
    while (done < n) {
        int pick = -1;
        for (int i = 0; i < b->n_gr; i++) {
            if (!b->gr[i].alive || pos[i] >= 0) continue;
            const uint64_t *d = &b->dep[(size_t)i * (size_t)b->words];
            bool ready = true;
            for (int h = 0; h < b->n_gr && ready; h++)
                if ((d[h >> 6] >> (h & 63)) & 1) ready = pos[h] >= 0;
            if (ready && (pick < 0 || b->gr[i].nodes[0] < b->gr[pick].nodes[0])) pick = i;
        }
        assert(pick >= 0); /* the groups form a DAG */
        pos[pick] = done;
        ord[done++] = pick;
    }
    return n;
}

/* -- Stores ------------------------------------------------------------------- */

typedef struct plan_ctx {
    sj_fuse_st *b;
    sj_fplan *p;
    int *ord, *pos;   /* see order_groups */
    bool *need;       /* per value: computed and stored */
    int *last;        /* per value: plan index of its last reader */
    int *first_out;   /* per value: first output position, or -1 */
    int *epi_of;      /* per plan group: the product it is the epilogue of, or -1 */
    sj_group *gm;     /* per plan group: gemm_* fields (find_gemms) */
} plan_ctx;

static bool computed(const sj_fuse_st *b, int32_t v) { return b->root[v] == v && b->vgroup[v] >= 0; }

static void mark_reads(plan_ctx *c) {
    sj_fuse_st *b = c->b;
    const sj_graph *g = b->g;
    for (int k = 0; k < c->p->n_groups; k++) {
        int gi = c->ord[k];
        const sj_fuse_grp *gr = &b->gr[gi];
        for (int j = 0; j < gr->n_nodes; j++) {
            const sj_node *n = &g->nodes[gr->nodes[j]];
            const int32_t *in = sj_node_ins(g, n);
            /* a NODE group's result; not a product under its bias */
            if (gr->kind == SJ_G_NODE && j == gr->n_nodes - 1) c->need[n->out] = true;
            for (int a = 0; a < n->n_in; a++) {
                if (in[a] < 0) continue;
                int32_t r = b->root[in[a]];
                if (!computed(b, r) || (r == in[a] && b->vgroup[r] == gi)) continue;
                c->need[r] = true;
                if (k > c->last[r]) c->last[r] = k;
            }
        }
    }
    for (int i = 0; i < g->n_outputs; i++) {
        int32_t u = g->outputs[i], r = b->root[u];
        bool comp = computed(b, u);
        if (comp && c->first_out[u] < 0) {
            c->first_out[u] = i;
        } else {
            c->p->output_copy[i] = true;
            if (computed(b, r)) c->last[r] = c->p->n_groups; /* read after the groups */
        }
        if (computed(b, r)) c->need[r] = true;
    }
}

static int add_store(sj_fplan *p, sj_store_kind kind, int32_t index, sj_dtype dt) {
    sj_store *s = &p->stores[p->n_stores];
    s->kind = kind;
    s->index = index;
    s->dtype = dt;
    s->bytes = s->offset = SJ_EX_NONE;
    return p->n_stores++;
}

/* Stores and layouts of every value. */
static void make_stores(plan_ctx *c) {
    sj_fuse_st *b = c->b;
    const sj_graph *g = b->g;
    sj_fplan *p = c->p;
    int *in_store = c->last + g->n_vals; /* scratch: input stores, then params */
    for (int i = 0; i < g->n_inputs; i++) in_store[i] = -1;
    for (int32_t v = 0; v < g->n_vals; v++) {
        const sj_value *val = &g->vals[v];
        sj_layout *l = &p->layouts[v];
        l->store = -1;
        l->offset = b->voff[v];
        memcpy(l->stride, &b->vst[(size_t)v * SJ_MAX_RANK], sizeof l->stride);
        if (val->kind == SJ_VAL_INPUT) {
            if (in_store[val->index] < 0) in_store[val->index] = add_store(p, SJ_ST_INPUT, val->index, val->dtype);
            l->store = in_store[val->index];
        } else if (val->kind == SJ_VAL_PARAM) {
            l->store = add_store(p, SJ_ST_PARAM, val->index, val->dtype);
        } else if (computed(b, v) && c->first_out[v] >= 0) {
            l->store = add_store(p, SJ_ST_OUTPUT, c->first_out[v], val->dtype);
        }
    }
    /* arena buffers in the order they are written */
    for (int k = 0; k < p->n_groups; k++) {
        const sj_fuse_grp *gr = &b->gr[c->ord[k]];
        for (int j = 0; j < gr->n_nodes; j++) {
            int32_t v = g->nodes[gr->nodes[j]].out;
            const sj_value *val = &g->vals[v];
            if (!c->need[v] || c->first_out[v] >= 0) continue;
            int s = add_store(p, SJ_ST_ARENA, -1, val->dtype);
            sj_expr n = sj_fuse_const(b, (int64_t)sj_dtype_size(val->dtype));
            for (int a = 0; a < val->rank; a++) n = sj_fuse_mul(b, n, val->shape[a]);
            n = sj_fuse_chk(b, sj_ex_floordiv(b->ex, sj_fuse_add(b, n, sj_fuse_const(b, 63)), sj_fuse_const(b, 64)));
            p->stores[s].bytes = sj_fuse_mul(b, n, sj_fuse_const(b, 64));
            p->layouts[v].store = s;
        }
    }
    /* views point into their root's store */
    for (int32_t v = 0; v < g->n_vals; v++)
        if (b->root[v] != v) p->layouts[v].store = p->layouts[b->root[v]].store;
}

/* -- Epilogues ------------------------------------------------------------------- */

static bool same_shape(const sj_value *v, const sj_fuse_grp *gr) {
    if (v->rank != gr->rank) return false;
    for (int a = 0; a < v->rank; a++)
        if (v->shape[a] != gr->shape[a]) return false;
    return true;
}

/* Is value v's layout contiguous over its own shape, from element 0? */
static bool contiguous_at0(sj_fuse_st *b, const sj_layout *l, const sj_value *v) {
    int64_t off;
    if (!sj_ex_is_const(b->ex, l->offset, &off) || off != 0) return false;
    sj_expr st[SJ_MAX_RANK];
    sj_fuse_contig(b, v->rank, v->shape, st);
    for (int a = 0; a < v->rank; a++)
        if (st[a] != l->stride[a] && !sj_fuse_is_one(b, v->shape[a])) return false;
    return true;
}

/* Plan group k+1 as the epilogue of product k where fusion.h allows. */
static void find_epilogues(plan_ctx *c) {
    sj_fuse_st *b = c->b;
    const sj_graph *g = b->g;
    for (int k = 0; k < c->p->n_groups; k++) c->epi_of[k] = -1;
    for (int k = 0; k + 1 < c->p->n_groups; k++) {
        const sj_fuse_grp *pg = &b->gr[c->ord[k]], *eg = &b->gr[c->ord[k + 1]];
        if (pg->kind != SJ_G_NODE || eg->kind != SJ_G_POINTWISE || c->epi_of[k] >= 0) continue;
        const sj_node *mm = &g->nodes[pg->nodes[0]]; /* sorted: the product first */
        int32_t v = g->nodes[pg->nodes[pg->n_nodes - 1]].out;
        const sj_value *val = &g->vals[v];
        bool dt_ok = val->dtype == SJ_F32 || (c->gm[k].gemm_tile >= 0 && val->dtype == SJ_F16);
        if (mm->op != SJ_OP_MATMUL || !dt_ok || b->root[v] != v || !same_shape(val, eg) ||
            c->p->layouts[v].store < 0 || !contiguous_at0(b, &c->p->layouts[v], val))
            continue;
        /* it reads v itself, and nothing else of v's memory (a view of v
         * would read elements not finished yet) */
        bool reads = false, other = false;
        for (int j = 0; j < eg->n_nodes && !other; j++) {
            const sj_node *n = &g->nodes[eg->nodes[j]];
            const int32_t *in = sj_node_ins(g, n);
            for (int a = 0; a < n->n_in; a++) {
                if (in[a] < 0 || b->root[in[a]] != v) continue;
                if (in[a] == v) reads = true;
                else other = true;
            }
        }
        if (reads && !other) c->epi_of[k + 1] = k;
    }
}

/* -- Generated products ------------------------------------------------------------ */

static bool half_or_float(sj_dtype dt) { return dt == SJ_F16 || dt == SJ_F32; }

static bool const_of(const sj_fuse_st *b, sj_expr e, int64_t *v) { return sj_ex_is_const(b->ex, e, v); }

/* e's value where it is the same on every call the plan serves: a constant,
 * or a symbol the trace's facts pin (sj_fuse_opts.pinned: under the default
 * policy every size is a symbol, and a product's inner size is pinned by
 * its constant weight). */
static bool fixed_of(const sj_fuse_st *b, sj_expr e, int64_t *v) {
    int s;
    if (const_of(b, e, v)) return true;
    if (!sj_ex_is_sym(b->ex, e, &s) || s >= 64 || !(b->pinned >> s & 1)) return false;
    *v = sj_ex_hint(b->ex, e);
    return true;
}

/* Sizes x and y are equal on every call: the same expression, or both
 * fixed (fixed_of) to one value. */
static bool same_size(const sj_fuse_st *b, sj_expr x, sj_expr y) {
    int64_t vx, vy;
    return x == y || (fixed_of(b, x, &vx) && fixed_of(b, y, &vy) && vx == vy);
}

/* Plan group k as a generated product where fusion.h's "Generated
 * products" allows (before find_epilogues, which reads the mark). */
static void find_gemms(plan_ctx *c) {
    sj_fuse_st *b = c->b;
    const sj_graph *g = b->g;
    sj_fplan *p = c->p;
    for (int k = 0; k < p->n_groups; k++) {
        c->gm[k].gemm_tile = c->gm[k].gemm_res = c->gm[k].gemm_out = c->gm[k].gemm_ln = -1;
        c->gm[k].gemm_epi = 0;
    }
    if (!b->gemm) return;
    for (int k = 0; k < p->n_groups; k++) {
        const sj_fuse_grp *pg = &b->gr[c->ord[k]];
        if (pg->kind != SJ_G_NODE) continue;
        const sj_node *mm = &g->nodes[pg->nodes[0]];
        if (mm->op != SJ_OP_MATMUL || mm->n_in < 2) continue;
        const int32_t *in = sj_node_ins(g, mm);
        int32_t va = in[0], vb = in[1], v = g->nodes[pg->nodes[pg->n_nodes - 1]].out;
        if (va < 0 || vb < 0) continue;
        const sj_value *A = &g->vals[va], *B = &g->vals[vb], *Y = &g->vals[v];
        int64_t K, N, k2;
        if (A->dtype != SJ_F16 || B->dtype != SJ_F16 || Y->dtype != SJ_F16 || B->rank != 2 || A->rank < 2 ||
            Y->rank != A->rank || !const_of(b, B->shape[0], &K) || !const_of(b, B->shape[1], &N) ||
            !fixed_of(b, A->shape[A->rank - 1], &k2) || k2 != K)
            continue;
        const sj_layout *la = &p->layouts[va], *lb = &p->layouts[vb], *ly = &p->layouts[v];
        if (la->store < 0 || lb->store < 0 || ly->store < 0 || p->stores[lb->store].kind != SJ_ST_PARAM ||
            !contiguous_at0(b, la, A) || !contiguous_at0(b, lb, B) || !contiguous_at0(b, ly, Y))
            continue;
        if (mm->fold >= 0) { /* the bias: unit stride over N, sizes 1 before */
            int32_t bv = sj_fold_bias(g, mm);
            const sj_value *bb = &g->vals[bv];
            const sj_layout *lbb = &p->layouts[bv];
            int64_t one;
            bool ok = half_or_float(bb->dtype) && bb->rank >= 1 && lbb->store >= 0 &&
                      const_of(b, lbb->stride[bb->rank - 1], &one) && one == 1;
            for (int a = 0; a + 1 < bb->rank && ok; a++) ok = sj_fuse_is_one(b, bb->shape[a]);
            if (!ok) continue;
        }
        /* the rows where every size before the last is fixed (a static or
         * specialized entry), else 0: the candidates for every M */
        int64_t M = 1, d;
        for (int a = 0; a + 1 < Y->rank && M > 0; a++) M = fixed_of(b, Y->shape[a], &d) ? M * d : 0;
        c->gm[k].gemm_nv = sj_gemm_cuda_candidates(M, N, K, b->gemm_arch, b->gemm_units, c->gm[k].gemm_tiles, 4);
        if (c->gm[k].gemm_nv) {
            c->gm[k].gemm_tile = c->gm[k].gemm_tiles[0];
            c->gm[k].gemm_out = v;
        }
    }
}

/* A residual r the kernel can add to a product's result of value y's
 * shape (not y's own memory, not computed in plan group `in`): f16 or
 * f32, stored contiguously from element 0, the same size on every axis. */
static bool residual_ok(plan_ctx *c, int32_t r, int32_t y, int in) {
    sj_fuse_st *b = c->b;
    const sj_graph *g = b->g;
    const sj_value *R = r >= 0 ? &g->vals[r] : NULL, *Y = &g->vals[y];
    bool ok = R && r != y && b->root[r] != y && R->kind != SJ_VAL_CONST && half_or_float(R->dtype) &&
              R->rank == Y->rank && c->p->layouts[r].store >= 0 && contiguous_at0(b, &c->p->layouts[r], R) &&
              !(computed(b, r) && b->vgroup[r] == c->ord[in]);
    for (int a = 0; a < Y->rank && ok; a++) ok = same_size(b, R->shape[a], Y->shape[a]);
    return ok;
}

/* A layer norm's gamma or beta (w < 0: absent) the kernel can read: an f16
 * or f32 vector of n, unit stride. */
static bool norm_weight_ok(const plan_ctx *c, int32_t w, sj_expr n) {
    if (w < 0) return true;
    const sj_value *W = &c->b->g->vals[w];
    const sj_layout *l = &c->p->layouts[w];
    int64_t one;
    return half_or_float(W->dtype) && W->rank == 1 && l->store >= 0 && same_size(c->b, W->shape[0], n) &&
           const_of(c->b, l->stride[0], &one) && one == 1;
}

/* The epilogue group of generated product k inside its kernel where it is
 * the chain fusion.h describes; an f16 product's other epilogue groups are
 * no epilogues (after find_epilogues). */
static void gemm_epilogues(plan_ctx *c) {
    sj_fuse_st *b = c->b;
    const sj_graph *g = b->g;
    sj_fplan *p = c->p;
    for (int k = 0; k + 1 < p->n_groups; k++) {
        if (c->gm[k].gemm_tile < 0 || c->epi_of[k + 1] != k) continue;
        const sj_fuse_grp *pg = &b->gr[c->ord[k]], *eg = &b->gr[c->ord[k + 1]];
        int32_t v = g->nodes[pg->nodes[pg->n_nodes - 1]].out, cur = v, res = -1;
        const sj_value *Y = &g->vals[v];
        uint32_t fl = 0;
        int stage = 0; /* 0: activation next; 1: residual; 2: cast; 3: done */
        bool ok = c->last[v] == k + 1 && c->first_out[v] < 0;
        for (int j = 0; j < eg->n_nodes && ok; j++) {
            const sj_node *n = &g->nodes[eg->nodes[j]];
            const int32_t *in = sj_node_ins(g, n);
            const sj_value *o = &g->vals[n->out];
            /* every node on the previous one's result; only the last stored */
            ok = n->n_in >= 1 && (in[0] == cur || (n->n_in == 2 && in[1] == cur)) && half_or_float(o->dtype) &&
                 (j == eg->n_nodes - 1 ? p->layouts[n->out].store >= 0 &&
                                             contiguous_at0(b, &p->layouts[n->out], o)
                                       : !c->need[n->out]);
            if (!ok) break;
            if ((n->op == SJ_OP_GELU || n->op == SJ_OP_RELU) && stage == 0 && n->n_in == 1) {
                fl |= n->op == SJ_OP_GELU ? SJ_GEMM_GELU : SJ_GEMM_RELU;
                if (o->dtype == SJ_F16) fl |= SJ_GEMM_R_ACT;
                stage = 1;
            } else if (n->op == SJ_OP_ADD && stage <= 1 && n->n_in == 2) {
                int32_t r = in[0] == cur ? in[1] : in[0];
                ok = r != cur && residual_ok(c, r, v, k + 1);
                fl |= SJ_GEMM_RES;
                if (o->dtype == SJ_F16) fl |= SJ_GEMM_R_RES;
                res = r;
                stage = 2;
            } else if (n->op == SJ_OP_CAST && stage <= 2 && n->n_in == 1) {
                stage = 3;
            } else {
                ok = false;
            }
            cur = n->out;
        }
        if (ok && cur != v) {
            c->gm[k].gemm_epi = fl | SJ_GEMM_EPI | SJ_GEMM_R_PROD; /* the product's result: f16 */
            c->gm[k].gemm_res = res;
            c->gm[k].gemm_out = cur;
        } else if (Y->dtype != SJ_F32) {
            c->epi_of[k + 1] = -1; /* the f32 rule alone: runs after, as before */
        }
    }
}

/* The LayerNorm after generated product k inside its kernel where fusion.h
 * allows (SJ_GEMM_LN; after gemm_epilogues: not with an epilogue inside). */
static void gemm_norms(plan_ctx *c) {
    sj_fuse_st *b = c->b;
    const sj_graph *g = b->g;
    sj_fplan *p = c->p;
    if (!b->gemm_ln) return;
    for (int k = 0; k + 1 < p->n_groups; k++) {
        if (c->gm[k].gemm_tile < 0 || c->gm[k].gemm_epi || c->epi_of[k + 1] >= 0) continue;
        const sj_fuse_grp *pg = &b->gr[c->ord[k]], *rg = &b->gr[c->ord[k + 1]];
        if (rg->kind != SJ_G_ROW || rg->n_nodes < 1 || rg->n_nodes > 2 || rg->row_node < 0) continue;
        const sj_node *ln = &g->nodes[rg->row_node];
        int32_t v = g->nodes[pg->nodes[pg->n_nodes - 1]].out, res = -1;
        const sj_value *Y = &g->vals[v];
        if (ln->op != SJ_OP_LAYER_NORM || ln->n_in < 1 || Y->dtype != SJ_F16 || c->last[v] != k + 1 ||
            c->first_out[v] >= 0)
            continue;
        const int32_t *lin = sj_node_ins(g, ln);
        bool ok;
        if (rg->n_nodes == 2) { /* [add, layer_norm] (the builder's order: not sorted yet) */
            const sj_node *add = &g->nodes[rg->nodes[rg->nodes[0] == rg->row_node]];
            const int32_t *ain = sj_node_ins(g, add);
            ok = add->op == SJ_OP_ADD && add->n_in == 2 && lin[0] == add->out && !c->need[add->out] &&
                 g->vals[add->out].dtype == SJ_F16 && (ain[0] == v) != (ain[1] == v);
            if (ok) res = ain[0] == v ? ain[1] : ain[0];
            ok = ok && residual_ok(c, res, v, k + 1);
        } else {
            ok = lin[0] == v;
        }
        const sj_value *O = &g->vals[ln->out];
        const sj_expr n = Y->shape[Y->rank - 1];
        int64_t N;
        ok = ok && fixed_of(b, n, &N) && N % 64 == 0 && N <= 4096 && half_or_float(O->dtype) &&
             O->rank == Y->rank && p->layouts[ln->out].store >= 0 &&
             contiguous_at0(b, &p->layouts[ln->out], O) && norm_weight_ok(c, ln->n_in > 1 ? lin[1] : -1, n) &&
             norm_weight_ok(c, ln->n_in > 2 ? lin[2] : -1, n);
        for (int a = 0; a < Y->rank && ok; a++) ok = same_size(b, O->shape[a], Y->shape[a]);
        if (!ok) continue;
        c->gm[k].gemm_epi = SJ_GEMM_LN | SJ_GEMM_R_PROD | (res >= 0 ? SJ_GEMM_RES | SJ_GEMM_R_RES : 0);
        c->gm[k].gemm_res = res;
        c->gm[k].gemm_ln = rg->row_node;
    }
}

/* -- Arena ------------------------------------------------------------------------ */

static void plan_arena(plan_ctx *c) {
    sj_fuse_st *b = c->b;
    sj_fplan *p = c->p;
    int n = p->n_stores, n_slots = 0;
    int *slot_of = sj_calloc((size_t)n + 1, sizeof *slot_of), *slot_end = sj_calloc((size_t)n + 1, sizeof *slot_end);
    sj_expr *slot_size = sj_calloc((size_t)n + 1, sizeof *slot_size);
    int *start = sj_calloc((size_t)n + 1, sizeof *start), *end = sj_calloc((size_t)n + 1, sizeof *end);
    if (!slot_of || !slot_end || !slot_size || !start || !end) {
        b->oom = true;
        goto out;
    }
    for (int32_t v = 0; v < b->g->n_vals; v++) {
        int s = p->layouts[v].store;
        if (s < 0 || b->root[v] != v || p->stores[s].kind != SJ_ST_ARENA) continue;
        start[s] = c->pos[b->vgroup[v]];
        if (c->epi_of[start[s]] >= 0) start[s] = c->epi_of[start[s]]; /* written inside the product */
        end[s] = c->last[v] > start[s] ? c->last[v] : start[s];
    }
    p->naive_bytes = sj_fuse_const(b, 0);
    /* stores are already in writing order */
    for (int s = 0; s < n; s++) {
        if (p->stores[s].kind != SJ_ST_ARENA) continue;
        int pick = -1;
        for (int k = 0; k < n_slots; k++) {
            if (slot_end[k] >= start[s]) continue;
            if (pick < 0 || slot_size[k] == p->stores[s].bytes) pick = k;
        }
        if (pick < 0) {
            pick = n_slots++;
            slot_size[pick] = p->stores[s].bytes;
        } else {
            slot_size[pick] = sj_fuse_chk(b, sj_ex_max(b->ex, slot_size[pick], p->stores[s].bytes));
        }
        slot_end[pick] = end[s];
        slot_of[s] = pick;
        p->naive_bytes = sj_fuse_add(b, p->naive_bytes, p->stores[s].bytes);
    }
    sj_expr off = sj_fuse_const(b, 0);
    sj_expr *slot_off = start; /* reuse: offsets per slot */
    for (int k = 0; k < n_slots; k++) {
        slot_off[k] = off;
        off = sj_fuse_add(b, off, slot_size[k]);
    }
    for (int s = 0; s < n; s++)
        if (p->stores[s].kind == SJ_ST_ARENA) p->stores[s].offset = slot_off[slot_of[s]];
    p->arena_bytes = off;
out:
    free(slot_of);
    free(slot_end);
    free(slot_size);
    free(start);
    free(end);
}

/* -- Accesses ----------------------------------------------------------------------- */

/* Is value u read in group gi from memory (not computed there, not a
 * constant)? */
static bool is_load(const sj_fuse_st *b, int gi, int32_t u) {
    if (u < 0 || b->g->vals[u].kind == SJ_VAL_CONST) return false;
    return !(computed(b, u) && b->vgroup[u] == gi);
}

/* Does node ni of the group address `what` (its operands: reading; its
 * result: writing) over the reduced shape (a reduction without keepdim:
 * its result and the epilogue)? */
static bool out_space(const sj_graph *g, const sj_fuse_grp *gr, int32_t ni, bool writing) {
    if (gr->kind != SJ_G_ROW || ni < gr->row_node || (ni == gr->row_node && !writing)) return false;
    const sj_node *rn = &g->nodes[gr->row_node];
    return sj_op_kind_of(rn->op) == SJ_K_REDUCE && !rn->a.keepdim;
}

static void make_access(plan_ctx *c, const sj_fuse_grp *gr, int32_t u, bool out, sj_access *acc) {
    sj_fuse_st *b = c->b;
    const sj_value *v = &b->g->vals[u];
    const sj_layout *l = &c->p->layouts[u];
    int rs = out ? gr->rank - 1 : gr->rank;
    acc->val = u;
    acc->store = l->store;
    acc->offset = l->offset;
    if (b->copy[u] && computed(b, u) && b->vgroup[u] == (int)(gr - b->gr)) {
        /* a copying view written by this group: in row-major order of the
         * operand's shape, the group's */
        acc->offset = sj_fuse_const(b, 0);
        sj_fuse_contig(b, gr->rank, gr->shape, acc->stride);
        return;
    }
    assert(v->rank <= rs);
    for (int a = 0; a < rs; a++) {
        int k = a - (rs - v->rank);
        bool bcast = k < 0 || (sj_fuse_is_one(b, v->shape[k]) && !sj_fuse_is_one(b, gr->shape[a]));
        acc->stride[a] = bcast ? sj_fuse_const(b, 0) : l->stride[k];
    }
    if (out) acc->stride[gr->rank - 1] = sj_fuse_const(b, 0);
}

/* Drop size-1 axes and merge neighbours every access allows (never the
 * row axis of a ROW group). */
static void collapse(sj_fuse_st *b, sj_group *G) {
    int n_acc = G->n_loads + G->n_stores, r = 0;
    sj_access *acc[SJ_FUSE_MAX_ACCESSES];
    assert(n_acc <= (int)(sizeof acc / sizeof acc[0]));
    for (int i = 0; i < G->n_loads; i++) acc[i] = &G->loads[i];
    for (int i = 0; i < G->n_stores; i++) acc[G->n_loads + i] = &G->stores[i];
    for (int a = 0; a < G->rank; a++) {
        bool keep = !sj_fuse_is_one(b, G->shape[a]) || (G->kind == SJ_G_ROW && a == G->rank - 1);
        if (!keep) continue;
        G->shape[r] = G->shape[a];
        for (int i = 0; i < n_acc; i++) acc[i]->stride[r] = acc[i]->stride[a];
        r++;
    }
    if (r == 0) {
        G->shape[0] = sj_fuse_const(b, 1);
        for (int i = 0; i < n_acc; i++) acc[i]->stride[0] = sj_fuse_const(b, 0);
        r = 1;
    }
    for (int a = r - 2; a >= 0; a--) {
        if (G->kind == SJ_G_ROW && a + 1 == r - 1) continue;
        bool ok = true;
        for (int i = 0; i < n_acc && ok; i++)
            ok = acc[i]->stride[a] == sj_fuse_mul(b, acc[i]->stride[a + 1], G->shape[a + 1]);
        if (!ok) continue;
        G->shape[a] = sj_fuse_mul(b, G->shape[a], G->shape[a + 1]);
        for (int i = 0; i < n_acc; i++) acc[i]->stride[a] = acc[i]->stride[a + 1];
        for (int k = a + 1; k + 1 < r; k++) {
            G->shape[k] = G->shape[k + 1];
            for (int i = 0; i < n_acc; i++) acc[i]->stride[k] = acc[i]->stride[k + 1];
        }
        r--;
    }
    G->rank = r;
    G->rows = sj_fuse_const(b, 1);
    for (int a = 0; a < r - 1; a++) G->rows = sj_fuse_mul(b, G->rows, G->shape[a]);
    G->numel = sj_fuse_mul(b, G->rows, G->shape[r - 1]);
}

static int make_accesses(plan_ctx *c, int k) {
    sj_fuse_st *b = c->b;
    const sj_graph *g = b->g;
    int gi = c->ord[k];
    const sj_fuse_grp *gr = &b->gr[gi];
    sj_group *G = &c->p->groups[k];
    int cap = 1;
    for (int j = 0; j < gr->n_nodes; j++) cap += g->nodes[gr->nodes[j]].n_in + 1;
    G->loads = sj_calloc((size_t)cap, sizeof *G->loads);
    G->stores = sj_calloc((size_t)cap, sizeof *G->stores);
    if (!G->loads || !G->stores) return -1;
    for (int j = 0; j < gr->n_nodes; j++) {
        const sj_node *n = &g->nodes[gr->nodes[j]];
        const int32_t *in = sj_node_ins(g, n);
        for (int a = 0; a < n->n_in; a++) {
            if (!is_load(b, gi, in[a])) continue;
            bool dup = false;
            for (int i = 0; i < G->n_loads && !dup; i++) dup = G->loads[i].val == in[a];
            if (!dup) make_access(c, gr, in[a], out_space(g, gr, gr->nodes[j], false), &G->loads[G->n_loads++]);
        }
    }
    for (int j = 0; j < gr->n_nodes; j++) {
        int32_t v = g->nodes[gr->nodes[j]].out;
        if (c->need[v]) make_access(c, gr, v, out_space(g, gr, gr->nodes[j], true), &G->stores[G->n_stores++]);
    }
    assert(G->n_loads + G->n_stores <= SJ_FUSE_MAX_ACCESSES);
    collapse(b, G);
    return 0;
}

/* -- Plan -------------------------------------------------------------------------- */

void sj_fplan_free(sj_fplan *p) {
    if (!p) return;
    for (int i = 0; p->groups && i < p->n_groups; i++) { /* groups NULL: its allocation failed */
        free(p->groups[i].nodes);
        free(p->groups[i].loads);
        free(p->groups[i].stores);
    }
    free(p->groups);
    free(p->stores);
    free(p->layouts);
    free(p->output_copy);
    free(p);
}

static int fill_groups(plan_ctx *c) {
    sj_fuse_st *b = c->b;
    const sj_graph *g = b->g;
    sj_fplan *p = c->p;
    for (int k = 0; k < p->n_groups; k++) {
        sj_fuse_grp *gr = &b->gr[c->ord[k]];
        sj_group *G = &p->groups[k];
        G->kind = gr->kind;
        snprintf(G->name, sizeof G->name, "k%d", k);
        G->nodes = gr->nodes; /* taken over */
        G->n_nodes = gr->n_nodes;
        gr->nodes = NULL;
        gr->n_nodes = 0;
        G->row_node = gr->row_node;
        G->rank = gr->rank;
        memcpy(G->shape, gr->shape, sizeof G->shape);
        G->numel = G->rows = SJ_EX_NONE;
        G->bias = -1;
        G->epilogue = -1;
        G->epilogue_of = c->epi_of[k];
        if (k + 1 < p->n_groups && c->epi_of[k + 1] == k) G->epilogue = k + 1;
        G->gemm_tile = c->gm[k].gemm_tile;
        G->gemm_nv = c->gm[k].gemm_nv;
        memcpy(G->gemm_tiles, c->gm[k].gemm_tiles, sizeof G->gemm_tiles);
        G->gemm_epi = c->gm[k].gemm_epi;
        G->gemm_res = c->gm[k].gemm_res;
        G->gemm_out = c->gm[k].gemm_out;
        G->gemm_ln = c->gm[k].gemm_ln;
        p->n_gemm += G->gemm_tile >= 0;
        p->n_gemm_ln += (G->gemm_epi & SJ_GEMM_LN) != 0;
        if (G->kind == SJ_G_NODE) {
            const sj_node *n = &g->nodes[G->nodes[0]]; /* nodes sorted: a product before its bias add */
            if (n->fold >= 0) G->bias = sj_fold_bias(g, n);
            continue;
        }
        p->n_generated++;
        gr->nodes = G->nodes; /* make_accesses reads the builder group */
        gr->n_nodes = G->n_nodes;
        int st = make_accesses(c, k);
        gr->nodes = NULL;
        gr->n_nodes = 0;
        if (st) return -1;
    }
    return 0;
}

sj_fplan *sj_fuse_finish(sj_fuse_st *b) {
    const sj_graph *g = b->g;
    size_t nv = (size_t)g->n_vals + 1;
    plan_ctx c = {.b = b};
    sj_fplan *p = sj_calloc(1, sizeof *p);
    c.p = p;
    c.ord = sj_malloc(((size_t)b->n_gr + 1) * sizeof *c.ord);
    c.pos = sj_malloc(((size_t)b->n_gr + 1) * sizeof *c.pos);
    c.need = sj_calloc(nv, sizeof *c.need);
    c.last = sj_malloc((nv + (size_t)g->n_inputs) * sizeof *c.last);
    c.first_out = sj_malloc(nv * sizeof *c.first_out);
    c.epi_of = sj_malloc(((size_t)b->n_gr + 1) * sizeof *c.epi_of);
    c.gm = sj_calloc((size_t)b->n_gr + 1, sizeof *c.gm);
    if (!p || !c.ord || !c.pos || !c.need || !c.last || !c.first_out || !c.epi_of || !c.gm) goto fail;
    for (size_t v = 0; v < nv; v++) c.last[v] = c.first_out[v] = -1;
    p->n_groups = order_groups(b, c.ord, c.pos);
    p->groups = sj_calloc((size_t)p->n_groups + 1, sizeof *p->groups);
    p->layouts = sj_calloc(nv, sizeof *p->layouts);
    p->output_copy = sj_calloc((size_t)g->n_outputs + 1, sizeof *p->output_copy);
    p->stores = sj_calloc((size_t)(g->n_inputs + g->n_params + g->n_vals) + 1, sizeof *p->stores);
    if (!p->groups || !p->layouts || !p->output_copy || !p->stores) goto fail;
    mark_reads(&c);
    make_stores(&c);
    find_gemms(&c);
    find_epilogues(&c);
    gemm_epilogues(&c);
    gemm_norms(&c);
    plan_arena(&c);
    if (b->oom || fill_groups(&c) || b->oom) goto fail;
    free(c.ord), free(c.pos), free(c.need), free(c.last), free(c.first_out), free(c.epi_of), free(c.gm);
    return p;
fail:
    free(c.ord), free(c.pos), free(c.need), free(c.last), free(c.first_out), free(c.epi_of), free(c.gm);
    sj_fplan_free(p);
    return NULL;
}

/* -- Printing ------------------------------------------------------------------------ */

static const char *const kind_names[] = {"pointwise", "row", "node"};

/* A value's name: where its memory is ("in0", "w1", "out0", "t3" for arena
 * store 3, "v7" for a value that lives only in its group); a folded view
 * gets a quote ("in0'"). */
static void val_name(const sj_graph *g, const sj_fplan *p, int32_t v, char *buf, size_t n) {
    const sj_layout *l = &p->layouts[v];
    const sj_store *s = l->store >= 0 ? &p->stores[l->store] : NULL;
    const sj_value *val = &g->vals[v];
    bool view = false;
    if (val->kind == SJ_VAL_NODE && sj_op_kind_of(g->nodes[val->index].op) == SJ_K_VIEW) {
        int32_t x = sj_node_ins(g, &g->nodes[val->index])[0];
        view = p->layouts[x].store == l->store;
    }
    const char *q = view ? "'" : "";
    if (!s) snprintf(buf, n, "v%d", (int)v);
    else if (s->kind == SJ_ST_INPUT) snprintf(buf, n, "in%d%s", (int)s->index, q);
    else if (s->kind == SJ_ST_PARAM) snprintf(buf, n, "w%d%s", (int)s->index, q);
    else if (s->kind == SJ_ST_OUTPUT) snprintf(buf, n, "out%d%s", (int)s->index, q);
    else snprintf(buf, n, "t%d%s", l->store, q);
}

static int64_t val_at(const sj_graph *g, sj_expr e, const int64_t *sym_vals) {
    return sym_vals ? sj_ex_eval(g->ex, e, sym_vals) : sj_ex_hint(g->ex, e);
}

void sj_fplan_print(const sj_graph *g, const sj_fplan *p, const int64_t *sym_vals, FILE *out, const char *indent) {
    char buf[128];
    if (!indent) indent = "";
    for (int k = 0; k < p->n_groups; k++) {
        const sj_group *G = &p->groups[k];
        fprintf(out, "%s%s %s [", indent, G->name, kind_names[G->kind]);
        for (int a = 0; a < G->rank; a++) {
            sj_ex_print(g->ex, G->shape[a], buf, sizeof buf);
            fprintf(out, "%s%s", a ? ", " : "", buf);
        }
        fprintf(out, "]:");
        for (int j = 0; j < G->n_nodes; j++) fprintf(out, " %s", sj_op_name(g->nodes[G->nodes[j]].op));
        if (G->epilogue >= 0) fprintf(out, "; epilogue %s", p->groups[G->epilogue].name);
        if (G->gemm_tile >= 0) {
            int nt;
            const sj_gemm_tile *t = &sj_gemm_cuda_tiles(&nt)[G->gemm_tile];
            fprintf(out, "; generated product, tile %dx%dx%d", t->bm, t->bn, t->bk);
            if (t->wg) fprintf(out, " wgmma");
            if (t->splitk > 1) fprintf(out, " split-K %d", t->splitk);
            fprintf(out, "%s%s (%d variant%s)", G->gemm_epi & SJ_GEMM_EPI ? ", epilogue inside" : "",
                    G->gemm_epi & SJ_GEMM_LN ? ", layer_norm inside" : "", G->gemm_nv,
                    G->gemm_nv > 1 ? "s" : "");
        }
        if (G->kind != SJ_G_NODE) {
            fprintf(out, "; loads");
            for (int i = 0; i < G->n_loads; i++) {
                val_name(g, p, G->loads[i].val, buf, sizeof buf);
                fprintf(out, " %s", buf);
            }
            fprintf(out, "; stores");
            for (int i = 0; i < G->n_stores; i++) {
                val_name(g, p, G->stores[i].val, buf, sizeof buf);
                fprintf(out, " %s", buf);
            }
        }
        fprintf(out, "\n");
    }
    int n_arena = 0;
    for (int s = 0; s < p->n_stores; s++) n_arena += p->stores[s].kind == SJ_ST_ARENA;
    fprintf(out, "%smemory: arena %" PRId64 " bytes (naive %" PRId64 ") for %d buffers%s\n", indent,
            val_at(g, p->arena_bytes, sym_vals), val_at(g, p->naive_bytes, sym_vals), n_arena,
            sym_vals ? "" : " at the hints");
}
