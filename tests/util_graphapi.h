/* Models and float64 references for the graph API of issue 26 (sj_arange,
 * sj_slice_dim, ...), shared by the CPU test (test_graphapi.c) and the CUDA
 * one (test_cuda_jit.c). */
#ifndef TU_GRAPHAPI_H
#define TU_GRAPHAPI_H

#include "jit/shapejit.h"

/* Position ids in the graph: inputs x [B, S, H] and table [P, H] (one float
 * dtype), S symbolic where the policy allows, S + 1 <= P. Outputs:
 *   0: x + gather(table, arange(S, i64))              [B, S, H]
 *   1: x * slice_dim(table, 0, 1, S + 1)              [B, S, H]
 *   2: x * reshape(arange(S, dtype of x), [1, S, 1])  [B, S, H]
 *   3: slice_dim(table, 0, S, S + P)  (clamped: rows S..P-1)  [P - S, H]
 *   4: arange(S, i32)                                 [S]
 *   5: slice_dim(x, 1, S, 1) (empty: end < start)     [B, 0, H] */
#define TU_POS_OUTPUTS 6
sj_status tu_pos_model(sj_tracer *t, const sj_val *in, int n, void *user);
/* The float64 reference of output k into ref (row-major). */
void tu_pos_ref(const sj_tensor *x, const sj_tensor *table, int k, double *ref);

/* Masked attention: inputs q [B,H,Sq,D], k [B,H,Sk,D], v [B,H,Sk,Dv],
 * mask (float or bool, broadcastable to [B,H,Sq,Sk]) and keep (i32 0/1
 * [B, Sk]). Outputs:
 *   0: attention_mask(q, k, v, mask, scale, causal)
 *   1: attention_mask(q, k, v, bool(reshape(keep, [B,1,1,Sk])), scale, 0)
 *      (a 0/1 padding mask made in the graph) */
typedef struct tu_mask_spec {
    double scale;
    int causal;
} tu_mask_spec;
sj_status tu_mask_model(sj_tracer *t, const sj_val *in, int n, void *user);
/* The float64 reference: mask (any rank <= 4; bool: false masks; NULL:
 * none) broadcast to the scores; a query with no key left gives zeros. */
void tu_ref_attention_mask(const sj_tensor *q, const sj_tensor *k, const sj_tensor *v, const sj_tensor *mask,
                           double scale, int causal, double *out);
/* A random mask of dtype dt and shape (rank <= 4): floats in [-2, 2]
 * with -inf at about a quarter of the elements and at every element of
 * row 0 (of the last two axes) when it has more than one row; bool: about
 * a third false, row 0 all false likewise. */
sj_tensor tu_random_mask(sj_dtype dt, int rank, const int64_t *shape);

#endif
