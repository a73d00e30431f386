/* The specialization policy (see policy.h). */
#include "base/alloc.h"
#include "specialize/policy.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"

/* -- Rules ------------------------------------------------------------------------ */

sj_status sj_policy_init(sj_policy *p, int n_inputs) {
    memset(p, 0, sizeof *p);
    p->n_inputs = n_inputs;
    size_t n = (size_t)(n_inputs ? n_inputs : 1) * SJ_MAX_RANK;
    p->rules = sj_calloc(n, sizeof *p->rules);
    p->first = sj_malloc(n * sizeof *p->first);
    p->varies = sj_calloc((size_t)(n_inputs ? n_inputs : 1), 1);
    if (!p->rules || !p->first || !p->varies) {
        sj_policy_free(p);
        return SJ_ENOMEM;
    }
    for (size_t i = 0; i < n; i++) p->first[i] = -1;
    return SJ_OK;
}

void sj_policy_free(sj_policy *p) {
    if (p->rules)
        for (int i = 0; i < p->n_inputs * SJ_MAX_RANK; i++) free(p->rules[i].bucket);
    free(p->rules);
    free(p->first);
    free(p->varies);
    p->rules = NULL, p->first = NULL, p->varies = NULL;
}

static sj_dim_rule *rule(sj_policy *p, int input, int axis) { return &p->rules[input * SJ_MAX_RANK + axis]; }

const sj_dim_rule *sj_policy_rule(const sj_policy *p, int input, int axis) {
    return &p->rules[input * SJ_MAX_RANK + axis];
}

static void clear_rule(sj_dim_rule *r) {
    free(r->bucket);
    memset(r, 0, sizeof *r);
}

void sj_policy_mark_dynamic(sj_policy *p, int input, int axis, int64_t min, int64_t max) {
    sj_dim_rule *r = rule(p, input, axis);
    clear_rule(r);
    r->kind = SJ_RULE_DYNAMIC;
    r->min = min, r->max = max;
}

void sj_policy_mark_static(sj_policy *p, int input, int axis) {
    sj_dim_rule *r = rule(p, input, axis);
    clear_rule(r);
    r->kind = SJ_RULE_STATIC;
}

void sj_policy_set_bucket(sj_policy *p, int input, int axis, sj_bucket_spec *spec) {
    sj_dim_rule *r = rule(p, input, axis);
    clear_rule(r);
    r->kind = SJ_RULE_BUCKET;
    r->bucket = spec;
}

const char *sj_input_name(const char *const *names, int input, char *buf, size_t n) {
    if (names && names[input]) snprintf(buf, n, "input '%s'", names[input]);
    else snprintf(buf, n, "input %d", input);
    return buf;
}

/* -- Planning ------------------------------------------------------------------------ */

static bool varies_now(const sj_policy *p, const sj_tensor *in, int i, int a) {
    if (p->varies[i] & (1u << a)) return true;
    int64_t f = p->first[i * SJ_MAX_RANK + a];
    return f >= 0 && f != in[i].shape[a];
}

sj_status sj_policy_plan(const sj_policy *p, const sj_tensor *in, bool fallback, const char *const *names,
                         sj_plan *plan) {
    char nm[64];
    memset(plan, 0, sizeof *plan);
    plan->n_inputs = p->n_inputs;
    plan->fallback = fallback;
    plan->names = names;
    for (int i = 0; i < p->n_inputs; i++) {
        for (int a = 0; a < SJ_MAX_RANK; a++) {
            const sj_dim_rule *r = sj_policy_rule(p, i, a);
            sj_dim_plan *d = &plan->dims[i][a];
            d->sym = -1;
            if (a >= in[i].rank) { /* buckets on an axis the input lacks do not apply */
                if (r->kind == SJ_RULE_DYNAMIC || r->kind == SJ_RULE_STATIC)
                    return sj_seterr(SJ_EINVAL, "%s has rank %d, but axis %d has a mark",
                                     sj_input_name(names, i, nm, sizeof nm), in[i].rank, a);
                continue;
            }
            int64_t size = in[i].shape[a];
            d->lo = 2, d->hi = INT64_MAX;
            switch (r->kind) {
            case SJ_RULE_STATIC:
                break;
            case SJ_RULE_DYNAMIC:
                if (size < r->min || size > r->max) {
                    char hi[32];
                    if (r->max == INT64_MAX) snprintf(hi, sizeof hi, "inf)");
                    else snprintf(hi, sizeof hi, "%lld]", (long long)r->max);
                    return sj_seterr(SJ_ECONSTRAINT, "%s size %lld at axis %d is outside the range [%lld, %s given to sj_mark_dynamic",
                                     sj_input_name(names, i, nm, sizeof nm), (long long)size, a, (long long)r->min, hi);
                }
                if (size >= 2) {
                    d->symbolic = d->marked = true;
                    d->lo = r->min > 2 ? r->min : 2;
                    d->hi = r->max;
                }
                break;
            case SJ_RULE_BUCKET: {
                if (size < 2) break;
                int64_t lo, hi;
                if (!sj_bucket_find(r->bucket, size, &lo, &hi))
                    return sj_seterr(SJ_ECONSTRAINT, "%s size %lld at axis %d is outside the profile [%lld, %lld]",
                                     sj_input_name(names, i, nm, sizeof nm), (long long)size, a,
                                     (long long)r->bucket->min, (long long)r->bucket->max);
                d->symbolic = d->bucketed = true;
                d->lo = lo + 1 > 2 ? lo + 1 : 2;
                d->hi = hi;
                break;
            }
            case SJ_RULE_NONE:
                if (size < 2) break; /* 0 and 1 are always specialized */
                d->symbolic = p->dynamic == SJ_DYNAMIC_SYMBOLIC ||
                              ((p->dynamic == SJ_DYNAMIC_AUTO || fallback) && varies_now(p, in, i, a));
                break;
            }
        }
    }
    /* A size of no rule equal to a bucketed one follows it: symbolic with
     * the bucket's range, so that a second input of the same length does
     * not pin the bucket's symbol to this call's size through the equality
     * the model needs (a constant there would). It gets a symbol of its own
     * (sj_plan_dim), and the trace's relations say how it and the bucket's
     * relate: equal where the model needs them equal, and pinned alone
     * where the model ties it to a constant (a feature axis that merely
     * equals this call's length, contracted with a weight), which with one
     * shared symbol would have pinned the bucket too. (Marks stay exact: a
     * marked size that the model ties to an unmarked one is an error, see
     * sj_mark_dynamic.) */
    for (int i = 0; i < p->n_inputs; i++)
        for (int a = 0; a < in[i].rank; a++) {
            sj_dim_plan *d = &plan->dims[i][a];
            if (in[i].shape[a] < 2 || sj_policy_rule(p, i, a)->kind != SJ_RULE_NONE) continue;
            bool done = false;
            for (int j = 0; j < p->n_inputs && !done; j++)
                for (int b = 0; b < in[j].rank; b++) {
                    const sj_dim_plan *o = &plan->dims[j][b];
                    if (o->bucketed && in[j].shape[b] == in[i].shape[a]) {
                        d->symbolic = d->follower = done = true;
                        d->lo = o->lo, d->hi = o->hi;
                        break;
                    }
                }
        }
    return SJ_OK;
}

sj_expr sj_plan_dim(void *ctx, sj_exprs *ex, int input, int axis, int64_t size) {
    sj_plan *plan = ctx;
    sj_dim_plan *d = &plan->dims[input][axis];
    if (!d->symbolic) return sj_ex_const(ex, size);
    /* Duck sizing: an equal size with the same range shares the symbol
     * (followers neither share nor are shared: see sj_policy_plan). */
    for (int i = 0; i <= input && !d->follower; i++)
        for (int a = 0; a < SJ_MAX_RANK && (i < input || a < axis); a++) {
            const sj_dim_plan *o = &plan->dims[i][a];
            if (o->sym >= 0 && !o->follower && o->lo == d->lo && o->hi == d->hi && sj_sym_hint(ex, o->sym) == size) {
                d->sym = o->sym;
                return sj_ex_sym(ex, d->sym);
            }
        }
    d->sym = sj_sym_new(ex, size, d->lo, d->hi);
    return d->sym < 0 ? SJ_EX_NONE : sj_ex_sym(ex, d->sym);
}

/* For a fact "e == constant" (either way round): e, with the constant in
 * *c; else SJ_EX_NONE. */
static sj_expr eq_const(const sj_exprs *ex, const sj_fact *ft, int64_t *c) {
    if (ft->rel != SJ_REL_EQ) return SJ_EX_NONE;
    if (sj_ex_is_const(ex, ft->lhs, c)) return ft->rhs;
    if (sj_ex_is_const(ex, ft->rhs, c)) return ft->lhs;
    return SJ_EX_NONE;
}

sj_status sj_plan_check_facts(const sj_plan *plan, const sj_exprs *ex, const sj_fact *facts, int n_facts) {
    for (int f = 0; f < n_facts; f++) {
        const sj_fact *ft = &facts[f];
        int64_t c;
        sj_expr other = eq_const(ex, ft, &c);
        if (other == SJ_EX_NONE) continue;
        uint64_t syms = sj_ex_syms(ex, other);
        for (int i = 0; i < plan->n_inputs; i++)
            for (int a = 0; a < SJ_MAX_RANK; a++) {
                const sj_dim_plan *d = &plan->dims[i][a];
                if (!d->marked || d->sym < 0 || !(syms & (1ull << (d->sym < 63 ? d->sym : 63)))) continue;
                char nm[64], rel[128], rhs[32];
                sj_ex_print(ex, other, rel, sizeof rel);
                snprintf(rhs, sizeof rhs, "%lld", (long long)c);
                return sj_seterr(SJ_ECONSTRAINT,
                                 "%s axis %d was marked dynamic, but the model specializes it: it needs %s == %s%s%s%s",
                                 sj_input_name(plan->names, i, nm, sizeof nm), a, rel, rhs,
                                 ft->why[0] ? " (from " : "", ft->why, ft->why[0] ? ")" : "");
            }
    }
    return SJ_OK;
}

void sj_policy_observe(sj_policy *p, const sj_tensor *in) {
    for (int i = 0; i < p->n_inputs; i++)
        for (int a = 0; a < in[i].rank; a++) {
            int64_t *f = &p->first[i * SJ_MAX_RANK + a];
            if (*f < 0) *f = in[i].shape[a];
            else if (*f != in[i].shape[a]) p->varies[i] |= (uint8_t)(1u << a);
        }
}

bool sj_plan_sym_pinned(const sj_exprs *ex, const sj_fact *facts, int n_facts, int sym) {
    for (int f = 0; f < n_facts; f++) {
        int64_t c;
        int s;
        if (sj_ex_is_sym(ex, eq_const(ex, &facts[f], &c), &s) && s == sym) return true;
    }
    return false;
}

void sj_plan_describe(const sj_plan *plan, const sj_tensor *in, const sj_exprs *ex, const sj_fact *facts,
                      int n_facts, char *buf, size_t n) {
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; i < plan->n_inputs; i++)
        for (int a = 0; a < in[i].rank && used < n; a++) {
            const sj_dim_plan *d = &plan->dims[i][a];
            if (!d->symbolic || (d->sym >= 0 && sj_plan_sym_pinned(ex, facts, n_facts, d->sym))) continue;
            char nm[48];
            const char *name = plan->names && plan->names[i] ? plan->names[i] : NULL;
            if (name) snprintf(nm, sizeof nm, "%s", name);
            else snprintf(nm, sizeof nm, "in%d", i);
            used += (size_t)snprintf(buf + used, n - used, "%s%s.size(%d)", used ? ", " : "symbolic in ", nm, a);
            if (d->bucketed && used < n) {
                if (d->hi == INT64_MAX) used += (size_t)snprintf(buf + used, n - used, " bucket (%lld, inf)", (long long)d->lo - 1);
                else used += (size_t)snprintf(buf + used, n - used, " bucket (%lld, %lld]", (long long)d->lo - 1, (long long)d->hi);
            }
        }
    if (!used) snprintf(buf, n, "static");
}
