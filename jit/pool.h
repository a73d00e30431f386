/* A pool of reusable host memory blocks for per-call execution arenas: once
 * warm, a call takes a block and gives it back without allocating. */
#ifndef SJ_POOL_H
#define SJ_POOL_H

#include <pthread.h>
#include <stddef.h>

#include "jit/runtime.h"

typedef struct sj_block {
    struct sj_block *next;
    size_t cap;       /* usable bytes at sj_block_data() */
} sj_block;

#define SJ_BLOCK_HEADER 64 /* data starts 64 bytes in, 64-byte aligned */
static inline void *sj_block_data(sj_block *b) { return (char *)b + SJ_BLOCK_HEADER; }

typedef struct sj_pool {
    const sj_runtime *rt;
    pthread_mutex_t lock; /* held only to push or pop a block */
    sj_block *free;
    int n_free;
} sj_pool;

int sj_pool_init(sj_pool *p, const sj_runtime *rt);
void sj_pool_destroy(sj_pool *p);
/* A block with at least `bytes` usable bytes, or NULL on allocation failure. */
sj_block *sj_pool_get(sj_pool *p, size_t bytes);
void sj_pool_put(sj_pool *p, sj_block *b);

#endif
