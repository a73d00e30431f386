/* Tunables: every number of sj_runtime_config a program or an operator may
 * set, once, with its default, its range, its environment variable and a
 * line of documentation (LuaJIT's JIT_PARAMDEF). The config's defaults, the
 * SHAPEJIT_* parsing and sj_runtime_create's validation derive from this
 * list; sj_fn_options reuse the per-function rows' ranges; README's
 * environment table states the same values (tests/test_tunables.c reads
 * README and compares).
 *
 * X(field, type, default, lo, hi, env, doc): type is int, int64_t or
 * uint64_t (the field's C type); default and the range [lo, hi] in that
 * type; env is the SHAPEJIT_ variable. */
#ifndef SJ_BASE_TUNABLES_H
#define SJ_BASE_TUNABLES_H

#include <stdint.h>

#include "jit/shapejit.h"

#define SJ_TUNABLE_LIST(X)                                                                        \
    X(recompile_limit, int, 8, 1, 1000000, "SHAPEJIT_RECOMPILE_LIMIT", "entries per function")    \
    X(total_recompile_limit, int, 256, 1, 1000000, "SHAPEJIT_TOTAL_RECOMPILE_LIMIT",              \
      "entries per runtime, all functions")                                                       \
    X(hot_threshold, int, 2, 1, 1000000, "SHAPEJIT_HOT_THRESHOLD",                                \
      "calls before an entry is hot and queues its compile")                                      \
    X(specialize_threshold, int, 16, 1, 1000000, "SHAPEJIT_SPECIALIZE_THRESHOLD",                 \
      "calls of one exact shape of a symbolic entry before it gets a specialized compile")        \
    X(specialize_budget, int, 4, 1, 1000000, "SHAPEJIT_SPECIALIZE_BUDGET",                        \
      "specializations per function")                                                             \
    X(compile_threads, int, 1, 0, 1024, "SHAPEJIT_COMPILE_THREADS",                              \
      "background compile workers (`0`: none; the program runs queued compiles with "              \
      "`sj_runtime_run_background`)") \
    X(exec_threads, int, 0, 0, 1024, "SHAPEJIT_THREADS",                                          \
      "kernel threads: fused kernels, matrix products and attention are split over them "         \
      "(`0`: all CPUs)")                                                                          \
    X(exec_min_work, int64_t, INT64_C(1) << 18, 1, INT64_C(1) << 40, "SHAPEJIT_EXEC_MIN_WORK",    \
      "least work a CPU kernel gives each kernel thread it runs on, in multiply-adds (an element " \
      "of a fused kernel counts 16): a kernel uses only as many threads as get this much, and one " \
      "with less than twice this runs on the calling thread alone")                              \
    X(exec_spin_us, int, 1000, 0, 1000000, "SHAPEJIT_EXEC_SPIN_US",                                  \
      "how long a CPU kernel thread polls for the next kernel before it sleeps (and a caller for "  \
      "its kernel's last chunk), in microseconds; `0`: sleep at once")                            \
    X(blas_threads, int, 0, -1, 1024, "SHAPEJIT_BLAS_THREADS",                                    \
      "`0`: matrix products run on shapejit's kernel threads and OpenBLAS is set to one thread "  \
      "(process-wide); `n`: OpenBLAS gets `n` threads of its own; `-1`: OpenBLAS left as the "    \
      "program set it")                                                                           \
    X(cuda_device, int, 0, 0, 1023, "SHAPEJIT_CUDA_DEVICE", "CUDA device ordinal")                \
    X(cuda_graphs, int, 64, 0, 1000000, "SHAPEJIT_CUDA_GRAPHS",                                   \
      "most CUDA graphs kept per runtime (`0`: none)")                                            \
    X(cache_max_bytes, uint64_t, UINT64_C(1) << 30, 0, UINT64_MAX, "SHAPEJIT_CACHE_MAX_BYTES",    \
      "kernel cache size; least recently used kernels are evicted past it")                       \
    X(stream_min_bytes, int64_t, 0, INT64_MIN, INT64_MAX, "SHAPEJIT_STREAM_MIN_BYTES",            \
      "CPU kernels moving more bytes than this stream their f32 outputs (non-temporal stores); "  \
      "`0`: a quarter of the last-level cache; negative: never")                                  \
    X(compile_timeout_ms, int, 60000, 1, 86400000, "SHAPEJIT_COMPILE_TIMEOUT_MS",                 \
      "a compiler run (a compile, or the `--version` probe) still running after this many "       \
      "milliseconds is killed with its process group; the unit stays eager")                     \
    X(compile_retry_ms, int, 1000, 0, 86400000, "SHAPEJIT_COMPILE_RETRY_MS",                      \
      "after its n-th failed compile a unit waits this many milliseconds times 2^(n-1), +-25%, "  \
      "before a call may queue it again (`0`: never retried)")                                    \
    X(compile_max_failures, int, 4, 1, 1000, "SHAPEJIT_COMPILE_MAX_FAILURES",                     \
      "failed compiles after which a unit is blacklisted (stays eager for good)")                 \
    X(validate_calls, int, 0, 0, 1000000, "SHAPEJIT_VALIDATE_CALLS",                              \
      "a newly compiled kernel's first calls that also run eagerly and are compared before it "   \
      "serves alone (`0`: no validation)")                                                        \
    X(validate_every, int, 0, 0, 1000000000, "SHAPEJIT_VALIDATE_EVERY",                           \
      "after that, 1 call in this many (per entry and thread) is validated again (`0`: never)")     \
    X(remote_cache_timeout_ms, int, 250, 1, 60000, "SHAPEJIT_REMOTE_CACHE_TIMEOUT_MS",            \
      "bound on one remote kernel cache operation (connect and command together); past it the "   \
      "kernel is compiled or taken from the local cache")     \
    X(prepack_max_bytes, uint64_t, UINT64_C(1) << 30, 0, UINT64_MAX, "SHAPEJIT_PREPACK_MAX_BYTES", \
      "CPU: bytes of constant weights a function keeps packed for its matrix products (an f32 "     \
      "copy: as large as f32 weights, twice f16/bf16 ones); weights past it, and all with `0`, go " \
      "through OpenBLAS unpacked")                                                               \
    X(warmup_max_shapes, int, 256, 1, 65536, "SHAPEJIT_WARMUP_MAX_SHAPES",                        \
      "the most shapes one `sj_fn_warmup` prepares (explicit and bucket edges together)")          \
    X(fuse_epilogue, int, 1, 0, 1, "SHAPEJIT_FUSE_EPILOGUE",                                       \
      "CPU: `1`: the elementwise group that consumes a matrix product's result runs inside the "  \
      "product, on each block of the result as it is finished; `0`: after it, as a pass of its "  \
      "own")                                                                                        \
    X(specialize_max_bytes, uint64_t, 0, 0, UINT64_MAX, "SHAPEJIT_SPECIALIZE_MAX_BYTES",           \
      "bytes the specialized shapes of one function may hold (code and planned arena); past it "   \
      "the least recently used are demoted to their entry's symbolic kernels (`0`: no limit)")      \
    X(graph_max_bytes, uint64_t, 0, 0, UINT64_MAX, "SHAPEJIT_GRAPH_MAX_BYTES",                     \
      "CUDA: bytes the captured graphs of one function may hold (their workspace and "            \
      "intermediates); past it the least recently replayed are evicted (`0`: no limit)")           \
    X(bucket_graphs, int, 1, 0, 1, "SHAPEJIT_BUCKET_GRAPHS",                                      \
      "CUDA: `1`: a bucketed entry's calls of every size are replayed by one graph captured at the " \
      "bucket's largest sizes, its kernels' sizes updated per call; `0`: graphs serve exact shapes " \
      "only")                                                                                       \
    X(bucket_graph_execs, int, 64, 1, 4096, "SHAPEJIT_BUCKET_GRAPH_EXECS",                         \
      "CUDA: instantiated copies of one bucket graph, each kept updated for the sizes of the last "  \
      "call it served, so a size seen before replays with no update (`1`: one copy, updated "       \
      "whenever the sizes change)")                                                                 \
    X(compile_quick, int, 1, 0, 1, "SHAPEJIT_COMPILE_QUICK",                                       \
      "`1`: an entry whose calls run eagerly gets a quick compile first where the device has one "  \
      "(CUDA: NVRTC's fast compile), then its full compile in the background, swapped in when "     \
      "ready (no CUDA graph of the quick code); `0`: the full compile only")                        \
    X(compile_ahead, int, 0, 0, 1, "SHAPEJIT_COMPILE_AHEAD",                                      \
      "`1`: when a bucketed entry gets hot, the next bucket up is traced on that call's thread and " \
      "its compile queued behind the others (`0`: off)")                                          \
    X(cuda_gemm, int, 0, 0, 5, "SHAPEJIT_CUDA_GEMM",                                               \
      "CUDA: `1`: an f16 matrix product over a constant [K, N] weight becomes a generated "        \
      "tensor-core kernel with the elementwise group after it (bias, GELU or ReLU, residual add, " \
      "cast) inside, in up to 4 tile variants timed against cuBLASLt once compiled (the winner "    \
      "kept in the kernel cache); `2`..`5`: tile variant 0..3 always, untimed (tests); `0`: "        \
      "cuBLASLt, the group after it")                                                             \
    X(cuda_gemm_ln, int, 0, 0, 1, "SHAPEJIT_CUDA_GEMM_LN",                                         \
      "CUDA, with `SHAPEJIT_CUDA_GEMM`: `1`: a generated product followed by a row group of "        \
      "[residual add,] LayerNorm takes that group inside too (the row block's last block "          \
      "normalizes it); slower than the separate kernel in a CUDA graph on an H100 (README); `0`: "  \
      "the row group runs after")                                                                  \
    X(cuda_tf32, int, 0, 0, 1, "SHAPEJIT_CUDA_TF32",                                              \
      "CUDA: `1`: f32 matrix products run on tensor cores in TF32 (10-bit mantissa inputs, f32 "    \
      "sums: about 1e-3 relative error, 3-5x faster on large products); `0`: full f32")           \
    X(cuda_pdl, int, 1, 0, 1, "SHAPEJIT_CUDA_PDL",                                                \
      "CUDA, compute capability 9.0 and later: `1`: shapejit's kernels are launched with "         \
      "programmatic dependent launch (each may start while the one before it finishes, and "       \
      "waits for its results on the device); `0`: each starts after the one before it ends")      \
    X(learn_every, int, 0, 0, 1000000, "SHAPEJIT_LEARN_EVERY",                                    \
      "every function re-learns the edges of its bucketed dimensions after every this many new "   \
      "exact shapes, on the background compile worker, and swaps them in while serving "          \
      "(`sj_fn_learn_auto`; `0`: off)")                                                             \
    X(learn_half_life, int, 65536, 0, 1000000000, "SHAPEJIT_LEARN_HALF_LIFE",                     \
      "calls after which a call's weight in the size histogram of buckets learned from traffic "   \
      "halves (an exponential window: sizes of old traffic are forgotten); while learning while "  \
      "serving is on, a learning also comes due after this many calls; `0`: every call since the " \
      "function was made counts alike")                                                           \
    X(job_queue_max, int, 4096, 1, 1000000, "SHAPEJIT_JOB_QUEUE_MAX",                             \
      "the most jobs of one kind (compiles, learnings, graph captures, the device's jobs) the "    \
      "background queue holds; one past it is refused and counted (`sj_runtime_job_counters`)")   \
    X(job_reserve_workers, int, 1, 0, 1024, "SHAPEJIT_JOB_RESERVE_WORKERS",                       \
      "compile workers kept from compiles for the short jobs (learnings, graph captures, the "     \
      "device's) while there are more workers than this; `0`: compiles may take every worker")

typedef enum sj_tunable_id {
#define SJ_X(field, type, dflt, lo, hi, env, doc) SJ_TUNE_##field,
    SJ_TUNABLE_LIST(SJ_X)
#undef SJ_X
        SJ_TUNE_COUNT
} sj_tunable_id;

/* One row, for code that walks the table (the env parser, the checks, the
 * README test). Values are widened to long double-free integers: lo/hi/dflt
 * as int64 where they fit, with is_unsigned for the uint64 rows. */
typedef struct sj_tunable {
    const char *field, *env, *doc;
    int size;        /* sizeof the field: 4 or 8 */
    int is_unsigned; /* uint64_t */
    int64_t dflt, lo, hi; /* for uint64 rows: hi is stored as INT64_MAX, meaning UINT64_MAX */
    size_t offset;   /* in sj_runtime_config */
} sj_tunable;

extern const sj_tunable sj_tunables[SJ_TUNE_COUNT];

/* Set every field of the table to its default. */
void sj_tunables_defaults(sj_runtime_config *cfg);

/* Apply the table's SHAPEJIT_* variables: a value that does not parse or
 * lies outside its range is reported once on stderr (naming the variable,
 * the value and the range) and ignored. */
void sj_tunables_from_env(sj_runtime_config *cfg);

/* SJ_EINVAL naming the field, its value and its range for the first field
 * out of range; `who` prefixes the message. */
sj_status sj_tunables_check(const sj_runtime_config *cfg, const char *who);

/* The value of a row's field in cfg (a uint64 field as its bits). */
int64_t sj_tunable_get(const sj_runtime_config *cfg, sj_tunable_id id);

/* The range check of one int row (sj_fn_options reuse the per-function
 * rows, where 0 also means "the runtime's default"). */
int sj_tunable_int_ok(sj_tunable_id id, int64_t v);

#endif
