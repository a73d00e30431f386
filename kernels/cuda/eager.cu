/* The eager CUDA kernels: every kernel of kernels/cuda/eager_abi.cuh's
 * SJ_EK_LIST, as extern "C" __global__ functions named sj_ek_<family>_<tag>
 * (resolved by name with cuModuleGetFunction in eager_cuda.c).
 *
 * Built ahead of time by the Makefile (nvcc -fatbin: sm_90 and sm_80
 * machine code, compute_90 PTX) and embedded in the library. No CUDA
 * runtime API: everything is launched from C through the driver API.
 * The math is base/sj_kernel_rt.h's (compiled here for the device), so
 * the kernels compute the same functions as the CPU eager kernels
 * (kernels/cpu/); reductions accumulate in f32 with a tree instead of the
 * CPU's double.
 *
 * Layout: eager_common.cuh (dtypes, op math, indexing, reductions),
 * eager_elementwise.cuh, eager_rows.cuh, eager_misc.cuh,
 * eager_attention_tc.cuh, eager_varlen.cuh; each defines the
 * SJ_EK_DEF_<family>(tag) macro that the list below expands
 * (eager_att_online.cuh: the one-query attention loop that eager_misc's
 * and eager_varlen's attention kernels share; eager_attention_tc.cuh's
 * attention_mma serves the padded, masked and packed register kernels).
 */
#include "kernels/cuda/eager_common.cuh"
#include "kernels/cuda/eager_attention_tc.cuh"
#include "kernels/cuda/eager_elementwise.cuh"
#include "kernels/cuda/eager_misc.cuh"
#include "kernels/cuda/eager_rows.cuh"
#include "kernels/cuda/eager_varlen.cuh"

#define SJ_EK_DEFINE(fam, tag) SJ_EK_DEF_##fam(tag)
SJ_EK_LIST(SJ_EK_DEFINE)
