/* What the validated swap costs (issue 30): w2 (residual add, layernorm,
 * gelu; two outputs) on [rows, 768] f32, per call, in four configurations
 * of one runtime kind (CPU):
 *   eager            compiles off
 *   fused            validation off (validate_calls 0)
 *   validating       every call validated (validate_calls 1e6): eager +
 *                    fused + a compare
 *   after            validate_calls 2, measured once those 2 are done
 *   sampled_1_in_64  validate_calls 2, then validate_every 64
 * Median of repeated timed batches. Prints one JSON object per line.
 *   bench_validate [--quick] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench_util.h"
#include "jit/shapejit.h"

#define COLS 768

static sj_runtime *runtime(int compile, int calls, int every) {
    sj_runtime_config cfg;
    sj_runtime_config_init(&cfg);
    cfg.backend = SJ_BACKEND_CPU;
    cfg.compile_mode = compile ? SJ_COMPILE_SYNC : SJ_COMPILE_OFF;
    cfg.cache_dir = NULL;
    cfg.log_mask = SJ_LOG_WARN;
    cfg.validate_calls = calls;
    cfg.validate_every = every;
    sj_runtime *rt;
    if (sj_runtime_create(&cfg, &rt)) bench_die("sj_runtime_create");
    return rt;
}

int main(int argc, char **argv) {
    int quick = argc > 1 && !strcmp(argv[1], "--quick");
    static const struct {
        const char *name;
        int compile, calls, every;
    } cfgs[] = {{"eager", 0, 0, 0},
                {"fused", 1, 0, 0},
                {"validating", 1, 1000000, 0},
                {"after", 1, 2, 0},
                {"sampled_1_in_64", 1, 2, 64}};
    static const int64_t rows_list[] = {16, 256, 2048};
    uint64_t rng = 7;
    for (size_t r = 0; r < sizeof rows_list / sizeof rows_list[0]; r++) {
        int64_t R = rows_list[r];
        size_t n = (size_t)(R * COLS);
        float *x = malloc(n * 4), *res = malloc(n * 4), *y = malloc(n * 4), *h = malloc(n * 4);
        float *g = malloc(COLS * 4), *b = malloc(COLS * 4);
        bench_fill_rand(x, n, -2, 2, &rng);
        bench_fill_rand(res, n, -2, 2, &rng);
        bench_fill_rand(g, COLS, 0.5f, 1.5f, &rng);
        bench_fill_rand(b, COLS, -0.5f, 0.5f, &rng);
        sj_tensor in[4] = {sj_tensor_make(x, SJ_F32, 2, (int64_t[]){R, COLS}),
                           sj_tensor_make(res, SJ_F32, 2, (int64_t[]){R, COLS}),
                           sj_tensor_make(g, SJ_F32, 1, (int64_t[]){COLS}),
                           sj_tensor_make(b, SJ_F32, 1, (int64_t[]){COLS})};
        sj_tensor out[2] = {sj_tensor_make(y, SJ_F32, 2, (int64_t[]){R, COLS}),
                            sj_tensor_make(h, SJ_F32, 2, (int64_t[]){R, COLS})};
        double fused_us = 0;
        for (size_t c = 0; c < sizeof cfgs / sizeof cfgs[0]; c++) {
            sj_runtime *rt = runtime(cfgs[c].compile, cfgs[c].calls, cfgs[c].every);
            sj_fn *fn = bench_fn(rt, "w2", 4, bench_w2_model, cfgs[c].compile ? BENCH_STATIC : BENCH_EAGER);
            for (int i = 0; i < 4; i++) /* compile, and the first 2 checks of `after` */
                if (sj_call(fn, in, 4, out, 2)) bench_die("sj_call");
            int reps = quick ? 5 : 15, per = (int)(R >= 2048 ? 8 : R >= 256 ? 64 : 512);
            double t[15];
            for (int k = 0; k < reps; k++) {
                double t0 = bench_now_s();
                for (int i = 0; i < per; i++)
                    if (sj_call(fn, in, 4, out, 2)) bench_die("sj_call");
                t[k] = (bench_now_s() - t0) / per * 1e6;
            }
            qsort(t, (size_t)reps, sizeof t[0], bench_cmp_double);
            double med = t[reps / 2];
            if (!strcmp(cfgs[c].name, "fused")) fused_us = med;
            sj_stats s;
            sj_fn_stats(fn, &s);
            printf("{\"bench\": \"validate\", \"rows\": %lld, \"cols\": %d, \"config\": \"%s\", \"us_per_call\": %.2f, "
                   "\"vs_fused\": %.3f, \"validations\": %llu, \"rejected\": %llu}\n",
                   (long long)R, COLS, cfgs[c].name, med, fused_us > 0 ? med / fused_us : 0.0,
                   (unsigned long long)s.validations, (unsigned long long)s.validation_failures);
            fflush(stdout);
            sj_runtime_destroy(rt);
        }
        free(x), free(res), free(y), free(h), free(g), free(b);
    }
    return 0;
}
