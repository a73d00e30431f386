/* samples/embed_server over HTTP on loopback, with the real all-MiniLM-L6-v2:
 * answers compared with the float64 reference (cosine >= 0.99999, max abs
 * error <= 1e-4) for single strings and lists, from several threads at
 * once; 400 (malformed JSON, wrong types), 404, 405, 413 (too many inputs,
 * too long a body), 429 (queue full) with JSON errors, none of which
 * disturbs concurrent good requests; /health and /metrics; /health 503
 * during the library's warm-up and 200 after, with declared shapes then
 * served fused; SIGTERM with
 * requests in flight answers them and exits 0. Without the model (make
 * model) or the server binary: "skipped". */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "tests/util.h"

#define HID 384
#define MAX_REF 128

static char texts_buf[MAX_REF][4096];
static double ref_emb[MAX_REF][HID];
static int n_refs;
static pid_t server = -1;
static int port;
static char dir[PATH_MAX];

/* -- A small HTTP/1.1 client (one request per connection) -------------------- */

static int http(const char *method, const char *path, const char *body, size_t body_len, char **out) {
    *out = NULL;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a)) {
        if (fd >= 0) close(fd);
        return -1;
    }
    char head[256];
    int hl = snprintf(head, sizeof head,
                      "%s %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: %zu\r\n\r\n", method, path,
                      body_len);
    send(fd, head, (size_t)hl, MSG_NOSIGNAL);
    for (size_t o = 0; body && o < body_len;) {
        ssize_t w = send(fd, body + o, body_len - o, MSG_NOSIGNAL);
        if (w <= 0) break;
        o += (size_t)w;
    }
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (len + 1 >= cap) buf = realloc(buf, cap *= 2);
        ssize_t r = recv(fd, buf + len, cap - len - 1, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        len += (size_t)r;
    }
    close(fd);
    buf[len] = 0;
    int status = -1;
    char *h = strstr(buf, "\r\n\r\n");
    if (h && sscanf(buf, "HTTP/1.%*d %d", &status) == 1) *out = strdup(h + 4);
    free(buf);
    return status;
}

static int post_json(json_t *o, char **out) {
    char *b = json_dumps(o, JSON_COMPACT);
    int st = http("POST", "/v1/embeddings", b, strlen(b), out);
    free(b);
    return st;
}

/* -- The server process ------------------------------------------------------ */

static const char *server_cc; /* SHAPEJIT_CC for the next server started (NULL: the default) */

static bool server_padded; /* add --packed 0: the padded encoder and the library's warm-up */

static int start_server4(const char *extra1, const char *extra2, const char *extra3, const char *extra4) {
    const char *model = getenv("SJ_MODEL_DIR") ? getenv("SJ_MODEL_DIR") : "models/all-MiniLM-L6-v2";
    const char *bin = getenv("SJ_EMBED_SERVER") ? getenv("SJ_EMBED_SERVER") : "build/samples/embed_server";
    char pf[PATH_MAX];
    snprintf(pf, sizeof pf, "%s/port", dir);
    unlink(pf);
    server = fork();
    if (server == 0) {
        /* the CPU unless the GPU session asks for CUDA (SJ_EMBED_BACKEND=cuda)
         * and, with SJ_EMBED_DEVICES=0,1, one runtime per GPU */
        const char *backend = getenv("SJ_EMBED_BACKEND"), *devices = getenv("SJ_EMBED_DEVICES");
        setenv("SHAPEJIT_CACHE_DIR", "", 1);
        setenv("SHAPEJIT_BACKEND", backend && *backend ? backend : "cpu", 1);
        if (server_cc) setenv("SHAPEJIT_CC", server_cc, 1);
        const char *argv[20] = {bin, "--model", model, "--port", "0", "--port-file", pf, "--threads", "2", "--warmup", "0"};
        int n = 11;
        if (devices && *devices) argv[n++] = "--devices", argv[n++] = devices;
        const char *extra[4] = {extra1, extra2, extra3, extra4};
        for (int k = 0; k < 4 && extra[k]; k++) argv[n++] = extra[k];
        if (server_padded) argv[n++] = "--packed", argv[n++] = "0";
        argv[n] = NULL;
        execv(bin, (char *const *)argv);
        _exit(127);
    }
    for (int i = 0; i < 600; i++) {
        FILE *f = fopen(pf, "r");
        if (f) {
            int ok = fscanf(f, "%d", &port) == 1;
            fclose(f);
            if (ok) return 0;
        }
        int status;
        if (waitpid(server, &status, WNOHANG) == server) return -1;
        usleep(100000);
    }
    return -1;
}

static int start_server(const char *extra1, const char *extra2) { return start_server4(extra1, extra2, NULL, NULL); }

static int stop_server(void) {
    if (server <= 0) return -1;
    kill(server, SIGTERM);
    int status = 0;
    waitpid(server, &status, 0);
    server = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static bool have_model;

static int group_setup(void **state) {
    (void)state;
    const char *refp = getenv("SJ_MODEL_REF") ? getenv("SJ_MODEL_REF") : "build/model/reference.jsonl";
    const char *bin = getenv("SJ_EMBED_SERVER") ? getenv("SJ_EMBED_SERVER") : "build/samples/embed_server";
    FILE *f = fopen(refp, "r");
    if (!f || access(bin, X_OK)) {
        if (f) fclose(f);
        return 0;
    }
    char line[1 << 16];
    while (n_refs < MAX_REF && fgets(line, sizeof line, f)) {
        json_t *o = json_loads(line, 0, NULL);
        json_t *t = json_object_get(o, "text"), *e = json_object_get(o, "embedding");
        if (json_is_string(t) && json_array_size(e) == HID && json_string_length(t) < 4096) {
            snprintf(texts_buf[n_refs], sizeof texts_buf[n_refs], "%s", json_string_value(t));
            for (int i = 0; i < HID; i++) ref_emb[n_refs][i] = json_real_value(json_array_get(e, i));
            n_refs++;
        }
        json_decref(o);
    }
    fclose(f);
    if (tu_mkdtemp(dir, sizeof dir, "sj_test_embed")) return -1;
    have_model = n_refs > 0 && start_server(NULL, NULL) == 0;
    return 0;
}

static int group_teardown(void **state) {
    (void)state;
    if (server > 0) stop_server();
    if (dir[0]) tu_rmtree(dir);
    return 0;
}

#define NEED_MODEL() TU_NEED_MODEL(have_model)

/* Checks an answer's embeddings against refs[idx[0..n)]. */
static void check_answer(const char *body, const int *idx, int n) {
    json_t *o = json_loads(body, 0, NULL);
    assert_non_null(o);
    assert_string_equal(json_string_value(json_object_get(o, "object")), "list");
    json_t *data = json_object_get(o, "data");
    assert_int_equal(json_array_size(data), n);
    long tokens = json_integer_value(json_object_get(json_object_get(o, "usage"), "prompt_tokens"));
    assert_true(tokens >= 2 * n);
    for (int i = 0; i < n; i++) {
        json_t *d = json_array_get(data, (size_t)i), *e = json_object_get(d, "embedding");
        assert_string_equal(json_string_value(json_object_get(d, "object")), "embedding");
        assert_int_equal(json_integer_value(json_object_get(d, "index")), i);
        assert_int_equal(json_array_size(e), HID);
        double dot = 0, ne = 0, nr = 0, mx = 0;
        for (int k = 0; k < HID; k++) {
            double v = json_number_value(json_array_get(e, (size_t)k)), r = ref_emb[idx[i]][k];
            dot += v * r, ne += v * v, nr += r * r;
            mx = fmax(mx, fabs(v - r));
        }
        double cos = dot / sqrt(ne * nr);
        if (cos < 0.99999 || mx > 1e-4)
            fail_msg("sentence %d: cosine %.9f, max abs error %.3g", idx[i], cos, mx);
    }
    json_decref(o);
}

/* Exit status of the server binary run with these options (it must refuse
 * them before loading anything). */
static int run_options(const char *a, const char *b) {
    const char *bin = getenv("SJ_EMBED_SERVER") ? getenv("SJ_EMBED_SERVER") : "build/samples/embed_server";
    pid_t p = fork();
    if (p == 0) {
        int null = open("/dev/null", O_WRONLY);
        if (null >= 0) dup2(null, 2);
        execl(bin, bin, "--model", "/nonexistent", a, b, (char *)NULL);
        _exit(127);
    }
    int status = 0;
    waitpid(p, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static void test_device_list_options(void **state) {
    (void)state;
    const char *bin = getenv("SJ_EMBED_SERVER") ? getenv("SJ_EMBED_SERVER") : "build/samples/embed_server";
    if (access(bin, X_OK)) skip();
    assert_int_equal(run_options("--devices", "0,0"), 2);   /* a device twice */
    assert_int_equal(run_options("--devices", "x"), 2);     /* not a number */
    assert_int_equal(run_options("--devices", "0,1,2,3,4,5,6,7,8"), 2); /* more than 8 */
    assert_int_equal(run_options("--devices", "0,"), 2);    /* an empty item */
    assert_int_equal(run_options("--devices", "0,1"), 1);   /* accepted: then the model is missing */
}

static void test_single_strings(void **state) {
    (void)state;
    NEED_MODEL();
    for (int i = 0; i < n_refs; i += 5) {
        json_t *o = json_pack("{s:s,s:s}", "input", texts_buf[i], "model", "mini");
        char *body;
        assert_int_equal(post_json(o, &body), 200);
        json_decref(o);
        check_answer(body, &i, 1);
        json_t *a = json_loads(body, 0, NULL);
        assert_string_equal(json_string_value(json_object_get(a, "model")), "mini");
        json_decref(a);
        free(body);
    }
}

typedef struct job {
    int first, count, failures;
} job;

static void *list_worker(void *arg) {
    job *j = arg;
    for (int rep = 0; rep < 3; rep++) {
        json_t *in = json_array();
        int idx[64];
        for (int k = 0; k < j->count; k++) {
            idx[k] = (j->first + k * 7 + rep) % n_refs;
            json_array_append_new(in, json_string(texts_buf[idx[k]]));
        }
        json_t *o = json_pack("{s:o}", "input", in);
        char *body;
        int st = post_json(o, &body);
        json_decref(o);
        if (st != 200) j->failures++;
        else check_answer(body, idx, j->count); /* fails the test from this thread: cmocka aborts */
        free(body);
    }
    return NULL;
}

static void *bad_worker(void *arg) {
    int *failures = arg;
    for (int i = 0; i < 20; i++) {
        char *body;
        int st = http("POST", "/v1/embeddings", "{\"input\": [1, 2]}", 17, &body);
        if (st != 400 || !body || !strstr(body, "\"error\"")) (*failures)++;
        free(body);
        st = http("POST", "/v1/embeddings", "not json", 8, &body);
        if (st != 400) (*failures)++;
        free(body);
    }
    return NULL;
}

/* Lists from several threads at once, with bad requests among them. */
static void test_concurrent_lists_and_bad_requests(void **state) {
    (void)state;
    NEED_MODEL();
    pthread_t th[6], bad;
    job jobs[6];
    int bad_failures = 0;
    pthread_create(&bad, NULL, bad_worker, &bad_failures);
    for (int i = 0; i < 6; i++) {
        jobs[i] = (job){i * 3, 1 + i * 3, 0};
        pthread_create(&th[i], NULL, list_worker, &jobs[i]);
    }
    for (int i = 0; i < 6; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(jobs[i].failures, 0);
    }
    pthread_join(bad, NULL);
    assert_int_equal(bad_failures, 0);
}

static void expect_error(const char *method, const char *path, const char *body, int want, const char *msg) {
    char *out;
    int st = http(method, path, body, body ? strlen(body) : 0, &out);
    if (st != want || !out || !strstr(out, msg))
        fail_msg("%s %s %s: got %d %s, want %d with '%s'", method, path, body ? body : "", st, out ? out : "", want,
                 msg);
    json_t *o = json_loads(out, 0, NULL);
    assert_non_null(json_object_get(json_object_get(o, "error"), "message"));
    json_decref(o);
    free(out);
}

static void test_errors(void **state) {
    (void)state;
    NEED_MODEL();
    expect_error("POST", "/v1/embeddings", "{\"input\": ", 400, "malformed JSON");
    expect_error("POST", "/v1/embeddings", "[\"a\"]", 400, "must be a JSON object");
    expect_error("POST", "/v1/embeddings", "{}", 400, "'input' is required");
    expect_error("POST", "/v1/embeddings", "{\"input\": 7}", 400, "string or a list of strings");
    expect_error("POST", "/v1/embeddings", "{\"input\": []}", 400, "empty list");
    expect_error("POST", "/v1/embeddings", "{\"input\": \"a\", \"model\": 3}", 400, "'model' must be a string");
    expect_error("POST", "/v1/embeddings", "{\"input\": \"a\", \"encoding_format\": \"base64\"}", 400,
                 "encoding_format");
    expect_error("GET", "/v1/embeddings", NULL, 405, "use POST");
    expect_error("POST", "/health", "{}", 405, "use GET");
    expect_error("GET", "/nope", NULL, 404, "no such endpoint");
    /* too many inputs: 257 > 256 */
    json_t *in = json_array();
    for (int i = 0; i < 257; i++) json_array_append_new(in, json_string("x"));
    json_t *o = json_pack("{s:o}", "input", in);
    char *body = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    expect_error("POST", "/v1/embeddings", body, 413, "257 inputs, more than the 256 allowed");
    free(body);
    /* a body over 1 MiB */
    size_t n = (1 << 20) + 100;
    char *big = malloc(n + 1);
    memset(big, 'a', n);
    memcpy(big, "{\"input\": \"", 11);
    big[n - 2] = '"', big[n - 1] = '}', big[n] = 0;
    expect_error("POST", "/v1/embeddings", big, 413, "body too long");
    free(big);
    /* the server still answers right */
    int i = 3;
    o = json_pack("{s:s}", "input", texts_buf[i]);
    assert_int_equal(post_json(o, &body), 200);
    json_decref(o);
    check_answer(body, &i, 1);
    free(body);
}

static void test_health_and_metrics(void **state) {
    (void)state;
    NEED_MODEL();
    char *body;
    assert_int_equal(http("GET", "/health", NULL, 0, &body), 200);
    assert_non_null(strstr(body, "ok"));
    free(body);
    assert_int_equal(http("GET", "/metrics", NULL, 0, &body), 200);
    const char *series[] = {"embed_requests_total{code=\"200\"}", "embed_requests_total{code=\"400\"}",
                            "embed_request_seconds_bucket{le=\"+Inf\"}", "embed_batch_size_count",
                            "embed_tokens_total", "embed_queue_depth 0", "shapejit_calls_total{tier=\"eager\"}",
                            "shapejit_calls_total{tier=\"fused_symbolic\"}", "shapejit_compiles_total",
                            "shapejit_traces_total", "shapejit_guard_failures_total", "shapejit_cache_hits_total"};
    for (size_t i = 0; i < sizeof series / sizeof series[0]; i++)
        if (!strstr(body, series[i])) fail_msg("/metrics lacks %s", series[i]);
    /* plausible counts: many 200s and 400s were served above */
    long ok = strtol(strstr(body, "embed_requests_total{code=\"200\"}") + 33, NULL, 10);
    long bad = strtol(strstr(body, "embed_requests_total{code=\"400\"}") + 33, NULL, 10);
    long tokens = strtol(strstr(body, "\nembed_tokens_total ") + 20, NULL, 10);
    assert_true(ok >= 10);
    assert_true(bad >= 40);
    assert_true(tokens > 100);
    /* batches are packed: the encoder computed no padding */
    static const char key[] = "\nembed_padded_tokens_total ";
    const char *pt = strstr(body, key);
    assert_non_null(pt);
    assert_int_equal(strtol(pt + sizeof key - 1, NULL, 10), tokens);
    free(body);
}

/* A counter of /metrics ("name value" on a line of its own); -1 if absent. */
static long metric(const char *body, const char *name) {
    char key[128];
    snprintf(key, sizeof key, "\n%s ", name);
    const char *p = strstr(body, key);
    return p ? strtol(p + strlen(key), NULL, 10) : -1;
}

/* --warmup 1 (the library's sj_fn_warmup in the background), with a
 * compiler slowed down on purpose: /health is 503 and embed_ready 0 while
 * the declared shapes compile, requests are served meanwhile (eagerly,
 * right), then /health is 200, and a request of a declared shape is
 * served fused: no eager call. */
static void test_health_during_warmup(void **state) {
    (void)state;
    NEED_MODEL();
    const char *backend = getenv("SJ_EMBED_BACKEND");
    if (backend && *backend && strcmp(backend, "cpu")) { /* the slowed compiler is the CPU's */
        print_message("skipped: the warm-up test runs the server on the CPU\n");
        return;
    }
    assert_int_equal(stop_server(), 0);
    char cc[PATH_MAX];
    snprintf(cc, sizeof cc, "%s/slow-cc.sh", dir);
    FILE *f = fopen(cc, "w");
    assert_non_null(f);
    fprintf(f, "#!/bin/sh\ncase \"$1\" in --version) exec cc --version;; esac\nsleep 2\nexec cc \"$@\"\n");
    fclose(f);
    assert_int_equal(chmod(cc, 0755), 0);
    server_cc = cc;
    server_padded = true; /* --warmup-shapes declares the padded encoder's shapes */
    int st = start_server4("--warmup", "1", "--warmup-shapes", "1x16,2x16");
    server_cc = NULL;
    server_padded = false;
    assert_int_equal(st, 0);
    char *body;
    assert_int_equal(http("GET", "/health", NULL, 0, &body), 503);
    assert_non_null(strstr(body, "warming up"));
    free(body);
    assert_int_equal(http("GET", "/metrics", NULL, 0, &body), 200);
    assert_int_equal(metric(body, "embed_ready"), 0);
    free(body);
    /* the two shortest reference sentences: one batch of at most 16 tokens */
    int idx[2] = {0, 1};
    for (int i = 0; i < n_refs; i++)
        if (strlen(texts_buf[i]) < strlen(texts_buf[idx[0]])) idx[1] = idx[0], idx[0] = i;
        else if (i != idx[0] && strlen(texts_buf[i]) < strlen(texts_buf[idx[1]])) idx[1] = i;
    json_t *o = json_pack("{s:[s,s]}", "input", texts_buf[idx[0]], texts_buf[idx[1]]);
    assert_int_equal(post_json(o, &body), 200); /* served while warming */
    check_answer(body, idx, 2);
    free(body);
    int code = 0;
    for (int i = 0; i < 1800 && code != 200; i++) { /* up to 3 minutes */
        code = http("GET", "/health", NULL, 0, &body);
        free(body);
        if (code != 200) usleep(100000);
    }
    assert_int_equal(code, 200);
    assert_int_equal(http("GET", "/metrics", NULL, 0, &body), 200);
    assert_int_equal(metric(body, "embed_ready"), 1);
    long eager = metric(body, "shapejit_calls_total{tier=\"eager\"}"), compiles = metric(body, "shapejit_compiles_total");
    free(body);
    assert_true(compiles >= 2);
    assert_int_equal(post_json(o, &body), 200);
    check_answer(body, idx, 2);
    free(body);
    json_decref(o);
    assert_int_equal(http("GET", "/metrics", NULL, 0, &body), 200);
    assert_int_equal(metric(body, "shapejit_calls_total{tier=\"eager\"}"), eager); /* fused */
    assert_int_equal(metric(body, "shapejit_compiles_total"), compiles);
    free(body);
    assert_int_equal(stop_server(), 0);
    assert_int_equal(start_server(NULL, NULL), 0);
}

/* SIGTERM while requests are in flight: they are answered, exit 0. */
typedef struct inflight {
    int status;
} inflight;

static void *long_request(void *arg) {
    inflight *r = arg;
    json_t *in = json_array();
    for (int k = 0; k < 64; k++) json_array_append_new(in, json_string(texts_buf[(k * 5) % n_refs]));
    json_t *o = json_pack("{s:o}", "input", in);
    char *body;
    r->status = post_json(o, &body);
    json_decref(o);
    free(body);
    return NULL;
}

static void test_queue_full_and_graceful_shutdown(void **state) {
    (void)state;
    NEED_MODEL();
    assert_int_equal(stop_server(), 0);
    /* a queue of 40 sentences: a request of 64 is refused with 429 */
    assert_int_equal(start_server("--queue-depth", "40"), 0);
    json_t *in = json_array();
    for (int k = 0; k < 64; k++) json_array_append_new(in, json_string("hello"));
    json_t *o = json_pack("{s:o}", "input", in);
    char *body = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    expect_error("POST", "/v1/embeddings", body, 429, "queue is full");
    free(body);
    assert_int_equal(stop_server(), 0);
    /* the four requests take what they take (ASan on a loaded machine: more
     * than the default 30 s): the drain must not close them */
    assert_int_equal(start_server("--drain-seconds", "600"), 0);
    pthread_t th[4];
    inflight r[4];
    for (int i = 0; i < 4; i++) pthread_create(&th[i], NULL, long_request, &r[i]);
    usleep(150000); /* the requests are in */
    assert_int_equal(stop_server(), 0);
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(r[i].status, 200);
    }
    have_model = false; /* no server any more */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_device_list_options),
        cmocka_unit_test(test_single_strings),
        cmocka_unit_test(test_concurrent_lists_and_bad_requests),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_health_and_metrics),
        cmocka_unit_test(test_health_during_warmup),
        cmocka_unit_test(test_queue_full_and_graceful_shutdown),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
