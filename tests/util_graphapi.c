/* See util_graphapi.h. */
#include "tests/util_graphapi.h"

#include "tests/util.h"

#include <math.h>
#include <stdlib.h>

sj_status tu_pos_model(sj_tracer *t, const sj_val *in, int n, void *user) {
    (void)n, (void)user;
    sj_val x = in[0], table = in[1];
    sj_dim S = sj_dim_of(t, x, 1), P = sj_dim_of(t, table, 0), one = sj_dim_const(t, 1);
    sj_val pos = sj_gather(t, table, sj_arange(t, S, SJ_I64));
    sj_output(t, sj_add(t, x, pos));
    sj_output(t, sj_mul(t, x, sj_slice_dim(t, table, 0, one, sj_dim_add(t, S, one))));
    sj_dim r3[3] = {one, S, one};
    sj_output(t, sj_mul(t, x, sj_reshape(t, sj_arange(t, S, sj_val_dtype(t, x)), 3, r3)));
    sj_output(t, sj_slice_dim(t, table, 0, S, sj_dim_add(t, S, P)));
    sj_output(t, sj_arange(t, S, SJ_I32));
    return sj_output(t, sj_slice_dim(t, x, 1, S, one));
}

void tu_pos_ref(const sj_tensor *x, const sj_tensor *table, int k, double *ref) {
    int64_t B = x->shape[0], S = x->shape[1], H = x->shape[2], P = table->shape[0];
    switch (k) {
    case 0:
    case 1:
    case 2:
        for (int64_t b = 0; b < B; b++)
            for (int64_t s = 0; s < S; s++)
                for (int64_t h = 0; h < H; h++) {
                    int64_t i = (b * S + s) * H + h;
                    double xv = tu_get(x, i);
                    ref[i] = k == 0   ? xv + tu_get(table, s * H + h)
                             : k == 1 ? xv * tu_get(table, (s + 1) * H + h)
                                      : xv * (double)s;
                }
        break;
    case 3:
        for (int64_t i = 0; i < (P - S) * H; i++) ref[i] = tu_get(table, S * H + i);
        break;
    case 4:
        for (int64_t s = 0; s < S; s++) ref[s] = (double)s;
        break;
    default:
        break;
    }
}

sj_status tu_mask_model(sj_tracer *t, const sj_val *in, int n, void *user) {
    (void)n;
    const tu_mask_spec *s = user;
    sj_val q = in[0], k = in[1], v = in[2], mask = in[3], keep = in[4];
    sj_output(t, sj_attention_mask(t, q, k, v, mask, s->scale, s->causal));
    sj_dim one = sj_dim_const(t, 1);
    sj_dim d4[4] = {sj_dim_of(t, keep, 0), one, one, sj_dim_of(t, keep, 1)};
    sj_val pad = sj_cast(t, sj_reshape(t, keep, 4, d4), SJ_BOOL);
    return sj_output(t, sj_attention_mask(t, q, k, v, pad, s->scale, 0));
}

void tu_ref_attention_mask(const sj_tensor *q, const sj_tensor *k, const sj_tensor *v, const sj_tensor *mask,
                           double scale, int causal, double *out) {
    int64_t B = q->shape[0], H = q->shape[1], Sq = q->shape[2], D = q->shape[3], Sk = k->shape[2],
            Dv = v->shape[3];
    int64_t sc[4] = {B, H, Sq, Sk};
    sj_tensor m = mask ? tu_broadcast(mask, 4, sc) : (sj_tensor){0};
    double *p = malloc(sizeof(double) * (size_t)(Sk ? Sk : 1));
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < Sq; i++) {
                double mx = -INFINITY;
                for (int64_t j = 0; j < Sk; j++) {
                    double dot = 0;
                    for (int64_t d = 0; d < D; d++)
                        dot += tu_get(q, ((b * H + h) * Sq + i) * D + d) * tu_get(k, ((b * H + h) * Sk + j) * D + d);
                    double s = dot * scale;
                    if (mask) {
                        double mv = tu_get(&m, ((b * H + h) * Sq + i) * Sk + j);
                        s = mask->dtype == SJ_BOOL ? (mv != 0 ? s : -INFINITY) : s + mv;
                    }
                    if (causal && j > i + Sk - Sq) s = -INFINITY;
                    p[j] = s;
                    if (s > mx) mx = s;
                }
                double sum = 0;
                for (int64_t j = 0; j < Sk; j++) {
                    p[j] = mx == -INFINITY ? 0 : exp(p[j] - mx);
                    sum += p[j];
                }
                for (int64_t e = 0; e < Dv; e++) {
                    double acc = 0;
                    for (int64_t j = 0; j < Sk; j++) acc += p[j] * tu_get(v, ((b * H + h) * Sk + j) * Dv + e);
                    out[((b * H + h) * Sq + i) * Dv + e] = sum > 0 ? acc / sum : 0;
                }
            }
    free(p);
}

sj_tensor tu_random_mask(sj_dtype dt, int rank, const int64_t *shape) {
    sj_tensor m = tu_tensor(dt, rank, shape);
    int64_t n = tu_numel(&m), last = rank ? shape[rank - 1] : 1, rows = rank > 1 ? shape[rank - 2] : 1;
    for (int64_t i = 0; i < n; i++) {
        int64_t row = last ? (i / last) % rows : 0;
        bool off = (rows > 1 && row == 0) || tu_randint(0, 3) == 0;
        if (dt == SJ_BOOL) tu_seti(&m, i, !off);
        else tu_set(&m, i, off ? -INFINITY : tu_uniform(-2, 2));
    }
    return m;
}
