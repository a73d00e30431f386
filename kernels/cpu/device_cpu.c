/* The CPU device: the device table (kernels/device.h) filled for the
 * host. Compiles go to the system compiler (backend_cpu.c), eager ops to
 * the kernels of eager.h, generated groups run split over the kernel
 * thread pool (threads.c), which is every call's context. */
#include <stdlib.h>

#include "base/alloc.h"
#include "base/error.h"
#include "kernels/cpu/backend_cpu.h"
#include "kernels/cpu/eager.h"
#include "kernels/cpu/prepack.h"
#include "kernels/cpu/threads.h"
#include "kernels/device.h"

/* -- The eager kernels ------------------------------------------------------------- */

static sj_status k_unary(void *c, sj_op op, const sj_tensor *x, const sj_tensor *y) { return sj_cpu_unary(op, x, y); }
static sj_status k_binary(void *c, sj_op op, const sj_tensor *a, const sj_tensor *b, const sj_tensor *y) {
    return sj_cpu_binary(op, a, b, y);
}
static sj_status k_where(void *c, const sj_tensor *w, const sj_tensor *a, const sj_tensor *b, const sj_tensor *y) {
    return sj_cpu_where(w, a, b, y);
}
static sj_status k_copy(void *c, const sj_tensor *x, const sj_tensor *y) { return sj_cpu_copy(x, y); }
static sj_status k_reduce(void *c, sj_op op, const sj_tensor *x, int axis, const sj_tensor *y) {
    return sj_cpu_reduce(op, x, axis, y);
}
static sj_status k_softmax(void *c, const sj_tensor *x, int axis, const sj_tensor *y) {
    return sj_cpu_softmax(x, axis, y);
}
static sj_status k_layer_norm(void *c, const sj_tensor *x, const sj_tensor *g, const sj_tensor *b, double eps,
                              const sj_tensor *y) {
    return sj_cpu_layer_norm(x, g, b, eps, y);
}
static sj_status k_rms_norm(void *c, const sj_tensor *x, const sj_tensor *g, double eps, const sj_tensor *y) {
    return sj_cpu_rms_norm(x, g, eps, y);
}
static sj_status k_matmul(void *c, const sj_tensor *a, const sj_tensor *b, const sj_tensor *bias, const sj_tensor *y) {
    return sj_cpu_matmul_bias(a, b, bias, y, c);
}
static sj_status k_matmul_packed(void *c, const sj_tensor *a, const sj_tensor *b, const void *packed,
                                 const sj_tensor *bias, const sj_tensor *y) {
    return sj_cpu_matmul_packed(a, b, packed, bias, y, c);
}
static sj_status k_attention(void *c, const sj_tensor *q, const sj_tensor *k, const sj_tensor *v,
                             const sj_tensor *lengths, const sj_tensor *mask, double scale, int causal,
                             const sj_tensor *y) {
    return sj_cpu_attention_mask(q, k, v, lengths, mask, scale, causal, y, c);
}
static sj_status k_concat(void *c, const sj_tensor *xs, int n, int axis, const sj_tensor *y) {
    return sj_cpu_concat(xs, n, axis, y);
}
static sj_status k_gather(void *c, const sj_tensor *t, const sj_tensor *idx, const sj_tensor *y) {
    return sj_cpu_gather(t, idx, y);
}
static sj_status k_arange(void *c, const sj_tensor *y) { return sj_cpu_arange(y); }
static sj_status k_attention_varlen(void *c, const sj_tensor *q, const sj_tensor *k, const sj_tensor *v,
                                    const sj_tensor *offsets, double scale, int causal, const sj_tensor *y) {
    return sj_cpu_attention_varlen(q, k, v, offsets, scale, causal, y, c);
}



/* A product with its epilogue inside (the packed kernel per block of rows
 * and panels, or each part of a split sgemm). */
static sj_status k_matmul_epi(void *c, const sj_tensor *a, const sj_tensor *b, const void *packed,
                              const sj_tensor *bias, const sj_tensor *y, const sj_dev_epilogue *epi, int *fused) {
    sj_cpu_epilogue ce = {epi->fn, epi->p, epi->s};
    return sj_cpu_matmul_epi(a, b, packed, bias, y, c, &ce, fused);
}

typedef void (*cpu_gen_fn)(void *const *p, const int64_t *s, int64_t begin, int64_t end);

static void run_range(void *ctx, int64_t begin, int64_t end) {
    const sj_dev_launch *d = ctx;
    ((cpu_gen_fn)d->fn)(d->ptrs, d->syms, begin, end);
}

/* A generated group's work items split across the kernel threads, in
 * chunks of at least the descriptor's, over only the threads that get the
 * pool's minimum of work each (an element counting SJ_THREADS_ELEM_WORK
 * multiply-adds). */
static sj_status cpu_launch(void *ctx, const sj_dev_launch *d) {
    if (d->items <= 0) return SJ_OK;
    sj_threads *pool = ctx;
    int64_t per_item = d->item_elems > 0 ? d->item_elems : 1;
    sj_threads_split(pool, d->items, d->min_chunk, sj_threads_items(pool, SJ_THREADS_ELEM_WORK * per_item), run_range,
                     (void *)d);
    return SJ_OK;
}

/* The context of a call is the device's kernel thread pool (NULL:
 * every kernel runs on the caller's thread). */
static void *exec_call_begin(sj_backend *b, sj_dev_call *buf, void *stream, bool sync, bool wait, int n_syms) {
    (void)b, (void)buf, (void)stream, (void)sync, (void)wait, (void)n_syms;
    return NULL;
}

const sj_backend sj_cpu_exec_ops = {
    .name = "cpu",
    .device = SJ_HOST,
    .call_begin = exec_call_begin,
    .k = {k_unary, k_binary, k_where, k_copy, k_reduce, k_softmax, k_layer_norm, k_rms_norm, k_matmul, k_attention,
          k_concat, k_gather, k_arange, k_matmul_packed, k_attention_varlen, k_matmul_epi},
    .launch = cpu_launch,
};

/* -- The device ----------------------------------------------------------------- */

typedef struct cpu_device {
    sj_dev_common common; /* first: the table, then the compiler */
    sj_threads *threads;  /* the kernel threads: every call's context */
} cpu_device;

static cpu_device *D(const sj_backend *b) { return (cpu_device *)b; }

static void *call_begin(sj_backend *b, sj_dev_call *buf, void *stream, bool sync, bool wait, int n_syms) {
    (void)buf, (void)stream, (void)sync, (void)wait, (void)n_syms;
    return D(b)->threads;
}

static sj_status make_compiler(cpu_device *d, const sj_dev_config *c) {
    sj_cpu_backend_config bc = {.cc = c->cc, .cflags = c->cflags, .cc_version = c->cc_version,
                                .dump_dir = c->dump_dir, .cache = c->cache, .remote = c->remote, .log = c->log,
                                .test_delay_ms = c->test_delay_ms, .test_fail = c->test_fail,
                                .timeout_ms = c->timeout_ms, .no_probe = c->no_probe};
    return sj_cpu_backend_create(&bc, &d->common.cc);
}

static sj_status recompiler(sj_backend *b, const sj_dev_config *c) {
    cpu_device *d = D(b);
    if (d->common.cc) d->common.cc->destroy(d->common.cc);
    d->common.cc = NULL;
    return c ? make_compiler(d, c) : SJ_OK;
}

static void destroy(sj_backend *b) {
    cpu_device *d = D(b);
    if (!d) return;
    if (d->common.cc) d->common.cc->destroy(d->common.cc);
    sj_threads_destroy(d->threads);
    free(d);
}

sj_status sj_cpu_device_create(const sj_dev_config *c, sj_backend **out) {
    *out = NULL;
    cpu_device *d = sj_calloc(1, sizeof *d);
    if (!d) return sj_seterr(SJ_ENOMEM, "out of memory for the CPU device");
    sj_backend *b = &d->common.base;
    *b = sj_cpu_exec_ops;
    sj_device_forward_compile(b);
    b->destroy = destroy;
    b->recompiler = recompiler;
    b->call_begin = call_begin;
    sj_status st = make_compiler(d, c);
    if (!st && !(d->threads = sj_threads_create(c->exec_threads)))
        st = sj_seterr(SJ_ENOMEM, "cannot start %d kernel threads", c->exec_threads);
    if (!st) sj_threads_set_min_work(d->threads, c->exec_min_work > 0 ? c->exec_min_work : SJ_THREADS_MIN_WORK);
    if (!st) sj_threads_set_spin_ns(d->threads, (int64_t)c->exec_spin_us * 1000);
    if (st) {
        destroy(b);
        return st;
    }
    if (c->blas_threads >= 0) sj_cpu_blas_threads(c->blas_threads ? c->blas_threads : 1);
    *out = b;
    return SJ_OK;
}
