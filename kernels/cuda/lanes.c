/* Lanes: streams for sj_call from several threads at once (exec_cuda.h).
 *
 * sj_call is synchronous and runs on the runtime's stream. When threads
 * call at the same time, one stream serializes their GPU work, and a
 * driver call that waits for the stream to drain (the lazy loading of a
 * cuBLASLt kernel never run before) waits behind every other thread's
 * work: w5mt on an H200 served 1000 requests in 0.075 s this way with
 * requests of 30-60 ms, against 0.022 s and none over 0.6 ms with a stream
 * per thread. So a call that finds another in flight runs on a lane: a
 * stream of the runtime's own, made to wait (an event) for what was queued
 * on the runtime's stream before it, so that it still sees the caller's
 * own work there. A call alone runs on the runtime's stream as before, at
 * the cost of one atomic increment and decrement.
 *
 * A thread takes the lane it had last when that one is free (a CUDA
 * graph is kept per stream, and a server's worker reuses its buffers).
 * Lanes are made at runtime creation (LANES_AT_START) while nothing else
 * runs, since making a stream or an event may wait for a busy device;
 * more only when more calls overlap. A lane that cannot be made sends the
 * call to the runtime's stream. The lock guards the lane array and the
 * busy flags and is held for neither a driver call nor a kernel.
 */
#include <pthread.h>
#include <stdlib.h>

#include "base/alloc.h"
#include "base/error.h"
#include "kernels/cuda/exec_cuda.h"

#define LANES_AT_START 8

typedef struct lane {
    CUstream stream;
    CUevent ordered; /* recorded on the runtime's stream when the lane is taken */
    bool busy;
} lane;

struct sj_lanes {
    sj_cuda *cuda;
    _Atomic int inflight; /* sj_calls between sj_lane_take and put */
    _Atomic uint64_t taken; /* calls that ran on a lane */
    pthread_mutex_t lock;
    lane *v;
    int n, cap;
};

/* The lane this thread had last, and whose: a hint, checked before use. */
static _Thread_local const sj_lanes *last_owner;
static _Thread_local int last_lane;

/* A new lane (unlocked). false: the driver said no. */
static bool make_lane(sj_cuda *cu, lane *l) {
    sj_cuda_bind(cu);
    *l = (lane){0};
    if (cu->api.StreamCreate(&l->stream, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) return false;
    if (cu->api.EventCreate(&l->ordered, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) {
        cu->api.StreamDestroy(l->stream);
        return false;
    }
    return true;
}

/* Locked. Append l; false when the array cannot grow. */
static bool add_lane(sj_lanes *L, const lane *l) {
    if (L->n == L->cap) {
        int cap = L->cap ? L->cap * 2 : LANES_AT_START;
        lane *v = sj_realloc(L->v, sizeof *v * (size_t)cap);
        if (!v) return false;
        L->v = v, L->cap = cap;
    }
    L->v[L->n++] = *l;
    return true;
}

static void drop_lane(sj_cuda *cu, const lane *l) {
    cu->api.EventDestroy(l->ordered);
    cu->api.StreamDestroy(l->stream);
}

sj_status sj_lanes_create(sj_cuda *cuda, sj_lanes **out) {
    sj_lanes *L = sj_calloc(1, sizeof *L);
    if (!L || pthread_mutex_init(&L->lock, NULL)) {
        free(L);
        return sj_seterr(SJ_ENOMEM, "out of memory for the runtime's call streams");
    }
    L->cuda = cuda;
    for (int i = 0; i < LANES_AT_START; i++) { /* fewer is no error: more are made on demand */
        lane l;
        if (!make_lane(cuda, &l)) break;
        if (!add_lane(L, &l)) {
            drop_lane(cuda, &l);
            break;
        }
    }
    *out = L;
    return SJ_OK;
}

void sj_lanes_destroy(sj_lanes *L) {
    if (!L) return;
    sj_cuda_bind(L->cuda);
    /* No call is in flight (sj_runtime_destroy's contract) and each one
     * synchronized its lane; blocks freed on a lane stay cached under its
     * handle, which the device's close releases. */
    for (int i = 0; i < L->n; i++) drop_lane(L->cuda, &L->v[i]);
    pthread_mutex_destroy(&L->lock);
    free(L->v);
    free(L);
}

/* Locked. A free lane, this thread's last one first; -1: none. */
static int pick(sj_lanes *L) {
    if (last_owner == L && last_lane < L->n && !L->v[last_lane].busy) return last_lane;
    for (int i = 0; i < L->n; i++)
        if (!L->v[i].busy) return i;
    return -1;
}

CUstream sj_lane_take(sj_lanes *L, int *which) {
    *which = -1;
    if (atomic_fetch_add(&L->inflight, 1) == 0) return L->cuda->stream; /* alone */
    pthread_mutex_lock(&L->lock);
    int i = pick(L);
    if (i < 0) {
        pthread_mutex_unlock(&L->lock);
        lane l;
        if (!make_lane(L->cuda, &l)) return L->cuda->stream;
        pthread_mutex_lock(&L->lock);
        if (!add_lane(L, &l)) {
            pthread_mutex_unlock(&L->lock);
            drop_lane(L->cuda, &l);
            return L->cuda->stream;
        }
        i = L->n - 1;
    }
    L->v[i].busy = true;
    lane l = L->v[i]; /* the array may move once unlocked */
    pthread_mutex_unlock(&L->lock);
    sj_cuda *cu = L->cuda;
    sj_cuda_bind(cu);
    if (cu->api.EventRecord(l.ordered, cu->stream) != CUDA_SUCCESS ||
        cu->api.StreamWaitEvent(l.stream, l.ordered, 0) != CUDA_SUCCESS) {
        pthread_mutex_lock(&L->lock); /* unordered: the runtime's stream instead */
        L->v[i].busy = false;
        pthread_mutex_unlock(&L->lock);
        return L->cuda->stream;
    }
    last_owner = L, last_lane = i;
    atomic_fetch_add_explicit(&L->taken, 1, memory_order_relaxed);
    *which = i;
    return l.stream;
}

void sj_lane_put(sj_lanes *L, int which) {
    if (which >= 0) {
        pthread_mutex_lock(&L->lock);
        L->v[which].busy = false;
        pthread_mutex_unlock(&L->lock);
    }
    atomic_fetch_sub(&L->inflight, 1);
}

uint64_t sj_lanes_taken(const sj_lanes *L) { return L ? atomic_load_explicit(&L->taken, memory_order_relaxed) : 0; }

void sj_lanes_test_busy(sj_lanes *L, int delta) {
    if (L) atomic_fetch_add(&L->inflight, delta);
}

