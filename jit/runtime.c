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
    if (c.backend == SJ_BACKEND_CUDA)
        return sj_seterr(SJ_EBACKEND, "sj_runtime_create: the CUDA backend is not built into this library; "
                                      "use SJ_BACKEND_CPU or SJ_BACKEND_AUTO");

    sj_runtime *rt = calloc(1, sizeof *rt);
    if (!rt) return sj_seterr(SJ_ENOMEM, "sj_runtime_create: out of memory");
    rt->cfg = c;
    rt->backend = SJ_BACKEND_CPU;
    if (pthread_mutex_init(&rt->lock, NULL)) {
        free(rt);
        return sj_seterr(SJ_ENOMEM, "sj_runtime_create: cannot create a mutex");
    }
    *out = rt;
    return SJ_OK;
}

sj_backend_kind sj_runtime_backend(const sj_runtime *rt) { return rt ? rt->backend : SJ_BACKEND_CPU; }

void sj_fn_destroy(sj_fn *fn);

void sj_runtime_destroy(sj_runtime *rt) {
    if (!rt) return;
    while (rt->fns) sj_fn_destroy(rt->fns); /* unlinks itself */
    pthread_mutex_destroy(&rt->lock);
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
