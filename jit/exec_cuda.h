/* Execution on a CUDA device (see exec_cuda.c). Built with SJ_WITH_CUDA. */
#ifndef SJ_EXEC_CUDA_H
#define SJ_EXEC_CUDA_H

#ifdef SJ_WITH_CUDA

#include <stdbool.h>

#include "jit/exec.h"
#include "kernels/cuda/eager_cuda.h"

/* One call's context for the CUDA tables (lives on the caller's stack). */
typedef struct sj_cuda_call {
    sj_cuda_exec e; /* device, stream, gather error flag */
    bool sync;      /* sj_call: wait for the kernels (and check errors) at the end */
    int n_syms;     /* symbols of the graph: generated kernels take them all */
} sj_cuda_call;

extern const sj_kernels sj_cuda_kernels;
extern const sj_exec_ops sj_cuda_exec_ops;

void sj_cuda_call_init(sj_cuda_call *c, sj_cuda *cuda, CUstream stream, bool sync, int n_syms);

/* Device copies of g's constants and host parameters (freed with g). */
sj_status sj_cuda_upload_graph(sj_cuda *cuda, sj_graph *g);

#endif
#endif
