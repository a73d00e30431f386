/* The CUDA device's NVRTC options: the option list a unit is compiled
 * with and the architecture it is compiled for. The CUDA backend owns them
 * (kernels/cuda/backend_cuda.c); the code generator (specialize/) knows
 * nothing of them. Plain C without the toolkit's headers: the Makefile
 * builds this file in the build without CUDA too, where
 * sj_device_cuda_check_flags (kernels/device.h) still checks
 * cfg.nvrtc_flags at sj_runtime_create, whichever device the runtime
 * gets. */
#ifndef SJ_CUDA_NVRTC_H
#define SJ_CUDA_NVRTC_H

#include <stdbool.h>
#include <stddef.h>

#include "jit/shapejit.h"

/* The NVRTC options a unit is compiled with: the architecture (arch:
 * "sm_90", or a virtual "compute_90" for PTX), --std=c++17 and
 * -default-device (the unit's C++ and its undecorated device helpers),
 * --extra-device-vectorization and, where NVRTC has it (nvrtc_version,
 * major * 100 + minor, at least SJ_NVRTC_MINIMAL_SINCE; 0: unknown, left
 * out), -minimal (no texture, device-runtime or runtime-API declarations,
 * which no unit uses: NVRTC 13.0 compiles w4's units into the same CUBIN,
 * byte for byte, about 3 ms sooner per program), then the words of flags
 * (NULL or "": none; separated by spaces or tabs): the runtime's
 * nvrtc_flags. No
 * -lineinfo: it leaves the machine code as it is but makes the CUBIN 2.7
 * times larger (w4's unit: 206 KB against 77 KB); a profiling run adds it
 * through nvrtc_flags. No fast math: erf, exp and division keep their IEEE
 * behaviour, as the eager kernels do. SJ_EINVAL naming the limit when
 * flags has more than SJ_NVRTC_MAX_FLAGS words or SJ_NVRTC_FLAGS_LEN
 * characters. */
enum { SJ_NVRTC_MAX_FLAGS = 16, SJ_NVRTC_FLAGS_LEN = 511, SJ_NVRTC_MINIMAL_SINCE = 1204 };
/* A quick compile (sj_compile_req.quick): NVRTC's fast compile at its
 * middle level (NVRTC 12.8 on), after the other options. On an H100 host
 * it took w4's slowest program from 170-237 to 120-126 ms of CPU and made
 * w4's fused layer 30-35% slower: a unit's first code, which the full
 * compile replaces. */
#define SJ_NVRTC_QUICK_FLAG "-Ofc=mid"
enum { SJ_NVRTC_QUICK_SINCE = 1208 };
typedef struct sj_nvrtc_opts {
    const char *argv[8 + SJ_NVRTC_MAX_FLAGS];
    int argc;
    char text[640]; /* the strings argv points into */
} sj_nvrtc_opts;
sj_status sj_nvrtc_options(const char *arch, int nvrtc_version, const char *flags, sj_nvrtc_opts *o);

/* The architecture to compile for on a device of compute capability
 * cc_major.cc_minor, given the real architectures NVRTC can generate code
 * for (nvrtcGetSupportedArchs: 90 for sm_90; n of them). true and "sm_XY"
 * (a CUBIN, nothing left for the driver to compile at load; "sm_90a" on
 * Hopper, for its warpgroup products) when NVRTC knows the device's; else
 * false and "compute_XY", the newest virtual
 * architecture below it, as PTX that the driver compiles at load (and
 * keeps in its compute cache): a device newer than this NVRTC. With no
 * list (n == 0) the device's own, true. */
bool sj_nvrtc_target(int cc_major, int cc_minor, const int *supported, int n, char *arch, size_t size);

#endif
