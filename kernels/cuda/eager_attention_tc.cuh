/* Attention on tensor cores, f16 and bf16: the kernels attention_tc_<tag>
 * and attention_tc1_<tag> for head sizes in multiples of 16, and
 * attention_mma<D>_<tag> (below) for D = Dv = 32, 64, 96 and 128, about
 * twice as fast (included by eager.cu after eager_common.cuh).
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
 * is dot * scale, plus the mask's value if the call has one (att_mask,
 * read only for the keys in use); keys past lengths[b], or after the query's position when
 * causal, score -inf and weigh 0; a query with no key left writes zeros.
 * Keys and values past the block's last key in use are read as zeros.
 *
 * Unlike the one-query kernel: P is rounded to the input dtype before P V
 * (its sum l is not), as flash attention does; exp is the hardware's
 * (__expf, a few ulp: far below that rounding), not base/sj_kernel_rt.h's
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
 * asynchronously: the caller commits the batch and waits for it. Copied by
 * threads t of nthr (default: the block's). */
SJ_DEV void tc_load(uint16_t *dst, int ld, const uint16_t *src, int64_t s_row, int64_t s_col, int rows, int valid,
                    int n, bool vec, int t = (int)threadIdx.x, int nthr = (int)blockDim.x) {
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

/* Block blk's queries [i0, i0 + nq) of head (bb, h) with tq queries a
 * block; lim: the keys batch bb has; kend: the keys some query of the
 * block uses (the last one's). */
struct tc_block {
    int64_t h, bb, i0, lim, kend;
    int nq;
};
SJ_DEV tc_block tc_block_at(const sj_ek_att &p, int64_t blk, int tq) {
    const int64_t nqt = (p.Sq + tq - 1) / tq, qt = blk % nqt, bh = blk / nqt;
    tc_block b;
    b.h = bh % p.H, b.bb = bh / p.H, b.i0 = qt * tq;
    b.nq = (int)(p.Sq - b.i0 < tq ? p.Sq - b.i0 : tq);
    b.lim = p.Sk;
    if (p.len) {
        int64_t L = p.len_i64 ? reinterpret_cast<const int64_t *>(p.len)[b.bb * p.slen]
                              : (int64_t) reinterpret_cast<const int32_t *>(p.len)[b.bb * p.slen];
        b.lim = L < 0 ? 0 : L > p.Sk ? p.Sk : L;
    }
    b.kend = b.lim;
    if (p.causal && b.i0 + b.nq + p.Sk - p.Sq < b.kend) b.kend = b.i0 + b.nq + p.Sk - p.Sq;
    return b;
}

/* The keys query i of block b uses: none past Sq, none after its own
 * position when causal. */
SJ_DEV int64_t tc_row_keys(const sj_ek_att &p, const tc_block &b, int64_t i) {
    int64_t rl = i < p.Sq ? b.lim : 0;
    if (p.causal && i + p.Sk - p.Sq + 1 < rl) rl = i + p.Sk - p.Sq + 1;
    return rl;
}

/* The additive mask of score (b, h, i, j): f32/f16/bf16 values, or bool
 * (false: -inf). */
SJ_DEV float att_mask(const sj_ek_att &p, int64_t b, int64_t h, int64_t i, int64_t j) {
    const int64_t o = b * p.smask[0] + h * p.smask[1] + i * p.smask[2] + j * p.smask[3];
    switch (p.mask_dt) {
    case SJ_F16: return dt_f16::ld(reinterpret_cast<const uint16_t *>(p.mask)[o]);
    case SJ_BF16: return dt_bf16::ld(reinterpret_cast<const uint16_t *>(p.mask)[o]);
    case SJ_BOOL: return reinterpret_cast<const uint8_t *>(p.mask)[o] ? 0.0f : -INFINITY;
    default: return reinterpret_cast<const float *>(p.mask)[o];
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
    const int64_t total = p.B * p.H * ((p.Sq + TQ - 1) / TQ);
    for (int64_t blk = blockIdx.x; blk < total; blk += gridDim.x) {
        const tc_block tb = tc_block_at(p, blk, TQ);
        const int64_t h = tb.h, bb = tb.bb, i0 = tb.i0, kend = tb.kend;
        const int nq = tb.nq;
        const int64_t i = i0 + row;
        const int64_t rl = tc_row_keys(p, tb, i); /* this row's keys */
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
                /* the mask, if any, only on the keys in use (none past Sk) */
                const float s = j0 + c < rl ? sr[c] * p.scale + (p.mask ? att_mask(p, bb, h, i, j0 + c) : 0.0f)
                                            : -INFINITY;
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
        if (i < p.Sq) { /* l = 0: no key (O may not even be zeroed yet: no tile ran); NaN stays NaN */
            const float inv = 1.0f / l;
            uint16_t *yr = y + bb * p.sy[0] + h * p.sy[1] + i * p.sy[2];
            const float *orow = Os + row * ldo;
            for (int e = odd; e < Dv; e += 2) yr[e * p.sy[3]] = tc_elem<T>::st(l != 0.0f ? orow[e] * inv : 0.0f);
        }
    }
}

#define SJ_EK_DEF_attention_tc(tag)                                                                \
    extern "C" __global__ void __launch_bounds__(SJ_EK_ATT_TC_THREADS)                             \
        sj_ek_attention_tc_##tag(const __grid_constant__ sj_ek_att a) {                            \
        sj_rt_grid_dep();                                                                          \
        attention_tc<dt_##tag, 2>(a);                                                              \
    }
#define SJ_EK_DEF_attention_tc1(tag)                                                               \
    extern "C" __global__ void __launch_bounds__(SJ_EK_ATT_TC_THREADS)                             \
        sj_ek_attention_tc1_##tag(const __grid_constant__ sj_ek_att a) {                           \
        sj_rt_grid_dep();                                                                          \
        attention_tc<dt_##tag, 1>(a);                                                              \
    }

/* -- attention_mma: the scores, the softmax and the output in registers ------------
 * The kernels attention_mma<D>_<tag> (D = Dv = 32, 64, 96 or 128), as flash
 * attention 2 lays the work out: a key group of W = SJ_EK_ATT_MMA_WARPS
 * warps takes 16 W queries of one (b, h); each warp owns 16 of them and
 * keeps everything about them
 * in registers, with mma.sync m16n8k16 (f32 accumulation) instead of
 * wmma's opaque fragments:
 *   - its Q rows as A fragments, loaded once;
 *   - per tile of 64 keys, S = Q K^T as 8 accumulator tiles of 16 x 8;
 *     lane l holds rows l / 4 and l / 4 + 8 of each, columns 2 (l % 4) and
 *     one more; a row's max and sum combine over the four lanes that share
 *     it (two shuffles);
 *   - P = exp(scale S - max) rounded to the dtype, computed in base 2 as
 *     2^(S sl - m) with sl = scale log2(e) and m the running max of S sl
 *     (one ex2 instruction a score), which as packed pairs is already
 *     the A fragment of P V (the accumulator layout of two neighbouring
 *     tiles is the A layout of one 16 x 16);
 *   - O (16 x Dv) as Dv / 8 accumulator tiles, rescaled by alpha in place.
 * Keys and values come through shared memory as in attention_tc (cp.async,
 * two tiles); K's and V's B fragments are read by ldmatrix (V's
 * transposed), 32 columns of K at a time, hence D a multiple of 32. No
 * shared memory holds S, P or O, and a warp never waits for another except
 * at the tile loads. The masks, the rounding of P before P V, l in f32 and
 * the outputs of queries without keys are attention_tc's.
 *
 * With a mask (attention_mmam<D>: attention_mma with MASK, mma_maskbias)
 * each lane reads its two rows' values for the tile's keys in use through
 * the mask's strides and adds them (times log2 e) to the scaled scores
 * before the max; a row whose every key is masked keeps l = 0 and writes
 * zeros, as the one-query kernel does. The same function serves packed
 * sequences (attention_varlen_mma<D>, eager_varlen.cuh): only the blocks'
 * queries, keys and rows differ (mma_block, mma_ax).
 *
 * A block has one or two key groups (blockDim.x = 32 W KG, the host's
 * choice): with two, group g takes key tiles g, g + 2, ... for the same
 * queries, and at the end group 1's warps hand their rows' m, l and O to
 * group 0's through shared memory, where the two parts are combined as
 * softmax parts are (rescaled to the larger max).
 *
 * Shared memory: Q [16 W][D + 8], then per key group K [2][TK][D + 8] and
 * V [2][TK][Dv + 8], in the dtype (sj_ek_att_mma_smem: 46 KiB for D = 64
 * and one group). Rows padded by 16 bytes, so that the fragment reads of
 * eight rows fall in different banks. Tile indices are ints: the host
 * sends calls with 2^30 keys or more to attention_tc. */
template <class T> struct mma_elem;
/* pack: two floats rounded to nearest even, lo in the low half (the lower
 * column); mma: d += a b on one m16n8k16 tile. */
#define SJ_MMA_ELEM(tag, H2, cvt, ty)                                                              \
    template <> struct mma_elem<dt_##tag> {                                                        \
        static __device__ __forceinline__ uint32_t pack(float lo, float hi) {                      \
            H2 h = cvt(lo, hi);                                                                    \
            uint32_t u;                                                                            \
            memcpy(&u, &h, 4);                                                                     \
            return u;                                                                              \
        }                                                                                          \
        static __device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, \
                                                   uint32_t b1) {                                  \
            asm("mma.sync.aligned.m16n8k16.row.col.f32." ty "." ty ".f32 {%0,%1,%2,%3}, "          \
                "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"                                           \
                : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])                                   \
                : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));                   \
        }                                                                                          \
    };
SJ_MMA_ELEM(f16, __half2, __floats2half2_rn, "f16")
SJ_MMA_ELEM(bf16, __nv_bfloat162, __floats2bfloat162_rn, "bf16")
#undef SJ_MMA_ELEM

SJ_DEV uint32_t sm_u32(const uint16_t *p) { return *reinterpret_cast<const uint32_t *>(p); }

/* Four 8 x 8 matrices of 16-bit elements from shared memory, as is or
 * transposed: lane l gives the address of row l % 8 of matrix l / 8
 * (16-byte aligned); r[i] is lane l's pair of matrix i, from row l / 4,
 * columns 2 (l % 4) and one more (as is), or from rows 2 (l % 4) and one
 * more, column l / 4 (transposed). */
SJ_DEV void ldsm_x4(uint32_t (&r)[4], const uint16_t *row) {
    const uint32_t a = (uint32_t)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}
SJ_DEV void ldsm_x4_trans(uint32_t (&r)[4], const uint16_t *row) {
    const uint32_t a = (uint32_t)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

/* 2^x, the hardware's approximation (as __expf after its multiply by
 * log2 e: a few ulp, results below 2^-126 flushed to 0; 2^-inf = 0). */
SJ_DEV float ex2_approx(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

/* What 2^(x - mx) subtracts: mx, or 0 where mx = -inf (every score so far
 * masked: x is -inf too, and 2^(-inf - 0) = 0 where -inf - -inf would be
 * NaN). */
SJ_DEV float ex2_base(float mx) { return mx == -INFINITY ? 0.0f : mx; }

/* One tile of 64 keys (from j0) for one warp's 16 queries: S = Q K^T from
 * qf and the tile's K (Ks), the online softmax into m and l, O += P V with
 * the tile's V (Vs). rl: the keys of the lane's two rows. The softmax works
 * in base 2: sl = scale log2(e) folded into one multiply of the score, m is
 * the max of score * sl, and P = 2^(score * sl - m) = exp(score * scale -
 * max): per score a multiply, a max, a subtract, an ex2 and an add (and the
 * mask's select where the tile passes a row's last key). j0 and rl count
 * keys from the block's first (mma_blk.k); bias adds a mask to the scaled
 * scores of the keys in use (kl: the first kl[r] of the tile for row r). */
template <class T, int D, int DV, class Bias>
SJ_DEV void attention_mma_tile(const uint32_t (&qf)[D / 16][4], float (&o)[DV / 8][4], float (&m)[2], float (&l)[2],
                               const uint16_t *Ks, const uint16_t *Vs, const int64_t (&rl)[2], int64_t j0,
                               float sl, int lane, const Bias &bias) {
    constexpr int TK = SJ_EK_ATT_TK, LDQ = D + 8, LDV = DV + 8;
    const int c2 = (lane & 3) * 2;
    /* S = Q K^T: B's column n is key n, K's row; its fragments for
     * two steps of 16 along D come from one ldmatrix */
    float s[TK / 8][4];
    const uint16_t *kr = Ks + (lane & 7) * LDQ + (lane >> 3) * 8;
#pragma unroll
    for (int n = 0; n < TK / 8; n++) {
        s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
        for (int kc = 0; kc < D / 16; kc += 2) {
            uint32_t b[4];
            ldsm_x4(b, kr + n * 8 * LDQ + kc * 16);
            mma_elem<T>::mma(s[n], qf[kc], b[0], b[1]);
            mma_elem<T>::mma(s[n], qf[kc + 1], b[2], b[3]);
        }
    }
    int kl[2]; /* keys of this tile in use by each row */
#pragma unroll
    for (int r = 0; r < 2; r++) kl[r] = (int)(rl[r] - j0 < 0 ? 0 : rl[r] - j0 > TK ? TK : rl[r] - j0);
#pragma unroll
    for (int n = 0; n < TK / 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) s[n][e] *= sl;
    if (kl[0] < TK || kl[1] < TK) { /* a row's last key is in this tile */
#pragma unroll
        for (int n = 0; n < TK / 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                if (n * 8 + c2 + (e & 1) >= kl[e >> 1]) s[n][e] = -INFINITY;
    }
    bias(s, j0, kl, c2); /* a mask's values on the keys in use (mma_nobias: nothing) */
    /* fmaxf passes over a NaN score; its P, 2^NaN, makes the row's l and
     * O NaN all the same */
    float cm[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < TK / 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) cm[e >> 1] = fmaxf(cm[e >> 1], s[n][e]);
    float alpha[2], mb[2], cs[2] = {0.0f, 0.0f};
#pragma unroll
    for (int r = 0; r < 2; r++) {
        cm[r] = fmaxf(cm[r], __shfl_xor_sync(0xffffffffu, cm[r], 1));
        cm[r] = fmaxf(cm[r], __shfl_xor_sync(0xffffffffu, cm[r], 2));
        const float mn = fmaxf(m[r], cm[r]);
        mb[r] = ex2_base(mn);
        alpha[r] = ex2_approx(m[r] - mb[r]); /* m = -inf: 0 */
        m[r] = mn;
    }
#pragma unroll
    for (int n = 0; n < TK / 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const float ex = ex2_approx(s[n][e] - mb[e >> 1]);
            s[n][e] = ex;
            cs[e >> 1] += ex;
        }
#pragma unroll
    for (int r = 0; r < 2; r++) l[r] = l[r] * alpha[r] + cs[r];
#pragma unroll
    for (int n = 0; n < DV / 8; n++) {
        o[n][0] *= alpha[0], o[n][1] *= alpha[0];
        o[n][2] *= alpha[1], o[n][3] *= alpha[1];
    }
    /* O += P V: P's 16 x 16 A fragment for keys 16 kc.. is S's tiles
     * 2 kc and 2 kc + 1; V's B fragments for output columns 16 nd..
     * come transposed from rows 16 kc.. of the tile */
    const int vr = (lane & 7) + ((lane >> 3) & 1) * 8, vc = (lane >> 4) * 8;
#pragma unroll
    for (int kc = 0; kc < TK / 16; kc++) {
        const uint32_t a[4] = {mma_elem<T>::pack(s[2 * kc][0], s[2 * kc][1]),
                               mma_elem<T>::pack(s[2 * kc][2], s[2 * kc][3]),
                               mma_elem<T>::pack(s[2 * kc + 1][0], s[2 * kc + 1][1]),
                               mma_elem<T>::pack(s[2 * kc + 1][2], s[2 * kc + 1][3])};
#pragma unroll
        for (int nd = 0; nd < DV / 16; nd++) {
            uint32_t b[4];
            ldsm_x4_trans(b, Vs + (kc * 16 + vr) * LDV + nd * 16 + vc);
            mma_elem<T>::mma(o[2 * nd], a, b[0], b[1]);
            mma_elem<T>::mma(o[2 * nd + 1], a, b[2], b[3]);
        }
    }
}

/* No mask (mma_nobias), or an additive mask read through its strides
 * (mma_maskbias: the lane's two rows at row[0], row[1], key j at element j
 * sj; MT its dtype), each value times log2(e) since the scores are in base
 * 2. Only the keys in use are read (kl), so nothing past a row's last key
 * or Sk is. */
struct mma_nobias {
    template <int N> __device__ __forceinline__ void operator()(float (&)[N][4], int64_t, const int (&)[2], int) const {}
};
template <int MT> SJ_DEV float mma_mask_ld(const unsigned char *row, int64_t o) {
    if (MT == SJ_F16) return __half2float(__ushort_as_half(reinterpret_cast<const uint16_t *>(row)[o]));
    if (MT == SJ_BF16) return __uint_as_float((uint32_t) reinterpret_cast<const uint16_t *>(row)[o] << 16);
    if (MT == SJ_BOOL) return row[o] ? 0.0f : -INFINITY;
    return reinterpret_cast<const float *>(row)[o];
}
struct mma_maskbias {
    const unsigned char *row[2];
    int64_t sj;
    int dt;
    template <int MT, int N> __device__ __forceinline__ void add(float (&s)[N][4], int64_t j0, const int (&kl)[2], int c2) const {
#pragma unroll
        for (int n = 0; n < N; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int col = n * 8 + c2 + (e & 1);
                if (col < kl[e >> 1])
                    s[n][e] += mma_mask_ld<MT>(row[e >> 1], (j0 + col) * sj) * 1.44269504088896341f;
            }
    }
    template <int N> __device__ __forceinline__ void operator()(float (&s)[N][4], int64_t j0, const int (&kl)[2], int c2) const {
        switch (dt) { /* uniform: one loop per dtype */
        case SJ_F16: add<SJ_F16>(s, j0, kl, c2); break;
        case SJ_BF16: add<SJ_BF16>(s, j0, kl, c2); break;
        case SJ_BOOL: add<SJ_BOOL>(s, j0, kl, c2); break;
        default: add<SJ_F32>(s, j0, kl, c2); break;
        }
    }
};

/* One block's work in attention_mma: nq queries from query i0 of batch b
 * (varlen: from packed token i0; b the sequence), head h; keys from ks
 * (the first any of its queries may use), kn of them. nq = 0: nothing to
 * do. Rows and strides are read from the kernel's parameters through
 * mma_ax<P>: the axes of batch (-1: none), head, row and element of q, k,
 * v and y. */
struct mma_blk {
    int64_t b, h, i0, ks, kn;
    int nq;
};
template <class P> struct mma_ax;
template <> struct mma_ax<sj_ek_att> {
    static constexpr int B = 0, H = 1, R = 2, C = 3;
};
/* element (row r, 0) of head (b, h) of x at strides s */
template <class P>
SJ_DEV const uint16_t *mma_row(uint64_t x, const int64_t *s, const mma_blk &m, int64_t r) {
    constexpr int B = mma_ax<P>::B, H = mma_ax<P>::H, R = mma_ax<P>::R;
    return reinterpret_cast<const uint16_t *>(x) + (B >= 0 ? m.b * s[B < 0 ? 0 : B] : 0) + m.h * s[H] + r * s[R];
}

/* Padded attention: blocks over (b, h, query tile), keys from 0; rl[r]:
 * the keys of block rows r0 and r0 + 8 (tc_row_keys). */
SJ_DEV int64_t mma_total(const sj_ek_att &p, int tq) { return p.B * p.H * ((p.Sq + tq - 1) / tq); }
SJ_DEV mma_blk mma_block(const sj_ek_att &p, int64_t blk, int tq, int r0, int64_t (&rl)[2]) {
    const tc_block tb = tc_block_at(p, blk, tq);
    mma_blk m;
    m.b = tb.bb, m.h = tb.h, m.i0 = tb.i0, m.ks = 0, m.kn = tb.kend, m.nq = tb.nq;
    rl[0] = tc_row_keys(p, tb, tb.i0 + r0);
    rl[1] = tc_row_keys(p, tb, tb.i0 + r0 + 8);
    return m;
}
SJ_DEV mma_maskbias mma_mask(const sj_ek_att &p, const mma_blk &m, int r0) {
    const int es = p.mask_dt == SJ_BOOL ? 1 : p.mask_dt == SJ_F32 ? 4 : 2;
    const unsigned char *base = reinterpret_cast<const unsigned char *>(p.mask) +
                                (m.b * p.smask[0] + m.h * p.smask[1] + (m.i0 + r0) * p.smask[2]) * es;
    /* rows past Sq (no key in use) are never read */
    return mma_maskbias{{base, base + 8 * p.smask[2] * es}, p.smask[3], p.mask_dt};
}

/* The kernels: P is sj_ek_att (padded, mma_block above) or sj_ek_varlen
 * (packed sequences, eager_varlen.cuh's mma_block and mma_ax); MASK: padded
 * attention's additive mask (attention_mmam). */
template <class T, int D, int DV, bool MASK, class P> SJ_DEV void attention_mma(const P &p) {
    constexpr int TK = SJ_EK_ATT_TK, LDQ = D + 8, LDV = DV + 8, W = SJ_EK_ATT_MMA_WARPS, TQ = 16 * W;
    static_assert(D % 32 == 0 && DV % 16 == 0 && TK % 16 == 0, "fragment sizes (K's come 32 columns at a time)");
    extern __shared__ __align__(128) unsigned char att_tc_sm[];
    const int KG = (int)(blockDim.x / (32 * W)); /* key groups: 1 or 2 */
    uint16_t *Qs = reinterpret_cast<uint16_t *>(att_tc_sm);
    const int t = (int)threadIdx.x, lane = t & 31, warp = t >> 5;
    const int grp = warp / W, wq = warp % W; /* this warp's key group, and its queries' place */
    const int g = lane >> 2, c2 = (lane & 3) * 2; /* this lane's rows g, g + 8; columns c2, c2 + 1 */
    uint16_t *Kb = Qs + TQ * LDQ + grp * 2 * TK * (LDQ + LDV), *Vb = Kb + 2 * TK * LDQ; /* the group's two tiles */
    const bool vec = p.vec != 0;
    const int64_t total = mma_total(p, TQ);
    const float sl = p.scale * 1.44269504088896341f; /* scores in base 2 (attention_mma_tile) */
    for (int64_t blk = blockIdx.x; blk < total; blk += gridDim.x) {
        int64_t rl[2]; /* keys of this lane's rows */
        const mma_blk bk = mma_block(p, blk, TQ, wq * 16 + g, rl);
        if (mma_ax<P>::B < 0 && bk.nq <= 0) /* varlen: a tile of no sequence (uniform in the block) */
            continue;
        mma_maskbias mb = {}; /* MASK: the lane's rows of the mask */
        if constexpr (MASK)
            mb = mma_mask(p, bk, wq * 16 + g);
        const int64_t kend = bk.kn;
        constexpr int RA = mma_ax<P>::R, CA = mma_ax<P>::C;
        __syncthreads(); /* the previous block's readers of Q, K and V are done */
        tc_load(Qs, LDQ, mma_row<P>(p.q, p.sq, bk, bk.i0), p.sq[RA], p.sq[CA], TQ, bk.nq, D, vec);
        const uint16_t *kh = mma_row<P>(p.k, p.sk, bk, bk.ks), *vh = mma_row<P>(p.v, p.sv, bk, bk.ks);
        /* group grp takes tiles grp, grp + KG, ...: its it-th in buffer it % 2,
         * copied by its own threads */
        auto load_kv = [&](int j0, int it) {
            const int nk = (int)(kend - j0 < TK ? kend - j0 : TK), buf = (int)(it & 1);
            const int gt = t - grp * 32 * W, gn = 32 * W;
            tc_load(Kb + buf * TK * LDQ, LDQ, kh + j0 * p.sk[RA], p.sk[RA], p.sk[CA], TK, nk, D, vec, gt, gn);
            tc_load(Vb + buf * TK * LDV, LDV, vh + j0 * p.sv[RA], p.sv[RA], p.sv[CA], TK, nk, DV, vec, gt, gn);
        };
        if (grp * TK < kend) load_kv(grp * TK, 0);
        __pipeline_commit(); /* with Q */
        uint32_t qf[D / 16][4];
        float o[DV / 8][4];
#pragma unroll
        for (int n = 0; n < DV / 8; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
        float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}; /* l: this lane's part of the row's sum */
        /* tile indices in int: kend < 2^30 (the host's rule) */
        const int iters = (int)(((kend + TK - 1) / TK + KG - 1) / KG); /* the same for every group */
        for (int it = 0; it < iters; it++) {
            const int j0 = (it * KG + grp) * TK, jn = j0 + KG * TK;
            if (jn < kend) {
                load_kv(jn, it + 1);
                __pipeline_commit();
                __pipeline_wait_prior(1); /* all but the newest batch: this tile's */
            } else {
                __pipeline_wait_prior(0);
            }
            __syncthreads(); /* Q and this tile's K and V written, by every thread */
            if (it == 0) {
                const uint16_t *qr = Qs + (wq * 16 + g) * LDQ + c2;
#pragma unroll
                for (int kc = 0; kc < D / 16; kc++) {
                    qf[kc][0] = sm_u32(qr + kc * 16);
                    qf[kc][1] = sm_u32(qr + 8 * LDQ + kc * 16);
                    qf[kc][2] = sm_u32(qr + kc * 16 + 8);
                    qf[kc][3] = sm_u32(qr + 8 * LDQ + kc * 16 + 8);
                }
            }
            if (j0 < kend) { /* this group's last iteration may have no tile */
                const int buf = (int)(it & 1);
                const uint16_t *Ks = Kb + buf * TK * LDQ, *Vs = Vb + buf * TK * LDV;
                if constexpr (MASK)
                    attention_mma_tile<T, D, DV>(qf, o, m, l, Ks, Vs, rl, j0, sl, lane, mb);
                else
                    attention_mma_tile<T, D, DV>(qf, o, m, l, Ks, Vs, rl, j0, sl, lane, mma_nobias{});
            }
            __syncthreads(); /* every warp is done with this tile's buffer: the next load reuses it */
        }
        __pipeline_wait_prior(0); /* no tile (kend = 0): Q's batch */
#pragma unroll
        for (int r = 0; r < 2; r++) {
            l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
            l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
        }
        if (KG == 2) {
            /* group 1 hands its rows' m, l and O to group 0's warp with the
             * same queries, lane for lane (the same fragment layout), through
             * the key buffers: float e of lane l at [wq][e][l] */
            constexpr int NE = DV / 2 + 4;
            float *xs = reinterpret_cast<float *>(Qs + TQ * LDQ) + wq * NE * 32 + lane;
            __syncthreads(); /* (no tile ran: nothing else synchronised the groups) */
            if (grp == 1) {
#pragma unroll
                for (int n = 0; n < DV / 8; n++)
#pragma unroll
                    for (int e = 0; e < 4; e++) xs[(n * 4 + e) * 32] = o[n][e];
                xs[(DV / 2) * 32] = m[0], xs[(DV / 2 + 1) * 32] = m[1];
                xs[(DV / 2 + 2) * 32] = l[0], xs[(DV / 2 + 3) * 32] = l[1];
            }
            __syncthreads();
            if (grp == 1)
                continue;
            float a0[2], a1[2];
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const float m1 = xs[(DV / 2 + r) * 32], l1 = xs[(DV / 2 + 2 + r) * 32];
                const float mb = ex2_base(fmaxf(m[r], m1)); /* m in base 2 */
                a0[r] = ex2_approx(m[r] - mb);
                a1[r] = ex2_approx(m1 - mb);
                l[r] = l[r] * a0[r] + l1 * a1[r];
            }
#pragma unroll
            for (int n = 0; n < DV / 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) o[n][e] = o[n][e] * a0[e >> 1] + xs[(n * 4 + e) * 32] * a1[e >> 1];
        }
        uint16_t *y = const_cast<uint16_t *>(mma_row<P>(p.y, p.sy, bk, bk.i0)); /* row 0 of the block */
        /* results written two at a time where pairs are 4-byte aligned */
        const bool ypair = p.sy[CA] == 1 && (((uint64_t)y | (uint64_t)p.sy[RA] << 1) & 3) == 0;
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int ir = wq * 16 + g + 8 * r; /* the row in the block */
            if (ir >= bk.nq)
                continue;
            /* l = 0: no key, or every key masked to -inf: zeros, as the
             * one-query kernel; NaN stays NaN */
            const float inv = l[r] != 0.0f ? 1.0f / l[r] : 0.0f;
            uint16_t *yr = y + ir * p.sy[RA];
#pragma unroll
            for (int n = 0; n < DV / 8; n++) {
                const float v0 = o[n][2 * r] * inv, v1 = o[n][2 * r + 1] * inv;
                const int col = n * 8 + c2;
                if (ypair) {
                    *reinterpret_cast<uint32_t *>(yr + col) = mma_elem<T>::pack(v0, v1);
                } else {
                    yr[col * p.sy[CA]] = tc_elem<T>::st(v0);
                    yr[(col + 1) * p.sy[CA]] = tc_elem<T>::st(v1);
                }
            }
        }
    }
}

/* The unmasked padded kernels attention_mma<D>: attention_mma below with
 * neither mask nor packed sequences, kept apart so that its registers stay
 * as they were measured (the general form spills 8 bytes at D = 64 under
 * the 168-register cap). */
template <class T, int D, int DV> SJ_DEV void attention_mma_plain(const sj_ek_att &p) {
    constexpr int TK = SJ_EK_ATT_TK, LDQ = D + 8, LDV = DV + 8, W = SJ_EK_ATT_MMA_WARPS, TQ = 16 * W;
    static_assert(D % 32 == 0 && DV % 16 == 0 && TK % 16 == 0, "fragment sizes (K's come 32 columns at a time)");
    extern __shared__ __align__(128) unsigned char att_tc_sm[];
    const int KG = (int)(blockDim.x / (32 * W)); /* key groups: 1 or 2 */
    uint16_t *Qs = reinterpret_cast<uint16_t *>(att_tc_sm);
    const uint16_t *q = reinterpret_cast<const uint16_t *>(p.q);
    const uint16_t *k = reinterpret_cast<const uint16_t *>(p.k);
    const uint16_t *v = reinterpret_cast<const uint16_t *>(p.v);
    uint16_t *y = reinterpret_cast<uint16_t *>(p.y);
    const int t = (int)threadIdx.x, lane = t & 31, warp = t >> 5;
    const int grp = warp / W, wq = warp % W; /* this warp's key group, and its queries' place */
    const int g = lane >> 2, c2 = (lane & 3) * 2; /* this lane's rows g, g + 8; columns c2, c2 + 1 */
    uint16_t *Kb = Qs + TQ * LDQ + grp * 2 * TK * (LDQ + LDV), *Vb = Kb + 2 * TK * LDQ; /* the group's two tiles */
    const bool vec = p.vec != 0;
    /* results written two at a time where pairs are 4-byte aligned */
    const bool ypair = p.sy[3] == 1 && ((p.y | (uint64_t)(p.sy[0] | p.sy[1] | p.sy[2]) << 1) & 3) == 0;
    const int64_t total = p.B * p.H * ((p.Sq + TQ - 1) / TQ);
    const float sl = p.scale * 1.44269504088896341f; /* scores in base 2 (attention_mma_tile) */
    for (int64_t blk = blockIdx.x; blk < total; blk += gridDim.x) {
        const tc_block tb = tc_block_at(p, blk, TQ);
        const int64_t h = tb.h, bb = tb.bb, i0 = tb.i0, kend = tb.kend;
        const int64_t rl[2] = {tc_row_keys(p, tb, i0 + wq * 16 + g), /* keys of this lane's rows */
                               tc_row_keys(p, tb, i0 + wq * 16 + g + 8)};
        __syncthreads(); /* the previous block's readers of Q, K and V are done */
        tc_load(Qs, LDQ, q + bb * p.sq[0] + h * p.sq[1] + i0 * p.sq[2], p.sq[2], p.sq[3], TQ, tb.nq, D, vec);
        const uint16_t *kh = k + bb * p.sk[0] + h * p.sk[1], *vh = v + bb * p.sv[0] + h * p.sv[1];
        /* group grp takes tiles grp, grp + KG, ...: its it-th in buffer it % 2,
         * copied by its own threads */
        auto load_kv = [&](int j0, int it) {
            const int nk = (int)(kend - j0 < TK ? kend - j0 : TK), buf = (int)(it & 1);
            const int gt = t - grp * 32 * W, gn = 32 * W;
            tc_load(Kb + buf * TK * LDQ, LDQ, kh + j0 * p.sk[2], p.sk[2], p.sk[3], TK, nk, D, vec, gt, gn);
            tc_load(Vb + buf * TK * LDV, LDV, vh + j0 * p.sv[2], p.sv[2], p.sv[3], TK, nk, DV, vec, gt, gn);
        };
        if (grp * TK < kend) load_kv(grp * TK, 0);
        __pipeline_commit(); /* with Q */
        uint32_t qf[D / 16][4];
        float o[DV / 8][4];
#pragma unroll
        for (int n = 0; n < DV / 8; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
        float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}; /* l: this lane's part of the row's sum */
        /* tile indices in int: kend < 2^30 (the host's rule) */
        const int iters = (int)(((kend + TK - 1) / TK + KG - 1) / KG); /* the same for every group */
        for (int it = 0; it < iters; it++) {
            const int j0 = (it * KG + grp) * TK, jn = j0 + KG * TK;
            if (jn < kend) {
                load_kv(jn, it + 1);
                __pipeline_commit();
                __pipeline_wait_prior(1); /* all but the newest batch: this tile's */
            } else {
                __pipeline_wait_prior(0);
            }
            __syncthreads(); /* Q and this tile's K and V written, by every thread */
            if (it == 0) {
                const uint16_t *qr = Qs + (wq * 16 + g) * LDQ + c2;
#pragma unroll
                for (int kc = 0; kc < D / 16; kc++) {
                    qf[kc][0] = sm_u32(qr + kc * 16);
                    qf[kc][1] = sm_u32(qr + 8 * LDQ + kc * 16);
                    qf[kc][2] = sm_u32(qr + kc * 16 + 8);
                    qf[kc][3] = sm_u32(qr + 8 * LDQ + kc * 16 + 8);
                }
            }
            if (j0 < kend) { /* this group's last iteration may have no tile */
                const int buf = (int)(it & 1);
                const uint16_t *Ks = Kb + buf * TK * LDQ, *Vs = Vb + buf * TK * LDV;
                attention_mma_tile<T, D, DV>(qf, o, m, l, Ks, Vs, rl, j0, sl, lane, mma_nobias{});
            }
            __syncthreads(); /* every warp is done with this tile's buffer: the next load reuses it */
        }
        __pipeline_wait_prior(0); /* no tile (kend = 0): Q's batch */
#pragma unroll
        for (int r = 0; r < 2; r++) {
            l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
            l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
        }
        if (KG == 2) {
            /* group 1 hands its rows' m, l and O to group 0's warp with the
             * same queries, lane for lane (the same fragment layout), through
             * the key buffers: float e of lane l at [wq][e][l] */
            constexpr int NE = DV / 2 + 4;
            float *xs = reinterpret_cast<float *>(Qs + TQ * LDQ) + wq * NE * 32 + lane;
            __syncthreads(); /* (no tile ran: nothing else synchronised the groups) */
            if (grp == 1) {
#pragma unroll
                for (int n = 0; n < DV / 8; n++)
#pragma unroll
                    for (int e = 0; e < 4; e++) xs[(n * 4 + e) * 32] = o[n][e];
                xs[(DV / 2) * 32] = m[0], xs[(DV / 2 + 1) * 32] = m[1];
                xs[(DV / 2 + 2) * 32] = l[0], xs[(DV / 2 + 3) * 32] = l[1];
            }
            __syncthreads();
            if (grp == 1)
                continue;
            float a0[2], a1[2];
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const float m1 = xs[(DV / 2 + r) * 32], l1 = xs[(DV / 2 + 2 + r) * 32];
                const float mb = ex2_base(fmaxf(m[r], m1)); /* m in base 2 */
                a0[r] = ex2_approx(m[r] - mb);
                a1[r] = ex2_approx(m1 - mb);
                l[r] = l[r] * a0[r] + l1 * a1[r];
            }
#pragma unroll
            for (int n = 0; n < DV / 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) o[n][e] = o[n][e] * a0[e >> 1] + xs[(n * 4 + e) * 32] * a1[e >> 1];
        }
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int64_t i = i0 + wq * 16 + g + 8 * r;
            if (i >= p.Sq)
                continue;
            const float inv = l[r] != 0.0f ? 1.0f / l[r] : 0.0f; /* l = 0: no key, zeros; NaN stays NaN */
            uint16_t *yr = y + bb * p.sy[0] + h * p.sy[1] + i * p.sy[2];
#pragma unroll
            for (int n = 0; n < DV / 8; n++) {
                const float v0 = o[n][2 * r] * inv, v1 = o[n][2 * r + 1] * inv;
                const int col = n * 8 + c2;
                if (ypair) {
                    *reinterpret_cast<uint32_t *>(yr + col) = mma_elem<T>::pack(v0, v1);
                } else {
                    yr[col * p.sy[3]] = tc_elem<T>::st(v0);
                    yr[(col + 1) * p.sy[3]] = tc_elem<T>::st(v1);
                }
            }
        }
    }
}

/* Registers: at most what keeps three blocks of one key group an SM at D
 * <= 64 (168 x 128 x 3 <= 64 K), which __launch_bounds__ for the two-group
 * block (256 threads) would not (187 at D = 64); more at D = 96 and 128,
 * which need them. */
#define SJ_EK_DEF_ATT_MMA(d, tag, regs)                                                            \
    extern "C" __global__ void __maxnreg__(regs)                                                   \
        sj_ek_attention_mma##d##_##tag(const __grid_constant__ sj_ek_att a) {                      \
        sj_rt_grid_dep();                                                                          \
        attention_mma_plain<dt_##tag, d, d>(a);                                                    \
    }
#define SJ_EK_DEF_attention_mma32(tag) SJ_EK_DEF_ATT_MMA(32, tag, 168)
#define SJ_EK_DEF_attention_mma64(tag) SJ_EK_DEF_ATT_MMA(64, tag, 168)
#define SJ_EK_DEF_attention_mma96(tag) SJ_EK_DEF_ATT_MMA(96, tag, 240)
#define SJ_EK_DEF_attention_mma128(tag) SJ_EK_DEF_ATT_MMA(128, tag, 255)
/* attention_mmam<D>: the same with the additive mask of sj_ek_att.mask. */
#define SJ_EK_DEF_ATT_MMAM(d, tag, regs)                                                           \
    extern "C" __global__ void __maxnreg__(regs)                                                   \
        sj_ek_attention_mmam##d##_##tag(const __grid_constant__ sj_ek_att a) {                     \
        sj_rt_grid_dep();                                                                          \
        attention_mma<dt_##tag, d, d, true>(a);                                                    \
    }
#define SJ_EK_DEF_attention_mmam32(tag) SJ_EK_DEF_ATT_MMAM(32, tag, 168)
#define SJ_EK_DEF_attention_mmam64(tag) SJ_EK_DEF_ATT_MMAM(64, tag, 168)
#define SJ_EK_DEF_attention_mmam96(tag) SJ_EK_DEF_ATT_MMAM(96, tag, 240)
#define SJ_EK_DEF_attention_mmam128(tag) SJ_EK_DEF_ATT_MMAM(128, tag, 255)
