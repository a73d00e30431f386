/* The call path's pieces that warm-up (jit/warmup.c) shares with sj_call
 * (jit/call.c): finding or tracing the entry for a signature, and running
 * an entry once without counting a call. */
#ifndef SJ_CALL_H
#define SJ_CALL_H

#include <stdbool.h>

#include "jit/fn.h"

/* The entry that serves inputs (descriptors: their data is not read), as
 * sj_call finds it: the memo, else the guard sets, else a retrace under the
 * policy (which the trace also teaches, as a call's would); then the sizes
 * check and the memo. Counts no call, memo hit or guard evaluation.
 * sym_vals receives the entry's n_syms symbol values; *m the memo item
 * (NULL when not memoised); *transient as a call past the recompile limit:
 * the entry is not kept, and the caller frees it (sj_entry_free). Errors
 * are a call's (the trace's, SJ_ESHAPE for sizes, SJ_ELIMIT). Calls the
 * model function: a caller's thread only. */
sj_status sj_call_prepare(sj_fn *fn, const sj_tensor *inputs, int64_t *sym_vals, sj_memo **m, sj_entry **e,
                          bool *transient);

/* Run entry e (memo item m, may be NULL) once on inputs and outputs, as a
 * synchronous call would run it (fused when its code is ready, else
 * eagerly), without counting it as a call, never as a launch of a CUDA
 * graph; with capture (CUDA, m not NULL, every output given), the buffers
 * are queued for a graph capture at once (sj_graphs_request). *tier:
 * "eager", "fused symbolic" or "fused specialized". No user code runs. */
sj_status sj_call_warm_run(sj_fn *fn, sj_memo *m, sj_entry *e, const int64_t *syms, const sj_tensor *inputs,
                           sj_tensor *outputs, int n_outputs, bool capture, const char **tier);

#endif
