/* One CUDA device (see cuda_dev.h): opening and closing it, binding its
 * context to threads, and the caching allocator.
 *
 * The handle callers see is the public sj_cuda; sj_cuda_open allocates it
 * inside a cuda_dev that adds the allocator's private state, so cuda_dev.h
 * keeps one struct for everyone.
 *
 * -- Allocator -----------------------------------------------------------
 * Sizes are rounded to a class: 512 B granules up to 1 MiB, 2 MiB granules
 * above. A block is either live (in the `live` hash map: pointer -> size and
 * stream, so sj_cuda_free needs no size) or cached (in `pub.cached`, an
 * array sorted by (size, pointer), so a lookup is a binary search for the
 * first block of the request's class followed by a scan up to twice that
 * size: best fit, never more than 2x waste).
 *
 * Stream order: a block freed on stream s carries an event recorded on s at
 * the free. The same stream takes it back at once (its later work queues
 * behind the earlier work); another stream takes it only once cuEventQuery
 * says the event completed, else the scan goes on and may end in a fresh
 * block. Streams are matched by handle: a caller that destroys a stream
 * with frees still pending on it should sj_cuda_release_cached() first, or
 * a new stream given the same handle could take those blocks early.
 *
 * Events (CU_EVENT_DISABLE_TIMING) come from a pool that sj_cuda_open fills
 * with SJ_CUDA_EVENTS_AT_OPEN of them, and go back to it when their block
 * is taken or released; one is created only when the pool is empty.
 *
 * Fresh blocks come from a memory pool of our own (cuMemAllocFromPoolAsync,
 * ordered on the requesting stream, its release threshold at the maximum so
 * that nothing is unmapped behind the cache's back); from cuMemAlloc only
 * where the device has no pools.
 *
 * Why both: cuMemAlloc and cuEventCreate can each stall for tens of
 * milliseconds while other threads keep a stream busy. With eight threads
 * queueing on one stream (bench_cuda w5mt, H200) single calls took 13-74 ms
 * and 16-56 ms; a take from the pool took at most 0.2 ms.
 *
 * Out of memory: synchronize the context, release every cached block (each
 * after its event completed) and retry once; then SJ_ENOMEM naming the
 * bytes.
 *
 * Locks: alloc_lock guards the cached array, the live map, the event pool
 * and the counters. It is held across cuEventQuery (non-blocking) and never
 * across an allocation, cuMemFree or anything that waits.
 *
 * -- Binding --------------------------------------------------------------
 * Each thread remembers (thread-local) the serial number of the device it
 * last bound; a match skips even cuCtxGetCurrent. Serials are never reused,
 * so a device closed and opened again is checked afresh. The cost of the
 * shortcut: a program that makes another context current on a thread that
 * also calls shapejit must not expect shapejit to notice (the primary
 * context of the same device, which cudart uses, is the same context).
 */
#include "kernels/cuda/cuda_dev.h"

#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/error.h"
#include "kernels/cuda/eager_cuda.h"

#define SMALL_LIMIT ((size_t)1 << 20) /* classes up to here are 512 B granules */
#define SMALL_GRAIN ((size_t)512)
#define LARGE_GRAIN ((size_t)2 << 20)
#define WORKSPACE_BYTES ((size_t)32 << 20)
#define MAX_QUERIES 16 /* cuEventQuery calls one lookup may spend */

struct sj_cuda_block {
    CUdeviceptr ptr;
    size_t size;     /* the class it was allocated with */
    CUstream stream; /* freed on */
    CUevent event;   /* recorded on `stream` at the free; NULL: nothing to wait for */
};

typedef struct live_slot {
    CUdeviceptr ptr; /* 0: empty */
    size_t size;
    CUstream stream; /* allocated for */
} live_slot;

typedef struct cuda_dev {
    sj_cuda pub; /* first: the handle callers hold */
    uint64_t serial;
    bool ctx_retained, lock_init;
    /* cached blocks: pub.cached[0 .. n_cached), sorted by (size, ptr) */
    size_t n_cached, cap_cached;
    /* live blocks: open addressing, linear probing, capacity a power of two */
    live_slot *live;
    size_t live_cap, n_live;
    /* idle events */
    CUevent *events;
    size_t n_events, cap_events;
} cuda_dev;

static _Atomic uint64_t next_serial = 1;
static _Thread_local uint64_t bound_serial;

static cuda_dev *dev_of(sj_cuda *c) { return (cuda_dev *)c; }

/* -- Errors ------------------------------------------------------------------ */

sj_status sj_cuda_fail(sj_cuda *c, CUresult r, const char *what) {
    const char *name = NULL, *str = NULL;
    if (c && c->api.GetErrorName && c->api.GetErrorName(r, &name) != CUDA_SUCCESS) name = NULL;
    if (c && c->api.GetErrorString && c->api.GetErrorString(r, &str) != CUDA_SUCCESS) str = NULL;
    char num[32];
    if (!name) {
        snprintf(num, sizeof num, "CUresult %d", (int)r);
        name = num;
    }
    sj_status st = r == CUDA_ERROR_OUT_OF_MEMORY ? SJ_ENOMEM : SJ_EBACKEND;
    return sj_seterr(st, "%s: %s (%s)", what && what[0] ? what : "CUDA", name, str ? str : "no description");
}

/* -- Binding ------------------------------------------------------------------ */

void sj_cuda_bind(sj_cuda *c) {
    if (!c || !c->ctx) return;
    cuda_dev *d = dev_of(c);
    if (bound_serial == d->serial) return;
    CUcontext cur = NULL;
    if (c->api.CtxGetCurrent(&cur) != CUDA_SUCCESS || cur != c->ctx) {
        /* On failure the next driver call reports the problem. */
        if (c->api.CtxSetCurrent(c->ctx) != CUDA_SUCCESS) return;
    }
    bound_serial = d->serial;
}

/* -- Allocator: size classes, the cached array, the live map, events ---------- */

/* The class of a request; 0 if it cannot be represented. */
static size_t size_class(size_t bytes) {
    if (bytes == 0) bytes = 1;
    if (bytes <= SMALL_LIMIT) return (bytes + SMALL_GRAIN - 1) & ~(SMALL_GRAIN - 1);
    if (bytes > SIZE_MAX - LARGE_GRAIN) return 0;
    return (bytes + LARGE_GRAIN - 1) & ~(LARGE_GRAIN - 1);
}

static bool block_less(const sj_cuda_block *a, size_t size, CUdeviceptr ptr) {
    return a->size < size || (a->size == size && a->ptr < ptr);
}

/* The first cached block not less than (size, ptr). */
static size_t cached_lower_bound(const cuda_dev *d, size_t size, CUdeviceptr ptr) {
    size_t lo = 0, hi = d->n_cached;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (block_less(&d->pub.cached[mid], size, ptr)) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* Locked. false on host allocation failure. */
static bool cached_insert(cuda_dev *d, const sj_cuda_block *b) {
    if (d->n_cached == d->cap_cached) {
        size_t cap = d->cap_cached ? d->cap_cached * 2 : 64;
        sj_cuda_block *v = realloc(d->pub.cached, cap * sizeof *v);
        if (!v) return false;
        d->pub.cached = v, d->cap_cached = cap;
    }
    size_t i = cached_lower_bound(d, b->size, b->ptr);
    memmove(&d->pub.cached[i + 1], &d->pub.cached[i], (d->n_cached - i) * sizeof *b);
    d->pub.cached[i] = *b;
    d->n_cached++;
    d->pub.cached_bytes += b->size;
    return true;
}

/* Locked. Best fit for class `cls` on stream s: the smallest cached block of
 * at least cls and at most 2 * cls bytes that s may use now. Removes it into
 * *out and returns true; false when there is none. */
static bool cached_take(cuda_dev *d, size_t cls, CUstream s, sj_cuda_block *out) {
    size_t limit = cls <= SIZE_MAX / 2 ? cls * 2 : SIZE_MAX;
    int queries = 0;
    for (size_t i = cached_lower_bound(d, cls, 0); i < d->n_cached && d->pub.cached[i].size <= limit; i++) {
        sj_cuda_block *b = &d->pub.cached[i];
        bool usable = b->stream == s || !b->event;
        if (!usable && queries < MAX_QUERIES) {
            queries++;
            usable = d->pub.api.EventQuery(b->event) == CUDA_SUCCESS;
        }
        if (!usable) continue;
        *out = *b;
        memmove(b, b + 1, (d->n_cached - i - 1) * sizeof *b);
        d->n_cached--;
        d->pub.cached_bytes -= out->size;
        return true;
    }
    return false;
}

static size_t live_hash(CUdeviceptr p, size_t mask) {
    uint64_t x = (uint64_t)p;
    x ^= x >> 33;
    x *= 0xFF51AFD7ED558CCDull;
    x ^= x >> 29;
    return (size_t)x & mask;
}

/* Locked. The slot of p, or SIZE_MAX. */
static size_t live_find(const cuda_dev *d, CUdeviceptr p) {
    if (!d->live_cap) return SIZE_MAX;
    size_t mask = d->live_cap - 1;
    for (size_t i = live_hash(p, mask);; i = (i + 1) & mask) {
        if (d->live[i].ptr == p) return i;
        if (!d->live[i].ptr) return SIZE_MAX;
    }
}

/* Locked; room must have been reserved. */
static void live_put_slot(live_slot *v, size_t cap, const live_slot *e) {
    size_t mask = cap - 1, i = live_hash(e->ptr, mask);
    while (v[i].ptr) i = (i + 1) & mask;
    v[i] = *e;
}

/* Locked. Room for one more entry at a load of at most 1/2. */
static bool live_reserve(cuda_dev *d) {
    if ((d->n_live + 1) * 2 <= d->live_cap) return true;
    size_t cap = d->live_cap ? d->live_cap * 2 : 64;
    live_slot *v = calloc(cap, sizeof *v);
    if (!v) return false;
    for (size_t i = 0; i < d->live_cap; i++)
        if (d->live[i].ptr) live_put_slot(v, cap, &d->live[i]);
    free(d->live);
    d->live = v, d->live_cap = cap;
    return true;
}

static void live_put(cuda_dev *d, CUdeviceptr p, size_t size, CUstream s) {
    live_slot e = {p, size, s};
    live_put_slot(d->live, d->live_cap, &e);
    d->n_live++;
    d->pub.live_bytes += size;
}

/* Locked. Removes slot i, shifting later entries of its run back. */
static void live_del(cuda_dev *d, size_t i) {
    size_t mask = d->live_cap - 1;
    d->pub.live_bytes -= d->live[i].size;
    d->live[i].ptr = 0;
    d->n_live--;
    for (size_t j = (i + 1) & mask; d->live[j].ptr; j = (j + 1) & mask) {
        size_t k = live_hash(d->live[j].ptr, mask);
        /* The entry at j may move to the hole at i unless its home k lies
         * cyclically in (i, j]. */
        bool stays = i <= j ? (i < k && k <= j) : (i < k || k <= j);
        if (stays) continue;
        d->live[i] = d->live[j];
        d->live[j].ptr = 0;
        i = j;
    }
}

/* Locked. An idle event, or NULL (the caller creates one unlocked). */
static CUevent event_pop(cuda_dev *d) { return d->n_events ? d->events[--d->n_events] : NULL; }

/* Locked. Back to the pool; false when the pool cannot grow (the caller
 * destroys it unlocked). */
static bool event_push(cuda_dev *d, CUevent e) {
    if (d->n_events == d->cap_events) {
        size_t cap = d->cap_events ? d->cap_events * 2 : 16;
        CUevent *v = realloc(d->events, cap * sizeof *v);
        if (!v) return false;
        d->events = v, d->cap_events = cap;
    }
    d->events[d->n_events++] = e;
    return true;
}

static void event_recycle(cuda_dev *d, CUevent e) {
    if (!e) return;
    pthread_mutex_lock(&d->pub.alloc_lock);
    bool kept = event_push(d, e);
    pthread_mutex_unlock(&d->pub.alloc_lock);
    if (!kept) d->pub.api.EventDestroy(e);
}

/* -- Allocator: the entry points ------------------------------------------------ */

/* A block the cache could not give: from the device's pool in s's order
 * (no implicit synchronization), or from cuMemAlloc without one. */
static CUresult fresh_block(sj_cuda *c, CUdeviceptr *p, size_t cls, CUstream s) {
    return c->pool ? c->api.MemAllocFromPoolAsync(p, cls, c->pool, s) : c->api.MemAlloc(p, cls);
}

size_t sj_cuda_block_bytes(size_t bytes) { return size_class(bytes); }

static _Thread_local CUstream capturing; /* the stream this thread is capturing, or NULL */

void sj_cuda_capturing(CUstream s) { capturing = s; }

CUdeviceptr sj_cuda_alloc(sj_cuda *c, size_t bytes, CUstream s) {
    if (!c) {
        sj_seterr(SJ_EINVAL, "sj_cuda_alloc: device is NULL");
        return 0;
    }
    if (s && s == capturing) {
        sj_seterr(SJ_EBACKEND, "cuda: %zu bytes asked for on a stream being captured into a CUDA graph", bytes);
        return 0;
    }
    cuda_dev *d = dev_of(c);
    size_t cls = size_class(bytes);
    if (!cls) {
        sj_seterr(SJ_ENOMEM, "cuda: out of memory: cannot allocate %zu bytes on device %d (too large)", bytes,
                  c->ordinal);
        return 0;
    }
    sj_cuda_bind(c);

    pthread_mutex_lock(&c->alloc_lock);
    if (!live_reserve(d)) {
        pthread_mutex_unlock(&c->alloc_lock);
        sj_seterr(SJ_ENOMEM, "cuda: out of host memory for the allocator's bookkeeping");
        return 0;
    }
    sj_cuda_block b;
    if (cached_take(d, cls, s, &b)) {
        live_put(d, b.ptr, b.size, s);
        c->cache_hits++;
        bool kept = !b.event || event_push(d, b.event);
        pthread_mutex_unlock(&c->alloc_lock);
        if (!kept) c->api.EventDestroy(b.event);
        return b.ptr;
    }
    pthread_mutex_unlock(&c->alloc_lock);

    CUdeviceptr p = 0;
    int64_t t0 = sj_now_ns();
    CUresult r = fresh_block(c, &p, cls, s);
    if (r == CUDA_ERROR_OUT_OF_MEMORY) {
        /* Whatever is in flight may be about to free memory; then give the
         * cache back to the driver and try once more. */
        c->api.CtxSynchronize();
        sj_cuda_release_cached(c);
        p = 0;
        r = fresh_block(c, &p, cls, s);
    }
    if (r != CUDA_SUCCESS) {
        if (r == CUDA_ERROR_OUT_OF_MEMORY) {
            size_t free_b = 0, total_b = 0;
            if (c->api.MemGetInfo(&free_b, &total_b) != CUDA_SUCCESS) free_b = total_b = 0;
            pthread_mutex_lock(&c->alloc_lock);
            size_t live = c->live_bytes;
            pthread_mutex_unlock(&c->alloc_lock);
            sj_seterr(SJ_ENOMEM,
                      "cuda: out of memory: cannot allocate %zu bytes (%zu requested) on device %d (%s): "
                      "%zu bytes free of %zu, %zu live in shapejit's allocator (cache released)",
                      cls, bytes, c->ordinal, c->name, free_b, total_b, live);
        } else {
            char what[128];
            snprintf(what, sizeof what, "cuda: %s of %zu bytes on device %d",
                     c->pool ? "cuMemAllocFromPoolAsync" : "cuMemAlloc", cls, c->ordinal);
            sj_cuda_fail(c, r, what);
        }
        return 0;
    }

    pthread_mutex_lock(&c->alloc_lock);
    bool ok = live_reserve(d);
    if (ok) {
        live_put(d, p, cls, s);
        c->allocs++;
        uint64_t ns = (uint64_t)(sj_now_ns() - t0);
        c->alloc_ns += ns;
        if (ns > c->alloc_ns_max) c->alloc_ns_max = ns;
    }
    pthread_mutex_unlock(&c->alloc_lock);
    if (!ok) {
        c->api.MemFree(p);
        sj_seterr(SJ_ENOMEM, "cuda: out of host memory for the allocator's bookkeeping");
        return 0;
    }
    return p;
}

void sj_cuda_free(sj_cuda *c, CUdeviceptr p, CUstream s) {
    if (!c || !p) return;
    cuda_dev *d = dev_of(c);
    pthread_mutex_lock(&c->alloc_lock);
    size_t i = live_find(d, p);
    if (i == SIZE_MAX) {
        pthread_mutex_unlock(&c->alloc_lock);
        /* A caller's bug (a double free, or memory from elsewhere): keep
         * the allocator intact and leave a message. */
        sj_seterr(SJ_EINVAL, "sj_cuda_free: 0x%llx was not allocated by this device's allocator (or freed twice)",
                  (unsigned long long)p);
        return;
    }
    sj_cuda_block b = {p, d->live[i].size, s, NULL};
    live_del(d, i);
    b.event = event_pop(d);
    pthread_mutex_unlock(&c->alloc_lock);

    sj_cuda_bind(c);
    CUresult r = CUDA_SUCCESS;
    if (!b.event) {
        int64_t t0 = sj_now_ns();
        if ((r = c->api.EventCreate(&b.event, CU_EVENT_DISABLE_TIMING)) != CUDA_SUCCESS) b.event = NULL;
        uint64_t ns = (uint64_t)(sj_now_ns() - t0);
        pthread_mutex_lock(&c->alloc_lock);
        c->events_created += b.event != NULL;
        if (ns > c->event_ns_max) c->event_ns_max = ns;
        pthread_mutex_unlock(&c->alloc_lock);
    }
    if (r == CUDA_SUCCESS) r = c->api.EventRecord(b.event, s);
    if (r != CUDA_SUCCESS) {
        /* No event to order by: wait for s here, so the block is free for
         * any stream. */
        event_recycle(d, b.event);
        b.event = NULL;
        if (c->api.StreamSynchronize(s) != CUDA_SUCCESS) {
            c->api.CtxSynchronize();
            c->api.MemFree(p); /* the context is in trouble: do not cache */
            return;
        }
    }
    pthread_mutex_lock(&c->alloc_lock);
    bool kept = cached_insert(d, &b);
    pthread_mutex_unlock(&c->alloc_lock);
    if (!kept) {
        if (b.event) c->api.EventSynchronize(b.event);
        else c->api.StreamSynchronize(s);
        c->api.MemFree(p);
        event_recycle(d, b.event);
    }
}

void sj_cuda_release_cached(sj_cuda *c) {
    if (!c) return;
    cuda_dev *d = dev_of(c);
    pthread_mutex_lock(&c->alloc_lock);
    sj_cuda_block *v = c->cached;
    size_t n = d->n_cached;
    c->cached = NULL;
    d->n_cached = d->cap_cached = 0;
    c->cached_bytes = 0;
    pthread_mutex_unlock(&c->alloc_lock);
    if (!n) {
        free(v);
        return;
    }
    sj_cuda_bind(c);
    for (size_t i = 0; i < n; i++) {
        /* Work queued before the free may still use the block. */
        if (v[i].event) c->api.EventSynchronize(v[i].event);
        c->api.MemFree(v[i].ptr);
        event_recycle(d, v[i].event);
    }
    free(v);
    if (c->pool) c->api.MemPoolTrimTo(c->pool, 0);
}

/* -- Copies ---------------------------------------------------------------------- */

/* Both copies run on the runtime's stream and wait for it: they see every
 * result queued on c->stream before them (a plain cuMemcpy would not: the
 * stream is non-blocking), and the data is in place when they return. Work
 * on other streams is the caller's to synchronize. */
static sj_status copy(sj_cuda *c, CUdeviceptr dev, void *host, const void *src, size_t bytes, bool to_dev) {
    const char *dir = to_dev ? "sj_cuda_to_device" : "sj_cuda_to_host";
    if (!c) return sj_seterr(SJ_EINVAL, "%s: device is NULL", dir);
    if (!bytes) return SJ_OK;
    if (!dev || (to_dev ? !src : !host)) return sj_seterr(SJ_EINVAL, "%s: NULL pointer for %zu bytes", dir, bytes);
    sj_cuda_bind(c);
    CUresult r = to_dev ? c->api.MemcpyHtoDAsync(dev, src, bytes, c->stream)
                        : c->api.MemcpyDtoHAsync(host, dev, bytes, c->stream);
    if (r == CUDA_SUCCESS) r = c->api.StreamSynchronize(c->stream);
    if (r != CUDA_SUCCESS) {
        char what[96];
        snprintf(what, sizeof what, "%s: copy of %zu bytes", dir, bytes);
        return sj_cuda_fail(c, r, what);
    }
    return SJ_OK;
}

sj_status sj_cuda_to_device(sj_cuda *c, CUdeviceptr dst, const void *src, size_t bytes) {
    return copy(c, dst, NULL, src, bytes, true);
}

sj_status sj_cuda_to_host(sj_cuda *c, void *dst, CUdeviceptr src, size_t bytes) {
    return copy(c, src, dst, NULL, bytes, false);
}

/* -- Open and close ----------------------------------------------------------------- */

/* Releases whatever d holds, in reverse order of sj_cuda_open; works on a
 * partly opened device. Sets no error message. */
static void teardown(cuda_dev *d) {
    sj_cuda *c = &d->pub;
    const sj_cuda_api *a = &c->api;
    if (d->ctx_retained) {
        sj_cuda_bind(c);
        a->CtxSynchronize();
        if (c->eager) sj_cuda_eager_unload(c);
        if (c->lt) a->LtDestroy(c->lt);
        c->lt = NULL;
        sj_cuda_release_cached(c);
        /* Blocks callers never freed: the context may outlive us (it is
         * the device's primary context, shared with cudart), so give them
         * back too. */
        for (size_t i = 0; i < d->live_cap; i++)
            if (d->live[i].ptr) a->MemFree(d->live[i].ptr);
        if (c->pool) a->MemPoolDestroy(c->pool);
        c->pool = NULL;
        for (size_t i = 0; i < d->n_events; i++) a->EventDestroy(d->events[i]);
        d->n_events = 0;
        if (c->capture_stream) a->StreamDestroy(c->capture_stream);
        c->capture_stream = NULL;
        if (c->stream) a->StreamDestroy(c->stream);
        c->stream = NULL;
        a->DevicePrimaryCtxRelease(c->dev);
        d->ctx_retained = false;
    }
    if (bound_serial == d->serial) bound_serial = 0;
    sj_cuda_api_unload(&c->api);
    free(c->cached);
    free(d->live);
    free(d->events);
    if (d->lock_init) {
        pthread_mutex_destroy(&c->alloc_lock);
        pthread_mutex_destroy(&c->capture_lock);
    }
    free(d);
}

void sj_cuda_set_pdl(sj_cuda *c, bool want) {
    c->pdl = want && c->cc_major >= 9 && c->api.LaunchKernelEx;
}

bool sj_cuda_timed_begin(sj_cuda *c, CUstream s, CUfunction f) {
    if (!c->tl || c->tl_n >= c->tl_cap) return false;
    c->tl[c->tl_n].f = f;
    return c->api.EventRecord(c->tl[c->tl_n].e0, s) == CUDA_SUCCESS;
}

void sj_cuda_timed_end(sj_cuda *c, CUstream s) {
    if (c->api.EventRecord(c->tl[c->tl_n].e1, s) == CUDA_SUCCESS) c->tl_n++;
}

sj_status sj_cuda_open(int ordinal, sj_cuda **out) {
    if (!out) return sj_seterr(SJ_EINVAL, "sj_cuda_open: out is NULL");
    *out = NULL;
    cuda_dev *d = calloc(1, sizeof *d);
    if (!d) return sj_seterr(SJ_ENOMEM, "sj_cuda_open: out of memory");
    sj_cuda *c = &d->pub;
    c->ordinal = ordinal;
    d->serial = atomic_fetch_add(&next_serial, 1);
    if (pthread_mutex_init(&c->alloc_lock, NULL)) {
        free(d);
        return sj_seterr(SJ_ENOMEM, "sj_cuda_open: cannot create a mutex");
    }
    if (pthread_mutex_init(&c->capture_lock, NULL)) {
        pthread_mutex_destroy(&c->alloc_lock);
        free(d);
        return sj_seterr(SJ_ENOMEM, "sj_cuda_open: cannot create a mutex");
    }
    d->lock_init = true;

    sj_status st = sj_cuda_api_load(&c->api);
    if (st) {
        char msg[768];
        snprintf(msg, sizeof msg, "%s", sj_last_error());
        teardown(d);
        return sj_seterr(st, "%s", msg);
    }
    const sj_cuda_api *a = &c->api;
    CUresult r = a->Init(0);
    if (r != CUDA_SUCCESS) {
        st = sj_cuda_fail(c, r, r == CUDA_ERROR_NO_DEVICE ? "no CUDA device: cuInit" : "no usable CUDA driver: cuInit");
        if (st == SJ_ENOMEM) st = SJ_EBACKEND;
        goto fail;
    }
    int count = 0;
    if ((r = a->DeviceGetCount(&count)) != CUDA_SUCCESS) {
        st = sj_cuda_fail(c, r, "no CUDA device: cuDeviceGetCount");
        goto fail;
    }
    if (count <= 0) {
        st = sj_seterr(SJ_EBACKEND, "no CUDA device (the driver reports none)");
        goto fail;
    }
    if (ordinal < 0 || ordinal >= count) {
        st = sj_seterr(SJ_EINVAL, "sj_cuda_open: device %d out of range (%d CUDA device%s)", ordinal, count,
                       count == 1 ? "" : "s");
        goto fail;
    }

    /* Properties */
    int l2 = 0;
    size_t mem = 0;
    char what[64];
    snprintf(what, sizeof what, "cuda: device %d properties", ordinal);
    if ((r = a->DeviceGet(&c->dev, ordinal)) != CUDA_SUCCESS ||
        (r = a->DeviceGetName(c->name, (int)sizeof c->name, c->dev)) != CUDA_SUCCESS ||
        (r = a->DeviceGetAttribute(&c->cc_major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, c->dev)) !=
            CUDA_SUCCESS ||
        (r = a->DeviceGetAttribute(&c->cc_minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, c->dev)) !=
            CUDA_SUCCESS ||
        (r = a->DeviceGetAttribute(&c->sm_count, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, c->dev)) !=
            CUDA_SUCCESS ||
        (r = a->DeviceGetAttribute(&l2, CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, c->dev)) != CUDA_SUCCESS ||
        (r = a->DeviceGetAttribute(&c->max_smem_optin, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
                                   c->dev)) != CUDA_SUCCESS ||
        (r = a->DeviceTotalMem(&mem, c->dev)) != CUDA_SUCCESS ||
        (r = a->DriverGetVersion(&c->driver_version)) != CUDA_SUCCESS) {
        st = sj_cuda_fail(c, r, what);
        goto fail;
    }
    c->name[sizeof c->name - 1] = '\0';
    c->l2_bytes = l2 > 0 ? (size_t)l2 : 0;
    c->total_mem = mem;
    nvrtcResult nr = a->nvrtcVersion(&c->nvrtc_major, &c->nvrtc_minor);
    if (nr != NVRTC_SUCCESS) {
        st = sj_seterr(SJ_EBACKEND, "cuda: nvrtcVersion: %s", a->nvrtcGetErrorString(nr));
        goto fail;
    }

    /* Context and stream */
    if ((r = a->DevicePrimaryCtxRetain(&c->ctx, c->dev)) != CUDA_SUCCESS) {
        snprintf(what, sizeof what, "cuda: device %d: cuDevicePrimaryCtxRetain", ordinal);
        st = sj_cuda_fail(c, r, what);
        goto fail;
    }
    d->ctx_retained = true;
    if ((r = a->CtxSetCurrent(c->ctx)) != CUDA_SUCCESS) {
        st = sj_cuda_fail(c, r, "cuda: cuCtxSetCurrent");
        goto fail;
    }
    bound_serial = d->serial;
    if ((r = a->StreamCreate(&c->stream, CU_STREAM_NON_BLOCKING)) != CUDA_SUCCESS) {
        st = sj_cuda_fail(c, r, "cuda: cuStreamCreate");
        goto fail;
    }

    /* A memory pool of our own for fresh blocks, where the device has
     * them (another library may set the device's current pool). */
    int pools = 0;
    if (a->DeviceGetAttribute(&pools, CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, c->dev) == CUDA_SUCCESS && pools) {
        CUmemPoolProps props = {.allocType = CU_MEM_ALLOCATION_TYPE_PINNED,
                                .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = c->ordinal}};
        cuuint64_t keep = UINT64_MAX; /* what the cache holds stays mapped; sj_cuda_release_cached trims */
        if (a->MemPoolCreate(&c->pool, &props) != CUDA_SUCCESS) c->pool = NULL;
        else if (a->MemPoolSetAttribute(c->pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep) != CUDA_SUCCESS) {
            a->MemPoolDestroy(c->pool);
            c->pool = NULL;
        }
    }

    /* The allocator's events, made while nothing else runs. Fewer is no
     * error: a free makes one when the pool is empty. */
    for (int i = 0; i < SJ_CUDA_EVENTS_AT_OPEN; i++) {
        CUevent e;
        if (a->EventCreate(&e, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) break;
        if (!event_push(d, e)) {
            a->EventDestroy(e);
            break;
        }
    }

    /* cuBLASLt (each product takes its workspace from the allocator) */
    cublasStatus_t bs = a->LtCreate(&c->lt);
    if (bs != CUBLAS_STATUS_SUCCESS) {
        c->lt = NULL;
        st = sj_seterr(SJ_EBACKEND, "cuda: cublasLtCreate failed with cuBLAS status %d", (int)bs);
        goto fail;
    }
    c->lt_workspace_bytes = WORKSPACE_BYTES;
    *out = c;
    return SJ_OK;

fail: {
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", sj_last_error());
    teardown(d);
    return sj_seterr(st, "%s", msg);
}
}

void sj_cuda_close(sj_cuda *c) {
    if (!c) return;
    teardown(dev_of(c));
}
