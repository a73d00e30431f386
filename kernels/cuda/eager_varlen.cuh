/* Attention over packed (ragged) sequences (included by eager.cu after
 * eager_attention_tc.cuh): the kernels attention_varlen_<tag>,
 * attention_varlen_mma<D>_<tag> and varlen_check_i32, see
 * sj_attention_varlen() in shapejit.h.
 */
#ifndef SJ_EAGER_VARLEN_CUH
#define SJ_EAGER_VARLEN_CUH

#include "kernels/cuda/eager_att_online.cuh"
#include "kernels/cuda/eager_common.cuh"

/* -- Offsets check ----------------------------------------------------------------------
 * One thread per entry (grid-stride): bits of *flag (atomicOr) for
 * offsets[0] != 0, an entry below the one before, the last != T. The
 * attention kernel never reads outside [0, T) whatever the offsets are. */

SJ_DEV void varlen_check(const sj_ek_varlen &p) {
    const int32_t *off = reinterpret_cast<const int32_t *>(p.off);
    const int64_t n = p.B + 1, nt = gthreads();
    int bits = 0;
    for (int64_t b = gtid(); b < n; b += nt) {
        const int64_t o = off[b * p.soff];
        if (b == 0 && o != 0) bits |= SJ_EK_VARLEN_BAD_FIRST;
        if (b > 0 && o < off[(b - 1) * p.soff]) bits |= SJ_EK_VARLEN_BAD_ORDER;
        if (b == n - 1 && o != p.T) bits |= SJ_EK_VARLEN_BAD_LAST;
    }
    if (bits) atomicOr(reinterpret_cast<int *>(p.flag), bits);
}

/* -- Attention --------------------------------------------------------------------------
 * One block per (token t, head h), grid-stride over T * H: the sequence of
 * t is found by a binary search of the offsets (clamped to [0, T], so bad
 * offsets cannot send a read out of range); its keys s .. e-1 (causal:
 * s .. t) go through att_online (eager_att_online.cuh: an online softmax,
 * SJ_EK_ATT_CHUNK keys at a time), as in the padded kernel attention
 * (eager_misc.cuh); each score the dot scaled, no mask. y in f32 until the
 * store. Dynamic shared memory: q[D], p[CHUNK], acc[Dv] floats. */

SJ_DEV int64_t varlen_off(const sj_ek_varlen &p, int64_t b) {
    const int64_t o = reinterpret_cast<const int32_t *>(p.off)[b * p.soff];
    return o < 0 ? 0 : o > p.T ? p.T : o;
}

/* Score of key j: the dot scaled (no mask). */
struct varlen_score {
    float scale;
    __device__ __forceinline__ float operator()(float dot, int64_t) const { return dot * scale; }
};

template <class T> SJ_DEV void attention_varlen(const sj_ek_varlen &p) {
    typedef typename T::S S;
    extern __shared__ float vl_sm[];
    const S *q = reinterpret_cast<const S *>(p.q);
    const S *k = reinterpret_cast<const S *>(p.k);
    const S *v = reinterpret_cast<const S *>(p.v);
    S *y = reinterpret_cast<S *>(p.y);
    const int t = (int)threadIdx.x, nthr = (int)blockDim.x;
    const int64_t total = p.T * p.H;
    for (int64_t blk = blockIdx.x; blk < total; blk += gridDim.x) {
        const int64_t i = blk / p.H, h = blk % p.H;
        /* the last b with off[b] <= i (uniform in the block) */
        int64_t lo = 0, hi = p.B - 1;
        while (lo < hi) {
            const int64_t mid = (lo + hi + 1) / 2;
            if (varlen_off(p, mid) <= i) lo = mid;
            else hi = mid - 1;
        }
        const int64_t s = varlen_off(p, lo);
        int64_t e = varlen_off(p, lo + 1);
        if (p.causal && i + 1 < e) e = i + 1;
        S *yr = y + i * p.sy[0] + h * p.sy[1];
        if (i < s || e <= s) { /* bad offsets only */
            for (int64_t d = t; d < p.Dv; d += nthr) yr[d * p.sy[2]] = T::st(0.0f);
            continue;
        }
        const att_rows<S> r = {q + i * p.sq[0] + h * p.sq[1], p.sq[2],
                               k + h * p.sk[1],               p.sk[0], p.sk[2],
                               v + h * p.sv[1],               p.sv[0], p.sv[2],
                               yr,                            p.sy[2],
                               p.D,                           p.Dv};
        att_online<T>(r, s, e, varlen_score{p.scale}, vl_sm);
    }
}

/* -- Attention on tensor cores ------------------------------------------------------------
 * attention_varlen_mma<D>_<tag> (f16, bf16; D = Dv = 32, 64, 96, 128):
 * eager_attention_tc.cuh's attention_mma over packed sequences. Its
 * blocks are tiles of up to tq queries that never span two sequences: the
 * packed tokens are cut into chunks of tq (chunk c: [c tq, (c + 1) tq)) and
 * tile u is sequence b's part of chunk c = u - b, where b is the last with
 * off[b] / tq + b <= u. Sequence b spans tiles off[b] / tq + b up to
 * off[b + 1] / tq + b (one more than the chunks it touches, as the next
 * sequence's first tile is that chunk's next part), so T / tq + B tiles in
 * all, some empty (a sequence ending on a chunk's boundary) and skipped.
 * Each tile's keys start at its sequence's first token; query i's end at
 * the sequence's end (causal: at i). The offsets are clamped to [0, T] as
 * in attention_varlen: bad ones give empty or wrong tiles, never a read
 * outside [0, T) (varlen_check reports them). */

template <> struct mma_ax<sj_ek_varlen> { /* [T, H, D]: no batch axis */
    static constexpr int B = -1, H = 1, R = 0, C = 2;
};
SJ_DEV int64_t mma_total(const sj_ek_varlen &p, int tq) { return p.H * (p.T / tq + p.B); }
SJ_DEV mma_blk mma_block(const sj_ek_varlen &p, int64_t blk, int tq, int r0, int64_t (&rl)[2]) {
    const int64_t u = blk / p.H, h = blk % p.H;
    int64_t lo = 0, hi = p.B - 1; /* the last b with off[b] / tq + b <= u (uniform in the block) */
    while (lo < hi) {
        const int64_t mid = (lo + hi + 1) / 2;
        if (varlen_off(p, mid) / tq + mid <= u) lo = mid;
        else hi = mid - 1;
    }
    const int64_t s = varlen_off(p, lo), e = varlen_off(p, lo + 1), c = u - lo;
    const int64_t t0 = s > c * tq ? s : c * tq, t1 = e < (c + 1) * tq ? e : (c + 1) * tq;
    mma_blk m;
    m.nq = t1 > t0 ? (int)(t1 - t0) : 0;
    m.b = lo, m.h = h, m.i0 = t0, m.ks = s;
    m.kn = m.nq ? (p.causal ? t1 : e) - s : 0;
    for (int r = 0; r < 2; r++) { /* keys from s of block rows r0, r0 + 8 */
        const int ir = r0 + 8 * r;
        rl[r] = ir < m.nq ? (p.causal ? t0 + ir + 1 : e) - s : 0;
    }
    return m;
}

/* -- Kernel definitions ------------------------------------------------------------------ */

#define SJ_EK_DEF_attention_varlen(tag)                                                            \
    extern "C" __global__ void __launch_bounds__(SJ_EK_ATT_THREADS)                                \
        sj_ek_attention_varlen_##tag(const __grid_constant__ sj_ek_varlen a) {                     \
        sj_rt_grid_dep();                                                                          \
        attention_varlen<dt_##tag>(a);                                                             \
    }
#define SJ_EK_DEF_varlen_check(tag)                                                                \
    extern "C" __global__ void __launch_bounds__(SJ_EK_THREADS)                                    \
        sj_ek_varlen_check_##tag(const __grid_constant__ sj_ek_varlen a) {                         \
        sj_rt_grid_dep();                                                                          \
        varlen_check(a);                                                                           \
    }

/* Registers: as attention_mma<D>'s. */
#define SJ_EK_DEF_ATT_VL_MMA(d, tag, regs)                                                         \
    extern "C" __global__ void __maxnreg__(regs)                                                   \
        sj_ek_attention_varlen_mma##d##_##tag(const __grid_constant__ sj_ek_varlen a) {            \
        sj_rt_grid_dep();                                                                          \
        attention_mma<dt_##tag, d, d, false>(a);                                                   \
    }
#define SJ_EK_DEF_attention_varlen_mma32(tag) SJ_EK_DEF_ATT_VL_MMA(32, tag, 168)
#define SJ_EK_DEF_attention_varlen_mma64(tag) SJ_EK_DEF_ATT_VL_MMA(64, tag, 168)
#define SJ_EK_DEF_attention_varlen_mma96(tag) SJ_EK_DEF_ATT_VL_MMA(96, tag, 240)
#define SJ_EK_DEF_attention_varlen_mma128(tag) SJ_EK_DEF_ATT_VL_MMA(128, tag, 255)

#endif /* SJ_EAGER_VARLEN_CUH */
