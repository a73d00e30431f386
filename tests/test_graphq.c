/* Graph captures as jobs of the one background queue (issues 24, 28, 30),
 * on the CPU with a test device's graph slots: the CPU device's table gets
 * capture, launch, free and stream slots whose "graph" replays the captured
 * call by running it again on the launching call's context (the run and arg
 * graph_capture is given stay valid as long as the graph). So the engine's
 * side runs as on CUDA: when a capture is asked for, that it is a JOB_CAPTURE
 * job of the compile queue (stepped here with compile_threads 0), cancelled
 * with its function, backing off on failure (doubling, jittered, then
 * blacklisted) on the virtual clock, and the graph memory budget
 * (graph_max_bytes) evicting the least recently replayed graph; and the
 * queue's per-kind limits (jobs of a kind queued, workers running a kind)
 * with device jobs posted through a fake set_post, held at a gate. Every
 * result, replayed or not, is compared with float64 on random inputs. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/error.h"
#include "jit/compile.h"
#include "jit/graphs.h"
#include "jit/runtime.h"
#include "jit/shapejit.h"
#include "kernels/device.h"
#include "tests/util.h"

#define MS INT64_C(1000000)
#define NMAX 64
#define SHAPES 4

static tu_clock clk = {1000 * MS}; /* the runtimes' virtual clock */
static void advance_ms(int64_t ms) { tu_clock_advance_ms(&clk, ms); }

/* -- The test device's graph slots ------------------------------------------------ */

typedef struct fake_graph {
    bool bucket; /* false (a fake_bgraph: true) */
    sj_status (*run)(void *arg, void *cc);
    void *arg;
} fake_graph;

typedef struct fake_bgraph {
    bool bucket; /* true */
    int n;
    unsigned char direct[8];
    void *bufs[8];
    size_t sizes[8];
} fake_bgraph;

static _Atomic int captures, capture_fails, replays, frees;
static _Atomic int fail_captures; /* > 0: that many captures fail next */
static size_t graph_bytes = 1000; /* what each graph says it holds */

static sj_status fake_capture(sj_backend *b, const sj_graph *g, const struct sj_fplan *plan, int n_syms,
                              const void *stream, sj_status (*run)(void *arg, void *cc), void *arg, void **graph,
                              size_t *bytes) {
    (void)b, (void)g, (void)plan, (void)n_syms, (void)stream;
    int f = atomic_load(&fail_captures);
    while (f > 0 && !atomic_compare_exchange_weak(&fail_captures, &f, f - 1)) {
    }
    if (f > 0) {
        atomic_fetch_add(&capture_fails, 1);
        return sj_seterr(SJ_EBACKEND, "test device: capture refused");
    }
    fake_graph *fg = malloc(sizeof *fg);
    if (!fg) return sj_seterr(SJ_ENOMEM, "test device: out of memory");
    *fg = (fake_graph){false, run, arg};
    *graph = fg;
    *bytes = graph_bytes;
    atomic_fetch_add(&captures, 1);
    return SJ_OK;
}

static sj_status fake_launch(void *c, void *graph) {
    fake_graph *fg = graph;
    atomic_fetch_add(&replays, 1);
    return fg->run(fg->arg, c); /* the captured call, again, on this call's context */
}

static void fake_free(sj_backend *b, void *graph) {
    (void)b;
    atomic_fetch_add(&frees, 1);
    fake_bgraph *fg = graph;
    if (fg->bucket)
        for (int i = 0; i < fg->n; i++) free(fg->bufs[i]);
    free(graph);
}

static const void *fake_stream(void *c) {
    (void)c;
    return NULL; /* the device's own (sj_runtime_stream is NULL on the CPU): evictable */
}

/* Bucket graphs: the test device keeps the staging buffers it is asked
 * for (host memory) and replays a call by copying its inputs in, running
 * the update pass for real on this call's context (the plan at the call's
 * sizes on the staging buffers, its arena laid out for the bucket's
 * largest: what the CUDA device records as node updates) and copying the
 * outputs out. refuse_replays: answer "not served" (a busy graph). */

static _Atomic int bucket_captures, bucket_replays, refuse_replays;
static bool direct_outputs; /* bucket captures say the outputs are direct */
static size_t bucket_sizes[8]; /* the last bucket capture's buffer sizes */

static int capture_delay_ms; /* fake_capture_bucket's */

static sj_status fake_capture_bucket(sj_backend *b, const sj_graph *g, const struct sj_fplan *plan, int n_syms,
                                     const void *stream, int n_in, int n_bufs, const size_t *sizes, void **bufs,
                                     int copies, sj_status (*run)(void *arg, void *cc), void *arg, void **graph,
                                     size_t *bytes, unsigned char *direct) {
    (void)b, (void)plan, (void)n_syms, (void)stream, (void)run, (void)arg;
    assert_int_equal(n_in, g->n_inputs);
    assert_true(copies >= 1);
    if (capture_delay_ms) usleep((useconds_t)capture_delay_ms * 1000); /* a slow capture */
    fake_bgraph *fg = calloc(1, sizeof *fg);
    if (!fg || n_bufs > 8) return sj_seterr(SJ_ENOMEM, "test device: bucket graph");
    fg->bucket = true;
    fg->n = n_bufs;
    *bytes = 0;
    for (int i = 0; i < n_bufs; i++) {
        fg->bufs[i] = bufs[i] = malloc(sizes[i] ? sizes[i] : 1);
        fg->sizes[i] = bucket_sizes[i] = sizes[i];
        *bytes += sizes[i];
        /* direct_outputs: the outputs the caller's own (as CUDA's where
         * only updatable kernels write them) */
        direct[i] = fg->direct[i] = direct_outputs && i >= n_bufs - g->n_outputs;
    }
    *graph = fg;
    atomic_fetch_add(&bucket_captures, 1);
    return SJ_OK;
}

static sj_status fake_replay(void *c, void *graph, const int64_t *syms, int n_syms, int n_in, const void *const *src,
                             void *const *dst, const size_t *bytes, sj_status (*update)(void *arg, void *cc),
                             void *arg, bool *served) {
    (void)syms, (void)n_syms;
    fake_bgraph *fg = graph;
    int n = fg->n;
    *served = false;
    if (atomic_load(&refuse_replays)) return SJ_OK;
    for (int i = 0; i < n; i++)
        if (bytes[i] > fg->sizes[i]) fail_msg("replay: buffer %d of %zu bytes, the graph's %zu", i, bytes[i], fg->sizes[i]);
    for (int i = 0; i < n_in; i++)
        if (!fg->direct[i]) memcpy(fg->bufs[i], src[i], bytes[i]);
    for (int i = n_in; i < n; i++) /* what the update does not write stays the graph's */
        if (!fg->direct[i]) memset(fg->bufs[i], 0xFF, fg->sizes[i]);
    sj_status st = update(arg, c);
    for (int i = n_in; i < n && !st; i++)
        if (!fg->direct[i]) memcpy(dst[i - n_in], fg->bufs[i], bytes[i]);
    *served = true;
    atomic_fetch_add(&bucket_replays, 1);
    return st;
}

static void give_graph_slots(sj_runtime *rt) {
    rt->backend->graph_capture = fake_capture;
    rt->backend->graph_launch = fake_launch;
    rt->backend->graph_free = fake_free;
    rt->backend->graph_stream = fake_stream;
    rt->backend->graph_capture_bucket = fake_capture_bucket;
    rt->backend->graph_replay = fake_replay;
}

static void reset_counts(void) {
    atomic_store(&captures, 0);
    atomic_store(&capture_fails, 0);
    atomic_store(&replays, 0);
    atomic_store(&frees, 0);
    atomic_store(&fail_captures, 0);
    atomic_store(&bucket_captures, 0);
    atomic_store(&bucket_replays, 0);
    atomic_store(&refuse_replays, 0);
    graph_bytes = 1000;
}

/* -- Events ---------------------------------------------------------------------- */

static _Atomic int ev_failed, ev_evicted, ev_captured;
static _Atomic int64_t ev_retry_ms, ev_bytes;
static void on_event(void *user, const sj_event *ev) {
    (void)user;
    if (ev->kind == SJ_EVENT_GRAPH_FAILED) {
        atomic_fetch_add(&ev_failed, 1);
        atomic_store(&ev_retry_ms, ev->retry_ms);
    }
    if (ev->kind == SJ_EVENT_GRAPH_EVICTED) {
        atomic_fetch_add(&ev_evicted, 1);
        atomic_store(&ev_bytes, ev->bytes);
    }
    if (ev->kind == SJ_EVENT_GRAPH_CAPTURED) atomic_fetch_add(&ev_captured, 1);
}

/* -- A function and its calls ----------------------------------------------------- */

/* y = tanh(x * 2 + 1) - x / 4 */
static sj_status m_model(sj_tracer *t, const sj_val *in, int n, void *u) {
    (void)n, (void)u;
    sj_val a = sj_tanh(t, sj_add(t, sj_mul(t, in[0], sj_scalar(t, 2.0)), sj_scalar(t, 1.0)));
    return sj_output(t, sj_sub(t, a, sj_div(t, in[0], sj_scalar(t, 4.0))));
}

/* The tests' configuration: a CPU runtime in compile mode `mode` with
 * `workers` compile workers, hot at its first call, on the virtual clock. */
static sj_runtime_config config(sj_compile_mode mode, int workers, uint64_t graph_max) {
    sj_runtime_config cfg = tu_cpu_config();
    cfg.compile_mode = mode;
    cfg.compile_threads = workers;
    cfg.hot_threshold = 1;
    cfg.specialize_threshold = 1000000; /* the entry's symbolic code serves every shape */
    cfg.compile_retry_ms = 1000;
    cfg.compile_max_failures = 3;
    cfg.graph_max_bytes = graph_max;
    cfg.event_fn = on_event;
    tu_clock_use(&cfg, &clk);
    return cfg;
}

/* A runtime of cfg with the test device's graph slots. */
static sj_runtime *runtime_of(const sj_runtime_config *cfg) {
    sj_runtime *rt = NULL;
    assert_int_equal(sj_runtime_create(cfg, &rt), SJ_OK);
    give_graph_slots(rt);
    atomic_store(&ev_failed, 0);
    atomic_store(&ev_evicted, 0);
    atomic_store(&ev_captured, 0);
    return rt;
}

static sj_runtime *runtime(sj_compile_mode mode, int workers, uint64_t graph_max) {
    sj_runtime_config cfg = config(mode, workers, graph_max);
    return runtime_of(&cfg);
}

static sj_fn *function(sj_runtime *rt) {
    sj_fn_options o;
    sj_fn_options_init(&o);
    o.dynamic = SJ_DYNAMIC_SYMBOLIC;
    sj_fn *fn = NULL;
    assert_int_equal(sj_fn_create(rt, "graphq", 1, m_model, NULL, &o, &fn), SJ_OK);
    return fn;
}

/* Each shape's buffers: the same addresses every call, as a server's. */
static float xs[SHAPES][NMAX], ys[SHAPES][NMAX];
static const int sizes[SHAPES] = {8, 9, 10, 11};

/* One call of shape s on fresh random floats, checked against float64;
 * true when a graph served it. */
static bool call_checked(sj_fn *fn, int s) {
    int n = sizes[s];
    float *x = xs[s], *y = ys[s];
    for (int i = 0; i < n; i++) x[i] = (float)(rand() % 4000 - 2000) / 512.0f, y[i] = NAN;
    sj_tensor in = sj_tensor_make(x, SJ_F32, 1, (int64_t[]){n});
    sj_tensor out = sj_tensor_make(y, SJ_F32, 1, (int64_t[]){n});
    sj_stats a, b;
    sj_fn_stats(fn, &a);
    assert_int_equal(sj_call(fn, &in, 1, &out, 1), SJ_OK);
    sj_fn_stats(fn, &b);
    for (int i = 0; i < n; i++) {
        double r = tanh((double)x[i] * 2.0 + 1.0) - (double)x[i] / 4.0;
        if (!(fabs((double)y[i] - r) <= 1e-5)) fail_msg("shape %d i=%d: %.9g, float64 %.9g", s, i, (double)y[i], r);
    }
    return b.graph_calls > a.graph_calls;
}

/* Calls of shape s until one asks for a capture (SJ_GRAPH_AFTER fused
 * calls with its buffers); none of them served by a graph. */
static void calls_to_capture(sj_fn *fn, int s) {
    for (int i = 0; i < SJ_GRAPH_AFTER; i++) assert_false(call_checked(fn, s));
}

/* Calls of shape s (none served by a graph) until the test device has
 * made `captures_now` graphs: within SJ_GRAPH_AFTER + 1 calls. */
static void calls_until_captured(sj_fn *fn, int s, int captures_now) {
    for (int i = 0; i <= SJ_GRAPH_AFTER && atomic_load(&captures) < captures_now; i++) assert_false(call_checked(fn, s));
    assert_int_equal(atomic_load(&captures), captures_now);
}

static sj_stats stats(sj_fn *fn) {
    sj_stats s;
    sj_fn_stats(fn, &s);
    return s;
}

static int pending_captures(sj_runtime *rt, sj_fn *fn) {
    (void)rt;
    return fn->captures_pending; /* (read racily: no worker runs here) */
}

/* The function's first call traced, its compile run: later calls are fused. */
static void make_fused(sj_runtime *rt, sj_fn *fn) {
    call_checked(fn, 0);
    while (sj_runtime_run_background(rt, 8) > 0) {
    }
    call_checked(fn, 0);
    assert_true(stats(fn).fused_symbolic_calls >= 1);
}

/* -- Tests --------------------------------------------------------------------------- */

/* The 48th call queues a JOB_CAPTURE job; nothing captures until the
 * queue is stepped; then the graph serves the calls with those buffers,
 * with fresh results each time. */
static void capture_is_a_queued_job(void **state) {
    (void)state;
    reset_counts();
    sj_runtime *rt = runtime(SJ_COMPILE_ASYNC, 0, 0);
    sj_fn *fn = function(rt);
    make_fused(rt, fn);
    calls_to_capture(fn, 0);
    assert_int_equal(pending_captures(rt, fn), 1);
    assert_int_equal(atomic_load(&captures), 0); /* queued, not run */
    assert_false(call_checked(fn, 0));            /* no graph yet; no second job either */
    assert_int_equal(pending_captures(rt, fn), 1);
    assert_int_equal(sj_runtime_run_background(rt, 8), 1);
    assert_int_equal(atomic_load(&captures), 1);
    assert_int_equal(pending_captures(rt, fn), 0);
    for (int i = 0; i < 5; i++) assert_true(call_checked(fn, 0));
    assert_int_equal(atomic_load(&replays), 5);
    sj_stats s = stats(fn);
    assert_int_equal(s.graphs, 1);
    assert_int_equal(s.graph_calls, 5);
    assert_int_equal(s.graph_bytes, 1000);
    assert_int_equal(s.graph_failures, 0);
    assert_int_equal(atomic_load(&ev_captured), 1);
    assert_int_equal(atomic_load(&rt->cuda_graphs), 1);
    sj_runtime_destroy(rt);
    assert_int_equal(atomic_load(&frees), 1);
}

/* A queued capture is dropped with its function: never run, its
 * reservation of the runtime's graph count given back. */
static void capture_cancelled_with_its_function(void **state) {
    (void)state;
    reset_counts();
    sj_runtime *rt = runtime(SJ_COMPILE_ASYNC, 0, 0);
    sj_fn *fn = function(rt);
    make_fused(rt, fn);
    calls_to_capture(fn, 0);
    assert_int_equal(pending_captures(rt, fn), 1);
    assert_int_equal(atomic_load(&rt->cuda_graphs), 1); /* reserved */
    sj_fn_destroy(fn);
    assert_int_equal(atomic_load(&rt->cuda_graphs), 0);
    assert_int_equal(sj_runtime_run_background(rt, 8), 0); /* nothing left queued */
    assert_int_equal(atomic_load(&captures), 0);
    sj_runtime_destroy(rt);
    assert_int_equal(atomic_load(&frees), 0);
}

/* A failed capture backs off on the runtime's clock (compile_retry_ms *
 * 2^(n-1), +-25%) and is blacklisted at compile_max_failures (3). */
static void failed_capture_backs_off_then_blacklisted(void **state) {
    (void)state;
    reset_counts();
    sj_runtime *rt = runtime(SJ_COMPILE_ASYNC, 0, 0);
    sj_fn *fn = function(rt);
    make_fused(rt, fn);
    atomic_store(&fail_captures, 100);
    for (int n = 1; n <= 3; n++) {
        calls_to_capture(fn, 0);
        assert_int_equal(sj_runtime_run_background(rt, 8), 1);
        assert_int_equal(atomic_load(&capture_fails), n);
        sj_stats s = stats(fn);
        assert_int_equal(s.graph_failures, n);
        assert_int_equal(atomic_load(&ev_failed), n);
        assert_int_equal(atomic_load(&rt->cuda_graphs), 0); /* nothing kept */
        if (n == 3) break;
        int64_t wait = 1000 << (n - 1); /* the penalty before jitter */
        assert_in_range(atomic_load(&ev_retry_ms), wait * 3 / 4 - 1, wait * 5 / 4);
        assert_int_equal(s.graphs_blacklisted, 0);
        /* within the penalty: calls ask for nothing */
        advance_ms(wait * 7 / 10);
        calls_to_capture(fn, 0);
        for (int i = 0; i < SJ_GRAPH_AFTER; i++) call_checked(fn, 0);
        assert_int_equal(pending_captures(rt, fn), 0);
        assert_int_equal(sj_runtime_run_background(rt, 8), 0);
        advance_ms(wait * 6 / 10); /* past it (1.3 x) */
    }
    sj_stats s = stats(fn);
    assert_int_equal(s.graphs_blacklisted, 1);
    assert_int_equal(atomic_load(&ev_retry_ms), -1);
    char *text = tu_explain(fn);
    assert_non_null(strstr(text, "3 failed captures, 0 calls served by one"));
    assert_non_null(strstr(text, "1 shapes blacklisted after failed captures"));
    assert_non_null(strstr(text, "(s0=8) ")); /* the shape's own line */
    assert_non_null(strstr(text, "[graph captures blacklisted after 3 failures]"));
    free(text);
    /* blacklisted: never asked again, whatever the time */
    advance_ms(3600 * 1000);
    atomic_store(&fail_captures, 0);
    calls_to_capture(fn, 0);
    calls_to_capture(fn, 0);
    assert_int_equal(pending_captures(rt, fn), 0);
    assert_int_equal(sj_runtime_run_background(rt, 8), 0);
    assert_int_equal(atomic_load(&captures), 0);
    sj_runtime_destroy(rt);
}

/* A failure then a success: the graph serves after the retry. */
static void capture_retried_after_its_penalty(void **state) {
    (void)state;
    reset_counts();
    sj_runtime *rt = runtime(SJ_COMPILE_ASYNC, 0, 0);
    sj_fn *fn = function(rt);
    make_fused(rt, fn);
    atomic_store(&fail_captures, 1);
    calls_to_capture(fn, 0);
    assert_int_equal(sj_runtime_run_background(rt, 8), 1);
    assert_int_equal(stats(fn).graph_failures, 1);
    char *text = tu_explain(fn);
    if (!strstr(text, "[graph capture failed 1 time, retry in ")) fail_msg("explain:\n%s", text);
    free(text);
    advance_ms(1300);
    calls_to_capture(fn, 0);
    assert_int_equal(sj_runtime_run_background(rt, 8), 1);
    assert_true(call_checked(fn, 0));
    text = tu_explain(fn);
    if (!strstr(text, "[1 CUDA graph]")) fail_msg("explain:\n%s", text);
    free(text);
    sj_stats s = stats(fn);
    assert_int_equal(s.graphs, 1);
    assert_int_equal(s.graph_failures, 1);
    assert_int_equal(s.graphs_blacklisted, 0);
    sj_runtime_destroy(rt);
}

/* Capture shape s's graph now (its calls, then the queue stepped). */
static void capture_shape(sj_runtime *rt, sj_fn *fn, int s) {
    call_checked(fn, s);
    while (sj_runtime_run_background(rt, 8) > 0) {
    }
    calls_to_capture(fn, s);
    assert_int_equal(sj_runtime_run_background(rt, 8), 1);
}

/* graph_max_bytes 2500 holds two graphs of 1000 bytes: the third evicts
 * the least recently replayed; the evicted shape runs kernel by kernel
 * and earns a capture again from zero. A graph alone over the budget is
 * not kept. */
static void budget_evicts_least_recently_replayed(void **state) {
    (void)state;
    reset_counts();
    sj_runtime *rt = runtime(SJ_COMPILE_ASYNC, 0, 2500);
    sj_fn *fn = function(rt);
    make_fused(rt, fn);
    capture_shape(rt, fn, 0);
    advance_ms(10);
    capture_shape(rt, fn, 1);
    advance_ms(10);
    assert_true(call_checked(fn, 0)); /* shape 0 replayed last: shape 1 is the older */
    advance_ms(10);
    assert_int_equal(stats(fn).graph_bytes, 2000);
    capture_shape(rt, fn, 2);
    sj_stats s = stats(fn);
    assert_int_equal(s.graphs, 3);
    assert_int_equal(s.graph_evictions, 1);
    assert_int_equal(s.graph_bytes, 2000);
    assert_int_equal(atomic_load(&frees), 1);
    assert_int_equal(atomic_load(&ev_evicted), 1);
    assert_int_equal(atomic_load(&ev_bytes), 1000);
    assert_int_equal(atomic_load(&rt->cuda_graphs), 2);
    assert_true(call_checked(fn, 0));
    assert_true(call_checked(fn, 2));
    assert_false(call_checked(fn, 1)); /* evicted */
    /* shape 1 earns its capture again (SJ_GRAPH_AFTER calls from zero) */
    for (int i = 0; i < SJ_GRAPH_AFTER - 2; i++) assert_false(call_checked(fn, 1));
    assert_int_equal(pending_captures(rt, fn), 0);
    assert_false(call_checked(fn, 1));
    assert_int_equal(pending_captures(rt, fn), 1);
    advance_ms(10);
    assert_true(call_checked(fn, 2)); /* now shape 0 is the older */
    assert_int_equal(sj_runtime_run_background(rt, 8), 1);
    assert_int_equal(stats(fn).graph_evictions, 2);
    assert_false(call_checked(fn, 0));
    assert_true(call_checked(fn, 1));
    sj_runtime_destroy(rt);
}

/* A graph alone larger than graph_max_bytes is not kept: counted, freed,
 * and its capture backs off; the graphs kept stay. */
static void graph_over_the_budget_not_kept(void **state) {
    (void)state;
    reset_counts();
    sj_runtime *rt = runtime(SJ_COMPILE_ASYNC, 0, 2500);
    sj_fn *fn = function(rt);
    make_fused(rt, fn);
    capture_shape(rt, fn, 0);
    graph_bytes = 3000;
    capture_shape(rt, fn, 1);
    sj_stats s = stats(fn);
    assert_int_equal(s.graphs, 1);
    assert_int_equal(s.graphs_over_budget, 1);
    assert_int_equal(s.graph_failures, 1);
    assert_int_equal(s.graph_evictions, 0);
    assert_int_equal(s.graph_bytes, 1000);
    assert_int_equal(atomic_load(&frees), 1); /* the one not kept */
    assert_true(call_checked(fn, 0));
    assert_false(call_checked(fn, 1));
    assert_int_equal(atomic_load(&rt->cuda_graphs), 1);
    sj_runtime_destroy(rt);
}

/* Sync compile mode: the call that asks for a capture runs it itself once
 * its call is over (out of the budget's mark: an eviction there waits for
 * calls, its own included, to leave). */
static void sync_mode_captures_on_the_calling_thread(void **state) {
    (void)state;
    reset_counts();
    sj_runtime *rt = runtime(SJ_COMPILE_SYNC, 0, 1500);
    sj_fn *fn = function(rt);
    calls_until_captured(fn, 0, 1);
    assert_true(call_checked(fn, 0));
    calls_until_captured(fn, 1, 2); /* evicts shape 0's graph, inline */
    assert_int_equal(stats(fn).graph_evictions, 1);
    assert_true(call_checked(fn, 1));
    assert_false(call_checked(fn, 0));
    sj_runtime_destroy(rt);
}

/* A warm-up with the caller's buffers captures their graph as a queued
 * job and waits for it (compile workers, or none: the warm-up thread runs
 * the queue), so the first call is one graph launch. */
static void warmup_captures_and_waits(void **state) {
    (void)state;
    for (int workers = 0; workers <= 1; workers++) {
        reset_counts();
        sj_runtime *rt = runtime(SJ_COMPILE_ASYNC, workers, 0);
        sj_fn *fn = function(rt);
        for (int i = 0; i < sizes[2]; i++) xs[2][i] = 0.5f;
        sj_tensor in = sj_tensor_make(xs[2], SJ_F32, 1, (int64_t[]){sizes[2]});
        sj_tensor out = sj_tensor_make(ys[2], SJ_F32, 1, (int64_t[]){sizes[2]});
        sj_warmup_spec spec = {0};
        spec.n_shapes = 1;
        spec.shapes = &in;
        spec.outputs = &out;
        spec.n_outputs = 1;
        assert_int_equal(sj_fn_warmup(fn, &spec, 0), SJ_OK);
        sj_warmup_shape_info info;
        assert_int_equal(sj_fn_warmup_shape(fn, 0, &info), SJ_OK);
        assert_int_equal(info.graph, 1);
        assert_int_equal(atomic_load(&captures), 1);
        assert_int_equal(pending_captures(rt, fn), 0);
        assert_int_equal(stats(fn).graph_calls, 0); /* a warm-up run is not a call */
        assert_true(call_checked(fn, 2));           /* the first call: the graph */
        sj_runtime_destroy(rt);
    }
}

/* Threads calling while a compile worker captures and evicts: every result
 * right, and the worker's grace periods end. */
typedef struct caller_arg {
    sj_fn *fn;
    int s, calls;
} caller_arg;

static void *caller(void *p) {
    caller_arg *a = p;
    float x[NMAX], y[NMAX];
    int n = sizes[a->s];
    sj_tensor in = sj_tensor_make(x, SJ_F32, 1, (int64_t[]){n});
    sj_tensor out = sj_tensor_make(y, SJ_F32, 1, (int64_t[]){n});
    /* at least `calls`, then until graphs have served some (the worker
     * captures when it gets the core) */
    for (int c = 0; c < 200000 && (c < a->calls || stats(a->fn).graph_calls < 200); c++) {
        for (int i = 0; i < n; i++) x[i] = (float)((c * 7 + i * 13) % 400 - 200) / 64.0f;
        if (sj_call(a->fn, &in, 1, &out, 1)) return "call failed";
        for (int i = 0; i < n; i++) {
            double r = tanh((double)x[i] * 2.0 + 1.0) - (double)x[i] / 4.0;
            if (!(fabs((double)y[i] - r) <= 1e-5)) return "wrong result";
        }
        if (c % 64 == 0) advance_ms(1);
    }
    return NULL;
}


static void threads_with_a_worker(void **state) {
    (void)state;
    reset_counts();
    sj_runtime *rt = runtime(SJ_COMPILE_ASYNC, 1, 2500);
    sj_fn *fn = function(rt);
    call_checked(fn, 0);
    assert_int_equal(sj_fn_wait_idle(fn, 60000), SJ_OK);
    pthread_t th[SHAPES];
    caller_arg args[SHAPES];
    for (int s = 0; s < SHAPES; s++) {
        args[s] = (caller_arg){fn, s, 600};
        assert_int_equal(pthread_create(&th[s], NULL, caller, &args[s]), 0);
    }
    for (int s = 0; s < SHAPES; s++) {
        void *res = NULL;
        pthread_join(th[s], &res);
        if (res) fail_msg("shape %d: %s", s, (const char *)res);
    }
    assert_int_equal(sj_fn_wait_idle(fn, 60000), SJ_OK);
    sj_stats s = stats(fn);
    assert_true(s.graphs >= 2);
    assert_true(s.graph_bytes <= 2500);
    assert_true(s.graph_calls > 0);
    assert_int_equal((int)s.graphs, (int)s.graph_evictions + atomic_load(&rt->cuda_graphs));
    sj_runtime_destroy(rt);
    assert_int_equal(atomic_load(&frees), (int)s.graphs);
}

/* The device's own background work on the same queue (issue 24): a
 * device with a set_post slot is handed the queue's post callback when the
 * runtime starts and has it taken back before the queue stops; a posted
 * job runs on a compile worker; without workers (compile_threads 0) it
 * waits, as every kind, for sj_runtime_run_background, and one still
 * queued when the runtime goes is dropped back to the device; in sync
 * mode post refuses and the device keeps the work. */
static _Atomic int posts_set, posts_cleared, device_runs, device_drops;
static sj_post_fn given_post;
static void *given_ctx;

static void fake_set_post(sj_backend *b, sj_post_fn post, void *ctx) {
    (void)b;
    if (post) atomic_fetch_add(&posts_set, 1);
    else atomic_fetch_add(&posts_cleared, 1);
    given_post = post, given_ctx = ctx;
}

static void device_run(void *arg) { atomic_fetch_add(&device_runs, 1), (void)arg; }
static void device_drop(void *arg) { atomic_fetch_add(&device_drops, 1), (void)arg; }

static void device_jobs_on_the_queue(void **state) {
    (void)state;
    for (int mode = 0; mode < 3; mode++) { /* async with a worker, async with none, sync */
        atomic_store(&posts_set, 0);
        atomic_store(&posts_cleared, 0);
        atomic_store(&device_runs, 0);
        atomic_store(&device_drops, 0);
        sj_runtime_config cfg = tu_cpu_config();
        cfg.compile_mode = mode == 2 ? SJ_COMPILE_SYNC : SJ_COMPILE_ASYNC;
        cfg.compile_threads = mode == 0 ? 1 : 0;
        sj_runtime *rt = NULL;
        assert_int_equal(sj_runtime_create(&cfg, &rt), SJ_OK);
        /* the CPU device has no set_post: give it one and remake the queue
         * (as the test hooks do), so the runtime hands the callback over */
        rt->backend->set_post = fake_set_post;
        sj_runtime_test_hooks(rt, 0, 0);
        assert_int_equal(atomic_load(&posts_set), 1);
        assert_int_equal(atomic_load(&posts_cleared), 1); /* the old queue's, taken back */
        assert_non_null(given_post);
        bool queued = given_post(given_ctx, device_run, device_drop, NULL);
        assert_int_equal(queued, mode != 2);
        if (mode == 0) {
            for (int i = 0; i < 5000 && atomic_load(&device_runs) == 0; i++) usleep(1000);
            assert_int_equal(atomic_load(&device_runs), 1);
        }
        if (mode == 1) { /* stepped by the program, as compiles and captures */
            assert_int_equal(atomic_load(&device_runs), 0);
            sj_job_counters jc;
            sj_runtime_job_counters(rt, &jc);
            assert_int_equal(jc.kind[SJ_JOB_DEVICE].queued, 1);
            assert_int_equal(sj_runtime_run_background(rt, 8), 1);
            assert_int_equal(atomic_load(&device_runs), 1);
            sj_runtime_job_counters(rt, &jc);
            assert_int_equal(jc.kind[SJ_JOB_DEVICE].queued, 0);
            assert_int_equal(jc.kind[SJ_JOB_DEVICE].ran, 1);
            assert_true(given_post(given_ctx, device_run, device_drop, NULL)); /* left queued: dropped back */
        }
        sj_runtime_destroy(rt);
        assert_int_equal(atomic_load(&posts_cleared), 2);
        assert_null(given_post);
        assert_int_equal(atomic_load(&device_runs), mode != 2);
        assert_int_equal(atomic_load(&device_drops), mode == 1);
    }
}

/* -- Per-kind limits of the queue ------------------------------------------------- */

/* A runtime whose CPU device posts background work (the fake set_post),
 * with n compile workers and, when delay_ms, compiles that take that long
 * (the test hooks). */
static sj_runtime *posting_runtime(int workers, int delay_ms) {
    atomic_store(&device_runs, 0);
    atomic_store(&device_drops, 0);
    sj_runtime_config cfg = tu_cpu_config();
    cfg.compile_mode = SJ_COMPILE_ASYNC;
    cfg.compile_threads = workers;
    cfg.hot_threshold = 1;
    cfg.specialize_threshold = 1000000;
    tu_clock_use(&cfg, &clk);
    sj_runtime *rt = NULL;
    assert_int_equal(sj_runtime_create(&cfg, &rt), SJ_OK);
    rt->backend->set_post = fake_set_post;
    sj_runtime_test_hooks(rt, delay_ms, 0); /* the queue remade: the device is handed its post */
    assert_non_null(given_post);
    return rt;
}

static sj_job_counters job_counters(sj_runtime *rt) {
    sj_job_counters jc;
    sj_runtime_job_counters(rt, &jc);
    return jc;
}

/* A device job that runs until the gate opens, counting how many run at
 * once. */
static _Atomic int gate_open, gated_now, gated_max;
static void gated_run(void *arg) {
    (void)arg;
    int now = atomic_fetch_add(&gated_now, 1) + 1;
    int mx = atomic_load(&gated_max);
    while (now > mx && !atomic_compare_exchange_weak(&gated_max, &mx, now)) {
    }
    while (!atomic_load(&gate_open)) usleep(1000);
    atomic_fetch_sub(&gated_now, 1);
    atomic_fetch_add(&device_runs, 1);
}

typedef struct poster_arg {
    int posts, accepted;
} poster_arg;

static void *poster(void *p) {
    poster_arg *a = p;
    for (int i = 0; i < a->posts; i++) a->accepted += given_post(given_ctx, device_run, device_drop, NULL);
    return NULL;
}

/* The limits follow the rule (sj_job_counters): with n workers, compiles
 * take n - 1 (all of one; n - job_reserve_workers while n is larger), each
 * other kind half, rounded up; no workers: no running limit; every kind
 * queues job_queue_max. */
static void limits_follow_the_rule(void **state) {
    (void)state;
    static const int workers[] = {0, 1, 2, 3, 4};
    static const int compile_max[] = {0, 1, 1, 2, 3}, other_max[] = {0, 1, 1, 2, 2};
    for (int w = 0; w < 5; w++) {
        sj_runtime_config cfg = tu_cpu_config();
        cfg.compile_threads = workers[w];
        cfg.job_queue_max = 77;
        sj_runtime *rt = NULL;
        assert_int_equal(sj_runtime_create(&cfg, &rt), SJ_OK);
        sj_job_counters jc = job_counters(rt);
        assert_int_equal(jc.workers, workers[w]);
        for (int k = 0; k < SJ_JOB_KINDS; k++) {
            assert_int_equal(jc.kind[k].queue_max, 77);
            assert_int_equal(jc.kind[k].workers_max, k == SJ_JOB_COMPILE ? compile_max[w] : other_max[w]);
            assert_int_equal(jc.kind[k].queued + jc.kind[k].running, 0);
        }
        sj_runtime_destroy(rt);
    }
    /* job_reserve_workers: workers kept from compiles while there are more */
    static const int reserve[] = {0, 2, 3, 5};
    static const int compile_max3[] = {3, 1, 3, 3};
    for (int r = 0; r < 4; r++) {
        sj_runtime_config cfg = tu_cpu_config();
        cfg.compile_threads = 3;
        cfg.job_reserve_workers = reserve[r];
        sj_runtime *rt = NULL;
        assert_int_equal(sj_runtime_create(&cfg, &rt), SJ_OK);
        sj_job_counters jc = job_counters(rt);
        assert_int_equal(jc.kind[SJ_JOB_COMPILE].workers_max, compile_max3[r]);
        assert_int_equal(jc.kind[SJ_JOB_CAPTURE].workers_max, 2);
        sj_runtime_destroy(rt);
    }
    sj_runtime_config cfg = tu_cpu_config();
    cfg.job_queue_max = 0; /* out of range */
    sj_runtime *rt = NULL;
    assert_int_equal(sj_runtime_create(&cfg, &rt), SJ_EINVAL);
}

/* Four threads post 50 device jobs each at a queue that holds 5 of the
 * kind: exactly 5 are taken, 195 refused and counted; stepping runs the 5.
 * A compile past its kind's limit is refused too, its entry left as it
 * was: a later call queues it once there is room. */
static void queue_limit_holds_under_concurrent_posts(void **state) {
    (void)state;
    sj_runtime *rt = posting_runtime(0, 0);
    sj_compiler_set_kind_limits(rt->compiler, SJ_JOB_DEVICE, 5, -1);
    pthread_t th[4];
    poster_arg args[4];
    for (int i = 0; i < 4; i++) {
        args[i] = (poster_arg){50, 0};
        assert_int_equal(pthread_create(&th[i], NULL, poster, &args[i]), 0);
    }
    int accepted = 0;
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        accepted += args[i].accepted;
    }
    assert_int_equal(accepted, 5);
    sj_job_counters jc = job_counters(rt);
    assert_int_equal(jc.kind[SJ_JOB_DEVICE].queued, 5);
    assert_int_equal(jc.kind[SJ_JOB_DEVICE].dropped, 195);
    assert_int_equal(atomic_load(&device_runs), 0);
    assert_int_equal(sj_runtime_run_background(rt, 100), 5);
    assert_int_equal(atomic_load(&device_runs), 5);
    jc = job_counters(rt);
    assert_int_equal(jc.kind[SJ_JOB_DEVICE].queued, 0);
    assert_int_equal(jc.kind[SJ_JOB_DEVICE].ran, 5);

    /* compiles: none may queue */
    sj_compiler_set_kind_limits(rt->compiler, SJ_JOB_COMPILE, 0, -1);
    sj_fn *fn = function(rt);
    call_checked(fn, 0); /* hot at once: its compile refused */
    call_checked(fn, 0); /* asks again: refused again */
    jc = job_counters(rt);
    assert_int_equal(jc.kind[SJ_JOB_COMPILE].queued, 0);
    assert_int_equal(jc.kind[SJ_JOB_COMPILE].dropped, 2);
    assert_int_equal(atomic_load(&fn->table.n_entries), 1);
    assert_int_equal(sj_runtime_run_background(rt, 8), 0);
    sj_compiler_set_kind_limits(rt->compiler, SJ_JOB_COMPILE, 1, -1);
    call_checked(fn, 0); /* queued now */
    assert_int_equal(job_counters(rt).kind[SJ_JOB_COMPILE].queued, 1);
    assert_int_equal(sj_runtime_run_background(rt, 8), 1);
    call_checked(fn, 0);
    assert_int_equal(stats(fn).compiles, 1);
    assert_true(stats(fn).fused_symbolic_calls >= 1);
    char *text = tu_explain(fn);
    if (!strstr(text, "background queue (the runtime's, 0 workers): compile 0 queued (of 1), 0 running, 1 ran, 2 dropped;") ||
        !strstr(text, "device 0 queued (of 5), 0 running, 5 ran, 195 dropped"))
        fail_msg("explain:\n%s", text);
    free(text);
    sj_runtime_destroy(rt);
    assert_int_equal(atomic_load(&device_drops), 0);
}

/* Three workers: device jobs that block take at most their limit (2) of
 * them, the rest stay queued, and a compile runs on the third worker
 * while they block; opened, every device job runs, never more than 2 at
 * once. */
static void kind_at_its_limit_leaves_workers_to_others(void **state) {
    (void)state;
    sj_runtime *rt = posting_runtime(3, 0);
    atomic_store(&gate_open, 0);
    atomic_store(&gated_now, 0);
    atomic_store(&gated_max, 0);
    for (int i = 0; i < 4; i++) assert_true(given_post(given_ctx, gated_run, device_drop, NULL));
    sj_job_counters jc;
    for (int i = 0; i < 10000; i++) {
        jc = job_counters(rt);
        if (jc.kind[SJ_JOB_DEVICE].running == 2) break;
        usleep(1000);
    }
    assert_int_equal(jc.kind[SJ_JOB_DEVICE].running, 2);
    assert_int_equal(jc.kind[SJ_JOB_DEVICE].queued, 2);
    sj_fn *fn = function(rt);
    call_checked(fn, 0);                               /* hot: its compile queued */
    assert_int_equal(sj_fn_wait_idle(fn, 60000), SJ_OK); /* compiled while the device jobs block */
    assert_int_equal(stats(fn).compiles, 1);
    jc = job_counters(rt);
    assert_int_equal(jc.kind[SJ_JOB_DEVICE].running, 2);
    assert_int_equal(jc.kind[SJ_JOB_DEVICE].queued, 2);
    assert_int_equal(atomic_load(&gated_max), 2);
    call_checked(fn, 0);
    assert_true(stats(fn).fused_symbolic_calls >= 1);
    atomic_store(&gate_open, 1);
    for (int i = 0; i < 10000 && atomic_load(&device_runs) < 4; i++) usleep(1000);
    assert_int_equal(atomic_load(&device_runs), 4);
    assert_int_equal(atomic_load(&gated_max), 2);
    assert_int_equal(job_counters(rt).kind[SJ_JOB_DEVICE].ran, 4);
    sj_runtime_destroy(rt);
}

/* A compile slot that holds every compile until the gate opens. */
static sj_status (*real_compile)(sj_backend *b, const sj_compile_req *req, sj_compile_result *out);
static sj_status gated_compile(sj_backend *b, const sj_compile_req *req, sj_compile_result *out) {
    while (!atomic_load(&gate_open)) usleep(1000);
    return real_compile(b, req, out);
}

/* Two workers, compiles held at a gate: of two compiles queued one runs
 * (compiles take n - 1 workers) and one waits, and a device job posted
 * meanwhile runs on the other worker while the compile is held. */
static void compiles_leave_a_worker_to_short_jobs(void **state) {
    (void)state;
    sj_runtime *rt = posting_runtime(2, 0);
    atomic_store(&gate_open, 0);
    real_compile = rt->backend->compile;
    rt->backend->compile = gated_compile;
    sj_fn *f1 = function(rt), *f2 = function(rt);
    call_checked(f1, 0);
    call_checked(f2, 1);
    sj_job_counters jc;
    for (int i = 0; i < 10000; i++) {
        jc = job_counters(rt);
        if (jc.kind[SJ_JOB_COMPILE].running == 1 && jc.kind[SJ_JOB_COMPILE].queued == 1) break;
        usleep(1000);
    }
    assert_int_equal(jc.kind[SJ_JOB_COMPILE].running, 1);
    assert_int_equal(jc.kind[SJ_JOB_COMPILE].queued, 1); /* the second worker does not take it */
    assert_true(given_post(given_ctx, device_run, device_drop, NULL));
    for (int i = 0; i < 10000 && atomic_load(&device_runs) == 0; i++) usleep(1000);
    assert_int_equal(atomic_load(&device_runs), 1); /* ran while the compile is held */
    jc = job_counters(rt);
    assert_int_equal(jc.kind[SJ_JOB_COMPILE].ran, 0);
    assert_int_equal(jc.kind[SJ_JOB_COMPILE].running, 1);
    atomic_store(&gate_open, 1);
    assert_int_equal(sj_fn_wait_idle(f1, 60000), SJ_OK);
    assert_int_equal(sj_fn_wait_idle(f2, 60000), SJ_OK);
    assert_int_equal(job_counters(rt).kind[SJ_JOB_COMPILE].ran, 2);
    call_checked(f1, 0);
    call_checked(f2, 1);
    assert_true(stats(f1).fused_symbolic_calls >= 1 && stats(f2).fused_symbolic_calls >= 1);
    sj_runtime_destroy(rt);
}

/* -- Bucket graphs ------------------------------------------------------------------ */

/* y = t - mean(t, rows), t = tanh(x @ W): x [S, 8] with S in buckets; t an
 * intermediate in the arena, which a bucket graph lays out for the
 * bucket's largest S. */
static float bw[64];
static sj_status b_model(sj_tracer *t, const sj_val *in, int n, void *u) {
    (void)n, (void)u;
    sj_tensor w = sj_tensor_make(bw, SJ_F32, 2, (int64_t[]){8, 8});
    sj_val h = sj_tanh(t, sj_matmul(t, in[0], sj_param(t, &w)));
    return sj_output(t, sj_sub(t, h, sj_mean(t, h, 0, 1)));
}

static float bx[64 * 8 * 2], by[64 * 8 * 2];

/* One call of S rows, checked against float64; true when a bucket graph
 * served it. */
static bool bucket_call(sj_fn *fn, int64_t S) {
    for (int i = 0; i < S * 8; i++) bx[i] = (float)(rand() % 4000 - 2000) / 2048.0f, by[i] = NAN;
    sj_tensor in = sj_tensor_make(bx, SJ_F32, 2, (int64_t[]){S, 8});
    sj_tensor out = sj_tensor_make(by, SJ_F32, 2, (int64_t[]){S, 8});
    sj_stats a = stats(fn);
    assert_int_equal(sj_call(fn, &in, 1, &out, 1), SJ_OK);
    sj_stats b = stats(fn);
    static double h[128 * 8];
    double mean[8] = {0};
    for (int64_t r = 0; r < S; r++)
        for (int j = 0; j < 8; j++) {
            double acc = 0;
            for (int k = 0; k < 8; k++) acc += (double)bx[r * 8 + k] * (double)bw[k * 8 + j];
            h[r * 8 + j] = tanh(acc);
            mean[j] += h[r * 8 + j] / (double)S;
        }
    for (int64_t r = 0; r < S; r++)
        for (int j = 0; j < 8; j++)
            if (!(fabs((double)by[r * 8 + j] - (h[r * 8 + j] - mean[j])) <= 1e-5))
                fail_msg("S=%lld [%lld,%d]: %.9g, float64 %.9g", (long long)S, (long long)r, j, (double)by[r * 8 + j],
                         h[r * 8 + j] - mean[j]);
    assert_int_equal(b.graph_calls - a.graph_calls, b.bucket_graph_calls - a.bucket_graph_calls);
    return b.bucket_graph_calls > a.bucket_graph_calls;
}

/* A bucketed entry's calls of changing sizes: SJ_GRAPH_AFTER of them
 * queue its bucket graph (a JOB_CAPTURE job), captured with buffers for
 * the bucket's largest S; then every size of the bucket is a replay, with
 * results equal to float64 (the arena laid out for the largest S), also
 * with the outputs direct (the caller's buffers given to the update: the
 * graph's own are poisoned, so a direct output the update did not write
 * fails); a refused replay runs kernel by kernel; the open bucket past the
 * last edge never gets one; bucket_graphs 0 captures none. */
static void bucket_graph_serves_every_size(void **state) {
    (void)state;
    for (int i = 0; i < 64; i++) bw[i] = (float)((i * 37) % 17 - 8) / 8.0f;
    for (int on = 2; on >= 0; on--) { /* 2: with the outputs direct */
        reset_counts();
        direct_outputs = on == 2;
        sj_runtime_config cfg = config(SJ_COMPILE_ASYNC, 0, 0);
        cfg.bucket_graphs = on > 0;
        sj_runtime *rt = runtime_of(&cfg);
        sj_fn_options o;
        sj_fn_options_init(&o);
        sj_fn *fn = NULL;
        assert_int_equal(sj_fn_create(rt, "bucketq", 1, b_model, NULL, &o, &fn), SJ_OK);
        assert_int_equal(sj_set_buckets(fn, 0, 0, (const int64_t[]){16, 32, 64}, 3), SJ_OK);
        assert_false(bucket_call(fn, 17)); /* traced, its compile queued */
        while (sj_runtime_run_background(rt, 8) > 0) {
        }
        for (int i = 0; i < SJ_GRAPH_AFTER; i++) assert_false(bucket_call(fn, 17 + i % 16));
        assert_int_equal(sj_runtime_run_background(rt, 8), on ? 1 : 0);
        assert_int_equal(atomic_load(&bucket_captures), on > 0);
        if (on) {
            assert_int_equal(bucket_sizes[0], 32 * 8 * sizeof(float)); /* the bucket's largest */
            assert_int_equal(bucket_sizes[1], 32 * 8 * sizeof(float));
        }
        int served = 0;
        for (int64_t S = 32; S > 16; S--) served += bucket_call(fn, S);
        assert_int_equal(served, on ? 16 : 0);
        atomic_store(&refuse_replays, 1);
        assert_false(bucket_call(fn, 20)); /* busy: kernel by kernel */
        atomic_store(&refuse_replays, 0);
        assert_int_equal(bucket_call(fn, 21), on > 0);
        /* the open bucket (64, inf): never a bucket graph */
        assert_false(bucket_call(fn, 65)); /* traced, its compile queued */
        while (sj_runtime_run_background(rt, 8) > 0) {
        }
        for (int i = 0; i < 2 * SJ_GRAPH_AFTER; i++) assert_false(bucket_call(fn, 65 + i % 60));
        while (sj_runtime_run_background(rt, 8) > 0) {
        }
        for (int i = 0; i < 4; i++) assert_false(bucket_call(fn, 65 + i));
        sj_stats s = stats(fn);
        assert_int_equal(s.bucket_graphs, on > 0);
        assert_int_equal(s.bucket_graph_calls, on ? 17 : 0);
        assert_int_equal(atomic_load(&bucket_replays), on ? 17 : 0);
        assert_int_equal(atomic_load(&bucket_captures), on > 0);
        assert_int_equal(s.eager_calls, 2); /* each entry's first call */
        sj_runtime_destroy(rt);
        assert_int_equal(atomic_load(&frees), on > 0);
    }
}

/* A warm-up on inputs the runtime makes asks for each warmed bucket's graph
 * and waits for it (compile workers and a slow capture, or none: the
 * warm-up thread runs the queue), so the first call of every warmed bucket
 * is a replay. */
static void bucket_warmup_waits_for_its_graphs(void **state) {
    (void)state;
    for (int workers = 0; workers <= 1; workers++) {
        reset_counts();
        capture_delay_ms = workers ? 30 : 0;
        sj_runtime *rt = runtime(SJ_COMPILE_ASYNC, workers, 0);
        sj_fn *fn = NULL;
        assert_int_equal(sj_fn_create(rt, "bucketw", 1, b_model, NULL, NULL, &fn), SJ_OK);
        assert_int_equal(sj_set_buckets(fn, 0, 0, (const int64_t[]){16, 32, 64}, 3), SJ_OK);
        sj_tensor shapes[2] = {sj_tensor_make(NULL, SJ_F32, 2, (int64_t[]){32, 8}),
                               sj_tensor_make(NULL, SJ_F32, 2, (int64_t[]){64, 8})};
        sj_warmup_spec spec = {.n_shapes = 2, .shapes = shapes};
        assert_int_equal(sj_fn_warmup(fn, &spec, 0), SJ_OK);
        assert_int_equal(atomic_load(&bucket_captures), 2);
        assert_int_equal(stats(fn).bucket_graphs, 2);
        assert_true(bucket_call(fn, 20)); /* (16, 32] */
        assert_true(bucket_call(fn, 50)); /* (32, 64] */
        sj_runtime_destroy(rt);
        capture_delay_ms = 0;
    }
}

/* Quick compiles (cfg.compile_quick, issue 28): an entry's first unit,
 * while its calls ran eagerly, is a quick one (the test hook marks the
 * CPU's unit quick); it serves fused calls at once with right results, but
 * no call of it asks for a graph; the full compile queued behind it swaps
 * in (quick_replaced), and then the calls' graph is captured as usual.
 * compile_quick 0: the first unit is full, and its 48th call asks for the
 * graph. */
static void quick_unit_then_full(void **state) {
    (void)state;
    for (int on = 1; on >= 0; on--) {
        reset_counts();
        sj_runtime_config cfg = config(SJ_COMPILE_ASYNC, 0, 0);
        cfg.compile_quick = on;
        sj_runtime *rt = runtime_of(&cfg);
        sj_runtime_test_quick(rt, true);
        sj_fn *fn = function(rt);
        assert_false(call_checked(fn, 0));                       /* eager: its compile queued */
        assert_int_equal(sj_runtime_run_background(rt, 1), 1); /* the first unit */
        sj_stats s = stats(fn);
        assert_int_equal(s.compiles, 1);
        assert_int_equal(s.quick_compiles, on);
        assert_int_equal(s.quick_replaced, 0);
        for (int i = 0; i < 2 * SJ_GRAPH_AFTER; i++) assert_false(call_checked(fn, 0));
        s = stats(fn);
        assert_int_equal(s.eager_calls, 1);
        assert_int_equal(s.fused_symbolic_calls, 2 * SJ_GRAPH_AFTER);
        assert_int_equal(pending_captures(rt, fn), on ? 0 : 1); /* no graph of quick code */
        while (sj_runtime_run_background(rt, 8) > 0) { /* on: the full compile; off: the capture */
        }
        s = stats(fn);
        assert_int_equal(s.quick_replaced, on);
        assert_int_equal(s.compiles, 1);
        if (on) {
            calls_to_capture(fn, 0); /* the full unit's calls ask for the graph */
            assert_int_equal(pending_captures(rt, fn), 1);
            while (sj_runtime_run_background(rt, 8) > 0) {
            }
        }
        assert_int_equal(atomic_load(&captures), 1);
        assert_true(call_checked(fn, 0));
        sj_fn_destroy(fn);
        sj_runtime_destroy(rt);
    }
    /* a compile worker: the full compile on a thread of its own, which
     * sj_fn_wait_idle waits for; destroying the function meanwhile waits
     * for it too */
    for (int wait = 1; wait >= 0; wait--) {
        sj_runtime *rt = runtime(SJ_COMPILE_ASYNC, 1, 0);
        sj_runtime_test_quick(rt, true);
        sj_fn *fn = function(rt);
        call_checked(fn, 0);
        if (wait) {
            assert_int_equal(sj_fn_wait_idle(fn, 60000), SJ_OK);
            sj_stats s = stats(fn);
            assert_int_equal(s.quick_compiles, 1);
            assert_int_equal(s.quick_replaced, 1);
            call_checked(fn, 0);
            assert_int_equal(stats(fn).fused_symbolic_calls, 1);
        }
        sj_fn_destroy(fn);
        sj_runtime_destroy(rt);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(capture_is_a_queued_job),
        cmocka_unit_test(capture_cancelled_with_its_function),
        cmocka_unit_test(failed_capture_backs_off_then_blacklisted),
        cmocka_unit_test(capture_retried_after_its_penalty),
        cmocka_unit_test(budget_evicts_least_recently_replayed),
        cmocka_unit_test(graph_over_the_budget_not_kept),
        cmocka_unit_test(sync_mode_captures_on_the_calling_thread),
        cmocka_unit_test(warmup_captures_and_waits),
        cmocka_unit_test(bucket_warmup_waits_for_its_graphs),
        cmocka_unit_test(quick_unit_then_full),
        cmocka_unit_test(device_jobs_on_the_queue),
        cmocka_unit_test(threads_with_a_worker),
        cmocka_unit_test(limits_follow_the_rule),
        cmocka_unit_test(queue_limit_holds_under_concurrent_posts),
        cmocka_unit_test(kind_at_its_limit_leaves_workers_to_others),
        cmocka_unit_test(compiles_leave_a_worker_to_short_jobs),
        cmocka_unit_test(bucket_graph_serves_every_size),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
