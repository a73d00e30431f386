/* Packed constant weights and the products over them (see prepack.h).
 *
 * Layout: panel p (columns 16p .. 16p+15 of b) is K rows of 16 floats,
 * panels one after another; columns past N are zeros.
 *
 * Kernels: a is cut into register tiles of at most MR rows, as even as
 * the row count allows (13 rows with MR 12 are 7 + 6, not 12 + 1: every
 * tile reads the whole panel), and packed per call tile by tile, k-major
 * (scratch slot SJ_CPU_PACK_SLOT; a is small where packing b once
 * matters). Each tile keeps its rows x 16 sums in registers over the whole
 * of K (one element of a broadcast per row and k, the panel's row loaded
 * once per k), then adds the bias and stores. AVX-512: up to 28 x 16 in
 * 28 zmm; AVX2+FMA: 6 x 16 in 12 ymm; plain C: 4 x 16 (vectorized by the
 * compiler as far as the baseline allows). Tiles come in blocks of about
 * 256 KiB of a, which stay in L2 while every panel of a chunk streams past
 * them. Products are split over the kernel pool by (block, panel) pairs,
 * and a is packed in parallel too.
 *
 * The sums run over k in order (one FMA per k and column on AVX2/AVX-512,
 * a multiply then an add in plain C), so a product's result does not
 * depend on the thread count or the split.
 *
 * An f16/bf16 result (sj_cpu_packed_gemm_rows_to) is stored tile by tile:
 * the kernel writes the tile's sums into an f32 block on the stack, which
 * the caller's store converts into y at once, while it is in L1.
 *
 * An epilogue (sj_cpu_epilogue) runs per block of tiles over EPI_PANELS
 * panels at a time: the block's rows x those columns (at most about 100
 * KiB) are still in L2 when the generated function reads them back.
 *
 * The kernel is picked once (__builtin_cpu_supports), so one binary runs
 * the best one each machine has; sj_cpu_packed_isa can cap it (tests).
 */
#include "kernels/cpu/prepack.h"

#include <assert.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"
#include "kernels/cpu/cpu_int.h"
#include "kernels/cpu/eager.h"
#include "kernels/cpu/threads.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define PK_X86 1
#endif

#define NR SJ_CPU_PANEL
/* Multiply-adds a chunk of work items has at least (the pool's minimum
 * per thread, sj_threads_min_work, bounds how many threads take part: a
 * product with less than twice that runs on the calling thread). */
#define CHUNK_MIN_MACS (INT64_C(1) << 18)
/* Rows of a per block: about this many bytes. */
#define A_BLOCK_BYTES (256 * 1024)
/* Panels a product with an epilogue finishes (for one block of rows)
 * before it runs the epilogue over them. */
#define EPI_PANELS 8

struct sj_cpu_packed {
    int64_t K, N, panels;
    size_t bytes;
    float *data; /* panels * K * NR, 64-byte aligned */
};

static _Atomic uint64_t packs, products;

uint64_t sj_cpu_pack_count(void) { return atomic_load_explicit(&packs, memory_order_relaxed); }
uint64_t sj_cpu_packed_products(void) { return atomic_load_explicit(&products, memory_order_relaxed); }

/* -- Packing --------------------------------------------------------------- */

sj_status sj_cpu_pack(const sj_tensor *b, sj_cpu_packed **out) {
    *out = NULL;
    int r = b->rank;
    if (r < 2 || b->device != SJ_HOST || !cpu_is_float(b->dtype))
        return sj_seterr(SJ_EINVAL, "pack: a float host matrix is needed (rank %d, dtype %d)", r, (int)b->dtype);
    for (int i = 0; i < r - 2; i++)
        if (b->shape[i] != 1)
            return sj_seterr(SJ_EINVAL, "pack: a single matrix is needed (size %lld at axis %d)",
                             (long long)b->shape[i], i);
    int64_t K = b->shape[r - 2], N = b->shape[r - 1], sk = b->stride[r - 2], sn = b->stride[r - 1];
    sj_cpu_packed *p = sj_calloc(1, sizeof *p);
    if (!p) return sj_seterr(SJ_ENOMEM, "pack: out of memory");
    p->K = K, p->N = N, p->panels = (N + NR - 1) / NR;
    p->bytes = (size_t)(p->panels * (K > 0 ? K : 1) * NR) * sizeof(float);
    p->bytes = p->bytes ? (p->bytes + 63) & ~(size_t)63 : 64;
    p->data = sj_aligned_alloc(64, p->bytes);
    if (!p->data) {
        size_t bytes = p->bytes;
        free(p);
        return sj_seterr(SJ_ENOMEM, "pack: out of memory for a %lld x %lld weight (%zu bytes)", (long long)K,
                         (long long)N, bytes);
    }
    memset(p->data, 0, p->bytes);
    size_t es = cpu_dtype_size(b->dtype);
    for (int64_t q = 0; q < p->panels; q++) {
        int64_t nc = N - q * NR < NR ? N - q * NR : NR;
        float *dst = p->data + q * K * NR;
        for (int64_t k = 0; k < K; k++)
            cpu_load_f32(dst + k * NR, (const char *)b->data + (size_t)(k * sk + q * NR * sn) * es, b->dtype, sn, nc);
    }
    atomic_fetch_add_explicit(&packs, 1, memory_order_relaxed);
    *out = p;
    return SJ_OK;
}

void sj_cpu_packed_free(sj_cpu_packed *p) {
    if (!p) return;
    free(p->data);
    free(p);
}

size_t sj_cpu_packed_bytes(const sj_cpu_packed *p) { return p->bytes + sizeof *p; }
int64_t sj_cpu_packed_rows(const sj_cpu_packed *p) { return p->K; }
int64_t sj_cpu_packed_cols(const sj_cpu_packed *p) { return p->N; }

/* -- Kernels --------------------------------------------------------------- *
 * tile_*(rows, K, ap, b, nc, bias, c, ldc): c[r][j] = sum_k ap[k*rows + r]
 * b[k*16 + j] (+ bias[j]) for r < rows (<= the kernel's MR), j < nc (<= 16):
 * ap a tile of a packed k-major (rows floats per k), b one panel. */

typedef void (*tile_fn)(int rows, int64_t K, const float *ap, const float *b, int64_t nc, const float *bias, float *c,
                        int64_t ldc);

#if defined(__clang__)
#define UNROLL _Pragma("unroll")
#elif defined(__GNUC__)
#define UNROLL _Pragma("GCC unroll 32")
#else
#define UNROLL
#endif
#define INLINE static inline __attribute__((always_inline))

/* The tail of a tile: the first nc of 16 sums of each row, plus the bias. */
INLINE void store_rows(int mr, const float *t, int64_t nc, const float *bias, float *c, int64_t ldc) {
    for (int r = 0; r < mr; r++)
        for (int64_t j = 0; j < nc; j++) c[r * ldc + j] = t[r * NR + j] + (bias ? bias[j] : 0.0f);
}

/* Plain C: 4 x 16. */
#define MR_C 4
INLINE void tile_c_n(const int mr, int64_t K, const float *ap, const float *b, int64_t nc, const float *bias, float *c,
                     int64_t ldc) {
    float acc[MR_C][NR];
    memset(acc, 0, sizeof acc);
    for (int64_t k = 0; k < K; k++) {
        const float *bk = b + k * NR;
        UNROLL for (int r = 0; r < mr; r++) {
            float av = ap[k * mr + r];
            for (int j = 0; j < NR; j++) acc[r][j] += av * bk[j];
        }
    }
    store_rows(mr, &acc[0][0], nc, bias, c, ldc);
}

static void tile_c(int rows, int64_t K, const float *ap, const float *b, int64_t nc, const float *bias, float *c,
                   int64_t ldc) {
    switch (rows) {
    case 4: tile_c_n(4, K, ap, b, nc, bias, c, ldc); break;
    case 3: tile_c_n(3, K, ap, b, nc, bias, c, ldc); break;
    case 2: tile_c_n(2, K, ap, b, nc, bias, c, ldc); break;
    case 1: tile_c_n(1, K, ap, b, nc, bias, c, ldc); break;
    default: assert(0);
    }
}

#ifdef PK_X86
/* AVX2 + FMA: 6 x 16, two ymm a row. */
#define MR_AVX2 6
#define T_AVX2 __attribute__((target("avx2,fma")))
INLINE T_AVX2 void tile_avx2_n(const int mr, int64_t K, const float *ap, const float *b, int64_t nc,
                               const float *bias, float *c, int64_t ldc) {
    __m256 lo[MR_AVX2], hi[MR_AVX2];
    UNROLL for (int r = 0; r < mr; r++) lo[r] = hi[r] = _mm256_setzero_ps();
    for (int64_t k = 0; k < K; k++) {
        __m256 b0 = _mm256_load_ps(b + k * NR), b1 = _mm256_load_ps(b + k * NR + 8);
        UNROLL for (int r = 0; r < mr; r++) {
            __m256 av = _mm256_broadcast_ss(ap + k * mr + r);
            lo[r] = _mm256_fmadd_ps(av, b0, lo[r]);
            hi[r] = _mm256_fmadd_ps(av, b1, hi[r]);
        }
    }
    if (nc == NR) {
        __m256 c0 = _mm256_setzero_ps(), c1 = _mm256_setzero_ps();
        if (bias) c0 = _mm256_loadu_ps(bias), c1 = _mm256_loadu_ps(bias + 8);
        UNROLL for (int r = 0; r < mr; r++) {
            _mm256_storeu_ps(c + r * ldc, bias ? _mm256_add_ps(lo[r], c0) : lo[r]);
            _mm256_storeu_ps(c + r * ldc + 8, bias ? _mm256_add_ps(hi[r], c1) : hi[r]);
        }
        return;
    }
    float t[MR_AVX2 * NR];
    UNROLL for (int r = 0; r < mr; r++) {
        _mm256_storeu_ps(t + r * NR, lo[r]);
        _mm256_storeu_ps(t + r * NR + 8, hi[r]);
    }
    store_rows(mr, t, nc, bias, c, ldc);
}

/* Fewer than 4 rows: too few sums in flight to hide the FMA latency, so
 * each row keeps 4 partial sums (k mod 4), added at the end. */
INLINE T_AVX2 void few_avx2(const int mr, int64_t K, const float *ap, const float *b, int64_t nc, const float *bias,
                            float *c, int64_t ldc) {
    __m256 lo[3][4], hi[3][4];
    UNROLL for (int r = 0; r < mr; r++) UNROLL for (int u = 0; u < 4; u++) lo[r][u] = hi[r][u] = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 4 <= K; k += 4)
        UNROLL for (int u = 0; u < 4; u++) {
            __m256 b0 = _mm256_load_ps(b + (k + u) * NR), b1 = _mm256_load_ps(b + (k + u) * NR + 8);
            UNROLL for (int r = 0; r < mr; r++) {
                __m256 av = _mm256_broadcast_ss(ap + (k + u) * mr + r);
                lo[r][u] = _mm256_fmadd_ps(av, b0, lo[r][u]);
                hi[r][u] = _mm256_fmadd_ps(av, b1, hi[r][u]);
            }
        }
    for (; k < K; k++) {
        __m256 b0 = _mm256_load_ps(b + k * NR), b1 = _mm256_load_ps(b + k * NR + 8);
        UNROLL for (int r = 0; r < mr; r++) {
            __m256 av = _mm256_broadcast_ss(ap + k * mr + r);
            lo[r][0] = _mm256_fmadd_ps(av, b0, lo[r][0]);
            hi[r][0] = _mm256_fmadd_ps(av, b1, hi[r][0]);
        }
    }
    float t[3 * NR];
    UNROLL for (int r = 0; r < mr; r++) {
        _mm256_storeu_ps(t + r * NR, _mm256_add_ps(_mm256_add_ps(lo[r][0], lo[r][1]), _mm256_add_ps(lo[r][2], lo[r][3])));
        _mm256_storeu_ps(t + r * NR + 8,
                         _mm256_add_ps(_mm256_add_ps(hi[r][0], hi[r][1]), _mm256_add_ps(hi[r][2], hi[r][3])));
    }
    store_rows(mr, t, nc, bias, c, ldc);
}

T_AVX2 static void tile_avx2(int rows, int64_t K, const float *ap, const float *b, int64_t nc, const float *bias,
                             float *c, int64_t ldc) {
    switch (rows) {
    case 6: tile_avx2_n(6, K, ap, b, nc, bias, c, ldc); break;
    case 5: tile_avx2_n(5, K, ap, b, nc, bias, c, ldc); break;
    case 4: tile_avx2_n(4, K, ap, b, nc, bias, c, ldc); break;
    case 3: few_avx2(3, K, ap, b, nc, bias, c, ldc); break;
    case 2: few_avx2(2, K, ap, b, nc, bias, c, ldc); break;
    case 1: few_avx2(1, K, ap, b, nc, bias, c, ldc); break;
    default: assert(0);
    }
}

/* AVX-512: up to 28 x 16, one zmm a row (28 of the 32 registers), so a
 * panel row loaded from memory serves up to 28 FMAs: at batch 1 the
 * weights stream from DRAM, and fewer rows a tile would wait on them.
 * The tail columns are masked. */
#define MR_512 28
/* Panel rows a tile of 8 rows or more prefetches ahead of the one it
 * reads (2 KiB): the first tile of a panel streams it from memory at
 * batch 1 (the weights outgrow the caches) and the hardware prefetchers
 * stop at every 4 KiB page. Measured on Zen 4 (a forward's 36 products, 42
 * MB of weights, 24 rows: 6.0 ms without, 5.0 with); neutral for the AVX2
 * kernel there, which has none. */
#ifndef PF_DIST
#define PF_DIST 32
#endif
#define T_512 __attribute__((target("avx512f")))
INLINE T_512 void tile_512_n(const int mr, int64_t K, const float *ap, const float *b, int64_t nc, const float *bias,
                             float *c, int64_t ldc) {
    __m512 acc[MR_512];
    UNROLL for (int r = 0; r < mr; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k++) {
        if (mr >= 8) _mm_prefetch((const char *)(b + (k + PF_DIST) * NR), _MM_HINT_T0);
        __m512 bk = _mm512_load_ps(b + k * NR);
        UNROLL for (int r = 0; r < mr; r++) acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(ap[k * mr + r]), bk, acc[r]);
    }
    __mmask16 m = (__mmask16)(nc >= NR ? 0xffff : (1u << nc) - 1);
    if (bias) {
        __m512 bv = _mm512_maskz_loadu_ps(m, bias);
        UNROLL for (int r = 0; r < mr; r++) acc[r] = _mm512_add_ps(acc[r], bv);
    }
    UNROLL for (int r = 0; r < mr; r++) _mm512_mask_storeu_ps(c + r * ldc, m, acc[r]);
}

/* Fewer than 4 rows: 4 partial sums a row (k mod 4), as few_avx2. */
INLINE T_512 void few_512(const int mr, int64_t K, const float *ap, const float *b, int64_t nc, const float *bias,
                          float *c, int64_t ldc) {
    __m512 acc[3][4];
    UNROLL for (int r = 0; r < mr; r++) UNROLL for (int u = 0; u < 4; u++) acc[r][u] = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 4 <= K; k += 4)
        UNROLL for (int u = 0; u < 4; u++) {
            __m512 bk = _mm512_load_ps(b + (k + u) * NR);
            UNROLL for (int r = 0; r < mr; r++)
                acc[r][u] = _mm512_fmadd_ps(_mm512_set1_ps(ap[(k + u) * mr + r]), bk, acc[r][u]);
        }
    for (; k < K; k++) {
        __m512 bk = _mm512_load_ps(b + k * NR);
        UNROLL for (int r = 0; r < mr; r++) acc[r][0] = _mm512_fmadd_ps(_mm512_set1_ps(ap[k * mr + r]), bk, acc[r][0]);
    }
    __mmask16 m = (__mmask16)(nc >= NR ? 0xffff : (1u << nc) - 1);
    __m512 bv = bias ? _mm512_maskz_loadu_ps(m, bias) : _mm512_setzero_ps();
    UNROLL for (int r = 0; r < mr; r++) {
        __m512 sum = _mm512_add_ps(_mm512_add_ps(acc[r][0], acc[r][1]), _mm512_add_ps(acc[r][2], acc[r][3]));
        _mm512_mask_storeu_ps(c + r * ldc, m, bias ? _mm512_add_ps(sum, bv) : sum);
    }
}

#define T512(n)                                                                                                        \
    case n: tile_512_n(n, K, ap, b, nc, bias, c, ldc); break;
T_512 static void tile_512(int rows, int64_t K, const float *ap, const float *b, int64_t nc, const float *bias,
                           float *c, int64_t ldc) {
    switch (rows) {
        T512(28) T512(27) T512(26) T512(25) T512(24) T512(23) T512(22) T512(21) T512(20) T512(19) T512(18)
        T512(17) T512(16) T512(15) T512(14) T512(13) T512(12) T512(11) T512(10) T512(9) T512(8) T512(7)
        T512(6) T512(5) T512(4)
    case 3: few_512(3, K, ap, b, nc, bias, c, ldc); break;
    case 2: few_512(2, K, ap, b, nc, bias, c, ldc); break;
    case 1: few_512(1, K, ap, b, nc, bias, c, ldc); break;
    default: assert(0);
    }
}
#undef T512
#endif /* PK_X86 */

/* -- Dispatch -------------------------------------------------------------- */

typedef struct kernel {
    tile_fn fn;
    int mr; /* most rows a tile */
} kernel;

static const kernel kernels[] = {{tile_c, MR_C},
#ifdef PK_X86
                                 {tile_avx2, MR_AVX2},
                                 {tile_512, MR_512}
#endif
};
#define N_ISA ((int)(sizeof kernels / sizeof kernels[0]))

static _Atomic int isa_cap = -1; /* -1: none */

static sj_cpu_isa isa_best(void) {
#ifdef PK_X86
    static _Atomic int best = -1;
    int b = atomic_load_explicit(&best, memory_order_relaxed);
    if (b < 0) {
        __builtin_cpu_init();
        b = __builtin_cpu_supports("avx512f")                                   ? SJ_CPU_ISA_AVX512
            : __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? SJ_CPU_ISA_AVX2
                                                                              : SJ_CPU_ISA_C;
        atomic_store_explicit(&best, b, memory_order_relaxed);
    }
    return (sj_cpu_isa)b;
#else
    return SJ_CPU_ISA_C;
#endif
}

sj_cpu_isa sj_cpu_packed_isa(void) {
    sj_cpu_isa b = isa_best();
    int cap = atomic_load_explicit(&isa_cap, memory_order_relaxed);
    return cap >= 0 && cap < (int)b ? (sj_cpu_isa)cap : b;
}

sj_cpu_isa sj_cpu_packed_isa_cap(int cap) {
    atomic_store_explicit(&isa_cap, cap, memory_order_relaxed);
    return sj_cpu_packed_isa();
}

const char *sj_cpu_isa_name(sj_cpu_isa isa) {
    switch (isa) {
    case SJ_CPU_ISA_C: return "c";
    case SJ_CPU_ISA_AVX2: return "avx2";
    case SJ_CPU_ISA_AVX512: return "avx512";
    }
    return "?";
}

/* -- Products -------------------------------------------------------------- */

typedef struct pk_job {
    tile_fn fn;
    int64_t M, tiles, tb; /* tb: tiles a block of rows */
    const float *ap;      /* a packed tile by tile */
    const sj_cpu_packed *p;
    const float *bias;
    float *y;
    int64_t ldy;
    const sj_cpu_epilogue *epi; /* NULL: none */
    sj_cpu_block_store store;   /* NULL: y is f32; else y16 of dt is written through it */
    char *y16;
    sj_dtype dt;
    int64_t es;
} pk_job;

/* Most rows of any kernel's tile (the f32 block a 16-bit result is stored
 * from). */
#define MR_MAX 28
_Static_assert(MR_C <= MR_MAX, "a tile fits the store block");
#ifdef PK_X86
_Static_assert(MR_AVX2 <= MR_MAX && MR_512 <= MR_MAX, "a tile fits the store block");
#endif

/* Tile t of M rows in `tiles` tiles as even as can be: its first row and
 * its row count. */
static int64_t tile_row(int64_t M, int64_t tiles, int64_t t, int64_t *rows) {
    int64_t q = M / tiles, r = M % tiles;
    *rows = q + (t < r);
    return t * q + (t < r ? t : r);
}

/* a (M x K) into ap, tile by tile, each k-major: tile t's rows r0 ..
 * r0+rows at ap + r0 * K, element (r0 + r, k) at [k * rows + r]. a is f32
 * with row stride lda (load NULL), or rows of any float dtype (strides sam,
 * sak in elements of es bytes) that load converts on the packing thread
 * (no f32 copy of the whole of a).
 *
 * A tile is written in blocks of PACK_K columns, each block's rows first
 * gathered into a buffer on the stack (rows x PACK_K floats, in L1), then
 * written out k by k: the stores run through ap in order. (Row by row, the
 * stores went down a column of the tile, one cache line each, 25 to 28
 * passes over the tile: a 25 x 1536 operand took 80-110 us to pack on the
 * 32-core GPU host, more than its product split over 32 threads.) */
#define PACK_K 64
typedef struct pack_job {
    const float *a;
    int64_t lda, M, K, tiles;
    float *ap;
    sj_cpu_row_load load; /* NULL: a is f32 */
    const char *a16;
    sj_dtype dt;
    int64_t sam, sak, es;
} pack_job;

static void pack_tiles(void *ctx, int64_t begin, int64_t end) {
    const pack_job *j = ctx;
    _Alignas(64) float buf[MR_MAX * PACK_K];
    for (int64_t t = begin; t < end; t++) {
        int64_t rows, r0 = tile_row(j->M, j->tiles, t, &rows);
        float *dst = j->ap + r0 * j->K;
        for (int64_t k0 = 0; k0 < j->K; k0 += PACK_K) {
            int64_t n = j->K - k0 < PACK_K ? j->K - k0 : PACK_K;
            for (int64_t r = 0; r < rows; r++) {
                float *b = buf + r * PACK_K;
                if (j->load) j->load(b, j->a16 + ((r0 + r) * j->sam + k0 * j->sak) * j->es, j->dt, j->sak, n);
                else memcpy(b, j->a + (r0 + r) * j->lda + k0, (size_t)n * sizeof(float));
            }
            float *d = dst + k0 * rows;
            for (int64_t k = 0; k < n; k++)
                for (int64_t r = 0; r < rows; r++) *d++ = buf[r * PACK_K + k];
        }
    }
}

/* The epilogue over rows [r0, r1) and columns [c0, c1): one call for
 * whole rows, else one a row. */
static void pk_epi(const pk_job *j, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
    const sj_cpu_epilogue *e = j->epi;
    int64_t N = j->p->N;
    if (c0 == 0 && c1 == N) {
        e->fn(e->p, e->s, r0 * N, r1 * N);
        return;
    }
    for (int64_t r = r0; r < r1; r++) e->fn(e->p, e->s, r * N + c0, r * N + c1);
}

/* Work items: (block of tiles, panel) pairs, a block's panels one after
 * another, so a chunk of items keeps one block of a in L2 while its panels
 * stream past. Large products split over blocks as well as panels (a
 * 32-sentence batch has ~20 blocks of 24 panels for a 384-column
 * product), small ones over panels alone (one block). With an epilogue,
 * a chunk's items go EPI_PANELS panels of one block at a time, each run
 * followed by the epilogue over the block's rows and those panels'
 * columns. */
static void pk_items(void *ctx, int64_t begin, int64_t end) {
    const pk_job *j = ctx;
    const sj_cpu_packed *p = j->p;
    for (int64_t i = begin; i < end;) {
        int64_t blk = i / p->panels, q0 = i % p->panels;
        int64_t q1 = j->epi && q0 + EPI_PANELS < p->panels ? q0 + EPI_PANELS : p->panels;
        if (q1 - q0 > end - i) q1 = q0 + (end - i);
        int64_t t0 = blk * j->tb, t1 = t0 + j->tb < j->tiles ? t0 + j->tb : j->tiles;
        for (int64_t q = q0; q < q1; q++) {
            int64_t nc = p->N - q * NR < NR ? p->N - q * NR : NR;
            const float *b = p->data + q * p->K * NR, *bias = j->bias ? j->bias + q * NR : NULL;
            for (int64_t t = t0; t < t1; t++) {
                int64_t rows, r0 = tile_row(j->M, j->tiles, t, &rows);
                if (!j->store) {
                    j->fn((int)rows, p->K, j->ap + r0 * p->K, b, nc, bias, j->y + r0 * j->ldy + q * NR, j->ldy);
                    continue;
                }
                _Alignas(64) float cb[MR_MAX * NR];
                j->fn((int)rows, p->K, j->ap + r0 * p->K, b, nc, bias, cb, NR);
                j->store(j->y16 + (r0 * j->ldy + q * NR) * j->es, j->ldy, j->dt, cb, NR, rows, nc);
            }
        }
        if (j->epi) {
            int64_t rows, r0 = tile_row(j->M, j->tiles, t0, &rows), r1 = tile_row(j->M, j->tiles, t1 - 1, &rows);
            pk_epi(j, r0, r1 + rows, q0 * NR, q1 * NR < p->N ? q1 * NR : p->N);
        }
        i += q1 - q0;
    }
}

/* Elements of a packed per thread at least (a smaller a is packed on the
 * calling thread). */
#define PACK_MIN_ELEMS 32768

sj_status sj_cpu_packed_gemm(int64_t M, const float *a, int64_t lda, const sj_cpu_packed *p, const float *bias,
                             float *y, int64_t ldy, sj_threads *pool) {
    return sj_cpu_packed_gemm_epi(M, a, lda, p, bias, y, ldy, pool, NULL);
}

/* The product over a packed by pj (its a, M and K filled in), into y (f32)
 * or, with store, into y16 (pj->dt). */
static sj_status packed_gemm(pack_job *pj, const sj_cpu_packed *p, const float *bias, float *y, int64_t ldy,
                             sj_threads *pool, const sj_cpu_epilogue *epi, sj_cpu_block_store store, char *y16) {
    int64_t M = pj->M;
    assert(!epi || ldy == p->N);
    if (M <= 0 || p->N <= 0) return SJ_OK;
    atomic_fetch_add_explicit(&products, 1, memory_order_relaxed);
    if (p->K == 0) { /* an empty sum: the bias alone */
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < p->N; j += NR) {
                float cb[NR];
                int64_t nc = p->N - j < NR ? p->N - j : NR;
                for (int64_t c = 0; c < nc; c++) cb[c] = bias ? bias[j + c] : 0.0f;
                if (store) store(y16 + (i * ldy + j) * pj->es, ldy, pj->dt, cb, NR, 1, nc);
                else memcpy(y + i * ldy + j, cb, (size_t)nc * sizeof(float));
            }
        if (epi) epi->fn(epi->p, epi->s, 0, M * p->N);
        return SJ_OK;
    }
    sj_cpu_isa isa = sj_cpu_packed_isa();
    const kernel *kn = &kernels[(int)isa < N_ISA ? isa : 0];
    float *ap = sj_cpu_scratch(SJ_CPU_PACK_SLOT, (size_t)(M * p->K) * sizeof(float));
    if (!ap)
        return sj_seterr(SJ_ENOMEM, "matmul: out of memory packing a %lld x %lld operand", (long long)M,
                         (long long)p->K);
    pk_job j = {.fn = kn->fn, .M = M, .tiles = (M + kn->mr - 1) / kn->mr, .ap = ap, .p = p, .bias = bias, .y = y,
                .ldy = ldy, .epi = epi, .store = store, .y16 = y16, .dt = pj->dt, .es = pj->es};
    bool split = pool && sj_threads_count(pool) > 1;
    pj->tiles = j.tiles, pj->ap = ap;
    int64_t tile_elems = kn->mr * p->K;
    if (split)
        sj_threads_parallel_for(pool, j.tiles, (PACK_MIN_ELEMS + tile_elems - 1) / tile_elems, pack_tiles, pj);
    else
        pack_tiles(pj, 0, j.tiles);
    j.tb = A_BLOCK_BYTES / (kn->mr * p->K * (int64_t)sizeof(float));
    if (j.tb < 1) j.tb = 1;
    int64_t blocks = (j.tiles + j.tb - 1) / j.tb, items = blocks * p->panels;
    int64_t per_item = (M + blocks - 1) / blocks * p->K * NR;
    if (split && items > 1)
        sj_threads_split(pool, items, (CHUNK_MIN_MACS + per_item - 1) / per_item, sj_threads_items(pool, per_item),
                         pk_items, &j);
    else
        pk_items(&j, 0, items);
    return SJ_OK;
}

sj_status sj_cpu_packed_gemm_epi(int64_t M, const float *a, int64_t lda, const sj_cpu_packed *p, const float *bias,
                                 float *y, int64_t ldy, sj_threads *pool, const sj_cpu_epilogue *epi) {
    pack_job pj = {.a = a, .lda = lda, .M = M, .K = p->K};
    return packed_gemm(&pj, p, bias, y, ldy, pool, epi, NULL, NULL);
}

sj_status sj_cpu_packed_gemm_rows(int64_t M, const void *a, sj_dtype dt, int64_t sam, int64_t sak,
                                  sj_cpu_row_load load, const sj_cpu_packed *p, const float *bias, float *y,
                                  int64_t ldy, sj_threads *pool, const sj_cpu_epilogue *epi) {
    pack_job pj = {.M = M, .K = p->K, .load = load, .a16 = a, .dt = dt, .sam = sam, .sak = sak,
                   .es = (int64_t)cpu_dtype_size(dt)};
    return packed_gemm(&pj, p, bias, y, ldy, pool, epi, NULL, NULL);
}

sj_status sj_cpu_packed_gemm_rows_to(int64_t M, const void *a, sj_dtype dt, int64_t sam, int64_t sak,
                                     sj_cpu_row_load load, const sj_cpu_packed *p, const float *bias, void *y,
                                     int64_t ldy, sj_cpu_block_store store, sj_threads *pool,
                                     const sj_cpu_epilogue *epi) {
    pack_job pj = {.M = M, .K = p->K, .load = load, .a16 = a, .dt = dt, .sam = sam, .sak = sak,
                   .es = (int64_t)cpu_dtype_size(dt)};
    return packed_gemm(&pj, p, bias, NULL, ldy, pool, epi, store, y);
}

/* -- The per-function cache ------------------------------------------------- */

typedef struct pk_item {
    const void *data;
    sj_dtype dtype;
    int64_t K, N, sk, sn;
    sj_cpu_packed *p;
} pk_item;

struct sj_cpu_pack_cache {
    pthread_mutex_t lock; /* guards everything below; held while packing */
    uint64_t bytes;
    pk_item *items;
    int n, cap;
};

sj_cpu_pack_cache *sj_cpu_pack_cache_create(void) {
    sj_cpu_pack_cache *c = sj_calloc(1, sizeof *c);
    if (!c) return NULL;
    if (pthread_mutex_init(&c->lock, NULL)) {
        free(c);
        return NULL;
    }
    return c;
}

void sj_cpu_pack_cache_destroy(sj_cpu_pack_cache *c) {
    if (!c) return;
    for (int i = 0; i < c->n; i++) sj_cpu_packed_free(c->items[i].p);
    free(c->items);
    pthread_mutex_destroy(&c->lock);
    free(c);
}

/* b as the cache's key; false when b cannot be packed (sj_cpu_pack). */
static bool pack_key(const sj_tensor *b, pk_item *key) {
    int r = b->rank;
    if (r < 2 || b->device != SJ_HOST || !cpu_is_float(b->dtype)) return false;
    for (int i = 0; i < r - 2; i++)
        if (b->shape[i] != 1) return false;
    *key = (pk_item){.data = b->data, .dtype = b->dtype, .K = b->shape[r - 2], .N = b->shape[r - 1],
                     .sk = b->stride[r - 2], .sn = b->stride[r - 1]};
    return true;
}

uint64_t sj_cpu_pack_need(const sj_tensor *b) {
    pk_item key;
    if (!pack_key(b, &key)) return 0;
    return (uint64_t)((key.N + NR - 1) / NR) * (uint64_t)(key.K > 0 ? key.K : 1) * NR * sizeof(float) + 64 +
           sizeof(sj_cpu_packed);
}

/* The copy of key in c, or NULL (c's lock held). */
static const sj_cpu_packed *cache_find(const sj_cpu_pack_cache *c, const pk_item *key) {
    for (int i = 0; i < c->n; i++) {
        const pk_item *it = &c->items[i];
        if (it->data == key->data && it->dtype == key->dtype && it->K == key->K && it->N == key->N &&
            (it->K <= 1 || it->sk == key->sk) && (it->N <= 1 || it->sn == key->sn))
            return it->p;
    }
    return NULL;
}

const sj_cpu_packed *sj_cpu_pack_cache_find(sj_cpu_pack_cache *c, const sj_tensor *b) {
    pk_item key;
    if (!c || !pack_key(b, &key)) return NULL;
    pthread_mutex_lock(&c->lock);
    const sj_cpu_packed *found = cache_find(c, &key);
    pthread_mutex_unlock(&c->lock);
    return found;
}

const sj_cpu_packed *sj_cpu_pack_cache_get(sj_cpu_pack_cache *c, const sj_tensor *b) {
    pk_item key;
    if (!c || !pack_key(b, &key)) return NULL;
    pthread_mutex_lock(&c->lock);
    const sj_cpu_packed *found = cache_find(c, &key);
    if (!found) {
        if (c->n == c->cap) {
            int cap = c->cap ? 2 * c->cap : 16;
            pk_item *items = sj_realloc(c->items, (size_t)cap * sizeof *items);
            if (items) c->items = items, c->cap = cap;
        }
        if (c->n < c->cap && !sj_cpu_pack(b, &key.p)) {
            c->items[c->n++] = key;
            c->bytes += sj_cpu_packed_bytes(key.p);
            found = key.p;
        }
    }
    pthread_mutex_unlock(&c->lock);
    return found;
}

void sj_cpu_pack_cache_stats(sj_cpu_pack_cache *c, uint64_t *count, uint64_t *bytes) {
    *count = *bytes = 0;
    if (!c) return;
    pthread_mutex_lock(&c->lock);
    *count = (uint64_t)c->n;
    *bytes = c->bytes;
    pthread_mutex_unlock(&c->lock);
}
