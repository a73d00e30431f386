/* embed_client: drives an embedding server (samples/embed_server) over
 * HTTP/1.1 on loopback, as `make run` does: waits for GET /health to be
 * 200, then N connections (keep-alive) send POST /v1/embeddings with real
 * sentences of varying lengths, each answer is checked (status, the number
 * of embeddings, their dimension, unit length), and it prints throughput,
 * latency percentiles, errors and highlights of GET /metrics.
 *
 *   embed_client --port P [--host 127.0.0.1] [--sentences FILE]
 *                [--connections 8] [--requests 400] [--batch 1]
 *                [--health-timeout 300]
 *
 * --batch K sends K sentences per request (a list input). Exits 1 when any
 * request failed or an answer was wrong. */
#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

typedef struct opts {
    const char *host, *sentences;
    int port, connections, requests, batch, health_timeout;
} opts;

static opts O = {"127.0.0.1", "samples/bert/sentences.txt", 0, 8, 400, 1, 300};
static char **texts;
static int n_texts;
static _Atomic int next_request, errors, wrong;
static double *latencies;
static _Atomic long sentences_done;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int connect_to(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)O.port)};
    inet_pton(AF_INET, O.host, &a.sin_addr);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(fd, (struct sockaddr *)&a, sizeof a)) {
        close(fd);
        return -1;
    }
    return fd;
}

static int send_all(int fd, const char *p, size_t n) {
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        p += w, n -= (size_t)w;
    }
    return 0;
}

/* One request on an open connection: the status, and the body (malloc'd). */
static int http(int fd, const char *method, const char *path, const char *body, char **out, size_t *out_len) {
    char head[512];
    size_t bl = body ? strlen(body) : 0;
    int hl = snprintf(head, sizeof head,
                      "%s %s HTTP/1.1\r\nHost: %s\r\nConnection: keep-alive\r\nContent-Type: application/json\r\n"
                      "Content-Length: %zu\r\n\r\n",
                      method, path, O.host, bl);
    if (send_all(fd, head, (size_t)hl) || (bl && send_all(fd, body, bl))) return -1;
    size_t cap = 65536, len = 0;
    char *buf = malloc(cap);
    long content = -1;
    char *hend = NULL;
    for (;;) {
        if (len + 1 >= cap) {
            cap *= 2;
            char *nb = realloc(buf, cap);
            if (!nb) break;
            buf = nb;
        }
        ssize_t r = recv(fd, buf + len, cap - len - 1, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        len += (size_t)r;
        buf[len] = 0;
        if (!hend && (hend = strstr(buf, "\r\n\r\n"))) {
            const char *cl = strcasestr(buf, "\r\nContent-Length:");
            content = cl && cl < hend ? strtol(cl + 17, NULL, 10) : 0;
        }
        if (hend && (long)(len - (size_t)(hend + 4 - buf)) >= content) break;
    }
    int status = -1;
    if (hend && sscanf(buf, "HTTP/1.%*d %d", &status) == 1) {
        size_t off = (size_t)(hend + 4 - buf);
        *out_len = len - off;
        *out = malloc(*out_len + 1);
        memcpy(*out, buf + off, *out_len);
        (*out)[*out_len] = 0;
    }
    free(buf);
    return status;
}

static bool check_answer(const char *body, int n) {
    json_t *o = json_loads(body, 0, NULL);
    json_t *data = json_object_get(o, "data");
    bool ok = json_is_array(data) && (int)json_array_size(data) == n;
    for (int i = 0; ok && i < n; i++) {
        json_t *d = json_array_get(data, (size_t)i), *e = json_object_get(d, "embedding");
        ok = json_integer_value(json_object_get(d, "index")) == i && json_array_size(e) >= 8;
        double norm = 0;
        for (size_t k = 0; ok && k < json_array_size(e); k++) {
            double v = json_number_value(json_array_get(e, k));
            norm += v * v;
        }
        ok = ok && fabs(sqrt(norm) - 1) < 1e-3;
    }
    json_decref(o);
    return ok;
}

static void *worker(void *arg) {
    (void)arg;
    int fd = connect_to();
    for (;;) {
        int r = atomic_fetch_add(&next_request, 1);
        if (r >= O.requests) break;
        json_t *in = json_array();
        for (int k = 0; k < O.batch; k++) json_array_append_new(in, json_string(texts[(r * O.batch + k) % n_texts]));
        json_t *req = json_pack("{s:o,s:s}", "input", in, "model", "all-MiniLM-L6-v2");
        char *body = json_dumps(req, JSON_COMPACT);
        json_decref(req);
        char *ans = NULL;
        size_t al = 0;
        double t0 = now_s();
        int st = fd >= 0 ? http(fd, "POST", "/v1/embeddings", body, &ans, &al) : -1;
        if (st < 0) { /* the connection dropped: once more on a new one */
            if (fd >= 0) close(fd);
            fd = connect_to();
            t0 = now_s();
            st = fd >= 0 ? http(fd, "POST", "/v1/embeddings", body, &ans, &al) : -1;
        }
        latencies[r] = now_s() - t0;
        if (st != 200) {
            atomic_fetch_add(&errors, 1);
            fprintf(stderr, "embed_client: request %d: status %d %.200s\n", r, st, ans ? ans : "");
        } else if (!check_answer(ans, O.batch)) {
            atomic_fetch_add(&wrong, 1);
        } else {
            atomic_fetch_add(&sentences_done, O.batch);
        }
        free(body);
        free(ans);
    }
    if (fd >= 0) close(fd);
    return NULL;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void metric_line(const char *metrics, const char *name) {
    for (const char *p = metrics; (p = strstr(p, name)); p++)
        if ((p == metrics || p[-1] == '\n')) {
            const char *e = strchr(p, '\n');
            printf("  %.*s\n", (int)(e ? e - p : (long)strlen(p)), p);
        }
}

int main(int argc, char **argv) {
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *a = argv[i], *v = argv[i + 1];
        if (!strcmp(a, "--port")) O.port = atoi(v);
        else if (!strcmp(a, "--host")) O.host = v;
        else if (!strcmp(a, "--sentences")) O.sentences = v;
        else if (!strcmp(a, "--connections")) O.connections = atoi(v);
        else if (!strcmp(a, "--requests")) O.requests = atoi(v);
        else if (!strcmp(a, "--batch")) O.batch = atoi(v);
        else if (!strcmp(a, "--health-timeout")) O.health_timeout = atoi(v);
        else {
            fprintf(stderr, "embed_client: unknown option %s (see the top of samples/embed_client/main.c)\n", a);
            return 2;
        }
    }
    if (O.port <= 0 || O.connections < 1 || O.requests < 1 || O.batch < 1) {
        fprintf(stderr, "usage: embed_client --port P [--connections N] [--requests N] [--batch K] ...\n");
        return 2;
    }
    FILE *f = fopen(O.sentences, "r");
    if (!f) {
        fprintf(stderr, "embed_client: %s: %s\n", O.sentences, strerror(errno));
        return 2;
    }
    char line[1 << 16];
    int cap = 0;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        if (!*line) continue;
        if (n_texts == cap) texts = realloc(texts, (size_t)(cap = cap ? 2 * cap : 64) * sizeof *texts);
        texts[n_texts++] = strdup(line);
    }
    fclose(f);

    double t0 = now_s();
    int hs = -1;
    while (now_s() - t0 < O.health_timeout) {
        int fd = connect_to();
        char *b = NULL;
        size_t bl;
        hs = fd >= 0 ? http(fd, "GET", "/health", NULL, &b, &bl) : -1;
        free(b);
        if (fd >= 0) close(fd);
        if (hs == 200) break;
        usleep(100000);
    }
    if (hs != 200) {
        fprintf(stderr, "embed_client: the server at %s:%d was not healthy within %d s\n", O.host, O.port,
                O.health_timeout);
        return 1;
    }
    printf("embed_client: server ready after %.2f s; %d requests of %d sentence(s) over %d connections\n",
           now_s() - t0, O.requests, O.batch, O.connections);
    latencies = calloc((size_t)O.requests, sizeof *latencies);
    pthread_t *th = calloc((size_t)O.connections, sizeof *th);
    double start = now_s();
    for (int i = 0; i < O.connections; i++) pthread_create(&th[i], NULL, worker, NULL);
    for (int i = 0; i < O.connections; i++) pthread_join(th[i], NULL);
    double el = now_s() - start;
    qsort(latencies, (size_t)O.requests, sizeof *latencies, cmp);
    double p50 = latencies[O.requests / 2] * 1e3, p90 = latencies[(int)(O.requests * 0.9)] * 1e3,
           p99 = latencies[(int)(O.requests * 0.99)] * 1e3, mx = latencies[O.requests - 1] * 1e3;
    printf("  throughput: %.1f requests/s, %.1f sentences/s (%.2f s)\n", O.requests / el, sentences_done / el, el);
    printf("  latency ms: p50 %.2f  p90 %.2f  p99 %.2f  max %.2f\n", p50, p90, p99, mx);
    printf("  errors: %d, wrong answers: %d\n", errors, wrong);
    int fd = connect_to();
    char *m = NULL;
    size_t ml;
    if (fd >= 0 && http(fd, "GET", "/metrics", NULL, &m, &ml) == 200) {
        printf("  /metrics:\n");
        metric_line(m, "shapejit_calls_total");
        metric_line(m, "shapejit_compiles_total");
        metric_line(m, "shapejit_cache_hits_total");
        metric_line(m, "shapejit_traces_total");
        metric_line(m, "embed_batch_size_sum");
        metric_line(m, "embed_batch_size_count");
        metric_line(m, "embed_tokens_total");
        metric_line(m, "embed_padded_tokens_total");
    }
    free(m);
    if (fd >= 0) close(fd);
    printf("{\"bench\": \"embed_server\", \"connections\": %d, \"batch\": %d, \"requests\": %d, \"requests_per_s\": %.1f, "
           "\"sentences_per_s\": %.1f, \"p50_ms\": %.3f, \"p99_ms\": %.3f, \"max_ms\": %.3f, \"errors\": %d}\n",
           O.connections, O.batch, O.requests, O.requests / el, sentences_done / el, p50, p99, mx, errors + wrong);
    return errors || wrong ? 1 : 0;
}
