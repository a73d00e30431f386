/* The fault-injection point of host allocations (see alloc.h). */
#include "base/alloc.h"

atomic_int sj_fault_armed;
static atomic_int countdown, persistent, hits, calls;

void sj_fault_set(int n, int persist) {
    atomic_store(&countdown, n > 0 ? n : 0);
    atomic_store(&persistent, persist);
    atomic_store(&hits, 0);
    atomic_store(&calls, 0);
    atomic_store(&sj_fault_armed, n > 0);
}

int sj_fault_step(void) {
    atomic_fetch_add(&calls, 1);
    int left = atomic_load(&countdown);
    if (left <= 0) return 0; /* disarmed meanwhile */
    if (left > 1) {
        atomic_fetch_sub(&countdown, 1);
        return 0;
    }
    atomic_fetch_add(&hits, 1);
    if (!atomic_load(&persistent)) {
        atomic_store(&countdown, 0);
        atomic_store(&sj_fault_armed, 0);
    }
    return 1;
}

int sj_fault_hits(void) { return atomic_load(&hits); }
int sj_fault_calls(void) { return atomic_load(&calls); }
