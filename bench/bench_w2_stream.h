/* The w2 stream of bench_sched and bench_budget: request lengths from the
 * w5 lengths file, and random rows of COLS floats for w2's inputs (x, r:
 * MAXL x COLS; g, b: COLS) and its outputs (y, h); the runtime and the
 * function both benches serve it with, and the driver that paces the
 * requests. Header-only, as bench_w5cold.h. */
#ifndef BENCH_W2_STREAM_H
#define BENCH_W2_STREAM_H

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "bench/bench_util.h"

#define COLS 256
#define MAXL 1024

typedef struct w2_stream {
    int *lens; /* the lengths in [min_len, MAXL], in file order */
    int n_lens;
    float *x, *r, *y, *h, *g, *b;
} w2_stream;

/* Lengths from path (or ../shared/workloads/w5_lengths.txt when path
 * cannot be opened) and the inputs, filled. 0 when there is no lengths
 * file (prints `who: skipped` on stderr), 1 when loaded, -1 when the file
 * has no length in range or memory runs out. */
static inline int w2_stream_load(w2_stream *s, const char *who, const char *path, int min_len) {
    FILE *f = fopen(path, "r");
    if (!f && (f = fopen("../shared/workloads/w5_lengths.txt", "r")) == NULL) {
        fprintf(stderr, "%s: skipped: no lengths file (%s)\n", who, path);
        return 0;
    }
    s->lens = malloc(sizeof(int) * 4096);
    s->n_lens = 0;
    int v;
    while (s->lens && s->n_lens < 4096 && fscanf(f, "%d", &v) == 1)
        if (v >= min_len && v <= MAXL) s->lens[s->n_lens++] = v;
    fclose(f);
    s->x = malloc(sizeof(float) * MAXL * COLS), s->r = malloc(sizeof(float) * MAXL * COLS);
    s->y = malloc(sizeof(float) * MAXL * COLS), s->h = malloc(sizeof(float) * MAXL * COLS);
    s->g = malloc(sizeof(float) * COLS), s->b = malloc(sizeof(float) * COLS);
    if (!s->n_lens || !s->x || !s->r || !s->y || !s->h || !s->g || !s->b) return -1;
    uint64_t rng = 3;
    bench_fill_rand(s->x, (size_t)MAXL * COLS, -2, 2, &rng);
    bench_fill_rand(s->r, (size_t)MAXL * COLS, -2, 2, &rng);
    bench_fill_rand(s->g, COLS, 0.5f, 1.5f, &rng);
    bench_fill_rand(s->b, COLS, -0.5f, 0.5f, &rng);
    return 1;
}

static inline void w2_stream_free(w2_stream *s) {
    free(s->lens), free(s->x), free(s->r), free(s->y), free(s->h), free(s->g), free(s->b);
}

/* -- Serving the stream ----------------------------------------------------- */

/* The runtime of the stream benches: CPU, one background compile worker,
 * no kernel cache, warnings logged; a bench sets what it measures on top. */
static inline sj_runtime_config w2_stream_config(void) {
    sj_runtime_config cfg;
    sj_runtime_config_init(&cfg);
    cfg.backend = SJ_BACKEND_CPU;
    cfg.cache_dir = NULL;
    cfg.compile_threads = 1;
    cfg.log_mask = SJ_LOG_WARN;
    return cfg;
}

/* w2 as a function "w2" of rt (4 inputs), dynamic as given; recompile_limit
 * 0: the runtime's. */
static inline sj_fn *w2_stream_fn(sj_runtime *rt, sj_dynamic dynamic, int recompile_limit) {
    sj_fn_options o;
    sj_fn_options_init(&o);
    o.dynamic = dynamic;
    o.recompile_limit = recompile_limit;
    sj_fn *fn;
    if (sj_fn_create(rt, "w2", 4, bench_w2_model, NULL, &o, &fn)) bench_die("sj_fn_create");
    return fn;
}

/* One request: the bench calls fn on in (4) and out (2), the q-th request,
 * of length L, and measures around the call what it reports. */
typedef void (*w2_stream_call_fn)(void *user, sj_fn *fn, int q, int L, const sj_tensor *in, sj_tensor *out);

/* Serves `requests` requests to fn, the q-th of length lens[q % n_lens]
 * over s's buffers, due one every interval_us from the start, as at a
 * server: the stream lasts requests * interval whatever a call costs (a
 * late request is made at once). Each request is call(user, ...). Returns
 * the seconds the stream took. */
static inline double w2_stream_run(const w2_stream *s, sj_fn *fn, const int *lens, int n_lens, int requests,
                                   int interval_us, w2_stream_call_fn call, void *user) {
    double t0 = bench_now_s();
    for (int q = 0; q < requests; q++) {
        double due = t0 + q * interval_us * 1e-6, now = bench_now_s();
        if (due > now) {
            double w = due - now;
            nanosleep(&(struct timespec){(time_t)w, (long)((w - (double)(time_t)w) * 1e9)}, NULL);
        }
        int L = lens[q % n_lens];
        sj_tensor in[4] = {sj_tensor_make(s->x, SJ_F32, 2, (int64_t[]){L, COLS}),
                           sj_tensor_make(s->r, SJ_F32, 2, (int64_t[]){L, COLS}),
                           sj_tensor_make(s->g, SJ_F32, 1, (int64_t[]){COLS}),
                           sj_tensor_make(s->b, SJ_F32, 1, (int64_t[]){COLS})};
        sj_tensor out[2] = {sj_tensor_make(s->y, SJ_F32, 2, (int64_t[]){L, COLS}),
                            sj_tensor_make(s->h, SJ_F32, 2, (int64_t[]){L, COLS})};
        call(user, fn, q, L, in, out);
    }
    return bench_now_s() - t0;
}

#endif
