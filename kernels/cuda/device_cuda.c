/* The CUDA device: the device table (kernels/device.h) filled for one GPU.
 *
 * Made once per runtime (sj_cuda_device_create): the context and the
 * eager kernels (cuda_dev.c, eager_cuda.c), the lanes (lanes.c), the
 * compiler (backend_cuda.c: NVRTC), and the slots of a call
 * (exec_cuda.c) and of graphs (graph_cuda.c). Everything here is reached
 * through the table; nothing in jit/ calls the driver.
 */
#include "kernels/cuda/exec_cuda.h"

#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/bounded.h"
#include "base/error.h"
#include "base/tensor.h"
#include "kernels/cpu/eager.h"
#include "kernels/cuda/backend_cuda.h"

typedef struct cuda_device {
    sj_dev_common common; /* first: the table, then the compiler */
    sj_cuda *cuda;
    sj_lanes *lanes;
    sj_allocator host; /* conversion buffers of sj_tensor_copy */
    sj_cache *cache;   /* the compiler's (borrowed): the products' tuning beside their units */
    sj_gemm_memo *gemm_memo; /* the products' tuning by unit key, this process (NULL: none) */
    const sj_log_sink *log;
} cuda_device;

_Static_assert(sizeof(sj_cuda_call) <= sizeof(sj_dev_call), "sj_dev_call cannot hold a CUDA call");

static void *call_begin(sj_backend *b, sj_dev_call *buf, void *stream, bool sync, bool wait, int n_syms);

static cuda_device *D(const sj_backend *b) { return (cuda_device *)b; }

sj_cuda *sj_cuda_of(const sj_backend *b) { return b && b->call_begin == call_begin ? D(b)->cuda : NULL; }

/* -- Compiling -------------------------------------------------------------------- */

static sj_status make_compiler(cuda_device *d, const sj_dev_config *c) {
    d->cache = c->cache;
    d->log = c->log;
    sj_cuda_backend_config bc = {.cuda = d->cuda, .cache = c->cache, .remote = c->remote, .dump_dir = c->dump_dir,
                                 .nvrtc_flags = c->nvrtc_flags, .log = c->log, .test_delay_ms = c->test_delay_ms,
                                 .test_fail = c->test_fail, .timeout_ms = c->timeout_ms};
    return sj_cuda_backend_create(&bc, &d->common.cc);
}

static sj_status recompiler(sj_backend *b, const sj_dev_config *c) {
    cuda_device *d = D(b);
    if (d->common.cc) d->common.cc->destroy(d->common.cc);
    d->common.cc = NULL;
    d->cache = NULL; /* closing with the compiler's */
    return c ? make_compiler(d, c) : SJ_OK;
}

static bool gemm_tune(sj_backend *b, const sj_graph *g, const struct sj_fplan *p, const int64_t *syms,
                      void *const *fns, const char *key, int8_t *pick) {
    cuda_device *d = D(b);
    return sj_cuda_gemm_tune(d->cuda, d->gemm_memo, d->cache, d->log, g, p, syms, fns, key, pick);
}

static void wait_abandoned(sj_backend *b, int timeout_ms) {
    (void)b;
    sj_bounded_wait_abandoned(timeout_ms);
}

static void destroy(sj_backend *b) {
    cuda_device *d = D(b);
    if (!d) return;
    /* No call is in flight (sj_runtime_destroy's contract) */
    sj_lanes_destroy(d->lanes);
    if (d->common.cc) d->common.cc->destroy(d->common.cc);
    sj_cuda_close(d->cuda);
    sj_gemm_memo_free(d->gemm_memo);
    free(d);
}

/* -- Memory the user owns ---------------------------------------------------------- */

static void *alloc(sj_backend *b, size_t bytes) {
    sj_cuda *cu = D(b)->cuda;
    return (void *)(uintptr_t)sj_cuda_alloc(cu, bytes ? bytes : 1, cu->stream);
}

static void dev_free(sj_backend *b, void *p) {
    sj_cuda *cu = D(b)->cuda;
    sj_cuda_free(cu, (CUdeviceptr)(uintptr_t)p, cu->stream);
}

/* A host copy of t's elements in another dtype (or its own), through the
 * runtime's allocator; NULL data on failure. */
static sj_tensor host_like(const cuda_device *d, const sj_tensor *t, sj_dtype dt) {
    sj_tensor h = *t;
    h.dtype = dt;
    h.device = SJ_HOST;
    sj_tensor_set_contiguous(&h);
    h.data = d->host.alloc(d->host.user, sj_tensor_nbytes(&h), 64);
    return h;
}

static sj_status tensor_copy(sj_backend *b, const sj_tensor *dst, const sj_tensor *src) {
    cuda_device *dv = D(b);
    sj_cuda *cu = dv->cuda;
    sj_status st;
    size_t bytes = sj_tensor_nbytes(src);
    bool convert = src->dtype != dst->dtype;
    sj_cuda_bind(cu);
    CUdeviceptr d = (CUdeviceptr)(uintptr_t)dst->data, s = (CUdeviceptr)(uintptr_t)src->data;
    if (convert && src->device != SJ_HOST && dst->device != SJ_HOST) { /* the cast kernel */
        sj_cuda_exec e = {.cuda = cu, .stream = cu->stream};
        st = sj_cuda_copy(&e, src, dst);
        return st ? st : SJ_CU(cu, cu->api.StreamSynchronize(cu->stream), "sj_tensor_copy: waiting for the stream");
    }
    if (convert) { /* host <-> device: converted on the host, moved in the destination's dtype */
        bool up = src->device == SJ_HOST;
        sj_tensor h = host_like(dv, up ? dst : src, up ? dst->dtype : src->dtype);
        if (!h.data) return sj_seterr(SJ_ENOMEM, "sj_tensor_copy: out of memory for a conversion buffer");
        size_t hb = sj_tensor_nbytes(&h);
        if (up) {
            st = sj_cpu_copy(src, &h);
            if (!st) st = sj_cuda_to_device(cu, d, h.data, hb);
        } else {
            st = sj_cuda_to_host(cu, h.data, s, hb);
            if (!st) st = sj_cpu_copy(&h, dst);
        }
        dv->host.free(dv->host.user, h.data);
        return st;
    }
    if (src->device == SJ_HOST) return sj_cuda_to_device(cu, d, src->data, bytes);
    if (dst->device == SJ_HOST) return sj_cuda_to_host(cu, dst->data, s, bytes); /* ordered on the stream */
    st = SJ_CU(cu, cu->api.MemcpyDtoDAsync(d, s, bytes, cu->stream), "sj_tensor_copy");
    return st ? st : SJ_CU(cu, cu->api.StreamSynchronize(cu->stream), "sj_tensor_copy: waiting for the stream");
}

static sj_status zero(sj_backend *b, void *p, size_t bytes) {
    sj_cuda *cu = D(b)->cuda;
    sj_cuda_bind(cu);
    return bytes ? SJ_CU(cu, cu->api.MemsetD8Async((CUdeviceptr)(uintptr_t)p, 0, bytes, cu->stream),
                         "zeroing device memory")
                 : SJ_OK;
}

static void *stream(sj_backend *b) { return (void *)D(b)->cuda->stream; }

static sj_status upload(sj_backend *b, sj_graph *g) { return sj_cuda_upload_graph(D(b)->cuda, g); }

/* -- A call --------------------------------------------------------------------------- */

static void *call_begin(sj_backend *b, sj_dev_call *buf, void *stream, bool sync, bool wait, int n_syms) {
    cuda_device *d = D(b);
    sj_cuda_call *cc = (sj_cuda_call *)buf;
    int lane = -1;
    bool took = !stream && sync;
    CUstream s = stream ? (CUstream)stream : took ? sj_lane_take(d->lanes, &lane) : d->cuda->stream;
    sj_cuda_call_init(cc, d->cuda, s, sync || wait, n_syms);
    cc->took_lane = took;
    cc->sync_call = sync;
    cc->lane = lane;
    return cc;
}

static sj_status call_end(sj_backend *b, void *c, bool drain) {
    sj_cuda_call *cc = c;
    sj_status st = SJ_OK;
    /* A one-off entry's device constants are freed with it: the caller's
     * stream must be done with them first (a synchronous call has waited
     * already). */
    if (drain && !cc->sync_call) {
        sj_cuda *cu = cc->e.cuda;
        sj_cuda_bind(cu);
        st = SJ_CU(cu, cu->api.StreamSynchronize(cc->e.stream), "waiting for a one-off entry's kernels");
    }
    if (cc->took_lane) sj_lane_put(D(b)->lanes, cc->lane); /* the call waited for its stream */
    return st;
}

/* -- Background -------------------------------------------------------------------- */

static void settle(sj_backend *b) { sj_cuda_matmul_warm_wait(D(b)->cuda); }

static void set_post(sj_backend *b, sj_post_fn post, void *ctx) { sj_cuda_matmul_warm_post(D(b)->cuda, post, ctx); }

/* -- Tests ---------------------------------------------------------------------------- */

uint64_t sj_cuda_lanes_taken(const sj_backend *b) { return sj_cuda_of(b) ? sj_lanes_taken(D(b)->lanes) : 0; }

void sj_cuda_lanes_test_busy(sj_backend *b, int delta) {
    if (sj_cuda_of(b)) sj_lanes_test_busy(D(b)->lanes, delta);
}

/* -- Making it -------------------------------------------------------------------------- */

bool sj_device_cuda_built(void) { return true; }

sj_status sj_cuda_device_create(const sj_dev_config *c, sj_backend **out) {
    *out = NULL;
    sj_cuda *cu = NULL;
    sj_status st = sj_cuda_open(c->cuda_device, &cu);
    if (!st) cu->lt_tf32 = c->cuda_tf32;
    if (!st) sj_cuda_set_pdl(cu, c->cuda_pdl);
    if (!st && (st = sj_cuda_eager_load(cu))) {
        sj_cuda_close(cu);
        cu = NULL;
    }
    if (st) return st;
    cuda_device *d = sj_calloc(1, sizeof *d);
    if (!d) {
        sj_cuda_close(cu);
        return sj_seterr(SJ_ENOMEM, "out of memory for the CUDA device");
    }
    d->cuda = cu;
    d->host = *c->host;
    d->gemm_memo = sj_gemm_memo_create(); /* (none: shared units are timed each) */
    sj_backend *b = &d->common.base;
    b->name = "cuda";
    b->late_launch = true; /* streams and graphs launch code after its call returned */
    b->units = cu->sm_count; /* the generated kernels' grids are sized by them (the engine's sj_cuda_launch) */
    b->arch = cu->cc_major * 10 + cu->cc_minor;
    sj_device_forward_compile(b);
    b->destroy = destroy;
    b->recompiler = recompiler;
    b->wait_abandoned = wait_abandoned;
    b->alloc = alloc;
    b->free = dev_free;
    b->tensor_copy = tensor_copy;
    b->zero = zero;
    b->stream = stream;
    b->upload = upload;
    b->call_begin = call_begin;
    b->call_end = call_end;
    sj_cuda_fill_call_slots(b);
    sj_cuda_fill_graph_slots(b);
    b->gemm_tune = gemm_tune;
    b->settle = settle;
    b->set_post = set_post;
    sj_log_write(c->log, SJ_LOG_PERF, "backend: CUDA device %d, %s (sm_%d%d, %d SMs)", c->cuda_device, cu->name,
                 cu->cc_major, cu->cc_minor, cu->sm_count);
    if (!(st = sj_lanes_create(cu, &d->lanes))) st = make_compiler(d, c);
    if (st) {
        destroy(b);
        return st;
    }
    *out = b;
    return SJ_OK;
}
