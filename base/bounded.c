/* Work that cannot be interrupted, waited for with a bound (see bounded.h).
 *
 * The caller and the thread share a control block with two references.
 * The thread runs, then sets done under the lock and drops its reference;
 * the caller waits for done, or abandons: it sets abandoned under the lock
 * and drops its reference. Whoever sees the other side gone frees the
 * block; the thread releases arg when it finds itself abandoned. */
#include "base/bounded.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <time.h>

#include "base/alloc.h"
#include "base/error.h"

typedef struct ctl {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    bool done, abandoned;
    int refs; /* under lock */
    void (*run)(void *);
    void (*release)(void *);
    void *arg;
} ctl;

static atomic_int n_abandoned;

int sj_bounded_abandoned(void) { return atomic_load(&n_abandoned); }

/* At exit, wait (bounded) for abandoned runs: exit() runs the static
 * destructors of the libraries they are inside (NVRTC's), and a thread still
 * running there would crash the exiting process. Registered at the first
 * run, after those libraries were loaded, so it runs before their
 * destructors. */
static void wait_at_exit(void) {
    struct timespec ms = {0, 1000000};
    for (int i = 0; i < SJ_BOUNDED_EXIT_WAIT_MS && atomic_load(&n_abandoned) > 0; i++) nanosleep(&ms, NULL);
}

int sj_bounded_wait_abandoned(int timeout_ms) {
    struct timespec ms = {0, 1000000};
    for (int i = 0; (timeout_ms <= 0 || i < timeout_ms) && atomic_load(&n_abandoned) > 0; i++) nanosleep(&ms, NULL);
    return atomic_load(&n_abandoned);
}

static pthread_once_t exit_once = PTHREAD_ONCE_INIT;
static void register_exit_wait(void) { atexit(wait_at_exit); }

static void ctl_free(ctl *c) {
    pthread_cond_destroy(&c->cond);
    pthread_mutex_destroy(&c->lock);
    free(c);
}

/* Drop one reference (lock held; released here). */
static void ctl_put(ctl *c) {
    bool last = --c->refs == 0;
    pthread_mutex_unlock(&c->lock);
    if (last) ctl_free(c);
}

static void *thread_main(void *p) {
    ctl *c = p;
    c->run(c->arg);
    pthread_mutex_lock(&c->lock);
    c->done = true;
    bool abandoned = c->abandoned;
    if (!abandoned) pthread_cond_signal(&c->cond);
    void (*release)(void *) = c->release;
    void *arg = c->arg;
    ctl_put(c);
    if (abandoned) {
        if (release) release(arg);
        atomic_fetch_sub(&n_abandoned, 1);
    }
    return NULL;
}

sj_status sj_run_bounded(const char *what, void (*run)(void *), void (*release)(void *), void *arg, int timeout_ms,
                         const atomic_int *cancel, int *cancelled) {
    if (cancelled) *cancelled = 0;
    if (atomic_load(&n_abandoned) >= SJ_BOUNDED_MAX_ABANDONED)
        return sj_seterr(SJ_EBACKEND, "%s: refused: %d earlier runs that timed out are still running", what,
                         SJ_BOUNDED_MAX_ABANDONED);
    pthread_once(&exit_once, register_exit_wait);
    ctl *c = sj_calloc(1, sizeof *c);
    if (!c) return sj_seterr(SJ_ENOMEM, "%s: out of memory", what);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(&c->lock, NULL);
    pthread_cond_init(&c->cond, &ca);
    pthread_condattr_destroy(&ca);
    c->refs = 2;
    c->run = run, c->release = release, c->arg = arg;
    pthread_attr_t attr;
    pthread_t th;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int rc = pthread_create(&th, &attr, thread_main, c);
    pthread_attr_destroy(&attr);
    if (rc) {
        ctl_free(c);
        return sj_seterr(SJ_ENOMEM, "%s: cannot start a thread (%d)", what, rc);
    }
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    int64_t start = (int64_t)now.tv_sec * 1000000000 + now.tv_nsec;
    int64_t deadline = timeout_ms > 0 ? start + (int64_t)timeout_ms * 1000000 : INT64_MAX;
    pthread_mutex_lock(&c->lock);
    bool stop = false, by_cancel = false;
    while (!c->done) {
        if (cancel && atomic_load_explicit(cancel, memory_order_relaxed)) {
            stop = by_cancel = true;
            break;
        }
        clock_gettime(CLOCK_MONOTONIC, &now);
        int64_t t = (int64_t)now.tv_sec * 1000000000 + now.tv_nsec;
        if (t >= deadline) {
            stop = true;
            break;
        }
        int64_t until = t + 10 * 1000000; /* the cancel flag's poll */
        if (until > deadline) until = deadline;
        struct timespec ts = {(time_t)(until / 1000000000), (long)(until % 1000000000)};
        pthread_cond_timedwait(&c->cond, &c->lock, &ts);
    }
    if (stop) {
        c->abandoned = true;
        atomic_fetch_add(&n_abandoned, 1);
    }
    ctl_put(c);
    if (!stop) return SJ_OK;
    if (cancelled) *cancelled = by_cancel;
    return by_cancel ? sj_seterr(SJ_ETIMEOUT, "%s: cancelled; left running in the background", what)
                     : sj_seterr(SJ_ETIMEOUT, "%s: still running after %d ms; left running in the background", what,
                                 timeout_ms);
}
