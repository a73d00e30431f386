/* A device: the one table the engine (jit/) reaches a device through.
 *
 * Modelled on ggml's ggml_backend_i: one struct of function pointers per
 * concept, grouped below; a slot marked optional may be NULL, meaning "not
 * supported" or "nothing to do", and the engine then does without (no
 * graphs, host memory, no wait). The CPU fills it in kernels/cpu/ (the
 * system compiler, the kernel thread pool, the eager kernels), CUDA in
 * kernels/cuda/ (NVRTC, the driver, the caching allocator, lanes, graph
 * capture); nothing of a device is reached from jit/ any other way.
 *
 * Two kinds of context:
 *  - the device (sj_backend *b): made once per runtime (sj_device_create),
 *    used from every thread; its slots are thread-safe;
 *  - a call (void *c): one call's state on the caller's stack, made by
 *    call_begin in an sj_dev_call and used by one thread. The executors
 *    (jit/exec.c, jit/exec_fused.c) pass it to the eager op slots (k),
 *    the memory slots and launch/finish.
 *
 * A table with only the compiling slots filled is a compiler: what
 * sj_cpu_backend_create and sj_cuda_backend_create make (and the backend
 * tests use); sj_device_create wraps one in a whole device.
 */
#ifndef SJ_DEVICE_H
#define SJ_DEVICE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/log.h"
#include "jit/ir/graph.h"
#include "jit/shapejit.h"
#include "kernels/backend.h"

struct sj_fplan;

/* -- Eager kernels ------------------------------------------------------------ */

/* An elementwise group a matrix product runs over its own result as its
 * epilogue (specialize/fusion.h's sj_group.epilogue): fn the generated
 * group's function (specialize/codegen.h's signature) over work items
 * [begin, end), item i * N + j being element (i, j) of the product's
 * contiguous M x N result; p its base pointers (loads, then stores); s the
 * symbol values. */
typedef struct sj_dev_epilogue {
    void (*fn)(void *const *p, const int64_t *s, int64_t begin, int64_t end);
    void *const *p;
    const int64_t *s;
} sj_dev_epilogue;

/* A device's eager kernels, one per op kind, with the contract of
 * kernels/cpu/eager.h (c: the call's context). */
typedef struct sj_kernels {
    sj_status (*unary)(void *c, sj_op op, const sj_tensor *x, const sj_tensor *y);
    sj_status (*binary)(void *c, sj_op op, const sj_tensor *a, const sj_tensor *b, const sj_tensor *y);
    sj_status (*where)(void *c, const sj_tensor *cond, const sj_tensor *a, const sj_tensor *b, const sj_tensor *y);
    /* y = x (strided, converting dtype) */
    sj_status (*copy)(void *c, const sj_tensor *x, const sj_tensor *y);
    sj_status (*reduce)(void *c, sj_op op, const sj_tensor *x, int axis, const sj_tensor *y);
    sj_status (*softmax)(void *c, const sj_tensor *x, int axis, const sj_tensor *y);
    sj_status (*layer_norm)(void *c, const sj_tensor *x, const sj_tensor *g, const sj_tensor *b, double eps,
                            const sj_tensor *y);
    sj_status (*rms_norm)(void *c, const sj_tensor *x, const sj_tensor *g, double eps, const sj_tensor *y);
    /* bias: NULL, or a rank-1 tensor of y's last size added to every row */
    sj_status (*matmul)(void *c, const sj_tensor *a, const sj_tensor *b, const sj_tensor *bias, const sj_tensor *y);
    /* mask: NULL, or f32 / q's dtype / bool already broadcast to [B, H, Sq, Sk] */
    sj_status (*attention)(void *c, const sj_tensor *q, const sj_tensor *k, const sj_tensor *v,
                           const sj_tensor *lengths, const sj_tensor *mask, double scale, int causal,
                           const sj_tensor *y);
    sj_status (*concat)(void *c, const sj_tensor *xs, int n, int axis, const sj_tensor *y);
    sj_status (*gather)(void *c, const sj_tensor *table, const sj_tensor *idx, const sj_tensor *y);
    /* y[i] = i (rank 1, any stride), converted to y's dtype */
    sj_status (*arange)(void *c, const sj_tensor *y);
    /* Optional (NULL: matmul is used): matmul with b's packed copy (the
     * graph's packed slot of the node, made by the device's pack step). */
    sj_status (*matmul_packed)(void *c, const sj_tensor *a, const sj_tensor *b, const void *packed,
                               const sj_tensor *bias, const sj_tensor *y);
    /* q, k [T, H, D], v [T, H, Dv], offsets i32 [B+1] (checked by the
     * kernel: SJ_EINDEX, or on a device its error flag), y [T, H, Dv] */
    sj_status (*attention_varlen)(void *c, const sj_tensor *q, const sj_tensor *k, const sj_tensor *v,
                                  const sj_tensor *offsets, double scale, int causal, const sj_tensor *y);
    /* Optional (NULL: a product's epilogue group runs after it): matmul
     * (with b's packed copy when packed is not NULL) running epi inside
     * the product, over blocks of its result as they are finished, every
     * item exactly once. *fused 0: the product ran without it (it could
     * not take it: separate batches, a result through scratch), and the
     * caller runs the group. */
    sj_status (*matmul_epi)(void *c, const sj_tensor *a, const sj_tensor *b, const void *packed,
                            const sj_tensor *bias, const sj_tensor *y, const sj_dev_epilogue *epi, int *fused);
} sj_kernels;

/* A generated product's launch (specialize/fusion.h's "Generated
 * products"; specialize/codegen_gemm_cuda.h's kernel): fn its compiled
 * function, tile its sj_gemm_cuda_tiles() index, flags the group's
 * gemm_epi; C[M, N] = epilogue(A[M, K] @ B[K, N]), every pointer device
 * memory (bias and r NULL when absent), A and B 16-byte aligned, bias, r
 * and c aligned to two of their elements. */
typedef struct sj_dev_gemm {
    void *fn;
    int tile;
    uint32_t flags;
    int64_t M, N, K;
    const void *a, *b, *bias, *r;
    void *c;
    sj_dtype bias_dtype, r_dtype, c_dtype;
    /* flags SJ_GEMM_LN: y[M, N] = layer_norm(c's rows, ln_g, ln_b, ln_eps)
     * as well (ln_g, ln_b NULL when absent), the row blocks' counters at
     * cnt: sj_gemm_ln_counters(M) of them, zero before the launch (the
     * kernel leaves them zero), used by no other launch meanwhile */
    const void *ln_g, *ln_b;
    void *ln_y;
    unsigned *cnt;
    sj_dtype ln_g_dtype, ln_b_dtype, ln_y_dtype;
    double ln_eps;
} sj_dev_gemm;

/* A generated group's launch, everything the device needs and nothing of
 * the plan: the engine (jit/exec_fused.c) fills it on its stack from the
 * group, the call's expression values and the launch rule of the code
 * generator the device's code comes from, and the launch slot runs it.
 * The pointers are borrowed for the slot's call. */
typedef struct sj_dev_launch {
    /* The compiled function, the variant already chosen (the CUDA
     * generator's several for a symbolic row group: sj_launch.variant). */
    void *fn;
    /* Its arguments: n_ptrs base pointers (the group's accesses: loads,
     * then stores), n_syms symbol values (every symbol of the graph). */
    void *const *ptrs;
    const int64_t *syms;
    int n_ptrs, n_syms;
    /* The host's (the C generator's functions over work items, specialize/
     * codegen.h): items [0, items), split in chunks of at least min_chunk
     * items (about 32k elements each), item_elems elements an item (a row
     * group's row length, else 1: the work a thread must be given,
     * exec_min_work); 0 on a device with a grid. */
    int64_t items, min_chunk, item_elems;
    /* A device with a grid (the CUDA generator's rule, specialize/
     * codegen_cuda.h's sj_cuda_launch): grid and block dimensions, dynamic
     * shared memory bytes; 0 on the host. */
    unsigned grid[3], block[3], smem;
} sj_dev_launch;

/* -- A call's context ------------------------------------------------------------ */

/* Room for one call's context on the caller's stack (the device's own
 * struct; kernels/cuda checks that its own fits). */
typedef union sj_dev_call {
    long double align_;
    void *p_;
    unsigned char bytes[256];
} sj_dev_call;

/* What a device is made from: the runtime's configuration, picked. */
typedef struct sj_dev_config {
    int cuda_device;            /* CUDA: the device ordinal */
    bool cuda_tf32;             /* CUDA: f32 products in TF32 (cuda_tf32) */
    bool cuda_pdl;              /* CUDA: programmatic dependent launch where the device has it (cuda_pdl) */
    const char *cc, *cflags, *cc_version; /* CPU: the compiler (kernels/cpu/backend_cpu.h) */
    const char *nvrtc_flags;    /* CUDA: extra NVRTC options */
    const char *dump_dir;       /* NULL: no dumps */
    sj_cache *cache;            /* NULL: none (borrowed) */
    sj_remote *remote;          /* NULL: none (borrowed) */
    const sj_log_sink *log;
    const sj_allocator *host;   /* host memory for conversion buffers (borrowed) */
    int test_delay_ms, test_fail;
    int timeout_ms;             /* compile_timeout_ms */
    bool no_probe;              /* CPU: compiles are off, skip the compiler probe */
    int exec_threads;           /* CPU: kernel threads */
    int64_t exec_min_work;      /* CPU: least multiply-adds per kernel thread (sj_threads_set_min_work) */
    int exec_spin_us;           /* CPU: kernel threads' polling before they sleep (sj_threads_set_spin_ns) */
    int blas_threads;           /* CPU: OpenBLAS threads (-1: leave; 0: 1) */
} sj_dev_config;

/* -- The table -------------------------------------------------------------------- */

/* The engine's "post background job" callback (sj_backend.set_post). */
typedef bool (*sj_post_fn)(void *ctx, void (*run)(void *arg), void (*drop)(void *arg), void *arg);

struct sj_backend {
    const char *name; /* "cpu", "cuda" */
    sj_device device; /* where its tensors, intermediates and outputs live */
    /* A unit's code may still run after the call that launched it has
     * returned (kernels queued on a stream, captured graphs): code the
     * engine stops using is kept until its function is destroyed, never
     * freed after a grace period (jit/budget.c). false: the host, where a
     * call's kernels are over when it returns. */
    bool late_launch;
    /* The device's compute units the launch rule of its generated code
     * sizes grids by (CUDA: the multiprocessors; sj_dev_launch); 0: none
     * (the host, whose launches are split over work items). */
    int units;
    /* The device's compute capability, major x 10 + minor (CUDA; 0 on the
     * host): which generated products it can run (split-K clusters from
     * 90; sj_gemm_cuda_candidates). */
    int arch;

    /* -- Compiling (required) --
     * Compile (or load from the cache) and resolve req->symbols. SJ_OK, or
     * SJ_EBACKEND with out->log set (compiler missing, compile error, load
     * failure). Thread-safe. */
    sj_status (*compile)(sj_backend *b, const sj_compile_req *req, sj_compile_result *out);
    /* Unload a module (NULL is a no-op); a shared one when its last user
     * unloads it. */
    void (*unload)(sj_backend *b, sj_module *m);
    /* A line describing the toolchain, for explain and cache keys
     * ("cc: gcc (Debian 12.2.0-14) 12.2.0; -O3 -march=native ..."). */
    const char *(*identity)(sj_backend *b);
    /* Everything below goes with it (no call may be in flight). */
    void (*destroy)(sj_backend *b);
    /* Optional: remake the compiling part from c (test hooks, a reopened
     * cache); c NULL: drop it only (before its cache closes). No function
     * may exist. */
    sj_status (*recompiler)(sj_backend *b, const sj_dev_config *c);
    /* Optional: wait, at most timeout_ms, for compiles abandoned to finish
     * on their own threads (NVRTC: exiting under one crashes). */
    void (*wait_abandoned)(sj_backend *b, int timeout_ms);

    /* -- Memory the user owns (optional: NULL, host memory through the
     *    runtime's allocator; the device has no memory of its own) -- */
    void *(*alloc)(sj_backend *b, size_t bytes); /* NULL with the error set */
    void (*free)(sj_backend *b, void *p);
    /* dst = src, contiguous both, one of them device memory; dtypes may
     * differ; synchronous. */
    sj_status (*tensor_copy)(sj_backend *b, const sj_tensor *dst, const sj_tensor *src);
    /* bytes of device memory at p set to 0 (ordered before later calls). */
    sj_status (*zero)(sj_backend *b, void *p, size_t bytes);
    /* The stream sj_call runs on (sj_runtime_stream); NULL: none. */
    void *(*stream)(sj_backend *b);
    /* Device copies of g's constants and host parameters, freed with g
     * (g->dev_release). NULL: the graph is used from host memory. */
    sj_status (*upload)(sj_backend *b, sj_graph *g);

    /* -- A call (required: call_begin, launch) --
     * Make a call's context in buf: on stream (NULL: the device's own; a
     * synchronous call (sync) there may run on another stream of the
     * device's: "stream take"), waiting for its kernels at finish when
     * sync or wait, for kernels taking n_syms symbol values. Returns the
     * context. */
    void *(*call_begin)(sj_backend *b, sj_dev_call *buf, void *stream, bool sync, bool wait, int n_syms);
    /* Optional: the call is over ("stream put"); with drain, a call that
     * was not synchronous waits for its stream now (its entry's device
     * memory is about to be freed). */
    sj_status (*call_end)(sj_backend *b, void *c, bool drain);
    sj_kernels k; /* the eager op slots */
    /* Optional: memory for a call's intermediates (bytes may be 0); NULL:
     * the host arena block instead (the CPU). */
    void *(*buf_alloc)(void *c, size_t bytes);
    void (*buf_free)(void *c, void *p);
    /* Optional: memory for an output the runtime allocates for the caller
     * (NULL: the host arena). */
    void *(*out_alloc)(void *c, size_t bytes);
    void (*out_free)(void *c, void *p);
    /* Run a generated group as d says (sj_dev_launch: the function, its
     * arguments and the iteration the engine worked out; never an empty
     * one, which the engine skips). */
    sj_status (*launch)(void *c, const sj_dev_launch *d);
    /* Optional (NULL: the eager product, the epilogue group after it):
     * launch a generated product (a plan group's gemm_tile >= 0 and its
     * function compiled). */
    sj_status (*gemm)(void *c, const sj_dev_gemm *d);
    /* Optional (NULL with buf_alloc: a product with a LayerNorm inside runs
     * as the device's, its groups after it): bytes of a call's memory (from
     * buf_alloc) set to 0 in the call's order, before its later kernels. */
    sj_status (*buf_zero)(void *c, void *p, size_t bytes);
    /* Optional (NULL: a generated product runs as its device product): on
     * the compile worker, once a unit is loaded, choose each generated
     * product's variant (fns its functions, SJ_CG_VARIANTS_MAX a group, as
     * sj_compiled's) or -1 for the device's product: pick[gi *
     * SJ_GEMM_CLASSES + class] for plan group gi and each size class of
     * its rows (specialize/codegen_gemm_cuda.h), -1 on entry; syms the
     * specialization's sizes (NULL: the
     * entry's), key the unit's cache key (its choice may be kept beside
     * it). Never fails: what cannot be timed keeps -1 (a product whose
     * variants have no function: a quick unit's). Returns whether it timed
     * anything (false: nothing to time, or the choice came from the
     * cache). */
    bool (*gemm_tune)(sj_backend *b, const sj_graph *g, const struct sj_fplan *p, const int64_t *syms,
                      void *const *fns, const char *key, int8_t *pick);
    /* Optional: after the last kernel of a call: e.g. wait for the device
     * and report a data-dependent error. */
    sj_status (*finish)(void *c);

    /* -- Graphs: a call's kernels captured and replayed as one launch
     *    (optional, all or none; the policy of when is the engine's,
     *    jit/graphs.c) --
     * Capture what run(arg, cc) queues on cc, a call context made for the
     * capture, into a graph for stream (a call's graph_stream), then
     * instantiate it. The graph owns the call's intermediates; g and plan
     * tell what the call needs (workspace for products). *graph on SJ_OK,
     * and in *bytes the device memory the graph holds until it is freed
     * (CUDA: the allocator's block for its workspace, error flag and
     * intermediates), which the engine counts against graph_max_bytes.
     * run and arg stay valid as long as the graph: a device may run them
     * again to replay it (a test device does). */
    sj_status (*graph_capture)(sj_backend *b, const sj_graph *g, const struct sj_fplan *plan, int n_syms,
                               const void *stream, sj_status (*run)(void *arg, void *cc), void *arg, void **graph,
                               size_t *bytes);
    /* Launch graph on call c's stream (and for a synchronous call wait and
     * report its error flag, as finish does). */
    sj_status (*graph_launch)(void *c, void *graph);
    void (*graph_free)(sj_backend *b, void *graph);
    /* The stream a call's graphs are kept for (a key: graphs are matched by
     * it). */
    const void *(*graph_stream)(void *c);
    /* Graphs that serve a whole bucket (optional, both or none; CUDA's in
     * kernels/cuda/graph_cuda.c): capture as graph_capture, with n_bufs
     * buffers of the graph's own (sizes[i] bytes each: the call's n_in
     * inputs, then its outputs), which the device allocates and writes
     * into bufs[] before run is called, and noting what the call queues so
     * that a replay can change its sizes. direct[i] (n_bufs of them) says
     * whether buffer i may be the caller's own on a replay: only the
     * graph's updatable kernels touch it (a replay then passes the
     * caller's pointer to them, with no copy). copies: how many replays
     * of different sizes the graph may keep ready at once (CUDA: its
     * instantiations, each holding the sizes of the last call it served;
     * at least 1). */
    sj_status (*graph_capture_bucket)(sj_backend *b, const sj_graph *g, const struct sj_fplan *plan, int n_syms,
                                      const void *stream, int n_in, int n_bufs, const size_t *sizes, void **bufs,
                                      int copies, sj_status (*run)(void *arg, void *cc), void *arg, void **graph,
                                      size_t *bytes, unsigned char *direct);
    /* Replay a bucket graph for call c with symbol values syms:
     * update(arg, cc) runs the call again on the graph's buffers at these
     * sizes on a context that updates the graph instead of launching
     * (skipped when a copy of the graph holds these sizes and pointers);
     * src[i] (n_in of them) are copied into the graph's input buffers
     * (CUDA: by the graph's first kernels, updated with the pointers), the
     * graph launched and its output buffers copied to dst[], bytes[]
     * (inputs, then outputs) each, but for the direct ones, which update
     * gave the graph's kernels as they are. *served false, nothing queued, where the graph is
     * busy with another call or this call differs from the captured one in
     * more than its sizes: the call then runs kernel by kernel. */
    sj_status (*graph_replay)(void *c, void *graph, const int64_t *syms, int n_syms, int n_in,
                              const void *const *src, void *const *dst, const size_t *bytes,
                              sj_status (*update)(void *arg, void *cc), void *arg, bool *served);

    /* -- Background (optional) --
     * Wait until the device's own background work for what ran so far is
     * done (CUDA: the cuBLASLt warmer's choices). */
    void (*settle)(sj_backend *b);
    /* The runtime's one background job queue, handed to the device by the
     * engine (jit/runtime.c) once the queue exists, and taken back (post
     * NULL) before it stops: post(ctx, run, drop, arg) queues run(arg) for
     * a background worker, or with compile_threads 0 a thread stepping the
     * queue (no lock held while it runs), or calls drop(arg) instead if the
     * queue stops first; false: not queued (a sync or off compile mode, the
     * kind's job_queue_max, out of memory), and the device does that work
     * its own way. The backend cannot include jit/: this callback is
     * how its background work reaches the engine's queue. NULL slot: the
     * device has no background work to post. */
    void (*set_post)(sj_backend *b, sj_post_fn post, void *ctx);
};

/* Make the runtime's device of this kind (SJ_BACKEND_CPU or
 * SJ_BACKEND_CUDA; kernels/device.c). SJ_EBACKEND for CUDA in a build
 * without it, or with no usable device (the message says why). */
sj_status sj_device_create(sj_backend_kind kind, const sj_dev_config *c, sj_backend **out);
/* Was the library built with CUDA? */
bool sj_device_cuda_built(void);
/* Check cfg.nvrtc_flags as the CUDA device would take them (its NVRTC
 * options: kernels/cuda/nvrtc.c, built with and without the toolkit, so a
 * runtime made for any device rejects the same flags). SJ_EINVAL with a
 * message naming the limit. */
sj_status sj_device_cuda_check_flags(const char *flags);

/* The devices' makers (kernels/cpu/device_cpu.c, kernels/cuda/device_cuda.c
 * or its stub). */
sj_status sj_cpu_device_create(const sj_dev_config *c, sj_backend **out);
sj_status sj_cuda_device_create(const sj_dev_config *c, sj_backend **out);

/* -- For the devices' makers (kernels/device.c) -------------------------------
 * A device made by sj_device_create starts with this: the table, then the
 * compiler its compiling slots forward to (remade by recompiler). */
typedef struct sj_dev_common {
    sj_backend base;
    sj_backend *cc; /* sj_cpu_backend_create's or sj_cuda_backend_create's */
} sj_dev_common;
/* Fill b's compiling slots with forwarders to ((sj_dev_common *)b)->cc. */
void sj_device_forward_compile(sj_backend *b);

/* The CPU's call slots alone (no compiler; the call context is an
 * sj_threads pool or NULL): tests run the executors over it. */
extern const sj_backend sj_cpu_exec_ops;

#endif /* SJ_DEVICE_H */
