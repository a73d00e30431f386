/* Bucket edges learned from traffic: a cost model and an edge chooser.
 * Pure functions (no runtime state): sizes seen with their call counts in,
 * edges out. jit/learn.c builds the histogram from a function's memo and
 * swaps the edges in.
 *
 * The model. Sizes s_0 < s_1 < ... < s_{n-1} of one dimension were seen
 * with c_i calls each. A bucket list with edges b_0 < ... < b_{k-1} puts a
 * size s in the bucket (b_{j-1}, b_j] of the first edge b_j >= s. A call of
 * size s in a bucket with edge h costs
 *     call_us + size_us * w * (1 + symbolic_overhead if the bucket holds
 *                                  more than one size seen, else 1)
 * with w = h where the runtime pads each call to its bucket's edge (pad;
 * CUDA graphs replayed at the edge, a server that pads) and w = s where it
 * does not. A bucket that holds one size seen is counted as specialized:
 * shapejit specializes a bucket's hot shape past specialize_threshold. Each
 * bucket holding a size seen costs bucket_us once (its trace, compile and
 * the memory its code and arenas hold, as time over the horizon). The
 * counts are scaled to horizon_calls calls (0: as seen). The expected cost
 * per call is the total over the horizon's calls divided by their number.
 *
 * The chooser minimises it over edge lists of at most max_buckets edges, by
 * dynamic programming over the sorted distinct sizes: the best edges are
 * sizes seen (moving an edge down to the largest size seen below it never
 * costs more), and the last edge is the largest size seen (sizes past it
 * fall in the open bucket past the last edge). O(max_buckets * n^2) time,
 * O(max_buckets * n) memory. */
#ifndef SJ_BUCKET_LEARN_H
#define SJ_BUCKET_LEARN_H

#include <stdbool.h>
#include <stdint.h>

#include "jit/shapejit.h"
#include "shapes/bucket.h"

typedef struct sj_learn_model {
    double call_us;           /* fixed cost of a call, any size */
    double size_us;           /* cost of a call per unit of the dimension's size */
    double symbolic_overhead; /* extra fraction of size_us * w in a bucket of several sizes */
    bool pad;                 /* calls run at their bucket's edge */
    double bucket_us;         /* cost of one bucket (compile and memory) */
    double horizon_calls;     /* calls the counts are scaled to; 0: their sum */
    int max_buckets;          /* 1 .. SJ_BUCKET_MAX_BOUNDS */
} sj_learn_model;

/* Sort sizes (with their counts) and merge equal ones, in place; drops
 * sizes < 2 (always specialized) and zero counts. Returns the new count. */
int sj_learn_normalize(int64_t *sizes, uint64_t *counts, int n);

/* The expected cost per call of the buckets of spec over the sizes (sorted,
 * distinct, as sj_learn_normalize leaves them); *n_buckets: buckets holding
 * a size seen. A spec of kind SJ_BUCKET_NONE counts as one bucket of every
 * size (a symbolic dimension), padded to the largest. Sizes no bucket holds
 * (outside a profile) count as a bucket each. */
double sj_learn_cost_spec(const int64_t *sizes, const uint64_t *counts, int n, const sj_bucket_spec *spec,
                          const sj_learn_model *m, int *n_buckets);

/* The cost of an edge list (increasing, as sj_bucket_list takes). */
double sj_learn_cost_edges(const int64_t *sizes, const uint64_t *counts, int n, const int64_t *edges, int n_edges,
                           const sj_learn_model *m);

/* Choose at most m->max_buckets edges minimising the expected cost per call
 * (*cost, may be NULL), into edges (room for SJ_BUCKET_MAX_BOUNDS), *n_edges
 * of them. sizes sorted, distinct, >= 2, with counts > 0, n >= 1.
 * SJ_EINVAL (a bad model or input), SJ_ENOMEM. */
sj_status sj_learn_choose(const int64_t *sizes, const uint64_t *counts, int n, const sj_learn_model *m,
                          int64_t *edges, int *n_edges, double *cost);

/* SJ_EINVAL with a message for a model out of range. */
sj_status sj_learn_model_check(const sj_learn_model *m);

#endif /* SJ_BUCKET_LEARN_H */
