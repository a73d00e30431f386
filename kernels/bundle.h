/* Portable kernel bundles: every verified artifact of a kernel cache in one
 * file signed with the cache key, to carry compiled kernels to machines
 * that should not compile (a container image without a compiler serves
 * fused kernels from its first request). `shapejit-cache` (tools/sjcache.c)
 * is the command line over these functions.
 *
 * Format (version 1, integers little-endian):
 *   "SJBNDL01"
 *   entries: u8 ext_len (1..15), ext, key (64 hex digits), u64 size, bytes
 *   u8 0 (the end of the entries), u32 count
 *   mac: BLAKE2b-256 keyed with the cache key's MAC key (sj_cache_mac_key)
 *        over a domain tag and every byte before it
 * A bundle is read whole into memory (at most 4 GiB), its MAC checked
 * before anything of it is parsed or used, then parsed strictly: every
 * length in bounds, every name a valid cache name, the count right, no
 * byte after the MAC.
 */
#ifndef SJ_BUNDLE_H
#define SJ_BUNDLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "jit/shapejit.h"

typedef struct sj_bundle sj_bundle;

typedef struct sj_bundle_entry {
    char key[65];
    char ext[16];
    const uint8_t *data; /* owned by the bundle */
    size_t len;
} sj_bundle_entry;

#define SJ_BUNDLE_MAX (UINT64_C(4) << 30)

/* Parse a bundle from memory (copied). secret: the cache key, whose MAC
 * must match (else SJ_EINVAL, nothing parsed); NULL or "": the structure
 * only (sj_bundle_verified says false; for listing). SJ_EINVAL names what
 * is wrong and where. */
sj_status sj_bundle_parse(const void *data, size_t len, const char *secret, sj_bundle **out);
/* sj_bundle_parse of a file's contents (a regular file, not followed
 * through a symlink, at most SJ_BUNDLE_MAX bytes). */
sj_status sj_bundle_read(const char *path, const char *secret, sj_bundle **out);
void sj_bundle_free(sj_bundle *b); /* NULL is a no-op */

int sj_bundle_count(const sj_bundle *b);
const sj_bundle_entry *sj_bundle_entry_at(const sj_bundle *b, int i);
bool sj_bundle_verified(const sj_bundle *b);

/* Every artifact of the cache directory dir that verifies under secret
 * into a new bundle file (written through a temporary and renamed; mode
 * 0644). The cache is opened read-only: an entry that does not verify is
 * counted in *refused (may be NULL) and left alone. SJ_EINVAL: no secret,
 * dir missing or refused by the cache's rules, or entries present but
 * none verifying (another key?). *n (may be NULL): artifacts written. */
sj_status sj_bundle_export(const char *dir, const char *secret, const char *file, int *n, int *refused);

/* Store every entry of a verified bundle into the cache directory dir
 * (created 0700 if missing), opened with secret as its key, through the
 * cache's own store (its trust rules and digests). SJ_EINVAL when b is not
 * verified or the cache cannot be opened; *n (may be NULL): entries
 * stored. Nothing is written before the whole bundle has been verified
 * (sj_bundle_parse does that). */
sj_status sj_bundle_import(const sj_bundle *b, const char *dir, const char *secret, int *n);

#endif
