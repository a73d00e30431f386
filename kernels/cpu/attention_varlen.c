/* Eager attention over packed (ragged) sequences, as flash_attn_varlen.
 *
 * q, k [T, H, D] and v [T, H, Dv] hold B sequences laid end to end:
 * sequence b is tokens offsets[b] .. offsets[b+1]-1, and its queries see
 * only its own keys (causal: key j <= query i, both counted from the
 * sequence's start). The offsets are checked first, on the host: 0 at the
 * start, never decreasing, T at the end; otherwise SJ_EINDEX names the
 * first bad entry and nothing is written.
 *
 * Work is one (sequence, head) pair at a time, as the padded attention in
 * matmul.c does per (batch, head): the pair's keys and values are packed
 * into f32 scratch once, then per block of QB queries S = scale * Q K^T
 * (cblas_sgemm over the keys any query of the block may see), a softmax
 * per row over its visible prefix (sj_cpu_softmax_row), O = P V (sgemm),
 * stored in y's dtype. Pairs are shared over the kernel pool when OpenBLAS
 * runs single-threaded, over as many threads as get the pool's minimum of
 * multiply-adds each (none: the calling thread runs them all).
 *
 * Scratch slots: 0 the query block, 1 keys, 2 values, 3 scores and output.
 */
#include <assert.h>
#include <cblas.h>
#include <stdatomic.h>
#include <string.h>

#include "base/error.h"
#include "kernels/cpu/cpu_int.h"
#include "kernels/cpu/eager.h"
#include "kernels/cpu/threads.h"

#define QB 64

/* -- Offsets ---------------------------------------------------------------- */

/* 0 at the start, never decreasing, T at the end; SJ_EINDEX otherwise. */
static sj_status check_offsets(const sj_tensor *off, int64_t T) {
    int64_t n = off->shape[0];
    const int32_t *o = off->data;
    int64_t s = off->stride[0];
    if (n < 2)
        return sj_seterr(SJ_EINDEX, "attention_varlen: offsets has %lld entries, at least 2 ([B+1], B >= 1)",
                         (long long)n);
    if (o[0] != 0)
        return sj_seterr(SJ_EINDEX, "attention_varlen: offsets[0] is %d, expected 0", (int)o[0]);
    for (int64_t b = 1; b < n; b++)
        if (o[b * s] < o[(b - 1) * s])
            return sj_seterr(SJ_EINDEX, "attention_varlen: offsets decrease at entry %lld (%d after %d)",
                             (long long)b, (int)o[b * s], (int)o[(b - 1) * s]);
    if (o[(n - 1) * s] != T)
        return sj_seterr(SJ_EINDEX, "attention_varlen: offsets[%lld] (the last) is %d, expected T = %lld",
                         (long long)(n - 1), (int)o[(n - 1) * s], (long long)T);
    return SJ_OK;
}

/* -- One (sequence, head) pair --------------------------------------------- */

typedef struct vl_job {
    const sj_tensor *q, *k, *v, *y;
    const int32_t *off;
    int64_t os, H, D, Dv, es;
    float scale;
    int causal;
    _Atomic int failed;
} vl_job;

/* Rows r0 .. r0+n-1 (tokens) of head h of x, each d values, packed f32
 * row-major into dst. */
static void pack_rows(float *dst, const sj_tensor *x, int64_t es, int64_t r0, int64_t n, int64_t h, int64_t d) {
    for (int64_t r = 0; r < n; r++) {
        const char *p = (const char *)x->data + ((r0 + r) * x->stride[0] + h * x->stride[1]) * es;
        cpu_load_f32(dst + r * d, p, x->dtype, x->stride[2], d);
    }
}

static int pair(const vl_job *j, int64_t b, int64_t h) {
    int64_t t0 = j->off[b * j->os], L = j->off[(b + 1) * j->os] - t0;
    int64_t D = j->D, Dv = j->Dv;
    if (L <= 0) return 0;
    float *kf = sj_cpu_scratch(1, (size_t)(L * D) * sizeof(float));
    float *vf = sj_cpu_scratch(2, (size_t)(L * Dv) * sizeof(float));
    float *qf = sj_cpu_scratch(0, (size_t)(QB * D) * sizeof(float));
    float *s = sj_cpu_scratch(3, (size_t)(QB * L + QB * Dv) * sizeof(float));
    if (!kf || !vf || !qf || !s) return -1;
    float *o = s + QB * L;
    pack_rows(kf, j->k, j->es, t0, L, h, D);
    pack_rows(vf, j->v, j->es, t0, L, h, Dv);
    for (int64_t i0 = 0; i0 < L; i0 += QB) {
        int64_t rows = L - i0 < QB ? L - i0 : QB;
        int64_t kmax = j->causal ? i0 + rows : L; /* keys any query of the block sees */
        pack_rows(qf, j->q, j->es, t0 + i0, rows, h, D);
        if (D > 0)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)rows, (int)kmax, (int)D, j->scale, qf,
                        (int)D, kf, (int)D, 0.0f, s, (int)kmax);
        else
            memset(s, 0, (size_t)(rows * kmax) * sizeof(float));
        for (int64_t r = 0; r < rows; r++) {
            int64_t lim = j->causal ? i0 + r + 1 : L;
            float *srow = s + r * kmax;
            sj_cpu_softmax_row(srow, lim);
            memset(srow + lim, 0, (size_t)(kmax - lim) * sizeof(float));
        }
        if (Dv > 0)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)rows, (int)Dv, (int)kmax, 1.0f, s,
                        (int)kmax, vf, (int)Dv, 0.0f, o, (int)Dv);
        for (int64_t r = 0; r < rows; r++) {
            char *yp = (char *)j->y->data + ((t0 + i0 + r) * j->y->stride[0] + h * j->y->stride[1]) * j->es;
            cpu_store_f32(yp, j->y->dtype, j->y->stride[2], o + r * Dv, Dv);
        }
    }
    return 0;
}

static void pairs(void *ctx, int64_t begin, int64_t end) {
    vl_job *j = ctx;
    for (int64_t p = begin; p < end; p++)
        if (pair(j, p / j->H, p % j->H)) {
            atomic_store(&j->failed, 1);
            return;
        }
}

/* -- Entry ------------------------------------------------------------------- */

sj_status sj_cpu_attention_varlen(const sj_tensor *q, const sj_tensor *k, const sj_tensor *v,
                                  const sj_tensor *offsets, double scale, int causal, const sj_tensor *y,
                                  sj_threads *pool) {
    assert(q->rank == 3 && k->rank == 3 && v->rank == 3 && y->rank == 3 && offsets->rank == 1);
    assert(cpu_is_float(q->dtype) && k->dtype == q->dtype && v->dtype == q->dtype && y->dtype == q->dtype);
    assert(offsets->dtype == SJ_I32);
    int64_t T = q->shape[0], H = q->shape[1], B = offsets->shape[0] - 1;
    sj_status st = check_offsets(offsets, T);
    if (st) return st;
    vl_job j = {.q = q, .k = k, .v = v, .y = y, .off = offsets->data, .os = offsets->stride[0], .H = H,
                .D = q->shape[2], .Dv = v->shape[2], .es = (int64_t)cpu_dtype_size(q->dtype),
                .scale = (float)scale, .causal = causal};
    atomic_init(&j.failed, 0);
    if (T == 0 || H == 0 || j.Dv == 0) return SJ_OK;
    int64_t macs = 0, lmax = 0;
    for (int64_t b = 0; b < B; b++) {
        int64_t L = j.off[(b + 1) * j.os] - j.off[b * j.os];
        macs += L * L * H * (j.D + j.Dv);
        if (L > lmax) lmax = L;
    }
    if (lmax > INT32_MAX / (QB > j.D ? QB : j.D))
        return sj_seterr(SJ_ESHAPE, "attention_varlen: a sequence of %lld tokens is too long for BLAS",
                         (long long)lmax);
    int pool_ok = pool && sj_threads_count(pool) > 1 && openblas_get_num_threads() == 1;
    /* each thread taking part: at least the pool's minimum of work
     * (sj_threads_min_work), counted in pairs of the average size */
    int64_t thread_pairs = sj_threads_items(pool, macs / (B * H) > 0 ? macs / (B * H) : 1);
    if (pool_ok && B * H >= 2 * thread_pairs)
        sj_threads_split(pool, B * H, 1, thread_pairs, pairs, &j);
    else
        pairs(&j, 0, B * H);
    if (atomic_load(&j.failed))
        return sj_seterr(SJ_ENOMEM, "attention_varlen: out of memory for a sequence of %lld tokens",
                         (long long)lmax);
    return SJ_OK;
}
