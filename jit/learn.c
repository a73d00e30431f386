/* Buckets learned from traffic (sj_fn_learn_buckets): the histogram of a
 * dimension's sizes from the memo, the cost model's inputs measured from
 * the function, the edges chosen (shapes/bucket_learn.c) and swapped in;
 * and learning while serving (sj_fn_learn_auto, cfg.learn_every: jit/learn.h),
 * run as a job of the compile queue. Nothing here runs on the call path
 * but sj_learn_note_shape's count and sj_learn_due's queue push. Locks: the
 * memo lock alone (the histogram), then the trace lock alone (the swap, the
 * rows of learning while serving); sj_learn_due takes the compiler lock
 * alone. */
#include "base/alloc.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/error.h"
#include "jit/compile.h"
#include "jit/fn.h"
#include "jit/learn.h"
#include "shapes/bucket_learn.h"

#define RELAXED memory_order_relaxed

void sj_learn_options_init(sj_learn_options *o) {
    if (!o) return;
    memset(o, 0, sizeof *o);
    o->max_buckets = 8;
    o->size_us = -1;
    o->symbolic_overhead = 0.05;
    o->compile_ms = -1;
    o->min_gain = -1;
    o->half_life = -1;
}

/* The half-life a learning with options o uses (< 0: the runtime's). */
static double half_life_of(const sj_fn *fn, const sj_learn_options *o) {
    return o->half_life < 0 ? (double)fn->rt->cfg.learn_half_life : o->half_life;
}

static sj_status dim_check(const char *what, const sj_fn *fn, int input, int axis) {
    if (!fn) return sj_seterr(SJ_EINVAL, "%s: fn is NULL", what);
    if (input < 0 || input >= fn->n_inputs)
        return sj_seterr(SJ_EINVAL, "%s: input %d out of range [0, %d) of fn '%s'", what, input, fn->n_inputs, fn->name);
    if (axis < 0 || axis >= SJ_MAX_RANK)
        return sj_seterr(SJ_EINVAL, "%s: axis %d out of range [0, %d)", what, axis, SJ_MAX_RANK);
    return SJ_OK;
}

/* The size of (input, axis) in a packed signature (sj_sig_pack), or -1
 * when that input has fewer axes. */
static int64_t sig_size(const int64_t *key, int words, int input, int axis) {
    int w = 0;
    for (int i = 0; w < words; i++) {
        int rank = (int)((key[w] >> 8) & 0xff);
        if (i == input) return axis < rank && w + 1 + axis < words ? key[w + 1 + axis] : -1;
        w += 1 + 2 * rank;
    }
    return -1;
}

typedef struct hist {
    int64_t *sizes;
    uint64_t *counts;
    int n;
    bool memo_full;
    uint64_t calls_seen; /* the counts since the function was made, summed */
    double eager_ns, eager_size; /* timed eager calls: their time, and their calls times their mean size */
} hist;

/* -- The window -------------------------------------------------------------------- */

/* The calls counted for a window: a symbolic entry's shape counts its
 * calls in its memo item; a static entry serves one set of sizes and
 * counts its calls itself. */
static sj_hist_window *window_of(sj_memo *m, sj_entry *e, uint64_t *calls) {
    if (e->symbolic) return *calls = sj_memo_calls(m), &m->win;
    return *calls = sj_counter_sum(&e->calls), &e->win;
}

/* Bring the window up to date (memo lock held): the calls since the
 * latest update, D in all, join each weight after the older weight
 * decayed by f = 2^(-D / half_life). When they were made among the D is
 * not known: each is given the mean weight of a call spread evenly over
 * them, (1 - f) / (D ln 2 / half_life), so that a traffic steady between
 * two updates is weighted exactly, however often they come. Two passes
 * over the memo and the entries, O(signatures), no allocation. */
/* One window's share of window_update's pass: pass 0 adds its calls since
 * the latest update to *since; pass 1 decays its weight by f and adds the
 * new calls at their mean weight g, then adds the weight to *total. */
static void window_step(sj_hist_window *w, uint64_t calls, int pass, double f, double g, double *since,
                        double *total) {
    uint64_t d = calls > w->seen ? calls - w->seen : 0;
    if (!pass) {
        *since += (double)d;
        return;
    }
    w->w = w->w * f + (double)d * g, w->seen = calls;
    *total += w->w;
}

static void window_update(sj_fn *fn, double half_life) {
    sj_table *t = &fn->table;
    double since = 0;
    for (int pass = 0; pass < 2; pass++) {
        double x = since / half_life * M_LN2, f = exp(-x), total = 0;
        double g = x > 1e-12 ? -expm1(-x) / x : 1; /* the new calls' mean weight */
        uint64_t calls;
        for (sj_memo *m = sj_memos(t); m; m = sj_memo_next(m)) {
            sj_entry *e = sj_memo_entry(m);
            if (!e->symbolic) continue; /* the entry's own, below */
            sj_hist_window *w = window_of(m, e, &calls);
            window_step(w, calls, pass, f, g, &since, &total);
        }
        for (sj_entry *e = sj_entries(t); e; e = sj_entry_next(e)) {
            if (e->symbolic) continue;
            sj_hist_window *w = window_of(NULL, e, &calls);
            window_step(w, calls, pass, f, g, &since, &total);
        }
        if (pass) atomic_store_explicit(&fn->learn_window, (uint64_t)llround(total), RELAXED);
    }
}

/* A weight as a count: rounded; under half a call, forgotten (0). */
static uint64_t weight_count(double w) { return w < 0.5 ? 0 : (uint64_t)llround(w); }

/* -- The histogram ------------------------------------------------------------------ */

/* Walk the memo (under its lock): every signature's size on the dimension
 * with its calls (with a half_life > 0: its weight in the window, brought
 * up to date first); and, per entry, its calls' mean size, to turn the
 * entries' timed eager calls into a cost per unit of size. */
static sj_status build_hist(sj_fn *fn, int input, int axis, double half_life, hist *h) {
    memset(h, 0, sizeof *h);
    sj_table *t = &fn->table;
    int n_ent = atomic_load(&t->n_entries);
    pthread_mutex_lock(&t->lock);
    int cap = t->n_memo ? t->n_memo : 1;
    h->sizes = sj_malloc((size_t)cap * sizeof *h->sizes);
    h->counts = sj_malloc((size_t)cap * sizeof *h->counts);
    /* per entry id: calls, calls * size, and whether a static entry was counted */
    double *ec = sj_calloc((size_t)(n_ent + 1) * 3, sizeof(double));
    if (!h->sizes || !h->counts || !ec) {
        pthread_mutex_unlock(&t->lock);
        free(h->sizes), free(h->counts), free(ec);
        return sj_seterr(SJ_ENOMEM, "learn buckets: out of memory");
    }
    h->memo_full = t->n_memo >= SJ_MEMO_MAX;
    if (half_life > 0) window_update(fn, half_life);
    for (sj_memo *m = sj_memos(t); m && h->n < cap; m = sj_memo_next(m)) {
        int64_t s = sig_size(m->head.key, m->head.key_words, input, axis);
        sj_entry *e = sj_memo_entry(m);
        if (s < 2 || e->id > n_ent) continue;
        /* A symbolic entry counts its shapes in their memo items; a static
         * entry serves one set of sizes and counts its calls itself (the
         * call path counts nothing more for this): once, at its first
         * signature. */
        if (!e->symbolic && ec[3 * e->id + 2]) continue;
        ec[3 * e->id + 2] = 1;
        uint64_t seen;
        const sj_hist_window *w = window_of(m, e, &seen);
        h->calls_seen += seen;
        uint64_t c = half_life > 0 ? weight_count(w->w) : seen;
        if (!c) continue;
        h->sizes[h->n] = s, h->counts[h->n++] = c;
        ec[3 * e->id] += (double)c;
        ec[3 * e->id + 1] += (double)c * (double)s;
    }
    pthread_mutex_unlock(&t->lock);
    for (sj_entry *e = sj_entries(t); e; e = sj_entry_next(e)) {
        uint64_t timed = atomic_load_explicit(&e->eager_timed, RELAXED);
        if (!timed || e->id > n_ent || ec[3 * e->id] <= 0) continue;
        h->eager_ns += (double)atomic_load_explicit(&e->eager_ns, RELAXED);
        h->eager_size += (double)timed * ec[3 * e->id + 1] / ec[3 * e->id];
    }
    free(ec);
    h->n = sj_learn_normalize(h->sizes, h->counts, h->n);
    return SJ_OK;
}

int sj_fn_size_histogram(sj_fn *fn, int input, int axis, int64_t *sizes, uint64_t *counts, int max) {
    sj_clearerr();
    if (dim_check("sj_fn_size_histogram", fn, input, axis)) return -1;
    if (max < 0 || (max > 0 && (!sizes || !counts))) {
        sj_seterr(SJ_EINVAL, "sj_fn_size_histogram: max %d with sizes or counts NULL", max);
        return -1;
    }
    hist h;
    if (build_hist(fn, input, axis, 0, &h)) return -1; /* since made: no decay */
    for (int i = 0; i < h.n && i < max; i++) sizes[i] = h.sizes[i], counts[i] = h.counts[i];
    free(h.sizes), free(h.counts);
    return h.n;
}

/* Entries whose range on (input, axis) is a symbol's that is not one of
 * the buckets of edges are retired, but for a fallback entry (caller holds
 * the trace lock). */
static int retire(sj_fn *fn, int input, int axis, const int64_t *edges, int n_edges) {
    int n = 0;
    for (sj_entry *e = sj_entries(&fn->table); e; e = sj_entry_next(e)) {
        /* the fallback entry made past the recompile limit keeps serving:
         * without it, new shapes past the limit would be traced per call */
        if (atomic_load_explicit(&e->head.retired, RELAXED) || e->fallback || input >= e->g->n_inputs) continue;
        const sj_value *v = &e->g->vals[input]; /* inputs are the first values */
        int sym;
        if (axis >= v->rank || !sj_ex_is_sym(e->g->ex, v->shape[axis], &sym)) continue;
        if (sym < 64 && (e->pinned_syms >> sym & 1)) continue; /* one size: in effect static */
        int64_t lo, hi;
        sj_sym_range(e->g->ex, sym, &lo, &hi);
        bool same = false;
        for (int k = 0; k <= n_edges && !same; k++) {
            int64_t blo = k ? edges[k - 1] + 1 : 2, bhi = k < n_edges ? edges[k] : INT64_MAX;
            if (blo < 2) blo = 2;
            same = lo == blo && hi == bhi;
        }
        if (!same) {
            atomic_store_explicit(&e->head.retired, true, RELAXED);
            n++;
        }
    }
    return n;
}

sj_status sj_fn_learn_buckets(sj_fn *fn, int input, int axis, const sj_learn_options *opt, sj_bucket_report *out) {
    sj_clearerr();
    sj_status st = dim_check("sj_fn_learn_buckets", fn, input, axis);
    if (st) return st;
    sj_learn_options o;
    sj_learn_options_init(&o);
    if (opt) o = *opt;
    if (o.apply != 0 && o.apply != 1) return sj_seterr(SJ_EINVAL, "sj_fn_learn_buckets: apply %d is not 0 or 1", o.apply);
    if (o.pad != 0 && o.pad != 1) return sj_seterr(SJ_EINVAL, "sj_fn_learn_buckets: pad %d is not 0 or 1", o.pad);
    if (!isfinite(o.size_us) || !isfinite(o.compile_ms))
        return sj_seterr(SJ_EINVAL, "sj_fn_learn_buckets: size_us or compile_ms is not finite");
    if (!isfinite(o.bucket_mib) || !isfinite(o.mib_ms) || o.bucket_mib < 0 || o.mib_ms < 0)
        return sj_seterr(SJ_EINVAL, "sj_fn_learn_buckets: bucket_mib %g or mib_ms %g is negative or not finite",
                         o.bucket_mib, o.mib_ms);
    if (!(o.min_gain < 1)) return sj_seterr(SJ_EINVAL, "sj_fn_learn_buckets: min_gain %g is not below 1", o.min_gain);
    if (isnan(o.half_life) || isinf(o.half_life))
        return sj_seterr(SJ_EINVAL, "sj_fn_learn_buckets: half_life is not finite");

    hist h;
    double half_life = half_life_of(fn, &o);
    if ((st = build_hist(fn, input, axis, half_life, &h))) return st;
    sj_bucket_report r;
    memset(&r, 0, sizeof r);
    r.n_sizes = h.n;
    r.memo_full = h.memo_full;
    r.half_life = half_life;
    r.calls_seen = h.calls_seen;
    for (int i = 0; i < h.n; i++) r.calls += h.counts[i];
    if (!h.n) {
        free(h.sizes), free(h.counts);
        char nm[48];
        return sj_seterr(SJ_EINVAL, "sj_fn_learn_buckets: fn '%s' has served no size >= 2 on %s axis %d%s", fn->name,
                         sj_input_name((const char *const *)fn->input_names, input, nm, sizeof nm), axis,
                         h.calls_seen ? " in the window (the sizes served before are forgotten)" : "");
    }
    r.min_size = h.sizes[0], r.max_size = h.sizes[h.n - 1];
    uint64_t compiles = atomic_load_explicit(&fn->c.compiles, RELAXED);
    r.size_us = o.size_us >= 0 ? o.size_us : h.eager_size > 0 ? h.eager_ns / h.eager_size / 1e3 : 1.0;
    r.compile_ms = o.compile_ms >= 0 ? o.compile_ms
                   : compiles       ? (double)atomic_load_explicit(&fn->c.compile_us, RELAXED) / 1e3 / (double)compiles
                                    : 50.0;
    sj_learn_model m = {.call_us = o.call_us,
                        .size_us = r.size_us,
                        .symbolic_overhead = o.symbolic_overhead,
                        .pad = o.pad != 0,
                        .bucket_us = (r.compile_ms + o.bucket_mib * o.mib_ms) * 1e3,
                        .horizon_calls = o.horizon_calls,
                        .max_buckets = o.max_buckets};
    int64_t edges[SJ_BUCKET_MAX_BOUNDS];
    double after = 0;
    int k = 0;
    if ((st = sj_learn_choose(h.sizes, h.counts, h.n, &m, edges, &k, &after))) {
        free(h.sizes), free(h.counts);
        sj_err_prefix("sj_fn_learn_buckets: ");
        return st;
    }
    r.n_edges = k;
    memcpy(r.edges, edges, (size_t)k * sizeof *edges);
    r.cost_after_us = after;

    sj_bucket_spec *spec = NULL;
    if (o.apply && !(spec = sj_malloc(sizeof *spec))) st = sj_seterr(SJ_ENOMEM, "sj_fn_learn_buckets: out of memory");
    if (!st && spec) st = sj_bucket_list(spec, edges, k);
    pthread_mutex_lock(&fn->trace_lock);
    const sj_dim_rule *rule = sj_policy_rule(&fn->policy, input, axis);
    const sj_bucket_spec *before = rule->kind == SJ_RULE_BUCKET ? rule->bucket : NULL;
    if (before) sj_bucket_str(before, r.rule_before, sizeof r.rule_before);
    /* no rule of its own: the function's policy decides (static: an entry per size) */
    bool per_size = rule->kind == SJ_RULE_STATIC ||
                    (rule->kind == SJ_RULE_NONE && fn->policy.dynamic == SJ_DYNAMIC_STATIC);
    if (!before)
        snprintf(r.rule_before, sizeof r.rule_before, "%s",
                 per_size ? "static" : rule->kind == SJ_RULE_DYNAMIC ? "dynamic" : "none");
    if (per_size) { /* an entry per size */
        sj_bucket_spec each;
        sj_bucket_multiple(&each, 1);
        r.cost_before_us = sj_learn_cost_spec(h.sizes, h.counts, h.n, &each, &m, &r.buckets_before);
    } else {
        r.cost_before_us = sj_learn_cost_spec(h.sizes, h.counts, h.n, before, &m, &r.buckets_before);
    }
    /* not worth the swap: the rule in force stays (its entries keep serving) */
    if (spec && o.min_gain > 0 && !(r.cost_after_us <= r.cost_before_us * (1 - o.min_gain))) {
        r.kept = 1;
        free(spec);
        spec = NULL;
    }
    if (!st && spec) {
        sj_policy_set_bucket(&fn->policy, input, axis, spec); /* takes it */
        spec = NULL;
        r.entries_retired = retire(fn, input, axis, edges, k);
        r.applied = 1;
    }
    pthread_mutex_unlock(&fn->trace_lock);
    free(spec);
    free(h.sizes), free(h.counts);
    if (r.applied) {
        char text[1024];
        sj_bucket_report_str(&r, text, sizeof text);
        sj_logf(fn->rt, SJ_LOG_RECOMPILES, "fn '%s': learned buckets on input %d axis %d: %s", fn->name, input, axis, text);
    }
    if (out) *out = r;
    return st;
}

int sj_bucket_report_str(const sj_bucket_report *r, char *buf, size_t n) {
    if (!r || !buf || !n) return 0;
    int used = snprintf(buf, n, "edges");
    for (int i = 0; i < r->n_edges && (size_t)used < n; i++)
        used += snprintf(buf + used, n - (size_t)used, "%s%lld", i ? "," : " ", (long long)r->edges[i]);
    if ((size_t)used < n)
        used += snprintf(buf + used, n - (size_t)used,
                         " (was %s, %d buckets); %d sizes in [%lld, %lld], %llu calls%s%s; expected cost per call "
                         "%.2f us -> %.2f us (size %.4g us, compile %.1f ms)%s",
                         r->rule_before, r->buckets_before, r->n_sizes, (long long)r->min_size,
                         (long long)r->max_size, (unsigned long long)r->calls, r->half_life > 0 ? " in the window" : "",
                         r->memo_full ? " (memo full)" : "",
                         r->cost_before_us, r->cost_after_us, r->size_us, r->compile_ms,
                         r->applied ? "; applied" : r->kept ? "; kept the rule before (gain under min_gain)" : "");
    if (r->applied && (size_t)used < n)
        used += snprintf(buf + used, n - (size_t)used, ", %d entries retired", r->entries_retired);
    if (r->half_life > 0 && (size_t)used < n)
        used += snprintf(buf + used, n - (size_t)used, "; half-life %.0f calls, %llu calls seen", r->half_life,
                         (unsigned long long)r->calls_seen);
    return used;
}

/* -- Learning while serving ----------------------------------------------------------- */

/* Learning while serving swaps edges in only for this much gain. */
#define SJ_LEARN_AUTO_MIN_GAIN 0.02

/* The least due points of the rows (trace lock held). */
static void rearm(sj_fn *fn) {
    int64_t at = INT64_MAX, calls_at = INT64_MAX;
    for (int i = 0; i < fn->n_learn; i++) {
        if (fn->learn[i].next_at < at) at = fn->learn[i].next_at;
        if (fn->learn[i].calls_at < calls_at) calls_at = fn->learn[i].calls_at;
    }
    atomic_store_explicit(&fn->learn_next_at, at, RELAXED);
    atomic_store_explicit(&fn->learn_calls_at, calls_at, RELAXED);
}

/* A row's next due point by calls: a half-life of calls from `calls`
 * (the memo hits now); INT64_MAX without decay. */
static int64_t calls_due(const sj_fn *fn, const sj_learn_auto *r, int64_t calls) {
    double hl = half_life_of(fn, &r->opt);
    return hl > 0 ? calls + (int64_t)ceil(hl) : INT64_MAX;
}

void sj_learn_init(sj_fn *fn) {
    atomic_init(&fn->learn_shapes, 0);
    atomic_init(&fn->learn_next_at, INT64_MAX);
    atomic_init(&fn->learn_calls_at, INT64_MAX);
    atomic_init(&fn->learn_queued, false);
    atomic_init(&fn->learn_window, 0);
    int every = fn->rt->cfg.learn_every;
    if (every <= 0) return;
    sj_learn_auto *r = &fn->learn[fn->n_learn++];
    memset(r, 0, sizeof *r);
    r->input = -1, r->axis = -1, r->every = every, r->next_at = every;
    sj_learn_options_init(&r->opt);
    r->opt.apply = 1;
    r->opt.min_gain = SJ_LEARN_AUTO_MIN_GAIN;
    r->calls_at = calls_due(fn, r, 0);
    rearm(fn);
}

static sj_status check_options(const char *what, const sj_learn_options *o) {
    if (!(o->min_gain < 1)) return sj_seterr(SJ_EINVAL, "%s: min_gain %g is not below 1", what, o->min_gain);
    if (o->apply != 0 && o->apply != 1) return sj_seterr(SJ_EINVAL, "%s: apply %d is not 0 or 1", what, o->apply);
    if (o->pad != 0 && o->pad != 1) return sj_seterr(SJ_EINVAL, "%s: pad %d is not 0 or 1", what, o->pad);
    if (!isfinite(o->size_us) || !isfinite(o->compile_ms))
        return sj_seterr(SJ_EINVAL, "%s: size_us or compile_ms is not finite", what);
    if (!isfinite(o->half_life)) return sj_seterr(SJ_EINVAL, "%s: half_life is not finite", what);
    if (!isfinite(o->bucket_mib) || !isfinite(o->mib_ms) || o->bucket_mib < 0 || o->mib_ms < 0)
        return sj_seterr(SJ_EINVAL, "%s: bucket_mib %g or mib_ms %g is negative or not finite", what, o->bucket_mib,
                         o->mib_ms);
    /* the rest as the chooser checks them, with the measured values stood in */
    sj_learn_model m = {.call_us = o->call_us,
                        .size_us = 1,
                        .symbolic_overhead = o->symbolic_overhead,
                        .bucket_us = 1,
                        .horizon_calls = o->horizon_calls,
                        .max_buckets = o->max_buckets};
    sj_status st = sj_learn_model_check(&m);
    if (st) sj_err_prefix("%s: ", what);
    return st;
}

sj_status sj_fn_learn_auto(sj_fn *fn, int input, int axis, int every, const sj_learn_options *opt) {
    sj_clearerr();
    sj_status st = dim_check("sj_fn_learn_auto", fn, input, axis);
    if (st) return st;
    if (every < 0) return sj_seterr(SJ_EINVAL, "sj_fn_learn_auto: every %d is negative", every);
    sj_learn_options o;
    sj_learn_options_init(&o);
    if (opt) o = *opt;
    o.apply = 1;
    if (o.min_gain < 0) o.min_gain = SJ_LEARN_AUTO_MIN_GAIN;
    if ((st = check_options("sj_fn_learn_auto", &o))) return st;
    pthread_mutex_lock(&fn->trace_lock);
    int at = -1, n_own = 0;
    for (int i = 0; i < fn->n_learn; i++) {
        if (fn->learn[i].input >= 0) n_own++;
        if (fn->learn[i].input == input && fn->learn[i].axis == axis) at = i;
    }
    if (every == 0) {
        if (at >= 0) { /* off: the row goes, the others move up */
            memmove(&fn->learn[at], &fn->learn[at + 1], (size_t)(fn->n_learn - at - 1) * sizeof fn->learn[0]);
            fn->n_learn--;
        }
    } else if (at < 0 && n_own >= SJ_LEARN_AUTO_MAX) {
        st = sj_seterr(SJ_EINVAL, "sj_fn_learn_auto: fn '%s' learns %d dimensions already (at most %d)", fn->name,
                       n_own, SJ_LEARN_AUTO_MAX);
    } else {
        if (at < 0) { /* explicit rows before the cfg row, which stays last */
            at = n_own;
            memmove(&fn->learn[at + 1], &fn->learn[at], (size_t)(fn->n_learn - at) * sizeof fn->learn[0]);
            fn->n_learn++;
            memset(&fn->learn[at], 0, sizeof fn->learn[at]);
        }
        sj_learn_auto *r = &fn->learn[at];
        r->input = input, r->axis = axis, r->every = every, r->opt = o;
        r->next_at = atomic_load_explicit(&fn->learn_shapes, RELAXED) + every;
        r->calls_at = calls_due(fn, r, sj_learn_calls(fn));
    }
    rearm(fn);
    pthread_mutex_unlock(&fn->trace_lock);
    return st;
}

void sj_learn_due(sj_fn *fn) {
    /* a load first: calls keep finding a learning due by calls until it runs */
    if (atomic_load_explicit(&fn->learn_queued, RELAXED) || atomic_exchange(&fn->learn_queued, true)) return;
    sj_compiler_request_learn(fn->rt->compiler, fn);
}

/* One dimension a learning job learns: a row of its own, or one bucketed
 * dimension of the cfg row (cfg). */
typedef struct learn_dim {
    int input, axis;
    bool cfg; /* from the cfg row */
    sj_learn_options opt;
} learn_dim;

/* Has (input, axis) a row of its own (the cfg row's walk skips it)? */
static bool own_row(const sj_fn *fn, int input, int axis) {
    for (int i = 0; i < fn->n_learn; i++)
        if (fn->learn[i].input == input && fn->learn[i].axis == axis) return true;
    return false;
}

void sj_learn_run(sj_fn *fn) {
    atomic_store(&fn->learn_queued, false); /* new shapes from here on may queue the next */
    int64_t n = atomic_load_explicit(&fn->learn_shapes, RELAXED), calls = sj_learn_calls(fn);
    int cap = fn->n_inputs * SJ_MAX_RANK + SJ_LEARN_AUTO_MAX;
    learn_dim *dims = sj_malloc((size_t)cap * sizeof *dims);
    int k = 0;
    pthread_mutex_lock(&fn->trace_lock);
    for (int i = 0; dims && i < fn->n_learn; i++) {
        sj_learn_auto *r = &fn->learn[i];
        if (n < r->next_at && calls < r->calls_at) continue; /* due by neither new shapes nor calls */
        r->next_at = n + r->every;
        r->calls_at = calls_due(fn, r, calls);
        if (r->input >= 0) {
            dims[k++] = (learn_dim){r->input, r->axis, false, r->opt};
            continue;
        }
        for (int in = 0; in < fn->n_inputs; in++)
            for (int a = 0; a < SJ_MAX_RANK; a++)
                if (sj_policy_rule(&fn->policy, in, a)->kind == SJ_RULE_BUCKET && !own_row(fn, in, a) && k < cap)
                    dims[k++] = (learn_dim){in, a, true, r->opt};
    }
    rearm(fn);
    pthread_mutex_unlock(&fn->trace_lock);
    if (!dims) { /* out of memory: the rows stay due; the next new shape tries again */
        atomic_fetch_add_explicit(&fn->c.learn_failures, 1, RELAXED);
        return;
    }
    for (int t = 0; t < k; t++) {
        sj_bucket_report rep;
        int64_t t0 = sj_now_ns();
        sj_status st = sj_fn_learn_buckets(fn, dims[t].input, dims[t].axis, &dims[t].opt, &rep);
        double ms = (double)(sj_now_ns() - t0) / 1e6;
        if (st) {
            atomic_fetch_add_explicit(&fn->c.learn_failures, 1, RELAXED);
            sj_logf(fn->rt, SJ_LOG_RECOMPILES, "fn '%s': learning input %d axis %d skipped: %s", fn->name,
                    dims[t].input, dims[t].axis, sj_last_error());
            continue;
        }
        if (!rep.applied) { /* kept: not worth a swap */
            atomic_fetch_add_explicit(&fn->c.learn_kept, 1, RELAXED);
            continue;
        }
        atomic_fetch_add_explicit(&fn->c.buckets_learned, 1, RELAXED);
        pthread_mutex_lock(&fn->trace_lock);
        for (int i = 0; i < fn->n_learn; i++) { /* the row may have moved (sj_fn_learn_auto) */
            sj_learn_auto *r = &fn->learn[i];
            if (dims[t].cfg ? r->input >= 0 : r->input != dims[t].input || r->axis != dims[t].axis) continue;
            r->runs++;
            r->has_last = true, r->last_input = dims[t].input, r->last_axis = dims[t].axis, r->last = rep;
        }
        pthread_mutex_unlock(&fn->trace_lock);
        if (sj_log_wants_events(&fn->rt->log)) {
            char text[1024];
            sj_bucket_report_str(&rep, text, sizeof text);
            sj_emit(fn->rt, (sj_event){.kind = SJ_EVENT_BUCKETS_LEARNED, .topic = SJ_LOG_RECOMPILES, .fn = fn->name,
                                       .entry = -1, .shape = text, .error = "", .duration_ms = ms,
                                       .count = rep.entries_retired, .input = dims[t].input, .axis = dims[t].axis,
                                       .edges = rep.edges, .n_edges = rep.n_edges});
        }
    }
    free(dims);
}

void sj_learn_explain(const sj_fn *fn, FILE *out) {
    if (!fn->n_learn) return;
    sj_fn *f = (sj_fn *)fn; /* atomics are read through a non-const pointer */
    fprintf(out, "  learning while serving: %lld new shapes seen; %llu learnings applied, %llu kept the rule in "
                 "force (gain under min_gain), %llu failed\n",
            (long long)atomic_load_explicit(&f->learn_shapes, RELAXED),
            (unsigned long long)atomic_load_explicit(&f->c.buckets_learned, RELAXED),
            (unsigned long long)atomic_load_explicit(&f->c.learn_kept, RELAXED),
            (unsigned long long)atomic_load_explicit(&f->c.learn_failures, RELAXED));
    fprintf(out, "  learning histogram: %llu calls in the window at the latest learning with decay, %lld calls served "
                 "from the memo\n",
            (unsigned long long)atomic_load_explicit(&f->learn_window, RELAXED), (long long)sj_learn_calls(f));
    for (int i = 0; i < fn->n_learn; i++) {
        const sj_learn_auto *r = &fn->learn[i];
        char nm[48], by_calls[96] = "";
        double hl = half_life_of(fn, &r->opt);
        if (hl > 0)
            snprintf(by_calls, sizeof by_calls, "; or at %lld calls: decay, half-life %.0f calls", (long long)r->calls_at,
                     hl);
        else
            snprintf(by_calls, sizeof by_calls, "; no decay");
        if (r->input >= 0)
            fprintf(out, "    %s axis %d: every %d new shapes (next at %lld%s), %llu applied\n",
                    sj_input_name((const char *const *)fn->input_names, r->input, nm, sizeof nm), r->axis, r->every,
                    (long long)r->next_at, by_calls, (unsigned long long)r->runs);
        else
            fprintf(out, "    every bucketed dimension (learn_every %d; next at %lld%s), %llu applied\n", r->every,
                    (long long)r->next_at, by_calls, (unsigned long long)r->runs);
        if (r->has_last) {
            char text[1024];
            sj_bucket_report_str(&r->last, text, sizeof text);
            fprintf(out, "      last learned on %s axis %d: %s\n",
                    sj_input_name((const char *const *)fn->input_names, r->last_input, nm, sizeof nm), r->last_axis,
                    text);
        }
    }
}
