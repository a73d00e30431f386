/* Constant weights packed once for the CPU's matrix products.
 *
 * A product y = a @ b whose b is a constant of the function (a parameter,
 * or a view of one) gets b packed once, when its entry is made, into the
 * layout the micro-kernels read: f32 (f16/bf16 converted once), column
 * panels of SJ_CPU_PANEL columns, each panel K rows of SJ_CPU_PANEL floats
 * (64 bytes, 64-byte aligned), the last panel zero-padded. Every call
 * then runs the product over the packed panels with a register-tiled
 * kernel (AVX-512, AVX2+FMA, or plain C, picked once at run time from what
 * the CPU supports), reading a in place and adding the bias as it stores;
 * OpenBLAS would copy b into its own layout on every call.
 *
 * Memory: the packed copy is K x ceil(N/16)*16 floats beside the caller's
 * weights, which stay in use (for the products the packed path does not
 * take): as much again for f32 weights, twice their size for f16/bf16.
 * Which weights are packed is the runtime's choice (jit/exec.c's
 * sj_exec_prepack: a float product's constant operand, while the
 * function's cache stays within sj_runtime_config.prepack_max_bytes;
 * weights past that are not packed and their products go through
 * OpenBLAS); this file packs what it is given and keeps it.
 *
 * Thread safety: a packed copy is immutable once made, and may be read by
 * any number of products at once. The cache is filled under its own lock,
 * at trace time only (never on a call's hot path).
 */
#ifndef SJ_CPU_PREPACK_H
#define SJ_CPU_PREPACK_H

#include <stddef.h>
#include <stdint.h>

#include "jit/shapejit.h"

struct sj_threads;

/* Columns per packed panel (one zmm, two ymm). */
#define SJ_CPU_PANEL 16

typedef struct sj_cpu_packed sj_cpu_packed;

/* Pack b: the last two axes (K x N) of a float tensor (f32, f16, bf16) on
 * the host whose other sizes are 1, any strides >= 0. *out: the packed
 * copy (free with sj_cpu_packed_free). SJ_EINVAL for anything else (a
 * batch of matrices, an integer dtype), SJ_ENOMEM. */
sj_status sj_cpu_pack(const sj_tensor *b, sj_cpu_packed **out);
void sj_cpu_packed_free(sj_cpu_packed *p); /* NULL is a no-op */
/* Bytes the packed copy holds. */
size_t sj_cpu_packed_bytes(const sj_cpu_packed *p);
int64_t sj_cpu_packed_rows(const sj_cpu_packed *p); /* K */
int64_t sj_cpu_packed_cols(const sj_cpu_packed *p); /* N */

/* Packs made so far in this process (tests: packing happens once). */
uint64_t sj_cpu_pack_count(void);
/* Products run over packed weights so far in this process (tests). */
uint64_t sj_cpu_packed_products(void);

/* The instruction sets of the packed kernels, best last. */
typedef enum sj_cpu_isa { SJ_CPU_ISA_C, SJ_CPU_ISA_AVX2, SJ_CPU_ISA_AVX512 } sj_cpu_isa;
/* The kernel in use: the best the CPU supports, at most the cap. */
sj_cpu_isa sj_cpu_packed_isa(void);
/* Cap the kernels at `cap` (tests run the lesser kernels so; -1: no cap),
 * process-wide. Returns the one now in use. */
sj_cpu_isa sj_cpu_packed_isa_cap(int cap);
const char *sj_cpu_isa_name(sj_cpu_isa isa);

/* The calling thread's scratch slot (sj_cpu_scratch) a product packs its
 * a into. */
#define SJ_CPU_PACK_SLOT 1

/* y (M x N, f32, row stride ldy, unit column stride) = a (M x K, f32,
 * row stride lda, unit column stride) @ p (+ bias[j] on column j, f32,
 * contiguous; NULL: none), split over pool's threads by panels when the
 * product is big enough (pool NULL: the calling thread). a is packed into
 * scratch slot SJ_CPU_PACK_SLOT first. SJ_ENOMEM when that fails. */
sj_status sj_cpu_packed_gemm(int64_t M, const float *a, int64_t lda, const sj_cpu_packed *p, const float *bias,
                             float *y, int64_t ldy, struct sj_threads *pool);

/* An elementwise epilogue a product runs over its own result: fn (a
 * generated POINTWISE group, specialize/codegen.h's signature) over work
 * items [begin, end), where item i * N + j is element (i, j) of the
 * product's M x N result (which is contiguous: ldy == N). The product
 * calls it for each block of rows and columns as soon as the block is
 * finished (from the thread that finished it), so the epilogue reads the
 * block from cache; every item is covered exactly once. */
typedef struct sj_cpu_epilogue {
    void (*fn)(void *const *p, const int64_t *s, int64_t begin, int64_t end);
    void *const *p;
    const int64_t *s;
} sj_cpu_epilogue;

/* sj_cpu_packed_gemm with an epilogue (NULL: none); epi needs ldy == N. */
sj_status sj_cpu_packed_gemm_epi(int64_t M, const float *a, int64_t lda, const sj_cpu_packed *p, const float *bias,
                                 float *y, int64_t ldy, struct sj_threads *pool, const sj_cpu_epilogue *epi);

/* sj_cpu_packed_gemm_epi with a given as rows of any float dtype dt
 * (element (i, k) at a + (i * sam + k * sak) elements), converted to f32
 * by load (n elements of stride s from src into dst; as cpu_load_f32) as
 * they are packed into tiles, on the packing threads. */
typedef void (*sj_cpu_row_load)(float *dst, const char *src, sj_dtype dt, int64_t s, int64_t n);
sj_status sj_cpu_packed_gemm_rows(int64_t M, const void *a, sj_dtype dt, int64_t sam, int64_t sak,
                                  sj_cpu_row_load load, const sj_cpu_packed *p, const float *bias, float *y,
                                  int64_t ldy, struct sj_threads *pool, const sj_cpu_epilogue *epi);

/* Stores a block of rows x n f32 sums (row stride lds) into rows of dtype
 * dt at dst (row stride ldd elements, unit column stride), rounding as
 * sj_f32_to_f16 / sj_f32_to_bf16 do. */
typedef void (*sj_cpu_block_store)(char *dst, int64_t ldd, sj_dtype dt, const float *src, int64_t lds,
                                   int64_t rows, int64_t n);
/* sj_cpu_packed_gemm_rows with y of a's dtype dt (f16/bf16), row-major with
 * row stride ldy elements: each tile's sums go from a small f32 block on
 * the stack (in L1) through store into y, on the thread that computed them
 * (no f32 copy of the whole result); epi (ldy == N) then runs over the
 * 16-bit y, block by block as in sj_cpu_packed_gemm_epi. */
sj_status sj_cpu_packed_gemm_rows_to(int64_t M, const void *a, sj_dtype dt, int64_t sam, int64_t sak,
                                     sj_cpu_row_load load, const sj_cpu_packed *p, const float *bias, void *y,
                                     int64_t ldy, sj_cpu_block_store store, struct sj_threads *pool,
                                     const sj_cpu_epilogue *epi);

/* -- The per-function cache --------------------------------------------- */

typedef struct sj_cpu_pack_cache sj_cpu_pack_cache;

/* An empty cache of packed copies (no bound of its own: its owner decides
 * what to pack, from sj_cpu_pack_need and the bytes held). NULL: out of
 * memory. */
sj_cpu_pack_cache *sj_cpu_pack_cache_create(void);
/* Frees every packed copy: no product may still be reading one. NULL is a
 * no-op. */
void sj_cpu_pack_cache_destroy(sj_cpu_pack_cache *c);
/* The packed copy of b, made on the first request for the same memory,
 * dtype, sizes and strides, and shared by every later one. NULL when b
 * cannot be packed (see sj_cpu_pack) or out of memory (the product then
 * runs unpacked). Thread-safe. */
const sj_cpu_packed *sj_cpu_pack_cache_get(sj_cpu_pack_cache *c, const sj_tensor *b);
/* The copy of b the cache holds already, or NULL; packs nothing. */
const sj_cpu_packed *sj_cpu_pack_cache_find(sj_cpu_pack_cache *c, const sj_tensor *b);
/* The bytes a packed copy of b counts against a bound (its floats with
 * their padding, alignment and header: at least sj_cpu_packed_bytes of
 * the copy made); 0 when b cannot be packed. */
uint64_t sj_cpu_pack_need(const sj_tensor *b);
/* Copies held and their bytes. */
void sj_cpu_pack_cache_stats(sj_cpu_pack_cache *c, uint64_t *count, uint64_t *bytes);

#endif /* SJ_CPU_PREPACK_H */
