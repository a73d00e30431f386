/* The CUDA device's NVRTC options and target architecture
 * (kernels/cuda/nvrtc.h); built with and without the toolkit. */
#include "kernels/cuda/nvrtc.h"

#include <stdio.h>
#include <string.h>

#include "base/error.h"
#include "kernels/device.h"

/* -- NVRTC options ------------------------------------------------------------------- */

/* Append the string w (n bytes) to o's text and argv; false when full. */
static bool opt_add(sj_nvrtc_opts *o, size_t *used, const char *w, size_t n) {
    if (o->argc >= (int)(sizeof o->argv / sizeof o->argv[0]) || *used + n + 1 > sizeof o->text) return false;
    memcpy(o->text + *used, w, n);
    o->text[*used + n] = '\0';
    o->argv[o->argc++] = o->text + *used;
    *used += n + 1;
    return true;
}

sj_status sj_nvrtc_options(const char *arch, int nvrtc_version, const char *flags, sj_nvrtc_opts *o) {
    memset(o, 0, sizeof *o);
    if (flags && strlen(flags) > SJ_NVRTC_FLAGS_LEN)
        return sj_seterr(SJ_EINVAL, "nvrtc_flags: %zu characters, more than the %d allowed", strlen(flags),
                         SJ_NVRTC_FLAGS_LEN);
    char archopt[64];
    snprintf(archopt, sizeof archopt, "--gpu-architecture=%s", arch);
    const char *own[] = {archopt, "--std=c++17", "-default-device", "--extra-device-vectorization", "-minimal"};
    size_t used = 0, n_own = sizeof own / sizeof own[0] - (nvrtc_version < SJ_NVRTC_MINIMAL_SINCE);
    for (size_t i = 0; i < n_own; i++) opt_add(o, &used, own[i], strlen(own[i]));
    int words = 0;
    for (const char *p = flags ? flags : ""; *p;) {
        p += strspn(p, " \t");
        size_t n = strcspn(p, " \t");
        if (!n) break;
        if (++words > SJ_NVRTC_MAX_FLAGS)
            return sj_seterr(SJ_EINVAL, "nvrtc_flags: more than %d options in '%s'", SJ_NVRTC_MAX_FLAGS, flags);
        opt_add(o, &used, p, n); /* fits: the text holds the backend's options and 511 more characters */
        p += n;
    }
    return SJ_OK;
}

/* -- Target architecture --------------------------------------------------------------- */

bool sj_nvrtc_target(int cc_major, int cc_minor, const int *supported, int n, char *arch, size_t size) {
    int want = cc_major * 10 + cc_minor, below = -1;
    for (int i = 0; i < n; i++) {
        if (supported[i] == want) break;
        if (supported[i] < want && supported[i] > below) below = supported[i];
    }
    /* known, no list, or older than every one (NVRTC then says why) */
    bool known = n <= 0 || below < 0;
    for (int i = 0; i < n && !known; i++) known = supported[i] == want;
    /* Hopper (9.0): its own architecture, sm_90a, whose code runs on 9.0
     * devices only and holds the warpgroup products (wgmma) */
    if (known) snprintf(arch, size, "sm_%d%s", want, want == 90 ? "a" : "");
    else snprintf(arch, size, "compute_%d", below); /* newer than NVRTC: PTX the driver compiles */
    return known;
}

/* -- The runtime's check ---------------------------------------------------------------- */

sj_status sj_device_cuda_check_flags(const char *flags) {
    sj_nvrtc_opts o;
    return sj_nvrtc_options("sm_90", 0, flags, &o);
}
