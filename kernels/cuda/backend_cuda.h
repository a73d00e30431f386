/* The CUDA backend: generated CUDA C compiled by NVRTC for the device's own
 * architecture (sm_90 on Hopper) into a CUBIN, cached on disk, loaded with
 * cuModuleLoadData; the resolved symbols are CUfunction handles.
 *
 * The cache key covers the source, "cuda", the device architecture, the
 * NVRTC version and the NVRTC options; artifacts are stored with the
 * extension "cubin". NVRTC options (sj_cuda_nvrtc_options):
 * --gpu-architecture=sm_<major><minor>, --std=c++17, -default-device,
 * --extra-device-vectorization, -lineinfo (no fast math: erf, exp and
 * division keep their IEEE behaviour, as the eager kernels do), then the
 * runtime's nvrtc_flags.
 */
#ifndef SJ_BACKEND_CUDA_H
#define SJ_BACKEND_CUDA_H

#include "jit/cache.h"
#include "jit/runtime.h"
#include "kernels/backend.h"
#include "kernels/cuda/cuda_dev.h"

/* NVRTC's argument list: the backend's options, then the words of flags. */
enum { SJ_NVRTC_MAX_FLAGS = 16, SJ_NVRTC_FLAGS_LEN = 511 };
typedef struct sj_nvrtc_opts {
    const char *argv[8 + SJ_NVRTC_MAX_FLAGS];
    int argc;
    char text[640]; /* the strings argv points into */
} sj_nvrtc_opts;

/* Fill o for arch ("sm_90") and flags (NULL or "": none; words separated
 * by spaces or tabs). SJ_EINVAL naming the limit when flags
 * has more than SJ_NVRTC_MAX_FLAGS words or SJ_NVRTC_FLAGS_LEN characters. */
sj_status sj_cuda_nvrtc_options(const char *arch, const char *flags, sj_nvrtc_opts *o);

typedef struct sj_cuda_backend_config {
    sj_cuda *cuda;          /* borrowed; outlives the backend */
    sj_cache *cache;        /* NULL: no persistent cache */
    const char *dump_dir;   /* NULL: none; else every source as <tag>.cu */
    const char *nvrtc_flags; /* extra NVRTC options (sj_cuda_nvrtc_options); NULL: none */
    const sj_runtime *rt;   /* logging (SJ_LOG_COMPILE) */
    int test_delay_ms, test_fail; /* test hooks, as the CPU backend's */
} sj_cuda_backend_config;

sj_status sj_cuda_backend_create(const sj_cuda_backend_config *cfg, sj_backend **out);

#endif
