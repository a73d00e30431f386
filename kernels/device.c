/* The device table's shared pieces (kernels/device.h): which device to
 * make, and the compiling slots a device forwards to its compiler. */
#include "kernels/device.h"

#include "base/error.h"

/* -- Making a device ------------------------------------------------------------ */

sj_status sj_device_create(sj_backend_kind kind, const sj_dev_config *c, sj_backend **out) {
    *out = NULL;
    switch (kind) {
    case SJ_BACKEND_CPU: return sj_cpu_device_create(c, out);
    case SJ_BACKEND_CUDA: return sj_cuda_device_create(c, out);
    default: return sj_seterr(SJ_EINVAL, "backend %d is not a device", (int)kind);
    }
}

/* -- Compiling: forwarded to the device's compiler ----------------------------------- */

static sj_backend *cc_of(sj_backend *b) { return ((sj_dev_common *)b)->cc; }

static sj_status fwd_compile(sj_backend *b, const sj_compile_req *req, sj_compile_result *out) {
    sj_backend *cc = cc_of(b);
    return cc->compile(cc, req, out);
}

static void fwd_unload(sj_backend *b, sj_module *m) {
    sj_backend *cc = cc_of(b);
    cc->unload(cc, m);
}

static const char *fwd_identity(sj_backend *b) {
    sj_backend *cc = cc_of(b);
    return cc->identity(cc);
}

void sj_device_forward_compile(sj_backend *b) {
    b->compile = fwd_compile;
    b->unload = fwd_unload;
    b->identity = fwd_identity;
}
