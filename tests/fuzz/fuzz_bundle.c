/* libFuzzer: the kernel bundle parser (kernels/bundle.h), with the MAC
 * checked under the harness's key and with the structure only (no key, as
 * `shapejit-cache list` reads a bundle). Any input must end in SJ_OK or
 * SJ_EINVAL with a message, never a crash, a leak or undefined behaviour;
 * a parsed bundle's entries lie inside it and carry valid cache names. */
#include <stdlib.h>
#include <string.h>

#include "kernels/bundle.h"
#include "kernels/cache.h"

#define FUZZ_KEY "fuzz-key" /* the seeds in tests/fuzz/corpus/bundle are signed with it */

static void check(const unsigned char *data, size_t size, const char *key) {
    sj_bundle *b = NULL;
    sj_status st = sj_bundle_parse(data, size, key, &b);
    if (st) {
        if (b || st != SJ_EINVAL || !sj_last_error()[0]) abort();
        return;
    }
    size_t total = 0;
    for (int i = 0; i < sj_bundle_count(b); i++) {
        const sj_bundle_entry *e = sj_bundle_entry_at(b, i);
        if (!e || !sj_cache_valid_name(e->key, e->ext)) abort();
        total += e->len;
        volatile unsigned char sink = 0;
        for (size_t k = 0; k < e->len; k++) sink ^= e->data[k];
        (void)sink;
    }
    if (total > size || sj_bundle_verified(b) != (key != NULL)) abort();
    sj_bundle_free(b);
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size) {
    check(data, size, FUZZ_KEY);
    check(data, size, NULL);
    return 0;
}
