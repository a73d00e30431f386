/* NVRTC loaded with dlopen for the tests' compile checks; see
 * tests/util_nvrtc.h. */
/* cmocka.h needs these first, in this order */
/* clang-format off */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
/* clang-format on */

#include "tests/util_nvrtc.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SYM(field, name)                                                                                        \
    do {                                                                                                        \
        *(void **)&nv->field = dlsym(nv->h, name);                                                              \
        if (!nv->field) return false;                                                                           \
    } while (0)

bool tu_nvrtc_load(tu_nvrtc *nv) {
    const char *dirs[] = {getenv("SHAPEJIT_CUDA_LIBS"), getenv("CUDA_HOME"), "/usr/local/cuda", NULL};
    char path[512];
    for (int i = 0; i < 4 && !nv->h; i++) {
        if (i < 3 && !dirs[i]) continue;
        if (i == 3) snprintf(path, sizeof path, "libnvrtc.so.13");
        else snprintf(path, sizeof path, "%s%s/libnvrtc.so.13", dirs[i], i == 0 ? "" : "/lib64");
        nv->h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    }
    if (!nv->h) return false;
    SYM(Version, "nvrtcVersion");
    SYM(CreateProgram, "nvrtcCreateProgram");
    SYM(CompileProgram, "nvrtcCompileProgram");
    SYM(GetCUBINSize, "nvrtcGetCUBINSize");
    SYM(GetCUBIN, "nvrtcGetCUBIN");
    SYM(GetPTXSize, "nvrtcGetPTXSize");
    SYM(GetPTX, "nvrtcGetPTX");
    SYM(GetProgramLogSize, "nvrtcGetProgramLogSize");
    SYM(GetProgramLog, "nvrtcGetProgramLog");
    SYM(DestroyProgram, "nvrtcDestroyProgram");
    SYM(GetNumSupportedArchs, "nvrtcGetNumSupportedArchs");
    SYM(GetSupportedArchs, "nvrtcGetSupportedArchs");
    return true;
}

void tu_nvrtc_check(const tu_nvrtc *nv, nvrtc_prog prog, int r, const char *what, const char *src) {
    size_t ln = 0;
    nv->GetProgramLogSize(prog, &ln);
    char *log = calloc(1, ln + 1);
    assert_non_null(log);
    if (ln) nv->GetProgramLog(prog, log);
    bool warned = strstr(log, "warning") || strstr(log, "Warning");
    if (r || warned) {
        fprintf(stderr, "%s: NVRTC %s\n%s\n", what, r ? "failed" : "warned", log);
        if (src) fprintf(stderr, "%s\n", src);
    }
    free(log);
    assert_int_equal(r, 0);
    assert_false(warned);
}

void tu_nvrtc_output(const tu_nvrtc *nv, nvrtc_prog prog, bool ptx, char **out, size_t *out_len) {
    assert_int_equal((ptx ? nv->GetPTXSize : nv->GetCUBINSize)(prog, out_len), 0);
    *out = malloc(*out_len + 1);
    assert_non_null(*out);
    assert_int_equal((ptx ? nv->GetPTX : nv->GetCUBIN)(prog, *out), 0);
    (*out)[*out_len] = 0;
}
