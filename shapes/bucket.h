/* Shape buckets: which sizes of one dimension share an entry. A bucket is a
 * range (lo, hi] of sizes; the dimension is symbolic inside it. */
#ifndef SJ_BUCKET_H
#define SJ_BUCKET_H

#include <stdbool.h>
#include <stdint.h>

#include "jit/shapejit.h"

#define SJ_BUCKET_MAX_BOUNDS 64

typedef enum sj_bucket_kind {
    SJ_BUCKET_NONE = 0,
    SJ_BUCKET_LIST,     /* bounds[0..n): (0,b0], (b0,b1], ..., (b[n-1], inf) */
    SJ_BUCKET_POW2,     /* lo, 2lo, 4lo, ... up to the first >= hi; then (last, inf) */
    SJ_BUCKET_MULTIPLE, /* ((k-1)m, km] */
    SJ_BUCKET_PROFILE,  /* [min, max] only, opt the size to tune for */
} sj_bucket_kind;

typedef struct sj_bucket_spec {
    sj_bucket_kind kind;
    int n;                                /* LIST, POW2: number of bounds */
    int64_t bounds[SJ_BUCKET_MAX_BOUNDS]; /* LIST, POW2 (expanded) */
    int64_t multiple;                     /* MULTIPLE */
    int64_t min, opt, max;                /* PROFILE */
} sj_bucket_spec;

/* Build specs; SJ_EINVAL with a message naming the problem. */
sj_status sj_bucket_list(sj_bucket_spec *b, const int64_t *bounds, int n);
sj_status sj_bucket_pow2(sj_bucket_spec *b, int64_t lo, int64_t hi);
sj_status sj_bucket_multiple(sj_bucket_spec *b, int64_t m);
sj_status sj_bucket_profile(sj_bucket_spec *b, int64_t min, int64_t opt, int64_t max);

/* The bucket holding size: sizes lo < size <= hi (hi INT64_MAX: unbounded).
 * False when no bucket holds it (outside a profile). size >= 2. */
bool sj_bucket_find(const sj_bucket_spec *b, int64_t size, int64_t *lo, int64_t *hi);

/* "pow2:16,512" style text for explain. */
int sj_bucket_str(const sj_bucket_spec *b, char *buf, size_t n);

/* One parsed SHAPEJIT_BUCKETS item: NAME:INPUT:AXIS=KIND:ARGS. */
typedef struct sj_bucket_rule {
    char fn_name[64]; /* "*" for every function */
    int input, axis;
    sj_bucket_spec spec;
} sj_bucket_rule;

/* Parse the whole text into *rules (malloc'd array, caller frees) and
 * *n_rules. SJ_EINVAL with a message naming the bad item. */
sj_status sj_bucket_parse(const char *text, sj_bucket_rule **rules, int *n_rules);

#endif /* SJ_BUCKET_H */
