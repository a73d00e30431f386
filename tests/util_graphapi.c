/* See util_graphapi.h. */
#include "tests/util_graphapi.h"

#include "tests/util.h"

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
