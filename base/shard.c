/* Per-thread shard indices (see shard.h). */
#include "base/shard.h"

#include <limits.h>

static _Atomic unsigned next_shard;
_Thread_local unsigned sj_shard_tls __attribute__((tls_model("initial-exec"))) = UINT_MAX;

unsigned sj_shard_assign(void) {
    return sj_shard_tls = atomic_fetch_add_explicit(&next_shard, 1, memory_order_relaxed) % SJ_SHARDS;
}
