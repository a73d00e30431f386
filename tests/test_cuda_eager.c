/* Eager CUDA kernels (kernels/cuda/eager_cuda.h) against the CPU eager
 * kernels and float64 references on random inputs: every op, every dtype it
 * takes, broadcast, strided and transposed operands, strided outputs, edge
 * sizes, ranks 0 to 8, f16/bf16, integer semantics, casts of every pair,
 * reductions over each axis, matmul through cuBLASLt, attention, concat and
 * gather with its error flag.
 *
 * Every device operand is a copy of a host view: the bytes of its span
 * (the gaps between elements included, 0xA5 from tu_tensor_strided) with
 * MARGIN bytes of 0xA5 on each side, at the same strides; every third copy
 * is shifted one element off the allocator's alignment. Outputs are copied
 * from their poisoned host views, so an element never written fails the
 * check, and the span and margins come back to prove nothing else was
 * written.
 *
 * Without a device (or built without CUDA) the program prints
 * "skipped: no CUDA device (<why>)" and exits 0. */
/* cmocka.h needs these first, in this order */
/* clang-format off */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
/* clang-format on */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jit/error.h"
#include "kernels/cpu/eager.h"
#include "tests/util.h"

#ifndef SJ_WITH_CUDA
int main(void) {
    printf("skipped: no CUDA device (built without CUDA)\n");
    return 0;
}
#else
#include "kernels/cuda/eager_cuda.h"

#define S(...) ((const int64_t[]){__VA_ARGS__})
#define NELEM(a) ((int)(sizeof(a) / sizeof((a)[0])))
#define MARGIN 256

static const sj_dtype FLOATS[] = {SJ_F32, SJ_F16, SJ_BF16};
static const sj_dtype NUMERIC[] = {SJ_F32, SJ_F16, SJ_BF16, SJ_I32, SJ_I64};
static const sj_dtype ALL[] = {SJ_F32, SJ_F16, SJ_BF16, SJ_I32, SJ_I64, SJ_BOOL};

static sj_cuda *dev;
static sj_cuda_exec ex;

enum { L_CONTIG = TU_CONTIG, L_GAP = TU_GAP, L_REV = TU_REV, L_REVGAP = TU_REVGAP, L_COUNT };
#define make tu_tensor_layout
#define label tu_label

static double *ref(int64_t n) { return tu_refbuf(0, n); }
static double *mag(int64_t n) { return tu_refbuf(1, n); }

static sj_tensor filled(sj_tensor t) {
    tu_fill_random(&t);
    return t;
}

static sj_tensor rnd(sj_dtype dt, int rank, const int64_t *shape, int lay) {
    return filled(make(dt, rank, shape, lay));
}

static int is_cmp(sj_op op) { return op >= SJ_OP_EQ && op <= SJ_OP_GE; }

/* -- Device copies ---------------------------------------------------------- */

typedef struct dbuf {
    CUdeviceptr base;
    size_t bytes, off, span;
} dbuf;

static dbuf *bufs;
static int nbufs, capbufs, tick;

static size_t esz(sj_dtype dt) { return dt == SJ_F32 || dt == SJ_I32 ? 4 : dt == SJ_I64 ? 8 : dt == SJ_BOOL ? 1 : 2; }

/* Bytes from t->data to the end of its last element (strides >= 0). */
static size_t span_of(const sj_tensor *t) {
    int64_t last = 0;
    if (tu_numel(t) == 0)
        return 0;
    for (int d = 0; d < t->rank; d++) last += (t->shape[d] - 1) * t->stride[d];
    return (size_t)(last + 1) * esz(t->dtype);
}

static sj_tensor to_dev_at(const sj_tensor *h, int shift) {
    size_t span = span_of(h), off = MARGIN + (size_t)shift * esz(h->dtype), bytes = off + span + MARGIN;
    CUdeviceptr p = sj_cuda_alloc(dev, bytes, ex.stream);
    assert_true(p != 0);
    char *host = malloc(bytes);
    assert_non_null(host);
    memset(host, 0xA5, bytes);
    if (span)
        memcpy(host + off, h->data, span);
    assert_int_equal(sj_cuda_to_device(dev, p, host, bytes), SJ_OK);
    free(host);
    if (nbufs == capbufs) {
        capbufs = capbufs ? 2 * capbufs : 256;
        bufs = realloc(bufs, (size_t)capbufs * sizeof *bufs);
        assert_non_null(bufs);
    }
    bufs[nbufs++] = (dbuf){p, bytes, off, span};
    sj_tensor d = *h;
    d.data = (void *)(uintptr_t)(p + off);
    d.device = SJ_CUDA;
    return d;
}

/* Every third copy one element off the alignment. */
static sj_tensor to_dev(const sj_tensor *h) { return to_dev_at(h, tick++ % 3 == 2); }

/* Uploads done (sj_cuda_to_device may return before its DMA lands), then
 * the kernels' stream drained. */
static void settle(void) { assert_int_equal(dev->api.CtxSynchronize(), CUDA_SUCCESS); }

static void sync_stream(void) {
    CUresult r = dev->api.StreamSynchronize(ex.stream);
    if (r != CUDA_SUCCESS) {
        const char *name = "?";
        dev->api.GetErrorName(r, &name);
        fprintf(stderr, "cuStreamSynchronize: %s\n", name);
    }
    assert_int_equal(r, CUDA_SUCCESS);
}

/* The device view d back into host view h (same layout); the margins
 * around its span must still be 0xA5. */
static void from_dev(const sj_tensor *d, const sj_tensor *h, const char *what) {
    const dbuf *b = NULL;
    for (int i = nbufs - 1; i >= 0 && !b; i--)
        if (bufs[i].base + bufs[i].off == (CUdeviceptr)(uintptr_t)d->data)
            b = &bufs[i];
    assert_non_null(b);
    unsigned char *host = malloc(b->bytes);
    assert_non_null(host);
    assert_int_equal(sj_cuda_to_host(dev, host, b->base, b->bytes), SJ_OK);
    int64_t bad = 0;
    for (size_t i = 0; i < b->bytes; i++)
        bad += (i < b->off || i >= b->off + b->span) && host[i] != 0xA5;
    if (bad)
        fprintf(stderr, "%s: %lld bytes written outside the output's span\n", what, (long long)bad);
    assert_int_equal(bad, 0);
    if (b->span)
        memcpy(h->data, host + b->off, b->span);
    free(host);
}

/* Launch status, then the stream drained and y brought back. */
static void finish(sj_status st, const sj_tensor *dy, const sj_tensor *y, const char *what) {
    if (st)
        fprintf(stderr, "%s: %s\n", what, sj_last_error());
    assert_int_equal(st, SJ_OK);
    sync_stream();
    from_dev(dy, y, what);
}

static int teardown(void **state) {
    sync_stream();
    for (int i = 0; i < nbufs; i++) sj_cuda_free(dev, bufs[i].base, ex.stream);
    nbufs = 0;
    tu_free_all();
    return 0;
}

/* y against the float64 reference r (magnitudes mg, or NULL) and against
 * the CPU kernel's output yc, within tol; nothing written around y. */
static void expect(const sj_tensor *y, const sj_tensor *yc, const double *r, const double *mg, double tol,
                   const char *what) {
    char w[600];
    snprintf(w, sizeof w, "%s", what);
    assert_true(tu_check_mag(y, r, mg, tol, w));
    assert_true(tu_check_gaps(y, w));
    if (!yc)
        return;
    int64_t n = tu_numel(y);
    double *cv = malloc((size_t)(n + 1) * sizeof *cv);
    assert_non_null(cv);
    for (int64_t i = 0; i < n; i++) cv[i] = tu_get(yc, i);
    strncat(w, " (vs CPU)", sizeof w - strlen(w) - 1);
    int ok = tu_check_mag(y, cv, mg, tol, w);
    free(cv);
    assert_true(ok);
}

/* An output host view and its twin for the CPU kernel. */
static sj_tensor out_like(sj_dtype dt, int rank, const int64_t *shape, int lay, sj_tensor *cpu) {
    *cpu = make(dt, rank, shape, lay);
    return make(dt, rank, shape, lay);
}

/* -- Unary ------------------------------------------------------------------ */

static const sj_op UNARY[] = {SJ_OP_NEG,  SJ_OP_ABS,   SJ_OP_EXP,       SJ_OP_LOG,
                              SJ_OP_SQRT, SJ_OP_RSQRT, SJ_OP_TANH,      SJ_OP_SIGMOID,
                              SJ_OP_RELU, SJ_OP_GELU,  SJ_OP_GELU_TANH, SJ_OP_SILU};

static void run_unary(sj_op op, sj_dtype dt, int rank, const int64_t *shape, int lx, int ly) {
    sj_tensor yc, x = make(dt, rank, shape, lx), y = out_like(dt, rank, shape, ly, &yc);
    if (op == SJ_OP_LOG || op == SJ_OP_SQRT || op == SJ_OP_RSQRT)
        tu_fill_range(&x, 0.05, 4.0);
    else
        tu_fill_random(&x);
    double *r = ref(tu_numel(&y));
    tu_ref_unary(op, &x, r);
    assert_int_equal(sj_cpu_unary(op, &x, &yc), SJ_OK);
    sj_tensor dx = to_dev(&x), dy = to_dev(&y);
    settle();
    const char *what = label("unary %s dtype %d rank %d lay %d/%d", sj_op_name(op), dt, rank, lx, ly);
    finish(sj_cuda_unary(&ex, op, &dx, &dy), &dy, &y, what);
    expect(&y, &yc, r, NULL, tu_tol(dt), what);
}

static void test_unary(void **state) {
    for (int o = 0; o < NELEM(UNARY); o++)
        for (int d = 0; d < NELEM(NUMERIC); d++) {
            sj_op op = UNARY[o];
            sj_dtype dt = NUMERIC[d];
            if ((dt == SJ_I32 || dt == SJ_I64) && !(op == SJ_OP_NEG || op == SJ_OP_ABS || op == SJ_OP_RELU))
                continue;
            run_unary(op, dt, 3, S(3, 5, 37), L_CONTIG, L_CONTIG);
            run_unary(op, dt, 1, S(4099), L_CONTIG, L_CONTIG); /* vector body and tail */
            run_unary(op, dt, 3, S(3, 5, 37), L_REV, L_GAP);
            run_unary(op, dt, 3, S(7, 40, 45), L_REV, L_GAP); /* several grid-stride steps */
            run_unary(op, dt, 2, S(300, 2), L_GAP, L_REV);
            run_unary(op, dt, 8, S(2, 1, 3, 2, 1, 2, 3, 5), L_REVGAP, L_CONTIG);
            run_unary(op, dt, 8, S(2, 2, 3, 2, 1, 2, 3, 5), L_CONTIG, L_CONTIG);
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
        sj_tensor y = tu_tensor(SJ_F32, 1, &n), yc = tu_tensor(SJ_F32, 1, &n);
        double *r = ref(n);
        tu_ref_unary(UNARY[o], &x, r);
        assert_int_equal(sj_cpu_unary(UNARY[o], &x, &yc), SJ_OK);
        sj_tensor dx = to_dev(&x), dy = to_dev(&y);
        settle();
        finish(sj_cuda_unary(&ex, UNARY[o], &dx, &dy), &dy, &y, "unary specials");
        /* |err| <= 1e-6 max(|want|, 1) against the rounded reference and
         * the CPU (the same functions; FMA contraction may move an ulp) */
        for (int64_t i = 0; i < n; i++) {
            double got = tu_get(&y, i), w = tu_round(SJ_F32, r[i]), cw = tu_get(&yc, i);
            int ok = isnan(w)   ? isnan(got)
                     : isinf(w) ? got == w
                                : fabs(got - w) <= 1e-6 * fmax(fabs(w), 1.0);
            ok &= isnan(cw) ? isnan(got) : isinf(cw) ? got == cw : fabs(got - cw) <= 1e-6 * fmax(fabs(cw), 1.0);
            if (!ok)
                fprintf(stderr, "%s x %g: %.9g, want %.9g (CPU %.9g)\n", sj_op_name(UNARY[o]), v[i], got, w, cw);
            assert_true(ok);
        }
    }
}

/* -- Binary and comparisons ------------------------------------------------- */

static void run_binary(sj_op op, sj_dtype dt, int rank, const int64_t *ys, int ra, const int64_t *as, int la,
                       int rb, const int64_t *bs, int lb, int ly) {
    sj_tensor a0 = rnd(dt, ra, as, la), b0 = rnd(dt, rb, bs, lb);
    sj_tensor a = tu_broadcast(&a0, rank, ys), b = tu_broadcast(&b0, rank, ys);
    sj_tensor yc, y = out_like(is_cmp(op) ? SJ_BOOL : dt, rank, ys, ly, &yc);
    double *r = ref(tu_numel(&y));
    tu_ref_binary(op, &a, &b, r);
    assert_int_equal(sj_cpu_binary(op, &a, &b, &yc), SJ_OK);
    sj_tensor da0 = to_dev(&a0), db0 = to_dev(&b0), dy = to_dev(&y);
    sj_tensor da = tu_broadcast(&da0, rank, ys), db = tu_broadcast(&db0, rank, ys);
    settle();
    const char *what = label("binary %s dtype %d rank %d", sj_op_name(op), dt, rank);
    finish(sj_cuda_binary(&ex, op, &da, &db, &dy), &dy, &y, what);
    expect(&y, &yc, r, NULL, is_cmp(op) ? 0 : tu_tol(dt), what);
}

static void test_binary(void **state) {
    for (int op = SJ_OP_ADD; op <= SJ_OP_GE; op++)
        for (int d = 0; d < NELEM(NUMERIC); d++) {
            sj_dtype dt = NUMERIC[d];
            if (op == SJ_OP_POW && (dt == SJ_I32 || dt == SJ_I64))
                continue; /* test_int_semantics */
            const int64_t *ys = S(4, 33);
            run_binary(op, dt, 2, ys, 2, ys, L_CONTIG, 2, ys, L_CONTIG, L_CONTIG);
            run_binary(op, dt, 1, S(1030), 1, S(1030), L_CONTIG, 0, NULL, L_CONTIG, L_CONTIG);
            run_binary(op, dt, 2, ys, 0, NULL, L_CONTIG, 2, ys, L_CONTIG, L_CONTIG); /* scalar */
            run_binary(op, dt, 2, ys, 2, ys, L_CONTIG, 0, NULL, L_CONTIG, L_CONTIG);
            run_binary(op, dt, 2, ys, 2, ys, L_CONTIG, 1, S(33), L_CONTIG, L_CONTIG);   /* row */
            run_binary(op, dt, 2, ys, 2, S(4, 1), L_CONTIG, 2, ys, L_CONTIG, L_CONTIG); /* column */
            run_binary(op, dt, 2, ys, 2, S(4, 1), L_CONTIG, 2, S(1, 33), L_CONTIG, L_CONTIG);
            run_binary(op, dt, 2, ys, 2, ys, L_REV, 2, ys, L_GAP, L_REVGAP); /* strided */
            run_binary(op, dt, 3, S(2, 3, 300), 1, S(300), L_GAP, 3, S(2, 3, 300), L_REV, L_GAP);
            run_binary(op, dt, 3, S(7, 40, 45), 3, S(7, 40, 45), L_REV, 2, S(40, 45), L_GAP, L_GAP);
            run_binary(op, dt, 8, S(2, 2, 3, 2, 2, 2, 2, 3), 8, S(2, 1, 3, 1, 2, 2, 1, 3), L_GAP, 7,
                       S(2, 1, 2, 1, 2, 2, 1), L_REV, L_GAP);
            run_binary(op, dt, 0, NULL, 0, NULL, L_CONTIG, 0, NULL, L_CONTIG, L_CONTIG);
            run_binary(op, dt, 2, S(0, 5), 2, S(0, 5), L_CONTIG, 1, S(5), L_CONTIG, L_CONTIG);
            run_binary(op, dt, 2, S(3, 1), 2, S(3, 1), L_GAP, 2, S(1, 1), L_CONTIG, L_GAP);
        }
    for (int op = SJ_OP_EQ; op <= SJ_OP_GE; op++) { /* comparisons of bools */
        run_binary(op, SJ_BOOL, 2, S(3, 40), 2, S(3, 40), L_CONTIG, 2, S(3, 40), L_GAP, L_CONTIG);
        run_binary(op, SJ_BOOL, 2, S(3, 40), 2, S(3, 40), L_CONTIG, 2, S(3, 40), L_CONTIG, L_CONTIG);
        run_binary(op, SJ_BOOL, 2, S(3, 40), 0, NULL, L_CONTIG, 1, S(40), L_CONTIG, L_REV);
    }
    for (int d = 0; d < NELEM(FLOATS); d++) { /* pow with a positive base, wider range */
        sj_tensor a = make(FLOATS[d], 1, S(50), L_CONTIG), b = make(FLOATS[d], 1, S(50), L_GAP);
        sj_tensor yc, y = out_like(FLOATS[d], 1, S(50), L_CONTIG, &yc);
        tu_fill_range(&a, 0.1, 3.0);
        tu_fill_range(&b, -3.0, 3.0);
        double *r = ref(50);
        tu_ref_binary(SJ_OP_POW, &a, &b, r);
        assert_int_equal(sj_cpu_binary(SJ_OP_POW, &a, &b, &yc), SJ_OK);
        sj_tensor da = to_dev(&a), db = to_dev(&b), dy = to_dev(&y);
        settle();
        finish(sj_cuda_binary(&ex, SJ_OP_POW, &da, &db, &dy), &dy, &y, "pow positive base");
        expect(&y, &yc, r, NULL, tu_tol(FLOATS[d]), "pow positive base");
    }
}

/* y = op(a, b) on given integers, contiguous and strided, against explicit
 * expectations. */
static void run_ints(sj_op op, sj_dtype dt, int64_t n, const int64_t *av, const int64_t *bv, const int64_t *want) {
    for (int lay = 0; lay < 2; lay++) {
        sj_tensor a = make(dt, 1, &n, lay ? L_GAP : L_CONTIG), b = tu_tensor(dt, 1, &n);
        sj_tensor y = make(dt, 1, &n, lay ? L_GAP : L_CONTIG);
        tu_seti_all(&a, av);
        tu_seti_all(&b, bv);
        sj_tensor da = to_dev(&a), db = to_dev(&b), dy = to_dev(&y);
        settle();
        finish(sj_cuda_binary(&ex, op, &da, &db, &dy), &dy, &y, "int semantics");
        for (int64_t i = 0; i < n; i++) {
            if (tu_geti(&y, i) != want[i])
                fprintf(stderr, "%s dtype %d: %lld, %lld -> %lld, want %lld\n", sj_op_name(op), dt,
                        (long long)av[i], (long long)bv[i], (long long)tu_geti(&y, i), (long long)want[i]);
            assert_true(tu_geti(&y, i) == want[i]);
        }
    }
}

static void test_int_semantics(void **state) {
    for (int d = 3; d < 5; d++) {
        sj_dtype dt = NUMERIC[d];
        int64_t mn = dt == SJ_I32 ? INT32_MIN : INT64_MIN, mx = dt == SJ_I32 ? INT32_MAX : INT64_MAX;
        run_ints(SJ_OP_DIV, dt, 8, S(7, -7, 7, -7, 5, 0, mn, -1), S(2, 2, -2, -2, 0, 0, -1, 3),
                 S(3, -3, -3, 3, 0, 0, mn, 0));
        run_ints(SJ_OP_POW, dt, 10, S(2, -2, 1, -1, -1, 0, 3, 0, 2, 5), S(3, 3, -1, -1, -2, -1, 0, 0, -3, 1),
                 S(8, -8, 1, -1, 1, 0, 1, 1, 0, 5));
        run_ints(SJ_OP_ADD, dt, 2, S(mx, mn), S(1, -1), S(mn, mx));
        run_ints(SJ_OP_SUB, dt, 1, S(mn), S(1), S(mx));
        run_ints(SJ_OP_MUL, dt, 2, S(mx, -3), S(2, -4), S(-2, 12));
        run_ints(SJ_OP_MAXIMUM, dt, 2, S(mn, -3), S(mx, -4), S(mx, -3));
        run_ints(SJ_OP_MINIMUM, dt, 2, S(mn, -3), S(mx, -4), S(mn, -4));
        /* neg/abs of the minimum wrap to the minimum */
        const sj_op ops[2] = {SJ_OP_NEG, SJ_OP_ABS};
        for (int o = 0; o < 2; o++) {
            sj_tensor x = tu_tensor(dt, 1, S(3)), y = tu_tensor(dt, 1, S(3));
            tu_seti_all(&x, S(mn, -4, 4));
            sj_tensor dx = to_dev(&x), dy = to_dev(&y);
            settle();
            finish(sj_cuda_unary(&ex, ops[o], &dx, &dy), &dy, &y, "int neg/abs");
            assert_true(tu_geti(&y, 0) == mn && tu_geti(&y, 1) == 4 && tu_geti(&y, 2) == (o ? 4 : -4));
        }
    }
    run_ints(SJ_OP_POW, SJ_I32, 1, S(3), S(21), S(1870418611)); /* 3^21 mod 2^32 */
    run_ints(SJ_OP_MUL, SJ_I32, 1, S(100000), S(300000), S(-64771072));
}

static void test_nan_binary(void **state) {
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
                sj_tensor yc, y = out_like(is_cmp(op) ? SJ_BOOL : FLOATS[d], 1, &n, L_CONTIG, &yc);
                const sj_tensor *l = side ? &b : &a, *r = side ? &a : &b;
                double *rf = ref(n);
                tu_ref_binary(op, l, r, rf);
                assert_int_equal(sj_cpu_binary(op, l, r, &yc), SJ_OK);
                sj_tensor da = to_dev(&a), ds = to_dev(&s), dy = to_dev(&y);
                sj_tensor db = tu_broadcast(&ds, 1, &n);
                settle();
                finish(sj_cuda_binary(&ex, op, side ? &db : &da, side ? &da : &db, &dy), &dy, &y, "nan binary");
                expect(&y, &yc, rf, NULL, is_cmp(op) ? 0 : tu_tol(FLOATS[d]), "nan binary");
            }
        }
    }
}

/* -- Where ------------------------------------------------------------------ */

static void test_where(void **state) {
    for (int d = 0; d < NELEM(ALL); d++) {
        const int64_t *ys = S(5, 70);
        const int rc[] = {2, 0, 2, 2}, lc[] = {L_CONTIG, L_CONTIG, L_REV, L_GAP};
        const int ra[] = {2, 1, 0, 2}, la[] = {L_CONTIG, L_GAP, L_CONTIG, L_REV};
        const int ly[] = {L_CONTIG, L_CONTIG, L_REVGAP, L_GAP};
        const int64_t *cs[] = {ys, NULL, S(5, 1), ys}, *as[] = {ys, S(70), NULL, ys};
        for (int c = 0; c < 4; c++) {
            sj_tensor c0 = rnd(SJ_BOOL, rc[c], cs[c], lc[c]), a0 = rnd(ALL[d], ra[c], as[c], la[c]);
            sj_tensor b0 = rnd(ALL[d], 2, ys, c ? L_REV : L_CONTIG), yc, y = out_like(ALL[d], 2, ys, ly[c], &yc);
            sj_tensor cc = tu_broadcast(&c0, 2, ys), a = tu_broadcast(&a0, 2, ys), b = tu_broadcast(&b0, 2, ys);
            double *r = ref(tu_numel(&y));
            tu_ref_where(&cc, &a, &b, r);
            assert_int_equal(sj_cpu_where(&cc, &a, &b, &yc), SJ_OK);
            sj_tensor dc0 = to_dev(&c0), da0 = to_dev(&a0), db0 = to_dev(&b0), dy = to_dev(&y);
            sj_tensor dc = tu_broadcast(&dc0, 2, ys), da = tu_broadcast(&da0, 2, ys), db = tu_broadcast(&db0, 2, ys);
            settle();
            const char *what = label("where dtype %d case %d", ALL[d], c);
            finish(sj_cuda_where(&ex, &dc, &da, &db, &dy), &dy, &y, what);
            expect(&y, &yc, r, NULL, 0, what);
        }
        sj_tensor e = make(ALL[d], 2, S(0, 3), L_CONTIG), ec = make(SJ_BOOL, 2, S(0, 3), L_CONTIG);
        sj_tensor de = to_dev(&e), dec = to_dev(&ec);
        assert_int_equal(sj_cuda_where(&ex, &dec, &de, &de, &de), SJ_OK);
    }
}

/* -- Copy and cast ---------------------------------------------------------- */

static void run_cast(const sj_tensor *x, sj_dtype to, int lay, const char *what) {
    sj_tensor yc, y = out_like(to, x->rank, x->shape, lay, &yc);
    double *r = ref(tu_numel(&y));
    tu_ref_cast(x, to, r);
    assert_int_equal(sj_cpu_copy(x, &yc), SJ_OK);
    sj_tensor dx = to_dev(x), dy = to_dev(&y);
    settle();
    finish(sj_cuda_copy(&ex, &dx, &dy), &dy, &y, what);
    expect(&y, &yc, r, NULL, 0, what);
}

static void test_cast(void **state) {
    for (int f = 0; f < NELEM(ALL); f++)
        for (int t = 0; t < NELEM(ALL); t++)
            for (int lay = 0; lay < L_COUNT + 1; lay++) {
                /* lay L_COUNT: contiguous, long enough for the vector body */
                const int64_t *shape = lay == L_COUNT ? S(2, 3, 1001) : S(3, 4, 45);
                sj_tensor x = make(ALL[f], 3, shape, lay % L_COUNT);
                if (ALL[f] == SJ_BOOL || ALL[f] == SJ_I32 || ALL[f] == SJ_I64)
                    tu_fill_range(&x, -300, 300);
                else
                    tu_fill_random(&x);
                run_cast(&x, ALL[t], lay == L_COUNT ? L_CONTIG : 3 - lay,
                         label("cast %d -> %d layout %d", ALL[f], ALL[t], lay));
            }
    const double v[] = {NAN,           INFINITY, -INFINITY, 3e9,     -3e9, 1e19,
                        -1e19,         2.7,      -2.7,      0.5,     -0.0, 2147483520.0,
                        -2147483648.0, 65519.0,  65520.0,   70000.0, 1e-8};
    int64_t n = NELEM(v);
    for (int f = 0; f < 3; f++) {
        sj_tensor x = tu_tensor(FLOATS[f], 1, &n);
        tu_set_all(&x, v);
        for (int t = 0; t < NELEM(ALL); t++)
            run_cast(&x, ALL[t], L_CONTIG, label("cast specials %d -> %d", FLOATS[f], ALL[t]));
    }
    sj_tensor x = tu_tensor(SJ_I64, 1, S(6));
    tu_seti_all(&x, S(INT64_MAX, INT64_MIN, 4294967297LL, 65519, 70000, -1));
    for (int t = 0; t < NELEM(ALL); t++) run_cast(&x, ALL[t], L_GAP, label("cast i64 specials -> %d", ALL[t]));
    /* a broadcast (stride 0) source, same dtype and cast */
    for (int t = 0; t < 2; t++) {
        sj_tensor s = tu_tensor(SJ_F16, 0, NULL), y = tu_tensor(t ? SJ_F32 : SJ_F16, 2, S(3, 3));
        tu_set(&s, 0, 1.5);
        sj_tensor ds = to_dev(&s), dy = to_dev(&y), dsb = tu_broadcast(&ds, 2, S(3, 3));
        settle();
        finish(sj_cuda_copy(&ex, &dsb, &dy), &dy, &y, "broadcast copy");
        for (int i = 0; i < 9; i++) assert_true(tu_get(&y, i) == 1.5);
    }
}

static void test_copy_transposed(void **state) {
    const int64_t shapes[][3] = {{3, 37, 45}, {1, 70, 9}, {2, 8, 8}, {1, 1, 5}, {2, 17, 1}};
    for (int d = 0; d < NELEM(ALL); d++)
        for (int s = 0; s < NELEM(shapes); s++)
            for (int v = 0; v < 4; v++) {
                const int64_t *sh = shapes[s];
                sj_tensor x0 = rnd(ALL[d], 3, S(sh[0], sh[2], sh[1]), (v & 1) ? L_GAP : L_CONTIG);
                sj_tensor x = tu_transpose(&x0, 1, 2);
                sj_tensor y = tu_tensor(ALL[d], 3, S(sh[0], sh[1], sh[2] + ((v & 2) ? 3 : 0)));
                y.shape[2] = sh[2];
                double *r = ref(tu_numel(&y));
                tu_ref_cast(&x, ALL[d], r);
                sj_tensor dx0 = to_dev(&x0), dy = to_dev(&y), dx = tu_transpose(&dx0, 1, 2);
                settle();
                const char *what = label("transposed copy %d shape %d v %d", ALL[d], s, v);
                finish(sj_cuda_copy(&ex, &dx, &dy), &dy, &y, what);
                assert_true(tu_check(&y, r, 0, what));
                y.shape[2] = sh[2] + ((v & 2) ? 3 : 0); /* the padding is still poison */
                for (int64_t i = 0; i < tu_numel(&y); i++)
                    assert_true(tu_is_poison(&y, i) == (i % y.shape[2] >= sh[2]));
            }
}

/* -- Reductions ------------------------------------------------------------- */

static void run_reduce(sj_op op, sj_dtype dt, int rank, const int64_t *shape, int axis, int lx, int ly) {
    int64_t ys[SJ_MAX_RANK];
    int ax = axis < 0 ? axis + rank : axis;
    memcpy(ys, shape, (size_t)rank * sizeof *ys);
    ys[ax] = 1;
    sj_tensor x = rnd(dt, rank, shape, lx), yc, y = out_like(dt, rank, ys, ly, &yc);
    double *r = ref(tu_numel(&y));
    tu_ref_reduce(op, &x, ax, r);
    assert_int_equal(sj_cpu_reduce(op, &x, axis, &yc), SJ_OK);
    sj_tensor dx = to_dev(&x), dy = to_dev(&y);
    settle();
    const char *what = label("reduce %s dtype %d axis %d layout %d shape %lld", sj_op_name(op), dt, axis, lx,
                             (long long)shape[ax]);
    finish(sj_cuda_reduce(&ex, op, &dx, axis, &dy), &dy, &y, what);
    expect(&y, &yc, r, NULL, tu_tol(dt), what);
}

static void test_reduce(void **state) {
    for (int op = SJ_OP_SUM; op <= SJ_OP_AMAX; op++)
        for (int d = 0; d < NELEM(NUMERIC); d++) {
            sj_dtype dt = NUMERIC[d];
            if (op == SJ_OP_MEAN && (dt == SJ_I32 || dt == SJ_I64))
                continue;
            for (int axis = -1; axis < 3; axis++)
                for (int lay = 0; lay < L_COUNT; lay++) run_reduce(op, dt, 3, S(3, 20, 37), axis, lay, 3 - lay);
            run_reduce(op, dt, 2, S(7, 300), 0, L_CONTIG, L_CONTIG);   /* col kernel */
            run_reduce(op, dt, 2, S(3000, 40), 0, L_CONTIG, L_CONTIG); /* col, 32 warps */
            run_reduce(op, dt, 2, S(3, 5000), 1, L_CONTIG, L_GAP);     /* a block per row */
            run_reduce(op, dt, 1, S(20000), 0, L_GAP, L_CONTIG);
            run_reduce(op, dt, 1, S(1000), 0, L_GAP, L_CONTIG);
            run_reduce(op, dt, 1, S(1), 0, L_CONTIG, L_CONTIG);
            run_reduce(op, dt, 2, S(0, 4), 1, L_CONTIG, L_CONTIG);
            run_reduce(op, dt, 5, S(2, 3, 4, 5, 6), 2, L_REVGAP, L_GAP);
            if (op != SJ_OP_AMAX)
                run_reduce(op, dt, 2, S(4, 0), 1, L_CONTIG, L_CONTIG); /* empty axis: 0, or NaN */
        }
    /* amax keeps a NaN: col kernel (axis 0 contiguous), row kernel
     * (axis 0 column-major, axis 1 contiguous) */
    for (int d = 0; d < NELEM(FLOATS); d++)
        for (int c = 0; c < 3; c++) {
            int axis = c == 2;
            sj_tensor xb = rnd(FLOATS[d], 2, S(40, 3), c == 1 ? L_REV : L_CONTIG);
            sj_tensor yb = tu_tensor(FLOATS[d], 2, axis ? S(40, 1) : S(1, 3));
            tu_set(&xb, 7 * 3 + 1, NAN);
            sj_tensor dx = to_dev(&xb), dy = to_dev(&yb);
            settle();
            finish(sj_cuda_reduce(&ex, SJ_OP_AMAX, &dx, axis, &dy), &dy, &yb, "amax nan");
            if (axis == 0)
                assert_true(!isnan(tu_get(&yb, 0)) && isnan(tu_get(&yb, 1)) && !isnan(tu_get(&yb, 2)));
            else
                for (int i = 0; i < 40; i++) assert_true(isnan(tu_get(&yb, i)) == (i == 7));
        }
}

/* -- Softmax and norms ------------------------------------------------------ */

static void run_softmax(sj_dtype dt, int rank, const int64_t *shape, int axis, int lx, int ly, int special) {
    sj_tensor x = rnd(dt, rank, shape, lx), yc, y = out_like(dt, rank, shape, ly, &yc);
    int64_t n = tu_numel(&x), row = shape[rank - 1];
    if (special && n >= 3 * row) {
        for (int64_t i = 0; i < row; i++) tu_set(&x, i, -INFINITY);          /* all -inf */
        for (int64_t i = row; i < 2 * row; i += 2) tu_set(&x, i, -INFINITY); /* some */
        tu_set(&x, 2 * row + 1, NAN);
    }
    double *r = ref(n);
    tu_ref_softmax(&x, axis, r);
    assert_int_equal(sj_cpu_softmax(&x, axis, &yc), SJ_OK);
    sj_tensor dx = to_dev(&x), dy = to_dev(&y);
    settle();
    const char *what = label("softmax dtype %d axis %d lay %d/%d n %lld", dt, axis, lx, ly, (long long)shape[axis]);
    finish(sj_cuda_softmax(&ex, &dx, axis, &dy), &dy, &y, what);
    expect(&y, &yc, r, NULL, tu_tol(dt), what);
}

static void test_softmax(void **state) {
    for (int d = 0; d < NELEM(FLOATS); d++) {
        for (int axis = 0; axis < 3; axis++)
            for (int lay = 0; lay < L_COUNT; lay++) run_softmax(FLOATS[d], 3, S(3, 4, 17), axis, lay, 3 - lay, 0);
        run_softmax(FLOATS[d], 2, S(3, 300), 1, L_CONTIG, L_CONTIG, 1);
        run_softmax(FLOATS[d], 2, S(3, 300), 1, L_GAP, L_REV, 1);
        run_softmax(FLOATS[d], 2, S(3, 300), 1, L_REV, L_CONTIG, 1); /* col kernel, -inf and NaN */
        run_softmax(FLOATS[d], 2, S(3, 3000), 1, L_CONTIG, L_GAP, 1); /* a block per row */
        run_softmax(FLOATS[d], 2, S(600, 40), 0, L_CONTIG, L_CONTIG, 0);
        run_softmax(FLOATS[d], 2, S(4, 1), 1, L_CONTIG, L_CONTIG, 0);
        run_softmax(FLOATS[d], 2, S(4, 0), 1, L_CONTIG, L_CONTIG, 0);
        run_softmax(FLOATS[d], 1, S(1), 0, L_GAP, L_CONTIG, 0);
    }
}

static void run_norm(int rms, sj_dtype dt, int rank, const int64_t *shape, int lx, int ly, int with_g,
                     int with_b) {
    int64_t n = shape[rank - 1];
    sj_tensor x = rnd(dt, rank, shape, lx), yc, y = out_like(dt, rank, shape, ly, &yc);
    sj_tensor g = rnd(dt, 1, &n, L_GAP), b = rnd(dt, 1, &n, L_CONTIG);
    const sj_tensor *gp = with_g ? &g : NULL, *bp = with_b ? &b : NULL;
    double *r = ref(tu_numel(&x)), eps = 1e-5;
    if (rms)
        tu_ref_rms_norm(&x, gp, eps, r);
    else
        tu_ref_layer_norm(&x, gp, bp, eps, r);
    assert_int_equal(rms ? sj_cpu_rms_norm(&x, gp, eps, &yc) : sj_cpu_layer_norm(&x, gp, bp, eps, &yc), SJ_OK);
    sj_tensor dx = to_dev(&x), dy = to_dev(&y), dg = to_dev(&g), db = to_dev(&b);
    settle();
    const char *what = label("norm rms=%d dtype %d g %d b %d lay %d n %lld", rms, dt, with_g, with_b, lx, (long long)n);
    finish(rms ? sj_cuda_rms_norm(&ex, &dx, with_g ? &dg : NULL, eps, &dy)
               : sj_cuda_layer_norm(&ex, &dx, with_g ? &dg : NULL, with_b ? &db : NULL, eps, &dy),
           &dy, &y, what);
    expect(&y, &yc, r, NULL, tu_tol(dt), what);
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
                run_norm(rms, FLOATS[d], 2, S(3, 5000), L_GAP, L_CONTIG, g, b); /* a block per row */
                run_norm(rms, FLOATS[d], 2, S(0, 8), L_CONTIG, L_CONTIG, g, b);
            }
}

/* -- Matmul ----------------------------------------------------------------- */

/* a [..., M, K] (la: layout; ta: stored transposed), b likewise, batch
 * shapes ab/bb broadcast to yb. */
static void run_matmul(sj_dtype dt, int nb, const int64_t *yb, const int64_t *ab, const int64_t *bb, int64_t M,
                       int64_t K, int64_t N, int la, int ta, int lb, int tb, int ly, int ty) {
    int64_t as[SJ_MAX_RANK], bs[SJ_MAX_RANK], ys[SJ_MAX_RANK];
    int r = nb + 2;
    for (int i = 0; i < nb; i++) as[i] = ab[i], bs[i] = bb[i], ys[i] = yb[i];
    as[nb] = ta ? K : M, as[nb + 1] = ta ? M : K;
    bs[nb] = tb ? N : K, bs[nb + 1] = tb ? K : N;
    ys[nb] = ty ? N : M, ys[nb + 1] = ty ? M : N;
    sj_tensor a0 = rnd(dt, r, as, la), b0 = rnd(dt, r, bs, lb), yc, y = out_like(dt, r, ys, ly, &yc);
    sj_tensor da0 = to_dev(&a0), db0 = to_dev(&b0), dy = to_dev(&y);
    a0 = ta ? tu_transpose(&a0, nb, nb + 1) : a0;
    b0 = tb ? tu_transpose(&b0, nb, nb + 1) : b0;
    da0 = ta ? tu_transpose(&da0, nb, nb + 1) : da0;
    db0 = tb ? tu_transpose(&db0, nb, nb + 1) : db0;
    y = ty ? tu_transpose(&y, nb, nb + 1) : y;
    yc = ty ? tu_transpose(&yc, nb, nb + 1) : yc;
    dy = ty ? tu_transpose(&dy, nb, nb + 1) : dy;
    int64_t af[SJ_MAX_RANK], bf[SJ_MAX_RANK];
    memcpy(af, ys, sizeof af);
    memcpy(bf, ys, sizeof bf);
    af[nb] = M, af[nb + 1] = K, bf[nb] = K, bf[nb + 1] = N;
    sj_tensor a = tu_broadcast(&a0, r, af), b = tu_broadcast(&b0, r, bf);
    sj_tensor da = tu_broadcast(&da0, r, af), db = tu_broadcast(&db0, r, bf);
    double *rf = ref(tu_numel(&y)), *mg = mag(tu_numel(&y));
    tu_ref_matmul(&a, &b, rf, mg);
    assert_int_equal(sj_cpu_matmul(&a, &b, &yc), SJ_OK);
    settle();
    const char *what = label("matmul dtype %d batch %d M %lld K %lld N %lld lay %d%d%d%d%d%d", dt, nb, (long long)M,
                             (long long)K, (long long)N, la, ta, lb, tb, ly, ty);
    finish(sj_cuda_matmul(&ex, &da, &db, &dy), &dy, &y, what);
    expect(&y, &yc, rf, mg, tu_tol(dt), what);
}

static void matmul_cases(void) {
    const int64_t mkn[][3] = {{3, 5, 4}, {1, 7, 1}, {5, 0, 3}, {1, 1, 1}, {17, 33, 9},
                              {0, 3, 4}, {4, 1, 6}, {6, 9, 1}, {64, 128, 40}};
    for (int d = 0; d < NELEM(NUMERIC); d++) {
        sj_dtype dt = NUMERIC[d];
        for (int s = 0; s < NELEM(mkn); s++) {
            int64_t M = mkn[s][0], K = mkn[s][1], N = mkn[s][2];
            for (int v = 0; v < 16; v++) /* every transpose combination, two layouts */
                run_matmul(dt, 0, NULL, NULL, NULL, M, K, N, (v & 8) ? L_GAP : L_CONTIG, v & 1,
                           (v & 8) ? L_CONTIG : L_GAP, (v >> 1) & 1, (v & 4) ? L_REVGAP : L_CONTIG, (v >> 2) & 1);
            /* batches: full, broadcast on either side, b shared (folded into M) */
            const int64_t *ab[] = {S(2, 3), S(2, 3), S(2, 1), S(2, 3), S(2, 3), S(2, 3)};
            const int64_t *bb[] = {S(2, 3), S(1, 3), S(2, 3), S(1, 1), S(1, 1), S(2, 3)};
            const int lays[][6] = {{0, 0, 0, 0, 0, 0},     {L_GAP, 1, 0, 0, 0, 0},     {0, 0, 0, 1, L_GAP, 0},
                                   {0, 0, 0, 0, 0, 0},     {0, 0, L_REV, 1, 0, 1},     {L_REV, 0, L_REV, 0, L_REV, 0}};
            for (int c = 0; c < NELEM(lays); c++)
                run_matmul(dt, 2, S(2, 3), ab[c], bb[c], M, K, N, lays[c][0], lays[c][1], lays[c][2], lays[c][3],
                           lays[c][4], lays[c][5]);
            run_matmul(dt, 1, S(4), S(1), S(1), M, K, N, L_CONTIG, 0, L_CONTIG, 0, L_CONTIG, 0);
            run_matmul(dt, 3, S(2, 1, 3), S(2, 1, 1), S(1, 1, 3), M, K, N, L_GAP, 0, L_CONTIG, 1, L_CONTIG, 0);
        }
        /* rank 8 with a stride that stops the batch axes from merging */
        run_matmul(dt, 6, S(2, 1, 2, 1, 1, 3), S(2, 1, 2, 1, 1, 3), S(1, 1, 2, 1, 1, 1), 5, 6, 7, L_GAP, 0,
                   L_CONTIG, 0, L_REV, 0);
    }
    /* integer products past 2^31: exact in i64, wrapping in i32 */
    for (int d = 3; d < 5; d++) {
        sj_tensor a = tu_tensor(NUMERIC[d], 2, S(1, 2)), b = tu_tensor(NUMERIC[d], 2, S(2, 1));
        sj_tensor y = tu_tensor(NUMERIC[d], 2, S(1, 1));
        tu_seti_all(&a, S(100000, 3));
        tu_seti_all(&b, S(300000, 7));
        sj_tensor da = to_dev(&a), db = to_dev(&b), dy = to_dev(&y);
        settle();
        finish(sj_cuda_matmul(&ex, &da, &db, &dy), &dy, &y, "int matmul wrap");
        assert_true(tu_geti(&y, 0) == (NUMERIC[d] == SJ_I64 ? 30000000021LL : -64771051));
    }
}

static void test_matmul(void **state) { matmul_cases(); }

/* The same on a second stream: cuBLASLt then takes its workspace from the
 * allocator instead of the device's shared one. */
static void test_matmul_stream(void **state) {
    CUstream s = NULL, keep = ex.stream;
    assert_int_equal(dev->api.StreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    ex.stream = s;
    for (int d = 0; d < 3; d++) {
        run_matmul(FLOATS[d], 1, S(3), S(3), S(1), 33, 70, 20, L_CONTIG, 1, L_GAP, 0, L_CONTIG, 0);
        run_matmul(FLOATS[d], 0, NULL, NULL, NULL, 128, 256, 96, L_CONTIG, 0, L_CONTIG, 0, L_CONTIG, 1);
    }
    teardown(state);
    ex.stream = keep;
    assert_int_equal(dev->api.StreamDestroy(s), CUDA_SUCCESS);
}

/* -- Attention -------------------------------------------------------------- */

static void run_attention(sj_dtype dt, int64_t B, int64_t H, int64_t Sq, int64_t Sk, int64_t D, int64_t Dv,
                          const int64_t *lens, sj_dtype ldt, int causal, int lay) {
    /* lay 1: [B, S, H, D] in memory; 3: [B, H, D, S]; 2: every axis padded */
    static const int perm[4] = {0, 2, 1, 3}, cols[4] = {0, 1, 3, 2};
    const int *order = lay == 1 ? perm : lay == 3 ? cols : NULL;
    sj_tensor q = filled(tu_tensor_strided(dt, 4, S(B, H, Sq, D), order, lay == 2));
    sj_tensor k = filled(tu_tensor_strided(dt, 4, S(B, H, Sk, D), order, 0));
    sj_tensor v = filled(tu_tensor_strided(dt, 4, S(B, H, Sk, Dv), NULL, lay == 2));
    sj_tensor y = tu_tensor_strided(dt, 4, S(B, H, Sq, Dv), order, lay == 2);
    sj_tensor yc = tu_tensor_strided(dt, 4, S(B, H, Sq, Dv), order, lay == 2);
    sj_tensor l = make(ldt, 1, &B, lay == 2 ? L_GAP : L_CONTIG);
    if (lens)
        tu_seti_all(&l, lens);
    double scale = 1.0 / sqrt((double)(D ? D : 1));
    double *r = ref(tu_numel(&y)), *mg = mag(tu_numel(&y));
    tu_ref_attention(&q, &k, &v, lens ? &l : NULL, scale, causal, r, mg);
    assert_int_equal(sj_cpu_attention(&q, &k, &v, lens ? &l : NULL, scale, causal, &yc), SJ_OK);
    sj_tensor dq = to_dev(&q), dk = to_dev(&k), dv = to_dev(&v), dy = to_dev(&y), dl = to_dev(&l);
    settle();
    const char *what = label("attention dtype %d B %lld H %lld Sq %lld Sk %lld D %lld Dv %lld causal %d lens %d lay %d",
                             dt, (long long)B, (long long)H, (long long)Sq, (long long)Sk, (long long)D,
                             (long long)Dv, causal, lens != NULL, lay);
    finish(sj_cuda_attention(&ex, &dq, &dk, &dv, lens ? &dl : NULL, scale, causal, &dy), &dy, &y, what);
    expect(&y, &yc, r, mg, tu_tol(dt), what);
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
        /* several key chunks, large heads, shared memory past 48 KiB */
        run_attention(dt, 1, 2, 20, 300, 64, 64, S(257), SJ_I64, 1, 0);
        run_attention(dt, 2, 1, 4, 130, 256, 256, S(130, 65), SJ_I32, 0, 1);
        run_attention(dt, 1, 1, 2, 3, 16, 12300, NULL, SJ_I32, 0, 0);
    }
}

/* -- Concat and gather ------------------------------------------------------ */

static void test_concat(void **state) {
    for (int d = 0; d < NELEM(ALL); d++)
        for (int axis = 0; axis < 3; axis++)
            for (int lay = 0; lay < L_COUNT; lay++) {
                const int64_t sizes[4] = {2, 0, 5, 1};
                sj_tensor xs[4], dxs[4];
                int64_t ys[3] = {3, 4, 6};
                ys[axis] = 8;
                for (int i = 0; i < 4; i++) {
                    int64_t s[3] = {3, 4, 6};
                    s[axis] = sizes[i];
                    xs[i] = rnd(ALL[d], 3, s, (lay + i) % L_COUNT);
                    dxs[i] = to_dev(&xs[i]);
                }
                sj_tensor yc, y = out_like(ALL[d], 3, ys, 3 - lay, &yc);
                double *r = ref(tu_numel(&y));
                tu_ref_concat(xs, 4, axis, r);
                assert_int_equal(sj_cpu_concat(xs, 4, axis, &yc), SJ_OK);
                sj_tensor dy = to_dev(&y);
                settle();
                const char *what = label("concat dtype %d axis %d lay %d", ALL[d], axis, lay);
                finish(sj_cuda_concat(&ex, dxs, 4, axis - 3 * (lay & 1), &dy), &dy, &y, what);
                expect(&y, &yc, r, NULL, 0, what);
            }
}

static int read_flag(void) {
    int f = -1;
    assert_int_equal(sj_cuda_to_host(dev, &f, ex.error_flag, sizeof f), SJ_OK);
    return f;
}

static void clear_flag(void) {
    int z = 0;
    assert_int_equal(sj_cuda_to_device(dev, ex.error_flag, &z, sizeof z), SJ_OK);
}

static void run_gather(sj_dtype dt, sj_dtype idt, int tr, const int64_t *ts, int ir, const int64_t *is, int lt,
                       int ly) {
    int64_t ys[SJ_MAX_RANK];
    for (int i = 0; i < ir; i++) ys[i] = is[i];
    for (int i = 1; i < tr; i++) ys[ir + i - 1] = ts[i];
    sj_tensor t = rnd(dt, tr, ts, lt), idx = make(idt, ir, is, lt);
    sj_tensor yc, y = out_like(dt, ir + tr - 1, ys, ly, &yc);
    tu_fill_range(&idx, 0, (double)ts[0] - 1);
    double *r = ref(tu_numel(&y));
    tu_ref_gather(&t, &idx, r);
    assert_int_equal(sj_cpu_gather(&t, &idx, &yc), SJ_OK);
    sj_tensor dt_ = to_dev(&t), di = to_dev(&idx), dy = to_dev(&y);
    settle();
    const char *what = label("gather dtype %d index %d ranks %d/%d lay %d", dt, idt, tr, ir, lt);
    finish(sj_cuda_gather(&ex, &dt_, &di, &dy), &dy, &y, what);
    expect(&y, &yc, r, NULL, 0, what);
    assert_int_equal(read_flag(), 0);
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
    /* out of range: the flag is set, the bad position left alone, the rest
     * written */
    const int64_t bad[][6] = {{1, 2, 3, 4, 10, 0}, {0, 0, 0, 0, 0, -1}};
    for (int c = 0; c < 2; c++)
        for (int it = 0; it < 2; it++) {
            sj_tensor t = rnd(SJ_F32, 2, S(10, 4), L_CONTIG), idx = tu_tensor(it ? SJ_I32 : SJ_I64, 2, S(2, 3));
            sj_tensor y = tu_tensor(SJ_F32, 3, S(2, 3, 4));
            tu_seti_all(&idx, bad[c]);
            sj_tensor dt_ = to_dev(&t), di = to_dev(&idx), dy = to_dev(&y);
            settle();
            finish(sj_cuda_gather(&ex, &dt_, &di, &dy), &dy, &y, "gather bad index");
            assert_int_equal(read_flag(), 1);
            clear_flag();
            int badpos = c ? 5 : 4;
            for (int64_t i = 0; i < tu_numel(&y); i++) {
                int64_t p = i / 4;
                if (p == badpos)
                    assert_true(tu_is_poison(&y, i));
                else
                    assert_true(tu_get(&y, i) == tu_get(&t, bad[c][p] * 4 + i % 4));
            }
        }
    /* V = 0, and empty rows: the indices are still checked */
    sj_tensor t0 = tu_tensor(SJ_F32, 2, S(0, 4)), i0 = tu_tensor(SJ_I32, 1, S(1)), y0 = tu_tensor(SJ_F32, 2, S(1, 4));
    tu_seti(&i0, 0, 0);
    sj_tensor t1 = tu_tensor(SJ_F32, 2, S(3, 0)), i1 = tu_tensor(SJ_I64, 1, S(2)), y1 = tu_tensor(SJ_F32, 2, S(2, 0));
    tu_seti_all(&i1, S(1, 3));
    sj_tensor dt0 = to_dev(&t0), di0 = to_dev(&i0), dy0 = to_dev(&y0);
    sj_tensor dt1 = to_dev(&t1), di1 = to_dev(&i1), dy1 = to_dev(&y1);
    settle();
    finish(sj_cuda_gather(&ex, &dt0, &di0, &dy0), &dy0, &y0, "gather V = 0");
    assert_int_equal(read_flag(), 1);
    clear_flag();
    for (int i = 0; i < 4; i++) assert_true(tu_is_poison(&y0, i));
    finish(sj_cuda_gather(&ex, &dt1, &di1, &dy1), &dy1, &y1, "gather empty rows");
    assert_int_equal(read_flag(), 1);
    clear_flag();
}

/* -- Large index space -------------------------------------------------------
 * A strided copy of 2^31 + 6 bytes: the 64-bit index path of the _s
 * kernels. Skipped (with a message) when the device lacks the memory. */

static void test_large(void **state) {
    int64_t K = ((int64_t)1 << 30) + 3, n = 2 * K;
    size_t bytes = (size_t)n;
    CUdeviceptr x = sj_cuda_alloc(dev, bytes, ex.stream), y = x ? sj_cuda_alloc(dev, bytes, ex.stream) : 0;
    unsigned char *h = malloc(bytes);
    if (!x || !y || !h) {
        print_message("  large: skipped (no memory for 2 x %zu bytes)\n", bytes);
        sj_cuda_free(dev, x, ex.stream);
        free(h);
        return;
    }
    for (size_t i = 0; i < bytes; i++) h[i] = (unsigned char)(i % 251);
    assert_int_equal(sj_cuda_to_device(dev, x, h, bytes), SJ_OK);
    settle();
    /* y [K, 2] contiguous = x [2, K] transposed */
    sj_tensor dx = {.data = (void *)(uintptr_t)x, .dtype = SJ_BOOL, .rank = 2, .device = SJ_CUDA};
    sj_tensor dy = dx;
    dy.data = (void *)(uintptr_t)y;
    dx.shape[0] = dy.shape[0] = K, dx.shape[1] = dy.shape[1] = 2;
    dx.stride[0] = 1, dx.stride[1] = K;
    dy.stride[0] = 2, dy.stride[1] = 1;
    assert_int_equal(sj_cuda_copy(&ex, &dx, &dy), SJ_OK);
    sync_stream();
    unsigned char *back = malloc(bytes);
    assert_non_null(back);
    assert_int_equal(sj_cuda_to_host(dev, back, y, bytes), SJ_OK);
    int64_t bad = 0;
    for (int64_t i = 0; i < K; i++) bad += back[2 * i] != h[i] || back[2 * i + 1] != h[K + i];
    free(back);
    free(h);
    sj_cuda_free(dev, x, ex.stream);
    sj_cuda_free(dev, y, ex.stream);
    assert_int_equal(bad, 0);
}

int main(void) {
    const char *seed = getenv("SJ_TEST_SEED"), *only = getenv("SJ_TEST_FILTER");
    tu_seed(seed ? strtoull(seed, NULL, 10) : 20240611); /* to rerun with other inputs */
    if (only)
        cmocka_set_test_filter(only); /* e.g. "test_matmul*" */
    sj_status st = sj_cuda_open(0, &dev);
    if (st == SJ_EBACKEND) {
        printf("skipped: no CUDA device (%s)\n", sj_last_error());
        return 0;
    }
    if (st != SJ_OK) {
        fprintf(stderr, "sj_cuda_open: %s\n", sj_last_error());
        return 1;
    }
    sj_cuda_bind(dev);
    if (sj_cuda_eager_load(dev) != SJ_OK) {
        fprintf(stderr, "sj_cuda_eager_load: %s\n", sj_last_error());
        sj_cuda_close(dev);
        return 1;
    }
    ex.cuda = dev;
    ex.stream = dev->stream;
    ex.error_flag = sj_cuda_alloc(dev, sizeof(int), ex.stream);
    if (!ex.error_flag) {
        fprintf(stderr, "error flag: %s\n", sj_last_error());
        return 1;
    }
    int zero = 0;
    sj_cuda_to_device(dev, ex.error_flag, &zero, sizeof zero);
    printf("device: %s (sm_%d%d, %d SMs)\n", dev->name, dev->cc_major, dev->cc_minor, dev->sm_count);
#define T(f) cmocka_unit_test_teardown(f, teardown)
    const struct CMUnitTest tests[] = {
        T(test_unary),      T(test_unary_specials), T(test_binary),  T(test_int_semantics),
        T(test_nan_binary), T(test_where),          T(test_cast),    T(test_copy_transposed),
        T(test_reduce),     T(test_softmax),        T(test_norms),   T(test_matmul),
        T(test_matmul_stream), T(test_attention),   T(test_concat),  T(test_gather),
        T(test_large),
    };
#undef T
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    sj_cuda_free(dev, ex.error_flag, ex.stream);
    free(bufs);
    sj_cuda_eager_unload(dev);
    sj_cuda_close(dev);
    return failed;
}
#endif /* SJ_WITH_CUDA */
