/* Background compilation of fused plans.
 *
 * A compile target is either an entry (its plan compiled in symbolic form,
 * or fully specialized when the entry has no symbols) or one exact shape of
 * a symbolic entry (its plan specialized to that shape's symbol values). A
 * target's life is an explicit state machine, written only by
 * target_transition() in compile.c:
 *
 *   NONE -> QUEUED -> COMPILING -> READY | FAILED
 *            \-> NONE (dropped while queued: cold, or its function destroyed)
 *
 * A READY target's code is published with one atomic store of `ready`;
 * callers pick it up with one atomic load. A FAILED target is never retried:
 * its entry keeps running eagerly, and the reason is logged once.
 *
 * The compiler owns a pool of worker threads (compile_threads) fed by a
 * queue ordered by hotness (the entry's calls when the job was queued).
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
#include "kernels/backend.h"
#include "specialize/codegen.h"

typedef enum sj_cstate { SJ_CS_NONE, SJ_CS_QUEUED, SJ_CS_COMPILING, SJ_CS_READY, SJ_CS_FAILED } sj_cstate;

/* Compiled code for a target. Immutable once published. */
typedef struct sj_compiled {
    sj_backend *backend;
    sj_module *module;
    /* SJ_CG_VARIANTS_MAX per plan group (group gi's at gi *
     * SJ_CG_VARIANTS_MAX): its functions by launch variant, a group with one
     * function having it in every slot; NULL for NODE groups. */
    void **fns;
    bool specialized;    /* every size a constant */
    bool from_cache;
    double compile_ms;
} sj_compiled;

typedef struct sj_ctarget {
    _Atomic int state;                 /* sj_cstate */
    _Atomic(sj_compiled *) ready;      /* READY: the code */
    uint64_t queued_calls;             /* the entry's calls when queued */
    int64_t seen_ns;                   /* when the target was first seen (entry made / shape hot) */
    _Atomic int64_t ready_ns;          /* when it became READY (0 before) */
    char error[256];                   /* FAILED: why */
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

/* Wait while target t is QUEUED or COMPILING, until deadline_ns (sj_now_ns
 * clock; 0: no limit) or until *stop (may be NULL) is set, which is looked
 * at every 20 ms. Returns the state it saw last. */
sj_cstate sj_compiler_wait_target(sj_compiler *c, sj_ctarget *t, int64_t deadline_ns, atomic_bool *stop);

/* Drop fn's queued jobs and wait for its compiles in flight to finish. */
void sj_compiler_cancel_fn(sj_compiler *c, struct sj_fn *fn);

/* Wait until fn has no queued or running compiles; SJ_ETIMEOUT after
 * timeout_ms (< 0: forever). */
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

#endif /* SJ_COMPILE_H */
