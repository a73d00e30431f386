/* The graph IR: values and nodes in topological order.
 *
 * A value is a tensor with a dtype and a symbolic shape (expression ids in
 * the graph's pool). It is an input of the function, a parameter captured by
 * reference, a scalar constant, or the result of a node. Nodes are in a
 * topological order (a node's operands are always values defined before
 * it): the order they were traced in while tracing, then the canonical
 * order (sj_graph_canonicalize) once the trace is finished.
 *
 * A graph is built by one thread (the tracer) and immutable afterwards, so
 * any number of threads may execute it concurrently.
 */
#ifndef SJ_GRAPH_H
#define SJ_GRAPH_H

#include <stdbool.h>
#include <stdint.h>

#include "base/ops.h"
#include "jit/shapejit.h"
#include "shapes/expr.h"

typedef enum sj_val_kind {
    SJ_VAL_INPUT,  /* index = input position */
    SJ_VAL_PARAM,  /* index = position in graph->params */
    SJ_VAL_CONST,  /* rank 0; index = position in graph->consts */
    SJ_VAL_NODE,   /* index = producing node */
} sj_val_kind;

typedef struct sj_value {
    sj_dtype dtype;
    uint8_t kind;   /* sj_val_kind */
    uint8_t weak;   /* a weak scalar (adopts the other operand's dtype) */
    int8_t rank;
    int32_t index;
    sj_expr shape[SJ_MAX_RANK];
} sj_value;

/* Attributes of a node; which fields mean something depends on the op. */
typedef struct sj_attrs {
    int32_t axis;       /* reduce, softmax, concat, slice */
    int32_t keepdim;    /* reduce */
    int32_t causal;     /* attention */
    sj_dtype dtype;     /* cast */
    double f;           /* eps (norms), scale (attention) */
    int8_t perm[SJ_MAX_RANK]; /* permute */
    sj_expr start;      /* slice: first index (already clamped) */
    int64_t step;       /* slice */
} sj_attrs;

typedef struct sj_node {
    sj_op op;
    int32_t out;        /* value id of the result */
    int32_t in_off;     /* operands: graph->args[in_off .. in_off + n_in) */
    int32_t n_in;       /* an operand may be -1 (absent optional) */
    sj_attrs a;
    /* Bias adds done by their product (sj_graph_mark_bias_adds): on a
     * matmul, the node index of its add; on that add, SJ_FOLDED; else -1. */
    int32_t fold;
} sj_node;

#define SJ_FOLDED (-2)

/* A scalar constant: its value, and 8 bytes of storage in its dtype that a
 * rank-0 descriptor points at. */
typedef struct sj_const {
    int64_t bits;
    double value;
} sj_const;

typedef struct sj_graph {
    sj_exprs *ex;       /* owns every shape expression */
    int n_inputs;

    sj_value *vals;
    int n_vals, cap_vals;
    sj_node *nodes;
    int n_nodes, cap_nodes;
    int32_t *args;
    int n_args, cap_args;
    int32_t *outputs;
    int n_outputs, cap_outputs;

    sj_tensor *params;  /* descriptors copied; data owned by the caller */
    int n_params, cap_params;
    sj_const *consts;   /* scalar constants */
    int n_consts, cap_consts;

    /* Device copies, for a backend whose kernels read device memory (set
     * when the entry is made; released with the graph): the constants' bits
     * (8 bytes each) and the parameters. */
    void *dev_consts;
    sj_tensor *dev_params;
    void (*dev_release)(void *ctx, struct sj_graph *g);
    void *dev_ctx;

    /* Per node (n_nodes slots; NULL until the entry is made, and on
     * backends that do not pack): a matrix product's constant b packed
     * for the device's kernels (the CPU's sj_cpu_packed), NULL for every
     * other node. The slots are written before the entry is published and
     * only read after; the copies belong to the function (its pack cache),
     * which outlives its graphs. The array is freed with the graph. */
    const void **packed;
} sj_graph;

/* Where constant k's bits, and parameter k, are for a kernel on `device`. */
void *sj_graph_const_data(const sj_graph *g, int k, sj_device device);
sj_tensor sj_graph_param(const sj_graph *g, int k, sj_device device);

sj_graph *sj_graph_create(int n_inputs);
void sj_graph_destroy(sj_graph *g);

/* Builders: return the new id, or -1 on allocation failure. */
int32_t sj_graph_add_value(sj_graph *g, const sj_value *v);
int32_t sj_graph_add_node(sj_graph *g, sj_op op, const int32_t *ins, int n_in, const sj_attrs *a,
                          const sj_value *out);
int32_t sj_graph_add_const(sj_graph *g, double v, sj_dtype dt, bool weak);
int32_t sj_graph_add_param(sj_graph *g, const sj_tensor *w, const sj_value *v);
int sj_graph_add_output(sj_graph *g, int32_t val);

static inline const int32_t *sj_node_ins(const sj_graph *g, const sj_node *n) {
    return g->args + n->in_off;
}

/* Put a traced graph in its canonical order (jit/ir/canon.c): nodes in
 * the post-order of a walk from the outputs (in the user's order) over
 * each node's operands (in argument order), dead nodes after it from their
 * roots in structural-hash order; parameters and constants numbered by
 * first use (unused ones dropped); values laid out as inputs, parameters,
 * constants, node results. The result depends on the graph's structure
 * only, not on the order the model function made its ops, so generated
 * kernels and their cache keys are the same for any evaluation order of
 * nested op calls. Outputs keep their order and inputs their positions.
 * Tracing calls it before marking bias adds (it clears sj_node.fold).
 * Returns SJ_OK, or SJ_ENOMEM with the graph unchanged. */
sj_status sj_graph_canonicalize(sj_graph *g);

/* Store double v into 8 bytes of constant storage in dtype dt. */
void sj_const_store(int64_t *slot, double v, sj_dtype dt);

/* Mark the bias adds a float matmul can do as it writes its result (see
 * sj_node.fold): an add of the product, read by nothing else and not an
 * output, and of an input or parameter of the product's dtype whose sizes
 * are 1 but the last, which is the product's. Eager execution runs such a
 * pair as one product with a bias, and fusion makes it one NODE group, so
 * both run the same product kernels. Tracing calls it. */
void sj_graph_mark_bias_adds(sj_graph *g);

/* The bias of a matmul whose add is folded into it (mm->fold >= 0): the
 * add's operand that is not the product. */
static inline int32_t sj_fold_bias(const sj_graph *g, const sj_node *mm) {
    const int32_t *in = g->args + g->nodes[mm->fold].in_off;
    return in[0] == mm->out ? in[1] : in[0];
}

/* The IR checker: every invariant a pass may rely on (ids in range,
 * topological order, dtypes and ranks each op accepts, shapes consistent
 * with each op's inference where that is checkable). Returns SJ_OK or
 * SJ_EINTERNAL with a message naming the first broken invariant. */
sj_status sj_graph_check(const sj_graph *g);

/* A readable listing of the graph (one line per node). */
void sj_graph_dump(const sj_graph *g, FILE *out);

/* Format a value's shape as "f32[4, s0, 768]" into buf. Returns buf. */
char *sj_graph_shape_str(const sj_graph *g, int32_t val, char *buf, size_t n);
/* The same with every size at its traced value ("f32[4, 9, 768]"): for
 * error messages, which are about the call at hand. */
char *sj_graph_shape_str_concrete(const sj_graph *g, int32_t val, char *buf, size_t n);
/* The same with every size from exv (all expressions' values for a call;
 * NULL: the traced values). */
char *sj_graph_shape_str_at(const sj_graph *g, int32_t val, const int64_t *exv, char *buf, size_t n);

static inline bool sj_dtype_is_float(sj_dtype dt) {
    return dt == SJ_F32 || dt == SJ_F16 || dt == SJ_BF16;
}
static inline bool sj_dtype_is_int(sj_dtype dt) { return dt == SJ_I32 || dt == SJ_I64; }
static inline bool sj_dtype_valid(sj_dtype dt) { return (unsigned)dt < SJ_DTYPE_COUNT; }

#endif /* SJ_GRAPH_H */
