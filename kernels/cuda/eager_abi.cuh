/* The interface between the eager CUDA kernels (kernels/cuda/eager.cu, nvcc)
 * and their host side (kernels/cuda/eager_cuda.c, C11): the list of kernels
 * and the structs they take by value. Valid C11 and C++17; both sides see
 * the same layout (fixed-width fields, naturally aligned, no padding that
 * the two compilers could place differently).
 *
 * Every kernel is `extern "C" __global__ void sj_ek_<family>_<tag>(const
 * __grid_constant__ <args> a)`, launched through the driver API with one
 * kernel parameter, the struct. Families and the struct each takes:
 *
 *   unary_c / unary_s    sj_ek_ew     dtype tag; op = the sj_op
 *   binary_c / binary_s  sj_ek_ew     operand dtype; op = the sj_op (compare
 *                                     ops write bool)
 *   where_c / where_s    sj_ek_ew     element size e1..e8 (bits are moved)
 *   copy_s               sj_ek_ew     element size (same-dtype strided copy)
 *   cast_c / cast_s      sj_ek_ew     source dtype; aux = destination dtype
 *   fill_s               sj_ek_ew     element size; writes zero bits
 *   reduce_row / _col    sj_ek_rows   dtype; op = SJ_OP_SUM/MEAN/AMAX
 *   softmax_row / _col   sj_ek_rows   float dtype
 *   norm_row             sj_ek_rows   float dtype; op = 0 layer norm, 1 RMS
 *   matmul_int           sj_ek_mm     i32 / i64
 *   attention            sj_ek_att    float dtype
 *   attention_tc, _tc1   sj_ek_att    f16 / bf16 (tensor cores; two or one key tiles; mask or not)
 *   attention_mma<D>     sj_ek_att    f16 / bf16 (tensor cores, registers; D = Dv = 32, 64,
 *                                     96, 128)
 *   attention_mmam<D>    sj_ek_att    the same with the mask (sj_ek_att.mask)
 *   gather               sj_ek_gather element size
 *   arange               sj_ek_ew     dtype (not bool); ptr[0] = y, n, stride[0][0]
 *   attention_varlen     sj_ek_varlen float dtype
 *   varlen_check         sj_ek_varlen i32 (the offsets)
 *   attention_varlen_mma<D> sj_ek_varlen f16 / bf16 (attention_mma over packed sequences)
 *
 * _c kernels: every operand is one contiguous run (element stride 1) or a
 * scalar (stride 0) over the flattened index [0, n); with vec set, every
 * non-scalar operand is aligned to min(16, 4 * element size) bytes and runs
 * are read and written 4 elements at a time. _s kernels: any strides over a
 * collapsed shape of rank <= 8 (operand 0 is the output).
 *
 * Launch shapes (the host must respect the __launch_bounds__ given here):
 *   elementwise   block (256), grid-stride over n           bound 256
 *   *_row         block (32, W), W in {1..32}: with group 1 each warp owns
 *                 a row; with group == W the block owns a row  bound 1024
 *   *_col         block (32, W): 32 rows (outputs) per block, the W warps
 *                 split the reduced axis                       bound 1024
 *   matmul_int    block (256), grid-stride over the outputs  bound 256
 *   attention     block (SJ_EK_ATT_THREADS), one block per (b, h, query),
 *                 dynamic shared memory (D + Dv + SJ_EK_ATT_CHUNK) floats
 *   attention_tc  block (SJ_EK_ATT_TC_THREADS), one block per (b, h, SJ_EK_ATT_TQ
 *                 queries), dynamic shared memory sj_ek_att_tc_smem(D, Dv, 2 or 1)
 *   attention_mma, _mmam block (32 SJ_EK_ATT_MMA_WARPS kg, kg in {1, 2} key
 *                 groups), one block per (b, h, SJ_EK_ATT_TQ queries)
 *                 (attention_varlen_mma: per (tile, head), H (T / SJ_EK_ATT_TQ + B)
 *                 blocks, grid-stride),
 *                 dynamic shared memory sj_ek_att_mma_smem(D, Dv, kg);
 *                 no __launch_bounds__: __maxnreg__ per head size, at most
 *                 255, so that 256 threads always fit an SM's registers
 *   gather        block (256), grid-stride                   bound 256
 *   arange        block (256), grid-stride over n            bound 256
 *   attention_varlen  block (SJ_EK_ATT_THREADS), one block per (token, head),
 *                 grid-stride, dynamic shared memory (D + Dv + SJ_EK_ATT_CHUNK) floats
 *   varlen_check  block (256), grid-stride over the B + 1 offsets  bound 256
 */
#ifndef SJ_EAGER_ABI_CUH
#define SJ_EAGER_ABI_CUH

#include <stdint.h>

#define SJ_EK_MAXR 8          /* rank limit of every plan (SJ_MAX_RANK) */
#define SJ_EK_EW_OPS 4        /* elementwise operands, output first */
#define SJ_EK_THREADS 256     /* elementwise, matmul_int and gather blocks */
#define SJ_EK_ROW_MAX 1024    /* row and col kernels: threads per block */
#define SJ_EK_ATT_THREADS 128 /* attention block */
#define SJ_EK_ATT_CHUNK 64    /* attention: keys scored per step */

/* -- Kernel list ---------------------------------------------------------
 * X(family, tag): the kernel sj_ek_<family>_<tag>. Dtype tags follow
 * sj_dtype's order (f32 f16 bf16 i32 i64 bool); element-size tags are e1,
 * e2, e4, e8. */

#define SJ_EK_FLOATS(X, fam) X(fam, f32) X(fam, f16) X(fam, bf16)
#define SJ_EK_NUMERIC(X, fam) SJ_EK_FLOATS(X, fam) X(fam, i32) X(fam, i64)
#define SJ_EK_ALL(X, fam) SJ_EK_NUMERIC(X, fam) X(fam, bool)
#define SJ_EK_SIZES(X, fam) X(fam, e1) X(fam, e2) X(fam, e4) X(fam, e8)

#define SJ_EK_LIST(X)                                                                              \
    SJ_EK_NUMERIC(X, unary_c)                                                                      \
    SJ_EK_NUMERIC(X, unary_s)                                                                      \
    SJ_EK_ALL(X, binary_c)                                                                         \
    SJ_EK_ALL(X, binary_s)                                                                         \
    SJ_EK_SIZES(X, where_c)                                                                        \
    SJ_EK_SIZES(X, where_s)                                                                        \
    SJ_EK_SIZES(X, copy_s)                                                                         \
    SJ_EK_ALL(X, cast_c)                                                                           \
    SJ_EK_ALL(X, cast_s)                                                                           \
    SJ_EK_SIZES(X, fill_s)                                                                         \
    SJ_EK_NUMERIC(X, reduce_row)                                                                   \
    SJ_EK_NUMERIC(X, reduce_col)                                                                   \
    SJ_EK_FLOATS(X, softmax_row)                                                                   \
    SJ_EK_FLOATS(X, softmax_col)                                                                   \
    SJ_EK_FLOATS(X, norm_row)                                                                      \
    X(matmul_int, i32)                                                                             \
    X(matmul_int, i64)                                                                             \
    SJ_EK_FLOATS(X, attention)                                                                     \
    X(attention_tc, f16)                                                                           \
    X(attention_tc, bf16)                                                                          \
    X(attention_tc1, f16)                                                                          \
    X(attention_tc1, bf16)                                                                         \
    X(attention_mma32, f16)                                                                        \
    X(attention_mma32, bf16)                                                                       \
    X(attention_mma64, f16)                                                                        \
    X(attention_mma64, bf16)                                                                       \
    X(attention_mma96, f16)                                                                        \
    X(attention_mma96, bf16)                                                                       \
    X(attention_mma128, f16)                                                                       \
    X(attention_mma128, bf16)                                                                      \
    X(attention_mmam32, f16)                                                                       \
    X(attention_mmam32, bf16)                                                                      \
    X(attention_mmam64, f16)                                                                       \
    X(attention_mmam64, bf16)                                                                      \
    X(attention_mmam96, f16)                                                                       \
    X(attention_mmam96, bf16)                                                                      \
    X(attention_mmam128, f16)                                                                      \
    X(attention_mmam128, bf16)                                                                     \
    SJ_EK_SIZES(X, gather)                                                                         \
    SJ_EK_NUMERIC(X, arange)                                                                       \
    SJ_EK_FLOATS(X, attention_varlen)                                                              \
    X(varlen_check, i32)                                                                           \
    X(attention_varlen_mma32, f16)                                                                 \
    X(attention_varlen_mma32, bf16)                                                                \
    X(attention_varlen_mma64, f16)                                                                 \
    X(attention_varlen_mma64, bf16)                                                                \
    X(attention_varlen_mma96, f16)                                                                 \
    X(attention_varlen_mma96, bf16)                                                                \
    X(attention_varlen_mma128, f16)                                                                \
    X(attention_varlen_mma128, bf16)

/* -- Elementwise ---------------------------------------------------------
 * Operand k (0 = output) is ptr[k] with element strides stride[k][0..rank)
 * over shape[0..rank) (outermost first; collapsed by the host: no size-1
 * axes, merged where every operand allows). n = the element count.
 * div_mul/div_shift: shape[d] as a 32-bit magic divisor (q = (umulhi(i,
 * mul) + i) >> shift), valid when idx32 (n < 2^31); else the kernel divides
 * in 64 bits. */
typedef struct sj_ek_ew {
    uint64_t ptr[SJ_EK_EW_OPS];
    int64_t shape[SJ_EK_MAXR];
    int64_t stride[SJ_EK_EW_OPS][SJ_EK_MAXR];
    uint32_t div_mul[SJ_EK_MAXR];
    uint32_t div_shift[SJ_EK_MAXR];
    int64_t n;
    int32_t rank;
    int32_t op;    /* sj_op (unary, binary) */
    int32_t aux;   /* cast: destination sj_dtype */
    int32_t vec;   /* _c kernels: 4-wide aligned access allowed */
    int32_t idx32; /* n < 2^31: 32-bit index arithmetic */
    int32_t pad_;
} sj_ek_ew;

/* -- Rows: reductions, softmax, norms ------------------------------------
 * rows = product of shape[0..rank) (the other axes, collapsed; rank >= 1);
 * row r starts at x + off_x(r), y + off_y(r) with the offsets from
 * xstride/ystride; its n elements are at strides sx (x) and sy (y; the
 * reductions write one element). g and b (norms; 0 when absent) are read
 * at strides sg and sb. group: warps per row (1, or blockDim.y). */
typedef struct sj_ek_rows {
    uint64_t y, x, g, b;
    int64_t shape[SJ_EK_MAXR];
    int64_t ystride[SJ_EK_MAXR];
    int64_t xstride[SJ_EK_MAXR];
    int64_t rows, n;
    int64_t sx, sy, sg, sb;
    float eps;
    int32_t rank;
    int32_t op;
    int32_t group;
} sj_ek_rows;

/* -- Integer matmul --------------------------------------------------------
 * y[.., M, N] = a[.., M, K] b[.., K, N] over `batches` batches: batch index
 * unravelled over bshape[0..brank) (collapsed), offsets from bstride[0]
 * (y), [1] (a), [2] (b). Exact in uint64, narrowed on store. */
typedef struct sj_ek_mm {
    uint64_t y, a, b;
    int64_t bshape[SJ_EK_MAXR];
    int64_t bstride[3][SJ_EK_MAXR];
    int64_t batches, M, N, K;
    int64_t sam, sak, sbk, sbn, sym, syn;
    int32_t brank;
    int32_t pad_;
} sj_ek_mm;

/* -- Attention -------------------------------------------------------------
 * q [B,H,Sq,D], k [B,H,Sk,D], v [B,H,Sk,Dv], y [B,H,Sq,Dv] with element
 * strides sq, sk, sv, sy; len: 0 or a [B] vector (i32 unless len_i64) at
 * stride slen; mask: 0 or [B,H,Sq,Sk] at strides smask (attention,
 * attention_tc/_tc1 and attention_mmam; attention_mma takes none). */
typedef struct sj_ek_att {
    uint64_t q, k, v, y, len;
    int64_t sq[4], sk[4], sv[4], sy[4];
    int64_t slen;
    int64_t B, H, Sq, Sk, D, Dv;
    uint64_t mask;     /* 0, or an additive mask over [B, H, Sq, Sk] (attention only) */
    int64_t smask[4];  /* its element strides (0 on broadcast axes) */
    float scale;
    int32_t causal;
    int32_t len_i64;
    int32_t vec; /* attention_tc: q, k, v rows are read 16 bytes at a time */
    int32_t mask_dt;   /* the mask's sj_dtype: f32, f16, bf16 (added) or bool (false: -inf) */
    int32_t pad_;
} sj_ek_att;

/* attention_tc, _tc1 (eager_attention_tc.cuh): queries per block, keys per
 * tile, the largest D and Dv, and the dynamic shared memory they take with
 * nb key tiles (2: _tc, 1: _tc1). */
#ifndef SJ_EK_ATT_TQ
#define SJ_EK_ATT_TQ 64                        /* 16 a warp */
#endif
#define SJ_EK_ATT_TC_THREADS (2 * SJ_EK_ATT_TQ) /* attention_tc block */
#define SJ_EK_ATT_TK 64
#define SJ_EK_ATT_TC_DMAX 128
static inline int64_t sj_ek_att_tc_smem(int64_t D, int64_t Dv, int nb) {
    return (int64_t)SJ_EK_ATT_TQ * (SJ_EK_ATT_TK + 4) * 4 + (int64_t)SJ_EK_ATT_TQ * (Dv + 4) * 4 +
           ((int64_t)SJ_EK_ATT_TQ * (D + 8) + nb * (int64_t)SJ_EK_ATT_TK * (D + 8 + Dv + 8) +
            (int64_t)SJ_EK_ATT_TQ * (SJ_EK_ATT_TK + 8)) * 2;
}

/* -- Gather ----------------------------------------------------------------
 * y[p..., r...] = table[idx[p...], r...]: positions p over ishape[0..irank)
 * (idx strides istride, y strides iystride), row elements r over
 * rshape[0..rrank) (table strides rtstride from table axis 1 on, y strides
 * rystride); count = positions, rowel = row elements, V = table rows at
 * stride ts0. contig: the rows are contiguous in table and y (r is the
 * offset). An index outside [0, V) sets *flag = 1 and writes nothing.
 * With rowel == 0 the kernel only checks the indices. */
typedef struct sj_ek_gather {
    uint64_t y, table, idx, flag;
    int64_t ishape[SJ_EK_MAXR], istride[SJ_EK_MAXR], iystride[SJ_EK_MAXR];
    int64_t rshape[SJ_EK_MAXR], rtstride[SJ_EK_MAXR], rystride[SJ_EK_MAXR];
    int64_t count, rowel, V, ts0;
    int32_t irank, rrank;
    int32_t idx_i64, contig;
} sj_ek_gather;

/* -- Attention over packed sequences -----------------------------------------
 * q, k [T,H,D], v [T,H,Dv], y [T,H,Dv] with element strides sq, sk, sv, sy;
 * off: i32 [B+1] at stride soff; flag: the call's error flag (a device
 * int), where varlen_check ors the SJ_EK_VARLEN_BAD_* bits (gather sets 1). */
#define SJ_EK_VARLEN_BAD_FIRST 2 /* offsets[0] != 0 */
#define SJ_EK_VARLEN_BAD_ORDER 4 /* an entry below the one before it */
#define SJ_EK_VARLEN_BAD_LAST 8  /* offsets[B] != T */
typedef struct sj_ek_varlen {
    uint64_t q, k, v, y, off, flag;
    int64_t sq[3], sk[3], sv[3], sy[3];
    int64_t soff;
    int64_t T, B, H, D, Dv;
    float scale;
    int32_t causal;
    int32_t vec; /* attention_varlen_mma: q, k, v rows are read 16 bytes at a time */
    int32_t pad_;
} sj_ek_varlen;

/* attention_mma<D> (eager_attention_tc.cuh): warps a key group (one for
 * each 16 of the block's SJ_EK_ATT_TQ queries; a block has one or two key
 * groups), and the dynamic shared memory with kg groups: Q's rows and, per
 * group, two tiles of keys and values. */
#define SJ_EK_ATT_MMA_WARPS (SJ_EK_ATT_TQ / 16)
static inline int64_t sj_ek_att_mma_smem(int64_t D, int64_t Dv, int kg) {
    return ((int64_t)16 * SJ_EK_ATT_MMA_WARPS * (D + 8) + kg * 2 * (int64_t)SJ_EK_ATT_TK * (D + 8 + Dv + 8)) * 2;
}

/* Both compilers must agree on these sizes (no hidden padding). */
#ifdef __cplusplus
#define SJ_EK_SIZE_CHECK(t, n) static_assert(sizeof(t) == (n), #t " layout")
#else
#define SJ_EK_SIZE_CHECK(t, n) _Static_assert(sizeof(t) == (n), #t " layout")
#endif
SJ_EK_SIZE_CHECK(sj_ek_ew, 448);
SJ_EK_SIZE_CHECK(sj_ek_rows, 288);
SJ_EK_SIZE_CHECK(sj_ek_mm, 368);
SJ_EK_SIZE_CHECK(sj_ek_att, 288);
SJ_EK_SIZE_CHECK(sj_ek_gather, 464);
SJ_EK_SIZE_CHECK(sj_ek_varlen, 208);

#endif /* SJ_EAGER_ABI_CUH */
