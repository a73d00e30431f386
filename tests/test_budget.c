/* The memory budget of specializations (issue 30): specialized shapes of a
 * symbolic entry hold code and arenas; past cfg.specialize_max_bytes the
 * least recently called are demoted to the entry's symbolic kernels, freed
 * once no call runs them, and may be specialized again after a doubling
 * wait. Time is a virtual clock (cfg.clock_ns) and background compiles run
 * step by step on the test's thread (compile_threads 0), so the LRU order
 * and the waits are asserted exactly, with no sleeps; the threaded test
 * runs a real worker while calls go on. Every result is compared with an
 * eager-only runtime's and with a float64 reference, on random inputs. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/shard.h"
#include "jit/budget.h"
#include "jit/shapejit.h"
#include "tests/util.h"

#define MS INT64_C(1000000)
#define NMAX 256

static tu_clock clk = {1000 * MS}; /* the runtimes' virtual clock */
static void advance_ms(int64_t ms) { tu_clock_advance_ms(&clk, ms); }

static _Atomic int demote_lines;
static void count_lines(void *user, unsigned topic, const char *msg) {
    (void)user, (void)topic;
    if (strstr(msg, "demoted to the symbolic kernels")) atomic_fetch_add(&demote_lines, 1);
}

/* y = tanh(x * 2 + 1) - x / 4: a few kernels' worth of elementwise work */
static sj_status m_model(sj_tracer *t, const sj_val *in, int n, void *u) {
    (void)n, (void)u;
    sj_val a = sj_tanh(t, sj_add(t, sj_mul(t, in[0], sj_scalar(t, 2.0)), sj_scalar(t, 1.0)));
    return sj_output(t, sj_sub(t, a, sj_div(t, in[0], sj_scalar(t, 4.0))));
}

static sj_runtime *eager_rt;
static sj_fn *eager_fn;

static sj_runtime *runtime(uint64_t budget, int workers) {
    sj_runtime_config cfg = tu_cpu_config();
    cfg.log_mask = SJ_LOG_COMPILE;
    cfg.log_fn = count_lines;
    cfg.compile_mode = SJ_COMPILE_ASYNC;
    cfg.compile_threads = workers;
    cfg.hot_threshold = 1;
    cfg.specialize_threshold = 4;
    cfg.specialize_budget = 100;
    cfg.recompile_limit = 200;
    cfg.compile_retry_ms = 1000;
    tu_clock_use(&cfg, &clk);
    cfg.specialize_max_bytes = budget;
    sj_runtime *rt = NULL;
    assert_int_equal(sj_runtime_create(&cfg, &rt), SJ_OK);
    return rt;
}

static sj_fn *function(sj_runtime *rt) {
    sj_fn_options o;
    sj_fn_options_init(&o);
    o.dynamic = SJ_DYNAMIC_SYMBOLIC;
    sj_fn *fn = NULL;
    assert_int_equal(sj_fn_create(rt, "budget", 1, m_model, NULL, &o, &fn), SJ_OK);
    return fn;
}

/* One call of fn at size n on random floats, compared with the eager
 * runtime and float64; returns the tier that served it: 'e'ager,
 * 's'ymbolic or 'S'pecialized. */
static char call_checked(sj_fn *fn, int n) {
    float x[NMAX], y[NMAX], ye[NMAX];
    for (int i = 0; i < n; i++) x[i] = (float)(rand() % 4000 - 2000) / 512.0f, y[i] = ye[i] = NAN;
    sj_tensor in = sj_tensor_make(x, SJ_F32, 1, (int64_t[]){n});
    sj_tensor out = sj_tensor_make(y, SJ_F32, 1, (int64_t[]){n});
    sj_tensor oute = sj_tensor_make(ye, SJ_F32, 1, (int64_t[]){n});
    sj_stats a, b;
    sj_fn_stats(fn, &a);
    assert_int_equal(sj_call(fn, &in, 1, &out, 1), SJ_OK);
    sj_fn_stats(fn, &b);
    assert_int_equal(sj_call(eager_fn, &in, 1, &oute, 1), SJ_OK);
    for (int i = 0; i < n; i++) {
        double r = tanh((double)x[i] * 2.0 + 1.0) - (double)x[i] / 4.0;
        if (fabs((double)y[i] - r) > 1e-5 || fabs((double)y[i] - (double)ye[i]) > 1e-5)
            fail_msg("n=%d i=%d: %.9g, eager %.9g, float64 %.9g", n, i, (double)y[i], (double)ye[i], r);
    }
    if (b.fused_specialized_calls > a.fused_specialized_calls) return 'S';
    if (b.fused_symbolic_calls > a.fused_symbolic_calls) return 's';
    return 'e';
}

/* Make shape n hot (specialize_threshold calls, 10 ms apart) and run the
 * queued compiles. */
static void specialize(sj_runtime *rt, sj_fn *fn, int n) {
    for (int i = 0; i < 4; i++) {
        call_checked(fn, n);
        advance_ms(10);
    }
    while (sj_runtime_run_background(rt, 8) > 0) {
    }
}

static sj_stats stats(sj_fn *fn) {
    sj_stats s;
    sj_fn_stats(fn, &s);
    return s;
}

static int specialized(sj_fn *fn, int64_t *bytes, int *demoted) {
    sj_entry_info info[4];
    int n = sj_fn_entries(fn, info, 4), k = 0;
    *bytes = 0;
    *demoted = 0;
    for (int i = 0; i < n && i < 4; i++) {
        k += info[i].specialized_shapes;
        *bytes += info[i].specialized_bytes;
        *demoted += info[i].demoted_shapes;
    }
    return k;
}

/* What one specialization holds: measured under a budget too large to bite. */
static int64_t one_spec_bytes(void) {
    static int64_t bytes;
    if (bytes) return bytes;
    sj_runtime *rt = runtime(UINT64_C(1) << 40, 0);
    sj_fn *fn = function(rt);
    call_checked(fn, 24);
    while (sj_runtime_run_background(rt, 8) > 0) {
    }
    specialize(rt, fn, 24);
    assert_int_equal(call_checked(fn, 24), 'S');
    bytes = (int64_t)stats(fn).specialized_bytes;
    assert_true(bytes > 1000); /* a loaded shared object at least */
    sj_runtime_destroy(rt);
    return bytes;
}

static int setup(void **state) {
    (void)state;
    srand(11);
    sj_runtime_config cfg;
    sj_runtime_config_init(&cfg);
    cfg.backend = SJ_BACKEND_CPU;
    cfg.compile_mode = SJ_COMPILE_OFF;
    cfg.cache_dir = NULL;
    cfg.exec_threads = 1;
    cfg.recompile_limit = 200;
    assert_int_equal(sj_runtime_create(&cfg, &eager_rt), SJ_OK);
    eager_fn = function(eager_rt);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    sj_runtime_destroy(eager_rt);
    return 0;
}

/* -- LRU order, accounting, results ------------------------------------------------ */

/* Room for two: A and B specialized; A called again; C's specialization
 * demotes B (the least recently called), whose calls go back to the
 * symbolic kernels, right, while A and C stay specialized. */
static void lru_demotes_the_least_recently_called(void **state) {
    (void)state;
    int64_t one = one_spec_bytes(), budget = one * 5 / 2;
    sj_runtime *rt = runtime((uint64_t)budget, 0);
    sj_fn *fn = function(rt);
    atomic_store(&demote_lines, 0);
    assert_int_equal(call_checked(fn, 24), 'e');
    while (sj_runtime_run_background(rt, 8) > 0) {
    }
    assert_int_equal(call_checked(fn, 24), 's');
    specialize(rt, fn, 24); /* A */
    specialize(rt, fn, 40); /* B */
    assert_int_equal(call_checked(fn, 24), 'S');
    assert_int_equal(call_checked(fn, 40), 'S');
    advance_ms(100);
    assert_int_equal(call_checked(fn, 24), 'S'); /* A used after B */
    advance_ms(100);
    sj_stats s = stats(fn);
    assert_int_equal(s.specializations_demoted, 0);
    assert_true(s.specialized_bytes <= (uint64_t)budget && s.specialized_bytes >= (uint64_t)one);
    specialize(rt, fn, 56); /* C: room for it is made */
    s = stats(fn);
    assert_int_equal(s.specializations_demoted, 1);
    assert_true(s.specialized_bytes <= (uint64_t)budget);
    assert_int_equal(atomic_load(&demote_lines), 1);
    assert_int_equal(call_checked(fn, 40), 's'); /* B: symbolic, still right */
    assert_int_equal(call_checked(fn, 24), 'S');
    assert_int_equal(call_checked(fn, 56), 'S');
    int64_t bytes;
    int demoted;
    assert_int_equal(specialized(fn, &bytes, &demoted), 2);
    assert_int_equal(demoted, 1);
    assert_true(bytes == (int64_t)stats(fn).specialized_bytes);
    char *text = tu_explain(fn);
    assert_non_null(strstr(text, "specialization memory: "));
    assert_non_null(strstr(text, "1 shapes demoted"));
    assert_non_null(strstr(text, "(s0=40) "));
    assert_non_null(strstr(text, "[demoted 1 time by the memory budget: symbolic]"));
    free(text);
    sj_runtime_destroy(rt);
}

/* A demoted shape called again is specialized again only after its wait
 * (compile_retry_ms, +-25%) and specialize_threshold calls; it then
 * demotes the least recently called in turn. */
static void demoted_shape_comes_back_after_its_wait(void **state) {
    (void)state;
    int64_t one = one_spec_bytes(), budget = one * 5 / 2;
    sj_runtime *rt = runtime((uint64_t)budget, 0);
    sj_fn *fn = function(rt);
    call_checked(fn, 24);
    while (sj_runtime_run_background(rt, 8) > 0) {
    }
    specialize(rt, fn, 24);
    specialize(rt, fn, 40);
    advance_ms(100);
    specialize(rt, fn, 56); /* demotes 24 */
    assert_int_equal(stats(fn).specializations_demoted, 1);
    for (int i = 0; i < 8; i++) { /* inside the wait (750 ms at least): stays symbolic */
        assert_int_equal(call_checked(fn, 24), 's');
        advance_ms(50);
    }
    assert_int_equal(sj_runtime_run_background(rt, 8), 0);
    advance_ms(1000); /* past the longest wait */
    call_checked(fn, 40); /* 40 used after 56 */
    advance_ms(10);
    assert_int_equal(call_checked(fn, 24), 's'); /* hot again: queued */
    assert_int_equal(sj_runtime_run_background(rt, 8), 1);
    assert_int_equal(call_checked(fn, 24), 'S');
    sj_stats s = stats(fn);
    assert_int_equal(s.specializations_demoted, 2);
    assert_true(s.specialized_bytes <= (uint64_t)budget);
    assert_int_equal(call_checked(fn, 56), 's'); /* 56 was the least recently called */
    assert_int_equal(call_checked(fn, 40), 'S');
    sj_runtime_destroy(rt);
}

/* Many shapes through a budget of two: never over it, never more than
 * two specialized, every result right. */
static void budget_respected_over_many_shapes(void **state) {
    (void)state;
    int64_t one = one_spec_bytes(), budget = one * 5 / 2;
    sj_runtime *rt = runtime((uint64_t)budget, 0);
    sj_fn *fn = function(rt);
    call_checked(fn, 8);
    while (sj_runtime_run_background(rt, 8) > 0) {
    }
    for (int k = 0; k < 10; k++) {
        specialize(rt, fn, 16 + 8 * k);
        assert_int_equal(call_checked(fn, 16 + 8 * k), 'S');
        assert_true(stats(fn).specialized_bytes <= (uint64_t)budget);
        int64_t bytes;
        int demoted;
        assert_true(specialized(fn, &bytes, &demoted) <= 2);
        advance_ms(20);
    }
    sj_stats s = stats(fn);
    assert_int_equal(s.specializations_demoted, 8);
    for (int k = 0; k < 10; k++) call_checked(fn, 16 + 8 * k); /* all still right */
    sj_runtime_destroy(rt);
}

/* A unit larger than the whole budget is not kept: the shape stays on the
 * symbolic kernels and nothing else is demoted. */
static void unit_over_the_whole_budget_is_not_kept(void **state) {
    (void)state;
    sj_runtime *rt = runtime(100, 0);
    sj_fn *fn = function(rt);
    call_checked(fn, 24);
    while (sj_runtime_run_background(rt, 8) > 0) {
    }
    specialize(rt, fn, 24);
    sj_stats s = stats(fn);
    assert_int_equal(s.specializations_over_budget, 1);
    assert_int_equal(s.specializations_demoted, 0);
    assert_int_equal(s.specialized_bytes, 0);
    assert_int_equal(call_checked(fn, 24), 's');
    advance_ms(100000);
    for (int i = 0; i < 8; i++) assert_int_equal(call_checked(fn, 24), 's');
    assert_int_equal(sj_runtime_run_background(rt, 8), 0); /* not compiled again */
    sj_runtime_destroy(rt);
}

/* No budget: nothing demoted; what specializations hold is still counted. */
static void no_budget_no_demotion(void **state) {
    (void)state;
    sj_runtime *rt = runtime(0, 0);
    sj_fn *fn = function(rt);
    call_checked(fn, 24);
    while (sj_runtime_run_background(rt, 8) > 0) {
    }
    for (int k = 0; k < 4; k++) specialize(rt, fn, 16 + 8 * k);
    sj_stats s = stats(fn);
    assert_int_equal(s.specializations_demoted, 0);
    assert_true(s.specialized_bytes >= 4 * (uint64_t)one_spec_bytes() * 9 / 10);
    int64_t bytes;
    int demoted;
    assert_int_equal(specialized(fn, &bytes, &demoted), 4);
    assert_true(bytes == (int64_t)s.specialized_bytes);
    assert_int_equal(demoted, 0);
    sj_runtime_destroy(rt);
}

/* -- Demotion while calls run ------------------------------------------------------- */

typedef struct {
    sj_runtime *rt;
    atomic_int done;
} stepper;

static void *run_jobs(void *arg) {
    stepper *s = arg;
    while (sj_runtime_run_background(s->rt, 8) > 0) {
    }
    atomic_store(&s->done, 1);
    return NULL;
}

/* A call in flight (marked as sj_call marks itself) holds the demoted
 * code: the compile that demoted it does not free it, nor finish its job,
 * until the call is over. */
static void grace_period_waits_for_a_call_in_flight(void **state) {
    (void)state;
    int64_t one = one_spec_bytes();
    sj_runtime *rt = runtime((uint64_t)(one * 3 / 2), 0);
    sj_fn *fn = function(rt);
    call_checked(fn, 24);
    while (sj_runtime_run_background(rt, 8) > 0) {
    }
    specialize(rt, fn, 24);
    for (int i = 0; i < 4; i++) call_checked(fn, 40); /* hot: queued */
    unsigned shard = sj_shard_index();
    int phase = sj_budget_enter(fn, shard); /* a call of 24 in flight */
    assert_true(phase >= 0);
    stepper st = {rt, 0};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, run_jobs, &st), 0);
    for (int polls = 0; polls < 1000 && stats(fn).specializations_demoted == 0; polls++) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    assert_int_equal(stats(fn).specializations_demoted, 1); /* unpublished */
    struct timespec ts = {0, 100 * 1000000};
    nanosleep(&ts, NULL);
    assert_int_equal(atomic_load(&st.done), 0); /* not freed: the call still runs */
    sj_budget_leave(fn, shard, phase);
    pthread_join(th, NULL);
    assert_int_equal(atomic_load(&st.done), 1);
    assert_int_equal(call_checked(fn, 24), 's');
    assert_int_equal(call_checked(fn, 40), 'S');
    sj_runtime_destroy(rt);
}

typedef struct {
    sj_fn *fn;
    atomic_bool *stop;
    unsigned seed;
    int calls;
} caller;

static void *call_loop(void *arg) {
    caller *c = arg;
    float x[NMAX], y[NMAX];
    while (!atomic_load(c->stop)) {
        int n = 16 + 8 * (int)(rand_r(&c->seed) % 6);
        for (int i = 0; i < n; i++) x[i] = (float)((int)(rand_r(&c->seed) % 4000) - 2000) / 512.0f;
        sj_tensor in = sj_tensor_make(x, SJ_F32, 1, (int64_t[]){n});
        sj_tensor out = sj_tensor_make(y, SJ_F32, 1, (int64_t[]){n});
        if (sj_call(c->fn, &in, 1, &out, 1) != SJ_OK) return (void *)1;
        for (int i = 0; i < n; i++)
            if (fabs((double)y[i] - (tanh((double)x[i] * 2.0 + 1.0) - (double)x[i] / 4.0)) > 1e-5) return (void *)2;
        advance_ms(1);
        c->calls++;
    }
    return NULL;
}

/* Four threads call six shapes at random while a compile worker
 * specializes them under a budget of one and a half: specializations are
 * demoted and freed under running calls, and every result stays right. */
static void demotion_under_concurrent_calls(void **state) {
    (void)state;
    int64_t one = one_spec_bytes();
    sj_runtime *rt = runtime((uint64_t)(one * 3 / 2), 1);
    sj_fn *fn = function(rt);
    atomic_bool stop = false;
    enum { T = 4 };
    caller cs[T];
    pthread_t th[T];
    for (int i = 0; i < T; i++) {
        cs[i] = (caller){fn, &stop, 100u + (unsigned)i, 0};
        assert_int_equal(pthread_create(&th[i], NULL, call_loop, &cs[i]), 0);
    }
    /* until eight demotions happened, or a bound on real time (polled) */
    for (int polls = 0; polls < 6000 && stats(fn).specializations_demoted < 8; polls++) {
        struct timespec ts = {0, 10 * 1000000};
        nanosleep(&ts, NULL);
    }
    atomic_store(&stop, true);
    for (int i = 0; i < T; i++) {
        void *rc = NULL;
        pthread_join(th[i], &rc);
        assert_null(rc);
        assert_true(cs[i].calls > 0);
    }
    sj_stats s = stats(fn);
    assert_true(s.specializations_demoted >= 8);
    assert_true(s.specialized_bytes <= (uint64_t)(one * 3 / 2));
    assert_int_equal(s.errors, 0);
    sj_runtime_destroy(rt);
}

/* -- Where units go ------------------------------------------------------------------ */

/* Demoted units are freed after a grace period, but on a device whose
 * code may run after its call returned (late_launch: CUDA's streams and
 * graphs) they are parked until the function is destroyed: budget.c asks
 * the device, not its kind. The CPU device leaves late_launch off; the
 * test sets it on that device to see the other way (units with no module:
 * unloading NULL is a no-op). */
static sj_compiled *bare_unit(sj_runtime *rt) {
    sj_compiled *cd = calloc(1, sizeof *cd);
    assert_non_null(cd);
    cd->backend = rt->backend;
    return cd;
}

static void reap_asks_the_device(void **state) {
    (void)state;
    sj_runtime *rt = runtime(1 << 20, 0);
    sj_fn *fn = function(rt);
    assert_false(rt->backend->late_launch);
    sj_budget_reap(fn, bare_unit(rt)); /* freed now */
    assert_null(fn->parked);
    rt->backend->late_launch = true;
    sj_compiled *a = bare_unit(rt), *b = bare_unit(rt);
    a->retired_next = b;
    sj_budget_reap(fn, a);
    assert_ptr_equal(fn->parked, a);
    assert_ptr_equal(a->retired_next, b);
    sj_budget_reap(fn, bare_unit(rt)); /* parked in front of them */
    assert_ptr_equal(fn->parked->retired_next, a);
    rt->backend->late_launch = false;
    sj_fn_destroy(fn); /* frees the parked ones (ASan: no leak) */
    sj_runtime_destroy(rt);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(lru_demotes_the_least_recently_called),
        cmocka_unit_test(demoted_shape_comes_back_after_its_wait),
        cmocka_unit_test(budget_respected_over_many_shapes),
        cmocka_unit_test(unit_over_the_whole_budget_is_not_kept),
        cmocka_unit_test(no_budget_no_demotion),
        cmocka_unit_test(grace_period_waits_for_a_call_in_flight),
        cmocka_unit_test(demotion_under_concurrent_calls),
        cmocka_unit_test(reap_asks_the_device),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
