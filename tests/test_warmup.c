/* Warm-up and readiness (sj_fn_warmup, issue 28) on the CPU backend: after
 * a blocking warm-up over a bucket set, the first call of every warmed
 * shape is fused, with no compile and no trace during the calls, and its
 * results equal eager execution's and a float64 reference's on random
 * inputs; background warm-up with readiness polling, calls served
 * meanwhile, and the completion callback; the timeout; bad specs and
 * shapes that fail while the others are prepared; destroy while warming
 * returns promptly (a compiler that never ends is killed). Each test runs
 * under a 60 s alarm(): an unbounded wait kills the program. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "jit/compile.h"
#include "jit/runtime.h"
#include "jit/shapejit.h"
#include "tests/util.h"

#define ALARM_S 60
#define F 8 /* the feature axis */

static char dir[256];

/* -- The model: h = tanh(2x + 1) * m; outputs h and sum(h, -1) ------------------- */

static sj_status model(sj_tracer *t, const sj_val *in, int n, void *u) {
    (void)n, (void)u;
    if (sj_val_rank(t, in[0]) != 3) return sj_trace_fail(t, SJ_ESHAPE, "x must be [B, S, F]");
    sj_val h = sj_mul(t, sj_tanh(t, sj_add(t, sj_mul(t, in[0], sj_scalar(t, 2.0)), sj_scalar(t, 1.0))), in[1]);
    sj_output(t, h);
    return sj_output(t, sj_sum(t, h, -1, 0));
}

/* The same, refusing sequences longer than 100. */
static sj_status model_short(sj_tracer *t, const sj_val *in, int n, void *u) {
    if (sj_val_rank(t, in[0]) == 3 && sj_size(t, in[0], 1) > 100)
        return sj_trace_fail(t, SJ_ESHAPE, "sequences of at most 100, not %lld", (long long)sj_size(t, in[0], 1));
    return model(t, in, n, u);
}

static sj_runtime *runtime(sj_compile_mode mode, const char *cc) {
    sj_runtime_config cfg = tu_cpu_config();
    cfg.compile_mode = mode;
    cfg.cc = cc;
    sj_runtime *rt = NULL;
    if (sj_runtime_create(&cfg, &rt)) fail_msg("runtime: %s", sj_last_error());
    return rt;
}

static sj_fn *make_fn(sj_runtime *rt, sj_model_fn m) {
    sj_fn *fn = NULL;
    sj_fn_options o;
    sj_fn_options_init(&o);
    o.input_names = (const char *const[]){"x", "m"};
    assert_int_equal(sj_fn_create(rt, "warm", 2, m, NULL, &o, &fn), SJ_OK);
    return fn;
}

/* Buckets: B in (0,2], (2,4], (4,inf); S in (0,16], (16,32], (32,64], (64,inf). */
static void set_buckets(sj_fn *fn) {
    assert_int_equal(sj_set_buckets(fn, 0, 0, (const int64_t[]){2, 4}, 2), SJ_OK);
    assert_int_equal(sj_set_buckets_pow2(fn, 0, 1, 16, 64), SJ_OK);
}

/* Two descriptors of shape (B, S) with data NULL: the runtime makes them. */
static void shape_of(int64_t B, int64_t S, sj_tensor *two) {
    two[0] = sj_tensor_make(NULL, SJ_F32, 3, (int64_t[]){B, S, F});
    two[1] = sj_tensor_make(NULL, SJ_F32, 3, (int64_t[]){B, S, 1});
}

static sj_stats stats(const sj_fn *fn) {
    sj_stats s;
    sj_fn_stats(fn, &s);
    return s;
}

/* One call of fn at (B, S) on random inputs, checked against float64 and,
 * when ref is not NULL, against the same model run eagerly there. */
static void call_checked(sj_fn *fn, sj_fn *ref, int64_t B, int64_t S) {
    sj_tensor in[2] = {tu_tensor(SJ_F32, 3, (int64_t[]){B, S, F}), tu_tensor(SJ_F32, 3, (int64_t[]){B, S, 1})};
    tu_fill_range(&in[0], -2, 2);
    for (int64_t i = 0; i < B * S; i++) tu_set(&in[1], i, (double)(i % 3 != 0)); /* a 0/1 mask */
    sj_tensor out[2] = {tu_tensor(SJ_F32, 3, (int64_t[]){B, S, F}), tu_tensor(SJ_F32, 2, (int64_t[]){B, S})};
    if (sj_call(fn, in, 2, out, 2)) fail_msg("call (%lld, %lld): %s", (long long)B, (long long)S, sj_last_error());
    double *h = tu_refbuf(0, B * S * F), *sum = tu_refbuf(1, B * S);
    for (int64_t r = 0; r < B * S; r++) {
        sum[r] = 0;
        for (int f = 0; f < F; f++) {
            double v = tanh(2.0 * tu_get(&in[0], r * F + f) + 1.0) * tu_get(&in[1], r);
            h[r * F + f] = v;
            sum[r] += v;
        }
    }
    const char *what = tu_label("warm (%lld, %lld)", (long long)B, (long long)S);
    assert_true(tu_check(&out[0], h, 1e-5, what));
    assert_true(tu_check(&out[1], sum, 1e-5, what));
    if (!ref) return;
    sj_tensor eo[2] = {tu_tensor(SJ_F32, 3, (int64_t[]){B, S, F}), tu_tensor(SJ_F32, 2, (int64_t[]){B, S})};
    assert_int_equal(sj_call(ref, in, 2, eo, 2), SJ_OK);
    for (int k = 0; k < 2; k++) {
        double *e = tu_refbuf(0, tu_numel(&eo[k]));
        for (int64_t i = 0; i < tu_numel(&eo[k]); i++) e[i] = tu_get(&eo[k], i);
        assert_true(tu_check(&out[k], e, 1e-6, tu_label("%s vs eager, output %d", what, k)));
    }
}

/* -- A blocking walk of the buckets ------------------------------------------------- */

static void blocking_walk_then_fused(void **state) {
    (void)state;
    tu_seed(28);
    sj_runtime *rt = runtime(SJ_COMPILE_ASYNC, NULL), *off = runtime(SJ_COMPILE_OFF, NULL);
    sj_fn *fn = make_fn(rt, model), *ref = make_fn(off, model);
    set_buckets(fn);
    assert_int_equal(sj_fn_ready(fn), 0); /* never warmed: not ready */
    sj_warmup_status ws;
    sj_fn_warmup_status(fn, &ws);
    assert_int_equal(ws.state, SJ_WARM_NONE);

    sj_tensor tpl[2];
    shape_of(2, 16, tpl);
    sj_warmup_spec spec = {.walk = tpl};
    if (sj_fn_warmup(fn, &spec, 0)) fail_msg("warm-up: %s", sj_last_error());
    assert_int_equal(sj_fn_ready(fn), 1);
    sj_fn_warmup_status(fn, &ws);
    assert_int_equal(ws.state, SJ_WARM_DONE);
    assert_int_equal(ws.total, 6); /* B edges {2, 4} x S edges {16, 32, 64}; the template is (2, 16) */
    assert_int_equal(ws.prepared, 6);
    assert_int_equal(ws.failed, 0);
    assert_int_equal(ws.first_failed, -1);
    for (int i = 0; i < ws.total; i++) {
        sj_warmup_shape_info si;
        assert_int_equal(sj_fn_warmup_shape(fn, i, &si), SJ_OK);
        assert_int_equal(si.state, SJ_WARM_DONE);
        assert_true(si.walked);
        assert_true(si.entry >= 0);
        if (strncmp(si.tier, "fused", 5)) fail_msg("shape %d (%s) ran %s", i, si.shape, si.tier);
    }
    sj_warmup_shape_info si;
    assert_int_equal(sj_fn_warmup_shape(fn, 5, &si), SJ_OK);
    assert_string_equal(si.shape, "[4, 64, 8], [4, 64, 1]"); /* the odometer's last: mask sizes follow */
    assert_int_equal(sj_fn_warmup_shape(fn, 6, &si), SJ_EINVAL);

    sj_stats s0 = stats(fn);
    assert_int_equal(s0.calls, 0); /* warm-up runs are not calls */
    assert_int_equal(s0.memo_hits + s0.guard_evals, 0);
    assert_int_equal(s0.warmup_runs, 6);
    assert_int_equal(s0.warmup_shapes, 6);
    assert_int_equal(s0.warmup_failures, 0);
    assert_int_equal(s0.entries, 6);
    assert_int_equal(s0.compiles, 6);

    /* every warmed shape and a size inside each bucket: fused on its first
     * call, with no compile and no trace */
    const int64_t Bs[] = {2, 4, 3}, Ss[] = {16, 32, 64, 20, 50};
    int n = 0;
    for (int b = 0; b < 3; b++)
        for (int k = 0; k < 5; k++, n++) call_checked(fn, ref, Bs[b], Ss[k]);
    sj_stats s1 = stats(fn);
    assert_int_equal(s1.calls, n);
    assert_int_equal(s1.eager_calls, 0);
    assert_int_equal(s1.fused_symbolic_calls + s1.fused_specialized_calls, n);
    assert_int_equal(s1.compiles, s0.compiles);
    assert_int_equal(s1.traces, s0.traces);
    assert_int_equal(s1.warmup_runs, 6);

    /* a second warm-up of the same shapes traces and compiles nothing */
    assert_int_equal(sj_fn_warmup(fn, &spec, 0), SJ_OK);
    sj_stats s2 = stats(fn);
    assert_int_equal(s2.traces, s1.traces);
    assert_int_equal(s2.compiles, s1.compiles);
    assert_int_equal(s2.warmup_runs, 12);

    /* explain tells of it */
    char *text = tu_explain(fn);
    assert_non_null(strstr(text, "warm-up: done, 6 of 6 shapes prepared, 0 failed"));
    free(text);
    sj_runtime_destroy(rt);
    sj_runtime_destroy(off);
    tu_free_all();
}

/* compile_mode SYNC: the warm-up thread compiles; OFF: nothing compiled,
 * the shapes run eagerly and are prepared all the same. NO_RUN: traced and
 * compiled, not run. */
static void compile_modes(void **state) {
    (void)state;
    tu_seed(5);
    for (int mode = SJ_COMPILE_ASYNC; mode <= SJ_COMPILE_OFF; mode++) {
        sj_runtime *rt = runtime((sj_compile_mode)mode, NULL);
        sj_fn *fn = make_fn(rt, model);
        set_buckets(fn);
        sj_tensor shapes[4];
        shape_of(3, 24, shapes);
        shape_of(1, 40, shapes + 2); /* B = 1: its own entry */
        sj_warmup_spec spec = {.n_shapes = 2, .shapes = shapes};
        unsigned flags = mode == SJ_COMPILE_ASYNC ? SJ_WARMUP_NO_RUN : 0;
        if (sj_fn_warmup(fn, &spec, flags)) fail_msg("mode %d: %s", mode, sj_last_error());
        sj_stats s = stats(fn);
        assert_int_equal(s.warmup_shapes, 2);
        assert_int_equal(s.warmup_runs, mode == SJ_COMPILE_ASYNC ? 0 : 2);
        assert_int_equal(s.compiles, mode == SJ_COMPILE_OFF ? 0 : 2);
        sj_warmup_shape_info si;
        assert_int_equal(sj_fn_warmup_shape(fn, 1, &si), SJ_OK);
        assert_string_equal(si.tier, mode == SJ_COMPILE_ASYNC ? "" : mode == SJ_COMPILE_OFF ? "eager" : "fused symbolic");
        call_checked(fn, NULL, 3, 24);
        call_checked(fn, NULL, 1, 40);
        s = stats(fn);
        assert_int_equal(s.eager_calls, mode == SJ_COMPILE_OFF ? 2 : 0);
        assert_int_equal(s.compiles, mode == SJ_COMPILE_OFF ? 0 : 2);
        sj_runtime_destroy(rt);
    }
    tu_free_all();
}

/* x [B, S, 8] * w [8]: the feature axis is tied to the weight. */
static float weight8[8] = {1, 2, 3, 4, 5, 6, 7, 8};
static sj_status model_weight(sj_tracer *t, const sj_val *in, int n, void *u) {
    (void)n, (void)u;
    sj_tensor w = sj_tensor_make(weight8, SJ_F32, 1, (int64_t[]){8});
    return sj_output(t, sj_mul(t, in[0], sj_param(t, &w)));
}

/* A walk leaves a size the template's trace pinned alone, though it equals
 * the walked one (the feature axis 8 = the template's sequence 8). */
static void walk_keeps_pinned_sizes(void **state) {
    (void)state;
    sj_runtime *rt = runtime(SJ_COMPILE_OFF, NULL);
    sj_fn *fn = NULL;
    assert_int_equal(sj_fn_create(rt, "pinned", 1, model_weight, NULL, NULL, &fn), SJ_OK);
    assert_int_equal(sj_set_buckets_pow2(fn, 0, 1, 8, 32), SJ_OK);
    sj_tensor tpl = sj_tensor_make(NULL, SJ_F32, 3, (int64_t[]){3, 8, 8});
    if (sj_fn_warmup(fn, &(sj_warmup_spec){.walk = &tpl}, 0)) fail_msg("warm-up: %s", sj_last_error());
    sj_warmup_status ws;
    sj_fn_warmup_status(fn, &ws);
    assert_int_equal(ws.total, 3);
    assert_int_equal(ws.prepared, 3);
    sj_warmup_shape_info si;
    assert_int_equal(sj_fn_warmup_shape(fn, 2, &si), SJ_OK);
    assert_string_equal(si.shape, "[3, 32, 8]");
    sj_runtime_destroy(rt);
}

/* The validated swap (validate_calls) during a warm-up: its runs make the
 * new kernels' first checks, so the first calls are fused; kernels made
 * wrong on purpose are rejected by the warm-up, the shapes reported, and
 * calls still get right results (eagerly). */
static void validated_during_warmup(void **state) {
    (void)state;
    tu_seed(30);
    for (int wrong = 0; wrong < 2; wrong++) {
        sj_runtime_config cfg = tu_cpu_config();
        cfg.validate_calls = 2;
        sj_runtime *rt = NULL;
        assert_int_equal(sj_runtime_create(&cfg, &rt), SJ_OK);
        if (wrong) sj_runtime_test_wrong_kernels(rt, 0.25f);
        sj_fn *fn = make_fn(rt, model);
        set_buckets(fn);
        sj_tensor shapes[4];
        shape_of(3, 24, shapes);
        shape_of(2, 40, shapes + 2);
        sj_warmup_spec spec = {.n_shapes = 2, .shapes = shapes};
        sj_status st = sj_fn_warmup(fn, &spec, 0);
        sj_stats s = stats(fn);
        assert_int_equal(s.validations, wrong ? 2 : 4); /* two units, two checks each (a wrong one: its first) */
        if (wrong) {
            assert_int_equal(st, SJ_EBACKEND);
            assert_non_null(strstr(sj_last_error(), "differ from eager execution"));
            assert_int_equal(s.validation_failures, 2);
            assert_int_equal(s.warmup_failures, 2);
        } else {
            if (st) fail_msg("warm-up: %s", sj_last_error());
            assert_int_equal(s.validation_failures, 0);
            assert_int_equal(s.warmup_runs, 6); /* per shape: 2 validations, then the run a call gets */
            sj_warmup_shape_info si;
            assert_int_equal(sj_fn_warmup_shape(fn, 0, &si), SJ_OK);
            assert_string_equal(si.tier, "fused symbolic");
        }
        call_checked(fn, NULL, 3, 24);
        call_checked(fn, NULL, 2, 40);
        call_checked(fn, NULL, 4, 30);
        sj_stats s2 = stats(fn);
        assert_int_equal(s2.eager_calls, wrong ? 3 : 0);
        assert_int_equal(s2.validations, s.validations); /* nothing left to check on the calls */
        sj_runtime_destroy(rt);
    }
    tu_free_all();
}

/* compile_threads 0 (the program steps background work): a blocking
 * warm-up runs its queued compiles on its own thread, and ends. */
static void no_compile_workers(void **state) {
    (void)state;
    sj_runtime_config cfg = tu_cpu_config();
    cfg.compile_threads = 0;
    sj_runtime *rt = NULL;
    assert_int_equal(sj_runtime_create(&cfg, &rt), SJ_OK);
    sj_fn *fn = make_fn(rt, model);
    sj_tensor two[2];
    shape_of(2, 16, two);
    assert_int_equal(sj_fn_warmup(fn, &(sj_warmup_spec){.n_shapes = 1, .shapes = two}, 0), SJ_OK);
    sj_stats s = stats(fn);
    assert_int_equal(s.compiles, 1);
    assert_int_equal(s.warmup_shapes, 1);
    sj_runtime_destroy(rt);
}

/* A warm-up's queued compiles are not dropped as cold, though no call
 * comes while they wait (a call's are, after the cold time with no call). */
static void warm_jobs_never_cold(void **state) {
    (void)state;
    sj_runtime *rt = runtime(SJ_COMPILE_ASYNC, NULL);
    sj_runtime_test_hooks(rt, 50, 0);
    sj_compiler_set_cold_ms(rt->compiler, 1);
    sj_fn *fn = make_fn(rt, model);
    set_buckets(fn);
    sj_tensor tpl[2];
    shape_of(2, 16, tpl);
    sj_warmup_spec spec = {.walk = tpl};
    if (sj_fn_warmup(fn, &spec, 0)) fail_msg("warm-up: %s", sj_last_error());
    sj_stats s = stats(fn);
    assert_int_equal(s.compiles_dropped, 0);
    assert_int_equal(s.compiles, 6);
    assert_int_equal(s.warmup_shapes, 6);
    sj_runtime_destroy(rt);
}

/* -- Background: polling, the callback, calls meanwhile ------------------------------- */

typedef struct done_rec {
    pthread_mutex_t lock;
    int calls;
    sj_warm_state state;
    int prepared, total, ready_seen;
    pthread_t thread;
} done_rec;

static void on_done(void *user, sj_fn *fn, const sj_warmup_status *st) {
    done_rec *d = user;
    pthread_mutex_lock(&d->lock);
    d->calls++;
    d->state = st->state;
    d->prepared = st->prepared;
    d->total = st->total;
    d->thread = pthread_self();
    if (st->state == SJ_WARM_DONE) d->ready_seen = sj_fn_ready(fn); /* a read the callback may make */
    pthread_mutex_unlock(&d->lock);
}

typedef struct caller {
    sj_fn *fn;
    _Atomic int stop, calls, bad;
} caller;

/* Calls at shape (4, 32) until told to stop, checking one element. */
static void *call_loop(void *arg) {
    caller *c = arg;
    enum { B = 4, S = 32 };
    static float x[B * S * F], m[B * S], h[B * S * F], sum[B * S];
    for (int i = 0; i < B * S * F; i++) x[i] = (float)(i % 7) * 0.1f;
    for (int i = 0; i < B * S; i++) m[i] = 1;
    sj_tensor in[2] = {sj_tensor_make(x, SJ_F32, 3, (int64_t[]){B, S, F}), sj_tensor_make(m, SJ_F32, 3, (int64_t[]){B, S, 1})};
    sj_tensor out[2] = {sj_tensor_make(h, SJ_F32, 3, (int64_t[]){B, S, F}), sj_tensor_make(sum, SJ_F32, 2, (int64_t[]){B, S})};
    while (!atomic_load(&c->stop)) {
        if (sj_call(c->fn, in, 2, out, 2) || fabs(h[5] - tanh(2.0 * x[5] + 1.0)) > 1e-5) atomic_fetch_add(&c->bad, 1);
        atomic_fetch_add(&c->calls, 1);
    }
    return NULL;
}

static void background_with_callback(void **state) {
    (void)state;
    sj_runtime *rt = runtime(SJ_COMPILE_ASYNC, NULL);
    sj_runtime_test_hooks(rt, 150, 0); /* every compile sleeps 150 ms first */
    sj_fn *fn = make_fn(rt, model);
    set_buckets(fn);
    done_rec d = {.lock = PTHREAD_MUTEX_INITIALIZER};
    sj_tensor tpl[2];
    shape_of(2, 16, tpl);
    sj_warmup_spec spec = {.walk = tpl, .walk_max = 32, .on_done = on_done, .on_done_user = &d};
    caller c = {.fn = fn};
    pthread_t th;
    assert_int_equal(sj_fn_warmup(fn, &spec, SJ_WARMUP_BACKGROUND), SJ_OK);
    assert_int_equal(pthread_create(&th, NULL, call_loop, &c), 0);
    /* traced on return, the compiles (6 x 150 ms at least) still to come */
    sj_warmup_status ws;
    sj_fn_warmup_status(fn, &ws);
    assert_int_equal(ws.total, 4); /* B {2, 4} x S {16, 32} */
    assert_int_equal(ws.state, SJ_WARM_RUNNING);
    assert_int_equal(sj_fn_ready(fn), 0);
    int polls = 0, last = -1;
    while (!sj_fn_ready(fn)) {
        sj_fn_warmup_status(fn, &ws);
        assert_true(ws.prepared >= last); /* progress only goes forward */
        assert_true(ws.prepared <= ws.total);
        last = ws.prepared;
        polls++;
        usleep(5000);
    }
    assert_true(polls > 1);
    assert_int_equal(sj_fn_wait_idle(fn, -1), SJ_OK); /* the callback has returned */
    atomic_store(&c.stop, 1);
    pthread_join(th, NULL);
    pthread_mutex_lock(&d.lock);
    assert_int_equal(d.calls, 1);
    assert_int_equal(d.state, SJ_WARM_DONE);
    assert_int_equal(d.prepared, 4);
    assert_int_equal(d.total, 4);
    assert_int_equal(d.ready_seen, 1);
    assert_false(pthread_equal(d.thread, pthread_self())); /* a library thread */
    pthread_mutex_unlock(&d.lock);
    /* calls meanwhile were served, correctly, eagerly until their code came */
    assert_int_equal(atomic_load(&c.bad), 0);
    sj_stats s = stats(fn);
    assert_int_equal(s.calls, (uint64_t)atomic_load(&c.calls));
    assert_int_equal(s.warmup_shapes, 4);
    call_checked(fn, NULL, 2, 16);
    call_checked(fn, NULL, 4, 30);
    sj_stats s2 = stats(fn);
    assert_int_equal(s2.compiles, s.compiles);
    assert_int_equal(s2.eager_calls, s.eager_calls);
    assert_int_equal(s2.fused_symbolic_calls + s2.fused_specialized_calls,
                     s.fused_symbolic_calls + s.fused_specialized_calls + 2);
    sj_runtime_destroy(rt);
    tu_free_all();
}

static void blocking_timeout(void **state) {
    (void)state;
    sj_runtime *rt = runtime(SJ_COMPILE_ASYNC, NULL);
    sj_runtime_test_hooks(rt, 400, 0);
    sj_fn *fn = make_fn(rt, model);
    set_buckets(fn);
    sj_tensor shapes[4];
    shape_of(2, 16, shapes);
    shape_of(4, 64, shapes + 2);
    sj_warmup_spec spec = {.n_shapes = 2, .shapes = shapes, .timeout_ms = 50};
    assert_int_equal(sj_fn_warmup(fn, &spec, 0), SJ_ETIMEOUT);
    assert_non_null(strstr(sj_last_error(), "goes on in the background"));
    assert_int_equal(sj_fn_ready(fn), 0);
    assert_int_equal(sj_fn_wait_idle(fn, 10), SJ_ETIMEOUT);
    assert_int_equal(sj_fn_wait_idle(fn, -1), SJ_OK);
    assert_int_equal(sj_fn_ready(fn), 1);
    sj_warmup_status ws;
    sj_fn_warmup_status(fn, &ws);
    assert_int_equal(ws.prepared, 2);
    assert_true(ws.elapsed_ms >= 400);
    sj_runtime_destroy(rt);
}

/* -- Bad specs, and shapes that fail among good ones --------------------------------- */

static void bad_specs(void **state) {
    (void)state;
    sj_runtime_config cfg = tu_cpu_config();
    cfg.compile_mode = SJ_COMPILE_OFF;
    cfg.warmup_max_shapes = 5;
    sj_runtime *rt = NULL;
    assert_int_equal(sj_runtime_create(&cfg, &rt), SJ_OK);
    sj_fn *fn = make_fn(rt, model);
    sj_tensor two[2];
    shape_of(2, 16, two);
    sj_warmup_spec ok = {.n_shapes = 1, .shapes = two};
    struct {
        sj_warmup_spec spec;
        unsigned flags;
        const char *msg;
    } cases[] = {
        {{.n_shapes = -1, .shapes = two}, 0, "n_shapes -1 is negative"},
        {{.n_shapes = 1}, 0, "1 shapes and shapes is NULL"},
        {{0}, 0, "nothing to warm"},
        {ok, 1u << 7, "unknown flags 0x80"},
        {{.n_shapes = 1, .shapes = two, .timeout_ms = -1}, 0, "timeout_ms -1 is negative"},
        {{.n_shapes = 1, .shapes = two, .outputs = two, .n_outputs = 65}, 0, "n_outputs 65 out of range"},
        {{.walk = two}, 0, "has no bucketed axis"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        assert_int_equal(sj_fn_warmup(fn, &cases[i].spec, cases[i].flags), SJ_EINVAL);
        if (!strstr(sj_last_error(), cases[i].msg)) fail_msg("case %zu: '%s'", i, sj_last_error());
    }
    assert_int_equal(sj_fn_warmup(NULL, &ok, 0), SJ_EINVAL);
    assert_int_equal(sj_fn_warmup(fn, NULL, 0), SJ_EINVAL);
    /* descriptors: rank, dtype, size, device, named */
    sj_tensor bad[2];
    shape_of(2, 16, bad);
    bad[1].rank = 9;
    assert_int_equal(sj_fn_warmup(fn, &(sj_warmup_spec){.n_shapes = 1, .shapes = bad}, 0), SJ_EINVAL);
    assert_non_null(strstr(sj_last_error(), "shape 0, input 'm'"));
    shape_of(2, 16, bad);
    bad[0].dtype = (sj_dtype)42;
    assert_int_equal(sj_fn_warmup(fn, &(sj_warmup_spec){.n_shapes = 1, .shapes = bad}, 0), SJ_EINVAL);
    assert_non_null(strstr(sj_last_error(), "shape 0, input 'x'"));
    shape_of(2, -3, bad);
    assert_int_equal(sj_fn_warmup(fn, &(sj_warmup_spec){.n_shapes = 1, .shapes = bad}, 0), SJ_EINVAL);
    float buf[64];
    shape_of(1, 1, bad);
    bad[0].data = buf;
    bad[0].device = SJ_CUDA;
    assert_int_equal(sj_fn_warmup(fn, &(sj_warmup_spec){.n_shapes = 1, .shapes = bad}, 0), SJ_EINVAL);
    assert_non_null(strstr(sj_last_error(), "device memory"));
    /* walks: a template size 1 on a bucketed axis, multiples without a
     * bound, and more shapes than warmup_max_shapes (5): 2 x 3 edges */
    set_buckets(fn);
    shape_of(1, 16, bad);
    assert_int_equal(sj_fn_warmup(fn, &(sj_warmup_spec){.walk = bad}, 0), SJ_EINVAL);
    assert_non_null(strstr(sj_last_error(), "input 0 axis 0 is bucketed and has size 1"));
    assert_int_equal(sj_fn_warmup(fn, &(sj_warmup_spec){.walk = two}, 0), SJ_EINVAL);
    assert_non_null(strstr(sj_last_error(), "more than warmup_max_shapes (5"));
    assert_int_equal(sj_fn_warmup(fn, &(sj_warmup_spec){.walk = two, .walk_max = 16}, 0), SJ_OK); /* 2 x 1 */
    assert_int_equal(sj_set_buckets_multiple(fn, 0, 1, 8), SJ_OK);
    assert_int_equal(sj_fn_warmup(fn, &(sj_warmup_spec){.walk = two}, 0), SJ_EINVAL);
    assert_non_null(strstr(sj_last_error(), "unbounded buckets (multiples); set walk_max"));
    assert_int_equal(sj_fn_warmup(fn, &(sj_warmup_spec){.walk = two, .walk_max = 16}, 0), SJ_OK); /* {2, 4} x {8, 16} */
    sj_warmup_status ws;
    sj_fn_warmup_status(fn, &ws);
    assert_int_equal(ws.total, 4);
    assert_int_equal(ws.prepared, 4);
    /* nothing was started by a refused spec: no shape counted */
    assert_int_equal(stats(fn).warmup_failures, 0);
    sj_runtime_destroy(rt);
}

/* A warm-up already running refuses another; its own second call waits. */
static void one_at_a_time(void **state) {
    (void)state;
    sj_runtime *rt = runtime(SJ_COMPILE_ASYNC, NULL);
    sj_runtime_test_hooks(rt, 300, 0);
    sj_fn *fn = make_fn(rt, model);
    sj_tensor two[2];
    shape_of(2, 16, two);
    sj_warmup_spec spec = {.n_shapes = 1, .shapes = two};
    assert_int_equal(sj_fn_warmup(fn, &spec, SJ_WARMUP_BACKGROUND), SJ_OK);
    assert_int_equal(sj_fn_warmup(fn, &spec, 0), SJ_EINVAL);
    assert_non_null(strstr(sj_last_error(), "a warm-up is still running"));
    assert_int_equal(sj_fn_wait_idle(fn, -1), SJ_OK);
    assert_int_equal(sj_fn_warmup(fn, &spec, 0), SJ_OK);
    sj_runtime_destroy(rt);
}

static void failing_shapes(void **state) {
    (void)state;
    tu_seed(7);
    /* the model refuses one shape, a profile another: the rest are prepared */
    sj_runtime *rt = runtime(SJ_COMPILE_ASYNC, NULL);
    sj_fn *fn = make_fn(rt, model_short);
    assert_int_equal(sj_set_profile(fn, 0, 0, 2, 4, 8), SJ_OK);
    sj_tensor shapes[8];
    shape_of(4, 16, shapes);
    shape_of(4, 200, shapes + 2);
    shape_of(16, 16, shapes + 4); /* B 16: outside the profile [2, 8] */
    shape_of(8, 32, shapes + 6);
    sj_warmup_spec spec = {.n_shapes = 4, .shapes = shapes};
    assert_int_equal(sj_fn_warmup(fn, &spec, 0), SJ_ESHAPE);
    const char *e = sj_last_error();
    if (!strstr(e, "warm-up shape 1 of 4 ([4, 200, 8], [4, 200, 1])") || !strstr(e, "sequences of at most 100"))
        fail_msg("message: %s", e);
    assert_int_equal(sj_fn_ready(fn), 1); /* over, with failures */
    sj_warmup_status ws;
    sj_fn_warmup_status(fn, &ws);
    assert_int_equal(ws.prepared, 2);
    assert_int_equal(ws.failed, 2);
    assert_int_equal(ws.first_failed, 1);
    assert_int_equal(ws.first_status, SJ_ESHAPE);
    sj_warmup_shape_info si;
    assert_int_equal(sj_fn_warmup_shape(fn, 2, &si), SJ_OK);
    assert_int_equal(si.state, SJ_WARM_FAILED);
    assert_int_equal(si.status, SJ_ECONSTRAINT);
    assert_int_equal(si.entry, -1);
    assert_int_equal(sj_fn_warmup_shape(fn, 3, &si), SJ_OK);
    assert_int_equal(si.state, SJ_WARM_DONE);
    sj_stats s = stats(fn);
    assert_int_equal(s.warmup_failures, 2);
    assert_int_equal(s.warmup_shapes, 2);
    call_checked(fn, NULL, 3, 16); /* inside the profile's entry: fused, nothing compiled */
    assert_int_equal(stats(fn).eager_calls, 0);
    sj_runtime_destroy(rt);

    /* past a recompile limit that is an error: SJ_ELIMIT for that shape */
    rt = runtime(SJ_COMPILE_OFF, NULL);
    sj_fn_options o;
    sj_fn_options_init(&o);
    o.dynamic = SJ_DYNAMIC_STATIC;
    o.recompile_limit = 2;
    o.limit_is_error = 1;
    assert_int_equal(sj_fn_create(rt, "lim", 2, model, NULL, &o, &fn), SJ_OK);
    shape_of(2, 3, shapes);
    shape_of(2, 4, shapes + 2);
    shape_of(2, 5, shapes + 4);
    spec.n_shapes = 3;
    assert_int_equal(sj_fn_warmup(fn, &spec, 0), SJ_ELIMIT);
    assert_non_null(strstr(sj_last_error(), "warm-up shape 2 of 3"));
    sj_runtime_destroy(rt);

    /* a compile that fails: the shape is reported, and runs eagerly */
    rt = runtime(SJ_COMPILE_ASYNC, NULL);
    sj_runtime_test_hooks(rt, 0, 1);
    fn = make_fn(rt, model);
    spec.n_shapes = 1;
    assert_int_equal(sj_fn_warmup(fn, &spec, 0), SJ_EBACKEND);
    assert_non_null(strstr(sj_last_error(), "compile failed, its entry runs eagerly"));
    assert_int_equal(sj_fn_warmup_shape(fn, 0, &si), SJ_OK);
    assert_string_equal(si.tier, "eager");
    assert_int_equal(stats(fn).warmup_runs, 1);
    /* outputs given whose count is not the model's */
    sj_tensor outs[1] = {sj_tensor_make(NULL, SJ_F32, 3, (int64_t[]){2, 3, F})};
    spec.outputs = outs;
    spec.n_outputs = 1;
    assert_int_equal(sj_fn_warmup(fn, &spec, 0), SJ_EINVAL);
    assert_non_null(strstr(sj_last_error(), "1 outputs given, the model produces 2"));
    sj_runtime_destroy(rt);
    tu_free_all();
}

/* The caller's buffers: used as they are (outputs written). */
static void caller_buffers(void **state) {
    (void)state;
    sj_runtime *rt = runtime(SJ_COMPILE_SYNC, NULL);
    sj_fn *fn = make_fn(rt, model);
    enum { B = 2, S = 5 };
    float x[B * S * F], m[B * S], h[B * S * F], sum[B * S];
    for (int i = 0; i < B * S * F; i++) x[i] = 0.25f;
    for (int i = 0; i < B * S; i++) m[i] = 1, sum[i] = -1;
    sj_tensor in[2] = {sj_tensor_make(x, SJ_F32, 3, (int64_t[]){B, S, F}), sj_tensor_make(m, SJ_F32, 3, (int64_t[]){B, S, 1})};
    sj_tensor out[2] = {sj_tensor_make(h, SJ_F32, 3, (int64_t[]){B, S, F}), sj_tensor_make(sum, SJ_F32, 2, (int64_t[]){B, S})};
    sj_warmup_spec spec = {.n_shapes = 1, .shapes = in, .outputs = out, .n_outputs = 2};
    assert_int_equal(sj_fn_warmup(fn, &spec, 0), SJ_OK);
    for (int i = 0; i < B * S; i++) assert_float_equal(sum[i], F * tanh(1.5), 1e-5);
    sj_warmup_shape_info si;
    assert_int_equal(sj_fn_warmup_shape(fn, 0, &si), SJ_OK);
    assert_int_equal(si.graph, 0); /* no graphs on the CPU */
    assert_string_equal(si.tier, "fused specialized");
    sj_runtime_destroy(rt);
}

/* -- Destroy while warming ------------------------------------------------------------ */

/* A compiler that answers --version and then never ends (a child holds
 * the pipe): only a kill stops it. */
static const char *hang_cc(void) {
    static char p[512];
    snprintf(p, sizeof p, "%s/hang.sh", dir);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fprintf(f, "#!/bin/sh\ncase \"$1\" in --version) echo fake 1.0; exit 0;; esac\nsleep 1000\n");
    fclose(f);
    assert_int_equal(chmod(p, 0755), 0);
    return p;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void destroy_while_warming(void **state) {
    (void)state;
    for (int mode = SJ_COMPILE_ASYNC; mode <= SJ_COMPILE_SYNC; mode++)
        for (int rt_too = 0; rt_too < 2; rt_too++) {
            sj_runtime *rt = runtime((sj_compile_mode)mode, hang_cc());
            sj_fn *fn = make_fn(rt, model);
            set_buckets(fn);
            done_rec d = {.lock = PTHREAD_MUTEX_INITIALIZER};
            sj_tensor tpl[2];
            shape_of(2, 16, tpl);
            sj_warmup_spec spec = {.walk = tpl, .on_done = on_done, .on_done_user = &d};
            assert_int_equal(sj_fn_warmup(fn, &spec, SJ_WARMUP_BACKGROUND), SJ_OK);
            usleep(100000); /* the first compile is under way, and hangs */
            assert_int_equal(sj_fn_ready(fn), 0);
            double t0 = now_s();
            if (rt_too) sj_runtime_destroy(rt); /* destroys fn */
            else sj_fn_destroy(fn);
            double took = now_s() - t0;
            if (took > 5) fail_msg("mode %d: destroy took %.1f s", mode, took);
            pthread_mutex_lock(&d.lock);
            assert_int_equal(d.calls, 1);
            assert_int_equal(d.state, SJ_WARM_CANCELLED);
            pthread_mutex_unlock(&d.lock);
            if (!rt_too) sj_runtime_destroy(rt);
        }
}

/* -- Main --------------------------------------------------------------------------------- */

static int setup(void **state) {
    (void)state;
    alarm(ALARM_S);
    return 0;
}

static int teardown(void **state) {
    alarm(0);
    return tu_teardown(state);
}

int main(void) {
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/sj-warmup-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir)) return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(blocking_walk_then_fused, setup, teardown),
        cmocka_unit_test_setup_teardown(compile_modes, setup, teardown),
        cmocka_unit_test_setup_teardown(warm_jobs_never_cold, setup, teardown),
        cmocka_unit_test_setup_teardown(no_compile_workers, setup, teardown),
        cmocka_unit_test_setup_teardown(validated_during_warmup, setup, teardown),
        cmocka_unit_test_setup_teardown(walk_keeps_pinned_sizes, setup, teardown),
        cmocka_unit_test_setup_teardown(background_with_callback, setup, teardown),
        cmocka_unit_test_setup_teardown(blocking_timeout, setup, teardown),
        cmocka_unit_test_setup_teardown(bad_specs, setup, teardown),
        cmocka_unit_test_setup_teardown(one_at_a_time, setup, teardown),
        cmocka_unit_test_setup_teardown(failing_shapes, setup, teardown),
        cmocka_unit_test_setup_teardown(caller_buffers, setup, teardown),
        cmocka_unit_test_setup_teardown(destroy_while_warming, setup, teardown),
    };
    int r = cmocka_run_group_tests_name("warmup", tests, NULL, NULL);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd)) {
    }
    return r;
}
