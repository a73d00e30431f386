/* A fixed pool of worker threads for running one kernel over a range in
 * parallel: the CPU fused kernels, and the eager matrix products and
 * attention (kernels/cpu/matmul.c).
 *
 * parallel_for splits [0, n) into chunks and runs fn on them from the pool's
 * workers and the calling thread, returning when all chunks are done. Several
 * threads may call it at once: a caller that finds the pool busy runs its
 * whole range itself, so concurrent requests never wait on each other and
 * the machine is never oversubscribed.
 */
#ifndef SJ_THREADS_H
#define SJ_THREADS_H

#include <stdint.h>

typedef struct sj_threads sj_threads;

/* n_threads total workers including the caller (1: everything runs inline;
 * 0: the number of online CPUs). NULL on failure. */
sj_threads *sj_threads_create(int n_threads);
void sj_threads_destroy(sj_threads *t); /* NULL is a no-op; waits for workers */
int sj_threads_count(const sj_threads *t);

typedef void (*sj_range_fn)(void *ctx, int64_t begin, int64_t end);

/* Run fn over [0, n) in chunks of at least min_chunk items (t NULL: inline). */
void sj_threads_parallel_for(sj_threads *t, int64_t n, int64_t min_chunk, sj_range_fn fn, void *ctx);

/* As parallel_for, on only as many threads (the caller's included) as have
 * thread_min items each (0: no such bound): fewer than two, and fn runs
 * over the whole range on the calling thread, with no hand-off; workers
 * not taking part do not touch the job. */
void sj_threads_split(sj_threads *t, int64_t n, int64_t min_chunk, int64_t thread_min, sj_range_fn fn, void *ctx);

/* The least work a kernel gives each thread taking part, in multiply-adds
 * (an element of a fused kernel counts SJ_THREADS_ELEM_WORK): the runtime's
 * exec_min_work. A kernel with less than twice this runs on the caller's
 * thread alone. t NULL: the default. */
#define SJ_THREADS_MIN_WORK (INT64_C(1) << 18)
#define SJ_THREADS_ELEM_WORK 16
void sj_threads_set_min_work(sj_threads *t, int64_t work);
int64_t sj_threads_min_work(const sj_threads *t);
/* Items of item_work each that make up the least work per thread (>= 1):
 * thread_min for sj_threads_split. */
int64_t sj_threads_items(const sj_threads *t, int64_t item_work);

/* How long a worker polls for the next job before it sleeps, and an owner
 * for its job's last chunk, in nanoseconds (0: sleep at once): the
 * runtime's exec_spin_us. The kernels of one request follow each other
 * with gaps of microseconds to tens of microseconds (eager ops on the
 * calling thread in between); a worker that slept in such a gap must be
 * woken, and a wake-up costs tens of microseconds on a virtual machine
 * (an interrupt to an idle virtual CPU: 30-75 us for the last of 15
 * sleeping workers on a 16-core GPU host, bench_cpu --workloads pool).
 * Spinning burns the core for that long after each job. */
#define SJ_THREADS_SPIN_NS INT64_C(1000000)
void sj_threads_set_spin_ns(sj_threads *t, int64_t ns);
int64_t sj_threads_spin_ns(const sj_threads *t);

/* Jobs handed to workers so far (inline runs are not counted; tests). */
uint64_t sj_threads_handoffs(const sj_threads *t);

#endif
