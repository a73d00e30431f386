/* Fused execution: run a fused plan's groups in order.
 *
 * Per call: one pass evaluates every expression of the graph (sizes,
 * strides, arena offsets); the arena comes from the function's pool; each
 * store gets its base pointer; each generated group goes to the device's
 * launch slot as a flat descriptor filled here on the stack (kernels/
 * device.h's sj_dev_launch: the host's work items, split across its thread
 * pool; a CUDA device's grid); NODE groups run their eager kernel on
 * descriptors built from the plan's layouts (a product with its bias add
 * passes the bias to the product's kernel; a product with an epilogue
 * group runs it inside the product where the device and the product
 * allow, the device's matmul_epi kernel, and the group is then skipped; a
 * generated product, fusion.h, through the device's gemm slot, its
 * epilogue group, or the LayerNorm's row group, inside where the plan
 * says so: such a product's row-block counters follow the arena, zeroed
 * before the first); outputs the
 * plan could not write in place are copied last.
 *
 * Block layout: [expression values][store bases][descriptors][layout values,
 * with layout_syms][arena][LayerNorm counters] (a device's arena and
 * counters: its buf_alloc's).
 */
#include <string.h>

#include "base/error.h"
#include "jit/exec.h"
#include "jit/runtime.h"
#include "base/tensor.h"
#include "specialize/codegen.h"
#include "specialize/codegen_cuda.h"
#include "specialize/codegen_gemm_cuda.h"
#include "specialize/fusion.h"

#define ALIGN 64
static size_t align_up(size_t n) { return (n + ALIGN - 1) & ~(size_t)(ALIGN - 1); }

bool sj_exec_fused_ok(const sj_exec *x) {
    for (int i = 0; i < x->g->n_outputs; i++) {
        const sj_tensor *o = &x->outputs[i];
        /* anything else, an invalid descriptor included, goes the eager way,
         * which checks the outputs and names what is wrong */
        if (o->data && (o->rank < 0 || o->rank > SJ_MAX_RANK || o->device != x->ops->device ||
                        !sj_tensor_is_contiguous(o)))
            return false;
    }
    return true;
}

/* A descriptor for value v from its layout. */
static void layout_desc(const sj_graph *g, const sj_fplan *p, const int64_t *exv, void *const *bases, int32_t v,
                        sj_device device, sj_tensor *t) {
    const sj_value *val = &g->vals[v];
    const sj_layout *l = &p->layouts[v];
    memset(t, 0, sizeof *t);
    t->dtype = val->dtype;
    t->rank = val->rank;
    t->device = device;
    for (int i = 0; i < val->rank; i++) t->shape[i] = exv[val->shape[i]];
    if (l->store < 0) { /* a constant: rank 0 */
        t->data = sj_graph_const_data(g, val->index, device);
        return;
    }
    /* an empty input may have NULL data: no offset from NULL (UB, even + 0) */
    char *base = bases[l->store];
    t->data = base ? base + (size_t)exv[l->offset] * sj_dtype_size(val->dtype) : NULL;
    for (int i = 0; i < val->rank; i++) t->stride[i] = exv[l->stride[i]];
}

#define MAX_PTRS (2 * SJ_MAX_INPUTS + 64)

/* A generated group's base pointers: loads, then stores. */
static sj_status group_ptrs(const sj_group *gr, void *const *bases, void **ptrs) {
    int n = 0;
    if (gr->n_loads + gr->n_stores > MAX_PTRS)
        return sj_seterr(SJ_EINTERNAL, "exec: group %s has %d accesses", gr->name, gr->n_loads + gr->n_stores);
    for (int i = 0; i < gr->n_loads; i++) ptrs[n++] = bases[gr->loads[i].store];
    for (int i = 0; i < gr->n_stores; i++) ptrs[n++] = bases[gr->stores[i].store];
    return SJ_OK;
}

/* The host's split of a generated group: work items per chunk handed to
 * one kernel thread, about this many elements. */
#define CHUNK_ELEMS 32768

/* A generated group's launch descriptor for the device (kernels/device.h's
 * sj_dev_launch): the launch rule of the generator its code came from
 * (jit/runtime.c chooses it by the same test: CUDA C for a CUDA device, C
 * for the host). False: an empty iteration space, nothing to launch. */
static bool launch_desc(const sj_exec *x, const sj_group *gr, const int64_t *exv, void *const *fn,
                        sj_dev_launch *d) {
    if (x->ops->device == SJ_CUDA) {
        sj_launch L;
        if (!sj_cuda_launch(gr, exv, x->ops->units, &L)) return false;
        d->fn = fn[L.variant];
        /* a row kernel split from its unaligned path (sj_codegen_opts
         * .fallback_kernels): the fallback where the vector path's test fails */
        if (fn[SJ_CG_FALLBACK] && !sj_cuda_vec_ok(x->g, gr, exv, d->ptrs)) d->fn = fn[SJ_CG_FALLBACK];
        memcpy(d->grid, L.grid, sizeof d->grid);
        memcpy(d->block, L.block, sizeof d->block);
        d->smem = L.smem;
        return true;
    }
    int64_t items = gr->kind == SJ_G_ROW ? exv[gr->rows] : exv[gr->numel];
    if (items <= 0) return false;
    d->fn = fn[0]; /* the C generator makes one per group */
    d->items = items;
    d->min_chunk = CHUNK_ELEMS;
    d->item_elems = 1;
    if (gr->kind == SJ_G_ROW) {
        int64_t row = exv[gr->shape[gr->rank - 1]];
        d->min_chunk = row > 0 ? (CHUNK_ELEMS + row - 1) / row : 1;
        d->item_elems = row > 0 ? row : 1;
    }
    return true;
}

static sj_status run_generated(const sj_exec *x, const sj_group *gr, const int64_t *exv, void *const *bases,
                               void *const *fn, int n_syms) {
    void *ptrs[MAX_PTRS];
    sj_status st = group_ptrs(gr, bases, ptrs);
    if (st) return st;
    sj_dev_launch d = {.ptrs = ptrs, .syms = x->sym_vals, .n_ptrs = gr->n_loads + gr->n_stores,
                       .n_syms = n_syms};
    return launch_desc(x, gr, exv, fn, &d) ? x->ops->launch(x->ops_ctx, &d) : SJ_OK;
}

/* A generated product (fusion.h's "Generated products") through the
 * device's gemm slot; *done false (nothing run) where an operand's address
 * is not aligned as the kernel needs: the device's product runs instead,
 * its epilogue group after it. */
static sj_status run_gemm(const sj_exec *x, const sj_fplan *p, const sj_group *gr, const int64_t *exv,
                          void *const *bases, void *fn, int tile, unsigned *cnt, bool *done) {
    const sj_graph *g = x->g;
    const sj_node *n = &g->nodes[gr->nodes[0]];
    const int32_t *in = sj_node_ins(g, n);
    sj_device dev = x->ops->device;
    sj_tensor a, b, y, bias = {0}, r = {0}, lg = {0}, lb = {0}, ly = {0};
    layout_desc(g, p, exv, bases, in[0], dev, &a);
    layout_desc(g, p, exv, bases, in[1], dev, &b);
    layout_desc(g, p, exv, bases, gr->gemm_out, dev, &y);
    if (gr->bias >= 0) layout_desc(g, p, exv, bases, gr->bias, dev, &bias);
    if (gr->gemm_epi & SJ_GEMM_RES) layout_desc(g, p, exv, bases, gr->gemm_res, dev, &r);
    bool ln = gr->gemm_epi & SJ_GEMM_LN;
    const sj_node *lnn = ln ? &g->nodes[gr->gemm_ln] : NULL;
    if (ln) { /* its gamma, beta (each optional) and output */
        const int32_t *lin = sj_node_ins(g, lnn);
        if (lnn->n_in > 1 && lin[1] >= 0) layout_desc(g, p, exv, bases, lin[1], dev, &lg);
        if (lnn->n_in > 2 && lin[2] >= 0) layout_desc(g, p, exv, bases, lin[2], dev, &lb);
        layout_desc(g, p, exv, bases, lnn->out, dev, &ly);
    }
    *done = false;
    int64_t K = b.shape[0], N = b.shape[1], numel = 1;
    for (int i = 0; i < y.rank; i++) numel *= y.shape[i];
#define MISALIGNED(t, m) ((t).data && (uintptr_t)(t).data % (m))
    /* (a LayerNorm inside reads C back 16 bytes at a time) */
    if (MISALIGNED(a, 16) || MISALIGNED(b, 16) || MISALIGNED(y, ln ? 16 : 2 * sj_dtype_size(y.dtype)) ||
        MISALIGNED(bias, 2 * sj_dtype_size(bias.dtype)) || MISALIGNED(r, 2 * sj_dtype_size(r.dtype)) ||
        MISALIGNED(lg, 2 * sj_dtype_size(lg.dtype)) || MISALIGNED(lb, 2 * sj_dtype_size(lb.dtype)) ||
        MISALIGNED(ly, 2 * sj_dtype_size(ly.dtype)) || (ln && !cnt))
        return SJ_OK;
#undef MISALIGNED
    sj_dev_gemm d = {.fn = fn, .tile = tile, .flags = gr->gemm_epi, .M = N ? numel / N : 0, .N = N,
                     .K = K, .a = a.data, .b = b.data, .bias = gr->bias >= 0 ? bias.data : NULL,
                     .r = gr->gemm_epi & SJ_GEMM_RES ? r.data : NULL, .c = y.data, .bias_dtype = bias.dtype,
                     .r_dtype = r.dtype, .c_dtype = y.dtype, .ln_g = lg.data, .ln_b = lb.data, .ln_y = ly.data,
                     .cnt = ln ? cnt : NULL, .ln_g_dtype = lg.dtype, .ln_b_dtype = lb.dtype, .ln_y_dtype = ly.dtype,
                     .ln_eps = ln ? lnn->a.f : 0};
    *done = true;
    return x->ops->gemm(x->ops_ctx, &d);
}

/* The rows of generated product gr by the sizes exv. */
static int64_t gemm_rows(const sj_graph *g, const sj_group *gr, const int64_t *exv) {
    const sj_value *Y = &g->vals[gr->gemm_out];
    int64_t M = 1;
    for (int a = 0; a + 1 < Y->rank; a++) M *= exv[Y->shape[a]];
    return M;
}

/* The bytes of the call's LayerNorm counters (after the arena): enough
 * for the products with a LayerNorm inside at the layout's sizes, which
 * run one after another (each leaves them zero); 0 when none can run. */
static size_t ln_counter_bytes(const sj_exec *x, const sj_fplan *p, const int64_t *lexv) {
    if (!p->n_gemm_ln || !x->ops->gemm || (x->ops->buf_alloc && !x->ops->buf_zero)) return 0;
    int64_t M = 0;
    for (int gi = 0; gi < p->n_groups; gi++)
        if (p->groups[gi].gemm_epi & SJ_GEMM_LN) {
            int64_t m = gemm_rows(x->g, &p->groups[gi], lexv);
            if (m > M) M = m;
        }
    return align_up((size_t)sj_gemm_ln_counters(M) * sizeof(unsigned));
}

bool sj_exec_gemm_picks(sj_backend *b, const sj_graph *g, const sj_fplan *p, const int64_t *syms, void *const *fns,
                        const char *key, int mode, int8_t *pick) {
    for (int gi = 0; gi < p->n_groups; gi++) {
        const sj_group *gr = &p->groups[gi];
        int v = mode - 2;
        for (int k = 0; k < SJ_GEMM_CLASSES; k++)
            pick[gi * SJ_GEMM_CLASSES + k] =
                (int8_t)(gr->gemm_tile < 0 || mode < 2 ? -1 : v < gr->gemm_nv ? v : gr->gemm_nv - 1);
    }
    return mode == 1 && b->gemm_tune && b->gemm_tune(b, g, p, syms, fns, key, pick);
}

/* The call's expression values at the start of block b, and (lay bytes at
 * head - lay, with x->layout_syms) the layout's; *lexv the ones the
 * arena is laid out by. */
static int64_t *eval_values(const sj_exec *x, sj_block *b, size_t head, size_t lay, const int64_t **lexv) {
    int64_t *exv = sj_block_data(b);
    sj_ex_eval_all(x->g->ex, x->sym_vals, exv);
    *lexv = exv;
    if (lay) {
        int64_t *l = (int64_t *)((char *)exv + head - lay);
        sj_ex_eval_all(x->g->ex, x->layout_syms, l);
        *lexv = l;
    }
    return exv;
}

sj_status sj_exec_fused(const sj_exec *x, const sj_fplan *p, void *const *fns) {
    const sj_graph *g = x->g;
    const sj_backend *ops = x->ops;
    bool device_arena = ops->buf_alloc != NULL;
    size_t n_ex = (size_t)sj_ex_count(g->ex);
    size_t lay = x->layout_syms ? align_up(n_ex * sizeof(int64_t)) : 0; /* the layout's values */
    size_t head = align_up(n_ex * sizeof(int64_t)) + align_up((size_t)p->n_stores * sizeof(void *)) +
                  align_up((size_t)g->n_vals * sizeof(sj_tensor)) + lay;
    size_t hint = device_arena ? 0 : atomic_load_explicit(x->arena_hint, memory_order_relaxed);
    sj_block *b = sj_pool_get(x->pool, head + hint);
    if (!b) return sj_seterr(SJ_ENOMEM, "fn '%s': out of memory for the execution arena", x->fn_name);
    const int64_t *lexv; /* where the arena's stores are (the layout's values, or exv) */
    int64_t *exv = eval_values(x, b, head, lay, &lexv);
    size_t arena = (size_t)lexv[p->arena_bytes], cnt_bytes = ln_counter_bytes(x, p, lexv), cnt_at = align_up(arena);
    if (cnt_bytes) arena = cnt_at + cnt_bytes; /* [the plan's arena][LayerNorm counters] */
    if (!device_arena && head + arena > b->cap) {
        sj_pool_put(x->pool, b);
        atomic_store_explicit(x->arena_hint, arena, memory_order_relaxed);
        b = sj_pool_get(x->pool, head + arena);
        if (!b) return sj_seterr(SJ_ENOMEM, "fn '%s': out of memory for a %zu-byte arena", x->fn_name, head + arena);
        exv = eval_values(x, b, head, lay, &lexv); /* (the old block is gone) */
    }
    char *at = (char *)exv + align_up(n_ex * sizeof(int64_t));
    void **bases = (void **)at;
    at += align_up((size_t)p->n_stores * sizeof(void *));
    sj_tensor *rv = (sj_tensor *)at;
    at += align_up((size_t)g->n_vals * sizeof(sj_tensor)) + lay;
    char *arena_base = at;
    void *dev_arena = NULL;
    if (device_arena) {
        dev_arena = ops->buf_alloc(x->ops_ctx, arena);
        if (!dev_arena && arena) {
            sj_pool_put(x->pool, b);
            return sj_seterr(SJ_ENOMEM, "fn '%s': out of device memory for a %zu-byte arena", x->fn_name, arena);
        }
        arena_base = dev_arena;
    }

    /* products run their epilogue groups inside them (cfg.fuse_epilogue) */
    bool epi_ok = ops->k.matmul_epi && (!x->rt || x->rt->cfg.fuse_epilogue);
    unsigned char allocated[SJ_MAX_OUTPUTS] = {0};
    int n_syms = sj_sym_count(g->ex); /* every generated kernel takes them all */
    bool cnt_zeroed = false;
    sj_status st = SJ_OK;
    for (int s = 0; s < p->n_stores && lay && !st; s++) /* each store's values fit where the layout put it */
        if (p->stores[s].kind == SJ_ST_ARENA && exv[p->stores[s].bytes] > lexv[p->stores[s].bytes])
            st = sj_seterr(SJ_EINVAL, "fn '%s': store %d needs %lld bytes, laid out for %lld", x->fn_name, s,
                           (long long)exv[p->stores[s].bytes], (long long)lexv[p->stores[s].bytes]);
    if (!st) st = sj_exec_check_outputs(x, exv);
    if (!st) st = sj_exec_alloc_outputs(x, exv, allocated);
    for (int s = 0; s < p->n_stores && !st; s++) {
        const sj_store *so = &p->stores[s];
        switch (so->kind) {
        case SJ_ST_INPUT: bases[s] = x->inputs[so->index].data; break;
        case SJ_ST_PARAM: bases[s] = sj_graph_param(g, so->index, ops->device).data; break;
        case SJ_ST_OUTPUT: bases[s] = x->outputs[so->index].data; break;
        case SJ_ST_ARENA: bases[s] = arena_base ? arena_base + lexv[so->offset] : NULL; break;
        }
    }

    for (int gi = 0; gi < p->n_groups && !st; gi++) {
        const sj_group *gr = &p->groups[gi];
        if (gr->kind != SJ_G_NODE) {
            void *const *fn = fns + (size_t)gi * SJ_CG_VARIANTS_MAX;
            if (!fn[0]) {
                st = sj_seterr(SJ_EINTERNAL, "exec: no compiled function for group %s", gr->name);
                break;
            }
            st = run_generated(x, gr, exv, bases, fn, n_syms);
            if (st) sj_err_prefix("fn '%s': kernel %s: ", x->fn_name, gr->name);
            continue;
        }
        const sj_node *n = &g->nodes[gr->nodes[0]];
        int pick = 0;
        if (x->gemm_pick && gr->gemm_tile >= 0) {
            /* the rows' class, by the layout's sizes: a bucket graph's
             * update runs the kernels it captured at the bucket's edge */
            pick = x->gemm_pick[gi * SJ_GEMM_CLASSES + sj_gemm_class(gemm_rows(g, gr, lexv))];
        }
        if (gr->gemm_tile >= 0 && pick >= 0 && pick < gr->gemm_nv && ops->gemm &&
            fns[(size_t)gi * SJ_CG_VARIANTS_MAX + (size_t)pick]) {
            unsigned *cnt = NULL; /* a LayerNorm inside: the counters, zeroed before the first */
            if ((gr->gemm_epi & SJ_GEMM_LN) && cnt_bytes && arena_base) {
                cnt = (unsigned *)(void *)(arena_base + cnt_at);
                if (!cnt_zeroed) {
                    if (device_arena) st = ops->buf_zero(x->ops_ctx, cnt, cnt_bytes);
                    else memset(cnt, 0, cnt_bytes);
                    if (st) {
                        sj_exec_node_error(x, n, st);
                        break;
                    }
                    cnt_zeroed = true;
                }
            }
            bool done;
            st = run_gemm(x, p, gr, exv, bases, fns[(size_t)gi * SJ_CG_VARIANTS_MAX + (size_t)pick],
                          gr->gemm_tiles[pick], cnt, &done);
            if (st) sj_exec_node_error(x, n, st);
            if (done) {
                /* the epilogue, or the LayerNorm's group, is group gi + 1: done */
                if (gr->gemm_epi & (SJ_GEMM_EPI | SJ_GEMM_LN)) gi++;
                continue;
            }
        }
        const int32_t *in = sj_node_ins(g, n);
        for (int k = 0; k < n->n_in; k++)
            if (in[k] >= 0) layout_desc(g, p, exv, bases, in[k], ops->device, &rv[in[k]]);
        if (gr->bias >= 0) layout_desc(g, p, exv, bases, gr->bias, ops->device, &rv[gr->bias]);
        sj_tensor y;
        layout_desc(g, p, exv, bases, sj_group_out(g, gr), ops->device, &y);
        const sj_tensor *bias = gr->bias >= 0 ? &rv[gr->bias] : NULL;
        void *const *efn = gr->epilogue >= 0 ? fns + (size_t)gr->epilogue * SJ_CG_VARIANTS_MAX : NULL;
        if (epi_ok && efn && efn[0]) {
            const sj_group *eg = &p->groups[gr->epilogue];
            void *ptrs[MAX_PTRS];
            bool fused = false;
            st = group_ptrs(eg, bases, ptrs);
            sj_dev_epilogue epi = {(void (*)(void *const *, const int64_t *, int64_t, int64_t))efn[0], ptrs,
                                   x->sym_vals};
            if (!st) st = sj_exec_node_epi_on(&ops->k, x->ops_ctx, g, n, rv, bias, &y, &epi, &fused);
            if (st) sj_exec_node_error(x, n, st);
            else if (fused) gi++; /* the epilogue is group gi + 1, done */
            continue;
        }
        st = sj_exec_node_on(&ops->k, x->ops_ctx, g, n, rv, bias, &y);
        if (st) sj_exec_node_error(x, n, st);
    }

    for (int i = 0; i < g->n_outputs && !st; i++) {
        if (!p->output_copy[i]) continue;
        sj_tensor src;
        layout_desc(g, p, exv, bases, g->outputs[i], ops->device, &src);
        st = ops->k.copy(x->ops_ctx, &src, &x->outputs[i]);
    }
    if (ops->finish) {
        sj_status fst = ops->finish(x->ops_ctx);
        if (!st) st = fst;
    }
    if (st) sj_exec_release_outputs(x, allocated);
    if (dev_arena) ops->buf_free(x->ops_ctx, dev_arena);
    sj_pool_put(x->pool, b);
    return st;
}
