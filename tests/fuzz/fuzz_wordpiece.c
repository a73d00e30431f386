/* libFuzzer: samples/bert/wordpiece over any bytes.
 *
 * The input is the text. wp_encode must return -1 (invalid UTF-8) or a
 * count in [2, max_len] that starts with [CLS], ends with [SEP] and holds
 * only ids of the vocabulary; a smaller cap must give the same count and
 * the same first ids. The vocabulary is the model's vocab.txt
 * (SJ_MODEL_DIR, default models/all-MiniLM-L6-v2) or, without it, a small
 * one written to a temporary file. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "samples/bert/wordpiece.h"

#define MAX_LEN 64

static wp_tokenizer *tk;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    char path[4096], err[512];
    const char *dir = getenv("SJ_MODEL_DIR");
    snprintf(path, sizeof path, "%s/vocab.txt", dir && *dir ? dir : "models/all-MiniLM-L6-v2");
    int tmp = access(path, R_OK) != 0;
    if (tmp) {
        snprintf(path, sizeof path, "/tmp/sj-fuzz-vocab-%d.txt", (int)getpid());
        FILE *f = fopen(path, "w");
        if (!f) abort();
        fputs("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\na\nb\nc\n##a\n##b\n##c\nab\n##ab\ncafe\n.\n,\n!\n"
              "\xe4\xb8\xad\n\xc3\xa9\n##\xc3\xa9\n", f);
        fclose(f);
    }
    if (wp_tokenizer_load(path, MAX_LEN, &tk, err, sizeof err) != 0) {
        fprintf(stderr, "fuzz_wordpiece: %s\n", err);
        abort();
    }
    if (tmp) unlink(path); /* read whole at load */
    return 0;
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size) {
    int32_t ids[MAX_LEN], few[5];
    int n = wp_encode(tk, (const char *)data, size, ids, MAX_LEN);
    if (n == -1) {
        if (wp_encode(tk, (const char *)data, size, few, 5) != -1) abort();
        return 0;
    }
    if (n < 2 || n > MAX_LEN) abort();
    if (ids[0] != wp_token_id(tk, "[CLS]") || ids[n - 1] != wp_token_id(tk, "[SEP]")) abort();
    for (int i = 0; i < n; i++)
        if (!wp_token(tk, ids[i])) abort();
    if (wp_encode(tk, (const char *)data, size, few, 5) != n) abort();
    if (memcmp(few, ids, (size_t)(n < 5 ? n : 5) * sizeof *ids) != 0) abort();
    return 0;
}
