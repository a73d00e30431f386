/* CPU benchmarks for the shared workloads (../shared/workloads/README.md).
 *
 *   bench_cpu [--quick] [--workloads ceiling,w0,w1,w2,w3,kernels]
 *
 * Prints one JSON object per line. Times are wall-clock medians of many
 * repetitions after a warm-up; inputs are random (never zeros). The memcpy
 * ceiling is measured in the same run, single-threaded like the eager
 * kernels, counting bytes read plus bytes written as the peer does.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "jit/shapejit.h"
#include "kernels/cpu/eager.h"

static int quick;

/* -- Helpers ------------------------------------------------------------------- */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static uint64_t rng = 0x243F6A8885A308D3ull;
static float *rand_f32(size_t n, float lo, float hi) {
    float *p = aligned_alloc(64, (n * sizeof *p + 63) / 64 * 64);
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    for (size_t i = 0; i < n; i++) {
        rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
        p[i] = lo + (hi - lo) * (float)((rng >> 40) * (1.0 / 16777216.0));
        if (p[i] == 0.0f) p[i] = 0.5f;
    }
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
    double t0 = now_s();
    sj_status st = sj_call(c->fn, c->in, c->n_in, c->out, c->n_out);
    double t = now_s() - t0;
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
    qsort(t, (size_t)reps, sizeof *t, cmp_double);
    double m = t[reps / 2];
    free(t);
    return m;
}

/* -- Ceiling -------------------------------------------------------------------- */

static double ceiling_GBps;

static void bench_ceiling(void) {
    size_t n = (size_t)(quick ? 32 : 128) << 20; /* bytes per buffer */
    char *src = (char *)rand_f32(n / 4, -1, 1), *dst = (char *)rand_f32(n / 4, -1, 1);
    double best[9];
    for (int i = 0; i < 9; i++) {
        double t0 = now_s();
        memcpy(dst, src, n);
        best[i] = now_s() - t0;
    }
    qsort(best, 9, sizeof best[0], cmp_double);
    ceiling_GBps = 2.0 * (double)n / best[4] / 1e9;
    printf("{\"workload\": \"ceiling\", \"backend\": \"cpu\", \"copy_GBps_read_plus_write\": %.2f, \"bytes\": %zu}\n",
           ceiling_GBps, n);
    free(src);
    free(dst);
}

/* -- w0: dispatch --------------------------------------------------------------- */

static sj_status w0_model(sj_tracer *t, const sj_val *in, int n, void *u) {
    return sj_output(t, sj_add(t, in[0], sj_scalar(t, 1.0)));
}

static void bench_w0(sj_runtime *rt) {
    sj_fn *fn;
    if (sj_fn_create(rt, "w0", 1, w0_model, NULL, NULL, &fn)) exit(1);
    float *x = rand_f32(8, -1, 1), y[8], one = 1.0f;
    sj_tensor in = sj_tensor_make(x, SJ_F32, 1, (int64_t[]){8}), out = sj_tensor_make(y, SJ_F32, 1, (int64_t[]){8});
    call_ctx c = {fn, &in, &out, 1, 1};
    int reps = quick ? 20000 : 200000;
    double *t = malloc((size_t)reps * sizeof *t);
    for (int i = 0; i < 1000; i++) time_call_ms(&c);
    /* Batches of 100 calls: the clock read costs about as much as a call. */
    int batches = reps / 100;
    for (int b = 0; b < batches; b++) {
        double t0 = now_s();
        for (int i = 0; i < 100; i++) sj_call(fn, &in, 1, &out, 1);
        t[b] = (now_s() - t0) / 100 * 1e6;
    }
    qsort(t, (size_t)batches, sizeof *t, cmp_double);
    double call_us = t[batches / 2];

    /* The kernel alone, as the eager executor calls it. */
    sj_tensor s = {.data = &one, .dtype = SJ_F32, .rank = 1, .shape = {8}, .stride = {0}};
    for (int b = 0; b < batches; b++) {
        double t0 = now_s();
        for (int i = 0; i < 100; i++) sj_cpu_binary(SJ_OP_ADD, &in, &s, &out);
        t[b] = (now_s() - t0) / 100 * 1e6;
    }
    qsort(t, (size_t)batches, sizeof *t, cmp_double);
    double kern_us = t[batches / 2];
    printf("{\"workload\": \"w0\", \"mode\": \"eager\", \"backend\": \"cpu\", \"host_us_per_call\": %.4f, "
           "\"kernel_us\": %.4f, \"overhead_us\": %.4f}\n",
           call_us, kern_us, call_us - kern_us);
    free(t);
    free(x);
    sj_fn_destroy(fn);
}

/* -- w1-w3 ------------------------------------------------------------------------- */

static sj_status w1_model(sj_tracer *t, const sj_val *in, int n, void *u) {
    sj_val x = in[0], a = in[1], b = in[2];
    return sj_output(t, sj_mul(t, sj_gelu(t, sj_add(t, sj_mul(t, x, a), b)), sj_sigmoid(t, x)));
}

static sj_status w2_model(sj_tracer *t, const sj_val *in, int n, void *u) {
    sj_val h = sj_add(t, in[0], in[1]);
    sj_output(t, sj_gelu(t, sj_layer_norm(t, h, in[2], in[3], 1e-5)));
    return sj_output(t, h);
}

static sj_status w3_model(sj_tracer *t, const sj_val *in, int n, void *u) {
    return sj_output(t, sj_softmax(t, sj_add(t, sj_mul(t, in[0], sj_scalar(t, 0.125)), in[1]), -1));
}

static void emit(const char *w, int64_t S, double ms, double bytes) {
    printf("{\"workload\": \"%s\", \"mode\": \"eager\", \"backend\": \"cpu\", \"dtype\": \"float32\", \"S\": %lld, "
           "\"median_ms\": %.4f, \"GBps\": %.3f, \"of_ceiling\": %.3f}\n",
           w, (long long)S, ms, bytes / (ms * 1e-3) / 1e9, bytes / (ms * 1e-3) / 1e9 / ceiling_GBps);
    fflush(stdout);
}

static void bench_w1(sj_runtime *rt) {
    sj_fn *fn;
    if (sj_fn_create(rt, "w1", 3, w1_model, NULL, NULL, &fn)) exit(1);
    int64_t sizes[] = {1, 17, 128, 1000, 4096, 16384};
    int ns = quick ? 5 : 6;
    for (int i = 0; i < ns; i++) {
        int64_t S = sizes[i], Hd = 4096;
        float *x = rand_f32((size_t)(S * Hd), -2, 2), *a = rand_f32(Hd, -2, 2), *b = rand_f32(Hd, -2, 2);
        float *y = rand_f32((size_t)(S * Hd), -1, 1);
        sj_tensor in[3] = {sj_tensor_make(x, SJ_F32, 2, (int64_t[]){S, Hd}), sj_tensor_make(a, SJ_F32, 1, &Hd),
                           sj_tensor_make(b, SJ_F32, 1, &Hd)};
        sj_tensor out = sj_tensor_make(y, SJ_F32, 2, (int64_t[]){S, Hd});
        call_ctx c = {fn, in, &out, 3, 1};
        emit("w1", S, median_ms(&c), (2.0 * S * Hd + 2.0 * Hd) * 4);
        free(x), free(a), free(b), free(y);
    }
    sj_fn_destroy(fn);
}

static void bench_w2(sj_runtime *rt) {
    sj_fn *fn;
    if (sj_fn_create(rt, "w2", 4, w2_model, NULL, NULL, &fn)) exit(1);
    int64_t sizes[] = {1, 17, 128, 1000, 4096, 32768};
    int ns = quick ? 5 : 6;
    for (int i = 0; i < ns; i++) {
        int64_t S = sizes[i], Hd = 768;
        float *x = rand_f32((size_t)(S * Hd), -2, 2), *r = rand_f32((size_t)(S * Hd), -2, 2);
        float *g = rand_f32(Hd, 0.5f, 1.5f), *b = rand_f32(Hd, -0.5f, 0.5f);
        float *y = rand_f32((size_t)(S * Hd), -1, 1), *h = rand_f32((size_t)(S * Hd), -1, 1);
        sj_tensor in[4] = {sj_tensor_make(x, SJ_F32, 2, (int64_t[]){S, Hd}),
                           sj_tensor_make(r, SJ_F32, 2, (int64_t[]){S, Hd}), sj_tensor_make(g, SJ_F32, 1, &Hd),
                           sj_tensor_make(b, SJ_F32, 1, &Hd)};
        sj_tensor out[2] = {sj_tensor_make(y, SJ_F32, 2, (int64_t[]){S, Hd}),
                            sj_tensor_make(h, SJ_F32, 2, (int64_t[]){S, Hd})};
        call_ctx c = {fn, in, out, 4, 2};
        emit("w2", S, median_ms(&c), (4.0 * S * Hd + 2.0 * Hd) * 4);
        free(x), free(r), free(g), free(b), free(y), free(h);
    }
    sj_fn_destroy(fn);
}

static void bench_w3(sj_runtime *rt) {
    sj_fn *fn;
    if (sj_fn_create(rt, "w3", 2, w3_model, NULL, NULL, &fn)) exit(1);
    int64_t sizes[] = {16, 100, 512, 1024, 2048};
    int ns = quick ? 4 : 5;
    for (int i = 0; i < ns; i++) {
        int64_t S = sizes[i], BH = 12;
        float *s = rand_f32((size_t)(BH * S * S), -3, 3), *m = rand_f32((size_t)(BH * S), 0, 0);
        for (int64_t k = 0; k < BH * S; k++) m[k] = (k % S) < (S * 3) / 4 ? 0.0f : -1e4f;
        float *y = rand_f32((size_t)(BH * S * S), -1, 1);
        sj_tensor in[2] = {sj_tensor_make(s, SJ_F32, 3, (int64_t[]){BH, S, S}),
                           sj_tensor_make(m, SJ_F32, 3, (int64_t[]){BH, 1, S})};
        sj_tensor out = sj_tensor_make(y, SJ_F32, 3, (int64_t[]){BH, S, S});
        call_ctx c = {fn, in, &out, 2, 1};
        emit("w3", S, median_ms(&c), (2.0 * BH * S * S + BH * S) * 4);
        free(s), free(m), free(y);
    }
    sj_fn_destroy(fn);
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
            double t0 = now_s();
            if (ks[k].kind == 0) sj_cpu_unary(ks[k].op, &tx, &ty);
            else sj_cpu_binary(ks[k].op, &tx, ks[k].kind == 1 ? &tz : &ta, &ty);
            t[r] = now_s() - t0;
        }
        qsort(t, 7, sizeof t[0], cmp_double);
        double gbs = ks[k].streams * (double)n * 4 / t[3] / 1e9;
        printf("{\"workload\": \"kernel\", \"mode\": \"eager\", \"backend\": \"cpu\", \"name\": \"%s\", \"S\": %lld, "
               "\"median_ms\": %.4f, \"GBps\": %.3f, \"of_ceiling\": %.3f}\n",
               ks[k].name, (long long)S, t[3] * 1e3, gbs, gbs / ceiling_GBps);
    }
    free(x), free(z), free(a), free(y);
}

int main(int argc, char **argv) {
    const char *wl = "ceiling,w0,w1,w2,w3,kernels";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) quick = 1;
        else if (!strcmp(argv[i], "--workloads") && i + 1 < argc) wl = argv[++i];
        else {
            fprintf(stderr, "usage: %s [--quick] [--workloads ceiling,w0,w1,w2,w3,kernels]\n", argv[0]);
            return 2;
        }
    }
    sj_runtime_config cfg;
    sj_runtime_config_init(&cfg);
    cfg.backend = SJ_BACKEND_CPU;
    sj_runtime *rt;
    if (sj_runtime_create(&cfg, &rt)) {
        fprintf(stderr, "%s\n", sj_last_error());
        return 1;
    }
    bench_ceiling(); /* always: every bandwidth figure is read against it */
    if (strstr(wl, "w0")) bench_w0(rt);
    if (strstr(wl, "w1")) bench_w1(rt);
    if (strstr(wl, "w2")) bench_w2(rt);
    if (strstr(wl, "w3")) bench_w3(rt);
    if (strstr(wl, "kernels")) bench_kernels();
    sj_runtime_destroy(rt);
    return 0;
}
