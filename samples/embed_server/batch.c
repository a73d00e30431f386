/* embed_server's queue and batcher threads: sentences queued by the HTTP
 * threads, taken oldest first, sorted by length, cut into batches under the
 * token budget and run through the encoder (packed or padded). */
#include "samples/embed_server/server.h"

bool is_ready(server *s) {
    if (!s->o.warmup || atomic_load(&s->warm_skipped)) return true;
    if (s->o.packed) return atomic_load(&s->packed_warm);
    for (int d = 0; d < s->n_rt; d++)
        if (!sj_fn_ready(bert_fn(s->models[d]))) return false;
    return true;
}

double now_s(void) {
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

void *batcher_main(void *arg) {
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

bool enqueue(server *s, item *items, int n) {
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
