/* Per-op shape inference over symbolic sizes.
 *
 * Every function takes operand shapes (expression ids in c->ex) and writes
 * the result shape, or returns SJ_ESHAPE with a short reason in c->msg
 * ("axis 1: 8 vs 9"); the tracer prefixes the op and operand shapes.
 *
 * When inference must decide something about sizes (are two sizes equal, is
 * a size 1, does one divide another) it answers from the canonical form and
 * the symbols' ranges when those settle it, and otherwise from the hints (the
 * sizes of the inputs being traced), recording the answer as a fact. The
 * facts are what the trace relied on; the guard system checks them on later
 * calls before reusing the trace.
 */
#ifndef SJ_INFER_H
#define SJ_INFER_H

#include <stdbool.h>

#include "jit/shapejit.h"
#include "shapes/expr.h"

typedef struct sj_shape {
    int rank;
    sj_expr d[SJ_MAX_RANK];
} sj_shape;

/* A relation the trace assumed: lhs REL rhs. */
typedef enum sj_rel { SJ_REL_EQ, SJ_REL_NE, SJ_REL_LT, SJ_REL_GE } sj_rel;
typedef struct sj_fact {
    sj_expr lhs, rhs;
    sj_rel rel;
    char why[128]; /* the op that relied on it, e.g. "add(f32[s0, 4], f32[s1, 4])" */
} sj_fact;

typedef struct sj_infer {
    sj_exprs *ex;
    sj_fact *facts;
    int n_facts, cap_facts;
    const char *why; /* set by the caller before each op: copied into new facts */
    char msg[256];
} sj_infer;

void sj_infer_init(sj_infer *c, sj_exprs *ex);
void sj_infer_free(sj_infer *c);

/* -- Decisions ----------------------------------------------------------- */

bool sj_infer_eq(sj_infer *c, sj_expr a, sj_expr b);    /* a == b */
bool sj_infer_lt(sj_infer *c, sj_expr a, sj_expr b);    /* a < b */
bool sj_infer_is_one(sj_infer *c, sj_expr a);           /* a == 1 */

/* Axis in [-rank, rank) -> [0, rank), or -1. */
int sj_axis_norm(int axis, int rank);

/* -- Per-op inference ---------------------------------------------------- */

/* numpy broadcasting of n shapes. */
sj_status sj_infer_broadcast(sj_infer *c, const sj_shape *const *in, int n, sj_shape *out);
/* Reduction over (already normalised) axis. */
sj_status sj_infer_reduce(sj_infer *c, const sj_shape *in, int axis, int keepdim, sj_shape *out);
/* [..., M, K] x [..., K, N] with broadcast batch axes. */
sj_status sj_infer_matmul(sj_infer *c, const sj_shape *a, const sj_shape *b, sj_shape *out);
/* New shape; dims[i] == SJ_EX_NONE marks the one inferred size. */
sj_status sj_infer_reshape(sj_infer *c, const sj_shape *in, int rank, const sj_expr *dims,
                           sj_shape *out);
/* out.d[i] = in.d[perm[i]]; perm validated here. */
sj_status sj_infer_permute(sj_infer *c, const sj_shape *in, const int *perm, sj_shape *out);
/* Python slice semantics along a normalised axis; *start_out is the
 * clamped first index. */
sj_status sj_infer_slice(sj_infer *c, const sj_shape *in, int axis, int64_t start, int64_t end,
                         int64_t step, sj_shape *out, sj_expr *start_out);
/* A step-1 slice with symbolic bounds (sizes, so >= 0): start and end are
 * clamped to the axis size; the length is max(0, end - start) after it. */
sj_status sj_infer_slice_dim(sj_infer *c, const sj_shape *in, int axis, sj_expr start, sj_expr end,
                             sj_shape *out, sj_expr *start_out);
/* Concatenation along a normalised axis. */
sj_status sj_infer_concat(sj_infer *c, const sj_shape *const *in, int n, int axis, sj_shape *out);
/* table [V, rest...], idx [...] -> [idx..., rest...]. */
sj_status sj_infer_gather(sj_infer *c, const sj_shape *table, const sj_shape *idx, sj_shape *out);
/* q [B,H,Sq,D], k [B,H,Sk,D], v [B,H,Sk,Dv], lengths NULL or [B]. */
sj_status sj_infer_attention(sj_infer *c, const sj_shape *q, const sj_shape *k, const sj_shape *v,
                             const sj_shape *lengths, sj_shape *out);
/* Attention over packed sequences: q [T, H, D], k [T, H, D], v [T, H, Dv],
 * offsets [B+1] (B+1 >= 2 when known) -> [T, H, Dv]. */
sj_status sj_infer_attention_varlen(sj_infer *c, const sj_shape *q, const sj_shape *k, const sj_shape *v,
                                    const sj_shape *offsets, sj_shape *out);

/* Number of elements of a shape as an expression. */
sj_expr sj_shape_numel(sj_exprs *ex, const sj_shape *s);

/* "[4, s0, 768]" */
char *sj_shape_str(const sj_exprs *ex, const sj_shape *s, char *buf, size_t n);

#endif /* SJ_INFER_H */
