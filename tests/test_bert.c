/* The BERT-family encoder (samples/bert) on the real all-MiniLM-L6-v2
 * against a float64 reference (samples/bert/reference.py: numpy, the same
 * weights, tokens from the `tokenizers` package): one sentence at a time
 * and in padded batches of mixed lengths, and the same batches packed
 * (bert_embed_packed: against the reference and the padded result), eager
 * and fused, in f32 (cosine
 * >= 0.99999, max abs error <= 1e-4) and f16/bf16 (cosine >= 0.999);
 * a bad model directory or config gives a clear error.
 *
 * The model comes from `make model` (models/all-MiniLM-L6-v2, or
 * $SJ_MODEL_DIR) and the reference from `make test`'s reference target
 * (build/model/reference.jsonl, or $SJ_MODEL_REF); without them the test
 * prints "skipped: no model (make model)" and passes. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "samples/bert/bert.h"
#include "tests/util.h"

#define MAX_REF 128
#define HID 384

typedef struct ref {
    int n;
    int32_t *ids;
    double emb[HID];
} ref;

static ref refs[MAX_REF];
static int n_refs;
static const char *model_dir;

static int load_refs(void) {
    model_dir = getenv("SJ_MODEL_DIR") ? getenv("SJ_MODEL_DIR") : "models/all-MiniLM-L6-v2";
    const char *path = getenv("SJ_MODEL_REF") ? getenv("SJ_MODEL_REF") : "build/model/reference.jsonl";
    char probe[PATH_MAX];
    snprintf(probe, sizeof probe, "%s/model.safetensors", model_dir);
    FILE *f = fopen(path, "r");
    if (!f || access(probe, R_OK)) {
        if (f) fclose(f);
        return -1;
    }
    char line[1 << 16];
    while (n_refs < MAX_REF && fgets(line, sizeof line, f)) {
        json_t *o = json_loads(line, 0, NULL);
        json_t *ids = json_object_get(o, "ids"), *emb = json_object_get(o, "embedding");
        if (!json_is_array(ids) || json_array_size(emb) != HID) {
            json_decref(o);
            continue;
        }
        ref *r = &refs[n_refs++];
        r->n = (int)json_array_size(ids);
        r->ids = malloc((size_t)r->n * sizeof *r->ids);
        for (int i = 0; i < r->n; i++) r->ids[i] = (int32_t)json_integer_value(json_array_get(ids, i));
        for (int i = 0; i < HID; i++) r->emb[i] = json_real_value(json_array_get(emb, i));
        json_decref(o);
    }
    fclose(f);
    return n_refs ? 0 : -1;
}

static bool have_model;

static int group_setup(void **state) {
    (void)state;
    have_model = load_refs() == 0;
    return 0;
}

static int group_teardown(void **state) {
    (void)state;
    for (int i = 0; i < n_refs; i++) free(refs[i].ids);
    return 0;
}

#define NEED_MODEL() TU_NEED_MODEL(have_model)

static sj_runtime *runtime(sj_compile_mode mode) {
    sj_runtime_config cfg;
    sj_runtime_config_init(&cfg);
    /* the default backend: CUDA where a GPU is usable (the GPU session runs
     * this test there), else the CPU */
    cfg.compile_mode = mode;
    cfg.cache_dir = NULL;
    cfg.log_mask = SJ_LOG_WARN;
    sj_runtime *rt = NULL;
    assert_int_equal(sj_runtime_create(&cfg, &rt), SJ_OK);
    return rt;
}

/* Embeds refs[first .. first+count) as one padded batch and checks each. */
static void check_batch(bert_model *m, int first, int count, double min_cos, double max_abs, double *worst_cos,
                        double *worst_abs) {
    assert_true(count >= 1 && count <= MAX_REF);
    int S = 0;
    for (int i = 0; i < count; i++) S = refs[first + i].n > S ? refs[first + i].n : S;
    assert_true(S >= 1 && S <= 512);
    int32_t *ids = calloc((size_t)count * (size_t)S, sizeof *ids), *len = calloc((size_t)count, sizeof *len);
    float *out = malloc((size_t)count * HID * sizeof *out);
    assert_true(ids && len && out);
    for (int i = 0; i < count; i++) {
        memcpy(ids + (size_t)i * S, refs[first + i].ids, (size_t)refs[first + i].n * sizeof *ids);
        for (int k = refs[first + i].n; k < S; k++) ids[(size_t)i * S + k] = 100 + k; /* garbage past the length */
        len[i] = refs[first + i].n;
    }
    if (bert_embed(m, ids, len, count, S, out)) fail_msg("bert_embed: %s", bert_error());
    /* the same batch packed (no padding): against the reference, and
     * against the padded result (f32: cosine >= 1 - 1e-9) */
    int32_t *pids = malloc((size_t)count * (size_t)S * sizeof *pids);
    float *pout = malloc((size_t)count * HID * sizeof *pout);
    assert_true(pids && pout);
    int T = 0;
    for (int i = 0; i < count; i++) {
        memcpy(pids + T, refs[first + i].ids, (size_t)refs[first + i].n * sizeof *pids);
        T += refs[first + i].n;
    }
    if (bert_embed_packed(m, pids, len, count, pout)) fail_msg("bert_embed_packed: %s", bert_error());
    for (int i = 0; i < count; i++) {
        const float *a = out + (size_t)i * HID, *p = pout + (size_t)i * HID;
        double dot = 0, na = 0, np = 0;
        for (int k = 0; k < HID; k++) dot += (double)a[k] * p[k], na += (double)a[k] * a[k], np += (double)p[k] * p[k];
        double cos = dot / sqrt(na * np);
        if (cos < (max_abs < 1e-3 ? 1 - 1e-9 : min_cos))
            fail_msg("sentence %d (%d tokens, batch of %d): packed against padded cosine 1 - %.3g", first + i,
                     refs[first + i].n, count, 1 - cos);
    }
    for (int i = 0; i < 2 * count; i++) {
        const double *r = refs[first + i % count].emb;
        const float *e = (i < count ? out : pout) + (size_t)(i % count) * HID;
        double dot = 0, ne = 0, nr = 0, mx = 0;
        for (int k = 0; k < HID; k++) {
            dot += e[k] * r[k], ne += (double)e[k] * e[k], nr += r[k] * r[k];
            mx = fmax(mx, fabs(e[k] - r[k]));
        }
        double cos = dot / sqrt(ne * nr);
        *worst_cos = fmin(*worst_cos, cos);
        *worst_abs = fmax(*worst_abs, mx);
        /* packed f32: cosine >= 1 - 1e-9 against float64 */
        double want = i >= count && max_abs < 1e-3 ? 1 - 1e-9 : min_cos;
        if (cos < want || mx > max_abs)
            fail_msg("sentence %d (%d tokens, batch of %d %s %d): cosine %.9f, max abs error %.3g",
                     first + i % count, refs[first + i % count].n, count, i < count ? "padded to" : "packed, T =",
                     i < count ? S : T, cos, mx);
    }
    free(ids), free(len), free(out), free(pids), free(pout);
}

/* Under ThreadSanitizer (10-20x slower) a subset: every 8th sentence alone
 * and two padded batches, still eager and fused, still concurrent where
 * the runtime is. Under AddressSanitizer (3x slower: 314 s against 103 s
 * on 2 CPUs) the same subset plus the batch of 24: every code path (one
 * sentence, padded batches run twice so the second call runs the kernels
 * its first made hot, the packed form, every dtype) still runs, on 8
 * lengths and 3 padded shapes instead of every sentence; the plain build
 * checks every sentence, with the same tolerances everywhere. */
#if defined(__has_feature)
#if __has_feature(address_sanitizer) && !defined(__SANITIZE_ADDRESS__)
#define __SANITIZE_ADDRESS__ 1
#endif
#if __has_feature(thread_sanitizer) && !defined(__SANITIZE_THREAD__)
#define __SANITIZE_THREAD__ 1
#endif
#endif
#if defined(__SANITIZE_THREAD__)
enum { STRIDE = 8, MAX_BATCHES = 2, BIG_BATCH = 0 };
#elif defined(__SANITIZE_ADDRESS__)
enum { STRIDE = 8, MAX_BATCHES = 2, BIG_BATCH = 1 };
#else
enum { STRIDE = 1, MAX_BATCHES = 1000, BIG_BATCH = 1 };
#endif

static void run_all(sj_compile_mode mode, sj_dtype dt, double min_cos, double max_abs, const char *what) {
    sj_runtime *rt = runtime(mode);
    bert_model *m = NULL;
    if (bert_load(rt, model_dir, dt, &m)) fail_msg("bert_load: %s", bert_error());
    double wc = 1, wa = 0;
    for (int i = 0; i < n_refs; i += STRIDE) check_batch(m, i, 1, min_cos, max_abs, &wc, &wa);
    /* padded batches of mixed lengths: 8 and a ragged tail */
    /* each twice: the second call of a shape runs the kernels its first made hot */
    for (int rep = 0; rep < 2; rep++) {
        for (int i = 0, nb = 0; i < n_refs && nb < MAX_BATCHES; i += 8, nb++)
            check_batch(m, i, n_refs - i < 8 ? n_refs - i : 8, min_cos, max_abs, &wc, &wa);
        if (BIG_BATCH) check_batch(m, 40, 24, min_cos, max_abs, &wc, &wa);
    }
    sj_stats s;
    sj_fn_stats(bert_fn(m), &s);
    print_message("%s: %d sentences, worst cosine %.9f, worst max abs error %.3g; entries %llu, eager calls %llu, "
                  "fused calls %llu\n",
                  what, n_refs, wc, wa, (unsigned long long)s.entries, (unsigned long long)s.eager_calls,
                  (unsigned long long)(s.fused_symbolic_calls + s.fused_specialized_calls));
    if (mode == SJ_COMPILE_OFF) assert_int_equal(s.fused_symbolic_calls + s.fused_specialized_calls, 0);
    if (mode == SJ_COMPILE_SYNC) assert_true(s.fused_symbolic_calls + s.fused_specialized_calls > 0);
    sj_fn_stats(bert_fn_packed(m), &s);
    print_message("%s packed: entries %llu, eager calls %llu, fused calls %llu\n", what,
                  (unsigned long long)s.entries, (unsigned long long)s.eager_calls,
                  (unsigned long long)(s.fused_symbolic_calls + s.fused_specialized_calls));
    if (mode == SJ_COMPILE_OFF) assert_int_equal(s.fused_symbolic_calls + s.fused_specialized_calls, 0);
    if (mode == SJ_COMPILE_SYNC) assert_true(s.fused_symbolic_calls + s.fused_specialized_calls > 0);
    bert_free(m);
    sj_runtime_destroy(rt);
}

static void test_f32_eager(void **state) {
    (void)state;
    NEED_MODEL();
    run_all(SJ_COMPILE_OFF, SJ_F32, 0.99999, 1e-4, "f32 eager");
}

static void test_f32_fused(void **state) {
    (void)state;
    NEED_MODEL();
    run_all(SJ_COMPILE_SYNC, SJ_F32, 0.99999, 1e-4, "f32 fused");
}

static void test_half_eager(void **state) {
    (void)state;
    NEED_MODEL();
    run_all(SJ_COMPILE_OFF, SJ_BF16, 0.999, 1.0, "bf16 eager");
    run_all(SJ_COMPILE_OFF, SJ_F16, 0.999, 1.0, "f16 eager");
}

static void test_bad_model(void **state) {
    (void)state;
    NEED_MODEL();
    sj_runtime *rt = runtime(SJ_COMPILE_OFF);
    bert_model *m = (bert_model *)1;
    assert_int_equal(bert_load(rt, "/nonexistent/model", SJ_F32, &m), SJ_EINVAL);
    assert_null(m);
    assert_non_null(strstr(bert_error(), "/nonexistent/model/config.json"));
    /* a config without hidden_size, next to the real weights */
    char dir[PATH_MAX], path[PATH_MAX], target[PATH_MAX];
    assert_int_equal(tu_mkdtemp(dir, sizeof dir, "sj_test_bert"), 0);
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    fputs("{\"vocab_size\": 30522, \"num_attention_heads\": 12}", f);
    fclose(f);
    assert_int_equal(bert_load(rt, dir, SJ_F32, &m), SJ_EINVAL);
    assert_non_null(strstr(bert_error(), "key 'hidden_size' missing"));
    /* a config that does not match the weights: the tensor is named */
    f = fopen(path, "w");
    fputs("{\"vocab_size\": 30522, \"hidden_size\": 256, \"num_attention_heads\": 8, \"num_hidden_layers\": 6,"
          "\"intermediate_size\": 1536, \"max_position_embeddings\": 512, \"type_vocab_size\": 2,"
          "\"layer_norm_eps\": 1e-12, \"hidden_act\": \"gelu\"}",
          f);
    fclose(f);
    snprintf(target, sizeof target, "%s/model.safetensors", model_dir);
    char abs_target[PATH_MAX];
    assert_non_null(realpath(target, abs_target));
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    assert_int_equal(symlink(abs_target, path), 0);
    assert_int_equal(bert_load(rt, dir, SJ_F32, &m), SJ_ESHAPE);
    assert_non_null(strstr(bert_error(), "tensor 'embeddings.word_embeddings.weight': wrong shape"));
    tu_rmtree(dir);
    /* bad calls */
    assert_int_equal(bert_load(rt, model_dir, SJ_F32, &m), SJ_OK);
    int32_t ids[4] = {101, 7592, 102, 0}, len[1] = {5};
    float out[HID];
    assert_int_equal(bert_embed(m, ids, len, 1, 4, out), SJ_EINVAL);
    assert_non_null(strstr(bert_error(), "lengths[0] = 5 outside [1, 4]"));
    ids[1] = 999999;
    len[0] = 3;
    assert_int_equal(bert_embed(m, ids, len, 1, 4, out), SJ_EINDEX);
    bert_free(m);
    sj_runtime_destroy(rt);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_f32_eager),
        cmocka_unit_test(test_f32_fused),
        cmocka_unit_test(test_half_eager),
        cmocka_unit_test(test_bad_model),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
