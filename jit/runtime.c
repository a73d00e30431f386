/* Runtime lifecycle, configuration from the environment, host memory. */
#include "base/alloc.h"
#include "jit/runtime.h"

#include "base/bounded.h"
#include "base/clock.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cache.h"
#include "kernels/remote.h"
#include "jit/compile.h"
#include "base/error.h"
#include "base/tunables.h"
#include "kernels/cpu/eager.h"
#include "kernels/device.h"
#include "base/tensor.h"
#include "specialize/codegen.h"
#include "specialize/codegen_cuda.h"

/* -- Configuration --------------------------------------------------------- */

static void *default_alloc(void *user, size_t bytes, size_t align) {
    (void)user;
    if (align < sizeof(void *)) align = sizeof(void *);
    bytes = (bytes + align - 1) / align * align;
    return sj_aligned_alloc(align, bytes ? bytes : align);
}

static void default_free(void *user, void *p) {
    (void)user;
    free(p);
}

static void env_warn(const char *var, const char *value, const char *why) {
    fprintf(stderr, "shapejit: ignoring %s=%s (%s)\n", var, value, why);
}

/* The default cache dir: $XDG_CACHE_HOME/shapejit or ~/.cache/shapejit,
 * found once per process. */
static char dflt_cache[512];
static pthread_once_t dflt_cache_once = PTHREAD_ONCE_INIT;

static void find_default_cache(void) {
    const char *xdg = secure_getenv("XDG_CACHE_HOME"), *home = secure_getenv("HOME");
    if (xdg && *xdg) snprintf(dflt_cache, sizeof dflt_cache, "%s/shapejit", xdg);
    else if (home && *home) snprintf(dflt_cache, sizeof dflt_cache, "%s/.cache/shapejit", home);
}

void sj_runtime_config_init(sj_runtime_config *cfg) {
    if (!cfg) return;
    memset(cfg, 0, sizeof *cfg);
    cfg->backend = SJ_BACKEND_AUTO;
    cfg->log_mask = SJ_LOG_WARN;
    cfg->allocator = (sj_allocator){default_alloc, default_free, NULL};
    sj_tunables_defaults(cfg);
    cfg->buckets = NULL;
    cfg->compile_mode = SJ_COMPILE_ASYNC;
    cfg->cc = NULL;
    cfg->cflags = NULL;
    cfg->dump_dir = NULL;
    pthread_once(&dflt_cache_once, find_default_cache);
    cfg->cache_dir = dflt_cache[0] ? dflt_cache : NULL;

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
    v = getenv("SHAPEJIT_COMPILE");
    if (v && *v) {
        if (!strcmp(v, "async")) cfg->compile_mode = SJ_COMPILE_ASYNC;
        else if (!strcmp(v, "sync")) cfg->compile_mode = SJ_COMPILE_SYNC;
        else if (!strcmp(v, "off")) cfg->compile_mode = SJ_COMPILE_OFF;
        else env_warn("SHAPEJIT_COMPILE", v, "expected async, sync or off");
    }
    sj_tunables_from_env(cfg);
    if ((v = secure_getenv("SHAPEJIT_CACHE_DIR"))) cfg->cache_dir = *v ? v : NULL;
    if ((v = secure_getenv("SHAPEJIT_CC")) && *v) cfg->cc = v;
    if ((v = secure_getenv("SHAPEJIT_CFLAGS")) && *v) cfg->cflags = v;
    if ((v = secure_getenv("SHAPEJIT_CC_VERSION")) && *v) cfg->cc_version = v;
    if ((v = secure_getenv("SHAPEJIT_DUMP")) && *v) cfg->dump_dir = v;
    if ((v = secure_getenv("SHAPEJIT_NVRTC_FLAGS")) && *v) cfg->nvrtc_flags = v;
    if ((v = secure_getenv("SHAPEJIT_CACHE_KEY")) && *v) cfg->cache_key = v;
    if ((v = secure_getenv("SHAPEJIT_REMOTE_CACHE_URL")) && *v) {
        if (sj_remote_check_url(v)) {
            env_warn("SHAPEJIT_REMOTE_CACHE_URL", v, sj_last_error());
            sj_clearerr();
        } else {
            cfg->remote_cache_url = v;
        }
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

/* -- Lifecycle ------------------------------------------------------------- */

static int test_delay_ms, test_fail; /* sj_runtime_test_hooks, read by start_services */

/* What the device is made from: the runtime's configuration. */
static sj_dev_config dev_config(const sj_runtime *rt) {
    const sj_runtime_config *c = &rt->cfg;
    return (sj_dev_config){.cuda_device = c->cuda_device, .cuda_tf32 = c->cuda_tf32 != 0,
                           .cuda_pdl = c->cuda_pdl != 0, .cc = c->cc, .cflags = c->cflags,
                           .cc_version = c->cc_version, .nvrtc_flags = c->nvrtc_flags, .dump_dir = c->dump_dir,
                           .cache = rt->cache, .remote = rt->remote, .log = &rt->log, .host = &c->allocator,
                           .test_delay_ms = test_delay_ms, .test_fail = test_fail,
                           .timeout_ms = c->compile_timeout_ms, .no_probe = c->compile_mode == SJ_COMPILE_OFF,
                           .exec_threads = c->exec_threads, .exec_min_work = c->exec_min_work,
                           .exec_spin_us = c->exec_spin_us,
                           .blas_threads = c->blas_threads};
}

/* The persistent cache. One that cannot be opened only costs warm
 * starts: warned about, not fatal. */
static void open_disk_cache(sj_runtime *rt) {
    const sj_runtime_config *c = &rt->cfg;
    if (c->cache_dir && *c->cache_dir && sj_cache_open_keyed(c->cache_dir, c->cache_max_bytes, c->cache_key, &rt->log, &rt->cache)) {
        snprintf(rt->cache_error, sizeof rt->cache_error, "%s", sj_last_error());
        sj_logf(rt, SJ_LOG_WARN, "no persistent kernel cache: %s", rt->cache_error);
        sj_clearerr();
    }
}

/* The remote cache: a second level under the disk cache for either
 * backend's compiles (keys name the backend, its compiler and the device's
 * architecture, so CPU and GPU artifacts never mix). One that cannot be
 * used (no key, a host that does not resolve) is warned about and left
 * out, as a disk cache is. */
static void open_remote_cache(sj_runtime *rt) {
    const sj_runtime_config *c = &rt->cfg;
    if (c->remote_cache_url && *c->remote_cache_url &&
        sj_remote_open(c->remote_cache_url, c->cache_key, c->remote_cache_timeout_ms, &rt->log, &rt->remote)) {
        sj_logf(rt, SJ_LOG_WARN, "no remote kernel cache: %s", sj_last_error());
        sj_clearerr();
    }
}

/* The compile workers, over the device's compiling slots: the runtime's
 * one background job queue, which the device may post its own background
 * work to (its set_post slot: the cuBLASLt warmer's jobs). */
static sj_status start_compiler(sj_runtime *rt) {
    const sj_runtime_config *c = &rt->cfg;
    int mode = c->compile_mode == SJ_COMPILE_SYNC ? SJ_CM_SYNC : c->compile_mode == SJ_COMPILE_OFF ? SJ_CM_OFF : SJ_CM_ASYNC;
    sj_codegen_fn codegen = rt->backend->device == SJ_CUDA ? sj_codegen_cuda : sj_codegen_c;
    sj_status st = sj_compiler_create(rt->backend, codegen, c->compile_threads, mode, rt, &rt->compiler);
    if (!st && rt->backend->set_post) rt->backend->set_post(rt->backend, sj_compiler_post, rt->compiler);
    return st;
}

/* Stop the queue: the device posts no more first (its jobs still queued
 * are dropped back to it). */
static void stop_compiler(sj_runtime *rt) {
    if (rt->backend && rt->backend->set_post) rt->backend->set_post(rt->backend, NULL, NULL);
    sj_compiler_destroy(rt->compiler);
    rt->compiler = NULL;
}

/* The caches, the device (CUDA when the backend is CUDA or AUTO finds one;
 * on AUTO a missing driver or device is not an error: the runtime runs on
 * the CPU), the compile workers (which also capture graphs). */
static sj_status start_services(sj_runtime *rt) {
    const sj_runtime_config *c = &rt->cfg;
    open_disk_cache(rt);
    open_remote_cache(rt);
    sj_status st = SJ_OK;
    if (c->backend == SJ_BACKEND_CUDA || (c->backend == SJ_BACKEND_AUTO && sj_device_cuda_built())) {
        sj_dev_config dc = dev_config(rt);
        st = sj_device_create(SJ_BACKEND_CUDA, &dc, &rt->backend);
        if (!st) rt->backend_kind = SJ_BACKEND_CUDA;
        else if (c->backend == SJ_BACKEND_AUTO) {
            sj_logf(rt, SJ_LOG_PERF, "backend auto: running on the CPU (%s)", sj_last_error());
            sj_clearerr();
            st = SJ_OK;
        }
    }
    if (!st && !rt->backend) {
        sj_dev_config dc = dev_config(rt);
        st = sj_device_create(SJ_BACKEND_CPU, &dc, &rt->backend);
    }
    if (!st) st = start_compiler(rt);
    if (!st && c->cuda_gemm && rt->backend->device == SJ_CUDA)
        sj_logf(rt, SJ_LOG_PERF, "cuda_gemm %d: generated products in fused plans: on an H100 the encoder layer 6-7%% "
                "faster at 16 tokens, the same from 64, for 2.5-3x a unit's compile time (bench/RESULTS.md)",
                c->cuda_gemm);
    if (!st && c->cuda_gemm && c->cuda_gemm_ln && rt->backend->device == SJ_CUDA)
        sj_logf(rt, SJ_LOG_PERF, "cuda_gemm_ln: LayerNorms inside generated products: on an H100 slower than the "
                "separate kernel in a CUDA graph (the tuner keeps cuBLASLt; bench/RESULTS.md)");
    if (st) sj_err_prefix("sj_runtime_create: ");
    return st;
}

int64_t sj_runtime_now_ns(const sj_runtime *rt) {
    return rt && rt->cfg.clock_ns ? rt->cfg.clock_ns(rt->cfg.clock_user) : sj_now_ns();
}

void sj_runtime_test_wrong_kernels(sj_runtime *rt, float skew) { rt->test_skew = skew; }

void sj_runtime_test_quick(sj_runtime *rt, bool on) { rt->test_quick = on; }

int sj_runtime_run_background(sj_runtime *rt, int max_jobs) {
    sj_clearerr();
    if (!rt || max_jobs <= 0) return 0;
    return sj_compiler_run_queued(rt->compiler, max_jobs);
}

void sj_runtime_test_hooks(sj_runtime *rt, int delay_ms, int fail) {
    test_delay_ms = delay_ms;
    test_fail = fail;
    if (!rt) return;
    /* remake the compiler with the hooks (no function may exist yet) */
    stop_compiler(rt);
    rt->backend->recompiler(rt->backend, NULL); /* before the caches it uses close */
    sj_cache_close(rt->cache);
    rt->cache = NULL;
    sj_remote_close(rt->remote);
    rt->remote = NULL;
    open_disk_cache(rt);
    open_remote_cache(rt);
    sj_dev_config dc = dev_config(rt);
    if (!rt->backend->recompiler(rt->backend, &dc)) start_compiler(rt);
    test_delay_ms = test_fail = 0;
}

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
    if ((st = sj_tunables_check(&c, "sj_runtime_create"))) return st;
    if (c.remote_cache_url && *c.remote_cache_url && (st = sj_remote_check_url(c.remote_cache_url))) {
        sj_err_prefix("sj_runtime_create: ");
        return st;
    }
    if ((unsigned)c.compile_mode > SJ_COMPILE_OFF)
        return sj_seterr(SJ_EINVAL, "sj_runtime_create: compile_mode %d is not a mode", (int)c.compile_mode);
    if (c.backend == SJ_BACKEND_CUDA && !sj_device_cuda_built())
        return sj_seterr(SJ_EBACKEND, "sj_runtime_create: the CUDA backend is not built into this library "
                                      "(built without the CUDA toolkit); use SJ_BACKEND_CPU or SJ_BACKEND_AUTO");
    if ((st = sj_device_cuda_check_flags(c.nvrtc_flags))) { /* whichever device the runtime gets */
        sj_err_prefix("sj_runtime_create: ");
        return st;
    }
    sj_bucket_rule *rules = NULL;
    int n_rules = 0;
    if ((st = sj_bucket_parse(c.buckets, &rules, &n_rules))) {
        sj_err_prefix("sj_runtime_create: ");
        return st;
    }

    sj_runtime *rt = sj_calloc(1, sizeof *rt);
    if (!rt || pthread_mutex_init(&rt->lock, NULL)) {
        free(rt);
        free(rules);
        return sj_seterr(SJ_ENOMEM, "sj_runtime_create: out of memory");
    }
    rt->cfg = c;
    rt->log = (sj_log_sink){c.log_mask, c.log_fn, c.log_user, c.event_fn, c.event_user};
    const char **fields[9] = {&rt->cfg.buckets,          &rt->cfg.cache_dir,   &rt->cfg.cc,
                              &rt->cfg.cflags,           &rt->cfg.dump_dir,    &rt->cfg.nvrtc_flags,
                              &rt->cfg.cache_key,        &rt->cfg.remote_cache_url, &rt->cfg.cc_version};
    bool oom = false;
    for (int i = 0; i < 9; i++) {
        if (!*fields[i]) continue;
        rt->strings[i] = sj_strdup(*fields[i]);
        oom |= !rt->strings[i];
        *fields[i] = rt->strings[i];
    }
    rt->bucket_rules = rules;
    rt->n_bucket_rules = n_rules;
    rt->backend_kind = SJ_BACKEND_CPU;
    atomic_init(&rt->total_entries, 0);
    if (oom) {
        sj_runtime_destroy(rt);
        return sj_seterr(SJ_ENOMEM, "sj_runtime_create: out of memory");
    }
    sj_status st2 = start_services(rt);
    if (st2) {
        sj_runtime_destroy(rt);
        return st2;
    }
    *out = rt;
    return SJ_OK;
}

sj_backend_kind sj_runtime_backend(const sj_runtime *rt) { return rt ? rt->backend_kind : SJ_BACKEND_CPU; }

void sj_runtime_job_counters(const sj_runtime *rt, sj_job_counters *out) {
    if (!out) return;
    memset(out, 0, sizeof *out);
    if (rt) sj_compiler_job_counters(rt->compiler, out);
}

void sj_runtime_cache_counters(const sj_runtime *rt, sj_cache_counters *out) {
    if (!out) return;
    memset(out, 0, sizeof *out);
    if (!rt) return;
    if (rt->cache) {
        sj_cache_stats d;
        sj_cache_get_stats(rt->cache, &d);
        *out = (sj_cache_counters){.disk_enabled = 1, .disk_hits = d.hits, .disk_misses = d.misses,
                                   .disk_stores = d.stores, .disk_refused = d.corrupt, .disk_evictions = d.evictions};
    }
    if (rt->remote) {
        sj_remote_stats r;
        sj_remote_get_stats(rt->remote, &r);
        out->remote_enabled = 1;
        out->remote_hits = r.hits, out->remote_misses = r.misses, out->remote_stores = r.stores;
        out->remote_refused = r.refused, out->remote_errors = r.errors, out->remote_skipped = r.skipped;
        out->remote_bytes_in = r.bytes_in, out->remote_bytes_out = r.bytes_out;
    }
}

void sj_fn_destroy(sj_fn *fn);

void sj_runtime_destroy(sj_runtime *rt) {
    if (!rt) return;
    while (rt->fns) sj_fn_destroy(rt->fns); /* unlinks itself, after its compiles */
    stop_compiler(rt);
    if (rt->backend) {
        /* compiles abandoned by the destroys above finish first (bounded):
         * exiting under an NVRTC one crashes in its exit-time destructors */
        if (rt->backend->wait_abandoned) rt->backend->wait_abandoned(rt->backend, rt->cfg.compile_timeout_ms);
        rt->backend->destroy(rt->backend);
    }
    sj_cache_close(rt->cache);
    sj_remote_close(rt->remote);
    pthread_mutex_destroy(&rt->lock);
    free(rt->bucket_rules);
    for (int i = 0; i < 9; i++) free(rt->strings[i]);
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
    if (t->device == SJ_CUDA) {
        if (rt->backend && rt->backend->free) {
            rt->backend->free(rt->backend, t->data);
            t->data = NULL;
            return;
        }
        /* not this runtime's memory: a CPU runtime never allocates on a device */
        sj_logf(rt, SJ_LOG_WARN, "sj_tensor_free: a device tensor given to a CPU runtime; not freed");
        return;
    }
    sj_host_free(rt, t->data);
    t->data = NULL;
}

void *sj_runtime_stream(const sj_runtime *rt) {
    return rt && rt->backend && rt->backend->stream ? rt->backend->stream(rt->backend) : NULL;
}

sj_status sj_tensor_alloc(sj_runtime *rt, sj_tensor *t) {
    sj_clearerr();
    if (!rt || !t) return sj_seterr(SJ_EINVAL, "sj_tensor_alloc: rt or t is NULL");
    sj_tensor c = *t; /* checked as it will be: contiguous, with data */
    c.data = (void *)1;
    sj_tensor_set_contiguous(&c);
    sj_status st = sj_tensor_check(&c, "sj_tensor_alloc: t");
    if (st) return st; /* *t unchanged */
    sj_tensor_set_contiguous(t);
    size_t bytes = sj_tensor_nbytes(t);
    if (t->device == SJ_CUDA) {
        if (rt->backend->alloc) {
            void *p = rt->backend->alloc(rt->backend, bytes);
            if (!p) return SJ_ENOMEM; /* the allocator said why */
            t->data = p;
            return SJ_OK;
        }
        return sj_seterr(SJ_EINVAL, "sj_tensor_alloc: device memory asked of a CPU runtime");
    }
    t->data = sj_host_alloc(rt, bytes ? bytes : 1, 64);
    return t->data ? SJ_OK : sj_seterr(SJ_ENOMEM, "sj_tensor_alloc: out of memory for %zu bytes", bytes);
}

sj_status sj_tensor_copy(sj_runtime *rt, sj_tensor *dst, const sj_tensor *src) {
    sj_clearerr();
    if (!rt || !dst || !src) return sj_seterr(SJ_EINVAL, "sj_tensor_copy: NULL argument");
    sj_status st = sj_tensor_check(src, "sj_tensor_copy: src");
    if (!st) st = sj_tensor_check(dst, "sj_tensor_copy: dst");
    if (st) return st;
    if (src->rank != dst->rank) return sj_seterr(SJ_ESHAPE, "sj_tensor_copy: ranks differ (%d vs %d)", src->rank, dst->rank);
    for (int a = 0; a < src->rank; a++)
        if (src->shape[a] != dst->shape[a])
            return sj_seterr(SJ_ESHAPE, "sj_tensor_copy: size mismatch at axis %d: %lld vs %lld", a,
                             (long long)src->shape[a], (long long)dst->shape[a]);
    if (!sj_tensor_is_contiguous(src) || !sj_tensor_is_contiguous(dst))
        return sj_seterr(SJ_EINVAL, "sj_tensor_copy: both tensors must be contiguous");
    size_t bytes = sj_tensor_nbytes(src);
    bool convert = src->dtype != dst->dtype;
    if (!sj_tensor_nbytes(dst) && !bytes) return SJ_OK;
    if (src->device == SJ_HOST && dst->device == SJ_HOST) {
        if (!convert) {
            memmove(dst->data, src->data, bytes); /* the two may overlap */
            return SJ_OK;
        }
        const char *s0 = src->data, *d0 = dst->data;
        if (s0 < d0 + sj_tensor_nbytes(dst) && d0 < s0 + bytes)
            return sj_seterr(SJ_EINVAL, "sj_tensor_copy: src and dst overlap, and a dtype conversion (%s to %s) "
                                        "needs them apart", sj_dtype_name(src->dtype), sj_dtype_name(dst->dtype));
        return sj_cpu_copy(src, dst); /* converts as sj_cast does */
    }
    if (!rt->backend->tensor_copy) return sj_seterr(SJ_EINVAL, "sj_tensor_copy: device memory on a CPU runtime");
    return rt->backend->tensor_copy(rt->backend, dst, src);
}
