/* CUDA graphs: the capture mechanics behind the device table's graph
 * slots (kernels/device.h). When to capture, and which graph serves which
 * call, is the engine's (jit/graphs.c); this file captures, launches and
 * frees.
 *
 * How. The call runs as usual on a private stream in capture mode
 * (relaxed: the allocator may take fresh blocks meanwhile). The arena comes
 * from the allocator, ordered on the stream the graph will run on, and
 * stays with the graph, in one block with a cuBLASLt workspace of its own
 * (GRAPH_WS_BYTES, for plans with float products): a product's workspace
 * cannot come from the allocator during a capture, and a workspace shared
 * with other products is wrong (another thread's split product can
 * straddle the graph's launch on the stream: see eager_fns in
 * eager_cuda.c). Anything that asks the allocator for memory on the
 * captured stream (a matmul's packed operand; a gather's error flag has a
 * home in the graph's memory instead) fails, and the capture with it. A
 * graph for the device's stream is uploaded to the device (cuGraphUpload)
 * by the capture, not by its first launch.
 *
 * Threads. One capture at a time per device (the capture stream is
 * shared: cu->capture_lock). A graph is launched from any thread with no
 * lock; it is freed when no call can launch it any more.
 */
#include <pthread.h>
#include <stdlib.h>

#include "base/alloc.h"
#include "base/error.h"
#include "kernels/cuda/exec_cuda.h"
#include "specialize/fusion.h"

#define GRAPH_WS_BYTES ((size_t)4 << 20)

typedef struct cuda_graph {
    CUgraphExec exec;
    size_t bytes;     /* mem's block (the allocator's size class) */
    CUstream stream;  /* where it is launched: the calls' stream */
    CUdeviceptr mem;  /* the graph's own: cuBLASLt's workspace, the gather flag, the intermediates */
    CUdeviceptr flag; /* the gather error flag in mem, when the plan gathers; else 0 */
} cuda_graph;

static void destroy(sj_cuda *cu, cuda_graph *g) {
    sj_cuda_bind(cu);
    if (g->exec) cu->api.GraphExecDestroy(g->exec); /* an in-flight launch completes first */
    /* the caller's stream is done with it (sj_call_stream's contract:
     * synchronized before sj_fn_destroy), the device's is ordered */
    sj_cuda_free(cu, g->mem, cu->stream);
    free(g);
}

/* Does the plan call cuBLASLt (a float product)? */
static bool has_matmul(const sj_graph *gr, const sj_fplan *plan) {
    for (int i = 0; i < plan->n_groups; i++) {
        const sj_group *p = &plan->groups[i];
        if (p->kind == SJ_G_NODE && gr->nodes[p->nodes[0]].op == SJ_OP_MATMUL &&
            sj_dtype_is_float(gr->vals[gr->nodes[p->nodes[0]].out].dtype))
            return true;
    }
    return false;
}

/* Run the call on the capture stream in capture mode, into g. */
static sj_status capture(sj_cuda *cu, const sj_graph *gr, const sj_fplan *plan, int n_syms,
                         sj_status (*run)(void *arg, void *cc), void *arg, cuda_graph *g) {
    const sj_cuda_api *a = &cu->api;
    sj_cuda_bind(cu);
    CUgraph graph = NULL;
    pthread_mutex_lock(&cu->capture_lock);
    sj_status st = SJ_OK;
    if (!cu->capture_stream)
        st = SJ_CU(cu, a->StreamCreate(&cu->capture_stream, CU_STREAM_NON_BLOCKING), "creating the capture stream");
    if (!st) st = SJ_CU(cu, a->StreamBeginCapture(cu->capture_stream, CU_STREAM_CAPTURE_MODE_RELAXED),
                        "beginning a CUDA graph capture");
    if (!st) {
        sj_cuda_call cap;
        sj_cuda_call_init(&cap, cu, cu->capture_stream, false, n_syms);
        cap.graph_arena = &g->mem;
        cap.graph_stream = g->stream;
        cap.graph_ws_bytes = has_matmul(gr, plan) ? GRAPH_WS_BYTES : 0;
        sj_cuda_capturing(cu->capture_stream);
        st = run(arg, &cap);
        sj_cuda_capturing(NULL);
        g->flag = cap.flag_used ? cap.graph_flag : 0;
        g->bytes = cap.graph_bytes;
        sj_status est = SJ_CU(cu, a->StreamEndCapture(cu->capture_stream, &graph), "ending a CUDA graph capture");
        if (!st) st = est;
    }
    pthread_mutex_unlock(&cu->capture_lock);
    if (!st) st = SJ_CU(cu, a->GraphInstantiate(&g->exec, graph, 0), "instantiating a CUDA graph");
    /* its upload to the device, queued now rather than by the first call
     * that launches it; on the device's stream only (a caller's stream may
     * be gone by now: its first launch uploads). Then waited for: a call on
     * a lane may launch it next, ordered only behind what the device's
     * stream held when that call began, and the graph's memory came from
     * blocks the device's stream may still have been using. */
    if (!st && g->stream == cu->stream) {
        st = SJ_CU(cu, a->GraphUpload(g->exec, cu->stream), "uploading a CUDA graph");
        if (!st) st = SJ_CU(cu, a->StreamSynchronize(cu->stream), "waiting for a CUDA graph's upload");
    }
    if (graph) a->GraphDestroy(graph);
    return st;
}

static sj_status graph_capture(sj_backend *b, const sj_graph *gr, const sj_fplan *plan, int n_syms,
                               const void *stream, sj_status (*run)(void *arg, void *cc), void *arg, void **out,
                               size_t *bytes) {
    sj_cuda *cu = sj_cuda_of(b);
    cuda_graph *g = sj_calloc(1, sizeof *g);
    if (!g) return sj_seterr(SJ_ENOMEM, "out of memory for a CUDA graph");
    g->stream = (CUstream)stream;
    sj_status st = capture(cu, gr, plan, n_syms, run, arg, g);
    if (st) {
        destroy(cu, g);
        return st;
    }
    *out = g;
    *bytes = g->bytes;
    return SJ_OK;
}

static sj_status graph_launch(void *c, void *graph) {
    sj_cuda_call *cc = c;
    const cuda_graph *g = graph;
    sj_cuda *cu = cc->e.cuda;
    sj_cuda_bind(cu);
    sj_status st = SJ_CU(cu, cu->api.GraphLaunch(g->exec, cc->e.stream), "launching a CUDA graph");
    int flag = 0; /* a gather's bad index (the graph zeroed the flag before its gathers) */
    if (!st && cc->sync && g->flag)
        st = SJ_CU(cu, cu->api.MemcpyDtoHAsync(&flag, g->flag, sizeof flag, cc->e.stream),
                   "reading the call's error flag");
    if (!st && cc->sync) st = SJ_CU(cu, cu->api.StreamSynchronize(cc->e.stream), "waiting for a CUDA graph");
    if (!st && flag) st = sj_cuda_flag_status(flag);
    return st;
}

static void graph_free(sj_backend *b, void *graph) {
    if (graph) destroy(sj_cuda_of(b), graph);
}

/* The stream a call's graphs are kept for: a synchronous call's is the
 * device's, whether it runs there or on a lane (lanes.c), since a graph
 * launched on any stream is ordered behind its own earlier launches and
 * its memory was made ready on the device's stream before it was
 * published; sj_call_stream's is the caller's. */
static const void *graph_stream(void *c) {
    const sj_cuda_call *cc = c;
    return cc->sync ? cc->e.cuda->stream : cc->e.stream;
}

void sj_cuda_fill_graph_slots(sj_backend *b) {
    b->graph_capture = graph_capture;
    b->graph_launch = graph_launch;
    b->graph_free = graph_free;
    b->graph_stream = graph_stream;
}
