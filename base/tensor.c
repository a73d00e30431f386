/* Tensor descriptors: dtype tables, construction and validation. */
#include "base/tensor.h"

#include <assert.h>
#include <stdint.h>
#include <string.h>

#include "base/error.h"

static const size_t dtype_sizes[] = {
#define SJ_X(name, e, bytes) bytes,
    SJ_DTYPE_LIST(SJ_X)
#undef SJ_X
};
static const char *const dtype_names[] = {
#define SJ_X(name, e, bytes) #name,
    SJ_DTYPE_LIST(SJ_X)
#undef SJ_X
};
_Static_assert(sizeof dtype_sizes / sizeof dtype_sizes[0] == SJ_DTYPE_COUNT, "dtype size table");
_Static_assert(sizeof dtype_names / sizeof dtype_names[0] == SJ_DTYPE_COUNT, "dtype name table");

size_t sj_dtype_size(sj_dtype dt) { return (unsigned)dt < SJ_DTYPE_COUNT ? dtype_sizes[dt] : 0; }
const char *sj_dtype_name(sj_dtype dt) { return (unsigned)dt < SJ_DTYPE_COUNT ? dtype_names[dt] : "?"; }

sj_tensor sj_tensor_make(void *data, sj_dtype dt, int rank, const int64_t *shape) {
    sj_tensor t;
    memset(&t, 0, sizeof t);
    t.data = data;
    t.dtype = dt;
    t.device = SJ_HOST;
    if (rank < 0 || rank > SJ_MAX_RANK || (rank > 0 && !shape)) {
        t.rank = -1;
        return t;
    }
    t.rank = rank;
    for (int i = 0; i < rank; i++) t.shape[i] = shape[i];
    sj_tensor_set_contiguous(&t);
    return t;
}

/* a * b for a, b >= 0, saturating at INT64_MAX. */
static int64_t mul_sat(int64_t a, int64_t b) {
    int64_t r;
    return __builtin_mul_overflow(a, b, &r) ? INT64_MAX : r;
}

void sj_tensor_set_contiguous(sj_tensor *x) {
    if (x->rank < 0 || x->rank > SJ_MAX_RANK) return; /* invalid: left for the check to name */
    int64_t s = 1; /* saturates: sizes past the element limit fail the check, never overflow here */
    for (int i = x->rank - 1; i >= 0; i--) {
        x->stride[i] = s;
        s = mul_sat(s, x->shape[i] > 0 ? x->shape[i] : 1);
    }
}

int64_t sj_tensor_numel(const sj_tensor *t) {
    if (!t || t->rank < 0 || t->rank > SJ_MAX_RANK) return 0;
    int64_t n = 1;
    for (int i = 0; i < t->rank; i++) {
        if (t->shape[i] <= 0) return 0; /* empty (negative sizes are invalid: none) */
        n = mul_sat(n, t->shape[i]);
    }
    return n;
}

size_t sj_tensor_nbytes(const sj_tensor *x) {
    size_t r;
    return __builtin_mul_overflow((size_t)sj_tensor_numel(x), sj_dtype_size(x->dtype), &r) ? SIZE_MAX : r;
}

bool sj_tensor_contiguous_from(const sj_tensor *x, int from) {
    int64_t s = 1;
    for (int i = x->rank - 1; i >= from; i--) {
        if (x->shape[i] != 1 && x->stride[i] != s) return false;
        s *= x->shape[i];
    }
    return true;
}

bool sj_tensor_is_contiguous(const sj_tensor *x) { return sj_tensor_contiguous_from(x, 0); }

sj_tensor sj_tensor_narrow(const sj_tensor *x, int axis, int64_t start, int64_t len) {
    sj_tensor t = *x;
    t.shape[axis] = len;
    t.data = (char *)x->data + (size_t)(start * x->stride[axis]) * sj_dtype_size(x->dtype);
    return t;
}

sj_status sj_tensor_concat(const sj_tensor *xs, int n, int axis, const sj_tensor *y,
                           sj_status (*copy)(void *ctx, const sj_tensor *x, const sj_tensor *y), void *ctx) {
    assert(n >= 1);
    if (axis < 0) axis += y->rank;
    assert(axis >= 0 && axis < y->rank);
    int64_t off = 0;
    for (int i = 0; i < n; i++) {
        const sj_tensor *x = &xs[i];
        assert(x->dtype == y->dtype && x->rank == y->rank);
        sj_tensor dst = sj_tensor_narrow(y, axis, off, x->shape[axis]);
        off += x->shape[axis];
        assert(off <= y->shape[axis]);
        sj_status st = copy(ctx, x, &dst);
        if (st) return st;
    }
    assert(off == y->shape[axis]);
    return SJ_OK;
}

int sj_sizes_bad_axis(const int64_t *shape, int rank, bool *empty) {
    int64_t span = 1;
    bool e0 = false;
    for (int i = 0; i < rank; i++) {
        int64_t d = shape[i], e = d > 0 ? d : 1;
        if (d < 0 || span > SJ_MAX_SPAN / e) return i;
        span *= e;
        e0 |= d == 0;
    }
    if (empty) *empty = e0;
    return -1;
}

/* The first axis at which the memory the strides address (the largest
 * element offset + 1) passes SJ_MAX_SPAN, or -1. Axes of size 0 or 1 take
 * no stride; call it on valid sizes and strides >= 0. Keeps every element
 * offset, in elements and in bytes, far from int64 overflow. */
static int stride_bad_axis(const sj_tensor *x) {
    int64_t last = 0; /* largest offset so far, <= SJ_MAX_SPAN - 1 */
    for (int i = 0; i < x->rank; i++) {
        int64_t d = x->shape[i], s = x->stride[i];
        if (d <= 1 || s == 0) continue;
        if (s > (SJ_MAX_SPAN - 1 - last) / (d - 1)) return i;
        last += (d - 1) * s;
    }
    return -1;
}

bool sj_tensor_valid(const sj_tensor *x) {
    bool empty;
    if ((unsigned)x->dtype >= SJ_DTYPE_COUNT || x->rank < 0 || x->rank > SJ_MAX_RANK ||
        (x->device != SJ_HOST && x->device != SJ_CUDA) || sj_sizes_bad_axis(x->shape, x->rank, &empty) >= 0)
        return false;
    for (int i = 0; i < x->rank; i++)
        if (x->stride[i] < 0) return false;
    if (!empty && stride_bad_axis(x) >= 0) return false;
    return empty || x->data != NULL;
}

sj_status sj_tensor_check(const sj_tensor *x, const char *what) {
    if (!sj_dtype_size(x->dtype))
        return sj_seterr(SJ_EINVAL, "%s: dtype %d is not a dtype", what, (int)x->dtype);
    if (x->rank < 0 || x->rank > SJ_MAX_RANK)
        return sj_seterr(SJ_EINVAL, "%s: rank %d out of range [0, %d]", what, (int)x->rank, SJ_MAX_RANK);
    if (x->device != SJ_HOST && x->device != SJ_CUDA)
        return sj_seterr(SJ_EINVAL, "%s: device %d is not a device", what, (int)x->device);
    bool empty;
    int a = sj_sizes_bad_axis(x->shape, x->rank, &empty);
    if (a >= 0 && x->shape[a] < 0)
        return sj_seterr(SJ_EINVAL, "%s: size %lld at axis %d is negative", what, (long long)x->shape[a], a);
    if (a >= 0)
        return sj_seterr(SJ_EINVAL,
                         "%s: too many elements: the sizes multiply past 2^48 at axis %d (size %lld; a size of 0 counts as 1)",
                         what, a, (long long)x->shape[a]);
    for (int i = 0; i < x->rank; i++)
        if (x->stride[i] < 0)
            return sj_seterr(SJ_EINVAL, "%s: stride %lld at axis %d is negative", what, (long long)x->stride[i], i);
    if (!empty && (a = stride_bad_axis(x)) >= 0)
        return sj_seterr(SJ_EINVAL,
                         "%s: stride %lld at axis %d (size %lld) addresses past 2^48 elements (the strides' span "
                         "is limited as the sizes' product is)",
                         what, (long long)x->stride[a], a, (long long)x->shape[a]);
    if (!empty && !x->data) return sj_seterr(SJ_EINVAL, "%s: data is NULL", what);
    return SJ_OK;
}
