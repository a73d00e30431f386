/* The CUDA device's pieces behind the device table (kernels/device.h):
 * a call's context and its slots (exec_cuda.c), graph capture mechanics
 * (graph_cuda.c), lanes (lanes.c), the device itself (device_cuda.c). */
#ifndef SJ_EXEC_CUDA_H
#define SJ_EXEC_CUDA_H

#include <stdbool.h>

#include "kernels/cuda/eager_cuda.h"
#include "kernels/device.h"

/* One call's context for the CUDA slots (lives on the caller's stack, in
 * an sj_dev_call). */
typedef struct sj_cuda_call {
    sj_cuda_exec e; /* device, stream, gather error flag */
    bool sync;      /* sj_call: wait for the kernels (and check errors) at the end */
    int n_syms;     /* symbols of the graph: generated kernels take them all */
    bool took_lane; /* the call took a stream of the device's (lanes.c): put it back at its end */
    bool sync_call; /* the call itself is synchronous (sync may also be set by a validation) */
    int lane;       /* the lane the call took (lanes.c; -1: the device's stream) */
    /* While capturing a CUDA graph: where the graph's memory goes, one
     * block kept by the graph (not freed at the end of the call):
     * graph_ws_bytes of cuBLASLt workspace (e.ws), then the call's arena.
     * NULL otherwise. */
    CUdeviceptr *graph_arena;
    size_t graph_ws_bytes;
    size_t graph_bytes; /* the allocator's block behind *graph_arena (its size class) */
    CUstream graph_stream; /* where the graph will run: its memory is ordered there */
    /* While capturing: the gather error flag's home in the graph's memory
     * (after the workspace, SJ_GRAPH_FLAG_BYTES of it), so a gather takes
     * no allocation during the capture; the graph zeroes it (a captured
     * memset) before its first gather on every launch. 0 otherwise. */
    CUdeviceptr graph_flag;
    bool flag_used; /* a gather of this call used e.error_flag */
    /* Updating a bucket graph (graph_cuda.c): the graph's memory, laid out
     * as a capture's graph_arena ([graph_ws_bytes][flag][arena]), which
     * the call's arena must be again; 0 otherwise. */
    CUdeviceptr graph_fixed;
} sj_cuda_call;

#define SJ_GRAPH_FLAG_BYTES 256 /* keeps the arena after it 256-byte aligned */

void sj_cuda_call_init(sj_cuda_call *c, sj_cuda *cuda, CUstream stream, bool sync, int n_syms);
/* Fill b's eager op slots and call slots (buf/out alloc, launch, finish). */
void sj_cuda_fill_call_slots(sj_backend *b);

/* Device copies of g's constants and host parameters (freed with g). */
sj_status sj_cuda_upload_graph(sj_cuda *cuda, sj_graph *g);

/* Launch a generated product (specialize/codegen_gemm_cuda.h) of spec sp
 * (its tile) at M rows on e's stream (through sj_cuda_launch_kernel: a
 * capture's recorder sees it): grid and block from sj_gemm_cuda_dims, the
 * function allowed its shared memory, and for a warpgroup tile the two
 * TMA tensor maps its kernel takes after M (A [M, K] in boxes of 64 x BM,
 * B [K, N] in boxes of 64 x 64, f16, 128-byte swizzle, rows past M read
 * as zeros), encoded for these operands. M = 0 launches nothing.
 * SJ_EBACKEND naming what failed (a driver without
 * cuTensorMapEncodeTiled cannot run a warpgroup tile).
 * A spec with a LayerNorm inside (sp->ln) takes ln: its gamma and beta
 * (NULL when absent), its output and sj_gemm_ln_counters(M) zeroed
 * counters (SJ_EINVAL without them). */
struct sj_gemm_spec;
typedef struct sj_gemm_ln_args {
    const void *g, *b;
    void *y;
    unsigned *cnt;
} sj_gemm_ln_args;
sj_status sj_cuda_gemm_launch(const sj_cuda_exec *e, CUfunction f, const struct sj_gemm_spec *sp, int64_t M,
                              const void *A, const void *B, const void *bias, const void *R, void *C,
                              const sj_gemm_ln_args *ln);

/* The device's gemm_tune slot (kernels/device.h; gemm_tune.c): memo (the
 * device's record of choices by unit key, thread-safe), cache and log may
 * be NULL. Returns whether it timed anything (false: the choice came from
 * the memo or the cache). */
typedef struct sj_gemm_memo sj_gemm_memo;
sj_gemm_memo *sj_gemm_memo_create(void); /* NULL: out of memory */
void sj_gemm_memo_free(sj_gemm_memo *m);
struct sj_cache;
struct sj_log_sink;
struct sj_fplan;
bool sj_cuda_gemm_tune(sj_cuda *cu, sj_gemm_memo *memo, struct sj_cache *cache, const struct sj_log_sink *log,
                       const sj_graph *g, const struct sj_fplan *p, const int64_t *syms, void *const *fns,
                       const char *key, int8_t *pick);

/* -- The device (device_cuda.c) ------------------------------------------------------ */

/* The sj_cuda of a CUDA device table (sj_device_create's), else NULL. */
sj_cuda *sj_cuda_of(const sj_backend *b);

/* -- Graph capture mechanics (graph_cuda.c) --------------------------------------------
 * Fill b's graph slots (capture, launch, free, stream key). */
void sj_cuda_fill_graph_slots(sj_backend *b);

/* -- Lanes (lanes.c): streams for sj_call from several threads at once ------------
 * A synchronous call that finds another in flight runs on a stream of the
 * device's own, ordered after the work queued on the device's stream so
 * far; a call alone runs on the device's stream. Made with the device,
 * destroyed with it. */
typedef struct sj_lanes sj_lanes;
sj_status sj_lanes_create(sj_cuda *cuda, sj_lanes **out);
void sj_lanes_destroy(sj_lanes *L);
/* The stream for a synchronous call; *which names the lane for
 * sj_lane_put (-1: the device's stream), called once the call has
 * synchronized that stream. Never fails: without a lane, the device's. */
CUstream sj_lane_take(sj_lanes *L, int *which);
void sj_lane_put(sj_lanes *L, int which);
/* Tests: calls of device b that ran on a lane; pretend delta more calls
 * are in flight. */
uint64_t sj_cuda_lanes_taken(const sj_backend *b);
void sj_cuda_lanes_test_busy(sj_backend *b, int delta);
/* (lanes.c's, for the two above) */
uint64_t sj_lanes_taken(const sj_lanes *L);
void sj_lanes_test_busy(sj_lanes *L, int delta);

#endif
