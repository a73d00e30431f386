/* libFuzzer: the SHAPEJIT_BUCKETS syntax, through the public API.
 *
 * The input is a buckets string handed to sj_runtime_create (compiles off,
 * CPU backend), then a function of 2 inputs is created, which applies the
 * specs that name it. Any string must end in SJ_OK or SJ_EINVAL with a
 * message, never a crash, a leak or undefined behaviour. */
#include <stdlib.h>
#include <string.h>

#include "jit/shapejit.h"

static sj_status model(sj_tracer *t, const sj_val *in, int n, void *user) {
    (void)n;
    (void)user;
    return sj_output(t, sj_add(t, in[0], in[1]));
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size) {
    char *s = malloc(size + 1);
    if (!s) return 0;
    memcpy(s, data, size);
    s[size] = 0;
    sj_runtime_config cfg;
    sj_runtime_config_init(&cfg);
    cfg.backend = SJ_BACKEND_CPU;
    cfg.compile_mode = SJ_COMPILE_OFF;
    cfg.cache_dir = NULL;
    cfg.exec_threads = 1;
    cfg.buckets = s;
    sj_runtime *rt = NULL;
    if (sj_runtime_create(&cfg, &rt) == SJ_OK) {
        sj_fn *fn = NULL;
        if (sj_fn_create(rt, "f", 2, model, NULL, NULL, &fn) == SJ_OK) {
            float a[6] = {1, 2, 3, 4, 5, 6}, b[3] = {1, 1, 1};
            sj_tensor in[2] = {sj_tensor_make(a, SJ_F32, 2, (int64_t[]){2, 3}),
                               sj_tensor_make(b, SJ_F32, 1, (int64_t[]){3})};
            sj_tensor out = {0};
            if (sj_call(fn, in, 2, &out, 1) == SJ_OK) {
                const float *o = out.data;
                if (o[0] != 2 || o[5] != 7) abort();
                sj_tensor_free(rt, &out);
            }
            sj_fn_destroy(fn);
        } else if (!sj_last_error()[0]) {
            abort(); /* an error without a message */
        }
        sj_runtime_destroy(rt);
    } else if (!sj_last_error()[0]) {
        abort();
    }
    free(s);
    return 0;
}
