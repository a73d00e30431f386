/* Background compilation of fused plans.
 *
 * A compile target is either an entry (its plan compiled in symbolic form,
 * or fully specialized when the entry has no symbols) or one exact shape of
 * a symbolic entry (its plan specialized to that shape's symbol values). A
 * target's life is an explicit state machine, written only by
 * target_transition() in compile.c:
 *
 *   NONE -> QUEUED -> COMPILING -> READY | FAILED
 *            \-> NONE (dropped while queued: cold, i.e. no call of its entry, or
 *                     for a shape's specialization of that shape, for the
 *                     cold time; or its function destroyed)
 *   FAILED -> QUEUED | COMPILING (a retry, once its penalty has passed)
 *   READY -> FAILED (rejected by validation) | NONE (a shape demoted by the
 *            memory budget: jit/budget.h)
 *
 * A READY target's code is published with one atomic store of `ready`;
 * callers pick it up with one atomic load. A FAILED target's entry keeps
 * running eagerly and backs off (LuaJIT's penalty_pc): its n-th failure
 * makes it wait compile_retry_ms * 2^(n-1), jittered by +-25%, before a
 * hot call may queue it again; after compile_max_failures failures (or one
 * that no retry can mend: a plan too big for a unit, an internal error) it
 * is blacklisted and never compiled again. The first failure of each
 * function is logged as a warning, blacklisting once per target under
 * `compile`. Time here is the runtime's clock (sj_runtime_now_ns: the
 * config's clock callback when set, so tests drive it).
 *
 * The compiler owns a pool of worker threads (compile_threads) fed by a
 * queue ordered by value: a worker takes the job whose target's call rate
 * times its calls' measured cost on the current tier is the largest
 * (job_value in compile.c), not the oldest. Back-pressure: while the queue
 * holds k > 8 jobs per worker, an entry needs hot_threshold * k / 8 calls
 * to queue its compile (sj_compiler_backlog).
 * The queue also holds a function's bucket learning (learning while
 * serving, jit/learn.h): a job with no target, valued above every compile
 * (under sj_compiler_set_fifo, taken by arrival as every job), run by a
 * worker with no lock held; and CUDA graph captures (jit/graphs.c: the
 * runtime's one background queue has no graph thread beside it), valued
 * after learnings and before compiles, run by a worker with no lock held,
 * counted per function in captures_pending, dropped by the same
 * owner-based cancel as compiles (sj_compiler_cancel_fn). A capture that
 * fails backs off as a compile does (sj_compiler_retry_at). Each kind of
 * job (compile, learning, capture, the device's) has two limits: jobs of
 * it queued (job_queue_max; one past it refused and counted) and workers
 * running it at once (compiles n - 1 of n workers, every other kind half,
 * rounded up; no limit with one worker or none): the rule and why at
 * job_kind in compile.c; counted in sj_compiler_job_counters.
 * Workers never call user code. In sync mode the calling thread compiles
 * before running; in off mode nothing is compiled.
 *
 * Lock order: fn->trace_lock, then compiler->lock. The compiler lock is
 * never held while compiling.
 */
#ifndef SJ_COMPILE_H
#define SJ_COMPILE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "jit/shapejit.h"
#include "kernels/device.h"
#include "specialize/codegen.h"

typedef enum sj_cstate { SJ_CS_NONE, SJ_CS_QUEUED, SJ_CS_COMPILING, SJ_CS_READY, SJ_CS_FAILED } sj_cstate;

/* Compiled code for a target. Immutable once published. */
typedef struct sj_compiled {
    sj_backend *backend;
    sj_module *module;
    /* SJ_CG_VARIANTS_MAX per plan group (group gi's at gi *
     * SJ_CG_VARIANTS_MAX): its functions by launch variant, a group with one
     * function having it in every slot; NULL for NODE groups but
     * generated products (specialize/fusion.h), which have their kernel. */
    void **fns;
    /* Per plan group and size class (SJ_GEMM_CLASSES a group, class by
     * class), the variant each generated product launches, -1 for the
     * device's product (sj_exec_gemm_picks); NULL when the plan has none.
     * In fns' allocation. */
    int8_t *gemm_pick;
    bool specialized;    /* every size a constant */
    bool from_cache;
    bool from_remote; /* of which from the remote cache */
    /* A quick compile's code (cfg.compile_quick, sj_compile_req.quick):
     * serves until the full compile queued after it swaps in; no CUDA graph
     * is captured of it */
    bool quick;
    double compile_ms;
    double tune_ms;      /* the generated products' timing (sj_exec_gemm_picks) before it was ready; 0: none ran */
    char key[65];        /* the kernel cache's key of the unit */
    /* What it holds, for the memory budget: the loaded unit's size, and
     * (a shape's specialization) its plan's arena at the shape's sizes. */
    int64_t code_bytes, arena_bytes;
    struct sj_compiled *retired_next; /* demoted, waiting to be freed (jit/budget.c) */
    /* Validated swap (jit/validate.c): > 0, calls left that run eagerly
     * beside the kernel and compare before it serves alone; 0, validated;
     * -1, rejected (its results differed: never used again). */
    _Atomic int checks_left;
} sj_compiled;

typedef struct sj_ctarget {
    _Atomic int state;                 /* sj_cstate */
    _Atomic(sj_compiled *) ready;      /* READY: the code */
    uint64_t queued_calls;             /* the target's calls when queued (a shape's: the shape's own) */
    int64_t seen_ns;                   /* when the target was first seen (entry made / shape hot) */
    _Atomic int64_t ready_ns;          /* when it became READY (0 before) */
    _Atomic int64_t retry_ns;          /* FAILED: when a retry may be queued; INT64_MAX: blacklisted */
    _Atomic int fails;                 /* failed compiles so far (written under the compiler lock) */
    _Atomic bool rejected;             /* FAILED because validation found its results wrong */
    char error[256];                   /* FAILED: why (the latest failure) */
} sj_ctarget;

struct sj_fn;
struct sj_entry;
struct sj_memo;
typedef struct sj_compiler sj_compiler;

typedef enum sj_compile_mode_internal { SJ_CM_ASYNC, SJ_CM_SYNC, SJ_CM_OFF } sj_compile_mode_internal;

/* codegen: the generator whose source the backend compiles (see
 * specialize/codegen.h: sj_codegen_fn). */
sj_status sj_compiler_create(sj_backend *backend, sj_codegen_fn codegen, int n_workers, int mode,
                             const sj_runtime *rt, sj_compiler **out);
/* Stops the workers (jobs still queued are dropped) and joins them. Every
 * function must have been destroyed (or cancelled) first. */
void sj_compiler_destroy(sj_compiler *c);

void sj_ctarget_init(sj_ctarget *t);

/* Ask for the entry's plan (memo NULL) or the memo shape's specialization to
 * be compiled. Async: queued (deduplicated: a target already queued,
 * compiling, ready or failed is left alone). Sync: compiled on this thread
 * before returning (or waits for another thread compiling it). Off: nothing.
 * Thread-safe. */
void sj_compiler_request(sj_compiler *c, struct sj_fn *fn, struct sj_entry *e, struct sj_memo *m);

/* sj_compiler_request for a warm-up (jit/warmup.c): the same, except that
 * a queued job is never dropped as cold (a warm-up makes no calls). */
void sj_compiler_request_warm(sj_compiler *c, struct sj_fn *fn, struct sj_entry *e, struct sj_memo *m);

/* Queue fn's bucket learning (jit/learn.h) as a job that runs ahead of
 * compiles (async); sync or off mode: run it on the calling thread now.
 * Counted in fn's pending compiles (sj_compiler_wait_fn waits for it);
 * dropped when fn is cancelled. The caller holds no lock. */
void sj_compiler_request_learn(sj_compiler *c, struct sj_fn *fn);

/* Wait while target t is QUEUED or COMPILING, until deadline_ns (sj_now_ns
 * clock; 0: no limit) or until *stop (may be NULL) is set, which is looked
 * at every 20 ms. A compiler without worker threads runs queued jobs on
 * the calling thread meanwhile. Returns the state it saw last. */
sj_cstate sj_compiler_wait_target(sj_compiler *c, sj_ctarget *t, int64_t deadline_ns, atomic_bool *stop);

/* Whether a hot call should request t: never asked for, or failed and its
 * penalty has passed (reads the runtime's clock only in the second case). */
bool sj_compiler_wants(const sj_compiler *c, const sj_ctarget *t);

/* The hot threshold's multiplier from the queue: 1 while it holds at most
 * 8 jobs per worker, then (jobs per worker) / 8 (async only). One relaxed
 * load. */
int sj_compiler_backlog(const sj_compiler *c);
/* Order the queue by queueing (first in, first out) instead of by value:
 * the baseline the value order is measured against (bench_sched). */
void sj_compiler_set_fifo(sj_compiler *c, bool fifo);

/* Run up to max_jobs queued jobs on the calling thread, highest priority
 * first; returns how many ran (compiled, failed or dropped as cold). For
 * programs and tests that run background work themselves
 * (sj_runtime_run_background). */
int sj_compiler_run_queued(sj_compiler *c, int max_jobs);

/* The ready code cd of the entry's target (memo NULL) or the memo shape's
 * gave results that differ from eager execution (why says how): it is
 * never used again (cd->checks_left -1; kept until the function is
 * destroyed, as calls may still hold it), the target is failed for good,
 * its artifact is quarantined in the kernel cache, and the first rejection
 * of the function is logged as a warning. Thread-safe; the first caller for
 * a cd does it, later ones return false. */
bool sj_compiler_reject(sj_compiler *c, struct sj_fn *fn, struct sj_entry *e, struct sj_memo *m, sj_compiled *cd,
                        const char *why);

/* Queue a graph capture job for fn (async mode; arg: graphs.c's record,
 * handed to sj_graphs_capture_run on a worker, or sj_graphs_capture_drop
 * when fn is cancelled first). False: not queued (sync or off mode, fn
 * being destroyed, or out of memory): the caller runs or drops it. The
 * caller holds no lock. */
bool sj_compiler_request_capture(sj_compiler *c, struct sj_fn *fn, void *arg);
/* The device's "post background job" callback (kernels/device.h:
 * sj_post_fn, handed over with its set_post slot; ctx: the compiler): a
 * JOB_DEVICE job, valued after captures and before compiles, that a worker
 * (or, with compile_threads 0, a thread stepping the queue:
 * sj_runtime_run_background, the waits, sj_compiler_run_device) runs with
 * no lock held; dropped (drop(arg)) by sj_compiler_destroy if still
 * queued. False (the device does the work its own way) in sync or off
 * mode, past the kind's job_queue_max, or out of memory. */
bool sj_compiler_post(void *ctx, void (*run)(void *arg), void (*drop)(void *arg), void *arg);
/* Whether background jobs are queued (async mode) rather than run by the
 * thread that asks. */
bool sj_compiler_async(const sj_compiler *c);
/* Wait until fn has no graph captures queued or running (as
 * sj_compiler_wait_fn for compiles). */
sj_status sj_compiler_wait_captures(sj_compiler *c, struct sj_fn *fn, int timeout_ms);
/* The back-off of background work that failed for the fails-th time (a
 * graph capture): when it may be tried again on the runtime's clock,
 * compile_retry_ms * 2^(fails-1) +-25% from now, or INT64_MAX when it is
 * blacklisted (fails reached compile_max_failures, or compile_retry_ms is
 * 0). Takes the compiler lock. */
int64_t sj_compiler_retry_at(sj_compiler *c, int fails);

/* The queue's per-kind limits and counts (shapejit.h: sj_job_counters;
 * the rule in compile.c at job_kind). Takes the compiler lock. */
void sj_compiler_job_counters(sj_compiler *c, sj_job_counters *out);
/* Tests: set kind's queue_max and workers_max (0: no running limit); a
 * negative value leaves that limit as it is. */
void sj_compiler_set_kind_limits(sj_compiler *c, sj_job_kind kind, int queue_max, int workers_max);
/* With no workers (async, compile_threads 0): run the device's queued jobs
 * on this thread now, for a wait on the device's background work (its
 * settle slot) that nothing else would end; returns how many ran. 0 and
 * nothing done with workers, or in sync or off mode. */
int sj_compiler_run_device(sj_compiler *c);

/* Drop fn's queued jobs (compiles, learnings, captures) and wait for its
 * jobs in flight to finish. */
void sj_compiler_cancel_fn(sj_compiler *c, struct sj_fn *fn);

/* Wait until fn has no queued or running compiles; SJ_ETIMEOUT after
 * timeout_ms (< 0: forever). A compiler without worker threads runs fn's
 * queued jobs on the calling thread instead. */
sj_status sj_compiler_wait_fn(sj_compiler *c, struct sj_fn *fn, int timeout_ms);

/* How long a queued job may wait with no calls to its entry before it is
 * dropped as cold (default 60 s; tests shorten it). */
void sj_compiler_set_cold_ms(sj_compiler *c, int ms);
/* How long a background job's compiler may run in the idle scheduling
 * class, counted from the job's queueing (default 1000 ms; 0: never idle).
 * Tests and benchmarks. */
void sj_compiler_set_idle_ms(sj_compiler *c, int ms);

/* Free a target's published code (at function destroy). */
void sj_ctarget_release(sj_ctarget *t);
/* Unload and free a unit no call can be running (NULL: nothing). */
void sj_compiled_free(sj_compiled *cd);

#endif /* SJ_COMPILE_H */
