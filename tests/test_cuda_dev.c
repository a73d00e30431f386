/* Tests for the CUDA runtime services: kernels/cuda/cuda_api (the loader),
 * cuda_dev (device, binding, caching allocator, copies) and backend_cuda
 * (NVRTC, the persistent cache, CUfunction handles).
 *
 * Without a GPU (no driver, or no device) the program checks what can be
 * checked without one (the loader's message, argument checks), prints
 *   skipped: no CUDA device (<why>)
 * and exits 0. With one, everything runs on device 0:
 *   device properties; binding from fresh threads; error messages;
 *   allocator: size classes, reuse (the cuMemAlloc count stops growing), the
 *   2x rule, stream-ordered reuse across streams (a block freed on a busy
 *   stream is not handed to another stream before its event completes),
 *   out of memory (0, SJ_ENOMEM, a message with the bytes; the allocator
 *   still works), allocation from 8 threads on 4 streams;
 *   copies of random data; a second handle on the same device;
 *   backend: NVRTC compile and launch of two kernels, a compile error with
 *   the NVRTC log, a missing symbol, invalid requests, the persistent cache
 *   (a second backend loads from it; a corrupt and an unloadable artifact
 *   are recompiled), test hooks, dumps, compiles from 4 threads at once;
 *   nvrtc_flags: flags reaching NVRTC, part of the identity and the cache
 *   key, a rejected option (the option list: test_codegen_cuda).
 */
/* clang-format off */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
/* clang-format on */

#include <dlfcn.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "kernels/cache.h"
#include "base/error.h"
#include "jit/runtime.h"
#include "tests/util.h"

#ifndef SJ_WITH_CUDA
int main(void) {
    printf("skipped: no CUDA device (built without CUDA)\n");
    return 0;
}
#else
#include "kernels/cuda/backend_cuda.h"
#include "kernels/cuda/cuda_dev.h"
#include "kernels/cuda/eager_cuda.h"
#include "kernels/cuda/nvrtc.h"
#include "specialize/codegen_cuda.h" /* SJ_CUDA_KERNEL_MARK: the units split */

/* sj_cuda_close calls this when the eager module is loaded (never here).
 * kernels/cuda/eager_cuda.c defines it; this weak stand-in only lets the
 * test link without that file and yields to the real one. */
__attribute__((weak)) void sj_cuda_eager_unload(sj_cuda *c) { (void)c; }

static sj_cuda *dev; /* device 0, open for the device tests */

/* -- Helpers --------------------------------------------------------------- */

typedef tu_fixture fixture; /* its log: the backend's lines */

static int setup(void **state) { return tu_fixture_setup(state, "sjcuda-test"); }
static int teardown(void **state) { return tu_fixture_teardown(state); }

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t rnd(void) { /* splitmix64; main thread only */
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Stats read under the allocator's lock. */
typedef struct astats {
    uint64_t allocs, cache_hits;
    size_t cached_bytes, live_bytes;
} astats;

static astats stats(void) {
    pthread_mutex_lock(&dev->alloc_lock);
    astats s = {dev->allocs, dev->cache_hits, dev->cached_bytes, dev->live_bytes};
    pthread_mutex_unlock(&dev->alloc_lock);
    return s;
}

static bool libcuda_present(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
    if (h) dlclose(h);
    else dlerror();
    return h != NULL;
}

/* -- Without a device ------------------------------------------------------ */

static void test_loader(void **state) {
    (void)state;
    sj_cuda_api api, zero;
    memset(&api, 0xAB, sizeof api);
    memset(&zero, 0, sizeof zero);
    sj_status st = sj_cuda_api_load(&api);
    if (!libcuda_present()) {
        assert_int_equal(st, SJ_EBACKEND);
        assert_non_null(strstr(sj_last_error(), "no CUDA driver"));
        assert_non_null(strstr(sj_last_error(), "libcuda.so.1"));
        assert_memory_equal(&api, &zero, sizeof api); /* nothing stays loaded */
        print_message("loader: %s\n", sj_last_error());
    } else if (st != SJ_OK) {
        /* a driver but no toolkit libraries: the message says which */
        assert_int_equal(st, SJ_EBACKEND);
        assert_true(strstr(sj_last_error(), "NVRTC") || strstr(sj_last_error(), "cuBLASLt"));
        assert_memory_equal(&api, &zero, sizeof api);
        print_message("loader: %s\n", sj_last_error());
    } else {
        assert_non_null(api.h_cuda);
        assert_non_null(api.h_nvrtc);
        assert_non_null(api.h_lt);
#define SJ_X(ret, field, sym, args) assert_non_null((void *)api.field);
        SJ_CUDA_DRIVER_FNS(SJ_X)
        SJ_NVRTC_FNS(SJ_X)
        SJ_CUBLASLT_FNS(SJ_X)
#undef SJ_X
        int maj = 0, min = 0;
        assert_int_equal(api.nvrtcVersion(&maj, &min), NVRTC_SUCCESS);
        assert_true(maj >= 11);
        sj_cuda_api_unload(&api);
        assert_memory_equal(&api, &zero, sizeof api);
    }
    sj_cuda_api_unload(&api); /* twice is harmless */
    assert_int_equal(sj_cuda_api_load(NULL), SJ_EINVAL);
}

static void test_arguments(void **state) {
    (void)state;
    assert_int_equal(sj_cuda_open(0, NULL), SJ_EINVAL);
    sj_cuda_close(NULL);
    sj_clearerr();
    assert_true(sj_cuda_alloc(NULL, 16, NULL) == 0);
    assert_non_null(strstr(sj_last_error(), "NULL"));
    sj_cuda_free(NULL, 0, NULL);
    sj_cuda_release_cached(NULL);
    sj_cuda_bind(NULL);
    char buf[4];
    assert_int_equal(sj_cuda_to_host(NULL, buf, 0, 4), SJ_EINVAL);
    assert_int_equal(sj_cuda_to_device(NULL, 0, buf, 4), SJ_EINVAL);
    /* without a device, sj_cuda_fail still names the code */
    assert_int_equal(sj_cuda_fail(NULL, CUDA_ERROR_OUT_OF_MEMORY, "probe"), SJ_ENOMEM);
    assert_non_null(strstr(sj_last_error(), "probe: "));
    assert_non_null(strstr(sj_last_error(), "2"));
    assert_int_equal(sj_cuda_fail(NULL, CUDA_ERROR_INVALID_VALUE, "probe"), SJ_EBACKEND);
    /* the backend needs an open device */
    sj_backend *b = (sj_backend *)1;
    assert_int_equal(sj_cuda_backend_create(NULL, &b), SJ_EINVAL);
    assert_null(b);
    assert_int_equal(sj_cuda_backend_create(NULL, NULL), SJ_EINVAL);
    sj_cuda closed;
    memset(&closed, 0, sizeof closed);
    sj_cuda_backend_config cfg = {.cuda = &closed};
    assert_int_equal(sj_cuda_backend_create(&cfg, &b), SJ_EINVAL);
    assert_non_null(strstr(sj_last_error(), "not open"));
}

static void test_open_without_driver(void **state) {
    (void)state;
    if (libcuda_present()) {
        print_message("libcuda.so.1 is present: the no-driver message is not checked\n");
        return;
    }
    for (int i = 0; i < 3; i++) { /* repeatable, nothing left behind (ASan) */
        sj_cuda *c = (sj_cuda *)1;
        assert_int_equal(sj_cuda_open(0, &c), SJ_EBACKEND);
        assert_null(c);
        const char *msg = sj_last_error();
        assert_true(!strncmp(msg, "no CUDA driver: libcuda.so.1 not found (", 40));
    }
}

/* -- Device ------------------------------------------------------------------ */

static void test_properties(void **state) {
    (void)state;
    assert_non_null(dev->ctx);
    assert_non_null(dev->stream);
    assert_non_null(dev->lt);
    assert_true(dev->name[0] != '\0');
    assert_true(dev->cc_major >= 7);
    assert_true(dev->cc_minor >= 0 && dev->cc_minor < 10);
    assert_true(dev->sm_count > 0);
    assert_true(dev->l2_bytes > 0);
    assert_true(dev->max_smem_optin >= 48 * 1024);
    assert_true(dev->total_mem >= ((size_t)1 << 30));
    assert_true(dev->driver_version >= 11000);
    assert_true(dev->nvrtc_major >= 11);
    assert_int_equal(dev->lt_workspace_bytes, 32u << 20);
    CUcontext cur = NULL;
    assert_int_equal(dev->api.CtxGetCurrent(&cur), CUDA_SUCCESS);
    assert_ptr_equal(cur, dev->ctx);
    print_message("device 0: %s, cc %d.%d, %d SMs, L2 %zu KiB, smem opt-in %d KiB, %zu MiB, driver %d, nvrtc %d.%d\n",
                  dev->name, dev->cc_major, dev->cc_minor, dev->sm_count, dev->l2_bytes >> 10,
                  dev->max_smem_optin >> 10, dev->total_mem >> 20, dev->driver_version, dev->nvrtc_major,
                  dev->nvrtc_minor);
}

typedef struct bind_job {
    CUcontext before, after, again;
    int copy_ok;
} bind_job;

static void *bind_thread(void *p) {
    bind_job *j = p;
    dev->api.CtxGetCurrent(&j->before);
    sj_cuda_bind(dev);
    dev->api.CtxGetCurrent(&j->after);
    sj_cuda_bind(dev); /* cheap the second time */
    dev->api.CtxGetCurrent(&j->again);
    return NULL;
}

/* A thread that never binds: the allocator and the copies bind for it. */
static void *unbound_thread(void *p) {
    bind_job *j = p;
    CUdeviceptr d = sj_cuda_alloc(dev, 4096, dev->stream);
    unsigned char in[4096], out[4096];
    for (int i = 0; i < 4096; i++) in[i] = (unsigned char)(i * 7);
    j->copy_ok = d && !sj_cuda_to_device(dev, d, in, sizeof in) && !sj_cuda_to_host(dev, out, d, sizeof out) &&
                 !memcmp(in, out, sizeof in);
    sj_cuda_free(dev, d, dev->stream);
    return NULL;
}

static void test_bind_threads(void **state) {
    (void)state;
    bind_job j = {0};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, bind_thread, &j), 0);
    pthread_join(th, NULL);
    assert_null(j.before); /* a fresh thread has no context */
    assert_ptr_equal(j.after, dev->ctx);
    assert_ptr_equal(j.again, dev->ctx);
    memset(&j, 0, sizeof j);
    assert_int_equal(pthread_create(&th, NULL, unbound_thread, &j), 0);
    pthread_join(th, NULL);
    assert_true(j.copy_ok);
}

static void test_fail_messages(void **state) {
    (void)state;
    assert_int_equal(sj_cuda_fail(dev, CUDA_ERROR_OUT_OF_MEMORY, "probe"), SJ_ENOMEM);
    assert_string_equal(sj_last_error(), "probe: CUDA_ERROR_OUT_OF_MEMORY (out of memory)");
    assert_int_equal(sj_cuda_fail(dev, CUDA_ERROR_INVALID_VALUE, "probe"), SJ_EBACKEND);
    assert_non_null(strstr(sj_last_error(), "probe: CUDA_ERROR_INVALID_VALUE ("));
    assert_int_equal(sj_cuda_fail(dev, (CUresult)99999, "probe"), SJ_EBACKEND);
    assert_non_null(strstr(sj_last_error(), "99999"));
}

static void test_second_handle(void **state) {
    (void)state;
    sj_cuda *c2 = NULL;
    assert_int_equal(sj_cuda_open(0, &c2), SJ_OK);
    assert_ptr_equal(c2->ctx, dev->ctx); /* the primary context, shared */
    assert_ptr_not_equal(c2->stream, dev->stream);
    CUdeviceptr p = sj_cuda_alloc(c2, 1000, c2->stream);
    assert_true(p != 0);
    int in = 12345, out = 0;
    assert_int_equal(sj_cuda_to_device(c2, p, &in, sizeof in), SJ_OK);
    assert_int_equal(sj_cuda_to_host(c2, &out, p, sizeof out), SJ_OK);
    assert_int_equal(out, in);
    CUdeviceptr leaked = sj_cuda_alloc(c2, 5000, c2->stream); /* close frees it */
    assert_true(leaked != 0);
    sj_cuda_free(c2, p, c2->stream);
    sj_cuda_close(c2);
    /* the first handle still works */
    p = sj_cuda_alloc(dev, 1000, dev->stream);
    assert_true(p != 0);
    out = 0;
    assert_int_equal(sj_cuda_to_device(dev, p, &in, sizeof in), SJ_OK);
    assert_int_equal(sj_cuda_to_host(dev, &out, p, sizeof out), SJ_OK);
    assert_int_equal(out, in);
    sj_cuda_free(dev, p, dev->stream);
    /* ordinals out of range */
    sj_cuda *c3 = (sj_cuda *)1;
    assert_int_equal(sj_cuda_open(1 << 20, &c3), SJ_EINVAL);
    assert_null(c3);
    assert_non_null(strstr(sj_last_error(), "out of range"));
    assert_int_equal(sj_cuda_open(-1, &c3), SJ_EINVAL);
}

/* -- Allocator ----------------------------------------------------------------- */

static void test_size_classes_and_reuse(void **state) {
    (void)state;
    static const size_t sizes[] = {0,         1,           100,         511,          512,
                                   513,       4096,        65537,       (1u << 20) - 1, 1u << 20,
                                   (1u << 20) + 1, 3u << 20, (5u << 20) + 7};
    static const size_t classes[] = {512,      512,         512,         512,          512,
                                     1024,     4096,        66048,       1u << 20,     1u << 20,
                                     2u << 20, 4u << 20,    6u << 20};
    enum { N = sizeof sizes / sizeof sizes[0] };
    _Static_assert(sizeof classes / sizeof classes[0] == N, "one class per size");
    sj_cuda_release_cached(dev);
    assert_int_equal(stats().cached_bytes, 0);
    unsigned char *host = malloc(6u << 20), *back = malloc(6u << 20);
    assert_non_null(host);
    assert_non_null(back);
    uint64_t allocs_after_first = 0;
    for (int round = 0; round < 4; round++) {
        astats s0 = stats();
        CUdeviceptr p[N];
        for (int i = 0; i < N; i++) {
            size_t live = stats().live_bytes;
            p[i] = sj_cuda_alloc(dev, sizes[i], dev->stream);
            assert_true(p[i] != 0);
            assert_int_equal(stats().live_bytes - live, classes[i]);
            assert_int_equal(p[i] % 256, 0);
            for (int j = 0; j < i; j++) assert_true(p[j] != p[i]);
        }
        for (int i = 0; i < N; i++) {
            size_t n = sizes[i] ? sizes[i] : 1;
            memset(host, (int)(round * 16 + i), n);
            assert_int_equal(sj_cuda_to_device(dev, p[i], host, n), SJ_OK);
        }
        for (int i = 0; i < N; i++) {
            size_t n = sizes[i] ? sizes[i] : 1;
            memset(host, (int)(round * 16 + i), n);
            assert_int_equal(sj_cuda_to_host(dev, back, p[i], n), SJ_OK);
            assert_memory_equal(back, host, n);
        }
        for (int i = 0; i < N; i++) sj_cuda_free(dev, p[i], dev->stream);
        astats s1 = stats();
        assert_int_equal(s1.live_bytes, s0.live_bytes);
        if (round == 0) allocs_after_first = s1.allocs;
        else {
            assert_int_equal(s1.allocs, allocs_after_first); /* warm: no cuMemAlloc */
            assert_int_equal(s1.cache_hits - s0.cache_hits, N);
        }
    }
    free(host);
    free(back);
    sj_cuda_release_cached(dev);
    assert_int_equal(stats().cached_bytes, 0);
}

/* Fresh blocks come from the device's own memory pool, and a free takes
 * its event from the pool that open filled: no event is made until more
 * blocks wait in the cache than open made events. Data written through a
 * pool block reads back. */
static void test_pool_and_events(void **state) {
    (void)state;
    enum { N = SJ_CUDA_EVENTS_AT_OPEN + 8 };
    sj_cuda *c = NULL;
    assert_int_equal(sj_cuda_open(0, &c), SJ_OK);
    int pools = 0;
    assert_int_equal(c->api.DeviceGetAttribute(&pools, CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, c->dev),
                     CUDA_SUCCESS);
    if (pools) assert_non_null(c->pool);
    CUdeviceptr *p = calloc(N, sizeof *p);
    assert_non_null(p);
    for (int round = 0; round < 2; round++) {
        for (int i = 0; i < SJ_CUDA_EVENTS_AT_OPEN; i++) {
            p[i] = sj_cuda_alloc(c, 512 * (size_t)(1 + i % 7), c->stream);
            assert_true(p[i] != 0);
        }
        int v = 1000 + round, back = 0;
        assert_int_equal(sj_cuda_to_device(c, p[5], &v, sizeof v), SJ_OK);
        assert_int_equal(sj_cuda_to_host(c, &back, p[5], sizeof back), SJ_OK);
        assert_int_equal(back, v);
        for (int i = 0; i < SJ_CUDA_EVENTS_AT_OPEN; i++) sj_cuda_free(c, p[i], c->stream);
        /* round 1 takes every block from the cache, its event back to the pool */
        assert_int_equal(c->allocs, SJ_CUDA_EVENTS_AT_OPEN);
        assert_int_equal(c->events_created, 0);
    }
    /* more blocks waiting in the cache than events: the rest are made */
    for (int i = 0; i < N; i++) assert_true((p[i] = sj_cuda_alloc(c, 512 * (size_t)(1 + i % 7), c->stream)) != 0);
    for (int i = 0; i < N; i++) sj_cuda_free(c, p[i], c->stream);
    assert_int_equal(c->events_created, N - SJ_CUDA_EVENTS_AT_OPEN);
    sj_cuda_release_cached(c);
    assert_int_equal(c->cached_bytes, 0);
    free(p);
    sj_cuda_close(c);
}

/* A random mix of sizes, like a server's requests: the cuMemAlloc count
 * stops growing once the cache holds the working set. */
static void test_working_set_converges(void **state) {
    (void)state;
    static const size_t menu[] = {256, 1000, 4096, 10000, 65536, 300000, 1u << 20, (1u << 20) + 4096, 3u << 20,
                                  7u << 20};
    enum { OPS = 4000, SLOTS = 24 };
    astats s0 = stats();
    int quiet_pass = -1;
    for (int pass = 0; pass < 6 && quiet_pass < 0; pass++) {
        rng_state = 42; /* the same sequence every pass */
        CUdeviceptr live[SLOTS] = {0};
        uint64_t before = stats().allocs;
        for (int op = 0; op < OPS; op++) {
            int k = (int)(rnd() % SLOTS);
            if (live[k]) {
                sj_cuda_free(dev, live[k], dev->stream);
                live[k] = 0;
            } else {
                size_t n = menu[rnd() % (sizeof menu / sizeof menu[0])] + rnd() % 512;
                live[k] = sj_cuda_alloc(dev, n, dev->stream);
                assert_true(live[k] != 0);
            }
        }
        for (int k = 0; k < SLOTS; k++) sj_cuda_free(dev, live[k], dev->stream);
        uint64_t grew = stats().allocs - before;
        print_message("working set pass %d: %llu cuMemAlloc calls\n", pass, (unsigned long long)grew);
        if (grew == 0) quiet_pass = pass;
    }
    assert_true(quiet_pass >= 1);
    astats s1 = stats();
    assert_int_equal(s1.live_bytes, s0.live_bytes);
    assert_true(s1.cache_hits - s0.cache_hits >= OPS / 2 / 2);
    sj_cuda_release_cached(dev);
}

/* Best fit, and at most 2x: a cached 4 MiB block serves requests of more
 * than 2 MiB, not a 512-byte or a 1 MiB one. */
static void test_fit_rule(void **state) {
    (void)state;
    sj_cuda_release_cached(dev);
    CUstream s = dev->stream;
    CUdeviceptr big = sj_cuda_alloc(dev, 4u << 20, s);
    assert_true(big != 0);
    sj_cuda_free(dev, big, s);
    astats a = stats();
    assert_int_equal(a.cached_bytes, 4u << 20);
    CUdeviceptr small = sj_cuda_alloc(dev, 512, s);
    assert_true(small != big);
    CUdeviceptr mib = sj_cuda_alloc(dev, 1u << 20, s);
    assert_true(mib != big);
    assert_int_equal(stats().allocs, a.allocs + 2);
    const size_t fits[] = {4u << 20, (2u << 20) + 1, 2u << 20, (3u << 19)};
    for (size_t i = 0; i < sizeof fits / sizeof fits[0]; i++) {
        astats b = stats();
        CUdeviceptr p = sj_cuda_alloc(dev, fits[i], s);
        assert_true(p == big);
        assert_int_equal(stats().cache_hits, b.cache_hits + 1);
        assert_int_equal(stats().live_bytes - b.live_bytes, 4u << 20); /* the block's own size */
        sj_cuda_free(dev, p, s);
    }
    /* an exact class beats a larger block */
    CUdeviceptr two = sj_cuda_alloc(dev, 2u << 20, s); /* takes big (4 MiB) */
    assert_true(two == big);
    CUdeviceptr exact = sj_cuda_alloc(dev, 2u << 20, s); /* fresh 2 MiB */
    sj_cuda_free(dev, two, s);
    sj_cuda_free(dev, exact, s);
    assert_true(sj_cuda_alloc(dev, (3u << 19) + 5, s) == exact);
    sj_cuda_free(dev, exact, s);
    sj_cuda_free(dev, small, s);
    sj_cuda_free(dev, mib, s);
    /* a double free is reported and changes nothing */
    astats c = stats();
    sj_clearerr();
    sj_cuda_free(dev, mib, s);
    assert_non_null(strstr(sj_last_error(), "not allocated"));
    astats d = stats();
    assert_int_equal(c.cached_bytes, d.cached_bytes);
    assert_int_equal(c.live_bytes, d.live_bytes);
    sj_cuda_release_cached(dev);
}

/* Stream order: a block freed on a busy stream A is reused by A at once,
 * but by stream B only after A's work before the free has finished. */
static void test_cross_stream(void **state) {
    (void)state;
    const sj_cuda_api *a = &dev->api;
    sj_cuda_release_cached(dev);
    sj_cuda_bind(dev);
    CUstream A, B;
    assert_int_equal(a->StreamCreate(&A, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    assert_int_equal(a->StreamCreate(&B, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CUevent before;
    assert_int_equal(a->EventCreate(&before, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
    const size_t BIG = (size_t)256 << 20, MB = (size_t)1 << 20;
    unsigned char *host = malloc(MB);
    assert_non_null(host);
    int reused_early = 0, waited = 0;
    for (int trial = 0; trial < 4; trial++) {
        CUdeviceptr big = sj_cuda_alloc(dev, BIG, A);
        CUdeviceptr p = sj_cuda_alloc(dev, MB, A);
        assert_true(big && p);
        /* slow work on A (tens of ms of memsets), then A writes p */
        double t0 = tu_now_ms();
        for (int i = 0; i < 64; i++) assert_int_equal(a->MemsetD8Async(big, (unsigned char)i, BIG, A), CUDA_SUCCESS);
        assert_int_equal(a->MemsetD8Async(p, 0xAA, MB, A), CUDA_SUCCESS);
        assert_int_equal(a->EventRecord(before, A), CUDA_SUCCESS);
        sj_cuda_free(dev, p, A);

        /* the same stream takes it back at once, busy or not */
        CUdeviceptr q = sj_cuda_alloc(dev, MB, A);
        assert_true(q == p);
        reused_early += a->EventQuery(before) == CUDA_ERROR_NOT_READY;
        sj_cuda_free(dev, q, A);

        /* another stream: only once A's work has finished */
        bool pending = a->EventQuery(before) == CUDA_ERROR_NOT_READY;
        CUdeviceptr r = sj_cuda_alloc(dev, MB, B);
        bool done_after = a->EventQuery(before) == CUDA_SUCCESS;
        assert_true(r != 0);
        if (r == p) assert_true(done_after); /* never reused while A was busy */
        if (pending && !done_after) {
            assert_true(r != p);
            waited++;
        }
        /* B's data survives A's work */
        assert_int_equal(a->MemsetD8Async(r, 0x55, MB, B), CUDA_SUCCESS);
        assert_int_equal(a->StreamSynchronize(B), CUDA_SUCCESS);
        assert_int_equal(a->StreamSynchronize(A), CUDA_SUCCESS);
        double ms = tu_now_ms() - t0;
        assert_int_equal(sj_cuda_to_host(dev, host, r, MB), SJ_OK);
        for (size_t i = 0; i < MB; i++)
            if (host[i] != 0x55) fail_msg("byte %zu of the block is 0x%02x, not 0x55", i, host[i]);
        sj_cuda_free(dev, r, B);

        /* A is idle now: B may take A's block */
        astats s = stats();
        CUdeviceptr again = sj_cuda_alloc(dev, MB, B);
        assert_int_equal(stats().allocs, s.allocs);
        assert_true(again == p || again == r);
        sj_cuda_free(dev, again, B);
        sj_cuda_free(dev, big, A);
        if (trial == 0) print_message("cross-stream: A busy for %.1f ms; reused on A while busy: %s; B %s\n", ms,
                                      reused_early ? "yes" : "no",
                                      waited ? "got a fresh block while A was busy" : "found A idle");
    }
    assert_true(waited > 0); /* the slow work really was pending at least once */
    assert_int_equal(a->StreamSynchronize(A), CUDA_SUCCESS);
    assert_int_equal(a->StreamSynchronize(B), CUDA_SUCCESS);
    sj_cuda_release_cached(dev);
    a->EventDestroy(before);
    a->StreamDestroy(A);
    a->StreamDestroy(B);
    free(host);
}

static void test_out_of_memory(void **state) {
    (void)state;
    /* something in the cache, which the failure must give back */
    CUdeviceptr keep[3];
    for (int i = 0; i < 3; i++) assert_true((keep[i] = sj_cuda_alloc(dev, 8u << 20, dev->stream)) != 0);
    for (int i = 0; i < 3; i++) sj_cuda_free(dev, keep[i], dev->stream);
    assert_true(stats().cached_bytes >= (24u << 20));
    astats s0 = stats();
    size_t huge = dev->total_mem * 2 + 12345;
    char want[64];
    snprintf(want, sizeof want, "%zu", huge);
    sj_clearerr();
    assert_true(sj_cuda_alloc(dev, huge, dev->stream) == 0);
    const char *msg = sj_last_error();
    assert_non_null(strstr(msg, "out of memory"));
    assert_non_null(strstr(msg, want));
    print_message("OOM: %s\n", msg);
    astats s1 = stats();
    assert_int_equal(s1.cached_bytes, 0);
    assert_int_equal(s1.live_bytes, s0.live_bytes);
    /* unrepresentable */
    sj_clearerr();
    assert_true(sj_cuda_alloc(dev, SIZE_MAX, dev->stream) == 0);
    assert_non_null(strstr(sj_last_error(), "out of memory"));
    /* still works */
    CUdeviceptr p = sj_cuda_alloc(dev, 1u << 20, dev->stream);
    assert_true(p != 0);
    int in = 7, out = 0;
    assert_int_equal(sj_cuda_to_device(dev, p, &in, sizeof in), SJ_OK);
    assert_int_equal(sj_cuda_to_host(dev, &out, p, sizeof out), SJ_OK);
    assert_int_equal(out, 7);
    sj_cuda_free(dev, p, dev->stream);
}

typedef struct alloc_job {
    int id;
    CUstream stream;
    int bad;       /* wrong bytes seen */
    int failures;  /* failed calls */
} alloc_job;

/* Allocate, fill with this thread's byte on its stream, check, free on the
 * stream without waiting: a block handed to another stream too early would
 * show that stream's byte. */
static void *alloc_thread(void *p) {
    alloc_job *j = p;
    const sj_cuda_api *a = &dev->api;
    uint64_t st = 0x1234567ull * (uint64_t)(j->id + 1);
    unsigned char probe[2];
    for (int it = 0; it < 300; it++) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        size_t n = 512 + (size_t)(st >> 33) % (3u << 20);
        CUdeviceptr d = sj_cuda_alloc(dev, n, j->stream);
        if (!d) {
            j->failures++;
            continue;
        }
        unsigned char v = (unsigned char)(j->id * 16 + it % 16);
        if (a->MemsetD8Async(d, v, n, j->stream) != CUDA_SUCCESS || a->StreamSynchronize(j->stream) != CUDA_SUCCESS ||
            sj_cuda_to_host(dev, &probe[0], d, 1) || sj_cuda_to_host(dev, &probe[1], d + n - 1, 1))
            j->failures++;
        else j->bad += (probe[0] != v) + (probe[1] != v);
        if (a->MemsetD8Async(d, (unsigned char)~v, n, j->stream) != CUDA_SUCCESS) j->failures++;
        sj_cuda_free(dev, d, j->stream); /* with the memset still queued */
    }
    return NULL;
}

static void test_concurrent_alloc(void **state) {
    (void)state;
    enum { T = 8 };
    const sj_cuda_api *a = &dev->api;
    sj_cuda_bind(dev);
    CUstream streams[4] = {dev->stream};
    for (int i = 1; i < 4; i++) assert_int_equal(a->StreamCreate(&streams[i], CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    astats s0 = stats();
    pthread_t th[T];
    alloc_job jobs[T];
    for (int i = 0; i < T; i++) {
        jobs[i] = (alloc_job){i, streams[i % 4], 0, 0};
        assert_int_equal(pthread_create(&th[i], NULL, alloc_thread, &jobs[i]), 0);
    }
    for (int i = 0; i < T; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(jobs[i].failures, 0);
        assert_int_equal(jobs[i].bad, 0);
    }
    astats s1 = stats();
    assert_int_equal(s1.live_bytes, s0.live_bytes);
    print_message("8 threads x 300 allocations on 4 streams: %llu cuMemAlloc, %llu cache hits\n",
                  (unsigned long long)(s1.allocs - s0.allocs), (unsigned long long)(s1.cache_hits - s0.cache_hits));
    for (int i = 1; i < 4; i++) {
        assert_int_equal(a->StreamSynchronize(streams[i]), CUDA_SUCCESS);
    }
    sj_cuda_release_cached(dev);
    for (int i = 1; i < 4; i++) a->StreamDestroy(streams[i]);
}

/* -- Copies ---------------------------------------------------------------------- */

static void test_copies(void **state) {
    (void)state;
    static const size_t sizes[] = {1, 3, 512, 4099, 1u << 20, (3u << 20) + 17};
    rng_state = 7;
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        size_t n = sizes[k];
        unsigned char *in = malloc(n), *out = malloc(n);
        assert_non_null(in);
        assert_non_null(out);
        for (size_t i = 0; i < n; i++) in[i] = (unsigned char)rnd();
        CUdeviceptr d = sj_cuda_alloc(dev, n, dev->stream), e = sj_cuda_alloc(dev, n, dev->stream);
        assert_true(d && e);
        assert_int_equal(sj_cuda_to_device(dev, d, in, n), SJ_OK);
        assert_int_equal(sj_cuda_to_host(dev, out, d, n), SJ_OK);
        assert_memory_equal(in, out, n);
        /* device to device on the stream; the copy back is ordered after it */
        sj_cuda_bind(dev);
        assert_int_equal(dev->api.MemcpyDtoDAsync(e, d, n, dev->stream), CUDA_SUCCESS);
        memset(out, 0, n);
        assert_int_equal(sj_cuda_to_host(dev, out, e, n), SJ_OK);
        assert_memory_equal(in, out, n);
        sj_cuda_free(dev, d, dev->stream);
        sj_cuda_free(dev, e, dev->stream);
        free(in);
        free(out);
    }
    char buf[8];
    assert_int_equal(sj_cuda_to_host(dev, buf, 0, 8), SJ_EINVAL);
    assert_int_equal(sj_cuda_to_device(dev, 0, buf, 8), SJ_EINVAL);
    CUdeviceptr d = sj_cuda_alloc(dev, 8, dev->stream);
    assert_int_equal(sj_cuda_to_host(dev, NULL, d, 8), SJ_EINVAL);
    assert_int_equal(sj_cuda_to_device(dev, d, NULL, 8), SJ_EINVAL);
    assert_int_equal(sj_cuda_to_host(dev, NULL, d, 0), SJ_OK);
    sj_cuda_free(dev, d, dev->stream);
}

/* -- Backend ----------------------------------------------------------------------- */

static const char SRC[] =
    "extern \"C\" __global__ void k_axpb(float *y, const float *x, float a, float b, int n) {\n"
    "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "    if (i < n) y[i] = a * x[i] + b;\n"
    "}\n"
    "extern \"C\" __global__ void k_exp(float *y, const float *x, int n) {\n"
    "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "    if (i < n) y[i] = expf(x[i]);\n"
    "}\n";
static const char *const SYMS[] = {"k_axpb", "k_exp"};

static sj_compile_req req_of(const char *src, const char *tag) {
    return (sj_compile_req){src, strlen(src), SYMS, 2, tag, NULL, 0, false, false};
}

static sj_backend *make(fixture *f, sj_cache *cache) {
    sj_cuda_backend_config cfg = {.cuda = dev, .cache = cache, .log = &f->rt.log};
    sj_backend *b = NULL;
    assert_int_equal(sj_cuda_backend_create(&cfg, &b), SJ_OK);
    assert_non_null(b);
    return b;
}

static CUresult launch(CUfunction fn, int n, void **args) {
    sj_cuda_bind(dev);
    unsigned grid = (unsigned)((n + 255) / 256);
    return dev->api.LaunchKernel(fn, grid, 1, 1, 256, 1, 1, 0, dev->stream, args, NULL);
}

/* Runs k_axpb and k_exp of a result built from SRC; the number of wrong
 * elements (thread-safe: no cmocka asserts). -1 when a call failed. */
static int run_kernels(const sj_compile_result *r) {
    enum { N = 1000 };
    float x[N], y[N];
    for (int i = 0; i < N; i++) x[i] = (float)i / 100.0f - 5.0f;
    CUdeviceptr dx = sj_cuda_alloc(dev, sizeof x, dev->stream), dy = sj_cuda_alloc(dev, sizeof y, dev->stream);
    if (!dx || !dy) return -1;
    int wrong = -1;
    float a = 2.0f, b = 1.0f;
    int n = N;
    void *args0[] = {&dy, &dx, &a, &b, &n};
    void *args1[] = {&dy, &dx, &n};
    if (sj_cuda_to_device(dev, dx, x, sizeof x) || launch((CUfunction)r->fns[0], N, args0) != CUDA_SUCCESS ||
        sj_cuda_to_host(dev, y, dy, sizeof y))
        goto out;
    wrong = 0;
    for (int i = 0; i < N; i++) wrong += fabsf(y[i] - (2.0f * x[i] + 1.0f)) > 1e-5f;
    if (launch((CUfunction)r->fns[1], N, args1) != CUDA_SUCCESS || sj_cuda_to_host(dev, y, dy, sizeof y)) {
        wrong = -1;
        goto out;
    }
    for (int i = 0; i < N; i++) wrong += fabsf(y[i] - expf(x[i])) > 1e-5f * expf(x[i]) + 1e-30f;
out:
    sj_cuda_free(dev, dx, dev->stream);
    sj_cuda_free(dev, dy, dev->stream);
    return wrong;
}

static void expect_kernels(const sj_compile_result *r) { assert_int_equal(run_kernels(r), 0); }

static void test_backend_compile_and_launch(void **state) {
    fixture *f = *state;
    sj_backend *b = make(f, NULL);
    assert_string_equal(b->name, "cuda");
    const char *id = b->identity(b);
    char want[64];
    snprintf(want, sizeof want, "cuda sm_%d%d%s ", dev->cc_major, dev->cc_minor,
             dev->cc_major == 9 && dev->cc_minor == 0 ? "a" : ""); /* Hopper: its own, sm_90a */
    assert_true(!strncmp(id, want, strlen(want)));
    assert_non_null(strstr(id, dev->name));
    assert_non_null(strstr(id, "nvrtc "));
    assert_non_null(strstr(id, "driver "));
    sj_compile_req req = req_of(SRC, "t.e0.static");
    sj_compile_result r;
    tu_compile_fresh(b, &req, &r);
    assert_non_null(r.fns[0]);
    assert_non_null(r.fns[1]);
    assert_int_equal(run_kernels(&r), 0);
    assert_true(tu_logged(&f->log, "cuda: t.e0.static: compiled in"));
    tu_check_second_compile(b, &req, &r, expect_kernels);
    print_message("identity: %s\nNVRTC compile (%zu bytes of CUDA C): %.1f ms\n", id, strlen(SRC), r.compile_ms);
    b->destroy(b);
}

static void test_backend_compile_error(void **state) {
    fixture *f = *state;
    sj_backend *b = make(f, NULL);
    const char *bad = "extern \"C\" __global__ void k_axpb(float *y) { y[0] = undeclared_thing; }\n";
    sj_compile_req req = {bad, strlen(bad), SYMS, 1, "broken", NULL, 0, false, false};
    sj_compile_result r;
    assert_int_equal(b->compile(b, &req, &r), SJ_EBACKEND);
    assert_null(r.module);
    assert_null(r.fns[0]);
    assert_non_null(strstr(r.log, "undeclared_thing"));
    assert_non_null(strstr(r.log, "broken.cu")); /* the program's name in the log */
    assert_non_null(strstr(sj_last_error(), "NVRTC"));
    assert_non_null(strstr(sj_last_error(), "undeclared_thing"));
    assert_true(tu_logged(&f->log, "cuda: broken: NVRTC"));
    print_message("compile error: %s\n", sj_last_error());
    b->destroy(b);
}

static void test_backend_missing_symbol(void **state) {
    fixture *f = *state;
    sj_backend *b = make(f, NULL);
    const char *const syms[] = {"k_axpb", "k_missing"};
    sj_compile_req req = {SRC, strlen(SRC), syms, 2, "nosym", NULL, 0, false, false};
    sj_compile_result r;
    assert_int_equal(b->compile(b, &req, &r), SJ_EBACKEND);
    assert_null(r.module);
    assert_null(r.fns[0]);
    assert_non_null(strstr(r.log, "k_missing"));
    assert_non_null(strstr(sj_last_error(), "k_missing"));
    b->destroy(b);
}

static void test_backend_invalid_requests(void **state) {
    fixture *f = *state;
    sj_backend *b = make(f, NULL);
    tu_check_invalid_requests(b, req_of(SRC, "x"));
    sj_cuda_backend_config cfg = {.cuda = dev, .test_delay_ms = -1};
    sj_backend *nb = (sj_backend *)1;
    assert_int_equal(sj_cuda_backend_create(&cfg, &nb), SJ_EINVAL);
    assert_null(nb);
    /* only source_len counts; no tag is fine */
    char buf[sizeof SRC + 8];
    sj_compile_req req = tu_unterminated(req_of(SRC, NULL), buf);
    sj_compile_result r;
    assert_int_equal(b->compile(b, &req, &r), SJ_OK);
    assert_int_equal(run_kernels(&r), 0);
    b->unload(b, r.module);
    b->destroy(b);
}

static void test_backend_cache(void **state) {
    fixture *f = *state;
    char cdir[PATH_MAX];
    sj_cache *cache = tu_open_cache(f->dir, cdir);
    sj_backend *a = make(f, cache);
    sj_compile_req req = req_of(SRC, "cached");
    sj_compile_result r;
    double cold = tu_compile_timed(a, &req, &r);
    assert_false(r.from_cache);
    a->unload(a, r.module);
    sj_cache_stats s;
    sj_cache_get_stats(cache, &s);
    assert_int_equal(s.stores, 1);
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s.cubin", cdir, r.key);
    assert_int_equal(access(path, F_OK), 0);

    /* a second backend (another process, in effect) */
    sj_backend *b = make(f, cache);
    assert_string_equal(a->identity(a), b->identity(b));
    sj_compile_result r2;
    double warm = tu_compile_cached(b, &req, &r2, r.key);
    assert_int_equal(run_kernels(&r2), 0);
    assert_true(tu_logged(&f->log, "cuda: cached: cache hit"));
    b->unload(b, r2.module);
    sj_cache_get_stats(cache, &s);
    assert_int_equal(s.stores, 1);
    assert_int_equal(s.hits, 1);
    print_message("compile (cold): %.1f ms; load from the cache: %.2f ms\n", cold, warm);
    tu_check_shared_touches_cache(b, cdir, &req, "cubin", expect_kernels);
    a->destroy(a);
    b->destroy(b);
    sj_cache_close(cache);
}

/* A unit in the generator's layout (a prelude, then each kernel after
 * SJ_CUDA_KERNEL_MARK), compiled as two programs at once: both kernels
 * run; the artifact is an image set of two CUBINs; a backend that compiles
 * as one program loads it from the cache (the split is not in the key),
 * and the unit compiled as one program gives the same results. */
static void test_backend_split_units(void **state) {
    fixture *f = *state;
    static const char split_src[] = "static __device__ float sj_twice(float v) { return v + v; }\n"
                                    SJ_CUDA_KERNEL_MARK
                                    "extern \"C\" __global__ void k_axpb(float *y, const float *x, float a, float b, int n) {\n"
                                    "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
                                    "    if (i < n) y[i] = sj_twice(0.5f * a) * x[i] + b;\n"
                                    "}\n"
                                    SJ_CUDA_KERNEL_MARK
                                    "extern \"C\" __global__ void k_exp(float *y, const float *x, int n) {\n"
                                    "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
                                    "    if (i < n) y[i] = expf(x[i]);\n"
                                    "}\n";
    char cdir[PATH_MAX];
    sj_cache *cache = tu_open_cache(f->dir, cdir);
    sj_cuda_backend_config cfg = {.cuda = dev, .cache = cache, .log = &f->rt.log, .nvrtc_threads = 2};
    sj_backend *a = NULL, *b = NULL;
    assert_int_equal(sj_cuda_backend_create(&cfg, &a), SJ_OK);
    sj_compile_req req = req_of(split_src, "split");
    sj_compile_result r;
    assert_int_equal(a->compile(a, &req, &r), SJ_OK);
    assert_false(r.from_cache);
    assert_int_equal(run_kernels(&r), 0);
    assert_true(tu_logged(&f->log, "(2 programs at once"));
    char path[PATH_MAX], head[12] = "";
    snprintf(path, sizeof path, "%s/%s.cubin", cdir, r.key);
    FILE *fp = fopen(path, "rb");
    assert_non_null(fp);
    assert_int_equal(fread(head, 1, sizeof head, fp), sizeof head);
    fclose(fp);
    assert_memory_equal(head, "SJCUIMG1\x02\0\0\0", sizeof head);
    a->unload(a, r.module);

    cfg.nvrtc_threads = 1;
    assert_int_equal(sj_cuda_backend_create(&cfg, &b), SJ_OK);
    assert_string_equal(a->identity(a), b->identity(b));
    sj_compile_result r2;
    assert_int_equal(b->compile(b, &req, &r2), SJ_OK);
    assert_true(r2.from_cache);
    assert_int_equal(run_kernels(&r2), 0);
    b->unload(b, r2.module);
    b->destroy(b);

    cfg.cache = NULL; /* as one program: the same results */
    assert_int_equal(sj_cuda_backend_create(&cfg, &b), SJ_OK);
    assert_int_equal(b->compile(b, &req, &r2), SJ_OK);
    assert_false(r2.from_cache);
    assert_int_equal(run_kernels(&r2), 0);
    assert_true(tu_logged(&f->log, "(1 program at once"));
    b->unload(b, r2.module);
    b->destroy(b);
    a->destroy(a);
    sj_cache_close(cache);
}

static void test_backend_corrupt_cache(void **state) {
    fixture *f = *state;
    char cdir[PATH_MAX];
    sj_cache *cache = tu_open_cache(f->dir, cdir);
    sj_backend *b = make(f, cache);
    sj_compile_req req = req_of(SRC, "corrupt");
    /* a byte of the cached CUBIN flipped: the checksum catches it; then an
     * entry that verifies but is no CUBIN: a miss, recompiled, replaced */
    const char junk[] = "this is not a cubin";
    tu_check_corrupt_cache(b, cache, cdir, &req, "cubin", junk, sizeof junk, &f->log, expect_kernels, true);
    b->destroy(b);
    sj_cache_close(cache);
}

static void test_backend_hooks_and_dump(void **state) {
    fixture *f = *state;
    char dump[PATH_MAX], path[PATH_MAX];
    snprintf(dump, sizeof dump, "%s/dumps/nested", f->dir);
    sj_cache *cache = tu_open_cache(f->dir, NULL);
    sj_cuda_backend_config cfg = {.cuda = dev, .cache = cache, .log = &f->rt.log, .test_fail = 1};
    sj_backend *b;
    assert_int_equal(sj_cuda_backend_create(&cfg, &b), SJ_OK);
    sj_compile_req req = req_of(SRC, "hooked");
    sj_compile_result r;
    tu_check_hook_failure(b, &req, &r);
    b->destroy(b);
    sj_cache_stats s;
    sj_cache_get_stats(cache, &s);
    assert_int_equal(s.stores, 0);

    cfg = (sj_cuda_backend_config){.cuda = dev, .log = &f->rt.log, .test_delay_ms = 100, .dump_dir = dump};
    assert_int_equal(sj_cuda_backend_create(&cfg, &b), SJ_OK);
    req.tag = "enc.e1/sym";
    tu_compile_delayed(b, &req, &r, 100);
    assert_int_equal(run_kernels(&r), 0);
    b->unload(b, r.module);
    b->destroy(b);
    snprintf(path, sizeof path, "%s/enc.e1_sym.cu", dump);
    tu_expect_file(path, SRC, strlen(SRC));
    sj_cache_close(cache);
}

/* nvrtc_flags reach NVRTC (a macro the source needs), show in the
 * identity and key the cache apart; an option NVRTC rejects fails the
 * compile with NVRTC's message, and the backend goes on compiling. */
static void test_backend_nvrtc_flags(void **state) {
    fixture *f = *state;
    sj_cache *cache = tu_open_cache(f->dir, NULL);
    const char *src = "extern \"C\" __global__ void k_flag(float *y, int n) {\n"
                      "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
                      "    if (i < n) y[i] = SJ_TEST_K * (float)i;\n"
                      "}\n";
    const char *const syms[] = {"k_flag"};
    sj_compile_req req = {src, strlen(src), syms, 1, "flags", NULL, 0, false, false};
    sj_compile_result r;
    const char *const ks[] = {"3", "5"};
    char key0[65] = "";
    for (int v = 0; v < 2; v++) {
        char flags[64];
        snprintf(flags, sizeof flags, " -Xptxas=-O2  -DSJ_TEST_K=%s.0f", ks[v]);
        sj_cuda_backend_config cfg = {.cuda = dev, .cache = cache, .log = &f->rt.log, .nvrtc_flags = flags};
        sj_backend *b = NULL;
        assert_int_equal(sj_cuda_backend_create(&cfg, &b), SJ_OK);
        char want[64];
        /* the caller's flags, normalised, after the backend's own (which end
         * with --extra-device-vectorization, or -minimal from NVRTC 12.4) */
        snprintf(want, sizeof want, " -Xptxas=-O2 -DSJ_TEST_K=%s.0f", ks[v]);
        const char *at = strstr(b->identity(b), want);
        assert_non_null(at);
        assert_true(!strncmp(at - 13, "vectorization", 13) || !strncmp(at - 8, "-minimal", 8));
        assert_int_equal(b->compile(b, &req, &r), SJ_OK);
        assert_false(r.from_cache); /* the other flags' CUBIN is not this one */
        if (v) assert_string_not_equal(r.key, key0);
        snprintf(key0, sizeof key0, "%s", r.key);
        enum { N = 300 };
        float y[N];
        int n = N;
        CUdeviceptr dy = sj_cuda_alloc(dev, sizeof y, dev->stream);
        assert_true(dy != 0);
        void *args[] = {&dy, &n};
        assert_int_equal(launch((CUfunction)r.fns[0], N, args), CUDA_SUCCESS);
        assert_int_equal(sj_cuda_to_host(dev, y, dy, sizeof y), SJ_OK);
        sj_cuda_free(dev, dy, dev->stream);
        const float k = v ? 5.0f : 3.0f;
        for (int i = 0; i < N; i++) assert_true(y[i] == k * (float)i);
        b->unload(b, r.module);
        b->destroy(b);
    }

    sj_cuda_backend_config cfg = {.cuda = dev, .cache = cache, .log = &f->rt.log, .nvrtc_flags = "--no-such-option"};
    sj_backend *b = NULL;
    assert_int_equal(sj_cuda_backend_create(&cfg, &b), SJ_OK);
    sj_compile_req good = req_of(SRC, "after_bad_option");
    assert_int_equal(b->compile(b, &good, &r), SJ_EBACKEND);
    assert_null(r.module);
    assert_non_null(strstr(sj_last_error(), "NVRTC"));
    print_message("rejected option: %s\n", sj_last_error());
    b->destroy(b);
    b = make(f, cache); /* and a backend without them compiles it */
    tu_compile_fresh(b, &good, &r);
    assert_int_equal(run_kernels(&r), 0);
    b->unload(b, r.module);
    b->destroy(b);

    cfg.nvrtc_flags = "-DA -DB -DC -DD -DE -DF -DG -DH -DI -DJ -DK -DL -DM -DN -DO -DP -DQ";
    b = (sj_backend *)1;
    assert_int_equal(sj_cuda_backend_create(&cfg, &b), SJ_EINVAL);
    assert_null(b);
    assert_non_null(strstr(sj_last_error(), "sj_cuda_backend_create: nvrtc_flags: more than 16 options"));
    sj_cache_close(cache);
}

/* Quick compiles (sj_compile_req.quick, issue 28): where NVRTC has its fast
 * compile (12.8 on), a quick request gives a unit marked quick, under a key
 * of its own, that runs right, and is not stored in the cache; once the
 * full unit is compiled (and cached), a quick request takes it (marked
 * full), from a new backend too. An NVRTC without it compiles in full. */
static void test_backend_quick(void **state) {
    fixture *f = *state;
    sj_cache *cache = tu_open_cache(f->dir, NULL);
    bool has = dev->nvrtc_major * 100 + dev->nvrtc_minor >= SJ_NVRTC_QUICK_SINCE;
    sj_backend *b = make(f, cache);
    static char src[sizeof SRC + 64]; /* a source no other test cached */
    snprintf(src, sizeof src, "%s// test_backend_quick\n", SRC);
    sj_compile_req q = req_of(src, "quick");
    q.quick = true;
    sj_compile_result r;
    tu_compile_fresh(b, &q, &r);
    assert_int_equal(r.quick, has);
    assert_int_equal(run_kernels(&r), 0);
    char quick_key[65];
    snprintf(quick_key, sizeof quick_key, "%s", r.key);
    b->unload(b, r.module);
    sj_compile_req full = req_of(src, "full");
    tu_compile_fresh(b, &full, &r); /* (the quick unit was not cached: a fresh compile) */
    assert_false(r.quick);
    if (has) assert_string_not_equal(r.key, quick_key);
    char full_key[65];
    snprintf(full_key, sizeof full_key, "%s", r.key);
    b->unload(b, r.module);
    b->destroy(b);
    b = make(f, cache); /* a new process's: the full unit from the cache */
    assert_int_equal(b->compile(b, &q, &r), SJ_OK);
    assert_false(r.quick);
    assert_true(r.from_cache);
    assert_string_equal(r.key, full_key);
    assert_int_equal(run_kernels(&r), 0);
    b->unload(b, r.module);
    b->destroy(b);
    sj_cache_close(cache);
}

static void *compile_thread(void *p) {
    tu_compile_job *j = p;
    char src[1024], tag[32], s0[32], s1[32];
    snprintf(s0, sizeof s0, "k_add_t%d", j->id);
    snprintf(s1, sizeof s1, "k_mul_t%d", j->id);
    snprintf(src, sizeof src,
             "extern \"C\" __global__ void %s(float *y, const float *x, int n) {\n"
             "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
             "    if (i < n) y[i] = x[i] + %d.0f;\n"
             "}\n"
             "extern \"C\" __global__ void %s(float *y, const float *x, int n) {\n"
             "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
             "    if (i < n) y[i] = x[i] * %d.0f;\n"
             "}\n",
             s0, j->id, s1, j->id + 2);
    snprintf(tag, sizeof tag, "thread%d", j->id);
    const char *const syms[] = {s0, s1};
    sj_compile_req req = {src, strlen(src), syms, 2, tag, NULL, 0, false, false};
    sj_compile_result r;
    j->st = j->b->compile(j->b, &req, &r);
    if (j->st) return NULL;
    j->from_cache = r.from_cache;
    enum { N = 300 };
    float x[N], y[N];
    for (int i = 0; i < N; i++) x[i] = (float)i;
    int n = N;
    CUdeviceptr dx = sj_cuda_alloc(dev, sizeof x, dev->stream), dy = sj_cuda_alloc(dev, sizeof y, dev->stream);
    void *args[] = {&dy, &dx, &n};
    j->wrong = -1;
    if (dx && dy && !sj_cuda_to_device(dev, dx, x, sizeof x) && launch((CUfunction)r.fns[0], N, args) == CUDA_SUCCESS &&
        !sj_cuda_to_host(dev, y, dy, sizeof y)) {
        j->wrong = 0;
        for (int i = 0; i < N; i++) j->wrong += y[i] != x[i] + (float)j->id;
        if (launch((CUfunction)r.fns[1], N, args) != CUDA_SUCCESS || sj_cuda_to_host(dev, y, dy, sizeof y))
            j->wrong = -1;
        else
            for (int i = 0; i < N; i++) j->wrong += y[i] != x[i] * (float)(j->id + 2);
    }
    sj_cuda_free(dev, dx, dev->stream);
    sj_cuda_free(dev, dy, dev->stream);
    j->b->unload(j->b, r.module);
    return NULL;
}

static void test_backend_concurrent(void **state) {
    fixture *f = *state;
    sj_cache *cache = tu_open_cache(f->dir, NULL);
    sj_backend *b = make(f, cache);
    tu_check_concurrent_compiles(b, cache, compile_thread, true);
    b->destroy(b);
    sj_cache_close(cache);
}

/* -- Main ---------------------------------------------------------------------------- */

int main(void) {
    const struct CMUnitTest nodev[] = {
        cmocka_unit_test(test_loader),
        cmocka_unit_test(test_arguments),
        cmocka_unit_test(test_open_without_driver),
    };
    sj_status st = sj_cuda_open(0, &dev);
    if (st != SJ_OK) {
        char why[1024];
        snprintf(why, sizeof why, "%s", sj_last_error());
        if (st != SJ_EBACKEND) {
            fprintf(stderr, "sj_cuda_open(0) failed with %s: %s\n", sj_status_name(st), why);
            return 1;
        }
        printf("skipped: no CUDA device (%s)\n", why);
        fflush(stdout);
        return cmocka_run_group_tests_name("cuda without a device", nodev, NULL, NULL) ? 1 : 0;
    }
#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_loader),
        cmocka_unit_test(test_arguments),
        cmocka_unit_test(test_properties),
        cmocka_unit_test(test_bind_threads),
        cmocka_unit_test(test_fail_messages),
        cmocka_unit_test(test_second_handle),
        cmocka_unit_test(test_size_classes_and_reuse),
        cmocka_unit_test(test_working_set_converges),
        cmocka_unit_test(test_pool_and_events),
        cmocka_unit_test(test_fit_rule),
        cmocka_unit_test(test_cross_stream),
        cmocka_unit_test(test_out_of_memory),
        cmocka_unit_test(test_concurrent_alloc),
        cmocka_unit_test(test_copies),
        T(test_backend_compile_and_launch),
        T(test_backend_compile_error),
        T(test_backend_missing_symbol),
        T(test_backend_invalid_requests),
        T(test_backend_cache),
        T(test_backend_split_units),
        T(test_backend_corrupt_cache),
        T(test_backend_hooks_and_dump),
        T(test_backend_concurrent),
        T(test_backend_nvrtc_flags),
        T(test_backend_quick),
    };
    int failed = cmocka_run_group_tests_name("cuda", tests, NULL, NULL);
    sj_cuda_close(dev);
    return failed ? 1 : 0;
}
#endif /* SJ_WITH_CUDA */
