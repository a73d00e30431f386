/* Buckets learned from traffic (sj_fn_learn_buckets): the histogram of a
 * dimension's sizes from the memo, the cost model's inputs measured from
 * the function, the edges chosen (shapes/bucket_learn.c) and swapped in.
 * Nothing here runs on the call path. Locks: the function's trace lock,
 * then the memo lock (the table's order). */
#include "base/alloc.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "jit/fn.h"
#include "shapes/bucket_learn.h"

#define RELAXED memory_order_relaxed

void sj_learn_options_init(sj_learn_options *o) {
    if (!o) return;
    memset(o, 0, sizeof *o);
    o->max_buckets = 8;
    o->size_us = -1;
    o->symbolic_overhead = 0.05;
    o->compile_ms = -1;
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
    double eager_ns, eager_size; /* timed eager calls: their time, and their calls times their mean size */
} hist;

/* Walk the memo (under its lock): every signature's size on the dimension
 * with its calls; and, per entry, its calls' mean size, to turn the
 * entries' timed eager calls into a cost per unit of size. */
static sj_status build_hist(sj_fn *fn, int input, int axis, hist *h) {
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
    for (sj_memo *m = sj_memos(t); m && h->n < cap; m = sj_memo_next(m)) {
        int64_t s = sig_size(m->head.key, m->head.key_words, input, axis);
        sj_entry *e = sj_memo_entry(m);
        if (s < 2 || e->id > n_ent) continue;
        /* A symbolic entry counts its shapes in their memo items; a static
         * entry serves one set of sizes and counts its calls itself (the
         * call path counts nothing more for this). */
        uint64_t c = 0;
        if (e->symbolic) c = sj_memo_calls(m);
        else if (!ec[3 * e->id + 2]) c = sj_counter_sum(&e->calls), ec[3 * e->id + 2] = 1;
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
    if (build_hist(fn, input, axis, &h)) return -1;
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

    hist h;
    if ((st = build_hist(fn, input, axis, &h))) return st;
    sj_bucket_report r;
    memset(&r, 0, sizeof r);
    r.n_sizes = h.n;
    r.memo_full = h.memo_full;
    for (int i = 0; i < h.n; i++) r.calls += h.counts[i];
    if (!h.n) {
        free(h.sizes), free(h.counts);
        char nm[48];
        return sj_seterr(SJ_EINVAL, "sj_fn_learn_buckets: fn '%s' has served no size >= 2 on %s axis %d", fn->name,
                         sj_input_name((const char *const *)fn->input_names, input, nm, sizeof nm), axis);
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
                         " (was %s, %d buckets); %d sizes in [%lld, %lld], %llu calls%s; expected cost per call "
                         "%.2f us -> %.2f us (size %.4g us, compile %.1f ms)%s",
                         r->rule_before, r->buckets_before, r->n_sizes, (long long)r->min_size,
                         (long long)r->max_size, (unsigned long long)r->calls, r->memo_full ? " (memo full)" : "",
                         r->cost_before_us, r->cost_after_us, r->size_us, r->compile_ms,
                         r->applied ? "; applied" : "");
    if (r->applied && (size_t)used < n)
        used += snprintf(buf + used, n - (size_t)used, ", %d entries retired", r->entries_retired);
    return used;
}
