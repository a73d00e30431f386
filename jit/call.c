/* The call path: sj_call.
 *
 *   check arguments -> signature of the inputs (on the stack) -> one hash
 *   -> memo (exact signature -> entry + symbol values) under a read lock
 *   -> miss: the entries' guard sets, newest first (lock-free); the entry's
 *      result sizes checked for these inputs (at most 2^48 elements); memoised
 *   -> none passes: retrace under the trace lock, by the policy
 *   -> execute the entry's graph with no lock held (on a device with graph
 *      slots, a fused call may be one graph launch: jit/graphs.c)
 *   -> count the call (hot entries, hot shapes of symbolic entries).
 *
 * A memo hit allocates nothing and takes no lock but the memo's read lock.
 */
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "jit/budget.h"
#include "jit/call.h"
#include "jit/compile.h"
#include "base/clock.h"
#include "base/error.h"
#include "jit/exec.h"
#include "jit/fn.h"
#include "jit/graphs.h"
#include "jit/learn.h"
#include "base/tensor.h"
#include "jit/trace.h"
#include "jit/validate.h"
#include "jit/warmup.h"

#define RELAXED memory_order_relaxed
#define MAX_FAILS 64

/* -- Argument checks ---------------------------------------------------------- */

static sj_status check_args(const sj_fn *fn, const sj_tensor *inputs, int n_inputs, const sj_tensor *outputs,
                            int n_outputs) {
    if (n_inputs != fn->n_inputs)
        return sj_seterr(SJ_EINVAL, "fn '%s': called with %d inputs, expected %d", fn->name, n_inputs, fn->n_inputs);
    if (n_inputs > 0 && !inputs) return sj_seterr(SJ_EINVAL, "fn '%s': inputs is NULL", fn->name);
    if (n_outputs < 0 || n_outputs > SJ_MAX_OUTPUTS)
        return sj_seterr(SJ_EINVAL, "fn '%s': n_outputs %d out of range [0, %d]", fn->name, n_outputs, SJ_MAX_OUTPUTS);
    if (n_outputs > 0 && !outputs) return sj_seterr(SJ_EINVAL, "fn '%s': outputs is NULL", fn->name);
    sj_device dev = fn->rt->backend_kind == SJ_BACKEND_CUDA ? SJ_CUDA : SJ_HOST;
    for (int i = 0; i < n_inputs; i++) {
        if (sj_tensor_valid(&inputs[i]) && inputs[i].device == dev) continue;
        char what[64]; /* the slow path: name the input in the message */
        sj_input_name((const char *const *)fn->input_names, i, what, sizeof what);
        sj_status st = sj_tensor_check(&inputs[i], what);
        if (!st)
            st = sj_seterr(SJ_EINVAL, "%s is %s memory; the %s backend takes %s memory", what,
                           inputs[i].device == SJ_HOST ? "host" : "device", dev == SJ_HOST ? "CPU" : "CUDA",
                           dev == SJ_HOST ? "host" : "device (CUdeviceptr)");
        sj_err_prefix("fn '%s': ", fn->name);
        return st;
    }
    return SJ_OK;
}

/* -- Counting --------------------------------------------------------------- */

/* Entries kept past the recompile limit beside the fallback entry, for
 * shapes it cannot serve. */
#define SJ_EXTRA_ENTRIES 8

static bool at_limit(const sj_fn *fn) {
    return atomic_load_explicit(&fn->table.n_entries, RELAXED) >= fn->policy.limit ||
           atomic_load_explicit(&fn->rt->total_entries, RELAXED) >= fn->rt->cfg.total_recompile_limit;
}

/* Count a call of entry e; a hot entry asks for its plan to be compiled
 * (again, if a queued compile was dropped as cold). */
static void note_call(sj_fn *fn, sj_entry *e, const sj_tensor *inputs, unsigned shard) {
    sj_counter_inc(&e->calls, shard);
    /* until the entry is hot, every call sums the shards (hot_threshold
     * calls, 2 by default); after, only reads of lines nobody writes */
    if (!atomic_load_explicit(&e->hot, RELAXED)) {
        uint64_t c = sj_counter_sum(&e->calls);
        /* back-pressure: a longer compile queue asks for more calls */
        uint64_t th = (uint64_t)fn->policy.hot_threshold * (uint64_t)sj_compiler_backlog(fn->rt->compiler);
        if (c < th || atomic_exchange(&e->hot, true)) return;
        atomic_fetch_add_explicit(&fn->c.hot_entries, 1, RELAXED);
        sj_logf(fn->rt, SJ_LOG_PERF, "fn '%s': entry %d is hot after %llu calls", fn->name, e->id,
                (unsigned long long)c);
        if (e->plan && sj_compiler_wants(fn->rt->compiler, &e->ct)) sj_compiler_request(fn->rt->compiler, fn, e, NULL);
        if (fn->rt->cfg.compile_ahead) sj_warmup_ahead(fn, e, inputs); /* behind e's own compile */
        return;
    }
    if (e->plan && sj_compiler_wants(fn->rt->compiler, &e->ct)) sj_compiler_request(fn->rt->compiler, fn, e, NULL);
}

/* A symbolic entry counts the exact shapes it serves; a shape that reaches
 * the threshold is marked for a specialized compile, within the budget and
 * the recompile limit. */
static void note_shape(sj_fn *fn, sj_memo *m, unsigned shard) {
    sj_entry *e = sj_memo_entry(m);
    if (!e->symbolic) return;
    if (fn->rt->cfg.specialize_max_bytes) sj_budget_touch(fn, m); /* last use, for the memory budget */
    uint64_t th = (uint64_t)fn->policy.specialize_threshold;
    uint64_t c = sj_memo_count(m, shard, th); /* 0: past th, counted in shards */
    if ((c == 0 || c > th) && atomic_load_explicit(&m->hot, RELAXED) && sj_compiler_wants(fn->rt->compiler, &m->ct))
        sj_compiler_request(fn->rt->compiler, fn, e, m); /* re-queue after a cold drop or a penalty */
    if (c != th) return;
    int used = atomic_load_explicit(&fn->specializations, RELAXED);
    if (used >= fn->policy.specialize_budget ||
        atomic_load_explicit(&fn->table.n_entries, RELAXED) + used >= fn->policy.limit)
        return;
    if (atomic_fetch_add(&fn->specializations, 1) >= fn->policy.specialize_budget) return;
    atomic_store(&m->hot, true);
    atomic_fetch_add_explicit(&fn->c.hot_shapes, 1, RELAXED);
    sj_logf(fn->rt, SJ_LOG_PERF, "fn '%s': a shape of entry %d is hot after %llu calls: marked for specialization",
            fn->name, e->id, (unsigned long long)c);
    if (e->plan) sj_compiler_request(fn->rt->compiler, fn, e, m);
}

/* -- Retracing ---------------------------------------------------------------- */

/* Record the failures that led to a retrace: stats, the recent ring, the
 * callback. Under the trace lock. */
static void record_failures(sj_fn *fn, const sj_guard_failure *fails, int n) {
    for (int i = 0; i < n; i++) {
        atomic_fetch_add_explicit(&fn->c.guard_failures[fails[i].kind], 1, RELAXED);
        fn->recent[fn->n_recent++ % SJ_RECENT_FAILURES] = fails[i];
        if (fn->on_guard_fail) fn->on_guard_fail(fn->on_guard_fail_user, &fails[i]);
    }
}

static void summarize(const sj_guard_failure *fails, int n, char *buf, size_t size) {
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; i < n && used < size; i++)
        used += (size_t)snprintf(buf + used, size - used, "%sentry %d: %s", i ? "; " : "", fails[i].entry, fails[i].message);
}

static void log_guards(const sj_fn *fn, const sj_entry *e) {
    if (!sj_log_on(fn->rt, SJ_LOG_GUARDS)) return;
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) return;
    sj_guard_print(e->head.guards, f, "  ");
    fclose(f);
    sj_logf(fn->rt, SJ_LOG_GUARDS, "fn '%s': entry %d (%s) guards:", fn->name, e->id, e->what);
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) sj_logf(fn->rt, SJ_LOG_GUARDS, "%s", line);
    free(text);
}

/* The structured event of a retrace: the new entry, the call's input
 * sizes, the guards that failed. */
static void emit_recompile(const sj_fn *fn, const sj_tensor *in, const sj_entry *e, const char *why) {
    if (!sj_log_wants_events(&fn->rt->log)) return;
    char shape[192];
    size_t used = 0;
    shape[0] = '\0';
    for (int i = 0; i < fn->n_inputs && used < sizeof shape; i++) {
        used += (size_t)snprintf(shape + used, sizeof shape - used, "%s[", i ? ", " : "");
        for (int a = 0; a < in[i].rank && used < sizeof shape; a++)
            used += (size_t)snprintf(shape + used, sizeof shape - used, "%s%lld", a ? ", " : "", (long long)in[i].shape[a]);
        if (used < sizeof shape) used += (size_t)snprintf(shape + used, sizeof shape - used, "]");
    }
    sj_emit(fn->rt, (sj_event){.kind = SJ_EVENT_RECOMPILE, .topic = SJ_LOG_RECOMPILES, .fn = fn->name, .entry = e->id,
                               .shape = shape, .error = why,
                               .count = atomic_load_explicit(&fn->table.n_entries, RELAXED) + 1});
}

/* Build the entry for a trace of `in` under plan. On success *out is a new,
 * unpublished entry whose guards pass for `in` (sym_vals filled). */
static sj_status make_entry(sj_fn *fn, const sj_tensor *in, sj_plan *plan, int64_t *sym_vals, sj_entry **out) {
    const char *const *names = (const char *const *)fn->input_names;
    sj_trace_req req = {.fn_name = fn->name, .model = fn->model, .user = fn->user, .inputs = in,
                        .n_inputs = fn->n_inputs, .dim_policy = sj_plan_dim, .dim_ctx = plan,
                        .device = fn->rt->backend_kind == SJ_BACKEND_CUDA ? SJ_CUDA : SJ_HOST};
    sj_trace_result res;
    sj_status st = sj_trace(&req, &res);
    if (st) return st;
    sj_graph *g = res.graph;
    st = sj_plan_check_facts(plan, g->ex, res.facts, res.n_facts);
    if (st) sj_err_prefix("fn '%s': ", fn->name);

    sj_entry *e = NULL;
    if (!st) {
        sj_guard_input gi[SJ_MAX_INPUTS];
        for (int i = 0; i < fn->n_inputs; i++) {
            const sj_value *v = &g->vals[i]; /* inputs are the first values */
            gi[i] = (sj_guard_input){.dtype = in[i].dtype, .rank = in[i].rank, .device = in[i].device,
                                     .contiguous = sj_tensor_is_contiguous(&in[i])};
            for (int a = 0; a < in[i].rank; a++) {
                gi[i].dim[a] = v->shape[a];
                gi[i].stride[a] = in[i].stride[a];
            }
        }
        e = sj_calloc(1, sizeof *e);
        if (e) {
            e->id = atomic_load_explicit(&fn->table.n_entries, RELAXED);
            e->g = g;
            e->head.guards = sj_guard_build(g->ex, gi, fn->n_inputs, res.facts, res.n_facts, names, e->id);
        }
        if (!e || !e->head.guards) {
            st = sj_seterr(SJ_ENOMEM, "fn '%s': out of memory building guards", fn->name);
        } else {
            sj_guard_failure f;
            if (!sj_guard_check(e->head.guards, in, sym_vals, &f))
                st = sj_seterr(SJ_EINTERNAL, "fn '%s': the new trace's guards reject the inputs that made it: %s",
                               fn->name, f.message);
        }
    }
    if (!st) sj_plan_describe(plan, in, g->ex, res.facts, res.n_facts, e->what, sizeof e->what);
    for (int s = 0; !st && s < sj_sym_count(g->ex) && s < 64; s++)
        if (sj_plan_sym_pinned(g->ex, res.facts, res.n_facts, s)) e->pinned_syms |= UINT64_C(1) << s;
    free(res.facts);
    if (st) {
        if (e) sj_entry_free(e); /* frees g too */
        else sj_graph_destroy(g);
        return st;
    }
    e->head.n_syms = sj_sym_count(g->ex);
    e->symbolic = e->head.n_syms > 0;
    for (int i = 0; i < fn->n_inputs; i++)
        for (int a = 0; a < in[i].rank; a++) e->bucketed |= plan->dims[i][a].bucketed;
    e->fallback = plan->fallback;
    sj_ctarget_init(&e->ct);
    e->created_ns = sj_now_ns();
    /* before publishing: it adds to the graph's expressions */
    const sj_backend *bk = fn->rt->backend;
    e->plan = sj_fuse_ex(g, in, &(sj_fuse_opts){.gemm = bk->device == SJ_CUDA && fn->rt->cfg.cuda_gemm,
                                                .gemm_ln = fn->rt->cfg.cuda_gemm_ln != 0,
                                                .gemm_arch = bk->arch, .gemm_units = bk->units,
                                                .pinned = e->pinned_syms});
    if (!e->plan) sj_logf(fn->rt, SJ_LOG_WARN, "fn '%s': out of memory planning fusion; the entry runs eagerly", fn->name);
    if (fn->packs) {
        int n = sj_exec_prepack(g, fn->packs, fn->rt->cfg.prepack_max_bytes);
        if (n) sj_logf(fn->rt, SJ_LOG_PERF, "fn '%s': entry %d: %d products over packed constant weights", fn->name, e->id, n);
    }
    sj_backend *dev = fn->rt->backend;
    if (dev->upload && (st = dev->upload(dev, g))) { /* device copies of constants and host parameters */
        sj_err_prefix("fn '%s': ", fn->name);
        sj_entry_free(e);
        return st;
    }
    *out = e;
    return SJ_OK;
}

/* No entry's guards pass: trace a new one by the policy. *transient is set
 * when the entry is not kept (past the limit with a fallback entry already
 * made): the caller runs it once and frees it. */
static sj_status retrace(sj_fn *fn, const sj_tensor *in, int64_t *sym_vals, sj_entry **out, bool *transient) {
    *transient = false;
    pthread_mutex_lock(&fn->trace_lock);
    sj_guard_failure fails[MAX_FAILS];
    int nf = 0;
    sj_entry *e = sj_entry_match(&fn->table, in, sym_vals, fails, MAX_FAILS, &nf);
    if (e) { /* another thread traced it meanwhile */
        pthread_mutex_unlock(&fn->trace_lock);
        *out = e;
        return SJ_OK;
    }
    char why[1024];
    summarize(fails, nf, why, sizeof why);

    record_failures(fn, fails, nf); /* whether or not the retrace succeeds */
    sj_status st = SJ_OK;
    bool fallback = false, extra = false;
    if (atomic_load_explicit(&fn->table.n_entries, RELAXED) > 0 && at_limit(fn)) {
        atomic_fetch_add_explicit(&fn->c.limit_hits, 1, RELAXED);
        const char *last = nf ? fails[0].message : "";
        if (fn->policy.limit_is_error) {
            st = sj_seterr(SJ_ELIMIT, "fn '%s': recompile limit reached (%d entries here, %d in the runtime); last failure: %s",
                           fn->name, atomic_load(&fn->table.n_entries), atomic_load(&fn->rt->total_entries), last);
            goto done;
        }
        if (!fn->limit_logged) {
            fn->limit_logged = true;
            sj_logf(fn->rt, SJ_LOG_WARN,
                    "fn '%s': recompile limit reached (%d entries); new shapes are served by a symbolic entry for the "
                    "sizes that vary; last failure: %s",
                    fn->name, atomic_load(&fn->table.n_entries), last);
        }
        fallback = true;
        /* A shape the fallback entry cannot serve (a size of 0 or 1 is
         * always specialized) would be traced again on every call: the
         * first few such get entries of their own; past those, one-off. */
        *transient = fn->fallback_made && fn->extra_entries >= SJ_EXTRA_ENTRIES;
        extra = fn->fallback_made && !*transient;
    }

    sj_plan *plan = sj_malloc(sizeof *plan);
    if (!plan) {
        st = sj_seterr(SJ_ENOMEM, "fn '%s': out of memory planning a trace", fn->name);
        goto done;
    }
    st = sj_policy_plan(&fn->policy, in, fallback, (const char *const *)fn->input_names, plan);
    if (st) sj_err_prefix("fn '%s': ", fn->name);
    if (!st) st = make_entry(fn, in, plan, sym_vals, &e);
    free(plan);
    if (st) {
        atomic_fetch_add_explicit(&fn->c.trace_errors, 1, RELAXED);
        goto done;
    }
    snprintf(e->reason, sizeof e->reason, "%s", nf ? why : "first call");
    sj_policy_observe(&fn->policy, in);
    atomic_fetch_add_explicit(&fn->c.traces, 1, RELAXED);
    if (fallback) fn->fallback_made = true;
    if (extra) fn->extra_entries++;
    if (atomic_load_explicit(&fn->table.n_entries, RELAXED) > 0) {
        sj_logf(fn->rt, SJ_LOG_RECOMPILES, "fn '%s': retrace -> entry %d (%s%s) because %s", fn->name, e->id, e->what,
                *transient ? ", not kept: past the recompile limit" : "", why);
        emit_recompile(fn, in, e, why);
    } else
        sj_logf(fn->rt, SJ_LOG_TRACE, "fn '%s': traced entry %d (%s): %d nodes", fn->name, e->id, e->what, e->g->n_nodes);
    log_guards(fn, e);
    if (e->plan && sj_log_on(fn->rt, SJ_LOG_FUSION)) {
        char *text = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&text, &len);
        if (f) {
            sj_fplan_print(e->g, e->plan, NULL, f, "  ");
            fclose(f);
            sj_logf(fn->rt, SJ_LOG_FUSION, "fn '%s': entry %d: %d kernels:", fn->name, e->id, e->plan->n_groups);
            for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n"))
                sj_logf(fn->rt, SJ_LOG_FUSION, "%s", line);
            free(text);
        }
    }
    if (!*transient) {
        sj_entry_publish(&fn->table, e);
        atomic_fetch_add(&fn->rt->total_entries, 1);
        atomic_fetch_add_explicit(e->symbolic ? &fn->c.symbolic_entries : &fn->c.static_entries, 1, RELAXED);
    }
    *out = e;
done:
    pthread_mutex_unlock(&fn->trace_lock);
    return st;
}

/* -- sj_call ------------------------------------------------------------------ */

static sj_status call(sj_fn *fn, const sj_tensor *inputs, int n_inputs, sj_tensor *outputs, int n_outputs,
                      void *stream, bool sync);

sj_status sj_call(sj_fn *fn, const sj_tensor *inputs, int n_inputs, sj_tensor *outputs, int n_outputs) {
    return call(fn, inputs, n_inputs, outputs, n_outputs, NULL, true);
}

sj_status sj_call_stream(sj_fn *fn, const sj_tensor *inputs, int n_inputs, sj_tensor *outputs, int n_outputs,
                         void *stream) {
    return call(fn, inputs, n_inputs, outputs, n_outputs, stream, false);
}

/* A memo miss: the newest entry whose guards pass, else a retrace; then
 * the sizes check (once per signature) and the memo. *m is the memo item
 * (NULL when not memoised: a transient entry, or a full memo); sym_vals
 * receives the symbol values. */
static sj_status resolve_miss(sj_fn *fn, const sj_tensor *inputs, const int64_t *sig, int words, unsigned h,
                              int64_t *sym_vals, sj_memo **m, sj_entry **out, bool *transient) {
    *m = NULL;
    *transient = false;
    sj_entry *e = sj_entry_match(&fn->table, inputs, sym_vals, NULL, 0, NULL);
    sj_status st;
    if (!e && (st = retrace(fn, inputs, sym_vals, &e, transient))) return st;
    if ((st = sj_exec_check_sizes(e->g, sym_vals, &fn->pool, fn->name))) {
        if (*transient) sj_entry_free(e);
        return st;
    }
    if (!*transient) *m = sj_memo_add(&fn->table, sig, words, h, e, sym_vals);
    *out = e;
    return SJ_OK;
}

/* Run entry e for one call with the best code ready: this shape's
 * specialization, else the entry's, never a unit validation rejected
 * (checks_left < 0); else eagerly. A unit still being validated (its first
 * validate_calls runs, then 1 call in validate_every) runs eagerly for the
 * caller and fused beside it (jit/validate.h). Returns the call's status
 * and, in *tier, the shard counter of the tier that served it (a
 * validation: eager). warm (sj_call_warm_run): never launched as a CUDA
 * graph (a warm-up run is not a call: it counts no graph call), validated
 * like a unit's first calls but never for validate_every, and with capture
 * its buffers are captured into a graph at once. */
enum { RUN_CALL, RUN_WARM, RUN_WARM_CAPTURE };

static sj_status execute(sj_fn *fn, sj_memo *m, sj_entry *e, const int64_t *syms, bool transient,
                         const sj_tensor *inputs, sj_tensor *outputs, void *stream, bool sync, int run,
                         unsigned shard, _Atomic uint64_t **tier_out) {
    sj_fn_shard *hot = &fn->hot[shard];
    sj_status st;
    void *capture = NULL; /* sync mode: a graph capture this thread runs after the call */
    /* marked while it may use a shape's code or graphs (a demotion or an
     * eviction frees them after) */
    int phase = sj_budget_enter(fn, shard);
    sj_compiled *cd = m ? atomic_load_explicit(&m->ct.ready, memory_order_seq_cst) : NULL;
    int checks = cd ? atomic_load_explicit(&cd->checks_left, RELAXED) : 0;
    sj_memo *cm = m; /* whose target cd is: the shape's, or (NULL) the entry's */
    _Atomic uint64_t *tier = &hot->fused_spec_calls;
    if (checks < 0) cd = NULL;
    if (!cd && !transient) {
        cd = atomic_load_explicit(&e->ct.ready, memory_order_acquire);
        checks = cd ? atomic_load_explicit(&cd->checks_left, RELAXED) : 0;
        if (checks < 0) cd = NULL;
        cm = NULL;
        if (e->head.n_syms) tier = &hot->fused_sym_calls;
    }
    int every = fn->rt->cfg.validate_every;
    bool validate = cd && (checks > 0 || (run == RUN_CALL && every > 0 && !transient &&
                                          atomic_load_explicit(&e->calls.s[shard].v, RELAXED) % (uint64_t)every == 0));
    sj_backend *dev = fn->rt->backend;
    sj_dev_call dc;
    sj_exec x = {.rt = fn->rt, .g = e->g, .fn_name = fn->name, .inputs = inputs, .outputs = outputs,
                 .sym_vals = syms, .pool = &fn->pool, .arena_hint = &e->arena_hint, .ops = dev,
                 .ops_ctx = dev->call_begin(dev, &dc, stream, sync, validate /* a validation waits */, e->head.n_syms),
                 .gemm_pick = cd ? cd->gemm_pick : NULL};
    if (cd && validate && sj_exec_fused_ok(&x)) {
        sj_validation v;
        st = sj_validate_call(&x, e->plan, cd->fns, &v); /* the caller gets the eager result */
        tier = &hot->eager_calls;
        atomic_fetch_add_explicit(&fn->c.validations, 1, RELAXED);
        if (!st && v.differs) {
            sj_compiler_reject(fn->rt->compiler, fn, e, cm, cd, v.why);
        } else if (!st && !v.inconclusive) {
            int ck = atomic_load_explicit(&cd->checks_left, RELAXED);
            while (ck > 0 && !atomic_compare_exchange_weak(&cd->checks_left, &ck, ck - 1)) {
            }
        }
    } else if (cd && sj_exec_fused_ok(&x)) {
        sj_graph_use gu = !dev->graph_capture ? SJ_GRAPH_NO
                          : run == RUN_CALL ? sj_graphs_call(fn, m, &x, cd, &st)
                          : SJ_GRAPH_COUNT;
        if (gu != SJ_GRAPH_SERVED) { /* (a graph served call counted its graph call; its tier is cd's) */
            st = sj_exec_fused(&x, e->plan, cd->fns);
            if (!st && gu == SJ_GRAPH_COUNT && run == RUN_CALL) capture = sj_graphs_note(fn, m, &x, e->plan, cd);
            if (!st && m && run != RUN_CALL)
                capture = sj_graphs_request(fn, m, &x, e->plan, cd, run == RUN_WARM_CAPTURE);
        }
    } else {
        /* what an eager call costs (the compile queue's value): 1 call in 16
         * of each thread is timed, so threads do not all write the
         * entry's two counters on every call */
        bool timed = !transient && (atomic_load_explicit(&e->calls.s[shard].v, RELAXED) & 15) == 1;
        int64_t t0 = timed ? sj_now_ns() : 0;
        st = sj_exec_eager(&x);
        if (timed) {
            atomic_fetch_add_explicit(&e->eager_ns, (uint64_t)(sj_now_ns() - t0), RELAXED);
            atomic_fetch_add_explicit(&e->eager_timed, 1, RELAXED);
        }
        tier = &hot->eager_calls;
    }
    if (dev->call_end) {
        /* a transient entry's device constants are freed with it: the
         * call's stream must be done with them first */
        sj_status est = dev->call_end(dev, x.ops_ctx, transient);
        if (!st) st = est;
    }
    sj_budget_leave(fn, shard, phase);
    if (capture) sj_graphs_capture_run(fn, capture); /* unmarked: it may wait for calls to leave graphs */
    *tier_out = tier;
    return st;
}

static sj_status call(sj_fn *fn, const sj_tensor *inputs, int n_inputs, sj_tensor *outputs, int n_outputs,
                      void *stream, bool sync) {
    sj_clearerr();
    if (!fn) return sj_seterr(SJ_EINVAL, "sj_call: fn is NULL");
    sj_status st = check_args(fn, inputs, n_inputs, outputs, n_outputs);
    if (st) goto fail;

    int64_t sig[SJ_SIG_WORDS_MAX];
    int64_t local_syms[SJ_MAX_SYMS];
    int words = sj_sig_pack(inputs, n_inputs, sig);
    unsigned h = sj_sig_hash(sig, words);
    const int64_t *syms;
    bool transient = false;
    sj_entry *e;
    unsigned shard = sj_shard_index();
    sj_fn_shard *hot = &fn->hot[shard];
    sj_memo *m = sj_memo_find(&fn->table, sig, words, h);
    if (m) {
        e = sj_memo_entry(m);
        syms = m->head.syms;
        /* every 64th hit of the shard: is a learning due by calls? */
        sj_learn_note_hit(fn, atomic_fetch_add_explicit(&hot->memo_hits, 1, RELAXED) + 1);
        note_shape(fn, m, shard);
    } else {
        atomic_fetch_add_explicit(&hot->guard_evals, 1, RELAXED);
        if ((st = resolve_miss(fn, inputs, sig, words, h, local_syms, &m, &e, &transient))) goto fail;
        if (m) {
            note_shape(fn, m, shard);
            sj_learn_note_shape(fn); /* a new exact shape: may queue a bucket learning */
        }
        syms = local_syms;
    }

    if (e->g->n_outputs != n_outputs) {
        st = sj_seterr(SJ_EINVAL, "fn '%s': called with %d outputs, the model produces %d", fn->name, n_outputs,
                       e->g->n_outputs);
        if (transient) sj_entry_free(e);
        goto fail;
    }
    if (!transient) note_call(fn, e, inputs, shard); /* may compile here in sync mode */

    _Atomic uint64_t *tier;
    st = execute(fn, m, e, syms, transient, inputs, outputs, stream, sync, RUN_CALL, shard, &tier);
    if (transient) sj_entry_free(e);
    if (st) goto fail;
    atomic_fetch_add_explicit(tier, 1, RELAXED); /* and so to calls */
    return SJ_OK;

fail:
    if (fn) atomic_fetch_add_explicit(&fn->c.errors, 1, RELAXED);
    return st;
}

/* -- Warm-up (jit/warmup.c) ------------------------------------------------------ */

sj_status sj_call_prepare(sj_fn *fn, const sj_tensor *inputs, int64_t *sym_vals, sj_memo **m, sj_entry **e,
                          bool *transient) {
    int64_t sig[SJ_SIG_WORDS_MAX];
    int words = sj_sig_pack(inputs, fn->n_inputs, sig);
    unsigned h = sj_sig_hash(sig, words);
    *transient = false;
    if ((*m = sj_memo_find(&fn->table, sig, words, h))) {
        *e = sj_memo_entry(*m);
        memcpy(sym_vals, (*m)->head.syms, sizeof(int64_t) * (size_t)(*e)->head.n_syms);
        return SJ_OK;
    }
    return resolve_miss(fn, inputs, sig, words, h, sym_vals, m, e, transient);
}

sj_status sj_call_warm_run(sj_fn *fn, sj_memo *m, sj_entry *e, const int64_t *syms, const sj_tensor *inputs,
                           sj_tensor *outputs, int n_outputs, bool capture, const char **tier) {
    if (e->g->n_outputs != n_outputs)
        return sj_seterr(SJ_EINVAL, "fn '%s': %d outputs given, the model produces %d", fn->name, n_outputs,
                         e->g->n_outputs);
    unsigned shard = sj_shard_index();
    sj_fn_shard *hot = &fn->hot[shard]; /* only to name the tier: nothing is counted there */
    _Atomic uint64_t *t;
    sj_status st = execute(fn, m, e, syms, false, inputs, outputs, NULL, true, capture ? RUN_WARM_CAPTURE : RUN_WARM,
                           shard, &t);
    *tier = t == &hot->eager_calls ? "eager" : t == &hot->fused_sym_calls ? "fused symbolic" : "fused specialized";
    return st;
}
