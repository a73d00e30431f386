/* A jitted function: its entries (traced graphs) and the exact-signature
 * memo in front of them.
 *
 * Lock order: fn->trace_lock, then fn->memo_lock. Neither is held while a
 * graph executes. Entries are immutable once published (except their atomic
 * counters) and live until the function is destroyed, so a pointer found
 * under memo_lock stays valid after the lock is released.
 */
#ifndef SJ_FN_H
#define SJ_FN_H

#include <pthread.h>
#include <stdatomic.h>
#include <uthash.h>

#include "jit/graph.h"
#include "jit/pool.h"
#include "jit/runtime.h"

/* An input signature, packed as int64 words: per input, one word of
 * dtype | rank << 8 | device << 16, then its sizes, then its strides. */
#define SJ_SIG_WORDS_MAX (SJ_MAX_INPUTS * (1 + 2 * SJ_MAX_RANK))

typedef struct sj_entry {
    struct sj_entry *next; /* older entry */
    int id;                /* 0, 1, ... in creation order */
    sj_graph *g;
    int64_t *sig;          /* the signature first traced */
    int sig_words;
    _Atomic uint64_t calls;
    _Atomic size_t arena_hint;
} sj_entry;

/* A memo item: one exact signature -> the entry that serves it. */
typedef struct sj_memo {
    UT_hash_handle hh;
    sj_entry *entry;
    int64_t key[]; /* the signature; hh.keylen bytes */
} sj_memo;

typedef struct sj_fn_counters {
    _Atomic uint64_t calls, errors, eager_calls, traces, trace_errors, memo_hits;
} sj_fn_counters;

struct sj_fn {
    sj_runtime *rt;
    struct sj_fn *next_in_rt; /* runtime's list (rt->lock) */
    char *name;
    int n_inputs;
    sj_model_fn model;
    void *user;

    pthread_mutex_t trace_lock; /* one trace at a time; entry list writes */
    pthread_rwlock_t memo_lock; /* the memo table */
    sj_memo *memo;
    _Atomic(sj_entry *) entries; /* newest first */
    int n_entries;               /* under trace_lock */

    sj_pool pool;
    sj_fn_counters c;
};

#endif
