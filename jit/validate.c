/* The validated swap (see validate.h). */
#include "jit/validate.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"
#include "base/half.h"
#include "base/tensor.h"
#include "jit/runtime.h"

double sj_validate_tolerance(sj_dtype dt) {
    switch (dt) {
    case SJ_F32: return 1e-4;
    case SJ_F16: return 1e-2;
    case SJ_BF16: return 6e-2;
    default: return 0;
    }
}

/* Element i of a contiguous host buffer as a double. */
static double elem(const void *p, sj_dtype dt, int64_t i) {
    switch (dt) {
    case SJ_F32: return ((const float *)p)[i];
    case SJ_F16: return sj_f16_to_f32(((const uint16_t *)p)[i]);
    case SJ_BF16: return sj_bf16_to_f32(((const uint16_t *)p)[i]);
    case SJ_I32: return ((const int32_t *)p)[i];
    case SJ_I64: return (double)((const int64_t *)p)[i];
    default: return ((const uint8_t *)p)[i];
    }
}

/* max |a - b| / max |b| over n elements (NaN where only one side is NaN, or
 * infinities that differ, is an infinite error); integers: 0 or infinite. */
static double rel_error(const void *a, const void *b, sj_dtype dt, int64_t n) {
    bool exact = sj_validate_tolerance(dt) == 0;
    if (exact) return memcmp(a, b, (size_t)n * sj_dtype_size(dt)) ? INFINITY : 0;
    if (dt == SJ_F32) { /* the common case, in one pass the compiler vectorises */
        const float *x = a, *y = b;
        float diff = 0, scale = 0;
        int nonfinite = 0;
        for (int64_t i = 0; i < n; i++) {
            float d = fabsf(x[i] - y[i]), m = fabsf(y[i]);
            diff = d > diff ? d : diff;
            scale = m > scale ? m : scale;
            nonfinite |= !(fabsf(x[i]) <= FLT_MAX) | !(m <= FLT_MAX);
        }
        if (!nonfinite) return diff == 0 ? 0 : (double)diff / (scale > 0 ? (double)scale : 1e-30);
    }
    double diff = 0, scale = 0;
    for (int64_t i = 0; i < n; i++) {
        double x = elem(a, dt, i), y = elem(b, dt, i);
        if (isnan(x) || isnan(y)) {
            if (isnan(x) != isnan(y)) return INFINITY;
            continue;
        }
        if (isinf(x) || isinf(y)) {
            if (x != y) return INFINITY;
            continue;
        }
        double d = fabs(x - y);
        if (d > diff) diff = d;
        if (fabs(y) > scale) scale = fabs(y);
    }
    return diff == 0 ? 0 : diff / (scale > 0 ? scale : 1e-30);
}

/* Host copies of a device tensor's bytes (contiguous), or the host data
 * itself. *owned: free it after. */
static const void *host_view(const sj_exec *x, const sj_tensor *t, void **owned, sj_status *st) {
    *owned = NULL;
    *st = SJ_OK;
    if (t->device == SJ_HOST) return t->data;
    sj_tensor h = *t;
    h.device = SJ_HOST;
    h.data = sj_malloc(sj_tensor_nbytes(t) ? sj_tensor_nbytes(t) : 1);
    if (!h.data) {
        *st = sj_seterr(SJ_ENOMEM, "out of memory");
        return NULL;
    }
    sj_tensor_set_contiguous(&h);
    if ((*st = sj_tensor_copy((sj_runtime *)x->rt, &h, t))) {
        free(h.data);
        return NULL;
    }
    *owned = h.data;
    return h.data;
}

static void free_output(const sj_exec *x, sj_tensor *t) {
    if (!t->data) return;
    if (x->ops->out_free) x->ops->out_free(x->ops_ctx, t->data);
    else sj_host_free(x->rt, t->data);
    t->data = NULL;
}

sj_status sj_validate_call(const sj_exec *x, const struct sj_fplan *plan, void *const *fns, sj_validation *v) {
    memset(v, 0, sizeof *v);
    v->output = -1;
    sj_status st = sj_exec_eager(x);
    if (st) return st;
    int n = x->g->n_outputs;
    sj_tensor shadow[SJ_MAX_OUTPUTS];
    memset(shadow, 0, sizeof shadow);
    sj_exec xs = *x;
    xs.outputs = shadow;
    sj_status fst = sj_exec_fused(&xs, plan, fns);
    for (int i = 0; i < n && !fst; i++) {
        const sj_tensor *e = &x->outputs[i], *f = &shadow[i];
        int64_t count = sj_tensor_numel(e);
        if (count == 0) continue;
        void *oe, *of;
        sj_status s1, s2;
        const void *he = host_view(x, e, &oe, &s1), *hf = host_view(x, f, &of, &s2);
        if (s1 || s2) {
            fst = s1 ? s1 : s2;
        } else {
            double err = rel_error(hf, he, e->dtype, count), tol = sj_validate_tolerance(e->dtype);
            if (err > tol && (v->output < 0 || err > v->err)) {
                v->differs = true;
                v->output = i, v->err = err, v->tol = tol;
            }
        }
        free(oe);
        free(of);
    }
    for (int i = 0; i < n; i++) free_output(x, &shadow[i]);
    if (fst == SJ_ENOMEM) { /* no memory for the check: no verdict; the call stands */
        v->inconclusive = true;
        v->differs = false;
        sj_clearerr();
        return SJ_OK;
    }
    if (fst) { /* eager ran; the fused code failed on the same inputs */
        v->differs = true;
        v->err = INFINITY;
        snprintf(v->why, sizeof v->why, "the fused run failed where eager succeeded: %s", sj_last_error());
        sj_clearerr();
        return SJ_OK;
    }
    if (v->differs)
        snprintf(v->why, sizeof v->why, "output %d: largest error %.3g of its largest magnitude, tolerance %.0e for %s",
                 v->output, v->err, v->tol, sj_dtype_name(x->outputs[v->output].dtype));
    return SJ_OK;
}
