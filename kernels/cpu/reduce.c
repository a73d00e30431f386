/* Eager reductions over one axis (sum, mean, amax), softmax, layer norm and
 * RMS norm.
 *
 * Floats accumulate in double (f16/bf16 read exactly as f32), integers in
 * int64 with wrapping, narrowed on store. Definitions:
 *   sum        exact order not specified (blocked partial sums in double)
 *   mean       sum / n in double; n = 0 gives NaN
 *   amax       max propagating NaN (an empty axis is the tracer's error)
 *   softmax    e = exp(x - max) (sj_rt_exp_shifted: an e below 2^-126 is
 *              0), y = e * (float)(1 / sum(e)); a row that is all -inf
 *              gives zeros (sj_cpu_softmax_row, which attention uses too)
 *   layer norm mean, var = mean((x - mean)^2) (biased) and rstd =
 *              1 / sqrt(var + eps) in double; then per element, in f32,
 *              y = ((x - mhi) - mlo) * frs * g + b, where mhi + mlo is the
 *              mean split into two floats (mhi = (float)mean, mlo = the
 *              rest) and frs = (float)rstd: x - mhi is exact where x is near
 *              the mean, so a row whose mean is large against its spread
 *              keeps its digits, and the per-element work stays in f32
 *              vectors (no conversions to double and back: a few ulp
 *              instead of one rounding); sj_rt_split and sj_rt_layer_norm1
 *              in base/sj_kernel_rt.h, which the generated C calls too
 *   rms norm   r = 1 / sqrt(mean(x^2) + eps) in double, y = x * (float)r * g
 *              in f32
 * The fused kernels (specialize/codegen_c.c) compute the same.
 */
#include <assert.h>
#include <math.h>
#include <string.h>

#include "base/error.h"
#include "kernels/cpu/cpu_int.h"
#include "kernels/cpu/eager.h"

#define CHUNK 256

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* A copy of t with axis `axis` of size 1 (so plans skip it). */
static sj_tensor drop_axis(const sj_tensor *t, int axis) {
    sj_tensor v = *t;
    v.shape[axis] = 1;
    return v;
}

/* -- Reductions ----------------------------------------------------------- */

typedef struct reduce_job {
    sj_op op;
    sj_dtype dt;
    int64_t n, sr; /* length and stride of the reduced axis in x */
    cpu_plan p;    /* y, x over the kept axes */
} reduce_job;

/* Reduce n floats at stride s. */
static double reduce_run_f(const reduce_job *j, const char *x) {
    float buf[CHUNK];
    int64_t es = (int64_t)cpu_dtype_size(j->dt);
    double s = 0.0;
    float m = -INFINITY;
    for (int64_t c = 0; c < j->n; c += CHUNK) {
        int64_t k = min64(CHUNK, j->n - c);
        const float *v = buf;
        if (j->dt == SJ_F32 && j->sr == 1)
            v = (const float *)x + c;
        else
            cpu_load_f32(buf, x + c * j->sr * es, j->dt, j->sr, k);
        if (j->op == SJ_OP_AMAX) {
            float mk = cpu_max_f32(v, k);
            m = sj_rt_max_combine(m, mk); /* a NaN m stays */
        } else {
            s += cpu_sum_f32(v, k);
        }
    }
    if (j->op == SJ_OP_AMAX)
        return m;
    if (j->op == SJ_OP_MEAN)
        return j->n ? s / (double)j->n : NAN;
    return s;
}

static int64_t reduce_run_i(const reduce_job *j, const char *x) {
    int64_t buf[CHUNK];
    int64_t es = (int64_t)cpu_dtype_size(j->dt);
    uint64_t s = 0;
    int64_t m = INT64_MIN;
    for (int64_t c = 0; c < j->n; c += CHUNK) {
        int64_t k = min64(CHUNK, j->n - c);
        cpu_load_i64(buf, x + c * j->sr * es, j->dt, j->sr, k);
        for (int64_t i = 0; i < k; i++) {
            s += (uint64_t)buf[i];
            m = buf[i] > m ? buf[i] : m;
        }
    }
    return j->op == SJ_OP_AMAX ? m : cpu_i64_from_u(s);
}

/* Path A: one output element at a time, reducing along the axis. */
static void reduce_rows_a(const reduce_job *j, int64_t begin, int64_t end) {
    const cpu_plan *p = &j->p;
    int r = p->rank - 1;
    int64_t n = p->shape[r], sy = p->stride[0][r], sx = p->stride[1][r];
    int64_t es = (int64_t)p->esize[0];
    cpu_iter it;
    cpu_iter_seek(p, &it, begin);
    for (int64_t row = begin; row < end; row++, cpu_iter_next(p, &it)) {
        char *y = cpu_iter_ptr(p, &it, 0);
        const char *x = cpu_iter_ptr(p, &it, 1);
        for (int64_t i = 0; i < n; i++) {
            if (cpu_is_float(j->dt)) {
                float v = (float)reduce_run_f(j, x + i * sx * es);
                cpu_store_f32(y + i * sy * es, j->dt, 1, &v, 1);
            } else {
                int64_t v = reduce_run_i(j, x + i * sx * es);
                cpu_store_i64(y + i * sy * es, j->dt, 1, &v, 1);
            }
        }
    }
}

/* Path B, when x's innermost kept axis has unit stride and the reduced one
 * does not: accumulate whole rows (acc holds the row, in double or int64),
 * walking memory in order. */
static void reduce_rows_b(const reduce_job *j, void *acc, int64_t begin, int64_t end) {
    const cpu_plan *p = &j->p;
    int r = p->rank - 1, isf = cpu_is_float(j->dt), amax = j->op == SJ_OP_AMAX;
    int64_t n = p->shape[r], sy = p->stride[0][r];
    int64_t es = (int64_t)p->esize[0];
    double *ad = acc;
    int64_t *ai = acc;
    float fb[CHUNK];
    int64_t ib[CHUNK];
    cpu_iter it;
    cpu_iter_seek(p, &it, begin);
    for (int64_t row = begin; row < end; row++, cpu_iter_next(p, &it)) {
        char *y = cpu_iter_ptr(p, &it, 0);
        const char *x = cpu_iter_ptr(p, &it, 1);
        for (int64_t i = 0; i < n; i++) {
            if (isf)
                ad[i] = amax ? -INFINITY : 0.0;
            else
                ai[i] = amax ? INT64_MIN : 0;
        }
        for (int64_t k = 0; k < j->n; k++) {
            const char *xk = x + k * j->sr * es;
            for (int64_t c = 0; c < n; c += CHUNK) {
                int64_t m = min64(CHUNK, n - c);
                double *a = ad + c;
                int64_t *b = ai + c;
                if (isf) {
                    const float *v = fb;
                    if (j->dt == SJ_F32)
                        v = (const float *)xk + c;
                    else
                        cpu_load_f32(fb, xk + c * es, j->dt, 1, m);
                    if (amax)
                        for (int64_t i = 0; i < m; i++)
                            a[i] = (v[i] > a[i] || v[i] != v[i]) ? v[i] : a[i];
                    else
                        CPU_VLOOP(i, m, a[i] += v[i]);
                } else {
                    cpu_load_i64(ib, xk + c * es, j->dt, 1, m);
                    for (int64_t i = 0; i < m; i++)
                        b[i] = amax ? (ib[i] > b[i] ? ib[i] : b[i])
                                    : cpu_i64_from_u((uint64_t)b[i] + (uint64_t)ib[i]);
                }
            }
        }
        for (int64_t i = 0; i < n; i++) {
            if (isf) {
                float v = (float)(j->op == SJ_OP_MEAN ? ad[i] / (double)j->n : ad[i]);
                cpu_store_f32(y + i * sy * es, j->dt, 1, &v, 1);
            } else {
                cpu_store_i64(y + i * sy * es, j->dt, 1, &ai[i], 1);
            }
        }
    }
}

sj_status sj_cpu_reduce(sj_op op, const sj_tensor *x, int axis, const sj_tensor *y) {
    assert(op == SJ_OP_SUM || op == SJ_OP_MEAN || op == SJ_OP_AMAX);
    assert(x->dtype == y->dtype && x->rank == y->rank && x->dtype != SJ_BOOL);
    assert(op != SJ_OP_MEAN || cpu_is_float(x->dtype));
    if (axis < 0)
        axis += x->rank;
    assert(axis >= 0 && axis < x->rank && y->shape[axis] == 1);
    reduce_job j = {.op = op, .dt = x->dtype, .n = x->shape[axis], .sr = x->stride[axis]};
    assert(op != SJ_OP_AMAX || j.n > 0);
    sj_tensor xv = drop_axis(x, axis);
    const sj_tensor *ts[2] = {y, &xv};
    if (cpu_plan_init(&j.p, 2, ts) == 0)
        return SJ_OK;
    int r = j.p.rank - 1;
    int64_t inner = j.p.shape[r], rows = cpu_plan_rows(&j.p);
    if (inner > 1 && j.p.stride[1][r] == 1 && j.sr != 1 && j.n > 1) {
        void *acc = sj_cpu_scratch(0, (size_t)inner * 8);
        if (!acc)
            return sj_seterr(SJ_ENOMEM, "reduce: out of memory for %lld accumulators",
                             (long long)inner);
        reduce_rows_b(&j, acc, 0, rows);
    } else {
        reduce_rows_a(&j, 0, rows);
    }
    return SJ_OK;
}

/* -- Row kernels: softmax and norms --------------------------------------- */

CPU_CLONES static void exp_shifted(float *x, float m, int64_t n) {
    CPU_VLOOP(i, n, x[i] = sj_rt_exp_shifted(x[i] - m));
}

void sj_cpu_softmax_row(float *x, int64_t n) {
    float m = cpu_max_f32(x, n);
    if (m == -INFINITY) {
        memset(x, 0, (size_t)n * sizeof *x);
        return;
    }
    exp_shifted(x, m, n);
    float inv = (float)(1.0 / cpu_sum_f32(x, n));
    CPU_VLOOP(i, n, x[i] *= inv);
}

/* Softmax and the norms run over rows: a plan over (y, x) without the row
 * axis; each row is read into a contiguous f32 buffer unless it already is
 * one, and written from one. */

typedef struct row_job {
    sj_dtype dt;
    int64_t n, sx, sy; /* row length and strides */
    cpu_plan p;        /* y, x over the other axes */
} row_job;

static int64_t row_setup(row_job *j, const sj_tensor *x, int axis, const sj_tensor *y) {
    assert(x->dtype == y->dtype && cpu_is_float(x->dtype) && x->rank == y->rank);
    assert(axis >= 0 && axis < x->rank);
    for (int i = 0; i < x->rank; i++) assert(x->shape[i] == y->shape[i]);
    j->dt = x->dtype;
    j->n = x->shape[axis];
    j->sx = x->stride[axis];
    j->sy = y->stride[axis];
    sj_tensor xv = drop_axis(x, axis), yv = drop_axis(y, axis);
    const sj_tensor *ts[2] = {&yv, &xv};
    return j->n == 0 ? 0 : cpu_plan_init(&j->p, 2, ts);
}

typedef struct norm_args {
    const float *g, *b; /* n floats each */
    double eps;
    int rms;
} norm_args;

/* One row: xr (contiguous) -> out (contiguous, distinct from xr). */
static void norm_row(const norm_args *a, float *restrict out, const float *restrict xr, int64_t n) {
    const float *restrict g = a->g, *restrict b = a->b;
    if (a->rms) {
        double ms = cpu_sumsq_f32(xr, 0.0, n) / (double)n;
        const float fr = (float)(1.0 / sqrt(ms + a->eps));
        CPU_VLOOP(i, n, out[i] = xr[i] * fr * g[i]);
    } else {
        double mean = cpu_sum_f32(xr, n) / (double)n;
        double var = cpu_sumsq_f32(xr, mean, n) / (double)n;
        float mlo, mhi = sj_rt_split(mean, &mlo), frs = (float)(1.0 / sqrt(var + a->eps));
        CPU_VLOOP(i, n, out[i] = sj_rt_layer_norm1(xr[i], mhi, mlo, frs, g[i], b[i]));
    }
}

/* Rows [begin, end) of the plan; each plan element is one row of n. buf
 * holds 2n floats: the input row and the output row. */
static void rows_range(const row_job *j, const norm_args *na, float *buf, int64_t begin,
                       int64_t end) {
    const cpu_plan *p = &j->p;
    int r = p->rank - 1;
    int64_t n = j->n, inner = p->shape[r], isy = p->stride[0][r], isx = p->stride[1][r];
    int64_t es = (int64_t)p->esize[0];
    int ydirect = j->dt == SJ_F32 && j->sy == 1, xdirect = j->dt == SJ_F32 && j->sx == 1;
    cpu_iter it;
    cpu_iter_seek(p, &it, begin);
    for (int64_t row = begin; row < end; row++, cpu_iter_next(p, &it)) {
        for (int64_t e = 0; e < inner; e++) {
            char *y = cpu_iter_ptr(p, &it, 0) + e * isy * es;
            const char *x = cpu_iter_ptr(p, &it, 1) + e * isx * es;
            float *out = ydirect ? (float *)y : buf + n;
            if (!na) {
                cpu_load_f32(out, x, j->dt, j->sx, n);
                sj_cpu_softmax_row(out, n);
            } else {
                const float *xr = xdirect ? (const float *)x : buf;
                if (!xdirect)
                    cpu_load_f32(buf, x, j->dt, j->sx, n);
                norm_row(na, out, xr, n);
            }
            if (!ydirect)
                cpu_store_f32(y, j->dt, j->sy, out, n);
        }
    }
}

/* Softmax (na NULL) or a norm over every row; scratch slot 0. */
static sj_status rows_run(const row_job *j, const norm_args *na, const char *what) {
    float *buf = sj_cpu_scratch(0, (size_t)j->n * 2 * sizeof(float));
    if (!buf)
        return sj_seterr(SJ_ENOMEM, "%s: out of memory for a row of %lld", what, (long long)j->n);
    rows_range(j, na, buf, 0, cpu_plan_rows(&j->p));
    return SJ_OK;
}

sj_status sj_cpu_softmax(const sj_tensor *x, int axis, const sj_tensor *y) {
    row_job j;
    if (axis < 0)
        axis += x->rank;
    if (row_setup(&j, x, axis, y) == 0)
        return SJ_OK;
    return rows_run(&j, NULL, "softmax");
}

/* g and b (or 1 and 0) as f32 in scratch slot 1. */
static sj_status norm_params(norm_args *na, const sj_tensor *g, const sj_tensor *b, int64_t n,
                             const char *what) {
    float *gb = sj_cpu_scratch(1, (size_t)n * 2 * sizeof(float));
    if (!gb)
        return sj_seterr(SJ_ENOMEM, "%s: out of memory for %lld parameters", what, (long long)n);
    if (g) {
        assert(g->rank == 1 && g->shape[0] == n);
        cpu_load_f32(gb, g->data, g->dtype, g->stride[0], n);
    } else {
        for (int64_t i = 0; i < n; i++) gb[i] = 1.0f;
    }
    if (b) {
        assert(b->rank == 1 && b->shape[0] == n);
        cpu_load_f32(gb + n, b->data, b->dtype, b->stride[0], n);
    } else {
        memset(gb + n, 0, (size_t)n * sizeof(float));
    }
    na->g = gb;
    na->b = gb + n;
    return SJ_OK;
}

static sj_status norm(const sj_tensor *x, const sj_tensor *g, const sj_tensor *b, double eps,
                      const sj_tensor *y, int rms, const char *what) {
    row_job j;
    norm_args na = {.eps = eps, .rms = rms};
    assert(x->rank >= 1);
    assert(!g || g->dtype == x->dtype);
    assert(!b || b->dtype == x->dtype);
    if (row_setup(&j, x, x->rank - 1, y) == 0)
        return SJ_OK;
    sj_status st = norm_params(&na, g, b, j.n, what);
    return st ? st : rows_run(&j, &na, what);
}

sj_status sj_cpu_layer_norm(const sj_tensor *x, const sj_tensor *g, const sj_tensor *b, double eps,
                            const sj_tensor *y) {
    return norm(x, g, b, eps, y, 0, "layer_norm");
}

sj_status sj_cpu_rms_norm(const sj_tensor *x, const sj_tensor *g, double eps, const sj_tensor *y) {
    return norm(x, g, NULL, eps, y, 1, "rms_norm");
}
