/* The CUDA driver API, NVRTC and cuBLASLt, loaded with dlopen (see
 * cuda_api.h).
 *
 * Order: the driver first (no driver, no device: the common case on a CPU
 * machine, reported as "no CUDA driver: ..."), then NVRTC, then cuBLASLt.
 * Every symbol of the X-lists is resolved up front, so a missing one is an
 * error here, naming it, rather than a crash on first use.
 *
 * Every library is opened with RTLD_NODELETE, so dlclose only drops our
 * reference and a later load finds the same mapping: once cuInit has run,
 * libcuda has threads of its own that must not lose their code under them;
 * NVRTC and cuBLASLt carry their own static C++ runtimes, whose heap
 * (72 KiB of exception pool, at least) would leak at every real unload and
 * which may have registered thread-exit handlers. So "nothing stays loaded"
 * means no reference is kept: the mappings themselves stay until exit.
 *
 * Environment (read at each load; a load happens once per sj_cuda_open):
 *   SHAPEJIT_CUDA_LIBS  a directory searched first for NVRTC and cuBLASLt
 *   CUDA_HOME           <CUDA_HOME>/lib64 searched next
 */
#include "kernels/cuda/cuda_api.h"

#include <dlfcn.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"

/* -- Opening libraries ------------------------------------------------------ */

static const char *const NVRTC_NAMES[] = {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"};
static const char *const LT_NAMES[] = {"libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"};
#define N_NAMES 3

/* Appends s to buf (of n bytes), "..." once it is full. */
static void append(char *buf, size_t n, const char *s) {
    size_t len = strlen(buf);
    if (len + 1 >= n) return;
    int w = snprintf(buf + len, n - len, "%s", s);
    if (w < 0 || (size_t)w >= n - len) {
        if (n >= 4) memcpy(buf + n - 4, "...", 4);
    }
}

/* dlopen the first of `names` found in the search directories, then by bare
 * name (the loader's path). NULL when none loads; `tried` lists what was
 * tried and `why` keeps the first error that was not a plain "not found"
 * (a library that exists but does not load says more than a missing one). */
static void *open_first(const char *const *names, int n_names, char *tried, size_t tn, char *why, size_t wn) {
    const char *env_libs = secure_getenv("SHAPEJIT_CUDA_LIBS");
    const char *cuda_home = secure_getenv("CUDA_HOME");
    char home_lib[PATH_MAX] = "";
    if (cuda_home && cuda_home[0]) snprintf(home_lib, sizeof home_lib, "%s/lib64", cuda_home);
    const char *dirs[] = {env_libs, home_lib, "/usr/local/cuda/lib64", NULL /* bare names */};
    tried[0] = '\0';
    why[0] = '\0';
    for (size_t d = 0; d < sizeof dirs / sizeof dirs[0]; d++) {
        bool bare = d == sizeof dirs / sizeof dirs[0] - 1;
        if (!bare && (!dirs[d] || !dirs[d][0])) continue;
        bool seen = false; /* CUDA_HOME is often /usr/local/cuda */
        for (size_t e = 0; e < d && !bare; e++) seen |= dirs[e] && !strcmp(dirs[e], dirs[d]);
        if (seen) continue;
        for (int i = 0; i < n_names; i++) {
            char path[PATH_MAX];
            if (bare) snprintf(path, sizeof path, "%s", names[i]);
            else if (snprintf(path, sizeof path, "%s/%s", dirs[d], names[i]) >= (int)sizeof path) continue;
            void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
            if (h) return h;
            const char *e = dlerror();
            if (tried[0]) append(tried, tn, ", ");
            append(tried, tn, path);
            /* "cannot open shared object file: No such file or directory" is
             * the expected miss; anything else is worth reporting. */
            if (!why[0] && e && !strstr(e, "No such file"))
                snprintf(why, wn, "%s", e);
        }
    }
    return NULL;
}

/* -- Resolving symbols -------------------------------------------------------- */

/* Versioned entry points newer than the drivers we still run on, with the
 * older symbol of the same signature to use instead. */
static const char *const FALLBACKS[][2] = {
    {"cuEventElapsedTime_v2", "cuEventElapsedTime"}, /* _v2 since driver 12.8 */
};

static void *resolve(void *h, const char *sym, const char *lib, sj_status *st) {
    if (*st) return NULL;
    dlerror();
    void *p = dlsym(h, sym);
    if (p) return p;
    const char *e = dlerror();
    char why[512];
    snprintf(why, sizeof why, "%s", e ? e : "no error text");
    for (size_t i = 0; !p && i < sizeof FALLBACKS / sizeof FALLBACKS[0]; i++)
        if (!strcmp(sym, FALLBACKS[i][0])) p = dlsym(h, FALLBACKS[i][1]);
    dlerror();
    if (!p) *st = sj_seterr(SJ_EBACKEND, "%s: symbol %s not found (%s)", lib, sym, why);
    return p;
}

void sj_cuda_api_unload(sj_cuda_api *api) {
    if (!api) return;
    if (api->h_lt) dlclose(api->h_lt);
    if (api->h_nvrtc) dlclose(api->h_nvrtc);
    if (api->h_cuda) dlclose(api->h_cuda);
    memset(api, 0, sizeof *api);
}

sj_status sj_cuda_api_load(sj_cuda_api *api) {
    if (!api) return sj_seterr(SJ_EINVAL, "sj_cuda_api_load: api is NULL");
    memset(api, 0, sizeof *api);

    /* The driver: libcuda.so.1 is what the driver package installs;
     * libcuda.so (a development link, or a stub directory) as a last try. */
    api->h_cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
    if (!api->h_cuda) {
        const char *e = dlerror();
        char first[512];
        snprintf(first, sizeof first, "%s", e ? e : "unknown error");
        api->h_cuda = dlopen("libcuda.so", RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
        if (!api->h_cuda) {
            dlerror();
            return sj_seterr(SJ_EBACKEND, "no CUDA driver: libcuda.so.1 not found (%s)", first);
        }
    }

    char tried[768], why[512];
    api->h_nvrtc = open_first(NVRTC_NAMES, N_NAMES, tried, sizeof tried, why, sizeof why);
    if (!api->h_nvrtc) {
        sj_seterr(SJ_EBACKEND, "NVRTC not found (tried %s)%s%s; set SHAPEJIT_CUDA_LIBS or CUDA_HOME", tried,
                  why[0] ? "; " : "", why);
        sj_cuda_api_unload(api);
        return SJ_EBACKEND;
    }
    api->h_lt = open_first(LT_NAMES, N_NAMES, tried, sizeof tried, why, sizeof why);
    if (!api->h_lt) {
        sj_seterr(SJ_EBACKEND, "cuBLASLt not found (tried %s)%s%s; set SHAPEJIT_CUDA_LIBS or CUDA_HOME", tried,
                  why[0] ? "; " : "", why);
        sj_cuda_api_unload(api);
        return SJ_EBACKEND;
    }

    sj_status st = SJ_OK;
#define SJ_X(ret, field, sym, args) api->field = (ret(*) args)resolve(api->h_cuda, sym, "CUDA driver (libcuda)", &st);
    SJ_CUDA_DRIVER_FNS(SJ_X)
#undef SJ_X
#define SJ_X(ret, field, sym, args) api->field = (ret(*) args)dlsym(api->h_cuda, sym);
    SJ_CUDA_DRIVER_OPT_FNS(SJ_X)
#undef SJ_X
    dlerror();
#define SJ_X(ret, field, sym, args) api->field = (ret(*) args)resolve(api->h_nvrtc, sym, "NVRTC", &st);
    SJ_NVRTC_FNS(SJ_X)
#undef SJ_X
#define SJ_X(ret, field, sym, args) api->field = (ret(*) args)resolve(api->h_lt, sym, "cuBLASLt", &st);
    SJ_CUBLASLT_FNS(SJ_X)
#undef SJ_X
    if (st) {
        sj_cuda_api_unload(api);
        return st;
    }
    return SJ_OK;
}
