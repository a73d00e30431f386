/* Reusable execution arenas (see pool.h). */
#include "jit/pool.h"

#define POOL_MAX_FREE 16

int sj_pool_init(sj_pool *p, const sj_runtime *rt) {
    p->rt = rt;
    p->free = NULL;
    p->n_free = 0;
    return pthread_mutex_init(&p->lock, NULL);
}

void sj_pool_destroy(sj_pool *p) {
    sj_block *b = p->free;
    while (b) {
        sj_block *next = b->next;
        sj_host_free(p->rt, b);
        b = next;
    }
    p->free = NULL;
    pthread_mutex_destroy(&p->lock);
}

sj_block *sj_pool_get(sj_pool *p, size_t bytes) {
    pthread_mutex_lock(&p->lock);
    sj_block **best = NULL;
    for (sj_block **b = &p->free; *b; b = &(*b)->next)
        if ((*b)->cap >= bytes && (!best || (*b)->cap < (*best)->cap)) best = b;
    sj_block *got = NULL;
    if (best) {
        got = *best;
        *best = got->next;
        p->n_free--;
    }
    pthread_mutex_unlock(&p->lock);
    if (got) return got;
    size_t cap = 4096;
    while (cap < bytes) cap += cap / 2;
    cap = (cap + 63) & ~(size_t)63;
    got = sj_host_alloc(p->rt, SJ_BLOCK_HEADER + cap, 64);
    if (!got) return NULL;
    got->next = NULL;
    got->cap = cap;
    return got;
}

void sj_pool_put(sj_pool *p, sj_block *b) {
    if (!b) return;
    sj_block *drop = NULL;
    pthread_mutex_lock(&p->lock);
    b->next = p->free;
    p->free = b;
    if (++p->n_free > POOL_MAX_FREE) {
        /* drop the smallest: large blocks are the expensive ones to remake */
        sj_block **min = &p->free;
        for (sj_block **it = &p->free; *it; it = &(*it)->next)
            if ((*it)->cap < (*min)->cap) min = it;
        drop = *min;
        *min = drop->next;
        p->n_free--;
    }
    pthread_mutex_unlock(&p->lock);
    if (drop) sj_host_free(p->rt, drop);
}
