/* Tests for jit/weights.c (sj_weights_*): safetensors files written here
 * with random data; the stored view is the mapping; conversions between
 * f32, f16 and bf16 against an independent rounding; every malformed file
 * is refused with a message naming the file and the tensor; a file cut at
 * every length of its header is refused, never read past; a weight feeds
 * sj_param and the result matches a float64 reference. */
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

#include "tests/util.h"

static char dir[PATH_MAX];
static sj_runtime *rt;

static int setup(void **state) {
    (void)state;
    if (tu_mkdtemp(dir, sizeof dir, "sj_test_weights")) return -1;
    sj_runtime_config cfg;
    sj_runtime_config_init(&cfg);
    cfg.backend = SJ_BACKEND_CPU;
    cfg.compile_mode = SJ_COMPILE_OFF;
    cfg.cache_dir = NULL;
    cfg.log_mask = 0;
    return sj_runtime_create(&cfg, &rt) ? -1 : 0;
}

static int teardown(void **state) {
    (void)state;
    sj_runtime_destroy(rt);
    tu_rmtree(dir);
    return 0;
}

/* Writes header (JSON) and data as a safetensors file; returns its path. */
static const char *write_st(const char *name, const char *header, const void *data, size_t len) {
    static char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    uint64_t n = strlen(header);
    unsigned char lb[8];
    for (int i = 0; i < 8; i++) lb[i] = (unsigned char)(n >> (8 * i));
    assert_int_equal(fwrite(lb, 1, 8, f), 8);
    assert_int_equal(fwrite(header, 1, n, f), n);
    if (len) assert_int_equal(fwrite(data, 1, len, f), len);
    assert_int_equal(fclose(f), 0);
    return path;
}

/* Independent conversions: the tests' own f16 (tests/util_ref.c), and bf16 by rounding
 * the upper half of the bits to nearest even. */
static uint16_t ref_f16(float x) { return tu_f32_to_f16_ref(x); }

static uint16_t ref_bf16(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return (uint16_t)((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
}

static float from_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* A file of four tensors: a [3, 5] f32, a [7] f16, a [2, 2] bf16, a [4] i64. */
enum { NA = 15, NB = 7, NC = 4, ND = 4 };
static float A[NA];
static uint16_t B[NB], C[NC];
static int64_t D[ND];

static const char *good_file(void) {
    tu_seed(7);
    unsigned char data[NA * 4 + NB * 2 + NC * 2 + ND * 8 + 2];
    for (int i = 0; i < NA; i++) A[i] = (float)tu_uniform(-3, 3);
    for (int i = 0; i < NB; i++) B[i] = ref_f16((float)tu_uniform(-2, 2));
    for (int i = 0; i < NC; i++) C[i] = ref_bf16((float)tu_uniform(-2, 2));
    for (int i = 0; i < ND; i++) D[i] = tu_randint(-1000, 1000);
    size_t o = 0;
    memcpy(data + o, A, sizeof A), o += sizeof A;  /* 0..60 */
    memcpy(data + o, B, sizeof B), o += sizeof B;  /* 60..74 */
    memcpy(data + o, C, sizeof C), o += sizeof C;  /* 74..82 */
    memset(data + o, 0, 2), o += 2;                /* padding */
    memcpy(data + o, D, sizeof D), o += sizeof D;  /* 84..116 */
    const char *h = "{\"__metadata__\":{\"format\":\"pt\"},"
                    "\"a\":{\"dtype\":\"F32\",\"shape\":[3,5],\"data_offsets\":[0,60]},"
                    "\"b\":{\"dtype\":\"F16\",\"shape\":[7],\"data_offsets\":[60,74]},"
                    "\"c\":{\"dtype\":\"BF16\",\"shape\":[2,2],\"data_offsets\":[74,82]},"
                    "\"d\":{\"dtype\":\"I64\",\"shape\":[4],\"data_offsets\":[84,116]}}";
    /* pad the header so the data starts 8-aligned, as writers do */
    static char padded[1024];
    size_t n = strlen(h);
    snprintf(padded, sizeof padded, "%s%*s", h, (int)((8 - (n + 8) % 8) % 8), "");
    return write_st("good.safetensors", padded, data, o);
}

static void test_good_file(void **state) {
    (void)state;
    sj_weights *w;
    assert_int_equal(sj_weights_open(rt, good_file(), &w), SJ_OK);
    assert_int_equal(sj_weights_count(w), 4);
    assert_string_equal(sj_weights_name(w, 0), "a");
    assert_string_equal(sj_weights_name(w, 3), "d");
    assert_null(sj_weights_name(w, 4));
    sj_tensor t, t2;
    /* the stored view, zero-copy: the same pointer twice, the file's values */
    assert_int_equal(sj_weights_get(w, "a", SJ_F32, 2, (int64_t[]){3, 5}, &t), SJ_OK);
    assert_int_equal(sj_weights_get(w, "a", SJ_F32, 2, NULL, &t2), SJ_OK);
    assert_ptr_equal(t.data, t2.data);
    assert_int_equal(t.rank, 2);
    assert_int_equal(t.shape[1], 5);
    assert_int_equal(t.stride[0], 5);
    assert_memory_equal(t.data, A, sizeof A);
    sj_tensor info;
    assert_int_equal(sj_weights_info(w, "a", &info), SJ_OK);
    assert_ptr_equal(info.data, t.data);
    /* f32 -> f16 and bf16, rounded to nearest even; made once */
    assert_int_equal(sj_weights_get(w, "a", SJ_F16, 2, NULL, &t), SJ_OK);
    for (int i = 0; i < NA; i++) assert_int_equal(((uint16_t *)t.data)[i], ref_f16(A[i]));
    assert_int_equal(sj_weights_get(w, "a", SJ_F16, 2, NULL, &t2), SJ_OK);
    assert_ptr_equal(t.data, t2.data);
    assert_int_equal(sj_weights_get(w, "a", SJ_BF16, 2, NULL, &t), SJ_OK);
    for (int i = 0; i < NA; i++) assert_int_equal(((uint16_t *)t.data)[i], ref_bf16(A[i]));
    /* f16 and bf16 -> f32 exactly */
    assert_int_equal(sj_weights_get(w, "b", SJ_F32, 1, (int64_t[]){7}, &t), SJ_OK);
    for (int i = 0; i < NB; i++) assert_int_equal(ref_f16(((float *)t.data)[i]), B[i]);
    assert_int_equal(sj_weights_get(w, "c", SJ_F32, 2, (int64_t[]){2, 2}, &t), SJ_OK);
    for (int i = 0; i < NC; i++) assert_true(((float *)t.data)[i] == from_bf16(C[i]));
    /* bf16 -> f16 through f32 */
    assert_int_equal(sj_weights_get(w, "c", SJ_F16, 2, NULL, &t), SJ_OK);
    for (int i = 0; i < NC; i++) assert_int_equal(((uint16_t *)t.data)[i], ref_f16(from_bf16(C[i])));
    /* integers: as stored only */
    assert_int_equal(sj_weights_get(w, "d", SJ_I64, 1, NULL, &t), SJ_OK);
    assert_memory_equal(t.data, D, sizeof D);
    /* errors name the file and the tensor */
    assert_int_equal(sj_weights_get(w, "d", SJ_F32, 1, NULL, &t), SJ_EDTYPE);
    assert_non_null(strstr(sj_last_error(), "tensor 'd': wrong dtype: the file has I64, asked for f32"));
    assert_int_equal(sj_weights_get(w, "a", SJ_F32, 2, (int64_t[]){5, 3}, &t), SJ_ESHAPE);
    assert_non_null(strstr(sj_last_error(), "tensor 'a': wrong shape: expected [5, 3], the file has [3, 5]"));
    assert_int_equal(sj_weights_get(w, "a", SJ_F32, 1, (int64_t[]){15}, &t), SJ_ESHAPE);
    assert_int_equal(sj_weights_get(w, "zz", SJ_F32, 1, NULL, &t), SJ_EINVAL);
    assert_non_null(strstr(sj_last_error(), "good.safetensors: no tensor 'zz'"));
    assert_int_equal(sj_weights_get(NULL, "a", SJ_F32, 1, NULL, &t), SJ_EINVAL);
    sj_weights_close(w);
    sj_weights_close(NULL);
}

/* A weight captured with sj_param computes what float64 says. */
static float *param_data;
static sj_status m_linear(sj_tracer *t, const sj_val *in, int n, void *user) {
    (void)n;
    sj_tensor *w = user;
    return sj_output(t, sj_matmul(t, in[0], sj_param(t, w)));
}

static void test_weight_as_param(void **state) {
    (void)state;
    sj_weights *w;
    assert_int_equal(sj_weights_open(rt, good_file(), &w), SJ_OK);
    sj_tensor a;
    assert_int_equal(sj_weights_get(w, "a", SJ_F32, 2, (int64_t[]){3, 5}, &a), SJ_OK);
    param_data = a.data;
    sj_fn *fn;
    assert_int_equal(sj_fn_create(rt, "lin", 1, m_linear, &a, NULL, &fn), SJ_OK);
    float x[2 * 3];
    for (int i = 0; i < 6; i++) x[i] = (float)tu_uniform(-1, 1);
    sj_tensor in = sj_tensor_make(x, SJ_F32, 2, (int64_t[]){2, 3}), out = {0};
    assert_int_equal(sj_call(fn, &in, 1, &out, 1), SJ_OK);
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 5; j++) {
            double ref = 0;
            for (int k = 0; k < 3; k++) ref += (double)x[i * 3 + k] * A[k * 5 + j];
            assert_true(fabs(((float *)out.data)[i * 5 + j] - ref) < 1e-5);
        }
    sj_tensor_free(rt, &out);
    sj_fn_destroy(fn);
    sj_weights_close(w);
}

/* Each malformed file: refused whole, with what was wrong. */
static void expect_bad(const char *header, const void *data, size_t len, sj_status want, const char *msg) {
    sj_weights *w = (sj_weights *)1;
    const char *p = write_st("bad.safetensors", header, data, len);
    sj_status st = sj_weights_open(rt, p, &w);
    if (st != want || !strstr(sj_last_error(), msg))
        fail_msg("header %s: got %s '%s', want %s '%s'", header, sj_status_name(st), sj_last_error(),
                 sj_status_name(want), msg);
    assert_null(w);
    assert_non_null(strstr(sj_last_error(), "bad.safetensors"));
}

static void test_bad_files(void **state) {
    (void)state;
    unsigned char data[64] = {0};
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", data, 8, SJ_EINVAL,
               "tensor 'a': data [0, 16) past the end of the data (8 bytes): truncated file");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,12]}}", data, 16, SJ_EINVAL,
               "tensor 'a': 12 bytes of data for 4 elements of F32");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
               "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}",
               data, 16, SJ_EINVAL, "overlapping ranges");
    expect_bad("{\"a\":{\"dtype\":\"Q4\",\"shape\":[4],\"data_offsets\":[0,16]}}", data, 16, SJ_EINVAL,
               "tensor 'a': unknown dtype 'Q4'");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[-4],\"data_offsets\":[0,16]}}", data, 16, SJ_EINVAL,
               "tensor 'a': shape[0] is not a size");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", data, 16,
               SJ_EINVAL, "rank 9");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[16,0]}}", data, 16, SJ_EINVAL,
               "data_offsets is not [begin, end]");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[4]}}", data, 16, SJ_EINVAL, "lacks dtype, shape or data_offsets");
    expect_bad("{\"a\":[1,2]}", data, 16, SJ_EINVAL, "tensor 'a': header entry is not an object");
    expect_bad("[1, 2, 3]", data, 16, SJ_EINVAL, "header is not a JSON object");
    expect_bad("{\"a\": {", data, 16, SJ_EINVAL, "header is not a JSON object");
    expect_bad("{\"__metadata__\": 3}", data, 16, SJ_EINVAL, "__metadata__ is not an object");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
               "\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}",
               data, 16, SJ_EINVAL, "header is not a JSON object");
    /* a header length past the file */
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/huge.safetensors", dir);
    FILE *f = fopen(path, "wb");
    unsigned char lb[8] = {0xff, 0xff, 0, 0, 0, 0, 0, 0};
    fwrite(lb, 1, 8, f);
    fwrite("{}", 1, 2, f);
    fclose(f);
    sj_weights *w;
    assert_int_equal(sj_weights_open(rt, path, &w), SJ_EINVAL);
    assert_non_null(strstr(sj_last_error(), "header of 65535 bytes out of bounds"));
    /* shorter than a header length; missing; a directory; F64: named, refused at use */
    write_st("empty.safetensors", "", NULL, 0);
    snprintf(path, sizeof path, "%s/short.safetensors", dir);
    f = fopen(path, "wb");
    fwrite(lb, 1, 3, f);
    fclose(f);
    assert_int_equal(sj_weights_open(rt, path, &w), SJ_EINVAL);
    assert_non_null(strstr(sj_last_error(), "truncated file"));
    snprintf(path, sizeof path, "%s/missing.safetensors", dir);
    assert_int_equal(sj_weights_open(rt, path, &w), SJ_EINVAL);
    assert_non_null(strstr(sj_last_error(), "cannot open"));
    assert_int_equal(sj_weights_open(rt, dir, &w), SJ_EINVAL);
    double d64[2] = {1.5, -2.5};
    const char *p = write_st("f64.safetensors", "{\"x\":{\"dtype\":\"F64\",\"shape\":[2],\"data_offsets\":[0,16]}}",
                             d64, sizeof d64);
    assert_int_equal(sj_weights_open(rt, p, &w), SJ_OK);
    sj_tensor t;
    assert_int_equal(sj_weights_get(w, "x", SJ_F32, 1, NULL, &t), SJ_EDTYPE);
    assert_non_null(strstr(sj_last_error(), "the file has F64"));
    assert_int_equal(sj_weights_info(w, "x", &t), SJ_EDTYPE);
    sj_weights_close(w);
    assert_int_equal(sj_weights_open(NULL, p, &w), SJ_EINVAL);
    assert_int_equal(sj_weights_open(rt, p, NULL), SJ_EINVAL);
}

/* The good file cut at every length: each is refused (or, past the last
 * tensor's bytes, accepted), never read past its end (ASan). */
static void test_every_truncation(void **state) {
    (void)state;
    const char *good = good_file();
    FILE *f = fopen(good, "rb");
    assert_non_null(f);
    unsigned char buf[2048];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/cut.safetensors", dir);
    int accepted = 0;
    for (size_t len = 0; len < n; len++) {
        f = fopen(path, "wb");
        fwrite(buf, 1, len, f);
        fclose(f);
        sj_weights *w = NULL;
        sj_status st = sj_weights_open(rt, path, &w);
        if (!st) {
            accepted++;
            sj_weights_close(w);
        } else {
            assert_int_equal(st, SJ_EINVAL);
            assert_true(sj_last_error()[0] != 0);
        }
    }
    assert_int_equal(accepted, 0); /* the last tensor ends at the file's end */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_good_file),
        cmocka_unit_test(test_weight_as_param),
        cmocka_unit_test(test_bad_files),
        cmocka_unit_test(test_every_truncation),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
