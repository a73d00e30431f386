/* Eager CPU kernels against float64 references on random inputs: every op,
 * every dtype it takes, broadcast and strided layouts, edge sizes, and the
 * half conversions and f32 approximations the kernels are built on.
 * Every output is poisoned before the kernel runs, so an element the kernel
 * never wrote fails the check. The operands, references and case lists are
 * shared with test_cuda_eager (tests/util_eager.c). */
/* cmocka.h needs these first, in this order */
/* clang-format off */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
/* clang-format on */

#include <cblas.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "kernels/cpu/threads.h"
#include "kernels/cpu/cpu_int.h"
#include "kernels/cpu/eager.h"
#include "base/half.h"
#include "tests/util.h"

#define S(...) ((const int64_t[]){__VA_ARGS__})
#define NELEM(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* -- Helpers -------------------------------------------------------------- */

/* The kernel threads matmul and attention are given (test_split sets it). */
static sj_threads *pool;

/* Reference values and magnitudes (for tu_check_mag). */
static double *ref(int64_t n) { return tu_refbuf(0, n); }
static double *mag(int64_t n) { return tu_refbuf(1, n); }

#define label tu_label

enum { L_CONTIG = TU_CONTIG, L_GAP = TU_GAP, L_REV = TU_REV, L_REVGAP = TU_REVGAP, L_COUNT };
#define make tu_tensor_layout

#define rnd tu_random

/* y matches r within tol, and nothing around y's elements was written. */
static void expect(const sj_tensor *y, const double *r, const double *mg, double tol,
                   const char *what) {
    assert_true(tu_check_mag(y, r, mg, tol, what));
    assert_true(tu_check_gaps(y, what));
}

/* -- Half conversions ----------------------------------------------------- */

static void test_half(void **state) {
    for (uint32_t h = 0; h < 65536; h++) {
        float f = sj_f16_to_f32((uint16_t)h);
        double want = tu_f16_value((uint16_t)h);
        if (isnan(want)) {
            assert_true(isnan(f));
            assert_true((sj_f32_to_f16(f) & 0x7e00) == 0x7e00); /* quiet NaN */
        } else {
            assert_true((double)f == want);
            assert_int_equal(sj_f32_to_f16(f), h); /* round trip */
        }
        float b = sj_bf16_to_f32((uint16_t)h);
        if (isnan(b))
            assert_true(isnan(sj_bf16_to_f32(sj_f32_to_bf16(b))));
        else
            assert_int_equal(sj_f32_to_bf16(b), h);
    }
    /* f32 -> f16/bf16 against the frexp-based encoders over a sweep */
    for (uint64_t u = 0; u < 0x100000000u; u += 4099) {
        uint32_t x = (uint32_t)u;
        float f;
        memcpy(&f, &x, 4);
        if (isnan(f)) {
            assert_true(isnan(sj_f16_to_f32(sj_f32_to_f16(f))));
            assert_true(isnan(sj_bf16_to_f32(sj_f32_to_bf16(f))));
            continue;
        }
        assert_int_equal(sj_f32_to_f16(f), tu_f16_bits(f));
        assert_int_equal(sj_f32_to_bf16(f), tu_bf16_bits(f));
    }
    /* ties to even, overflow, subnormals, signed zero */
    const float hin[] = {1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f,
                         65504.0f,        65519.99f,
                         65520.0f,        1e10f,
                         -1e10f,          0x1p-24f,
                         0x1p-25f,        0x1.8p-25f,
                         0x1.8p-24f,      0x1p-14f - 0x1p-26f,
                         -0.0f,           INFINITY,
                         -INFINITY,       1e-30f,
                         -1e-30f};
    const uint16_t hout[] = {0x3c00, 0x3c02, 0x7bff, 0x7bff, 0x7c00, 0x7c00, 0xfc00, 0x0001, 0x0000,
                             0x0001, 0x0002, 0x0400, 0x8000, 0x7c00, 0xfc00, 0x0000, 0x8000};
    for (int i = 0; i < NELEM(hin); i++) assert_int_equal(sj_f32_to_f16(hin[i]), hout[i]);
    const float bin[] = {1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, 3.4028235e38f,
                         -0.0f,          INFINITY,           0x1p-133f};
    const uint16_t bout[] = {0x3f80, 0x3f82, 0x7f80, 0x8000, 0x7f80, 0x0001};
    for (int i = 0; i < NELEM(bin); i++) assert_int_equal(sj_f32_to_bf16(bin[i]), bout[i]);
    /* NaN payloads that would truncate to inf stay NaN */
    uint32_t nanbits[] = {0x7f800001u, 0xff800001u, 0x7fc00000u, 0x7f802000u};
    for (int i = 0; i < NELEM(nanbits); i++) {
        float f;
        memcpy(&f, &nanbits[i], 4);
        assert_true(isnan(sj_f16_to_f32(sj_f32_to_f16(f))));
        assert_true(isnan(sj_bf16_to_f32(sj_f32_to_bf16(f))));
    }
}

/* -- f32 approximations --------------------------------------------------- */

typedef struct approx {
    const char *name;
    float (*f)(float);
    double (*ref)(double);
    double rel, abs; /* bounds: relative (|ref| >= 1e-30), or absolute */
} approx;

static double d_sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }
static double d_gelu(double x) { return tu_ref_unary1(SJ_OP_GELU, x); }
static double d_gelu_tanh(double x) { return tu_ref_unary1(SJ_OP_GELU_TANH, x); }

static void test_approximations(void **state) {
    /* gelu/gelu_tanh: 0.5 x (1 + f) cancels for negative x, so their bound
     * is on |err| / max(|ref|, 1) */
    approx ap[] = {
        {"exp", cpu_expf, exp, 2e-7, 0},      {"tanh", cpu_tanhf, tanh, 2e-7, 0},
        {"erf", cpu_erff, erf, 0, 1.5e-7},    {"sigmoid", cpu_sigmoidf, d_sigmoid, 2e-7, 0},
        {"gelu", cpu_geluf, d_gelu, 0, 3e-7}, {"gelu_tanh", cpu_gelu_tanhf, d_gelu_tanh, 0, 4e-7},
    };
    for (int a = 0; a < NELEM(ap); a++) {
        double worst = 0;
        float at = 0;
        for (uint64_t u = 0; u < 0x100000000u; u += 1021) {
            uint32_t bits = (uint32_t)u;
            float x;
            memcpy(&x, &bits, 4);
            if (isnan(x))
                continue;
            double r = ap[a].ref(x), y = ap[a].f(x);
            if (isinf(r) || fabs(r) > 3.4028234663852886e38) {
                assert_true(isinf(y) && (y > 0) == (r > 0));
                continue;
            }
            double err = ap[a].rel ? (fabs(r) >= 1e-30 ? fabs(y - r) / fabs(r) : fabs(y - r) * 1e30)
                                   : fabs(y - r) / (fabs(r) > 1 ? fabs(r) : 1);
            if (!(err <= worst)) {
                worst = err;
                at = x;
            }
        }
        print_message("  %-9s max %s error %.3g at x = %.9g\n", ap[a].name,
                      ap[a].rel ? "relative" : "abs/max(|ref|,1)", worst, (double)at);
        assert_true(worst <= (ap[a].rel ? ap[a].rel : ap[a].abs));
        assert_true(isnan(ap[a].f(NAN)));
    }
    /* gelu keeps its small negative results: relative error for x in
     * [-6, 0), where 0.5 x (1 + erf) would cancel to 1e-1 relative */
    double worst = 0;
    for (float x = -6.0f; x < 0.0f; x += 0x1p-12f) {
        double r = d_gelu(x);
        double err = fabs(cpu_geluf(x) - r) / fabs(r);
        worst = err > worst ? err : worst;
    }
    print_message("  gelu      max relative error %.3g on [-6, 0)\n", worst);
    assert_true(worst < 2e-6);
    assert_true(cpu_expf(INFINITY) == INFINITY && cpu_expf(-INFINITY) == 0.0f);
    assert_true(cpu_expf(89.0f) == INFINITY && cpu_expf(-104.0f) == 0.0f);
    assert_true(cpu_expf(-100.0f) > 0.0f); /* subnormal, not flushed */
    /* sigmoid flushes below x = -88 (true value < 6.1e-39) to exactly 0 */
    assert_true(cpu_sigmoidf(-INFINITY) == 0.0f && cpu_sigmoidf(-88.5f) == 0.0f && cpu_sigmoidf(-87.0f) > 0.0f);
    assert_true(cpu_sigmoidf(INFINITY) == 1.0f && isnan(cpu_sigmoidf(NAN)));
    assert_true(cpu_tanhf(INFINITY) == 1.0f && cpu_tanhf(-INFINITY) == -1.0f);
    assert_true(cpu_erff(INFINITY) == 1.0f && cpu_erff(-INFINITY) == -1.0f);
    assert_true(cpu_tanhf(-0.0f) == 0.0f && signbit(cpu_tanhf(-0.0f)));

    /* softmax's exp of x - max <= 0: every float in [-87.33, 0], against
     * exp; below that flushed to 0 */
    worst = 0;
    for (uint32_t bits = 0x80000000u; bits <= 0xC2AEA8F6u; bits += 7) { /* -0 .. -87.33 */
        float x;
        memcpy(&x, &bits, 4);
        double r = exp((double)x), err = fabs(sj_rt_exp_shifted(x) - r) / r;
        worst = err > worst ? err : worst;
    }
    print_message("  exp_shifted max relative error %.3g on [-87.33, 0]\n", worst);
    assert_true(worst <= 2e-7);
    assert_true(sj_rt_exp_shifted(0.0f) == 1.0f && sj_rt_exp_shifted(-87.4f) == 0.0f);
    assert_true(sj_rt_exp_shifted(-1e4f) == 0.0f && sj_rt_exp_shifted(-INFINITY) == 0.0f);
    assert_true(isnan(sj_rt_exp_shifted(NAN)));
}

/* The vectorised max, at this build's vector width (test_backend_cpu
 * checks the generated kernels' width). */
static float max_here(const float *x, int64_t n) { return sj_rt_max_f32(x, n); }
static void test_max_f32(void **state) { tu_check_max_f32(max_here, "the tests' build"); }

/* -- Unary ---------------------------------------------------------------- */

static void run_unary(sj_op op, sj_dtype dt, int rank, const int64_t *shape, int lx, int ly) {
    sj_tensor x = make(dt, rank, shape, lx), y = make(dt, rank, shape, ly);
    tu_fill_unary_input(op, &x);
    double *r = ref(tu_numel(&y));
    tu_ref_unary(op, &x, r);
    assert_int_equal(sj_cpu_unary(op, &x, &y), SJ_OK);
    expect(&y, r, NULL, tu_tol(dt),
           label("unary %d dtype %d rank %d lay %d/%d", op, dt, rank, lx, ly));
}

static void test_unary(void **state) { tu_unary_cases(false, run_unary); }

static void test_unary_specials(void **state) {
    int64_t n = NELEM(tu_special_values);
    sj_tensor x = tu_special_tensor();
    for (int o = 0; o < NELEM(tu_unary_ops); o++) {
        sj_tensor y = tu_tensor(SJ_F32, 1, &n);
        double *r = ref(n);
        tu_ref_unary(tu_unary_ops[o], &x, r);
        assert_int_equal(sj_cpu_unary(tu_unary_ops[o], &x, &y), SJ_OK);
        /* |err| <= 1e-6 max(|ref|, 1) (the gelus cancel for negative x);
         * overflow to inf where the f32 result overflows */
        for (int64_t i = 0; i < n; i++) {
            double got = tu_get(&y, i), w = tu_round(SJ_F32, r[i]);
            int ok = tu_special_ok(got, w);
            if (!ok)
                fprintf(stderr, "op %d x %g: %.9g, want %.9g\n", tu_unary_ops[o], tu_special_values[i], got, w);
            assert_true(ok);
        }
    }
}

/* -- Binary and comparisons ----------------------------------------------- */

/* a and b of their own shapes broadcast to y's, laid out as given. */
static void run_binary(sj_op op, sj_dtype dt, int rank, const int64_t *ys, int ra,
                       const int64_t *as, int la, int rb, const int64_t *bs, int lb, int ly) {
    sj_tensor a0 = rnd(dt, ra, as, la), b0 = rnd(dt, rb, bs, lb);
    sj_tensor a = tu_broadcast(&a0, rank, ys), b = tu_broadcast(&b0, rank, ys);
    sj_tensor y = make(tu_is_cmp(op) ? SJ_BOOL : dt, rank, ys, ly);
    double *r = ref(tu_numel(&y));
    tu_ref_binary(op, &a, &b, r);
    assert_int_equal(sj_cpu_binary(op, &a, &b, &y), SJ_OK);
    expect(&y, r, NULL, tu_is_cmp(op) ? 0 : tu_tol(dt),
           label("binary %d dtype %d rank %d", op, dt, rank));
}

static void test_binary(void **state) {
    tu_binary_cases(false, run_binary);
    /* pow on floats with a positive base over a wider range */
    for (int d = 0; d < NELEM(tu_floats); d++) {
        sj_tensor a, b, y = make(tu_floats[d], 1, S(50), L_CONTIG);
        double *r = tu_pow_operands(tu_floats[d], &a, &b);
        assert_int_equal(sj_cpu_binary(SJ_OP_POW, &a, &b, &y), SJ_OK);
        assert_true(tu_check(&y, r, tu_tol(tu_floats[d]), "pow positive base"));
    }
}

/* y = op(a, b) on given integers; checked against explicit expectations. */
static void run_ints(sj_op op, sj_dtype dt, int64_t n, const int64_t *av, const int64_t *bv,
                     const int64_t *want) {
    sj_tensor a = tu_tensor(dt, 1, &n), b = tu_tensor(dt, 1, &n), y = tu_tensor(dt, 1, &n);
    tu_seti_all(&a, av);
    tu_seti_all(&b, bv);
    assert_int_equal(sj_cpu_binary(op, &a, &b, &y), SJ_OK);
    for (int64_t i = 0; i < n; i++) {
        if (tu_geti(&y, i) != want[i])
            fprintf(stderr, "op %d dtype %d: %lld, %lld -> %lld, want %lld\n", op, dt,
                    (long long)av[i], (long long)bv[i], (long long)tu_geti(&y, i),
                    (long long)want[i]);
        assert_true(tu_geti(&y, i) == want[i]);
        assert_true(tu_ref_binary1_i(op, av[i], bv[i]) == want[i] || dt == SJ_I32);
    }
}

static void test_int_semantics(void **state) {
    for (int d = 3; d < 5; d++) {
        sj_dtype dt = tu_numeric[d];
        int64_t mn = dt == SJ_I32 ? INT32_MIN : INT64_MIN;
        tu_int_cases(dt, run_ints);
        /* neg/abs of the minimum wrap to the minimum */
        int64_t n = 3;
        sj_tensor x = tu_tensor(dt, 1, &n), y = tu_tensor(dt, 1, &n);
        tu_seti_all(&x, S(mn, -4, 4));
        assert_int_equal(sj_cpu_unary(SJ_OP_NEG, &x, &y), SJ_OK);
        assert_true(tu_geti(&y, 0) == mn && tu_geti(&y, 1) == 4 && tu_geti(&y, 2) == -4);
        tu_poison(&y);
        assert_int_equal(sj_cpu_unary(SJ_OP_ABS, &x, &y), SJ_OK);
        assert_true(tu_geti(&y, 0) == mn && tu_geti(&y, 1) == 4 && tu_geti(&y, 2) == 4);
    }
    /* i32 pow wraps like 32-bit arithmetic: 3^21 mod 2^32 */
    run_ints(SJ_OP_POW, SJ_I32, 1, S(3), S(21), S(1870418611));
}

static void run_nan(sj_op op, sj_dtype dt, const sj_tensor *a, const sj_tensor *s, int side, const double *rf) {
    sj_tensor b = tu_broadcast(s, 1, a->shape);
    sj_tensor y = tu_tensor(tu_is_cmp(op) ? SJ_BOOL : dt, 1, a->shape);
    const sj_tensor *l = side ? &b : a, *r = side ? a : &b;
    assert_int_equal(sj_cpu_binary(op, l, r, &y), SJ_OK);
    assert_true(tu_check(&y, rf, tu_is_cmp(op) ? 0 : tu_tol(dt), "nan binary"));
}

static void test_nan_binary(void **state) {
    /* NaN on either side, through the fast paths (contiguous and scalar)
     * and the chunked one (f16) */
    tu_nan_binary_cases(run_nan);
}

/* -- Where ---------------------------------------------------------------- */

static void test_where(void **state) {
    for (int d = 0; d < NELEM(tu_all); d++) {
        for (int c = 0; c < 4; c++) {
            sj_tensor st[3], v[3];
            int ly;
            double *r = tu_where_case(tu_all[d], c, L_REV, st, v, &ly);
            sj_tensor y = make(tu_all[d], 2, S(5, 70), ly);
            assert_int_equal(sj_cpu_where(&v[0], &v[1], &v[2], &y), SJ_OK);
            expect(&y, r, NULL, 0, label("where dtype %d case %d", tu_all[d], c));
        }
        sj_tensor e = make(tu_all[d], 2, S(0, 3), L_CONTIG), ec = make(SJ_BOOL, 2, S(0, 3), L_CONTIG);
        assert_int_equal(sj_cpu_where(&ec, &e, &e, &e), SJ_OK);
    }
}

/* -- Copy and cast -------------------------------------------------------- */

static void test_cast(void **state) {
    for (int f = 0; f < NELEM(tu_all); f++)
        for (int t = 0; t < NELEM(tu_all); t++)
            for (int lay = 0; lay < L_COUNT; lay++) {
                const int64_t *shape = S(3, 4, 45);
                sj_tensor x = make(tu_all[f], 3, shape, lay), y = make(tu_all[t], 3, shape, 3 - lay);
                tu_fill_cast_input(&x);
                double *r = ref(tu_numel(&y));
                tu_ref_cast(&x, tu_all[t], r);
                assert_int_equal(sj_cpu_copy(&x, &y), SJ_OK);
                expect(&y, r, NULL, 0, label("cast %d -> %d layout %d", tu_all[f], tu_all[t], lay));
            }
    /* special values: truncation, saturation, NaN, != 0 */
    for (int f = 0; f < 3; f++) {
        sj_tensor x = tu_cast_specials(tu_floats[f]);
        int64_t n = tu_numel(&x);
        for (int t = 0; t < NELEM(tu_all); t++) {
            sj_tensor y = tu_tensor(tu_all[t], 1, &n);
            double *r = ref(n);
            tu_ref_cast(&x, tu_all[t], r);
            assert_int_equal(sj_cpu_copy(&x, &y), SJ_OK);
            assert_true(tu_check(&y, r, 0, label("cast specials %d -> %d", tu_floats[f], tu_all[t])));
        }
    }
    /* i64 -> i32 wraps; big ints -> f16 overflow to inf; -> bool */
    sj_tensor x = tu_cast_int_specials();
    for (int t = 0; t < NELEM(tu_all); t++) {
        sj_tensor y = tu_tensor(tu_all[t], 1, S(6));
        double *r = ref(6);
        tu_ref_cast(&x, tu_all[t], r);
        assert_int_equal(sj_cpu_copy(&x, &y), SJ_OK);
        assert_true(tu_check(&y, r, 0, label("cast i64 specials -> %d", tu_all[t])));
    }
    /* a broadcast (stride 0) source, and rank 0 */
    sj_tensor s = tu_tensor(SJ_F16, 0, NULL), y = tu_tensor(SJ_F32, 2, S(3, 3));
    tu_set(&s, 0, 1.5);
    sj_tensor sb = tu_broadcast(&s, 2, S(3, 3));
    assert_int_equal(sj_cpu_copy(&sb, &y), SJ_OK);
    for (int i = 0; i < 9; i++) assert_true(tu_get(&y, i) == 1.5);
}

static void copy_cpu(const sj_tensor *x0, const sj_tensor *x, const sj_tensor *y, const char *what) {
    assert_int_equal(sj_cpu_copy(x, y), SJ_OK);
}

static void test_copy_transposed(void **state) {
    /* x is a transposed view (unit stride across rows): the tiled path */
    tu_transposed_copy_cases(copy_cpu);
}

/* -- Reductions ----------------------------------------------------------- */

static void run_reduce(sj_op op, sj_dtype dt, int rank, const int64_t *shape, int axis, int lx,
                       int ly) {
    int64_t ys[SJ_MAX_RANK];
    int ax = tu_reduce_shape(rank, shape, axis, ys);
    sj_tensor x = rnd(dt, rank, shape, lx), y = make(dt, rank, ys, ly);
    double *r = ref(tu_numel(&y));
    tu_ref_reduce(op, &x, ax, r);
    assert_int_equal(sj_cpu_reduce(op, &x, axis, &y), SJ_OK);
    expect(&y, r, NULL, tu_tol(dt),
           label("reduce %d dtype %d axis %d layout %d", op, dt, axis, lx));
}

static void test_reduce(void **state) {
    tu_reduce_cases(false, run_reduce);
    /* amax propagates NaN; mean of an empty axis is NaN */
    sj_tensor x = rnd(SJ_F32, 2, S(3, 40), L_CONTIG), y = tu_tensor(SJ_F32, 2, S(3, 1));
    tu_set(&x, 45, NAN);
    assert_int_equal(sj_cpu_reduce(SJ_OP_AMAX, &x, 1, &y), SJ_OK);
    assert_true(!isnan(tu_get(&y, 0)) && isnan(tu_get(&y, 1)) && !isnan(tu_get(&y, 2)));
    /* the same over axis 0, whose rows are accumulated together */
    for (int d = 0; d < NELEM(tu_floats); d++) {
        sj_tensor xb = rnd(tu_floats[d], 2, S(40, 3), L_CONTIG), yb = tu_tensor(tu_floats[d], 2, S(1, 3));
        tu_set(&xb, 7 * 3 + 1, NAN);
        assert_int_equal(sj_cpu_reduce(SJ_OP_AMAX, &xb, 0, &yb), SJ_OK);
        assert_true(!isnan(tu_get(&yb, 0)) && isnan(tu_get(&yb, 1)) && !isnan(tu_get(&yb, 2)));
    }
    sj_tensor m = tu_tensor(SJ_F16, 1, S(1)), e16 = tu_tensor(SJ_F16, 1, S(0));
    assert_int_equal(sj_cpu_reduce(SJ_OP_MEAN, &e16, 0, &m), SJ_OK);
    assert_true(isnan(tu_get(&m, 0)) && !tu_is_poison(&m, 0));
}

/* -- Softmax and norms ---------------------------------------------------- */

static void run_softmax(sj_dtype dt, int rank, const int64_t *shape, int axis, int lx, int ly,
                        int special) {
    sj_tensor x = rnd(dt, rank, shape, lx), y = make(dt, rank, shape, ly);
    if (special)
        tu_softmax_specials(&x);
    double *r = ref(tu_numel(&x));
    tu_ref_softmax(&x, axis, r);
    assert_int_equal(sj_cpu_softmax(&x, axis, &y), SJ_OK);
    expect(&y, r, NULL, tu_tol(dt), label("softmax dtype %d axis %d lay %d/%d", dt, axis, lx, ly));
}

static void test_softmax(void **state) { tu_softmax_cases(false, run_softmax); }

static void run_norm(int rms, sj_dtype dt, int rank, const int64_t *shape, int lx, int ly,
                     int with_g, int with_b) {
    sj_tensor x, g, b, y = make(dt, rank, shape, ly);
    double *r = tu_norm_operands(rms, dt, rank, shape, lx, &x, &g, &b, with_g, with_b), eps = 1e-5;
    const sj_tensor *gp = with_g ? &g : NULL, *bp = with_b ? &b : NULL;
    assert_int_equal(
        rms ? sj_cpu_rms_norm(&x, gp, eps, &y) : sj_cpu_layer_norm(&x, gp, bp, eps, &y), SJ_OK);
    expect(&y, r, NULL, tu_tol(dt),
           label("norm rms=%d dtype %d g %d b %d lay %d", rms, dt, with_g, with_b, lx));
}

static void test_norms(void **state) { tu_norm_cases(false, run_norm); }

/* Layer norm of rows whose mean is large against their spread (4000 +
 * U(-1, 1): the mean's f32 rounding, up to 1.2e-4, is a hundred times the
 * tolerance once scaled by rstd). The per-element pass works in f32 with
 * the mean split in two floats; a kernel that dropped the low part would
 * fail here. */
static void test_layer_norm_offset(void **state) {
    for (int rows = 1; rows <= 7; rows += 3) {
        int64_t shape[2] = {rows, 300}, n = 300;
        sj_tensor x = tu_random(SJ_F32, 2, shape, L_CONTIG), g = tu_random(SJ_F32, 1, &n, L_CONTIG),
                  b = tu_random(SJ_F32, 1, &n, L_CONTIG), y = make(SJ_F32, 2, shape, L_CONTIG);
        for (int64_t i = 0; i < tu_numel(&x); i++) tu_set(&x, i, 4000.0 + tu_get(&x, i));
        double *r = tu_refbuf(0, tu_numel(&x));
        tu_ref_layer_norm(&x, &g, &b, 1e-5, r);
        assert_int_equal(sj_cpu_layer_norm(&x, &g, &b, 1e-5, &y), SJ_OK);
        expect(&y, r, NULL, tu_tol(SJ_F32), label("layer norm offset rows %d", rows));
    }
}

/* -- Matmul --------------------------------------------------------------- */

/* test_matmul_bias: float products get a bias [N] (strided when N is odd) */
static int with_bias;

/* a [..., M, K] (la: layout of the matrix axes; ta: stored transposed),
 * b likewise, with batch shapes ab/bb broadcast to yb. */
static void run_matmul(sj_dtype dt, int nb, const int64_t *yb, const int64_t *ab, const int64_t *bb,
                       int64_t M, int64_t K, int64_t N, int la, int ta, int lb, int tb, int ly,
                       int ty) {
    tu_mm_shapes s;
    tu_matmul_shapes(&s, nb, yb, ab, bb, M, K, N, ta, tb, ty);
    sj_tensor a0 = rnd(dt, s.rank, s.a, la), b0 = rnd(dt, s.rank, s.b, lb), y = make(dt, s.rank, s.y, ly);
    a0 = tu_matmul_view(&a0, nb, ta); /* stored transposed: column-major */
    b0 = tu_matmul_view(&b0, nb, tb);
    y = tu_matmul_view(&y, nb, ty);
    sj_tensor a = tu_broadcast(&a0, s.rank, s.af), b = tu_broadcast(&b0, s.rank, s.bf);
    double *rf = ref(tu_numel(&y)), *mg = mag(tu_numel(&y));
    tu_ref_matmul(&a, &b, rf, mg);
    sj_tensor bias = {0};
    int biased = with_bias && (dt == SJ_F32 || dt == SJ_F16 || dt == SJ_BF16);
    if (biased) {
        bias = rnd(dt, 1, S(N), N % 2 ? L_GAP : L_CONTIG);
        for (int64_t i = 0; i < tu_numel(&y); i++) {
            rf[i] += tu_get(&bias, i % N);
            mg[i] += fabs(tu_get(&bias, i % N));
        }
    }
    assert_int_equal(sj_cpu_matmul_bias(&a, &b, biased ? &bias : NULL, &y, pool), SJ_OK);
    expect(&y, rf, mg, tu_tol(dt),
           label("matmul dtype %d M %lld K %lld N %lld lay %d%d%d%d%d%d bias %d", dt, (long long)M,
                 (long long)K, (long long)N, la, ta, lb, tb, ly, ty, biased));
}

static void test_matmul(void **state) {
    tu_matmul_cases(false, run_matmul);
    /* integer products past 2^31 are exact in i64 and wrap in i32 */
    for (int d = 3; d < 5; d++) {
        sj_tensor a, b, y;
        int64_t want = tu_matmul_wrap_case(tu_numeric[d], &a, &b, &y);
        assert_int_equal(sj_cpu_matmul(&a, &b, &y, NULL), SJ_OK);
        assert_true(tu_geti(&y, 0) == want);
    }
}

/* The same products plus a bias on every row (a fused plan's product and
 * its bias add), in every layout of the result. */
static void test_matmul_bias(void **state) {
    with_bias = 1;
    tu_matmul_cases(false, run_matmul);
    with_bias = 0;
}

/* -- Attention ------------------------------------------------------------ */

static void run_attention(sj_dtype dt, int64_t B, int64_t H, int64_t Sq, int64_t Sk, int64_t D,
                          int64_t Dv, const int64_t *lens, sj_dtype ldt, int causal, int lay) {
    tu_attention a;
    tu_attention_case(&a, dt, B, H, Sq, Sk, D, Dv, lens, ldt, L_CONTIG, causal, lay);
    assert_int_equal(sj_cpu_attention(&a.q, &a.k, &a.v, a.lp, a.scale, causal, &a.y, pool), SJ_OK);
    expect(&a.y, a.ref, a.mag, tu_tol(dt),
           label("attention dtype %d Sq %lld Sk %lld causal %d lens %d lay %d", dt, (long long)Sq,
                 (long long)Sk, causal, lens != NULL, lay));
}

static void test_attention(void **state) { tu_attention_cases(false, run_attention); }

/* Products and attentions big enough to be split over 4 kernel threads
 * (OpenBLAS single-threaded, as the runtime sets it up): columns, rows, a
 * last part shorter than the others, every transpose combination, outputs
 * in place and through scratch (f16), batches; then the small cases, which
 * must run unsplit and still right. */
static void test_split(void **state) {
    int blas = openblas_get_num_threads();
    openblas_set_num_threads(1);
    assert_non_null(pool = sj_threads_create(4));
    uint64_t before = sj_cpu_split_count();
    const int64_t mkn[][3] = {{37, 100, 150}, {150, 100, 37}, {301, 64, 70}, {16, 2048, 20}};
    const sj_dtype dts[] = {SJ_F32, SJ_F16};
    int runs = 0;
    for (int d = 0; d < NELEM(dts); d++)
        for (int c = 0; c < NELEM(mkn); c++) {
            int64_t M = mkn[c][0], K = mkn[c][1], N = mkn[c][2];
            tu_matmul_transposes(run_matmul, dts[d], M, K, N);
            run_matmul(dts[d], 1, S(3), S(3), S(3), M, K, N, 0, 0, 0, 0, 0, 0);
            run_matmul(dts[d], 1, S(2), S(2), S(1), M, K, N, 0, 0, 0, 0, 0, 0); /* b shared */
            runs += 16 + 3 + 1; /* 16 transposes; a batch of 3; with b shared, one product of 2M rows */
        }
    /* with a bias: each part adds its own columns' (split by columns) or
     * the whole bias to its rows (split by rows), in every result layout */
    with_bias = 1;
    for (int c = 0; c < NELEM(mkn); c++) {
        tu_matmul_transposes(run_matmul, SJ_F32, mkn[c][0], mkn[c][1], mkn[c][2]);
        runs += 16;
    }
    tu_matmul_transposes(run_matmul, SJ_BF16, 37, 100, 150);
    runs += 16;
    with_bias = 0;
    /* batches of small products, shared out whole: full, broadcast a, ints */
    run_matmul(SJ_F32, 2, S(4, 6), S(4, 6), S(4, 6), 20, 64, 30, 0, 0, 0, 0, 0, 0);
    /* (each batch at least twice the pool's minimum of work per thread) */
    run_matmul(SJ_F32, 2, S(6, 5), S(1, 5), S(6, 5), 9, 70, 33, TU_GAP, 1, 0, 0, TU_REVGAP, 0);
    run_matmul(SJ_BF16, 1, S(80), S(80), S(80), 7, 50, 23, 0, 0, 0, 1, 0, 0);
    run_matmul(SJ_I32, 1, S(80), S(80), S(80), 6, 40, 30, 0, 0, 0, 0, 0, 0);
    runs += 4;
    assert_true(sj_cpu_split_count() - before == (uint64_t)runs);
    before = sj_cpu_split_count();
    for (int causal = 0; causal < 2; causal++)
        for (int lay = 0; lay < 4; lay++)
            run_attention(SJ_F32, 2, 6, 70, 90, 64, 48, S(50, 90), SJ_I32, causal, lay);
    run_attention(SJ_BF16, 3, 4, 40, 33, 128, 64, NULL, SJ_I32, 1, 0);
    assert_true(sj_cpu_split_count() - before == 9);
    before = sj_cpu_split_count();
    tu_matmul_cases(false, run_matmul);
    tu_attention_cases(false, run_attention);
    assert_true(sj_cpu_split_count() == before);
    sj_threads_destroy(pool);
    pool = NULL;
    openblas_set_num_threads(blas);
}

/* -- Concat and gather ---------------------------------------------------- */

static void run_concat(sj_dtype dt, int axis, int lay, const sj_tensor *xs, const int64_t *ys, const double *r) {
    sj_tensor y = make(dt, 3, ys, 3 - lay);
    assert_int_equal(sj_cpu_concat(xs, 4, axis, &y), SJ_OK);
    expect(&y, r, NULL, 0, label("concat dtype %d axis %d lay %d", dt, axis, lay));
}

static void test_concat(void **state) {
    tu_concat_cases(run_concat);
    sj_tensor x = rnd(SJ_F32, 1, S(5), L_GAP), y = tu_tensor(SJ_F32, 1, S(5));
    double *r = ref(5);
    tu_ref_concat(&x, 1, 0, r);
    assert_int_equal(sj_cpu_concat(&x, 1, -1, &y), SJ_OK);
    assert_true(tu_check(&y, r, 0, "concat of one"));
}

static void run_gather(sj_dtype dt, sj_dtype idt, int tr, const int64_t *ts, int ir,
                       const int64_t *is, int lt, int ly) {
    int64_t ys[SJ_MAX_RANK];
    sj_tensor t, idx;
    double *r = tu_gather_operands(dt, idt, tr, ts, ir, is, lt, &t, &idx, ys);
    sj_tensor y = make(dt, ir + tr - 1, ys, ly);
    assert_int_equal(sj_cpu_gather(&t, &idx, &y), SJ_OK);
    expect(&y, r, NULL, 0,
           label("gather dtype %d index %d ranks %d/%d lay %d", dt, idt, tr, ir, lt));
}

static void test_gather(void **state) {
    tu_gather_cases(run_gather);
    /* out of range: an error naming index and position, and y untouched */
    const char *msg[] = {"gather: index 10 out of range [0, 10) at position 4",
                         "gather: index -1 out of range [0, 10) at position 5"};
    for (int c = 0; c < 2; c++) {
        sj_tensor t = rnd(SJ_F32, 2, S(10, 4), L_CONTIG), idx = tu_tensor(SJ_I64, 2, S(2, 3));
        sj_tensor y = tu_tensor(SJ_F32, 3, S(2, 3, 4));
        tu_seti_all(&idx, tu_gather_bad[c]);
        assert_int_equal(sj_cpu_gather(&t, &idx, &y), SJ_EINDEX);
        assert_string_equal(sj_last_error(), msg[c]);
        for (int64_t i = 0; i < tu_numel(&y); i++) assert_true(tu_is_poison(&y, i));
    }
    sj_tensor t0 = tu_tensor(SJ_F32, 2, S(0, 4)), i0 = tu_tensor(SJ_I32, 1, S(1));
    sj_tensor y0 = tu_tensor(SJ_F32, 2, S(1, 4));
    tu_seti(&i0, 0, 0);
    assert_int_equal(sj_cpu_gather(&t0, &i0, &y0), SJ_EINDEX); /* V = 0 */
}

/* -- Scratch -------------------------------------------------------------- */

/* arg: the main thread's slot-0 buffer; returns whether ours differs */
static void *scratch_thread(void *arg) {
    char *p = sj_cpu_scratch(0, 1000);
    if (!p)
        return NULL;
    memset(p, 1, 1000);
    return p != arg ? arg : NULL;
}

static void test_scratch(void **state) {
    char *p = sj_cpu_scratch(1, 100);
    assert_non_null(p);
    assert_true(((uintptr_t)p & 63) == 0);
    memset(p, 0, 100);
    assert_ptr_equal(sj_cpu_scratch(1, 50), p); /* reused */
    char *q = sj_cpu_scratch(1, 100000);        /* grown */
    assert_non_null(q);
    assert_true(((uintptr_t)q & 63) == 0);
    memset(q, 0, 100000);
    assert_non_null(sj_cpu_scratch(2, 0));
    /* per thread (the thread's buffers are freed at its exit: the
     * sanitizer build reports a leak otherwise) */
    void *mine = sj_cpu_scratch(0, 1000), *differs = NULL;
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, scratch_thread, mine), 0);
    assert_int_equal(pthread_join(th, &differs), 0);
    assert_ptr_equal(differs, mine);
    assert_null(sj_cpu_scratch(3, SIZE_MAX - 8));
}

int main(void) {
    const char *seed = getenv("SJ_TEST_SEED"); /* to rerun with other inputs */
    tu_seed(seed ? strtoull(seed, NULL, 10) : 20240611);
#define T(f) cmocka_unit_test_teardown(f, tu_teardown)
    const struct CMUnitTest tests[] = {
        T(test_half),   T(test_approximations),  T(test_max_f32),    T(test_unary),      T(test_unary_specials),
        T(test_binary), T(test_int_semantics),   T(test_nan_binary), T(test_where),
        T(test_cast),   T(test_copy_transposed), T(test_reduce),     T(test_softmax),
        T(test_norms),  T(test_layer_norm_offset), T(test_matmul), T(test_matmul_bias), T(test_attention),  T(test_split), T(test_concat),
        T(test_gather), T(test_scratch),
    };
#undef T
    return cmocka_run_group_tests(tests, NULL, NULL);
}
