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
#include "samples/embed_server/server.h"

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
    while (atomic_load(&s.in_flight) > 0 && now_s() - t0 < s.o.drain_s) usleep(2000);
    int left = atomic_load(&s.in_flight);
    if (left > 0)
        fprintf(stderr, "embed_server: %d requests still in flight after --drain-seconds %d; closing them\n", left,
                s.o.drain_s);
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
