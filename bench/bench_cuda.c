/* CUDA benchmarks for the shared workloads (../shared/workloads/README.md),
 * printing JSON lines joinable with the PyTorch peer's
 * (../shared/peers/compare.py):
 *
 *   bench_cuda [--quick] [--workloads ceiling,w0,w1,w2,w3,w4,w5,attention,attc,hostparts,firstuse,w5mt,w5cold,bgparts,newshape,w4kernels,gathergraph] [--lengths file]
 *
 * Modes: eager (no compiling), fused_static (an entry per size, every size a
 * constant), fused_symbolic (one entry; sizes passed at run time). Kernels
 * are compiled before timing (synchronous mode, outside the timed region).
 * Each measurement is the median of many calls timed with CUDA events
 * around the whole call (host dispatch included), after a warm-up, on
 * random inputs. The timed calls reuse their buffers, so fused calls run
 * as CUDA graphs (graph_calls in the output); SHAPEJIT_CUDA_GRAPHS=0 times
 * them kernel by kernel. w0 is host microseconds per sj_call, which waits for the
 * result. w4 is the f16 encoder layer in the same three modes; w5 serves
 * the request stream of --lengths (default: the sample's copy of
 * w5_lengths.txt) through the default policy (modes eager, auto,
 * auto_warm: see bench_w5). "attention" times the attention op alone
 * (f16 [1, 12, S, 64]), not a shared workload; "attc" the tensor-core
 * attention with a mask and over packed sequences (bench_attc); "hostparts" the host time
 * to queue each primitive of a small encoder call; "firstuse" what the first
 * product of a new size costs (bench_firstuse); "w5mt" w5 from 8 threads at
 * once (bench_w5mt); "w5cold" w5 from a cold process with the library's
 * warm-up of the declared buckets first (bench/bench_w5cold.h; run it
 * alone: `bench_cuda --workloads w5cold`; bench_cpu runs the same on the
 * CPU). Without a GPU it prints one
 * line saying so and exits 0.
 */
#include <execinfo.h>
#include <math.h>
#include <signal.h>
#include <unistd.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "jit/runtime.h"
#include "base/tensor.h"
#include "bench/bench_util.h"
#include "bench/bench_w5cold.h"
#include "jit/shapejit.h"

#ifdef SJ_WITH_CUDA
#include "kernels/cuda/cuda_dev.h"
#include "kernels/cuda/exec_cuda.h"
#include "kernels/cuda/eager_cuda.h"
#include "base/half.h"

static int quick;
static double ceiling;


/* A device tensor of dtype dt (f32 or f16) of random values in [lo, hi)
 * (never all zeros). */
static uint64_t rng = 0x9E3779B97F4A7C15ull;
static sj_tensor dev_rand_dt(sj_runtime *rt, sj_dtype dt, int rank, const int64_t *shape, float lo, float hi) {
    sj_tensor t = {.dtype = dt, .rank = rank, .device = SJ_CUDA};
    for (int i = 0; i < rank; i++) t.shape[i] = shape[i];
    if (sj_tensor_alloc(rt, &t)) bench_die("alloc");
    int64_t n = sj_tensor_numel(&t);
    float *h = malloc((size_t)(n ? n : 1) * sizeof *h);
    uint16_t *h16 = dt == SJ_F16 ? malloc((size_t)(n ? n : 1) * sizeof *h16) : NULL;
    if (!h || (dt == SJ_F16 && !h16)) bench_die("host buffers");
    bench_fill_rand(h, (size_t)n, lo, hi, &rng);
    for (int64_t i = 0; h16 && i < n; i++) h16[i] = sj_f32_to_f16(h[i]);
    sj_tensor ht = sj_tensor_make(h16 ? (void *)h16 : h, dt, rank, shape);
    if (sj_tensor_copy(rt, &t, &ht)) bench_die("copy");
    free(h);
    free(h16);
    return t;
}
static sj_tensor dev_rand(sj_runtime *rt, int rank, const int64_t *shape, float lo, float hi) {
    return dev_rand_dt(rt, SJ_F32, rank, shape, lo, hi);
}

/* -- Ceiling -------------------------------------------------------------------- */

static void bench_ceiling(sj_runtime *rt) {
    sj_cuda *cu = sj_cuda_of(rt->backend);
    size_t bytes = (size_t)1 << 30;
    CUdeviceptr a = sj_cuda_alloc(cu, bytes, cu->stream), b = sj_cuda_alloc(cu, bytes, cu->stream);
    if (!a || !b) bench_die("ceiling buffers");
    CUevent e0, e1;
    cu->api.EventCreate(&e0, 0);
    cu->api.EventCreate(&e1, 0);
    double t[20];
    cu->api.MemsetD8Async(a, 0x3c, bytes, cu->stream);
    for (int i = 0; i < 23; i++) {
        cu->api.EventRecord(e0, cu->stream);
        cu->api.MemcpyDtoDAsync(b, a, bytes, cu->stream);
        cu->api.EventRecord(e1, cu->stream);
        cu->api.EventSynchronize(e1);
        float ms;
        cu->api.EventElapsedTime(&ms, e0, e1);
        if (i >= 3) t[i - 3] = ms;
    }
    qsort(t, 20, sizeof t[0], bench_cmp_double);
    ceiling = 2.0 * (double)bytes / (t[10] * 1e-3) / 1e9;
    printf("{\"workload\": \"ceiling\", \"backend\": \"cuda\", \"device\": \"%s\", \"copy_GBps_read_plus_write\": %.1f}\n",
           cu->name, ceiling);
    cu->api.EventDestroy(e0);
    cu->api.EventDestroy(e1);
    sj_cuda_free(cu, a, cu->stream);
    sj_cuda_free(cu, b, cu->stream);
    sj_cuda_release_cached(cu);
}

/* -- Models --------------------------------------------------------------------- */





/* -- w0 ---------------------------------------------------------------------------- */

static void bench_w0(void) {
    for (int mode = BENCH_EAGER; mode <= BENCH_STATIC; mode++) {
        sj_runtime *rt = bench_runtime(SJ_BACKEND_CUDA, (bench_mode)mode);
        sj_fn *fn = bench_fn(rt, "w0", 1, bench_w0_model, (bench_mode)mode);
        int64_t n = 8;
        sj_tensor x = dev_rand(rt, 1, &n, -1, 1), y = {.dtype = SJ_F32, .rank = 1, .shape = {8}, .device = SJ_CUDA};
        if (sj_tensor_alloc(rt, &y)) bench_die("alloc");
        int reps = quick ? 500 : 3000;
        double *t = malloc(sizeof(double) * (size_t)reps);
        for (int i = 0; i < 100; i++)
            if (sj_call(fn, &x, 1, &y, 1)) bench_die("w0");
        for (int i = 0; i < reps; i++) {
            double t0 = bench_now_s();
            sj_call(fn, &x, 1, &y, 1);
            t[i] = (bench_now_s() - t0) * 1e6;
        }
        qsort(t, (size_t)reps, sizeof *t, bench_cmp_double);
        printf("{\"workload\": \"w0\", \"mode\": \"%s\", \"backend\": \"cuda\", \"host_us_per_call\": %.3f, "
               "\"p90_us\": %.3f}\n",
               bench_mode_names[mode], t[reps / 2], t[reps * 9 / 10]);
        fflush(stdout);
        if (mode == BENCH_STATIC) {
            /* the floor under a call: one eager kernel launched and waited
             * for, without the runtime around it (stderr: not a mode) */
            sj_cuda *cu = sj_cuda_of(rt->backend);
            sj_cuda_exec e = {.cuda = cu, .stream = cu->stream};
            for (int i = 0; i < reps; i++) {
                double t0 = bench_now_s();
                sj_cuda_unary(&e, SJ_OP_NEG, &x, &y);
                cu->api.StreamSynchronize(cu->stream);
                t[i] = (bench_now_s() - t0) * 1e6;
            }
            qsort(t, (size_t)reps, sizeof *t, bench_cmp_double);
            fprintf(stderr, "w0 floor: one kernel launch + stream synchronize: %.3f us (p90 %.3f)\n", t[reps / 2],
                    t[reps * 9 / 10]);
            for (int i = 0; i < reps; i++) {
                double t0 = bench_now_s();
                sj_cuda_unary(&e, SJ_OP_NEG, &x, &y);
                while (cu->api.StreamQuery(cu->stream) == CUDA_ERROR_NOT_READY) {
                }
                t[i] = (bench_now_s() - t0) * 1e6;
            }
            qsort(t, (size_t)reps, sizeof *t, bench_cmp_double);
            unsigned flags = 0;
            cu->api.CtxGetFlags(&flags);
            fprintf(stderr, "w0 floor: launch + cuStreamQuery spin: %.3f us (p90 %.3f); context flags 0x%x\n",
                    t[reps / 2], t[reps * 9 / 10], flags);
        }
        free(t);
        sj_tensor_free(rt, &x);
        sj_tensor_free(rt, &y);
        sj_runtime_destroy(rt);
    }
}

/* -- w1-w3 ---------------------------------------------------------------------------- */

typedef struct wcase {
    sj_tensor in[4], out[2];
    int n_in, n_out;
    double bytes;
} wcase;

static void make_case(sj_runtime *rt, int w, int64_t S, wcase *c) {
    memset(c, 0, sizeof *c);
    if (w == 1) {
        int64_t H = 4096;
        c->n_in = 3, c->n_out = 1;
        c->in[0] = dev_rand(rt, 2, (int64_t[]){S, H}, -2, 2);
        c->in[1] = dev_rand(rt, 1, &H, -2, 2);
        c->in[2] = dev_rand(rt, 1, &H, -2, 2);
        c->bytes = (2.0 * S * H + 2.0 * H) * 4;
    } else if (w == 2) {
        int64_t H = 768;
        c->n_in = 4, c->n_out = 2;
        c->in[0] = dev_rand(rt, 2, (int64_t[]){S, H}, -2, 2);
        c->in[1] = dev_rand(rt, 2, (int64_t[]){S, H}, -2, 2);
        c->in[2] = dev_rand(rt, 1, &H, 0.5f, 1.5f);
        c->in[3] = dev_rand(rt, 1, &H, -0.5f, 0.5f);
        c->bytes = (4.0 * S * H + 2.0 * H) * 4;
    } else {
        int64_t BH = 12;
        c->n_in = 2, c->n_out = 1;
        c->in[0] = dev_rand(rt, 3, (int64_t[]){BH, S, S}, -3, 3);
        c->in[1] = dev_rand(rt, 3, (int64_t[]){BH, 1, S}, -1, 1);
        c->bytes = (2.0 * BH * S * S + BH * S) * 4;
    }
}

static void free_case(sj_runtime *rt, wcase *c) {
    for (int i = 0; i < c->n_in; i++) sj_tensor_free(rt, &c->in[i]);
    for (int i = 0; i < c->n_out; i++) sj_tensor_free(rt, &c->out[i]);
}

/* A host function that holds its stream for HOLD_US (cuLaunchHostFunc):
 * work queued after it waits, so the host has queued all of it before the
 * device starts and events around it time the device alone. */
enum { HOLD_US = 1000 };
static void CUDA_CB hold_stream(void *u) {
    (void)u;
    double t0 = bench_now_s();
    while (bench_now_s() - t0 < HOLD_US * 1e-6) {
    }
}

/* 5 + reps calls of fn on stream s, each between events e0 and e1 (with
 * hold: the stream held first, hold_stream), the last reps' device ms in
 * t and, when h is not NULL, host ms queueing them in h, each sorted. */
static void timed_calls(sj_cuda *cu, CUstream s, CUevent e0, CUevent e1, sj_fn *fn, wcase *c, int reps, bool hold,
                        double *t, double *h) {
    for (int i = 0; i < 5 + reps; i++) {
        if (hold && cu->api.LaunchHostFunc(s, hold_stream, NULL)) bench_die("holding the stream");
        cu->api.EventRecord(e0, s);
        double h0 = bench_now_s();
        if (sj_call_stream(fn, c->in, c->n_in, c->out, c->n_out, NULL)) bench_die("call");
        if (h && i >= 5) h[i - 5] = (bench_now_s() - h0) * 1e3;
        cu->api.EventRecord(e1, s);
        cu->api.EventSynchronize(e1);
        float ms;
        cu->api.EventElapsedTime(&ms, e0, e1);
        if (i >= 5) t[i - 5] = ms;
    }
    qsort(t, (size_t)reps, sizeof t[0], bench_cmp_double);
    if (h) qsort(h, (size_t)reps, sizeof h[0], bench_cmp_double);
}

/* Median ms of a call, CUDA events around it (the device waits for the
 * host's issue of the call too, as a request does); *host_ms (if not
 * NULL): the median host time sj_call_stream takes to queue it; *device_ms
 * (if not NULL): the median with the stream held first (hold_stream: the
 * device's time alone; -1 without cuLaunchHostFunc). */
static double time_ms_dev(sj_runtime *rt, sj_fn *fn, wcase *c, double *host_ms, double *device_ms) {
    sj_cuda *cu = sj_cuda_of(rt->backend);
    CUstream s = cu->stream;
    for (int i = 0; i < c->n_out; i++) sj_tensor_free(rt, &c->out[i]);
    if (sj_call(fn, c->in, c->n_in, c->out, c->n_out)) bench_die("warm-up call"); /* traces, compiles, allocates */
    for (int i = 0; i < 60; i++) /* enough calls with these buffers for a CUDA graph, made in the background */
        if (sj_call(fn, c->in, c->n_in, c->out, c->n_out)) bench_die("warm-up call");
    sj_fn_wait_idle(fn, -1);
    CUevent e0, e1;
    cu->api.EventCreate(&e0, 0);
    cu->api.EventCreate(&e1, 0);
    int reps = quick ? 20 : 60;
    double t[64], h[64], d[64];
    timed_calls(cu, s, e0, e1, fn, c, reps, false, t, h);
    if (device_ms) {
        *device_ms = -1;
        if (cu->api.LaunchHostFunc) {
            timed_calls(cu, s, e0, e1, fn, c, reps, true, d, NULL);
            *device_ms = d[reps / 2];
        }
    }
    cu->api.EventDestroy(e0);
    cu->api.EventDestroy(e1);
    if (host_ms) *host_ms = h[reps / 2];
    return t[reps / 2];
}

static double time_ms(sj_runtime *rt, sj_fn *fn, wcase *c, double *host_ms) {
    return time_ms_dev(rt, fn, c, host_ms, NULL);
}

static void bench_w(int w) {
    static const int64_t sizes[4][6] = {{0}, {1, 17, 128, 1000, 4096, 16384}, {1, 17, 128, 1000, 4096, 32768},
                                        {16, 100, 512, 1024, 2048}};
    static const sj_model_fn models[4] = {NULL, bench_w1_model, bench_w2_model, bench_w3_model};
    int ns = w == 3 ? 5 : 6;
    for (int mode = 0; mode < 3; mode++) {
        sj_runtime *rt = bench_runtime(SJ_BACKEND_CUDA, (bench_mode)mode);
        char name[4] = {'w', (char)('0' + w), 0};
        sj_fn *fn = NULL;
        for (int i = 0; i < ns; i++) {
            if (quick && i == ns - 1) break;
            wcase c;
            make_case(rt, w, sizes[w][i], &c);
            if (!fn) fn = bench_fn(rt, name, c.n_in, models[w], (bench_mode)mode);
            double ms = time_ms(rt, fn, &c, NULL);
            sj_stats st;
            sj_fn_stats(fn, &st);
            double gbs = c.bytes / (ms * 1e-3) / 1e9;
            printf("{\"workload\": \"%s\", \"mode\": \"%s\", \"backend\": \"cuda\", \"dtype\": \"float32\", \"S\": %lld, "
                   "\"median_ms\": %.4f, \"GBps\": %.1f, \"of_ceiling\": %.3f, \"compiles\": %llu, \"eager_calls\": %llu}\n",
                   name, bench_mode_names[mode], (long long)sizes[w][i], ms, gbs, gbs / ceiling,
                   (unsigned long long)st.compiles, (unsigned long long)st.eager_calls);
            fflush(stdout);
            free_case(rt, &c);
        }
        sj_runtime_destroy(rt);
    }
}

/* -- w4, w5: the encoder layer in f16 ----------------------------------------------- */

static void encoder_init(sj_runtime *rt, bench_encoder *w) {
    const int64_t H = BENCH_H, FF = BENCH_FF;
    float si = 1.0f / sqrtf((float)H), sf = 1.0f / sqrtf((float)FF);
    w->wqkv = dev_rand_dt(rt, SJ_F16, 2, (int64_t[]){H, 3 * H}, -si, si);
    w->bqkv = dev_rand_dt(rt, SJ_F16, 1, (int64_t[]){3 * H}, -0.02f, 0.02f);
    w->wo = dev_rand_dt(rt, SJ_F16, 2, (int64_t[]){H, H}, -si, si);
    w->bo = dev_rand_dt(rt, SJ_F16, 1, &H, -0.02f, 0.02f);
    w->g1 = dev_rand_dt(rt, SJ_F16, 1, &H, 0.9f, 1.1f);
    w->b1 = dev_rand_dt(rt, SJ_F16, 1, &H, -0.02f, 0.02f);
    w->w1 = dev_rand_dt(rt, SJ_F16, 2, (int64_t[]){H, FF}, -si, si);
    w->bf1 = dev_rand_dt(rt, SJ_F16, 1, &FF, -0.02f, 0.02f);
    w->w2 = dev_rand_dt(rt, SJ_F16, 2, (int64_t[]){FF, H}, -sf, sf);
    w->bf2 = dev_rand_dt(rt, SJ_F16, 1, &H, -0.02f, 0.02f);
    w->g2 = dev_rand_dt(rt, SJ_F16, 1, &H, 0.9f, 1.1f);
    w->b2 = dev_rand_dt(rt, SJ_F16, 1, &H, -0.02f, 0.02f);
}

static void encoder_free(sj_runtime *rt, bench_encoder *w) {
    sj_tensor *all[] = {&w->wqkv, &w->bqkv, &w->wo, &w->bo, &w->g1, &w->b1,
                        &w->w1,   &w->bf1,  &w->w2, &w->bf2, &w->g2, &w->b2};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) sj_tensor_free(rt, all[i]);
}

/* w4: median ms of one layer call per length, as w1-w3 are timed. */
static void bench_w4(void) {
    static const int64_t sizes[] = {16, 64, 128, 256, 512};
    int ns = (int)(sizeof sizes / sizeof sizes[0]);
    for (int mode = 0; mode < 3; mode++) {
        sj_runtime *rt = bench_runtime(SJ_BACKEND_CUDA, (bench_mode)mode);
        bench_encoder w;
        encoder_init(rt, &w);
        sj_fn *fn = bench_fn_user(rt, "w4", 1, bench_w4_model, &w, (bench_mode)mode);
        for (int i = 0; i < ns; i++) {
            if (quick && i == ns - 1) break;
            int64_t S = sizes[i];
            wcase c = {.n_in = 1, .n_out = 1};
            c.in[0] = dev_rand_dt(rt, SJ_F16, 3, (int64_t[]){1, S, BENCH_H}, -1, 1);
            double host_ms, dev_ms, ms = time_ms_dev(rt, fn, &c, &host_ms, &dev_ms);
            double flops = 2.0 * S * BENCH_H * (3.0 * BENCH_H + BENCH_H + 2.0 * BENCH_FF) + 4.0 * S * S * BENCH_H;
            sj_stats st;
            sj_fn_stats(fn, &st);
            printf("{\"workload\": \"w4\", \"mode\": \"%s\", \"backend\": \"cuda\", \"dtype\": \"float16\", \"S\": %lld, "
                   "\"median_ms\": %.4f, \"host_ms\": %.4f, \"device_ms\": %.4f, \"TFLOPs\": %.2f, \"compiles\": %llu, "
                   "\"eager_calls\": %llu, \"graph_calls\": %llu, \"graph_bytes\": %llu, \"graph_evictions\": %llu}\n",
                   bench_mode_names[mode], (long long)S, ms, host_ms, dev_ms, flops / (ms * 1e-3) / 1e12,
                   (unsigned long long)st.compiles, (unsigned long long)st.eager_calls,
                   (unsigned long long)st.graph_calls, (unsigned long long)st.graph_bytes,
                   (unsigned long long)st.graph_evictions);
            fflush(stdout);
            free_case(rt, &c);
        }
        sj_fn_destroy(fn);
        encoder_free(rt, &w);
        sj_runtime_destroy(rt);
    }
}

/* attention alone (not a shared workload: where w4's time goes), f16 q, k,
 * v [1, 12, S, 64], not causal: median ms and TFLOPs (4 S^2 D H). */
static sj_status attn_model(sj_tracer *t, const sj_val *in, int n, void *u) {
    (void)n, (void)u;
    return sj_output(t, sj_attention(t, in[0], in[1], in[2], SJ_NONE, 0.125, 0));
}

static void bench_attention(void) {
    static const int64_t sizes[] = {48, 128, 512, 2048};
    sj_runtime *rt = bench_runtime(SJ_BACKEND_CUDA, BENCH_EAGER);
    sj_fn *fn = bench_fn(rt, "attention", 3, attn_model, BENCH_EAGER);
    for (int i = 0; i < (int)(sizeof sizes / sizeof sizes[0]); i++) {
        int64_t S = sizes[i], shape[4] = {1, BENCH_NH, S, BENCH_HD};
        wcase c = {.n_in = 3, .n_out = 1};
        for (int k = 0; k < 3; k++) c.in[k] = dev_rand_dt(rt, SJ_F16, 4, shape, -1, 1);
        double ms = time_ms(rt, fn, &c, NULL);
        printf("{\"workload\": \"attention\", \"mode\": \"eager\", \"backend\": \"cuda\", \"dtype\": \"float16\", "
               "\"S\": %lld, \"median_ms\": %.4f, \"TFLOPs\": %.2f}\n",
               (long long)S, ms, 4.0 * S * S * BENCH_HD * BENCH_NH / (ms * 1e-3) / 1e12);
        fflush(stdout);
        free_case(rt, &c);
    }
    sj_fn_destroy(fn);
    sj_runtime_destroy(rt);
}

/* "attc": the tensor-core attention kernels with a mask and over packed
 * sequences (issue 26), called directly (no runtime around them), f16,
 * H = 12, D = 64: per call ms, the median of 7 runs of 50 calls queued
 * back to back. masked: q, k, v [8, 12, S, 64] with an additive f16 mask
 * [8, 1, S, S] (broadcast over heads), against the same call without a
 * mask; varlen: 32 sequences of random lengths in [16, 256] packed
 * ([T, 12, 64]), against padded attention over [32, 12, 256, 64] with the
 * lengths. Not a shared workload. */
static double attc_time(sj_cuda *cu, sj_status (*call)(void *), void *arg) {
    enum { RUNS = 7, CALLS = 50 };
    double t[RUNS];
    for (int i = 0; i < 5; i++)
        if (call(arg)) bench_die("attc warm-up");
    for (int r = 0; r < RUNS; r++) {
        cu->api.StreamSynchronize(cu->stream);
        double t0 = bench_now_s();
        for (int i = 0; i < CALLS; i++)
            if (call(arg)) bench_die("attc call");
        cu->api.StreamSynchronize(cu->stream);
        t[r] = (bench_now_s() - t0) * 1e3 / CALLS;
    }
    qsort(t, RUNS, sizeof t[0], bench_cmp_double);
    return t[RUNS / 2];
}

typedef struct attc_args {
    sj_cuda_exec e;
    sj_tensor q, k, v, y, mask, len, off;
    int masked;
} attc_args;

static sj_status attc_padded(void *p) {
    attc_args *a = p;
    return sj_cuda_attention_mask(&a->e, &a->q, &a->k, &a->v, a->len.data ? &a->len : NULL,
                                  a->masked ? &a->mask : NULL, 0.125, 0, &a->y);
}
static sj_status attc_varlen(void *p) {
    attc_args *a = p;
    return sj_cuda_attention_varlen(&a->e, &a->q, &a->k, &a->v, &a->off, 0.125, 0, &a->y);
}

static void bench_attc(void) {
    sj_runtime *rt = bench_runtime(SJ_BACKEND_CUDA, BENCH_EAGER);
    sj_cuda *cu = sj_cuda_of(rt->backend);
    static const int64_t sizes[] = {128, 512};
    for (int i = 0; i < 2; i++) {
        const int64_t S = sizes[i], B = 8, shape[4] = {B, BENCH_NH, S, BENCH_HD}, mshape[4] = {B, 1, S, S};
        attc_args a = {.e = {.cuda = cu, .stream = cu->stream}};
        a.q = dev_rand_dt(rt, SJ_F16, 4, shape, -1, 1), a.k = dev_rand_dt(rt, SJ_F16, 4, shape, -1, 1);
        a.v = dev_rand_dt(rt, SJ_F16, 4, shape, -1, 1), a.y = dev_rand_dt(rt, SJ_F16, 4, shape, -1, 1);
        a.mask = dev_rand_dt(rt, SJ_F16, 4, mshape, -4, 0);
        a.mask.shape[1] = BENCH_NH, a.mask.stride[1] = 0; /* [B, 1, S, S] over the heads */
        double ms[2];
        for (a.masked = 0; a.masked < 2; a.masked++) ms[a.masked] = attc_time(cu, attc_padded, &a);
        printf("{\"workload\": \"attc\", \"case\": \"masked\", \"backend\": \"cuda\", \"dtype\": \"float16\", "
               "\"B\": %lld, \"H\": %d, \"S\": %lld, \"D\": %d, \"mask\": \"float16 [B,1,S,S]\", \"median_ms\": %.4f, "
               "\"unmasked_ms\": %.4f, \"TFLOPs\": %.2f}\n",
               (long long)B, BENCH_NH, (long long)S, BENCH_HD, ms[1], ms[0],
               4.0 * B * S * S * BENCH_HD * BENCH_NH / (ms[1] * 1e-3) / 1e12);
        fflush(stdout);
        sj_tensor *all[] = {&a.q, &a.k, &a.v, &a.y, &a.mask};
        a.mask.shape[1] = 1, a.mask.stride[1] = S * S;
        for (size_t j = 0; j < sizeof all / sizeof all[0]; j++) sj_tensor_free(rt, all[j]);
    }
    /* packed: 32 sequences of 16..256 tokens (a fixed draw) */
    enum { NSEQ = 32, SMAX = 256 };
    int32_t off[NSEQ + 1] = {0}, lens[NSEQ];
    uint64_t st = 2626;
    double work = 0;
    for (int b = 0; b < NSEQ; b++) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        lens[b] = 16 + (int32_t)((st >> 33) % (SMAX - 16 + 1));
        off[b + 1] = off[b] + lens[b];
        work += (double)lens[b] * lens[b];
    }
    const int64_t T = off[NSEQ], pshape[3] = {T, BENCH_NH, BENCH_HD}, oshape[1] = {NSEQ + 1};
    attc_args a = {.e = {.cuda = cu, .stream = cu->stream}};
    a.q = dev_rand_dt(rt, SJ_F16, 3, pshape, -1, 1), a.k = dev_rand_dt(rt, SJ_F16, 3, pshape, -1, 1);
    a.v = dev_rand_dt(rt, SJ_F16, 3, pshape, -1, 1), a.y = dev_rand_dt(rt, SJ_F16, 3, pshape, -1, 1);
    a.off = (sj_tensor){.dtype = SJ_I32, .rank = 1, .device = SJ_CUDA, .shape = {NSEQ + 1}};
    if (sj_tensor_alloc(rt, &a.off)) bench_die("alloc");
    sj_tensor ho = sj_tensor_make(off, SJ_I32, 1, oshape);
    if (sj_tensor_copy(rt, &a.off, &ho)) bench_die("copy");
    CUdeviceptr flag = sj_cuda_alloc(cu, 4, cu->stream);
    if (!flag || cu->api.MemsetD8Async(flag, 0, 4, cu->stream) != CUDA_SUCCESS) bench_die("flag");
    a.e.error_flag = flag;
    double ms = attc_time(cu, attc_varlen, &a);
    int hflag = 0;
    if (sj_cuda_to_host(cu, &hflag, flag, 4) || hflag) bench_die("varlen offsets flagged");
    /* the same sequences padded to SMAX with their lengths */
    const int64_t shape[4] = {NSEQ, BENCH_NH, SMAX, BENCH_HD}, lshape[1] = {NSEQ};
    attc_args b = {.e = {.cuda = cu, .stream = cu->stream}};
    b.q = dev_rand_dt(rt, SJ_F16, 4, shape, -1, 1), b.k = dev_rand_dt(rt, SJ_F16, 4, shape, -1, 1);
    b.v = dev_rand_dt(rt, SJ_F16, 4, shape, -1, 1), b.y = dev_rand_dt(rt, SJ_F16, 4, shape, -1, 1);
    b.len = (sj_tensor){.dtype = SJ_I32, .rank = 1, .device = SJ_CUDA, .shape = {NSEQ}};
    if (sj_tensor_alloc(rt, &b.len)) bench_die("alloc");
    sj_tensor hl = sj_tensor_make(lens, SJ_I32, 1, lshape);
    if (sj_tensor_copy(rt, &b.len, &hl)) bench_die("copy");
    double pms = attc_time(cu, attc_padded, &b);
    printf("{\"workload\": \"attc\", \"case\": \"varlen\", \"backend\": \"cuda\", \"dtype\": \"float16\", "
           "\"sequences\": %d, \"T\": %lld, \"H\": %d, \"D\": %d, \"median_ms\": %.4f, \"padded_lengths_ms\": %.4f, "
           "\"TFLOPs\": %.2f}\n",
           NSEQ, (long long)T, BENCH_NH, BENCH_HD, ms, pms, 4.0 * work * BENCH_HD * BENCH_NH / (ms * 1e-3) / 1e12);
    fflush(stdout);
    sj_cuda_free(cu, flag, cu->stream);
    sj_tensor *all[] = {&a.q, &a.k, &a.v, &a.y, &a.off, &b.q, &b.k, &b.v, &b.y, &b.len};
    for (size_t j = 0; j < sizeof all / sizeof all[0]; j++) sj_tensor_free(rt, all[j]);
    sj_runtime_destroy(rt);
}

/* Host microseconds to queue one primitive, the GPU idle before each
 * (median of 200): what a small call's time is made of. The parts are the
 * eager kernels the fused encoder calls, at its S=16 sizes, and the
 * allocator's pair. Not a shared workload. */
typedef enum { HP_COPY, HP_ADD, HP_LAYER_NORM, HP_MATMUL, HP_ATTENTION, HP_ALLOC_FREE, HP_N } hp_part;
static const char *const hp_names[HP_N] = {"copy", "add", "layer_norm", "matmul", "attention", "alloc_free"};

static void bench_hostparts(void) {
    sj_runtime *rt = bench_runtime(SJ_BACKEND_CUDA, BENCH_EAGER);
    sj_cuda *cu = sj_cuda_of(rt->backend);
    sj_cuda_exec e = {.cuda = cu, .stream = cu->stream};
    const int64_t S = 16, x_shape[2] = {S, BENCH_H}, w_shape[2] = {BENCH_H, 3 * BENCH_H},
                  y_shape[2] = {S, 3 * BENCH_H}, h_shape[1] = {BENCH_H}, a_shape[4] = {1, BENCH_NH, S, BENCH_HD};
    sj_tensor x = dev_rand_dt(rt, SJ_F16, 2, x_shape, -1, 1), x2 = dev_rand_dt(rt, SJ_F16, 2, x_shape, -1, 1);
    sj_tensor w = dev_rand_dt(rt, SJ_F16, 2, w_shape, -0.05f, 0.05f), y = dev_rand_dt(rt, SJ_F16, 2, y_shape, -1, 1);
    sj_tensor g = dev_rand_dt(rt, SJ_F16, 1, h_shape, 0.5f, 1.5f), b = dev_rand_dt(rt, SJ_F16, 1, h_shape, -1, 1);
    sj_tensor q = dev_rand_dt(rt, SJ_F16, 4, a_shape, -1, 1), k = dev_rand_dt(rt, SJ_F16, 4, a_shape, -1, 1);
    sj_tensor v = dev_rand_dt(rt, SJ_F16, 4, a_shape, -1, 1), o = dev_rand_dt(rt, SJ_F16, 4, a_shape, -1, 1);
    sj_tensor gb = g; /* g broadcast over the rows */
    gb.rank = 2, gb.shape[0] = S, gb.shape[1] = BENCH_H, gb.stride[0] = 0, gb.stride[1] = 1;
    enum { REPS = 200 };
    double h[REPS];
    for (int part = 0; part < HP_N; part++) {
        for (int i = 0; i < 10 + REPS; i++) {
            cu->api.StreamSynchronize(cu->stream);
            double t0 = bench_now_s();
            sj_status st = SJ_OK;
            switch ((hp_part)part) {
            case HP_COPY: st = sj_cuda_copy(&e, &x, &x2); break;
            case HP_ADD: st = sj_cuda_binary(&e, SJ_OP_ADD, &x, &gb, &x2); break;
            case HP_LAYER_NORM: st = sj_cuda_layer_norm(&e, &x, &g, &b, 1e-5, &x2); break;
            case HP_MATMUL: st = sj_cuda_matmul(&e, &x, &w, &y); break;
            case HP_ATTENTION: st = sj_cuda_attention(&e, &q, &k, &v, NULL, 0.125, 0, &o); break;
            case HP_ALLOC_FREE: {
                CUdeviceptr p = sj_cuda_alloc(cu, 65536, cu->stream);
                if (!p) st = SJ_ENOMEM;
                sj_cuda_free(cu, p, cu->stream);
                break;
            }
            default: break;
            }
            if (i >= 10) h[i - 10] = (bench_now_s() - t0) * 1e6;
            if (st) bench_die(hp_names[part]);
        }
        qsort(h, REPS, sizeof h[0], bench_cmp_double);
        printf("{\"workload\": \"hostparts\", \"part\": \"%s\", \"backend\": \"cuda\", \"dtype\": \"float16\", "
               "\"S\": %lld, \"host_us\": %.2f, \"host_us_p10\": %.2f}\n",
               hp_names[part], (long long)S, h[REPS / 2], h[REPS / 10]);
        fflush(stdout);
    }
    sj_tensor *all[] = {&x, &x2, &w, &y, &g, &b, &q, &k, &v, &o};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) sj_tensor_free(rt, all[i]);
    sj_runtime_destroy(rt);
}

/* What the first product of a new size costs: the qkv product of w4
 * (x [S, 768] @ W [768, 2304], f16), without and with a bias, for token
 * counts in new size classes, in a fresh runtime. Per S, wall ms (the
 * product queued and waited for): the first call, of which choosing the
 * cuBLASLt algorithm (heuristic and check), the same S again, and S + 1
 * (or S - 1 at a class's top: the same class, a new exact size). Not a
 * shared workload. */
static void bench_firstuse(void) {
    sj_runtime *rt = bench_runtime(SJ_BACKEND_CUDA, BENCH_EAGER);
    sj_cuda *cu = sj_cuda_of(rt->backend);
    sj_cuda_exec e = {.cuda = cu, .stream = cu->stream};
    static const int64_t sizes[] = {24, 40, 100, 136, 200, 271, 400, 512, 700, 1000};
    const int64_t w_shape[2] = {BENCH_H, 3 * BENCH_H}, b_shape[1] = {3 * BENCH_H};
    sj_tensor w = dev_rand_dt(rt, SJ_F16, 2, w_shape, -0.05f, 0.05f), bias = dev_rand_dt(rt, SJ_F16, 1, b_shape, -1, 1);
    sj_cuda_matmul_warming(cu, 0); /* the cost warming takes off the request path */
    for (int with_bias = 0; with_bias < 2; with_bias++)
        for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
            int64_t S = sizes[i], S2 = S % 64 ? S + 1 : S - 1;
            double ms[3], choice_ms = 0;
            for (int k = 0; k < 3; k++) {
                int64_t s = k == 2 ? S2 : S, x_shape[2] = {s, BENCH_H}, y_shape[2] = {s, 3 * BENCH_H};
                sj_tensor x = dev_rand_dt(rt, SJ_F16, 2, x_shape, -1, 1), y = dev_rand_dt(rt, SJ_F16, 2, y_shape, -1, 1);
                cu->api.StreamSynchronize(cu->stream);
                uint64_t n0, n1;
                double c0, c1, t0 = bench_now_s();
                sj_cuda_matmul_choices(cu, &n0, &c0);
                if (sj_cuda_matmul_bias(&e, &x, &w, with_bias ? &bias : NULL, &y) ||
                    cu->api.StreamSynchronize(cu->stream))
                    bench_die("firstuse product");
                ms[k] = (bench_now_s() - t0) * 1e3;
                sj_cuda_matmul_choices(cu, &n1, &c1);
                if (k == 0) choice_ms = c1 - c0;
                sj_tensor_free(rt, &x);
                sj_tensor_free(rt, &y);
            }
            printf("{\"workload\": \"firstuse\", \"backend\": \"cuda\", \"dtype\": \"float16\", \"S\": %lld, "
                   "\"bias\": %d, \"first_ms\": %.3f, \"choice_ms\": %.3f, \"again_ms\": %.3f, \"same_class_ms\": %.3f}\n",
                   (long long)S, with_bias, ms[0], choice_ms, ms[1], ms[2]);
            fflush(stdout);
        }
    sj_tensor_free(rt, &w);
    sj_tensor_free(rt, &bias);
    sj_runtime_destroy(rt);
}

/* The lengths in path (at most cap; w5c_read_lengths); *max_len: the longest. */
static int read_lengths(const char *path, int64_t *lens, int cap, int64_t *max_len) {
    int n = w5c_read_lengths(path, lens, cap);
    *max_len = 1;
    for (int i = 0; i < n; i++) *max_len = lens[i] > *max_len ? lens[i] : *max_len;
    return n;
}

/* A CUDA runtime of its own (no kernel cache; never compiling when
 * compile_off) with the encoder layer as function `name`. */
static sj_fn *encoder_runtime(const char *name, int compile_off, sj_runtime **rt, bench_encoder *w) {
    sj_runtime_config cfg;
    sj_runtime_config_init(&cfg);
    cfg.backend = SJ_BACKEND_CUDA;
    cfg.cache_dir = NULL;
    if (compile_off) cfg.compile_mode = SJ_COMPILE_OFF;
    if (sj_runtime_create(&cfg, rt)) bench_die("sj_runtime_create");
    encoder_init(*rt, w);
    sj_fn *fn;
    if (sj_fn_create(*rt, name, 1, bench_w4_model, w, NULL, &fn)) bench_die("sj_fn_create");
    return fn;
}

/* One pass over the request stream: each request's latency from submit to
 * result ready (sj_call waits for it), as the peer measures it. */
static double w5_pass(sj_fn *fn, const sj_tensor *dx, const sj_tensor *dy, const int64_t *lens, int n, double *lat) {
    double t_start = bench_now_s();
    for (int i = 0; i < n; i++) {
        sj_tensor in = *dx, out = *dy;
        in.shape[1] = out.shape[1] = lens[i];
        sj_tensor_set_contiguous(&in);
        sj_tensor_set_contiguous(&out);
        sj_stats before;
        sj_fn_stats(fn, &before);
        double t0 = bench_now_s();
        if (sj_call(fn, &in, 1, &out, 1)) bench_die("w5 request");
        lat[i] = (bench_now_s() - t0) * 1e3;
        if (lat[i] > 2.0) { /* where the slow ones fall (stderr) */
            sj_stats after;
            sj_fn_stats(fn, &after);
            fprintf(stderr, "w5: request %d (S=%lld) %.2f ms; compiles %llu -> %llu, traces %llu -> %llu, %s\n", i,
                    (long long)lens[i], lat[i], (unsigned long long)before.compiles,
                    (unsigned long long)after.compiles, (unsigned long long)before.traces,
                    (unsigned long long)after.traces,
                    after.eager_calls > before.eager_calls ? "eager" : "fused");
        }
    }
    return bench_now_s() - t_start;
}

/* w5: the request stream through the default policy (background compiles,
 * eager until they are ready): "auto" is the first pass of a fresh runtime,
 * the process's first requests (so it also pays what the process loads on
 * first use, such as cuBLASLt's kernels), "auto_warm" a second pass of the
 * same function after its compiles finished; "eager" (never compiles) runs
 * last, on a runtime of its own. Requests over 2 ms are named on stderr,
 * with the compiles and traces before and after them. */
static void bench_w5(const char *lengths_path) {
    enum { CAP = 4096 };
    static int64_t lens[CAP];
    static double lat[CAP], sorted[CAP];
    int64_t max_len;
    int n = read_lengths(lengths_path, lens, quick ? 200 : CAP, &max_len);
    static const char *const modes[] = {"auto", "auto_warm", "eager"};
    for (int mode = 0; mode < 3; mode += 2) { /* auto then auto_warm on one runtime; eager on another */
        sj_runtime *rt;
        bench_encoder w;
        sj_fn *fn = encoder_runtime("w5", mode == 2, &rt, &w);
        sj_tensor dx = dev_rand_dt(rt, SJ_F16, 3, (int64_t[]){1, max_len, BENCH_H}, -1, 1);
        sj_tensor dy = {.dtype = SJ_F16, .rank = 3, .shape = {1, max_len, BENCH_H}, .device = SJ_CUDA};
        if (sj_tensor_alloc(rt, &dy)) bench_die("alloc");
        for (int m = mode; m <= (mode == 0 ? 1 : 2); m++) {
            if (m == 1) sj_fn_wait_idle(fn, -1);
            double total = w5_pass(fn, &dx, &dy, lens, n, lat);
            sj_stats st;
            sj_fn_stats(fn, &st);
            int half = n / 2;
            memcpy(sorted, lat + half, sizeof(double) * (size_t)(n - half));
            qsort(sorted, (size_t)(n - half), sizeof(double), bench_cmp_double);
            double steady = sorted[(n - half) / 2];
            memcpy(sorted, lat, sizeof(double) * (size_t)n);
            qsort(sorted, (size_t)n, sizeof(double), bench_cmp_double);
#define Q(p) sorted[(int)((p) * n) < n - 1 ? (int)((p) * n) : n - 1]
            printf("{\"workload\": \"w5\", \"mode\": \"%s\", \"backend\": \"cuda\", \"dtype\": \"float16\", "
                   "\"requests\": %d, \"of\": %d, \"total_s\": %.4f, \"p50_ms\": %.4f, \"p99_ms\": %.4f, "
                   "\"max_ms\": %.3f, \"steady_p50_ms_last_half\": %.4f, \"compiles\": %llu, \"compile_ms\": %.0f, "
                   "\"tune_ms\": %.0f, "
                   "\"eager_calls\": %llu, \"fused_symbolic_calls\": %llu, \"fused_specialized_calls\": %llu, "
                   "\"graphs\": %llu, \"graph_calls\": %llu, \"bucket_graph_calls\": %llu, \"graph_bytes\": %llu, "
                   "\"graph_evictions\": %llu}\n",
                   modes[m], n, n, total, Q(0.5), Q(0.99), sorted[n - 1], steady, (unsigned long long)st.compiles,
                   st.compile_ms, st.tune_ms, (unsigned long long)st.eager_calls,
                   (unsigned long long)st.fused_symbolic_calls,
                   (unsigned long long)st.fused_specialized_calls, (unsigned long long)st.graphs,
                   (unsigned long long)st.graph_calls, (unsigned long long)st.bucket_graph_calls,
                   (unsigned long long)st.graph_bytes, (unsigned long long)st.graph_evictions);
#undef Q
            fflush(stdout);
        }
        sj_tensor_free(rt, &dx);
        sj_tensor_free(rt, &dy);
        sj_fn_destroy(fn);
        encoder_free(rt, &w);
        sj_runtime_destroy(rt);
    }
}

/* w5 from 8 threads at once on one function (a server's worker threads):
 * thread t serves requests t, t + 8, ... with its own buffers. "mt_warm":
 * through sj_call (the runtime's stream), after a single-threaded pass and
 * its compiles; "mt_streams": the same through sj_call_stream, each thread
 * on a stream of its own that it waits for; "mt_eager": sj_call on a
 * runtime that never compiles. Two passes each (pass 1 may still grow the
 * allocator's cache); total seconds for the 1000 requests and each
 * request's latency. Not a shared workload. */
enum { MT_T = 8 };
typedef struct mt_job {
    sj_fn *fn;
    sj_tensor dx, dy;
    const int64_t *lens;
    int n, t;
    double *lat;
    uint64_t *choices; /* per request: cuBLASLt algorithm choices made while it ran (by any thread) */
    sj_cuda *cu;
    CUstream stream; /* NULL: sj_call */
} mt_job;

static void *mt_thread(void *p) {
    mt_job *j = p;
    for (int i = j->t; i < j->n; i += MT_T) {
        sj_tensor in = j->dx, out = j->dy;
        in.shape[1] = out.shape[1] = j->lens[i];
        sj_tensor_set_contiguous(&in);
        sj_tensor_set_contiguous(&out);
        uint64_t c0, c1;
        double ms;
        sj_cuda_matmul_choices(j->cu, &c0, &ms);
        double t0 = bench_now_s();
        if (j->stream ? sj_call_stream(j->fn, &in, 1, &out, 1, j->stream) ||
                            j->cu->api.StreamSynchronize(j->stream) != CUDA_SUCCESS
                      : sj_call(j->fn, &in, 1, &out, 1) != SJ_OK)
            bench_die("w5mt request");
        j->lat[i] = (bench_now_s() - t0) * 1e3;
        sj_cuda_matmul_choices(j->cu, &c1, &ms);
        j->choices[i] = c1 - c0;
    }
    return NULL;
}

static void bench_w5mt(const char *lengths_path) {
    enum { CAP = 4096 };
    static int64_t lens[CAP];
    static double lat[CAP], sorted[CAP];
    static uint64_t choices[CAP];
    int64_t max_len;
    int n = read_lengths(lengths_path, lens, quick ? 200 : CAP, &max_len);
    static const char *const modes[] = {"mt_warm", "mt_streams", "mt_eager"};
    for (int mode = 0; mode < 3; mode++) {
        sj_runtime *rt;
        bench_encoder w;
        sj_fn *fn = encoder_runtime("w5mt", mode == 2, &rt, &w);
        mt_job jobs[MT_T];
        for (int t = 0; t < MT_T; t++) {
            jobs[t] = (mt_job){.fn = fn, .lens = lens, .n = n, .t = t, .lat = lat, .choices = choices, .cu = sj_cuda_of(rt->backend)};
            if (mode == 1 && sj_cuda_of(rt->backend)->api.StreamCreate(&jobs[t].stream, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS)
                bench_die("cuStreamCreate");
            jobs[t].dx = dev_rand_dt(rt, SJ_F16, 3, (int64_t[]){1, max_len, BENCH_H}, -1, 1);
            jobs[t].dy = (sj_tensor){.dtype = SJ_F16, .rank = 3, .shape = {1, max_len, BENCH_H}, .device = SJ_CUDA};
            if (sj_tensor_alloc(rt, &jobs[t].dy)) bench_die("alloc");
        }
        /* one pass on this thread first: traces, compiles (waited for),
         * and every product size class met once */
        for (int t = 0; t < MT_T; t++) {
            jobs[t].t = 0;
            mt_thread(&jobs[t]);
            jobs[t].t = t;
            if (t == 0) sj_fn_wait_idle(fn, -1);
        }
        for (int pass = 1; pass <= 2; pass++) {
            pthread_t th[MT_T];
            pthread_mutex_lock(&sj_cuda_of(rt->backend)->alloc_lock);
            uint64_t mallocs0 = sj_cuda_of(rt->backend)->allocs, alloc_ns0 = sj_cuda_of(rt->backend)->alloc_ns, ch0, ch1;
            double ch_ms;
            sj_cuda_matmul_choices(sj_cuda_of(rt->backend), &ch0, &ch_ms);
            sj_cuda_of(rt->backend)->alloc_ns_max = sj_cuda_of(rt->backend)->event_ns_max = 0;
            uint64_t events0 = sj_cuda_of(rt->backend)->events_created;
            pthread_mutex_unlock(&sj_cuda_of(rt->backend)->alloc_lock);
            double t0 = bench_now_s();
            for (int t = 0; t < MT_T; t++)
                if (pthread_create(&th[t], NULL, mt_thread, &jobs[t])) bench_die("pthread_create");
            for (int t = 0; t < MT_T; t++) pthread_join(th[t], NULL);
            double total = bench_now_s() - t0;
            sj_cuda_matmul_choices(sj_cuda_of(rt->backend), &ch1, &ch_ms);
            for (int i = 0; i < n; i++) /* where the slow ones fall (stderr) */
                if (lat[i] > 5.0)
                    fprintf(stderr, "w5mt %s pass %d: request %d (S=%lld, thread %d) %.2f ms, %llu cuBLASLt choices meanwhile\n",
                            modes[mode], pass, i, (long long)lens[i], i % MT_T, lat[i], (unsigned long long)choices[i]);
            memcpy(sorted, lat, sizeof(double) * (size_t)n);
            qsort(sorted, (size_t)n, sizeof(double), bench_cmp_double);
            printf("{\"workload\": \"w5mt\", \"mode\": \"%s\", \"pass\": %d, \"backend\": \"cuda\", "
                   "\"dtype\": \"float16\", \"threads\": %d, \"requests\": %d, \"total_s\": %.4f, "
                   "\"requests_per_s\": %.0f, \"p50_ms\": %.4f, \"p99_ms\": %.4f, \"max_ms\": %.3f, "
                   "\"cuMemAlloc_calls\": %llu, \"cuMemAlloc_ms\": %.3f, \"cuMemAlloc_max_ms\": %.3f, "
                   "\"cublaslt_choices\": %llu, \"cuEventCreate_calls\": %llu, \"cuEventCreate_max_ms\": %.3f}\n",
                   modes[mode], pass, MT_T, n, total, n / total, sorted[n / 2], sorted[n * 99 / 100], sorted[n - 1],
                   (unsigned long long)(sj_cuda_of(rt->backend)->allocs - mallocs0), (double)(sj_cuda_of(rt->backend)->alloc_ns - alloc_ns0) / 1e6,
                   (double)sj_cuda_of(rt->backend)->alloc_ns_max / 1e6, (unsigned long long)(ch1 - ch0),
                   (unsigned long long)(sj_cuda_of(rt->backend)->events_created - events0), (double)sj_cuda_of(rt->backend)->event_ns_max / 1e6);
            fflush(stdout);
        }
        for (int t = 0; t < MT_T; t++) {
            sj_tensor_free(rt, &jobs[t].dx);
            sj_tensor_free(rt, &jobs[t].dy);
            if (jobs[t].stream) sj_cuda_of(rt->backend)->api.StreamDestroy(jobs[t].stream);
        }
        sj_fn_destroy(fn);
        encoder_free(rt, &w);
        sj_runtime_destroy(rt);
    }
}

/* Is name one of the comma-separated workloads in wl? */
static int has_wl(const char *wl, const char *name) {
    size_t n = strlen(name);
    for (const char *p = wl; (p = strstr(p, name)) != NULL; p += n)
        if ((p == wl || p[-1] == ',') && (p[n] == ',' || p[n] == 0)) return 1;
    return 0;
}

/* $SJ_BENCH_SEGV_TRACE: on a crash, the faulting thread's frames as
 * binary(+offset), for addr2line against the unstripped build. */
static void segv_trace(int sig) {
    void *frames[64];
    int n = backtrace(frames, 64);
    static const char msg[] = "bench_cuda: fatal signal; frames:\n";
    if (write(2, msg, sizeof msg - 1) < 0) {
    }
    backtrace_symbols_fd(frames, n, 2);
    signal(sig, SIG_DFL);
    raise(sig);
}

/* bgparts: where a bucket graph's replay spends its time (issue 28). The
 * f16 encoder layer at S = 128 and 127, mean microseconds a call over 2000
 * synchronous calls, three interleaved rounds:
 *   exact:     a graph of the exact shape and buffers (S = 128);
 *   same:      the bucket (64, 128]'s graph, every call S = 128 (no
 *              update: the copies in and out and the launch beside the
 *              exact graph's);
 *   alternate: the same graph, S = 127 and 128 in turn: each size's copy
 *              (cfg.bucket_graph_execs) already holds it, no update;
 *   alternate_1copy: the same in a runtime with bucket_graph_execs 1
 *              (every call updates the graph's kernels).
 * same - exact: the copies and bookkeeping; alternate_1copy - same: an
 * update (the GPU does about the same work in all). */
static double bg_time(sj_fn *fn, const sj_tensor *dx, const sj_tensor *dy, int alternate, int n) {
    double t0 = bench_now_s();
    for (int i = 0; i < n; i++) {
        sj_tensor x = *dx, y = *dy;
        x.shape[1] = y.shape[1] = alternate && (i & 1) ? 127 : 128;
        sj_tensor_set_contiguous(&x);
        sj_tensor_set_contiguous(&y);
        if (sj_call(fn, &x, 1, &y, 1)) bench_die("bgparts call");
    }
    return (bench_now_s() - t0) / n * 1e6;
}

/* The CUDA backend's bucket graph counts (bench_w5cold.h's w5c_bg_read). */
static void bg_read(sj_runtime *rt, w5c_bg *out) {
    const sj_cuda *cu = sj_cuda_of(rt->backend);
    if (!cu) return;
    *out = (w5c_bg){.updates = atomic_load(&cu->bg_updates), .copies = atomic_load(&cu->bg_instantiated),
                    .copies_ns = atomic_load(&cu->bg_inst_ns), .declined = atomic_load(&cu->bg_declined),
                    .why = cu->bg_why};
}

static void bench_bgparts(void) {
    sj_runtime *rt, *rt1;
    bench_encoder w, w1;
    sj_fn *fe = encoder_runtime("bg_exact", 0, &rt, &w), *fb;
    if (sj_fn_create(rt, "bg_bucket", 1, bench_w4_model, &w, NULL, &fb)) bench_die("sj_fn_create");
    if (sj_set_buckets_pow2(fb, 0, 1, 16, 512)) bench_die("buckets");
    setenv("SHAPEJIT_BUCKET_GRAPH_EXECS", "1", 1); /* (read by the runtime's config) */
    sj_fn *f1 = encoder_runtime("bg_bucket_1copy", 0, &rt1, &w1);
    unsetenv("SHAPEJIT_BUCKET_GRAPH_EXECS");
    if (sj_set_buckets_pow2(f1, 0, 1, 16, 512)) bench_die("buckets");
    sj_tensor dx1 = dev_rand_dt(rt1, SJ_F16, 3, (int64_t[]){1, 128, BENCH_H}, -1, 1);
    sj_tensor dy1 = {.dtype = SJ_F16, .rank = 3, .shape = {1, 128, BENCH_H}, .device = SJ_CUDA};
    if (sj_tensor_alloc(rt1, &dy1)) bench_die("alloc");
    sj_tensor dx = dev_rand_dt(rt, SJ_F16, 3, (int64_t[]){1, 128, BENCH_H}, -1, 1);
    sj_tensor dy = {.dtype = SJ_F16, .rank = 3, .shape = {1, 128, BENCH_H}, .device = SJ_CUDA};
    if (sj_tensor_alloc(rt, &dy)) bench_die("alloc");
    /* the exact shape's graph: its 48 calls, then the capture */
    for (int i = 0; i < 2 * 48; i++) bg_time(fe, &dx, &dy, 0, 1);
    sj_fn_wait_idle(fe, -1);
    /* the bucket's graph from a warm-up on inputs the runtime makes (so no
     * exact graph for the buffers comes first) */
    sj_tensor tmpl = dx;
    tmpl.data = NULL;
    sj_warmup_spec spec = {.n_shapes = 1, .shapes = &tmpl};
    if (sj_fn_warmup(fb, &spec, 0) || sj_fn_warmup(f1, &spec, 0)) bench_die("bgparts warm-up");
    sj_fn_wait_idle(fb, -1);
    sj_fn_wait_idle(f1, -1);
    double r[4][3];
    uint64_t upd[4] = {0};
    for (int round = 0; round < 3; round++) { /* interleaved */
        for (int k = 0; k < 4; k++) {
            sj_runtime *kr = k == 3 ? rt1 : rt;
            uint64_t u0 = w5c_bg_now(kr).updates;
            r[k][round] = k == 3 ? bg_time(f1, &dx1, &dy1, 1, 2000) : bg_time(k ? fb : fe, &dx, &dy, k == 2, 2000);
            upd[k] += w5c_bg_now(kr).updates - u0;
        }
    }
    sj_stats st[4];
    sj_fn_stats(fe, &st[0]);
    sj_fn_stats(fb, &st[1]);
    st[2] = st[1];
    sj_fn_stats(f1, &st[3]);
    static const char *const names[] = {"exact", "same", "alternate", "alternate_1copy"};
    for (int k = 0; k < 4; k++) {
        double m = r[k][0] < r[k][1] ? r[k][0] : r[k][1];
        m = m < r[k][2] ? m : r[k][2];
        printf("{\"workload\": \"bgparts\", \"mode\": \"%s\", \"backend\": \"cuda\", \"dtype\": \"float16\", "
               "\"S\": 128, \"us_per_call_min_of_3\": %.2f, \"rounds_us\": [%.2f, %.2f, %.2f], \"graph_calls\": %llu, "
               "\"bucket_graph_calls\": %llu, \"updates\": %llu}\n",
               names[k], m, r[k][0], r[k][1], r[k][2], (unsigned long long)st[k].graph_calls,
               (unsigned long long)st[k].bucket_graph_calls, (unsigned long long)upd[k]);
    }
    fflush(stdout);
    sj_tensor_free(rt, &dx);
    sj_tensor_free(rt, &dy);
    sj_tensor_free(rt1, &dx1);
    sj_tensor_free(rt1, &dy1);
    sj_fn_destroy(fe);
    sj_fn_destroy(fb);
    sj_fn_destroy(f1);
    encoder_free(rt, &w);
    encoder_free(rt1, &w1);
    sj_runtime_destroy(rt);
    sj_runtime_destroy(rt1);
}

/* Each kernel's device time in one call of fn (sj_cuda.time_launches: a
 * pair of events around each launch, so the kernels run one after
 * another with no overlap), the median of W4K_REPS calls: one JSON line a
 * kernel, then their sum, and an empty pair's time (what each line holds
 * besides its kernel). The stream is held (hold_stream) before each call,
 * so that every launch is queued before the device reaches the first
 * event: a pair then times the device alone, not the host's issue of the
 * launch between them. */
enum { W4K_REPS = 9, W4K_MAX = 32 };
static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

static void w4k_times(sj_cuda *cu, sj_fn *fn, sj_tensor *x, sj_tensor *y, const char *mode, int64_t S) {
    struct sj_cuda_timed tl[W4K_MAX] = {0};
    for (int i = 0; i < W4K_MAX; i++)
        if (cu->api.EventCreate(&tl[i].e0, CU_EVENT_DEFAULT) || cu->api.EventCreate(&tl[i].e1, CU_EVENT_DEFAULT))
            bench_die("w4kernels: events");
    static float us[W4K_MAX][W4K_REPS];
    CUfunction fs[W4K_MAX] = {0};
    int n = -1;
    cu->tl = tl, cu->tl_cap = W4K_MAX;
    if (!cu->api.LaunchHostFunc) {
        printf("{\"workload\": \"w4ktime\", \"skipped\": \"no cuLaunchHostFunc\"}\n");
        return;
    }
    float empty[W4K_REPS];
    for (int r = 0; r < W4K_REPS; r++) {
        cu->tl_n = 0;
        if (cu->api.LaunchHostFunc(cu->stream, hold_stream, NULL)) bench_die("w4kernels: host function");
        cu->time_launches = true;
        if (sj_call(fn, x, 1, y, 1)) bench_die("w4kernels call");
        cu->time_launches = false;
        if (cu->api.CtxSynchronize()) bench_die("w4kernels: synchronize");
        if (n >= 0 && cu->tl_n != n) bench_die("w4kernels: the calls launched different kernels");
        n = cu->tl_n;
        for (int k = 0; k < n; k++) {
            float ms = 0;
            if (cu->api.EventElapsedTime(&ms, tl[k].e0, tl[k].e1)) bench_die("w4kernels: elapsed");
            us[k][r] = ms * 1e3f;
            fs[k] = tl[k].f;
        }
        float ms = 0; /* an empty pair, held the same way */
        if (cu->api.LaunchHostFunc(cu->stream, hold_stream, NULL) || cu->api.EventRecord(tl[0].e0, cu->stream) ||
            cu->api.EventRecord(tl[0].e1, cu->stream) || cu->api.EventSynchronize(tl[0].e1) ||
            cu->api.EventElapsedTime(&ms, tl[0].e0, tl[0].e1))
            bench_die("w4kernels: an empty pair");
        empty[r] = ms * 1e3f;
    }
    qsort(empty, W4K_REPS, sizeof empty[0], cmp_float);
    cu->tl = NULL, cu->tl_cap = 0, cu->tl_n = 0;
    double total = 0;
    for (int k = 0; k < n; k++) {
        qsort(us[k], W4K_REPS, sizeof us[k][0], cmp_float);
        const char *name = fs[k] ? "kernel" : "cuBLASLt product";
        if (fs[k] && cu->api.FuncGetName && cu->api.FuncGetName(&name, fs[k])) name = "kernel";
        total += us[k][W4K_REPS / 2];
        printf("{\"workload\": \"w4ktime\", \"mode\": \"%s\", \"S\": %lld, \"launch\": %d, \"kernel\": \"%.60s\", "
               "\"device_us\": %.2f}\n", mode, (long long)S, k, name, us[k][W4K_REPS / 2]);
    }
    printf("{\"workload\": \"w4ktime\", \"mode\": \"%s\", \"S\": %lld, \"launches\": %d, \"sum_device_us\": %.2f, "
           "\"empty_pair_us\": %.2f}\n", mode, (long long)S, n, total, empty[W4K_REPS / 2]);
    for (int i = 0; i < W4K_MAX; i++) cu->api.EventDestroy(tl[i].e0), cu->api.EventDestroy(tl[i].e1);
}

/* w4kernels: what one fused call of the encoder layer launches (issue 29's
 * "count them"): kernels of ours (generated, eager, attention) and cuBLASLt
 * products (each one or two kernels of its own), per call, kernel by
 * kernel (counted before any graph is captured), static and symbolic, S =
 * 16 and 512; SHAPEJIT_CUDA_GEMM says whether products are generated;
 * then each one's device time alone (w4k_times: "w4ktime" lines). */
static void bench_w4kernels(void) {
    for (int mode = BENCH_STATIC; mode <= BENCH_SYMBOLIC; mode++) {
        sj_runtime *rt = bench_runtime(SJ_BACKEND_CUDA, (bench_mode)mode);
        bench_encoder w;
        encoder_init(rt, &w);
        sj_fn *fn = bench_fn_user(rt, "w4k", 1, bench_w4_model, &w, (bench_mode)mode);
        sj_cuda *cu = sj_cuda_of(rt->backend);
        static const int64_t sizes[] = {16, 512};
        for (int i = 0; i < 2; i++) {
            sj_tensor x = dev_rand_dt(rt, SJ_F16, 3, (int64_t[]){1, sizes[i], BENCH_H}, -1, 1);
            sj_tensor y = {.dtype = SJ_F16, .rank = 3, .shape = {1, sizes[i], BENCH_H}, .device = SJ_CUDA};
            if (sj_tensor_alloc(rt, &y)) bench_die("alloc");
            for (int k = 0; k < 3; k++) /* compiled (sync mode) and warm */
                if (sj_call(fn, &x, 1, &y, 1)) bench_die("w4kernels call");
            cu->count_launches = true;
            uint64_t k0 = atomic_load(&cu->n_kernels), p0 = atomic_load(&cu->n_products);
            enum { N = 10 };
            for (int k = 0; k < N; k++)
                if (sj_call(fn, &x, 1, &y, 1)) bench_die("w4kernels call");
            cu->count_launches = false;
            w4k_times(cu, fn, &x, &y, bench_mode_names[mode], sizes[i]);
            sj_stats st;
            sj_fn_stats(fn, &st);
            printf("{\"workload\": \"w4kernels\", \"mode\": \"%s\", \"backend\": \"cuda\", \"dtype\": \"float16\", "
                   "\"S\": %lld, \"our_kernels_per_call\": %.1f, \"cublaslt_products_per_call\": %.1f, "
                   "\"eager_calls\": %llu, \"graph_calls\": %llu}\n",
                   bench_mode_names[mode], (long long)sizes[i], (double)(atomic_load(&cu->n_kernels) - k0) / N,
                   (double)(atomic_load(&cu->n_products) - p0) / N, (unsigned long long)st.eager_calls,
                   (unsigned long long)st.graph_calls);
            fflush(stdout);
            sj_tensor_free(rt, &x);
            sj_tensor_free(rt, &y);
        }
        sj_fn_destroy(fn);
        encoder_free(rt, &w);
        sj_runtime_destroy(rt);
    }
}

/* newshape: from the first sight of a new shape to its first fused call
 * (issue 28's "under 200 ms"), the default background compiles: the
 * encoder layer with every size a constant (each new S traces and compiles
 * a unit of its own), S = 64, then 100 and 200 in the same runtime (NVRTC
 * and the driver loaded by then); the calls meanwhile run eagerly, one
 * after another. Per S: ms from the first call to the start of the first
 * fused one, the eager calls meanwhile, the compile's own ms. Run it with
 * CUDA_CACHE_DISABLE=1 for a cold figure. */
static void bench_newshape(void) {
    sj_runtime_config cfg;
    sj_runtime_config_init(&cfg);
    cfg.backend = SJ_BACKEND_CUDA;
    cfg.cache_dir = NULL;
    sj_runtime *rt;
    if (sj_runtime_create(&cfg, &rt)) bench_die("sj_runtime_create");
    bench_encoder w;
    encoder_init(rt, &w);
    sj_fn_options o;
    sj_fn_options_init(&o);
    o.dynamic = SJ_DYNAMIC_STATIC;
    o.hot_threshold = 1;
    sj_fn *fn;
    if (sj_fn_create(rt, "newshape", 1, bench_w4_model, &w, &o, &fn)) bench_die("sj_fn_create");
    static const int64_t sizes[] = {64, 100, 200};
    for (int i = 0; i < 3; i++) {
        int64_t S = sizes[i];
        sj_tensor x = dev_rand_dt(rt, SJ_F16, 3, (int64_t[]){1, S, BENCH_H}, -1, 1);
        sj_tensor y = {.dtype = SJ_F16, .rank = 3, .shape = {1, S, BENCH_H}, .device = SJ_CUDA};
        if (sj_tensor_alloc(rt, &y)) bench_die("alloc");
        sj_stats s0;
        sj_fn_stats(fn, &s0);
        double t0 = bench_now_s(), t_fused = -1;
        int eager = 0;
        while (bench_now_s() - t0 < 30) {
            sj_stats a, b;
            sj_fn_stats(fn, &a);
            double tc = bench_now_s();
            if (sj_call(fn, &x, 1, &y, 1)) bench_die("newshape call");
            sj_fn_stats(fn, &b);
            if (b.eager_calls == a.eager_calls) {
                t_fused = tc - t0;
                break;
            }
            eager++;
        }
        sj_stats s1;
        sj_fn_stats(fn, &s1);
        printf("{\"workload\": \"newshape\", \"backend\": \"cuda\", \"dtype\": \"float16\", \"S\": %lld, "
               "\"first_fused_after_ms\": %.1f, \"eager_calls_meanwhile\": %d, \"compiles\": %llu, "
               "\"compile_ms\": %.1f, \"tune_ms\": %.1f}\n",
               (long long)S, t_fused * 1e3, eager, (unsigned long long)(s1.compiles - s0.compiles),
               s1.compile_ms - s0.compile_ms, s1.tune_ms - s0.tune_ms);
        fflush(stdout);
        sj_tensor_free(rt, &x);
        sj_tensor_free(rt, &y);
    }
    sj_fn_destroy(fn);
    encoder_free(rt, &w);
    sj_runtime_destroy(rt);
}

/* gathergraph: the share of calls CUDA graphs serve on a stream of
 * repeated shapes, a model with an embedding gather against the same model
 * with a plain input (issue 26; target: the same share). Model: e =
 * gather(table [8192, 384] f32, ids [B, S] i32) (gather) or e = x [B, S,
 * 384] (plain); y = softmax(gelu(LN(e)) + e) over the last axis. Each on a
 * stream of 2000 synchronous calls cycling over 4 shapes (B x S = 1 x 16,
 * 1 x 64, 4 x 32, 8 x 128), fixed input and output buffers per shape, in
 * two modes (fused_static, fused_symbolic: bench_fn_user). One JSON line
 * per model and mode: calls, graph_calls and their share, and the largest
 * difference between the two models' outputs for the last shape (plain
 * fed the gathered rows: 0 expected). */
enum { GG_V = 8192, GG_H = 384, GG_SHAPES = 4, GG_CALLS = 2000 };
typedef struct gg_weights {
    sj_tensor table, g, b;
} gg_weights;

static sj_status gg_tail(sj_tracer *t, sj_val e, const gg_weights *w) {
    sj_val h = sj_gelu(t, sj_layer_norm(t, e, sj_param(t, &w->g), sj_param(t, &w->b), 1e-5));
    return sj_output(t, sj_softmax(t, sj_add(t, h, e), -1));
}
static sj_status gg_gather_model(sj_tracer *t, const sj_val *in, int n, void *u) {
    (void)n;
    const gg_weights *w = u;
    return gg_tail(t, sj_gather(t, sj_param(t, &w->table), in[0]), w);
}
static sj_status gg_plain_model(sj_tracer *t, const sj_val *in, int n, void *u) {
    (void)n;
    return gg_tail(t, in[0], u);
}

static void bench_gathergraph(void) {
    static const int64_t shapes[GG_SHAPES][2] = {{1, 16}, {1, 64}, {4, 32}, {8, 128}};
    uint64_t r = 0x853C49E6748FEA9Bull;
    float *htab = malloc(sizeof(float) * GG_V * GG_H);
    if (!htab) bench_die("gathergraph: host table");
    bench_fill_rand(htab, (size_t)GG_V * GG_H, -1, 1, &r);
    for (int mode = BENCH_STATIC; mode <= BENCH_SYMBOLIC; mode++) {
        sj_runtime *rt = bench_runtime(SJ_BACKEND_CUDA, (bench_mode)mode);
        gg_weights w;
        w.table = sj_tensor_make(NULL, SJ_F32, 2, (int64_t[]){GG_V, GG_H});
        w.table.device = SJ_CUDA;
        if (sj_tensor_alloc(rt, &w.table)) bench_die("gathergraph: alloc");
        sj_tensor ht = sj_tensor_make(htab, SJ_F32, 2, (int64_t[]){GG_V, GG_H});
        if (sj_tensor_copy(rt, &w.table, &ht)) bench_die("gathergraph: copy");
        w.g = dev_rand(rt, 1, (int64_t[]){GG_H}, 0.9f, 1.1f);
        w.b = dev_rand(rt, 1, (int64_t[]){GG_H}, -0.1f, 0.1f);
        float *last[2] = {NULL, NULL};
        for (int model = 0; model < 2; model++) { /* 0 gather, 1 plain */
            sj_fn *fn = bench_fn_user(rt, model ? "gg_plain" : "gg_gather", 1, model ? gg_plain_model : gg_gather_model,
                                      &w, (bench_mode)mode);
            sj_tensor in[GG_SHAPES], out[GG_SHAPES];
            for (int k = 0; k < GG_SHAPES; k++) {
                int64_t B = shapes[k][0], S = shapes[k][1], n = B * S;
                int32_t *ids = malloc(sizeof(int32_t) * (size_t)n);
                uint64_t ir = 0x9E3779B97F4A7C15ull + (uint64_t)k; /* the same ids for both models */
                for (int64_t i = 0; i < n; i++) {
                    ir ^= ir << 13, ir ^= ir >> 7, ir ^= ir << 17;
                    ids[i] = (int32_t)(ir % GG_V);
                }
                if (model == 0) {
                    in[k] = sj_tensor_make(NULL, SJ_I32, 2, (int64_t[]){B, S});
                    in[k].device = SJ_CUDA;
                    if (sj_tensor_alloc(rt, &in[k])) bench_die("gathergraph: alloc");
                    sj_tensor h = sj_tensor_make(ids, SJ_I32, 2, (int64_t[]){B, S});
                    if (sj_tensor_copy(rt, &in[k], &h)) bench_die("gathergraph: copy");
                } else { /* the rows the gather picks, gathered on the host */
                    float *rows = malloc(sizeof(float) * (size_t)(n * GG_H));
                    for (int64_t i = 0; i < n; i++) memcpy(rows + i * GG_H, htab + (int64_t)ids[i] * GG_H, sizeof(float) * GG_H);
                    in[k] = sj_tensor_make(NULL, SJ_F32, 3, (int64_t[]){B, S, GG_H});
                    in[k].device = SJ_CUDA;
                    if (sj_tensor_alloc(rt, &in[k])) bench_die("gathergraph: alloc");
                    sj_tensor h = sj_tensor_make(rows, SJ_F32, 3, (int64_t[]){B, S, GG_H});
                    if (sj_tensor_copy(rt, &in[k], &h)) bench_die("gathergraph: copy");
                    free(rows);
                }
                free(ids);
                out[k] = sj_tensor_make(NULL, SJ_F32, 3, (int64_t[]){B, S, GG_H});
                out[k].device = SJ_CUDA;
                if (sj_tensor_alloc(rt, &out[k])) bench_die("gathergraph: alloc");
            }
            double t0 = bench_now_s();
            for (int i = 0; i < GG_CALLS; i++)
                if (sj_call(fn, &in[i % GG_SHAPES], 1, &out[i % GG_SHAPES], 1)) bench_die("gathergraph: sj_call");
            double secs = bench_now_s() - t0;
            sj_stats st;
            sj_fn_stats(fn, &st);
            /* the last shape's output, for the two models' comparison */
            int64_t nl = shapes[GG_SHAPES - 1][0] * shapes[GG_SHAPES - 1][1] * GG_H;
            last[model] = malloc(sizeof(float) * (size_t)nl);
            sj_tensor hl = sj_tensor_make(last[model], SJ_F32, 3,
                                          (int64_t[]){shapes[GG_SHAPES - 1][0], shapes[GG_SHAPES - 1][1], GG_H});
            if (sj_tensor_copy(rt, &hl, &out[GG_SHAPES - 1])) bench_die("gathergraph: copy back");
            double diff = 0;
            if (model == 1)
                for (int64_t i = 0; i < nl; i++) {
                    double d = fabs((double)last[0][i] - (double)last[1][i]);
                    diff = d > diff ? d : diff;
                }
            printf("{\"workload\": \"gathergraph\", \"model\": \"%s\", \"mode\": \"%s\", \"backend\": \"cuda\", "
                   "\"shapes\": %d, \"calls\": %llu, \"graph_calls\": %llu, \"graph_share\": %.4f, "
                   "\"bucket_graph_calls\": %llu, \"eager_calls\": %llu, \"graphs\": %llu, \"graph_failures\": %llu, \"us_per_call\": %.2f",
                   model ? "plain" : "gather", bench_mode_names[mode], GG_SHAPES, (unsigned long long)st.calls,
                   (unsigned long long)st.graph_calls, st.calls ? (double)st.graph_calls / (double)st.calls : 0.0,
                   (unsigned long long)st.bucket_graph_calls, (unsigned long long)st.eager_calls,
                   (unsigned long long)st.graphs, (unsigned long long)st.graph_failures, secs / GG_CALLS * 1e6);
            if (model == 1) printf(", \"max_abs_diff_vs_gather\": %.3g", diff);
            printf("}\n");
            fflush(stdout);
            for (int k = 0; k < GG_SHAPES; k++) {
                sj_tensor_free(rt, &in[k]);
                sj_tensor_free(rt, &out[k]);
            }
            sj_fn_destroy(fn);
        }
        free(last[0]), free(last[1]);
        sj_tensor_free(rt, &w.table);
        sj_tensor_free(rt, &w.g);
        sj_tensor_free(rt, &w.b);
        sj_runtime_destroy(rt);
    }
    free(htab);
}

int main(int argc, char **argv) {
    double t0_main = bench_now_s(), exec_to_main = w5c_since_exec_s();
    if (getenv("SJ_BENCH_SEGV_TRACE")) signal(SIGSEGV, segv_trace);
    const char *wl = "ceiling,w0,w1,w2,w3";
    const char *lengths = "samples/varlen_encoder/lengths.txt"; /* a copy of w5_lengths.txt */
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) quick = 1;
        else if (!strcmp(argv[i], "--workloads") && i + 1 < argc) wl = argv[++i];
        else if (!strcmp(argv[i], "--lengths") && i + 1 < argc) lengths = argv[++i];
        else {
            fprintf(stderr, "usage: %s [--quick] [--workloads ceiling,w0,w1,w2,w3,w4,w5,attention,attc,hostparts,firstuse,w5mt,w5cold,bgparts,newshape,w4kernels,gathergraph] [--lengths file]\n", argv[0]);
            return 2;
        }
    }
    w5c_bg_read = bg_read;
    if (has_wl(wl, "w5cold")) { /* first: the process is cold only once */
        static int64_t lens[4096];
        int n = w5c_read_lengths(lengths, lens, quick ? 200 : 4096);
        bench_w5cold(SJ_BACKEND_CUDA, SJ_F16, t0_main, exec_to_main, lens, n);
    }
    sj_runtime_config cfg;
    sj_runtime_config_init(&cfg);
    cfg.backend = SJ_BACKEND_CUDA;
    cfg.cache_dir = NULL;
    sj_runtime *rt;
    if (sj_runtime_create(&cfg, &rt)) {
        printf("{\"workload\": \"skipped\", \"reason\": \"no CUDA device: %s\"}\n", sj_last_error());
        return 0;
    }
    if (has_wl(wl, "ceiling") || has_wl(wl, "w1") || has_wl(wl, "w2") || has_wl(wl, "w3"))
        bench_ceiling(rt); /* w1-w3 report their fraction of it */
    sj_runtime_destroy(rt);
    if (has_wl(wl, "w0")) bench_w0();
    for (int w = 1; w <= 3; w++) {
        char name[4] = {'w', (char)('0' + w), 0};
        if (has_wl(wl, name)) bench_w(w);
    }
    if (has_wl(wl, "attention")) bench_attention();
    if (has_wl(wl, "attc")) bench_attc();
    if (has_wl(wl, "hostparts")) bench_hostparts();
    if (has_wl(wl, "firstuse")) bench_firstuse();
    if (has_wl(wl, "w5mt")) bench_w5mt(lengths);
    if (has_wl(wl, "bgparts")) bench_bgparts();
    if (has_wl(wl, "newshape")) bench_newshape();
    if (has_wl(wl, "w4kernels")) bench_w4kernels();
    if (has_wl(wl, "gathergraph")) bench_gathergraph();
    if (has_wl(wl, "w4")) bench_w4();
    if (has_wl(wl, "w5")) bench_w5(lengths);
    return 0;
}

#else

int main(void) {
    printf("{\"workload\": \"skipped\", \"reason\": \"built without the CUDA backend\"}\n");
    return 0;
}

#endif
