/* The encoder layer the tests share; see tests/util_encoder.h. */
#include "tests/util_encoder.h"

#include <math.h>
#include <stdlib.h>

#include "tests/util.h"

static sj_tensor param(sj_dtype dt, int rank, int64_t s0, int64_t s1, double scale, double offset) {
    sj_tensor p = tu_tensor(dt, rank, (int64_t[]){s0, s1});
    tu_fill_random(&p);
    for (int64_t i = 0; i < tu_numel(&p); i++) tu_set(&p, i, offset + scale * tu_get(&p, i));
    return p;
}

void tu_encoder_init(tu_encoder *w, sj_dtype dt, int64_t h, int64_t nh, int64_t ff) {
    double si = 0.5 / sqrt((double)h), sf = 0.5 / sqrt((double)ff);
    w->h = h, w->nh = nh, w->ff = ff;
    w->wqkv = param(dt, 2, h, 3 * h, si, 0), w->bqkv = param(dt, 1, 3 * h, 0, 0.02, 0);
    w->wo = param(dt, 2, h, h, si, 0), w->bo = param(dt, 1, h, 0, 0.02, 0);
    w->g1 = param(dt, 1, h, 0, 0.1, 1), w->b1 = param(dt, 1, h, 0, 0.02, 0);
    w->w1 = param(dt, 2, h, ff, si, 0), w->bf1 = param(dt, 1, ff, 0, 0.02, 0);
    w->w2 = param(dt, 2, ff, h, sf, 0), w->bf2 = param(dt, 1, h, 0, 0.02, 0);
    w->g2 = param(dt, 1, h, 0, 0.1, 1), w->b2 = param(dt, 1, h, 0, 0.02, 0);
}

/* -- The model ------------------------------------------------------------------- */

static sj_val linear(sj_tracer *t, sj_val x, const sj_tensor *w, const sj_tensor *b) {
    return sj_add(t, sj_matmul(t, x, sj_param(t, w)), sj_param(t, b));
}

sj_status tu_encoder_model(sj_tracer *t, const sj_val *in, int n, void *user) {
    const tu_encoder *w = user;
    int64_t hd = w->h / w->nh;
    sj_val x = in[0];
    sj_dim b = sj_dim_of(t, x, 0), s = sj_dim_of(t, x, 1);
    sj_val qkv = linear(t, x, &w->wqkv, &w->bqkv), heads[3];
    for (int i = 0; i < 3; i++) {
        sj_dim d4[4] = {b, s, sj_dim_const(t, w->nh), sj_dim_const(t, hd)};
        sj_val part = sj_slice(t, qkv, 2, i * w->h, (i + 1) * w->h, 1);
        heads[i] = sj_permute(t, sj_reshape(t, part, 4, d4), (int[]){0, 2, 1, 3});
    }
    sj_val a = sj_attention(t, heads[0], heads[1], heads[2], n > 1 ? in[1] : SJ_NONE, 1.0 / sqrt((double)hd), 0);
    sj_dim d3[3] = {b, s, sj_dim_const(t, w->h)};
    a = sj_reshape(t, sj_permute(t, a, (int[]){0, 2, 1, 3}), 3, d3);
    sj_val x1 = sj_layer_norm(t, sj_add(t, x, linear(t, a, &w->wo, &w->bo)), sj_param(t, &w->g1),
                              sj_param(t, &w->b1), 1e-5);
    sj_val f = linear(t, sj_gelu(t, linear(t, x1, &w->w1, &w->bf1)), &w->w2, &w->bf2);
    return sj_output(t, sj_layer_norm(t, sj_add(t, x1, f), sj_param(t, &w->g2), sj_param(t, &w->b2), 1e-5));
}

/* -- The float64 reference ----------------------------------------------------------- */

/* y [rows, n] = x [rows, k] w [k, n] + b */
static void ref_linear(const double *x, int64_t rows, int64_t k, const sj_tensor *w, const sj_tensor *b, int64_t n,
                       double *y) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < n; j++) {
            double s = tu_get(b, j);
            for (int64_t i = 0; i < k; i++) s += x[r * k + i] * tu_get(w, i * n + j);
            y[r * n + j] = s;
        }
}

static void ref_ln(double *x, int64_t rows, int64_t d, const sj_tensor *g, const sj_tensor *b) {
    for (int64_t r = 0; r < rows; r++) {
        double m = 0, v = 0;
        for (int64_t i = 0; i < d; i++) m += x[r * d + i];
        m /= (double)d;
        for (int64_t i = 0; i < d; i++) v += (x[r * d + i] - m) * (x[r * d + i] - m);
        v /= (double)d;
        for (int64_t i = 0; i < d; i++) x[r * d + i] = (x[r * d + i] - m) / sqrt(v + 1e-5) * tu_get(g, i) + tu_get(b, i);
    }
}

void tu_encoder_ref(const tu_encoder *w, const sj_tensor *x, const sj_tensor *lengths, double *out) {
    int64_t B = x->shape[0], S = x->shape[1], H = w->h, NH = w->nh, HD = H / NH, FF = w->ff, R = B * S;
    size_t rh = (size_t)(R * H) + 1;
    double *xd = calloc(rh, sizeof(double)), *qkv = calloc(3 * rh, sizeof(double)), *att = calloc(rh, sizeof(double)),
           *f1 = calloc((size_t)(R * FF) + 1, sizeof(double)), *x1 = calloc(rh, sizeof(double)),
           *sc = calloc((size_t)S + 1, sizeof(double));
    if (!xd || !qkv || !att || !f1 || !x1 || !sc) abort(); /* a test helper: out of memory ends the test */
    for (int64_t i = 0; i < R * H; i++) xd[i] = tu_get(x, i);
    ref_linear(xd, R, H, &w->wqkv, &w->bqkv, 3 * H, qkv);
    for (int64_t b = 0; b < B; b++) {
        int64_t L = lengths ? tu_geti(lengths, b) : S;
        L = L < 0 ? 0 : L > S ? S : L;
        for (int64_t hh = 0; hh < NH; hh++)
            for (int64_t i = 0; i < S; i++) {
                double mx = -INFINITY, sum = 0;
                for (int64_t j = 0; j < L; j++) {
                    double s = 0;
                    for (int64_t e = 0; e < HD; e++)
                        s += qkv[(b * S + i) * 3 * H + hh * HD + e] * qkv[(b * S + j) * 3 * H + H + hh * HD + e];
                    sc[j] = s / sqrt((double)HD);
                    mx = fmax(mx, sc[j]);
                }
                for (int64_t j = 0; j < L; j++) sum += (sc[j] = exp(sc[j] - mx));
                for (int64_t e = 0; e < HD; e++) {
                    double o = 0;
                    for (int64_t j = 0; j < L; j++) o += sc[j] / sum * qkv[(b * S + j) * 3 * H + 2 * H + hh * HD + e];
                    att[(b * S + i) * H + hh * HD + e] = o; /* no key: zeros */
                }
            }
    }
    ref_linear(att, R, H, &w->wo, &w->bo, H, x1);
    for (int64_t i = 0; i < R * H; i++) x1[i] += xd[i];
    ref_ln(x1, R, H, &w->g1, &w->b1);
    ref_linear(x1, R, H, &w->w1, &w->bf1, FF, f1);
    for (int64_t i = 0; i < R * FF; i++) f1[i] = 0.5 * f1[i] * (1 + erf(f1[i] / sqrt(2.0)));
    ref_linear(f1, R, FF, &w->w2, &w->bf2, H, out);
    for (int64_t i = 0; i < R * H; i++) out[i] += x1[i];
    ref_ln(out, R, H, &w->g2, &w->b2);
    free(xd), free(qkv), free(att), free(f1), free(x1), free(sc);
}
