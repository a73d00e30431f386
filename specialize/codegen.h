/* Code generation: C (CPU) source for the generated groups of a fused plan.
 *
 * Every POINTWISE and ROW group becomes one function
 *
 *   void <prefix><group name>(void *const *p, const int64_t *s,
 *                             int64_t begin, int64_t end);
 *
 *   p      base pointers of the group's stores, in access order: loads first
 *          (plan group->loads), then stores (group->stores); a store's base
 *          is the start of its buffer (the access offset is added inside);
 *   s      the symbol values (one per symbol of the graph's pool);
 *   [begin, end)  the work items to do: POINTWISE, elements of the
 *          iteration space in row-major order (group->numel in all); ROW,
 *          rows (group->rows in all).
 *
 * Disjoint ranges may run concurrently on different threads.
 *
 * Two forms: specialized (sym_vals given: every size, stride and offset a
 * literal) and symbolic (sym_vals NULL: sizes computed from s[] by the
 * expressions' C forms). Numerics follow the eager kernels exactly where
 * the order of operations allows: the same f32 math functions (from
 * base/sj_kernel_rt.h, embedded in every unit), f16/bf16 computed in f32,
 * integers in int64, reductions accumulated in double.
 */
#ifndef SJ_CODEGEN_H
#define SJ_CODEGEN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "specialize/fusion.h"

/* The text of base/sj_kernel_rt.h, embedded at build time. */
extern const char sj_kernel_rt_text[];

/* What a generator is told besides the plan. */
typedef struct sj_codegen_opts {
    const char *prefix; /* before every function's name; NULL: none */
    /* C only: a kernel whose accesses move more than this many bytes in all
     * (the sum over its loads and stores that are not broadcast) writes its
     * f32 outputs with unit inner stride through non-temporal stores
     * (sj_rt_stream_f32), decided per call from the sizes; 0: a
     * quarter of this machine's last-level cache; negative: never. */
    int64_t stream_min_bytes;
    /* Out (may be NULL): per plan group, how many functions the generator
     * emitted for it. 1: one function, <prefix><group name>. k in
     * 2 .. SJ_CG_FALLBACK: one per launch shape the backend chooses
     * between per call (sj_launch.variant for CUDA), named
     * <prefix><group name>_v0 .. _v<k-1>. NODE groups are left alone. */
    int *variants;
    /* CUDA only: a row group of one kernel (its row length a literal) that
     * has a vector path gets its element-by-element path, which only calls
     * on unaligned views take, as a kernel of its own,
     * <prefix><group name>_fb: no program then holds both (each compiles in
     * less time; codegen_cuda.h). The main kernel does nothing for a call
     * that sj_cuda_vec_ok refuses: whoever launches must run _fb for it.
     * fallbacks (out, may be NULL): per plan group, 1 when it has one, else
     * 0. */
    bool fallback_kernels;
    int *fallbacks;
    /* Tests only (validated swap): added to every float value a generated
     * kernel stores, so its results are wrong; 0: none. */
    float test_skew;
} sj_codegen_opts;

/* The functions of one group in a compiled unit's table (sj_compiled's
 * fns: SJ_CG_VARIANTS_MAX a group): its launch variants (at most
 * SJ_CG_FALLBACK of them), then in slot SJ_CG_FALLBACK its fallback kernel
 * (sj_codegen_opts.fallback_kernels), NULL where it has none. */
#define SJ_CG_VARIANTS_MAX 5
#define SJ_CG_FALLBACK (SJ_CG_VARIANTS_MAX - 1)

/* A malloc'd, NUL-terminated C translation unit (the runtime header's text,
 * then the functions), or NULL on allocation failure. *len (if not NULL)
 * receives its length. o may be NULL (no prefix, default streaming). */
char *sj_codegen_c(const sj_graph *g, const sj_fplan *p, const int64_t *sym_vals, const sj_codegen_opts *o,
                   size_t *len);

/* A code generator (sj_codegen_c, sj_codegen_cuda): what the compiler emits for
 * its backend. */
typedef char *(*sj_codegen_fn)(const sj_graph *g, const sj_fplan *p, const int64_t *sym_vals,
                               const sj_codegen_opts *o, size_t *len);

#endif
