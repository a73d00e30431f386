/* varlen_encoder: serve a stream of variable-length requests through one
 * BERT-style encoder layer (hidden 768, 12 heads of 64, FFN 3072, post-LN),
 * the way an inference server would.
 *
 *   varlen_encoder [lengths.txt] [--requests N] [--threads T] [--quiet]
 *
 * Each line of lengths.txt is one request's sequence length. Weights are
 * random from a fixed seed. For every request the program builds an input
 * x [1, S, 768], calls the jitted layer, and prints the request's latency;
 * a summary follows (total time, p50/p99/max latency, traces, entries).
 * With --threads T, T worker threads (default 1) take the requests in
 * order from a shared counter, each with its own buffers, and call the
 * one function at once, as a server's workers would. Which tier serves a
 * request depends on timing, so checksums of runs agree to float rounding.
 */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "shapejit.h"

enum { H = 768, NH = 12, HD = 64, FF = 3072 };

/* -- Weights ------------------------------------------------------------------ */

typedef struct weights {
    float *wqkv, *bqkv, *wo, *bo, *g1, *b1, *w1, *bf1, *w2, *bf2, *g2, *b2;
    sj_tensor t_wqkv, t_bqkv, t_wo, t_bo, t_g1, t_b1, t_w1, t_bf1, t_w2, t_bf2, t_g2, t_b2;
} weights;

static uint64_t rng = 0x5eed5eed12345678ull;
static float frand(void) { /* uniform in [-1, 1) */
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((rng >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

static float *filled(size_t n, float scale, float offset) {
    float *p = malloc(n * sizeof *p);
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    for (size_t i = 0; i < n; i++) p[i] = offset + scale * frand();
    return p;
}

static sj_tensor mat(float *p, int64_t r, int64_t c) { return sj_tensor_make(p, SJ_F32, 2, (int64_t[]){r, c}); }
static sj_tensor vec(float *p, int64_t n) { return sj_tensor_make(p, SJ_F32, 1, (int64_t[]){n}); }

static void weights_init(weights *w) {
    float s_in = 1.0f / sqrtf((float)H), s_ff = 1.0f / sqrtf((float)FF);
    w->wqkv = filled((size_t)H * 3 * H, s_in, 0), w->bqkv = filled(3 * H, 0.02f, 0);
    w->wo = filled((size_t)H * H, s_in, 0), w->bo = filled(H, 0.02f, 0);
    w->g1 = filled(H, 0.1f, 1), w->b1 = filled(H, 0.02f, 0);
    w->w1 = filled((size_t)H * FF, s_in, 0), w->bf1 = filled(FF, 0.02f, 0);
    w->w2 = filled((size_t)FF * H, s_ff, 0), w->bf2 = filled(H, 0.02f, 0);
    w->g2 = filled(H, 0.1f, 1), w->b2 = filled(H, 0.02f, 0);
    w->t_wqkv = mat(w->wqkv, H, 3 * H), w->t_bqkv = vec(w->bqkv, 3 * H);
    w->t_wo = mat(w->wo, H, H), w->t_bo = vec(w->bo, H);
    w->t_g1 = vec(w->g1, H), w->t_b1 = vec(w->b1, H);
    w->t_w1 = mat(w->w1, H, FF), w->t_bf1 = vec(w->bf1, FF);
    w->t_w2 = mat(w->w2, FF, H), w->t_bf2 = vec(w->bf2, H);
    w->t_g2 = vec(w->g2, H), w->t_b2 = vec(w->b2, H);
}

static void weights_free(weights *w) {
    float *all[] = {w->wqkv, w->bqkv, w->wo, w->bo, w->g1, w->b1, w->w1, w->bf1, w->w2, w->bf2, w->g2, w->b2};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]);
}

/* -- The model ------------------------------------------------------------------ */

/* x [B, S, H] -> heads [B, NH, S, HD], from columns [off, off + H) of qkv. */
static sj_val heads(sj_tracer *t, sj_val qkv, int64_t off) {
    sj_val part = sj_slice(t, qkv, 2, off, off + H, 1);
    sj_dim d[4] = {sj_dim_of(t, qkv, 0), sj_dim_of(t, qkv, 1), sj_dim_const(t, NH), sj_dim_const(t, HD)};
    return sj_permute(t, sj_reshape(t, part, 4, d), (int[]){0, 2, 1, 3});
}

static sj_val linear(sj_tracer *t, sj_val x, const sj_tensor *w, const sj_tensor *b) {
    return sj_add(t, sj_matmul(t, x, sj_param(t, w)), sj_param(t, b));
}

static sj_status encoder(sj_tracer *t, const sj_val *in, int n_in, void *user) {
    const weights *w = user;
    sj_val x = in[0]; /* [B, S, H] */
    sj_val qkv = linear(t, x, &w->t_wqkv, &w->t_bqkv);
    sj_val q = heads(t, qkv, 0), k = heads(t, qkv, H), v = heads(t, qkv, 2 * H);
    sj_val a = sj_attention(t, q, k, v, SJ_NONE, 1.0 / sqrt((double)HD), 0);
    sj_dim d[3] = {sj_dim_of(t, x, 0), sj_dim_of(t, x, 1), sj_dim_const(t, H)};
    a = sj_reshape(t, sj_permute(t, a, (int[]){0, 2, 1, 3}), 3, d);
    sj_val x1 = sj_layer_norm(t, sj_add(t, x, linear(t, a, &w->t_wo, &w->t_bo)), sj_param(t, &w->t_g1),
                              sj_param(t, &w->t_b1), 1e-5);
    sj_val f = linear(t, sj_gelu(t, linear(t, x1, &w->t_w1, &w->t_bf1)), &w->t_w2, &w->t_bf2);
    sj_val y = sj_layer_norm(t, sj_add(t, x1, f), sj_param(t, &w->t_g2), sj_param(t, &w->t_b2), 1e-5);
    return sj_output(t, y);
}

/* -- Serving ------------------------------------------------------------------------ */

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int read_lengths(const char *path, int **out) {
    FILE *f = fopen(path, "r");
    if (!f) {
        perror(path);
        return -1;
    }
    int n = 0, cap = 1024, v;
    int *lens = malloc((size_t)cap * sizeof *lens);
    while (lens && fscanf(f, "%d", &v) == 1) {
        if (v < 1 || v > 4096) {
            fprintf(stderr, "%s: length %d out of range [1, 4096]\n", path, v);
            free(lens);
            fclose(f);
            return -1;
        }
        if (n == cap) {
            int *nl = realloc(lens, (size_t)(cap *= 2) * sizeof *lens);
            if (!nl) break;
            lens = nl;
        }
        lens[n++] = v;
    }
    fclose(f);
    *out = lens;
    return lens ? n : -1;
}

/* The serving loop's shared state, and one worker's buffers. */
typedef struct server {
    sj_runtime *rt;
    sj_fn *fn;
    const int *lens;
    int n, quiet, threads;
    bool gpu;
    const float *x; /* host input, read by every request */
    sj_tensor dx;   /* its device copy (CUDA backend) */
    double *lat, *sums; /* per request: latency, its checksum terms */
    _Atomic int next;   /* the next request to serve */
    _Atomic int failed;
} server;

typedef struct worker {
    server *sv;
    int id;
    float *y;     /* host result */
    sj_tensor dy; /* device result (CUDA backend) */
} worker;

static void *serve(void *p) {
    worker *wk = p;
    server *sv = wk->sv;
    for (int i; !atomic_load(&sv->failed) && (i = atomic_fetch_add(&sv->next, 1)) < sv->n;) {
        int64_t shape[3] = {1, sv->lens[i], H};
        sj_tensor in = sj_tensor_make(sv->gpu ? sv->dx.data : (void *)sv->x, SJ_F32, 3, shape),
                  out = sj_tensor_make(sv->gpu ? wk->dy.data : wk->y, SJ_F32, 3, shape);
        in.device = out.device = sv->gpu ? SJ_CUDA : SJ_HOST;
        sj_stats before;
        sj_fn_stats(sv->fn, &before);
        double t0 = now_ms();
        sj_status st = sj_call(sv->fn, &in, 1, &out, 1);
        sv->lat[i] = now_ms() - t0;
        if (st) {
            fprintf(stderr, "request %d (S=%d) failed: %s: %s\n", i, sv->lens[i], sj_status_name(st),
                    sj_last_error());
            atomic_store(&sv->failed, 1);
            break;
        }
        sj_stats after;
        sj_fn_stats(sv->fn, &after);
        if (sv->gpu) { /* bring the result back (a server would hand the device buffer on) */
            sj_tensor hy = sj_tensor_make(wk->y, SJ_F32, 3, shape);
            if (sj_tensor_copy(sv->rt, &hy, &out)) {
                fprintf(stderr, "copy back: %s\n", sj_last_error());
                atomic_store(&sv->failed, 1);
                break;
            }
        }
        sv->sums[i] = wk->y[0] + wk->y[(size_t)sv->lens[i] * H - 1];
        if (sv->quiet) continue;
        if (sv->threads > 1) { /* the stats move with every thread's calls: no tier per request */
            printf("request %4d  S=%4d  %8.2f ms  thread %d\n", i, sv->lens[i], sv->lat[i], wk->id);
            continue;
        }
        const char *how = after.traces > before.traces                       ? "traced, eager"
                          : after.eager_calls > before.eager_calls           ? "eager"
                          : after.fused_specialized_calls > before.fused_specialized_calls ? "fused specialized"
                                                                               : "fused symbolic";
        printf("request %4d  S=%4d  %8.2f ms  %s\n", i, sv->lens[i], sv->lat[i], how);
    }
    return NULL;
}

int main(int argc, char **argv) {
    const char *path = "samples/varlen_encoder/lengths.txt";
    int limit = -1, quiet = 0, threads = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--requests") && i + 1 < argc) limit = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--quiet")) quiet = 1;
        else if (argv[i][0] == '-') {
            fprintf(stderr, "usage: %s [lengths.txt] [--requests N] [--threads T] [--quiet]\n", argv[0]);
            return 2;
        } else path = argv[i];
    }
    if (threads < 1 || threads > 256) {
        fprintf(stderr, "--threads %d: out of range [1, 256]\n", threads);
        return 2;
    }
    int *lens;
    int n = read_lengths(path, &lens);
    if (n <= 0) return 1;
    if (limit >= 0 && limit < n) n = limit;

    weights w;
    weights_init(&w);
    sj_runtime *rt;
    sj_fn *fn;
    if (sj_runtime_create(NULL, &rt) || sj_fn_create(rt, "encoder", 1, encoder, &w, NULL, &fn)) {
        fprintf(stderr, "setup failed: %s\n", sj_last_error());
        return 1;
    }
    printf("varlen_encoder: %d requests from %s, hidden %d, %d heads, ffn %d, backend %s, %d thread%s\n", n, path,
           H, NH, FF, sj_runtime_backend(rt) == SJ_BACKEND_CUDA ? "cuda" : "cpu", threads, threads == 1 ? "" : "s");

    int max_len = 0;
    for (int i = 0; i < n; i++) max_len = lens[i] > max_len ? lens[i] : max_len;
    float *x = filled((size_t)max_len * H, 1.0f, 0);
    /* On the CUDA backend requests live in device memory: one buffer each
     * for the longest request, viewed at each request's length. */
    server sv = {.rt = rt, .fn = fn, .lens = lens, .n = n, .quiet = quiet, .threads = threads,
                 .gpu = sj_runtime_backend(rt) == SJ_BACKEND_CUDA, .x = x,
                 .dx = {.dtype = SJ_F32, .rank = 3, .shape = {1, max_len, H}, .device = SJ_CUDA},
                 .lat = malloc((size_t)n * sizeof(double)), .sums = malloc((size_t)n * sizeof(double))};
    worker *wks = calloc((size_t)threads, sizeof *wks);
    pthread_t *th = calloc((size_t)threads, sizeof *th);
    if (!sv.lat || !sv.sums || !wks || !th) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    sj_tensor hx = sj_tensor_make(x, SJ_F32, 3, (int64_t[]){1, max_len, H});
    if (sv.gpu && (sj_tensor_alloc(rt, &sv.dx) || sj_tensor_copy(rt, &sv.dx, &hx))) {
        fprintf(stderr, "device buffers: %s\n", sj_last_error());
        return 1;
    }
    for (int t = 0; t < threads; t++) {
        wks[t] = (worker){.sv = &sv, .id = t, .y = malloc((size_t)max_len * H * sizeof(float)), .dy = sv.dx};
        wks[t].dy.data = NULL;
        if (!wks[t].y || (sv.gpu && sj_tensor_alloc(rt, &wks[t].dy))) {
            fprintf(stderr, "worker buffers: %s\n", wks[t].y ? sj_last_error() : "out of memory");
            return 1;
        }
    }
    double *lat = sv.lat, t_start = now_ms();
    if (threads == 1) serve(&wks[0]);
    else {
        for (int t = 0; t < threads; t++)
            if (pthread_create(&th[t], NULL, serve, &wks[t])) {
                fprintf(stderr, "cannot start worker thread %d\n", t);
                return 1;
            }
        for (int t = 0; t < threads; t++) pthread_join(th[t], NULL);
    }
    if (atomic_load(&sv.failed)) return 1;
    double checksum = 0;
    for (int i = 0; i < n; i++) checksum += sv.sums[i];
    double total = now_ms() - t_start;

    /* Latency against the steady state: a least-squares fit lat = a + b*S
     * over the second half of the stream (fused, warm), so that short and
     * long requests are each compared with what their length costs. */
    int half = n / 2;
    double sx = 0, sy = 0, sxx = 0, sxy = 0;
    for (int i = half; i < n; i++) {
        sx += lens[i], sy += lat[i], sxx += (double)lens[i] * lens[i], sxy += (double)lens[i] * lat[i];
    }
    double m = n - half, b = (m * sxy - sx * sy) / (m * sxx - sx * sx), a = (sy - b * sx) / m;
    int slow = 0, worst = 0;
    double worst_ratio = 0;
    for (int i = 0; i < n; i++) {
        double ratio = lat[i] / (a + b * lens[i]);
        if (ratio > 3) slow++;
        if (ratio > worst_ratio) worst_ratio = ratio, worst = i;
    }
    double worst_ms = lat[worst];
    int worst_len = lens[worst];

    qsort(lat, (size_t)n, sizeof *lat, cmp_double);
    sj_fn_wait_idle(fn, -1);
    sj_stats s;
    sj_fn_stats(fn, &s);
    printf("\nsummary: %d requests in %.2f s (%.0f a second, %d thread%s); latency p50 %.2f ms, p99 %.2f ms, "
           "max %.2f ms\n",
           n, total / 1e3, n / (total / 1e3), threads, threads == 1 ? "" : "s", lat[n / 2], lat[(int)(0.99 * (n - 1))],
           lat[n - 1]);
    printf("         steady state: %.3f ms + %.4f ms per token; slowest request %d (S=%d, %.2f ms) at %.2fx of "
           "that; %d requests over 3x\n",
           a, b, worst, worst_len, worst_ms, worst_ratio, slow);
    printf("         %llu traces, %llu entries; calls: %llu eager, %llu fused symbolic, %llu fused specialized; "
           "%llu compiles (%llu from the cache), %.0f ms compiling in the background\n",
           (unsigned long long)s.traces, (unsigned long long)s.entries, (unsigned long long)s.eager_calls,
           (unsigned long long)s.fused_symbolic_calls, (unsigned long long)s.fused_specialized_calls,
           (unsigned long long)s.compiles, (unsigned long long)s.compile_cache_hits, s.compile_ms);
    printf("         checksum %.6f\n", checksum);

    free(lat);
    free(sv.sums);
    if (sv.gpu) sj_tensor_free(rt, &sv.dx);
    for (int t = 0; t < threads; t++) {
        if (sv.gpu) sj_tensor_free(rt, &wks[t].dy);
        free(wks[t].y);
    }
    free(wks);
    free(th);
    free(x);
    free(lens);
    sj_fn_destroy(fn);
    sj_runtime_destroy(rt);
    weights_free(&w);
    return 0;
}
