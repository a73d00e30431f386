/* The remote kernel cache: compiled artifacts shared by many machines
 * through a Redis server, the second level under the disk cache (the
 * compile driver looks up disk -> remote -> compiler).
 *
 * An entry is the Redis string "shapejit:kc:<key>.<ext>" (key: the disk
 * cache's 64-hex-digit content key of source, toolchain, flags, device)
 * whose value is "sjr1", the 32-byte digest, then the artifact's bytes.
 * The digest is the disk cache's (sj_cache_digest): BLAKE2b keyed with the
 * cache key, bound to the entry's key and extension. A remote cache needs
 * a key (see sj_remote_open): a Redis server has no notion of who wrote a
 * value, so a digest nobody else can make is the only trust there is.
 *
 * Every operation is bounded: the connect and each command share one
 * deadline of timeout_ms; nothing else waits. A server that is down, slow,
 * or answers garbage is logged once (a warning through the log sink) and
 * then left alone for a back-off period (1 s, doubling to 60 s) during
 * which every operation is a miss at once; then one operation tries
 * again. A value that parses but does not verify is refused (a miss,
 * counted, logged once).
 *
 * Thread-safe: connections are kept in a small pool; an operation takes one
 * (or opens one), uses it without a lock, and gives it back. Never raises
 * SIGPIPE (sends use MSG_NOSIGNAL). hiredis formats the commands and parses
 * the replies; the socket is shapejit's own so that deadlines and size
 * limits hold.
 */
#ifndef SJ_REMOTE_H
#define SJ_REMOTE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/log.h"
#include "jit/shapejit.h"

typedef struct sj_remote sj_remote;

typedef struct sj_remote_stats {
    uint64_t hits;     /* verified artifacts fetched */
    uint64_t misses;   /* not there (and every refused or failed fetch) */
    uint64_t stores;   /* artifacts pushed */
    uint64_t refused;  /* values that did not verify (tampered, garbage, another key) */
    uint64_t errors;   /* operations that failed on the connection: down, timeout, protocol garbage */
    uint64_t skipped;  /* operations not tried: the server is in its back-off period */
    uint64_t bytes_in, bytes_out; /* on the wire, all commands */
} sj_remote_stats;

/* The most bytes an artifact may have in the remote cache. */
#define SJ_REMOTE_ARTIFACT_MAX (UINT64_C(64) << 20)

/* Parse a URL without connecting: redis://[:password@]host[:port][/db]
 * (port 6379, db 0 by default; host a name or an address, [v6] in
 * brackets) or unix:///path/to/socket[?db=N] or an absolute socket path.
 * SJ_EINVAL naming what is wrong. */
sj_status sj_remote_check_url(const char *url);

/* Open a remote cache (no connection yet: the first operation connects).
 * key: the cache key; NULL or "" is refused (SJ_EINVAL saying why).
 * timeout_ms > 0 bounds each operation. A host name is resolved here,
 * once (SJ_EINVAL when it does not resolve). log: where the one warning
 * goes (NULL: nowhere); borrowed, must outlive the remote. */
sj_status sj_remote_open(const char *url, const char *key, int timeout_ms, const sj_log_sink *log,
                         sj_remote **out);
void sj_remote_close(sj_remote *r); /* NULL is a no-op */

/* Fetch and verify <key>.<ext>: true with the artifact's bytes in *data
 * (malloc'd; the caller frees) and *len. false: a miss, a refused value,
 * a failure or the back-off (the stats say which). */
bool sj_remote_get(sj_remote *r, const char *key, const char *ext, void **data, size_t *len);

/* Push an artifact (signed here). Failures are counted and logged as the
 * remote's trouble, never returned: the local cache has it anyway. */
void sj_remote_put(sj_remote *r, const char *key, const char *ext, const void *data, size_t len);

void sj_remote_get_stats(const sj_remote *r, sj_remote_stats *out);
/* The URL without its password, for messages. */
const char *sj_remote_name(const sj_remote *r);

#endif
