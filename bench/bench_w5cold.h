/* w5 from a cold process, with the library's warm-up (issue 28): the
 * workload bench_cuda and bench_cpu both run as "w5cold" (public API only).
 *
 *   process start -> main -> sj_runtime_create -> the encoder layer's
 *   weights -> sj_fn_warmup over the declared buckets (S in pow2 16..512,
 *   or multiples of $SJ_W5COLD_MULT: edges 16, 32, ..., 512, blocking; on
 *   the GPU each bucket's graph is captured) -> ready -> the w5
 *   request stream (../shared/workloads/w5_lengths.txt), one after another
 *   on the same buffers.
 *
 * One JSON line: the phases' seconds (process_start_to_main_s from
 * /proc/self/stat, 10 ms resolution; runtime_create_s, weights_s,
 * warmup_s; to_ready_s counts all of them), then the stream's total,
 * p50/p99/max latency, and how it was served: eager, fused and graph calls
 * and their shares, compiles and traces during the stream, then the same
 * stream again (warm_*: the warm process) (the default
 * policy still specializes shapes hot past specialize_threshold, in the
 * background). Run it alone, as the first thing of its process, with no
 * persistent kernel cache (cache_dir NULL here, or $SJ_W5COLD_CACHE for a
 * warm process's figure; the CUDA driver's own compute cache is outside
 * the library: empty it for a cold figure). */
#ifndef SJ_BENCH_W5COLD_H
#define SJ_BENCH_W5COLD_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench/bench_util.h"
#include "jit/shapejit.h"

/* Seconds since this process started (from /proc/self/stat's starttime,
 * in clock ticks since boot, against CLOCK_BOOTTIME); -1 if unknown. */
static inline double w5c_since_exec_s(void) {
    FILE *f = fopen("/proc/self/stat", "r");
    if (!f) return -1;
    char buf[4096];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *p = strrchr(buf, ')'); /* the command may hold spaces */
    if (!p) return -1;
    unsigned long long start = 0;
    /* fields after the command: state is field 3; starttime is field 22 */
    if (sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d %*d %*d %llu", &start) != 1)
        return -1;
    struct timespec ts;
    clock_gettime(CLOCK_BOOTTIME, &ts);
    double now = (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
    return now - (double)start / (double)sysconf(_SC_CLK_TCK);
}

/* A tensor of rt's device, uniform in [lo, hi) (never zeros). */
static inline sj_tensor w5c_rand(sj_runtime *rt, sj_dtype dt, int rank, const int64_t *shape, float lo, float hi,
                                 uint64_t *rng) {
    sj_tensor t = sj_tensor_make(NULL, dt, rank, shape);
    t.device = sj_runtime_backend(rt) == SJ_BACKEND_CUDA ? SJ_CUDA : SJ_HOST;
    if (sj_tensor_alloc(rt, &t)) bench_die("w5cold: alloc");
    int64_t n = sj_tensor_numel(&t);
    float *h = malloc(sizeof *h * (size_t)(n ? n : 1));
    if (!h) bench_die("w5cold: host buffer");
    bench_fill_rand(h, (size_t)n, lo, hi, rng);
    sj_tensor ht = sj_tensor_make(h, SJ_F32, rank, shape);
    if (sj_tensor_copy(rt, &t, &ht)) bench_die("w5cold: copy"); /* converts to dt */
    free(h);
    return t;
}

/* The w4 encoder layer's weights (BENCH_H, BENCH_FF) on rt's device in dt,
 * drawn from *rng in this order: products uniform in +-1/sqrt(fan-in),
 * biases in +-0.02, norm gains in [0.9, 1.1). */
static inline void bench_encoder_rand(sj_runtime *rt, sj_dtype dt, bench_encoder *w, uint64_t *rng) {
    const int64_t H = BENCH_H, FF = BENCH_FF, H3 = 3 * BENCH_H;
    float si = 1.0f / 27.7128f /* 1/sqrt(768) */, sf = 1.0f / 55.4256f /* 1/sqrt(3072) */;
    w->wqkv = w5c_rand(rt, dt, 2, (int64_t[]){H, H3}, -si, si, rng);
    w->bqkv = w5c_rand(rt, dt, 1, &H3, -0.02f, 0.02f, rng);
    w->wo = w5c_rand(rt, dt, 2, (int64_t[]){H, H}, -si, si, rng);
    w->bo = w5c_rand(rt, dt, 1, &H, -0.02f, 0.02f, rng);
    w->g1 = w5c_rand(rt, dt, 1, &H, 0.9f, 1.1f, rng);
    w->b1 = w5c_rand(rt, dt, 1, &H, -0.02f, 0.02f, rng);
    w->w1 = w5c_rand(rt, dt, 2, (int64_t[]){H, FF}, -si, si, rng);
    w->bf1 = w5c_rand(rt, dt, 1, &FF, -0.02f, 0.02f, rng);
    w->w2 = w5c_rand(rt, dt, 2, (int64_t[]){FF, H}, -sf, sf, rng);
    w->bf2 = w5c_rand(rt, dt, 1, &H, -0.02f, 0.02f, rng);
    w->g2 = w5c_rand(rt, dt, 1, &H, 0.9f, 1.1f, rng);
    w->b2 = w5c_rand(rt, dt, 1, &H, -0.02f, 0.02f, rng);
}

/* Frees what bench_encoder_rand made. */
static inline void bench_encoder_free(sj_runtime *rt, bench_encoder *w) {
    sj_tensor *all[] = {&w->wqkv, &w->bqkv, &w->wo, &w->bo, &w->g1, &w->b1,
                        &w->w1, &w->bf1, &w->w2, &w->bf2, &w->g2, &w->b2};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) sj_tensor_free(rt, all[i]);
}

/* Up to cap lengths from path (one integer per line, 1 .. 4096); exits on
 * a bad file. */
static inline int w5c_read_lengths(const char *path, int64_t *lens, int cap) {
    FILE *f = fopen(path, "r");
    if (!f) {
        perror(path);
        exit(1);
    }
    int n = 0;
    long v;
    while (n < cap && fscanf(f, "%ld", &v) == 1) {
        if (v < 1 || v > 4096) {
            fprintf(stderr, "%s: length %ld out of range [1, 4096]\n", path, v);
            exit(1);
        }
        lens[n++] = v;
    }
    fclose(f);
    if (!n) {
        fprintf(stderr, "%s: no lengths\n", path);
        exit(1);
    }
    return n;
}

/* t0_main: bench_now_s() at main's start. lengths: the stream; n of them. */
/* One pass of the request stream on buffers dx, dy (views of each
 * request's length); each request's latency (ms) in lat; the pass's
 * seconds. */
static inline double w5c_pass(sj_fn *fn, const sj_tensor *dx, const sj_tensor *dy, const int64_t *lens, int n,
                              double *lat) {
    double ts = bench_now_s();
    for (int i = 0; i < n; i++) {
        sj_tensor x = *dx, y = *dy;
        x.shape[1] = y.shape[1] = lens[i];
        x.stride[1] = y.stride[1] = BENCH_H;
        x.stride[0] = y.stride[0] = lens[i] * BENCH_H;
        double t = bench_now_s();
        if (sj_call(fn, &x, 1, &y, 1)) bench_die("w5cold: request");
        lat[i] = (bench_now_s() - t) * 1e3;
    }
    return bench_now_s() - ts;
}

/* The device's bucket graph counts so far: updates, copies made and the
 * ns they took, replays declined (their update failed) and the last one's
 * reason (zeros and "" without it). */
typedef struct w5c_bg {
    uint64_t updates, copies, copies_ns, declined;
    const char *why;
} w5c_bg;
/* Fills them (bench_cuda sets it: the CUDA backend's; NULL: none). */
static void (*w5c_bg_read)(sj_runtime *rt, w5c_bg *out);

static inline w5c_bg w5c_bg_now(sj_runtime *rt) {
    w5c_bg b = {.why = ""};
    if (w5c_bg_read) w5c_bg_read(rt, &b);
    return b;
}

static inline void bench_w5cold(sj_backend_kind backend, sj_dtype dt, double t0_main, double exec_to_main_s,
                                const int64_t *lens, int n) {
    uint64_t rng = 0x5DEECE66DULL;
    double t0 = bench_now_s();
    sj_runtime_config cfg;
    sj_runtime_config_init(&cfg);
    cfg.backend = backend;
    /* cold: no persistent kernel cache, unless $SJ_W5COLD_CACHE names one
     * (a warm process: a first run fills it, the next loads from it) */
    const char *cache_env = getenv("SJ_W5COLD_CACHE");
    cfg.cache_dir = cache_env && *cache_env ? cache_env : NULL;
    sj_runtime *rt;
    if (sj_runtime_create(&cfg, &rt)) {
        printf("{\"workload\": \"w5cold\", \"skipped\": \"%s\"}\n", sj_last_error());
        return;
    }
    double t_rt = bench_now_s();
    const int64_t H = BENCH_H;
    bench_encoder w;
    bench_encoder_rand(rt, dt, &w, &rng);
    sj_fn *fn;
    if (sj_fn_create(rt, "w5cold", 1, bench_w4_model, &w, NULL, &fn)) bench_die("w5cold: sj_fn_create");
    /* the declared buckets: pow2 16..512 (default), or multiples of N up to
     * 512 ($SJ_W5COLD_MULT=N) */
    const char *mult_env = getenv("SJ_W5COLD_MULT");
    int64_t mult = mult_env ? atoll(mult_env) : 0;
    enum { EDGES = 64 };
    int64_t edges[EDGES];
    int n_edges = 0;
    if (mult > 0 && mult <= 512) {
        for (int64_t S = mult; S < 512 + mult && n_edges < EDGES; S += mult) edges[n_edges++] = S;
        if (sj_set_buckets(fn, 0, 1, edges, n_edges)) bench_die("w5cold: buckets");
    } else {
        mult = 0;
        for (int64_t S = 16; S <= 512; S *= 2) edges[n_edges++] = S;
        if (sj_set_buckets_pow2(fn, 0, 1, 16, 512)) bench_die("w5cold: buckets");
    }
    int64_t max_len = 1, cap_len = edges[n_edges - 1]; /* the buffers: up to the last edge, or the longest request */
    for (int i = 0; i < n; i++) max_len = lens[i] > max_len ? lens[i] : max_len;
    if (max_len > cap_len) cap_len = max_len;
    sj_tensor dx = w5c_rand(rt, dt, 3, (int64_t[]){1, cap_len, H}, -1, 1, &rng);
    sj_tensor dy = w5c_rand(rt, dt, 3, (int64_t[]){1, cap_len, H}, -1, 1, &rng);
    double t_w = bench_now_s();

    /* the declared buckets' edges, on inputs the runtime makes: on the GPU
     * each bucket's graph is captured now (cfg.bucket_graphs), and serves
     * every size of the bucket; $SJ_W5COLD_EXACT=1: on the request
     * buffers (views of the edge's length), so that each edge's exact
     * shape and buffers get a graph of their own too (6 more captures,
     * for the 32 requests of an edge's length) */
    const char *exact_env = getenv("SJ_W5COLD_EXACT");
    int exact = exact_env && atoi(exact_env) != 0;
    sj_tensor in[EDGES], out[EDGES];
    int ne = 0;
    for (int i = 0; i < n_edges && edges[i] <= cap_len; i++) {
        int64_t S = edges[i];
        in[ne] = dx, out[ne] = dy;
        in[ne].shape[1] = out[ne].shape[1] = S;
        for (int k = 2; k >= 0; k--) { /* contiguous strides of the view */
            in[ne].stride[k] = k == 2 ? 1 : in[ne].stride[k + 1] * in[ne].shape[k + 1];
            out[ne].stride[k] = in[ne].stride[k];
        }
        if (!exact) in[ne].data = NULL;
        ne++;
    }
    sj_warmup_spec spec = {.n_shapes = ne, .shapes = in, .outputs = exact ? out : NULL, .n_outputs = exact ? 1 : 0};
    sj_status wst = sj_fn_warmup(fn, &spec, 0);
    if (wst) fprintf(stderr, "w5cold: warm-up: %s\n", sj_last_error());
    double t_ready = bench_now_s();
    sj_warmup_status ws;
    sj_fn_warmup_status(fn, &ws);
    sj_stats s0;
    sj_fn_stats(fn, &s0);
    w5c_bg b0 = w5c_bg_now(rt); /* the warm-up's copies */

    double *lat = malloc(sizeof *lat * (size_t)n), *sorted = malloc(sizeof *sorted * (size_t)n);
    if (!lat || !sorted) bench_die("w5cold: latencies");
    double total = w5c_pass(fn, &dx, &dy, lens, n, lat);
    sj_stats s1;
    sj_fn_stats(fn, &s1);
    w5c_bg b1 = w5c_bg_now(rt);
    /* the same stream again: the warm process */
    double *wsorted = malloc(sizeof *wsorted * (size_t)n);
    if (!wsorted) bench_die("w5cold: latencies");
    double warm_total = w5c_pass(fn, &dx, &dy, lens, n, wsorted);
    sj_stats s2;
    sj_fn_stats(fn, &s2);
    w5c_bg b2 = w5c_bg_now(rt);
    int slow = 0; /* the first pass's slowest request */
    for (int i = 0; i < n; i++)
        if (lat[i] > lat[slow]) slow = i;
    qsort(wsorted, (size_t)n, sizeof *wsorted, bench_cmp_double);
    memcpy(sorted, lat, sizeof *lat * (size_t)n);
    qsort(sorted, (size_t)n, sizeof *sorted, bench_cmp_double);
#define Q(p) sorted[(int)((p) * n) < n - 1 ? (int)((p) * n) : n - 1]
#define WQ(p) wsorted[(int)((p) * n) < n - 1 ? (int)((p) * n) : n - 1]
    uint64_t fused = s1.fused_symbolic_calls + s1.fused_specialized_calls;
    printf("{\"workload\": \"w5cold\", \"mode\": \"auto_warmup\", \"backend\": \"%s\", \"dtype\": \"%s\", "
           "\"requests\": %d, \"process_start_to_main_s\": %.3f, \"runtime_create_s\": %.3f, \"weights_s\": %.3f, "
           "\"warmup_s\": %.3f, \"to_ready_s\": %.3f, \"warmup_shapes\": %d, \"warmup_failed\": %d, "
           "\"warmup_compiles\": %llu, \"warmup_compiler_runs\": %llu, \"warmup_compile_ms\": %.0f, "
           "\"warmup_tune_ms\": %.0f, \"warmup_graphs\": %llu, \"total_s\": %.4f, \"p50_ms\": %.4f, "
           "\"p99_ms\": %.4f, \"max_ms\": %.3f, \"max_over_p50\": %.1f, \"eager_calls\": %llu, \"fused_calls\": %llu, "
           "\"graph_calls\": %llu, \"bucket_graph_calls\": %llu, \"fused_share\": %.3f, \"graph_share\": %.3f, \"compiles_during\": %llu, "
           "\"traces_during\": %llu, \"buckets\": \"%s\", \"exact_graphs\": %d, \"warm_total_s\": %.4f, "
           "\"warm_p50_ms\": %.4f, \"warm_p99_ms\": %.4f, \"warm_max_ms\": %.3f, \"warm_p99_over_p50\": %.2f, "
           "\"bucket_graph_updates\": %llu, \"warm_bucket_graph_calls\": %llu, \"warm_graph_calls\": %llu, "
           "\"warm_eager_calls\": %llu, \"warm_compiles_during\": %llu, \"warm_bucket_graph_updates\": %llu, "
           "\"warmup_graph_copies\": %llu, \"warmup_graph_copies_ms\": %.1f, \"slowest_len\": %lld, "
           "\"bucket_graph_declined\": %llu, \"declined_why\": \"%s\"}\n",
           backend == SJ_BACKEND_CUDA ? "cuda" : "cpu", sj_dtype_name(dt), n, exec_to_main_s, t_rt - t0, t_w - t_rt,
           t_ready - t_w, (exec_to_main_s > 0 ? exec_to_main_s : 0) + (t_ready - t0_main), ws.total, ws.failed,
           (unsigned long long)s0.compiles,
           (unsigned long long)(s0.compiles - s0.compile_cache_hits), s0.compile_ms, s0.tune_ms,
           (unsigned long long)s0.graphs, total, Q(0.5), Q(0.99), sorted[n - 1],
           sorted[n - 1] / Q(0.5), (unsigned long long)s1.eager_calls, (unsigned long long)fused,
           (unsigned long long)s1.graph_calls, (unsigned long long)s1.bucket_graph_calls, (double)fused / n, (double)s1.graph_calls / n,
           (unsigned long long)(s1.compiles - s0.compiles), (unsigned long long)(s1.traces - s0.traces),
           mult ? (mult_env) : "pow2", exact, warm_total, WQ(0.5), WQ(0.99), wsorted[n - 1], WQ(0.99) / WQ(0.5),
           (unsigned long long)(b1.updates - b0.updates), (unsigned long long)(s2.bucket_graph_calls - s1.bucket_graph_calls),
           (unsigned long long)(s2.graph_calls - s1.graph_calls), (unsigned long long)(s2.eager_calls - s1.eager_calls),
           (unsigned long long)(s2.compiles - s1.compiles), (unsigned long long)(b2.updates - b1.updates),
           (unsigned long long)b0.copies, (double)b0.copies_ns / 1e6, (long long)lens[slow], (unsigned long long)b2.declined,
           b2.why);
#undef Q
#undef WQ
    fflush(stdout);
    free(lat);
    free(sorted);
    free(wsorted);
    sj_tensor_free(rt, &dx);
    sj_tensor_free(rt, &dy);
    sj_fn_destroy(fn);
    bench_encoder_free(rt, &w);
    sj_runtime_destroy(rt);
}

#endif
