/* The remote kernel cache on Redis (see remote.h).
 *
 * A value: "sjr1" | digest (32 bytes, sj_cache_digest under the cache
 * key) | the artifact. Verified before anything else reads it; a value
 * that does not verify is refused and left for the next fresh compile to
 * overwrite (SET), so one bad entry costs one compile.
 *
 * I/O: our own non-blocking socket (TCP or a Unix socket), polled against
 * one deadline per operation; hiredis formats commands
 * (redisFormatCommandArgv) and parses replies (redisReader). A reply whose
 * first byte is not one our commands can get ('$', '+', '-', ':'), or that
 * grows past the artifact limit, is garbage: the connection is dropped.
 *
 * Locks: `lock` guards the idle connections, the back-off state and the
 * stats; it is never held during I/O.
 */
#include "kernels/remote.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <hiredis/hiredis.h>
#include <sodium.h>

#include "base/clock.h"
#include "base/error.h"
#include "kernels/cache.h"

#define VALUE_MAGIC "sjr1"
#define MAGIC_LEN 4
#define HEADER_LEN (MAGIC_LEN + 32)
#define KEY_PREFIX "shapejit:kc:"
#define POOL_MAX 16
#define BACKOFF_FIRST_MS 1000
#define BACKOFF_MAX_MS 60000
/* Replies of commands other than GET are a few bytes. */
#define SMALL_REPLY_MAX 4096

struct conn {
    int fd;
    redisReader *rd;
};

struct sj_remote {
    char name[300];    /* the URL without its password */
    char *password;    /* NULL: no AUTH */
    int db;
    struct sockaddr_storage addr;
    socklen_t addr_len;
    int timeout_ms;
    uint8_t mac_key[SJ_CACHE_MAC_BYTES];
    const sj_log_sink *log;
    _Atomic bool warned_down, warned_refused;
    pthread_mutex_t lock; /* idle, back-off, stats */
    struct conn idle[POOL_MAX];
    int n_idle;
    int64_t down_until_ns; /* 0: not backing off */
    int backoff_ms;
    bool in_trouble;       /* the last operation failed on the connection */
    sj_remote_stats stats;
};

/* -- URLs ---------------------------------------------------------------------- */

typedef struct url_parts {
    bool is_unix;
    char host[256], path[108];
    int port, db;
    char password[256];
    bool has_password;
} url_parts;

static bool parse_int(const char *s, size_t n, int lo, int hi, int *out) {
    if (n == 0 || n > 9) return false;
    int v = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return false;
        v = v * 10 + (s[i] - '0');
    }
    if (v < lo || v > hi) return false;
    *out = v;
    return true;
}

static sj_status bad_url(const char *url, const char *why) {
    return sj_seterr(SJ_EINVAL, "remote cache URL '%s': %s (expected redis://[:password@]host[:port][/db], "
                                "unix:///path/to/socket[?db=N] or /path/to/socket)",
                     url, why);
}

static sj_status parse_url(const char *url, url_parts *u) {
    memset(u, 0, sizeof *u);
    u->port = 6379;
    if (!url || !*url) return sj_seterr(SJ_EINVAL, "remote cache URL is empty");
    const char *path = NULL;
    if (url[0] == '/') path = url;
    else if (!strncmp(url, "unix://", 7)) path = url + 7;
    if (path) {
        u->is_unix = true;
        if (path[0] != '/') return bad_url(url, "a socket path must be absolute");
        size_t n = strcspn(path, "?");
        if (n >= sizeof u->path) return bad_url(url, "the socket path is too long");
        memcpy(u->path, path, n);
        u->path[n] = '\0';
        if (path[n]) {
            const char *q = path + n + 1;
            if (strncmp(q, "db=", 3) || !parse_int(q + 3, strlen(q + 3), 0, 1000000, &u->db))
                return bad_url(url, "the only query is ?db=N");
        }
        return SJ_OK;
    }
    if (strncmp(url, "redis://", 8)) return bad_url(url, "unknown scheme");
    const char *p = url + 8, *at = strchr(p, '@');
    if (at) {
        const char *colon = memchr(p, ':', (size_t)(at - p));
        if (!colon) return bad_url(url, "credentials must be ':password@'");
        size_t n = (size_t)(at - colon - 1);
        if (n == 0 || n >= sizeof u->password) return bad_url(url, "the password is empty or too long");
        memcpy(u->password, colon + 1, n);
        u->has_password = true;
        p = at + 1;
    }
    const char *host_end;
    if (*p == '[') {
        host_end = strchr(p, ']');
        if (!host_end) return bad_url(url, "'[' without ']'");
        size_t n = (size_t)(host_end - p - 1);
        if (n == 0 || n >= sizeof u->host) return bad_url(url, "bad host");
        memcpy(u->host, p + 1, n);
        host_end++;
    } else {
        host_end = p + strcspn(p, ":/");
        size_t n = (size_t)(host_end - p);
        if (n == 0 || n >= sizeof u->host) return bad_url(url, "no host");
        memcpy(u->host, p, n);
    }
    p = host_end;
    if (*p == ':') {
        size_t n = strcspn(p + 1, "/");
        if (!parse_int(p + 1, n, 1, 65535, &u->port)) return bad_url(url, "the port is not 1 .. 65535");
        p += 1 + n;
    }
    if (*p == '/' && p[1]) {
        if (!parse_int(p + 1, strlen(p + 1), 0, 1000000, &u->db)) return bad_url(url, "the db is not a number");
    } else if (*p && strcmp(p, "/")) {
        return bad_url(url, "trailing characters");
    }
    return SJ_OK;
}

sj_status sj_remote_check_url(const char *url) {
    url_parts u;
    return parse_url(url, &u);
}

/* -- Stats, trouble and back-off -------------------------------------------------- */

static void count(sj_remote *r, uint64_t *field, uint64_t n) {
    pthread_mutex_lock(&r->lock);
    *field += n;
    pthread_mutex_unlock(&r->lock);
}

static void close_conn(struct conn *c) {
    if (c->fd >= 0) close(c->fd);
    if (c->rd) redisReaderFree(c->rd);
    c->fd = -1;
    c->rd = NULL;
}

/* An operation failed on the connection: it is dropped with every idle one
 * (they lead to the same server), the next operations are skipped for the
 * back-off period, and the first trouble of this remote is a warning. */
static void trouble(sj_remote *r, struct conn *c, const char *what) {
    if (c) close_conn(c);
    pthread_mutex_lock(&r->lock);
    r->stats.errors++;
    for (int i = 0; i < r->n_idle; i++) close_conn(&r->idle[i]);
    r->n_idle = 0;
    int ms = r->backoff_ms;
    r->down_until_ns = sj_now_ns() + (int64_t)ms * 1000000;
    r->backoff_ms = ms * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : ms * 2;
    r->in_trouble = true;
    pthread_mutex_unlock(&r->lock);
    if (!atomic_exchange(&r->warned_down, true))
        sj_log_write(r->log, SJ_LOG_WARN,
                     "remote kernel cache %s: %s; using the local cache only, trying again after a back-off "
                     "(1 s doubling to 60 s; further trouble is not logged as a warning)",
                     r->name, what);
    else
        sj_log_write(r->log, SJ_LOG_COMPILE, "remote kernel cache %s: %s; next try in %d ms", r->name, what, ms);
}

static void healthy(sj_remote *r) {
    pthread_mutex_lock(&r->lock);
    bool was = r->in_trouble;
    r->in_trouble = false;
    r->backoff_ms = BACKOFF_FIRST_MS;
    r->down_until_ns = 0;
    pthread_mutex_unlock(&r->lock);
    if (was) sj_log_write(r->log, SJ_LOG_COMPILE, "remote kernel cache %s: reachable again", r->name);
}

static void refused(sj_remote *r, const char *name, const char *why) {
    pthread_mutex_lock(&r->lock);
    r->stats.refused++, r->stats.misses++;
    pthread_mutex_unlock(&r->lock);
    if (!atomic_exchange(&r->warned_refused, true))
        sj_log_write(r->log, SJ_LOG_WARN,
                     "remote kernel cache %s: refused %s: %s; compiled instead (further refusals are not logged)",
                     r->name, name, why);
}

/* -- Connections and commands ----------------------------------------------------- */

/* Milliseconds left before deadline (at least 1 while any is left), or 0. */
static int left_ms(int64_t deadline) {
    int64_t ns = deadline - sj_now_ns();
    if (ns <= 0) return 0;
    int64_t ms = (ns + 999999) / 1000000;
    return ms > 1000000 ? 1000000 : (int)ms;
}

/* Waits for fd to be ready for `events` before deadline: 1 ready, 0 timed
 * out, -1 error. */
static int wait_fd(int fd, short events, int64_t deadline) {
    for (;;) {
        int ms = left_ms(deadline);
        if (ms == 0) return 0;
        struct pollfd p = {fd, events, 0};
        int n = poll(&p, 1, ms);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return -1;
        if (n > 0) return 1;
    }
}

typedef struct op {
    sj_remote *r;
    int64_t deadline;
    char why[200]; /* the failure, for the warning */
    uint64_t in, out;
} op;

/* Send one command and read its reply (redisReply, the caller frees it).
 * NULL with o->why set when the connection failed, timed out or answered
 * garbage; *started tells whether any reply byte came (a reused connection
 * closed by the server gets none: worth one retry on a new one). */
static redisReply *command(op *o, struct conn *c, int argc, const char **argv, const size_t *lens, size_t max_reply,
                           bool *started) {
    *started = false;
    char *cmd = NULL;
    int n = redisFormatCommandArgv(&cmd, argc, argv, lens);
    if (n < 0 || !cmd) {
        snprintf(o->why, sizeof o->why, "out of memory formatting %s", argv[0]);
        return NULL;
    }
    size_t sent = 0;
    while (sent < (size_t)n) {
        ssize_t w = send(c->fd, cmd + sent, (size_t)n - sent, MSG_NOSIGNAL);
        if (w > 0) {
            sent += (size_t)w;
            continue;
        }
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            int k = wait_fd(c->fd, POLLOUT, o->deadline);
            if (k > 0) continue;
            snprintf(o->why, sizeof o->why, k == 0 ? "%s: no progress sending within %d ms" : "%s: poll failed",
                     argv[0], o->r->timeout_ms);
        } else {
            snprintf(o->why, sizeof o->why, "%s: send failed: %s", argv[0], strerror(errno));
        }
        redisFreeCommand(cmd);
        o->out += sent;
        return NULL;
    }
    redisFreeCommand(cmd);
    o->out += sent;
    size_t got = 0;
    char buf[65536];
    for (;;) {
        void *reply = NULL;
        if (redisReaderGetReply(c->rd, &reply) != REDIS_OK) {
            snprintf(o->why, sizeof o->why, "%s: garbage reply (%s)", argv[0], c->rd->errstr);
            return NULL;
        }
        if (reply) return reply;
        int k = wait_fd(c->fd, POLLIN, o->deadline);
        if (k <= 0) {
            snprintf(o->why, sizeof o->why, k == 0 ? "%s: no answer within %d ms" : "%s: poll failed", argv[0],
                     o->r->timeout_ms);
            return NULL;
        }
        ssize_t m = recv(c->fd, buf, sizeof buf, 0);
        if (m < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
        if (m <= 0) {
            snprintf(o->why, sizeof o->why, "%s: %s", argv[0], m == 0 ? "connection closed" : strerror(errno));
            return NULL;
        }
        if (got == 0 && !strchr("$+-:", buf[0])) {
            snprintf(o->why, sizeof o->why, "%s: garbage reply (starts with byte 0x%02x)", argv[0],
                     (unsigned char)buf[0]);
            return NULL;
        }
        if (got == 0 && buf[0] == '$') { /* a bulk reply says its length first: refuse a huge one now */
            unsigned long long promised = 0;
            for (ssize_t i = 1; i < m && buf[i] >= '0' && buf[i] <= '9' && promised < (1ULL << 40); i++)
                promised = promised * 10 + (unsigned)(buf[i] - '0');
            if (promised > max_reply) {
                snprintf(o->why, sizeof o->why, "%s: reply over %zu bytes (%llu promised)", argv[0], max_reply,
                         promised);
                return NULL;
            }
        }
        *started = true;
        got += (size_t)m;
        o->in += (uint64_t)m;
        if (got > max_reply) {
            snprintf(o->why, sizeof o->why, "%s: reply over %zu bytes", argv[0], max_reply);
            return NULL;
        }
        if (redisReaderFeed(c->rd, buf, (size_t)m) != REDIS_OK) {
            snprintf(o->why, sizeof o->why, "%s: out of memory reading the reply", argv[0]);
            return NULL;
        }
    }
}

/* A command whose reply must be +OK. */
static bool command_ok(op *o, struct conn *c, int argc, const char **argv, const size_t *lens) {
    bool started;
    redisReply *rep = command(o, c, argc, argv, lens, SMALL_REPLY_MAX, &started);
    if (!rep) return false;
    bool ok = rep->type == REDIS_REPLY_STATUS && !strcmp(rep->str, "OK");
    if (!ok)
        snprintf(o->why, sizeof o->why, "%s: the server answered %s%.120s", argv[0],
                 rep->type == REDIS_REPLY_ERROR ? "" : "something else than OK ",
                 rep->type == REDIS_REPLY_ERROR || rep->type == REDIS_REPLY_STATUS ? rep->str : "");
    freeReplyObject(rep);
    return ok;
}

/* A new connection, authenticated and on its db, before the deadline. */
static bool connect_conn(op *o, struct conn *c) {
    sj_remote *r = o->r;
    c->rd = NULL;
    c->fd = socket(r->addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (c->fd < 0) {
        snprintf(o->why, sizeof o->why, "cannot create a socket: %s", strerror(errno));
        return false;
    }
    if (connect(c->fd, (const struct sockaddr *)&r->addr, r->addr_len)) {
        if (errno != EINPROGRESS && errno != EAGAIN && errno != EINTR) {
            snprintf(o->why, sizeof o->why, "cannot connect: %s", strerror(errno));
            close_conn(c);
            return false;
        }
        int k = wait_fd(c->fd, POLLOUT, o->deadline), err = 0;
        socklen_t el = sizeof err;
        if (k <= 0 || getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &el) || err) {
            if (k == 0) snprintf(o->why, sizeof o->why, "cannot connect within %d ms", r->timeout_ms);
            else snprintf(o->why, sizeof o->why, "cannot connect: %s", strerror(err ? err : errno));
            close_conn(c);
            return false;
        }
    }
    if (r->addr.ss_family != AF_UNIX) {
        int one = 1;
        setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    }
    if (!(c->rd = redisReaderCreate())) {
        snprintf(o->why, sizeof o->why, "out of memory");
        close_conn(c);
        return false;
    }
    if (r->password) {
        const char *argv[] = {"AUTH", r->password};
        size_t lens[] = {4, strlen(r->password)};
        if (!command_ok(o, c, 2, argv, lens)) {
            close_conn(c);
            return false;
        }
    }
    if (r->db) {
        char db[16];
        snprintf(db, sizeof db, "%d", r->db);
        const char *argv[] = {"SELECT", db};
        size_t lens[] = {6, strlen(db)};
        if (!command_ok(o, c, 2, argv, lens)) {
            close_conn(c);
            return false;
        }
    }
    return true;
}

/* A connection for one operation: an idle one (*reused) or a new one.
 * false: skipped (backing off; o->why empty) or failed (o->why says why). */
static bool take(op *o, struct conn *c, bool *reused) {
    sj_remote *r = o->r;
    *reused = false;
    pthread_mutex_lock(&r->lock);
    if (r->down_until_ns && sj_now_ns() < r->down_until_ns) {
        r->stats.skipped++;
        pthread_mutex_unlock(&r->lock);
        o->why[0] = '\0';
        return false;
    }
    if (r->n_idle > 0) {
        *c = r->idle[--r->n_idle];
        *reused = true;
    }
    pthread_mutex_unlock(&r->lock);
    return *reused || connect_conn(o, c);
}

static void give_back(sj_remote *r, struct conn *c) {
    pthread_mutex_lock(&r->lock);
    if (r->n_idle < POOL_MAX) r->idle[r->n_idle++] = *c;
    else close_conn(c);
    pthread_mutex_unlock(&r->lock);
}

static void finish(op *o) {
    pthread_mutex_lock(&o->r->lock);
    o->r->stats.bytes_in += o->in;
    o->r->stats.bytes_out += o->out;
    pthread_mutex_unlock(&o->r->lock);
}

/* Runs one command on a pooled connection within the operation's deadline,
 * retrying once on a new connection when a reused one was found closed.
 * NULL: skipped or failed (trouble reported), the caller counts a miss. */
static redisReply *run(op *o, int argc, const char **argv, const size_t *lens, size_t max_reply) {
    struct conn c;
    for (int attempt = 0; attempt < 2; attempt++) {
        bool reused, started;
        if (!take(o, &c, &reused)) {
            if (o->why[0]) trouble(o->r, NULL, o->why);
            return NULL;
        }
        redisReply *rep = command(o, &c, argc, argv, lens, max_reply, &started);
        if (rep) {
            /* an error is the server's trouble (NOAUTH, LOADING, ...), except
             * WRONGTYPE: the entry holds something else, refused by the caller */
            if (rep->type == REDIS_REPLY_ERROR && strncmp(rep->str, "WRONGTYPE", 9)) {
                snprintf(o->why, sizeof o->why, "%s: the server answered %.120s", argv[0], rep->str);
                freeReplyObject(rep);
                trouble(o->r, &c, o->why);
                return NULL;
            }
            give_back(o->r, &c);
            healthy(o->r);
            return rep;
        }
        if (reused && !started && left_ms(o->deadline) > 0) {
            close_conn(&c);
            continue;
        }
        trouble(o->r, &c, o->why);
        return NULL;
    }
    return NULL;
}

/* -- Operations ---------------------------------------------------------------------- */

static bool entry_name(char *buf, size_t n, const char *key, const char *ext) {
    if (!sj_cache_valid_name(key, ext)) return false;
    int w = snprintf(buf, n, KEY_PREFIX "%s.%s", key, ext);
    return w > 0 && (size_t)w < n;
}

static void op_start(op *o, sj_remote *r) {
    memset(o, 0, sizeof *o);
    o->r = r;
    o->deadline = sj_now_ns() + (int64_t)r->timeout_ms * 1000000;
}

bool sj_remote_get(sj_remote *r, const char *key, const char *ext, void **data, size_t *len) {
    char name[128];
    if (!r || !data || !len || !entry_name(name, sizeof name, key, ext)) return false;
    op o;
    op_start(&o, r);
    const char *argv[] = {"GET", name};
    size_t lens[] = {3, strlen(name)};
    redisReply *rep = run(&o, 2, argv, lens, HEADER_LEN + SJ_REMOTE_ARTIFACT_MAX + 64);
    finish(&o);
    if (!rep) {
        count(r, &r->stats.misses, 1);
        return false;
    }
    bool ok = false;
    uint8_t want[32];
    if (rep->type == REDIS_REPLY_NIL) {
        count(r, &r->stats.misses, 1);
    } else if (rep->type != REDIS_REPLY_STRING) {
        refused(r, name, "not a string value (another program's key?)");
    } else if (rep->len < HEADER_LEN || memcmp(rep->str, VALUE_MAGIC, MAGIC_LEN)) {
        refused(r, name, "not a shapejit entry (bad header)");
    } else if (sj_cache_digest(r->mac_key, key, ext, rep->str + HEADER_LEN, rep->len - HEADER_LEN, want),
               sodium_memcmp(want, rep->str + MAGIC_LEN, 32)) {
        refused(r, name, "its digest does not match (tampered, corrupt, or written under another key)");
    } else {
        size_t n = rep->len - HEADER_LEN;
        void *buf = malloc(n ? n : 1);
        if (buf) {
            memcpy(buf, rep->str + HEADER_LEN, n);
            *data = buf, *len = n;
            ok = true;
            count(r, &r->stats.hits, 1);
        } else {
            count(r, &r->stats.misses, 1);
        }
    }
    freeReplyObject(rep);
    return ok;
}

void sj_remote_put(sj_remote *r, const char *key, const char *ext, const void *data, size_t len) {
    char name[128];
    if (!r || (!data && len) || len > SJ_REMOTE_ARTIFACT_MAX || !entry_name(name, sizeof name, key, ext)) return;
    uint8_t *value = malloc(HEADER_LEN + len);
    if (!value) return;
    memcpy(value, VALUE_MAGIC, MAGIC_LEN);
    sj_cache_digest(r->mac_key, key, ext, data, len, value + MAGIC_LEN);
    if (len) memcpy(value + HEADER_LEN, data, len);
    op o;
    op_start(&o, r);
    const char *argv[] = {"SET", name, (const char *)value};
    size_t lens[] = {3, strlen(name), HEADER_LEN + len};
    redisReply *rep = run(&o, 3, argv, lens, SMALL_REPLY_MAX);
    finish(&o);
    free(value);
    if (!rep) return;
    if (rep->type == REDIS_REPLY_STATUS && !strcmp(rep->str, "OK")) count(r, &r->stats.stores, 1);
    else trouble(r, NULL, "SET: the server answered something else than OK");
    freeReplyObject(rep);
}

/* -- Lifecycle ------------------------------------------------------------------------- */

sj_status sj_remote_open(const char *url, const char *key, int timeout_ms, const sj_log_sink *log,
                         sj_remote **out) {
    if (!out) return sj_seterr(SJ_EINVAL, "sj_remote_open: out is NULL");
    *out = NULL;
    url_parts u;
    sj_status st = parse_url(url, &u);
    if (st) return st;
    if (!key || !*key)
        return sj_seterr(SJ_EINVAL, "remote cache %s refused: no cache key (cache_key or SHAPEJIT_CACHE_KEY); a "
                                    "Redis server cannot say who wrote an entry, so only entries signed with a "
                                    "key are ever loaded from it",
                         u.is_unix ? u.path : u.host);
    if (timeout_ms <= 0) return sj_seterr(SJ_EINVAL, "sj_remote_open: timeout_ms %d must be positive", timeout_ms);
    sj_remote *r = calloc(1, sizeof *r);
    if (!r) return sj_seterr(SJ_ENOMEM, "sj_remote_open: out of memory");
    if (!sj_cache_mac_key(r->mac_key, key)) {
        free(r);
        return sj_seterr(SJ_EBACKEND, "sj_remote_open: libsodium failed to initialise");
    }
    r->timeout_ms = timeout_ms;
    r->log = log;
    r->db = u.db;
    r->backoff_ms = BACKOFF_FIRST_MS;
    if (u.is_unix) {
        struct sockaddr_un *a = (struct sockaddr_un *)&r->addr;
        a->sun_family = AF_UNIX;
        snprintf(a->sun_path, sizeof a->sun_path, "%s", u.path);
        r->addr_len = sizeof *a;
        snprintf(r->name, sizeof r->name, "unix://%s%s%.0d", u.path, u.db ? "?db=" : "", u.db);
    } else {
        struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV}, *ai = NULL;
        char port[8];
        snprintf(port, sizeof port, "%d", u.port);
        int e = getaddrinfo(u.host, port, &hints, &ai);
        if (e || !ai || ai->ai_addrlen > sizeof r->addr) {
            if (ai) freeaddrinfo(ai);
            sodium_memzero(r->mac_key, sizeof r->mac_key);
            free(r);
            return sj_seterr(SJ_EINVAL, "remote cache: cannot resolve host '%s': %s", u.host,
                             e ? gai_strerror(e) : "no address");
        }
        memcpy(&r->addr, ai->ai_addr, ai->ai_addrlen);
        r->addr_len = ai->ai_addrlen;
        freeaddrinfo(ai);
        snprintf(r->name, sizeof r->name, "redis://%s%s%s:%d/%d", strchr(u.host, ':') ? "[" : "", u.host,
                 strchr(u.host, ':') ? "]" : "", u.port, u.db);
    }
    if (u.has_password && !(r->password = strdup(u.password))) {
        sodium_memzero(r->mac_key, sizeof r->mac_key);
        free(r);
        return sj_seterr(SJ_ENOMEM, "sj_remote_open: out of memory");
    }
    sodium_memzero(u.password, sizeof u.password);
    if (pthread_mutex_init(&r->lock, NULL)) {
        free(r->password);
        sodium_memzero(r->mac_key, sizeof r->mac_key);
        free(r);
        return sj_seterr(SJ_ENOMEM, "sj_remote_open: cannot create a mutex");
    }
    *out = r;
    return SJ_OK;
}

void sj_remote_close(sj_remote *r) {
    if (!r) return;
    for (int i = 0; i < r->n_idle; i++) close_conn(&r->idle[i]);
    pthread_mutex_destroy(&r->lock);
    if (r->password) {
        sodium_memzero(r->password, strlen(r->password));
        free(r->password);
    }
    sodium_memzero(r->mac_key, sizeof r->mac_key);
    free(r);
}

void sj_remote_get_stats(const sj_remote *r, sj_remote_stats *out) {
    if (!out) return;
    memset(out, 0, sizeof *out);
    if (!r) return;
    sj_remote *m = (sj_remote *)r; /* the lock is not part of the logical state */
    pthread_mutex_lock(&m->lock);
    *out = r->stats;
    pthread_mutex_unlock(&m->lock);
}

const char *sj_remote_name(const sj_remote *r) { return r ? r->name : NULL; }
