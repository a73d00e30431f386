/* The memory budget of specializations (cfg.specialize_max_bytes).
 *
 * What a function's specialized shapes hold (memo items with compiled code
 * of their own: the loaded unit's size and the plan's arena at the shape's
 * sizes) is kept under the budget: when a new specialization would pass
 * it, the least recently called specialized shapes are demoted (compile.c,
 * under the compiler lock: their code is unpublished, the target goes back
 * to NONE, the shape's hot mark and its specialize_budget slot are given
 * back) and the shape's calls go to the entry's symbolic kernels.
 *
 * Last use. A call of a symbolic entry's specialized (or demoted) shape
 * writes the millisecond tick (sj_budget_tick) into the memo item only when
 * the tick changed: one coarse clock read and one load of a line nobody
 * writes, most calls.
 *
 * Freeing code a call may be running. Calls mark themselves in their
 * thread shard's code_users[phase] (phase = fn->code_phase & 1) around
 * the load and use of compiled code, and check that the phase did not
 * move meanwhile (else they mark the other one). A demotion unpublishes
 * the code (a seq_cst exchange), then sj_budget_reap moves the phase and
 * waits until no shard has a call marked in the old phase: any call that
 * could have loaded the old pointer marked itself in that phase before
 * loading it, and new calls mark the other phase, so the wait ends
 * (SRCU's two counters). Then the units are unloaded and freed, on the
 * compile worker (or the caller that compiled, in sync mode), with no lock
 * held. With no budget (0), calls mark nothing.
 *
 * A demoted shape may be specialized again: when, on a call whose tick
 * changed, it has had specialize_threshold calls since its demotion and
 * its wait has passed (compile_retry_ms * 2^(n-1), +-25%, after its n-th
 * demotion), it is marked hot again (taking a specialize_budget slot) and
 * queued.
 */
#ifndef SJ_BUDGET_H
#define SJ_BUDGET_H

#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

#include "jit/fn.h"

/* A call is about to load and run compiled code (or launch a graph):
 * mark it. Returns the phase marked (give it to sj_budget_leave), -1 with
 * no budget (neither specialize_max_bytes nor graph_max_bytes). */
static inline int sj_budget_enter(sj_fn *fn, unsigned shard) {
    if (!fn->rt->cfg.specialize_max_bytes && !fn->rt->cfg.graph_max_bytes) return -1;
    _Atomic uint64_t *users = fn->hot[shard].code_users;
    for (;;) {
        int b = (int)(atomic_load(&fn->code_phase) & 1);
        atomic_fetch_add(&users[b], 1);
        if ((int)(atomic_load(&fn->code_phase) & 1) == b) return b;
        atomic_fetch_sub_explicit(&users[b], 1, memory_order_release); /* it moved: mark the new one */
    }
}

static inline void sj_budget_leave(sj_fn *fn, unsigned shard, int phase) {
    if (phase >= 0) atomic_fetch_sub_explicit(&fn->hot[shard].code_users[phase], 1, memory_order_release);
}

/* A demoted shape's call whose tick changed: specialize it again when it
 * is hot again and its wait has passed. */
void sj_budget_rehot(sj_fn *fn, sj_memo *m);

/* The last-use clock, in ms: the runtime's clock (cfg.clock_ns when set),
 * the real one read coarse (CLOCK_MONOTONIC_COARSE, a few ns: a call of a
 * specialized shape reads it, and CLOCK_MONOTONIC cost 116 ns a read on
 * the 2-vCPU VM). Every stamp and every age comes from here. */
static inline uint32_t sj_budget_tick(const sj_runtime *rt) {
    if (rt->cfg.clock_ns) return (uint32_t)(rt->cfg.clock_ns(rt->cfg.clock_user) / 1000000);
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (uint32_t)((uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000);
}

/* Stamp m's last use (a call of a symbolic entry's shape; budget on). */
static inline void sj_budget_touch(sj_fn *fn, sj_memo *m) {
    int s = atomic_load_explicit(&m->ct.state, memory_order_relaxed);
    bool demoted = s == SJ_CS_NONE && atomic_load_explicit(&m->demotions, memory_order_relaxed) > 0;
    if (s != SJ_CS_READY && !demoted) return;
    uint32_t tick = sj_budget_tick(fn->rt);
    if (atomic_load_explicit(&m->used_tick, memory_order_relaxed) == tick) return;
    atomic_store_explicit(&m->used_tick, tick, memory_order_relaxed);
    if (demoted) sj_budget_rehot(fn, m);
}

/* Free units a demotion unpublished (a list through retired_next), once
 * no call can be running them; on a device that may launch code after its
 * call returned (its late_launch, kernels/device.h: CUDA's streams and
 * graphs) they are parked until the function is destroyed instead. No lock may be held, and the calling
 * thread must not be inside sj_budget_enter/leave. NULL: nothing. */
void sj_budget_reap(sj_fn *fn, sj_compiled *list);

/* A grace period: move the phase and wait until no call is marked in the
 * old one, so that no call still uses what was unpublished (seq_cst)
 * before (CUDA graphs the graph budget evicted: jit/graphs.c). Same rules
 * as sj_budget_reap. */
void sj_budget_wait_calls(sj_fn *fn);

/* Keep cd, unpublished, until the function is destroyed (a quick unit
 * the full one replaced: no grace period covers calls that run without a
 * budget's marks). */
void sj_budget_park(sj_fn *fn, sj_compiled *cd);

/* Free the parked units (sj_fn_destroy, after the table). */
void sj_budget_free_parked(sj_fn *fn);

#endif /* SJ_BUDGET_H */
