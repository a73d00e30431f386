/* Eager execution: walk the nodes in order, giving each a descriptor.
 *
 * View nodes (reshape, permute, slice) only compute a descriptor over their
 * operand's memory (reshape copies first when the operand is not
 * contiguous). Every other node writes a fresh contiguous buffer in the
 * call's arena, or straight into the caller's output when its value is an
 * output. The arena is planned per call (sizes are this call's): a buffer
 * is free again after the last node that reads it or a view of it, and a
 * later result reuses its bytes (first fit), so a chain of ops needs a few
 * buffers, not one per node. A matmul with a bias add marked as its own (sj_node.fold) runs
 * as one product that adds the bias and writes the add's result; the add
 * is skipped. The arena comes from the function's pool, so a warm call
 * does not allocate.
 *
 * Arena layout: [expression values][value descriptors][direct][plan][buffers...]
 */
#include "jit/exec.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"
#include "base/tensor.h"
#include "kernels/cpu/prepack.h"
#include "specialize/fusion.h"

#define ALIGN 64
static size_t align_up(size_t n) { return (n + ALIGN - 1) & ~(size_t)(ALIGN - 1); }

/* -- Shapes and descriptors ------------------------------------------------ */

typedef struct run {
    const sj_exec *x;
    int64_t *exv;       /* value of every expression */
    sj_tensor *rv;      /* runtime descriptor of every value */
    char *buf, *buf_end;
    unsigned char *direct; /* per value: index+1 of the output it writes, or 0 */
    int64_t *off;       /* per value: its buffer's byte offset from buf, or -1 */
} run;

static void shape_from(const sj_graph *g, const int64_t *exv, int32_t v, sj_tensor *t) {
    const sj_value *val = &g->vals[v];
    t->dtype = val->dtype;
    t->rank = val->rank;
    t->device = SJ_HOST;
    for (int i = 0; i < val->rank; i++) t->shape[i] = exv[val->shape[i]];
}

static void shape_of(const run *r, int32_t v, sj_tensor *t) {
    shape_from(r->x->g, r->exv, v, t);
    t->device = r->x->ops->device;
}

static size_t value_bytes(const run *r, int32_t v) {
    const sj_value *val = &r->x->g->vals[v];
    size_t n = sj_dtype_size(val->dtype);
    for (int i = 0; i < val->rank; i++) n *= (size_t)r->exv[val->shape[i]];
    return align_up(n);
}

/* The planned buffer of value v (NULL: none planned, or past the end). */
static void *take(run *r, int32_t v, size_t bytes) {
    if (r->off[v] < 0) return NULL;
    char *p = r->buf + r->off[v];
    return p + align_up(bytes) <= r->buf_end ? p : NULL;
}

/* x broadcast to `rank` axes of sizes `shape`: stride 0 where x has size 1
 * (or no axis) and the result does not. */
static sj_tensor expand(const sj_tensor *x, int rank, const int64_t *shape) {
    sj_tensor e = *x;
    int off = rank - x->rank;
    e.rank = rank;
    for (int i = rank - 1; i >= 0; i--) {
        int k = i - off;
        e.shape[i] = shape[i];
        e.stride[i] = (k >= 0 && x->shape[k] == shape[i]) ? x->stride[k] : 0;
    }
    return e;
}

/* -- Views ------------------------------------------------------------------ */

static sj_status view(run *r, const sj_node *n, sj_tensor *y) {
    const sj_graph *g = r->x->g;
    const sj_tensor *x = &r->rv[sj_node_ins(g, n)[0]];
    size_t esz = sj_dtype_size(x->dtype);
    switch (n->op) {
    case SJ_OP_RESHAPE: {
        const void *src = x->data;
        if (!sj_tensor_is_contiguous(x)) {
            sj_tensor c = *x;
            sj_tensor_set_contiguous(&c);
            c.data = take(r, n->out, sj_tensor_nbytes(x));
            if (!c.data) return sj_seterr(SJ_EINTERNAL, "exec: arena overflow in reshape");
            sj_status st = r->x->ops->k.copy(r->x->ops_ctx, x, &c);
            if (st) return st;
            src = c.data;
        }
        y->data = (void *)src;
        sj_tensor_set_contiguous(y);
        return SJ_OK;
    }
    case SJ_OP_PERMUTE:
        y->data = x->data;
        for (int i = 0; i < y->rank; i++) y->stride[i] = x->stride[n->a.perm[i]];
        return SJ_OK;
    case SJ_OP_SLICE: {
        int a = n->a.axis;
        int64_t start = r->exv[n->a.start];
        for (int i = 0; i < y->rank; i++) y->stride[i] = x->stride[i];
        y->stride[a] = x->stride[a] * n->a.step;
        y->data = y->shape[a] > 0 ? (char *)x->data + (size_t)(start * x->stride[a]) * esz : x->data;
        return SJ_OK;
    }
    default:
        return sj_seterr(SJ_EINTERNAL, "exec: %s is not a view", sj_op_name(n->op));
    }
}

/* -- Compute nodes --------------------------------------------------------- */

/* A product's operands brought to y's batch axes (ea, eb), its bias' last
 * axis alone (bv, when bias), and b's packed copy (NULL: none). */
static const void *matmul_args(const sj_kernels *k, const sj_graph *g, const sj_node *n, const sj_tensor *rv,
                               const sj_tensor *bias, const sj_tensor *y, sj_tensor *ea, sj_tensor *eb,
                               sj_tensor *bv) {
    const int32_t *in = sj_node_ins(g, n);
    const sj_tensor *a = &rv[in[0]], *b = &rv[in[1]];
    int64_t sa[SJ_MAX_RANK], sb[SJ_MAX_RANK];
    memcpy(sa, y->shape, sizeof sa);
    memcpy(sb, y->shape, sizeof sb);
    sa[y->rank - 1] = a->shape[a->rank - 1];
    sa[y->rank - 2] = a->shape[a->rank - 2];
    sb[y->rank - 1] = b->shape[b->rank - 1];
    sb[y->rank - 2] = b->shape[b->rank - 2];
    *ea = expand(a, y->rank, sa);
    *eb = expand(b, y->rank, sb);
    if (bias) {
        *bv = *bias;
        bv->rank = 1;
        bv->shape[0] = bias->shape[bias->rank - 1];
        bv->stride[0] = bias->stride[bias->rank - 1];
    }
    return g->packed && k->matmul_packed ? g->packed[n - g->nodes] : NULL;
}

sj_status sj_exec_node_epi_on(const sj_kernels *k, void *c, const sj_graph *g, const sj_node *n, const sj_tensor *rv,
                              const sj_tensor *bias, const sj_tensor *y, const sj_dev_epilogue *epi, bool *fused) {
    *fused = false;
    if (n->op != SJ_OP_MATMUL || !k->matmul_epi) return sj_exec_node_on(k, c, g, n, rv, bias, y);
    sj_tensor ea, eb, bv;
    const void *packed = matmul_args(k, g, n, rv, bias, y, &ea, &eb, &bv);
    int done = 0;
    sj_status st = k->matmul_epi(c, &ea, &eb, packed, bias ? &bv : NULL, y, epi, &done);
    *fused = done != 0;
    return st;
}

sj_status sj_exec_node_on(const sj_kernels *k, void *c, const sj_graph *g, const sj_node *n, const sj_tensor *rv,
                          const sj_tensor *bias, const sj_tensor *y) {
    const int32_t *in = sj_node_ins(g, n);
    switch (sj_op_kind_of(n->op)) {
    case SJ_K_UNARY:
        return k->unary(c, n->op, &rv[in[0]], y);
    case SJ_K_BINARY:
    case SJ_K_COMPARE: {
        sj_tensor a = expand(&rv[in[0]], y->rank, y->shape), b = expand(&rv[in[1]], y->rank, y->shape);
        return k->binary(c, n->op, &a, &b, y);
    }
    case SJ_K_WHERE: {
        sj_tensor w = expand(&rv[in[0]], y->rank, y->shape), a = expand(&rv[in[1]], y->rank, y->shape),
                  b = expand(&rv[in[2]], y->rank, y->shape);
        return k->where(c, &w, &a, &b, y);
    }
    case SJ_K_CAST:
    case SJ_K_COPY:
        return k->copy(c, &rv[in[0]], y);
    case SJ_K_REDUCE: {
        sj_tensor yk = *y; /* y with the reduced axis kept (size 1) */
        if (!n->a.keepdim) {
            for (int i = y->rank; i > n->a.axis; i--) {
                yk.shape[i] = y->shape[i - 1];
                yk.stride[i] = y->stride[i - 1];
            }
            yk.shape[n->a.axis] = 1;
            yk.stride[n->a.axis] = 0;
            yk.rank = y->rank + 1;
        }
        return k->reduce(c, n->op, &rv[in[0]], n->a.axis, &yk);
    }
    case SJ_K_SOFTMAX:
        return k->softmax(c, &rv[in[0]], n->a.axis, y);
    case SJ_K_NORM: {
        const sj_tensor *gw = in[1] >= 0 ? &rv[in[1]] : NULL;
        if (n->op == SJ_OP_RMS_NORM) return k->rms_norm(c, &rv[in[0]], gw, n->a.f, y);
        return k->layer_norm(c, &rv[in[0]], gw, in[2] >= 0 ? &rv[in[2]] : NULL, n->a.f, y);
    }
    case SJ_K_MATMUL: {
        sj_tensor ea, eb, bv;
        const void *packed = matmul_args(k, g, n, rv, bias, y, &ea, &eb, &bv);
        if (packed) return k->matmul_packed(c, &ea, &eb, packed, bias ? &bv : NULL, y);
        return k->matmul(c, &ea, &eb, bias ? &bv : NULL, y);
    }
    case SJ_K_ATTENTION:
    {
        sj_tensor m; /* the mask broadcast to the scores [B, H, Sq, Sk] */
        if (in[4] >= 0) {
            int64_t sc[4] = {rv[in[0]].shape[0], rv[in[0]].shape[1], rv[in[0]].shape[2], rv[in[1]].shape[2]};
            m = expand(&rv[in[4]], 4, sc);
        }
        return k->attention(c, &rv[in[0]], &rv[in[1]], &rv[in[2]], in[3] >= 0 ? &rv[in[3]] : NULL,
                            in[4] >= 0 ? &m : NULL, n->a.f, n->a.causal, y);
    }
    case SJ_K_CONCAT: {
        sj_tensor xs[64];
        for (int i = 0; i < n->n_in; i++) xs[i] = rv[in[i]];
        return k->concat(c, xs, n->n_in, n->a.axis, y);
    }
    case SJ_K_GATHER:
        return k->gather(c, &rv[in[0]], &rv[in[1]], y);
    case SJ_K_ARANGE:
        return k->arange(c, y);
    case SJ_K_ATTENTION_VARLEN:
        return k->attention_varlen(c, &rv[in[0]], &rv[in[1]], &rv[in[2]], &rv[in[3]], n->a.f, n->a.causal, y);
    case SJ_K_VIEW: { /* a reshape that must copy: copy in the operand's shape, contiguously */
        sj_tensor yc = *y;
        yc.rank = rv[in[0]].rank;
        memcpy(yc.shape, rv[in[0]].shape, sizeof yc.shape);
        sj_tensor_set_contiguous(&yc);
        return k->copy(c, &rv[in[0]], &yc);
    }
    }
    return sj_seterr(SJ_EINTERNAL, "exec: no eager kernel for %s", sj_op_name(n->op));
}

sj_status sj_exec_node(const sj_graph *g, const sj_node *n, const sj_tensor *rv, const sj_tensor *bias,
                       const sj_tensor *y) {
    return sj_exec_node_on(&sj_cpu_exec_ops.k, NULL, g, n, rv, bias, y);
}

/* -- Sizes ------------------------------------------------------------------- */

sj_status sj_exec_check_sizes(const sj_graph *g, const int64_t *sym_vals, sj_pool *pool, const char *fn_name) {
    sj_block *b = sj_pool_get(pool, (size_t)sj_ex_count(g->ex) * sizeof(int64_t));
    if (!b) return sj_seterr(SJ_ENOMEM, "fn '%s': out of memory checking sizes", fn_name);
    int64_t *exv = sj_block_data(b);
    sj_ex_eval_all(g->ex, sym_vals, exv);
    sj_status st = SJ_OK;
    for (int i = 0; i < g->n_nodes && !st; i++) {
        const sj_node *n = &g->nodes[i];
        const sj_value *v = &g->vals[n->out];
        int64_t d[SJ_MAX_RANK];
        for (int a = 0; a < v->rank; a++) d[a] = exv[v->shape[a]];
        int bad = sj_sizes_bad_axis(d, v->rank, NULL);
        if (bad < 0) continue;
        char shape[SJ_MAX_RANK * 22 + 16];
        st = sj_seterr(SJ_ESHAPE, "fn '%s': %s: for these inputs the result would be %s, %s at axis %d", fn_name,
                       sj_op_name(n->op), sj_graph_shape_str_at(g, n->out, exv, shape, sizeof shape),
                       d[bad] < 0 ? "a negative size" : "more than 2^48 elements", bad);
    }
    sj_pool_put(pool, b);
    return st;
}

/* -- Outputs ----------------------------------------------------------------- */

sj_status sj_exec_node_error(const sj_exec *x, const sj_node *n, sj_status st) {
    const char *op = sj_op_name(n->op), *m = sj_last_error();
    size_t k = strlen(op);
    if (!strncmp(m, op, k) && m[k] == ':') sj_err_prefix("fn '%s': ", x->fn_name);
    else sj_err_prefix("fn '%s': %s: ", x->fn_name, op);
    return st;
}

sj_status sj_exec_check_outputs(const sj_exec *x, const int64_t *exv) {
    const sj_graph *g = x->g;
    for (int i = 0; i < g->n_outputs; i++) {
        const sj_tensor *o = &x->outputs[i];
        if (!o->data) continue;
        sj_tensor want;
        shape_from(g, exv, g->outputs[i], &want);
        if (o->dtype != want.dtype)
            return sj_seterr(SJ_EDTYPE, "fn '%s': output %d has dtype %s, expected %s", x->fn_name, i,
                             sj_dtype_name(o->dtype), sj_dtype_name(want.dtype));
        if (o->rank != want.rank)
            return sj_seterr(SJ_ESHAPE, "fn '%s': output %d has rank %d, expected %d", x->fn_name, i, o->rank,
                             want.rank);
        for (int a = 0; a < want.rank; a++)
            if (o->shape[a] != want.shape[a])
                return sj_seterr(SJ_ESHAPE, "fn '%s': output %d size mismatch at axis %d: expected %lld, actual %lld",
                                 x->fn_name, i, a, (long long)want.shape[a], (long long)o->shape[a]);
        sj_status st = sj_tensor_check(o, "output");
        if (st) {
            sj_err_prefix("fn '%s': output %d: ", x->fn_name, i);
            return st;
        }
        if (o->device != x->ops->device)
            return sj_seterr(SJ_EINVAL, "fn '%s': output %d is %s memory; this backend writes %s memory", x->fn_name, i,
                             o->device == SJ_HOST ? "host" : "device", x->ops->device == SJ_HOST ? "host" : "device");
    }
    return SJ_OK;
}

sj_status sj_exec_alloc_outputs(const sj_exec *x, const int64_t *exv, unsigned char *allocated) {
    const sj_graph *g = x->g;
    for (int i = 0; i < g->n_outputs; i++) {
        sj_tensor *o = &x->outputs[i];
        if (o->data) continue;
        shape_from(g, exv, g->outputs[i], o);
        sj_tensor_set_contiguous(o);
        o->device = x->ops->device;
        o->data = x->ops->out_alloc ? x->ops->out_alloc(x->ops_ctx, sj_tensor_nbytes(o))
                                    : sj_host_alloc(x->rt, sj_tensor_nbytes(o), ALIGN);
        if (!o->data) return sj_seterr(SJ_ENOMEM, "fn '%s': out of memory allocating output %d", x->fn_name, i);
        allocated[i] = 1;
    }
    return SJ_OK;
}

/* -- Running ------------------------------------------------------------------ */

/* Per-call planning scratch after the descriptors: offsets (int64 per
 * value), last uses and death lists (int32 per value, per node + 1), free
 * spans (two int64 per value). */
static size_t plan_bytes(const sj_graph *g) {
    return align_up((size_t)g->n_vals * sizeof(int64_t)) + align_up((size_t)g->n_vals * 2 * sizeof(int32_t)) +
           align_up((size_t)(g->n_nodes + 1) * sizeof(int32_t)) + align_up((size_t)g->n_vals * 2 * sizeof(int64_t));
}

static size_t header_bytes(const sj_graph *g) {
    return align_up((size_t)sj_ex_count(g->ex) * sizeof(int64_t)) + align_up((size_t)g->n_vals * sizeof(sj_tensor)) +
           align_up((size_t)g->n_vals) + plan_bytes(g);
}

/* -- The memory plan --------------------------------------------------------------
 * In the executor's order: a non-view node's result (unless it goes
 * straight to an output) and a reshape's room for a copy take a span,
 * first fit among the free spans or from the top; after node i, the spans
 * of values whose last use is i go back. A value's last use is the last
 * node reading it or any view of it (a view's memory is its operand's);
 * outputs live to the end. Returns the top: the bytes the call needs. */

typedef struct span {
    int64_t off, len;
} span;

static int64_t span_take(span *fl, int *nf, int64_t len, int64_t *top) {
    for (int k = 0; k < *nf; k++)
        if (fl[k].len >= len) {
            int64_t o = fl[k].off;
            fl[k].off += len;
            fl[k].len -= len;
            if (!fl[k].len) fl[k] = fl[--*nf];
            return o;
        }
    int64_t o = *top;
    *top += len;
    return o;
}

static void span_give(span *fl, int *nf, int64_t off, int64_t len, int64_t *top) {
    for (int k = 0; k < *nf;) { /* merge with free neighbours */
        if (fl[k].off + fl[k].len == off) {
            off = fl[k].off, len += fl[k].len;
            fl[k] = fl[--*nf];
        } else if (off + len == fl[k].off) {
            len += fl[k].len;
            fl[k] = fl[--*nf];
        } else {
            k++;
        }
    }
    if (off + len == *top) *top = off; /* the top shrinks back */
    else fl[(*nf)++] = (span){off, len};
}

static size_t plan_memory(run *r, char *p) {
    const sj_graph *g = r->x->g;
    int nv = g->n_vals, nn = g->n_nodes;
    r->off = (int64_t *)p;
    p += align_up((size_t)nv * sizeof(int64_t));
    int32_t *last = (int32_t *)p, *next = last + nv;
    p += align_up((size_t)nv * 2 * sizeof(int32_t));
    int32_t *dies = (int32_t *)p; /* dies[i]: the first value whose span goes back after node i */
    p += align_up((size_t)(nn + 1) * sizeof(int32_t));
    span *fl = (span *)p;
    int nf = 0;
    int64_t top = 0, peak = 0; /* the top falls back as spans return; peak is its highest */
    for (int v = 0; v < nv; v++) last[v] = -1, r->off[v] = -1;
    for (int i = 0; i <= nn; i++) dies[i] = -1;
    for (int i = 0; i < nn; i++) {
        const sj_node *n = &g->nodes[i];
        const int32_t *in = sj_node_ins(g, n);
        for (int k = 0; k < n->n_in; k++)
            if (in[k] >= 0 && last[in[k]] < i) last[in[k]] = i;
    }
    for (int i = 0; i < g->n_outputs; i++) last[g->outputs[i]] = nn;
    for (int i = nn - 1; i >= 0; i--) { /* views keep their operand alive */
        const sj_node *n = &g->nodes[i];
        int32_t x = sj_node_ins(g, n)[0];
        if (sj_op_kind_of(n->op) == SJ_K_VIEW && last[x] < last[n->out]) last[x] = last[n->out];
    }
    for (int i = 0; i < nn; i++) {
        const sj_node *n = &g->nodes[i];
        if (n->fold != SJ_FOLDED) {
            int32_t out = n->fold >= 0 ? g->nodes[n->fold].out : n->out;
            bool view = sj_op_kind_of(n->op) == SJ_K_VIEW;
            if (view ? n->op == SJ_OP_RESHAPE : !r->direct[out]) {
                int64_t len = (int64_t)value_bytes(r, out);
                r->off[out] = span_take(fl, &nf, len, &top);
                if (top > peak) peak = top;
                int d = last[out] < i ? i : last[out]; /* never read: free after its own node */
                next[out] = dies[d];
                dies[d] = out;
            }
        }
        for (int32_t v = dies[i]; v >= 0; v = next[v])
            span_give(fl, &nf, r->off[v], (int64_t)value_bytes(r, v), &top);
    }
    return (size_t)peak;
}

/* Lay the header out in block b, evaluate expressions and plan the
 * buffers; returns the bytes of buffers the call needs. */
static size_t prepare(run *r, sj_block *b) {
    const sj_graph *g = r->x->g;
    char *p = sj_block_data(b);
    r->exv = (int64_t *)p;
    p += align_up((size_t)sj_ex_count(g->ex) * sizeof(int64_t));
    r->rv = (sj_tensor *)p;
    p += align_up((size_t)g->n_vals * sizeof(sj_tensor));
    r->direct = (unsigned char *)p;
    p += align_up((size_t)g->n_vals);
    char *plan = p;
    p += plan_bytes(g);
    r->buf = p;
    r->buf_end = (char *)sj_block_data(b) + b->cap;
    sj_ex_eval_all(g->ex, r->x->sym_vals, r->exv);
    /* which values write straight into an output (the first output naming them) */
    memset(r->direct, 0, (size_t)g->n_vals);
    for (int i = g->n_outputs - 1; i >= 0; i--) r->direct[g->outputs[i]] = (unsigned char)(i + 1);
    return plan_memory(r, plan);
}

sj_status sj_exec_eager(const sj_exec *x) {
    const sj_graph *g = x->g;
    const sj_backend *ops = x->ops;
    run r = {.x = x};
    size_t head = header_bytes(g);
    bool device_bufs = ops->buf_alloc != NULL; /* intermediates elsewhere than the host block */
    size_t hint = device_bufs ? 0 : atomic_load_explicit(x->arena_hint, memory_order_relaxed);
    sj_block *b = sj_pool_get(x->pool, head + hint);
    if (!b) return sj_seterr(SJ_ENOMEM, "fn '%s': out of memory for the execution arena", x->fn_name);
    size_t need = prepare(&r, b);
    if (!device_bufs && head + need > b->cap) {
        sj_pool_put(x->pool, b);
        atomic_store_explicit(x->arena_hint, need, memory_order_relaxed);
        b = sj_pool_get(x->pool, head + need);
        if (!b) return sj_seterr(SJ_ENOMEM, "fn '%s': out of memory for a %zu-byte arena", x->fn_name, head + need);
        prepare(&r, b);
    }
    void *dev_buf = NULL;
    if (device_bufs) {
        dev_buf = ops->buf_alloc(x->ops_ctx, need);
        if (!dev_buf && need) {
            sj_pool_put(x->pool, b);
            return sj_seterr(SJ_ENOMEM, "fn '%s': out of device memory for %zu bytes of intermediates", x->fn_name, need);
        }
        r.buf = dev_buf;
        r.buf_end = (char *)dev_buf + need;
    }

    unsigned char allocated[SJ_MAX_OUTPUTS] = {0};
    sj_status st = sj_exec_check_outputs(x, r.exv);
    if (!st) st = sj_exec_alloc_outputs(x, r.exv, allocated);

    /* Operand descriptors (prepare marked which values write straight into an output). */
    for (int v = 0; v < g->n_vals && !st; v++) {
        const sj_value *val = &g->vals[v];
        switch (val->kind) {
        case SJ_VAL_INPUT:
            r.rv[v] = x->inputs[val->index];
            break;
        case SJ_VAL_PARAM:
            r.rv[v] = sj_graph_param(g, val->index, ops->device);
            break;
        case SJ_VAL_CONST:
            memset(&r.rv[v], 0, sizeof r.rv[v]);
            r.rv[v].dtype = val->dtype;
            r.rv[v].device = ops->device;
            r.rv[v].data = sj_graph_const_data(g, val->index, ops->device);
            break;
        default:
            break;
        }
    }

    for (int i = 0; i < g->n_nodes && !st; i++) {
        const sj_node *n = &g->nodes[i];
        if (n->fold == SJ_FOLDED) continue; /* done by its product */
        /* a product with its bias add writes the add's result */
        int32_t out = n->fold >= 0 ? g->nodes[n->fold].out : n->out;
        const sj_tensor *bias = n->fold >= 0 ? &r.rv[sj_fold_bias(g, n)] : NULL;
        sj_tensor *y = &r.rv[out];
        shape_of(&r, out, y);
        if (sj_op_kind_of(n->op) == SJ_K_VIEW) {
            st = view(&r, n, y);
            continue;
        }
        int oi = r.direct[out];
        if (oi) {
            *y = x->outputs[oi - 1];
        } else {
            sj_tensor_set_contiguous(y);
            y->data = take(&r, out, sj_tensor_nbytes(y));
            if (!y->data) st = sj_seterr(SJ_EINTERNAL, "exec: arena overflow at node %d", i);
        }
        if (!st) st = sj_exec_node_on(&ops->k, x->ops_ctx, g, n, r.rv, bias, y);
        if (st) sj_exec_node_error(x, n, st);
    }

    /* Outputs not written in place: values that are views, inputs, params,
     * constants, or a repeat of an earlier output. */
    for (int i = 0; i < g->n_outputs && !st; i++) {
        int32_t v = g->outputs[i];
        bool written = g->vals[v].kind == SJ_VAL_NODE && r.direct[v] == i + 1 &&
                       sj_op_kind_of(g->nodes[g->vals[v].index].op) != SJ_K_VIEW;
        if (!written) st = ops->k.copy(x->ops_ctx, &r.rv[v], &x->outputs[i]);
    }
    if (ops->finish) {
        sj_status fst = ops->finish(x->ops_ctx);
        if (!st) st = fst;
    }
    if (st) sj_exec_release_outputs(x, allocated);
    if (dev_buf) ops->buf_free(x->ops_ctx, dev_buf);
    sj_pool_put(x->pool, b);
    return st;
}

void sj_exec_release_outputs(const sj_exec *x, const unsigned char *allocated) {
    for (int i = 0; i < x->g->n_outputs; i++)
        if (allocated[i]) {
            if (x->ops->out_free) x->ops->out_free(x->ops_ctx, x->outputs[i].data);
            else sj_host_free(x->rt, x->outputs[i].data);
            x->outputs[i].data = NULL;
        }
}

/* -- Constant operands ------------------------------------------------------------ */

/* The host descriptor of value v when it is a parameter or a view of one
 * (permute; slice; reshape of a contiguous one) whose sizes (and slice
 * start) are constants: the same matrix for every call of the entry. */
static bool const_desc(const sj_graph *g, int32_t v, sj_tensor *t, int depth) {
    const sj_value *val = &g->vals[v];
    if (val->kind == SJ_VAL_PARAM) {
        *t = sj_graph_param(g, val->index, SJ_HOST);
        return t->device == SJ_HOST;
    }
    if (val->kind != SJ_VAL_NODE || depth > 32) return false;
    const sj_node *n = &g->nodes[val->index];
    sj_tensor x;
    if (sj_op_kind_of(n->op) != SJ_K_VIEW || !const_desc(g, sj_node_ins(g, n)[0], &x, depth + 1)) return false;
    memset(t, 0, sizeof *t);
    t->dtype = val->dtype;
    t->rank = val->rank;
    t->device = SJ_HOST;
    for (int i = 0; i < val->rank; i++)
        if (!sj_ex_is_const(g->ex, val->shape[i], &t->shape[i])) return false;
    switch (n->op) {
    case SJ_OP_PERMUTE:
        t->data = x.data;
        for (int i = 0; i < t->rank; i++) t->stride[i] = x.stride[n->a.perm[i]];
        return true;
    case SJ_OP_SLICE: {
        int a = n->a.axis;
        int64_t start;
        if (!sj_ex_is_const(g->ex, n->a.start, &start)) return false;
        for (int i = 0; i < t->rank; i++) t->stride[i] = x.stride[i];
        t->stride[a] = x.stride[a] * n->a.step;
        t->data = t->shape[a] > 0 ? (char *)x.data + (size_t)(start * x.stride[a]) * sj_dtype_size(x.dtype) : x.data;
        return true;
    }
    case SJ_OP_RESHAPE:
        if (!sj_tensor_is_contiguous(&x)) return false;
        t->data = x.data;
        sj_tensor_set_contiguous(t);
        return true;
    default:
        return false;
    }
}

/* The policy of packing, the runtime's (the CPU device packs what it is
 * asked to: kernels/cpu/prepack.h): a float product's constant right
 * operand, shared with any product of the function that packed it
 * already; a new copy only while the function's copies stay within
 * max_bytes (prepack_max_bytes), first come first packed. The caller holds
 * the function's trace lock, so the bytes held do not move between the
 * check and the pack. */
int sj_exec_prepack(sj_graph *g, struct sj_cpu_pack_cache *cache, uint64_t max_bytes) {
    if (!cache || g->n_nodes == 0) return 0;
    const void **packed = sj_calloc((size_t)g->n_nodes, sizeof *packed);
    if (!packed) return 0;
    int made = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        const sj_node *n = &g->nodes[i];
        sj_tensor b;
        if (n->op != SJ_OP_MATMUL || !sj_dtype_is_float(g->vals[n->out].dtype) ||
            !const_desc(g, sj_node_ins(g, n)[1], &b, 0))
            continue;
        const sj_cpu_packed *p = sj_cpu_pack_cache_find(cache, &b);
        if (!p) {
            uint64_t need = sj_cpu_pack_need(&b), count, held;
            sj_cpu_pack_cache_stats(cache, &count, &held);
            if (need && held + need <= max_bytes) p = sj_cpu_pack_cache_get(cache, &b);
        }
        packed[i] = p;
        made += p != NULL;
    }
    if (made) {
        free(g->packed);
        g->packed = packed;
    } else {
        free(packed);
    }
    return made;
}
