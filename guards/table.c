/* The per-function table of guarded entries (see table.h). */
#include "guards/table.h"

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

int sj_table_init(sj_table *t) {
    t->memo = NULL;
    t->n_memo = 0;
    t->graph_free = NULL;
    t->graph_ctx = NULL;
    atomic_init(&t->n_entries, 0);
    atomic_init(&t->entries, NULL);
    return pthread_rwlock_init(&t->lock, NULL);
}

void sj_entry_free(sj_entry *e) {
    if (!e) return;
    sj_ctarget_release(&e->ct);
    sj_fplan_free(e->plan);
    sj_guard_free(e->guards);
    sj_graph_destroy(e->g);
    free(e);
}

void sj_table_destroy(sj_table *t) {
    sj_memo *m, *tmp;
    HASH_ITER(hh, t->memo, m, tmp) {
        HASH_DELETE(hh, t->memo, m);
        for (int i = 0; i < SJ_MEMO_GRAPHS; i++) { /* before the code they launch */
            void *g = atomic_load(&m->graphs[i]);
            if (g && t->graph_free) t->graph_free(t->graph_ctx, g);
        }
        sj_ctarget_release(&m->ct);
        free(m);
    }
    sj_entry *e = atomic_load(&t->entries);
    while (e) {
        sj_entry *next = e->next;
        sj_entry_free(e);
        e = next;
    }
    atomic_store(&t->entries, NULL);
    pthread_rwlock_destroy(&t->lock);
}

/* -- Lookup ---------------------------------------------------------------------- */

sj_memo *sj_table_find(sj_table *t, const int64_t *sig, int words, unsigned hash) {
    sj_memo *m = NULL;
    pthread_rwlock_rdlock(&t->lock);
    HASH_FIND_BYHASHVALUE(hh, t->memo, sig, (unsigned)((size_t)words * sizeof(int64_t)), hash, m);
    pthread_rwlock_unlock(&t->lock);
    return m;
}

sj_entry *sj_table_match(sj_table *t, const sj_tensor *in, int64_t *sym_vals, sj_guard_failure *fails,
                         int max_fails, int *n_fails) {
    int nf = 0;
    for (sj_entry *e = atomic_load_explicit(&t->entries, memory_order_acquire); e; e = e->next) {
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

sj_memo *sj_table_memoize(sj_table *t, const int64_t *sig, int words, unsigned hash, sj_entry *e,
                          const int64_t *sym_vals) {
    size_t key_bytes = (size_t)words * sizeof(int64_t);
    sj_memo *m = NULL;
    pthread_rwlock_wrlock(&t->lock);
    HASH_FIND_BYHASHVALUE(hh, t->memo, sig, (unsigned)key_bytes, hash, m);
    if (!m && t->n_memo < SJ_MEMO_MAX) {
        m = calloc(1, sizeof *m + key_bytes + (size_t)e->n_syms * sizeof(int64_t));
        if (m) {
            m->entry = e;
            sj_ctarget_init(&m->ct);
            m->key_words = words;
            memcpy(m->key, sig, key_bytes);
            m->syms = m->key + words;
            if (e->n_syms) memcpy(m->syms, sym_vals, (size_t)e->n_syms * sizeof(int64_t));
            HASH_ADD_KEYPTR_BYHASHVALUE(hh, t->memo, m->key, (unsigned)key_bytes, hash, m);
            t->n_memo++;
        }
    }
    pthread_rwlock_unlock(&t->lock);
    return m;
}

void sj_table_publish(sj_table *t, sj_entry *e) {
    e->next = atomic_load_explicit(&t->entries, memory_order_relaxed);
    atomic_store_explicit(&t->entries, e, memory_order_release);
    atomic_fetch_add(&t->n_entries, 1);
}
