/* bench_bert: the BERT-family sentence encoder (samples/bert) on a stream of
 * real sentences, the peer of bench/ort_bert_peer.py (ONNX Runtime's CPU
 * provider on the same weights and the same batches).
 *
 *   bench_bert [--model DIR] [--sentences FILE] [--threads 1,2]
 *              [--batches 1,8,32] [--seconds 3] [--dtype f32|f16|bf16] [--packed]
 *
 * The sentences are tokenized once (WordPiece, outside the timed region, as
 * the peer does), cut into batches in stream order, each padded to its
 * longest sentence, or with --packed laid end to end with no padding
 * (bert_embed_packed: attention through sj_attention_varlen). Untimed passes trace and compile every shape the
 * batches make (SJ_COMPILE_SYNC), until a pass compiles nothing (hot exact
 * shapes get specialized kernels after 16 calls); then passes are timed for
 * at least --seconds: the steady state. Prints one
 * JSON line per (threads, batch): sentences/s, real tokens/s, the tokens
 * computed per pass (padding included), per-batch latency percentiles, and
 * the tier mix of the timed calls. Without the model's
 * files (make model) it prints a note and exits 0. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench_sentences.h"
#include "bench/bench_util.h"
#include "samples/bert/bert.h"
#include "samples/bert/wordpiece.h"

typedef bench_sentence sentence;

static sj_status embed(bert_model *m, int packed, const int32_t *ids, const int32_t *lens, int rows, int seq,
                       float *out) {
    return packed ? bert_embed_packed(m, ids, lens, rows, out) : bert_embed(m, ids, lens, rows, seq, out);
}

int main(int argc, char **argv) {
    const char *dir = "models/all-MiniLM-L6-v2", *sent_path = "samples/bert/sentences.txt";
    int threads[8] = {1, 2}, n_threads = 2, batches[8] = {1, 8, 32}, n_batches = 3;
    double seconds = 3.0;
    sj_dtype dtype = SJ_F32;
    int packed = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--packed")) packed = 1;
        else if (!strcmp(argv[i], "--model") && i + 1 < argc) dir = argv[++i];
        else if (!strcmp(argv[i], "--sentences") && i + 1 < argc) sent_path = argv[++i];
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) n_threads = bench_parse_ints(argv[++i], threads, 8);
        else if (!strcmp(argv[i], "--batches") && i + 1 < argc) n_batches = bench_parse_ints(argv[++i], batches, 8);
        else if (!strcmp(argv[i], "--seconds") && i + 1 < argc) seconds = atof(argv[++i]);
        else if (!strcmp(argv[i], "--dtype") && i + 1 < argc) {
            const char *d = argv[++i];
            dtype = !strcmp(d, "f16") ? SJ_F16 : !strcmp(d, "bf16") ? SJ_BF16 : SJ_F32;
        } else {
            fprintf(stderr, "usage: %s [--model DIR] [--sentences FILE] [--threads 1,2] [--batches 1,8,32] "
                            "[--seconds S] [--dtype f32|f16|bf16] [--packed]\n", argv[0]);
            return 2;
        }
    }
    char vocab[1024];
    snprintf(vocab, sizeof vocab, "%s/vocab.txt", dir);
    wp_tokenizer *tk = NULL;
    char err[256];
    if (wp_tokenizer_load(vocab, 512, &tk, err, sizeof err)) {
        fprintf(stderr, "bench_bert: skipped: no model (%s; make model)\n", err);
        return 0;
    }
    int n_sent = 0;
    sentence *sents = bench_load_sentences(sent_path, tk, 1024, &n_sent);
    if (!sents || !n_sent) {
        fprintf(stderr, "bench_bert: no sentences in %s\n", sent_path);
        return 1;
    }
    long tokens = 0;
    for (int i = 0; i < n_sent; i++) tokens += sents[i].n;

    for (int ti = 0; ti < n_threads; ti++) {
        sj_runtime_config cfg;
        sj_runtime_config_init(&cfg);
        cfg.exec_threads = threads[ti];
        cfg.compile_mode = SJ_COMPILE_SYNC;
        sj_runtime *rt = NULL;
        bert_model *m = NULL;
        if (sj_runtime_create(&cfg, &rt) || bert_load(rt, dir, dtype, &m)) {
            fprintf(stderr, "bench_bert: %s\n", sj_last_error());
            return 1;
        }
        int hidden = bert_config_of(m)->hidden;
        for (int bi = 0; bi < n_batches; bi++) {
            int b = batches[bi];
            int n_b = (n_sent + b - 1) / b;
            int32_t **ids = calloc((size_t)n_b, sizeof *ids), **lens = calloc((size_t)n_b, sizeof *lens);
            int *rows = calloc((size_t)n_b, sizeof *rows), *seqs = calloc((size_t)n_b, sizeof *seqs);
            float *out = malloc((size_t)b * hidden * sizeof(float));
            long computed = 0; /* tokens per pass, padding included */
            sj_fn *fn = packed ? bert_fn_packed(m) : bert_fn(m);
            for (int k = 0; k < n_b; k++) {
                int r = n_sent - k * b < b ? n_sent - k * b : b, S = 0;
                for (int j = 0; j < r; j++) S = sents[k * b + j].n > S ? sents[k * b + j].n : S;
                ids[k] = calloc((size_t)r * S, sizeof(int32_t));
                lens[k] = calloc((size_t)r, sizeof(int32_t));
                size_t at = 0;
                for (int j = 0; j < r; j++) {
                    memcpy(ids[k] + (packed ? at : (size_t)j * S), sents[k * b + j].ids,
                           (size_t)sents[k * b + j].n * sizeof(int32_t));
                    at += (size_t)sents[k * b + j].n;
                    lens[k][j] = sents[k * b + j].n;
                }
                rows[k] = r, seqs[k] = S;
                computed += packed ? (long)at : (long)r * S;
            }
            /* untimed passes until one compiles nothing: the first traces
             * every shape of the stream, the second (each entry's second
             * call: hot) compiles, later ones specialize hot exact shapes */
            for (int pass = 0, before = -1; pass < 64; pass++) {
                sj_stats sw;
                sj_fn_stats(fn, &sw);
                if (pass >= 2 && (int)sw.compiles == before) break;
                before = (int)sw.compiles;
                for (int k = 0; k < n_b; k++)
                    if (embed(m, packed, ids[k], lens[k], rows[k], seqs[k], out)) {
                        fprintf(stderr, "bench_bert: %s\n", bert_error());
                        return 1;
                    }
            }
            sj_stats s0;
            sj_fn_stats(fn, &s0);
            size_t cap = 1 << 16, n_lat = 0;
            double *lat = malloc(cap * sizeof(double));
            long done = 0;
            double t0 = bench_now_s();
            while (bench_now_s() - t0 < seconds) {
                for (int k = 0; k < n_b; k++) {
                    double s = bench_now_s();
                    embed(m, packed, ids[k], lens[k], rows[k], seqs[k], out);
                    if (n_lat < cap) lat[n_lat++] = (bench_now_s() - s) * 1e3;
                    done += rows[k];
                }
            }
            double el = bench_now_s() - t0;
            sj_stats s1;
            sj_fn_stats(fn, &s1);
            qsort(lat, n_lat, sizeof *lat, bench_cmp_double);
            printf("{\"bench\": \"bert_cpu\", \"impl\": \"shapejit\", \"batches\": \"%s\", \"dtype\": \"%s\", "
                   "\"threads\": %d, \"batch\": %d, \"sentences\": %d, \"tokens_per_pass\": %ld, "
                   "\"computed_tokens_per_pass\": %ld, \"tokens_per_s\": %.0f, \"sentences_per_s\": %.1f, "
                   "\"p50_ms\": %.3f, \"p99_ms\": %.3f, \"eager_calls\": %llu, \"fused_calls\": %llu, "
                   "\"compiles\": %llu}\n",
                   packed ? "packed" : "padded", sj_dtype_name(dtype), threads[ti], b, n_sent, tokens, computed,
                   (double)tokens * done / n_sent / el, done / el, lat[n_lat / 2],
                   lat[(size_t)(n_lat * 0.99)], (unsigned long long)(s1.eager_calls - s0.eager_calls),
                   (unsigned long long)(s1.fused_symbolic_calls + s1.fused_specialized_calls -
                                        s0.fused_symbolic_calls - s0.fused_specialized_calls),
                   (unsigned long long)s1.compiles);
            fflush(stdout);
            for (int k = 0; k < n_b; k++) free(ids[k]), free(lens[k]);
            free(ids), free(lens), free(rows), free(seqs), free(out), free(lat);
        }
        bert_free(m);
        sj_runtime_destroy(rt);
    }
    bench_sentences_free(sents, n_sent);
    wp_tokenizer_free(tk);
    return 0;
}
