/* The tracer: runs a model function once over concrete inputs and records
 * the graph it describes, with symbolic shapes. */
#ifndef SJ_TRACE_H
#define SJ_TRACE_H

#include "jit/ir/graph.h"
#include "shapes/infer.h"

/* How the tracer types input sizes: returns the expression to use for
 * inputs[input].shape[axis] (whose concrete value is `size`), built in ex.
 * NULL in sj_trace_req: every size is a constant. */
typedef sj_expr (*sj_dim_policy)(void *ctx, sj_exprs *ex, int input, int axis, int64_t size);

typedef struct sj_trace_req {
    const char *fn_name;
    sj_model_fn model;
    void *user;
    const sj_tensor *inputs;
    int n_inputs;
    sj_dim_policy dim_policy;
    void *dim_ctx;
    sj_device device; /* the backend's: sj_param takes host tensors and tensors on it */
} sj_trace_req;

typedef struct sj_trace_result {
    sj_graph *graph;  /* owned by the caller */
    sj_fact *facts;   /* relations the trace relied on (malloc'd, caller frees) */
    int n_facts;
} sj_trace_result;

/* Trace. On success fills *res. On failure returns the status with the
 * message set (naming the function, the op, its operand shapes) and leaves
 * nothing allocated. */
sj_status sj_trace(const sj_trace_req *req, sj_trace_result *res);

#endif /* SJ_TRACE_H */
