/* recompile_test: how to test a jitted function's recompilation behaviour
 * in your own project: which calls trace the model again, when an entry
 * becomes hot and gets fused kernels, what the recompile limit does, and
 * what a guard failure reports. Copy it next to your model and adapt the
 * expectations.
 *
 *   recompile_test [--verbose]
 *
 * Every section builds its own function over one small model,
 *   y = silu(rms_norm(x, g) * w + b),  x f32 [S, 16],
 * calls it with chosen sizes and checks the counters of sj_fn_stats and
 * the entries of sj_fn_entries after each step, and every result against a
 * float64 reference computed here. The program prints one line per check
 * and exits 0 when all pass, 1 otherwise (so a test runner can call it).
 *
 * Testing recompilation needs two settings that a server would not use:
 *   - compile_mode SJ_COMPILE_SYNC: an entry that becomes hot is compiled
 *     before that call returns, so which tier serves a call is decided by
 *     the call count alone and not by how fast the compiler is;
 *   - cache_dir NULL: no persistent kernel cache, so every compile is real
 *     and a second run counts the same.
 * It uses the CPU backend (host buffers); the counters mean the same on
 * the CUDA backend. The generated kernels need a C compiler (cc); without
 * one the tier checks fail with the compiler's reason.
 */
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shapejit.h"

enum { D = 16 };

static int failures, verbose;

/* One expectation: prints it when --verbose or when it fails. */
static void check(int ok, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    if (!ok || verbose) {
        printf("  %s  ", ok ? "ok  " : "FAIL");
        vprintf(fmt, ap);
        printf("\n");
    }
    va_end(ap);
    failures += !ok;
}

static void check_eq(long long actual, long long expected, const char *what) {
    check(actual == expected, "%s: %lld (expected %lld)", what, actual, expected);
}
#define CHECK_EQ(actual, expected, what) check_eq((long long)(actual), (long long)(expected), what)

/* -- The model and its reference ------------------------------------------------ */

typedef struct params {
    float g[D], w[D], b[D];
    sj_tensor tg, tw, tb;
} params;

static sj_status model(sj_tracer *t, const sj_val *in, int n_in, void *user) {
    const params *p = user;
    sj_val h = sj_rms_norm(t, in[0], sj_param(t, &p->tg), 1e-6);
    h = sj_add(t, sj_mul(t, h, sj_param(t, &p->tw)), sj_param(t, &p->tb));
    return sj_output(t, sj_silu(t, h));
}

static void reference(const params *p, const float *x, int64_t S, double *y) {
    for (int64_t r = 0; r < S; r++) {
        double ss = 0;
        for (int j = 0; j < D; j++) ss += (double)x[r * D + j] * x[r * D + j];
        double inv = 1.0 / sqrt(ss / D + 1e-6);
        for (int j = 0; j < D; j++) {
            double h = x[r * D + j] * inv * p->g[j] * p->w[j] + p->b[j];
            y[r * D + j] = h / (1.0 + exp(-h));
        }
    }
}

static uint64_t rng = 0x7e57c0de1234567ull;
static float frand(void) { /* uniform in [-1, 1) */
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((rng >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

/* -- Calling and checking --------------------------------------------------------- */

typedef struct harness {
    sj_runtime *rt;
    params p;
    char log[8192]; /* the runtime's warn lines, for the limit checks */
    size_t log_len;
    int guard_failures_seen;
    sj_guard_failure last_failure;
} harness;

/* Log callback: keep the lines (tests assert on them), echo with --verbose. */
static void on_log(void *user, unsigned topic, const char *msg) {
    harness *h = user;
    int n = snprintf(h->log + h->log_len, sizeof h->log - h->log_len, "%s\n", msg);
    if (n > 0 && (size_t)n < sizeof h->log - h->log_len) h->log_len += (size_t)n;
    if (verbose) printf("        log: %s\n", msg);
}

/* Guard-failure callback: what made the last retrace necessary. */
static void on_guard_fail(void *user, const sj_guard_failure *f) {
    harness *h = user;
    h->guard_failures_seen++;
    h->last_failure = *f;
}

/* Calls fn on random x [S, D]; checks the result against the reference.
 * Returns the call's status. */
static sj_status call(harness *h, sj_fn *fn, int64_t S) {
    float *x = malloc((size_t)(S * D) * sizeof *x), *y = malloc((size_t)(S * D) * sizeof *y);
    double *ref = malloc((size_t)(S * D) * sizeof *ref);
    if (!x || !y || !ref) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    for (int64_t i = 0; i < S * D; i++) x[i] = 2.0f * frand(), y[i] = NAN; /* NaN: every element must be written */
    sj_tensor in = sj_tensor_make(x, SJ_F32, 2, (int64_t[]){S, D});
    sj_tensor out = sj_tensor_make(y, SJ_F32, 2, (int64_t[]){S, D});
    sj_status st = sj_call(fn, &in, 1, &out, 1);
    if (st == SJ_OK) {
        reference(&h->p, x, S, ref);
        double worst = 0;
        for (int64_t i = 0; i < S * D; i++) {
            double e = fabs(y[i] - ref[i]) / fmax(fabs(ref[i]), 1.0);
            worst = e > worst || e != e ? e : worst;
        }
        check(worst < 1e-5, "S=%lld: result within 1e-5 of the float64 reference (worst %.2g)", (long long)S, worst);
    }
    free(x), free(y), free(ref);
    return st;
}

static sj_fn *make_fn(harness *h, const char *name, const sj_fn_options *base) {
    sj_fn_options o = *base;
    o.input_names = (const char *const[]){"x"};
    o.on_guard_fail = on_guard_fail;
    o.on_guard_fail_user = h;
    sj_fn *fn;
    if (sj_fn_create(h->rt, name, 1, model, &h->p, &o, &fn)) {
        fprintf(stderr, "sj_fn_create(%s): %s\n", name, sj_last_error());
        exit(1);
    }
    return fn;
}

static sj_stats stats(sj_fn *fn) {
    sj_stats s;
    sj_fn_stats(fn, &s);
    return s;
}

/* -- The sections ------------------------------------------------------------------- */

/* AUTO (the default): the first trace is static; the first call with another
 * size retraces with that dimension symbolic, and that entry serves every
 * later size. An exact signature seen before is served from the memo. */
static void auto_policy(harness *h) {
    printf("auto policy: a varying size becomes symbolic after one retrace\n");
    sj_fn_options o = {0};
    sj_fn *fn = make_fn(h, "auto", &o);
    call(h, fn, 8);
    call(h, fn, 8);
    CHECK_EQ(stats(fn).traces, 1, "traces after S=8 twice");
    CHECK_EQ(stats(fn).memo_hits, 1, "memo hits after S=8 twice");

    h->guard_failures_seen = 0;
    call(h, fn, 12);
    CHECK_EQ(stats(fn).traces, 2, "traces after S=12");
    CHECK_EQ(h->guard_failures_seen, 1, "guard failures reported for S=12");
    const sj_guard_failure *f = &h->last_failure;
    check(f->kind == SJ_GUARD_SIZE && f->input == 0 && f->axis == 0 && f->expected == 8 && f->actual == 12,
          "the failure names input 0 ('%s'), axis %d, expected %lld, actual %lld: \"%s\"", f->input_name, f->axis,
          (long long)f->expected, (long long)f->actual, f->message);

    for (int64_t S = 20; S <= 100; S += 40) call(h, fn, S);
    sj_stats s = stats(fn);
    CHECK_EQ(s.traces, 2, "traces after S=20, 60, 100 (the symbolic entry serves them)");
    CHECK_EQ(s.static_entries, 1, "static entries");
    CHECK_EQ(s.symbolic_entries, 1, "symbolic entries");
    CHECK_EQ(s.guard_failures[SJ_GUARD_SIZE], 1, "size guard failures counted");
    sj_entry_info e[4];
    CHECK_EQ(sj_fn_entries(fn, e, 4), 2, "entries");
    check(!strcmp(e[0].what, "symbolic in x.size(0)"), "newest entry is \"%s\"", e[0].what);
    sj_fn_destroy(fn);
}

/* Tiers: an entry runs eagerly until hot_threshold calls; then its fused
 * symbolic kernels serve it. An exact shape that a symbolic entry serves
 * specialize_threshold times gets kernels of its own (all sizes constant),
 * up to specialize_budget shapes per function. */
static void tiers(harness *h) {
    printf("tiers: eager -> fused symbolic -> fused specialized\n");
    sj_fn_options o = {0};
    o.dynamic = SJ_DYNAMIC_SYMBOLIC;
    o.hot_threshold = 3;
    o.specialize_threshold = 5;
    o.specialize_budget = 1;
    sj_fn *fn = make_fn(h, "tiers", &o);

    call(h, fn, 10);
    call(h, fn, 11);
    sj_stats s = stats(fn);
    CHECK_EQ(s.eager_calls, 2, "eager calls before the entry is hot");
    CHECK_EQ(s.hot_entries, 0, "hot entries after 2 calls");
    CHECK_EQ(s.compiles, 0, "compiles after 2 calls");

    call(h, fn, 12); /* the 3rd call makes the entry hot: compiled before it runs (sync mode) */
    s = stats(fn);
    CHECK_EQ(s.hot_entries, 1, "hot entries after 3 calls");
    CHECK_EQ(s.eager_calls, 2, "eager calls after 3 calls (the 3rd ran fused)");
    CHECK_EQ(s.compile_failures, 0, "compile failures (a C compiler is needed)");
    if (s.compile_failures) sj_fn_explain(fn, stdout); /* it gives the compiler's reason */
    check(s.compiles >= 1, "compiles after 3 calls: %llu (at least 1)", (unsigned long long)s.compiles);
    uint64_t fused_before = s.fused_symbolic_calls;
    call(h, fn, 13);
    call(h, fn, 14);
    s = stats(fn);
    CHECK_EQ(s.fused_symbolic_calls - fused_before, 2, "fused symbolic calls for two new sizes");
    CHECK_EQ(s.traces, 1, "traces (one symbolic entry serves every size)");

    /* one shape, over and over: the specialize_threshold-th call marks it
     * hot, and (sync mode) runs on its new specialized kernels */
    uint64_t spec_before = s.fused_specialized_calls;
    for (int i = 0; i < o.specialize_threshold - 1; i++) call(h, fn, 32);
    s = stats(fn);
    CHECK_EQ(s.hot_shapes, 0, "hot shapes after S=32 four times");
    CHECK_EQ(s.fused_specialized_calls - spec_before, 0, "specialized calls after S=32 four times");
    call(h, fn, 32);
    s = stats(fn);
    CHECK_EQ(s.hot_shapes, 1, "hot shapes after S=32 five times");
    CHECK_EQ(s.fused_specialized_calls - spec_before, 1, "specialized calls after S=32 five times");
    sj_entry_info e;
    sj_fn_entries(fn, &e, 1);
    CHECK_EQ(e.specialized_shapes, 1, "entry's specialized shapes");

    /* the budget is 1: another hot shape keeps the symbolic kernels */
    for (int i = 0; i < o.specialize_threshold + 1; i++) call(h, fn, 48);
    s = stats(fn);
    CHECK_EQ(s.hot_shapes, 1, "hot shapes after S=48 six times (budget 1)");
    sj_fn_destroy(fn);
}

/* The recompile limit: past recompile_limit entries a new shape is served by
 * one symbolic fallback entry (traced once), never by another
 * specialization; the limit is logged once with the last guard failure. */
static void limit_fallback(harness *h) {
    printf("recompile limit: past it, one symbolic fallback entry serves new shapes\n");
    sj_fn_options o = {0};
    o.dynamic = SJ_DYNAMIC_STATIC;
    o.recompile_limit = 3;
    sj_fn *fn = make_fn(h, "limited", &o);
    h->log_len = 0, h->log[0] = 0;
    for (int64_t S = 4; S <= 6; S++) call(h, fn, S);
    CHECK_EQ(stats(fn).entries, 3, "entries after S=4, 5, 6 (static policy)");
    check(!strstr(h->log, "recompile limit"), "no limit line logged yet");

    for (int64_t S = 7; S <= 10; S++) call(h, fn, S);
    sj_stats s = stats(fn);
    CHECK_EQ(s.entries, 4, "entries after S=7..10 (3 static + 1 fallback)");
    CHECK_EQ(s.limit_hits, 1, "limit hits");
    sj_entry_info e;
    sj_fn_entries(fn, &e, 1);
    check(e.fallback && e.symbolic, "the newest entry is a symbolic fallback (\"%s\")", e.what);
    check(strstr(h->log, "recompile limit reached") != NULL, "the limit was logged");
    check(strstr(h->log, "expected 6, actual 7") != NULL, "the log line names the last failure (6 -> 7)");

    uint64_t traces = s.traces;
    call(h, fn, 5); /* an old entry still serves its shape */
    CHECK_EQ(stats(fn).traces, traces, "S=5 again: no trace");
    sj_fn_destroy(fn);
}

/* limit_is_error: past the limit sj_call fails with SJ_ELIMIT, names the
 * guard that failed, and changes nothing: the entries keep serving. */
static void limit_error(harness *h) {
    printf("recompile limit as an error: SJ_ELIMIT, and the function keeps serving\n");
    sj_fn_options o = {0};
    o.dynamic = SJ_DYNAMIC_STATIC;
    o.recompile_limit = 2;
    o.limit_is_error = 1;
    sj_fn *fn = make_fn(h, "strict", &o);
    call(h, fn, 3);
    call(h, fn, 4);
    sj_status st = call(h, fn, 5);
    check(st == SJ_ELIMIT, "S=5 past the limit: %s", sj_status_name(st));
    check(strstr(sj_last_error(), "expected 4, actual 5") != NULL, "message: \"%s\"", sj_last_error());
    CHECK_EQ(call(h, fn, 3), SJ_OK, "S=3 afterwards (status)");
    sj_stats s = stats(fn);
    CHECK_EQ(s.entries, 2, "entries");
    CHECK_EQ(s.errors, 1, "errors");
    sj_fn_destroy(fn);
}

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--verbose")) verbose = 1;
        else {
            fprintf(stderr, "usage: %s [--verbose]\n", argv[0]);
            return 2;
        }
    }
    static harness h;
    for (int j = 0; j < D; j++) h.p.g[j] = 1.0f + 0.1f * frand(), h.p.w[j] = frand(), h.p.b[j] = 0.1f * frand();
    h.p.tg = sj_tensor_make(h.p.g, SJ_F32, 1, (int64_t[]){D});
    h.p.tw = sj_tensor_make(h.p.w, SJ_F32, 1, (int64_t[]){D});
    h.p.tb = sj_tensor_make(h.p.b, SJ_F32, 1, (int64_t[]){D});

    sj_runtime_config cfg;
    sj_runtime_config_init(&cfg);
    cfg.backend = SJ_BACKEND_CPU;
    cfg.compile_mode = SJ_COMPILE_SYNC;
    cfg.cache_dir = NULL;
    cfg.log_fn = on_log;
    cfg.log_user = &h;
    if (sj_runtime_create(&cfg, &h.rt)) {
        fprintf(stderr, "sj_runtime_create: %s\n", sj_last_error());
        return 1;
    }
    auto_policy(&h);
    tiers(&h);
    limit_fallback(&h);
    limit_error(&h);
    sj_runtime_destroy(h.rt);
    printf(failures ? "recompile_test: %d check(s) failed\n" : "recompile_test: all checks passed\n", failures);
    return failures ? 1 : 0;
}
