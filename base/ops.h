/* The operator list: one X-macro that every table in the tree is built from
 * (names, kinds, the tracer's dispatch, eager kernels, code generators). */
#ifndef SJ_OPS_H
#define SJ_OPS_H

/* Op kinds: how the tracer infers shapes and how kernels are chosen. */
typedef enum sj_op_kind {
    SJ_K_UNARY,     /* elementwise, one operand */
    SJ_K_BINARY,    /* elementwise, two operands, broadcasting */
    SJ_K_COMPARE,   /* like BINARY, bool result */
    SJ_K_WHERE,     /* elementwise, three operands */
    SJ_K_CAST,      /* elementwise dtype conversion */
    SJ_K_REDUCE,    /* over one axis */
    SJ_K_SOFTMAX,   /* over one axis */
    SJ_K_NORM,      /* layer norm / RMS norm over the last axis */
    SJ_K_MATMUL,    /* batched matrix product */
    SJ_K_ATTENTION, /* scaled dot-product attention */
    SJ_K_VIEW,      /* reshape / permute / slice: no arithmetic */
    SJ_K_CONCAT,
    SJ_K_GATHER,
    SJ_K_COPY,      /* materialise a value contiguously */
    SJ_K_ARANGE,    /* no operands: 0, 1, ..., n-1 */
    SJ_K_ATTENTION_VARLEN, /* attention over packed sequences [T, H, D] with offsets */
} sj_op_kind;

/* X(enum, name, kind) */
#define SJ_OP_LIST(X)                                                           \
    X(SJ_OP_NEG, "neg", SJ_K_UNARY)                                             \
    X(SJ_OP_ABS, "abs", SJ_K_UNARY)                                             \
    X(SJ_OP_EXP, "exp", SJ_K_UNARY)                                             \
    X(SJ_OP_LOG, "log", SJ_K_UNARY)                                             \
    X(SJ_OP_SQRT, "sqrt", SJ_K_UNARY)                                           \
    X(SJ_OP_RSQRT, "rsqrt", SJ_K_UNARY)                                         \
    X(SJ_OP_TANH, "tanh", SJ_K_UNARY)                                           \
    X(SJ_OP_SIGMOID, "sigmoid", SJ_K_UNARY)                                     \
    X(SJ_OP_RELU, "relu", SJ_K_UNARY)                                           \
    X(SJ_OP_GELU, "gelu", SJ_K_UNARY)                                           \
    X(SJ_OP_GELU_TANH, "gelu_tanh", SJ_K_UNARY)                                 \
    X(SJ_OP_SILU, "silu", SJ_K_UNARY)                                           \
    X(SJ_OP_ADD, "add", SJ_K_BINARY)                                            \
    X(SJ_OP_SUB, "sub", SJ_K_BINARY)                                            \
    X(SJ_OP_MUL, "mul", SJ_K_BINARY)                                            \
    X(SJ_OP_DIV, "div", SJ_K_BINARY)                                            \
    X(SJ_OP_MAXIMUM, "maximum", SJ_K_BINARY)                                    \
    X(SJ_OP_MINIMUM, "minimum", SJ_K_BINARY)                                    \
    X(SJ_OP_POW, "pow", SJ_K_BINARY)                                            \
    X(SJ_OP_EQ, "eq", SJ_K_COMPARE)                                             \
    X(SJ_OP_NE, "ne", SJ_K_COMPARE)                                             \
    X(SJ_OP_LT, "lt", SJ_K_COMPARE)                                             \
    X(SJ_OP_LE, "le", SJ_K_COMPARE)                                             \
    X(SJ_OP_GT, "gt", SJ_K_COMPARE)                                             \
    X(SJ_OP_GE, "ge", SJ_K_COMPARE)                                             \
    X(SJ_OP_WHERE, "where", SJ_K_WHERE)                                         \
    X(SJ_OP_CAST, "cast", SJ_K_CAST)                                            \
    X(SJ_OP_SUM, "sum", SJ_K_REDUCE)                                            \
    X(SJ_OP_MEAN, "mean", SJ_K_REDUCE)                                          \
    X(SJ_OP_AMAX, "amax", SJ_K_REDUCE)                                          \
    X(SJ_OP_SOFTMAX, "softmax", SJ_K_SOFTMAX)                                   \
    X(SJ_OP_LAYER_NORM, "layer_norm", SJ_K_NORM)                                \
    X(SJ_OP_RMS_NORM, "rms_norm", SJ_K_NORM)                                    \
    X(SJ_OP_MATMUL, "matmul", SJ_K_MATMUL)                                      \
    X(SJ_OP_ATTENTION, "attention", SJ_K_ATTENTION)                             \
    X(SJ_OP_RESHAPE, "reshape", SJ_K_VIEW)                                      \
    X(SJ_OP_PERMUTE, "permute", SJ_K_VIEW)                                      \
    X(SJ_OP_SLICE, "slice", SJ_K_VIEW)                                          \
    X(SJ_OP_CONCAT, "concat", SJ_K_CONCAT)                                      \
    X(SJ_OP_GATHER, "gather", SJ_K_GATHER)                                      \
    X(SJ_OP_COPY, "copy", SJ_K_COPY)                                            \
    X(SJ_OP_ARANGE, "arange", SJ_K_ARANGE)                                      \
    X(SJ_OP_ATTENTION_VARLEN, "attention_varlen", SJ_K_ATTENTION_VARLEN)

typedef enum sj_op {
#define SJ_X(e, name, kind) e,
    SJ_OP_LIST(SJ_X)
#undef SJ_X
    SJ_OP_COUNT
} sj_op;

/* Name and kind of an op (defined in jit/ir/graph.c). */
const char *sj_op_name(sj_op op);
sj_op_kind sj_op_kind_of(sj_op op);

#endif /* SJ_OPS_H */
