/* Generated tensor-core matrix products with fused epilogues (see
 * codegen_gemm_cuda.h).
 *
 * The unit is self-contained CUDA C++ for NVRTC (no headers: f16 through
 * PTX cvt, shared addresses through cvta): the tile sizes, N, K (and M
 * when specialized) are macros, so the K loop's trip count, the copy loops
 * and the fragment loops are constants the compiler unrolls.
 *
 * Pipeline: STAGES - 1 tiles of A and B are in flight before the first
 * multiply; iteration kt waits until tile kt has landed
 * (cp.async.wait_group STAGES - 2), synchronizes the block (which also
 * frees the buffer read in iteration kt - 1), issues the copy of tile
 * kt + STAGES - 1 into that buffer, then runs BK / 16 steps of ldmatrix
 * and mma.sync on tile kt. One commit a iteration, empty past the last
 * tile, keeps the group count the wait relies on.
 *
 * Shared rows are padded by 8 halves (16 bytes): the eight row addresses
 * of an ldmatrix then fall in different bank groups.
 *
 * Epilogue: each thread holds, per 16 x 8 tile, two adjacent columns of
 * two rows (g and g + 8 of the tile, g = lane / 4; columns 2 (lane % 4)
 * and + 1), so bias, residual and C are read and written as pairs (4 or 8
 * bytes, aligned: N is even).
 */
#include "specialize/codegen_gemm_cuda.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "specialize/codegen_int.h"
#include "specialize/fusion.h"

#define put sj_cg_put

/* -- Checks ------------------------------------------------------------------ */

/* a warpgroup tile: its warpgroups and one producer warp */
static int threads_of(const sj_gemm_tile *t) { return t->wg ? t->wm * 128 + 32 : t->wm * t->wn * 32; }

static int splitk_of(const sj_gemm_tile *t) { return t->splitk > 1 ? t->splitk : 1; }

/* The f32 partial tile of a split-K block: BM rows of BN + 4 floats (the
 * pad spreads a fragment store's rows over the banks). */
static size_t red_bytes_of(const sj_gemm_tile *t) { return (size_t)t->bm * (size_t)(t->bn + 4) * 4; }

static size_t smem_of(const sj_gemm_tile *t) {
    /* a warpgroup tile's stages: BM and BN rows of 128 bytes, each stage
     * 1024-byte aligned (the swizzle's atom), the base rounded up to it,
     * then a stage's mbarrier each */
    size_t pipe = t->wg ? (size_t)t->stages * (size_t)(t->bm + t->bn) * 128 + 1024 + 16 * (size_t)t->stages
                        : (size_t)t->stages * ((size_t)t->bm * (size_t)(t->bk + 8) + (size_t)t->bk * (size_t)(t->bn + 8)) * 2;
    return splitk_of(t) > 1 && red_bytes_of(t) > pipe ? red_bytes_of(t) : pipe;
}

static bool half_or_float(sj_dtype dt) { return dt == SJ_F16 || dt == SJ_F32; }

sj_status sj_gemm_cuda_check(const sj_gemm_spec *s) {
    const sj_gemm_tile *t = &s->tile;
    if (t->wm < 1 || t->wn < 1 || t->bm < 16 || t->bn < 16 || t->bk < 16)
        return sj_seterr(SJ_EINVAL, "gemm: tile %dx%dx%d with %dx%d warps is too small", t->bm, t->bn, t->bk, t->wm,
                         t->wn);
    if (t->bm % (16 * t->wm) || t->bn % (16 * t->wn) || t->bk % 16)
        return sj_seterr(SJ_EINVAL,
                         "gemm: BM %d must be a multiple of 16 x %d warps, BN %d of 16 x %d warps, BK %d of 16",
                         t->bm, t->wm, t->bn, t->wn, t->bk);
    if (t->wg ? t->stages < 3 || t->stages > 6 : t->stages < 2 || t->stages > 4)
        return sj_seterr(SJ_EINVAL, "gemm: %d stages (%s)", t->stages, t->wg ? "3 .. 6 a warpgroup tile" : "2 .. 4");
    if (t->wg && (t->wn != 1 || (t->wm != 1 && t->wm != 2) || t->bm != 64 * t->wm || t->bk != 64 || t->bn % 64 ||
                  t->bn > 256))
        return sj_seterr(SJ_EINVAL,
                         "gemm: a warpgroup tile is 64 rows a warpgroup (1 or 2, wn 1), BN a multiple of 64 up to 256, "
                         "BK 64; not %dx%dx%d with %dx%d",
                         t->bm, t->bn, t->bk, t->wm, t->wn);
    if (threads_of(t) > 1024) return sj_seterr(SJ_EINVAL, "gemm: %d threads a block (1024 at most)", threads_of(t));
    if (smem_of(t) > 227 * 1024)
        return sj_seterr(SJ_EINVAL, "gemm: %zu bytes of shared memory (227 KiB at most)", smem_of(t));
    int sk = splitk_of(t);
    if (sk != 1 && sk != 2 && sk != 4 && sk != 8) return sj_seterr(SJ_EINVAL, "gemm: split-K %d (1, 2, 4 or 8)", sk);
    if (s->N <= 0 || s->K <= 0 || s->N % t->bn || s->K % ((int64_t)t->bk * sk))
        return sj_seterr(SJ_EINVAL,
                         "gemm: N %" PRId64 " must be a multiple of BN %d, K %" PRId64 " of BK %d x split-K %d", s->N,
                         t->bn, s->K, t->bk, sk);
    if ((t->bm * t->bn / 2) % sk)
        return sj_seterr(SJ_EINVAL, "gemm: a %dx%d tile's pairs do not split %d ways", t->bm, t->bn, sk);
    if (s->M < 0) return sj_seterr(SJ_EINVAL, "gemm: M %" PRId64 " < 0", s->M);
    if (!half_or_float(s->out_dtype) || (s->bias && !half_or_float(s->bias_dtype)) ||
        (s->residual && !half_or_float(s->res_dtype)))
        return sj_seterr(SJ_EINVAL, "gemm: output, bias and residual are f16 or f32");
    if (s->ln && (s->N % 64 || s->N > (s->out_dtype == SJ_F16 ? 4096 : 2048)))
        return sj_seterr(SJ_EINVAL,
                         "gemm: a LayerNorm inside needs N a multiple of 64 up to 4096 (2048 with f32 sums), not "
                         "%" PRId64, s->N);
    if (s->ln && (!half_or_float(s->ln_out_dtype) || (s->ln_gamma && !half_or_float(s->ln_g_dtype)) ||
                  (s->ln_beta && !half_or_float(s->ln_b_dtype)) || !(s->ln_eps >= 0)))
        return sj_seterr(SJ_EINVAL, "gemm: the LayerNorm's output, gamma and beta are f16 or f32, eps >= 0");
    return SJ_OK;
}

void sj_gemm_cuda_dims(const sj_gemm_spec *s, int64_t M, sj_gemm_dims *d) {
    const sj_gemm_tile *t = &s->tile;
    d->grid[0] = (unsigned)(s->N / t->bn);
    d->grid[1] = (unsigned)((M + t->bm - 1) / t->bm);
    d->grid[2] = (unsigned)splitk_of(t); /* a cluster's blocks along z */
    d->block[0] = (unsigned)threads_of(t);
    d->block[1] = d->block[2] = 1;
    d->smem = smem_of(t);
}

/* The table: tiles of one block first (any sm_80 device takes them), then
 * split-K clusters (sm_90), then warpgroup tiles (sm_90a). */
#define FIRST_SPLIT 5
#define FIRST_WG 14

const sj_gemm_tile *sj_gemm_cuda_tiles(int *n) {
    static const sj_gemm_tile tiles[] = {
        {64, 64, 32, 2, 2, 3, 1, 0},   /* small M: many blocks */
        {64, 128, 32, 2, 2, 3, 1, 0},
        {128, 64, 32, 2, 2, 3, 1, 0},
        {128, 128, 32, 2, 4, 3, 1, 0}, /* large M: reuse */
        {64, 64, 64, 2, 2, 2, 1, 0},
        /* FIRST_SPLIT: split-K clusters (sm_90), for products of few rows */
        {16, 64, 32, 1, 4, 4, 2, 0},
        {16, 64, 32, 1, 4, 4, 4, 0},
        {16, 64, 32, 1, 4, 4, 8, 0},
        {16, 32, 32, 1, 2, 4, 4, 0},
        {16, 32, 32, 1, 2, 4, 8, 0},
        {32, 64, 32, 2, 2, 4, 2, 0},
        {32, 64, 32, 2, 2, 4, 4, 0},
        {64, 64, 32, 2, 2, 3, 2, 0},
        {64, 64, 32, 2, 2, 3, 4, 0},
        /* FIRST_WG: warpgroup products (sm_90a) */
        {64, 64, 64, 1, 1, 5, 1, 1},
        {64, 128, 64, 1, 1, 4, 1, 1},
        {128, 128, 64, 2, 1, 4, 1, 1},
        {64, 256, 64, 1, 1, 4, 1, 1},
        {128, 256, 64, 2, 1, 3, 1, 1},
        {64, 64, 64, 1, 1, 5, 2, 1},
        {64, 64, 64, 1, 1, 5, 4, 1},
        {64, 128, 64, 1, 1, 4, 2, 1},
    };
    *n = (int)(sizeof tiles / sizeof tiles[0]);
    return tiles;
}

/* How far a grid of `blocks` is from one or two blocks a multiprocessor
 * (1: in that range; larger: further), with the rows a block wastes past
 * M counted as idle blocks. */
static double grid_cost(int64_t blocks, int64_t M, int bm, int units) {
    double used = (double)M / (double)(((M + bm - 1) / bm) * bm); /* a tile's rows that are real */
    double eff = (double)blocks * used;
    if (eff < units) return (double)units / (eff > 0 ? eff : 1);
    if (blocks > 2 * (int64_t)units) return (double)blocks / (2.0 * units);
    return 1.0;
}

/* The k best tiles of [from, to) for an N x K product at m rows, by
 * grid_cost (then fewer rows wasted, then the table's order), appended to
 * out[*n]. */
static void best_tiles(int from, int to, int64_t m, int64_t N, int64_t K, int units, int k, int8_t *out, int *n) {
    int nt;
    const sj_gemm_tile *tiles = sj_gemm_cuda_tiles(&nt);
    int best[4] = {-1, -1, -1, -1};
    double cost[4] = {0};
    if (k > 4) k = 4;
    for (int t = from; t < to && t < nt; t++) {
        sj_gemm_spec sp = {.N = N, .K = K, .out_dtype = SJ_F16, .tile = tiles[t]};
        if (sj_gemm_cuda_check(&sp) != SJ_OK) continue;
        int64_t blocks = (N / tiles[t].bn) * ((m + tiles[t].bm - 1) / tiles[t].bm) * splitk_of(&tiles[t]);
        double c = grid_cost(blocks, m, tiles[t].bm, units > 0 ? units : 132) +
                   (double)((tiles[t].bm - m % tiles[t].bm) % tiles[t].bm) / 64.0;
        for (int j = 0; j < k; j++)
            if (best[j] < 0 || c < cost[j]) {
                for (int i = k - 1; i > j; i--) best[i] = best[i - 1], cost[i] = cost[i - 1];
                best[j] = t, cost[j] = c;
                break;
            }
    }
    for (int j = 0; j < k; j++)
        if (best[j] >= 0) out[(*n)++] = (int8_t)best[j];
}

int sj_gemm_cuda_candidates(int64_t M, int64_t N, int64_t K, int arch, int units, int8_t *out, int max) {
    int nt, n = 0;
    sj_gemm_cuda_tiles(&nt);
    bool wg = arch == 90 && max >= 4; /* sm_90a: Hopper itself */
    if (arch >= 90 && max >= 3) /* split-K for few rows (16 where M is unknown) */
        best_tiles(FIRST_SPLIT, FIRST_WG, M > 0 ? M : 16, N, K, units, wg ? 1 : 2, out, &n);
    if (wg) /* warpgroup tiles at M (256 where unknown) */
        best_tiles(FIRST_WG, nt, M > 0 ? M : 256, N, K, units, 2, out, &n);
    for (int t = 0; t < FIRST_SPLIT && n < max; t++) {
        sj_gemm_spec sp = {.N = N, .K = K, .out_dtype = SJ_F16, .tile = sj_gemm_cuda_tiles(&nt)[t]};
        if (sj_gemm_cuda_check(&sp) == SJ_OK) out[n++] = (int8_t)t;
    }
    return n;
}

/* -- Source -------------------------------------------------------------------- */

static const char helpers[] =
    /* sj_rt_grid_dep of base/sj_kernel_rt.h (a product's unit is standalone):
     * first in the kernel, before any access */
    "__device__ __forceinline__ void grid_dep() {\n"
    "#if __CUDA_ARCH__ >= 900\n"
    "    asm volatile(\"griddepcontrol.launch_dependents;\\n\\tgriddepcontrol.wait;\" ::: \"memory\");\n"
    "#endif\n"
    "}\n"
    "__device__ __forceinline__ unsigned smem_u32(const void *p) {\n"
    "    unsigned r;\n"
    "    asm(\"{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }\" : \"=r\"(r) : \"l\"(p));\n"
    "    return r;\n"
    "}\n"
    "__device__ __forceinline__ void cp16(unsigned dst, const void *src, int bytes) {\n"
    "    asm volatile(\"cp.async.cg.shared.global [%0], [%1], 16, %2;\\n\" ::\"r\"(dst), \"l\"(src), \"r\"(bytes));\n"
    "}\n"
    "__device__ __forceinline__ void cp_commit() { asm volatile(\"cp.async.commit_group;\\n\" ::); }\n"
    "template <int N> __device__ __forceinline__ void cp_wait() {\n"
    "    asm volatile(\"cp.async.wait_group %0;\\n\" ::\"n\"(N));\n"
    "}\n"
    "__device__ __forceinline__ void ldm_x4(unsigned &r0, unsigned &r1, unsigned &r2, unsigned &r3, unsigned a) {\n"
    "    asm volatile(\"ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\\n\"\n"
    "                 : \"=r\"(r0), \"=r\"(r1), \"=r\"(r2), \"=r\"(r3) : \"r\"(a));\n"
    "}\n"
    "__device__ __forceinline__ void ldm_x4_t(unsigned &r0, unsigned &r1, unsigned &r2, unsigned &r3, unsigned a) {\n"
    "    asm volatile(\"ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\\n\"\n"
    "                 : \"=r\"(r0), \"=r\"(r1), \"=r\"(r2), \"=r\"(r3) : \"r\"(a));\n"
    "}\n"
    "__device__ __forceinline__ void mma16816(float *c, const unsigned *a, unsigned b0, unsigned b1) {\n"
    "    asm volatile(\"mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, \"\n"
    "                 \"{%0,%1,%2,%3};\\n\"\n"
    "                 : \"+f\"(c[0]), \"+f\"(c[1]), \"+f\"(c[2]), \"+f\"(c[3])\n"
    "                 : \"r\"(a[0]), \"r\"(a[1]), \"r\"(a[2]), \"r\"(a[3]), \"r\"(b0), \"r\"(b1));\n"
    "}\n"
    "__device__ __forceinline__ float h2f(unsigned short h) {\n"
    "    float f;\n"
    "    asm(\"cvt.f32.f16 %0, %1;\" : \"=f\"(f) : \"h\"(h));\n"
    "    return f;\n"
    "}\n"
    "__device__ __forceinline__ unsigned short f2h(float f) {\n"
    "    unsigned short h;\n"
    "    asm(\"cvt.rn.f16.f32 %0, %1;\" : \"=h\"(h) : \"f\"(f));\n"
    "    return h;\n"
    "}\n"
    "/* a pair of adjacent elements of an f16 or f32 array, as floats */\n"
    "__device__ __forceinline__ void ld2_h(const void *p, long long i, float &x, float &y) {\n"
    "    unsigned w = *(const unsigned *)((const unsigned short *)p + i);\n"
    "    x = h2f((unsigned short)(w & 0xffffu));\n"
    "    y = h2f((unsigned short)(w >> 16));\n"
    "}\n"
    "__device__ __forceinline__ void ld2_f(const void *p, long long i, float &x, float &y) {\n"
    "    float2 v = *(const float2 *)((const float *)p + i);\n"
    "    x = v.x;\n"
    "    y = v.y;\n"
    "}\n"
    "__device__ __forceinline__ void st2_h(void *p, long long i, float x, float y) {\n"
    "    *(unsigned *)((unsigned short *)p + i) = (unsigned)f2h(x) | ((unsigned)f2h(y) << 16);\n"
    "}\n"
    "__device__ __forceinline__ void st2_f(void *p, long long i, float x, float y) {\n"
    "    *(float2 *)((float *)p + i) = make_float2(x, y);\n"
    "}\n"
    "__device__ __forceinline__ float gelu_erf(float v) { return 0.5f * v * (1.0f + erff(v * 0.70710678118654752f)); }\n";

/* The tile loader and the kernel, over the macros put before them. */
static const char body_head[] =
    "__device__ __forceinline__ void load_tile(unsigned short *as, unsigned short *bs, const unsigned short *A,\n"
    "                                          const unsigned short *B, long long M, long long m0, int n0, int k0,\n"
    "                                          int tid) {\n"
    "    enum { AC = BM * (BK / 8), BC = BK * (BN / 8) };\n"
    "#pragma unroll\n"
    "    for (int j = 0; j < (AC + THREADS - 1) / THREADS; j++) {\n"
    "        const int i = tid + j * THREADS;\n"
    "        if (AC % THREADS == 0 || i < AC) {\n"
    "            const int r = i / (BK / 8), c = (i % (BK / 8)) * 8;\n"
    "            const long long gm = m0 + r;\n"
    "            const unsigned short *src = A + (gm < M ? gm : 0) * KK + k0 + c;\n"
    "            cp16(smem_u32(as + r * AS + c), src, gm < M ? 16 : 0);\n"
    "        }\n"
    "    }\n"
    "#pragma unroll\n"
    "    for (int j = 0; j < (BC + THREADS - 1) / THREADS; j++) {\n"
    "        const int i = tid + j * THREADS;\n"
    "        if (BC % THREADS == 0 || i < BC) {\n"
    "            const int r = i / (BN / 8), c = (i % (BN / 8)) * 8;\n"
    "            cp16(smem_u32(bs + r * BS + c), B + (long long)(k0 + r) * NN + n0 + c, 16);\n"
    "        }\n"
    "    }\n"
    "}\n\n";

static const char body_main[] =
    "    extern __shared__ __align__(16) unsigned short smem[];\n"
    "    unsigned short *As = smem, *Bs = smem + STAGES * A_STAGE;\n"
    "    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;\n"
    "    const int wm = warp / WN, wn = warp % WN;\n"
    "    const long long m0 = (long long)blockIdx.y * BM;\n"
    "    const int n0 = blockIdx.x * BN;\n"
    "    if (m0 >= M) return;\n"
    "    float acc[MT][NT][4];\n"
    "#pragma unroll\n"
    "    for (int i = 0; i < MT; i++)\n"
    "#pragma unroll\n"
    "        for (int j = 0; j < NT; j++) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.0f;\n"
    "    enum { KT = KK / BK / SK }; /* this block's K tiles: the z-th SK-th of K */\n"
    "    const int kb = blockIdx.z * (KT * BK);\n"
    "#pragma unroll\n"
    "    for (int s = 0; s < STAGES - 1; s++) {\n"
    "        if (s < KT) load_tile(As + s * A_STAGE, Bs + s * B_STAGE, A, B, M, m0, n0, kb + s * BK, tid);\n"
    "        cp_commit();\n"
    "    }\n"
    "#pragma unroll 1\n"
    "    for (int kt = 0; kt < KT; kt++) {\n"
    "        cp_wait<STAGES - 2>();\n"
    "        __syncthreads();\n"
    "        const int nk = kt + STAGES - 1;\n"
    "        if (nk < KT) load_tile(As + (nk % STAGES) * A_STAGE, Bs + (nk % STAGES) * B_STAGE, A, B, M, m0, n0,\n"
    "                               kb + nk * BK, tid);\n"
    "        cp_commit();\n"
    "        const unsigned short *as = As + (kt % STAGES) * A_STAGE, *bs = Bs + (kt % STAGES) * B_STAGE;\n"
    "#pragma unroll\n"
    "        for (int kk = 0; kk < BK; kk += 16) {\n"
    "            unsigned af[MT][4], bf[NT][2];\n"
    "#pragma unroll\n"
    "            for (int mt = 0; mt < MT; mt++) {\n"
    "                const int r = wm * TM + mt * 16 + (lane & 15), c = kk + (lane >> 4) * 8;\n"
    "                ldm_x4(af[mt][0], af[mt][1], af[mt][2], af[mt][3], smem_u32(as + r * AS + c));\n"
    "            }\n"
    "#pragma unroll\n"
    "            for (int np = 0; np < NT / 2; np++) {\n"
    "                const int r = kk + (lane & 15), c = wn * TN + np * 16 + (lane >> 4) * 8;\n"
    "                ldm_x4_t(bf[2 * np][0], bf[2 * np][1], bf[2 * np + 1][0], bf[2 * np + 1][1],\n"
    "                         smem_u32(bs + r * BS + c));\n"
    "            }\n"
    "#pragma unroll\n"
    "            for (int mt = 0; mt < MT; mt++)\n"
    "#pragma unroll\n"
    "                for (int nt = 0; nt < NT; nt++) mma16816(acc[mt][nt], af[mt], bf[nt][0], bf[nt][1]);\n"
    "        }\n"
    "    }\n"
    "    cp_wait<0>();\n"
    "    const int g = lane >> 2, t4 = lane & 3;\n";

/* One block a tile: the epilogue on the accumulators, pair by pair (a
 * warpgroup tile's producer warp leaves; with a LayerNorm inside it stays
 * for the row block's normalization). */
static const char epi_direct_head[] =
    "    if (warp >= CWARPS) return; /* a warpgroup tile's producer warp */\n"
    "#pragma unroll\n"
    "    for (int mt = 0; mt < MT; mt++)\n";
static const char epi_direct_head_ln[] =
    "#pragma unroll\n"
    "    for (int mt = 0; mt < MT && warp < CWARPS; mt++) /* (not a warpgroup tile's producer warp) */\n";
static const char epi_direct[] =
    "#pragma unroll\n"
    "        for (int h = 0; h < 2; h++) {\n"
    "            const long long row = m0 + wm * TM + mt * 16 + g + h * 8;\n"
    "            if (row >= M) continue;\n"
    "#pragma unroll\n"
    "            for (int nt = 0; nt < NT; nt++) {\n"
    "                const int col = n0 + wn * TN + nt * 8 + 2 * t4;\n"
    "                float v0 = acc[mt][nt][2 * h], v1 = acc[mt][nt][2 * h + 1];\n";

/* Split-K: the partial tile to shared memory (the pipeline's buffers, all
 * read), the cluster's barrier, then this block's SK-th of the pairs summed
 * over the cluster's blocks in rank order, and the epilogue on them. */
static const char epi_split[] =
    "    __syncthreads();\n"
    "    float *red = (float *)smem;\n"
    "#pragma unroll\n"
    "    for (int mt = 0; mt < MT && warp < CWARPS; mt++)\n"
    "#pragma unroll\n"
    "        for (int h = 0; h < 2; h++)\n"
    "#pragma unroll\n"
    "            for (int nt = 0; nt < NT; nt++)\n"
    "                *(float2 *)(red + (wm * TM + mt * 16 + g + h * 8) * RS + wn * TN + nt * 8 + 2 * t4) =\n"
    "                    make_float2(acc[mt][nt][2 * h], acc[mt][nt][2 * h + 1]);\n"
    "    cluster_sync();\n"
    "    {\n"
    "        enum { PAIRS = BM * BN / 2, PER = PAIRS / SK };\n"
    "        const unsigned rank = cluster_rank(), base = smem_u32(red);\n"
    "#pragma unroll 1\n"
    "        for (int p = (int)rank * PER + tid; p < ((int)rank + 1) * PER; p += THREADS) {\n"
    "            const int r = (2 * p) / BN, c = (2 * p) % BN;\n"
    "            const long long row = m0 + r;\n"
    "            if (row >= M) continue;\n"
    "            const int col = n0 + c;\n"
    "            float v0 = 0.0f, v1 = 0.0f;\n"
    "#pragma unroll\n"
    "            for (int q = 0; q < SK; q++) {\n"
    "                const float2 x = ld_peer2(base + (unsigned)(r * RS + c) * 4u, (unsigned)q);\n"
    "                v0 += x.x;\n"
    "                v1 += x.y;\n"
    "            }\n";

/* Distributed shared memory (sm_90): a cluster's barrier, this block's
 * rank, a pair of floats from a peer's shared memory. */
static const char cluster_helpers[] =
    "__device__ __forceinline__ void cluster_sync() {\n"
    "    asm volatile(\"barrier.cluster.arrive.release.aligned;\\n\"\n"
    "                 \"barrier.cluster.wait.acquire.aligned;\\n\" ::: \"memory\");\n"
    "}\n"
    "__device__ __forceinline__ unsigned cluster_rank() {\n"
    "    unsigned r;\n"
    "    asm volatile(\"mov.u32 %0, %%cluster_ctarank;\" : \"=r\"(r));\n"
    "    return r;\n"
    "}\n"
    "__device__ __forceinline__ float2 ld_peer2(unsigned addr, unsigned rank) {\n"
    "    unsigned a;\n"
    "    float2 v;\n"
    "    asm volatile(\"mapa.shared::cluster.u32 %0, %1, %2;\" : \"=r\"(a) : \"r\"(addr), \"r\"(rank));\n"
    "    asm volatile(\"ld.shared::cluster.v2.f32 {%0, %1}, [%2];\" : \"=f\"(v.x), \"=f\"(v.y) : \"r\"(a) : \"memory\");\n"
    "    return v;\n"
    "}\n";

/* Warpgroup products (sm_90a): the proxy fence that makes cp.async's
 * writes visible to wgmma, wgmma's own fence, commit and wait, and a
 * shared-memory matrix descriptor in the 128-byte swizzle mode (address,
 * leading and stride byte offsets, each in 16-byte units). */
static const char wg_helpers[] =
    "__device__ __forceinline__ void wg_fence() { asm volatile(\"wgmma.fence.sync.aligned;\\n\" ::: \"memory\"); }\n"
    "__device__ __forceinline__ void wg_commit() { asm volatile(\"wgmma.commit_group.sync.aligned;\\n\" ::: \"memory\"); }\n"
    "__device__ __forceinline__ void wg_wait0() { asm volatile(\"wgmma.wait_group.sync.aligned 0;\\n\" ::: \"memory\"); }\n"
    "__device__ __forceinline__ void wg_wait1() { asm volatile(\"wgmma.wait_group.sync.aligned 1;\\n\" ::: \"memory\"); }\n"
    "__device__ __forceinline__ unsigned long long wg_desc(unsigned addr, unsigned lbo, unsigned sbo) {\n"
    "    return (unsigned long long)((addr & 0x3FFFFu) >> 4) | ((unsigned long long)(lbo >> 4) << 16) |\n"
    "           ((unsigned long long)(sbo >> 4) << 32) | (1ull << 62);\n"
    "}\n";

/* The tensor memory accelerator (TMA) that fills a warpgroup tile's
 * stages: sj_tmap is a CUtensorMap (128 bytes, passed by value as a
 * __grid_constant__ parameter); a stage's mbarrier (one arrival, the
 * stage's bytes expected) completes when its copies have landed. */
static const char wg_tma[] =
    "struct __align__(64) sj_tmap { unsigned long long v[16]; };\n"
    "__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count) {\n"
    "    asm volatile(\"mbarrier.init.shared::cta.b64 [%0], %1;\\n\" ::\"r\"(bar), \"r\"(count) : \"memory\");\n"
    "}\n"
    "__device__ __forceinline__ void mbar_arrive(unsigned bar) {\n"
    "    asm volatile(\"mbarrier.arrive.shared::cta.b64 _, [%0];\\n\" ::\"r\"(bar) : \"memory\");\n"
    "}\n"
    "__device__ __forceinline__ void mbar_expect(unsigned bar, unsigned bytes) {\n"
    "    asm volatile(\"mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\\n\" ::\"r\"(bar), \"r\"(bytes) : \"memory\");\n"
    "}\n"
    "__device__ __forceinline__ bool mbar_try(unsigned bar, unsigned phase) {\n"
    "    unsigned ok;\n"
    "    asm volatile(\"{\\n.reg .pred p;\\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\\n\"\n"
    "                 \"selp.u32 %0, 1, 0, p;\\n}\\n\" : \"=r\"(ok) : \"r\"(bar), \"r\"(phase) : \"memory\");\n"
    "    return ok != 0;\n"
    "}\n"
    "__device__ __forceinline__ void tma_load(unsigned dst, const sj_tmap *map, int x, int y, unsigned bar) {\n"
    "    asm volatile(\"cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\\n\"\n"
    "                 ::\"r\"(dst), \"l\"((unsigned long long)map), \"r\"(x), \"r\"(y), \"r\"(bar) : \"memory\");\n"
    "}\n\n"
    /* stage kt of this block into buffer st, by one thread: A's BM x 64 box at
     * (k, m0), B's BN / 64 boxes of 64 x 64 at (n0 + 64 j, k), each landing as
     * 128-byte rows in the 128-byte swizzle (chunk c of row r at c ^ (r % 8)),
     * A rows past M zero-filled by the TMA */
    "__device__ __forceinline__ void issue_stage(unsigned st, unsigned bar, const sj_tmap *ta, const sj_tmap *tb,\n"
    "                                            int m0, int n0, int k) {\n"
    "    mbar_expect(bar, STAGE_BYTES);\n"
    "    tma_load(st, ta, k, m0, bar);\n"
    "#pragma unroll\n"
    "    for (int j = 0; j < BN / 64; j++) tma_load(st + A_BYTES + j * (BK * 128), tb, n0 + 64 * j, k, bar);\n"
    "}\n\n";

/* The warpgroup tile's main loop, warp-specialized. The block's last warp
 * is the producer: its lane 0 queues every stage's copies with the TMA,
 * each into its buffer once that buffer's `empty` mbarrier says every
 * consumer warp is done with it. The consumer warps (the warpgroups) wait
 * for a stage's `full` mbarrier (the TMA's bytes landed), run four
 * m64nBNk16 steps (A's descriptor advances 32 bytes a step within the
 * swizzled row, B's 16 k-rows = 2048 bytes; A: stride 1024 between 8-row
 * groups; B transposed: 8192 = BK x 128 between 64-column blocks, 1024
 * between 8-row groups of k), leave them running while they wait for the
 * previous iteration's, then free that one's buffer. No block barrier in
 * the loop, and no consumer ever waits for the copies' issue. A buffer's
 * u-th completion of either barrier has parity u & 1. */
static const char wg_main[] =
    "    extern __shared__ __align__(16) unsigned short smem[];\n"
    "    const unsigned sbase = (smem_u32(smem) + 1023u) & ~1023u, full = sbase + STAGES * STAGE_BYTES,\n"
    "                   empty = full + 8 * STAGES;\n"
    "    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;\n"
    "    const int wm = warp, wn = 0; /* a consumer warp's 16 rows of its warpgroup's 64 */\n"
    "    const long long m0 = (long long)blockIdx.y * BM;\n"
    "    const int n0 = blockIdx.x * BN;\n"
    "    if (m0 >= M) return;\n"
    "    enum { KT = KK / BK / SK }; /* this block's K tiles: the z-th SK-th of K */\n"
    "    const int kb = blockIdx.z * (KT * BK);\n"
    "    if (tid == 0) {\n"
    "#pragma unroll\n"
    "        for (int s = 0; s < STAGES; s++) {\n"
    "            mbar_init(full + 8 * s, 1);\n"
    "            mbar_init(empty + 8 * s, CWARPS);\n"
    "        }\n"
    "        asm volatile(\"fence.mbarrier_init.release.cluster;\\n\" ::: \"memory\");\n"
    "    }\n"
    "    __syncthreads();\n"
    "    float acc[MT][NT][4];\n"
    "#pragma unroll\n"
    "    for (int j = 0; j < NT; j++) acc[0][j][0] = acc[0][j][1] = acc[0][j][2] = acc[0][j][3] = 0.0f;\n"
    "    if (warp == CWARPS) { /* the producer */\n"
    "        if (lane == 0)\n"
    "#pragma unroll 1\n"
    "            for (int k = 0; k < KT; k++) {\n"
    "                const int b = k % STAGES;\n"
    "                if (k >= STAGES)\n"
    "                    while (!mbar_try(empty + 8 * b, (unsigned)(k / STAGES - 1) & 1u)) {\n"
    "                    }\n"
    "                issue_stage(sbase + b * STAGE_BYTES, full + 8 * b, &tmA, &tmB, (int)m0, n0, kb + k * BK);\n"
    "            }\n"
    "    } else {\n"
    "#pragma unroll 1\n"
    "        for (int kt = 0; kt < KT; kt++) {\n"
    "            const int b = kt % STAGES;\n"
    "            while (!mbar_try(full + 8 * b, (unsigned)(kt / STAGES) & 1u)) {\n"
    "            }\n"
    "            const unsigned as = sbase + b * STAGE_BYTES + (warp >> 2) * (64 * 128),\n"
    "                           bs = sbase + b * STAGE_BYTES + A_BYTES;\n"
    "            wg_fence();\n"
    "#pragma unroll\n"
    "            for (int kk = 0; kk < BK / 16; kk++)\n"
    "                wg_mma(acc[0], wg_desc(as + kk * 32, 16, 1024), wg_desc(bs + kk * 2048, BK * 128, 1024));\n"
    "            wg_commit();\n"
    "            wg_wait1(); /* kt's products may run on; kt - 1's are done */\n"
    "            if (kt > 0 && lane == 0) mbar_arrive(empty + 8 * ((kt - 1) % STAGES));\n"
    "        }\n"
    "        wg_wait0();\n"
    "    }\n"
    "    const int g = lane >> 2, t4 = lane & 3;\n";

/* A LayerNorm inside (codegen_gemm_cuda.h): 16 bytes of C read past L1
 * (other blocks wrote them), element e of such a chunk (LN_VE of C's
 * dtype), a sum over a row's LN_TPR threads. */
static const char ln_helpers[] =
    "__device__ __forceinline__ uint4 ldcg16(const void *p) {\n"
    "    uint4 v;\n"
    "    asm volatile(\"ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];\" : \"=r\"(v.x), \"=r\"(v.y), \"=r\"(v.z), \"=r\"(v.w)\n"
    "                 : \"l\"(p) : \"memory\");\n"
    "    return v;\n"
    "}\n"
    "__device__ __forceinline__ float chunk_at(const uint4 &v, int e) {\n"
    "    const unsigned w = e / (LN_VE / 4) == 0 ? v.x : e / (LN_VE / 4) == 1 ? v.y : e / (LN_VE / 4) == 2 ? v.z : v.w;\n"
    "    if (LN_VE == 4) return __uint_as_float(w);\n"
    "    return h2f((unsigned short)(e % 2 ? w >> 16 : w & 0xffffu));\n"
    "}\n"
    /* the row block's counter: every earlier write of the block (a barrier
     * orders them before this thread's) released to the device, the other
     * blocks' acquired; the old value */
    "__device__ __forceinline__ unsigned arrive(unsigned *c, unsigned wrap) {\n"
    "    unsigned old;\n"
    "    asm volatile(\"atom.acq_rel.gpu.global.inc.u32 %0, [%1], %2;\" : \"=r\"(old) : \"l\"(c), \"r\"(wrap) : \"memory\");\n"
    "    return old;\n"
    "}\n"
    /* a chunk's LN_VE values of gamma or beta (f16 or f32; read-only, not
     * ordered against the stores: the tail issues four chunks' at once),
     * and of Y stored (16 or 32 bytes) */
    "__device__ __forceinline__ void ldv_h(const void *p, int col, float *v) {\n"
    "    const unsigned short *q = (const unsigned short *)p + col;\n"
    "    unsigned w[4] = {0u, 0u, 0u, 0u};\n"
    "    if (LN_VE == 8)\n"
    "        asm volatile(\"ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];\" : \"=r\"(w[0]), \"=r\"(w[1]), \"=r\"(w[2]), \"=r\"(w[3]) : \"l\"(q));\n"
    "    else\n"
    "        asm volatile(\"ld.global.nc.v2.u32 {%0, %1}, [%2];\" : \"=r\"(w[0]), \"=r\"(w[1]) : \"l\"(q));\n"
    "#pragma unroll\n"
    "    for (int e = 0; e < LN_VE; e++) v[e] = h2f((unsigned short)(e % 2 ? w[e / 2] >> 16 : w[e / 2] & 0xffffu));\n"
    "}\n"
    "__device__ __forceinline__ void ldv_f(const void *p, int col, float *v) {\n"
    "    const float *q = (const float *)p + col;\n"
    "#pragma unroll\n"
    "    for (int h = 0; h < LN_VE / 4; h++)\n"
    "        asm volatile(\"ld.global.nc.v4.f32 {%0, %1, %2, %3}, [%4];\" : \"=f\"(v[4 * h]), \"=f\"(v[4 * h + 1]), \"=f\"(v[4 * h + 2]),\n"
    "            \"=f\"(v[4 * h + 3]) : \"l\"(q + 4 * h));\n"
    "}\n"
    "__device__ __forceinline__ void stv_h(void *p, long long i, const float *v) {\n"
    "    unsigned w[4];\n"
    "#pragma unroll\n"
    "    for (int e = 0; e < LN_VE; e += 2) w[e / 2] = (unsigned)f2h(v[e]) | ((unsigned)f2h(v[e + 1]) << 16);\n"
    "    if (LN_VE == 8) *(uint4 *)((unsigned short *)p + i) = make_uint4(w[0], w[1], w[2], w[3]);\n"
    "    else *(uint2 *)((unsigned short *)p + i) = make_uint2(w[0], w[1]);\n"
    "}\n"
    "__device__ __forceinline__ void stv_f(void *p, long long i, const float *v) {\n"
    "#pragma unroll\n"
    "    for (int h = 0; h < LN_VE / 4; h++)\n"
    "        *(float4 *)((float *)p + i + 4 * h) = make_float4(v[4 * h], v[4 * h + 1], v[4 * h + 2], v[4 * h + 3]);\n"
    "}\n"
    "__device__ __forceinline__ float row_sum(float v) {\n"
    "#pragma unroll\n"
    "    for (int o = LN_TPR / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);\n"
    "    return v;\n"
    "}\n";

/* The LayerNorm tail, after every store of the block: the row block's
 * counter elects its last block (the others leave), which normalizes the
 * row block LN_RPP rows at a time, LN_TPR threads a row (adjacent lanes),
 * each LN_CPT chunks of 16 bytes of the row (chunk c * LN_TPR + its index
 * in the row's threads), every load of a pass issued before the sums.
 * LDG, LDB and STY name the chunk loads and store of gamma, beta and Y's
 * dtypes (LDG / LDB absent: 1 and 0). Y may be C's memory (the plan may
 * give the LayerNorm's output the sums' slot): a row's threads read all
 * of it before the sums, which they share, so before any of them stores.
 * On an H100 at 16 rows the election costs 0.7 us and the rest about 5
 * (8.5 when gamma and beta were loaded a pair at a time, each after the
 * previous pair's store): bench/RESULTS.md. */
static const char ln_tail[] =
    "    {\n"
    "        __shared__ unsigned ln_last;\n"
    "        const int sub = tid % LN_TPR;\n"
    "        __syncthreads(); /* this block's C written */\n"
    "        if (tid == 0) {\n"
    "            const unsigned total = gridDim.x * gridDim.z;\n"
    "            ln_last = arrive(cnt + blockIdx.y, total - 1u) == total - 1u;\n"
    "        }\n"
    "        __syncthreads();\n"
    "        if (!ln_last) return;\n"
    "#pragma unroll 1\n"
    "        for (int r0 = 0; r0 < BM; r0 += LN_RPP) {\n"
    "            const long long row = m0 + r0 + tid / LN_TPR;\n"
    "            const bool live = r0 + tid / LN_TPR < BM && row < M;\n"
    "            uint4 x[LN_CPT];\n"
    "#pragma unroll\n"
    "            for (int c = 0; c < LN_CPT; c++)\n"
    "                x[c] = live ? ldcg16(LN_C + row * NN + (c * LN_TPR + sub) * LN_VE) : make_uint4(0u, 0u, 0u, 0u);\n"
    "            float sum = 0.0f;\n"
    "#pragma unroll\n"
    "            for (int c = 0; c < LN_CPT; c++)\n"
    "#pragma unroll\n"
    "                for (int e = 0; e < LN_VE; e++) sum += chunk_at(x[c], e);\n"
    "            float mean = row_sum(sum) / (float)NN, q = 0.0f, sc = 0.0f;\n"
    "#pragma unroll\n"
    "            for (int c = 0; c < LN_CPT; c++)\n"
    "#pragma unroll\n"
    "                for (int e = 0; e < LN_VE; e++) {\n"
    "                    const float d = chunk_at(x[c], e) - mean;\n"
    "                    q += d * d;\n"
    "                    sc += d;\n"
    "                }\n"
    "            q = row_sum(q);\n"
    "            const float cm = row_sum(sc) / (float)NN, var = q / (float)NN - cm * cm;\n"
    "            mean += cm;\n"
    "            const float rstd = 1.0f / sqrtf((var < 0.0f ? 0.0f : var) + LN_EPS);\n"
    "            if (!live) continue;\n"
    "#pragma unroll\n"
    "            for (int c = 0; c < LN_CPT; c++) {\n"
    "                const int col = (c * LN_TPR + sub) * LN_VE;\n"
    "                float g[LN_VE], b[LN_VE], y[LN_VE];\n"
    "#pragma unroll\n"
    "                for (int e = 0; e < LN_VE; e++) g[e] = 1.0f, b[e] = 0.0f;\n"
    "                LDG(lg, col, g);\n"
    "                LDB(lb, col, b);\n"
    "#pragma unroll\n"
    "                for (int e = 0; e < LN_VE; e++) y[e] = (chunk_at(x[c], e) - mean) * rstd * g[e] + b[e];\n"
    "                STY(Y, row * NN + col, y);\n"
    "                if (c % 4 == 3) asm volatile(\"\" ::: \"memory\"); /* (registers: four chunks' loads at a time) */\n"
    "            }\n"
    "        }\n"
    "    }\n";

/* wg_mma: one wgmma.mma_async.m64n<bn>k16 (f32 += f16 x f16, B
 * transposed: N-major) on a warp's NT x 4 accumulators. */
static void put_wg_mma(sj_sbuf *o, int bn) {
    int n = bn / 2;
    put(o, "__device__ __forceinline__ void wg_mma(float (&d)[NT][4], unsigned long long da, unsigned long long db) {\n");
    put(o, "    asm volatile(\"{\\n.reg .pred p;\\nsetp.ne.b32 p, %%%d, 0;\\n\"\n", n + 2);
    put(o, "                 \"wgmma.mma_async.sync.aligned.m64n%dk16.f32.f16.f16 {", bn);
    for (int i = 0; i < n; i++) put(o, "%s%%%d", i ? ", " : "", i);
    put(o, "}, %%%d, %%%d, p, 1, 1, 0, 1;\\n}\\n\"\n                 : ", n, n + 1);
    for (int i = 0; i < n; i++) put(o, "%s\"+f\"(d[%d][%d])", i ? ", " : "", i / 4, i % 4);
    put(o, "\n                 : \"l\"(da), \"l\"(db), \"r\"(1));\n}\n\n");
}

static const char *ld2(sj_dtype dt) { return dt == SJ_F16 ? "ld2_h" : "ld2_f"; }

char *sj_codegen_gemm_cuda(const sj_gemm_spec *s, const char *name, size_t *len) {
    if (sj_gemm_cuda_check(s)) return NULL;
    const sj_gemm_tile *t = &s->tile;
    sj_sbuf o = {0};
    put(&o, "/* generated by shapejit: %s = epilogue(A @ B), f16 x f16 -> f32 on %s;\n", name,
        t->wg ? "wgmma.mma_async (sm_90a)" : "mma.sync m16n8k16");
    put(&o, " * M %s, N %" PRId64 ", K %" PRId64 "; tile %dx%dx%d, %dx%d warps, %d stages; epilogue:%s%s%s -> %s%s */\n",
        s->M > 0 ? "specialized" : "symbolic", s->N, s->K, t->bm, t->bn, t->bk, t->wm, t->wn, t->stages,
        s->bias ? (s->bias_dtype == SJ_F16 ? " bias f16" : " bias f32") : "", s->gelu ? " gelu" : s->relu ? " relu" : "",
        s->residual ? (s->res_dtype == SJ_F16 ? " residual f16" : " residual f32") : "",
        s->out_dtype == SJ_F16 ? "f16" : "f32",
        s->ln ? (s->ln_out_dtype == SJ_F16 ? ", then layer_norm -> f16" : ", then layer_norm -> f32") : "");
    /* a warpgroup tile: WM counts warps (16 rows each), as the epilogue reads it */
    put(&o, "#define BM %d\n#define BN %d\n#define BK %d\n#define WM %d\n#define WN %d\n#define STAGES %d\n", t->bm,
        t->bn, t->bk, t->wg ? 4 * t->wm : t->wm, t->wg ? 1 : t->wn, t->stages);
    put(&o, "#define NN %" PRId64 "LL\n#define KK %" PRId64 "LL\n", s->N, s->K);
    const int sk = splitk_of(t);
    put(&o, "#define SK %d\n#define RS (BN + 4)\n", sk);
    put(&o, "#define CWARPS (WM * WN)\n#define THREADS (CWARPS * 32%s)\n", t->wg ? " + 32" : "");
    put(&o, "#define TM (BM / WM)\n#define TN (BN / WN)\n#define MT (TM / 16)\n"
            "#define NT (TN / 8)\n#define AS (BK + 8)\n#define BS (BN + 8)\n#define A_STAGE (BM * AS)\n"
            "#define B_STAGE (BK * BS)\n#define A_BYTES (BM * 128)\n#define STAGE_BYTES ((BM + BN) * 128)\n\n");
    if (s->ln) {
        /* LN_TPR threads a row (a power of two up to 32), each LN_CPT chunks
         * of 16 bytes in registers (at most 16: 64 registers), LN_RPP rows
         * a pass */
        int ve = s->out_dtype == SJ_F16 ? 8 : 4, chunks = (int)(s->N / ve), tpr = 1;
        while (tpr < 32 && (chunks % (2 * tpr) == 0) && chunks / tpr > 16) tpr *= 2;
        put(&o, "#define LN_VE %d\n#define LN_TPR %d\n#define LN_CPT %d\n#define LN_RPP (THREADS / LN_TPR)\n", ve,
            tpr, chunks / tpr);
        put(&o, "#define LN_EPS %.9ef\n#define LN_C ((const %s *)C)\n#define STY %s\n", s->ln_eps,
            s->out_dtype == SJ_F16 ? "unsigned short" : "float", s->ln_out_dtype == SJ_F16 ? "stv_h" : "stv_f");
        put(&o, "#define LDG(p, i, v) %s\n#define LDB(p, i, v) %s\n\n",
            !s->ln_gamma ? "" : s->ln_g_dtype == SJ_F16 ? "ldv_h(p, i, v)" : "ldv_f(p, i, v)",
            !s->ln_beta ? "" : s->ln_b_dtype == SJ_F16 ? "ldv_h(p, i, v)" : "ldv_f(p, i, v)");
    }
    put(&o, "%s\n%s%s", helpers, sk > 1 ? cluster_helpers : "", s->ln ? ln_helpers : "");
    if (t->wg) {
        put(&o, "%s%s", wg_helpers, wg_tma);
        put_wg_mma(&o, t->bn);
    } else {
        put(&o, "%s", body_head);
    }
    put(&o, "extern \"C\" __global__ void __launch_bounds__(THREADS)%s\n", sk > 1 ? " __cluster_dims__(1, 1, SK)" : "");
    put(&o, "%s(const unsigned short *__restrict__ A, const unsigned short *__restrict__ B,\n", name);
    put(&o, "    const void *__restrict__ bias, const void *__restrict__ R, void *__restrict__ C, long long M_arg%s%s) {\n",
        t->wg ? ",\n    const __grid_constant__ sj_tmap tmA, const __grid_constant__ sj_tmap tmB" : "",
        s->ln ? ",\n    const void *__restrict__ lg, const void *__restrict__ lb, void *Y,\n"
                "    unsigned *__restrict__ cnt"
              : "");
    put(&o, "    grid_dep();\n");
    if (s->M > 0) put(&o, "    const long long M = %" PRId64 "LL;\n    (void)M_arg;\n", s->M);
    else put(&o, "    const long long M = M_arg;\n");
    put(&o, "    (void)bias;\n    (void)R;\n");
    put(&o, "%s", t->wg ? wg_main : body_main);
    if (sk > 1) put(&o, "%s", epi_split);
    else put(&o, "%s%s", s->ln ? epi_direct_head_ln : epi_direct_head, epi_direct);
    if (s->bias) {
        put(&o, "                { float b0, b1; %s(bias, col, b0, b1); v0 += b0; v1 += b1; }\n", ld2(s->bias_dtype));
    }
    static const char rnd[] = "                v0 = h2f(f2h(v0));\n                v1 = h2f(f2h(v1));\n";
    if (s->round_prod) put(&o, "%s", rnd);
    if (s->gelu) put(&o, "                v0 = gelu_erf(v0);\n                v1 = gelu_erf(v1);\n");
    else if (s->relu) put(&o, "                v0 = v0 > 0.0f ? v0 : 0.0f;\n                v1 = v1 > 0.0f ? v1 : 0.0f;\n");
    if ((s->gelu || s->relu) && s->round_act) put(&o, "%s", rnd);
    if (s->residual)
        put(&o, "                { float r0, r1; %s(R, row * NN + col, r0, r1); v0 += r0; v1 += r1; }\n",
            ld2(s->res_dtype));
    if (s->residual && s->round_res) put(&o, "%s", rnd);
    put(&o, "                %s(C, row * NN + col, v0, v1);\n", s->out_dtype == SJ_F16 ? "st2_h" : "st2_f");
    put(&o, "            }\n        }\n");
    if (sk > 1) put(&o, "    cluster_sync(); /* the peers have read this block's partial */\n");
    if (s->ln) put(&o, "%s", ln_tail);
    put(&o, "}\n");
    /* its macros undone, so that units can follow each other in one source */
    put(&o, "#undef BM\n#undef BN\n#undef BK\n#undef WM\n#undef WN\n#undef STAGES\n#undef NN\n#undef KK\n"
            "#undef SK\n#undef RS\n#undef CWARPS\n#undef THREADS\n#undef TM\n#undef TN\n#undef MT\n#undef NT\n"
            "#undef AS\n#undef BS\n#undef A_STAGE\n#undef B_STAGE\n#undef A_BYTES\n#undef STAGE_BYTES\n");
    if (s->ln)
        put(&o, "#undef LN_VE\n#undef LN_TPR\n#undef LN_CPT\n#undef LN_RPP\n#undef LN_EPS\n#undef LN_C\n"
                "#undef STY\n#undef LDG\n#undef LDB\n");
    if (o.oom) {
        free(o.s);
        sj_seterr(SJ_ENOMEM, "gemm: out of memory generating %s", name);
        return NULL;
    }
    if (len) *len = o.len;
    return o.s;
}

/* -- The tuner's record ------------------------------------------------------------- */

size_t sj_gemm_picks_format(const sj_fplan *p, const int8_t *pick, char *buf, size_t size) {
    size_t n = (size_t)snprintf(buf, size, "sjgp2 %d", p->n_groups);
    for (int i = 0; i < p->n_groups * SJ_GEMM_CLASSES && n < size; i++)
        n += (size_t)snprintf(buf + n, size - n, " %d",
                              p->groups[i / SJ_GEMM_CLASSES].gemm_tile >= 0 ? pick[i] : -1);
    if (n < size) n += (size_t)snprintf(buf + n, size - n, "\n");
    return n < size ? n : 0;
}

bool sj_gemm_picks_parse(const sj_fplan *p, const void *data, size_t len, int8_t *pick) {
    char text[4096];
    if (!data || len == 0 || len >= sizeof text || memchr(data, 0, len)) return false;
    memcpy(text, data, len);
    text[len] = 0;
    int groups, used;
    if (sscanf(text, "sjgp2 %d%n", &groups, &used) != 1 || groups != p->n_groups) return false;
    int8_t got[1024];
    if (groups > (int)sizeof got / SJ_GEMM_CLASSES) return false;
    const char *at = text + used;
    for (int i = 0; i < groups * SJ_GEMM_CLASSES; i++) {
        int v;
        if (sscanf(at, " %d%n", &v, &used) != 1) return false;
        at += used;
        const sj_group *G = &p->groups[i / SJ_GEMM_CLASSES];
        if (G->gemm_tile >= 0 ? v < -1 || v >= G->gemm_nv : v != -1) return false;
        got[i] = (int8_t)v;
    }
    while (*at == ' ' || *at == '\n') at++;
    if (*at) return false;
    memcpy(pick, got, (size_t)groups * SJ_GEMM_CLASSES);
    return true;
}
