/* The CUDA backend: generated CUDA C compiled by NVRTC for the device's own
 * architecture (sm_90 on Hopper) into a CUBIN, cached on disk, loaded with
 * cuModuleLoadData; the resolved symbols are CUfunction handles. On a
 * device newer than the NVRTC found (nvrtcGetSupportedArchs lacks it) the
 * kernels are PTX for the newest architecture below it, which the driver
 * compiles at load (a warning is logged once, at creation).
 *
 * The cache key covers the source, "cuda", the target architecture
 * ("sm_90", or "compute_90" for PTX), the NVRTC version and the NVRTC
 * options; artifacts are stored with the extension "cubin" (a CUBIN, or a
 * set of images: several CUBINs when the unit was compiled as several
 * programs, or PTX). NVRTC options (sj_nvrtc_options, kernels/cuda/nvrtc.h):
 * --gpu-architecture=<arch>, --std=c++17, -default-device,
 * --extra-device-vectorization (no fast math: erf, exp and division keep
 * their IEEE behaviour, as the eager kernels do; no -lineinfo), then the
 * runtime's nvrtc_flags.
 */
#ifndef SJ_BACKEND_CUDA_H
#define SJ_BACKEND_CUDA_H

#include "kernels/cache.h"
#include "base/log.h"
#include "kernels/device.h"
#include "kernels/cuda/cuda_dev.h"
#include "kernels/cuda/nvrtc.h"

typedef struct sj_cuda_backend_config {
    sj_cuda *cuda;          /* borrowed; outlives the backend */
    sj_cache *cache;        /* NULL: no persistent cache */
    sj_remote *remote;      /* the second level under cache (kernels/remote.h; borrowed); NULL: none */
    const char *dump_dir;   /* NULL: none; else every source as <tag>.cu */
    const char *nvrtc_flags; /* extra NVRTC options (sj_nvrtc_options); NULL: none */
    const sj_log_sink *log;   /* where log lines go (SJ_LOG_COMPILE, SJ_LOG_WARN); NULL: none */
    int test_delay_ms, test_fail; /* test hooks, as the CPU backend's */
    /* An NVRTC compile still running after this many ms (0: no bound), or
     * when its request's cancel flag is set, is abandoned: the compile
     * fails and NVRTC finishes on its own thread in the background (it
     * cannot be interrupted; see base/bounded.h). */
    int timeout_ms;
    /* NVRTC programs a unit of several kernels is split into and compiled
     * at once, one thread each (sj_codegen_cuda_split); 0: half the online
     * CPUs, 1 to 8; 1: one program. The split changes no kernel's code,
     * so it is not in the cache key: a cached unit loads whatever split
     * made it. */
    int nvrtc_threads;
} sj_cuda_backend_config;

sj_status sj_cuda_backend_create(const sj_cuda_backend_config *cfg, sj_backend **out);

#endif
