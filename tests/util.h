/* Test helpers linked into every test program (tests/util_ref.c): a seeded
 * PRNG, tensors of any layout over tracked memory, element access for every
 * dtype as double, poison fills, tolerance checks against float64
 * references, and float64 reference implementations of the ops; the eager
 * kernel tests' cases (tests/util_eager.c); temporary directories, files,
 * log capture and clocks (tests/util_fs.c); checks shared by the backend
 * tests (tests/util_backend.c).
 *
 * Memory: every tu_tensor* allocation is tracked and released by
 * tu_free_all() (call it in each test's teardown). Not thread-safe.
 */
#ifndef SJ_TEST_UTIL_H
#define SJ_TEST_UTIL_H

#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/cache.h"
#include "base/ops.h"
#include "jit/runtime.h"
#include "jit/shapejit.h"
#include "kernels/device.h"

/* -- Random numbers (xoshiro-style 64-bit generator, seeded) -------------- */

void tu_seed(uint64_t seed);
uint64_t tu_rand(void);
double tu_uniform(double lo, double hi);    /* [lo, hi) */
int64_t tu_randint(int64_t lo, int64_t hi); /* [lo, hi] */

/* f32 -> IEEE binary16 bits, rounded to nearest even: an implementation of
 * the tests' own, independent of the library's (and of the compiler's
 * _Float16, which clang 14 lacks on x86-64). */
uint16_t tu_f32_to_f16_ref(float f);

/* In a test that needs the model's files (make model): returns from the
 * test with a visible "skipped" line when have is false. */
#define TU_NEED_MODEL(have)                                                     \
    do {                                                                        \
        if (!(have)) {                                                          \
            print_message("skipped: no model (make model)\n");                  \
            return;                                                             \
        }                                                                       \
    } while (0)

/* -- Tensors -------------------------------------------------------------- */

/* Contiguous row-major tensor; elements poisoned. */
sj_tensor tu_tensor(sj_dtype dt, int rank, const int64_t *shape);

/* A strided view of `shape` inside a larger buffer: axes laid out in memory
 * in the order `order` (order[0] outermost; NULL: natural order), the
 * innermost axis at stride 1 + gap and each outer axis `gap` elements past
 * the extent of the one inside it, with `gap` elements before the view too.
 * gap 0 with a NULL order is contiguous. The whole buffer is filled with
 * the byte 0xA5 and the view's elements poisoned (see tu_check_gaps). */
sj_tensor tu_tensor_strided(sj_dtype dt, int rank, const int64_t *shape, const int *order,
                            int64_t gap);

/* Common layouts for tu_tensor_layout: contiguous; every axis padded
 * (inner stride 2); axes reversed in memory (column-major); both. */
enum { TU_CONTIG, TU_GAP, TU_REV, TU_REVGAP, TU_LAYOUTS };
sj_tensor tu_tensor_layout(sj_dtype dt, int rank, const int64_t *shape, int layout);

/* numpy broadcast view of t to (rank, shape): t's axes align to the right;
 * new axes and size-1 axes that grow get stride 0. */
sj_tensor tu_broadcast(const sj_tensor *t, int rank, const int64_t *shape);

/* View with axes a and b swapped. */
sj_tensor tu_transpose(const sj_tensor *t, int a, int b);

void tu_free_all(void);
/* A cmocka teardown that calls tu_free_all. */
int tu_teardown(void **state);

/* Two reusable buffers of doubles for references (slot 0 or 1, at least n
 * elements), valid until the slot is asked for more or tu_free_all(). */
double *tu_refbuf(int slot, int64_t n);

/* printf into a static buffer, for check labels. */
const char *tu_label(const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;

int64_t tu_numel(const sj_tensor *t);

/* -- Element access ----------------------------------------------------------
 * i is the row-major logical index over t's shape. */

double tu_get(const sj_tensor *t, int64_t i);
int64_t tu_geti(const sj_tensor *t, int64_t i);       /* integer and bool dtypes, exact */
void tu_set(const sj_tensor *t, int64_t i, double v); /* stored as tu_round(dtype, v) */
void tu_seti(const sj_tensor *t, int64_t i, int64_t v);
/* Every element from v[0 .. numel). */
void tu_set_all(const sj_tensor *t, const double *v);
void tu_seti_all(const sj_tensor *t, const int64_t *v);

/* The value v becomes when stored in dt: f32/f16/bf16 round to nearest even
 * (implemented here with frexp/nearbyint, independently of base/half.h),
 * ints truncate and saturate (NaN -> 0), bool is v != 0. */
double tu_round(sj_dtype dt, double v);

/* Encodings used by tu_set, exposed to test base/half.h against. */
uint16_t tu_f16_bits(double v);
uint16_t tu_bf16_bits(double v);
double tu_f16_value(uint16_t h);

/* -- Filling -------------------------------------------------------------- */

/* Never zero: floats uniform in +-[0.05, 2], ints in [-5, 5] \ {0}; bool is
 * random 0/1. */
void tu_fill_random(const sj_tensor *t);
/* Uniform in [lo, hi] (ints: integers in [lo, hi], zero allowed). */
void tu_fill_range(const sj_tensor *t, double lo, double hi);
/* Poison every element: a signalling NaN payload no kernel produces for
 * floats, 0x5AA5... for ints, 0xA5 (neither 0 nor 1) for bool. */
void tu_poison(const sj_tensor *t);
int tu_is_poison(const sj_tensor *t, int64_t i);

/* -- Checking ------------------------------------------------------------- */

/* Default tolerance: f32 1e-5, f16 2e-3, bf16 2e-2, ints and bool 0. */
double tu_tol(sj_dtype dt);

/* out against ref (tu_numel(out) doubles, row-major). Passes when no element
 * is poison; NaN in ref is matched by NaN in out and NaN never passes
 * otherwise; infinities match exactly; each element has
 * |out - ref| <= tol * (|ref| + 0.1 * rms(ref)); and the relative norm
 * ||out - ref|| / ||ref|| <= tol. tol 0 means exact. Prints the first
 * mismatches to stderr, labelled with `what`. Returns 1 on pass. */
int tu_check(const sj_tensor *out, const double *ref, double tol, const char *what);

/* The same with the error scaled by mag[i] (>= 0) instead of |ref[i]|: for
 * results that sum terms which may cancel (matmul: mag = sum |a||b|), whose
 * rounding error follows the terms, not the result. mag NULL is tu_check. */
int tu_check_mag(const sj_tensor *out, const double *ref, const double *mag, double tol,
                 const char *what);

/* For a tu_tensor_strided view: the bytes of its buffer outside the view's
 * elements are still 0xA5 (nothing written outside the view). */
int tu_check_gaps(const sj_tensor *t, const char *what);

/* -- float64 references ------------------------------------------------------
 * Operands as for the eager kernels (already broadcast where elementwise);
 * out holds the result row-major. Float math in double; integer ops exact in
 * int64 (wrapping) with the documented semantics. */

double tu_ref_unary1(sj_op op, double x);
double tu_ref_binary1(sj_op op, double a, double b); /* compare ops give 0/1 */
int64_t tu_ref_binary1_i(sj_op op, int64_t a, int64_t b);

void tu_ref_unary(sj_op op, const sj_tensor *x, double *out);
void tu_ref_binary(sj_op op, const sj_tensor *a, const sj_tensor *b, double *out);
void tu_ref_where(const sj_tensor *c, const sj_tensor *a, const sj_tensor *b, double *out);
void tu_ref_cast(const sj_tensor *x, sj_dtype to, double *out);
void tu_ref_reduce(sj_op op, const sj_tensor *x, int axis, double *out);
void tu_ref_softmax(const sj_tensor *x, int axis, double *out);
void tu_ref_layer_norm(const sj_tensor *x, const sj_tensor *g, const sj_tensor *b, double eps,
                       double *out);
void tu_ref_rms_norm(const sj_tensor *x, const sj_tensor *g, double eps, double *out);
/* mag (NULL or like out): sum |a||b| for matmul, sum p |v| for attention. */
void tu_ref_matmul(const sj_tensor *a, const sj_tensor *b, double *out, double *mag);
void tu_ref_attention(const sj_tensor *q, const sj_tensor *k, const sj_tensor *v,
                      const sj_tensor *lengths, double scale, int causal, double *out, double *mag);
void tu_ref_concat(const sj_tensor *xs, int n, int axis, double *out);
void tu_ref_gather(const sj_tensor *table, const sj_tensor *idx, double *out);

/* -- Eager kernel cases (tests/util_eager.c) -----------------------------------
 * Shared by test_cpu_kernels and test_cuda_eager: operands, their float64
 * references (in tu_refbuf slot 0) and the shapes and layouts each op is
 * tested at. A case list calls run once per case, always in the same order;
 * cuda: the CUDA test's list (more cases for the CUDA kernels' paths, a few
 * of the CPU test's left out). Tensors are random unless said otherwise. */

extern const sj_dtype tu_floats[3], tu_numeric[5], tu_all[6];
extern const sj_op tu_unary_ops[12];

/* t after tu_fill_random. */
sj_tensor tu_filled(sj_tensor t);
/* A tu_tensor_layout, filled at random. */
sj_tensor tu_random(sj_dtype dt, int rank, const int64_t *shape, int layout);
/* A comparison (its result is bool). */
int tu_is_cmp(sj_op op);

/* Asserts: max (sj_rt_max_f32 as some build compiled it) agrees with a
 * plain loop on every length to 100, with NaN or an infinity at every
 * position (the first NaN is returned; a row of -inf gives -inf). `what`
 * names the build in a failure. */
void tu_check_max_f32(float (*max)(const float *, int64_t), const char *what);

/* Unary: x filled for op (log and the roots in [0.05, 4], else at random);
 * the cases over every op and the numeric dtypes it takes. */
typedef void (*tu_unary_run)(sj_op op, sj_dtype dt, int rank, const int64_t *shape, int lx, int ly);
void tu_fill_unary_input(sj_op op, const sj_tensor *x);
void tu_unary_cases(bool cuda, tu_unary_run run);
/* Special values (NaN, infinities, zeros, tiny, huge ...) and an f32 [18]
 * tensor of them; got is right for want: NaN for NaN, equal infinities, or
 * |got - want| <= 1e-6 max(|want|, 1). */
extern const double tu_special_values[18];
sj_tensor tu_special_tensor(void);
int tu_special_ok(double got, double want);

/* Binary and comparisons: a and b of their own shapes broadcast to y's
 * [rank, ys], laid out as given; every op over the numeric dtypes (no
 * integer pow), then comparisons of bools. */
typedef void (*tu_binary_run)(sj_op op, sj_dtype dt, int rank, const int64_t *ys, int ra, const int64_t *as, int la,
                              int rb, const int64_t *bs, int lb, int ly);
void tu_binary_cases(bool cuda, tu_binary_run run);
/* pow with a positive base: a [50] in [0.1, 3], b [50] (padded) in [-3, 3];
 * the reference of a ** b. */
double *tu_pow_operands(sj_dtype dt, sj_tensor *a, sj_tensor *b);
/* Integer semantics of op on the given integers (dt: i32 or i64):
 * division, pow, wrapping add/sub/mul, min/max at the limits. */
typedef void (*tu_ints_run)(sj_op op, sj_dtype dt, int64_t n, const int64_t *av, const int64_t *bv,
                            const int64_t *want);
void tu_int_cases(sj_dtype dt, tu_ints_run run);
/* NaN on either side: a [40] (a NaN at 3) and a NaN scalar s broadcast to
 * [40], s on the left (side 1) or right; every op but pow, float dtypes;
 * ref: op applied in that order. */
typedef void (*tu_nan_run)(sj_op op, sj_dtype dt, const sj_tensor *a, const sj_tensor *s, int side,
                           const double *ref);
void tu_nan_binary_cases(tu_nan_run run);
/* where case c (0..3) over y [5, 70]: st the stored c (bool), a and b
 * (laid out as lb), v the same broadcast to y, *ly y's layout; the
 * reference. */
double *tu_where_case(sj_dtype dt, int c, int lb, sj_tensor *st, sj_tensor *v, int *ly);

/* Casts: x filled as a cast's source (ints and bool in [-300, 300]);
 * special values as dt (1-D), and i64 ones (limits, past 2^32, past
 * f16's range). */
void tu_fill_cast_input(const sj_tensor *x);
sj_tensor tu_cast_specials(sj_dtype dt);
sj_tensor tu_cast_int_specials(void);
/* Copies from a transposed view x of x0 into y (contiguous, or rows padded
 * by 3) for every dtype: run copies x into y; then y is checked (exact),
 * the padding still poison (asserts). */
typedef void (*tu_copy_run)(const sj_tensor *x0, const sj_tensor *x, const sj_tensor *y, const char *what);
void tu_transposed_copy_cases(tu_copy_run run);

/* Reductions (keepdim): y's shape into ys, the axis (non-negative); every
 * reduce op over the numeric dtypes (no integer mean). */
typedef void (*tu_reduce_run)(sj_op op, sj_dtype dt, int rank, const int64_t *shape, int axis, int lx, int ly);
int tu_reduce_shape(int rank, const int64_t *shape, int axis, int64_t *ys);
void tu_reduce_cases(bool cuda, tu_reduce_run run);
/* Softmax: when x has 3 rows or more, its first row all -inf, every
 * other element of the second -inf, a NaN in the third; the cases over the
 * float dtypes (special: with those). */
typedef void (*tu_softmax_run)(sj_dtype dt, int rank, const int64_t *shape, int axis, int lx, int ly, int special);
void tu_softmax_specials(const sj_tensor *x);
void tu_softmax_cases(bool cuda, tu_softmax_run run);
/* Layer / RMS norms over the last axis, eps 1e-5: x, g (padded) and b; the
 * reference with g and b as asked; the cases over the float dtypes. */
typedef void (*tu_norm_run)(int rms, sj_dtype dt, int rank, const int64_t *shape, int lx, int ly, int with_g,
                            int with_b);
double *tu_norm_operands(int rms, sj_dtype dt, int rank, const int64_t *shape, int lx, sj_tensor *x, sj_tensor *g,
                         sj_tensor *b, int with_g, int with_b);
void tu_norm_cases(bool cuda, tu_norm_run run);

/* Matmul: a [..., M, K] (ta: stored transposed, [..., K, M]), b likewise,
 * y [..., M, N] (ty likewise), with batch shapes ab, bb broadcast to yb
 * (nb axes). Shapes as stored (a, b, y) and the full shapes a and b are
 * broadcast to (af, bf); rank nb + 2. */
typedef struct tu_mm_shapes {
    int rank;
    int64_t a[SJ_MAX_RANK], b[SJ_MAX_RANK], y[SJ_MAX_RANK], af[SJ_MAX_RANK], bf[SJ_MAX_RANK];
} tu_mm_shapes;
typedef void (*tu_matmul_run)(sj_dtype dt, int nb, const int64_t *yb, const int64_t *ab, const int64_t *bb,
                              int64_t M, int64_t K, int64_t N, int la, int ta, int lb, int tb, int ly, int ty);
void tu_matmul_shapes(tu_mm_shapes *s, int nb, const int64_t *yb, const int64_t *ab, const int64_t *bb, int64_t M,
                      int64_t K, int64_t N, int ta, int tb, int ty);
/* The matrix view of a stored operand: transposed back when it is. */
sj_tensor tu_matmul_view(const sj_tensor *t, int nb, int transposed);
void tu_matmul_cases(bool cuda, tu_matmul_run run);
/* One unbatched M x K x N product of dt in each of the 16 combinations of
 * stored-transposed operands and output, over two layouts. */
void tu_matmul_transposes(tu_matmul_run run, sj_dtype dt, int64_t M, int64_t K, int64_t N);
/* Integer products past 2^31: a [1, 2], b [2, 1], y [1, 1] (poisoned) of
 * dt (i32 or i64); the product, exact in i64 and wrapped in i32. */
int64_t tu_matmul_wrap_case(sj_dtype dt, sj_tensor *a, sj_tensor *b, sj_tensor *y);

/* Attention: q [B, H, Sq, D], k [B, H, Sk, D], v [B, H, Sk, Dv], y [B, H,
 * Sq, Dv] (poisoned); lay 0: contiguous, 1: [B, S, H, D] in memory, 2:
 * every axis padded (q, v, y), 3: [B, H, D, S]. l [B] of ldt (laid out as
 * ll) holds lens when not NULL (lp: &l, else NULL); scale 1 / sqrt(D) (1
 * for D 0); the reference and its magnitudes (tu_refbuf slots 0 and 1). */
typedef struct tu_attention {
    sj_tensor q, k, v, y, l;
    const sj_tensor *lp;
    double scale, *ref, *mag;
} tu_attention;
typedef void (*tu_attention_run)(sj_dtype dt, int64_t B, int64_t H, int64_t Sq, int64_t Sk, int64_t D, int64_t Dv,
                                 const int64_t *lens, sj_dtype ldt, int causal, int lay);
void tu_attention_case(tu_attention *a, sj_dtype dt, int64_t B, int64_t H, int64_t Sq, int64_t Sk, int64_t D,
                       int64_t Dv, const int64_t *lens, sj_dtype ldt, int ll, int causal, int lay);
/* Another y of case (B, H, Sq, Dv, lay). */
sj_tensor tu_attention_out(sj_dtype dt, int64_t B, int64_t H, int64_t Sq, int64_t Dv, int lay);
void tu_attention_cases(bool cuda, tu_attention_run run);

/* Concat of 4 inputs (one empty) along each axis into y [ys] for every
 * dtype and layout lay (inputs laid out from lay on); the reference. */
typedef void (*tu_concat_run)(sj_dtype dt, int axis, int lay, const sj_tensor *xs, const int64_t *ys,
                              const double *ref);
void tu_concat_cases(tu_concat_run run);
/* Gather: table t [ts] (tr axes), indices idx [is] (ir axes, in range) of
 * idt, both laid out as lt; y's shape (ir + tr - 1 axes) into ys; the
 * reference. The cases for every dtype and layout; indices out of range at
 * position 4 (10) and 5 (-1) of a [2, 3] index into a table of 10 rows. */
typedef void (*tu_gather_run)(sj_dtype dt, sj_dtype idt, int tr, const int64_t *ts, int ir, const int64_t *is,
                              int lt, int ly);
double *tu_gather_operands(sj_dtype dt, sj_dtype idt, int tr, const int64_t *ts, int ir, const int64_t *is, int lt,
                           sj_tensor *t, sj_tensor *idx, int64_t *ys);
void tu_gather_cases(tu_gather_run run);
extern const int64_t tu_gather_bad[2][6];

/* -- Temporary directories, files, logs, clocks (tests/util_fs.c) ----------
 * Helpers marked "asserts" fail the running cmocka test on error. */

/* Log lines captured from any thread (tu_log_sink as a runtime's log_fn,
 * the logbook as its log_user); text beyond the buffer is dropped. */
typedef struct tu_logbook {
    pthread_mutex_t lock;
    char text[32768];
    size_t len;
} tu_logbook;

void tu_log_sink(void *user, unsigned topic, const char *msg);
/* Some captured line contains `what`. */
bool tu_logged(tu_logbook *lb, const char *what);

/* A fresh private directory $TMPDIR/<name>-XXXXXX (/tmp without TMPDIR)
 * into dir (n bytes): 0, or -1 when it cannot be made. */
int tu_mkdtemp(char *dir, size_t n, const char *name);
/* Remove dir and everything below it (links are not followed). */
void tu_rmtree(const char *dir);

/* A cmocka state: a private temporary directory, and a runtime whose log
 * configuration (every topic) fills `log` (nothing else of rt is set). */
typedef struct tu_fixture {
    char dir[PATH_MAX];
    sj_runtime rt; /* only its log configuration is used */
    tu_logbook log;
} tu_fixture;

/* For cmocka setup/teardown functions: *state becomes a new tu_fixture
 * whose directory is named after `name` (see tu_mkdtemp); 0 or -1. The
 * teardown removes the directory and frees the fixture. */
int tu_fixture_setup(void **state, const char *name);
int tu_fixture_teardown(void **state);

/* Monotonic clock in milliseconds. */
double tu_now_ms(void);

/* The quiet CPU runtime the tests start from: sj_runtime_config_init's
 * defaults with backend CPU, no log topics, no persistent kernel cache
 * (cache_dir NULL) and one exec thread; a test sets what it checks on top. */
sj_runtime_config tu_cpu_config(void);
/* Its CUDA variant, for the GPU tests: the defaults with backend CUDA, no
 * log topics and no persistent kernel cache (exec threads left at their
 * default); a test sets what it checks on top. */
sj_runtime_config tu_cuda_config(void);
/* Whether a runtime of tu_cuda_config can be made (it is made and
 * destroyed); when not, prints "skipped: no CUDA device (<why>)" on
 * stdout, the line the GPU tests show where there is no GPU. */
bool tu_cuda_present(void);

/* A virtual clock for a runtime (cfg.clock_ns), for tests that drive time:
 * nanoseconds, moved only by tu_clock_advance_ms, from any thread; start
 * it where the test wants, e.g. static tu_clock clk = {1000 * 1000000}. */
typedef struct tu_clock {
    _Atomic int64_t ns;
} tu_clock;

/* cfg's clock becomes c (clock_ns and clock_user). */
void tu_clock_use(sj_runtime_config *cfg, tu_clock *c);
void tu_clock_advance_ms(tu_clock *c, int64_t ms);

/* sj_fn_explain's text for fn (malloc'd: the caller frees it). */
char *tu_explain(const sj_fn *fn);

/* Flip every bit of the byte at `offset` of an existing file (asserts). */
void tu_flip_byte(const char *path, long offset);
/* The file holds exactly the len bytes at data (asserts). */
void tu_expect_file(const char *path, const void *data, size_t len);

/* Start n threads fn(jobs + i * job_size) and join them all. */
void tu_run_threads(int n, void *(*fn)(void *), void *jobs, size_t job_size);

/* -- Backend checks (tests/util_backend.c); all assert ------------------ */

/* Open a cache (no size cap) in <dir>/cache; its path into cdir when not
 * NULL (PATH_MAX bytes). */
sj_cache *tu_open_cache(const char *dir, char *cdir);

/* b compiles req into r (SJ_OK) with the compiler: a module, not from the
 * cache, compile_ms > 0, a 64-digit key. */
void tu_compile_fresh(sj_backend *b, const sj_compile_req *req, sj_compile_result *r);

/* b compiles the runtime header (sj_kernel_rt_text) followed by `tail`,
 * which defines `symbol`, into r (SJ_OK); returns that function, as
 * generated kernels would see the header. The caller unloads r->module. */
void *tu_compile_rt_unit(sj_backend *b, const char *tail, const char *symbol, const char *tag, sj_compile_result *r);

/* b compiles req into r (SJ_OK); the milliseconds it took. */
double tu_compile_timed(sj_backend *b, const sj_compile_req *req, sj_compile_result *r);

/* b compiles req into r (SJ_OK) from the persistent cache: from_cache,
 * compile_ms 0, the same key as `key`; the milliseconds it took. */
double tu_compile_cached(sj_backend *b, const sj_compile_req *req, sj_compile_result *r, const char *key);

/* b rejects with SJ_EINVAL: a NULL request, 65 symbols, a source_len that
 * takes in the NUL after the source, and a NULL result. valid: an
 * acceptable request whose source is NUL-terminated at source_len. */
void tu_check_invalid_requests(sj_backend *b, sj_compile_req valid);

/* valid with its source copied into buf (at least source_len + 8 bytes)
 * and followed by "garbage" instead of a NUL: only source_len counts. */
sj_compile_req tu_unterminated(sj_compile_req valid, char *buf);

/* Checks that a result's kernels work (asserts). */
typedef void (*tu_kernels_check)(const sj_compile_result *r);

/* req, compiled into r already, compiled again: the same key, r's module
 * shared (r's reference dropped, the second's kernels still pass check);
 * unloading NULL is a no-op. Unloads the second module. */
void tu_check_second_compile(sj_backend *b, const sj_compile_req *req, const sj_compile_result *r,
                             tu_kernels_check check);

/* b (with a cache in cdir) compiles req and keeps it loaded; the cached
 * artifact (<key>.<ext>) is dated an hour back; a second compile shares
 * the loaded unit and dates the artifact now, so that the LRU eviction of
 * other processes sees it in use (the second's kernels pass check). Unloads
 * both. */
void tu_check_shared_touches_cache(sj_backend *b, const char *cdir, const sj_compile_req *req, const char *ext,
                                   tu_kernels_check check);

/* b (with cache, in cdir; log: its log) compiles req; the cached artifact
 * (<key>.<ext>) gets a byte flipped: the checksum catches it (counted as
 * corrupt), req is recompiled (kernels pass check) and re-stored, so the
 * next compile hits; then an entry that verifies but does not load (junk):
 * a miss, logged as unusable, recompiled (check), replaced: the next
 * compile hits again (its kernels checked too when check_hit). */
void tu_check_corrupt_cache(sj_backend *b, sj_cache *cache, const char *cdir, const sj_compile_req *req,
                            const char *ext, const void *junk, size_t junk_len, tu_logbook *log,
                            tu_kernels_check check, bool check_hit);

/* b made with test_fail: compiling req fails as the hook says
 * (SJ_EBACKEND, no module, the hook's log). */
void tu_check_hook_failure(sj_backend *b, const sj_compile_req *req, sj_compile_result *r);
/* b made with test_delay_ms = ms: req compiles, taking ms or more. */
void tu_compile_delayed(sj_backend *b, const sj_compile_req *req, sj_compile_result *r, double ms);

/* A compile from a thread of its own: its backend and number; the thread
 * function sets the status, the count of wrong kernel results (-1: a call
 * failed) and whether the result came from the cache. */
typedef struct tu_compile_job {
    sj_backend *b;
    int id;
    sj_status st;
    int wrong;
    bool from_cache;
} tu_compile_job;

/* Two rounds (compiled, then from the cache) of 4 threads fn(job) at once,
 * each compiling a unit of its own: every one succeeds with no wrong
 * result (and, when check_from_cache, comes from the cache in the second
 * round only); the cache stored 4 units and hit 4 times. */
void tu_check_concurrent_compiles(sj_backend *b, sj_cache *cache, void *(*fn)(void *), bool check_from_cache);

#endif /* SJ_TEST_UTIL_H */
