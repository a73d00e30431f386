/* Tensor descriptor helpers shared by the call path, tracer and kernels. */
#ifndef SJ_TENSOR_H
#define SJ_TENSOR_H

#include <stdbool.h>

#include "jit/shapejit.h"

/* The first axis where sizes go wrong: a negative size, or the span
 * passing SJ_MAX_SPAN; -1 when none. *empty (when not NULL; set when none
 * is wrong) says whether a size is 0. The rule of sj_tensor_check and of traced
 * results' sizes. */
int sj_sizes_bad_axis(const int64_t *shape, int rank, bool *empty);

/* Validate a caller descriptor: dtype, rank, sizes >= 0, strides >= 0, data
 * non-NULL when it has elements, span at most SJ_MAX_SPAN. `what` names it
 * in the message ("input 'x'", "output 0"). */
sj_status sj_tensor_check(const sj_tensor *x, const char *what);

/* The same checks without a message, for the hot path: true when
 * sj_tensor_check would pass. */
bool sj_tensor_valid(const sj_tensor *x);

/* Row-major contiguous (size-1 axes may have any stride). */
bool sj_tensor_is_contiguous(const sj_tensor *x);
/* Are x's axes from `from` on one contiguous run (a row of the rest)? */
bool sj_tensor_contiguous_from(const sj_tensor *x, int from);

/* The view of x's elements [start, start + len) along axis (same strides). */
sj_tensor sj_tensor_narrow(const sj_tensor *x, int axis, int64_t start, int64_t len);

/* y = the n tensors xs concatenated along axis (negative: from the end),
 * each copied into its narrowed slice of y with copy(ctx, x, slice): the
 * concat of every device's eager kernels. Shapes are the caller's to have
 * checked (asserted). */
sj_status sj_tensor_concat(const sj_tensor *xs, int n, int axis, const sj_tensor *y,
                           sj_status (*copy)(void *ctx, const sj_tensor *x, const sj_tensor *y), void *ctx);

/* Fill x->stride with row-major contiguous strides (saturating at
 * INT64_MAX; nothing for a rank out of range). */
void sj_tensor_set_contiguous(sj_tensor *x);

/* Bytes a contiguous tensor of this shape and dtype needs (SIZE_MAX when
 * that overflows: an allocation of it fails). */
size_t sj_tensor_nbytes(const sj_tensor *x);

#endif
