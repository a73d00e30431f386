/* The WordPiece tokenizer (samples/bert/wordpiece.c) against Hugging Face
 * `tokenizers`: every line of tests/data/wordpiece_corpus.jsonl (347 texts:
 * real sentences, accents, punctuation, CJK, emoji, long words, control
 * characters, the empty string, texts truncated at 512 ids) must give the
 * ids of tests/data/wordpiece_expected.jsonl (samples/bert/
 * wordpiece_expected.py), token for token; errors, truncation, the cap,
 * and 4 threads at once. Needs the model's vocab.txt (make model); without
 * it, "skipped: no model (make model)". */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "samples/bert/wordpiece.h"
#include "tests/util.h"

#define MAX_LINES 1024

static char *texts[MAX_LINES];
static size_t text_len[MAX_LINES];
static int32_t *want[MAX_LINES];
static int want_n[MAX_LINES];
static int n_lines;
static wp_tokenizer *tk;
static char vocab[PATH_MAX];

static int group_setup(void **state) {
    (void)state;
    const char *dir = getenv("SJ_MODEL_DIR") ? getenv("SJ_MODEL_DIR") : "models/all-MiniLM-L6-v2";
    snprintf(vocab, sizeof vocab, "%s/vocab.txt", dir);
    FILE *c = fopen("tests/data/wordpiece_corpus.jsonl", "r"), *e = fopen("tests/data/wordpiece_expected.jsonl", "r");
    if (!c || !e) {
        if (c) fclose(c);
        if (e) fclose(e);
        return -1;
    }
    char line[1 << 16];
    while (n_lines < MAX_LINES && fgets(line, sizeof line, c)) {
        json_t *s = json_loads(line, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
        char eline[1 << 16];
        if (!json_is_string(s) || !fgets(eline, sizeof eline, e)) return -1;
        json_t *ids = json_loads(eline, 0, NULL);
        text_len[n_lines] = json_string_length(s);
        texts[n_lines] = malloc(text_len[n_lines] + 1);
        memcpy(texts[n_lines], json_string_value(s), text_len[n_lines] + 1);
        want_n[n_lines] = (int)json_array_size(ids);
        want[n_lines] = malloc(sizeof(int32_t) * (size_t)(want_n[n_lines] + 1));
        for (int i = 0; i < want_n[n_lines]; i++) want[n_lines][i] = (int32_t)json_integer_value(json_array_get(ids, i));
        n_lines++;
        json_decref(s);
        json_decref(ids);
    }
    fclose(c);
    fclose(e);
    char err[256];
    if (wp_tokenizer_load(vocab, 512, &tk, err, sizeof err)) tk = NULL;
    return 0;
}

static int group_teardown(void **state) {
    (void)state;
    for (int i = 0; i < n_lines; i++) free(texts[i]), free(want[i]);
    wp_tokenizer_free(tk);
    return 0;
}

#define NEED_MODEL()                                                        \
    do {                                                                    \
        if (!tk) {                                                          \
            print_message("skipped: no model (make model)\n");              \
            return;                                                         \
        }                                                                   \
    } while (0)

static void print_ids(const char *what, const int32_t *ids, int n) {
    char buf[4096];
    size_t o = 0;
    for (int i = 0; i < n && o < sizeof buf - 64; i++) {
        const char *t = wp_token(tk, ids[i]);
        o += (size_t)snprintf(buf + o, sizeof buf - o, "%s%s(%d)", i ? " " : "", t ? t : "?", ids[i]);
    }
    print_message("  %s: %s\n", what, buf);
}

static void test_corpus_matches_tokenizers(void **state) {
    (void)state;
    NEED_MODEL();
    assert_true(n_lines >= 300);
    int32_t got[1024];
    int matched = 0;
    long tokens = 0;
    for (int i = 0; i < n_lines; i++) {
        int n = wp_encode(tk, texts[i], text_len[i], got, 1024);
        bool same = n == want_n[i] && !memcmp(got, want[i], sizeof(int32_t) * (size_t)n);
        if (!same) {
            print_message("line %d: %.200s\n", i + 1, texts[i]);
            print_ids("tokenizers", want[i], want_n[i]);
            print_ids("ours      ", got, n < 0 ? 0 : n);
        }
        matched += same;
        tokens += n;
    }
    print_message("%d of %d lines match the tokenizers package token for token (%ld tokens)\n", matched, n_lines,
                  tokens);
    assert_int_equal(matched, n_lines);
}

static void test_errors_and_limits(void **state) {
    (void)state;
    NEED_MODEL();
    char err[256];
    wp_tokenizer *t = (wp_tokenizer *)1;
    assert_int_equal(wp_tokenizer_load("/nonexistent/vocab.txt", 512, &t, err, sizeof err), -1);
    assert_null(t);
    assert_non_null(strstr(err, "/nonexistent/vocab.txt"));
    /* a vocabulary without [UNK] */
    char dir[PATH_MAX], path[PATH_MAX];
    assert_int_equal(tu_mkdtemp(dir, sizeof dir, "sj_test_wordpiece"), 0);
    snprintf(path, sizeof path, "%s/vocab.txt", dir);
    FILE *f = fopen(path, "w");
    fputs("[PAD]\n[CLS]\n[SEP]\nhello\n##s\n", f);
    fclose(f);
    assert_int_equal(wp_tokenizer_load(path, 512, &t, err, sizeof err), -1);
    assert_non_null(strstr(err, "lacks [UNK]"));
    /* a small vocabulary: greedy longest match with ## continuations */
    f = fopen(path, "w");
    fputs("[PAD]\n[UNK]\n[CLS]\n[SEP]\nhello\nhell\n##o\n##s\n##os\nworld\n!\n", f);
    fclose(f);
    assert_int_equal(wp_tokenizer_load(path, 6, &t, err, sizeof err), 0);
    int32_t ids[16];
    assert_int_equal(wp_encode(t, "Hellos world!", 13, ids, 16), 6);
    int32_t exp[6] = {2, 4, 7, 9, 10, 3}; /* [CLS] hello ##s world ! [SEP] */
    assert_memory_equal(ids, exp, sizeof exp);
    /* truncation to max_len (6): 4 pieces kept of 5 */
    assert_int_equal(wp_encode(t, "hello hello hello hello hello", 29, ids, 16), 6);
    assert_int_equal(ids[5], 3);
    /* an unknown word is one [UNK] */
    assert_int_equal(wp_encode(t, "hellx", 5, ids, 16), 3);
    assert_int_equal(ids[1], 1);
    /* the cap: the full count comes back, only cap ids are written */
    int32_t small[3] = {-7, -7, -7};
    assert_int_equal(wp_encode(t, "hello world", 11, small, 2), 4);
    assert_int_equal(small[0], 2);
    assert_int_equal(small[1], 4);
    assert_int_equal(small[2], -7);
    /* invalid UTF-8 */
    assert_int_equal(wp_encode(t, "ab\xff", 3, ids, 16), -1);
    assert_int_equal(wp_encode(t, "\xc3", 1, ids, 16), -1);
    /* empty: [CLS] [SEP] */
    assert_int_equal(wp_encode(t, "", 0, ids, 16), 2);
    assert_int_equal(wp_token_id(t, "##os"), 8);
    assert_string_equal(wp_token(t, 8), "##os");
    assert_null(wp_token(t, 99));
    assert_int_equal(wp_token_id(t, "nope"), -1);
    assert_int_equal(wp_vocab_size(t), 11);
    wp_tokenizer_free(t);
    wp_tokenizer_free(NULL);
    tu_rmtree(dir);
}

static void *encode_all(void *arg) {
    int32_t *sums = arg;
    int32_t got[1024];
    for (int i = 0; i < n_lines; i++) {
        int n = wp_encode(tk, texts[i], text_len[i], got, 1024);
        uint32_t s = (uint32_t)n;
        for (int k = 0; k < n && k < 1024; k++) s = s * 31u + (uint32_t)got[k];
        sums[i] = (int32_t)s;
    }
    return NULL;
}

static void test_threads(void **state) {
    (void)state;
    NEED_MODEL();
    static int32_t sums[4][MAX_LINES];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) pthread_create(&th[i], NULL, encode_all, sums[i]);
    for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
    for (int i = 1; i < 4; i++) assert_memory_equal(sums[0], sums[i], sizeof(int32_t) * (size_t)n_lines);
    /* speed, for the record (not asserted) */
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    long tokens = 0;
    int32_t got[1024];
    for (int r = 0; r < 5; r++)
        for (int i = 0; i < n_lines; i++) tokens += wp_encode(tk, texts[i], text_len[i], got, 1024);
    clock_gettime(CLOCK_MONOTONIC, &b);
    double s = (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) * 1e-9;
    print_message("tokenized %ld tokens in %.3f s: %.2f M tokens/s on one thread\n", tokens, s, tokens / s * 1e-6);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_corpus_matches_tokenizers),
        cmocka_unit_test(test_errors_and_limits),
        cmocka_unit_test(test_threads),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
