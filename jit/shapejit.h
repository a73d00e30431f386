/* shapejit: a JIT for tensor graphs whose shapes change from call to call.
 *
 * The one public header. Everything a program needs is declared here; every
 * other header in the tree is private.
 *
 * Life of a call
 * --------------
 *   sj_runtime_create()        once per process (or per backend/config)
 *   sj_fn_create(model)        once per model function
 *   sj_call(fn, inputs, ...)   per request, from any number of threads
 *
 * sj_call() traces the model function the first time it sees a new input
 * signature (dtype, rank, sizes, strides), records the graph, and executes it.
 * A later call with a signature it has already traced runs the recorded graph
 * without calling the model function again.
 *
 * Ownership, in one paragraph
 * ---------------------------
 * The library never frees memory it did not allocate. Tensors (sj_tensor) are
 * plain descriptors over memory that the caller owns; the library reads
 * inputs and parameters through them and writes outputs through them. The
 * only memory the caller receives from the library is an output tensor that
 * the caller asked the runtime to allocate (data == NULL on entry to
 * sj_call()); it is released with sj_tensor_free(). Handles (sj_runtime,
 * sj_fn) are released with their _destroy function; destroying NULL is a
 * harmless no-op.
 *
 * Errors
 * ------
 * Every fallible function returns an sj_status. SJ_OK is 0; anything else is
 * an error, and sj_last_error() then returns a message for the calling thread
 * that names what was wrong (which input, axis, expected and actual value).
 * Bad input never aborts the process and changes nothing: the runtime and
 * every function stay usable and the next correct call is served normally.
 *
 * Thread safety
 * -------------
 * - sj_call(), sj_fn_stats() and sj_fn_explain() may be called concurrently
 *   from any number of threads on the same sj_fn. On the CUDA backend,
 *   an sj_call() that finds another in flight runs on a stream the runtime
 *   keeps for that (a lane), so concurrent calls' GPU work overlaps; a
 *   call alone runs on the runtime's stream. Either way it first waits
 *   for the work already queued on the runtime's stream. A call that hits
 *   a known shape takes no lock, and what it counts goes to per-thread
 *   shards summed when read, so calls from many threads scale with the
 *   cores (bench_cpu's dispatch workload).
 * - sj_fn_create() may be called concurrently on one runtime.
 * - sj_fn_warmup() may run while calls are served; sj_fn_ready() and
 *   sj_fn_warmup_status() may be called from any thread at any time.
 * - sj_fn_destroy() and sj_runtime_destroy() must not race with any other use
 *   of the handle they destroy (the caller quiesces its own threads first).
 * - Model functions may be called from whichever thread needs a trace; for
 *   one sj_fn at most one trace runs at a time. A model function must not
 *   call sj_call() on the function being traced.
 * - sj_last_error() is thread-local.
 */
#ifndef SHAPEJIT_H
#define SHAPEJIT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SJ_VERSION_MAJOR 0
#define SJ_VERSION_MINOR 1
#define SJ_VERSION_PATCH 0

#if defined(__GNUC__)
#define SJ_API __attribute__((visibility("default")))
#else
#define SJ_API
#endif

/* -- Status codes ------------------------------------------------------- */

/* X(name, value, description) */
#define SJ_STATUS_LIST(X)                                                       \
    X(SJ_OK, 0, "ok")                                                           \
    X(SJ_EINVAL, 1, "invalid argument")                                         \
    X(SJ_EDTYPE, 2, "dtype mismatch")                                           \
    X(SJ_ESHAPE, 3, "shape mismatch")                                           \
    X(SJ_ENOMEM, 4, "out of memory")                                            \
    X(SJ_EINDEX, 5, "index out of range")                                       \
    X(SJ_EMODEL, 6, "model function failed")                                    \
    X(SJ_ECONSTRAINT, 7, "constraint violated")                                 \
    X(SJ_ELIMIT, 8, "recompile limit reached")                                  \
    X(SJ_EBACKEND, 9, "backend unavailable")                                    \
    X(SJ_ETIMEOUT, 10, "timed out")                                             \
    X(SJ_EINTERNAL, 11, "internal error")

typedef enum sj_status {
#define SJ_X(name, value, desc) name = value,
    SJ_STATUS_LIST(SJ_X)
#undef SJ_X
} sj_status;

/* Short name of a status ("SJ_ESHAPE"); never NULL. */
SJ_API const char *sj_status_name(sj_status s);

/* The message of the last error returned to this thread by any sj_ function.
 * Valid until the thread's next call into the library; never NULL (empty
 * string when there was no error). Thread-safe. */
SJ_API const char *sj_last_error(void);

/* -- Tensors ------------------------------------------------------------- */

#define SJ_MAX_RANK 8

/* X(name, enum suffix, bytes) */
#define SJ_DTYPE_LIST(X)                                                        \
    X(f32, SJ_F32, 4)                                                           \
    X(f16, SJ_F16, 2)                                                           \
    X(bf16, SJ_BF16, 2)                                                         \
    X(i32, SJ_I32, 4)                                                           \
    X(i64, SJ_I64, 8)                                                           \
    X(bool, SJ_BOOL, 1)

typedef enum sj_dtype {
#define SJ_X(name, e, bytes) e,
    SJ_DTYPE_LIST(SJ_X)
#undef SJ_X
    SJ_DTYPE_COUNT
} sj_dtype;

/* Where a tensor's data lives. */
typedef enum sj_device { SJ_HOST = 0, SJ_CUDA = 1 } sj_device;

/* The most elements a tensor may have, and the most its sizes may multiply
 * to with a size of 0 counted as 1 (its span), so that an empty tensor's
 * contiguous strides do not overflow. */
#define SJ_MAX_SPAN (INT64_C(1) << 48)

/* A tensor descriptor over memory the caller owns (except outputs the runtime
 * allocated; see sj_call). Strides are in elements, not bytes, may be 0 (a
 * broadcast input) and must be >= 0. Sizes must be >= 0 and multiply to at
 * most SJ_MAX_SPAN (2^48), a size of 0 counting as 1, and a non-empty
 * tensor's largest element offset, the sum of (size - 1) * stride over its
 * axes, must be below SJ_MAX_SPAN too (sj_call: SJ_EINVAL otherwise); every result a model computes is held to the same limit
 * (SJ_ESHAPE, naming the op). bool is one byte per element, 0 or 1.
 * f16 is IEEE binary16; bf16 is the upper half of an IEEE binary32. */
typedef struct sj_tensor {
    void *data;
    sj_dtype dtype;
    int32_t rank;                 /* 0 .. SJ_MAX_RANK */
    sj_device device;
    int64_t shape[SJ_MAX_RANK];   /* entries at and past rank are ignored */
    int64_t stride[SJ_MAX_RANK];  /* in elements */
} sj_tensor;

/* Bytes per element of a dtype (0 for an invalid dtype). */
SJ_API size_t sj_dtype_size(sj_dtype dt);
/* "f32", "f16", ...; "?" for an invalid dtype. */
SJ_API const char *sj_dtype_name(sj_dtype dt);

/* A contiguous (row-major) host descriptor over data. shape may be NULL when
 * rank is 0. Does not allocate. Returns a descriptor with rank -1 if rank is
 * out of range or shape is NULL with rank > 0 (sj_call rejects it). */
SJ_API sj_tensor sj_tensor_make(void *data, sj_dtype dt, int rank, const int64_t *shape);

/* Number of elements (product of the sizes; 1 for rank 0). */
SJ_API int64_t sj_tensor_numel(const sj_tensor *t);

/* -- Runtime ------------------------------------------------------------ */

typedef struct sj_runtime sj_runtime;

typedef enum sj_backend_kind {
    SJ_BACKEND_AUTO = 0, /* CUDA when a device is present, else CPU */
    SJ_BACKEND_CPU = 1,
    SJ_BACKEND_CUDA = 2,
} sj_backend_kind;

/* Log topics: a bitmask. SHAPEJIT_LOG takes their names, comma separated:
 * warn,recompiles,guards,compile,fusion,perf,trace; "all" and "none" too. */
#define SJ_LOG_TOPIC_LIST(X)                                                    \
    X(SJ_LOG_WARN, 1u << 0, "warn")                                             \
    X(SJ_LOG_RECOMPILES, 1u << 1, "recompiles")                                 \
    X(SJ_LOG_GUARDS, 1u << 2, "guards")                                         \
    X(SJ_LOG_COMPILE, 1u << 3, "compile")                                       \
    X(SJ_LOG_FUSION, 1u << 4, "fusion")                                         \
    X(SJ_LOG_PERF, 1u << 5, "perf")                                             \
    X(SJ_LOG_TRACE, 1u << 6, "trace")

enum {
#define SJ_X(name, bit, str) name = bit,
    SJ_LOG_TOPIC_LIST(SJ_X)
#undef SJ_X
    SJ_LOG_ALL = (1u << 7) - 1
};

/* A log sink. Called with one complete line (no trailing newline) for each
 * message whose topic is enabled in the runtime's log_mask. May be called
 * from any thread that uses the runtime, including compile workers, and
 * concurrently: the callback must be thread-safe. It must not call back into
 * the library. msg is valid only during the call. */
typedef void (*sj_log_fn)(void *user, unsigned topic, const char *msg);

/* Structured events: what the runtime does in the background, for a server
 * that consumes them as data (metrics, traces) instead of parsing log
 * lines. Set cfg.event_fn: every event below is sent to it, whatever
 * log_mask says; the text lines are unchanged, and sent to log_fn (or
 * stderr) as before. X(name, text): sj_event_name gives the text. */
#define SJ_EVENT_LIST(X)                                                                         \
    X(SJ_EVENT_COMPILE_STARTED, "compile_started")         /* a compile began (a job taken) */  \
    X(SJ_EVENT_COMPILE_FINISHED, "compile_finished")       /* its kernels are ready */          \
    X(SJ_EVENT_COMPILE_FAILED, "compile_failed")           /* it failed; retried after a wait */ \
    X(SJ_EVENT_COMPILE_DROPPED, "compile_dropped")         /* a queued compile dropped */       \
    X(SJ_EVENT_COMPILE_BLACKLISTED, "compile_blacklisted") /* a target given up for good */     \
    X(SJ_EVENT_VALIDATION_REJECTED, "validation_rejected") /* new kernels differ from eager */  \
    X(SJ_EVENT_DEMOTED, "specialization_demoted")          /* the memory budget demoted a shape */ \
    X(SJ_EVENT_RECOMPILE, "recompile")                     /* guards failed: a new trace */     \
    X(SJ_EVENT_GRAPH_CAPTURED, "graph_captured")           /* a CUDA graph was captured */ \
    X(SJ_EVENT_BUCKETS_LEARNED, "buckets_learned")         /* learned edges swapped in (learn_every) */ \
    X(SJ_EVENT_GRAPH_FAILED, "graph_capture_failed")       /* a capture failed; retried after a wait */ \
    X(SJ_EVENT_GRAPH_EVICTED, "graph_evicted")             /* graph_max_bytes evicted a graph */

typedef enum sj_event_kind {
#define SJ_X(name, text) name,
    SJ_EVENT_LIST(SJ_X)
#undef SJ_X
    SJ_EVENT_COUNT
} sj_event_kind;

/* One event. Strings are valid only during the callback; fields that do
 * not apply to a kind are -1 (entry), "" or 0.
 *   COMPILE_*: entry and, for one exact shape's specialization, shape.
 *     FINISHED: duration_ms (the compiler's time, 0 from the cache), bytes
 *     (the unit's code, and a shape's arena). FAILED: error, count
 *     (failures so far), retry_ms (the wait before a call may queue it
 *     again; -1: none, it is blacklisted, and BLACKLISTED follows).
 *     BLACKLISTED: error, count (also a shape's specialization larger than
 *     the whole specialize_max_bytes: not kept). DROPPED:
 *     error says why (no calls while queued; its function destroyed).
 *   VALIDATION_REJECTED: entry, shape, error (the largest difference).
 *   DEMOTED: entry, shape, bytes (freed), count (its demotions so far),
 *     duration_ms (how long it had gone uncalled).
 *   RECOMPILE: entry (the new one), shape (the call's input sizes), error
 *     (the guards that failed, entry by entry), count (entries with it;
 *     past the recompile limit the new entry may serve the call and not
 *     be kept).
 *   GRAPH_CAPTURED: entry, shape, duration_ms (the capture's time),
 *     count (the shape's graphs now), bytes (the graph's memory).
 *   GRAPH_FAILED: entry, shape, error, count (the shape's failed captures
 *     so far), retry_ms (the wait before its calls may ask again; -1:
 *     blacklisted, never captured again).
 *   GRAPH_EVICTED: entry, shape, bytes (freed), duration_ms (how long it
 *     had gone unreplayed).
 *   BUCKETS_LEARNED (the automatic learning of cfg.learn_every or
 *     sj_fn_learn_auto, on the background worker): input, axis, edges and
 *     n_edges (the new edges, as sj_bucket_report's), shape (the report's
 *     line, sj_bucket_report_str), count (entries the swap retired),
 *     duration_ms (the learning's time).
 * time_ns is the runtime's clock (cfg.clock_ns when set). */
typedef struct sj_event {
    sj_event_kind kind;
    unsigned topic;       /* the log topic of the kind's text line (SJ_LOG_*) */
    const char *fn;       /* the function's name */
    int entry;            /* its entry id, -1 if none */
    const char *shape;    /* "s0=12, s1=64" (a shape's symbol values) or "[4, 32], [4]" (input sizes); "" */
    const char *error;    /* why, "" if none */
    double duration_ms;
    int64_t bytes;
    int count;
    int64_t retry_ms;
    int64_t time_ns;
    /* BUCKETS_LEARNED only (0 and NULL otherwise): the dimension and its
     * new edges, buckets (0, e0], (e0, e1], ..., (e[n-1], inf). */
    int input, axis;
    const int64_t *edges;
    int n_edges;
} sj_event;

/* Called once per event, from any thread that uses the runtime (compile
 * workers, which also capture graphs, callers), possibly with the runtime's internal
 * locks held and concurrently: it must be thread-safe, quick, and must not
 * call back into the library. */
typedef void (*sj_event_fn)(void *user, const sj_event *ev);

/* "compile_started", ...; "?" for an invalid kind. */
SJ_API const char *sj_event_name(sj_event_kind k);

/* Host memory hooks for memory the runtime allocates (output tensors the
 * caller asked for, execution arenas). alloc returns memory aligned to at
 * least `align` bytes (a power of two, at most 4096) or NULL. */
typedef struct sj_allocator {
    void *(*alloc)(void *user, size_t bytes, size_t align);
    void (*free)(void *user, void *ptr);
    void *user;
} sj_allocator;

/* When fused kernels are compiled (SHAPEJIT_COMPILE=async|sync|off). */
typedef enum sj_compile_mode {
    SJ_COMPILE_ASYNC = 0, /* on background workers; calls run eagerly until ready */
    SJ_COMPILE_SYNC = 1,  /* on the calling thread, before the call runs (tests, warm-up) */
    SJ_COMPILE_OFF = 2,   /* never: eager execution only */
} sj_compile_mode;

/* Runtime configuration. Fill it with sj_runtime_config_init() (built-in
 * defaults, then the SHAPEJIT_* environment variables applied on top), then
 * change what the program wants to set itself.
 *
 * Environment (read once, by sj_runtime_config_init):
 *   SHAPEJIT_BACKEND=auto|cpu|cuda      -> backend
 *   SHAPEJIT_LOG=topic,topic,...|all|none -> log_mask (default "warn")
 *   SHAPEJIT_RECOMPILE_LIMIT=n          -> recompile_limit
 *   SHAPEJIT_BUCKETS=spec;spec;...      -> buckets (syntax below)
 *   SHAPEJIT_COMPILE=async|sync|off     -> compile_mode
 *   SHAPEJIT_COMPILE_THREADS=n          -> compile_threads
 *   SHAPEJIT_THREADS=n                  -> exec_threads
 *   SHAPEJIT_EXEC_MIN_WORK=n            -> exec_min_work
 *   SHAPEJIT_EXEC_SPIN_US=n             -> exec_spin_us
 *   SHAPEJIT_BLAS_THREADS=n             -> blas_threads
 *   SHAPEJIT_CACHE_DIR=path             -> cache_dir ("" for no cache)
 *   SHAPEJIT_CACHE_KEY=secret           -> cache_key
 *   SHAPEJIT_CC=cmd, SHAPEJIT_CFLAGS=.. -> cc ("ccache cc": split on blanks, no shell), cflags
 *   SHAPEJIT_CC_VERSION=line            -> cc_version
 *   SHAPEJIT_DUMP=dir                   -> dump_dir
 *   SHAPEJIT_CUDA_DEVICE=n              -> cuda_device
 *   SHAPEJIT_NVRTC_FLAGS=..             -> nvrtc_flags
 *   SHAPEJIT_STREAM_MIN_BYTES=n         -> stream_min_bytes
 *   SHAPEJIT_COMPILE_TIMEOUT_MS=n       -> compile_timeout_ms
 *   SHAPEJIT_COMPILE_RETRY_MS=n, SHAPEJIT_COMPILE_MAX_FAILURES=n -> those fields
 *   SHAPEJIT_VALIDATE_CALLS=n, SHAPEJIT_VALIDATE_EVERY=n -> those fields
 *   SHAPEJIT_REMOTE_CACHE_URL=url       -> remote_cache_url
 *   SHAPEJIT_REMOTE_CACHE_TIMEOUT_MS=n  -> remote_cache_timeout_ms
 *   SHAPEJIT_PREPACK_MAX_BYTES=n        -> prepack_max_bytes
 *   SHAPEJIT_WARMUP_MAX_SHAPES=n        -> warmup_max_shapes
 *   SHAPEJIT_FUSE_EPILOGUE=0|1          -> fuse_epilogue
 *   SHAPEJIT_SPECIALIZE_MAX_BYTES=n     -> specialize_max_bytes
 *   SHAPEJIT_COMPILE_AHEAD=0|1          -> compile_ahead
 *   SHAPEJIT_CUDA_GEMM=0..5             -> cuda_gemm
 *   SHAPEJIT_CUDA_GEMM_LN=0|1           -> cuda_gemm_ln
 *   SHAPEJIT_CUDA_TF32=0|1              -> cuda_tf32
 *   SHAPEJIT_CUDA_PDL=0|1               -> cuda_pdl
 *   SHAPEJIT_LEARN_EVERY=n              -> learn_every
 *   SHAPEJIT_LEARN_HALF_LIFE=n          -> learn_half_life
 *   SHAPEJIT_GRAPH_MAX_BYTES=n          -> graph_max_bytes
 *   SHAPEJIT_BUCKET_GRAPHS=0|1          -> bucket_graphs
 *   SHAPEJIT_BUCKET_GRAPH_EXECS=n       -> bucket_graph_execs
 *   SHAPEJIT_COMPILE_QUICK=0|1          -> compile_quick
 *   SHAPEJIT_JOB_QUEUE_MAX=n            -> job_queue_max
 *   SHAPEJIT_JOB_RESERVE_WORKERS=n      -> job_reserve_workers
 *   SHAPEJIT_TOTAL_RECOMPILE_LIMIT, SHAPEJIT_HOT_THRESHOLD,
 *   SHAPEJIT_SPECIALIZE_THRESHOLD, SHAPEJIT_SPECIALIZE_BUDGET,
 *   SHAPEJIT_CUDA_GRAPHS, SHAPEJIT_CACHE_MAX_BYTES -> the fields of those names
 * Every numeric field has one default and one range (README's environment
 * table); sj_runtime_create returns SJ_EINVAL naming a field out of its
 * range. An unparsable or out-of-range value in the environment is
 * reported once on stderr and ignored. */
typedef struct sj_runtime_config {
    sj_backend_kind backend; /* default SJ_BACKEND_AUTO */
    unsigned log_mask;       /* default SJ_LOG_WARN */
    sj_log_fn log_fn;        /* default NULL: lines go to stderr as "shapejit[topic]: ..." */
    void *log_user;          /* passed to log_fn */
    sj_event_fn event_fn;    /* default NULL: no structured events (see sj_event) */
    void *event_user;        /* passed to event_fn */
    sj_allocator allocator;  /* default: aligned_alloc/free */
    /* Defaults for every function's options (sj_fn_options; 1 .. 1e6). */
    int recompile_limit;       /* entries per function; default 8 */
    int total_recompile_limit; /* entries per runtime, all functions; default 256 */
    int hot_threshold;         /* default 2 */
    int specialize_threshold;  /* default 16 */
    int specialize_budget;     /* default 4 */
    /* Bucket specs applied to functions by name at sj_fn_create (copied);
     * NULL for none. Syntax, entries separated by ';':
     *   NAME:INPUT:AXIS=list:B0,B1,...     sj_set_buckets
     *   NAME:INPUT:AXIS=pow2:LO,HI         sj_set_buckets_pow2
     *   NAME:INPUT:AXIS=mult:N             sj_set_buckets_multiple
     *   NAME:INPUT:AXIS=profile:MIN,OPT,MAX  sj_set_profile
     * NAME may be '*' for every function. Example:
     *   encoder:0:1=pow2:16,512;*:0:0=list:1,8 */
    const char *buckets;
    /* Fused kernels (the CPU backend compiles generated C with the system
     * compiler and loads it with dlopen). */
    sj_compile_mode compile_mode; /* default SJ_COMPILE_ASYNC */
    int compile_threads;          /* background compile workers; default 1 */
    int exec_threads;             /* kernel threads (fused kernels, matrix products, attention); 0 (default): online CPUs */
    /* The least work a CPU kernel gives each kernel thread taking part, in
     * multiply-adds (an element of a fused kernel counts 16); default 2^18.
     * A kernel runs on only as many threads as get this much each; one with
     * less than twice this runs on the calling thread, with no hand-off.
     * Small products (a single sentence's few rows) and tiny attention stay
     * on one or a few threads, where waking many costs more than it saves;
     * raise it where hand-offs are dear (many cores, several sockets). */
    int64_t exec_min_work;
    /* How long, in microseconds, a kernel thread keeps polling for the next
     * kernel after one ends before it sleeps (and a calling thread for its
     * kernel's last chunk); default 1000, 0: sleep at once. A sleeping
     * thread costs a wake-up when the next kernel comes: a few microseconds
     * on bare metal, 30-75 of them on a virtual machine of 16 cores, where
     * 50 cost a single-sentence request on 16 threads 15% of its speed.
     * Lower it where the cores are shared with other work: each kernel
     * thread burns its core this long after a request's last kernel.
     * $SHAPEJIT_EXEC_SPIN_US. */
    int exec_spin_us;
    /* Who runs matrix products in parallel on the CPU backend.
     *  0 (default): shapejit, on its exec_threads; the runtime sets OpenBLAS
     *     to one thread of its own (openblas_set_num_threads(1)) when it is
     *     created. One pool of threads for all the kernels, and no spinning
     *     BLAS workers taking cores from the background compiler.
     *  n > 0: OpenBLAS, on n threads (openblas_set_num_threads(n)).
     *  -1: OpenBLAS as the program has set it up.
     * OpenBLAS's thread count is process-wide: the runtime created last sets
     * it, and shapejit splits products only while it is 1, whoever set it. */
    int blas_threads;
    const char *cache_dir;        /* persistent kernel cache; NULL or "": none.
                                     Default $SHAPEJIT_CACHE_DIR, else
                                     $XDG_CACHE_HOME/shapejit or ~/.cache/shapejit */
    uint64_t cache_max_bytes;     /* least recently used kernels are evicted past it; default 1 GiB */
    /* A secret that signs the cache's entries (a keyed BLAKE2b digest over
     * each entry's bytes and cache key). NULL or "" (default
     * $SHAPEJIT_CACHE_KEY): a private cache, used only when its directory
     * is owned by the effective user and writable by nobody else (else it
     * is refused with one warning and the runtime compiles without it).
     * With a key, a directory shared between users (group-writable, or
     * another user's) is used too, and an entry without a valid digest
     * under this key is refused, whoever wrote it. Copied. */
    const char *cache_key;
    const char *cc;               /* C compiler command; default "cc". Split on blanks
                                     into a program and its first arguments
                                     ("ccache cc"; no shell, no quoting) */
    const char *cflags;           /* NULL: "-O3 -march=native -fPIC -shared ..." */
    /* The compiler's version as kernel cache keys name it, instead of the
     * first line `cc --version` prints: for a machine without a compiler
     * that serves kernels compiled elsewhere (a bundle, a remote cache) set
     * it to that line of the machine that compiled them (with the same cc,
     * cflags and CPU). A compile still needs a real compiler. NULL or ""
     * (default $SHAPEJIT_CC_VERSION): probed. Copied. */
    const char *cc_version;
    const char *dump_dir;         /* write every generated source there; NULL: no */
    int cuda_device;              /* the GPU the CUDA backend uses; default 0 */
    /* Options added after the CUDA backend's own NVRTC options (see
     * README), separated by spaces: at most 16, 511 characters in all
     * (else SJ_EINVAL). They are part of the kernel cache's key. An option
     * NVRTC rejects fails each compile with NVRTC's message, and the
     * functions keep running eagerly. NULL or "": none. Checked whichever
     * backend the runtime gets; only the CUDA backend uses them. */
    const char *nvrtc_flags;
    /* CUDA graphs: the most kept per runtime (0: none); default 64. A
     * fused call that is the 48th with its exact input shapes, its input
     * and output buffers and its stream (sj_call's, or sj_call_stream's)
     * is captured into a graph by a background worker (a job on the
     * compile queue, taken before compiles; about 1 ms,
     * while calls go on kernel by kernel); later calls with the same
     * shapes, buffers and stream launch the graph (one launch instead of
     * one per kernel). sj_fn_wait_idle waits for captures too. At most 4
     * graphs per shape; a graph holds its own intermediate memory and a
     * 4 MiB cuBLASLt workspace until its function is destroyed or
     * graph_max_bytes evicts it. A capture that fails backs off as a
     * compile does (compile_retry_ms, doubling, then blacklisted after
     * compile_max_failures). Calls
     * whose outputs shapejit allocates and plans that need memory mid-call
     * are never captured. A plan with a gather is: its error flag lives in
     * the graph's memory, and a synchronous call served by the graph still
     * fails with SJ_EINDEX on an index out of range. $SHAPEJIT_CUDA_GRAPHS. */
    int cuda_graphs;
    /* CPU fused kernels whose loads and stores move more bytes than this
     * write their f32 outputs with non-temporal stores (no read for
     * ownership; the output is not left in the caches). 0 (default): a
     * quarter of the last-level cache, which other cores and processes
     * share; negative: never. Only speed depends on it. */
    int64_t stream_min_bytes;
    /* Bound on one run of the compiler (a CPU compile, or the `cc --version`
     * probe at sj_runtime_create, which is skipped when compile_mode is
     * SJ_COMPILE_OFF): past it the compiler is killed with its whole process
     * group (SIGKILL), the compile fails and its entry keeps running
     * eagerly (the failure is recorded; the unit is not compiled again).
     * sj_fn_destroy and sj_runtime_destroy kill a running compile instead of
     * waiting for it. 1 .. 86400000 ms; default 60000.
     * $SHAPEJIT_COMPILE_TIMEOUT_MS. An NVRTC compile (CUDA backend) runs
     * inside the process and cannot be killed: past the timeout, or at
     * destroy, it is abandoned instead (the compile fails, the call or the
     * destroy returns, and NVRTC finishes on a thread of its own, which
     * then frees its work); while 4 abandoned compiles are still running,
     * new NVRTC compiles fail at once. sj_runtime_destroy waits for
     * abandoned NVRTC compiles to end, within this same bound: a process
     * that exits while one runs can crash inside NVRTC (its exit-time
     * destructors), so destroy the runtime before exiting. */
    int compile_timeout_ms;
    /* Back-off from compiles that fail (a compiler error, a timeout, a
     * missing compiler, memory): the unit's entry keeps running eagerly,
     * and after its n-th failure waits compile_retry_ms * 2^(n-1)
     * milliseconds, jittered by +-25%, before a call may queue it again;
     * after compile_max_failures failures it is blacklisted (eager for
     * good). A failure no retry can mend (a plan too big for one unit) is
     * blacklisted at once. sj_fn_explain and sj_entry_info.tier show the
     * state; sj_stats counts failures and blacklisted units.
     * compile_retry_ms: 0 .. 86400000, default 1000 (0: never retried);
     * compile_max_failures: 1 .. 1000, default 4. */
    int compile_retry_ms;
    int compile_max_failures;
    /* The runtime's clock, for tests that drive time (a virtual clock):
     * nanoseconds from any fixed origin, never decreasing. NULL (default):
     * CLOCK_MONOTONIC. It times what the runtime schedules: compile
     * penalties (above) and the drop of queued compiles whose entry (a
     * shape's specialization: whose shape) got no calls for 60 s. Called
     * from calling threads and compile workers, concurrently: it must be
     * thread-safe and must not call back into
     * the library. Timeouts that bound waits (compile_timeout_ms,
     * sj_fn_wait_idle) and the statistics' times stay on the real clock. */
    int64_t (*clock_ns)(void *user);
    void *clock_user;
    /* The validated swap: compiled kernels are checked against eager
     * execution before they serve alone. A newly compiled unit's first
     * validate_calls calls run eagerly (the result the caller gets) and
     * run the new kernels beside it into outputs of their own; the two are
     * compared (largest error relative to the output's largest magnitude:
     * 1e-4 for f32, 1e-2 f16, 6e-2 bf16; integers and bools bit for bit).
     * Equal: after validate_calls such calls the kernels serve alone, and
     * then 1 call in validate_every (per entry and calling thread; 0:
     * never) is checked again the same way. Different: the kernels are
     * never used again (the entry keeps the tier it had: a shape's
     * specialization falls back to the entry's symbolic kernels, else
     * eager), the unit's artifact is quarantined in the kernel cache
     * (renamed <key>.<ext>-rejected), the first such rejection of each
     * function is logged as a warning with the error, and sj_stats counts
     * validations and validation_failures; sj_fn_explain says why. A
     * validation call is synchronous (on CUDA it waits for the stream, even
     * from sj_call_stream) and costs one eager run more.
     * validate_calls: 0 .. 1000000, default 0 (off; the embedding server
     * sets 2); validate_every: 0 .. 1e9, default 0. $SHAPEJIT_VALIDATE_CALLS,
     * $SHAPEJIT_VALIDATE_EVERY. */
    int validate_calls;
    int validate_every;
    /* A remote kernel cache shared by many machines: a Redis server,
     * "redis://[:password@]host[:port][/db]" or "unix:///path/to/socket"
     * (or just the socket path). The second level under cache_dir: a
     * kernel missing there is fetched from Redis, verified (a BLAKE2b
     * digest keyed with cache_key, bound to the kernel's key and kind) and
     * kept in cache_dir; a fresh compile is pushed to it. Needs cache_key:
     * without one the remote cache is refused (one warning; the runtime
     * runs with its disk cache only), because a Redis server cannot say
     * who wrote an entry. A host name is resolved once, at
     * sj_runtime_create. A server that is down, slow or answers garbage
     * costs at most remote_cache_timeout_ms per compile, is logged once
     * (warn), and is then left alone for a back-off (1 s doubling to 60 s).
     * NULL or "" (default $SHAPEJIT_REMOTE_CACHE_URL): none. Copied. Both
     * backends (CPU: shared objects; CUDA: CUBINs for the device's
     * architecture). A malformed URL is SJ_EINVAL. */
    const char *remote_cache_url;
    /* Bound on one remote cache operation: the connect and the command
     * together (a fetch or a push). 1 .. 60000 ms; default 250.
     * $SHAPEJIT_REMOTE_CACHE_TIMEOUT_MS. */
    int remote_cache_timeout_ms;
    /* CPU backend: a matrix product whose right operand is a constant (a
     * parameter, or a permute, slice or reshape of one) has it packed once,
     * when the entry is made, into the layout shapejit's product kernels
     * read (f32; f16/bf16 converted once), instead of OpenBLAS copying it
     * on every call. The packed copies are shared by a function's entries
     * and freed with the function; they add memory beside the caller's
     * weights (which stay in use): as much again for f32 weights, twice
     * their size for f16/bf16. This bounds one function's packed bytes;
     * weights past it run unpacked, and 0 packs nothing (every product
     * through OpenBLAS). Default 1 GiB. $SHAPEJIT_PREPACK_MAX_BYTES. */
    uint64_t prepack_max_bytes;
    /* The most shapes one sj_fn_warmup prepares (explicit and walked
     * together); more is SJ_EINVAL. 1 .. 65536; default 256.
     * $SHAPEJIT_WARMUP_MAX_SHAPES. */
    int warmup_max_shapes;
    /* CPU backend: 1 (default): in a fused plan, the elementwise group that
     * consumes a matrix product's result (bias, GELU, residual add, cast)
     * runs inside the product, over each block of the result as soon as
     * it is finished (still in cache), instead of a second pass over the
     * whole result; 0: after it. Results are the same either way.
     * $SHAPEJIT_FUSE_EPILOGUE. */
    int fuse_epilogue;
    /* The memory budget of specializations: the bytes one function's
     * specialized shapes (exact shapes of a symbolic entry that got kernels
     * of their own, specialize_threshold) may hold: each its loaded code
     * (the unit's size) and its fused plan's arena at its sizes. A new
     * specialization that would pass it demotes the least recently called
     * ones first: their kernels are unpublished, freed once no call can
     * still be running them, and their shapes go back to the entry's
     * symbolic kernels, with results unchanged. A demoted shape that is
     * called specialize_threshold times again may be specialized again,
     * after a wait that doubles with each of its demotions
     * (compile_retry_ms * 2^(n-1), +-25%). A unit larger than the whole
     * budget is not kept (its shape stays symbolic). Each demotion is
     * logged (compile topic) and sent as an SJ_EVENT_DEMOTED event;
     * sj_stats counts specializations_demoted and specialized_bytes;
     * sj_fn_explain and sj_entry_info show them. With a budget, calls of
     * specialized shapes read the runtime's clock (a last-use stamp, kept
     * at millisecond grain) and mark themselves in a per-thread counter.
     * CUDA backend: a demoted unit's module stays loaded until its function
     * is destroyed (queued stream work and CUDA graphs may still launch
     * it), and CUDA graphs' memory is not counted; shapes with a captured
     * graph are not demoted. 0 (default): no limit.
     * $SHAPEJIT_SPECIALIZE_MAX_BYTES. */
    uint64_t specialize_max_bytes;
    /* Neighbouring buckets compiled ahead: when an entry of a bucketed
     * dimension gets hot (hot_threshold calls), the call that made it hot
     * also traces the next bucket up (the call's inputs with that size, and
     * every size equal to it, set to the next bucket's upper edge; the
     * model function runs on that call's thread, as for any new shape)
     * and queues its compile, which the value-ordered queue takes after
     * the jobs that have calls. A first call of that bucket then finds its
     * kernels ready. The trace is a retrace like a call's (logged, counted,
     * within the recompile limit: none past it); a model that rejects the
     * size only counts a trace error. Async compiles only. 0 (default):
     * off; 1: on. $SHAPEJIT_COMPILE_AHEAD. */
    int compile_ahead;
    /* CUDA backend: 1: in a fused plan, an f16 matrix product whose first
     * operand is contiguous and whose second is a constant [K, N] weight
     * (N and K multiples of a tile's) becomes a generated tensor-core
     * kernel (mma.sync) in up to 4 tile variants, with the elementwise
     * group that consumes its result (bias, GELU or ReLU, residual add,
     * cast) inside it; once compiled, the variants are timed against
     * cuBLASLt and the fastest runs (kept in the kernel cache). 2 .. 5:
     * variant 0 .. 3 always, untimed (tests). 0 (default): cuBLASLt, the
     * group after it. $SHAPEJIT_CUDA_GEMM. Opt-in: correct on an H100
     * (test_gemm_jit); the encoder layer 6-7% faster at 16 tokens, the
     * same from 64 on, for about 3x the compile time of a unit and 30-270
     * ms of timing per unit (sj_stats.tune_ms; README); a runtime made
     * with it says so (SJ_LOG_PERF). A symbolic entry picks a variant per
     * size class of rows (sj_gemm_class). A quick unit (compile_quick)
     * runs cuBLASLt's products until its full unit replaces it. */
    int cuda_gemm;
    /* CUDA, with cuda_gemm: 1: a generated product whose result the next
     * row group ([a residual add,] a LayerNorm over the product's N)
     * alone reads takes that group inside its kernel: the last block of
     * each row block (a counter in the call's memory) normalizes the
     * block's rows (specialize/codegen_gemm_cuda.h). The tuner times it
     * against cuBLASLt plus a pass. Off (0, default): on an H100 the
     * encoder layer's two such products took 12-13 us each at 16 tokens,
     * more than cuBLASLt's product and the row kernel, which a CUDA graph
     * overlaps (README). $SHAPEJIT_CUDA_GEMM_LN. */
    int cuda_gemm_ln;
    /* CUDA: 1: f32 matrix products (cuBLASLt) take the tensor cores in
     * TF32: inputs rounded to a 10-bit mantissa, sums in f32, so results
     * are about 1e-3 relative from f32's instead of 1e-6, for 3-5x the
     * speed of a large product (PyTorch's allow_tf32). 0 (default): full
     * f32. f16 and bf16 products are unaffected. $SHAPEJIT_CUDA_TF32. */
    int cuda_tf32;
    /* CUDA, compute capability 9.0 and later: 1 (default): shapejit's own
     * kernels are launched with programmatic dependent launch (Hopper's
     * programmatic stream serialization), so each one's blocks are
     * scheduled while the kernel before it finishes and wait for its
     * results on the device: the launch gap between two kernels of a
     * call, or of a CUDA graph, shrinks. Results are the same. 0: every
     * kernel starts after the one before it has ended. $SHAPEJIT_CUDA_PDL. */
    int cuda_pdl;
    /* Buckets learned while serving: n > 0: every function re-learns the
     * edges of each of its bucketed dimensions (a bucket rule: sj_set_buckets
     * and its kin, SHAPEJIT_BUCKETS, or edges learned before) after every n
     * new exact shapes it has served, as sj_fn_learn_buckets with default
     * options and apply set would, on the background compile worker (see
     * sj_fn_learn_auto). 0 (default): off. $SHAPEJIT_LEARN_EVERY. */
    int learn_every;
    /* The size histogram of buckets learned from traffic forgets: a call's
     * weight in it halves after every n later calls of the function (an
     * exponential window over calls, brought up to date by each learning),
     * so edges follow a shift of traffic; a size whose weight falls under
     * half a call leaves the histogram. With learning while serving on, a
     * learning also comes due after every n calls (new shapes alone would
     * stop queueing them once the new traffic's shapes are all seen).
     * Default 65536 (a window of about 94,000 calls); 0: no decay, every
     * call since the function was made counts alike. sj_learn_options
     * .half_life overrides it per learning. $SHAPEJIT_LEARN_HALF_LIFE. */
    int learn_half_life;
    /* The memory budget of CUDA graphs: the bytes one function's captured
     * graphs may hold (each its own device memory: the cuBLASLt workspace,
     * the error flag and the call's intermediates, as the device's
     * allocator reserved them). A new graph that would pass it evicts the
     * least recently replayed graphs of the function first (freed once no
     * call can still be launching them; their shapes' calls run kernel by
     * kernel and count towards a capture again); a graph that cannot fit
     * (alone larger than the budget, or the rest not evictable: graphs
     * kept for a caller's stream through sj_call_stream are not) is not
     * kept, and its capture backs off as a failed one does. sj_stats
     * counts graph_bytes, graph_evictions and graphs_over_budget. With a
     * budget, calls served by a graph stamp its last use (the runtime's
     * clock at millisecond grain) and fused calls mark themselves in a
     * per-thread counter. 0 (default): no byte limit (cuda_graphs still
     * caps their count). $SHAPEJIT_GRAPH_MAX_BYTES. */
    uint64_t graph_max_bytes;
    /* CUDA graphs that serve a whole bucket: an entry whose every size is
     * bounded (a bucket, sj_set_profile, learned edges; not the open
     * bucket past the last edge) is captured once at its largest sizes,
     * on input and output buffers of the graph's own, after
     * SJ_GRAPH_AFTER (48) of its calls ran kernel by kernel, or at once
     * when sj_fn_warmup prepares one of its shapes. A call of any size of
     * the bucket then runs as one graph launch: the graph's kernels get the
     * call's sizes (cuGraphExecKernelNodeSetParams; skipped when one of its
     * copies already holds them: bucket_graph_execs), its cuBLASLt products run over the bucket's
     * largest row count (the extra rows are never read), the inputs are
     * copied in and the outputs out (but those only the graph's own kernels
     * touch, which get the caller's buffers). Served: synchronous calls (sj_call)
     * with contiguous inputs and given outputs, one at a time per graph (a
     * call that finds it busy runs kernel by kernel); a graph for the
     * call's exact shape comes first. A plan whose values sit at offsets
     * that depend on a size, or a call whose products differ from the
     * captured ones in more than their rows, runs kernel by kernel. Bucket
     * graphs count in graph_bytes and cuda_graphs and are kept until the
     * function is destroyed (graph_max_bytes never evicts them). None for
     * a bucket whose graph would hold more than 256 MiB (or
     * graph_max_bytes, where set); in a bucket whose largest inputs pass
     * 1 MiB, a call with under a quarter of those bytes runs kernel by
     * kernel; a graph whose calls mostly differ from the captured one
     * (after 16 such calls) stops trying. sj_stats:
     * bucket_graphs, bucket_graph_calls. Default 1; 0: graphs serve exact
     * shapes only. $SHAPEJIT_BUCKET_GRAPHS. */
    int bucket_graphs;
    /* The most jobs of one kind (compiles, learnings, graph captures, the
     * device's jobs) the background queue holds; one past it is refused and
     * counted (sj_runtime_job_counters). Default 4096.
     * $SHAPEJIT_JOB_QUEUE_MAX. */
    int job_queue_max;
    /* Compile workers kept from compiles for the short jobs (learnings,
     * graph captures, the device's jobs), while compile_threads is larger:
     * compiles run on at most compile_threads - this at once
     * (sj_runtime_job_counters). Default 1; 0: compiles may take every
     * worker. $SHAPEJIT_JOB_RESERVE_WORKERS. */
    int job_reserve_workers;
    /* CUDA: how many times a bucket graph is instantiated (its copies, one
     * captured graph): each copy keeps the sizes and caller buffers of the
     * last call it served, so a call whose sizes came before replays with
     * no update of the kernels (the copies share the graph's intermediates
     * and buffers: a copy holds only its nodes). A call of new sizes updates the
     * copy made ahead by the call before it (while the device ran that
     * call: no instantiation waits in a call) or, with every copy made, the
     * least recently replayed. Default 64; 1: one copy, updated whenever
     * the sizes change. $SHAPEJIT_BUCKET_GRAPH_EXECS. */
    int bucket_graph_execs;
    /* Quick compiles first: an entry whose calls run eagerly while its
     * kernels compile gets a quick compile where the device has one (CUDA:
     * NVRTC's fast compile, -Ofc=mid: about 40% less compile time, kernels
     * 30-35% slower on the encoder layer), then its full compile queued in
     * the background, whose kernels replace the quick ones when ready (the
     * quick unit is kept until the function is destroyed). A warm-up and a
     * shape's specialization compile in full at once; no CUDA graph is
     * captured of quick code; a quick unit's own cache key, and a full unit
     * already cached or loaded is taken instead. sj_stats: quick_compiles,
     * quick_replaced. Devices without one (the CPU) compile in full.
     * Default 1. $SHAPEJIT_COMPILE_QUICK. */
    int compile_quick;
} sj_runtime_config;

/* Defaults, then the environment. Never fails; cfg must not be NULL. */
SJ_API void sj_runtime_config_init(sj_runtime_config *cfg);

/* Create a runtime. cfg may be NULL (sj_runtime_config_init defaults); it is
 * copied, so the caller may free it after the call.
 *
 * Backends. SJ_BACKEND_AUTO picks CUDA when the CUDA driver, NVRTC and
 * cuBLASLt can be loaded and a device is present (the library loads them
 * with dlopen: it runs without them), else the CPU. On the CUDA backend the
 * CUDA context is created here (a few hundred milliseconds), never on a
 * request; inputs and outputs are device memory (data holds a CUdeviceptr,
 * device is SJ_CUDA); parameters may be device memory (used in place) or
 * host memory (copied to the device when the function is traced). sj_call
 * runs on the runtime's own stream (or, while another call is in flight,
 * on a lane ordered after it) and returns when the results are ready;
 * sj_call_stream queues the work on the caller's stream and returns at once. On success *rt owns all
 * the runtime's resources until sj_runtime_destroy().
 * Errors: SJ_EINVAL (rt NULL, a field out of range, a malformed buckets
 * string), SJ_EBACKEND (CUDA asked for and not available), SJ_ENOMEM. */
SJ_API sj_status sj_runtime_create(const sj_runtime_config *cfg, sj_runtime **rt);

/* Destroy a runtime and every sj_fn still alive on it. NULL is a no-op.
 * Must not race with any other use of rt or its functions. Free the output
 * tensors the runtime allocated for the caller (sj_tensor_free) first: they
 * came from the runtime's allocator, which goes away with it. */
SJ_API void sj_runtime_destroy(sj_runtime *rt);

/* Run up to max_jobs queued background compiles on the calling thread,
 * the most valuable first, and return how many ran (each compiled, failed
 * or was dropped as cold). With compile_threads 0 in SJ_COMPILE_ASYNC
 * mode, nothing else runs them (sj_fn_wait_idle also runs the waited
 * function's): a test or an event loop steps background work
 * deterministically. With workers it competes with them. NULL rt or
 * max_jobs <= 0: 0. Thread-safe. */
SJ_API int sj_runtime_run_background(sj_runtime *rt, int max_jobs);

/* The backend the runtime runs on (never AUTO). */
SJ_API sj_backend_kind sj_runtime_backend(const sj_runtime *rt);

/* The kernel caches' counters since sj_runtime_create, for a server's
 * metrics: the disk cache (cache_dir) and the remote cache
 * (remote_cache_url). A cache the runtime does not use (none configured,
 * or refused with a warning) reads as not enabled, all zero. Thread-safe. */
typedef struct sj_cache_counters {
    int disk_enabled;
    uint64_t disk_hits, disk_misses, disk_stores;
    uint64_t disk_refused;   /* entries refused: corrupt, tampered, another key's, not the user's */
    uint64_t disk_evictions; /* past cache_max_bytes */
    int remote_enabled;
    uint64_t remote_hits, remote_misses, remote_stores;
    uint64_t remote_refused; /* values that did not verify */
    uint64_t remote_errors;  /* operations failed on the connection (down, timeout, garbage) */
    uint64_t remote_skipped; /* operations not tried during a back-off */
    uint64_t remote_bytes_in, remote_bytes_out;
} sj_cache_counters;
SJ_API void sj_runtime_cache_counters(const sj_runtime *rt, sj_cache_counters *out);

/* The runtime's one background job queue by kind of job, for a server's
 * metrics: compiles, bucket learnings (learn_every), CUDA graph captures,
 * and the device's own background work (CUDA: the cuBLASLt warmer's choice
 * of algorithms for new product shapes). Each kind has two limits:
 * - queue_max, jobs of the kind waiting (job_queue_max); one past it is
 *   refused and counted in `dropped`: the work is asked for again later (a
 *   compile by a later hot call, a capture by later calls of its shape) or
 *   done by the device its own way (the warmer's own thread);
 * - workers_max, workers running the kind at once: with n compile workers,
 *   compiles take at most n - r while n > r (r: job_reserve_workers,
 *   default 1; so that with two or more workers a learning, a capture or a
 *   device job, milliseconds each, never waits for compiles, which take
 *   50 ms to seconds; 0: compiles may take them all) and each other kind at most
 *   half of them, rounded up (so that captures or device work never
 *   occupy every worker while compiles wait); one worker runs every kind,
 *   the most valuable job first (learnings, captures and device jobs
 *   before compiles). 0: no limit (compile_threads 0: the program's threads
 *   step the queue with sj_runtime_run_background).
 * With compile_threads 0 in SJ_COMPILE_ASYNC mode every kind, the device's
 * too, waits for sj_runtime_run_background (or a wait that steps it:
 * sj_fn_wait_idle, a warm-up); in sync or off mode nothing is queued (the
 * CUDA device warms on a thread of its own) and the counts stay 0.
 * Thread-safe; a snapshot under the queue's lock. */
typedef enum sj_job_kind { SJ_JOB_COMPILE, SJ_JOB_LEARN, SJ_JOB_CAPTURE, SJ_JOB_DEVICE, SJ_JOB_KINDS } sj_job_kind;
typedef struct sj_job_counters {
    int workers; /* compile_threads running (0: none, or not async) */
    struct {
        int queued, running;        /* now */
        int queue_max, workers_max; /* the limits (workers_max 0: none) */
        uint64_t ran, dropped;      /* since sj_runtime_create: run (or dropped as cold), refused past queue_max */
    } kind[SJ_JOB_KINDS];
} sj_job_counters;
SJ_API void sj_runtime_job_counters(const sj_runtime *rt, sj_job_counters *out);

/* The CUDA stream (a CUstream) the runtime runs sj_call on; NULL on the CPU
 * backend. Work the caller queues here is ordered before every later
 * sj_call, including those that run on a lane. Valid until
 * sj_runtime_destroy. */
SJ_API void *sj_runtime_stream(const sj_runtime *rt);

/* Allocate memory for t on t->device (dtype, rank and shape set by the
 * caller; strides are set contiguous): host memory through the runtime's
 * allocator, device memory from the runtime's caching allocator. Device
 * memory is ordered on the runtime's stream (sj_runtime_stream): sj_call,
 * sj_call_stream with a NULL stream and sj_tensor_copy are ordered with it
 * already; work the caller queues on another stream should wait for that
 * stream first (an event, or cuStreamSynchronize). Free it with
 * sj_tensor_free. Errors: SJ_EINVAL (bad descriptor, or a device this
 * runtime lacks), SJ_ENOMEM. Thread-safe. */
SJ_API sj_status sj_tensor_alloc(sj_runtime *rt, sj_tensor *t);

/* Copy src into dst: same shape, both contiguous, any devices (host <->
 * device, device <-> device, host <-> host). Synchronous. The dtypes may
 * differ (f32, f16, bf16, i32, i64, bool, any pair): elements convert as
 * sj_cast converts them, on host and device alike: to f16/bf16 through
 * f32, rounded to nearest even (integers first rounded to f32); float to
 * integer truncates toward zero, saturates at the integer's range, NaN
 * gives 0; i64 to i32 wraps; anything to bool is != 0; bool reads as 0/1.
 * Without a conversion, host to host, src and dst may overlap; device
 * copies, and any copy that converts, must not. A conversion between host
 * and device converts on the host (a temporary host buffer of the
 * element count); device to device runs one kernel. Errors: SJ_EINVAL,
 * SJ_ESHAPE, SJ_ENOMEM, SJ_EBACKEND. Thread-safe. */
SJ_API sj_status sj_tensor_copy(sj_runtime *rt, sj_tensor *dst, const sj_tensor *src);

/* Release an output tensor the runtime allocated in sj_call (data was NULL on
 * entry), through the runtime's allocator; rt must be the runtime that
 * allocated it, still alive. Sets t->data to NULL. NULL rt, t or t->data is a
 * no-op. Memory the caller allocated itself must not be passed here.
 * Thread-safe. */
SJ_API void sj_tensor_free(sj_runtime *rt, sj_tensor *t);

/* -- Weights from safetensors files ----------------------------------------
 *
 * A model's weights in the safetensors format (an 8-byte little-endian
 * header length, a JSON header naming each tensor's dtype, shape and byte
 * range, then the data), as Hugging Face models ship them.
 *
 *   sj_weights *w;
 *   sj_weights_open(rt, "model/model.safetensors", &w);
 *   sj_tensor q;
 *   sj_weights_get(w, "encoder.layer.0.attention.self.query.weight", SJ_F32,
 *                  2, (int64_t[]){384, 384}, &q);   // then sj_param(t, &q)
 *   ...                                             // destroy the functions
 *   sj_weights_close(w);
 *
 * The file is mapped read-only once. Every entry is checked at open (a
 * named dtype, at most SJ_MAX_RANK non-negative sizes, a byte range inside
 * the data that holds exactly its elements, no two ranges overlapping), so
 * a malformed or truncated file is refused whole, with an sj_status whose
 * message names the file, the tensor and what was wrong.
 *
 * Ownership: the tensors sj_weights_get returns belong to w and stay valid
 * until sj_weights_close; functions that captured them with sj_param must
 * be destroyed first. On the CPU backend a tensor asked for in its stored
 * dtype is the mapping itself (zero-copy; a copy if misaligned); a
 * conversion between f32, f16 and bf16 (round to nearest even) is made once
 * per (tensor, dtype). On the CUDA backend the tensor is uploaded once per
 * (tensor, dtype) and the same device tensor is returned to every caller,
 * so every entry and function shares it.
 * Thread-safe: sj_weights_get may be called from several threads. */
typedef struct sj_weights sj_weights;

/* Open and check path. Errors: SJ_EINVAL (NULL arguments, a missing or
 * unreadable file, not a regular file, a truncated file, a header out of
 * bounds or not JSON, a malformed entry, overlapping ranges), SJ_ENOMEM. */
SJ_API sj_status sj_weights_open(sj_runtime *rt, const char *path, sj_weights **w);
/* Unmap and free every copy. NULL is a no-op. */
SJ_API void sj_weights_close(sj_weights *w);
/* The number of tensors, and the name of the i-th in the header's order
 * (NULL when out of range); names stay valid until close. */
SJ_API int sj_weights_count(const sj_weights *w);
SJ_API const char *sj_weights_name(const sj_weights *w, int i);
/* The tensor as stored: dtype, rank and shape, data pointing into the
 * mapping (host memory, read only). Errors: SJ_EINVAL (no such tensor),
 * SJ_EDTYPE (a dtype shapejit does not compute with, e.g. F64). */
SJ_API sj_status sj_weights_info(const sj_weights *w, const char *name, sj_tensor *desc);
/* The tensor `name` as dtype, checked against the expected rank and shape
 * (shape NULL: any). Errors: SJ_EINVAL (no such tensor), SJ_ESHAPE (wrong
 * shape, expected and actual named), SJ_EDTYPE (a stored dtype that does
 * not convert to dtype: only f32, f16 and bf16 convert), SJ_ENOMEM. */
SJ_API sj_status sj_weights_get(sj_weights *w, const char *name, sj_dtype dtype, int rank, const int64_t *shape,
                                sj_tensor *out);

/* -- Tracing: what a model function calls -------------------------------- */

typedef struct sj_tracer sj_tracer;

/* A value in the graph being traced. Only meaningful inside the model
 * function call that produced it. */
typedef struct sj_val {
    int32_t id;
} sj_val;

/* An absent optional operand (e.g. no bias for sj_layer_norm). */
#define SJ_NONE ((sj_val){-1})

/* A size in the graph: constant, or symbolic. Used to build shapes for
 * sj_reshape that depend on input sizes without specializing on them. */
typedef struct sj_dim {
    int32_t e;
} sj_dim;

/* The model function: records the computation by calling the sj_ op
 * functions on `inputs` (one per sj_call input) and declares its results with
 * sj_output(). Return SJ_OK, or an error (e.g. from sj_trace_fail()) to
 * reject the inputs; sj_call then returns that error and no entry is made.
 *
 * Errors inside ops are sticky: an op given bad operands records the error
 * (status and message, naming the op and its operand shapes), returns an
 * invalid value, and every later op on it returns invalid values too; the
 * trace then fails with the first error no matter what the model function
 * returns. So a model function need not check each op. */
typedef sj_status (*sj_model_fn)(sj_tracer *t, const sj_val *inputs, int n_inputs, void *user);

/* Reject the inputs from inside a model function with a status and a
 * printf-style message; returns `status` so the model can `return
 * sj_trace_fail(t, SJ_ESHAPE, "...")`. */
SJ_API sj_status sj_trace_fail(sj_tracer *t, sj_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* The status of the trace so far (SJ_OK until an op fails). */
SJ_API sj_status sj_trace_status(const sj_tracer *t);

/* Declare a result. Results are returned in the order declared. The same
 * value may be declared twice. Returns the trace status. */
SJ_API sj_status sj_output(sj_tracer *t, sj_val v);

/* Facts about a value: dtype and rank (no guard is installed). */
SJ_API sj_dtype sj_val_dtype(sj_tracer *t, sj_val v);
SJ_API int sj_val_rank(sj_tracer *t, sj_val v);

/* The size of axis `axis` of v as a concrete integer. Negative axes count
 * from the end. The graph is then valid only for inputs where that size is
 * the same, so the runtime specializes on it. Returns -1 on a bad value or
 * axis (and records the error). */
SJ_API int64_t sj_size(sj_tracer *t, sj_val v, int axis);

/* The size of axis `axis` of v as a symbolic size, for shape arithmetic in
 * sj_reshape. No specialization. */
SJ_API sj_dim sj_dim_of(sj_tracer *t, sj_val v, int axis);
SJ_API sj_dim sj_dim_const(sj_tracer *t, int64_t c);
SJ_API sj_dim sj_dim_mul(sj_tracer *t, sj_dim a, sj_dim b);
SJ_API sj_dim sj_dim_add(sj_tracer *t, sj_dim a, sj_dim b);
/* Exact division: records the error if a is not a multiple of b. */
SJ_API sj_dim sj_dim_div(sj_tracer *t, sj_dim a, sj_dim b);
/* In sj_reshape: the one size inferred from the element count (like -1). */
#define SJ_DIM_INFER ((sj_dim){-1})

/* Captures a constant tensor (a weight) by reference: the caller keeps
 * w->data alive and unchanged for as long as the sj_fn lives. The descriptor
 * itself is copied. On the CUDA backend w may be device memory (used in
 * place) or host memory (copied to the device, layout kept, when the
 * function is traced); on the CPU backend a device tensor is SJ_EINVAL. */
SJ_API sj_val sj_param(sj_tracer *t, const sj_tensor *w);

/* A rank-0 constant that takes the dtype of the other operand of the binary
 * op it meets (a "weak" scalar), so sj_add(t, x, sj_scalar(t, 1.0)) keeps x's
 * dtype. Used alone it is f32. */
SJ_API sj_val sj_scalar(sj_tracer *t, double v);

/* Elementwise unary. Float dtypes only, except neg, abs and relu, which take
 * i32 and i64 too. gelu is the exact erf form; gelu_tanh the tanh
 * approximation. f16 and bf16 are computed in f32. On the CPU exp, tanh,
 * erf, sigmoid and gelu are vectorizable approximations within 2e-7
 * relative (erf and gelu: 1.5e-7 and 3e-7 of max(|result|, 1); gelu's
 * small negative results keep 2e-6 relative); the bounds are asserted in
 * tests/test_cpu_kernels.c and listed in base/sj_kernel_rt.h. */
SJ_API sj_val sj_neg(sj_tracer *t, sj_val x);
SJ_API sj_val sj_abs(sj_tracer *t, sj_val x);
SJ_API sj_val sj_exp(sj_tracer *t, sj_val x);
SJ_API sj_val sj_log(sj_tracer *t, sj_val x);
SJ_API sj_val sj_sqrt(sj_tracer *t, sj_val x);
SJ_API sj_val sj_rsqrt(sj_tracer *t, sj_val x);
SJ_API sj_val sj_tanh(sj_tracer *t, sj_val x);
SJ_API sj_val sj_sigmoid(sj_tracer *t, sj_val x);
SJ_API sj_val sj_relu(sj_tracer *t, sj_val x);
SJ_API sj_val sj_gelu(sj_tracer *t, sj_val x);
SJ_API sj_val sj_gelu_tanh(sj_tracer *t, sj_val x);
SJ_API sj_val sj_silu(sj_tracer *t, sj_val x);

/* Elementwise binary with numpy broadcasting. Both operands must have the
 * same dtype (a weak sj_scalar adopts the other's); bool is not accepted.
 * Integer div truncates toward zero and gives 0 for a zero divisor; integer
 * pow with a negative exponent gives 0 (except bases 1 and -1). maximum and
 * minimum propagate NaN. */
SJ_API sj_val sj_add(sj_tracer *t, sj_val a, sj_val b);
SJ_API sj_val sj_sub(sj_tracer *t, sj_val a, sj_val b);
SJ_API sj_val sj_mul(sj_tracer *t, sj_val a, sj_val b);
SJ_API sj_val sj_div(sj_tracer *t, sj_val a, sj_val b);
SJ_API sj_val sj_maximum(sj_tracer *t, sj_val a, sj_val b);
SJ_API sj_val sj_minimum(sj_tracer *t, sj_val a, sj_val b);
SJ_API sj_val sj_pow(sj_tracer *t, sj_val a, sj_val b);

/* Comparisons with broadcasting; the result is bool. */
SJ_API sj_val sj_eq(sj_tracer *t, sj_val a, sj_val b);
SJ_API sj_val sj_ne(sj_tracer *t, sj_val a, sj_val b);
SJ_API sj_val sj_lt(sj_tracer *t, sj_val a, sj_val b);
SJ_API sj_val sj_le(sj_tracer *t, sj_val a, sj_val b);
SJ_API sj_val sj_gt(sj_tracer *t, sj_val a, sj_val b);
SJ_API sj_val sj_ge(sj_tracer *t, sj_val a, sj_val b);

/* cond ? a : b, broadcasting all three; cond must be bool. */
SJ_API sj_val sj_where(sj_tracer *t, sj_val cond, sj_val a, sj_val b);

/* Convert to dtype (float->int truncates toward zero; NaN->int gives 0;
 * anything->bool is `!= 0`). */
SJ_API sj_val sj_cast(sj_tracer *t, sj_val x, sj_dtype dt);

/* Reductions over one axis (negative counts from the end). keepdim != 0
 * keeps the axis with size 1. sum and amax take ints too; mean takes floats.
 * The mean of an empty axis is NaN; amax over an empty axis is an error. */
SJ_API sj_val sj_sum(sj_tracer *t, sj_val x, int axis, int keepdim);
SJ_API sj_val sj_mean(sj_tracer *t, sj_val x, int axis, int keepdim);
SJ_API sj_val sj_amax(sj_tracer *t, sj_val x, int axis, int keepdim);

/* softmax over `axis`; a row whose inputs are all -inf gives zeros. Results
 * below 2^-126 (about 1.2e-38) may be flushed to 0, on the CPU as on the
 * GPU. */
SJ_API sj_val sj_softmax(sj_tracer *t, sj_val x, int axis);

/* Layer norm over the last axis: (x - mean) / sqrt(var + eps) * g + b, with
 * the biased variance. g and b are 1-D of the last axis' size, or SJ_NONE. */
SJ_API sj_val sj_layer_norm(sj_tracer *t, sj_val x, sj_val g, sj_val b, double eps);

/* RMS norm over the last axis: x / sqrt(mean(x^2) + eps) * g (g may be
 * SJ_NONE). */
SJ_API sj_val sj_rms_norm(sj_tracer *t, sj_val x, sj_val g, double eps);

/* Matrix product of the last two axes, [..., M, K] x [..., K, N] ->
 * [..., M, N], with the leading (batch) axes broadcast. Both ranks >= 2. */
SJ_API sj_val sj_matmul(sj_tracer *t, sj_val a, sj_val b);

/* Scaled dot-product attention. q [B, H, Sq, D], k [B, H, Sk, D],
 * v [B, H, Sk, Dv] -> [B, H, Sq, Dv]. lengths: SJ_NONE or an i32/i64 [B]
 * tensor; key positions >= lengths[b] are masked out for batch b. causal
 * masks key j for query i when j > i + Sk - Sq. A query with no key left
 * gives zeros. Float dtypes. */
SJ_API sj_val sj_attention(sj_tracer *t, sj_val q, sj_val k, sj_val v, sj_val lengths, double scale,
                           int causal);
/* Attention with an additive mask: as sj_attention without lengths, with
 * mask added to the scaled scores q k^T * scale before the softmax. mask
 * is broadcastable to the scores [B, H, Sq, Sk] (rank <= 4, each axis 1 or
 * the scores' size, aligned from the right, e.g. [B, 1, 1, Sk] for key
 * padding or [Sq, Sk]) and has dtype f32, q's dtype, or bool. A float
 * mask is added (-inf masks a key out); a bool mask keeps the keys where
 * it is true and masks the others, so 0/1 masks such as left padding
 * (sj_cast to bool) work as they are. causal applies on top. A query
 * whose every key is masked gives zeros. On CUDA the mask does not change
 * the kernel: f16/bf16 with head sizes D = Dv = 32, 64, 96 or 128 run on
 * tensor cores in registers, other head sizes that are multiples of 16
 * (up to 128) on tensor cores through shared memory, the mask read through
 * its strides (broadcast axes cost no memory); f32 and other head sizes
 * take a one-query-a-block kernel in f32. */
SJ_API sj_val sj_attention_mask(sj_tracer *t, sj_val q, sj_val k, sj_val v, sj_val mask, double scale,
                                int causal);

/* Attention over packed (ragged) sequences, as flash_attn_varlen: q
 * [T, H, D], k [T, H, D], v [T, H, Dv] -> [T, H, Dv], where T is the total
 * token count of B sequences laid end to end (symbolic T and B take one
 * entry for all lengths). offsets: an i32 [B+1] tensor (an input, on the
 * function's device) of cumulative starts: sequence b is the tokens
 * offsets[b] .. offsets[b+1]-1, and each query attends only to the keys
 * of its own sequence (causal: to keys at or before its own position).
 * An empty sequence (offsets[b] == offsets[b+1]) is allowed. Float
 * dtypes, softmax in f32; on CUDA, f16/bf16 with D = Dv = 32, 64, 96 or
 * 128 run on tensor cores (tiles of up to 64 queries of one sequence; the
 * probabilities rounded to the dtype before they weigh v, as flash
 * attention does), other calls one query a block in f32. The trace fails with SJ_EDTYPE for offsets
 * that are not i32 and SJ_ESHAPE for a rank other than 1 or fewer than 2
 * entries. At the call, offsets must start at 0, never decrease and end
 * at T; otherwise sj_call fails with SJ_EINDEX, the message naming what
 * was wrong, and the function stays usable. On the CPU the check reads
 * the offsets before any work (the message names the entry); on CUDA a
 * check kernel runs on the device and reports through the call's error
 * flag (as sj_gather's bad indices do, CUDA graphs included), so the
 * error comes after the call's kernels, the outputs are then
 * unspecified, and no read leaves [0, T). */
SJ_API sj_val sj_attention_varlen(sj_tracer *t, sj_val q, sj_val k, sj_val v, sj_val offsets, double scale,
                                  int causal);

/* Views and data movement. */
/* New shape with the same element count. At most one SJ_DIM_INFER. */
SJ_API sj_val sj_reshape(sj_tracer *t, sj_val x, int rank, const sj_dim *dims);
/* The same, with concrete sizes; -1 infers one size. */
SJ_API sj_val sj_reshape_i(sj_tracer *t, sj_val x, int rank, const int64_t *dims);
/* perm is a permutation of 0..rank-1: out.shape[i] = x.shape[perm[i]]. */
SJ_API sj_val sj_permute(sj_tracer *t, sj_val x, const int *perm);
SJ_API sj_val sj_transpose(sj_tracer *t, sj_val x, int axis0, int axis1);
/* Elements start, start+step, ... < end along axis. Negative start/end count
 * from the end; both are clamped to [0, size] as in Python. step >= 1. */
SJ_API sj_val sj_slice(sj_tracer *t, sj_val x, int axis, int64_t start, int64_t end, int64_t step);
/* Elements start, start+1, ..., end-1 along axis, with bounds that are
 * sizes of the trace (sj_dim_of, sj_dim_const, sj_dim_add, ...), so a
 * slice such as position_embeddings[0:S] for a symbolic S installs no
 * guard on S. Both bounds are >= 0 by construction and are clamped to
 * [0, size] as in Python; an empty range (end <= start after clamping)
 * gives size 0. The result is a view, like sj_slice's. */
SJ_API sj_val sj_slice_dim(sj_tracer *t, sj_val x, int axis, sj_dim start, sj_dim end);
/* 0, 1, ..., n-1 as a 1-D tensor [n] of dtype dt (f32, f16, bf16, i32 or
 * i64; not bool), for a constant or symbolic n: position ids built in the
 * graph without sj_size specialising on the length. Element i is the
 * integer i converted as sj_cast converts an i64 (f16/bf16: through f32,
 * rounded to nearest even, so exact up to 2048 / 256). */
SJ_API sj_val sj_arange(sj_tracer *t, sj_dim n, sj_dtype dt);
/* Join along axis; all other sizes and the dtypes must match. 1 <= n <= 64. */
SJ_API sj_val sj_concat(sj_tracer *t, const sj_val *xs, int n, int axis);
/* Embedding lookup: table [V, ...], idx i32/i64 of any shape ->
 * [idx..., table.shape[1:]...]. An index outside [0, V) makes sj_call fail
 * with SJ_EINDEX. */
SJ_API sj_val sj_gather(sj_tracer *t, sj_val table, sj_val idx);

/* -- Functions ----------------------------------------------------------- */

typedef struct sj_fn sj_fn;

#define SJ_MAX_INPUTS 64
#define SJ_MAX_OUTPUTS 64

/* How a function treats input sizes when it traces (as torch.compile's
 * dynamic=None/False/True):
 * - AUTO: the first trace is static (every size a constant). When a later
 *   call differs in some sizes, the retrace makes exactly the sizes that have
 *   varied symbolic, and that entry serves every later size of them.
 * - STATIC: one entry per distinct shape (until the recompile limit).
 * - SYMBOLIC: every size except 0 and 1 is symbolic from the first trace.
 * In every mode sizes 0 and 1 are specialized (broadcasting and empty tensors
 * behave differently), equal sizes share one symbol (duck sizing), and
 * sj_mark_dynamic/sj_mark_static/buckets override single dimensions. */
typedef enum sj_dynamic { SJ_DYNAMIC_AUTO = 0, SJ_DYNAMIC_STATIC = 1, SJ_DYNAMIC_SYMBOLIC = 2 } sj_dynamic;

/* Why a guard failed. X(name, text) */
#define SJ_GUARD_KIND_LIST(X)                                                   \
    X(SJ_GUARD_DTYPE, "dtype")                                                  \
    X(SJ_GUARD_RANK, "rank")                                                    \
    X(SJ_GUARD_DEVICE, "device")                                                \
    X(SJ_GUARD_STRIDE, "stride")                                                \
    X(SJ_GUARD_SIZE, "size")                                                    \
    X(SJ_GUARD_DUCK, "equal sizes")                                             \
    X(SJ_GUARD_RANGE, "range")                                                  \
    X(SJ_GUARD_DIVISIBLE, "divisibility")                                       \
    X(SJ_GUARD_RELATION, "relation")

typedef enum sj_guard_kind {
#define SJ_X(name, text) name,
    SJ_GUARD_KIND_LIST(SJ_X)
#undef SJ_X
    SJ_GUARD_KIND_COUNT
} sj_guard_kind;

/* "size", "equal sizes", ...; "?" for an invalid kind. */
SJ_API const char *sj_guard_kind_name(sj_guard_kind k);

/* One failed guard: why an existing entry could not serve a call. */
typedef struct sj_guard_failure {
    int entry;            /* id of the entry whose guard failed */
    sj_guard_kind kind;
    int input;            /* input index; -1 for a relation between sizes */
    int axis;             /* axis; -1 when the guard is not about one axis */
    int64_t expected;     /* the value the guard wanted (dtype and rank as numbers; RANGE: the low end) */
    int64_t expected_hi;  /* RANGE: the high end (INT64_MAX when unbounded); else = expected */
    int64_t actual;       /* what the call had */
    char input_name[32];  /* the input's name ("" for relations) */
    /* A sentence, e.g. "input 'x' size mismatch at axis 0: expected 7,
     * actual 8". */
    char message[256];
} sj_guard_failure;

/* Receives every guard failure that leads to a retrace (one per existing
 * entry that was tried), before the retrace. Called on the calling thread,
 * possibly concurrently from several; must not call back into the library.
 * f is valid only during the call. */
typedef void (*sj_guard_fail_fn)(void *user, const sj_guard_failure *f);

/* Options of one function. Zero-initialise (or use sj_fn_options_init); a
 * zero integer field means "the runtime's default" (see
 * sj_runtime_config), so {0} is all defaults. */
struct sj_fn_options {
    sj_dynamic dynamic;           /* default SJ_DYNAMIC_AUTO */
    int recompile_limit;          /* entries per function; default 8 */
    int limit_is_error;           /* nonzero: past the limit, sj_call returns SJ_ELIMIT */
    int hot_threshold;            /* calls before an entry is hot (queues its compile); default 2 */
    int specialize_threshold;     /* calls of one exact shape served by a symbolic
                                     entry before that shape is marked for a
                                     specialized compile; default 16 */
    int specialize_budget;        /* specializations per function; default 4 */
    const char *const *input_names; /* n_inputs names used in messages, or NULL
                                     ("input 0", ...); copied */
    sj_guard_fail_fn on_guard_fail; /* NULL: none */
    void *on_guard_fail_user;
};
typedef struct sj_fn_options sj_fn_options;

/* Zero the options (all defaults). */
SJ_API void sj_fn_options_init(sj_fn_options *opt);

/* Create a jitted function. name (copied; may be NULL -> "fn") is used in
 * messages and matched by SHAPEJIT_BUCKETS. n_inputs is the number of
 * tensors every sj_call passes, 0 .. SJ_MAX_INPUTS. user is passed to every
 * model call; the caller keeps it alive as long as the function lives. opt
 * may be NULL (defaults); it is copied.
 * Errors: SJ_EINVAL (rt, model or fn NULL; n_inputs out of range; an option
 * out of range, or SHAPEJIT_BUCKETS naming this function with an input or
 * axis out of range), SJ_ENOMEM. Thread-safe on one runtime. */
SJ_API sj_status sj_fn_create(sj_runtime *rt, const char *name, int n_inputs, sj_model_fn model,
                              void *user, const sj_fn_options *opt, sj_fn **fn);

/* Marks on single input dimensions (axis counts from 0; negative axes are
 * not accepted). They apply to traces made after the call; entries that
 * already exist are kept. Thread-safe with sj_call.
 *
 * sj_mark_dynamic: the dimension is symbolic with the value range
 * [min, max] (max may be INT64_MAX) whatever the policy. A call whose size
 * lies outside the range fails with SJ_ECONSTRAINT; sizes 0 and 1 are still
 * specialized when the range admits them. A model function that specializes
 * a marked dimension (reads it with sj_size, or combines it with a constant
 * size so that it must equal a constant) makes the trace fail with
 * SJ_ECONSTRAINT, naming the dimension and the op that specialized it.
 * sj_mark_static: the dimension is always a constant (one entry per size).
 * Errors: SJ_EINVAL (fn NULL, input or axis out of range, min > max,
 * max < 0). A later mark on the same dimension replaces the earlier one;
 * a mark replaces buckets on that dimension and the other way round. */
SJ_API sj_status sj_mark_dynamic(sj_fn *fn, int input, int axis, int64_t min, int64_t max);
SJ_API sj_status sj_mark_static(sj_fn *fn, int input, int axis);

/* Shape buckets on one input dimension. A bucket is a range (lo, hi] of
 * sizes that one entry serves: the dimension is symbolic inside the bucket
 * and the entry guards lo < size <= hi. Results never change (no padding
 * visible to the caller); buckets only decide which sizes share an entry
 * (and, with the fused tiers, a compiled kernel).
 *
 * sj_set_buckets: boundaries b[0] < b[1] < ... < b[n-1] (1 <= n <= 64,
 *   b[0] >= 1): buckets (0, b0], (b0, b1], ..., (b[n-2], b[n-1]], and
 *   (b[n-1], inf) for larger sizes.
 * sj_set_buckets_pow2: boundaries lo, 2lo, 4lo, ... up to the first >= hi.
 * sj_set_buckets_multiple: buckets ((k-1)n, kn] for k = 1, 2, ...
 * sj_set_profile: one bucket [min, max] with opt the size to tune for (as a
 *   TensorRT optimization profile); sizes outside it fail with
 *   SJ_ECONSTRAINT.
 * A dimension with no rule of its own whose size equals a bucketed one's in
 * the traced call follows the bucket: it is symbolic over the same range,
 * so a second input of the same length shares the bucket's entries (the
 * model's equality between the two becomes a guard), while a size that
 * only happens to equal it (a feature axis the model ties to a weight)
 * stays pinned on its own and does not pin the bucket.
 * Sizes 0 and 1 are specialized as always. Environment: SHAPEJIT_BUCKETS
 * (see sj_runtime_config). Errors: SJ_EINVAL (fn NULL, input or axis out of
 * range, bounds not increasing, sizes < 1). */
SJ_API sj_status sj_set_buckets(sj_fn *fn, int input, int axis, const int64_t *bounds, int n);
SJ_API sj_status sj_set_buckets_pow2(sj_fn *fn, int input, int axis, int64_t lo, int64_t hi);
SJ_API sj_status sj_set_buckets_multiple(sj_fn *fn, int input, int axis, int64_t n);
SJ_API sj_status sj_set_profile(sj_fn *fn, int input, int axis, int64_t min, int64_t opt, int64_t max);

/* -- Buckets learned from traffic ----------------------------------------------
 *
 * sj_fn_learn_buckets re-chooses the bucket edges of one input dimension
 * from the sizes the function has served, by a cost model:
 *   a call of size s in a bucket with upper edge h costs
 *     call_us + size_us * w * (1 + symbolic_overhead, if the bucket holds
 *                              more than one size seen)
 *   with w = h when the runtime pads calls to their bucket's edge (pad: CUDA
 *   graphs replayed at the edge, a server that pads), else w = s; a bucket
 *   holding one size seen counts as specialized;
 *   each bucket holding a size seen costs compile_ms (its trace and
 *   compile) plus bucket_mib * mib_ms (the memory its code and arenas hold,
 *   as time over the horizon), once over horizon_calls calls (0: the calls
 *   counted).
 * The edges minimise the expected cost per call (dynamic programming over
 * the sorted distinct sizes seen, at most max_buckets buckets; the last
 * edge is the largest size seen, larger sizes fall in the open bucket past
 * it). The histogram is built when asked, off the call path, from the memo
 * of exact signatures and their call counts (the memo holds up to 4096
 * signatures per function; shapes past it are not counted, see the
 * report's memo_full). Sizes 0 and 1 are left out (always specialized).
 *
 * The histogram forgets (half_life, cfg.learn_half_life, default 65536
 * calls): a call's weight halves after every half_life later calls of the
 * function, so that the edges follow the traffic of now, not the traffic
 * since the function was made (short sentences for an hour, then long
 * documents). The weights live beside the memo's call counts and are
 * brought up to date by each learning, off the call path: each shape's
 * calls since the latest learning join its weight (each at the mean
 * weight of calls spread evenly over that time) after the older weight
 * decayed by 2^(-calls since / half_life); a size whose weight falls
 * under half a call leaves the histogram. The window holds
 * half_life / ln 2 calls once many more were served. The window is the function's,
 * shared by its dimensions; the report gives the calls in it (calls,
 * rounded) beside those ever counted (calls_seen), sj_stats.learn_window
 * and sj_fn_explain the latest. sj_fn_size_histogram returns the counts
 * since the function was made, undecayed.
 *
 * With apply set, the edges become the dimension's buckets (as
 * sj_set_buckets) while the function serves: shapes served before keep
 * their entries (their memoised signatures); entries whose range on this
 * dimension is not one of the new buckets are retired: no new shape
 * matches them, so new shapes are traced under the new buckets. Results
 * never change. Retired entries still count towards the recompile limit
 * (raise it to cover the old entries and the new buckets); the symbolic
 * entry made past the limit is never retired (it serves what no bucket's
 * entry may be made for).
 * Thread-safe with sj_call. */
typedef struct sj_learn_options {
    int max_buckets;          /* at most this many buckets, 1 .. 64 (default 8) */
    double call_us;           /* fixed cost of a call (default 0) */
    double size_us;           /* cost per call per unit of size; < 0: measured from the function's
                                 timed eager calls, 1 if none (default -1) */
    double symbolic_overhead; /* extra fraction of a symbolic kernel's size cost (default 0.05) */
    int pad;                  /* 1: calls run at their bucket's edge (default 0) */
    double compile_ms;        /* per bucket; < 0: the function's mean compile time, 50 if none
                                 (default -1) */
    double bucket_mib;        /* memory per bucket, MiB (default 0) */
    double mib_ms;            /* cost of holding 1 MiB over the horizon, ms (default 0) */
    double horizon_calls;     /* calls the per-bucket cost is spread over; 0: the calls counted
                                 (default 0) */
    int apply;                /* 1: swap the edges in (default 0: report only) */
    double min_gain;          /* with apply: swap only when the expected cost per call falls by at
                                 least this fraction of the rule before's, in [0, 1); < 0: 0 for
                                 sj_fn_learn_buckets, 0.02 for learning while serving (default -1) */
    double half_life;         /* calls after which a call's weight in the histogram halves; 0: no
                                 decay (every call since the function was made); < 0: the
                                 runtime's cfg.learn_half_life (default -1). See above. */
} sj_learn_options;

typedef struct sj_bucket_report {
    int n_edges;
    int64_t edges[64];         /* the chosen edges: buckets (0,e0], (e0,e1], ..., (e[n-1], inf) */
    int n_sizes;               /* distinct sizes seen (>= 2) */
    int64_t min_size, max_size;
    uint64_t calls;            /* calls counted: in the window with a half_life (rounded) */
    int memo_full;             /* the memo is full: shapes past it were not counted */
    double size_us, compile_ms; /* the model's values used (measured or given) */
    double cost_before_us;     /* expected cost per call under the rule before */
    double cost_after_us;      /* ... under the chosen edges */
    int buckets_before;        /* buckets of the rule before holding a size seen */
    char rule_before[96];      /* "pow2:16,512", "none", ... */
    int applied;               /* the edges were swapped in */
    int kept;                  /* apply asked, but the gain was under min_gain: the rule before kept */
    int entries_retired;       /* entries retired by the swap */
    double half_life;          /* the window's half-life in calls (0: no decay) */
    uint64_t calls_seen;       /* calls of sizes >= 2 counted since the function was made (calls:
                                  those in the window, rounded; equal with no decay) */
} sj_bucket_report;

/* Defaults as documented above. */
SJ_API void sj_learn_options_init(sj_learn_options *opt);

/* Learn edges for input `input`, axis `axis` of fn (opt NULL: defaults;
 * report may be NULL). Errors: SJ_EINVAL (fn NULL, input or axis out of
 * range, an option out of range or not finite, no size >= 2 seen on the
 * dimension), SJ_ENOMEM. */
SJ_API sj_status sj_fn_learn_buckets(sj_fn *fn, int input, int axis, const sj_learn_options *opt,
                                     sj_bucket_report *report);

/* The sizes seen on one dimension with their call counts, from the memo:
 * up to max of them (sorted, sizes >= 2); returns how many there are (may
 * exceed max), or -1 with the error set (SJ_EINVAL, SJ_ENOMEM). */
SJ_API int sj_fn_size_histogram(sj_fn *fn, int input, int axis, int64_t *sizes, uint64_t *counts, int max);

/* One line per report: edges, sizes, costs (no trailing newline). */
SJ_API int sj_bucket_report_str(const sj_bucket_report *report, char *buf, size_t n);

/* Learning while serving. sj_fn_learn_auto makes fn re-learn the edges of
 * (input, axis) by itself, with opt's model (NULL: defaults; apply is
 * taken as 1), after every `every` new exact shapes the function serves
 * (signatures its memo had not seen: the first call of each; shapes past
 * the memo's 4096 are not counted), counted from this call, and, when
 * the histogram decays (half_life, cfg.learn_half_life), after every
 * half-life of calls served from the memo (checked on every 64th memo
 * hit of a thread's shard: a sum of 16 counters), since once the new
 * traffic's shapes are all seen, new shapes stop making learnings due.
 * The call that serves the every-th new shape counts it with one atomic
 * increment and queues a learning job on the compile queue; the background compile
 * worker runs it (ahead of compile jobs: what compiles next is then for
 * the new buckets), as sj_fn_learn_buckets with apply would: the edges
 * are swapped in while the function serves, results never change, entries
 * of replaced buckets are retired. With compile_threads 0 the job waits
 * for sj_runtime_run_background (or sj_fn_wait_idle); with compile_mode
 * sync or off it runs on the calling thread at the call that queued it.
 * A learning swaps the edges in only when they lower the expected cost
 * per call by min_gain (default 2%) of the rule in force: re-learning
 * edges that differ by little would retire entries for nothing (kept
 * rules are counted in sj_stats.learn_kept).
 * Each learning that is applied is counted (sj_stats.buckets_learned),
 * logged (recompiles topic), sent as an SJ_EVENT_BUCKETS_LEARNED event
 * with the edges, and its report shown by sj_fn_explain; one that fails
 * (no size >= 2 served yet on the dimension) is counted in
 * learn_failures and retried after `every` more new shapes. every 0 turns
 * it off for the dimension. At most 8 dimensions per function; a later
 * call for the same dimension replaces its options. cfg.learn_every does
 * the same, with default options, for every bucketed dimension without
 * options of its own. Each learning may retire entries that still count
 * towards the recompile limit: raise it for a long-running function.
 * Errors: SJ_EINVAL (fn NULL, input or axis out of range, every < 0, an
 * option out of range, a ninth dimension). Thread-safe with sj_call. */
SJ_API sj_status sj_fn_learn_auto(sj_fn *fn, int input, int axis, int every, const sj_learn_options *opt);

/* Run fn on inputs, writing n_outputs results.
 *
 * inputs: n_inputs descriptors (must equal the count given to sj_fn_create);
 *   read only; their memory must stay valid for the call.
 * outputs: n_outputs descriptors, one per sj_output() of the trace:
 *   - data == NULL: the runtime allocates a contiguous tensor, fills in the
 *     whole descriptor, and the caller frees it with sj_tensor_free();
 *   - data != NULL: the caller's memory; dtype, rank and shape must match the
 *     result exactly (SJ_ESHAPE / SJ_EDTYPE otherwise, naming the output,
 *     axis, expected and actual); any strides >= 0 without self-overlap.
 *     Outputs must not overlap inputs or each other.
 * The call is served by the first cached entry whose guards pass (an exact
 * signature seen before costs one hash and one compare); otherwise the model
 * function is traced again under the function's policy.
 * On error nothing is allocated for the caller and caller outputs may have
 * been partly written. Thread-safe (see the top of this header).
 * Errors: SJ_EINVAL (NULL pointers, counts, rank/dtype/stride out of range,
 *   NULL data in an input with elements, sizes past 2^48 elements),
 *   SJ_EDTYPE/SJ_ESHAPE (from the trace, the output check, or a result that
 *   these inputs would make larger than 2^48 elements), SJ_ECONSTRAINT (a size outside a mark or
 *   profile, or a model that specializes a marked dimension), SJ_ELIMIT (the
 *   recompile limit, when limit_is_error is set), SJ_EMODEL or the model's
 *   own status, SJ_EINDEX (gather), SJ_ENOMEM. */
SJ_API sj_status sj_call(sj_fn *fn, const sj_tensor *inputs, int n_inputs, sj_tensor *outputs,
                         int n_outputs);

/* sj_call on the CUDA backend without waiting: the work is queued on
 * `stream` (a CUstream; NULL: the runtime's own stream) and the call
 * returns; outputs are ready when the stream reaches that point (record an
 * event, or synchronize the stream). Runtime-allocated outputs are ordered
 * on that stream too. A gather index out of range is not detected on this
 * path (sj_call detects it). The function and the runtime must outlive
 * the queued work: synchronize the stream before sj_fn_destroy or
 * sj_runtime_destroy. On the CPU backend this is sj_call. */
SJ_API sj_status sj_call_stream(sj_fn *fn, const sj_tensor *inputs, int n_inputs, sj_tensor *outputs,
                                int n_outputs, void *stream);

/* Counters since sj_fn_create. Read with relaxed atomics: exact once calls
 * have stopped, approximate while they run. */
typedef struct sj_stats {
    uint64_t calls;            /* sj_call invocations that were served */
    uint64_t errors;           /* sj_call invocations that returned an error */
    uint64_t eager_calls;      /* calls served by eager (per-op) execution */
    uint64_t traces;           /* successful traces of the model function */
    uint64_t trace_errors;     /* traces that failed (model, op or constraint error) */
    uint64_t entries;          /* cached entries (traced graphs with their guards) */
    uint64_t static_entries;   /* entries whose sizes are all constants */
    uint64_t symbolic_entries; /* entries with at least one symbolic size */
    uint64_t memo_hits;        /* calls served from the exact-signature memo */
    uint64_t guard_evals;      /* guard sets evaluated (memo misses) */
    uint64_t guard_failures[SJ_GUARD_KIND_COUNT]; /* failed guards that led to a retrace, by kind */
    uint64_t limit_hits;       /* misses past the recompile limit */
    uint64_t hot_entries;      /* entries that reached hot_threshold */
    uint64_t hot_shapes;       /* exact shapes marked for specialization */
    uint64_t fused_symbolic_calls;    /* calls served by an entry's symbolic fused kernels */
    uint64_t fused_specialized_calls; /* calls served by kernels with every size constant */
    uint64_t compiles;         /* kernels made ready (compiled or loaded from the cache) */
    /* of which needed no compiler run: loaded from the persistent cache, or
     * an identical unit loaded already in this process (shared) */
    uint64_t compile_cache_hits;
    uint64_t compile_remote_hits; /* of which fetched from the remote cache (remote_cache_url) */
    uint64_t compile_failures; /* compiles that failed (those entries run eagerly, then retry) */
    uint64_t compiles_blacklisted; /* units that failed for good (compile_max_failures) */
    uint64_t validations;          /* calls that ran eagerly and fused side by side (validate_calls) */
    uint64_t validation_failures;  /* compiled units rejected: their results differed from eager */
    uint64_t compiles_dropped; /* queued compiles dropped because their entry (or shape) went cold */
    /* The memory budget of specializations (specialize_max_bytes): */
    uint64_t specializations_demoted; /* specialized shapes demoted to their entry's symbolic kernels */
    uint64_t specializations_over_budget; /* compiled specializations not kept: alone larger than the budget */
    uint64_t specialized_bytes; /* bytes the specialized shapes hold now (code and arenas; with or without a budget) */
    double compile_ms;         /* compiler time, total */
    /* CUDA backend (sj_runtime_config.cuda_graphs): */
    uint64_t graph_calls;      /* fused calls served by one CUDA graph launch */
    uint64_t graphs;           /* CUDA graphs captured */
    uint64_t graph_failures;   /* captures that failed (those shapes launch kernel by kernel, then retry) */
    uint64_t graphs_blacklisted; /* shapes whose captures failed for good (compile_max_failures) */
    uint64_t graph_bytes;      /* device memory the function's graphs hold now */
    uint64_t graph_evictions;  /* graphs evicted by graph_max_bytes (least recently replayed first) */
    uint64_t graphs_over_budget; /* captured graphs not kept: no room under graph_max_bytes */
    uint64_t bucket_graphs;    /* graphs that serve a whole bucket, captured (bucket_graphs; also in graphs) */
    uint64_t bucket_graph_calls; /* calls served by one (also in graph_calls) */
    /* CPU backend (sj_runtime_config.prepack_max_bytes): */
    uint64_t packed_weights;   /* constant weights packed for matrix products, each once */
    uint64_t packed_bytes;     /* the memory the packed copies hold */
    /* Warm-up (sj_fn_warmup). Its runs are not calls: they are in none of
     * the call counts above (calls, the tiers, memo hits, guard
     * evaluations, graph calls), while what they made is counted where it
     * belongs (traces, entries, compiles, graphs). */
    uint64_t warmup_runs;      /* executions of warm-up shapes on runtime-made or caller inputs */
    uint64_t warmup_shapes;    /* shapes prepared */
    uint64_t warmup_failures;  /* shapes that could not be prepared */
    /* Buckets learned while serving (learn_every, sj_fn_learn_auto): */
    uint64_t buckets_learned;  /* learnings applied (new edges swapped in) */
    uint64_t learn_failures;   /* learnings that could not run (nothing served on the dimension yet) */
    uint64_t learn_kept;       /* learnings that kept the rule in force (gain under min_gain) */
    uint64_t learn_window;     /* calls in the learning histogram's window at the latest learning
                                  with decay (weights summed, rounded; learn_half_life) */
    /* Quick compiles (compile_quick): units first made ready from a quick
     * compile (also in compiles), and of those, replaced by their full
     * compile since. */
    uint64_t quick_compiles;
    uint64_t quick_replaced;
    /* Generated products (cuda_gemm 1): time the autotuner spent timing
     * their variants against cuBLASLt on the background thread, before the
     * units it tuned were ready (not in compile_ms; 0 where the choice came
     * from the kernel cache). */
    double tune_ms;
} sj_stats;
/* Counts are exact for the calls that have returned; a call in flight on
 * another thread may or may not be in them yet. */
SJ_API void sj_fn_stats(const sj_fn *fn, sj_stats *out);

/* A human-readable account of the function to `out`: its policy and limits;
 * every entry with its guards, symbols and their ranges, relations, tier,
 * calls and hot shapes; and the recent guard failures that caused retraces.
 * Thread-safe. */
SJ_API void sj_fn_explain(const sj_fn *fn, FILE *out);

/* Wait until a background warm-up of fn (sj_fn_warmup) is over, then until
 * fn has no compiles queued or running, then for its CUDA graph captures
 * (the limit applies to all three; with compile_threads 0 this thread runs
 * the queued jobs). timeout_ms < 0: no limit.
 * Errors: SJ_EINVAL (fn NULL), SJ_ETIMEOUT. Thread-safe. */
SJ_API sj_status sj_fn_wait_idle(sj_fn *fn, int timeout_ms);

/* -- Warm-up and readiness ----------------------------------------------------
 *
 * Prepare a function for the shapes it will serve before the first request
 * comes: each shape's entry traced, its fused kernels compiled and loaded,
 * and the shape run once, which on the CUDA backend also loads modules,
 * chooses cuBLASLt algorithms and fills the caching allocator's pool; with
 * the caller's buffers, a CUDA graph is captured for them. A warmed shape's
 * first call is then served as a later one would be (fused; with a graph
 * when its buffers were given), with no compile and no trace on it.
 *
 *   const int64_t S[] = {32, 64, 128};
 *   sj_tensor shapes[3];
 *   for (int k = 0; k < 3; k++)     // data NULL: the runtime makes inputs
 *       shapes[k] = sj_tensor_make(NULL, SJ_F32, 2, (int64_t[]){S[k], 384});
 *   sj_warmup_spec spec = {.n_shapes = 3, .shapes = shapes};
 *   sj_fn_warmup(fn, &spec, 0);     // blocks until done
 *
 * or, for a server: sj_fn_warmup(fn, &spec, SJ_WARMUP_BACKGROUND), then
 * answer /health with sj_fn_ready(fn).
 *
 * Work. sj_fn_warmup checks the spec, then traces every shape on the
 * calling thread (model functions run only on callers' threads), then
 * hands the rest to a warm-up thread of the function's own: compiles
 * (compile_mode ASYNC: queued on the background workers at once, so
 * compile_threads > 1 compile several in parallel, never dropped as cold;
 * SYNC: one after another on the warm-up thread; OFF: none, the shapes run
 * eagerly), then each shape's run on inputs made by the runtime (floats
 * uniform in [-1, 1), integers and bools 0; outputs discarded) or the
 * caller's buffers, then graph captures, waited for. With the validated
 * swap on (validate_calls), the runs also make the new kernels' first
 * checks against eager execution, so that a first call finds them
 * validated (a kernel that differs is rejected, and its shapes reported).
 * Blocking (flags without SJ_WARMUP_BACKGROUND), the call returns when all
 * of it is done or at spec->timeout_ms, whichever is first; the work then
 * goes on in the background. Calls of the function may run
 * meanwhile, from any thread; they are served as usual.
 *
 * Shapes. Explicit ones (shapes, n_shapes: each a set of n_inputs input
 * descriptors: dtype, rank, shape; data NULL for inputs the runtime makes,
 * contiguous), and/or a walk of the buckets (walk: one set of n_inputs
 * descriptors, the template): the template is warmed, then every
 * combination of the bucket edges on the function's bucketed axes
 * (sj_set_buckets*, sj_set_profile, SHAPEJIT_BUCKETS): the upper end hi of
 * each bucket (lo, hi] (pow2 and lists: each bound; multiples: m, 2m, ...
 * up to walk_max, which they need; a profile: its opt and max), skipping
 * sizes below 2 (size 1 is always its own entry: list it explicitly) and
 * above walk_max (when > 0); the open bucket past the last bound has no
 * edge. Every size of the template equal to a walked axis's size follows
 * it (as sizes equal to a bucketed one follow its bucket), unless the
 * template's trace pins it to a constant (a feature axis tied to a
 * weight); give independent walked axes different template sizes. The
 * shapes warmed, explicit and walked, are at most cfg.warmup_max_shapes
 * (SHAPEJIT_WARMUP_MAX_SHAPES, default 256); more is SJ_EINVAL before
 * anything is done. Sizes are those of calls: a function's recompile limit
 * applies to its warm-up too (a shape past it fails with SJ_ELIMIT unless
 * a fallback entry serves it).
 *
 * Status. sj_fn_warmup_status and sj_fn_ready say how far the latest
 * warm-up is, sj_fn_warmup_shape how each shape fared. A shape that fails
 * (the model rejects it, a constraint, a compile that failed: its entry
 * runs eagerly, a run that failed) is reported and the others are still
 * prepared. sj_fn_stats counts warm-up runs apart from calls.
 *
 * Threads and lifetime. sj_fn_warmup may be called from any thread, one
 * warm-up at a time per function (a second while one runs: SJ_EINVAL).
 * The spec and its descriptors are copied; buffers the caller gives must
 * stay valid until the warm-up is over (sj_fn_ready, the callback, or
 * sj_fn_wait_idle) and are written (outputs) during it. sj_fn_destroy
 * during a warm-up stops it: queued compiles are dropped, a running C
 * compiler is killed (an NVRTC compile is abandoned), a run in progress
 * ends, and destroy returns within about the time of one run; the
 * callback then reports CANCELLED. */

/* sj_fn_warmup's flags. */
enum {
    SJ_WARMUP_BACKGROUND = 1u << 0, /* return once the shapes are traced; the rest on the warm-up thread */
    SJ_WARMUP_NO_RUN = 1u << 1,     /* trace and compile only: no run, no graph capture */
    SJ_WARMUP_NO_GRAPHS = 1u << 2,  /* no CUDA graph capture, even with the caller's buffers */
};

/* A warm-up's state, or one of its shapes'. X(name, text) */
#define SJ_WARM_STATE_LIST(X)                                                   \
    X(SJ_WARM_NONE, "none")           /* the function was never warmed */      \
    X(SJ_WARM_RUNNING, "running")     /* under way (a shape: not done yet) */  \
    X(SJ_WARM_DONE, "done")           /* every shape done or failed; a shape: prepared */ \
    X(SJ_WARM_FAILED, "failed")       /* a shape that could not be prepared */ \
    X(SJ_WARM_CANCELLED, "cancelled") /* stopped by sj_fn_destroy */

typedef enum sj_warm_state {
#define SJ_X(name, text) name,
    SJ_WARM_STATE_LIST(SJ_X)
#undef SJ_X
    SJ_WARM_STATE_COUNT
} sj_warm_state;

/* "running", ...; "?" for an invalid state. */
SJ_API const char *sj_warm_state_name(sj_warm_state s);

/* How far a function's latest warm-up is. */
typedef struct sj_warmup_status {
    sj_warm_state state;     /* NONE, RUNNING, DONE or CANCELLED */
    int total;               /* shapes of the warm-up */
    int prepared;            /* shapes done: traced, compiled where compile_mode allows, run */
    int failed;              /* shapes that could not be prepared */
    int first_failed;        /* the first failed shape's index; -1 if none */
    sj_status first_status;  /* its status (SJ_OK if none) */
    char first_message[256]; /* its message */
    double elapsed_ms;       /* since sj_fn_warmup began; until the end once it is over */
} sj_warmup_status;

/* Called once when a warm-up is over (state DONE or CANCELLED), on the
 * function's warm-up thread, with no lock held; st is valid only during the
 * call. It may read: sj_fn_stats, sj_fn_ready, sj_fn_warmup_status,
 * sj_fn_warmup_shape, sj_fn_explain, sj_last_error; anything else of the
 * library (sj_call, sj_fn_warmup, sj_fn_wait_idle, destroy) it must not
 * call. CANCELLED: fn is being destroyed; do not use it at all. */
typedef void (*sj_warmup_done_fn)(void *user, sj_fn *fn, const sj_warmup_status *st);

/* What to warm. Zero-initialise, then fill what is needed. */
typedef struct sj_warmup_spec {
    int n_shapes;             /* explicit shapes, >= 0 */
    /* n_shapes * n_inputs descriptors, shape k's input i at
     * [k * n_inputs + i]. data NULL: the runtime makes the input (random
     * floats, zero integers; contiguous; strides ignored), else the
     * caller's memory, used as is (device memory on the CUDA backend). */
    const sj_tensor *shapes;
    /* NULL, or n_shapes * n_outputs descriptors as sj_call takes them: the
     * caller's buffers for each shape's outputs (data NULL: made by the
     * runtime and discarded). On the CUDA backend (cuda_graphs > 0), a
     * shape whose inputs and outputs are all the caller's is captured into
     * a CUDA graph for those buffers: the first sj_call with them is one
     * graph launch. */
    const sj_tensor *outputs;
    int n_outputs;            /* with outputs: the model's output count */
    const sj_tensor *walk;    /* NULL, or the template: n_inputs descriptors (data ignored) */
    int64_t walk_max;         /* walk: skip edges above it; 0: none (multiple buckets need one) */
    int timeout_ms;           /* blocking: at most this long (then SJ_ETIMEOUT); 0: no limit */
    sj_warmup_done_fn on_done; /* NULL: none */
    void *on_done_user;
} sj_warmup_spec;

/* Warm fn up for spec's shapes (see above). flags: SJ_WARMUP_*.
 * Returns SJ_OK when every shape was prepared (blocking) or traced
 * (SJ_WARMUP_BACKGROUND); else the first failed shape's status, its
 * message naming the shape ("fn 'f': warm-up shape 2 of 6 ([4, 700], [4]):
 * ..."),
 * with the other shapes still prepared; SJ_ETIMEOUT (blocking, past
 * timeout_ms: the warm-up goes on in the background).
 * Errors before anything is done: SJ_EINVAL (fn or spec NULL, unknown
 * flags, negative counts, NULL arrays for counts, a descriptor with a bad
 * rank, dtype, shape or device, n_outputs out of range, a walk with no
 * bucketed axis, an unbounded walk, more shapes than warmup_max_shapes, a
 * warm-up already running), SJ_ENOMEM. Thread-safe. */
SJ_API sj_status sj_fn_warmup(sj_fn *fn, const sj_warmup_spec *spec, unsigned flags);

/* The latest warm-up's progress (state NONE, zeros, if there was none).
 * Thread-safe. */
SJ_API void sj_fn_warmup_status(const sj_fn *fn, sj_warmup_status *out);

/* 1 when the latest warm-up is over (DONE, whether or not some shapes
 * failed: see sj_fn_warmup_status), 0 while it runs or when fn was never
 * warmed (a server is not ready before its warm-up began). Thread-safe,
 * lock-free: a /health handler may call it on every request. */
SJ_API int sj_fn_ready(const sj_fn *fn);

/* One shape of the latest warm-up. */
typedef struct sj_warmup_shape_info {
    sj_warm_state state;  /* RUNNING (not yet), DONE, FAILED or CANCELLED */
    sj_status status;     /* FAILED: why (SJ_OK otherwise) */
    char message[256];
    int entry;            /* the entry that serves it; -1 if none */
    int walked;           /* made by the walk (else explicit; the template counts as walked) */
    char shape[192];      /* its input sizes: "[4, 32], [4], [32], [4, 32, 1]" */
    char tier[32];        /* how its run was served: "fused symbolic", "eager", ...; "" if not run */
    int graph;            /* a CUDA graph was captured for it */
} sj_warmup_shape_info;

/* Fill *out for shape i (0 .. total - 1: explicit shapes first, then the
 * walk's). Errors: SJ_EINVAL (fn or out NULL, i out of range). Thread-safe. */
SJ_API sj_status sj_fn_warmup_shape(const sj_fn *fn, int i, sj_warmup_shape_info *out);

/* One cached entry, for programs and tests that inspect the cache. */
typedef struct sj_entry_info {
    int id;            /* 0, 1, ... in creation order */
    int symbolic;      /* some size is a symbol */
    int bucketed;      /* some size is a bucket */
    int fallback;      /* made past the recompile limit */
    int hot;           /* reached hot_threshold */
    int n_symbols;
    int n_guards;      /* instructions in its guard program */
    uint64_t calls;
    /* "static", "symbolic in x.size(0)", "symbolic in x.size(0) bucket
     * (16, 32]": the sizes its guards leave free (a size the model ties to
     * a constant is not listed) */
    char what[128];
    /* "eager", "queued", "compiling", "fused symbolic", "fused specialized",
     * "compile failed" (retried after its penalty), "compile blacklisted",
     * "rejected by validation" */
    char tier[32];
    int specialized_shapes;  /* exact shapes with their own specialized kernels ready */
    double time_to_fused_ms; /* from the entry's creation to its kernels being ready; -1 if not */
    int64_t planned_bytes;   /* arena bytes at the sizes first traced (memory plan) */
    int64_t naive_bytes;     /* without sharing */
    int64_t specialized_bytes; /* what its specialized shapes hold now (code and arenas) */
    int demoted_shapes;      /* its shapes demoted by the memory budget and not specialized now */
} sj_entry_info;

/* Fill out[0 .. max) with the entries, newest first; returns how many
 * entries there are (which may exceed max). Thread-safe. */
SJ_API int sj_fn_entries(const sj_fn *fn, sj_entry_info *out, int max);

/* Destroy fn. NULL is a no-op. Must not race with other uses of fn. */
SJ_API void sj_fn_destroy(sj_fn *fn);

#ifdef __cplusplus
}
#endif
#endif /* SHAPEJIT_H */
