/* Shared device code of the eager CUDA kernels (included by eager.cu only):
 * dtype traits, the scalar math of every op (base/sj_kernel_rt.h's
 * functions, compiled for the device), index arithmetic over collapsed
 * strided layouts, and warp/block reductions.
 */
#ifndef SJ_EAGER_COMMON_CUH
#define SJ_EAGER_COMMON_CUH

#include <stdint.h>

extern "C" {
#include "base/ops.h"
#include "jit/shapejit.h"
}
#include "kernels/cuda/eager_abi.cuh"
#include "base/sj_kernel_rt.h"

#define SJ_DEV static __device__ __forceinline__

/* -- Dtypes ----------------------------------------------------------------
 * S: the stored type; C: the compute type (f32 for floats, int64 for
 * integers and bool); ld/st convert, st narrowing as the CPU does (f16/bf16
 * round to nearest even, i32 wraps, bool is != 0). */

struct dt_f32 {
    typedef float S;
    typedef float C;
    static constexpr int code = SJ_F32;
    static __device__ __forceinline__ C ld(S v) { return v; }
    static __device__ __forceinline__ S st(C v) { return v; }
};
struct dt_f16 {
    typedef uint16_t S;
    typedef float C;
    static constexpr int code = SJ_F16;
    static __device__ __forceinline__ C ld(S v) { return sj_f16_to_f32(v); }
    static __device__ __forceinline__ S st(C v) { return sj_f32_to_f16(v); }
};
struct dt_bf16 {
    typedef uint16_t S;
    typedef float C;
    static constexpr int code = SJ_BF16;
    static __device__ __forceinline__ C ld(S v) { return sj_bf16_to_f32(v); }
    static __device__ __forceinline__ S st(C v) { return sj_f32_to_bf16(v); }
};
struct dt_i32 {
    typedef int32_t S;
    typedef int64_t C;
    static constexpr int code = SJ_I32;
    static __device__ __forceinline__ C ld(S v) { return v; }
    static __device__ __forceinline__ S st(C v) { return sj_rt_wrap32(v); }
};
struct dt_i64 {
    typedef int64_t S;
    typedef int64_t C;
    static constexpr int code = SJ_I64;
    static __device__ __forceinline__ C ld(S v) { return v; }
    static __device__ __forceinline__ S st(C v) { return v; }
};
struct dt_bool {
    typedef uint8_t S;
    typedef int64_t C;
    static constexpr int code = SJ_BOOL;
    static __device__ __forceinline__ C ld(S v) { return v != 0; }
    static __device__ __forceinline__ S st(C v) { return (S)(v != 0); }
};

/* Element-size tags: bits are moved, never interpreted. */
struct dt_e1 { typedef uint8_t S; };
struct dt_e2 { typedef uint16_t S; };
struct dt_e4 { typedef uint32_t S; };
struct dt_e8 { typedef unsigned long long S; };

template <class T> struct is_float_dt { static constexpr bool value = false; };
template <> struct is_float_dt<dt_f32> { static constexpr bool value = true; };
template <> struct is_float_dt<dt_f16> { static constexpr bool value = true; };
template <> struct is_float_dt<dt_bf16> { static constexpr bool value = true; };

/* -- Scalar math ---------------------------------------------------------------
 * The definitions of kernels/cpu/elementwise.c: sj_rt_* for the
 * transcendentals, libm-style logf/sqrtf/powf (IEEE division and square
 * root: nvcc's defaults), int64 wrapping arithmetic. op is uniform, so the
 * switches fold when op is a constant and stay uniform branches otherwise. */

SJ_DEV float un_f(int op, float x) {
    switch (op) {
    case SJ_OP_NEG: return -x;
    case SJ_OP_ABS: return fabsf(x);
    case SJ_OP_EXP: return sj_rt_expf(x);
    case SJ_OP_LOG: return logf(x);
    case SJ_OP_SQRT: return sqrtf(x);
    case SJ_OP_RSQRT: return 1.0f / sqrtf(x);
    case SJ_OP_TANH: return sj_rt_tanhf(x);
    case SJ_OP_SIGMOID: return sj_rt_sigmoidf(x);
    case SJ_OP_RELU: return sj_rt_reluf(x);
    case SJ_OP_GELU: return sj_rt_geluf(x);
    case SJ_OP_GELU_TANH: return sj_rt_gelu_tanhf(x);
    case SJ_OP_SILU: return sj_rt_siluf(x);
    default: return __int_as_float(0x7fc00000);
    }
}

SJ_DEV int64_t un_i(int op, int64_t x) {
    switch (op) {
    case SJ_OP_NEG: return sj_rt_ineg(x);
    case SJ_OP_ABS: return sj_rt_iabs(x);
    default: return x < 0 ? 0 : x; /* relu */
    }
}

SJ_DEV float bin_f(int op, float a, float b) {
    switch (op) {
    case SJ_OP_ADD: return a + b;
    case SJ_OP_SUB: return a - b;
    case SJ_OP_MUL: return a * b;
    case SJ_OP_DIV: return a / b;
    case SJ_OP_MAXIMUM: return sj_rt_maxf(a, b);
    case SJ_OP_MINIMUM: return sj_rt_minf(a, b);
    default: return powf(a, b);
    }
}

SJ_DEV int64_t bin_i(int op, int64_t a, int64_t b) {
    switch (op) {
    case SJ_OP_ADD: return sj_rt_iadd(a, b);
    case SJ_OP_SUB: return sj_rt_isub(a, b);
    case SJ_OP_MUL: return sj_rt_imul(a, b);
    case SJ_OP_DIV: return sj_rt_idiv(a, b);
    case SJ_OP_MAXIMUM: return a > b ? a : b;
    case SJ_OP_MINIMUM: return a < b ? a : b;
    default: return sj_rt_ipow(a, b);
    }
}

template <class V> SJ_DEV uint8_t cmp_op(int op, V a, V b) {
    switch (op) {
    case SJ_OP_EQ: return a == b;
    case SJ_OP_NE: return a != b;
    case SJ_OP_LT: return a < b;
    case SJ_OP_LE: return a <= b;
    case SJ_OP_GT: return a > b;
    default: return a >= b;
    }
}

SJ_DEV bool is_cmp_op(int op) { return op >= SJ_OP_EQ && op <= SJ_OP_GE; }

/* NaN-propagating max (a NaN already held stays). */
SJ_DEV float max_nan(float m, float v) { return (v > m || v != v) ? v : m; }

/* -- Index arithmetic -----------------------------------------------------------
 * Offsets of the element with row-major index i over a collapsed shape
 * (outermost first), for the first NOPS operands. The loops are unrolled
 * over the maximum rank so every array index is a constant: the
 * __grid_constant__ argument structs are read in place, never copied. */

template <int NOPS>
SJ_DEV void ew_offsets32(const sj_ek_ew &p, uint32_t i, int64_t (&off)[NOPS]) {
#pragma unroll
    for (int k = 0; k < NOPS; k++) off[k] = 0;
#pragma unroll
    for (int d = SJ_EK_MAXR - 1; d >= 0; d--) {
        if (d < p.rank) {
            uint32_t c = i;
            if (d > 0) {
                uint32_t q = (__umulhi(i, p.div_mul[d]) + i) >> p.div_shift[d];
                c = i - q * (uint32_t)p.shape[d];
                i = q;
            }
#pragma unroll
            for (int k = 0; k < NOPS; k++) off[k] += (int64_t)c * p.stride[k][d];
        }
    }
}

template <int NOPS>
SJ_DEV void ew_offsets64(const sj_ek_ew &p, int64_t i, int64_t (&off)[NOPS]) {
#pragma unroll
    for (int k = 0; k < NOPS; k++) off[k] = 0;
#pragma unroll
    for (int d = SJ_EK_MAXR - 1; d >= 0; d--) {
        if (d < p.rank) {
            int64_t c = i;
            if (d > 0) {
                int64_t q = i / p.shape[d];
                c = i - q * p.shape[d];
                i = q;
            }
#pragma unroll
            for (int k = 0; k < NOPS; k++) off[k] += c * p.stride[k][d];
        }
    }
}

/* Add to oa and ob the offsets of linear (row-major) position i over
 * shape[0..rank), at strides sa and sb. */
SJ_DEV void add_offsets2(int64_t i, int rank, const int64_t *shape, const int64_t *sa, const int64_t *sb,
                         int64_t &oa, int64_t &ob) {
#pragma unroll
    for (int d = SJ_EK_MAXR - 1; d >= 0; d--) {
        if (d < rank) {
            int64_t c = i;
            if (d > 0) {
                int64_t q = i / shape[d];
                c = i - q * shape[d];
                i = q;
            }
            oa += c * sa[d];
            ob += c * sb[d];
        }
    }
}

/* Row r of a sj_ek_rows plan: offsets into x and y. */
SJ_DEV void row_offsets(const sj_ek_rows &p, int64_t r, int64_t &ox, int64_t &oy) {
    ox = 0;
    oy = 0;
    add_offsets2(r, p.rank, p.shape, p.xstride, p.ystride, ox, oy);
}

/* Global thread index and count of a 1-D grid-stride loop. */
SJ_DEV int64_t gtid() { return (int64_t)blockIdx.x * blockDim.x + threadIdx.x; }
SJ_DEV int64_t gthreads() { return (int64_t)gridDim.x * blockDim.x; }

/* -- Reductions -----------------------------------------------------------------
 * A reducer R: type V, identity, and an associative combine. Floats sum in
 * f32 (each thread over its strided share, then a tree: xor shuffles in the
 * warp, then the warps' partials in order), integers in uint64 (wrapping). */

struct r_sum_f {
    typedef float V;
    static __device__ __forceinline__ V init() { return 0.0f; }
    static __device__ __forceinline__ V comb(V a, V b) { return a + b; }
};
struct r_max_f {
    typedef float V;
    static __device__ __forceinline__ V init() { return -INFINITY; }
    static __device__ __forceinline__ V comb(V a, V b) { return max_nan(a, b); }
};
struct r_sum_i {
    typedef unsigned long long V;
    static __device__ __forceinline__ V init() { return 0; }
    static __device__ __forceinline__ V comb(V a, V b) { return a + b; }
};
struct r_max_i {
    typedef long long V;
    static __device__ __forceinline__ V init() { return INT64_MIN; }
    static __device__ __forceinline__ V comb(V a, V b) { return a > b ? a : b; }
};

/* Butterfly: every lane ends with the same value (the pairings are
 * symmetric, and IEEE addition is commutative). */
template <class R> SJ_DEV typename R::V warp_reduce(typename R::V v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = R::comb(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Reduce over a group of `group` warps (the warps of threadIdx.y when group
 * > 1, which must then be every warp of the block): every thread of the
 * group gets the result. Block-uniform calls only when group > 1. */
template <class R> SJ_DEV typename R::V group_reduce(typename R::V v, int group) {
    __shared__ typename R::V part[32];
    v = warp_reduce<R>(v);
    if (group == 1)
        return v;
    __syncthreads(); /* the previous call's readers are done */
    if (threadIdx.x == 0)
        part[threadIdx.y] = v;
    __syncthreads();
    typename R::V r = part[0];
    for (int w = 1; w < group; w++) r = R::comb(r, part[w]);
    return r;
}

#endif /* SJ_EAGER_COMMON_CUH */
