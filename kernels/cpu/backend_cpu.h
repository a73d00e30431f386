/* The CPU backend: generated C compiled by the system compiler into a shared
 * object and loaded with dlopen. */
#ifndef SJ_BACKEND_CPU_H
#define SJ_BACKEND_CPU_H

#include "kernels/cache.h"
#include "base/log.h"
#include "kernels/device.h"

typedef struct sj_cpu_backend_config {
    const char *cc;        /* compiler command; NULL: "cc". Split on blanks into
                              the program and its first arguments ("ccache cc"); no shell */
    const char *cflags;    /* NULL: the default flags (see backend_cpu.c) */
    const char *cc_version; /* the version line in the identity (cache keys) instead of the probe's; NULL: probed */
    const char *dump_dir;  /* NULL: none; else every source is written there as <tag>.c */
    sj_cache *cache;       /* NULL: no persistent cache (borrowed; outlives the backend) */
    sj_remote *remote;     /* NULL: no remote cache (borrowed; outlives the backend) */
    const sj_log_sink *log;  /* where log lines go (SJ_LOG_COMPILE, SJ_LOG_WARN); NULL: none */
    /* Test hooks: sleep this long inside every compile (ms); make every
     * compile fail as if the compiler had reported an error. */
    int test_delay_ms;
    int test_fail;
    /* A compiler run (the probe, a compile) still running after timeout_ms
     * is killed with its whole process group (0: no limit). */
    int timeout_ms;
    /* Skip the `cc --version` probe (compiles are off: nothing will run
     * the compiler). */
    bool no_probe;
} sj_cpu_backend_config;

/* Create the backend. Probes the compiler once (`cc --version`, bounded by
 * timeout_ms, skipped with no_probe): a missing
 * compiler is not an error here; every compile then fails with a clear
 * SJ_EBACKEND and log ("compiler 'cc' not found"). */
sj_status sj_cpu_backend_create(const sj_cpu_backend_config *cfg, sj_backend **out);

#endif
