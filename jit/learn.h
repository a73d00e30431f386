/* Buckets learned while serving (cfg.learn_every, sj_fn_learn_auto): the
 * call path counts new exact shapes; the every-th (or, with decay, the
 * calls of a half-life) queues a learning job on the compile queue (sj_compiler_request_learn), which the background
 * worker runs as sj_fn_learn_buckets with apply set (jit/learn.c). */
#ifndef SJ_JIT_LEARN_H
#define SJ_JIT_LEARN_H

#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>

#include "jit/fn.h"

/* At sj_fn_create: the cfg.learn_every row, if any. */
void sj_learn_init(sj_fn *fn);

/* A learning is due: queue it unless one is queued (not inline). */
void sj_learn_due(sj_fn *fn);

/* A call served a new exact shape (memoised on its miss): one relaxed load
 * while nothing is learned; else one atomic add, and a queue push every
 * `every` shapes. */
static inline void sj_learn_note_shape(sj_fn *fn) {
    int64_t at = atomic_load_explicit(&fn->learn_next_at, memory_order_relaxed);
    if (at == INT64_MAX) return;
    if (atomic_fetch_add_explicit(&fn->learn_shapes, 1, memory_order_relaxed) + 1 >= at) sj_learn_due(fn);
}

/* The calls the function has served from its memo (the shards' memo
 * hits summed): the clock of learnings due by calls. */
static inline int64_t sj_learn_calls(sj_fn *fn) {
    uint64_t n = 0;
    for (int k = 0; k < SJ_SHARDS; k++) n += atomic_load_explicit(&fn->hot[k].memo_hits, memory_order_relaxed);
    return (int64_t)n;
}

/* A memo hit, the hits-th of its shard: on every 64th, while a learning
 * with decay may come due by calls (cfg.learn_half_life), the shards'
 * hits are summed and a learning queued once they pass the least row's
 * calls_at. Else one relaxed load; nothing on the other 63. */
static inline void sj_learn_note_hit(sj_fn *fn, uint64_t hits) {
    if (hits & 63) return;
    int64_t at = atomic_load_explicit(&fn->learn_calls_at, memory_order_relaxed);
    if (at == INT64_MAX || sj_learn_calls(fn) < at) return;
    sj_learn_due(fn);
}

/* The learning job: every row that is due learns its dimensions and swaps
 * the edges in. No lock held by the caller (a compile worker, or the
 * calling thread in sync/off mode). */
void sj_learn_run(sj_fn *fn);

/* sj_fn_explain's lines (trace_lock held). */
void sj_learn_explain(const sj_fn *fn, FILE *out);

#endif
