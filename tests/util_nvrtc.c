/* NVRTC loaded with dlopen for the tests' compile checks; see
 * tests/util_nvrtc.h. */
#include "tests/util_nvrtc.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

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
