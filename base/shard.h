/* Per-thread shards for what every call writes.
 *
 * A counter that every sj_call bumps, or a free-list slot that every call
 * takes and gives back, passes its cache line from core to core when
 * threads call at once: one w0 call took 190 ns alone and 550-730 ns with
 * a second thread calling the same function (2-vCPU AMD EPYC), and fewer
 * calls a second were served by two threads than by one. Such state is
 * split into SJ_SHARDS copies, each on a 64-byte line of its own; a thread
 * writes the copy its shard index names and readers sum them all. Threads
 * past SJ_SHARDS share shards (round robin), so shard writes stay atomic.
 */
#ifndef SJ_SHARD_H
#define SJ_SHARD_H

#include <stdatomic.h>
#include <stdint.h>

#define SJ_SHARDS 16

/* This thread's shard, in [0, SJ_SHARDS): assigned on the thread's first
 * call, round robin over the process. A call reads it a few times, so the
 * variable uses the initial-exec TLS model: one load, where the shared
 * library's default model calls __tls_get_addr each time (4 bytes of the
 * static TLS surplus glibc keeps for libraries loaded later). */
extern _Thread_local unsigned sj_shard_tls __attribute__((tls_model("initial-exec")));
unsigned sj_shard_assign(void);
static inline unsigned sj_shard_index(void) {
    unsigned k = sj_shard_tls;
    return k < SJ_SHARDS ? k : sj_shard_assign();
}

/* One counter, sharded. 64 bytes a shard (padded, not _Alignas: the
 * structs holding these come from calloc, which aligns to 16; shard i's
 * word still sits on a line no other shard's word shares). */
typedef struct sj_shard_u64 {
    _Atomic uint64_t v;
    char pad[56];
} sj_shard_u64;

typedef struct sj_counter {
    sj_shard_u64 s[SJ_SHARDS];
} sj_counter;

/* Add 1 in shard k (sj_shard_index()); returns nothing: the total is
 * sj_counter_sum's. */
static inline void sj_counter_inc(sj_counter *c, unsigned k) {
    atomic_fetch_add_explicit(&c->s[k].v, 1, memory_order_relaxed);
}

/* The total over every shard: exact once the adding threads are done, a
 * value between the totals before and after the adds in flight otherwise. */
static inline uint64_t sj_counter_sum(sj_counter *c) {
    uint64_t n = 0;
    for (int k = 0; k < SJ_SHARDS; k++) n += atomic_load_explicit(&c->s[k].v, memory_order_relaxed);
    return n;
}

#endif /* SJ_SHARD_H */
