/* NVRTC and CUDA device 0 for the GPU tests that compile with NVRTC
 * themselves; see tests/util_cuda.h. */
#include "tests/util_cuda.h"

#include <stdio.h>
#include <string.h>

#include "base/error.h"
#ifdef SJ_WITH_CUDA
#include "kernels/cuda/cuda_dev.h"
#endif

void tu_cuda_open(tu_cuda *c) {
    memset(c, 0, sizeof *c);
    snprintf(c->arch, sizeof c->arch, "sm_90");
    snprintf(c->no_gpu_why, sizeof c->no_gpu_why, "built without CUDA (no SJ_WITH_CUDA)");
    c->have_nvrtc = tu_nvrtc_load(&c->nv);
#ifdef SJ_WITH_CUDA
    if (c->have_nvrtc && sj_cuda_open(0, &c->dev) == SJ_OK) {
        c->have_gpu = true;
        snprintf(c->arch, sizeof c->arch, "sm_%d%d", c->dev->cc_major, c->dev->cc_minor);
    } else {
        c->dev = NULL;
        snprintf(c->no_gpu_why, sizeof c->no_gpu_why, "%s", c->have_nvrtc ? sj_last_error() : "no NVRTC");
    }
#endif
}

void tu_cuda_close(tu_cuda *c) {
#ifdef SJ_WITH_CUDA
    sj_cuda_close(c->dev);
#endif
    c->dev = NULL;
    c->have_gpu = false;
}
