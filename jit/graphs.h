/* Graphs of fused calls (graphs.c): the device-neutral replay policy and
 * the runtime's graph thread, over the device table's graph slots
 * (kernels/device.h). A runtime whose device has no graph slots, or with
 * cuda_graphs 0, has no grapher and these ask for nothing. */
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
/* Count that successful call; at SJ_GRAPH_AFTER, queue its capture on the
 * graph thread. */
void sj_graphs_note(sj_fn *fn, sj_memo *m, const sj_exec *x, const struct sj_fplan *plan, const sj_compiled *cd);
/* Queue the capture of this successful call's buffers at once, whatever
 * the count (a warm-up's run with the caller's buffers); within the same
 * limits. False when no capture can be asked for (no graphs, a failed
 * capture of this signature before, an output allocated by the call). */
bool sj_graphs_request(sj_fn *fn, sj_memo *m, const sj_exec *x, const struct sj_fplan *plan, const sj_compiled *cd);
/* Free a memo item's graph (ctx: the runtime; jit/entry.c, at the table's destroy). */
void sj_graphs_free(void *ctx, void *graph);

/* The runtime's graph thread, which captures and instantiates the graphs
 * sj_graphs_call asks for (rt->grapher). Destroy after every function. */
typedef struct sj_grapher sj_grapher;
sj_status sj_grapher_create(sj_runtime *rt);
void sj_grapher_destroy(sj_runtime *rt);
/* Drop fn's queued captures and wait for a running one (before its table
 * goes); or wait for all of them (sj_fn_wait_idle). */
void sj_graphs_cancel_fn(sj_runtime *rt, sj_fn *fn);
void sj_graphs_wait_fn(sj_runtime *rt, sj_fn *fn);

#endif
