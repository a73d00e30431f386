/* Executing a graph: eager (one kernel per node) or fused (a plan's
 * groups), on whichever device the runtime's backend runs.
 *
 * The executors are device-neutral: what touches memory or runs a kernel
 * goes through an sj_exec_ops table, one per device (the CPU table in
 * exec.c, the CUDA table in exec_cuda.c).
 */
#ifndef SJ_EXEC_H
#define SJ_EXEC_H

#include <stdatomic.h>
#include <stdbool.h>

#include "jit/ir/graph.h"
#include "jit/pool.h"

struct sj_fplan;
struct sj_group;

/* A generated group to run inside a matrix product as its epilogue
 * (sj_group.epilogue): as sj_exec_ops.launch's arguments. */
typedef struct sj_exec_epi {
    const struct sj_group *gr;
    void *const *fn;
    void *const *ptrs;
    const int64_t *syms;
    const int64_t *exv;
} sj_exec_epi;

/* A device's side of execution. ctx is the device's per-call context
 * (sj_exec.ops_ctx). */
typedef struct sj_exec_ops {
    sj_device device; /* where inputs, outputs and intermediates live */
    /* Run one non-view node (or a copying reshape) with the device's eager
     * kernel; rv holds the operands' descriptors (indexed by value id).
     * bias: NULL, or for a matmul a value added along y's last axis as it
     * is written (see sj_exec_node_on). */
    sj_status (*node)(void *ctx, const sj_graph *g, const sj_node *n, const sj_tensor *rv, const sj_tensor *bias,
                      const sj_tensor *y);
    /* y = x (strided, converting dtype). */
    sj_status (*copy)(void *ctx, const sj_tensor *x, const sj_tensor *y);
    /* Memory for a call's intermediates (bytes may be 0); NULL: use the host
     * arena block instead (the CPU). */
    void *(*buf_alloc)(void *ctx, size_t bytes);
    void (*buf_free)(void *ctx, void *p);
    /* Memory for an output the runtime allocates for the caller. */
    void *(*out_alloc)(void *ctx, size_t bytes);
    void (*out_free)(void *ctx, void *p);
    /* Run a generated group: fn its compiled functions by launch variant
     * (SJ_CG_VARIANTS_MAX, all filled; see sj_compiled), ptrs its access base
     * pointers (loads then stores), syms the symbol values, exv every
     * expression's value. */
    sj_status (*launch)(void *ctx, const struct sj_group *gr, void *const *fn, void *const *ptrs,
                        const int64_t *syms, const int64_t *exv);
    /* After the last kernel of a call (NULL: nothing): e.g. wait for the
     * device and report a data-dependent error. */
    sj_status (*finish)(void *ctx);
    /* Optional (NULL: a product's epilogue group runs after it, through
     * launch): run node n as `node` does (a matrix product with its bias)
     * and, inside the product, the epilogue group epi over the result's
     * elements as blocks of them are finished. *fused false: the product
     * ran without it (it could not take it), and the caller launches it. */
    sj_status (*node_epi)(void *ctx, const sj_graph *g, const sj_node *n, const sj_tensor *rv, const sj_tensor *bias,
                          const sj_tensor *y, const sj_exec_epi *epi, bool *fused);
} sj_exec_ops;

typedef struct sj_exec {
    const sj_runtime *rt;
    const sj_graph *g;
    const char *fn_name;
    const sj_tensor *inputs;    /* g->n_inputs caller descriptors */
    sj_tensor *outputs;         /* g->n_outputs caller descriptors */
    const int64_t *sym_vals;    /* one per symbol of g->ex; may be NULL if none */
    sj_pool *pool;              /* host blocks: expression values, descriptors (and CPU buffers) */
    _Atomic size_t *arena_hint; /* bytes the last call needed (per entry) */
    const sj_exec_ops *ops;
    void *ops_ctx;
} sj_exec;

/* The CPU's table (ctx: the runtime's sj_threads pool, may be NULL). */
extern const sj_exec_ops sj_cpu_exec_ops;

struct sj_cpu_pack_cache;
/* Give every float matrix product of g whose right operand is a constant
 * (a parameter, or a permute, slice or reshape of one with constant
 * sizes) its packed copy from cache (kernels/cpu/prepack.h), in
 * g->packed; both executors' CPU products then run over it. For an entry
 * not yet published (its graph is read by no other thread). Returns the
 * products given one; nothing is packed when memory or the cache's bound
 * runs out (those products run unpacked). */
int sj_exec_prepack(sj_graph *g, struct sj_cpu_pack_cache *cache);

/* Run a fused plan of g: generated groups through their compiled functions
 * (fns: SJ_CG_VARIANTS_MAX per group, as sj_compiled's; NULL for NODE groups), NODE groups through the
 * device's eager kernels. Caller outputs must be contiguous
 * (sj_exec_fused_ok tells); output checks and allocation as
 * sj_exec_eager. */
sj_status sj_exec_fused(const sj_exec *x, const struct sj_fplan *plan, void *const *fns);

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
/* A device's eager kernels, one per op kind, with the contract of
 * kernels/cpu/eager.h (c: the device's kernel context). */
typedef struct sj_kernels {
    sj_status (*unary)(void *c, sj_op op, const sj_tensor *x, const sj_tensor *y);
    sj_status (*binary)(void *c, sj_op op, const sj_tensor *a, const sj_tensor *b, const sj_tensor *y);
    sj_status (*where)(void *c, const sj_tensor *cond, const sj_tensor *a, const sj_tensor *b, const sj_tensor *y);
    sj_status (*copy)(void *c, const sj_tensor *x, const sj_tensor *y);
    sj_status (*reduce)(void *c, sj_op op, const sj_tensor *x, int axis, const sj_tensor *y);
    sj_status (*softmax)(void *c, const sj_tensor *x, int axis, const sj_tensor *y);
    sj_status (*layer_norm)(void *c, const sj_tensor *x, const sj_tensor *g, const sj_tensor *b, double eps,
                            const sj_tensor *y);
    sj_status (*rms_norm)(void *c, const sj_tensor *x, const sj_tensor *g, double eps, const sj_tensor *y);
    /* bias: NULL, or a rank-1 tensor of y's last size added to every row */
    sj_status (*matmul)(void *c, const sj_tensor *a, const sj_tensor *b, const sj_tensor *bias, const sj_tensor *y);
    /* mask: NULL, or f32 / q's dtype / bool already broadcast to [B, H, Sq, Sk] */
    sj_status (*attention)(void *c, const sj_tensor *q, const sj_tensor *k, const sj_tensor *v,
                           const sj_tensor *lengths, const sj_tensor *mask, double scale, int causal,
                           const sj_tensor *y);
    sj_status (*concat)(void *c, const sj_tensor *xs, int n, int axis, const sj_tensor *y);
    sj_status (*gather)(void *c, const sj_tensor *table, const sj_tensor *idx, const sj_tensor *y);
    /* y[i] = i (rank 1, any stride), converted to y's dtype */
    sj_status (*arange)(void *c, const sj_tensor *y);
    /* Optional (NULL: matmul is used): matmul with b's packed copy (the
     * graph's packed slot of the node, made by the device's pack step). */
    sj_status (*matmul_packed)(void *c, const sj_tensor *a, const sj_tensor *b, const void *packed,
                               const sj_tensor *bias, const sj_tensor *y);
    /* q, k [T, H, D], v [T, H, Dv], offsets i32 [B+1] (checked by the
     * kernel: SJ_EINDEX, or on a device its error flag), y [T, H, Dv] */
    sj_status (*attention_varlen)(void *c, const sj_tensor *q, const sj_tensor *k, const sj_tensor *v,
                                  const sj_tensor *offsets, double scale, int causal, const sj_tensor *y);
} sj_kernels;

/* c: the runtime's sj_threads pool (or NULL), over which matrix products
 * and attention are split. */
extern const sj_kernels sj_cpu_kernels;

/* Run one non-view node (or a copying reshape) with a device's kernels:
 * operands broadcast to the result, reductions given their kept axis,
 * matrix batch axes expanded. rv holds the operands' descriptors. bias
 * (a matmul only; else NULL): a plan's bias (sj_group.bias), sizes 1
 * before its last, added along y's last axis. */
sj_status sj_exec_node_on(const sj_kernels *k, void *c, const sj_graph *g, const sj_node *n, const sj_tensor *rv,
                          const sj_tensor *bias, const sj_tensor *y);
/* The CPU's: sj_exec_node_on(&sj_cpu_kernels, NULL, ...). */
sj_status sj_exec_node(const sj_graph *g, const sj_node *n, const sj_tensor *rv, const sj_tensor *bias,
                       const sj_tensor *y);

#endif
