/* The remote kernel cache (kernels/remote.h) on a private redis-server that
 * the test starts itself (a Unix socket in a temporary directory; skipped,
 * visibly, without redis-server): two processes on one Redis, the second
 * compiling nothing; a tampered entry refused and recompiled; a wrong key
 * and no key refused; a server that is down, silent, or answers garbage
 * costs at most the timeout, one warning, and the results stay right. */
/* cmocka.h needs these first, in this order */
/* clang-format off */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
/* clang-format on */

#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

#include "jit/runtime.h"
#include "kernels/remote.h"
#include "tests/util.h"

extern char **environ;

#define KEY "remote-test-key"

/* The backend the runtimes compile for: the CPU, or CUDA when the GPU
 * session asks for it (SJ_REMOTE_BACKEND=cuda; skipped, visibly, without a
 * device), and the extension of its artifacts in a cache dir. */
static sj_backend_kind backend = SJ_BACKEND_CPU;
static const char *artifact_ext = "so";
#define N_SHAPES 2
static const int64_t shapes[N_SHAPES][2] = {{5, 24}, {7, 40}};

/* -- The model and its float64 reference --------------------------------------- */

/* y = gelu(layer_norm(x + r)), z = softmax(x * 0.5, -1); x [S, H], r [H] */
static sj_status model(sj_tracer *t, const sj_val *in, int n, void *user) {
    (void)n, (void)user;
    sj_val h = sj_add(t, in[0], in[1]);
    sj_status st = sj_output(t, sj_gelu(t, sj_layer_norm(t, h, SJ_NONE, SJ_NONE, 1e-5)));
    if (st) return st;
    return sj_output(t, sj_softmax(t, sj_mul(t, in[0], sj_scalar(t, 0.5)), 1));
}

/* Deterministic inputs of shape s (seeded by it). */
static void inputs(const int64_t *s, float *x, float *r) {
    uint64_t z = (uint64_t)(s[0] * 1000 + s[1]);
    for (int64_t i = 0; i < s[0] * s[1] + s[1]; i++) {
        z = z * 6364136223846793005ULL + 1442695040888963407ULL;
        float v = (float)((double)(z >> 11) / 9007199254740992.0 * 4.0 - 2.0);
        if (i < s[0] * s[1]) x[i] = v;
        else r[i - s[0] * s[1]] = v;
    }
}

/* The number of elements of either output that differ from the float64
 * reference by more than 1e-4 (relative to max(1, |ref|)). */
static int wrong(const int64_t *s, const float *x, const float *r, const float *y, const float *zz) {
    int bad = 0;
    int64_t S = s[0], H = s[1];
    for (int64_t i = 0; i < S; i++) {
        double h[64], mean = 0, var = 0, mx = -1e300, sum = 0;
        for (int64_t j = 0; j < H; j++) h[j] = (double)x[i * H + j] + r[j], mean += h[j];
        mean /= (double)H;
        for (int64_t j = 0; j < H; j++) var += (h[j] - mean) * (h[j] - mean);
        var /= (double)H;
        for (int64_t j = 0; j < H; j++) {
            double v = (h[j] - mean) / sqrt(var + 1e-5);
            double g = 0.5 * v * (1 + erf(v / sqrt(2.0)));
            if (fabs(g - y[i * H + j]) > 1e-4 * fmax(1, fabs(g))) bad++;
            mx = fmax(mx, 0.5 * x[i * H + j]);
        }
        for (int64_t j = 0; j < H; j++) sum += exp(0.5 * x[i * H + j] - mx);
        for (int64_t j = 0; j < H; j++) {
            double p = exp(0.5 * x[i * H + j] - mx) / sum;
            if (fabs(p - zz[i * H + j]) > 1e-5) bad++;
        }
    }
    return bad;
}

typedef struct run_result {
    sj_stats s;          /* summed over the shapes' functions */
    sj_remote_stats rs;  /* of the runtime's remote cache */
    bool has_remote;
    int wrong;           /* wrong elements, all calls */
    int warnings;        /* SJ_LOG_WARN lines */
    char log[8192];      /* the warning lines */
} run_result;

static void count_sink(void *user, unsigned topic, const char *msg) {
    run_result *r = user;
    if (topic != SJ_LOG_WARN) return;
    r->warnings++;
    size_t n = strlen(r->log);
    snprintf(r->log + n, sizeof r->log - n, "%s\n", msg);
}

/* One runtime on cache dir `dir` (NULL: none) and remote url (NULL: none)
 * with key (NULL: none): every shape called once (sync compile, hot at
 * once: the call runs fused), the results checked. */
static void run_model(const char *dir, const char *url, const char *key, int timeout_ms, int n_shapes,
                      run_result *out) {
    memset(out, 0, sizeof *out);
    sj_runtime_config cfg;
    sj_runtime_config_init(&cfg);
    cfg.backend = backend;
    cfg.compile_mode = SJ_COMPILE_SYNC;
    cfg.exec_threads = 1;
    cfg.cache_dir = dir;
    cfg.cache_key = key;
    cfg.remote_cache_url = url;
    if (timeout_ms) cfg.remote_cache_timeout_ms = timeout_ms;
    cfg.log_mask = SJ_LOG_WARN;
    cfg.log_fn = count_sink;
    cfg.log_user = out;
    sj_runtime *rt = NULL;
    if (sj_runtime_create(&cfg, &rt)) fail_msg("sj_runtime_create: %s", sj_last_error());
    for (int k = 0; k < n_shapes; k++) {
        sj_fn_options o;
        sj_fn_options_init(&o);
        o.dynamic = SJ_DYNAMIC_STATIC;
        o.hot_threshold = 1;
        sj_fn *fn = NULL;
        assert_int_equal(sj_fn_create(rt, "remote_model", 2, model, NULL, &o, &fn), SJ_OK);
        const int64_t *s = shapes[k];
        float x[64 * 64], r[64], y[64 * 64], z[64 * 64];
        inputs(s, x, r);
        sj_tensor in[2] = {sj_tensor_make(x, SJ_F32, 2, s), sj_tensor_make(r, SJ_F32, 1, &s[1])};
        sj_tensor outs[2] = {sj_tensor_make(y, SJ_F32, 2, s), sj_tensor_make(z, SJ_F32, 2, s)};
        if (backend == SJ_BACKEND_CUDA) { /* the same call on device copies */
            sj_tensor din[2] = {in[0], in[1]}, dout[2] = {outs[0], outs[1]};
            for (int i = 0; i < 2; i++) {
                din[i].device = dout[i].device = SJ_CUDA;
                assert_int_equal(sj_tensor_alloc(rt, &din[i]), SJ_OK);
                assert_int_equal(sj_tensor_copy(rt, &din[i], &in[i]), SJ_OK);
                assert_int_equal(sj_tensor_alloc(rt, &dout[i]), SJ_OK);
            }
            if (sj_call(fn, din, 2, dout, 2)) fail_msg("sj_call: %s", sj_last_error());
            for (int i = 0; i < 2; i++) {
                assert_int_equal(sj_tensor_copy(rt, &outs[i], &dout[i]), SJ_OK);
                sj_tensor_free(rt, &din[i]);
                sj_tensor_free(rt, &dout[i]);
            }
        } else if (sj_call(fn, in, 2, outs, 2))
            fail_msg("sj_call: %s", sj_last_error());
        out->wrong += wrong(s, x, r, y, z);
        sj_stats st;
        sj_fn_stats(fn, &st);
        if (st.fused_specialized_calls != 1) out->wrong += 1000000; /* it must run fused */
        out->s.compiles += st.compiles;
        out->s.compile_cache_hits += st.compile_cache_hits;
        out->s.compile_remote_hits += st.compile_remote_hits;
        out->s.compile_failures += st.compile_failures;
        sj_fn_destroy(fn);
    }
    out->has_remote = rt->remote != NULL;
    sj_remote_get_stats(rt->remote, &out->rs);
    /* the public counters say the same */
    sj_cache_counters cc;
    sj_runtime_cache_counters(rt, &cc);
    assert_int_equal(cc.remote_enabled, out->has_remote);
    assert_int_equal(cc.remote_hits, out->rs.hits);
    assert_int_equal(cc.remote_misses, out->rs.misses);
    assert_int_equal(cc.remote_stores, out->rs.stores);
    assert_int_equal(cc.remote_refused, out->rs.refused);
    assert_int_equal(cc.remote_errors, out->rs.errors);
    assert_int_equal(cc.remote_bytes_in, out->rs.bytes_in);
    assert_int_equal(cc.disk_enabled, dir != NULL);
    if (dir) { /* every unit was looked up on disk first, and missed (fresh dirs) or hit */
        assert_int_equal(cc.disk_hits + cc.disk_misses, (uint64_t)n_shapes);
        assert_int_equal(cc.disk_stores, out->s.compiles - (out->s.compile_cache_hits - out->s.compile_remote_hits));
    }
    sj_runtime_destroy(rt);
}

/* -- A private redis-server ---------------------------------------------------------- */

static char tmp[PATH_MAX], sock[PATH_MAX + 16], url[PATH_MAX + 32];
static pid_t redis = -1;
static bool no_redis;

static redisContext *redis_connect(void) {
    struct timeval tv = {1, 0};
    redisContext *c = redisConnectUnixWithTimeout(sock, tv);
    if (c && c->err) {
        redisFree(c);
        return NULL;
    }
    return c;
}

static int start_redis(void **state) {
    (void)state;
    if (tu_mkdtemp(tmp, sizeof tmp, "sj-remote")) return -1;
    snprintf(sock, sizeof sock, "%s/redis.sock", tmp);
    snprintf(url, sizeof url, "unix://%s", sock);
    char logf[PATH_MAX + 16];
    snprintf(logf, sizeof logf, "%s/redis.log", tmp);
    char *argv[] = {"redis-server", "--port", "0", "--unixsocket", sock, "--unixsocketperm", "700", "--save", "",
                    "--appendonly", "no", "--dir", tmp, "--logfile", logf, "--daemonize", "no", NULL};
    if (posix_spawnp(&redis, "redis-server", NULL, NULL, argv, environ)) {
        no_redis = true;
        redis = -1;
        return 0;
    }
    for (int i = 0; i < 500; i++) { /* up to 5 s */
        redisContext *c = redis_connect();
        if (c) {
            redisReply *rep = redisCommand(c, "PING");
            bool ok = rep && rep->type == REDIS_REPLY_STATUS;
            freeReplyObject(rep);
            redisFree(c);
            if (ok) return 0;
        }
        int status;
        if (waitpid(redis, &status, WNOHANG) == redis) { /* exited: not there, or broken */
            no_redis = true;
            redis = -1;
            return 0;
        }
        usleep(10000);
    }
    return -1;
}

static int stop_redis(void **state) {
    (void)state;
    if (redis > 0) {
        kill(redis, SIGTERM);
        waitpid(redis, NULL, 0);
    }
    tu_rmtree(tmp);
    return 0;
}

#define NEED_REDIS()                                                        \
    do {                                                                    \
        if (no_redis) {                                                     \
            print_message("skipped: no redis-server (apt-get install redis-server)\n"); \
            skip();                                                         \
        }                                                                   \
    } while (0)

static void flush_redis(void) {
    redisContext *c = redis_connect();
    assert_non_null(c);
    freeReplyObject(redisCommand(c, "FLUSHALL"));
    redisFree(c);
}

/* The names of the entries in Redis (at most max), sorted; their count. */
static int redis_keys(char names[][128], int max) {
    redisContext *c = redis_connect();
    assert_non_null(c);
    redisReply *rep = redisCommand(c, "KEYS shapejit:kc:*");
    assert_non_null(rep);
    assert_int_equal(rep->type, REDIS_REPLY_ARRAY);
    int n = (int)rep->elements;
    for (int i = 0; i < n && i < max; i++) snprintf(names[i], 128, "%s", rep->element[i]->str);
    freeReplyObject(rep);
    redisFree(c);
    return n;
}

/* A fresh (missing) cache dir under the test's temporary dir. */
static const char *fresh_dir(char *buf, size_t n, const char *name) {
    snprintf(buf, n, "%s/%s", tmp, name);
    return buf;
}

/* The backend's artifacts in a cache dir. */
static int count_artifacts(const char *dir) {
    char cmd[PATH_MAX + 64];
    snprintf(cmd, sizeof cmd, "ls %s 2>/dev/null | grep -c '\\.%s$'", dir, artifact_ext);
    FILE *p = popen(cmd, "r");
    int n = 0;
    if (p) {
        if (fscanf(p, "%d", &n) != 1) n = 0;
        pclose(p);
    }
    return n;
}

/* -- Two processes ---------------------------------------------------------------------- */

/* This binary run as `test_remote --child DIR URL OUT`: run_model with the
 * key, results into OUT. */
static int child_main(const char *dir, const char *u, const char *outp) {
    run_result r;
    run_model(dir, u, KEY, 0, N_SHAPES, &r);
    FILE *f = fopen(outp, "w");
    if (!f) return 2;
    fprintf(f, "%llu %llu %llu %d %d %llu\n", (unsigned long long)r.s.compiles,
            (unsigned long long)r.s.compile_cache_hits, (unsigned long long)r.s.compile_remote_hits, r.wrong,
            r.warnings, (unsigned long long)r.rs.stores);
    fclose(f);
    return 0;
}

typedef struct child_out {
    unsigned long long compiles, cache_hits, remote_hits, stores;
    int wrong, warnings;
} child_out;

static child_out run_child(const char *dir) {
    char outp[PATH_MAX + 16];
    snprintf(outp, sizeof outp, "%s/child.out", tmp);
    unlink(outp);
    char *argv[] = {"test_remote", "--child", (char *)dir, url, outp, NULL};
    pid_t pid;
    assert_int_equal(posix_spawn(&pid, "/proc/self/exe", NULL, NULL, argv, environ), 0);
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    if (!WIFEXITED(status) || WEXITSTATUS(status)) fail_msg("child exited with status %d", status);
    child_out c;
    FILE *f = fopen(outp, "r");
    assert_non_null(f);
    assert_int_equal(fscanf(f, "%llu %llu %llu %d %d %llu", &c.compiles, &c.cache_hits, &c.remote_hits, &c.wrong,
                            &c.warnings, &c.stores),
                     6);
    fclose(f);
    return c;
}

/* Process A compiles and pushes; process B, with an empty disk cache,
 * compiles nothing: every unit from Redis, kept in its disk cache (a
 * third process on B's dir finds them there, not in Redis). */
static void test_two_processes(void **state) {
    (void)state;
    NEED_REDIS();
    flush_redis();
    char a[PATH_MAX], b[PATH_MAX];
    child_out ca = run_child(fresh_dir(a, sizeof a, "proc-a"));
    assert_int_equal(ca.wrong, 0);
    assert_int_equal(ca.warnings, 0);
    assert_int_equal(ca.compiles, N_SHAPES);
    assert_int_equal(ca.cache_hits, 0);
    assert_int_equal(ca.stores, N_SHAPES);
    char names[8][128];
    assert_int_equal(redis_keys(names, 8), N_SHAPES);

    child_out cb = run_child(fresh_dir(b, sizeof b, "proc-b"));
    assert_int_equal(cb.wrong, 0);
    assert_int_equal(cb.warnings, 0);
    assert_int_equal(cb.compiles, N_SHAPES);
    assert_int_equal(cb.cache_hits, N_SHAPES);  /* no compiler run */
    assert_int_equal(cb.remote_hits, N_SHAPES); /* all from Redis */
    assert_int_equal(cb.stores, 0);
    assert_int_equal(count_artifacts(b), N_SHAPES);    /* kept on disk */

    child_out cc = run_child(b);
    assert_int_equal(cc.wrong, 0);
    assert_int_equal(cc.cache_hits, N_SHAPES);
    assert_int_equal(cc.remote_hits, 0); /* the disk first */
}

/* -- Trust ------------------------------------------------------------------------------ */

/* One entry's bytes changed in Redis: refused (one warning), that unit
 * compiled again and pushed over the bad value; the rest from Redis. */
static void test_tampered(void **state) {
    (void)state;
    NEED_REDIS();
    flush_redis();
    char d[PATH_MAX];
    run_result r;
    run_model(fresh_dir(d, sizeof d, "tamper-a"), url, KEY, 0, N_SHAPES, &r);
    assert_int_equal(r.wrong, 0);
    char names[8][128];
    assert_int_equal(redis_keys(names, 8), N_SHAPES);
    redisContext *c = redis_connect();
    assert_non_null(c);
    redisReply *rep = redisCommand(c, "GET %s", names[0]);
    assert_int_equal(rep->type, REDIS_REPLY_STRING);
    size_t len = rep->len;
    char *v = malloc(len);
    memcpy(v, rep->str, len);
    freeReplyObject(rep);
    v[len - 100] ^= 0x5a; /* inside the artifact */
    freeReplyObject(redisCommand(c, "SET %s %b", names[0], v, len));

    run_model(fresh_dir(d, sizeof d, "tamper-b"), url, KEY, 0, N_SHAPES, &r);
    assert_int_equal(r.wrong, 0);
    assert_int_equal(r.s.compiles, N_SHAPES);
    assert_int_equal(r.s.compile_remote_hits, N_SHAPES - 1);
    assert_int_equal(r.s.compile_cache_hits, N_SHAPES - 1); /* one compiler run */
    assert_int_equal(r.rs.refused, 1);
    assert_int_equal(r.rs.stores, 1);
    assert_int_equal(r.warnings, 1);
    assert_non_null(strstr(r.log, "refused"));
    assert_non_null(strstr(r.log, "digest does not match"));

    /* the bad value was overwritten by the fresh compile */
    rep = redisCommand(c, "GET %s", names[0]);
    assert_int_equal(rep->type, REDIS_REPLY_STRING);
    assert_true(rep->len != len || memcmp(rep->str, v, len) != 0);
    freeReplyObject(rep);
    free(v);
    run_model(fresh_dir(d, sizeof d, "tamper-c"), url, KEY, 0, N_SHAPES, &r);
    assert_int_equal(r.s.compile_remote_hits, N_SHAPES);
    assert_int_equal(r.rs.refused, 0);

    /* a value that is not ours at all, and one of the wrong type */
    freeReplyObject(redisCommand(c, "SET %s %s", names[0], "hello"));
    freeReplyObject(redisCommand(c, "DEL %s", names[1]));
    freeReplyObject(redisCommand(c, "RPUSH %s %s", names[1], "x"));
    redisFree(c);
    run_model(fresh_dir(d, sizeof d, "tamper-d"), url, KEY, 0, N_SHAPES, &r);
    assert_int_equal(r.wrong, 0);
    assert_int_equal(r.s.compile_remote_hits, 0);
    assert_int_equal(r.s.compile_cache_hits, 0);
    assert_int_equal(r.rs.refused, 2); /* a bad header; WRONGTYPE: an entry's trouble, not the server's */
    assert_int_equal(r.rs.errors, 0);
    assert_int_equal(r.warnings, 1);
}

/* Another key: every entry refused (the digests are keyed), all compiled,
 * results right. No key: the remote cache is not used at all (warned). */
static void test_wrong_and_no_key(void **state) {
    (void)state;
    NEED_REDIS();
    flush_redis();
    char d[PATH_MAX];
    run_result r;
    run_model(fresh_dir(d, sizeof d, "key-a"), url, KEY, 0, N_SHAPES, &r);
    assert_int_equal(r.rs.stores, N_SHAPES);
    run_model(fresh_dir(d, sizeof d, "key-b"), url, "another key", 0, N_SHAPES, &r);
    assert_int_equal(r.wrong, 0);
    assert_int_equal(r.s.compile_cache_hits, 0);
    assert_int_equal(r.rs.refused, N_SHAPES);
    assert_int_equal(r.warnings, 1);

    run_model(fresh_dir(d, sizeof d, "key-c"), url, NULL, 0, 1, &r);
    assert_int_equal(r.wrong, 0);
    assert_false(r.has_remote);
    assert_int_equal(r.warnings, 1);
    assert_non_null(strstr(r.log, "no cache key"));
    assert_int_equal(r.s.compile_cache_hits, 0);
}

/* -- A server that is down, silent, or answers garbage -------------------------------------- */

typedef enum { SRV_SILENT, SRV_JUNK, SRV_TRICKLE } srv_mode;

typedef struct fake_server {
    int fd, port;
    srv_mode mode;
    atomic_bool stop;
    pthread_t thread;
    int clients[64];
    int n_clients;
} fake_server;

static void *serve(void *arg) {
    fake_server *s = arg;
    while (!atomic_load(&s->stop)) {
        struct pollfd p[65] = {{s->fd, POLLIN, 0}};
        for (int i = 0; i < s->n_clients; i++) p[i + 1] = (struct pollfd){s->clients[i], POLLIN, 0};
        if (poll(p, (nfds_t)s->n_clients + 1, 20) <= 0) continue;
        if ((p[0].revents & POLLIN) && s->n_clients < 64) {
            int c = accept(s->fd, NULL, NULL);
            if (c >= 0) s->clients[s->n_clients++] = c;
        }
        for (int i = 0; i < s->n_clients; i++) {
            if (!(p[i + 1].revents & POLLIN)) continue;
            char buf[4096];
            ssize_t n = recv(s->clients[i], buf, sizeof buf, 0);
            if (n <= 0) continue;
            if (s->mode == SRV_JUNK) {
                const char junk[] = "HTTP/1.0 400 Bad Request\r\n\r\n";
                send(s->clients[i], junk, sizeof junk - 1, MSG_NOSIGNAL);
            } else if (s->mode == SRV_TRICKLE) { /* a huge bulk reply that never ends */
                const char head[] = "$1000000000\r\nsjr1";
                send(s->clients[i], head, sizeof head - 1, MSG_NOSIGNAL);
            }
        }
    }
    for (int i = 0; i < s->n_clients; i++) close(s->clients[i]);
    return NULL;
}

static void fake_start(fake_server *s, srv_mode mode) {
    memset(s, 0, sizeof *s);
    s->mode = mode;
    s->fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(s->fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t l = sizeof a;
    assert_int_equal(bind(s->fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(s->fd, 16), 0);
    assert_int_equal(getsockname(s->fd, (struct sockaddr *)&a, &l), 0);
    s->port = ntohs(a.sin_port);
    assert_int_equal(pthread_create(&s->thread, NULL, serve, s), 0);
}

static void fake_stop(fake_server *s) {
    atomic_store(&s->stop, true);
    pthread_join(s->thread, NULL);
    close(s->fd);
}

/* A loopback port with nothing listening (bound, then closed). */
static int dead_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t l = sizeof a;
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &l), 0);
    close(fd);
    return ntohs(a.sin_port);
}

/* A fetch from u fails within the timeout (plus slack), then the next is
 * skipped at once (back-off); one warning in all. */
static void check_bounded(const char *u, int timeout_ms, const char *why) {
    run_result lb;
    memset(&lb, 0, sizeof lb);
    sj_log_sink sink = {SJ_LOG_WARN, count_sink, &lb, NULL, NULL};
    sj_remote *r = NULL;
    assert_int_equal(sj_remote_open(u, KEY, timeout_ms, &sink, &r), SJ_OK);
    char key[65];
    memset(key, 'a', 64);
    key[64] = '\0';
    void *data = NULL;
    size_t len = 0;
    double t0 = tu_now_ms();
    assert_false(sj_remote_get(r, key, "so", &data, &len));
    double t1 = tu_now_ms();
    if (t1 - t0 > timeout_ms + 750) fail_msg("%s: the fetch took %.0f ms (timeout %d)", u, t1 - t0, timeout_ms);
    assert_false(sj_remote_get(r, key, "so", &data, &len));
    sj_remote_put(r, key, "so", "x", 1);
    assert_true(tu_now_ms() - t1 < timeout_ms); /* backing off: not tried (the stats say so exactly) */
    sj_remote_stats st;
    sj_remote_get_stats(r, &st);
    assert_int_equal(st.errors, 1);
    assert_int_equal(st.skipped, 2);
    assert_int_equal(st.hits, 0);
    assert_int_equal(lb.warnings, 1);
    if (!strstr(lb.log, why)) fail_msg("%s: the warning does not say '%s': %s", u, why, lb.log);
    sj_remote_close(r);
}

static void test_down(void **state) {
    (void)state;
    char u[64], d[PATH_MAX];
    snprintf(u, sizeof u, "redis://127.0.0.1:%d", dead_port());
    check_bounded(u, 200, "cannot connect");
    run_result r;
    run_model(fresh_dir(d, sizeof d, "down"), u, KEY, 200, N_SHAPES, &r);
    assert_int_equal(r.wrong, 0);
    assert_int_equal(r.s.compiles, N_SHAPES);
    assert_int_equal(r.s.compile_failures, 0);
    assert_int_equal(r.warnings, 1);
    assert_non_null(strstr(r.log, "using the local cache only"));
}

static void test_silent_server(void **state) {
    (void)state;
    fake_server s;
    fake_start(&s, SRV_SILENT);
    char u[64], d[PATH_MAX];
    snprintf(u, sizeof u, "redis://127.0.0.1:%d/0", s.port);
    check_bounded(u, 300, "no answer within 300 ms");
    double t0 = tu_now_ms();
    run_result r;
    run_model(fresh_dir(d, sizeof d, "silent"), u, KEY, 300, N_SHAPES, &r);
    assert_int_equal(r.wrong, 0);
    assert_int_equal(r.s.compiles, N_SHAPES);
    assert_int_equal(r.warnings, 1);
    /* at least the first fetch failed; later ones are skipped during the
     * back-off unless a compile outlasted it (a loaded machine): still one
     * warning */
    assert_true(r.rs.errors >= 1 && r.rs.errors <= 2 * N_SHAPES);
    assert_int_equal(r.rs.hits, 0);
    print_message("silent server: %d compiles in %.0f ms with a 300 ms timeout\n", N_SHAPES, tu_now_ms() - t0);
    fake_stop(&s);
}

static void test_garbage_server(void **state) {
    (void)state;
    fake_server s;
    fake_start(&s, SRV_JUNK);
    char u[64], d[PATH_MAX];
    snprintf(u, sizeof u, "redis://localhost:%d", s.port);
    check_bounded(u, 300, "garbage reply");
    run_result r;
    run_model(fresh_dir(d, sizeof d, "junk"), u, KEY, 300, 1, &r);
    assert_int_equal(r.wrong, 0);
    assert_int_equal(r.warnings, 1);
    fake_stop(&s);

    fake_start(&s, SRV_TRICKLE); /* a reply that promises 1 GB and stalls: bounded */
    snprintf(u, sizeof u, "redis://127.0.0.1:%d", s.port);
    check_bounded(u, 300, "reply over");
    fake_stop(&s);
}

/* -- URLs and configuration --------------------------------------------------------------- */

static void test_urls(void **state) {
    (void)state;
    const char *good[] = {"redis://127.0.0.1", "redis://127.0.0.1:6380", "redis://h:1/3", "redis://:pw@h:2/0",
                          "redis://[::1]:6379/1", "unix:///tmp/r.sock", "unix:///tmp/r.sock?db=2", "/tmp/r.sock",
                          "redis://host/"};
    for (size_t i = 0; i < sizeof good / sizeof *good; i++)
        if (sj_remote_check_url(good[i])) fail_msg("%s: %s", good[i], sj_last_error());
    const char *bad[][2] = {{"http://x", "unknown scheme"},     {"redis://", "no host"},
                            {"redis://h:0", "port"},            {"redis://h:99999", "port"},
                            {"redis://h/x", "db"},              {"unix://rel.sock", "absolute"},
                            {"redis://user@h", "credentials"},  {"redis://h:1x", "port"},
                            {"unix:///s?x=1", "?db=N"},         {"", "empty"}};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        assert_int_equal(sj_remote_check_url(bad[i][0]), SJ_EINVAL);
        if (!strstr(sj_last_error(), bad[i][1])) fail_msg("%s: '%s' lacks '%s'", bad[i][0], sj_last_error(), bad[i][1]);
    }
    /* sj_runtime_create refuses a malformed URL, naming it */
    sj_runtime_config cfg;
    sj_runtime_config_init(&cfg);
    cfg.backend = SJ_BACKEND_CPU;
    cfg.compile_mode = SJ_COMPILE_OFF;
    cfg.cache_dir = NULL;
    cfg.remote_cache_url = "redis//nothing";
    sj_runtime *rt = NULL;
    assert_int_equal(sj_runtime_create(&cfg, &rt), SJ_EINVAL);
    assert_non_null(strstr(sj_last_error(), "redis//nothing"));
    assert_null(rt);
    cfg.remote_cache_url = "redis://127.0.0.1:1";
    cfg.remote_cache_timeout_ms = 0;
    assert_int_equal(sj_runtime_create(&cfg, &rt), SJ_EINVAL);
    assert_non_null(strstr(sj_last_error(), "remote_cache_timeout_ms"));
    /* the environment: a good URL is taken, a bad one ignored */
    setenv("SHAPEJIT_REMOTE_CACHE_URL", "redis://10.0.0.1:7000/2", 1);
    sj_runtime_config_init(&cfg);
    assert_string_equal(cfg.remote_cache_url, "redis://10.0.0.1:7000/2");
    setenv("SHAPEJIT_REMOTE_CACHE_URL", "nonsense", 1);
    sj_runtime_config_init(&cfg);
    assert_null(cfg.remote_cache_url);
    unsetenv("SHAPEJIT_REMOTE_CACHE_URL");
    /* a host that does not resolve: no remote, one warning */
    assert_int_equal(sj_remote_open("redis://no-such-host.invalid", KEY, 100, NULL, &(sj_remote *){0}), SJ_EINVAL);
    assert_non_null(strstr(sj_last_error(), "cannot resolve"));
    assert_int_equal(sj_remote_open("redis://127.0.0.1", "", 100, NULL, &(sj_remote *){0}), SJ_EINVAL);
    assert_non_null(strstr(sj_last_error(), "no cache key"));
}

/* Several threads fetching and pushing at once on one remote: every fetch
 * verifies, connections are pooled. */
typedef struct job {
    sj_remote *r;
    int id, bad;
} job;

static void *hammer(void *arg) {
    job *j = arg;
    char key[65];
    for (int i = 0; i < 40; i++) {
        snprintf(key, sizeof key, "%064x", j->id * 1000 + i % 5);
        char val[300];
        memset(val, 'a' + j->id, sizeof val);
        sj_remote_put(j->r, key, "so", val, sizeof val);
        void *d = NULL;
        size_t n = 0;
        if (!sj_remote_get(j->r, key, "so", &d, &n) || n != sizeof val || memcmp(d, val, n)) j->bad++;
        free(d);
    }
    return NULL;
}

static void test_threads(void **state) {
    (void)state;
    NEED_REDIS();
    flush_redis();
    sj_remote *r = NULL;
    assert_int_equal(sj_remote_open(url, KEY, 2000, NULL, &r), SJ_OK);
    job jobs[4];
    for (int i = 0; i < 4; i++) jobs[i] = (job){r, i, 0};
    tu_run_threads(4, hammer, jobs, sizeof *jobs);
    for (int i = 0; i < 4; i++) assert_int_equal(jobs[i].bad, 0);
    sj_remote_stats st;
    sj_remote_get_stats(r, &st);
    assert_int_equal(st.hits, 160);
    assert_int_equal(st.stores, 160);
    assert_int_equal(st.errors, 0);
    assert_true(st.bytes_out > 160 * 300);
    sj_remote_close(r);
}

int main(int argc, char **argv) {
    bool child = argc == 5 && !strcmp(argv[1], "--child");
    const char *be = getenv("SJ_REMOTE_BACKEND");
    if (be && !strcmp(be, "cuda")) {
        sj_runtime_config cfg;
        sj_runtime_config_init(&cfg);
        cfg.backend = SJ_BACKEND_CUDA;
        cfg.compile_mode = SJ_COMPILE_OFF;
        cfg.cache_dir = NULL;
        sj_runtime *rt = NULL;
        if (sj_runtime_create(&cfg, &rt)) {
            printf("skipped: no CUDA device (%s)\n", sj_last_error());
            return 0;
        }
        sj_runtime_destroy(rt);
        backend = SJ_BACKEND_CUDA;
        artifact_ext = "cubin";
        if (!child) printf("test_remote on the CUDA backend\n");
    }
    if (child) return child_main(argv[2], argv[3], argv[4]);
    signal(SIGPIPE, SIG_DFL); /* a SIGPIPE from the library would kill the test */

    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_urls),
        cmocka_unit_test(test_two_processes),
        cmocka_unit_test(test_tampered),
        cmocka_unit_test(test_wrong_and_no_key),
        cmocka_unit_test(test_threads),
        cmocka_unit_test(test_down),
        cmocka_unit_test(test_silent_server),
        cmocka_unit_test(test_garbage_server),
    };
    return cmocka_run_group_tests(tests, start_redis, stop_redis);
}
