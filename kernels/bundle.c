/* Portable kernel bundles (see bundle.h): export a cache directory into
 * one signed file, parse and verify one, import one into a cache.
 *
 * Trust: a bundle's MAC is checked over the whole file before a single
 * entry is parsed; import then writes each entry through sj_cache_store,
 * which digests it under the target cache's key (the same secret), so the
 * cache's own rules (ownership, O_NOFOLLOW, atomic renames) hold. Export
 * reads the cache read-only: only artifacts that verify under the secret
 * go into the bundle, and a wrong secret deletes nothing.
 */
#include "kernels/bundle.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sodium.h>

#include "base/error.h"
#include "kernels/cache.h"

#define MAGIC "SJBNDL01"
#define MAGIC_LEN 8
#define MAC_LEN 32
#define BUNDLE_TAG "shapejit kernel bundle v1"
#define EXT_MAX 15

struct sj_bundle {
    uint8_t *buf; /* the whole file */
    size_t len;
    sj_bundle_entry *entries;
    int n, cap;
    bool verified;
};

/* -- Little-endian integers --------------------------------------------------- */

static void put_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get_u64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static void mac_start(crypto_generichash_state *s, const uint8_t *mac_key) {
    crypto_generichash_init(s, mac_key, SJ_CACHE_MAC_BYTES, MAC_LEN);
    crypto_generichash_update(s, (const uint8_t *)BUNDLE_TAG, sizeof BUNDLE_TAG);
}

/* -- Parsing ---------------------------------------------------------------------- */

void sj_bundle_free(sj_bundle *b) {
    if (!b) return;
    free(b->buf);
    free(b->entries);
    free(b);
}

/* Parses buf (taken over, freed on failure). */
static sj_status parse_owned(uint8_t *buf, size_t len, const char *secret, sj_bundle **out) {
    *out = NULL;
    sj_bundle *b = calloc(1, sizeof *b);
    if (!b) {
        free(buf);
        return sj_seterr(SJ_ENOMEM, "bundle: out of memory");
    }
    b->buf = buf, b->len = len;
    sj_status st = SJ_OK;
    if (len < MAGIC_LEN + 1 + 4 + MAC_LEN || memcmp(buf, MAGIC, MAGIC_LEN)) {
        st = sj_seterr(SJ_EINVAL, "bundle: not a shapejit kernel bundle (%s)",
                       len < MAGIC_LEN || memcmp(buf, MAGIC, MAGIC_LEN) ? "no SJBNDL01 header" : "too short");
        goto fail;
    }
    size_t end = len - MAC_LEN;
    if (secret && *secret) {
        uint8_t key[SJ_CACHE_MAC_BYTES], mac[MAC_LEN];
        if (!sj_cache_mac_key(key, secret)) {
            st = sj_seterr(SJ_EBACKEND, "bundle: libsodium failed to initialise");
            goto fail;
        }
        crypto_generichash_state s;
        mac_start(&s, key);
        crypto_generichash_update(&s, buf, end);
        crypto_generichash_final(&s, mac, sizeof mac);
        sodium_memzero(key, sizeof key);
        if (sodium_memcmp(mac, buf + end, MAC_LEN)) {
            st = sj_seterr(SJ_EINVAL, "bundle: the signature does not match (tampered, truncated, or signed with "
                                      "another key); nothing of it is used");
            goto fail;
        }
        b->verified = true;
    }
    size_t pos = MAGIC_LEN;
    for (;;) {
        if (end - pos < 1) {
            st = sj_seterr(SJ_EINVAL, "bundle: entry %d: cut short at byte %zu", b->n, pos);
            goto fail;
        }
        unsigned el = buf[pos++];
        if (el == 0) break;
        if (el > EXT_MAX || end - pos < (size_t)el + 64 + 8) {
            st = sj_seterr(SJ_EINVAL, "bundle: entry %d: %s at byte %zu", b->n,
                           el > EXT_MAX ? "extension longer than 15 bytes" : "header cut short", pos - 1);
            goto fail;
        }
        sj_bundle_entry e;
        memcpy(e.ext, buf + pos, el);
        e.ext[el] = '\0';
        memcpy(e.key, buf + pos + el, 64);
        e.key[64] = '\0';
        uint64_t size = get_u64(buf + pos + el + 64);
        pos += el + 64 + 8;
        if (strlen(e.ext) != el || !sj_cache_valid_name(e.key, e.ext)) {
            st = sj_seterr(SJ_EINVAL, "bundle: entry %d: not a valid cache name (64 hex digits and an extension of "
                                      "[a-z0-9])", b->n);
            goto fail;
        }
        if (size > end - pos) {
            st = sj_seterr(SJ_EINVAL, "bundle: entry %d (%.16s.%s): %llu bytes, past the end of the bundle", b->n,
                           e.key, e.ext, (unsigned long long)size);
            goto fail;
        }
        e.data = buf + pos;
        e.len = (size_t)size;
        pos += (size_t)size;
        if (b->n == b->cap) {
            int cap = b->cap ? 2 * b->cap : 16;
            sj_bundle_entry *ne = realloc(b->entries, (size_t)cap * sizeof *ne);
            if (!ne) {
                st = sj_seterr(SJ_ENOMEM, "bundle: out of memory");
                goto fail;
            }
            b->entries = ne, b->cap = cap;
        }
        b->entries[b->n++] = e;
    }
    if (end - pos != 4) {
        st = sj_seterr(SJ_EINVAL, "bundle: %s after the entries", end - pos < 4 ? "no count" : "stray bytes");
        goto fail;
    }
    uint32_t count = (uint32_t)buf[pos] | (uint32_t)buf[pos + 1] << 8 | (uint32_t)buf[pos + 2] << 16 |
                     (uint32_t)buf[pos + 3] << 24;
    if (count != (uint32_t)b->n) {
        st = sj_seterr(SJ_EINVAL, "bundle: says %u entries, holds %d", count, b->n);
        goto fail;
    }
    *out = b;
    return SJ_OK;
fail:
    sj_bundle_free(b);
    return st;
}

sj_status sj_bundle_parse(const void *data, size_t len, const char *secret, sj_bundle **out) {
    if (!out) return sj_seterr(SJ_EINVAL, "sj_bundle_parse: out is NULL");
    *out = NULL;
    if (!data && len) return sj_seterr(SJ_EINVAL, "sj_bundle_parse: data is NULL");
    uint8_t *buf = malloc(len ? len : 1);
    if (!buf) return sj_seterr(SJ_ENOMEM, "bundle: out of memory for %zu bytes", len);
    if (len) memcpy(buf, data, len);
    return parse_owned(buf, len, secret, out);
}

sj_status sj_bundle_read(const char *path, const char *secret, sj_bundle **out) {
    if (!out) return sj_seterr(SJ_EINVAL, "sj_bundle_read: out is NULL");
    *out = NULL;
    if (!path) return sj_seterr(SJ_EINVAL, "sj_bundle_read: path is NULL");
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return sj_seterr(SJ_EINVAL, "bundle %s: %s", path, errno == ELOOP ? "a symbolic link" : strerror(errno));
    struct stat st;
    if (fstat(fd, &st) || !S_ISREG(st.st_mode) || (uint64_t)st.st_size > SJ_BUNDLE_MAX) {
        close(fd);
        return sj_seterr(SJ_EINVAL, "bundle %s: not a regular file of at most 4 GiB", path);
    }
    size_t cap = (size_t)st.st_size + 1, got = 0;
    uint8_t *buf = malloc(cap);
    if (!buf) {
        close(fd);
        return sj_seterr(SJ_ENOMEM, "bundle %s: out of memory for %zu bytes", path, cap);
    }
    for (;;) {
        ssize_t r = read(fd, buf + got, cap - got);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            int e = errno;
            close(fd);
            free(buf);
            return sj_seterr(SJ_EINVAL, "bundle %s: %s", path, strerror(e));
        }
        if (r == 0) break;
        got += (size_t)r;
        if (got == cap) break; /* grew while read: the MAC will not match */
    }
    close(fd);
    sj_status s = parse_owned(buf, got, secret, out);
    if (s) sj_err_prefix("%s: ", path);
    return s;
}

int sj_bundle_count(const sj_bundle *b) { return b ? b->n : 0; }

const sj_bundle_entry *sj_bundle_entry_at(const sj_bundle *b, int i) {
    return b && i >= 0 && i < b->n ? &b->entries[i] : NULL;
}

bool sj_bundle_verified(const sj_bundle *b) { return b && b->verified; }

/* -- Export ------------------------------------------------------------------------ */

typedef struct writer {
    int fd;
    crypto_generichash_state mac;
    int err; /* errno of the first failure */
} writer;

static void emit(writer *w, const void *data, size_t len) {
    if (w->err) return;
    crypto_generichash_update(&w->mac, data, len);
    const char *p = data;
    while (len > 0) {
        ssize_t n = write(w->fd, p, len);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            w->err = n < 0 ? errno : EIO;
            return;
        }
        p += n, len -= (size_t)n;
    }
}

typedef struct names {
    char (*key)[65];
    char (*ext)[16];
    int n, cap;
    bool oom;
} names;

static void collect(void *user, const char *key, const char *ext) {
    names *l = user;
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 64;
        char(*nk)[65] = realloc(l->key, (size_t)cap * sizeof *nk);
        if (nk) l->key = nk;
        char(*ne)[16] = nk ? realloc(l->ext, (size_t)cap * sizeof *ne) : NULL;
        if (ne) l->ext = ne;
        if (!nk || !ne) {
            l->oom = true;
            return;
        }
        l->cap = cap;
    }
    snprintf(l->key[l->n], 65, "%s", key);
    snprintf(l->ext[l->n], 16, "%s", ext);
    l->n++;
}

sj_status sj_bundle_export(const char *dir, const char *secret, const char *file, int *n_out, int *refused_out) {
    if (n_out) *n_out = 0;
    if (refused_out) *refused_out = 0;
    if (!dir || !file) return sj_seterr(SJ_EINVAL, "bundle export: no directory or file given");
    if (!secret || !*secret)
        return sj_seterr(SJ_EINVAL, "bundle export: no cache key (SHAPEJIT_CACHE_KEY): a bundle is signed with it");
    struct stat ds;
    if (lstat(dir, &ds) || !S_ISDIR(ds.st_mode))
        return sj_seterr(SJ_EINVAL, "bundle export: %s: %s", dir,
                         errno == ENOENT ? "no such directory" : "not a directory");
    sj_cache *c = NULL;
    sj_status st = sj_cache_open_keyed(dir, 0, secret, NULL, &c);
    if (st) return st;
    sj_cache_set_readonly(c);
    names l = {0};
    if (sj_cache_list(c, collect, &l) < 0 || l.oom) {
        sj_cache_close(c);
        free(l.key), free(l.ext);
        return sj_seterr(SJ_EINVAL, "bundle export: cannot list %s", dir);
    }
    /* a temporary next to the file, renamed over it at the end */
    char tmp[PATH_MAX];
    static _Atomic unsigned long seq;
    if (snprintf(tmp, sizeof tmp, "%s.sjtmp.%ld.%lu", file, (long)getpid(), atomic_fetch_add(&seq, 1)) >=
        (int)sizeof tmp) {
        sj_cache_close(c);
        free(l.key), free(l.ext);
        return sj_seterr(SJ_EINVAL, "bundle export: %s: path too long", file);
    }
    writer w = {.fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644)};
    if (w.fd < 0) {
        int e = errno;
        sj_cache_close(c);
        free(l.key), free(l.ext);
        return sj_seterr(SJ_EINVAL, "bundle export: cannot create %s: %s", tmp, strerror(e));
    }
    fchmod(w.fd, 0644);
    uint8_t key[SJ_CACHE_MAC_BYTES];
    sj_cache_mac_key(key, secret);
    mac_start(&w.mac, key);
    sodium_memzero(key, sizeof key);
    emit(&w, MAGIC, MAGIC_LEN);
    int n = 0, refused = 0;
    for (int i = 0; i < l.n; i++) {
        void *data = NULL;
        size_t len = 0;
        if (!sj_cache_load(c, l.key[i], l.ext[i], &data, &len)) {
            refused++;
            continue;
        }
        uint8_t el = (uint8_t)strlen(l.ext[i]), size[8];
        put_u64(size, len);
        emit(&w, &el, 1);
        emit(&w, l.ext[i], el);
        emit(&w, l.key[i], 64);
        emit(&w, size, 8);
        emit(&w, data, len);
        free(data);
        n++;
    }
    uint8_t tail[5] = {0, (uint8_t)n, (uint8_t)(n >> 8), (uint8_t)(n >> 16), (uint8_t)(n >> 24)};
    emit(&w, tail, sizeof tail);
    uint8_t mac[MAC_LEN];
    crypto_generichash_final(&w.mac, mac, sizeof mac);
    if (!w.err) {
        const uint8_t *p = mac;
        size_t left = sizeof mac;
        while (left && !w.err) {
            ssize_t k = write(w.fd, p, left);
            if (k < 0 && errno == EINTR) continue;
            if (k <= 0) w.err = k < 0 ? errno : EIO;
            else p += k, left -= (size_t)k;
        }
    }
    if (close(w.fd) && !w.err) w.err = errno;
    sj_cache_close(c);
    free(l.key), free(l.ext);
    if (refused_out) *refused_out = refused;
    if (!w.err && n == 0 && refused > 0) {
        unlink(tmp);
        return sj_seterr(SJ_EINVAL, "bundle export: none of the %d kernels of %s verifies under this key (were they "
                                    "written with another SHAPEJIT_CACHE_KEY, or none?)",
                         refused, dir);
    }
    if (!w.err && rename(tmp, file)) w.err = errno;
    if (w.err) {
        unlink(tmp);
        return sj_seterr(SJ_EINVAL, "bundle export: cannot write %s: %s", file, strerror(w.err));
    }
    if (n_out) *n_out = n;
    return SJ_OK;
}

/* -- Import ------------------------------------------------------------------------ */

sj_status sj_bundle_import(const sj_bundle *b, const char *dir, const char *secret, int *n_out) {
    if (n_out) *n_out = 0;
    if (!b || !dir) return sj_seterr(SJ_EINVAL, "bundle import: no bundle or directory given");
    if (!b->verified || !secret || !*secret)
        return sj_seterr(SJ_EINVAL, "bundle import: the bundle was not verified with a cache key; nothing imported");
    sj_cache *c = NULL;
    sj_status st = sj_cache_open_keyed(dir, 0, secret, NULL, &c);
    if (st) return st;
    int n = 0;
    for (int i = 0; i < b->n && !st; i++) {
        const sj_bundle_entry *e = &b->entries[i];
        st = sj_cache_store(c, e->key, e->ext, e->data, e->len);
        if (!st) n++;
    }
    sj_cache_close(c);
    if (n_out) *n_out = n;
    if (st) sj_err_prefix("bundle import into %s: ", dir);
    return st;
}
