/* Symbolic integer expressions over dimension symbols.
 *
 * A pool (sj_exprs) holds symbols and hash-consed expressions in a canonical
 * form, so two expressions are equal exactly when their ids are equal:
 * sj_ex_add(p, a, b) == sj_ex_add(p, b, a), (s0 + 1) * 2 == 2*s0 + 2, and so
 * on. Ids are indices into the pool and every expression's operands have
 * smaller ids than itself, so evaluating all of them is one forward pass.
 *
 * Canonical form: sums of products with integer coefficients (a polynomial
 * over "atoms"), where an atom is a symbol or one of floordiv, mod, min, max
 * applied to canonical operands. A constant is its own node.
 *
 * Semantics are int64 with Python rounding: floordiv rounds toward -inf, mod
 * takes the sign of the divisor. Evaluating a division or modulo by zero
 * gives 0 (never traps); building one with a constant zero divisor fails.
 *
 * Thread safety: a pool is built by one thread (the tracer); once built, the
 * const functions may be called from any number of threads.
 */
#ifndef SJ_EXPR_H
#define SJ_EXPR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef int32_t sj_expr;  /* an id in a pool; SJ_EX_NONE when invalid */
#define SJ_EX_NONE ((sj_expr)-1)
#define SJ_EX_INF INT64_MAX /* an unbounded upper end of a range */

typedef struct sj_exprs sj_exprs;

sj_exprs *sj_exprs_create(void);
void sj_exprs_destroy(sj_exprs *p); /* NULL is a no-op */

/* -- Symbols ------------------------------------------------------------- */

/* A new symbol with a hint (the value first seen) and a value range
 * [lo, hi] (hi may be SJ_EX_INF). Returns its number (0, 1, ...), or -1 on
 * allocation failure. */
int sj_sym_new(sj_exprs *p, int64_t hint, int64_t lo, int64_t hi);
int sj_sym_count(const sj_exprs *p);
int64_t sj_sym_hint(const sj_exprs *p, int sym);
void sj_sym_range(const sj_exprs *p, int sym, int64_t *lo, int64_t *hi);
/* Narrow a symbol's range to the intersection with [lo, hi]. */
void sj_sym_narrow(sj_exprs *p, int sym, int64_t lo, int64_t hi);

/* -- Building ------------------------------------------------------------ */

/* Every builder returns a canonical id, or SJ_EX_NONE if an operand is
 * SJ_EX_NONE, on allocation failure, or for a constant zero divisor. */
sj_expr sj_ex_const(sj_exprs *p, int64_t c);
sj_expr sj_ex_sym(sj_exprs *p, int sym);
sj_expr sj_ex_add(sj_exprs *p, sj_expr a, sj_expr b);
sj_expr sj_ex_sub(sj_exprs *p, sj_expr a, sj_expr b);
sj_expr sj_ex_mul(sj_exprs *p, sj_expr a, sj_expr b);
sj_expr sj_ex_floordiv(sj_exprs *p, sj_expr a, sj_expr b);
sj_expr sj_ex_mod(sj_exprs *p, sj_expr a, sj_expr b);
sj_expr sj_ex_min(sj_exprs *p, sj_expr a, sj_expr b);
sj_expr sj_ex_max(sj_exprs *p, sj_expr a, sj_expr b);

/* e divided by the gcd of its coefficients and constant (e itself when that
 * is 1 or e is not a polynomial): e == 0 exactly when the result is 0. */
sj_expr sj_ex_primitive(sj_exprs *p, sj_expr e);

/* -- Inspecting ---------------------------------------------------------- */

int sj_ex_count(const sj_exprs *p); /* number of expression ids */
bool sj_ex_is_const(const sj_exprs *p, sj_expr e, int64_t *value);
bool sj_ex_is_sym(const sj_exprs *p, sj_expr e, int *sym);
/* The symbols e depends on, as a bitmask of the first 64 symbols (bit 63 also
 * stands for every symbol >= 63). */
uint64_t sj_ex_syms(const sj_exprs *p, sj_expr e);
/* Conservative bounds of e given the symbols' ranges (lo may be INT64_MIN,
 * hi SJ_EX_INF). */
void sj_ex_range(const sj_exprs *p, sj_expr e, int64_t *lo, int64_t *hi);

/* True when e is x % k or c*(x % k) (c != 0, no wrap) with k >= 2 a
 * constant: then e == 0 exactly when x is a multiple of k. */
bool sj_ex_is_mod_const(const sj_exprs *p, sj_expr e, sj_expr *x, int64_t *k);

/* -- Evaluating ---------------------------------------------------------- */

/* Value of e with symbol i = sym_vals[i]. */
int64_t sj_ex_eval(const sj_exprs *p, sj_expr e, const int64_t *sym_vals);
/* Value of e at the symbols' hints. */
int64_t sj_ex_hint(const sj_exprs *p, sj_expr e);
/* All expressions in one forward pass: out[id] for id in 0..sj_ex_count-1. */
void sj_ex_eval_all(const sj_exprs *p, const int64_t *sym_vals, int64_t *out);

/* -- Printing ------------------------------------------------------------ */

/* Human-readable, e.g. "2*s0 + 1", "s0//4", "min(s0, 8)". snprintf contract:
 * returns the length the full text needs; writes at most n bytes. Both
 * printers order terms and the operands of min and max by structure, not
 * by id: one expression made in another order (as a trace makes sizes in
 * the order its model function made ops) prints the same text. */
int sj_ex_print(const sj_exprs *p, sj_expr e, char *buf, size_t n);
/* A C expression of type int64_t over variables named `<prefix><i>` for
 * symbol i, using the macros SJ_FLOORDIV(a,b), SJ_MOD(a,b), SJ_MIN(a,b),
 * SJ_MAX(a,b) (defined in base/sj_kernel_rt.h for generated code) and
 * INT64_C constants. snprintf contract. */
int sj_ex_print_c(const sj_exprs *p, sj_expr e, const char *prefix, char *buf, size_t n);

/* -- Debugging ----------------------------------------------------------- */

/* Verify the pool's invariants (operands precede their users, polynomials in
 * canonical order, cached ranges and hints up to date, every node findable
 * in the hash table). Linear time; for tests and debug builds. */
bool sj_ex_check(const sj_exprs *p);

/* Fault injection for tests: in the calling thread, the next n allocations of
 * this module succeed and every later one fails, until called again; n < 0
 * (the default) never fails. */
void sj_ex_fail_allocs_after(long n);

#endif /* SJ_EXPR_H */
