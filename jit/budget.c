/* The memory budget of specializations: grace periods, re-specialization
 * (see budget.h; the demotions themselves are in compile.c, which owns the
 * targets' states). */
#include "jit/budget.h"

#include <time.h>

#include "jit/compile.h"

#define RELAXED memory_order_relaxed

/* -- Hot again -------------------------------------------------------------------- */

void sj_budget_rehot(sj_fn *fn, sj_memo *m) {
    if (atomic_load_explicit(&m->hot, RELAXED)) return;
    sj_runtime *rt = fn->rt;
    if (sj_runtime_now_ns(rt) < atomic_load_explicit(&m->ct.retry_ns, RELAXED)) return;
    uint64_t calls = sj_memo_calls(m), since = atomic_load_explicit(&m->demoted_calls, RELAXED);
    if (calls < since + (uint64_t)fn->policy.specialize_threshold) return;
    /* a specialize_budget slot, as note_shape takes one (call.c) */
    int used = atomic_load_explicit(&fn->specializations, RELAXED);
    if (used >= fn->policy.specialize_budget ||
        atomic_load_explicit(&fn->table.n_entries, RELAXED) + used >= fn->policy.limit)
        return;
    if (atomic_fetch_add(&fn->specializations, 1) >= fn->policy.specialize_budget || atomic_exchange(&m->hot, true)) {
        atomic_fetch_sub(&fn->specializations, 1); /* another shape took it, or another call marked m */
        return;
    }
    atomic_fetch_add_explicit(&fn->c.hot_shapes, 1, RELAXED);
    sj_logf(rt, SJ_LOG_PERF, "fn '%s': a shape of entry %d demoted %d times is hot again after %llu calls: marked for "
            "specialization", fn->name, sj_memo_entry(m)->id, atomic_load_explicit(&m->demotions, RELAXED),
            (unsigned long long)(calls - since));
    if (sj_memo_entry(m)->plan) sj_compiler_request(rt->compiler, fn, sj_memo_entry(m), m);
}

/* -- Grace periods -------------------------------------------------------------------- */

static uint64_t users_in(sj_fn *fn, unsigned phase) {
    uint64_t n = 0;
    for (int k = 0; k < SJ_SHARDS; k++) n += atomic_load(&fn->hot[k].code_users[phase]);
    return n;
}

/* Move the phase and wait for the old one's calls (retire_lock held). */
static void grace(sj_fn *fn) {
    unsigned old = atomic_fetch_add(&fn->code_phase, 1) & 1;
    while (users_in(fn, old)) {
        struct timespec ts = {0, 50000}; /* calls end: a call's time at most */
        nanosleep(&ts, NULL);
    }
}

void sj_budget_wait_calls(sj_fn *fn) {
    pthread_mutex_lock(&fn->retire_lock);
    grace(fn);
    pthread_mutex_unlock(&fn->retire_lock);
}

void sj_budget_reap(sj_fn *fn, sj_compiled *list) {
    if (!list) return;
    pthread_mutex_lock(&fn->retire_lock);
    if (fn->rt->backend->late_launch) { /* kernels queued on streams and graphs may still launch it */
        sj_compiled *last = list;
        while (last->retired_next) last = last->retired_next;
        last->retired_next = fn->parked;
        fn->parked = list;
        pthread_mutex_unlock(&fn->retire_lock);
        return;
    }
    /* the units were unpublished (seq_cst) before this: a call that loaded
     * one is marked in the phase that ends here */
    grace(fn);
    pthread_mutex_unlock(&fn->retire_lock);
    while (list) {
        sj_compiled *next = list->retired_next;
        sj_compiled_free(list);
        list = next;
    }
}

void sj_budget_park(sj_fn *fn, sj_compiled *cd) {
    pthread_mutex_lock(&fn->retire_lock);
    cd->retired_next = fn->parked;
    fn->parked = cd;
    pthread_mutex_unlock(&fn->retire_lock);
}

void sj_budget_free_parked(sj_fn *fn) {
    sj_compiled *list = fn->parked;
    fn->parked = NULL;
    while (list) {
        sj_compiled *next = list->retired_next;
        sj_compiled_free(list);
        list = next;
    }
}
