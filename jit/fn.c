/* Functions: lifecycle, stats, explain. The call path is in call.c. */
#include "jit/fn.h"

#include <stdlib.h>
#include <string.h>

#include "jit/error.h"

/* -- Lifecycle ------------------------------------------------------------- */

sj_status sj_fn_create(sj_runtime *rt, const char *name, int n_inputs, sj_model_fn model, void *user,
                       const sj_fn_options *opt, sj_fn **out) {
    sj_clearerr();
    if (!out) return sj_seterr(SJ_EINVAL, "sj_fn_create: fn is NULL");
    *out = NULL;
    if (!rt) return sj_seterr(SJ_EINVAL, "sj_fn_create: rt is NULL");
    if (!model) return sj_seterr(SJ_EINVAL, "sj_fn_create: model is NULL");
    if (n_inputs < 0 || n_inputs > SJ_MAX_INPUTS)
        return sj_seterr(SJ_EINVAL, "sj_fn_create: n_inputs %d out of range [0, %d]", n_inputs, SJ_MAX_INPUTS);
    if (opt) return sj_seterr(SJ_EINVAL, "sj_fn_create: opt must be NULL (no options are defined yet)");

    sj_fn *fn = calloc(1, sizeof *fn);
    if (!fn) return sj_seterr(SJ_ENOMEM, "sj_fn_create: out of memory");
    fn->name = strdup(name ? name : "fn");
    if (!fn->name) {
        free(fn);
        return sj_seterr(SJ_ENOMEM, "sj_fn_create: out of memory");
    }
    fn->rt = rt;
    fn->n_inputs = n_inputs;
    fn->model = model;
    fn->user = user;
    if (pthread_mutex_init(&fn->trace_lock, NULL)) goto fail_name;
    if (pthread_rwlock_init(&fn->memo_lock, NULL)) goto fail_trace;
    if (sj_pool_init(&fn->pool, rt)) goto fail_memo;
    atomic_init(&fn->entries, NULL);

    pthread_mutex_lock(&rt->lock);
    fn->next_in_rt = rt->fns;
    rt->fns = fn;
    pthread_mutex_unlock(&rt->lock);
    *out = fn;
    return SJ_OK;

fail_memo:
    pthread_rwlock_destroy(&fn->memo_lock);
fail_trace:
    pthread_mutex_destroy(&fn->trace_lock);
fail_name:
    free(fn->name);
    free(fn);
    return sj_seterr(SJ_ENOMEM, "sj_fn_create: cannot create locks");
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
    sj_runtime_unlink_fn(fn->rt, fn);
    sj_memo *m, *tmp;
    HASH_ITER(hh, fn->memo, m, tmp) {
        HASH_DELETE(hh, fn->memo, m);
        free(m);
    }
    sj_entry *e = atomic_load(&fn->entries);
    while (e) {
        sj_entry *next = e->next;
        sj_graph_destroy(e->g);
        free(e->sig);
        free(e);
        e = next;
    }
    sj_pool_destroy(&fn->pool);
    pthread_rwlock_destroy(&fn->memo_lock);
    pthread_mutex_destroy(&fn->trace_lock);
    free(fn->name);
    free(fn);
}

/* -- Stats and explain ------------------------------------------------------ */

void sj_fn_stats(const sj_fn *fn, sj_stats *out) {
    if (!out) return;
    memset(out, 0, sizeof *out);
    if (!fn) return;
    sj_fn_counters *c = (sj_fn_counters *)&fn->c;
    out->calls = atomic_load_explicit(&c->calls, memory_order_relaxed);
    out->errors = atomic_load_explicit(&c->errors, memory_order_relaxed);
    out->eager_calls = atomic_load_explicit(&c->eager_calls, memory_order_relaxed);
    out->traces = atomic_load_explicit(&c->traces, memory_order_relaxed);
    out->trace_errors = atomic_load_explicit(&c->trace_errors, memory_order_relaxed);
    out->memo_hits = atomic_load_explicit(&c->memo_hits, memory_order_relaxed);
    for (sj_entry *e = atomic_load(&((sj_fn *)fn)->entries); e; e = e->next) out->entries++;
}

static void print_sig(FILE *out, const int64_t *sig, int n_inputs) {
    const int64_t *w = sig;
    for (int i = 0; i < n_inputs; i++) {
        int dt = (int)(w[0] & 0xff), rank = (int)((w[0] >> 8) & 0xff);
        fprintf(out, "%s%s[", i ? ", " : "", sj_dtype_name((sj_dtype)dt));
        for (int a = 0; a < rank; a++) fprintf(out, a ? ", %lld" : "%lld", (long long)w[1 + a]);
        fprintf(out, "]");
        w += 1 + 2 * rank;
    }
}

void sj_fn_explain(const sj_fn *fn, FILE *out) {
    if (!fn || !out) return;
    sj_stats s;
    sj_fn_stats(fn, &s);
    fprintf(out, "fn '%s': %d inputs, %llu entries, %llu calls (%llu eager), %llu traces, %llu errors\n", fn->name,
            fn->n_inputs, (unsigned long long)s.entries, (unsigned long long)s.calls,
            (unsigned long long)s.eager_calls, (unsigned long long)s.traces, (unsigned long long)s.errors);
    for (sj_entry *e = atomic_load(&((sj_fn *)fn)->entries); e; e = e->next) {
        fprintf(out, "  entry %d: ", e->id);
        print_sig(out, e->sig, fn->n_inputs);
        fprintf(out, " -> %d nodes, %d outputs; tier eager; %llu calls\n", e->g->n_nodes, e->g->n_outputs,
                (unsigned long long)atomic_load_explicit(&e->calls, memory_order_relaxed));
    }
}
