/* Warm-up of a function before it serves (jit/warmup.c): the pieces the
 * function's lifecycle (jit/fn.c) calls. The public side is sj_fn_warmup,
 * sj_fn_ready, sj_fn_warmup_status and sj_fn_warmup_shape (shapejit.h). */
#ifndef SJ_WARMUP_H
#define SJ_WARMUP_H

#include "jit/fn.h"

/* sj_fn_destroy, in this order around the compiler's cancel: stop asks the
 * warm-up thread to start nothing new (its waits look at the flag every
 * 20 ms); join waits for it (after the compiles were cancelled, so that a
 * compile it waits for ends at once); free releases the records. */
void sj_warmup_stop(sj_fn *fn);
void sj_warmup_join(sj_fn *fn);
void sj_warmup_free(sj_fn *fn);

/* Wait until fn's latest warm-up, if any, is over (its callback returned);
 * SJ_ETIMEOUT after timeout_ms (< 0: no limit). sj_fn_wait_idle. */
sj_status sj_warmup_wait(sj_fn *fn, int timeout_ms);

/* cfg.compile_ahead: entry e of a bucketed dimension just got hot on a
 * call of `inputs` (on that caller's thread, no lock held): trace the next
 * bucket up and queue its compile (jit/warmup.c). */
void sj_warmup_ahead(sj_fn *fn, const sj_entry *e, const sj_tensor *inputs);

/* One line for sj_fn_explain ("" when fn was never warmed). */
void sj_warmup_explain(sj_fn *fn, FILE *out);

#endif
