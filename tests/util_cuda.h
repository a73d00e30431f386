/* The start of the GPU tests that compile with NVRTC themselves
 * (test_codegen_cuda, test_gemm_cuda; tests/util_cuda.c): NVRTC loaded
 * with dlopen (tests/util_nvrtc.h), then CUDA device 0 opened with the
 * runtime's device services (kernels/cuda/cuda_dev.h: sj_cuda_open) in a
 * build with SJ_WITH_CUDA. Without a device the compile checks still run
 * and the device checks print "skipped: no CUDA device (<no_gpu_why>)".
 */
#ifndef SJ_TEST_UTIL_CUDA_H
#define SJ_TEST_UTIL_CUDA_H

#include <stdbool.h>

#include "tests/util_nvrtc.h"

struct sj_cuda; /* kernels/cuda/cuda_dev.h, with SJ_WITH_CUDA */

typedef struct tu_cuda {
    tu_nvrtc nv;          /* loaded when have_nvrtc */
    bool have_nvrtc;      /* tu_nvrtc_load succeeded */
    bool have_gpu;        /* dev is open */
    char arch[16];        /* the device's "sm_XY"; "sm_90" without one */
    char no_gpu_why[512]; /* without a device, why (the skip line's text) */
    struct sj_cuda *dev;  /* device 0; NULL without one */
} tu_cuda;

/* Loads NVRTC into c->nv, then (with NVRTC, in a CUDA build) opens device
 * 0. Without a device, no_gpu_why says why: "built without CUDA (no
 * SJ_WITH_CUDA)", "no NVRTC", or sj_cuda_open's error. Never fails. */
void tu_cuda_open(tu_cuda *c);

/* Closes c's device, if open (NVRTC stays loaded for the process). */
void tu_cuda_close(tu_cuda *c);

#endif /* SJ_TEST_UTIL_CUDA_H */
