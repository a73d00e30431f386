/* Warm-up and readiness: prepare a function for declared shapes before it
 * serves (sj_fn_warmup; the contract is in shapejit.h).
 *
 *   sj_fn_warmup (caller's thread)
 *     check the spec                 descriptors, counts, the shape cap
 *     list the shapes                explicit ones; the walk's template, then
 *                                    every combination of bucket edges
 *     trace each                     sj_call_prepare: the entry a call of it
 *                                    would get (model functions run only here)
 *     start the warm-up thread       then, blocking, wait for it (timeout)
 *   warm_main (the function's warm-up thread)
 *     queue every entry's compile    ASYNC: on the workers, all at once
 *     per shape: compile             SYNC: here; wait for its target
 *                run                 inputs of zeros (or the caller's), once,
 *                                    not counted as a call
 *                capture             CUDA, the caller's buffers: a graph now
 *     over                           state DONE, the callback, waiters woken
 *
 * Threads. One warm-up thread per warm-up, joined by the next warm-up of
 * the function or by sj_fn_destroy. It runs no user code but the
 * completion callback. sj_fn_destroy sets `stop`, cancels the function's
 * compiles (a running compiler is killed, queued jobs dropped: a wait for
 * them returns), then joins the thread: it ends after the step it is in
 * (at most one run).
 *
 * Lock order: fn->warm_lock is a leaf. It guards fn->warm and the warm-up's
 * records and counts; it is never held while tracing, compiling, running
 * or calling the callback, and no other lock is taken under it. */
#include "base/alloc.h"
#include "jit/warmup.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/error.h"
#include "base/tensor.h"
#include "jit/budget.h"
#include "jit/call.h"
#include "jit/compile.h"
#include "jit/graphs.h"

#define RELAXED memory_order_relaxed
#define ALL_FLAGS (SJ_WARMUP_BACKGROUND | SJ_WARMUP_NO_RUN | SJ_WARMUP_NO_GRAPHS)
#define WALK_VARS_MAX 64 /* distinct bucketed sizes in a walk's template */

typedef struct warm_shape {
    sj_tensor *in;   /* fn->n_inputs descriptors (data NULL: made for the run) */
    sj_tensor *out;  /* w->n_out caller descriptors, or NULL */
    bool walked;
    sj_entry *e;     /* NULL when it failed before an entry */
    sj_memo *m;
    int64_t *syms;   /* e->head.n_syms values */
    /* results: written under fn->warm_lock */
    sj_warm_state state;
    sj_status status;
    char message[256];
    char shape[192];
    const char *tier;
    bool graph;
} warm_shape;

typedef struct sj_warmup sj_warmup;

struct sj_warmup {
    sj_fn *fn;
    unsigned flags;
    int n, cap, n_out;
    warm_shape *shapes;
    sj_warmup_done_fn on_done;
    void *on_done_user;
    atomic_bool stop;
    pthread_t thread;
    bool started, joined;
    /* under fn->warm_lock */
    bool finished; /* the thread is done, callback included */
    int prepared, failed, first_failed;
    int64_t t0_ns, t1_ns;
};

/* -- Names ---------------------------------------------------------------------- */

static const char *const state_names[] = {
#define SJ_X(name, text) text,
    SJ_WARM_STATE_LIST(SJ_X)
#undef SJ_X
};
_Static_assert(sizeof state_names / sizeof state_names[0] == SJ_WARM_STATE_COUNT, "one name per warm-up state");

const char *sj_warm_state_name(sj_warm_state s) {
    return (unsigned)s < SJ_WARM_STATE_COUNT ? state_names[s] : "?";
}

/* "[4, 32], [4], [32]" */
static void describe(const sj_tensor *in, int n, char *buf, size_t size) {
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; i < n && used < size; i++) {
        used += (size_t)snprintf(buf + used, size - used, "%s[", i ? ", " : "");
        for (int a = 0; a < in[i].rank && used < size; a++)
            used += (size_t)snprintf(buf + used, size - used, a ? ", %lld" : "%lld", (long long)in[i].shape[a]);
        if (used < size) used += (size_t)snprintf(buf + used, size - used, "]");
    }
}

/* -- The spec --------------------------------------------------------------------- */

/* A descriptor of the spec: valid as a call's would be, data aside (NULL:
 * the runtime makes it); with data, on the backend's device. */
static sj_status check_desc(const sj_fn *fn, const sj_tensor *t, bool may_have_data, const char *what) {
    sj_tensor c = *t;
    sj_device dev = fn->rt->backend_kind == SJ_BACKEND_CUDA ? SJ_CUDA : SJ_HOST;
    if (!c.data || !may_have_data) {
        c.data = (void *)(uintptr_t)64; /* checked for its sizes alone */
        c.device = dev;
        if (c.rank >= 0 && c.rank <= SJ_MAX_RANK) sj_tensor_set_contiguous(&c);
    }
    sj_status st = sj_tensor_check(&c, what);
    if (!st && c.device != dev)
        st = sj_seterr(SJ_EINVAL, "%s is %s memory; the %s backend takes %s memory", what,
                       c.device == SJ_HOST ? "host" : "device", dev == SJ_HOST ? "CPU" : "CUDA",
                       dev == SJ_HOST ? "host" : "device");
    return st;
}

/* A bucketed axis of the walk: the template's size there, and its edges. */
typedef struct walk_var {
    int64_t size;     /* the template's size on its axes */
    int n_edges;
    int64_t *edges;
} walk_var;

/* The edges of bucket spec b within [2, max] (max 0: none) into out (NULL:
 * count only). -1: unbounded (multiples without max). Counts saturate. */
static int64_t bucket_edges(const sj_bucket_spec *b, int64_t max, int64_t *out) {
    int64_t n = 0;
#define EDGE(v)                                                                                    \
    do {                                                                                           \
        int64_t v_ = (v);                                                                          \
        if (v_ >= 2 && (!max || v_ <= max)) {                                                      \
            if (out) out[n] = v_;                                                                  \
            n++;                                                                                   \
        }                                                                                          \
    } while (0)
    switch (b->kind) {
    case SJ_BUCKET_LIST:
    case SJ_BUCKET_POW2:
        for (int k = 0; k < b->n; k++) EDGE(b->bounds[k]);
        break;
    case SJ_BUCKET_MULTIPLE:
        if (!max) return -1;
        if (!out) return max / b->multiple - (b->multiple < 2); /* m, 2m, ... <= max, 1 skipped */
        for (int64_t v = b->multiple; v <= max; v += b->multiple) EDGE(v);
        break;
    case SJ_BUCKET_PROFILE:
        EDGE(b->opt);
        if (b->max != b->opt) EDGE(b->max);
        break;
    case SJ_BUCKET_NONE: break;
    }
#undef EDGE
    return n;
}

/* The walk's variables: the distinct template sizes of the bucketed axes
 * (the first axis of each size gives the edges). *n_combos: their edge
 * counts multiplied (saturating at INT64_MAX). */
static sj_status walk_vars(sj_fn *fn, const sj_tensor *tpl, int64_t walk_max, walk_var *vars, int *n_vars,
                           int64_t *n_combos) {
    *n_vars = 0;
    *n_combos = 1;
    sj_status st = SJ_OK;
    pthread_mutex_lock(&fn->trace_lock); /* the policy's rules */
    for (int i = 0; i < fn->n_inputs && !st; i++)
        for (int a = 0; a < tpl[i].rank && !st; a++) {
            const sj_dim_rule *r = sj_policy_rule(&fn->policy, i, a);
            if (r->kind != SJ_RULE_BUCKET) continue;
            int64_t v = tpl[i].shape[a];
            if (v < 2) {
                st = sj_seterr(SJ_EINVAL, "sj_fn_warmup: walk: the template's input %d axis %d is bucketed and has "
                                          "size %lld; give it a size of 2 or more (size %lld is its own entry: list "
                                          "it as an explicit shape)", i, a, (long long)v, (long long)v);
                break;
            }
            bool seen = false;
            for (int k = 0; k < *n_vars; k++) seen |= vars[k].size == v;
            if (seen) continue;
            if (*n_vars == WALK_VARS_MAX) {
                st = sj_seterr(SJ_EINVAL, "sj_fn_warmup: walk: more than %d distinct bucketed sizes", WALK_VARS_MAX);
                break;
            }
            int64_t n = bucket_edges(r->bucket, walk_max, NULL);
            if (n < 0) {
                st = sj_seterr(SJ_EINVAL, "sj_fn_warmup: walk: input %d axis %d has unbounded buckets (multiples); "
                                          "set walk_max", i, a);
                break;
            }
            if (n == 0) continue; /* no edge within the bounds: the template's size stays */
            walk_var *w = &vars[(*n_vars)++];
            w->size = v;
            w->n_edges = (int)(n < 65536 ? n : 65536); /* larger is past the cap anyway */
            w->edges = NULL;
            if (n <= 65536) {
                w->edges = sj_calloc((size_t)n, sizeof *w->edges);
                if (!w->edges) st = sj_seterr(SJ_ENOMEM, "sj_fn_warmup: out of memory");
                else bucket_edges(r->bucket, walk_max, w->edges);
            }
            *n_combos = *n_combos > INT64_MAX / n ? INT64_MAX : *n_combos * n;
        }
    pthread_mutex_unlock(&fn->trace_lock);
    if (!st && !*n_vars)
        st = sj_seterr(SJ_EINVAL, "sj_fn_warmup: walk: fn '%s' has no bucketed axis with an edge in the template's "
                                  "ranks%s", fn->name, walk_max ? " up to walk_max" : "");
    return st;
}

/* -- Records ------------------------------------------------------------------------ */

static void warm_free(sj_warmup *w) {
    if (!w) return;
    for (int i = 0; i < w->n; i++) {
        free(w->shapes[i].in);
        free(w->shapes[i].out);
        free(w->shapes[i].syms);
    }
    free(w->shapes);
    free(w);
}

/* A new shape record with copies of in (and out); NULL: out of memory. */
static warm_shape *add_shape(sj_warmup *w, const sj_tensor *in, const sj_tensor *out, bool walked) {
    int n_in = w->fn->n_inputs;
    if (w->n == w->cap) return NULL; /* sized up front */
    warm_shape *s = &w->shapes[w->n];
    memset(s, 0, sizeof *s);
    s->in = sj_calloc((size_t)(n_in ? n_in : 1), sizeof *s->in);
    if (out) s->out = sj_calloc((size_t)(w->n_out ? w->n_out : 1), sizeof *s->out);
    if (!s->in || (out && !s->out)) {
        free(s->in);
        free(s->out);
        return NULL;
    }
    for (int i = 0; i < n_in; i++) {
        s->in[i] = in[i];
        if (!s->in[i].data) {
            s->in[i].device = w->fn->rt->backend_kind == SJ_BACKEND_CUDA ? SJ_CUDA : SJ_HOST;
            sj_tensor_set_contiguous(&s->in[i]);
        }
    }
    if (out) memcpy(s->out, out, sizeof *s->out * (size_t)w->n_out);
    s->walked = walked;
    s->state = SJ_WARM_RUNNING;
    s->tier = "";
    describe(s->in, n_in, s->shape, sizeof s->shape);
    w->n++;
    return s;
}

/* A shape's end (warm_lock held). */
static void settle(sj_warmup *w, warm_shape *s, sj_warm_state state, sj_status st, const char *msg) {
    sj_fn *fn = w->fn;
    s->state = state;
    s->status = st;
    if (st) snprintf(s->message, sizeof s->message, "fn '%s': warm-up shape %d of %d (%s): %s", fn->name,
                     (int)(s - w->shapes), w->cap, s->shape, msg);
    if (state == SJ_WARM_DONE) {
        w->prepared++;
        atomic_fetch_add_explicit(&fn->c.warmup_shapes, 1, RELAXED);
    } else if (state == SJ_WARM_FAILED) {
        if (w->first_failed < 0) w->first_failed = (int)(s - w->shapes);
        w->failed++;
        atomic_fetch_add_explicit(&fn->c.warmup_failures, 1, RELAXED);
    }
}

static void settle_locked(sj_warmup *w, warm_shape *s, sj_warm_state state, sj_status st, const char *msg) {
    pthread_mutex_lock(&w->fn->warm_lock);
    settle(w, s, state, st, msg);
    pthread_mutex_unlock(&w->fn->warm_lock);
}

/* -- Tracing (the caller's thread) ------------------------------------------------- */

/* The entry of shape s, as a call of it would find or trace it. */
static void trace_shape(sj_warmup *w, warm_shape *s) {
    sj_fn *fn = w->fn;
    int64_t syms[SJ_MAX_SYMS];
    sj_memo *m;
    sj_entry *e;
    bool transient;
    sj_status st = sj_call_prepare(fn, s->in, syms, &m, &e, &transient);
    if (st) {
        char msg[256];
        snprintf(msg, sizeof msg, "%s", sj_last_error());
        settle_locked(w, s, SJ_WARM_FAILED, st, msg);
        return;
    }
    if (transient) { /* past the recompile limit, and no entry of its own kept */
        sj_entry_free(e);
        char msg[192];
        snprintf(msg, sizeof msg, "past the recompile limit (%d entries): no entry is kept for it; raise "
                                  "recompile_limit or warm fewer shapes", fn->policy.limit);
        settle_locked(w, s, SJ_WARM_FAILED, SJ_ELIMIT, msg);
        return;
    }
    if (s->out && e->g->n_outputs != w->n_out) {
        char msg[128];
        snprintf(msg, sizeof msg, "%d outputs given, the model produces %d", w->n_out, e->g->n_outputs);
        settle_locked(w, s, SJ_WARM_FAILED, SJ_EINVAL, msg);
        return;
    }
    if (e->head.n_syms && !(s->syms = sj_calloc((size_t)e->head.n_syms, sizeof *s->syms))) {
        settle_locked(w, s, SJ_WARM_FAILED, SJ_ENOMEM, "out of memory");
        return;
    }
    if (e->head.n_syms) memcpy(s->syms, syms, sizeof *syms * (size_t)e->head.n_syms);
    s->e = e;
    s->m = m;
}

/* The walk: the template traced (a shape of its own), then every
 * combination of the variables' edges, each size of the template equal to
 * a variable's following it unless the template's trace pinned it. */
static void walk(sj_warmup *w, const sj_tensor *tpl, walk_var *vars, int n_vars) {
    sj_fn *fn = w->fn;
    int n_in = fn->n_inputs;
    warm_shape *t = add_shape(w, tpl, NULL, true);
    if (!t) return;
    trace_shape(w, t);
    if (!t->e) return; /* the template failed: nothing to walk from */
    /* which variable each size of the template follows (-1: none) */
    const sj_graph *g = t->e->g;
    signed char var_of[SJ_MAX_INPUTS][SJ_MAX_RANK];
    memset(var_of, -1, sizeof var_of);
    pthread_mutex_lock(&fn->trace_lock); /* the policy's rules */
    for (int i = 0; i < n_in; i++)
        for (int a = 0; a < tpl[i].rank; a++) {
            int64_t c;
            int sym;
            sj_expr x = g->vals[i].shape[a];
            bool bucketed = sj_policy_rule(&fn->policy, i, a)->kind == SJ_RULE_BUCKET;
            bool pinned = sj_ex_is_const(g->ex, x, &c) ||
                          (sj_ex_is_sym(g->ex, x, &sym) && sym < 64 && (t->e->pinned_syms >> sym & 1));
            if (!bucketed && pinned) continue; /* the trace ties it to its constant */
            for (int v = 0; v < n_vars; v++)
                if (tpl[i].shape[a] == vars[v].size) var_of[i][a] = (signed char)v;
        }
    pthread_mutex_unlock(&fn->trace_lock);
    int k[WALK_VARS_MAX] = {0}; /* the odometer over the variables' edges */
    sj_tensor in[SJ_MAX_INPUTS];
    for (;;) {
        for (int i = 0; i < n_in; i++) {
            in[i] = t->in[i];
            in[i].data = NULL;
            for (int a = 0; a < in[i].rank; a++)
                if (var_of[i][a] >= 0) in[i].shape[a] = vars[var_of[i][a]].edges[k[var_of[i][a]]];
            sj_tensor_set_contiguous(&in[i]);
        }
        bool same = true; /* the template itself: warmed already */
        for (int i = 0; i < n_in && same; i++)
            same = !memcmp(in[i].shape, t->in[i].shape, sizeof(int64_t) * (size_t)in[i].rank);
        if (!same && !atomic_load(&w->stop)) {
            warm_shape *s = add_shape(w, in, NULL, true);
            if (!s) return;
            trace_shape(w, s);
        }
        int v = 0;
        while (v < n_vars && ++k[v] == vars[v].n_edges) k[v++] = 0;
        if (v == n_vars) break;
    }
}

/* -- The warm-up thread ------------------------------------------------------------ */

/* Inputs for the shape's run where the caller gave none: floats uniform in
 * [-1, 1) (never all zeros: a validation of new kernels during the run
 * compares something), integers and bools zero (an index 0 is in range). */
static sj_status make_inputs(sj_runtime *rt, const warm_shape *s, int n, sj_tensor *in, bool *made) {
    uint64_t r = 0x9E3779B97F4A7C15ull ^ (uint64_t)(uintptr_t)s;
    for (int i = 0; i < n; i++) in[i] = s->in[i];
    for (int i = 0; i < n; i++) {
        if (in[i].data) continue;
        sj_status st = sj_tensor_alloc(rt, &in[i]);
        if (st) return st;
        made[i] = true;
        size_t bytes = sj_tensor_nbytes(&in[i]);
        bool fl = in[i].dtype == SJ_F32 || in[i].dtype == SJ_F16 || in[i].dtype == SJ_BF16;
        if (fl && bytes) {
            int64_t ne = sj_tensor_numel(&in[i]);
            float *h = sj_malloc(sizeof *h * (size_t)ne);
            if (!h) return sj_seterr(SJ_ENOMEM, "warm-up: out of memory for an input");
            for (int64_t k = 0; k < ne; k++) {
                r ^= r << 13, r ^= r >> 7, r ^= r << 17;
                h[k] = (float)((double)(r >> 11) * (2.0 / 9007199254740992.0) - 1.0);
            }
            sj_tensor ht = in[i];
            ht.data = h;
            ht.dtype = SJ_F32;
            ht.device = SJ_HOST;
            st = sj_tensor_copy(rt, &in[i], &ht); /* converts; synchronous */
            free(h);
            if (st) return st;
        } else if (in[i].device == SJ_HOST) {
            memset(in[i].data, 0, bytes);
        } else {
            if (rt->backend->zero && (st = rt->backend->zero(rt->backend, in[i].data, bytes))) {
                sj_err_prefix("warm-up: ");
                return st;
            }
        }
    }
    return SJ_OK;
}

/* Validation checks left of the code a call of s would use now (its
 * shape's, else its entry's; jit/validate.h); 0 when none is left or no
 * code is ready. */
static int checks_left(sj_fn *fn, const warm_shape *s) {
    unsigned shard = sj_shard_index();
    int phase = sj_budget_enter(fn, shard); /* the shape's code may be demoted meanwhile (jit/budget.h) */
    sj_compiled *cd = s->m ? atomic_load_explicit(&s->m->ct.ready, memory_order_seq_cst) : NULL;
    if (cd && atomic_load_explicit(&cd->checks_left, RELAXED) < 0) cd = NULL;
    if (!cd) cd = atomic_load_explicit(&s->e->ct.ready, memory_order_acquire);
    int n = cd ? atomic_load_explicit(&cd->checks_left, RELAXED) : 0;
    sj_budget_leave(fn, shard, phase);
    return n > 0 ? n : 0;
}

/* Run shape s once (not a call): fused when its code is ready. With the
 * validated swap on, as many times as its code's first checks need
 * (validate_calls at most), then once more, fused: a first call finds the
 * code validated. */
static sj_status run_shape(sj_warmup *w, warm_shape *s, const char **tier, bool *graph) {
    sj_fn *fn = w->fn;
    sj_runtime *rt = fn->rt;
    int n_in = fn->n_inputs, n_out = s->e->g->n_outputs;
    sj_tensor in[SJ_MAX_INPUTS], out[SJ_MAX_OUTPUTS];
    bool made[SJ_MAX_INPUTS], caller_bufs = s->out != NULL;
    memset(made, 0, sizeof made);
    memset(out, 0, sizeof out);
    if (s->out) memcpy(out, s->out, sizeof *out * (size_t)n_out);
    for (int i = 0; i < n_in; i++) caller_bufs &= s->in[i].data != NULL;
    for (int i = 0; i < n_out; i++) caller_bufs &= out[i].data != NULL;
    bool capture = caller_bufs && s->m && rt->backend->graph_capture && rt->cfg.cuda_graphs > 0 &&
                   !(w->flags & SJ_WARMUP_NO_GRAPHS);
    sj_status st = make_inputs(rt, s, n_in, in, made);
    int validating = checks_left(fn, s), runs = 0;
    while (!st && (runs == 0 || (checks_left(fn, s) > 0 && runs <= rt->cfg.validate_calls)) && !atomic_load(&w->stop)) {
        st = sj_call_warm_run(fn, s->m, s->e, s->syms, in, out, n_out, false, tier);
        atomic_fetch_add_explicit(&fn->c.warmup_runs, 1, RELAXED);
        runs++;
    }
    if (!st && validating && !checks_left(fn, s)) { /* validated: the run a call now gets */
        st = sj_call_warm_run(fn, s->m, s->e, s->syms, in, out, n_out, false, tier);
        atomic_fetch_add_explicit(&fn->c.warmup_runs, 1, RELAXED);
    }
    /* the device's background work for the run (CUDA: cuBLASLt algorithms
     * for its products, chosen by the warmer thread): waited for, so that
     * nothing is left for a first request, and so that a graph captures
     * the chosen ones */
    if (!st && rt->backend->settle) {
        /* no compile workers: the device's jobs queued for the run wait for
         * a thread stepping the queue; this one */
        sj_compiler_run_device(rt->compiler);
        rt->backend->settle(rt->backend);
    }
    if (!st && capture) {
        st = sj_call_warm_run(fn, s->m, s->e, s->syms, in, out, n_out, true, tier);
        atomic_fetch_add_explicit(&fn->c.warmup_runs, 1, RELAXED);
    }
    for (int i = 0; i < n_out; i++)
        if (!(s->out && s->out[i].data)) sj_tensor_free(rt, &out[i]);
    for (int i = 0; i < n_in; i++)
        if (made[i]) sj_tensor_free(rt, &in[i]);
    *graph = false;
    /* the capture queued for the caller's buffers, or for the entry's
     * bucket (cfg.bucket_graphs: asked by any warm run): waited for, so
     * that the first request of the bucket finds its graph (none queued:
     * no wait) */
    if (!st) sj_compiler_wait_captures(rt->compiler, fn, -1);
    if (!st && capture)
        for (int k = 0; k < SJ_MEMO_GRAPHS; k++) *graph |= atomic_load(&s->m->graphs[k]) != NULL;
    return st;
}

/* Compile (or wait for the compile of) shape s's entry, run it, settle it. */
static void prepare(sj_warmup *w, warm_shape *s) {
    sj_fn *fn = w->fn;
    sj_runtime *rt = fn->rt;
    sj_status st = SJ_OK;
    char msg[256] = "";
    sj_entry *e = s->e;
    if (rt->cfg.compile_mode != SJ_COMPILE_OFF && e->plan) {
        if (rt->cfg.compile_mode == SJ_COMPILE_SYNC) sj_compiler_request_warm(rt->compiler, fn, e, NULL);
        sj_cstate cs = sj_compiler_wait_target(rt->compiler, &e->ct, 0, &w->stop);
        if (atomic_load(&w->stop)) {
            settle_locked(w, s, SJ_WARM_CANCELLED, SJ_OK, "");
            return;
        }
        if (cs == SJ_CS_FAILED) {
            st = SJ_EBACKEND;
            snprintf(msg, sizeof msg, "compile failed, its entry runs eagerly: %s", e->ct.error);
        } else if (cs != SJ_CS_READY) {
            st = SJ_EBACKEND;
            snprintf(msg, sizeof msg, "its compile was not made (its job was dropped, or could not be queued): it runs eagerly");
        }
    }
    const char *tier = "";
    bool graph = false;
    if (!(w->flags & SJ_WARMUP_NO_RUN)) {
        sj_status rst = run_shape(w, s, &tier, &graph);
        if (rst && !st) {
            st = rst;
            snprintf(msg, sizeof msg, "its run failed: %s", sj_last_error());
        }
        sj_clearerr();
        if (!st && (atomic_load(&e->ct.rejected) || (s->m && atomic_load(&s->m->ct.rejected)))) {
            st = SJ_EBACKEND;
            snprintf(msg, sizeof msg, "its kernels' results differ from eager execution (validation): rejected, "
                                      "it runs eagerly (sj_fn_explain says how)");
        }
    }
    pthread_mutex_lock(&fn->warm_lock);
    s->tier = tier;
    s->graph = graph;
    settle(w, s, st ? SJ_WARM_FAILED : SJ_WARM_DONE, st, msg);
    pthread_mutex_unlock(&fn->warm_lock);
}

static void status_of(const sj_warmup *w, sj_warm_state state, sj_warmup_status *out) {
    memset(out, 0, sizeof *out);
    out->state = state;
    out->first_failed = -1;
    if (!w) return;
    out->total = w->n;
    out->prepared = w->prepared;
    out->failed = w->failed;
    out->first_failed = w->first_failed;
    if (w->first_failed >= 0) {
        const warm_shape *s = &w->shapes[w->first_failed];
        out->first_status = s->status;
        snprintf(out->first_message, sizeof out->first_message, "%s", s->message);
    }
    int64_t end = w->t1_ns ? w->t1_ns : sj_now_ns();
    out->elapsed_ms = (double)(end - w->t0_ns) / 1e6;
}

static void *warm_main(void *arg) {
    sj_warmup *w = arg;
    sj_fn *fn = w->fn;
    sj_runtime *rt = fn->rt;
    if (rt->cfg.compile_mode == SJ_COMPILE_ASYNC) /* every compile queued at once: the workers take them in turn */
        for (int i = 0; i < w->n && !atomic_load(&w->stop); i++)
            if (w->shapes[i].e) sj_compiler_request_warm(rt->compiler, fn, w->shapes[i].e, NULL);
    for (int i = 0; i < w->n; i++) {
        warm_shape *s = &w->shapes[i];
        if (!s->e || s->state != SJ_WARM_RUNNING) continue; /* failed at its trace */
        if (atomic_load(&w->stop)) settle_locked(w, s, SJ_WARM_CANCELLED, SJ_OK, "");
        else prepare(w, s);
    }
    sj_warmup_status st;
    pthread_mutex_lock(&fn->warm_lock);
    sj_warm_state end = atomic_load(&w->stop) ? SJ_WARM_CANCELLED : SJ_WARM_DONE;
    w->t1_ns = sj_now_ns();
    atomic_store(&fn->warm_state, end);
    status_of(w, end, &st);
    pthread_mutex_unlock(&fn->warm_lock);
    sj_logf(rt, SJ_LOG_PERF, "fn '%s': warm-up %s: %d of %d shapes prepared, %d failed, %.1f ms", fn->name,
            sj_warm_state_name(end), st.prepared, st.total, st.failed, st.elapsed_ms);
    if (w->on_done) w->on_done(w->on_done_user, fn, &st); /* no lock held */
    pthread_mutex_lock(&fn->warm_lock);
    w->finished = true;
    pthread_cond_broadcast(&fn->warm_cond);
    pthread_mutex_unlock(&fn->warm_lock);
    return NULL;
}

/* -- sj_fn_warmup -------------------------------------------------------------------- */

/* Claim fn for a new warm-up w: none may be under way. The previous one's
 * records are released (its thread joined). */
static sj_status claim(sj_fn *fn, sj_warmup *w) {
    pthread_mutex_lock(&fn->warm_lock);
    sj_warmup *old = fn->warm;
    if (old && !old->finished) {
        pthread_mutex_unlock(&fn->warm_lock);
        return sj_seterr(SJ_EINVAL, "sj_fn_warmup: fn '%s': a warm-up is still running (sj_fn_wait_idle waits for it)",
                         fn->name);
    }
    fn->warm = w;
    atomic_store(&fn->warm_state, SJ_WARM_RUNNING);
    pthread_mutex_unlock(&fn->warm_lock);
    if (old && old->started && !old->joined) pthread_join(old->thread, NULL);
    warm_free(old);
    return SJ_OK;
}

/* Wait for w's end until deadline_ns (0: none), warm_lock held. A warm-up
 * still tracing on its caller's thread counts as under way. */
static sj_status wait_over(sj_fn *fn, sj_warmup *w, int64_t deadline_ns) {
    while (fn->warm == w && !w->finished) {
        if (!deadline_ns) {
            pthread_cond_wait(&fn->warm_cond, &fn->warm_lock);
            continue;
        }
        int64_t left = deadline_ns - sj_now_ns();
        if (left <= 0) return SJ_ETIMEOUT;
        struct timespec ts = sj_realtime_after(left);
        pthread_cond_timedwait(&fn->warm_cond, &fn->warm_lock, &ts);
    }
    return SJ_OK;
}

sj_status sj_fn_warmup(sj_fn *fn, const sj_warmup_spec *spec, unsigned flags) {
    sj_clearerr();
    if (!fn) return sj_seterr(SJ_EINVAL, "sj_fn_warmup: fn is NULL");
    if (!spec) return sj_seterr(SJ_EINVAL, "sj_fn_warmup: spec is NULL");
    if (flags & ~(unsigned)ALL_FLAGS)
        return sj_seterr(SJ_EINVAL, "sj_fn_warmup: unknown flags 0x%x", flags & ~(unsigned)ALL_FLAGS);
    int n_in = fn->n_inputs;
    if (spec->n_shapes < 0) return sj_seterr(SJ_EINVAL, "sj_fn_warmup: n_shapes %d is negative", spec->n_shapes);
    if (spec->n_shapes > 0 && n_in > 0 && !spec->shapes)
        return sj_seterr(SJ_EINVAL, "sj_fn_warmup: %d shapes and shapes is NULL", spec->n_shapes);
    if (spec->outputs && (spec->n_outputs < 0 || spec->n_outputs > SJ_MAX_OUTPUTS))
        return sj_seterr(SJ_EINVAL, "sj_fn_warmup: n_outputs %d out of range [0, %d]", spec->n_outputs, SJ_MAX_OUTPUTS);
    if (spec->timeout_ms < 0) return sj_seterr(SJ_EINVAL, "sj_fn_warmup: timeout_ms %d is negative (0: no limit)", spec->timeout_ms);
    if (spec->walk_max < 0) return sj_seterr(SJ_EINVAL, "sj_fn_warmup: walk_max %lld is negative (0: none)", (long long)spec->walk_max);
    if (!spec->n_shapes && !spec->walk) return sj_seterr(SJ_EINVAL, "sj_fn_warmup: no shapes and no walk: nothing to warm");
    char what[96];
    for (int k = 0; k < spec->n_shapes; k++) {
        for (int i = 0; i < n_in; i++) {
            char nm[48];
            sj_input_name((const char *const *)fn->input_names, i, nm, sizeof nm);
            snprintf(what, sizeof what, "sj_fn_warmup: shape %d, %s", k, nm);
            sj_status st = check_desc(fn, &spec->shapes[(size_t)k * n_in + i], true, what);
            if (st) return st;
        }
        for (int o = 0; spec->outputs && o < spec->n_outputs; o++) {
            snprintf(what, sizeof what, "sj_fn_warmup: shape %d, output %d", k, o);
            const sj_tensor *t = &spec->outputs[(size_t)k * spec->n_outputs + o];
            sj_status st = t->data ? check_desc(fn, t, true, what) : SJ_OK;
            if (st) return st;
        }
    }
    walk_var vars[WALK_VARS_MAX];
    int n_vars = 0;
    int64_t combos = 0;
    int cap = fn->rt->cfg.warmup_max_shapes;
    sj_status st = SJ_OK;
    if (spec->walk) {
        for (int i = 0; i < n_in && !st; i++) {
            char nm[48];
            sj_input_name((const char *const *)fn->input_names, i, nm, sizeof nm);
            snprintf(what, sizeof what, "sj_fn_warmup: walk template, %s", nm);
            st = check_desc(fn, &spec->walk[i], false, what);
        }
        if (!st) st = walk_vars(fn, spec->walk, spec->walk_max, vars, &n_vars, &combos);
    }
    /* the template is one of the combinations when each of its walked
     * sizes is an edge: then it is not counted twice */
    bool tpl_edge = n_vars > 0;
    for (int v = 0; v < n_vars; v++) {
        bool edge = false;
        for (int k = 0; vars[v].edges && k < vars[v].n_edges; k++) edge |= vars[v].edges[k] == vars[v].size;
        tpl_edge &= edge;
    }
    int64_t total = spec->n_shapes + (spec->walk ? (combos == INT64_MAX ? combos : combos + !tpl_edge) : 0);
    if (!st && (combos == INT64_MAX || total > cap))
        st = sj_seterr(SJ_EINVAL, "sj_fn_warmup: fn '%s': %lld shapes (%d listed, %s%lld walked), more than "
                                  "warmup_max_shapes (%d, SHAPEJIT_WARMUP_MAX_SHAPES)", fn->name,
                       combos == INT64_MAX ? -1LL : (long long)total, spec->n_shapes, spec->walk && !tpl_edge ? "the template and " : "",
                       (long long)combos, cap);
    sj_warmup *w = NULL;
    if (!st) {
        w = sj_calloc(1, sizeof *w);
        if (w) w->shapes = sj_calloc((size_t)total, sizeof *w->shapes);
        if (!w || !w->shapes) {
            if (w) free(w);
            w = NULL;
            st = sj_seterr(SJ_ENOMEM, "sj_fn_warmup: out of memory");
        }
    }
    if (!st) {
        w->fn = fn;
        w->flags = flags;
        w->cap = (int)total;
        w->n_out = spec->outputs ? spec->n_outputs : 0;
        w->on_done = spec->on_done;
        w->on_done_user = spec->on_done_user;
        w->first_failed = -1;
        w->t0_ns = sj_now_ns();
        atomic_init(&w->stop, false);
        if ((st = claim(fn, w))) {
            warm_free(w);
            w = NULL;
        }
    }
    if (st) {
        for (int v = 0; v < n_vars; v++) free(vars[v].edges);
        return st;
    }

    /* the traces, here: model functions run on callers' threads only */
    for (int k = 0; k < spec->n_shapes; k++) {
        warm_shape *s = add_shape(w, n_in ? &spec->shapes[(size_t)k * n_in] : NULL,
                                  spec->outputs ? &spec->outputs[(size_t)k * spec->n_outputs] : NULL, false);
        if (!s) {
            st = sj_seterr(SJ_ENOMEM, "sj_fn_warmup: out of memory");
            break;
        }
        trace_shape(w, s);
    }
    if (!st && spec->walk) walk(w, spec->walk, vars, n_vars);
    for (int v = 0; v < n_vars; v++) free(vars[v].edges);

    /* the rest on the warm-up thread, even when nothing is left: the
     * callback always comes from there */
    if (st || pthread_create(&w->thread, NULL, warm_main, w)) {
        if (!st) st = sj_seterr(SJ_ENOMEM, "sj_fn_warmup: cannot start the warm-up thread");
        pthread_mutex_lock(&fn->warm_lock);
        fn->warm = NULL;
        atomic_store(&fn->warm_state, SJ_WARM_NONE);
        pthread_cond_broadcast(&fn->warm_cond); /* a waiter on w: it is gone */
        pthread_mutex_unlock(&fn->warm_lock);
        warm_free(w);
        return st;
    }
    pthread_mutex_lock(&fn->warm_lock);
    w->started = true;
    if (!(flags & SJ_WARMUP_BACKGROUND)) {
        int64_t deadline = spec->timeout_ms ? sj_now_ns() + (int64_t)spec->timeout_ms * 1000000 : 0;
        if (wait_over(fn, w, deadline) == SJ_ETIMEOUT) {
            int done = w->prepared + w->failed, n = w->n;
            pthread_mutex_unlock(&fn->warm_lock);
            return sj_seterr(SJ_ETIMEOUT, "sj_fn_warmup: fn '%s': %d of %d shapes done after %d ms; the warm-up goes "
                                          "on in the background", fn->name, done, n, spec->timeout_ms);
        }
    }
    /* the first failure so far (a blocking warm-up's are all in) */
    st = SJ_OK;
    if (w->first_failed >= 0) {
        const warm_shape *s = &w->shapes[w->first_failed];
        st = sj_seterr(s->status, "%s", s->message);
    }
    pthread_mutex_unlock(&fn->warm_lock);
    return st;
}

/* -- Readiness ----------------------------------------------------------------------- */

int sj_fn_ready(const sj_fn *fn) {
    return fn && atomic_load_explicit(&((sj_fn *)fn)->warm_state, memory_order_acquire) == SJ_WARM_DONE;
}

void sj_fn_warmup_status(const sj_fn *cfn, sj_warmup_status *out) {
    if (!out) return;
    sj_fn *fn = (sj_fn *)cfn;
    if (!fn) {
        status_of(NULL, SJ_WARM_NONE, out);
        return;
    }
    pthread_mutex_lock(&fn->warm_lock);
    status_of(fn->warm, (sj_warm_state)atomic_load(&fn->warm_state), out);
    pthread_mutex_unlock(&fn->warm_lock);
}

sj_status sj_fn_warmup_shape(const sj_fn *cfn, int i, sj_warmup_shape_info *out) {
    sj_clearerr();
    sj_fn *fn = (sj_fn *)cfn;
    if (!fn || !out) return sj_seterr(SJ_EINVAL, "sj_fn_warmup_shape: fn or out is NULL");
    pthread_mutex_lock(&fn->warm_lock);
    const sj_warmup *w = fn->warm;
    int n = w ? w->n : 0;
    if (i < 0 || i >= n) {
        pthread_mutex_unlock(&fn->warm_lock);
        return sj_seterr(SJ_EINVAL, "sj_fn_warmup_shape: shape %d out of range [0, %d)", i, n);
    }
    const warm_shape *s = &w->shapes[i];
    memset(out, 0, sizeof *out);
    out->state = s->state;
    out->status = s->status;
    snprintf(out->message, sizeof out->message, "%s", s->message);
    out->entry = s->e ? s->e->id : -1;
    out->walked = s->walked;
    snprintf(out->shape, sizeof out->shape, "%s", s->shape);
    snprintf(out->tier, sizeof out->tier, "%s", s->tier ? s->tier : "");
    out->graph = s->graph;
    pthread_mutex_unlock(&fn->warm_lock);
    return SJ_OK;
}

/* -- Lifecycle (jit/fn.c) --------------------------------------------------------------- */

sj_status sj_warmup_wait(sj_fn *fn, int timeout_ms) {
    pthread_mutex_lock(&fn->warm_lock);
    sj_warmup *w = fn->warm;
    sj_status st = w ? wait_over(fn, w, timeout_ms >= 0 ? sj_now_ns() + (int64_t)timeout_ms * 1000000 + 1 : 0)
                     : SJ_OK;
    int done = w ? w->prepared + w->failed : 0, n = w ? w->n : 0;
    pthread_mutex_unlock(&fn->warm_lock);
    if (st) st = sj_seterr(SJ_ETIMEOUT, "fn '%s': the warm-up has %d of %d shapes done after %d ms", fn->name, done, n,
                           timeout_ms);
    return st;
}

void sj_warmup_stop(sj_fn *fn) {
    pthread_mutex_lock(&fn->warm_lock);
    if (fn->warm) atomic_store(&fn->warm->stop, true);
    pthread_mutex_unlock(&fn->warm_lock);
}

void sj_warmup_join(sj_fn *fn) {
    pthread_mutex_lock(&fn->warm_lock);
    sj_warmup *w = fn->warm;
    bool join = w && w->started && !w->joined;
    if (join) w->joined = true;
    pthread_mutex_unlock(&fn->warm_lock);
    if (join) pthread_join(w->thread, NULL);
}

void sj_warmup_free(sj_fn *fn) {
    warm_free(fn->warm);
    fn->warm = NULL;
}

void sj_warmup_explain(sj_fn *fn, FILE *out) {
    sj_warmup_status st;
    sj_fn_warmup_status(fn, &st);
    if (st.state == SJ_WARM_NONE) return;
    fprintf(out, "  warm-up: %s, %d of %d shapes prepared, %d failed, %.1f ms\n", sj_warm_state_name(st.state),
            st.prepared, st.total, st.failed, st.elapsed_ms);
    if (st.failed) fprintf(out, "    first failure: %s\n", st.first_message);
}

/* -- Neighbouring buckets ahead (cfg.compile_ahead) ------------------------------- */

void sj_warmup_ahead(sj_fn *fn, const sj_entry *e, const sj_tensor *inputs) {
    sj_runtime *rt = fn->rt;
    if (!e->bucketed || !e->plan || rt->cfg.compile_mode != SJ_COMPILE_ASYNC) return;
    /* the first bucketed size of the call with a bucket above its own */
    int64_t from = 0, to = 0;
    pthread_mutex_lock(&fn->trace_lock); /* the policy's rules */
    for (int i = 0; i < fn->n_inputs && !to; i++)
        for (int a = 0; a < inputs[i].rank && !to; a++) {
            const sj_dim_rule *r = sj_policy_rule(&fn->policy, i, a);
            int64_t s = inputs[i].shape[a], lo, hi, lo2, hi2;
            if (r->kind != SJ_RULE_BUCKET || s < 2 || !sj_bucket_find(r->bucket, s, &lo, &hi) || hi == INT64_MAX ||
                !sj_bucket_find(r->bucket, hi + 1, &lo2, &hi2) || hi2 == INT64_MAX)
                continue;
            from = s, to = hi2;
        }
    bool room = atomic_load(&fn->table.n_entries) + 1 < fn->policy.limit;
    pthread_mutex_unlock(&fn->trace_lock);
    if (!to || !room) return;
    /* the call's descriptors with that size, and every size equal to it,
     * moved to the next bucket's upper edge; contiguous; no data (a trace
     * reads none) */
    sj_tensor in[SJ_MAX_INPUTS];
    for (int i = 0; i < fn->n_inputs; i++) {
        if (!sj_tensor_is_contiguous(&inputs[i])) return;
        in[i] = inputs[i];
        in[i].data = NULL;
        int64_t stride = 1;
        for (int a = in[i].rank - 1; a >= 0; a--) {
            if (in[i].shape[a] == from) in[i].shape[a] = to;
            in[i].stride[a] = stride;
            stride *= in[i].shape[a];
        }
    }
    int64_t syms[SJ_MAX_SYMS];
    sj_memo *m;
    sj_entry *next;
    bool transient;
    sj_status st = sj_call_prepare(fn, in, syms, &m, &next, &transient);
    if (st) {
        sj_logf(rt, SJ_LOG_PERF, "fn '%s': entry %d is hot; the next bucket (size %lld) could not be traced ahead: %s",
                fn->name, e->id, (long long)to, sj_last_error());
        sj_clearerr(); /* the call that got here succeeds */
        return;
    }
    if (transient) {
        sj_entry_free(next);
        return;
    }
    if (next == e || !next->plan) return;
    sj_logf(rt, SJ_LOG_PERF, "fn '%s': entry %d is hot: the next bucket (size %lld) is entry %d, compiled ahead", fn->name,
            e->id, (long long)to, next->id);
    if (sj_compiler_wants(rt->compiler, &next->ct)) sj_compiler_request(rt->compiler, fn, next, NULL);
}
