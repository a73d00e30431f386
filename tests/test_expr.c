/* Tests for shapes/expr: canonical forms, simplification rules, evaluation
 * against a brute-force reference on random expression trees, ranges,
 * printing (the C output is compiled into this test and run). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shapes/expr.h"

/* -- Helpers ------------------------------------------------------------- */

static uint64_t rng_state = 0x853c49e6748fea9bu;

static uint64_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static int64_t rnd_in(int64_t lo, int64_t hi) { /* lo <= hi, small spans */
    return lo + (int64_t)(rnd() % (uint64_t)(hi - lo + 1));
}

static sj_expr C(sj_exprs *p, int64_t c) { return sj_ex_const(p, c); }

static int64_t const_of(sj_exprs *p, sj_expr e) {
    int64_t v = 0;
    assert_true(sj_ex_is_const(p, e, &v));
    return v;
}

static void assert_prints(sj_exprs *p, sj_expr e, const char *want) {
    char buf[256];
    int n = sj_ex_print(p, e, buf, sizeof buf);
    assert_string_equal(buf, want);
    assert_int_equal(n, (int)strlen(want));
}

/* Python's floor division and modulo, computed independently in 128 bits. */
static __int128 ref_floordiv(__int128 a, __int128 b) {
    if (b == 0)
        return 0;
    if (b < 0)
        a = -a, b = -b;
    return a >= 0 ? a / b : -((-a + b - 1) / b);
}

static __int128 ref_mod(__int128 a, __int128 b) { return b == 0 ? 0 : a - ref_floordiv(a, b) * b; }

/* -- Pool and symbols ---------------------------------------------------- */

static void test_destroy_null(void **state) {
    sj_exprs_destroy(NULL);
    sj_exprs *p = sj_exprs_create();
    assert_non_null(p);
    assert_int_equal(sj_ex_count(p), 0);
    assert_int_equal(sj_sym_count(p), 0);
    assert_true(sj_ex_check(p));
    sj_exprs_destroy(p);
}

static void test_symbols(void **state) {
    sj_exprs *p = sj_exprs_create();
    int64_t lo, hi;
    assert_int_equal(sj_sym_new(p, 8, 2, SJ_EX_INF), 0);
    assert_int_equal(sj_sym_new(p, 3, 0, 10), 1);
    assert_int_equal(sj_sym_new(p, 0, 5, 4), -1); /* empty range: refused */
    assert_int_equal(sj_sym_count(p), 2);
    assert_int_equal(sj_sym_hint(p, 0), 8);
    assert_int_equal(sj_sym_hint(p, 1), 3);
    sj_sym_range(p, 0, &lo, &hi);
    assert_true(lo == 2 && hi == SJ_EX_INF);
    sj_sym_narrow(p, 0, 0, 100);
    sj_sym_range(p, 0, &lo, &hi);
    assert_true(lo == 2 && hi == 100);
    sj_sym_narrow(p, 0, 200, 300); /* contradiction: unchanged */
    sj_sym_range(p, 0, &lo, &hi);
    assert_true(lo == 2 && hi == 100);
    /* bad symbol numbers */
    assert_int_equal(sj_ex_sym(p, 2), SJ_EX_NONE);
    assert_int_equal(sj_ex_sym(p, -1), SJ_EX_NONE);
    assert_int_equal(sj_sym_hint(p, 7), 0);
    sj_sym_range(p, 7, &lo, &hi);
    assert_true(lo == INT64_MIN && hi == SJ_EX_INF);

    sj_expr s0 = sj_ex_sym(p, 0), s1 = sj_ex_sym(p, 1);
    int sym = -1;
    assert_int_equal(sj_ex_sym(p, 0), s0);
    assert_true(sj_ex_is_sym(p, s1, &sym) && sym == 1);
    assert_false(sj_ex_is_sym(p, C(p, 1), &sym));
    assert_false(sj_ex_is_const(p, s0, NULL));
    assert_int_equal(C(p, 42), C(p, 42));
    assert_int_equal(const_of(p, C(p, -7)), -7);
    assert_int_equal(const_of(p, C(p, INT64_MIN)), INT64_MIN);
    /* narrowing updates ranges of expressions built before */
    sj_expr e = sj_ex_add(p, s0, s1);
    sj_sym_narrow(p, 1, 4, 6);
    sj_ex_range(p, e, &lo, &hi);
    assert_true(lo == 6 && hi == 106);
    assert_true(sj_ex_check(p));
    sj_exprs_destroy(p);
}

/* -- Canonical form ------------------------------------------------------ */

static void test_add_identities(void **state) {
    sj_exprs *p = sj_exprs_create();
    sj_sym_new(p, 4, 1, SJ_EX_INF);
    sj_sym_new(p, 5, 1, SJ_EX_INF);
    sj_sym_new(p, 6, 1, SJ_EX_INF);
    sj_expr a = sj_ex_sym(p, 0), b = sj_ex_sym(p, 1), c = sj_ex_sym(p, 2);
    assert_int_equal(sj_ex_add(p, a, b), sj_ex_add(p, b, a));
    assert_int_equal(sj_ex_add(p, sj_ex_add(p, a, b), c), sj_ex_add(p, a, sj_ex_add(p, b, c)));
    assert_int_equal(sj_ex_add(p, a, C(p, 0)), a);
    assert_int_equal(sj_ex_add(p, C(p, 0), a), a);
    assert_int_equal(sj_ex_sub(p, a, a), C(p, 0));
    assert_int_equal(sj_ex_sub(p, sj_ex_add(p, a, C(p, 1)), C(p, 1)), a);
    assert_int_equal(sj_ex_add(p, C(p, 2), C(p, 3)), C(p, 5));
    assert_int_equal(sj_ex_sub(p, C(p, 2), C(p, 3)), C(p, -1));
    assert_int_equal(sj_ex_add(p, a, a), sj_ex_mul(p, C(p, 2), a));
    /* (a + b) - (b - c) == a + c */
    assert_int_equal(sj_ex_sub(p, sj_ex_add(p, a, b), sj_ex_sub(p, b, c)), sj_ex_add(p, a, c));
    /* a - b != b - a, a + 1 != a */
    assert_int_not_equal(sj_ex_sub(p, a, b), sj_ex_sub(p, b, a));
    assert_int_not_equal(sj_ex_add(p, a, C(p, 1)), a);
    /* wrapping constants: no UB, consistent with evaluation */
    assert_int_equal(const_of(p, sj_ex_add(p, C(p, INT64_MAX), C(p, 1))), INT64_MIN);
    assert_true(sj_ex_check(p));
    sj_exprs_destroy(p);
}

static void test_mul_identities(void **state) {
    sj_exprs *p = sj_exprs_create();
    sj_sym_new(p, 4, 1, SJ_EX_INF);
    sj_sym_new(p, 5, 1, SJ_EX_INF);
    sj_sym_new(p, 6, 1, SJ_EX_INF);
    sj_expr a = sj_ex_sym(p, 0), b = sj_ex_sym(p, 1), c = sj_ex_sym(p, 2);
    sj_expr one = C(p, 1), two = C(p, 2);
    assert_int_equal(sj_ex_mul(p, a, b), sj_ex_mul(p, b, a));
    assert_int_equal(sj_ex_mul(p, sj_ex_mul(p, a, b), c), sj_ex_mul(p, a, sj_ex_mul(p, b, c)));
    assert_int_equal(sj_ex_mul(p, a, C(p, 0)), C(p, 0));
    assert_int_equal(sj_ex_mul(p, C(p, 0), sj_ex_add(p, a, b)), C(p, 0));
    assert_int_equal(sj_ex_mul(p, a, one), a);
    assert_int_equal(sj_ex_mul(p, C(p, 6), C(p, 7)), C(p, 42));
    /* (a + 1) * 2 == 2*a + 2 */
    assert_int_equal(sj_ex_mul(p, sj_ex_add(p, a, one), two),
                     sj_ex_add(p, sj_ex_mul(p, two, a), two));
    /* (a + b) * (a - b) == a*a - b*b */
    sj_expr lhs = sj_ex_mul(p, sj_ex_add(p, a, b), sj_ex_sub(p, a, b));
    assert_int_equal(lhs, sj_ex_sub(p, sj_ex_mul(p, a, a), sj_ex_mul(p, b, b)));
    /* (a + b)^2 == a*a + 2*a*b + b*b */
    sj_expr ab = sj_ex_add(p, a, b);
    sj_expr sq = sj_ex_add(p, sj_ex_add(p, sj_ex_mul(p, a, a), sj_ex_mul(p, b, b)),
                           sj_ex_mul(p, two, sj_ex_mul(p, b, a)));
    assert_int_equal(sj_ex_mul(p, ab, ab), sq);
    /* a*(b*a) == (a*a)*b; a*a != a */
    assert_int_equal(sj_ex_mul(p, a, sj_ex_mul(p, b, a)), sj_ex_mul(p, sj_ex_mul(p, a, a), b));
    assert_int_not_equal(sj_ex_mul(p, a, a), a);
    /* cancellation through a product: a*b - b*a == 0 */
    assert_int_equal(sj_ex_sub(p, sj_ex_mul(p, a, b), sj_ex_mul(p, b, a)), C(p, 0));
    /* atoms are factors too: (a//2) * b == b * (a//2) */
    sj_expr h = sj_ex_floordiv(p, a, two);
    assert_int_equal(sj_ex_mul(p, h, b), sj_ex_mul(p, b, h));
    assert_true(sj_ex_check(p));
    sj_exprs_destroy(p);
}

/* -- Division and modulo ------------------------------------------------- */

static void test_floordiv_rules(void **state) {
    sj_exprs *p = sj_exprs_create();
    sj_sym_new(p, 10, 0, SJ_EX_INF); /* s0 >= 0 */
    sj_sym_new(p, 2, 0, 3);          /* s1 in [0, 3] */
    sj_sym_new(p, 7, 0, 10);         /* s2 in [0, 10] */
    sj_sym_new(p, 5, 1, SJ_EX_INF);  /* s3 >= 1 */
    sj_sym_new(p, 3, -20, 20);       /* s4 either sign */
    sj_expr s0 = sj_ex_sym(p, 0), s1 = sj_ex_sym(p, 1), s2 = sj_ex_sym(p, 2);
    sj_expr s3 = sj_ex_sym(p, 3), s4 = sj_ex_sym(p, 4);
    /* constants, Python semantics */
    assert_int_equal(const_of(p, sj_ex_floordiv(p, C(p, 7), C(p, 2))), 3);
    assert_int_equal(const_of(p, sj_ex_floordiv(p, C(p, -7), C(p, 2))), -4);
    assert_int_equal(const_of(p, sj_ex_floordiv(p, C(p, 7), C(p, -2))), -4);
    assert_int_equal(const_of(p, sj_ex_floordiv(p, C(p, -7), C(p, -2))), 3);
    assert_int_equal(const_of(p, sj_ex_floordiv(p, C(p, -8), C(p, 2))), -4);
    assert_int_equal(const_of(p, sj_ex_floordiv(p, C(p, INT64_MIN), C(p, -1))), INT64_MIN);
    /* a // 1 and a // -1 */
    assert_int_equal(sj_ex_floordiv(p, s0, C(p, 1)), s0);
    assert_int_equal(sj_ex_floordiv(p, s4, C(p, -1)), sj_ex_sub(p, C(p, 0), s4));
    /* exact division: (4*s0 + 8) // 4 == s0 + 2 */
    sj_expr e = sj_ex_add(p, sj_ex_mul(p, C(p, 4), s0), C(p, 8));
    assert_int_equal(sj_ex_floordiv(p, e, C(p, 4)), sj_ex_add(p, s0, C(p, 2)));
    /* range-based: (4*s0 + s1) // 4 == s0 when s1 in [0, 3] */
    sj_expr e1 = sj_ex_add(p, sj_ex_mul(p, C(p, 4), s0), s1);
    assert_int_equal(sj_ex_floordiv(p, e1, C(p, 4)), s0);
    assert_int_equal(sj_ex_floordiv(p, s1, C(p, 4)), C(p, 0));
    /* ... and (4*s0 + s1 + 4) // 4 == s0 + 1 (remainder in one period) */
    assert_int_equal(sj_ex_floordiv(p, sj_ex_add(p, e1, C(p, 4)), C(p, 4)),
                     sj_ex_add(p, s0, C(p, 1)));
    /* not decidable when s2 in [0, 10]: (4*s0 + s2) // 4 == s0 + s2//4 */
    sj_expr e2 = sj_ex_add(p, sj_ex_mul(p, C(p, 4), s0), s2);
    sj_expr q2 = sj_ex_floordiv(p, s2, C(p, 4));
    assert_int_not_equal(q2, C(p, 0));
    assert_int_equal(sj_ex_floordiv(p, e2, C(p, 4)), sj_ex_add(p, s0, q2));
    /* constant moved out: (s0 + 5) // 4 == (s0 + 1) // 4 + 1 */
    sj_expr t1 = sj_ex_floordiv(p, sj_ex_add(p, s0, C(p, 5)), C(p, 4));
    sj_expr t2 = sj_ex_add(p, sj_ex_floordiv(p, sj_ex_add(p, s0, C(p, 1)), C(p, 4)), C(p, 1));
    assert_int_equal(t1, t2);
    /* gcd: (2*s0) // 4 == s0 // 2; nested: (s0 // 2) // 3 == s0 // 6 */
    assert_int_equal(sj_ex_floordiv(p, sj_ex_mul(p, C(p, 2), s0), C(p, 4)),
                     sj_ex_floordiv(p, s0, C(p, 2)));
    assert_int_equal(sj_ex_floordiv(p, sj_ex_floordiv(p, s0, C(p, 2)), C(p, 3)),
                     sj_ex_floordiv(p, s0, C(p, 6)));
    /* negative divisor: s0 // -4 == (-s0) // 4 */
    assert_int_equal(sj_ex_floordiv(p, s0, C(p, -4)),
                     sj_ex_floordiv(p, sj_ex_sub(p, C(p, 0), s0), C(p, 4)));
    /* symbolic divisors */
    assert_int_equal(sj_ex_floordiv(p, s3, s3), C(p, 1));  /* s3 >= 1 */
    assert_int_not_equal(sj_ex_floordiv(p, s4, s4), C(p, 1)); /* s4 may be 0 */
    assert_int_equal(sj_ex_floordiv(p, C(p, 0), s4), C(p, 0));
    sj_expr small = sj_ex_floordiv(p, s1, sj_ex_add(p, s3, C(p, 3))); /* [0,3] // (>= 4) */
    assert_int_equal(small, C(p, 0));
    /* zero divisor */
    assert_int_equal(sj_ex_floordiv(p, s0, C(p, 0)), SJ_EX_NONE);
    assert_int_equal(sj_ex_floordiv(p, C(p, 3), C(p, 0)), SJ_EX_NONE);
    assert_int_equal(sj_ex_floordiv(p, s0, sj_ex_sub(p, s1, s1)), SJ_EX_NONE);
    /* evaluation with Python semantics and a zero divisor at run time */
    sj_expr d = sj_ex_floordiv(p, s4, s2);
    int64_t v[5] = {0, 0, 2, 0, -7};
    assert_int_equal(sj_ex_eval(p, d, v), -4);
    v[2] = 0;
    assert_int_equal(sj_ex_eval(p, d, v), 0);
    assert_true(sj_ex_check(p));
    sj_exprs_destroy(p);
}

static void test_mod_rules(void **state) {
    sj_exprs *p = sj_exprs_create();
    sj_sym_new(p, 10, 0, SJ_EX_INF);
    sj_sym_new(p, 2, 0, 3);
    sj_sym_new(p, 7, 4, 10);
    sj_sym_new(p, 3, -20, 20);
    sj_expr s0 = sj_ex_sym(p, 0), s1 = sj_ex_sym(p, 1), s2 = sj_ex_sym(p, 2);
    sj_expr s3 = sj_ex_sym(p, 3);
    assert_int_equal(const_of(p, sj_ex_mod(p, C(p, 7), C(p, 3))), 1);
    assert_int_equal(const_of(p, sj_ex_mod(p, C(p, -7), C(p, 3))), 2);
    assert_int_equal(const_of(p, sj_ex_mod(p, C(p, 7), C(p, -3))), -2);
    assert_int_equal(const_of(p, sj_ex_mod(p, C(p, -7), C(p, -3))), -1);
    assert_int_equal(const_of(p, sj_ex_mod(p, C(p, INT64_MIN), C(p, -1))), 0);
    assert_int_equal(sj_ex_mod(p, s0, C(p, 1)), C(p, 0));
    assert_int_equal(sj_ex_mod(p, s0, C(p, -1)), C(p, 0));
    assert_int_equal(sj_ex_mod(p, sj_ex_mul(p, C(p, 4), s0), C(p, 4)), C(p, 0));
    /* (4*s0 + s1) % 4 == s1 for s1 in [0, 3]; s1 % 4 == s1 */
    sj_expr e1 = sj_ex_add(p, sj_ex_mul(p, C(p, 4), s0), s1);
    assert_int_equal(sj_ex_mod(p, e1, C(p, 4)), s1);
    assert_int_equal(sj_ex_mod(p, s1, C(p, 4)), s1);
    /* (s2 + 4) % 4 == s2 % 4; (s2 - 4) % 8 == (s2 + 4) % 8 */
    assert_int_equal(sj_ex_mod(p, sj_ex_add(p, s2, C(p, 4)), C(p, 4)), sj_ex_mod(p, s2, C(p, 4)));
    assert_int_equal(sj_ex_mod(p, sj_ex_sub(p, s2, C(p, 4)), C(p, 8)),
                     sj_ex_mod(p, sj_ex_add(p, s2, C(p, 4)), C(p, 8)));
    /* s2 in [4, 10]: s2 % 16 == s2; (s2 + 12) % 16 unknown; s2 % 2 an atom */
    assert_int_equal(sj_ex_mod(p, s2, C(p, 16)), s2);
    assert_false(sj_ex_is_const(p, sj_ex_mod(p, s2, C(p, 2)), NULL));
    /* one period away: (s1 + 8) % 4 == s1 */
    assert_int_equal(sj_ex_mod(p, sj_ex_add(p, s1, C(p, 8)), C(p, 4)), s1);
    /* gcd: (2*s0) % 4 == 2*(s0 % 2); nested: (s0 % 8) % 4 == s0 % 4 */
    assert_int_equal(sj_ex_mod(p, sj_ex_mul(p, C(p, 2), s0), C(p, 4)),
                     sj_ex_mul(p, C(p, 2), sj_ex_mod(p, s0, C(p, 2))));
    assert_int_equal(sj_ex_mod(p, sj_ex_mod(p, s0, C(p, 8)), C(p, 4)), sj_ex_mod(p, s0, C(p, 4)));
    /* negative divisor: s3 % -4 == -((-s3) % 4) */
    sj_expr m = sj_ex_mod(p, s3, C(p, -4));
    assert_int_equal(m, sj_ex_sub(p, C(p, 0), sj_ex_mod(p, sj_ex_sub(p, C(p, 0), s3), C(p, 4))));
    int64_t v[4] = {0, 0, 4, 7};
    assert_int_equal(sj_ex_eval(p, m, v), -1); /* 7 % -4 == -1 */
    v[3] = -7;
    assert_int_equal(sj_ex_eval(p, m, v), -3);
    /* symbolic divisors */
    assert_int_equal(sj_ex_mod(p, s3, s3), C(p, 0));
    assert_int_equal(sj_ex_mod(p, C(p, 0), s3), C(p, 0));
    assert_int_equal(sj_ex_mod(p, s1, s2), s1); /* [0,3] % [4,10] */
    sj_expr ms = sj_ex_mod(p, s0, s3);
    v[0] = 9, v[3] = 0;
    assert_int_equal(sj_ex_eval(p, ms, v), 0); /* modulo by zero evaluates to 0 */
    v[3] = -4;
    assert_int_equal(sj_ex_eval(p, ms, v), -3);
    assert_int_equal(sj_ex_mod(p, s0, C(p, 0)), SJ_EX_NONE);
    assert_true(sj_ex_check(p));
    sj_exprs_destroy(p);
}

/* -- Min and max --------------------------------------------------------- */

static void test_minmax(void **state) {
    sj_exprs *p = sj_exprs_create();
    sj_sym_new(p, 4, 2, SJ_EX_INF);
    sj_sym_new(p, 5, 0, 10);
    sj_sym_new(p, 6, 20, 30);
    sj_expr s0 = sj_ex_sym(p, 0), s1 = sj_ex_sym(p, 1), s2 = sj_ex_sym(p, 2);
    assert_int_equal(const_of(p, sj_ex_min(p, C(p, 3), C(p, -2))), -2);
    assert_int_equal(const_of(p, sj_ex_max(p, C(p, 3), C(p, -2))), 3);
    assert_int_equal(sj_ex_min(p, s0, s0), s0);
    assert_int_equal(sj_ex_max(p, s1, s1), s1);
    /* decided by ranges */
    assert_int_equal(sj_ex_min(p, s0, C(p, 1)), C(p, 1));
    assert_int_equal(sj_ex_max(p, s0, C(p, 1)), s0);
    assert_int_equal(sj_ex_max(p, C(p, 2), s0), s0);
    assert_int_equal(sj_ex_min(p, s1, s2), s1);
    assert_int_equal(sj_ex_max(p, s2, s1), s2);
    /* decided by the difference: min(s0, s0 + 1) == s0 */
    assert_int_equal(sj_ex_min(p, s0, sj_ex_add(p, s0, C(p, 1))), s0);
    assert_int_equal(sj_ex_max(p, sj_ex_add(p, s1, C(p, 1)), s1), sj_ex_add(p, s1, C(p, 1)));
    /* undecided: an atom, commutative */
    sj_expr m = sj_ex_min(p, s0, C(p, 8));
    assert_false(sj_ex_is_const(p, m, NULL));
    assert_int_not_equal(m, s0);
    assert_int_equal(sj_ex_min(p, C(p, 8), s0), m);
    assert_int_equal(sj_ex_max(p, s0, s1), sj_ex_max(p, s1, s0));
    assert_int_not_equal(sj_ex_max(p, s0, s1), sj_ex_min(p, s0, s1));
    /* absorption */
    assert_int_equal(sj_ex_min(p, s0, m), m);
    assert_int_equal(sj_ex_min(p, m, C(p, 8)), m);
    assert_int_equal(sj_ex_max(p, s0, m), s0);
    int64_t lo, hi;
    sj_ex_range(p, m, &lo, &hi);
    assert_true(lo == 2 && hi == 8);
    int64_t v[3] = {5, 0, 20};
    assert_int_equal(sj_ex_eval(p, m, v), 5);
    v[0] = 100;
    assert_int_equal(sj_ex_eval(p, m, v), 8);
    assert_true(sj_ex_check(p));
    sj_exprs_destroy(p);
}

/* -- Invalid operands ---------------------------------------------------- */

static void test_none_propagation(void **state) {
    sj_exprs *p = sj_exprs_create();
    sj_sym_new(p, 4, 1, 8);
    sj_expr s = sj_ex_sym(p, 0), N = SJ_EX_NONE, big = 1000000;
    sj_expr (*const ops[])(sj_exprs *, sj_expr, sj_expr) = {
        sj_ex_add, sj_ex_sub, sj_ex_mul, sj_ex_floordiv, sj_ex_mod, sj_ex_min, sj_ex_max,
    };
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) {
        assert_int_equal(ops[i](p, N, s), N);
        assert_int_equal(ops[i](p, s, N), N);
        assert_int_equal(ops[i](p, N, N), N);
        assert_int_equal(ops[i](p, s, big), N); /* an id the pool does not have */
        assert_int_equal(ops[i](NULL, s, s), N);
    }
    assert_int_equal(sj_ex_floordiv(p, s, C(p, 0)), N);
    assert_int_equal(sj_ex_mod(p, s, C(p, 0)), N);
    assert_int_equal(sj_ex_const(NULL, 1), N);
    assert_int_equal(sj_sym_new(NULL, 1, 1, 1), -1);
    int64_t lo, hi;
    sj_ex_range(p, N, &lo, &hi);
    assert_true(lo == INT64_MIN && hi == SJ_EX_INF);
    assert_int_equal(sj_ex_eval(p, N, NULL), 0);
    assert_int_equal(sj_ex_hint(p, N), 0);
    assert_int_equal(sj_ex_syms(p, N), 0);
    assert_false(sj_ex_is_const(p, N, NULL));
    assert_prints(p, N, "<none>");
    char buf[8] = "x";
    assert_int_equal(sj_ex_print_c(p, N, "s", buf, sizeof buf), -1);
    assert_string_equal(buf, "");
    assert_int_equal(sj_ex_count(NULL), 0);
    sj_exprs_destroy(p);
}

/* -- Ranges and symbol sets ---------------------------------------------- */

static void assert_range(sj_exprs *p, sj_expr e, int64_t want_lo, int64_t want_hi) {
    int64_t lo, hi;
    sj_ex_range(p, e, &lo, &hi);
    assert_int_equal(lo, want_lo);
    assert_int_equal(hi, want_hi);
}

static void test_ranges(void **state) {
    sj_exprs *p = sj_exprs_create();
    sj_sym_new(p, 4, 0, 10);
    sj_sym_new(p, 1, -3, 5);
    sj_sym_new(p, 8, 1, SJ_EX_INF);
    sj_sym_new(p, 8, -((int64_t)1 << 40), (int64_t)1 << 40);
    sj_expr s0 = sj_ex_sym(p, 0), s1 = sj_ex_sym(p, 1), s2 = sj_ex_sym(p, 2);
    sj_expr s3 = sj_ex_sym(p, 3);
    assert_range(p, C(p, -4), -4, -4);
    assert_range(p, sj_ex_add(p, sj_ex_mul(p, C(p, 2), s0), C(p, 1)), 1, 21);
    assert_range(p, sj_ex_mul(p, s1, s1), 0, 25);
    assert_range(p, sj_ex_mul(p, sj_ex_mul(p, s1, s1), s1), -27, 125);
    assert_range(p, sj_ex_sub(p, s0, s1), -5, 13);
    assert_range(p, sj_ex_mul(p, s0, s1), -30, 50);
    assert_range(p, sj_ex_mul(p, C(p, 2), s2), 2, SJ_EX_INF);
    assert_range(p, sj_ex_sub(p, C(p, 0), s2), INT64_MIN, -1);
    assert_range(p, sj_ex_add(p, s2, s1), -2, SJ_EX_INF);
    assert_range(p, sj_ex_floordiv(p, s1, C(p, 2)), -2, 2);
    assert_range(p, sj_ex_mod(p, s2, C(p, 4)), 0, 3);
    assert_range(p, sj_ex_mod(p, s1, C(p, -4)), -3, 0);
    assert_range(p, sj_ex_floordiv(p, s0, s2), 0, 10);
    assert_range(p, sj_ex_mod(p, s2, s0), 0, 9);
    assert_range(p, sj_ex_min(p, s0, s1), -3, 5);
    assert_range(p, sj_ex_max(p, s2, s1), 1, SJ_EX_INF);
    /* saturation instead of overflow */
    sj_expr big = sj_ex_mul(p, C(p, INT64_MAX / 2), s2);
    assert_range(p, big, INT64_MAX / 2, SJ_EX_INF);
    sj_expr sq = sj_ex_mul(p, s3, s3);
    assert_range(p, s3, -((int64_t)1 << 40), (int64_t)1 << 40);
    assert_range(p, sq, 0, SJ_EX_INF);
    assert_range(p, sj_ex_mul(p, sq, s3), INT64_MIN, SJ_EX_INF);
    assert_range(p, sj_ex_floordiv(p, sq, C(p, 4)), 0, SJ_EX_INF);
    assert_range(p, sj_ex_sub(p, C(p, 0), sq), INT64_MIN, 0);
    /* symbol sets */
    assert_int_equal(sj_ex_syms(p, C(p, 3)), 0);
    assert_int_equal(sj_ex_syms(p, s1), 2);
    assert_int_equal(sj_ex_syms(p, sj_ex_floordiv(p, s0, s2)), 5);
    assert_int_equal(sj_ex_syms(p, sj_ex_sub(p, sj_ex_add(p, s0, s1), s0)), 2);
    for (int i = 4; i < 70; i++)
        sj_sym_new(p, 1, 0, 1);
    assert_int_equal(sj_ex_syms(p, sj_ex_add(p, sj_ex_sym(p, 62), sj_ex_sym(p, 69))),
                     (uint64_t)3 << 62);
    assert_true(sj_ex_check(p));
    sj_exprs_destroy(p);
}

static void test_hints(void **state) {
    sj_exprs *p = sj_exprs_create();
    sj_sym_new(p, 12, 2, SJ_EX_INF);
    sj_sym_new(p, 5, 1, 64);
    sj_expr s0 = sj_ex_sym(p, 0), s1 = sj_ex_sym(p, 1);
    sj_expr e = sj_ex_add(p, sj_ex_mul(p, s0, s1), sj_ex_floordiv(p, s0, C(p, 5)));
    assert_int_equal(sj_ex_hint(p, e), 12 * 5 + 2);
    assert_int_equal(sj_ex_hint(p, sj_ex_mod(p, s0, s1)), 2);
    assert_int_equal(sj_ex_hint(p, sj_ex_max(p, s0, sj_ex_mul(p, s1, C(p, 3)))), 15);
    int64_t hints[2] = {12, 5};
    assert_int_equal(sj_ex_hint(p, e), sj_ex_eval(p, e, hints));
    sj_exprs_destroy(p);
}

/* -- Printing ------------------------------------------------------------ */

static void test_print(void **state) {
    sj_exprs *p = sj_exprs_create();
    sj_sym_new(p, 8, 0, SJ_EX_INF);
    sj_sym_new(p, 4, 1, SJ_EX_INF);
    sj_expr s0 = sj_ex_sym(p, 0), s1 = sj_ex_sym(p, 1);
    sj_expr two = C(p, 2), four = C(p, 4);
    sj_expr lin = sj_ex_add(p, sj_ex_mul(p, two, s0), C(p, 1));
    assert_prints(p, lin, "2*s0 + 1");
    assert_prints(p, sj_ex_mul(p, s0, s1), "s0*s1");
    assert_prints(p, sj_ex_mul(p, s1, s0), "s0*s1");
    assert_prints(p, sj_ex_mul(p, s0, s0), "s0**2");
    assert_prints(p, sj_ex_floordiv(p, s0, four), "s0//4");
    assert_prints(p, sj_ex_mod(p, s0, four), "s0 % 4");
    assert_prints(p, sj_ex_min(p, s0, C(p, 8)), "min(s0, 8)");
    assert_prints(p, sj_ex_max(p, C(p, 8), s1), "max(s1, 8)");
    assert_prints(p, sj_ex_sub(p, s0, sj_ex_mul(p, C(p, 3), s1)), "s0 - 3*s1");
    assert_prints(p, sj_ex_sub(p, C(p, -1), sj_ex_mul(p, two, s0)), "-2*s0 - 1");
    assert_prints(p, sj_ex_sub(p, C(p, 0), s0), "-s0");
    assert_prints(p, C(p, -7), "-7");
    assert_prints(p, sj_ex_floordiv(p, sj_ex_add(p, s0, C(p, 1)), four), "(s0 + 1)//4");
    assert_prints(p, sj_ex_mod(p, sj_ex_add(p, s0, C(p, 1)), four), "(s0 + 1) % 4");
    sj_expr q = sj_ex_floordiv(p, s0, four);
    assert_prints(p, sj_ex_mul(p, two, q), "2*(s0//4)");
    assert_prints(p, sj_ex_sub(p, C(p, 0), q), "-(s0//4)");
    assert_prints(p, sj_ex_sub(p, s1, q), "s1 - s0//4");
    assert_prints(p, sj_ex_add(p, q, C(p, 1)), "s0//4 + 1");
    assert_prints(p, sj_ex_mul(p, q, q), "(s0//4)**2");
    assert_prints(p, sj_ex_floordiv(p, C(p, -3), s1), "(-3)//s1");
    assert_prints(p, sj_ex_mod(p, s0, sj_ex_floordiv(p, s1, two)), "s0 % (s1//2)");
    assert_prints(p, sj_ex_add(p, sj_ex_max(p, s0, s1), C(p, 3)), "max(s0, s1) + 3");
    assert_prints(p, sj_ex_mul(p, C(p, INT64_MIN), s0), "-9223372036854775808*s0");
    /* snprintf contract */
    char buf[4];
    assert_int_equal(sj_ex_print(p, lin, NULL, 0), 8);
    memset(buf, 'x', sizeof buf);
    assert_int_equal(sj_ex_print(p, lin, buf, sizeof buf), 8);
    assert_string_equal(buf, "2*s");
    assert_int_equal(sj_ex_print(p, lin, buf, 1), 8);
    assert_string_equal(buf, "");
    assert_int_equal(sj_ex_print_c(p, lin, "d", NULL, 0), 28);
    assert_int_equal(sj_ex_print_c(p, lin, "d", buf, sizeof buf), 28);
    assert_string_equal(buf, "(IN");
    assert_int_equal(sj_ex_print_c(p, lin, NULL, buf, sizeof buf), -1);
    sj_exprs_destroy(p);
}

/* The generated C is compiled right here: each case is C code whose text must
 * equal sj_ex_print_c's output, and whose value must equal sj_ex_eval's. */
static int64_t rt_floordiv(int64_t a, int64_t b) { return (int64_t)ref_floordiv(a, b); }
static int64_t rt_mod(int64_t a, int64_t b) { return (int64_t)ref_mod(a, b); }
#define SJ_FLOORDIV(a, b) rt_floordiv((a), (b))
#define SJ_MOD(a, b) rt_mod((a), (b))
#define SJ_MIN(a, b) ((a) < (b) ? (a) : (b))
#define SJ_MAX(a, b) ((a) > (b) ? (a) : (b))

#define C_CASE(name, code)                                                                         \
    static int64_t name(const int64_t *v) {                                                        \
        int64_t d0 = v[0], d1 = v[1];                                                              \
        (void)d0, (void)d1;                                                                        \
        return code;                                                                               \
    }                                                                                              \
    static const char name##_text[] = #code;

C_CASE(c_lin, (INT64_C(2)*d0 + INT64_C(1)))
C_CASE(c_prod, (d0*d1 - INT64_C(3)))
C_CASE(c_div, SJ_FLOORDIV(d0, INT64_C(4)))
C_CASE(c_mod, SJ_MOD((d0 + INT64_C(1)), INT64_C(4)))
C_CASE(c_min, SJ_MIN(d0, INT64_C(8)))
C_CASE(c_poly2, (-INT64_C(2)*d1*d1 + SJ_MAX(d0, d1)))
C_CASE(c_neg, (-INT64_C(5)))
C_CASE(c_symdiv, SJ_FLOORDIV(d0, d1))
C_CASE(c_negsym, (-d0))
C_CASE(c_nested, (-SJ_FLOORDIV(d0, (d1 + INT64_C(2))) + INT64_C(3)*SJ_MOD(d0, INT64_C(7))
                      - INT64_C(1)))
C_CASE(c_cube, (d0*d0*d0*d1 + d0))

static void test_print_c(void **state) {
    sj_exprs *p = sj_exprs_create();
    sj_sym_new(p, 8, -50, 50);
    sj_sym_new(p, 4, -9, 9);
    sj_expr s0 = sj_ex_sym(p, 0), s1 = sj_ex_sym(p, 1);
    /* atoms print by structure, not by creation order: e_nested's floordiv
     * (made after its mod) comes first */
    sj_expr e_lin = sj_ex_add(p, sj_ex_mul(p, C(p, 2), s0), C(p, 1));
    sj_expr e_prod = sj_ex_sub(p, sj_ex_mul(p, s0, s1), C(p, 3));
    sj_expr e_div = sj_ex_floordiv(p, s0, C(p, 4));
    sj_expr e_mod = sj_ex_mod(p, sj_ex_add(p, s0, C(p, 1)), C(p, 4));
    sj_expr e_min = sj_ex_min(p, C(p, 8), s0);
    sj_expr e_max = sj_ex_max(p, s1, s0);
    sj_expr e_poly2 = sj_ex_sub(p, e_max, sj_ex_mul(p, C(p, 2), sj_ex_mul(p, s1, s1)));
    sj_expr e_symdiv = sj_ex_floordiv(p, s0, s1);
    sj_expr e_negsym = sj_ex_sub(p, C(p, 0), s0);
    sj_expr m7 = sj_ex_mod(p, s0, C(p, 7));
    sj_expr dv = sj_ex_floordiv(p, s0, sj_ex_add(p, s1, C(p, 2)));
    sj_expr e_nested = sj_ex_sub(p, sj_ex_mul(p, C(p, 3), m7), sj_ex_add(p, dv, C(p, 1)));
    sj_expr sq = sj_ex_mul(p, s0, s0);
    sj_expr e_cube = sj_ex_add(p, sj_ex_mul(p, sq, sj_ex_mul(p, s1, s0)), s0);
    struct {
        sj_expr e;
        int64_t (*fn)(const int64_t *);
        const char *text;
    } cases[] = {
        {e_lin, c_lin, c_lin_text},          {e_prod, c_prod, c_prod_text},
        {e_div, c_div, c_div_text},          {e_mod, c_mod, c_mod_text},
        {e_min, c_min, c_min_text},          {e_poly2, c_poly2, c_poly2_text},
        {C(p, -5), c_neg, c_neg_text},       {e_symdiv, c_symdiv, c_symdiv_text},
        {e_negsym, c_negsym, c_negsym_text}, {e_nested, c_nested, c_nested_text},
        {e_cube, c_cube, c_cube_text},
    };
    char buf[256];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int n = sj_ex_print_c(p, cases[i].e, "d", buf, sizeof buf);
        assert_string_equal(buf, cases[i].text);
        assert_int_equal(n, (int)strlen(buf));
        for (int k = 0; k < 200; k++) {
            int64_t v[2] = {rnd_in(-50, 50), rnd_in(-9, 9)};
            assert_int_equal(cases[i].fn(v), sj_ex_eval(p, cases[i].e, v));
        }
    }
    /* constants that INT64_C cannot spell */
    assert_int_equal(sj_ex_print_c(p, C(p, INT64_MIN), "d", buf, sizeof buf), 9);
    assert_string_equal(buf, "INT64_MIN");
    sj_ex_print_c(p, sj_ex_add(p, s0, C(p, INT64_MIN)), "d", buf, sizeof buf);
    assert_string_equal(buf, "(d0 + INT64_MIN)");
    sj_exprs_destroy(p);
}

/* The printed text does not depend on the order expressions were made in
 * (ids do): one set of sizes built forwards in one pool and backwards in
 * another prints the same, both forms. Generated kernels print sizes, and
 * a trace makes derived sizes in the order its model function made ops. */
static void build_sizes(sj_exprs *p, bool backwards, sj_expr *out) {
    sj_sym_new(p, 20, 2, SJ_EX_INF);
    sj_sym_new(p, 7, 1, 64);
    sj_expr s0 = sj_ex_sym(p, 0), s1 = sj_ex_sym(p, 1), atoms[6];
    for (int k = 0; k < 6; k++) {
        int i = backwards ? 5 - k : k;
        switch (i) {
        case 0: atoms[i] = sj_ex_min(p, s0, C(p, 5)); break;
        case 1: atoms[i] = sj_ex_min(p, s0, C(p, 9)); break;
        case 2: atoms[i] = sj_ex_floordiv(p, s0, C(p, 3)); break;
        case 3: atoms[i] = sj_ex_floordiv(p, sj_ex_add(p, s0, s1), C(p, 2)); break;
        case 4: atoms[i] = sj_ex_mod(p, s0, C(p, 4)); break;
        default: atoms[i] = sj_ex_max(p, sj_ex_floordiv(p, s1, C(p, 2)), sj_ex_mod(p, s1, C(p, 3))); break;
        }
    }
    /* sums, products and min/max of each pair of atoms, the pairs made in
     * either order */
    int pa[15], pb[15], n = 0;
    for (int a = 0; a < 6; a++)
        for (int b = a + 1; b < 6; b++) pa[n] = a, pb[n++] = b;
    for (int k = 0; k < n; k++) {
        int i = backwards ? n - 1 - k : k;
        sj_expr x = atoms[pa[i]], y = atoms[pb[i]];
        out[4 * i] = sj_ex_sub(p, sj_ex_add(p, x, sj_ex_mul(p, C(p, 2), y)), C(p, 1));
        out[4 * i + 1] = sj_ex_add(p, sj_ex_mul(p, x, y), s1);
        out[4 * i + 2] = sj_ex_min(p, x, y);
        out[4 * i + 3] = sj_ex_max(p, sj_ex_add(p, x, s0), y);
    }
}

static void test_print_order(void **state) {
    sj_exprs *p = sj_exprs_create(), *q = sj_exprs_create();
    sj_expr a[60], b[60];
    build_sizes(p, false, a);
    build_sizes(q, true, b);
    char ta[512], tb[512];
    int64_t v[2] = {23, 5};
    for (int i = 0; i < 60; i++) {
        sj_ex_print(p, a[i], ta, sizeof ta);
        sj_ex_print(q, b[i], tb, sizeof tb);
        assert_string_equal(ta, tb);
        sj_ex_print_c(p, a[i], "s", ta, sizeof ta);
        sj_ex_print_c(q, b[i], "s", tb, sizeof tb);
        assert_string_equal(ta, tb);
        assert_int_equal(sj_ex_eval(p, a[i], v), sj_ex_eval(q, b[i], v));
    }
    /* in a sum, symbols before other atoms; min and max keep a constant last */
    sj_ex_print(p, a[3], ta, sizeof ta);
    assert_string_equal(ta, "max(s0 + min(s0, 5), min(s0, 9))");
    sj_exprs_destroy(p);
    sj_exprs_destroy(q);
}

/* -- Random expression trees against a reference ------------------------- */

enum { T_CONST, T_SYM, T_ADD, T_SUB, T_MUL, T_DIV, T_MOD, T_MIN, T_MAX };

typedef struct tnode {
    int op, a, b;
    int64_t c; /* T_CONST: value; T_SYM: symbol */
} tnode;

#define NSYM 5
#define MAXT 4096

typedef struct forest {
    tnode t[MAXT];
    int n;
} forest;

static const int64_t sym_lo[NSYM] = {-20, 0, 1, 2, -5};
static const int64_t sym_hi[NSYM] = {20, 10, SJ_EX_INF, 64, -1};
static const int64_t sym_hint[NSYM] = {3, 5, 7, 16, -2};

/* The tree's value in 128 bits; *ovf set when a node leaves int64. */
static __int128 ref_eval(const forest *f, int i, const int64_t *v, bool *ovf) {
    const tnode *t = &f->t[i];
    __int128 a = 0, b = 0, r = 0;
    if (t->op == T_CONST)
        return t->c;
    if (t->op == T_SYM)
        return v[t->c];
    a = ref_eval(f, t->a, v, ovf);
    b = ref_eval(f, t->b, v, ovf);
    switch (t->op) {
    case T_ADD: r = a + b; break;
    case T_SUB: r = a - b; break;
    case T_MUL: r = a * b; break;
    case T_DIV: r = ref_floordiv(a, b); break;
    case T_MOD: r = ref_mod(a, b); break;
    case T_MIN: r = a < b ? a : b; break;
    case T_MAX: r = a > b ? a : b; break;
    }
    if (r < INT64_MIN || r > INT64_MAX) {
        *ovf = true;
        r = 0;
    }
    return r;
}

static sj_expr build_op(sj_exprs *p, int op, sj_expr a, sj_expr b) {
    switch (op) {
    case T_ADD: return sj_ex_add(p, a, b);
    case T_SUB: return sj_ex_sub(p, a, b);
    case T_MUL: return sj_ex_mul(p, a, b);
    case T_DIV: return sj_ex_floordiv(p, a, b);
    case T_MOD: return sj_ex_mod(p, a, b);
    case T_MIN: return sj_ex_min(p, a, b);
    case T_MAX: return sj_ex_max(p, a, b);
    }
    fail();
    return SJ_EX_NONE;
}

/* A random tree of the given depth, built in the pool along the way. */
static int gen(forest *f, sj_exprs *p, int depth, sj_expr *id) {
    assert_true(f->n < MAXT);
    int i = f->n++;
    tnode *t = &f->t[i];
    if (depth == 0 || rnd() % 5 == 0) {
        if (rnd() % 3 == 0) {
            t->op = T_CONST;
            t->c = rnd() % 8 == 0 ? rnd_in(-1000, 1000) : rnd_in(-8, 8);
            *id = sj_ex_const(p, t->c);
        } else {
            t->op = T_SYM;
            t->c = rnd_in(0, NSYM - 1);
            *id = sj_ex_sym(p, (int)t->c);
        }
        return i;
    }
    static const int ops[] = {T_ADD, T_ADD, T_SUB, T_SUB, T_MUL, T_DIV, T_DIV,
                              T_MOD, T_MOD, T_MIN, T_MAX};
    sj_expr ea, eb;
    int op = ops[rnd() % (sizeof ops / sizeof ops[0])];
    int a = gen(f, p, depth - 1, &ea);
    int b = gen(f, p, op == T_MUL ? depth / 2 : depth - 1, &eb);
    t = &f->t[i];
    int64_t k;
    if ((op == T_DIV || op == T_MOD) && sj_ex_is_const(p, eb, &k) && k == 0) {
        /* a constant zero divisor: refused; use addition instead */
        assert_int_equal(build_op(p, op, ea, eb), SJ_EX_NONE);
        op = T_ADD;
    }
    t->op = op, t->a = a, t->b = b;
    *id = build_op(p, op, ea, eb);
    assert_int_not_equal(*id, SJ_EX_NONE);
    return i;
}

/* The same tree built another way: commutative operands swapped, a - b as
 * (-1)*b + a. Canonical forms make it the same id. */
static sj_expr build_mirror(const forest *f, sj_exprs *p, int i) {
    const tnode *t = &f->t[i];
    if (t->op == T_CONST)
        return sj_ex_const(p, t->c);
    if (t->op == T_SYM)
        return sj_ex_sym(p, (int)t->c);
    sj_expr a = build_mirror(f, p, t->a), b = build_mirror(f, p, t->b);
    switch (t->op) {
    case T_SUB: return sj_ex_add(p, sj_ex_mul(p, sj_ex_const(p, -1), b), a);
    case T_DIV:
    case T_MOD: return build_op(p, t->op, a, b);
    default: return build_op(p, t->op, b, a);
    }
}

static void random_values(int64_t *v) {
    for (int s = 0; s < NSYM; s++)
        v[s] = rnd_in(sym_lo[s], sym_hi[s] == SJ_EX_INF ? sym_lo[s] + 60 : sym_hi[s]);
}

static void test_random_trees(void **state) {
    static forest f;
    enum { BATCHES = 150, TREES = 25, VALUES = 12 };
    int64_t *out = NULL;
    long checked = 0, skipped = 0;
    for (int batch = 0; batch < BATCHES; batch++) {
        sj_exprs *p = sj_exprs_create();
        for (int s = 0; s < NSYM; s++)
            assert_int_equal(sj_sym_new(p, sym_hint[s], sym_lo[s], sym_hi[s]), s);
        int roots[TREES];
        sj_expr ids[TREES];
        f.n = 0;
        for (int k = 0; k < TREES; k++) {
            roots[k] = gen(&f, p, 1 + (int)(rnd() % 5), &ids[k]);
            assert_int_equal(build_mirror(&f, p, roots[k]), ids[k]);
        }
        assert_true(sj_ex_check(p));
        int n = sj_ex_count(p);
        out = realloc(out, (size_t)n * sizeof *out);
        assert_non_null(out);
        for (int r = 0; r <= VALUES; r++) {
            int64_t v[NSYM];
            if (r == VALUES) /* the hints, last */
                memcpy(v, sym_hint, sizeof v);
            else
                random_values(v);
            bool any_ovf = false;
            sj_ex_eval_all(p, v, out);
            for (int k = 0; k < TREES; k++) {
                bool ovf = false;
                __int128 want = ref_eval(&f, roots[k], v, &ovf);
                any_ovf |= ovf;
                if (ovf) {
                    skipped++;
                    continue;
                }
                checked++;
                int64_t got = sj_ex_eval(p, ids[k], v);
                if ((__int128)got != want) {
                    char buf[512];
                    sj_ex_print(p, ids[k], buf, sizeof buf);
                    fail_msg("tree %d of batch %d: %s = %" PRId64 ", want %" PRId64, k, batch,
                             buf, got, (int64_t)want);
                }
                assert_int_equal(out[ids[k]], got);
                if (r == VALUES)
                    assert_int_equal(sj_ex_hint(p, ids[k]), got);
            }
            /* every node: eval_all agrees with eval, and lies in its range */
            for (int id = 0; id < n; id++) {
                assert_int_equal(out[id], sj_ex_eval(p, id, v));
                int64_t lo, hi;
                sj_ex_range(p, id, &lo, &hi);
                if (!any_ovf && (out[id] < lo || out[id] > hi)) {
                    char buf[512];
                    sj_ex_print(p, id, buf, sizeof buf);
                    fail_msg("%s = %" PRId64 " outside [%" PRId64 ", %" PRId64 "]", buf, out[id],
                             lo, hi);
                }
            }
        }
        sj_exprs_destroy(p);
    }
    free(out);
    assert_true(checked > 30000);
    assert_true(skipped < checked / 20);
}

/* Zero divisors at run time, negative operands, and INT64_MIN // -1: the
 * pool's evaluation matches the reference and never traps. */
static void test_eval_edges(void **state) {
    sj_exprs *p = sj_exprs_create();
    sj_sym_new(p, 1, INT64_MIN, SJ_EX_INF);
    sj_sym_new(p, 1, INT64_MIN, SJ_EX_INF);
    sj_expr a = sj_ex_sym(p, 0), b = sj_ex_sym(p, 1);
    sj_expr d = sj_ex_floordiv(p, a, b), m = sj_ex_mod(p, a, b);
    static const int64_t vals[] = {0, 1, -1, 2, -2, 7, -7, 3, -3, INT64_MIN, INT64_MAX};
    for (size_t i = 0; i < sizeof vals / sizeof vals[0]; i++) {
        for (size_t j = 0; j < sizeof vals / sizeof vals[0]; j++) {
            int64_t v[2] = {vals[i], vals[j]};
            __int128 q = ref_floordiv(v[0], v[1]), r = ref_mod(v[0], v[1]);
            if (q > INT64_MAX) /* INT64_MIN // -1 wraps */
                q = INT64_MIN;
            assert_true(sj_ex_eval(p, d, v) == (int64_t)q);
            assert_true(sj_ex_eval(p, m, v) == (int64_t)r);
        }
    }
    sj_exprs_destroy(p);
}

/* -- Large pools --------------------------------------------------------- */

static void test_big_pool(void **state) {
    enum { N = 5000 };
    sj_exprs *p = sj_exprs_create();
    sj_sym_new(p, 100, 1, SJ_EX_INF);
    sj_sym_new(p, 7, 1, 1000);
    sj_expr s0 = sj_ex_sym(p, 0), s1 = sj_ex_sym(p, 1);
    static sj_expr e[N], q[N], m[N];
    for (int i = 0; i < N; i++) {
        e[i] = sj_ex_add(p, sj_ex_mul(p, C(p, i), s0), sj_ex_mul(p, s1, C(p, i % 13)));
        q[i] = sj_ex_floordiv(p, e[i], C(p, 3 + i % 5));
        m[i] = sj_ex_min(p, sj_ex_mod(p, e[i], s1), C(p, i));
        assert_true(e[i] != SJ_EX_NONE && q[i] != SJ_EX_NONE && m[i] != SJ_EX_NONE);
    }
    int count = sj_ex_count(p);
    assert_true(count > 3 * N);
    for (int i = 0; i < N; i += 7) { /* the same again: found, not added */
        assert_int_equal(sj_ex_add(p, sj_ex_mul(p, s1, C(p, i % 13)), sj_ex_mul(p, s0, C(p, i))),
                         e[i]);
        assert_int_equal(sj_ex_floordiv(p, e[i], C(p, 3 + i % 5)), q[i]);
    }
    assert_int_equal(sj_ex_count(p), count);
    assert_true(sj_ex_check(p));
    int64_t *out = malloc((size_t)count * sizeof *out);
    assert_non_null(out);
    for (int r = 0; r < 5; r++) {
        int64_t v[2] = {rnd_in(1, 100000), rnd_in(1, 1000)};
        sj_ex_eval_all(p, v, out);
        for (int i = 0; i < N; i++) {
            int64_t ev = (int64_t)i * v[0] + v[1] * (i % 13);
            int64_t em = ev % v[1] < i ? ev % v[1] : i;
            assert_int_equal(out[e[i]], ev);
            assert_int_equal(out[q[i]], ev / (3 + i % 5));
            assert_int_equal(out[m[i]], em);
            assert_int_equal(sj_ex_eval(p, m[i], v), em);
        }
    }
    free(out);
    sj_exprs_destroy(p);
}

/* Deep nesting with shared operands: without care, evaluating this DAG
 * visits 2^depth paths. */
static void test_deep_dag(void **state) {
    sj_exprs *p = sj_exprs_create();
    sj_sym_new(p, 3, 0, 1000);
    sj_sym_new(p, 5, 0, 1000);
    sj_expr x = sj_ex_sym(p, 0), y = sj_ex_sym(p, 1);
    int64_t v[2] = {3, 5}, want = 3;
    for (int i = 0; i < 200; i++) { /* x = (max(x, y) + min(x, y)) % 1000, y += 1 */
        sj_expr hi = sj_ex_max(p, x, y), lo = sj_ex_min(p, x, y);
        x = sj_ex_mod(p, sj_ex_add(p, hi, lo), C(p, 1000));
        y = sj_ex_add(p, y, C(p, 1));
        want = (want + v[1] + i) % 1000;
    }
    assert_false(sj_ex_is_const(p, x, NULL));
    assert_int_equal(sj_ex_eval(p, x, v), want);
    assert_int_equal(sj_ex_hint(p, x), want);
    sj_exprs_destroy(p);
}

/* -- Allocation failure ------------------------------------------------- */

/* A fixed sequence of builds that grows every array of the pool (nodes,
 * terms, factors, the hash table) and the temporary polynomials. */
static int workload(sj_exprs *p, sj_expr *out) {
    int n = 0;
    int x = sj_sym_new(p, 10, 1, SJ_EX_INF), y = sj_sym_new(p, 3, 0, 7);
    sj_expr a = sj_ex_sym(p, x), b = sj_ex_sym(p, y);
    sj_expr s = sj_ex_add(p, sj_ex_add(p, a, b), C(p, 1));
    out[n++] = sj_ex_mul(p, sj_ex_mul(p, s, s), s); /* 10 terms */
    for (int i = 0; i < 40; i++) {
        sj_expr prev = out[n - 1];
        sj_expr q = sj_ex_floordiv(p, sj_ex_add(p, prev, C(p, i)), C(p, 2 + i % 5));
        sj_expr m = sj_ex_mod(p, sj_ex_mul(p, q, sj_ex_add(p, a, C(p, i))), C(p, 3 + i % 4));
        sj_expr mm = sj_ex_max(p, sj_ex_min(p, m, b), sj_ex_sub(p, a, C(p, i)));
        out[n++] = q;
        out[n++] = m;
        out[n++] = mm;
        out[n++] = sj_ex_floordiv(p, mm, sj_ex_add(p, b, C(p, 1)));
    }
    return x == 0 && y == 1 ? n : -n; /* negative: a symbol is missing */
}

static void test_alloc_failure(void **state) {
    enum { MAX_OUT = 256 };
    sj_expr ref_ids[MAX_OUT], ids[MAX_OUT];
    int64_t v[2] = {13, 5};
    sj_exprs *ref = sj_exprs_create();
    int nref = workload(ref, ref_ids);
    assert_true(nref > 100);
    bool completed = false;
    int failures_seen = 0;
    for (long k = 0; k < 100000 && !completed; k++) {
        sj_ex_fail_allocs_after(k);
        sj_exprs *p = sj_exprs_create();
        if (!p)
            continue;
        int n = workload(p, ids);
        sj_ex_fail_allocs_after(-1);
        completed = n == nref;
        for (int i = 0; i < (n < 0 ? -n : n); i++) {
            if (ids[i] == SJ_EX_NONE) {
                completed = false;
                failures_seen++;
                continue;
            }
            assert_true(ids[i] < sj_ex_count(p));
            if (n > 0)
                assert_int_equal(sj_ex_eval(p, ids[i], v), sj_ex_eval(ref, ref_ids[i], v));
        }
        assert_true(sj_ex_check(p));
        /* the pool stays usable: the same builds now succeed */
        if (n > 0) {
            assert_int_equal(workload(p, ids), -nref); /* the symbols are now 2 and 3 */
            assert_true(sj_ex_check(p));
        }
        sj_exprs_destroy(p);
    }
    sj_ex_fail_allocs_after(-1);
    assert_true(completed);
    assert_true(failures_seen > 50);
    sj_exprs_destroy(ref);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_destroy_null),   cmocka_unit_test(test_symbols),
        cmocka_unit_test(test_add_identities), cmocka_unit_test(test_mul_identities),
        cmocka_unit_test(test_floordiv_rules), cmocka_unit_test(test_mod_rules),
        cmocka_unit_test(test_minmax),         cmocka_unit_test(test_none_propagation),
        cmocka_unit_test(test_ranges),         cmocka_unit_test(test_hints),
        cmocka_unit_test(test_print),          cmocka_unit_test(test_print_c),
        cmocka_unit_test(test_print_order),
        cmocka_unit_test(test_random_trees),   cmocka_unit_test(test_eval_edges),
        cmocka_unit_test(test_big_pool),       cmocka_unit_test(test_deep_dag),
        cmocka_unit_test(test_alloc_failure),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
