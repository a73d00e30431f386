/* Shape buckets (see bucket.h). */
#include "base/alloc.h"
#include "shapes/bucket.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"

/* -- Specs ------------------------------------------------------------------ */

sj_status sj_bucket_list(sj_bucket_spec *b, const int64_t *bounds, int n) {
    if (!bounds || n < 1 || n > SJ_BUCKET_MAX_BOUNDS)
        return sj_seterr(SJ_EINVAL, "buckets: %d bounds (expected 1 .. %d)", n, SJ_BUCKET_MAX_BOUNDS);
    for (int i = 0; i < n; i++) {
        if (bounds[i] < 1) return sj_seterr(SJ_EINVAL, "buckets: bound %lld at %d is < 1", (long long)bounds[i], i);
        if (i && bounds[i] <= bounds[i - 1])
            return sj_seterr(SJ_EINVAL, "buckets: bounds not increasing at %d (%lld after %lld)", i,
                             (long long)bounds[i], (long long)bounds[i - 1]);
    }
    memset(b, 0, sizeof *b);
    b->kind = SJ_BUCKET_LIST;
    b->n = n;
    memcpy(b->bounds, bounds, sizeof(int64_t) * (size_t)n);
    return SJ_OK;
}

sj_status sj_bucket_pow2(sj_bucket_spec *b, int64_t lo, int64_t hi) {
    if (lo < 1 || hi < lo) return sj_seterr(SJ_EINVAL, "buckets: pow2 range %lld..%lld (need 1 <= lo <= hi)",
                                            (long long)lo, (long long)hi);
    int64_t bounds[SJ_BUCKET_MAX_BOUNDS];
    int n = 0;
    for (int64_t v = lo; n < SJ_BUCKET_MAX_BOUNDS; v *= 2) {
        bounds[n++] = v;
        if (v >= hi || v > INT64_MAX / 2) break;
    }
    sj_status st = sj_bucket_list(b, bounds, n);
    if (!st) b->kind = SJ_BUCKET_POW2;
    return st;
}

sj_status sj_bucket_multiple(sj_bucket_spec *b, int64_t m) {
    /* no size exceeds 2^48 elements, and the bucket arithmetic stays in range */
    if (m < 1 || m > SJ_MAX_SPAN)
        return sj_seterr(SJ_EINVAL, "buckets: multiple %lld out of range [1, 2^48]", (long long)m);
    memset(b, 0, sizeof *b);
    b->kind = SJ_BUCKET_MULTIPLE;
    b->multiple = m;
    return SJ_OK;
}

sj_status sj_bucket_profile(sj_bucket_spec *b, int64_t min, int64_t opt, int64_t max) {
    if (min < 1 || opt < min || max < opt)
        return sj_seterr(SJ_EINVAL, "buckets: profile %lld,%lld,%lld (need 1 <= min <= opt <= max)", (long long)min,
                         (long long)opt, (long long)max);
    memset(b, 0, sizeof *b);
    b->kind = SJ_BUCKET_PROFILE;
    b->min = min, b->opt = opt, b->max = max;
    return SJ_OK;
}

bool sj_bucket_find(const sj_bucket_spec *b, int64_t size, int64_t *lo, int64_t *hi) {
    switch (b->kind) {
    case SJ_BUCKET_LIST:
    case SJ_BUCKET_POW2: {
        int64_t prev = 0;
        for (int i = 0; i < b->n; i++) {
            if (size <= b->bounds[i]) {
                *lo = prev, *hi = b->bounds[i];
                return true;
            }
            prev = b->bounds[i];
        }
        *lo = prev, *hi = INT64_MAX;
        return true;
    }
    case SJ_BUCKET_MULTIPLE: {
        int64_t k = (size + b->multiple - 1) / b->multiple;
        *lo = (k - 1) * b->multiple, *hi = k * b->multiple;
        return true;
    }
    case SJ_BUCKET_PROFILE:
        if (size < b->min || size > b->max) return false;
        *lo = b->min - 1, *hi = b->max;
        return true;
    case SJ_BUCKET_NONE:
        break;
    }
    return false;
}

int sj_bucket_str(const sj_bucket_spec *b, char *buf, size_t n) {
    switch (b->kind) {
    case SJ_BUCKET_LIST: {
        int used = snprintf(buf, n, "list:");
        for (int i = 0; i < b->n && (size_t)used < n; i++)
            used += snprintf(buf + used, n - (size_t)used, i ? ",%lld" : "%lld", (long long)b->bounds[i]);
        return used;
    }
    case SJ_BUCKET_POW2:
        return snprintf(buf, n, "pow2:%lld,%lld", (long long)b->bounds[0], (long long)b->bounds[b->n - 1]);
    case SJ_BUCKET_MULTIPLE:
        return snprintf(buf, n, "mult:%lld", (long long)b->multiple);
    case SJ_BUCKET_PROFILE:
        return snprintf(buf, n, "profile:%lld,%lld,%lld", (long long)b->min, (long long)b->opt, (long long)b->max);
    case SJ_BUCKET_NONE:
        break;
    }
    return snprintf(buf, n, "none");
}

/* -- SHAPEJIT_BUCKETS ---------------------------------------------------------- */

/* Comma-separated integers; returns the count, -1 for a malformed list or
 * a number out of int64's range (which strtoll would clamp), -2 for more
 * than max numbers. */
static int parse_ints(const char *s, int64_t *out, int max) {
    int n = 0;
    while (*s) {
        char *end;
        errno = 0;
        long long v = strtoll(s, &end, 10);
        if (end == s || errno == ERANGE) return -1;
        if (n == max) return -2;
        out[n++] = v;
        s = end;
        if (*s == ',') s++;
        else if (*s) return -1;
    }
    return n;
}

static sj_status parse_item(const char *item, sj_bucket_rule *r) {
    memset(r, 0, sizeof *r);
    const char *eq = strchr(item, '=');
    char head[128];
    if (!eq || (size_t)(eq - item) >= sizeof head)
        return sj_seterr(SJ_EINVAL, "SHAPEJIT_BUCKETS: '%s': expected NAME:INPUT:AXIS=KIND:ARGS", item);
    memcpy(head, item, (size_t)(eq - item));
    head[eq - item] = '\0';
    char *c2 = strrchr(head, ':');
    if (!c2) return sj_seterr(SJ_EINVAL, "SHAPEJIT_BUCKETS: '%s': expected NAME:INPUT:AXIS before '='", item);
    *c2 = '\0';
    char *c1 = strrchr(head, ':');
    if (!c1 || c1 == head || strlen(head) - 1 >= sizeof r->fn_name)
        return sj_seterr(SJ_EINVAL, "SHAPEJIT_BUCKETS: '%s': expected NAME:INPUT:AXIS before '='", item);
    *c1 = '\0';
    char *end;
    /* range-checked before the narrowing: 4294967296 is not input 0 */
    errno = 0;
    long long in = strtoll(c1 + 1, &end, 10);
    if (end == c1 + 1 || *end) return sj_seterr(SJ_EINVAL, "SHAPEJIT_BUCKETS: '%s': bad input index", item);
    if (errno == ERANGE || in < 0 || in >= SJ_MAX_INPUTS)
        return sj_seterr(SJ_EINVAL, "SHAPEJIT_BUCKETS: '%s': input index %s out of range [0, %d]", item, c1 + 1,
                         SJ_MAX_INPUTS - 1);
    errno = 0;
    long long ax = strtoll(c2 + 1, &end, 10);
    if (end == c2 + 1 || *end) return sj_seterr(SJ_EINVAL, "SHAPEJIT_BUCKETS: '%s': bad axis", item);
    if (errno == ERANGE || ax < 0 || ax >= SJ_MAX_RANK)
        return sj_seterr(SJ_EINVAL, "SHAPEJIT_BUCKETS: '%s': axis %s out of range [0, %d]", item, c2 + 1,
                         SJ_MAX_RANK - 1);
    r->input = (int)in;
    r->axis = (int)ax;
    snprintf(r->fn_name, sizeof r->fn_name, "%s", head);

    const char *spec = eq + 1, *colon = strchr(spec, ':');
    if (!colon) return sj_seterr(SJ_EINVAL, "SHAPEJIT_BUCKETS: '%s': expected KIND:ARGS after '='", item);
    int64_t v[SJ_BUCKET_MAX_BOUNDS];
    int n = parse_ints(colon + 1, v, SJ_BUCKET_MAX_BOUNDS);
    size_t klen = (size_t)(colon - spec);
    sj_status st;
    if (n == -2) st = sj_seterr(SJ_EINVAL, "more than %d numbers", SJ_BUCKET_MAX_BOUNDS);
    else if (n < 0) st = sj_seterr(SJ_EINVAL, "bad numbers (comma-separated integers within int64)");
    else if (klen == 4 && !strncmp(spec, "list", 4)) st = sj_bucket_list(&r->spec, v, n);
    else if (klen == 4 && !strncmp(spec, "pow2", 4)) st = n == 2 ? sj_bucket_pow2(&r->spec, v[0], v[1]) : sj_seterr(SJ_EINVAL, "pow2 takes LO,HI");
    else if (klen == 4 && !strncmp(spec, "mult", 4)) st = n == 1 ? sj_bucket_multiple(&r->spec, v[0]) : sj_seterr(SJ_EINVAL, "mult takes N");
    else if (klen == 7 && !strncmp(spec, "profile", 7))
        st = n == 3 ? sj_bucket_profile(&r->spec, v[0], v[1], v[2]) : sj_seterr(SJ_EINVAL, "profile takes MIN,OPT,MAX");
    else st = sj_seterr(SJ_EINVAL, "unknown kind (list, pow2, mult, profile)");
    if (st) sj_err_prefix("SHAPEJIT_BUCKETS: '%s': ", item);
    return st;
}

sj_status sj_bucket_parse(const char *text, sj_bucket_rule **rules, int *n_rules) {
    *rules = NULL;
    *n_rules = 0;
    if (!text) return SJ_OK;
    int cap = 1;
    for (const char *p = text; *p; p++) cap += *p == ';';
    sj_bucket_rule *rs = sj_calloc((size_t)cap, sizeof *rs);
    if (!rs) return sj_seterr(SJ_ENOMEM, "SHAPEJIT_BUCKETS: out of memory");
    int n = 0;
    const char *p = text;
    while (*p) {
        size_t len = strcspn(p, ";");
        char item[512];
        if (len >= sizeof item) {
            free(rs);
            return sj_seterr(SJ_EINVAL, "SHAPEJIT_BUCKETS: an item is longer than %zu characters", sizeof item - 1);
        }
        memcpy(item, p, len);
        item[len] = '\0';
        if (len > 0) {
            sj_status st = parse_item(item, &rs[n]);
            if (st) {
                free(rs);
                return st;
            }
            n++;
        }
        p += len;
        if (*p == ';') p++;
    }
    *rules = rs;
    *n_rules = n;
    return SJ_OK;
}
