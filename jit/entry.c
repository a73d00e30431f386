/* The engine's entries and memo items (see entry.h). */
#include "jit/entry.h"

#include <stdio.h>
#include <stdlib.h>

#include "jit/graphs.h"

/* -- The table's items --------------------------------------------------------------- */

void sj_entry_free(sj_entry *e) {
    if (!e) return;
    void *bg = atomic_load(&e->bgraph);
    if (bg) sj_graphs_free_bucket(bg); /* before the code it launches */
    sj_ctarget_release(&e->ct);
    sj_fplan_free(e->plan);
    sj_guard_free(e->head.guards);
    sj_graph_destroy(e->g);
    free(e);
}

static void entry_free(sj_guarded *h) { sj_entry_free(sj_entry_of(h)); }

static void memo_init(sj_memo_head *h) { sj_ctarget_init(&sj_memo_of(h)->ct); }

static void memo_release(void *rt, sj_memo_head *h) {
    sj_memo *m = sj_memo_of(h);
    for (int i = 0; i < SJ_MEMO_GRAPHS; i++) { /* before the code they launch */
        void *g = atomic_load(&m->graphs[i]);
        if (g) sj_graphs_free(rt, g); /* (only a device with graph slots makes them) */
    }
    sj_ctarget_release(&m->ct);
    free(atomic_load(&m->calls_hot));
}

const sj_table_items sj_entry_items = {
    .memo_size = sizeof(sj_memo),
    .memo_init = memo_init,
    .memo_release = memo_release,
    .entry_free = entry_free,
};

/* -- Memo items ------------------------------------------------------------------------ */

void sj_memo_shape(const sj_memo *m, char *buf, size_t n) {
    size_t used = 0;
    buf[0] = '\0';
    for (int s = 0; s < m->head.entry->n_syms && used < n; s++)
        used += (size_t)snprintf(buf + used, n - used, "%ss%d=%lld", s ? ", " : "", s, (long long)m->head.syms[s]);
}

uint64_t sj_memo_count(sj_memo *m, unsigned shard, uint64_t shard_at) {
    sj_counter *h = atomic_load_explicit(&m->calls_hot, memory_order_acquire);
    if (h) {
        sj_counter_inc(h, shard);
        return 0;
    }
    uint64_t c = atomic_fetch_add_explicit(&m->calls, 1, memory_order_relaxed) + 1;
    if (c == shard_at) { /* this call alone sees it; freed with m */
        sj_counter *fresh = sj_calloc(1, sizeof *fresh);
        if (fresh) atomic_store_explicit(&m->calls_hot, fresh, memory_order_release);
    }
    return c;
}
