/* Tests for guards/guard: building check programs from hand-made pools,
 * symbol binding, every failure kind with its fields and exact message
 * (named and unnamed inputs), layouts, relation facts, divisibility,
 * constant facts, deterministic first failures, concurrent evaluation and
 * the printed form. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "guards/guard.h"
#include "guards/table.h"
#include "base/tensor.h"

/* -- Helpers ------------------------------------------------------------- */

#define ENTRY 17

static const char *const XY[] = {"x", "y", "z", "w"};

static sj_guard_input gi(sj_dtype dt, int rank, const sj_expr *dims) {
    sj_guard_input g;
    memset(&g, 0, sizeof g);
    g.dtype = dt;
    g.rank = rank;
    g.device = SJ_HOST;
    g.contiguous = true;
    for (int i = 0; i < rank; i++) g.dim[i] = dims[i];
    return g;
}

static sj_tensor tn(sj_dtype dt, int rank, const int64_t *shape) {
    sj_tensor t = sj_tensor_make(NULL, dt, rank, shape);
    assert_int_equal(t.rank, rank);
    return t;
}

static sj_tensor tn_strided(sj_dtype dt, int rank, const int64_t *shape, const int64_t *stride) {
    sj_tensor t;
    memset(&t, 0, sizeof t);
    t.dtype = dt, t.rank = rank, t.device = SJ_HOST;
    for (int i = 0; i < rank; i++) t.shape[i] = shape[i], t.stride[i] = stride[i];
    return t;
}

static sj_fact fact(sj_expr lhs, sj_rel rel, sj_expr rhs, const char *why) {
    sj_fact f;
    memset(&f, 0, sizeof f);
    f.lhs = lhs, f.rel = rel, f.rhs = rhs;
    snprintf(f.why, sizeof f.why, "%s", why);
    return f;
}

#define DIMS(...) ((const sj_expr[]){__VA_ARGS__})
#define SHAPE(...) ((const int64_t[]){__VA_ARGS__})

static void expect_pass(const sj_guard_set *gs, const sj_tensor *in, int64_t *sv) {
    sj_guard_failure f;
    memset(&f, 0, sizeof f);
    bool ok = sj_guard_check(gs, in, sv, &f);
    if (!ok) fprintf(stderr, "unexpected failure: %s\n", f.message);
    assert_true(ok);
    assert_true(sj_guard_check(gs, in, sv, NULL));
}

/* The check fails with exactly these fields (expected_hi = expected unless
 * the kind is RANGE), with and without a failure record. */
static void expect_fail(const sj_guard_set *gs, const sj_tensor *in, int64_t *sv, sj_guard_kind kind,
                        int input, int axis, int64_t expected, int64_t expected_hi, int64_t actual,
                        const char *name, const char *msg) {
    sj_guard_failure f;
    memset(&f, 0x5a, sizeof f);
    assert_false(sj_guard_check(gs, in, sv, &f));
    assert_string_equal(f.message, msg);
    assert_int_equal(f.entry, ENTRY);
    assert_int_equal(f.kind, kind);
    assert_int_equal(f.input, input);
    assert_int_equal(f.axis, axis);
    assert_true(f.expected == expected);
    assert_true(f.expected_hi == expected_hi);
    assert_true(f.actual == actual);
    assert_string_equal(f.input_name, name);
    assert_false(sj_guard_check(gs, in, sv, NULL));
}

static char *print_set(const sj_guard_set *gs, const char *indent) {
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    assert_non_null(f);
    sj_guard_print(gs, f, indent);
    fclose(f);
    return buf;
}

/* -- Names, sizes, edge cases of building -------------------------------- */

static void test_kind_names(void **state) {
    static const char *const want[] = {"dtype", "rank", "device", "stride", "size",
                                       "equal sizes", "range", "divisibility", "relation"};
    assert_int_equal(SJ_GUARD_KIND_COUNT, 9);
    for (int k = 0; k < SJ_GUARD_KIND_COUNT; k++) assert_string_equal(sj_guard_kind_name((sj_guard_kind)k), want[k]);
    assert_string_equal(sj_guard_kind_name(SJ_GUARD_KIND_COUNT), "?");
    assert_string_equal(sj_guard_kind_name((sj_guard_kind)-1), "?");
    assert_string_equal(sj_guard_kind_name((sj_guard_kind)1000), "?");
}

static void test_build_edges(void **state) {
    sj_guard_free(NULL);
    assert_int_equal(sj_guard_size(NULL), 0);
    sj_exprs *p = sj_exprs_create();
    /* zero inputs, no facts: an empty program that always passes */
    sj_guard_set *gs = sj_guard_build(p, NULL, 0, NULL, 0, NULL, ENTRY);
    assert_non_null(gs);
    assert_int_equal(sj_guard_size(gs), 0);
    expect_pass(gs, NULL, NULL);
    char *txt = print_set(gs, "  ");
    assert_string_equal(txt, "");
    free(txt);
    sj_guard_free(gs);

    /* invalid arguments */
    sj_sym_new(p, 4, 2, SJ_EX_INF);
    sj_expr s0 = sj_ex_sym(p, 0);
    sj_guard_input bad = gi(SJ_F32, 1, DIMS(s0));
    assert_null(sj_guard_build(NULL, &bad, 1, NULL, 0, NULL, ENTRY));
    bad.rank = SJ_MAX_RANK + 1;
    assert_null(sj_guard_build(p, &bad, 1, NULL, 0, NULL, ENTRY));
    bad.rank = -1;
    assert_null(sj_guard_build(p, &bad, 1, NULL, 0, NULL, ENTRY));
    bad = gi(SJ_F32, 1, DIMS(SJ_EX_NONE));
    assert_null(sj_guard_build(p, &bad, 1, NULL, 0, NULL, ENTRY));
    bad = gi(SJ_F32, 1, DIMS(s0));
    sj_fact f = fact(s0, SJ_REL_EQ, SJ_EX_NONE, "");
    assert_null(sj_guard_build(p, &bad, 1, &f, 1, NULL, ENTRY));
    assert_null(sj_guard_build(p, &bad, -1, NULL, 0, NULL, ENTRY));

    /* names: NULL entries and empty names are unnamed; long names truncate */
    sj_guard_input two[2] = {gi(SJ_F32, 1, DIMS(sj_ex_const(p, 3))), gi(SJ_F32, 1, DIMS(sj_ex_const(p, 5)))};
    const char *names[2] = {"a_rather_long_input_name_of_40_characters", NULL};
    gs = sj_guard_build(p, two, 2, NULL, 0, names, ENTRY);
    assert_non_null(gs);
    sj_tensor in[2] = {tn(SJ_F32, 1, SHAPE(4)), tn(SJ_F32, 1, SHAPE(5))};
    expect_fail(gs, in, NULL, SJ_GUARD_SIZE, 0, 0, 3, 3, 4, "a_rather_long_input_name_of_40_",
                "input 'a_rather_long_input_name_of_40_' size mismatch at axis 0: expected 3, actual 4");
    in[0] = tn(SJ_F32, 1, SHAPE(3));
    in[1] = tn(SJ_F32, 1, SHAPE(6));
    expect_fail(gs, in, NULL, SJ_GUARD_SIZE, 1, 0, 5, 5, 6, "", "input 1 size mismatch at axis 0: expected 5, actual 6");
    sj_guard_free(gs);
    names[0] = "";
    gs = sj_guard_build(p, two, 2, NULL, 0, names, ENTRY);
    in[0] = tn(SJ_F32, 1, SHAPE(2));
    expect_fail(gs, in, NULL, SJ_GUARD_SIZE, 0, 0, 3, 3, 2, "", "input 0 size mismatch at axis 0: expected 3, actual 2");
    sj_guard_free(gs);
    sj_exprs_destroy(p);
}

/* -- Passing and binding ------------------------------------------------- */

static void test_pass_binds(void **state) {
    sj_exprs *p = sj_exprs_create();
    assert_int_equal(sj_sym_new(p, 8, 2, SJ_EX_INF), 0);
    assert_int_equal(sj_sym_new(p, 5, 2, 64), 1);
    sj_expr s0 = sj_ex_sym(p, 0), s1 = sj_ex_sym(p, 1), c1 = sj_ex_const(p, 1), c4 = sj_ex_const(p, 4);
    sj_guard_input ins[4] = {gi(SJ_F32, 3, DIMS(c1, s0, sj_ex_const(p, 768))), gi(SJ_F16, 2, DIMS(s0, s1)),
                             gi(SJ_I64, 0, NULL), gi(SJ_F32, 2, DIMS(s1, c4))};
    ins[3].contiguous = false;
    ins[3].stride[0] = 4, ins[3].stride[1] = 1;
    sj_guard_set *gs = sj_guard_build(p, ins, 4, NULL, 0, XY, ENTRY);
    assert_non_null(gs);
    /* one per input (meta and layout) and one per size */
    assert_int_equal(sj_guard_size(gs), 4 + 3 + 2 + 0 + 2);
    int64_t sv[2] = {-1, -1};
    sj_tensor in[4] = {tn(SJ_F32, 3, SHAPE(1, 10, 768)), tn(SJ_F16, 2, SHAPE(10, 7)), tn(SJ_I64, 0, NULL),
                       tn(SJ_F32, 2, SHAPE(7, 4))};
    expect_pass(gs, in, sv);
    assert_true(sv[0] == 10 && sv[1] == 7);
    in[0].shape[1] = in[1].shape[0] = 3;
    in[1].shape[1] = in[3].shape[0] = 64;
    for (int i = 0; i < 4; i++) sj_tensor_set_contiguous(&in[i]);
    expect_pass(gs, in, sv);
    assert_true(sv[0] == 3 && sv[1] == 64);
    in[0].shape[1] = in[1].shape[0] = INT64_C(1) << 40; /* no upper end */
    for (int i = 0; i < 4; i++) sj_tensor_set_contiguous(&in[i]);
    expect_pass(gs, in, sv);
    assert_true(sv[0] == INT64_C(1) << 40 && sv[1] == 64);
    sj_guard_free(gs);
    sj_exprs_destroy(p);
}

/* -- Failures of dtype, rank, device, size, duck, range ------------------- */

static void test_meta_failures(void **state) {
    sj_exprs *p = sj_exprs_create();
    sj_sym_new(p, 8, 2, SJ_EX_INF);
    sj_expr s0 = sj_ex_sym(p, 0);
    sj_guard_input ins[2] = {gi(SJ_F32, 2, DIMS(s0, sj_ex_const(p, 4))), gi(SJ_I32, 1, DIMS(s0))};
    sj_guard_set *named = sj_guard_build(p, ins, 2, NULL, 0, XY, ENTRY);
    sj_guard_set *anon = sj_guard_build(p, ins, 2, NULL, 0, NULL, ENTRY);
    assert_true(named && anon);
    int64_t sv[1];
    sj_tensor in[2] = {tn(SJ_F32, 2, SHAPE(8, 4)), tn(SJ_I32, 1, SHAPE(8))};
    expect_pass(named, in, sv);
    expect_pass(anon, in, sv);

    in[0].dtype = SJ_F16;
    expect_fail(named, in, sv, SJ_GUARD_DTYPE, 0, -1, SJ_F32, SJ_F32, SJ_F16, "x",
                "input 'x' dtype mismatch: expected f32, actual f16");
    expect_fail(anon, in, sv, SJ_GUARD_DTYPE, 0, -1, SJ_F32, SJ_F32, SJ_F16, "",
                "input 0 dtype mismatch: expected f32, actual f16");
    in[0] = tn(SJ_F16, 3, SHAPE(8, 4, 2)); /* dtype and rank: dtype first */
    expect_fail(named, in, sv, SJ_GUARD_DTYPE, 0, -1, SJ_F32, SJ_F32, SJ_F16, "x",
                "input 'x' dtype mismatch: expected f32, actual f16");
    in[0] = tn(SJ_F32, 3, SHAPE(8, 4, 2));
    expect_fail(named, in, sv, SJ_GUARD_RANK, 0, -1, 2, 2, 3, "x", "input 'x' rank mismatch: expected 2, actual 3");
    expect_fail(anon, in, sv, SJ_GUARD_RANK, 0, -1, 2, 2, 3, "", "input 0 rank mismatch: expected 2, actual 3");
    in[0] = tn(SJ_F32, 0, NULL);
    expect_fail(named, in, sv, SJ_GUARD_RANK, 0, -1, 2, 2, 0, "x", "input 'x' rank mismatch: expected 2, actual 0");
    in[0] = tn(SJ_F32, 2, SHAPE(8, 4));
    in[1].device = SJ_CUDA;
    expect_fail(named, in, sv, SJ_GUARD_DEVICE, 1, -1, SJ_HOST, SJ_HOST, SJ_CUDA, "y",
                "input 'y' device mismatch: expected host, actual cuda");
    expect_fail(anon, in, sv, SJ_GUARD_DEVICE, 1, -1, SJ_HOST, SJ_HOST, SJ_CUDA, "",
                "input 1 device mismatch: expected host, actual cuda");
    in[1] = tn(SJ_I64, 1, SHAPE(8));
    expect_fail(named, in, sv, SJ_GUARD_DTYPE, 1, -1, SJ_I32, SJ_I32, SJ_I64, "y",
                "input 'y' dtype mismatch: expected i32, actual i64");
    sj_guard_free(named);
    sj_guard_free(anon);

    /* a cuda input guarded on cuda */
    ins[0].device = SJ_CUDA;
    named = sj_guard_build(p, ins, 1, NULL, 0, XY, ENTRY);
    in[0].device = SJ_CUDA;
    expect_pass(named, in, sv);
    in[0].device = SJ_HOST;
    expect_fail(named, in, sv, SJ_GUARD_DEVICE, 0, -1, SJ_CUDA, SJ_CUDA, SJ_HOST, "x",
                "input 'x' device mismatch: expected cuda, actual host");
    sj_guard_free(named);
    sj_exprs_destroy(p);
}

static void test_size_and_duck(void **state) {
    sj_exprs *p = sj_exprs_create();
    sj_sym_new(p, 8, 2, SJ_EX_INF);
    sj_sym_new(p, 5, 2, SJ_EX_INF);
    sj_expr s0 = sj_ex_sym(p, 0), s1 = sj_ex_sym(p, 1), c3 = sj_ex_const(p, 3);
    sj_guard_input ins[3] = {gi(SJ_F32, 2, DIMS(s0, c3)), gi(SJ_F32, 2, DIMS(s0, c3)), gi(SJ_F32, 2, DIMS(s1, s1))};
    sj_guard_set *named = sj_guard_build(p, ins, 3, NULL, 0, XY, ENTRY);
    sj_guard_set *anon = sj_guard_build(p, ins, 3, NULL, 0, NULL, ENTRY);
    int64_t sv[2];
    sj_tensor in[3] = {tn(SJ_F32, 2, SHAPE(7, 3)), tn(SJ_F32, 2, SHAPE(7, 3)), tn(SJ_F32, 2, SHAPE(5, 5))};
    expect_pass(named, in, sv);
    assert_true(sv[0] == 7 && sv[1] == 5);

    in[0] = tn(SJ_F32, 2, SHAPE(7, 4));
    expect_fail(named, in, sv, SJ_GUARD_SIZE, 0, 1, 3, 3, 4, "x", "input 'x' size mismatch at axis 1: expected 3, actual 4");
    expect_fail(anon, in, sv, SJ_GUARD_SIZE, 0, 1, 3, 3, 4, "", "input 0 size mismatch at axis 1: expected 3, actual 4");
    in[0] = tn(SJ_F32, 2, SHAPE(7, 3));
    in[1] = tn(SJ_F32, 2, SHAPE(8, 3));
    expect_fail(named, in, sv, SJ_GUARD_DUCK, 1, 0, 7, 7, 8, "y",
                "input 'y' size mismatch at axis 0: expected 7 (equal to input 'x' axis 0), actual 8");
    expect_fail(anon, in, sv, SJ_GUARD_DUCK, 1, 0, 7, 7, 8, "",
                "input 1 size mismatch at axis 0: expected 7 (equal to input 0 axis 0), actual 8");
    in[1] = tn(SJ_F32, 2, SHAPE(7, 3));
    in[2] = tn(SJ_F32, 2, SHAPE(5, 6)); /* duck within one input */
    expect_fail(named, in, sv, SJ_GUARD_DUCK, 2, 1, 5, 5, 6, "z",
                "input 'z' size mismatch at axis 1: expected 5 (equal to input 'z' axis 0), actual 6");
    sj_guard_free(named);
    sj_guard_free(anon);
    sj_exprs_destroy(p);
}

static void test_ranges(void **state) {
    sj_exprs *p = sj_exprs_create();
    sj_sym_new(p, 8, 2, SJ_EX_INF);
    sj_sym_new(p, 5, 2, 16);
    sj_sym_new(p, 3, 0, SJ_EX_INF);
    sj_expr s0 = sj_ex_sym(p, 0), s1 = sj_ex_sym(p, 1), s2 = sj_ex_sym(p, 2);
    sj_guard_input ins[2] = {gi(SJ_F32, 2, DIMS(s0, s1)), gi(SJ_F32, 1, DIMS(s2))};
    sj_guard_set *named = sj_guard_build(p, ins, 2, NULL, 0, XY, ENTRY);
    sj_guard_set *anon = sj_guard_build(p, ins, 2, NULL, 0, NULL, ENTRY);
    int64_t sv[3];
    sj_tensor in[2] = {tn(SJ_F32, 2, SHAPE(2, 2)), tn(SJ_F32, 1, SHAPE(0))};
    expect_pass(named, in, sv); /* the low ends */
    assert_true(sv[0] == 2 && sv[1] == 2 && sv[2] == 0);
    in[0] = tn(SJ_F32, 2, SHAPE(INT64_C(1) << 44, 16)); /* the high end; s0 unbounded */
    expect_pass(named, in, sv);
    assert_true(sv[0] == INT64_C(1) << 44 && sv[1] == 16);

    in[0] = tn(SJ_F32, 2, SHAPE(1, 4));
    expect_fail(named, in, sv, SJ_GUARD_RANGE, 0, 0, 2, INT64_MAX, 1, "x",
                "input 'x' size at axis 0 out of range: expected [2, inf), actual 1");
    expect_fail(anon, in, sv, SJ_GUARD_RANGE, 0, 0, 2, INT64_MAX, 1, "",
                "input 0 size at axis 0 out of range: expected [2, inf), actual 1");
    in[0] = tn(SJ_F32, 2, SHAPE(5, 17));
    expect_fail(named, in, sv, SJ_GUARD_RANGE, 0, 1, 2, 16, 17, "x",
                "input 'x' size at axis 1 out of range: expected [2, 16], actual 17");
    in[0] = tn(SJ_F32, 2, SHAPE(5, 0));
    expect_fail(anon, in, sv, SJ_GUARD_RANGE, 0, 1, 2, 16, 0, "",
                "input 0 size at axis 1 out of range: expected [2, 16], actual 0");
    sj_guard_free(named);
    sj_guard_free(anon);
    sj_exprs_destroy(p);
}

/* -- Layouts ------------------------------------------------------------- */

static void test_contiguity(void **state) {
    sj_exprs *p = sj_exprs_create();
    sj_sym_new(p, 4, 0, SJ_EX_INF);
    sj_sym_new(p, 5, 0, SJ_EX_INF);
    sj_sym_new(p, 6, 0, SJ_EX_INF);
    sj_expr s0 = sj_ex_sym(p, 0), s1 = sj_ex_sym(p, 1), s2 = sj_ex_sym(p, 2);
    sj_guard_input g3 = gi(SJ_F32, 3, DIMS(s0, s1, s2));
    sj_guard_set *gs = sj_guard_build(p, &g3, 1, NULL, 0, XY, ENTRY);
    sj_guard_set *anon = sj_guard_build(p, &g3, 1, NULL, 0, NULL, ENTRY);
    int64_t sv[3];
    sj_tensor t = tn(SJ_F32, 3, SHAPE(4, 5, 6));
    expect_pass(gs, &t, sv);
    /* size-1 axes take any stride */
    t = tn_strided(SJ_F32, 3, SHAPE(4, 1, 6), SHAPE(6, 999, 1));
    expect_pass(gs, &t, sv);
    t = tn_strided(SJ_F32, 3, SHAPE(1, 1, 6), SHAPE(0, 7, 1));
    expect_pass(gs, &t, sv);
    t = tn_strided(SJ_F32, 3, SHAPE(4, 5, 1), SHAPE(5, 1, 3));
    expect_pass(gs, &t, sv);
    /* a column slice x[:, 0:1] of a 3x3 matrix */
    t = tn_strided(SJ_F32, 3, SHAPE(3, 1, 1), SHAPE(3, 1, 1));
    expect_fail(gs, &t, sv, SJ_GUARD_STRIDE, 0, 0, 1, 1, 3, "x",
                "input 'x' layout mismatch: expected contiguous, actual stride 3 at axis 0 (contiguous stride 1)");
    expect_fail(anon, &t, sv, SJ_GUARD_STRIDE, 0, 0, 1, 1, 3, "",
                "input 0 layout mismatch: expected contiguous, actual stride 3 at axis 0 (contiguous stride 1)");
    /* transposed: the outermost axis off its stride is reported */
    t = tn_strided(SJ_F32, 3, SHAPE(2, 3, 4), SHAPE(12, 1, 3));
    expect_fail(gs, &t, sv, SJ_GUARD_STRIDE, 0, 1, 4, 4, 1, "x",
                "input 'x' layout mismatch: expected contiguous, actual stride 1 at axis 1 (contiguous stride 4)");
    t = tn_strided(SJ_F32, 3, SHAPE(1, 3, 4), SHAPE(77, 8, 2));
    expect_fail(gs, &t, sv, SJ_GUARD_STRIDE, 0, 1, 4, 4, 8, "x",
                "input 'x' layout mismatch: expected contiguous, actual stride 8 at axis 1 (contiguous stride 4)");
    t = tn_strided(SJ_F32, 3, SHAPE(1, 1, 4), SHAPE(77, 8, 2));
    expect_fail(gs, &t, sv, SJ_GUARD_STRIDE, 0, 2, 1, 1, 2, "x",
                "input 'x' layout mismatch: expected contiguous, actual stride 2 at axis 2 (contiguous stride 1)");
    t = tn_strided(SJ_F32, 3, SHAPE(2, 3, 4), SHAPE(0, 4, 1)); /* broadcast */
    expect_fail(gs, &t, sv, SJ_GUARD_STRIDE, 0, 0, 12, 12, 0, "x",
                "input 'x' layout mismatch: expected contiguous, actual stride 0 at axis 0 (contiguous stride 12)");
    /* size 0 anywhere: contiguous whatever the strides */
    t = tn_strided(SJ_F32, 3, SHAPE(0, 3, 4), SHAPE(7, 9, 11));
    expect_pass(gs, &t, sv);
    t = tn_strided(SJ_F32, 3, SHAPE(2, 3, 0), SHAPE(0, 0, 5));
    expect_pass(gs, &t, sv);
    t = tn_strided(SJ_F32, 3, SHAPE(INT64_C(1) << 40, 0, INT64_C(1) << 40), SHAPE(3, 3, 3));
    expect_pass(gs, &t, sv);

    /* random layouts against sj_tensor_is_contiguous (no size 0) */
    static const int64_t strides[] = {0, 1, 2, 3, 4, 6, 12, 24};
    uint64_t r = 0x9E3779B97F4A7C15u;
    for (int it = 0; it < 20000; it++) {
        int64_t shape[3], st[3];
        for (int a = 0; a < 3; a++) {
            r ^= r << 13, r ^= r >> 7, r ^= r << 17;
            shape[a] = 1 + (int64_t)(r % 4);
            st[a] = strides[(r >> 8) % 8];
        }
        if (it % 3 == 0) { /* often contiguous, with a random size-1 stride */
            t = tn(SJ_F32, 3, shape);
            for (int a = 0; a < 3; a++)
                if (shape[a] == 1) t.stride[a] = st[a];
        } else {
            t = tn_strided(SJ_F32, 3, shape, st);
        }
        assert_int_equal(sj_guard_check(gs, &t, sv, NULL), sj_tensor_is_contiguous(&t));
    }
    sj_guard_free(gs);
    sj_guard_free(anon);
    sj_exprs_destroy(p);
}

static void test_exact_strides(void **state) {
    sj_exprs *p = sj_exprs_create();
    sj_sym_new(p, 3, 0, SJ_EX_INF);
    sj_expr s0 = sj_ex_sym(p, 0);
    sj_guard_input g = gi(SJ_F32, 2, DIMS(s0, sj_ex_const(p, 4)));
    g.contiguous = false;
    g.stride[0] = 4, g.stride[1] = 1;
    sj_guard_set *gs = sj_guard_build(p, &g, 1, NULL, 0, XY, ENTRY);
    sj_guard_set *anon = sj_guard_build(p, &g, 1, NULL, 0, NULL, ENTRY);
    int64_t sv[1];
    sj_tensor t = tn(SJ_F32, 2, SHAPE(3, 4));
    expect_pass(gs, &t, sv);
    t = tn_strided(SJ_F32, 2, SHAPE(3, 4), SHAPE(4, 2));
    expect_fail(gs, &t, sv, SJ_GUARD_STRIDE, 0, 1, 1, 1, 2, "x", "input 'x' stride mismatch at axis 1: expected 1, actual 2");
    expect_fail(anon, &t, sv, SJ_GUARD_STRIDE, 0, 1, 1, 1, 2, "", "input 0 stride mismatch at axis 1: expected 1, actual 2");
    /* exact means exact: a size-1 axis or an empty tensor with other strides fails */
    t = tn_strided(SJ_F32, 2, SHAPE(1, 4), SHAPE(9, 1));
    expect_fail(gs, &t, sv, SJ_GUARD_STRIDE, 0, 0, 4, 4, 9, "x", "input 'x' stride mismatch at axis 0: expected 4, actual 9");
    t = tn_strided(SJ_F32, 2, SHAPE(0, 4), SHAPE(8, 1));
    expect_fail(gs, &t, sv, SJ_GUARD_STRIDE, 0, 0, 4, 4, 8, "x", "input 'x' stride mismatch at axis 0: expected 4, actual 8");
    sj_guard_free(gs);
    sj_guard_free(anon);

    /* a non-contiguous guard: padded rows */
    g.stride[0] = 8, g.stride[1] = 2;
    gs = sj_guard_build(p, &g, 1, NULL, 0, XY, ENTRY);
    t = tn_strided(SJ_F32, 2, SHAPE(5, 4), SHAPE(8, 2));
    expect_pass(gs, &t, sv);
    t = tn(SJ_F32, 2, SHAPE(5, 4));
    expect_fail(gs, &t, sv, SJ_GUARD_STRIDE, 0, 0, 8, 8, 4, "x", "input 'x' stride mismatch at axis 0: expected 8, actual 4");
    sj_guard_free(gs);
    sj_exprs_destroy(p);
}

/* -- Facts --------------------------------------------------------------- */

static void test_relations(void **state) {
    sj_exprs *p = sj_exprs_create();
    for (int i = 0; i < 3; i++) sj_sym_new(p, 4, 1, SJ_EX_INF);
    sj_expr s0 = sj_ex_sym(p, 0), s1 = sj_ex_sym(p, 1), s2 = sj_ex_sym(p, 2);
    sj_guard_input ins[3] = {gi(SJ_F32, 1, DIMS(s0)), gi(SJ_F32, 1, DIMS(s1)), gi(SJ_F32, 1, DIMS(s2))};
    sj_fact facts[4] = {
        fact(s0, SJ_REL_EQ, sj_ex_mul(p, sj_ex_const(p, 2), s1), "concat(...)"),
        fact(s1, SJ_REL_NE, s2, "add(f32[s1], f32[s2])"),
        fact(s0, SJ_REL_LT, s2, "slice"),
        fact(s2, SJ_REL_GE, sj_ex_const(p, 3), ""),
    };
    sj_guard_set *gs = sj_guard_build(p, ins, 3, facts, 4, XY, ENTRY);
    sj_guard_set *anon = sj_guard_build(p, ins, 3, facts, 4, NULL, ENTRY);
    assert_int_equal(sj_guard_size(gs), 3 * 2 + 4); /* input, bind; facts */
    int64_t sv[3];
    sj_tensor in[3] = {tn(SJ_F32, 1, SHAPE(6)), tn(SJ_F32, 1, SHAPE(3)), tn(SJ_F32, 1, SHAPE(7))};
    expect_pass(gs, in, sv);
    assert_true(sv[0] == 6 && sv[1] == 3 && sv[2] == 7);

    in[1].shape[0] = 4; /* EQ fails (first, though NE holds) */
    expect_fail(gs, in, sv, SJ_GUARD_RELATION, -1, -1, 8, 8, 6, "",
                "relation failed: s0 == 2*s1 with s0 = 6, s1 = 4 (from concat(...))");
    expect_fail(anon, in, sv, SJ_GUARD_RELATION, -1, -1, 8, 8, 6, "",
                "relation failed: s0 == 2*s1 with s0 = 6, s1 = 4 (from concat(...))");
    in[0].shape[0] = 8, in[2].shape[0] = 4; /* NE fails */
    expect_fail(gs, in, sv, SJ_GUARD_RELATION, -1, -1, 4, 4, 4, "",
                "relation failed: s1 != s2 with s1 = 4, s2 = 4 (from add(f32[s1], f32[s2]))");
    in[2].shape[0] = 5; /* LT fails: 8 < 5 */
    expect_fail(gs, in, sv, SJ_GUARD_RELATION, -1, -1, 5, 5, 8, "",
                "relation failed: s0 < s2 with s0 = 8, s2 = 5 (from slice)");
    in[2].shape[0] = 8; /* LT fails at equality */
    expect_fail(gs, in, sv, SJ_GUARD_RELATION, -1, -1, 8, 8, 8, "",
                "relation failed: s0 < s2 with s0 = 8, s2 = 8 (from slice)");
    in[0].shape[0] = 2, in[1].shape[0] = 1, in[2].shape[0] = 3; /* GE holds at equality */
    expect_pass(gs, in, sv);
    in[0].shape[0] = 2, in[1].shape[0] = 1, in[2].shape[0] = 2; /* GE fails, no why */
    sj_fact ge = facts[3];
    sj_guard_free(gs);
    gs = sj_guard_build(p, ins, 3, &ge, 1, XY, ENTRY);
    expect_fail(gs, in, sv, SJ_GUARD_RELATION, -1, -1, 3, 3, 2, "", "relation failed: s2 >= 3 with s2 = 2");
    sj_guard_free(gs);
    sj_guard_free(anon);

    /* a relation that is not divisibility though it uses a mod */
    sj_fact ne = fact(sj_ex_mod(p, s0, sj_ex_const(p, 2)), SJ_REL_NE, sj_ex_const(p, 0), "odd");
    gs = sj_guard_build(p, ins, 3, &ne, 1, XY, ENTRY);
    in[0].shape[0] = 8;
    expect_fail(gs, in, sv, SJ_GUARD_RELATION, -1, -1, 0, 0, 0, "", "relation failed: s0 % 2 != 0 with s0 = 8 (from odd)");
    in[0].shape[0] = 9;
    expect_pass(gs, in, sv);
    sj_guard_free(gs);
    /* == 1 is not divisibility either */
    sj_fact one = fact(sj_ex_mod(p, s0, sj_ex_const(p, 2)), SJ_REL_EQ, sj_ex_const(p, 1), "odd");
    gs = sj_guard_build(p, ins, 3, &one, 1, XY, ENTRY);
    expect_pass(gs, in, sv);
    in[0].shape[0] = 8;
    expect_fail(gs, in, sv, SJ_GUARD_RELATION, -1, -1, 1, 1, 0, "", "relation failed: s0 % 2 == 1 with s0 = 8 (from odd)");
    sj_guard_free(gs);
    sj_exprs_destroy(p);
}

static void test_divisible_input(void **state) {
    sj_exprs *p = sj_exprs_create();
    sj_sym_new(p, 8, 2, SJ_EX_INF);
    sj_sym_new(p, 9, 2, SJ_EX_INF);
    sj_expr s0 = sj_ex_sym(p, 0), s1 = sj_ex_sym(p, 1), c0 = sj_ex_const(p, 0), c3 = sj_ex_const(p, 3);
    sj_guard_input ins[2] = {gi(SJ_F32, 2, DIMS(s0, c3)), gi(SJ_F32, 1, DIMS(s1))};
    const char *why = "reshape(f32[s0, 3])";
    sj_expr m2 = sj_ex_mod(p, s0, sj_ex_const(p, 2));
    /* reshape(f32[s0, 3], [-1, 6]) relies on 3*s0 % 6 == 0, canonically 3*(s0 % 2) */
    sj_expr m6 = sj_ex_mod(p, sj_ex_mul(p, s0, c3), sj_ex_const(p, 6));
    char buf[64];
    sj_ex_print(p, m6, buf, sizeof buf);
    assert_string_equal(buf, "3*(s0 % 2)");
    sj_fact forms[3] = {fact(m2, SJ_REL_EQ, c0, why), fact(c0, SJ_REL_EQ, m2, why), fact(m6, SJ_REL_EQ, c0, why)};
    int64_t sv[2];
    sj_tensor in[2] = {tn(SJ_F32, 2, SHAPE(8, 3)), tn(SJ_F32, 1, SHAPE(9))};
    for (int i = 0; i < 3; i++) {
        sj_guard_set *gs = sj_guard_build(p, ins, 2, &forms[i], 1, XY, ENTRY);
        sj_guard_set *anon = sj_guard_build(p, ins, 2, &forms[i], 1, NULL, ENTRY);
        in[0].shape[0] = 8;
        expect_pass(gs, in, sv);
        in[0].shape[0] = 7;
        expect_fail(gs, in, sv, SJ_GUARD_DIVISIBLE, 0, 0, 2, 2, 7, "x",
                    "input 'x' size at axis 0 not divisible by 2: actual 7 (from reshape(f32[s0, 3]))");
        expect_fail(anon, in, sv, SJ_GUARD_DIVISIBLE, 0, 0, 2, 2, 7, "",
                    "input 0 size at axis 0 not divisible by 2: actual 7 (from reshape(f32[s0, 3]))");
        sj_guard_free(gs);
        sj_guard_free(anon);
    }
    /* k not a power of two, the symbol bound by the second input, no why */
    sj_fact f3 = fact(sj_ex_mod(p, s1, c3), SJ_REL_EQ, c0, "");
    sj_guard_set *gs = sj_guard_build(p, ins, 2, &f3, 1, XY, ENTRY);
    in[0].shape[0] = 8;
    expect_pass(gs, in, sv);
    in[1].shape[0] = 10;
    expect_fail(gs, in, sv, SJ_GUARD_DIVISIBLE, 1, 0, 3, 3, 10, "y", "input 'y' size at axis 0 not divisible by 3: actual 10");
    in[1].shape[0] = 11;
    expect_fail(gs, in, sv, SJ_GUARD_DIVISIBLE, 1, 0, 3, 3, 11, "y", "input 'y' size at axis 0 not divisible by 3: actual 11");
    in[1].shape[0] = 12;
    expect_pass(gs, in, sv);
    sj_guard_free(gs);
    sj_exprs_destroy(p);
}

static void test_divisible_compound(void **state) {
    sj_exprs *p = sj_exprs_create();
    for (int i = 0; i < 3; i++) sj_sym_new(p, 4, 1, SJ_EX_INF);
    sj_expr s0 = sj_ex_sym(p, 0), s1 = sj_ex_sym(p, 1), s2 = sj_ex_sym(p, 2), c0 = sj_ex_const(p, 0);
    sj_guard_input ins[2] = {gi(SJ_F32, 1, DIMS(s0)), gi(SJ_F32, 1, DIMS(s1))};
    sj_fact f = fact(sj_ex_mod(p, sj_ex_add(p, s0, s1), sj_ex_const(p, 2)), SJ_REL_EQ, c0, "concat(x, y)");
    sj_guard_set *gs = sj_guard_build(p, ins, 2, &f, 1, XY, ENTRY);
    int64_t sv[3] = {0, 0, 6};
    sj_tensor in[2] = {tn(SJ_F32, 1, SHAPE(4)), tn(SJ_F32, 1, SHAPE(6))};
    expect_pass(gs, in, sv);
    in[1].shape[0] = 5;
    expect_fail(gs, in, sv, SJ_GUARD_DIVISIBLE, -1, -1, 2, 2, 9, "", "s0 + s1 not divisible by 2: actual 9 (from concat(x, y))");
    sj_guard_free(gs);

    /* a symbol no input binds: evaluated with what sym_vals holds, left untouched */
    sj_fact g = fact(sj_ex_mod(p, s2, sj_ex_const(p, 3)), SJ_REL_EQ, c0, "");
    gs = sj_guard_build(p, ins, 2, &g, 1, XY, ENTRY);
    in[1].shape[0] = 4;
    sv[2] = 6;
    expect_pass(gs, in, sv);
    assert_true(sv[0] == 4 && sv[1] == 4 && sv[2] == 6);
    sv[2] = 5;
    expect_fail(gs, in, sv, SJ_GUARD_DIVISIBLE, -1, -1, 3, 3, 5, "", "s2 not divisible by 3: actual 5");
    assert_true(sv[2] == 5);
    sj_guard_free(gs);

    /* a product: (s0*s1) % 4 */
    sj_fact h = fact(c0, SJ_REL_EQ, sj_ex_mod(p, sj_ex_mul(p, s0, s1), sj_ex_const(p, 4)), "view");
    gs = sj_guard_build(p, ins, 2, &h, 1, XY, ENTRY);
    in[0].shape[0] = 2, in[1].shape[0] = 6;
    expect_pass(gs, in, sv);
    in[0].shape[0] = 3;
    expect_fail(gs, in, sv, SJ_GUARD_DIVISIBLE, -1, -1, 4, 4, 18, "", "s0*s1 not divisible by 4: actual 18 (from view)");
    sj_guard_free(gs);

    /* c*(s0 % 8) == 0 with c*4 wrapping to 0: not divisibility, the fact as it is */
    sj_expr big = sj_ex_mul(p, sj_ex_const(p, INT64_C(1) << 62), sj_ex_mod(p, s0, sj_ex_const(p, 8)));
    sj_fact w = fact(big, SJ_REL_EQ, c0, "");
    gs = sj_guard_build(p, ins, 2, &w, 1, XY, ENTRY);
    in[0].shape[0] = 12; /* 2^62 * 4 == 0 (mod 2^64) */
    expect_pass(gs, in, sv);
    in[0].shape[0] = 10;
    expect_fail(gs, in, sv, SJ_GUARD_RELATION, -1, -1, 0, 0, INT64_MIN, "",
                "relation failed: 4611686018427387904*(s0 % 8) == 0 with s0 = 10");
    sj_guard_free(gs);
    sj_exprs_destroy(p);
}

static void test_const_facts(void **state) {
    sj_exprs *p = sj_exprs_create();
    sj_sym_new(p, 4, 1, SJ_EX_INF);
    sj_expr s0 = sj_ex_sym(p, 0), c2 = sj_ex_const(p, 2), c3 = sj_ex_const(p, 3);
    sj_guard_input in0 = gi(SJ_F32, 1, DIMS(s0));
    sj_fact ok[4] = {fact(c3, SJ_REL_EQ, c3, "a"), fact(c2, SJ_REL_NE, c3, "b"), fact(c2, SJ_REL_LT, c3, "c"),
                     fact(c3, SJ_REL_GE, c3, "d")};
    sj_guard_set *gs = sj_guard_build(p, &in0, 1, ok, 4, XY, ENTRY);
    assert_int_equal(sj_guard_size(gs), 2); /* the four are dropped */
    int64_t sv[1];
    sj_tensor t = tn(SJ_F32, 1, SHAPE(5));
    expect_pass(gs, &t, sv);
    char *txt = print_set(gs, "");
    assert_string_equal(txt, "x: f32, rank 1, host, contiguous\nx.size(0) = s0 in [1, inf)\n");
    free(txt);
    sj_guard_free(gs);

    sj_fact bad[3] = {fact(c3, SJ_REL_EQ, c3, "a"), fact(c2, SJ_REL_EQ, c3, "broadcast"), fact(c2, SJ_REL_GE, c3, "")};
    gs = sj_guard_build(p, &in0, 1, bad, 3, XY, ENTRY);
    assert_non_null(gs);
    assert_int_equal(sj_guard_size(gs), 4); /* the true one dropped */
    for (int i = 0; i < 3; i++)
        expect_fail(gs, &t, sv, SJ_GUARD_RELATION, -1, -1, 3, 3, 2, "", "relation failed: 2 == 3 (from broadcast)");
    sj_guard_free(gs);
    gs = sj_guard_build(p, NULL, 0, &bad[2], 1, NULL, ENTRY);
    expect_fail(gs, NULL, NULL, SJ_GUARD_RELATION, -1, -1, 3, 3, 2, "", "relation failed: 2 >= 3");
    sj_guard_free(gs);
    sj_exprs_destroy(p);
}

/* Sizes given by expressions (not made by the tracer, supported anyway):
 * checked once every symbol is bound, even by a later input. */
static void test_size_expressions(void **state) {
    sj_exprs *p = sj_exprs_create();
    sj_sym_new(p, 4, 1, SJ_EX_INF);
    sj_expr s0 = sj_ex_sym(p, 0), e = sj_ex_mul(p, sj_ex_const(p, 2), s0);
    sj_guard_input ins[2] = {gi(SJ_F32, 1, DIMS(e)), gi(SJ_F32, 1, DIMS(s0))};
    sj_guard_set *gs = sj_guard_build(p, ins, 2, NULL, 0, XY, ENTRY);
    int64_t sv[1];
    sj_tensor in[2] = {tn(SJ_F32, 1, SHAPE(8)), tn(SJ_F32, 1, SHAPE(4))};
    expect_pass(gs, in, sv);
    assert_true(sv[0] == 4);
    in[0].shape[0] = 9;
    expect_fail(gs, in, sv, SJ_GUARD_SIZE, 0, 0, 8, 8, 9, "x", "input 'x' size mismatch at axis 0: expected 8, actual 9");
    char *txt = print_set(gs, "");
    assert_string_equal(txt, "x: f32, rank 1, host, contiguous\ny: f32, rank 1, host, contiguous\n"
                             "y.size(0) = s0 in [1, inf)\nx.size(0) == 2*s0\n");
    free(txt);
    sj_guard_free(gs);
    sj_exprs_destroy(p);
}

/* Symbols past 63 share one bit of the pool's masks: messages must still
 * list exactly the symbols a relation uses. */
static void test_many_symbols(void **state) {
    sj_exprs *p = sj_exprs_create();
    for (int i = 0; i < 70; i++) sj_sym_new(p, 10 + i, 1, SJ_EX_INF);
    sj_expr s1 = sj_ex_sym(p, 1), s64 = sj_ex_sym(p, 64), s65 = sj_ex_sym(p, 65);
    sj_guard_input ins[3] = {gi(SJ_F32, 1, DIMS(s1)), gi(SJ_F32, 1, DIMS(s64)), gi(SJ_F32, 1, DIMS(s65))};
    sj_fact f = fact(s64, SJ_REL_EQ, sj_ex_add(p, s65, s1), "w");
    sj_guard_set *gs = sj_guard_build(p, ins, 3, &f, 1, XY, ENTRY);
    int64_t sv[70] = {0};
    sj_tensor in[3] = {tn(SJ_F32, 1, SHAPE(2)), tn(SJ_F32, 1, SHAPE(7)), tn(SJ_F32, 1, SHAPE(5))};
    expect_pass(gs, in, sv);
    in[1].shape[0] = 6;
    expect_fail(gs, in, sv, SJ_GUARD_RELATION, -1, -1, 7, 7, 6, "",
                "relation failed: s64 == s1 + s65 with s1 = 2, s64 = 6, s65 = 5 (from w)");
    sj_guard_free(gs);
    sj_exprs_destroy(p);
}

/* -- Determinism ------------------------------------------------------- */

static void test_first_failure(void **state) {
    sj_exprs *p = sj_exprs_create();
    sj_sym_new(p, 8, 2, 100);
    sj_expr s0 = sj_ex_sym(p, 0);
    sj_guard_input ins[2] = {gi(SJ_F32, 2, DIMS(s0, sj_ex_const(p, 4))), gi(SJ_I32, 1, DIMS(s0))};
    sj_fact f = fact(sj_ex_mod(p, s0, sj_ex_const(p, 2)), SJ_REL_EQ, sj_ex_const(p, 0), "r");
    sj_guard_set *gs = sj_guard_build(p, ins, 2, &f, 1, XY, ENTRY);
    int64_t sv[1];
    /* out of range at axis 0, wrong size at axis 1, wrong dtype of y, odd */
    sj_tensor in[2] = {tn(SJ_F32, 2, SHAPE(101, 5)), tn(SJ_F16, 1, SHAPE(101))};
    for (int i = 0; i < 100; i++)
        expect_fail(gs, in, sv, SJ_GUARD_RANGE, 0, 0, 2, 100, 101, "x",
                    "input 'x' size at axis 0 out of range: expected [2, 100], actual 101");
    in[0].shape[0] = in[1].shape[0] = 7;
    expect_fail(gs, in, sv, SJ_GUARD_SIZE, 0, 1, 4, 4, 5, "x", "input 'x' size mismatch at axis 1: expected 4, actual 5");
    in[0].shape[1] = 4;
    in[0].stride[0] = 4;
    expect_fail(gs, in, sv, SJ_GUARD_DTYPE, 1, -1, SJ_I32, SJ_I32, SJ_F16, "y",
                "input 'y' dtype mismatch: expected i32, actual f16");
    in[1].dtype = SJ_I32;
    expect_fail(gs, in, sv, SJ_GUARD_DIVISIBLE, 0, 0, 2, 2, 7, "x", "input 'x' size at axis 0 not divisible by 2: actual 7 (from r)");
    in[0].stride[0] = 5; /* layout of x before the fact */
    expect_fail(gs, in, sv, SJ_GUARD_STRIDE, 0, 0, 4, 4, 5, "x",
                "input 'x' layout mismatch: expected contiguous, actual stride 5 at axis 0 (contiguous stride 4)");
    in[0].shape[0] = 101; /* ... and before its sizes */
    expect_fail(gs, in, sv, SJ_GUARD_STRIDE, 0, 0, 4, 4, 5, "x",
                "input 'x' layout mismatch: expected contiguous, actual stride 5 at axis 0 (contiguous stride 4)");
    in[0].dtype = SJ_BOOL; /* ... which come after its dtype */
    expect_fail(gs, in, sv, SJ_GUARD_DTYPE, 0, -1, SJ_F32, SJ_F32, SJ_BOOL, "x",
                "input 'x' dtype mismatch: expected f32, actual bool");
    sj_guard_free(gs);
    sj_exprs_destroy(p);
}

/* -- Threads ------------------------------------------------------------- */

typedef struct worker {
    const sj_guard_set *gs;
    int id, errors;
} worker;

static void *work(void *arg) {
    worker *w = arg;
    int64_t sv[2];
    sj_guard_failure f;
    char want[256];
    for (int i = 0; i < 20000; i++) {
        int64_t s0 = 2 * (w->id + 1) + 2 * (i % 7), s1 = 3 + w->id + i % 5;
        sj_tensor in[4] = {tn(SJ_F32, 2, SHAPE(s0, 64)), tn(SJ_F32, 3, SHAPE(1, s0, s1)),
                           tn(SJ_I64, 2, SHAPE(s0, s1)), tn(SJ_F32, 2, SHAPE(s1, 8))};
        if (!sj_guard_check(w->gs, in, sv, &f) || sv[0] != s0 || sv[1] != s1) w->errors++;
        in[0].shape[0] = in[1].shape[1] = in[2].shape[0] = s0 + 1; /* odd */
        in[0].stride[0] = 64, in[1].stride[0] = in[1].stride[2] * in[1].shape[2] * in[1].shape[1];
        in[2].stride[0] = s1;
        snprintf(want, sizeof want, "input 'x' size at axis 0 not divisible by 2: actual %" PRId64 " (from reshape)",
                 s0 + 1);
        if (sj_guard_check(w->gs, in, sv, &f) || f.kind != SJ_GUARD_DIVISIBLE || f.actual != s0 + 1 ||
            strcmp(f.message, want) != 0)
            w->errors++;
        in[0].shape[0] = in[1].shape[1] = in[2].shape[0] = s0;
        in[3].shape[0] = s1 + 1;
        snprintf(want, sizeof want,
                 "input 'w' size mismatch at axis 0: expected %" PRId64 " (equal to input 'y' axis 2), actual %" PRId64,
                 s1, s1 + 1);
        if (sj_guard_check(w->gs, in, sv, &f) || f.kind != SJ_GUARD_DUCK || f.input != 3 ||
            strcmp(f.message, want) != 0)
            w->errors++;
    }
    return NULL;
}

static void test_threads(void **state) {
    sj_exprs *p = sj_exprs_create();
    sj_sym_new(p, 8, 2, SJ_EX_INF);
    sj_sym_new(p, 5, 2, SJ_EX_INF);
    sj_expr s0 = sj_ex_sym(p, 0), s1 = sj_ex_sym(p, 1);
    sj_guard_input ins[4] = {gi(SJ_F32, 2, DIMS(s0, sj_ex_const(p, 64))),
                             gi(SJ_F32, 3, DIMS(sj_ex_const(p, 1), s0, s1)), gi(SJ_I64, 2, DIMS(s0, s1)),
                             gi(SJ_F32, 2, DIMS(s1, sj_ex_const(p, 8)))};
    sj_fact f = fact(sj_ex_mod(p, s0, sj_ex_const(p, 2)), SJ_REL_EQ, sj_ex_const(p, 0), "reshape");
    sj_guard_set *gs = sj_guard_build(p, ins, 4, &f, 1, XY, ENTRY);
    assert_non_null(gs);
    worker w[8];
    pthread_t th[8];
    for (int i = 0; i < 8; i++) {
        w[i] = (worker){gs, i, 0};
        assert_int_equal(pthread_create(&th[i], NULL, work, &w[i]), 0);
    }
    int errors = 0;
    for (int i = 0; i < 8; i++) {
        pthread_join(th[i], NULL);
        errors += w[i].errors;
    }
    assert_int_equal(errors, 0);
    sj_guard_free(gs);
    sj_exprs_destroy(p);
}

/* -- Printing ------------------------------------------------------------ */

static void test_print(void **state) {
    sj_exprs *p = sj_exprs_create();
    sj_sym_new(p, 8, 2, SJ_EX_INF);
    sj_sym_new(p, 5, 2, 16);
    sj_expr s0 = sj_ex_sym(p, 0), s1 = sj_ex_sym(p, 1);
    sj_guard_input ins[3] = {gi(SJ_F32, 3, DIMS(sj_ex_const(p, 1), s0, sj_ex_const(p, 768))),
                             gi(SJ_F16, 2, DIMS(s0, s1)), gi(SJ_BOOL, 0, NULL)};
    ins[1].device = SJ_CUDA;
    ins[1].contiguous = false;
    ins[1].stride[0] = 8, ins[1].stride[1] = 1;
    sj_fact facts[2] = {fact(sj_ex_mod(p, s0, sj_ex_const(p, 2)), SJ_REL_EQ, sj_ex_const(p, 0), "reshape(f32[s0, 768])"),
                        fact(s1, SJ_REL_LT, s0, "")};
    sj_guard_set *gs = sj_guard_build(p, ins, 3, facts, 2, XY, ENTRY);
    char *txt = print_set(gs, "  ");
    assert_string_equal(txt, "  x: f32, rank 3, host, contiguous\n"
                             "  x.size(0) == 1\n"
                             "  x.size(1) = s0 in [2, inf)\n"
                             "  x.size(2) == 768\n"
                             "  y: f16, rank 2, cuda, strides [8, 1]\n"
                             "  y.size(0) == s0\n"
                             "  y.size(1) = s1 in [2, 16]\n"
                             "  z: bool, rank 0, host, contiguous\n"
                             "  s0 % 2 == 0   (from reshape(f32[s0, 768]))\n"
                             "  s1 < s0\n");
    free(txt);
    sj_guard_free(gs);
    gs = sj_guard_build(p, ins, 2, facts, 0, NULL, ENTRY);
    txt = print_set(gs, NULL);
    assert_string_equal(txt, "input 0: f32, rank 3, host, contiguous\n"
                             "input 0.size(0) == 1\n"
                             "input 0.size(1) = s0 in [2, inf)\n"
                             "input 0.size(2) == 768\n"
                             "input 1: f16, rank 2, cuda, strides [8, 1]\n"
                             "input 1.size(0) == s0\n"
                             "input 1.size(1) = s1 in [2, 16]\n");
    free(txt);
    sj_guard_free(gs);
    sj_exprs_destroy(p);
}

/* -- Allocation failure -------------------------------------------------- */

static void test_alloc_failure(void **state) {
    sj_exprs *p = sj_exprs_create();
    sj_sym_new(p, 8, 2, SJ_EX_INF);
    sj_sym_new(p, 5, 2, SJ_EX_INF);
    sj_expr s0 = sj_ex_sym(p, 0), s1 = sj_ex_sym(p, 1), c0 = sj_ex_const(p, 0);
    sj_guard_input ins[2] = {gi(SJ_F32, 2, DIMS(s0, s1)), gi(SJ_F32, 1, DIMS(s1))};
    sj_fact facts[3] = {fact(sj_ex_mod(p, s0, sj_ex_const(p, 2)), SJ_REL_EQ, c0, "a"),
                        fact(sj_ex_mod(p, sj_ex_add(p, s0, s1), sj_ex_const(p, 3)), SJ_REL_EQ, c0, "b"),
                        fact(s0, SJ_REL_LT, s1, "c")};
    int64_t sv[2];
    sj_tensor in[2] = {tn(SJ_F32, 2, SHAPE(6, 3)), tn(SJ_F32, 1, SHAPE(3))};
    sj_guard_set *gs = NULL;
    long n = 0;
    for (; n < 100 && !gs; n++) { /* every failure point: NULL, nothing leaked (ASan) */
        sj_guard_fail_allocs_after(n);
        gs = sj_guard_build(p, ins, 2, facts, 3, XY, ENTRY);
    }
    sj_guard_fail_allocs_after(-1);
    assert_non_null(gs);
    assert_true(n > 5); /* the set, its tables and the fact texts */
    expect_fail(gs, in, sv, SJ_GUARD_RELATION, -1, -1, 3, 3, 6, "", "relation failed: s0 < s1 with s0 = 6, s1 = 3 (from c)");
    in[0] = tn(SJ_F32, 2, SHAPE(4, 5)), in[1] = tn(SJ_F32, 1, SHAPE(5));
    expect_pass(gs, in, sv);
    in[1].shape[0] = in[0].shape[1] = 6, in[0].stride[0] = 6;
    expect_fail(gs, in, sv, SJ_GUARD_DIVISIBLE, -1, -1, 3, 3, 10, "", "s0 + s1 not divisible by 3: actual 10 (from b)");
    sj_guard_free(gs);
    sj_exprs_destroy(p);
}

/* -- The memo's lock-free index ----------------------------------------------- */

/* Threads memoise signatures of their own while every thread looks up
 * everyone's: the index grows from 16 slots to 8192 under them. A lookup
 * finds each signature memoised before it began, with its own symbol
 * value, and never another key's item. The items are an owner's, bigger
 * than the head (as the engine's, jit/entry.h): each is made by its init
 * hook, its own part is written without touching the key, and the release
 * hook sees every one at destroy. */
enum { MEMO_THREADS = 8, MEMO_EACH = 500 };

typedef struct memo_item {
    sj_memo_head head;
    int64_t mark;      /* written by memo_item_init */
    char tail[13];     /* an odd size: the key after it stays aligned */
} memo_item;

static void memo_item_init(sj_memo_head *h) {
    memo_item *it = (memo_item *)h;
    it->mark = 0x5EED;
    memset(it->tail, 0x7F, sizeof it->tail);
}

static void memo_item_release(void *ctx, sj_memo_head *h) {
    memo_item *it = (memo_item *)h;
    if (it->mark == 0x5EED) ++*(int *)ctx;
}

static const sj_table_items memo_items = {
    .memo_size = sizeof(memo_item), .memo_init = memo_item_init, .memo_release = memo_item_release};

typedef struct memo_worker {
    sj_table *t;
    sj_guarded *e;
    int id, errors;
} memo_worker;

static int memo_sig(int id, int k, int64_t *sig) {
    sig[0] = id, sig[1] = k, sig[2] = (int64_t)k * 7919 + id;
    return 3 + (k % 3); /* keys of 3 to 5 words */
}

static int64_t memo_sym(int id, int k) { return (int64_t)id * 100000 + k; }

static void *memo_work(void *arg) {
    memo_worker *w = arg;
    int64_t sig[8] = {0};
    for (int k = 0; k < MEMO_EACH; k++) {
        int words = memo_sig(w->id, k, sig);
        int64_t sym = memo_sym(w->id, k);
        sj_memo_head *m = sj_table_memoize(w->t, sig, words, sj_sig_hash(sig, words), w->e, &sym);
        if (!m || m->syms[0] != sym || ((memo_item *)m)->mark != 0x5EED) w->errors++;
        if (m && (uintptr_t)m->key % sizeof(int64_t)) w->errors++;
        for (int j = 0; j <= k; j += 1 + k / 8) { /* mine so far: all there */
            words = memo_sig(w->id, j, sig);
            m = sj_table_find(w->t, sig, words, sj_sig_hash(sig, words));
            if (!m || m->syms[0] != memo_sym(w->id, j) || m->key_words != words) w->errors++;
        }
        int other = (w->id + 1 + k) % MEMO_THREADS; /* another's: absent or its own */
        words = memo_sig(other, k, sig);
        m = sj_table_find(w->t, sig, words, sj_sig_hash(sig, words));
        if (m && (m->syms[0] != memo_sym(other, k) || m->key_words != words)) w->errors++;
    }
    return NULL;
}

static void test_memo_index_threads(void **state) {
    sj_table t;
    int released = 0;
    assert_int_equal(sj_table_init(&t, &memo_items, &released), 0);
    sj_guarded e;
    memset(&e, 0, sizeof e);
    e.n_syms = 1;
    memo_worker w[MEMO_THREADS];
    pthread_t th[MEMO_THREADS];
    for (int i = 0; i < MEMO_THREADS; i++) {
        w[i] = (memo_worker){&t, &e, i, 0};
        assert_int_equal(pthread_create(&th[i], NULL, memo_work, &w[i]), 0);
    }
    for (int i = 0; i < MEMO_THREADS; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(w[i].errors, 0);
    }
    assert_int_equal(t.n_memo, MEMO_THREADS * MEMO_EACH);
    int64_t sig[8] = {0};
    for (int i = 0; i < MEMO_THREADS; i++)
        for (int k = 0; k < MEMO_EACH; k++) {
            int words = memo_sig(i, k, sig);
            sj_memo_head *m = sj_table_find(&t, sig, words, sj_sig_hash(sig, words));
            assert_non_null(m);
            assert_int_equal(m->syms[0], memo_sym(i, k));
            assert_ptr_equal(m->entry, &e);
            /* the owner's part is its own: writing it leaves the key whole */
            memset(((memo_item *)m)->tail, 0, sizeof ((memo_item *)m)->tail);
            assert_ptr_equal(sj_table_find(&t, sig, words, sj_sig_hash(sig, words)), m);
            /* memoising it again returns the same item */
            int64_t other = -1;
            assert_ptr_equal(sj_table_memoize(&t, sig, words, sj_sig_hash(sig, words), &e, &other), m);
        }
    int words = memo_sig(MEMO_THREADS, 0, sig); /* never memoised */
    assert_null(sj_table_find(&t, sig, words, sj_sig_hash(sig, words)));
    words = memo_sig(0, 0, sig);
    assert_null(sj_table_find(&t, sig, words - 1, sj_sig_hash(sig, words - 1))); /* a prefix is another key */
    /* up to SJ_MEMO_MAX items, then NULL: the call is served unmemoised */
    for (int k = 0; t.n_memo < SJ_MEMO_MAX; k++) {
        words = memo_sig(MEMO_THREADS + 1, k, sig);
        int64_t sym = k;
        assert_non_null(sj_table_memoize(&t, sig, words, sj_sig_hash(sig, words), &e, &sym));
    }
    words = memo_sig(MEMO_THREADS + 2, 0, sig);
    int64_t sym = 0;
    assert_null(sj_table_memoize(&t, sig, words, sj_sig_hash(sig, words), &e, &sym));
    assert_null(sj_table_find(&t, sig, words, sj_sig_hash(sig, words)));
    int made = t.n_memo;
    sj_table_destroy(&t);
    assert_int_equal(released, made);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kind_names),      cmocka_unit_test(test_build_edges),
        cmocka_unit_test(test_pass_binds),      cmocka_unit_test(test_meta_failures),
        cmocka_unit_test(test_size_and_duck),   cmocka_unit_test(test_ranges),
        cmocka_unit_test(test_contiguity),      cmocka_unit_test(test_exact_strides),
        cmocka_unit_test(test_relations),       cmocka_unit_test(test_divisible_input),
        cmocka_unit_test(test_divisible_compound), cmocka_unit_test(test_const_facts),
        cmocka_unit_test(test_size_expressions), cmocka_unit_test(test_many_symbols),
        cmocka_unit_test(test_first_failure),   cmocka_unit_test(test_threads),
        cmocka_unit_test(test_print),           cmocka_unit_test(test_alloc_failure),
        cmocka_unit_test(test_memo_index_threads),
    };
    return cmocka_run_group_tests_name("guards", tests, NULL, NULL);
}
