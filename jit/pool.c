/* Reusable execution arenas (see pool.h). */
#include "jit/pool.h"

#include "base/shard.h"

int sj_pool_init(sj_pool *p, const sj_runtime *rt) {
    p->rt = rt;
    for (int i = 0; i < SJ_POOL_SLOTS; i++) atomic_init(&p->slot[i].b, NULL);
    return 0;
}

void sj_pool_destroy(sj_pool *p) {
    for (int i = 0; i < SJ_POOL_SLOTS; i++) sj_host_free(p->rt, atomic_exchange(&p->slot[i].b, NULL));
}

/* The thread's first slot: its shard's. */
static unsigned first_slot(void) { return sj_shard_index() % SJ_POOL_SLOTS; }

sj_block *sj_pool_get(sj_pool *p, size_t bytes) {
    for (unsigned k = 0, i = first_slot(); k < SJ_POOL_SLOTS; k++, i = (i + 1) % SJ_POOL_SLOTS) {
        if (!atomic_load_explicit(&p->slot[i].b, memory_order_relaxed)) continue;
        sj_block *b = atomic_exchange_explicit(&p->slot[i].b, NULL, memory_order_acquire);
        if (!b) continue;
        if (b->cap >= bytes) return b;
        sj_pool_put(p, b); /* too small for this call: leave it for another */
        break;
    }
    size_t cap = 4096;
    while (cap < bytes) cap += cap / 2;
    cap = (cap + 63) & ~(size_t)63;
    sj_block *got = sj_host_alloc(p->rt, SJ_BLOCK_HEADER + cap, 64);
    if (!got) return NULL;
    got->next = NULL;
    got->cap = cap;
    return got;
}

void sj_pool_put(sj_pool *p, sj_block *b) {
    if (!b) return;
    for (unsigned k = 0, i = first_slot(); k < SJ_POOL_SLOTS; k++, i = (i + 1) % SJ_POOL_SLOTS) {
        sj_block *expect = NULL;
        if (atomic_compare_exchange_strong_explicit(&p->slot[i].b, &expect, b, memory_order_release,
                                                    memory_order_relaxed))
            return;
    }
    /* Every slot full: free it. A block in a slot belongs to whichever
     * thread takes it next, so this thread never looks inside one. */
    sj_host_free(p->rt, b);
}
