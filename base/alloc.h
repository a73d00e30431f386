/* Host allocation inside the library, with one fault-injection point
 * (SQLite's sqlite3FaultSim): every malloc, calloc, realloc, strdup and
 * aligned_alloc of the library goes through these wrappers, so a test can
 * make the Nth one fail (sj_fault_set) and check that every public path
 * reports SJ_ENOMEM, frees what it had built, and works again once memory
 * is back. Off, a wrapper costs one relaxed atomic load. */
#ifndef SJ_BASE_ALLOC_H
#define SJ_BASE_ALLOC_H

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* Test hook (tests/test_fault.c; not exported from the shared library):
 * countdown N > 0 makes the Nth host allocation from now fail, and with
 * persistent every one after it too; countdown 0 turns faults off. */
void sj_fault_set(int countdown, int persistent);
/* Allocations that failed by injection since the last sj_fault_set. */
int sj_fault_hits(void);
/* Allocations that asked since the last sj_fault_set (whether they failed). */
int sj_fault_calls(void);

extern atomic_int sj_fault_armed; /* nonzero while a countdown is set */
/* True when this allocation must fail (armed only). */
int sj_fault_step(void);

static inline int sj_fault_sim(void) {
    return atomic_load_explicit(&sj_fault_armed, memory_order_relaxed) && sj_fault_step();
}

static inline void *sj_malloc(size_t n) { return sj_fault_sim() ? NULL : malloc(n); }
static inline void *sj_calloc(size_t n, size_t s) { return sj_fault_sim() ? NULL : calloc(n, s); }
static inline void *sj_realloc(void *p, size_t n) { return sj_fault_sim() ? NULL : realloc(p, n); }
static inline char *sj_strdup(const char *s) { return sj_fault_sim() ? NULL : strdup(s); }
static inline char *sj_strndup(const char *s, size_t n) { return sj_fault_sim() ? NULL : strndup(s, n); }
static inline void *sj_aligned_alloc(size_t a, size_t n) { return sj_fault_sim() ? NULL : aligned_alloc(a, n); }

#endif
