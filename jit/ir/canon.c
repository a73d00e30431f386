/* The canonical order of a traced graph (sj_graph_canonicalize): nodes,
 * values, parameters and constants numbered by the graph's structure
 * alone, never by the order in which the model function made its ops.
 *
 * Why: C leaves the order of a call's arguments unspecified, so
 * `sj_mul(t, sj_gelu(t, x), sj_sigmoid(t, y))` traces the gelu or the
 * sigmoid first depending on the compiler that built the model function.
 * Generated kernels name values by id and kernel cache keys hash the
 * source, so binaries built by different compilers would miss each other's
 * kernels (disk cache, remote cache, bundles).
 *
 * The order: a depth-first walk from the outputs, in the user's order,
 * that visits a node's operands in argument order and places the node
 * after them (post-order). Which node comes first depends only on the
 * outputs and each node's operands, so any trace of the same graph gives
 * the same order: the order of a model written one op per statement, left
 * to right. Independent nodes are ordered by where their results are first
 * needed; two nodes of identical structure are placed where each is first
 * reached, so either trace order gives the same text.
 *
 * Nodes no output depends on (dead code; kept: the executors run them as
 * traced) come after, walked from their roots (dead nodes no dead node
 * reads) sorted by a structural hash computed bottom up (op, attributes,
 * dtype, shape, operands' hashes; an input by its position, a parameter
 * by its dtype and shape, a constant by its dtype and bits): roots with
 * equal hashes are the same computation over interchangeable leaves, so
 * their order changes no generated text.
 *
 * Parameters and constants are numbered by first use: nodes in the new
 * order, operands in order, then outputs that are parameters or constants
 * themselves. Values are laid out as inputs (by position, unchanged), then
 * parameters, then constants, then node results in node order. Parameters
 * and constants nothing uses (a weak scalar adopted into another dtype
 * leaves its first copy unused) are dropped.
 *
 * Cost: O(n log n) once per trace (the sort of dead roots; linear when
 * every node reaches an output), never per call.
 */
#include "base/alloc.h"
#include "base/error.h"
#include "jit/ir/graph.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

/* -- Structural hash (dead roots only) ------------------------------------- */

static uint64_t mix(uint64_t h, uint64_t x) {
    h ^= x + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    h *= 0xff51afd7ed558ccdull;
    return h ^ (h >> 32);
}

static uint64_t mix_bytes(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = mix(h, b[i]);
    return h;
}

/* An expression by its text, not its id (ids follow creation order). */
static uint64_t expr_hash(const sj_exprs *ex, sj_expr e) {
    int64_t c;
    if (e == SJ_EX_NONE) return 0x51ull;
    if (sj_ex_is_const(ex, e, &c)) return mix(0xc0ull, (uint64_t)c);
    char buf[256];
    int n = sj_ex_print(ex, e, buf, sizeof buf);
    if (n < 0) n = 0;
    return mix_bytes(0xe0ull, buf, (size_t)n < sizeof buf ? (size_t)n : sizeof buf - 1);
}

static uint64_t value_hash(const sj_graph *g, const uint64_t *vh, int32_t v) {
    const sj_value *x = &g->vals[v];
    uint64_t h = mix(mix(mix(0x5eedull, x->kind), (uint64_t)x->dtype), (uint64_t)x->rank);
    for (int i = 0; i < x->rank; i++) h = mix(h, expr_hash(g->ex, x->shape[i]));
    switch (x->kind) {
    case SJ_VAL_INPUT:
        return mix(h, (uint64_t)x->index);
    case SJ_VAL_PARAM:
        return h; /* content-free: what tells parameters apart is their uses */
    case SJ_VAL_CONST:
        return mix(mix(h, x->weak), (uint64_t)g->consts[x->index].bits);
    default: {
        const sj_node *n = &g->nodes[x->index];
        const sj_attrs *a = &n->a;
        h = mix(mix(h, (uint64_t)n->op), (uint64_t)n->n_in);
        h = mix(mix(mix(mix(h, (uint64_t)a->axis), (uint64_t)a->keepdim), (uint64_t)a->causal), (uint64_t)a->dtype);
        h = mix_bytes(h, &a->f, sizeof a->f);
        h = mix_bytes(h, a->perm, sizeof a->perm);
        if (n->op == SJ_OP_SLICE) h = mix(mix(h, expr_hash(g->ex, a->start)), (uint64_t)a->step);
        for (int k = 0; k < n->n_in; k++) {
            int32_t u = sj_node_ins(g, n)[k];
            h = mix(h, u >= 0 ? vh[u] : 0x7full);
        }
        return h;
    }
    }
}

typedef struct root {
    uint64_t h;
    int32_t node;
} root;

static int root_cmp(const void *a, const void *b) {
    const root *x = a, *y = b;
    if (x->h != y->h) return x->h < y->h ? -1 : 1;
    return (x->node > y->node) - (x->node < y->node); /* equal structure: interchangeable */
}

/* -- Walk ------------------------------------------------------------------ */

typedef struct walk {
    const sj_graph *g;
    int32_t *order;  /* new position -> old node */
    int n_order;
    bool *placed;    /* per old node */
    int32_t *stack;  /* old nodes being walked */
    int32_t *next;   /* per old node: the next operand to walk */
} walk;

/* Place the node that makes value v, after the nodes of its operands. */
static void walk_from(walk *w, int32_t v) {
    const sj_graph *g = w->g;
    if (v < 0 || g->vals[v].kind != SJ_VAL_NODE || w->placed[g->vals[v].index]) return;
    int top = 0;
    w->stack[top++] = g->vals[v].index;
    w->placed[g->vals[v].index] = true; /* on the stack: a DAG never meets it again before it is done */
    while (top > 0) {
        int32_t ni = w->stack[top - 1];
        const sj_node *n = &g->nodes[ni];
        int32_t child = -1;
        while (w->next[ni] < n->n_in) {
            int32_t u = sj_node_ins(g, n)[w->next[ni]++];
            if (u >= 0 && g->vals[u].kind == SJ_VAL_NODE && !w->placed[g->vals[u].index]) {
                child = g->vals[u].index;
                break;
            }
        }
        if (child >= 0) {
            w->placed[child] = true;
            w->stack[top++] = child;
        } else {
            w->order[w->n_order++] = ni;
            top--;
        }
    }
}

/* Dead nodes, from their roots in structural-hash order. */
static sj_status walk_dead(walk *w) {
    const sj_graph *g = w->g;
    uint64_t *vh = sj_malloc(sizeof *vh * ((size_t)g->n_vals + 1));
    bool *read = sj_calloc((size_t)g->n_nodes + 1, sizeof *read);
    root *roots = sj_malloc(sizeof *roots * ((size_t)g->n_nodes + 1));
    if (!vh || !read || !roots) {
        free(vh);
        free(read);
        free(roots);
        return SJ_ENOMEM;
    }
    for (int32_t v = 0; v < g->n_vals; v++) vh[v] = value_hash(g, vh, v); /* operands come first */
    for (int i = 0; i < g->n_nodes; i++) {
        if (w->placed[i]) continue;
        const sj_node *n = &g->nodes[i];
        for (int k = 0; k < n->n_in; k++) {
            int32_t u = sj_node_ins(g, n)[k];
            if (u >= 0 && g->vals[u].kind == SJ_VAL_NODE) read[g->vals[u].index] = true;
        }
    }
    int nr = 0;
    for (int i = 0; i < g->n_nodes; i++)
        if (!w->placed[i] && !read[i]) roots[nr++] = (root){vh[g->nodes[i].out], i};
    qsort(roots, (size_t)nr, sizeof *roots, root_cmp);
    for (int r = 0; r < nr; r++) walk_from(w, g->nodes[roots[r].node].out);
    free(vh);
    free(read);
    free(roots);
    return SJ_OK;
}

/* -- Renumbering ----------------------------------------------------------- */

/* Number leaf value v (a parameter or a constant) at its first use. */
static void number_leaf(const sj_graph *g, int32_t v, int32_t *pnum, int32_t *cnum, int *np, int *nc) {
    if (v < 0) return;
    const sj_value *x = &g->vals[v];
    if (x->kind == SJ_VAL_PARAM && pnum[x->index] < 0) pnum[x->index] = (*np)++;
    else if (x->kind == SJ_VAL_CONST && cnum[x->index] < 0) cnum[x->index] = (*nc)++;
}

sj_status sj_graph_canonicalize(sj_graph *g) {
    assert(!g->packed && !g->dev_params && !g->dev_consts); /* a trace's graph, before its entry */
    int nn = g->n_nodes, nv = g->n_vals;
    walk w = {.g = g};
    w.order = sj_malloc(sizeof *w.order * ((size_t)nn + 1));
    w.placed = sj_calloc((size_t)nn + 1, sizeof *w.placed);
    w.stack = sj_malloc(sizeof *w.stack * ((size_t)nn + 1));
    w.next = sj_calloc((size_t)nn + 1, sizeof *w.next);
    int32_t *pnum = sj_malloc(sizeof *pnum * ((size_t)g->n_params + 1));
    int32_t *cnum = sj_malloc(sizeof *cnum * ((size_t)g->n_consts + 1));
    int32_t *vmap = sj_malloc(sizeof *vmap * ((size_t)nv + 1));
    sj_value *vals = sj_malloc(sizeof *vals * ((size_t)nv + 1));
    sj_node *nodes = sj_malloc(sizeof *nodes * ((size_t)nn + 1));
    int32_t *args = sj_malloc(sizeof *args * ((size_t)g->n_args + 1));
    sj_tensor *params = sj_malloc(sizeof *params * ((size_t)g->n_params + 1));
    sj_const *consts = sj_malloc(sizeof *consts * ((size_t)g->n_consts + 1));
    sj_status st = SJ_OK;
    if (!w.order || !w.placed || !w.stack || !w.next || !pnum || !cnum || !vmap || !vals || !nodes || !args ||
        !params || !consts) {
        st = SJ_ENOMEM;
        goto done;
    }

    /* the order of nodes: from the outputs, then the dead */
    for (int i = 0; i < g->n_outputs; i++) walk_from(&w, g->outputs[i]);
    if (w.n_order < nn && (st = walk_dead(&w))) goto done;
    if (w.n_order != nn) {
        st = SJ_EINTERNAL; /* the operands of a node were not all before it */
        goto done;
    }

    /* parameters and constants by first use */
    int np = 0, nc = 0;
    for (int i = 0; i < g->n_params; i++) pnum[i] = -1;
    for (int i = 0; i < g->n_consts; i++) cnum[i] = -1;
    for (int k = 0; k < nn; k++) {
        const sj_node *n = &g->nodes[w.order[k]];
        for (int j = 0; j < n->n_in; j++) number_leaf(g, sj_node_ins(g, n)[j], pnum, cnum, &np, &nc);
    }
    for (int i = 0; i < g->n_outputs; i++) number_leaf(g, g->outputs[i], pnum, cnum, &np, &nc);

    /* values: inputs, parameters, constants, node results */
    for (int32_t v = 0; v < nv; v++) vmap[v] = -1;
    int n_vals = 0;
    for (int32_t v = 0; v < nv; v++)
        if (g->vals[v].kind == SJ_VAL_INPUT) {
            vmap[v] = n_vals;
            vals[n_vals++] = g->vals[v];
        }
    int base_p = n_vals, base_c = n_vals + np;
    for (int32_t v = 0; v < nv; v++) {
        sj_value x = g->vals[v];
        int32_t k = x.kind == SJ_VAL_PARAM ? pnum[x.index] : x.kind == SJ_VAL_CONST ? cnum[x.index] : -1;
        if (k < 0) continue;
        if (x.kind == SJ_VAL_PARAM) {
            params[k] = g->params[x.index];
        } else {
            consts[k] = g->consts[x.index];
        }
        vmap[v] = (x.kind == SJ_VAL_PARAM ? base_p : base_c) + k;
        x.index = k;
        vals[vmap[v]] = x;
    }
    n_vals = base_c + nc;
    for (int k = 0; k < nn; k++) {
        const sj_node *n = &g->nodes[w.order[k]];
        vmap[n->out] = n_vals;
        vals[n_vals] = g->vals[n->out];
        vals[n_vals++].index = k;
    }

    /* nodes and their operands */
    int n_args = 0;
    for (int k = 0; k < nn; k++) {
        const sj_node *n = &g->nodes[w.order[k]];
        nodes[k] = *n;
        nodes[k].out = vmap[n->out];
        nodes[k].in_off = n_args;
        nodes[k].fold = -1; /* marked afterwards (sj_graph_mark_bias_adds) */
        for (int j = 0; j < n->n_in; j++) {
            int32_t u = sj_node_ins(g, n)[j];
            args[n_args++] = u >= 0 ? vmap[u] : u;
        }
    }
    for (int i = 0; i < g->n_outputs; i++) g->outputs[i] = vmap[g->outputs[i]];

    /* swap in */
    free(g->vals);
    free(g->nodes);
    free(g->args);
    free(g->params);
    free(g->consts);
    g->vals = vals;
    g->n_vals = g->cap_vals = n_vals;
    g->nodes = nodes;
    g->n_nodes = g->cap_nodes = nn;
    g->args = args;
    g->n_args = g->cap_args = n_args;
    g->params = params;
    g->n_params = g->cap_params = np;
    g->consts = consts;
    g->n_consts = g->cap_consts = nc;
    vals = NULL;
    nodes = NULL;
    args = NULL;
    params = NULL;
    consts = NULL;

done:
    free(w.order);
    free(w.placed);
    free(w.stack);
    free(w.next);
    free(pnum);
    free(cnum);
    free(vmap);
    free(vals);
    free(nodes);
    free(args);
    free(params);
    free(consts);
    if (st == SJ_ENOMEM) return sj_seterr(st, "out of memory putting the graph in canonical order");
    if (st) return sj_seterr(st, "canonical order: %d of %d nodes placed", w.n_order, nn);
    return SJ_OK;
}
