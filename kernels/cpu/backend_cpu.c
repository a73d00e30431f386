/* The CPU backend (see backend_cpu.h): generated C is compiled by the system
 * C compiler into a shared object, which is loaded with dlopen.
 *
 * The compiler runs through posix_spawnp (no shell), its stdout and stderr
 * captured through one pipe, in a private temporary directory per compile,
 * so any number of compile workers may run at once. After the create-time
 * probe the backend is immutable: compile shares no mutable state between
 * threads (dlerror is per thread).
 *
 * A compile: key -> cache hit (dlopen + dlsym; any failure is a miss) ->
 * else write k.c, run the compiler, dlopen k.so, resolve the symbols, move
 * k.so into the cache. Loading before storing means no other process can
 * evict or replace the file between our store and our load.
 */
#include "base/alloc.h"
#include "kernels/cpu/backend_cpu.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/error.h"

extern char **environ;

/* On x86-64, gcc and clang tune -march=native for 256-bit vectors even where
 * the core has two 512-bit FMA units: the generated kernels' math (exp, erf,
 * divisions) then runs at half the throughput on those (Intel server cores;
 * on AMD Zen 4 the width makes no difference). */
#if defined(__x86_64__)
#define DEFAULT_VEC " -mprefer-vector-width=512"
#else
#define DEFAULT_VEC ""
#endif
#define DEFAULT_CFLAGS "-O3 -march=native" DEFAULT_VEC " -fPIC -shared -fno-math-errno -fno-trapping-math -std=gnu11 -w"
#define MAX_FLAGS 128
#define MAX_CC_WORDS 16

typedef struct cpu_backend {
    sj_backend base; /* first: the table the JIT sees */
    char *cc, *cflags, *dump_dir;
    char *cc_version;      /* pinned version line (NULL: the probe's) */
    char *flag_text;       /* cflags split in place; flags[] point into it */
    char *flags[MAX_FLAGS];
    int n_flags;
    char *cc_text;         /* cc split in place on blanks (no shell): a command with arguments */
    char *cc_argv[MAX_CC_WORDS];
    int n_cc;
    int timeout_ms;        /* a compiler run is killed past it (0: never) */
    sj_cache *cache;
    sj_remote *remote;     /* the second level under cache (NULL: none) */
    sj_modshare *share;    /* loaded units by key */
    const sj_log_sink *log;
    int test_delay_ms, test_fail;
    bool cc_missing;
    char identity[1024];
} cpu_backend;

struct sj_module {
    void *handle;
    size_t bytes; /* the shared object's size */
};

/* -- Running the compiler -------------------------------------------------- */

typedef struct run_result {
    int spawn_errno; /* nonzero: the program could not be started */
    int exit_code;   /* valid when !signal */
    int signal;
    bool timed_out;  /* killed at the deadline */
    bool cancelled;  /* killed because *cancel was set */
    bool boosted;    /* killed at idle_until_ns: run it again at normal priority */
    size_t out_len;  /* bytes kept in out */
} run_result;

/* How often a running compiler is checked for the deadline and for a
 * cancel while it writes nothing. */
#define POLL_MS 20

/* Runs argv[0] (searched in PATH) with stdin from /dev/null and stdout and
 * stderr into out (truncated to n-1 bytes; the rest is drained), in a
 * process group of its own. Waits for the program's exit, not for the end
 * of its output: a background child that keeps the pipe open does not stall
 * the caller. At timeout_ms (> 0), or as soon as *cancel (may be NULL) is
 * nonzero, the whole group gets SIGKILL. With idle_until_ns in the future
 * the program runs in the idle scheduling class (Linux SCHED_IDLE: only
 * cores nothing else wants), and is killed at that time if still running
 * (r->boosted; the caller runs it again at normal priority). Returns 0 when the child ran and
 * was reaped, -1 otherwise (r->spawn_errno says why). */
static int run_program(char *const argv[], char *out, size_t n, int timeout_ms, const atomic_int *cancel,
                       int64_t idle_until_ns, run_result *r) {
    memset(r, 0, sizeof *r);
    if (n) out[0] = '\0';
    int p[2];
    if (pipe2(p, O_CLOEXEC)) {
        r->spawn_errno = errno;
        return -1;
    }
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t at;
    int err = posix_spawn_file_actions_init(&fa);
    if (err) {
        close(p[0]), close(p[1]);
        r->spawn_errno = err;
        return -1;
    }
    if ((err = posix_spawnattr_init(&at))) {
        posix_spawn_file_actions_destroy(&fa);
        close(p[0]), close(p[1]);
        r->spawn_errno = err;
        return -1;
    }
    /* The child gets default signal handling and an empty mask, whatever
     * the calling worker blocks or ignores, and a process group of its own
     * (pgid = its pid), so that a kill reaches whatever it started. */
    sigset_t none, dflt;
    sigemptyset(&none);
    sigemptyset(&dflt);
    sigaddset(&dflt, SIGPIPE);
    sigaddset(&dflt, SIGCHLD);
    if (!err) err = posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    if (!err) err = posix_spawn_file_actions_adddup2(&fa, p[1], 1);
    if (!err) err = posix_spawn_file_actions_adddup2(&fa, p[1], 2);
    if (!err) err = posix_spawnattr_setsigmask(&at, &none);
    if (!err) err = posix_spawnattr_setsigdefault(&at, &dflt);
    if (!err) err = posix_spawnattr_setpgroup(&at, 0);
    short flags = POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETPGROUP;
    bool idle = false;
#if defined(__linux__) && defined(SCHED_IDLE)
    if (!err && idle_until_ns > sj_now_ns()) {
        struct sched_param sp = {.sched_priority = 0};
        if (!posix_spawnattr_setschedpolicy(&at, SCHED_IDLE) && !posix_spawnattr_setschedparam(&at, &sp)) {
            flags |= POSIX_SPAWN_SETSCHEDULER;
            idle = true;
        }
    }
#endif
    if (!err) err = posix_spawnattr_setflags(&at, flags);
    pid_t pid = -1;
    if (!err) err = posix_spawnp(&pid, argv[0], &fa, &at, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&at);
    close(p[1]);
    if (err) {
        close(p[0]);
        r->spawn_errno = err;
        return -1;
    }
    int fd = p[0];
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    int64_t deadline = timeout_ms > 0 ? sj_now_ns() + (int64_t)timeout_ms * 1000000 : INT64_MAX;
    char drain[4096];
    int status = 0;
    bool reaped = false, lost = false;
    for (;;) {
        /* read what is there */
        while (fd >= 0) {
            size_t room = r->out_len + 1 < n ? n - 1 - r->out_len : 0;
            char *dst = room ? out + r->out_len : drain;
            ssize_t got = read(fd, dst, room ? room : sizeof drain);
            if (got < 0 && errno == EINTR) continue;
            if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
            if (got <= 0) { /* end of output, or an error: stop reading */
                close(fd);
                fd = -1;
                break;
            }
            if (room) r->out_len += (size_t)got;
        }
        if (reaped || lost) break; /* exited: what it left in the pipe is read */
        pid_t w = waitpid(pid, &status, WNOHANG);
        if (w == pid) {
            reaped = true;
            continue; /* one more read of what is buffered, then done */
        }
        if (w < 0 && errno != EINTR) {
            /* ECHILD: the program reaps children itself (SIGCHLD ignored).
             * The status is lost; the caller's next step (dlopen) decides. */
            lost = true;
            continue;
        }
        bool cancel_now = cancel && atomic_load_explicit(cancel, memory_order_relaxed);
        int64_t now = sj_now_ns();
        bool boost = idle && now >= idle_until_ns;
        if (cancel_now || now >= deadline || boost) {
            kill(-pid, SIGKILL);
            kill(pid, SIGKILL); /* in case the group could not be made */
            r->cancelled = cancel_now;
            r->timed_out = !cancel_now && now >= deadline;
            r->boosted = !cancel_now && !r->timed_out;
            while ((w = waitpid(pid, &status, 0)) < 0 && errno == EINTR) {
            }
            reaped = w == pid;
            lost = !reaped;
            break;
        }
        int wait_ms = POLL_MS;
        int64_t next = idle && idle_until_ns < deadline ? idle_until_ns : deadline;
        if (next - now < (int64_t)wait_ms * 1000000) wait_ms = (int)((next - now) / 1000000) + 1;
        if (fd >= 0) {
            struct pollfd pf = {.fd = fd, .events = POLLIN};
            poll(&pf, 1, wait_ms);
        } else {
            struct timespec ts = {0, (long)wait_ms * 1000000};
            nanosleep(&ts, NULL);
        }
    }
    if (fd >= 0) close(fd);
    if (n) out[r->out_len] = '\0';
    if (!reaped) {
        r->exit_code = 0;
        return 0;
    }
    if (WIFSIGNALED(status)) r->signal = WTERMSIG(status);
    else r->exit_code = WEXITSTATUS(status);
    return 0;
}

static bool not_found(const run_result *r, int rc) {
    return (rc && (r->spawn_errno == ENOENT || r->spawn_errno == EACCES || r->spawn_errno == ENOTDIR)) ||
           (!rc && !r->signal && r->exit_code == 127);
}

/* -- Identity ------------------------------------------------------------- */

/* "model name/hash of the flags line" from /proc/cpuinfo. */
static void cpu_identity(char *buf, size_t n) {
    char model[256] = "unknown", line[8192];
    char key[65] = "";
    FILE *f = fopen("/proc/cpuinfo", "re");
    while (f && fgets(line, sizeof line, f)) {
        char *colon = strchr(line, ':');
        if (!colon) continue;
        char *v = colon + 1 + (colon[1] == ' ');
        v[strcspn(v, "\n")] = '\0';
        if (!strncmp(line, "model name", 10) && !strcmp(model, "unknown")) snprintf(model, sizeof model, "%s", v);
        else if ((!strncmp(line, "flags", 5) || !strncmp(line, "Features", 8)) && !key[0]) {
            const char *parts[] = {v};
            sj_cache_key(key, parts, 1);
        }
    }
    if (f) fclose(f);
    snprintf(buf, n, "%s/%.8s", model, key[0] ? key : "noflags");
}

static void probe(cpu_backend *b) {
    char out[1024];
    char *argv[MAX_CC_WORDS + 2];
    int argc = 0;
    for (int i = 0; i < b->n_cc; i++) argv[argc++] = b->cc_argv[i];
    argv[argc++] = "--version";
    argv[argc] = NULL;
    run_result r;
    int rc = run_program(argv, out, sizeof out, b->timeout_ms, NULL, 0, &r);
    char version[256] = "unknown version";
    if (r.timed_out) {
        snprintf(version, sizeof version, "--version timed out");
        sj_log_write(b->log, SJ_LOG_WARN, "cpu: '%s --version' did not finish in %d ms; killed", b->cc,
                     b->timeout_ms);
    } else if (not_found(&r, rc)) {
        b->cc_missing = true;
        snprintf(version, sizeof version, "not found");
    } else if (!rc && !r.signal && r.exit_code == 0 && out[0]) {
        out[strcspn(out, "\n")] = '\0';
        snprintf(version, sizeof version, "%s", out);
    }
    if (b->cc_version) snprintf(version, sizeof version, "%s", b->cc_version); /* pinned: kernels compiled elsewhere */
    char cpu[320];
    cpu_identity(cpu, sizeof cpu);
    snprintf(b->identity, sizeof b->identity, "%s (%s) %s cpu:%s", b->cc, version, b->cflags, cpu);
}

/* -- Loading ---------------------------------------------------------------- */

/* Resolve every symbol of req in h into out->fns; false with out->log set. */
static bool resolve_in(void *h, const sj_compile_req *req, sj_compile_result *out) {
    for (int i = 0; i < req->n_symbols; i++) {
        dlerror();
        void *f = dlsym(h, req->symbols[i]);
        if (!f) {
            snprintf(out->log, sizeof out->log, "symbol '%s' not found in the compiled unit", req->symbols[i]);
            return false;
        }
        out->fns[i] = f;
    }
    return true;
}

/* dlopen path and resolve every symbol into out. On failure writes why to
 * out->log and returns false with nothing loaded. */
static bool load(const char *path, const sj_compile_req *req, sj_compile_result *out) {
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        snprintf(out->log, sizeof out->log, "dlopen failed: %s", e ? e : "unknown error");
        return false;
    }
    if (!resolve_in(h, req, out)) {
        dlclose(h);
        return false;
    }
    sj_module *m = sj_malloc(sizeof *m);
    if (!m) {
        snprintf(out->log, sizeof out->log, "out of memory");
        dlclose(h);
        return false;
    }
    struct stat sb;
    m->handle = h;
    m->bytes = stat(path, &sb) ? 0 : (size_t)sb.st_size;
    out->module = m;
    out->code_bytes = m->bytes;
    return true;
}

/* -- Compile ----------------------------------------------------------------- */

static sj_status fail(const cpu_backend *b, sj_compile_result *out, const char *tag, const char *what) {
    return sj_backend_fail(b->log, "cpu", out, tag, what);
}


static void remove_tmpdir(const char *dir, const char *sofile) {
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/k.c", dir);
    unlink(p);
    unlink(sofile);
    rmdir(dir);
}

/* Runs the compiler on req in a fresh temporary dir and loads the result. */
static sj_status compile_fresh(void *self, const sj_compile_req *req, const char *src, const char *tag,
                               const char *note, sj_compile_result *out) {
    cpu_backend *b = self;
    const char *tmp = secure_getenv("TMPDIR");
    char dir[PATH_MAX], cfile[PATH_MAX], sofile[PATH_MAX], msg[512];
    if (!tmp || !*tmp) tmp = "/tmp";
    if (snprintf(dir, sizeof dir, "%s/sjcc-XXXXXX", tmp) >= (int)sizeof dir - 8 || !mkdtemp(dir)) {
        snprintf(msg, sizeof msg, "cannot create a temporary directory in %s: %s", tmp, strerror(errno));
        snprintf(out->log, sizeof out->log, "%s", msg);
        return fail(b, out, tag, msg);
    }
    snprintf(cfile, sizeof cfile, "%s/k.c", dir);
    /* a name this process never loaded before (dlopen matches names) */
    static _Atomic unsigned long units;
    snprintf(sofile, sizeof sofile, "%s/k%lu.so", dir, atomic_fetch_add(&units, 1));
    if (sj_backend_write_file(cfile, src, req->source_len)) {
        snprintf(msg, sizeof msg, "cannot write %s: %s", cfile, strerror(errno));
        remove_tmpdir(dir, sofile);
        snprintf(out->log, sizeof out->log, "%s", msg);
        return fail(b, out, tag, msg);
    }

    char *argv[MAX_CC_WORDS + MAX_FLAGS + 8];
    int argc = 0;
    for (int i = 0; i < b->n_cc; i++) argv[argc++] = b->cc_argv[i];
    for (int i = 0; i < b->n_flags; i++) argv[argc++] = b->flags[i];
    argv[argc++] = "-o";
    argv[argc++] = sofile;
    argv[argc++] = cfile;
    argv[argc++] = "-lm";
    argv[argc] = NULL;

    run_result r;
    double t0 = sj_now_ms();
    int rc = run_program(argv, out->log, sizeof out->log, b->timeout_ms, req->cancel, req->idle_until_ns, &r);
    if (r.boosted) { /* starved in the idle class: again, at normal priority, in the time left */
        int left = b->timeout_ms ? b->timeout_ms - (int)(sj_now_ms() - t0) : 0;
        sj_log_write(b->log, SJ_LOG_COMPILE, "cpu: %s: compile waited too long in the idle class; rerun at normal priority",
                     tag);
        if (b->timeout_ms && left < 1) left = 1;
        rc = run_program(argv, out->log, sizeof out->log, left, req->cancel, 0, &r);
    }
    out->compile_ms = sj_now_ms() - t0;
    if (r.timed_out || r.cancelled) {
        remove_tmpdir(dir, sofile);
        if (r.timed_out)
            snprintf(msg, sizeof msg, "compile failed: '%s' did not finish in %d ms (compile_timeout_ms); killed",
                     b->cc, b->timeout_ms);
        else
            snprintf(msg, sizeof msg, "compile cancelled: '%s' killed", b->cc);
        snprintf(out->log, sizeof out->log, "%s", msg);
        return fail(b, out, tag, msg);
    }
    if (not_found(&r, rc)) {
        remove_tmpdir(dir, sofile);
        snprintf(msg, sizeof msg, "compiler '%s' not found", b->cc);
        snprintf(out->log, sizeof out->log, "%s", msg);
        return fail(b, out, tag, msg);
    }
    if (rc || r.signal || r.exit_code) {
        remove_tmpdir(dir, sofile);
        if (rc) snprintf(msg, sizeof msg, "compile failed: cannot run '%s': %s", b->cc, strerror(r.spawn_errno));
        else if (r.signal) snprintf(msg, sizeof msg, "compile failed: '%s' killed by signal %d", b->cc, r.signal);
        else {
            int n;
            const char *line = sj_backend_error_line(out->log, &n);
            snprintf(msg, sizeof msg, "compile failed: '%s' exited with %d: %.*s", b->cc, r.exit_code, n, line);
        }
        if (rc || !out->log[0]) snprintf(out->log, sizeof out->log, "%s", msg);
        return fail(b, out, tag, msg);
    }
    if (!load(sofile, req, out)) {
        remove_tmpdir(dir, sofile);
        return fail(b, out, tag, out->log);
    }
    out->log[0] = '\0';
    if (b->cache && sj_cache_store_file(b->cache, out->key, "so", sofile))
        sj_log_write(b->log, SJ_LOG_WARN, "cpu: %s: not cached: %s", tag, sj_last_error());
    remove_tmpdir(dir, sofile);
    sj_log_write(b->log, SJ_LOG_COMPILE, "cpu: %s: compiled in %.1f ms (key %.16s)%s", tag, out->compile_ms, out->key,
            note);
    return SJ_OK;
}

/* -- Driver steps (sj_backend_compile) --------------------------------------- */

/* Loads a cached unit from exactly the bytes the cache verified: they are
 * written to a new file in a fresh private (0700) directory and dlopen'd
 * from there, so no file in the cache directory is opened again (a swap
 * between the check and the load cannot win). The file's name carries a
 * per-process counter: dlopen returns an object already loaded under the
 * same name, so a name is never used twice (a memfd's /proc/self/fd/N
 * would be, once N is reused). */
static bool load_bytes(const void *data, size_t len, const sj_compile_req *req, sj_compile_result *out) {
    static _Atomic unsigned long loads;
    const char *tmp = secure_getenv("TMPDIR");
    char dir[PATH_MAX], path[PATH_MAX];
    if (!tmp || !*tmp) tmp = "/tmp";
    if (snprintf(dir, sizeof dir, "%s/sjld-XXXXXX", tmp) >= (int)sizeof dir - 32 || !mkdtemp(dir)) {
        snprintf(out->log, sizeof out->log, "cannot create a temporary directory in %s: %s", tmp, strerror(errno));
        return false;
    }
    snprintf(path, sizeof path, "%s/%ld-%lu.so", dir, (long)getpid(), atomic_fetch_add(&loads, 1));
    bool ok = !sj_backend_write_file(path, data, len) && load(path, req, out);
    unlink(path);
    rmdir(dir);
    return ok;
}

static int cpu_load_cached(void *self, const sj_compile_req *req, sj_compile_result *out) {
    cpu_backend *b = self;
    void *data = NULL;
    size_t len = 0;
    if (!b->cache || !sj_cache_load(b->cache, out->key, "so", &data, &len)) return 0;
    bool ok = load_bytes(data, len, req, out);
    free(data);
    return ok ? 1 : -1;
}

static int cpu_load_bytes(void *self, const void *data, size_t len, const sj_compile_req *req,
                          sj_compile_result *out) {
    (void)self;
    return load_bytes(data, len, req, out) ? 1 : -1;
}

static const char *cpu_refuse(void *self, char *buf, size_t n) {
    cpu_backend *b = self;
    if (!b->cc_missing) return NULL;
    snprintf(buf, n, "compiler '%s' not found", b->cc);
    return buf;
}

static bool cpu_resolve(void *self, sj_module *m, const sj_compile_req *req, sj_compile_result *out) {
    (void)self;
    out->code_bytes = m->bytes;
    return resolve_in(m->handle, req, out);
}

static void cpu_drop(void *self, sj_module *m) {
    (void)self;
    dlclose(m->handle);
    free(m);
}

static sj_status cpu_compile(sj_backend *base, const sj_compile_req *req, sj_compile_result *out) {
    cpu_backend *b = (cpu_backend *)base;
    const char *key[] = {"cpu", b->identity};
    sj_backend_driver d = {.who = "cpu", .ext = ".c", .key_parts = key, .n_key_parts = 2, .log = b->log,
                           .dump_dir = b->dump_dir, .test_delay_ms = b->test_delay_ms, .test_fail = b->test_fail,
                           .self = b, .load_cached = cpu_load_cached, .refuse = cpu_refuse,
                           .compile_fresh = compile_fresh, .share = b->share, .cache = b->cache, .cache_ext = "so",
                           .remote = b->remote, .load_bytes = cpu_load_bytes, .resolve = cpu_resolve,
                           .drop = cpu_drop};
    return sj_backend_compile(&d, req, out);
}

/* -- Table and lifecycle ----------------------------------------------------- */

static void cpu_unload(sj_backend *base, sj_module *m) {
    cpu_backend *b = (cpu_backend *)base;
    if (m && sj_modshare_release(b->share, m)) cpu_drop(b, m);
}

static const char *cpu_identity_fn(sj_backend *base) { return ((cpu_backend *)base)->identity; }

static void cpu_destroy(sj_backend *base) {
    cpu_backend *b = (cpu_backend *)base;
    if (!b) return;
    free(b->cc);
    free(b->cflags);
    free(b->cc_version);
    free(b->dump_dir);
    free(b->flag_text);
    free(b->cc_text);
    sj_modshare_destroy(b->share);
    free(b);
}

sj_status sj_cpu_backend_create(const sj_cpu_backend_config *cfg, sj_backend **out) {
    if (!out) return sj_seterr(SJ_EINVAL, "sj_cpu_backend_create: out is NULL");
    *out = NULL;
    sj_cpu_backend_config c = {0};
    if (cfg) c = *cfg;
    if (c.timeout_ms < 0) return sj_seterr(SJ_EINVAL, "sj_cpu_backend_create: timeout_ms < 0");
    if (c.test_delay_ms < 0) return sj_seterr(SJ_EINVAL, "sj_cpu_backend_create: test_delay_ms < 0");
    cpu_backend *b = sj_calloc(1, sizeof *b);
    if (!b) return sj_seterr(SJ_ENOMEM, "sj_cpu_backend_create: out of memory");
    b->cc = sj_strdup(c.cc && c.cc[0] ? c.cc : "cc");
    b->cflags = sj_strdup(c.cflags ? c.cflags : DEFAULT_CFLAGS);
    b->cc_version = c.cc_version && c.cc_version[0] ? sj_strdup(c.cc_version) : NULL;
    b->flag_text = b->cflags ? sj_strdup(b->cflags) : NULL;
    b->cc_text = b->cc ? sj_strdup(b->cc) : NULL;
    b->dump_dir = c.dump_dir && c.dump_dir[0] ? sj_strdup(c.dump_dir) : NULL;
    b->share = sj_modshare_create();
    if (!b->cc || !b->cc_text || !b->cflags || !b->flag_text || !b->share || (c.dump_dir && c.dump_dir[0] && !b->dump_dir) ||
        (c.cc_version && c.cc_version[0] && !b->cc_version)) {
        cpu_destroy(&b->base);
        return sj_seterr(SJ_ENOMEM, "sj_cpu_backend_create: out of memory");
    }
    char *save = NULL;
    for (char *w = strtok_r(b->cc_text, " \t\n", &save); w; w = strtok_r(NULL, " \t\n", &save)) {
        if (b->n_cc == MAX_CC_WORDS) {
            cpu_destroy(&b->base);
            return sj_seterr(SJ_EINVAL, "sj_cpu_backend_create: cc has more than %d words", MAX_CC_WORDS);
        }
        b->cc_argv[b->n_cc++] = w;
    }
    if (!b->n_cc) {
        cpu_destroy(&b->base);
        return sj_seterr(SJ_EINVAL, "sj_cpu_backend_create: cc is blank");
    }
    save = NULL;
    for (char *f = strtok_r(b->flag_text, " \t\n", &save); f; f = strtok_r(NULL, " \t\n", &save)) {
        if (b->n_flags == MAX_FLAGS) {
            cpu_destroy(&b->base);
            return sj_seterr(SJ_EINVAL, "sj_cpu_backend_create: more than %d compiler flags", MAX_FLAGS);
        }
        b->flags[b->n_flags++] = f;
    }
    b->cache = c.cache;
    b->remote = c.remote;
    b->log = c.log;
    b->test_delay_ms = c.test_delay_ms;
    b->test_fail = c.test_fail;
    b->timeout_ms = c.timeout_ms;
    b->base.name = "cpu";
    b->base.compile = cpu_compile;
    b->base.unload = cpu_unload;
    b->base.identity = cpu_identity_fn;
    b->base.destroy = cpu_destroy;
    if (c.no_probe) snprintf(b->identity, sizeof b->identity, "%s (not probed: compiles off) %s", b->cc, b->cflags);
    else probe(b);
    if (b->cc_missing)
        sj_log_write(b->log, b->cc_version ? SJ_LOG_PERF : SJ_LOG_WARN,
                     "cpu: compiler '%s' not found; kernels will not be compiled%s", b->cc,
                     b->cc_version ? " (cached ones keyed by cc_version are loaded)" : "");
    *out = &b->base;
    return SJ_OK;
}
