/* The CUDA backend (see backend_cuda.h): generated CUDA C compiled by NVRTC
 * into a CUBIN for the device's own architecture (PTX where NVRTC does not
 * know it), kept in the persistent cache, loaded with cuModuleLoadData.
 *
 * A compile: key -> cache hit (cuModuleLoadData + cuModuleGetFunction; any
 * failure is a miss) -> else NVRTC, load the image, resolve the symbols,
 * and only then store it, so the cache never receives an image that did
 * not load here. A unit of several kernels is split into up to `pieces`
 * programs (sj_codegen_cuda_split) compiled at once, one thread each
 * (NVRTC is thread-safe across programs); their images are kept together
 * as one artifact (an image set: imgset.h), loaded as one module each.
 * After creation the backend's only mutable state is the table of loaded
 * modules (sj_modshare, locked); module calls bind the device's context
 * first.
 */
#include "kernels/cuda/backend_cuda.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/bounded.h"
#include "base/clock.h"
#include "base/error.h"
#include "kernels/cuda/imgset.h"
#include "specialize/codegen_cuda.h" /* the unit's layout: its split into programs */

_Static_assert(SJ_CUDA_PIECES_MAX <= SJ_IMGSET_MAX, "an image set holds every program of a split unit");

typedef struct cuda_backend {
    sj_backend base; /* first: the table the JIT sees */
    sj_cuda *cuda;
    sj_cache *cache;
    sj_remote *remote;  /* the second level under cache (NULL: none) */
    sj_modshare *share; /* loaded modules by key */
    char *dump_dir;
    const sj_log_sink *log;
    int test_delay_ms, test_fail;
    int timeout_ms;      /* NVRTC runs abandoned past it (0: never) */
    int pieces;          /* programs a unit is split into at most (1: none) */
    bool ptx;            /* arch is virtual: PTX, which the driver compiles at load */
    char arch[32];       /* "sm_90", or "compute_90" for PTX */
    char nvrtc_id[32];   /* "nvrtc 13.0" */
    sj_nvrtc_opts opts;  /* every compile's NVRTC options */
    char opt_line[704];  /* the same, joined by spaces (in the cache key) */
    /* A quick compile's (sj_compile_req.quick): opts with NVRTC's fast
     * compile (SJ_NVRTC_QUICK_FLAG) after them; argc 0: NVRTC has none */
    sj_nvrtc_opts opts_quick;
    char opt_line_quick[720];
    char identity[1024];
    pthread_t warm;     /* NVRTC's warm-up (warm_main), joined at destroy */
    bool warming;
} cuda_backend;

/* One loaded module per image of the artifact. */
struct sj_module {
    int n;
    CUmodule mods[];
};

/* -- Loading ------------------------------------------------------------------ */

/* The driver's name and text for r, into buf. */
static void cu_error_text(const sj_cuda *c, CUresult r, char *buf, size_t n) {
    const char *name = NULL, *str = NULL;
    if (c->api.GetErrorName(r, &name) != CUDA_SUCCESS) name = NULL;
    if (c->api.GetErrorString(r, &str) != CUDA_SUCCESS) str = NULL;
    if (name) snprintf(buf, n, "%s (%s)", name, str ? str : "no description");
    else snprintf(buf, n, "CUresult %d", (int)r);
}

/* Resolve every symbol of req in m's modules (the first that has it) into
 * out->fns (the context bound); false with out->log set. */
static bool resolve_in(const sj_cuda *c, const sj_module *m, const sj_compile_req *req, sj_compile_result *out) {
    char err[256];
    for (int i = 0; i < req->n_symbols; i++) {
        CUfunction f = NULL;
        CUresult r = CUDA_ERROR_NOT_FOUND;
        for (int k = 0; k < m->n && r == CUDA_ERROR_NOT_FOUND; k++) r = c->api.ModuleGetFunction(&f, m->mods[k], req->symbols[i]);
        if (r != CUDA_SUCCESS || !f) {
            if (r == CUDA_ERROR_NOT_FOUND)
                snprintf(out->log, sizeof out->log,
                         "symbol '%s' not found in the compiled unit (a kernel needs extern \"C\" __global__)",
                         req->symbols[i]);
            else {
                cu_error_text(c, r, err, sizeof err);
                snprintf(out->log, sizeof out->log, "cuModuleGetFunction('%s') failed: %s", req->symbols[i], err);
            }
            return false;
        }
        out->fns[i] = (void *)f;
    }
    return true;
}

static void unload_all(const sj_cuda *c, sj_module *m) {
    for (int k = 0; k < m->n; k++) c->api.ModuleUnload(m->mods[k]);
    free(m);
}

/* Load an artifact (a CUBIN or an image set) and resolve every symbol into
 * out. On failure writes why to out->log and returns false with nothing
 * loaded. */
static bool load(const cuda_backend *b, const void *image, size_t len, const sj_compile_req *req,
                 sj_compile_result *out) {
    sj_cuda *c = b->cuda;
    char err[256];
    sj_img im[SJ_IMGSET_MAX];
    int n = sj_imgset_parse(image, len, im, out->log, sizeof out->log);
    if (!n) return false;
    sj_module *m = malloc(sizeof *m + (size_t)n * sizeof m->mods[0]);
    if (!m) {
        snprintf(out->log, sizeof out->log, "out of memory");
        return false;
    }
    m->n = 0;
    sj_cuda_bind(c);
    for (int k = 0; k < n; k++) {
        CUresult r = c->api.ModuleLoadData(&m->mods[k], im[k].data);
        if (r != CUDA_SUCCESS) {
            cu_error_text(c, r, err, sizeof err);
            snprintf(out->log, sizeof out->log, "cuModuleLoadData failed: %s (%s %s from %s, driver %d)", err,
                     b->arch, im[k].kind == SJ_IMG_PTX ? "PTX" : "code", b->nvrtc_id, c->driver_version);
            unload_all(c, m);
            return false;
        }
        m->n++;
    }
    if (!resolve_in(c, m, req, out)) {
        unload_all(c, m);
        return false;
    }
    out->module = m;
    return true;
}

/* -- Compile ------------------------------------------------------------------- */

static sj_status fail(const cuda_backend *b, sj_compile_result *out, const char *tag, const char *what) {
    return sj_backend_fail(b->log, "cuda", out, tag, what);
}


/* The program's log into out->log (truncated). */
static void program_log(const sj_cuda_api *a, nvrtcProgram prog, sj_compile_result *out) {
    out->log[0] = '\0';
    size_t n = 0;
    if (a->nvrtcGetProgramLogSize(prog, &n) != NVRTC_SUCCESS || n <= 1) return;
    char *text = malloc(n);
    if (!text) return;
    if (a->nvrtcGetProgramLog(prog, text) == NVRTC_SUCCESS) {
        text[n - 1] = '\0';
        snprintf(out->log, sizeof out->log, "%s", text);
    }
    free(text);
}

/* -- Bounded NVRTC runs -------------------------------------------------------- */

/* nvrtcCompileProgram runs inside the process and cannot be stopped, so it
 * runs on a thread of its own (base/bounded.h) and is waited for up to
 * compile_timeout_ms or the function's cancel flag. An abandoned job is
 * finished and freed by that thread, so it owns copies of everything it
 * uses: the entry points (NVRTC is opened with RTLD_NODELETE: they stay
 * mapped whatever the runtime does meanwhile), the options and the
 * programs. A job of several programs compiles them at once: one on the
 * job's thread, each other on a helper thread it starts and joins (one
 * that cannot start is compiled on the job's thread after its own). */
typedef struct nvrtc_job nvrtc_job;
typedef struct nvrtc_piece {
    nvrtc_job *job;
    nvrtcProgram prog;
    nvrtcResult nr;
} nvrtc_piece;

struct nvrtc_job {
    nvrtcResult (*compile)(nvrtcProgram, int, const char *const *);
    nvrtcResult (*destroy)(nvrtcProgram *);
    int n;
    nvrtc_piece piece[SJ_CUDA_PIECES_MAX];
    int argc;
    const char *argv[8 + SJ_NVRTC_MAX_FLAGS];
    char text[]; /* the options' strings */
};

static void *nvrtc_piece_run(void *p) {
    nvrtc_piece *pc = p;
    pc->nr = pc->job->compile(pc->prog, pc->job->argc, pc->job->argv);
    return NULL;
}

static void nvrtc_job_run(void *p) {
    nvrtc_job *j = p;
    pthread_t th[SJ_CUDA_PIECES_MAX];
    bool started[SJ_CUDA_PIECES_MAX] = {false};
    for (int i = 1; i < j->n; i++) started[i] = !pthread_create(&th[i], NULL, nvrtc_piece_run, &j->piece[i]);
    nvrtc_piece_run(&j->piece[0]);
    for (int i = 1; i < j->n; i++) {
        if (started[i]) pthread_join(th[i], NULL);
        else nvrtc_piece_run(&j->piece[i]);
    }
}

static void nvrtc_job_free(void *p) {
    nvrtc_job *j = p;
    for (int i = 0; i < j->n; i++)
        if (j->piece[i].prog) j->destroy(&j->piece[i].prog);
    free(j);
}

static nvrtc_job *nvrtc_job_new(const cuda_backend *b, bool quick) {
    const sj_nvrtc_opts *o = quick && b->opts_quick.argc ? &b->opts_quick : &b->opts;
    size_t n = 0;
    for (int i = 0; i < o->argc; i++) n += strlen(o->argv[i]) + 1;
    nvrtc_job *j = sj_calloc(1, sizeof *j + n);
    if (!j) return NULL;
    j->compile = b->cuda->api.nvrtcCompileProgram;
    j->destroy = b->cuda->api.nvrtcDestroyProgram;
    j->argc = o->argc;
    char *t = j->text;
    for (int i = 0; i < o->argc; i++) {
        size_t len = strlen(o->argv[i]) + 1;
        memcpy(t, o->argv[i], len);
        j->argv[i] = t;
        t += len;
    }
    return j;
}

/* The compiled image of prog (malloc'd: a CUBIN, or NUL-terminated PTX)
 * into *im; false with out->log set. */
static bool take_image(const cuda_backend *b, nvrtcProgram prog, sj_img *im, sj_compile_result *out) {
    const sj_cuda_api *a = &b->cuda->api;
    size_t size = 0;
    char *data = NULL;
    nvrtcResult nr = (b->ptx ? a->nvrtcGetPTXSize : a->nvrtcGetCUBINSize)(prog, &size);
    if (nr == NVRTC_SUCCESS && size > 0) {
        if (!(data = malloc(size))) {
            snprintf(out->log, sizeof out->log, "out of memory for a %zu-byte %s", size, b->ptx ? "PTX" : "CUBIN");
            return false;
        }
        nr = (b->ptx ? a->nvrtcGetPTX : a->nvrtcGetCUBIN)(prog, data);
    }
    if (nr != NVRTC_SUCCESS || size == 0 || (b->ptx && data[size - 1])) {
        free(data);
        snprintf(out->log, sizeof out->log, "NVRTC: no %s for %s: %s", b->ptx ? "PTX" : "CUBIN", b->arch,
                 nr != NVRTC_SUCCESS ? a->nvrtcGetErrorString(nr) : size ? "PTX not terminated" : "empty");
        return false;
    }
    *im = (sj_img){data, size, b->ptx ? SJ_IMG_PTX : SJ_IMG_CUBIN};
    return true;
}

/* Runs NVRTC on src, split into up to b->pieces programs compiled at
 * once; on success *art (malloc'd: a CUBIN or an image set), *len and
 * *n_progs. Bounded by timeout_ms and *cancel (see above). */
static sj_status nvrtc_compile(cuda_backend *b, const char *src, const char *tag, bool quick, bool background,
                               const atomic_int *cancel, sj_compile_result *out, char **art, size_t *len,
                               int *n_progs) {
    const sj_cuda_api *a = &b->cuda->api;
    char name[256], msg[sizeof out->log + 128];
    snprintf(name, sizeof name, "%s.cu", tag);
    char *pieces[SJ_CUDA_PIECES_MAX];
    int n = sj_codegen_cuda_split(src, background ? 1 : b->pieces, pieces);
    nvrtc_job *job = n > 0 ? nvrtc_job_new(b, quick) : NULL;
    if (!job) {
        for (int i = 0; i < n; i++) free(pieces[i]);
        snprintf(out->log, sizeof out->log, "out of memory");
        fail(b, out, tag, out->log);
        return sj_seterr(SJ_ENOMEM, "cuda backend: %s: out of memory", tag);
    }
    nvrtcResult nr = NVRTC_SUCCESS;
    for (int i = 0; i < n; i++) { /* NVRTC copies the source */
        if (nr == NVRTC_SUCCESS) {
            nr = a->nvrtcCreateProgram(&job->piece[i].prog, pieces[i], name, 0, NULL, NULL);
            if (nr == NVRTC_SUCCESS) job->piece[job->n++].job = job;
        }
        free(pieces[i]);
    }
    if (nr != NVRTC_SUCCESS) {
        nvrtc_job_free(job);
        snprintf(out->log, sizeof out->log, "NVRTC: nvrtcCreateProgram: %s", a->nvrtcGetErrorString(nr));
        return fail(b, out, tag, out->log);
    }
    double t0 = sj_now_ms();
    int cancelled = 0;
    sj_status st = sj_run_bounded("NVRTC", nvrtc_job_run, nvrtc_job_free, job, b->timeout_ms, cancel, &cancelled);
    out->compile_ms = sj_now_ms() - t0;
    if (st == SJ_ETIMEOUT) { /* the job is the thread's now */
        if (cancelled) snprintf(out->log, sizeof out->log, "compile cancelled: NVRTC left to finish in the background");
        else
            snprintf(out->log, sizeof out->log,
                     "compile failed: NVRTC did not finish in %d ms (compile_timeout_ms); left to finish in the "
                     "background",
                     b->timeout_ms);
        return fail(b, out, tag, out->log);
    }
    if (st) {
        snprintf(out->log, sizeof out->log, "%s", sj_last_error());
        nvrtc_job_free(job);
        return fail(b, out, tag, out->log);
    }
    for (int i = 0; i < job->n; i++) { /* the first that failed, with its log */
        nvrtc_piece *pc = &job->piece[i];
        if (pc->nr == NVRTC_SUCCESS) continue;
        program_log(a, pc->prog, out);
        int ln;
        const char *line = sj_backend_error_line(out->log, &ln);
        snprintf(msg, sizeof msg, "NVRTC: %s: %.*s", a->nvrtcGetErrorString(pc->nr), ln, line);
        nvrtc_job_free(job);
        if (!out->log[0]) snprintf(out->log, sizeof out->log, "%s", msg);
        return fail(b, out, tag, msg);
    }
    sj_img im[SJ_CUDA_PIECES_MAX];
    int got = 0;
    while (got < job->n && take_image(b, job->piece[got].prog, &im[got], out)) got++;
    bool ok = got == job->n;
    *n_progs = job->n;
    nvrtc_job_free(job);
    *art = ok ? sj_imgset_make(im, got, len) : NULL;
    for (int i = 0; i < got; i++) free((void *)im[i].data);
    if (ok && !*art) {
        snprintf(out->log, sizeof out->log, "out of memory");
        fail(b, out, tag, out->log);
        return sj_seterr(SJ_ENOMEM, "cuda backend: %s: out of memory", tag);
    }
    return ok ? SJ_OK : fail(b, out, tag, out->log);
}

static sj_status compile_fresh(void *self, const sj_compile_req *req, const char *src, const char *tag,
                               const char *note, sj_compile_result *out) {
    cuda_backend *b = self;
    char *cubin = NULL;
    size_t len = 0;
    int progs = 1;
    sj_status st = nvrtc_compile(b, src, tag, req->quick, req->background, req->cancel, out, &cubin, &len, &progs);
    if (st) return st;
    if (!load(b, cubin, len, req, out)) {
        free(cubin);
        return fail(b, out, tag, out->log);
    }
    out->log[0] = '\0';
    if (b->cache && !(req->quick && b->opts_quick.argc) && /* (a quick unit is not kept) */
        sj_cache_store(b->cache, out->key, "cubin", cubin, len))
        sj_log_write(b->log, SJ_LOG_WARN, "cuda: %s: not cached: %s", tag, sj_last_error());
    free(cubin);
    sj_log_write(b->log, SJ_LOG_COMPILE,
                 "cuda: %s: compiled in %.1f ms for %s (%d program%s at once, %zu-byte %s, key %.16s)%s", tag,
                 out->compile_ms, b->arch, progs, progs == 1 ? "" : "s", len, b->ptx ? "PTX" : "CUBIN", out->key,
                 note);
    return SJ_OK;
}

/* -- Driver steps (sj_backend_compile) --------------------------------------- */

static int cuda_load_cached(void *self, const sj_compile_req *req, sj_compile_result *out) {
    cuda_backend *b = self;
    void *image = NULL;
    size_t len = 0;
    if (!b->cache || !sj_cache_load(b->cache, out->key, "cubin", &image, &len)) return 0;
    bool ok = load(b, image, len, req, out);
    free(image);
    return ok ? 1 : -1;
}

/* A remote hit (verified by kernels/remote.c): load the CUBIN as it came. */
static int cuda_load_bytes(void *self, const void *data, size_t len, const sj_compile_req *req,
                           sj_compile_result *out) {
    return load(self, data, len, req, out) ? 1 : -1;
}

static bool cuda_resolve(void *self, sj_module *m, const sj_compile_req *req, sj_compile_result *out) {
    cuda_backend *b = self;
    sj_cuda_bind(b->cuda);
    return resolve_in(b->cuda, m, req, out);
}

static void cuda_drop(void *self, sj_module *m) {
    cuda_backend *b = self;
    sj_cuda_bind(b->cuda);
    unload_all(b->cuda, m);
}

/* Programs a unit is split into by default: half the online CPUs (the
 * other half left to the process's serving), 1 to 8. */
static int default_pieces(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN) / 2;
    return n < 1 ? 1 : n > 8 ? 8 : (int)n;
}

static sj_status cuda_compile(sj_backend *base, const sj_compile_req *req, sj_compile_result *out) {
    cuda_backend *b = (cuda_backend *)base;
    bool quick = req && out && req->quick && b->opts_quick.argc; /* (a bad request: the driver says what is wrong) */
    const char *key[] = {"cuda", b->arch, b->nvrtc_id, b->opt_line};
    sj_backend_driver d = {.who = "cuda", .ext = ".cu", .key_parts = key, .n_key_parts = 4, .log = b->log,
                           .dump_dir = b->dump_dir, .test_delay_ms = b->test_delay_ms, .test_fail = b->test_fail,
                           .self = b, .load_cached = cuda_load_cached, .compile_fresh = compile_fresh,
                           .share = b->share, .cache = b->cache, .cache_ext = "cubin",
                           .remote = b->remote, .load_bytes = cuda_load_bytes, .resolve = cuda_resolve, .drop = cuda_drop};
    if (quick) { /* the full unit where it is loaded or cached already; else a quick one, under its own key */
        d.lookup_only = true;
        d.test_delay_ms = 0;
        sj_status st = sj_backend_compile(&d, req, out);
        if (st || out->module) return st;
        d.lookup_only = false;
        d.test_delay_ms = b->test_delay_ms;
        key[3] = b->opt_line_quick;
    }
    sj_status st = sj_backend_compile(&d, req, out);
    if (!st) out->quick = quick;
    return st;
}

/* -- Table and lifecycle ------------------------------------------------------- */

static void cuda_unload(sj_backend *base, sj_module *m) {
    cuda_backend *b = (cuda_backend *)base;
    if (m && sj_modshare_release(b->share, m)) cuda_drop(b, m);
}

static const char *cuda_identity_fn(sj_backend *base) { return ((cuda_backend *)base)->identity; }

/* NVRTC's first compile in a process pays its own start-up (its builtin
 * headers and ptxas loaded: bench_nvrtc's first compile of a unit took
 * 65 ms more than the next on VM-Zen4, and a runtime's first unit reached
 * its first fused call in 250 ms against 130-150 on an H100 host): the
 * process's first backend compiles a one-line kernel on a thread of its
 * own, so that a first request's unit does not. */
static void *warm_main(void *p) {
    cuda_backend *b = p;
    const sj_cuda_api *a = &b->cuda->api;
    nvrtcProgram prog = NULL;
    static const char src[] = "extern \"C\" __global__ void sj_warm(float *y) { y[threadIdx.x] = 1.0f; }\n";
    if (a->nvrtcCreateProgram(&prog, src, "sj_warm.cu", 0, NULL, NULL) == NVRTC_SUCCESS) {
        if (a->nvrtcCompileProgram(prog, b->opts.argc, b->opts.argv) != NVRTC_SUCCESS) {
        } /* (a failure shows in the first real compile) */
        a->nvrtcDestroyProgram(&prog);
    }
    return NULL;
}

static void cuda_destroy(sj_backend *base) {
    cuda_backend *b = (cuda_backend *)base;
    if (!b) return;
    if (b->warming) pthread_join(b->warm, NULL);
    free(b->dump_dir);
    sj_modshare_destroy(b->share);
    free(b);
}

/* o's options joined by spaces into line (the cache key's part; fits: o's
 * text and a space each). */
static void join_opts(const sj_nvrtc_opts *o, char *line, size_t n) {
    line[0] = '\0';
    for (int i = 0, len = 0; i < o->argc; i++)
        len += snprintf(line + len, n - (size_t)len, "%s%s", i ? " " : "", o->argv[i]);
}

sj_status sj_cuda_backend_create(const sj_cuda_backend_config *cfg, sj_backend **out) {
    if (!out) return sj_seterr(SJ_EINVAL, "sj_cuda_backend_create: out is NULL");
    *out = NULL;
    if (!cfg || !cfg->cuda) return sj_seterr(SJ_EINVAL, "sj_cuda_backend_create: no CUDA device given");
    if (cfg->test_delay_ms < 0) return sj_seterr(SJ_EINVAL, "sj_cuda_backend_create: test_delay_ms < 0");
    const sj_cuda *c = cfg->cuda;
    if (!c->api.nvrtcCompileProgram || !c->ctx)
        return sj_seterr(SJ_EINVAL, "sj_cuda_backend_create: the CUDA device is not open");
    cuda_backend *b = calloc(1, sizeof *b);
    if (!b) return sj_seterr(SJ_ENOMEM, "sj_cuda_backend_create: out of memory");
    if ((cfg->dump_dir && cfg->dump_dir[0] && !(b->dump_dir = strdup(cfg->dump_dir))) ||
        !(b->share = sj_modshare_create())) {
        cuda_destroy(&b->base);
        return sj_seterr(SJ_ENOMEM, "sj_cuda_backend_create: out of memory");
    }
    b->cuda = cfg->cuda;
    b->cache = cfg->cache;
    b->remote = cfg->remote;
    b->log = cfg->log;
    b->test_delay_ms = cfg->test_delay_ms;
    b->test_fail = cfg->test_fail;
    b->timeout_ms = cfg->timeout_ms;
    b->pieces = cfg->nvrtc_threads > 0 ? cfg->nvrtc_threads : default_pieces();
    if (b->pieces > SJ_CUDA_PIECES_MAX) b->pieces = SJ_CUDA_PIECES_MAX;
    /* the device's architecture when NVRTC knows it (a CUBIN), else PTX */
    int archs[128], n_archs = 0;
    if (c->api.nvrtcGetNumSupportedArchs(&n_archs) != NVRTC_SUCCESS || n_archs < 0 || n_archs > 128 ||
        c->api.nvrtcGetSupportedArchs(archs) != NVRTC_SUCCESS)
        n_archs = 0;
    b->ptx = !sj_nvrtc_target(c->cc_major, c->cc_minor, archs, n_archs, b->arch, sizeof b->arch);
    snprintf(b->nvrtc_id, sizeof b->nvrtc_id, "nvrtc %d.%d", c->nvrtc_major, c->nvrtc_minor);
    if (b->ptx)
        sj_log_write(b->log, SJ_LOG_WARN,
                     "cuda: NVRTC %d.%d cannot generate code for sm_%d%d: kernels are compiled to %s PTX, which the "
                     "driver compiles at load (a newer NVRTC avoids it: SHAPEJIT_CUDA_LIBS)",
                     c->nvrtc_major, c->nvrtc_minor, c->cc_major, c->cc_minor, b->arch);
    sj_status st = sj_nvrtc_options(b->arch, c->nvrtc_major * 100 + c->nvrtc_minor, cfg->nvrtc_flags, &b->opts);
    if (st) {
        cuda_destroy(&b->base);
        sj_err_prefix("sj_cuda_backend_create: ");
        return st;
    }
    join_opts(&b->opts, b->opt_line, sizeof b->opt_line);
    /* quick compiles: the same options and NVRTC's fast compile (which
     * nvrtc_flags may also name: the last one counts), the generated
     * products stubbed (SJ_CUDA_QUICK_MACRO) */
    if (c->nvrtc_major * 100 + c->nvrtc_minor >= SJ_NVRTC_QUICK_SINCE) {
        char flags[SJ_NVRTC_FLAGS_LEN + 32];
        snprintf(flags, sizeof flags, "%s%s%s -D%s", cfg->nvrtc_flags ? cfg->nvrtc_flags : "",
                 cfg->nvrtc_flags && cfg->nvrtc_flags[0] ? " " : "", SJ_NVRTC_QUICK_FLAG, SJ_CUDA_QUICK_MACRO);
        if (sj_nvrtc_options(b->arch, c->nvrtc_major * 100 + c->nvrtc_minor, flags, &b->opts_quick)) {
            sj_clearerr(); /* (nvrtc_flags at their limit: no quick compiles) */
            b->opts_quick.argc = 0;
        }
        join_opts(&b->opts_quick, b->opt_line_quick, sizeof b->opt_line_quick);
    }

    snprintf(b->identity, sizeof b->identity, "cuda %s %s %s driver %d, %s", b->arch, c->name, b->nvrtc_id,
             c->driver_version, b->opt_line);
    static atomic_flag warmed = ATOMIC_FLAG_INIT; /* once a process */
    if (!atomic_flag_test_and_set(&warmed)) b->warming = !pthread_create(&b->warm, NULL, warm_main, b);
    b->base.name = "cuda";
    b->base.compile = cuda_compile;
    b->base.unload = cuda_unload;
    b->base.identity = cuda_identity_fn;
    b->base.destroy = cuda_destroy;
    *out = &b->base;
    return SJ_OK;
}
