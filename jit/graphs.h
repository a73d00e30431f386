/* Graphs of fused calls (graphs.c): the device-neutral replay policy, the
 * capture jobs the compile queue runs, and the graph memory budget, over
 * the device table's graph slots (kernels/device.h). A runtime whose
 * device has no graph slots, or with cuda_graphs 0, asks for nothing. */
#ifndef SJ_GRAPHS_H
#define SJ_GRAPHS_H

#include <stdbool.h>

#include "jit/compile.h"
#include "jit/exec.h"
#include "jit/fn.h"

/* A signature's call with the same buffers as SJ_GRAPH_AFTER - 1 unserved
 * calls before it asks for a capture (at most 63): about the calls whose
 * savings pay for one (see graphs.c). */
#define SJ_GRAPH_AFTER 48

/* Before a fused call of memo item m (NULL: none) with code cd (x's
 * ops_ctx the call's context): launch its graph when there is one for its
 * buffers and stream (SJ_GRAPH_SERVED, *st the call's status). Otherwise
 * the call runs kernel by kernel, and SJ_GRAPH_COUNT asks for
 * sj_graphs_note after it succeeded (SJ_GRAPH_NO: never a graph, e.g.
 * outputs allocated by the call). (A captured graph with a gather reads
 * its flag after a synchronous launch and fails the call with SJ_EINDEX,
 * as kernel-by-kernel calls do.) */
typedef enum sj_graph_use { SJ_GRAPH_NO, SJ_GRAPH_COUNT, SJ_GRAPH_SERVED } sj_graph_use;
sj_graph_use sj_graphs_call(sj_fn *fn, sj_memo *m, const sj_exec *x, const sj_compiled *cd, sj_status *st);
/* Count that successful call; at SJ_GRAPH_AFTER (and once a failed
 * capture's penalty has passed), queue its capture on the compile queue
 * (a JOB_CAPTURE job). Returns NULL, or, where jobs are not queued (sync
 * compile mode), the capture for the caller to run itself with
 * sj_graphs_capture_run once its call is over (out of sj_budget_enter's
 * mark: a capture may wait for calls to leave evicted graphs). */
void *sj_graphs_note(sj_fn *fn, sj_memo *m, const sj_exec *x, const struct sj_fplan *plan, const sj_compiled *cd);
/* A warm-up's successful run: queue its entry's bucket graph at once
 * (cfg.bucket_graphs), and with buffers (the run was on the caller's
 * buffers) the capture of this call's buffers, whatever the counts;
 * within the same limits and back-off. Returns as sj_graphs_note. */
void *sj_graphs_request(sj_fn *fn, sj_memo *m, const sj_exec *x, const struct sj_fplan *plan, const sj_compiled *cd,
                        bool buffers);

/* A capture job (arg: sj_graphs_note's): capture, fit it under
 * graph_max_bytes (evicting the least recently replayed graphs of fn),
 * publish, or fail and back off. No lock may be held; the thread must
 * not be inside sj_budget_enter/leave. */
void sj_graphs_capture_run(sj_fn *fn, void *arg);
/* A capture job dropped unrun (its function cancelled): its reservations
 * given back. Takes no lock (called under the compiler lock). */
void sj_graphs_capture_drop(sj_fn *fn, void *arg);

/* Free a memo item's graph (ctx: the runtime; jit/entry.c, at the table's destroy). */
void sj_graphs_free(void *ctx, void *graph);
/* Free an entry's bucket graph (jit/entry.c, with the entry). */
void sj_graphs_free_bucket(void *graph);

#endif
