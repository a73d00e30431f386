/* The per-function table of guarded entries.
 *
 * An entry is one trace: its graph, its guard set, and counters. Entries
 * form a list, newest first, published with an atomic store and walked
 * without a lock (entries are immutable once published, except their atomic
 * counters, and live until the table is destroyed).
 *
 * In front of the guard sets sits the memo: from an exact input signature
 * to the entry that serves it and the symbol values it binds, so that a
 * signature seen before costs one hash and one compare. Its items are
 * owned by a uthash table, grown under the memo lock; calls look them up
 * without a lock, in a read index (sj_memo_index) published beside it.
 *
 * Lock order: the function's trace lock, then the memo lock.
 */
#ifndef SJ_TABLE_H
#define SJ_TABLE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "base/alloc.h"
/* uthash's default on a failed allocation is exit(-1): here a failed add
 * leaves the item out (its hh.tbl NULL) and the caller goes on without it;
 * its allocations go through the fault-injection point. */
#define HASH_NONFATAL_OOM 1
#define uthash_malloc(sz) sj_malloc(sz)
#include <uthash.h>

#include "guards/guard.h"
#include "jit/compile.h"
#include "jit/ir/graph.h"
#include "base/shard.h"
#include "specialize/fusion.h"

/* An input signature, packed as int64 words: per input, one word of
 * dtype | rank << 8 | device << 16, then its sizes, then its strides. */
#define SJ_SIG_WORDS_MAX (SJ_MAX_INPUTS * (1 + 2 * SJ_MAX_RANK))
/* Symbols of one trace: at most one per input size. */
#define SJ_MAX_SYMS (SJ_MAX_INPUTS * SJ_MAX_RANK)
/* Exact signatures memoised per function; past it, guard sets serve. */
#define SJ_MEMO_MAX 4096
/* CUDA graphs kept per signature (one per set of caller buffers). */
#define SJ_MEMO_GRAPHS 4

typedef struct sj_entry {
    struct sj_entry *next; /* older entry */
    int id;                /* 0, 1, ... in creation order */
    sj_graph *g;
    sj_guard_set *guards;
    int n_syms;
    uint64_t pinned_syms;  /* symbols (the first 64) its trace tied alone to a constant */
    bool symbolic;         /* some size is a symbol */
    bool bucketed;         /* some size is a bucket */
    bool fallback;         /* made past the recompile limit */
    char what[128];        /* "symbolic in x.size(0)", "static", ... */
    char reason[1024];     /* why it was traced */
    sj_counter calls;      /* sharded: every call of the entry adds one */
    _Atomic size_t arena_hint;
    _Atomic bool hot;      /* reached the hot threshold */
    sj_fplan *plan;        /* fused plan; NULL: eager only */
    sj_ctarget ct;         /* the plan compiled (symbolic form; specialized if no symbols) */
    int64_t created_ns;
    /* eager calls' time (ns) and count, for the compile queue's value */
    _Atomic uint64_t eager_ns, eager_timed;
    /* Set when learned buckets replace the ones it was traced for
     * (jit/learn.c): shapes it memoised keep it; sj_table_match skips it,
     * so new shapes are traced under the new buckets. */
    _Atomic bool retired;
} sj_entry;

/* One exact signature -> its entry and symbol values. */
typedef struct sj_memo {
    UT_hash_handle hh;
    unsigned hash;         /* sj_sig_hash of the key */
    sj_entry *entry;
    /* Calls of this shape: counted here up to the specialize threshold,
     * then in calls_hot, a sharded counter made when the shape crosses it
     * (a per-call write to one line would bounce it between the cores of
     * threads calling the shape at once); sj_memo_calls sums the two. */
    _Atomic uint64_t calls;
    _Atomic(sj_counter *) calls_hot;
    _Atomic bool hot;      /* marked for a specialized compile */
    sj_ctarget ct;         /* the entry's plan specialized to this shape */
    /* The memory budget (jit/budget.h): the last call's tick of the
     * runtime's clock (ms), written only when it changed; demotions so
     * far, and the shape's calls at the latest (written under the
     * compiler lock). */
    _Atomic uint32_t used_tick;
    _Atomic int demotions;
    _Atomic uint64_t demoted_calls;
    /* CUDA graphs of this signature's fused calls (jit/graphs.c), filled
     * in order, each kept until the table is destroyed. */
    _Atomic(void *) graphs[SJ_MEMO_GRAPHS];
    /* Buffer sets of calls no graph served: a hash with a count in its low
     * 6 bits (jit/graphs.c) */
    _Atomic uint64_t graph_seen[SJ_MEMO_GRAPHS];
    _Atomic bool graph_busy;     /* a capture is queued or under way */
    _Atomic bool graph_off;      /* a capture failed: the signature is not captured again */
    int key_words;
    int64_t *syms;         /* entry->n_syms values, after the key */
    int64_t key[];
} sj_memo;

/* The memo's read index: open addressing, linear probing, item pointers.
 * A slot is written once (NULL -> item), under the memo lock, with a
 * release store; lookups take no lock (an acquire load a slot probed) and
 * slots never change after. 3/4 full, the index is copied into one twice
 * the size, published with a release store; the old one stays (`older`)
 * until the table is destroyed, since a lookup may still be reading it.
 * A read lock here cost every call two atomic writes to one shared line,
 * which bounced between the cores of threads calling at once. */
typedef struct sj_memo_index {
    size_t cap, n;
    struct sj_memo_index *older;
    _Atomic(sj_memo *) slot[];
} sj_memo_index;

typedef struct sj_table {
    pthread_mutex_t lock; /* the memo: its items (uthash) and index writes */
    sj_memo *memo;
    int n_memo;
    _Atomic(sj_memo_index *) index;
    _Atomic(sj_entry *) entries; /* newest first */
    _Atomic int n_entries;       /* written under the function's trace lock */
    /* Frees a memo's CUDA graphs at destroy (set by the owner; NULL: none). */
    void (*graph_free)(void *ctx, void *graph);
    void *graph_ctx;
} sj_table;

int sj_table_init(sj_table *t);
/* Frees every memo item and entry (graphs and guard sets included). */
void sj_table_destroy(sj_table *t);

/* Pack a signature; returns the number of words. */
int sj_sig_pack(const sj_tensor *in, int n, int64_t *sig);
unsigned sj_sig_hash(const int64_t *sig, int words);

/* Count a call of m's shape, in the caller's shard. Returns the count while
 * it is kept in one word: up to shard_at, where one call moves it to a
 * sharded counter (if memory allows); 0 once it is sharded. */
uint64_t sj_memo_count(sj_memo *m, unsigned shard, uint64_t shard_at);

/* Calls counted for a memo item (exact when no call is in flight). */
static inline uint64_t sj_memo_calls(sj_memo *m) {
    sj_counter *h = atomic_load_explicit(&m->calls_hot, memory_order_acquire);
    return atomic_load_explicit(&m->calls, memory_order_relaxed) + (h ? sj_counter_sum(h) : 0);
}

/* m's symbol values as "s0=12, s1=64" (at most n bytes). */
void sj_memo_shape(const sj_memo *m, char *buf, size_t n);

/* The memo item for an exact signature, or NULL. Lock-free. */
sj_memo *sj_table_find(sj_table *t, const int64_t *sig, int words, unsigned hash);

/* The newest entry (not retired) whose guards pass, with its symbol values
 * in sym_vals; NULL if none. With fails non-NULL, records the first failing guard of
 * each entry tried (up to max_fails) and sets *n_fails. Lock-free. */
sj_entry *sj_table_match(sj_table *t, const sj_tensor *in, int64_t *sym_vals, sj_guard_failure *fails,
                         int max_fails, int *n_fails);

/* Memoise signature -> (e, sym_vals). Returns the item (an existing one if
 * another thread got there first), or NULL when the memo is full or memory
 * ran out (the call is still served; the signature just is not memoised). */
sj_memo *sj_table_memoize(sj_table *t, const int64_t *sig, int words, unsigned hash, sj_entry *e,
                          const int64_t *sym_vals);

/* Publish a new entry at the head of the list (caller holds the function's
 * trace lock). */
void sj_table_publish(sj_table *t, sj_entry *e);

/* Free an entry that was never published. */
void sj_entry_free(sj_entry *e);

#endif /* SJ_TABLE_H */
