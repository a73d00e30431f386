/* Guard sets: what a trace assumed about its inputs, compiled into a flat
 * check program that a call runs before reusing the trace.
 *
 * A guard set is built once from the trace (per input: dtype, rank, device,
 * layout, and for each size the expression the trace used for it, a
 * constant or a symbol; plus the relations between sizes the trace relied
 * on) and then evaluated many times, concurrently, without allocating.
 * Evaluation also binds the symbols: the values it writes are what the
 * executor uses to evaluate every shape expression of the graph.
 */
#ifndef SJ_GUARD_H
#define SJ_GUARD_H

#include <stdbool.h>
#include <stdio.h>

#include "jit/shapejit.h"
#include "shapes/expr.h"
#include "shapes/infer.h"

/* What the trace saw of one input. */
typedef struct sj_guard_input {
    sj_dtype dtype;
    int rank;
    sj_device device;
    /* The expression the trace used for each size: a constant (guard: size ==
     * c) or a symbol (first occurrence binds it and checks its range from the
     * pool; later occurrences check size == symbol: duck sizing). */
    sj_expr dim[SJ_MAX_RANK];
    /* true: guard that the input is row-major contiguous (sizes 1 may have
     * any stride); false: guard the exact strides below. */
    bool contiguous;
    int64_t stride[SJ_MAX_RANK];
} sj_guard_input;

typedef struct sj_guard_set sj_guard_set; /* immutable once built */

/* Build a guard set. ex is the trace's pool (it must outlive the set; the
 * set evaluates relation facts with it); facts are copied; names (n_inputs
 * strings, or NULL for "input 0", ...) are copied. entry_id is recorded in
 * failures. Returns NULL on allocation failure. */
sj_guard_set *sj_guard_build(const sj_exprs *ex, const sj_guard_input *ins, int n_inputs,
                             const sj_fact *facts, int n_facts, const char *const *names,
                             int entry_id);
void sj_guard_free(sj_guard_set *gs); /* NULL is a no-op */

/* Evaluate against a call's inputs (n_inputs as built; already validated by
 * sj_tensor_check). On success writes the value of every symbol of the pool
 * into sym_vals (sj_sym_count(ex) entries; symbols no input binds are left
 * untouched) and returns true. On failure returns false and, if fail is not
 * NULL, fills it with the first guard that failed (structured fields and the
 * message). No allocation; thread-safe. */
bool sj_guard_check(const sj_guard_set *gs, const sj_tensor *inputs, int64_t *sym_vals,
                    sj_guard_failure *fail);

/* Number of instructions (for explain and benchmarks). */
int sj_guard_size(const sj_guard_set *gs);

/* The guard set as text, one guard per line, each line prefixed by indent:
 *   x: f32, rank 3, host, contiguous
 *   x.size(0) == 1
 *   x.size(1) = s0 in [2, inf)
 *   y.size(0) == s0
 *   s0 % 2 == 0   (from reshape(f32[s0, 768]) ...)
 */
void sj_guard_print(const sj_guard_set *gs, FILE *out, const char *indent);

/* Fault injection for tests: in the calling thread, the next n allocations of
 * sj_guard_build succeed and every later one fails, until called again;
 * n < 0 (the default) never fails. */
void sj_guard_fail_allocs_after(long n);

#endif /* SJ_GUARD_H */
