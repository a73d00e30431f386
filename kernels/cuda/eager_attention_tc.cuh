/* Attention on tensor cores, f16 and bf16: the kernels attention_tc_<tag>
 * and attention_tc1_<tag> (included by eager.cu after eager_common.cuh).
 *
 * A block of SJ_EK_ATT_TC_THREADS (4 warps) takes SJ_EK_ATT_TQ (64) queries of
 * one (b, h); each warp owns 16 of them, and two lanes own each of those
 * rows (even and odd columns). Keys and their values come SJ_EK_ATT_TK (64)
 * at a time into shared memory (cp.async). attention_tc keeps two tiles,
 * the next copied while this one is computed; attention_tc1 one, in less
 * memory, for calls with more blocks than can run at once (the host picks).
 * Per tile each warp
 *   - scores its 16 queries against the tile's keys (wmma 16x16x16, f32
 *     accumulation) into S,
 *   - takes the online softmax of its rows: the running max m, the rescale
 *     alpha = exp(m_old - m) of the running sum l and of the output rows,
 *     and P = exp(s - m), written in the input dtype,
 *   - adds P V (wmma) into its output rows O, kept in shared memory in f32.
 * Finally y = O / l. As in the one-query kernel (eager_misc.cuh): a score
 * is dot * scale; keys past lengths[b], or after the query's position when
 * causal, score -inf and weigh 0; a query with no key left writes zeros.
 * Keys and values past the block's last key in use are read as zeros.
 *
 * Unlike the one-query kernel: P is rounded to the input dtype before P V
 * (its sum l is not), as flash attention does; exp is the hardware's
 * (__expf, a few ulp: far below that rounding), not kernels/sj_kernel_rt.h's
 * polynomial; and a key masked for one query of a block but in use by a
 * later one (causal) is multiplied by P = 0, so an inf or NaN value there
 * makes that query's output NaN (the one-query kernel never reads such
 * keys).
 *
 * The host checks the requirements: D and Dv multiples of 16, at most
 * SJ_EK_ATT_TC_DMAX; shared memory sj_ek_att_tc_smem(D, Dv, NB) bytes (past the
 * default 48 KiB: the kernels are opted in when the module is loaded). With
 * a.vec set, rows of q, k and v are read 16 bytes at a time.
 *
 * Shared memory, in this order (every block a multiple of 32 bytes, every
 * row padded so that wmma's 32-byte aligned 16-row steps hold and rows fall
 * in different banks):
 *   S [TQ][TK + 4] f32;  O [TQ][Dv + 4] f32;
 *   Q [TQ][D + 8], K [NB][TK][D + 8], V [NB][TK][Dv + 8], P [TQ][TK + 8] in
 *   the dtype (D = Dv = 64: 88 KiB with two tiles, two blocks an SM on
 *   Hopper; 66 KiB with one, three).
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_pipeline.h>
#include <mma.h>

template <class T> struct tc_elem;
template <> struct tc_elem<dt_f16> { /* cvt rounds to nearest even, as sj_f32_to_f16 */
    typedef __half W;
    static __device__ __forceinline__ uint16_t st(float v) { return __half_as_ushort(__float2half_rn(v)); }
};
template <> struct tc_elem<dt_bf16> {
    typedef __nv_bfloat16 W;
    static __device__ __forceinline__ uint16_t st(float v) { return __bfloat16_as_ushort(__float2bfloat16_rn(v)); }
};

/* rows [0, rows) of an [*, n] slab at src (row stride s_row, element stride
 * s_col) into dst (row stride ld); rows from `valid` on are zeros. vec: 8
 * elements at a time (s_col is 1, src and s_row 16-byte aligned), copied
 * asynchronously: the caller commits the batch and waits for it. */
SJ_DEV void tc_load(uint16_t *dst, int ld, const uint16_t *src, int64_t s_row, int64_t s_col, int rows, int valid,
                    int n, bool vec) {
    const int t = (int)threadIdx.x, nthr = (int)blockDim.x;
    if (vec) {
        const int cpr = n >> 3;
        for (int c = t; c < rows * cpr; c += nthr) {
            const int r = c / cpr, e = (c - r * cpr) << 3;
            const bool in = r < valid; /* else 16 bytes of zeros, nothing read */
            __pipeline_memcpy_async(dst + r * ld + e, src + (in ? r * s_row + e : 0), 16, in ? 0 : 16);
        }
    } else {
        for (int c = t; c < rows * n; c += nthr) {
            const int r = c / n, e = c - r * n;
            dst[r * ld + e] = r < valid ? src[r * s_row + e * s_col] : (uint16_t)0;
        }
    }
}

typedef nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float> tc_acc;

/* acc += A B over k (a multiple of 16): A 16 x k row-major at a (row stride
 * lda), B k x 16 in layout LB at b (leading dimension ldb), whose next 16
 * rows of k start bstep elements on. */
template <class W, class LB>
SJ_DEV void tc_mma(tc_acc &acc, const uint16_t *a, int lda, const uint16_t *b, int ldb, int bstep, int k) {
    using namespace nvcuda;
    for (int kk = 0; kk < k; kk += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, W, wmma::row_major> fa;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, W, LB> fb;
        wmma::load_matrix_sync(fa, reinterpret_cast<const W *>(a + kk), lda);
        wmma::load_matrix_sync(fb, reinterpret_cast<const W *>(b + (kk / 16) * bstep), ldb);
        wmma::mma_sync(acc, fa, fb, acc);
    }
}

template <class T, int NB> SJ_DEV void attention_tc(const sj_ek_att &p) {
    using namespace nvcuda;
    typedef typename tc_elem<T>::W W;
    constexpr int TQ = SJ_EK_ATT_TQ, TK = SJ_EK_ATT_TK;
    extern __shared__ __align__(128) unsigned char att_tc_sm[];
    const int D = (int)p.D, Dv = (int)p.Dv;
    const int lds = TK + 4, ldo = Dv + 4, ldq = D + 8, ldv = Dv + 8, ldp = TK + 8;
    float *Ss = reinterpret_cast<float *>(att_tc_sm);
    float *Os = Ss + TQ * lds;
    uint16_t *Qs = reinterpret_cast<uint16_t *>(Os + TQ * ldo);
    uint16_t *Kb = Qs + TQ * ldq, *Vb = Kb + NB * TK * ldq, *Ps = Vb + NB * TK * ldv; /* K, V: NB tiles */
    const uint16_t *q = reinterpret_cast<const uint16_t *>(p.q);
    const uint16_t *k = reinterpret_cast<const uint16_t *>(p.k);
    const uint16_t *v = reinterpret_cast<const uint16_t *>(p.v);
    uint16_t *y = reinterpret_cast<uint16_t *>(p.y);
    const int t = (int)threadIdx.x, lane = t & 31, warp = t >> 5, nthr = (int)blockDim.x;
    const int row = warp * 16 + (lane >> 1), odd = lane & 1; /* this lane's row, and its columns' parity */
    const bool vec = p.vec != 0;
    const int64_t nqt = (p.Sq + TQ - 1) / TQ, total = p.B * p.H * nqt;
    for (int64_t blk = blockIdx.x; blk < total; blk += gridDim.x) {
        const int64_t qt = blk % nqt, bh = blk / nqt;
        const int64_t h = bh % p.H, bb = bh / p.H, i0 = qt * TQ;
        const int nq = (int)(p.Sq - i0 < TQ ? p.Sq - i0 : TQ);
        int64_t lim = p.Sk;
        if (p.len) {
            int64_t L = p.len_i64 ? reinterpret_cast<const int64_t *>(p.len)[bb * p.slen]
                                  : (int64_t) reinterpret_cast<const int32_t *>(p.len)[bb * p.slen];
            lim = L < 0 ? 0 : L > p.Sk ? p.Sk : L;
        }
        int64_t kend = lim; /* keys in use by some query of the block: the last query's */
        if (p.causal && i0 + nq + p.Sk - p.Sq < kend) kend = i0 + nq + p.Sk - p.Sq;
        const int64_t i = i0 + row;
        int64_t rl = i < p.Sq ? lim : 0; /* this row's keys */
        if (p.causal && i + p.Sk - p.Sq + 1 < rl) rl = i + p.Sk - p.Sq + 1;
        __syncthreads(); /* the previous block's readers of Q, K, V and O are done */
        tc_load(Qs, ldq, q + bb * p.sq[0] + h * p.sq[1] + i0 * p.sq[2], p.sq[2], p.sq[3], TQ, nq, D, vec);
        for (int c = t; c < TQ * Dv; c += nthr) Os[(c / Dv) * ldo + c % Dv] = 0.0f;
        float m = -INFINITY, l = 0.0f; /* the same in both lanes of the row */
        const uint16_t *kh = k + bb * p.sk[0] + h * p.sk[1], *vh = v + bb * p.sv[0] + h * p.sv[1];
        /* tile j0's K and V go to buffer (j0 / TK) % NB; with two, the next
         * tile is loaded while this one is computed */
        auto load_kv = [&](int64_t j0) {
            const int nk = (int)(kend - j0 < TK ? kend - j0 : TK), buf = (int)((j0 / TK) % NB);
            tc_load(Kb + buf * TK * ldq, ldq, kh + j0 * p.sk[2], p.sk[2], p.sk[3], TK, nk, D, vec);
            tc_load(Vb + buf * TK * ldv, ldv, vh + j0 * p.sv[2], p.sv[2], p.sv[3], TK, nk, Dv, vec);
        };
        if (NB == 2 && kend > 0) load_kv(0);
        __pipeline_commit(); /* with Q */
        for (int64_t j0 = 0; j0 < kend; j0 += TK) {
            if (NB == 1) {
                load_kv(j0);
                __pipeline_commit();
                __pipeline_wait_prior(0);
            } else if (j0 + TK < kend) {
                load_kv(j0 + TK);
                __pipeline_commit();
                __pipeline_wait_prior(1); /* all but the newest batch: this tile's */
            } else {
                __pipeline_wait_prior(0);
            }
            __syncthreads(); /* Q, O and this tile's K and V written, by every thread */
            const int buf = (int)((j0 / TK) % NB);
            const uint16_t *Ks = Kb + buf * TK * ldq, *Vs = Vb + buf * TK * ldv;
            for (int n = 0; n < TK; n += 16) { /* S = Q K^T, this warp's rows; K^T is K column-major */
                tc_acc acc;
                wmma::fill_fragment(acc, 0.0f);
                tc_mma<W, wmma::col_major>(acc, Qs + warp * 16 * ldq, ldq, Ks + n * ldq, ldq, 16, D);
                wmma::store_matrix_sync(Ss + warp * 16 * lds + n, acc, lds, wmma::mem_row_major);
            }
            __syncwarp();
            float *sr = Ss + row * lds;
            float cm = -INFINITY;
            for (int c = odd; c < TK; c += 2) {
                const float s = j0 + c < rl ? sr[c] * p.scale : -INFINITY;
                sr[c] = s;
                cm = max_nan(cm, s);
            }
            cm = max_nan(cm, __shfl_xor_sync(0xffffffffu, cm, 1));
            const float mn = max_nan(m, cm);
            /* mn = -inf only when every score so far is -inf: those weigh 0 */
            const float alpha = m == -INFINITY ? 0.0f : __expf(m - mn);
            uint16_t *pr = Ps + row * ldp;
            float cs = 0.0f;
            for (int c = odd; c < TK; c += 2) {
                const float e = mn == -INFINITY ? 0.0f : __expf(sr[c] - mn);
                pr[c] = tc_elem<T>::st(e);
                cs += e;
            }
            cs += __shfl_xor_sync(0xffffffffu, cs, 1);
            l = l * alpha + cs;
            m = mn;
            float *orow = Os + row * ldo;
            for (int e = odd; e < Dv; e += 2) orow[e] *= alpha;
            __syncwarp();
            for (int cb = 0; cb < Dv; cb += 16) { /* O += P V, this warp's rows */
                tc_acc o;
                wmma::load_matrix_sync(o, Os + warp * 16 * ldo + cb, ldo, wmma::mem_row_major);
                tc_mma<W, wmma::row_major>(o, Ps + warp * 16 * ldp, ldp, Vs + cb, ldv, 16 * ldv, TK);
                wmma::store_matrix_sync(Os + warp * 16 * ldo + cb, o, ldo, wmma::mem_row_major);
            }
            __syncthreads(); /* every warp is done with this tile's buffer: the next load reuses it */
        }
        __pipeline_wait_prior(0); /* no tile (kend = 0): Q's batch */
        if (i < p.Sq) { /* l = 0: no key (O may not even be zeroed yet: no tile ran) */
            const float inv = l > 0.0f ? 1.0f / l : 0.0f;
            uint16_t *yr = y + bb * p.sy[0] + h * p.sy[1] + i * p.sy[2];
            const float *orow = Os + row * ldo;
            for (int e = odd; e < Dv; e += 2) yr[e * p.sy[3]] = tc_elem<T>::st(l > 0.0f ? orow[e] * inv : 0.0f);
        }
    }
}

#define SJ_EK_DEF_attention_tc(tag)                                                                \
    extern "C" __global__ void __launch_bounds__(SJ_EK_ATT_TC_THREADS)                             \
        sj_ek_attention_tc_##tag(const __grid_constant__ sj_ek_att a) {                            \
        attention_tc<dt_##tag, 2>(a);                                                              \
    }
#define SJ_EK_DEF_attention_tc1(tag)                                                               \
    extern "C" __global__ void __launch_bounds__(SJ_EK_ATT_TC_THREADS)                             \
        sj_ek_attention_tc1_##tag(const __grid_constant__ sj_ek_att a) {                           \
        attention_tc<dt_##tag, 1>(a);                                                              \
    }
