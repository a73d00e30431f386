/* Background compilation of fused plans (see compile.h). */
#include "base/alloc.h"
#include "jit/compile.h"

#include <assert.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/error.h"
#include "jit/budget.h"
#include "jit/exec.h"
#include "jit/fn.h"
#include "jit/graphs.h"
#include "jit/learn.h"
#include "jit/runtime.h"
#include "kernels/cache.h"
#include "specialize/codegen.h"
#include "specialize/codegen_gemm_cuda.h"

#define RELAXED memory_order_relaxed
/* A job that waited this long while its entry got no calls is dropped. */
#define COLD_NS_DEFAULT (INT64_C(60) * 1000000000)
/* A background compile runs in the idle scheduling class until its job is
 * this old (from being queued); then at normal priority. */
#define IDLE_NS_DEFAULT (INT64_C(1000) * 1000000)
/* Jobs per worker the queue holds before new entries need more calls to
 * become hot (HotSpot's Tier3DelayOn). */
#define SJ_BACKLOG_FREE 8
/* sj_compiler_wait_target looks at its stop flag this often. */
#define WAIT_SLICE_NS (INT64_C(20) * 1000000)

/* A job's kind: a compile of a target, a function's bucket learning
 * (jit/learn.h: no target; entry and memo NULL), or a CUDA graph capture
 * of one signature's call (jit/graphs.c: arg is the graphs' own record of
 * it; entry and memo NULL here). A job counts in its function's
 * compiles_pending, a capture in captures_pending. JOB_DEVICE: the
 * device's own background work (the cuBLASLt warmer), posted through the
 * device table's set_post (sj_compiler_post): run(arg), or drop(arg) if
 * the queue stops first; no function. */
typedef enum job_kind {
    JOB_COMPILE = SJ_JOB_COMPILE,
    JOB_LEARN = SJ_JOB_LEARN,
    JOB_CAPTURE = SJ_JOB_CAPTURE,
    JOB_DEVICE = SJ_JOB_DEVICE,
    JOB_KINDS = SJ_JOB_KINDS
} job_kind;
_Static_assert(JOB_KINDS == 4, "a job kind without its limits and counters");

/* Per-kind limits (the queue's only limits besides the compiles'
 * back-pressure and cuda_graphs; libuv's slow-I/O cap in threadpool.c):
 *
 * - queued: at most queue_max[kind] jobs of a kind wait (cfg.job_queue_max
 *   each); one past it is refused and counted in dropped[kind]: a compile's
 *   target stays NONE (a later hot call asks again), a learning's function
 *   may queue one again, a capture's shape counts towards a capture again,
 *   and a device job goes back to the device, which does it its own way
 *   (the cuBLASLt warmer's own thread).
 * - running: at most workers_max[kind] workers run a kind at once. With n
 *   workers: compiles may take n - r of them while n > r (r:
 *   cfg.job_reserve_workers, default 1), else all, so that with two or
 *   more workers one is always free for the short kinds (a
 *   learning, a capture, a device job: milliseconds, and a capture serves
 *   every later call of its shape) however long compiles take (50 ms to
 *   seconds); each short kind may take half of them, rounded up (all of
 *   one), so that with two or more workers neither captures nor device
 *   warming can occupy every worker while compiles wait. With one worker
 *   nothing changes: value order alone decides (short kinds first, so a
 *   compile delays a capture by at most the compile it is running). With
 *   no workers (compile_threads 0) the threads that step the queue are the
 *   program's: no running limit. A worker that finds only jobs of kinds at
 *   their limit sleeps until a job ends. */
#define QUEUE_MAX_DEFAULT 4096

typedef struct job {
    struct sj_fn *fn;
    sj_entry *entry;    /* NULL for JOB_LEARN and JOB_CAPTURE */
    sj_memo *memo; /* NULL: the entry's own target */
    uint64_t seq;       /* queueing order (FIFO, and ties) */
    int64_t queued_ns;  /* monotonic: the idle-class deadline */
    int64_t queued_vns; /* the runtime's clock: the cold drop */
    bool warm;          /* asked for by a warm-up: never dropped as cold */
    bool full;          /* JOB_COMPILE: the full compile of a target a quick unit serves */
    job_kind kind;
    void *arg;          /* JOB_CAPTURE: sj_graphs_capture_run's; JOB_DEVICE: run's and drop's */
    void (*run)(void *arg), (*drop)(void *arg); /* JOB_DEVICE */
} job;

struct sj_compiler {
    sj_backend *backend;
    sj_codegen_fn codegen;
    const sj_runtime *rt;
    int mode;
    pthread_mutex_t lock;
    pthread_cond_t work; /* a job was queued, or stop */
    pthread_cond_t done; /* a job finished or was dropped */
    job *jobs;           /* queued, unordered: pick() chooses */
    int n_jobs, cap_jobs;
    _Atomic int queued;  /* n_jobs, for the hot path's back-pressure */
    bool fifo;           /* order by queueing, not by value (benchmarks) */
    uint64_t seq;
    bool stop;
    int64_t cold_ns;
    int64_t idle_ns;
    int64_t retry_ns;   /* first penalty (cfg.compile_retry_ms); 0: no retries */
    int max_failures;   /* blacklisted after this many (cfg.compile_max_failures) */
    uint64_t rng;       /* jitter (xorshift64) */
    pthread_t *workers;
    int n_workers;
    int n_full; /* full compiles running on threads of their own (start_full) */
    int64_t compile_end_ns; /* when the queue's last compile job ended (sj_now_ns) */
    bool full_running;      /* a full compile's thread is compiling (one at a time) */
    /* per kind (job_kind): the limits and the counts (see the comment at
     * job_kind). workers_max 0: no limit. */
    int queue_max[JOB_KINDS], workers_max[JOB_KINDS];
    int n_queued[JOB_KINDS], n_running[JOB_KINDS];
    uint64_t n_ran[JOB_KINDS], n_dropped[JOB_KINDS];
};

/* -- Targets ---------------------------------------------------------------------- */

void sj_ctarget_init(sj_ctarget *t) {
    memset(t, 0, sizeof *t);
    t->seen_ns = sj_now_ns();
    atomic_init(&t->state, SJ_CS_NONE);
    atomic_init(&t->ready, NULL);
    atomic_init(&t->ready_ns, 0);
    atomic_init(&t->retry_ns, 0);
}

/* The one writer of a target's state. Legal moves only. */
static void target_transition(sj_ctarget *t, sj_cstate to) {
    sj_cstate from = (sj_cstate)atomic_load_explicit(&t->state, RELAXED);
    assert((from == SJ_CS_NONE && (to == SJ_CS_QUEUED || to == SJ_CS_COMPILING)) ||
           (from == SJ_CS_QUEUED && (to == SJ_CS_COMPILING || to == SJ_CS_NONE)) ||
           (from == SJ_CS_COMPILING && (to == SJ_CS_READY || to == SJ_CS_FAILED)) ||
           (from == SJ_CS_FAILED && (to == SJ_CS_QUEUED || to == SJ_CS_COMPILING)) ||
           (from == SJ_CS_READY && to == SJ_CS_FAILED) || /* rejected by validation */
           (from == SJ_CS_READY && to == SJ_CS_NONE));    /* demoted by the memory budget */
    (void)from;
    atomic_store_explicit(&t->state, to, memory_order_release);
}

static sj_ctarget *target_of(sj_entry *e, sj_memo *m) { return m ? &m->ct : &e->ct; }

/* Calls of a target: its entry's, or (a shape's specialization) the
 * shape's own, so that a shape no longer seen goes cold while its entry
 * serves other shapes. */
static uint64_t target_calls(sj_entry *e, sj_memo *m) { return m ? sj_memo_calls(m) : sj_counter_sum(&e->calls); }

/* A structured event about target (e, m) of fn (shapejit.h: sj_event). */
static void emit(const sj_compiler *c, sj_event_kind kind, unsigned topic, struct sj_fn *fn, sj_entry *e, sj_memo *m,
                 const char *error, double ms, int64_t bytes, int count, int64_t retry_ms) {
    if (!c->rt || !sj_log_wants_events(&c->rt->log)) return;
    char shape[128] = "";
    if (m) sj_memo_shape(m, shape, sizeof shape);
    sj_emit(c->rt, (sj_event){.kind = kind, .topic = topic, .fn = fn->name, .entry = e->id, .shape = shape,
                              .error = error, .duration_ms = ms, .bytes = bytes, .count = count,
                              .retry_ms = retry_ms});
}

void sj_compiled_free(sj_compiled *c) {
    if (!c) return;
    c->backend->unload(c->backend, c->module);
    free(c->fns);
    free(c);
}

void sj_ctarget_release(sj_ctarget *t) { sj_compiled_free(atomic_exchange(&t->ready, NULL)); }

/* -- Compiling one target (no lock held) ------------------------------------------- */

/* CUDA row kernels' fallbacks as kernels of their own (issue 28), which
 * jit/exec_fused.c's launch_desc picks where sj_cuda_vec_ok fails; 0: one
 * kernel holding both paths. */
#ifndef SJ_COMPILE_FALLBACK_KERNELS
#define SJ_COMPILE_FALLBACK_KERNELS 1
#endif

static sj_status compile_target(sj_compiler *c, struct sj_fn *fn, sj_entry *e, sj_memo *m, int64_t idle_until_ns,
                                bool quick, bool background, sj_compiled **out, char *err, size_t errn,
                                bool *hopeless) {
    const sj_fplan *plan = e->plan;
    *out = NULL;
    *hopeless = false;
    if ((plan->n_generated + plan->n_gemm) * SJ_CG_VARIANTS_MAX > SJ_COMPILE_SYMBOLS_MAX) {
        *hopeless = true; /* the same plan, the same refusal: no retry can mend it */
        snprintf(err, errn, "the plan has %d generated kernels (at most %d per unit)", plan->n_generated,
                 SJ_COMPILE_SYMBOLS_MAX / SJ_CG_VARIANTS_MAX);
        return SJ_EBACKEND;
    }
    size_t len;
    int *variants = sj_calloc(2 * (size_t)(plan->n_groups ? plan->n_groups : 1), sizeof *variants);
    int *fallbacks = variants ? variants + (plan->n_groups ? plan->n_groups : 1) : NULL;
    /* CUDA row kernels' unaligned paths as kernels of their own (slot
     * SJ_CG_FALLBACK), which the engine's launch picks by sj_cuda_vec_ok
     * (jit/exec_fused.c's launch_desc) */
    sj_codegen_opts o = {.prefix = "sj_", .stream_min_bytes = c->rt ? c->rt->cfg.stream_min_bytes : 0,
                         .variants = variants, .fallback_kernels = SJ_COMPILE_FALLBACK_KERNELS, .fallbacks = fallbacks,
                         .test_skew = c->rt ? c->rt->test_skew : 0};
    char *src = variants ? c->codegen(e->g, plan, m ? m->head.syms : NULL, &o, &len) : NULL;
    if (!src) {
        free(variants);
        snprintf(err, errn, "out of memory generating code");
        return SJ_ENOMEM;
    }
    /* the functions to resolve: each group's, or each of its variants (as
     * the generator reports; 0 for NODE groups) */
    char names[SJ_COMPILE_SYMBOLS_MAX][32];
    const char *syms[SJ_COMPILE_SYMBOLS_MAX];
    int n = 0;
    for (int gi = 0; gi < plan->n_groups; gi++) {
        int nv = variants[gi];
        /* NODE groups: none, but a generated product's (fusion.h) */
        bool none = plan->groups[gi].kind == SJ_G_NODE && plan->groups[gi].gemm_tile < 0;
        if ((nv < 1) != none || nv > SJ_CG_FALLBACK || (fallbacks[gi] && nv != 1)) {
            *hopeless = true;
            snprintf(err, errn, "the generator reported %d functions for group %s", nv, plan->groups[gi].name);
            free(variants);
            free(src);
            return SJ_EINTERNAL;
        }
        assert(n + nv <= SJ_COMPILE_SYMBOLS_MAX); /* (n_generated + n_gemm) * SJ_CG_VARIANTS_MAX at most, checked above */
        for (int v = 0; v < nv + fallbacks[gi]; v++, n++) {
            if (v == nv) snprintf(names[n], sizeof names[n], "sj_%s_fb", plan->groups[gi].name);
            else if (nv == 1) snprintf(names[n], sizeof names[n], "sj_%s", plan->groups[gi].name);
            else snprintf(names[n], sizeof names[n], "sj_%s_v%d", plan->groups[gi].name, v);
            syms[n] = names[n];
        }
    }
    char tag[160];
    if (m) {
        size_t used = (size_t)snprintf(tag, sizeof tag, "%s.e%d.spec", fn->name, e->id);
        for (int s = 0; s < e->head.n_syms && used < sizeof tag; s++)
            used += (size_t)snprintf(tag + used, sizeof tag - used, ".%lld", (long long)m->head.syms[s]);
    } else {
        snprintf(tag, sizeof tag, "%s.e%d.%s", fn->name, e->id, e->head.n_syms ? "sym" : "static");
    }
    /* the tag names dump files and log lines: a function name's control
     * characters and slashes become '_' */
    for (char *p = tag; *p; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f || *p == '/') *p = '_';
    sj_compile_req req = {.source = src, .source_len = len, .symbols = syms, .n_symbols = n, .tag = tag,
                          .cancel = &fn->cancel_compiles, .idle_until_ns = idle_until_ns, .quick = quick,
                          .background = background};
    sj_compile_result *res = sj_calloc(1, sizeof *res);
    sj_compiled *cd = sj_calloc(1, sizeof *cd);
    /* the functions, then (in the same block) the products' picks */
    size_t n_fns = (size_t)(plan->n_groups ? plan->n_groups : 1) * SJ_CG_VARIANTS_MAX;
    void **fns = sj_calloc(n_fns + (size_t)plan->n_groups * SJ_GEMM_CLASSES / sizeof(void *) + 1, sizeof *fns);
    sj_status st = (!res || !cd || !fns) ? SJ_ENOMEM : c->backend->compile(c->backend, &req, res);
    free(src);
    if (st) {
        snprintf(err, errn, "%s", !res ? "out of memory" : res->log[0] ? res->log : sj_last_error());
        free(res);
        free(cd);
        free(fns);
        free(variants);
        return st;
    }
    /* every variant slot of a group filled (a group with one function has it
     * in all), the fallback's slot where the generator made one (else NULL) */
    for (int gi = 0, k = 0; gi < plan->n_groups; gi++) {
        for (int v = 0; v < SJ_CG_FALLBACK && variants[gi]; v++)
            fns[gi * SJ_CG_VARIANTS_MAX + v] = res->fns[k + (v < variants[gi] ? v : 0)];
        if (fallbacks[gi]) fns[gi * SJ_CG_VARIANTS_MAX + SJ_CG_FALLBACK] = res->fns[k + variants[gi]];
        k += variants[gi] + fallbacks[gi];
        /* a quick unit's products are stubs that trap (SJ_CUDA_QUICK_MACRO):
         * no function, so they run as the device's and nothing times them
         * (sj_exec_fused, the device's gemm_tune) until the full unit */
        if (res->quick && plan->groups[gi].gemm_tile >= 0)
            memset(fns + (size_t)gi * SJ_CG_VARIANTS_MAX, 0, SJ_CG_VARIANTS_MAX * sizeof *fns);
    }
    free(variants);
    if (plan->n_gemm) { /* each generated product's variant, timed here on the worker */
        cd->gemm_pick = (int8_t *)(fns + n_fns);
        int64_t t0 = sj_now_ns();
        if (sj_exec_gemm_picks(c->backend, e->g, plan, m ? m->head.syms : NULL, fns, res->key,
                               c->rt ? c->rt->cfg.cuda_gemm : 0, cd->gemm_pick))
            cd->tune_ms = (double)(sj_now_ns() - t0) / 1e6;
    }
    cd->backend = c->backend;
    cd->module = res->module;
    cd->fns = fns;
    cd->specialized = m != NULL || e->head.n_syms == 0;
    cd->from_cache = res->from_cache;
    cd->from_remote = res->from_remote;
    cd->quick = res->quick || (quick && c->rt && c->rt->test_quick);
    cd->compile_ms = res->compile_ms;
    memcpy(cd->key, res->key, sizeof cd->key);
    /* the backend's size of the unit, else its source's as an estimate */
    cd->code_bytes = res->code_bytes ? (int64_t)res->code_bytes : (int64_t)len;
    cd->arena_bytes = m && plan->arena_bytes != SJ_EX_NONE ? sj_ex_eval(e->g->ex, plan->arena_bytes, m->head.syms) : 0;
    atomic_init(&cd->checks_left, c->rt ? c->rt->cfg.validate_calls : 0);
    free(res);
    *out = cd;
    return SJ_OK;
}

/* -- Back-off ------------------------------------------------------------------------- */

/* The wait after a target's n-th failure: retry_ns * 2^(n-1), times a
 * jitter in [0.75, 1.25) so that targets failing together (a compiler gone
 * missing) do not retry together. -1: no retries (retry_ns 0). Compiler
 * lock held (the jitter's state). */
static int64_t penalty_ns(sj_compiler *c, int n) {
    if (c->retry_ns <= 0) return -1;
    int64_t p = c->retry_ns;
    for (int i = 1; i < n && p < INT64_MAX / 4; i++) p *= 2;
    c->rng ^= c->rng << 13;
    c->rng ^= c->rng >> 7;
    c->rng ^= c->rng << 17;
    double jitter = 0.75 + 0.5 * (double)(c->rng >> 11) / (double)(UINT64_C(1) << 53);
    return (int64_t)((double)p * jitter);
}

bool sj_compiler_wants(const sj_compiler *c, const sj_ctarget *t) {
    int s = atomic_load_explicit(&t->state, RELAXED);
    if (s == SJ_CS_NONE) return true;
    if (s != SJ_CS_FAILED || !c) return false;
    int64_t at = atomic_load_explicit(&t->retry_ns, RELAXED);
    return at != INT64_MAX && sj_runtime_now_ns(c->rt) >= at;
}

/* Whether a request may move t out of its state now (compiler lock held). */
static bool may_queue(const sj_compiler *c, const sj_ctarget *t) {
    int s = atomic_load_explicit(&t->state, RELAXED);
    return s == SJ_CS_NONE || (s == SJ_CS_FAILED && sj_compiler_wants(c, t));
}

/* -- The memory budget (compiler lock held; see budget.h) ------------------------------ */

static int64_t held_by(const sj_compiled *cd) { return cd->code_bytes + cd->arena_bytes; }

/* The least recently called specialized shape of fn other than `except`;
 * NULL if none. A shape with a CUDA graph (or one being captured) is not
 * a candidate: its graphs launch the code. Walks the memo's read index. */
static sj_memo *lru_victim(struct sj_fn *fn, sj_memo *except, uint32_t now_tick) {
    sj_memo_index *ix = atomic_load_explicit(&fn->table.index, memory_order_acquire);
    sj_memo *best = NULL;
    uint32_t best_age = 0;
    for (size_t i = 0; ix && i < ix->cap; i++) {
        sj_memo *m = sj_memo_of(atomic_load_explicit(&ix->slot[i], memory_order_acquire));
        if (!m || m == except || atomic_load_explicit(&m->ct.state, RELAXED) != SJ_CS_READY ||
            !atomic_load_explicit(&m->ct.ready, RELAXED) || atomic_load_explicit(&m->graph_busy, RELAXED))
            continue;
        bool graphs = false;
        for (int k = 0; k < SJ_MEMO_GRAPHS; k++) graphs |= atomic_load_explicit(&m->graphs[k], RELAXED) != NULL;
        if (graphs) continue;
        uint32_t age = now_tick - atomic_load_explicit(&m->used_tick, RELAXED); /* wraps: ages stay right */
        if (!best || age > best_age ||
            (age == best_age && atomic_load_explicit(&m->ct.ready_ns, RELAXED) <
                                    atomic_load_explicit(&best->ct.ready_ns, RELAXED)))
            best = m, best_age = age;
    }
    return best;
}

/* Demote shape v: its code unpublished onto *retired (freed by
 * sj_budget_reap once no call runs it), its target back to NONE, its hot
 * mark and specialize_budget slot given back; a wait before it may be
 * specialized again that doubles with each demotion. */
static void demote(sj_compiler *c, struct sj_fn *fn, sj_memo *v, uint32_t now_tick, sj_compiled **retired) {
    sj_compiled *old = atomic_exchange(&v->ct.ready, NULL); /* seq_cst: before sj_budget_reap's phase move */
    int n = atomic_fetch_add_explicit(&v->demotions, 1, RELAXED) + 1;
    int64_t penalty = penalty_ns(c, n), now = sj_runtime_now_ns(c->rt);
    atomic_store_explicit(&v->demoted_calls, sj_memo_calls(v), RELAXED);
    atomic_store_explicit(&v->ct.retry_ns, penalty > 0 ? now + penalty : now, RELAXED);
    atomic_store_explicit(&v->ct.ready_ns, 0, RELAXED);
    atomic_store(&v->hot, false); /* before the state: a call that sees NONE sees it unmarked */
    atomic_fetch_sub(&fn->specializations, 1);
    target_transition(&v->ct, SJ_CS_NONE);
    atomic_fetch_sub_explicit(&fn->spec_bytes, held_by(old), RELAXED);
    atomic_fetch_add_explicit(&fn->c.demoted, 1, RELAXED);
    char shape[128];
    sj_memo_shape(v, shape, sizeof shape);
    sj_logf(c->rt, SJ_LOG_COMPILE,
            "fn '%s': entry %d shape (%s) demoted to the symbolic kernels (specialize_max_bytes %llu): %lld bytes "
            "freed, unused for %u ms, demoted %d times",
            fn->name, sj_memo_entry(v)->id, shape, (unsigned long long)c->rt->cfg.specialize_max_bytes,
            (long long)held_by(old), now_tick - atomic_load_explicit(&v->used_tick, RELAXED), n);
    emit(c, SJ_EVENT_DEMOTED, SJ_LOG_COMPILE, fn, sj_memo_entry(v), v, "",
         (double)(now_tick - atomic_load_explicit(&v->used_tick, RELAXED)), held_by(old), n, 0);
    old->retired_next = *retired;
    *retired = old;
}

/* Make room for shape m's new code cd under the budget, demoting the least
 * recently called specialized shapes; false when cd alone is larger than
 * the budget (nothing is demoted then). */
static bool admit(sj_compiler *c, struct sj_fn *fn, sj_memo *m, sj_compiled *cd, sj_compiled **retired) {
    uint64_t max = c->rt ? c->rt->cfg.specialize_max_bytes : 0;
    if (!max) return true;
    int64_t need = held_by(cd);
    if ((uint64_t)need > max) return false;
    uint32_t tick = sj_budget_tick(c->rt);
    while ((uint64_t)(atomic_load_explicit(&fn->spec_bytes, RELAXED) + need) > max) {
        sj_memo *v = lru_victim(fn, m, tick);
        if (!v) break; /* what is left has graphs: over the budget (CUDA) */
        demote(c, fn, v, tick, retired);
    }
    atomic_store_explicit(&m->used_tick, tick, RELAXED); /* new: the most recently used */
    return true;
}

/* Publish or fail a target (compiler lock held). Units a budget demoted go
 * onto *retired: the caller frees them (sj_budget_reap) with no lock held,
 * before it counts the job done. */
static void finish(sj_compiler *c, struct sj_fn *fn, sj_entry *e, sj_memo *m, sj_status st, sj_compiled *cd,
                   const char *err, bool hopeless, sj_compiled **retired) {
    sj_ctarget *t = target_of(e, m);
    if (!st && m && !admit(c, fn, m, cd, retired)) {
        snprintf(t->error, sizeof t->error, "its code and arena, %lld bytes, pass specialize_max_bytes %llu",
                 (long long)held_by(cd), (unsigned long long)c->rt->cfg.specialize_max_bytes);
        atomic_fetch_add_explicit(&t->fails, 1, RELAXED);
        atomic_store_explicit(&t->retry_ns, INT64_MAX, RELAXED); /* the same shape, the same size */
        target_transition(t, SJ_CS_FAILED);
        atomic_fetch_add_explicit(&fn->c.over_budget, 1, RELAXED);
        sj_logf(c->rt, SJ_LOG_COMPILE, "fn '%s': entry %d shape not kept: %s", fn->name, e->id, t->error);
        emit(c, SJ_EVENT_COMPILE_BLACKLISTED, SJ_LOG_COMPILE, fn, e, m, t->error, 0, held_by(cd),
             atomic_load_explicit(&t->fails, RELAXED), 0);
        cd->retired_next = *retired; /* never published: freed at once */
        *retired = cd;
        return;
    }
    if (!st) {
        if (m) atomic_fetch_add_explicit(&fn->spec_bytes, held_by(cd), RELAXED); /* counted with or without a budget */
        atomic_store_explicit(&t->ready, cd, memory_order_release); /* the hot swap */
        atomic_store_explicit(&t->ready_ns, sj_now_ns(), RELAXED);
        target_transition(t, SJ_CS_READY);
        atomic_fetch_add_explicit(&fn->c.compiles, 1, RELAXED);
        if (cd->quick) atomic_fetch_add_explicit(&fn->c.quick_compiles, 1, RELAXED);
        if (cd->from_cache) atomic_fetch_add_explicit(&fn->c.compile_cache_hits, 1, RELAXED);
        if (cd->from_remote) atomic_fetch_add_explicit(&fn->c.compile_remote_hits, 1, RELAXED);
        atomic_fetch_add_explicit(&fn->c.compile_us, (uint64_t)(cd->compile_ms * 1000), RELAXED);
        atomic_fetch_add_explicit(&fn->c.tune_us, (uint64_t)(cd->tune_ms * 1000), RELAXED);
        char tuned[48] = "";
        if (cd->tune_ms > 0) snprintf(tuned, sizeof tuned, ", %.1f ms timing its products", cd->tune_ms);
        sj_logf(c->rt, SJ_LOG_COMPILE, "fn '%s': entry %d%s ready (%s%s, %.1f ms%s)", fn->name, e->id,
                m ? " shape" : "", cd->quick ? "quick, ": "",
                cd->from_remote ? "from the remote cache" : cd->from_cache ? "from the cache" : "compiled", cd->compile_ms,
                tuned);
        emit(c, SJ_EVENT_COMPILE_FINISHED, SJ_LOG_COMPILE, fn, e, m, "", cd->compile_ms, held_by(cd), 0, 0);
    } else {
        snprintf(t->error, sizeof t->error, "%s", err);
        int fails = atomic_fetch_add_explicit(&t->fails, 1, RELAXED) + 1;
        int64_t penalty = penalty_ns(c, fails);
        bool blacklist = hopeless || penalty < 0 || fails >= c->max_failures;
        atomic_store_explicit(&t->retry_ns, blacklist ? INT64_MAX : sj_runtime_now_ns(c->rt) + penalty, RELAXED);
        target_transition(t, SJ_CS_FAILED);
        atomic_fetch_add_explicit(&fn->c.compile_failures, 1, RELAXED);
        if (blacklist) atomic_fetch_add_explicit(&fn->c.compiles_blacklisted, 1, RELAXED);
        if (!fn->compile_fail_logged) {
            fn->compile_fail_logged = true;
            sj_logf(c->rt, SJ_LOG_WARN, "fn '%s': compile failed, entry %d stays eager: %s", fn->name, e->id, err);
        }
        if (blacklist)
            sj_logf(c->rt, SJ_LOG_COMPILE, "fn '%s': entry %d%s blacklisted after %d failed compiles", fn->name, e->id,
                    m ? " shape" : "", fails);
        else
            sj_logf(c->rt, SJ_LOG_COMPILE, "fn '%s': entry %d%s failed %d times, retry in %lld ms", fn->name, e->id,
                    m ? " shape" : "", fails, (long long)(penalty / 1000000));
        emit(c, SJ_EVENT_COMPILE_FAILED, SJ_LOG_COMPILE, fn, e, m, err, 0, 0, fails,
             blacklist ? -1 : penalty / 1000000);
        if (blacklist) emit(c, SJ_EVENT_COMPILE_BLACKLISTED, SJ_LOG_COMPILE, fn, e, m, err, 0, 0, fails, 0);
    }
}

/* A job is over: free what its finish demoted (the lock let go meanwhile),
 * then count it done (compiler lock held). */
static void job_done(sj_compiler *c, struct sj_fn *fn, sj_compiled *retired) {
    if (retired) {
        pthread_mutex_unlock(&c->lock);
        sj_budget_reap(fn, retired);
        pthread_mutex_lock(&c->lock);
    }
    fn->compiles_pending--;
    pthread_cond_broadcast(&c->done);
}

bool sj_compiler_reject(sj_compiler *c, struct sj_fn *fn, sj_entry *e, sj_memo *m, sj_compiled *cd, const char *why) {
    int ck = atomic_load_explicit(&cd->checks_left, RELAXED);
    do {
        if (ck < 0) return false; /* another call rejected it first */
    } while (!atomic_compare_exchange_weak(&cd->checks_left, &ck, -1));
    sj_ctarget *t = target_of(e, m);
    pthread_mutex_lock(&c->lock);
    if (atomic_load_explicit(&t->state, RELAXED) == SJ_CS_READY && atomic_load_explicit(&t->ready, RELAXED) == cd) {
        snprintf(t->error, sizeof t->error, "%s", why);
        atomic_store_explicit(&t->retry_ns, INT64_MAX, RELAXED);
        atomic_fetch_add_explicit(&t->fails, 1, RELAXED);
        atomic_store_explicit(&t->rejected, true, RELAXED);
        target_transition(t, SJ_CS_FAILED);
    }
    atomic_fetch_add_explicit(&fn->c.validation_failures, 1, RELAXED);
    bool first = !fn->reject_logged;
    fn->reject_logged = true;
    emit(c, SJ_EVENT_VALIDATION_REJECTED, SJ_LOG_WARN, fn, e, m, why, 0, 0, 0, 0);
    pthread_mutex_unlock(&c->lock);
    if (c->rt && c->rt->cache) sj_cache_quarantine(c->rt->cache, cd->key);
    if (first)
        sj_logf(c->rt, SJ_LOG_WARN,
                "fn '%s': entry %d%s: compiled kernels rejected, their results differ from eager execution (%s); "
                "the entry keeps its previous tier, the artifact is quarantined",
                fn->name, e->id, m ? " shape" : "", why);
    return true;
}

/* -- The queue (compiler lock held) ------------------------------------------------- */

/* The worth of compiling a job now (HotSpot orders its queue by event
 * rate; the expected saving is ours): its target's calls per second since
 * it was first seen, times what one of those calls costs on the tier it
 * runs on now, the entry's measured eager time per call. A shape of an
 * entry whose symbolic kernels are ready saves a tenth of that (its
 * specialization only sharpens fused code). Real clock: rates are real. */
static double job_value(const job *j, int64_t now) {
    /* a learning first: what compiles after it is then for the new buckets,
     * and it takes milliseconds */
    if (j->kind == JOB_LEARN) return INFINITY;
    /* a capture next: a millisecond that serves a stable call's every
     * later call, where a compile takes 50 ms to seconds */
    if (j->kind == JOB_CAPTURE) return DBL_MAX;
    /* the device's (cuBLASLt algorithms ahead of products): before compiles too */
    if (j->kind == JOB_DEVICE) return DBL_MAX / 2;
    sj_entry *e = j->entry;
    uint64_t n = atomic_load_explicit(&e->eager_timed, RELAXED), ns = atomic_load_explicit(&e->eager_ns, RELAXED);
    double cost = n ? (double)ns / (double)n : 1000.0, calls, age;
    if (j->memo) {
        calls = (double)sj_memo_calls(j->memo);
        age = (double)(now - j->memo->ct.seen_ns);
        if (atomic_load_explicit(&e->ct.ready, RELAXED)) cost *= 0.1;
    } else {
        calls = (double)sj_counter_sum(&e->calls);
        age = (double)(now - e->created_ns);
    }
    if (age < 1e9) age = 1e9; /* a second at least: two calls in a millisecond are no rate */
    return calls / (age / 1e9) * cost;
}

/* A job's class, compared before its value: a learning, a capture, an
 * entry's first compile (its calls run eagerly until it is done), the
 * device's work (cuBLASLt algorithms for new product sizes: 3-5 ms each,
 * but a new shape's sizes post many: on one worker they kept a new
 * shape's quick compile waiting about 100 ms on an H100 host), then the
 * other compiles (a shape's specialization, a full compile queued behind
 * a quick unit). */
static int job_rank(const job *j) {
    switch (j->kind) {
    case JOB_LEARN: return 4;
    case JOB_CAPTURE: return 3;
    case JOB_DEVICE: return 1;
    default: return !j->memo && !j->full && !atomic_load_explicit(&j->entry->ct.ready, RELAXED) ? 2 : 0;
    }
}

/* Whether a worker may start a job of kind k now (its workers_max). */
static bool may_run(const sj_compiler *c, job_kind k) {
    return c->workers_max[k] <= 0 || c->n_running[k] < c->workers_max[k];
}

/* Take the job to run next into *out: the highest class (job_rank), then
 * the most valuable (ties: the older), or the oldest when c->fifo, among
 * the kinds below their running
 * limit. False: none may start now (none queued, or only kinds at their
 * limit). O(n): the queue holds at most a few hundred. */
static bool pop(sj_compiler *c, job *out) {
    int best = -1, br = 0;
    double bv = 0;
    int64_t now = c->fifo ? 0 : sj_now_ns();
    bool allowed[JOB_KINDS];
    for (int k = 0; k < JOB_KINDS; k++) allowed[k] = may_run(c, (job_kind)k);
    for (int i = 0; i < c->n_jobs; i++) {
        if (!allowed[c->jobs[i].kind]) continue;
        if (c->fifo) {
            if (best < 0 || c->jobs[i].seq < c->jobs[best].seq) best = i;
            continue;
        }
        int r = job_rank(&c->jobs[i]);
        double v = job_value(&c->jobs[i], now);
        if (best < 0 || r > br || (r == br && (v > bv || (v == bv && c->jobs[i].seq < c->jobs[best].seq))))
            best = i, br = r, bv = v;
    }
    if (best < 0) return false;
    *out = c->jobs[best];
    c->jobs[best] = c->jobs[--c->n_jobs];
    c->n_queued[out->kind]--;
    atomic_store_explicit(&c->queued, c->n_jobs, RELAXED);
    return true;
}

/* Queue j (compiler lock held), within its kind's queue_max: false, and
 * counted as dropped, past it (or out of memory: not counted). */
static bool push(sj_compiler *c, job j) {
    if (c->n_queued[j.kind] >= c->queue_max[j.kind]) {
        c->n_dropped[j.kind]++;
        return false;
    }
    if (c->n_jobs == c->cap_jobs) {
        int cap = c->cap_jobs ? 2 * c->cap_jobs : 16;
        job *h = sj_realloc(c->jobs, (size_t)cap * sizeof *h);
        if (!h) return false;
        c->jobs = h;
        c->cap_jobs = cap;
    }
    j.seq = c->seq++;
    c->jobs[c->n_jobs++] = j;
    c->n_queued[j.kind]++;
    atomic_store_explicit(&c->queued, c->n_jobs, RELAXED);
    pthread_cond_signal(&c->work);
    return true;
}

/* Take a job out of the queue at index i, not to run it (cancel; compiler
 * lock held). */
static void unqueue(sj_compiler *c, int i) {
    c->n_queued[c->jobs[i].kind]--;
    c->jobs[i] = c->jobs[--c->n_jobs];
    atomic_store_explicit(&c->queued, c->n_jobs, RELAXED);
}

int sj_compiler_backlog(const sj_compiler *c) {
    if (!c || c->mode != SJ_CM_ASYNC) return 1;
    int per = atomic_load_explicit(&c->queued, RELAXED) / (c->n_workers > 0 ? c->n_workers : 1);
    return per > SJ_BACKLOG_FREE ? per / SJ_BACKLOG_FREE : 1;
}

void sj_compiler_set_fifo(sj_compiler *c, bool fifo) {
    pthread_mutex_lock(&c->lock);
    c->fifo = fifo;
    pthread_mutex_unlock(&c->lock);
}

/* -- Quick units, then the full compile --------------------------------------------
 * A quick unit (cd->quick) serves an entry that ran eagerly; the full
 * compile of the same target follows (job.full), on a thread of its own at
 * the lowest nice level (start_full: the queue's workers stay free for
 * the next shapes' first compiles, which a full compile on the one worker
 * delayed by its whole length), or as a queued job where the program
 * steps the queue (compile_threads 0). It leaves the target's state as it
 * is (READY: the quick unit serves meanwhile), swaps its unit in when done
 * and parks the quick one until the function is destroyed; if it fails,
 * the quick unit stays (logged). Counted in the function's
 * compiles_pending until it ends. */

/* Queue target j's full compile (compiler lock held). */
static void queue_full(sj_compiler *c, job j) {
    if (c->stop || j.fn->cancelled) return;
    j.full = true;
    j.warm = true; /* never dropped as cold: it replaces code that serves */
    j.queued_ns = sj_now_ns();
    j.queued_vns = sj_runtime_now_ns(c->rt);
    if (push(c, j)) j.fn->compiles_pending++;
}

static void run_full(sj_compiler *c, job j) {
    sj_ctarget *t = target_of(j.entry, j.memo);
    pthread_mutex_unlock(&c->lock);
    char err[256] = "";
    bool hopeless = false;
    sj_compiled *cd = NULL;
    sj_status st = compile_target(c, j.fn, j.entry, j.memo, 0, false, true, &cd, err, sizeof err, &hopeless);
    if (!st && cd->quick) { /* (the test hook's quick units: never from a full compile) */
        st = SJ_EINTERNAL;
        snprintf(err, sizeof err, "the full compile gave quick code");
        sj_compiled_free(cd);
    }
    if (!st) {
        sj_compiled *old = atomic_exchange(&t->ready, cd); /* the swap: calls take the new unit from now on */
        atomic_store_explicit(&t->ready_ns, sj_now_ns(), RELAXED);
        atomic_fetch_add_explicit(&j.fn->c.quick_replaced, 1, RELAXED);
        atomic_fetch_add_explicit(&j.fn->c.compile_us, (uint64_t)(cd->compile_ms * 1000), RELAXED);
        atomic_fetch_add_explicit(&j.fn->c.tune_us, (uint64_t)(cd->tune_ms * 1000), RELAXED);
        if (old) sj_budget_park(j.fn, old);
        sj_logf(c->rt, SJ_LOG_COMPILE, "fn '%s': entry %d's quick unit replaced by its full compile (%s, %.1f ms)",
                j.fn->name, j.entry->id, cd->from_cache ? "from the cache" : "compiled", cd->compile_ms);
    } else {
        sj_logf(c->rt, SJ_LOG_WARN, "fn '%s': entry %d's full compile failed; its quick unit stays: %s", j.fn->name,
                j.entry->id, err);
    }
    pthread_mutex_lock(&c->lock);
    job_done(c, j.fn, NULL);
}

#define FULL_QUIET_NS ((int64_t)50 * 1000000)

typedef struct full_arg {
    sj_compiler *c;
    job j;
} full_arg;

static void *full_main(void *p) {
    full_arg *a = p;
    sj_compiler *c = a->c;
    job j = a->j;
    free(a);
    /* the serving threads first (nice is per thread on Linux, and NVRTC's
     * program threads started here inherit it); refused: as it is */
    if (setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), 19)) {
    }
    pthread_mutex_lock(&c->lock);
    /* after the queue's compiles, and FULL_QUIET_NS after the last of them
     * ended: a stream of new shapes gets their quick units first (a full
     * compile beside a quick one made that one's first fused call 40-50%
     * later on an H100 host) */
    for (;;) {
        if (c->stop || j.fn->cancelled) break;
        int64_t now = sj_now_ns(), wait_ns = c->compile_end_ns + FULL_QUIET_NS - now;
        bool busy = c->n_running[JOB_COMPILE] > 0 || c->n_queued[JOB_COMPILE] > 0 || c->full_running;
        if (!busy && wait_ns <= 0) break;
        if (busy || wait_ns > FULL_QUIET_NS) wait_ns = FULL_QUIET_NS;
        struct timespec ts = sj_realtime_after(wait_ns);
        pthread_cond_timedwait(&c->done, &c->lock, &ts);
    }
    if (c->stop || j.fn->cancelled) {
        job_done(c, j.fn, NULL); /* (its function is going: no compile) */
    } else {
        c->full_running = true; /* one at a time */
        run_full(c, j);
        c->full_running = false;
    }
    c->n_full--;
    pthread_cond_broadcast(&c->done);
    pthread_mutex_unlock(&c->lock);
    return NULL;
}

/* Start target j's full compile (compiler lock held). */
static void start_full(sj_compiler *c, job j) {
    if (c->stop || j.fn->cancelled) return;
    full_arg *a = c->n_workers > 0 ? malloc(sizeof *a) : NULL;
    if (!a) {
        queue_full(c, j); /* stepped by the program (or out of memory): a queued job */
        return;
    }
    a->c = c;
    a->j = j;
    a->j.full = true;
    pthread_attr_t at;
    pthread_t th;
    bool ok = false;
    if (!pthread_attr_init(&at)) {
        ok = !pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED) && !pthread_create(&th, &at, full_main, a);
        pthread_attr_destroy(&at);
    }
    if (ok) {
        j.fn->compiles_pending++;
        c->n_full++;
    } else {
        free(a);
        queue_full(c, j);
    }
}

/* -- Workers -------------------------------------------------------------------------- */

/* Priority that rises with age. A compile worker thread keeps its normal
 * priority (it mostly sleeps in poll while the compiler runs; an
 * unprivileged thread that enters the idle class can never leave it), and
 * starts each compiler process in the idle scheduling class (Linux
 * SCHED_IDLE): a request thread that wants a core takes it at once, so no
 * request waits on a compile. Starved on a loaded machine, an idle compile
 * would never finish (16 threads calling: nothing fused in 180 s), so once
 * its job is idle_ns old the backend reruns it at normal priority; a job
 * that waited in the queue that long starts there. */
static void run_job(sj_compiler *c, job j) {
    if (j.kind == JOB_LEARN) {
        pthread_mutex_unlock(&c->lock);
        sj_learn_run(j.fn); /* takes the memo lock, then the trace lock, each alone */
        pthread_mutex_lock(&c->lock);
        job_done(c, j.fn, NULL);
        return;
    }
    if (j.kind == JOB_DEVICE) {
        pthread_mutex_unlock(&c->lock);
        j.run(j.arg); /* the device's work, no lock of ours held */
        pthread_mutex_lock(&c->lock);
        pthread_cond_broadcast(&c->done);
        return;
    }
    if (j.kind == JOB_CAPTURE) {
        pthread_mutex_unlock(&c->lock);
        sj_graphs_capture_run(j.fn, j.arg); /* no lock held while capturing */
        pthread_mutex_lock(&c->lock);
        j.fn->captures_pending--;
        pthread_cond_broadcast(&c->done);
        return;
    }
    sj_ctarget *t = target_of(j.entry, j.memo);
    if (j.full) {
        run_full(c, j);
        return;
    }
    uint64_t calls = target_calls(j.entry, j.memo);
    if (!j.warm && sj_runtime_now_ns(c->rt) - j.queued_vns > c->cold_ns && calls == t->queued_calls) {
        target_transition(t, SJ_CS_NONE); /* cold: a later hot call queues it again */
        atomic_fetch_add_explicit(&j.fn->c.compiles_dropped, 1, RELAXED);
        emit(c, SJ_EVENT_COMPILE_DROPPED, SJ_LOG_COMPILE, j.fn, j.entry, j.memo, "cold: no calls while it was queued",
             0, 0, 0, 0);
        j.fn->compiles_pending--;
        pthread_cond_broadcast(&c->done);
        return;
    }
    target_transition(t, SJ_CS_COMPILING);
    emit(c, SJ_EVENT_COMPILE_STARTED, SJ_LOG_COMPILE, j.fn, j.entry, j.memo, "", 0, 0, 0, 0);
    int64_t idle_until = c->idle_ns > 0 ? j.queued_ns + c->idle_ns : 0;
    pthread_mutex_unlock(&c->lock);
    char err[256] = "";
    bool hopeless = false;
    sj_compiled *cd = NULL;
    /* a unit's first code for calls that run eagerly meanwhile: quick
     * (cfg.compile_quick), then in full (not for a warm-up, which prepares
     * what serves, nor for a shape's specialization, whose entry's code
     * serves meanwhile) */
    bool quick = c->rt && c->rt->cfg.compile_quick && !j.warm && !j.memo && !atomic_load(&t->ready);
    sj_status st = compile_target(c, j.fn, j.entry, j.memo, idle_until, quick, false, &cd, err, sizeof err, &hopeless);
    pthread_mutex_lock(&c->lock);
    sj_compiled *retired = NULL;
    finish(c, j.fn, j.entry, j.memo, st, cd, err, hopeless, &retired);
    if (!st && cd->quick) start_full(c, j);
    job_done(c, j.fn, retired);
}

/* Run the next job that may start (compiler lock held, let go while it
 * runs); false when none may (see pop). A job that ends wakes the workers
 * while jobs are queued: one of a kind that was at its limit may start. */
static bool run_one(sj_compiler *c) {
    job j;
    if (!pop(c, &j)) return false;
    job_kind k = j.kind;
    c->n_running[k]++;
    run_job(c, j);
    c->n_running[k]--;
    if (k == JOB_COMPILE) c->compile_end_ns = sj_now_ns();
    c->n_ran[k]++;
    if (c->n_jobs > 0) pthread_cond_broadcast(&c->work);
    return true;
}

static void *worker_main(void *arg) {
    sj_compiler *c = arg;
    pthread_mutex_lock(&c->lock);
    while (!c->stop)
        if (!run_one(c)) pthread_cond_wait(&c->work, &c->lock);
    pthread_mutex_unlock(&c->lock);
    return NULL;
}

int sj_compiler_run_queued(sj_compiler *c, int max_jobs) {
    if (!c) return 0;
    int n = 0;
    pthread_mutex_lock(&c->lock);
    while (n < max_jobs && !c->stop && run_one(c)) n++;
    pthread_mutex_unlock(&c->lock);
    return n;
}

sj_status sj_compiler_create(sj_backend *backend, sj_codegen_fn codegen, int n_workers, int mode,
                             const sj_runtime *rt, sj_compiler **out) {
    sj_compiler *c = sj_calloc(1, sizeof *c);
    if (!c) return sj_seterr(SJ_ENOMEM, "compiler: out of memory");
    c->backend = backend;
    c->codegen = codegen;
    c->rt = rt;
    c->mode = mode;
    c->cold_ns = COLD_NS_DEFAULT;
    c->idle_ns = IDLE_NS_DEFAULT;
    c->retry_ns = rt ? (int64_t)rt->cfg.compile_retry_ms * 1000000 : 0;
    c->max_failures = rt ? rt->cfg.compile_max_failures : 1;
    c->rng = (uint64_t)sj_now_ns() | 1;
    pthread_mutex_init(&c->lock, NULL);
    pthread_cond_init(&c->work, NULL);
    pthread_cond_init(&c->done, NULL);
    int workers = mode == SJ_CM_ASYNC && n_workers > 0 ? n_workers : 0;
    for (int k = 0; k < JOB_KINDS; k++) {
        c->queue_max[k] = rt && rt->cfg.job_queue_max > 0 ? rt->cfg.job_queue_max : QUEUE_MAX_DEFAULT;
        /* the rule at job_kind; 0 (no limit) without workers */
        int reserve = rt ? rt->cfg.job_reserve_workers : 1;
        c->workers_max[k] = workers == 0              ? 0
                            : k == JOB_COMPILE        ? (workers > reserve ? workers - reserve : workers)
                                                      : (workers + 1) / 2;
    }
    if (mode == SJ_CM_ASYNC && n_workers > 0) {
        c->workers = sj_calloc((size_t)n_workers, sizeof *c->workers);
        if (!c->workers) {
            sj_compiler_destroy(c);
            return sj_seterr(SJ_ENOMEM, "compiler: out of memory");
        }
        for (int i = 0; i < n_workers; i++) {
            if (pthread_create(&c->workers[i], NULL, worker_main, c)) {
                sj_compiler_destroy(c);
                return sj_seterr(SJ_ENOMEM, "compiler: cannot start worker thread %d", i);
            }
            c->n_workers++;
        }
    }
    *out = c;
    return SJ_OK;
}

void sj_compiler_destroy(sj_compiler *c) {
    if (!c) return;
    pthread_mutex_lock(&c->lock);
    c->stop = true;
    pthread_cond_broadcast(&c->work);
    while (c->n_full > 0) pthread_cond_wait(&c->done, &c->lock); /* (their functions' destroys waited for them) */
    pthread_mutex_unlock(&c->lock);
    for (int i = 0; i < c->n_workers; i++) pthread_join(c->workers[i], NULL);
    for (int i = 0; i < c->n_jobs; i++) /* the device's own jobs: given back (functions left none) */
        if (c->jobs[i].kind == JOB_DEVICE) c->jobs[i].drop(c->jobs[i].arg);
    free(c->workers);
    free(c->jobs);
    pthread_cond_destroy(&c->work);
    pthread_cond_destroy(&c->done);
    pthread_mutex_destroy(&c->lock);
    free(c);
}

void sj_compiler_set_cold_ms(sj_compiler *c, int ms) {
    pthread_mutex_lock(&c->lock);
    c->cold_ns = (int64_t)ms * 1000000;
    pthread_mutex_unlock(&c->lock);
}

void sj_compiler_set_idle_ms(sj_compiler *c, int ms) {
    pthread_mutex_lock(&c->lock);
    c->idle_ns = (int64_t)ms * 1000000;
    pthread_mutex_unlock(&c->lock);
}

/* -- Requests ---------------------------------------------------------------------------- */

static void request(sj_compiler *c, struct sj_fn *fn, sj_entry *e, sj_memo *m, bool warm) {
    if (!c || c->mode == SJ_CM_OFF || !e->plan) return;
    sj_ctarget *t = target_of(e, m);
    if (c->mode == SJ_CM_ASYNC && !warm && !sj_compiler_wants(c, t)) return;
    pthread_mutex_lock(&c->lock);
    if (m && !atomic_load_explicit(&m->hot, RELAXED)) { /* demoted meanwhile (its mark given back) */
        pthread_mutex_unlock(&c->lock);
        return;
    }
    if (c->mode == SJ_CM_ASYNC) {
        if (warm && atomic_load_explicit(&t->state, RELAXED) == SJ_CS_QUEUED) { /* queued by a call: keep it */
            for (int i = 0; i < c->n_jobs; i++)
                if (c->jobs[i].kind == JOB_COMPILE && target_of(c->jobs[i].entry, c->jobs[i].memo) == t)
                    c->jobs[i].warm = true;
        } else if (may_queue(c, t) && !c->stop && !fn->cancelled) {
            /* refused (past job_queue_max, or out of memory): the entry
             * stays on its tier until a later request */
            uint64_t calls = target_calls(e, m);
            if (push(c, (job){fn, e, m, 0, sj_now_ns(), sj_runtime_now_ns(c->rt), warm, false, JOB_COMPILE, NULL, NULL,
                              NULL})) {
                t->queued_calls = calls;
                target_transition(t, SJ_CS_QUEUED);
                fn->compiles_pending++;
            }
        }
        pthread_mutex_unlock(&c->lock);
        return;
    }
    /* sync: compile here, or wait for the thread compiling it */
    if (may_queue(c, t) && !fn->cancelled) {
        target_transition(t, SJ_CS_COMPILING);
        emit(c, SJ_EVENT_COMPILE_STARTED, SJ_LOG_COMPILE, fn, e, m, "", 0, 0, 0, 0);
        fn->compiles_pending++;
        pthread_mutex_unlock(&c->lock);
        char err[256] = "";
        bool hopeless = false;
        sj_compiled *cd = NULL;
        sj_status st = compile_target(c, fn, e, m, 0, false, false, &cd, err, sizeof err, &hopeless); /* a caller waits */
        pthread_mutex_lock(&c->lock);
        sj_compiled *retired = NULL;
        finish(c, fn, e, m, st, cd, err, hopeless, &retired);
        job_done(c, fn, retired);
    } else {
        while (atomic_load_explicit(&t->state, RELAXED) == SJ_CS_COMPILING) pthread_cond_wait(&c->done, &c->lock);
    }
    pthread_mutex_unlock(&c->lock);
}

void sj_compiler_request(sj_compiler *c, struct sj_fn *fn, sj_entry *e, sj_memo *m) { request(c, fn, e, m, false); }

void sj_compiler_request_warm(sj_compiler *c, struct sj_fn *fn, sj_entry *e, sj_memo *m) { request(c, fn, e, m, true); }

void sj_compiler_request_learn(sj_compiler *c, struct sj_fn *fn) {
    if (!c || c->mode != SJ_CM_ASYNC) { /* sync or off: on this thread, as a sync compile */
        sj_learn_run(fn);
        return;
    }
    pthread_mutex_lock(&c->lock);
    bool queued = false;
    if (!c->stop && !fn->cancelled &&
        push(c, (job){fn, NULL, NULL, 0, sj_now_ns(), sj_runtime_now_ns(c->rt), true, false, JOB_LEARN, NULL, NULL, NULL})) {
        fn->compiles_pending++;
        queued = true;
    }
    pthread_mutex_unlock(&c->lock);
    if (!queued) atomic_store(&fn->learn_queued, false); /* a later new shape tries again */
}

sj_cstate sj_compiler_wait_target(sj_compiler *c, sj_ctarget *t, int64_t deadline_ns, atomic_bool *stop) {
    pthread_mutex_lock(&c->lock);
    sj_cstate s;
    while ((s = (sj_cstate)atomic_load_explicit(&t->state, memory_order_acquire)) == SJ_CS_QUEUED ||
           s == SJ_CS_COMPILING) {
        int64_t now = sj_now_ns();
        if ((stop && atomic_load(stop)) || (deadline_ns && now >= deadline_ns)) break;
        if (c->n_workers == 0 && c->mode == SJ_CM_ASYNC && run_one(c))
            continue; /* no workers: this thread is one (as in sj_compiler_wait_fn) */
        int64_t slice = now + WAIT_SLICE_NS;
        if (deadline_ns && deadline_ns < slice) slice = deadline_ns;
        struct timespec ts = sj_realtime_after(slice - now);
        pthread_cond_timedwait(&c->done, &c->lock, &ts);
    }
    pthread_mutex_unlock(&c->lock);
    return s;
}

void sj_compiler_cancel_fn(sj_compiler *c, struct sj_fn *fn) {
    if (!c) return;
    pthread_mutex_lock(&c->lock);
    fn->cancelled = true;
    atomic_store(&fn->cancel_compiles, 1); /* a running compiler is killed: no wait for it */
    for (int i = 0; i < c->n_jobs;) {
        if (c->jobs[i].fn != fn) {
            i++;
            continue;
        }
        if (c->jobs[i].kind == JOB_COMPILE && !c->jobs[i].full) { /* (a full compile's target keeps its quick unit) */
            target_transition(target_of(c->jobs[i].entry, c->jobs[i].memo), SJ_CS_NONE);
            emit(c, SJ_EVENT_COMPILE_DROPPED, SJ_LOG_COMPILE, fn, c->jobs[i].entry, c->jobs[i].memo,
                 "its function is being destroyed", 0, 0, 0, 0);
        }
        if (c->jobs[i].kind == JOB_CAPTURE) {
            sj_graphs_capture_drop(fn, c->jobs[i].arg); /* takes no lock */
            fn->captures_pending--;
        } else {
            fn->compiles_pending--;
        }
        unqueue(c, i);
    }
    pthread_cond_broadcast(&c->done); /* target waiters see their dropped jobs */
    while (fn->compiles_pending > 0 || fn->captures_pending > 0) pthread_cond_wait(&c->done, &c->lock);
    pthread_mutex_unlock(&c->lock);
}

/* Wait until *pending (fn's compiles or captures) is 0; see
 * sj_compiler_wait_fn. */
static sj_status wait_pending(sj_compiler *c, struct sj_fn *fn, int *pending, const char *what, int timeout_ms) {
    if (!c) return SJ_OK;
    struct timespec deadline = sj_realtime_after(timeout_ms >= 0 ? (int64_t)timeout_ms * 1000000 : 0);
    sj_status st = SJ_OK;
    pthread_mutex_lock(&c->lock);
    while (*pending > 0) {
        if (c->n_workers == 0 && c->mode == SJ_CM_ASYNC && run_one(c)) continue; /* no workers: this thread is one */
        if (timeout_ms < 0) {
            pthread_cond_wait(&c->done, &c->lock);
        } else if (pthread_cond_timedwait(&c->done, &c->lock, &deadline) == ETIMEDOUT) {
            st = sj_seterr(SJ_ETIMEOUT, "fn '%s': %d %s still pending after %d ms", fn->name, *pending, what,
                           timeout_ms);
            break;
        }
    }
    pthread_mutex_unlock(&c->lock);
    return st;
}

sj_status sj_compiler_wait_fn(sj_compiler *c, struct sj_fn *fn, int timeout_ms) {
    return wait_pending(c, fn, &fn->compiles_pending, "compiles", timeout_ms);
}

sj_status sj_compiler_wait_captures(sj_compiler *c, struct sj_fn *fn, int timeout_ms) {
    return wait_pending(c, fn, &fn->captures_pending, "graph captures", timeout_ms);
}

bool sj_compiler_async(const sj_compiler *c) { return c && c->mode == SJ_CM_ASYNC; }

bool sj_compiler_post(void *ctx, void (*run)(void *arg), void (*drop)(void *arg), void *arg) {
    sj_compiler *c = ctx;
    /* with no workers the program steps it (sj_runtime_run_background) as
     * every other kind; sync or off mode: nobody queues, the device keeps it */
    if (!c || c->mode != SJ_CM_ASYNC) return false;
    pthread_mutex_lock(&c->lock);
    bool queued = false;
    if (!c->stop)
        queued = push(c, (job){NULL, NULL, NULL, 0, sj_now_ns(), sj_runtime_now_ns(c->rt), true, false, JOB_DEVICE, arg, run, drop});
    pthread_mutex_unlock(&c->lock);
    return queued;
}

bool sj_compiler_request_capture(sj_compiler *c, struct sj_fn *fn, void *arg) {
    if (!sj_compiler_async(c)) return false;
    pthread_mutex_lock(&c->lock);
    bool queued = false;
    if (!c->stop && !fn->cancelled &&
        push(c, (job){fn, NULL, NULL, 0, sj_now_ns(), sj_runtime_now_ns(c->rt), true, false, JOB_CAPTURE, arg, NULL, NULL})) {
        fn->captures_pending++;
        queued = true;
    }
    pthread_mutex_unlock(&c->lock);
    return queued;
}

int64_t sj_compiler_retry_at(sj_compiler *c, int fails) {
    if (!c) return INT64_MAX;
    pthread_mutex_lock(&c->lock);
    int64_t penalty = penalty_ns(c, fails); /* the jitter's state is under the lock */
    pthread_mutex_unlock(&c->lock);
    if (penalty < 0 || fails >= c->max_failures) return INT64_MAX;
    return sj_runtime_now_ns(c->rt) + penalty;
}

/* -- Kinds: limits and counters ---------------------------------------------------- */

void sj_compiler_job_counters(sj_compiler *c, sj_job_counters *out) {
    memset(out, 0, sizeof *out);
    if (!c) return;
    pthread_mutex_lock(&c->lock);
    out->workers = c->n_workers;
    for (int k = 0; k < JOB_KINDS; k++) {
        out->kind[k].queued = c->n_queued[k];
        out->kind[k].running = c->n_running[k];
        out->kind[k].queue_max = c->queue_max[k];
        out->kind[k].workers_max = c->workers_max[k];
        out->kind[k].ran = c->n_ran[k];
        out->kind[k].dropped = c->n_dropped[k];
    }
    pthread_mutex_unlock(&c->lock);
}

void sj_compiler_set_kind_limits(sj_compiler *c, sj_job_kind kind, int queue_max, int workers_max) {
    if (!c || (int)kind < 0 || kind >= SJ_JOB_KINDS) return;
    pthread_mutex_lock(&c->lock);
    if (queue_max >= 0) c->queue_max[kind] = queue_max;
    if (workers_max >= 0) c->workers_max[kind] = workers_max;
    pthread_cond_broadcast(&c->work); /* a raised limit: jobs may start */
    pthread_mutex_unlock(&c->lock);
}

int sj_compiler_run_device(sj_compiler *c) {
    if (!c || c->mode != SJ_CM_ASYNC || c->n_workers > 0) return 0;
    int n = 0;
    pthread_mutex_lock(&c->lock);
    while (!c->stop && c->n_queued[JOB_DEVICE] > 0) {
        /* the device's jobs alone: take the first queued (they are valued
         * alike; seq order) */
        int best = -1;
        for (int i = 0; i < c->n_jobs; i++)
            if (c->jobs[i].kind == JOB_DEVICE && (best < 0 || c->jobs[i].seq < c->jobs[best].seq)) best = i;
        if (best < 0 || !may_run(c, JOB_DEVICE)) break;
        job j = c->jobs[best];
        unqueue(c, best);
        c->n_running[JOB_DEVICE]++;
        run_job(c, j);
        c->n_running[JOB_DEVICE]--;
        c->n_ran[JOB_DEVICE]++;
        n++;
    }
    pthread_mutex_unlock(&c->lock);
    return n;
}
