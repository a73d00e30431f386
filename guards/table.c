/* The per-function table of guarded entries (see table.h). */
#include "guards/table.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* -- Signatures ---------------------------------------------------------------- */

int sj_sig_pack(const sj_tensor *in, int n, int64_t *sig) {
    int w = 0;
    for (int i = 0; i < n; i++) {
        const sj_tensor *x = &in[i];
        sig[w++] = (int64_t)x->dtype | (int64_t)x->rank << 8 | (int64_t)x->device << 16;
        for (int a = 0; a < x->rank; a++) sig[w++] = x->shape[a];
        for (int a = 0; a < x->rank; a++) sig[w++] = x->stride[a];
    }
    return w;
}

/* A fast 64-bit mix over the words, folded to uthash's 32 bits. */
unsigned sj_sig_hash(const int64_t *sig, int words) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (uint64_t)words;
    for (int i = 0; i < words; i++) {
        h ^= (uint64_t)sig[i];
        h *= 0xBF58476D1CE4E5B9ull;
        h ^= h >> 31;
    }
    return (unsigned)(h ^ (h >> 32));
}

/* -- Lifecycle ------------------------------------------------------------------- */

#define MEMO_INDEX0 16 /* slots of a new index (a power of two) */

static sj_memo_index *index_new(size_t cap) {
    sj_memo_index *x = sj_calloc(1, sizeof *x + cap * sizeof(x->slot[0]));
    if (x) x->cap = cap;
    return x;
}

int sj_table_init(sj_table *t, const sj_table_items *items, void *ctx) {
    t->memo = NULL;
    t->n_memo = 0;
    t->items = items;
    t->items_ctx = ctx;
    atomic_init(&t->n_entries, 0);
    atomic_init(&t->entries, NULL);
    sj_memo_index *x = index_new(MEMO_INDEX0);
    if (!x) return -1;
    atomic_init(&t->index, x);
    if (pthread_mutex_init(&t->lock, NULL)) {
        free(x);
        return -1;
    }
    return 0;
}

void sj_table_destroy(sj_table *t) {
    sj_memo_head *m, *tmp;
    HASH_ITER(hh, t->memo, m, tmp) {
        HASH_DELETE(hh, t->memo, m);
        if (t->items->memo_release) t->items->memo_release(t->items_ctx, m);
        free(m);
    }
    sj_guarded *e = atomic_load(&t->entries);
    while (e) {
        sj_guarded *next = e->next;
        if (t->items->entry_free) t->items->entry_free(e);
        e = next;
    }
    atomic_store(&t->entries, NULL);
    for (sj_memo_index *x = atomic_exchange(&t->index, NULL), *older; x; x = older) {
        older = x->older;
        free(x);
    }
    pthread_mutex_destroy(&t->lock);
}

/* -- Lookup ---------------------------------------------------------------------- */

/* The slot of x holding the item for sig (*hit true), or the empty slot
 * where it would go (*hit false). The verdict is the probe's own: a slot
 * published after the probe saw it empty may hold this very key. */
static _Atomic(sj_memo_head *) *index_probe(sj_memo_index *x, const int64_t *sig, int words, unsigned hash,
                                           bool *hit) {
    for (size_t i = hash & (x->cap - 1);; i = (i + 1) & (x->cap - 1)) {
        sj_memo_head *m = atomic_load_explicit(&x->slot[i], memory_order_acquire);
        if (!m || (m->hash == hash && m->key_words == words &&
                   !memcmp(m->key, sig, (size_t)words * sizeof(int64_t)))) {
            *hit = m != NULL;
            return &x->slot[i];
        }
    }
}

sj_memo_head *sj_table_find(sj_table *t, const int64_t *sig, int words, unsigned hash) {
    bool hit;
    _Atomic(sj_memo_head *) *sl =
        index_probe(atomic_load_explicit(&t->index, memory_order_acquire), sig, words, hash, &hit);
    return hit ? atomic_load_explicit(sl, memory_order_relaxed) : NULL;
}

/* Locked. Publish m in x, which has room. */
static void index_put(sj_memo_index *x, sj_memo_head *m) {
    bool hit;
    _Atomic(sj_memo_head *) *sl = index_probe(x, m->key, m->key_words, m->hash, &hit);
    if (hit) return;
    x->n++;
    atomic_store_explicit(sl, m, memory_order_release);
}

/* Locked. Publish m in the table's index, first growing it if 3/4 full.
 * Returns false when there is no memory for a bigger index. */
static bool index_add(sj_table *t, sj_memo_head *m) {
    sj_memo_index *x = atomic_load_explicit(&t->index, memory_order_relaxed);
    if ((x->n + 1) * 4 > x->cap * 3) {
        sj_memo_index *big = index_new(2 * x->cap);
        if (!big) return false;
        big->older = x;
        for (size_t i = 0; i < x->cap; i++) {
            sj_memo_head *o = atomic_load_explicit(&x->slot[i], memory_order_relaxed);
            if (o) index_put(big, o);
        }
        atomic_store_explicit(&t->index, big, memory_order_release);
        x = big;
    }
    index_put(x, m);
    return true;
}

sj_guarded *sj_table_match(sj_table *t, const sj_tensor *in, int64_t *sym_vals, sj_guard_failure *fails,
                           int max_fails, int *n_fails) {
    int nf = 0;
    for (sj_guarded *e = atomic_load_explicit(&t->entries, memory_order_acquire); e; e = e->next) {
        if (atomic_load_explicit(&e->retired, memory_order_relaxed)) continue;
        sj_guard_failure *f = fails && nf < max_fails ? &fails[nf] : NULL;
        if (sj_guard_check(e->guards, in, sym_vals, f)) {
            if (n_fails) *n_fails = nf;
            return e;
        }
        if (f) nf++;
    }
    if (n_fails) *n_fails = nf;
    return NULL;
}

sj_memo_head *sj_table_memoize(sj_table *t, const int64_t *sig, int words, unsigned hash, sj_guarded *e,
                               const int64_t *sym_vals) {
    size_t key_bytes = (size_t)words * sizeof(int64_t);
    /* the owner's item, then the key, then the symbol values */
    size_t at = (t->items->memo_size + sizeof(int64_t) - 1) / sizeof(int64_t) * sizeof(int64_t);
    sj_memo_head *m = NULL;
    pthread_mutex_lock(&t->lock);
    HASH_FIND_BYHASHVALUE(hh, t->memo, sig, (unsigned)key_bytes, hash, m);
    if (!m && t->n_memo < SJ_MEMO_MAX) {
        m = sj_calloc(1, at + key_bytes + (size_t)e->n_syms * sizeof(int64_t));
        if (m) {
            int64_t *key = (int64_t *)((char *)m + at);
            m->hash = hash;
            m->entry = e;
            m->key_words = words;
            memcpy(key, sig, key_bytes);
            m->key = key;
            m->syms = key + words;
            if (e->n_syms) memcpy(m->syms, sym_vals, (size_t)e->n_syms * sizeof(int64_t));
            if (t->items->memo_init) t->items->memo_init(m);
            /* into the owning hash first: the index is read without the
             * lock, so nothing is taken back out of it */
            HASH_ADD_KEYPTR_BYHASHVALUE(hh, t->memo, m->key, (unsigned)key_bytes, hash, m);
            bool added = m->hh.tbl != NULL; /* NULL: uthash had no memory */
            if (added && !index_add(t, m)) {
                HASH_DELETE(hh, t->memo, m);
                added = false;
            }
            if (added) {
                t->n_memo++;
            } else { /* no memory for the hash or the index: not memoised, as when calloc fails */
                if (t->items->memo_release) t->items->memo_release(t->items_ctx, m);
                free(m);
                m = NULL;
            }
        }
    }
    pthread_mutex_unlock(&t->lock);
    return m;
}

void sj_table_publish(sj_table *t, sj_guarded *e) {
    e->next = atomic_load_explicit(&t->entries, memory_order_relaxed);
    atomic_store_explicit(&t->entries, e, memory_order_release);
    atomic_fetch_add(&t->n_entries, 1);
}
