/* server: a multi-threaded C server embedding the runtime; the program to
 * copy when putting shapejit behind a request queue.
 *
 *   server [--requests N] [--workers W] [--bad 0|1] [--quiet]
 *
 *   --requests N  requests the simulated clients send (default 2000)
 *   --workers W   worker threads calling the one shared function (default 4)
 *   --bad 0|1     1 (default): one request in 200 has a token id outside the
 *                 vocabulary and one in 300 is longer than MAX_LEN (256), to
 *                 show the server rejecting them and going on; 0: none
 *   --quiet       no log line per rejected request (the first 5 otherwise)
 *
 * The model is a small sentence classifier: token ids i32 [S], S from 1 to
 * MAX_LEN and different for every request -> embedding -> RMS norm -> MLP
 * with a residual -> mean over the sentence -> 4 logits. One producer thread
 * plays the clients and fills a bounded queue; W workers take requests from
 * it and call sj_call() on the one sj_fn at once, each with its own output
 * buffer. A request the library rejects (SJ_EINDEX, SJ_ECONSTRAINT) is
 * answered with the status and sj_last_error()'s message and the worker goes
 * on: bad input never takes the server down. Answers are checked against a
 * plain C reference (double accumulation), the first 50 and every 16th after.
 *
 * The library's log lines go into the server's log (stderr), with a timestamp
 * and "[shapejit/<topic>]": run with SHAPEJIT_LOG=all to see its traces and
 * background compiles among the server's lines.
 *
 * Exit status: 0 when every checked answer matched the reference and every
 * bad request got the status it should; 1 otherwise, saying why; 2 for a bad
 * command line. Which tier (eager, fused) serves a request depends on timing;
 * the answers agree within the tolerance either way, so pass/fail does not.
 */
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "shapejit.h"

enum { V = 1000, D = 64, HID = 128, C = 4, MAX_LEN = 256, QUEUE_CAP = 64, SHOW_ERRORS = 5 };
#define EPS 1e-6
#define RTOL 1e-4 /* fused kernels round differently from eager ones and from the reference */

/* One slot per status code, from the header's X-macro (codes are 0, 1, ...). */
#define SJ_X(name, value, desc) +1
enum { N_STATUS = 0 SJ_STATUS_LIST(SJ_X) };
#undef SJ_X

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static uint64_t xorshift(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static double urand(uint64_t *s) { return (xorshift(s) >> 11) * (1.0 / 9007199254740992.0); } /* [0, 1) */

static void die(const char *what) {
    fprintf(stderr, "server: %s\n", what);
    exit(1);
}

static void *xcalloc(size_t n, size_t size) {
    void *p = calloc(n, size);
    if (!p) die("out of memory");
    return p;
}

/* -- The server's log ---------------------------------------------------------- */

/* The library calls the log sink from any thread (workers, compile threads),
 * at once. POSIX makes each stdio call atomic on its stream already; the
 * mutex stands for what a real sink needs (a file it rotates, a socket, a
 * line buffer) and keeps the server's and the library's lines whole. */
static void log_line(pthread_mutex_t *mu, const char *tag, const char *msg) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    char stamp[16];
    localtime_r(&ts.tv_sec, &tm);
    strftime(stamp, sizeof stamp, "%H:%M:%S", &tm);
    pthread_mutex_lock(mu);
    fprintf(stderr, "%s.%03ld [%s] %s\n", stamp, ts.tv_nsec / 1000000, tag, msg);
    pthread_mutex_unlock(mu);
}

static void logf_server(pthread_mutex_t *mu, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void logf_server(pthread_mutex_t *mu, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    log_line(mu, "server", msg);
}

/* The log topic is one bit of SJ_LOG_TOPIC_LIST; its name is what
 * SHAPEJIT_LOG takes. */
static const char *topic_name(unsigned topic) {
#define SJ_X(name, bit, str) if (topic == (bit)) return str;
    SJ_LOG_TOPIC_LIST(SJ_X)
#undef SJ_X
    return "log";
}

/* The sj_log_fn: must not call back into the library, and does not. */
static void on_library_log(void *user, unsigned topic, const char *msg) {
    char tag[32];
    snprintf(tag, sizeof tag, "shapejit/%s", topic_name(topic));
    log_line(user, tag, msg);
}

/* -- The model ------------------------------------------------------------------ */

typedef struct model {
    float *emb, *gain, *w1, *b1, *w2, *b2, *wc, *bc;
    sj_tensor t_emb, t_gain, t_w1, t_b1, t_w2, t_b2, t_wc, t_bc;
} model;

static float *filled(uint64_t *rng, size_t n, double scale, double offset) {
    float *p = xcalloc(n, sizeof *p);
    for (size_t i = 0; i < n; i++) p[i] = (float)(offset + scale * (2 * urand(rng) - 1));
    return p;
}

static sj_tensor mat(float *p, int64_t r, int64_t c) { return sj_tensor_make(p, SJ_F32, 2, (int64_t[]){r, c}); }
static sj_tensor vec(float *p, int64_t n) { return sj_tensor_make(p, SJ_F32, 1, (int64_t[]){n}); }

static void model_init(model *m) {
    uint64_t rng = 0x5eed5eed12345678ull; /* fixed: every run serves the same model */
    m->emb = filled(&rng, (size_t)V * D, 1, 0), m->gain = filled(&rng, D, 0.1, 1);
    m->w1 = filled(&rng, (size_t)D * HID, 1 / sqrt(D), 0), m->b1 = filled(&rng, HID, 0.02, 0);
    m->w2 = filled(&rng, (size_t)HID * D, 1 / sqrt(HID), 0), m->b2 = filled(&rng, D, 0.02, 0);
    /* A head wide enough that the logits are some tenths, not hundredths:
     * the check below compares relative to them. */
    m->wc = filled(&rng, (size_t)D * C, 0.5, 0), m->bc = filled(&rng, C, 0.1, 0);
    m->t_emb = mat(m->emb, V, D), m->t_gain = vec(m->gain, D);
    m->t_w1 = mat(m->w1, D, HID), m->t_b1 = vec(m->b1, HID);
    m->t_w2 = mat(m->w2, HID, D), m->t_b2 = vec(m->b2, D);
    m->t_wc = mat(m->wc, D, C), m->t_bc = vec(m->bc, C);
}

static void model_free(model *m) {
    float *all[] = {m->emb, m->gain, m->w1, m->b1, m->w2, m->b2, m->wc, m->bc};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]);
}

static sj_val linear(sj_tracer *t, sj_val x, const sj_tensor *w, const sj_tensor *b) {
    return sj_add(t, sj_matmul(t, x, sj_param(t, w)), sj_param(t, b));
}

/* tokens i32 [S] -> logits f32 [C]. Nothing here reads S (no sj_size), so one
 * trace serves every S from 2 to MAX_LEN; S = 1 gets a trace of its own, as
 * sizes 0 and 1 always do. */
static sj_status classifier(sj_tracer *t, const sj_val *in, int n_in, void *user) {
    const model *m = user;
    sj_val x = sj_gather(t, sj_param(t, &m->t_emb), in[0]); /* [S, D] */
    sj_val h = sj_rms_norm(t, x, sj_param(t, &m->t_gain), EPS);
    h = sj_silu(t, linear(t, h, &m->t_w1, &m->t_b1)); /* [S, HID] */
    x = sj_add(t, x, linear(t, h, &m->t_w2, &m->t_b2));
    sj_val pooled = sj_mean(t, x, 0, 1); /* [1, D]: sj_matmul wants rank >= 2 */
    sj_val logits = linear(t, pooled, &m->t_wc, &m->t_bc);
    return sj_output(t, sj_reshape_i(t, logits, 1, (int64_t[]){C}));
}

/* The same classifier in plain C, accumulating in double. */
static void reference(const model *m, const int32_t *tok, int len, double out[C]) {
    double pooled[D] = {0}, n[D], h[HID];
    for (int s = 0; s < len; s++) {
        const float *e = m->emb + (size_t)tok[s] * D;
        double ss = 0;
        for (int d = 0; d < D; d++) ss += (double)e[d] * e[d];
        double inv = 1 / sqrt(ss / D + EPS);
        for (int d = 0; d < D; d++) n[d] = e[d] * inv * m->gain[d];
        for (int j = 0; j < HID; j++) {
            double a = m->b1[j];
            for (int d = 0; d < D; d++) a += n[d] * m->w1[d * HID + j];
            h[j] = a / (1 + exp(-a));
        }
        for (int d = 0; d < D; d++) {
            double a = (double)e[d] + m->b2[d];
            for (int j = 0; j < HID; j++) a += h[j] * m->w2[j * D + d];
            pooled[d] += a;
        }
    }
    for (int k = 0; k < C; k++) {
        double a = m->bc[k];
        for (int d = 0; d < D; d++) a += pooled[d] / len * m->wc[d * C + k];
        out[k] = a;
    }
}

/* -- Requests and the queue -------------------------------------------------------- */

typedef struct request {
    int id, len;
    sj_status expect; /* SJ_OK, or the status a bad request must get */
    int32_t *tokens;
    double t_enqueue;
} request;

typedef struct response {
    sj_status status;
    float logits[C];
    char error[256]; /* sj_last_error() of a rejected request */
    double latency_ms; /* enqueue to response */
    double call_ms;    /* of which in sj_call */
} response;

/* Bounded: a producer faster than the workers blocks (backpressure) instead
 * of growing the queue without limit. */
typedef struct queue {
    pthread_mutex_t mu;
    pthread_cond_t not_empty, not_full;
    request *slot[QUEUE_CAP];
    int head, count;
    bool closed;
} queue;

static void queue_push(queue *q, request *r) {
    pthread_mutex_lock(&q->mu);
    while (q->count == QUEUE_CAP) pthread_cond_wait(&q->not_full, &q->mu);
    r->t_enqueue = now_ms();
    q->slot[(q->head + q->count++) % QUEUE_CAP] = r;
    pthread_cond_signal(&q->not_empty);
    pthread_mutex_unlock(&q->mu);
}

/* The next request, or NULL once the queue is closed and drained. */
static request *queue_pop(queue *q) {
    request *r = NULL;
    pthread_mutex_lock(&q->mu);
    while (!q->count && !q->closed) pthread_cond_wait(&q->not_empty, &q->mu);
    if (q->count) {
        r = q->slot[q->head];
        q->head = (q->head + 1) % QUEUE_CAP, q->count--;
        pthread_cond_signal(&q->not_full);
    }
    pthread_mutex_unlock(&q->mu);
    return r;
}

static void queue_close(queue *q) {
    pthread_mutex_lock(&q->mu);
    q->closed = true;
    pthread_cond_broadcast(&q->not_empty);
    pthread_mutex_unlock(&q->mu);
}

/* -- Serving ------------------------------------------------------------------------ */

typedef struct server {
    sj_fn *fn;
    const model *m;
    pthread_mutex_t *log; /* the log's lock */
    queue q;
    response *resp; /* one per request, written by the worker that served it */
    int n, bad, quiet;
    _Atomic int shown; /* rejections logged in full so far */
} server;

/* A worker's output buffer and its counters, summed after it has exited. */
typedef struct worker {
    server *sv;
    float out[C];
    int checked, mismatches, wrong_status;
    int by_status[N_STATUS];
    double worst; /* largest difference from the reference, relative */
} worker;

/* The clients: skewed lengths (u^3: half the requests have S <= 33, a few
 * approach MAX_LEN), random tokens. Bad requests sit at fixed positions so
 * that even a short run meets both kinds. */
static void *producer(void *p) {
    server *sv = p;
    uint64_t rng = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < sv->n; i++) {
        request *r = xcalloc(1, sizeof *r);
        double u = urand(&rng);
        r->id = i, r->expect = SJ_OK, r->len = 1 + (int)(u * u * u * MAX_LEN);
        if (sv->bad && i % 300 == 150) /* too long */
            r->len = MAX_LEN + 1 + (int)(xorshift(&rng) % MAX_LEN), r->expect = SJ_ECONSTRAINT;
        r->tokens = xcalloc((size_t)r->len, sizeof *r->tokens);
        for (int s = 0; s < r->len; s++) r->tokens[s] = (int32_t)(xorshift(&rng) % V);
        if (sv->bad && i % 200 == 100) { /* one id past either end of the vocabulary */
            uint64_t x = xorshift(&rng);
            r->tokens[x % (uint64_t)r->len] = (x >> 32) & 1 ? V + (int32_t)(x >> 33) % V : -1;
            r->expect = SJ_EINDEX;
        }
        queue_push(&sv->q, r);
    }
    queue_close(&sv->q);
    return NULL;
}

/* Compare one answer with what the request deserved; count failures. */
static void check(worker *wk, const request *r, const response *rs) {
    server *sv = wk->sv;
    if (rs->status != r->expect) {
        wk->wrong_status++;
        logf_server(sv->log, "FAIL request %d (S=%d): expected %s, got %s%s%s", r->id, r->len,
                    sj_status_name(r->expect), sj_status_name(rs->status), rs->status ? ": " : "", rs->error);
        return;
    }
    if (rs->status || !(r->id < 50 || r->id % 16 == 0)) return;
    wk->checked++;
    double ref[C], scale = 1e-6; /* relative to the largest logit: a logit near 0 is no special case */
    reference(sv->m, r->tokens, r->len, ref);
    for (int k = 0; k < C; k++) scale = fmax(scale, fabs(ref[k]));
    for (int k = 0; k < C; k++) {
        double err = fabs(rs->logits[k] - ref[k]) / scale;
        wk->worst = fmax(wk->worst, err);
        if (err > RTOL) {
            wk->mismatches++;
            logf_server(sv->log, "FAIL request %d (S=%d): logit %d is %.7g, reference %.7g", r->id, r->len, k,
                        rs->logits[k], ref[k]);
            return;
        }
    }
}

static void *worker_main(void *p) {
    worker *wk = p;
    server *sv = wk->sv;
    for (request *r; (r = queue_pop(&sv->q));) {
        sj_tensor in = sj_tensor_make(r->tokens, SJ_I32, 1, (int64_t[]){r->len});
        sj_tensor out = sj_tensor_make(wk->out, SJ_F32, 1, (int64_t[]){C});
        double t0 = now_ms();
        sj_status st = sj_call(sv->fn, &in, 1, &out, 1);
        double t1 = now_ms();
        response *rs = &sv->resp[r->id];
        rs->latency_ms = t1 - r->t_enqueue, rs->call_ms = t1 - t0;
        rs->status = st;
        wk->by_status[(int)st < (int)N_STATUS ? (int)st : (int)SJ_EINTERNAL]++;
        if (st == SJ_OK) memcpy(rs->logits, wk->out, sizeof rs->logits);
        else {
            /* The message is thread-local and valid until this thread's next
             * call into the library: copy it into the response now. */
            snprintf(rs->error, sizeof rs->error, "%s", sj_last_error());
            int shown = sv->quiet ? SHOW_ERRORS + 1 : atomic_fetch_add(&sv->shown, 1);
            if (shown < SHOW_ERRORS)
                logf_server(sv->log, "request %d (S=%d) rejected: %s: %s", r->id, r->len, sj_status_name(st),
                            rs->error);
            else if (shown == SHOW_ERRORS)
                logf_server(sv->log, "further rejections are counted, not logged");
        }
        check(wk, r, rs);
        free(r->tokens);
        free(r);
    }
    return NULL;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int usage(const char *argv0) {
    fprintf(stderr, "usage: %s [--requests N] [--workers W] [--bad 0|1] [--quiet]\n", argv0);
    return 2;
}

int main(int argc, char **argv) {
    int n = 2000, workers = 4, bad = 1, quiet = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--requests") && i + 1 < argc) n = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--workers") && i + 1 < argc) workers = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--bad") && i + 1 < argc) bad = atoi(argv[++i]) != 0;
        else if (!strcmp(argv[i], "--quiet")) quiet = 1;
        else return usage(argv[0]);
    }
    if (n < 1 || workers < 1 || workers > 256) {
        fprintf(stderr, "--requests must be >= 1 and --workers in [1, 256]\n");
        return usage(argv[0]);
    }

    pthread_mutex_t log_mu;
    pthread_mutex_init(&log_mu, NULL);
    model m;
    model_init(&m);

    /* Defaults and SHAPEJIT_* first (so SHAPEJIT_LOG still works), then what
     * this server decides itself. Requests here are host buffers, so the
     * backend is the CPU whatever the machine has; varlen_encoder shows
     * device buffers on the CUDA backend. */
    sj_runtime_config cfg;
    sj_runtime_config_init(&cfg);
    cfg.backend = SJ_BACKEND_CPU;
    cfg.log_fn = on_library_log;
    cfg.log_user = &log_mu;
    sj_fn_options opt;
    sj_fn_options_init(&opt);
    opt.input_names = (const char *const[]){"tokens"}; /* errors then name 'tokens', not 'input 0' */
    sj_runtime *rt = NULL;
    sj_fn *fn = NULL;
    /* The profile makes the length symbolic from the first trace and turns a
     * request longer than MAX_LEN into SJ_ECONSTRAINT before any work. */
    if (sj_runtime_create(&cfg, &rt) || sj_fn_create(rt, "classifier", 1, classifier, &m, &opt, &fn) ||
        sj_set_profile(fn, 0, 0, 1, 32, MAX_LEN)) {
        fprintf(stderr, "setup failed: %s\n", sj_last_error());
        sj_runtime_destroy(rt);
        model_free(&m);
        return 1;
    }

    server sv = {.fn = fn, .m = &m, .log = &log_mu, .n = n, .bad = bad, .quiet = quiet};
    pthread_mutex_init(&sv.q.mu, NULL);
    pthread_cond_init(&sv.q.not_empty, NULL);
    pthread_cond_init(&sv.q.not_full, NULL);
    sv.resp = xcalloc((size_t)n, sizeof *sv.resp);
    worker *wks = xcalloc((size_t)workers, sizeof *wks);
    pthread_t *th = xcalloc((size_t)workers, sizeof *th), prod;
    logf_server(&log_mu, "%d workers, %d requests (S 1..%d, vocabulary %d, %s), model %d -> %d -> %d classes",
                workers, n, MAX_LEN, V, bad ? "some bad on purpose" : "all good", D, HID, C);

    double t0 = now_ms();
    for (int w = 0; w < workers; w++) {
        wks[w].sv = &sv;
        if (pthread_create(&th[w], NULL, worker_main, &wks[w])) die("cannot start a worker thread");
    }
    if (pthread_create(&prod, NULL, producer, &sv)) die("cannot start the producer thread");
    /* Graceful shutdown: the producer closes the queue after its last
     * request; the workers drain what is left in it and return. */
    pthread_join(prod, NULL);
    for (int w = 0; w < workers; w++) pthread_join(th[w], NULL);
    double total_ms = now_ms() - t0;
    /* No calls are left; compiles queued by the last of them may still run
     * on the library's workers. Wait for them (bounded) so the counters are
     * final; a timeout costs nothing but this note, sj_fn_destroy cancels. */
    sj_status idle = sj_fn_wait_idle(fn, 30000);
    if (idle) logf_server(&log_mu, "sj_fn_wait_idle: %s: %s", sj_status_name(idle), sj_last_error());

    int checked = 0, mismatches = 0, wrong_status = 0, by_status[N_STATUS] = {0};
    double worst = 0;
    for (int w = 0; w < workers; w++) {
        checked += wks[w].checked, mismatches += wks[w].mismatches, wrong_status += wks[w].wrong_status;
        worst = fmax(worst, wks[w].worst);
        for (int s = 0; s < N_STATUS; s++) by_status[s] += wks[w].by_status[s];
    }
    double *lat = xcalloc((size_t)n, sizeof *lat), *call = xcalloc((size_t)n, sizeof *call);
    for (int i = 0; i < n; i++) lat[i] = sv.resp[i].latency_ms, call[i] = sv.resp[i].call_ms;
    qsort(lat, (size_t)n, sizeof *lat, cmp_double);
    qsort(call, (size_t)n, sizeof *call, cmp_double);
    sj_stats s;
    sj_fn_stats(fn, &s);

    printf("summary: %d requests in %.2f s (%.0f a second) on %d worker%s; %d ok, %d rejected", n, total_ms / 1e3,
           n / (total_ms / 1e3), workers, workers == 1 ? "" : "s", by_status[SJ_OK], n - by_status[SJ_OK]);
    const char *sep = " (";
    for (int st = 1; st < N_STATUS; st++)
        if (by_status[st]) printf("%s%d %s", sep, by_status[st], sj_status_name((sj_status)st)), sep = ", ";
    printf("%s\n", n > by_status[SJ_OK] ? ")" : "");
    /* The clients send as fast as the queue takes them: latency is mostly
     * time waiting in the queue, sj_call's share is the service time. */
    printf("         latency (enqueue to response) p50 %.2f ms, p99 %.2f ms, max %.2f ms; in sj_call p50 %.3f ms, "
           "p99 %.3f ms\n",
           lat[n / 2], lat[(int)(0.99 * (n - 1))], lat[n - 1], call[n / 2], call[(int)(0.99 * (n - 1))]);
    printf("         %d answers checked against the reference (rtol %g, largest difference %.2g): %d "
           "mismatches; %d unexpected statuses\n",
           checked, RTOL, worst, mismatches, wrong_status);
    printf("         shapejit: %llu traces, %llu entries; calls: %llu eager, %llu fused symbolic, %llu fused "
           "specialized; %llu compiles, %llu compile failures\n",
           (unsigned long long)s.traces, (unsigned long long)s.entries, (unsigned long long)s.eager_calls,
           (unsigned long long)s.fused_symbolic_calls, (unsigned long long)s.fused_specialized_calls,
           (unsigned long long)s.compiles, (unsigned long long)s.compile_failures);
    int rc = 0;
    if (mismatches) printf("FAILED: %d of %d checked answers differ from the reference\n", mismatches, checked), rc = 1;
    if (wrong_status) printf("FAILED: %d of %d requests got an unexpected status\n", wrong_status, n), rc = 1;
    if (!rc) printf("PASSED\n");

    /* Teardown in reverse: no thread uses fn or rt any more. The runtime's
     * compile threads may log until sj_runtime_destroy returns, so the
     * logger goes last. */
    sj_fn_destroy(fn);
    sj_runtime_destroy(rt);
    pthread_cond_destroy(&sv.q.not_full);
    pthread_cond_destroy(&sv.q.not_empty);
    pthread_mutex_destroy(&sv.q.mu);
    free(lat);
    free(call);
    free(sv.resp);
    free(wks);
    free(th);
    model_free(&m);
    pthread_mutex_destroy(&log_mu);
    return rc;
}
