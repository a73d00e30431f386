/* Eager CUDA kernels: one kernel per op for every dtype, built ahead of time
 * with nvcc (kernels/cuda/eager.cu, sm_90 machine code plus PTX) into a
 * fatbin that the build embeds in the library; sj_cuda_eager_load loads it
 * with cuModuleLoadData, so the first request never waits on a compile.
 *
 * The same contract as the CPU eager kernels (kernels/cpu/eager.h): operands
 * are sj_tensor descriptors, here over device memory (data is a CUdeviceptr
 * cast to void *), element strides >= 0 (0 on broadcast axes), any layout;
 * elementwise operands arrive broadcast to y's shape; f16/bf16 computed in
 * f32, integers exactly in int64; reductions accumulate in f32 with
 * pairwise/tree order (within the tolerance the tests use against the CPU
 * and float64). Kernels are queued on e->stream and return without
 * synchronizing; errors are launch errors (SJ_EBACKEND) and allocation
 * failures (SJ_ENOMEM).
 *
 * gather with an index outside [0, V): the kernel clamps nothing and writes
 * nothing for that element; it sets e->error_flag (a device int the caller
 * allocated and zeroed), which the executor reads after the call to return
 * SJ_EINDEX. attention_varlen checks its offsets on the device the same
 * way (bits SJ_EK_VARLEN_BAD_* of eager_abi.cuh; sj_cuda_flag_status
 * turns a flag into the call's error).
 */
#ifndef SJ_EAGER_CUDA_H
#define SJ_EAGER_CUDA_H

#include "base/ops.h"
#include "kernels/cuda/cuda_dev.h"

/* A CUDA graph that serves a whole bucket, while its call is recorded or
 * its kernels' sizes are updated for a replay (graph_cuda.c); NULL in
 * every other call. */
typedef struct sj_cuda_rec sj_cuda_rec;

typedef struct sj_cuda_exec {
    sj_cuda *cuda;
    CUstream stream;
    CUdeviceptr error_flag; /* device int, 0 on entry; set to 1 by gather on a bad index, or'ed with
                               SJ_EK_VARLEN_BAD_* by attention_varlen on bad offsets */
    /* cuBLASLt's workspace for every product of this call (a CUDA graph's
     * own, ws_bytes of it); 0: each product takes what its algorithm needs
     * from the allocator. */
    CUdeviceptr ws;
    size_t ws_bytes;
    sj_cuda_rec *rec; /* recording or updating a bucket graph (graph_cuda.c), else NULL */
} sj_cuda_exec;

/* Every kernel launch of a call goes through here: on e's stream; while a
 * bucket graph is recorded, also noting the kernel's node; while one is
 * updated, setting the next noted node's function, grid, block, shared
 * memory and arguments instead of launching (CUDA_ERROR_INVALID_VALUE
 * where the call has more kernels than the graph). graph_cuda.c. */
CUresult sj_cuda_launch_kernel(const sj_cuda_exec *e, CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                               unsigned bx, unsigned by, unsigned bz, unsigned smem, void **args);
/* Stream work other than a kernel of ours (a cuBLASLt product, a copy, a
 * memset), v[0..n) every value that decides what it does (pointers,
 * sizes, layouts). Without a recorder: false (run it). Recording: noted,
 * false (run it: it is captured). Updating: compared with the work noted
 * at this point, which must be the same but for v[shrink] (-1: none),
 * which may be smaller (a product over fewer rows of the same buffers,
 * which the graph's larger one covers); true (do not run it); a
 * difference spoils the update (the call then runs kernel by kernel). */
enum { SJ_REC_LT = 1, SJ_REC_COPY, SJ_REC_SET };
/* Where an op's pointers sit in its values (graph_cuda.c's find_direct
 * looks for them): a product's A, B, D and bias at SJ_REC_LT_PTRS..+3
 * (then its workspace), its rows at SJ_REC_LT_ROWS; a copy's dst, src at
 * 0, 1 (its bytes at 2); a memset's pointer at 0. */
enum { SJ_REC_LT_ROWS = 4, SJ_REC_LT_PTRS = 13, SJ_REC_LT_VALS = 18 };
bool sj_cuda_rec_op(const sj_cuda_exec *e, int kind, const int64_t *v, int n, int shrink);

/* The embedded fatbin (generated at build time from eager.cu). */
extern const unsigned char sj_eager_cuda_fatbin[];
extern const unsigned long sj_eager_cuda_fatbin_len;

/* Load the module and resolve its kernels into c->eager / c->eager_fns. */
sj_status sj_cuda_eager_load(sj_cuda *c);
void sj_cuda_eager_unload(sj_cuda *c);

sj_status sj_cuda_unary(const sj_cuda_exec *e, sj_op op, const sj_tensor *x, const sj_tensor *y);
sj_status sj_cuda_binary(const sj_cuda_exec *e, sj_op op, const sj_tensor *a, const sj_tensor *b,
                         const sj_tensor *y);
sj_status sj_cuda_where(const sj_cuda_exec *e, const sj_tensor *c, const sj_tensor *a, const sj_tensor *b,
                        const sj_tensor *y);
sj_status sj_cuda_copy(const sj_cuda_exec *e, const sj_tensor *x, const sj_tensor *y);
/* bytes (> 0) from src to dst by a kernel of ours (the strided copy over
 * 8-, 4-, 2- or 1-byte elements, as the pointers and the count allow),
 * never a cuMemcpy: a bucket graph's input copy, a kernel node its replays
 * update (sj_cuda_launch_kernel). */
sj_status sj_cuda_copy_by_kernel(const sj_cuda_exec *e, CUdeviceptr dst, CUdeviceptr src, size_t bytes);
sj_status sj_cuda_reduce(const sj_cuda_exec *e, sj_op op, const sj_tensor *x, int axis, const sj_tensor *y);
sj_status sj_cuda_softmax(const sj_cuda_exec *e, const sj_tensor *x, int axis, const sj_tensor *y);
sj_status sj_cuda_layer_norm(const sj_cuda_exec *e, const sj_tensor *x, const sj_tensor *g, const sj_tensor *b,
                             double eps, const sj_tensor *y);
sj_status sj_cuda_rms_norm(const sj_cuda_exec *e, const sj_tensor *x, const sj_tensor *g, double eps,
                           const sj_tensor *y);
/* Float dtypes through cuBLASLt (f32, f16, bf16 with f32 accumulation;
 * strided batches; operands not in a layout cuBLASLt takes are copied into
 * the allocator first); integers through a plain kernel. */
sj_status sj_cuda_matmul(const sj_cuda_exec *e, const sj_tensor *a, const sj_tensor *b, const sj_tensor *y);
/* The same with bias (float dtypes; NULL: none), a rank-1 tensor of y's
 * dtype and last size, added to every row: y = a @ b + bias. cuBLASLt adds
 * it as it writes (its bias epilogue) when the result is row-major and the
 * bias contiguous; otherwise a binary kernel adds it after the product. */
sj_status sj_cuda_matmul_bias(const sj_cuda_exec *e, const sj_tensor *a, const sj_tensor *b, const sj_tensor *bias,
                              const sj_tensor *y);
/* cuBLASLt algorithm choices made so far on the device (heuristic queries,
 * each for a product's size class, and their checks) and the host time
 * they took, for benchmarks. */
void sj_cuda_matmul_choices(const sj_cuda *c, uint64_t *n, double *ms);
/* Tests: the next n products that run with an algorithm chosen for their
 * size class get NOT_SUPPORTED instead of running, as from cuBLASLt for
 * sizes that algorithm cannot take, so that the retry with the exact
 * sizes' own algorithm runs. Returns how many were still to be refused. */
int sj_cuda_test_reject_class(int n);
/* Warming of size classes in the background (eager_cuda.c; on by
 * default): switch it, and wait until the jobs queued so far are done
 * (tests, benchmarks). */
void sj_cuda_matmul_warming(sj_cuda *c, int on);
void sj_cuda_matmul_warm_wait(sj_cuda *c);
/* Where warming jobs go: the runtime's background job queue (the device
 * table's set_post, kernels/device.h), or (post NULL) the warmer's own
 * thread, as for a device used without a runtime. Set while no product
 * runs; a job post refuses runs on the thread instead. */
void sj_cuda_matmul_warm_post(sj_cuda *c, bool (*post)(void *ctx, void (*run)(void *arg), void (*drop)(void *arg), void *arg),
                              void *ctx);
/* Attention: f16 and bf16 on tensor cores, 64 queries a block. With D =
 * Dv = 32, 64, 96 or 128 (and fewer than 2^30 keys), scores, softmax and
 * output in registers, with one or two key groups a block
 * (sj_cuda_attention_groups: which, or 0 for any other call); else with
 * head sizes D, Dv multiples of 16 up to 128, through shared memory with
 * one or two key tiles (sj_cuda_attention_tiles: which, or 0). Any other
 * call runs one query a block in f32. */
sj_status sj_cuda_attention(const sj_cuda_exec *e, const sj_tensor *q, const sj_tensor *k, const sj_tensor *v,
                            const sj_tensor *lengths, double scale, int causal, const sj_tensor *y);
/* The same with an additive mask (NULL: none) of the scores' shape
 * [B, H, Sq, Sk] (stride 0 on broadcast axes): f32 / f16 / bf16 added to
 * the scaled scores, or bool (false masks the key); a query whose every
 * key is masked gives zeros. The kernel is chosen as without a mask: the
 * register kernels (attention_mmam<D>, the mask read per tile) or the
 * shared-memory tensor-core ones where they apply, else one query a block
 * in f32. */
sj_status sj_cuda_attention_mask(const sj_cuda_exec *e, const sj_tensor *q, const sj_tensor *k, const sj_tensor *v,
                                 const sj_tensor *lengths, const sj_tensor *mask, double scale, int causal,
                                 const sj_tensor *y);
/* Attention over packed sequences (sj_attention_varlen): q, k [T,H,D],
 * v [T,H,Dv], offsets i32 [B+1] on the device, y [T,H,Dv]. A check kernel
 * ors SJ_EK_VARLEN_BAD_* into e->error_flag on bad offsets (read after the
 * call; the outputs are then unspecified, no read leaves [0, T)), then
 * f16/bf16 with D = Dv = 32, 64, 96 or 128 on tensor cores (the register
 * kernels over tiles of up to 64 queries of one sequence;
 * sj_cuda_attention_varlen_groups: key groups, or 0), any other call one
 * block per (token, head) with an online softmax, in f32. */
sj_status sj_cuda_attention_varlen(const sj_cuda_exec *e, const sj_tensor *q, const sj_tensor *k, const sj_tensor *v,
                                   const sj_tensor *offsets, double scale, int causal, const sj_tensor *y);
/* The status of a call whose error flag reads flag (0: SJ_OK), with a
 * message naming what was wrong. */
sj_status sj_cuda_flag_status(int flag);
int sj_cuda_attention_tiles(const sj_cuda *c, sj_dtype dt, int64_t B, int64_t H, int64_t Sq, int64_t D, int64_t Dv);
int sj_cuda_attention_groups(const sj_cuda *c, sj_dtype dt, int64_t B, int64_t H, int64_t Sq, int64_t Sk, int64_t D,
                             int64_t Dv);
int sj_cuda_attention_varlen_groups(const sj_cuda *c, sj_dtype dt, int64_t T, int64_t B, int64_t H, int64_t D,
                                    int64_t Dv);
/* How many calls in this process launched a tensor-core attention kernel
 * with a mask, and over packed sequences (tests check the path taken). */
void sj_cuda_attention_tc_calls(uint64_t *masked, uint64_t *varlen);
sj_status sj_cuda_concat(const sj_cuda_exec *e, const sj_tensor *xs, int n, int axis, const sj_tensor *y);
sj_status sj_cuda_gather(const sj_cuda_exec *e, const sj_tensor *table, const sj_tensor *idx, const sj_tensor *y);
/* y[i] = i for a rank-1 y of any stride and any dtype but bool (floats
 * through f32, as kernels/cpu's sj_cpu_arange). */
sj_status sj_cuda_arange(const sj_cuda_exec *e, const sj_tensor *y);

#endif /* SJ_EAGER_CUDA_H */
