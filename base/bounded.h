/* Work that cannot be interrupted, waited for with a bound.
 *
 * A library call that blocks inside code we do not own (NVRTC compiles in
 * the process and has no way to stop it) runs on a thread of its own; the
 * caller waits for it until a deadline or a cancel flag, then gives up and
 * returns. The abandoned thread finishes in the background and frees its
 * work itself. At most SJ_BOUNDED_MAX_ABANDONED such threads run at once
 * in a process: past that a new run is refused, so a call that hangs for
 * ever costs a bounded number of threads, not one per request. A process
 * that exits while abandoned runs are still going waits for them at exit,
 * at most SJ_BOUNDED_EXIT_WAIT_MS (the libraries they run in destroy their
 * state at exit, under the threads' feet). */
#ifndef SJ_BASE_BOUNDED_H
#define SJ_BASE_BOUNDED_H

#include <stdatomic.h>

#include "jit/shapejit.h"

#define SJ_BOUNDED_MAX_ABANDONED 4
#define SJ_BOUNDED_EXIT_WAIT_MS 60000

/* Run run(arg) on a new thread and wait for it.
 *  SJ_OK: run returned; the caller owns arg again (and frees it).
 *  SJ_ETIMEOUT: still running after timeout_ms (> 0; <= 0: no bound), or
 *      *cancel (NULL: never) became nonzero (polled every 10 ms): the caller
 *      must not touch arg again; the thread calls release(arg) when run
 *      returns. *cancelled tells which (may be NULL).
 *  SJ_EBACKEND: SJ_BOUNDED_MAX_ABANDONED abandoned runs are still going;
 *  SJ_ENOMEM: no thread. In both the caller still owns arg; nothing ran.
 * The message names `what`. Thread-safe. */
sj_status sj_run_bounded(const char *what, void (*run)(void *), void (*release)(void *), void *arg, int timeout_ms,
                         const atomic_int *cancel, int *cancelled);

/* Abandoned runs still going (tests, stats). */
int sj_bounded_abandoned(void);

/* Wait until no abandoned run is going, at most timeout_ms (<= 0: no
 * bound); returns how many still are. NVRTC registers destructors of its
 * own static state as it compiles, and exit() runs them under an abandoned
 * compile's feet (a crash seen on the H100): sj_runtime_destroy waits here,
 * within its compile timeout, so a program that destroys its runtime
 * before it exits is safe. */
int sj_bounded_wait_abandoned(int timeout_ms);

#endif
