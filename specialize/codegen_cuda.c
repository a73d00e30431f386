/* CUDA code generation for the generated groups of a fused plan (ABI and
 * launch rules in codegen_cuda.h).
 *
 * A unit is a prelude (for NVRTC, which has no system headers: the
 * <stdint.h> types and the <math.h> constants the runtime header uses),
 * the runtime header's text (device-usable: the same sj_rt_ functions the
 * CPU computes with), device helpers (16-byte loads and stores of 4
 * elements, the warp/block reduction), then one kernel per group. Values,
 * op expressions, loads and stores are the C generator's (codegen_int.h);
 * only element addressing and the parallel structure differ.
 *
 * Every size, stride and offset is a `const int64_t`: a literal in the
 * specialized form, else the expression over the kernel's s parameters.
 * Access k is p<k> (its store's base) with element offset b<k> and strides
 * st<k>_<axis>; o<k> is its offset at the current row.
 *
 * POINTWISE: block (256); block (x, y) does columns [2048 x, 2048 x + 2048)
 * of rows y, y + gridDim.y, ... The row's indices come from the row number
 * (divisions per row, 32-bit when the row count fits; literal divisors when
 * specialized), never per element. A uniform flag, computed once, says
 * whether every access is contiguous or broadcast along the row, the row
 * length is a multiple of 4 and every contiguous access is 16-byte aligned
 * at every row (its base plus offset aligned to 4 elements, its row strides
 * multiples of 4): then each thread does 4 consecutive elements with one
 * vector load per access (float4, uint2 for halves, ...) and one vector
 * store, twice (chunks 1024 elements apart, both loaded before either is
 * computed, so that enough bytes are in flight to cover memory latency);
 * otherwise 8 elements 256 apart (coalesced) one by one. An access
 * whose innermost stride is not a known 0 or 1 rules the vector path out at
 * generation time, as do literal offsets, strides or lengths that break it.
 *
 * ROW: the threads of one row are blockDim.x (a warp, or a whole block for
 * rows longer than 1024), rows are blockIdx.x * blockDim.y + threadIdx.y,
 * looping by gridDim.x * blockDim.y; thread t does elements t, t + T, ...
 * Reductions are per-thread partials in f32 (u64/i64 for integers), then a
 * butterfly over the warp and, for a block, over the warps through shared
 * memory: every thread ends with the row's value, in one fixed tree order.
 * Softmax and the norms keep the row op's input (the prologue's result) in
 * dynamic shared memory when the row has at most ROW_CACHE elements (the
 * launch provides blockDim.y * n floats), else recompute it from memory in
 * every pass. The symbolic form (n unknown) is a kernel per row thread
 * count and row length class (row_vs), <name>_v0 .. _v3, which the launch
 * picks by n; each has the paths of the rows it is launched for (v0-v2:
 * every row in registers; v3: registers, shared memory or recomputed),
 * chosen at run time by n, plus the scalar ones.
 * Layer norm takes the mean, then the variance around it (two passes).
 * Reductions are one pass; thread 0 runs the epilogue. The row's thread
 * count nt is a literal of every row kernel (the launch's blockDim.x), so
 * a warp's row compiles without the block-wide part of its reductions.
 * With sj_codegen_opts.fallback_kernels, a row kernel of one variant with a
 * vector path is two (paths: P_VEC and P_FB): the vector path alone, its
 * flag kept (a call it refuses does nothing: the launcher runs the other,
 * by sj_cuda_vec_ok), and the element-by-element path alone, <name>_fb; a
 * split of the unit puts them in different programs, so the program of the
 * vector kernel compiles sooner (issue 28: w4's layer norm was the floor of
 * a split unit's compile).
 */
#include "specialize/codegen_cuda.h"

#include <assert.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "specialize/codegen.h"
#include "specialize/codegen_gemm_cuda.h"
#include "specialize/codegen_int.h"

#define PW_BLOCK 256          /* threads of a pointwise block */
#ifndef SJ_CUDA_PW_VECS
#define SJ_CUDA_PW_VECS 2
#endif
#define PW_VECS SJ_CUDA_PW_VECS   /* 4-element chunks per thread */
#define PW_CHUNK (4 * PW_VECS * PW_BLOCK) /* elements of the last axis per block */
#define PW_BLOCKS_PER_SM 64   /* pointwise blocks per multiprocessor at most, in all */
#define ROW_WARP_MAX 1024     /* longest row a warp takes */
#define ROW_WARPS 8           /* rows (warps) per block at most */
#define ROW_CACHE 8192        /* floats of a row kept on chip (registers or shared memory) at most */
#define ROW_THREADS_MAX 512   /* threads of a block-per-row block at most */
#define ROW_RC 8              /* register cache: 4-element chunks a thread keeps at most */
#define ROW_BLOCKS_PER_SM 64  /* row blocks per multiprocessor at most, in all (rows loop) */
/* Minimum resident blocks in the launch bounds of symbolic row kernels
 * that keep at most 2 chunks a thread in registers (v2, v3): a
 * 40-register cap. With the block size alone ptxas aimed some of them at 32
 * registers and spilled (w3's masked softmax: 12 bytes); with 3 blocks none
 * spills (H200 w3 S=2048 0.135 -> 0.129 ms, w2 unchanged). Kernels whose
 * sizes are all literals keep the block size alone: the cap makes their
 * register caches spill (H200 w2 S=32768 0.105 -> 0.159 ms, w3 S=1024
 * 0.039 -> 0.068), and a minimum of 1 costs w3 S=2048 0.109 -> 0.123. */
#define ROW_SYM_MIN_BLOCKS 3
/* The variants of a symbolic row kernel (the row's length unknown): the
 * launch picks the first whose nmax the row fits; each has the threads
 * the launch rule gives those rows (a warp up to ROW_WARP_MAX, then
 * row_threads(), 256 or 512) as a literal, and only the paths of those
 * rows. A literal thread count, not blockDim.x, is worth 15% on w3 (H200
 * S=2048 0.129 -> 0.109 ms, level with the specialized kernel). The warp
 * variants keep every row in registers (4 or 8 chunks a lane, bounded by
 * their block as specialized kernels are): w2 S=32768 0.113 -> 0.108 ms
 * (static 0.105). */
typedef struct row_variant {
    unsigned nt;  /* threads of a row */
    int64_t nmax; /* the longest row it is launched for */
} row_variant;
static const row_variant row_vs[] = {{32, 512}, {32, ROW_WARP_MAX}, {256, 2048}, {512, INT64_MAX}};
#define ROW_VARIANTS ((int)(sizeof row_vs / sizeof row_vs[0]))
#define GRID_Y_MAX 65535
#define GRID_X_MAX 2147483647
_Static_assert(PW_CHUNK == 4 * PW_VECS * PW_BLOCK, "PW_VECS chunks of 4 per thread");
_Static_assert(128 * 8 == ROW_WARP_MAX && ROW_THREADS_MAX == 512 && ROW_WARP_MAX == 1024,
               "row_threads() of a row longer than a warp's is 256 up to 2048, else 512 (row_vs)");
_Static_assert(4 <= SJ_CG_FALLBACK, "the row variants fit the slots before the fallback's");
_Static_assert(ROW_WARPS * ROW_WARP_MAX <= ROW_CACHE, "a warp-per-row block caches every row it has");
_Static_assert(ROW_CACHE * 4 <= 48 * 1024, "the cache fits the default dynamic shared memory limit");
_Static_assert(ROW_RC * 4 * 32 >= ROW_WARP_MAX && ROW_RC * 4 * ROW_THREADS_MAX >= ROW_CACHE,
               "the register cache holds every cached row");

/* -- Prelude -------------------------------------------------------------------- */

static const char prelude_head[] =
    "/* shapejit CUDA unit (NVRTC, or nvcc -x cu) */\n"
    "#if defined(__CUDACC_RTC__)\n"
    "typedef signed char int8_t;\n"
    "typedef short int16_t;\n"
    "typedef int int32_t;\n"
    "typedef long long int64_t;\n"
    "typedef unsigned char uint8_t;\n"
    "typedef unsigned short uint16_t;\n"
    "typedef unsigned int uint32_t;\n"
    "typedef unsigned long long uint64_t;\n"
    "#define INT32_C(c) c\n"
    "#define INT64_C(c) c##LL\n"
    "#define UINT32_C(c) c##U\n"
    "#define UINT64_C(c) c##ULL\n"
    "#define INT32_MAX 2147483647\n"
    "#define INT32_MIN (-INT32_MAX - 1)\n"
    "#define UINT32_MAX 4294967295U\n"
    "#define INT64_MAX 9223372036854775807LL\n"
    "#define INT64_MIN (-INT64_MAX - 1)\n"
    "#define UINT64_MAX 18446744073709551615ULL\n"
    "#define INFINITY __int_as_float(0x7f800000)\n"
    "#define NAN __int_as_float(0x7fc00000)\n"
    "#else\n"
    "#include <math.h>\n"
    "#include <stdint.h>\n"
    "#endif\n"
    /* the header's static functions that a unit leaves unused */
    "#pragma nv_diag_suppress 177\n";

static const char prelude_tail[] =
    "\n/* -- device helpers -- */\n"
    "/* 4 consecutive elements: one 16-byte (halves: 8-byte) access */\n"
    "static __device__ __forceinline__ void sj_ld4(const float *p, float *d) {\n"
    "    const float4 t = *(const float4 *)p;\n"
    "    d[0] = t.x; d[1] = t.y; d[2] = t.z; d[3] = t.w;\n"
    "}\n"
    "static __device__ __forceinline__ void sj_st4(float *p, const float *d) {\n"
    "    *(float4 *)p = make_float4(d[0], d[1], d[2], d[3]);\n"
    "}\n"
    "static __device__ __forceinline__ void sj_ld4(const uint16_t *p, uint16_t *d) {\n"
    "    const uint2 t = *(const uint2 *)p;\n"
    "    d[0] = (uint16_t)t.x; d[1] = (uint16_t)(t.x >> 16); d[2] = (uint16_t)t.y; d[3] = (uint16_t)(t.y >> 16);\n"
    "}\n"
    "static __device__ __forceinline__ void sj_st4(uint16_t *p, const uint16_t *d) {\n"
    "    *(uint2 *)p = make_uint2((uint32_t)d[0] | (uint32_t)d[1] << 16, (uint32_t)d[2] | (uint32_t)d[3] << 16);\n"
    "}\n"
    "static __device__ __forceinline__ void sj_ld4(const int32_t *p, int32_t *d) {\n"
    "    const int4 t = *(const int4 *)p;\n"
    "    d[0] = t.x; d[1] = t.y; d[2] = t.z; d[3] = t.w;\n"
    "}\n"
    "static __device__ __forceinline__ void sj_st4(int32_t *p, const int32_t *d) {\n"
    "    *(int4 *)p = make_int4(d[0], d[1], d[2], d[3]);\n"
    "}\n"
    "static __device__ __forceinline__ void sj_ld4(const int64_t *p, int64_t *d) {\n"
    "    const longlong2 a = ((const longlong2 *)p)[0], b = ((const longlong2 *)p)[1];\n"
    "    d[0] = a.x; d[1] = a.y; d[2] = b.x; d[3] = b.y;\n"
    "}\n"
    "static __device__ __forceinline__ void sj_st4(int64_t *p, const int64_t *d) {\n"
    "    ((longlong2 *)p)[0] = make_longlong2(d[0], d[1]);\n"
    "    ((longlong2 *)p)[1] = make_longlong2(d[2], d[3]);\n"
    "}\n"
    "static __device__ __forceinline__ void sj_ld4(const uint8_t *p, uint8_t *d) {\n"
    "    const uint32_t t = *(const uint32_t *)p;\n"
    "    d[0] = (uint8_t)t; d[1] = (uint8_t)(t >> 8); d[2] = (uint8_t)(t >> 16); d[3] = (uint8_t)(t >> 24);\n"
    "}\n"
    "static __device__ __forceinline__ void sj_st4(uint8_t *p, const uint8_t *d) {\n"
    "    *(uint32_t *)p = (uint32_t)d[0] | (uint32_t)d[1] << 8 | (uint32_t)d[2] << 16 | (uint32_t)d[3] << 24;\n"
    "}\n"
    "/* The nt threads of a row (blockDim.x == nt, a literal of the kernel:\n"
    " * 32, or a multiple of 32 with blockDim.y == 1) combine v: a butterfly\n"
    " * over each warp, then over the warps' results through red (32\n"
    " * elements of shared memory), which a warp's row leaves out at compile\n"
    " * time. Every thread gets the result, in one fixed tree order. */\n"
    "template <typename T, typename F>\n"
    "static __device__ __forceinline__ T sj_cu_reduce(T v, T id, F f, T *red, const int nt) {\n"
    "#pragma unroll\n"
    "    for (int o = 16; o > 0; o >>= 1) v = f(v, __shfl_xor_sync(0xffffffffu, v, o));\n"
    "    if (nt > 32) {\n"
    "        const unsigned lane = threadIdx.x & 31u;\n"
    "        __syncthreads(); /* red's last readers are done */\n"
    "        if (lane == 0) red[threadIdx.x >> 5] = v;\n"
    "        __syncthreads();\n"
    "        v = lane < (unsigned)(nt >> 5) ? red[lane] : id;\n"
    "#pragma unroll\n"
    "        for (int o = 16; o > 0; o >>= 1) v = f(v, __shfl_xor_sync(0xffffffffu, v, o));\n"
    "    }\n"
    "    return v;\n"
    "}\n"
    "/* Two float sums at once (layer norm's centred squares and values): one\n"
    " * tree, the pairs through red as float2 (32 of them fit). */\n"
    "static __device__ __forceinline__ void sj_cu_sum2(float &a, float &b, float2 *red, const int nt) {\n"
    "#pragma unroll\n"
    "    for (int o = 16; o > 0; o >>= 1) {\n"
    "        a += __shfl_xor_sync(0xffffffffu, a, o);\n"
    "        b += __shfl_xor_sync(0xffffffffu, b, o);\n"
    "    }\n"
    "    if (nt > 32) {\n"
    "        const unsigned lane = threadIdx.x & 31u;\n"
    "        __syncthreads(); /* red's last readers are done */\n"
    "        if (lane == 0) red[threadIdx.x >> 5] = make_float2(a, b);\n"
    "        __syncthreads();\n"
    "        const float2 v = lane < (unsigned)(nt >> 5) ? red[lane] : make_float2(0.0f, 0.0f);\n"
    "        a = v.x, b = v.y;\n"
    "#pragma unroll\n"
    "        for (int o = 16; o > 0; o >>= 1) {\n"
    "            a += __shfl_xor_sync(0xffffffffu, a, o);\n"
    "            b += __shfl_xor_sync(0xffffffffu, b, o);\n"
    "        }\n"
    "    }\n"
    "}\n"
    "struct sj_cu_fadd { __device__ float operator()(float a, float b) const { return a + b; } };\n"
    "struct sj_cu_fmax { __device__ float operator()(float a, float b) const { return sj_rt_max_combine(a, b); } };\n"
    "struct sj_cu_uadd { __device__ uint64_t operator()(uint64_t a, uint64_t b) const { return a + b; } };\n"
    "struct sj_cu_imax { __device__ int64_t operator()(int64_t a, int64_t b) const { return a > b ? a : b; } };\n";

/* -- Output --------------------------------------------------------------------- */

#define put sj_cg_put

/* After a norm's centred (or raw, for RMS) value: ` - mean - cm) * rstd *
 * g + b` for layer norm (the f32 mean, then its correction), `) * r * g`
 * for RMS norm (gw, bw: operands, -1 absent: 1 and 0), in f32. (The CPU's
 * kernels split a double mean in two floats instead:
 * specialize/codegen_c.c.) */
static void put_norm_tail(sj_cg *c, const sj_node *n, int32_t gw, int32_t bw) {
    bool ln = n->op == SJ_OP_LAYER_NORM;
    put(&c->o, ln ? " - mean - cm) * rstd * " : ") * r * ");
    if (gw < 0) put(&c->o, "1.0f");
    else sj_cg_put_ref(c, gw);
    if (!ln) return;
    put(&c->o, " + ");
    if (bw < 0) put(&c->o, "0.0f");
    else sj_cg_put_ref(c, bw);
}

/* The generator's own state (sj_cg.user). */
typedef struct cu {
    bool vec; /* inside the vector path: elements are x<k>[ix] / w<k>[ix] */
    /* A row kernel's variant (the row's length unknown): its row thread
     * count (0: not a variant, the length a literal) and the row lengths it
     * is launched for, [nmin, nmax]; the paths for other lengths are left
     * out. */
    unsigned nt;
    int64_t nmin, nmax;
    /* inside a row kernel's element-by-element path where a vector path
     * exists: the fallback for unaligned views, whose loops are not
     * unrolled (open_loop) */
    bool fallback;
    /* the paths of the row kernel being generated: both (chosen inside by
     * the vec flag), the vector path alone, or the fallback alone (a
     * kernel of its own: sj_codegen_opts.fallback_kernels) */
    enum { P_BOTH, P_VEC, P_FB } paths;
} cu;

static int last_axis(const sj_cg *c) { return c->G->rank - 1; }
static bool is_f(sj_dtype dt) { return sj_dtype_is_float(dt); }

/* Element ix of access k at the current row. */
static void put_elem(sj_cg *c, int k, const char *ix) {
    const cu *u = c->user;
    int in = sj_cg_inner(c, k);
    if (u->vec && ix && in == 1) put(&c->o, "%c%d[%s]", k < c->G->n_loads ? 'x' : 'w', k, ix);
    else if (!ix || in == 0) put(&c->o, "p%d[o%d]", k, k);
    else if (in == 1) put(&c->o, "p%d[o%d + %s]", k, k, ix);
    else put(&c->o, "p%d[o%d + %s * st%d_%d]", k, k, ix, k, last_axis(c));
}

/* -- Kernel frame ---------------------------------------------------------------- */

/* The kernel's signature, named <prefix><group name><suffix>, and its
 * sizes, strides and offsets; min_blocks > 0 adds a minimum of resident
 * blocks to the launch bounds. */
static void put_head(sj_cg *c, const char *prefix, const char *suffix, int max_threads, int min_blocks) {
    const sj_group *G = c->G;
    int ns = sj_sym_count(c->g->ex);
    put(&c->o, "%s", SJ_CUDA_KERNEL_MARK);
    put(&c->o, "extern \"C\" __global__ void __launch_bounds__(%d", max_threads);
    if (min_blocks > 0) put(&c->o, ", %d", min_blocks);
    put(&c->o, ") %s%s%s(", prefix, G->name, suffix);
    for (int k = 0; k < c->n_acc; k++) {
        const char *t = sj_cg_stype(sj_cg_acc_dtype(c, k));
        put(&c->o, "%s%s%s *__restrict__ p%d", k ? ", " : "", k < G->n_loads ? "const " : "", t, k);
    }
    for (int i = 0; i < ns; i++) put(&c->o, ", long long s%d", i);
    put(&c->o, ") {\nsj_rt_grid_dep();\n"); /* before any access (base/sj_kernel_rt.h) */
    for (int a = 0; a < G->rank; a++) {
        put(&c->o, "const int64_t n%d = ", a);
        sj_cg_put_ex(c, G->shape[a]);
        put(&c->o, "; (void)n%d;\n", a);
    }
    put(&c->o, "const int64_t rows = ");
    sj_cg_put_ex(c, G->rows);
    put(&c->o, ";\n");
    for (int k = 0; k < c->n_acc; k++) {
        const sj_access *x = c->acc[k];
        put(&c->o, "const int64_t b%d = ", k);
        sj_cg_put_ex(c, x->offset);
        put(&c->o, "; (void)b%d;\n", k);
        for (int a = 0; a < G->rank; a++) {
            put(&c->o, "const int64_t st%d_%d = ", k, a);
            sj_cg_put_ex(c, x->stride[a]);
            put(&c->o, "; (void)st%d_%d;\n", k, a);
        }
    }
}

/* The indices r0 .. r<L-1> of row `row` over the row axes [0, L) (by
 * division, in 32 bits when the row count fits), then each access's offset
 * o<k> at that row, then the hoisted loads. */
static void put_row_setup(sj_cg *c, int L) {
    int64_t rows;
    bool known = sj_cg_kconst(c, c->G->rows, &rows);
    if (L == 1) put(&c->o, "const int64_t r0 = row;\n");
    if (L >= 2) {
        put(&c->o, "int64_t r0");
        for (int a = 1; a < L; a++) put(&c->o, ", r%d", a);
        put(&c->o, ";\n{\n");
        for (int w = 32; w <= 64; w += 32) {
            bool fits = known && rows <= (int64_t)UINT32_MAX;
            if (known && fits != (w == 32)) continue;
            const char *t = w == 32 ? "uint32_t" : "int64_t";
            if (!known) put(&c->o, w == 32 ? "if (rows <= INT64_C(4294967295)) {\n" : "} else {\n");
            put(&c->o, "%s t = (%s)row, q;\n", t, t);
            for (int a = L - 1; a > 0; a--)
                put(&c->o, "q = t / (%s)n%d;\nr%d = t - q * (%s)n%d;\nt = q;\n", t, a, a, t, a);
            put(&c->o, "r0 = t;\n");
        }
        put(&c->o, known ? "}\n" : "}\n}\n");
    }
    for (int k = 0; k < c->n_acc; k++) {
        put(&c->o, "const int64_t o%d = b%d", k, k);
        for (int a = 0; a < L; a++) put(&c->o, " + r%d * st%d_%d", a, k, a);
        put(&c->o, "; (void)o%d;\n", k);
    }
    for (int k = 0; k < c->G->n_loads; k++)
        if (sj_cg_hoisted(c, k)) {
            sj_cg_put_load(c, k, NULL);
            put(&c->o, "(void)L%d;\n", k);
        }
}

/* -- POINTWISE ----------------------------------------------------------------------- */

/* Bytes each access's base must be aligned to for the vector path. */
static int vec_align(sj_dtype dt) {
    switch (dt) {
    case SJ_F16:
    case SJ_BF16: return 8;
    case SJ_BOOL: return 4;
    default: return 16; /* f32, i32; i64 as two 16-byte halves */
    }
}

/* Can the current group take the vector path at all (what generation
 * decides: inner strides a known 0 or 1, literal sizes that allow it)? */
static bool vec_possible(sj_cg *c) {
    const sj_group *G = c->G;
    int L = last_axis(c);
    int64_t v;
    if (sj_cg_kconst(c, G->shape[L], &v) && v % 4) return false;
    for (int k = 0; k < c->n_acc; k++) {
        int in = sj_cg_inner(c, k);
        if (in < 0) return false;
        if (in == 0) continue;
        if (sj_cg_kconst(c, c->acc[k]->offset, &v) && v % 4) return false;
        for (int a = 0; a < L; a++)
            if (sj_cg_kconst(c, c->acc[k]->stride[a], &v) && v % 4) return false;
    }
    return true;
}

/* `const bool vec = ...;` with what generation cannot decide; false when
 * the vector path is impossible for this group (nothing emitted). The
 * host's sj_cuda_vec_ok is the same test. */
static bool put_vec_flag(sj_cg *c) {
    const sj_group *G = c->G;
    int L = last_axis(c);
    int64_t v;
    if (!vec_possible(c)) return false;
    put(&c->o, "const bool vec = true");
    if (!sj_cg_kconst(c, G->shape[L], &v)) put(&c->o, "\n    && (n%d & 3) == 0", L);
    for (int k = 0; k < c->n_acc; k++) {
        if (sj_cg_inner(c, k) != 1) continue;
        put(&c->o, "\n    && ((unsigned long long)(p%d + b%d) & %d) == 0", k, k, vec_align(sj_cg_acc_dtype(c, k)) - 1);
        for (int a = 0; a < L; a++)
            if (!sj_cg_kconst(c, c->acc[k]->stride[a], &v)) put(&c->o, " && (st%d_%d & 3) == 0", k, a);
    }
    put(&c->o, ";\n");
    return true;
}

static void gen_pointwise(sj_cg *c) {
    const sj_group *G = c->G;
    cu *u = c->user;
    int L = last_axis(c), n_pos = G->n_nodes;
    put(&c->o, "const int64_t cb = (int64_t)blockIdx.x * %d;\n", PW_CHUNK);
    bool vec = put_vec_flag(c);
    put(&c->o, "for (int64_t row = blockIdx.y; row < rows; row += gridDim.y) {\n");
    put_row_setup(c, L);
    sj_cg_reset_want(c);
    sj_cg_want_stores(c, 0, n_pos);
    sj_cg_close_want(c);
    if (vec) {
        /* PW_VECS chunks of 4, PW_BLOCK * 4 apart: every load is issued
         * before the first use, so a thread keeps PW_VECS 16-byte loads of
         * each access in flight */
        put(&c->o, "if (vec) {\nconst int64_t c = cb + 4 * (int64_t)threadIdx.x;\n");
        sj_cg_mark_loads(c, NULL, 0);
        for (int k = 0; k < G->n_loads; k++)
            if (c->lw[k] && !sj_cg_hoisted(c, k))
                put(&c->o, "%s x%d[%d];\n#pragma unroll\nfor (int h = 0; h < %d; h++)\n"
                           "if (c + h * %d < n%d) sj_ld4(p%d + o%d + c + h * %d, x%d + 4 * h);\n",
                    sj_cg_stype(sj_cg_acc_dtype(c, k)), k, 4 * PW_VECS, PW_VECS, 4 * PW_BLOCK, L, k, k,
                    4 * PW_BLOCK, k);
        for (int k = G->n_loads; k < c->n_acc; k++)
            put(&c->o, "%s w%d[%d];\n", sj_cg_stype(sj_cg_acc_dtype(c, k)), k, 4 * PW_VECS);
        put(&c->o, "#pragma unroll\nfor (int j = 0; j < %d; j++) {\nif (c + (j >> 2) * %d < n%d) {\n", 4 * PW_VECS,
            4 * PW_BLOCK, L);
        u->vec = true;
        sj_cg_put_loads(c, "j", NULL, 0);
        sj_cg_put_nodes(c, 0, n_pos);
        sj_cg_put_stores(c, 0, n_pos, "j");
        u->vec = false;
        put(&c->o, "}\n}\n");
        for (int k = G->n_loads; k < c->n_acc; k++)
            put(&c->o, "#pragma unroll\nfor (int h = 0; h < %d; h++)\n"
                       "if (c + h * %d < n%d) sj_st4(p%d + o%d + c + h * %d, w%d + 4 * h);\n",
                PW_VECS, 4 * PW_BLOCK, L, k, k, 4 * PW_BLOCK, k);
        put(&c->o, "} else {\n");
    }
    put(&c->o, "#pragma unroll\nfor (int j = 0; j < %d; j++) {\n", 4 * PW_VECS);
    put(&c->o, "const int64_t c = cb + threadIdx.x + %d * j;\nif (c < n%d) {\n", PW_BLOCK, L);
    sj_cg_put_loads(c, "c", NULL, 0);
    sj_cg_put_nodes(c, 0, n_pos);
    sj_cg_put_stores(c, 0, n_pos, "c");
    put(&c->o, "}\n}\n");
    if (vec) put(&c->o, "}\n");
    put(&c->o, "}\n");
}

/* -- ROW ------------------------------------------------------------------------------- */

typedef sj_cg_rowop rowop;

/* How a pass walks the thread's elements of the row:
 *   SHARED  element by element (j = tid, tid + nt, ...), the row op's input
 *           cached in shared memory (cache[j]);
 *   SCALAR  the same without a cache (recomputed from memory each pass);
 *   VREG    4-element chunks (j0 = 4 (tid + i nt), i < rc: unrolled, so the
 *           cache rc[i][jj] lives in registers), 16-byte loads and stores;
 *   VSHARED 4-element chunks in a plain loop, the cache in shared memory,
 *           moved 16 bytes at a time through cx[4] (no bank conflicts);
 *   VSTREAM 4-element chunks in a plain loop, no cache. */
typedef enum { M_SHARED, M_SCALAR, M_VREG, M_VSHARED, M_VSTREAM } rmode;

static bool vmode(rmode m) { return m == M_VREG || m == M_VSHARED || m == M_VSTREAM; }
static bool cmode(rmode m) { return m == M_SHARED || m == M_VREG || m == M_VSHARED; }

/* The cached element of the current position. */
static const char *slot(rmode m) { return m == M_VREG ? "rc[i][jj]" : m == M_VSHARED ? "cx[jj]" : "cache[j]"; }

/* What a pass does with the cache (M_VSHARED moves it per chunk). */
enum { C_NONE = 0, C_READ = 1, C_WRITE = 2 };

/* Is store k (contiguous along the row) written by positions [lo, hi)? */
static bool vstore_in(const sj_cg *c, int k, int lo, int hi) {
    int q = c->vpos[c->acc[k]->val];
    return q >= lo && q < hi && sj_cg_inner(c, k) == 1;
}

/* Open a loop over the thread's elements; in the vector modes also load
 * the marked loads (c->lw, set by the caller) as chunks and declare the
 * chunks of the stores from positions [slo, shi). Inside, `j` is the
 * element (vector modes: j0 + jj). */
static void open_loop(sj_cg *c, rmode m, int slo, int shi, int cache_use) {
    int L = last_axis(c);
    /* a variant's literal thread count makes ptxas unroll these loops: twice
     * the compile time of a symbolic unit, for the paths of rows that do
     * not fit the registers; so does a literal row length, in the
     * element-by-element fallback of a kernel with a vector path, which
     * only unaligned views take: unrolled, it was 40% of the f16 encoder's
     * layer-norm kernel's NVRTC time (210 -> 160 ms of CPU; the same
     * arithmetic in the same order) */
    const cu *u = c->user;
    const char *once = u->nt || u->fallback ? "#pragma unroll 1\n" : "";
    if (!vmode(m)) {
        put(&c->o, "%sfor (int64_t j = tid; j < n%d; j += nt) {\n", once, L);
        return;
    }
    if (m == M_VREG)
        put(&c->o, "#pragma unroll\nfor (int i = 0; i < RC; i++) {\nconst int64_t j0 = 4 * (tid + i * nt);\n"
                   "if (j0 < n%d) {\n", L);
    else put(&c->o, "%sfor (int64_t j0 = 4 * tid; j0 < n%d; j0 += 4 * nt) {\n{\n", once, L);
    if (m == M_VSHARED) put(&c->o, "float cx[4];\n%s", cache_use & C_READ ? "sj_ld4(cache + j0, cx);\n" : "");
    for (int k = 0; k < c->G->n_loads; k++)
        if (c->lw[k] && !sj_cg_hoisted(c, k))
            put(&c->o, "%s x%d[4];\nsj_ld4(p%d + o%d + j0, x%d);\n", sj_cg_stype(sj_cg_acc_dtype(c, k)), k, k, k, k);
    for (int k = c->G->n_loads; k < c->n_acc; k++)
        if (vstore_in(c, k, slo, shi)) put(&c->o, "%s w%d[4];\n", sj_cg_stype(sj_cg_acc_dtype(c, k)), k);
    put(&c->o, "#pragma unroll\nfor (int jj = 0; jj < 4; jj++) {\nconst int64_t j = j0 + jj; (void)j;\n");
    ((cu *)c->user)->vec = true;
}

static void close_loop(sj_cg *c, rmode m, int slo, int shi, int cache_use) {
    if (!vmode(m)) {
        put(&c->o, "}\n");
        return;
    }
    ((cu *)c->user)->vec = false;
    put(&c->o, "}\n");
    if (m == M_VSHARED && (cache_use & C_WRITE)) put(&c->o, "sj_st4(cache + j0, cx);\n");
    for (int k = c->G->n_loads; k < c->n_acc; k++)
        if (vstore_in(c, k, slo, shi)) put(&c->o, "sj_st4(p%d + o%d + j0, w%d);\n", k, k, k);
    put(&c->o, "}\n}\n");
}

/* A loop over the cached elements only (no loads): `body` at each. */
static void put_cache_loop(sj_cg *c, rmode m, const char *body, int cache_use) {
    memset(c->lw, 0, sizeof c->lw);
    open_loop(c, m, 0, 0, cache_use);
    put(&c->o, "%s", body);
    close_loop(c, m, 0, 0, cache_use);
}

/* A pass over the thread's elements of the row: the prologue up to the row
 * op's input, bound to `x`, then `then`; with the prologue's stores when
 * `stores` (the first pass). */
static void put_pass(sj_cg *c, const rowop *R, rmode m, bool stores, const char *then) {
    int shi = stores ? c->rp : 0;
    sj_cg_reset_want(c);
    sj_cg_want_val(c, R->x);
    if (stores) sj_cg_want_stores(c, 0, c->rp);
    sj_cg_close_want(c);
    sj_cg_mark_loads(c, &R->x, 1);
    int cu_ = stores && cmode(m) ? C_WRITE : C_NONE; /* the first pass fills the cache */
    open_loop(c, m, 0, shi, cu_);
    sj_cg_put_loads(c, vmode(m) ? "jj" : "j", &R->x, 1);
    sj_cg_put_nodes(c, 0, c->rp);
    if (stores) sj_cg_put_stores(c, 0, c->rp, vmode(m) ? "jj" : "j");
    put(&c->o, "const %s x = ", sj_cg_ctype(R->dt));
    sj_cg_put_ref(c, R->x);
    put(&c->o, ";\n%s", then);
    close_loop(c, m, 0, shi, cu_);
}

/* `var = reduce(var)` over the row's threads. */
static void put_reduce(sj_cg *c, const char *var, const char *id, const char *op, const char *t) {
    put(&c->o, "%s = sj_cu_reduce(%s, (%s)%s, sj_cu_%s(), (%s *)sj_red, nt);\n", var, var, t, id, op, t);
}

/* The per-element output pass of softmax and the norms: the row op's value
 * (from the cache or recomputed), the epilogue, the stores. */
static void put_out_pass(sj_cg *c, const rowop *R, rmode m) {
    int n_pos = c->G->n_nodes;
    bool cached = cmode(m);
    bool softmax = R->n->op == SJ_OP_SOFTMAX;
    bool x_in_cache = cached && !softmax; /* the cache holds x (softmax: exp) */
    int32_t extra[3] = {cached ? -1 : R->x, R->gw, R->bw};
    sj_cg_reset_want(c);
    c->want[c->rp] = true;
    sj_cg_want_stores(c, c->rp + 1, n_pos);
    if (x_in_cache && c->vpos[R->x] >= 0) c->avail[c->vpos[R->x]] = true;
    for (int i = 0; i < 3; i++) sj_cg_want_val(c, extra[i]);
    sj_cg_close_want(c);
    sj_cg_mark_loads(c, extra, 3);
    open_loop(c, m, c->rp, n_pos, cached ? C_READ : C_NONE);
    if (x_in_cache && c->vpos[R->x] >= 0) put(&c->o, "const float v%d = %s;\n", (int)R->x, slot(m));
    sj_cg_put_loads(c, vmode(m) ? "jj" : "j", extra, 3);
    sj_cg_put_nodes(c, 0, c->rp);
    put(&c->o, "const float v%d = ", (int)R->n->out);
    if (softmax) {
        if (cached) put(&c->o, "%s * inv;\n", slot(m));
        else put(&c->o, "sj_rt_expf("), sj_cg_put_ref(c, R->x), put(&c->o, " - mm) * inv;\n");
    } else {
        put(&c->o, "(");
        if (x_in_cache && c->vpos[R->x] < 0) put(&c->o, "%s", slot(m));
        else sj_cg_put_ref(c, R->x);
        put_norm_tail(c, R->n, R->gw, R->bw);
        put(&c->o, ";\n");
    }
    sj_cg_put_nodes(c, c->rp + 1, n_pos);
    sj_cg_put_stores(c, c->rp, n_pos, vmode(m) ? "jj" : "j");
    close_loop(c, m, c->rp, n_pos, C_NONE);
}

/* Softmax or a norm over one row, in mode m. */
static void put_row_body(sj_cg *c, const rowop *R, rmode m) {
    int L = last_axis(c);
    bool cached = cmode(m);
    char then[160];
    const char *sl = slot(m);
    if (m == M_SHARED || m == M_VSHARED) put(&c->o, "float *const cache = sj_dyn + (int64_t)threadIdx.y * n%d;\n", L);
    if (m == M_VREG) put(&c->o, "float rc[RC][4];\n");
    switch (R->n->op) {
    case SJ_OP_SOFTMAX:
        put(&c->o, "float m = -INFINITY, s = 0.0f;\n");
        snprintf(then, sizeof then, "%s%s%sm = sj_rt_max_combine(m, x);\n", cached ? sl : "", cached ? " = x;\n" : "",
                 "");
        put_pass(c, R, m, true, then);
        put_reduce(c, "m", "-INFINITY", "fmax", "float");
        put(&c->o, "const float mm = m == -INFINITY ? 0.0f : m; /* all -inf: zeros */\n");
        if (cached) {
            snprintf(then, sizeof then, "const float e = sj_rt_expf(%s - mm);\n%s = e;\ns += e;\n", sl, sl);
            put_cache_loop(c, m, then, C_READ | C_WRITE);
        } else {
            put_pass(c, R, m, false, "s += sj_rt_expf(x - mm);\n");
        }
        put_reduce(c, "s", "0.0f", "fadd", "float");
        put(&c->o, "const float inv = m == -INFINITY ? 0.0f : 1.0f / s;\n");
        break;
    case SJ_OP_LAYER_NORM:
        /* mean: the f32 sum's; cm: what it is off by, from the centred
         * values' own sum (exact-ish where x is near the mean), so a row
         * whose spread is small against its mean keeps its digits; the
         * variance corrected by cm^2 (the corrected two-pass formula) */
        put(&c->o, "float s = 0.0f, q = 0.0f, sc = 0.0f;\n");
        snprintf(then, sizeof then, "%s%ss += x;\n", cached ? sl : "", cached ? " = x;\n" : "");
        put_pass(c, R, m, true, then);
        put_reduce(c, "s", "0.0f", "fadd", "float");
        put(&c->o, "const float mean = s / (float)n%d;\n", L);
        if (cached) {
            snprintf(then, sizeof then, "const float d = %s - mean;\nq += d * d;\nsc += d;\n", sl);
            put_cache_loop(c, m, then, C_READ);
        } else {
            put_pass(c, R, m, false, "const float d = x - mean;\nq += d * d;\nsc += d;\n");
        }
        put(&c->o, "sj_cu_sum2(q, sc, (float2 *)sj_red, nt);\n");
        put(&c->o, "const float cm = sc / (float)n%d, var = q / (float)n%d - cm * cm;\n", L, L);
        put(&c->o, "const float rstd = 1.0f / sqrtf((var < 0.0f ? 0.0f : var) + ");
        sj_cg_put_float(c, (float)R->n->a.f);
        put(&c->o, ");\n");
        break;
    default: /* RMS norm */
        put(&c->o, "float q = 0.0f;\n");
        snprintf(then, sizeof then, "%s%sq += x * x;\n", cached ? sl : "", cached ? " = x;\n" : "");
        put_pass(c, R, m, true, then);
        put_reduce(c, "q", "0.0f", "fadd", "float");
        put(&c->o, "const float r = 1.0f / sqrtf(q / (float)n%d + ", L);
        sj_cg_put_float(c, (float)R->n->a.f);
        put(&c->o, ");\n");
        break;
    }
    put_out_pass(c, R, m);
}

/* sum / mean / amax: one pass, the tree, then thread 0 runs the epilogue. */
static void put_reduce_body(sj_cg *c, const rowop *R, rmode m) {
    int L = last_axis(c), n_pos = c->G->n_nodes;
    int32_t y = R->n->out;
    bool amax = R->n->op == SJ_OP_AMAX;
    if (is_f(R->dt)) {
        put(&c->o, "float a = %s;\n", amax ? "-INFINITY" : "0.0f");
        put_pass(c, R, m, true, amax ? "a = sj_rt_max_combine(a, x);\n" : "a += x;\n");
        if (amax) put_reduce(c, "a", "-INFINITY", "fmax", "float");
        else put_reduce(c, "a", "0.0f", "fadd", "float");
        if (R->n->op == SJ_OP_MEAN)
            put(&c->o, "const float v%d = n%d ? a / (float)n%d : NAN;\n", (int)y, L, L);
        else put(&c->o, "const float v%d = a;\n", (int)y);
    } else {
        put(&c->o, amax ? "int64_t a = INT64_MIN;\n" : "uint64_t a = 0;\n");
        put_pass(c, R, m, true, amax ? "a = x > a ? x : a;\n" : "a += (uint64_t)x;\n");
        if (amax) put_reduce(c, "a", "INT64_MIN", "imax", "int64_t");
        else put_reduce(c, "a", "0", "uadd", "uint64_t");
        put(&c->o, "const int64_t v%d = %s(%s);\n", (int)y, R->dt == SJ_I32 ? "sj_rt_wrap32" : "",
            amax ? "a" : "sj_rt_i64_from_u(a)");
    }
    sj_cg_reset_want(c);
    c->avail[c->rp] = true;
    sj_cg_want_stores(c, c->rp + 1, n_pos);
    sj_cg_close_want(c);
    put(&c->o, "if (tid == 0) {\n");
    sj_cg_put_loads(c, NULL, NULL, 0);
    sj_cg_put_nodes(c, c->rp + 1, n_pos);
    sj_cg_put_stores(c, c->rp, n_pos, NULL);
    put(&c->o, "}\n");
}

/* Threads of a block-per-row block for rows of n > ROW_WARP_MAX elements:
 * a power of two in [128, ROW_THREADS_MAX], at least 8 elements each. */
static unsigned row_threads(int64_t n) {
    unsigned t = 128;
    while (t < ROW_THREADS_MAX && (int64_t)t * 8 < n) t *= 2;
    return t;
}

/* The shortest row variant v is launched for. */
static int64_t row_nmin(int v) { return v == 0 ? 0 : row_vs[v - 1].nmax + 1; }

/* The 4-element chunks a thread of variant u needs to keep every row it
 * is launched for in registers; 0 when past ROW_RC (then rows of at most 2
 * chunks a thread are kept in registers, longer ones in shared memory). */
static int row_rc_all(const cu *u) {
    if (u->nmax > (int64_t)ROW_RC * 4 * u->nt) return 0;
    return (int)((u->nmax + 4 * (int64_t)u->nt - 1) / (4 * (int64_t)u->nt));
}

/* A cached row body. With the chunk count unknown (the symbolic form): a
 * variant's rows in registers when they all fit ROW_RC chunks a thread (v0,
 * v1), else rows of at most 2 chunks a thread in registers and longer ones
 * in shared memory; a register cache sized for the longest row would cost
 * every row registers (they are allocated per kernel), hence occupancy. */
static void put_cached_body(sj_cg *c, const rowop *R, rmode m) {
    int64_t nl;
    if (m != M_VREG || sj_cg_kconst(c, c->G->shape[last_axis(c)], &nl)) {
        put_row_body(c, R, m);
        return;
    }
    const cu *u = c->user; /* the row's length unknown: a variant */
    /* a variant whose rows all fit the register cache keeps them there */
    int rc = row_rc_all(u);
    bool in_regs = rc > 0 || u->nmin <= 8 * (int64_t)u->nt;
    bool in_shared = rc == 0 && u->nmax > 8 * (int64_t)u->nt;
    if (in_regs && in_shared) put(&c->o, "if (n%d <= 8 * nt) {\n", last_axis(c));
    if (in_regs) {
        put(&c->o, "{\nconstexpr int RC = %d;\n", rc > 0 ? rc : 2);
        put_row_body(c, R, M_VREG);
        put(&c->o, "}\n");
    }
    if (in_regs && in_shared) put(&c->o, "} else {\n");
    if (in_shared) put_row_body(c, R, M_VSHARED);
    if (in_regs && in_shared) put(&c->o, "}\n");
}

/* The body of one row in the vector mode or (vec false) the scalar one,
 * cached when the row fits (chosen at run time in the symbolic form). */
static void put_row_modes(sj_cg *c, const rowop *R, bool vec) {
    int L = last_axis(c);
    const cu *u = c->user;
    int64_t nl;
    bool known = sj_cg_kconst(c, c->G->shape[L], &nl);
    bool cache = known ? nl <= ROW_CACHE : u->nmin <= ROW_CACHE;
    bool recompute = known ? nl > ROW_CACHE : u->nmax > ROW_CACHE;
    rmode cm = vec ? M_VREG : M_SHARED, sm = vec ? M_VSTREAM : M_SCALAR;
    if (R->reduce) put_reduce_body(c, R, sm);
    else if (cache && recompute) {
        put(&c->o, "if (n%d <= %d) {\n", L, ROW_CACHE);
        put_cached_body(c, R, cm);
        put(&c->o, "} else {\n");
        put_row_body(c, R, sm);
        put(&c->o, "}\n");
    } else if (cache) put_cached_body(c, R, cm);
    else put_row_body(c, R, sm);
}

/* Register-cache chunks a thread needs for rows of a known length n (the
 * loop skips those past n). */
static int row_rc_known(int64_t n) {
    if (n > ROW_CACHE) return ROW_RC;
    int64_t nt = n <= ROW_WARP_MAX ? 32 : row_threads(n);
    int rc = (int)((n + 4 * nt - 1) / (4 * nt));
    return rc < 1 ? 1 : rc;
}

static void gen_row(sj_cg *c) {
    const sj_group *G = c->G;
    int L = last_axis(c);
    rowop R = sj_cg_row_op(c);
    int64_t nl;
    bool known = sj_cg_kconst(c, G->shape[L], &nl);
    bool cache = !R.reduce && (!known || nl <= ROW_CACHE);
    put(&c->o, "__shared__ uint64_t sj_red[32];\n");
    if (cache) put(&c->o, "extern __shared__ __align__(16) float sj_dyn[];\n");
    /* the threads of a row: a literal when the size decides the launch */
    if (known) put(&c->o, "const int64_t tid = threadIdx.x, nt = %u;\n", nl <= ROW_WARP_MAX ? 32u : row_threads(nl));
    else put(&c->o, "const int64_t tid = threadIdx.x, nt = %u; /* this variant's */\n", ((cu *)c->user)->nt);
    put(&c->o, "constexpr int RC = %d; (void)RC;\n", known ? row_rc_known(nl) : ROW_RC);
    cu *u = c->user;
    /* the vector kernel of a split pair keeps its flag (the same code as
     * the pair's one kernel) and does nothing without it */
    bool vec = u->paths != P_FB && put_vec_flag(c);
    put(&c->o, "for (int64_t row = (int64_t)blockIdx.x * blockDim.y + threadIdx.y; row < rows;"
               " row += (int64_t)gridDim.x * blockDim.y) {\n");
    put_row_setup(c, L);
    if (vec) {
        put(&c->o, "if (vec) {\n");
        put_row_modes(c, &R, true);
    }
    if (u->paths != P_VEC) {
        if (vec) put(&c->o, "} else {\n");
        u->fallback = vec || u->paths == P_FB;
        put_row_modes(c, &R, false);
        u->fallback = false;
    }
    if (vec) put(&c->o, "}\n");
    put(&c->o, "}\n");
}

/* -- Generated products ------------------------------------------------------------------ */

/* The spec of generated product G (fusion.h's "Generated products"). */
void sj_codegen_gemm_spec(const sj_graph *g, const sj_group *G, sj_gemm_spec *sp) {
    const sj_node *mm = &g->nodes[G->nodes[0]];
    const sj_value *B = &g->vals[sj_node_ins(g, mm)[1]];
    int nt;
    memset(sp, 0, sizeof *sp);
    sj_ex_is_const(g->ex, B->shape[0], &sp->K);
    sj_ex_is_const(g->ex, B->shape[1], &sp->N);
    sp->M = 0; /* the kernel's argument: every M of the entry */
    sp->bias = G->bias >= 0;
    sp->bias_dtype = sp->bias ? g->vals[G->bias].dtype : SJ_F16;
    sp->gelu = (G->gemm_epi & SJ_GEMM_GELU) != 0;
    sp->relu = (G->gemm_epi & SJ_GEMM_RELU) != 0;
    sp->residual = (G->gemm_epi & SJ_GEMM_RES) != 0;
    sp->round_prod = (G->gemm_epi & SJ_GEMM_R_PROD) != 0;
    sp->round_act = (G->gemm_epi & SJ_GEMM_R_ACT) != 0;
    sp->round_res = (G->gemm_epi & SJ_GEMM_R_RES) != 0;
    sp->res_dtype = sp->residual ? g->vals[G->gemm_res].dtype : SJ_F16;
    sp->out_dtype = g->vals[G->gemm_out].dtype;
    if (G->gemm_epi & SJ_GEMM_LN) { /* the next group's layer norm inside */
        const sj_node *ln = &g->nodes[G->gemm_ln];
        const int32_t *in = sj_node_ins(g, ln);
        sp->ln = true;
        sp->ln_gamma = ln->n_in > 1 && in[1] >= 0;
        sp->ln_beta = ln->n_in > 2 && in[2] >= 0;
        sp->ln_g_dtype = sp->ln_gamma ? g->vals[in[1]].dtype : SJ_F16;
        sp->ln_b_dtype = sp->ln_beta ? g->vals[in[2]].dtype : SJ_F16;
        sp->ln_out_dtype = g->vals[ln->out].dtype;
        sp->ln_eps = ln->a.f;
    }
    sp->tile = sj_gemm_cuda_tiles(&nt)[G->gemm_tile];
}

/* Variant v of generated product G as a kernel of the unit (M a constant where every
 * size is, else the kernel's argument): the generator's own unit
 * (its macros and helpers) in a namespace of its own, its macros undone
 * at its end (by the generator, which knows them), so that any number of
 * them, and any split of the unit, compile. */
static bool put_gemm(sj_cg *c, const sj_group *G, const char *prefix, int v) {
    const sj_graph *g = c->g;
    sj_sbuf *o = &c->o;
    sj_gemm_spec sp;
    char name[64], ns[32];
    int nt;
    sj_codegen_gemm_spec(g, G, &sp);
    sp.tile = sj_gemm_cuda_tiles(&nt)[G->gemm_tiles[v]];
    /* every size known (specialized, or a trace without symbols): M a
     * constant of the kernel too */
    const sj_value *Y = &g->vals[G->gemm_out];
    int64_t M = 1, d;
    for (int a = 0; a + 1 < Y->rank && M > 0; a++) M = sj_cg_kconst(c, Y->shape[a], &d) ? M * d : -1;
    if (M > 0) sp.M = M;
    if (G->gemm_nv > 1) snprintf(name, sizeof name, "%s%s_v%d", prefix, G->name, v);
    else snprintf(name, sizeof name, "%s%s", prefix, G->name);
    snprintf(ns, sizeof ns, "gemm_%s_v%d", G->name, v);
    char *src = sj_codegen_gemm_cuda(&sp, name, NULL);
    if (!src) return false;
    /* (a quick unit: a stub, SJ_CUDA_QUICK_MACRO) */
    put(o, "%s#ifndef " SJ_CUDA_QUICK_MACRO "\nnamespace %s {\n%s} /* namespace %s */\n#else\n"
           "extern \"C\" __global__ void %s() { __trap(); }\n#endif\n", SJ_CUDA_KERNEL_MARK, ns, src, ns, name);
    free(src);
    return true;
}

/* -- Entry points ------------------------------------------------------------------------- */

char *sj_codegen_cuda(const sj_graph *g, const sj_fplan *p, const int64_t *sym_vals, const sj_codegen_opts *o,
                      size_t *len) {
    sj_cg c;
    cu u = {0};
    const char *prefix = o && o->prefix ? o->prefix : "";
    sj_cg_init(&c, g, p, sym_vals);
    c.elem = put_elem;
    c.user = &u;
    c.test_skew = o ? o->test_skew : 0;
    put(&c.o, "%s", prelude_head);
    put(&c.o, "%s", sj_kernel_rt_text);
    put(&c.o, "%s", prelude_tail);
    put(&c.o, "\n/* -- generated: %d groups, %s form -- */\n", p->n_generated, sym_vals ? "specialized" : "symbolic");
    for (int gi = 0; gi < p->n_groups && !c.o.oom; gi++) {
        const sj_group *G = &p->groups[gi];
        if (G->kind == SJ_G_NODE) {
            /* a generated product: a kernel per tile variant */
            bool ok = G->gemm_tile >= 0 && G->gemm_nv >= 1 && G->gemm_nv <= SJ_CG_FALLBACK;
            for (int v = 0; ok && v < G->gemm_nv; v++) ok = put_gemm(&c, G, prefix, v);
            if (ok && o && o->variants) o->variants[gi] = G->gemm_nv;
            continue;
        }
        sj_cg_group(&c, G);
        if (G->kind == SJ_G_POINTWISE) {
            if (o && o->variants) o->variants[gi] = 1;
            put_head(&c, prefix, "", PW_BLOCK, 0);
            gen_pointwise(&c);
            put(&c.o, "}\n");
            continue;
        }
        /* every size a literal: specialized, or a trace without symbols */
        bool literal = c.sym || sj_sym_count(g->ex) == 0;
        int max_threads = ROW_THREADS_MAX > ROW_WARPS * 32 ? ROW_THREADS_MAX : ROW_WARPS * 32;
        /* the row's length unknown: a kernel per row thread count */
        int64_t nl;
        int nv = sj_cg_kconst(&c, G->shape[G->rank - 1], &nl) ? 1 : ROW_VARIANTS;
        if (o && o->variants) o->variants[gi] = nv;
        /* one kernel with a vector path: its fallback as a kernel of its own */
        bool fb = nv == 1 && o && o->fallback_kernels && vec_possible(&c);
        if (o && o->fallbacks) o->fallbacks[gi] = fb;
        for (int v = 0; v < nv + fb; v++) {
            char suffix[8] = "";
            if (nv > 1) snprintf(suffix, sizeof suffix, "_v%d", v);
            if (v == nv) snprintf(suffix, sizeof suffix, "_fb");
            u.paths = !fb ? P_BOTH : v < nv ? P_VEC : P_FB;
            sj_cg_group(&c, G); /* each variant from the group's start */
            u.nt = nv > 1 ? row_vs[v].nt : 0;
            u.nmin = nv > 1 ? row_nmin(v) : 0;
            u.nmax = nv > 1 ? row_vs[v].nmax : INT64_MAX;
            /* a variant holding rows of more than 2 chunks a thread in
             * registers is bounded as a specialized kernel, by its block;
             * so is a symbolic kernel whose rows, of a known length, it
             * caches in more than 2 chunks (the encoder's norms over 768: 6
             * chunks, which spilled 100 bytes under the 40-register cap);
             * reductions cache nothing */
            bool big_rc = nv > 1 && row_rc_all(&u) > 2;
            bool known_rc = nv == 1 && sj_op_kind_of(g->nodes[G->row_node].op) != SJ_K_REDUCE &&
                            nl <= ROW_CACHE && row_rc_known(nl) > 2;
            /* so is a split pair's kernel of rows a warp takes: alone, the
             * vector kernel of MiniLM's norms over 384 (f32) got 40
             * registers and spilled 20 bytes under the bound of 512 threads
             * (44 and none under its block's 256; the one kernel: 52) */
            int bound = big_rc ? (int)u.nt * (u.nt == 32 ? ROW_WARPS : 1) : max_threads;
            if (fb && nl <= ROW_WARP_MAX) bound = 32 * ROW_WARPS;
            put_head(&c, prefix, suffix, bound, literal || big_rc || known_rc ? 0 : ROW_SYM_MIN_BLOCKS);
            gen_row(&c);
            put(&c.o, "}\n");
        }
        u.paths = P_BOTH;
    }
    return sj_cg_take(&c, len);
}

static unsigned clampu(int64_t v, int64_t hi) { return (unsigned)(v < hi ? v : hi); }

int sj_cuda_launch(const sj_group *gr, const int64_t *exv, int sm_count, sj_launch *out) {
    memset(out, 0, sizeof *out);
    if (gr->kind == SJ_G_NODE) return 0;
    int64_t rows = exv[gr->rows], n = exv[gr->shape[gr->rank - 1]];
    if (rows <= 0 || n < 0) return 0;
    out->grid[1] = out->grid[2] = out->block[1] = out->block[2] = 1;
    if (gr->kind == SJ_G_POINTWISE) {
        if (n == 0) return 0;
        out->block[0] = PW_BLOCK;
        out->grid[0] = clampu((n + PW_CHUNK - 1) / PW_CHUNK, GRID_X_MAX); /* n < 2^41 in practice */
        /* rows looped over by at most PW_BLOCKS_PER_SM blocks per SM in all:
         * fewer, longer-lived blocks (w1 on an H200: 0.170 -> 0.157 ms) */
        int64_t cap = (int64_t)(sm_count > 0 ? sm_count : 1) * PW_BLOCKS_PER_SM / out->grid[0];
        out->grid[1] = clampu(rows < cap ? rows : cap > 0 ? cap : 1, GRID_Y_MAX);
        return 1;
    }
    /* ROW: rows of length 0 still run (a reduction's epilogue writes) */
    if (n <= ROW_WARP_MAX) {
        int64_t r = ROW_WARPS;
        while (r > 1 && (rows + r - 1) / r < (sm_count > 0 ? sm_count : 1)) r /= 2; /* spread few rows */
        out->block[0] = 32;
        out->block[1] = (unsigned)r;
        out->grid[0] = clampu((rows + r - 1) / r, GRID_X_MAX);
        if (sm_count > 0 && out->grid[0] > (unsigned)(sm_count * ROW_BLOCKS_PER_SM))
            out->grid[0] = (unsigned)(sm_count * ROW_BLOCKS_PER_SM);
        out->smem = (unsigned)(r * n * 4);
    } else {
        out->block[0] = row_threads(n);
        out->grid[0] = clampu(rows, GRID_X_MAX);
        if (sm_count > 0 && out->grid[0] > (unsigned)(sm_count * ROW_BLOCKS_PER_SM))
            out->grid[0] = (unsigned)(sm_count * ROW_BLOCKS_PER_SM);
        out->smem = n <= ROW_CACHE ? (unsigned)(n * 4) : 0;
    }
    while (out->variant + 1 < ROW_VARIANTS && n > row_vs[out->variant].nmax) out->variant++;
    return 1;
}

/* -- The vector path's test on the host ------------------------------------------------- */

bool sj_cuda_vec_ok(const sj_graph *g, const sj_group *gr, const int64_t *exv, void *const *ptrs) {
    int L = gr->rank - 1;
    if (exv[gr->shape[L]] & 3) return false;
    for (int k = 0; k < gr->n_loads + gr->n_stores; k++) {
        const sj_access *x = k < gr->n_loads ? &gr->loads[k] : &gr->stores[k - gr->n_loads];
        int64_t in = exv[x->stride[L]];
        if (in == 0) continue;
        if (in != 1) return false;
        sj_dtype dt = g->vals[x->val].dtype;
        uintptr_t at = (uintptr_t)ptrs[k] + (uintptr_t)(exv[x->offset] * (int64_t)sj_dtype_size(dt));
        if (at & (uintptr_t)(vec_align(dt) - 1)) return false;
        for (int a = 0; a < L; a++)
            if (exv[x->stride[a]] & 3) return false;
    }
    return true;
}

/* -- Splitting a unit --------------------------------------------------------------------- */

/* The kernels' starts in src (after the marks), at most cap; their count. */
static int kernel_starts(const char *src, const char **at, int cap) {
    int n = 0;
    size_t ml = strlen(SJ_CUDA_KERNEL_MARK);
    for (const char *p = strstr(src, SJ_CUDA_KERNEL_MARK); p; p = strstr(p + ml, SJ_CUDA_KERNEL_MARK)) {
        if (n < cap) at[n] = p;
        n++;
    }
    return n;
}

int sj_codegen_cuda_split(const char *src, int max_pieces, char **pieces) {
    enum { KMAX = 1024 };
    const char *at[KMAX];
    int k = kernel_starts(src, at, KMAX);
    int n = k < max_pieces ? k : max_pieces;
    if (k > KMAX || n <= 1) { /* whole */
        if (max_pieces < 1) return 0;
        return (pieces[0] = strdup(src)) ? 1 : -1;
    }
    size_t total = strlen(src), head = (size_t)(at[0] - src);
    size_t len[KMAX], load[SJ_CUDA_PIECES_MAX] = {0};
    int piece[KMAX], order[KMAX];
    for (int i = 0; i < k; i++) {
        len[i] = (size_t)((i + 1 < k ? at[i + 1] : src + total) - at[i]);
        order[i] = i;
    }
    if (n > SJ_CUDA_PIECES_MAX) n = SJ_CUDA_PIECES_MAX;
    /* longest kernel first, each to the lightest piece so far */
    for (int i = 1; i < k; i++)
        for (int j = i; j > 0 && len[order[j]] > len[order[j - 1]]; j--) {
            int t = order[j];
            order[j] = order[j - 1], order[j - 1] = t;
        }
    for (int i = 0; i < k; i++) {
        int best = 0;
        for (int p = 1; p < n; p++)
            if (load[p] < load[best]) best = p;
        piece[order[i]] = best;
        load[best] += len[order[i]];
    }
    for (int p = 0; p < n; p++) {
        char *s = malloc(head + load[p] + 1);
        if (!s) {
            for (int q = 0; q < p; q++) free(pieces[q]);
            return -1;
        }
        memcpy(s, src, head);
        size_t used = head;
        for (int i = 0; i < k; i++) /* the unit's order */
            if (piece[i] == p) memcpy(s + used, at[i], len[i]), used += len[i];
        s[used] = '\0';
        pieces[p] = s;
    }
    return n;
}
