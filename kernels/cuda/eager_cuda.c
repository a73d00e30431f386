/* Eager CUDA ops: the host side of kernels/cuda/eager.cu.
 *
 * Every op builds a by-value argument struct (kernels/cuda/eager_abi.cuh),
 * picks a kernel by op, dtype and layout, and launches it on e->stream with
 * cuLaunchKernel; nothing synchronizes. Elementwise operands are first
 * collapsed into a plan (size-1 axes dropped, axes ordered by the output's
 * strides, neighbours merged where every operand allows), so contiguous
 * tensors of any rank become one run and take the _c kernels.
 *
 * Float matmuls go through cuBLASLt (see "Matmul" below); everything else is
 * an eager.cu kernel.
 *
 * Threads: sj_cuda_eager_load/unload run once, at device open and close.
 * The ops may be called from any thread; the matmul algorithm cache is
 * guarded by its own mutex (held only for the lookup and the insert), and
 * the calls into the cuBLASLt handle by another (see eager_fns).
 */
#include "kernels/cuda/eager_cuda.h"

#include <assert.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/error.h"
#include "jit/ir/graph.h" /* sj_dtype_is_float */
#include "base/tensor.h"
#include "kernels/cuda/eager_abi.cuh"

/* -- Kernel table ------------------------------------------------------------ */

enum {
#define SJ_X(fam, tag) EK_##fam##_##tag,
    SJ_EK_LIST(SJ_X)
#undef SJ_X
    EK_COUNT
};

static const char *const ek_names[EK_COUNT] = {
#define SJ_X(fam, tag) "sj_ek_" #fam "_" #tag,
    SJ_EK_LIST(SJ_X)
#undef SJ_X
};

/* Families are indexed by dtype (sj_dtype order) or by log2(element size). */
_Static_assert(SJ_F32 == 0 && SJ_F16 == 1 && SJ_BF16 == 2 && SJ_I32 == 3 && SJ_I64 == 4 && SJ_BOOL == 5,
               "eager_abi.cuh lists dtype tags in sj_dtype order");
_Static_assert(EK_binary_c_bool - EK_binary_c_f32 == SJ_BOOL && EK_unary_s_i64 - EK_unary_s_f32 == SJ_I64 &&
                   EK_where_c_e8 - EK_where_c_e1 == 3,
               "kernel families are contiguous");
_Static_assert(EK_attention_tc_f16 == EK_attention_f32 + 3 && EK_attention_tc_bf16 == EK_attention_tc_f16 + 1 &&
                   EK_attention_tc1_f16 == EK_attention_tc_f16 + 2 && EK_attention_tc1_bf16 == EK_attention_tc_f16 + 3,
               "the attention kernels: f32, f16, bf16, then the tensor-core f16, bf16, then the one-tile f16, bf16");
_Static_assert(EK_attention_varlen_bf16 - EK_attention_varlen_f32 == SJ_BF16, "attention_varlen: f32, f16, bf16");
_Static_assert(EK_attention_mma32_f16 == EK_attention_tc1_bf16 + 1 && EK_attention_mma32_bf16 == EK_attention_mma32_f16 + 1 &&
                   EK_attention_mma64_f16 == EK_attention_mma32_f16 + 2 &&
                   EK_attention_mma96_f16 == EK_attention_mma32_f16 + 4 &&
                   EK_attention_mma128_f16 == EK_attention_mma32_f16 + 6 &&
                   EK_attention_mma128_bf16 == EK_attention_mma32_f16 + 7,
               "then the register kernels: f16, bf16 for D = 32, 64, 96, 128");
_Static_assert(EK_attention_mmam32_f16 == EK_attention_mma128_bf16 + 1 &&
                   EK_attention_mmam128_bf16 == EK_attention_mmam32_f16 + 7 &&
                   EK_attention_varlen_mma32_f16 == EK_varlen_check_i32 + 1 &&
                   EK_attention_varlen_mma128_bf16 == EK_attention_varlen_mma32_f16 + 7,
               "the masked register kernels after the others, the packed ones after varlen_check: f16, bf16 for "
               "D = 32, 64, 96, 128");

#define MM_SLOTS0 256 /* the algorithm table's first capacity (doubles when 3/4 full) */

typedef struct mm_key {
    int64_t v[18];
} mm_key;

typedef struct mm_algo {
    cublasLtMatmulAlgo_t algo;
    size_t ws; /* the workspace it needs (at most the key's limit) */
} mm_algo;

/* The algorithm table: open addressing, linear probing. A slot is written
 * once, under the lock, then published by a release store of `ready`;
 * lookups take no lock (an acquire load per slot probed), and slots are
 * never changed or removed. When 3/4 full the table is copied into one
 * twice the size, published with a release store; the old one stays (on
 * `older`) until the device's kernels are unloaded, since a lookup may
 * still be reading it. */
typedef struct mm_slot {
    _Atomic int ready;
    mm_key key;
    mm_algo a;
} mm_slot;

typedef struct mm_table {
    size_t cap, n; /* n: slots in use (written under the lock) */
    struct mm_table *older;
    mm_slot slot[];
} mm_table;

/* cuBLASLt's functions may be called from many threads at once, on one
 * handle. What may not be shared is a workspace: a product can be several
 * kernels (split-K and its reduction), and two threads queueing products
 * on one stream interleave them, so each product gets a workspace of its
 * own from the stream-ordered allocator, just the size its algorithm needs
 * (none for most). A shared one gave other threads' results to about one
 * call in ten with 8 threads on the runtime's stream (test_cuda_jit,
 * test_cuda_graphs_threads), and to graphs whose products used it. */
typedef struct eager_fns {
    CUfunction fn[EK_COUNT];
    pthread_mutex_t lock; /* serializes inserts into the algorithm table */
    _Atomic(mm_table *) mm;
    /* algorithm choices (heuristic queries and checks) and their time */
    _Atomic uint64_t choices, choice_ns;
    struct warmer *warm; /* warms size classes in the background (NULL until first needed) */
    pthread_mutex_t warm_lock; /* guards warm's creation and everything in it */
    _Atomic int warm_off;
    /* the runtime's job queue (sj_cuda_matmul_warm_post), NULL: the warmer's thread */
    bool (*post)(void *ctx, void (*run)(void *arg), void (*drop)(void *arg), void *arg);
    void *post_ctx;
} eager_fns;

static void warm_stop(sj_cuda *c);

sj_status sj_cuda_eager_load(sj_cuda *c) {
    if (c->eager)
        return SJ_OK;
    sj_cuda_bind(c);
    eager_fns *t = calloc(1, sizeof *t);
    if (!t)
        return sj_seterr(SJ_ENOMEM, "eager CUDA kernels: out of memory for the kernel table");
    CUmodule m = NULL;
    CUresult r = c->api.ModuleLoadData(&m, sj_eager_cuda_fatbin);
    if (r != CUDA_SUCCESS) {
        free(t);
        return sj_cuda_fail(c, r, "eager CUDA kernels: cuModuleLoadData of the embedded fatbin");
    }
    for (int i = 0; i < EK_COUNT; i++) {
        r = c->api.ModuleGetFunction(&t->fn[i], m, ek_names[i]);
        if (r != CUDA_SUCCESS) {
            char what[160];
            snprintf(what, sizeof what, "eager CUDA kernels: kernel %s missing from the module", ek_names[i]);
            sj_status st = sj_cuda_fail(c, r, what);
            c->api.ModuleUnload(m);
            free(t);
            return st;
        }
    }
    /* the attention kernels may take more than the default 48 KiB of shared
     * memory (the tensor-core ones always do): opted in once, up to the
     * device's limit. Per call, two threads setting different limits could
     * each launch under the other's. */
    for (int i = EK_attention_f32; i <= EK_attention_mmam128_bf16; i++) {
        r = c->api.FuncSetAttribute(t->fn[i], CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, c->max_smem_optin);
        if (r != CUDA_SUCCESS) {
            sj_status st = sj_cuda_fail(c, r, "eager CUDA kernels: opting attention in to its shared memory");
            c->api.ModuleUnload(m);
            free(t);
            return st;
        }
    }
    for (int i = EK_attention_varlen_f32; i <= EK_attention_varlen_mma128_bf16; i++) {
        if (i == EK_varlen_check_i32)
            continue;
        r = c->api.FuncSetAttribute(t->fn[i], CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, c->max_smem_optin);
        if (r != CUDA_SUCCESS) {
            sj_status st = sj_cuda_fail(c, r, "eager CUDA kernels: opting attention_varlen in to its shared memory");
            c->api.ModuleUnload(m);
            free(t);
            return st;
        }
    }
    mm_table *mt = calloc(1, sizeof *mt + MM_SLOTS0 * sizeof(mm_slot));
    if (!mt) {
        c->api.ModuleUnload(m);
        free(t);
        return sj_seterr(SJ_ENOMEM, "eager CUDA kernels: out of memory for the matmul algorithm table");
    }
    mt->cap = MM_SLOTS0;
    atomic_init(&t->mm, mt);
    pthread_mutex_init(&t->lock, NULL);
    pthread_mutex_init(&t->warm_lock, NULL);
    c->eager = m;
    c->eager_fns = t;
    return SJ_OK;
}

void sj_cuda_eager_unload(sj_cuda *c) {
    if (!c || !c->eager)
        return;
    sj_cuda_bind(c);
    eager_fns *t = c->eager_fns;
    warm_stop(c);
    c->api.ModuleUnload(c->eager);
    for (mm_table *mt = atomic_load(&t->mm), *next; mt; mt = next) {
        next = mt->older;
        free(mt);
    }
    pthread_mutex_destroy(&t->lock);
    pthread_mutex_destroy(&t->warm_lock);
    free(t);
    c->eager = NULL;
    c->eager_fns = NULL;
}

/* -- Helpers ------------------------------------------------------------------ */

static int log2_size(size_t es) { return es == 1 ? 0 : es == 2 ? 1 : es == 4 ? 2 : 3; }
static uint64_t dptr(const void *p) { return (uint64_t)(uintptr_t)p; }
static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

static int64_t numel(const sj_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->rank; i++) n *= t->shape[i];
    return n;
}

static void assert_same_shape(const sj_tensor *a, const sj_tensor *b) {
    assert(a->rank == b->rank);
    for (int i = 0; i < a->rank; i++) assert(a->shape[i] == b->shape[i]);
    (void)a, (void)b;
}

/* A grid of ceil(work / per_block) blocks, at most 32 waves of the SMs (the
 * kernels loop grid-stride over the rest). */
static unsigned grid_for(const sj_cuda *c, int64_t work, int64_t per_block) {
    int64_t g = (work + per_block - 1) / per_block, cap = (int64_t)(c->sm_count > 0 ? c->sm_count : 16) * 32;
    g = g < 1 ? 1 : g > cap ? cap : g;
    return (unsigned)g;
}

static sj_status launch(const sj_cuda_exec *e, int k, unsigned grid, unsigned bx, unsigned by, unsigned smem,
                        void *args) {
    sj_cuda *c = e->cuda;
    eager_fns *t = c->eager_fns;
    if (!t)
        return sj_seterr(SJ_EBACKEND, "%s: the eager CUDA kernels are not loaded", ek_names[k]);
    void *params[1] = {args};
    CUresult r = sj_cuda_launch_kernel(e, t->fn[k], grid, 1, 1, bx, by, 1, smem, params);
    if (r != CUDA_SUCCESS) {
        char what[160];
        snprintf(what, sizeof what, "launching %s (grid %u, block %ux%u, smem %u)", ek_names[k], grid, bx, by,
                 smem);
        return sj_cuda_fail(c, r, what);
    }
    return SJ_OK;
}

/* -- Layout plans ----------------------------------------------------------------
 * As kernels/cpu/cpu_int.h's cpu_plan: operands ts[0..nops) of ts[0]'s
 * shape; size-1 axes dropped, the rest ordered by ts[0]'s strides
 * (outermost first, stable), neighbours merged where every operand's
 * strides allow. Rank >= 1 (a single element is shape [1], strides 0). */

typedef struct plan {
    int rank, nops;
    int64_t shape[SJ_MAX_RANK];
    int64_t stride[SJ_EK_EW_OPS][SJ_MAX_RANK];
} plan;

static int64_t plan_init(plan *p, int nops, const sj_tensor *const *ts) {
    const sj_tensor *y = ts[0];
    int ax[SJ_MAX_RANK], n = 0;
    int64_t count = 1;
    assert(nops >= 1 && nops <= SJ_EK_EW_OPS && y->rank >= 0 && y->rank <= SJ_MAX_RANK);
    for (int i = 0; i < y->rank; i++) {
        count *= y->shape[i];
        if (y->shape[i] != 1)
            ax[n++] = i;
    }
    memset(p, 0, sizeof *p);
    p->nops = nops;
    if (count == 0)
        return 0;
    for (int i = 1; i < n; i++) {
        int a = ax[i], j = i;
        for (; j > 0 && y->stride[ax[j - 1]] < y->stride[a]; j--) ax[j] = ax[j - 1];
        ax[j] = a;
    }
    for (int i = 0; i < n; i++) {
        int a = ax[i], merge = p->rank > 0;
        for (int k = 0; k < nops && merge; k++)
            merge = p->stride[k][p->rank - 1] == ts[k]->stride[a] * y->shape[a];
        if (merge) {
            p->shape[p->rank - 1] *= y->shape[a];
            for (int k = 0; k < nops; k++) p->stride[k][p->rank - 1] = ts[k]->stride[a];
        } else {
            p->shape[p->rank] = y->shape[a];
            for (int k = 0; k < nops; k++) p->stride[k][p->rank] = ts[k]->stride[a];
            p->rank++;
        }
    }
    if (p->rank == 0) {
        p->rank = 1;
        p->shape[0] = 1;
    }
    return count;
}

/* q = (umulhi(i, mul) + i) >> shift == i / d for i < 2^31, 1 <= d <= 2^31. */
static void magic32(uint32_t d, uint32_t *mul, uint32_t *shift) {
    uint32_t s = 0;
    while (((uint64_t)1 << s) < d) s++;
    *mul = (uint32_t)(((((uint64_t)1 << s) - d) << 32) / d + 1);
    *shift = s;
}

/* Elementwise arguments from a plan; *contig tells whether the _c kernel
 * applies (one run, every operand of stride 1 or 0). */
static void ew_args(sj_ek_ew *a, const plan *p, const sj_tensor *const *ts, int64_t n, int *contig) {
    memset(a, 0, sizeof *a);
    a->n = n;
    a->rank = p->rank;
    a->idx32 = n < ((int64_t)1 << 31);
    for (int d = 0; d < p->rank; d++) {
        a->shape[d] = p->shape[d];
        if (a->idx32)
            magic32((uint32_t)p->shape[d], &a->div_mul[d], &a->div_shift[d]);
    }
    *contig = p->rank == 1;
    a->vec = 1;
    for (int k = 0; k < p->nops; k++) {
        size_t es = sj_dtype_size(ts[k]->dtype), al = 4 * es > 16 ? 16 : 4 * es;
        a->ptr[k] = dptr(ts[k]->data);
        for (int d = 0; d < p->rank; d++) a->stride[k][d] = p->stride[k][d];
        int64_t s = p->stride[k][0];
        if (p->rank == 1 && s != 0 && s != 1)
            *contig = 0;
        if (s != 0 && a->ptr[k] % al != 0)
            a->vec = 0;
    }
    if (n > 1 && p->stride[0][0] != 1)
        *contig = 0;
}

/* -- Elementwise --------------------------------------------------------------- */

/* Run an elementwise kernel over operands ts (ts[0] the result): kc the
 * contiguous (_c) kernel, used when the plan is one stride-1 run, else ks
 * (_s); op fills sj_ek_ew.op. */
static sj_status ew_run(const sj_cuda_exec *e, const sj_tensor *const *ts, int nts, int kc, int ks, int op) {
    plan p;
    int64_t n = plan_init(&p, nts, ts);
    if (n == 0)
        return SJ_OK;
    sj_ek_ew a;
    int contig;
    ew_args(&a, &p, ts, n, &contig);
    a.op = op;
    sj_cuda_bind(e->cuda);
    return launch(e, contig ? kc : ks, grid_for(e->cuda, n, SJ_EK_THREADS * (contig ? 4 : 1)), SJ_EK_THREADS, 1, 0,
                  &a);
}

sj_status sj_cuda_unary(const sj_cuda_exec *e, sj_op op, const sj_tensor *x, const sj_tensor *y) {
    assert(x->dtype == y->dtype && y->dtype != SJ_BOOL);
    assert(sj_dtype_is_float(y->dtype) || op == SJ_OP_NEG || op == SJ_OP_ABS || op == SJ_OP_RELU);
    assert_same_shape(x, y);
    const sj_tensor *ts[2] = {y, x};
    return ew_run(e, ts, 2, EK_unary_c_f32 + y->dtype, EK_unary_s_f32 + y->dtype, op);
}

sj_status sj_cuda_binary(const sj_cuda_exec *e, sj_op op, const sj_tensor *a, const sj_tensor *b,
                         const sj_tensor *y) {
    int cmp = op >= SJ_OP_EQ && op <= SJ_OP_GE;
    assert(cmp || (op >= SJ_OP_ADD && op <= SJ_OP_POW));
    assert(a->dtype == b->dtype && (cmp || a->dtype != SJ_BOOL));
    assert(cmp ? y->dtype == SJ_BOOL : y->dtype == a->dtype);
    assert_same_shape(a, y);
    assert_same_shape(b, y);
    const sj_tensor *ts[3] = {y, a, b};
    return ew_run(e, ts, 3, EK_binary_c_f32 + a->dtype, EK_binary_s_f32 + a->dtype, op);
}

sj_status sj_cuda_where(const sj_cuda_exec *e, const sj_tensor *c, const sj_tensor *a, const sj_tensor *b,
                        const sj_tensor *y) {
    assert(c->dtype == SJ_BOOL && a->dtype == y->dtype && b->dtype == y->dtype);
    assert_same_shape(c, y);
    assert_same_shape(a, y);
    assert_same_shape(b, y);
    const sj_tensor *ts[4] = {y, c, a, b};
    int k = log2_size(sj_dtype_size(y->dtype));
    return ew_run(e, ts, 4, EK_where_c_e1 + k, EK_where_s_e1 + k, 0);
}

sj_status sj_cuda_copy(const sj_cuda_exec *e, const sj_tensor *x, const sj_tensor *y) {
    assert(x->dtype >= 0 && x->dtype < SJ_DTYPE_COUNT && y->dtype >= 0 && y->dtype < SJ_DTYPE_COUNT);
    assert_same_shape(x, y);
    const sj_tensor *ts[2] = {y, x};
    plan p;
    int64_t n = plan_init(&p, 2, ts);
    if (n == 0)
        return SJ_OK;
    sj_cuda *c = e->cuda;
    sj_cuda_bind(c);
    if (x->dtype == y->dtype && p.rank == 1 && (n == 1 || (p.stride[0][0] == 1 && p.stride[1][0] == 1))) {
        const int64_t rv[3] = {(int64_t)dptr(y->data), (int64_t)dptr(x->data), n * (int64_t)sj_dtype_size(y->dtype)};
        if (sj_cuda_rec_op(e, SJ_REC_COPY, rv, 3, 2)) return SJ_OK; /* a bucket graph's copy, not run */
        CUresult r = c->api.MemcpyDtoDAsync(dptr(y->data), dptr(x->data), (size_t)n * sj_dtype_size(y->dtype), e->stream);
        return r == CUDA_SUCCESS ? SJ_OK : sj_cuda_fail(c, r, "copy: cuMemcpyDtoDAsync");
    }
    sj_ek_ew a;
    int contig;
    ew_args(&a, &p, ts, n, &contig);
    int k;
    if (x->dtype == y->dtype) {
        k = EK_copy_s_e1 + log2_size(sj_dtype_size(y->dtype));
        contig = 0;
    } else {
        k = (contig ? EK_cast_c_f32 : EK_cast_s_f32) + x->dtype;
        a.aux = y->dtype;
    }
    return launch(e, k, grid_for(c, n, SJ_EK_THREADS * (contig ? 4 : 1)), SJ_EK_THREADS, 1, 0, &a);
}

sj_status sj_cuda_copy_by_kernel(const sj_cuda_exec *e, CUdeviceptr dst, CUdeviceptr src, size_t bytes) {
    if (bytes == 0) return sj_seterr(SJ_EINVAL, "copy by kernel: no bytes");
    static const sj_dtype by_size[4] = {SJ_BOOL, SJ_F16, SJ_I32, SJ_I64};
    int k = 3; /* the widest element both pointers and the count are aligned to */
    while (k > 0 && ((dst | src | (CUdeviceptr)bytes) & (((CUdeviceptr)1 << k) - 1))) k--;
    sj_tensor x = {.dtype = by_size[k], .rank = 1, .shape = {(int64_t)(bytes >> k)}, .stride = {1},
                   .data = (void *)(uintptr_t)src, .device = SJ_CUDA};
    sj_tensor y = x;
    y.data = (void *)(uintptr_t)dst;
    const sj_tensor *ts[2] = {&y, &x};
    plan p;
    int64_t n = plan_init(&p, 2, ts);
    sj_ek_ew a;
    int contig;
    ew_args(&a, &p, ts, n, &contig);
    sj_cuda_bind(e->cuda);
    return launch(e, EK_copy_s_e1 + k, grid_for(e->cuda, n, SJ_EK_THREADS), SJ_EK_THREADS, 1, 0, &a);
}

/* y = 0 (zero bits, every dtype). */
static sj_status fill_zero(const sj_cuda_exec *e, const sj_tensor *y) {
    const sj_tensor *ts[1] = {y};
    plan p;
    int64_t n = plan_init(&p, 1, ts);
    if (n == 0)
        return SJ_OK;
    sj_ek_ew a;
    int contig;
    ew_args(&a, &p, ts, n, &contig);
    sj_cuda_bind(e->cuda);
    return launch(e, EK_fill_s_e1 + log2_size(sj_dtype_size(y->dtype)), grid_for(e->cuda, n, SJ_EK_THREADS),
                  SJ_EK_THREADS, 1, 0, &a);
}

/* -- Rows: reductions, softmax, norms ------------------------------------------------
 * The axis is dropped from x and y (size 1) and the rest planned over
 * (y, x). A row kernel takes short rows a warp each (block 32 x 8) and long
 * ones a block each (256 to 1024 threads). The col kernel serves an axis
 * that is not innermost when the rows are (x's innermost kept axis has
 * stride 1): 32 rows per block, the block's warps splitting the axis. */

static sj_tensor drop_axis(const sj_tensor *t, int axis) {
    sj_tensor v = *t;
    v.shape[axis] = 1;
    return v;
}

/* Fills a's row plan; returns the row count (0: nothing to do). */
static int64_t rows_args(sj_ek_rows *a, const sj_tensor *x, int axis, const sj_tensor *y) {
    sj_tensor xv = drop_axis(x, axis), yv = drop_axis(y, axis);
    const sj_tensor *ts[2] = {&yv, &xv};
    plan p;
    memset(a, 0, sizeof *a);
    int64_t rows = plan_init(&p, 2, ts);
    a->y = dptr(y->data);
    a->x = dptr(x->data);
    a->rank = p.rank;
    a->rows = rows;
    a->n = x->shape[axis];
    a->sx = x->stride[axis];
    a->sy = y->stride[axis];
    for (int d = 0; d < p.rank; d++) {
        a->shape[d] = p.shape[d];
        a->ystride[d] = p.stride[0][d];
        a->xstride[d] = p.stride[1][d];
    }
    return rows;
}

static int use_col(const sj_ek_rows *a) {
    int r = a->rank - 1;
    return a->shape[r] > 1 && a->xstride[r] == 1 && a->sx != 1 && a->n > 1;
}

/* Launch kernel row_k (or col_k when the col scheme applies and col_k >= 0). */
static sj_status rows_launch(const sj_cuda_exec *e, sj_ek_rows *a, int row_k, int col_k) {
    sj_cuda *c = e->cuda;
    sj_cuda_bind(c);
    if (col_k >= 0 && use_col(a)) {
        unsigned w = 1;
        while (w < 32 && (int64_t)w * 32 <= a->n) w *= 2; /* about 16 to 32 elements per thread */
        a->group = (int32_t)w;
        return launch(e, col_k, grid_for(c, a->rows, 32), 32, w, 0, a);
    }
    if (a->n <= 1024) {
        a->group = 1;
        return launch(e, row_k, grid_for(c, a->rows, 8), 32, 8, 0, a);
    }
    unsigned w = a->n >= 16384 ? 32 : a->n >= 4096 ? 16 : 8;
    a->group = (int32_t)w;
    return launch(e, row_k, grid_for(c, a->rows, 1), 32, w, 0, a);
}

sj_status sj_cuda_reduce(const sj_cuda_exec *e, sj_op op, const sj_tensor *x, int axis, const sj_tensor *y) {
    assert(op == SJ_OP_SUM || op == SJ_OP_MEAN || op == SJ_OP_AMAX);
    assert(x->dtype == y->dtype && x->rank == y->rank && x->dtype != SJ_BOOL);
    assert(op != SJ_OP_MEAN || sj_dtype_is_float(x->dtype));
    if (axis < 0)
        axis += x->rank;
    assert(axis >= 0 && axis < x->rank && y->shape[axis] == 1);
    assert(op != SJ_OP_AMAX || x->shape[axis] > 0);
    sj_ek_rows a;
    if (rows_args(&a, x, axis, y) == 0)
        return SJ_OK;
    a.op = op;
    return rows_launch(e, &a, EK_reduce_row_f32 + x->dtype, EK_reduce_col_f32 + x->dtype);
}

sj_status sj_cuda_softmax(const sj_cuda_exec *e, const sj_tensor *x, int axis, const sj_tensor *y) {
    assert(x->dtype == y->dtype && sj_dtype_is_float(x->dtype));
    assert_same_shape(x, y);
    if (axis < 0)
        axis += x->rank;
    assert(axis >= 0 && axis < x->rank);
    sj_ek_rows a;
    if (x->shape[axis] == 0 || rows_args(&a, x, axis, y) == 0)
        return SJ_OK;
    return rows_launch(e, &a, EK_softmax_row_f32 + x->dtype, EK_softmax_col_f32 + x->dtype);
}

static sj_status norm(const sj_cuda_exec *e, const sj_tensor *x, const sj_tensor *g, const sj_tensor *b,
                      double eps, const sj_tensor *y, int rms) {
    assert(x->rank >= 1 && x->dtype == y->dtype && sj_dtype_is_float(x->dtype));
    assert_same_shape(x, y);
    int axis = x->rank - 1;
    sj_ek_rows a;
    if (x->shape[axis] == 0 || rows_args(&a, x, axis, y) == 0)
        return SJ_OK;
    if (g) {
        assert(g->dtype == x->dtype && g->rank == 1 && g->shape[0] == a.n);
        a.g = dptr(g->data);
        a.sg = g->stride[0];
    }
    if (b) {
        assert(b->dtype == x->dtype && b->rank == 1 && b->shape[0] == a.n);
        a.b = dptr(b->data);
        a.sb = b->stride[0];
    }
    a.eps = (float)eps;
    a.op = rms;
    return rows_launch(e, &a, EK_norm_row_f32 + x->dtype, -1);
}

sj_status sj_cuda_layer_norm(const sj_cuda_exec *e, const sj_tensor *x, const sj_tensor *g, const sj_tensor *b,
                             double eps, const sj_tensor *y) {
    return norm(e, x, g, b, eps, y, 0);
}

sj_status sj_cuda_rms_norm(const sj_cuda_exec *e, const sj_tensor *x, const sj_tensor *g, double eps,
                           const sj_tensor *y) {
    return norm(e, x, g, NULL, eps, y, 1);
}

/* -- Matmul ------------------------------------------------------------------------
 * cuBLASLt is column-major. A matrix P (R x C, element (r, c) at r * sr +
 * c * sc) is "column-major" when sr == 1 (ld = sc) and "row-major" when
 * sc == 1 (ld = sr); a size-1 axis takes any stride. The product is written
 * as D = op(A) op(B) with D column-major:
 * - y row-major: D = y^T (N x M) = b^T a^T, A = b^T, B = a^T;
 * - y column-major: D = y (M x N) = a b;
 * - otherwise y goes through a contiguous temporary, then a copy.
 * A column-major operand is passed with op N, a row-major one as its
 * transpose with op T; any other is first packed row-major (contiguous)
 * into the allocator. Batch axes (collapsed over y, a, b) become strided
 * batches over the innermost one (stride 0 for a broadcast operand) and a
 * host loop over the others; when b is shared by every batch and the batch
 * and M axes of a and y merge, one product with M' = batch * M. f32, f16
 * and bf16 all compute in f32 (CUBLAS_COMPUTE_32F; f32 in TF32 with cuda_tf32). The
 * heuristic is told the real alignment of every pointer, leading dimension
 * and batch stride (it assumes 256 bytes otherwise); should it find no
 * algorithm, the product is retried once with every operand and the result
 * in 16-byte-aligned padded buffers. The algorithm is cached per size
 * class of m and n (see lt_gemm), k, layout and alignment, in a table
 * read without a lock (mm_table). A bias (sj_cuda_matmul_bias) goes into cuBLASLt's bias
 * epilogue when y is row-major (the bias then runs along D's rows) and it
 * is contiguous and 16-byte aligned; else a binary kernel adds it after. */

typedef struct lt_mat {
    CUdeviceptr p;
    uint64_t rows, cols; /* as stored (column-major) */
    int64_t ld, bstride;
    int trans;
} lt_mat;

/* Column-major view of the logical R x C matrix with strides (sr, sc); 0
 * when it is not one. */
static int as_col(int64_t R, int64_t C, int64_t sr, int64_t sc, int64_t *ld) {
    int64_t r1 = R > 1 ? R : 1;
    if ((R <= 1 || sr == 1) && (C <= 1 || sc >= r1)) {
        *ld = C <= 1 ? r1 : sc;
        return *ld <= INT32_MAX;
    }
    return 0;
}

/* Logical R x C operand as an lt_mat: column-major (op N) or row-major
 * (stored transposed, op T). 0 when neither. */
static int lt_operand(lt_mat *m, CUdeviceptr p, int64_t R, int64_t C, int64_t sr, int64_t sc) {
    int64_t ld;
    if (as_col(R, C, sr, sc, &ld)) {
        *m = (lt_mat){p, (uint64_t)R, (uint64_t)C, ld, 0, 0};
        return 1;
    }
    if (as_col(C, R, sc, sr, &ld)) {
        *m = (lt_mat){p, (uint64_t)C, (uint64_t)R, ld, 0, 1};
        return 1;
    }
    return 0;
}

/* The largest power of two (<= 256) dividing bits. */
static uint32_t align256(uint64_t bits) {
    bits |= 256;
    return (uint32_t)(bits & (~bits + 1));
}

/* ... dividing the pointer and the byte strides. */
static uint32_t lt_align(const lt_mat *m, size_t es, int batched) {
    return align256(m->p | (uint64_t)m->ld * es | (batched ? (uint64_t)m->bstride * es : 0));
}

static cudaDataType_t lt_type(sj_dtype dt) {
    return dt == SJ_F16 ? CUDA_R_16F : dt == SJ_BF16 ? CUDA_R_16BF : CUDA_R_32F;
}

static sj_status lt_err(cublasStatus_t s, const char *what) {
    return sj_seterr(SJ_EBACKEND, "matmul: %s failed (cublasStatus %d)", what, (int)s);
}

/* The size class of a product dimension for choosing its algorithm: a
 * power of two up to 64, then 4 classes per octave (multiples of 64 up to
 * 512, of 128 up to 1024, ...); multiples of 64 are their own class. */
static uint64_t lt_class(uint64_t x) {
    if (x % 64 == 0)
        return x;
    if (x < 64) {
        uint64_t p = 1;
        while (p < x)
            p <<= 1;
        return p;
    }
    uint64_t top = 64;
    while (top * 2 <= x)
        top <<= 1;
    uint64_t g = top / 4 > 64 ? top / 4 : 64;
    return (x + g - 1) / g * g;
}

static uint64_t mm_hash(const mm_key *key) {
    uint64_t h = 0x9E3779B97F4A7C15ull;
    for (int i = 0; i < (int)(sizeof key->v / sizeof key->v[0]); i++) {
        h ^= (uint64_t)key->v[i];
        h *= 0xBF58476D1CE4E5B9ull;
        h ^= h >> 29;
    }
    return h;
}

/* The slot holding key (*hit 1), or the empty slot where it would go (*hit
 * 0), in mt. The verdict is the probe's own: a slot another thread
 * publishes after the probe saw it empty may hold another key. */
static mm_slot *mm_probe(mm_table *mt, const mm_key *key, uint64_t h, int *hit) {
    for (size_t i = h & (mt->cap - 1);; i = (i + 1) & (mt->cap - 1)) {
        mm_slot *sl = &mt->slot[i];
        if (!atomic_load_explicit(&sl->ready, memory_order_acquire)) {
            *hit = 0;
            return sl;
        }
        if (!memcmp(&sl->key, key, sizeof *key)) {
            *hit = 1;
            return sl;
        }
    }
}

static int mm_lookup(eager_fns *t, const mm_key *key, mm_algo *algo) {
    int hit;
    mm_slot *sl = mm_probe(atomic_load_explicit(&t->mm, memory_order_acquire), key, mm_hash(key), &hit);
    if (hit)
        *algo = sl->a;
    return hit;
}

/* Locked. Write and publish a slot of mt (which has room). */
static void mm_put(mm_table *mt, const mm_key *key, const mm_algo *algo, uint64_t h) {
    int hit;
    mm_slot *sl = mm_probe(mt, key, h, &hit);
    if (hit)
        return; /* another thread's choice for the same key is there */
    sl->key = *key;
    sl->a = *algo;
    mt->n++;
    atomic_store_explicit(&sl->ready, 1, memory_order_release);
}

static void mm_insert(eager_fns *t, const mm_key *key, const mm_algo *algo) {
    pthread_mutex_lock(&t->lock);
    mm_table *mt = atomic_load_explicit(&t->mm, memory_order_relaxed);
    if ((mt->n + 1) * 4 > mt->cap * 3) {
        mm_table *big = calloc(1, sizeof *big + 2 * mt->cap * sizeof(mm_slot));
        if (!big) { /* not cached then: chosen again next time */
            pthread_mutex_unlock(&t->lock);
            return;
        }
        big->cap = 2 * mt->cap;
        big->older = mt;
        for (size_t i = 0; i < mt->cap; i++)
            if (atomic_load_explicit(&mt->slot[i].ready, memory_order_relaxed))
                mm_put(big, &mt->slot[i].key, &mt->slot[i].a, mm_hash(&mt->slot[i].key));
        atomic_store_explicit(&t->mm, big, memory_order_release);
        mt = big;
    }
    mm_put(mt, key, algo, mm_hash(key));
    pthread_mutex_unlock(&t->lock);
}

/* The heuristic's preference: the workspace, and every operand's real
 * alignment (al: A, B, and C = D). */
static sj_status lt_pref(const sj_cuda_api *api, uint64_t ws_bytes, const uint32_t *al,
                         cublasLtMatmulPreference_t *pref) {
    cublasStatus_t s = api->LtMatmulPreferenceCreate(pref);
    if (s != CUBLAS_STATUS_SUCCESS) {
        *pref = NULL;
        return lt_err(s, "cublasLtMatmulPreferenceCreate");
    }
    s = api->LtMatmulPreferenceSetAttribute(*pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                            sizeof ws_bytes);
    if (s != CUBLAS_STATUS_SUCCESS)
        return lt_err(s, "setting MAX_WORKSPACE_BYTES");
    const cublasLtMatmulPreferenceAttributes_t aa[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4; i++)
        if ((s = api->LtMatmulPreferenceSetAttribute(*pref, aa[i], &al[i < 3 ? i : 2], sizeof al[0])) !=
            CUBLAS_STATUS_SUCCESS)
            return lt_err(s, "setting MIN_ALIGNMENT");
    return SJ_OK;
}

/* The heuristic's best algorithm for the product as laid out (lay: A, B,
 * and C = D); *no_algo set when it has none. */
static sj_status lt_heuristic(const sj_cuda_exec *e, cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t *lay,
                              cublasLtMatmulPreference_t pref, mm_algo *algo, int *no_algo, sj_dtype dt, uint64_t m,
                              uint64_t n, uint64_t k, int batch) {
    sj_cuda *c = e->cuda;
    cublasLtMatmulHeuristicResult_t res;
    int nres = 0;
    cublasStatus_t s = c->api.LtMatmulAlgoGetHeuristic(c->lt, op, lay[0], lay[1], lay[2], lay[2], pref, 1, &res, &nres);
    if (s != CUBLAS_STATUS_SUCCESS)
        return lt_err(s, "cublasLtMatmulAlgoGetHeuristic");
    if (nres < 1) {
        *no_algo = 1;
        return sj_seterr(SJ_EBACKEND, "matmul: cuBLASLt has no algorithm for %s %llux%llux%llu (batch %d)",
                         dt == SJ_F32 ? "f32" : dt == SJ_F16 ? "f16" : "bf16", (unsigned long long)m,
                         (unsigned long long)n, (unsigned long long)k, batch);
    }
    *algo = (mm_algo){res.algo, res.workspaceSize};
    return SJ_OK;
}

/* The heuristic's algorithm for the product with the class sizes `dims`
 * (rows and columns of A, B and D as stored), if cublasLtMatmulAlgoCheck
 * accepts it for the real layouts `lay` within ws_bytes of workspace.
 * Its cache entry is shared by every size of the class, so the workspace
 * it asks for is the class sizes' (a split product's grows with them). */
static int lt_class_choice(sj_cuda *c, cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t *lay, const lt_mat *const *mats,
                           const uint64_t (*dims)[2], cudaDataType_t ty, cublasLtMatmulPreference_t pref,
                           uint64_t ws_bytes, mm_algo *algo) {
    const sj_cuda_api *api = &c->api;
    cublasLtMatrixLayoutOpaque_t ql_mem[3];
    cublasLtMatrixLayout_t ql[3] = {&ql_mem[0], &ql_mem[1], &ql_mem[2]};
    cublasStatus_t s = CUBLAS_STATUS_SUCCESS;
    for (int i = 0; i < 3 && s == CUBLAS_STATUS_SUCCESS; i++) {
        int64_t ld = mats[i]->ld > (int64_t)dims[i][0] ? mats[i]->ld : (int64_t)dims[i][0];
        s = api->LtMatrixLayoutInit(ql[i], sizeof ql_mem[i], ty, dims[i][0], dims[i][1], ld);
    }
    cublasLtMatmulHeuristicResult_t res, chk;
    int nres = 0;
    if (s == CUBLAS_STATUS_SUCCESS)
        s = api->LtMatmulAlgoGetHeuristic(c->lt, op, ql[0], ql[1], ql[2], ql[2], pref, 1, &res, &nres);
    if (s == CUBLAS_STATUS_SUCCESS && nres > 0)
        s = api->LtMatmulAlgoCheck(c->lt, op, lay[0], lay[1], lay[2], lay[2], &res.algo, &chk);
    if (s != CUBLAS_STATUS_SUCCESS || nres < 1)
        return 0;
    /* the workspace for the class's largest sizes, which covers every size
     * in the class (the cache entry serves them all, the class's own size
     * unclassed among them) */
    size_t need = res.workspaceSize > chk.workspaceSize ? res.workspaceSize : chk.workspaceSize;
    if (need > ws_bytes)
        return 0;
    *algo = (mm_algo){res.algo, need};
    return 1;
}

/* One more algorithm chosen (sj_cuda_matmul_choices), begun at t0. */
static void count_choice(eager_fns *t, int64_t t0) {
    atomic_fetch_add_explicit(&t->choices, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&t->choice_ns, (uint64_t)(sj_now_ns() - t0), memory_order_relaxed);
}

/* sj_cuda_test_reject_class: products run with a size class's algorithm
 * that are still to be refused. */
static _Atomic int test_reject_class;

int sj_cuda_test_reject_class(int n) { return atomic_exchange(&test_reject_class, n); }

static void warm_note(const sj_cuda_exec *e, sj_dtype dt, uint64_t m, uint64_t n, uint64_t k, const lt_mat *A,
                      const lt_mat *B, const lt_mat *D, int batch, CUdeviceptr bias);

/* D (m x n) = op(A) op(B) over `batch` strided batches; plus bias (m
 * elements of D's type, contiguous; 0: none) on every column, by
 * cuBLASLt's bias epilogue. */
static sj_status lt_gemm(const sj_cuda_exec *e, sj_dtype dt, uint64_t m, uint64_t n, uint64_t k,
                         const lt_mat *A, const lt_mat *B, const lt_mat *D, int batch, CUdeviceptr bias,
                         int *no_algo) {
    sj_cuda *c = e->cuda;
    eager_fns *t = c->eager_fns;
    const sj_cuda_api *api = &c->api;
    size_t es = sj_dtype_size(dt);
    cudaDataType_t ty = lt_type(dt);
    int batched = batch > 1;
    uint32_t al[3] = {lt_align(A, es, batched), lt_align(B, es, batched), lt_align(D, es, batched)};
    /* the workspace limit: a graph's own workspace, else the device's
     * limit for one taken from the allocator per product */
    uint64_t ws_bytes = e->ws ? e->ws_bytes : c->lt_workspace_bytes;
    if (e->rec) { /* a bucket graph: the product as captured, n (the rows of a row-major result) may shrink */
        const int64_t rv[SJ_REC_LT_VALS] = {dt, A->trans, B->trans, (int64_t)m, (int64_t)n, (int64_t)k, A->ld, B->ld, D->ld,
                                batch, A->bstride, B->bstride, D->bstride, (int64_t)A->p, (int64_t)B->p,
                                (int64_t)D->p, (int64_t)bias, (int64_t)e->ws};
        _Static_assert(SJ_REC_LT_PTRS == 13 && SJ_REC_LT_ROWS == 4, "rv's layout: n at 4, A B D bias at 13..16");
        if (sj_cuda_rec_op(e, SJ_REC_LT, rv, SJ_REC_LT_VALS, batch == 1 ? SJ_REC_LT_ROWS : -1)) return SJ_OK;
    }
    if (c->count_launches) atomic_fetch_add_explicit(&c->n_products, 1, memory_order_relaxed);
    cublasLtMatmulDescOpaque_t op_mem; /* descriptors in place: no allocation */
    cublasLtMatrixLayoutOpaque_t lay_mem[3];
    cublasLtMatmulDesc_t op = &op_mem;
    cublasLtMatrixLayout_t lay[3] = {&lay_mem[0], &lay_mem[1], &lay_mem[2]};
    cublasLtMatmulPreference_t pref = NULL;
    const lt_mat *mats[3] = {A, B, D};
    sj_status st = SJ_OK;
    cublasStatus_t s;
    int32_t ta = A->trans ? CUBLAS_OP_T : CUBLAS_OP_N, tb = B->trans ? CUBLAS_OP_T : CUBLAS_OP_N;
#define LT(call, what)                                                                             \
    if ((s = (call)) != CUBLAS_STATUS_SUCCESS) {                                                   \
        st = lt_err(s, what);                                                                      \
        goto done;                                                                                 \
    }
    /* f32 in TF32 when asked (cuda_tf32); the compute type is fixed per
     * device, so the algorithm cache's keys need not hold it */
    cublasComputeType_t ct = dt == SJ_F32 && c->lt_tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    LT(api->LtMatmulDescInit(op, sizeof op_mem, ct, CUDA_R_32F), "cublasLtMatmulDescInit");
    LT(api->LtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta), "setting TRANSA");
    LT(api->LtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb), "setting TRANSB");
    if (bias) { /* set before the heuristic, which reads the pointer's alignment */
        uint32_t epi = CUBLASLT_EPILOGUE_BIAS;
        const void *bp = (const void *)(uintptr_t)bias;
        LT(api->LtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi), "setting EPILOGUE");
        LT(api->LtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bp, sizeof bp),
           "setting BIAS_POINTER");
    }
    for (int i = 0; i < 3; i++) {
        const lt_mat *mm = mats[i];
        LT(api->LtMatrixLayoutInit(lay[i], sizeof lay_mem[i], ty, mm->rows, mm->cols, mm->ld),
           "cublasLtMatrixLayoutInit");
        if (batched) {
            int32_t cnt = batch;
            int64_t bs = mm->bstride;
            LT(api->LtMatrixLayoutSetAttribute(lay[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &cnt, sizeof cnt),
               "setting BATCH_COUNT");
            LT(api->LtMatrixLayoutSetAttribute(lay[i], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &bs,
                                               sizeof bs),
               "setting STRIDED_BATCH_OFFSET");
        }
    }
    /* The algorithm is chosen for the product with m and n rounded up to
     * their size class (lt_class) and cached under that class, so that a
     * stream of new lengths reuses a few algorithms rather than asking the
     * heuristic, and loading a new kernel, for every length. An algorithm
     * that cuBLASLt rejects for the real sizes (cublasLtMatmulAlgoCheck on
     * first choice, the product's own status later) gives way to one chosen
     * for the exact sizes, cached under them. */
    uint64_t mc = batched ? m : lt_class(m), nc = batched ? n : lt_class(n);
    int classed = mc != m || nc != n;
    mm_key key = {{dt, ta, tb, (int64_t)mc, (int64_t)nc, (int64_t)k, A->ld, B->ld, D->ld, batch,
                   batched ? A->bstride : 0, batched ? B->bstride : 0, batched ? D->bstride : 0, al[0], al[1],
                   al[2], (int64_t)ws_bytes, bias ? (int64_t)align256(bias) : 0}};
    /* the exact sizes' key: a class key cannot equal it (its m and n are
     * both class sizes, which a classed product's are not) */
    mm_key exact = key;
    exact.v[3] = (int64_t)m, exact.v[4] = (int64_t)n;
    mm_algo algo;
    int found = mm_lookup(t, &key, &algo);
    if (!found && classed && mm_lookup(t, &exact, &algo))
        found = 1, classed = 0; /* the class's algorithm failed these sizes before */
    int64_t t_choice = found ? 0 : sj_now_ns();
    if (!found) {
        if ((st = lt_pref(api, ws_bytes, al, &pref)))
            goto done;
        if (classed) {
            const uint64_t dims[3][2] = {{A->trans ? k : mc, A->trans ? mc : k},
                                         {B->trans ? nc : k, B->trans ? k : nc}, {mc, nc}};
            found = lt_class_choice(c, op, lay, mats, dims, ty, pref, ws_bytes, &algo);
            if (found) {
                mm_insert(t, &key, &algo);
                warm_note(e, dt, m, n, k, A, B, D, batch, bias);
            }
            else
                classed = 0; /* the exact sizes' own algorithm, below */
        }
        if (!found) {
            st = lt_heuristic(e, op, lay, pref, &algo, no_algo, dt, m, n, k, batch);
            if (st)
                goto done;
            mm_insert(t, &exact, &algo);
        }
        count_choice(t, t_choice);
    }
    const float one = 1.0f, zero = 0.0f;
    for (;;) {
        size_t need = algo.ws;
        CUdeviceptr ws = e->ws;
        if (!ws && need) {
            ws = sj_cuda_alloc(c, need, e->stream);
            if (!ws) {
                st = sj_seterr(SJ_ENOMEM, "matmul: out of device memory for a %zu-byte cuBLASLt workspace", need);
                goto done;
            }
        }
        if (classed && atomic_load_explicit(&test_reject_class, memory_order_relaxed) > 0 &&
            atomic_fetch_sub(&test_reject_class, 1) > 0)
            s = CUBLAS_STATUS_NOT_SUPPORTED; /* a test's: as if cuBLASLt had refused these sizes */
        else {
            bool timed = c->time_launches && !e->rec && sj_cuda_timed_begin(c, e->stream, NULL); /* (benchmarks) */
            s = api->LtMatmul(c->lt, op, &one, (const void *)(uintptr_t)A->p, lay[0],
                              (const void *)(uintptr_t)B->p, lay[1], &zero, (const void *)(uintptr_t)D->p, lay[2],
                              (void *)(uintptr_t)D->p, lay[2], &algo.algo, (void *)(uintptr_t)ws, need,
                              (cudaStream_t)e->stream);
            if (timed) sj_cuda_timed_end(c, e->stream);
        }
        if (ws != e->ws) /* stream-ordered: reused only by work queued after this product */
            sj_cuda_free(c, ws, e->stream);
        if (!classed || (s != CUBLAS_STATUS_NOT_SUPPORTED && s != CUBLAS_STATUS_INVALID_VALUE))
            break;
        /* the class's algorithm does not run these sizes: the exact one */
        classed = 0;
        if (mm_lookup(t, &exact, &algo))
            continue;
        t_choice = sj_now_ns();
        if (!pref && (st = lt_pref(api, ws_bytes, al, &pref)))
            goto done;
        st = lt_heuristic(e, op, lay, pref, &algo, no_algo, dt, m, n, k, batch);
        if (st)
            goto done;
        mm_insert(t, &exact, &algo);
        count_choice(t, t_choice);
    }
    LT(s, "cublasLtMatmul");
#undef LT
done:
    if (pref)
        api->LtMatmulPreferenceDestroy(pref);
    return st;
}

/* -- Warming size classes ----------------------------------------------------------
 * The first product run with a cuBLASLt algorithm never run before costs
 * 3.5-4.5 ms on an H200 (0.2 ms of it the choice), and a stream of new
 * lengths meets a new size class now and then: w5's first pass had three
 * requests of 7-8 ms for it. So when a product chooses the algorithm of a
 * new class of its n (the tokens of a linear layer: D = y^T, n its columns
 * and B's, which no leading dimension depends on), a background thread
 * runs the same product at every class size from 1 to max(512, twice n)
 * on scratch memory whose pointers have the real operands' alignments, so
 * that each class's algorithm is chosen and cached under the key a real
 * product will look up, and its kernel has run once. Off the request path
 * on a stream of its own; one job per product shape (a few at most per
 * model), never queued twice; skipped when the queue is full. Products in
 * batches, in a CUDA graph, or with B transposed are not warmed. In a
 * runtime the jobs are posted to its one background job queue (the device
 * table's set_post) and run by its workers, or with compile_threads 0 by
 * the thread that steps it, one at a time (run_lock) on the warmer's
 * stream; a device used alone, a runtime in sync or off compile mode, or
 * a job the queue refuses (past job_queue_max) has the warmer's own thread
 * run them from its queue. */

enum { WARM_QUEUE = 16, WARM_DONE = 64, WARM_MAX_N = 4096 };

typedef struct warm_job {
    sj_dtype dt;
    uint64_t m, n, k;
    lt_mat A, B, D;      /* as the product had them (p: only its alignment is used) */
    CUdeviceptr bias;    /* likewise; 0: none */
} warm_job;

/* A job's product shape without n: what makes two jobs the same. */
typedef struct warm_shape {
    int64_t v[15];
} warm_shape;

typedef struct warmer {
    pthread_cond_t wake, idle;
    pthread_t thread;
    bool has_thread;  /* started (on the first job the queue would not take) */
    warm_job queue[WARM_QUEUE];
    int head, n_queued, busy;
    int posted;       /* jobs posted to the runtime's queue, not yet run or dropped */
    warm_shape done[WARM_DONE]; /* the shapes of the jobs queued so far */
    int n_done;
    bool stop;
    pthread_mutex_t run_lock; /* posted jobs: one at a time, on stream */
    CUstream stream;          /* posted jobs' (made by the first; under run_lock) */
} warmer;

/* A job posted to the runtime's queue. */
typedef struct posted_job {
    sj_cuda *c;
    warm_job j;
} posted_job;

/* Where in a 256-byte-aligned scratch block a pointer with p's alignment
 * goes, so that the key's alignments match the real product's. */
static uint64_t align_offset(uint64_t p) { return align256(p) % 256; }

static warm_shape shape_of(const warm_job *j) {
    return (warm_shape){{j->dt, (int64_t)j->m, (int64_t)j->k, (int64_t)j->A.rows, (int64_t)j->A.cols, j->A.ld,
                         j->A.trans, (int64_t)j->B.rows, j->B.ld, (int64_t)j->D.rows, j->D.ld,
                         (int64_t)align_offset(j->A.p), (int64_t)align_offset(j->B.p),
                         (int64_t)align_offset(j->D.p), j->bias ? (int64_t)align256(j->bias) : 0}};
}

/* Whether the warmer was told to stop (unload). */
static bool warm_stopping(eager_fns *t) {
    pthread_mutex_lock(&t->warm_lock);
    bool stop = t->warm->stop;
    pthread_mutex_unlock(&t->warm_lock);
    return stop;
}

static void warm_run(sj_cuda *c, CUstream s, const warm_job *j) {
    size_t es = sj_dtype_size(j->dt);
    uint64_t top = lt_class(2 * j->n);
    top = top < 512 ? 512 : top > WARM_MAX_N ? WARM_MAX_N : top;
    size_t bytes[4] = {(size_t)j->A.ld * j->A.cols * es, (size_t)j->B.ld * top * es, (size_t)j->D.ld * top * es,
                       j->bias ? (size_t)j->m * es : 0};
    CUdeviceptr base[4] = {0, 0, 0, 0};
    int ok = 1;
    for (int i = 0; i < 4 && ok; i++)
        if (bytes[i])
            ok = (base[i] = sj_cuda_alloc(c, bytes[i] + 256, s)) != 0;
    sj_cuda_exec e = {.cuda = c, .stream = s};
    for (uint64_t x = 1; ok && x <= top;) {
        uint64_t cl = lt_class(x);
        lt_mat A = j->A, B = j->B, D = j->D;
        A.p = base[0] + align_offset(j->A.p);
        B.p = base[1] + align_offset(j->B.p), B.cols = cl;
        D.p = base[2] + align_offset(j->D.p), D.cols = cl;
        int no_algo = 0;
        if (lt_gemm(&e, j->dt, j->m, cl, j->k, &A, &B, &D, 1, j->bias ? base[3] + align_offset(j->bias) : 0, &no_algo))
            sj_clearerr(); /* that class is chosen by its first real product instead */
        x = cl + 1;
        ok = !warm_stopping(c->eager_fns);
    }
    c->api.StreamSynchronize(s);
    for (int i = 0; i < 4; i++)
        sj_cuda_free(c, base[i], s);
}

static void *warm_main(void *p) {
    sj_cuda *c = p;
    eager_fns *t = c->eager_fns;
    warmer *w = t->warm;
    sj_cuda_bind(c);
    CUstream s = NULL;
    pthread_mutex_lock(&t->warm_lock);
    for (;;) {
        while (!w->stop && !w->n_queued)
            pthread_cond_wait(&w->wake, &t->warm_lock);
        if (w->stop)
            break;
        warm_job j = w->queue[w->head];
        w->head = (w->head + 1) % WARM_QUEUE;
        w->n_queued--;
        w->busy = 1;
        pthread_mutex_unlock(&t->warm_lock);
        if (s || c->api.StreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS)
            warm_run(c, s, &j);
        pthread_mutex_lock(&t->warm_lock);
        w->busy = 0;
        if (!w->n_queued)
            pthread_cond_broadcast(&w->idle);
    }
    pthread_mutex_unlock(&t->warm_lock);
    if (s) {
        c->api.StreamSynchronize(s);
        /* blocks freed on s stay cached under its handle: released with the device */
        c->api.StreamDestroy(s);
    }
    return NULL;
}

/* A posted job is over (run or dropped): counted off, waiters woken. */
static void posted_done(posted_job *pj) {
    eager_fns *t = pj->c->eager_fns;
    pthread_mutex_lock(&t->warm_lock);
    warmer *w = t->warm;
    w->posted--;
    pthread_cond_broadcast(&w->idle); /* settle's waiters and warm_stop look again */
    pthread_mutex_unlock(&t->warm_lock);
    free(pj);
}

/* A posted job, on one of the runtime's background workers (no lock held). */
static void posted_run(void *arg) {
    posted_job *pj = arg;
    sj_cuda *c = pj->c;
    eager_fns *t = c->eager_fns;
    warmer *w = t->warm; /* made before the job was posted; freed only once no job is posted */
    sj_cuda_bind(c);
    pthread_mutex_lock(&w->run_lock);
    if (!warm_stopping(t) && (w->stream || c->api.StreamCreate(&w->stream, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS))
        warm_run(c, w->stream, &pj->j);
    pthread_mutex_unlock(&w->run_lock);
    posted_done(pj);
}

static void posted_drop(void *arg) { posted_done(arg); }

static void warm_note(const sj_cuda_exec *e, sj_dtype dt, uint64_t m, uint64_t n, uint64_t k, const lt_mat *A,
                      const lt_mat *B, const lt_mat *D, int batch, CUdeviceptr bias) {
    sj_cuda *c = e->cuda;
    eager_fns *t = c->eager_fns;
    if (batch > 1 || e->ws || B->trans || B->cols != n || D->cols != n || lt_class(m) != m || n > WARM_MAX_N ||
        atomic_load_explicit(&t->warm_off, memory_order_relaxed))
        return;
    warm_job j = {dt, m, n, k, *A, *B, *D, bias};
    warm_shape shape = shape_of(&j);
    pthread_mutex_lock(&t->warm_lock);
    warmer *w = t->warm;
    if (!w) {
        w = calloc(1, sizeof *w);
        if (w && !pthread_cond_init(&w->wake, NULL) && !pthread_cond_init(&w->idle, NULL) &&
            !pthread_mutex_init(&w->run_lock, NULL)) {
            t->warm = w;
        } else {
            free(w); /* no warming */
            w = NULL;
        }
    }
    int seen = !w || w->n_queued == WARM_QUEUE || w->n_done == WARM_DONE;
    for (int i = 0; w && !seen && i < w->n_done; i++)
        seen = !memcmp(&w->done[i], &shape, sizeof shape);
    if (seen) {
        pthread_mutex_unlock(&t->warm_lock);
        return;
    }
    w->done[w->n_done++] = shape;
    /* the runtime's queue first; the lock let go while posting (the queue
     * takes its own) */
    posted_job *pj = t->post ? malloc(sizeof *pj) : NULL;
    bool (*post)(void *, void (*)(void *), void (*)(void *), void *) = t->post;
    void *ctx = t->post_ctx;
    if (pj) {
        *pj = (posted_job){c, j};
        w->posted++;
    }
    pthread_mutex_unlock(&t->warm_lock);
    if (pj && post(ctx, posted_run, posted_drop, pj))
        return;
    pthread_mutex_lock(&t->warm_lock);
    if (pj) { /* not taken: the warmer's own thread */
        w->posted--;
        free(pj);
    }
    if (!w->has_thread && !w->stop) {
        w->has_thread = !pthread_create(&w->thread, NULL, warm_main, c); /* no thread: no warming */
    }
    if (w->has_thread && w->n_queued < WARM_QUEUE) {
        w->queue[(w->head + w->n_queued++) % WARM_QUEUE] = j;
        pthread_cond_signal(&w->wake);
    }
    if (!w->n_queued && !w->busy && !w->posted)
        pthread_cond_broadcast(&w->idle);
    pthread_mutex_unlock(&t->warm_lock);
}

static void warm_stop(sj_cuda *c) {
    eager_fns *t = c->eager_fns;
    pthread_mutex_lock(&t->warm_lock);
    warmer *w = t->warm;
    if (w) {
        w->stop = true;
        pthread_cond_signal(&w->wake);
    }
    pthread_mutex_unlock(&t->warm_lock);
    if (!w)
        return;
    if (w->has_thread)
        pthread_join(w->thread, NULL);
    /* posted jobs: the runtime's queue stops before its device, running or
     * dropping every one (a device used alone posts none) */
    pthread_mutex_lock(&t->warm_lock);
    while (w->posted)
        pthread_cond_wait(&w->idle, &t->warm_lock);
    pthread_mutex_unlock(&t->warm_lock);
    if (w->stream) { /* blocks freed on it stay cached under its handle: released with the device */
        c->api.StreamSynchronize(w->stream);
        c->api.StreamDestroy(w->stream);
    }
    pthread_cond_destroy(&w->wake);
    pthread_cond_destroy(&w->idle);
    pthread_mutex_destroy(&w->run_lock);
    free(w);
    t->warm = NULL;
}

void sj_cuda_matmul_warming(sj_cuda *c, int on) {
    eager_fns *t = c->eager_fns;
    if (t)
        atomic_store(&t->warm_off, !on);
}

void sj_cuda_matmul_warm_post(sj_cuda *c, bool (*post)(void *ctx, void (*run)(void *arg), void (*drop)(void *arg), void *arg),
                              void *ctx) {
    eager_fns *t = c ? c->eager_fns : NULL;
    if (!t)
        return;
    pthread_mutex_lock(&t->warm_lock);
    t->post = post;
    t->post_ctx = post ? ctx : NULL;
    pthread_mutex_unlock(&t->warm_lock);
}

void sj_cuda_matmul_warm_wait(sj_cuda *c) {
    eager_fns *t = c->eager_fns;
    if (!t)
        return;
    pthread_mutex_lock(&t->warm_lock);
    warmer *w = t->warm;
    while (w && (w->n_queued || w->busy || w->posted))
        pthread_cond_wait(&w->idle, &t->warm_lock);
    pthread_mutex_unlock(&t->warm_lock);
}

/* t with the last k axes given size 1 (so a plan covers the others). */
static sj_tensor lead_axes(const sj_tensor *t, int k) {
    sj_tensor v = *t;
    for (int i = t->rank - k; i < t->rank; i++) v.shape[i] = 1;
    return v;
}

/* A row-major copy of x into memory from the allocator, its broadcast
 * (stride 0) batch axes stored once; rows padded to 16 bytes when `pad`.
 * *view describes it with x's shape. With copy 0 the memory is only
 * allocated (a temporary result). */
static sj_status pack(const sj_cuda_exec *e, const sj_tensor *x0, int pad, int copy, CUdeviceptr *buf,
                      sj_tensor *view) {
    const sj_tensor xv = *x0, *x = &xv; /* view may be x0 */
    sj_tensor src = xv, dst = xv;
    int r = x->rank;
    int64_t es = (int64_t)sj_dtype_size(x->dtype), s = 1;
    for (int i = r - 1; i >= 0; i--) {
        if (x->stride[i] == 0 && i < r - 2)
            src.shape[i] = dst.shape[i] = 1; /* a broadcast batch axis */
        dst.stride[i] = s;
        s *= dst.shape[i];
        if (i == r - 1 && pad)
            s = (s * es + 15) / 16 * 16 / es;
    }
    *buf = sj_cuda_alloc(e->cuda, (size_t)(s * es), e->stream);
    if (!*buf)
        return sj_seterr(SJ_ENOMEM, "matmul: out of device memory for a %lld-element operand", (long long)s);
    dst.data = (void *)(uintptr_t)*buf;
    *view = dst;
    for (int i = 0; i < r; i++) {
        view->shape[i] = x->shape[i];
        if (dst.shape[i] != x->shape[i])
            view->stride[i] = 0;
    }
    return copy ? sj_cuda_copy(e, &src, &dst) : SJ_OK;
}

/* One attempt; `aligned`: every operand and the result go through padded,
 * aligned buffers (the retry when cuBLASLt has no algorithm for the
 * operands' own alignment). */
static sj_status mm_float_try(const sj_cuda_exec *e, const sj_tensor *a0, const sj_tensor *b0, const sj_tensor *bias,
                              const sj_tensor *y0, int aligned, int *biased, int *no_algo) {
    int r = y0->rank;
    int64_t M = y0->shape[r - 2], N = y0->shape[r - 1], K = a0->shape[r - 1], es = (int64_t)sj_dtype_size(y0->dtype);
    sj_tensor a = *a0, b = *b0, y = *y0;
    CUdeviceptr tmp[3] = {0, 0, 0};
    sj_status st = SJ_OK;
    int64_t ld;
    lt_mat A, B, D;
    /* orientation: y row-major (D = y^T), else column-major (D = y), else
     * a row-major temporary */
    int rowy = as_col(N, M, y.stride[r - 1], y.stride[r - 2], &ld);
    if (aligned || (!rowy && !as_col(M, N, y.stride[r - 2], y.stride[r - 1], &ld))) {
        st = pack(e, y0, aligned, 0, &tmp[2], &y);
        rowy = 1;
    }
    /* a bias goes into the epilogue where it runs along D's rows: y's last
     * axis, so only a row-major result; it must be contiguous, and 16-byte
     * aligned so that it cannot be why no algorithm is found */
    CUdeviceptr pbias = bias && rowy && (bias->shape[0] <= 1 || bias->stride[0] == 1) && dptr(bias->data) % 16 == 0
                            ? dptr(bias->data)
                            : 0;
    *biased = pbias != 0;
    sj_tensor *ops[2] = {&a, &b};
    for (int i = 0; i < 2 && !st; i++) {
        const sj_tensor *x = ops[i];
        if (aligned || !lt_operand(&A, 0, x->shape[r - 2], x->shape[r - 1], x->stride[r - 2], x->stride[r - 1]))
            st = pack(e, x, aligned, 1, &tmp[i], ops[i]);
    }
    /* batches over (y, a, b) */
    sj_tensor yb = lead_axes(&y, 2), ab = lead_axes(&a, 2), bb = lead_axes(&b, 2);
    const sj_tensor *ts[3] = {&yb, &ab, &bb};
    plan p;
    int64_t nb = st ? 0 : plan_init(&p, 3, ts);
    int64_t sam = a.stride[r - 2], sym = y.stride[r - 2];
    if (nb > 1) { /* b shared, batch and M axes of a and y merged: one product */
        int shared = 1;
        for (int d = 0; d < p.rank; d++) shared &= p.stride[2][d] == 0;
        sj_tensor y2 = lead_axes(&y, 1), a2 = lead_axes(&a, 1);
        const sj_tensor *ts2[2] = {&y2, &a2};
        plan p2;
        if (shared && plan_init(&p2, 2, ts2) > 0 && p2.rank == 1) {
            int64_t M2 = M * nb, sy2 = p2.stride[0][0], sa2 = p2.stride[1][0];
            int ok = rowy ? lt_operand(&D, 0, N, M2, y.stride[r - 1], sy2) && !D.trans &&
                                lt_operand(&B, 0, K, M2, a.stride[r - 1], sa2)
                          : lt_operand(&D, 0, M2, N, sy2, y.stride[r - 1]) && !D.trans &&
                                lt_operand(&A, 0, M2, K, sa2, a.stride[r - 1]);
            if (ok) {
                M = M2, sym = sy2, sam = sa2;
                nb = 1;
                p.rank = 1, p.shape[0] = 1;
            }
        }
    }
    int last = p.rank - 1;
    int64_t inner = nb ? p.shape[last] : 0, outer = nb ? nb / inner : 0;
    for (int64_t o = 0; o < outer && !st; o++) {
        int64_t off[3] = {0, 0, 0}, rem = o;
        for (int d = last - 1; d >= 0; d--) {
            int64_t cd = rem % p.shape[d];
            rem /= p.shape[d];
            for (int k = 0; k < 3; k++) off[k] += cd * p.stride[k][d];
        }
        for (int64_t i0 = 0; i0 < inner && !st; i0 += INT32_MAX) {
            int cnt = (int)min64(INT32_MAX, inner - i0), ok;
            CUdeviceptr py = dptr(y.data) + (uint64_t)((off[0] + i0 * p.stride[0][last]) * es);
            CUdeviceptr pa = dptr(a.data) + (uint64_t)((off[1] + i0 * p.stride[1][last]) * es);
            CUdeviceptr pb = dptr(b.data) + (uint64_t)((off[2] + i0 * p.stride[2][last]) * es);
            if (rowy) { /* D = y^T (N x M) = b^T a^T */
                ok = lt_operand(&D, py, N, M, y.stride[r - 1], sym) && !D.trans &&
                     lt_operand(&A, pb, N, K, b.stride[r - 1], b.stride[r - 2]) &&
                     lt_operand(&B, pa, K, M, a.stride[r - 1], sam);
                D.bstride = p.stride[0][last], A.bstride = p.stride[2][last], B.bstride = p.stride[1][last];
                if (ok)
                    st = lt_gemm(e, y.dtype, (uint64_t)N, (uint64_t)M, (uint64_t)K, &A, &B, &D, cnt, pbias,
                                 no_algo);
            } else { /* D = y (M x N) = a b */
                ok = lt_operand(&D, py, M, N, sym, y.stride[r - 1]) && !D.trans &&
                     lt_operand(&A, pa, M, K, sam, a.stride[r - 1]) &&
                     lt_operand(&B, pb, K, N, b.stride[r - 2], b.stride[r - 1]);
                D.bstride = p.stride[0][last], A.bstride = p.stride[1][last], B.bstride = p.stride[2][last];
                if (ok)
                    st = lt_gemm(e, y.dtype, (uint64_t)M, (uint64_t)N, (uint64_t)K, &A, &B, &D, cnt, 0, no_algo);
            }
            if (!ok && !st)
                st = sj_seterr(SJ_EINTERNAL, "matmul: operand layout not expressible for cuBLASLt");
        }
    }
    if (!st && tmp[2])
        st = sj_cuda_copy(e, &y, y0);
    for (int i = 0; i < 3; i++) sj_cuda_free(e->cuda, tmp[i], e->stream);
    return st;
}

/* *biased: the bias was added (by the epilogue). */
static sj_status mm_float(const sj_cuda_exec *e, const sj_tensor *a, const sj_tensor *b, const sj_tensor *bias,
                          const sj_tensor *y, int *biased) {
    int no_algo = 0;
    sj_status st = mm_float_try(e, a, b, bias, y, 0, biased, &no_algo);
    if (st && no_algo) {
        no_algo = 0;
        st = mm_float_try(e, a, b, bias, y, 1, biased, &no_algo);
    }
    return st;
}

static sj_status mm_int(const sj_cuda_exec *e, const sj_tensor *a, const sj_tensor *b, const sj_tensor *y) {
    int r = y->rank;
    sj_tensor yb = lead_axes(y, 2), ab = lead_axes(a, 2), bb = lead_axes(b, 2);
    const sj_tensor *ts[3] = {&yb, &ab, &bb};
    plan p;
    sj_ek_mm m;
    memset(&m, 0, sizeof m);
    m.batches = plan_init(&p, 3, ts);
    m.y = dptr(y->data), m.a = dptr(a->data), m.b = dptr(b->data);
    m.M = y->shape[r - 2], m.N = y->shape[r - 1], m.K = a->shape[r - 1];
    m.sam = a->stride[r - 2], m.sak = a->stride[r - 1];
    m.sbk = b->stride[r - 2], m.sbn = b->stride[r - 1];
    m.sym = y->stride[r - 2], m.syn = y->stride[r - 1];
    m.brank = p.rank;
    for (int d = 0; d < p.rank; d++) {
        m.bshape[d] = p.shape[d];
        for (int k = 0; k < 3; k++) m.bstride[k][d] = p.stride[k][d];
    }
    sj_cuda_bind(e->cuda);
    return launch(e, y->dtype == SJ_I64 ? EK_matmul_int_i64 : EK_matmul_int_i32,
                  grid_for(e->cuda, m.batches * m.M * m.N, SJ_EK_THREADS), SJ_EK_THREADS, 1, 0, &m);
}

void sj_cuda_matmul_choices(const sj_cuda *c, uint64_t *n, double *ms) {
    const eager_fns *t = c->eager_fns;
    *n = t ? atomic_load_explicit(&t->choices, memory_order_relaxed) : 0;
    *ms = t ? (double)atomic_load_explicit(&t->choice_ns, memory_order_relaxed) * 1e-6 : 0;
}

sj_status sj_cuda_matmul(const sj_cuda_exec *e, const sj_tensor *a, const sj_tensor *b, const sj_tensor *y) {
    return sj_cuda_matmul_bias(e, a, b, NULL, y);
}

sj_status sj_cuda_matmul_bias(const sj_cuda_exec *e, const sj_tensor *a, const sj_tensor *b, const sj_tensor *bias,
                              const sj_tensor *y) {
    int r = y->rank;
    assert(r >= 2 && a->rank == r && b->rank == r);
    assert(a->dtype == y->dtype && b->dtype == y->dtype && y->dtype != SJ_BOOL);
    int64_t M = y->shape[r - 2], N = y->shape[r - 1], K = a->shape[r - 1];
    assert(a->shape[r - 2] == M && b->shape[r - 2] == K && b->shape[r - 1] == N);
    for (int i = 0; i < r - 2; i++) assert(a->shape[i] == y->shape[i] && b->shape[i] == y->shape[i]);
    assert(!bias || (sj_dtype_is_float(y->dtype) && bias->dtype == y->dtype && bias->rank == 1 && bias->shape[0] == N));
    if (numel(y) == 0)
        return SJ_OK;
    sj_cuda_bind(e->cuda);
    int biased = 0;
    sj_status st = K == 0                         ? fill_zero(e, y)
                   : sj_dtype_is_float(y->dtype) ? mm_float(e, a, b, bias, y, &biased)
                                                 : mm_int(e, a, b, y);
    if (st || !bias || biased)
        return st;
    sj_tensor bb = *y; /* the bias along y's last axis, broadcast over the others */
    bb.data = bias->data;
    for (int i = 0; i < r - 1; i++) bb.stride[i] = 0;
    bb.stride[r - 1] = bias->stride[0];
    return sj_cuda_binary(e, SJ_OP_ADD, y, &bb, y);
}

/* -- Attention ----------------------------------------------------------------------- */

/* Blocks that all run at once (two an SM) are bound by each one's latency:
 * two key tiles, the next loaded during this one; more blocks than that are
 * bound by how many an SM holds: one tile, in less memory. H200, q, k, v
 * [1, 12, S, 64] f16, before conversions to f16 became one instruction:
 * S=512 (96 blocks) 0.070 ms with one tile loaded synchronously, 0.057 with
 * two; S=2048 (384 blocks) 0.32 with one, 0.42 with two. Now: 0.055 and
 * 0.26 ms. */
static int64_t tc_blocks(int64_t B, int64_t H, int64_t Sq) { return B * H * ((Sq + SJ_EK_ATT_TQ - 1) / SJ_EK_ATT_TQ); }

/* attention_mma indexes key tiles with ints. */
#define ATT_MMA_MAX_SK ((int64_t)1 << 30)

int sj_cuda_attention_tiles(const sj_cuda *c, sj_dtype dt, int64_t B, int64_t H, int64_t Sq, int64_t D, int64_t Dv) {
    if (!(dt == SJ_F16 || dt == SJ_BF16) || c->cc_major < 8 || D <= 0 || Dv <= 0 || D % 16 || Dv % 16 ||
        D > SJ_EK_ATT_TC_DMAX || Dv > SJ_EK_ATT_TC_DMAX || sj_ek_att_tc_smem(D, Dv, 1) > c->max_smem_optin)
        return 0;
    return tc_blocks(B, H, Sq) <= 2 * (int64_t)c->sm_count && sj_ek_att_tc_smem(D, Dv, 2) <= c->max_smem_optin ? 2 : 1;
}

/* The register kernels (attention_mma) take D = Dv = 32, 64, 96 or 128, in
 * blocks of 64 queries: 4 warps of 16 that share their key and value
 * tiles, times the key groups. Every warp is a chain of key tiles, and how
 * many warps there are is set by the queries, so a call whose blocks do
 * not fill the device (S = 512 with 12 heads: 96 blocks on an H200's 132
 * SMs) has few warps an SM, each waiting on its own latencies. Two key
 * groups give such a call twice the warps, each group taking every other
 * tile, and combine their rows' softmax states at the end (registers: one
 * block an SM then, so only where blocks are at most one an SM anyway).
 * H200, f16 [1, 12, S, 64], call median ms at S = 128 / 512 / 2048: one
 * group 0.012 / 0.025 / 0.120, two where chosen 0.011 / 0.020 / (one);
 * attention_tc took 0.022 / 0.054 / 0.259. Blocks of 1 or 2 warps instead
 * of 4 were slower at every size. */
int sj_cuda_attention_groups(const sj_cuda *c, sj_dtype dt, int64_t B, int64_t H, int64_t Sq, int64_t Sk, int64_t D,
                             int64_t Dv) {
    if (!(dt == SJ_F16 || dt == SJ_BF16) || c->cc_major < 8 || D != Dv || D % 32 || D < 32 || D > 128 ||
        Sk >= ATT_MMA_MAX_SK || sj_ek_att_mma_smem(D, Dv, 1) > c->max_smem_optin)
        return 0;
    return tc_blocks(B, H, Sq) <= (int64_t)c->sm_count && Sk > SJ_EK_ATT_TK &&
                   sj_ek_att_mma_smem(D, Dv, 2) <= c->max_smem_optin
               ? 2
               : 1;
}

/* Launches of the tensor-core kernels with a mask and over packed
 * sequences, in this process (sj_cuda_attention_tc_calls). */
static _Atomic uint64_t att_tc_masked, att_tc_varlen;

void sj_cuda_attention_tc_calls(uint64_t *masked, uint64_t *varlen) {
    *masked = atomic_load_explicit(&att_tc_masked, memory_order_relaxed);
    *varlen = atomic_load_explicit(&att_tc_varlen, memory_order_relaxed);
}

/* Packed sequences take the register kernels as padded attention does (D =
 * Dv = 32, 64, 96 or 128, f16/bf16, compute capability 8.0 or later), with
 * tiles of up to 64 queries of one sequence: T / 64 + B tiles a head (the
 * kernel's count, eager_varlen.cuh). Two key groups where those blocks are
 * at most one an SM. Fewer than 2^30 tokens (tile indices are ints). */
int sj_cuda_attention_varlen_groups(const sj_cuda *c, sj_dtype dt, int64_t T, int64_t B, int64_t H, int64_t D,
                                    int64_t Dv) {
    if (!(dt == SJ_F16 || dt == SJ_BF16) || c->cc_major < 8 || D != Dv || D % 32 || D < 32 || D > 128 ||
        T >= ATT_MMA_MAX_SK || sj_ek_att_mma_smem(D, Dv, 1) > c->max_smem_optin)
        return 0;
    return H * (T / SJ_EK_ATT_TQ + B) <= (int64_t)c->sm_count && sj_ek_att_mma_smem(D, Dv, 2) <= c->max_smem_optin
               ? 2
               : 1;
}

sj_status sj_cuda_attention(const sj_cuda_exec *e, const sj_tensor *q, const sj_tensor *k, const sj_tensor *v,
                            const sj_tensor *lengths, double scale, int causal, const sj_tensor *y) {
    return sj_cuda_attention_mask(e, q, k, v, lengths, NULL, scale, causal, y);
}

sj_status sj_cuda_attention_mask(const sj_cuda_exec *e, const sj_tensor *q, const sj_tensor *k, const sj_tensor *v,
                                 const sj_tensor *lengths, const sj_tensor *mask, double scale, int causal,
                                 const sj_tensor *y) {
    assert(q->rank == 4 && k->rank == 4 && v->rank == 4 && y->rank == 4);
    assert(sj_dtype_is_float(q->dtype) && k->dtype == q->dtype && v->dtype == q->dtype && y->dtype == q->dtype);
    sj_ek_att a;
    memset(&a, 0, sizeof a);
    a.B = q->shape[0], a.H = q->shape[1], a.Sq = q->shape[2], a.D = q->shape[3];
    a.Sk = k->shape[2], a.Dv = v->shape[3];
    assert(k->shape[0] == a.B && k->shape[1] == a.H && k->shape[3] == a.D);
    assert(v->shape[0] == a.B && v->shape[1] == a.H && v->shape[2] == a.Sk);
    assert(y->shape[0] == a.B && y->shape[1] == a.H && y->shape[2] == a.Sq && y->shape[3] == a.Dv);
    assert(!lengths || (lengths->rank == 1 && lengths->shape[0] == a.B &&
                        (lengths->dtype == SJ_I32 || lengths->dtype == SJ_I64)));
    if (a.B == 0 || a.H == 0 || a.Sq == 0 || a.Dv == 0)
        return SJ_OK;
    a.q = dptr(q->data), a.k = dptr(k->data), a.v = dptr(v->data), a.y = dptr(y->data);
    for (int i = 0; i < 4; i++) {
        a.sq[i] = q->stride[i], a.sk[i] = k->stride[i];
        a.sv[i] = v->stride[i], a.sy[i] = y->stride[i];
    }
    if (lengths) {
        a.len = dptr(lengths->data);
        a.slen = lengths->stride[0];
        a.len_i64 = lengths->dtype == SJ_I64;
    }
    a.scale = (float)scale;
    a.causal = causal != 0;
    if (mask) { /* every kernel takes it: attention_mmam, attention_tc/_tc1 (a.mask set), attention */
        assert(mask->rank == 4 && mask->shape[2] == a.Sq && mask->shape[3] == a.Sk);
        a.mask = dptr(mask->data);
        a.mask_dt = mask->dtype;
        for (int i = 0; i < 4; i++) a.smask[i] = mask->stride[i];
    }
    sj_cuda *c = e->cuda;
    int kg = sj_cuda_attention_groups(c, q->dtype, a.B, a.H, a.Sq, a.Sk, a.D, a.Dv);
    int nb = kg ? 0 : sj_cuda_attention_tiles(c, q->dtype, a.B, a.H, a.Sq, a.D, a.Dv);
    if (kg || nb) {
        a.vec = 1;
        const sj_tensor *qkv[3] = {q, k, v};
        for (int t = 0; t < 3; t++) {
            const sj_tensor *x = qkv[t];
            if (x->stride[3] != 1 || x->stride[0] % 8 || x->stride[1] % 8 || x->stride[2] % 8 ||
                (uintptr_t)x->data % 16)
                a.vec = 0;
        }
    }
    if (kg) {
        int64_t blocks = tc_blocks(a.B, a.H, a.Sq);
        int kern = (mask ? EK_attention_mmam32_f16 : EK_attention_mma32_f16) + 2 * (int)(a.D / 32 - 1) +
                   (q->dtype == SJ_BF16);
        if (mask)
            atomic_fetch_add_explicit(&att_tc_masked, 1, memory_order_relaxed);
        sj_cuda_bind(c);
        return launch(e, kern, (unsigned)min64(blocks, INT32_MAX), 32 * SJ_EK_ATT_MMA_WARPS * kg, 1,
                      (unsigned)sj_ek_att_mma_smem(a.D, a.Dv, kg), &a);
    }
    if (nb) {
        int64_t blocks = tc_blocks(a.B, a.H, a.Sq);
        int kern = (nb == 2 ? EK_attention_tc_f16 : EK_attention_tc1_f16) + (q->dtype == SJ_BF16);
        if (mask)
            atomic_fetch_add_explicit(&att_tc_masked, 1, memory_order_relaxed);
        sj_cuda_bind(c);
        return launch(e, kern, (unsigned)min64(blocks, INT32_MAX), SJ_EK_ATT_TC_THREADS, 1,
                      (unsigned)sj_ek_att_tc_smem(a.D, a.Dv, nb), &a);
    }
    int64_t smem = (a.D + a.Dv + SJ_EK_ATT_CHUNK) * (int64_t)sizeof(float);
    int kern = EK_attention_f32 + q->dtype;
    sj_cuda_bind(c);
    if (smem > c->max_smem_optin) /* opted in to the device's limit at load */
        return sj_seterr(SJ_EBACKEND, "attention: head sizes D %lld + Dv %lld need %lld bytes of shared memory, "
                                      "more than the device's %d", (long long)a.D, (long long)a.Dv, (long long)smem,
                         c->max_smem_optin);
    int64_t blocks = a.B * a.H * a.Sq;
    return launch(e, kern, (unsigned)min64(blocks, INT32_MAX), SJ_EK_ATT_THREADS, 1, (unsigned)smem, &a);
}

/* -- Attention over packed sequences ---------------------------------------------------- */

sj_status sj_cuda_attention_varlen(const sj_cuda_exec *e, const sj_tensor *q, const sj_tensor *k, const sj_tensor *v,
                                   const sj_tensor *offsets, double scale, int causal, const sj_tensor *y) {
    assert(q->rank == 3 && k->rank == 3 && v->rank == 3 && y->rank == 3 && offsets->rank == 1);
    assert(sj_dtype_is_float(q->dtype) && k->dtype == q->dtype && v->dtype == q->dtype && y->dtype == q->dtype);
    assert(offsets->dtype == SJ_I32);
    sj_ek_varlen a;
    memset(&a, 0, sizeof a);
    a.T = q->shape[0], a.H = q->shape[1], a.D = q->shape[2], a.Dv = v->shape[2];
    a.B = offsets->shape[0] - 1;
    assert(k->shape[0] == a.T && k->shape[1] == a.H && k->shape[2] == a.D);
    assert(v->shape[0] == a.T && v->shape[1] == a.H);
    assert(y->shape[0] == a.T && y->shape[1] == a.H && y->shape[2] == a.Dv);
    if (a.B < 1)
        return sj_seterr(SJ_EINDEX, "attention_varlen: offsets has %lld entries, at least 2 ([B+1], B >= 1)",
                         (long long)(a.B + 1));
    if (!e->error_flag)
        return sj_seterr(SJ_EINVAL, "attention_varlen: no device error flag (sj_cuda_exec.error_flag is 0)");
    a.q = dptr(q->data), a.k = dptr(k->data), a.v = dptr(v->data), a.y = dptr(y->data);
    a.off = dptr(offsets->data), a.soff = offsets->stride[0], a.flag = e->error_flag;
    for (int i = 0; i < 3; i++) {
        a.sq[i] = q->stride[i], a.sk[i] = k->stride[i];
        a.sv[i] = v->stride[i], a.sy[i] = y->stride[i];
    }
    a.scale = (float)scale;
    a.causal = causal != 0;
    sj_cuda *c = e->cuda;
    sj_cuda_bind(c);
    sj_status st = launch(e, EK_varlen_check_i32, grid_for(c, a.B + 1, SJ_EK_THREADS), SJ_EK_THREADS, 1, 0, &a);
    if (st || a.T == 0 || a.H == 0 || a.Dv == 0)
        return st;
    int kg = sj_cuda_attention_varlen_groups(c, q->dtype, a.T, a.B, a.H, a.D, a.Dv);
    if (kg) {
        a.vec = 1;
        const sj_tensor *qkv[3] = {q, k, v};
        for (int t = 0; t < 3; t++) {
            const sj_tensor *x = qkv[t];
            if (x->stride[2] != 1 || x->stride[0] % 8 || x->stride[1] % 8 || (uintptr_t)x->data % 16)
                a.vec = 0;
        }
        int kern = EK_attention_varlen_mma32_f16 + 2 * (int)(a.D / 32 - 1) + (q->dtype == SJ_BF16);
        atomic_fetch_add_explicit(&att_tc_varlen, 1, memory_order_relaxed);
        return launch(e, kern, (unsigned)min64(a.H * (a.T / SJ_EK_ATT_TQ + a.B), INT32_MAX),
                      32 * SJ_EK_ATT_MMA_WARPS * kg, 1, (unsigned)sj_ek_att_mma_smem(a.D, a.Dv, kg), &a);
    }
    int64_t smem = (a.D + a.Dv + SJ_EK_ATT_CHUNK) * (int64_t)sizeof(float);
    if (smem > c->max_smem_optin)
        return sj_seterr(SJ_EBACKEND, "attention_varlen: head sizes D %lld + Dv %lld need %lld bytes of shared "
                                      "memory, more than the device's %d", (long long)a.D, (long long)a.Dv,
                         (long long)smem, c->max_smem_optin);
    return launch(e, EK_attention_varlen_f32 + q->dtype, (unsigned)min64(a.T * a.H, INT32_MAX), SJ_EK_ATT_THREADS,
                  1, (unsigned)smem, &a);
}

sj_status sj_cuda_flag_status(int flag) {
    if (!flag)
        return SJ_OK;
    if (flag & SJ_EK_VARLEN_BAD_FIRST)
        return sj_seterr(SJ_EINDEX, "attention_varlen: offsets[0] is not 0");
    if (flag & SJ_EK_VARLEN_BAD_ORDER)
        return sj_seterr(SJ_EINDEX, "attention_varlen: offsets decrease (an entry is below the one before it)");
    if (flag & SJ_EK_VARLEN_BAD_LAST)
        return sj_seterr(SJ_EINDEX, "attention_varlen: offsets[B] (the last) is not T, the packed token count");
    return sj_seterr(SJ_EINDEX, "gather: an index is out of range");
}

/* -- Concat and gather ----------------------------------------------------------------- */

static sj_status copy_device(void *ctx, const sj_tensor *x, const sj_tensor *y) {
    return sj_cuda_copy(ctx, x, y);
}

sj_status sj_cuda_concat(const sj_cuda_exec *e, const sj_tensor *xs, int n, int axis, const sj_tensor *y) {
    return sj_tensor_concat(xs, n, axis, y, copy_device, (void *)e);
}

sj_status sj_cuda_gather(const sj_cuda_exec *e, const sj_tensor *table, const sj_tensor *idx, const sj_tensor *y) {
    assert(table->rank >= 1 && table->dtype == y->dtype);
    assert(idx->dtype == SJ_I32 || idx->dtype == SJ_I64);
    assert(y->rank == idx->rank + table->rank - 1);
    sj_ek_gather g;
    memset(&g, 0, sizeof g);
    g.count = numel(idx);
    if (g.count == 0)
        return SJ_OK;
    if (!e->error_flag)
        return sj_seterr(SJ_EINVAL, "gather: no device error flag (sj_cuda_exec.error_flag is 0)");
    int ri = idx->rank, rr = table->rank - 1;
    g.y = dptr(y->data), g.table = dptr(table->data), g.idx = dptr(idx->data), g.flag = e->error_flag;
    g.V = table->shape[0], g.ts0 = table->stride[0];
    g.irank = ri, g.rrank = rr;
    g.idx_i64 = idx->dtype == SJ_I64;
    g.contig = sj_tensor_contiguous_from(table, 1) && sj_tensor_contiguous_from(y, ri);
    g.rowel = 1;
    for (int i = 0; i < ri; i++) {
        assert(y->shape[i] == idx->shape[i]);
        g.ishape[i] = idx->shape[i], g.istride[i] = idx->stride[i], g.iystride[i] = y->stride[i];
    }
    for (int i = 0; i < rr; i++) {
        assert(y->shape[ri + i] == table->shape[i + 1]);
        g.rshape[i] = table->shape[i + 1], g.rtstride[i] = table->stride[i + 1];
        g.rystride[i] = y->stride[ri + i];
        g.rowel *= table->shape[i + 1];
    }
    sj_cuda_bind(e->cuda);
    int64_t work = g.count * (g.rowel > 0 ? g.rowel : 1);
    return launch(e, EK_gather_e1 + log2_size(sj_dtype_size(y->dtype)), grid_for(e->cuda, work, SJ_EK_THREADS),
                  SJ_EK_THREADS, 1, 0, &g);
}

/* -- Arange ---------------------------------------------------------------------------- */

sj_status sj_cuda_arange(const sj_cuda_exec *e, const sj_tensor *y) {
    assert(y->rank == 1 && y->dtype != SJ_BOOL);
    if (y->shape[0] == 0)
        return SJ_OK;
    sj_ek_ew a;
    memset(&a, 0, sizeof a);
    a.ptr[0] = dptr(y->data);
    a.n = y->shape[0];
    a.stride[0][0] = y->stride[0];
    a.rank = 1;
    a.shape[0] = a.n;
    sj_cuda_bind(e->cuda);
    return launch(e, EK_arange_f32 + y->dtype, grid_for(e->cuda, a.n, SJ_EK_THREADS), SJ_EK_THREADS, 1, 0, &a);
}
