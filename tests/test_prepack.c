/* Constant weights packed once (kernels/cpu/prepack.h): the products over
 * packed panels against float64 references and against the sgemm path, on
 * random inputs (never zero), for every kernel this CPU can run (AVX-512,
 * AVX2+FMA, plain C), rows 1..300, odd K and N, plain and transposed b,
 * f32/f16/bf16, bias or not, one thread or two; and through the public API:
 * each constant packed once however many calls and entries use it, the
 * results those calls give against a runtime that packs nothing, and the
 * eager and fused runs of one entry alike. */
/* cmocka.h needs these first, in this order */
/* clang-format off */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
/* clang-format on */

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/half.h"
#include "kernels/cpu/eager.h"
#include "kernels/cpu/prepack.h"
#include "kernels/cpu/threads.h"
#include "tests/util.h"

#define S(...) ((const int64_t[]){__VA_ARGS__})
#define NELEM(a) ((int)(sizeof(a) / sizeof((a)[0])))

static sj_threads *pool2;

/* -- Kernels ---------------------------------------------------------------- */

/* b K x N: plain (row-major [K, N]) or transposed (a [N, K] tensor seen
 * through its transpose, as a PyTorch Linear weight). */
static sj_tensor weight(sj_dtype dt, int64_t K, int64_t N, int transposed) {
    if (!transposed) return tu_random(dt, 2, S(K, N), TU_CONTIG);
    sj_tensor w = tu_random(dt, 2, S(N, K), TU_CONTIG);
    return tu_transpose(&w, 0, 1);
}

/* One product three ways: the packed path, the sgemm path, float64. a is
 * [M, K] in layout la (contiguous, or padded: converted into scratch), y
 * [M, N] in layout ly (contiguous, or column-major: through scratch). */
static void run_case(sj_dtype dt, int64_t M, int64_t K, int64_t N, int transposed, int biased, int threads, int la,
                     int ly) {
    sj_tensor a = tu_random(dt, 2, S(M, K), la), b = weight(dt, K, N, transposed);
    sj_tensor y = tu_tensor_layout(dt, 2, S(M, N), ly), y2 = tu_tensor_layout(dt, 2, S(M, N), ly);
    sj_tensor bias = {0};
    if (biased) bias = tu_random(dt, 1, S(N), N % 2 ? TU_GAP : TU_CONTIG);
    double *rf = tu_refbuf(0, M * N), *mg = tu_refbuf(1, M * N);
    tu_ref_matmul(&a, &b, rf, mg);
    if (biased)
        for (int64_t i = 0; i < M * N; i++) {
            rf[i] += tu_get(&bias, i % N);
            mg[i] += fabs(tu_get(&bias, i % N));
        }
    sj_cpu_packed *p = NULL;
    assert_int_equal(sj_cpu_pack(&b, &p), SJ_OK);
    assert_true(sj_cpu_packed_rows(p) == K && sj_cpu_packed_cols(p) == N);
    uint64_t before = sj_cpu_packed_products();
    sj_threads *pool = threads > 1 ? pool2 : NULL;
    assert_int_equal(sj_cpu_matmul_packed(&a, &b, p, biased ? &bias : NULL, &y, pool), SJ_OK);
    if (M > 0 && N > 0) assert_true(sj_cpu_packed_products() > before);
    const char *what = tu_label("packed %s dtype %d M %lld K %lld N %lld transposed %d bias %d threads %d la %d ly %d",
                                sj_cpu_isa_name(sj_cpu_packed_isa()), dt, (long long)M, (long long)K, (long long)N,
                                transposed, biased, threads, la, ly);
    assert_true(tu_check_mag(&y, rf, mg, tu_tol(dt), what));
    assert_true(tu_check_gaps(&y, what));
    /* the sgemm path on the same operands: both within the tolerance of it */
    assert_int_equal(sj_cpu_matmul_bias(&a, &b, biased ? &bias : NULL, &y2, pool), SJ_OK);
    double *r2 = tu_refbuf(0, M * N);
    for (int64_t i = 0; i < M * N; i++) r2[i] = tu_get(&y2, i);
    assert_true(tu_check_mag(&y, r2, mg, 2 * tu_tol(dt), what));
    sj_cpu_packed_free(p);
}

static const int64_t Ms[] = {1, 2, 3, 4, 5, 6, 7, 11, 12, 13, 17, 24, 25, 31, 47, 64, 100, 127, 173, 255, 300};
static const int64_t Ks[] = {1, 3, 17, 64, 129, 384};
static const int64_t Ns[] = {1, 5, 15, 16, 17, 33, 100};

/* Every row count with K and N, layouts and options cycling, for each
 * kernel this CPU has. */
static void test_products(void **state) {
    sj_cpu_isa best = sj_cpu_packed_isa_cap(-1);
    for (int isa = SJ_CPU_ISA_C; isa <= (int)best; isa++) {
        assert_int_equal(sj_cpu_packed_isa_cap(isa), isa);
        print_message("kernel %s\n", sj_cpu_isa_name((sj_cpu_isa)isa));
        int c = 0;
        for (int mi = 0; mi < NELEM(Ms); mi++)
            for (int v = 0; v < 4; v++, c++) {
                int64_t K = Ks[(mi + v) % NELEM(Ks)], N = Ns[(mi * 3 + v) % NELEM(Ns)];
                sj_dtype dt = tu_floats[c % 3];
                run_case(dt, Ms[mi], K, N, v & 1, (c / 3) % 2, 1 + (v >> 1), c % 5 == 4 ? TU_GAP : TU_CONTIG,
                         c % 7 == 6 ? TU_REV : TU_CONTIG);
                tu_free_all();
            }
        /* every tile height each kernel has (AVX-512: up to 28 rows) */
        for (int64_t M = 1; M <= 60; M++) {
            run_case(SJ_F32, M, 37, 19, (int)M & 1, 1, 1, TU_CONTIG, TU_CONTIG);
            tu_free_all();
        }
        /* the BERT shapes, a sentence of 11 tokens and a batch of 300 */
        for (int t = 1; t <= 2; t++) {
            run_case(SJ_F32, 11, 384, 1536, 0, 1, t, TU_CONTIG, TU_CONTIG);
            run_case(SJ_F32, 300, 1536, 384, 1, 1, t, TU_CONTIG, TU_CONTIG);
            tu_free_all();
        }
    }
    sj_cpu_packed_isa_cap(-1);
}

/* Empty sums and empty results: K 0 gives the bias alone (or zeros). */
static void test_edges(void **state) {
    for (int biased = 0; biased < 2; biased++) {
        run_case(SJ_F32, 5, 0, 17, 0, biased, 1, TU_CONTIG, TU_CONTIG);
        run_case(SJ_F32, 0, 9, 17, 0, biased, 2, TU_CONTIG, TU_CONTIG);
        run_case(SJ_F16, 3, 9, 0, 1, biased, 1, TU_CONTIG, TU_CONTIG);
    }
}

/* A batch of products sharing b: a [3, M, K] (contiguous, collapsing into
 * one product of 3M rows, or padded, one product per batch). */
static void test_batches(void **state) {
    for (int lay = 0; lay < 2; lay++) {
        int64_t M = 7, K = 19, N = 21;
        sj_tensor a = tu_random(SJ_F32, 3, S(3, M, K), lay ? TU_GAP : TU_CONTIG), b0 = weight(SJ_F32, K, N, lay);
        sj_tensor b = tu_broadcast(&b0, 3, S(3, K, N)), y = tu_tensor(SJ_F32, 3, S(3, M, N));
        double *rf = tu_refbuf(0, 3 * M * N), *mg = tu_refbuf(1, 3 * M * N);
        tu_ref_matmul(&a, &b, rf, mg);
        sj_cpu_packed *p = NULL;
        assert_int_equal(sj_cpu_pack(&b0, &p), SJ_OK);
        assert_int_equal(sj_cpu_matmul_packed(&a, &b, p, NULL, &y, pool2), SJ_OK);
        assert_true(tu_check_mag(&y, rf, mg, tu_tol(SJ_F32), tu_label("batched, layout %d", lay)));
        sj_cpu_packed_free(p);
    }
}

/* What cannot be packed is refused with a message; the cache packs a
 * tensor once, a different view of it again; find packs nothing; the
 * bytes a copy counts against a bound (the runtime's: test_fn_bound)
 * cover what the copy holds. */
static void test_cache(void **state) {
    sj_tensor batch = tu_random(SJ_F32, 3, S(2, 4, 4), TU_CONTIG), ints = tu_random(SJ_I32, 2, S(4, 4), TU_CONTIG);
    sj_cpu_packed *p = NULL;
    assert_int_equal(sj_cpu_pack(&batch, &p), SJ_EINVAL);
    assert_non_null(strstr(sj_last_error(), "single matrix"));
    assert_int_equal(sj_cpu_pack(&ints, &p), SJ_EINVAL);
    assert_null(p);

    sj_cpu_pack_cache *c = sj_cpu_pack_cache_create();
    sj_tensor w = tu_random(SJ_F32, 2, S(40, 24), TU_CONTIG), wt = tu_transpose(&w, 0, 1);
    sj_tensor w3 = w; /* the same matrix with a leading axis of 1 */
    w3.rank = 3, w3.shape[0] = 1, w3.shape[1] = 40, w3.shape[2] = 24, w3.stride[0] = 960, w3.stride[1] = 24,
    w3.stride[2] = 1;
    uint64_t packs = sj_cpu_pack_count(), n, bytes;
    assert_null(sj_cpu_pack_cache_find(c, &w));
    assert_true(sj_cpu_pack_count() == packs);
    const sj_cpu_packed *p1 = sj_cpu_pack_cache_get(c, &w);
    assert_non_null(p1);
    assert_ptr_equal(sj_cpu_pack_cache_find(c, &w), p1);
    assert_ptr_equal(sj_cpu_pack_cache_find(c, &w3), p1);
    assert_null(sj_cpu_pack_cache_find(c, &wt));
    assert_true(sj_cpu_pack_need(&w) >= sj_cpu_packed_bytes(p1) && sj_cpu_pack_need(&w) == sj_cpu_pack_need(&w3));
    assert_int_equal(sj_cpu_pack_need(&ints), 0);
    assert_int_equal(sj_cpu_pack_need(&batch), 0);
    for (int i = 0; i < 10; i++) assert_ptr_equal(sj_cpu_pack_cache_get(c, &w), p1);
    assert_ptr_equal(sj_cpu_pack_cache_get(c, &w3), p1);
    const sj_cpu_packed *p2 = sj_cpu_pack_cache_get(c, &wt);
    assert_non_null(p2);
    assert_ptr_not_equal(p1, p2);
    assert_null(sj_cpu_pack_cache_get(c, &ints));
    assert_true(sj_cpu_pack_count() == packs + 2);
    sj_cpu_pack_cache_stats(c, &n, &bytes);
    assert_true(n == 2 && bytes >= (40 * 32 + 24 * 48) * sizeof(float) &&
                bytes == sj_cpu_packed_bytes(p1) + sj_cpu_packed_bytes(p2));
    assert_true(sj_cpu_pack_need(&wt) >= sj_cpu_packed_bytes(p2));
    sj_cpu_pack_cache_destroy(c);
    sj_cpu_pack_cache_destroy(NULL);
    assert_null(sj_cpu_pack_cache_find(NULL, &w));
}

/* -- Through the public API -------------------------------------------------- */

typedef struct weights {
    sj_tensor w, wt, b; /* w [K, N]; wt [N, K] (used transposed); b [N] */
} weights;

/* y1 = x @ w + b (a product with its bias), y2 = gelu(x @ wt^T) + b */
static sj_status m_linear(sj_tracer *t, const sj_val *in, int n, void *user) {
    weights *ws = user;
    sj_val w = sj_param(t, &ws->w), wt = sj_param(t, &ws->wt), b = sj_param(t, &ws->b);
    sj_val y1 = sj_add(t, sj_matmul(t, in[0], w), b);
    sj_val y2 = sj_add(t, sj_gelu(t, sj_matmul(t, in[0], sj_permute(t, wt, (const int[]){1, 0}))), b);
    sj_output(t, y1);
    return sj_output(t, y2);
}

static sj_runtime *runtime(sj_compile_mode mode, uint64_t prepack) {
    sj_runtime_config cfg;
    sj_runtime_config_init(&cfg);
    cfg.backend = SJ_BACKEND_CPU;
    cfg.log_mask = 0;
    cfg.compile_mode = mode;
    cfg.cache_dir = "";
    cfg.exec_threads = 2;
    cfg.prepack_max_bytes = prepack;
    sj_runtime *rt = NULL;
    assert_int_equal(sj_runtime_create(&cfg, &rt), SJ_OK);
    return rt;
}

static sj_fn *linear_fn(sj_runtime *rt, weights *ws, sj_dynamic dyn) {
    sj_fn_options o;
    sj_fn_options_init(&o);
    o.dynamic = dyn;
    o.hot_threshold = 1;
    sj_fn *fn = NULL;
    assert_int_equal(sj_fn_create(rt, "linear", 1, m_linear, ws, &o, &fn), SJ_OK);
    return fn;
}

static weights make_weights(sj_dtype dt, int64_t K, int64_t N) {
    weights ws = {.w = tu_random(dt, 2, S(K, N), TU_CONTIG), .wt = tu_random(dt, 2, S(N, K), TU_CONTIG),
                  .b = tu_random(dt, 1, S(N), TU_CONTIG)};
    return ws;
}

/* Outputs of fn on x (runtime-allocated; free with sj_tensor_free). */
static void run_fn(sj_fn *fn, const sj_tensor *x, sj_tensor *out) {
    memset(out, 0, 2 * sizeof *out);
    if (sj_call(fn, x, 1, out, 2)) fail_msg("sj_call: %s", sj_last_error());
}

static void same_within(const sj_tensor *got, const sj_tensor *want, double tol, const char *what) {
    int64_t n = tu_numel(want);
    double *r = tu_refbuf(0, n);
    for (int64_t i = 0; i < n; i++) r[i] = tu_get(want, i);
    assert_true(tu_check(got, r, tol, what));
}

static int bits_equal(const sj_tensor *a, const sj_tensor *b) {
    size_t bytes = (size_t)tu_numel(a) * (a->dtype == SJ_F32 ? 4 : 2);
    return tu_numel(a) == tu_numel(b) && !memcmp(a->data, b->data, bytes);
}

/* Many calls, several shapes (and entries): each constant packed once, and
 * every result as a runtime without packing gives it, in each dtype, eager
 * and fused; the packed eager and fused runs of a product agree bit for bit. */
static void test_fn(void **state) {
    for (int d = 0; d < 3; d++) {
        sj_dtype dt = tu_floats[d];
        weights ws = make_weights(dt, 45, 37);
        sj_runtime *rt = runtime(SJ_COMPILE_SYNC, UINT64_C(1) << 30), *eager = runtime(SJ_COMPILE_OFF, 1 << 30),
                   *plain = runtime(SJ_COMPILE_OFF, 0);
        sj_fn *fn = linear_fn(rt, &ws, SJ_DYNAMIC_STATIC), *fe = linear_fn(eager, &ws, SJ_DYNAMIC_STATIC),
              *fp = linear_fn(plain, &ws, SJ_DYNAMIC_STATIC);
        uint64_t packs = sj_cpu_pack_count();
        const int64_t rows[] = {1, 7, 13, 1, 7, 13, 30, 30, 30};
        for (int i = 0; i < NELEM(rows); i++)
            for (int rep = 0; rep < 3; rep++) {
                sj_tensor x = tu_random(dt, 2, S(rows[i], 45), TU_CONTIG), o[2], oe[2], op[2];
                uint64_t products = sj_cpu_packed_products();
                run_fn(fn, &x, o);
                assert_true(sj_cpu_packed_products() >= products + 2); /* both products, packed */
                run_fn(fe, &x, oe);
                products = sj_cpu_packed_products();
                run_fn(fp, &x, op);
                for (int k = 0; k < 2; k++) {
                    const char *what = tu_label("dtype %d rows %lld output %d", dt, (long long)rows[i], k);
                    same_within(&o[k], &op[k], tu_tol(dt), what);
                    same_within(&oe[k], &op[k], tu_tol(dt), what);
                    sj_tensor_free(plain, &op[k]);
                }
                /* the product with its bias is one kernel, eager or fused */
                assert_true(bits_equal(&o[0], &oe[0]));
                for (int k = 0; k < 2; k++) {
                    sj_tensor_free(rt, &o[k]);
                    sj_tensor_free(eager, &oe[k]);
                }
            }
        sj_stats s, se, sp;
        sj_fn_stats(fn, &s);
        sj_fn_stats(fe, &se);
        sj_fn_stats(fp, &sp);
        assert_true(s.entries >= 4 && s.fused_specialized_calls + s.fused_symbolic_calls > 0);
        /* w and wt once each, in each function that packs, however many entries */
        assert_true(s.packed_weights == 2 && se.packed_weights == 2 && sp.packed_weights == 0);
        assert_true(sj_cpu_pack_count() == packs + 4);
        assert_true(s.packed_bytes >= (45 * 48 + 37 * 48) * sizeof(float) && sp.packed_bytes == 0);
        sj_fn_destroy(fn);
        sj_fn_destroy(fe);
        sj_fn_destroy(fp);
        sj_runtime_destroy(rt);
        sj_runtime_destroy(eager);
        sj_runtime_destroy(plain);
        tu_free_all();
    }
}

/* A bound smaller than the weights: nothing packed, the results unchanged. */
static void test_fn_bound(void **state) {
    weights ws = make_weights(SJ_F32, 64, 64);
    sj_runtime *rt = runtime(SJ_COMPILE_OFF, 64 * 64 * 4 + 2000), *plain = runtime(SJ_COMPILE_OFF, 0);
    sj_fn *fn = linear_fn(rt, &ws, SJ_DYNAMIC_AUTO), *fp = linear_fn(plain, &ws, SJ_DYNAMIC_AUTO);
    sj_tensor x = tu_random(SJ_F32, 2, S(9, 64), TU_CONTIG), o[2], op[2];
    run_fn(fn, &x, o);
    run_fn(fp, &x, op);
    for (int k = 0; k < 2; k++) {
        same_within(&o[k], &op[k], tu_tol(SJ_F32), "bound");
        sj_tensor_free(rt, &o[k]);
        sj_tensor_free(plain, &op[k]);
    }
    sj_stats s;
    sj_fn_stats(fn, &s);
    assert_true(s.packed_weights == 1); /* one fits, the other does not */
    sj_fn_destroy(fn);
    sj_fn_destroy(fp);
    sj_runtime_destroy(rt);
    sj_runtime_destroy(plain);
}

/* A single sentence's products (M 25, K 384, N 384 / 1536, as
 * all-MiniLM-L6-v2 at batch 1) over two threads: shared out while each
 * thread gets the pool's minimum of multiply-adds, on the calling thread
 * alone (no hand-off) when the minimum is raised past half the product, and
 * bit for bit the same either way; a tiny product never leaves the caller. */
static void test_small_split(void **state) {
    const int64_t Ns[] = {384, 1536};
    for (int c = 0; c < NELEM(Ns); c++) {
        int64_t M = 25, K = 384, N = Ns[c];
        sj_tensor a = tu_random(SJ_F32, 2, S(M, K), TU_CONTIG), b = weight(SJ_F32, K, N, 0);
        sj_tensor bias = tu_random(SJ_F32, 1, S(N), TU_CONTIG);
        sj_tensor y1 = tu_tensor_layout(SJ_F32, 2, S(M, N), TU_CONTIG), y2 = tu_tensor_layout(SJ_F32, 2, S(M, N), TU_CONTIG);
        sj_cpu_packed *p = NULL;
        assert_int_equal(sj_cpu_pack(&b, &p), SJ_OK);
        sj_threads_set_min_work(pool2, SJ_THREADS_MIN_WORK);
        uint64_t h = sj_threads_handoffs(pool2);
        assert_int_equal(sj_cpu_packed_gemm(M, a.data, K, p, bias.data, y1.data, N, pool2), SJ_OK);
        assert_true(sj_threads_handoffs(pool2) == h + 1);
        sj_threads_set_min_work(pool2, M * K * N / 2 + 1);
        assert_int_equal(sj_cpu_packed_gemm(M, a.data, K, p, bias.data, y2.data, N, pool2), SJ_OK);
        assert_true(sj_threads_handoffs(pool2) == h + 1);
        assert_true(bits_equal(&y1, &y2));
        double *rf = tu_refbuf(0, M * N), *mg = tu_refbuf(1, M * N);
        tu_ref_matmul(&a, &b, rf, mg);
        for (int64_t i = 0; i < M * N; i++) rf[i] += tu_get(&bias, i % N), mg[i] += fabs(tu_get(&bias, i % N));
        assert_true(tu_check_mag(&y1, rf, mg, tu_tol(SJ_F32), tu_label("M %lld K %lld N %lld", (long long)M, (long long)K,
                                                                (long long)N)));
        sj_cpu_packed_free(p);
    }
    sj_threads_set_min_work(pool2, SJ_THREADS_MIN_WORK);
    /* tiny: 4 x 32 x 64, far below twice the minimum */
    sj_tensor a = tu_random(SJ_F32, 2, S(4, 32), TU_CONTIG), b = weight(SJ_F32, 32, 64, 0);
    sj_tensor y = tu_tensor_layout(SJ_F32, 2, S(4, 64), TU_CONTIG);
    sj_cpu_packed *p = NULL;
    assert_int_equal(sj_cpu_pack(&b, &p), SJ_OK);
    uint64_t h = sj_threads_handoffs(pool2);
    assert_int_equal(sj_cpu_packed_gemm(4, a.data, 32, p, NULL, y.data, 64, pool2), SJ_OK);
    assert_true(sj_threads_handoffs(pool2) == h);
    sj_cpu_packed_free(p);
}

/* Every test ends with the best kernel back in use (a failed one may leave
 * a cap) and its tensors freed. */
static int teardown_each(void **state) {
    sj_cpu_packed_isa_cap(-1);
    return tu_teardown(state);
}

/* f16/bf16 products over packed b: a converted row by row as it is packed
 * (F16C / AVX2 where the CPU has them, else cpu_load_f32), the result
 * stored tile by tile from an f32 block on the stack (sj_cpu_store_row's
 * conversions), for every kernel this CPU has, on one thread or two, into
 * a contiguous or a padded y (odd M, K, N: short tiles and panels). The
 * result must be bit for bit the f32 product of a's exact values over the
 * same packed b, rounded by sj_f32_to_f16 / sj_f32_to_bf16 (nearest even;
 * NaN stays NaN), and within the dtype's tolerance of float64; a holds
 * large (the f16 product overflows: inf) and tiny (subnormal results) rows
 * beside ordinary ones, and a row with a NaN. */
static void test_f16_rows(void **state) {
    static const int64_t Ms16[] = {1, 3, 9, 30}, Ks16[] = {1, 7, 8, 9, 37}, Ns16[] = {1, 5, 8, 15, 17, 33};
    static const sj_dtype dts[] = {SJ_F16, SJ_BF16};
    sj_cpu_isa best = sj_cpu_packed_isa_cap(-1);
    int c = 0;
    for (int isa = SJ_CPU_ISA_C; isa <= (int)best; isa++) {
        assert_int_equal(sj_cpu_packed_isa_cap(isa), isa);
        for (int mi = 0; mi < NELEM(Ms16); mi++)
            for (int ki = 0; ki < NELEM(Ks16); ki++)
                for (int ni = 0; ni < NELEM(Ns16); ni++, c++) {
                    int64_t M = Ms16[mi], K = Ks16[ki], N = Ns16[ni];
                    sj_dtype dt = dts[c % 2];
                    int th = 1 + (c / 2) % 2, ly = (c / 4) % 3 == 2; /* ly 1: rows padded by 3 */
                    const char *what = tu_label("%s %s M %lld K %lld N %lld threads %d ly %d", sj_dtype_name(dt),
                                                sj_cpu_isa_name((sj_cpu_isa)isa), (long long)M, (long long)K,
                                                (long long)N, th, ly);
                    sj_tensor a = tu_random(dt, 2, S(M, K), TU_CONTIG), b = weight(dt, K, N, ni & 1);
                    for (int64_t r = 0; r < M; r++) /* row 1: large; row 2: tiny */
                        for (int64_t k = 0; k < K; k++)
                            if (r % 4 == 1) tu_set(&a, r * K + k, tu_get(&a, r * K + k) * 30000.0);
                            else if (r % 4 == 2) tu_set(&a, r * K + k, tu_get(&a, r * K + k) * 1e-4);
                    double *rf = tu_refbuf(0, M * N), *mg = tu_refbuf(1, M * N);
                    tu_ref_matmul(&a, &b, rf, mg); /* before row 7 gets its NaN */
                    if (M > 7) tu_set(&a, 7 * K + K / 2, NAN);
                    sj_tensor a32 = tu_tensor(SJ_F32, 2, S(M, K));
                    sj_tensor b32 = tu_tensor(SJ_F32, 2, S(K, N)); /* b's values; its packed copy is p */
                    for (int64_t i = 0; i < M * K; i++) tu_set(&a32, i, tu_get(&a, i)); /* exact */
                    for (int64_t i = 0; i < K * N; i++) tu_set(&b32, i, tu_get(&b, i));
                    sj_tensor y = tu_tensor(dt, 2, S(M, N + 3 * ly)), y32 = tu_tensor(SJ_F32, 2, S(M, N));
                    memset(y.data, 0xA5, (size_t)(M * (N + 3 * ly)) * 2);
                    y.shape[1] = N; /* a view of the first N columns: row stride N + 3 */
                    sj_cpu_packed *p = NULL;
                    assert_int_equal(sj_cpu_pack(&b, &p), SJ_OK);
                    assert_int_equal(sj_cpu_matmul_packed(&a, &b, p, NULL, &y, th > 1 ? pool2 : NULL), SJ_OK);
                    assert_int_equal(sj_cpu_matmul_packed(&a32, &b32, p, NULL, &y32, NULL), SJ_OK);
                    const uint16_t *yh = y.data;
                    const float *yf = y32.data;
                    for (int64_t r = 0; r < M; r++)
                        for (int64_t q = 0; q < N; q++) {
                            uint16_t got = yh[r * y.stride[0] + q * y.stride[1]];
                            float f = yf[r * N + q];
                            uint16_t want = dt == SJ_F16 ? sj_f32_to_f16(f) : sj_f32_to_bf16(f);
                            if (f != f ? (got & 0x7fffu) <= (dt == SJ_F16 ? 0x7c00u : 0x7f80u) : got != want)
                                fail_msg("%s: [%lld, %lld] is 0x%04x, f32 %g rounds to 0x%04x", what, (long long)r,
                                         (long long)q, got, (double)f, want);
                        }
                    for (int64_t r = 0; ly && r < M; r++)
                        for (int64_t q = N; q < N + 3; q++)
                            if (yh[r * (N + 3) + q] != 0xA5A5) fail_msg("%s: padding written at [%lld, %lld]", what, (long long)r, (long long)q);
                    /* against float64, the rows whose results stay finite in f16 */
                    for (int64_t r = 0; r < M; r++)
                        for (int64_t q = 0; q < N && r != 7; q++) {
                            double v = tu_get(&y, r * N + q), ref = rf[r * N + q];
                            if (fabs(ref) > 65000) continue; /* near or past f16's largest */
                            if (fabs(v - ref) > tu_tol(dt) * (mg[r * N + q] + 1e-6) + 1e-7)
                                fail_msg("%s: [%lld, %lld] is %g, float64 %g", what, (long long)r, (long long)q, v,
                                         ref);
                        }
                    sj_cpu_packed_free(p);
                    tu_free_all();
                }
    }
    sj_cpu_packed_isa_cap(-1);
}

/* The row conversions the products and attention use (sj_cpu_load_row /
 * sj_cpu_store_row; F16C for f16 and AVX2 for bf16 where the CPU has
 * them) against the scalar ones, bit for bit, over an odd length from an
 * odd offset: every f16 and bf16 pattern widened (a signalling f16 NaN
 * comes back a NaN, made quiet by the hardware), and f32 values narrowed:
 * halfway cases, the largest finite and overflow edges, subnormal
 * results, NaNs of both kinds and signs, random bits. */
static void test_row_conversions(void **state) {
    enum { N = 65536 + 13 };
    uint16_t *h = malloc((N + 1) * sizeof *h), *h2 = malloc((N + 1) * sizeof *h2);
    float *f = malloc((N + 1) * sizeof *f);
    assert_true(h && h2 && f);
    uint64_t rng = 0x243F6A8885A308D3ull;
    for (int di = 0; di < 2; di++) {
        sj_dtype dt = di ? SJ_BF16 : SJ_F16;
        for (int i = 0; i <= N; i++) h[i] = (uint16_t)(i * 40503u + 7u); /* every pattern, scrambled */
        sj_cpu_load_row(f + 1, h + 1, dt, N);
        for (int i = 1; i <= N; i++) {
            float want = dt == SJ_F16 ? sj_f16_to_f32(h[i]) : sj_bf16_to_f32(h[i]);
            uint32_t wb, gb;
            memcpy(&wb, &want, 4), memcpy(&gb, &f[i], 4);
            bool snan16 = dt == SJ_F16 && (h[i] & 0x7e00u) == 0x7c00u && (h[i] & 0x3ffu);
            if (snan16 ? (gb & 0x7fffffffu) <= 0x7f800000u : gb != wb)
                fail_msg("%s load 0x%04x: 0x%08x, not 0x%08x", sj_dtype_name(dt), h[i], gb, wb);
        }
        for (int i = 0; i <= N; i++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            uint32_t r = (uint32_t)(rng >> 32), b, lo = dt == SJ_F16 ? 0x00001000u : 0x00008000u;
            switch (i % 7) {
            case 0: b = (r & (dt == SJ_F16 ? 0x8fffe000u : 0xffff0000u)) | lo; break; /* halfway */
            case 1: b = (r & 0x80000000u) | (0x477fe000u + (r >> 19)); break;     /* f16's largest, overflow */
            case 2: b = (r & 0x80000000u) | (0x7f7f0000u + (r >> 16)); break;     /* f32's largest */
            case 3: b = (r & 0x80000000u) | (0x33000000u + (r >> 8)); break;      /* f16 subnormal results */
            case 4: b = (r & 0x80000000u) | (0x7f800000u + (r >> 9)); break;      /* inf and NaNs */
            default: b = r; break;
            }
            memcpy(&f[i], &b, 4);
        }
        memset(h2, 0, (N + 1) * sizeof *h2);
        sj_cpu_store_row(h2 + 1, dt, f + 1, N);
        for (int i = 1; i <= N; i++) {
            uint16_t want = dt == SJ_F16 ? sj_f32_to_f16(f[i]) : sj_f32_to_bf16(f[i]);
            uint32_t fb;
            memcpy(&fb, &f[i], 4);
            if (h2[i] != want) fail_msg("%s store 0x%08x: 0x%04x, not 0x%04x", sj_dtype_name(dt), fb, h2[i], want);
        }
        assert_int_equal(h2[0], 0); /* nothing before the row */
    }
    free(h), free(h2), free(f);
}

/* f16/bf16 attention converts each head's q, k, v into f32 a block of
 * rows at a time and stores its output rows the same way (F16C / AVX2
 * where the CPU has them): the result must be bit for bit the f32
 * attention over q, k, v's exact values, rounded by sj_f32_to_f16 /
 * sj_f32_to_bf16, and within the dtype's tolerance of float64. Odd head
 * sizes (tails past the 8-lane conversions), more queries than a block of
 * 64, lengths and causal masks, one thread and two. */
static void test_attention_16(void **state) {
    static const int64_t Ds[][2] = {{13, 11}, {64, 64}, {9, 67}};
    static const sj_dtype dts[] = {SJ_F16, SJ_BF16};
    for (int c = 0; c < 12; c++) {
        sj_dtype dt = dts[c % 2];
        int64_t D = Ds[c / 2 % 3][0], Dv = Ds[c / 2 % 3][1], B = 2, H = 3, Sq = 70, Sk = 45 + c;
        int causal = c / 6, th = 1 + c % 2;
        const char *what = tu_label("%s D %lld Dv %lld Sk %lld causal %d threads %d", sj_dtype_name(dt),
                                    (long long)D, (long long)Dv, (long long)Sk, causal, th);
        sj_tensor q = tu_random(dt, 4, S(B, H, Sq, D), TU_CONTIG), k = tu_random(dt, 4, S(B, H, Sk, D), TU_CONTIG);
        sj_tensor v = tu_random(dt, 4, S(B, H, Sk, Dv), TU_CONTIG), l = tu_tensor(SJ_I32, 1, S(B));
        ((int32_t *)l.data)[0] = (int32_t)Sk, ((int32_t *)l.data)[1] = (int32_t)(Sk - 7);
        sj_tensor q32 = tu_tensor(SJ_F32, 4, S(B, H, Sq, D)), k32 = tu_tensor(SJ_F32, 4, S(B, H, Sk, D));
        sj_tensor v32 = tu_tensor(SJ_F32, 4, S(B, H, Sk, Dv));
        for (int64_t i = 0; i < B * H * Sq * D; i++) tu_set(&q32, i, tu_get(&q, i)); /* exact */
        for (int64_t i = 0; i < B * H * Sk * D; i++) tu_set(&k32, i, tu_get(&k, i));
        for (int64_t i = 0; i < B * H * Sk * Dv; i++) tu_set(&v32, i, tu_get(&v, i));
        sj_tensor y = tu_tensor(dt, 4, S(B, H, Sq, Dv)), y32 = tu_tensor(SJ_F32, 4, S(B, H, Sq, Dv));
        double scale = 1.0 / sqrt((double)D), *rf = tu_refbuf(0, B * H * Sq * Dv), *mg = tu_refbuf(1, B * H * Sq * Dv);
        tu_ref_attention(&q, &k, &v, &l, scale, causal, rf, mg);
        sj_threads *pool = th > 1 ? pool2 : NULL;
        assert_int_equal(sj_cpu_attention(&q, &k, &v, &l, scale, causal, &y, pool), SJ_OK);
        assert_int_equal(sj_cpu_attention(&q32, &k32, &v32, &l, scale, causal, &y32, NULL), SJ_OK);
        const uint16_t *yh = y.data;
        const float *yf = y32.data;
        for (int64_t i = 0; i < B * H * Sq * Dv; i++) {
            uint16_t want = dt == SJ_F16 ? sj_f32_to_f16(yf[i]) : sj_f32_to_bf16(yf[i]);
            if (yh[i] != want)
                fail_msg("%s: y[%lld] is 0x%04x, f32 %g rounds to 0x%04x", what, (long long)i, yh[i], (double)yf[i],
                         want);
            double got = tu_get(&y, i);
            if (fabs(got - rf[i]) > tu_tol(dt) * (mg[i] + 1e-6) + 1e-7)
                fail_msg("%s: y[%lld] is %g, float64 %g", what, (long long)i, got, rf[i]);
        }
        tu_free_all();
    }
}

/* An f16/bf16 product over packed b with an epilogue (sj_cpu_matmul_epi):
 * the product stores its f32 result into the 16-bit y block by block and
 * runs the epilogue (here y = 2 y + 1 in y's dtype, every item counted)
 * over each block right after, when y is one contiguous matrix; against
 * float64 with odd M, K, N (K past the 256-element chunk a row is
 * converted in as it is packed), a bias, one thread or two; a column-major y
 * (column-major, padded) is stored the same way without the epilogue (not fused). */
static _Atomic int64_t epi_items;

static void epi_affine(void *const *p, const int64_t *s, int64_t begin, int64_t end) {
    uint16_t *y = p[0];
    for (int64_t i = begin; i < end; i++) {
        float v = s[0] == SJ_F16 ? sj_f16_to_f32(y[i]) : sj_bf16_to_f32(y[i]);
        y[i] = s[0] == SJ_F16 ? sj_f32_to_f16(2 * v + 1) : sj_f32_to_bf16(2 * v + 1);
    }
    atomic_fetch_add(&epi_items, end - begin);
}

static void test_epi_16(void **state) {
    static const int64_t Me[] = {1, 7, 13, 173}, Ke[] = {17, 129, 300}, Ne[] = {5, 33, 100};
    static const sj_dtype dts[] = {SJ_F16, SJ_BF16};
    for (int di = 0; di < 2; di++)
        for (int mi = 0; mi < NELEM(Me); mi++)
            for (int ki = 0; ki < NELEM(Ke); ki++)
                for (int ni = 0; ni < NELEM(Ne); ni++)
                    for (int th = 1; th <= 2; th++)
                        for (int ly = 0; ly < 2; ly++) {
                            sj_dtype dt = dts[di];
                            int64_t M = Me[mi], K = Ke[ki], N = Ne[ni];
                            sj_tensor a = tu_random(dt, 2, S(M, K), TU_CONTIG), b = weight(dt, K, N, ni & 1);
                            sj_tensor bias = tu_random(dt, 1, S(N), TU_CONTIG);
                            sj_tensor y = tu_tensor_layout(dt, 2, S(M, N), ly ? TU_REVGAP : TU_CONTIG);
                            double *rf = tu_refbuf(0, M * N), *mg = tu_refbuf(1, M * N);
                            tu_ref_matmul(&a, &b, rf, mg);
                            for (int64_t i = 0; i < M * N; i++) {
                                rf[i] += tu_get(&bias, i % N), mg[i] += fabs(tu_get(&bias, i % N));
                                if (!ly) rf[i] = 2 * rf[i] + 1, mg[i] = 2 * mg[i] + 1;
                            }
                            sj_cpu_packed *p = NULL;
                            assert_int_equal(sj_cpu_pack(&b, &p), SJ_OK);
                            void *ps[1] = {y.data};
                            int64_t ss[1] = {dt};
                            sj_cpu_epilogue e = {epi_affine, ps, ss};
                            int fused = -1;
                            atomic_store(&epi_items, 0);
                            uint64_t before = sj_cpu_fused_epilogues();
                            assert_int_equal(sj_cpu_matmul_epi(&a, &b, p, &bias, &y, th > 1 ? pool2 : NULL, &e, &fused),
                                             SJ_OK);
                            const char *what = tu_label("epi dtype %d M %lld K %lld N %lld threads %d ly %d", dt,
                                                        (long long)M, (long long)K, (long long)N, th, ly);
                            assert_int_equal(fused, !ly);
                            assert_int_equal(atomic_load(&epi_items), ly ? 0 : M * N);
                            assert_true(sj_cpu_fused_epilogues() == before + (uint64_t)!ly);
                            assert_true(tu_check_mag(&y, rf, mg, tu_tol(dt), what));
                            assert_true(tu_check_gaps(&y, what));
                            sj_cpu_packed_free(p);
                            tu_free_all();
                        }
}

static int setup(void **state) {
    tu_seed(26);
    pool2 = sj_threads_create(2);
    return pool2 ? 0 : -1;
}

static int teardown(void **state) {
    sj_threads_destroy(pool2);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_products, teardown_each), cmocka_unit_test_teardown(test_edges, teardown_each),
        cmocka_unit_test_teardown(test_batches, teardown_each),  cmocka_unit_test_teardown(test_cache, teardown_each),
        cmocka_unit_test_teardown(test_fn, teardown_each),       cmocka_unit_test_teardown(test_fn_bound, teardown_each),
        cmocka_unit_test_teardown(test_small_split, teardown_each), cmocka_unit_test_teardown(test_f16_rows, teardown_each),
        cmocka_unit_test_teardown(test_row_conversions, teardown_each),
        cmocka_unit_test_teardown(test_epi_16, teardown_each),
        cmocka_unit_test_teardown(test_attention_16, teardown_each),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
