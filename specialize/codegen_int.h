/* Private to the code generators (codegen_c.c, codegen_cuda*.c): the output
 * buffer, the per-group context, and the pieces both languages share, all
 * defined in codegen_c.c.
 *
 * Both generators emit a group's values the same way: every size, stride
 * and offset is an int64_t expression (a literal when specialized, else
 * over s0, s1, ...); a loaded element is `const <ctype> L<k> = ...;`, a
 * computed one `const <ctype> v<id> = ...;` (float for f32/f16/bf16,
 * int64_t for i32/i64/bool), so the op expressions are one text for C and
 * CUDA C++. Only where an element lives differs, which the generator says
 * through sj_cg.elem.
 *
 * Blocks: a block computes some of the group's values at one element.
 * c->want marks the nodes (by position in G->nodes) to compute, c->avail
 * the ones already defined; sj_cg_close_want adds in-group operands (never
 * through the row node: each pass says what it needs of that one).
 */
#ifndef SJ_CODEGEN_INT_H
#define SJ_CODEGEN_INT_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "specialize/fusion.h"

#define SJ_CG_MAX_ACC (2 * SJ_MAX_INPUTS + 64) /* accesses of one group */

/* -- Output buffer ------------------------------------------------------------ */

typedef struct sj_sbuf {
    char *s;
    size_t len, cap;
    bool oom; /* an allocation failed: later writes are dropped */
} sj_sbuf;

void sj_cg_vput(sj_sbuf *b, const char *fmt, va_list ap);
#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
void sj_cg_put(sj_sbuf *b, const char *fmt, ...);

/* -- Context -------------------------------------------------------------------- */

typedef struct sj_cg sj_cg;

/* Write element `ix` of access k as an lvalue of its storage type (ix NULL:
 * the element at the current row's or segment's start). */
typedef void (*sj_cg_elem_fn)(sj_cg *c, int k, const char *ix);

struct sj_cg {
    float test_skew; /* sj_codegen_opts.test_skew */
    const sj_graph *g;
    const sj_fplan *p;
    const int64_t *sym;    /* NULL: symbolic form */
    sj_sbuf o;
    const sj_group *G;
    int32_t *vpos;         /* per value: position in G->nodes of its node, or -1 */
    int n_acc;             /* loads then stores */
    const sj_access *acc[SJ_CG_MAX_ACC];
    int rp;                /* ROW: position of the row node */
    bool *want, *avail;    /* per position */
    bool lw[SJ_CG_MAX_ACC]; /* loads a block reads */
    sj_cg_elem_fn elem;
    /* NULL, or: does elem write access k at ix as a float (a 16-bit access
     * the generator converts a chunk at a time)? Then its loads and stores
     * convert nothing. */
    bool (*f32_elem)(sj_cg *c, int k, const char *ix);
    void *user;            /* the generator's own state */
};

/* Allocate the per-value and per-node arrays (sets o.oom on failure). */
void sj_cg_init(sj_cg *c, const sj_graph *g, const sj_fplan *p, const int64_t *sym_vals);
/* Point c at generated group G: its accesses (loads, then stores) and the
 * positions of its values. */
void sj_cg_group(sj_cg *c, const sj_group *G);
void sj_cg_fini(sj_cg *c); /* frees the arrays, not the text */
/* sj_cg_fini, then the unit's text (malloc'd; *len its length when len is
 * not NULL), or NULL when an allocation failed along the way. */
char *sj_cg_take(sj_cg *c, size_t *len);

/* -- Sizes and types -------------------------------------------------------------- */

/* Is e a literal in this form (always when specialized)? */
bool sj_cg_kconst(const sj_cg *c, sj_expr e, int64_t *v);
/* e as a C expression of type int64_t ("INT64_C(4)", "(s0*INT64_C(3))"). */
void sj_cg_put_ex(sj_cg *c, sj_expr e);
const char *sj_cg_ctype(sj_dtype dt); /* compute type: float or int64_t */
const char *sj_cg_stype(sj_dtype dt); /* storage type: float, uint16_t, int32_t, int64_t, uint8_t */
sj_dtype sj_cg_acc_dtype(const sj_cg *c, int k);
/* Access k's innermost stride if known: 0, 1, or -1 (anything else). */
int sj_cg_inner(const sj_cg *c, int k);
/* Is load k read once per row or segment (innermost stride 0)? */
bool sj_cg_hoisted(const sj_cg *c, int k);
/* A float literal that reads back exactly. */
void sj_cg_put_float(sj_cg *c, float f);

/* -- Values ------------------------------------------------------------------------ */

/* `const <ctype> L<k> = <element ix of load k, widened>;` */
void sj_cg_put_load(sj_cg *c, int k, const char *ix);
/* `<element ix of store k> = <v<val>, narrowed>;` */
void sj_cg_put_store(sj_cg *c, int k, const char *ix);
/* Operand u as an expression of its compute type (a literal, v<u> or L<k>). */
void sj_cg_put_ref(sj_cg *c, int32_t u);
/* `const <ctype> v<out> = <the elementwise op>;` */
void sj_cg_put_node(sj_cg *c, const sj_node *n);

/* -- Blocks ------------------------------------------------------------------------ */

void sj_cg_reset_want(sj_cg *c);
void sj_cg_want_val(sj_cg *c, int32_t u);
void sj_cg_close_want(sj_cg *c);
/* Mark the values stored from positions [lo, hi). */
void sj_cg_want_stores(sj_cg *c, int lo, int hi);
/* Set c->lw: the loads the wanted nodes read, and those of the values in
 * extra (-1 and values that are not loads are skipped). */
void sj_cg_mark_loads(sj_cg *c, const int32_t *extra, int n_extra);
/* sj_cg_mark_loads, then the marked loads that are not hoisted, at ix. */
void sj_cg_put_loads(sj_cg *c, const char *ix, const int32_t *extra, int n_extra);
/* The wanted nodes at positions [lo, hi), never the row node. */
void sj_cg_put_nodes(sj_cg *c, int lo, int hi);
/* Stores of the values at positions [lo, hi), at ix. */
void sj_cg_put_stores(sj_cg *c, int lo, int hi, const char *ix);

/* -- ROW groups -------------------------------------------------------------------- */

/* A ROW group's row op and its operands. */
typedef struct sj_cg_rowop {
    const sj_node *n;
    int32_t x, gw, bw; /* operands (-1 absent) */
    sj_dtype dt;       /* x's */
    bool reduce;       /* sum, mean or amax (else softmax or a norm) */
} sj_cg_rowop;

/* The row op of c->G (a ROW group); sets c->rp. */
sj_cg_rowop sj_cg_row_op(sj_cg *c);

#endif /* SJ_CODEGEN_INT_H */
