/* The encoder layer the tests share (tests/util_encoder.c): the sample's
 * post-LN BERT layer at any size, with random weights of any float dtype,
 * as a model function and as a float64 reference.
 *
 *   qkv = x Wqkv + b; its column blocks as heads [B, nh, S, h / nh];
 *   a = attention(q, k, v, lengths or none, 1 / sqrt(h / nh)), heads merged
 *   back (permute + reshape); x1 = LN(x + a Wo + bo);
 *   y = LN(x1 + gelu(x1 W1 + b1) W2 + b2).
 */
#ifndef SJ_TEST_UTIL_ENCODER_H
#define SJ_TEST_UTIL_ENCODER_H

#include <stdint.h>

#include "jit/shapejit.h"

typedef struct tu_encoder {
    int64_t h, nh, ff; /* hidden size, heads, FFN size */
    sj_tensor wqkv, bqkv, wo, bo, g1, b1, w1, bf1, w2, bf2, g2, b2;
} tu_encoder;

/* Random host weights (tracked: tu_free_all releases them), scaled so that
 * activations stay near 1: products by 0.5 / sqrt(fan-in), biases 0.02,
 * norm gains 1 +- 0.1. */
void tu_encoder_init(tu_encoder *w, sj_dtype dt, int64_t h, int64_t nh, int64_t ff);

/* The model; user is the tu_encoder. in[0] x [B, S, h]; with two inputs,
 * in[1] the lengths [B] (i32 or i64) that mask keys. */
sj_status tu_encoder_model(sj_tracer *t, const sj_val *in, int n, void *user);

/* The model in float64 at x (and lengths, or NULL) into out [B S h]. */
void tu_encoder_ref(const tu_encoder *w, const sj_tensor *x, const sj_tensor *lengths, double *out);

#endif /* SJ_TEST_UTIL_ENCODER_H */
