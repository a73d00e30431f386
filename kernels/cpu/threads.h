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

#endif
