/* Graphs of fused calls: one launch instead of one per kernel. The
 * device-neutral policy (when to capture, which graph serves a call), the
 * capture jobs the compile queue runs, their back-off, and the graph memory
 * budget; the capture mechanics are the device's.
 *
 * A small fused call is bound by the host: each kernel launch costs a few
 * microseconds and each cuBLASLt product about eight, so the encoder layer
 * at 16 tokens spends 50 of its 60 microseconds queuing 9 kernels. A graph
 * of the call queues them all with one cuGraphLaunch.
 *
 * A graph is the call's kernels with their arguments frozen: the input,
 * output, parameter and intermediate addresses, and every size. So a graph
 * belongs to one memo item (one exact input signature: sizes, strides,
 * symbol values), one piece of code (the memo's specialization or its
 * entry's symbolic kernels), one set of caller buffers and one stream (the
 * runtime's, for sj_call on it or on a lane, or a caller's through
 * sj_call_stream); it owns the
 * call's intermediate arena. The contents of the buffers may change freely
 * between calls; a call with other buffers does not match and runs kernel by
 * kernel.
 *
 * When. A warm-up (jit/warmup.c) asks for the capture of a shape it
 * prepares with the caller's buffers at once (sj_graphs_request).
 * Otherwise, a fused call with every output given that succeeded kernel by
 * kernel asks for a capture when it is the SJ_GRAPH_AFTER-th such call of
 * its signature with these buffers on this stream (servers reuse their staging buffers and streams; each signature
 * counts its SJ_MEMO_GRAPHS most seen buffer sets); at most SJ_MEMO_GRAPHS
 * graphs per signature and cfg.cuda_graphs per runtime. The capture and
 * the instantiation, 0.5 to 1 ms for the encoder layer on an H200, run as
 * a JOB_CAPTURE job of the compile queue (jit/compile.c), taken by a
 * compile worker before any compile (or by sj_runtime_run_background with
 * compile_threads 0; in sync compile mode by the calling thread once its
 * call is over): the call that asks for one,
 * and every call until it is published, runs kernel by kernel, so no
 * request waits on a capture; but captures slow the calls running at the
 * same time (w5 on an H200: p99 0.11 ms with no graphs, 0.58-0.69 ms while
 * 8-56 graphs were captured). A graph saves that layer 15 us a call at 16
 * tokens (0.062 -> 0.047 ms), so its capture costs about 50 calls'
 * savings: as in renting skis, a signature and buffer set is captured once
 * it has made that many calls (SJ_GRAPH_AFTER), which bounds the loss on
 * shapes that stop coming back to about twice the best choice made in
 * hindsight. Bucketed servers' shapes pass it in milliseconds; a stream
 * of lengths that rarely repeat, like w5's, never does.
 *
 * How: the device's graph slots (kernels/device.h; CUDA's in
 * kernels/cuda/graph_cuda.c) capture the plan run as usual into a graph
 * that owns the call's intermediates, and say how many bytes it holds.
 * Anything that cannot be captured fails the capture. A failed capture
 * backs off as a compile does (LuaJIT's penalty_pc): its signature's
 * n-th failure makes it wait compile_retry_ms * 2^(n-1) +-25% on the
 * runtime's clock, and SJ_GRAPH_AFTER calls again, before it is asked
 * for again; after compile_max_failures it is blacklisted (graph_off).
 *
 * Memory (cfg.graph_max_bytes, per function, as specialize_max_bytes).
 * A new graph that would pass the budget evicts the function's least
 * recently replayed graphs first (a served call stamps its graph's
 * millisecond tick when it changed, only with a budget): each is taken out
 * of its slot, then, once no call can still be launching it (the budget's
 * grace period, jit/budget.h: with a graph budget calls mark themselves as
 * with a specialization budget), freed; its signature counts towards a
 * capture again from zero. Only graphs kept for the device's own stream
 * are evicted: a call on it waits for its graph (or the stream orders the
 * graph's memory), where a caller's stream (sj_call_stream) may still run
 * one after its call returned. A graph that cannot fit is not kept, and
 * its capture backs off as a failed one.
 *
 * Threads. One capture at a time per signature (graph_busy, set from the
 * request until its job is done with it); captures of different
 * signatures may run on several workers at once (the device serializes
 * them: its capture_lock). A capture job publishes into an empty slot with
 * a release store; an eviction empties a slot with an exchange; so a
 * launching thread needs no lock. Graphs left are destroyed with their
 * memo item, when the function is, after sj_compiler_cancel_fn has dropped
 * its queued captures and waited for running ones. fn->graph_lock (a leaf,
 * held for no wait and no device call) covers the budget's accounting and
 * choice of victims.
 */
#include "jit/graphs.h"

#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/clock.h"
#include "base/error.h"
#include "base/tensor.h"
#include "jit/budget.h"
#include "jit/runtime.h"
#include "specialize/fusion.h"

#define RELAXED memory_order_relaxed

/* What a capture ran: the plan, fused, on the capture's call context. */
typedef struct capture_run {
    const sj_exec *x;
    const struct sj_fplan *plan;
    const sj_compiled *cd;
} capture_run;

/* A graph, from its request (a capture job) to its free. The call it
 * captures is kept with it (the device may run it again to replay). */
typedef struct sj_cgraph {
    sj_memo *m;            /* whose graph it is */
    const sj_compiled *cd; /* the code captured */
    const void *stream;    /* where it is launched: the calls' stream (the device's graph_stream) */
    void *dev;             /* the device's graph */
    int64_t bytes;         /* the device memory it holds (graph_capture's) */
    _Atomic uint32_t used_tick; /* its last replay (sj_budget_tick), with a graph budget */
    int n_in, n_out;
    sj_tensor in[SJ_MAX_INPUTS];   /* the caller's inputs (descriptors only) */
    sj_tensor out[SJ_MAX_OUTPUTS]; /* the caller's outputs, as checked at capture */
    sj_exec x;                     /* the call, over in and out */
    capture_run run;
    /* A bucket graph's (cfg.bucket_graphs; bucket false: a shape's): */
    bool bucket;
    sj_entry *e;                   /* whose bucket */
    sj_runtime *rt;
    int64_t hi[64];                /* the bucket's largest sizes: captured and laid out for them */
    int copies;                    /* the device's copies of it to keep (bucket_why_not) */
    void *bufs[SJ_MAX_INPUTS + SJ_MAX_OUTPUTS]; /* the graph's input, then output buffers (the device's) */
    unsigned char direct[SJ_MAX_INPUTS + SJ_MAX_OUTPUTS]; /* a replay passes the caller's buffer instead */
    size_t in_bytes;               /* the inputs' bytes at the bucket's largest sizes */
} sj_cgraph;

static bool same_output(const sj_tensor *a, const sj_tensor *b) {
    if (a->data != b->data || a->dtype != b->dtype || a->rank != b->rank || a->device != b->device) return false;
    for (int i = 0; i < a->rank; i++)
        if (a->shape[i] != b->shape[i] || a->stride[i] != b->stride[i]) return false;
    return true;
}

static bool matches(const sj_cgraph *g, const sj_exec *x, const sj_compiled *cd, const void *s) {
    if (g->cd != cd || g->stream != s) return false;
    for (int i = 0; i < g->n_in; i++)
        if (x->inputs[i].data != g->in[i].data) return false;
    for (int i = 0; i < g->n_out; i++)
        if (!same_output(&x->outputs[i], &g->out[i])) return false;
    return true;
}

/* The call's buffers, stream and code, hashed (sj_sig_hash) into the high
 * bits, the low 6 clear for a count; never 0 (0: a free slot). */
static uint64_t buffers_hash(const sj_exec *x, const sj_compiled *cd, const void *s) {
    int64_t w[2 + SJ_MAX_INPUTS + SJ_MAX_OUTPUTS];
    int n = 0;
    w[n++] = (int64_t)(uintptr_t)cd;
    w[n++] = (int64_t)(uintptr_t)s;
    for (int i = 0; i < x->g->n_inputs; i++) w[n++] = (int64_t)(uintptr_t)x->inputs[i].data;
    for (int i = 0; i < x->g->n_outputs; i++) w[n++] = (int64_t)(uintptr_t)x->outputs[i].data;
    return ((uint64_t)sj_sig_hash(w, n) + 1) << 6;
}

/* Count a call with buffers h that no graph served; true when it is the
 * SJ_GRAPH_AFTER-th. Slots hold the buffer sets seen most; a new one takes
 * the slot with the lowest count. Racy by design: a lost count only
 * delays a capture. */
static bool seen_enough(sj_memo *m, uint64_t h) {
    int low = 0;
    uint64_t low_n = 64;
    for (int i = 0; i < SJ_MEMO_GRAPHS; i++) {
        uint64_t v = atomic_load_explicit(&m->graph_seen[i], RELAXED), n = v & 63;
        if ((v & ~(uint64_t)63) == h) {
            if (n < 63) atomic_store_explicit(&m->graph_seen[i], h | (n + 1), RELAXED);
            return n + 1 >= SJ_GRAPH_AFTER;
        }
        if (n < low_n) low = i, low_n = n;
    }
    atomic_store_explicit(&m->graph_seen[low], h | 1, RELAXED);
    return SJ_GRAPH_AFTER <= 1;
}

/* Counts start again from zero (a failed or evicted graph's signature). */
static void forget_seen(sj_memo *m) {
    for (int i = 0; i < SJ_MEMO_GRAPHS; i++) atomic_store_explicit(&m->graph_seen[i], 0, RELAXED);
}

/* Free a graph record (and the device's graph in it). */
static void destroy(sj_runtime *rt, sj_cgraph *g) {
    if (g->dev) rt->backend->graph_free(rt->backend, g->dev);
    free(g);
}

/* The graph of m for this code, these buffers and stream s, or NULL; with
 * free_slot, the first empty slot there (SJ_MEMO_GRAPHS: none). seq_cst
 * loads: after a call's sj_budget_enter mark, as its code's load. */
static const sj_cgraph *find(sj_memo *m, const sj_exec *x, const sj_compiled *cd, const void *s, int *free_slot) {
    int k = SJ_MEMO_GRAPHS;
    const sj_cgraph *hit = NULL;
    for (int i = 0; i < SJ_MEMO_GRAPHS; i++) {
        const sj_cgraph *g = atomic_load(&m->graphs[i]);
        if (!g) {
            if (k == SJ_MEMO_GRAPHS) k = i;
            continue;
        }
        if (!hit && matches(g, x, cd, s)) hit = g;
    }
    if (free_slot) *free_slot = k;
    return hit;
}

static bool bucket_serve(sj_fn *fn, sj_cgraph *g, const sj_exec *x, sj_status *st);

sj_graph_use sj_graphs_call(sj_fn *fn, sj_memo *m, const sj_exec *x, const sj_compiled *cd, sj_status *st) {
    const sj_backend *b = x->ops;
    if (!m || fn->rt->cfg.cuda_graphs <= 0 || !b->graph_capture || atomic_load_explicit(&m->graph_off, RELAXED))
        return SJ_GRAPH_NO;
    for (int i = 0; i < x->g->n_outputs; i++)
        if (!x->outputs[i].data) return SJ_GRAPH_NO; /* allocated per call: new addresses each time */
    sj_cgraph *g = (sj_cgraph *)find(m, x, cd, b->graph_stream(x->ops_ctx), NULL);
    if (!g) {
        sj_cgraph *bg = atomic_load_explicit(&sj_memo_entry(m)->bgraph, memory_order_acquire);
        return bg && bucket_serve(fn, bg, x, st) ? SJ_GRAPH_SERVED : SJ_GRAPH_COUNT;
    }
    if (fn->rt->cfg.graph_max_bytes) { /* its last use, for the budget's eviction order */
        uint32_t tick = sj_budget_tick(fn->rt);
        if (atomic_load_explicit(&g->used_tick, RELAXED) != tick) atomic_store_explicit(&g->used_tick, tick, RELAXED);
    }
    *st = b->graph_launch(x->ops_ctx, g->dev);
    if (!*st) atomic_fetch_add_explicit(&fn->hot[sj_shard_index()].graph_calls, 1, RELAXED);
    return SJ_GRAPH_SERVED;
}

static sj_status fit(sj_fn *fn, sj_cgraph *g, sj_status st, size_t bytes, char *why, size_t wn);

/* -- Bucket graphs (cfg.bucket_graphs) -------------------------------------------- */

/* The most device memory a bucket graph may hold (its intermediates and
 * input and output buffers at the bucket's largest sizes) where
 * graph_max_bytes sets no budget. */
#define SJ_BUCKET_GRAPH_MAX_BYTES ((int64_t)256 << 20)
/* Inputs at the bucket's largest sizes up to this many bytes: every call of
 * the bucket is served, however small (above it, only calls with at least
 * a quarter of those bytes). */
#define SJ_BUCKET_GRAPH_SMALL_BYTES ((size_t)1 << 20)

/* The bytes of graph value v, contiguous, at the sizes exv. */
static int64_t value_bytes(const sj_graph *gr, int32_t v, const int64_t *exv) {
    const sj_value *val = &gr->vals[v];
    int64_t n = (int64_t)sj_dtype_size(val->dtype);
    for (int i = 0; i < val->rank; i++) n *= exv[val->shape[i]];
    return n;
}

/* Why entry e cannot have a bucket graph (NULL: it can; why[] holds the
 * message otherwise); its largest sizes in hi, and in *copies how many
 * copies of its graph the device keeps (cfg.bucket_graph_execs, or the
 * bucket's count of sizes if fewer: a size tied to a constant counts
 * one). Once per entry, off the call path. */
static const char *bucket_why_not(const sj_runtime *rt, const sj_entry *e, int64_t *hi, int *copies, char *why,
                                  size_t wn) {
    const sj_graph *g = e->g;
    int n = sj_sym_count(g->ex);
    if (!e->plan) return "no fused plan";
    if (n > 64) return "more than 64 symbols";
    int64_t want = rt->cfg.bucket_graph_execs > 0 ? rt->cfg.bucket_graph_execs : 1, sizes = 1;
    for (int i = 0; i < n; i++) {
        int64_t lo, h;
        sj_sym_range(g->ex, i, &lo, &h);
        bool pinned = i < 64 && (e->pinned_syms >> i & 1);
        if (pinned) h = sj_sym_hint(g->ex, i); /* tied to a constant */
        if (h == SJ_EX_INF || h < 1) return "a size without an upper bound (the open bucket, or no bucket)";
        hi[i] = h;
        int64_t r = h - (lo > 0 ? lo : 0) + 1; /* (sizes < want <= 4096, r < want: no overflow) */
        if (!pinned && sizes < want) sizes = r >= want ? want : sizes * r;
    }
    *copies = (int)(sizes < want ? sizes : want);
    for (int v = 0; v < g->n_vals; v++) {
        int64_t c;
        if (e->plan->layouts[v].store >= 0 && !sj_ex_is_const(g->ex, e->plan->layouts[v].offset, &c))
            return "a value at an offset that depends on a size";
    }
    /* its memory at the bucket's largest sizes */
    int64_t *exv = sj_malloc(sizeof(int64_t) * (size_t)sj_ex_count(g->ex));
    if (!exv) return "out of memory";
    sj_ex_eval_all(g->ex, hi, exv);
    int64_t bytes = exv[e->plan->arena_bytes];
    for (int v = 0; v < g->n_vals; v++)
        if (g->vals[v].kind == SJ_VAL_INPUT) bytes += value_bytes(g, v, exv);
    for (int i = 0; i < g->n_outputs; i++) bytes += value_bytes(g, g->outputs[i], exv);
    free(exv);
    int64_t max = rt->cfg.graph_max_bytes ? (int64_t)rt->cfg.graph_max_bytes : SJ_BUCKET_GRAPH_MAX_BYTES;
    if (bytes > max) {
        snprintf(why, wn, "its buffers at the bucket's largest sizes would take %lld bytes, more than %s %lld",
                 (long long)bytes, rt->cfg.graph_max_bytes ? "graph_max_bytes" : "the default bound of",
                 (long long)max);
        return why;
    }
    return NULL;
}

static void unreserve_bucket(sj_runtime *rt, sj_entry *e) {
    atomic_fetch_sub(&rt->cuda_graphs, 1);
    atomic_store(&e->bgraph_busy, false);
}

/* Count a fused call of m's entry that no graph served; at SJ_GRAPH_AFTER
 * (force: at once) ask for the entry's bucket graph. Returns a job for the
 * caller to run (sync mode), else NULL. */
static void *bucket_note(sj_fn *fn, sj_memo *m, const sj_exec *x, bool force) {
    sj_runtime *rt = fn->rt;
    const sj_backend *b = x->ops;
    if (!m || !rt->cfg.bucket_graphs || !b->graph_capture_bucket || !b->graph_replay) return NULL;
    sj_entry *e = sj_memo_entry(m);
    if (!e->symbolic || atomic_load_explicit(&e->bgraph_off, RELAXED) || atomic_load_explicit(&e->bgraph, RELAXED) ||
        atomic_load_explicit(&e->bgraph_busy, RELAXED))
        return NULL;
    if (b->graph_stream(x->ops_ctx) != sj_runtime_stream(rt)) return NULL; /* sj_call's alone */
    if (atomic_load_explicit(&rt->cuda_graphs, RELAXED) >= rt->cfg.cuda_graphs) return NULL; /* (no count then) */
    if (!force && atomic_fetch_add_explicit(&e->bgraph_seen, 1, RELAXED) + 1 < SJ_GRAPH_AFTER) return NULL;
    /* the entry's code, done with its validation */
    sj_compiled *cd = atomic_load_explicit(&e->ct.ready, memory_order_acquire);
    if (!cd || atomic_load_explicit(&cd->checks_left, RELAXED) != 0) return NULL;
    if (atomic_load_explicit(&rt->cuda_graphs, RELAXED) >= rt->cfg.cuda_graphs) return NULL;
    if (atomic_exchange(&e->bgraph_busy, true)) return NULL;
    int64_t hi[64];
    int copies = 1;
    char whybuf[200];
    const char *why = bucket_why_not(rt, e, hi, &copies, whybuf, sizeof whybuf);
    if (why) {
        atomic_store(&e->bgraph_off, true);
        atomic_store(&e->bgraph_busy, false);
        sj_logf(rt, SJ_LOG_PERF, "fn '%s': entry %d (%s): no bucket graph: %s", fn->name, e->id, e->what, why);
        return NULL;
    }
    if (atomic_fetch_add(&rt->cuda_graphs, 1) >= rt->cfg.cuda_graphs) {
        atomic_fetch_sub(&rt->cuda_graphs, 1);
        atomic_store(&e->bgraph_busy, false);
        return NULL;
    }
    sj_cgraph *g = sj_calloc(1, sizeof *g); /* once per entry */
    if (!g) {
        unreserve_bucket(rt, e);
        return NULL;
    }
    g->bucket = true;
    g->e = e;
    g->m = m;
    g->rt = rt;
    g->cd = cd;
    g->stream = sj_runtime_stream(rt);
    g->n_in = e->g->n_inputs;
    g->n_out = e->g->n_outputs;
    memcpy(g->hi, hi, sizeof hi);
    g->copies = copies;
    g->x = (sj_exec){.rt = rt, .g = e->g, .fn_name = fn->name, .inputs = g->in, .outputs = g->out,
                     .sym_vals = g->hi, .layout_syms = g->hi, .pool = &fn->pool, .arena_hint = &e->arena_hint,
                     .ops = rt->backend, .gemm_pick = cd->gemm_pick};
    g->run = (capture_run){&g->x, e->plan, cd};
    if (sj_compiler_request_capture(rt->compiler, fn, g)) return NULL; /* a worker runs it */
    if (!sj_compiler_async(rt->compiler)) return g;                   /* the caller runs it */
    free(g);
    unreserve_bucket(rt, e);
    return NULL;
}

/* A descriptor of graph value v, contiguous, at the sizes exv. */
static size_t value_desc(const sj_graph *gr, int32_t v, const int64_t *exv, sj_device dev, sj_tensor *t) {
    const sj_value *val = &gr->vals[v];
    memset(t, 0, sizeof *t);
    t->dtype = val->dtype;
    t->rank = val->rank;
    t->device = dev;
    for (int i = 0; i < val->rank; i++) t->shape[i] = exv[val->shape[i]];
    sj_tensor_set_contiguous(t);
    return (size_t)value_bytes(gr, v, exv);
}

/* What a bucket graph's capture runs: the call at the bucket's largest
 * sizes on the graph's buffers. */
static sj_status bucket_run(void *arg, void *cc) {
    sj_cgraph *g = arg;
    for (int i = 0; i < g->n_in; i++) g->in[i].data = g->bufs[i];
    for (int i = 0; i < g->n_out; i++) g->out[i].data = g->bufs[g->n_in + i];
    sj_exec xc = g->x;
    xc.ops_ctx = cc;
    return sj_exec_fused(&xc, g->run.plan, g->run.cd->fns);
}

/* A bucket graph's replay: the call at its own sizes on the graph's
 * buffers, or the caller's where they are direct (graph_replay updates
 * the graph's kernels with it). */
typedef struct bucket_call {
    const sj_exec *x;
    const sj_cgraph *g;
} bucket_call;

static sj_status bucket_update(void *arg, void *cc) {
    const bucket_call *bc = arg;
    const sj_cgraph *g = bc->g;
    sj_tensor in[SJ_MAX_INPUTS], out[SJ_MAX_OUTPUTS];
    for (int i = 0; i < g->n_in; i++) {
        in[i] = bc->x->inputs[i];
        if (!g->direct[i]) in[i].data = g->bufs[i];
    }
    for (int i = 0; i < g->n_out; i++) {
        out[i] = bc->x->outputs[i];
        if (!g->direct[g->n_in + i]) out[i].data = g->bufs[g->n_in + i];
    }
    sj_exec xu = *bc->x;
    xu.inputs = in;
    xu.outputs = out;
    xu.layout_syms = g->hi;
    xu.gemm_pick = g->cd->gemm_pick;
    xu.ops_ctx = cc;
    return sj_exec_fused(&xu, g->run.plan, g->cd->fns);
}

/* Serve call x with its entry's bucket graph g: true when it did (*st its
 * status). */
static bool bucket_serve(sj_fn *fn, sj_cgraph *g, const sj_exec *x, sj_status *st) {
    const sj_backend *b = x->ops;
    if (g->stream != b->graph_stream(x->ops_ctx)) return false;
    const void *src[SJ_MAX_INPUTS];
    void *dst[SJ_MAX_OUTPUTS];
    size_t bytes[SJ_MAX_INPUTS + SJ_MAX_OUTPUTS];
    size_t in_bytes = 0;
    for (int i = 0; i < g->n_in; i++) {
        const sj_tensor *t = &x->inputs[i];
        if (t->device != b->device || !sj_tensor_is_contiguous(t)) return false;
        src[i] = t->data;
        in_bytes += bytes[i] = sj_tensor_nbytes(t);
    }
    /* a call under a quarter of a large bucket's largest (a wide
     * profile's short ones): its products would run over 4 times its rows
     * (where the largest inputs are small, the call is bound by launches,
     * not by its rows: served) */
    if (in_bytes * 4 < g->in_bytes && g->in_bytes > SJ_BUCKET_GRAPH_SMALL_BYTES) return false;
    for (int i = 0; i < g->n_out; i++) {
        const sj_tensor *t = &x->outputs[i];
        dst[i] = t->data;
        bytes[g->n_in + i] = sj_tensor_nbytes(t);
    }
    bucket_call bc = {x, g};
    bool served = false;
    *st = b->graph_replay(x->ops_ctx, g->dev, x->sym_vals, sj_sym_count(x->g->ex), g->n_in, src, dst, bytes,
                          bucket_update, &bc, &served);
    if (!served) return false;
    if (!*st) {
        atomic_fetch_add_explicit(&fn->hot[sj_shard_index()].graph_calls, 1, RELAXED);
        atomic_fetch_add_explicit(&fn->c.bucket_graph_calls, 1, RELAXED);
    }
    return true;
}

/* A bucket graph's capture job: capture at the bucket's largest sizes,
 * fit it under graph_max_bytes, publish; a failure turns the entry's
 * bucket graph off for good (its calls run kernel by kernel, or by
 * graphs of their exact shapes). */
static void bucket_capture_run(sj_fn *fn, sj_cgraph *g) {
    sj_runtime *rt = fn->rt;
    sj_entry *e = g->e;
    const sj_graph *gr = e->g;
    size_t sizes[SJ_MAX_INPUTS + SJ_MAX_OUTPUTS];
    int64_t t0 = sj_now_ns();
    int64_t *exv = sj_malloc(sizeof(int64_t) * (size_t)sj_ex_count(gr->ex));
    sj_status st = exv ? SJ_OK : sj_seterr(SJ_ENOMEM, "out of memory for a bucket graph's sizes");
    if (!st) {
        sj_ex_eval_all(gr->ex, g->hi, exv);
        for (int v = 0; v < gr->n_vals; v++)
            if (gr->vals[v].kind == SJ_VAL_INPUT && gr->vals[v].index >= 0 && gr->vals[v].index < g->n_in)
                sizes[gr->vals[v].index] = value_desc(gr, v, exv, rt->backend->device, &g->in[gr->vals[v].index]);
        for (int i = 0; i < g->n_out; i++)
            sizes[g->n_in + i] = value_desc(gr, gr->outputs[i], exv, rt->backend->device, &g->out[i]);
        for (int i = 0; i < g->n_in; i++) g->in_bytes += sizes[i];
        free(exv);
    }
    size_t bytes = 0;
    if (!st)
        st = rt->backend->graph_capture_bucket(rt->backend, gr, g->run.plan, e->head.n_syms, g->stream, g->n_in,
                                               g->n_in + g->n_out, sizes, g->bufs, g->copies, bucket_run, g,
                                               &g->dev, &bytes, g->direct);
    double ms = (double)(sj_now_ns() - t0) / 1e6;
    char why[300];
    st = fit(fn, g, st, bytes, why, sizeof why);
    if (st) {
        atomic_store(&e->bgraph_off, true);
        atomic_fetch_add_explicit(&fn->c.graph_failures, 1, RELAXED);
        sj_logf(rt, SJ_LOG_PERF, "fn '%s': entry %d (%s): no bucket graph: %s", fn->name, e->id, e->what, why);
        sj_clearerr();
        destroy(rt, g);
        unreserve_bucket(rt, e);
        return;
    }
    atomic_store_explicit(&e->bgraph, g, memory_order_release);
    atomic_store(&e->bgraph_busy, false);
    atomic_fetch_add_explicit(&fn->c.graphs, 1, RELAXED);
    atomic_fetch_add_explicit(&fn->c.bucket_graphs, 1, RELAXED);
    sj_logf(rt, SJ_LOG_PERF, "fn '%s': entry %d (%s): captured a bucket graph in %.2f ms, %lld bytes (%d in the runtime)",
            fn->name, e->id, e->what, ms, (long long)g->bytes, atomic_load(&rt->cuda_graphs));
    if (sj_log_wants_events(&rt->log))
        sj_emit(rt, (sj_event){.kind = SJ_EVENT_GRAPH_CAPTURED, .topic = SJ_LOG_PERF, .fn = fn->name, .entry = e->id,
                               .shape = e->what, .duration_ms = ms, .count = 1, .bytes = g->bytes});
}

void sj_graphs_free_bucket(void *graph) {
    sj_cgraph *g = graph;
    sj_runtime *rt = g->rt;
    destroy(rt, g);
    atomic_fetch_sub(&rt->cuda_graphs, 1);
}

/* A capture job for this call's plan with its buffers (graph_busy is set
 * and a graph of the runtime's count reserved); NULL: out of memory. */
static sj_cgraph *make_job(sj_fn *fn, sj_memo *m, const sj_exec *x, const sj_fplan *plan, const sj_compiled *cd,
                           const void *s) {
    sj_cgraph *g = sj_calloc(1, sizeof *g); /* once per capture, never on a served call */
    if (!g) return NULL;
    sj_entry *e = sj_memo_entry(m);
    g->m = m;
    g->cd = cd;
    g->stream = s;
    g->n_in = e->g->n_inputs;
    g->n_out = e->g->n_outputs;
    memcpy(g->in, x->inputs, sizeof(sj_tensor) * (size_t)g->n_in);
    memcpy(g->out, x->outputs, sizeof(sj_tensor) * (size_t)g->n_out);
    g->x = (sj_exec){.rt = fn->rt, .g = e->g, .fn_name = fn->name, .inputs = g->in, .outputs = g->out,
                     .sym_vals = m->head.syms, .pool = &fn->pool, .arena_hint = &e->arena_hint,
                     .ops = fn->rt->backend, .gemm_pick = cd->gemm_pick};
    g->run = (capture_run){&g->x, plan, cd};
    return g;
}

/* Give back what a request reserved: the runtime's count and m's busy
 * mark (a job that never ran, or whose graph was not kept). */
static void unreserve(sj_runtime *rt, sj_memo *m) {
    atomic_fetch_sub(&rt->cuda_graphs, 1);
    atomic_store(&m->graph_busy, false);
}

/* Ask for a capture of this call's buffers unless one is published, queued
 * or running for them, there is no room, or the signature's back-off says
 * not yet; force: whatever the count of calls seen (a warm-up's request).
 * Returns a job for the caller to run (sync mode), else NULL. */
static void *note(sj_fn *fn, sj_memo *m, const sj_exec *x, const sj_fplan *plan, const sj_compiled *cd, bool force) {
    sj_runtime *rt = fn->rt;
    const void *s = x->ops->graph_stream(x->ops_ctx);
    int k;
    if (find(m, x, cd, s, &k) || k == SJ_MEMO_GRAPHS) return NULL; /* published meanwhile, or no room */
    if (!force && !seen_enough(m, buffers_hash(x, cd, s))) return NULL;
    /* a failed capture's penalty (the clock read only here: at most once
     * per SJ_GRAPH_AFTER calls after a failure, which resets the counts) */
    int64_t retry = atomic_load_explicit(&m->graph_retry_ns, RELAXED);
    if (retry && sj_runtime_now_ns(rt) < retry) return NULL;
    if (atomic_load_explicit(&rt->cuda_graphs, RELAXED) >= rt->cfg.cuda_graphs) return NULL;
    if (atomic_exchange(&m->graph_busy, true)) return NULL; /* a capture of this signature is queued or running */
    /* a graph published since the find above may hold these very buffers */
    bool go = !find(m, x, cd, s, &k) && k < SJ_MEMO_GRAPHS;
    if (go && atomic_fetch_add(&rt->cuda_graphs, 1) >= rt->cfg.cuda_graphs) { /* reserve one of the runtime's */
        atomic_fetch_sub(&rt->cuda_graphs, 1);
        go = false;
    }
    if (!go) {
        atomic_store(&m->graph_busy, false);
        return NULL;
    }
    sj_cgraph *job = make_job(fn, m, x, plan, cd, s);
    if (job && sj_compiler_request_capture(rt->compiler, fn, job)) return NULL; /* a worker runs it */
    if (job && !sj_compiler_async(rt->compiler)) return job;                   /* the caller runs it */
    free(job);
    unreserve(rt, m);
    return NULL;
}

void *sj_graphs_note(sj_fn *fn, sj_memo *m, const sj_exec *x, const sj_fplan *plan, const sj_compiled *cd) {
    if (cd->quick) return NULL; /* its full compile replaces it soon: no graph of it */
    void *job = bucket_note(fn, m, x, false);
    return job ? job : note(fn, m, x, plan, cd, false);
}

void *sj_graphs_request(sj_fn *fn, sj_memo *m, const sj_exec *x, const sj_fplan *plan, const sj_compiled *cd,
                        bool buffers) {
    if (fn->rt->cfg.cuda_graphs <= 0 || !x->ops->graph_capture || cd->quick) return NULL;
    void *job = bucket_note(fn, m, x, true); /* (any buffers: a bucket graph has its own) */
    if (job || !buffers || atomic_load_explicit(&m->graph_off, RELAXED)) return job;
    for (int i = 0; i < x->g->n_outputs; i++)
        if (!x->outputs[i].data) return NULL; /* the warm-up's own outputs: never seen again */
    return note(fn, m, x, plan, cd, true);
}

void sj_graphs_capture_drop(sj_fn *fn, void *arg) {
    sj_cgraph *g = arg;
    if (g->bucket) unreserve_bucket(fn->rt, g->e);
    else unreserve(fn->rt, g->m);
    free(g);
}

/* -- The graph budget (graph_max_bytes) ------------------------------------------- */

/* fn's least recently replayed graph that may be evicted (kept for the
 * device's own stream), other than none; NULL if none. Its slot in *slot.
 * fn->graph_lock held. Walks the memo's read index. */
static sj_cgraph *lru_graph(sj_fn *fn, uint32_t now_tick, sj_memo **owner, int *slot) {
    sj_memo_index *ix = atomic_load_explicit(&fn->table.index, memory_order_acquire);
    const void *own = sj_runtime_stream(fn->rt);
    sj_cgraph *best = NULL;
    uint32_t best_age = 0;
    for (size_t i = 0; ix && i < ix->cap; i++) {
        sj_memo *m = sj_memo_of(atomic_load_explicit(&ix->slot[i], memory_order_acquire));
        for (int k = 0; m && k < SJ_MEMO_GRAPHS; k++) {
            sj_cgraph *g = atomic_load_explicit(&m->graphs[k], memory_order_acquire);
            if (!g || g->stream != own) continue;
            uint32_t age = now_tick - atomic_load_explicit(&g->used_tick, RELAXED); /* wraps: ages stay right */
            if (!best || age > best_age) best = g, best_age = age, *owner = m, *slot = k;
        }
    }
    return best;
}

/* Make room for new graph g of fn under graph_max_bytes: evict the least
 * recently replayed ones onto *victims (out of their slots, still to be
 * freed once no call launches them) and count g's bytes in. False (nothing
 * counted) when g cannot fit. */
static bool admit(sj_fn *fn, sj_cgraph *g, sj_cgraph **victims, int *n_victims) {
    uint64_t max = fn->rt->cfg.graph_max_bytes;
    bool fits = true;
    pthread_mutex_lock(&fn->graph_lock);
    if (max && (uint64_t)g->bytes > max) fits = false;
    uint32_t tick = sj_budget_tick(fn->rt);
    while (fits && max && (uint64_t)(atomic_load_explicit(&fn->graph_bytes, RELAXED) + g->bytes) > max) {
        sj_memo *vm = NULL;
        int k = 0;
        sj_cgraph *v = lru_graph(fn, tick, &vm, &k);
        if (!v || *n_victims == SJ_MEMO_GRAPHS * 16) {
            fits = false; /* what is left is not evictable */
            break;
        }
        void *expect = v;
        if (!atomic_compare_exchange_strong(&vm->graphs[k], &expect, NULL)) continue; /* (cannot: only evictions
                                                                                         empty a slot, locked) */
        atomic_fetch_sub_explicit(&fn->graph_bytes, v->bytes, RELAXED);
        victims[(*n_victims)++] = v;
    }
    if (fits) atomic_fetch_add_explicit(&fn->graph_bytes, g->bytes, RELAXED);
    pthread_mutex_unlock(&fn->graph_lock);
    return fits;
}

/* Free evicted graphs once no call can be launching them (no lock held). */
static void evict(sj_fn *fn, sj_cgraph **victims, int n) {
    if (!n) return;
    sj_runtime *rt = fn->rt;
    uint32_t tick = sj_budget_tick(rt);
    sj_budget_wait_calls(fn); /* calls that loaded a victim marked themselves before */
    for (int i = 0; i < n; i++) {
        sj_cgraph *v = victims[i];
        sj_memo *m = v->m;
        int64_t bytes = v->bytes;
        uint32_t unused = tick - atomic_load_explicit(&v->used_tick, RELAXED);
        destroy(rt, v);
        atomic_fetch_sub(&rt->cuda_graphs, 1);
        forget_seen(m); /* its calls earn a capture again */
        atomic_fetch_add_explicit(&fn->c.graph_evictions, 1, RELAXED);
        char shape[128];
        sj_memo_shape(m, shape, sizeof shape);
        sj_logf(rt, SJ_LOG_PERF,
                "fn '%s': entry %d shape (%s): CUDA graph evicted (graph_max_bytes %llu): %lld bytes freed, "
                "unreplayed for %u ms",
                fn->name, sj_memo_entry(m)->id, shape, (unsigned long long)rt->cfg.graph_max_bytes, (long long)bytes,
                unused);
        sj_emit(rt, (sj_event){.kind = SJ_EVENT_GRAPH_EVICTED, .topic = SJ_LOG_PERF, .fn = fn->name,
                               .entry = sj_memo_entry(m)->id, .shape = shape, .error = "", .bytes = bytes,
                               .duration_ms = (double)unused});
    }
}

/* After graph g's capture (st, its bytes): make room for it under
 * graph_max_bytes, evicting what must go. Returns st, or SJ_ENOMEM when it
 * cannot fit; on a failure why says what went wrong. */
static sj_status fit(sj_fn *fn, sj_cgraph *g, sj_status st, size_t bytes, char *why, size_t wn) {
    g->bytes = st ? 0 : (int64_t)bytes;
    sj_cgraph *victims[SJ_MEMO_GRAPHS * 16];
    int n_victims = 0;
    if (st) {
        snprintf(why, wn, "%s", sj_last_error());
    } else if (!admit(fn, g, victims, &n_victims)) {
        st = SJ_ENOMEM;
        snprintf(why, wn, "its %lld bytes do not fit in graph_max_bytes %llu", (long long)g->bytes,
                 (unsigned long long)fn->rt->cfg.graph_max_bytes);
        atomic_fetch_add_explicit(&fn->c.graph_over_budget, 1, RELAXED);
    }
    evict(fn, victims, n_victims);
    return st;
}

/* -- Capture jobs (a compile worker, or the caller in sync mode; no lock held) -------- */

static sj_status run_capture(void *arg, void *cc) {
    const capture_run *r = arg;
    sj_exec xc = *r->x;
    xc.ops_ctx = cc;
    return sj_exec_fused(&xc, r->plan, r->cd->fns);
}

/* A capture of m failed (why: sj_last_error's message): back off. */
static void failed(sj_fn *fn, sj_memo *m, const char *why) {
    sj_runtime *rt = fn->rt;
    sj_entry *e = sj_memo_entry(m);
    int fails = atomic_fetch_add_explicit(&m->graph_fails, 1, RELAXED) + 1; /* (this job alone writes it) */
    int64_t at = sj_compiler_retry_at(rt->compiler, fails);
    bool blacklist = at == INT64_MAX;
    atomic_store_explicit(&m->graph_retry_ns, at, RELAXED);
    forget_seen(m);
    if (blacklist) atomic_store(&m->graph_off, true);
    atomic_fetch_add_explicit(&fn->c.graph_failures, 1, RELAXED);
    if (blacklist) atomic_fetch_add_explicit(&fn->c.graph_blacklisted, 1, RELAXED);
    int64_t wait_ms = blacklist ? -1 : (at - sj_runtime_now_ns(rt)) / 1000000;
    if (blacklist)
        sj_logf(rt, SJ_LOG_PERF,
                "fn '%s': entry %d: a shape not captured into a CUDA graph, blacklisted after %d failures: %s",
                fn->name, e->id, fails, why);
    else
        sj_logf(rt, SJ_LOG_PERF, "fn '%s': entry %d: a shape not captured into a CUDA graph (failure %d, retry in %lld ms): %s",
                fn->name, e->id, fails, (long long)wait_ms, why);
    if (sj_log_wants_events(&rt->log)) {
        char shape[128];
        sj_memo_shape(m, shape, sizeof shape);
        sj_emit(rt, (sj_event){.kind = SJ_EVENT_GRAPH_FAILED, .topic = SJ_LOG_PERF, .fn = fn->name, .entry = e->id,
                               .shape = shape, .error = why, .count = fails, .retry_ms = wait_ms});
    }
}

void sj_graphs_capture_run(sj_fn *fn, void *arg) {
    sj_cgraph *g = arg;
    if (g->bucket) {
        bucket_capture_run(fn, g);
        return;
    }
    sj_runtime *rt = fn->rt;
    sj_memo *m = g->m;
    sj_entry *e = sj_memo_entry(m);
    int64_t t0 = sj_now_ns();
    size_t bytes = 0;
    sj_status st = rt->backend->graph_capture(rt->backend, e->g, g->run.plan, e->head.n_syms, g->stream, run_capture,
                                              &g->run, &g->dev, &bytes);
    double ms = (double)(sj_now_ns() - t0) / 1e6;
    char why[300];
    /* (On a failure the calls go on kernel by kernel. The call the capture
     * copies had succeeded: its arguments are not what failed.) */
    st = fit(fn, g, st, bytes, why, sizeof why);
    if (st) {
        failed(fn, m, why);
        sj_clearerr();
        destroy(rt, g);
        unreserve(rt, m);
        return;
    }
    int k = 0, n = 1;
    while (k < SJ_MEMO_GRAPHS - 1 && atomic_load_explicit(&m->graphs[k], memory_order_acquire)) k++;
    atomic_store_explicit(&g->used_tick, sj_budget_tick(rt), RELAXED); /* new: the most recently used */
    atomic_store_explicit(&m->graphs[k], g, memory_order_release); /* busy: no other writer of a full slot */
    atomic_store(&m->graph_busy, false);
    for (int i = 0; i < SJ_MEMO_GRAPHS; i++) n += i != k && atomic_load_explicit(&m->graphs[i], RELAXED) != NULL;
    atomic_fetch_add_explicit(&fn->c.graphs, 1, RELAXED);
    sj_logf(rt, SJ_LOG_PERF,
            "fn '%s': entry %d: captured CUDA graph %d of a shape in %.2f ms, %lld bytes (%d in the runtime)",
            fn->name, e->id, k, ms, (long long)g->bytes, atomic_load(&rt->cuda_graphs));
    if (sj_log_wants_events(&rt->log)) {
        char shape[128];
        sj_memo_shape(m, shape, sizeof shape);
        sj_emit(rt, (sj_event){.kind = SJ_EVENT_GRAPH_CAPTURED, .topic = SJ_LOG_PERF, .fn = fn->name, .entry = e->id,
                               .shape = shape, .duration_ms = ms, .count = n, .bytes = g->bytes});
    }
}

void sj_graphs_free(void *ctx, void *graph) {
    sj_runtime *rt = ctx;
    destroy(rt, graph);
    atomic_fetch_sub(&rt->cuda_graphs, 1);
}
