/* libFuzzer: random sequences of public API calls (issue 25, item 5).
 *
 * The input's bytes drive two runtimes on the CPU backend side by side
 * through the same sequence: one eager (compiles off), one fused (every
 * entry compiled synchronously on its first call, hot_threshold 1, through
 * a persistent kernel cache in $SJ_FUZZ_CACHE_DIR, default
 * build-fuzz/kcache, so a unit is compiled once across runs). The sequence:
 * function creation and destruction, calls with tensors of ranks 0..9,
 * sizes 0, 1, small and huge, any strides (0, contiguous, huge, negative),
 * any dtype number, NULL data, marks, buckets and profiles, stats and
 * explain. Every call must return SJ_OK, or an error with a message; never
 * crash, leak or hit undefined behaviour. Both runtimes must return the
 * same status, and a successful call the same result: f32 within 1e-5
 * (relative; reductions may sum in another order), integers and bools bit
 * for bit. A successful x + y over f32 is also checked against a plain
 * sum. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jit/shapejit.h"

typedef struct src {
    const unsigned char *p;
    size_t n;
} src;

static unsigned byte(src *s) {
    if (!s->n) return 0;
    s->n--;
    return *s->p++;
}

static int64_t pick_size(src *s) {
    static const int64_t sizes[] = {0, 1, 2, 3, 4, 7, 16, 33, INT64_C(1) << 20, INT64_C(1) << 40, INT64_C(1) << 62, -1};
    return sizes[byte(s) % (sizeof sizes / sizeof sizes[0])];
}

static sj_status m_add(sj_tracer *t, const sj_val *in, int n, void *u) {
    (void)n, (void)u;
    return sj_output(t, sj_add(t, in[0], in[1]));
}

static sj_status m_row(sj_tracer *t, const sj_val *in, int n, void *u) {
    (void)n, (void)u;
    return sj_output(t, sj_softmax(t, sj_relu(t, in[0]), -1));
}

static sj_status m_sum(sj_tracer *t, const sj_val *in, int n, void *u) {
    (void)n, (void)u;
    return sj_output(t, sj_sum(t, sj_mul(t, in[0], in[0]), 0, 0));
}

#define BUF_ELEMS 4096
static float buf[2][BUF_ELEMS];

static void need_message(sj_status st) {
    if (st != SJ_OK && !sj_last_error()[0]) abort(); /* an error without a message */
}

/* A tensor descriptor from the input: data points into buf[k] when the
 * elements it addresses lie inside it, else NULL (an error unless empty). */
static sj_tensor make_tensor(src *s, int k, bool *fits) {
    sj_tensor t;
    memset(&t, 0, sizeof t);
    unsigned d = byte(s) % 10;
    t.dtype = (sj_dtype)(d < 7 ? SJ_F32 : d - 7 + 4); /* mostly f32; some other and invalid numbers */
    t.rank = (int32_t)(byte(s) % 10);                  /* 9 is past SJ_MAX_RANK */
    t.device = byte(s) % 16 == 0 ? (sj_device)5 : SJ_HOST;
    int r = t.rank < SJ_MAX_RANK ? t.rank : SJ_MAX_RANK;
    for (int a = 0; a < r; a++) t.shape[a] = byte(s) % 4 ? (int64_t)(byte(s) % 5) : pick_size(s);
    int64_t st = 1;
    for (int a = r - 1; a >= 0; a--) {
        t.stride[a] = st;
        int64_t e = t.shape[a] > 0 ? t.shape[a] : 1;
        st = st > (INT64_C(1) << 50) / e ? INT64_C(1) << 50 : st * e; /* saturated: the harness has no overflow of its own */
        unsigned m = byte(s) % 8;
        if (m == 0) t.stride[a] = 0;
        else if (m == 1) t.stride[a] = pick_size(s);
        else if (m == 2) t.stride[a] = -(int64_t)(byte(s) % 3);
    }
    /* the largest offset addressed, if it can be computed without overflow */
    bool empty = false, ok = true;
    int64_t last = 0;
    for (int a = 0; a < r; a++) {
        if (t.shape[a] == 0) empty = true;
        if (t.shape[a] < 0 || t.stride[a] < 0) ok = false;
    }
    for (int a = 0; a < r && ok; a++) {
        if (t.shape[a] <= 1) continue;
        if (t.stride[a] > BUF_ELEMS || t.shape[a] > BUF_ELEMS) ok = false;
        else last += (t.shape[a] - 1) * t.stride[a];
    }
    int64_t numel = 1;
    for (int a = 0; a < r && ok; a++) {
        if (t.shape[a] > BUF_ELEMS || numel * (t.shape[a] > 0 ? t.shape[a] : 1) > BUF_ELEMS) ok = false;
        else numel *= t.shape[a] > 0 ? t.shape[a] : 1;
    }
    /* outputs stay small too: a broadcast of two such is at most BUF_ELEMS^2 elements */
    *fits = empty || (ok && last < BUF_ELEMS / 2); /* f32 or smaller: inside buf; room for 8-byte dtypes */
    t.data = byte(s) % 16 == 0 ? NULL : *fits ? buf[k] : NULL;
    return t;
}

/* The fused result against the eager one (see the top). */
static void compare(const sj_tensor *e, const sj_tensor *f) {
    if (e->dtype != f->dtype || e->rank != f->rank) abort();
    int64_t n = 1;
    for (int a = 0; a < e->rank; a++) {
        if (e->shape[a] != f->shape[a]) abort();
        n *= e->shape[a];
    }
    if (n == 0) return;
    if (e->dtype == SJ_F32) {
        const float *x = e->data, *y = f->data;
        for (int64_t i = 0; i < n; i++) {
            double d = (double)x[i] - (double)y[i], m = x[i] < 0 ? -(double)x[i] : x[i];
            if (x[i] != x[i] ? y[i] == y[i] : (d < 0 ? -d : d) > 1e-5 * (m > 1 ? m : 1)) abort();
        }
    } else if (e->dtype == SJ_I32 || e->dtype == SJ_I64 || e->dtype == SJ_BOOL) {
        size_t es = e->dtype == SJ_I64 ? 8 : e->dtype == SJ_I32 ? 4 : 1;
        if (memcmp(e->data, f->data, (size_t)n * es)) abort();
    }
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size) {
    src s = {data, size};
    const char *cache = getenv("SJ_FUZZ_CACHE_DIR");
    sj_runtime *rt[2] = {NULL, NULL}; /* eager, fused */
    int limit = 1 + (int)(byte(&s) % 4);
    for (int r = 0; r < 2; r++) {
        sj_runtime_config cfg;
        sj_runtime_config_init(&cfg);
        cfg.backend = SJ_BACKEND_CPU;
        cfg.compile_mode = r ? SJ_COMPILE_SYNC : SJ_COMPILE_OFF;
        cfg.cache_dir = r ? (cache && *cache ? cache : "build-fuzz/kcache") : NULL;
        cfg.hot_threshold = 1;
        cfg.exec_threads = 1;
        cfg.log_mask = 0;
        cfg.recompile_limit = limit;
        sj_status st = sj_runtime_create(&cfg, &rt[r]);
        need_message(st);
        if (st) {
            sj_runtime_destroy(rt[0]);
            return 0;
        }
    }
    for (int i = 0; i < BUF_ELEMS; i++) buf[0][i] = (float)(i % 7) - 3, buf[1][i] = (float)(i % 5) * 0.5f;
    sj_fn *fns[2][2] = {{NULL, NULL}, {NULL, NULL}}; /* [runtime][function] */
    int kind[2] = {0, 0};
    static sj_model_fn const models[] = {m_add, m_row, m_sum};
    static const int n_in[] = {2, 1, 1};
    sj_status st, st2;
    for (int step = 0; step < 24 && s.n; step++) {
        int f = byte(&s) & 1;
        unsigned op = byte(&s) % 8;
        if (!fns[0][f] && op != 7) op = 0;
        switch (op) {
        case 0: { /* create (or re-create) */
            kind[f] = (int)(byte(&s) % 3);
            sj_fn_options o;
            sj_fn_options_init(&o);
            o.dynamic = (sj_dynamic)(byte(&s) % 3);
            o.limit_is_error = byte(&s) & 1;
            for (int r = 0; r < 2; r++) {
                sj_fn_destroy(fns[r][f]);
                fns[r][f] = NULL;
                st = sj_fn_create(rt[r], f ? "g" : "f", n_in[kind[f]], models[kind[f]], NULL, &o, &fns[r][f]);
                need_message(st);
                if (r && (st != SJ_OK) != (fns[0][f] == NULL)) abort();
            }
            break;
        }
        case 1: case 2: case 3: { /* call */
            bool fits[2];
            sj_tensor in[2] = {make_tensor(&s, 0, &fits[0]), make_tensor(&s, 1, &fits[1])};
            sj_tensor out, out2;
            memset(&out, 0, sizeof out); /* the runtime allocates */
            memset(&out2, 0, sizeof out2);
            /* no call that would make a huge output: a broadcast of small
             * inputs stays small, but a sum over an empty axis 0 of
             * [0, 2^40] is 2^40 zeros, which the fuzzer's malloc limit
             * reports (the library itself would return SJ_ENOMEM) */
            if (kind[f] == 2 && in[0].rank >= 1 && in[0].rank <= SJ_MAX_RANK && in[0].shape[0] == 0) {
                int64_t rest = 1;
                for (int a = 1; a < in[0].rank; a++) {
                    int64_t e = in[0].shape[a] > 0 ? in[0].shape[a] : 1;
                    rest = rest > BUF_ELEMS * 4 / e ? BUF_ELEMS * 4 + 1 : rest * e;
                }
                if (rest > BUF_ELEMS * 4) break;
            }
            if (getenv("FUZZ_API_DEBUG"))
                for (int k = 0; k < n_in[kind[f]]; k++) {
                    fprintf(stderr, "model %d in%d dtype %d rank %d data %p:", kind[f], k, (int)in[k].dtype, in[k].rank, in[k].data);
                    for (int a = 0; a < in[k].rank && a < SJ_MAX_RANK; a++)
                        fprintf(stderr, " %lld/%lld", (long long)in[k].shape[a], (long long)in[k].stride[a]);
                    fprintf(stderr, "\n");
                }
            st = sj_call(fns[0][f], in, n_in[kind[f]], &out, 1);
            need_message(st);
            st2 = sj_call(fns[1][f], in, n_in[kind[f]], &out2, 1);
            need_message(st2);
            if (st != st2) abort();
            if (!st) compare(&out, &out2);
            if (!st && kind[f] == 0 && in[0].dtype == SJ_F32 && in[1].dtype == SJ_F32 && in[0].rank == 1 &&
                in[1].rank == 1 && in[0].shape[0] == in[1].shape[0] && out.dtype == SJ_F32) {
                const float *a = in[0].data, *b = in[1].data, *y = out.data;
                for (int64_t i = 0; i < in[0].shape[0]; i++)
                    if (y[i] != a[i * in[0].stride[0]] + b[i * in[1].stride[0]]) abort();
            }
            sj_tensor_free(rt[0], &out);
            sj_tensor_free(rt[1], &out2);
            break;
        }
        case 4: { /* marks */
            int input = (int)(byte(&s) % 4) - 1, axis = (int)(byte(&s) % 11) - 1;
            int64_t lo = pick_size(&s), hi = pick_size(&s);
            unsigned how = byte(&s) % 3;
            for (int r = 0; r < 2; r++) {
                switch (how) {
                case 0: st = sj_mark_dynamic(fns[r][f], input, axis, lo, hi); break;
                case 1: st = sj_mark_static(fns[r][f], input, axis); break;
                default: st = sj_mark_dynamic(fns[r][f], input, axis, 1, 64); break;
                }
                need_message(st);
                if (r && st != st2) abort();
                st2 = st;
            }
            break;
        }
        case 5: { /* buckets */
            int input = (int)(byte(&s) % 3) - 1, axis = (int)(byte(&s) % 10) - 1;
            int64_t a = pick_size(&s), b = pick_size(&s), c = pick_size(&s);
            int64_t list[4] = {a, b, c, pick_size(&s)};
            unsigned how = byte(&s) % 4;
            int n_list = (int)(byte(&s) % 5);
            for (int r = 0; r < 2; r++) {
                switch (how) {
                case 0: st = sj_set_buckets_pow2(fns[r][f], input, axis, a, b); break;
                case 1: st = sj_set_buckets_multiple(fns[r][f], input, axis, a); break;
                case 2: st = sj_set_profile(fns[r][f], input, axis, a, b, c); break;
                default: st = sj_set_buckets(fns[r][f], input, axis, list, n_list); break;
                }
                need_message(st);
                if (r && st != st2) abort();
                st2 = st;
            }
            break;
        }
        case 6: { /* observe */
            sj_stats stats;
            sj_fn_stats(fns[1][f], &stats);
            FILE *devnull = fopen("/dev/null", "w");
            if (devnull) {
                sj_fn_explain(fns[1][f], devnull);
                fclose(devnull);
            }
            break;
        }
        default: /* destroy, NULL included */
            for (int r = 0; r < 2; r++) {
                sj_fn_destroy(fns[r][f]);
                fns[r][f] = NULL;
            }
            break;
        }
    }
    for (int r = 0; r < 2; r++) {
        sj_fn_destroy(fns[r][0]);
        sj_fn_destroy(fns[r][1]);
        sj_runtime_destroy(rt[r]);
    }
    return 0;
}
