/* Eager matmul and attention.
 *
 * Floats go through cblas_sgemm. An operand whose last two axes are
 * row-major or column-major with unit stride in one of them (and a leading
 * dimension BLAS accepts) is passed as it is, with the matching transpose
 * flag; anything else, and every f16/bf16 operand, is first packed
 * row-major into f32 scratch. The output is written in place when it is an
 * f32 row- or column-major matrix (column-major: CblasColMajor with the
 * operands' flags swapped), else through f32 scratch.
 *
 * A product given b packed (sj_cpu_matmul_packed: b a constant, packed once
 * when its entry was made; kernels/cpu/prepack.c) runs over the packed
 * panels instead of through sgemm: a in place when it is f32 row-major
 * (else converted as it is packed into tiles), the bias added as the tiles
 * are stored; a row-major f16/bf16 y is written tile by tile from a small
 * f32 block in L1 (mm_store_block), any other non-f32 layout through f32
 * scratch.
 *
 * An epilogue (sj_cpu_matmul_epi: a generated elementwise group over the
 * product's result) runs inside a product whose result is one contiguous
 * M x N matrix: over packed b, per block of rows and panels (prepack.c),
 * over the block of y in place (f32, or f16/bf16 once its tiles are
 * stored); through sgemm, f32 only, per part of a split
 * product right after its sgemm. Any other product (batches of their own,
 * f16/bf16 results through sgemm) runs without it, and says so.
 *
 * Integers are exact: int64 products and sums, wrapping, narrowed on store.
 *
 * A bias (a product with its bias add) is added by each part of a float
 * product to its own block right after its sgemm, while the block is in
 * cache: in place in an f32 result, or in the f32 scratch before an
 * f16/bf16 result is stored.
 *
 * Threads. Given the runtime's kernel pool, a float product big enough to
 * share is split into one block of columns (or of rows, when it has more
 * rows than columns) per thread, each a cblas_sgemm of its own, provided
 * OpenBLAS itself runs single-threaded (the runtime sets that up: see
 * blas_threads in shapejit.h); otherwise OpenBLAS's own threads do the
 * work. A batch of smaller products, and attention's (batch, head) pairs,
 * are shared out a few at a time instead. One pool
 * for everything keeps the machine from being oversubscribed, and its
 * workers never call sched_yield (OpenBLAS's spinning workers do, which
 * hands the core to the idle-priority compiler for whole time slices).
 *
 * Attention per (batch, head), in blocks of QB queries: S = scale * Q K^T
 * (sgemm over the keys any query of the block may see), masked softmax per
 * row (sj_cpu_softmax_row over the row's first `lim` keys, zeros after), then
 * O = P V (sgemm). Key j is visible to query i when j < lengths[b] (clamped
 * to [0, Sk]) and, if causal, j <= i + Sk - Sq; the visible keys are a
 * prefix of length lim(i), and a query with lim(i) <= 0 gives zeros. Keys
 * at or past the block's largest lim are never read.
 *
 * Scratch slots: 0 a / q, 1 b / k (a packed into tiles over packed b:
 * SJ_CPU_PACK_SLOT), 2 y / v, 3 attention scores and output, or the bias
 * in f32.
 */
#include <assert.h>
#include <cblas.h>
#include <limits.h>
#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include "base/error.h"
#include "kernels/cpu/threads.h"
#include "kernels/cpu/cpu_int.h"
#include "kernels/cpu/eager.h"
#include "kernels/cpu/prepack.h"

/* -- Matrices as BLAS sees them ------------------------------------------- */

enum { LAY_NONE, LAY_ROW, LAY_COL };

typedef struct mat {
    const float *p;
    int lay; /* LAY_ROW or LAY_COL */
    int64_t ld;
} mat;

static int64_t max1(int64_t v) { return v > 1 ? v : 1; }

/* Layout of an R x C matrix with element strides (sr, sc): a stride along
 * an axis of size 1 does not matter. */
static int layout(int64_t R, int64_t C, int64_t sr, int64_t sc, int64_t *ld) {
    if ((C <= 1 || sc == 1) && (R <= 1 || sr >= max1(C))) {
        *ld = R <= 1 ? max1(C) : sr;
    } else if ((R <= 1 || sr == 1) && (C <= 1 || sc >= max1(R))) {
        *ld = C <= 1 ? max1(R) : sc;
        return *ld <= INT_MAX ? LAY_COL : LAY_NONE;
    } else {
        return LAY_NONE;
    }
    return *ld <= INT_MAX ? LAY_ROW : LAY_NONE;
}

/* -- f16 and bf16 rows to and from f32 -------------------------------------- *
 * The products read a 16-bit a (and b, where it is not packed) and write a
 * 16-bit y a row at a time, and so does attention (q, k, v and its
 * output). Where the CPU has F16C the contiguous f16 rows convert 8 at a
 * time in hardware (vcvtph2ps exact, vcvtps2ph with round to nearest even:
 * the same values as sj_f16_to_f32 and sj_f32_to_f16; a NaN keeps its
 * payload the same way, a signalling f16 NaN is widened quiet), and with
 * AVX2 the bf16 ones (the same bits as sj_bf16_to_f32 / sj_f32_to_bf16);
 * otherwise, and for strided rows, cpu_load_f32 / cpu_store_f32
 * (test_prepack's test_row_conversions). A block of rows (a product's
 * tile, 16 columns wide; attention's q, k, v and output rows of a head)
 * converts in one call that asks for the CPU's features once: per row,
 * the dispatch cost as much as converting 16 elements, and f16's 2-thread
 * profile of the encoder layer put a third of its products' store time
 * there. */
#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#include <immintrin.h>
__attribute__((target("avx,f16c"))) static inline void f16_load_f16c(float *dst, const uint16_t *src, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
    for (; i < n; i++) dst[i] = sj_f16_to_f32(src[i]);
}
__attribute__((target("avx,f16c"))) static inline void f16_store_f16c(uint16_t *dst, const float *src, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    for (; i < n; i++) dst[i] = sj_f32_to_f16(src[i]);
}
/* bf16 8 at a time with AVX2: widening is a shift; narrowing rounds to
 * nearest even by adding 0x7fff plus the kept lowest bit, and a NaN keeps
 * its top bits made quiet, as sj_f32_to_bf16 does (the compiler does not
 * vectorize that one at the library's baseline -O2). */
__attribute__((target("avx2"))) static inline void bf16_load_avx2(float *dst, const uint16_t *src, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(src + i)));
        _mm256_storeu_si256((__m256i *)(dst + i), _mm256_slli_epi32(h, 16));
    }
    for (; i < n; i++) dst[i] = sj_bf16_to_f32(src[i]);
}
__attribute__((target("avx2"))) static inline void bf16_store_avx2(uint16_t *dst, const float *src, int64_t n) {
    int64_t i = 0;
    const __m256i one = _mm256_set1_epi32(1), half = _mm256_set1_epi32(0x7fff), quiet = _mm256_set1_epi32(0x40);
    const __m256i abs = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
    for (; i + 8 <= n; i += 8) {
        __m256i x = _mm256_loadu_si256((const __m256i *)(src + i)), hi = _mm256_srli_epi32(x, 16);
        __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(x, half), _mm256_and_si256(hi, one)), 16);
        __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, abs), inf);
        r = _mm256_blendv_epi8(r, _mm256_or_si256(hi, quiet), nan);
        __m128i lo16 = _mm256_castsi256_si128(r), hi16 = _mm256_extracti128_si256(r, 1);
        _mm_storeu_si128((__m128i *)(dst + i), _mm_packus_epi32(lo16, hi16)); /* each <= 0xffff */
    }
    for (; i < n; i++) dst[i] = sj_f32_to_bf16(src[i]);
}
/* rows x n, row strides ldd and lds in elements */
__attribute__((target("avx,f16c"))) static void f16_load_block_f16c(float *dst, int64_t ldd, const uint16_t *src,
                                                                   int64_t lds, int64_t rows, int64_t n) {
    for (int64_t r = 0; r < rows; r++) f16_load_f16c(dst + r * ldd, src + r * lds, n);
}
__attribute__((target("avx,f16c"))) static void f16_store_block_f16c(uint16_t *dst, int64_t ldd, const float *src,
                                                                    int64_t lds, int64_t rows, int64_t n) {
    for (int64_t r = 0; r < rows; r++) f16_store_f16c(dst + r * ldd, src + r * lds, n);
}
__attribute__((target("avx2"))) static void bf16_load_block_avx2(float *dst, int64_t ldd, const uint16_t *src,
                                                                 int64_t lds, int64_t rows, int64_t n) {
    for (int64_t r = 0; r < rows; r++) bf16_load_avx2(dst + r * ldd, src + r * lds, n);
}
__attribute__((target("avx2"))) static void bf16_store_block_avx2(uint16_t *dst, int64_t ldd, const float *src,
                                                                  int64_t lds, int64_t rows, int64_t n) {
    for (int64_t r = 0; r < rows; r++) bf16_store_avx2(dst + r * ldd, src + r * lds, n);
}
/* The features, asked once (-1: not yet); the check inline, the asking
 * out of line. */
static _Atomic int avx2_state = -1, f16c_state = -1;
static __attribute__((noinline)) int ask_avx2(void) {
    __builtin_cpu_init();
    int h = __builtin_cpu_supports("avx2");
    atomic_store_explicit(&avx2_state, h, memory_order_relaxed);
    return h;
}
static __attribute__((noinline)) int ask_f16c(void) {
    /* F16C from CPUID leaf 1 (ECX bit 29): clang's __builtin_cpu_supports
     * does not know "f16c"; "avx" says the OS saves the YMM state */
    unsigned a = 0, b = 0, c = 0, d = 0;
    int h = __builtin_cpu_supports("avx") && __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29));
    atomic_store_explicit(&f16c_state, h, memory_order_relaxed);
    return h;
}
static inline int have_avx2(void) {
    int h = atomic_load_explicit(&avx2_state, memory_order_relaxed);
    return h >= 0 ? h : ask_avx2();
}
static inline int have_f16c(void) {
    int h = atomic_load_explicit(&f16c_state, memory_order_relaxed);
    return h >= 0 ? h : ask_f16c();
}
#endif

static void mm_load_row(float *dst, const char *src, sj_dtype dt, int64_t s, int64_t n) {
#if defined(__x86_64__) && defined(__GNUC__)
    if (dt == SJ_F16 && s == 1 && have_f16c()) {
        f16_load_f16c(dst, (const uint16_t *)src, n);
        return;
    }
    if (dt == SJ_BF16 && s == 1 && have_avx2()) {
        bf16_load_avx2(dst, (const uint16_t *)src, n);
        return;
    }
#endif
    cpu_load_f32(dst, src, dt, s, n);
}

static void mm_store_row(char *dst, sj_dtype dt, int64_t s, const float *src, int64_t n) {
#if defined(__x86_64__) && defined(__GNUC__)
    if (dt == SJ_F16 && s == 1 && have_f16c()) {
        f16_store_f16c((uint16_t *)dst, src, n);
        return;
    }
    if (dt == SJ_BF16 && s == 1 && have_avx2()) {
        bf16_store_avx2((uint16_t *)dst, src, n);
        return;
    }
#endif
    cpu_store_f32(dst, dt, s, src, n);
}

/* A product's tile (rows x n sums, row stride lds) into y's rows
 * (sj_cpu_block_store; ldd in elements of dt). */
static void mm_store_block(char *dst, int64_t ldd, sj_dtype dt, const float *src, int64_t lds, int64_t rows,
                           int64_t n) {
#if defined(__x86_64__) && defined(__GNUC__)
    if (dt == SJ_F16 && have_f16c()) {
        f16_store_block_f16c((uint16_t *)dst, ldd, src, lds, rows, n);
        return;
    }
    if (dt == SJ_BF16 && have_avx2()) {
        bf16_store_block_avx2((uint16_t *)dst, ldd, src, lds, rows, n);
        return;
    }
#endif
    int64_t es = (int64_t)cpu_dtype_size(dt);
    for (int64_t r = 0; r < rows; r++) cpu_store_f32(dst + r * ldd * es, dt, 1, src + r * lds, n);
}

/* rows x n elements of dt (row stride lds, element stride s, in elements)
 * into f32 rows of stride ldd. */
static void mm_load_block(float *dst, int64_t ldd, const char *src, sj_dtype dt, int64_t lds, int64_t s,
                          int64_t rows, int64_t n) {
#if defined(__x86_64__) && defined(__GNUC__)
    if (dt == SJ_F16 && s == 1 && have_f16c()) {
        f16_load_block_f16c(dst, ldd, (const uint16_t *)src, lds, rows, n);
        return;
    }
    if (dt == SJ_BF16 && s == 1 && have_avx2()) {
        bf16_load_block_avx2(dst, ldd, (const uint16_t *)src, lds, rows, n);
        return;
    }
#endif
    int64_t es = (int64_t)cpu_dtype_size(dt);
    for (int64_t r = 0; r < rows; r++) cpu_load_f32(dst + r * ldd, src + r * lds * es, dt, s, n);
}

void sj_cpu_load_row(float *dst, const void *src, sj_dtype dt, int64_t n) { mm_load_row(dst, src, dt, 1, n); }
void sj_cpu_store_row(void *dst, sj_dtype dt, const float *src, int64_t n) { mm_store_row(dst, dt, 1, src, n); }

/* The R x C matrix at src as a mat: in place when BLAS can read it, else
 * packed row-major into scratch `slot`. *packed remembers the last source
 * packed into the slot, so a batch-broadcast operand is packed once. */
static sj_status mat_prep(mat *m, const char *src, sj_dtype dt, int64_t R, int64_t C, int64_t sr,
                          int64_t sc, int slot, const char **packed) {
    int64_t ld;
    int lay = layout(R, C, sr, sc, &ld);
    if (dt == SJ_F32 && lay != LAY_NONE) {
        *m = (mat){(const float *)src, lay, ld};
        return SJ_OK;
    }
    float *buf = sj_cpu_scratch(slot, (size_t)(R * C) * sizeof(float));
    if (!buf)
        return sj_seterr(SJ_ENOMEM, "matmul: out of memory packing a %lld x %lld operand",
                         (long long)R, (long long)C);
    if (*packed != src) {
        mm_load_block(buf, C, src, dt, sr, sc, R, C);
        *packed = src;
    }
    *m = (mat){buf, LAY_ROW, max1(C)};
    return SJ_OK;
}

/* y (M x N, layout ylay, leading dimension ldy) = alpha * a (M x K) b (K x N)
 * (+ bias[j] on column j when bias is not NULL, while the block is in
 * cache). */
static void gemm1(int64_t M, int64_t N, int64_t K, float alpha, const mat *a, const mat *b, float *y,
                  int ylay, int64_t ldy, const float *bias) {
    assert(M <= INT_MAX && N <= INT_MAX && K <= INT_MAX && M > 0 && N > 0);
    if (K == 0) {
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) y[ylay == LAY_ROW ? i * ldy + j : j * ldy + i] = 0.0f;
    } else {
        cblas_sgemm(ylay == LAY_ROW ? CblasRowMajor : CblasColMajor,
                    a->lay == ylay ? CblasNoTrans : CblasTrans,
                    b->lay == ylay ? CblasNoTrans : CblasTrans, (int)M, (int)N, (int)K, alpha, a->p,
                    (int)a->ld, b->p, (int)b->ld, 0.0f, y, (int)ldy);
    }
    if (!bias)
        return;
    if (ylay == LAY_ROW)
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) y[i * ldy + j] += bias[j];
    else
        for (int64_t j = 0; j < N; j++)
            for (int64_t i = 0; i < M; i++) y[j * ldy + i] += bias[j];
}

/* A view of m starting at row r0 and column c0. */
static mat mat_at(const mat *m, int64_t r0, int64_t c0) {
    mat v = *m;
    v.p += m->lay == LAY_ROW ? r0 * m->ld + c0 : c0 * m->ld + r0;
    return v;
}

/* Each thread taking part in a product, a batch of products or attention
 * gets at least the pool's minimum of multiply-adds (sj_threads_min_work,
 * the runtime's exec_min_work): below it, waking a worker costs about what
 * it saves, and work with less than twice that runs on the calling thread.
 * Batches and attention pairs are claimed in chunks of at least
 * CHUNK_MIN_MACS. */
#define CHUNK_MIN_MACS (INT64_C(1) << 18)
/* Blocks of a split product are multiples of this many columns (or rows). */
#define SPLIT_ALIGN 16

typedef struct gemm_job {
    int64_t M, N, K, blk; /* blk: columns (or rows) per part */
    int by_rows;
    float alpha;
    mat a, b;
    float *y;
    int ylay;
    int64_t ldy;
    const float *bias;
    const sj_cpu_epilogue *epi; /* NULL, or over y (row-major, ldy == N) */
} gemm_job;

/* The epilogue over rows [r0, r1) and columns [c0, c1) of an M x N result. */
static void epi_block(const sj_cpu_epilogue *e, int64_t N, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
    if (c0 == 0 && c1 == N) {
        e->fn(e->p, e->s, r0 * N, r1 * N);
        return;
    }
    for (int64_t r = r0; r < r1; r++) e->fn(e->p, e->s, r * N + c0, r * N + c1);
}

/* Parts [begin, end) of a split product, as one sgemm. */
static void gemm_parts(void *ctx, int64_t begin, int64_t end) {
    const gemm_job *g = ctx;
    int64_t lim = g->by_rows ? g->M : g->N;
    int64_t lo = begin * g->blk, hi = end * g->blk < lim ? end * g->blk : lim;
    mat ys = {g->y, g->ylay, g->ldy};
    if (g->by_rows) {
        mat a = mat_at(&g->a, lo, 0);
        gemm1(hi - lo, g->N, g->K, g->alpha, &a, &g->b, (float *)mat_at(&ys, lo, 0).p, g->ylay, g->ldy, g->bias);
        if (g->epi) epi_block(g->epi, g->N, lo, hi, 0, g->N);
    } else {
        mat b = mat_at(&g->b, 0, lo);
        gemm1(g->M, hi - lo, g->K, g->alpha, &g->a, &b, (float *)mat_at(&ys, 0, lo).p, g->ylay, g->ldy,
              g->bias ? g->bias + lo : NULL);
        if (g->epi) epi_block(g->epi, g->N, 0, g->M, lo, hi);
    }
}

static _Atomic uint64_t splits, epilogues;

uint64_t sj_cpu_fused_epilogues(void) { return atomic_load_explicit(&epilogues, memory_order_relaxed); }

void sj_cpu_blas_threads(int n) { openblas_set_num_threads(n); }

uint64_t sj_cpu_split_count(void) { return atomic_load_explicit(&splits, memory_order_relaxed); }

/* May products be split over pool? Only when OpenBLAS has no threads of its
 * own to run them on. */
static int split_ok(sj_threads *pool) {
    return pool && sj_threads_count(pool) > 1 && openblas_get_num_threads() == 1;
}

/* gemm1, split over pool's threads when it is worth it (each part adds
 * its own columns' bias, then runs epi, when given, over its block). */
static void gemm(sj_threads *pool, int64_t M, int64_t N, int64_t K, float alpha, const mat *a, const mat *b,
                 float *y, int ylay, int64_t ldy, const float *bias, const sj_cpu_epilogue *epi) {
    assert(!epi || (ylay == LAY_ROW && ldy == N));
    gemm_job g = {.M = M, .N = N, .K = K, .by_rows = M > N, .alpha = alpha, .a = *a, .b = *b,
                  .y = y, .ylay = ylay, .ldy = ldy, .bias = bias, .epi = epi};
    int64_t dim = g.by_rows ? M : N, parts = 1, w = sj_threads_min_work(pool);
    if (K > 0 && M * N * K >= 2 * w && split_ok(pool)) {
        parts = sj_threads_count(pool);
        if (parts > M * N * K / w) parts = M * N * K / w;
        int64_t most = (dim + SPLIT_ALIGN - 1) / SPLIT_ALIGN;
        if (parts > most) parts = most;
    }
    if (parts <= 1) {
        gemm1(M, N, K, alpha, a, b, y, ylay, ldy, bias);
        if (epi) epi_block(epi, N, 0, M, 0, N);
        return;
    }
    g.blk = (dim + parts - 1) / parts;
    g.blk = (g.blk + SPLIT_ALIGN - 1) / SPLIT_ALIGN * SPLIT_ALIGN;
    atomic_fetch_add_explicit(&splits, 1, memory_order_relaxed);
    sj_threads_parallel_for(pool, (dim + g.blk - 1) / g.blk, 1, gemm_parts, &g);
}

/* -- Matmul --------------------------------------------------------------- */

typedef struct mm {
    sj_threads *pool;
    sj_dtype dt;
    int64_t M, N, K, es;
    int64_t sam, sak, sbk, sbn, sym, syn;
    const char *apacked, *bpacked; /* see mat_prep */
    const sj_tensor *bias;         /* NULL, or [N] of dt */
    const sj_cpu_packed *pb;       /* NULL, or b packed (prepack.h) */
    const sj_cpu_epilogue *epi;    /* NULL, or to run inside the product where it can */
    int fused;                     /* out: epi ran */
} mm;

/* The bias in f32 (scratch slot 3); NULL when there is none or no memory. */
static const float *bias_f32(const mm *m, int *oom) {
    if (!m->bias)
        return NULL;
    float *f = sj_cpu_scratch(3, (size_t)m->N * sizeof(float));
    if (!f) {
        *oom = 1;
        return NULL;
    }
    cpu_load_f32(f, m->bias->data, m->dt, m->bias->stride[0], m->N);
    return f;
}

/* A result over packed b that is not row-major (f32 or f16/bf16: a
 * row-major f16/bf16 one is stored tile by tile, mm_store_block) is stored
 * by the product itself, as an epilogue over its f32 scratch: each block of
 * rows and panels is
 * converted into y by the thread that finished it, while the block is in
 * cache (no pass of its own on the calling thread), and the caller's
 * epilogue, when y is one contiguous M x N matrix, runs right after over
 * the same block of y. */
typedef struct mm_store_epi {
    const float *yb; /* M x N, row stride N */
    char *y;
    sj_dtype dt;
    int64_t N, sym, syn, es;
    const sj_cpu_epilogue *then; /* NULL, or over y */
} mm_store_epi;

static void mm_store_items(void *const *p, const int64_t *s, int64_t begin, int64_t end) {
    (void)s;
    const mm_store_epi *e = (const mm_store_epi *)(const void *)p;
    for (int64_t i = begin; i < end;) {
        int64_t r = i / e->N, c = i % e->N, n = e->N - c < end - i ? e->N - c : end - i;
        mm_store_row(e->y + (r * e->sym + c * e->syn) * e->es, e->dt, e->syn, e->yb + i, n);
        i += n;
    }
    if (e->then) e->then->fn(e->then->p, e->then->s, begin, end);
}

/* The product over b's packed copy: a read in place when it is f32
 * row-major, else converted row by row as the product packs it into tiles
 * (sj_cpu_packed_gemm_rows); y written in place when it is f32 row-major,
 * tile by tile when it is f16/bf16 row-major (sj_cpu_packed_gemm_rows_to),
 * else through scratch slot 2 (mm_store_items). */
static sj_status mm_packed(mm *m, const char *a, char *y) {
    int64_t lda, ldy;
    int arow = m->dt == SJ_F32 && layout(m->M, m->K, m->sam, m->sak, &lda) == LAY_ROW;
    int oom = 0;
    const float *bias = bias_f32(m, &oom);
    if (oom)
        return sj_seterr(SJ_ENOMEM, "matmul: out of memory for a %lld-element bias", (long long)m->N);
    int ylay = layout(m->M, m->N, m->sym, m->syn, &ldy);
    if (ylay == LAY_ROW) {
        const sj_cpu_epilogue *epi = m->epi && ldy == m->N ? m->epi : NULL;
        m->fused = epi != NULL;
        if (m->dt != SJ_F32) /* a converted as it is packed, y tile by tile from L1 */
            return sj_cpu_packed_gemm_rows_to(m->M, a, m->dt, m->sam, m->sak, mm_load_row, m->pb, bias, y, ldy,
                                              mm_store_block, m->pool, epi);
        return arow ? sj_cpu_packed_gemm_epi(m->M, (const float *)a, lda, m->pb, bias, (float *)y, ldy, m->pool, epi)
                    : sj_cpu_packed_gemm_rows(m->M, a, m->dt, m->sam, m->sak, mm_load_row, m->pb, bias, (float *)y,
                                              ldy, m->pool, epi);
    }
    float *yb = sj_cpu_scratch(2, (size_t)(m->M * m->N) * sizeof(float));
    if (!yb)
        return sj_seterr(SJ_ENOMEM, "matmul: out of memory for a %lld x %lld result", (long long)m->M,
                         (long long)m->N);
    mm_store_epi se = {.yb = yb, .y = y, .dt = m->dt, .N = m->N, .sym = m->sym, .syn = m->syn, .es = m->es,
                       .then = m->dt != SJ_F32 && m->epi && ylay == LAY_ROW && ldy == m->N ? m->epi : NULL};
    sj_cpu_epilogue store = {mm_store_items, (void *const *)(void *)&se, NULL};
    m->fused = se.then != NULL;
    return arow ? sj_cpu_packed_gemm_epi(m->M, (const float *)a, lda, m->pb, bias, yb, m->N, m->pool, &store)
                : sj_cpu_packed_gemm_rows(m->M, a, m->dt, m->sam, m->sak, mm_load_row, m->pb, bias, yb, m->N,
                                          m->pool, &store);
}

static sj_status mm_float(mm *m, const char *a, const char *b, char *y) {
    if (m->pb) return mm_packed(m, a, y);
    mat ma, mb;
    int64_t ldy;
    sj_status st = mat_prep(&ma, a, m->dt, m->M, m->K, m->sam, m->sak, 0, &m->apacked);
    if (!st)
        st = mat_prep(&mb, b, m->dt, m->K, m->N, m->sbk, m->sbn, 1, &m->bpacked);
    if (st)
        return st;
    int oom = 0;
    const float *bias = bias_f32(m, &oom);
    if (oom)
        return sj_seterr(SJ_ENOMEM, "matmul: out of memory for a %lld-element bias", (long long)m->N);
    int ylay = layout(m->M, m->N, m->sym, m->syn, &ldy);
    if (m->dt == SJ_F32 && ylay != LAY_NONE) {
        const sj_cpu_epilogue *epi = m->epi && ylay == LAY_ROW && ldy == m->N ? m->epi : NULL;
        m->fused = epi != NULL;
        gemm(m->pool, m->M, m->N, m->K, 1.0f, &ma, &mb, (float *)y, ylay, ldy, bias, epi);
        return SJ_OK;
    }
    float *yb = sj_cpu_scratch(2, (size_t)(m->M * m->N) * sizeof(float));
    if (!yb)
        return sj_seterr(SJ_ENOMEM, "matmul: out of memory for a %lld x %lld result",
                         (long long)m->M, (long long)m->N);
    gemm(m->pool, m->M, m->N, m->K, 1.0f, &ma, &mb, yb, LAY_ROW, m->N, bias, NULL);
    for (int64_t i = 0; i < m->M; i++)
        mm_store_row(y + i * m->sym * m->es, m->dt, m->syn, yb + i * m->N, m->N);
    return SJ_OK;
}

/* Exact integer product: b unpacked to int64 once per distinct b, rows of
 * a one at a time, accumulated in uint64 (wrapping). */
static sj_status mm_int(mm *m, const char *a, const char *b, char *y) {
    int64_t M = m->M, N = m->N, K = m->K, es = m->es;
    uint64_t *bb = sj_cpu_scratch(1, (size_t)(K * N) * 8);
    int64_t *ab = sj_cpu_scratch(0, (size_t)K * 8);
    uint64_t *acc = sj_cpu_scratch(2, (size_t)N * 8);
    if (!bb || !ab || !acc)
        return sj_seterr(SJ_ENOMEM, "matmul: out of memory for an integer %lld x %lld x %lld",
                         (long long)M, (long long)K, (long long)N);
    if (m->bpacked != b) {
        for (int64_t k = 0; k < K; k++)
            cpu_load_i64((int64_t *)bb + k * N, b + k * m->sbk * es, m->dt, m->sbn, N);
        m->bpacked = b;
    }
    for (int64_t i = 0; i < M; i++) {
        cpu_load_i64(ab, a + i * m->sam * es, m->dt, m->sak, K);
        memset(acc, 0, (size_t)N * 8);
        for (int64_t k = 0; k < K; k++) {
            uint64_t av = (uint64_t)ab[k];
            const uint64_t *brow = bb + k * N;
            for (int64_t j = 0; j < N; j++) acc[j] += av * brow[j];
        }
        cpu_store_i64(y + i * m->sym * es, m->dt, m->syn, (const int64_t *)acc, N);
    }
    return SJ_OK;
}

/* Batch i of a plan over (y, a, b) (rows of the plan times its last axis);
 * it must be at i's row of the plan, and is moved on after a row's last
 * batch. */
static sj_status mm_batch(mm *m, const cpu_plan *p, cpu_iter *it, int64_t i) {
    int last = p->rank - 1;
    int64_t e = i % p->shape[last];
    char *yp = cpu_iter_ptr(p, it, 0) + e * p->stride[0][last] * m->es;
    const char *ap = cpu_iter_ptr(p, it, 1) + e * p->stride[1][last] * m->es;
    const char *bp = cpu_iter_ptr(p, it, 2) + e * p->stride[2][last] * m->es;
    sj_status st = cpu_is_float(m->dt) ? mm_float(m, ap, bp, yp) : mm_int(m, ap, bp, yp);
    if (e == p->shape[last] - 1)
        cpu_iter_next(p, it);
    return st;
}

typedef struct mm_batches {
    mm m;
    const cpu_plan *p;
    int64_t n; /* batches */
    _Atomic int failed;
} mm_batches;

/* Batches [begin, end), with this thread's own packing state. */
static void mm_range(void *ctx, int64_t begin, int64_t end) {
    mm_batches *j = ctx;
    mm m = j->m;
    m.apacked = m.bpacked = NULL;
    cpu_iter it;
    cpu_iter_seek(j->p, &it, begin / j->p->shape[j->p->rank - 1]);
    for (int64_t i = begin; i < end; i++)
        if (mm_batch(&m, j->p, &it, i)) {
            atomic_store(&j->failed, 1);
            return;
        }
}

/* y with the last `k` axes given size 1 (so a plan skips them). */
static sj_tensor lead_axes(const sj_tensor *t, int k) {
    sj_tensor v = *t;
    for (int i = t->rank - k; i < t->rank; i++) v.shape[i] = 1;
    return v;
}

sj_status sj_cpu_matmul(const sj_tensor *a, const sj_tensor *b, const sj_tensor *y, sj_threads *pool) {
    return sj_cpu_matmul_bias(a, b, NULL, y, pool);
}

sj_status sj_cpu_matmul_bias(const sj_tensor *a, const sj_tensor *b, const sj_tensor *bias, const sj_tensor *y,
                             sj_threads *pool) {
    return sj_cpu_matmul_packed(a, b, NULL, bias, y, pool);
}

sj_status sj_cpu_matmul_packed(const sj_tensor *a, const sj_tensor *b, const sj_cpu_packed *pb, const sj_tensor *bias,
                               const sj_tensor *y, sj_threads *pool) {
    return sj_cpu_matmul_epi(a, b, pb, bias, y, pool, NULL, NULL);
}

sj_status sj_cpu_matmul_epi(const sj_tensor *a, const sj_tensor *b, const sj_cpu_packed *pb, const sj_tensor *bias,
                            const sj_tensor *y, sj_threads *pool, const sj_cpu_epilogue *epi, int *fused) {
    int dummy;
    if (!fused) fused = &dummy;
    *fused = 0;
    int r = y->rank;
    assert(r >= 2 && a->rank == r && b->rank == r);
    assert(a->dtype == y->dtype && b->dtype == y->dtype && y->dtype != SJ_BOOL);
    assert(!bias || (cpu_is_float(y->dtype) && bias->dtype == y->dtype && bias->rank == 1 &&
                     bias->shape[0] == y->shape[r - 1]));
    mm m = {.pool = pool, .dt = y->dtype, .M = y->shape[r - 2], .N = y->shape[r - 1], .K = a->shape[r - 1],
            .bias = bias, .pb = cpu_is_float(y->dtype) ? pb : NULL};
    assert(a->shape[r - 2] == m.M && b->shape[r - 2] == m.K && b->shape[r - 1] == m.N);
    assert(!m.pb || (sj_cpu_packed_rows(pb) == m.K && sj_cpu_packed_cols(pb) == m.N));
    for (int i = 0; i < r - 2; i++)
        assert(a->shape[i] == y->shape[i] && b->shape[i] == y->shape[i]);
    m.es = (int64_t)cpu_dtype_size(m.dt);
    m.sam = a->stride[r - 2], m.sak = a->stride[r - 1];
    m.sbk = b->stride[r - 2], m.sbn = b->stride[r - 1];
    m.sym = y->stride[r - 2], m.syn = y->stride[r - 1];

    /* batches: a plan over the leading axes of (y, a, b) */
    sj_tensor yb = lead_axes(y, 2), ab = lead_axes(a, 2), bb = lead_axes(b, 2);
    const sj_tensor *ts[3] = {&yb, &ab, &bb};
    cpu_plan p;
    if (m.M == 0 || m.N == 0 || cpu_plan_init(&p, 3, ts) == 0)
        return SJ_OK;

    /* b shared by every batch, and the batch and M axes of a and y
     * collapse into one: a single product with M' = batch * M */
    int shared = 1;
    for (int d = 0; d < p.rank; d++) shared &= p.stride[2][d] == 0;
    if (shared && p.shape[0] > 1) {
        sj_tensor y2 = lead_axes(y, 1), a2 = lead_axes(a, 1);
        const sj_tensor *ts2[2] = {&y2, &a2};
        cpu_plan p2;
        if (cpu_plan_init(&p2, 2, ts2) > 0 && p2.rank == 1) {
            m.M = p2.shape[0], m.sym = p2.stride[0][0], m.sam = p2.stride[1][0];
            if (!cpu_is_float(m.dt)) return mm_int(&m, a->data, b->data, y->data);
            m.epi = epi;
            sj_status st = mm_float(&m, a->data, b->data, y->data);
            *fused = m.fused;
            if (m.fused) atomic_fetch_add_explicit(&epilogues, 1, memory_order_relaxed);
            return st;
        }
    }
    /* one product: the epilogue may run inside it */
    if (epi && cpu_is_float(m.dt) && cpu_plan_rows(&p) * p.shape[p.rank - 1] == 1) {
        m.epi = epi;
        sj_status st = mm_float(&m, p.base[1], p.base[2], p.base[0]);
        *fused = m.fused;
        if (m.fused) atomic_fetch_add_explicit(&epilogues, 1, memory_order_relaxed);
        return st;
    }

    /* one product per batch; small ones shared out over the pool a few
     * batches at a time (a big one splits itself in gemm) */
    mm_batches j = {.m = m, .p = &p, .n = cpu_plan_rows(&p) * p.shape[p.rank - 1]};
    atomic_init(&j.failed, 0);
    int64_t macs = m.M * m.N * (m.K > 0 ? m.K : 1);
    int64_t min_batches = (CHUNK_MIN_MACS + macs - 1) / macs, thread_batches = sj_threads_items(pool, macs);
    if (macs < 2 * sj_threads_min_work(pool) && j.n >= 2 * thread_batches && split_ok(pool)) {
        atomic_fetch_add_explicit(&splits, 1, memory_order_relaxed);
        j.m.pool = NULL;
        sj_threads_split(pool, j.n, min_batches, thread_batches, mm_range, &j);
    } else {
        mm_range(&j, 0, j.n);
    }
    if (atomic_load(&j.failed)) /* scratch memory: the one way a product fails */
        return sj_seterr(SJ_ENOMEM, "matmul: out of memory for %lld x %lld x %lld products",
                         (long long)m.M, (long long)m.K, (long long)m.N);
    return SJ_OK;
}

/* -- Attention ------------------------------------------------------------ */

#define QB 64

static mat mat_t(const mat *m) {
    mat v = *m;
    v.lay = m->lay == LAY_ROW ? LAY_COL : LAY_ROW;
    return v;
}

typedef struct att {
    sj_dtype dt;
    int64_t Sq, Sk, D, Dv, es;
    float scale;
    int causal;
    const sj_tensor *y;
    const sj_tensor *mask; /* NULL, or [B, H, Sq, Sk] (broadcast) */
    const char *mp;        /* the mask of this (batch, head) */
    float *s, *o; /* QB x Sk scores, QB x Dv output */
} att;

/* Add query i's mask row to its lim scaled scores (bool: false -> -inf). */
static void att_mask_row(const att *t, int64_t i, float *srow, int64_t lim) {
    const sj_tensor *m = t->mask;
    const char *row = t->mp + (size_t)(i * m->stride[2]) * cpu_dtype_size(m->dtype);
    int64_t sj = m->stride[3];
    if (m->dtype == SJ_BOOL) {
        for (int64_t j = 0; j < lim; j++)
            if (!((const uint8_t *)row)[j * sj]) srow[j] = -INFINITY;
    } else {
        for (int64_t j = 0; j < lim; j++) srow[j] += cpu_ld_f32(row, m->dtype, j * sj);
    }
}

/* Keys visible to query i: a prefix of length lim (may be <= 0). */
static int64_t att_lim(const att *t, int64_t L, int64_t i) {
    int64_t lim = L;
    if (t->causal && i + t->Sk - t->Sq + 1 < lim)
        lim = i + t->Sk - t->Sq + 1;
    return lim;
}

static void att_head(const att *t, const mat *q, const mat *k, const mat *v, int64_t L,
                     char *ybase) {
    const sj_tensor *y = t->y;
    for (int64_t i0 = 0; i0 < t->Sq; i0 += QB) {
        int64_t rows = t->Sq - i0 < QB ? t->Sq - i0 : QB;
        int64_t kmax = att_lim(t, L, i0 + rows - 1);
        if (kmax <= 0) {
            memset(t->o, 0, (size_t)(rows * t->Dv) * sizeof(float));
        } else {
            mat qb = mat_at(q, i0, 0), kt = mat_t(k);
            gemm1(rows, kmax, t->D, t->scale, &qb, &kt, t->s, LAY_ROW, kmax, NULL);
            for (int64_t r = 0; r < rows; r++) {
                int64_t lim = att_lim(t, L, i0 + r);
                float *srow = t->s + r * kmax;
                lim = lim < 0 ? 0 : lim;
                if (t->mask) att_mask_row(t, i0 + r, srow, lim);
                sj_cpu_softmax_row(srow, lim);
                memset(srow + lim, 0, (size_t)(kmax - lim) * sizeof(float));
            }
            mat pm = {t->s, LAY_ROW, kmax};
            gemm1(rows, t->Dv, kmax, 1.0f, &pm, v, t->o, LAY_ROW, t->Dv, NULL);
        }
        if (y->stride[3] == 1 || t->Dv <= 1)
            mm_store_block(ybase + i0 * y->stride[2] * t->es, y->stride[2], t->dt, t->o, t->Dv, rows, t->Dv);
        else
            for (int64_t r = 0; r < rows; r++)
                mm_store_row(ybase + (i0 + r) * y->stride[2] * t->es, t->dt, y->stride[3],
                             t->o + r * t->Dv, t->Dv);
    }
}

/* One thread's share of the (batch, head) pairs: its own scratch for
 * scores and packed operands. */
typedef struct att_job {
    att t;
    const sj_tensor *q, *k, *v, *lengths;
    int64_t H;
    _Atomic int failed;
} att_job;

static void att_heads(void *ctx, int64_t begin, int64_t end) {
    att_job *j = ctx;
    att t = j->t;
    const sj_tensor *q = j->q, *k = j->k, *v = j->v;
    int64_t qb = t.Sk > 0 ? QB : 1;
    t.s = sj_cpu_scratch(3, (size_t)(qb * t.Sk + QB * t.Dv) * sizeof(float));
    if (!t.s) {
        atomic_store(&j->failed, 1);
        return;
    }
    t.o = t.s + qb * t.Sk;
    for (int64_t bh = begin; bh < end; bh++) {
        int64_t b = bh / j->H, h = bh % j->H, L = t.Sk;
        if (j->lengths) {
            L = cpu_ld_i64(j->lengths->data, j->lengths->dtype, b * j->lengths->stride[0]);
            L = L < 0 ? 0 : L > t.Sk ? t.Sk : L;
        }
        const char *qp = (const char *)q->data + (b * q->stride[0] + h * q->stride[1]) * t.es;
        const char *kp = (const char *)k->data + (b * k->stride[0] + h * k->stride[1]) * t.es;
        const char *vp = (const char *)v->data + (b * v->stride[0] + h * v->stride[1]) * t.es;
        char *yp = (char *)t.y->data + (b * t.y->stride[0] + h * t.y->stride[1]) * t.es;
        if (t.mask)
            t.mp = (const char *)t.mask->data +
                   (size_t)(b * t.mask->stride[0] + h * t.mask->stride[1]) * cpu_dtype_size(t.mask->dtype);
        const char *pq = NULL, *pk = NULL, *pv = NULL;
        mat mq, mk, mv;
        if (mat_prep(&mq, qp, t.dt, t.Sq, t.D, q->stride[2], q->stride[3], 0, &pq) ||
            mat_prep(&mk, kp, t.dt, t.Sk, t.D, k->stride[2], k->stride[3], 1, &pk) ||
            mat_prep(&mv, vp, t.dt, t.Sk, t.Dv, v->stride[2], v->stride[3], 2, &pv)) {
            atomic_store(&j->failed, 1);
            return;
        }
        att_head(&t, &mq, &mk, &mv, L, yp);
    }
}

sj_status sj_cpu_attention(const sj_tensor *q, const sj_tensor *k, const sj_tensor *v,
                           const sj_tensor *lengths, double scale, int causal, const sj_tensor *y,
                           sj_threads *pool) {
    return sj_cpu_attention_mask(q, k, v, lengths, NULL, scale, causal, y, pool);
}

sj_status sj_cpu_attention_mask(const sj_tensor *q, const sj_tensor *k, const sj_tensor *v,
                                const sj_tensor *lengths, const sj_tensor *mask, double scale, int causal,
                                const sj_tensor *y, sj_threads *pool) {
    assert(q->rank == 4 && k->rank == 4 && v->rank == 4 && y->rank == 4);
    assert(cpu_is_float(q->dtype) && k->dtype == q->dtype && v->dtype == q->dtype &&
           y->dtype == q->dtype);
    int64_t B = q->shape[0], H = q->shape[1];
    att_job j = {.t = {.dt = q->dtype,
                       .Sq = q->shape[2],
                       .Sk = k->shape[2],
                       .D = q->shape[3],
                       .Dv = v->shape[3],
                       .scale = (float)scale,
                       .causal = causal,
                       .y = y,
                       .mask = mask},
                 .q = q, .k = k, .v = v, .lengths = lengths, .H = H};
    const att *t = &j.t;
    assert(k->shape[0] == B && k->shape[1] == H && k->shape[3] == t->D);
    assert(v->shape[0] == B && v->shape[1] == H && v->shape[2] == t->Sk);
    assert(y->shape[0] == B && y->shape[1] == H && y->shape[2] == t->Sq && y->shape[3] == t->Dv);
    assert(!mask || (mask->rank == 4 && mask->shape[2] == t->Sq && mask->shape[3] == t->Sk));
    assert(!lengths || (lengths->rank == 1 && lengths->shape[0] == B &&
                        (lengths->dtype == SJ_I32 || lengths->dtype == SJ_I64)));
    if (B == 0 || H == 0 || t->Sq == 0 || t->Dv == 0)
        return SJ_OK;
    j.t.es = (int64_t)cpu_dtype_size(t->dt);
    atomic_init(&j.failed, 0);
    /* pairs per part: enough multiply-adds to be worth a worker */
    int64_t macs = t->Sq * (t->Sk > 0 ? t->Sk : 1) * (t->D + t->Dv);
    int64_t min_pairs = macs >= CHUNK_MIN_MACS ? 1 : (CHUNK_MIN_MACS + macs - 1) / (macs > 0 ? macs : 1);
    int64_t thread_pairs = sj_threads_items(pool, macs);
    if (split_ok(pool) && B * H >= 2 * thread_pairs) {
        atomic_fetch_add_explicit(&splits, 1, memory_order_relaxed);
        sj_threads_split(pool, B * H, min_pairs, thread_pairs, att_heads, &j);
    } else
        att_heads(&j, 0, B * H);
    if (atomic_load(&j.failed))
        return sj_seterr(SJ_ENOMEM, "attention: out of memory for %lld queries x %lld keys",
                         (long long)t->Sq, (long long)t->Sk);
    return SJ_OK;
}
