/* embed_server's HTTP side (libmicrohttpd, a thread per connection):
 * POST /v1/embeddings, GET /health, GET /metrics (Prometheus text). */
#include "samples/embed_server/server.h"

const double LAT_BOUNDS[N_LAT] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};
const int BATCH_BOUNDS[N_BATCH] = {1, 2, 4, 8, 16, 32, 64, 128, 256};
const int CODES[N_CODES] = {200, 400, 404, 405, 413, 429, 500, 503};

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

enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
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

void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    (void)c, (void)toe;
    server *s = cls;
    conn_state *cs = *con_cls;
    if (!cs) return;
    free(cs->body);
    free(cs);
    *con_cls = NULL;
    atomic_fetch_sub(&s->in_flight, 1);
}
