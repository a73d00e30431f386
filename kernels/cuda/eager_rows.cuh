/* Eager row kernels (included by eager.cu): reductions over one axis,
 * softmax over one axis, layer norm and RMS norm over the last axis.
 *
 * A "row" is the run of n elements along the reduced (softmax, norm) axis;
 * the other axes are collapsed by the host into rows (sj_ek_rows).
 * - *_row kernels: block (32, W); with group 1 each warp owns a row (short
 *   rows), with group == W the whole block does (long rows). Threads stride
 *   along the row (coalesced when its stride is 1), each accumulating in
 *   f32 (ints: uint64), then a tree: warp shuffles, then shared memory.
 * - *_col kernels, for an axis that is not innermost while the rows are
 *   (x's innermost other axis has stride 1): 32 consecutive rows per block,
 *   one per lane (coalesced across the lanes), the W warps of the block
 *   splitting the axis; the partials meet in shared memory.
 * Definitions as kernels/cpu/reduce.c: mean = sum / n (NaN for n = 0),
 * amax propagates NaN, softmax e = exp(x - max), y = e * (1 / sum(e)) with
 * all -inf rows giving zeros, layer norm with the biased variance,
 * rstd = 1 / sqrt(var + eps), RMS norm x / sqrt(mean(x^2) + eps) * g.
 */
#ifndef SJ_EAGER_ROWS_CUH
#define SJ_EAGER_ROWS_CUH

#include "kernels/cuda/eager_common.cuh"

/* The rows this thread's group takes, in a grid-stride loop: calls
 * body(row, t, nthr) with t the thread's index in its group of nthr
 * threads. Uniform across a group; block-uniform when group > 1. */
template <class Body> SJ_DEV void for_rows(const sj_ek_rows &p, const Body &body) {
    const int group = p.group;
    const int per_block = (int)blockDim.y / group; /* rows per block: W or 1 */
    const int sub = group == 1 ? (int)threadIdx.y : 0;
    const int t = group == 1 ? (int)threadIdx.x : (int)(threadIdx.y * 32 + threadIdx.x);
    const int nthr = group * 32;
    for (int64_t r0 = (int64_t)blockIdx.x * per_block; r0 < p.rows; r0 += (int64_t)gridDim.x * per_block) {
        int64_t r = r0 + sub;
        if (r < p.rows) /* always true when group > 1 */
            body(r, t, nthr);
    }
}

/* -- Reductions ---------------------------------------------------------------- */

template <class T, class R> SJ_DEV void reduce_row_impl(const sj_ek_rows &p) {
    typedef typename T::S S;
    typedef typename R::V V;
    const S *x = reinterpret_cast<const S *>(p.x);
    S *y = reinterpret_cast<S *>(p.y);
    for_rows(p, [&](int64_t r, int t, int nthr) {
        int64_t ox, oy;
        row_offsets(p, r, ox, oy);
        V acc = R::init();
        for (int64_t k = t; k < p.n; k += nthr) acc = R::comb(acc, (V)T::ld(x[ox + k * p.sx]));
        acc = group_reduce<R>(acc, p.group);
        if (t == 0) {
            if constexpr (is_float_dt<T>::value)
                y[oy] = T::st(p.op == SJ_OP_MEAN ? acc / (float)p.n : acc);
            else
                y[oy] = T::st(sj_rt_i64_from_u((uint64_t)acc));
        }
    });
}

template <class T> SJ_DEV void reduce_row(const sj_ek_rows &p) {
    if constexpr (is_float_dt<T>::value) {
        if (p.op == SJ_OP_AMAX)
            reduce_row_impl<T, r_max_f>(p);
        else
            reduce_row_impl<T, r_sum_f>(p);
    } else {
        if (p.op == SJ_OP_AMAX)
            reduce_row_impl<T, r_max_i>(p);
        else
            reduce_row_impl<T, r_sum_i>(p);
    }
}

/* 32 rows per block; warps split the axis. */
template <class T, class R> SJ_DEV void reduce_col_impl(const sj_ek_rows &p) {
    typedef typename T::S S;
    typedef typename R::V V;
    __shared__ V part[32][33];
    const S *x = reinterpret_cast<const S *>(p.x);
    S *y = reinterpret_cast<S *>(p.y);
    const int W = (int)blockDim.y, tx = (int)threadIdx.x, ty = (int)threadIdx.y;
    for (int64_t r0 = (int64_t)blockIdx.x * 32; r0 < p.rows; r0 += (int64_t)gridDim.x * 32) {
        const int64_t r = r0 + tx;
        int64_t ox = 0, oy = 0;
        V acc = R::init();
        if (r < p.rows) {
            row_offsets(p, r, ox, oy);
            for (int64_t k = ty; k < p.n; k += W) acc = R::comb(acc, (V)T::ld(x[ox + k * p.sx]));
        }
        part[ty][tx] = acc;
        __syncthreads();
        if (ty == 0 && r < p.rows) {
            V v = part[0][tx];
            for (int w = 1; w < W; w++) v = R::comb(v, part[w][tx]);
            if constexpr (is_float_dt<T>::value)
                y[oy] = T::st(p.op == SJ_OP_MEAN ? v / (float)p.n : v);
            else
                y[oy] = T::st(sj_rt_i64_from_u((uint64_t)v));
        }
        __syncthreads();
    }
}

template <class T> SJ_DEV void reduce_col(const sj_ek_rows &p) {
    if constexpr (is_float_dt<T>::value) {
        if (p.op == SJ_OP_AMAX)
            reduce_col_impl<T, r_max_f>(p);
        else
            reduce_col_impl<T, r_sum_f>(p);
    } else {
        if (p.op == SJ_OP_AMAX)
            reduce_col_impl<T, r_max_i>(p);
        else
            reduce_col_impl<T, r_sum_i>(p);
    }
}

/* -- Softmax ----------------------------------------------------------------------- */

template <class T> SJ_DEV void softmax_row(const sj_ek_rows &p) {
    typedef typename T::S S;
    const S *x = reinterpret_cast<const S *>(p.x);
    S *y = reinterpret_cast<S *>(p.y);
    for_rows(p, [&](int64_t r, int t, int nthr) {
        int64_t ox, oy;
        row_offsets(p, r, ox, oy);
        float m = -INFINITY;
        for (int64_t k = t; k < p.n; k += nthr) m = max_nan(m, T::ld(x[ox + k * p.sx]));
        m = group_reduce<r_max_f>(m, p.group);
        if (m == -INFINITY) { /* every element -inf: zeros (uniform in the group) */
            for (int64_t k = t; k < p.n; k += nthr) y[oy + k * p.sy] = T::st(0.0f);
            return;
        }
        float s = 0.0f;
        for (int64_t k = t; k < p.n; k += nthr) s += sj_rt_expf(T::ld(x[ox + k * p.sx]) - m);
        s = group_reduce<r_sum_f>(s, p.group);
        const float inv = 1.0f / s;
        for (int64_t k = t; k < p.n; k += nthr)
            y[oy + k * p.sy] = T::st(sj_rt_expf(T::ld(x[ox + k * p.sx]) - m) * inv);
    });
}

template <class T> SJ_DEV void softmax_col(const sj_ek_rows &p) {
    typedef typename T::S S;
    __shared__ float part[32][33];
    const S *x = reinterpret_cast<const S *>(p.x);
    S *y = reinterpret_cast<S *>(p.y);
    const int W = (int)blockDim.y, tx = (int)threadIdx.x, ty = (int)threadIdx.y;
    for (int64_t r0 = (int64_t)blockIdx.x * 32; r0 < p.rows; r0 += (int64_t)gridDim.x * 32) {
        const int64_t r = r0 + tx;
        const bool on = r < p.rows;
        int64_t ox = 0, oy = 0;
        if (on)
            row_offsets(p, r, ox, oy);
        float m = -INFINITY;
        if (on)
            for (int64_t k = ty; k < p.n; k += W) m = max_nan(m, T::ld(x[ox + k * p.sx]));
        part[ty][tx] = m;
        __syncthreads();
        m = part[0][tx];
        for (int w = 1; w < W; w++) m = max_nan(m, part[w][tx]);
        __syncthreads();
        float s = 0.0f;
        if (on && m != -INFINITY)
            for (int64_t k = ty; k < p.n; k += W) s += sj_rt_expf(T::ld(x[ox + k * p.sx]) - m);
        part[ty][tx] = s;
        __syncthreads();
        s = part[0][tx];
        for (int w = 1; w < W; w++) s += part[w][tx];
        __syncthreads();
        if (on) {
            const float inv = 1.0f / s;
            for (int64_t k = ty; k < p.n; k += W)
                y[oy + k * p.sy] = T::st(m == -INFINITY ? 0.0f : sj_rt_expf(T::ld(x[ox + k * p.sx]) - m) * inv);
        }
    }
}

/* -- Norms ------------------------------------------------------------------------- */

template <class T> SJ_DEV void norm_row(const sj_ek_rows &p) {
    typedef typename T::S S;
    const S *x = reinterpret_cast<const S *>(p.x);
    const S *g = reinterpret_cast<const S *>(p.g);
    const S *b = reinterpret_cast<const S *>(p.b);
    S *y = reinterpret_cast<S *>(p.y);
    const bool rms = p.op != 0;
    const float fn = (float)p.n;
    for_rows(p, [&](int64_t r, int t, int nthr) {
        int64_t ox, oy;
        row_offsets(p, r, ox, oy);
        /* layer norm: the f32 sum's mean, then cm, what it is off by, from
         * the centred values' sum, and the variance corrected by cm^2 (as
         * the generated kernels: specialize/codegen_cuda.c) */
        float mean = 0.0f, cm = 0.0f;
        if (!rms) {
            float s = 0.0f;
            for (int64_t k = t; k < p.n; k += nthr) s += T::ld(x[ox + k * p.sx]);
            mean = group_reduce<r_sum_f>(s, p.group) / fn;
        }
        float q = 0.0f, c = 0.0f;
        for (int64_t k = t; k < p.n; k += nthr) {
            float d = T::ld(x[ox + k * p.sx]) - mean;
            q += d * d;
            c += d;
        }
        float var = group_reduce<r_sum_f>(q, p.group) / fn;
        if (!rms) {
            cm = group_reduce<r_sum_f>(c, p.group) / fn;
            var -= cm * cm;
            var = var < 0.0f ? 0.0f : var; /* NaN stays */
        }
        const float rstd = 1.0f / sqrtf(var + p.eps);
        for (int64_t k = t; k < p.n; k += nthr) {
            float v = (T::ld(x[ox + k * p.sx]) - mean - cm) * rstd;
            if (g)
                v *= T::ld(g[k * p.sg]);
            if (b)
                v += T::ld(b[k * p.sb]);
            y[oy + k * p.sy] = T::st(v);
        }
    });
}

/* -- Kernel definitions ----------------------------------------------------------- */

/* As SJ_EK_EW_KERNEL: the wait, then the body that follows. */
#define SJ_EK_ROWS_KERNEL(fam, tag)                                                                \
    static __device__ __forceinline__ void sj_ek_body_##fam##_##tag(const sj_ek_rows &a);          \
    extern "C" __global__ void __launch_bounds__(SJ_EK_ROW_MAX)                                    \
        sj_ek_##fam##_##tag(const __grid_constant__ sj_ek_rows a) {                                \
        sj_rt_grid_dep();                                                                          \
        sj_ek_body_##fam##_##tag(a);                                                               \
    }                                                                                              \
    static __device__ __forceinline__ void sj_ek_body_##fam##_##tag(const sj_ek_rows &a)

#define SJ_EK_DEF_reduce_row(tag) SJ_EK_ROWS_KERNEL(reduce_row, tag) { reduce_row<dt_##tag>(a); }
#define SJ_EK_DEF_reduce_col(tag) SJ_EK_ROWS_KERNEL(reduce_col, tag) { reduce_col<dt_##tag>(a); }
#define SJ_EK_DEF_softmax_row(tag) SJ_EK_ROWS_KERNEL(softmax_row, tag) { softmax_row<dt_##tag>(a); }
#define SJ_EK_DEF_softmax_col(tag) SJ_EK_ROWS_KERNEL(softmax_col, tag) { softmax_col<dt_##tag>(a); }
#define SJ_EK_DEF_norm_row(tag) SJ_EK_ROWS_KERNEL(norm_row, tag) { norm_row<dt_##tag>(a); }

#endif /* SJ_EAGER_ROWS_CUH */
