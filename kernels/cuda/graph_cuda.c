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
 *
 * Bucket graphs (graph_capture_bucket, graph_replay): one graph serves
 * every size of a bucket. The engine captures the call at the bucket's
 * largest sizes, with the arena laid out for them (sj_exec.layout_syms),
 * on buffers of the graph's own for the inputs and outputs (the staging
 * buffers: a caller's smaller buffers could not take a product over the
 * largest sizes). While it is captured, a recorder (sj_cuda_rec) notes
 * each kernel's node (cuStreamGetCaptureInfo after its launch) and what
 * every other piece of stream work is (a cuBLASLt product's sizes,
 * layouts and pointers, a copy, a memset). A replay for new sizes runs
 * the call again on a context whose recorder updates instead of
 * launching: each kernel of ours sets its node's function, grid and
 * arguments (cuGraphExecKernelNodeSetParams), and each other piece must
 * be what the graph holds but for the rows of a product or the bytes of a
 * copy, which may be fewer (the graph's larger product over the same
 * buffers gives the same first rows: a product's rows depend on the same
 * rows of its input alone). Anything else (another layout, another
 * pointer, more kernels) leaves the call to run kernel by kernel. The
 * graph's first kernels copy the inputs into the staging buffers (a copy
 * kernel of ours per input, captured copying each buffer onto itself; a
 * replay sets their source to the caller's buffers and their size), so a
 * replay queues no copy of its own before the launch; after it the
 * outputs are copied out; but an output buffer that no library op, copy
 * or memset touched in the capture is direct: a replay gives the graph's
 * kernels the caller's buffer instead (the encoder layer's output, which
 * a layer norm of ours writes), with no copy. A bucket graph is replayed
 * by one call at a time (its lock, tried: a call that finds it busy runs
 * kernel by kernel), and a replay on another stream than the last waits
 * for what that stream holds (an event recorded there then): the staging
 * buffers are shared.
 *
 * Copies. A bucket graph is instantiated several times (its copies, of
 * one CUgraph: as many as the engine asks, cfg.bucket_graph_execs or the
 * bucket's count of sizes if fewer), all at the capture and uploaded then,
 * so no call waits for an instantiation. Each copy keeps the sizes and the
 * input and direct buffers of the last call it served, and a call whose
 * sizes and buffers a copy holds replays it with no update: a stream of
 * lengths that come back updates once per length. A call of new sizes
 * updates a copy holding none yet, else the least recently replayed.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/clock.h"
#include "base/error.h"
#include "kernels/cuda/exec_cuda.h"
#include "specialize/fusion.h"

#define GRAPH_WS_BYTES ((size_t)4 << 20)

/* -- The recorder of a bucket graph -------------------------------------------------- */

enum { REC_RECORD, REC_UPDATE };
enum { REC_KERNEL = 0 }; /* (the other kinds: eager_cuda.h's SJ_REC_*) */
#define REC_VALS SJ_REC_LT_VALS

typedef struct rec_op {
    int kind, n;
    CUgraphNode node; /* a kernel's */
    int64_t v[REC_VALS];
} rec_op;

struct sj_cuda_rec {
    int mode;
    int n, cap, at; /* ops noted; the next to match while updating */
    rec_op *ops;
    bool bad;         /* recording: a kernel's node not found; updating: the call differs */
    CUgraphExec exec; /* updating: whose nodes */
    const sj_cuda_api *api;
};

static rec_op *rec_push(sj_cuda_rec *r) {
    if (r->n == r->cap) {
        int cap = r->cap ? 2 * r->cap : 32;
        rec_op *o = realloc(r->ops, sizeof *o * (size_t)cap); /* while capturing only */
        if (!o) {
            r->bad = true;
            return NULL;
        }
        r->ops = o, r->cap = cap;
    }
    rec_op *o = &r->ops[r->n++];
    memset(o, 0, sizeof *o);
    return o;
}

/* One of our kernels on e's stream: with programmatic stream
 * serialization where the device has it (sj_cuda.pdl; every kernel of
 * ours waits for its predecessors first: base/sj_kernel_rt.h's
 * sj_rt_grid_dep), else as cuLaunchKernel does. In a capture the
 * attribute becomes a programmatic edge of the graph. */
static CUresult launch_kernel(const sj_cuda_exec *e, CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                              unsigned bx, unsigned by, unsigned bz, unsigned smem, void **args) {
    const sj_cuda *c = e->cuda;
    if (!c->pdl) return c->api.LaunchKernel(f, gx, gy, gz, bx, by, bz, smem, e->stream, args, NULL);
    CUlaunchAttribute at = {.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
                            .value = {.programmaticStreamSerializationAllowed = 1}};
    CUlaunchConfig cfg = {.gridDimX = gx, .gridDimY = gy, .gridDimZ = gz, .blockDimX = bx, .blockDimY = by,
                          .blockDimZ = bz, .sharedMemBytes = smem, .hStream = e->stream, .attrs = &at,
                          .numAttrs = 1};
    return c->api.LaunchKernelEx(&cfg, f, args, NULL);
}

CUresult sj_cuda_launch_kernel(const sj_cuda_exec *e, CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                               unsigned bx, unsigned by, unsigned bz, unsigned smem, void **args) {
    const sj_cuda_api *a = &e->cuda->api;
    sj_cuda_rec *r = e->rec;
    if (e->cuda->count_launches && (!r || r->mode == REC_RECORD))
        atomic_fetch_add_explicit(&e->cuda->n_kernels, 1, memory_order_relaxed);
    if (!r && e->cuda->time_launches && sj_cuda_timed_begin(e->cuda, e->stream, f)) { /* (benchmarks) */
        CUresult res = launch_kernel(e, f, gx, gy, gz, bx, by, bz, smem, args);
        sj_cuda_timed_end(e->cuda, e->stream);
        return res;
    }
    if (!r) return launch_kernel(e, f, gx, gy, gz, bx, by, bz, smem, args);
    if (r->mode == REC_UPDATE) {
        if (r->at >= r->n || r->ops[r->at].kind != REC_KERNEL) {
            r->bad = true;
            return CUDA_ERROR_INVALID_VALUE;
        }
        CUDA_KERNEL_NODE_PARAMS p = {.func = f, .gridDimX = gx, .gridDimY = gy, .gridDimZ = gz, .blockDimX = bx,
                                     .blockDimY = by, .blockDimZ = bz, .sharedMemBytes = smem,
                                     .kernelParams = args};
        CUresult res = r->api->GraphExecKernelNodeSetParams(r->exec, r->ops[r->at++].node, &p);
        if (res != CUDA_SUCCESS) r->bad = true;
        return res;
    }
    CUresult res = launch_kernel(e, f, gx, gy, gz, bx, by, bz, smem, args);
    if (res != CUDA_SUCCESS) return res;
    CUstreamCaptureStatus cs;
    const CUgraphNode *deps = NULL;
    size_t nd = 0;
    res = a->StreamGetCaptureInfo(e->stream, &cs, NULL, NULL, &deps, NULL, &nd);
    if (res != CUDA_SUCCESS) return res;
    rec_op *o = cs == CU_STREAM_CAPTURE_STATUS_ACTIVE && nd == 1 ? rec_push(r) : NULL;
    if (!o) r->bad = true; /* its node not known: the graph cannot be updated */
    else o->kind = REC_KERNEL, o->node = deps[0];
    return CUDA_SUCCESS;
}

bool sj_cuda_rec_op(const sj_cuda_exec *e, int kind, const int64_t *v, int n, int shrink) {
    sj_cuda_rec *r = e->rec;
    if (!r) return false;
    if (n > REC_VALS) {
        r->bad = true;
        return r->mode == REC_UPDATE;
    }
    if (r->mode == REC_RECORD) {
        rec_op *o = rec_push(r);
        if (o) {
            o->kind = kind, o->n = n;
            memcpy(o->v, v, sizeof(int64_t) * (size_t)n);
        }
        return false;
    }
    const rec_op *o = r->at < r->n ? &r->ops[r->at++] : NULL;
    if (!o || o->kind != kind || o->n != n) {
        r->bad = true;
        return true;
    }
    for (int i = 0; i < n; i++)
        if (i == shrink ? v[i] > o->v[i] || v[i] < 0 : v[i] != o->v[i]) r->bad = true;
    return true;
}

/* -- Graphs ------------------------------------------------------------------------ */

#define MAX_STAGE (2 * 64) /* staging buffers of a bucket graph: inputs, then outputs */

/* One instantiation of a bucket graph. */
typedef struct bg_copy {
    CUgraphExec exec;
    bool good;     /* its kernels hold the sizes and buffers noted for it */
    uint32_t used; /* the graph's tick at its last replay */
} bg_copy;

typedef struct cuda_graph {
    CUgraphExec exec;
    size_t bytes;     /* mem's block (the allocator's size class), and a bucket graph's staging block */
    CUstream stream;  /* where it is launched: the calls' stream */
    CUdeviceptr mem;  /* the graph's own: cuBLASLt's workspace, the gather flag, the intermediates */
    CUdeviceptr flag; /* the gather error flag in mem, when the plan gathers; else 0 */
    size_t ws_bytes;  /* of cuBLASLt workspace at mem's start */
    /* A bucket graph's (else rec NULL): */
    sj_cuda_rec *rec;
    CUgraph graph;    /* kept: its nodes name the kernels to update */
    CUdeviceptr stage;
    int n_stage, n_in; /* staging buffers; the first n_in the inputs */
    CUdeviceptr buf[MAX_STAGE];
    size_t buf_bytes[MAX_STAGE];
    unsigned char direct[MAX_STAGE]; /* no library op touches it: the caller's buffer, no copy */
    pthread_mutex_t lock; /* one replay at a time */
    CUevent done;         /* recorded on the last replay's stream when the next comes on another */
    CUstream last;        /* the last replay's stream (NULL: none yet) */
    _Atomic uint64_t updates, mismatches; /* updates that served their call, and that did not */
    /* Its copies (instantiations of graph), each updated for the sizes and
     * direct buffers of the last call it served: ex[0] is exec. */
    bg_copy *ex;
    int n_ex, max_ex;
    int n_syms;            /* the call's symbols, as captured */
    int64_t *ex_syms;      /* [max_ex][n_syms]: copy k's sizes */
    CUdeviceptr *ex_ptr;   /* [max_ex][n_stage]: copy k's inputs and direct buffers */
    uint32_t tick;         /* replays, for the copies' least recent use */
} cuda_graph;

static void destroy(sj_cuda *cu, cuda_graph *g) {
    sj_cuda_bind(cu);
    if (g->ex) /* a bucket graph's copies, g->exec the first */
        for (int k = 0; k < g->n_ex; k++) cu->api.GraphExecDestroy(g->ex[k].exec);
    else if (g->exec) cu->api.GraphExecDestroy(g->exec); /* an in-flight launch completes first */
    if (g->graph) cu->api.GraphDestroy(g->graph);
    if (g->done) cu->api.EventDestroy(g->done);
    /* the caller's stream is done with it (sj_call_stream's contract:
     * synchronized before sj_fn_destroy), the device's is ordered */
    sj_cuda_free(cu, g->mem, cu->stream);
    if (g->stage) sj_cuda_free(cu, g->stage, cu->stream);
    if (g->rec) {
        free(g->rec->ops);
        free(g->rec);
        pthread_mutex_destroy(&g->lock);
    }
    free(g->ex);
    free(g->ex_syms);
    free(g->ex_ptr);
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
        cap.e.rec = g->rec; /* a bucket graph's: notes what the call queues */
        g->ws_bytes = cap.graph_ws_bytes;
        sj_cuda_capturing(cu->capture_stream);
        /* a bucket graph's first kernels: its inputs copied in (here onto
         * themselves; a replay gives them the caller's buffers) */
        for (int i = 0; g->rec && i < g->n_in && !st; i++)
            if (g->buf_bytes[i]) st = sj_cuda_copy_by_kernel(&cap.e, g->buf[i], g->buf[i], g->buf_bytes[i]);
        if (!st) st = run(arg, &cap);
        sj_cuda_capturing(NULL);
        g->flag = cap.flag_used ? cap.graph_flag : 0;
        g->bytes = cap.graph_bytes;
        sj_status est = SJ_CU(cu, a->StreamEndCapture(cu->capture_stream, &graph), "ending a CUDA graph capture");
        if (!st) st = est;
    }
    pthread_mutex_unlock(&cu->capture_lock);
    if (!st && g->rec && g->rec->bad)
        st = sj_seterr(SJ_EBACKEND, "a bucket graph's kernel nodes could not be told apart in the capture");
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
    if (graph && g->rec && !st) g->graph = graph; /* its nodes name the kernels a replay updates */
    else if (graph) a->GraphDestroy(graph);
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

static size_t align256(size_t n) { return (n + 255) & ~(size_t)255; }

/* Staging buffers that no recorded library op, copy or memset touches
 * (a pointer of one inside the buffer): only the graph's kernels, whose
 * arguments a replay sets, read or write them, so a replay may hand those
 * kernels the caller's buffer instead. */
static void find_direct(cuda_graph *g) {
    for (int i = 0; i < g->n_stage; i++) {
        CUdeviceptr lo = g->buf[i], hi = lo + (g->buf_bytes[i] ? g->buf_bytes[i] : 1);
        bool touched = false;
        for (int k = 0; k < g->rec->n && !touched; k++) {
            const rec_op *o = &g->rec->ops[k];
            int at[4], np = 0;
            if (o->kind == SJ_REC_LT)
                for (np = 0; np < 4; np++) at[np] = SJ_REC_LT_PTRS + np;
            else if (o->kind == SJ_REC_COPY) at[0] = 0, at[1] = 1, np = 2;
            else if (o->kind == SJ_REC_SET) at[0] = 0, np = 1;
            for (int j = 0; j < np; j++) {
                CUdeviceptr p = (CUdeviceptr)o->v[at[j]];
                touched |= p >= lo && p < hi;
            }
        }
        g->direct[i] = i >= g->n_in && !touched; /* (an input: copied in by the graph's first kernels) */
    }
}

/* Make copies 1.. of bucket graph g (copy 0 is its capture's), each
 * uploaded: at the capture, so that no call waits for an instantiation
 * (launching each once there too gave a first call nothing measurable:
 * w5 on an H100). Fewer where the driver refuses one (the graph serves
 * with those it has). */
static void make_copies(sj_cuda *cu, cuda_graph *g, int copies) {
    const sj_cuda_api *a = &cu->api;
    int64_t t0 = sj_now_ns();
    int made = 0;
    while (g->n_ex < copies) {
        CUgraphExec x = NULL;
        if (a->GraphInstantiate(&x, g->graph, 0) != CUDA_SUCCESS) break;
        if (a->GraphUpload(x, cu->stream) != CUDA_SUCCESS) {
            a->GraphExecDestroy(x);
            break;
        }
        g->ex[g->n_ex++] = (bg_copy){.exec = x};
        made++;
    }
    if (made && a->StreamSynchronize(cu->stream) != CUDA_SUCCESS) { /* (the copies' uploads) */
        while (g->n_ex > 1) a->GraphExecDestroy(g->ex[--g->n_ex].exec);
        made = 0;
    }
    atomic_fetch_add_explicit(&cu->bg_instantiated, (uint64_t)made, memory_order_relaxed);
    atomic_fetch_add_explicit(&cu->bg_inst_ns, (uint64_t)(sj_now_ns() - t0), memory_order_relaxed);
}

static sj_status graph_capture_bucket(sj_backend *b, const sj_graph *gr, const sj_fplan *plan, int n_syms,
                                      const void *stream, int n_in, int n_bufs, const size_t *sizes, void **bufs,
                                      int copies, sj_status (*run)(void *arg, void *cc), void *arg, void **out,
                                      size_t *bytes, unsigned char *direct) {
    sj_cuda *cu = sj_cuda_of(b);
    const sj_cuda_api *a = &cu->api;
    if (!a->StreamGetCaptureInfo || !a->GraphExecKernelNodeSetParams)
        return sj_seterr(SJ_EBACKEND, "bucket graphs: the CUDA driver has no cuStreamGetCaptureInfo_v3 or "
                                      "cuGraphExecKernelNodeSetParams_v2");
    if (n_bufs < 0 || n_bufs > MAX_STAGE || n_syms > 64 || n_in < 0 || n_in > n_bufs)
        return sj_seterr(SJ_ELIMIT, "bucket graphs: %d buffers (%d inputs) and %d symbols (at most %d and 64)", n_bufs,
                         n_in, n_syms, MAX_STAGE);
    cuda_graph *g = sj_calloc(1, sizeof *g);
    sj_cuda_rec *r = g ? sj_calloc(1, sizeof *r) : NULL;
    if (!r) {
        free(g);
        return sj_seterr(SJ_ENOMEM, "out of memory for a CUDA graph");
    }
    pthread_mutex_init(&g->lock, NULL);
    r->api = a;
    g->rec = r;
    g->stream = (CUstream)stream;
    g->n_syms = n_syms;
    g->n_in = n_in;
    g->max_ex = copies > 0 ? copies : 1;
    size_t total = 0;
    for (int i = 0; i < n_bufs; i++) total += align256(sizes[i] ? sizes[i] : 1);
    sj_cuda_bind(cu);
    g->stage = sj_cuda_alloc(cu, total, cu->stream);
    sj_status st = g->stage ? SJ_OK : sj_seterr(SJ_ENOMEM, "out of device memory for a bucket graph's %zu bytes of "
                                                           "inputs and outputs", total);
    size_t off = 0;
    for (int i = 0; i < n_bufs && !st; i++) {
        g->buf[i] = g->stage + off;
        g->buf_bytes[i] = sizes[i];
        bufs[i] = (void *)(uintptr_t)g->buf[i];
        off += align256(sizes[i] ? sizes[i] : 1);
    }
    g->n_stage = n_bufs;
    /* the staging block was taken on the device's stream: ready before the capture's graph runs */
    if (!st) st = SJ_CU(cu, a->StreamSynchronize(cu->stream), "waiting for a bucket graph's buffers");
    if (!st) st = SJ_CU(cu, a->EventCreate(&g->done, CU_EVENT_DISABLE_TIMING), "creating a bucket graph's event");
    if (!st) st = capture(cu, gr, plan, n_syms, run, arg, g);
    if (st) {
        destroy(cu, g);
        return st;
    }
    g->ex = sj_calloc((size_t)g->max_ex, sizeof *g->ex);
    g->ex_syms = sj_calloc((size_t)g->max_ex * (size_t)(n_syms > 0 ? n_syms : 1), sizeof *g->ex_syms);
    g->ex_ptr = sj_calloc((size_t)g->max_ex * (size_t)(n_bufs > 0 ? n_bufs : 1), sizeof *g->ex_ptr);
    if (!g->ex || !g->ex_syms || !g->ex_ptr) {
        destroy(cu, g);
        return sj_seterr(SJ_ENOMEM, "out of memory for a bucket graph's copies");
    }
    g->ex[0].exec = g->exec; /* the captured copy: holds no call's sizes yet */
    g->n_ex = 1;
    make_copies(cu, g, g->max_ex);
    find_direct(g);
    memcpy(direct, g->direct, (size_t)n_bufs);
    *out = g;
    *bytes = g->bytes + sj_cuda_block_bytes(total);
    return SJ_OK;
}

/* The buffer a replay's call gives for staging buffer i: src[i] for an
 * input, dst[i - n_in] for an output. */
static CUdeviceptr call_ptr(int i, int n_in, const void *const *src, void *const *dst) {
    return (CUdeviceptr)(uintptr_t)(i < n_in ? src[i] : dst[i - n_in]);
}

/* The copy of g whose kernels already hold this call's sizes and direct
 * buffers, or -1. */
static int find_copy(const cuda_graph *g, const int64_t *syms, int n_in, const void *const *src, void *const *dst) {
    for (int k = 0; k < g->n_ex; k++) {
        if (!g->ex[k].good) continue;
        const int64_t *ks = g->ex_syms + (size_t)k * (size_t)g->n_syms;
        int i = 0;
        while (i < g->n_syms && ks[i] == syms[i]) i++;
        if (i < g->n_syms) continue;
        const CUdeviceptr *kp = g->ex_ptr + (size_t)k * (size_t)g->n_stage;
        for (i = 0; i < g->n_stage; i++)
            if ((i < g->n_in || g->direct[i]) && kp[i] != call_ptr(i, n_in, src, dst)) break;
        if (i == g->n_stage) return k;
    }
    return -1;
}

/* The copy a call of new sizes updates: one holding no sizes, else the
 * least recently replayed. */
static int copy_to_update(const cuda_graph *g) {
    int k = 0; /* one holding no sizes first, then the least recently replayed */
    for (int i = 1; i < g->n_ex; i++)
        if (g->ex[i].good != g->ex[k].good ? !g->ex[i].good : g->ex[i].used < g->ex[k].used) k = i;
    return k;
}

static sj_status graph_replay(void *c, void *graph, const int64_t *syms, int n_syms, int n_in,
                              const void *const *src, void *const *dst, const size_t *nbytes,
                              sj_status (*update)(void *arg, void *cc), void *arg, bool *served) {
    sj_cuda_call *cc = c;
    cuda_graph *g = graph;
    sj_cuda *cu = cc->e.cuda;
    const sj_cuda_api *a = &cu->api;
    CUstream s = cc->e.stream;
    *served = false;
    if (!g->rec || n_in != g->n_in || n_syms != g->n_syms) return SJ_OK;
    for (int i = 0; i < g->n_stage; i++)
        if (nbytes[i] > g->buf_bytes[i]) return SJ_OK;
    /* calls that differ from the captured one more often than not (after
     * 16 of them): not worth an update's host time any more */
    if (g->mismatches >= 16 && g->mismatches > g->updates) return SJ_OK;
    if (pthread_mutex_trylock(&g->lock)) return SJ_OK; /* another call replays it: kernel by kernel */
    sj_cuda_bind(cu);
    int k = find_copy(g, syms, n_in, src, dst);
    if (k < 0) {
        k = copy_to_update(g);
        g->ex[k].good = false; /* until its update is whole */
        sj_cuda_call uc; /* the call again, on the graph's own memory, updating the copy's kernels */
        sj_cuda_call_init(&uc, cu, s, false, cc->n_syms);
        uc.graph_fixed = g->mem;
        uc.graph_ws_bytes = g->ws_bytes;
        uc.e.rec = g->rec;
        g->rec->mode = REC_UPDATE;
        g->rec->at = 0;
        g->rec->bad = false;
        g->rec->exec = g->ex[k].exec;
        sj_status ust = SJ_OK;
        for (int i = 0; i < n_in && !ust; i++) /* the input copies, from the caller's buffers */
            if (g->buf_bytes[i])
                ust = nbytes[i] ? sj_cuda_copy_by_kernel(&uc.e, g->buf[i], (CUdeviceptr)(uintptr_t)src[i], nbytes[i])
                                : sj_seterr(SJ_EINVAL, "an empty input"); /* (its copy kernel has no size 0) */
        if (!ust) ust = update(arg, &uc);
        bool ok = !ust && !g->rec->bad && g->rec->at == g->rec->n;
        if (!ok) {
            g->mismatches++;
            if (ust) snprintf(cu->bg_why, sizeof cu->bg_why, "%s", sj_last_error());
            else snprintf(cu->bg_why, sizeof cu->bg_why, "the call differs from the capture at its op %d of %d",
                          g->rec->at, g->rec->n);
            atomic_fetch_add_explicit(&cu->bg_declined, 1, memory_order_relaxed);
            pthread_mutex_unlock(&g->lock);
            sj_clearerr(); /* nothing queued: the call runs kernel by kernel */
            return SJ_OK;
        }
        g->updates++;
        atomic_fetch_add_explicit(&cu->bg_updates, 1, memory_order_relaxed);
        memcpy(g->ex_syms + (size_t)k * (size_t)g->n_syms, syms, sizeof(int64_t) * (size_t)n_syms);
        CUdeviceptr *kp = g->ex_ptr + (size_t)k * (size_t)g->n_stage;
        for (int i = 0; i < g->n_stage; i++) kp[i] = i < n_in || g->direct[i] ? call_ptr(i, n_in, src, dst) : 0;
        g->ex[k].good = true;
    }
    g->ex[k].used = ++g->tick;
    sj_status st = SJ_OK;
    if (g->last && g->last != s) { /* the staging buffers: after the last replay, on another stream */
        st = SJ_CU(cu, a->EventRecord(g->done, g->last), "marking a bucket graph's last replay");
        if (!st) st = SJ_CU(cu, a->StreamWaitEvent(s, g->done, 0), "ordering a bucket graph after its last replay");
    }
    if (!st) st = SJ_CU(cu, a->GraphLaunch(g->ex[k].exec, s), "launching a CUDA graph");
    for (int i = n_in; i < g->n_stage && !st; i++)
        if (nbytes[i] && !g->direct[i])
            st = SJ_CU(cu, a->MemcpyDtoDAsync((CUdeviceptr)(uintptr_t)dst[i - n_in], g->buf[i], nbytes[i], s),
                       "copying an output out of a bucket graph");
    int flag = 0; /* read before the next replay may zero it */
    if (!st && cc->sync && g->flag)
        st = SJ_CU(cu, a->MemcpyDtoHAsync(&flag, g->flag, sizeof flag, s), "reading the call's error flag");
    if (!st) g->last = s;
    pthread_mutex_unlock(&g->lock);
    *served = true; /* (an error above: reported, the call is over) */
    if (!st && cc->sync) st = SJ_CU(cu, a->StreamSynchronize(s), "waiting for a CUDA graph");
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
    b->graph_capture_bucket = graph_capture_bucket;
    b->graph_replay = graph_replay;
}
