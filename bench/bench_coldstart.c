/* Cold start of a server-like process: a runtime from the environment
 * (SHAPEJIT_CACHE_DIR, SHAPEJIT_CACHE_KEY, SHAPEJIT_REMOTE_CACHE_URL, ...),
 * then the CPU workloads w1-w3 at four sequence lengths each, every entry
 * compiled before it serves (sync compiles, static shapes: 12 compile
 * units), as a server warming its declared shapes does. Prints one JSON
 * line: the time from sj_runtime_create to the last fused result, the
 * compiles, how many ran the compiler, how many came from the remote cache,
 * and the remote cache's bytes on the wire.
 *
 *   ./build/bench/bench_coldstart            (bench/bench_remote.sh runs N of them)
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "jit/shapejit.h"

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* w1: gelu(x * a + b) * sigmoid(x) */
static sj_status w1(sj_tracer *t, const sj_val *in, int n, void *u) {
    (void)n, (void)u;
    sj_val h = sj_add(t, sj_mul(t, in[0], in[1]), in[2]);
    return sj_output(t, sj_mul(t, sj_gelu(t, h), sj_sigmoid(t, in[0])));
}

/* w2: gelu(layer_norm(x + r, g, b)) */
static sj_status w2(sj_tracer *t, const sj_val *in, int n, void *u) {
    (void)n, (void)u;
    return sj_output(t, sj_gelu(t, sj_layer_norm(t, sj_add(t, in[0], in[1]), in[2], in[3], 1e-5)));
}

/* w3: softmax(s * 0.125 + mask, -1) */
static sj_status w3(sj_tracer *t, const sj_val *in, int n, void *u) {
    (void)n, (void)u;
    return sj_output(t, sj_softmax(t, sj_add(t, sj_mul(t, in[0], sj_scalar(t, 0.125)), in[1]), -1));
}

int main(void) {
    double t0 = now_ms();
    sj_runtime_config cfg;
    sj_runtime_config_init(&cfg);
    cfg.backend = SJ_BACKEND_CPU;
    cfg.compile_mode = SJ_COMPILE_SYNC;
    cfg.exec_threads = 1;
    sj_runtime *rt = NULL;
    if (sj_runtime_create(&cfg, &rt)) {
        fprintf(stderr, "bench_coldstart: %s\n", sj_last_error());
        return 1;
    }
    const int H = 256;
    const int64_t lengths[4] = {16, 64, 128, 256};
    float *x = calloc((size_t)256 * H, sizeof *x), *y = calloc((size_t)256 * H, sizeof *y);
    float *p[4];
    for (int i = 0; i < 4; i++) {
        p[i] = malloc((size_t)256 * H * sizeof(float));
        for (int k = 0; k < 256 * H; k++) p[i][k] = (float)((k * 7 + i) % 13) / 13.0f;
    }
    for (int k = 0; k < 256 * H; k++) x[k] = (float)((k * 5) % 17) / 17.0f - 0.5f;
    sj_model_fn models[3] = {w1, w2, w3};
    const int n_in[3] = {3, 4, 2};
    sj_stats total = {0};
    int bad = 0;
    for (int m = 0; m < 3; m++) {
        sj_fn_options o;
        sj_fn_options_init(&o);
        o.dynamic = SJ_DYNAMIC_STATIC;
        o.hot_threshold = 1;
        o.recompile_limit = 8;
        sj_fn *fn = NULL;
        char name[8];
        snprintf(name, sizeof name, "w%d", m + 1);
        if (sj_fn_create(rt, name, n_in[m], models[m], NULL, &o, &fn)) {
            fprintf(stderr, "bench_coldstart: %s\n", sj_last_error());
            return 1;
        }
        for (int l = 0; l < 4; l++) {
            int64_t S = lengths[l], xs[2] = {S, H}, vs[1] = {H}, ms[2] = {1, H};
            sj_tensor in[4] = {sj_tensor_make(x, SJ_F32, 2, xs)};
            if (m == 2) in[1] = sj_tensor_make(p[0], SJ_F32, 2, ms);
            else
                for (int i = 1; i < n_in[m]; i++) in[i] = sj_tensor_make(p[i - 1], SJ_F32, 1, vs);
            sj_tensor out = sj_tensor_make(y, SJ_F32, 2, xs);
            if (sj_call(fn, in, n_in[m], &out, 1)) {
                fprintf(stderr, "bench_coldstart: %s\n", sj_last_error());
                return 1;
            }
            for (int64_t k = 0; k < S * H; k++) bad += !isfinite(y[k]);
        }
        sj_stats s;
        sj_fn_stats(fn, &s);
        total.compiles += s.compiles, total.compile_cache_hits += s.compile_cache_hits;
        total.compile_remote_hits += s.compile_remote_hits, total.compile_failures += s.compile_failures;
        total.fused_specialized_calls += s.fused_specialized_calls;
        total.compile_ms += s.compile_ms;
        sj_fn_destroy(fn);
    }
    double ms = now_ms() - t0;
    sj_cache_counters rs;
    sj_runtime_cache_counters(rt, &rs);
    printf("{\"bench\":\"coldstart\",\"ms\":%.1f,\"compiles\":%llu,\"compiler_runs\":%llu,\"remote_hits\":%llu,"
           "\"remote_stores\":%llu,\"remote_refused\":%llu,\"remote_errors\":%llu,\"remote_bytes_in\":%llu,"
           "\"remote_bytes_out\":%llu,\"compile_ms\":%.1f,\"fused_calls\":%llu,\"failures\":%llu,\"bad\":%d}\n",
           ms, (unsigned long long)total.compiles,
           (unsigned long long)(total.compiles - total.compile_cache_hits),
           (unsigned long long)total.compile_remote_hits, (unsigned long long)rs.remote_stores,
           (unsigned long long)rs.remote_refused, (unsigned long long)rs.remote_errors,
           (unsigned long long)rs.remote_bytes_in, (unsigned long long)rs.remote_bytes_out, total.compile_ms, (unsigned long long)total.fused_specialized_calls,
           (unsigned long long)total.compile_failures, bad);
    sj_runtime_destroy(rt);
    free(x), free(y);
    for (int i = 0; i < 4; i++) free(p[i]);
    return bad || total.compile_failures ? 1 : 0;
}
