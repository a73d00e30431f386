/* NVRTC for the tests' compile checks (tests/util_nvrtc.c), loaded with
 * dlopen so that they need no CUDA headers and run in any build:
 * libnvrtc.so.13 from $SHAPEJIT_CUDA_LIBS, $CUDA_HOME/lib64,
 * /usr/local/cuda/lib64, then the loader's path. The types are nvrtc.h's,
 * restated. Linked into every test program; only dlopen and dlsym (and
 * cmocka's asserts), so that a test that does not call it carries no CUDA
 * dependency.
 */
#ifndef SJ_TEST_UTIL_NVRTC_H
#define SJ_TEST_UTIL_NVRTC_H

#include <stdbool.h>
#include <stddef.h>

typedef struct nvrtc_prog *nvrtc_prog;

/* The entry points the tests use; each returns nvrtcResult (0: success). */
typedef struct tu_nvrtc {
    void *h; /* the dlopen handle; NULL until loaded */
    int (*Version)(int *, int *);
    int (*CreateProgram)(nvrtc_prog *, const char *, const char *, int, const char *const *, const char *const *);
    int (*CompileProgram)(nvrtc_prog, int, const char *const *);
    int (*GetCUBINSize)(nvrtc_prog, size_t *);
    int (*GetCUBIN)(nvrtc_prog, char *);
    int (*GetPTXSize)(nvrtc_prog, size_t *);
    int (*GetPTX)(nvrtc_prog, char *);
    int (*GetProgramLogSize)(nvrtc_prog, size_t *);
    int (*GetProgramLog)(nvrtc_prog, char *);
    int (*DestroyProgram)(nvrtc_prog *);
    int (*GetNumSupportedArchs)(int *);
    int (*GetSupportedArchs)(int *);
} tu_nvrtc;

/* Opens the library into nv (once: a loaded nv is kept) and resolves every
 * entry point; false when the library is not found or lacks one. The
 * handle stays open for the life of the process. */
bool tu_nvrtc_load(tu_nvrtc *nv);

/* After prog's compile returned r: asserts r is 0 and the log holds no
 * warning; before failing, prints `what`, the log and (when not NULL) src
 * to stderr. */
void tu_nvrtc_check(const tu_nvrtc *nv, nvrtc_prog prog, int r, const char *what, const char *src);

/* prog's CUBIN, or its PTX when ptx, into *out (malloc'd, one NUL byte
 * past *out_len) (asserts). */
void tu_nvrtc_output(const tu_nvrtc *nv, nvrtc_prog prog, bool ptx, char **out, size_t *out_len);

#endif /* SJ_TEST_UTIL_NVRTC_H */
