/* CPU benchmarks for the shared workloads (../shared/workloads/README.md).
 *
 *   bench_cpu [--quick] [--workloads ceiling,w0,dispatch,w1,w2,w3,kernels,time_to_fused,warm_start,loaded,w5cold,epilogue,smallmm,pool,dtypes,evmem]
 *             [--lengths file]
 *
 * dtypes (not in the default set): the w4 encoder layer fused in f32, f16
 * and bf16, S = 16, 128, 512, 1 and 2 threads (bench_dtypes). evmem (not
 * in the default set): the eager executor's peak memory against the fused
 * plan's arena, w4 at 32 x 254 tokens (bench_evmem).
 * epilogue (not in the default set): the feed-forward block with its
 * products' epilogues inside them against apart (cfg.fuse_epilogue), calls
 * interleaved in one process (bench_epilogue).
 * loaded (not in the default set): time to fused with 2x as many calling
 * threads as CPUs, cold and warm cache. w5cold (not in the default set;
 * run it alone): w5 (f32 here) from a cold process with the library's
 * warm-up of the declared buckets first, as bench_cuda's
 * (bench/bench_w5cold.h); --lengths (default: the sample's copy of
 * w5_lengths.txt); --quick: its first 200 requests.
 *
 * w1-w3 run in three modes: eager, fused_static, fused_symbolic; dispatch
 * is w0's call from 1, 2, 4, ... threads at once on one function.
 *
 * Prints one JSON object per line. Times are wall-clock medians of many
 * repetitions after a warm-up; inputs are random (never zeros). The memcpy
 * ceiling is measured in the same run (256 MiB buffers, the fastest of 9
 * copies), single-threaded and over all CPUs (of_ceiling_mt: the fused
 * kernels' threads), counting bytes read plus bytes written as the peer
 * does; and over all CPUs with non-temporal stores (of_stream_copy_mt), the
 * bar for kernels that stream their outputs.
 */
#include <math.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <time.h>
#include <unistd.h>

#include "bench/bench_util.h"
#include "bench/bench_w5cold.h"
#include "base/clock.h"
#include "jit/shapejit.h"
#include "jit/compile.h"
#include "jit/runtime.h"
#include "kernels/cpu/eager.h"
#include "kernels/cpu/prepack.h"
#include "kernels/cpu/threads.h"

static int quick;

/* -- Helpers ------------------------------------------------------------------- */

static uint64_t rng = 0x243F6A8885A308D3ull;
static float *rand_f32(size_t n, float lo, float hi) {
    float *p = aligned_alloc(64, (n * sizeof *p + 63) / 64 * 64);
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    bench_fill_rand(p, n, lo, hi, &rng);
    return p;
}

/* Repetitions so that a measurement takes about `budget` seconds. */
static int reps_for(double one_call_s, double budget, int lo, int hi) {
    int r = one_call_s > 0 ? (int)(budget / one_call_s) : hi;
    return r < lo ? lo : r > hi ? hi : r;
}

typedef struct call_ctx {
    sj_fn *fn;
    sj_tensor *in, *out;
    int n_in, n_out;
} call_ctx;

static double time_call_ms(call_ctx *c) {
    double t0 = bench_now_s();
    sj_status st = sj_call(c->fn, c->in, c->n_in, c->out, c->n_out);
    double t = bench_now_s() - t0;
    if (st) {
        fprintf(stderr, "sj_call failed: %s\n", sj_last_error());
        exit(1);
    }
    return t * 1e3;
}

static double median_ms(call_ctx *c) {
    double first = time_call_ms(c); /* traces */
    first = time_call_ms(c);
    int reps = reps_for(first * 1e-3, quick ? 0.3 : 1.5, 3, 200);
    double *t = malloc((size_t)reps * sizeof *t);
    for (int i = 0; i < reps; i++) t[i] = time_call_ms(c);
    qsort(t, (size_t)reps, sizeof *t, bench_cmp_double);
    double m = t[reps / 2];
    free(t);
    return m;
}

/* -- Ceiling -------------------------------------------------------------------- */

static double ceiling_GBps, ceiling_mt_GBps, stream_mt_GBps;

typedef struct copy_part {
    char *dst;
    const char *src;
    size_t n;
    bool stream;
} copy_part;

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HAVE_STREAM_COPY 1
/* A copy with non-temporal stores (no read for ownership): the bar for
 * kernels that stream their outputs (dst 32-byte aligned, n a multiple of
 * 32). */
__attribute__((target("avx"))) static void stream_copy(char *dst, const char *src, size_t n) {
    for (size_t i = 0; i < n; i += 32)
        _mm256_stream_ps((float *)(dst + i), _mm256_loadu_ps((const float *)(src + i)));
    _mm_sfence();
}
#else
#define HAVE_STREAM_COPY 0
static void stream_copy(char *dst, const char *src, size_t n) { memcpy(dst, src, n); }
#endif

static void *copy_main(void *arg) {
    copy_part *p = arg;
    if (p->stream) stream_copy(p->dst, p->src, p->n);
    else memcpy(p->dst, p->src, p->n);
    return NULL;
}

/* memcpy (or stream_copy) split over n threads: the bandwidth threaded
 * kernels can reach. */
static double copy_mt(char *dst, const char *src, size_t n, int threads, bool stream) {
    pthread_t th[64];
    copy_part parts[64];
    size_t part = n / (size_t)threads / 64 * 64;
    double t0 = bench_now_s();
    for (int i = 0; i < threads; i++) {
        size_t a = part * (size_t)i, b = i == threads - 1 ? n : part * (size_t)(i + 1);
        parts[i] = (copy_part){dst + a, src + a, b - a, stream};
        pthread_create(&th[i], NULL, copy_main, &parts[i]);
    }
    for (int i = 0; i < threads; i++) pthread_join(th[i], NULL);
    return bench_now_s() - t0;
}

static void bench_ceiling(void) {
    /* bytes per buffer: 256 MiB, the order of the largest workloads'
     * inputs (w1: 268 MB), so that a large L3 (300 MiB on some servers)
     * does not hold the copy; --quick: 32 MiB */
    size_t n = (size_t)(quick ? 32 : 256) << 20;
    char *src = (char *)rand_f32(n / 4, -1, 1), *dst = (char *)rand_f32(n / 4, -1, 1);
    double best[9];
    for (int i = 0; i < 9; i++) {
        double t0 = bench_now_s();
        memcpy(dst, src, n);
        best[i] = bench_now_s() - t0;
    }
    /* the fastest of 9 copies: memory bandwidth on a shared (virtualised)
     * host varies from copy to copy far more than the kernels do, and the
     * peak is the stricter bar */
    qsort(best, 9, sizeof best[0], bench_cmp_double);
    ceiling_GBps = 2.0 * (double)n / best[0] / 1e9;
    int threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
    threads = threads < 1 ? 1 : threads > 64 ? 64 : threads;
    for (int i = 0; i < 9; i++) best[i] = copy_mt(dst, src, n, threads, false);
    qsort(best, 9, sizeof best[0], bench_cmp_double);
    ceiling_mt_GBps = 2.0 * (double)n / best[0] / 1e9;
    /* with non-temporal stores, where the CPU has AVX: a copy without the
     * read for ownership, which memcpy pays at these sizes on some hosts */
    stream_mt_GBps = ceiling_mt_GBps;
#if HAVE_STREAM_COPY
    if (__builtin_cpu_supports("avx")) {
        for (int i = 0; i < 9; i++) best[i] = copy_mt(dst, src, n, threads, true);
        qsort(best, 9, sizeof best[0], bench_cmp_double);
        stream_mt_GBps = 2.0 * (double)n / best[0] / 1e9;
    }
#endif
    printf("{\"workload\": \"ceiling\", \"backend\": \"cpu\", \"copy_GBps_read_plus_write\": %.2f, "
           "\"copy_mt_GBps\": %.2f, \"stream_copy_mt_GBps\": %.2f, \"threads\": %d, \"bytes\": %zu}\n",
           ceiling_GBps, ceiling_mt_GBps, stream_mt_GBps, threads, n);
    free(src);
    free(dst);
}

/* -- w0: dispatch --------------------------------------------------------------- */


static void bench_w0(sj_runtime *rt) {
    sj_fn *fn;
    if (sj_fn_create(rt, "w0", 1, bench_w0_model, NULL, NULL, &fn)) exit(1);
    float *x = rand_f32(8, -1, 1), y[8], one = 1.0f;
    sj_tensor in = sj_tensor_make(x, SJ_F32, 1, (int64_t[]){8}), out = sj_tensor_make(y, SJ_F32, 1, (int64_t[]){8});
    call_ctx c = {fn, &in, &out, 1, 1};
    int reps = quick ? 20000 : 200000;
    double *t = malloc((size_t)reps * sizeof *t);
    for (int i = 0; i < 1000; i++) time_call_ms(&c);
    /* Batches of 100 calls: the clock read costs about as much as a call. */
    int batches = reps / 100;
    for (int b = 0; b < batches; b++) {
        double t0 = bench_now_s();
        for (int i = 0; i < 100; i++) sj_call(fn, &in, 1, &out, 1);
        t[b] = (bench_now_s() - t0) / 100 * 1e6;
    }
    qsort(t, (size_t)batches, sizeof *t, bench_cmp_double);
    double call_us = t[batches / 2];

    /* The kernel alone, as the eager executor calls it. */
    sj_tensor s = {.data = &one, .dtype = SJ_F32, .rank = 1, .shape = {8}, .stride = {0}};
    for (int b = 0; b < batches; b++) {
        double t0 = bench_now_s();
        for (int i = 0; i < 100; i++) sj_cpu_binary(SJ_OP_ADD, &in, &s, &out);
        t[b] = (bench_now_s() - t0) / 100 * 1e6;
    }
    qsort(t, (size_t)batches, sizeof *t, bench_cmp_double);
    double kern_us = t[batches / 2];
    printf("{\"workload\": \"w0\", \"mode\": \"eager\", \"backend\": \"cpu\", \"host_us_per_call\": %.4f, "
           "\"kernel_us\": %.4f, \"overhead_us\": %.4f}\n",
           call_us, kern_us, call_us - kern_us);
    free(t);
    free(x);
    sj_fn_destroy(fn);
}

/* -- Dispatch from many threads ------------------------------------------------- */

/* w0's call (x + 1 over 8 floats) from T threads at once on one function,
 * as a server's workers call it: host nanoseconds a call per thread and
 * calls a second in all, T = 1, 2, 4, ... up to the CPUs. State that
 * every call writes and threads share (counters, locks, free lists) shows
 * as per-call time growing with T. Modes: eager (no compiles), a static
 * entry fused, a symbolic entry fused (default thresholds: its shape gets
 * specialized kernels after 16 calls, as a server's hot shapes do). */
typedef struct disp_job {
    sj_fn *fn;
    int reps;
    pthread_barrier_t *start;
    double t0, t1; /* the thread's own clock around its calls */
} disp_job;

static void *disp_thread(void *arg) {
    disp_job *j = arg;
    float x[8], y[8];
    for (int i = 0; i < 8; i++) x[i] = 0.125f * (float)i - 0.4f;
    sj_tensor in = sj_tensor_make(x, SJ_F32, 1, (int64_t[]){8}), out = sj_tensor_make(y, SJ_F32, 1, (int64_t[]){8});
    pthread_barrier_wait(j->start);
    j->t0 = bench_now_s();
    for (int i = 0; i < j->reps; i++)
        if (sj_call(j->fn, &in, 1, &out, 1)) bench_die("sj_call");
    j->t1 = bench_now_s();
    return NULL;
}

static void bench_dispatch(void) {
    static const char *modes[3] = {"eager", "fused_static", "fused_symbolic"};
    int ncpu = (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (ncpu < 2) ncpu = 2;
    if (ncpu > 64) ncpu = 64;
    int reps = quick ? 20000 : 200000;
    int threads[8], n_threads = 0; /* 1, 2, 4, ... below ncpu, then ncpu */
    for (int T = 1; T < ncpu; T *= 2) threads[n_threads++] = T;
    threads[n_threads++] = ncpu;
    for (int mode = 0; mode < 3; mode++) {
        sj_runtime_config cfg;
        sj_runtime_config_init(&cfg);
        cfg.backend = SJ_BACKEND_CPU;
        cfg.compile_mode = mode ? SJ_COMPILE_SYNC : SJ_COMPILE_OFF;
        cfg.cache_dir = NULL;
        cfg.exec_threads = 1; /* 8 elements: the callers' own threads run them */
        sj_runtime *rt;
        if (sj_runtime_create(&cfg, &rt)) bench_die("sj_runtime_create");
        sj_fn_options o;
        sj_fn_options_init(&o);
        o.dynamic = mode == 2 ? SJ_DYNAMIC_SYMBOLIC : SJ_DYNAMIC_STATIC;
        sj_fn *fn;
        if (sj_fn_create(rt, "dispatch", 1, bench_w0_model, NULL, &o, &fn)) bench_die("sj_fn_create");
        for (int ti = 0; ti < n_threads; ti++) {
            int T = threads[ti];
            double best = 1e30;
            for (int r = 0; r < 3; r++) { /* the fastest of 3: a shared VM's neighbours add noise */
                /* timed by the workers themselves, from the first start to
                 * the last end: this thread may not run when they start */
                pthread_barrier_t start;
                pthread_barrier_init(&start, NULL, (unsigned)T);
                pthread_t th[64];
                disp_job j[64];
                for (int t = 0; t < T; t++) {
                    j[t] = (disp_job){fn, reps, &start, 0, 0};
                    pthread_create(&th[t], NULL, disp_thread, &j[t]);
                }
                double t0 = 1e300, t1 = 0;
                for (int t = 0; t < T; t++) {
                    pthread_join(th[t], NULL);
                    t0 = j[t].t0 < t0 ? j[t].t0 : t0;
                    t1 = j[t].t1 > t1 ? j[t].t1 : t1;
                }
                double secs = t1 - t0;
                pthread_barrier_destroy(&start);
                if (secs < best) best = secs;
            }
            sj_stats st;
            sj_fn_stats(fn, &st);
            printf("{\"workload\": \"dispatch\", \"mode\": \"%s\", \"backend\": \"cpu\", \"threads\": %d, "
                   "\"ns_per_call\": %.1f, \"Mcalls_per_s\": %.2f, \"eager_calls\": %llu}\n",
                   modes[mode], T, best / reps * 1e9, (double)T * reps / best / 1e6,
                   (unsigned long long)st.eager_calls);
            fflush(stdout);
        }
        sj_fn_destroy(fn);
        sj_runtime_destroy(rt);
    }
}

/* -- w1-w3 ------------------------------------------------------------------------- */




/* Inputs of one workload at size S. */
typedef struct wl_case {
    sj_tensor in[4], out[2];
    void *bufs[6];
    int n_in, n_out;
    double bytes;
} wl_case;

static void case_free(wl_case *c) {
    for (int i = 0; i < 6; i++) free(c->bufs[i]);
}

static sj_tensor rand_t(wl_case *c, int k, int rank, const int64_t *shape, float lo, float hi) {
    size_t n = 1;
    for (int i = 0; i < rank; i++) n *= (size_t)shape[i];
    c->bufs[k] = rand_f32(n ? n : 1, lo, hi);
    return sj_tensor_make(c->bufs[k], SJ_F32, rank, shape);
}

static void w1_case(wl_case *c, int64_t S) {
    int64_t H = 4096;
    memset(c, 0, sizeof *c);
    c->n_in = 3, c->n_out = 1;
    c->in[0] = rand_t(c, 0, 2, (int64_t[]){S, H}, -2, 2);
    c->in[1] = rand_t(c, 1, 1, &H, -2, 2);
    c->in[2] = rand_t(c, 2, 1, &H, -2, 2);
    c->out[0] = rand_t(c, 3, 2, (int64_t[]){S, H}, -1, 1);
    c->bytes = (2.0 * S * H + 2.0 * H) * 4;
}

static void w2_case(wl_case *c, int64_t S) {
    int64_t H = 768;
    memset(c, 0, sizeof *c);
    c->n_in = 4, c->n_out = 2;
    c->in[0] = rand_t(c, 0, 2, (int64_t[]){S, H}, -2, 2);
    c->in[1] = rand_t(c, 1, 2, (int64_t[]){S, H}, -2, 2);
    c->in[2] = rand_t(c, 2, 1, &H, 0.5f, 1.5f);
    c->in[3] = rand_t(c, 3, 1, &H, -0.5f, 0.5f);
    c->out[0] = rand_t(c, 4, 2, (int64_t[]){S, H}, -1, 1);
    c->out[1] = rand_t(c, 5, 2, (int64_t[]){S, H}, -1, 1);
    c->bytes = (4.0 * S * H + 2.0 * H) * 4;
}

static void w3_case(wl_case *c, int64_t S) {
    int64_t BH = 12;
    memset(c, 0, sizeof *c);
    c->n_in = 2, c->n_out = 1;
    c->in[0] = rand_t(c, 0, 3, (int64_t[]){BH, S, S}, -3, 3);
    c->in[1] = rand_t(c, 1, 3, (int64_t[]){BH, 1, S}, -1, 1);
    float *m = c->bufs[1];
    for (int64_t k = 0; k < BH * S; k++) m[k] = (k % S) < (S * 3) / 4 ? 0.0f : -1e4f;
    c->out[0] = rand_t(c, 2, 3, (int64_t[]){BH, S, S}, -1, 1);
    c->bytes = (2.0 * BH * S * S + BH * S) * 4;
}

typedef struct workload {
    const char *name;
    sj_model_fn model;
    void (*make)(wl_case *c, int64_t S);
    int64_t sizes[6];
    int n_sizes, n_quick;
} workload;

static const workload workloads[] = {
    {"w1", bench_w1_model, w1_case, {1, 17, 128, 1000, 4096, 16384}, 6, 4},
    {"w2", bench_w2_model, w2_case, {1, 17, 128, 1000, 4096, 32768}, 6, 4},
    {"w3", bench_w3_model, w3_case, {16, 100, 512, 1024, 2048}, 5, 3},
};

/* Modes: eager (no compiling), fused_static (each size its own entry, every
 * size a constant), fused_symbolic (one entry, sizes passed at run time:
 * specialization of hot shapes disabled). Compiles are synchronous and out
 * of the timed region (the first call compiles, the timing starts after). */



static void bench_workload(const workload *w) {
    for (int mode = 0; mode < 3; mode++) {
        sj_runtime *rt = bench_runtime(SJ_BACKEND_CPU, (bench_mode)mode);
        sj_fn *fn = NULL;
        int ns = quick ? w->n_quick : w->n_sizes;
        for (int i = 0; i < ns; i++) {
            wl_case c;
            w->make(&c, w->sizes[i]);
            if (!fn) fn = bench_fn(rt, w->name, c.n_in, w->model, (bench_mode)mode);
            call_ctx cc = {fn, c.in, c.out, c.n_in, c.n_out};
            double ms = median_ms(&cc);
            sj_stats st;
            sj_fn_stats(fn, &st);
            double gbs = c.bytes / (ms * 1e-3) / 1e9;
            printf("{\"workload\": \"%s\", \"mode\": \"%s\", \"backend\": \"cpu\", \"dtype\": \"float32\", \"S\": %lld, "
                   "\"median_ms\": %.4f, \"GBps\": %.3f, \"of_ceiling\": %.3f, \"of_ceiling_mt\": %.3f, "
                   "\"of_stream_copy_mt\": %.3f, \"compiles\": %llu, \"eager_calls\": %llu}\n",
                   w->name, bench_mode_names[mode], (long long)w->sizes[i], ms, gbs, gbs / ceiling_GBps, gbs / ceiling_mt_GBps,
                   gbs / stream_mt_GBps, (unsigned long long)st.compiles, (unsigned long long)st.eager_calls);
            fflush(stdout);
            case_free(&c);
        }
        sj_runtime_destroy(rt);
    }
}

/* Time from the first sight of a shape to its fused kernels being ready, in
 * the default (async) mode: one call, then wait for the background compile. */
static void bench_time_to_fused(void) {
    double t[32];
    int n = 0;
    for (size_t k = 0; k < sizeof workloads / sizeof workloads[0]; k++) {
        const workload *w = &workloads[k];
        for (int i = 0; i < 3 && n < 32; i++) {
            sj_runtime_config cfg;
            sj_runtime_config_init(&cfg);
            cfg.cache_dir = NULL;
            sj_runtime *rt;
            if (sj_runtime_create(&cfg, &rt)) exit(1);
            wl_case c;
            w->make(&c, w->sizes[i + 1]);
            sj_fn_options o;
            sj_fn_options_init(&o);
            o.hot_threshold = 1;
            sj_fn *fn;
            if (sj_fn_create(rt, w->name, c.n_in, w->model, NULL, &o, &fn)) exit(1);
            call_ctx cc = {fn, c.in, c.out, c.n_in, c.n_out};
            time_call_ms(&cc);
            sj_fn_wait_idle(fn, -1);
            sj_entry_info info;
            sj_fn_entries(fn, &info, 1);
            if (info.time_to_fused_ms >= 0) t[n++] = info.time_to_fused_ms;
            case_free(&c);
            sj_runtime_destroy(rt);
        }
    }
    qsort(t, (size_t)n, sizeof t[0], bench_cmp_double);
    printf("{\"workload\": \"time_to_fused\", \"backend\": \"cpu\", \"shapes\": %d, \"median_ms\": %.1f, \"max_ms\": %.1f}\n",
           n, n ? t[n / 2] : -1.0, n ? t[n - 1] : -1.0);
}

/* Time to fused under load (issue 25.4): twice as many threads as CPUs call
 * w2 (S = 1000) on one function without pause, the default async mode; the
 * figure is the time from the first call to the first call served fused
 * (a thread sees it in the stats), capped. Three runs: a cold cache with
 * the compiler kept in the idle class for good (what the workers did
 * before: starved), a cold cache with the default rise to normal priority
 * after 1 s, and the same cache again warm. */
typedef struct load_ctx {
    sj_fn *fn;
    const workload *w;
    _Atomic int stop;
    _Atomic long calls;
} load_ctx;

static void *load_thread(void *arg) {
    load_ctx *l = arg;
    wl_case c;
    l->w->make(&c, 1000);
    while (!atomic_load_explicit(&l->stop, memory_order_relaxed)) {
        if (sj_call(l->fn, c.in, c.n_in, c.out, c.n_out)) {
            fprintf(stderr, "bench loaded: %s\n", sj_last_error());
            exit(1);
        }
        atomic_fetch_add_explicit(&l->calls, 1, memory_order_relaxed);
    }
    case_free(&c);
    return NULL;
}

static double loaded_run(const char *cache, int idle_ms, int threads, double cap_s, long *calls) {
    sj_runtime_config cfg;
    sj_runtime_config_init(&cfg);
    cfg.backend = SJ_BACKEND_CPU;
    cfg.cache_dir = cache;
    sj_runtime *rt;
    if (sj_runtime_create(&cfg, &rt)) exit(1);
    sj_compiler_set_idle_ms(rt->compiler, idle_ms);
    load_ctx l = {.w = &workloads[1]};
    if (sj_fn_create(rt, "loaded", 4, l.w->model, NULL, NULL, &l.fn)) exit(1);
    pthread_t *t = calloc((size_t)threads, sizeof *t);
    double t0 = bench_now_s(), ttf = -1;
    for (int i = 0; i < threads; i++) pthread_create(&t[i], NULL, load_thread, &l);
    while (bench_now_s() - t0 < cap_s) {
        sj_stats s;
        sj_fn_stats(l.fn, &s);
        if (s.fused_symbolic_calls + s.fused_specialized_calls) {
            ttf = bench_now_s() - t0;
            break;
        }
        nanosleep(&(struct timespec){0, 5000000}, NULL);
    }
    atomic_store(&l.stop, 1);
    for (int i = 0; i < threads; i++) pthread_join(t[i], NULL);
    free(t);
    *calls = atomic_load(&l.calls);
    double d0 = bench_now_s();
    sj_runtime_destroy(rt); /* kills a compile still running */
    double destroy_s = bench_now_s() - d0;
    if (destroy_s > 1) fprintf(stderr, "bench loaded: destroy took %.1f s\n", destroy_s);
    return ttf;
}

static void bench_loaded(void) {
    int cpus = (int)sysconf(_SC_NPROCESSORS_ONLN), threads = 2 * (cpus > 0 ? cpus : 1);
    double cap = quick ? 20 : 60;
    char dir[256];
    snprintf(dir, sizeof dir, "%s/sj-bench-loaded-XXXXXX", getenv("TMPDIR") && *getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(dir)) exit(1);
    char old[300];
    snprintf(old, sizeof old, "%s/idle", dir);
    struct { const char *name, *cache; int idle_ms; } runs[] = {
        {"cold_idle_forever", old, 1 << 30}, {"cold", dir, 1000}, {"warm", dir, 1000}};
    for (int r = 0; r < 3; r++) {
        long calls = 0;
        double ttf = loaded_run(runs[r].cache, runs[r].idle_ms, threads, cap, &calls);
        printf("{\"workload\": \"loaded_time_to_fused\", \"backend\": \"cpu\", \"run\": \"%s\", \"threads\": %d, "
               "\"cpus\": %d, \"time_to_fused_s\": %.2f, \"fused\": %s, \"cap_s\": %.0f, \"calls\": %ld}\n",
               runs[r].name, threads, cpus, ttf >= 0 ? ttf : cap, ttf >= 0 ? "true" : "false", cap, calls);
        fflush(stdout);
    }
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd)) {
    }
}

/* A warm second process: run the child twice over one cache directory; the
 * second must reach fused execution without running the compiler. */
static int child_warm(const char *dir) {
    sj_runtime_config cfg;
    sj_runtime_config_init(&cfg);
    cfg.cache_dir = dir;
    cfg.compile_mode = SJ_COMPILE_SYNC;
    sj_runtime *rt;
    if (sj_runtime_create(&cfg, &rt)) return 1;
    uint64_t compiles = 0, hits = 0, fused = 0;
    for (size_t k = 0; k < sizeof workloads / sizeof workloads[0]; k++) {
        const workload *w = &workloads[k];
        wl_case c;
        w->make(&c, w->sizes[1]);
        sj_fn_options o;
        sj_fn_options_init(&o);
        o.hot_threshold = 1;
        sj_fn *fn;
        if (sj_fn_create(rt, w->name, c.n_in, w->model, NULL, &o, &fn)) return 1;
        call_ctx cc = {fn, c.in, c.out, c.n_in, c.n_out};
        time_call_ms(&cc);
        sj_stats st;
        sj_fn_stats(fn, &st);
        compiles += st.compiles, hits += st.compile_cache_hits;
        fused += st.fused_specialized_calls + st.fused_symbolic_calls;
        case_free(&c);
    }
    printf("%llu %llu %llu\n", (unsigned long long)compiles, (unsigned long long)hits, (unsigned long long)fused);
    sj_runtime_destroy(rt);
    return 0;
}

static void bench_warm_start(const char *self) {
    char dir[] = "/tmp/sj_bench_cache_XXXXXX", cmd[512];
    if (!mkdtemp(dir)) return;
    unsigned long long r[2][3] = {{0}};
    for (int run = 0; run < 2; run++) {
        snprintf(cmd, sizeof cmd, "'%s' --child-warm '%s'", self, dir);
        FILE *p = popen(cmd, "r");
        if (!p || fscanf(p, "%llu %llu %llu", &r[run][0], &r[run][1], &r[run][2]) != 3) {
            fprintf(stderr, "warm-start child failed\n");
            if (p) pclose(p);
            return;
        }
        pclose(p);
    }
    printf("{\"workload\": \"warm_start\", \"backend\": \"cpu\", \"first_compiler_runs\": %llu, "
           "\"second_compiler_runs\": %llu, \"second_cache_hits\": %llu, \"second_fused_calls\": %llu}\n",
           r[0][0] - r[0][1], r[1][0] - r[1][1], r[1][1], r[1][2]);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd)) { /* best effort */
    }
}

/* -- Single eager kernels ---------------------------------------------------------- */

/* Bandwidth of individual eager elementwise kernels at the largest w1 size:
 * the figure the "half of memcpy" target is about. */
static void bench_kernels(void) {
    int64_t S = quick ? 2048 : 16384, Hd = 4096;
    size_t n = (size_t)(S * Hd);
    float *x = rand_f32(n, -2, 2), *z = rand_f32(n, -2, 2), *a = rand_f32(Hd, -2, 2), *y = rand_f32(n, -1, 1);
    sj_tensor tx = sj_tensor_make(x, SJ_F32, 2, (int64_t[]){S, Hd}), tz = sj_tensor_make(z, SJ_F32, 2, (int64_t[]){S, Hd});
    sj_tensor ty = sj_tensor_make(y, SJ_F32, 2, (int64_t[]){S, Hd});
    sj_tensor ta = {.data = a, .dtype = SJ_F32, .rank = 2, .shape = {S, Hd}, .stride = {0, 1}};
    struct {
        const char *name;
        int kind; /* 0 unary, 1 binary with z, 2 binary with row a */
        sj_op op;
        int streams;
    } ks[] = {{"add", 1, SJ_OP_ADD, 3}, {"mul_row", 2, SJ_OP_MUL, 2}, {"sigmoid", 0, SJ_OP_SIGMOID, 2},
              {"gelu", 0, SJ_OP_GELU, 2}, {"exp", 0, SJ_OP_EXP, 2}};
    for (size_t k = 0; k < sizeof ks / sizeof ks[0]; k++) {
        double t[7];
        for (int r = 0; r < 7; r++) {
            double t0 = bench_now_s();
            if (ks[k].kind == 0) sj_cpu_unary(ks[k].op, &tx, &ty);
            else sj_cpu_binary(ks[k].op, &tx, ks[k].kind == 1 ? &tz : &ta, &ty);
            t[r] = bench_now_s() - t0;
        }
        qsort(t, 7, sizeof t[0], bench_cmp_double);
        double gbs = ks[k].streams * (double)n * 4 / t[3] / 1e9;
        printf("{\"workload\": \"kernel\", \"mode\": \"eager\", \"backend\": \"cpu\", \"name\": \"%s\", \"S\": %lld, "
               "\"median_ms\": %.4f, \"GBps\": %.3f, \"of_ceiling\": %.3f}\n",
               ks[k].name, (long long)S, t[3] * 1e3, gbs, gbs / ceiling_GBps);
    }
    free(x), free(z), free(a), free(y);
}


/* -- Epilogues inside products (issue 29) ------------------------------------------ *
 * The MiniLM feed-forward block, f32, constant weights (packed once):
 * y = gelu(x @ W1 + b1) @ W2 + b2 + x, x [M, 384], W1 [384, 1536], W2
 * [1536, 384]; its plan has two products, each with its bias and an
 * epilogue group (the GELU; the residual add). Two runtimes in one process,
 * cfg.fuse_epilogue 1 (the epilogue inside the product) and 0 (a pass of
 * its own), each function compiled first (static shapes); then calls
 * alternate between the two, one each, so that load from other processes
 * falls on both alike. Reports each side's median, the median of the
 * per-pair ratios (apart / inside: above 1 means inside is faster), and
 * whether the outputs are bit-identical (they must be). */

static sj_tensor ep_w1, ep_b1, ep_w2, ep_b2;

static sj_status ep_model(sj_tracer *t, const sj_val *in, int n, void *u) {
    (void)n, (void)u;
    sj_val h = sj_gelu(t, sj_add(t, sj_matmul(t, in[0], sj_param(t, &ep_w1)), sj_param(t, &ep_b1)));
    sj_val y = sj_add(t, sj_matmul(t, h, sj_param(t, &ep_w2)), sj_param(t, &ep_b2));
    return sj_output(t, sj_add(t, y, in[0]));
}

static sj_tensor ep_tensor(int rank, int64_t a, int64_t b, float lo, float hi) {
    sj_tensor x = {.dtype = SJ_F32, .rank = rank, .device = SJ_HOST};
    x.shape[0] = a;
    if (rank > 1) x.shape[1] = b;
    for (int i = rank - 1; i >= 0; i--) x.stride[i] = i == rank - 1 ? 1 : x.stride[i + 1] * x.shape[i + 1];
    x.data = rand_f32((size_t)(a * (rank > 1 ? b : 1)), lo, hi);
    return x;
}

static void bench_epilogue(void) {
    enum { H = 384, FF = 1536 };
    ep_w1 = ep_tensor(2, H, FF, -0.05f, 0.05f), ep_b1 = ep_tensor(1, FF, 0, -0.1f, 0.1f);
    ep_w2 = ep_tensor(2, FF, H, -0.03f, 0.03f), ep_b2 = ep_tensor(1, H, 0, -0.1f, 0.1f);
    sj_runtime *rts[2];
    sj_fn *fns[2];
    for (int k = 0; k < 2; k++) {
        sj_runtime_config cfg;
        sj_runtime_config_init(&cfg);
        cfg.backend = SJ_BACKEND_CPU;
        cfg.compile_mode = SJ_COMPILE_SYNC;
        cfg.cache_dir = NULL;
        cfg.fuse_epilogue = 1 - k; /* 0: inside, 1: apart */
        if (sj_runtime_create(&cfg, &rts[k]) || sj_fn_create(rts[k], "ffn", 1, ep_model, NULL, NULL, &fns[k])) {
            fprintf(stderr, "%s\n", sj_last_error());
            exit(1);
        }
    }
    static const int64_t Ms[] = {16, 128, 512};
    for (int mi = 0; mi < (quick ? 2 : 3); mi++) {
        int64_t M = Ms[mi];
        sj_tensor x = ep_tensor(2, M, H, -1, 1), y[2];
        for (int k = 0; k < 2; k++) y[k] = ep_tensor(2, M, H, 0, 0);
        call_ctx cc[2] = {{fns[0], &x, &y[0], 1, 1}, {fns[1], &x, &y[1], 1, 1}};
        for (int k = 0; k < 2; k++)
            for (int i = 0; i < 4; i++) time_call_ms(&cc[k]); /* trace, compile, warm */
        double one = time_call_ms(&cc[0]);
        int reps = reps_for(one * 1e-3, quick ? 1.0 : 4.0, 20, 2000);
        double *t[2] = {malloc((size_t)reps * sizeof(double)), malloc((size_t)reps * sizeof(double))};
        double *ratio = malloc((size_t)reps * sizeof(double));
        sj_stats st0[2], st1[2];
        for (int k = 0; k < 2; k++) sj_fn_stats(fns[k], &st0[k]);
        for (int i = 0; i < reps; i++) {
            int first = i & 1; /* alternate which side goes first */
            t[first][i] = time_call_ms(&cc[first]);
            t[1 - first][i] = time_call_ms(&cc[1 - first]);
            ratio[i] = t[1][i] / t[0][i];
        }
        for (int k = 0; k < 2; k++) sj_fn_stats(fns[k], &st1[k]);
        bool same = !memcmp(y[0].data, y[1].data, (size_t)(M * H) * sizeof(float));
        for (int k = 0; k < 2; k++) qsort(t[k], (size_t)reps, sizeof(double), bench_cmp_double);
        qsort(ratio, (size_t)reps, sizeof(double), bench_cmp_double);
        printf("{\"workload\": \"epilogue_ffn\", \"backend\": \"cpu\", \"dtype\": \"float32\", \"M\": %lld, "
               "\"pairs\": %d, \"inside_ms\": %.4f, \"apart_ms\": %.4f, \"apart_over_inside\": %.3f, "
               "\"ratio_p25\": %.3f, \"ratio_p75\": %.3f, \"fused_calls\": [%llu, %llu], \"bit_identical\": %s}\n",
               (long long)M, reps, t[0][reps / 2], t[1][reps / 2], ratio[reps / 2], ratio[reps / 4],
               ratio[3 * reps / 4], (unsigned long long)(st1[0].calls - st1[0].eager_calls - st0[0].calls + st0[0].eager_calls),
               (unsigned long long)(st1[1].calls - st1[1].eager_calls - st0[1].calls + st0[1].eager_calls), same ? "true" : "false");
        fflush(stdout);
        free(t[0]), free(t[1]), free(ratio);
        free(x.data), free(y[0].data), free(y[1].data);
    }
    for (int k = 0; k < 2; k++) {
        sj_fn_destroy(fns[k]);
        sj_runtime_destroy(rts[k]);
    }
    free(ep_w1.data), free(ep_b1.data), free(ep_w2.data), free(ep_b2.data);
}

/* -- The kernel pool's hand-off (issue 27) --------------------------------------- *
 * A job of one chunk a thread, each chunk busy for POOL_WORK_US, on pools of
 * 2, 4, 8, ... and all CPUs, with spin times (sj_threads_set_spin_ns) of
 * 0, 50 us (the default) and 1 ms, calls back to back and a caller busy
 * for 20, 200 or 2000 us between calls (the other kernels of a request).
 * Ideal: POOL_WORK_US a call. Reports per (threads, spin, gap): median and
 * p90 us a call, the threads that ran a chunk (median), and the median of
 * the last helper's start after the job was handed off: a worker's join
 * latency (tens of us when it slept: an interrupt to an idle virtual CPU). */
#define POOL_WORK_US 10
#define POOL_MAX 64
static _Thread_local int pool_me = -1;
static _Atomic int pool_ids;
typedef struct pool_ctx {
    int64_t t0;                      /* the hand-off */
    _Atomic int64_t first[POOL_MAX]; /* each thread's first start after it, 0: none */
} pool_ctx;

static void pool_chunk(void *ctx, int64_t b, int64_t e) {
    pool_ctx *c = ctx;
    if (pool_me < 0) pool_me = atomic_fetch_add(&pool_ids, 1) % POOL_MAX;
    int64_t now = sj_now_ns(), zero = 0;
    atomic_compare_exchange_strong(&c->first[pool_me], &zero, now);
    for (int64_t end = now + (e - b) * POOL_WORK_US * 1000; sj_now_ns() < end;) {
    }
}

static void bench_pool(void) {
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    static const int64_t spins[] = {0, 50000, 1000000}, gaps[] = {0, 20, 200, 2000};
    for (int n = 2; n <= cpus && n <= POOL_MAX; n = n * 2 > cpus && n < cpus ? (int)cpus : n * 2) {
        sj_threads *t = sj_threads_create(n);
        if (!t) exit(1);
        for (size_t si = 0; si < sizeof spins / sizeof spins[0]; si++)
            for (size_t gi = 0; gi < sizeof gaps / sizeof gaps[0]; gi++) {
                sj_threads_set_spin_ns(t, spins[si]);
                int reps = quick ? 100 : gaps[gi] >= 2000 ? 300 : 1000;
                double *us = malloc(sizeof(double) * (size_t)reps), *join = malloc(sizeof(double) * (size_t)reps);
                double *took = malloc(sizeof(double) * (size_t)reps);
                pool_ctx *c = calloc(1, sizeof *c);
                for (int r = -10; r < reps; r++) {
                    for (int64_t end = sj_now_ns() + gaps[gi] * 1000; sj_now_ns() < end;) {
                    }
                    for (int i = 0; i < POOL_MAX; i++) atomic_store(&c->first[i], 0);
                    c->t0 = sj_now_ns();
                    sj_threads_split(t, n, 1, 1, pool_chunk, c);
                    int64_t t1 = sj_now_ns(), last = 0;
                    int ran = 0;
                    for (int i = 0; i < POOL_MAX; i++) {
                        int64_t f = atomic_load(&c->first[i]);
                        if (!f) continue;
                        ran++;
                        if (f - c->t0 > last) last = f - c->t0;
                    }
                    if (r < 0) continue;
                    us[r] = (double)(t1 - c->t0) / 1e3, join[r] = (double)last / 1e3, took[r] = ran;
                }
                qsort(us, (size_t)reps, sizeof(double), bench_cmp_double);
                qsort(join, (size_t)reps, sizeof(double), bench_cmp_double);
                qsort(took, (size_t)reps, sizeof(double), bench_cmp_double);
                printf("{\"workload\": \"pool\", \"threads\": %d, \"spin_us\": %lld, \"gap_us\": %lld, "
                       "\"work_us\": %d, \"median_us\": %.1f, \"p90_us\": %.1f, \"threads_ran\": %.0f, "
                       "\"last_join_us\": %.1f, \"last_join_p90_us\": %.1f}\n",
                       n, (long long)(spins[si] / 1000), (long long)gaps[gi], POOL_WORK_US, us[reps / 2],
                       us[reps * 9 / 10], took[reps / 2], join[reps / 2], join[reps * 9 / 10]);
                fflush(stdout);
                free(us), free(join), free(took), free(c);
            }
        sj_threads_destroy(t);
    }
}

/* -- Small products over the kernel pool (issue 27) -------------------------------- *
 * One sentence's products in all-MiniLM-L6-v2 (M 25 rows; K x N 384 x 384,
 * 384 x 1152, 384 x 1536, 1536 x 384), f32 over packed weights, with the
 * bias, on pools of 1, 2, 4, 8, ... threads and all CPUs: rounds interleave
 * the pools (a block of calls each, in turn) so that load from other
 * processes falls on all alike; the median microseconds per product of
 * each, and the pool's hand-offs per product (a product below twice the
 * minimum runs on the caller). */
static void bench_smallmm(void) {
    static const int64_t shapes[][3] = {{25, 384, 384}, {25, 384, 1152}, {25, 384, 1536}, {25, 1536, 384}};
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int counts[8], n_pools = 0;
    for (int n = 1; n_pools < 8; n *= 2) {
        if (n >= cpus) {
            counts[n_pools++] = (int)(cpus < 1 ? 1 : cpus);
            break;
        }
        counts[n_pools++] = n;
    }
    sj_threads *pools[8];
    for (int i = 0; i < n_pools; i++)
        if (!(pools[i] = sj_threads_create(counts[i]))) exit(1);
    sj_cpu_blas_threads(1);
    for (size_t c = 0; c < sizeof shapes / sizeof shapes[0]; c++) {
        int64_t M = shapes[c][0], K = shapes[c][1], N = shapes[c][2];
        float *a = rand_f32((size_t)(M * K), -1, 1), *w = rand_f32((size_t)(K * N), -0.05f, 0.05f);
        float *bias = rand_f32((size_t)N, -0.1f, 0.1f), *y = rand_f32((size_t)(M * N), 0, 0);
        sj_tensor tw = sj_tensor_make(w, SJ_F32, 2, (int64_t[]){K, N});
        sj_cpu_packed *p = NULL;
        if (sj_cpu_pack(&tw, &p)) exit(1);
        int reps = quick ? 200 : 2000;
        double *t[8];
        uint64_t h0[8] = {0}, h1[8] = {0};
        for (int i = 0; i < n_pools; i++) {
            t[i] = malloc((size_t)reps * sizeof(double));
            for (int r = 0; r < 20; r++) sj_cpu_packed_gemm(M, a, K, p, bias, y, N, pools[i]); /* warm */
            h0[i] = sj_threads_handoffs(pools[i]);
        }
        enum { BLOCK = 20, SKIP = 4 };
        int calls = (reps + BLOCK - SKIP - 1) / (BLOCK - SKIP) * BLOCK; /* a pool's, timed or not */
        /* rounds of BLOCK calls a pool (the first few untimed: the last
         * pool's workers still spin for up to 50 us, and on few cores they
         * take this one's) */
        for (int r = 0; r < reps; r += BLOCK - SKIP)
            for (int k = 0; k < n_pools; k++) {
                int i = (k + r) % n_pools;
                for (int c = 0; c < BLOCK; c++) {
                    double t0 = bench_now_s();
                    sj_cpu_packed_gemm(M, a, K, p, bias, y, N, pools[i]);
                    if (c >= SKIP && r + c - SKIP < reps) t[i][r + c - SKIP] = (bench_now_s() - t0) * 1e6;
                }
            }
        for (int i = 0; i < n_pools; i++) {
            h1[i] = sj_threads_handoffs(pools[i]);
            qsort(t[i], (size_t)reps, sizeof(double), bench_cmp_double);
            printf("{\"workload\": \"smallmm\", \"backend\": \"cpu\", \"dtype\": \"float32\", \"M\": %lld, "
                   "\"K\": %lld, \"N\": %lld, \"threads\": %d, \"min_work\": %lld, \"reps\": %d, "
                   "\"median_us\": %.2f, \"p90_us\": %.2f, \"GFLOPs\": %.1f, \"handoffs_per_call\": %.2f}\n",
                   (long long)M, (long long)K, (long long)N, counts[i],
                   (long long)sj_threads_min_work(pools[i]),
                   reps, t[i][reps / 2], t[i][reps * 9 / 10],
                   2.0 * M * K * N / t[i][reps / 2] / 1e3, (double)(h1[i] - h0[i]) / calls);
            free(t[i]);
        }
        fflush(stdout);
        sj_cpu_packed_free(p);
        free(a), free(w), free(bias), free(y);
    }
    for (int i = 0; i < n_pools; i++) sj_threads_destroy(pools[i]);
}


/* -- The encoder layer in f32, f16 and bf16 (issue 26) ----------------------------- *
 * w4 (one BERT-base encoder layer, hidden 768, 12 heads, FFN 3072; weights,
 * input and output all in the dtype), fused (static entries, compiled
 * first), batch 1, S = 16, 128, 512, on 1 and 2 kernel threads
 * (exec_threads). The three dtypes' functions live in three runtimes of
 * the same thread count; calls go round them in turn (the first of each
 * round rotating), so that load from other processes falls on all alike.
 * Reports each dtype's median ms and the median of its per-round ratio to
 * f32 (target: f16/bf16 no slower, ratio <= 1), and the calls served
 * fused. The weights are the same draws rounded to each dtype. */
static void bench_dtypes(void) {
    static const sj_dtype dts[3] = {SJ_F32, SJ_F16, SJ_BF16};
    static const int64_t Ss[3] = {16, 128, 512};
    static const int threads[2] = {1, 2};
    for (int ti = 0; ti < 2; ti++) {
        sj_runtime *rts[3];
        sj_fn *fns[3];
        bench_encoder w[3];
        for (int d = 0; d < 3; d++) {
            sj_runtime_config cfg;
            sj_runtime_config_init(&cfg);
            cfg.backend = SJ_BACKEND_CPU;
            cfg.compile_mode = SJ_COMPILE_SYNC;
            cfg.cache_dir = NULL;
            cfg.exec_threads = threads[ti];
            if (sj_runtime_create(&cfg, &rts[d])) bench_die("sj_runtime_create");
            uint64_t wrng = 0x5DEECE66Dull; /* the same draws for every dtype */
            bench_encoder_rand(rts[d], dts[d], &w[d], &wrng);
            fns[d] = bench_fn_user(rts[d], "w4", 1, bench_w4_model, &w[d], BENCH_STATIC);
        }
        for (int si = 0; si < (quick ? 2 : 3); si++) {
            int64_t S = Ss[si], shape[3] = {1, S, BENCH_H};
            sj_tensor x[3], y[3];
            call_ctx cc[3];
            uint64_t xrng = 0x2545F4914F6CDD1Dull + (uint64_t)S;
            for (int d = 0; d < 3; d++) {
                uint64_t r = xrng;
                x[d] = w5c_rand(rts[d], dts[d], 3, shape, -1, 1, &r);
                y[d] = sj_tensor_make(NULL, dts[d], 3, shape);
                if (sj_tensor_alloc(rts[d], &y[d])) bench_die("dtypes: alloc");
                cc[d] = (call_ctx){fns[d], &x[d], &y[d], 1, 1};
                for (int i = 0; i < 3; i++) time_call_ms(&cc[d]); /* trace, compile, warm */
            }
            double one = time_call_ms(&cc[0]);
            int reps = reps_for(one * 1e-3, quick ? 0.5 : 2.0, 7, 300);
            double *t[3], *ratio[3];
            sj_stats s0[3], s1[3];
            for (int d = 0; d < 3; d++) {
                t[d] = malloc((size_t)reps * sizeof(double));
                ratio[d] = malloc((size_t)reps * sizeof(double));
                sj_fn_stats(fns[d], &s0[d]);
            }
            for (int i = 0; i < reps; i++) {
                for (int k = 0; k < 3; k++) {
                    int d = (i + k) % 3;
                    t[d][i] = time_call_ms(&cc[d]);
                }
                for (int d = 0; d < 3; d++) ratio[d][i] = t[d][i] / t[0][i];
            }
            for (int d = 0; d < 3; d++) {
                sj_fn_stats(fns[d], &s1[d]);
                qsort(t[d], (size_t)reps, sizeof(double), bench_cmp_double);
                qsort(ratio[d], (size_t)reps, sizeof(double), bench_cmp_double);
            }
            for (int d = 0; d < 3; d++) {
                uint64_t calls = s1[d].calls - s0[d].calls, eager = s1[d].eager_calls - s0[d].eager_calls;
                printf("{\"workload\": \"dtypes\", \"model\": \"w4\", \"mode\": \"fused_static\", \"backend\": \"cpu\", "
                       "\"dtype\": \"%s\", \"B\": 1, \"S\": %lld, \"threads\": %d, \"reps\": %d, \"median_ms\": %.3f, "
                       "\"p25_ms\": %.3f, \"p75_ms\": %.3f, \"over_f32\": %.3f, \"over_f32_p25\": %.3f, "
                       "\"over_f32_p75\": %.3f, \"calls\": %llu, \"eager_calls\": %llu, \"packed_bytes\": %llu}\n",
                       sj_dtype_name(dts[d]), (long long)S, threads[ti], reps, t[d][reps / 2], t[d][reps / 4],
                       t[d][3 * reps / 4], ratio[d][reps / 2], ratio[d][reps / 4], ratio[d][3 * reps / 4],
                       (unsigned long long)calls, (unsigned long long)eager, (unsigned long long)s1[d].packed_bytes);
                free(t[d]), free(ratio[d]);
                sj_tensor_free(rts[d], &x[d]);
                sj_tensor_free(rts[d], &y[d]);
            }
            fflush(stdout);
        }
        for (int d = 0; d < 3; d++) {
            sj_fn_destroy(fns[d]);
            bench_encoder_free(rts[d], &w[d]);
            sj_runtime_destroy(rts[d]);
        }
    }
}

/* -- Eager memory against the fused plan's (issue 26) ------------------------------ *
 * w4 in f32 at batch 32 x 254 tokens, eager (SJ_COMPILE_OFF) and fused (a
 * static entry, compiled first), each runtime with allocator hooks that
 * count the bytes outstanding and their peak (as tests/test_graphapi.c's
 * eager planning test does). The hooks see what the runtime allocates for
 * a call: the eager executor's intermediates, the fused plan's arena; the
 * weights, input and output are allocated before the count starts. Kernel
 * scratch (per-thread buffers of the product and attention kernels) and
 * the packed weight copies come from the library's own allocator and are
 * reported apart (packed_bytes from sj_fn_stats). One JSON line: each
 * executor's hook peak over a call (first and later calls), the fused
 * entry's planned arena (sj_entry_info.planned_bytes) and unshared total
 * (naive_bytes), and eager over fused (target: within 1.5x). */
typedef struct evm_count {
    size_t now, peak;
} evm_count;

static void *evm_alloc(void *user, size_t bytes, size_t align) {
    evm_count *c = user;
    if (align < 16) align = 16;
    size_t head = align; /* the size and the offset live just before the block */
    char *p = aligned_alloc(align, (head + bytes + align - 1) / align * align);
    if (!p) return NULL;
    *(size_t *)(p + head - sizeof(size_t)) = bytes;
    *(size_t *)(p + head - 2 * sizeof(size_t)) = head;
    c->now += bytes;
    if (c->now > c->peak) c->peak = c->now;
    return p + head;
}

static void evm_free(void *user, void *ptr) {
    if (!ptr) return;
    evm_count *c = user;
    char *q = ptr;
    c->now -= *(size_t *)(q - sizeof(size_t));
    free(q - *(size_t *)(q - 2 * sizeof(size_t)));
}

static void bench_evmem(void) {
    enum { B = 32, S = 254 };
    int64_t shape[3] = {B, S, BENCH_H};
    size_t peak[2][2] = {{0}}, held[2] = {0};
    sj_entry_info info = {0};
    uint64_t packed = 0;
    double ms[2] = {0};
    for (int fused = 0; fused < 2; fused++) {
        evm_count cnt = {0};
        sj_runtime_config cfg;
        sj_runtime_config_init(&cfg);
        cfg.backend = SJ_BACKEND_CPU;
        cfg.compile_mode = fused ? SJ_COMPILE_SYNC : SJ_COMPILE_OFF;
        cfg.cache_dir = NULL;
        cfg.allocator = (sj_allocator){evm_alloc, evm_free, &cnt};
        sj_runtime *rt;
        if (sj_runtime_create(&cfg, &rt)) bench_die("sj_runtime_create");
        uint64_t wrng = 0x5DEECE66Dull, xrng = 0x2545F4914F6CDD1Dull;
        bench_encoder w;
        bench_encoder_rand(rt, SJ_F32, &w, &wrng);
        sj_tensor x = w5c_rand(rt, SJ_F32, 3, shape, -1, 1, &xrng), y = sj_tensor_make(NULL, SJ_F32, 3, shape);
        if (sj_tensor_alloc(rt, &y)) bench_die("evmem: alloc");
        sj_fn *fn = bench_fn_user(rt, "w4", 1, bench_w4_model, &w, fused ? BENCH_STATIC : BENCH_EAGER);
        for (int k = 0; k < 2; k++) { /* the first call (traces; fused: compiles), then a later one */
            size_t base = cnt.now;
            cnt.peak = base;
            double t0 = bench_now_s();
            if (sj_call(fn, &x, 1, &y, 1)) bench_die("evmem: sj_call");
            ms[fused] = (bench_now_s() - t0) * 1e3;
            peak[fused][k] = cnt.peak - base;
        }
        sj_stats st;
        sj_fn_stats(fn, &st);
        if (fused) {
            if (st.eager_calls) fprintf(stderr, "evmem: %llu eager calls in the fused run\n", (unsigned long long)st.eager_calls);
            sj_fn_entries(fn, &info, 1);
            packed = st.packed_bytes;
        } else if (st.eager_calls != st.calls) {
            fprintf(stderr, "evmem: fused calls in the eager run\n");
        }
        sj_fn_destroy(fn);
        sj_tensor_free(rt, &x);
        sj_tensor_free(rt, &y);
        bench_encoder_free(rt, &w);
        held[fused] = cnt.now; /* what the runtime still holds once all is freed */
        sj_runtime_destroy(rt);
    }
    size_t e = peak[0][1] > peak[0][0] ? peak[0][1] : peak[0][0];
    size_t f = peak[1][1] > (size_t)info.planned_bytes ? peak[1][1] : (size_t)info.planned_bytes;
    printf("{\"workload\": \"evmem\", \"model\": \"w4\", \"backend\": \"cpu\", \"dtype\": \"float32\", \"B\": %d, "
           "\"S\": %d, \"eager_peak_first_call_bytes\": %zu, \"eager_peak_bytes\": %zu, "
           "\"fused_peak_first_call_bytes\": %zu, \"fused_peak_bytes\": %zu, \"fused_planned_bytes\": %lld, "
           "\"fused_naive_bytes\": %lld, \"packed_bytes\": %llu, \"eager_over_fused\": %.3f, \"io_bytes\": %zu, "
           "\"eager_ms\": %.1f, \"fused_ms\": %.1f, \"held_after_free\": [%zu, %zu]}\n",
           B, S, peak[0][0], peak[0][1], peak[1][0], peak[1][1], (long long)info.planned_bytes,
           (long long)info.naive_bytes, (unsigned long long)packed, f ? (double)e / (double)f : -1.0,
           (size_t)B * S * BENCH_H * sizeof(float), ms[0], ms[1], held[0], held[1]);
    fflush(stdout);
}

int main(int argc, char **argv) {
    double t0_main = bench_now_s(), exec_to_main = w5c_since_exec_s();
    const char *wl = "ceiling,w0,dispatch,w1,w2,w3,kernels,time_to_fused,warm_start";
    const char *lengths = "samples/varlen_encoder/lengths.txt"; /* a copy of w5_lengths.txt */
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) quick = 1;
        else if (!strcmp(argv[i], "--workloads") && i + 1 < argc) wl = argv[++i];
        else if (!strcmp(argv[i], "--lengths") && i + 1 < argc) lengths = argv[++i];
        else if (!strcmp(argv[i], "--child-warm") && i + 1 < argc) return child_warm(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--quick] [--workloads ceiling,w0,dispatch,w1,w2,w3,kernels,time_to_fused,"
                            "warm_start,loaded,w5cold,epilogue,smallmm,pool,dtypes,evmem] [--lengths file]\n", argv[0]);
            return 2;
        }
    }
    if (strstr(wl, "w5cold")) { /* first: the process is cold only once */
        static int64_t lens[4096];
        int n = w5c_read_lengths(lengths, lens, quick ? 200 : 4096);
        bench_w5cold(SJ_BACKEND_CPU, SJ_F32, t0_main, exec_to_main, lens, n);
        if (!strcmp(wl, "w5cold")) return 0;
    }
    sj_runtime_config cfg;
    sj_runtime_config_init(&cfg);
    cfg.backend = SJ_BACKEND_CPU;
    cfg.compile_mode = SJ_COMPILE_OFF;
    sj_runtime *rt;
    if (sj_runtime_create(&cfg, &rt)) {
        fprintf(stderr, "%s\n", sj_last_error());
        return 1;
    }
    if (!strcmp(wl, "pool")) { /* alone: no runtime needed */
        bench_pool();
        sj_runtime_destroy(rt);
        return 0;
    }
    if (!strcmp(wl, "smallmm")) { /* alone: no ceiling needed */
        bench_smallmm();
        sj_runtime_destroy(rt);
        return 0;
    }
    if (strstr(wl, "smallmm")) bench_smallmm();
    if (strcmp(wl, "loaded") && strcmp(wl, "epilogue") && strcmp(wl, "dtypes") && strcmp(wl, "evmem") &&
        strcmp(wl, "dtypes,evmem") && strcmp(wl, "evmem,dtypes"))
        bench_ceiling(); /* every bandwidth figure is read against it */
    if (strstr(wl, "w0")) bench_w0(rt);
    if (strstr(wl, "dispatch")) bench_dispatch();
    for (size_t k = 0; k < sizeof workloads / sizeof workloads[0]; k++)
        if (strstr(wl, workloads[k].name)) bench_workload(&workloads[k]);
    if (strstr(wl, "kernels")) bench_kernels();
    if (strstr(wl, "time_to_fused")) bench_time_to_fused();
    if (strstr(wl, "loaded")) bench_loaded();
    if (strstr(wl, "epilogue")) bench_epilogue();
    if (strstr(wl, "dtypes")) bench_dtypes();
    if (strstr(wl, "evmem")) bench_evmem();
    if (strstr(wl, "warm_start")) {
        char self[4096];
        ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
        if (len > 0) {
            self[len] = '\0';
            bench_warm_start(self);
        }
    }
    sj_runtime_destroy(rt);
    return 0;
}
