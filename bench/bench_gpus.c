/* bench_gpus: one runtime per GPU (issue 31). The BERT-family encoder
 * (samples/bert) on the sentence stream, batches of --batch sentences
 * padded to their longest, served by 1 GPU, then by every device listed
 * (one runtime, model and calling thread per device, each walking the
 * whole batch stream from its own offset); all runtimes share one kernel cache, so devices after the first
 * compile nothing. Prints one JSON line per device count: sentences/s,
 * per-batch p50/p99, and the compiles and cache hits of each runtime.
 *
 *   bench_gpus [--model DIR] [--sentences FILE] [--devices 0,1] [--batch 32]
 *              [--seconds 5] [--dtype f32|f16]
 *
 * Fewer devices than listed: prints `skipped` and exits 0. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench_sentences.h"
#include "bench/bench_util.h"
#include "samples/bert/bert.h"
#include "samples/bert/wordpiece.h"

#define MAX_DEV 8

typedef struct batch {
    int32_t *ids, *lens;
    int rows, seq;
} batch;

typedef struct worker {
    sj_runtime *rt;
    bert_model *m;
    const batch *b;
    int n_b, first, step;
    double seconds, t_end;
    long sentences;
    double *lat;
    size_t n_lat, cap;
    int failed;
} worker;

/* The stream's sentences (cut at 512 tokens) in batches of per, each
 * padded to its longest. */
static batch *load_batches(const char *path, const wp_tokenizer *tk, int per, int *n_out) {
    int n_sent = 0;
    bench_sentence *s = bench_load_sentences(path, tk, 512, &n_sent);
    if (!s) return NULL;
    int n = (n_sent + per - 1) / per;
    batch *v = calloc((size_t)(n ? n : 1), sizeof *v);
    for (int k = 0; v && k < n; k++) {
        int rows = n_sent - k * per < per ? n_sent - k * per : per, S = 0;
        for (int j = 0; j < rows; j++) S = s[k * per + j].n > S ? s[k * per + j].n : S;
        v[k].ids = calloc((size_t)rows * S, sizeof(int32_t));
        v[k].lens = malloc((size_t)rows * sizeof(int32_t));
        for (int j = 0; j < rows; j++) {
            memcpy(v[k].ids + (size_t)j * S, s[k * per + j].ids, (size_t)s[k * per + j].n * sizeof(int32_t));
            v[k].lens[j] = s[k * per + j].n;
        }
        v[k].rows = rows, v[k].seq = S;
    }
    bench_sentences_free(s, n_sent);
    *n_out = n;
    return v;
}

static void *work(void *p) {
    worker *w = p;
    float *out = malloc((size_t)64 * 1024 * sizeof(float));
    for (int k = w->first;; k = (k + w->step) % w->n_b) {
        double s = bench_now_s();
        if (s >= w->t_end) break;
        const batch *b = &w->b[k];
        if (bert_embed(w->m, b->ids, b->lens, b->rows, b->seq, out)) {
            w->failed = 1;
            break;
        }
        if (w->n_lat < w->cap) w->lat[w->n_lat++] = (bench_now_s() - s) * 1e3;
        w->sentences += b->rows;
    }
    free(out);
    return NULL;
}

int main(int argc, char **argv) {
    const char *dir = "models/all-MiniLM-L6-v2", *sent_path = "samples/bert/sentences.txt";
    int devs[MAX_DEV] = {0, 1}, n_dev = 2, per = 32;
    double seconds = 5;
    sj_dtype dtype = SJ_F32;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--model") && i + 1 < argc) dir = argv[++i];
        else if (!strcmp(argv[i], "--sentences") && i + 1 < argc) sent_path = argv[++i];
        else if (!strcmp(argv[i], "--devices") && i + 1 < argc) n_dev = bench_parse_ints(argv[++i], devs, MAX_DEV);
        else if (!strcmp(argv[i], "--batch") && i + 1 < argc) per = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--seconds") && i + 1 < argc) seconds = atof(argv[++i]);
        else if (!strcmp(argv[i], "--dtype") && i + 1 < argc) dtype = !strcmp(argv[++i], "f16") ? SJ_F16 : SJ_F32;
        else {
            fprintf(stderr, "usage: %s [--model DIR] [--sentences FILE] [--devices 0,1] [--batch N] [--seconds S] "
                            "[--dtype f32|f16]\n", argv[0]);
            return 2;
        }
    }
    if (per < 1 || per > 64 || n_dev < 1) {
        fprintf(stderr, "bench_gpus: --batch must be 1..64 and --devices non-empty\n");
        return 2;
    }
    char vocab[1024], err[256];
    snprintf(vocab, sizeof vocab, "%s/vocab.txt", dir);
    wp_tokenizer *tk = NULL;
    if (wp_tokenizer_load(vocab, 512, &tk, err, sizeof err)) {
        fprintf(stderr, "bench_gpus: skipped: no model (%s; make model)\n", err);
        return 0;
    }
    int n_b = 0;
    batch *b = load_batches(sent_path, tk, per, &n_b);
    if (!b || !n_b) {
        fprintf(stderr, "bench_gpus: no sentences in %s\n", sent_path);
        return 1;
    }
    char cache[] = "/tmp/sj-gpus-XXXXXX";
    if (!mkdtemp(cache)) return 1;
    worker w[MAX_DEV];
    memset(w, 0, sizeof w);
    for (int d = 0; d < n_dev; d++) {
        sj_runtime_config cfg;
        sj_runtime_config_init(&cfg);
        cfg.backend = SJ_BACKEND_CUDA;
        cfg.cuda_device = devs[d];
        cfg.compile_mode = SJ_COMPILE_SYNC;
        cfg.cache_dir = cache;
        if (sj_runtime_create(&cfg, &w[d].rt)) {
            printf("{\"bench\": \"bert_gpus\", \"skipped\": \"device %d: %s\"}\n", devs[d], sj_last_error());
            return 0;
        }
        if (bert_load(w[d].rt, dir, dtype, &w[d].m)) {
            fprintf(stderr, "bench_gpus: %s\n", bert_error());
            return 1;
        }
        /* untimed passes until one compiles nothing (device 0 compiles;
         * the others find every unit in the shared cache) */
        float *out = malloc((size_t)64 * 1024 * sizeof(float));
        /* at least 20 passes: every batch shape reaches the specialize
         * threshold (16 calls) and its specialized kernels are compiled
         * here, not in the timed run */
        for (int pass = 0, before = -1; pass < 64; pass++) {
            sj_stats s;
            sj_fn_stats(bert_fn(w[d].m), &s);
            if (pass >= 20 && (int)s.compiles == before) break;
            before = (int)s.compiles;
            for (int k = 0; k < n_b; k++)
                if (bert_embed(w[d].m, b[k].ids, b[k].lens, b[k].rows, b[k].seq, out)) {
                    fprintf(stderr, "bench_gpus: %s\n", bert_error());
                    return 1;
                }
        }
        free(out);
    }
    for (int used = 1; used <= n_dev; used = used == n_dev ? n_dev + 1 : (used * 2 > n_dev ? n_dev : used * 2)) {
        pthread_t th[MAX_DEV];
        double t0 = bench_now_s();
        for (int d = 0; d < used; d++) {
            /* every device walks every batch (from its own place in the
             * stream), so each sees the shape mix one device sees: dealt
             * round robin, 64 sentences in batches of 32 gave each of 2
             * devices one shape, against two alternating on 1 device */
            w[d].b = b, w[d].n_b = n_b, w[d].first = d * n_b / used, w[d].step = 1;
            w[d].t_end = t0 + seconds, w[d].sentences = 0, w[d].n_lat = 0;
            w[d].cap = 1 << 16;
            if (!w[d].lat) w[d].lat = malloc(w[d].cap * sizeof(double));
            pthread_create(&th[d], NULL, work, &w[d]);
        }
        long total = 0;
        double *all = malloc((size_t)used * (1 << 16) * sizeof(double));
        size_t n_all = 0;
        for (int d = 0; d < used; d++) {
            pthread_join(th[d], NULL);
            if (w[d].failed) {
                fprintf(stderr, "bench_gpus: device %d: %s\n", devs[d], bert_error());
                return 1;
            }
            total += w[d].sentences;
            memcpy(all + n_all, w[d].lat, w[d].n_lat * sizeof(double));
            n_all += w[d].n_lat;
        }
        double el = bench_now_s() - t0;
        qsort(all, n_all, sizeof *all, bench_cmp_double);
        printf("{\"bench\": \"bert_gpus\", \"dtype\": \"%s\", \"devices\": %d, \"batch\": %d, \"sentences_per_s\": %.1f, "
               "\"p50_ms\": %.3f, \"p99_ms\": %.3f, \"compiles_per_device\": [",
               sj_dtype_name(dtype), used, per, total / el, all[n_all / 2], all[(size_t)(n_all * 0.99)]);
        for (int d = 0; d < used; d++) {
            sj_stats s;
            sj_fn_stats(bert_fn(w[d].m), &s);
            printf("%s{\"device\": %d, \"compiles\": %llu, \"cache_hits\": %llu}", d ? ", " : "", devs[d],
                   (unsigned long long)s.compiles, (unsigned long long)s.compile_cache_hits);
        }
        printf("]}\n");
        fflush(stdout);
        free(all);
    }
    for (int d = 0; d < n_dev; d++) {
        free(w[d].lat);
        bert_free(w[d].m);
        sj_runtime_destroy(w[d].rt);
    }
    char cmd[64];
    snprintf(cmd, sizeof cmd, "rm -rf %s", cache);
    if (system(cmd)) {
    }
    for (int k = 0; k < n_b; k++) free(b[k].ids), free(b[k].lens);
    free(b);
    wp_tokenizer_free(tk);
    return 0;
}
