/* Eager CPU kernels against float64 references on random inputs: every op,
 * every dtype it takes, broadcast and strided layouts, edge sizes, and the
 * half conversions and f32 approximations the kernels are built on.
 * Every output is poisoned before the kernel runs, so an element the kernel
 * never wrote fails the check. */
/* cmocka.h needs these first, in this order */
/* clang-format off */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
/* clang-format on */

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jit/error.h"
#include "kernels/cpu/cpu_int.h"
#include "kernels/cpu/eager.h"
#include "kernels/half.h"
#include "tests/util.h"

#define S(...) ((const int64_t[]){__VA_ARGS__})
#define NELEM(a) ((int)(sizeof(a) / sizeof((a)[0])))

static const sj_dtype FLOATS[] = {SJ_F32, SJ_F16, SJ_BF16};
static const sj_dtype NUMERIC[] = {SJ_F32, SJ_F16, SJ_BF16, SJ_I32, SJ_I64};
static const sj_dtype ALL[] = {SJ_F32, SJ_F16, SJ_BF16, SJ_I32, SJ_I64, SJ_BOOL};

/* -- Helpers -------------------------------------------------------------- */

/* Reference values and magnitudes (for tu_check_mag). */
static double *ref(int64_t n) { return tu_refbuf(0, n); }
static double *mag(int64_t n) { return tu_refbuf(1, n); }

static int teardown(void **state) {
    tu_free_all();
    return 0;
}

#define label tu_label

enum { L_CONTIG = TU_CONTIG, L_GAP = TU_GAP, L_REV = TU_REV, L_REVGAP = TU_REVGAP, L_COUNT };
#define make tu_tensor_layout

static sj_tensor filled(sj_tensor t) {
    tu_fill_random(&t);
    return t;
}

static sj_tensor rnd(sj_dtype dt, int rank, const int64_t *shape, int lay) {
    return filled(make(dt, rank, shape, lay));
}

static int is_cmp(sj_op op) { return op >= SJ_OP_EQ && op <= SJ_OP_GE; }

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
    assert_true(cpu_expf(INFINITY) == INFINITY && cpu_expf(-INFINITY) == 0.0f);
    assert_true(cpu_expf(89.0f) == INFINITY && cpu_expf(-104.0f) == 0.0f);
    assert_true(cpu_expf(-100.0f) > 0.0f); /* subnormal, not flushed */
    assert_true(cpu_tanhf(INFINITY) == 1.0f && cpu_tanhf(-INFINITY) == -1.0f);
    assert_true(cpu_erff(INFINITY) == 1.0f && cpu_erff(-INFINITY) == -1.0f);
    assert_true(cpu_tanhf(-0.0f) == 0.0f && signbit(cpu_tanhf(-0.0f)));
}

/* -- Unary ---------------------------------------------------------------- */

static const sj_op UNARY[] = {SJ_OP_NEG,  SJ_OP_ABS,   SJ_OP_EXP,       SJ_OP_LOG,
                              SJ_OP_SQRT, SJ_OP_RSQRT, SJ_OP_TANH,      SJ_OP_SIGMOID,
                              SJ_OP_RELU, SJ_OP_GELU,  SJ_OP_GELU_TANH, SJ_OP_SILU};

static void run_unary(sj_op op, sj_dtype dt, int rank, const int64_t *shape, int lx, int ly) {
    sj_tensor x = make(dt, rank, shape, lx), y = make(dt, rank, shape, ly);
    if (op == SJ_OP_LOG || op == SJ_OP_SQRT || op == SJ_OP_RSQRT)
        tu_fill_range(&x, 0.05, 4.0);
    else
        tu_fill_random(&x);
    double *r = ref(tu_numel(&y));
    tu_ref_unary(op, &x, r);
    assert_int_equal(sj_cpu_unary(op, &x, &y), SJ_OK);
    expect(&y, r, NULL, tu_tol(dt),
           label("unary %d dtype %d rank %d lay %d/%d", op, dt, rank, lx, ly));
}

static void test_unary(void **state) {
    for (int o = 0; o < NELEM(UNARY); o++)
        for (int d = 0; d < NELEM(NUMERIC); d++) {
            sj_op op = UNARY[o];
            sj_dtype dt = NUMERIC[d];
            if ((dt == SJ_I32 || dt == SJ_I64) &&
                !(op == SJ_OP_NEG || op == SJ_OP_ABS || op == SJ_OP_RELU))
                continue;
            run_unary(op, dt, 3, S(3, 5, 37), L_CONTIG, L_CONTIG);
            run_unary(op, dt, 3, S(3, 5, 37), L_REV, L_GAP);
            run_unary(op, dt, 2, S(300, 2), L_GAP, L_REV);
            run_unary(op, dt, 0, NULL, L_CONTIG, L_CONTIG);
            run_unary(op, dt, 2, S(4, 0), L_CONTIG, L_CONTIG);
            run_unary(op, dt, 1, S(1), L_GAP, L_GAP);
        }
}

static void test_unary_specials(void **state) {
    const double v[] = {NAN,  INFINITY, -INFINITY, 0.0,   -0.0, 1e-30, -1e-30, 100.0, -100.0,
                        88.5, -88.5,    1e30,      -1e30, 0.5,  -3.0,  9.0,    20.0,  -20.0};
    int64_t n = NELEM(v);
    sj_tensor x = tu_tensor(SJ_F32, 1, &n);
    tu_set_all(&x, v);
    for (int o = 0; o < NELEM(UNARY); o++) {
        sj_tensor y = tu_tensor(SJ_F32, 1, &n);
        double *r = ref(n);
        tu_ref_unary(UNARY[o], &x, r);
        assert_int_equal(sj_cpu_unary(UNARY[o], &x, &y), SJ_OK);
        /* |err| <= 1e-6 max(|ref|, 1) (the gelus cancel for negative x);
         * overflow to inf where the f32 result overflows */
        for (int64_t i = 0; i < n; i++) {
            double got = tu_get(&y, i), w = tu_round(SJ_F32, r[i]);
            int ok = isnan(w)   ? isnan(got)
                     : isinf(w) ? got == w
                                : fabs(got - w) <= 1e-6 * fmax(fabs(w), 1.0);
            if (!ok)
                fprintf(stderr, "op %d x %g: %.9g, want %.9g\n", UNARY[o], v[i], got, w);
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
    sj_tensor y = make(is_cmp(op) ? SJ_BOOL : dt, rank, ys, ly);
    double *r = ref(tu_numel(&y));
    tu_ref_binary(op, &a, &b, r);
    assert_int_equal(sj_cpu_binary(op, &a, &b, &y), SJ_OK);
    expect(&y, r, NULL, is_cmp(op) ? 0 : tu_tol(dt),
           label("binary %d dtype %d rank %d", op, dt, rank));
}

static void test_binary(void **state) {
    for (int op = SJ_OP_ADD; op <= SJ_OP_GE; op++)
        for (int d = 0; d < NELEM(NUMERIC); d++) {
            sj_dtype dt = NUMERIC[d];
            if (op == SJ_OP_POW && (dt == SJ_I32 || dt == SJ_I64))
                continue; /* test_int_semantics */
            const int64_t *ys = S(4, 33);
            run_binary(op, dt, 2, ys, 2, ys, L_CONTIG, 2, ys, L_CONTIG, L_CONTIG);
            run_binary(op, dt, 2, ys, 0, NULL, L_CONTIG, 2, ys, L_CONTIG, L_CONTIG); /* scalar */
            run_binary(op, dt, 2, ys, 2, ys, L_CONTIG, 0, NULL, L_CONTIG, L_CONTIG);
            run_binary(op, dt, 2, ys, 2, ys, L_CONTIG, 1, S(33), L_CONTIG, L_CONTIG);   /* row */
            run_binary(op, dt, 2, ys, 2, S(4, 1), L_CONTIG, 2, ys, L_CONTIG, L_CONTIG); /* column */
            run_binary(op, dt, 2, ys, 2, S(4, 1), L_CONTIG, 2, S(1, 33), L_CONTIG, L_CONTIG);
            run_binary(op, dt, 2, ys, 2, ys, L_REV, 2, ys, L_GAP, L_REVGAP); /* strided */
            run_binary(op, dt, 3, S(2, 3, 300), 1, S(300), L_GAP, 3, S(2, 3, 300), L_REV, L_GAP);
            run_binary(op, dt, 8, S(2, 2, 3, 2, 2, 2, 2, 3), 8, S(2, 1, 3, 1, 2, 2, 1, 3), L_GAP, 7,
                       S(2, 1, 2, 1, 2, 2, 1), L_REV, L_GAP);
            run_binary(op, dt, 0, NULL, 0, NULL, L_CONTIG, 0, NULL, L_CONTIG, L_CONTIG);
            run_binary(op, dt, 2, S(0, 5), 2, S(0, 5), L_CONTIG, 1, S(5), L_CONTIG, L_CONTIG);
            run_binary(op, dt, 2, S(3, 1), 2, S(3, 1), L_GAP, 2, S(1, 1), L_CONTIG, L_GAP);
        }
    /* comparisons of bools */
    for (int op = SJ_OP_EQ; op <= SJ_OP_GE; op++) {
        run_binary(op, SJ_BOOL, 2, S(3, 40), 2, S(3, 40), L_CONTIG, 2, S(3, 40), L_GAP, L_CONTIG);
        run_binary(op, SJ_BOOL, 2, S(3, 40), 0, NULL, L_CONTIG, 1, S(40), L_CONTIG, L_REV);
    }
    /* pow on floats with a positive base over a wider range */
    for (int d = 0; d < NELEM(FLOATS); d++) {
        sj_tensor a = make(FLOATS[d], 1, S(50), L_CONTIG), b = make(FLOATS[d], 1, S(50), L_GAP);
        sj_tensor y = make(FLOATS[d], 1, S(50), L_CONTIG);
        tu_fill_range(&a, 0.1, 3.0);
        tu_fill_range(&b, -3.0, 3.0);
        double *r = ref(50);
        tu_ref_binary(SJ_OP_POW, &a, &b, r);
        assert_int_equal(sj_cpu_binary(SJ_OP_POW, &a, &b, &y), SJ_OK);
        assert_true(tu_check(&y, r, tu_tol(FLOATS[d]), "pow positive base"));
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
        sj_dtype dt = NUMERIC[d];
        int64_t mn = dt == SJ_I32 ? INT32_MIN : INT64_MIN,
                mx = dt == SJ_I32 ? INT32_MAX : INT64_MAX;
        run_ints(SJ_OP_DIV, dt, 8, S(7, -7, 7, -7, 5, 0, mn, -1), S(2, 2, -2, -2, 0, 0, -1, 3),
                 S(3, -3, -3, 3, 0, 0, mn, 0));
        run_ints(SJ_OP_POW, dt, 10, S(2, -2, 1, -1, -1, 0, 3, 0, 2, 5),
                 S(3, 3, -1, -1, -2, -1, 0, 0, -3, 1), S(8, -8, 1, -1, 1, 0, 1, 1, 0, 5));
        run_ints(SJ_OP_ADD, dt, 2, S(mx, mn), S(1, -1), S(mn, mx));
        run_ints(SJ_OP_SUB, dt, 1, S(mn), S(1), S(mx));
        run_ints(SJ_OP_MUL, dt, 2, S(mx, -3), S(2, -4), S(-2, 12));
        run_ints(SJ_OP_MAXIMUM, dt, 2, S(mn, -3), S(mx, -4), S(mx, -3));
        run_ints(SJ_OP_MINIMUM, dt, 2, S(mn, -3), S(mx, -4), S(mn, -4));
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

static void test_nan_binary(void **state) {
    /* NaN on either side, through the fast paths (contiguous and scalar)
     * and the chunked one (f16) */
    for (int d = 0; d < NELEM(FLOATS); d++) {
        int64_t n = 40;
        sj_tensor a = tu_tensor(FLOATS[d], 1, &n), s = tu_tensor(FLOATS[d], 0, NULL);
        tu_fill_random(&a);
        tu_set(&a, 3, NAN);
        tu_set(&s, 0, NAN);
        sj_tensor b = tu_broadcast(&s, 1, &n);
        for (int op = SJ_OP_ADD; op <= SJ_OP_GE; op++) {
            if (op == SJ_OP_POW)
                continue;
            for (int side = 0; side < 2; side++) {
                sj_tensor y = tu_tensor(is_cmp(op) ? SJ_BOOL : FLOATS[d], 1, &n);
                const sj_tensor *l = side ? &b : &a, *r = side ? &a : &b;
                double *rf = ref(n);
                tu_ref_binary(op, l, r, rf);
                assert_int_equal(sj_cpu_binary(op, l, r, &y), SJ_OK);
                assert_true(tu_check(&y, rf, is_cmp(op) ? 0 : tu_tol(FLOATS[d]), "nan binary"));
            }
        }
    }
}

/* -- Where ---------------------------------------------------------------- */

static void test_where(void **state) {
    for (int d = 0; d < NELEM(ALL); d++) {
        const int64_t *ys = S(5, 70);
        /* c and a: full, scalar c with a row, column c with scalar a, strided */
        const int rc[] = {2, 0, 2, 2}, lc[] = {L_CONTIG, L_CONTIG, L_REV, L_GAP};
        const int ra[] = {2, 1, 0, 2}, la[] = {L_CONTIG, L_GAP, L_CONTIG, L_REV};
        const int ly[] = {L_CONTIG, L_CONTIG, L_REVGAP, L_GAP};
        const int64_t *cs[] = {ys, NULL, S(5, 1), ys}, *as[] = {ys, S(70), NULL, ys};
        for (int c = 0; c < 4; c++) {
            sj_tensor c0 = rnd(SJ_BOOL, rc[c], cs[c], lc[c]), a0 = rnd(ALL[d], ra[c], as[c], la[c]);
            sj_tensor b0 = rnd(ALL[d], 2, ys, L_REV), y = make(ALL[d], 2, ys, ly[c]);
            sj_tensor cc = tu_broadcast(&c0, 2, ys), a = tu_broadcast(&a0, 2, ys);
            sj_tensor b = tu_broadcast(&b0, 2, ys);
            double *r = ref(tu_numel(&y));
            tu_ref_where(&cc, &a, &b, r);
            assert_int_equal(sj_cpu_where(&cc, &a, &b, &y), SJ_OK);
            expect(&y, r, NULL, 0, label("where dtype %d case %d", ALL[d], c));
        }
        sj_tensor e = make(ALL[d], 2, S(0, 3), L_CONTIG), ec = make(SJ_BOOL, 2, S(0, 3), L_CONTIG);
        assert_int_equal(sj_cpu_where(&ec, &e, &e, &e), SJ_OK);
    }
}

/* -- Copy and cast -------------------------------------------------------- */

static void test_cast(void **state) {
    for (int f = 0; f < NELEM(ALL); f++)
        for (int t = 0; t < NELEM(ALL); t++)
            for (int lay = 0; lay < L_COUNT; lay++) {
                const int64_t *shape = S(3, 4, 45);
                sj_tensor x = make(ALL[f], 3, shape, lay), y = make(ALL[t], 3, shape, 3 - lay);
                if (ALL[f] == SJ_BOOL || ALL[f] == SJ_I32 || ALL[f] == SJ_I64)
                    tu_fill_range(&x, -300, 300);
                else
                    tu_fill_random(&x);
                double *r = ref(tu_numel(&y));
                tu_ref_cast(&x, ALL[t], r);
                assert_int_equal(sj_cpu_copy(&x, &y), SJ_OK);
                expect(&y, r, NULL, 0, label("cast %d -> %d layout %d", ALL[f], ALL[t], lay));
            }
    /* special values: truncation, saturation, NaN, != 0 */
    const double v[] = {NAN,           INFINITY, -INFINITY, 3e9,     -3e9, 1e19,
                        -1e19,         2.7,      -2.7,      0.5,     -0.0, 2147483520.0,
                        -2147483648.0, 65519.0,  65520.0,   70000.0, 1e-8};
    int64_t n = NELEM(v);
    for (int f = 0; f < 3; f++) {
        sj_tensor x = tu_tensor(FLOATS[f], 1, &n);
        tu_set_all(&x, v);
        for (int t = 0; t < NELEM(ALL); t++) {
            sj_tensor y = tu_tensor(ALL[t], 1, &n);
            double *r = ref(n);
            tu_ref_cast(&x, ALL[t], r);
            assert_int_equal(sj_cpu_copy(&x, &y), SJ_OK);
            assert_true(tu_check(&y, r, 0, label("cast specials %d -> %d", FLOATS[f], ALL[t])));
        }
    }
    /* i64 -> i32 wraps; big ints -> f16 overflow to inf; -> bool */
    sj_tensor x = tu_tensor(SJ_I64, 1, S(6));
    tu_seti_all(&x, S(INT64_MAX, INT64_MIN, 4294967297LL, 65519, 70000, -1));
    for (int t = 0; t < NELEM(ALL); t++) {
        sj_tensor y = tu_tensor(ALL[t], 1, S(6));
        double *r = ref(6);
        tu_ref_cast(&x, ALL[t], r);
        assert_int_equal(sj_cpu_copy(&x, &y), SJ_OK);
        assert_true(tu_check(&y, r, 0, label("cast i64 specials -> %d", ALL[t])));
    }
    /* a broadcast (stride 0) source, and rank 0 */
    sj_tensor s = tu_tensor(SJ_F16, 0, NULL), y = tu_tensor(SJ_F32, 2, S(3, 3));
    tu_set(&s, 0, 1.5);
    sj_tensor sb = tu_broadcast(&s, 2, S(3, 3));
    assert_int_equal(sj_cpu_copy(&sb, &y), SJ_OK);
    for (int i = 0; i < 9; i++) assert_true(tu_get(&y, i) == 1.5);
}

static void test_copy_transposed(void **state) {
    /* x is a transposed view (unit stride across rows): the tiled path */
    const int64_t shapes[][3] = {{3, 37, 45}, {1, 70, 9}, {2, 8, 8}, {1, 1, 5}, {2, 17, 1}};
    for (int d = 0; d < NELEM(ALL); d++)
        for (int s = 0; s < NELEM(shapes); s++)
            for (int v = 0; v < 4; v++) {
                const int64_t *sh = shapes[s];
                sj_tensor x0 = rnd(ALL[d], 3, S(sh[0], sh[2], sh[1]), (v & 1) ? L_GAP : L_CONTIG);
                sj_tensor x = tu_transpose(&x0, 1, 2);
                /* y: contiguous, or rows padded by 3 (a view of a wider one) */
                sj_tensor y = tu_tensor(ALL[d], 3, S(sh[0], sh[1], sh[2] + ((v & 2) ? 3 : 0)));
                y.shape[2] = sh[2];
                double *r = ref(tu_numel(&y));
                tu_ref_cast(&x, ALL[d], r);
                assert_int_equal(sj_cpu_copy(&x, &y), SJ_OK);
                const char *what = label("transposed copy %d shape %d v %d", ALL[d], s, v);
                assert_true(tu_check(&y, r, 0, what));
                y.shape[2] = sh[2] + ((v & 2) ? 3 : 0); /* the padding is still poison */
                for (int64_t i = 0; i < tu_numel(&y); i++)
                    assert_true(tu_is_poison(&y, i) == (i % y.shape[2] >= sh[2]));
            }
}

/* -- Reductions ----------------------------------------------------------- */

static void run_reduce(sj_op op, sj_dtype dt, int rank, const int64_t *shape, int axis, int lx,
                       int ly) {
    int64_t ys[SJ_MAX_RANK];
    int ax = axis < 0 ? axis + rank : axis;
    memcpy(ys, shape, (size_t)rank * sizeof *ys);
    ys[ax] = 1;
    sj_tensor x = rnd(dt, rank, shape, lx), y = make(dt, rank, ys, ly);
    double *r = ref(tu_numel(&y));
    tu_ref_reduce(op, &x, ax, r);
    assert_int_equal(sj_cpu_reduce(op, &x, axis, &y), SJ_OK);
    expect(&y, r, NULL, tu_tol(dt),
           label("reduce %d dtype %d axis %d layout %d", op, dt, axis, lx));
}

static void test_reduce(void **state) {
    for (int op = SJ_OP_SUM; op <= SJ_OP_AMAX; op++)
        for (int d = 0; d < NELEM(NUMERIC); d++) {
            sj_dtype dt = NUMERIC[d];
            if (op == SJ_OP_MEAN && (dt == SJ_I32 || dt == SJ_I64))
                continue;
            for (int axis = -1; axis < 3; axis++)
                for (int lay = 0; lay < L_COUNT; lay++)
                    run_reduce(op, dt, 3, S(3, 20, 37), axis, lay, 3 - lay);
            run_reduce(op, dt, 2, S(7, 300), 0, L_CONTIG, L_CONTIG); /* rows accumulated */
            run_reduce(op, dt, 1, S(1000), 0, L_GAP, L_CONTIG);
            run_reduce(op, dt, 1, S(1), 0, L_CONTIG, L_CONTIG);
            run_reduce(op, dt, 2, S(0, 4), 1, L_CONTIG, L_CONTIG); /* no outputs */
            if (op != SJ_OP_AMAX) {
                run_reduce(op, dt, 3, S(3, 0, 2), 1, L_CONTIG, L_CONTIG); /* empty axis */
                run_reduce(op, dt, 1, S(0), 0, L_CONTIG, L_CONTIG);
            }
        }
    /* amax propagates NaN; mean of an empty axis is NaN */
    sj_tensor x = rnd(SJ_F32, 2, S(3, 40), L_CONTIG), y = tu_tensor(SJ_F32, 2, S(3, 1));
    tu_set(&x, 45, NAN);
    assert_int_equal(sj_cpu_reduce(SJ_OP_AMAX, &x, 1, &y), SJ_OK);
    assert_true(!isnan(tu_get(&y, 0)) && isnan(tu_get(&y, 1)) && !isnan(tu_get(&y, 2)));
    /* the same over axis 0, whose rows are accumulated together */
    for (int d = 0; d < NELEM(FLOATS); d++) {
        sj_tensor xb = rnd(FLOATS[d], 2, S(40, 3), L_CONTIG), yb = tu_tensor(FLOATS[d], 2, S(1, 3));
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
    int64_t n = tu_numel(&x);
    if (special && n >= 3 * shape[rank - 1]) {
        int64_t row = shape[rank - 1];
        for (int64_t i = 0; i < row; i++) tu_set(&x, i, -INFINITY);          /* all -inf */
        for (int64_t i = row; i < 2 * row; i += 2) tu_set(&x, i, -INFINITY); /* some */
        tu_set(&x, 2 * row + 1, NAN);
    }
    double *r = ref(n);
    tu_ref_softmax(&x, axis, r);
    assert_int_equal(sj_cpu_softmax(&x, axis, &y), SJ_OK);
    expect(&y, r, NULL, tu_tol(dt), label("softmax dtype %d axis %d lay %d/%d", dt, axis, lx, ly));
}

static void test_softmax(void **state) {
    for (int d = 0; d < NELEM(FLOATS); d++) {
        for (int axis = 0; axis < 3; axis++)
            for (int lay = 0; lay < L_COUNT; lay++)
                run_softmax(FLOATS[d], 3, S(3, 4, 17), axis, lay, 3 - lay, 0);
        run_softmax(FLOATS[d], 2, S(3, 300), 1, L_CONTIG, L_CONTIG, 1);
        run_softmax(FLOATS[d], 2, S(3, 300), 1, L_GAP, L_REV, 1);
        run_softmax(FLOATS[d], 2, S(4, 1), 1, L_CONTIG, L_CONTIG, 0);
        run_softmax(FLOATS[d], 2, S(4, 0), 1, L_CONTIG, L_CONTIG, 0);
        run_softmax(FLOATS[d], 1, S(1), 0, L_GAP, L_CONTIG, 0);
    }
}

static void run_norm(int rms, sj_dtype dt, int rank, const int64_t *shape, int lx, int ly,
                     int with_g, int with_b) {
    int64_t n = shape[rank - 1];
    sj_tensor x = rnd(dt, rank, shape, lx), y = make(dt, rank, shape, ly);
    sj_tensor g = rnd(dt, 1, &n, L_GAP), b = rnd(dt, 1, &n, L_CONTIG);
    const sj_tensor *gp = with_g ? &g : NULL, *bp = with_b ? &b : NULL;
    double *r = ref(tu_numel(&x)), eps = 1e-5;
    if (rms)
        tu_ref_rms_norm(&x, gp, eps, r);
    else
        tu_ref_layer_norm(&x, gp, bp, eps, r);
    assert_int_equal(
        rms ? sj_cpu_rms_norm(&x, gp, eps, &y) : sj_cpu_layer_norm(&x, gp, bp, eps, &y), SJ_OK);
    expect(&y, r, NULL, tu_tol(dt),
           label("norm rms=%d dtype %d g %d b %d lay %d", rms, dt, with_g, with_b, lx));
}

static void test_norms(void **state) {
    for (int rms = 0; rms < 2; rms++)
        for (int d = 0; d < NELEM(FLOATS); d++)
            for (int gb = 0; gb < 4; gb++) {
                int g = gb & 1, b = gb >> 1;
                if (rms && b)
                    continue;
                run_norm(rms, FLOATS[d], 3, S(2, 3, 64), L_CONTIG, L_CONTIG, g, b);
                run_norm(rms, FLOATS[d], 3, S(2, 3, 37), L_REV, L_GAP, g, b);
                run_norm(rms, FLOATS[d], 2, S(3, 1), L_GAP, L_CONTIG, g, b);
                run_norm(rms, FLOATS[d], 1, S(1000), L_CONTIG, L_REVGAP, g, b);
                run_norm(rms, FLOATS[d], 2, S(0, 8), L_CONTIG, L_CONTIG, g, b);
            }
}

/* -- Matmul --------------------------------------------------------------- */

/* a [..., M, K] (la: layout of the matrix axes; ta: stored transposed),
 * b likewise, with batch shapes ab/bb broadcast to yb. */
static void run_matmul(sj_dtype dt, int nb, const int64_t *yb, const int64_t *ab, const int64_t *bb,
                       int64_t M, int64_t K, int64_t N, int la, int ta, int lb, int tb, int ly,
                       int ty) {
    int64_t as[SJ_MAX_RANK], bs[SJ_MAX_RANK], ys[SJ_MAX_RANK];
    int r = nb + 2;
    for (int i = 0; i < nb; i++) as[i] = ab[i], bs[i] = bb[i], ys[i] = yb[i];
    as[nb] = ta ? K : M, as[nb + 1] = ta ? M : K;
    bs[nb] = tb ? N : K, bs[nb + 1] = tb ? K : N;
    ys[nb] = ty ? N : M, ys[nb + 1] = ty ? M : N;
    sj_tensor a0 = rnd(dt, r, as, la), b0 = rnd(dt, r, bs, lb), y = make(dt, r, ys, ly);
    a0 = ta ? tu_transpose(&a0, nb, nb + 1) : a0; /* stored transposed: column-major */
    b0 = tb ? tu_transpose(&b0, nb, nb + 1) : b0;
    y = ty ? tu_transpose(&y, nb, nb + 1) : y;
    int64_t af[SJ_MAX_RANK], bf[SJ_MAX_RANK];
    memcpy(af, ys, sizeof af);
    memcpy(bf, ys, sizeof bf);
    af[nb] = M, af[nb + 1] = K, bf[nb] = K, bf[nb + 1] = N;
    sj_tensor a = tu_broadcast(&a0, r, af), b = tu_broadcast(&b0, r, bf);
    double *rf = ref(tu_numel(&y)), *mg = mag(tu_numel(&y));
    tu_ref_matmul(&a, &b, rf, mg);
    assert_int_equal(sj_cpu_matmul(&a, &b, &y), SJ_OK);
    expect(&y, rf, mg, tu_tol(dt),
           label("matmul dtype %d M %lld K %lld N %lld lay %d%d%d%d%d%d", dt, (long long)M,
                 (long long)K, (long long)N, la, ta, lb, tb, ly, ty));
}

static void test_matmul(void **state) {
    const int64_t mkn[][3] = {{3, 5, 4},   {1, 7, 1}, {5, 0, 3}, {1, 1, 1},
                              {17, 33, 9}, {0, 3, 4}, {4, 1, 6}, {6, 9, 1}};
    for (int d = 0; d < NELEM(NUMERIC); d++) {
        sj_dtype dt = NUMERIC[d];
        for (int s = 0; s < NELEM(mkn); s++) {
            int64_t M = mkn[s][0], K = mkn[s][1], N = mkn[s][2];
            for (int v = 0; v < 16; v++) /* every transpose combination, two layouts */
                run_matmul(dt, 0, NULL, NULL, NULL, M, K, N, (v & 8) ? L_GAP : L_CONTIG, v & 1,
                           (v & 8) ? L_CONTIG : L_GAP, (v >> 1) & 1, (v & 4) ? L_REVGAP : L_CONTIG,
                           (v >> 2) & 1);
            /* batches: full, broadcast on either side, b shared (folded into M) */
            const int64_t *ab[] = {S(2, 3), S(2, 3), S(2, 1), S(2, 3), S(2, 3)};
            const int64_t *bb[] = {S(2, 3), S(1, 3), S(2, 3), S(1, 1), S(1, 1)};
            const int lays[][6] = {{0, 0, 0, 0, 0, 0},
                                   {L_GAP, 1, 0, 0, 0, 0},
                                   {0, 0, 0, 1, L_GAP, 0},
                                   {0, 0, 0, 0, 0, 0},
                                   {0, 0, L_REV, 1, 0, 1}};
            for (int c = 0; c < 5; c++)
                run_matmul(dt, 2, S(2, 3), ab[c], bb[c], M, K, N, lays[c][0], lays[c][1],
                           lays[c][2], lays[c][3], lays[c][4], lays[c][5]);
            run_matmul(dt, 1, S(4), S(1), S(1), M, K, N, L_CONTIG, 0, L_CONTIG, 0, L_CONTIG, 0);
        }
    }
    /* integer products past 2^31 are exact in i64 and wrap in i32 */
    for (int d = 3; d < 5; d++) {
        sj_tensor a = tu_tensor(NUMERIC[d], 2, S(1, 2)), b = tu_tensor(NUMERIC[d], 2, S(2, 1));
        sj_tensor y = tu_tensor(NUMERIC[d], 2, S(1, 1));
        tu_seti_all(&a, S(100000, 3));
        tu_seti_all(&b, S(300000, 7));
        assert_int_equal(sj_cpu_matmul(&a, &b, &y), SJ_OK);
        assert_true(tu_geti(&y, 0) == (NUMERIC[d] == SJ_I64 ? 30000000021LL : -64771051));
    }
}

/* -- Attention ------------------------------------------------------------ */

static void run_attention(sj_dtype dt, int64_t B, int64_t H, int64_t Sq, int64_t Sk, int64_t D,
                          int64_t Dv, const int64_t *lens, sj_dtype ldt, int causal, int lay) {
    /* lay 1: [B, S, H, D] in memory; lay 3: [B, H, D, S] (column-major
     * matrices); lay 2: every axis padded */
    static const int perm[4] = {0, 2, 1, 3}, cols[4] = {0, 1, 3, 2};
    const int *order = lay == 1 ? perm : lay == 3 ? cols : NULL;
    sj_tensor q = filled(tu_tensor_strided(dt, 4, S(B, H, Sq, D), order, lay == 2));
    sj_tensor k = filled(tu_tensor_strided(dt, 4, S(B, H, Sk, D), order, 0));
    sj_tensor v = filled(tu_tensor_strided(dt, 4, S(B, H, Sk, Dv), NULL, lay == 2));
    sj_tensor y = tu_tensor_strided(dt, 4, S(B, H, Sq, Dv), order, lay == 2);
    sj_tensor l = tu_tensor(ldt, 1, &B);
    if (lens)
        tu_seti_all(&l, lens);
    double scale = 1.0 / sqrt((double)(D ? D : 1));
    double *r = ref(tu_numel(&y)), *mg = mag(tu_numel(&y));
    tu_ref_attention(&q, &k, &v, lens ? &l : NULL, scale, causal, r, mg);
    assert_int_equal(sj_cpu_attention(&q, &k, &v, lens ? &l : NULL, scale, causal, &y), SJ_OK);
    expect(&y, r, mg, tu_tol(dt),
           label("attention dtype %d Sq %lld Sk %lld causal %d lens %d lay %d", dt, (long long)Sq,
                 (long long)Sk, causal, lens != NULL, lay));
}

static void test_attention(void **state) {
    for (int d = 0; d < NELEM(FLOATS); d++) {
        sj_dtype dt = FLOATS[d];
        for (int causal = 0; causal < 2; causal++)
            for (int lay = 0; lay < 4; lay++) {
                run_attention(dt, 2, 3, 5, 7, 8, 6, NULL, SJ_I32, causal, lay);
                run_attention(dt, 2, 3, 5, 7, 8, 6, S(3, 9), SJ_I32, causal, lay);
                run_attention(dt, 3, 2, 7, 7, 4, 4, S(0, 7, -2), SJ_I64, causal, lay);
                run_attention(dt, 1, 2, 9, 4, 5, 3, S(3), SJ_I64, causal, lay); /* Sq > Sk */
                run_attention(dt, 2, 1, 70, 90, 16, 8, S(50, 90), SJ_I32, causal, lay);
                run_attention(dt, 1, 1, 3, 0, 4, 2, NULL, SJ_I32, causal, lay); /* no keys */
                run_attention(dt, 1, 1, 3, 5, 0, 2, NULL, SJ_I32, causal, lay); /* D = 0 */
                run_attention(dt, 1, 1, 1, 1, 1, 1, NULL, SJ_I32, causal, lay);
                run_attention(dt, 1, 2, 0, 5, 4, 2, NULL, SJ_I32, causal, lay);
            }
    }
}

/* -- Concat and gather ---------------------------------------------------- */

static void test_concat(void **state) {
    for (int d = 0; d < NELEM(ALL); d++)
        for (int axis = 0; axis < 3; axis++)
            for (int lay = 0; lay < L_COUNT; lay++) {
                const int64_t sizes[4] = {2, 0, 5, 1};
                sj_tensor xs[4];
                int64_t ys[3] = {3, 4, 6};
                ys[axis] = 8;
                for (int i = 0; i < 4; i++) {
                    int64_t s[3] = {3, 4, 6};
                    s[axis] = sizes[i];
                    xs[i] = rnd(ALL[d], 3, s, (lay + i) % L_COUNT);
                }
                sj_tensor y = make(ALL[d], 3, ys, 3 - lay);
                double *r = ref(tu_numel(&y));
                tu_ref_concat(xs, 4, axis, r);
                assert_int_equal(sj_cpu_concat(xs, 4, axis, &y), SJ_OK);
                expect(&y, r, NULL, 0, label("concat dtype %d axis %d lay %d", ALL[d], axis, lay));
            }
    sj_tensor x = rnd(SJ_F32, 1, S(5), L_GAP), y = tu_tensor(SJ_F32, 1, S(5));
    double *r = ref(5);
    tu_ref_concat(&x, 1, 0, r);
    assert_int_equal(sj_cpu_concat(&x, 1, -1, &y), SJ_OK);
    assert_true(tu_check(&y, r, 0, "concat of one"));
}

static void run_gather(sj_dtype dt, sj_dtype idt, int tr, const int64_t *ts, int ir,
                       const int64_t *is, int lt, int ly) {
    int64_t ys[SJ_MAX_RANK];
    for (int i = 0; i < ir; i++) ys[i] = is[i];
    for (int i = 1; i < tr; i++) ys[ir + i - 1] = ts[i];
    sj_tensor t = rnd(dt, tr, ts, lt), idx = make(idt, ir, is, lt);
    sj_tensor y = make(dt, ir + tr - 1, ys, ly);
    tu_fill_range(&idx, 0, (double)ts[0] - 1);
    double *r = ref(tu_numel(&y));
    tu_ref_gather(&t, &idx, r);
    assert_int_equal(sj_cpu_gather(&t, &idx, &y), SJ_OK);
    expect(&y, r, NULL, 0,
           label("gather dtype %d index %d ranks %d/%d lay %d", dt, idt, tr, ir, lt));
}

static void test_gather(void **state) {
    for (int d = 0; d < NELEM(ALL); d++)
        for (int lay = 0; lay < L_COUNT; lay++) {
            run_gather(ALL[d], SJ_I32, 2, S(10, 4), 2, S(2, 3), lay, 3 - lay);
            run_gather(ALL[d], SJ_I64, 2, S(10, 4), 0, NULL, lay, lay);
            run_gather(ALL[d], SJ_I64, 1, S(7), 3, S(2, 2, 3), lay, lay);
            run_gather(ALL[d], SJ_I32, 3, S(5, 2, 3), 1, S(9), lay, 3 - lay);
            run_gather(ALL[d], SJ_I32, 2, S(5, 0), 1, S(4), lay, lay);
            run_gather(ALL[d], SJ_I64, 2, S(5, 3), 1, S(0), lay, lay);
        }
    /* out of range: an error naming index and position, and y untouched */
    const int64_t bad[][6] = {{1, 2, 3, 4, 10, 0}, {0, 0, 0, 0, 0, -1}};
    const char *msg[] = {"gather: index 10 out of range [0, 10) at position 4",
                         "gather: index -1 out of range [0, 10) at position 5"};
    for (int c = 0; c < 2; c++) {
        sj_tensor t = rnd(SJ_F32, 2, S(10, 4), L_CONTIG), idx = tu_tensor(SJ_I64, 2, S(2, 3));
        sj_tensor y = tu_tensor(SJ_F32, 3, S(2, 3, 4));
        tu_seti_all(&idx, bad[c]);
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
#define T(f) cmocka_unit_test_teardown(f, teardown)
    const struct CMUnitTest tests[] = {
        T(test_half),   T(test_approximations),  T(test_unary),      T(test_unary_specials),
        T(test_binary), T(test_int_semantics),   T(test_nan_binary), T(test_where),
        T(test_cast),   T(test_copy_transposed), T(test_reduce),     T(test_softmax),
        T(test_norms),  T(test_matmul),          T(test_attention),  T(test_concat),
        T(test_gather), T(test_scratch),
    };
#undef T
    return cmocka_run_group_tests(tests, NULL, NULL);
}
