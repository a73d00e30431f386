/* Test helpers linked into every test program (tests/util_ref.c): a seeded
 * PRNG, tensors of any layout over tracked memory, element access for every
 * dtype as double, poison fills, tolerance checks against float64
 * references, and float64 reference implementations of the ops.
 *
 * Memory: every tu_tensor* allocation is tracked and released by
 * tu_free_all() (call it in each test's teardown). Not thread-safe.
 */
#ifndef SJ_TEST_UTIL_H
#define SJ_TEST_UTIL_H

#include <stdbool.h>
#include <stdint.h>

#include "jit/ops.h"
#include "jit/shapejit.h"

/* -- Random numbers (xoshiro-style 64-bit generator, seeded) -------------- */

void tu_seed(uint64_t seed);
uint64_t tu_rand(void);
double tu_uniform(double lo, double hi);    /* [lo, hi) */
int64_t tu_randint(int64_t lo, int64_t hi); /* [lo, hi] */

/* -- Tensors -------------------------------------------------------------- */

/* Contiguous row-major tensor; elements poisoned. */
sj_tensor tu_tensor(sj_dtype dt, int rank, const int64_t *shape);

/* A strided view of `shape` inside a larger buffer: axes laid out in memory
 * in the order `order` (order[0] outermost; NULL: natural order), the
 * innermost axis at stride 1 + gap and each outer axis `gap` elements past
 * the extent of the one inside it, with `gap` elements before the view too.
 * gap 0 with a NULL order is contiguous. The whole buffer is filled with
 * the byte 0xA5 and the view's elements poisoned (see tu_check_gaps). */
sj_tensor tu_tensor_strided(sj_dtype dt, int rank, const int64_t *shape, const int *order,
                            int64_t gap);

/* Common layouts for tu_tensor_layout: contiguous; every axis padded
 * (inner stride 2); axes reversed in memory (column-major); both. */
enum { TU_CONTIG, TU_GAP, TU_REV, TU_REVGAP, TU_LAYOUTS };
sj_tensor tu_tensor_layout(sj_dtype dt, int rank, const int64_t *shape, int layout);

/* numpy broadcast view of t to (rank, shape): t's axes align to the right;
 * new axes and size-1 axes that grow get stride 0. */
sj_tensor tu_broadcast(const sj_tensor *t, int rank, const int64_t *shape);

/* View with axes a and b swapped. */
sj_tensor tu_transpose(const sj_tensor *t, int a, int b);

void tu_free_all(void);

/* Two reusable buffers of doubles for references (slot 0 or 1, at least n
 * elements), valid until the slot is asked for more or tu_free_all(). */
double *tu_refbuf(int slot, int64_t n);

/* printf into a static buffer, for check labels. */
const char *tu_label(const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;

int64_t tu_numel(const sj_tensor *t);

/* -- Element access ----------------------------------------------------------
 * i is the row-major logical index over t's shape. */

double tu_get(const sj_tensor *t, int64_t i);
int64_t tu_geti(const sj_tensor *t, int64_t i);       /* integer and bool dtypes, exact */
void tu_set(const sj_tensor *t, int64_t i, double v); /* stored as tu_round(dtype, v) */
void tu_seti(const sj_tensor *t, int64_t i, int64_t v);
/* Every element from v[0 .. numel). */
void tu_set_all(const sj_tensor *t, const double *v);
void tu_seti_all(const sj_tensor *t, const int64_t *v);

/* The value v becomes when stored in dt: f32/f16/bf16 round to nearest even
 * (implemented here with frexp/nearbyint, independently of kernels/half.h),
 * ints truncate and saturate (NaN -> 0), bool is v != 0. */
double tu_round(sj_dtype dt, double v);

/* Encodings used by tu_set, exposed to test kernels/half.h against. */
uint16_t tu_f16_bits(double v);
uint16_t tu_bf16_bits(double v);
double tu_f16_value(uint16_t h);

/* -- Filling -------------------------------------------------------------- */

/* Never zero: floats uniform in +-[0.05, 2], ints in [-5, 5] \ {0}; bool is
 * random 0/1. */
void tu_fill_random(const sj_tensor *t);
/* Uniform in [lo, hi] (ints: integers in [lo, hi], zero allowed). */
void tu_fill_range(const sj_tensor *t, double lo, double hi);
/* Poison every element: a signalling NaN payload no kernel produces for
 * floats, 0x5AA5... for ints, 0xA5 (neither 0 nor 1) for bool. */
void tu_poison(const sj_tensor *t);
int tu_is_poison(const sj_tensor *t, int64_t i);

/* -- Checking ------------------------------------------------------------- */

/* Default tolerance: f32 1e-5, f16 2e-3, bf16 2e-2, ints and bool 0. */
double tu_tol(sj_dtype dt);

/* out against ref (tu_numel(out) doubles, row-major). Passes when no element
 * is poison; NaN in ref is matched by NaN in out and NaN never passes
 * otherwise; infinities match exactly; each element has
 * |out - ref| <= tol * (|ref| + 0.1 * rms(ref)); and the relative norm
 * ||out - ref|| / ||ref|| <= tol. tol 0 means exact. Prints the first
 * mismatches to stderr, labelled with `what`. Returns 1 on pass. */
int tu_check(const sj_tensor *out, const double *ref, double tol, const char *what);

/* The same with the error scaled by mag[i] (>= 0) instead of |ref[i]|: for
 * results that sum terms which may cancel (matmul: mag = sum |a||b|), whose
 * rounding error follows the terms, not the result. mag NULL is tu_check. */
int tu_check_mag(const sj_tensor *out, const double *ref, const double *mag, double tol,
                 const char *what);

/* For a tu_tensor_strided view: the bytes of its buffer outside the view's
 * elements are still 0xA5 (nothing written outside the view). */
int tu_check_gaps(const sj_tensor *t, const char *what);

/* -- float64 references ------------------------------------------------------
 * Operands as for the eager kernels (already broadcast where elementwise);
 * out holds the result row-major. Float math in double; integer ops exact in
 * int64 (wrapping) with the documented semantics. */

double tu_ref_unary1(sj_op op, double x);
double tu_ref_binary1(sj_op op, double a, double b); /* compare ops give 0/1 */
int64_t tu_ref_binary1_i(sj_op op, int64_t a, int64_t b);

void tu_ref_unary(sj_op op, const sj_tensor *x, double *out);
void tu_ref_binary(sj_op op, const sj_tensor *a, const sj_tensor *b, double *out);
void tu_ref_where(const sj_tensor *c, const sj_tensor *a, const sj_tensor *b, double *out);
void tu_ref_cast(const sj_tensor *x, sj_dtype to, double *out);
void tu_ref_reduce(sj_op op, const sj_tensor *x, int axis, double *out);
void tu_ref_softmax(const sj_tensor *x, int axis, double *out);
void tu_ref_layer_norm(const sj_tensor *x, const sj_tensor *g, const sj_tensor *b, double eps,
                       double *out);
void tu_ref_rms_norm(const sj_tensor *x, const sj_tensor *g, double eps, double *out);
/* mag (NULL or like out): sum |a||b| for matmul, sum p |v| for attention. */
void tu_ref_matmul(const sj_tensor *a, const sj_tensor *b, double *out, double *mag);
void tu_ref_attention(const sj_tensor *q, const sj_tensor *k, const sj_tensor *v,
                      const sj_tensor *lengths, double scale, int causal, double *out, double *mag);
void tu_ref_concat(const sj_tensor *xs, int n, int axis, double *out);
void tu_ref_gather(const sj_tensor *table, const sj_tensor *idx, double *out);

#endif /* SJ_TEST_UTIL_H */
