/* Eager data movement: concat and gather (embedding lookup).
 *
 * Both copy with sj_cpu_copy (same dtype: memcpy when contiguous) or, for
 * gather rows that are contiguous on both sides, memcpy directly.
 */
#include <assert.h>
#include <string.h>

#include "base/error.h"
#include "base/tensor.h"
#include "kernels/cpu/cpu_int.h"
#include "kernels/cpu/eager.h"

/* -- Concat --------------------------------------------------------------- */

static sj_status copy_host(void *ctx, const sj_tensor *x, const sj_tensor *y) {
    (void)ctx;
    return sj_cpu_copy(x, y);
}

sj_status sj_cpu_concat(const sj_tensor *xs, int n, int axis, const sj_tensor *y) {
    return sj_tensor_concat(xs, n, axis, y, copy_host, NULL);
}

/* -- Gather --------------------------------------------------------------- */

/* Every index, in row-major order of idx (position p), with its offsets:
 * returns the first position whose index is outside [0, V), or -1. With
 * copy set, also copies the table row for each. */
static int64_t gather_walk(const sj_tensor *table, const sj_tensor *idx, const sj_tensor *y,
                           int copy, int64_t *bad) {
    int ri = idx->rank, fast = sj_tensor_contiguous_from(table, 1) && sj_tensor_contiguous_from(y, ri);
    int64_t V = table->shape[0], es = (int64_t)cpu_dtype_size(table->dtype), rowel = 1;
    int64_t pos[SJ_MAX_RANK] = {0}, count = 1;
    for (int i = 1; i < table->rank; i++) rowel *= table->shape[i];
    for (int i = 0; i < ri; i++) count *= idx->shape[i];
    sj_tensor src = *table, dst = *y;
    src.rank = dst.rank = table->rank - 1;
    for (int i = 0; i < src.rank; i++) {
        src.shape[i] = dst.shape[i] = table->shape[i + 1];
        src.stride[i] = table->stride[i + 1];
        dst.stride[i] = y->stride[ri + i];
    }
    for (int64_t p = 0; p < count; p++) {
        int64_t io = 0, yo = 0;
        for (int i = 0; i < ri; i++) {
            io += pos[i] * idx->stride[i];
            yo += pos[i] * y->stride[i];
        }
        int64_t v = cpu_ld_i64(idx->data, idx->dtype, io);
        if (v < 0 || v >= V) {
            *bad = v;
            return p;
        }
        if (copy && rowel > 0) {
            const char *s = (const char *)table->data + v * table->stride[0] * es;
            char *d = (char *)y->data + yo * es;
            if (fast) {
                memcpy(d, s, (size_t)(rowel * es));
            } else {
                src.data = (void *)s;
                dst.data = d;
                sj_cpu_copy(&src, &dst);
            }
        }
        for (int i = ri - 1; i >= 0 && ++pos[i] == idx->shape[i]; i--) pos[i] = 0;
    }
    return -1;
}

sj_status sj_cpu_gather(const sj_tensor *table, const sj_tensor *idx, const sj_tensor *y) {
    assert(table->rank >= 1 && table->dtype == y->dtype);
    assert(idx->dtype == SJ_I32 || idx->dtype == SJ_I64);
    assert(y->rank == idx->rank + table->rank - 1);
    for (int i = 0; i < idx->rank; i++) assert(y->shape[i] == idx->shape[i]);
    for (int i = 1; i < table->rank; i++) assert(y->shape[idx->rank + i - 1] == table->shape[i]);
    /* check every index before writing anything, so an error leaves y as
     * it was */
    int64_t bad = 0, p = gather_walk(table, idx, y, 0, &bad);
    if (p >= 0)
        return sj_seterr(SJ_EINDEX, "gather: index %lld out of range [0, %lld) at position %lld",
                         (long long)bad, (long long)table->shape[0], (long long)p);
    gather_walk(table, idx, y, 1, &bad);
    return SJ_OK;
}

/* -- Arange ----------------------------------------------------------------- */

sj_status sj_cpu_arange(const sj_tensor *y) {
    assert(y->rank == 1 && y->dtype != SJ_BOOL);
    int64_t n = y->shape[0], s = y->stride[0];
    char *p = y->data;
    size_t es = sj_dtype_size(y->dtype);
    for (int64_t i = 0; i < n; i++) {
        void *d = p + (size_t)(i * s) * es;
        if (y->dtype == SJ_F32 || y->dtype == SJ_F16 || y->dtype == SJ_BF16) {
            float f = (float)i;
            cpu_store_f32(d, y->dtype, 1, &f, 1);
        } else {
            cpu_store_i64(d, y->dtype, 1, &i, 1);
        }
    }
    return SJ_OK;
}
