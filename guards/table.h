/* The per-function table of guarded entries: which entry serves an input.
 *
 * The table knows of an entry only its guard-level head (sj_guarded: the
 * guard program, its symbol count, the retired mark, the link to the next
 * older one) and of a memo item only its head (sj_memo_head: the exact
 * signature, its entry's head, the symbol values). The engine's entry and
 * memo item (jit/entry.h: the plan, compile targets, counters, graphs)
 * embed these heads as their first member, so the engine moves between the
 * two with a cast (no pointer to follow), and the table allocates memo
 * items of the owner's size (sj_table_items).
 *
 * Entries form a list, newest first, published with an atomic store and
 * walked without a lock (a head is immutable once published, but for its
 * retired mark; entries live until the table is destroyed).
 *
 * In front of the guard programs sits the memo: from an exact input
 * signature to the entry that serves it and the symbol values it binds, so
 * that a signature seen before costs one hash and one compare. Its items
 * are owned by a uthash table, grown under the memo lock; calls look them
 * up without a lock, in a read index (sj_memo_index) published beside it.
 *
 * Lock order: the function's trace lock, then the memo lock.
 */
#ifndef SJ_TABLE_H
#define SJ_TABLE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/alloc.h"
/* uthash's default on a failed allocation is exit(-1): here a failed add
 * leaves the item out (its hh.tbl NULL) and the caller goes on without it;
 * its allocations go through the fault-injection point. */
#define HASH_NONFATAL_OOM 1
#define uthash_malloc(sz) sj_malloc(sz)
#include <uthash.h>

#include "guards/guard.h"

/* An input signature, packed as int64 words: per input, one word of
 * dtype | rank << 8 | device << 16, then its sizes, then its strides. */
#define SJ_SIG_WORDS_MAX (SJ_MAX_INPUTS * (1 + 2 * SJ_MAX_RANK))
/* Symbols of one trace: at most one per input size. */
#define SJ_MAX_SYMS (SJ_MAX_INPUTS * SJ_MAX_RANK)
/* Exact signatures memoised per function; past it, guard sets serve. */
#define SJ_MEMO_MAX 4096

/* An entry as the table sees it: the first member of the engine's entry. */
typedef struct sj_guarded {
    struct sj_guarded *next; /* older entry */
    sj_guard_set *guards;
    int n_syms;              /* symbols its guards bind */
    /* Set when learned buckets replace the ones it was traced for
     * (jit/learn.c): shapes it memoised keep it; sj_table_match skips it,
     * so new shapes are traced under the new buckets. */
    _Atomic bool retired;
} sj_guarded;

/* One exact signature -> its entry and symbol values: the first member of
 * the engine's memo item. What a memo hit reads comes first. */
typedef struct sj_memo_head {
    unsigned hash;         /* sj_sig_hash of the key */
    int key_words;
    const int64_t *key;    /* in the item's allocation, after the owner's item */
    sj_guarded *entry;
    int64_t *syms;         /* entry->n_syms values, after the key */
    UT_hash_handle hh;
} sj_memo_head;

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
    _Atomic(sj_memo_head *) slot[];
} sj_memo_index;

/* What the owner's items are: the table allocates memo items of
 * memo_size bytes (zeroed; sj_memo_head first), calls memo_init on a new
 * one before it is published and memo_release before it frees one, and
 * entry_free for each entry at destroy. Any hook may be NULL. */
typedef struct sj_table_items {
    size_t memo_size;
    void (*memo_init)(sj_memo_head *m);
    void (*memo_release)(void *ctx, sj_memo_head *m);
    void (*entry_free)(sj_guarded *e);
} sj_table_items;

typedef struct sj_table {
    pthread_mutex_t lock; /* the memo: its items (uthash) and index writes */
    sj_memo_head *memo;
    int n_memo;
    _Atomic(sj_memo_index *) index;
    _Atomic(sj_guarded *) entries; /* newest first */
    _Atomic int n_entries;         /* written under the function's trace lock */
    const sj_table_items *items;
    void *items_ctx;               /* memo_release's ctx */
} sj_table;

/* items: the owner's (borrowed, outliving the table); ctx: memo_release's. */
int sj_table_init(sj_table *t, const sj_table_items *items, void *ctx);
/* Frees every memo item and entry (through the owner's hooks). */
void sj_table_destroy(sj_table *t);

/* Pack a signature; returns the number of words. */
int sj_sig_pack(const sj_tensor *in, int n, int64_t *sig);
unsigned sj_sig_hash(const int64_t *sig, int words);

/* The memo item for an exact signature, or NULL. Lock-free. */
sj_memo_head *sj_table_find(sj_table *t, const int64_t *sig, int words, unsigned hash);

/* The newest entry (not retired) whose guards pass, with its symbol values
 * in sym_vals; NULL if none. With fails non-NULL, records the first failing guard of
 * each entry tried (up to max_fails) and sets *n_fails. Lock-free. */
sj_guarded *sj_table_match(sj_table *t, const sj_tensor *in, int64_t *sym_vals, sj_guard_failure *fails,
                           int max_fails, int *n_fails);

/* Memoise signature -> (e, sym_vals). Returns the item (an existing one if
 * another thread got there first), or NULL when the memo is full or memory
 * ran out (the call is still served; the signature just is not memoised). */
sj_memo_head *sj_table_memoize(sj_table *t, const int64_t *sig, int words, unsigned hash, sj_guarded *e,
                               const int64_t *sym_vals);

/* Publish a new entry at the head of the list (caller holds the function's
 * trace lock). */
void sj_table_publish(sj_table *t, sj_guarded *e);

#endif /* SJ_TABLE_H */
