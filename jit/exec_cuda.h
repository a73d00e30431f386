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
    /* While capturing a CUDA graph: where the graph's memory goes, one
     * block kept by the graph (not freed at the end of the call):
     * graph_ws_bytes of cuBLASLt workspace (e.ws), then the call's arena.
     * NULL otherwise. */
    CUdeviceptr *graph_arena;
    size_t graph_ws_bytes;
    CUstream graph_stream; /* where the graph will run: its memory is ordered there */
    /* While capturing: the gather error flag's home in the graph's memory
     * (after the workspace, SJ_GRAPH_FLAG_BYTES of it), so a gather takes
     * no allocation during the capture; the graph zeroes it (a captured
     * memset) before its first gather on every launch. 0 otherwise. */
    CUdeviceptr graph_flag;
    bool flag_used; /* a gather of this call used e.error_flag */
} sj_cuda_call;

#define SJ_GRAPH_FLAG_BYTES 256 /* keeps the arena after it 256-byte aligned */

extern const sj_kernels sj_cuda_kernels;
extern const sj_exec_ops sj_cuda_exec_ops;

void sj_cuda_call_init(sj_cuda_call *c, sj_cuda *cuda, CUstream stream, bool sync, int n_syms);

/* Device copies of g's constants and host parameters (freed with g). */
sj_status sj_cuda_upload_graph(sj_cuda *cuda, sj_graph *g);

/* -- CUDA graphs (exec_graph.c) ---------------------------------------------------
 * A signature's call with the same buffers as SJ_GRAPH_AFTER - 1 unserved
 * calls before it asks for a capture (at most 63): about the calls whose
 * savings pay for one (see exec_graph.c). */
#define SJ_GRAPH_AFTER 48

/* Before a fused call of memo item m (NULL: none) with code cd: launch its
 * graph when there is one for its buffers and stream (SJ_GRAPH_SERVED,
 * *st the call's status). Otherwise the call runs kernel by kernel, and
 * SJ_GRAPH_COUNT asks for sj_cuda_graph_note after it succeeded (SJ_GRAPH_NO:
 * never a graph, e.g. outputs allocated by the call). */
struct sj_fn;
struct sj_memo;
/* (A captured graph with a gather reads its flag after a synchronous
 * launch and fails the call with SJ_EINDEX, as kernel-by-kernel calls do.) */
struct sj_compiled;
typedef enum sj_graph_use { SJ_GRAPH_NO, SJ_GRAPH_COUNT, SJ_GRAPH_SERVED } sj_graph_use;
sj_graph_use sj_cuda_graph_call(struct sj_fn *fn, struct sj_memo *m, const sj_exec *x, sj_cuda_call *cc,
                                const struct sj_compiled *cd, sj_status *st);
/* Count that successful call; at SJ_GRAPH_AFTER, queue its capture on the
 * graph thread. */
void sj_cuda_graph_note(struct sj_fn *fn, struct sj_memo *m, const sj_exec *x, const sj_cuda_call *cc,
                        const struct sj_fplan *plan, const struct sj_compiled *cd);
/* Queue the capture of this successful call's buffers at once, whatever
 * the count (a warm-up's run with the caller's buffers); within the same
 * limits. False when no capture can be asked for (graphs off, a failed
 * capture of this signature before, an output allocated by the call). */
bool sj_cuda_graph_request(struct sj_fn *fn, struct sj_memo *m, const sj_exec *x, const sj_cuda_call *cc,
                           const struct sj_fplan *plan, const struct sj_compiled *cd);
/* The table's graph_free (ctx: the runtime). */
void sj_cuda_graph_free(void *ctx, void *graph);

/* The runtime's graph thread, which captures and instantiates the graphs
 * sj_cuda_graph_call asks for (rt->grapher). Destroy after every function. */
typedef struct sj_grapher sj_grapher;
sj_status sj_cuda_grapher_create(sj_runtime *rt);
void sj_cuda_grapher_destroy(sj_runtime *rt);
/* Drop fn's queued captures and wait for a running one (before its table
 * goes); or wait for all of them (sj_fn_wait_idle). */
void sj_cuda_graph_cancel_fn(sj_runtime *rt, struct sj_fn *fn);
void sj_cuda_graph_wait_fn(sj_runtime *rt, struct sj_fn *fn);

/* -- Lanes (lanes.c): streams for sj_call from several threads at once ------------
 * A synchronous call that finds another in flight runs on a stream of the
 * runtime's own, ordered after the work queued on the runtime's stream so
 * far; a call alone runs on the runtime's stream. rt->lanes; made with the
 * device, destroyed after every function. */
typedef struct sj_lanes sj_lanes;
sj_status sj_cuda_lanes_create(sj_runtime *rt);
void sj_cuda_lanes_destroy(sj_runtime *rt);
/* The stream for a synchronous call; *which names the lane for
 * sj_cuda_lane_put (-1: the runtime's stream), called once the call has
 * synchronized that stream. Never fails: without a lane, the runtime's. */
CUstream sj_cuda_lane_take(sj_runtime *rt, int *which);
void sj_cuda_lane_put(sj_runtime *rt, int which);
/* Tests: calls that ran on a lane; pretend delta more calls are in flight. */
uint64_t sj_cuda_lanes_taken(const sj_runtime *rt);
void sj_cuda_lanes_test_busy(sj_runtime *rt, int delta);

#endif
#endif
