/* The validated swap: a newly compiled kernel is checked against eager
 * execution before it serves alone.
 *
 * A compiled unit (sj_compiled) arrives with checks_left =
 * cfg.validate_calls. While it is above 0, a call that would use the unit
 * runs eagerly into the caller's outputs (the result returned is the
 * trusted one) and runs the fused plan beside it into outputs of its own;
 * the two are compared with a dtype-aware tolerance. Equal: one check
 * fewer. Different: the unit is rejected (sj_compiler_reject) and never
 * used again. After validation, 1 call in cfg.validate_every (per entry
 * and thread shard) is checked the same way. Validation calls are
 * synchronous (on CUDA the stream is waited for) and never captured into
 * CUDA graphs. */
#ifndef SJ_VALIDATE_H
#define SJ_VALIDATE_H

#include <stdbool.h>

#include "jit/exec.h"

struct sj_fplan;

/* What a validation found. */
typedef struct sj_validation {
    bool differs;      /* the results differ past the tolerance */
    bool inconclusive; /* the fused run failed (memory): nothing learnt */
    int output;        /* the output with the largest error */
    double err, tol;   /* that error (max |fused - eager| / max |eager|) and its dtype's tolerance */
    char why[160];     /* differs: a sentence for logs and sj_fn_explain */
} sj_validation;

/* Run x eagerly into its outputs, then the fused plan (fns) into outputs of
 * its own, and compare. Returns the eager run's status (the call's); the
 * finding is in *v. */
sj_status sj_validate_call(const sj_exec *x, const struct sj_fplan *plan, void *const *fns, sj_validation *v);

/* The tolerance for a dtype: 1e-4 f32, 1e-2 f16, 6e-2 bf16 (relative to the
 * output's largest magnitude); 0 for integers and bools (bit for bit). */
double sj_validate_tolerance(sj_dtype dt);

#endif
