/* The CUDA device in a build without the CUDA toolkit (the Makefile
 * builds this file instead of kernels/cuda/): there is none. */
#include "base/error.h"
#include "kernels/device.h"

bool sj_device_cuda_built(void) { return false; }

sj_status sj_cuda_device_create(const sj_dev_config *c, sj_backend **out) {
    (void)c;
    *out = NULL;
    return sj_seterr(SJ_EBACKEND, "the CUDA backend is not built into this library (built without the CUDA "
                                  "toolkit); use SJ_BACKEND_CPU or SJ_BACKEND_AUTO");
}
