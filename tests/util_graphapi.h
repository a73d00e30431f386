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

#endif
