/* Structured events (issue 30): cfg.event_fn receives one sj_event per
 * compile started, finished, failed, dropped or blacklisted, validation
 * rejection, demotion by the memory budget and recompile, with its
 * fields; the text lines still arrive as before. Background work runs on
 * the test's thread (compile_threads 0) on a virtual clock, so every event
 * is asserted in order. GRAPH_CAPTURED needs a GPU (graph_captured_on_device,
 * which prints "skipped: no CUDA device" without one). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jit/compile.h"
#include "jit/runtime.h"
#include "jit/shapejit.h"

#define MS INT64_C(1000000)
#define MAXEV 64

typedef struct {
    sj_event_kind kind;
    unsigned topic;
    char fn[32], shape[128], error[256];
    int entry, count;
    double ms;
    int64_t bytes, retry_ms, time_ns;
} rec;

static rec evs[MAXEV];
static int n_ev, n_lines, n_ready_lines;
static _Atomic int64_t now_ns = 5000 * MS;

static int64_t virtual_clock(void *user) {
    (void)user;
    return atomic_load(&now_ns);
}

static void on_event(void *user, const sj_event *e) {
    (void)user;
    if (n_ev == MAXEV) return;
    rec *r = &evs[n_ev++];
    r->kind = e->kind;
    r->topic = e->topic;
    snprintf(r->fn, sizeof r->fn, "%s", e->fn);
    snprintf(r->shape, sizeof r->shape, "%s", e->shape);
    snprintf(r->error, sizeof r->error, "%s", e->error);
    r->entry = e->entry;
    r->count = e->count;
    r->ms = e->duration_ms;
    r->bytes = e->bytes;
    r->retry_ms = e->retry_ms;
    r->time_ns = e->time_ns;
}

static void on_line(void *user, unsigned topic, const char *msg) {
    (void)user, (void)topic;
    n_lines++;
    if (strstr(msg, " ready (")) n_ready_lines++;
}

static void reset(void) { n_ev = n_lines = n_ready_lines = 0; }

/* The events of kind k, in order: the i-th, or NULL. */
static const rec *nth(sj_event_kind k, int i) {
    for (int j = 0; j < n_ev; j++)
        if (evs[j].kind == k && i-- == 0) return &evs[j];
    return NULL;
}

/* The i-th event of kind k, asserted to be there and to name function fn,
 * entry and shape (NULL, -1, NULL: not checked). */
static const rec *check_event(sj_event_kind k, int i, const char *fn, int entry, const char *shape) {
    const rec *r = nth(k, i);
    assert_non_null(r);
    if (fn) assert_string_equal(r->fn, fn);
    if (entry >= 0) assert_int_equal(r->entry, entry);
    if (shape) assert_string_equal(r->shape, shape);
    return r;
}

static int count(sj_event_kind k) {
    int n = 0;
    for (int j = 0; j < n_ev; j++) n += evs[j].kind == k;
    return n;
}

/* A runtime of cfg, with the events and lines recorded from none. */
static sj_runtime *open_runtime(const sj_runtime_config *cfg) {
    reset();
    sj_runtime *rt = NULL;
    assert_int_equal(sj_runtime_create(cfg, &rt), SJ_OK);
    return rt;
}

static sj_runtime_config config(void) {
    sj_runtime_config cfg;
    sj_runtime_config_init(&cfg);
    cfg.backend = SJ_BACKEND_CPU;
    cfg.log_mask = SJ_LOG_ALL;
    cfg.log_fn = on_line;
    cfg.event_fn = on_event;
    cfg.compile_mode = SJ_COMPILE_ASYNC;
    cfg.compile_threads = 0;
    cfg.cache_dir = NULL;
    cfg.exec_threads = 1;
    cfg.hot_threshold = 1;
    cfg.specialize_threshold = 2;
    cfg.clock_ns = virtual_clock;
    return cfg;
}

static sj_status m_affine(sj_tracer *t, const sj_val *in, int n, void *u) {
    (void)n, (void)u;
    return sj_output(t, sj_add(t, sj_mul(t, in[0], sj_scalar(t, 2.0)), sj_scalar(t, 1.0)));
}

static void call(sj_fn *fn, int n) {
    float x[128], y[128];
    for (int i = 0; i < n; i++) x[i] = (float)(rand() % 2000 - 1000) / 64.0f;
    sj_tensor in = sj_tensor_make(x, SJ_F32, 1, (int64_t[]){n});
    sj_tensor out = sj_tensor_make(y, SJ_F32, 1, (int64_t[]){n});
    assert_int_equal(sj_call(fn, &in, 1, &out, 1), SJ_OK);
    for (int i = 0; i < n; i++) assert_float_equal(y[i], (double)x[i] * 2.0 + 1.0, 1e-5); /* eager or fused: right */
}

static sj_fn *function(sj_runtime *rt, const char *name, sj_dynamic dyn) {
    sj_fn_options o;
    sj_fn_options_init(&o);
    o.dynamic = dyn;
    sj_fn *fn = NULL;
    assert_int_equal(sj_fn_create(rt, name, 1, m_affine, NULL, &o, &fn), SJ_OK);
    return fn;
}

static void drain(sj_runtime *rt) {
    while (sj_runtime_run_background(rt, 8) > 0) {
    }
}

/* -- Compiles ---------------------------------------------------------------------------- */

static void compile_started_and_finished(void **state) {
    (void)state;
    sj_runtime_config cfg = config();
    sj_runtime *rt = open_runtime(&cfg);
    sj_fn *fn = function(rt, "evfn", SJ_DYNAMIC_SYMBOLIC);
    call(fn, 24);
    assert_int_equal(n_ev, 0); /* queued: nothing happened yet */
    drain(rt);
    const rec *s = check_event(SJ_EVENT_COMPILE_STARTED, 0, "evfn", 0, ""); /* the entry's symbolic kernels */
    const rec *f = check_event(SJ_EVENT_COMPILE_FINISHED, 0, NULL, 0, NULL);
    assert_true(s < f);
    assert_int_equal(s->topic, SJ_LOG_COMPILE);
    assert_true(s->time_ns == 5000 * MS); /* the virtual clock */
    assert_true(f->ms > 0);               /* compiled (no cache) */
    assert_true(f->bytes > 1000);         /* a shared object */
    assert_string_equal(f->error, "");
    /* a hot shape's specialization names the shape */
    call(fn, 24);
    call(fn, 24);
    drain(rt);
    check_event(SJ_EVENT_COMPILE_STARTED, 1, NULL, -1, "s0=24");
    check_event(SJ_EVENT_COMPILE_FINISHED, 1, NULL, 0, "s0=24");
    assert_int_equal(n_ready_lines, 2); /* the text lines still come */
    assert_true(n_lines > n_ev);
    sj_runtime_destroy(rt);
}

static void compile_failed_then_blacklisted(void **state) {
    (void)state;
    sj_runtime_config cfg = config();
    cfg.compile_retry_ms = 100;
    cfg.compile_max_failures = 2;
    sj_runtime *rt = open_runtime(&cfg);
    sj_runtime_test_hooks(rt, 0, 1); /* every compile fails */
    sj_fn *fn = function(rt, "failing", SJ_DYNAMIC_AUTO);
    call(fn, 24);
    drain(rt);
    const rec *f = check_event(SJ_EVENT_COMPILE_FAILED, 0, NULL, 0, NULL);
    assert_int_equal(f->count, 1);
    assert_true(f->retry_ms >= 75 && f->retry_ms <= 125); /* 100 ms +-25% */
    assert_true(strlen(f->error) > 0);
    assert_int_equal(count(SJ_EVENT_COMPILE_BLACKLISTED), 0);
    atomic_fetch_add(&now_ns, 200 * MS);
    call(fn, 24);
    drain(rt);
    const rec *f2 = check_event(SJ_EVENT_COMPILE_FAILED, 1, NULL, -1, NULL);
    const rec *b = check_event(SJ_EVENT_COMPILE_BLACKLISTED, 0, NULL, -1, NULL);
    assert_int_equal(f2->count, 2);
    assert_int_equal(f2->retry_ms, -1);
    assert_true(b > f2);
    assert_int_equal(b->count, 2);
    assert_string_equal(b->error, f2->error);
    sj_runtime_destroy(rt);
    sj_runtime_test_hooks(NULL, 0, 0);
}

static void compile_dropped_when_cold(void **state) {
    (void)state;
    sj_runtime_config cfg = config();
    sj_runtime *rt = open_runtime(&cfg);
    sj_compiler_set_cold_ms(rt->compiler, 1000);
    sj_fn *fn = function(rt, "cold", SJ_DYNAMIC_AUTO);
    call(fn, 24);
    atomic_fetch_add(&now_ns, 2000 * MS); /* no calls while it waits */
    drain(rt);
    const rec *d = check_event(SJ_EVENT_COMPILE_DROPPED, 0, NULL, 0, NULL);
    assert_non_null(strstr(d->error, "cold"));
    assert_int_equal(count(SJ_EVENT_COMPILE_STARTED), 0);
    /* queued again, then its function destroyed */
    call(fn, 24);
    sj_fn_destroy(fn);
    const rec *d2 = check_event(SJ_EVENT_COMPILE_DROPPED, 1, NULL, -1, NULL);
    assert_non_null(strstr(d2->error, "destroyed"));
    sj_runtime_destroy(rt);
}

/* A shape's specialization queued while the shape stops coming is
 * dropped as cold, though its entry keeps serving other shapes; the shape's
 * next call queues it again. */
static void shape_no_longer_seen_is_dropped(void **state) {
    (void)state;
    sj_runtime_config cfg = config();
    sj_runtime *rt = open_runtime(&cfg);
    sj_compiler_set_cold_ms(rt->compiler, 1000);
    sj_fn *fn = function(rt, "stale", SJ_DYNAMIC_SYMBOLIC);
    call(fn, 24);
    drain(rt);
    call(fn, 24); /* its second call: hot, its specialization queued */
    for (int i = 0; i < 20; i++) {
        call(fn, 40); /* the entry stays busy */
        atomic_fetch_add(&now_ns, 100 * MS);
    }
    drain(rt);
    check_event(SJ_EVENT_COMPILE_DROPPED, 0, NULL, -1, "s0=24");
    sj_stats s;
    sj_fn_stats(fn, &s);
    assert_int_equal(s.compiles_dropped, 1);
    int finished = count(SJ_EVENT_COMPILE_FINISHED);
    call(fn, 24); /* seen again: queued again */
    drain(rt);
    assert_int_equal(count(SJ_EVENT_COMPILE_FINISHED), finished + 1);
    check_event(SJ_EVENT_COMPILE_FINISHED, finished, NULL, -1, "s0=24");
    sj_runtime_destroy(rt);
}

/* compile_ahead: the call that makes bucket (16, 32] hot traces bucket
 * (32, 64] too and queues its compile after its own; the first call of
 * that bucket is then served fused. Off: that first call runs eagerly. */
static void neighbouring_bucket_compiled_ahead(void **state) {
    (void)state;
    for (int ahead = 1; ahead >= 0; ahead--) {
        sj_runtime_config cfg = config();
        cfg.compile_ahead = ahead;
        sj_runtime *rt = open_runtime(&cfg);
        sj_fn *fn = function(rt, "buckets", SJ_DYNAMIC_AUTO);
        assert_int_equal(sj_set_buckets_pow2(fn, 0, 0, 16, 512), SJ_OK);
        call(fn, 20); /* hot at once (hot_threshold 1) */
        if (ahead) check_event(SJ_EVENT_RECOMPILE, 0, NULL, 1, "[64]");
        else assert_null(nth(SJ_EVENT_RECOMPILE, 0));
        drain(rt);
        assert_int_equal(count(SJ_EVENT_COMPILE_FINISHED), ahead ? 2 : 1);
        check_event(SJ_EVENT_COMPILE_STARTED, 0, NULL, 0, NULL); /* the hot one first */
        sj_stats a, b;
        sj_fn_stats(fn, &a);
        call(fn, 40); /* bucket (32, 64]'s first call */
        sj_fn_stats(fn, &b);
        assert_int_equal(b.eager_calls - a.eager_calls, ahead ? 0 : 1);
        assert_int_equal(b.traces, ahead ? 3 : 2); /* ahead: (32, 64] hot in turn traces (64, 128] */
        sj_runtime_destroy(rt);
    }
}

/* -- Validation, demotion, recompiles ------------------------------------------------------- */

static void validation_rejected(void **state) {
    (void)state;
    sj_runtime_config cfg = config();
    cfg.validate_calls = 2;
    sj_runtime *rt = open_runtime(&cfg);
    sj_runtime_test_wrong_kernels(rt, 1.0f);
    sj_fn *fn = function(rt, "wrong", SJ_DYNAMIC_AUTO);
    call(fn, 24);
    drain(rt);
    call(fn, 24); /* validated: differs; the caller gets eager's result */
    const rec *v = check_event(SJ_EVENT_VALIDATION_REJECTED, 0, "wrong", 0, NULL);
    assert_true(strlen(v->error) > 0);
    assert_int_equal(v->topic, SJ_LOG_WARN);
    call(fn, 24);
    assert_int_equal(count(SJ_EVENT_VALIDATION_REJECTED), 1);
    sj_runtime_destroy(rt);
}

static void specialization_demoted(void **state) {
    (void)state;
    /* what one specialization holds, from its FINISHED event */
    sj_runtime_config cfg = config();
    sj_runtime *rt = open_runtime(&cfg);
    sj_fn *fn = function(rt, "measure", SJ_DYNAMIC_SYMBOLIC);
    call(fn, 24);
    drain(rt);
    call(fn, 24);
    call(fn, 24);
    drain(rt);
    int64_t one = check_event(SJ_EVENT_COMPILE_FINISHED, 1, NULL, -1, NULL)->bytes;
    sj_runtime_destroy(rt);

    cfg.specialize_max_bytes = (uint64_t)(one * 3 / 2);
    rt = open_runtime(&cfg);
    fn = function(rt, "budgeted", SJ_DYNAMIC_SYMBOLIC);
    call(fn, 24);
    drain(rt);
    for (int k = 0; k < 3; k++) call(fn, 24);
    drain(rt);
    atomic_fetch_add(&now_ns, 250 * MS);
    for (int k = 0; k < 3; k++) call(fn, 40);
    drain(rt); /* 40 in, 24 out */
    const rec *d = check_event(SJ_EVENT_DEMOTED, 0, "budgeted", 0, "s0=24");
    assert_int_equal(count(SJ_EVENT_DEMOTED), 1);
    assert_true(d->bytes >= one * 9 / 10 && d->bytes <= one * 11 / 10);
    assert_int_equal(d->count, 1);
    assert_true(d->ms >= 250); /* uncalled since before the clock moved */
    call(fn, 24);
    call(fn, 40);
    sj_runtime_destroy(rt);
}

static void recompile(void **state) {
    (void)state;
    sj_runtime_config cfg = config();
    cfg.compile_mode = SJ_COMPILE_OFF;
    sj_runtime *rt = open_runtime(&cfg);
    sj_fn *fn = function(rt, "grow", SJ_DYNAMIC_AUTO);
    call(fn, 24);
    assert_int_equal(count(SJ_EVENT_RECOMPILE), 0); /* a first trace is no recompile */
    call(fn, 40);
    const rec *r = check_event(SJ_EVENT_RECOMPILE, 0, NULL, 1, "[40]");
    assert_non_null(strstr(r->error, "entry 0: "));
    assert_int_equal(r->count, 2);
    assert_int_equal(r->topic, SJ_LOG_RECOMPILES);
    call(fn, 56); /* the symbolic entry serves it: no new event */
    assert_int_equal(count(SJ_EVENT_RECOMPILE), 1);
    sj_runtime_destroy(rt);
}

/* GRAPH_CAPTURED, on a GPU: a static shape's fused calls with the same
 * buffers are captured into a CUDA graph by a compile worker (after 48
 * such calls). Without a device: "skipped: no CUDA device". */
static void graph_captured_on_device(void **state) {
    (void)state;
    reset();
    sj_runtime_config cfg = config();
    cfg.backend = SJ_BACKEND_CUDA;
    cfg.compile_mode = SJ_COMPILE_SYNC;
    sj_runtime *rt = NULL;
    if (sj_runtime_create(&cfg, &rt) != SJ_OK) {
        printf("skipped: no CUDA device (%s)\n", sj_last_error());
        return;
    }
    sj_fn *fn = function(rt, "graphs", SJ_DYNAMIC_STATIC);
    enum { N = 256 };
    float hx[N], hy[N];
    for (int i = 0; i < N; i++) hx[i] = (float)(rand() % 2000 - 1000) / 64.0f;
    sj_tensor host_x = sj_tensor_make(hx, SJ_F32, 1, (int64_t[]){N}), host_y = sj_tensor_make(hy, SJ_F32, 1, (int64_t[]){N});
    sj_tensor x = sj_tensor_make(NULL, SJ_F32, 1, (int64_t[]){N}), y = sj_tensor_make(NULL, SJ_F32, 1, (int64_t[]){N});
    x.device = y.device = SJ_CUDA;
    assert_int_equal(sj_tensor_alloc(rt, &x), SJ_OK);
    assert_int_equal(sj_tensor_alloc(rt, &y), SJ_OK);
    assert_int_equal(sj_tensor_copy(rt, &x, &host_x), SJ_OK);
    for (int i = 0; i < 60; i++) assert_int_equal(sj_call(fn, &x, 1, &y, 1), SJ_OK);
    assert_int_equal(sj_fn_wait_idle(fn, -1), SJ_OK);
    assert_int_equal(sj_call(fn, &x, 1, &y, 1), SJ_OK);
    assert_int_equal(sj_tensor_copy(rt, &host_y, &y), SJ_OK);
    for (int i = 0; i < N; i++) assert_float_equal(hy[i], (double)hx[i] * 2.0 + 1.0, 1e-5);
    sj_stats s;
    sj_fn_stats(fn, &s);
    assert_true(s.graphs >= 1);
    const rec *g = check_event(SJ_EVENT_GRAPH_CAPTURED, 0, "graphs", 0, ""); /* static entry: no symbols */
    assert_int_equal(count(SJ_EVENT_GRAPH_CAPTURED), (int)s.graphs);
    assert_int_equal(g->count, 1);     /* the shape's first graph */
    assert_true(g->ms > 0);
    assert_int_equal(g->topic, SJ_LOG_PERF);
    sj_tensor_free(rt, &x);
    sj_tensor_free(rt, &y);
    sj_runtime_destroy(rt);
}

static void names_and_no_callback(void **state) {
    (void)state;
    assert_string_equal(sj_event_name(SJ_EVENT_COMPILE_STARTED), "compile_started");
    assert_string_equal(sj_event_name(SJ_EVENT_DEMOTED), "specialization_demoted");
    assert_string_equal(sj_event_name(SJ_EVENT_GRAPH_CAPTURED), "graph_captured");
    assert_string_equal(sj_event_name(SJ_EVENT_COUNT), "?");
    sj_runtime_config cfg = config();
    cfg.event_fn = NULL;
    sj_runtime *rt = open_runtime(&cfg);
    sj_fn *fn = function(rt, "quiet", SJ_DYNAMIC_AUTO);
    call(fn, 24);
    drain(rt);
    call(fn, 24);
    assert_int_equal(n_ev, 0);
    assert_int_equal(n_ready_lines, 1);
    sj_runtime_destroy(rt);
}

int main(void) {
    srand(5);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(compile_started_and_finished), cmocka_unit_test(compile_failed_then_blacklisted),
        cmocka_unit_test(compile_dropped_when_cold),    cmocka_unit_test(shape_no_longer_seen_is_dropped),
        cmocka_unit_test(neighbouring_bucket_compiled_ahead), cmocka_unit_test(validation_rejected),
        cmocka_unit_test(specialization_demoted),       cmocka_unit_test(recompile),
        cmocka_unit_test(graph_captured_on_device),     cmocka_unit_test(names_and_no_callback),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
