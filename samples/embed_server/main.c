/* embed_server: an HTTP embedding server on shapejit, the project's main job.
 *
 *   embed_server --model DIR [--port 8080] [--host 127.0.0.1] ...  (--help)
 *
 *   POST /v1/embeddings   {"input": "text" | ["text", ...], "model": "..."}
 *                         -> the OpenAI answer: {"object": "list", "data":
 *                         [{"object": "embedding", "index": i, "embedding":
 *                         [...]}], "model": ..., "usage": {...}}
 *   GET  /health          503 while the declared shapes warm up (shapejit's
 *                         sj_fn_warmup in the background), then 200
 *   GET  /metrics         Prometheus text: requests, latency and batch
 *                         histograms, tokens, queue depth, calls by tier,
 *                         compiles, recompiles, guard failures, cache hits
 *
 * How it works: libmicrohttpd serves each connection on a thread of its own
 * (MHD_USE_THREAD_PER_CONNECTION: a request's thread can simply wait for
 * its embeddings); each request's texts are tokenized there (WordPiece,
 * samples/bert) and queued; one batcher thread (--batchers for more) takes
 * up to --max-batch of the oldest queued sentences, waiting at most
 * --max-batch-wait-ms for them to come, sorts them by length and cuts them
 * into batches under a token budget (--max-batch-tokens), and runs the
 * encoder (samples/bert, shapejit) once per batch: packed by default (the
 * batch's tokens end to end, attention through sj_attention_varlen, no
 * padding computed; the budget bounds the sum of lengths), or with
 * --packed 0 padded (batches of similar lengths, at most about twice the
 * shortest, batch x longest within the budget); both the batch and the sequence
 * length vary from call to call, which is what shapejit's guards and
 * buckets are for. Limits answer with JSON errors (400, 404, 405, 413,
 * 429) and never disturb other requests. SIGTERM or SIGINT: stop accepting,
 * finish what is in flight, exit 0. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdarg.h>

#include <jansson.h>
#include <microhttpd.h>

#include "samples/bert/bert.h"
#include "samples/bert/wordpiece.h"

/* -- Options ------------------------------------------------------------------ */

#define MAX_DEVICES 8

typedef struct options {
    const char *model, *host, *port_file, *name, *warmup_shapes;
    int port, threads, batchers, max_batch_tokens, max_batch_wait_ms, max_inputs, queue_depth, max_tokens;
    int max_batch, warmup, connections, packed;
    int devices[MAX_DEVICES], n_devices; /* --devices: one runtime per GPU; 0: the default backend */
    size_t max_body;
    sj_dtype dtype;
} options;

static void usage(FILE *f) {
    fprintf(f,
            "usage: embed_server --model DIR [options]\n"
            "  --model DIR             config.json, model.safetensors, vocab.txt (make model)\n"
            "  --port N                TCP port (default 8080; 0: any free port)\n"
            "  --host ADDR             IPv4 address to listen on (default 127.0.0.1)\n"
            "  --port-file PATH        write the port listened on there once ready to accept\n"
            "  --threads N             shapejit kernel threads (default: all CPUs)\n"
            "  --batchers N            batches run at once (default 1)\n"
            "  --max-batch-tokens N    a batch's tokens at most (padded: batch x longest) (default 8192)\n"
            "  --packed 0|1            packed batches, no padding (sj_attention_varlen) (default 1)\n"
            "  --max-batch N           sentences in a batch at most (default 64)\n"
            "  --max-batch-wait-ms N   how long a batch waits to fill (default 2)\n"
            "  --max-inputs N          texts in one request at most (default 256; more: 413)\n"
            "  --max-body-bytes N      request body at most (default 1048576; more: 413)\n"
            "  --queue-depth N         sentences queued at most (default 4096; more: 429)\n"
            "  --max-tokens N          tokens per text, [CLS] and [SEP] counted (default 256,\n"
            "                          as sentence-transformers truncates all-MiniLM-L6-v2)\n"
            "  --max-connections N     connections at once (default 256)\n"
            "  --dtype f32|f16|bf16    compute dtype (default f32)\n"
            "  --devices 0,1,...       CUDA devices to serve from: one runtime and model each,\n"
            "                          batches spread over them (default: the runtime's one)\n"
            "  --warmup 0|1            compile the declared shapes before /health is 200 (default 1)\n"
            "  --warmup-shapes LIST    the declared shapes, BATCHxSEQ,... (default: batches 1,4,8,16\n"
            "                          by sequences 16,32,...,--max-tokens)\n"
            "  --model-name NAME       the \"model\" field of answers (default all-MiniLM-L6-v2)\n"
            "Environment: SHAPEJIT_* (see the shapejit README), e.g. SHAPEJIT_BACKEND=cpu.\n");
}

static int parse_options(int argc, char **argv, options *o) {
    *o = (options){.host = "127.0.0.1", .port = 8080, .batchers = 1, .max_batch_tokens = 8192,
                   .max_batch_wait_ms = 2, .max_inputs = 256, .max_body = 1 << 20, .queue_depth = 4096,
                   .max_tokens = 256, .max_batch = 64, .warmup = 1, .connections = 256, .packed = 1, .dtype = SJ_F32,
                   .name = "all-MiniLM-L6-v2"};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        long n = v ? strtol(v, NULL, 10) : 0;
#define INT_OPT(flag, field, lo, hi)                                                                      \
    if (!strcmp(a, flag)) {                                                                               \
        if (!v || n < (lo) || n > (hi)) {                                                                 \
            fprintf(stderr, "embed_server: %s needs an integer in [%ld, %ld]\n", flag, (long)(lo), (long)(hi)); \
            return -1;                                                                                    \
        }                                                                                                 \
        o->field = (int)n;                                                                                \
        i++;                                                                                              \
        continue;                                                                                         \
    }
        INT_OPT("--port", port, 0, 65535)
        INT_OPT("--threads", threads, 0, 1024)
        INT_OPT("--batchers", batchers, 1, 64)
        INT_OPT("--max-batch-tokens", max_batch_tokens, 512, 1 << 24)
        INT_OPT("--max-batch", max_batch, 1, 4096)
        INT_OPT("--max-batch-wait-ms", max_batch_wait_ms, 0, 10000)
        INT_OPT("--max-inputs", max_inputs, 1, 65536)
        INT_OPT("--queue-depth", queue_depth, 1, 1 << 24)
        INT_OPT("--max-tokens", max_tokens, 2, 512)
        INT_OPT("--max-connections", connections, 1, 65536)
        INT_OPT("--warmup", warmup, 0, 1)
        INT_OPT("--packed", packed, 0, 1)
#undef INT_OPT
        if (!strcmp(a, "--max-body-bytes") && v && n >= 64) {
            o->max_body = (size_t)n;
            i++;
        } else if (!strcmp(a, "--model") && v) {
            o->model = argv[++i];
        } else if (!strcmp(a, "--host") && v) {
            o->host = argv[++i];
        } else if (!strcmp(a, "--port-file") && v) {
            o->port_file = argv[++i];
        } else if (!strcmp(a, "--devices") && v) {
            i++;
            o->n_devices = 0;
            for (const char *p = v; *p;) {
                char *end;
                long d = strtol(p, &end, 10);
                if (end == p || d < 0 || d > 1023 || o->n_devices == MAX_DEVICES || (*end && (*end != ',' || !end[1]))) {
                    fprintf(stderr, "embed_server: --devices takes up to %d device numbers, e.g. 0,1\n", MAX_DEVICES);
                    return -1;
                }
                for (int k = 0; k < o->n_devices; k++)
                    if (o->devices[k] == d) {
                        fprintf(stderr, "embed_server: --devices names device %ld twice\n", d);
                        return -1;
                    }
                o->devices[o->n_devices++] = (int)d;
                p = *end ? end + 1 : end;
            }
        } else if (!strcmp(a, "--warmup-shapes") && v) {
            o->warmup_shapes = argv[++i];
        } else if (!strcmp(a, "--model-name") && v) {
            o->name = argv[++i];
        } else if (!strcmp(a, "--dtype") && v) {
            i++;
            if (!strcmp(v, "f32")) o->dtype = SJ_F32;
            else if (!strcmp(v, "f16")) o->dtype = SJ_F16;
            else if (!strcmp(v, "bf16")) o->dtype = SJ_BF16;
            else {
                fprintf(stderr, "embed_server: --dtype f32, f16 or bf16\n");
                return -1;
            }
        } else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            exit(0);
        } else {
            fprintf(stderr, "embed_server: unknown or incomplete option '%s'\n", a);
            usage(stderr);
            return -1;
        }
    }
    if (!o->model) {
        fprintf(stderr, "embed_server: --model DIR is required\n");
        usage(stderr);
        return -1;
    }
    if (o->max_batch_tokens < o->max_tokens) o->max_batch_tokens = o->max_tokens;
    if (o->n_devices > o->batchers) o->batchers = o->n_devices; /* a batcher per device at least */
    return 0;
}

/* -- Metrics ------------------------------------------------------------------ */

static const double LAT_BOUNDS[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};
#define N_LAT (sizeof LAT_BOUNDS / sizeof LAT_BOUNDS[0])
static const int BATCH_BOUNDS[] = {1, 2, 4, 8, 16, 32, 64, 128, 256};
#define N_BATCH (sizeof BATCH_BOUNDS / sizeof BATCH_BOUNDS[0])
static const int CODES[] = {200, 400, 404, 405, 413, 429, 500, 503};
#define N_CODES (sizeof CODES / sizeof CODES[0])

typedef struct metrics {
    pthread_mutex_t lock;
    uint64_t requests[N_CODES];
    uint64_t lat_bucket[N_LAT + 1];
    double lat_sum;
    uint64_t lat_count;
    uint64_t batch_bucket[N_BATCH + 1];
    uint64_t batch_sum, batch_count;
    uint64_t tokens, padded_tokens, sentences;
} metrics;

/* -- The queue and the batcher -------------------------------------------------- */

typedef struct request request;

typedef struct item {
    request *req;
    int32_t *ids;
    int n;
    float *out; /* hidden floats in the request's buffer */
} item;

struct request {
    pthread_mutex_t lock;
    pthread_cond_t done;
    int remaining;
    sj_status status;
    char error[256];
};

typedef struct server {
    options o;
    sj_runtime *rt;     /* rts[0] */
    bert_model *model;  /* models[0] */
    sj_runtime *rts[MAX_DEVICES];
    bert_model *models[MAX_DEVICES];
    int n_rt;           /* runtimes (one per --devices entry, else 1); batcher i runs on i % n_rt */
    wp_tokenizer *tk;
    int hidden;
    metrics m;
    pthread_mutex_t qlock;
    pthread_cond_t qcond;
    item *queue; /* a ring of queue_depth items */
    int qhead, qlen;
    bool stopping;
    pthread_t *batchers;
    pthread_t warm_thread;
    double warm_start;
    _Atomic bool warm_skipped; /* the warm-up was refused: serve as ready */
    _Atomic bool warm_stop;    /* shutting down: the warm-up thread returns */
    _Atomic bool packed_warm;  /* --packed: the packed encoder's warm-up is over */
    _Atomic int in_flight;
} server;

static bool is_ready(server *s) {
    if (!s->o.warmup || atomic_load(&s->warm_skipped)) return true;
    if (s->o.packed) return atomic_load(&s->packed_warm);
    for (int d = 0; d < s->n_rt; d++)
        if (!sj_fn_ready(bert_fn(s->models[d]))) return false;
    return true;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int by_length(const void *a, const void *b) { return ((const item *)a)->n - ((const item *)b)->n; }

static void finish_item(item *it, sj_status st, const char *err) {
    request *r = it->req;
    pthread_mutex_lock(&r->lock);
    if (st && !r->status) {
        r->status = st;
        snprintf(r->error, sizeof r->error, "%s", err);
    }
    if (--r->remaining == 0) pthread_cond_signal(&r->done);
    pthread_mutex_unlock(&r->lock);
}

/* Runs one batch, sorted by length: packed (the sentences' tokens end to
 * end, no padding), or with --packed 0 padded to its longest sentence. */
static void run_batch(server *s, bert_model *model, item *b, int n) {
    int S = b[n - 1].n;
    int32_t *ids = calloc((size_t)n * (size_t)S, sizeof *ids), *len = malloc((size_t)n * sizeof *len);
    float *out = malloc((size_t)n * (size_t)s->hidden * sizeof *out);
    sj_status st = ids && len && out ? SJ_OK : SJ_ENOMEM;
    const char *err = "out of memory";
    uint64_t computed = 0; /* tokens the encoder computes, padding included */
    if (!st) {
        size_t at = 0;
        for (int i = 0; i < n; i++) {
            memcpy(ids + (s->o.packed ? at : (size_t)i * S), b[i].ids, (size_t)b[i].n * sizeof *ids);
            at += (size_t)b[i].n;
            len[i] = b[i].n;
        }
        computed = s->o.packed ? (uint64_t)at : (uint64_t)n * (uint64_t)S;
        st = s->o.packed ? bert_embed_packed(model, ids, len, n, out) : bert_embed(model, ids, len, n, S, out);
        err = bert_error();
        if (!st)
            for (int i = 0; i < n; i++) memcpy(b[i].out, out + (size_t)i * s->hidden, (size_t)s->hidden * sizeof(float));
    }
    uint64_t tokens = 0;
    for (int i = 0; i < n; i++) tokens += (uint64_t)b[i].n;
    pthread_mutex_lock(&s->m.lock);
    int k = 0;
    while (k < (int)N_BATCH && n > BATCH_BOUNDS[k]) k++;
    s->m.batch_bucket[k]++;
    s->m.batch_sum += (uint64_t)n;
    s->m.batch_count++;
    s->m.tokens += tokens;
    s->m.padded_tokens += computed;
    s->m.sentences += (uint64_t)n;
    pthread_mutex_unlock(&s->m.lock);
    for (int i = 0; i < n; i++) finish_item(&b[i], st, err);
    free(ids), free(len), free(out);
}

typedef struct batcher {
    server *s;
    int index;
} batcher;

static void *batcher_main(void *arg) {
    server *s = ((batcher *)arg)->s;
    bert_model *model = s->models[((batcher *)arg)->index % s->n_rt];
    item *batch = malloc((size_t)s->o.max_batch * sizeof *batch);
    if (!batch) return NULL;
    pthread_mutex_lock(&s->qlock);
    for (;;) {
        while (!s->qlen && !s->stopping) pthread_cond_wait(&s->qcond, &s->qlock);
        if (!s->qlen && s->stopping) break;
        /* wait (bounded) for the batch to fill */
        if (s->o.max_batch_wait_ms > 0 && s->qlen < s->o.max_batch && !s->stopping) {
            struct timespec dl;
            clock_gettime(CLOCK_REALTIME, &dl);
            dl.tv_nsec += (long)s->o.max_batch_wait_ms * 1000000L;
            dl.tv_sec += dl.tv_nsec / 1000000000L;
            dl.tv_nsec %= 1000000000L;
            while (s->qlen < s->o.max_batch && !s->stopping)
                if (pthread_cond_timedwait(&s->qcond, &s->qlock, &dl) == ETIMEDOUT) break;
        }
        /* the oldest sentences, up to a batch ... */
        int n = 0;
        while (s->qlen && n < s->o.max_batch) {
            batch[n++] = s->queue[s->qhead];
            s->qhead = (s->qhead + 1) % s->o.queue_depth;
            s->qlen--;
        }
        pthread_mutex_unlock(&s->qlock);
        /* ... sorted by length and cut where the token budget would be
         * passed (packed: the sum of lengths; padded: batch x longest, and
         * also where padding would waste much) */
        qsort(batch, (size_t)n, sizeof *batch, by_length);
        for (int first = 0; first < n;) {
            int end = first + 1, sum = batch[first].n;
            while (end < n && (s->o.packed ? sum + batch[end].n <= s->o.max_batch_tokens
                                           : (end + 1 - first) * batch[end].n <= s->o.max_batch_tokens &&
                                                 batch[end].n <= 2 * batch[first].n + 8))
                sum += batch[end++].n;
            run_batch(s, model, batch + first, end - first);
            first = end;
        }
        pthread_mutex_lock(&s->qlock);
    }
    pthread_mutex_unlock(&s->qlock);
    free(batch);
    return NULL;
}

/* Queues every item of a request, or none (false: the queue is full). */
static bool enqueue(server *s, item *items, int n) {
    pthread_mutex_lock(&s->qlock);
    bool ok = !s->stopping && s->qlen + n <= s->o.queue_depth;
    if (ok) {
        for (int i = 0; i < n; i++) s->queue[(s->qhead + s->qlen + i) % s->o.queue_depth] = items[i];
        s->qlen += n;
        pthread_cond_broadcast(&s->qcond);
    }
    pthread_mutex_unlock(&s->qlock);
    return ok;
}

/* -- HTTP -------------------------------------------------------------------- */

typedef struct conn_state {
    char *body;
    size_t len;
    bool too_long;
    double start;
} conn_state;

static void count_request(server *s, int code, double seconds) {
    pthread_mutex_lock(&s->m.lock);
    for (size_t i = 0; i < N_CODES; i++)
        if (CODES[i] == code) s->m.requests[i]++;
    if (seconds >= 0) {
        size_t k = 0;
        while (k < N_LAT && seconds > LAT_BOUNDS[k]) k++;
        s->m.lat_bucket[k]++;
        s->m.lat_sum += seconds;
        s->m.lat_count++;
    }
    pthread_mutex_unlock(&s->m.lock);
}

static enum MHD_Result reply(struct MHD_Connection *c, int code, const char *type, char *text, size_t len) {
    struct MHD_Response *r = MHD_create_response_from_buffer(len, text, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(text);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", type);
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)code, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result reply_error(server *s, struct MHD_Connection *c, int code, const char *type, const char *msg,
                                   double start) {
    json_t *o = json_pack("{s:{s:s,s:s,s:i}}", "error", "message", msg, "type", type, "code", code);
    char *text = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    count_request(s, code, start >= 0 ? now_s() - start : -1);
    if (!text) return MHD_NO;
    return reply(c, code, "application/json", text, strlen(text));
}

static void appendf(char **buf, size_t *len, size_t *cap, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void appendf(char **buf, size_t *len, size_t *cap, const char *fmt, ...) {
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int w = vsnprintf(*buf ? *buf + *len : NULL, *buf ? *cap - *len : 0, fmt, ap);
        va_end(ap);
        if (w < 0) return;
        if (*buf && *len + (size_t)w < *cap) {
            *len += (size_t)w;
            return;
        }
        size_t nc = (*cap ? *cap * 2 : 4096) + (size_t)w;
        char *nb = realloc(*buf, nc);
        if (!nb) return;
        *buf = nb, *cap = nc;
    }
}

static enum MHD_Result handle_metrics(server *s, struct MHD_Connection *c) {
    char *b = NULL;
    size_t len = 0, cap = 0;
    metrics m;
    pthread_mutex_lock(&s->m.lock);
    memcpy(&m, &s->m, sizeof m);
    pthread_mutex_unlock(&s->m.lock);
    pthread_mutex_lock(&s->qlock);
    int depth = s->qlen;
    pthread_mutex_unlock(&s->qlock);
    sj_stats st; /* summed over the devices' runtimes */
    sj_fn_stats(bert_fn(s->models[0]), &st);
    for (int d = 1; d < s->n_rt; d++) {
        sj_stats o;
        sj_fn_stats(bert_fn(s->models[d]), &o);
        st.calls += o.calls, st.eager_calls += o.eager_calls, st.fused_symbolic_calls += o.fused_symbolic_calls;
        st.fused_specialized_calls += o.fused_specialized_calls, st.graph_calls += o.graph_calls;
        st.compiles += o.compiles, st.compile_cache_hits += o.compile_cache_hits;
        st.compile_failures += o.compile_failures, st.compile_ms += o.compile_ms;
        st.traces += o.traces, st.entries += o.entries;
        for (int k = 0; k < SJ_GUARD_KIND_COUNT; k++) st.guard_failures[k] += o.guard_failures[k];
    }
    appendf(&b, &len, &cap, "# HELP embed_requests_total HTTP requests by status code.\n# TYPE embed_requests_total counter\n");
    for (size_t i = 0; i < N_CODES; i++)
        appendf(&b, &len, &cap, "embed_requests_total{code=\"%d\"} %" PRIu64 "\n", CODES[i], m.requests[i]);
    appendf(&b, &len, &cap, "# HELP embed_request_seconds Latency of embedding requests.\n# TYPE embed_request_seconds histogram\n");
    uint64_t acc = 0;
    for (size_t i = 0; i <= N_LAT; i++) {
        acc += m.lat_bucket[i];
        if (i < N_LAT) appendf(&b, &len, &cap, "embed_request_seconds_bucket{le=\"%g\"} %" PRIu64 "\n", LAT_BOUNDS[i], acc);
        else appendf(&b, &len, &cap, "embed_request_seconds_bucket{le=\"+Inf\"} %" PRIu64 "\n", acc);
    }
    appendf(&b, &len, &cap, "embed_request_seconds_sum %.6f\nembed_request_seconds_count %" PRIu64 "\n", m.lat_sum,
            m.lat_count);
    appendf(&b, &len, &cap, "# HELP embed_batch_size Sentences per encoder call.\n# TYPE embed_batch_size histogram\n");
    acc = 0;
    for (size_t i = 0; i <= N_BATCH; i++) {
        acc += m.batch_bucket[i];
        if (i < N_BATCH) appendf(&b, &len, &cap, "embed_batch_size_bucket{le=\"%d\"} %" PRIu64 "\n", BATCH_BOUNDS[i], acc);
        else appendf(&b, &len, &cap, "embed_batch_size_bucket{le=\"+Inf\"} %" PRIu64 "\n", acc);
    }
    appendf(&b, &len, &cap, "embed_batch_size_sum %" PRIu64 "\nembed_batch_size_count %" PRIu64 "\n", m.batch_sum,
            m.batch_count);
    appendf(&b, &len, &cap,
            "# TYPE embed_tokens_total counter\nembed_tokens_total %" PRIu64 "\n"
            "# HELP embed_padded_tokens_total Tokens computed, padding included.\n# TYPE embed_padded_tokens_total counter\n"
            "embed_padded_tokens_total %" PRIu64 "\n# TYPE embed_sentences_total counter\nembed_sentences_total %" PRIu64 "\n"
            "# HELP embed_queue_depth Sentences waiting for a batch.\n# TYPE embed_queue_depth gauge\nembed_queue_depth %d\n"
            "# HELP embed_ready 1 once the declared shapes are warm.\n# TYPE embed_ready gauge\nembed_ready %d\n",
            m.tokens, m.padded_tokens, m.sentences, depth, is_ready(s) ? 1 : 0);
    appendf(&b, &len, &cap,
            "# HELP shapejit_calls_total Encoder calls by the tier that served them.\n# TYPE shapejit_calls_total counter\n"
            "shapejit_calls_total{tier=\"eager\"} %" PRIu64 "\n"
            "shapejit_calls_total{tier=\"fused_symbolic\"} %" PRIu64 "\n"
            "shapejit_calls_total{tier=\"fused_specialized\"} %" PRIu64 "\n"
            "shapejit_calls_total{tier=\"graph\"} %" PRIu64 "\n",
            st.eager_calls, st.fused_symbolic_calls, st.fused_specialized_calls - st.graph_calls, st.graph_calls);
    uint64_t gf = 0;
    for (int i = 0; i < SJ_GUARD_KIND_COUNT; i++) gf += st.guard_failures[i];
    appendf(&b, &len, &cap,
            "# TYPE shapejit_compiles_total counter\nshapejit_compiles_total %" PRIu64 "\n"
            "# TYPE shapejit_compile_seconds_total counter\nshapejit_compile_seconds_total %.6f\n"
            "# TYPE shapejit_compile_failures_total counter\nshapejit_compile_failures_total %" PRIu64 "\n"
            "# HELP shapejit_cache_hits_total Kernels loaded without compiling.\n# TYPE shapejit_cache_hits_total counter\n"
            "shapejit_cache_hits_total %" PRIu64 "\n"
            "# HELP shapejit_traces_total Traces of the model (recompiles).\n# TYPE shapejit_traces_total counter\n"
            "shapejit_traces_total %" PRIu64 "\n# TYPE shapejit_guard_failures_total counter\n"
            "shapejit_guard_failures_total %" PRIu64 "\n# TYPE shapejit_entries gauge\nshapejit_entries %" PRIu64 "\n",
            st.compiles, st.compile_ms / 1000.0, st.compile_failures, st.compile_cache_hits, st.traces, gf, st.entries);
    if (!b) return MHD_NO;
    return reply(c, 200, "text/plain; version=0.0.4", b, len);
}

static enum MHD_Result handle_embeddings(server *s, struct MHD_Connection *c, conn_state *cs) {
    double start = cs->start;
    if (cs->too_long) return reply_error(s, c, 413, "invalid_request_error", "request body too long", start);
    json_error_t jerr;
    json_t *root = json_loadb(cs->body ? cs->body : "", cs->len, 0, &jerr);
    if (!root) {
        char msg[256];
        snprintf(msg, sizeof msg, "malformed JSON: %s", jerr.text);
        return reply_error(s, c, 400, "invalid_request_error", msg, start);
    }
    json_t *input = json_object_get(root, "input"), *model = json_object_get(root, "model"),
           *fmt = json_object_get(root, "encoding_format");
    const char *bad = NULL;
    if (!json_is_object(root)) bad = "the body must be a JSON object";
    else if (!input) bad = "'input' is required";
    else if (!json_is_string(input) && !json_is_array(input)) bad = "'input' must be a string or a list of strings";
    else if (json_is_array(input) && !json_array_size(input)) bad = "'input' must not be an empty list";
    else if (model && !json_is_string(model)) bad = "'model' must be a string";
    else if (fmt && (!json_is_string(fmt) || strcmp(json_string_value(fmt), "float")))
        bad = "'encoding_format' must be \"float\"";
    size_t n = json_is_array(input) ? json_array_size(input) : 1;
    for (size_t i = 0; !bad && json_is_array(input) && i < n; i++)
        if (!json_is_string(json_array_get(input, i))) bad = "'input' must be a string or a list of strings";
    if (bad) {
        json_decref(root);
        return reply_error(s, c, 400, "invalid_request_error", bad, start);
    }
    if (n > (size_t)s->o.max_inputs) {
        json_decref(root);
        char msg[128];
        snprintf(msg, sizeof msg, "%zu inputs, more than the %d allowed", n, s->o.max_inputs);
        return reply_error(s, c, 413, "invalid_request_error", msg, start);
    }
    request req = {.remaining = (int)n};
    pthread_mutex_init(&req.lock, NULL);
    pthread_cond_init(&req.done, NULL);
    item *items = calloc(n, sizeof *items);
    float *out = malloc(n * (size_t)s->hidden * sizeof *out);
    int32_t *ids = malloc(n * (size_t)s->o.max_tokens * sizeof *ids);
    int code = 200;
    const char *msg = NULL;
    long tokens = 0;
    if (!items || !out || !ids) code = 500, msg = "out of memory";
    for (size_t i = 0; code == 200 && i < n; i++) {
        json_t *t = json_is_array(input) ? json_array_get(input, i) : input;
        int k = wp_encode(s->tk, json_string_value(t), json_string_length(t), ids + i * (size_t)s->o.max_tokens,
                          s->o.max_tokens);
        if (k < 2) code = 400, msg = "'input' holds text that is not valid UTF-8";
        items[i] = (item){&req, ids + i * (size_t)s->o.max_tokens, k, out + i * (size_t)s->hidden};
        tokens += k;
    }
    if (code == 200 && !enqueue(s, items, (int)n)) code = 429, msg = "the queue is full; retry later";
    if (code == 200) {
        pthread_mutex_lock(&req.lock);
        while (req.remaining) pthread_cond_wait(&req.done, &req.lock);
        pthread_mutex_unlock(&req.lock);
        if (req.status) code = 500, msg = req.error;
    }
    enum MHD_Result ret;
    if (code != 200) {
        ret = reply_error(s, c, code, code == 429 ? "rate_limit_error" : code == 500 ? "server_error" : "invalid_request_error",
                          msg, start);
    } else {
        /* the answer, written directly (floats as %.9g: every f32 round-trips) */
        char *b = NULL;
        size_t len = 0, cap = n * (size_t)s->hidden * 16 + 256;
        b = malloc(cap);
        if (b) b[0] = 0;
        appendf(&b, &len, &cap, "{\"object\":\"list\",\"data\":[");
        for (size_t i = 0; i < n; i++) {
            appendf(&b, &len, &cap, "%s{\"object\":\"embedding\",\"index\":%zu,\"embedding\":[", i ? "," : "", i);
            for (int k = 0; k < s->hidden; k++) appendf(&b, &len, &cap, "%s%.9g", k ? "," : "", out[i * (size_t)s->hidden + k]);
            appendf(&b, &len, &cap, "]}");
        }
        json_t *dflt = model ? NULL : json_string(s->o.name);
        char *name = json_dumps(model ? model : dflt, JSON_ENCODE_ANY);
        json_decref(dflt);
        appendf(&b, &len, &cap, "],\"model\":%s,\"usage\":{\"prompt_tokens\":%ld,\"total_tokens\":%ld}}",
                name ? name : "\"\"", tokens, tokens);
        free(name);
        count_request(s, 200, now_s() - start);
        ret = b ? reply(c, 200, "application/json", b, len) : MHD_NO;
    }
    json_decref(root);
    free(items), free(out), free(ids);
    pthread_cond_destroy(&req.done);
    pthread_mutex_destroy(&req.lock);
    return ret;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *data, size_t *data_size, void **con_cls) {
    (void)version;
    server *s = cls;
    conn_state *cs = *con_cls;
    if (!cs) { /* the headers: make the state, read the body next */
        if (!(cs = calloc(1, sizeof *cs))) return MHD_NO;
        cs->start = now_s();
        *con_cls = cs;
        atomic_fetch_add(&s->in_flight, 1);
        return MHD_YES;
    }
    if (*data_size) {
        if (!cs->too_long && cs->len + *data_size <= s->o.max_body) {
            char *nb = realloc(cs->body, cs->len + *data_size + 1);
            if (!nb) return MHD_NO;
            cs->body = nb;
            memcpy(cs->body + cs->len, data, *data_size);
            cs->len += *data_size;
        } else {
            cs->too_long = true;
        }
        *data_size = 0;
        return MHD_YES;
    }
    bool is_get = !strcmp(method, "GET"), is_post = !strcmp(method, "POST");
    if (!strcmp(url, "/health")) {
        if (!is_get) return reply_error(s, c, 405, "invalid_request_error", "use GET /health", -1);
        bool ok = is_ready(s);
        const char *t = ok ? "{\"status\":\"ok\"}" : "{\"status\":\"warming up\"}";
        count_request(s, ok ? 200 : 503, -1);
        return reply(c, ok ? 200 : 503, "application/json", strdup(t), strlen(t));
    }
    if (!strcmp(url, "/metrics")) {
        if (!is_get) return reply_error(s, c, 405, "invalid_request_error", "use GET /metrics", -1);
        return handle_metrics(s, c);
    }
    if (!strcmp(url, "/v1/embeddings")) {
        if (!is_post) return reply_error(s, c, 405, "invalid_request_error", "use POST /v1/embeddings", -1);
        return handle_embeddings(s, c, cs);
    }
    return reply_error(s, c, 404, "invalid_request_error", "no such endpoint (POST /v1/embeddings, GET /health, GET /metrics)", -1);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    (void)c, (void)toe;
    server *s = cls;
    conn_state *cs = *con_cls;
    if (!cs) return;
    free(cs->body);
    free(cs);
    *con_cls = NULL;
    atomic_fetch_sub(&s->in_flight, 1);
}

/* -- Warm-up and lifecycle --------------------------------------------------------- */

/* The declared shapes: --warmup-shapes, or one shape per bucket the
 * batcher makes (batch 1, 2-4, ...) by each sequence bucket up to the
 * longest text. bs: pairs (batch, seq); returns how many, -1 on a bad list. */
static int warmup_shapes(const options *o, int *bs, int max) {
    int n = 0;
    if (o->warmup_shapes) {
        for (const char *p = o->warmup_shapes; *p && n < max;) {
            char *end;
            long b = strtol(p, &end, 10), q;
            if (end == p || *end != 'x') return -1;
            p = end + 1;
            q = strtol(p, &end, 10);
            if (end == p || b < 1 || q < 1 || q > o->max_tokens || (*end && *end != ',')) return -1;
            bs[2 * n] = (int)b, bs[2 * n + 1] = (int)q, n++;
            p = *end ? end + 1 : end;
        }
        return n;
    }
    const int batches[] = {1, 4, 8, 16};
    for (int i = 0; i < 4; i++)
        for (int q = 16; q <= 256 && q <= o->max_tokens && n < max; q *= 2) bs[2 * n] = batches[i], bs[2 * n + 1] = q, n++;
    return n;
}

/* The server's warm-up thread: the library's warm-up (sj_fn_warmup, in
 * the background) of every device's function in turn, device 0 first (it
 * compiles; the others then load its kernels from the shared cache); this
 * thread only starts them and waits, so a shutdown meanwhile ends at once
 * (bert_free stops a warm-up in progress). /health is 200 once every
 * function is ready (sj_fn_ready). */
static void *warm_main(void *arg) {
    server *s = arg;
    if (s->o.packed) { /* the packed encoder: its own runs per (batch, seq) bucket, blocking */
        int batches[] = {1, 4, 8, 16}, seqs[] = {16, 32, 64, 128, 256};
        int ns = 0;
        while (ns < 5 && seqs[ns] <= s->o.max_tokens) ns++;
        for (int d = 0; d < s->n_rt && !atomic_load(&s->warm_stop); d++)
            if (bert_warmup_packed(s->models[d], batches, 4, seqs, ns, 600000))
                fprintf(stderr, "embed_server: warm-up: %s (serving anyway)\n", bert_error());
        atomic_store(&s->packed_warm, true);
        fprintf(stderr, "embed_server: ready (packed warm-up %.1f s, %d runtime%s)\n", now_s() - s->warm_start,
                s->n_rt, s->n_rt > 1 ? "s" : "");
        return NULL;
    }
    int bs[2 * 64];
    int n = warmup_shapes(&s->o, bs, 64);
    if (n < 1) {
        fprintf(stderr, "embed_server: --warmup-shapes '%s': BATCHxSEQ,... (seq at most --max-tokens); serving\n",
                s->o.warmup_shapes ? s->o.warmup_shapes : "");
        atomic_store(&s->warm_skipped, true);
        return NULL;
    }
    for (int d = 0; d < s->n_rt && !atomic_load(&s->warm_stop); d++) {
        sj_fn *fn = bert_fn(s->models[d]);
        if (bert_warmup_shapes(s->models[d], bs, n, SJ_WARMUP_BACKGROUND, 0, NULL, NULL)) {
            sj_warmup_status ws;
            sj_fn_warmup_status(fn, &ws);
            fprintf(stderr, "embed_server: warm-up: %s (%s)\n", bert_error(),
                    ws.state == SJ_WARM_NONE ? "not started; serving" : "the other shapes go on");
            if (ws.state == SJ_WARM_NONE) {
                atomic_store(&s->warm_skipped, true);
                return NULL;
            }
        }
        while (!sj_fn_ready(fn) && !atomic_load(&s->warm_stop)) usleep(20000);
        sj_warmup_status ws;
        sj_fn_warmup_status(fn, &ws);
        if (ws.failed)
            fprintf(stderr, "embed_server: warm-up: %d of %d shapes failed (serving anyway); first: %s\n", ws.failed,
                    ws.total, ws.first_message);
    }
    if (!atomic_load(&s->warm_stop))
        fprintf(stderr, "embed_server: ready (warm-up %.1f s, %d shapes, %d runtime%s)\n", now_s() - s->warm_start, n,
                s->n_rt, s->n_rt > 1 ? "s" : "");
    return NULL;
}

int main(int argc, char **argv) {
    server s;
    memset(&s, 0, sizeof s);
    if (parse_options(argc, argv, &s.o)) return 2;
    /* SIGTERM and SIGINT are taken by sigwait below; every thread inherits the mask */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    sj_runtime_config cfg;
    sj_runtime_config_init(&cfg);
    if (s.o.threads) cfg.exec_threads = s.o.threads;
    /* compiled kernels are checked against eager on their first calls
     * before they serve alone (unless $SHAPEJIT_VALIDATE_CALLS says else) */
    if (!getenv("SHAPEJIT_VALIDATE_CALLS")) cfg.validate_calls = 2;
    char path[4096], err[256];
    snprintf(path, sizeof path, "%s/vocab.txt", s.o.model);
    if (wp_tokenizer_load(path, s.o.max_tokens, &s.tk, err, sizeof err)) {
        fprintf(stderr, "embed_server: %s\n", err);
        return 1;
    }
    s.n_rt = s.o.n_devices ? s.o.n_devices : 1;
    for (int d = 0; d < s.n_rt; d++) {
        if (s.o.n_devices) cfg.backend = SJ_BACKEND_CUDA, cfg.cuda_device = s.o.devices[d];
        if (sj_runtime_create(&cfg, &s.rts[d]) || bert_load(s.rts[d], s.o.model, s.o.dtype, &s.models[d])) {
            fprintf(stderr, "embed_server: %s%s\n", s.rts[d] ? "" : "runtime: ",
                    s.rts[d] ? bert_error() : sj_last_error());
            for (int k = 0; k <= d; k++) bert_free(s.models[k]), sj_runtime_destroy(s.rts[k]);
            wp_tokenizer_free(s.tk);
            return 1;
        }
    }
    s.rt = s.rts[0], s.model = s.models[0];
    s.hidden = bert_config_of(s.model)->hidden;
    pthread_mutex_init(&s.m.lock, NULL);
    pthread_mutex_init(&s.qlock, NULL);
    pthread_cond_init(&s.qcond, NULL);
    s.queue = calloc((size_t)s.o.queue_depth, sizeof *s.queue);
    s.batchers = calloc((size_t)s.o.batchers, sizeof *s.batchers);
    batcher *bs = calloc((size_t)s.o.batchers, sizeof *bs);
    for (int i = 0; i < s.o.batchers; i++) {
        bs[i] = (batcher){&s, i};
        pthread_create(&s.batchers[i], NULL, batcher_main, &bs[i]);
    }

    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)s.o.port)};
    if (inet_pton(AF_INET, s.o.host, &addr.sin_addr) != 1) {
        fprintf(stderr, "embed_server: --host %s is not an IPv4 address\n", s.o.host);
        return 2;
    }
    struct MHD_Daemon *d = MHD_start_daemon(
        MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ITC | MHD_USE_ERROR_LOG,
        (uint16_t)s.o.port, NULL, NULL, on_request, &s, MHD_OPTION_NOTIFY_COMPLETED, on_completed, &s,
        MHD_OPTION_SOCK_ADDR, &addr, MHD_OPTION_CONNECTION_LIMIT, (unsigned)s.o.connections,
        MHD_OPTION_CONNECTION_TIMEOUT, 60u, MHD_OPTION_END);
    if (!d) {
        fprintf(stderr, "embed_server: cannot listen on %s:%d: %s\n", s.o.host, s.o.port, strerror(errno));
        return 1;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    int port = info ? info->port : s.o.port;
    fprintf(stderr, "embed_server: %s on %s (%d runtime%s), listening on http://%s:%d (%s)\n", s.o.name,
            sj_runtime_backend(s.rt) == SJ_BACKEND_CUDA ? "CUDA" : "the CPU", s.n_rt, s.n_rt > 1 ? "s" : "", s.o.host, port,
            s.o.warmup ? "warming up" : "ready");
    if (s.o.port_file) {
        char tmp[4096];
        snprintf(tmp, sizeof tmp, "%s.tmp", s.o.port_file);
        FILE *pf = fopen(tmp, "w");
        if (pf) {
            fprintf(pf, "%d\n", port);
            fclose(pf);
            rename(tmp, s.o.port_file);
        }
    }
    s.warm_start = now_s();
    if (s.o.warmup && pthread_create(&s.warm_thread, NULL, warm_main, &s)) {
        fprintf(stderr, "embed_server: cannot start the warm-up thread; serving\n");
        atomic_store(&s.warm_skipped, true);
        s.o.warmup = 0;
    }

    int sig = 0;
    sigwait(&sigs, &sig);
    fprintf(stderr, "embed_server: %s: no new connections; finishing %d in flight\n",
            sig == SIGTERM ? "SIGTERM" : "SIGINT", atomic_load(&s.in_flight));
    MHD_socket ls = MHD_quiesce_daemon(d);
    if (ls != MHD_INVALID_SOCKET) close(ls);
    double t0 = now_s();
    while (atomic_load(&s.in_flight) > 0 && now_s() - t0 < 30) usleep(2000);
    MHD_stop_daemon(d);
    pthread_mutex_lock(&s.qlock);
    s.stopping = true;
    pthread_cond_broadcast(&s.qcond);
    pthread_mutex_unlock(&s.qlock);
    for (int i = 0; i < s.o.batchers; i++) pthread_join(s.batchers[i], NULL);
    atomic_store(&s.warm_stop, true);
    if (s.o.warmup) pthread_join(s.warm_thread, NULL); /* then bert_free stops a warm-up in progress */
    metrics m = s.m;
    fprintf(stderr, "embed_server: served %" PRIu64 " requests (%" PRIu64 " sentences, %" PRIu64 " batches); bye\n",
            m.requests[0], m.sentences, m.batch_count);
    for (int d = 0; d < s.n_rt; d++) bert_free(s.models[d]), sj_runtime_destroy(s.rts[d]);
    wp_tokenizer_free(s.tk);
    free(s.queue);
    free(s.batchers);
    free(bs);
    return 0;
}
