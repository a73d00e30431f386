/* The engine's entries and memo items: what a trace and an exact shape
 * carry beyond their guards.
 *
 * An entry is one trace: its graph, its fused plan and the plan's compile
 * target (the symbolic tier, or the specialized one when it has no
 * symbols), counters, and its guard-level head (guards/table.h:
 * sj_guarded: the guard program, the symbol count, the retired mark), the
 * first member, through which the function's table (sj_table) matches it.
 * A memo item is one exact signature of an entry: its head (sj_memo_head:
 * the key, the entry, the symbol values) first, then the shape's call
 * count, its specialized compile target, its memory-budget stamps and its
 * CUDA graphs. The table allocates the items (sj_entry_items says their
 * size and how they start and end); the engine moves from a head to its
 * item with a cast (the head is at offset 0: no pointer to follow).
 *
 * Entries are immutable once published (sj_entry_publish), but for their
 * atomic fields, and live until the function is destroyed, as memo items
 * do.
 */
#ifndef SJ_ENTRY_H
#define SJ_ENTRY_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/shard.h"
#include "guards/table.h"
#include "jit/compile.h"
#include "jit/ir/graph.h"
#include "specialize/fusion.h"

/* A shape's (or a static entry's) weight in the window of the size
 * histogram that buckets are learned from (jit/learn.c), under the memo
 * lock: its calls when the window was last brought up to date, and their
 * decayed weight then. */
typedef struct sj_hist_window {
    uint64_t seen;
    double w;
} sj_hist_window;

/* CUDA graphs kept per signature (one per set of caller buffers). */
#define SJ_MEMO_GRAPHS 4

typedef struct sj_entry {
    sj_guarded head;       /* first: the table's view (guards, n_syms, retired, next) */
    int id;                /* 0, 1, ... in creation order */
    sj_graph *g;
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
    /* A static entry's weight in the learning histogram's window and its
     * calls when it was last brought up to date (jit/learn.c; under the
     * memo lock: the one field of an entry written after it is published
     * without an atomic) */
    sj_hist_window win;
    /* A CUDA graph that serves every size of the entry's bucket
     * (jit/graphs.c, cfg.bucket_graphs): published once by its capture
     * job, freed with the entry; the fused calls it has not served since
     * (a racy count); a capture queued or under way; never again (not
     * eligible, or its capture failed). */
    _Atomic(void *) bgraph;
    _Atomic uint32_t bgraph_seen;
    _Atomic bool bgraph_busy, bgraph_off;
} sj_entry;

/* One exact signature -> its entry and symbol values (the head), and what
 * the engine keeps per shape. */
typedef struct sj_memo {
    sj_memo_head head;     /* first: the table's view (key, entry, syms) */
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
    /* CUDA graphs of this signature's fused calls (jit/graphs.c): a new
     * one takes an empty slot; each kept until the table is destroyed or
     * the graph budget evicts it (emptying its slot). */
    _Atomic(void *) graphs[SJ_MEMO_GRAPHS];
    /* Buffer sets of calls no graph served: a hash with a count in its low
     * 6 bits (jit/graphs.c) */
    _Atomic uint64_t graph_seen[SJ_MEMO_GRAPHS];
    _Atomic bool graph_busy;     /* a capture is queued or under way */
    /* Captures' back-off (jit/graphs.c, written by the capture job alone):
     * failed captures so far, and when a call may ask for one again on
     * the runtime's clock (0: at once); graph_off: blacklisted, never
     * captured again (the one flag a call reads). */
    _Atomic int graph_fails;
    _Atomic int64_t graph_retry_ns;
    _Atomic bool graph_off;
    sj_hist_window win;          /* a symbolic entry's shape in the learning histogram (memo lock) */
} sj_memo;

_Static_assert(offsetof(sj_entry, head) == 0, "an entry starts with its guard-level head");
_Static_assert(offsetof(sj_memo, head) == 0, "a memo item starts with its head");

/* The function table's items (sj_table_init's; ctx: the runtime, whose
 * device frees a memo item's graphs). */
extern const sj_table_items sj_entry_items;

/* -- From the table's heads to the engine's items (casts) -- */

static inline sj_entry *sj_entry_of(sj_guarded *h) { return (sj_entry *)h; }
static inline sj_memo *sj_memo_of(sj_memo_head *h) { return (sj_memo *)h; }
/* The entry that serves m. */
static inline sj_entry *sj_memo_entry(const sj_memo *m) { return sj_entry_of(m->head.entry); }
/* The published entries, newest first: the first, then each one's next
 * older (NULL at the end). Lock-free. */
static inline sj_entry *sj_entries(sj_table *t) {
    return sj_entry_of(atomic_load_explicit(&t->entries, memory_order_acquire));
}
static inline sj_entry *sj_entry_next(const sj_entry *e) { return sj_entry_of(e->head.next); }
/* The memo's items, in the owning hash's order: under the memo lock. */
static inline sj_memo *sj_memos(sj_table *t) { return sj_memo_of(t->memo); }
static inline sj_memo *sj_memo_next(const sj_memo *m) { return (sj_memo *)m->head.hh.next; }

/* -- The table's operations on the engine's items (guards/table.h) -- */

/* The memo item for an exact signature, or NULL. Lock-free. */
static inline sj_memo *sj_memo_find(sj_table *t, const int64_t *sig, int words, unsigned hash) {
    return sj_memo_of(sj_table_find(t, sig, words, hash));
}
/* The newest entry (not retired) whose guards pass (sj_table_match). */
static inline sj_entry *sj_entry_match(sj_table *t, const sj_tensor *in, int64_t *sym_vals, sj_guard_failure *fails,
                                       int max_fails, int *n_fails) {
    return sj_entry_of(sj_table_match(t, in, sym_vals, fails, max_fails, n_fails));
}
/* Memoise signature -> (e, sym_vals) (sj_table_memoize: NULL when not
 * memoised). */
static inline sj_memo *sj_memo_add(sj_table *t, const int64_t *sig, int words, unsigned hash, sj_entry *e,
                                   const int64_t *sym_vals) {
    return sj_memo_of(sj_table_memoize(t, sig, words, hash, &e->head, sym_vals));
}
/* Publish a new entry (caller holds the function's trace lock). */
static inline void sj_entry_publish(sj_table *t, sj_entry *e) { sj_table_publish(t, &e->head); }

/* -- Entries and memo items -- */

/* Free an entry that was never published (the table frees published ones). */
void sj_entry_free(sj_entry *e);

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

#endif /* SJ_ENTRY_H */
