/* Guard evaluation micro-benchmark.
 *
 *   bench_guards [--quick]
 *
 * Prints one JSON object per line. A realistic 4-input guard set (an
 * encoder's x [s0, s1, 768], mask [s0, s1], pos [1, s1], w [768, 768]; s0
 * and s1 shared across inputs by duck sizing; s1 % 8 == 0 from a reshape
 * into heads) evaluated in a loop: the passing evaluation, a failing one
 * that fails at the last input (without and with the failure record, whose
 * message is formatted), and the same set with its divisibility fact on an
 * expression, (s0*s1) % 8, which goes through sj_ex_eval. Figures are the
 * median over batches of ns per evaluation, single-threaded.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench/bench_util.h"
#include "guards/guard.h"

static int quick;
static volatile int64_t sink;

/* -- Helpers ------------------------------------------------------------- */

static double now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static sj_guard_input input(sj_dtype dt, int rank, const sj_expr *dims) {
    sj_guard_input g;
    memset(&g, 0, sizeof g);
    g.dtype = dt;
    g.rank = rank;
    g.device = SJ_HOST;
    g.contiguous = true;
    memcpy(g.dim, dims, (size_t)rank * sizeof *dims);
    return g;
}

/* Median ns per sj_guard_check over batches; exits if the result is not
 * the expected one. */
static double time_check(const sj_guard_set *gs, const sj_tensor *in, bool want, bool record) {
    enum { BATCHES = 9 };
    long iters = quick ? 200000 : 2000000;
    double t[BATCHES];
    int64_t sv[8];
    sj_guard_failure f;
    for (int b = 0; b < BATCHES; b++) {
        int64_t acc = 0;
        double t0 = now_ns();
        for (long i = 0; i < iters; i++) acc += sj_guard_check(gs, in, sv, record ? &f : NULL) == want;
        t[b] = (now_ns() - t0) / (double)iters;
        if (acc != iters) {
            fprintf(stderr, "bench_guards: unexpected guard result\n");
            exit(1);
        }
        sink += acc + sv[0];
    }
    qsort(t, BATCHES, sizeof t[0], bench_cmp_double);
    return t[BATCHES / 2];
}

/* -- Workload ------------------------------------------------------------ */

static void run(const char *name, bool expr_fact) {
    sj_exprs *p = sj_exprs_create();
    if (!p || sj_sym_new(p, 4, 2, SJ_EX_INF) != 0 || sj_sym_new(p, 128, 2, 4096) != 1) {
        fprintf(stderr, "bench_guards: out of memory\n");
        exit(1);
    }
    sj_expr s0 = sj_ex_sym(p, 0), s1 = sj_ex_sym(p, 1), c1 = sj_ex_const(p, 1),
            c768 = sj_ex_const(p, 768), c8 = sj_ex_const(p, 8), c0 = sj_ex_const(p, 0);
    sj_guard_input ins[4] = {
        input(SJ_F32, 3, (const sj_expr[]){s0, s1, c768}),
        input(SJ_BOOL, 2, (const sj_expr[]){s0, s1}),
        input(SJ_I64, 2, (const sj_expr[]){c1, s1}),
        input(SJ_F32, 2, (const sj_expr[]){c768, c768}),
    };
    sj_fact fact;
    memset(&fact, 0, sizeof fact);
    fact.lhs = sj_ex_mod(p, expr_fact ? sj_ex_mul(p, s0, s1) : s1, c8);
    fact.rhs = c0;
    fact.rel = SJ_REL_EQ;
    snprintf(fact.why, sizeof fact.why, "reshape(f32[s0, s1, 768], [s0, s1, 8, 96])");
    static const char *const names[] = {"x", "mask", "pos", "w"};
    sj_guard_set *gs = sj_guard_build(p, ins, 4, &fact, 1, names, 0);
    if (!gs) {
        fprintf(stderr, "bench_guards: sj_guard_build failed\n");
        exit(1);
    }
    sj_tensor in[4] = {
        sj_tensor_make(NULL, SJ_F32, 3, (const int64_t[]){4, 136, 768}),
        sj_tensor_make(NULL, SJ_BOOL, 2, (const int64_t[]){4, 136}),
        sj_tensor_make(NULL, SJ_I64, 2, (const int64_t[]){1, 136}),
        sj_tensor_make(NULL, SJ_F32, 2, (const int64_t[]){768, 768}),
    };
    double pass = time_check(gs, in, true, false);
    in[3].shape[1] = 769; /* fails at the last input's last size */
    double fail = time_check(gs, in, false, false);
    double fail_report = time_check(gs, in, false, true);
    printf("{\"workload\": \"%s\", \"inputs\": 4, \"instructions\": %d, \"ns_per_eval\": %.2f, "
           "\"ns_per_fail\": %.2f, \"ns_per_fail_report\": %.2f}\n",
           name, sj_guard_size(gs), pass, fail, fail_report);
    fflush(stdout);
    sj_guard_free(gs);
    sj_exprs_destroy(p);
}

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0) {
            quick = 1;
        } else {
            fprintf(stderr, "usage: bench_guards [--quick]\n");
            return 2;
        }
    }
    run("guards", false);
    run("guards_expr_fact", true);
    return 0;
}
