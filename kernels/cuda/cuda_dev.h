/* One CUDA device as the runtime uses it: the driver API loaded, the
 * device's primary context retained, the runtime's own stream, a caching
 * allocator for device memory, a cuBLASLt handle with its workspace, and the
 * module of eager kernels built ahead of time (kernels/cuda/eager.cu).
 *
 * Opening it (sj_cuda_open) creates the context, which takes a few hundred
 * milliseconds on a cold GPU: the runtime does it in sj_runtime_create,
 * never on a request.
 *
 * Threads: every function here may be called from any thread; the context
 * is made current on the calling thread by sj_cuda_bind (cheap when it
 * already is). The allocator is protected by a mutex held only for its
 * bookkeeping.
 */
#ifndef SJ_CUDA_DEV_H
#define SJ_CUDA_DEV_H

#include <pthread.h>
#include <stdbool.h>

#include "kernels/cuda/cuda_api.h"

typedef struct sj_cuda_block sj_cuda_block; /* the allocator's bookkeeping (cuda_dev.c) */

typedef struct sj_cuda {
    sj_cuda_api api;
    CUdevice dev;
    CUcontext ctx;
    CUstream stream;        /* the runtime's own stream (non-blocking) */
    int ordinal;            /* device index */
    char name[256];
    int cc_major, cc_minor; /* compute capability (9.0 on Hopper) */
    int sm_count;
    int max_smem_optin;     /* bytes of shared memory a block may opt in to */
    size_t l2_bytes, total_mem;
    int driver_version, nvrtc_major, nvrtc_minor;

    cublasLtHandle_t lt;
    size_t lt_workspace_bytes; /* the most workspace a product may take (from the allocator) */
    bool lt_tf32;              /* f32 products in TF32 (cuda_tf32): set once, before the first product */
    /* Our kernels launched with programmatic stream serialization
     * (sj_cuda_launch_kernel): compute capability 9.0 or later, the driver
     * has cuLaunchKernelEx, and cuda_pdl asks for it; set once, before the
     * first launch (sj_cuda_set_pdl). */
    bool pdl;

    CUmodule eager;         /* the ahead-of-time eager kernels (NULL until loaded) */
    void *eager_fns;        /* kernels/cuda/eager_cuda.c's table of CUfunctions */

    /* CUDA graphs (graph_cuda.c): one capture at a time, on a stream
     * of its own (made on first use) */
    pthread_mutex_t capture_lock;
    CUstream capture_stream;
    /* Bucket graphs (statistics, counted off the replays' common path):
     * replays that updated a copy's kernels; copies instantiated and the
     * nanoseconds that took (with their upload) */
    _Atomic uint64_t bg_updates, bg_instantiated, bg_inst_ns;
    _Atomic uint64_t bg_declined; /* replays whose update failed (the call ran kernel by kernel) */
    char bg_why[200];             /* the last one's reason (diagnostics; racy) */

    pthread_mutex_t alloc_lock;
    CUmemoryPool pool;      /* where fresh blocks come from (NULL: cuMemAlloc) */
    sj_cuda_block *cached;  /* free blocks, by size */
    size_t cached_bytes, live_bytes;
    uint64_t allocs, cache_hits;
    uint64_t alloc_ns, alloc_ns_max;       /* time spent getting fresh blocks: total, longest call */
    uint64_t events_created, event_ns_max; /* events made by frees (the pool was empty), longest */

    /* Benchmarks: with count_launches set (before the calls to count),
     * kernels of ours launched (sj_cuda_launch_kernel) and cuBLASLt
     * products run; off, nothing is counted (no shared write per launch). */
    bool count_launches;
    _Atomic uint64_t n_kernels, n_products;
    /* Benchmarks (one thread; bench_cuda's w4kernels): with time_launches
     * set, each kernel of ours and each cuBLASLt product launched outside
     * a capture is bracketed by a pair of the caller's events, tl[tl_n]
     * (f the kernel, NULL for a cuBLASLt product), while tl_n < tl_cap;
     * the caller synchronizes, reads tl[0 .. tl_n) and sets tl_n back to
     * 0. The events serialize the launches (no overlap between kernels):
     * each pair times one kernel alone. */
    bool time_launches;
    int tl_n, tl_cap;
    struct sj_cuda_timed {
        CUfunction f;
        CUevent e0, e1;
    } *tl;
} sj_cuda;

/* The benchmarks' per-launch timing (time_launches): before a launch,
 * true with its slot's first event recorded when it is to be timed; after
 * it, sj_cuda_timed_end records the second. */
bool sj_cuda_timed_begin(sj_cuda *c, CUstream s, CUfunction f);
void sj_cuda_timed_end(sj_cuda *c, CUstream s);

/* Load the API, pick device `ordinal`, retain its primary context, create
 * the stream, the cuBLASLt handle (32 MiB workspace), read the device's
 * properties. SJ_EBACKEND with a message ("no CUDA device: ...", "no CUDA
 * driver: ...") when there is none; nothing stays allocated then. */
sj_status sj_cuda_open(int ordinal, sj_cuda **out);
/* Programmatic dependent launch for our kernels (sj_cuda.pdl) where the
 * device and driver have it and `want`; before the first launch. */
void sj_cuda_set_pdl(sj_cuda *c, bool want);
void sj_cuda_close(sj_cuda *c); /* NULL is a no-op; frees every cached block */

/* Make c's context current on this thread. */
void sj_cuda_bind(sj_cuda *c);

/* A status for a failed driver call, with the driver's error name and
 * string in the message ("<what>: CUDA_ERROR_OUT_OF_MEMORY (out of
 * memory)"). SJ_ENOMEM for out-of-memory, SJ_EBACKEND otherwise. */
sj_status sj_cuda_fail(sj_cuda *c, CUresult r, const char *what);
static inline sj_status sj_cu_check(sj_cuda *c, CUresult r, const char *what) {
    return r == CUDA_SUCCESS ? SJ_OK : sj_cuda_fail(c, r, what);
}
/* Run a driver call once; its status as an sj_status with a message. */
#define SJ_CU(c, call, what) sj_cu_check((c), (call), (what))

/* -- Memory ------------------------------------------------------------------
 * A caching allocator: blocks are rounded up (512 B granules below 1 MiB,
 * 2 MiB above) and kept on free after use. Use is stream-ordered: a block
 * freed on stream s is handed out again for work on s at once, and for any
 * other stream only after the work queued on s before the free has finished
 * (an event recorded at free). On cuMemAlloc failure every cached block is
 * released and the allocation retried once. Fresh blocks come from a
 * memory pool of the device's own, in the stream's order; the events that
 * order reuse from a pool filled at open (SJ_CUDA_EVENTS_AT_OPEN). Warm
 * calls make neither. */
#define SJ_CUDA_EVENTS_AT_OPEN 256
CUdeviceptr sj_cuda_alloc(sj_cuda *c, size_t bytes, CUstream s); /* 0 on failure (message set) */
/* While the calling thread captures stream s into a CUDA graph (s set
 * here; NULL when done), allocations for s fail: the allocator orders
 * reuse by events recorded on real streams, which a graph replayed later
 * would not keep. A capture that needs one is abandoned. */
void sj_cuda_capturing(CUstream s);
void sj_cuda_free(sj_cuda *c, CUdeviceptr p, CUstream s);         /* 0 is a no-op */
/* The bytes the allocator reserves for an allocation of `bytes` (its
 * rounded block; 0: too large). */
size_t sj_cuda_block_bytes(size_t bytes);
void sj_cuda_release_cached(sj_cuda *c);

/* Synchronous copies, for tests and tools. */
sj_status sj_cuda_to_device(sj_cuda *c, CUdeviceptr dst, const void *src, size_t bytes);
sj_status sj_cuda_to_host(sj_cuda *c, void *dst, CUdeviceptr src, size_t bytes);

#endif /* SJ_CUDA_DEV_H */
