/* The w2 stream of bench_sched and bench_budget: request lengths from the
 * w5 lengths file, and random rows of COLS floats for w2's inputs (x, r:
 * MAXL x COLS; g, b: COLS) and its outputs (y, h). Header-only, as
 * bench_w5cold.h. */
#ifndef BENCH_W2_STREAM_H
#define BENCH_W2_STREAM_H

#include <stdio.h>
#include <stdlib.h>

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

#endif
