/* Helpers every benchmark program shares: a monotonic clock, sorting for
 * medians, random fills (never zero: ../shared/workloads/README.md). */
#ifndef SJ_BENCH_UTIL_H
#define SJ_BENCH_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <time.h>

static inline double bench_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* qsort comparator for doubles. */
static inline int bench_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* n floats uniform in [lo, hi), zeros replaced by (lo + hi) / 2 (or 0.5),
 * from the xorshift state *rng. */
static inline void bench_fill_rand(float *p, size_t n, float lo, float hi, uint64_t *rng) {
    float mid = (lo + hi) / 2 != 0.0f ? (lo + hi) / 2 : 0.5f;
    for (size_t i = 0; i < n; i++) {
        uint64_t r = *rng;
        r ^= r << 13, r ^= r >> 7, r ^= r << 17;
        *rng = r;
        p[i] = lo + (hi - lo) * (float)((r >> 40) * (1.0 / 16777216.0));
        if (p[i] == 0.0f) p[i] = mid;
    }
}

#endif
