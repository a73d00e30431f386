/* The specialization policy: for each trace, which input sizes are
 * constants and which are symbols (with which ranges), from the function's
 * dynamic mode, its marks and buckets, and the sizes seen so far; and the
 * thresholds that decide when entries and shapes are hot.
 *
 * All of a policy's state is read and written under the owning function's
 * trace lock.
 */
#ifndef SJ_POLICY_H
#define SJ_POLICY_H

#include <stdbool.h>

#include "jit/shapejit.h"
#include "shapes/bucket.h"
#include "shapes/expr.h"
#include "shapes/infer.h"

typedef enum sj_rule_kind { SJ_RULE_NONE, SJ_RULE_DYNAMIC, SJ_RULE_STATIC, SJ_RULE_BUCKET } sj_rule_kind;

/* What the user configured for one input dimension. */
typedef struct sj_dim_rule {
    sj_rule_kind kind;
    int64_t min, max;       /* DYNAMIC */
    sj_bucket_spec *bucket; /* BUCKET (owned) */
} sj_dim_rule;

typedef struct sj_policy {
    sj_dynamic dynamic;
    int limit, limit_is_error, hot_threshold, specialize_threshold, specialize_budget;
    int n_inputs;
    sj_dim_rule *rules; /* n_inputs * SJ_MAX_RANK */
    int64_t *first;     /* n_inputs * SJ_MAX_RANK sizes first traced; -1 unseen */
    uint8_t *varies;    /* n_inputs: bit a set when axis a has seen two sizes */
} sj_policy;

sj_status sj_policy_init(sj_policy *p, int n_inputs);
void sj_policy_free(sj_policy *p);

/* Rules; the caller has validated input and axis. */
void sj_policy_mark_dynamic(sj_policy *p, int input, int axis, int64_t min, int64_t max);
void sj_policy_mark_static(sj_policy *p, int input, int axis);
/* Takes ownership of a malloc'd spec. */
void sj_policy_set_bucket(sj_policy *p, int input, int axis, sj_bucket_spec *spec);
const sj_dim_rule *sj_policy_rule(const sj_policy *p, int input, int axis);

/* -- Planning one trace ---------------------------------------------------------- */

typedef struct sj_dim_plan {
    bool symbolic;
    bool marked;   /* sj_mark_dynamic: specializing it is an error */
    bool bucketed;
    bool follower;  /* no rule, equal to a bucketed size: symbolic in its range, a symbol of its own */
    int64_t lo, hi; /* the symbol's range */
    int sym;        /* the symbol made for it (set while tracing), -1 if none */
} sj_dim_plan;

typedef struct sj_plan {
    int n_inputs;
    bool fallback; /* past the recompile limit */
    sj_dim_plan dims[SJ_MAX_INPUTS][SJ_MAX_RANK];
    const char *const *names;
} sj_plan;

/* Decide every input dimension for a trace of `in`. fallback: past the
 * recompile limit, every dimension that has varied is symbolic whatever the
 * mode. SJ_ECONSTRAINT when a size lies outside its mark or profile. */
sj_status sj_policy_plan(const sj_policy *p, const sj_tensor *in, bool fallback, const char *const *names,
                         sj_plan *plan);

/* The tracer's dim callback (sj_dim_policy) over an sj_plan: constants, or
 * symbols shared by equal sizes with equal ranges (duck sizing); a
 * follower always gets a symbol of its own. */
sj_expr sj_plan_dim(void *plan, sj_exprs *ex, int input, int axis, int64_t size);

/* After a trace: SJ_ECONSTRAINT if a fact pins a marked dimension to a
 * constant, naming the dimension and the op. */
sj_status sj_plan_check_facts(const sj_plan *plan, const sj_exprs *ex, const sj_fact *facts, int n_facts);

/* Record a successful trace of `in`: sizes first seen, and axes that vary. */
void sj_policy_observe(sj_policy *p, const sj_tensor *in);

/* "static", or "symbolic in x.size(1), y.size(0)" (with "bucket (16, 32]"
 * for bucketed dimensions). A dimension whose symbol the trace's facts tie
 * to a constant (a follower the model pins) is left out: its guard admits
 * one size. */
/* True when a fact of the trace ties symbol sym alone to a constant: its
 * guard admits one value, so the size is in effect static (a feature axis
 * that merely equalled a bucketed length). */
bool sj_plan_sym_pinned(const sj_exprs *ex, const sj_fact *facts, int n_facts, int sym);

void sj_plan_describe(const sj_plan *plan, const sj_tensor *in, const sj_exprs *ex, const sj_fact *facts,
                      int n_facts, char *buf, size_t n);

/* "x" or "input 0" for messages. */
const char *sj_input_name(const char *const *names, int input, char *buf, size_t n);

#endif /* SJ_POLICY_H */
