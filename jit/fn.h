/* A jitted function: its options, policy, and table of guarded entries.
 *
 * Lock order: fn->trace_lock, then the table's memo lock, then
 * rt->lock. fn->warm_lock (jit/warmup.c) is a leaf: nothing is called and
 * no other lock taken while it is held. fn->retire_lock (jit/budget.c) is
 * taken with no other lock held, and no other lock is taken under it; fn->graph_lock
 * (jit/graphs.c) is a leaf held for no wait. No lock is held while a graph
 * executes; trace_lock is held
 * while the model function runs (one trace at a time per function), so
 * other threads keep serving existing entries meanwhile.
 */
#ifndef SJ_FN_H
#define SJ_FN_H

#include <pthread.h>
#include <stdatomic.h>

#include "jit/entry.h"
#include "jit/pool.h"
#include "jit/runtime.h"
#include "base/shard.h"
#include "specialize/policy.h"

#define SJ_RECENT_FAILURES 8

/* Counters of rarer events: traces, errors, compiles, ... */
typedef struct sj_fn_counters {
    _Atomic uint64_t errors, traces, trace_errors;
    _Atomic uint64_t guard_failures[SJ_GUARD_KIND_COUNT];
    _Atomic uint64_t limit_hits, hot_entries, hot_shapes, static_entries, symbolic_entries;
    _Atomic uint64_t compiles, compile_cache_hits, compile_remote_hits, compile_failures, compiles_blacklisted,
        compiles_dropped, compile_us, tune_us, validations, validation_failures;
    _Atomic uint64_t graphs, graph_failures, graph_blacklisted, graph_evictions, graph_over_budget;
    _Atomic uint64_t bucket_graphs, bucket_graph_calls;
    _Atomic uint64_t warmup_runs, warmup_shapes, warmup_failures;
    _Atomic uint64_t demoted, over_budget;
    _Atomic uint64_t buckets_learned, learn_failures, learn_kept;
    _Atomic uint64_t quick_compiles, quick_replaced;
} sj_fn_counters;

/* One dimension learned while serving (jit/learn.h), under trace_lock.
 * input -1: every bucketed dimension without a row of its own
 * (cfg.learn_every). */
#define SJ_LEARN_AUTO_MAX 8
typedef struct sj_learn_auto {
    int input, axis, every;
    int64_t next_at;          /* due once learn_shapes reaches it */
    int64_t calls_at;         /* ... or once the memo hits reach it (the half-life's calls after
                                 the latest; INT64_MAX: no decay) */
    sj_learn_options opt;     /* apply 1 */
    uint64_t runs;            /* learnings applied */
    bool has_last;
    int last_input, last_axis; /* the dimension of `last` (for input -1: the latest one) */
    sj_bucket_report last;
} sj_learn_auto;

/* What every successful call counts, one 64-byte line per thread shard
 * (base/shard.h; sj_fn is allocated 64-byte aligned); calls are the sum of
 * the three tiers. */
typedef struct sj_fn_shard {
    _Alignas(64) _Atomic uint64_t memo_hits;
    _Atomic uint64_t guard_evals, eager_calls, fused_sym_calls, fused_spec_calls, graph_calls;
    /* Calls of this shard running compiled code now, by phase (jit/budget.h:
     * demoted code is freed once its phase has none). */
    _Atomic uint64_t code_users[2];
} sj_fn_shard;

struct sj_fn {
    sj_runtime *rt;
    struct sj_fn *next_in_rt; /* runtime's list (rt->lock) */
    char *name;
    int n_inputs;
    sj_model_fn model;
    void *user;
    char **input_names;       /* n_inputs copies, or NULL */
    sj_guard_fail_fn on_guard_fail;
    void *on_guard_fail_user;

    pthread_mutex_t trace_lock; /* one trace at a time; policy; recent failures */
    sj_table table;
    sj_policy policy;
    _Atomic int specializations; /* shapes marked for specialization */

    bool limit_logged;        /* under trace_lock */
    bool fallback_made;       /* a fallback entry exists (under trace_lock) */
    int extra_entries;        /* kept past the limit beside the fallback (under trace_lock) */
    sj_guard_failure recent[SJ_RECENT_FAILURES]; /* ring, under trace_lock */
    int n_recent;

    /* Compiles, under the compiler's lock. */
    int compiles_pending;     /* queued or running (compiles and learnings) */
    int captures_pending;     /* graph captures queued or running (jit/graphs.c) */
    bool cancelled;           /* being destroyed: no new compiles */
    atomic_int cancel_compiles; /* set with cancelled: a running compiler is killed */
    bool compile_fail_logged;
    bool reject_logged; /* compiler lock */

    /* The memory budget of specializations (jit/budget.h). spec_bytes:
     * what the published specializations hold (written under the compiler
     * lock). code_phase: which of each shard's code_users a call marks;
     * retire_lock: one grace period at a time, and `parked` (demoted units
     * kept until destroy on a device with late_launch: CUDA). A leaf: nothing else is taken under it. */
    _Atomic int64_t spec_bytes;
    _Atomic unsigned code_phase;
    /* CUDA graphs (jit/graphs.c): the bytes the published ones hold, and
     * graph_lock (a leaf, held for no wait) over the graph budget's
     * accounting and choice of victims (graph_max_bytes). */
    _Atomic int64_t graph_bytes;
    pthread_mutex_t graph_lock;
    pthread_mutex_t retire_lock;
    struct sj_compiled *parked;

    /* Warm-up (jit/warmup.c): the latest, under warm_lock; its state also
     * in warm_state (sj_warm_state), read without the lock. */
    pthread_mutex_t warm_lock;
    pthread_cond_t warm_cond; /* with warm_lock: a warm-up is over */
    struct sj_warmup *warm;
    _Atomic int warm_state;

    /* Buckets learned while serving (jit/learn.h). learn: rows under
     * trace_lock (explicit ones first, the cfg row last). learn_shapes: new
     * exact shapes counted (a call's memo miss, one atomic add, only while
     * a row exists); learn_next_at: the least row's next_at (INT64_MAX:
     * none); learn_calls_at: the least row's calls_at, which the call path
     * compares the memo hits with on every 64th hit of a shard;
     * learn_queued: a learning job is queued or about to be. learn_window:
     * the calls in the histogram's window at its latest update (rounded,
     * for sj_stats). */
    sj_learn_auto learn[SJ_LEARN_AUTO_MAX + 1];
    int n_learn;
    _Atomic int64_t learn_shapes, learn_next_at, learn_calls_at;
    atomic_bool learn_queued;
    _Atomic uint64_t learn_window;

    sj_pool pool;
    /* CPU backend: the packed copies of constant weights its entries'
     * matrix products read (kernels/cpu/prepack.h); NULL: none packed
     * (another backend, or prepack_max_bytes 0). Filled at trace time. */
    struct sj_cpu_pack_cache *packs;
    sj_fn_counters c;
    sj_fn_shard hot[SJ_SHARDS];
};

#endif
