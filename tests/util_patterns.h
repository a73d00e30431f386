/* The fusion patterns shared by test_fusion (C code generation, CPU) and
 * test_codegen_cuda (CUDA code generation) (tests/util_patterns.c): model
 * functions, their input makers, float64 references of a few, the pattern
 * table; the dim policy that makes sizes symbolic; tracing and fusing a
 * pattern; the eager run every fused run is compared with; and the driver
 * that traces a pattern at random sizes, builds both forms of its kernels
 * and runs them.
 *
 * Models read parameters from tu_params (set by the test before running a
 * pattern that captures some). Tensors come from tests/util.h (tracked:
 * tu_free_all releases them).
 */
#ifndef SJ_TEST_UTIL_PATTERNS_H
#define SJ_TEST_UTIL_PATTERNS_H

#include <stdbool.h>
#include <stdint.h>

#include "jit/exec.h"
#include "jit/trace.h"
#include "specialize/fusion.h"
#include "tests/util.h"

#define TU_MAXD 4 /* sizes a pattern draws */

/* -- Patterns ---------------------------------------------------------------- */

/* Inputs of a pattern at the drawn sizes d (floats of dtype dt). */
typedef void (*tu_make_fn)(const int64_t *d, sj_dtype dt, sj_tensor *ins);
/* float64 reference of output 0 (row-major). */
typedef void (*tu_ref_fn)(const sj_tensor *ins, double *out);

typedef struct tu_pattern {
    const char *name;
    sj_model_fn model;
    int n_in;
    tu_make_fn make;
    int n_dims;
    int64_t lo[TU_MAXD], hi[TU_MAXD]; /* each size drawn in [lo, hi] */
    bool vary;                        /* the symbolic plan may run at other sizes */
    tu_ref_fn ref;                    /* float64 reference of output 0, or NULL */
    int64_t fixed[4];                 /* sizes the policy keeps constant (0 ends) */
} tu_pattern;

/* Parameters the models capture: [0] W [24, 40] and [1] bias [40] of
 * tu_pat_mmgelu; the rest are free for the tests' own models. */
extern sj_tensor tu_params[8];

/* A contiguous random tensor (tu_fill_random), as the makers use. */
sj_tensor tu_rnd(sj_dtype dt, int rank, const int64_t *shape);
/* One input x [d0, d1]. */
void tu_mk_2d(const int64_t *d, sj_dtype dt, sj_tensor *in);

/* w1: y = gelu(x*a + b) * sigmoid(x); x [S, H], a, b [H] */
extern const tu_pattern tu_pat_w1, tu_pat_w1_big;
/* w2: h = x + r; y = gelu(layer_norm(h, g, b)); outputs y, h */
extern const tu_pattern tu_pat_w2;
/* layer norm of rows whose mean is large against their spread: x = 4000 +
 * U(-1, 1) [S, N], g, b [N]; rows of 5 .. 900, long 1025 .. 9090 */
extern const tu_pattern tu_pat_ln_offset, tu_pat_ln_offset_long;
/* w3: softmax(scores * 0.125 + mask [NH, 1, S], -1); masked: a mask of
 * -inf over head 0 (its rows softmax to zeros) and every third column */
extern const tu_pattern tu_pat_w3, tu_pat_w3_masked;
/* bias + gelu after a matmul (W, bias: tu_params[0], [1]) */
extern const tu_pattern tu_pat_mmgelu;
/* bias adds after matmuls (the same W, bias): two that become the
 * product's epilogue (x [d0, 24] @ W + bias; a batched xb [3, d0, 24] @ W
 * + an input bias [1, 40]) and two that cannot (the product read twice;
 * the product an output) */
extern const tu_pattern tu_pat_mmbias;
/* a pointwise chain over a transposed input and a slice with a symbolic
 * end; x [A, B], z [B, A + 4] */
extern const tu_pattern tu_pat_views;
/* a non-contiguous input (exact strides), a permute and a stepped slice */
extern const tu_pattern tu_pat_strided;
/* a reshape after a slice (a view) and a reshape needing a copy */
extern const tu_pattern tu_pat_reshape;
/* sum / mean / amax over the last axis, keepdim 0 and 1, with epilogues;
 * long: rows of 1500 .. 5000 */
extern const tu_pattern tu_pat_reduce, tu_pat_reduce_long;
/* RMS norm with and without g; softmax (its epilogue reads the prologue),
 * layer norm and mean; rows of 7 .. 60, mid 1025 .. 8192, long 9061 ..
 * 9090 (past the CPU kernels' stack buffer) */
extern const tu_pattern tu_pat_rows, tu_pat_rows_mid, tu_pat_rows_long;
/* casts and where in one group */
extern const tu_pattern tu_pat_casts;
/* integer and bool ops; a, b i32, bb bool, l i64, all [S, N] */
extern const tu_pattern tu_pat_ints;
/* a value used by two groups (a NODE softmax and a ROW sum) */
extern const tu_pattern tu_pat_shared;
/* an output that is an input, one listed twice, a view, constants, and a
 * sum over a rank-1 value (a ROW group of one row) */
extern const tu_pattern tu_pat_outs;
/* sum (keepdim 0, with an epilogue) and mean (keepdim 1) of rows that may
 * be empty: sum 0, mean NaN */
extern const tu_pattern tu_pat_sum0;

/* -- Tracing and fusing --------------------------------------------------------- */

/* Dim policy: with sym, every size >= 2 that is not in `fixed` becomes a
 * symbol (in [2, inf)), equal sizes sharing one; else sizes are constant.
 * Records where each symbol was first seen. */
typedef struct tu_pol {
    bool sym;
    const int64_t *fixed; /* sizes kept constant (0 ends), e.g. a hidden
                             size that parameters fix anyway */
    int n;
    int64_t size[64];
    int sym_of[64];
    int in[64], ax[64]; /* where each symbol was first seen */
} tu_pol;

sj_expr tu_policy(void *ctx, sj_exprs *ex, int input, int axis, int64_t size);

/* pt's sizes drawn at random. */
void tu_random_dims(const tu_pattern *pt, int64_t *d);

/* Are the input sizes of b consistent with the trace of a (the same sizes
 * equal, the same sizes below 2, and all the same when not symbolic)? */
bool tu_same_signature(const tu_pol *pl, const sj_tensor *a, const sj_tensor *b, int n);

/* Trace pt on ins with pl's policy (pl: {.sym, .fixed = pt->fixed}) and
 * fuse; the graph into *g. sv (when not NULL): each symbol's value at ins'
 * sizes. Asserts success. */
sj_fplan *tu_pattern_plan(const tu_pattern *pt, const sj_tensor *ins, tu_pol *pl, sj_graph **g, int64_t *sv);

/* Print the generated code of both forms (from their "-- generated"
 * line) when SJ_SHOW_CODE is set; free them, the plan and the graph. */
void tu_codegen_done(char *spec, char *sym, sj_fplan *p, sj_graph *g);

/* -- Running -------------------------------------------------------------------- */

/* Output tensors of g at the symbols' values sv, eo and fo (poisoned);
 * g run eagerly with the CPU ops on ins into eo (asserts success). x is
 * left as that run's request (rt, pool, a fresh arena hint), for the
 * caller's fused runs. */
void tu_pattern_eager(sj_runtime *rt, sj_pool *pool, const sj_graph *g, const sj_tensor *ins, const int64_t *sv,
                      const char *what, sj_exec *x, sj_tensor *eo, sj_tensor *fo);

/* Tolerance of fused outputs against eager ones: f32 1e-5, f16 1e-2,
 * bf16 6e-2, exact otherwise. */
double tu_fused_tol(sj_dtype dt);

/* out (a fused run's output) against eager's e within tu_fused_tol; for
 * halves the error is scaled by |e| + rms(e) (eager rounds every
 * intermediate, fused code only its results, so errors scale with the
 * output, not each element). 1 on pass; mismatches printed with label. */
int tu_check_like_eager(const sj_tensor *out, const sj_tensor *e, const char *label);
/* The same at the tolerance of the precision `prec` the values carry: an
 * f32 output cast from an f16 product holds f16 values, and two f16
 * products that sum in different orders may round 1 ulp apart. */
int tu_check_like_eager_as(const sj_tensor *out, const sj_tensor *e, sj_dtype prec, const char *label);

/* How a test builds and runs a plan's generated kernels. form 0: the
 * kernels specialized at sv (names prefixed "spec_"); form 1: the symbolic
 * ones (sv NULL, "sym_"). */
typedef struct tu_pattern_target {
    void (*build)(const sj_graph *g, const sj_fplan *p, const int64_t *sv, int form, const char *what);
    /* Run the plan with form's kernels on ins at the symbols' values sv,
     * compare with eager execution (and ref, when not NULL). */
    void (*run)(const sj_graph *g, const sj_fplan *p, int form, const sj_tensor *ins, const int64_t *sv,
                tu_ref_fn ref, const char *what);
    void (*unload)(int form);
    bool runs; /* false: build only */
} tu_pattern_target;

/* Trace pt at random sizes (or `force`), static or symbolic, with floats
 * of dtype dt; fuse; build the specialized kernels and, symbolic, the
 * symbolic ones; when tg->runs, run at the traced sizes and, symbolic and
 * pt->vary (without force), at three other sizes with the same signature
 * (the first with a size-2 edge). */
void tu_run_pattern(const tu_pattern *pt, bool symbolic, sj_dtype dt, const int64_t *force,
                    const tu_pattern_target *tg);

#endif /* SJ_TEST_UTIL_PATTERNS_H */
