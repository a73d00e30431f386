/* One query's attention with an online softmax, by a whole block: the
 * loop that the padded kernel attention (eager_misc.cuh) and the packed
 * one attention_varlen (eager_varlen.cuh) share; each finds its query's
 * rows and key range and calls att_online.
 */
#ifndef SJ_EAGER_ATT_ONLINE_CUH
#define SJ_EAGER_ATT_ONLINE_CUH

#include "kernels/cuda/eager_common.cuh"

/* A query's row, its head's keys and values, and its output row, each as
 * a base pointer and element strides: q[d * qd], key j's element d at
 * k[j * kj + d * kd], value j's element c at v[j * vj + c * vc], output
 * y[c * yc]; D the query and key width, Dv the value width. */
template <class S> struct att_rows {
    const S *q;
    int64_t qd;
    const S *k;
    int64_t kj, kd;
    const S *v;
    int64_t vj, vc;
    S *y;
    int64_t yc;
    int64_t D, Dv;
};

/* y = sum_j softmax_j(score(q . k_j, j)) v_j over the keys j in [s, e)
 * (s < e), by every thread of the block (blockDim.x a multiple of 32).
 * The keys are taken SJ_EK_ATT_CHUNK at a time: each warp scores keys (q
 * in shared memory, the dot split over lanes and summed, then passed to
 * score, which scales it and adds key j's mask if any), the running max m
 * and sum l are updated with the chunk, and each thread rescales and
 * accumulates its own output elements c (t, t + blockDim, ...). y = acc *
 * (1 / l), in f32 until the store; every key -inf: zeros. sm: dynamic
 * shared memory of q[D], p[SJ_EK_ATT_CHUNK], acc[Dv] floats. */
template <class T, class Score>
SJ_DEV void att_online(const att_rows<typename T::S> &r, int64_t s, int64_t e, const Score &score, float *sm) {
    typedef typename T::S S;
    float *qs = sm, *ps = sm + r.D, *acc = sm + r.D + SJ_EK_ATT_CHUNK;
    const int t = (int)threadIdx.x, nthr = (int)blockDim.x;
    const int lane = t & 31, warp = t >> 5, nwarps = nthr >> 5;
    __syncthreads(); /* the previous query's readers of qs/acc are done */
    for (int64_t d = t; d < r.D; d += nthr) qs[d] = T::ld(r.q[d * r.qd]);
    for (int64_t c = t; c < r.Dv; c += nthr) acc[c] = 0.0f;
    float m = -INFINITY, l = 0.0f; /* the same in every thread */
    for (int64_t j0 = s; j0 < e; j0 += SJ_EK_ATT_CHUNK) {
        const int cnt = (int)(e - j0 < SJ_EK_ATT_CHUNK ? e - j0 : SJ_EK_ATT_CHUNK);
        __syncthreads(); /* qs written; the previous chunk's ps consumed */
        for (int jj = warp; jj < cnt; jj += nwarps) {
            const S *kr = r.k + (j0 + jj) * r.kj;
            float dot = 0.0f;
            for (int64_t d = lane; d < r.D; d += 32) dot += qs[d] * T::ld(kr[d * r.kd]);
            dot = warp_reduce<r_sum_f>(dot);
            if (lane == 0) ps[jj] = score(dot, j0 + jj);
        }
        __syncthreads();
        float cm = -INFINITY;
        for (int jj = 0; jj < cnt; jj++) cm = max_nan(cm, ps[jj]);
        const float mn = max_nan(m, cm);
        /* mn = -inf only when every score so far is -inf (infinite
         * inputs, or masked): those keys get weight 0 */
        const float alpha = m == -INFINITY ? 0.0f : sj_rt_expf(m - mn);
        __syncthreads(); /* every thread has read the scores */
        for (int jj = t; jj < cnt; jj += nthr) ps[jj] = mn == -INFINITY ? 0.0f : sj_rt_expf(ps[jj] - mn);
        __syncthreads();
        float cs = 0.0f;
        for (int jj = 0; jj < cnt; jj++) cs += ps[jj];
        l = l * alpha + cs;
        m = mn;
        for (int64_t c = t; c < r.Dv; c += nthr) {
            const S *vc = r.v + j0 * r.vj + c * r.vc;
            float a = acc[c] * alpha;
            for (int jj = 0; jj < cnt; jj++) a += ps[jj] * T::ld(vc[jj * r.vj]);
            acc[c] = a;
        }
    }
    const float inv = l > 0.0f ? 1.0f / l : 0.0f; /* every key masked (-inf): zeros */
    for (int64_t c = t; c < r.Dv; c += nthr) r.y[c * r.yc] = T::st(acc[c] * inv);
}

#endif /* SJ_EAGER_ATT_ONLINE_CUH */
