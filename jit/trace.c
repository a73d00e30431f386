/* The tracer: the public op functions a model function calls, each
 * recording a node after checking dtypes and inferring its shape. */
#include "jit/trace.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/tensor.h"

struct sj_tracer {
    sj_graph *g;
    sj_infer inf;
    const sj_trace_req *req;
    sj_status err;
    char msg[768];
    char why[128]; /* the op being traced, for the facts it records */
};

/* -- Errors ---------------------------------------------------------------- */

static const sj_val BAD = {-2};

static void vrecord(sj_tracer *t, sj_status st, const char *fmt, va_list ap) {
    if (t->err) return; /* the first error wins */
    t->err = st;
    vsnprintf(t->msg, sizeof t->msg, fmt, ap);
}

static sj_val fail(sj_tracer *t, sj_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vrecord(t, st, fmt, ap);
    va_end(ap);
    return BAD;
}

sj_status sj_trace_fail(sj_tracer *t, sj_status status, const char *fmt, ...) {
    if (!t) return sj_seterr(SJ_EINVAL, "sj_trace_fail: tracer is NULL");
    if (status == SJ_OK) status = SJ_EMODEL;
    if (!fmt) {
        fail(t, status, "sj_trace_fail: the model rejected its inputs (no message: fmt is NULL)");
        return status;
    }
    va_list ap;
    va_start(ap, fmt);
    vrecord(t, status, fmt, ap);
    va_end(ap);
    return status;
}

sj_status sj_trace_status(const sj_tracer *t) { return t ? t->err : SJ_EINVAL; }

/* Is v usable as an operand? Records an error for a bad id (unless an error
 * was already recorded: then values are invalid by design). */
static bool ok(sj_tracer *t, sj_val v, const char *op, const char *what) {
    if (t->err) return false;
    if (v.id >= 0 && v.id < t->g->n_vals) return true;
    if (v.id == SJ_NONE.id) fail(t, SJ_EINVAL, "%s: operand '%s' is missing (SJ_NONE)", op, what);
    else fail(t, SJ_EINVAL, "%s: operand '%s' is not a value of this trace (id %d)", op, what, v.id);
    return false;
}

static const sj_value *val(sj_tracer *t, sj_val v) { return &t->g->vals[v.id]; }
static bool dim_ok(sj_tracer *t, sj_dim d, const char *name);

static void shape_of(sj_tracer *t, sj_val v, sj_shape *s) {
    const sj_value *x = val(t, v);
    s->rank = x->rank;
    memcpy(s->d, x->shape, sizeof(sj_expr) * (size_t)x->rank);
}

/* "f32[4, 8]" for messages: sizes as this call has them. */
static const char *desc(sj_tracer *t, sj_val v, char *buf, size_t n) {
    return sj_graph_shape_str_concrete(t->g, v.id, buf, n);
}

/* Record a shape-inference failure: "op(f32[4, 8], f32[4, 9]): reason". */
static sj_val infer_fail(sj_tracer *t, sj_status st, const char *op, const sj_val *ins, int n) {
    char ops[512] = "", b[128];
    size_t used = 0;
    for (int i = 0; i < n && used < sizeof ops; i++) {
        if (ins[i].id < 0) continue;
        used += (size_t)snprintf(ops + used, sizeof ops - used, "%s%s", used ? ", " : "",
                                 desc(t, ins[i], b, sizeof b));
    }
    if (st == SJ_ENOMEM) return fail(t, st, "%s: out of memory while tracing", op);
    return fail(t, st, "%s(%s): %s", op, ops, t->inf.msg);
}

/* Name the op being traced ("add(f32[s0, 4], f32[4])") for the size facts
 * its inference records. */
static void set_why(sj_tracer *t, const char *op, const sj_val *ins, int n) {
    size_t used = (size_t)snprintf(t->why, sizeof t->why, "%s(", op);
    for (int i = 0; i < n && used < sizeof t->why; i++) {
        char b[96];
        if (ins[i].id < 0) continue;
        used += (size_t)snprintf(t->why + used, sizeof t->why - used, "%s%s", i ? ", " : "",
                                 sj_graph_shape_str(t->g, ins[i].id, b, sizeof b));
    }
    if (used < sizeof t->why) snprintf(t->why + used, sizeof t->why - used, ")");
    t->inf.why = t->why;
}

static sj_val emit(sj_tracer *t, sj_op op, const int32_t *ins, int n, const sj_attrs *a, sj_dtype dt,
                   const sj_shape *s) {
    /* the result at this trace's sizes must be a tensor that can exist: sizes
     * that wrapped int64 (a reshape to sizes whose product overflows) come
     * out negative or past the element limit */
    int64_t d[SJ_MAX_RANK];
    for (int i = 0; i < s->rank; i++) d[i] = sj_ex_hint(t->g->ex, s->d[i]);
    int bad = sj_sizes_bad_axis(d, s->rank, NULL);
    if (bad >= 0)
        return fail(t, SJ_ESHAPE, "%s: the result's size at axis %d would be %lld here (%s)", sj_op_name(op), bad,
                    (long long)d[bad], d[bad] < 0 ? "negative" : "more than 2^48 elements in all");
    sj_value v = {.dtype = dt, .rank = (int8_t)s->rank};
    memcpy(v.shape, s->d, sizeof(sj_expr) * (size_t)s->rank);
    int32_t id = sj_graph_add_node(t->g, op, ins, n, a, &v);
    if (id < 0) return fail(t, SJ_ENOMEM, "%s: out of memory while tracing", sj_op_name(op));
    return (sj_val){id};
}

/* A weak scalar meeting an operand of another dtype becomes a constant of
 * that dtype. */
static sj_val adopt(sj_tracer *t, sj_val s, sj_dtype dt) {
    const sj_value *x = val(t, s);
    if (!x->weak || x->dtype == dt) return s;
    int32_t id = sj_graph_add_const(t->g, t->g->consts[x->index].value, dt, false);
    if (id < 0) return fail(t, SJ_ENOMEM, "out of memory while tracing");
    return (sj_val){id};
}

/* -- Elementwise ----------------------------------------------------------- */

static sj_val unary(sj_tracer *t, sj_op op, sj_val x) {
    const char *name = sj_op_name(op);
    if (!ok(t, x, name, "x")) return BAD;
    const sj_value *v = val(t, x);
    bool int_ok = op == SJ_OP_NEG || op == SJ_OP_ABS || op == SJ_OP_RELU;
    if (!sj_dtype_is_float(v->dtype) && !(int_ok && sj_dtype_is_int(v->dtype))) {
        char b[128];
        return fail(t, SJ_EDTYPE, "%s(%s): dtype %s not supported (%s)", name, desc(t, x, b, sizeof b),
                    sj_dtype_name(v->dtype), int_ok ? "f32, f16, bf16, i32, i64" : "f32, f16, bf16");
    }
    sj_shape s;
    shape_of(t, x, &s);
    return emit(t, op, &x.id, 1, NULL, v->dtype, &s);
}

#define SJ_UNARY_FN(fname, OP)                                                                     \
    sj_val fname(sj_tracer *t, sj_val x) { return t ? unary(t, OP, x) : BAD; }
SJ_UNARY_FN(sj_neg, SJ_OP_NEG)
SJ_UNARY_FN(sj_abs, SJ_OP_ABS)
SJ_UNARY_FN(sj_exp, SJ_OP_EXP)
SJ_UNARY_FN(sj_log, SJ_OP_LOG)
SJ_UNARY_FN(sj_sqrt, SJ_OP_SQRT)
SJ_UNARY_FN(sj_rsqrt, SJ_OP_RSQRT)
SJ_UNARY_FN(sj_tanh, SJ_OP_TANH)
SJ_UNARY_FN(sj_sigmoid, SJ_OP_SIGMOID)
SJ_UNARY_FN(sj_relu, SJ_OP_RELU)
SJ_UNARY_FN(sj_gelu, SJ_OP_GELU)
SJ_UNARY_FN(sj_gelu_tanh, SJ_OP_GELU_TANH)
SJ_UNARY_FN(sj_silu, SJ_OP_SILU)

/* Bring n operands to one dtype (weak scalars adopt the first strong one),
 * then broadcast their shapes. */
static bool unify(sj_tracer *t, const char *name, sj_val *ins, int n, const char *const *names,
                  sj_shape *out) {
    sj_dtype dt = SJ_DTYPE_COUNT;
    for (int i = 0; i < n; i++)
        if (!val(t, ins[i])->weak) {
            dt = val(t, ins[i])->dtype;
            break;
        }
    if (dt == SJ_DTYPE_COUNT) dt = val(t, ins[0])->dtype; /* all weak: f32 */
    for (int i = 0; i < n; i++) {
        ins[i] = adopt(t, ins[i], dt);
        if (t->err) return false;
        if (val(t, ins[i])->dtype != dt) {
            char b0[128], b1[128];
            fail(t, SJ_EDTYPE, "%s: operand '%s' is %s but '%s' is %s (cast one with sj_cast)", name, names[i],
                 desc(t, ins[i], b0, sizeof b0), names[0], desc(t, ins[0], b1, sizeof b1));
            return false;
        }
    }
    sj_shape s[3];
    const sj_shape *ps[3];
    for (int i = 0; i < n; i++) {
        shape_of(t, ins[i], &s[i]);
        ps[i] = &s[i];
    }
    set_why(t, name, ins, n);
    sj_status st = sj_infer_broadcast(&t->inf, ps, n, out);
    if (st) {
        infer_fail(t, st, name, ins, n);
        return false;
    }
    return true;
}

static sj_val binary(sj_tracer *t, sj_op op, sj_val a, sj_val b) {
    static const char *const names[] = {"a", "b"};
    const char *name = sj_op_name(op);
    if (!ok(t, a, name, "a") || !ok(t, b, name, "b")) return BAD;
    sj_val ins[2] = {a, b};
    sj_shape s;
    if (!unify(t, name, ins, 2, names, &s)) return BAD;
    sj_dtype dt = val(t, ins[0])->dtype;
    bool cmp = sj_op_kind_of(op) == SJ_K_COMPARE;
    if (dt == SJ_BOOL && !cmp) {
        char b0[128];
        return fail(t, SJ_EDTYPE, "%s(%s, ...): bool operands are not supported (cast first)", name,
                    desc(t, ins[0], b0, sizeof b0));
    }
    int32_t ids[2] = {ins[0].id, ins[1].id};
    return emit(t, op, ids, 2, NULL, cmp ? SJ_BOOL : dt, &s);
}

#define SJ_BINARY_FN(fname, OP)                                                                    \
    sj_val fname(sj_tracer *t, sj_val a, sj_val b) { return t ? binary(t, OP, a, b) : BAD; }
SJ_BINARY_FN(sj_add, SJ_OP_ADD)
SJ_BINARY_FN(sj_sub, SJ_OP_SUB)
SJ_BINARY_FN(sj_mul, SJ_OP_MUL)
SJ_BINARY_FN(sj_div, SJ_OP_DIV)
SJ_BINARY_FN(sj_maximum, SJ_OP_MAXIMUM)
SJ_BINARY_FN(sj_minimum, SJ_OP_MINIMUM)
SJ_BINARY_FN(sj_pow, SJ_OP_POW)
SJ_BINARY_FN(sj_eq, SJ_OP_EQ)
SJ_BINARY_FN(sj_ne, SJ_OP_NE)
SJ_BINARY_FN(sj_lt, SJ_OP_LT)
SJ_BINARY_FN(sj_le, SJ_OP_LE)
SJ_BINARY_FN(sj_gt, SJ_OP_GT)
SJ_BINARY_FN(sj_ge, SJ_OP_GE)

sj_val sj_where(sj_tracer *t, sj_val cond, sj_val a, sj_val b) {
    static const char *const names[] = {"a", "b"};
    if (!t) return BAD;
    if (!ok(t, cond, "where", "cond") || !ok(t, a, "where", "a") || !ok(t, b, "where", "b")) return BAD;
    if (val(t, cond)->dtype != SJ_BOOL) {
        char b0[128];
        return fail(t, SJ_EDTYPE, "where: cond is %s, expected bool", desc(t, cond, b0, sizeof b0));
    }
    sj_val ab[2] = {a, b};
    sj_shape s_ab;
    if (!unify(t, "where", ab, 2, names, &s_ab)) return BAD;
    sj_shape sc, s;
    shape_of(t, cond, &sc);
    sj_val all3[3] = {cond, ab[0], ab[1]};
    set_why(t, "where", all3, 3);
    const sj_shape *ps[2] = {&sc, &s_ab};
    sj_status st = sj_infer_broadcast(&t->inf, ps, 2, &s);
    sj_val all[3] = {cond, ab[0], ab[1]};
    if (st) return infer_fail(t, st, "where", all, 3);
    int32_t ids[3] = {cond.id, ab[0].id, ab[1].id};
    return emit(t, SJ_OP_WHERE, ids, 3, NULL, val(t, ab[0])->dtype, &s);
}

sj_val sj_cast(sj_tracer *t, sj_val x, sj_dtype dt) {
    if (!t || !ok(t, x, "cast", "x")) return BAD;
    if (!sj_dtype_valid(dt)) return fail(t, SJ_EINVAL, "cast: target dtype %d is not a dtype", (int)dt);
    sj_shape s;
    shape_of(t, x, &s);
    sj_attrs a = {.dtype = dt};
    return emit(t, SJ_OP_CAST, &x.id, 1, &a, dt, &s);
}

sj_val sj_scalar(sj_tracer *t, double v) {
    if (!t || t->err) return BAD;
    int32_t id = sj_graph_add_const(t->g, v, SJ_F32, true);
    if (id < 0) return fail(t, SJ_ENOMEM, "scalar: out of memory while tracing");
    return (sj_val){id};
}

/* -- Reductions and normalisations ----------------------------------------- */

static int axis_arg(sj_tracer *t, const char *name, sj_val x, int axis) {
    int rank = val(t, x)->rank;
    int a = sj_axis_norm(axis, rank);
    if (a < 0) {
        char b[128];
        fail(t, SJ_EINVAL, "%s(%s): axis %d out of range for rank %d", name, desc(t, x, b, sizeof b), axis, rank);
    }
    return a;
}

static bool float_arg(sj_tracer *t, const char *name, sj_val x) {
    if (sj_dtype_is_float(val(t, x)->dtype)) return true;
    char b[128];
    fail(t, SJ_EDTYPE, "%s(%s): expects f32, f16 or bf16", name, desc(t, x, b, sizeof b));
    return false;
}

static sj_val reduce(sj_tracer *t, sj_op op, sj_val x, int axis, int keepdim) {
    const char *name = sj_op_name(op);
    if (!t || !ok(t, x, name, "x")) return BAD;
    sj_dtype dt = val(t, x)->dtype;
    if (op == SJ_OP_MEAN ? !float_arg(t, name, x) : !(sj_dtype_is_float(dt) || sj_dtype_is_int(dt))) {
        char b[128];
        return fail(t, SJ_EDTYPE, "%s(%s): dtype not supported", name, desc(t, x, b, sizeof b));
    }
    int a = axis_arg(t, name, x, axis);
    if (a < 0) return BAD;
    set_why(t, name, &x, 1);
    if (op == SJ_OP_AMAX && sj_infer_eq(&t->inf, val(t, x)->shape[a], sj_ex_const(t->g->ex, 0))) {
        char b[128];
        return fail(t, SJ_ESHAPE, "amax(%s): axis %d is empty", desc(t, x, b, sizeof b), a);
    }
    sj_shape in, s;
    shape_of(t, x, &in);
    sj_infer_reduce(&t->inf, &in, a, keepdim, &s);
    sj_attrs at = {.axis = a, .keepdim = keepdim != 0};
    return emit(t, op, &x.id, 1, &at, dt, &s);
}

sj_val sj_sum(sj_tracer *t, sj_val x, int axis, int keepdim) { return reduce(t, SJ_OP_SUM, x, axis, keepdim); }
sj_val sj_mean(sj_tracer *t, sj_val x, int axis, int keepdim) { return reduce(t, SJ_OP_MEAN, x, axis, keepdim); }
sj_val sj_amax(sj_tracer *t, sj_val x, int axis, int keepdim) { return reduce(t, SJ_OP_AMAX, x, axis, keepdim); }

sj_val sj_softmax(sj_tracer *t, sj_val x, int axis) {
    if (!t || !ok(t, x, "softmax", "x") || !float_arg(t, "softmax", x)) return BAD;
    int a = axis_arg(t, "softmax", x, axis);
    if (a < 0) return BAD;
    sj_shape s;
    shape_of(t, x, &s);
    sj_attrs at = {.axis = a};
    return emit(t, SJ_OP_SOFTMAX, &x.id, 1, &at, val(t, x)->dtype, &s);
}

/* g/b of a norm: SJ_NONE, or 1-D of x's last size and x's dtype. */
static bool norm_vec(sj_tracer *t, const char *name, const char *what, sj_val x, sj_val w) {
    if (w.id == SJ_NONE.id) return true;
    if (!ok(t, w, name, what)) return false;
    const sj_value *xv = val(t, x), *wv = val(t, w);
    char b0[128], b1[128];
    if (wv->dtype != xv->dtype || wv->rank != 1 || !sj_infer_eq(&t->inf, wv->shape[0], xv->shape[xv->rank - 1])) {
        fail(t, wv->dtype != xv->dtype ? SJ_EDTYPE : SJ_ESHAPE, "%s(x: %s, %s: %s): %s must be %s[%s]", name,
             desc(t, x, b0, sizeof b0), what, desc(t, w, b1, sizeof b1), what, sj_dtype_name(xv->dtype),
             "last size of x");
        return false;
    }
    return true;
}

static sj_val norm(sj_tracer *t, sj_op op, sj_val x, sj_val g, sj_val b, double eps) {
    const char *name = sj_op_name(op);
    if (!t || !ok(t, x, name, "x") || !float_arg(t, name, x)) return BAD;
    if (val(t, x)->rank < 1) return fail(t, SJ_ESHAPE, "%s: x must have rank >= 1", name);
    sj_val all3[3] = {x, g, b};
    set_why(t, name, all3, op == SJ_OP_LAYER_NORM ? 3 : 2);
    if (!norm_vec(t, name, "g", x, g) || !norm_vec(t, name, "b", x, b)) return BAD;
    if (!(eps >= 0)) return fail(t, SJ_EINVAL, "%s: eps %g must be >= 0", name, eps);
    sj_shape s;
    shape_of(t, x, &s);
    sj_attrs at = {.f = eps};
    int32_t ids[3] = {x.id, g.id, b.id};
    return emit(t, op, ids, op == SJ_OP_LAYER_NORM ? 3 : 2, &at, val(t, x)->dtype, &s);
}

sj_val sj_layer_norm(sj_tracer *t, sj_val x, sj_val g, sj_val b, double eps) {
    return norm(t, SJ_OP_LAYER_NORM, x, g, b, eps);
}
sj_val sj_rms_norm(sj_tracer *t, sj_val x, sj_val g, double eps) { return norm(t, SJ_OP_RMS_NORM, x, g, SJ_NONE, eps); }

/* -- Matrix products -------------------------------------------------------- */

sj_val sj_matmul(sj_tracer *t, sj_val a, sj_val b) {
    if (!t || !ok(t, a, "matmul", "a") || !ok(t, b, "matmul", "b")) return BAD;
    sj_val ins[2] = {a, b};
    const sj_value *va = val(t, a), *vb = val(t, b);
    if (va->dtype != vb->dtype || va->dtype == SJ_BOOL) {
        char b0[128], b1[128];
        return fail(t, SJ_EDTYPE, "matmul(%s, %s): operands must share a numeric dtype", desc(t, a, b0, sizeof b0),
                    desc(t, b, b1, sizeof b1));
    }
    sj_shape sa, sb, s;
    shape_of(t, a, &sa);
    shape_of(t, b, &sb);
    set_why(t, "matmul", ins, 2);
    sj_status st = sj_infer_matmul(&t->inf, &sa, &sb, &s);
    if (st) return infer_fail(t, st, "matmul", ins, 2);
    int32_t ids[2] = {a.id, b.id};
    return emit(t, SJ_OP_MATMUL, ids, 2, NULL, va->dtype, &s);
}

/* mask (SJ_NONE or not): f32, q's dtype or bool, broadcastable to the
 * scores [B, H, Sq, Sk]. */
static bool mask_ok(sj_tracer *t, sj_val q, sj_val k, sj_val mask) {
    const sj_value *m = val(t, mask), *qv = val(t, q), *kv = val(t, k);
    char b0[128], b1[128], b2[128];
    if (m->dtype != qv->dtype && m->dtype != SJ_F32 && m->dtype != SJ_BOOL) {
        fail(t, SJ_EDTYPE, "attention_mask(q: %s, mask: %s): mask must be bool, f32 or q's dtype",
             desc(t, q, b0, sizeof b0), desc(t, mask, b1, sizeof b1));
        return false;
    }
    if (m->rank > 4) {
        fail(t, SJ_ESHAPE, "attention_mask(mask: %s): mask has rank %d, at most 4 ([B, H, Sq, Sk])",
             desc(t, mask, b1, sizeof b1), m->rank);
        return false;
    }
    sj_expr sc[4] = {qv->shape[0], qv->shape[1], qv->shape[2], kv->shape[2]};
    for (int i = 0; i < m->rank; i++) {
        int a = 4 - m->rank + i;
        sj_expr d = val(t, mask)->shape[i];
        if (!sj_infer_is_one(&t->inf, d) && !sj_infer_eq(&t->inf, d, sc[a])) {
            fail(t, SJ_ESHAPE,
                 "attention_mask(q: %s, k: %s, mask: %s): mask does not broadcast to the scores [B, H, Sq, Sk] "
                 "at their axis %d",
                 desc(t, q, b0, sizeof b0), desc(t, k, b1, sizeof b1), desc(t, mask, b2, sizeof b2), a);
            return false;
        }
    }
    return true;
}

/* The attention node: operands q, k, v, lengths, mask (the last two may be
 * SJ_NONE). */
static sj_val attention(sj_tracer *t, const char *name, sj_val q, sj_val k, sj_val v, sj_val lengths, sj_val mask,
                        double scale, int causal) {
    if (!ok(t, q, name, "q") || !ok(t, k, name, "k") || !ok(t, v, name, "v")) return BAD;
    if (lengths.id != SJ_NONE.id && !ok(t, lengths, name, "lengths")) return BAD;
    if (mask.id != SJ_NONE.id && !ok(t, mask, name, "mask")) return BAD;
    sj_val ins[5] = {q, k, v, lengths, mask};
    sj_dtype dt = val(t, q)->dtype;
    if (!float_arg(t, name, q)) return BAD;
    if (val(t, k)->dtype != dt || val(t, v)->dtype != dt) {
        char b0[128], b1[128], b2[128];
        return fail(t, SJ_EDTYPE, "%s(q: %s, k: %s, v: %s): q, k, v must share a dtype", name,
                    desc(t, q, b0, sizeof b0), desc(t, k, b1, sizeof b1), desc(t, v, b2, sizeof b2));
    }
    if (lengths.id >= 0 && !sj_dtype_is_int(val(t, lengths)->dtype)) {
        char b0[128];
        return fail(t, SJ_EDTYPE, "%s: lengths is %s, expected i32 or i64", name, desc(t, lengths, b0, sizeof b0));
    }
    sj_shape sq, sk, sv, sl, s;
    shape_of(t, q, &sq);
    shape_of(t, k, &sk);
    shape_of(t, v, &sv);
    if (lengths.id >= 0) shape_of(t, lengths, &sl);
    set_why(t, name, ins, 5);
    sj_status st = sj_infer_attention(&t->inf, &sq, &sk, &sv, lengths.id >= 0 ? &sl : NULL, &s);
    if (st) return infer_fail(t, st, name, ins, 5);
    if (mask.id >= 0 && !mask_ok(t, q, k, mask)) return BAD;
    sj_attrs at = {.f = scale, .causal = causal != 0};
    int32_t ids[5] = {q.id, k.id, v.id, lengths.id, mask.id};
    return emit(t, SJ_OP_ATTENTION, ids, 5, &at, dt, &s);
}

sj_val sj_attention(sj_tracer *t, sj_val q, sj_val k, sj_val v, sj_val lengths, double scale, int causal) {
    return t ? attention(t, "attention", q, k, v, lengths, SJ_NONE, scale, causal) : BAD;
}

sj_val sj_attention_mask(sj_tracer *t, sj_val q, sj_val k, sj_val v, sj_val mask, double scale, int causal) {
    if (!t || !ok(t, mask, "attention_mask", "mask")) return BAD;
    return attention(t, "attention_mask", q, k, v, SJ_NONE, mask, scale, causal);
}

sj_val sj_attention_varlen(sj_tracer *t, sj_val q, sj_val k, sj_val v, sj_val offsets, double scale,
                           int causal) {
    static const char *name = "attention_varlen";
    if (!t || !ok(t, q, name, "q") || !ok(t, k, name, "k") || !ok(t, v, name, "v") ||
        !ok(t, offsets, name, "offsets"))
        return BAD;
    sj_val ins[4] = {q, k, v, offsets};
    sj_dtype dt = val(t, q)->dtype;
    if (!float_arg(t, name, q)) return BAD;
    if (val(t, k)->dtype != dt || val(t, v)->dtype != dt) {
        char b0[128], b1[128], b2[128];
        return fail(t, SJ_EDTYPE, "%s(q: %s, k: %s, v: %s): q, k, v must share a dtype", name,
                    desc(t, q, b0, sizeof b0), desc(t, k, b1, sizeof b1), desc(t, v, b2, sizeof b2));
    }
    if (val(t, offsets)->dtype != SJ_I32) {
        char b0[128];
        return fail(t, SJ_EDTYPE, "%s: offsets is %s, expected i32 [B+1]", name, desc(t, offsets, b0, sizeof b0));
    }
    sj_shape sq, sk, sv, so, s;
    shape_of(t, q, &sq);
    shape_of(t, k, &sk);
    shape_of(t, v, &sv);
    shape_of(t, offsets, &so);
    set_why(t, name, ins, 4);
    sj_status st = sj_infer_attention_varlen(&t->inf, &sq, &sk, &sv, &so, &s);
    if (st) return infer_fail(t, st, name, ins, 4);
    sj_attrs at = {.f = scale, .causal = causal != 0};
    int32_t ids[4] = {q.id, k.id, v.id, offsets.id};
    return emit(t, SJ_OP_ATTENTION_VARLEN, ids, 4, &at, dt, &s);
}

/* -- Views and data movement ------------------------------------------------ */

static sj_val reshape(sj_tracer *t, sj_val x, int rank, const sj_expr *dims) {
    sj_shape in, s;
    shape_of(t, x, &in);
    set_why(t, "reshape", &x, 1);
    sj_status st = sj_infer_reshape(&t->inf, &in, rank, dims, &s);
    if (st) return infer_fail(t, st, "reshape", &x, 1);
    return emit(t, SJ_OP_RESHAPE, &x.id, 1, NULL, val(t, x)->dtype, &s);
}

sj_val sj_reshape(sj_tracer *t, sj_val x, int rank, const sj_dim *dims) {
    if (!t || !ok(t, x, "reshape", "x")) return BAD;
    if (rank < 0 || rank > SJ_MAX_RANK || (rank > 0 && !dims))
        return fail(t, SJ_EINVAL, "reshape: rank %d out of range [0, %d] or dims NULL", rank, SJ_MAX_RANK);
    sj_expr e[SJ_MAX_RANK];
    for (int i = 0; i < rank; i++) {
        if (dims[i].e == SJ_DIM_INFER.e) {
            e[i] = SJ_EX_NONE;
        } else if (dims[i].e < 0 || dims[i].e >= sj_ex_count(t->g->ex)) {
            return fail(t, SJ_EINVAL, "reshape: dims[%d] is not a size of this trace", i);
        } else {
            e[i] = dims[i].e;
        }
    }
    return reshape(t, x, rank, e);
}

sj_val sj_reshape_i(sj_tracer *t, sj_val x, int rank, const int64_t *dims) {
    if (!t || !ok(t, x, "reshape", "x")) return BAD;
    if (rank < 0 || rank > SJ_MAX_RANK || (rank > 0 && !dims))
        return fail(t, SJ_EINVAL, "reshape: rank %d out of range [0, %d] or dims NULL", rank, SJ_MAX_RANK);
    sj_expr e[SJ_MAX_RANK];
    for (int i = 0; i < rank; i++) {
        if (dims[i] < -1) return fail(t, SJ_EINVAL, "reshape: size %lld at axis %d", (long long)dims[i], i);
        e[i] = dims[i] == -1 ? SJ_EX_NONE : sj_ex_const(t->g->ex, dims[i]);
    }
    return reshape(t, x, rank, e);
}

sj_val sj_permute(sj_tracer *t, sj_val x, const int *perm) {
    if (!t || !ok(t, x, "permute", "x")) return BAD;
    if (!perm && val(t, x)->rank > 0) return fail(t, SJ_EINVAL, "permute: perm is NULL");
    sj_shape in, s;
    shape_of(t, x, &in);
    sj_status st = sj_infer_permute(&t->inf, &in, perm, &s);
    if (st) return infer_fail(t, st, "permute", &x, 1);
    sj_attrs a = {0};
    for (int i = 0; i < in.rank; i++) a.perm[i] = (int8_t)perm[i];
    return emit(t, SJ_OP_PERMUTE, &x.id, 1, &a, val(t, x)->dtype, &s);
}

sj_val sj_transpose(sj_tracer *t, sj_val x, int axis0, int axis1) {
    if (!t || !ok(t, x, "transpose", "x")) return BAD;
    int rank = val(t, x)->rank;
    int a0 = axis_arg(t, "transpose", x, axis0), a1 = a0 < 0 ? -1 : axis_arg(t, "transpose", x, axis1);
    if (a0 < 0 || a1 < 0) return BAD;
    int perm[SJ_MAX_RANK];
    for (int i = 0; i < rank; i++) perm[i] = i;
    perm[a0] = a1;
    perm[a1] = a0;
    return sj_permute(t, x, perm);
}

sj_val sj_slice(sj_tracer *t, sj_val x, int axis, int64_t start, int64_t end, int64_t step) {
    if (!t || !ok(t, x, "slice", "x")) return BAD;
    int a = axis_arg(t, "slice", x, axis);
    if (a < 0) return BAD;
    sj_shape in, s;
    sj_expr st_e;
    shape_of(t, x, &in);
    sj_status st = sj_infer_slice(&t->inf, &in, a, start, end, step, &s, &st_e);
    if (st) return infer_fail(t, st, "slice", &x, 1);
    sj_attrs at = {.axis = a, .start = st_e, .step = step};
    return emit(t, SJ_OP_SLICE, &x.id, 1, &at, val(t, x)->dtype, &s);
}

sj_val sj_slice_dim(sj_tracer *t, sj_val x, int axis, sj_dim start, sj_dim end) {
    if (!t || !ok(t, x, "slice_dim", "x")) return BAD;
    int a = axis_arg(t, "slice_dim", x, axis);
    if (a < 0 || !dim_ok(t, start, "slice_dim: start") || !dim_ok(t, end, "slice_dim: end")) return BAD;
    sj_shape in, s;
    sj_expr st_e;
    shape_of(t, x, &in);
    sj_status st = sj_infer_slice_dim(&t->inf, &in, a, start.e, end.e, &s, &st_e);
    if (st) return infer_fail(t, st, "slice_dim", &x, 1);
    sj_attrs at = {.axis = a, .start = st_e, .step = 1};
    return emit(t, SJ_OP_SLICE, &x.id, 1, &at, val(t, x)->dtype, &s);
}

sj_val sj_arange(sj_tracer *t, sj_dim n, sj_dtype dt) {
    if (!t || !dim_ok(t, n, "arange: n")) return BAD;
    if (!sj_dtype_valid(dt) || dt == SJ_BOOL)
        return fail(t, SJ_EDTYPE, "arange: dtype %s not supported (f32, f16, bf16, i32, i64)",
                    sj_dtype_valid(dt) ? sj_dtype_name(dt) : "?");
    sj_shape s = {.rank = 1, .d = {n.e}};
    sj_attrs at = {.dtype = dt};
    int32_t none = -1;
    return emit(t, SJ_OP_ARANGE, &none, 0, &at, dt, &s);
}

sj_val sj_concat(sj_tracer *t, const sj_val *xs, int n, int axis) {
    if (!t || t->err) return BAD;
    if (!xs || n < 1 || n > 64) return fail(t, SJ_EINVAL, "concat: %d operands (expected 1 .. 64)", n);
    sj_shape s[64], out;
    const sj_shape *ps[64];
    int32_t ids[64];
    for (int i = 0; i < n; i++) {
        char what[16];
        snprintf(what, sizeof what, "xs[%d]", i);
        if (!ok(t, xs[i], "concat", what)) return BAD;
        if (val(t, xs[i])->dtype != val(t, xs[0])->dtype) {
            char b0[128], b1[128];
            return fail(t, SJ_EDTYPE, "concat: xs[%d] is %s but xs[0] is %s", i, desc(t, xs[i], b0, sizeof b0),
                        desc(t, xs[0], b1, sizeof b1));
        }
        shape_of(t, xs[i], &s[i]);
        ps[i] = &s[i];
        ids[i] = xs[i].id;
    }
    int a = axis_arg(t, "concat", xs[0], axis);
    if (a < 0) return BAD;
    set_why(t, "concat", xs, n);
    sj_status st = sj_infer_concat(&t->inf, ps, n, a, &out);
    if (st) return infer_fail(t, st, "concat", xs, n);
    sj_attrs at = {.axis = a};
    return emit(t, SJ_OP_CONCAT, ids, n, &at, val(t, xs[0])->dtype, &out);
}

sj_val sj_gather(sj_tracer *t, sj_val table, sj_val idx) {
    if (!t || !ok(t, table, "gather", "table") || !ok(t, idx, "gather", "idx")) return BAD;
    sj_val ins[2] = {table, idx};
    if (!sj_dtype_is_int(val(t, idx)->dtype)) {
        char b0[128];
        return fail(t, SJ_EDTYPE, "gather: idx is %s, expected i32 or i64", desc(t, idx, b0, sizeof b0));
    }
    sj_shape st_, si, s;
    shape_of(t, table, &st_);
    shape_of(t, idx, &si);
    sj_status st = sj_infer_gather(&t->inf, &st_, &si, &s);
    if (st) return infer_fail(t, st, "gather", ins, 2);
    int32_t ids[2] = {table.id, idx.id};
    return emit(t, SJ_OP_GATHER, ids, 2, NULL, val(t, table)->dtype, &s);
}

/* -- Values, sizes, parameters, outputs ------------------------------------ */

sj_dtype sj_val_dtype(sj_tracer *t, sj_val v) {
    if (!t || !ok(t, v, "sj_val_dtype", "v")) return SJ_DTYPE_COUNT;
    return val(t, v)->dtype;
}

int sj_val_rank(sj_tracer *t, sj_val v) {
    if (!t || !ok(t, v, "sj_val_rank", "v")) return -1;
    return val(t, v)->rank;
}

static sj_expr dim_expr(sj_tracer *t, const char *name, sj_val v, int axis) {
    if (!ok(t, v, name, "v")) return SJ_EX_NONE;
    int a = axis_arg(t, name, v, axis);
    return a < 0 ? SJ_EX_NONE : val(t, v)->shape[a];
}

int64_t sj_size(sj_tracer *t, sj_val v, int axis) {
    if (!t) return -1;
    sj_expr e = dim_expr(t, "sj_size", v, axis);
    if (e == SJ_EX_NONE) return -1;
    int64_t h = sj_ex_hint(t->g->ex, e);
    char b[96];
    snprintf(t->why, sizeof t->why, "sj_size(%s, axis %d)", sj_graph_shape_str(t->g, v.id, b, sizeof b), axis);
    t->inf.why = t->why;
    /* The trace now depends on the concrete value. */
    sj_infer_eq(&t->inf, e, sj_ex_const(t->g->ex, h));
    return h;
}

sj_dim sj_dim_of(sj_tracer *t, sj_val v, int axis) {
    if (!t) return (sj_dim){-2};
    sj_expr e = dim_expr(t, "sj_dim_of", v, axis);
    return (sj_dim){e == SJ_EX_NONE ? -2 : e};
}

static bool dim_ok(sj_tracer *t, sj_dim d, const char *name) {
    if (t->err) return false;
    if (d.e >= 0 && d.e < sj_ex_count(t->g->ex)) return true;
    fail(t, SJ_EINVAL, "%s: not a size of this trace", name);
    return false;
}

static sj_dim dim_result(sj_tracer *t, sj_expr e, const char *name) {
    if (e == SJ_EX_NONE) {
        fail(t, SJ_ENOMEM, "%s: out of memory while tracing", name);
        return (sj_dim){-2};
    }
    return (sj_dim){e};
}

sj_dim sj_dim_const(sj_tracer *t, int64_t c) {
    if (!t || t->err) return (sj_dim){-2};
    if (c < 0) {
        fail(t, SJ_EINVAL, "sj_dim_const: size %lld is negative", (long long)c);
        return (sj_dim){-2};
    }
    return dim_result(t, sj_ex_const(t->g->ex, c), "sj_dim_const");
}

sj_dim sj_dim_mul(sj_tracer *t, sj_dim a, sj_dim b) {
    if (!t || !dim_ok(t, a, "sj_dim_mul") || !dim_ok(t, b, "sj_dim_mul")) return (sj_dim){-2};
    return dim_result(t, sj_ex_mul(t->g->ex, a.e, b.e), "sj_dim_mul");
}

sj_dim sj_dim_add(sj_tracer *t, sj_dim a, sj_dim b) {
    if (!t || !dim_ok(t, a, "sj_dim_add") || !dim_ok(t, b, "sj_dim_add")) return (sj_dim){-2};
    return dim_result(t, sj_ex_add(t->g->ex, a.e, b.e), "sj_dim_add");
}

sj_dim sj_dim_div(sj_tracer *t, sj_dim a, sj_dim b) {
    if (!t || !dim_ok(t, a, "sj_dim_div") || !dim_ok(t, b, "sj_dim_div")) return (sj_dim){-2};
    sj_exprs *ex = t->g->ex;
    snprintf(t->why, sizeof t->why, "sj_dim_div");
    t->inf.why = t->why;
    if (sj_infer_eq(&t->inf, b.e, sj_ex_const(ex, 0))) {
        fail(t, SJ_ESHAPE, "sj_dim_div: division of %lld by zero", (long long)sj_ex_hint(ex, a.e));
        return (sj_dim){-2};
    }
    if (!sj_infer_eq(&t->inf, sj_ex_mod(ex, a.e, b.e), sj_ex_const(ex, 0))) {
        fail(t, SJ_ESHAPE, "sj_dim_div: %lld is not a multiple of %lld", (long long)sj_ex_hint(ex, a.e),
             (long long)sj_ex_hint(ex, b.e));
        return (sj_dim){-2};
    }
    return dim_result(t, sj_ex_floordiv(ex, a.e, b.e), "sj_dim_div");
}

sj_val sj_param(sj_tracer *t, const sj_tensor *w) {
    if (!t || t->err) return BAD;
    if (!w) return fail(t, SJ_EINVAL, "sj_param: w is NULL");
    if (sj_tensor_check(w, "sj_param: w") != SJ_OK) return fail(t, SJ_EINVAL, "%s", sj_last_error());
    if (w->device != SJ_HOST && w->device != t->req->device)
        return fail(t, SJ_EINVAL, "sj_param: w is a device tensor, and this runtime's backend is the CPU");
    sj_value v = {.dtype = w->dtype, .rank = (int8_t)w->rank};
    for (int i = 0; i < w->rank; i++) {
        v.shape[i] = sj_ex_const(t->g->ex, w->shape[i]);
        if (v.shape[i] == SJ_EX_NONE) return fail(t, SJ_ENOMEM, "sj_param: out of memory while tracing");
    }
    int32_t id = sj_graph_add_param(t->g, w, &v);
    if (id < 0) return fail(t, SJ_ENOMEM, "sj_param: out of memory while tracing");
    return (sj_val){id};
}

sj_status sj_output(sj_tracer *t, sj_val v) {
    if (!t) return sj_seterr(SJ_EINVAL, "sj_output: tracer is NULL");
    if (!ok(t, v, "sj_output", "v")) return t->err;
    if (t->g->n_outputs >= SJ_MAX_OUTPUTS) {
        fail(t, SJ_EINVAL, "sj_output: more than %d outputs", SJ_MAX_OUTPUTS);
        return t->err;
    }
    if (sj_graph_add_output(t->g, v.id)) fail(t, SJ_ENOMEM, "sj_output: out of memory while tracing");
    return t->err;
}

/* -- Tracing ---------------------------------------------------------------- */

sj_status sj_trace(const sj_trace_req *req, sj_trace_result *res) {
    sj_tracer t = {0};
    t.req = req;
    t.g = sj_graph_create(req->n_inputs);
    if (!t.g) return sj_seterr(SJ_ENOMEM, "fn '%s': out of memory creating a graph", req->fn_name);
    sj_infer_init(&t.inf, t.g->ex);

    sj_val ins[SJ_MAX_INPUTS];
    for (int i = 0; i < req->n_inputs && !t.err; i++) {
        const sj_tensor *x = &req->inputs[i];
        sj_value v = {.dtype = x->dtype, .kind = SJ_VAL_INPUT, .rank = (int8_t)x->rank, .index = i};
        for (int a = 0; a < x->rank; a++) {
            v.shape[a] = req->dim_policy ? req->dim_policy(req->dim_ctx, t.g->ex, i, a, x->shape[a])
                                         : sj_ex_const(t.g->ex, x->shape[a]);
            if (v.shape[a] == SJ_EX_NONE) fail(&t, SJ_ENOMEM, "out of memory while tracing");
        }
        int32_t id = sj_graph_add_value(t.g, &v);
        if (id < 0) fail(&t, SJ_ENOMEM, "out of memory while tracing");
        ins[i].id = id;
    }

    sj_status st = t.err;
    if (!st) {
        st = req->model(&t, ins, req->n_inputs, req->user);
        if (t.err) st = t.err; /* an op error wins over what the model returned */
        else if (st && !sj_status_known(st)) { /* not a status: a model bug, named as one */
            snprintf(t.msg, sizeof t.msg, "the model function returned %d, which is not an sj_status", (int)st);
            st = SJ_EMODEL;
        } else if (st) {
            /* an sj_ function the model called without a tracer (sj_output(NULL, ...)) said why */
            const char *why = sj_last_error();
            snprintf(t.msg, sizeof t.msg, "the model function returned %s%s%s%s", sj_status_name(st),
                     *why ? " (its last error: " : "", why, *why ? ")" : "");
        }
    }
    if (!st && t.g->n_outputs == 0) {
        st = SJ_EMODEL;
        snprintf(t.msg, sizeof t.msg, "the model function declared no outputs (call sj_output)");
    }
    if (!st) {
        /* checked as traced, then in canonical order (any evaluation order
         * of nested op calls gives the same graph, hence the same kernels
         * and cache keys), then checked again */
        st = sj_graph_check(t.g);
        if (!st) st = sj_graph_canonicalize(t.g);
        if (!st) st = sj_graph_check(t.g);
        if (st) snprintf(t.msg, sizeof t.msg, "%s", sj_last_error());
        else sj_graph_mark_bias_adds(t.g);
    }
    if (st) {
        sj_infer_free(&t.inf);
        sj_graph_destroy(t.g);
        return sj_seterr(st, "fn '%s': %s", req->fn_name, t.msg);
    }
    res->graph = t.g;
    res->facts = t.inf.facts;
    res->n_facts = t.inf.n_facts;
    return SJ_OK;
}
