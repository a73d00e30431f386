/* Eager kernels that are neither elementwise nor rows (included by
 * eager.cu): integer matmul, attention, gather.
 */
#ifndef SJ_EAGER_MISC_CUH
#define SJ_EAGER_MISC_CUH

#include "kernels/cuda/eager_att_online.cuh"
#include "kernels/cuda/eager_common.cuh"

/* -- Integer matmul -------------------------------------------------------------
 * One thread per output element (grid-stride), exact: uint64 products and
 * sums (wrapping), narrowed on store. Float matmuls go through cuBLASLt. */

template <class T> SJ_DEV void matmul_int(const sj_ek_mm &p) {
    typedef typename T::S S;
    const S *a = reinterpret_cast<const S *>(p.a);
    const S *b = reinterpret_cast<const S *>(p.b);
    S *y = reinterpret_cast<S *>(p.y);
    const int64_t total = p.batches * p.M * p.N, nt = gthreads();
    for (int64_t o = gtid(); o < total; o += nt) {
        int64_t j = o % p.N, rest = o / p.N;
        int64_t i = rest % p.M, bt = rest / p.M;
        int64_t oy = 0, oa = 0, ob = 0;
#pragma unroll
        for (int d = SJ_EK_MAXR - 1; d >= 0; d--) {
            if (d < p.brank) {
                int64_t c = bt;
                if (d > 0) {
                    int64_t q = bt / p.bshape[d];
                    c = bt - q * p.bshape[d];
                    bt = q;
                }
                oy += c * p.bstride[0][d];
                oa += c * p.bstride[1][d];
                ob += c * p.bstride[2][d];
            }
        }
        const S *ar = a + oa + i * p.sam;
        const S *bc = b + ob + j * p.sbn;
        uint64_t acc = 0;
        for (int64_t k = 0; k < p.K; k++)
            acc += (uint64_t)T::ld(ar[k * p.sak]) * (uint64_t)T::ld(bc[k * p.sbk]);
        y[oy + i * p.sym + j * p.syn] = T::st(sj_rt_i64_from_u(acc));
    }
}

/* -- Attention -----------------------------------------------------------------------
 * One block per (b, h, query i), looping over blocks when there are more.
 * Key j is visible when j < lim = min(len[b] clamped to [0, Sk], causal ?
 * i + Sk - Sq + 1 : Sk); a query with lim <= 0 gives zeros. The visible
 * keys go through att_online (eager_att_online.cuh: an online softmax,
 * SJ_EK_ATT_CHUNK keys at a time), each score the dot scaled after the
 * sum, as the CPU's sgemm alpha does, plus the mask.
 * Dynamic shared memory: q[D], p[CHUNK], acc[Dv] floats. */

/* att_mask: eager_attention_tc.cuh. */

/* Score of key j for query (b, h, i): the dot scaled, plus the mask. */
struct att_score {
    const sj_ek_att &p;
    int64_t b, h, i;
    __device__ __forceinline__ float operator()(float dot, int64_t j) const {
        return dot * p.scale + (p.mask ? att_mask(p, b, h, i, j) : 0.0f);
    }
};

template <class T> SJ_DEV void attention(const sj_ek_att &p) {
    typedef typename T::S S;
    extern __shared__ float att_sm[];
    const S *q = reinterpret_cast<const S *>(p.q);
    const S *k = reinterpret_cast<const S *>(p.k);
    const S *v = reinterpret_cast<const S *>(p.v);
    S *y = reinterpret_cast<S *>(p.y);
    const int t = (int)threadIdx.x, nthr = (int)blockDim.x;
    const int64_t total = p.B * p.H * p.Sq;
    for (int64_t blk = blockIdx.x; blk < total; blk += gridDim.x) {
        const int64_t i = blk % p.Sq, bh = blk / p.Sq;
        const int64_t h = bh % p.H, bb = bh / p.H;
        int64_t lim = p.Sk;
        if (p.len) {
            int64_t L = p.len_i64 ? reinterpret_cast<const int64_t *>(p.len)[bb * p.slen]
                                  : (int64_t) reinterpret_cast<const int32_t *>(p.len)[bb * p.slen];
            lim = L < 0 ? 0 : L > p.Sk ? p.Sk : L;
        }
        if (p.causal && i + p.Sk - p.Sq + 1 < lim)
            lim = i + p.Sk - p.Sq + 1;
        S *yr = y + bb * p.sy[0] + h * p.sy[1] + i * p.sy[2];
        if (lim <= 0) { /* uniform in the block */
            for (int64_t e = t; e < p.Dv; e += nthr) yr[e * p.sy[3]] = T::st(0.0f);
            continue;
        }
        const att_rows<S> r = {q + bb * p.sq[0] + h * p.sq[1] + i * p.sq[2], p.sq[3],
                               k + bb * p.sk[0] + h * p.sk[1],                p.sk[2], p.sk[3],
                               v + bb * p.sv[0] + h * p.sv[1],                p.sv[2], p.sv[3],
                               yr,                                            p.sy[3],
                               p.D,                                           p.Dv};
        att_online<T>(r, 0, lim, att_score{p, bb, h, i}, att_sm);
    }
}

/* -- Gather ----------------------------------------------------------------------------
 * y[p..., r...] = table[idx[p...], r...], one thread per output element
 * (grid-stride); an index outside [0, V) sets *flag and writes nothing. */

template <class E> SJ_DEV void gather(const sj_ek_gather &p) {
    typedef typename E::S S;
    const S *table = reinterpret_cast<const S *>(p.table);
    S *y = reinterpret_cast<S *>(p.y);
    const int64_t nt = gthreads();
    const int64_t per = p.rowel > 0 ? p.rowel : 1;
    const int64_t total = p.count * per;
    for (int64_t o = gtid(); o < total; o += nt) {
        int64_t pos = o / per, r = o - pos * per;
        int64_t io = 0, yo = 0;
        add_offsets2(pos, p.irank, p.ishape, p.istride, p.iystride, io, yo);
        const int64_t ix = p.idx_i64 ? reinterpret_cast<const int64_t *>(p.idx)[io]
                                     : (int64_t) reinterpret_cast<const int32_t *>(p.idx)[io];
        if (ix < 0 || ix >= p.V) {
            *reinterpret_cast<volatile int *>(p.flag) = 1;
            continue;
        }
        if (p.rowel == 0)
            continue;
        int64_t to = ix * p.ts0;
        if (p.contig) {
            to += r;
            yo += r;
        } else {
            add_offsets2(r, p.rrank, p.rshape, p.rtstride, p.rystride, to, yo);
        }
        y[yo] = table[to];
    }
}

/* -- Arange ------------------------------------------------------------------------------
 * y[i * stride] = i, converted as T stores it: integers exact (i32 wraps
 * past 2^31), floats through f32 like the CPU's sj_cpu_arange. */

template <class T> SJ_DEV void arange(const sj_ek_ew &p) {
    typedef typename T::S S;
    typedef typename T::C C;
    S *y = reinterpret_cast<S *>(p.ptr[0]);
    const int64_t s = p.stride[0][0], nt = gthreads();
    for (int64_t i = gtid(); i < p.n; i += nt) y[i * s] = T::st((C)i);
}

/* -- Kernel definitions ------------------------------------------------------------------ */

#define SJ_EK_DEF_matmul_int(tag)                                                                  \
    extern "C" __global__ void __launch_bounds__(SJ_EK_THREADS)                                    \
        sj_ek_matmul_int_##tag(const __grid_constant__ sj_ek_mm a) {                               \
        sj_rt_grid_dep();                                                                          \
        matmul_int<dt_##tag>(a);                                                                   \
    }
#define SJ_EK_DEF_attention(tag)                                                                   \
    extern "C" __global__ void __launch_bounds__(SJ_EK_ATT_THREADS)                                \
        sj_ek_attention_##tag(const __grid_constant__ sj_ek_att a) {                               \
        sj_rt_grid_dep();                                                                          \
        attention<dt_##tag>(a);                                                                    \
    }
#define SJ_EK_DEF_gather(tag)                                                                      \
    extern "C" __global__ void __launch_bounds__(SJ_EK_THREADS)                                    \
        sj_ek_gather_##tag(const __grid_constant__ sj_ek_gather a) {                               \
        sj_rt_grid_dep();                                                                          \
        gather<dt_##tag>(a);                                                                       \
    }

#define SJ_EK_DEF_arange(tag)                                                                      \
    extern "C" __global__ void __launch_bounds__(SJ_EK_THREADS)                                    \
        sj_ek_arange_##tag(const __grid_constant__ sj_ek_ew a) {                                   \
        sj_rt_grid_dep();                                                                          \
        arange<dt_##tag>(a);                                                                       \
    }

#endif /* SJ_EAGER_MISC_CUH */
