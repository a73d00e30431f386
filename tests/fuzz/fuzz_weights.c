/* libFuzzer: the safetensors reader (sj_weights_*). The input is written
 * to a file and opened; every tensor is listed, described and read as f32
 * (converted where it can be). Any input must end in SJ_OK or an error
 * with a message, never a crash, a leak or a read past the file. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "jit/shapejit.h"

static sj_runtime *rt;
static char path[64];

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size) {
    if (!rt) {
        sj_runtime_config cfg;
        sj_runtime_config_init(&cfg);
        cfg.backend = SJ_BACKEND_CPU;
        cfg.compile_mode = SJ_COMPILE_OFF;
        cfg.cache_dir = NULL;
        cfg.exec_threads = 1;
        if (sj_runtime_create(&cfg, &rt)) abort();
        snprintf(path, sizeof path, "/tmp/fuzz_weights.%d", (int)getpid());
    }
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    fwrite(data, 1, size, f);
    fclose(f);
    sj_weights *w = NULL;
    if (sj_weights_open(rt, path, &w) == SJ_OK) {
        for (int i = 0; i < sj_weights_count(w); i++) {
            const char *name = sj_weights_name(w, i);
            sj_tensor t;
            if (sj_weights_info(w, name, &t) == SJ_OK) {
                volatile unsigned char sink = 0;
                size_t bytes = (size_t)sj_tensor_numel(&t) * sj_dtype_size(t.dtype);
                for (size_t k = 0; k < bytes; k++) sink ^= ((const unsigned char *)t.data)[k];
                (void)sink;
            }
            if (sj_weights_get(w, name, SJ_F32, 0, NULL, &t) && !sj_last_error()[0]) abort();
        }
        sj_weights_close(w);
    } else if (!sj_last_error()[0]) {
        abort();
    }
    unlink(path);
    return 0;
}
