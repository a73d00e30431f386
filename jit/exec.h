/* Executing a graph: eager (one kernel per node) or fused (a plan's
 * groups), on whichever device the runtime runs.
 *
 * The executors are device-neutral: what touches memory or runs a kernel
 * goes through the device table's call slots (kernels/device.h: the CPU's
 * in kernels/cpu/device_cpu.c, CUDA's in kernels/cuda/exec_cuda.c).
 */
#ifndef SJ_EXEC_H
#define SJ_EXEC_H

#include <stdatomic.h>
#include <stdbool.h>

#include "jit/ir/graph.h"
#include "jit/pool.h"
#include "kernels/device.h"

struct sj_fplan;
struct sj_group;

typedef struct sj_exec {
    const sj_runtime *rt;
    const sj_graph *g;
    const char *fn_name;
    const sj_tensor *inputs;    /* g->n_inputs caller descriptors */
    sj_tensor *outputs;         /* g->n_outputs caller descriptors */
    const int64_t *sym_vals;    /* one per symbol of g->ex; may be NULL if none */
    sj_pool *pool;              /* host blocks: expression values, descriptors (and CPU buffers) */
    _Atomic size_t *arena_hint; /* bytes the last call needed (per entry) */
    const sj_backend *ops;      /* the device's table */
    void *ops_ctx;              /* the call's context (its call_begin's) */
    /* Fused: per plan group and size class, the variant of a generated
     * product to launch (sj_compiled.gemm_pick), -1 for the device's
     * product; NULL: the first. */
    const int8_t *gemm_pick;
    /* Fused: the symbol values the arena is laid out for (its size and its
     * stores' offsets; NULL: sym_vals). A graph that serves a whole bucket
     * (jit/graphs.c) is captured and updated with its bucket's largest
     * sizes here, so every size of the bucket finds its intermediates
     * where the graph's library products read and write them. */
    const int64_t *layout_syms;
} sj_exec;

struct sj_cpu_pack_cache;
/* Give every float matrix product of g whose right operand is a constant
 * (a parameter, or a permute, slice or reshape of one with constant
 * sizes) its packed copy from cache (kernels/cpu/prepack.h), in
 * g->packed; both executors' CPU products then run over it. For an entry
 * not yet published (its graph is read by no other thread), with the
 * function's trace lock held. The choice is made here: a weight already
 * in cache is shared; a new one is packed only while the cache's copies
 * stay within max_bytes (prepack_max_bytes). Returns the products given
 * one; nothing is packed when memory or the bound runs out (those
 * products run unpacked). */
int sj_exec_prepack(sj_graph *g, struct sj_cpu_pack_cache *cache, uint64_t max_bytes);

/* Run a fused plan of g: generated groups through their compiled functions
 * (fns: SJ_CG_VARIANTS_MAX per group, as sj_compiled's; NULL for NODE groups), NODE groups through the
 * device's eager kernels, a generated product (specialize/fusion.h) through
 * the device's gemm slot where it has one and fns holds its kernel. Caller outputs must be contiguous
 * (sj_exec_fused_ok tells); output checks and allocation as
 * sj_exec_eager. */
sj_status sj_exec_fused(const sj_exec *x, const struct sj_fplan *plan, void *const *fns);

/* The variant each generated product of a compiled unit launches
 * (pick[gi * SJ_GEMM_CLASSES + class] for plan group gi and each size
 * class of its rows, specialize/codegen_gemm_cuda.h; -1 for every other
 * group), chosen once
 * the unit is loaded (on the compile worker): mode is cfg.cuda_gemm; 1,
 * the device's gemm_tune (each variant timed against its own product; the
 * choice kept in the kernel cache under key), -1 (its product) where the
 * device has none or cannot time; 2 + v, variant v (the last where the
 * product has fewer) without timing. fns as sj_exec_fused's, syms the
 * specialization's sizes (NULL: the entry's). Returns whether the
 * device timed anything (false: nothing to time, or the choice came from
 * the kernel cache). */
bool sj_exec_gemm_picks(struct sj_backend *b, const sj_graph *g, const struct sj_fplan *plan, const int64_t *syms,
                        void *const *fns, const char *key, int mode, int8_t *pick);

/* Can this call's outputs be written by a fused plan (caller outputs absent
 * or contiguous)? */
bool sj_exec_fused_ok(const sj_exec *x);

/* Run g eagerly. Checks caller outputs (dtype, rank, shape, device) before
 * running anything; allocates outputs whose data is NULL. On error, outputs
 * it allocated are freed and their data reset to NULL. */
sj_status sj_exec_eager(const sj_exec *x);

/* -- Shared by the executors ------------------------------------------- */

/* Name the function and node n in the current error message: "fn 'f': op: "
 * before it, without the op when the kernel's message starts with it
 * ("gather: index ..."). Returns st. */
sj_status sj_exec_node_error(const sj_exec *x, const sj_node *n, sj_status st);
/* Check that every value g computes is a tensor that can exist for these
 * symbol values (sizes >= 0, at most 2^48 elements counting a size of 0 as
 * 1): a broadcast, matrix product or concatenation of valid inputs can
 * pass that limit, and size arithmetic past it would wrap. Scratch comes
 * from pool. SJ_ESHAPE names the op, the shape and the axis. */
sj_status sj_exec_check_sizes(const sj_graph *g, const int64_t *sym_vals, sj_pool *pool, const char *fn_name);
/* Check caller outputs against the shapes in exv (all expressions of g). */
sj_status sj_exec_check_outputs(const sj_exec *x, const int64_t *exv);
/* Allocate the outputs whose data is NULL; allocated[i] set for each. */
sj_status sj_exec_alloc_outputs(const sj_exec *x, const int64_t *exv, unsigned char *allocated);
/* Free what sj_exec_alloc_outputs allocated (on an error). */
void sj_exec_release_outputs(const sj_exec *x, const unsigned char *allocated);
/* Run one non-view node (or a copying reshape) with a device's kernels:
 * operands broadcast to the result, reductions given their kept axis,
 * matrix batch axes expanded. rv holds the operands' descriptors. bias
 * (a matmul only; else NULL): a plan's bias (sj_group.bias), sizes 1
 * before its last, added along y's last axis. */
sj_status sj_exec_node_on(const sj_kernels *k, void *c, const sj_graph *g, const sj_node *n, const sj_tensor *rv,
                          const sj_tensor *bias, const sj_tensor *y);
/* The same for a product that has an epilogue group (sj_group.epilogue):
 * with k's matmul_epi the group runs inside the product (*fused true);
 * otherwise, or for any other node, as sj_exec_node_on (*fused false: the
 * caller runs the group). */
sj_status sj_exec_node_epi_on(const sj_kernels *k, void *c, const sj_graph *g, const sj_node *n, const sj_tensor *rv,
                              const sj_tensor *bias, const sj_tensor *y, const sj_dev_epilogue *epi, bool *fused);
/* The CPU's: sj_exec_node_on(&sj_cpu_exec_ops.k, NULL, ...). */
sj_status sj_exec_node(const sj_graph *g, const sj_node *n, const sj_tensor *rv, const sj_tensor *bias,
                       const sj_tensor *y);

#endif
