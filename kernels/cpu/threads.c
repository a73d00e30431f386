/* The worker pool behind parallel kernels (see threads.h).
 *
 * One job at a time. A caller that wins the `busy` try-lock owns the job
 * slot: it writes the job, publishes it (`cur`, then a new `generation`),
 * wakes sleeping workers only if there are any, and claims chunks itself.
 * Everyone claims chunk indices from the job's atomic counter; the caller
 * returns once every chunk is done.
 *
 * No lock on the fast path. A worker that sees a new generation announces
 * itself in `active`, then reads `cur`; the owner clears `cur` when its job
 * is done, and the next owner waits for `active` to drop to zero before it
 * rewrites the slot. With both sides sequentially consistent (Dekker), a
 * worker either is counted before the next owner looks, or reads a NULL
 * (or the next) `cur`: it never claims a chunk of a job it did not read.
 * On many cores this matters: every worker used to take the pool's mutex
 * twice per job (to join and to leave), and the next job waited for all of
 * them, so 31 spinning workers serialised every kernel of a request.
 *
 * Workers spin for the pool's spin time after a job (a burst of kernels is
 * common; sj_threads_set_spin_ns), then sleep, each on a condition
 * variable of its own; its `asleep` flag tells whoever would wake it
 * whether it needs a wake-up (its mutex is taken only then). Waking is a
 * tree: the owner wakes worker 0 only, and worker i, once it joins a job,
 * wakes workers 2i + 1 and 2i + 2 if the job wants them. A wake-up costs
 * the waker a system call and, on a virtual machine, an interrupt to an
 * idle virtual CPU (10-20 us each, seen on a 2-vCPU VM): a broadcast made
 * the owner pay that for every sleeper before it ran a chunk, the tree
 * makes it pay once and spreads the rest over the woken. The owner that
 * must sleep for a straggling chunk takes `lock`. No user code runs under
 * any lock.
 *
 * A job wants only as many helpers as it has work for (sj_threads_split:
 * a minimum of work per participating thread). The count rides in the low
 * bits of `generation`, and worker i joins only when i is below it: the
 * others note the generation and go on waiting without touching the job's
 * lines, so a small product on a 32-core pool costs the hand-off to the
 * few threads it uses, not 31 announcements and failed claims; workers a
 * job does not want are not woken for it (their parents in the tree are
 * not wanted either). A worker that never joins a job costs nothing: the
 * owner and whoever did join run every chunk.
 *
 * Lock order: busy -> lock, and a sleeper's mutex alone. No lock is held
 * while running fn.
 */
#include "base/alloc.h"
#include "kernels/cpu/threads.h"

#include "base/clock.h"

#include <assert.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <unistd.h>

#define MAX_THREADS 1024
#define CALLER_SPIN_POLLS 64 /* polls of the done count between two clock reads */
/* generation: a counter above WANT_BITS, the helpers wanted below them */
#define WANT_BITS 16
#define WANT_MASK ((UINT64_C(1) << WANT_BITS) - 1)

typedef struct job {
    sj_range_fn fn;
    void *ctx;
    int64_t n, chunk, n_chunks;
    _Atomic int64_t next; /* next chunk index to claim */
    _Atomic int64_t done; /* chunks finished */
} job;

struct sj_threads {
    int n;               /* threads including the caller */
    int n_workers;       /* n - 1 started workers */
    pthread_t *workers;
    pthread_mutex_t busy; /* held by the caller that owns the job slot */
    pthread_mutex_t lock; /* the owner's sleep for its last chunk only */
    pthread_cond_t done_cv; /* the owner: all chunks done */
    struct sleeper *sleepers; /* per worker */
    job job;              /* the slot; rewritten only when active == 0 and cur == NULL */
    _Atomic(job *) cur;   /* the job open to workers (NULL: none) */
    _Atomic int active;   /* workers between their join and their last claim */
    _Atomic bool owner_waits; /* the owner sleeps on done_cv */
    _Atomic bool stop;
    _Atomic uint64_t generation; /* counter << WANT_BITS | helpers wanted */
    _Atomic int next_index;      /* workers number themselves 0, 1, ... */
    _Atomic int64_t min_work;    /* sj_threads_set_min_work */
    _Atomic int64_t spin_ns;     /* sj_threads_set_spin_ns */
    _Atomic uint64_t handoffs;   /* jobs handed to workers (written by owners only) */
};

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* A worker's bed: it sleeps on cv under m, having raised asleep first. */
typedef struct sleeper {
    pthread_mutex_t m;
    pthread_cond_t cv;
    _Atomic unsigned char asleep; /* asleep on cv, or about to be */
    char pad[64];                 /* the next worker's on another line */
} sleeper;

/* Wakes worker i if it sleeps (seq_cst: it either sees the generation its
 * waker saw or is seen asleep; Dekker with worker_main). */
static void wake_one(sj_threads *t, int64_t i) {
    sleeper *s = &t->sleepers[i];
    if (!atomic_load(&s->asleep)) return;
    pthread_mutex_lock(&s->m);
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->m);
}

/* -- Running chunks ------------------------------------------------------ */

/* Claims and runs chunks of j until none are left; the thread that
 * finishes the last chunk wakes the owner if it sleeps. */
static void run_chunks(sj_threads *t, job *j) {
    for (;;) {
        int64_t c = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
        if (c >= j->n_chunks) return;
        int64_t b = c * j->chunk;
        int64_t e = j->n - b > j->chunk ? b + j->chunk : j->n;
        j->fn(j->ctx, b, e);
        /* seq_cst: the chunk's writes are visible to whoever sees the
         * count, and the owner's flag is read after it (Dekker with
         * wait_done) */
        if (atomic_fetch_add(&j->done, 1) + 1 == j->n_chunks && atomic_load(&t->owner_waits)) {
            pthread_mutex_lock(&t->lock);
            pthread_cond_signal(&t->done_cv);
            pthread_mutex_unlock(&t->lock);
        }
    }
}

static void *worker_main(void *arg) {
    sj_threads *t = arg;
    uint64_t seen = 0;
    const uint64_t me = (uint64_t)atomic_fetch_add(&t->next_index, 1);
    bool spin = true; /* false: woken for a job that did not want this worker */
    for (;;) {
        const int64_t spin_ns = atomic_load_explicit(&t->spin_ns, memory_order_relaxed);
        for (int64_t i = 0, t0 = sj_now_ns(); spin; i++) {
            if (atomic_load_explicit(&t->generation, memory_order_relaxed) != seen) break;
            if (i % 32 == 31 && sj_now_ns() - t0 > spin_ns) break;
            cpu_relax();
        }
        bool slept = false;
        if (atomic_load(&t->generation) == seen) { /* sleep until the next job */
            sleeper *s = &t->sleepers[me];
            pthread_mutex_lock(&s->m);
            atomic_store(&s->asleep, 1); /* before generation is read (Dekker with wake_one) */
            while (!atomic_load(&t->stop) && atomic_load(&t->generation) == seen) pthread_cond_wait(&s->cv, &s->m);
            atomic_store(&s->asleep, 0);
            pthread_mutex_unlock(&s->m);
            slept = true;
        }
        if (atomic_load(&t->stop)) return NULL;
        seen = atomic_load(&t->generation);
        if ((seen & WANT_MASK) <= me) { /* not wanted: back to waiting, as it was */
            spin = !slept;
            continue;
        }
        spin = true;
        for (uint64_t c = 2 * me + 1; c <= 2 * me + 2 && c < (seen & WANT_MASK); c++) wake_one(t, (int64_t)c);
        atomic_fetch_add(&t->active, 1); /* announced before cur is read */
        job *j = atomic_load(&t->cur);
        if (j) run_chunks(t, j);
        atomic_fetch_sub(&t->active, 1);
    }
}

/* -- Lifecycle ----------------------------------------------------------- */

static void stop_workers(sj_threads *t, int started) {
    atomic_store(&t->stop, true);
    for (int i = 0; i < started; i++) {
        pthread_mutex_lock(&t->sleepers[i].m);
        pthread_cond_signal(&t->sleepers[i].cv);
        pthread_mutex_unlock(&t->sleepers[i].m);
    }
    for (int i = 0; i < started; i++) pthread_join(t->workers[i], NULL);
}

/* The pool's sync objects: busy, lock, done_cv, then each sleeper's mutex
 * and condition variable, initialised in that order. */
static int sync_count(const sj_threads *t) { return 3 + 2 * t->n_workers; }

/* Frees the pool whose first n_sync sync objects were initialised. */
static void free_pool(sj_threads *t, int n_sync) {
    for (int i = 0; i < t->n_workers; i++) {
        if (n_sync > 3 + 2 * i + 1) pthread_cond_destroy(&t->sleepers[i].cv);
        if (n_sync > 3 + 2 * i) pthread_mutex_destroy(&t->sleepers[i].m);
    }
    if (n_sync > 2) pthread_cond_destroy(&t->done_cv);
    if (n_sync > 1) pthread_mutex_destroy(&t->lock);
    if (n_sync > 0) pthread_mutex_destroy(&t->busy);
    free(t->sleepers);
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
    if (t->n_workers > 0 && (!(t->workers = sj_calloc((size_t)t->n_workers, sizeof *t->workers)) ||
                             !(t->sleepers = sj_calloc((size_t)t->n_workers, sizeof *t->sleepers)))) {
        free_pool(t, 0);
        return NULL;
    }
    /* Initialise the sync objects one by one so a failure unwinds exactly. */
    int inited = 0, want = sync_count(t);
    if (!pthread_mutex_init(&t->busy, NULL)) inited++;
    if (inited == 1 && !pthread_mutex_init(&t->lock, NULL)) inited++;
    if (inited == 2 && !pthread_cond_init(&t->done_cv, NULL)) inited++;
    for (int i = 0; inited == 3 + 2 * i && i < t->n_workers; i++) {
        if (!pthread_mutex_init(&t->sleepers[i].m, NULL)) inited++;
        if (inited == 3 + 2 * i + 1 && !pthread_cond_init(&t->sleepers[i].cv, NULL)) inited++;
        atomic_init(&t->sleepers[i].asleep, 0);
    }
    if (inited < want) {
        free_pool(t, inited);
        return NULL;
    }
    atomic_init(&t->generation, 0);
    atomic_init(&t->cur, NULL);
    atomic_init(&t->active, 0);
    atomic_init(&t->owner_waits, false);
    atomic_init(&t->stop, false);
    atomic_init(&t->next_index, 0);
    atomic_init(&t->min_work, SJ_THREADS_MIN_WORK);
    atomic_init(&t->spin_ns, SJ_THREADS_SPIN_NS);
    atomic_init(&t->handoffs, 0);
    atomic_init(&t->job.next, 0);
    atomic_init(&t->job.done, 0);

    /* Workers take no signals: those belong to the embedding program. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int started = 0;
    while (started < t->n_workers && !pthread_create(&t->workers[started], NULL, worker_main, t)) started++;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (started < t->n_workers) {
        stop_workers(t, started);
        free_pool(t, want);
        return NULL;
    }
    return t;
}

void sj_threads_destroy(sj_threads *t) {
    if (!t) return;
    stop_workers(t, t->n_workers);
    free_pool(t, sync_count(t));
}

int sj_threads_count(const sj_threads *t) { return t ? t->n : 1; }

void sj_threads_set_min_work(sj_threads *t, int64_t work) {
    if (t) atomic_store_explicit(&t->min_work, work > 0 ? work : 1, memory_order_relaxed);
}

void sj_threads_set_spin_ns(sj_threads *t, int64_t ns) {
    if (t) atomic_store_explicit(&t->spin_ns, ns > 0 ? ns : 0, memory_order_relaxed);
}

int64_t sj_threads_spin_ns(const sj_threads *t) {
    return t ? atomic_load_explicit(&((sj_threads *)t)->spin_ns, memory_order_relaxed) : SJ_THREADS_SPIN_NS;
}

int64_t sj_threads_min_work(const sj_threads *t) {
    return t ? atomic_load_explicit(&((sj_threads *)t)->min_work, memory_order_relaxed) : SJ_THREADS_MIN_WORK;
}

int64_t sj_threads_items(const sj_threads *t, int64_t item_work) {
    int64_t w = sj_threads_min_work(t);
    if (item_work < 1) item_work = 1;
    return w / item_work + (w % item_work != 0);
}

uint64_t sj_threads_handoffs(const sj_threads *t) {
    return t ? atomic_load_explicit(&((sj_threads *)t)->handoffs, memory_order_relaxed) : 0;
}

/* -- Parallel for -------------------------------------------------------- */

/* Wait for the stragglers of the previous job: workers that announced
 * themselves and may still read the slot. They hold it only between two
 * atomic operations and a failed claim, so this is short; yield if one of
 * them lost its core. */
static void wait_inactive(sj_threads *t) {
    for (int i = 0; atomic_load(&t->active) != 0; i++) {
        if (i < 4096) cpu_relax();
        else sched_yield();
    }
}

/* The owner's wait for the last chunk, run elsewhere: polls for as long
 * as a worker spins between jobs, then sleeps. */
static void wait_done(sj_threads *t, job *j) {
    const int64_t spin_ns = atomic_load_explicit(&t->spin_ns, memory_order_relaxed);
    for (int64_t t0 = sj_now_ns();;) {
        for (int i = 0; i < CALLER_SPIN_POLLS; i++) {
            if (atomic_load_explicit(&j->done, memory_order_acquire) == j->n_chunks) return;
            cpu_relax();
        }
        if (sj_now_ns() - t0 > spin_ns) break;
    }
    pthread_mutex_lock(&t->lock);
    atomic_store(&t->owner_waits, true);
    while (atomic_load(&j->done) != j->n_chunks) pthread_cond_wait(&t->done_cv, &t->lock);
    atomic_store(&t->owner_waits, false);
    pthread_mutex_unlock(&t->lock);
}

void sj_threads_parallel_for(sj_threads *t, int64_t n, int64_t min_chunk, sj_range_fn fn, void *ctx) {
    sj_threads_split(t, n, min_chunk, 0, fn, ctx);
}

void sj_threads_split(sj_threads *t, int64_t n, int64_t min_chunk, int64_t thread_min, sj_range_fn fn, void *ctx) {
    if (n <= 0 || !fn) return;
    if (min_chunk < 1) min_chunk = 1;
    /* Threads that take part: as many as have thread_min items each. */
    int64_t parts = t ? t->n : 1;
    if (thread_min > 0 && n / thread_min < parts) parts = n / thread_min;
    /* Inline when there is nothing to share, or another caller (or this one,
     * from inside fn) holds the pool. */
    if (!t || t->n_workers == 0 || parts <= 1 || n <= min_chunk || pthread_mutex_trylock(&t->busy)) {
        fn(ctx, 0, n);
        return;
    }
    int64_t chunk = n / (parts * 4);
    if (chunk < min_chunk) chunk = min_chunk;
    job *j = &t->job;
    wait_inactive(t); /* cur is NULL: no new worker reads the slot */
    j->fn = fn, j->ctx = ctx, j->n = n, j->chunk = chunk, j->n_chunks = n / chunk + (n % chunk != 0);
    assert(j->n_chunks >= 2);
    /* helpers wanted: one fewer than the threads taking part, and than the chunks */
    int64_t helpers = parts - 1 < j->n_chunks - 1 ? parts - 1 : j->n_chunks - 1;
    atomic_store_explicit(&j->next, 0, memory_order_relaxed);
    atomic_store_explicit(&j->done, 0, memory_order_relaxed);
    atomic_store(&t->cur, j); /* seq_cst: the slot's writes before it */
    uint64_t gen = atomic_load_explicit(&t->generation, memory_order_relaxed); /* only owners write it */
    atomic_store(&t->generation, ((gen >> WANT_BITS) + 1) << WANT_BITS | (uint64_t)helpers);
    atomic_store_explicit(&t->handoffs, atomic_load_explicit(&t->handoffs, memory_order_relaxed) + 1,
                          memory_order_relaxed);
    /* The root of the wake-up tree; the workers it wants wake each other. */
    wake_one(t, 0);

    run_chunks(t, j);
    wait_done(t, j);
    atomic_store(&t->cur, NULL); /* closed: late workers find nothing */
    pthread_mutex_unlock(&t->busy);
}
