/* Bucket edges learned from traffic (see bucket_learn.h). */
#include "base/alloc.h"
#include "shapes/bucket_learn.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"

/* -- The model ------------------------------------------------------------------ */

sj_status sj_learn_model_check(const sj_learn_model *m) {
    if (!m) return sj_seterr(SJ_EINVAL, "learn buckets: model is NULL");
    const struct {
        const char *name;
        double v;
    } f[] = {{"call_us", m->call_us},
             {"size_us", m->size_us},
             {"symbolic_overhead", m->symbolic_overhead},
             {"bucket_us", m->bucket_us},
             {"horizon_calls", m->horizon_calls}};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        if (!isfinite(f[i].v) || f[i].v < 0)
            return sj_seterr(SJ_EINVAL, "learn buckets: %s %g is negative or not finite", f[i].name, f[i].v);
    if (m->max_buckets < 1 || m->max_buckets > SJ_BUCKET_MAX_BOUNDS)
        return sj_seterr(SJ_EINVAL, "learn buckets: max_buckets %d out of range [1, %d]", m->max_buckets,
                         SJ_BUCKET_MAX_BOUNDS);
    return SJ_OK;
}

typedef struct pair {
    int64_t s;
    uint64_t c;
} pair;

static int cmp_pair(const void *a, const void *b) {
    int64_t x = ((const pair *)a)->s, y = ((const pair *)b)->s;
    return x < y ? -1 : x > y;
}

int sj_learn_normalize(int64_t *sizes, uint64_t *counts, int n) {
    if (n <= 0) return 0;
    pair *p = sj_malloc((size_t)n * sizeof *p);
    int k = 0;
    if (!p) { /* in place, quadratic: still correct */
        for (int i = 0; i < n; i++) {
            if (sizes[i] < 2 || !counts[i]) continue;
            int j = 0;
            while (j < k && sizes[j] != sizes[i]) j++;
            if (j < k) counts[j] += counts[i];
            else sizes[k] = sizes[i], counts[k++] = counts[i];
        }
        for (int i = 1; i < k; i++) /* insertion sort */
            for (int j = i; j > 0 && sizes[j - 1] > sizes[j]; j--) {
                int64_t ts = sizes[j];
                uint64_t tc = counts[j];
                sizes[j] = sizes[j - 1], counts[j] = counts[j - 1];
                sizes[j - 1] = ts, counts[j - 1] = tc;
            }
        return k;
    }
    int m = 0;
    for (int i = 0; i < n; i++)
        if (sizes[i] >= 2 && counts[i]) p[m++] = (pair){sizes[i], counts[i]};
    qsort(p, (size_t)m, sizeof *p, cmp_pair);
    for (int i = 0; i < m; i++) {
        if (k && sizes[k - 1] == p[i].s) counts[k - 1] += p[i].c;
        else sizes[k] = p[i].s, counts[k++] = p[i].c;
    }
    free(p);
    return k;
}

/* Running sums over the sizes: calls, and calls * size. */
typedef struct sums {
    const int64_t *s;
    double *c, *cs; /* n + 1 each: prefix sums */
    double total;
} sums;

static bool sums_init(sums *z, const int64_t *sizes, const uint64_t *counts, int n) {
    z->s = sizes;
    z->c = sj_malloc((size_t)(n + 1) * 2 * sizeof(double));
    if (!z->c) return false;
    z->cs = z->c + n + 1;
    z->c[0] = z->cs[0] = 0;
    for (int i = 0; i < n; i++) {
        z->c[i + 1] = z->c[i] + (double)counts[i];
        z->cs[i + 1] = z->cs[i] + (double)counts[i] * (double)sizes[i];
    }
    z->total = z->c[n];
    return true;
}

/* Calls of sizes i .. j (inclusive) in one bucket with edge `edge`: their
 * cost (unscaled) plus the bucket's share of bucket_us at this scale. */
static double group_cost(const sums *z, int i, int j, int64_t edge, const sj_learn_model *m, double per_bucket) {
    double c = z->c[j + 1] - z->c[i], cs = z->cs[j + 1] - z->cs[i];
    double f = j > i ? 1.0 + m->symbolic_overhead : 1.0;
    double work = m->pad ? c * (double)edge : cs;
    return c * m->call_us + m->size_us * f * work + per_bucket;
}

/* bucket_us in the unscaled units of the sums. */
static double per_bucket(const sums *z, const sj_learn_model *m) {
    double scale = m->horizon_calls > 0 ? m->horizon_calls / z->total : 1.0;
    return m->bucket_us / scale;
}

/* -- Costs of given buckets ------------------------------------------------------ */

static double cost_by_find(const int64_t *sizes, const uint64_t *counts, int n, const sj_bucket_spec *spec,
                           const sj_learn_model *m, int *n_buckets) {
    *n_buckets = 0;
    if (n <= 0) return 0;
    sums z;
    if (!sums_init(&z, sizes, counts, n)) return NAN;
    double pb = per_bucket(&z, m), total = 0;
    if (!spec || spec->kind == SJ_BUCKET_NONE) {
        total = group_cost(&z, 0, n - 1, sizes[n - 1], m, pb);
        *n_buckets = 1;
    } else {
        int i = 0;
        while (i < n) {
            int64_t lo, hi;
            if (!sj_bucket_find(spec, sizes[i], &lo, &hi)) { /* outside a profile: a static entry of its own */
                total += group_cost(&z, i, i, sizes[i], m, pb);
                ++*n_buckets;
                i++;
                continue;
            }
            int j = i;
            while (j + 1 < n && sizes[j + 1] <= hi) j++;
            total += group_cost(&z, i, j, hi == INT64_MAX ? sizes[j] : hi, m, pb);
            ++*n_buckets;
            i = j + 1;
        }
    }
    double r = total / z.total;
    free(z.c);
    return r;
}

double sj_learn_cost_spec(const int64_t *sizes, const uint64_t *counts, int n, const sj_bucket_spec *spec,
                          const sj_learn_model *m, int *n_buckets) {
    int nb;
    double r = cost_by_find(sizes, counts, n, spec, m, &nb);
    if (n_buckets) *n_buckets = nb;
    return r;
}

double sj_learn_cost_edges(const int64_t *sizes, const uint64_t *counts, int n, const int64_t *edges, int n_edges,
                           const sj_learn_model *m) {
    sj_bucket_spec spec;
    if (sj_bucket_list(&spec, edges, n_edges)) return NAN;
    int nb;
    return cost_by_find(sizes, counts, n, &spec, m, &nb);
}

/* -- The chooser ------------------------------------------------------------------- */

sj_status sj_learn_choose(const int64_t *sizes, const uint64_t *counts, int n, const sj_learn_model *m,
                          int64_t *edges, int *n_edges, double *cost) {
    sj_status st = sj_learn_model_check(m);
    if (st) return st;
    if (!sizes || !counts || !edges || !n_edges || n < 1)
        return sj_seterr(SJ_EINVAL, "learn buckets: no sizes to learn from");
    for (int i = 0; i < n; i++)
        if (sizes[i] < 2 || !counts[i] || (i && sizes[i] <= sizes[i - 1]))
            return sj_seterr(SJ_EINVAL, "learn buckets: size %lld at %d is < 2, has no calls or does not increase",
                             (long long)sizes[i], i);
    sums z;
    if (!sums_init(&z, sizes, counts, n)) return sj_seterr(SJ_ENOMEM, "learn buckets: out of memory");
    double pb = per_bucket(&z, m);
    int K = m->max_buckets < n ? m->max_buckets : n;
    /* f[k][j]: least cost of sizes 0 .. j-1 in k buckets; from[k][j]: the
     * first size of the last of them. */
    size_t w = (size_t)n + 1;
    double *f = sj_malloc((size_t)(K + 1) * w * sizeof *f);
    int *from = sj_malloc((size_t)(K + 1) * w * sizeof *from);
    if (!f || !from) {
        free(f), free(from), free(z.c);
        return sj_seterr(SJ_ENOMEM, "learn buckets: out of memory");
    }
    for (size_t x = 0; x < (size_t)(K + 1) * w; x++) f[x] = INFINITY, from[x] = -1;
    f[0] = 0;
    for (int k = 1; k <= K; k++)
        for (int j = k; j <= n; j++) {
            double best = INFINITY;
            int arg = -1;
            for (int i = k - 1; i < j; i++) { /* the last bucket: sizes i .. j-1 */
                double prev = f[(size_t)(k - 1) * w + (size_t)i];
                if (prev == INFINITY) continue;
                double v = prev + group_cost(&z, i, j - 1, sizes[j - 1], m, pb);
                if (v < best) best = v, arg = i;
            }
            f[(size_t)k * w + (size_t)j] = best, from[(size_t)k * w + (size_t)j] = arg;
        }
    int bk = 1;
    for (int k = 2; k <= K; k++)
        if (f[(size_t)k * w + (size_t)n] < f[(size_t)bk * w + (size_t)n]) bk = k;
    if (cost) *cost = f[(size_t)bk * w + (size_t)n] / z.total;
    for (int k = bk, j = n; k > 0; k--) {
        edges[k - 1] = sizes[j - 1];
        j = from[(size_t)k * w + (size_t)j];
    }
    free(f), free(from), free(z.c);
    *n_edges = bk;
    return SJ_OK;
}
