/* The persistent kernel cache: compiled artifacts on disk, keyed by a hash
 * of everything that determines them (source, backend, toolchain identity,
 * flags, device), so a second process reaches fused execution without
 * compiling.
 *
 * Layout: <dir>/<key>.<ext> is the artifact exactly as the backend loads it
 * (a shared object for the CPU, a CUBIN for CUDA) and <dir>/<key>.meta
 * records its size and digest (BLAKE2b, keyed when the cache has a key;
 * the trust rules are at the top of cache.c). Both are written atomically (a temporary
 * file, then rename). A lookup verifies the checksum; a corrupt, truncated or
 * orphaned artifact is deleted and reported as a miss. The directory is kept
 * under a size cap by deleting the least recently used artifacts (use
 * refreshes the artifact's modification time).
 *
 * Safe for several threads and several processes sharing the directory.
 */
#ifndef SJ_CACHE_H
#define SJ_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/log.h"
#include "jit/shapejit.h"

typedef struct sj_cache sj_cache;

typedef struct sj_cache_stats {
    uint64_t hits, misses, stores, corrupt, evictions, quarantined;
} sj_cache_stats;

/* Open (creating the directory, and its parents, 0700 if needed). max_bytes
 * 0: no cap. key: NULL or "" for a private cache, which must be owned by
 * the effective user and writable by nobody else; with a key, entries'
 * digests are keyed with it (BLAKE2b, libsodium) and a directory shared
 * between users is allowed. log: where a refused entry is warned about
 * (once per cache); NULL: nowhere. SJ_EINVAL when dir is NULL or empty,
 * cannot be created, is a symbolic link, or fails the ownership rules
 * (the message says which and how to fix it). */
sj_status sj_cache_open_keyed(const char *dir, uint64_t max_bytes, const char *key, const sj_log_sink *log,
                              sj_cache **out);
/* sj_cache_open_keyed without a key or a log. */
sj_status sj_cache_open(const char *dir, uint64_t max_bytes, sj_cache **out);
/* Whether the cache was opened with a key. */
bool sj_cache_keyed(const sj_cache *c);
void sj_cache_close(sj_cache *c); /* NULL is a no-op */

/* A 64-hex-digit key from any number of byte strings (NUL-terminated,
 * hashed with their lengths so concatenations differ). A key holds one
 * artifact: its meta names the extension, and a store under the same key
 * with another extension replaces it (the first artifact is then refused
 * as corrupt and dropped). A record that goes with an artifact takes a
 * key of its own, e.g. sj_cache_key over the artifact's key and a name
 * for the record (kernels/cuda/gemm_tune.c). */
void sj_cache_key(char out[65], const char *const *parts, int n_parts);

/* Verified lookup. On a hit writes the artifact's path (ext: "so", "cubin")
 * to path and returns true. For tests and tools only: code that loads an
 * artifact must use sj_cache_load, which returns the very bytes that were
 * verified (a path opened again could name another file by then). */
bool sj_cache_lookup(sj_cache *c, const char *key, const char *ext, char *path, size_t n);
/* The same, reading the artifact into a malloc'd buffer (caller frees). */
bool sj_cache_load(sj_cache *c, const char *key, const char *ext, void **data, size_t *len);
/* sj_cache_load without counting a hit or a miss (a corrupt entry still
 * counts): the compile driver reads back what it has just stored, to push
 * it to the remote cache. */
bool sj_cache_read(sj_cache *c, const char *key, const char *ext, void **data, size_t *len);
/* Mark the artifact used now (its place in the LRU order) without reading
 * it: for a unit loaded once and used again from memory. Absent, or a
 * read-only cache: nothing happens. NULL c is a no-op. */
void sj_cache_touch(sj_cache *c, const char *key, const char *ext);

/* Store an artifact from a file (moved or copied into the cache) or from
 * memory; then evict past the cap. Failures are reported and harmless (the
 * artifact is simply not cached). */
sj_status sj_cache_store_file(sj_cache *c, const char *key, const char *ext, const char *file);
sj_status sj_cache_store(sj_cache *c, const char *key, const char *ext, const void *data, size_t len);

/* Set the unit stored under key aside (its compiled kernels gave wrong
 * results): the artifact is renamed <key>.<ext>-rejected, kept for
 * inspection and never loaded or evicted, and its meta deleted, so the
 * next lookup misses. Absent: nothing. NULL c is a no-op. */
void sj_cache_quarantine(sj_cache *c, const char *key);

void sj_cache_get_stats(const sj_cache *c, sj_cache_stats *out);
const char *sj_cache_dir(const sj_cache *c);

/* From now on c writes and deletes nothing: lookups still verify, a bad
 * entry is a miss but stays where it is, stores fail with SJ_EINVAL. For
 * tools that read a cache (shapejit-cache export) and must not destroy it
 * when given the wrong key. NULL is a no-op. */
void sj_cache_set_readonly(sj_cache *c);

/* Calls fn(user, key, ext) for every artifact file of the directory (by
 * name, not verified: look each up to verify it), in name order. The
 * number listed, or -1 when the directory cannot be read. */
int sj_cache_list(sj_cache *c, void (*fn)(void *user, const char *key, const char *ext), void *user);

/* -- The digest, shared with the remote cache and bundles ----------------- */

#define SJ_CACHE_MAC_BYTES 32

/* The BLAKE2b key derived from a secret (cache_key), as the cache derives
 * it: false when secret is NULL or "" (or libsodium cannot start). */
bool sj_cache_mac_key(uint8_t out[SJ_CACHE_MAC_BYTES], const char *secret);

/* The digest that binds an artifact's bytes to its cache key (64 hex
 * digits) and extension, keyed with mac_key (NULL: unkeyed): exactly what
 * a keyed cache's meta records, in raw bytes. */
void sj_cache_digest(const uint8_t *mac_key, const char *key, const char *ext, const void *data, size_t len,
                     uint8_t out[32]);

/* key is 64 lowercase hex digits and ext a valid artifact extension (1-15
 * of [a-z0-9], not "meta"). */
bool sj_cache_valid_name(const char *key, const char *ext);

#endif
