/* Buckets learned from traffic (issue 30) against fixed power-of-two
 * buckets, on the CPU (f32), with the w4 encoder layer (public API only):
 *
 *   bench_learn [--requests N] [--rounds R] [--prefix P] [--lengths FILE]
 *               [--model DIR] [--sentences FILE] [--streams w5,sentences] [--every N]
 *
 * Streams: w5 (the first N lengths of ../shared/workloads/w5_lengths.txt,
 * the sample's copy by default) and sentences (samples/bert/sentences.txt
 * tokenized with the model's WordPiece tokenizer, [CLS] and [SEP] counted,
 * drawn in a seeded random order to N requests; skipped without the model's
 * vocab, make model). Each request is x [1, S, 768] through the layer, one
 * after another on the same buffers, compiles in the background (the
 * default policy), a fresh runtime per run with no kernel cache.
 *
 * Modes: pow2 (sj_set_buckets_pow2(fn, 0, 1, 16, 512) from the start, as
 * the embedding server and w5cold declare) and learned (no rule for the
 * first P% of the stream, the default policy: a static entry, then one
 * symbolic entry; then sj_fn_learn_buckets with apply, the compile time per
 * bucket from the pow2 run before it, the horizon the whole stream, no
 * padding; the rest of the stream under the learned edges) and auto
 * (learning while serving: pow2 from the start, and sj_fn_learn_auto
 * re-learning the edges on the background compile worker after every
 * --every new lengths, default 16, with the learned run's model options).
 * The runs are interleaved (pow2, learned, auto, pow2, ...) so that the
 * machine's load hits them alike; compare within a round.
 *
 * One JSON line per run: requests/s over the whole stream (the learning
 * prefix and sj_fn_learn_buckets's own time included), compiles,
 * compile_ms, entries (retired ones included), traces, the arena bytes the
 * entries planned at their first sizes (memory), the fused share; the
 * learned run adds its edges and the model's expected cost per call before
 * and after. The pow2 run adds what the model expects where calls are padded
 * to their bucket's edge (CUDA graphs replayed at the edge; not measured
 * here): the edges it would learn from the whole stream and the expected
 * cost per call under pow2 and under them. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench_sentences.h"
#include "bench/bench_w5cold.h"
#include "jit/shapejit.h"

enum { MODE_POW2, MODE_LEARNED, MODE_AUTO };
static const char *mode_names[] = {"pow2", "learned", "auto"};
static int learn_every = 16;

typedef struct result {
    double total_s, compile_ms;
    unsigned long long compiles, traces, entries, fused, calls, learned;
    long long arena;
} result;

static void collect(sj_fn *fn, double total_s, result *r) {
    sj_stats s;
    sj_fn_stats(fn, &s);
    r->total_s = total_s;
    r->compiles = s.compiles, r->traces = s.traces, r->entries = s.entries, r->compile_ms = s.compile_ms;
    r->fused = s.fused_symbolic_calls + s.fused_specialized_calls, r->calls = s.calls;
    r->learned = s.buckets_learned;
    sj_entry_info info[256];
    int n = sj_fn_entries(fn, info, 256);
    r->arena = 0;
    for (int i = 0; i < n && i < 256; i++) r->arena += info[i].planned_bytes;
}

/* One run of a stream; learned: learn and apply after `prefix` requests. */
static void run(const char *stream, const int64_t *lens, int n, int mode, int prefix, double compile_ms,
                int round, result *out) {
    bool learned = mode == MODE_LEARNED;
    uint64_t rng = 0x5DEECE66DULL;
    sj_runtime_config cfg;
    sj_runtime_config_init(&cfg);
    cfg.backend = SJ_BACKEND_CPU;
    cfg.cache_dir = NULL;
    sj_runtime *rt;
    if (sj_runtime_create(&cfg, &rt)) bench_die("bench_learn: sj_runtime_create");
    const int64_t H = BENCH_H;
    bench_encoder w;
    bench_encoder_rand(rt, SJ_F32, &w, &rng);
    sj_fn_options o;
    sj_fn_options_init(&o);
    o.recompile_limit = 64; /* the retired entries and the learned buckets */
    sj_fn *fn;
    if (sj_fn_create(rt, "enc", 1, bench_w4_model, &w, &o, &fn)) bench_die("bench_learn: sj_fn_create");
    if (!learned && sj_set_buckets_pow2(fn, 0, 1, 16, 512)) bench_die("bench_learn: buckets");
    if (mode == MODE_AUTO) {
        sj_learn_options lo;
        sj_learn_options_init(&lo);
        lo.compile_ms = compile_ms;
        lo.horizon_calls = n;
        if (sj_fn_learn_auto(fn, 0, 1, learn_every, &lo)) bench_die("bench_learn: sj_fn_learn_auto");
    }
    int64_t max_len = 1;
    for (int i = 0; i < n; i++) max_len = lens[i] > max_len ? lens[i] : max_len;
    sj_tensor dx = w5c_rand(rt, SJ_F32, 3, (int64_t[]){1, max_len, H}, -1, 1, &rng);
    sj_tensor dy = w5c_rand(rt, SJ_F32, 3, (int64_t[]){1, max_len, H}, -1, 1, &rng);
    sj_bucket_report rep;
    memset(&rep, 0, sizeof rep);
    double t0 = bench_now_s();
    for (int i = 0; i < n; i++) {
        if (learned && i == prefix) {
            sj_learn_options lo;
            sj_learn_options_init(&lo);
            lo.apply = 1;
            lo.compile_ms = compile_ms;
            lo.horizon_calls = n;
            if (sj_fn_learn_buckets(fn, 0, 1, &lo, &rep)) bench_die("bench_learn: sj_fn_learn_buckets");
        }
        sj_tensor x = dx, y = dy;
        x.shape[1] = y.shape[1] = lens[i];
        x.stride[1] = y.stride[1] = H;
        x.stride[0] = y.stride[0] = lens[i] * H;
        if (sj_call(fn, &x, 1, &y, 1)) bench_die("bench_learn: request");
    }
    result r;
    collect(fn, bench_now_s() - t0, &r);
    printf("{\"workload\": \"learn_%s\", \"mode\": \"%s\", \"round\": %d, \"requests\": %d, \"total_s\": %.3f, "
           "\"req_per_s\": %.2f, \"compiles\": %llu, \"compile_ms\": %.0f, \"entries\": %llu, \"traces\": %llu, "
           "\"arena_bytes\": %lld, \"fused_share\": %.3f",
           stream, mode_names[mode], round, n, r.total_s, n / r.total_s, r.compiles, r.compile_ms,
           r.entries, r.traces, r.arena, r.calls ? (double)r.fused / (double)r.calls : 0.0);
    if (mode == MODE_AUTO) {
        char *text = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&text, &len);
        sj_fn_explain(fn, f);
        fclose(f);
        char *last = text ? strstr(text, "last learned on ") : NULL, *end = last ? strchr(last, '\n') : NULL;
        if (end) *end = 0;
        printf(", \"every\": %d, \"learnings\": %llu, \"last\": \"%s\"", learn_every, r.learned,
               last ? last : "");
        free(text);
    } else if (!learned) { /* the model alone, for a runtime that pads to the edge (CUDA graphs): pow2 against learned */
        sj_learn_options lo;
        sj_learn_options_init(&lo);
        lo.pad = 1;
        lo.compile_ms = r.compiles ? r.compile_ms / (double)r.compiles : 50.0;
        lo.horizon_calls = n;
        if (sj_fn_learn_buckets(fn, 0, 1, &lo, &rep)) bench_die("bench_learn: sj_fn_learn_buckets");
        char text[1024];
        sj_bucket_report_str(&rep, text, sizeof text);
        printf(", \"padded_model\": \"%s\"", text);
    } else {
        char text[1024];
        sj_bucket_report_str(&rep, text, sizeof text);
        printf(", \"learned_after\": %d, \"retired\": %d, \"cost_before_us\": %.1f, \"cost_after_us\": %.1f, \"report\": \"%s\"",
               prefix, rep.entries_retired, rep.cost_before_us, rep.cost_after_us, text);
    }
    printf("}\n");
    fflush(stdout);
    *out = r;
    sj_tensor_free(rt, &dx);
    sj_tensor_free(rt, &dy);
    sj_fn_destroy(fn);
    bench_encoder_free(rt, &w);
    sj_runtime_destroy(rt);
}

int main(int argc, char **argv) {
    int n = 300, rounds = 2, prefix_pct = 20;
    const char *lengths = "samples/varlen_encoder/lengths.txt", *dir = "models/all-MiniLM-L6-v2",
               *sent_path = "samples/bert/sentences.txt", *streams = "w5,sentences";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--requests") && i + 1 < argc) n = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--rounds") && i + 1 < argc) rounds = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--prefix") && i + 1 < argc) prefix_pct = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--lengths") && i + 1 < argc) lengths = argv[++i];
        else if (!strcmp(argv[i], "--model") && i + 1 < argc) dir = argv[++i];
        else if (!strcmp(argv[i], "--sentences") && i + 1 < argc) sent_path = argv[++i];
        else if (!strcmp(argv[i], "--streams") && i + 1 < argc) streams = argv[++i];
        else if (!strcmp(argv[i], "--every") && i + 1 < argc) learn_every = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--requests N] [--rounds R] [--prefix PCT] [--lengths FILE] [--model DIR] "
                            "[--sentences FILE] [--streams w5,sentences] [--every N]\n", argv[0]);
            return 2;
        }
    }
    if (n < 10 || n > 4096 || rounds < 1 || prefix_pct < 1 || prefix_pct > 90 || learn_every < 1) {
        fprintf(stderr, "bench_learn: --requests 10..4096, --rounds >= 1, --prefix 1..90, --every >= 1\n");
        return 2;
    }
    int64_t *w5 = malloc(sizeof *w5 * (size_t)n), *sl = malloc(sizeof *sl * (size_t)n);
    if (!w5 || !sl) return 1;
    int n_w5 = strstr(streams, "w5") ? w5c_read_lengths(lengths, w5, n) : 0, n_sl = 0;
    if (strstr(streams, "sentences")) {
        char vocab[1024], err[256];
        snprintf(vocab, sizeof vocab, "%s/vocab.txt", dir);
        wp_tokenizer *tk = NULL;
        if (wp_tokenizer_load(vocab, 512, &tk, err, sizeof err)) {
            fprintf(stderr, "bench_learn: sentences skipped: no model (%s; make model)\n", err);
        } else {
            int ns = 0;
            bench_sentence *sv = bench_load_sentences(sent_path, tk, 512, &ns);
            uint64_t r = 12345;
            for (int i = 0; ns && i < n; i++) {
                r = r * 6364136223846793005ull + 1442695040888963407ull;
                sl[n_sl++] = sv[(r >> 33) % (uint64_t)ns].n;
            }
            bench_sentences_free(sv, ns);
            wp_tokenizer_free(tk);
        }
    }
    for (int round = 0; round < rounds; round++) {
        for (int s = 0; s < 2; s++) {
            const int64_t *lens = s ? sl : w5;
            int m = s ? n_sl : n_w5;
            if (!m) continue;
            result p, l, a;
            run(s ? "sentences" : "w5", lens, m, MODE_POW2, 0, 0, round, &p);
            double cms = p.compiles ? p.compile_ms / (double)p.compiles : 50.0;
            run(s ? "sentences" : "w5", lens, m, MODE_LEARNED, m * prefix_pct / 100, cms, round, &l);
            run(s ? "sentences" : "w5", lens, m, MODE_AUTO, 0, cms, round, &a);
            printf("{\"workload\": \"learn_%s\", \"mode\": \"ratio\", \"round\": %d, \"learned_over_pow2_req_per_s\": %.3f, "
                   "\"auto_over_pow2_req_per_s\": %.3f, "
                   "\"compiles\": \"%llu vs %llu vs %llu\", \"entries\": \"%llu vs %llu vs %llu\", "
                   "\"arena_bytes\": \"%lld vs %lld vs %lld\", \"order\": \"learned vs auto vs pow2\"}\n",
                   s ? "sentences" : "w5", round, p.total_s / l.total_s, p.total_s / a.total_s, l.compiles,
                   a.compiles, p.compiles, l.entries, a.entries, p.entries, l.arena, a.arena, p.arena);
            fflush(stdout);
        }
    }
    free(w5), free(sl);
    return 0;
}
