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
 * The operands, references and case lists are shared with test_cpu_kernels
 * (tests/util_eager.c).
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
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "kernels/cpu/eager.h"
#include "base/sj_kernel_rt.h"
#include "tests/util.h"
#include "tests/util_graphapi.h"

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

static sj_cuda *dev;
static sj_cuda_exec ex;

enum { L_CONTIG = TU_CONTIG, L_GAP = TU_GAP, L_REV = TU_REV, L_REVGAP = TU_REVGAP, L_COUNT };
#define make tu_tensor_layout
#define label tu_label

static double *ref(int64_t n) { return tu_refbuf(0, n); }
static double *mag(int64_t n) { return tu_refbuf(1, n); }

#define rnd tu_random

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

static void run_unary(sj_op op, sj_dtype dt, int rank, const int64_t *shape, int lx, int ly) {
    sj_tensor yc, x = make(dt, rank, shape, lx), y = out_like(dt, rank, shape, ly, &yc);
    tu_fill_unary_input(op, &x);
    double *r = ref(tu_numel(&y));
    tu_ref_unary(op, &x, r);
    assert_int_equal(sj_cpu_unary(op, &x, &yc), SJ_OK);
    sj_tensor dx = to_dev(&x), dy = to_dev(&y);
    settle();
    const char *what = label("unary %s dtype %d rank %d lay %d/%d", sj_op_name(op), dt, rank, lx, ly);
    finish(sj_cuda_unary(&ex, op, &dx, &dy), &dy, &y, what);
    expect(&y, &yc, r, NULL, tu_tol(dt), what);
}

static void test_unary(void **state) { tu_unary_cases(true, run_unary); }

static void test_unary_specials(void **state) {
    int64_t n = NELEM(tu_special_values);
    sj_tensor x = tu_special_tensor();
    for (int o = 0; o < NELEM(tu_unary_ops); o++) {
        sj_op op = tu_unary_ops[o];
        sj_tensor y = tu_tensor(SJ_F32, 1, &n), yc = tu_tensor(SJ_F32, 1, &n);
        double *r = ref(n);
        tu_ref_unary(op, &x, r);
        assert_int_equal(sj_cpu_unary(op, &x, &yc), SJ_OK);
        sj_tensor dx = to_dev(&x), dy = to_dev(&y);
        settle();
        finish(sj_cuda_unary(&ex, op, &dx, &dy), &dy, &y, "unary specials");
        /* |err| <= 1e-6 max(|want|, 1) against the rounded reference and
         * the CPU (the same functions; FMA contraction may move an ulp) */
        for (int64_t i = 0; i < n; i++) {
            double got = tu_get(&y, i), w = tu_round(SJ_F32, r[i]), cw = tu_get(&yc, i);
            int ok = tu_special_ok(got, w);
            ok &= tu_special_ok(got, cw);
            if (!ok)
                fprintf(stderr, "%s x %g: %.9g, want %.9g (CPU %.9g)\n", sj_op_name(op), tu_special_values[i], got, w,
                        cw);
            assert_true(ok);
        }
    }
}

/* -- Binary and comparisons ------------------------------------------------- */

static void run_binary(sj_op op, sj_dtype dt, int rank, const int64_t *ys, int ra, const int64_t *as, int la,
                       int rb, const int64_t *bs, int lb, int ly) {
    sj_tensor a0 = rnd(dt, ra, as, la), b0 = rnd(dt, rb, bs, lb);
    sj_tensor a = tu_broadcast(&a0, rank, ys), b = tu_broadcast(&b0, rank, ys);
    sj_tensor yc, y = out_like(tu_is_cmp(op) ? SJ_BOOL : dt, rank, ys, ly, &yc);
    double *r = ref(tu_numel(&y));
    tu_ref_binary(op, &a, &b, r);
    assert_int_equal(sj_cpu_binary(op, &a, &b, &yc), SJ_OK);
    sj_tensor da0 = to_dev(&a0), db0 = to_dev(&b0), dy = to_dev(&y);
    sj_tensor da = tu_broadcast(&da0, rank, ys), db = tu_broadcast(&db0, rank, ys);
    settle();
    const char *what = label("binary %s dtype %d rank %d", sj_op_name(op), dt, rank);
    finish(sj_cuda_binary(&ex, op, &da, &db, &dy), &dy, &y, what);
    expect(&y, &yc, r, NULL, tu_is_cmp(op) ? 0 : tu_tol(dt), what);
}

static void test_binary(void **state) {
    tu_binary_cases(true, run_binary);
    for (int d = 0; d < NELEM(tu_floats); d++) { /* pow with a positive base, wider range */
        sj_tensor a, b, yc, y = out_like(tu_floats[d], 1, S(50), L_CONTIG, &yc);
        double *r = tu_pow_operands(tu_floats[d], &a, &b);
        assert_int_equal(sj_cpu_binary(SJ_OP_POW, &a, &b, &yc), SJ_OK);
        sj_tensor da = to_dev(&a), db = to_dev(&b), dy = to_dev(&y);
        settle();
        finish(sj_cuda_binary(&ex, SJ_OP_POW, &da, &db, &dy), &dy, &y, "pow positive base");
        expect(&y, &yc, r, NULL, tu_tol(tu_floats[d]), "pow positive base");
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
        sj_dtype dt = tu_numeric[d];
        int64_t mn = dt == SJ_I32 ? INT32_MIN : INT64_MIN;
        tu_int_cases(dt, run_ints);
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

static void run_nan(sj_op op, sj_dtype dt, const sj_tensor *a, const sj_tensor *s, int side, const double *rf) {
    int64_t n = a->shape[0];
    sj_tensor b = tu_broadcast(s, 1, &n);
    sj_tensor yc, y = out_like(tu_is_cmp(op) ? SJ_BOOL : dt, 1, &n, L_CONTIG, &yc);
    const sj_tensor *l = side ? &b : a, *r = side ? a : &b;
    assert_int_equal(sj_cpu_binary(op, l, r, &yc), SJ_OK);
    sj_tensor da = to_dev(a), ds = to_dev(s), dy = to_dev(&y);
    sj_tensor db = tu_broadcast(&ds, 1, &n);
    settle();
    finish(sj_cuda_binary(&ex, op, side ? &db : &da, side ? &da : &db, &dy), &dy, &y, "nan binary");
    expect(&y, &yc, rf, NULL, tu_is_cmp(op) ? 0 : tu_tol(dt), "nan binary");
}

static void test_nan_binary(void **state) { tu_nan_binary_cases(run_nan); }

/* -- Where ------------------------------------------------------------------ */

static void test_where(void **state) {
    for (int d = 0; d < NELEM(tu_all); d++) {
        const int64_t *ys = S(5, 70);
        for (int c = 0; c < 4; c++) {
            sj_tensor st[3], v[3], yc;
            int ly;
            double *r = tu_where_case(tu_all[d], c, c ? L_REV : L_CONTIG, st, v, &ly);
            sj_tensor y = out_like(tu_all[d], 2, ys, ly, &yc);
            assert_int_equal(sj_cpu_where(&v[0], &v[1], &v[2], &yc), SJ_OK);
            sj_tensor dc0 = to_dev(&st[0]), da0 = to_dev(&st[1]), db0 = to_dev(&st[2]), dy = to_dev(&y);
            sj_tensor dc = tu_broadcast(&dc0, 2, ys), da = tu_broadcast(&da0, 2, ys), db = tu_broadcast(&db0, 2, ys);
            settle();
            const char *what = label("where dtype %d case %d", tu_all[d], c);
            finish(sj_cuda_where(&ex, &dc, &da, &db, &dy), &dy, &y, what);
            expect(&y, &yc, r, NULL, 0, what);
        }
        sj_tensor e = make(tu_all[d], 2, S(0, 3), L_CONTIG), ec = make(SJ_BOOL, 2, S(0, 3), L_CONTIG);
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
    for (int f = 0; f < NELEM(tu_all); f++)
        for (int t = 0; t < NELEM(tu_all); t++)
            for (int lay = 0; lay < L_COUNT + 1; lay++) {
                /* lay L_COUNT: contiguous, long enough for the vector body */
                const int64_t *shape = lay == L_COUNT ? S(2, 3, 1001) : S(3, 4, 45);
                sj_tensor x = make(tu_all[f], 3, shape, lay % L_COUNT);
                tu_fill_cast_input(&x);
                run_cast(&x, tu_all[t], lay == L_COUNT ? L_CONTIG : 3 - lay,
                         label("cast %d -> %d layout %d", tu_all[f], tu_all[t], lay));
            }
    for (int f = 0; f < 3; f++) {
        sj_tensor x = tu_cast_specials(tu_floats[f]);
        for (int t = 0; t < NELEM(tu_all); t++)
            run_cast(&x, tu_all[t], L_CONTIG, label("cast specials %d -> %d", tu_floats[f], tu_all[t]));
    }
    sj_tensor x = tu_cast_int_specials();
    for (int t = 0; t < NELEM(tu_all); t++) run_cast(&x, tu_all[t], L_GAP, label("cast i64 specials -> %d", tu_all[t]));
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

/* Casts of bit patterns on the device against the CPU's conversions
 * (sj_kernel_rt.h; the device's are cvt instructions): every f16 pattern
 * to f32; to f16 and bf16, every 4099th f32 pattern, every f16 and bf16
 * value, and the f32 midpoints between neighbouring f16 and bf16 values
 * (ties round to even). Bit for bit, except that a NaN only has to stay
 * NaN (the device's is canonical). */
static void cast_bits(sj_dtype from, sj_dtype to, const void *bits, int64_t n, const char *what) {
    sj_tensor x = tu_tensor(from, 1, &n), y = tu_tensor(to, 1, &n), yc = tu_tensor(to, 1, &n);
    memcpy(x.data, bits, (size_t)n * (from == SJ_F32 ? 4 : 2));
    assert_int_equal(sj_cpu_copy(&x, &yc), SJ_OK);
    sj_tensor dx = to_dev(&x), dy = to_dev(&y);
    settle();
    finish(sj_cuda_copy(&ex, &dx, &dy), &dy, &y, what);
    int64_t nans = 0, shown = 0;
    for (int64_t i = 0; i < n; i++) {
        uint32_t a, b;
        bool nan_a, nan_b;
        if (to == SJ_F32) {
            a = ((const uint32_t *)y.data)[i], b = ((const uint32_t *)yc.data)[i];
            nan_a = (a & 0x7fffffffu) > 0x7f800000u, nan_b = (b & 0x7fffffffu) > 0x7f800000u;
        } else {
            a = ((const uint16_t *)y.data)[i], b = ((const uint16_t *)yc.data)[i];
            uint32_t inf = to == SJ_F16 ? 0x7c00u : 0x7f80u;
            nan_a = (a & 0x7fffu) > inf, nan_b = (b & 0x7fffu) > inf;
        }
        if (nan_b) {
            nans++;
            if (!nan_a) fail_msg("%s: element %lld: device 0x%x for a NaN (CPU 0x%x)", what, (long long)i, a, b);
            if (a != b && !shown++) print_message("%s: device NaN 0x%x, CPU 0x%x\n", what, a, b);
        } else if (a != b) {
            uint32_t in = from == SJ_F32 ? ((const uint32_t *)x.data)[i] : ((const uint16_t *)x.data)[i];
            fail_msg("%s: element %lld (input 0x%x): device 0x%x, CPU 0x%x", what, (long long)i, in, a, b);
        }
    }
    assert_true(nans > 0); /* the NaN rule was exercised */
}

static void test_cast_bits(void **state) {
    enum { H = 65536 };
    uint16_t *h = malloc(H * sizeof *h);
    assert_non_null(h);
    for (int i = 0; i < H; i++) h[i] = (uint16_t)i;
    cast_bits(SJ_F16, SJ_F32, h, H, "every f16 -> f32");
    cast_bits(SJ_BF16, SJ_F32, h, H, "every bf16 -> f32");
    free(h);
    const int64_t stride = 4099, n_walk = (INT64_C(1) << 32) / stride + 1;
    /* the f16 overflow boundary (65520 and the float below it), the f16
     * subnormal boundaries (2^-24, 2^-25 and their neighbours), the bf16
     * overflow boundary (the top of the f32 range rounds to infinity) */
    const uint32_t edges[] = {0x477ff000u, 0x477fefffu, 0x33800000u, 0x33000000u, 0x33000001u, 0x32ffffffu,
                              0x387fe000u, 0x387fefffu, 0x7f7f8000u, 0x7f7f7fffu, 0x7f7fffffu};
    const int64_t n_edges = (int64_t)(sizeof edges / sizeof edges[0]);
    const int64_t n = n_walk + 4 * H + 2 * n_edges;
    uint32_t *f = malloc((size_t)n * sizeof *f);
    assert_non_null(f);
    int64_t k = 0;
    for (int64_t i = 0; i < n_walk; i++) f[k++] = (uint32_t)(i * stride);
    for (int dt = 0; dt < 2; dt++)
        for (uint32_t v = 0; v < H; v++) {
            /* the value itself, and the midpoint to the next pattern (exact in
             * f32: a significand of at most 12 bits) */
            float a = dt ? sj_bf16_to_f32((uint16_t)v) : sj_f16_to_f32((uint16_t)v);
            float b = dt ? sj_bf16_to_f32((uint16_t)(v + 1)) : sj_f16_to_f32((uint16_t)(v + 1));
            uint32_t ua, um;
            memcpy(&ua, &a, 4);
            float m = (float)(((double)a + (double)b) / 2);
            memcpy(&um, &m, 4);
            f[k++] = ua;
            f[k++] = isfinite(a) && isfinite(b) && (v & 0x7fffu) != 0x7fffu ? um : ua;
        }
    for (int64_t i = 0; i < n_edges; i++) f[k++] = edges[i], f[k++] = edges[i] | 0x80000000u;
    assert_int_equal(k, n);
    cast_bits(SJ_F32, SJ_F16, f, n, "f32 patterns -> f16");
    cast_bits(SJ_F32, SJ_BF16, f, n, "f32 patterns -> bf16");
    free(f);
}

static void copy_cuda(const sj_tensor *x0, const sj_tensor *x, const sj_tensor *y, const char *what) {
    sj_tensor dx0 = to_dev(x0), dy = to_dev(y), dx = tu_transpose(&dx0, 1, 2);
    settle();
    finish(sj_cuda_copy(&ex, &dx, &dy), &dy, y, what);
}

static void test_copy_transposed(void **state) { tu_transposed_copy_cases(copy_cuda); }

/* -- Reductions ------------------------------------------------------------- */

static void run_reduce(sj_op op, sj_dtype dt, int rank, const int64_t *shape, int axis, int lx, int ly) {
    int64_t ys[SJ_MAX_RANK];
    int ax = tu_reduce_shape(rank, shape, axis, ys);
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
    tu_reduce_cases(true, run_reduce);
    /* amax keeps a NaN: col kernel (axis 0 contiguous), row kernel
     * (axis 0 column-major, axis 1 contiguous) */
    for (int d = 0; d < NELEM(tu_floats); d++)
        for (int c = 0; c < 3; c++) {
            int axis = c == 2;
            sj_tensor xb = rnd(tu_floats[d], 2, S(40, 3), c == 1 ? L_REV : L_CONTIG);
            sj_tensor yb = tu_tensor(tu_floats[d], 2, axis ? S(40, 1) : S(1, 3));
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
    if (special)
        tu_softmax_specials(&x);
    double *r = ref(tu_numel(&x));
    tu_ref_softmax(&x, axis, r);
    assert_int_equal(sj_cpu_softmax(&x, axis, &yc), SJ_OK);
    sj_tensor dx = to_dev(&x), dy = to_dev(&y);
    settle();
    const char *what = label("softmax dtype %d axis %d lay %d/%d n %lld", dt, axis, lx, ly, (long long)shape[axis]);
    finish(sj_cuda_softmax(&ex, &dx, axis, &dy), &dy, &y, what);
    expect(&y, &yc, r, NULL, tu_tol(dt), what);
}

static void test_softmax(void **state) { tu_softmax_cases(true, run_softmax); }

static void run_norm(int rms, sj_dtype dt, int rank, const int64_t *shape, int lx, int ly, int with_g,
                     int with_b) {
    int64_t n = shape[rank - 1];
    sj_tensor x, g, b, yc, y = out_like(dt, rank, shape, ly, &yc);
    double *r = tu_norm_operands(rms, dt, rank, shape, lx, &x, &g, &b, with_g, with_b), eps = 1e-5;
    const sj_tensor *gp = with_g ? &g : NULL, *bp = with_b ? &b : NULL;
    assert_int_equal(rms ? sj_cpu_rms_norm(&x, gp, eps, &yc) : sj_cpu_layer_norm(&x, gp, bp, eps, &yc), SJ_OK);
    sj_tensor dx = to_dev(&x), dy = to_dev(&y), dg = to_dev(&g), db = to_dev(&b);
    settle();
    const char *what = label("norm rms=%d dtype %d g %d b %d lay %d n %lld", rms, dt, with_g, with_b, lx, (long long)n);
    finish(rms ? sj_cuda_rms_norm(&ex, &dx, with_g ? &dg : NULL, eps, &dy)
               : sj_cuda_layer_norm(&ex, &dx, with_g ? &dg : NULL, with_b ? &db : NULL, eps, &dy),
           &dy, &y, what);
    expect(&y, &yc, r, NULL, tu_tol(dt), what);
}

static void test_norms(void **state) { tu_norm_cases(true, run_norm); }

/* Layer norm of rows whose mean is large against their spread (4000 +
 * U(-1, 1)), as test_cpu_kernels' test_layer_norm_offset: the f32 mean's
 * rounding, scaled by rstd, is a hundred times the tolerance unless the
 * kernel corrects it. Warp rows (5, 300) and block rows (5000). */
static void test_layer_norm_offset(void **state) {
    const int64_t shapes[][2] = {{7, 5}, {4, 300}, {3, 5000}};
    for (int i = 0; i < NELEM(shapes); i++) {
        int64_t n = shapes[i][1];
        sj_tensor x = tu_random(SJ_F32, 2, shapes[i], L_CONTIG), g = tu_random(SJ_F32, 1, &n, L_CONTIG),
                  b = tu_random(SJ_F32, 1, &n, L_CONTIG), yc, y = out_like(SJ_F32, 2, shapes[i], L_CONTIG, &yc);
        for (int64_t k = 0; k < tu_numel(&x); k++) tu_set(&x, k, 4000.0 + tu_get(&x, k));
        double *r = ref(tu_numel(&y));
        tu_ref_layer_norm(&x, &g, &b, 1e-5, r);
        assert_int_equal(sj_cpu_layer_norm(&x, &g, &b, 1e-5, &yc), SJ_OK);
        sj_tensor dx = to_dev(&x), dy = to_dev(&y), dg = to_dev(&g), db = to_dev(&b);
        settle();
        const char *what = label("layer norm offset [%lld, %lld]", (long long)shapes[i][0], (long long)n);
        finish(sj_cuda_layer_norm(&ex, &dx, &dg, &db, 1e-5, &dy), &dy, &y, what);
        expect(&y, &yc, r, NULL, tu_tol(SJ_F32), what);
    }
}

/* -- Matmul ----------------------------------------------------------------- */

/* Bias of run_matmul_bias: 0 none, 1 contiguous, 2 strided (L_GAP), 3 one
 * element off the alignment (the last two: added after the product). */
static int bias_mode;

/* a [..., M, K] (la: layout; ta: stored transposed), b likewise, batch
 * shapes ab/bb broadcast to yb. */
static void run_matmul(sj_dtype dt, int nb, const int64_t *yb, const int64_t *ab, const int64_t *bb, int64_t M,
                       int64_t K, int64_t N, int la, int ta, int lb, int tb, int ly, int ty) {
    tu_mm_shapes s;
    tu_matmul_shapes(&s, nb, yb, ab, bb, M, K, N, ta, tb, ty);
    sj_tensor a0 = rnd(dt, s.rank, s.a, la), b0 = rnd(dt, s.rank, s.b, lb), yc, y = out_like(dt, s.rank, s.y, ly, &yc);
    sj_tensor da0 = to_dev(&a0), db0 = to_dev(&b0), dy = to_dev(&y);
    a0 = tu_matmul_view(&a0, nb, ta);
    b0 = tu_matmul_view(&b0, nb, tb);
    da0 = tu_matmul_view(&da0, nb, ta);
    db0 = tu_matmul_view(&db0, nb, tb);
    y = tu_matmul_view(&y, nb, ty);
    yc = tu_matmul_view(&yc, nb, ty);
    dy = tu_matmul_view(&dy, nb, ty);
    sj_tensor a = tu_broadcast(&a0, s.rank, s.af), b = tu_broadcast(&b0, s.rank, s.bf);
    sj_tensor da = tu_broadcast(&da0, s.rank, s.af), db = tu_broadcast(&db0, s.rank, s.bf);
    double *rf = ref(tu_numel(&y)), *mg = mag(tu_numel(&y));
    tu_ref_matmul(&a, &b, rf, mg);
    sj_tensor bh = {0}, dbias = {0}, *hb = NULL, *db_ = NULL;
    if (bias_mode) {
        bh = rnd(dt, 1, S(N), bias_mode == 2 ? L_GAP : L_CONTIG);
        dbias = to_dev_at(&bh, bias_mode == 3);
        hb = &bh, db_ = &dbias;
        for (int64_t i = 0; i < tu_numel(&y); i++) {
            rf[i] += tu_get(&bh, i % N);
            mg[i] += fabs(tu_get(&bh, i % N));
        }
    }
    assert_int_equal(sj_cpu_matmul_bias(&a, &b, hb, &yc, NULL), SJ_OK);
    settle();
    const char *what = label("matmul dtype %d batch %d M %lld K %lld N %lld lay %d%d%d%d%d%d bias %d", dt, nb,
                             (long long)M, (long long)K, (long long)N, la, ta, lb, tb, ly, ty, bias_mode);
    finish(sj_cuda_matmul_bias(&ex, &da, &db, db_, &dy), &dy, &y, what);
    expect(&y, &yc, rf, mg, tu_tol(dt), what);
}

static void matmul_cases(void) {
    tu_matmul_cases(true, run_matmul);
    /* integer products past 2^31: exact in i64, wrapping in i32 */
    for (int d = 3; d < 5; d++) {
        sj_tensor a, b, y;
        int64_t want = tu_matmul_wrap_case(tu_numeric[d], &a, &b, &y);
        sj_tensor da = to_dev(&a), db = to_dev(&b), dy = to_dev(&y);
        settle();
        finish(sj_cuda_matmul(&ex, &da, &db, &dy), &dy, &y, "int matmul wrap");
        assert_true(tu_geti(&y, 0) == want);
    }
}

static void test_matmul(void **state) { matmul_cases(); }

/* The same on a second stream (workspaces come from the allocator on the
 * product's stream). */
static void test_matmul_stream(void **state) {
    CUstream s = NULL, keep = ex.stream;
    assert_int_equal(dev->api.StreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    ex.stream = s;
    for (int d = 0; d < 3; d++) {
        run_matmul(tu_floats[d], 1, S(3), S(3), S(1), 33, 70, 20, L_CONTIG, 1, L_GAP, 0, L_CONTIG, 0);
        run_matmul(tu_floats[d], 0, NULL, NULL, NULL, 128, 256, 96, L_CONTIG, 0, L_CONTIG, 0, L_CONTIG, 1);
    }
    teardown(state);
    ex.stream = keep;
    assert_int_equal(dev->api.StreamDestroy(s), CUDA_SUCCESS);
}

/* y = a @ b + bias, the bias added by cuBLASLt's epilogue (a row-major
 * result, a contiguous aligned bias; also over strided batches with b per
 * batch) or by a kernel after the product (a column-major result, a
 * strided bias, a misaligned one), and with K = 0 (the bias alone); every
 * result against float64 and the CPU kernel. */
static void test_matmul_bias(void **state) {
    for (int d = 0; d < 3; d++) {
        sj_dtype dt = tu_floats[d];
        for (bias_mode = 1; bias_mode <= 3; bias_mode++) {
            run_matmul(dt, 0, NULL, NULL, NULL, 33, 70, 20, L_CONTIG, 0, L_CONTIG, 0, L_CONTIG, 0);
            run_matmul(dt, 0, NULL, NULL, NULL, 17, 40, 24, L_CONTIG, 1, L_CONTIG, 0, L_CONTIG, 1);
        }
        bias_mode = 1;
        run_matmul(dt, 0, NULL, NULL, NULL, 128, 256, 96, L_CONTIG, 0, L_CONTIG, 0, L_CONTIG, 0);
        run_matmul(dt, 1, S(3), S(3), S(3), 9, 32, 48, L_CONTIG, 0, L_CONTIG, 0, L_CONTIG, 0);
        run_matmul(dt, 1, S(3), S(3), S(1), 9, 32, 48, L_CONTIG, 0, L_CONTIG, 0, L_CONTIG, 0);
        run_matmul(dt, 0, NULL, NULL, NULL, 5, 0, 24, L_CONTIG, 0, L_CONTIG, 0, L_CONTIG, 0);
    }
    bias_mode = 0;
}

/* Algorithms are chosen per size class of m and n (lt_class in
 * eager_cuda.c: powers of two to 64, then four per octave) and reused by
 * every size in the class. A stream of lengths through a few classes, both
 * orientations of the result, each product against float64: the first
 * length of a class picks its algorithm, the others reuse it. The classes
 * are crossed going up and then coming down, so a reused algorithm also
 * serves sizes other than the one it was checked with. */
static void test_matmul_size_classes(void **state) {
    static const int64_t lens[] = {33, 47, 64, 65, 100, 127, 129, 191, 200, 257, 300, 3, 5, 7, 190, 130, 66, 40};
    /* a long K, which cuBLASLt splits (a workspace that grows with M):
     * first a size inside class 128, then the class's own size, then a
     * larger one inside it, each needing more workspace than the one the
     * class's algorithm was chosen with */
    static const int64_t split[] = {70, 128, 120, 100};
    for (int d = 0; d < 3; d++)
        for (size_t i = 0; i < sizeof split / sizeof split[0]; i++)
            run_matmul(tu_floats[d], 0, NULL, NULL, NULL, split[i], 3072, 64, L_CONTIG, 0, L_CONTIG, 0, L_CONTIG, 0);
    for (int d = 0; d < 3; d++)
        for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
            /* tokens as M (y row-major: D = y^T, tokens are its n) */
            run_matmul(tu_floats[d], 0, NULL, NULL, NULL, lens[i], 96, 136, L_CONTIG, 0, L_CONTIG, 0, L_CONTIG, 0);
            /* y column-major: tokens are D's m */
            run_matmul(tu_floats[d], 0, NULL, NULL, NULL, lens[i], 72, 120, L_CONTIG, 1, L_CONTIG, 0, L_CONTIG, 1);
        }
}

/* A product whose size class's algorithm cuBLASLt refuses at run time
 * falls back to an algorithm chosen for its exact sizes, cached: the
 * first time the class and the exact sizes are each chosen, the second
 * time the exact sizes' algorithm comes from the cache, and the class's
 * is still used where it runs. Each result against float64. */
static void test_matmul_class_rejected(void **state) {
    (void)state;
    uint64_t n0, n1, n2, n3;
    double ms;
    sj_cuda_matmul_choices(dev, &n0, &ms);
    sj_cuda_test_reject_class(1);
    run_matmul(SJ_F32, 0, NULL, NULL, NULL, 70, 152, 104, L_CONTIG, 0, L_CONTIG, 0, L_CONTIG, 0);
    assert_int_equal(sj_cuda_test_reject_class(0), 0); /* the class's run was refused */
    sj_cuda_matmul_choices(dev, &n1, &ms);
    assert_int_equal(n1 - n0, 2); /* the class (M 80), then M 70 itself */
    sj_cuda_test_reject_class(1);
    run_matmul(SJ_F32, 0, NULL, NULL, NULL, 70, 152, 104, L_CONTIG, 0, L_CONTIG, 0, L_CONTIG, 0);
    assert_int_equal(sj_cuda_test_reject_class(0), 0);
    sj_cuda_matmul_choices(dev, &n2, &ms);
    assert_int_equal(n2, n1); /* the exact algorithm from the cache */
    run_matmul(SJ_F32, 0, NULL, NULL, NULL, 75, 152, 104, L_CONTIG, 0, L_CONTIG, 0, L_CONTIG, 0);
    sj_cuda_matmul_choices(dev, &n3, &ms);
    assert_int_equal(n3, n2); /* another member of the class: the class's algorithm */
}

/* The algorithm table grows past its first 256 slots and keeps every
 * choice: 300 products of distinct K, each chosen once, then all of them
 * again with no new choice. Each result against float64. */
static void test_matmul_algorithm_table(void **state) {
    (void)state;
    uint64_t n0, n1, n2;
    double ms;
    sj_cuda_matmul_choices(dev, &n0, &ms);
    for (int64_t K = 1001; K <= 1300; K++)
        run_matmul(SJ_F32, 0, NULL, NULL, NULL, 8, K, 8, L_CONTIG, 0, L_CONTIG, 0, L_CONTIG, 0);
    sj_cuda_matmul_choices(dev, &n1, &ms);
    assert_int_equal(n1 - n0, 300);
    for (int64_t K = 1300; K >= 1001; K--)
        run_matmul(SJ_F32, 0, NULL, NULL, NULL, 8, K, 8, L_CONTIG, 0, L_CONTIG, 0, L_CONTIG, 0);
    sj_cuda_matmul_choices(dev, &n2, &ms);
    assert_int_equal(n2, n1);
}

/* Warming: the first product of a new size class of n (tokens) has the
 * other classes of n up to 512 chosen and run in the background, so
 * products of those sizes then make no choice of their own. Each result
 * against float64. (The other tests run with warming off: they count
 * choices.) */
static void test_matmul_warming(void **state) {
    (void)state;
    uint64_t n0, n1;
    double ms;
    sj_cuda_matmul_warming(dev, 1);
    run_matmul(SJ_F32, 0, NULL, NULL, NULL, 70, 200, 128, L_CONTIG, 0, L_CONTIG, 0, L_CONTIG, 0);
    sj_cuda_matmul_warm_wait(dev);
    sj_cuda_matmul_choices(dev, &n0, &ms);
    static const int64_t later[] = {20, 150, 300, 500, 3, 64, 97};
    for (size_t i = 0; i < sizeof later / sizeof later[0]; i++)
        run_matmul(SJ_F32, 0, NULL, NULL, NULL, later[i], 200, 128, L_CONTIG, 0, L_CONTIG, 0, L_CONTIG, 0);
    sj_cuda_matmul_choices(dev, &n1, &ms);
    sj_cuda_matmul_warming(dev, 0);
    assert_int_equal(n1, n0);
}

/* Products from 8 threads at once on one cuBLASLt handle: 4 streams (two
 * threads on each, the device's own among them), two sets of 12 shapes
 * (four threads on each, two of them on the same stream), each shape 4
 * times, every result against float64. The shapes are small outputs over
 * a long K, which cuBLASLt splits (split-K: partial sums in the workspace,
 * then a reduction kernel), so two threads' products interleave on a
 * stream: what a workspace shared between products gets wrong (see
 * eager_fns in eager_cuda.c). */
typedef struct mm_job {
    int id;
    CUstream stream;
    int bad, failures;
} mm_job;

static void *matmul_thread(void *p) {
    mm_job *j = p;
    sj_cuda_exec e = {.cuda = dev, .stream = j->stream};
    uint64_t st = 0x9E3779B97F4A7C15ull * (uint64_t)(j->id + 1);
    for (int round = 0; round < 4; round++)
        for (int64_t M = 1; M <= 12; M++) {
            int64_t K = 2048 + j->id % 2, N = 40 + M, n[3] = {M * K, K * N, M * N};
            float *h[3];
            CUdeviceptr d[3] = {0, 0, 0};
            for (int i = 0; i < 3; i++) {
                h[i] = malloc((size_t)n[i] * sizeof(float));
                d[i] = sj_cuda_alloc(dev, (size_t)n[i] * sizeof(float), j->stream);
            }
            for (int i = 0; i < 2; i++)
                for (int64_t x = 0; x < n[i]; x++) {
                    st = st * 6364136223846793005ull + 1442695040888963407ull;
                    h[i][x] = (float)((double)(st >> 11) / 9007199254740992.0 * 2 - 1);
                }
            sj_tensor a = sj_tensor_make((void *)(uintptr_t)d[0], SJ_F32, 2, S(M, K));
            sj_tensor b = sj_tensor_make((void *)(uintptr_t)d[1], SJ_F32, 2, S(K, N));
            sj_tensor y = sj_tensor_make((void *)(uintptr_t)d[2], SJ_F32, 2, S(M, N));
            a.device = b.device = y.device = SJ_CUDA;
            if (!d[0] || !d[1] || !d[2] || sj_cuda_to_device(dev, d[0], h[0], (size_t)n[0] * 4) ||
                sj_cuda_to_device(dev, d[1], h[1], (size_t)n[1] * 4) || sj_cuda_matmul(&e, &a, &b, &y) ||
                dev->api.StreamSynchronize(j->stream) != CUDA_SUCCESS ||
                sj_cuda_to_host(dev, h[2], d[2], (size_t)n[2] * 4))
                j->failures++;
            else
                for (int64_t r = 0; r < M; r++)
                    for (int64_t c = 0; c < N; c++) {
                        double want = 0, m = 0;
                        for (int64_t k = 0; k < K; k++) {
                            want += (double)h[0][r * K + k] * h[1][k * N + c];
                            m += fabs((double)h[0][r * K + k] * h[1][k * N + c]);
                        }
                        j->bad += fabs(h[2][r * N + c] - want) > 1e-5 * m + 1e-30;
                    }
            for (int i = 0; i < 3; i++) {
                sj_cuda_free(dev, d[i], j->stream);
                free(h[i]);
            }
        }
    return NULL;
}

static void test_matmul_threads(void **state) {
    (void)state;
    enum { T = 8 };
    CUstream streams[4] = {dev->stream};
    sj_cuda_bind(dev);
    for (int i = 1; i < 4; i++)
        assert_int_equal(dev->api.StreamCreate(&streams[i], CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    pthread_t th[T];
    mm_job jobs[T];
    for (int i = 0; i < T; i++) {
        jobs[i] = (mm_job){i, streams[i % 4], 0, 0};
        assert_int_equal(pthread_create(&th[i], NULL, matmul_thread, &jobs[i]), 0);
    }
    for (int i = 0; i < T; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(jobs[i].failures, 0);
        assert_int_equal(jobs[i].bad, 0);
    }
    for (int i = 1; i < 4; i++) {
        assert_int_equal(dev->api.StreamSynchronize(streams[i]), CUDA_SUCCESS);
        dev->api.StreamDestroy(streams[i]);
    }
}


/* -- Arange and masked attention (issue 26) ------------------------------------ */

/* y[i] = i in every dtype but bool, contiguous and strided, against float64
 * and the CPU kernel; nothing written between the elements. */
static void test_arange(void **state) {
    static const sj_dtype dts[] = {SJ_F32, SJ_F16, SJ_BF16, SJ_I32, SJ_I64};
    static const int64_t ns[] = {0, 1, 37, 70001};
    for (int d = 0; d < 5; d++)
        for (int k = 0; k < 4; k++)
            for (int lay = 0; lay < 2; lay++) {
                int64_t n = ns[k];
                sj_tensor yc, y = out_like(dts[d], 1, &n, lay ? L_GAP : L_CONTIG, &yc);
                double *r = ref(n);
                for (int64_t i = 0; i < n; i++) r[i] = tu_round(dts[d], (double)(float)i);
                if (dts[d] == SJ_I32 || dts[d] == SJ_I64)
                    for (int64_t i = 0; i < n; i++) r[i] = (double)i;
                assert_int_equal(sj_cpu_arange(&yc), SJ_OK);
                sj_tensor dy = to_dev(&y);
                settle();
                const char *what = label("arange %s n %lld lay %d", sj_dtype_name(dts[d]), (long long)n, lay);
                finish(sj_cuda_arange(&ex, &dy), &dy, &y, what);
                expect(&y, &yc, r, NULL, 0, what);
            }
}

/* Additive masks (f32, q's dtype) and bool masks, broadcast over heads
 * (stride 0), with and without causal; f16/bf16 (D = 64, Dv = 32) take the
 * shared-memory tensor-core kernel with its mask, f32 the general one.
 * Against float64 and the CPU kernel. */
static void test_attention_mask(void **state) {
    tu_seed(2609);
    for (int d = 0; d < 3; d++)
        for (int m = 0; m < 3; m++)
            for (int causal = 0; causal < 2; causal++) {
                sj_dtype dt = tu_floats[d], mdt = m == 0 ? SJ_F32 : m == 1 ? dt : SJ_BOOL;
                const int64_t B = 2, H = 3, Sq = 5, Sk = 70, D = 64, Dv = 32;
                sj_tensor q = rnd(dt, 4, S(B, H, Sq, D), L_CONTIG), k = rnd(dt, 4, S(B, H, Sk, D), L_CONTIG);
                sj_tensor v = rnd(dt, 4, S(B, H, Sk, Dv), L_CONTIG);
                sj_tensor mask = tu_random_mask(mdt, 4, S(B, 1, Sq, Sk)); /* row 0: every key masked */
                sj_tensor mb = tu_broadcast(&mask, 4, S(B, H, Sq, Sk));
                sj_tensor yc, y = out_like(dt, 4, S(B, H, Sq, Dv), L_CONTIG, &yc);
                double *r = ref(tu_numel(&y));
                tu_ref_attention_mask(&q, &k, &v, &mask, 0.125, causal, r);
                assert_int_equal(sj_cpu_attention_mask(&q, &k, &v, NULL, &mb, 0.125, causal, &yc, NULL), SJ_OK);
                sj_tensor dq = to_dev(&q), dk = to_dev(&k), dv = to_dev(&v), dm = to_dev(&mask), dy = to_dev(&y);
                sj_tensor dmb = dm;
                dmb.rank = 4;
                for (int i = 0; i < 4; i++) dmb.shape[i] = mb.shape[i], dmb.stride[i] = mb.stride[i];
                settle();
                const char *what = label("attention mask %s mask %s causal %d", sj_dtype_name(dt), sj_dtype_name(mdt),
                                         causal);
                finish(sj_cuda_attention_mask(&ex, &dq, &dk, &dv, NULL, &dmb, 0.125, causal, &dy), &dy, &y, what);
                expect(&y, &yc, r, NULL, 2 * tu_tol(dt), what);
            }
}

/* float64 attention of q, k, v [B, H, S*, D*] (contiguous) with the mask
 * view mb [B, H, Sq, Sk] (NULL: none; bool: false masks), key lengths
 * lens (NULL: all), causal; a query with no key left gives zeros. */
static void ref_att_mask(const sj_tensor *q, const sj_tensor *k, const sj_tensor *v, const sj_tensor *mb,
                         const int64_t *lens, double scale, int causal, double *out, double *mag) {
    int64_t B = q->shape[0], H = q->shape[1], Sq = q->shape[2], D = q->shape[3], Sk = k->shape[2],
            Dv = v->shape[3];
    double *p = malloc(sizeof(double) * (size_t)(Sk ? Sk : 1));
    assert_non_null(p);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < Sq; i++) {
                double mx = -INFINITY, sum = 0;
                for (int64_t j = 0; j < Sk; j++) {
                    double dot = 0;
                    for (int64_t d = 0; d < D; d++)
                        dot += tu_get(q, ((b * H + h) * Sq + i) * D + d) * tu_get(k, ((b * H + h) * Sk + j) * D + d);
                    double sc = dot * scale;
                    if (mb) {
                        double mv = tu_get(mb, ((b * H + h) * Sq + i) * Sk + j);
                        sc = mb->dtype == SJ_BOOL ? (mv != 0 ? sc : -INFINITY) : sc + mv;
                    }
                    if ((lens && j >= lens[b]) || (causal && j > i + Sk - Sq)) sc = -INFINITY;
                    p[j] = sc;
                    if (sc > mx) mx = sc;
                }
                for (int64_t j = 0; j < Sk; j++) sum += p[j] = mx == -INFINITY ? 0 : exp(p[j] - mx);
                for (int64_t e = 0; e < Dv; e++) {
                    double acc = 0, am = 0;
                    for (int64_t j = 0; j < Sk; j++) {
                        double t = p[j] * tu_get(v, ((b * H + h) * Sk + j) * Dv + e);
                        acc += t, am += fabs(t);
                    }
                    out[((b * H + h) * Sq + i) * Dv + e] = sum > 0 ? acc / sum : 0;
                    if (mag) mag[((b * H + h) * Sq + i) * Dv + e] = sum > 0 ? am / sum : 0;
                }
            }
    free(p);
}

/* Masked attention on tensor cores (f16, bf16): additive f32 and q-dtype
 * masks, bool masks (random, and left padding [B, 1, 1, Sk]), broadcast
 * from [1, 1, Sq, Sk] and [B, 1, Sq, Sk], full, or a transposed view, with and without key
 * lengths and causal, D = 32 / 64 / 128 (the register kernels
 * attention_mmam, one or two key groups) and 48 (the shared-memory kernel
 * attention_tc), odd Sq and Sk. Rows whose every key is masked (row 0 of
 * the random masks, a batch padded whole, a length of 0) give zeros as the
 * f32 kernel does. Against float64 and the CPU kernel; each call must have
 * taken a tensor-core kernel (sj_cuda_attention_tc_calls). */
/* mask shapes: [1,1,Sq,Sk], [B,1,Sq,Sk], [B,H,Sq,Sk], [B,1,1,Sk], and [B,1,Sk,Sq] transposed (key stride Sq) */
enum { MK_BSQ, MK_BHSQ, MK_FULL, MK_LEFTPAD, MK_TRANS };
static void test_attention_mask_tc(void **state) {
    (void)state;
    static const struct {
        int64_t B, H, Sq, Sk, D;
        int shape, mdt, lens, causal; /* mdt: 0 f32, 1 q's dtype, 2 bool */
    } cs[] = {
        {2, 3, 17, 130, 64, MK_BHSQ, 0, 0, 0},  {2, 2, 130, 130, 64, MK_BSQ, 1, 1, 1},
        {3, 2, 1, 257, 32, MK_LEFTPAD, 2, 1, 0}, {1, 2, 257, 17, 128, MK_BHSQ, 0, 0, 1},
        {2, 2, 130, 257, 128, MK_FULL, 2, 1, 1}, {2, 1, 257, 130, 32, MK_BSQ, 0, 1, 0},
        {3, 2, 17, 1, 64, MK_LEFTPAD, 2, 0, 0},  {2, 2, 70, 130, 48, MK_BSQ, 1, 0, 1},
        {1, 3, 130, 257, 64, MK_LEFTPAD, 2, 0, 1}, {2, 34, 130, 130, 64, MK_BSQ, 0, 1, 1}, /* one key group */
        {2, 2, 130, 70, 64, MK_TRANS, 1, 1, 0},   {2, 3, 17, 130, 128, MK_TRANS, 2, 0, 1},
    };
    if (dev->cc_major < 8) {
        print_message("skipped: tensor cores need compute capability 8.0 (this device %d.%d)\n", dev->cc_major,
                      dev->cc_minor);
        return;
    }
    tu_seed(2650);
    for (int d = 1; d < 3; d++)
        for (int c = 0; c < NELEM(cs); c++) {
            sj_dtype dt = tu_floats[d];
            const int64_t B = cs[c].B, H = cs[c].H, Sq = cs[c].Sq, Sk = cs[c].Sk, D = cs[c].D;
            sj_dtype mdt = cs[c].mdt == 0 ? SJ_F32 : cs[c].mdt == 1 ? dt : SJ_BOOL;
            sj_tensor q = rnd(dt, 4, S(B, H, Sq, D), L_CONTIG), k = rnd(dt, 4, S(B, H, Sk, D), L_CONTIG);
            sj_tensor v = rnd(dt, 4, S(B, H, Sk, D), L_CONTIG);
            sj_tensor mask;
            if (cs[c].shape == MK_LEFTPAD) { /* batch b: its first (b * Sk) / (B - 1) keys padded; the last whole */
                mask = make(SJ_BOOL, 4, S(B, 1, 1, Sk), L_CONTIG);
                for (int64_t b = 0; b < B; b++)
                    for (int64_t j = 0; j < Sk; j++) tu_seti(&mask, b * Sk + j, j >= (b * Sk) / (B > 1 ? B - 1 : 1));
            } else if (cs[c].shape == MK_TRANS) {
                sj_tensor mt = tu_random_mask(mdt, 4, S(B, 1, Sk, Sq)); /* key 0 masked for every query */
                mask = tu_transpose(&mt, 2, 3);
            } else {
                int64_t mB = cs[c].shape == MK_BSQ ? 1 : B, mH = cs[c].shape == MK_FULL ? H : 1;
                mask = tu_random_mask(mdt, 4, S(mB, mH, Sq, Sk)); /* row 0 (Sq > 1): every key masked */
            }
            sj_tensor mb = tu_broadcast(&mask, 4, S(B, H, Sq, Sk));
            int64_t lens[3] = {Sk, Sk, Sk};
            sj_tensor l = make(SJ_I32, 1, S(B), L_CONTIG);
            for (int64_t b = 0; b < B; b++) {
                if (cs[c].lens) lens[b] = b == 0 ? Sk / 2 + 1 : b == 1 ? Sk : 0;
                tu_seti(&l, b, lens[b]);
            }
            sj_tensor yc, y = out_like(dt, 4, S(B, H, Sq, D), L_CONTIG, &yc);
            double *r = ref(tu_numel(&y)), *mg = mag(tu_numel(&y));
            ref_att_mask(&q, &k, &v, &mb, lens, 0.125, cs[c].causal, r, mg);
            const sj_tensor *lp = cs[c].lens ? &l : NULL;
            assert_int_equal(sj_cpu_attention_mask(&q, &k, &v, lp, &mb, 0.125, cs[c].causal, &yc, NULL), SJ_OK);
            sj_tensor dq = to_dev(&q), dk = to_dev(&k), dv = to_dev(&v), dm = to_dev(&mask), dy = to_dev(&y);
            sj_tensor dl = to_dev(&l), dmb = dm;
            dmb.rank = 4;
            for (int i = 0; i < 4; i++) dmb.shape[i] = mb.shape[i], dmb.stride[i] = mb.stride[i];
            settle();
            const char *what = label("tc attention mask %s mask %s case %d (B %lld H %lld Sq %lld Sk %lld D %lld "
                                     "lens %d causal %d)", sj_dtype_name(dt), sj_dtype_name(mdt), c, (long long)B,
                                     (long long)H, (long long)Sq, (long long)Sk, (long long)D, cs[c].lens,
                                     cs[c].causal);
            /* the kernel the call takes: a register one for D = 32/64/128, the shared-memory one for 48 */
            int kg = sj_cuda_attention_groups(dev, dt, B, H, Sq, Sk, D, D);
            assert_true(D == 48 ? kg == 0 && sj_cuda_attention_tiles(dev, dt, B, H, Sq, D, D) > 0 : kg > 0);
            uint64_t m0, m1, v0, v1;
            sj_cuda_attention_tc_calls(&m0, &v0);
            finish(sj_cuda_attention_mask(&ex, &dq, &dk, &dv, lp ? &dl : NULL, &dmb, 0.125, cs[c].causal, &dy), &dy,
                   &y, what);
            sj_cuda_attention_tc_calls(&m1, &v1);
            assert_int_equal(m1, m0 + 1);
            expect(&y, &yc, r, mg, 2 * tu_tol(dt), what); /* (relative to sum |p v|: the kernel's p are halves) */
        }
}

/* -- Attention -------------------------------------------------------------- */

static void run_attention(sj_dtype dt, int64_t B, int64_t H, int64_t Sq, int64_t Sk, int64_t D, int64_t Dv,
                          const int64_t *lens, sj_dtype ldt, int causal, int lay) {
    tu_attention a;
    tu_attention_case(&a, dt, B, H, Sq, Sk, D, Dv, lens, ldt, lay == 2 ? L_GAP : L_CONTIG, causal, lay);
    sj_tensor yc = tu_attention_out(dt, B, H, Sq, Dv, lay);
    assert_int_equal(sj_cpu_attention(&a.q, &a.k, &a.v, a.lp, a.scale, causal, &yc, NULL), SJ_OK);
    sj_tensor dq = to_dev(&a.q), dk = to_dev(&a.k), dv = to_dev(&a.v), dy = to_dev(&a.y), dl = to_dev(&a.l);
    settle();
    const char *what = label("attention dtype %d B %lld H %lld Sq %lld Sk %lld D %lld Dv %lld causal %d lens %d lay %d",
                             dt, (long long)B, (long long)H, (long long)Sq, (long long)Sk, (long long)D,
                             (long long)Dv, causal, lens != NULL, lay);
    finish(sj_cuda_attention(&ex, &dq, &dk, &dv, lens ? &dl : NULL, a.scale, causal, &dy), &dy, &a.y, what);
    expect(&a.y, &yc, a.ref, a.mag, tu_tol(dt), what);
}

/* The cases with head sizes in multiples of 16 run on tensor cores in f16
 * and bf16 (on this device: compute capability 8.0 or later): D = Dv = 32,
 * 64, 96 or 128 in registers (the cases of tu_attention_cases with two key
 * groups where they have more than one key tile, the many-heads one with
 * one), others through shared memory with two key tiles when all their
 * blocks fit at once, else one. */
static void test_attention(void **state) {
    int tc = dev->cc_major >= 8, many = 4 * dev->sm_count; /* heads: more blocks than fit */
    assert_int_equal(sj_cuda_attention_tiles(dev, SJ_F16, 1, 12, 512, 64, 64), 2 * tc);
    assert_int_equal(sj_cuda_attention_tiles(dev, SJ_BF16, 2, 1, 64, 128, 128), 2 * tc);
    assert_int_equal(sj_cuda_attention_tiles(dev, SJ_F16, 1, many, 130, 32, 32), tc);
    assert_int_equal(sj_cuda_attention_tiles(dev, SJ_BF16, 1, many, 130, 32, 32), tc);
    assert_int_equal(sj_cuda_attention_tiles(dev, SJ_F32, 1, 12, 512, 64, 64), 0);
    /* D = Dv = 32, 64, 96 or 128: the register kernels, with two key
     * groups where the blocks (64 queries) are at most one an SM and there
     * is more than one tile of keys */
    int sms = dev->sm_count;
    assert_int_equal(sj_cuda_attention_groups(dev, SJ_F16, 1, 1, 64 * sms, 512, 64, 64), 2 * tc);
    assert_int_equal(sj_cuda_attention_groups(dev, SJ_BF16, 1, 1, 64 * sms + 1, 512, 128, 128), tc);
    assert_int_equal(sj_cuda_attention_groups(dev, SJ_F16, 1, 1, 64, 64, 32, 32), tc);
    assert_int_equal(sj_cuda_attention_groups(dev, SJ_BF16, 2, 3, 100, 65, 96, 96), 2 * tc);
    assert_int_equal(sj_cuda_attention_groups(dev, SJ_F16, 1, 1, 64, 512, 64, 32), 0);
    assert_int_equal(sj_cuda_attention_groups(dev, SJ_F16, 1, 1, 64, 512, 48, 48), 0);
    assert_int_equal(sj_cuda_attention_groups(dev, SJ_F16, 1, 1, 64, 512, 160, 160), 0);
    assert_int_equal(sj_cuda_attention_groups(dev, SJ_F32, 1, 1, 64, 512, 64, 64), 0);
    /* key tiles indexed in int: that many keys go to the wmma kernel */
    assert_int_equal(sj_cuda_attention_groups(dev, SJ_F16, 1, 1, 64, (int64_t)1 << 30, 64, 64), 0);
    assert_int_equal(sj_cuda_attention_tiles(dev, SJ_F16, 1, 1, 64, 64, 64), 2 * tc);
    assert_int_equal(sj_cuda_attention_tiles(dev, SJ_F16, 1, 12, 512, 8, 6), 0);
    assert_int_equal(sj_cuda_attention_tiles(dev, SJ_F16, 1, 12, 512, 256, 256), 0);
    assert_int_equal(sj_cuda_attention_tiles(dev, SJ_F16, 1, many, 130, 48, 48), tc);
    for (int d = 0; d < 3; d++) { /* one key tile; the register kernel with one key group */
        run_attention(tu_floats[d], 1, many, 130, 70, 48, 48, (int64_t[]){50}, SJ_I32, 1, 0);
        run_attention(tu_floats[d], 1, many, 70, 200, 64, 64, (int64_t[]){150}, SJ_I64, 1, 1);
    }
    tu_attention_cases(true, run_attention);
}

/* A NaN reaches only the rows whose scores it enters, on every kernel:
 * q[0, 0, 5, 3] (query 5 of head 0) and k[0, 1, 100, 7] (key 100 of head 1,
 * which every query of head 1 scores) are NaN; the register kernel keeps
 * its running max with fmaxf, which passes over a NaN score, so the row
 * must turn NaN through its P = 2^NaN. Compared with the CPU kernel, and
 * every other row finite. */
static void test_attention_nan(void **state) {
    /* Sq, Sk, D, Dv, causal: the register kernel (D = 64, 128; causal with
     * Sk - Sq = 70, queries 0-29 do not see key 100) and the wmma one (48) */
    static const int64_t dims[][5] = {
        {130, 200, 64, 64, 0}, {70, 300, 128, 128, 1}, {130, 200, 64, 64, 1}, {130, 200, 48, 48, 1}};
    for (int d = 0; d < 2; d++)
        for (int c = 0; c < 4; c++) {
            const int64_t *m = dims[c];
            int64_t H = 2, Sq = m[0], Sk = m[1], D = m[2], Dv = m[3];
            int causal = (int)m[4];
            tu_attention a;
            tu_attention_case(&a, tu_floats[d + 1], 1, H, Sq, Sk, D, Dv, NULL, SJ_I32, L_CONTIG, causal, 0);
            tu_set(&a.q, (0 * Sq + 5) * D + 3, NAN);
            tu_set(&a.k, (1 * Sk + 100) * D + 7, NAN);
            sj_tensor yc = tu_attention_out(tu_floats[d + 1], 1, H, Sq, Dv, 0);
            assert_int_equal(sj_cpu_attention(&a.q, &a.k, &a.v, NULL, a.scale, causal, &yc, NULL), SJ_OK);
            sj_tensor dq = to_dev(&a.q), dk = to_dev(&a.k), dv = to_dev(&a.v), dy = to_dev(&a.y);
            settle();
            const char *what = label("attention NaN dtype %d Sq %lld Sk %lld D %lld causal %d", tu_floats[d + 1],
                                     (long long)Sq, (long long)Sk, (long long)D, causal);
            finish(sj_cuda_attention(&ex, &dq, &dk, &dv, NULL, a.scale, causal, &dy), &dy, &a.y, what);
            for (int64_t h = 0; h < H; h++)
                for (int64_t i = 0; i < Sq; i++) {
                    /* causal: query i sees keys up to i + Sk - Sq */
                    bool sees_k = !causal || i + Sk - Sq >= 100;
                    bool nan_row = (h == 0 && i == 5) || (h == 1 && sees_k);
                    for (int64_t j = 0; j < Dv; j++) {
                        double gy = tu_get(&a.y, (h * Sq + i) * Dv + j), cy = tu_get(&yc, (h * Sq + i) * Dv + j);
                        if (nan_row ? !(isnan(gy) && isnan(cy)) : !(isfinite(gy) && isfinite(cy)))
                            fail_msg("%s: head %lld query %lld column %lld: GPU %g, CPU %g, want %s", what, (long long)h,
                                     (long long)i, (long long)j, gy, cy, nan_row ? "NaN" : "finite");
                    }
                }
        }
}

/* -- Concat and gather ------------------------------------------------------ */

static void run_concat(sj_dtype dt, int axis, int lay, const sj_tensor *xs, const int64_t *ys, const double *r) {
    sj_tensor dxs[4];
    for (int i = 0; i < 4; i++) dxs[i] = to_dev(&xs[i]);
    sj_tensor yc, y = out_like(dt, 3, ys, 3 - lay, &yc);
    assert_int_equal(sj_cpu_concat(xs, 4, axis, &yc), SJ_OK);
    sj_tensor dy = to_dev(&y);
    settle();
    const char *what = label("concat dtype %d axis %d lay %d", dt, axis, lay);
    finish(sj_cuda_concat(&ex, dxs, 4, axis - 3 * (lay & 1), &dy), &dy, &y, what);
    expect(&y, &yc, r, NULL, 0, what);
}

static void test_concat(void **state) { tu_concat_cases(run_concat); }

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
    sj_tensor t, idx;
    double *r = tu_gather_operands(dt, idt, tr, ts, ir, is, lt, &t, &idx, ys);
    sj_tensor yc, y = out_like(dt, ir + tr - 1, ys, ly, &yc);
    assert_int_equal(sj_cpu_gather(&t, &idx, &yc), SJ_OK);
    sj_tensor dt_ = to_dev(&t), di = to_dev(&idx), dy = to_dev(&y);
    settle();
    const char *what = label("gather dtype %d index %d ranks %d/%d lay %d", dt, idt, tr, ir, lt);
    finish(sj_cuda_gather(&ex, &dt_, &di, &dy), &dy, &y, what);
    expect(&y, &yc, r, NULL, 0, what);
    assert_int_equal(read_flag(), 0);
}

static void test_gather(void **state) {
    tu_gather_cases(run_gather);
    /* out of range: the flag is set, the bad position left alone, the rest
     * written */
    const int64_t(*bad)[6] = tu_gather_bad;
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
    sj_cuda_matmul_warming(dev, 0); /* on in test_matmul_warming only: other tests count choices */
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
        T(test_nan_binary), T(test_where),          T(test_cast), T(test_cast_bits),    T(test_copy_transposed),
        T(test_reduce),     T(test_softmax),        T(test_norms),   T(test_matmul),
        T(test_matmul_stream), T(test_matmul_size_classes), T(test_matmul_class_rejected), T(test_matmul_algorithm_table), T(test_matmul_warming), T(test_matmul_bias), T(test_matmul_threads), T(test_attention), T(test_attention_nan), T(test_arange), T(test_attention_mask), T(test_attention_mask_tc),   T(test_concat),  T(test_gather),
        T(test_large),      T(test_layer_norm_offset),
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
