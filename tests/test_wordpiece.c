/* samples/bert/wordpiece: token for token against Hugging Face `tokenizers`
 * on a committed corpus (tests/data/wordpiece_corpus.jsonl, the ids in
 * wordpiece_expected.jsonl from samples/bert/wordpiece_expected.py), the
 * error paths, the cap and truncation contracts, the vocabulary look-ups,
 * and encoding from several threads at once.
 *
 * Needs the model's vocab.txt (make model; SJ_MODEL_DIR overrides the
 * folder); without it the tests that need it skip visibly. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "samples/bert/wordpiece.h"

#define MAX_LEN 512
#define MAX_IDS 600

/* -- Fixtures: the vocabulary and the corpus -------------------------------- */

typedef struct {
    char *text;
    size_t len;
    int32_t *ids; /* expected */
    int n;
} corpus_line;

static char vocab_path[4096];
static int have_model;
static corpus_line *corpus;
static int ncorpus;
static wp_tokenizer *tk; /* max_len 512 */

static char *read_all(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) buf[n] = '\0', *len = (size_t)n;
    return buf;
}

/* The next "\n"-terminated line of *p (JSON lines may hold U+2028 raw). */
static char *next_line(char **p, size_t *n) {
    if (!**p) return NULL;
    char *s = *p, *nl = strchr(s, '\n');
    *n = nl ? (size_t)(nl - s) : strlen(s);
    *p = nl ? nl + 1 : s + *n;
    return s;
}

static int load_corpus(void) {
    size_t clen, elen;
    char *c = read_all("tests/data/wordpiece_corpus.jsonl", &clen);
    char *e = read_all("tests/data/wordpiece_expected.jsonl", &elen);
    if (!c || !e) {
        fprintf(stderr, "test_wordpiece: tests/data/wordpiece_*.jsonl missing (run from the repository root)\n");
        return -1;
    }
    corpus = calloc(1024, sizeof *corpus);
    char *pc = c, *pe = e, *lc, *le;
    size_t nc, ne;
    while ((lc = next_line(&pc, &nc)) != NULL) {
        if (nc == 0) continue;
        le = next_line(&pe, &ne);
        json_error_t jerr;
        json_t *js = json_loadb(lc, nc, JSON_DECODE_ANY | JSON_ALLOW_NUL, &jerr);
        json_t *ja = le ? json_loadb(le, ne, 0, &jerr) : NULL;
        if (!json_is_string(js) || !json_is_array(ja) || ncorpus >= 1024) {
            fprintf(stderr, "test_wordpiece: bad corpus line %d: %s\n", ncorpus + 1, jerr.text);
            return -1;
        }
        corpus_line *l = &corpus[ncorpus++];
        l->len = json_string_length(js);
        l->text = malloc(l->len + 1);
        memcpy(l->text, json_string_value(js), l->len + 1);
        l->n = (int)json_array_size(ja);
        l->ids = malloc(((size_t)l->n + 1) * sizeof *l->ids);
        for (int i = 0; i < l->n; i++) l->ids[i] = (int32_t)json_integer_value(json_array_get(ja, (size_t)i));
        json_decref(js);
        json_decref(ja);
    }
    free(c);
    free(e);
    return 0;
}

static int group_setup(void **state) {
    const char *dir = getenv("SJ_MODEL_DIR");
    snprintf(vocab_path, sizeof vocab_path, "%s/vocab.txt", dir && *dir ? dir : "models/all-MiniLM-L6-v2");
    have_model = access(vocab_path, R_OK) == 0;
    if (!have_model) {
        printf("test_wordpiece: skipped: no model (make model): %s not found\n", vocab_path);
        return 0;
    }
    char err[512];
    if (wp_tokenizer_load(vocab_path, MAX_LEN, &tk, err, sizeof err) != 0) {
        fprintf(stderr, "test_wordpiece: %s\n", err);
        return -1;
    }
    return load_corpus();
}

static int group_teardown(void **state) {
    for (int i = 0; i < ncorpus; i++) free(corpus[i].text), free(corpus[i].ids);
    free(corpus);
    wp_tokenizer_free(tk);
    return 0;
}

#define NEED_MODEL()                                                                              \
    do {                                                                                          \
        if (!have_model) skip();                                                                  \
    } while (0)

static void print_tokens(const char *label, const int32_t *ids, int n) {
    printf("    %s (%d):", label, n);
    for (int i = 0; i < n && i < MAX_IDS; i++) {
        const char *t = wp_token(tk, ids[i]);
        printf(" %s(%d)", t ? t : "?", ids[i]);
    }
    printf("\n");
}

/* -- The corpus, token for token ------------------------------------------- */

static void test_corpus(void **state) {
    NEED_MODEL();
    int32_t ids[MAX_IDS];
    int bad = 0;
    long total = 0;
    for (int i = 0; i < ncorpus; i++) {
        corpus_line *l = &corpus[i];
        int n = wp_encode(tk, l->text, l->len, ids, MAX_IDS);
        total += n;
        if (n == l->n && memcmp(ids, l->ids, (size_t)n * sizeof *ids) == 0) continue;
        bad++;
        printf("  mismatch on corpus line %d: \"%.*s\"\n", i + 1, (int)(l->len > 300 ? 300 : l->len), l->text);
        print_tokens("expected", l->ids, l->n);
        print_tokens("actual  ", ids, n);
    }
    printf("  %d of %d corpus lines match Hugging Face tokenizers exactly\n", ncorpus - bad, ncorpus);
    assert_int_equal(bad, 0);

    /* speed: the corpus, repeated */
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    long tokens = 0, bytes = 0;
    int reps = 0;
    do {
        for (int i = 0; i < ncorpus; i++) {
            tokens += wp_encode(tk, corpus[i].text, corpus[i].len, ids, MAX_IDS);
            bytes += (long)corpus[i].len;
        }
        reps++;
        clock_gettime(CLOCK_MONOTONIC, &t1);
    } while ((t1.tv_sec - t0.tv_sec) + 1e-9 * (t1.tv_nsec - t0.tv_nsec) < 0.5);
    double s = (t1.tv_sec - t0.tv_sec) + 1e-9 * (t1.tv_nsec - t0.tv_nsec);
    printf("  speed: %.2f M tokens/s, %.1f MB/s of text (%d passes over %ld tokens)\n", tokens / s / 1e6,
           bytes / s / 1e6, reps, total);
}

/* Truncation to a small max_len keeps the first max_len - 1 ids of the full
 * encoding and ends with [SEP], also inside a word's pieces. */
static void test_truncation(void **state) {
    NEED_MODEL();
    wp_tokenizer *t8;
    char err[256];
    assert_int_equal(wp_tokenizer_load(vocab_path, 8, &t8, err, sizeof err), 0);
    int32_t ids[MAX_IDS];
    int32_t sep = wp_token_id(tk, "[SEP]"), cls = wp_token_id(tk, "[CLS]");
    int checked = 0;
    for (int i = 0; i < ncorpus; i++) {
        corpus_line *l = &corpus[i];
        int n = wp_encode(t8, l->text, l->len, ids, MAX_IDS);
        int want = l->n < 8 ? l->n : 8;
        assert_int_equal(n, want);
        assert_memory_equal(ids, l->ids, (size_t)(want - 1) * sizeof *ids);
        assert_int_equal(ids[want - 1], sep);
        checked += l->n > 8;
    }
    assert_true(checked > 50);
    const char *w = "word word word word word word word word word word";
    assert_int_equal(wp_encode(t8, w, strlen(w), ids, MAX_IDS), 8);
    int32_t word = wp_token_id(tk, "word");
    for (int i = 1; i < 7; i++) assert_int_equal(ids[i], word);
    wp_tokenizer_free(t8);

    /* max_len 2: only [CLS] [SEP]; the corpus's long lines stop at 512 */
    wp_tokenizer *t2;
    assert_int_equal(wp_tokenizer_load(vocab_path, 2, &t2, err, sizeof err), 0);
    assert_int_equal(wp_encode(t2, w, strlen(w), ids, MAX_IDS), 2);
    assert_int_equal(ids[0], cls);
    assert_int_equal(ids[1], sep);
    wp_tokenizer_free(t2);
    int longs = 0;
    for (int i = 0; i < ncorpus; i++) {
        int n = wp_encode(tk, corpus[i].text, corpus[i].len, ids, MAX_IDS);
        assert_true(n <= MAX_LEN);
        longs += n == MAX_LEN;
    }
    assert_true(longs >= 5);
}

/* -- Contracts: cap, invalid UTF-8, empty text ------------------------------ */

static void test_cap(void **state) {
    NEED_MODEL();
    const char *s = "The quick brown fox, naïvely, jumps.";
    int32_t full[64], ids[64];
    int n = wp_encode(tk, s, strlen(s), full, 64);
    assert_true(n > 6);
    for (int cap = 0; cap < n; cap++) {
        for (int i = 0; i < 64; i++) ids[i] = -7;
        assert_int_equal(wp_encode(tk, s, strlen(s), ids, cap), n);
        assert_memory_equal(ids, full, (size_t)cap * sizeof *ids);
        for (int i = cap; i < 64; i++) assert_int_equal(ids[i], -7);
    }
    assert_int_equal(wp_encode(tk, s, strlen(s), NULL, 0), n);
    /* empty and whitespace-only texts: [CLS] [SEP] */
    assert_int_equal(wp_encode(tk, "", 0, ids, 64), 2);
    assert_int_equal(wp_encode(tk, NULL, 0, ids, 64), 2);
    assert_int_equal(wp_encode(tk, " \t\n", 3, ids, 64), 2);
    assert_int_equal(ids[0], wp_token_id(tk, "[CLS]"));
    assert_int_equal(ids[1], wp_token_id(tk, "[SEP]"));
    /* len, not NUL, ends the text */
    assert_int_equal(wp_encode(tk, "hello world", 5, ids, 64), 3);
    assert_int_equal(ids[1], wp_token_id(tk, "hello"));
}

static void test_invalid_utf8(void **state) {
    NEED_MODEL();
    static const char *bad[] = {
        "\xff",             "abc\xc3",           /* truncated sequence */
        "\xc0\xaf",         "\xe0\x80\xaf",      /* overlong */
        "\xed\xa0\x80",     "\xf4\x90\x80\x80",  /* surrogate, past U+10FFFF */
        "\x80 lone continuation", "caf\xc3\x28",
    };
    int32_t ids[16];
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        assert_int_equal(wp_encode(tk, bad[i], strlen(bad[i]), ids, 16), -1);
    /* invalid past the truncation point still fails */
    size_t n = 20000;
    char *s = malloc(n);
    for (size_t i = 0; i < n; i++) s[i] = (i % 5 == 4) ? ' ' : 'a';
    s[n - 1] = '\xfe';
    assert_int_equal(wp_encode(tk, s, n, ids, 16), -1);
    s[n - 1] = 'a';
    assert_int_equal(wp_encode(tk, s, n, ids, 16), MAX_LEN);
    free(s);
    assert_int_equal(wp_encode(NULL, "a", 1, ids, 16), -1);
    assert_int_equal(wp_encode(tk, "a", 1, NULL, 16), -1);
}

/* -- Loading and the vocabulary ---------------------------------------------- */

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void test_load_errors(void **state) {
    char err[512] = "";
    wp_tokenizer *t = (wp_tokenizer *)&err; /* must be reset to NULL */
    assert_int_equal(wp_tokenizer_load("/nonexistent/dir/vocab.txt", 512, &t, err, sizeof err), -1);
    assert_null(t);
    assert_non_null(strstr(err, "/nonexistent/dir/vocab.txt"));

    char dir[] = "/tmp/sj-wp-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[256];
    snprintf(path, sizeof path, "%s/vocab.txt", dir);
    write_file(path, "[PAD]\n[CLS]\n[SEP]\nhello\n");
    assert_int_equal(wp_tokenizer_load(path, 512, &t, err, sizeof err), -1);
    assert_null(t);
    assert_non_null(strstr(err, "[UNK]"));
    assert_non_null(strstr(err, path));
    write_file(path, "[UNK]\n[SEP]\nhello\n");
    assert_int_equal(wp_tokenizer_load(path, 512, &t, err, sizeof err), -1);
    assert_non_null(strstr(err, "[CLS]"));
    write_file(path, "");
    assert_int_equal(wp_tokenizer_load(path, 512, &t, err, sizeof err), -1);
    assert_null(t);

    /* a tiny vocabulary, CRLF lines, no final newline */
    write_file(path, "[UNK]\r\n[CLS]\r\n[SEP]\r\nhel\r\n##lo\r\nworld");
    assert_int_equal(wp_tokenizer_load(path, 1, &t, err, sizeof err), -1); /* max_len < 2 */
    assert_int_equal(wp_tokenizer_load(path, 16, &t, err, sizeof err), 0);
    assert_int_equal(wp_vocab_size(t), 6);
    int32_t ids[16];
    const char *s = "Hello WORLD hellx";
    assert_int_equal(wp_encode(t, s, strlen(s), ids, 16), 6);
    int32_t want[] = {1, 3, 4, 5, 0, 2};
    assert_memory_equal(ids, want, sizeof want);
    assert_string_equal(wp_token(t, 5), "world");
    wp_tokenizer_free(t);
    wp_tokenizer_free(NULL);
    unlink(path);
    rmdir(dir);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static void test_vocab_roundtrip(void **state) {
    NEED_MODEL();
    int n = wp_vocab_size(tk);
    assert_int_equal(n, 30522);
    const char **sorted = malloc((size_t)n * sizeof *sorted);
    for (int32_t id = 0; id < n; id++) {
        const char *t = wp_token(tk, id);
        assert_non_null(t);
        assert_int_equal(wp_token_id(tk, t), id);
        sorted[id] = t;
    }
    /* every proper prefix of every token: found only if it is a token
     * itself (a table that matched prefixes or ignored lengths fails) */
    qsort(sorted, (size_t)n, sizeof *sorted, cmp_str);
    char buf[256];
    long prefixes = 0;
    for (int i = 0; i < n; i++) {
        size_t len = strlen(sorted[i]);
        for (size_t k = 1; k < len && k < sizeof buf; k++) {
            memcpy(buf, sorted[i], k);
            buf[k] = '\0';
            const char *key = buf;
            int in_vocab = bsearch(&key, sorted, (size_t)n, sizeof *sorted, cmp_str) != NULL;
            int32_t id = wp_token_id(tk, buf);
            if (in_vocab) assert_string_equal(wp_token(tk, id), buf);
            else assert_int_equal(id, -1);
            prefixes++;
        }
    }
    assert_true(prefixes > 100000);
    free(sorted);
    assert_null(wp_token(tk, -1));
    assert_null(wp_token(tk, n));
    assert_int_equal(wp_token_id(tk, "[CLS]"), 101);
    assert_int_equal(wp_token_id(tk, "[SEP]"), 102);
    assert_int_equal(wp_token_id(tk, "[UNK]"), 100);
    assert_int_equal(wp_token_id(tk, "no-such-token-here"), -1);
    assert_int_equal(wp_token_id(tk, ""), -1);
    assert_int_equal(wp_token_id(NULL, "the"), -1);
    assert_int_equal(wp_vocab_size(NULL), 0);
}

/* -- Threads ------------------------------------------------------------------ */

static void *encode_corpus(void *arg) {
    int32_t ids[MAX_IDS];
    long bad = 0;
    for (int rep = 0; rep < 3; rep++)
        for (int i = 0; i < ncorpus; i++) {
            corpus_line *l = &corpus[i];
            int n = wp_encode(tk, l->text, l->len, ids, MAX_IDS);
            bad += n != l->n || memcmp(ids, l->ids, (size_t)l->n * sizeof *ids) != 0;
        }
    return (void *)bad;
}

static void test_threads(void **state) {
    NEED_MODEL();
    pthread_t th[4];
    for (int i = 0; i < 4; i++) assert_int_equal(pthread_create(&th[i], NULL, encode_corpus, NULL), 0);
    long bad = 0;
    for (int i = 0; i < 4; i++) {
        void *r;
        pthread_join(th[i], &r);
        bad += (long)r;
    }
    assert_int_equal(bad, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_corpus),       cmocka_unit_test(test_truncation),
        cmocka_unit_test(test_cap),          cmocka_unit_test(test_invalid_utf8),
        cmocka_unit_test(test_load_errors),  cmocka_unit_test(test_vocab_roundtrip),
        cmocka_unit_test(test_threads),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
