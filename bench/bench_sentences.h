/* The sentence stream of the BERT benchmarks (bench_bert, bench_gpus):
 * one sentence per line, tokenized once with the model's WordPiece
 * tokenizer outside any timed region; lines that give fewer than 2 tokens
 * (empty) are skipped, longer ones are cut at max_tokens. Header-only, as
 * bench_w5cold.h. */
#ifndef BENCH_SENTENCES_H
#define BENCH_SENTENCES_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "samples/bert/wordpiece.h"

typedef struct bench_sentence {
    int32_t *ids;
    int n;
} bench_sentence;

/* The sentences of path (malloc'd, *count of them; NULL if the file cannot
 * be read or memory runs out). Free with bench_sentences_free. */
static inline bench_sentence *bench_load_sentences(const char *path, const wp_tokenizer *tk, int max_tokens,
                                                   int *count) {
    FILE *f = fopen(path, "r");
    if (!f) return NULL;
    bench_sentence *v = NULL;
    int n = 0, cap = 0;
    static char line[1 << 16];
    int32_t *buf = malloc((size_t)max_tokens * sizeof *buf);
    while (buf && fgets(line, sizeof line, f)) {
        size_t len = strcspn(line, "\n");
        if (!len) continue;
        int k = wp_encode(tk, line, len, buf, max_tokens);
        if (k < 2) continue;
        if (k > max_tokens) k = max_tokens;
        if (n == cap) {
            bench_sentence *nv = realloc(v, (size_t)(cap = cap ? 2 * cap : 64) * sizeof *v);
            if (!nv) break;
            v = nv;
        }
        if (!(v[n].ids = malloc((size_t)k * sizeof(int32_t)))) break;
        memcpy(v[n].ids, buf, (size_t)k * sizeof(int32_t));
        v[n++].n = k;
    }
    free(buf);
    fclose(f);
    *count = n;
    return v;
}

static inline void bench_sentences_free(bench_sentence *v, int n) {
    for (int i = 0; v && i < n; i++) free(v[i].ids);
    free(v);
}

#endif
