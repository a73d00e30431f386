/* Generated tensor-core matrix products for CUDA: C = epilogue(A @ B) as
 * CUDA C for NVRTC (issue 29).
 *
 *   A  [M, K] f16, row-major (row stride K), 16-byte aligned
 *   B  [K, N] f16, row-major (row stride N): a weight as the graph holds
 *      it (y = x @ W), 16-byte aligned
 *   C  [M, N] f16 or f32, row-major
 * N and K are constants of the unit; M is a constant too (specialized) or
 * the kernel's last argument (symbolic: one unit for every M).
 *
 * The epilogue, in f32 on the accumulators in registers before the one
 * store: v = acc (+ bias[n]) (then exact GELU, 0.5 v (1 + erf(v / sqrt 2)),
 * or ReLU, v > 0 ? v : 0)
 * (+ R[m, n]), cast to C's dtype (round to nearest). bias [N] and R [M, N]
 * (row-major) are f16 or f32 each. This is the fusion plan's epilogue of a
 * product: its bias, a GELU, the residual add of a transformer layer, the
 * cast.
 *
 * The kernel (sm_80 and later, sm_90 included):
 *
 *   extern "C" __global__ void <name>(const unsigned short *A,
 *       const unsigned short *B, const void *bias, const void *R, void *C,
 *       long long M);
 *
 * bias and R are ignored (may be NULL) when the spec has none; M is
 * ignored when the spec fixes it. Each block computes a BM x BN tile of C
 * with WM x WN warps (a warp TM = BM/WM rows by TN = BN/WN columns, in
 * mma.sync.m16n8k16 tiles, f16 inputs, f32 accumulation), stepping over K
 * by BK through STAGES shared-memory buffers filled with cp.async (16
 * bytes a copy; rows past M zero-filled), fragments loaded with ldmatrix
 * (B through its .trans form, as B is k-major). Launch with
 * sj_gemm_cuda_dims: grid (N / BN, ceil(M / BM)), WM * WN * 32 threads,
 * the dynamic shared memory it says (over 48 KiB needs
 * CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES set on the function
 * first). M = 0 needs no launch.
 *
 * Split-K (tile.splitk SK of 2, 4 or 8; sm_90 and later: thread block
 * clusters): the grid's z is SK and the kernel is compiled with cluster
 * dims (1, 1, SK), so the SK blocks of one C tile form a cluster, each
 * multiplying one SK-th of K. Each leaves its f32 partial tile in its own
 * shared memory; after a cluster barrier, block z sums the SK partials of
 * its SK-th of the tile's elements (read from the peers' shared memory,
 * distributed shared memory, in rank order: the sum is deterministic),
 * runs the epilogue on them and stores; a second barrier keeps every
 * block's partial alive until its peers have read it. No global workspace,
 * no second kernel: short products (a few rows, long K) fill the device
 * with SK times the blocks.
 *
 * Warpgroup products (tile.wg; sm_90a, Hopper only): WM warpgroups (128
 * threads each) and one producer warp a block (WM x 128 + 32 threads);
 * each warpgroup computes 64 rows x BN with
 * wgmma.mma_async.m64nBNk16 from shared memory, A and B read through
 * matrix descriptors in the 128-byte swizzled layout (A K-major, B [K, N]
 * N-major: the instruction's transposed B), 64 of K a stage (one
 * 128-byte row), the stages filled by the TMA (the producer warp queues
 * them; two mbarriers a stage: its bytes landed, every consumer warp done
 * reading it; no block barrier in the loop), each stage 1024-byte
 * aligned. Such a kernel takes two more parameters after M, the
 * tensor maps of A and B (sj_cuda_gemm_launch in kernels/cuda/exec_cuda.h
 * encodes them): `const __grid_constant__ sj_tmap tmA, tmB` (a CUtensorMap
 * each). The accumulators of a warp are
 * the mma.sync tile's (16 rows, pairs of columns), so the epilogue and
 * split-K are the same code. BM = 64 WM (WM 1 or 2), BN a multiple of 64
 * up to 256, BK 64.
 *
 * LayerNorm inside (spec.ln; the plan's SJ_GEMM_LN): C, after the
 * epilogue, is also the input of a LayerNorm over each whole row (of N),
 * and the kernel writes its output Y [M, N] (f16 or f32) too:
 *   y = (c - mean - cm) * rstd * gamma[n] + beta[n], in f32, where mean
 *   is the row's f32 mean, cm the mean of c - mean, rstd = 1 / sqrt(max(
 *   var, 0) + eps) and var = mean((c - mean)^2) - cm^2 (the generated row
 *   kernel's corrected two-pass formula); gamma 1 and beta 0 when absent.
 * A row's N columns are spread over the grid's N tiles (and split-K
 * ranks), so the last block to finish a row block normalizes it: each
 * block, after its stores and a block barrier, increments the row block's
 * counter from one thread (cnt[blockIdx.y]: an acquire-release atomic inc
 * with wrap gridDim.x x gridDim.z - 1, so the last arrival leaves it 0
 * again; the release publishes the block's stores, the acquire the
 * others'), and the block that made it wrap reads
 * the row block back (from L2, past L1, 16 bytes a load: C 16-byte
 * aligned) and writes Y, several threads a row. The
 * counters must be 0 before the launch and no other launch may use them
 * meanwhile (the executor zeroes a region of the call's arena: ceil(M /
 * 16) counters, enough for any tile). The kernel takes four more
 * parameters, last: `const void *lg, const void *lb, void *Y, unsigned
 * *cnt` (lg, lb NULL when absent). N a multiple of 64, at most 4096 (2048
 * when C is f32).
 *
 * Constraints (sj_gemm_cuda_check): BM a multiple of 16 WM, BN of 16 WN,
 * BK of 16; N a multiple of BN, K of BK x SK; 2 <= STAGES <= 4 (3 .. 6 a
 * warpgroup tile, whose producer keeps every free buffer filled and whose
 * consumers keep one group of products in flight); at most 1024 threads and 227 KiB of shared memory;
 * SK 1, 2, 4 or 8.
 */
#ifndef SJ_CODEGEN_GEMM_CUDA_H
#define SJ_CODEGEN_GEMM_CUDA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "jit/shapejit.h"

/* A tile configuration: the autotuner's candidates. */
typedef struct sj_gemm_tile {
    int bm, bn, bk; /* block tile */
    int wm, wn;     /* warps along M and N */
    int stages;     /* shared-memory buffers in the K pipeline */
    int splitk;     /* 0 or 1: one block a tile; 2, 4, 8: a cluster of that many blocks splits K (sm_90) */
    int wg;         /* 1: Hopper's warpgroup products (wgmma, sm_90a): wm warpgroups of 64 rows, wn 1, bk 64 */
} sj_gemm_tile;

typedef struct sj_gemm_spec {
    int64_t M;         /* > 0: specialized to this M; 0: symbolic (the kernel's M argument) */
    int64_t N, K;      /* constants */
    bool bias;         /* add bias[n] (of bias_dtype) */
    bool gelu;         /* exact GELU after the bias */
    bool relu;         /* ReLU after the bias (not with gelu) */
    /* Round to f16 (and back to f32) after the bias, after the GELU or
     * ReLU, after the residual add: each where the graph holds that value
     * in f16, so that a result cast to f32 at the end is the value the
     * graph's f16 steps make, as an eager run computes it */
    bool round_prod, round_act, round_res;
    bool residual;     /* add R[m, n] (of res_dtype) after the GELU */
    sj_dtype bias_dtype, res_dtype; /* SJ_F16 or SJ_F32 */
    sj_dtype out_dtype;             /* C's: SJ_F16 or SJ_F32 */
    /* LayerNorm of C's rows inside (above): gamma and beta present (of
     * their dtypes, [N]), Y's dtype, eps */
    bool ln, ln_gamma, ln_beta;
    sj_dtype ln_g_dtype, ln_b_dtype, ln_out_dtype;
    double ln_eps;
    sj_gemm_tile tile;
} sj_gemm_spec;

/* Counters a LayerNorm product's launch needs zeroed at M rows (enough for
 * any tile: one a 16-row block). */
static inline int64_t sj_gemm_ln_counters(int64_t M) { return (M + 15) / 16; }

/* The launch of a unit for one M. */
typedef struct sj_gemm_dims {
    unsigned grid[3], block[3];
    size_t smem; /* dynamic shared memory, bytes */
} sj_gemm_dims;

/* Can the spec be generated? SJ_EINVAL naming the first constraint it
 * breaks. */
sj_status sj_gemm_cuda_check(const sj_gemm_spec *s);

/* The unit's source (malloc'd, NUL-terminated; *len its length when len is
 * not NULL), one kernel named `name`; the macros it defines are undone at
 * its end, so that several units can share one source. NULL with SJ_EINVAL set (the spec
 * fails sj_gemm_cuda_check) or SJ_ENOMEM. */
char *sj_codegen_gemm_cuda(const sj_gemm_spec *s, const char *name, size_t *len);

/* The launch for M rows (M >= 0; grid.y 0 when M is 0). */
void sj_gemm_cuda_dims(const sj_gemm_spec *s, int64_t M, sj_gemm_dims *d);

/* A few tile configurations worth trying on sm_80/sm_90 for f16 products
 * (the autotuner's candidates: one block a tile first, then split-K, then
 * warpgroup tiles); *n receives the count. Each still needs
 * sj_gemm_cuda_check against the product's N and K; a split-K tile a
 * device of compute capability 9.0 or later, a warpgroup tile code for
 * sm_90a. */
const sj_gemm_tile *sj_gemm_cuda_tiles(int *n);

/* The candidates worth compiling for an N x K product on a device of
 * compute capability arch (major x 10 + minor) with `units`
 * multiprocessors, M rows (0: unknown, every M): up to max indexes into
 * sj_gemm_cuda_tiles() written to out, their count returned (0: no tile
 * fits). Tiles are ranked by how close their grid at M comes to one or two
 * blocks a multiprocessor. On sm_90 (Hopper, whose units are compiled for
 * sm_90a): the best split-K tile at M (16 where unknown), the two best
 * warpgroup tiles at M (256 where unknown), then the first tile of one
 * block that fits; on later devices the two best split-K tiles, then tiles
 * of one block; before sm_90 only those. */
int sj_gemm_cuda_candidates(int64_t M, int64_t N, int64_t K, int arch, int units, int8_t *out, int max);

/* A product's size class by its rows: the autotuner picks a variant per
 * class, so that a symbolic entry runs each size with the tile that won
 * there (timed at SJ_GEMM_CLASS_ROWS: 16, 128 and 512 rows; the edges
 * about halfway between, on a log scale: a split-K tile that wins at 16
 * rows lost 1.3x in the layer at 64 with an edge at 64); an entry whose
 * rows are known has one pick in every class. */
#define SJ_GEMM_CLASSES 3
static inline int sj_gemm_class(int64_t M) { return M <= 48 ? 0 : M <= 256 ? 1 : 2; }
#define SJ_GEMM_CLASS_ROWS {16, 128, 512}

/* The autotuner's choice for a compiled unit, as the kernel cache keeps it
 * beside the unit's CUBIN: one line, "sjgp2 <groups> <pick> ...",
 * SJ_GEMM_CLASSES picks per plan group, class by class (pick[gi *
 * SJ_GEMM_CLASSES + class]; -1: the device's product; other groups -1).
 * Format writes it to buf (NUL-terminated; at most size bytes) and returns
 * its length, 0 when it does not fit. Parse reads it for plan p into pick
 * (a generated product's in [-1, gemm_nv), every other group's -1) and
 * says whether it was such a record; pick is left alone when not (a record
 * of one pick a group, "sjgp1", is not: its product is timed again). */
struct sj_fplan;
size_t sj_gemm_picks_format(const struct sj_fplan *p, const int8_t *pick, char *buf, size_t size);
bool sj_gemm_picks_parse(const struct sj_fplan *p, const void *data, size_t len, int8_t *pick);

#endif /* SJ_CODEGEN_GEMM_CUDA_H */
