/* Per-thread shard indices (see shard.h). */
#include "jit/shard.h"

#include <limits.h>

static _Atomic unsigned next_shard;
static _Thread_local unsigned my_shard = UINT_MAX;

unsigned sj_shard_index(void) {
    unsigned k = my_shard;
    if (k == UINT_MAX)
        my_shard = k = atomic_fetch_add_explicit(&next_shard, 1, memory_order_relaxed) % SJ_SHARDS;
    return k;
}
