/* Eager elementwise kernels: unary, binary and comparisons, where, copy and
 * cast.
 *
 * Every kernel builds a cpu_plan over its operands (output first) and runs
 * a static *_rows(job, begin, end) over a range of the plan's rows, so a
 * range can later be handed to a thread. Inside a row:
 * - f32 with a unit-stride output and inputs of inner stride 1 or 0 runs
 *   straight on the tensors' memory in vectorized loops: contiguous
 *   operands, a scalar (all strides 0), a row vector broadcast over rows
 *   (outer stride 0, inner 1) and a column broadcast (inner stride 0: one
 *   value per row);
 * - everything else (f16/bf16, any stride) goes through CHUNK-element f32
 *   (or int64) buffers on the stack: load, the same f32 loops, store.
 * f16/bf16 are computed in f32; integers in int64, wrapping, then narrowed.
 * The f32 math is base/sj_kernel_rt.h's (see the definitions there),
 * shared with generated kernels.
 */
#include <assert.h>
#include <math.h>
#include <string.h>

#include "base/error.h"
#include "kernels/cpu/cpu_int.h"
#include "kernels/cpu/eager.h"

#define CHUNK 256

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

static void assert_same_shape(const sj_tensor *a, const sj_tensor *b) {
    assert(a->rank == b->rank);
    for (int i = 0; i < a->rank; i++) assert(a->shape[i] == b->shape[i]);
    (void)a, (void)b;
}

/* -- f32 unary ------------------------------------------------------------ */

CPU_CLONES static void unary_f32(sj_op op, float *restrict y, const float *restrict x, int64_t n) {
    int64_t i;
    switch (op) {
    case SJ_OP_NEG: CPU_VLOOP(i, n, y[i] = -x[i]); break;
    case SJ_OP_ABS: CPU_VLOOP(i, n, y[i] = fabsf(x[i])); break;
    case SJ_OP_EXP: CPU_VLOOP(i, n, y[i] = cpu_expf(x[i])); break;
    case SJ_OP_TANH: CPU_VLOOP(i, n, y[i] = cpu_tanhf(x[i])); break;
    case SJ_OP_SIGMOID: CPU_VLOOP(i, n, y[i] = cpu_sigmoidf(x[i])); break;
    case SJ_OP_RELU: CPU_VLOOP(i, n, y[i] = sj_rt_reluf(x[i])); break;
    case SJ_OP_GELU: CPU_VLOOP(i, n, y[i] = cpu_geluf(x[i])); break;
    case SJ_OP_GELU_TANH: CPU_VLOOP(i, n, y[i] = cpu_gelu_tanhf(x[i])); break;
    case SJ_OP_SILU: CPU_VLOOP(i, n, y[i] = cpu_siluf(x[i])); break;
    /* libm (correctly rounded sqrt; not vectorized because of errno) */
    case SJ_OP_LOG:
        for (i = 0; i < n; i++) y[i] = logf(x[i]);
        break;
    case SJ_OP_SQRT:
        for (i = 0; i < n; i++) y[i] = sqrtf(x[i]);
        break;
    case SJ_OP_RSQRT:
        for (i = 0; i < n; i++) y[i] = 1.0f / sqrtf(x[i]);
        break;
    default: assert(!"not a unary op"); break;
    }
}

/* neg, abs, relu on int64, wrapping (neg of the minimum is the minimum). */
static void unary_i64(sj_op op, int64_t *y, const int64_t *x, int64_t n) {
    int64_t i;
    switch (op) {
    case SJ_OP_NEG:
        for (i = 0; i < n; i++) y[i] = sj_rt_ineg(x[i]);
        break;
    case SJ_OP_ABS:
        for (i = 0; i < n; i++) y[i] = sj_rt_iabs(x[i]);
        break;
    case SJ_OP_RELU:
        for (i = 0; i < n; i++) y[i] = x[i] < 0 ? 0 : x[i];
        break;
    default: assert(!"not an integer unary op"); break;
    }
}

typedef struct unary_job {
    sj_op op;
    sj_dtype dt;
    cpu_plan p; /* y, x */
} unary_job;

static void unary_rows(const unary_job *j, int64_t begin, int64_t end) {
    const cpu_plan *p = &j->p;
    int r = p->rank - 1;
    int64_t n = p->shape[r], sy = p->stride[0][r], sx = p->stride[1][r];
    size_t es = p->esize[0];
    float fx[CHUNK], fy[CHUNK];
    int64_t ix[CHUNK], iy[CHUNK];
    cpu_iter it;
    cpu_iter_seek(p, &it, begin);
    for (int64_t row = begin; row < end; row++, cpu_iter_next(p, &it)) {
        char *y = cpu_iter_ptr(p, &it, 0);
        const char *x = cpu_iter_ptr(p, &it, 1);
        if (j->dt == SJ_F32 && sy == 1 && sx == 1) {
            unary_f32(j->op, (float *)y, (const float *)x, n);
            continue;
        }
        for (int64_t c = 0; c < n; c += CHUNK) {
            int64_t m = min64(CHUNK, n - c);
            const char *xc = x + c * sx * (int64_t)es;
            char *yc = y + c * sy * (int64_t)es;
            if (cpu_is_float(j->dt)) {
                cpu_load_f32(fx, xc, j->dt, sx, m);
                unary_f32(j->op, fy, fx, m);
                cpu_store_f32(yc, j->dt, sy, fy, m);
            } else {
                cpu_load_i64(ix, xc, j->dt, sx, m);
                unary_i64(j->op, iy, ix, m);
                cpu_store_i64(yc, j->dt, sy, iy, m);
            }
        }
    }
}

sj_status sj_cpu_unary(sj_op op, const sj_tensor *x, const sj_tensor *y) {
    assert(x->dtype == y->dtype);
    assert(cpu_is_float(y->dtype) ||
           (cpu_is_int(y->dtype) && (op == SJ_OP_NEG || op == SJ_OP_ABS || op == SJ_OP_RELU)));
    assert_same_shape(x, y);
    unary_job j = {.op = op, .dt = y->dtype};
    const sj_tensor *ts[2] = {y, x};
    if (cpu_plan_init(&j.p, 2, ts) == 0)
        return SJ_OK;
    unary_rows(&j, 0, cpu_plan_rows(&j.p));
    return SJ_OK;
}

/* -- f32 binary and comparisons ----------------------------------------------
 *
 * One function per op: sa and sb are 1 (a run) or 0 (a scalar). A and B
 * name the two operands in the expression.
 *   maximum(a, b) = a is NaN or a > b ? a : b   (NaN from either side)
 *   minimum(a, b) = a is NaN or a < b ? a : b
 *   pow = powf (libm)
 */

typedef void (*bin_f32_fn)(float *restrict y, const float *restrict a, int64_t sa,
                           const float *restrict b, int64_t sb, int64_t n);
typedef void (*cmp_f32_fn)(uint8_t *restrict y, const float *restrict a, int64_t sa,
                           const float *restrict b, int64_t sb, int64_t n);

#define ELEM_LOOPS(T, ...)                                                                         \
    if (sa && sb) {                                                                                \
        CPU_VLOOP(i, n, float A = a[i]; float B = b[i]; y[i] = (T)(__VA_ARGS__));                  \
    } else if (sa) {                                                                               \
        const float B = b[0];                                                                      \
        CPU_VLOOP(i, n, float A = a[i]; y[i] = (T)(__VA_ARGS__));                                  \
    } else if (sb) {                                                                               \
        const float A = a[0];                                                                      \
        CPU_VLOOP(i, n, float B = b[i]; y[i] = (T)(__VA_ARGS__));                                  \
    } else {                                                                                       \
        const float A = a[0], B = b[0];                                                            \
        const T v = (T)(__VA_ARGS__);                                                              \
        CPU_VLOOP(i, n, y[i] = v);                                                                 \
    }

#define BIN_F32(name, ...)                                                                         \
    static void name(float *restrict y, const float *restrict a, int64_t sa,                       \
                     const float *restrict b, int64_t sb, int64_t n) {                             \
        ELEM_LOOPS(float, __VA_ARGS__)                                                             \
    }
#define CMP_F32(name, ...)                                                                         \
    static void name(uint8_t *restrict y, const float *restrict a, int64_t sa,                     \
                     const float *restrict b, int64_t sb, int64_t n) {                             \
        ELEM_LOOPS(uint8_t, __VA_ARGS__)                                                           \
    }

BIN_F32(bin_add, A + B)
BIN_F32(bin_sub, A - B)
BIN_F32(bin_mul, A *B)
BIN_F32(bin_div, A / B)
BIN_F32(bin_max, sj_rt_maxf(A, B))
BIN_F32(bin_min, sj_rt_minf(A, B))
BIN_F32(bin_pow, powf(A, B))
CMP_F32(cmp_eq, A == B)
CMP_F32(cmp_ne, A != B)
CMP_F32(cmp_lt, A < B)
CMP_F32(cmp_le, A <= B)
CMP_F32(cmp_gt, A > B)
CMP_F32(cmp_ge, A >= B)

static const bin_f32_fn bin_f32[SJ_OP_COUNT] = {
    [SJ_OP_ADD] = bin_add, [SJ_OP_SUB] = bin_sub,     [SJ_OP_MUL] = bin_mul,
    [SJ_OP_DIV] = bin_div, [SJ_OP_MAXIMUM] = bin_max, [SJ_OP_MINIMUM] = bin_min,
    [SJ_OP_POW] = bin_pow,
};
static const cmp_f32_fn cmp_f32[SJ_OP_COUNT] = {
    [SJ_OP_EQ] = cmp_eq, [SJ_OP_NE] = cmp_ne, [SJ_OP_LT] = cmp_lt,
    [SJ_OP_LE] = cmp_le, [SJ_OP_GT] = cmp_gt, [SJ_OP_GE] = cmp_ge,
};

/* -- Integer binary and comparisons ------------------------------------------
 *
 * int64, wrapping: div truncates toward zero, x / 0 = 0, min / -1 = min;
 * pow by squaring, a negative exponent gives 0 except for bases 1 and -1
 * (sj_rt_idiv, sj_rt_ipow in base/sj_kernel_rt.h).
 */

static void bin_i64(sj_op op, int64_t *y, const int64_t *a, int64_t sa, const int64_t *b,
                    int64_t sb, int64_t n) {
    int64_t i;
#define ILOOP(...)                                                                                 \
    for (i = 0; i < n; i++) {                                                                      \
        int64_t A = a[i * sa], B = b[i * sb];                                                      \
        y[i] = (__VA_ARGS__);                                                                      \
    }                                                                                              \
    break
    switch (op) {
    case SJ_OP_ADD: ILOOP(sj_rt_iadd(A, B));
    case SJ_OP_SUB: ILOOP(sj_rt_isub(A, B));
    case SJ_OP_MUL: ILOOP(sj_rt_imul(A, B));
    case SJ_OP_DIV: ILOOP(sj_rt_idiv(A, B));
    case SJ_OP_MAXIMUM: ILOOP(A > B ? A : B);
    case SJ_OP_MINIMUM: ILOOP(A < B ? A : B);
    case SJ_OP_POW: ILOOP(sj_rt_ipow(A, B));
    default: assert(!"not a binary op"); break;
    }
#undef ILOOP
}

static void cmp_i64(sj_op op, uint8_t *y, const int64_t *a, int64_t sa, const int64_t *b,
                    int64_t sb, int64_t n) {
    int64_t i;
#define CLOOP(OP)                                                                                  \
    for (i = 0; i < n; i++) y[i] = a[i * sa] OP b[i * sb];                                         \
    break
    switch (op) {
    case SJ_OP_EQ: CLOOP(==);
    case SJ_OP_NE: CLOOP(!=);
    case SJ_OP_LT: CLOOP(<);
    case SJ_OP_LE: CLOOP(<=);
    case SJ_OP_GT: CLOOP(>);
    case SJ_OP_GE: CLOOP(>=);
    default: assert(!"not a comparison"); break;
    }
#undef CLOOP
}

/* -- Binary rows ---------------------------------------------------------- */

typedef struct binary_job {
    sj_op op;
    int cmp;     /* comparison: bool output */
    sj_dtype dt; /* operand dtype */
    cpu_plan p;  /* y, a, b */
} binary_job;

static void store_u8(char *y, int64_t sy, const uint8_t *v, int64_t n) {
    if (sy == 1)
        memcpy(y, v, (size_t)n);
    else
        for (int64_t i = 0; i < n; i++) y[i * sy] = (char)v[i];
}

/* One chunk of m elements through f32 or int64 buffers; an operand of
 * stride 0 is loaded once and passed as a scalar. */
static void binary_chunk(const binary_job *j, char *y, int64_t sy, const char *a, int64_t sa,
                         const char *b, int64_t sb, int64_t m) {
    float fa[CHUNK], fb[CHUNK], fy[CHUNK];
    int64_t ia[CHUNK], ib[CHUNK], iy[CHUNK];
    uint8_t cy[CHUNK];
    int64_t ua = sa != 0, ub = sb != 0;
    if (cpu_is_float(j->dt)) {
        cpu_load_f32(fa, a, j->dt, sa, ua ? m : 1);
        cpu_load_f32(fb, b, j->dt, sb, ub ? m : 1);
        if (j->cmp) {
            cmp_f32[j->op](cy, fa, ua, fb, ub, m);
            store_u8(y, sy, cy, m);
        } else {
            bin_f32[j->op](fy, fa, ua, fb, ub, m);
            cpu_store_f32(y, j->dt, sy, fy, m);
        }
    } else {
        cpu_load_i64(ia, a, j->dt, sa, ua ? m : 1);
        cpu_load_i64(ib, b, j->dt, sb, ub ? m : 1);
        if (j->cmp) {
            cmp_i64(j->op, cy, ia, ua, ib, ub, m);
            store_u8(y, sy, cy, m);
        } else {
            bin_i64(j->op, iy, ia, ua, ib, ub, m);
            cpu_store_i64(y, j->dt, sy, iy, m);
        }
    }
}

static void binary_rows(const binary_job *j, int64_t begin, int64_t end) {
    const cpu_plan *p = &j->p;
    int r = p->rank - 1;
    int64_t n = p->shape[r], sy = p->stride[0][r], sa = p->stride[1][r], sb = p->stride[2][r];
    int64_t ey = (int64_t)p->esize[0], ex = (int64_t)p->esize[1];
    int fast = j->dt == SJ_F32 && sy == 1 && (sa == 0 || sa == 1) && (sb == 0 || sb == 1);
    cpu_iter it;
    cpu_iter_seek(p, &it, begin);
    for (int64_t row = begin; row < end; row++, cpu_iter_next(p, &it)) {
        char *y = cpu_iter_ptr(p, &it, 0);
        const char *a = cpu_iter_ptr(p, &it, 1), *b = cpu_iter_ptr(p, &it, 2);
        if (fast && j->cmp) {
            cmp_f32[j->op]((uint8_t *)y, (const float *)a, sa, (const float *)b, sb, n);
        } else if (fast) {
            bin_f32[j->op]((float *)y, (const float *)a, sa, (const float *)b, sb, n);
        } else {
            for (int64_t c = 0; c < n; c += CHUNK)
                binary_chunk(j, y + c * sy * ey, sy, a + c * sa * ex, sa, b + c * sb * ex, sb,
                             min64(CHUNK, n - c));
        }
    }
}

sj_status sj_cpu_binary(sj_op op, const sj_tensor *a, const sj_tensor *b, const sj_tensor *y) {
    binary_job j = {.op = op, .dt = a->dtype};
    assert(op >= 0 && op < SJ_OP_COUNT);
    j.cmp = cmp_f32[op] != NULL;
    assert(j.cmp || bin_f32[op] != NULL);
    assert(a->dtype == b->dtype && (j.cmp || a->dtype != SJ_BOOL)); /* bool: compare only */
    assert(j.cmp ? y->dtype == SJ_BOOL : y->dtype == a->dtype);
    assert_same_shape(a, y);
    assert_same_shape(b, y);
    const sj_tensor *ts[3] = {y, a, b};
    if (cpu_plan_init(&j.p, 3, ts) == 0)
        return SJ_OK;
    binary_rows(&j, 0, cpu_plan_rows(&j.p));
    return SJ_OK;
}

/* -- Where ---------------------------------------------------------------- */

typedef struct where_job {
    cpu_plan p; /* y, c, a, b */
} where_job;

/* Selects move bits, so only the element size matters. */
#define WHERE_FN(T)                                                                                \
    static void where_##T(T *restrict y, int64_t sy, const uint8_t *restrict c, int64_t sc,        \
                          const T *restrict a, int64_t sa, const T *restrict b, int64_t sb,        \
                          int64_t n) {                                                             \
        if (sy == 1 && sc == 1 && sa == 1 && sb == 1) {                                            \
            CPU_VLOOP(i, n, T A = a[i]; T B = b[i]; y[i] = c[i] ? A : B);                          \
        } else {                                                                                   \
            for (int64_t i = 0; i < n; i++) y[i * sy] = c[i * sc] ? a[i * sa] : b[i * sb];         \
        }                                                                                          \
    }
WHERE_FN(uint8_t)
WHERE_FN(uint16_t)
WHERE_FN(uint32_t)
WHERE_FN(uint64_t)
#define WHERE_ROW(T) where_##T((T *)y, sy, c, sc, (const T *)a, sa, (const T *)b, sb, n)

static void where_rows(const where_job *j, int64_t begin, int64_t end) {
    const cpu_plan *p = &j->p;
    int r = p->rank - 1;
    int64_t n = p->shape[r], sy = p->stride[0][r], sc = p->stride[1][r];
    int64_t sa = p->stride[2][r], sb = p->stride[3][r];
    cpu_iter it;
    cpu_iter_seek(p, &it, begin);
    for (int64_t row = begin; row < end; row++, cpu_iter_next(p, &it)) {
        char *y = cpu_iter_ptr(p, &it, 0);
        const uint8_t *c = (const uint8_t *)cpu_iter_ptr(p, &it, 1);
        const char *a = cpu_iter_ptr(p, &it, 2), *b = cpu_iter_ptr(p, &it, 3);
        switch (p->esize[0]) {
        case 1: WHERE_ROW(uint8_t); break;
        case 2: WHERE_ROW(uint16_t); break;
        case 4: WHERE_ROW(uint32_t); break;
        case 8: WHERE_ROW(uint64_t); break;
        default: assert(!"bad element size"); break;
        }
    }
}

sj_status sj_cpu_where(const sj_tensor *c, const sj_tensor *a, const sj_tensor *b,
                       const sj_tensor *y) {
    assert(c->dtype == SJ_BOOL && a->dtype == y->dtype && b->dtype == y->dtype);
    assert_same_shape(c, y);
    assert_same_shape(a, y);
    assert_same_shape(b, y);
    where_job j;
    const sj_tensor *ts[4] = {y, c, a, b};
    if (cpu_plan_init(&j.p, 4, ts) == 0)
        return SJ_OK;
    where_rows(&j, 0, cpu_plan_rows(&j.p));
    return SJ_OK;
}

/* -- Copy and cast -----------------------------------------------------------
 *
 * float -> float through f32 (one rounding for f32 -> f16/bf16; f16 <->
 * bf16 is exact through f32 then rounds once); int -> float rounds to f32,
 * then to f16/bf16 (so beyond 2^24 an int -> bf16 may round twice, as in
 * other frameworks); float -> int truncates toward zero, NaN gives 0 and
 * out-of-range values saturate; int -> int wraps; anything -> bool is != 0
 * (NaN -> 1); bool reads as 0/1.
 */

typedef struct copy_job {
    sj_dtype from, to;
    cpu_plan p; /* y, x */
} copy_job;

static void copy_same(char *y, int64_t sy, const char *x, int64_t sx, int64_t n, size_t es) {
    int64_t i;
    if (sy == 1 && sx == 1) {
        memcpy(y, x, (size_t)n * es);
        return;
    }
    switch (es) {
    case 1:
        for (i = 0; i < n; i++) ((uint8_t *)y)[i * sy] = ((const uint8_t *)x)[i * sx];
        break;
    case 2:
        for (i = 0; i < n; i++) ((uint16_t *)y)[i * sy] = ((const uint16_t *)x)[i * sx];
        break;
    case 4:
        for (i = 0; i < n; i++) ((uint32_t *)y)[i * sy] = ((const uint32_t *)x)[i * sx];
        break;
    case 8:
        for (i = 0; i < n; i++) ((uint64_t *)y)[i * sy] = ((const uint64_t *)x)[i * sx];
        break;
    default: assert(!"bad element size"); break;
    }
}

static void cast_chunk(sj_dtype from, sj_dtype to, char *y, int64_t sy, const char *x, int64_t sx,
                       int64_t m) {
    float f[CHUNK];
    int64_t v[CHUNK];
    int64_t i;
    if (cpu_is_float(to)) {
        cpu_load_f32(f, x, from, sx, m);
        cpu_store_f32(y, to, sy, f, m);
        return;
    }
    if (cpu_is_float(from)) {
        cpu_load_f32(f, x, from, sx, m);
        for (i = 0; i < m; i++) v[i] = to == SJ_BOOL ? f[i] != 0.0f : sj_rt_f32_to_int(f[i], to == SJ_I32);
    } else {
        cpu_load_i64(v, x, from, sx, m);
    }
    cpu_store_i64(y, to, sy, v, m);
}

static void copy_rows(const copy_job *j, int64_t begin, int64_t end) {
    const cpu_plan *p = &j->p;
    int r = p->rank - 1;
    int64_t n = p->shape[r], sy = p->stride[0][r], sx = p->stride[1][r];
    int64_t ey = (int64_t)p->esize[0], ex = (int64_t)p->esize[1];
    cpu_iter it;
    cpu_iter_seek(p, &it, begin);
    for (int64_t row = begin; row < end; row++, cpu_iter_next(p, &it)) {
        char *y = cpu_iter_ptr(p, &it, 0);
        const char *x = cpu_iter_ptr(p, &it, 1);
        if (j->from == j->to) {
            copy_same(y, sy, x, sx, n, p->esize[0]);
            continue;
        }
        for (int64_t c = 0; c < n; c += CHUNK)
            cast_chunk(j->from, j->to, y + c * sy * ey, sy, x + c * sx * ex, sx,
                       min64(CHUNK, n - c));
    }
}

/* Same dtype, y's rows contiguous, x contiguous across rows instead (a
 * transpose of the last two plan axes): copy TILE x TILE blocks so reads and
 * writes both stay within a few cache lines (8 measured best: larger tiles
 * thrash L1 sets when strides are multiples of 4 KiB). Rows [begin, end). */
#define TILE 8
#define TILE_LOOP(T)                                                                               \
    for (int64_t jj = c0; jj < c1; jj++)                                                           \
        for (int64_t ii = 0; ii < cnt; ii++) ((T *)y)[ii * ry + jj] = ((const T *)x)[ii + jj * sx]

static void copy_rows_tiled(const copy_job *j, int64_t begin, int64_t end) {
    const cpu_plan *p = &j->p;
    int r = p->rank - 1;
    int64_t n = p->shape[r], m = p->shape[r - 1], sx = p->stride[1][r], ry = p->stride[0][r - 1];
    cpu_iter it;
    cpu_iter_seek(p, &it, begin);
    for (int64_t row = begin; row < end;) {
        int64_t cnt = min64(min64(TILE, m - it.idx[r - 1]), end - row);
        char *y = cpu_iter_ptr(p, &it, 0);
        const char *x = cpu_iter_ptr(p, &it, 1);
        for (int64_t c0 = 0; c0 < n; c0 += TILE) {
            int64_t c1 = min64(c0 + TILE, n);
            switch (p->esize[0]) {
            case 1: TILE_LOOP(uint8_t); break;
            case 2: TILE_LOOP(uint16_t); break;
            case 4: TILE_LOOP(uint32_t); break;
            case 8: TILE_LOOP(uint64_t); break;
            default: assert(!"bad element size"); break;
            }
        }
        for (int64_t k = 0; k < cnt; k++) cpu_iter_next(p, &it);
        row += cnt;
    }
}

sj_status sj_cpu_copy(const sj_tensor *x, const sj_tensor *y) {
    assert(x->dtype >= 0 && x->dtype < SJ_DTYPE_COUNT && y->dtype >= 0 &&
           y->dtype < SJ_DTYPE_COUNT);
    assert_same_shape(x, y);
    copy_job j = {.from = x->dtype, .to = y->dtype};
    const sj_tensor *ts[2] = {y, x};
    if (cpu_plan_init(&j.p, 2, ts) == 0)
        return SJ_OK;
    int r = j.p.rank - 1;
    if (j.from == j.to && r >= 1 && j.p.stride[0][r] == 1 && j.p.stride[1][r] != 1 &&
        j.p.stride[1][r - 1] == 1)
        copy_rows_tiled(&j, 0, cpu_plan_rows(&j.p));
    else
        copy_rows(&j, 0, cpu_plan_rows(&j.p));
    return SJ_OK;
}
