/* Runtime lifecycle, configuration from the environment, host memory. */
#include "jit/runtime.h"

#include <stdlib.h>
#include <string.h>

#include "jit/error.h"

/* -- Configuration --------------------------------------------------------- */

static void *default_alloc(void *user, size_t bytes, size_t align) {
    (void)user;
    if (align < sizeof(void *)) align = sizeof(void *);
    bytes = (bytes + align - 1) / align * align;
    return aligned_alloc(align, bytes ? bytes : align);
}

static void default_free(void *user, void *p) {
    (void)user;
    free(p);
}

static void env_warn(const char *var, const char *value, const char *why) {
    fprintf(stderr, "shapejit: ignoring %s=%s (%s)\n", var, value, why);
}

void sj_runtime_config_init(sj_runtime_config *cfg) {
    if (!cfg) return;
    memset(cfg, 0, sizeof *cfg);
    cfg->backend = SJ_BACKEND_AUTO;
    cfg->log_mask = SJ_LOG_WARN;
    cfg->allocator = (sj_allocator){default_alloc, default_free, NULL};
    cfg->recompile_limit = 8;
    cfg->total_recompile_limit = 256;
    cfg->hot_threshold = 2;
    cfg->specialize_threshold = 16;
    cfg->specialize_budget = 4;
    cfg->buckets = NULL;

    const char *v = getenv("SHAPEJIT_BACKEND");
    if (v && *v) {
        if (!strcmp(v, "auto")) cfg->backend = SJ_BACKEND_AUTO;
        else if (!strcmp(v, "cpu")) cfg->backend = SJ_BACKEND_CPU;
        else if (!strcmp(v, "cuda")) cfg->backend = SJ_BACKEND_CUDA;
        else env_warn("SHAPEJIT_BACKEND", v, "expected auto, cpu or cuda");
    }
    v = getenv("SHAPEJIT_LOG");
    if (v) {
        char bad[64];
        long m = sj_log_parse(v, bad, sizeof bad);
        if (m < 0) env_warn("SHAPEJIT_LOG", v, "unknown topic; topics: warn,recompiles,guards,compile,fusion,perf,trace,all,none");
        else cfg->log_mask = (unsigned)m;
    }
    v = getenv("SHAPEJIT_RECOMPILE_LIMIT");
    if (v && *v) {
        char *end;
        long n = strtol(v, &end, 10);
        if (*end || n < 1 || n > 1000000) env_warn("SHAPEJIT_RECOMPILE_LIMIT", v, "expected an integer in [1, 1000000]");
        else cfg->recompile_limit = (int)n;
    }
    v = getenv("SHAPEJIT_BUCKETS");
    if (v && *v) {
        sj_bucket_rule *rules;
        int n;
        if (sj_bucket_parse(v, &rules, &n)) {
            env_warn("SHAPEJIT_BUCKETS", v, sj_last_error());
            sj_clearerr();
        } else {
            free(rules);
            cfg->buckets = v;
        }
    }
}

static sj_status check_tunable(const char *name, int v) {
    if (v < 1 || v > 1000000)
        return sj_seterr(SJ_EINVAL, "sj_runtime_create: %s %d out of range [1, 1000000]", name, v);
    return SJ_OK;
}

/* -- Lifecycle ------------------------------------------------------------- */

sj_status sj_runtime_create(const sj_runtime_config *cfg, sj_runtime **out) {
    sj_clearerr();
    if (!out) return sj_seterr(SJ_EINVAL, "sj_runtime_create: rt is NULL");
    *out = NULL;
    sj_runtime_config c;
    if (cfg) c = *cfg;
    else sj_runtime_config_init(&c);
    if (c.backend != SJ_BACKEND_AUTO && c.backend != SJ_BACKEND_CPU && c.backend != SJ_BACKEND_CUDA)
        return sj_seterr(SJ_EINVAL, "sj_runtime_create: backend %d is not a backend", (int)c.backend);
    if (c.log_mask & ~(unsigned)SJ_LOG_ALL)
        return sj_seterr(SJ_EINVAL, "sj_runtime_create: log_mask 0x%x has unknown bits", c.log_mask);
    if (!c.allocator.alloc != !c.allocator.free)
        return sj_seterr(SJ_EINVAL, "sj_runtime_create: allocator needs both alloc and free, or neither");
    if (!c.allocator.alloc) c.allocator = (sj_allocator){default_alloc, default_free, NULL};
    sj_status st;
    if ((st = check_tunable("recompile_limit", c.recompile_limit)) ||
        (st = check_tunable("total_recompile_limit", c.total_recompile_limit)) ||
        (st = check_tunable("hot_threshold", c.hot_threshold)) ||
        (st = check_tunable("specialize_threshold", c.specialize_threshold)) ||
        (st = check_tunable("specialize_budget", c.specialize_budget)))
        return st;
    sj_bucket_rule *rules = NULL;
    int n_rules = 0;
    if ((st = sj_bucket_parse(c.buckets, &rules, &n_rules))) {
        sj_err_prefix("sj_runtime_create: ");
        return st;
    }
    if (c.backend == SJ_BACKEND_CUDA)
        return sj_seterr(SJ_EBACKEND, "sj_runtime_create: the CUDA backend is not built into this library; "
                                      "use SJ_BACKEND_CPU or SJ_BACKEND_AUTO");

    sj_runtime *rt = calloc(1, sizeof *rt);
    char *text = c.buckets ? strdup(c.buckets) : NULL;
    if (!rt || (c.buckets && !text) || pthread_mutex_init(&rt->lock, NULL)) {
        free(rt);
        free(text);
        free(rules);
        return sj_seterr(SJ_ENOMEM, "sj_runtime_create: out of memory");
    }
    rt->cfg = c;
    rt->cfg.buckets = text;
    rt->buckets_text = text;
    rt->bucket_rules = rules;
    rt->n_bucket_rules = n_rules;
    rt->backend = SJ_BACKEND_CPU;
    atomic_init(&rt->total_entries, 0);
    *out = rt;
    return SJ_OK;
}

sj_backend_kind sj_runtime_backend(const sj_runtime *rt) { return rt ? rt->backend : SJ_BACKEND_CPU; }

void sj_fn_destroy(sj_fn *fn);

void sj_runtime_destroy(sj_runtime *rt) {
    if (!rt) return;
    while (rt->fns) sj_fn_destroy(rt->fns); /* unlinks itself */
    pthread_mutex_destroy(&rt->lock);
    free(rt->bucket_rules);
    free(rt->buckets_text);
    free(rt);
}

/* -- Host memory ----------------------------------------------------------- */

void *sj_host_alloc(const sj_runtime *rt, size_t bytes, size_t align) {
    return rt->cfg.allocator.alloc(rt->cfg.allocator.user, bytes, align);
}

void sj_host_free(const sj_runtime *rt, void *p) {
    if (p) rt->cfg.allocator.free(rt->cfg.allocator.user, p);
}

void sj_tensor_free(sj_runtime *rt, sj_tensor *t) {
    if (!rt || !t || !t->data) return;
    sj_host_free(rt, t->data);
    t->data = NULL;
}
