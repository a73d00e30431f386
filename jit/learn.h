/* Buckets learned while serving (cfg.learn_every, sj_fn_learn_auto): the
 * call path counts new exact shapes; the every-th queues a learning job on
 * the compile queue (sj_compiler_request_learn), which the background
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

/* The learning job: every row that is due learns its dimensions and swaps
 * the edges in. No lock held by the caller (a compile worker, or the
 * calling thread in sync/off mode). */
void sj_learn_run(sj_fn *fn);

/* sj_fn_explain's lines (trace_lock held). */
void sj_learn_explain(const sj_fn *fn, FILE *out);

#endif
