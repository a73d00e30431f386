/* Executing a graph: eager (one kernel per node) on the CPU backend. */
#ifndef SJ_EXEC_H
#define SJ_EXEC_H

#include <stdatomic.h>

#include "jit/graph.h"
#include "jit/pool.h"

typedef struct sj_exec {
    const sj_runtime *rt;
    const sj_graph *g;
    const char *fn_name;
    const sj_tensor *inputs;   /* g->n_inputs caller descriptors */
    sj_tensor *outputs;        /* g->n_outputs caller descriptors */
    const int64_t *sym_vals;   /* one per symbol of g->ex; may be NULL if none */
    sj_pool *pool;
    _Atomic size_t *arena_hint; /* bytes the last call needed (per entry) */
} sj_exec;

struct sj_fplan;
struct sj_threads;

/* Run a fused plan of g: generated groups through fns[group] (the compiled
 * functions, see specialize/codegen.h; NULL entries for NODE groups), split
 * over threads (may be NULL: inline); NODE groups through their eager
 * kernels. Caller outputs must be contiguous (sj_exec_fused_ok tells);
 * output checks and allocation as sj_exec_eager. */
sj_status sj_exec_fused(const sj_exec *x, const struct sj_fplan *plan, void *const *fns, struct sj_threads *threads);

/* Can this call's outputs be written by a fused plan (caller outputs absent
 * or contiguous host memory)? */
bool sj_exec_fused_ok(const sj_exec *x);

/* Run g eagerly. Checks caller outputs (dtype, rank, shape) before running
 * anything; allocates outputs whose data is NULL. On error, outputs it
 * allocated are freed and their data reset to NULL. */
sj_status sj_exec_eager(const sj_exec *x);

/* -- Shared by the executors ------------------------------------------- */

/* Check caller outputs against the shapes in exv (all expressions of g). */
sj_status sj_exec_check_outputs(const sj_exec *x, const int64_t *exv);
/* Allocate the outputs whose data is NULL; allocated[i] set for each. */
sj_status sj_exec_alloc_outputs(const sj_exec *x, const int64_t *exv, unsigned char *allocated);
/* Free what sj_exec_alloc_outputs allocated (on an error). */
void sj_exec_release_outputs(const sj_exec *x, const unsigned char *allocated);
/* Run one non-view node (or a copying reshape) with its eager kernel; rv
 * holds the operands' descriptors (indexed by value id). */
sj_status sj_exec_node(const sj_graph *g, const sj_node *n, const sj_tensor *rv, const sj_tensor *y);

#endif
