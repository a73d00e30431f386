/* Eager CPU kernels: one reference kernel per op, for every dtype.
 *
 * Conventions shared by every kernel here:
 * - Operands are sj_tensor descriptors: host memory, element strides >= 0
 *   (0 on broadcast axes), any layout. Kernels never assume contiguity; they
 *   take fast paths when the layout allows.
 * - The output descriptor y has its data, shape and strides set by the caller
 *   (memory allocated, not aliasing any input, strides >= 0 and
 *   non-overlapping; usually contiguous but not always).
 * - Elementwise operands arrive already broadcast: same rank and shape as y,
 *   with stride 0 on the broadcast axes.
 * - f16/bf16 are computed in f32; f32 in f32; reductions and norms accumulate
 *   in double. i32/i64 arithmetic is exact integer arithmetic (wrapping on
 *   overflow, computed in int64 then narrowed).
 * - Kernels return SJ_OK, or an error with sj_seterr() for data-dependent
 *   failures only (gather index out of range, scratch allocation failure).
 *   Shape and dtype validity is the tracer's job; kernels assert it.
 * - Sizes may be 0 (nothing to do) or 1.
 * - Kernels are thread-safe: scratch memory is per thread (sj_cpu_scratch).
 */
#ifndef SJ_CPU_EAGER_H
#define SJ_CPU_EAGER_H

#include "base/ops.h"
#include "jit/shapejit.h"

struct sj_threads;

/* Elementwise unary (SJ_K_UNARY ops). x and y have the same dtype. */
sj_status sj_cpu_unary(sj_op op, const sj_tensor *x, const sj_tensor *y);

/* Elementwise binary (SJ_K_BINARY) and comparisons (SJ_K_COMPARE: y is bool).
 * a and b have the same dtype. */
sj_status sj_cpu_binary(sj_op op, const sj_tensor *a, const sj_tensor *b, const sj_tensor *y);

/* y = c ? a : b; c is bool; a, b, y share a dtype. */
sj_status sj_cpu_where(const sj_tensor *c, const sj_tensor *a, const sj_tensor *b,
                       const sj_tensor *y);

/* y = x converted to y's dtype (same shape): cast, and contiguous copies. */
sj_status sj_cpu_copy(const sj_tensor *x, const sj_tensor *y);

/* Reduction (SJ_OP_SUM, SJ_OP_MEAN, SJ_OP_AMAX) of x over `axis`; y has x's
 * rank with y->shape[axis] == 1. x and y share a dtype. */
sj_status sj_cpu_reduce(sj_op op, const sj_tensor *x, int axis, const sj_tensor *y);

/* Softmax over axis; x and y have the same shape and dtype. */
sj_status sj_cpu_softmax(const sj_tensor *x, int axis, const sj_tensor *y);

/* Layer norm over the last axis. g, b: NULL or 1-D of the last axis' size,
 * same dtype as x. */
sj_status sj_cpu_layer_norm(const sj_tensor *x, const sj_tensor *g, const sj_tensor *b, double eps,
                            const sj_tensor *y);

/* RMS norm over the last axis; g NULL or 1-D. */
sj_status sj_cpu_rms_norm(const sj_tensor *x, const sj_tensor *g, double eps, const sj_tensor *y);

/* y[..., M, N] = a[..., M, K] @ b[..., K, N]. a, b, y have the same rank
 * (>= 2) and batch sizes (broadcast batch axes have stride 0). Float dtypes go
 * through cblas_sgemm (f16/bf16 converted to f32 first); integers are exact.
 * pool: the kernel threads a large float product may be split over (when
 * OpenBLAS runs single-threaded); NULL: the calling thread only. */
sj_status sj_cpu_matmul(const sj_tensor *a, const sj_tensor *b, const sj_tensor *y, struct sj_threads *pool);
/* The same with bias (float dtypes; NULL: none), a rank-1 tensor of y's
 * dtype and last size (any stride), added to every row of the product
 * before it is stored: y = a @ b + bias, rounded once for f16/bf16. */
sj_status sj_cpu_matmul_bias(const sj_tensor *a, const sj_tensor *b, const sj_tensor *bias, const sj_tensor *y,
                             struct sj_threads *pool);
/* The same over pb, b packed once (kernels/cpu/prepack.h; NULL: as
 * sj_cpu_matmul_bias), for a float product whose b is one matrix shared
 * by every batch (a constant): b's data is not read, the product runs
 * over the packed panels (rows of every batch at once where a's and y's
 * batch axes collapse). An f16/bf16 a is converted as it is packed into
 * tiles, a row-major f16/bf16 y tile by tile as it is stored (other
 * layouts through f32 scratch). */
struct sj_cpu_packed;
sj_status sj_cpu_matmul_packed(const sj_tensor *a, const sj_tensor *b, const struct sj_cpu_packed *pb,
                               const sj_tensor *bias, const sj_tensor *y, struct sj_threads *pool);
/* The same with an epilogue (kernels/cpu/prepack.h's sj_cpu_epilogue; NULL:
 * none) over y's elements in row-major order, run inside the product where
 * it can be: an f32 y that is one contiguous matrix once its batch axes
 * collapse (one product). *fused (may be NULL) says whether it ran; when
 * not, the product ran alone and the caller runs the epilogue itself. */
struct sj_cpu_epilogue;
sj_status sj_cpu_matmul_epi(const sj_tensor *a, const sj_tensor *b, const struct sj_cpu_packed *pb,
                            const sj_tensor *bias, const sj_tensor *y, struct sj_threads *pool,
                            const struct sj_cpu_epilogue *epi, int *fused);
/* Products that ran an epilogue inside them so far in this process (tests). */
uint64_t sj_cpu_fused_epilogues(void);
/* n contiguous elements of a float dtype to and from f32, as the products
 * and attention convert their f16/bf16 rows (F16C for f16, AVX2 for bf16
 * where the CPU has them): the same bits as sj_f16_to_f32 / sj_f32_to_f16
 * and the bf16 ones, but that a signalling f16 NaN is widened quiet
 * (tests). */
void sj_cpu_load_row(float *dst, const void *src, sj_dtype dt, int64_t n);
void sj_cpu_store_row(void *dst, sj_dtype dt, const float *src, int64_t n);

/* Attention, see sj_attention() in shapejit.h. q [B,H,Sq,D], k [B,H,Sk,D],
 * v [B,H,Sk,Dv], lengths NULL or i32/i64 [B], y [B,H,Sq,Dv]. Lengths are
 * clamped to [0, Sk]. pool as for sj_cpu_matmul: (batch, head) pairs are
 * shared over it. */
sj_status sj_cpu_attention(const sj_tensor *q, const sj_tensor *k, const sj_tensor *v,
                           const sj_tensor *lengths, double scale, int causal, const sj_tensor *y,
                           struct sj_threads *pool);
/* The same with an additive mask: NULL, or f32 / q's dtype / bool of the
 * scores' shape [B, H, Sq, Sk] (stride 0 on broadcast axes), added to the
 * scaled scores (bool: false masks the key out). */
sj_status sj_cpu_attention_mask(const sj_tensor *q, const sj_tensor *k, const sj_tensor *v,
                                const sj_tensor *lengths, const sj_tensor *mask, double scale, int causal,
                                const sj_tensor *y, struct sj_threads *pool);

/* Attention over packed sequences, see sj_attention_varlen() in
 * shapejit.h (kernels/cpu/attention_varlen.c). q, k [T,H,D], v [T,H,Dv],
 * offsets i32 [B+1] on the host, y [T,H,Dv]. Offsets that do not start
 * at 0, decrease, or end other than at T return SJ_EINDEX naming the entry
 * (nothing is written then). (sequence, head) pairs are shared over pool. */
sj_status sj_cpu_attention_varlen(const sj_tensor *q, const sj_tensor *k, const sj_tensor *v,
                                  const sj_tensor *offsets, double scale, int causal, const sj_tensor *y,
                                  struct sj_threads *pool);

/* Concatenate n tensors along axis into y. */
sj_status sj_cpu_concat(const sj_tensor *xs, int n, int axis, const sj_tensor *y);

/* Embedding gather: y[i..., j...] = table[idx[i...], j...]. idx is i32/i64.
 * An index outside [0, V) returns SJ_EINDEX naming the index and position. */
sj_status sj_cpu_gather(const sj_tensor *table, const sj_tensor *idx, const sj_tensor *y);

/* y[i] = i for a rank-1 y (any stride, any dtype but bool): integers
 * exact, floats through f32 as sj_cpu_copy converts an i64. */
sj_status sj_cpu_arange(const sj_tensor *y);

/* Set OpenBLAS's own thread count (process-wide). */
void sj_cpu_blas_threads(int n);

/* Matrix products and attentions split over a pool so far (for tests). */
uint64_t sj_cpu_split_count(void);

/* Per-thread scratch memory: slot 0..SJ_CPU_SCRATCH_SLOTS-1, at least `bytes`
 * bytes, 64-byte aligned, kept and reused by the thread (grown on demand,
 * freed at thread exit). NULL if allocation fails. */
#define SJ_CPU_SCRATCH_SLOTS 4
void *sj_cpu_scratch(int slot, size_t bytes);

#endif /* SJ_CPU_EAGER_H */
