/* Code generation for CUDA: the generated groups of a fused plan as CUDA C
 * for NVRTC, and the launch configuration of each group.
 *
 * Every POINTWISE and ROW group becomes (a symbolic ROW group whose row
 * length is unknown: four of them, <prefix><group name>_v0 .. _v3, one
 * per row thread count and length class, sj_launch.variant saying which
 * to launch; with sj_codegen_opts.fallback_kernels, a ROW group of one
 * kernel with a vector path: two, <prefix><group name> for the calls
 * sj_cuda_vec_ok accepts and <prefix><group name>_fb, element by element,
 * for the others)
 *
 *   extern "C" __global__ void <prefix><group name>(
 *       <T> *__restrict__ p0, ..., <T> *__restrict__ pN,   // accesses: loads, then stores
 *       long long s0, ..., long long sM);                  // every symbol of the pool
 *
 * with <T> the access's element type (float, __half as unsigned short,
 * ...; loads const). The host passes each base pointer (the start of the
 * store's buffer; access offsets are added inside) and each symbol value,
 * and launches it with the dimensions sj_cuda_launch() gives for the call's
 * sizes. Kernels accept any block and grid the launch rule can produce:
 *   POINTWISE  block (256); grid.x covers the last (collapsed) axis in
 *              chunks of 2048 elements (8 per thread: two 16-byte accesses
 *              1024 elements apart when every access is contiguous there
 *              and aligned, else element by element); grid.y covers the rows, looping
 *              past 64 blocks per multiprocessor in all (or 65535). No
 *              64-bit division per element.
 *   ROW        block (32, R): R rows per block, a warp per row, when the row
 *              is at most 1024 long; else block (T) with T a power of two in
 *              [128, 512], a block per row; grid.x covers the rows, looping
 *              past 64 blocks per multiprocessor in all. Warp shuffles and
 *              32 floats of shared memory for the block-wide reductions.
 * Numerics follow the CPU's definitions (the same sj_rt functions, compiled
 * for the device, where exp, erf and tanh are the CUDA math library's:
 * base/sj_kernel_rt.h): exact erf, IEEE sqrt, reductions in f32 (tree
 * order), which the tests compare with the eager kernels and float64.
 * Specialized (sym_vals given: sizes are literals) and symbolic forms.
 *
 * A NODE group marked as a generated product (sj_group.gemm_tile >= 0,
 * specialize/fusion.h) becomes specialize/codegen_gemm_cuda.h's kernel
 * for each of its tiles (gemm_tiles), <prefix><group name>_v0 .. (or
 * <prefix><group name> for one), with the epilogue the plan put inside;
 * every other NODE group has no function.
 */
#ifndef SJ_CODEGEN_CUDA_H
#define SJ_CODEGEN_CUDA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "jit/shapejit.h"
#include "specialize/codegen.h"
#include "specialize/fusion.h"

/* A malloc'd CUDA C translation unit, or NULL on allocation failure (o: as
 * for sj_codegen_c; only its prefix applies). */
char *sj_codegen_cuda(const sj_graph *g, const sj_fplan *p, const int64_t *sym_vals, const sj_codegen_opts *o,
                      size_t *len);

/* Every kernel of a unit starts with this line; what comes before the
 * first is the prelude (types, the runtime header, device helpers), which
 * is all a kernel uses besides itself: the prelude with any subset of the
 * kernels is a unit of its own (sj_codegen_cuda_split). */
#define SJ_CUDA_KERNEL_MARK "\n/* -- kernel -- */\n"

/* Defined (-D) in a quick compile of a unit (the CUDA backend's
 * sj_compile_req.quick): each generated product's kernel is then a stub
 * that traps, for a quick unit's products run as the device's (jit/compile.c
 * leaves their function slots empty), and their tile loops are most of a
 * unit's compile time (w4: 420-450 ms against 120-170 without them on an
 * H100 host). The source is the same, so the full compile's lookup by the
 * source's key still finds a cached full unit. */
#define SJ_CUDA_QUICK_MACRO "SJ_QUICK_UNIT"

/* The most programs sj_codegen_cuda_split makes of one unit. */
#define SJ_CUDA_PIECES_MAX 16

/* Split src (a unit of sj_codegen_cuda's) into at most max_pieces units
 * of its own that together hold every kernel once: the prelude, then the
 * kernels of the piece in the unit's order, the longest kernels spread
 * first, each to the piece with the least source so far (the pieces'
 * compile times even out). One piece (a copy of src) when it has at most
 * one kernel or max_pieces <= 1; never more than SJ_CUDA_PIECES_MAX or the
 * kernels. Writes malloc'd strings to pieces[0 .. n) and returns n; -1 on
 * allocation failure (nothing left allocated); 0 when max_pieces < 1. */
int sj_codegen_cuda_split(const char *src, int max_pieces, char **pieces);

typedef struct sj_launch {
    unsigned grid[3], block[3];
    unsigned smem; /* dynamic shared memory bytes */
    /* Which of the group's functions to launch where the generator emitted
     * several (sj_codegen_opts.variants; < SJ_CG_VARIANTS_MAX): a symbolic
     * ROW kernel has _v0 for rows up to 512, _v1 up to 1024 (block.x 32
     * both), _v2 up to 2048 (256), _v3 longer (512). 0 for a POINTWISE
     * group. */
    int variant;
} sj_launch;

/* The launch of generated group gr for a call whose expressions evaluate to
 * exv (sj_ex_eval_all of the graph's pool). sm_count may guide grid sizes.
 * Returns 0 when there is nothing to do (an empty iteration space). */
int sj_cuda_launch(const sj_group *gr, const int64_t *exv, int sm_count, sj_launch *out);

/* Would group gr's kernel take its vector path for a call whose
 * expressions evaluate to exv and whose accesses' base pointers are ptrs
 * (loads, then stores: the kernel's pointer arguments)? The kernel's own
 * flag, computed on the host: the row length a multiple of 4, every access
 * contiguous along the row (or broadcast), the contiguous ones aligned at
 * every row (base plus offset to 16 bytes, 8 for halves, 4 for bools; the
 * other axes' strides multiples of 4). A row group generated with
 * sj_codegen_opts.fallback_kernels into <name> and <name>_fb is launched as
 * <name> when it is true, else as <name>_fb (same dimensions: sj_cuda_launch
 * with variant 0). g: the plan's graph (the accesses' dtypes). */
bool sj_cuda_vec_ok(const sj_graph *g, const sj_group *gr, const int64_t *exv, void *const *ptrs);

/* The generator's spec (specialize/codegen_gemm_cuda.h) of a plan's
 * generated product G (gemm_tile >= 0; specialize/fusion.h): N, K, the
 * bias and the epilogue the plan put inside, M symbolic (the kernel's
 * argument), the tile gemm_tile's. */
struct sj_gemm_spec;
void sj_codegen_gemm_spec(const sj_graph *g, const sj_group *G, struct sj_gemm_spec *sp);

#endif
