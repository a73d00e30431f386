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
#include "kernels/half.h"

/* -- f32 math ----------------------------------------------------------------
 *
 * Branch-free approximations that gcc -O2 vectorizes (selects, not
 * branches; no libm calls). Bounds asserted by test_approximations against
 * double libm on every 1021st f32 bit pattern (measured maxima in brackets):
 *   cpu_expf     relative < 2e-7 [9.2e-8] where exp(x) >= 1e-30, absolute
 *                < 2e-37 below; inf past ~88.72, subnormals, 0 below ~-103.9
 *   cpu_tanhf    relative < 2e-7 [1.6e-7]
 *   cpu_erff     absolute < 1.5e-7 [8.9e-8]; relative [1.6e-7] for |x| < 1
 *   sigmoid      relative < 2e-7 [1.3e-7]
 *   gelu         |err| / max(|ref|, 1) < 3e-7 [1.1e-7]
 *   gelu_tanh    |err| / max(|ref|, 1) < 4e-7 [2.9e-7] (1 + tanh cancels for
 *                negative x: the f32 formula's own limit)
 * NaN in gives NaN out; +-inf give the limits. All of it assumes IEEE
 * semantics, hence the -ffast-math check below.
 */

#ifdef __FAST_MATH__
#error "the eager kernels need IEEE semantics (NaN checks, rounding tricks): no -ffast-math"
#endif

static inline uint32_t cpu_f2u(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float cpu_u2f(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* c ? a : b as bit masks. gcc -O2 does not vectorize a float ?: whose arms
 * it has sunk into branches (they may trap), so the math below selects with
 * this. */
static inline float cpu_sel(int c, float a, float b) {
    uint32_t m = 0u - (uint32_t)(c != 0);
    return cpu_u2f((cpu_f2u(a) & m) | (cpu_f2u(b) & ~m));
}

#define CPU_LOG2E 1.44269504089f
#define CPU_LN2_HI 0.693145751953125f /* 15 significant bits: n * HI is exact */
#define CPU_LN2_LO 1.42860682030941723e-6f
#define CPU_RMAGIC 12582912.0f /* 1.5 * 2^23: x + RMAGIC rounds x to an integer */

/* Split x = n ln2 + r with n = round(x / ln2) (x already clamped to a range
 * where |n| < 2^21); returns r, stores n. */
static inline float cpu_reduce_ln2(float x, int32_t *n) {
    float t = x * CPU_LOG2E + CPU_RMAGIC;
    float nf = t - CPU_RMAGIC;
    /* the low mantissa bits of t hold n (two's complement); for a NaN x
     * they are arbitrary, harmless since r is NaN too */
    *n = (int32_t)(cpu_f2u(t) - cpu_f2u(CPU_RMAGIC));
    float r = x - nf * CPU_LN2_HI;
    return r - nf * CPU_LN2_LO;
}

/* 2^n for n in [-126, 127]. */
static inline float cpu_pow2i(int32_t n) { return cpu_u2f((uint32_t)(n + 127) << 23); }

/* exp(x) = 2^n * exp(r): exp(r) by its Taylor series to r^7/7! (truncation
 * below 6e-9 for |r| <= 0.35); 2^n applied as two factors so results that
 * overflow become inf and tiny ones pass through the subnormals to 0. */
static inline float cpu_expf(float x) {
    /* one clamp of |x| (two chained ones are not vectorized); NaN passes */
    float xc = cpu_sel(fabsf(x) > 110.0f, copysignf(110.0f, x), x);
    int32_t n;
    float r = cpu_reduce_ln2(xc, &n);
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    int32_t n1 = n / 2, n2 = n - n1;
    return p * cpu_pow2i(n1) * cpu_pow2i(n2);
}

/* expm1(x) for x in [-20, 0]: 2^n expm1(r) + (2^n - 1), expm1(r) by its
 * Taylor series to r^8/8!; exact cancellation-free for n = 0. */
static inline float cpu_expm1_neg(float x) {
    int32_t n;
    float r = cpu_reduce_ln2(x, &n);
    float q = 1.0f / 40320.0f;
    q = q * r + 1.0f / 5040.0f;
    q = q * r + 1.0f / 720.0f;
    q = q * r + 1.0f / 120.0f;
    q = q * r + 1.0f / 24.0f;
    q = q * r + 1.0f / 6.0f;
    q = q * r + 0.5f;
    q = q * r + 1.0f;
    q = q * r;
    float s = cpu_pow2i(n);
    return s * q + (s - 1.0f);
}

/* tanh: for |x| < 0.6, x + x u P(u) with u = x^2 and P a degree-5 fit
 * (mpmath.chebyfit) of (tanh(x)/x - 1)/u on u in [0, 0.36] (error 9e-11);
 * otherwise tanh(|x|) = -e / (e + 2) with e = expm1(-2|x|), which does not
 * cancel; |x| >= 10 gives exactly 1. The sign is copied from x. */
static inline float cpu_tanhf(float x) {
    float a = fabsf(x);
    float u = a * a;
    float p = 2.212133989e-03f;
    p = p * u - 8.245524711e-03f;
    p = p * u + 2.172505575e-02f;
    p = p * u - 5.395053585e-02f;
    p = p * u + 1.333322862e-01f;
    p = p * u - 3.333333100e-01f;
    float small = a + a * (u * p);
    float ac = cpu_sel(a > 10.0f, 10.0f, a); /* NaN stays NaN */
    float e = cpu_expm1_neg(-2.0f * ac);
    float big = -e / (e + 2.0f);
    return copysignf(cpu_sel(a < 0.6f, small, big), x);
}

/* erf: for |x| < 0.8, x + x (c + u P(u)) with u = x^2, c = 2/sqrt(pi) - 1
 * and P a degree-5 fit of erf(x)/x on u in [0, 0.64] (error 6e-11); for
 * |x| >= 0.8 (clamped to 4, past which erf is 1 in f32),
 * 1 - exp(-x^2) t Q(t) with t = 1 / (1 + x/2) and Q a degree-7 fit of
 * erfc(x) exp(x^2) / t on t in [1/3, 1/1.4] (error 1.1e-9). Both fits are
 * mpmath.chebyfit polynomials. */
static inline float cpu_erff(float x) {
    float a = fabsf(x);
    float u = a * a;
    float p = 9.164211901e-05f;
    p = p * u - 8.306234622e-04f;
    p = p * u + 5.213663502e-03f;
    p = p * u - 2.686389065e-02f;
    p = p * u + 1.128376753e-01f;
    p = p * u - 3.761263794e-01f;
    float small = a + a * (0.1283791671f + u * p);
    /* below 0.8 this branch is computed and discarded (finite there) */
    float ac = cpu_sel(a > 4.0f, 4.0f, a); /* NaN stays NaN */
    float t = 1.0f / (1.0f + 0.5f * ac);
    float q = 3.775557577e-02f;
    q = q * t - 3.789780600e-02f;
    q = q * t - 1.874095158e-01f;
    q = q * t + 2.734599064e-01f;
    q = q * t + 7.951600000e-02f;
    q = q * t + 2.744937771e-01f;
    q = q * t + 2.778417892e-01f;
    q = q * t + 2.823700053e-01f;
    float big = 1.0f - cpu_expf(-(ac * ac)) * (t * q);
    return copysignf(cpu_sel(a < 0.8f, small, big), x);
}

/* The definitions every kernel (eager and fused) computes, in f32:
 *   sigmoid(x)   = 1 / (1 + exp(-x))
 *   silu(x)      = x * sigmoid(x)
 *   gelu(x)      = 0.5 x (1 + erf(x / sqrt(2)))
 *   gelu_tanh(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
 *   relu(x)      = x < 0 ? 0 : x   (NaN stays NaN)
 *   rsqrt(x)     = 1 / sqrt(x)
 * At x = -inf, silu and both gelus are NaN (-inf * 0), as the formulas say. */
static inline float cpu_sigmoidf(float x) { return 1.0f / (1.0f + cpu_expf(-x)); }
static inline float cpu_siluf(float x) { return x * cpu_sigmoidf(x); }
static inline float cpu_geluf(float x) {
    return 0.5f * x * (1.0f + cpu_erff(x * 0.70710678118654752f));
}
static inline float cpu_gelu_tanhf(float x) {
    float inner = 0.79788456080286536f * (x + 0.044715f * (x * x * x));
    return 0.5f * x * (1.0f + cpu_tanhf(inner));
}

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

/* Sum of n floats in double, CPU_VBLOCK partial sums (vectorized). */
static inline double cpu_sum_f32(const float *x, int64_t n) {
    double acc[CPU_VBLOCK] = {0}, s = 0.0;
    int64_t i = 0;
    for (; i + CPU_VBLOCK <= n; i += CPU_VBLOCK)
        for (int j = 0; j < CPU_VBLOCK; j++) acc[j] += x[i + j];
    for (; i < n; i++) s += x[i];
    for (int j = 0; j < CPU_VBLOCK; j++) s += acc[j];
    return s;
}

/* Sum of (x - c)^2 in double. */
static inline double cpu_sumsq_f32(const float *x, double c, int64_t n) {
    double acc[CPU_VBLOCK] = {0}, s = 0.0;
    int64_t i = 0;
    for (; i + CPU_VBLOCK <= n; i += CPU_VBLOCK)
        for (int j = 0; j < CPU_VBLOCK; j++) {
            double d = x[i + j] - c;
            acc[j] += d * d;
        }
    for (; i < n; i++) s += (x[i] - c) * (x[i] - c);
    for (int j = 0; j < CPU_VBLOCK; j++) s += acc[j];
    return s;
}

/* NaN-propagating max of n floats (-inf for n = 0). */
static inline float cpu_max_f32(const float *x, int64_t n) {
    float acc[CPU_VBLOCK], m = -INFINITY;
    int64_t i = 0;
    for (int j = 0; j < CPU_VBLOCK; j++) acc[j] = -INFINITY;
    for (; i + CPU_VBLOCK <= n; i += CPU_VBLOCK)
        for (int j = 0; j < CPU_VBLOCK; j++) {
            float v = x[i + j];
            acc[j] = cpu_sel(v > acc[j] || v != v, v, acc[j]);
        }
    for (int j = 0; j < CPU_VBLOCK; j++) m = (acc[j] > m || acc[j] != acc[j]) ? acc[j] : m;
    for (; i < n; i++) m = (x[i] > m || x[i] != x[i]) ? x[i] : m; /* a NaN m stays */
    return m;
}

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

/* Narrow an int64 to int32 by wrapping (no implementation-defined cast). */
static inline int32_t cpu_wrap32(int64_t v) {
    uint32_t u = (uint32_t)(uint64_t)v;
    return u <= INT32_MAX ? (int32_t)u : (int32_t)(u - 0x80000000u) + INT32_MIN;
}

/* Wrapping int64 arithmetic (through uint64, so overflow is defined). */
static inline int64_t cpu_i64_from_u(uint64_t u) {
    return u <= INT64_MAX ? (int64_t)u : (int64_t)(u - 0x8000000000000000u) + INT64_MIN;
}

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
