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

/* Run g eagerly. Checks caller outputs (dtype, rank, shape) before running
 * anything; allocates outputs whose data is NULL. On error, outputs it
 * allocated are freed and their data reset to NULL. */
sj_status sj_exec_eager(const sj_exec *x);

#endif
