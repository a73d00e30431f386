/* Execution on a CUDA device: the CUDA call slots of the device table
 * (kernels/device.h) behind the device-neutral executors (jit/exec.c,
 * jit/exec_fused.c), and the device copies of a graph's constants and
 * parameters.
 *
 * A call's kernels are queued on one stream: for sj_call (which then waits
 * for them) the runtime's own, or a lane of the runtime's when another call
 * is in flight (lanes.c); the caller's for sj_call_stream (which does not
 * wait). Intermediates and arenas come from the caching allocator and are
 * freed stream-ordered at the end of the call, so a warm call never makes a
 * fresh block.
 */
#include "base/alloc.h"
#include "kernels/cuda/exec_cuda.h"

#include <string.h>

#include "base/error.h"
#include "base/tensor.h"
#include "specialize/codegen_gemm_cuda.h"
#include "specialize/fusion.h"

/* -- Kernels ------------------------------------------------------------------- */

#define E(c) ((const sj_cuda_exec *)&((sj_cuda_call *)(c))->e)

static sj_status k_unary(void *c, sj_op op, const sj_tensor *x, const sj_tensor *y) { return sj_cuda_unary(E(c), op, x, y); }
static sj_status k_binary(void *c, sj_op op, const sj_tensor *a, const sj_tensor *b, const sj_tensor *y) {
    return sj_cuda_binary(E(c), op, a, b, y);
}
static sj_status k_where(void *c, const sj_tensor *w, const sj_tensor *a, const sj_tensor *b, const sj_tensor *y) {
    return sj_cuda_where(E(c), w, a, b, y);
}
static sj_status k_copy(void *c, const sj_tensor *x, const sj_tensor *y) { return sj_cuda_copy(E(c), x, y); }
static sj_status k_reduce(void *c, sj_op op, const sj_tensor *x, int axis, const sj_tensor *y) {
    return sj_cuda_reduce(E(c), op, x, axis, y);
}
static sj_status k_softmax(void *c, const sj_tensor *x, int axis, const sj_tensor *y) {
    return sj_cuda_softmax(E(c), x, axis, y);
}
static sj_status k_layer_norm(void *c, const sj_tensor *x, const sj_tensor *g, const sj_tensor *b, double eps,
                              const sj_tensor *y) {
    return sj_cuda_layer_norm(E(c), x, g, b, eps, y);
}
static sj_status k_rms_norm(void *c, const sj_tensor *x, const sj_tensor *g, double eps, const sj_tensor *y) {
    return sj_cuda_rms_norm(E(c), x, g, eps, y);
}
static sj_status k_matmul(void *c, const sj_tensor *a, const sj_tensor *b, const sj_tensor *bias, const sj_tensor *y) {
    return sj_cuda_matmul_bias(E(c), a, b, bias, y);
}
static sj_status k_attention(void *c, const sj_tensor *q, const sj_tensor *k, const sj_tensor *v,
                             const sj_tensor *lengths, const sj_tensor *mask, double scale, int causal,
                             const sj_tensor *y) {
    return sj_cuda_attention_mask(E(c), q, k, v, lengths, mask, scale, causal, y);
}
static sj_status k_concat(void *c, const sj_tensor *xs, int n, int axis, const sj_tensor *y) {
    return sj_cuda_concat(E(c), xs, n, axis, y);
}
/* The call's error flag (a device int for bad gather indices and bad
 * varlen offsets), made and zeroed in stream order on first use. */
static sj_status need_flag(sj_cuda_call *cc, const char *op) {
    if (cc->e.error_flag) return SJ_OK;
    /* capturing: the graph's own (no allocation may happen in a capture) */
    cc->e.error_flag = cc->graph_flag ? cc->graph_flag : sj_cuda_alloc(cc->e.cuda, sizeof(int), cc->e.stream);
    if (!cc->e.error_flag) return sj_seterr(SJ_ENOMEM, "%s: out of device memory for the error flag", op);
    cc->flag_used = true;
    const int64_t rv[2] = {(int64_t)cc->e.error_flag, sizeof(int)};
    if (sj_cuda_rec_op(&cc->e, SJ_REC_SET, rv, 2, -1)) return SJ_OK; /* a bucket graph's memset, not run */
    sj_status st = SJ_CU(cc->e.cuda, cc->e.cuda->api.MemsetD8Async(cc->e.error_flag, 0, sizeof(int), cc->e.stream),
                         "clearing the error flag");
    return st;
}

static sj_status k_gather(void *c, const sj_tensor *t, const sj_tensor *idx, const sj_tensor *y) {
    sj_status st = need_flag(c, "gather");
    return st ? st : sj_cuda_gather(E(c), t, idx, y);
}

static sj_status k_arange(void *c, const sj_tensor *y) { return sj_cuda_arange(E(c), y); }

static sj_status k_attention_varlen(void *c, const sj_tensor *q, const sj_tensor *k, const sj_tensor *v,
                                    const sj_tensor *offsets, double scale, int causal, const sj_tensor *y) {
    sj_status st = need_flag(c, "attention_varlen");
    return st ? st : sj_cuda_attention_varlen(E(c), q, k, v, offsets, scale, causal, y);
}

static const sj_kernels cuda_kernels = {k_unary,      k_binary,   k_where,  k_copy,      k_reduce, k_softmax,
                                        k_layer_norm, k_rms_norm, k_matmul, k_attention, k_concat, k_gather,
                                        k_arange,     NULL /* no packed weights: cuBLASLt reads them in place */,
                                        k_attention_varlen, NULL /* epilogues run after the product */};

/* -- The call slots ---------------------------------------------------------------- */

static void *buf_alloc(void *c, size_t bytes) {
    sj_cuda_call *cc = c;
    if (cc->graph_arena) { /* the graph's own, ordered on the stream the graph will run on:
                              [workspace][gather error flag][arena] */
        size_t ws = cc->graph_ws_bytes, fl = SJ_GRAPH_FLAG_BYTES;
        CUdeviceptr p = sj_cuda_alloc(cc->e.cuda, ws + fl + bytes, cc->graph_stream);
        *cc->graph_arena = p;
        cc->graph_bytes = p ? sj_cuda_block_bytes(ws + fl + bytes) : 0;
        if (p && ws) cc->e.ws = p, cc->e.ws_bytes = ws;
        if (p) cc->graph_flag = p + ws;
        return p && bytes ? (void *)(uintptr_t)(p + ws + fl) : NULL;
    }
    if (cc->graph_fixed) { /* updating a bucket graph: its memory again, as captured */
        size_t ws = cc->graph_ws_bytes;
        if (ws) cc->e.ws = cc->graph_fixed, cc->e.ws_bytes = ws;
        cc->graph_flag = cc->graph_fixed + ws;
        return bytes ? (void *)(uintptr_t)(cc->graph_fixed + ws + SJ_GRAPH_FLAG_BYTES) : NULL;
    }
    if (!bytes) return NULL;
    return (void *)(uintptr_t)sj_cuda_alloc(cc->e.cuda, bytes, cc->e.stream);
}

static void buf_free(void *c, void *p) {
    sj_cuda_call *cc = c;
    if (cc->graph_arena || cc->graph_fixed) return; /* kept by the graph */
    sj_cuda_free(cc->e.cuda, (CUdeviceptr)(uintptr_t)p, cc->e.stream);
}

/* A generated group with the grid, block and shared memory the engine
 * worked out (the CUDA generator's launch rule). */
static sj_status launch(void *c, const sj_dev_launch *d) {
    sj_cuda_call *cc = c;
    sj_cuda *cu = cc->e.cuda;
    /* parameters: each access's base pointer, then each symbol's value */
    int n_ptr = d->n_ptrs, n_sym = d->n_syms;
    void *ptr_vals[2 * SJ_MAX_INPUTS + 64];
    long long sym_vals[SJ_MAX_INPUTS * SJ_MAX_RANK];
    void *args[2 * SJ_MAX_INPUTS + 64 + SJ_MAX_INPUTS * SJ_MAX_RANK];
    if (n_ptr < 0 || n_ptr > 2 * SJ_MAX_INPUTS + 64 || n_sym < 0 || n_sym > SJ_MAX_INPUTS * SJ_MAX_RANK)
        return sj_seterr(SJ_EINTERNAL, "launch: %d pointers and %d symbols", n_ptr, n_sym);
    for (int i = 0; i < n_ptr; i++) {
        ptr_vals[i] = d->ptrs[i];
        args[i] = &ptr_vals[i];
    }
    for (int i = 0; i < n_sym; i++) {
        sym_vals[i] = (long long)d->syms[i];
        args[n_ptr + i] = &sym_vals[i];
    }
    sj_cuda_bind(cu);
    return SJ_CU(cu,
                 sj_cuda_launch_kernel(&cc->e, (CUfunction)d->fn, d->grid[0], d->grid[1], d->grid[2], d->block[0],
                                       d->block[1], d->block[2], d->smem, args),
                 "launching a generated kernel");
}

/* One TMA tensor map of a 2-D f16 row-major matrix: rows x cols, boxes
 * of box_rows x 64 columns (128 bytes: the swizzle's row). */
static sj_status tmap(sj_cuda *cu, CUtensorMap *m, const void *p, int64_t rows, int64_t cols, int box_rows) {
    const cuuint64_t dim[2] = {(cuuint64_t)cols, (cuuint64_t)rows}, stride[1] = {(cuuint64_t)cols * 2};
    const cuuint32_t box[2] = {64, (cuuint32_t)box_rows}, estride[2] = {1, 1};
    return SJ_CU(cu,
                 cu->api.TensorMapEncodeTiled(m, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2, (void *)(uintptr_t)p, dim, stride,
                                              box, estride, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                              CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                                              CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
                 "encoding a generated product's tensor map");
}

sj_status sj_cuda_gemm_launch(const sj_cuda_exec *e, CUfunction f, const sj_gemm_spec *sp, int64_t M,
                              const void *A, const void *B, const void *bias, const void *R, void *C,
                              const sj_gemm_ln_args *ln) {
    sj_cuda *cu = e->cuda;
    sj_gemm_dims dims;
    sj_gemm_cuda_dims(sp, M, &dims);
    if (!M) return SJ_OK;
    if (sp->ln && (!ln || !ln->y || !ln->cnt))
        return sj_seterr(SJ_EINVAL, "gemm: a product with a LayerNorm inside needs its output and counters");
    sj_cuda_bind(cu);
    if (dims.smem > 48 * 1024) {
        sj_status st = SJ_CU(cu, cu->api.FuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                                          (int)dims.smem),
                             "allowing a generated product its shared memory");
        if (st) return st;
    }
    long long m = (long long)M;
    CUtensorMap ta, tb;
    const void *lg = ln ? ln->g : NULL, *lb = ln ? ln->b : NULL;
    void *ly = ln ? ln->y : NULL;
    unsigned *cnt = ln ? ln->cnt : NULL;
    /* (A, B, bias, R, C, M, [tmA, tmB], [lg, lb, Y, cnt]) */
    void *args[12] = {&A, &B, &bias, &R, &C, &m};
    int na = 6;
    if (sp->tile.wg) args[na++] = &ta, args[na++] = &tb;
    if (sp->ln) args[na++] = &lg, args[na++] = &lb, args[na++] = &ly, args[na++] = &cnt;
    if (sp->tile.wg) {
        if (!cu->api.TensorMapEncodeTiled)
            return sj_seterr(SJ_EBACKEND, "cuda: the driver has no cuTensorMapEncodeTiled for a warpgroup product");
        sj_status st = tmap(cu, &ta, A, M, sp->K, sp->tile.bm);
        if (!st) st = tmap(cu, &tb, B, sp->K, sp->N, 64);
        if (st) return st;
    }
    return SJ_CU(cu,
                 sj_cuda_launch_kernel(e, f, dims.grid[0], dims.grid[1], dims.grid[2], dims.block[0], dims.block[1],
                                       dims.block[2], (unsigned)dims.smem, args),
                 "launching a generated product");
}

/* A generated product (specialize/codegen_gemm_cuda.h): M the kernel's
 * argument (ignored by a specialized kernel). */
static sj_status gemm(void *c, const sj_dev_gemm *d) {
    sj_cuda_call *cc = c;
    int nt;
    const sj_gemm_tile *tiles = sj_gemm_cuda_tiles(&nt);
    if (d->tile < 0 || d->tile >= nt) return sj_seterr(SJ_EINTERNAL, "gemm: tile %d of %d", d->tile, nt);
    if (!d->N) return SJ_OK;
    sj_gemm_spec sp = {.N = d->N, .K = d->K, .ln = (d->flags & SJ_GEMM_LN) != 0, .tile = tiles[d->tile]};
    const sj_gemm_ln_args ln = {d->ln_g, d->ln_b, d->ln_y, d->cnt};
    return sj_cuda_gemm_launch(&cc->e, (CUfunction)d->fn, &sp, d->M, d->a, d->b, d->bias, d->r, d->c, &ln);
}

/* A call's memory zeroed in its order (a bucket graph's memset recorded:
 * an update checks it is the one captured, and queues nothing). */
static sj_status buf_zero(void *c, void *p, size_t bytes) {
    sj_cuda_call *cc = c;
    const int64_t rv[2] = {(int64_t)(uintptr_t)p, (int64_t)bytes};
    if (!bytes || sj_cuda_rec_op(&cc->e, SJ_REC_SET, rv, 2, -1)) return SJ_OK;
    sj_cuda_bind(cc->e.cuda);
    return SJ_CU(cc->e.cuda, cc->e.cuda->api.MemsetD8Async((CUdeviceptr)(uintptr_t)p, 0, bytes, cc->e.stream),
                 "zeroing a product's LayerNorm counters");
}

static sj_status finish(void *c) {
    sj_cuda_call *cc = c;
    sj_cuda *cu = cc->e.cuda;
    sj_status st = SJ_OK;
    int flag = 0;
    if (cc->sync) {
        sj_cuda_bind(cu);
        if (cc->e.error_flag)
            st = SJ_CU(cu, cu->api.MemcpyDtoHAsync(&flag, cc->e.error_flag, sizeof flag, cc->e.stream),
                       "reading the call's error flag");
        sj_status sst = SJ_CU(cu, cu->api.StreamSynchronize(cc->e.stream), "waiting for the call's kernels");
        if (!st) st = sst;
        if (!st && flag) st = sj_cuda_flag_status(flag);
    }
    if (cc->e.error_flag && cc->e.error_flag != cc->graph_flag) sj_cuda_free(cu, cc->e.error_flag, cc->e.stream);
    cc->e.error_flag = 0;
    return st;
}

static void *out_alloc(void *c, size_t bytes) {
    sj_cuda_call *cc = c;
    return (void *)(uintptr_t)sj_cuda_alloc(cc->e.cuda, bytes ? bytes : 1, cc->e.stream);
}

void sj_cuda_fill_call_slots(sj_backend *b) {
    b->device = SJ_CUDA;
    b->k = cuda_kernels;
    b->buf_alloc = buf_alloc;
    b->buf_free = buf_free;
    b->out_alloc = out_alloc;
    b->out_free = buf_free;
    b->launch = launch;
    b->gemm = gemm;
    b->buf_zero = buf_zero;
    b->finish = finish;
}

void sj_cuda_call_init(sj_cuda_call *c, sj_cuda *cuda, CUstream stream, bool sync, int n_syms) {
    memset(c, 0, sizeof *c);
    c->e.cuda = cuda;
    c->e.stream = stream;
    c->sync = sync;
    c->n_syms = n_syms;
    c->lane = -1;
}

/* -- A graph's constants and parameters on the device --------------------------------- */

static void release(void *ctx, sj_graph *g) {
    sj_cuda *cu = ctx;
    if (g->dev_consts) sj_cuda_free(cu, (CUdeviceptr)(uintptr_t)g->dev_consts, cu->stream);
    if (g->dev_params) {
        for (int i = 0; i < g->n_params; i++)
            if (g->params[i].device == SJ_HOST && g->dev_params[i].data)
                sj_cuda_free(cu, (CUdeviceptr)(uintptr_t)g->dev_params[i].data, cu->stream);
        free(g->dev_params);
    }
    g->dev_consts = NULL;
    g->dev_params = NULL;
}

/* Elements from a tensor's first to its last, strides as they are: the
 * caller's memory holds them (sj_tensor_check passed, strides >= 0). */
static size_t param_span(const sj_tensor *w) {
    size_t last = 0;
    for (int i = 0; i < w->rank; i++) {
        if (w->shape[i] == 0) return 0;
        last += (size_t)(w->shape[i] - 1) * (size_t)w->stride[i];
    }
    return last + 1;
}

sj_status sj_cuda_upload_graph(sj_cuda *cu, sj_graph *g) {
    g->dev_ctx = cu;
    g->dev_release = release;
    if (g->n_consts) {
        int64_t bits[256], *all = g->n_consts <= 256 ? bits : sj_malloc(sizeof(int64_t) * (size_t)g->n_consts);
        if (!all) return sj_seterr(SJ_ENOMEM, "out of memory uploading constants");
        for (int i = 0; i < g->n_consts; i++) all[i] = g->consts[i].bits;
        CUdeviceptr d = sj_cuda_alloc(cu, sizeof(int64_t) * (size_t)g->n_consts, cu->stream);
        sj_status st = d ? sj_cuda_to_device(cu, d, all, sizeof(int64_t) * (size_t)g->n_consts) : SJ_ENOMEM;
        if (all != bits) free(all);
        if (st) return st == SJ_ENOMEM && !d ? sj_seterr(SJ_ENOMEM, "out of device memory for constants") : st;
        g->dev_consts = (void *)(uintptr_t)d;
    }
    if (g->n_params) {
        g->dev_params = sj_calloc((size_t)g->n_params, sizeof *g->dev_params);
        if (!g->dev_params) return sj_seterr(SJ_ENOMEM, "out of memory uploading parameters");
        for (int i = 0; i < g->n_params; i++) {
            const sj_tensor *w = &g->params[i];
            g->dev_params[i] = *w;
            if (w->device == SJ_CUDA) continue; /* already device memory: used in place */
            /* a device copy of the host weight's span, strides kept: the
             * fused kernels address parameters with the strides they were
             * traced with (a sparse view costs its whole span) */
            g->dev_params[i].data = NULL; /* release frees what this loop allocated, never w->data */
            g->dev_params[i].device = SJ_CUDA;
            size_t bytes = param_span(w) * sj_dtype_size(w->dtype);
            CUdeviceptr p = sj_cuda_alloc(cu, bytes ? bytes : 1, cu->stream);
            if (!p) return sj_seterr(SJ_ENOMEM, "out of device memory for parameter %d (%zu bytes)", i, bytes);
            g->dev_params[i].data = (void *)(uintptr_t)p; /* recorded now, so release frees it on any failure below */
            sj_status st = bytes ? sj_cuda_to_device(cu, p, w->data, bytes) : SJ_OK;
            if (st) return st;
        }
    }
    return SJ_OK;
}

