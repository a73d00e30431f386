/* Private helpers of the eager CPU kernels: f32 math, vectorizable loops,
 * element access for every dtype, and a strided N-d layout plan with a row
 * iterator.
 *
 * Everything here is static inline except sj_cpu_softmax_row (reduce.c),
 * which the library's -fvisibility=hidden keeps internal.
 */
#ifndef SJ_CPU_INT_H
#define SJ_CPU_INT_H

#include <assert.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "jit/shapejit.h"
#include "base/sj_kernel_rt.h"

/* -- f32 math ----------------------------------------------------------------
 *
 * The definitions live in base/sj_kernel_rt.h (shared with generated
 * kernels, with their error bounds); these names are kept for the eager
 * kernels and their tests.
 */

static inline uint32_t cpu_f2u(float f) { return sj_rt_f2u(f); }
static inline float cpu_u2f(uint32_t u) { return sj_rt_u2f(u); }
static inline float cpu_sel(int c, float a, float b) { return sj_rt_sel(c, a, b); }
static inline float cpu_expf(float x) { return sj_rt_expf(x); }
static inline float cpu_tanhf(float x) { return sj_rt_tanhf(x); }
static inline float cpu_erff(float x) { return sj_rt_erff(x); }
static inline float cpu_sigmoidf(float x) { return sj_rt_sigmoidf(x); }
static inline float cpu_siluf(float x) { return sj_rt_siluf(x); }
static inline float cpu_geluf(float x) { return sj_rt_geluf(x); }
static inline float cpu_gelu_tanhf(float x) { return sj_rt_gelu_tanhf(x); }

/* -- Vectorizable loops ------------------------------------------------------
 *
 * gcc -O2 (GCC 12's "very cheap" vectorizer cost model) only vectorizes
 * loops whose trip count is a known multiple of the vector width, so hot
 * loops run in blocks of CPU_VBLOCK with a constant inner trip count, then
 * a scalar tail. The body (the variadic part) uses the index variable i.
 */
#define CPU_VBLOCK 16
#define CPU_VLOOP(i, n, ...)                                                                       \
    do {                                                                                           \
        int64_t cpu_vb_ = 0, cpu_vn_ = (n);                                                        \
        for (; cpu_vb_ + CPU_VBLOCK <= cpu_vn_; cpu_vb_ += CPU_VBLOCK)                             \
            for (int64_t cpu_vj_ = 0; cpu_vj_ < CPU_VBLOCK; cpu_vj_++) {                           \
                int64_t i = cpu_vb_ + cpu_vj_;                                                     \
                __VA_ARGS__;                                                                       \
            }                                                                                      \
        for (int64_t i = cpu_vb_; i < cpu_vn_; i++) {                                              \
            __VA_ARGS__;                                                                           \
        }                                                                                          \
    } while (0)

/* Compute-bound loops (the f32 transcendentals) are also built for AVX2 and
 * picked at load time (GNU ifunc). AVX2 alone brings no FMA, so both
 * versions run the same IEEE operations and give bit-identical results.
 * Only on static functions (their resolvers stay local) and only with gcc:
 * clang 14 emits global resolver symbols. Define SJ_NO_CLONES to build only
 * the baseline. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__linux__) &&       \
    !defined(SJ_NO_CLONES)
#define CPU_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define CPU_CLONES
#endif

/* Row reductions in double (sj_kernel_rt.h): generated ROW kernels call
 * the same functions, so eager and fused rows agree bit for bit. */
static inline double cpu_sum_f32(const float *x, int64_t n) { return sj_rt_sum_f32(x, n); }
static inline double cpu_sumsq_f32(const float *x, double c, int64_t n) { return sj_rt_sumsq_f32(x, c, n); }
static inline float cpu_max_f32(const float *x, int64_t n) { return sj_rt_max_f32(x, n); }

/* Softmax of a contiguous f32 row in place: e = exp(x - max),
 * y = e * (float)(1 / sum(e)) with the sum in double. A row whose max is
 * -inf (all -inf, or empty) becomes zeros; a NaN anywhere gives NaNs.
 * In reduce.c (so its cloned exp loop is built once). */
void sj_cpu_softmax_row(float *x, int64_t n);

/* Bytes per element (the kernels do not link against the runtime's
 * sj_dtype_size). */
static inline size_t cpu_dtype_size(sj_dtype dt) {
    switch (dt) {
#define SJ_X(name, e, bytes)                                                                       \
    case e: return bytes;
        SJ_DTYPE_LIST(SJ_X)
#undef SJ_X
    default: return 0;
    }
}

static inline int cpu_is_float(sj_dtype dt) {
    return dt == SJ_F32 || dt == SJ_F16 || dt == SJ_BF16;
}
static inline int cpu_is_int(sj_dtype dt) { return dt == SJ_I32 || dt == SJ_I64; }

/* Element i of an array of dtype dt as f32 (ints rounded to nearest). */
static inline float cpu_ld_f32(const void *p, sj_dtype dt, int64_t i) {
    switch (dt) {
    case SJ_F32: return ((const float *)p)[i];
    case SJ_F16: return sj_f16_to_f32(((const uint16_t *)p)[i]);
    case SJ_BF16: return sj_bf16_to_f32(((const uint16_t *)p)[i]);
    case SJ_I32: return (float)((const int32_t *)p)[i];
    case SJ_I64: return (float)((const int64_t *)p)[i];
    case SJ_BOOL: return ((const uint8_t *)p)[i] != 0 ? 1.0f : 0.0f;
    default: assert(!"bad dtype"); return 0.0f;
    }
}

/* Element i of an integer or bool array as int64. */
static inline int64_t cpu_ld_i64(const void *p, sj_dtype dt, int64_t i) {
    switch (dt) {
    case SJ_I32: return ((const int32_t *)p)[i];
    case SJ_I64: return ((const int64_t *)p)[i];
    case SJ_BOOL: return ((const uint8_t *)p)[i] != 0;
    default: assert(!"not an integer dtype"); return 0;
    }
}

/* Integer narrowing and wrapping arithmetic (sj_kernel_rt.h). */
static inline int32_t cpu_wrap32(int64_t v) { return sj_rt_wrap32(v); }
static inline int64_t cpu_i64_from_u(uint64_t u) { return sj_rt_i64_from_u(u); }

/* Strided runs of n elements to and from f32 / int64 buffers. The dtype
 * switch sits outside the loops. */
static inline void cpu_load_f32(float *dst, const void *src, sj_dtype dt, int64_t s, int64_t n) {
    int64_t i;
    switch (dt) {
    case SJ_F32:
        if (s == 1)
            memcpy(dst, src, (size_t)n * sizeof(float));
        else
            for (i = 0; i < n; i++) dst[i] = ((const float *)src)[i * s];
        break;
    case SJ_F16:
        if (s == 1)
            CPU_VLOOP(i, n, dst[i] = sj_f16_to_f32(((const uint16_t *)src)[i]));
        else
            for (i = 0; i < n; i++) dst[i] = sj_f16_to_f32(((const uint16_t *)src)[i * s]);
        break;
    case SJ_BF16:
        if (s == 1)
            CPU_VLOOP(i, n, dst[i] = sj_bf16_to_f32(((const uint16_t *)src)[i]));
        else
            for (i = 0; i < n; i++) dst[i] = sj_bf16_to_f32(((const uint16_t *)src)[i * s]);
        break;
    default:
        for (i = 0; i < n; i++) dst[i] = cpu_ld_f32(src, dt, i * s);
        break;
    }
}

/* Store f32 values into a float dtype (f16/bf16 round to nearest even). */
static inline void cpu_store_f32(void *dst, sj_dtype dt, int64_t s, const float *src, int64_t n) {
    int64_t i;
    switch (dt) {
    case SJ_F32:
        if (s == 1)
            memcpy(dst, src, (size_t)n * sizeof(float));
        else
            for (i = 0; i < n; i++) ((float *)dst)[i * s] = src[i];
        break;
    case SJ_F16:
        if (s == 1)
            CPU_VLOOP(i, n, ((uint16_t *)dst)[i] = sj_f32_to_f16(src[i]));
        else
            for (i = 0; i < n; i++) ((uint16_t *)dst)[i * s] = sj_f32_to_f16(src[i]);
        break;
    case SJ_BF16:
        if (s == 1)
            CPU_VLOOP(i, n, ((uint16_t *)dst)[i] = sj_f32_to_bf16(src[i]));
        else
            for (i = 0; i < n; i++) ((uint16_t *)dst)[i * s] = sj_f32_to_bf16(src[i]);
        break;
    default: assert(!"not a float dtype"); break;
    }
}

static inline void cpu_load_i64(int64_t *dst, const void *src, sj_dtype dt, int64_t s, int64_t n) {
    int64_t i;
    switch (dt) {
    case SJ_I32:
        for (i = 0; i < n; i++) dst[i] = ((const int32_t *)src)[i * s];
        break;
    case SJ_I64:
        for (i = 0; i < n; i++) dst[i] = ((const int64_t *)src)[i * s];
        break;
    case SJ_BOOL:
        for (i = 0; i < n; i++) dst[i] = ((const uint8_t *)src)[i * s] != 0;
        break;
    default: assert(!"not an integer dtype"); break;
    }
}

/* Store int64 values into i32 (wrapping), i64 or bool (!= 0). */
static inline void cpu_store_i64(void *dst, sj_dtype dt, int64_t s, const int64_t *src, int64_t n) {
    int64_t i;
    switch (dt) {
    case SJ_I32:
        for (i = 0; i < n; i++) ((int32_t *)dst)[i * s] = cpu_wrap32(src[i]);
        break;
    case SJ_I64:
        for (i = 0; i < n; i++) ((int64_t *)dst)[i * s] = src[i];
        break;
    case SJ_BOOL:
        for (i = 0; i < n; i++) ((uint8_t *)dst)[i * s] = src[i] != 0;
        break;
    default: assert(!"not an integer dtype"); break;
    }
}

/* -- Layout plans ------------------------------------------------------------
 *
 * A plan describes up to CPU_MAX_OPS operands of one shape (operand 0 is
 * the output, whose shape is used): size-1 axes dropped, axes ordered by
 * the output's strides (outermost first), and neighbouring axes merged
 * wherever every operand allows it. The last axis is the "row"; the others
 * are walked by a cpu_iter, one row at a time, so a range [begin, end) of
 * rows can be handed to one thread.
 */

#define CPU_MAX_OPS 4

typedef struct cpu_plan {
    int rank; /* >= 1 */
    int nops;
    int64_t shape[SJ_MAX_RANK];
    int64_t stride[CPU_MAX_OPS][SJ_MAX_RANK]; /* elements */
    char *base[CPU_MAX_OPS];
    size_t esize[CPU_MAX_OPS];
} cpu_plan;

/* Build a plan over ts[0..nops-1] (all with ts[0]'s rank and shape; axes
 * of size 1 may carry any stride). Returns the element count (0: nothing to
 * do, the plan is not usable). */
static inline int64_t cpu_plan_init(cpu_plan *p, int nops, const sj_tensor *const *ts) {
    const sj_tensor *y = ts[0];
    int ax[SJ_MAX_RANK], n = 0, i, j, k;
    int64_t numel = 1;
    assert(nops >= 1 && nops <= CPU_MAX_OPS && y->rank >= 0 && y->rank <= SJ_MAX_RANK);
    for (i = 0; i < y->rank; i++) {
        numel *= y->shape[i];
        if (y->shape[i] != 1)
            ax[n++] = i;
    }
    if (numel == 0)
        return 0;
    /* stable insertion sort of the axes by the output stride, descending */
    for (i = 1; i < n; i++) {
        int a = ax[i];
        for (j = i; j > 0 && y->stride[ax[j - 1]] < y->stride[a]; j--) ax[j] = ax[j - 1];
        ax[j] = a;
    }
    p->nops = nops;
    p->rank = 0;
    for (i = 0; i < n; i++) {
        int a = ax[i], merge = p->rank > 0;
        for (k = 0; k < nops && merge; k++)
            merge = p->stride[k][p->rank - 1] == ts[k]->stride[a] * y->shape[a];
        if (merge) {
            p->shape[p->rank - 1] *= y->shape[a];
            for (k = 0; k < nops; k++) p->stride[k][p->rank - 1] = ts[k]->stride[a];
        } else {
            p->shape[p->rank] = y->shape[a];
            for (k = 0; k < nops; k++) p->stride[k][p->rank] = ts[k]->stride[a];
            p->rank++;
        }
    }
    if (p->rank == 0) {
        p->rank = 1;
        p->shape[0] = 1;
        for (k = 0; k < nops; k++) p->stride[k][0] = 0;
    }
    for (k = 0; k < nops; k++) {
        p->base[k] = (char *)ts[k]->data;
        p->esize[k] = cpu_dtype_size(ts[k]->dtype);
    }
    return numel;
}

/* Rows of a plan: the product of all but the last axis. */
static inline int64_t cpu_plan_rows(const cpu_plan *p) {
    int64_t r = 1;
    for (int i = 0; i < p->rank - 1; i++) r *= p->shape[i];
    return r;
}

typedef struct cpu_iter {
    int64_t idx[SJ_MAX_RANK];
    int64_t off[CPU_MAX_OPS]; /* element offset of the row's first element */
} cpu_iter;

static inline void cpu_iter_seek(const cpu_plan *p, cpu_iter *it, int64_t row) {
    for (int k = 0; k < p->nops; k++) it->off[k] = 0;
    for (int d = p->rank - 2; d >= 0; d--) {
        it->idx[d] = row % p->shape[d];
        row /= p->shape[d];
        for (int k = 0; k < p->nops; k++) it->off[k] += it->idx[d] * p->stride[k][d];
    }
}

static inline void cpu_iter_next(const cpu_plan *p, cpu_iter *it) {
    for (int d = p->rank - 2; d >= 0; d--) {
        int k;
        it->idx[d]++;
        for (k = 0; k < p->nops; k++) it->off[k] += p->stride[k][d];
        if (it->idx[d] < p->shape[d])
            return;
        for (k = 0; k < p->nops; k++) it->off[k] -= p->stride[k][d] * p->shape[d];
        it->idx[d] = 0;
    }
}

/* Pointer to the row's first element of operand k. */
static inline char *cpu_iter_ptr(const cpu_plan *p, const cpu_iter *it, int k) {
    return p->base[k] + it->off[k] * (int64_t)p->esize[k];
}

#endif /* SJ_CPU_INT_H */
