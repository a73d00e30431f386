/* bench_budget: the memory budget of specializations (issue 30) on a
 * w5-like stream. w2 (residual add, layernorm, gelu) on [L, 256] f32, L
 * from the w5 lengths (191 distinct, skewed), one symbolic entry, every
 * length that reaches specialize_threshold (16) calls specialized
 * (specialize_budget 1000: only the bytes limit them), one background
 * compile worker, no kernel cache. Requests arrive one every
 * --interval-us (default 1000). Run without a budget and with each budget
 * given (bytes).
 * Reports, per budget: the share of calls served fused (symbolic or
 * specialized) and specialized, the bytes specializations hold at the end
 * and at most during the stream (sampled every request), specializations
 * made and demoted, and the stream's seconds.
 *
 *   bench_budget [--lengths FILE] [--requests N] [--interval-us U] [--budget BYTES]...
 * Prints one JSON object per budget.
 *
 *   bench_budget --overhead
 * What a budget costs a call: 1e6 calls of one specialized shape (8
 * floats, x * 2 + 1), without and with a budget (which stamps the shape's
 * last use and marks the call around its code), best of 5 each. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench/bench_util.h"
#include "bench/bench_w2_stream.h"


static sj_status m_affine(sj_tracer *t, const sj_val *in, int n, void *u) {
    (void)n, (void)u;
    return sj_output(t, sj_add(t, sj_mul(t, in[0], sj_scalar(t, 2.0)), sj_scalar(t, 1.0)));
}

static int overhead(void) {
    double best[2] = {1e9, 1e9};
    for (int rep = 0; rep < 5; rep++)
        for (int b = 0; b < 2; b++) {
            sj_runtime_config cfg;
            sj_runtime_config_init(&cfg);
            cfg.backend = SJ_BACKEND_CPU;
            cfg.cache_dir = NULL;
            cfg.compile_mode = SJ_COMPILE_SYNC;
            cfg.exec_threads = 1;
            cfg.log_mask = SJ_LOG_WARN;
            cfg.specialize_max_bytes = b ? UINT64_C(1) << 30 : 0;
            sj_runtime *rt;
            if (sj_runtime_create(&cfg, &rt)) bench_die("sj_runtime_create");
            sj_fn_options o;
            sj_fn_options_init(&o);
            o.dynamic = SJ_DYNAMIC_SYMBOLIC;
            sj_fn *fn;
            if (sj_fn_create(rt, "affine", 1, m_affine, NULL, &o, &fn)) bench_die("sj_fn_create");
            float x[8] = {0}, y[8];
            sj_tensor in = sj_tensor_make(x, SJ_F32, 1, (int64_t[]){8});
            sj_tensor out = sj_tensor_make(y, SJ_F32, 1, (int64_t[]){8});
            for (int i = 0; i < 100; i++)
                if (sj_call(fn, &in, 1, &out, 1)) bench_die("sj_call");
            int n = 1000000;
            double t0 = bench_now_s();
            for (int i = 0; i < n; i++) sj_call(fn, &in, 1, &out, 1);
            double ns = (bench_now_s() - t0) / n * 1e9;
            sj_stats s;
            sj_fn_stats(fn, &s);
            if (s.fused_specialized_calls < (uint64_t)n) bench_die("not specialized");
            if (ns < best[b]) best[b] = ns;
            sj_runtime_destroy(rt);
        }
    printf("{\"bench\": \"budget_overhead\", \"ns_per_call_no_budget\": %.1f, \"ns_per_call_budget\": %.1f}\n", best[0],
           best[1]);
    return 0;
}

/* A request of the stream: the call, then the bytes specializations hold
 * (the peak in *user). */
static void budget_call(void *user, sj_fn *fn, int q, int L, const sj_tensor *in, sj_tensor *out) {
    (void)q, (void)L;
    if (sj_call(fn, in, 4, out, 2)) bench_die("sj_call");
    sj_stats s;
    sj_fn_stats(fn, &s);
    uint64_t *peak = user;
    if (s.specialized_bytes > *peak) *peak = s.specialized_bytes;
}

int main(int argc, char **argv) {
    if (argc == 2 && !strcmp(argv[1], "--overhead")) return overhead();
    const char *path = ".peer/workloads/w5_lengths.txt";
    int requests = 4000, interval_us = 1000, n_budgets = 1;
    uint64_t budgets[16] = {0};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--lengths") && i + 1 < argc) path = argv[++i];
        else if (!strcmp(argv[i], "--requests") && i + 1 < argc) requests = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--interval-us") && i + 1 < argc) interval_us = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--budget") && i + 1 < argc && n_budgets < 16)
            budgets[n_budgets++] = strtoull(argv[++i], NULL, 10);
        else {
            fprintf(stderr, "usage: %s [--lengths FILE] [--requests N] [--interval-us U] [--budget BYTES]...\n",
                    argv[0]);
            return 2;
        }
    }
    if (n_budgets == 1) budgets[n_budgets++] = UINT64_C(4) << 20; /* default: none, then 4 MiB */
    w2_stream ws;
    int loaded = w2_stream_load(&ws, "bench_budget", path, 2);
    if (loaded <= 0) return loaded < 0;
    for (int k = 0; k < n_budgets; k++) {
        sj_runtime_config cfg = w2_stream_config();
        cfg.specialize_budget = 1000;
        cfg.recompile_limit = 1000;
        cfg.specialize_max_bytes = budgets[k];
        sj_runtime *rt;
        if (sj_runtime_create(&cfg, &rt)) bench_die("sj_runtime_create");
        sj_fn *fn = w2_stream_fn(rt, SJ_DYNAMIC_SYMBOLIC, 0);
        uint64_t peak = 0;
        double el = w2_stream_run(&ws, fn, ws.lens, ws.n_lens, requests, interval_us, budget_call, &peak);
        sj_stats s;
        sj_fn_stats(fn, &s);
        printf("{\"bench\": \"budget\", \"specialize_max_bytes\": %llu, \"requests\": %d, \"seconds\": %.2f, "
               "\"fused_share\": %.3f, \"specialized_share\": %.3f, \"specialized_bytes_end\": %llu, "
               "\"specialized_bytes_peak\": %llu, \"compiles\": %llu, \"hot_shapes\": %llu, \"demoted\": %llu, "
               "\"over_budget\": %llu}\n",
               (unsigned long long)budgets[k], requests, el,
               (double)(s.fused_symbolic_calls + s.fused_specialized_calls) / (double)s.calls,
               (double)s.fused_specialized_calls / (double)s.calls, (unsigned long long)s.specialized_bytes,
               (unsigned long long)peak, (unsigned long long)s.compiles, (unsigned long long)s.hot_shapes,
               (unsigned long long)s.specializations_demoted, (unsigned long long)s.specializations_over_budget);
        fflush(stdout);
        sj_runtime_destroy(rt);
    }
    w2_stream_free(&ws);
    return 0;
}
