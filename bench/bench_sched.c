/* bench_sched: the compile queue's order (issue 30), value against
 * first-in-first-out, on a stream of shape churn. w2 (residual add,
 * layernorm, gelu) on [L, 256] f32, L from the w5 lengths (191 distinct,
 * skewed), one static entry per length (recompile limit 256), one
 * background compile worker, no kernel cache: calls run eagerly until their
 * length's kernels arrive, and the worker can compile only a few of the
 * lengths while the stream lasts. The order decides which.
 * Reports, per order: the share of calls served fused over the whole stream
 * and in its first quarter and half, the share of rows (work) served fused,
 * compiles finished during the stream,
 * compiles wasted (finished, yet no call of the stream used them) and
 * rarely used (their kernels served 1 to RARE_CALLS calls of the stream).
 *
 * Requests arrive one every --interval-us (default 2000), as at a server:
 * the stream lasts requests * interval, whatever a call costs.
 *
 * Streams (--streams): w5 (the lengths file in order) and sentences (the
 * embedding server's: samples/bert/sentences.txt tokenized with the
 * model's WordPiece tokenizer, [CLS] and [SEP] counted, drawn in a seeded
 * random order, as bench_learn does; skipped without the model's vocab,
 * make model). The orders alternate within a rep (value, fifo), so the
 * machine's load hits both alike.
 *
 *   bench_sched [--lengths FILE] [--requests N] [--reps R] [--interval-us U]
 *               [--streams w5,sentences] [--model DIR] [--sentences FILE]
 * Prints one JSON object per (stream, order, rep). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench/bench_sentences.h"
#include "bench/bench_util.h"
#include "bench/bench_w2_stream.h"
#include "jit/runtime.h"
#include "jit/compile.h"

/* A compile whose kernels served at most this many calls was rarely used. */
#define RARE_CALLS 5

/* What a stream's calls saw: whether each request was served fused, and
 * fused calls per length. */
typedef struct sched_seen {
    unsigned char *fused; /* [requests] */
    int first_fused[MAXL + 1];
} sched_seen;

/* A request of the stream: fused when the call ran nothing eagerly. */
static void sched_call(void *user, sj_fn *fn, int q, int L, const sj_tensor *in, sj_tensor *out) {
    sched_seen *seen = user;
    sj_stats a, c;
    sj_fn_stats(fn, &a);
    if (sj_call(fn, in, 4, out, 2)) bench_die("sj_call");
    sj_fn_stats(fn, &c);
    seen->fused[q] = c.eager_calls == a.eager_calls;
    if (seen->fused[q]) seen->first_fused[L]++;
}

int main(int argc, char **argv) {
    const char *path = ".peer/workloads/w5_lengths.txt";
    int requests = 3000, reps = 2, interval_us = 2000;
    const char *streams = "w5", *dir = "models/all-MiniLM-L6-v2", *sent_path = "samples/bert/sentences.txt";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--lengths") && i + 1 < argc) path = argv[++i];
        else if (!strcmp(argv[i], "--requests") && i + 1 < argc) requests = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--interval-us") && i + 1 < argc) interval_us = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--streams") && i + 1 < argc) streams = argv[++i];
        else if (!strcmp(argv[i], "--model") && i + 1 < argc) dir = argv[++i];
        else if (!strcmp(argv[i], "--sentences") && i + 1 < argc) sent_path = argv[++i];
        else {
            fprintf(stderr, "usage: %s [--lengths FILE] [--requests N] [--reps R] [--interval-us U] "
                            "[--streams w5,sentences] [--model DIR] [--sentences FILE]\n", argv[0]);
            return 2;
        }
    }
    w2_stream ws;
    int loaded = w2_stream_load(&ws, "bench_sched", path, 1);
    if (loaded <= 0) return loaded < 0;
    unsigned char *fused = malloc((size_t)requests);
    /* the sentence stream: requests lengths drawn from the tokenized sentences */
    int *sl = malloc(sizeof(int) * (size_t)requests), n_sl = 0;
    if (sl && strstr(streams, "sentences")) {
        char vocab[1024], err[256];
        snprintf(vocab, sizeof vocab, "%s/vocab.txt", dir);
        wp_tokenizer *tk = NULL;
        if (wp_tokenizer_load(vocab, 512, &tk, err, sizeof err)) {
            fprintf(stderr, "bench_sched: sentences skipped: no model (%s; make model)\n", err);
        } else {
            int ns = 0;
            bench_sentence *sv = bench_load_sentences(sent_path, tk, MAXL, &ns);
            uint64_t rs = 12345;
            for (int i = 0; ns && i < requests; i++) {
                rs = rs * 6364136223846793005ull + 1442695040888963407ull;
                sl[n_sl++] = sv[(rs >> 33) % (uint64_t)ns].n;
            }
            bench_sentences_free(sv, ns);
            wp_tokenizer_free(tk);
        }
    }
    for (int rep = 0; rep < reps; rep++)
        for (int run = 0; run < 4; run++) {
            int fifo = run & 1, sent = run >> 1;
            if (sent ? !n_sl : !strstr(streams, "w5")) continue;
            const int *lens = sent ? sl : ws.lens, n_lens = sent ? n_sl : ws.n_lens;
            sj_runtime_config cfg = w2_stream_config();
            sj_runtime *rt;
            if (sj_runtime_create(&cfg, &rt)) bench_die("sj_runtime_create");
            sj_compiler_set_fifo(rt->compiler, fifo);
            sj_fn *fn = w2_stream_fn(rt, SJ_DYNAMIC_STATIC, 256);
            sched_seen seen = {.fused = fused};
            double el = w2_stream_run(&ws, fn, lens, n_lens, requests, interval_us, sched_call, &seen);
            const int *first_fused = seen.first_fused;
            sj_stats s;
            sj_fn_stats(fn, &s);
            int used = 0;
            int rare = 0;
            for (int L = 1; L <= MAXL; L++) used += first_fused[L] > 0, rare += first_fused[L] > 0 && first_fused[L] <= RARE_CALLS;
            long n_q[3] = {requests / 4, requests / 2, requests}, f_q[3] = {0, 0, 0};
            double rows = 0, rows_fused = 0;
            for (int q = 0; q < requests; q++) {
                for (int k = 0; k < 3; k++) f_q[k] += q < n_q[k] && fused[q];
                rows += lens[q % n_lens];
                rows_fused += fused[q] ? lens[q % n_lens] : 0;
            }
            printf("{\"bench\": \"sched\", \"stream\": \"%s\", \"order\": \"%s\", \"rep\": %d, \"requests\": %d, \"seconds\": %.2f, "
                   "\"fused_share_first_quarter\": %.3f, \"fused_share_first_half\": %.3f, \"fused_share\": %.3f, "
                   "\"fused_row_share\": %.3f, "
                   "\"compiles\": %llu, \"compiles_wasted\": %llu, \"compiles_rarely_used\": %d, \"entries\": %llu}\n",
                   sent ? "sentences" : "w5", fifo ? "fifo" : "value", rep, requests, el, (double)f_q[0] / n_q[0], (double)f_q[1] / n_q[1],
                   (double)f_q[2] / n_q[2], rows_fused / rows, (unsigned long long)s.compiles,
                   (unsigned long long)(s.compiles > (uint64_t)used ? s.compiles - (uint64_t)used : 0), rare,
                   (unsigned long long)s.entries);
            fflush(stdout);
            sj_runtime_destroy(rt);
        }
    w2_stream_free(&ws), free(fused), free(sl);
    return 0;
}
