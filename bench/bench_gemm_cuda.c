/* bench_gemm_cuda: the generated tensor-core products with fused epilogues
 * (specialize/codegen_gemm_cuda.h) against cuBLASLt, on the encoder
 * layer's products, f16 in and out, for BERT-base (w4: hidden H 768, FFN F
 * 3072) and MiniLM (384, 1536):
 *
 *   qkv    [M, H] @ [H, 3H] + bias
 *   out    [M, H] @ [H, H] + bias + residual
 *   ffn1   [M, H] @ [H, F] + bias, GELU
 *   ffn2   [M, F] @ [F, H] + bias + residual
 *
 *   bench_gemm_cuda [--quick] [--m 16,64,128,256,512] [--model bert|minilm|both]
 *
 * For every M (tokens) and every candidate tile configuration the product
 * can take (split-K clusters included where the device has them): the
 * generated kernel (symbolic M, compiled once per tile with NVRTC), a batch
 * of launches captured into a CUDA graph and the graph's launch timed
 * between two events (device time, as a fused call replayed from a graph
 * spends it; launches from the host would time cuBLASLt's 8 us of host
 * work), median of 7 batches; cuBLASLt through the library's eager product (its bias
 * epilogue), alone (`lt_ms`) and followed by the eager kernels that finish
 * the same epilogue (GELU, the residual add: `lt_epi_ms`, what the fused
 * plan runs today). One JSON line per (product, M, tile), then one per
 * (product, M) with the fastest tile and its ratio to both. Without a
 * CUDA device it prints a note and exits 0.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/half.h"
#include "base/tensor.h"
#include "bench/bench_util.h"
#include "specialize/codegen_gemm_cuda.h"
#ifdef SJ_WITH_CUDA
#include "kernels/cuda/cuda_dev.h"
#include "kernels/cuda/eager_cuda.h"
#include "kernels/cuda/exec_cuda.h"
#endif

#ifndef SJ_WITH_CUDA
int main(void) {
    printf("{\"bench\": \"gemm_cuda\", \"skipped\": \"built without CUDA\"}\n");
    return 0;
}
#else

static sj_cuda *dev;
static int quick;

typedef struct product {
    const char *name;
    int64_t N, K;
    bool gelu, residual;
} product;

static const product products[] = {
    {"bert.qkv", 2304, 768, false, false},   {"bert.out", 768, 768, false, true},
    {"bert.ffn1", 3072, 768, true, false},   {"bert.ffn2", 768, 3072, false, true},
    {"minilm.qkv", 1152, 384, false, false}, {"minilm.out", 384, 384, false, true},
    {"minilm.ffn1", 1536, 384, true, false}, {"minilm.ffn2", 384, 1536, false, true},
};

static void die(const char *what) {
    fprintf(stderr, "bench_gemm_cuda: %s: %s\n", what, sj_last_error());
    exit(1);
}

static void cu(CUresult r, const char *what) {
    if (r == CUDA_SUCCESS) return;
    sj_cuda_fail(dev, r, what); /* sets the message */
    die(what);
}

static CUdeviceptr dalloc_rand(size_t n, double scale, uint64_t *rng) {
    uint16_t *h = malloc(n * 2);
    float *f = malloc(n * 4);
    if (!h || !f) die("out of memory");
    bench_fill_rand(f, n, (float)-scale, (float)scale, rng);
    for (size_t i = 0; i < n; i++) h[i] = sj_f32_to_f16(f[i]);
    CUdeviceptr p = sj_cuda_alloc(dev, n * 2, dev->stream);
    if (!p || sj_cuda_to_device(dev, p, h, n * 2)) die("device memory");
    free(h);
    free(f);
    return p;
}

/* A CUBIN for src with NVRTC (the device's architecture). */
static char *nvrtc(const char *src) {
    char arch[48];
    snprintf(arch, sizeof arch, "--gpu-architecture=sm_%d%d%s", dev->cc_major, dev->cc_minor,
             dev->cc_major == 9 && dev->cc_minor == 0 ? "a" : ""); /* Hopper's own: warpgroup tiles */
    const char *opts[] = {arch, "--std=c++17", "-default-device"};
    nvrtcProgram prog;
    if (dev->api.nvrtcCreateProgram(&prog, src, "gemm.cu", 0, NULL, NULL) != NVRTC_SUCCESS) die("nvrtc create");
    if (dev->api.nvrtcCompileProgram(prog, 3, opts) != NVRTC_SUCCESS) {
        size_t n = 0;
        dev->api.nvrtcGetProgramLogSize(prog, &n);
        char *log = calloc(1, n + 1);
        if (log) dev->api.nvrtcGetProgramLog(prog, log);
        fprintf(stderr, "%s\n", log ? log : "");
        die("nvrtc compile");
    }
    size_t n = 0;
    dev->api.nvrtcGetCUBINSize(prog, &n);
    char *bin = malloc(n);
    if (!bin) die("out of memory");
    dev->api.nvrtcGetCUBIN(prog, bin);
    dev->api.nvrtcDestroyProgram(&prog);
    return bin;
}

typedef void (*launch_fn)(void *ctx);

#define WS_BYTES ((size_t)4 << 20) /* cuBLASLt's workspace, as a CUDA graph's (graph_cuda.c) */

/* Median over 7 batches of the mean time of one launch, ms: each batch
 * one launch of a graph that holds `reps` launches. */
static double time_ms(launch_fn f, void *ctx) {
    CUevent e0, e1;
    cu(dev->api.EventCreate(&e0, 0), "event");
    cu(dev->api.EventCreate(&e1, 0), "event");
    for (int i = 0; i < 10; i++) f(ctx);
    int reps = quick ? 20 : 100;
    CUgraph graph;
    CUgraphExec exec;
    cu(dev->api.StreamBeginCapture(dev->stream, CU_STREAM_CAPTURE_MODE_RELAXED), "begin capture");
    sj_cuda_capturing(dev->stream);
    for (int i = 0; i < reps; i++) f(ctx);
    sj_cuda_capturing(NULL);
    cu(dev->api.StreamEndCapture(dev->stream, &graph), "end capture");
    cu(dev->api.GraphInstantiate(&exec, graph, 0), "instantiate");
    cu(dev->api.GraphLaunch(exec, dev->stream), "graph launch"); /* its upload */
    double t[7];
    for (int b = 0; b < 7; b++) {
        cu(dev->api.EventRecord(e0, dev->stream), "record");
        cu(dev->api.GraphLaunch(exec, dev->stream), "graph launch");
        cu(dev->api.EventRecord(e1, dev->stream), "record");
        cu(dev->api.EventSynchronize(e1), "sync");
        float ms = 0;
        cu(dev->api.EventElapsedTime(&ms, e0, e1), "elapsed");
        t[b] = ms / reps;
    }
    dev->api.GraphExecDestroy(exec);
    dev->api.GraphDestroy(graph);
    dev->api.EventDestroy(e0);
    dev->api.EventDestroy(e1);
    qsort(t, 7, sizeof t[0], bench_cmp_double);
    return t[3];
}

typedef struct gen_ctx {
    CUfunction fn;
    const sj_gemm_spec *sp;
    int64_t M;
    CUdeviceptr a, b, bias, r, c;
} gen_ctx;

static void launch_gen(void *c) {
    gen_ctx *g = c;
    sj_cuda_exec e = {.cuda = dev, .stream = dev->stream};
    if (sj_cuda_gemm_launch(&e, g->fn, g->sp, g->M, (const void *)(uintptr_t)g->a, (const void *)(uintptr_t)g->b,
                            (const void *)(uintptr_t)g->bias, (const void *)(uintptr_t)g->r, (void *)(uintptr_t)g->c,
                            NULL))
        die("launch");
}

typedef struct lt_ctx {
    sj_cuda_exec e;
    sj_tensor a, b, bias, r, y;
    bool gelu, residual, epi;
} lt_ctx;

static void launch_lt(void *c) {
    lt_ctx *l = c;
    if (sj_cuda_matmul_bias(&l->e, &l->a, &l->b, &l->bias, &l->y)) die("cuBLASLt product");
    if (l->epi && l->gelu && sj_cuda_unary(&l->e, SJ_OP_GELU, &l->y, &l->y)) die("gelu");
    if (l->epi && l->residual && sj_cuda_binary(&l->e, SJ_OP_ADD, &l->y, &l->r, &l->y)) die("residual add");
}

static sj_tensor dtensor(CUdeviceptr p, int rank, int64_t r0, int64_t r1) {
    sj_tensor t = {.data = (void *)(uintptr_t)p, .dtype = SJ_F16, .rank = rank, .device = SJ_CUDA};
    t.shape[0] = r0;
    if (rank > 1) t.shape[1] = r1;
    sj_tensor_set_contiguous(&t);
    return t;
}

int main(int argc, char **argv) {
    int64_t Ms[16] = {16, 64, 128, 256, 512};
    int nM = 5;
    const char *model = "both";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) quick = 1;
        else if (!strcmp(argv[i], "--m") && i + 1 < argc) {
            nM = 0;
            for (char *s = argv[++i]; *s && nM < 16; s++) {
                Ms[nM++] = strtoll(s, &s, 10);
                if (!*s) break;
            }
        } else if (!strcmp(argv[i], "--model") && i + 1 < argc) {
            model = argv[++i];
        } else {
            fprintf(stderr, "usage: %s [--quick] [--m 16,64,...] [--model bert|minilm|both]\n", argv[0]);
            return 2;
        }
    }
    if (sj_cuda_open(0, &dev)) {
        printf("{\"bench\": \"gemm_cuda\", \"skipped\": \"no CUDA device\"}\n");
        return 0;
    }
    if (sj_cuda_eager_load(dev)) die("eager kernels");
    CUdeviceptr ws = sj_cuda_alloc(dev, WS_BYTES, dev->stream); /* cuBLASLt's, as in a graph */
    if (!ws) die("device memory");
    int n_tiles;
    const sj_gemm_tile *tiles = sj_gemm_cuda_tiles(&n_tiles);
    uint64_t rng = 0x9e3779b97f4a7c15ull;
    for (size_t pi = 0; pi < sizeof products / sizeof products[0]; pi++) {
        const product *P = &products[pi];
        if (strcmp(model, "both") && strncmp(P->name, model, strlen(model))) continue;
        CUmodule mods[32] = {0};
        CUfunction fns[32] = {0};
        sj_gemm_spec specs[32];
        if (n_tiles > 32) die("more tiles than the benchmark holds");
        for (int t = 0; t < n_tiles; t++) {
            specs[t] = (sj_gemm_spec){.M = 0, .N = P->N, .K = P->K, .bias = true, .gelu = P->gelu,
                                      .residual = P->residual, .bias_dtype = SJ_F16, .res_dtype = SJ_F16,
                                      .out_dtype = SJ_F16, .tile = tiles[t]};
            if (sj_gemm_cuda_check(&specs[t]) || (tiles[t].splitk > 1 && dev->cc_major < 9) ||
                (tiles[t].wg && !(dev->cc_major == 9 && dev->cc_minor == 0)))
                continue;
            char *src = sj_codegen_gemm_cuda(&specs[t], "sj_gemm", NULL);
            if (!src) die("generate");
            double t0 = bench_now_s();
            char *bin = nvrtc(src);
            double cs = bench_now_s() - t0;
            free(src);
            cu(dev->api.ModuleLoadData(&mods[t], bin), "module load");
            free(bin);
            cu(dev->api.ModuleGetFunction(&fns[t], mods[t], "sj_gemm"), "get function"); /* smem: the launch's */
            printf("{\"bench\": \"gemm_cuda\", \"product\": \"%s\", \"tile\": \"%dx%dx%d/%dx%d/%d/k%d\", "
                   "\"nvrtc_s\": %.3f}\n",
                   P->name, tiles[t].bm, tiles[t].bn, tiles[t].bk, tiles[t].wm, tiles[t].wn, tiles[t].stages,
                   tiles[t].splitk > 1 ? tiles[t].splitk : 1, cs);
        }
        for (int mi = 0; mi < nM; mi++) {
            int64_t M = Ms[mi], N = P->N, K = P->K;
            CUdeviceptr A = dalloc_rand((size_t)(M * K), 1.0, &rng), B = dalloc_rand((size_t)(K * N), 0.05, &rng);
            CUdeviceptr bias = dalloc_rand((size_t)N, 1.0, &rng), R = dalloc_rand((size_t)(M * N), 1.0, &rng);
            CUdeviceptr C = sj_cuda_alloc(dev, (size_t)(M * N) * 2, dev->stream);
            if (!C) die("device memory");
            double flop = 2.0 * (double)M * (double)N * (double)K, best = INFINITY;
            int best_t = -1;
            for (int t = 0; t < n_tiles; t++) {
                if (!fns[t]) continue;
                gen_ctx g = {.fn = fns[t], .sp = &specs[t], .M = M, .a = A, .b = B, .bias = bias, .r = R, .c = C};
                double ms = time_ms(launch_gen, &g);
                if (ms < best) best = ms, best_t = t;
                printf("{\"bench\": \"gemm_cuda\", \"product\": \"%s\", \"M\": %lld, \"N\": %lld, \"K\": %lld, "
                       "\"tile\": \"%dx%dx%d/%dx%d/%d/k%d%s\", \"ms\": %.5f, \"tflops\": %.1f}\n",
                       P->name, (long long)M, (long long)N, (long long)K, tiles[t].bm, tiles[t].bn, tiles[t].bk,
                       tiles[t].wm, tiles[t].wn, tiles[t].stages, tiles[t].splitk > 1 ? tiles[t].splitk : 1,
                       tiles[t].wg ? "/wg" : "", ms,
                       flop / ms * 1e-9);
            }
            lt_ctx l = {.e = {.cuda = dev, .stream = dev->stream, .ws = ws, .ws_bytes = WS_BYTES},
                        .gelu = P->gelu, .residual = P->residual};
            l.a = dtensor(A, 2, M, K), l.b = dtensor(B, 2, K, N), l.bias = dtensor(bias, 1, N, 0);
            l.r = dtensor(R, 2, M, N), l.y = dtensor(C, 2, M, N);
            launch_lt(&l);
            sj_cuda_matmul_warm_wait(dev);
            double lt = time_ms(launch_lt, &l);
            l.epi = true;
            double lt_epi = P->gelu || P->residual ? time_ms(launch_lt, &l) : lt;
            printf("{\"bench\": \"gemm_cuda\", \"product\": \"%s\", \"M\": %lld, \"N\": %lld, \"K\": %lld, "
                   "\"best_tile\": \"%dx%dx%d/%dx%d/%d/k%d%s\", \"best_ms\": %.5f, \"lt_ms\": %.5f, \"lt_epi_ms\": %.5f, "
                   "\"vs_lt\": %.2f, \"vs_lt_epi\": %.2f, \"tflops\": %.1f, \"lt_tflops\": %.1f}\n",
                   P->name, (long long)M, (long long)N, (long long)K, tiles[best_t].bm, tiles[best_t].bn,
                   tiles[best_t].bk, tiles[best_t].wm, tiles[best_t].wn, tiles[best_t].stages,
                   tiles[best_t].splitk > 1 ? tiles[best_t].splitk : 1, tiles[best_t].wg ? "/wg" : "", best, lt,
                   lt_epi,
                   lt / best, lt_epi / best, flop / best * 1e-9, flop / lt * 1e-9);
            fflush(stdout);
            sj_cuda_free(dev, A, dev->stream), sj_cuda_free(dev, B, dev->stream);
            sj_cuda_free(dev, bias, dev->stream), sj_cuda_free(dev, R, dev->stream);
            sj_cuda_free(dev, C, dev->stream);
        }
        for (int t = 0; t < n_tiles; t++)
            if (mods[t]) dev->api.ModuleUnload(mods[t]);
    }
    sj_cuda_free(dev, ws, dev->stream);
    sj_cuda_eager_unload(dev);
    sj_cuda_close(dev);
    return 0;
}
#endif /* SJ_WITH_CUDA */
