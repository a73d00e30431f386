/* The CUDA backend: generated CUDA C compiled by NVRTC for the device's own
 * architecture (sm_90 on Hopper) into a CUBIN, cached on disk, loaded with
 * cuModuleLoadData; the resolved symbols are CUfunction handles.
 *
 * The cache key covers the source, "cuda", the device architecture, the
 * NVRTC version and the NVRTC options; artifacts are stored with the
 * extension "cubin". NVRTC options (sj_codegen_cuda_options):
 * --gpu-architecture=sm_<major><minor>, --std=c++17, -default-device,
 * --extra-device-vectorization, -lineinfo (no fast math: erf, exp and
 * division keep their IEEE behaviour, as the eager kernels do), then the
 * runtime's nvrtc_flags.
 */
#ifndef SJ_BACKEND_CUDA_H
#define SJ_BACKEND_CUDA_H

#include "kernels/cache.h"
#include "base/log.h"
#include "kernels/backend.h"
#include "kernels/cuda/cuda_dev.h"
#include "specialize/codegen_cuda.h"

typedef struct sj_cuda_backend_config {
    sj_cuda *cuda;          /* borrowed; outlives the backend */
    sj_cache *cache;        /* NULL: no persistent cache */
    sj_remote *remote;      /* the second level under cache (kernels/remote.h; borrowed); NULL: none */
    const char *dump_dir;   /* NULL: none; else every source as <tag>.cu */
    const char *nvrtc_flags; /* extra NVRTC options (sj_codegen_cuda_options); NULL: none */
    const sj_log_sink *log;   /* where log lines go (SJ_LOG_COMPILE, SJ_LOG_WARN); NULL: none */
    int test_delay_ms, test_fail; /* test hooks, as the CPU backend's */
    /* An NVRTC compile still running after this many ms (0: no bound), or
     * when its request's cancel flag is set, is abandoned: the compile
     * fails and NVRTC finishes on its own thread in the background (it
     * cannot be interrupted; see base/bounded.h). */
    int timeout_ms;
} sj_cuda_backend_config;

sj_status sj_cuda_backend_create(const sj_cuda_backend_config *cfg, sj_backend **out);

#endif
