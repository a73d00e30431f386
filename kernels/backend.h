/* Compiling for a device: the compile request and result of the device
 * table's compiling slots (kernels/device.h), and the compile driver both
 * devices share. CPU (system C compiler + dlopen) and CUDA (NVRTC + the
 * driver API) sit behind the same table; the JIT never calls either
 * directly. compile must be safe to call from several threads at once.
 */
#ifndef SJ_BACKEND_H
#define SJ_BACKEND_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

#include "base/log.h"
#include "jit/shapejit.h"

typedef struct sj_module sj_module; /* a loaded compiled unit, owned by its backend */

/* The most functions one compile request resolves. */
#define SJ_COMPILE_SYMBOLS_MAX 256

typedef struct sj_compile_req {
    const char *source;           /* the whole translation unit */
    size_t source_len;
    const char *const *symbols;   /* functions to resolve after loading */
    int n_symbols;
    const char *tag;              /* names the unit in logs and dumps ("enc.e1.sym") */
    /* Nonzero while the compile should stop as soon as it can (its function
     * is being destroyed): a running compiler process is killed; an NVRTC
     * run is abandoned to finish on its own thread. NULL: never. */
    const atomic_int *cancel;
    /* Priority that rises with the job's age: until this time (sj_now_ns)
     * the compiler may run in the idle scheduling class; a compile still
     * running then is restarted at normal priority (a starved idle compile
     * has made no progress to lose). 0: normal priority from the start.
     * Backends without a compiler process ignore it. */
    int64_t idle_until_ns;
    /* Asks for a quick compile: the unit at a lower optimization that
     * takes less compile time (CUDA: SJ_NVRTC_QUICK_FLAG), under a cache
     * key of its own; a device without one compiles in full. The result
     * says which it got (sj_compile_result.quick); the engine compiles a
     * quick unit again in full and swaps that in. */
    bool quick;
    /* No call waits for this compile (a full compile behind a quick
     * unit): the device may take longer for fewer cores at once (CUDA: one
     * NVRTC program, not split). */
    bool background;
} sj_compile_req;

typedef struct sj_compile_result {
    sj_module *module;    /* NULL on failure; unload it once (shared ones are counted) */
    void *fns[SJ_COMPILE_SYMBOLS_MAX]; /* the resolved symbols, in request order (owned by module) */
    bool from_cache;      /* no compiler run: the persistent cache, or shared */
    bool shared;          /* the same unit was already loaded by this backend: module is that one */
    bool from_remote;     /* from_cache, fetched from the remote cache (kernels/remote.h) */
    bool quick;           /* a quick compile's code (sj_compile_req.quick), from the compiler or the cache */
    double compile_ms;    /* wall time of the compiler run (0 on a cache hit) */
    size_t code_bytes;    /* the loaded unit's size (its artifact's bytes); 0: unknown */
    char key[65];         /* the cache key (hex) */
    char log[2048];       /* compiler diagnostics on failure, truncated */
} sj_compile_result;

/* The table compiles go through: the compiling slots of the one device
 * table (kernels/device.h, which defines it). */
typedef struct sj_backend sj_backend;

/* -- Shared by the backends (kernels/backend.c) -------------------------- */

/* Write len bytes to a new file at path (created with O_EXCL, never through
 * a symlink, mode 0600): 0, or -1 with
 * errno set. */
int sj_backend_write_file(const char *path, const char *data, size_t len);
/* Write all of data to fd; 0, or -1 with errno. */
int sj_backend_write_fd(int fd, const char *data, size_t len);

/* Write a generated source to <dir>/<tag><ext> (a '/' in the tag becomes
 * '_'; dir created as needed). A failure is logged as a warning naming
 * `who`, never returned: dumps are for people. */
void sj_backend_dump(const sj_log_sink *log, const char *who, const char *dir, const char *tag, const char *ext,
                     const char *src, size_t len);

/* Fail a compile: out emptied, `who: tag: what` logged (compile topic),
 * SJ_EBACKEND returned with the same text as the last error. */
sj_status sj_backend_fail(const sj_log_sink *log, const char *who, sj_compile_result *out, const char *tag,
                          const char *what);

/* Check a compile request (source, symbols: SJ_EINVAL naming what is
 * wrong) and copy its source, NUL-terminated, into *src (malloc'd; the
 * caller frees it); *tag is the request's tag, or "unit". */
sj_status sj_backend_take_request(const char *who, const sj_compile_req *req, sj_compile_result *out,
                                  const char **tag, char **src);

/* A compiler log's first line that mentions an error (else its first
 * line); *len its length. */
const char *sj_backend_error_line(const char *log, int *len);

/* -- Units shared in a process (kernels/backend.c) ----------------------------
 *
 * A backend keeps one loaded module per cache key. A compile whose key is
 * loaded already takes a reference to that module instead of running the
 * toolchain or loading the artifact again; one whose key is being compiled
 * by another thread waits for it. Identical units are common: every bucket
 * of a function has the same symbolic kernels, and without a persistent
 * cache each would otherwise be compiled. Thread-safe. */

typedef struct sj_modshare sj_modshare;
typedef struct sj_cache sj_cache;
typedef struct sj_remote sj_remote;

sj_modshare *sj_modshare_create(void); /* NULL when out of memory */
/* Every module must have been released. NULL is a no-op. */
void sj_modshare_destroy(sj_modshare *s);
/* Drop one reference to m: true when the caller must unload it (it was the
 * last, or m was never shared). */
bool sj_modshare_release(sj_modshare *s, sj_module *m);

/* -- The compile driver (kernels/backend.c) ----------------------------------
 *
 * Both backends compile the same way: check and copy the request, derive the
 * cache key from the source and the toolchain, dump the source, then load
 * the cached artifact (the disk cache, then the remote cache), or refuse
 * (test hook, missing tool), or run the toolchain. The backend supplies the
 * steps that differ.
 *
 * The remote cache (kernels/remote.h) is the second level: on a disk miss
 * the artifact is fetched and verified there, stored into the disk cache
 * and loaded from the verified bytes; a fresh compile stored in the disk
 * cache is read back from it (verified) and pushed. Without a disk cache,
 * remote hits are still loaded (with load_bytes) but nothing is pushed. */

typedef struct sj_backend_driver {
    const char *who;              /* "cpu", "cuda" */
    const char *ext;              /* dump file extension: ".c", ".cu" */
    const char *const *key_parts; /* the toolchain's part of the cache key */
    int n_key_parts;
    const sj_log_sink *log;
    const char *dump_dir;         /* NULL: no dumps */
    int test_delay_ms;            /* sleep first (tests: a slow compile) */
    int test_fail;                /* fail every compile (tests) */
    /* Find the unit (loaded already, or cached on disk or remotely) but
     * never compile it: a miss is SJ_OK with out->module NULL. */
    bool lookup_only;
    void *self;                   /* the backend, passed to the steps */
    /* Load the artifact cached under key (out->key) and resolve req's
     * symbols into out: 1 loaded, 0 nothing cached, -1 cached but unusable
     * (out->log says why; it is then compiled afresh). */
    int (*load_cached)(void *self, const sj_compile_req *req, sj_compile_result *out);
    /* Why this backend cannot compile now (a message), or NULL. May be NULL. */
    const char *(*refuse)(void *self, char *buf, size_t n);
    /* Run the toolchain on src, load the result, store it in the cache;
     * note is appended to the success log line. */
    sj_status (*compile_fresh)(void *self, const sj_compile_req *req, const char *src, const char *tag,
                               const char *note, sj_compile_result *out);
    /* Modules shared by key (NULL: none), with the steps sharing needs:
     * resolve req's symbols in a loaded module into out->fns (false with
     * out->log saying why), and unload a module for good. */
    sj_modshare *share;
    sj_cache *cache;       /* the persistent cache (NULL: none): a shared */
    const char *cache_ext; /* unit refreshes its artifact's LRU time */
    sj_remote *remote;     /* the remote cache (NULL: none) */
    /* Load an artifact from verified bytes and resolve req's symbols into
     * out: 1 loaded, -1 unusable (out->log says why). May be NULL: a remote
     * hit is then loaded through the disk cache (load_cached). */
    int (*load_bytes)(void *self, const void *data, size_t len, const sj_compile_req *req, sj_compile_result *out);
    bool (*resolve)(void *self, sj_module *m, const sj_compile_req *req, sj_compile_result *out);
    void (*drop)(void *self, sj_module *m);
} sj_backend_driver;

/* The backend table's compile, driven by d. */
sj_status sj_backend_compile(const sj_backend_driver *d, const sj_compile_req *req, sj_compile_result *out);

#endif /* SJ_BACKEND_H */
