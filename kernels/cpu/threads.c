/* The worker pool behind parallel kernels (see threads.h).
 *
 * One job at a time. A caller that wins the `busy` try-lock publishes the
 * job under `lock` (a new generation), wakes as many workers as there are
 * chunks to share, and then claims chunks itself. Everyone claims chunk
 * indices from one atomic counter; whoever finishes the last chunk wakes the
 * caller, who returns once every chunk is done.
 *
 * Reuse of the job slot: a worker joins a generation under `lock` and
 * counts itself in `active` until it has stopped claiming. The next
 * publisher waits (under `lock`) for `active` to drop to zero before it
 * resets the counters, so a late worker can never claim a chunk of a job it
 * did not read.
 *
 * Workers spin for SJ_WORKER_SPIN_NS after a job (a burst of kernels is
 * common), then sleep on `wake`. No user code runs under any lock.
 *
 * Lock order: busy -> lock. `lock` is never held while running fn.
 */
#include "base/alloc.h"
#include "kernels/cpu/threads.h"

#include "base/clock.h"

#include <assert.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <unistd.h>

#define MAX_THREADS 1024
/* How long a worker polls for the next job before it sleeps. The kernels
 * of one request follow each other with gaps of microseconds to tens of
 * microseconds (eager ops on the calling thread in between); a worker that
 * slept in such a gap must be woken, and when a compiler process holds its
 * core (idle priority) that wake-up is what the request waits on. */
#ifndef SJ_WORKER_SPIN_NS
#define SJ_WORKER_SPIN_NS 50000
#endif
#define CALLER_SPIN 1024 /* polls of the done count before waiting */

typedef struct job {
    sj_range_fn fn;
    void *ctx;
    int64_t n, chunk, n_chunks;
} job;

struct sj_threads {
    int n;               /* threads including the caller */
    int n_workers;       /* n - 1 started workers */
    pthread_t *workers;
    pthread_mutex_t busy; /* held by the caller that owns the current job */
    pthread_mutex_t lock; /* guards job, active, stop; generation is written under it */
    pthread_cond_t wake;  /* workers: a new generation or stop */
    pthread_cond_t done_cv; /* the owner: all chunks done */
    pthread_cond_t idle;  /* a publisher: active reached 0 */
    job job;
    int active;           /* workers that joined the current generation and still claim */
    bool stop;
    _Atomic uint64_t generation;
    _Atomic int64_t next; /* next chunk index to claim */
    _Atomic int64_t done; /* chunks finished */
};

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* -- Running chunks ------------------------------------------------------ */

/* Claims and runs chunks of j until none are left. Returns true if this
 * thread finished the last chunk. */
static bool run_chunks(sj_threads *t, const job *j) {
    bool last = false;
    for (;;) {
        int64_t c = atomic_fetch_add_explicit(&t->next, 1, memory_order_relaxed);
        if (c >= j->n_chunks) break;
        int64_t b = c * j->chunk;
        int64_t e = j->n - b > j->chunk ? b + j->chunk : j->n;
        j->fn(j->ctx, b, e);
        /* release: the chunk's writes are visible to whoever sees the count */
        if (atomic_fetch_add_explicit(&t->done, 1, memory_order_acq_rel) + 1 == j->n_chunks) last = true;
    }
    return last;
}

static void *worker_main(void *arg) {
    sj_threads *t = arg;
    uint64_t seen = 0;
    for (;;) {
        for (int64_t i = 0, t0 = sj_now_ns();; i++) {
            if (atomic_load_explicit(&t->generation, memory_order_relaxed) != seen) break;
            if (i % 32 == 31 && sj_now_ns() - t0 > SJ_WORKER_SPIN_NS) break;
            cpu_relax();
        }
        pthread_mutex_lock(&t->lock);
        while (!t->stop && atomic_load_explicit(&t->generation, memory_order_relaxed) == seen)
            pthread_cond_wait(&t->wake, &t->lock);
        if (t->stop) {
            pthread_mutex_unlock(&t->lock);
            return NULL;
        }
        seen = atomic_load_explicit(&t->generation, memory_order_relaxed);
        job j = t->job;
        t->active++;
        pthread_mutex_unlock(&t->lock);

        bool last = run_chunks(t, &j);

        pthread_mutex_lock(&t->lock);
        if (last) pthread_cond_signal(&t->done_cv);
        if (--t->active == 0) pthread_cond_broadcast(&t->idle);
        pthread_mutex_unlock(&t->lock);
    }
}

/* -- Lifecycle ----------------------------------------------------------- */

static void stop_workers(sj_threads *t, int started) {
    pthread_mutex_lock(&t->lock);
    t->stop = true;
    pthread_cond_broadcast(&t->wake);
    pthread_mutex_unlock(&t->lock);
    for (int i = 0; i < started; i++) pthread_join(t->workers[i], NULL);
}

static void free_pool(sj_threads *t) {
    pthread_cond_destroy(&t->idle);
    pthread_cond_destroy(&t->done_cv);
    pthread_cond_destroy(&t->wake);
    pthread_mutex_destroy(&t->lock);
    pthread_mutex_destroy(&t->busy);
    free(t->workers);
    free(t);
}

sj_threads *sj_threads_create(int n_threads) {
    if (n_threads < 0 || n_threads > MAX_THREADS) return NULL;
    if (n_threads == 0) {
        long cpus = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = cpus < 1 ? 1 : cpus > MAX_THREADS ? MAX_THREADS : (int)cpus;
    }
    sj_threads *t = sj_calloc(1, sizeof *t);
    if (!t) return NULL;
    t->n = n_threads;
    t->n_workers = n_threads - 1;
    if (t->n_workers > 0 && !(t->workers = sj_calloc((size_t)t->n_workers, sizeof *t->workers))) {
        free(t);
        return NULL;
    }
    /* Initialise the sync objects one by one so a failure unwinds exactly. */
    int inited = 0;
    if (!pthread_mutex_init(&t->busy, NULL)) inited++;
    if (inited == 1 && !pthread_mutex_init(&t->lock, NULL)) inited++;
    if (inited == 2 && !pthread_cond_init(&t->wake, NULL)) inited++;
    if (inited == 3 && !pthread_cond_init(&t->done_cv, NULL)) inited++;
    if (inited == 4 && !pthread_cond_init(&t->idle, NULL)) inited++;
    if (inited < 5) {
        if (inited > 3) pthread_cond_destroy(&t->done_cv);
        if (inited > 2) pthread_cond_destroy(&t->wake);
        if (inited > 1) pthread_mutex_destroy(&t->lock);
        if (inited > 0) pthread_mutex_destroy(&t->busy);
        free(t->workers);
        free(t);
        return NULL;
    }
    atomic_init(&t->generation, 0);
    atomic_init(&t->next, 0);
    atomic_init(&t->done, 0);

    /* Workers take no signals: those belong to the embedding program. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int started = 0;
    while (started < t->n_workers && !pthread_create(&t->workers[started], NULL, worker_main, t)) started++;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (started < t->n_workers) {
        stop_workers(t, started);
        free_pool(t);
        return NULL;
    }
    return t;
}

void sj_threads_destroy(sj_threads *t) {
    if (!t) return;
    stop_workers(t, t->n_workers);
    free_pool(t);
}

int sj_threads_count(const sj_threads *t) { return t ? t->n : 1; }

/* -- Parallel for -------------------------------------------------------- */

void sj_threads_parallel_for(sj_threads *t, int64_t n, int64_t min_chunk, sj_range_fn fn, void *ctx) {
    if (n <= 0 || !fn) return;
    if (min_chunk < 1) min_chunk = 1;
    /* Inline when there is nothing to share, or another caller (or this one,
     * from inside fn) holds the pool. */
    if (!t || t->n_workers == 0 || n <= min_chunk || pthread_mutex_trylock(&t->busy)) {
        fn(ctx, 0, n);
        return;
    }
    int64_t chunk = n / ((int64_t)t->n * 4);
    if (chunk < min_chunk) chunk = min_chunk;
    job j = {fn, ctx, n, chunk, n / chunk + (n % chunk != 0)};
    assert(j.n_chunks >= 2);

    pthread_mutex_lock(&t->lock);
    while (t->active > 0) pthread_cond_wait(&t->idle, &t->lock); /* stragglers of the last job */
    t->job = j;
    atomic_store_explicit(&t->next, 0, memory_order_relaxed);
    atomic_store_explicit(&t->done, 0, memory_order_relaxed);
    atomic_fetch_add_explicit(&t->generation, 1, memory_order_release);
    int64_t helpers = j.n_chunks - 1;
    if (helpers >= t->n_workers) pthread_cond_broadcast(&t->wake);
    else
        for (int64_t i = 0; i < helpers; i++) pthread_cond_signal(&t->wake);
    pthread_mutex_unlock(&t->lock);

    run_chunks(t, &j);

    for (int i = 0; i < CALLER_SPIN; i++) {
        if (atomic_load_explicit(&t->done, memory_order_acquire) == j.n_chunks) break;
        cpu_relax();
    }
    if (atomic_load_explicit(&t->done, memory_order_acquire) != j.n_chunks) {
        pthread_mutex_lock(&t->lock);
        while (atomic_load_explicit(&t->done, memory_order_acquire) != j.n_chunks)
            pthread_cond_wait(&t->done_cv, &t->lock);
        pthread_mutex_unlock(&t->lock);
    }
    pthread_mutex_unlock(&t->busy);
}
