/* Tests for jit/threads: every index covered exactly once for many sizes and
 * chunk sizes, chunk sizes respected, pools of 0 (online CPUs), 1, 2, 3 and
 * 8 threads, a NULL pool, several callers at once (a busy pool runs the
 * caller inline), nested calls, deterministic results, and create/destroy
 * without jobs, idle workers that sleep, and the lock-free hand-off of the
 * job slot between owners under many tiny jobs from several submitters, and
 * splits bounded by a minimum per thread (too little runs inline, with no
 * hand-off; more uses at most as many threads as have the minimum), and the
 * wake-up tree reaching every worker a job wants when all of them sleep.
 * Clean under ThreadSanitizer. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kernels/cpu/threads.h"

/* -- Helpers --------------------------------------------------------------- */

typedef struct cover {
    int64_t n, min_chunk;
    _Atomic int *hits;
    _Atomic int bad_ranges;  /* empty, reversed or out of [0, n) */
    _Atomic int short_chunks; /* shorter than min_chunk and not the tail */
    _Atomic int calls;
} cover;

static void cover_fn(void *ctx, int64_t b, int64_t e) {
    cover *c = ctx;
    atomic_fetch_add(&c->calls, 1);
    if (b < 0 || e > c->n || b >= e) {
        atomic_fetch_add(&c->bad_ranges, 1);
        return;
    }
    if (e - b < c->min_chunk && e != c->n) atomic_fetch_add(&c->short_chunks, 1);
    for (int64_t i = b; i < e; i++) atomic_fetch_add_explicit(&c->hits[i], 1, memory_order_relaxed);
}

/* Runs one parallel_for and checks the coverage; returns the fn calls. */
static int check_cover(sj_threads *t, int64_t n, int64_t min_chunk) {
    cover c;
    memset(&c, 0, sizeof c);
    c.n = n;
    c.min_chunk = min_chunk < 1 ? 1 : min_chunk;
    c.hits = calloc((size_t)(n > 0 ? n : 1), sizeof *c.hits);
    assert_non_null(c.hits);
    sj_threads_parallel_for(t, n, min_chunk, cover_fn, &c);
    for (int64_t i = 0; i < n; i++)
        if (atomic_load(&c.hits[i]) != 1) fail_msg("n=%lld chunk=%lld: index %lld hit %d times", (long long)n,
                                                   (long long)min_chunk, (long long)i, atomic_load(&c.hits[i]));
    assert_int_equal(atomic_load(&c.bad_ranges), 0);
    assert_int_equal(atomic_load(&c.short_chunks), 0);
    free(c.hits);
    return atomic_load(&c.calls);
}

static const int64_t SIZES[] = {0, 1, 2, 3, 7, 8, 31, 63, 64, 65, 100, 1000, 4097, 65536, 100003};
static const int64_t CHUNKS[] = {0, 1, 2, 7, 64, 1000, 100000};
#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

static void cover_all(sj_threads *t) {
    for (size_t i = 0; i < COUNT(SIZES); i++)
        for (size_t j = 0; j < COUNT(CHUNKS); j++) check_cover(t, SIZES[i], CHUNKS[j]);
}

/* -- Coverage -------------------------------------------------------------- */

static void test_cover_pools(void **state) {
    (void)state;
    const int sizes[] = {0, 1, 2, 3, 8};
    for (size_t k = 0; k < COUNT(sizes); k++) {
        sj_threads *t = sj_threads_create(sizes[k]);
        assert_non_null(t);
        if (sizes[k] == 0) assert_int_equal(sj_threads_count(t), (int)sysconf(_SC_NPROCESSORS_ONLN));
        else assert_int_equal(sj_threads_count(t), sizes[k]);
        for (int rep = 0; rep < 3; rep++) cover_all(t);
        sj_threads_destroy(t);
    }
}

static void test_null_pool_inline(void **state) {
    (void)state;
    assert_int_equal(sj_threads_count(NULL), 1);
    assert_int_equal(check_cover(NULL, 1000, 1), 1);
    assert_int_equal(check_cover(NULL, 0, 1), 0);
    sj_threads_parallel_for(NULL, 10, 1, NULL, NULL); /* no fn: nothing happens */
}

static void test_small_ranges_inline(void **state) {
    (void)state;
    sj_threads *t = sj_threads_create(4);
    assert_non_null(t);
    assert_int_equal(check_cover(t, 0, 1), 0);   /* nothing to do: fn not called */
    assert_int_equal(check_cover(t, 1, 1), 1);   /* n <= min_chunk: one inline call */
    assert_int_equal(check_cover(t, 50, 64), 1); /* n < chunk */
    assert_int_equal(check_cover(t, 64, 64), 1);
    assert_true(check_cover(t, 65, 64) == 2);    /* just past: two chunks */
    assert_true(check_cover(t, 100000, 1) > 1);  /* split */
    sj_threads *one = sj_threads_create(1);
    assert_non_null(one);
    assert_int_equal(check_cover(one, 100000, 1), 1); /* 1 thread: inline */
    sj_threads_destroy(one);
    sj_threads_destroy(t);
}

static void test_create_destroy(void **state) {
    (void)state;
    sj_threads_destroy(NULL);
    assert_null(sj_threads_create(-1));
    for (int i = 0; i < 20; i++) {
        sj_threads *t = sj_threads_create(1 + i % 6);
        assert_non_null(t);
        sj_threads_destroy(t); /* no job ever ran */
    }
}

/* -- Concurrency ----------------------------------------------------------- */

typedef struct caller_arg {
    sj_threads *t;
    int id;
} caller_arg;

static void *caller_main(void *p) {
    caller_arg *a = p;
    for (int rep = 0; rep < 40; rep++) {
        int64_t n = 1 + (a->id * 7919 + rep * 104729) % 20000;
        check_cover(a->t, n, 1 + rep % 17);
    }
    return NULL;
}

static void test_concurrent_callers(void **state) {
    (void)state;
    sj_threads *t = sj_threads_create(4);
    assert_non_null(t);
    enum { CALLERS = 6 };
    pthread_t th[CALLERS];
    caller_arg args[CALLERS];
    for (int i = 0; i < CALLERS; i++) {
        args[i] = (caller_arg){t, i};
        assert_int_equal(pthread_create(&th[i], NULL, caller_main, &args[i]), 0);
    }
    for (int i = 0; i < CALLERS; i++) pthread_join(th[i], NULL);
    sj_threads_destroy(t);
}

/* A busy pool runs a second caller inline: hold the pool inside fn and call
 * from another thread. */
typedef struct hold {
    sj_threads *t;
    _Atomic int entered, release, other_calls;
} hold;

static void other_fn(void *ctx, int64_t b, int64_t e) {
    hold *h = ctx;
    atomic_fetch_add(&h->other_calls, 1);
    (void)b, (void)e;
}

static void *other_caller(void *p) {
    hold *h = p;
    while (!atomic_load(&h->entered)) usleep(100);
    sj_threads_parallel_for(h->t, 100000, 1, other_fn, h);
    atomic_store(&h->release, 1);
    return NULL;
}

static void holding_fn(void *ctx, int64_t b, int64_t e) {
    hold *h = ctx;
    if (b == 0) {
        atomic_store(&h->entered, 1);
        while (!atomic_load(&h->release)) usleep(100);
    }
    (void)e;
}

static void test_busy_pool_runs_inline(void **state) {
    (void)state;
    sj_threads *t = sj_threads_create(3);
    assert_non_null(t);
    hold h;
    memset(&h, 0, sizeof h);
    h.t = t;
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, other_caller, &h), 0);
    sj_threads_parallel_for(t, 1000, 1, holding_fn, &h);
    pthread_join(th, NULL);
    assert_int_equal(atomic_load(&h.other_calls), 1); /* the whole range in one inline call */
    sj_threads_destroy(t);
}

/* fn calling parallel_for on the same pool: runs inline, no deadlock. */
typedef struct nested {
    sj_threads *t;
    _Atomic int64_t total;
} nested;

static void inner_fn(void *ctx, int64_t b, int64_t e) {
    nested *n = ctx;
    atomic_fetch_add(&n->total, e - b);
}

static void outer_fn(void *ctx, int64_t b, int64_t e) {
    nested *n = ctx;
    for (int64_t i = b; i < e; i++) sj_threads_parallel_for(n->t, 100, 1, inner_fn, n);
}

static void test_nested(void **state) {
    (void)state;
    nested n = {sj_threads_create(4), 0};
    assert_non_null(n.t);
    sj_threads_parallel_for(n.t, 64, 1, outer_fn, &n);
    assert_int_equal(atomic_load(&n.total), 64 * 100);
    sj_threads_destroy(n.t);
}

/* -- Determinism ------------------------------------------------------------ */

typedef struct det {
    const float *x;
    float *y;
} det;

static void det_fn(void *ctx, int64_t b, int64_t e) {
    det *d = ctx;
    for (int64_t i = b; i < e; i++) {
        float acc = 0;
        for (int k = 0; k < 16; k++) acc += d->x[(i + k) % 4096] * (float)(k + 1) * 0.37f;
        d->y[i] = acc;
    }
}

static void test_deterministic(void **state) {
    (void)state;
    enum { N = 4096 };
    float *x = malloc(N * sizeof *x), *ref = malloc(N * sizeof *ref), *y = malloc(N * sizeof *y);
    assert_non_null(x);
    assert_non_null(ref);
    assert_non_null(y);
    for (int i = 0; i < N; i++) x[i] = (float)((i * 2654435761u) % 1000) / 999.0f - 0.5f;
    det d = {x, ref};
    sj_threads_parallel_for(NULL, N, 1, det_fn, &d);
    const int pools[] = {1, 2, 3, 5, 8};
    for (size_t p = 0; p < COUNT(pools); p++) {
        sj_threads *t = sj_threads_create(pools[p]);
        assert_non_null(t);
        for (int rep = 0; rep < 5; rep++) {
            memset(y, 0, N * sizeof *y);
            d.y = y;
            sj_threads_parallel_for(t, N, 1 + rep * 13, det_fn, &d);
            assert_memory_equal(y, ref, N * sizeof *y);
        }
        sj_threads_destroy(t);
    }
    free(x);
    free(ref);
    free(y);
}

/* Many back-to-back small jobs: exercises the job-slot reuse (stragglers of
 * one job against the publication of the next). */
static void test_many_jobs(void **state) {
    (void)state;
    sj_threads *t = sj_threads_create(4);
    assert_non_null(t);
    for (int rep = 0; rep < 3000; rep++) check_cover(t, 8 + rep % 57, 1);
    sj_threads_destroy(t);
}

/* The lock-free hand-off between owners, under load: several threads
 * submit many tiny jobs back to back to one pool, so the job slot passes
 * from owner to owner while the previous job's workers are still leaving
 * (the `active` count, `cur` and the Dekker check in threads.c). Every job
 * has its own record, never reused: each item must run exactly once, every
 * item must have run when parallel_for returns, and no chunk may start on a
 * job after its owner saw it finished (a straggler claiming a chunk of a
 * slot that the next owner rewrote would run an item twice, run it late or
 * run the wrong job's fn). Some chunks linger so that the owner sleeps for
 * its last chunk and the next owner waits for stragglers. */
enum { HO_SUBMITTERS = 4, HO_JOBS = 3000, HO_MAX_N = 48 };

typedef struct ho_job {
    int64_t n;
    _Atomic int closed; /* set by the owner once parallel_for returned */
    _Atomic int late;   /* chunks started after that */
    _Atomic int bad;    /* ranges outside [0, n) */
    _Atomic unsigned char hits[HO_MAX_N];
} ho_job;

typedef struct ho_submitter {
    sj_threads *t;
    ho_job *jobs;
    int id;
    int incomplete; /* jobs with an item not yet run when parallel_for returned */
} ho_submitter;

static void ho_fn(void *ctx, int64_t b, int64_t e) {
    ho_job *j = ctx;
    if (atomic_load(&j->closed)) atomic_fetch_add(&j->late, 1);
    if (b < 0 || e > j->n || b >= e) {
        atomic_fetch_add(&j->bad, 1);
        return;
    }
    for (int64_t i = b; i < e; i++) atomic_fetch_add_explicit(&j->hits[i], 1, memory_order_relaxed);
    if (b % 7 == 3) /* a lingering chunk: owners wait on it, the next owner on its worker */
        for (volatile int spin = 0; spin < 2000; spin++) {
        }
    if (b == 5 && j->n % 16 == 0) sched_yield();
}

static void *ho_submit(void *p) {
    ho_submitter *s = p;
    for (int k = 0; k < HO_JOBS; k++) {
        ho_job *j = &s->jobs[k];
        j->n = 2 + (k * 31 + s->id * 17) % (HO_MAX_N - 1);
        /* a third with no bound per thread, the others wanting fewer helpers */
        sj_threads_split(s->t, j->n, 1 + (k % 5 == 4), (k % 3) * (1 + k % 11), ho_fn, j);
        for (int64_t i = 0; i < j->n; i++)
            if (atomic_load(&j->hits[i]) != 1) {
                s->incomplete++;
                break;
            }
        atomic_store(&j->closed, 1);
    }
    return NULL;
}

static void test_handoff_stress(void **state) {
    (void)state;
    const int pools[] = {2, 4};
    for (size_t p = 0; p < COUNT(pools); p++) {
        sj_threads *t = sj_threads_create(pools[p]);
        assert_non_null(t);
        ho_submitter subs[HO_SUBMITTERS];
        pthread_t th[HO_SUBMITTERS];
        for (int i = 0; i < HO_SUBMITTERS; i++) {
            subs[i] = (ho_submitter){t, calloc(HO_JOBS, sizeof(ho_job)), i, 0};
            assert_non_null(subs[i].jobs);
            assert_int_equal(pthread_create(&th[i], NULL, ho_submit, &subs[i]), 0);
        }
        for (int i = 0; i < HO_SUBMITTERS; i++) pthread_join(th[i], NULL);
        sj_threads_destroy(t); /* every worker has left: nothing runs after this */
        for (int i = 0; i < HO_SUBMITTERS; i++) {
            if (subs[i].incomplete)
                fail_msg("pool %d, submitter %d: %d jobs returned before all their items ran", pools[p], i,
                         subs[i].incomplete);
            for (int k = 0; k < HO_JOBS; k++) {
                ho_job *j = &subs[i].jobs[k];
                if (atomic_load(&j->late) || atomic_load(&j->bad))
                    fail_msg("pool %d, submitter %d, job %d: %d chunks started after it returned, %d bad ranges",
                             pools[p], i, k, atomic_load(&j->late), atomic_load(&j->bad));
                for (int64_t x = 0; x < j->n; x++)
                    if (atomic_load(&j->hits[x]) != 1)
                        fail_msg("pool %d, submitter %d, job %d (n=%lld): item %lld ran %d times", pools[p], i, k,
                                 (long long)j->n, (long long)x, atomic_load(&j->hits[x]));
            }
            free(subs[i].jobs);
        }
    }
}

/* Idle workers sleep: the process burns (almost) no CPU between jobs. */
static double cpu_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* -- Threads taking part ----------------------------------------------------- *
 * sj_threads_split with a minimum per thread: too little work runs on the
 * caller with no hand-off; otherwise at most n / thread_min threads run
 * chunks (the others never join, even while they spin for the next job),
 * and every item still runs once. */
typedef struct who {
    pthread_mutex_t lock;
    pthread_t seen[64];
    int n_seen;
    _Atomic int hits[256];
} who;

static void who_fn(void *ctx, int64_t b, int64_t e) {
    who *w = ctx;
    pthread_t me = pthread_self();
    pthread_mutex_lock(&w->lock);
    int known = 0;
    for (int i = 0; i < w->n_seen; i++) known |= pthread_equal(w->seen[i], me);
    if (!known && w->n_seen < 64) w->seen[w->n_seen++] = me;
    pthread_mutex_unlock(&w->lock);
    for (int64_t i = b; i < e; i++) atomic_fetch_add(&w->hits[i], 1);
    struct timespec ts = {0, 100000}; /* long enough for every spinning worker to come */
    nanosleep(&ts, NULL);
}

/* Threads that ran chunks of one split of n items. */
static int split_threads(sj_threads *t, int64_t n, int64_t thread_min) {
    who w;
    memset(&w, 0, sizeof w);
    pthread_mutex_init(&w.lock, NULL);
    sj_threads_split(t, n, 1, thread_min, who_fn, &w);
    for (int64_t i = 0; i < n; i++) assert_int_equal(atomic_load(&w.hits[i]), 1);
    pthread_mutex_destroy(&w.lock);
    return w.n_seen;
}

static void test_split_participants(void **state) {
    (void)state;
    sj_threads *t = sj_threads_create(8);
    assert_non_null(t);
    assert_int_equal(sj_threads_min_work(t), SJ_THREADS_MIN_WORK);
    assert_int_equal(sj_threads_items(t, SJ_THREADS_MIN_WORK / 4), 4);
    assert_int_equal(sj_threads_items(t, SJ_THREADS_MIN_WORK / 4 + 1), 4);
    assert_int_equal(sj_threads_items(t, SJ_THREADS_MIN_WORK * 3), 1);
    for (int round = 0; round < 20; round++) {
        /* tiny: the caller alone, nothing handed off */
        uint64_t h = sj_threads_handoffs(t);
        assert_int_equal(split_threads(t, 64, 64), 1);
        assert_int_equal(split_threads(t, 64, 33), 1);
        assert_int_equal(split_threads(NULL, 64, 1), 1);
        assert_true(sj_threads_handoffs(t) == h);
        /* no bound per thread first, so that every worker is awake and spins */
        assert_true(split_threads(t, 64, 0) <= 8);
        assert_true(sj_threads_handoffs(t) == h + 1);
        int two = split_threads(t, 64, 32), four = split_threads(t, 64, 16);
        if (two > 2 || four > 4) fail_msg("round %d: %d threads for a split of 2, %d for 4", round, two, four);
        assert_true(sj_threads_handoffs(t) == h + 3);
    }
    /* the pool's minimum, as a kernel reads it */
    sj_threads_set_min_work(t, 1000);
    assert_int_equal(sj_threads_min_work(t), 1000);
    assert_int_equal(sj_threads_items(t, 300), 4);
    sj_threads_set_min_work(t, 0);
    assert_int_equal(sj_threads_min_work(t), 1);
    assert_int_equal(sj_threads_min_work(NULL), SJ_THREADS_MIN_WORK);
    sj_threads_destroy(t);
}

static void test_idle_workers_sleep(void **state) {
    (void)state;
    sj_threads *t = sj_threads_create(4);
    assert_non_null(t);
    check_cover(t, 10000, 1);
    usleep(20000); /* past the spin */
    double c0 = cpu_seconds();
    usleep(300000);
    double used = cpu_seconds() - c0;
    sj_threads_destroy(t);
    if (used > 0.05) fail_msg("idle pool used %.3f s of CPU in 0.3 s", used);
}

/* A job whose chunks each wait until `want` threads have entered one: it
 * finishes only if every worker it wants joins it, so with sleeping
 * workers (spin 0) only if the wake-up tree reaches each of them. A chunk
 * gives up after 5 s (counted as a failure) rather than hang. */
typedef struct rendezvous {
    int want;
    _Atomic int in, timeouts;
} rendezvous;

static void rendezvous_fn(void *ctx, int64_t b, int64_t e) {
    rendezvous *r = ctx;
    for (int64_t i = b; i < e; i++) {
        atomic_fetch_add(&r->in, 1);
        struct timespec t0, now;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        while (atomic_load(&r->in) < r->want) {
            clock_gettime(CLOCK_MONOTONIC, &now);
            if (now.tv_sec - t0.tv_sec > 5) {
                atomic_fetch_add(&r->timeouts, 1);
                return;
            }
            sched_yield();
        }
    }
}

static void test_wake_tree(void **state) {
    (void)state;
    sj_threads *t = sj_threads_create(11); /* a tree of 10 workers: 3 levels and a lone leaf */
    assert_non_null(t);
    assert_int_equal(sj_threads_spin_ns(t), SJ_THREADS_SPIN_NS);
    assert_int_equal(sj_threads_spin_ns(NULL), SJ_THREADS_SPIN_NS);
    sj_threads_set_spin_ns(t, -5);
    assert_int_equal(sj_threads_spin_ns(t), 0);
    for (int want = 2; want <= 11; want++)
        for (int round = 0; round < 3; round++) {
            usleep(2000); /* every worker asleep (spin 0) */
            rendezvous r = {.want = want};
            /* want chunks of one item, on want threads (thread_min 1) */
            sj_threads_split(t, want, 1, 1, rendezvous_fn, &r);
            if (atomic_load(&r.timeouts) || atomic_load(&r.in) != want)
                fail_msg("a job for %d threads: %d entered, %d timed out", want, atomic_load(&r.in),
                         atomic_load(&r.timeouts));
        }
    /* and spinning again: the same jobs back to back */
    sj_threads_set_spin_ns(t, 1000000);
    for (int want = 11; want >= 2; want--) {
        rendezvous r = {.want = want};
        sj_threads_split(t, want, 1, 1, rendezvous_fn, &r);
        assert_int_equal(atomic_load(&r.timeouts), 0);
    }
    sj_threads_destroy(t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cover_pools),
        cmocka_unit_test(test_null_pool_inline),
        cmocka_unit_test(test_small_ranges_inline),
        cmocka_unit_test(test_create_destroy),
        cmocka_unit_test(test_concurrent_callers),
        cmocka_unit_test(test_busy_pool_runs_inline),
        cmocka_unit_test(test_nested),
        cmocka_unit_test(test_deterministic),
        cmocka_unit_test(test_many_jobs),
        cmocka_unit_test(test_handoff_stress),
        cmocka_unit_test(test_idle_workers_sleep),
        cmocka_unit_test(test_split_participants),
        cmocka_unit_test(test_wake_tree),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
