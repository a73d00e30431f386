/* The CUDA driver API, NVRTC and cuBLASLt, loaded at run time with dlopen,
 * so that one library and one test binary start on machines without a GPU
 * or a driver. The toolkit's headers give the types only; nothing links
 * against libcuda, libnvrtc or libcublasLt.
 *
 * Every function is reached through an sj_cuda_api table field named like
 * the API function without its prefix: api->MemAlloc is cuMemAlloc_v2,
 * api->nvrtcCompileProgram is nvrtcCompileProgram, api->LtMatmul is
 * cublasLtMatmul. cuBLASLt's descriptors are made in the caller's memory
 * (api->LtMatmulDescInit and LtMatrixLayoutInit are the *_internal
 * functions behind the header's inline cublasLt*Init, which pass the size
 * of the opaque struct): no allocation and nothing to destroy.
 */
#ifndef SJ_CUDA_API_H
#define SJ_CUDA_API_H

#include <cublasLt.h>
#include <cuda.h>
#include <nvrtc.h>
#include <stddef.h>

#include "jit/shapejit.h"

/* X(return type, field, symbol, parameters) */
#define SJ_CUDA_DRIVER_FNS(X)                                                                      \
    X(CUresult, Init, "cuInit", (unsigned int))                                                    \
    X(CUresult, DriverGetVersion, "cuDriverGetVersion", (int *))                                   \
    X(CUresult, DeviceGetCount, "cuDeviceGetCount", (int *))                                       \
    X(CUresult, DeviceGet, "cuDeviceGet", (CUdevice *, int))                                       \
    X(CUresult, DeviceGetName, "cuDeviceGetName", (char *, int, CUdevice))                         \
    X(CUresult, DeviceGetAttribute, "cuDeviceGetAttribute", (int *, CUdevice_attribute, CUdevice)) \
    X(CUresult, DeviceTotalMem, "cuDeviceTotalMem_v2", (size_t *, CUdevice))                       \
    X(CUresult, DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", (CUcontext *, CUdevice))       \
    X(CUresult, DevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2", (CUdevice))               \
    X(CUresult, CtxSetCurrent, "cuCtxSetCurrent", (CUcontext))                                     \
    X(CUresult, CtxGetCurrent, "cuCtxGetCurrent", (CUcontext *))                                   \
    X(CUresult, CtxSynchronize, "cuCtxSynchronize", (void))                                        \
    X(CUresult, MemAlloc, "cuMemAlloc_v2", (CUdeviceptr *, size_t))                                \
    X(CUresult, MemFree, "cuMemFree_v2", (CUdeviceptr))                                            \
    X(CUresult, MemGetInfo, "cuMemGetInfo_v2", (size_t *, size_t *))                               \
    X(CUresult, MemPoolCreate, "cuMemPoolCreate", (CUmemoryPool *, const CUmemPoolProps *))         \
    X(CUresult, MemPoolDestroy, "cuMemPoolDestroy", (CUmemoryPool))                                \
    X(CUresult, MemPoolTrimTo, "cuMemPoolTrimTo", (CUmemoryPool, size_t))                          \
    X(CUresult, MemPoolSetAttribute, "cuMemPoolSetAttribute", (CUmemoryPool, CUmemPool_attribute, void *)) \
    X(CUresult, MemAllocFromPoolAsync, "cuMemAllocFromPoolAsync", (CUdeviceptr *, size_t, CUmemoryPool, CUstream)) \
    X(CUresult, MemcpyHtoD, "cuMemcpyHtoD_v2", (CUdeviceptr, const void *, size_t))                \
    X(CUresult, MemcpyDtoH, "cuMemcpyDtoH_v2", (void *, CUdeviceptr, size_t))                      \
    X(CUresult, MemcpyDtoD, "cuMemcpyDtoD_v2", (CUdeviceptr, CUdeviceptr, size_t))                 \
    X(CUresult, MemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2", (CUdeviceptr, const void *, size_t, CUstream)) \
    X(CUresult, MemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2", (void *, CUdeviceptr, size_t, CUstream))   \
    X(CUresult, MemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2", (CUdeviceptr, CUdeviceptr, size_t, CUstream)) \
    X(CUresult, MemsetD8Async, "cuMemsetD8Async", (CUdeviceptr, unsigned char, size_t, CUstream))  \
    X(CUresult, MemAllocHost, "cuMemAllocHost_v2", (void **, size_t))                              \
    X(CUresult, MemFreeHost, "cuMemFreeHost", (void *))                                            \
    X(CUresult, StreamCreate, "cuStreamCreate", (CUstream *, unsigned int))                        \
    X(CUresult, StreamDestroy, "cuStreamDestroy_v2", (CUstream))                                   \
    X(CUresult, StreamSynchronize, "cuStreamSynchronize", (CUstream))                              \
    X(CUresult, StreamQuery, "cuStreamQuery", (CUstream))                                          \
    X(CUresult, CtxGetFlags, "cuCtxGetFlags", (unsigned int *))                                    \
    X(CUresult, StreamWaitEvent, "cuStreamWaitEvent", (CUstream, CUevent, unsigned int))           \
    X(CUresult, EventCreate, "cuEventCreate", (CUevent *, unsigned int))                           \
    X(CUresult, EventDestroy, "cuEventDestroy_v2", (CUevent))                                      \
    X(CUresult, EventRecord, "cuEventRecord", (CUevent, CUstream))                                 \
    X(CUresult, EventQuery, "cuEventQuery", (CUevent))                                             \
    X(CUresult, EventSynchronize, "cuEventSynchronize", (CUevent))                                 \
    X(CUresult, EventElapsedTime, "cuEventElapsedTime_v2", (float *, CUevent, CUevent))            \
    X(CUresult, ModuleLoadData, "cuModuleLoadData", (CUmodule *, const void *))                    \
    X(CUresult, ModuleUnload, "cuModuleUnload", (CUmodule))                                        \
    X(CUresult, ModuleGetFunction, "cuModuleGetFunction", (CUfunction *, CUmodule, const char *))  \
    X(CUresult, FuncSetAttribute, "cuFuncSetAttribute", (CUfunction, CUfunction_attribute, int))   \
    X(CUresult, LaunchKernel, "cuLaunchKernel",                                                    \
      (CUfunction, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int, \
       unsigned int, CUstream, void **, void **))                                                  \
    X(CUresult, StreamBeginCapture, "cuStreamBeginCapture_v2", (CUstream, CUstreamCaptureMode))    \
    X(CUresult, StreamEndCapture, "cuStreamEndCapture", (CUstream, CUgraph *))                     \
    X(CUresult, GraphInstantiate, "cuGraphInstantiateWithFlags", (CUgraphExec *, CUgraph, unsigned long long)) \
    X(CUresult, GraphLaunch, "cuGraphLaunch", (CUgraphExec, CUstream))                             \
    X(CUresult, GraphUpload, "cuGraphUpload", (CUgraphExec, CUstream))                             \
    X(CUresult, GraphExecDestroy, "cuGraphExecDestroy", (CUgraphExec))                             \
    X(CUresult, GraphDestroy, "cuGraphDestroy", (CUgraph))                                         \
    X(CUresult, GetErrorString, "cuGetErrorString", (CUresult, const char **))                     \
    X(CUresult, GetErrorName, "cuGetErrorName", (CUresult, const char **))

/* Driver functions the library can do without (NULL when the driver
 * lacks them): CUDA graphs that serve a whole bucket (graph_cuda.c) need
 * the first two; programmatic dependent launch (sj_cuda_launch_kernel)
 * cuLaunchKernelEx; generated warpgroup products (exec_cuda.c's
 * sj_cuda_gemm_launch) the tensor maps of the last; the benchmarks'
 * per-kernel times (sj_cuda.time_launches) cuFuncGetName and
 * cuLaunchHostFunc. */
#define SJ_CUDA_DRIVER_OPT_FNS(X)                                                                  \
    X(CUresult, StreamGetCaptureInfo, "cuStreamGetCaptureInfo_v3",                                 \
      (CUstream, CUstreamCaptureStatus *, cuuint64_t *, CUgraph *, const CUgraphNode **,           \
       const CUgraphEdgeData **, size_t *))                                                        \
    X(CUresult, GraphExecKernelNodeSetParams, "cuGraphExecKernelNodeSetParams_v2",                 \
      (CUgraphExec, CUgraphNode, const CUDA_KERNEL_NODE_PARAMS *))                                 \
    X(CUresult, LaunchKernelEx, "cuLaunchKernelEx", (const CUlaunchConfig *, CUfunction, void **, void **)) \
    X(CUresult, TensorMapEncodeTiled, "cuTensorMapEncodeTiled",                                    \
      (CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, const cuuint64_t *, const cuuint64_t *, \
       const cuuint32_t *, const cuuint32_t *, CUtensorMapInterleave, CUtensorMapSwizzle,           \
       CUtensorMapL2promotion, CUtensorMapFloatOOBfill))                                          \
    X(CUresult, FuncGetName, "cuFuncGetName", (const char **, CUfunction))                         \
    X(CUresult, LaunchHostFunc, "cuLaunchHostFunc", (CUstream, CUhostFn, void *))

#define SJ_NVRTC_FNS(X)                                                                            \
    X(nvrtcResult, nvrtcVersion, "nvrtcVersion", (int *, int *))                                   \
    X(nvrtcResult, nvrtcCreateProgram, "nvrtcCreateProgram",                                       \
      (nvrtcProgram *, const char *, const char *, int, const char *const *, const char *const *)) \
    X(nvrtcResult, nvrtcCompileProgram, "nvrtcCompileProgram", (nvrtcProgram, int, const char *const *)) \
    X(nvrtcResult, nvrtcGetCUBINSize, "nvrtcGetCUBINSize", (nvrtcProgram, size_t *))               \
    X(nvrtcResult, nvrtcGetCUBIN, "nvrtcGetCUBIN", (nvrtcProgram, char *))                         \
    X(nvrtcResult, nvrtcGetPTXSize, "nvrtcGetPTXSize", (nvrtcProgram, size_t *))                   \
    X(nvrtcResult, nvrtcGetPTX, "nvrtcGetPTX", (nvrtcProgram, char *))                             \
    X(nvrtcResult, nvrtcGetNumSupportedArchs, "nvrtcGetNumSupportedArchs", (int *))                \
    X(nvrtcResult, nvrtcGetSupportedArchs, "nvrtcGetSupportedArchs", (int *))                      \
    X(nvrtcResult, nvrtcGetProgramLogSize, "nvrtcGetProgramLogSize", (nvrtcProgram, size_t *))     \
    X(nvrtcResult, nvrtcGetProgramLog, "nvrtcGetProgramLog", (nvrtcProgram, char *))               \
    X(nvrtcResult, nvrtcDestroyProgram, "nvrtcDestroyProgram", (nvrtcProgram *))                   \
    X(const char *, nvrtcGetErrorString, "nvrtcGetErrorString", (nvrtcResult))

#define SJ_CUBLASLT_FNS(X)                                                                         \
    X(cublasStatus_t, LtCreate, "cublasLtCreate", (cublasLtHandle_t *))                            \
    X(cublasStatus_t, LtDestroy, "cublasLtDestroy", (cublasLtHandle_t))                            \
    X(cublasStatus_t, LtMatmul, "cublasLtMatmul",                                                  \
      (cublasLtHandle_t, cublasLtMatmulDesc_t, const void *, const void *, cublasLtMatrixLayout_t, \
       const void *, cublasLtMatrixLayout_t, const void *, const void *, cublasLtMatrixLayout_t,   \
       void *, cublasLtMatrixLayout_t, const cublasLtMatmulAlgo_t *, void *, size_t, cudaStream_t)) \
    X(cublasStatus_t, LtMatmulDescInit, "cublasLtMatmulDescInit_internal",                         \
      (cublasLtMatmulDesc_t, size_t, cublasComputeType_t, cudaDataType_t))                         \
    X(cublasStatus_t, LtMatmulDescSetAttribute, "cublasLtMatmulDescSetAttribute",                  \
      (cublasLtMatmulDesc_t, cublasLtMatmulDescAttributes_t, const void *, size_t))                \
    X(cublasStatus_t, LtMatrixLayoutInit, "cublasLtMatrixLayoutInit_internal",                     \
      (cublasLtMatrixLayout_t, size_t, cudaDataType, uint64_t, uint64_t, int64_t))                 \
    X(cublasStatus_t, LtMatrixLayoutSetAttribute, "cublasLtMatrixLayoutSetAttribute",              \
      (cublasLtMatrixLayout_t, cublasLtMatrixLayoutAttribute_t, const void *, size_t))             \
    X(cublasStatus_t, LtMatmulPreferenceCreate, "cublasLtMatmulPreferenceCreate", (cublasLtMatmulPreference_t *)) \
    X(cublasStatus_t, LtMatmulPreferenceDestroy, "cublasLtMatmulPreferenceDestroy", (cublasLtMatmulPreference_t)) \
    X(cublasStatus_t, LtMatmulPreferenceSetAttribute, "cublasLtMatmulPreferenceSetAttribute",      \
      (cublasLtMatmulPreference_t, cublasLtMatmulPreferenceAttributes_t, const void *, size_t))    \
    X(cublasStatus_t, LtMatmulAlgoGetHeuristic, "cublasLtMatmulAlgoGetHeuristic",                  \
      (cublasLtHandle_t, cublasLtMatmulDesc_t, cublasLtMatrixLayout_t, cublasLtMatrixLayout_t,     \
       cublasLtMatrixLayout_t, cublasLtMatrixLayout_t, cublasLtMatmulPreference_t, int,            \
       cublasLtMatmulHeuristicResult_t *, int *))                                                 \
    X(cublasStatus_t, LtMatmulAlgoCheck, "cublasLtMatmulAlgoCheck",                                \
      (cublasLtHandle_t, cublasLtMatmulDesc_t, cublasLtMatrixLayout_t, cublasLtMatrixLayout_t,     \
       cublasLtMatrixLayout_t, cublasLtMatrixLayout_t, const cublasLtMatmulAlgo_t *,               \
       cublasLtMatmulHeuristicResult_t *))

typedef struct sj_cuda_api {
    void *h_cuda, *h_nvrtc, *h_lt; /* dlopen handles */
#define SJ_X(ret, field, sym, args) ret(*field) args;
    SJ_CUDA_DRIVER_FNS(SJ_X)
    SJ_CUDA_DRIVER_OPT_FNS(SJ_X)
    SJ_NVRTC_FNS(SJ_X)
    SJ_CUBLASLT_FNS(SJ_X)
#undef SJ_X
} sj_cuda_api;

/* dlopen libcuda.so.1, then NVRTC and cuBLASLt (libnvrtc.so.13/.12/..., in
 * $SHAPEJIT_CUDA_LIBS, $CUDA_HOME/lib64, /usr/local/cuda/lib64, then the
 * loader's search path), and resolve every function. SJ_EBACKEND with a
 * message naming what is missing ("no CUDA driver (libcuda.so.1): ...").
 * On failure nothing stays loaded. */
sj_status sj_cuda_api_load(sj_cuda_api *api);
void sj_cuda_api_unload(sj_cuda_api *api);

#endif /* SJ_CUDA_API_H */
