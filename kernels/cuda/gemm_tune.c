/* The autotuner of generated products (specialize/fusion.h's "Generated
 * products"; the device's gemm_tune slot, kernels/device.h).
 *
 * On the compile worker, once a unit is loaded: for each generated product
 * of the plan, every tile variant the unit holds is timed at the entry's M
 * (a specialized or static unit: its own; a symbolic one: 16, 128 and 512
 * rows, one pick for each size class, sj_gemm_class) against cuBLASLt's
 * product with the bias, plus, when the
 * plan runs the epilogue group inside the kernel, one elementwise pass over
 * the result (the eager ReLU standing in for the group the kernel saves;
 * also for the row group of a LayerNorm inside: the eager LayerNorm took
 * 12 us at 16 rows on an H100 where the layer's generated row kernel
 * takes 3-6, so it made variants win that lost in the layer). A
 * LayerNorm variant runs on zeroed counters of its own (each run leaves
 * them zero: the runs are one after another on the tuner's stream).
 * The fastest wins; cuBLASLt (-1) unless a variant beats it. Operands are
 * scratch buffers of the product's sizes, zeroed, on a stream of the
 * tuner's own; each candidate runs twice untimed (cuBLASLt chooses its
 * algorithm then), then TUNE_REPS times captured into a CUDA graph, whose
 * launch is timed between two events: the kernels' time on the device, as
 * a fused call replayed from a graph spends it. (Timed as launches from
 * the host, a small product measured the host's launch cost instead:
 * cuBLASLt's 8 us a call against a generated kernel's 3, which chose
 * generated tiles that lose inside the layer's graph.) Where the capture
 * fails, the launches themselves are timed. cuBLASLt runs with a
 * workspace of its own, as in a graph.
 *
 * The choice is kept in the kernel cache beside the unit's CUBIN (under a
 * key of its own, the hash of the unit's and "gemmpick": one artifact a
 * key; extension "gemmpick"; sj_gemm_picks_format), so a process that loads
 * the unit from the cache loads its choice too and times nothing; and in
 * the device's memo (sj_gemm_memo: the last SJ_GEMM_MEMO units' records
 * by key), so that the entries that share one unit (a symbolic entry per
 * declared bucket: the same source, the same key) time it once, with or
 * without a cache: a compile worker that finds another timing the same
 * unit waits for its record (before it, w5cold's warm-up of six buckets
 * timed their one unit six times on an H100: 161 ms, then 21-26 ms
 * each). Any failure leaves the products it has not decided on cuBLASLt.
 */
#include "kernels/cuda/exec_cuda.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/error.h"
#include "base/log.h"
#include "kernels/cache.h"
#include "kernels/cuda/eager_cuda.h"
#include "specialize/codegen.h"
#include "specialize/codegen_cuda.h"
#include "specialize/codegen_gemm_cuda.h"
#include "specialize/fusion.h"

#define TUNE_REPS 10
#define TUNE_EXT "gemmpick"

/* -- The memo of choices by unit key -------------------------------------------- */

enum { SJ_GEMM_MEMO = 32 };
#define MEMO_WAIT_NS ((int64_t)10 * 1000 * 1000 * 1000) /* another thread's timing of a unit, at most */

struct sj_gemm_memo {
    pthread_mutex_t lock;
    pthread_cond_t done; /* a slot's timing ended */
    int next;            /* the slot the next unit takes (the oldest once all are used) */
    struct {
        char key[65];
        char *rec;   /* its record (NULL: none yet) */
        size_t len;
        bool busy;   /* a thread is timing it */
    } slot[SJ_GEMM_MEMO];
};

sj_gemm_memo *sj_gemm_memo_create(void) {
    sj_gemm_memo *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    pthread_condattr_t ca;
    bool ok = !pthread_condattr_init(&ca);
    ok = ok && !pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) && !pthread_cond_init(&m->done, &ca);
    pthread_condattr_destroy(&ca);
    if (!ok || pthread_mutex_init(&m->lock, NULL)) {
        if (ok) pthread_cond_destroy(&m->done);
        free(m);
        return NULL;
    }
    return m;
}

void sj_gemm_memo_free(sj_gemm_memo *m) {
    if (!m) return;
    for (int i = 0; i < SJ_GEMM_MEMO; i++) free(m->slot[i].rec);
    pthread_cond_destroy(&m->done);
    pthread_mutex_destroy(&m->lock);
    free(m);
}

/* The choice for the unit key: true with pick filled from the memo (a
 * thread that is timing the same unit is waited for, at most
 * MEMO_WAIT_NS); false when the caller times it, *slot the slot it then
 * holds (-1: none free: it times without the memo) until memo_end. */
static bool memo_begin(sj_gemm_memo *m, const char *key, const sj_fplan *p, int8_t *pick, int *slot) {
    *slot = -1;
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_sec += MEMO_WAIT_NS / 1000000000;
    pthread_mutex_lock(&m->lock);
    for (;;) {
        int i = 0;
        while (i < SJ_GEMM_MEMO && (!(m->slot[i].rec || m->slot[i].busy) || strcmp(m->slot[i].key, key))) i++;
        if (i < SJ_GEMM_MEMO && !m->slot[i].busy) { /* its record (one that does not fit p: time it) */
            bool ok = sj_gemm_picks_parse(p, m->slot[i].rec, m->slot[i].len, pick);
            pthread_mutex_unlock(&m->lock);
            return ok;
        }
        if (i == SJ_GEMM_MEMO) break; /* nobody has it: this thread times it */
        if (pthread_cond_timedwait(&m->done, &m->lock, &until) == ETIMEDOUT) {
            pthread_mutex_unlock(&m->lock); /* (the other thread is slow: time it without the memo) */
            return false;
        }
    }
    for (int k = 0; k < SJ_GEMM_MEMO; k++) { /* the oldest slot nobody is timing */
        int i = (m->next + k) % SJ_GEMM_MEMO;
        if (m->slot[i].busy) continue;
        m->next = (i + 1) % SJ_GEMM_MEMO;
        free(m->slot[i].rec);
        m->slot[i].rec = NULL;
        m->slot[i].len = 0;
        m->slot[i].busy = true;
        snprintf(m->slot[i].key, sizeof m->slot[i].key, "%s", key);
        *slot = i;
        break;
    }
    pthread_mutex_unlock(&m->lock);
    return false;
}

/* The end of memo_begin's timing in slot (-1: none): rec (len bytes; NULL:
 * nothing to keep, the slot is free again) kept for the unit's other
 * entries, and any thread waiting for it woken. */
static void memo_end(sj_gemm_memo *m, int slot, const void *rec, size_t len) {
    if (slot < 0) return;
    char *copy = rec && len ? malloc(len) : NULL;
    if (copy) memcpy(copy, rec, len);
    pthread_mutex_lock(&m->lock);
    m->slot[slot].rec = copy;
    m->slot[slot].len = copy ? len : 0;
    m->slot[slot].busy = false;
    pthread_cond_broadcast(&m->done);
    pthread_mutex_unlock(&m->lock);
}

/* -- Timing ---------------------------------------------------------------------- */

typedef struct tuner {
    sj_cuda *cu;
    CUstream s;
    CUevent e0, e1;
    const sj_gemm_spec *sp;
    CUdeviceptr a, b, bias, r, c, c2;
    CUdeviceptr lg, lb, cnt; /* a LayerNorm inside: gamma, beta ([N]), zeroed counters */
    bool epi;              /* the plan runs a group inside: cuBLASLt pays a pass more */
    bool has_bias;
    CUdeviceptr ws;        /* cuBLASLt's workspace (none may be allocated in a capture) */
} tuner;

#define TUNE_WS_BYTES ((size_t)4 << 20) /* as a CUDA graph's (graph_cuda.c) */

/* One run of candidate v (-1: cuBLASLt and the pass) at M rows. */
static sj_status run_one(const tuner *t, int v, const sj_gemm_tile *tile, CUfunction f, int64_t M) {
    sj_cuda *cu = t->cu;
    if (v < 0) {
        sj_cuda_exec e = {.cuda = cu, .stream = t->s, .ws = t->ws, .ws_bytes = t->ws ? TUNE_WS_BYTES : 0};
        sj_tensor a = {.data = (void *)(uintptr_t)t->a, .dtype = SJ_F16, .rank = 2, .device = SJ_CUDA,
                       .shape = {M, t->sp->K}, .stride = {t->sp->K, 1}};
        sj_tensor b = {.data = (void *)(uintptr_t)t->b, .dtype = SJ_F16, .rank = 2, .device = SJ_CUDA,
                       .shape = {t->sp->K, t->sp->N}, .stride = {t->sp->N, 1}};
        /* the bias as sj_cuda_matmul_bias takes one: rank 1, the product's
         * dtype (a timing baseline: an f32 bias costs cuBLASLt the same) */
        sj_tensor bias = {.data = (void *)(uintptr_t)t->bias, .dtype = SJ_F16, .rank = 1, .device = SJ_CUDA,
                          .shape = {t->sp->N}, .stride = {1}};
        sj_tensor y = {.data = (void *)(uintptr_t)t->c, .dtype = SJ_F16, .rank = 2, .device = SJ_CUDA,
                       .shape = {M, t->sp->N}, .stride = {t->sp->N, 1}};
        sj_status st = sj_cuda_matmul_bias(&e, &a, &b, t->has_bias ? &bias : NULL, &y);
        if (!st && t->epi) {
            sj_tensor y2 = y;
            y2.data = (void *)(uintptr_t)t->c2;
            st = sj_cuda_unary(&e, SJ_OP_RELU, &y, &y2);
        }
        return st;
    }
    sj_gemm_spec sp = *t->sp;
    sp.tile = *tile;
    sj_cuda_exec e = {.cuda = cu, .stream = t->s};
    const sj_gemm_ln_args ln = {(const void *)(uintptr_t)t->lg, (const void *)(uintptr_t)t->lb,
                                (void *)(uintptr_t)t->c2, (unsigned *)(uintptr_t)t->cnt};
    return sj_cuda_gemm_launch(&e, f, &sp, M, (const void *)(uintptr_t)t->a, (const void *)(uintptr_t)t->b,
                               (const void *)(uintptr_t)t->bias, (const void *)(uintptr_t)t->r,
                               (void *)(uintptr_t)t->c, &ln);
}

/* Milliseconds a run of candidate v takes at M rows; INFINITY when it
 * cannot run. */
static double time_one(const tuner *t, int v, const sj_gemm_tile *tile, CUfunction f, int64_t M) {
    sj_cuda *cu = t->cu;
    if (v >= 0 && sj_gemm_cuda_check(&(sj_gemm_spec){.N = t->sp->N, .K = t->sp->K, .out_dtype = SJ_F16,
                                                      .tile = *tile}) != SJ_OK)
        return INFINITY;
    for (int i = 0; i < 2; i++)
        if (run_one(t, v, tile, f, M)) return INFINITY;
    /* TUNE_REPS runs in a graph, its launch timed */
    CUgraph graph = NULL;
    CUgraphExec exec = NULL;
    bool captured = cu->api.StreamBeginCapture(t->s, CU_STREAM_CAPTURE_MODE_RELAXED) == CUDA_SUCCESS;
    if (captured) {
        sj_cuda_capturing(t->s);
        bool ran = true;
        for (int i = 0; i < TUNE_REPS && ran; i++) ran = run_one(t, v, tile, f, M) == SJ_OK;
        sj_cuda_capturing(NULL);
        captured = cu->api.StreamEndCapture(t->s, &graph) == CUDA_SUCCESS && ran && graph &&
                   cu->api.GraphInstantiate(&exec, graph, 0) == CUDA_SUCCESS;
        sj_clearerr();
    }
    if (graph) cu->api.GraphDestroy(graph);
    if (captured) {
        float gms = 0;
        bool timed = cu->api.GraphLaunch(exec, t->s) == CUDA_SUCCESS && /* (its upload, untimed) */
                     cu->api.EventRecord(t->e0, t->s) == CUDA_SUCCESS &&
                     cu->api.GraphLaunch(exec, t->s) == CUDA_SUCCESS &&
                     cu->api.EventRecord(t->e1, t->s) == CUDA_SUCCESS &&
                     cu->api.EventSynchronize(t->e1) == CUDA_SUCCESS &&
                     cu->api.EventElapsedTime(&gms, t->e0, t->e1) == CUDA_SUCCESS;
        cu->api.GraphExecDestroy(exec);
        if (timed) return (double)gms / TUNE_REPS;
    }
    if (cu->api.EventRecord(t->e0, t->s) != CUDA_SUCCESS) return INFINITY;
    for (int i = 0; i < TUNE_REPS; i++)
        if (run_one(t, v, tile, f, M)) return INFINITY;
    float ms = 0;
    if (cu->api.EventRecord(t->e1, t->s) != CUDA_SUCCESS || cu->api.EventSynchronize(t->e1) != CUDA_SUCCESS ||
        cu->api.EventElapsedTime(&ms, t->e0, t->e1) != CUDA_SUCCESS)
        return INFINITY;
    return (double)ms / TUNE_REPS;
}

/* The rows product gi is timed at: its own where every size is known,
 * else each size class's (SJ_GEMM_CLASS_ROWS). */
static int tune_rows(const sj_graph *g, const sj_group *G, const int64_t *syms, int64_t *rows) {
    const sj_value *Y = &g->vals[G->gemm_out];
    int64_t M = 1, d;
    for (int a = 0; a + 1 < Y->rank && M > 0; a++) {
        if (syms) M *= sj_ex_eval(g->ex, Y->shape[a], syms);
        else M = sj_ex_is_const(g->ex, Y->shape[a], &d) ? M * d : -1;
    }
    if (M > 0) {
        rows[0] = M;
        return 1;
    }
    static const int64_t class_rows[SJ_GEMM_CLASSES] = SJ_GEMM_CLASS_ROWS;
    for (int k = 0; k < SJ_GEMM_CLASSES; k++) rows[k] = class_rows[k];
    return SJ_GEMM_CLASSES;
}

static void tune_product(sj_cuda *cu, CUstream s, CUevent e0, CUevent e1, const sj_log_sink *log, const char *key,
                         const sj_graph *g, const sj_group *G, int gi, const int64_t *syms, void *const *fns,
                         int8_t *pick) {
    sj_gemm_spec sp;
    sj_codegen_gemm_spec(g, G, &sp);
    int64_t rows[SJ_GEMM_CLASSES];
    int n_rows = tune_rows(g, G, syms, rows);
    int64_t Mmax = rows[n_rows - 1] > rows[0] ? rows[n_rows - 1] : rows[0];
    size_t bytes_a = (size_t)(Mmax * sp.K) * 2, bytes_b = (size_t)(sp.K * sp.N) * 2, bytes_bias = (size_t)sp.N * 4,
           bytes_c = (size_t)(Mmax * sp.N) * 4;
    tuner t = {.cu = cu, .s = s, .e0 = e0, .e1 = e1, .sp = &sp,
               .epi = (G->gemm_epi & (SJ_GEMM_EPI | SJ_GEMM_LN)) != 0, .has_bias = G->bias >= 0};
    size_t bytes_cnt = (size_t)sj_gemm_ln_counters(Mmax) * sizeof(unsigned);
    t.a = sj_cuda_alloc(cu, bytes_a, s);
    t.b = sj_cuda_alloc(cu, bytes_b, s);
    t.bias = sj_cuda_alloc(cu, bytes_bias, s);
    t.r = sj_cuda_alloc(cu, bytes_c, s);
    t.c = sj_cuda_alloc(cu, bytes_c, s);
    t.c2 = sj_cuda_alloc(cu, bytes_c, s);
    t.lg = sj_cuda_alloc(cu, bytes_bias, s);
    t.lb = sj_cuda_alloc(cu, bytes_bias, s);
    t.cnt = sj_cuda_alloc(cu, bytes_cnt, s);
    t.ws = sj_cuda_alloc(cu, TUNE_WS_BYTES, s);
    /* (the workspace last: the only buffer not zeroed) */
    const CUdeviceptr bufs[] = {t.a, t.b, t.bias, t.r, t.c, t.c2, t.lg, t.lb, t.cnt, t.ws};
    const size_t sizes[] = {bytes_a, bytes_b, bytes_bias, bytes_c, bytes_c, bytes_c, bytes_bias, bytes_bias,
                            bytes_cnt, TUNE_WS_BYTES};
    enum { NBUF = sizeof bufs / sizeof bufs[0] };
    bool ok = true;
    for (int i = 0; i < NBUF; i++) ok = ok && bufs[i];
    for (int i = 0; i + 1 < NBUF && ok; i++)
        ok = cu->api.MemsetD8Async(bufs[i], 0, sizes[i], s) == CUDA_SUCCESS;
    int nt;
    const sj_gemm_tile *tiles = sj_gemm_cuda_tiles(&nt);
    /* per row count timed (one, or a size class each): cuBLASLt's time,
     * each variant's, and the fastest (-1: cuBLASLt) */
    double base_ms[SJ_GEMM_CLASSES] = {0}, ms[SJ_GEMM_CLASSES][SJ_CG_VARIANTS_MAX] = {{0}};
    int best[SJ_GEMM_CLASSES];
    for (int k = 0; k < n_rows; k++) {
        best[k] = -1;
        base_ms[k] = ok ? time_one(&t, -1, NULL, NULL, rows[k]) : INFINITY;
        for (int v = 0; ok && v < G->gemm_nv && v < SJ_CG_VARIANTS_MAX; v++) {
            CUfunction f = (CUfunction)fns[(size_t)gi * SJ_CG_VARIANTS_MAX + (size_t)v];
            ms[k][v] = f ? time_one(&t, v, &tiles[G->gemm_tiles[v]], f, rows[k]) : INFINITY;
            if (ms[k][v] < (best[k] < 0 ? base_ms[k] : ms[k][best[k]])) best[k] = v;
        }
    }
    for (int i = 0; i < NBUF; i++) sj_cuda_free(cu, bufs[i], s);
    for (int c = 0; c < SJ_GEMM_CLASSES; c++) pick[gi * SJ_GEMM_CLASSES + c] = (int8_t)best[n_rows > 1 ? c : 0];
    if (!ok) {
        sj_log_write(log, SJ_LOG_PERF, "cuda: %.12s: product %s: not timed (%s): cuBLASLt", key, G->name,
                     sj_last_error());
        return;
    }
    for (int k = 0; k < n_rows; k++) {
        char line[384];
        size_t n = (size_t)snprintf(line, sizeof line, "cuda: %.12s: product %s (N %lld, K %lld, M %lld%s): cuBLASLt %.4f ms",
                                    key, G->name, (long long)sp.N, (long long)sp.K, (long long)rows[k],
                                    n_rows > 1 ? ", a size class" : "", base_ms[k]);
        for (int v = 0; v < G->gemm_nv && n < sizeof line; v++) {
            const sj_gemm_tile *tl = &tiles[G->gemm_tiles[v]];
            n += (size_t)snprintf(line + n, sizeof line - n, ", %dx%dx%d/k%d%s %.4f ms", tl->bm, tl->bn, tl->bk,
                                  tl->splitk > 1 ? tl->splitk : 1, tl->wg ? "/wg" : "", ms[k][v]);
        }
        if (best[k] >= 0) {
            const sj_gemm_tile *tl = &tiles[G->gemm_tiles[best[k]]];
            sj_log_write(log, SJ_LOG_PERF, "%s: tile %dx%dx%d/k%d%s", line, tl->bm, tl->bn, tl->bk,
                         tl->splitk > 1 ? tl->splitk : 1, tl->wg ? "/wg" : "");
        } else {
            sj_log_write(log, SJ_LOG_PERF, "%s: cuBLASLt", line);
        }
    }
}

bool sj_cuda_gemm_tune(sj_cuda *cu, sj_gemm_memo *memo, sj_cache *cache, const sj_log_sink *log, const sj_graph *g,
                       const sj_fplan *p, const int64_t *syms, void *const *fns, const char *key, int8_t *pick) {
    bool any = false; /* a product with a function to time (a quick unit's have none) */
    for (int gi = 0; gi < p->n_groups && !any; gi++)
        for (int v = 0; p->groups[gi].gemm_tile >= 0 && v < p->groups[gi].gemm_nv && v < SJ_CG_VARIANTS_MAX; v++)
            any |= fns[(size_t)gi * SJ_CG_VARIANTS_MAX + (size_t)v] != NULL;
    if (!any) return false;
    bool named = key && key[0], keyed = cache && named;
    int slot = -1;
    if (memo && named && memo_begin(memo, key, p, pick, &slot)) return false; /* timed already in this process */
    /* the record's own cache key: the cache keeps one artifact a key (a
     * second under the unit's key replaced the meta of its CUBIN, which
     * no lookup found again: every unit with generated products compiled
     * afresh in each process until this) */
    char pkey[65] = "";
    if (keyed) sj_cache_key(pkey, (const char *const[]){key, TUNE_EXT}, 2);
    if (keyed) { /* a unit from the cache has its choice there */
        void *data = NULL;
        size_t len = 0;
        if (sj_cache_load(cache, pkey, TUNE_EXT, &data, &len)) {
            bool ok = sj_gemm_picks_parse(p, data, len, pick);
            if (memo) memo_end(memo, slot, ok ? data : NULL, len);
            free(data);
            if (ok) return false;
            slot = -1; /* (freed: timed without the memo) */
        }
    }
    bool timed = false;
    sj_cuda_bind(cu);
    CUstream s = NULL;
    CUevent e0 = NULL, e1 = NULL;
    if (cu->api.StreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS) {
        timed = true;
        if (cu->api.EventCreate(&e0, CU_EVENT_DEFAULT) == CUDA_SUCCESS &&
            cu->api.EventCreate(&e1, CU_EVENT_DEFAULT) == CUDA_SUCCESS) {
            for (int gi = 0; gi < p->n_groups; gi++)
                if (p->groups[gi].gemm_tile >= 0)
                    tune_product(cu, s, e0, e1, log, key ? key : "", g, &p->groups[gi], gi, syms, fns, pick);
        }
        cu->api.StreamSynchronize(s);
        if (e0) cu->api.EventDestroy(e0);
        if (e1) cu->api.EventDestroy(e1);
        cu->api.StreamDestroy(s);
    }
    char rec[4096];
    size_t n = timed ? sj_gemm_picks_format(p, pick, rec, sizeof rec) : 0;
    if (memo) memo_end(memo, slot, n ? rec : NULL, n);
    if (keyed && n && sj_cache_store(cache, pkey, TUNE_EXT, rec, n))
        sj_log_write(log, SJ_LOG_WARN, "cuda: %.12s: the products' choice not cached: %s", key, sj_last_error());
    return timed;
}
