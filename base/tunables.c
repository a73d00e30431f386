/* The tunables table (base/tunables.h): defaults, environment, checks. */
#include "base/tunables.h"

#include <errno.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"

#define SJ_IS_UNSIGNED_int 0
#define SJ_IS_UNSIGNED_int64_t 0
#define SJ_IS_UNSIGNED_uint64_t 1

const sj_tunable sj_tunables[SJ_TUNE_COUNT] = {
#define SJ_X(f, type, d, l, h, e, doc)                                                          \
    [SJ_TUNE_##f] = {#f, e, doc, (int)sizeof(type), SJ_IS_UNSIGNED_##type, (int64_t)(d),        \
                     SJ_IS_UNSIGNED_##type ? (int64_t)(l) : (int64_t)(l),                       \
                     SJ_IS_UNSIGNED_##type ? INT64_MAX : (int64_t)(h), offsetof(sj_runtime_config, f)},
    SJ_TUNABLE_LIST(SJ_X)
#undef SJ_X
};

/* Every field's type is what the table says. */
#define SJ_X(f, type, d, l, h, e, doc)                                                          \
    _Static_assert(sizeof(((sj_runtime_config *)0)->f) == sizeof(type), #f " has the table's type");
SJ_TUNABLE_LIST(SJ_X)
#undef SJ_X

static void store(sj_runtime_config *cfg, const sj_tunable *t, int64_t v) {
    char *p = (char *)cfg + t->offset;
    if (t->size == 4) {
        int x = (int)v;
        memcpy(p, &x, sizeof x);
    } else {
        memcpy(p, &v, sizeof v); /* int64 and uint64 share the representation */
    }
}

static int64_t load(const sj_runtime_config *cfg, const sj_tunable *t) { /* sj_tunable_get */
    const char *p = (const char *)cfg + t->offset;
    if (t->size == 4) {
        int x;
        memcpy(&x, p, sizeof x);
        return x;
    }
    int64_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

void sj_tunables_defaults(sj_runtime_config *cfg) {
    for (int i = 0; i < SJ_TUNE_COUNT; i++) store(cfg, &sj_tunables[i], sj_tunables[i].dflt);
}

static void range_text(const sj_tunable *t, char *buf, size_t n) {
    if (t->is_unsigned) snprintf(buf, n, "%" PRId64 " .. %" PRIu64, t->lo, UINT64_MAX);
    else snprintf(buf, n, "%" PRId64 " .. %" PRId64, t->lo, t->hi);
}

void sj_tunables_from_env(sj_runtime_config *cfg) {
    for (int i = 0; i < SJ_TUNE_COUNT; i++) {
        const sj_tunable *t = &sj_tunables[i];
        const char *v = getenv(t->env);
        if (!v || !*v) continue;
        char *end;
        errno = 0;
        int64_t n;
        int ok;
        if (t->is_unsigned) {
            unsigned long long u = strtoull(v, &end, 10);
            ok = !*end && !errno && v[0] != '-';
            n = (int64_t)u;
        } else {
            long long s = strtoll(v, &end, 10);
            n = s;
            ok = !*end && !errno && n >= t->lo && n <= t->hi;
        }
        if (!ok) {
            char r[64];
            range_text(t, r, sizeof r);
            fprintf(stderr, "shapejit: ignoring %s=%s (expected an integer in %s)\n", t->env, v, r);
            continue;
        }
        store(cfg, t, n);
    }
}

int sj_tunable_int_ok(sj_tunable_id id, int64_t v) {
    const sj_tunable *t = &sj_tunables[id];
    return v >= t->lo && v <= t->hi;
}

sj_status sj_tunables_check(const sj_runtime_config *cfg, const char *who) {
    for (int i = 0; i < SJ_TUNE_COUNT; i++) {
        const sj_tunable *t = &sj_tunables[i];
        if (t->is_unsigned) continue; /* every uint64 value is in range */
        int64_t v = load(cfg, t);
        if (v < t->lo || v > t->hi) {
            char r[64];
            range_text(t, r, sizeof r);
            return sj_seterr(SJ_EINVAL, "%s: %s %" PRId64 " out of range (%s)", who, t->field, v, r);
        }
    }
    return SJ_OK;
}

int64_t sj_tunable_get(const sj_runtime_config *cfg, sj_tunable_id id) { return load(cfg, &sj_tunables[id]); }
