/* Graphs of fused calls: one launch instead of one per kernel. The
 * device-neutral policy (when to capture, which graph serves a call) and
 * the graph thread; the capture mechanics are the device's.
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
 * the instantiation, 0.5 to 1 ms for the encoder layer on an H200, run on
 * the runtime's graph thread (the grapher): the call that asks for one,
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
 * that owns the call's intermediates. Anything that cannot be captured
 * fails the capture, and the signature is never captured again.
 *
 * Threads. One capture at a time per runtime (the grapher) and per
 * signature (graph_busy, set from the request until the grapher is done
 * with it). Slots are filled in order with release stores
 * and never replaced, so a launching thread needs no lock; graphs are
 * destroyed with their memo item, when the function is, after
 * sj_graphs_cancel_fn has dropped its queued captures and waited for
 * a running one. The grapher's lock is held only for its queue.
 */
#include "jit/graphs.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/clock.h"
#include "base/error.h"
#include "jit/runtime.h"
#include "specialize/fusion.h"

#define RELAXED memory_order_relaxed

typedef struct sj_cgraph {
    const sj_compiled *cd; /* the code captured */
    const void *stream;    /* where it is launched: the calls' stream (the device's graph_stream) */
    void *dev;             /* the device's graph */
    int n_in, n_out;
    const void *in[SJ_MAX_INPUTS]; /* the caller's input addresses */
    sj_tensor out[SJ_MAX_OUTPUTS]; /* the caller's outputs, as checked at capture */
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
        if (x->inputs[i].data != g->in[i]) return false;
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

/* Free a graph record (and the device's graph in it). */
static void destroy(sj_runtime *rt, sj_cgraph *g) {
    if (g->dev) rt->backend->graph_free(rt->backend, g->dev);
    free(g);
}

static bool enqueue(sj_runtime *rt, sj_fn *fn, sj_memo *m, const sj_exec *x, const sj_fplan *plan,
                    const sj_compiled *cd, const void *s);

/* The graph of m for this code, these buffers and stream s, or NULL; with
 * free_slot, the first empty slot there (SJ_MEMO_GRAPHS: none). */
static const sj_cgraph *find(sj_memo *m, const sj_exec *x, const sj_compiled *cd, const void *s, int *free_slot) {
    int k = 0;
    for (; k < SJ_MEMO_GRAPHS; k++) {
        const sj_cgraph *g = atomic_load_explicit(&m->graphs[k], memory_order_acquire);
        if (!g) break;
        if (matches(g, x, cd, s)) return g;
    }
    if (free_slot) *free_slot = k;
    return NULL;
}

sj_graph_use sj_graphs_call(sj_fn *fn, sj_memo *m, const sj_exec *x, const sj_compiled *cd, sj_status *st) {
    const sj_backend *b = x->ops;
    if (!m || fn->rt->cfg.cuda_graphs <= 0 || !b->graph_capture || !fn->rt->grapher ||
        atomic_load_explicit(&m->graph_off, RELAXED))
        return SJ_GRAPH_NO;
    for (int i = 0; i < x->g->n_outputs; i++)
        if (!x->outputs[i].data) return SJ_GRAPH_NO; /* allocated per call: new addresses each time */
    const sj_cgraph *g = find(m, x, cd, b->graph_stream(x->ops_ctx), NULL);
    if (!g) return SJ_GRAPH_COUNT;
    *st = b->graph_launch(x->ops_ctx, g->dev);
    if (!*st) atomic_fetch_add_explicit(&fn->hot[sj_shard_index()].graph_calls, 1, RELAXED);
    return SJ_GRAPH_SERVED;
}

/* Queue a capture of this call's buffers unless one is published, queued
 * or running for them, or there is no room; force: whatever the count of
 * calls seen (a warm-up's request). */
static void note(sj_fn *fn, sj_memo *m, const sj_exec *x, const sj_fplan *plan, const sj_compiled *cd, bool force) {
    sj_runtime *rt = fn->rt;
    const void *s = x->ops->graph_stream(x->ops_ctx);
    int k;
    if (find(m, x, cd, s, &k) || k == SJ_MEMO_GRAPHS) return; /* published meanwhile, or no room */
    if (!force && !seen_enough(m, buffers_hash(x, cd, s))) return;
    if (atomic_load_explicit(&rt->cuda_graphs, RELAXED) >= rt->cfg.cuda_graphs) return;
    if (atomic_exchange(&m->graph_busy, true)) return; /* a capture of this signature is queued or running */
    /* a graph published since the find above may hold these very buffers */
    bool go = !find(m, x, cd, s, &k) && k < SJ_MEMO_GRAPHS;
    if (go && atomic_fetch_add(&rt->cuda_graphs, 1) >= rt->cfg.cuda_graphs) { /* reserve one of the runtime's */
        atomic_fetch_sub(&rt->cuda_graphs, 1);
        go = false;
    }
    if (go && !enqueue(rt, fn, m, x, plan, cd, s)) {
        atomic_fetch_sub(&rt->cuda_graphs, 1);
        go = false;
    }
    if (!go) atomic_store(&m->graph_busy, false);
}

void sj_graphs_note(sj_fn *fn, sj_memo *m, const sj_exec *x, const sj_fplan *plan, const sj_compiled *cd) {
    note(fn, m, x, plan, cd, false);
}

bool sj_graphs_request(sj_fn *fn, sj_memo *m, const sj_exec *x, const sj_fplan *plan, const sj_compiled *cd) {
    if (fn->rt->cfg.cuda_graphs <= 0 || !x->ops->graph_capture || !fn->rt->grapher ||
        atomic_load_explicit(&m->graph_off, RELAXED))
        return false;
    for (int i = 0; i < x->g->n_outputs; i++)
        if (!x->outputs[i].data) return false; /* the warm-up's own outputs: never seen again */
    note(fn, m, x, plan, cd, true);
    return true;
}

/* -- The grapher: captures off the request path ---------------------------------- */

typedef struct graph_job {
    struct graph_job *next;
    sj_fn *fn;
    sj_memo *m;
    const sj_compiled *cd;
    const sj_fplan *plan;
    const void *stream;
    sj_tensor in[SJ_MAX_INPUTS], out[SJ_MAX_OUTPUTS]; /* descriptors only: nothing is read through them */
} graph_job;

struct sj_grapher {
    sj_runtime *rt;
    pthread_mutex_t lock; /* the queue, running, stop */
    pthread_cond_t wake, done;
    graph_job *head, *tail;
    sj_fn *running; /* the function of the capture under way, or NULL */
    bool stop;
    pthread_t thread;
};

/* Queue a capture of this call's plan with its buffers (graph_busy is set
 * and a graph of the runtime's budget reserved). false: not queued. */
static bool enqueue(sj_runtime *rt, sj_fn *fn, sj_memo *m, const sj_exec *x, const sj_fplan *plan,
                    const sj_compiled *cd, const void *s) {
    sj_grapher *gr = rt->grapher;
    graph_job *j = gr ? sj_malloc(sizeof *j) : NULL; /* once per capture, never on a served call */
    if (!j) return false;
    *j = (graph_job){.fn = fn, .m = m, .cd = cd, .plan = plan, .stream = s};
    memcpy(j->in, x->inputs, sizeof(sj_tensor) * (size_t)x->g->n_inputs);
    memcpy(j->out, x->outputs, sizeof(sj_tensor) * (size_t)x->g->n_outputs);
    pthread_mutex_lock(&gr->lock);
    if (gr->tail) gr->tail->next = j;
    else gr->head = j;
    gr->tail = j;
    pthread_cond_signal(&gr->wake);
    pthread_mutex_unlock(&gr->lock);
    return true;
}

/* The call a capture runs: the job's plan, fused, on the capture's call
 * context. */
typedef struct capture_run {
    const sj_exec *x;
    const sj_fplan *plan;
    const sj_compiled *cd;
} capture_run;

static sj_status run_capture(void *arg, void *cc) {
    const capture_run *r = arg;
    sj_exec xc = *r->x;
    xc.ops_ctx = cc;
    xc.gemm_pick = r->cd->gemm_pick;
    return sj_exec_fused(&xc, r->plan, r->cd->fns);
}

static void run_job(sj_grapher *gr, graph_job *j) {
    sj_runtime *rt = gr->rt;
    sj_fn *fn = j->fn;
    sj_memo *m = j->m;
    sj_entry *e = sj_memo_entry(m);
    sj_exec x = {.rt = rt, .g = e->g, .fn_name = fn->name, .inputs = j->in, .outputs = j->out,
                 .sym_vals = m->head.syms, .pool = &fn->pool, .arena_hint = &e->arena_hint, .ops = rt->backend};
    sj_cgraph *g = sj_calloc(1, sizeof *g);
    sj_status st = g ? SJ_OK : sj_seterr(SJ_ENOMEM, "out of memory for a CUDA graph");
    int64_t t0 = sj_now_ns();
    if (g) {
        g->cd = j->cd;
        g->stream = j->stream;
        g->n_in = e->g->n_inputs;
        g->n_out = e->g->n_outputs;
        for (int i = 0; i < g->n_in; i++) g->in[i] = j->in[i].data;
        for (int i = 0; i < g->n_out; i++) g->out[i] = j->out[i];
        capture_run r = {&x, j->plan, j->cd};
        st = rt->backend->graph_capture(rt->backend, e->g, j->plan, e->head.n_syms, j->stream, run_capture, &r,
                                        &g->dev);
    }
    double ms = (double)(sj_now_ns() - t0) / 1e6;
    if (st) {
        /* The calls go on kernel by kernel, and this signature is not
         * captured again. (The call the capture copies had succeeded: its
         * arguments are not what failed.) */
        atomic_fetch_add_explicit(&fn->c.graph_failures, 1, RELAXED);
        sj_logf(rt, SJ_LOG_PERF, "fn '%s': entry %d: a shape not captured into a CUDA graph (never again): %s",
                fn->name, e->id, sj_last_error());
        atomic_store(&m->graph_off, true);
        sj_clearerr();
        if (g) destroy(rt, g);
        atomic_fetch_sub(&rt->cuda_graphs, 1);
        atomic_store(&m->graph_busy, false);
        return;
    }
    int k = 0;
    while (k < SJ_MEMO_GRAPHS - 1 && atomic_load_explicit(&m->graphs[k], memory_order_acquire)) k++;
    atomic_store_explicit(&m->graphs[k], g, memory_order_release); /* busy: no other writer */
    atomic_store(&m->graph_busy, false);
    atomic_fetch_add_explicit(&fn->c.graphs, 1, RELAXED);
    sj_logf(rt, SJ_LOG_PERF, "fn '%s': entry %d: captured CUDA graph %d of a shape in %.2f ms (%d in the runtime)",
            fn->name, e->id, k, ms, atomic_load(&rt->cuda_graphs));
    if (sj_log_wants_events(&rt->log)) {
        char shape[128];
        sj_memo_shape(m, shape, sizeof shape);
        sj_emit(rt, (sj_event){.kind = SJ_EVENT_GRAPH_CAPTURED, .topic = SJ_LOG_PERF, .fn = fn->name, .entry = e->id,
                               .shape = shape, .duration_ms = ms, .count = k + 1});
    }
}

static void *grapher_main(void *arg) {
    sj_grapher *gr = arg;
    pthread_mutex_lock(&gr->lock);
    for (;;) {
        while (!gr->head && !gr->stop) pthread_cond_wait(&gr->wake, &gr->lock);
        if (gr->stop) break;
        graph_job *j = gr->head;
        gr->head = j->next;
        if (!gr->head) gr->tail = NULL;
        gr->running = j->fn;
        pthread_mutex_unlock(&gr->lock);
        run_job(gr, j);
        free(j);
        pthread_mutex_lock(&gr->lock);
        gr->running = NULL;
        pthread_cond_broadcast(&gr->done);
    }
    pthread_mutex_unlock(&gr->lock);
    return NULL;
}

sj_status sj_grapher_create(sj_runtime *rt) {
    sj_grapher *gr = sj_calloc(1, sizeof *gr);
    if (!gr) return sj_seterr(SJ_ENOMEM, "out of memory for the CUDA graph thread");
    gr->rt = rt;
    pthread_mutex_init(&gr->lock, NULL);
    pthread_cond_init(&gr->wake, NULL);
    pthread_cond_init(&gr->done, NULL);
    if (pthread_create(&gr->thread, NULL, grapher_main, gr)) {
        pthread_cond_destroy(&gr->done);
        pthread_cond_destroy(&gr->wake);
        pthread_mutex_destroy(&gr->lock);
        free(gr);
        return sj_seterr(SJ_ENOMEM, "cannot start the CUDA graph thread");
    }
    rt->grapher = gr;
    return SJ_OK;
}

void sj_grapher_destroy(sj_runtime *rt) {
    sj_grapher *gr = rt->grapher;
    if (!gr) return;
    pthread_mutex_lock(&gr->lock);
    gr->stop = true;
    pthread_cond_signal(&gr->wake);
    pthread_mutex_unlock(&gr->lock);
    pthread_join(gr->thread, NULL);
    for (graph_job *j = gr->head, *n; j; j = n) { /* none left: every function was destroyed first */
        n = j->next;
        free(j);
    }
    pthread_cond_destroy(&gr->done);
    pthread_cond_destroy(&gr->wake);
    pthread_mutex_destroy(&gr->lock);
    free(gr);
    rt->grapher = NULL;
}

/* fn's captures: queued ones dropped (cancel) or waited for, and a running
 * one waited for. */
static void settle_fn(sj_grapher *gr, sj_fn *fn, bool cancel) {
    if (!gr) return;
    pthread_mutex_lock(&gr->lock);
    if (cancel) {
        graph_job **p = &gr->head;
        gr->tail = NULL;
        while (*p) {
            graph_job *j = *p;
            if (j->fn == fn) {
                *p = j->next;
                atomic_fetch_sub(&gr->rt->cuda_graphs, 1);
                free(j);
            } else {
                gr->tail = j;
                p = &j->next;
            }
        }
    }
    for (;;) {
        bool pending = gr->running == fn;
        for (graph_job *j = gr->head; j && !pending; j = j->next) pending = j->fn == fn;
        if (!pending) break;
        pthread_cond_wait(&gr->done, &gr->lock);
    }
    pthread_mutex_unlock(&gr->lock);
}

void sj_graphs_cancel_fn(sj_runtime *rt, sj_fn *fn) { settle_fn(rt->grapher, fn, true); }
void sj_graphs_wait_fn(sj_runtime *rt, sj_fn *fn) { settle_fn(rt->grapher, fn, false); }

void sj_graphs_free(void *ctx, void *graph) {
    sj_runtime *rt = ctx;
    destroy(rt, graph);
    atomic_fetch_sub(&rt->cuda_graphs, 1);
}
