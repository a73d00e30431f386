/* Functions: lifecycle, options, marks and buckets, stats, explain. The
 * call path is in call.c. */
#include "base/alloc.h"
#include "jit/fn.h"

#include <stdlib.h>
#include <string.h>

#include "jit/budget.h"
#include "jit/compile.h"
#include "base/clock.h"
#include "base/error.h"
#include "base/tunables.h"
#include "jit/graphs.h"
#include "jit/learn.h"
#include "jit/warmup.h"
#include "kernels/device.h"
#include "kernels/cpu/prepack.h"

#define RELAXED memory_order_relaxed

/* -- Options ------------------------------------------------------------------ */

void sj_fn_options_init(sj_fn_options *opt) {
    if (opt) memset(opt, 0, sizeof *opt);
}

static int pick(int v, int dflt) { return v ? v : dflt; }

static sj_status check_options(const sj_fn_options *o) {
    if ((unsigned)o->dynamic > SJ_DYNAMIC_SYMBOLIC)
        return sj_seterr(SJ_EINVAL, "sj_fn_create: dynamic %d is not a policy", (int)o->dynamic);
    const struct {
        sj_tunable_id id;
        int v;
    } f[] = {{SJ_TUNE_recompile_limit, o->recompile_limit},
             {SJ_TUNE_hot_threshold, o->hot_threshold},
             {SJ_TUNE_specialize_threshold, o->specialize_threshold},
             {SJ_TUNE_specialize_budget, o->specialize_budget}};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        if (f[i].v != 0 && !sj_tunable_int_ok(f[i].id, f[i].v))
            return sj_seterr(SJ_EINVAL, "sj_fn_create: %s %d out of range [%lld, %lld] (0: the runtime's default)",
                             sj_tunables[f[i].id].field, f[i].v, (long long)sj_tunables[f[i].id].lo,
                             (long long)sj_tunables[f[i].id].hi);
    return SJ_OK;
}

/* Buckets from the runtime's SHAPEJIT_BUCKETS rules that name this function
 * (or '*'). A named rule with an input or axis this function lacks is an
 * error; a '*' rule simply does not apply. */
static sj_status apply_bucket_rules(sj_fn *fn) {
    const sj_runtime *rt = fn->rt;
    for (int i = 0; i < rt->n_bucket_rules; i++) {
        const sj_bucket_rule *r = &rt->bucket_rules[i];
        bool any = !strcmp(r->fn_name, "*");
        if (!any && strcmp(r->fn_name, fn->name)) continue;
        if (r->input < 0 || r->input >= fn->n_inputs || r->axis < 0 || r->axis >= SJ_MAX_RANK) {
            if (any) continue;
            return sj_seterr(SJ_EINVAL, "sj_fn_create: SHAPEJIT_BUCKETS names input %d axis %d of fn '%s', which has %d inputs",
                             r->input, r->axis, fn->name, fn->n_inputs);
        }
        sj_bucket_spec *spec = sj_malloc(sizeof *spec);
        if (!spec) return sj_seterr(SJ_ENOMEM, "sj_fn_create: out of memory");
        *spec = r->spec;
        sj_policy_set_bucket(&fn->policy, r->input, r->axis, spec);
    }
    return SJ_OK;
}

/* -- Lifecycle ------------------------------------------------------------------ */

static void free_names(char **names, int n) {
    if (!names) return;
    for (int i = 0; i < n; i++) free(names[i]);
    free(names);
}

sj_status sj_fn_create(sj_runtime *rt, const char *name, int n_inputs, sj_model_fn model, void *user,
                       const sj_fn_options *opt, sj_fn **out) {
    sj_clearerr();
    if (!out) return sj_seterr(SJ_EINVAL, "sj_fn_create: fn is NULL");
    *out = NULL;
    if (!rt) return sj_seterr(SJ_EINVAL, "sj_fn_create: rt is NULL");
    if (!model) return sj_seterr(SJ_EINVAL, "sj_fn_create: model is NULL");
    if (n_inputs < 0 || n_inputs > SJ_MAX_INPUTS)
        return sj_seterr(SJ_EINVAL, "sj_fn_create: n_inputs %d out of range [0, %d]", n_inputs, SJ_MAX_INPUTS);
    sj_fn_options o;
    sj_fn_options_init(&o);
    if (opt) o = *opt;
    sj_status st = check_options(&o);
    if (st) return st;

    /* 64-byte aligned: the call counters' shards are a cache line each */
    size_t fn_bytes = (sizeof(sj_fn) + 63) & ~(size_t)63;
    sj_fn *fn = sj_aligned_alloc(64, fn_bytes);
    if (!fn) return sj_seterr(SJ_ENOMEM, "sj_fn_create: out of memory");
    memset(fn, 0, fn_bytes);
    fn->rt = rt;
    fn->n_inputs = n_inputs;
    fn->model = model;
    fn->user = user;
    fn->on_guard_fail = o.on_guard_fail;
    fn->on_guard_fail_user = o.on_guard_fail_user;
    fn->name = sj_strdup(name ? name : "fn");
    bool ok = fn->name != NULL;
    if (ok && o.input_names) {
        fn->input_names = sj_calloc((size_t)(n_inputs ? n_inputs : 1), sizeof *fn->input_names);
        ok = fn->input_names != NULL;
        for (int i = 0; ok && i < n_inputs; i++)
            if (o.input_names[i]) ok = (fn->input_names[i] = sj_strdup(o.input_names[i])) != NULL;
    }
    bool locks = false, table = false, pool = false, policy = false;
    if (ok) ok = locks = !pthread_mutex_init(&fn->trace_lock, NULL);
    if (ok && pthread_mutex_init(&fn->warm_lock, NULL)) {
        pthread_mutex_destroy(&fn->trace_lock);
        ok = locks = false;
    }
    if (ok && pthread_mutex_init(&fn->retire_lock, NULL)) {
        pthread_mutex_destroy(&fn->warm_lock);
        pthread_mutex_destroy(&fn->trace_lock);
        ok = locks = false;
    }
    if (ok && pthread_mutex_init(&fn->graph_lock, NULL)) {
        pthread_mutex_destroy(&fn->retire_lock);
        pthread_mutex_destroy(&fn->warm_lock);
        pthread_mutex_destroy(&fn->trace_lock);
        ok = locks = false;
    }
    if (ok && pthread_cond_init(&fn->warm_cond, NULL)) {
        pthread_mutex_destroy(&fn->graph_lock);
        pthread_mutex_destroy(&fn->retire_lock);
        pthread_mutex_destroy(&fn->warm_lock);
        pthread_mutex_destroy(&fn->trace_lock);
        ok = locks = false;
    }
    if (ok) ok = table = !sj_table_init(&fn->table, &sj_entry_items, rt);
    if (ok) ok = pool = !sj_pool_init(&fn->pool, rt);
    if (ok) ok = policy = !sj_policy_init(&fn->policy, n_inputs);
    if (ok && rt->backend_kind == SJ_BACKEND_CPU && rt->cfg.prepack_max_bytes > 0)
        ok = (fn->packs = sj_cpu_pack_cache_create()) != NULL; /* the bound: sj_exec_prepack's */
    if (ok) {
        sj_policy *p = &fn->policy;
        p->dynamic = o.dynamic;
        p->limit = pick(o.recompile_limit, rt->cfg.recompile_limit);
        p->limit_is_error = o.limit_is_error != 0;
        p->hot_threshold = pick(o.hot_threshold, rt->cfg.hot_threshold);
        p->specialize_threshold = pick(o.specialize_threshold, rt->cfg.specialize_threshold);
        p->specialize_budget = pick(o.specialize_budget, rt->cfg.specialize_budget);
        st = apply_bucket_rules(fn);
    } else {
        st = sj_seterr(SJ_ENOMEM, "sj_fn_create: out of memory");
    }
    if (st) {
        sj_cpu_pack_cache_destroy(fn->packs);
        if (policy) sj_policy_free(&fn->policy);
        if (pool) sj_pool_destroy(&fn->pool);
        if (table) sj_table_destroy(&fn->table);
        if (locks) {
            pthread_cond_destroy(&fn->warm_cond);
            pthread_mutex_destroy(&fn->graph_lock);
            pthread_mutex_destroy(&fn->retire_lock);
            pthread_mutex_destroy(&fn->warm_lock);
            pthread_mutex_destroy(&fn->trace_lock);
        }
        free_names(fn->input_names, n_inputs);
        free(fn->name);
        free(fn);
        return st;
    }
    atomic_init(&fn->specializations, 0);
    sj_learn_init(fn);
    atomic_init(&fn->warm_state, SJ_WARM_NONE);

    pthread_mutex_lock(&rt->lock);
    fn->next_in_rt = rt->fns;
    rt->fns = fn;
    pthread_mutex_unlock(&rt->lock);
    *out = fn;
    return SJ_OK;
}

void sj_runtime_unlink_fn(sj_runtime *rt, sj_fn *fn) {
    pthread_mutex_lock(&rt->lock);
    for (sj_fn **p = &rt->fns; *p; p = &(*p)->next_in_rt)
        if (*p == fn) {
            *p = fn->next_in_rt;
            break;
        }
    pthread_mutex_unlock(&rt->lock);
}

void sj_fn_destroy(sj_fn *fn) {
    if (!fn) return;
    sj_warmup_stop(fn);                          /* a warm-up starts nothing new */
    sj_compiler_cancel_fn(fn->rt->compiler, fn); /* no compile nor capture touches fn after this */
    sj_warmup_join(fn);                          /* nor the warm-up thread */
    sj_runtime_unlink_fn(fn->rt, fn);
    atomic_fetch_sub(&fn->rt->total_entries, atomic_load(&fn->table.n_entries));
    sj_table_destroy(&fn->table);
    sj_budget_free_parked(fn); /* after the graphs that launch them */
    sj_policy_free(&fn->policy);
    sj_pool_destroy(&fn->pool);
    sj_cpu_pack_cache_destroy(fn->packs); /* after the entries that read it */
    sj_warmup_free(fn);
    pthread_mutex_destroy(&fn->retire_lock);
    pthread_mutex_destroy(&fn->graph_lock);
    pthread_cond_destroy(&fn->warm_cond);
    pthread_mutex_destroy(&fn->warm_lock);
    pthread_mutex_destroy(&fn->trace_lock);
    free_names(fn->input_names, fn->n_inputs);
    free(fn->name);
    free(fn);
}

/* -- Marks and buckets ----------------------------------------------------------- */

static sj_status dim_args(const char *what, const sj_fn *fn, int input, int axis) {
    sj_clearerr();
    if (!fn) return sj_seterr(SJ_EINVAL, "%s: fn is NULL", what);
    if (input < 0 || input >= fn->n_inputs)
        return sj_seterr(SJ_EINVAL, "%s: input %d out of range [0, %d) of fn '%s'", what, input, fn->n_inputs, fn->name);
    if (axis < 0 || axis >= SJ_MAX_RANK)
        return sj_seterr(SJ_EINVAL, "%s: axis %d out of range [0, %d)", what, axis, SJ_MAX_RANK);
    return SJ_OK;
}

sj_status sj_mark_dynamic(sj_fn *fn, int input, int axis, int64_t min, int64_t max) {
    sj_status st = dim_args("sj_mark_dynamic", fn, input, axis);
    if (st) return st;
    if (min < 0 || max < min)
        return sj_seterr(SJ_EINVAL, "sj_mark_dynamic: range [%lld, %lld] is empty or negative", (long long)min,
                         (long long)max);
    pthread_mutex_lock(&fn->trace_lock);
    sj_policy_mark_dynamic(&fn->policy, input, axis, min, max);
    pthread_mutex_unlock(&fn->trace_lock);
    return SJ_OK;
}

sj_status sj_mark_static(sj_fn *fn, int input, int axis) {
    sj_status st = dim_args("sj_mark_static", fn, input, axis);
    if (st) return st;
    pthread_mutex_lock(&fn->trace_lock);
    sj_policy_mark_static(&fn->policy, input, axis);
    pthread_mutex_unlock(&fn->trace_lock);
    return SJ_OK;
}

static sj_status set_bucket(sj_fn *fn, int input, int axis, const sj_bucket_spec *spec) {
    sj_bucket_spec *copy = sj_malloc(sizeof *copy);
    if (!copy) return sj_seterr(SJ_ENOMEM, "buckets: out of memory");
    *copy = *spec;
    pthread_mutex_lock(&fn->trace_lock);
    sj_policy_set_bucket(&fn->policy, input, axis, copy);
    pthread_mutex_unlock(&fn->trace_lock);
    return SJ_OK;
}

#define BUCKET_API(fname, label, build)                                                            \
    {                                                                                              \
        sj_status st = dim_args(label, fn, input, axis);                                           \
        if (st) return st;                                                                         \
        sj_bucket_spec spec;                                                                       \
        if ((st = build)) {                                                                        \
            sj_err_prefix(label ": ");                                                             \
            return st;                                                                             \
        }                                                                                          \
        return set_bucket(fn, input, axis, &spec);                                                 \
    }

sj_status sj_set_buckets(sj_fn *fn, int input, int axis, const int64_t *bounds, int n)
    BUCKET_API(sj_set_buckets, "sj_set_buckets", sj_bucket_list(&spec, bounds, n))
sj_status sj_set_buckets_pow2(sj_fn *fn, int input, int axis, int64_t lo, int64_t hi)
    BUCKET_API(sj_set_buckets_pow2, "sj_set_buckets_pow2", sj_bucket_pow2(&spec, lo, hi))
sj_status sj_set_buckets_multiple(sj_fn *fn, int input, int axis, int64_t n)
    BUCKET_API(sj_set_buckets_multiple, "sj_set_buckets_multiple", sj_bucket_multiple(&spec, n))
sj_status sj_set_profile(sj_fn *fn, int input, int axis, int64_t min, int64_t opt, int64_t max)
    BUCKET_API(sj_set_profile, "sj_set_profile", sj_bucket_profile(&spec, min, opt, max))

/* -- Stats ------------------------------------------------------------------------ */

void sj_fn_stats(const sj_fn *cfn, sj_stats *out) {
    if (!out) return;
    memset(out, 0, sizeof *out);
    if (!cfn) return;
    sj_fn *fn = (sj_fn *)cfn; /* atomics are read through a non-const pointer */
    sj_fn_counters *c = &fn->c;
    for (int k = 0; k < SJ_SHARDS; k++) {
        sj_fn_shard *h = &fn->hot[k];
        out->memo_hits += atomic_load_explicit(&h->memo_hits, RELAXED);
        out->guard_evals += atomic_load_explicit(&h->guard_evals, RELAXED);
        out->eager_calls += atomic_load_explicit(&h->eager_calls, RELAXED);
        out->fused_symbolic_calls += atomic_load_explicit(&h->fused_sym_calls, RELAXED);
        out->fused_specialized_calls += atomic_load_explicit(&h->fused_spec_calls, RELAXED);
        out->graph_calls += atomic_load_explicit(&h->graph_calls, RELAXED);
    }
    out->calls = out->eager_calls + out->fused_symbolic_calls + out->fused_specialized_calls;
    out->errors = atomic_load_explicit(&c->errors, RELAXED);
    out->traces = atomic_load_explicit(&c->traces, RELAXED);
    out->trace_errors = atomic_load_explicit(&c->trace_errors, RELAXED);
    for (int k = 0; k < SJ_GUARD_KIND_COUNT; k++)
        out->guard_failures[k] = atomic_load_explicit(&c->guard_failures[k], RELAXED);
    out->limit_hits = atomic_load_explicit(&c->limit_hits, RELAXED);
    out->hot_entries = atomic_load_explicit(&c->hot_entries, RELAXED);
    out->hot_shapes = atomic_load_explicit(&c->hot_shapes, RELAXED);
    out->static_entries = atomic_load_explicit(&c->static_entries, RELAXED);
    out->symbolic_entries = atomic_load_explicit(&c->symbolic_entries, RELAXED);
    out->entries = out->static_entries + out->symbolic_entries;
    out->compiles = atomic_load_explicit(&c->compiles, RELAXED);
    out->compile_cache_hits = atomic_load_explicit(&c->compile_cache_hits, RELAXED);
    out->compile_remote_hits = atomic_load_explicit(&c->compile_remote_hits, RELAXED);
    out->compile_failures = atomic_load_explicit(&c->compile_failures, RELAXED);
    out->compiles_blacklisted = atomic_load_explicit(&c->compiles_blacklisted, RELAXED);
    out->validations = atomic_load_explicit(&c->validations, RELAXED);
    out->validation_failures = atomic_load_explicit(&c->validation_failures, RELAXED);
    out->compiles_dropped = atomic_load_explicit(&c->compiles_dropped, RELAXED);
    out->specializations_demoted = atomic_load_explicit(&c->demoted, RELAXED);
    out->specializations_over_budget = atomic_load_explicit(&c->over_budget, RELAXED);
    int64_t held = atomic_load_explicit(&fn->spec_bytes, RELAXED);
    out->specialized_bytes = held > 0 ? (uint64_t)held : 0;
    out->compile_ms = (double)atomic_load_explicit(&c->compile_us, RELAXED) / 1000.0;
    out->tune_ms = (double)atomic_load_explicit(&c->tune_us, RELAXED) / 1000.0;
    out->graphs = atomic_load_explicit(&c->graphs, RELAXED);
    out->graph_failures = atomic_load_explicit(&c->graph_failures, RELAXED);
    out->graphs_blacklisted = atomic_load_explicit(&c->graph_blacklisted, RELAXED);
    out->graph_evictions = atomic_load_explicit(&c->graph_evictions, RELAXED);
    out->graphs_over_budget = atomic_load_explicit(&c->graph_over_budget, RELAXED);
    out->bucket_graphs = atomic_load_explicit(&c->bucket_graphs, RELAXED);
    out->bucket_graph_calls = atomic_load_explicit(&c->bucket_graph_calls, RELAXED);
    out->quick_compiles = atomic_load_explicit(&c->quick_compiles, RELAXED);
    out->quick_replaced = atomic_load_explicit(&c->quick_replaced, RELAXED);
    int64_t gb = atomic_load_explicit(&fn->graph_bytes, RELAXED);
    out->graph_bytes = gb > 0 ? (uint64_t)gb : 0;
    sj_cpu_pack_cache_stats(fn->packs, &out->packed_weights, &out->packed_bytes);
    out->warmup_runs = atomic_load_explicit(&c->warmup_runs, RELAXED);
    out->warmup_shapes = atomic_load_explicit(&c->warmup_shapes, RELAXED);
    out->warmup_failures = atomic_load_explicit(&c->warmup_failures, RELAXED);
    out->buckets_learned = atomic_load_explicit(&c->buckets_learned, RELAXED);
    out->learn_failures = atomic_load_explicit(&c->learn_failures, RELAXED);
    out->learn_kept = atomic_load_explicit(&c->learn_kept, RELAXED);
    out->learn_window = atomic_load_explicit(&((sj_fn *)fn)->learn_window, RELAXED);
}

sj_status sj_fn_wait_idle(sj_fn *fn, int timeout_ms) {
    sj_clearerr();
    if (!fn) return sj_seterr(SJ_EINVAL, "sj_fn_wait_idle: fn is NULL");
    int64_t t0 = sj_now_ns();
    sj_status st = sj_warmup_wait(fn, timeout_ms);
    if (!st && timeout_ms >= 0) { /* what is left of the time */
        int64_t left = timeout_ms - (sj_now_ns() - t0) / 1000000;
        timeout_ms = left > 0 ? (int)left : 0;
    }
    if (!st) st = sj_compiler_wait_fn(fn->rt->compiler, fn, timeout_ms);
    if (!st && timeout_ms >= 0) {
        int64_t left = timeout_ms - (sj_now_ns() - t0) / 1000000;
        timeout_ms = left > 0 ? (int)left : 0;
    }
    /* captures take about a millisecond each; a compile's may be queued by its first calls */
    if (!st) st = sj_compiler_wait_captures(fn->rt->compiler, fn, timeout_ms);
    return st;
}

/* The tier an entry serves from, in words. */
static const char *tier_name(const sj_entry *e) {
    if (!e->plan) return "eager (no plan)";
    switch ((sj_cstate)atomic_load_explicit(&((sj_entry *)e)->ct.state, RELAXED)) {
    case SJ_CS_NONE: return "eager";
    case SJ_CS_QUEUED: return "queued";
    case SJ_CS_COMPILING: return "compiling";
    case SJ_CS_READY: return e->head.n_syms ? "fused symbolic" : "fused specialized";
    case SJ_CS_FAILED:
        if (atomic_load_explicit(&((sj_entry *)e)->ct.rejected, RELAXED)) return "rejected by validation";
        return atomic_load_explicit(&((sj_entry *)e)->ct.retry_ns, RELAXED) == INT64_MAX ? "compile blacklisted"
                                                                                          : "compile failed";
    }
    return "?";
}

/* Ready specialized shapes of an entry (memo items with their own code),
 * the bytes they hold, and its shapes demoted and not specialized now.
 * The code is read under a call's mark (jit/budget.h): a demotion may free
 * it meanwhile. */
static int specialized_shapes(sj_fn *fn, const sj_entry *e, int64_t *bytes, int *demoted) {
    int n = 0;
    *bytes = 0;
    *demoted = 0;
    unsigned shard = sj_shard_index();
    pthread_mutex_lock(&fn->table.lock);
    for (sj_memo *m = sj_memos(&fn->table); m; m = sj_memo_next(m)) {
        if (sj_memo_entry(m) != e) continue;
        int phase = sj_budget_enter(fn, shard);
        sj_compiled *cd = atomic_load_explicit(&m->ct.ready, memory_order_seq_cst);
        if (cd) n++;
        if (cd) *bytes += cd->code_bytes + cd->arena_bytes; /* (no budget: never freed before fn) */
        sj_budget_leave(fn, shard, phase);
        if (!cd && atomic_load_explicit(&m->demotions, RELAXED) > 0) ++*demoted;
    }
    pthread_mutex_unlock(&fn->table.lock);
    return n;
}

static int64_t hint_of(const sj_entry *e, sj_expr x) { return x == SJ_EX_NONE ? 0 : sj_ex_hint(e->g->ex, x); }

int sj_fn_entries(const sj_fn *cfn, sj_entry_info *out, int max) {
    if (!cfn) return 0;
    sj_fn *fn = (sj_fn *)cfn;
    int n = 0;
    for (sj_entry *e = sj_entries(&fn->table); e; e = sj_entry_next(e), n++) {
        if (!out || n >= max) continue;
        sj_entry_info *i = &out[n];
        memset(i, 0, sizeof *i);
        i->id = e->id;
        i->symbolic = e->symbolic;
        i->bucketed = e->bucketed;
        i->fallback = e->fallback;
        i->hot = atomic_load_explicit(&e->hot, RELAXED);
        i->n_symbols = e->head.n_syms;
        i->n_guards = sj_guard_size(e->head.guards);
        i->calls = sj_counter_sum(&e->calls);
        snprintf(i->what, sizeof i->what, "%s", e->what);
        snprintf(i->tier, sizeof i->tier, "%s", tier_name(e));
        i->specialized_shapes = specialized_shapes(fn, e, &i->specialized_bytes, &i->demoted_shapes);
        int64_t ready = atomic_load_explicit(&e->ct.ready_ns, RELAXED);
        i->time_to_fused_ms = ready ? (double)(ready - e->created_ns) / 1e6 : -1.0;
        if (e->plan) {
            i->planned_bytes = hint_of(e, e->plan->arena_bytes);
            i->naive_bytes = hint_of(e, e->plan->naive_bytes);
        }
    }
    return n;
}

/* -- Explain ---------------------------------------------------------------------- */

static const char *dynamic_name(sj_dynamic d) {
    return d == SJ_DYNAMIC_STATIC ? "static" : d == SJ_DYNAMIC_SYMBOLIC ? "symbolic" : "auto";
}

static void explain_symbols(const sj_entry *e, FILE *out) {
    const sj_exprs *ex = e->g->ex;
    int n = sj_sym_count(ex);
    if (!n) return;
    fprintf(out, "    symbols:");
    for (int s = 0; s < n; s++) {
        int64_t lo, hi;
        sj_sym_range(ex, s, &lo, &hi);
        if (hi == INT64_MAX) fprintf(out, " s%d in [%lld, inf) hint %lld;", s, (long long)lo, (long long)sj_sym_hint(ex, s));
        else fprintf(out, " s%d in [%lld, %lld] hint %lld;", s, (long long)lo, (long long)hi, (long long)sj_sym_hint(ex, s));
    }
    fprintf(out, "\n");
}

/* Hot shapes of one entry, from the memo. */
static void explain_hot_shapes(sj_fn *fn, const sj_entry *e, FILE *out) {
    pthread_mutex_lock(&fn->table.lock);
    int shown = 0;
    for (sj_memo *m = sj_memos(&fn->table); m; m = sj_memo_next(m)) {
        if (sj_memo_entry(m) != e || !e->head.n_syms) continue;
        uint64_t calls = sj_memo_calls(m);
        bool hot = atomic_load_explicit(&m->hot, RELAXED);
        int gfails = atomic_load_explicit(&m->graph_fails, RELAXED);
        if (!hot && shown >= 4 && !atomic_load_explicit(&m->demotions, RELAXED) && !gfails) continue;
        if (!shown++) fprintf(out, "    shapes:");
        fprintf(out, " (");
        for (int s = 0; s < e->head.n_syms; s++)
            fprintf(out, s ? ", s%d=%lld" : "s%d=%lld", s, (long long)m->head.syms[s]);
        int demotions = atomic_load_explicit(&m->demotions, RELAXED);
        bool ready = atomic_load_explicit(&m->ct.ready, RELAXED) != NULL;
        fprintf(out, ") %llu calls%s%s", (unsigned long long)calls, hot ? " [marked for specialization]" : "",
                ready ? " [specialized]" : "");
        if (demotions)
            fprintf(out, " [demoted %d time%s by the memory budget%s]", demotions, demotions > 1 ? "s" : "",
                    ready || hot ? "" : ": symbolic");
        int graphs = 0;
        for (int k = 0; k < SJ_MEMO_GRAPHS; k++) graphs += atomic_load_explicit(&m->graphs[k], RELAXED) != NULL;
        if (graphs) fprintf(out, " [%d CUDA graph%s]", graphs, graphs > 1 ? "s" : "");
        if (gfails && atomic_load_explicit(&m->graph_off, RELAXED)) {
            fprintf(out, " [graph captures blacklisted after %d failures]", gfails);
        } else if (gfails && !graphs) { /* (a graph captured since: the failures are history) */
            int64_t wait = (atomic_load_explicit(&m->graph_retry_ns, RELAXED) - sj_runtime_now_ns(fn->rt)) / 1000000;
            fprintf(out, " [graph capture failed %d time%s, retry in %lld ms]", gfails, gfails > 1 ? "s" : "",
                    (long long)(wait > 0 ? wait : 0));
        }
        fprintf(out, ";");
    }
    if (shown) fprintf(out, "\n");
    pthread_mutex_unlock(&fn->table.lock);
}

void sj_fn_explain(const sj_fn *cfn, FILE *out) {
    if (!cfn || !out) return;
    sj_fn *fn = (sj_fn *)cfn;
    sj_stats s;
    sj_fn_stats(fn, &s);
    pthread_mutex_lock(&fn->trace_lock);
    const sj_policy *p = &fn->policy;
    fprintf(out, "fn '%s': %d inputs, policy %s, recompile limit %d%s, hot threshold %d, specialize threshold %d, budget %d\n",
            fn->name, fn->n_inputs, dynamic_name(p->dynamic), p->limit, p->limit_is_error ? " (error)" : "",
            p->hot_threshold, p->specialize_threshold, p->specialize_budget);
    fprintf(out, "  %llu calls (%llu eager, %llu fused symbolic, %llu fused specialized; %llu memo hits, %llu guard "
                 "evaluations), %llu traces, %llu trace errors, %llu errors, %llu limit hits\n",
            (unsigned long long)s.calls, (unsigned long long)s.eager_calls, (unsigned long long)s.fused_symbolic_calls,
            (unsigned long long)s.fused_specialized_calls, (unsigned long long)s.memo_hits,
            (unsigned long long)s.guard_evals, (unsigned long long)s.traces, (unsigned long long)s.trace_errors,
            (unsigned long long)s.errors, (unsigned long long)s.limit_hits);
    fprintf(out, "  compiles: %llu ready (%llu from the cache, %llu of them remote; %llu quick, %llu of them replaced "
                 "by their full compile), %llu failed (%llu blacklisted), %llu dropped, %.1f ms compiling, %.1f ms timing "
                 "generated products; backend %s\n",
            (unsigned long long)s.compiles, (unsigned long long)s.compile_cache_hits,
            (unsigned long long)s.compile_remote_hits, (unsigned long long)s.quick_compiles,
            (unsigned long long)s.quick_replaced, (unsigned long long)s.compile_failures,
            (unsigned long long)s.compiles_blacklisted, (unsigned long long)s.compiles_dropped, s.compile_ms,
            s.tune_ms, fn->rt->backend ? fn->rt->backend->identity(fn->rt->backend) : "none");
    sj_job_counters jc;
    sj_runtime_job_counters(fn->rt, &jc);
    static const char *const kind_names[SJ_JOB_KINDS] = {"compile", "learn", "capture", "device"};
    fprintf(out, "  background queue (the runtime's, %d workers):", jc.workers);
    for (int k = 0; k < SJ_JOB_KINDS; k++) {
        char lim[24] = "";
        if (jc.kind[k].workers_max) snprintf(lim, sizeof lim, " (of %d)", jc.kind[k].workers_max);
        fprintf(out, "%s %s %d queued (of %d), %d running%s, %llu ran, %llu dropped", k ? ";" : "", kind_names[k],
                jc.kind[k].queued, jc.kind[k].queue_max, jc.kind[k].running, lim,
                (unsigned long long)jc.kind[k].ran, (unsigned long long)jc.kind[k].dropped);
    }
    fputc('\n', out);
    sj_warmup_explain(fn, out);
    if (fn->rt->cfg.validate_calls > 0 || s.validations)
        fprintf(out, "  validation: %llu calls checked against eager, %llu units rejected (first %d calls of a unit, then 1 in %d)\n",
                (unsigned long long)s.validations, (unsigned long long)s.validation_failures,
                fn->rt->cfg.validate_calls, fn->rt->cfg.validate_every);
    if (fn->rt->cfg.specialize_max_bytes || s.specializations_demoted)
        fprintf(out, "  specialization memory: %llu bytes held of %llu (specialize_max_bytes); %llu shapes demoted, "
                     "%llu not kept (alone over the budget)\n",
                (unsigned long long)s.specialized_bytes, (unsigned long long)fn->rt->cfg.specialize_max_bytes,
                (unsigned long long)s.specializations_demoted, (unsigned long long)s.specializations_over_budget);
    if (fn->packs)
        fprintf(out, "  packed weights: %llu (%.1f MiB of %.1f MiB allowed), kernel %s\n",
                (unsigned long long)s.packed_weights, (double)s.packed_bytes / (1 << 20),
                (double)fn->rt->cfg.prepack_max_bytes / (1 << 20), sj_cpu_isa_name(sj_cpu_packed_isa()));
    if (fn->rt->backend->graph_capture) {
        fprintf(out, "  CUDA graphs: %llu captured, %llu failed captures, %llu calls served by one (limit %d per "
                     "runtime); %llu shapes blacklisted after failed captures\n",
                (unsigned long long)s.graphs, (unsigned long long)s.graph_failures,
                (unsigned long long)s.graph_calls, fn->rt->cfg.cuda_graphs, (unsigned long long)s.graphs_blacklisted);
        fprintf(out, "  graph memory: %llu bytes held of %llu (graph_max_bytes, 0: no limit); %llu graphs evicted, "
                     "%llu not kept (no room)\n",
                (unsigned long long)s.graph_bytes, (unsigned long long)fn->rt->cfg.graph_max_bytes,
                (unsigned long long)s.graph_evictions, (unsigned long long)s.graphs_over_budget);
        fprintf(out, "  bucket graphs (bucket_graphs %d): %llu captured, %llu calls served by one\n",
                fn->rt->cfg.bucket_graphs, (unsigned long long)s.bucket_graphs,
                (unsigned long long)s.bucket_graph_calls);
    }
    for (int i = 0; i < fn->n_inputs; i++)
        for (int a = 0; a < SJ_MAX_RANK; a++) {
            const sj_dim_rule *r = sj_policy_rule(p, i, a);
            char nm[48], b[96];
            if (r->kind == SJ_RULE_NONE) continue;
            sj_input_name((const char *const *)fn->input_names, i, nm, sizeof nm);
            if (r->kind == SJ_RULE_STATIC) fprintf(out, "  mark: %s axis %d static\n", nm, a);
            else if (r->kind == SJ_RULE_DYNAMIC) fprintf(out, "  mark: %s axis %d dynamic [%lld, %lld]\n", nm, a, (long long)r->min, (long long)r->max);
            else {
                sj_bucket_str(r->bucket, b, sizeof b);
                fprintf(out, "  buckets: %s axis %d %s\n", nm, a, b);
            }
        }
    sj_learn_explain(fn, out);
    fprintf(out, "  %llu entries (%llu static, %llu symbolic), newest first:\n", (unsigned long long)s.entries,
            (unsigned long long)s.static_entries, (unsigned long long)s.symbolic_entries);
    for (sj_entry *e = sj_entries(&fn->table); e; e = sj_entry_next(e)) {
        fprintf(out, "  entry %d: %s%s%s; tier %s; %llu calls%s; %d nodes\n", e->id, e->what,
                e->fallback ? " (past the limit)" : "",
                atomic_load_explicit(&e->head.retired, RELAXED) ? " (retired by learned buckets: serves the shapes it "
                                                             "served, new ones go to the new buckets)"
                                                           : "",
                tier_name(e),
                (unsigned long long)sj_counter_sum(&e->calls),
                atomic_load_explicit(&e->hot, RELAXED) ? " (hot)" : "", e->g->n_nodes);
        fprintf(out, "    traced because: %s\n", e->reason);
        if (atomic_load_explicit(&e->ct.state, RELAXED) == SJ_CS_FAILED) {
            int64_t at = atomic_load_explicit(&e->ct.retry_ns, RELAXED), now = sj_runtime_now_ns(fn->rt);
            if (atomic_load_explicit(&e->ct.rejected, RELAXED))
                fprintf(out, "    rejected by validation (results differ from eager): %s\n", e->ct.error);
            else if (at == INT64_MAX)
                fprintf(out, "    compile failed: %s\n    blacklisted after %d failed compiles: stays eager\n",
                        e->ct.error, atomic_load(&e->ct.fails));
            else
                fprintf(out, "    compile failed: %s\n    %d failed compiles; retried on a call %lld ms from now or later\n",
                        e->ct.error, atomic_load(&e->ct.fails), (long long)((at > now ? at - now : 0) / 1000000));
        }
        if (e->plan) {
            fprintf(out, "    fused plan (%d kernels, %d generated); arena %lld bytes planned vs %lld naive at the first sizes:\n",
                    e->plan->n_groups, e->plan->n_generated, (long long)hint_of(e, e->plan->arena_bytes),
                    (long long)hint_of(e, e->plan->naive_bytes));
            sj_fplan_print(e->g, e->plan, NULL, out, "      ");
        }
        fprintf(out, "    guards:\n");
        sj_guard_print(e->head.guards, out, "      ");
        explain_symbols(e, out);
        explain_hot_shapes(fn, e, out);
    }
    if (fn->n_recent) {
        fprintf(out, "  recent guard failures (oldest first):\n");
        int n = fn->n_recent < SJ_RECENT_FAILURES ? fn->n_recent : SJ_RECENT_FAILURES;
        for (int i = 0; i < n; i++) {
            const sj_guard_failure *f = &fn->recent[(fn->n_recent - n + i) % SJ_RECENT_FAILURES];
            fprintf(out, "    entry %d: %s\n", f->entry, f->message);
        }
    }
    pthread_mutex_unlock(&fn->trace_lock);
}
