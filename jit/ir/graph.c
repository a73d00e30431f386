/* The graph IR: building, checking, printing. */
#include "base/alloc.h"
#include "jit/ir/graph.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/half.h"

/* -- Op tables ------------------------------------------------------------- */

static const char *const op_names[] = {
#define SJ_X(e, name, kind) name,
    SJ_OP_LIST(SJ_X)
#undef SJ_X
};
static const sj_op_kind op_kinds[] = {
#define SJ_X(e, name, kind) kind,
    SJ_OP_LIST(SJ_X)
#undef SJ_X
};
_Static_assert(sizeof op_names / sizeof op_names[0] == SJ_OP_COUNT, "op name table");
_Static_assert(sizeof op_kinds / sizeof op_kinds[0] == SJ_OP_COUNT, "op kind table");

const char *sj_op_name(sj_op op) { return (unsigned)op < SJ_OP_COUNT ? op_names[op] : "?"; }
sj_op_kind sj_op_kind_of(sj_op op) { return op_kinds[op]; }

/* -- Building -------------------------------------------------------------- */

#define GROW(arr, n, cap, init)                                                                    \
    ((n) < (cap) ? 0 : grow((void **)&(arr), &(cap), sizeof *(arr), (init)))

static int grow(void **arr, int *cap, size_t elem, int init) {
    int ncap = *cap ? *cap * 2 : init;
    void *p = sj_realloc(*arr, (size_t)ncap * elem);
    if (!p) return -1;
    *arr = p;
    *cap = ncap;
    return 0;
}

sj_graph *sj_graph_create(int n_inputs) {
    sj_graph *g = sj_calloc(1, sizeof *g);
    if (!g) return NULL;
    g->ex = sj_exprs_create();
    if (!g->ex) {
        free(g);
        return NULL;
    }
    g->n_inputs = n_inputs;
    return g;
}

void sj_graph_destroy(sj_graph *g) {
    if (!g) return;
    if (g->dev_release) g->dev_release(g->dev_ctx, g);
    sj_exprs_destroy(g->ex);
    free(g->vals);
    free(g->nodes);
    free(g->args);
    free(g->outputs);
    free(g->params);
    free(g->consts);
    free(g->packed);
    free(g);
}

int32_t sj_graph_add_value(sj_graph *g, const sj_value *v) {
    if (GROW(g->vals, g->n_vals, g->cap_vals, 32)) return -1;
    g->vals[g->n_vals] = *v;
    return g->n_vals++;
}

int32_t sj_graph_add_node(sj_graph *g, sj_op op, const int32_t *ins, int n_in, const sj_attrs *a,
                          const sj_value *out) {
    if (GROW(g->nodes, g->n_nodes, g->cap_nodes, 32)) return -1;
    while (g->n_args + n_in > g->cap_args)
        if (grow((void **)&g->args, &g->cap_args, sizeof *g->args, 64)) return -1;
    sj_value v = *out;
    v.kind = SJ_VAL_NODE;
    v.index = g->n_nodes;
    int32_t vid = sj_graph_add_value(g, &v);
    if (vid < 0) return -1;
    sj_node *n = &g->nodes[g->n_nodes++];
    memset(n, 0, sizeof *n);
    n->op = op;
    n->out = vid;
    n->fold = -1;
    n->in_off = g->n_args;
    n->n_in = n_in;
    if (a) n->a = *a;
    if (n_in) memcpy(g->args + g->n_args, ins, sizeof(int32_t) * (size_t)n_in); /* arange has none */
    g->n_args += n_in;
    return vid;
}

/* Is w a bias for the product u (see sj_graph_mark_bias_adds)? */
static bool bias_for(const sj_graph *g, int32_t w, int32_t u) {
    const sj_value *wv = &g->vals[w], *uv = &g->vals[u];
    int64_t one;
    if (wv->kind != SJ_VAL_INPUT && wv->kind != SJ_VAL_PARAM) return false;
    if (wv->dtype != uv->dtype || wv->rank < 1 || wv->rank > uv->rank) return false;
    if (wv->shape[wv->rank - 1] != uv->shape[uv->rank - 1]) return false;
    for (int i = 0; i < wv->rank - 1; i++)
        if (!sj_ex_is_const(g->ex, wv->shape[i], &one) || one != 1) return false;
    return true;
}

void sj_graph_mark_bias_adds(sj_graph *g) {
    /* readers of each product: node operands (views included) and outputs */
    int32_t *readers = sj_calloc((size_t)g->n_vals + 1, sizeof *readers);
    if (!readers) return; /* nothing marked: every add runs on its own */
    for (int i = 0; i < g->n_nodes; i++) {
        const sj_node *n = &g->nodes[i];
        for (int k = 0; k < n->n_in; k++)
            if (sj_node_ins(g, n)[k] >= 0) readers[sj_node_ins(g, n)[k]]++;
    }
    for (int i = 0; i < g->n_outputs; i++) readers[g->outputs[i]]++;
    for (int j = 0; j < g->n_nodes; j++) {
        sj_node *add = &g->nodes[j];
        if (add->op != SJ_OP_ADD || add->n_in != 2) continue;
        const sj_value *o = &g->vals[add->out];
        for (int k = 0; k < 2; k++) {
            int32_t u = sj_node_ins(g, add)[k], w = sj_node_ins(g, add)[1 - k];
            const sj_value *uv = &g->vals[u];
            if (u == w || uv->kind != SJ_VAL_NODE || g->nodes[uv->index].op != SJ_OP_MATMUL) continue;
            sj_node *mm = &g->nodes[uv->index];
            bool same = o->rank == uv->rank && o->dtype == uv->dtype;
            for (int i = 0; same && i < o->rank; i++) same = o->shape[i] == uv->shape[i];
            if (!same || !sj_dtype_is_float(uv->dtype) || readers[u] != 1 || mm->fold != -1 || !bias_for(g, w, u))
                continue;
            mm->fold = j;
            add->fold = SJ_FOLDED;
            break;
        }
    }
    free(readers);
}

void sj_const_store(int64_t *slot, double v, sj_dtype dt) {
    *slot = 0;
    switch (dt) {
    case SJ_F32: {
        float f = (float)v;
        memcpy(slot, &f, sizeof f);
        break;
    }
    case SJ_F16: {
        uint16_t h = sj_f32_to_f16((float)v);
        memcpy(slot, &h, sizeof h);
        break;
    }
    case SJ_BF16: {
        uint16_t h = sj_f32_to_bf16((float)v);
        memcpy(slot, &h, sizeof h);
        break;
    }
    case SJ_I32: {
        int32_t i = isnan(v) ? 0 : v >= 2147483647.0 ? INT32_MAX : v <= -2147483648.0 ? INT32_MIN : (int32_t)v;
        memcpy(slot, &i, sizeof i);
        break;
    }
    case SJ_I64: {
        int64_t i = isnan(v) ? 0 : v >= 9.2233720368547758e18 ? INT64_MAX : v <= -9.2233720368547758e18 ? INT64_MIN : (int64_t)v;
        memcpy(slot, &i, sizeof i);
        break;
    }
    case SJ_BOOL: {
        uint8_t b = v != 0.0;
        memcpy(slot, &b, sizeof b);
        break;
    }
    default:
        break;
    }
}

int32_t sj_graph_add_const(sj_graph *g, double v, sj_dtype dt, bool weak) {
    if (GROW(g->consts, g->n_consts, g->cap_consts, 8)) return -1;
    int k = g->n_consts++;
    sj_const_store(&g->consts[k].bits, v, dt);
    g->consts[k].value = v;
    sj_value val = {.dtype = dt, .kind = SJ_VAL_CONST, .weak = weak, .rank = 0, .index = k};
    return sj_graph_add_value(g, &val);
}

int32_t sj_graph_add_param(sj_graph *g, const sj_tensor *w, const sj_value *v) {
    if (GROW(g->params, g->n_params, g->cap_params, 8)) return -1;
    g->params[g->n_params] = *w;
    sj_value val = *v;
    val.kind = SJ_VAL_PARAM;
    val.index = g->n_params++;
    return sj_graph_add_value(g, &val);
}

int sj_graph_add_output(sj_graph *g, int32_t val) {
    if (GROW(g->outputs, g->n_outputs, g->cap_outputs, 4)) return -1;
    g->outputs[g->n_outputs++] = val;
    return 0;
}

void *sj_graph_const_data(const sj_graph *g, int k, sj_device device) {
    if (device != SJ_HOST && g->dev_consts) return (char *)g->dev_consts + (size_t)k * sizeof(int64_t);
    return (void *)&g->consts[k].bits;
}

sj_tensor sj_graph_param(const sj_graph *g, int k, sj_device device) {
    if (device != SJ_HOST && g->dev_params) return g->dev_params[k];
    return g->params[k];
}

/* -- Checking -------------------------------------------------------------- */

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            sj_seterr(SJ_EINTERNAL, "IR check: " __VA_ARGS__);                                     \
            return SJ_EINTERNAL;                                                                   \
        }                                                                                          \
    } while (0)

static sj_status check_node(const sj_graph *g, int ni) {
    const sj_node *n = &g->nodes[ni];
    const int32_t *in = sj_node_ins(g, n);
    const char *name = sj_op_name(n->op);
    CHECK((unsigned)n->op < SJ_OP_COUNT, "node %d: bad op %d", ni, (int)n->op);
    CHECK(n->out >= 0 && n->out < g->n_vals, "node %d (%s): output id %d", ni, name, n->out);
    const sj_value *o = &g->vals[n->out];
    CHECK(o->kind == SJ_VAL_NODE && o->index == ni, "node %d (%s): output value not linked back", ni, name);
    for (int i = 0; i < n->n_in; i++) {
        CHECK(in[i] >= -1 && in[i] < n->out, "node %d (%s): operand %d = %d not defined before use", ni,
              name, i, in[i]);
    }
    const sj_value *x = n->n_in > 0 && in[0] >= 0 ? &g->vals[in[0]] : NULL;
    switch (sj_op_kind_of(n->op)) {
    case SJ_K_UNARY:
        CHECK(n->n_in == 1 && x && x->dtype == o->dtype && x->rank == o->rank, "node %d (%s): unary form", ni, name);
        break;
    case SJ_K_BINARY:
    case SJ_K_COMPARE:
        CHECK(n->n_in == 2 && in[1] >= 0, "node %d (%s): two operands", ni, name);
        CHECK(g->vals[in[0]].dtype == g->vals[in[1]].dtype, "node %d (%s): operand dtypes differ", ni, name);
        CHECK(sj_op_kind_of(n->op) == SJ_K_COMPARE ? o->dtype == SJ_BOOL : o->dtype == x->dtype,
              "node %d (%s): result dtype", ni, name);
        break;
    case SJ_K_WHERE:
        CHECK(n->n_in == 3 && x->dtype == SJ_BOOL, "node %d (%s): bool condition", ni, name);
        break;
    case SJ_K_REDUCE:
    case SJ_K_SOFTMAX:
        CHECK(n->a.axis >= 0 && x && n->a.axis < x->rank, "node %d (%s): axis %d", ni, name, n->a.axis);
        break;
    case SJ_K_MATMUL:
        CHECK(x && x->rank >= 2 && o->rank >= 2, "node %d (%s): ranks", ni, name);
        break;
    case SJ_K_ATTENTION:
        CHECK(n->n_in == 5 && o->rank == 4, "node %d (%s): form", ni, name); /* q k v lengths mask */
        break;
    case SJ_K_ATTENTION_VARLEN:
        CHECK(n->n_in == 4 && o->rank == 3, "node %d (%s): form", ni, name); /* q k v offsets */
        break;
    case SJ_K_ARANGE:
        CHECK(n->n_in == 0 && o->rank == 1 && o->dtype == n->a.dtype, "node %d (%s): form", ni, name);
        break;
    default:
        break;
    }
    return SJ_OK;
}

sj_status sj_graph_check(const sj_graph *g) {
    int n_ex = sj_ex_count(g->ex);
    for (int v = 0; v < g->n_vals; v++) {
        const sj_value *x = &g->vals[v];
        CHECK(sj_dtype_valid(x->dtype), "value %d: dtype %d", v, (int)x->dtype);
        CHECK(x->rank >= 0 && x->rank <= SJ_MAX_RANK, "value %d: rank %d", v, x->rank);
        for (int i = 0; i < x->rank; i++)
            CHECK(x->shape[i] >= 0 && x->shape[i] < n_ex, "value %d: shape expr %d at axis %d", v, x->shape[i], i);
        switch (x->kind) {
        case SJ_VAL_INPUT:
            CHECK(x->index >= 0 && x->index < g->n_inputs, "value %d: input index %d", v, x->index);
            break;
        case SJ_VAL_PARAM:
            CHECK(x->index >= 0 && x->index < g->n_params, "value %d: param index %d", v, x->index);
            break;
        case SJ_VAL_CONST:
            CHECK(x->rank == 0 && x->index >= 0 && x->index < g->n_consts, "value %d: const", v);
            break;
        case SJ_VAL_NODE:
            CHECK(x->index >= 0 && x->index < g->n_nodes, "value %d: node index %d", v, x->index);
            break;
        default:
            CHECK(0, "value %d: kind %d", v, x->kind);
        }
    }
    for (int i = 0; i < g->n_nodes; i++) {
        sj_status st = check_node(g, i);
        if (st) return st;
        if (i > 0) CHECK(g->nodes[i].out > g->nodes[i - 1].out, "nodes %d, %d out of order", i - 1, i);
    }
    CHECK(g->n_outputs >= 1, "no outputs");
    for (int i = 0; i < g->n_outputs; i++)
        CHECK(g->outputs[i] >= 0 && g->outputs[i] < g->n_vals, "output %d: value %d", i, g->outputs[i]);
    return SJ_OK;
}

/* -- Printing -------------------------------------------------------------- */

char *sj_graph_shape_str(const sj_graph *g, int32_t val, char *buf, size_t n) {
    const sj_value *v = &g->vals[val];
    size_t used = (size_t)snprintf(buf, n, "%s[", sj_dtype_name(v->dtype));
    for (int i = 0; i < v->rank && used < n; i++) {
        if (i) used += (size_t)snprintf(buf + used, n - used, ", ");
        if (used < n) used += (size_t)sj_ex_print(g->ex, v->shape[i], buf + used, n - used);
    }
    if (used < n) snprintf(buf + used, n - used, "]");
    return buf;
}

char *sj_graph_shape_str_at(const sj_graph *g, int32_t val, const int64_t *exv, char *buf, size_t n) {
    const sj_value *v = &g->vals[val];
    size_t used = (size_t)snprintf(buf, n, "%s[", sj_dtype_name(v->dtype));
    for (int i = 0; i < v->rank && used < n; i++) {
        int64_t d = exv ? exv[v->shape[i]] : sj_ex_hint(g->ex, v->shape[i]);
        used += (size_t)snprintf(buf + used, n - used, i ? ", %lld" : "%lld", (long long)d);
    }
    if (used < n) snprintf(buf + used, n - used, "]");
    return buf;
}

char *sj_graph_shape_str_concrete(const sj_graph *g, int32_t val, char *buf, size_t n) {
    return sj_graph_shape_str_at(g, val, NULL, buf, n);
}

void sj_graph_dump(const sj_graph *g, FILE *out) {
    char buf[256];
    for (int v = 0; v < g->n_vals; v++) {
        const sj_value *x = &g->vals[v];
        if (x->kind == SJ_VAL_NODE) continue;
        static const char *kinds[] = {"input", "param", "const", "node"};
        fprintf(out, "  %%%d = %s %d : %s\n", v, kinds[x->kind], x->index, sj_graph_shape_str(g, v, buf, sizeof buf));
    }
    for (int i = 0; i < g->n_nodes; i++) {
        const sj_node *n = &g->nodes[i];
        const int32_t *in = sj_node_ins(g, n);
        fprintf(out, "  %%%d = %s(", n->out, sj_op_name(n->op));
        for (int k = 0; k < n->n_in; k++) fprintf(out, k ? ", %%%d" : "%%%d", in[k]);
        fprintf(out, ") : %s\n", sj_graph_shape_str(g, n->out, buf, sizeof buf));
    }
    fprintf(out, "  return");
    for (int i = 0; i < g->n_outputs; i++) fprintf(out, i ? ", %%%d" : " %%%d", g->outputs[i]);
    fprintf(out, "\n");
}
