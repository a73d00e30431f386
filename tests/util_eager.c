/* The cases of the eager kernel tests, shared by test_cpu_kernels and
 * test_cuda_eager: operands, their float64 references and the lists of
 * shapes and layouts each op runs at; see tests/util.h. A case list calls
 * the test's run function once per case, in a fixed order (so the random
 * inputs are the same from run to run); `cuda` adds the cases aimed at the
 * CUDA kernels' paths (vector bodies, grid-stride loops, a block per row)
 * and drops the few that only the CPU test runs. */
/* cmocka.h needs these first, in this order */
/* clang-format off */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
/* clang-format on */

#include "tests/util.h"

#include <math.h>
#include <string.h>

#define S(...) ((const int64_t[]){__VA_ARGS__})
#define NELEM(a) ((int)(sizeof(a) / sizeof((a)[0])))

enum { C = TU_CONTIG, GAP = TU_GAP, REV = TU_REV, REVGAP = TU_REVGAP };

const sj_dtype tu_floats[3] = {SJ_F32, SJ_F16, SJ_BF16};
const sj_dtype tu_numeric[5] = {SJ_F32, SJ_F16, SJ_BF16, SJ_I32, SJ_I64};
const sj_dtype tu_all[6] = {SJ_F32, SJ_F16, SJ_BF16, SJ_I32, SJ_I64, SJ_BOOL};

sj_tensor tu_filled(sj_tensor t) {
    tu_fill_random(&t);
    return t;
}

sj_tensor tu_random(sj_dtype dt, int rank, const int64_t *shape, int layout) {
    return tu_filled(tu_tensor_layout(dt, rank, shape, layout));
}

int tu_is_cmp(sj_op op) { return op >= SJ_OP_EQ && op <= SJ_OP_GE; }

/* -- Unary ------------------------------------------------------------------- */

const sj_op tu_unary_ops[12] = {SJ_OP_NEG,  SJ_OP_ABS,  SJ_OP_EXP,       SJ_OP_LOG,
                                SJ_OP_SQRT, SJ_OP_RSQRT, SJ_OP_TANH,     SJ_OP_SIGMOID,
                                SJ_OP_RELU, SJ_OP_GELU, SJ_OP_GELU_TANH, SJ_OP_SILU};

void tu_fill_unary_input(sj_op op, const sj_tensor *x) {
    if (op == SJ_OP_LOG || op == SJ_OP_SQRT || op == SJ_OP_RSQRT)
        tu_fill_range(x, 0.05, 4.0);
    else
        tu_fill_random(x);
}

void tu_unary_cases(bool cuda, tu_unary_run run) {
    for (int o = 0; o < NELEM(tu_unary_ops); o++)
        for (int d = 0; d < NELEM(tu_numeric); d++) {
            sj_op op = tu_unary_ops[o];
            sj_dtype dt = tu_numeric[d];
            if ((dt == SJ_I32 || dt == SJ_I64) && !(op == SJ_OP_NEG || op == SJ_OP_ABS || op == SJ_OP_RELU))
                continue;
            run(op, dt, 3, S(3, 5, 37), C, C);
            if (cuda) run(op, dt, 1, S(4099), C, C); /* vector body and tail */
            run(op, dt, 3, S(3, 5, 37), REV, GAP);
            if (cuda) run(op, dt, 3, S(7, 40, 45), REV, GAP); /* several grid-stride steps */
            run(op, dt, 2, S(300, 2), GAP, REV);
            if (cuda) {
                run(op, dt, 8, S(2, 1, 3, 2, 1, 2, 3, 5), REVGAP, C);
                run(op, dt, 8, S(2, 2, 3, 2, 1, 2, 3, 5), C, C);
            }
            run(op, dt, 0, NULL, C, C);
            run(op, dt, 2, S(4, 0), C, C);
            run(op, dt, 1, S(1), GAP, GAP);
        }
}

const double tu_special_values[18] = {NAN,  INFINITY, -INFINITY, 0.0,   -0.0, 1e-30, -1e-30, 100.0, -100.0,
                                      88.5, -88.5,    1e30,      -1e30, 0.5,  -3.0,  9.0,    20.0,  -20.0};

sj_tensor tu_special_tensor(void) {
    int64_t n = NELEM(tu_special_values);
    sj_tensor x = tu_tensor(SJ_F32, 1, &n);
    tu_set_all(&x, tu_special_values);
    return x;
}

int tu_special_ok(double got, double want) {
    return isnan(want)   ? isnan(got)
           : isinf(want) ? got == want
                         : fabs(got - want) <= 1e-6 * fmax(fabs(want), 1.0);
}

/* -- Binary, comparisons, where ------------------------------------------------ */

void tu_binary_cases(bool cuda, tu_binary_run run) {
    for (int op = SJ_OP_ADD; op <= SJ_OP_GE; op++)
        for (int d = 0; d < NELEM(tu_numeric); d++) {
            sj_dtype dt = tu_numeric[d];
            if (op == SJ_OP_POW && (dt == SJ_I32 || dt == SJ_I64))
                continue; /* test_int_semantics */
            const int64_t *ys = S(4, 33);
            run(op, dt, 2, ys, 2, ys, C, 2, ys, C, C);
            if (cuda) run(op, dt, 1, S(1030), 1, S(1030), C, 0, NULL, C, C);
            run(op, dt, 2, ys, 0, NULL, C, 2, ys, C, C); /* scalar */
            run(op, dt, 2, ys, 2, ys, C, 0, NULL, C, C);
            run(op, dt, 2, ys, 2, ys, C, 1, S(33), C, C);   /* row */
            run(op, dt, 2, ys, 2, S(4, 1), C, 2, ys, C, C); /* column */
            run(op, dt, 2, ys, 2, S(4, 1), C, 2, S(1, 33), C, C);
            run(op, dt, 2, ys, 2, ys, REV, 2, ys, GAP, REVGAP); /* strided */
            run(op, dt, 3, S(2, 3, 300), 1, S(300), GAP, 3, S(2, 3, 300), REV, GAP);
            if (cuda) run(op, dt, 3, S(7, 40, 45), 3, S(7, 40, 45), REV, 2, S(40, 45), GAP, GAP);
            run(op, dt, 8, S(2, 2, 3, 2, 2, 2, 2, 3), 8, S(2, 1, 3, 1, 2, 2, 1, 3), GAP, 7, S(2, 1, 2, 1, 2, 2, 1),
                REV, GAP);
            run(op, dt, 0, NULL, 0, NULL, C, 0, NULL, C, C);
            run(op, dt, 2, S(0, 5), 2, S(0, 5), C, 1, S(5), C, C);
            run(op, dt, 2, S(3, 1), 2, S(3, 1), GAP, 2, S(1, 1), C, GAP);
        }
    for (int op = SJ_OP_EQ; op <= SJ_OP_GE; op++) { /* comparisons of bools */
        run(op, SJ_BOOL, 2, S(3, 40), 2, S(3, 40), C, 2, S(3, 40), GAP, C);
        if (cuda) run(op, SJ_BOOL, 2, S(3, 40), 2, S(3, 40), C, 2, S(3, 40), C, C);
        run(op, SJ_BOOL, 2, S(3, 40), 0, NULL, C, 1, S(40), C, REV);
    }
}

double *tu_pow_operands(sj_dtype dt, sj_tensor *a, sj_tensor *b) {
    *a = tu_tensor_layout(dt, 1, S(50), C);
    *b = tu_tensor_layout(dt, 1, S(50), GAP);
    tu_fill_range(a, 0.1, 3.0);
    tu_fill_range(b, -3.0, 3.0);
    double *r = tu_refbuf(0, 50);
    tu_ref_binary(SJ_OP_POW, a, b, r);
    return r;
}

void tu_int_cases(sj_dtype dt, tu_ints_run run) {
    int64_t mn = dt == SJ_I32 ? INT32_MIN : INT64_MIN, mx = dt == SJ_I32 ? INT32_MAX : INT64_MAX;
    run(SJ_OP_DIV, dt, 8, S(7, -7, 7, -7, 5, 0, mn, -1), S(2, 2, -2, -2, 0, 0, -1, 3), S(3, -3, -3, 3, 0, 0, mn, 0));
    run(SJ_OP_POW, dt, 10, S(2, -2, 1, -1, -1, 0, 3, 0, 2, 5), S(3, 3, -1, -1, -2, -1, 0, 0, -3, 1),
        S(8, -8, 1, -1, 1, 0, 1, 1, 0, 5));
    run(SJ_OP_ADD, dt, 2, S(mx, mn), S(1, -1), S(mn, mx));
    run(SJ_OP_SUB, dt, 1, S(mn), S(1), S(mx));
    run(SJ_OP_MUL, dt, 2, S(mx, -3), S(2, -4), S(-2, 12));
    run(SJ_OP_MAXIMUM, dt, 2, S(mn, -3), S(mx, -4), S(mx, -3));
    run(SJ_OP_MINIMUM, dt, 2, S(mn, -3), S(mx, -4), S(mn, -4));
}

void tu_nan_binary_cases(tu_nan_run run) {
    for (int d = 0; d < NELEM(tu_floats); d++) {
        int64_t n = 40;
        sj_tensor a = tu_tensor(tu_floats[d], 1, &n), s = tu_tensor(tu_floats[d], 0, NULL);
        tu_fill_random(&a);
        tu_set(&a, 3, NAN);
        tu_set(&s, 0, NAN);
        sj_tensor b = tu_broadcast(&s, 1, &n);
        for (int op = SJ_OP_ADD; op <= SJ_OP_GE; op++) {
            if (op == SJ_OP_POW)
                continue;
            for (int side = 0; side < 2; side++) {
                double *r = tu_refbuf(0, n);
                tu_ref_binary(op, side ? &b : &a, side ? &a : &b, r);
                run(op, tu_floats[d], &a, &s, side, r);
            }
        }
    }
}

double *tu_where_case(sj_dtype dt, int c, int lb, sj_tensor *st, sj_tensor *v, int *ly) {
    /* c and a: full, scalar c with a row, column c with scalar a, strided */
    const int64_t *ys = S(5, 70);
    const int rc[] = {2, 0, 2, 2}, lc[] = {C, C, REV, GAP};
    const int ra[] = {2, 1, 0, 2}, la[] = {C, GAP, C, REV};
    const int lys[] = {C, C, REVGAP, GAP};
    const int64_t *cs[] = {ys, NULL, S(5, 1), ys}, *as[] = {ys, S(70), NULL, ys};
    st[0] = tu_random(SJ_BOOL, rc[c], cs[c], lc[c]);
    st[1] = tu_random(dt, ra[c], as[c], la[c]);
    st[2] = tu_random(dt, 2, ys, lb);
    for (int i = 0; i < 3; i++) v[i] = tu_broadcast(&st[i], 2, ys);
    *ly = lys[c];
    double *r = tu_refbuf(0, 5 * 70);
    tu_ref_where(&v[0], &v[1], &v[2], r);
    return r;
}

/* -- Copy and cast --------------------------------------------------------------- */

void tu_fill_cast_input(const sj_tensor *x) {
    if (x->dtype == SJ_BOOL || x->dtype == SJ_I32 || x->dtype == SJ_I64)
        tu_fill_range(x, -300, 300);
    else
        tu_fill_random(x);
}

static const double cast_specials[17] = {NAN,           INFINITY, -INFINITY, 3e9,     -3e9, 1e19,
                                         -1e19,         2.7,      -2.7,      0.5,     -0.0, 2147483520.0,
                                         -2147483648.0, 65519.0,  65520.0,   70000.0, 1e-8};

sj_tensor tu_cast_specials(sj_dtype dt) {
    int64_t n = NELEM(cast_specials);
    sj_tensor x = tu_tensor(dt, 1, &n);
    tu_set_all(&x, cast_specials);
    return x;
}

sj_tensor tu_cast_int_specials(void) {
    sj_tensor x = tu_tensor(SJ_I64, 1, S(6));
    tu_seti_all(&x, S(INT64_MAX, INT64_MIN, 4294967297LL, 65519, 70000, -1));
    return x;
}

void tu_transposed_copy_cases(tu_copy_run run) {
    const int64_t shapes[][3] = {{3, 37, 45}, {1, 70, 9}, {2, 8, 8}, {1, 1, 5}, {2, 17, 1}};
    for (int d = 0; d < NELEM(tu_all); d++)
        for (int s = 0; s < NELEM(shapes); s++)
            for (int v = 0; v < 4; v++) {
                const int64_t *sh = shapes[s];
                sj_tensor x0 = tu_random(tu_all[d], 3, S(sh[0], sh[2], sh[1]), (v & 1) ? GAP : C);
                sj_tensor x = tu_transpose(&x0, 1, 2);
                /* y: contiguous, or rows padded by 3 (a view of a wider one) */
                sj_tensor y = tu_tensor(tu_all[d], 3, S(sh[0], sh[1], sh[2] + ((v & 2) ? 3 : 0)));
                y.shape[2] = sh[2];
                double *r = tu_refbuf(0, tu_numel(&y));
                tu_ref_cast(&x, tu_all[d], r);
                const char *what = tu_label("transposed copy %d shape %d v %d", tu_all[d], s, v);
                run(&x0, &x, &y, what);
                assert_true(tu_check(&y, r, 0, what));
                y.shape[2] = sh[2] + ((v & 2) ? 3 : 0); /* the padding is still poison */
                for (int64_t i = 0; i < tu_numel(&y); i++)
                    assert_true(tu_is_poison(&y, i) == (i % y.shape[2] >= sh[2]));
            }
}

/* -- Reductions, softmax, norms ------------------------------------------------------ */

int tu_reduce_shape(int rank, const int64_t *shape, int axis, int64_t *ys) {
    int ax = axis < 0 ? axis + rank : axis;
    memcpy(ys, shape, (size_t)rank * sizeof *ys);
    ys[ax] = 1;
    return ax;
}

void tu_reduce_cases(bool cuda, tu_reduce_run run) {
    for (int op = SJ_OP_SUM; op <= SJ_OP_AMAX; op++)
        for (int d = 0; d < NELEM(tu_numeric); d++) {
            sj_dtype dt = tu_numeric[d];
            if (op == SJ_OP_MEAN && (dt == SJ_I32 || dt == SJ_I64))
                continue;
            for (int axis = -1; axis < 3; axis++)
                for (int lay = 0; lay < TU_LAYOUTS; lay++) run(op, dt, 3, S(3, 20, 37), axis, lay, 3 - lay);
            run(op, dt, 2, S(7, 300), 0, C, C); /* rows accumulated (CUDA: the col kernel) */
            if (cuda) {
                run(op, dt, 2, S(3000, 40), 0, C, C); /* col, 32 warps */
                run(op, dt, 2, S(3, 5000), 1, C, GAP); /* a block per row */
                run(op, dt, 1, S(20000), 0, GAP, C);
            }
            run(op, dt, 1, S(1000), 0, GAP, C);
            run(op, dt, 1, S(1), 0, C, C);
            run(op, dt, 2, S(0, 4), 1, C, C); /* no outputs */
            if (cuda) run(op, dt, 5, S(2, 3, 4, 5, 6), 2, REVGAP, GAP);
            if (op != SJ_OP_AMAX) { /* empty axis: 0, or NaN */
                if (!cuda) {
                    run(op, dt, 3, S(3, 0, 2), 1, C, C);
                    run(op, dt, 1, S(0), 0, C, C);
                } else {
                    run(op, dt, 2, S(4, 0), 1, C, C);
                }
            }
        }
}

void tu_softmax_specials(const sj_tensor *x) {
    int64_t row = x->shape[x->rank - 1];
    if (tu_numel(x) < 3 * row)
        return;
    for (int64_t i = 0; i < row; i++) tu_set(x, i, -INFINITY);          /* all -inf */
    for (int64_t i = row; i < 2 * row; i += 2) tu_set(x, i, -INFINITY); /* some */
    tu_set(x, 2 * row + 1, NAN);
}

void tu_softmax_cases(bool cuda, tu_softmax_run run) {
    for (int d = 0; d < NELEM(tu_floats); d++) {
        sj_dtype dt = tu_floats[d];
        for (int axis = 0; axis < 3; axis++)
            for (int lay = 0; lay < TU_LAYOUTS; lay++) run(dt, 3, S(3, 4, 17), axis, lay, 3 - lay, 0);
        run(dt, 2, S(3, 300), 1, C, C, 1);
        run(dt, 2, S(3, 300), 1, GAP, REV, 1);
        if (cuda) {
            run(dt, 2, S(3, 300), 1, REV, C, 1);   /* col kernel, -inf and NaN */
            run(dt, 2, S(3, 3000), 1, C, GAP, 1); /* a block per row */
            run(dt, 2, S(600, 40), 0, C, C, 0);
        }
        run(dt, 2, S(4, 1), 1, C, C, 0);
        run(dt, 2, S(4, 0), 1, C, C, 0);
        run(dt, 1, S(1), 0, GAP, C, 0);
    }
}

double *tu_norm_operands(int rms, sj_dtype dt, int rank, const int64_t *shape, int lx, sj_tensor *x, sj_tensor *g,
                         sj_tensor *b, int with_g, int with_b) {
    int64_t n = shape[rank - 1];
    *x = tu_random(dt, rank, shape, lx);
    *g = tu_random(dt, 1, &n, GAP);
    *b = tu_random(dt, 1, &n, C);
    const sj_tensor *gp = with_g ? g : NULL, *bp = with_b ? b : NULL;
    double *r = tu_refbuf(0, tu_numel(x)), eps = 1e-5;
    if (rms)
        tu_ref_rms_norm(x, gp, eps, r);
    else
        tu_ref_layer_norm(x, gp, bp, eps, r);
    return r;
}

void tu_norm_cases(bool cuda, tu_norm_run run) {
    for (int rms = 0; rms < 2; rms++)
        for (int d = 0; d < NELEM(tu_floats); d++)
            for (int gb = 0; gb < 4; gb++) {
                int g = gb & 1, b = gb >> 1;
                if (rms && b)
                    continue;
                run(rms, tu_floats[d], 3, S(2, 3, 64), C, C, g, b);
                run(rms, tu_floats[d], 3, S(2, 3, 37), REV, GAP, g, b);
                run(rms, tu_floats[d], 2, S(3, 1), GAP, C, g, b);
                run(rms, tu_floats[d], 1, S(1000), C, REVGAP, g, b);
                if (cuda) run(rms, tu_floats[d], 2, S(3, 5000), GAP, C, g, b); /* a block per row */
                run(rms, tu_floats[d], 2, S(0, 8), C, C, g, b);
            }
}

/* -- Matmul, attention ------------------------------------------------------------- */

void tu_matmul_shapes(tu_mm_shapes *s, int nb, const int64_t *yb, const int64_t *ab, const int64_t *bb, int64_t M,
                      int64_t K, int64_t N, int ta, int tb, int ty) {
    memset(s, 0, sizeof *s);
    s->rank = nb + 2;
    for (int i = 0; i < nb; i++) s->a[i] = ab[i], s->b[i] = bb[i], s->y[i] = yb[i];
    s->a[nb] = ta ? K : M, s->a[nb + 1] = ta ? M : K;
    s->b[nb] = tb ? N : K, s->b[nb + 1] = tb ? K : N;
    s->y[nb] = ty ? N : M, s->y[nb + 1] = ty ? M : N;
    memcpy(s->af, s->y, sizeof s->af);
    memcpy(s->bf, s->y, sizeof s->bf);
    s->af[nb] = M, s->af[nb + 1] = K, s->bf[nb] = K, s->bf[nb + 1] = N;
}

sj_tensor tu_matmul_view(const sj_tensor *t, int nb, int transposed) {
    return transposed ? tu_transpose(t, nb, nb + 1) : *t;
}

void tu_matmul_transposes(tu_matmul_run run, sj_dtype dt, int64_t M, int64_t K, int64_t N) {
    for (int v = 0; v < 16; v++)
        run(dt, 0, NULL, NULL, NULL, M, K, N, (v & 8) ? GAP : C, v & 1, (v & 8) ? C : GAP, (v >> 1) & 1,
            (v & 4) ? REVGAP : C, (v >> 2) & 1);
}

void tu_matmul_cases(bool cuda, tu_matmul_run run) {
    const int64_t mkn[][3] = {{3, 5, 4}, {1, 7, 1}, {5, 0, 3}, {1, 1, 1},    {17, 33, 9},
                              {0, 3, 4}, {4, 1, 6}, {6, 9, 1}, {64, 128, 40}};
    for (int d = 0; d < NELEM(tu_numeric); d++) {
        sj_dtype dt = tu_numeric[d];
        for (int s = 0; s < NELEM(mkn) - !cuda; s++) { /* the last: CUDA only */
            int64_t M = mkn[s][0], K = mkn[s][1], N = mkn[s][2];
            tu_matmul_transposes(run, dt, M, K, N);
            /* batches: full, broadcast on either side, b shared (folded into
             * M); the last (all column-major): CUDA only */
            const int64_t *ab[] = {S(2, 3), S(2, 3), S(2, 1), S(2, 3), S(2, 3), S(2, 3)};
            const int64_t *bb[] = {S(2, 3), S(1, 3), S(2, 3), S(1, 1), S(1, 1), S(2, 3)};
            const int lays[][6] = {{0, 0, 0, 0, 0, 0}, {GAP, 1, 0, 0, 0, 0}, {0, 0, 0, 1, GAP, 0},
                                   {0, 0, 0, 0, 0, 0}, {0, 0, REV, 1, 0, 1}, {REV, 0, REV, 0, REV, 0}};
            for (int c = 0; c < NELEM(lays) - !cuda; c++)
                run(dt, 2, S(2, 3), ab[c], bb[c], M, K, N, lays[c][0], lays[c][1], lays[c][2], lays[c][3],
                    lays[c][4], lays[c][5]);
            run(dt, 1, S(4), S(1), S(1), M, K, N, C, 0, C, 0, C, 0);
            if (cuda) run(dt, 3, S(2, 1, 3), S(2, 1, 1), S(1, 1, 3), M, K, N, GAP, 0, C, 1, C, 0);
        }
        /* rank 8 with a stride that stops the batch axes from merging */
        if (cuda)
            run(dt, 6, S(2, 1, 2, 1, 1, 3), S(2, 1, 2, 1, 1, 3), S(1, 1, 2, 1, 1, 1), 5, 6, 7, GAP, 0, C, 0, REV, 0);
    }
}

int64_t tu_matmul_wrap_case(sj_dtype dt, sj_tensor *a, sj_tensor *b, sj_tensor *y) {
    *a = tu_tensor(dt, 2, S(1, 2));
    *b = tu_tensor(dt, 2, S(2, 1));
    *y = tu_tensor(dt, 2, S(1, 1));
    tu_seti_all(a, S(100000, 3));
    tu_seti_all(b, S(300000, 7));
    return dt == SJ_I64 ? 30000000021LL : -64771051;
}

/* lay 1: [B, S, H, D] in memory; lay 3: [B, H, D, S] (column-major
 * matrices); lay 2: every axis padded */
static const int *attention_order(int lay) {
    static const int perm[4] = {0, 2, 1, 3}, cols[4] = {0, 1, 3, 2};
    return lay == 1 ? perm : lay == 3 ? cols : NULL;
}

sj_tensor tu_attention_out(sj_dtype dt, int64_t B, int64_t H, int64_t Sq, int64_t Dv, int lay) {
    return tu_tensor_strided(dt, 4, S(B, H, Sq, Dv), attention_order(lay), lay == 2);
}

void tu_attention_case(tu_attention *a, sj_dtype dt, int64_t B, int64_t H, int64_t Sq, int64_t Sk, int64_t D,
                       int64_t Dv, const int64_t *lens, sj_dtype ldt, int ll, int causal, int lay) {
    const int *order = attention_order(lay);
    a->q = tu_filled(tu_tensor_strided(dt, 4, S(B, H, Sq, D), order, lay == 2));
    a->k = tu_filled(tu_tensor_strided(dt, 4, S(B, H, Sk, D), order, 0));
    a->v = tu_filled(tu_tensor_strided(dt, 4, S(B, H, Sk, Dv), NULL, lay == 2));
    a->y = tu_attention_out(dt, B, H, Sq, Dv, lay);
    a->l = tu_tensor_layout(ldt, 1, &B, ll);
    if (lens)
        tu_seti_all(&a->l, lens);
    a->lp = lens ? &a->l : NULL;
    a->scale = 1.0 / sqrt((double)(D ? D : 1));
    a->ref = tu_refbuf(0, tu_numel(&a->y));
    a->mag = tu_refbuf(1, tu_numel(&a->y));
    tu_ref_attention(&a->q, &a->k, &a->v, a->lp, a->scale, causal, a->ref, a->mag);
}

void tu_attention_cases(bool cuda, tu_attention_run run) {
    for (int d = 0; d < NELEM(tu_floats); d++) {
        sj_dtype dt = tu_floats[d];
        for (int causal = 0; causal < 2; causal++)
            for (int lay = 0; lay < 4; lay++) {
                run(dt, 2, 3, 5, 7, 8, 6, NULL, SJ_I32, causal, lay);
                run(dt, 2, 3, 5, 7, 8, 6, S(3, 9), SJ_I32, causal, lay);
                run(dt, 3, 2, 7, 7, 4, 4, S(0, 7, -2), SJ_I64, causal, lay);
                run(dt, 1, 2, 9, 4, 5, 3, S(3), SJ_I64, causal, lay); /* Sq > Sk */
                run(dt, 2, 1, 70, 90, 16, 8, S(50, 90), SJ_I32, causal, lay);
                run(dt, 1, 1, 3, 0, 4, 2, NULL, SJ_I32, causal, lay); /* no keys */
                run(dt, 1, 1, 3, 5, 0, 2, NULL, SJ_I32, causal, lay); /* D = 0 */
                run(dt, 1, 1, 1, 1, 1, 1, NULL, SJ_I32, causal, lay);
                run(dt, 1, 2, 0, 5, 4, 2, NULL, SJ_I32, causal, lay);
            }
        if (cuda) { /* several key chunks, large heads, shared memory past 48 KiB */
            run(dt, 1, 2, 20, 300, 64, 64, S(257), SJ_I64, 1, 0);
            run(dt, 2, 1, 4, 130, 256, 256, S(130, 65), SJ_I32, 0, 1);
            run(dt, 1, 1, 2, 3, 16, 12300, NULL, SJ_I32, 0, 0);
            /* head sizes in multiples of 16 (f16 and bf16 on tensor cores): several
             * query blocks and key tiles, partial ones, every layout, lengths and
             * causal masks that leave some queries no key */
            for (int causal = 0; causal < 2; causal++)
                for (int lay = 0; lay < 4; lay++) run(dt, 2, 3, 70, 130, 64, 64, S(100, 130), SJ_I32, causal, lay);
            run(dt, 1, 2, 1, 77, 32, 16, NULL, SJ_I32, 0, 0);            /* one query */
            run(dt, 1, 2, 90, 40, 16, 32, S(40), SJ_I64, 1, 1);          /* Sq > Sk, causal */
            run(dt, 2, 1, 64, 64, 128, 128, S(0, 64), SJ_I32, 0, 2);     /* a batch with no key */
            run(dt, 1, 1, 200, 300, 48, 80, NULL, SJ_I32, 1, 3);
            /* D = Dv = 32, 64, 96, 128 (the register kernels): one query;
             * several query blocks and key tiles, partial ones, causal */
            run(dt, 1, 2, 1, 77, 64, 64, NULL, SJ_I32, 0, 0);
            run(dt, 1, 1, 150, 200, 128, 128, S(180), SJ_I64, 1, 3);
            run(dt, 2, 2, 100, 150, 32, 32, S(150, 90), SJ_I32, 1, 1);
            run(dt, 1, 3, 70, 70, 96, 96, NULL, SJ_I64, 0, 2);
        }
    }
}

/* -- Concat, gather ----------------------------------------------------------------- */

void tu_concat_cases(tu_concat_run run) {
    for (int d = 0; d < NELEM(tu_all); d++)
        for (int axis = 0; axis < 3; axis++)
            for (int lay = 0; lay < TU_LAYOUTS; lay++) {
                const int64_t sizes[4] = {2, 0, 5, 1};
                sj_tensor xs[4];
                int64_t ys[3] = {3, 4, 6};
                ys[axis] = 8;
                for (int i = 0; i < 4; i++) {
                    int64_t s[3] = {3, 4, 6};
                    s[axis] = sizes[i];
                    xs[i] = tu_random(tu_all[d], 3, s, (lay + i) % TU_LAYOUTS);
                }
                double *r = tu_refbuf(0, ys[0] * ys[1] * ys[2]);
                tu_ref_concat(xs, 4, axis, r);
                run(tu_all[d], axis, lay, xs, ys, r);
            }
}

double *tu_gather_operands(sj_dtype dt, sj_dtype idt, int tr, const int64_t *ts, int ir, const int64_t *is, int lt,
                           sj_tensor *t, sj_tensor *idx, int64_t *ys) {
    int64_t n = 1;
    for (int i = 0; i < ir; i++) ys[i] = is[i];
    for (int i = 1; i < tr; i++) ys[ir + i - 1] = ts[i];
    for (int i = 0; i < ir + tr - 1; i++) n *= ys[i];
    *t = tu_random(dt, tr, ts, lt);
    *idx = tu_tensor_layout(idt, ir, is, lt);
    tu_fill_range(idx, 0, (double)ts[0] - 1);
    double *r = tu_refbuf(0, n);
    tu_ref_gather(t, idx, r);
    return r;
}

void tu_gather_cases(tu_gather_run run) {
    for (int d = 0; d < NELEM(tu_all); d++)
        for (int lay = 0; lay < TU_LAYOUTS; lay++) {
            run(tu_all[d], SJ_I32, 2, S(10, 4), 2, S(2, 3), lay, 3 - lay);
            run(tu_all[d], SJ_I64, 2, S(10, 4), 0, NULL, lay, lay);
            run(tu_all[d], SJ_I64, 1, S(7), 3, S(2, 2, 3), lay, lay);
            run(tu_all[d], SJ_I32, 3, S(5, 2, 3), 1, S(9), lay, 3 - lay);
            run(tu_all[d], SJ_I32, 2, S(5, 0), 1, S(4), lay, lay);
            run(tu_all[d], SJ_I64, 2, S(5, 3), 1, S(0), lay, lay);
        }
}

const int64_t tu_gather_bad[2][6] = {{1, 2, 3, 4, 10, 0}, {0, 0, 0, 0, 0, -1}};

/* -- The row max ------------------------------------------------------------- */

void tu_check_max_f32(float (*max)(const float *, int64_t), const char *what) {
    float x[100];
    const float special[] = {NAN, INFINITY, -INFINITY};
    for (int n = 0; n <= 100; n++) {
        for (int at = -1; at < n; at++)
            for (int sp = 0; sp < 3; sp++) {
                for (int i = 0; i < n; i++) x[i] = (float)((i * 37 + n * 11) % 101) * 0.37f - 20.0f;
                if (at >= 0) x[at] = special[sp];
                float want = -INFINITY;
                bool nan = false;
                for (int i = 0; i < n && !nan; i++) {
                    if (isnan(x[i])) nan = true;
                    else if (x[i] > want) want = x[i];
                }
                float got = max(x, n);
                if (nan ? !isnan(got) : got != want)
                    fail_msg("%s: max of %d floats, special %d at %d: got %g, want %g", what, n, sp, at, (double)got,
                             nan ? (double)NAN : (double)want);
                if (at < 0) break;
            }
    }
    for (int i = 0; i < 40; i++) x[i] = -INFINITY;
    if (max(x, 40) != -INFINITY) fail_msg("%s: max of 40 -inf is not -inf", what);
}
