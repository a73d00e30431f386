/* Test helpers and float64 references; see tests/util.h. */
#include "tests/util.h"

#include <assert.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* -- Random numbers ----------------------------------------------------------
 * xorshift128+ seeded through splitmix64. */

static uint64_t rng[2] = {0x9e3779b97f4a7c15u, 0xbf58476d1ce4e5b9u};

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15u);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
}

void tu_seed(uint64_t seed) {
    rng[0] = splitmix(&seed);
    rng[1] = splitmix(&seed);
}

uint64_t tu_rand(void) {
    uint64_t s1 = rng[0], s0 = rng[1];
    rng[0] = s0;
    s1 ^= s1 << 23;
    rng[1] = s1 ^ s0 ^ (s1 >> 17) ^ (s0 >> 26);
    return rng[1] + s0;
}

double tu_uniform(double lo, double hi) { return lo + (hi - lo) * ((tu_rand() >> 11) * 0x1p-53); }

int64_t tu_randint(int64_t lo, int64_t hi) {
    return lo + (int64_t)(tu_rand() % (uint64_t)(hi - lo + 1));
}

/* -- Tracked memory ------------------------------------------------------- */

typedef struct block {
    char *base;
    size_t bytes;
} block;

static block *blocks;
static int nblocks, capblocks;

static char *track(size_t bytes) {
    if (nblocks == capblocks) {
        capblocks = capblocks ? 2 * capblocks : 64;
        blocks = realloc(blocks, (size_t)capblocks * sizeof *blocks);
        assert(blocks);
    }
    char *p = malloc(bytes ? bytes : 1);
    assert(p);
    memset(p, 0xA5, bytes);
    blocks[nblocks++] = (block){p, bytes};
    return p;
}

static double *refbufs[2];
static size_t refcaps[2];

void tu_free_all(void) {
    for (int i = 0; i < nblocks; i++) free(blocks[i].base);
    nblocks = 0;
    for (int i = 0; i < 2; i++) {
        free(refbufs[i]);
        refbufs[i] = NULL;
        refcaps[i] = 0;
    }
}

int tu_teardown(void **state) {
    (void)state;
    tu_free_all();
    return 0;
}

double *tu_refbuf(int slot, int64_t n) {
    assert(slot >= 0 && slot < 2 && n >= 0);
    if ((size_t)n + 1 > refcaps[slot]) {
        refcaps[slot] = (size_t)n + 1;
        refbufs[slot] = realloc(refbufs[slot], refcaps[slot] * sizeof(double));
        assert(refbufs[slot]);
    }
    return refbufs[slot];
}

const char *tu_label(const char *fmt, ...) {
    static char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return buf;
}

static size_t esize(sj_dtype dt) {
    static const size_t sz[] = {
#define SJ_X(name, e, bytes) [e] = bytes,
        SJ_DTYPE_LIST(SJ_X)
#undef SJ_X
    };
    assert(dt >= 0 && dt < SJ_DTYPE_COUNT);
    return sz[dt];
}

int64_t tu_numel(const sj_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->rank; i++) n *= t->shape[i];
    return n;
}

sj_tensor tu_tensor(sj_dtype dt, int rank, const int64_t *shape) {
    return tu_tensor_strided(dt, rank, shape, NULL, 0);
}

sj_tensor tu_tensor_strided(sj_dtype dt, int rank, const int64_t *shape, const int *order,
                            int64_t gap) {
    sj_tensor t;
    memset(&t, 0, sizeof t);
    t.dtype = dt;
    t.rank = rank;
    t.device = SJ_HOST;
    int64_t s = 1 + gap, extent = 1;
    for (int k = rank - 1; k >= 0; k--) {
        int a = order ? order[k] : k;
        t.shape[a] = shape[a];
        t.stride[a] = s;
        s = s * (shape[a] > 1 ? shape[a] : 1) + gap;
        extent += (shape[a] - 1) * t.stride[a];
    }
    if (tu_numel(&t) == 0)
        extent = 0;
    char *base = track((size_t)(extent + 2 * gap) * esize(dt));
    t.data = base + gap * (int64_t)esize(dt);
    tu_poison(&t);
    return t;
}

sj_tensor tu_tensor_layout(sj_dtype dt, int rank, const int64_t *shape, int layout) {
    int order[SJ_MAX_RANK] = {0}, rev = layout == TU_REV || layout == TU_REVGAP;
    for (int i = 0; i < rank; i++) order[i] = rev ? rank - 1 - i : i;
    return tu_tensor_strided(dt, rank, shape, order, layout == TU_GAP || layout == TU_REVGAP);
}

sj_tensor tu_broadcast(const sj_tensor *t, int rank, const int64_t *shape) {
    sj_tensor v = *t;
    v.rank = rank;
    for (int i = 0; i < rank; i++) {
        int j = i - (rank - t->rank);
        v.shape[i] = shape[i];
        if (j < 0 || t->shape[j] != shape[i]) {
            assert(j < 0 || t->shape[j] == 1);
            v.stride[i] = 0;
        } else {
            v.stride[i] = t->stride[j];
        }
    }
    return v;
}

sj_tensor tu_transpose(const sj_tensor *t, int a, int b) {
    sj_tensor v = *t;
    v.shape[a] = t->shape[b], v.shape[b] = t->shape[a];
    v.stride[a] = t->stride[b], v.stride[b] = t->stride[a];
    return v;
}

/* -- Element access ------------------------------------------------------- */

static int64_t offset_of(const sj_tensor *t, int64_t i) {
    int64_t off = 0;
    for (int d = t->rank - 1; d >= 0; d--) {
        off += (i % t->shape[d]) * t->stride[d];
        i /= t->shape[d];
    }
    return off;
}

static void *elem(const sj_tensor *t, int64_t i) {
    return (char *)t->data + offset_of(t, i) * (int64_t)esize(t->dtype);
}

double tu_f16_value(uint16_t h) {
    int e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(1024 + m, e - 25);
    return (h & 0x8000) ? -v : v;
}

static double bf16_value(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Round a >= 0 to `bits` significant bits (RNE) with exponent range
 * [emin, emax] (below emin: fixed spacing 2^(emin - bits + 1)); returns the
 * encoding exponent field and mantissa through *e and *m, or inf. */
static uint32_t round_bits(double a, int bits, int emin, int emax, int bias) {
    if (a < ldexp(1, emin)) /* subnormal or zero */
        return (uint32_t)nearbyint(ldexp(a, bits - 1 - emin));
    int ex;
    frexp(a, &ex); /* a in [2^(ex-1), 2^ex) */
    int E = ex - 1;
    double mant = nearbyint(ldexp(a, bits - 1 - E));
    if (mant == ldexp(1, bits)) {
        mant = ldexp(1, bits - 1);
        E++;
    }
    if (E > emax)
        return (uint32_t)(2 * emax + 1 + bias - emax) << (bits - 1); /* inf */
    return ((uint32_t)(E + bias) << (bits - 1)) | ((uint32_t)mant - (1u << (bits - 1)));
}

uint16_t tu_f16_bits(double v) {
    uint16_t sign = signbit(v) ? 0x8000 : 0;
    if (isnan(v))
        return sign | 0x7e00;
    if (isinf(v))
        return sign | 0x7c00;
    return sign | (uint16_t)round_bits(fabs(v), 11, -14, 15, 15);
}

uint16_t tu_bf16_bits(double v) {
    uint16_t sign = signbit(v) ? 0x8000 : 0;
    if (isnan(v))
        return sign | 0x7fc0;
    if (isinf(v))
        return sign | 0x7f80;
    return sign | (uint16_t)round_bits(fabs(v), 8, -126, 127, 127);
}

double tu_round(sj_dtype dt, double v) {
    switch (dt) {
    case SJ_F32: return (float)v;
    case SJ_F16: return tu_f16_value(tu_f16_bits(v));
    case SJ_BF16: return bf16_value(tu_bf16_bits(v));
    case SJ_I32:
        return isnan(v)             ? 0
               : v >= 2147483647.0  ? 2147483647.0
               : v <= -2147483648.0 ? -2147483648.0
                                    : trunc(v);
    case SJ_I64: return isnan(v) ? 0 : v >= 0x1p63 ? 0x1p63 : v <= -0x1p63 ? -0x1p63 : trunc(v);
    case SJ_BOOL: return v != 0;
    default: assert(0); return 0;
    }
}

double tu_get(const sj_tensor *t, int64_t i) {
    void *p = elem(t, i);
    switch (t->dtype) {
    case SJ_F32: return *(float *)p;
    case SJ_F16: return tu_f16_value(*(uint16_t *)p);
    case SJ_BF16: return bf16_value(*(uint16_t *)p);
    default: return (double)tu_geti(t, i);
    }
}

int64_t tu_geti(const sj_tensor *t, int64_t i) {
    void *p = elem(t, i);
    switch (t->dtype) {
    case SJ_I32: return *(int32_t *)p;
    case SJ_I64: return *(int64_t *)p;
    case SJ_BOOL: return *(uint8_t *)p; /* raw: poison shows as 0xA5 */
    default: return (int64_t)tu_get(t, i);
    }
}

void tu_set(const sj_tensor *t, int64_t i, double v) {
    void *p = elem(t, i);
    switch (t->dtype) {
    case SJ_F32: *(float *)p = (float)v; break;
    case SJ_F16: *(uint16_t *)p = tu_f16_bits(v); break;
    case SJ_BF16: *(uint16_t *)p = tu_bf16_bits(v); break;
    default: tu_seti(t, i, (int64_t)tu_round(t->dtype, v)); break;
    }
}

void tu_seti(const sj_tensor *t, int64_t i, int64_t v) {
    void *p = elem(t, i);
    switch (t->dtype) {
    case SJ_I32: *(int32_t *)p = (int32_t)v; break;
    case SJ_I64: *(int64_t *)p = v; break;
    case SJ_BOOL: *(uint8_t *)p = v != 0; break;
    default: tu_set(t, i, (double)v); break;
    }
}

void tu_set_all(const sj_tensor *t, const double *v) {
    for (int64_t i = 0, n = tu_numel(t); i < n; i++) tu_set(t, i, v[i]);
}

void tu_seti_all(const sj_tensor *t, const int64_t *v) {
    for (int64_t i = 0, n = tu_numel(t); i < n; i++) tu_seti(t, i, v[i]);
}

/* -- Filling -------------------------------------------------------------- */

void tu_fill_random(const sj_tensor *t) {
    for (int64_t i = 0, n = tu_numel(t); i < n; i++) {
        int neg = tu_rand() & 1;
        if (t->dtype == SJ_BOOL)
            tu_seti(t, i, neg);
        else if (t->dtype == SJ_I32 || t->dtype == SJ_I64)
            tu_seti(t, i, neg ? -tu_randint(1, 5) : tu_randint(1, 5));
        else
            tu_set(t, i, neg ? -tu_uniform(0.05, 2.0) : tu_uniform(0.05, 2.0));
    }
}

void tu_fill_range(const sj_tensor *t, double lo, double hi) {
    for (int64_t i = 0, n = tu_numel(t); i < n; i++) {
        if (t->dtype == SJ_I32 || t->dtype == SJ_I64 || t->dtype == SJ_BOOL)
            tu_seti(t, i, tu_randint((int64_t)ceil(lo), (int64_t)floor(hi)));
        else
            tu_set(t, i, tu_uniform(lo, hi));
    }
}

static const uint64_t poison_bits[SJ_DTYPE_COUNT] = {
    [SJ_F32] = 0x7fa5a5a5u,         [SJ_F16] = 0x7da5u, [SJ_BF16] = 0x7fa5u, [SJ_I32] = 0x5aa5a5a5u,
    [SJ_I64] = 0x5aa5a5a5a5a5a5a5u, [SJ_BOOL] = 0xa5u,
};

void tu_poison(const sj_tensor *t) {
    size_t es = esize(t->dtype);
    for (int64_t i = 0, n = tu_numel(t); i < n; i++)
        memcpy(elem(t, i), &poison_bits[t->dtype], es); /* little-endian */
}

int tu_is_poison(const sj_tensor *t, int64_t i) {
    uint64_t v = 0;
    memcpy(&v, elem(t, i), esize(t->dtype));
    return v == poison_bits[t->dtype];
}

/* -- Checking ------------------------------------------------------------- */

double tu_tol(sj_dtype dt) {
    return dt == SJ_F32 ? 1e-5 : dt == SJ_F16 ? 2e-3 : dt == SJ_BF16 ? 2e-2 : 0.0;
}

int tu_check(const sj_tensor *out, const double *ref, double tol, const char *what) {
    return tu_check_mag(out, ref, NULL, tol, what);
}

int tu_check_mag(const sj_tensor *out, const double *ref, const double *mag, double tol,
                 const char *what) {
    int64_t n = tu_numel(out), bad = 0, finite = 0;
    double ss = 0, num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double m = mag ? mag[i] : fabs(ref[i]);
        if (isfinite(m))
            ss += m * m, finite++;
    }
    double floor_ = finite ? 0.1 * sqrt(ss / (double)finite) : 0.0;
    for (int64_t i = 0; i < n; i++) {
        double o = tu_get(out, i), r = ref[i], m = mag ? mag[i] : fabs(r);
        const char *why = NULL;
        if (tu_is_poison(out, i))
            why = "never written";
        else if (out->dtype == SJ_BOOL && o != 0 && o != 1)
            why = "bool not 0/1";
        else if (isnan(r))
            why = isnan(o) ? NULL : "expected NaN";
        else if (isnan(o))
            why = "NaN";
        else if (isinf(r) || isinf(o))
            why = o == r ? NULL : "infinity mismatch";
        else {
            num += (o - r) * (o - r), den += m * m;
            if (fabs(o - r) > tol * (m + floor_))
                why = "out of tolerance";
        }
        if (why && bad++ < 8)
            fprintf(stderr, "%s: [%lld] out %.9g ref %.9g: %s\n", what, (long long)i, o, r, why);
    }
    if (tol > 0 && sqrt(num) > tol * sqrt(den)) {
        fprintf(stderr, "%s: relative norm error %.3g > %.3g\n", what, sqrt(num / den), tol);
        bad++;
    }
    if (bad)
        fprintf(stderr, "%s: %lld of %lld elements failed\n", what, (long long)bad, (long long)n);
    return bad == 0;
}

int tu_check_gaps(const sj_tensor *t, const char *what) {
    const block *b = NULL;
    /* The block holding t->data: inside it, or at the base of an empty one
     * (an empty block may sit right at the end of another). */
    for (int i = 0; i < nblocks; i++) {
        char *p = (char *)t->data, *base = blocks[i].base;
        if ((p >= base && p < base + blocks[i].bytes) || (blocks[i].bytes == 0 && p == base))
            b = &blocks[i];
    }
    assert(b);
    char *mark = calloc(b->bytes + 1, 1);
    size_t es = esize(t->dtype);
    for (int64_t i = 0, n = tu_numel(t); i < n; i++)
        memset(mark + ((char *)elem(t, i) - b->base), 1, es);
    int64_t bad = 0;
    for (size_t i = 0; i < b->bytes; i++) bad += !mark[i] && (unsigned char)b->base[i] != 0xA5;
    free(mark);
    if (bad)
        fprintf(stderr, "%s: %lld bytes written outside the view\n", what, (long long)bad);
    return bad == 0;
}

/* -- Scalar references ---------------------------------------------------- */

double tu_ref_unary1(sj_op op, double x) {
    switch (op) {
    case SJ_OP_NEG: return -x;
    case SJ_OP_ABS: return fabs(x);
    case SJ_OP_EXP: return exp(x);
    case SJ_OP_LOG: return log(x);
    case SJ_OP_SQRT: return sqrt(x);
    case SJ_OP_RSQRT: return 1.0 / sqrt(x);
    case SJ_OP_TANH: return tanh(x);
    case SJ_OP_SIGMOID: return 1.0 / (1.0 + exp(-x));
    case SJ_OP_RELU: return x < 0 ? 0.0 : x;
    case SJ_OP_GELU: return 0.5 * x * (1.0 + erf(x / sqrt(2.0)));
    case SJ_OP_GELU_TANH:
        return 0.5 * x *
               (1.0 + tanh(sqrt(2.0 / 3.14159265358979323846) * (x + 0.044715 * x * x * x)));
    case SJ_OP_SILU: return x * (1.0 / (1.0 + exp(-x)));
    default: assert(0); return 0;
    }
}

double tu_ref_binary1(sj_op op, double a, double b) {
    switch (op) {
    case SJ_OP_ADD: return a + b;
    case SJ_OP_SUB: return a - b;
    case SJ_OP_MUL: return a * b;
    case SJ_OP_DIV: return a / b;
    case SJ_OP_MAXIMUM: return isnan(a) || isnan(b) ? NAN : a > b ? a : b;
    case SJ_OP_MINIMUM: return isnan(a) || isnan(b) ? NAN : a < b ? a : b;
    case SJ_OP_POW: return pow(a, b);
    case SJ_OP_EQ: return a == b;
    case SJ_OP_NE: return a != b;
    case SJ_OP_LT: return a < b;
    case SJ_OP_LE: return a <= b;
    case SJ_OP_GT: return a > b;
    case SJ_OP_GE: return a >= b;
    default: assert(0); return 0;
    }
}

static int64_t wrap(uint64_t u) { return u <= INT64_MAX ? (int64_t)u : -(int64_t)(~u) - 1; }

int64_t tu_ref_binary1_i(sj_op op, int64_t a, int64_t b) {
    uint64_t r = 1;
    switch (op) {
    case SJ_OP_ADD: return wrap((uint64_t)a + (uint64_t)b);
    case SJ_OP_SUB: return wrap((uint64_t)a - (uint64_t)b);
    case SJ_OP_MUL: return wrap((uint64_t)a * (uint64_t)b);
    case SJ_OP_DIV:
        if (b == 0)
            return 0;
        if (a == INT64_MIN && b == -1)
            return INT64_MIN;
        return a / b;
    case SJ_OP_MAXIMUM: return a > b ? a : b;
    case SJ_OP_MINIMUM: return a < b ? a : b;
    case SJ_OP_POW:
        if (b < 0)
            return a == 1 ? 1 : a == -1 ? (b % 2 ? -1 : 1) : 0;
        for (int64_t i = 0; i < b; i++) r *= (uint64_t)a; /* tests keep b small */
        return wrap(r);
    default: return (int64_t)tu_ref_binary1(op, (double)a, (double)b);
    }
}

/* Narrow an int64 result to dt by wrapping (i32), as the kernels do. */
static double narrow(sj_dtype dt, int64_t v) {
    if (dt == SJ_I32) {
        uint32_t u = (uint32_t)v;
        return u >= 0x80000000u ? (double)u - 4294967296.0 : (double)u;
    }
    return dt == SJ_BOOL ? v != 0 : (double)v;
}

static int is_int(sj_dtype dt) { return dt == SJ_I32 || dt == SJ_I64 || dt == SJ_BOOL; }

/* -- Tensor references ---------------------------------------------------- */

void tu_ref_unary(sj_op op, const sj_tensor *x, double *out) {
    for (int64_t i = 0, n = tu_numel(x); i < n; i++) {
        if (is_int(x->dtype)) {
            int64_t v = tu_geti(x, i);
            int64_t r = op == SJ_OP_NEG   ? wrap(0 - (uint64_t)v)
                        : op == SJ_OP_ABS ? (v < 0 ? wrap(0 - (uint64_t)v) : v)
                                          : (v < 0 ? 0 : v);
            out[i] = narrow(x->dtype, r);
        } else {
            out[i] = tu_ref_unary1(op, tu_get(x, i));
        }
    }
}

void tu_ref_binary(sj_op op, const sj_tensor *a, const sj_tensor *b, double *out) {
    int cmp = op >= SJ_OP_EQ && op <= SJ_OP_GE;
    for (int64_t i = 0, n = tu_numel(a); i < n; i++) {
        if (is_int(a->dtype)) {
            int64_t r = tu_ref_binary1_i(op, tu_geti(a, i), tu_geti(b, i));
            out[i] = cmp ? (double)r : narrow(a->dtype, r);
        } else {
            out[i] = tu_ref_binary1(op, tu_get(a, i), tu_get(b, i));
        }
    }
}

void tu_ref_where(const sj_tensor *c, const sj_tensor *a, const sj_tensor *b, double *out) {
    for (int64_t i = 0, n = tu_numel(a); i < n; i++)
        out[i] = tu_geti(c, i) ? tu_get(a, i) : tu_get(b, i);
}

void tu_ref_cast(const sj_tensor *x, sj_dtype to, double *out) {
    for (int64_t i = 0, n = tu_numel(x); i < n; i++) {
        if (is_int(x->dtype)) {
            int64_t v = tu_geti(x, i);
            if (x->dtype == SJ_BOOL)
                v = v != 0;
            if (is_int(to))
                out[i] = narrow(to, v);
            else /* documented: through f32 */
                out[i] = tu_round(to, (double)(float)v);
        } else {
            out[i] = tu_round(to, tu_get(x, i)); /* trunc, saturate, NaN -> 0, != 0 */
        }
    }
}

/* Unravel i over (rank, shape) into idx; ravel back. */
static void unravel(int rank, const int64_t *shape, int64_t i, int64_t *idx) {
    for (int d = rank - 1; d >= 0; d--) {
        idx[d] = i % shape[d];
        i /= shape[d];
    }
}

static int64_t ravel(int rank, const int64_t *shape, const int64_t *idx) {
    int64_t i = 0;
    for (int d = 0; d < rank; d++) i = i * shape[d] + idx[d];
    return i;
}

static double get_at(const sj_tensor *t, const int64_t *idx) {
    return tu_get(t, ravel(t->rank, t->shape, idx));
}

/* Rows along `axis`: calls fn(row values, n, out positions) per row. */
typedef void (*row_fn)(sj_op op, sj_dtype dt, const double *v, int64_t n, double *res, int mode);

static void for_rows(const sj_tensor *x, int axis, sj_op op, double *out, int keep, row_fn fn,
                     int mode) {
    int64_t rshape[SJ_MAX_RANK], idx[SJ_MAX_RANK], n = x->shape[axis];
    memcpy(rshape, x->shape, sizeof rshape);
    rshape[axis] = 1;
    int64_t rows = 1;
    for (int d = 0; d < x->rank; d++) rows *= rshape[d];
    double *v = malloc((size_t)(n + 1) * sizeof *v), *res = malloc((size_t)(n + 1) * sizeof *res);
    for (int64_t r = 0; r < rows; r++) {
        unravel(x->rank, rshape, r, idx);
        for (int64_t j = 0; j < n; j++) {
            idx[axis] = j;
            v[j] = get_at(x, idx);
        }
        fn(op, x->dtype, v, n, res, mode);
        if (!keep) {
            out[r] = res[0];
            continue;
        }
        for (int64_t j = 0; j < n; j++) {
            idx[axis] = j;
            out[ravel(x->rank, x->shape, idx)] = res[j];
        }
    }
    free(v);
    free(res);
}

static void row_reduce(sj_op op, sj_dtype dt, const double *v, int64_t n, double *res, int mode) {
    double s = 0, m = -INFINITY;
    uint64_t si = 0;
    int64_t mi = INT64_MIN;
    for (int64_t j = 0; j < n; j++) {
        s += v[j], si += (uint64_t)(int64_t)v[j];
        m = isnan(v[j]) || isnan(m) ? NAN : v[j] > m ? v[j] : m;
        mi = (int64_t)v[j] > mi ? (int64_t)v[j] : mi;
    }
    if (is_int(dt))
        res[0] = narrow(dt, op == SJ_OP_AMAX ? mi : wrap(si));
    else
        res[0] = op == SJ_OP_AMAX ? m : op == SJ_OP_MEAN ? (n ? s / (double)n : NAN) : s;
}

void tu_ref_reduce(sj_op op, const sj_tensor *x, int axis, double *out) {
    for_rows(x, axis, op, out, 0, row_reduce, 0);
}

static void row_softmax(sj_op op, sj_dtype dt, const double *v, int64_t n, double *res, int mode) {
    double m = -INFINITY, s = 0;
    for (int64_t j = 0; j < n; j++) m = isnan(v[j]) || isnan(m) ? NAN : v[j] > m ? v[j] : m;
    for (int64_t j = 0; j < n; j++) s += res[j] = m == -INFINITY ? 0 : exp(v[j] - m);
    for (int64_t j = 0; j < n; j++) res[j] = m == -INFINITY ? 0 : res[j] / s;
}

void tu_ref_softmax(const sj_tensor *x, int axis, double *out) {
    for_rows(x, axis, SJ_OP_SOFTMAX, out, 1, row_softmax, 0);
}

static const sj_tensor *norm_g, *norm_b;
static double norm_eps;

static void row_norm(sj_op op, sj_dtype dt, const double *v, int64_t n, double *res, int rms) {
    double mean = 0, var = 0;
    for (int64_t j = 0; j < n; j++) mean += v[j] / (double)n;
    for (int64_t j = 0; j < n; j++)
        var += (rms ? v[j] * v[j] : (v[j] - mean) * (v[j] - mean)) / (double)n;
    for (int64_t j = 0; j < n; j++) {
        double g = norm_g ? tu_get(norm_g, j) : 1.0, b = norm_b ? tu_get(norm_b, j) : 0.0;
        res[j] = (rms ? v[j] : v[j] - mean) / sqrt(var + norm_eps) * g + b;
    }
}

void tu_ref_layer_norm(const sj_tensor *x, const sj_tensor *g, const sj_tensor *b, double eps,
                       double *out) {
    norm_g = g, norm_b = b, norm_eps = eps;
    for_rows(x, x->rank - 1, SJ_OP_LAYER_NORM, out, 1, row_norm, 0);
}

void tu_ref_rms_norm(const sj_tensor *x, const sj_tensor *g, double eps, double *out) {
    norm_g = g, norm_b = NULL, norm_eps = eps;
    for_rows(x, x->rank - 1, SJ_OP_RMS_NORM, out, 1, row_norm, 1);
}

void tu_ref_matmul(const sj_tensor *a, const sj_tensor *b, double *out, double *mag) {
    int r = a->rank;
    int64_t M = a->shape[r - 2], K = a->shape[r - 1], N = b->shape[r - 1];
    int64_t yshape[SJ_MAX_RANK], idx[SJ_MAX_RANK], ia[SJ_MAX_RANK], ib[SJ_MAX_RANK];
    memcpy(yshape, a->shape, sizeof yshape);
    yshape[r - 1] = N;
    int64_t n = 1;
    for (int d = 0; d < r; d++) n *= yshape[d];
    for (int64_t o = 0; o < n; o++) {
        unravel(r, yshape, o, idx);
        memcpy(ia, idx, sizeof ia);
        memcpy(ib, idx, sizeof ib);
        double s = 0, sm = 0;
        uint64_t si = 0;
        for (int64_t k = 0; k < K; k++) {
            ia[r - 1] = k, ib[r - 2] = k;
            double x = get_at(a, ia), y = get_at(b, ib);
            si += (uint64_t)(int64_t)x * (uint64_t)(int64_t)y;
            s += x * y, sm += fabs(x * y);
        }
        out[o] = is_int(a->dtype) ? narrow(a->dtype, wrap(si)) : s;
        if (mag)
            mag[o] = sm;
    }
    (void)M;
}

void tu_ref_attention(const sj_tensor *q, const sj_tensor *k, const sj_tensor *v,
                      const sj_tensor *lengths, double scale, int causal, double *out,
                      double *mag) {
    int64_t B = q->shape[0], H = q->shape[1], Sq = q->shape[2], D = q->shape[3];
    int64_t Sk = k->shape[2], Dv = v->shape[3];
    double *p = malloc((size_t)(Sk + 1) * sizeof *p);
    for (int64_t b = 0; b < B; b++) {
        int64_t L = lengths ? tu_geti(lengths, b) : Sk;
        L = L < 0 ? 0 : L > Sk ? Sk : L;
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < Sq; i++) {
                double m = -INFINITY, s = 0;
                for (int64_t j = 0; j < Sk; j++) {
                    p[j] = -INFINITY;
                    if (j >= L || (causal && j > i + Sk - Sq))
                        continue;
                    double dot = 0;
                    for (int64_t d = 0; d < D; d++)
                        dot +=
                            get_at(q, (int64_t[]){b, h, i, d}) * get_at(k, (int64_t[]){b, h, j, d});
                    p[j] = scale * dot;
                    m = p[j] > m ? p[j] : m;
                }
                for (int64_t j = 0; j < Sk; j++) s += p[j] = m == -INFINITY ? 0 : exp(p[j] - m);
                for (int64_t e = 0; e < Dv; e++) {
                    double o = 0, om = 0;
                    for (int64_t j = 0; j < Sk; j++)
                        if (p[j] != 0) {
                            double t = p[j] / s * get_at(v, (int64_t[]){b, h, j, e});
                            o += t, om += fabs(t);
                        }
                    int64_t at = ravel(4, (int64_t[]){B, H, Sq, Dv}, (int64_t[]){b, h, i, e});
                    out[at] = o;
                    if (mag)
                        mag[at] = om;
                }
            }
    }
    free(p);
}

void tu_ref_concat(const sj_tensor *xs, int n, int axis, double *out) {
    int64_t shape[SJ_MAX_RANK], idx[SJ_MAX_RANK];
    memcpy(shape, xs[0].shape, sizeof shape);
    shape[axis] = 0;
    for (int i = 0; i < n; i++) shape[axis] += xs[i].shape[axis];
    int64_t total = 1;
    for (int d = 0; d < xs[0].rank; d++) total *= shape[d];
    for (int64_t o = 0; o < total; o++) {
        unravel(xs[0].rank, shape, o, idx);
        int i = 0;
        while (idx[axis] >= xs[i].shape[axis]) idx[axis] -= xs[i++].shape[axis];
        out[o] = get_at(&xs[i], idx);
    }
}

void tu_ref_gather(const sj_tensor *table, const sj_tensor *idx, double *out) {
    int64_t rest = 1, tidx[SJ_MAX_RANK];
    for (int d = 1; d < table->rank; d++) rest *= table->shape[d];
    for (int64_t p = 0, n = tu_numel(idx); p < n; p++)
        for (int64_t r = 0; r < rest; r++) {
            unravel(table->rank - 1, table->shape + 1, r, tidx + 1);
            tidx[0] = tu_geti(idx, p);
            out[p * rest + r] = get_at(table, tidx);
        }
}

uint16_t tu_f32_to_f16_ref(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u, e8 = (x >> 23) & 0xffu, mant = x & 0x7fffffu;
    if (e8 == 0xff) return (uint16_t)(sign | 0x7c00u | (mant ? 0x200u : 0)); /* inf, NaN */
    int32_t exp = (int32_t)e8 - 127 + 15;
    if (exp >= 31) return (uint16_t)(sign | 0x7c00u);                        /* overflow: inf */
    if (exp <= 0) {                                                           /* subnormal or zero */
        if (exp < -10) return (uint16_t)sign;
        mant |= 0x800000u;
        int shift = 14 - exp;
        uint32_t h = mant >> shift, rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (h & 1))) h++;
        return (uint16_t)(sign | h);
    }
    uint32_t h = ((uint32_t)exp << 10) | (mant >> 13), rem = mant & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1))) h++; /* a carry into the exponent is right */
    return (uint16_t)(sign | h);
}
