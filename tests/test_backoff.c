/* Back-off from failing compiles and the compile queue's order (issues 24, 25 and 30): a unit whose
 * compile fails waits a doubling, jittered penalty before a call may queue
 * it again, and is blacklisted after compile_max_failures. Time is a
 * virtual clock in the config (cfg.clock_ns), and background work runs
 * step by step on the test's thread (compile_threads 0,
 * sj_runtime_run_background), so every window is asserted exactly, with no
 * sleeps. The compiler is a shell script that fails while a flag file
 * exists and runs the real compiler otherwise; every call's result is
 * checked against x * 2 + 1 computed here. */
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
#include <sys/stat.h>
#include <unistd.h>

#include "jit/compile.h"
#include "jit/runtime.h"
#include "jit/shapejit.h"
#include "tests/util.h"

#define N 24
#define MS INT64_C(1000000)

static char dir[256], flag[300];
static tu_clock clk = {1000 * MS}; /* the runtimes' virtual clock */
static void advance_ms(int64_t ms) { tu_clock_advance_ms(&clk, ms); }

static sj_status m_affine(sj_tracer *t, const sj_val *in, int n, void *u) {
    (void)n, (void)u;
    return sj_output(t, sj_add(t, sj_mul(t, in[0], sj_scalar(t, 2.0)), sj_scalar(t, 1.0)));
}

/* A compiler that fails (saying why on stderr) while `flag` exists and is
 * the system's cc otherwise; each run appends a line to dir/runs. */
static const char *flaky_cc(void) {
    static char path[512];
    snprintf(path, sizeof path, "%s/flaky.sh", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f,
            "#!/bin/sh\n"
            "case \"$1\" in --version) exec cc --version;; esac\n"
            "echo run >> '%s/runs'\n"
            "if [ -e '%s' ]; then echo 'flaky: broken today' >&2; exit 1; fi\n"
            "exec cc \"$@\"\n",
            dir, flag);
    fclose(f);
    assert_int_equal(chmod(path, 0755), 0);
    return path;
}

static int runs(void) {
    char p[512];
    snprintf(p, sizeof p, "%s/runs", dir);
    FILE *f = fopen(p, "r");
    if (!f) return 0;
    int n = 0, ch;
    while ((ch = fgetc(f)) != EOF) n += ch == '\n';
    fclose(f);
    return n;
}

static void set_flag(int on) {
    if (on) {
        FILE *f = fopen(flag, "w");
        assert_non_null(f);
        fclose(f);
    } else {
        assert_int_equal(unlink(flag), 0);
    }
}

static sj_runtime *runtime(int workers, int retry_ms, int max_failures) {
    sj_runtime_config cfg = tu_cpu_config();
    cfg.compile_mode = SJ_COMPILE_ASYNC;
    cfg.compile_threads = workers;
    cfg.cc = flaky_cc();
    cfg.hot_threshold = 1;
    cfg.compile_retry_ms = retry_ms;
    cfg.compile_max_failures = max_failures;
    tu_clock_use(&cfg, &clk);
    sj_runtime *rt = NULL;
    assert_int_equal(sj_runtime_create(&cfg, &rt), SJ_OK);
    return rt;
}

/* One call over N random floats, checked; returns whether it ran fused. */
static int call_checked(sj_fn *fn) {
    float x[N], y[N];
    for (int i = 0; i < N; i++) x[i] = (float)(rand() % 2000 - 1000) / 64.0f, y[i] = NAN;
    sj_tensor in = sj_tensor_make(x, SJ_F32, 1, (int64_t[]){N});
    sj_tensor out = sj_tensor_make(y, SJ_F32, 1, (int64_t[]){N});
    sj_stats before, after;
    sj_fn_stats(fn, &before);
    assert_int_equal(sj_call(fn, &in, 1, &out, 1), SJ_OK);
    for (int i = 0; i < N; i++) assert_float_equal(y[i], (double)x[i] * 2.0 + 1.0, 1e-5);
    sj_fn_stats(fn, &after);
    return after.eager_calls == before.eager_calls;
}

static const char *tier(sj_fn *fn) {
    static sj_entry_info info;
    assert_int_equal(sj_fn_entries(fn, &info, 1), 1);
    return info.tier;
}

static int setup(void **state) {
    (void)state;
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/sj-backoff-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    assert_non_null(mkdtemp(dir));
    snprintf(flag, sizeof flag, "%s/broken", dir);
    srand(7);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd)) {
    }
    return 0;
}

/* -- Doubling penalties, then recovery --------------------------------------- */

/* After failure n the unit may not be queued before 0.75 * 2^(n-1) s and
 * is queued by the first call after 1.25 * 2^(n-1) s. */
static void penalty_doubles_then_compile_recovers(void **state) {
    (void)state;
    set_flag(1);
    sj_runtime *rt = runtime(0, 1000, 8);
    sj_fn *fn = NULL;
    assert_int_equal(sj_fn_create(rt, "flaky", 1, m_affine, NULL, NULL, &fn), SJ_OK);
    assert_false(call_checked(fn)); /* hot at once: queued, not run (no workers) */
    assert_string_equal(tier(fn), "queued");
    assert_int_equal(sj_runtime_run_background(rt, 8), 1);
    assert_int_equal(runs(), 1);
    assert_string_equal(tier(fn), "compile failed");
    for (int n = 1; n <= 3; n++) {
        int64_t p = INT64_C(1000) << (n - 1); /* the penalty before jitter, ms */
        assert_false(call_checked(fn));       /* at once: nothing queued */
        assert_int_equal(sj_runtime_run_background(rt, 8), 0);
        advance_ms(p * 3 / 4 - 1);
        assert_false(call_checked(fn)); /* still inside the shortest jittered penalty */
        assert_int_equal(sj_runtime_run_background(rt, 8), 0);
        assert_string_equal(tier(fn), "compile failed");
        advance_ms(p / 2 + 2); /* past the longest */
        assert_false(call_checked(fn));
        assert_string_equal(tier(fn), "queued");
        assert_int_equal(sj_runtime_run_background(rt, 8), 1);
        assert_int_equal(runs(), n + 1);
    }
    sj_stats s;
    sj_fn_stats(fn, &s);
    assert_int_equal(s.compile_failures, 4);
    assert_int_equal(s.compiles_blacklisted, 0);
    assert_int_equal(s.compiles, 0);
    char *text = tu_explain(fn);
    assert_non_null(strstr(text, "4 failed compiles; retried on a call"));
    assert_non_null(strstr(text, "flaky: broken today"));
    free(text);
    /* the compiler mends: the next retry compiles and calls run fused */
    set_flag(0);
    advance_ms(10001);
    assert_false(call_checked(fn));
    assert_int_equal(sj_runtime_run_background(rt, 8), 1);
    assert_string_equal(tier(fn), "fused specialized");
    assert_true(call_checked(fn));
    sj_fn_stats(fn, &s);
    assert_int_equal(s.compiles, 1);
    assert_int_equal(s.compile_failures, 4);
    sj_runtime_destroy(rt);
}

/* -- Blacklisting -------------------------------------------------------------- */

static void blacklisted_after_max_failures(void **state) {
    (void)state;
    set_flag(1);
    sj_runtime *rt = runtime(0, 10, 3);
    sj_fn *fn = NULL;
    assert_int_equal(sj_fn_create(rt, "doomed", 1, m_affine, NULL, NULL, &fn), SJ_OK);
    for (int n = 0; n < 3; n++) {
        call_checked(fn);
        assert_int_equal(sj_runtime_run_background(rt, 8), 1);
        advance_ms(INT64_C(10) << (n + 1));
    }
    assert_string_equal(tier(fn), "compile blacklisted");
    set_flag(0); /* too late: it stays eager */
    advance_ms(INT64_C(1000) * 1000 * 1000);
    for (int i = 0; i < 5; i++) assert_false(call_checked(fn));
    assert_int_equal(sj_runtime_run_background(rt, 8), 0);
    assert_int_equal(runs(), 3);
    sj_stats s;
    sj_fn_stats(fn, &s);
    assert_int_equal(s.compile_failures, 3);
    assert_int_equal(s.compiles_blacklisted, 1);
    char *text = tu_explain(fn);
    assert_non_null(strstr(text, "blacklisted after 3 failed compiles"));
    assert_non_null(strstr(text, "3 failed (1 blacklisted)"));
    free(text);
    sj_runtime_destroy(rt);
}

/* compile_retry_ms 0: the first failure is final. */
static void no_retries_when_retry_ms_is_zero(void **state) {
    (void)state;
    set_flag(1);
    sj_runtime *rt = runtime(0, 0, 4);
    sj_fn *fn = NULL;
    assert_int_equal(sj_fn_create(rt, "once", 1, m_affine, NULL, NULL, &fn), SJ_OK);
    call_checked(fn);
    assert_int_equal(sj_runtime_run_background(rt, 8), 1);
    set_flag(0);
    advance_ms(INT64_C(1000) * 1000);
    call_checked(fn);
    assert_int_equal(sj_runtime_run_background(rt, 8), 0);
    assert_string_equal(tier(fn), "compile blacklisted");
    sj_runtime_destroy(rt);
}

/* Units that fail together do not all come back together: eight functions
 * fail at one instant; stepping the clock by 20 ms through the jitter's
 * window [750, 1250) ms, their retries are spread over several steps. */
static void jitter_spreads_retries(void **state) {
    (void)state;
    set_flag(1);
    enum { F = 8 };
    sj_runtime *rt = runtime(0, 1000, 4);
    sj_fn *fns[F];
    for (int i = 0; i < F; i++) {
        char name[16];
        snprintf(name, sizeof name, "j%d", i);
        assert_int_equal(sj_fn_create(rt, name, 1, m_affine, NULL, NULL, &fns[i]), SJ_OK);
        call_checked(fns[i]);
    }
    assert_int_equal(sj_runtime_run_background(rt, 100), F);
    advance_ms(740);
    int steps_with_retries = 0, retried = 0;
    for (int step = 0; step < 27 && retried < F; step++) {
        advance_ms(20);
        for (int i = 0; i < F; i++) call_checked(fns[i]);
        int n = sj_runtime_run_background(rt, 100);
        retried += n;
        steps_with_retries += n > 0;
    }
    assert_int_equal(retried, F);
    assert_true(steps_with_retries >= 2);
    sj_runtime_destroy(rt);
}

/* -- Stepping background work ---------------------------------------------------- */

/* Without workers nothing compiles behind the test's back; sj_fn_wait_idle
 * runs the waited function's jobs itself. */
static void no_workers_step_by_step(void **state) {
    (void)state;
    sj_runtime *rt = runtime(0, 1000, 4);
    sj_fn *a = NULL, *b = NULL;
    assert_int_equal(sj_fn_create(rt, "a", 1, m_affine, NULL, NULL, &a), SJ_OK);
    assert_int_equal(sj_fn_create(rt, "b", 1, m_affine, NULL, NULL, &b), SJ_OK);
    for (int i = 0; i < 3; i++) assert_false(call_checked(a));
    assert_false(call_checked(b));
    assert_string_equal(tier(a), "queued");
    assert_int_equal(sj_runtime_run_background(NULL, 1), 0);
    assert_int_equal(sj_runtime_run_background(rt, 0), 0);
    assert_int_equal(sj_fn_wait_idle(a, 60000), SJ_OK);
    assert_true(call_checked(a));
    assert_string_equal(tier(b), "queued"); /* a's wait ran a's job first (it was the hotter) */
    assert_int_equal(sj_runtime_run_background(rt, 1), 1);
    assert_true(call_checked(b));
    assert_int_equal(sj_runtime_run_background(rt, 1), 0);
    sj_runtime_destroy(rt);
}

/* -- The queue's order and back-pressure ------------------------------------------ */

/* The busier of two queued functions is compiled first, whatever order
 * they were queued in; with the FIFO baseline, the first queued. */
static void value_order_then_fifo(void **state) {
    (void)state;
    for (int fifo = 0; fifo < 2; fifo++) {
        sj_runtime *rt = runtime(0, 1000, 4);
        sj_compiler_set_fifo(rt->compiler, fifo);
        sj_fn *quiet = NULL, *busy = NULL;
        assert_int_equal(sj_fn_create(rt, "quiet", 1, m_affine, NULL, NULL, &quiet), SJ_OK);
        assert_int_equal(sj_fn_create(rt, "busy", 1, m_affine, NULL, NULL, &busy), SJ_OK);
        call_checked(quiet); /* queued first */
        for (int i = 0; i < 40; i++) call_checked(busy);
        assert_int_equal(sj_runtime_run_background(rt, 1), 1);
        assert_string_equal(tier(fifo ? quiet : busy), "fused specialized");
        assert_string_equal(tier(fifo ? busy : quiet), "queued");
        assert_int_equal(sj_runtime_run_background(rt, 1), 1);
        sj_runtime_destroy(rt);
    }
}

/* Past 8 jobs per worker a new entry needs more calls to be queued. */
static void backlog_raises_the_hot_threshold(void **state) {
    (void)state;
    enum { F = 17 };
    sj_runtime *rt = runtime(0, 1000, 4);
    sj_fn *fns[F];
    for (int i = 0; i < F; i++) {
        char name[16];
        snprintf(name, sizeof name, "q%d", i);
        assert_int_equal(sj_fn_create(rt, name, 1, m_affine, NULL, NULL, &fns[i]), SJ_OK);
    }
    for (int i = 0; i < F - 1; i++) {
        call_checked(fns[i]);
        assert_string_equal(tier(fns[i]), "queued"); /* hot_threshold 1 while the queue is short */
    }
    call_checked(fns[F - 1]); /* 16 queued, no workers: twice the calls */
    assert_string_equal(tier(fns[F - 1]), "eager");
    call_checked(fns[F - 1]);
    assert_string_equal(tier(fns[F - 1]), "queued");
    assert_int_equal(sj_runtime_run_background(rt, 100), F);
    for (int i = 0; i < F; i++) assert_true(call_checked(fns[i]));
    sj_runtime_destroy(rt);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(penalty_doubles_then_compile_recovers, setup, teardown),
        cmocka_unit_test_setup_teardown(blacklisted_after_max_failures, setup, teardown),
        cmocka_unit_test_setup_teardown(no_retries_when_retry_ms_is_zero, setup, teardown),
        cmocka_unit_test_setup_teardown(jitter_spreads_retries, setup, teardown),
        cmocka_unit_test_setup_teardown(no_workers_step_by_step, setup, teardown),
        cmocka_unit_test_setup_teardown(value_order_then_fifo, setup, teardown),
        cmocka_unit_test_setup_teardown(backlog_raises_the_hot_threshold, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
