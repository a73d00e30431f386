/* Allocation failure (issue 25, item 2): for each public path, every host
 * allocation the path makes is failed in turn (base/alloc.h's fault point,
 * SQLite's sqlite3FaultSim), once and persistently. Each call must return
 * SJ_ENOMEM with a message, or SJ_OK with a correct result; never exit or
 * crash; free what it had built (run it under AddressSanitizer, whose leak
 * check runs at exit); and the next call with memory back must be correct.
 * Prints the sweep's counts. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/alloc.h"
#include "jit/shapejit.h"
#include "tests/util.h"

#define N 8
#define MAX_STEPS 5000

static sj_status model(sj_tracer *t, const sj_val *in, int n, void *u) {
    (void)n, (void)u;
    sj_val h = sj_add(t, in[0], in[1]);
    return sj_output(t, sj_gelu(t, sj_mul(t, h, sj_scalar(t, 0.5))));
}

static double ref(float a, float b) {
    double h = ((double)a + b) * 0.5;
    return 0.5 * h * (1.0 + erf(h / sqrt(2.0)));
}

static sj_runtime_config config(sj_compile_mode mode) {
    sj_runtime_config cfg = tu_cpu_config();
    cfg.compile_mode = mode;
    cfg.dump_dir = NULL;
    cfg.hot_threshold = 1;
    return cfg;
}

/* One call, checked when it succeeds. */
static sj_status call(sj_fn *fn) {
    float a[2 * N], b[N], y[2 * N];
    for (int i = 0; i < 2 * N; i++) a[i] = (float)i * 0.25f - 1, y[i] = -7;
    for (int i = 0; i < N; i++) b[i] = (float)i * 0.1f;
    sj_tensor in[2] = {sj_tensor_make(a, SJ_F32, 2, (int64_t[]){2, N}), sj_tensor_make(b, SJ_F32, 1, (int64_t[]){N})};
    sj_tensor out = sj_tensor_make(y, SJ_F32, 2, (int64_t[]){2, N});
    sj_status st = sj_call(fn, in, 2, &out, 1);
    if (st == SJ_OK)
        for (int i = 0; i < 2 * N; i++) assert_true(fabs(y[i] - ref(a[i], b[i % N])) < 1e-4);
    return st;
}

typedef struct counts {
    int steps, faults, enomem, ok;
} counts;

static counts total;
static int paths;

/* The result of a step with a fault armed. */
static void judge(sj_status st, counts *c) {
    if (st == SJ_OK) {
        c->ok++;
        return;
    }
    if (st != SJ_ENOMEM) fprintf(stderr, "unexpected status %d: %s\n", (int)st, sj_last_error());
    assert_int_equal(st, SJ_ENOMEM);
    assert_true(sj_last_error()[0] != '\0');
    c->enomem++;
}

enum { P_RUNTIME, P_FN, P_FIRST_CALL, P_SYNC_COMPILE, P_EXPLAIN, P_COUNT };
static const char *const path_names[P_COUNT] = {"runtime create", "fn create", "first call (trace + eager)",
                                                "call compiling sync", "explain"};

/* Runs path p with fault countdown n: true when a fault was injected. */
static bool step(int p, int n, int persistent, counts *c) {
    sj_runtime_config cfg = config(p == P_SYNC_COMPILE ? SJ_COMPILE_SYNC : SJ_COMPILE_OFF);
    sj_runtime *rt = NULL;
    sj_fn *fn = NULL;
    sj_status st;
    if (p == P_RUNTIME) {
        sj_fault_set(n, persistent);
        st = sj_runtime_create(&cfg, &rt);
        bool hit = sj_fault_hits() > 0;
        sj_fault_set(0, 0);
        judge(st, c);
        if (st) assert_null(rt);
        if (!rt) assert_int_equal(sj_runtime_create(&cfg, &rt), SJ_OK);
        assert_int_equal(sj_fn_create(rt, "f", 2, model, NULL, NULL, &fn), SJ_OK);
        assert_int_equal(call(fn), SJ_OK);
        sj_runtime_destroy(rt);
        return hit;
    }
    assert_int_equal(sj_runtime_create(&cfg, &rt), SJ_OK);
    if (p == P_FN) {
        sj_fault_set(n, persistent);
        st = sj_fn_create(rt, "f", 2, model, NULL, NULL, &fn);
        bool hit = sj_fault_hits() > 0;
        sj_fault_set(0, 0);
        judge(st, c);
        if (st) {
            assert_null(fn);
            assert_int_equal(sj_fn_create(rt, "f", 2, model, NULL, NULL, &fn), SJ_OK);
        }
        assert_int_equal(call(fn), SJ_OK);
        sj_runtime_destroy(rt);
        return hit;
    }
    assert_int_equal(sj_fn_create(rt, "f", 2, model, NULL, NULL, &fn), SJ_OK);
    if (p == P_EXPLAIN) assert_int_equal(call(fn), SJ_OK);
    sj_fault_set(n, persistent);
    if (p == P_EXPLAIN) {
        FILE *f = fopen("/dev/null", "w");
        sj_fn_explain(fn, f); /* void: must only not crash */
        fclose(f);
        st = SJ_OK;
    } else {
        st = call(fn);
    }
    bool hit = sj_fault_hits() > 0;
    sj_fault_set(0, 0);
    judge(st, c);
    /* memory back: correct, whatever the failed call left */
    assert_int_equal(call(fn), SJ_OK);
    assert_int_equal(call(fn), SJ_OK);
    sj_fn_destroy(fn);
    sj_runtime_destroy(rt);
    return hit;
}

static void sweep(int p) {
    for (int persistent = 0; persistent < 2; persistent++) {
        counts c = {0};
        int n = 1;
        for (; n < MAX_STEPS; n++) {
            c.steps++;
            if (!step(p, n, persistent, &c)) break; /* the path made fewer than n allocations */
            c.faults++;
        }
        assert_true(n < MAX_STEPS);
        printf("fault sweep: %-28s %-10s allocations reached %4d, faults injected %4d: SJ_ENOMEM %4d, "
               "served correctly %4d\n",
               path_names[p], persistent ? "persistent" : "once", n - 1, c.faults, c.enomem, c.ok - 1);
        total.steps += c.steps, total.faults += c.faults, total.enomem += c.enomem, total.ok += c.ok - 1;
    }
    paths++;
}

static void fault_runtime_create(void **state) { (void)state, sweep(P_RUNTIME); }
static void fault_fn_create(void **state) { (void)state, sweep(P_FN); }
static void fault_first_call(void **state) { (void)state, sweep(P_FIRST_CALL); }
static void fault_sync_compile(void **state) { (void)state, sweep(P_SYNC_COMPILE); }
static void fault_explain(void **state) { (void)state, sweep(P_EXPLAIN); }

static int summary(void **state) {
    (void)state;
    printf("fault sweep: %d paths, %d faults injected, %d SJ_ENOMEM, %d served correctly\n", paths, total.faults,
           total.enomem, total.ok);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(fault_runtime_create), cmocka_unit_test(fault_fn_create),
        cmocka_unit_test(fault_first_call),     cmocka_unit_test(fault_explain),
        cmocka_unit_test(fault_sync_compile),
    };
    return cmocka_run_group_tests(tests, NULL, summary);
}
