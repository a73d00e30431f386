/* The runtime object and services every module uses: logging and host
 * memory. */
#ifndef SJ_RUNTIME_H
#define SJ_RUNTIME_H

#include <pthread.h>
#include <stdatomic.h>

#include "base/log.h"
#include "jit/shapejit.h"
#include "shapes/bucket.h"

struct sj_backend;
struct sj_cache;
struct sj_remote;
struct sj_compiler;

struct sj_runtime {
    sj_runtime_config cfg;        /* strings point at copies owned here */
    sj_log_sink log;              /* cfg's log_mask, log_fn, log_user */
    sj_backend_kind backend_kind;
    pthread_mutex_t lock;         /* guards fns; never held while calling out */
    struct sj_fn *fns;            /* live functions (for destroy) */
    sj_bucket_rule *bucket_rules; /* parsed cfg.buckets */
    int n_bucket_rules;
    _Atomic int total_entries;    /* entries of all functions (total_recompile_limit) */
    _Atomic int cuda_graphs;      /* CUDA graphs kept, all functions (cfg.cuda_graphs) */
    char *strings[9];             /* copies of cfg's buckets, cache_dir, cc, cflags, dump_dir, nvrtc_flags, cache_key,
                                     remote_cache_url, cc_version */
    struct sj_cache *cache;       /* NULL: no persistent cache */
    struct sj_remote *remote;     /* NULL: no remote cache (kernels/remote.h) */
    struct sj_backend *backend;   /* the device: its one table (kernels/device.h) */
    struct sj_compiler *compiler; /* the background job queue and its workers: compiles, learnings, graph captures */
    char cache_error[256];        /* why the cache could not be opened ("" if fine) */
    float test_skew;              /* sj_runtime_test_wrong_kernels */
    bool test_quick;              /* sj_runtime_test_quick */
};

/* Test hooks (tests only): make every compile sleep delay_ms first, or fail
 * as a compile error. Call before any sj_fn exists. */
void sj_runtime_test_hooks(sj_runtime *rt, int delay_ms, int fail);

/* The runtime's clock in nanoseconds: cfg.clock_ns when set (a test's
 * virtual clock), else CLOCK_MONOTONIC. What it times: compile penalties
 * and the cold drop of queued compiles. NULL rt: the monotonic clock. */
int64_t sj_runtime_now_ns(const sj_runtime *rt);

/* Test hook (tests only): every kernel compiled from now on adds skew to
 * each float value it stores, so its results are wrong (the validated
 * swap must catch it). 0: off. */
void sj_runtime_test_wrong_kernels(sj_runtime *rt, float skew);
/* Tests: with on, a compile asked to be quick yields a unit marked quick
 * whatever the device gives (the CPU, which has no quick compile), so the
 * engine's quick-then-full path runs on it. */
void sj_runtime_test_quick(sj_runtime *rt, bool on);

/* Log a line under `topic` if the runtime's mask enables it (rt may be
 * NULL: nothing). */
#define sj_logf(rt, topic, ...) sj_log_write((rt) ? &(rt)->log : NULL, topic, __VA_ARGS__)

/* Send a structured event (cfg.event_fn), stamped with the runtime's
 * clock; nothing without a callback. */
static inline void sj_emit(const sj_runtime *rt, sj_event ev) {
    if (!rt || !sj_log_wants_events(&rt->log)) return;
    ev.time_ns = sj_runtime_now_ns(rt);
    sj_log_event(&rt->log, &ev);
}

static inline int sj_log_on(const sj_runtime *rt, unsigned topic) {
    return (rt->cfg.log_mask & topic) != 0;
}

/* Host memory through the runtime's allocator hooks. */
void *sj_host_alloc(const sj_runtime *rt, size_t bytes, size_t align);
void sj_host_free(const sj_runtime *rt, void *p);

/* Runtime unlinking of a destroyed function (jit/fn.c). */
void sj_runtime_unlink_fn(sj_runtime *rt, struct sj_fn *fn);

#endif
