/* The monotonic clock every part of the library times itself with. */
#ifndef SJ_CLOCK_H
#define SJ_CLOCK_H

#include <stdint.h>
#include <time.h>

/* Nanoseconds on CLOCK_MONOTONIC (an arbitrary origin). */
static inline int64_t sj_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* The same in milliseconds. */
static inline double sj_now_ms(void) { return (double)sj_now_ns() / 1e6; }

/* CLOCK_REALTIME ns nanoseconds from now (ns >= 0): a deadline for
 * pthread_cond_timedwait, whose condition variables keep that clock. */
static inline struct timespec sj_realtime_after(int64_t ns) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    int64_t at = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec + ns;
    ts.tv_sec = (time_t)(at / 1000000000);
    ts.tv_nsec = (long)(at % 1000000000);
    return ts;
}

#endif /* SJ_CLOCK_H */
