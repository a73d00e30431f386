/* A pool of reusable host memory blocks for per-call execution arenas: once
 * warm, a call takes a block and gives it back without allocating. */
#ifndef SJ_POOL_H
#define SJ_POOL_H

#include <stdatomic.h>
#include <stddef.h>

#include "jit/runtime.h"

typedef struct sj_block {
    struct sj_block *next;
    size_t cap;       /* usable bytes at sj_block_data() */
} sj_block;

#define SJ_BLOCK_HEADER 64 /* data starts 64 bytes in, 64-byte aligned */
static inline void *sj_block_data(sj_block *b) { return (char *)b + SJ_BLOCK_HEADER; }

#define SJ_POOL_SLOTS 16

/* Free blocks sit in a fixed array of atomic slots: taking one is an
 * exchange with NULL, returning one a compare-exchange into an empty slot,
 * so warm calls neither lock nor allocate. Each slot has a 64-byte line of
 * its own, and a thread starts at the slot of its shard (base/shard.h), so
 * threads calling at once take and return blocks on lines of their own. */
typedef struct sj_pool_slot {
    _Atomic(sj_block *) b;
    char pad[64 - sizeof(void *)];
} sj_pool_slot;

typedef struct sj_pool {
    const sj_runtime *rt;
    sj_pool_slot slot[SJ_POOL_SLOTS];
} sj_pool;

int sj_pool_init(sj_pool *p, const sj_runtime *rt);
void sj_pool_destroy(sj_pool *p);
/* A block with at least `bytes` usable bytes, or NULL on allocation failure. */
sj_block *sj_pool_get(sj_pool *p, size_t bytes);
void sj_pool_put(sj_pool *p, sj_block *b);

#endif
