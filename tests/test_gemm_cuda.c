/* Generated tensor-core matrix products (specialize/codegen_gemm_cuda.h).
 *
 * Everywhere (no GPU needed): every candidate tile configuration (split-K
 * clusters included: their PTX has the cluster's barrier and distributed
 * shared-memory loads), with the
 * fullest epilogue (bias, GELU, residual, f16 out) and with none (f32
 * out), symbolic and specialized M, compiles with NVRTC for sm_90 without
 * errors or warnings, and its PTX holds the tensor-core, ldmatrix and
 * cp.async instructions; the checks refuse what the kernels cannot take.
 *
 * With a CUDA device: C = epilogue(A @ B) on random f16 inputs for M in
 * 1, 7, 64, 333, 512, (N, K) in {384, 1536}^2, every tile configuration,
 * epilogues none / bias / bias+GELU / bias+GELU+residual / bias+residual /
 * GELU, outputs f16 and f32, against a float64 reference of the same f16
 * inputs (each element within tol x (sum |a||b| + |bias| + |r|)); C is
 * poisoned first and a guard row past M must stay untouched. Each tile
 * also with a LayerNorm inside (bias + residual + LayerNorm with gamma and
 * beta into f16, or bias + LayerNorm without beta into f32), launched
 * twice on one set of counters: Y against the float64 LayerNorm of the
 * kernel's own C and of the float64 reference, no write past row M, the
 * counters left zero. Symbolic
 * units serve every M; one specialized unit per shape runs at its own M.
 * Without one it prints "skipped: no CUDA device" after the compile
 * checks and passes. The checks refuse a LayerNorm over N not a multiple
 * of 64 or past 4096, bad dtypes and eps; its PTX has the counter's
 * atomic, the reads past L1 and the warp's shuffles.
 *
 * NVRTC is loaded with dlopen (tests/util_nvrtc.h: libnvrtc.so.13 from
 * $SHAPEJIT_CUDA_LIBS, $CUDA_HOME/lib64, /usr/local/cuda/lib64, then the
 * loader's path); the device runs use the runtime's device services
 * (kernels/cuda/cuda_dev.h) and need a build with SJ_WITH_CUDA.
 * SJ_SHOW_CODE=1 prints one unit.
 */
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

#include "base/half.h"
#include "specialize/codegen_gemm_cuda.h"
#include "tests/util.h"
#include "tests/util_cuda.h"
#ifdef SJ_WITH_CUDA
#include "kernels/cuda/cuda_dev.h"
#include "kernels/cuda/exec_cuda.h"
#endif

/* -- NVRTC and the device (tests/util_cuda.h) -------------------------------- */

/* NVRTC, and device 0 when there is one (arch is then its own) */
static tu_cuda cu;

/* Compile src for arch (or PTX for a virtual "compute_90"); no errors, no
 * warnings. The CUBIN or PTX in *out (malloc'd) when out is not NULL. */
static void compile(const char *src, const char *a, const char *what, char **out, size_t *out_len) {
    char archopt[48];
    snprintf(archopt, sizeof archopt, "--gpu-architecture=%s", a);
    const char *opts[] = {archopt, "--std=c++17", "-default-device", "-lineinfo"};
    nvrtc_prog prog;
    assert_int_equal(cu.nv.CreateProgram(&prog, src, "gemm.cu", 0, NULL, NULL), 0);
    int r = cu.nv.CompileProgram(prog, 4, opts);
    tu_nvrtc_check(&cu.nv, prog, r, what, src);
    if (out) tu_nvrtc_output(&cu.nv, prog, !strstr(a, "sm_"), out, out_len);
    cu.nv.DestroyProgram(&prog);
}

/* -- Specs ------------------------------------------------------------------------------ */

typedef struct epi {
    const char *name;
    bool bias, gelu, residual;
    sj_dtype bias_dt, res_dt, out_dt;
    /* a LayerNorm inside: gamma (f32), beta (f16) present, Y's dtype */
    bool ln, ln_gamma, ln_beta;
    sj_dtype ln_out_dt;
} epi;

static const epi epis[] = {
    {"none f32", false, false, false, SJ_F16, SJ_F16, SJ_F32, false, false, false, SJ_F16},
    {"bias f16", true, false, false, SJ_F16, SJ_F16, SJ_F16, false, false, false, SJ_F16},
    {"bias+gelu f32", true, true, false, SJ_F32, SJ_F16, SJ_F32, false, false, false, SJ_F16},
    {"bias+gelu+residual f16", true, true, true, SJ_F16, SJ_F16, SJ_F16, false, false, false, SJ_F16},
    {"bias+residual f32", true, false, true, SJ_F32, SJ_F32, SJ_F32, false, false, false, SJ_F16},
    {"gelu f16", false, true, false, SJ_F16, SJ_F16, SJ_F16, false, false, false, SJ_F16},
};
enum { N_EPI = sizeof epis / sizeof epis[0], FULL = 3 };

/* LayerNorms inside: the transformer layer's (bias, residual, f16, gamma
 * and beta, f16 out), and one without beta into f32 from f32 sums */
static const epi ln_epis[] = {
    {"bias+residual+layer_norm f16", true, false, true, SJ_F16, SJ_F16, SJ_F16, true, true, true, SJ_F16},
    {"bias+layer_norm(no beta) f32", true, false, false, SJ_F32, SJ_F16, SJ_F32, true, true, false, SJ_F32},
};
enum { N_LN = sizeof ln_epis / sizeof ln_epis[0] };
#define LN_EPS 1e-5

static sj_gemm_spec spec_of(const sj_gemm_tile *t, int64_t M, int64_t N, int64_t K, const epi *e) {
    return (sj_gemm_spec){.M = M, .N = N, .K = K, .bias = e->bias, .gelu = e->gelu, .residual = e->residual,
                          .bias_dtype = e->bias_dt, .res_dtype = e->res_dt, .out_dtype = e->out_dt,
                          .ln = e->ln, .ln_gamma = e->ln_gamma, .ln_beta = e->ln_beta, .ln_g_dtype = SJ_F32,
                          .ln_b_dtype = SJ_F16, .ln_out_dtype = e->ln_out_dt, .ln_eps = LN_EPS, .tile = *t};
}

static char *gen(const sj_gemm_spec *s) {
    size_t len = 0;
    char *src = sj_codegen_gemm_cuda(s, "sj_gemm", &len);
    if (!src) fprintf(stderr, "gemm: %s\n", sj_last_error());
    assert_non_null(src);
    assert_int_equal(strlen(src), len);
    return src;
}

/* -- Environment ------------------------------------------------------------------------ */

static int setup_all(void **state) {
    (void)state;
    const char *seed = getenv("SJ_TEST_SEED");
    tu_seed(seed ? strtoull(seed, NULL, 0) : 0x9e11);
    tu_cuda_open(&cu);
    return 0;
}

static int teardown_all(void **state) {
    (void)state;
    tu_cuda_close(&cu);
    return 0;
}

/* -- Checks that need no device ----------------------------------------------------------- */

static void test_check(void **state) {
    (void)state;
    const sj_gemm_tile ok = {64, 64, 32, 2, 2, 3, 1, 0};
    sj_gemm_spec s = spec_of(&ok, 0, 384, 384, &epis[FULL]);
    assert_int_equal(sj_gemm_cuda_check(&s), SJ_OK);
    s.N = 400; /* not a multiple of BN */
    assert_int_equal(sj_gemm_cuda_check(&s), SJ_EINVAL);
    assert_null(sj_codegen_gemm_cuda(&s, "x", NULL));
    s = spec_of(&ok, 0, 384, 392, &epis[FULL]); /* K not a multiple of BK */
    assert_int_equal(sj_gemm_cuda_check(&s), SJ_EINVAL);
    sj_gemm_tile bad = {64, 64, 32, 8, 2, 3, 1, 0}; /* BM 64 < 16 x 8 warps */
    s = spec_of(&bad, 0, 384, 384, &epis[0]);
    assert_int_equal(sj_gemm_cuda_check(&s), SJ_EINVAL);
    bad = (sj_gemm_tile){64, 64, 24, 2, 2, 3, 1, 0}; /* BK not a multiple of 16 */
    s = spec_of(&bad, 0, 384, 384, &epis[0]);
    assert_int_equal(sj_gemm_cuda_check(&s), SJ_EINVAL);
    bad = (sj_gemm_tile){256, 256, 128, 4, 4, 4, 1, 0}; /* shared memory */
    s = spec_of(&bad, 0, 1024, 1024, &epis[0]);
    assert_int_equal(sj_gemm_cuda_check(&s), SJ_EINVAL);
    s = spec_of(&ok, 0, 384, 384, &epis[0]);
    s.out_dtype = SJ_BF16;
    assert_int_equal(sj_gemm_cuda_check(&s), SJ_EINVAL);
    /* a LayerNorm inside: N a multiple of 64 up to 4096, its dtypes, eps */
    s = spec_of(&ok, 0, 384, 384, &ln_epis[0]);
    assert_int_equal(sj_gemm_cuda_check(&s), SJ_OK);
    s.ln_out_dtype = SJ_BF16;
    assert_int_equal(sj_gemm_cuda_check(&s), SJ_EINVAL);
    s = spec_of(&ok, 0, 384, 384, &ln_epis[0]);
    s.ln_eps = -1;
    assert_int_equal(sj_gemm_cuda_check(&s), SJ_EINVAL);
    s = spec_of(&(sj_gemm_tile){32, 32, 32, 2, 2, 3, 1, 0}, 0, 416, 384, &ln_epis[0]); /* 416 = 13 x 32 */
    assert_int_equal(sj_gemm_cuda_check(&s), SJ_EINVAL);
    s.ln = false;
    assert_int_equal(sj_gemm_cuda_check(&s), SJ_OK);
    s = spec_of(&ok, 0, 8192, 384, &ln_epis[0]);
    assert_int_equal(sj_gemm_cuda_check(&s), SJ_EINVAL);
    assert_int_equal(sj_gemm_ln_counters(1), 1);
    assert_int_equal(sj_gemm_ln_counters(16), 1);
    assert_int_equal(sj_gemm_ln_counters(17), 2);
    /* launch dimensions */
    sj_gemm_dims d;
    s = spec_of(&ok, 0, 1536, 384, &epis[0]);
    sj_gemm_cuda_dims(&s, 333, &d);
    assert_int_equal(d.grid[0], 1536 / 64);
    assert_int_equal(d.grid[1], (333 + 63) / 64);
    assert_int_equal(d.block[0], 128);
    assert_int_equal(d.smem, (size_t)3 * (64 * 40 + 32 * 72) * 2);
    assert_int_equal(d.grid[2], 1);
    sj_gemm_cuda_dims(&s, 0, &d);
    assert_int_equal(d.grid[1], 0);
    /* split-K: K a multiple of BK x SK; SK 1, 2, 4 or 8; a cluster's
     * blocks along z */
    const sj_gemm_tile sk4 = {16, 64, 32, 1, 4, 4, 4, 0};
    s = spec_of(&sk4, 0, 768, 3072, &epis[FULL]);
    assert_int_equal(sj_gemm_cuda_check(&s), SJ_OK);
    sj_gemm_cuda_dims(&s, 16, &d);
    assert_int_equal(d.grid[0], 768 / 64);
    assert_int_equal(d.grid[1], 1);
    assert_int_equal(d.grid[2], 4);
    assert_int_equal(d.block[0], 128);
    s = spec_of(&sk4, 0, 768, 32 * 6, &epis[FULL]); /* 6 K tiles do not split 4 ways */
    assert_int_equal(sj_gemm_cuda_check(&s), SJ_EINVAL);
    bad = (sj_gemm_tile){16, 64, 32, 1, 4, 4, 3, 0};
    s = spec_of(&bad, 0, 768, 3072, &epis[0]);
    assert_int_equal(sj_gemm_cuda_check(&s), SJ_EINVAL);
    /* warpgroup tiles: 64 rows a warpgroup, BK 64, BN a multiple of 64 */
    const sj_gemm_tile wg = {128, 128, 64, 2, 1, 3, 1, 1};
    s = spec_of(&wg, 0, 768, 3072, &epis[FULL]);
    assert_int_equal(sj_gemm_cuda_check(&s), SJ_OK);
    sj_gemm_cuda_dims(&s, 300, &d);
    assert_int_equal(d.block[0], 256 + 32); /* two warpgroups and the producer warp */
    assert_int_equal(d.grid[0], 768 / 128);
    assert_int_equal(d.grid[1], 3);
    assert_int_equal(d.smem, (size_t)3 * (128 + 128) * 128 + 1024 + 3 * 16); /* stages, alignment, mbarriers */
    bad = (sj_gemm_tile){128, 128, 64, 2, 1, 2, 1, 1}; /* 2 stages: one copy ahead needs 3 */
    s = spec_of(&bad, 0, 768, 3072, &epis[0]);
    assert_int_equal(sj_gemm_cuda_check(&s), SJ_EINVAL);
    bad = (sj_gemm_tile){128, 128, 32, 2, 1, 3, 1, 1}; /* BK 32 */
    s = spec_of(&bad, 0, 768, 3072, &epis[0]);
    assert_int_equal(sj_gemm_cuda_check(&s), SJ_EINVAL);
    bad = (sj_gemm_tile){64, 96, 64, 1, 1, 3, 1, 1}; /* BN 96 */
    s = spec_of(&bad, 0, 768, 3072, &epis[0]);
    assert_int_equal(sj_gemm_cuda_check(&s), SJ_EINVAL);
    /* the candidates: on sm_90 a split-K tile, two warpgroup tiles, one of
     * one block; on later devices two split-K tiles, two of one block; none
     * of either before; every one fits */
    int8_t c[4];
    int nt, n90 = sj_gemm_cuda_candidates(16, 768, 3072, 90, 132, c, 4);
    const sj_gemm_tile *tiles = sj_gemm_cuda_tiles(&nt);
    assert_int_equal(n90, 4);
    assert_true(tiles[c[0]].splitk > 1 && !tiles[c[0]].wg);
    assert_true(tiles[c[1]].wg && tiles[c[2]].wg && c[1] != c[2]);
    assert_true(tiles[c[3]].splitk <= 1 && !tiles[c[3]].wg);
    for (int i = 0; i < n90; i++) {
        s = spec_of(&tiles[c[i]], 0, 768, 3072, &epis[0]);
        assert_int_equal(sj_gemm_cuda_check(&s), SJ_OK);
    }
    int n100 = sj_gemm_cuda_candidates(16, 768, 3072, 100, 148, c, 4);
    assert_int_equal(n100, 4);
    assert_true(tiles[c[0]].splitk > 1 && tiles[c[1]].splitk > 1 && !tiles[c[0]].wg && !tiles[c[1]].wg);
    assert_true(tiles[c[2]].splitk <= 1 && tiles[c[3]].splitk <= 1 && !tiles[c[2]].wg && !tiles[c[3]].wg);
    n90 = sj_gemm_cuda_candidates(16, 768, 3072, 90, 132, c, 4);
    /* at M 16 the best split fills the device: 12 column tiles x 8 */
    sj_gemm_cuda_dims(&(sj_gemm_spec){.N = 768, .K = 3072, .tile = tiles[c[0]]}, 16, &d);
    assert_true(d.grid[0] * d.grid[1] * d.grid[2] >= 96);
    int n80 = sj_gemm_cuda_candidates(16, 768, 3072, 80, 108, c, 4);
    assert_int_equal(n80, 4);
    for (int i = 0; i < n80; i++) assert_true(tiles[c[i]].splitk <= 1);
    assert_int_equal(sj_gemm_cuda_candidates(16, 100, 3072, 90, 132, c, 4), 0); /* N fits no tile */
}

/* Every candidate tile compiles for sm_90 (and the device's), fullest
 * epilogue and none, symbolic and specialized M; the PTX has the
 * tensor-core instructions. */
static void test_compile(void **state) {
    (void)state;
    if (!cu.have_nvrtc) {
        print_message("skipped: no NVRTC\n");
        return;
    }
    int n;
    const sj_gemm_tile *tiles = sj_gemm_cuda_tiles(&n);
    assert_true(n >= 3);
    for (int i = 0; i < n; i++)
        for (int e = 0; e < 3; e++) {
            const epi *ep = e == 2 ? &ln_epis[i % N_LN] : e ? &epis[FULL] : &epis[0];
            /* split-K tiles need K a multiple of BK x SK */
            sj_gemm_spec s = spec_of(&tiles[i], i == 1 ? 333 : 0, 1536, tiles[i].splitk > 1 ? 1536 : 384, ep);
            assert_int_equal(sj_gemm_cuda_check(&s), SJ_OK);
            char *src = gen(&s), what[96];
            if (getenv("SJ_SHOW_CODE") && i == 0 && e) printf("%s\n", src);
            snprintf(what, sizeof what, "tile %d %s", i, ep->name);
            /* warpgroup tiles: Hopper's own architecture (sm_90a) */
            compile(src, tiles[i].wg ? "sm_90a" : "sm_90", what, NULL, NULL);
            bool first_of_kind = i == 0 || (tiles[i].splitk > 1) != (tiles[i - 1].splitk > 1) ||
                                 tiles[i].wg != tiles[i - 1].wg || (e == 2 && i < N_LN);
            if (first_of_kind) {
                char *ptx;
                size_t len;
                compile(src, tiles[i].wg ? "compute_90a" : "compute_90", what, &ptx, &len);
                if (tiles[i].wg) {
                    assert_non_null(strstr(ptx, "wgmma.mma_async.sync.aligned.m64n"));
                    assert_non_null(strstr(ptx, "wgmma.wait_group.sync.aligned"));
                    assert_non_null(strstr(ptx, "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier"));
                    assert_non_null(strstr(ptx, "mbarrier.try_wait.parity"));
                } else {
                    assert_non_null(strstr(ptx, "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"));
                    assert_non_null(strstr(ptx, "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16"));
                    assert_non_null(strstr(ptx, "cp.async.cg.shared.global"));
                }
                if (ep->ln) { /* the row block's counter and the reads past L1 */
                    assert_non_null(strstr(ptx, "atom.acq_rel.gpu.global.inc.u32"));
                    assert_non_null(strstr(ptx, "ld.global.cg"));
                    assert_non_null(strstr(ptx, "shfl.sync.bfly"));
                }
                if (tiles[i].splitk > 1) { /* the cluster's reduction */
                    assert_non_null(strstr(ptx, "barrier.cluster.arrive"));
                    assert_non_null(strstr(ptx, "mapa.shared::cluster"));
                    assert_non_null(strstr(ptx, "ld.shared::cluster.v2.f32"));
                    assert_non_null(strstr(ptx, ".reqnctapercluster 1, 1, "));
                }
                free(ptx);
            }
            if (strcmp(cu.arch, "sm_90") != 0 && !tiles[i].wg) compile(src, cu.arch, what, NULL, NULL);
            free(src);
        }
}

/* -- On the device -------------------------------------------------------------------------- */

#ifdef SJ_WITH_CUDA
static void cu_ok(CUresult r, const char *what) {
    if (r != CUDA_SUCCESS) {
        const char *s = "?";
        cu.dev->api.GetErrorString(r, &s);
        fail_msg("%s: %s", what, s);
    }
}

typedef struct dbuf {
    CUdeviceptr p;
    size_t bytes;
} dbuf;

static dbuf dput(const void *host, size_t bytes) {
    dbuf b = {sj_cuda_alloc(cu.dev, bytes ? bytes : 16, cu.dev->stream), bytes};
    assert_true(b.p != 0);
    if (host && bytes) assert_int_equal(sj_cuda_to_device(cu.dev, b.p, host, bytes), SJ_OK);
    return b;
}
static void dfree(dbuf *b) {
    sj_cuda_free(cu.dev, b->p, cu.dev->stream);
    b->p = 0;
}

/* One problem: inputs on host and device, the float64 product and its
 * magnitude. */
typedef struct prob {
    int64_t M, N, K;
    uint16_t *a, *b, *bh, *rh; /* f16: A [M, K], B [K, N], bias [N], R [M, N] */
    float *bf, *rf;            /* f32: bias, R */
    float *lg;                 /* a LayerNorm's gamma [N] (f32) */
    uint16_t *lb;              /* and beta [N] (f16) */
    double *p, *mag;           /* A @ B and sum |a||b| (M x N) */
    dbuf da, db, dbh, dbf, drh, drf, dlg, dlb;
} prob;

static uint16_t rnd_h(double lo, double hi) { return sj_f32_to_f16((float)tu_uniform(lo, hi)); }

static void prob_make(prob *q, int64_t M, int64_t N, int64_t K) {
    memset(q, 0, sizeof *q);
    q->M = M, q->N = N, q->K = K;
    q->a = malloc((size_t)(M * K + 1) * 2);
    q->b = malloc((size_t)(K * N) * 2);
    q->bh = malloc((size_t)N * 2);
    q->rh = malloc((size_t)(M * N + 1) * 2);
    q->bf = malloc((size_t)N * 4);
    q->lg = malloc((size_t)N * 4);
    q->lb = malloc((size_t)N * 2);
    q->rf = malloc((size_t)(M * N + 1) * 4);
    q->p = calloc((size_t)(M * N + 1), sizeof(double));
    q->mag = calloc((size_t)(M * N + 1), sizeof(double));
    assert_true(q->a && q->b && q->bh && q->rh && q->bf && q->rf && q->lg && q->lb && q->p && q->mag);
    for (int64_t i = 0; i < M * K; i++) q->a[i] = rnd_h(-1, 1);
    double sb = 1.0 / sqrt((double)K);
    for (int64_t i = 0; i < K * N; i++) q->b[i] = rnd_h(-2 * sb, 2 * sb);
    for (int64_t i = 0; i < N; i++) {
        q->bh[i] = rnd_h(-1, 1);
        q->bf[i] = (float)tu_uniform(-1, 1);
        q->lg[i] = (float)tu_uniform(0.5, 1.5);
        q->lb[i] = rnd_h(-0.5, 0.5);
    }
    for (int64_t i = 0; i < M * N; i++) {
        q->rh[i] = rnd_h(-1, 1);
        q->rf[i] = (float)tu_uniform(-1, 1);
    }
    /* the float64 product, a row of A at a time over rows of B */
    double *bd = malloc((size_t)(K * N) * sizeof(double)), *ad = malloc((size_t)K * sizeof(double));
    assert_true(bd && ad);
    for (int64_t i = 0; i < K * N; i++) bd[i] = sj_f16_to_f32(q->b[i]);
    for (int64_t m = 0; m < M; m++) {
        for (int64_t k = 0; k < K; k++) ad[k] = sj_f16_to_f32(q->a[m * K + k]);
        double *pr = q->p + m * N, *mr = q->mag + m * N;
        for (int64_t k = 0; k < K; k++) {
            const double av = ad[k], aa = fabs(av), *br = bd + k * N;
            for (int64_t n = 0; n < N; n++) {
                pr[n] += av * br[n];
                mr[n] += aa * fabs(br[n]);
            }
        }
    }
    free(bd);
    free(ad);
    q->da = dput(q->a, (size_t)(M * K) * 2);
    q->db = dput(q->b, (size_t)(K * N) * 2);
    q->dbh = dput(q->bh, (size_t)N * 2);
    q->dbf = dput(q->bf, (size_t)N * 4);
    q->drh = dput(q->rh, (size_t)(M * N) * 2);
    q->drf = dput(q->rf, (size_t)(M * N) * 4);
    q->dlg = dput(q->lg, (size_t)N * 4);
    q->dlb = dput(q->lb, (size_t)N * 2);
}

static void prob_free(prob *q) {
    free(q->a), free(q->b), free(q->bh), free(q->rh), free(q->bf), free(q->rf), free(q->p), free(q->mag);
    free(q->lg), free(q->lb);
    dfree(&q->da), dfree(&q->db), dfree(&q->dbh), dfree(&q->dbf), dfree(&q->drh), dfree(&q->drf);
    dfree(&q->dlg), dfree(&q->dlb);
}

typedef struct unit {
    CUmodule mod;
    CUfunction fn;
    sj_gemm_spec s;
} unit;

static void unit_load(unit *u, const sj_gemm_spec *s, const char *what) {
    char *src = gen(s), *cubin;
    size_t len;
    compile(src, s->tile.wg ? "sm_90a" : cu.arch, what, &cubin, &len);
    free(src);
    u->s = *s;
    cu_ok(cu.dev->api.ModuleLoadData(&u->mod, cubin), "cuModuleLoadData");
    free(cubin);
    cu_ok(cu.dev->api.ModuleGetFunction(&u->fn, u->mod, "sj_gemm"), "cuModuleGetFunction");
    /* (its shared memory allowed by sj_cuda_gemm_launch, as the runtime launches it) */
}

static void unit_unload(unit *u) {
    if (u->mod) cu.dev->api.ModuleUnload(u->mod);
    u->mod = NULL;
}

static int runs, checked_elems;

/* Can this device run tile t? Split-K needs clusters (9.0 and later),
 * warpgroup tiles Hopper itself (sm_90a). */
static bool runs_here(const sj_gemm_tile *t) {
    int cc = cu.dev->cc_major * 10 + cu.dev->cc_minor;
    return !(t->splitk > 1 && cc < 90) && !(t->wg && cc != 90);
}

static double out_at(const unsigned char *p, sj_dtype dt, int64_t i) {
    if (dt == SJ_F16) {
        uint16_t h;
        memcpy(&h, p + i * 2, 2);
        return sj_f16_to_f32(h);
    }
    float f;
    memcpy(&f, p + i * 4, 4);
    return f;
}

/* A LayerNorm inside: each row of Y against the float64 LayerNorm of the
 * kernel's own C row (as stored: the values it normalized) and of the
 * float64 reference's row, no write past row M, the counters left zero.
 * Returns the failures. */
static int check_ln(const prob *q, const epi *e, const unsigned char *c, const unsigned char *y, const unsigned *cnt,
                    size_t n_cnt, const char *what) {
    int64_t M = q->M, N = q->N;
    int bad = 0;
    double *ref = malloc(sizeof(double) * (size_t)N);
    assert_non_null(ref);
    for (int64_t m = 0; m < M && bad < 5; m++) {
        for (int pass = 0; pass < 2; pass++) { /* 0: the stored C; 1: float64 all through */
            double mean = 0, var = 0;
            for (int64_t n = 0; n < N; n++) {
                int64_t i = m * N + n;
                double v = out_at(c, e->out_dt, i);
                if (pass) {
                    v = q->p[i] + (e->bias ? (e->bias_dt == SJ_F16 ? sj_f16_to_f32(q->bh[n]) : q->bf[n]) : 0);
                    if (e->residual) v += e->res_dt == SJ_F16 ? sj_f16_to_f32(q->rh[i]) : q->rf[i];
                }
                ref[n] = v;
                mean += v;
            }
            mean /= (double)N;
            for (int64_t n = 0; n < N; n++) var += (ref[n] - mean) * (ref[n] - mean);
            double rstd = 1.0 / sqrt(var / (double)N + LN_EPS);
            /* the stored C: f16 or f32 arithmetic and Y's rounding; float64:
             * C's own rounding too, scaled by rstd */
            double tol = pass ? (e->out_dt == SJ_F16 ? 4e-3 : 1e-3) * (1 + rstd)
                              : (e->ln_out_dt == SJ_F16 ? 2e-3 : 2e-5);
            for (int64_t n = 0; n < N && bad < 5; n++) {
                double g = e->ln_gamma ? q->lg[n] : 1, b = e->ln_beta ? sj_f16_to_f32(q->lb[n]) : 0;
                double want = (ref[n] - mean) * rstd * g + b, got = out_at(y, e->ln_out_dt, m * N + n);
                if (!(fabs(got - want) <= tol * (1 + fabs(want)))) {
                    fprintf(stderr, "%s: layer_norm [%lld, %lld] out %.7g ref %.7g (%s)\n", what, (long long)m,
                            (long long)n, got, want, pass ? "float64" : "of the stored C");
                    bad++;
                }
            }
        }
    }
    free(ref);
    size_t ys = e->ln_out_dt == SJ_F16 ? 2 : 4;
    for (size_t i = (size_t)(M * N) * ys; i < (size_t)((M + 1) * N) * ys; i++)
        if (y[i] != 0xff) {
            fprintf(stderr, "%s: layer_norm wrote past row M (byte %zu)\n", what, i);
            bad++;
            break;
        }
    for (size_t i = 0; i < n_cnt; i++)
        if (cnt[i]) {
            fprintf(stderr, "%s: counter %zu left at %u\n", what, i, cnt[i]);
            bad++;
            break;
        }
    return bad;
}

/* Run u on q; compare with the reference. */
static void run_check(const unit *u, const prob *q, const epi *e, const char *what) {
    int64_t M = q->M, N = q->N;
    size_t es = e->out_dt == SJ_F16 ? 2 : 4, bytes = (size_t)((M + 1) * N) * es; /* a guard row past M */
    unsigned char *host = malloc(bytes);
    assert_non_null(host);
    memset(host, 0xff, bytes); /* NaN in f16 and f32 */
    dbuf dc = dput(host, bytes);
    CUdeviceptr A = q->da.p, B = q->db.p, bias = e->bias_dt == SJ_F16 ? q->dbh.p : q->dbf.p,
                R = e->res_dt == SJ_F16 ? q->drh.p : q->drf.p, C = dc.p;
    /* a LayerNorm inside: Y poisoned (a guard row too), the counters zero
     * (one more past the row blocks, which must stay so) */
    size_t yes = e->ln_out_dt == SJ_F16 ? 2 : 4, ybytes = e->ln ? (size_t)((M + 1) * N) * yes : 0;
    size_t n_cnt = (size_t)sj_gemm_ln_counters(M) + 1;
    unsigned char *yhost = e->ln ? malloc(ybytes) : NULL;
    unsigned *cnt = e->ln ? malloc(n_cnt * sizeof *cnt) : NULL;
    dbuf dy = {0}, dcnt = {0};
    if (e->ln) {
        assert_true(yhost && cnt);
        memset(yhost, 0xff, ybytes);
        memset(cnt, 0, n_cnt * sizeof *cnt);
        dy = dput(yhost, ybytes);
        dcnt = dput(cnt, n_cnt * sizeof *cnt);
    }
    const sj_gemm_ln_args ln = {(const void *)(uintptr_t)q->dlg.p, e->ln_beta ? (const void *)(uintptr_t)q->dlb.p : NULL,
                                (void *)(uintptr_t)dy.p, (unsigned *)(uintptr_t)dcnt.p};
    /* the library's launch: dims, shared memory, a warpgroup tile's tensor
     * maps; a LayerNorm's twice (the counters it leaves serve the next) */
    sj_cuda_exec ex = {.cuda = cu.dev, .stream = cu.dev->stream};
    for (int rep = 0; rep < (e->ln ? 2 : 1); rep++)
        if (sj_cuda_gemm_launch(&ex, u->fn, &u->s, M, (const void *)(uintptr_t)A, (const void *)(uintptr_t)B,
                                (const void *)(uintptr_t)bias, (const void *)(uintptr_t)R, (void *)(uintptr_t)C,
                                e->ln ? &ln : NULL))
            fail_msg("%s: %s", what, sj_last_error());
    cu_ok(cu.dev->api.StreamSynchronize(cu.dev->stream), "cuStreamSynchronize");
    assert_int_equal(sj_cuda_to_host(cu.dev, host, C, bytes), SJ_OK);
    dfree(&dc);
    if (e->ln) {
        assert_int_equal(sj_cuda_to_host(cu.dev, yhost, dy.p, ybytes), SJ_OK);
        assert_int_equal(sj_cuda_to_host(cu.dev, cnt, dcnt.p, n_cnt * sizeof *cnt), SJ_OK);
        dfree(&dy), dfree(&dcnt);
    }
    double tol = e->out_dt == SJ_F16 ? 3e-3 : 5e-4;
    int bad = 0;
    for (int64_t i = 0; i < M * N && bad < 5; i++) {
        int64_t n = i % N;
        double v = q->p[i], mag = q->mag[i];
        if (e->bias) {
            double b = e->bias_dt == SJ_F16 ? sj_f16_to_f32(q->bh[n]) : q->bf[n];
            v += b;
            mag += fabs(b);
        }
        if (e->gelu) v = 0.5 * v * (1.0 + erf(v / sqrt(2.0)));
        if (e->residual) {
            double r = e->res_dt == SJ_F16 ? sj_f16_to_f32(q->rh[i]) : q->rf[i];
            v += r;
            mag += fabs(r);
        }
        double out = out_at(host, e->out_dt, i);
        if (!(fabs(out - v) <= tol * (mag + fabs(v)))) {
            fprintf(stderr, "%s: [%lld, %lld] out %.7g ref %.7g (mag %.3g)\n", what, (long long)(i / N),
                    (long long)n, out, v, mag);
            bad++;
        }
    }
    for (size_t i = (size_t)(M * N) * es; i < bytes; i++)
        if (host[i] != 0xff) {
            fprintf(stderr, "%s: wrote past row M (byte %zu)\n", what, i);
            bad++;
            break;
        }
    if (e->ln) bad += check_ln(q, e, host, yhost, cnt, n_cnt, what);
    free(host);
    free(yhost);
    free(cnt);
    runs++;
    checked_elems += (int)(M * N);
    if (bad) fail_msg("%s: wrong results", what);
}
#endif /* SJ_WITH_CUDA */

static void test_device(void **state) {
    (void)state;
    if (!cu.have_gpu) {
        print_message("skipped: no CUDA device (%s)\n", cu.no_gpu_why);
        return;
    }
#ifdef SJ_WITH_CUDA
    static const int64_t Ms[] = {1, 7, 64, 333, 512};
    static const int64_t NK[4][2] = {{384, 384}, {1536, 384}, {384, 1536}, {1536, 1536}};
    int n_tiles;
    const sj_gemm_tile *tiles = sj_gemm_cuda_tiles(&n_tiles);
    for (int sh = 0; sh < 4; sh++) {
        int64_t N = NK[sh][0], K = NK[sh][1];
        /* per tile: the fullest epilogue, none, and one more in turn; all
         * symbolic (one unit for every M) */
        unit units[32][4];
        const epi *ue[32][4];
        int nu[32];
        assert_true(n_tiles <= 32);
        for (int t = 0; t < n_tiles; t++) {
            int pick[3] = {FULL, 0, 1 + (t + sh) % (N_EPI - 1)};
            if (pick[2] == FULL) pick[2] = N_EPI - 1;
            nu[t] = 0;
            if (!runs_here(&tiles[t])) continue;
            for (int k = 0; k < 3; k++) {
                sj_gemm_spec s = spec_of(&tiles[t], 0, N, K, &epis[pick[k]]);
                if (sj_gemm_cuda_check(&s)) continue;
                char what[128];
                snprintf(what, sizeof what, "N %lld K %lld tile %dx%dx%d/%dx%d/%d/k%d%s %s", (long long)N,
                         (long long)K, tiles[t].bm, tiles[t].bn, tiles[t].bk, tiles[t].wm, tiles[t].wn, tiles[t].stages,
                         tiles[t].splitk, tiles[t].wg ? "/wg" : "", epis[pick[k]].name);
                unit_load(&units[t][nu[t]], &s, what);
                ue[t][nu[t]++] = &epis[pick[k]];
            }
            /* and a LayerNorm inside (N a multiple of 64 up to 4096: both) */
            const epi *le = &ln_epis[(t + sh) % N_LN];
            sj_gemm_spec s = spec_of(&tiles[t], 0, N, K, le);
            if (sj_gemm_cuda_check(&s)) continue;
            char what[128];
            snprintf(what, sizeof what, "N %lld K %lld tile %d %s", (long long)N, (long long)K, t, le->name);
            unit_load(&units[t][nu[t]], &s, what);
            ue[t][nu[t]++] = le;
        }
        for (int mi = 0; mi < 5; mi++) {
            prob q;
            prob_make(&q, Ms[mi], N, K);
            for (int t = 0; t < n_tiles; t++)
                for (int k = 0; k < nu[t]; k++) {
                    char what[160];
                    snprintf(what, sizeof what, "M %lld N %lld K %lld tile %d %s", (long long)q.M, (long long)N,
                             (long long)K, t, ue[t][k]->name);
                    run_check(&units[t][k], &q, ue[t][k], what);
                }
            /* specialized to this M: the fullest epilogue, the first tile
             * and the first split-K tile that fits */
            for (int t = 0, kinds = 0; t < n_tiles; t++) {
                /* one of each kind: one block, split-K, warpgroup */
                int kind = tiles[t].wg ? 4 : tiles[t].splitk > 1 ? 2 : 1;
                if ((kinds & kind) || !runs_here(&tiles[t])) continue;
                unit us;
                sj_gemm_spec s = spec_of(&tiles[t], q.M, N, K, &epis[FULL]);
                if (sj_gemm_cuda_check(&s)) continue;
                char what[160];
                snprintf(what, sizeof what, "M %lld N %lld K %lld specialized, tile %d", (long long)q.M,
                         (long long)N, (long long)K, t);
                unit_load(&us, &s, what);
                run_check(&us, &q, &epis[FULL], what);
                unit_unload(&us);
                s = spec_of(&tiles[t], q.M, N, K, &ln_epis[0]);
                snprintf(what, sizeof what, "M %lld N %lld K %lld specialized, tile %d, %s", (long long)q.M,
                         (long long)N, (long long)K, t, ln_epis[0].name);
                unit_load(&us, &s, what);
                run_check(&us, &q, &ln_epis[0], what);
                unit_unload(&us);
                kinds |= kind;
            }
            prob_free(&q);
        }
        for (int t = 0; t < n_tiles; t++)
            for (int k = 0; k < nu[t]; k++) unit_unload(&units[t][k]);
    }
    print_message("  %d runs, %d elements checked against float64 on %s\n", runs, checked_elems, cu.dev->name);
#endif
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_check),
        cmocka_unit_test(test_compile),
        cmocka_unit_test(test_device),
    };
    return cmocka_run_group_tests(tests, setup_all, teardown_all);
}
