/* buckets: configure shape buckets and see which sequence lengths share an
 * entry, and so a compiled kernel (as TensorRT optimization profiles or
 * torch.compile's bucketing do).
 *
 *   buckets [--quiet] [--explain]
 *
 * A small block, x [S, 256] -> layer norm -> linear 256->512 -> gelu ->
 * linear 512->256 -> + x, serves one fixed stream of 40 lengths (1..300,
 * with repeats and the sizes on and just past each bucket boundary) once per
 * configuration, each its own function:
 *
 *   no_buckets    STATIC policy, no rule: one entry per distinct length
 *   pow2          sj_set_buckets_pow2(fn, 0, 0, 16, 512)
 *   multiple      sj_set_buckets_multiple(fn, 0, 0, 64)
 *   list          sj_set_buckets(fn, 0, 0, (int64_t[]){32, 128, 256}, 3)
 *   profile       sj_set_profile(fn, 0, 0, 1, 128, 256): longer is SJ_ECONSTRAINT
 *   bucketed_env  the pow2 rule as text, in the SHAPEJIT_BUCKETS syntax
 *
 * no_buckets runs first; the others then run at once, a thread each. The
 * program lists each function's entries with the lengths they served, then a
 * table, and checks: entry counts as the stream predicts, every output equal
 * to the no-bucket one to float rounding, the longest equal to a double
 * reference. Exit 1 if any check fails. --quiet: only the table and the
 * verdict; --explain: also sj_fn_explain of the pow2 function.
 *
 * The same rules from the environment, without changing code:
 *   SHAPEJIT_BUCKETS='NAME:INPUT:AXIS=KIND:ARGS;...'
 *     KIND: list:B0,B1,...  pow2:LO,HI  mult:N  profile:MIN,OPT,MAX
 *     NAME: the name given to sj_fn_create, or '*' for every function
 *   e.g. SHAPEJIT_BUCKETS='encoder:0:1=pow2:16,512;*:0:0=list:1,8'
 * (This program sets cfg.buckets itself, so the variable does not change
 * its run.) A bucket is a range (lo, hi] of one dimension's sizes that one
 * entry serves; sizes 0 and 1 always get entries of their own.
 */
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "shapejit.h"

enum { D = 256, FF = 512, N_REQ = 40, MAX_LEN = 300, MAX_ENTRIES = 64 };

/* -- Weights and the model ------------------------------------------------------------ */

enum { G, B, W1, B1, W2, B2, N_W };
typedef struct weights {
    float *p[N_W];
    sj_tensor t[N_W];
} weights;

static uint64_t rng = 0x5eed5eed12345678ull;
static uint64_t next_u64(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}
static float frand(void) { /* uniform in [-1, 1) */
    return (float)((next_u64() >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

static void *xmalloc(size_t n) {
    void *p = malloc(n);
    if (!p) fprintf(stderr, "out of memory\n"), exit(1);
    return p;
}

static float *filled(size_t n, float scale, float offset) {
    float *p = xmalloc(n * sizeof *p);
    for (size_t i = 0; i < n; i++) p[i] = offset + scale * frand();
    return p;
}

static void weights_init(weights *w) {
    static const int64_t shape[N_W][2] = {{D}, {D}, {D, FF}, {FF}, {FF, D}, {D}};
    static const float scale[N_W] = {0.1f, 0.02f, 0.0625f /* 1/sqrt(D) */, 0.02f, 0.0442f /* 1/sqrt(FF) */, 0.02f};
    for (int i = 0; i < N_W; i++) {
        int rank = shape[i][1] ? 2 : 1;
        w->p[i] = filled((size_t)shape[i][0] * (rank == 2 ? (size_t)shape[i][1] : 1), scale[i], i == G ? 1.0f : 0);
        w->t[i] = sj_tensor_make(w->p[i], SJ_F32, rank, shape[i]);
    }
}

static sj_val linear(sj_tracer *t, sj_val x, const weights *w, int wi, int bi) {
    return sj_add(t, sj_matmul(t, x, sj_param(t, &w->t[wi])), sj_param(t, &w->t[bi]));
}

/* x [S, D] -> x + W2 gelu(W1 ln(x) + b1) + b2. Nothing here reads S (no
 * sj_size), so the model never pins it: the policy and the buckets alone
 * decide which lengths an entry covers. */
static sj_status block(sj_tracer *t, const sj_val *in, int n_in, void *user) {
    const weights *w = user;
    sj_val h = sj_layer_norm(t, in[0], sj_param(t, &w->t[G]), sj_param(t, &w->t[B]), 1e-5);
    h = linear(t, sj_gelu(t, linear(t, h, w, W1, B1)), w, W2, B2);
    return sj_output(t, sj_add(t, in[0], h));
}

/* The same block in double precision, row by row. */
static void block_ref(const weights *w, const float *x, int s, double *y) {
    double ln[D], hid[FF];
    for (int r = 0; r < s; r++) {
        const float *xr = x + (size_t)r * D;
        double mean = 0, var = 0;
        for (int k = 0; k < D; k++) mean += xr[k];
        mean /= D;
        for (int k = 0; k < D; k++) var += (xr[k] - mean) * (xr[k] - mean);
        double inv = 1.0 / sqrt(var / D + 1e-5);
        for (int k = 0; k < D; k++) ln[k] = (xr[k] - mean) * inv * w->p[G][k] + w->p[B][k];
        for (int j = 0; j < FF; j++) {
            double a = w->p[B1][j];
            for (int k = 0; k < D; k++) a += ln[k] * w->p[W1][(size_t)k * FF + j];
            hid[j] = 0.5 * a * (1.0 + erf(a / sqrt(2.0)));
        }
        for (int j = 0; j < D; j++) {
            double a = w->p[B2][j] + xr[j];
            for (int k = 0; k < FF; k++) a += hid[k] * w->p[W2][(size_t)k * D + j];
            y[(size_t)r * D + j] = a;
        }
    }
}

/* -- The configurations, and what the header says they do ------------------------------- */

typedef enum rule { RULE_NONE, RULE_POW2, RULE_MULT, RULE_LIST, RULE_PROFILE } rule;

typedef struct config {
    const char *name; /* function name (cfg.buckets matches it) and table label */
    const char *how;
    rule rule;
    bool from_text; /* configured by cfg.buckets rather than a call */
} config;

static const int64_t list_bounds[] = {32, 128, 256};
enum { POW2_LO = 16, POW2_HI = 512, MULT = 64, PROF_MIN = 1, PROF_OPT = 128, PROF_MAX = 256 };
#define TEXT_RULE "bucketed_env:0:0=pow2:16,512"

/* Which entry the documented rules put a length in, as a key that two
 * lengths share exactly when they should share an entry: the bucket's upper
 * end (INT64_MAX for the open one), the length itself without buckets, or
 * -1 - size for sizes 0 and 1 (specialized whatever the rule); 0 when the
 * length is rejected (outside the profile). The counts checked in main are
 * predictions from these, not numbers copied from an earlier run. */
static int64_t bucket_key(rule r, int64_t s) {
    if (r == RULE_PROFILE && (s < PROF_MIN || s > PROF_MAX)) return 0;
    if (s < 2) return -1 - s;
    int64_t b = POW2_LO;
    switch (r) {
    case RULE_NONE: return s;
    case RULE_POW2: /* bounds lo, 2lo, 4lo, ... up to the first >= hi, then (last, inf) */
        while (b < s && b < POW2_HI) b *= 2;
        return s <= b ? b : INT64_MAX;
    case RULE_MULT: return (s + MULT - 1) / MULT * MULT;
    case RULE_LIST:
        for (size_t i = 0; i < sizeof list_bounds / sizeof list_bounds[0]; i++)
            if (s <= list_bounds[i]) return list_bounds[i];
        return INT64_MAX;
    case RULE_PROFILE: return PROF_MAX;
    }
    return 0;
}

/* Distinct keys among the accepted lengths: the entries a rule should make
 * (with RULE_NONE, the number of distinct lengths). */
static int expected_entries(rule r, const int *lens) {
    int64_t keys[N_REQ];
    int nk = 0;
    for (int i = 0; i < N_REQ; i++) {
        int64_t k = bucket_key(r, lens[i]);
        int j = 0;
        while (j < nk && keys[j] != k) j++;
        if (k && j == nk) keys[nk++] = k;
    }
    return nk;
}

/* 40 lengths: the edges (1, 2, every bucket boundary above and the size
 * after it, the longest), the rest drawn from 1..MAX_LEN with one in four
 * repeating an earlier length, shuffled. 256 stays first: it equals the
 * feature size, so in that first trace the feature axis follows the bucket
 * (an axis of no rule equal to a bucketed size does), with a symbol of its
 * own that the matmul with the [256, 512] weight pins to 256; the bucket's
 * length stays free, and the checks below see that its entry serves the
 * bucket's other lengths too. */
static void make_stream(int *lens) {
    static const int edges[] = {D, 1, 2, 16, 17, 32, 33, 64, 65, 128, 129, 192, 193, 257, MAX_LEN};
    int n = 0;
    for (size_t i = 0; i < sizeof edges / sizeof edges[0]; i++) lens[n++] = edges[i];
    while (n < N_REQ)
        lens[n] = next_u64() % 4 == 0 ? lens[next_u64() % (uint64_t)n] : 1 + (int)(next_u64() % MAX_LEN), n++;
    for (int i = N_REQ - 1; i > 1; i--) {
        int j = 1 + (int)(next_u64() % (uint64_t)i), tmp = lens[i];
        lens[i] = lens[j], lens[j] = tmp;
    }
}

/* -- Serving the stream ---------------------------------------------------------------- */

typedef struct stream {
    int lens[N_REQ];
    float *x;          /* request i reads rows i .. i + lens[i] - 1: requests differ */
    float *ref[N_REQ]; /* no_buckets' outputs, the reference for the others */
} stream;

typedef struct run {
    const stream *s;
    sj_fn *fn;
    bool is_ref;  /* writes s->ref rather than comparing with it */
    sj_stats st;
    sj_entry_info ent[MAX_ENTRIES]; /* newest first */
    int n_ent, n_rejected, mismatches;
    double max_rel;       /* worst |y - ref| / max(|ref|, 1) */
    bool rejected[N_REQ]; /* the call returned SJ_ECONSTRAINT */
    int served[N_REQ];    /* id of the entry that served each request */
    char reject_msg[320]; /* the first rejection's status and sj_last_error() */
} run;

static void calls_by_entry(const sj_fn *fn, uint64_t *calls) {
    sj_entry_info info[MAX_ENTRIES];
    int n = sj_fn_entries(fn, info, MAX_ENTRIES);
    for (int i = 0; i < n && i < MAX_ENTRIES; i++)
        if (info[i].id < MAX_ENTRIES) calls[info[i].id] = info[i].calls;
}

/* Serve the stream through r->fn, in order (a pthread start routine). */
static void *serve(void *arg) {
    run *r = arg;
    const stream *s = r->s;
    float *y = r->is_ref ? NULL : xmalloc((size_t)MAX_LEN * D * sizeof(float));
    for (int i = 0; i < N_REQ; i++) {
        int64_t shape[2] = {s->lens[i], D};
        sj_tensor in = sj_tensor_make(s->x + (size_t)i * D, SJ_F32, 2, shape);
        sj_tensor out = sj_tensor_make(r->is_ref ? s->ref[i] : y, SJ_F32, 2, shape);
        uint64_t before[MAX_ENTRIES] = {0}, after[MAX_ENTRIES] = {0};
        calls_by_entry(r->fn, before);
        sj_status st = sj_call(r->fn, &in, 1, &out, 1);
        r->served[i] = -1;
        if (st == SJ_ECONSTRAINT) { /* outside the profile: nothing changes, later calls go on */
            if (!r->n_rejected++)
                snprintf(r->reject_msg, sizeof r->reject_msg, "%s: %s", sj_status_name(st), sj_last_error());
            r->rejected[i] = true;
            continue;
        }
        if (st) {
            fprintf(stderr, "request %d (S=%d) failed: %s: %s\n", i, s->lens[i], sj_status_name(st), sj_last_error());
            exit(1);
        }
        calls_by_entry(r->fn, after);
        for (int e = 0; e < MAX_ENTRIES; e++)
            if (after[e] > before[e]) r->served[i] = e;
        for (size_t k = 0; y && k < (size_t)s->lens[i] * D; k++) {
            double m = fabs((double)s->ref[i][k]), rel = fabs((double)y[k] - s->ref[i][k]) / (m > 1 ? m : 1);
            if (rel > r->max_rel) r->max_rel = rel;
            r->mismatches += !(rel <= 1e-5); /* NaN counts too */
        }
    }
    free(y);
    sj_fn_stats(r->fn, &r->st);
    r->n_ent = sj_fn_entries(r->fn, r->ent, MAX_ENTRIES);
    if (r->n_ent > MAX_ENTRIES) r->n_ent = MAX_ENTRIES;
    return NULL;
}

/* Each entry, oldest first, with the lengths it served. */
static void print_entries(const run *r, const int *lens) {
    for (int k = r->n_ent - 1; k >= 0; k--) {
        const sj_entry_info *e = &r->ent[k];
        bool seen[MAX_LEN + 1] = {0};
        for (int i = 0; i < N_REQ; i++) seen[lens[i]] |= r->served[i] == e->id;
        printf("    entry %d  %-40s %-18s %2llu calls  S =", e->id, e->what, e->tier, (unsigned long long)e->calls);
        for (int s = 0; s <= MAX_LEN; s++)
            if (seen[s]) printf(" %d", s);
        printf("\n");
    }
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int failures;
static void check(bool ok, const char *who, const char *what, long long got, long long want) {
    if (ok) return;
    fprintf(stderr, "CHECK FAILED: %s: %s: got %lld, expected %lld\n", who, what, got, want);
    failures++;
}

int main(int argc, char **argv) {
    bool quiet = false, explain = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quiet")) quiet = true;
        else if (!strcmp(argv[i], "--explain")) explain = true;
        else {
            fprintf(stderr, "usage: %s [--quiet] [--explain]\n", argv[0]);
            return 2;
        }
    }
    double t_start = now_ms();
    weights w;
    weights_init(&w);
    stream reqs;
    make_stream(reqs.lens);
    const int *lens = reqs.lens;
    reqs.x = filled((size_t)(MAX_LEN + N_REQ) * D, 1.0f, 0);

    /* Two runtimes on the CPU backend (host buffers here; varlen_encoder
     * shows device buffers), without a persistent kernel cache, so compiles
     * are real compiles, not cache loads.
     * - jit: compile_mode SYNC with hot_threshold 1 compiles each entry on
     *   the call that traced it, before it returns: a table free of timing.
     * - eager: the baseline, whose one entry per length would cost a compile
     *   (~0.5 s) each; its results are every other output's reference. The
     *   text rule runs here too, sparing its compiles: the entries a bucket
     *   makes are decided when tracing, whatever the tier. cfg.buckets is
     *   the SHAPEJIT_BUCKETS text (replacing what the variable said); a
     *   function gets the rules naming it when it is created. */
    sj_runtime_config cfg;
    sj_runtime_config_init(&cfg);
    cfg.backend = SJ_BACKEND_CPU;
    cfg.cache_dir = NULL;
    cfg.compile_mode = SJ_COMPILE_SYNC;
    cfg.hot_threshold = 1;
    cfg.buckets = NULL;
    sj_runtime *rt_jit = NULL, *rt_eager = NULL;
    sj_status st = sj_runtime_create(&cfg, &rt_jit);
    cfg.compile_mode = SJ_COMPILE_OFF;
    cfg.buckets = TEXT_RULE;
    if (!st) st = sj_runtime_create(&cfg, &rt_eager);
    if (st) {
        fprintf(stderr, "runtime: %s: %s\n", sj_status_name(st), sj_last_error());
        sj_runtime_destroy(rt_jit); /* NULL if it was the one that failed */
        return 1;
    }

    /* STATIC: every size a constant, so without buckets each length is an
     * entry of its own. The default recompile limit (8) would stop that at 8
     * and send the other lengths to one symbolic fallback entry; 64 shows
     * the whole cost of not bucketing. Buckets override the policy on their
     * own dimension. */
    sj_fn_options opt;
    sj_fn_options_init(&opt);
    opt.dynamic = SJ_DYNAMIC_STATIC;
    opt.recompile_limit = MAX_ENTRIES;
    opt.input_names = (const char *const[]){"x"};

    enum { C_NONE, C_POW2, C_MULT, C_LIST, C_PROFILE, C_TEXT, N_CFG }; /* C_NONE first: the reference */
    static const config configs[N_CFG] = {
        [C_NONE] = {"no_buckets", "STATIC, no rule (eager)", RULE_NONE, false},
        [C_POW2] = {"pow2", "sj_set_buckets_pow2 16,512", RULE_POW2, false},
        [C_MULT] = {"multiple", "sj_set_buckets_multiple 64", RULE_MULT, false},
        [C_LIST] = {"list", "sj_set_buckets 32,128,256", RULE_LIST, false},
        [C_PROFILE] = {"profile", "sj_set_profile 1,128,256", RULE_PROFILE, false},
        [C_TEXT] = {"bucketed_env", "text " TEXT_RULE " (eager)", RULE_POW2, true},
    };
    sj_fn *fns[N_CFG];
    for (int c = 0; c < N_CFG; c++) {
        const config *cf = &configs[c];
        sj_runtime *rt = cf->rule == RULE_NONE || cf->from_text ? rt_eager : rt_jit;
        st = sj_fn_create(rt, cf->name, 1, block, &w, &opt, &fns[c]);
        if (!st && cf->rule == RULE_POW2 && !cf->from_text) st = sj_set_buckets_pow2(fns[c], 0, 0, POW2_LO, POW2_HI);
        if (!st && cf->rule == RULE_MULT) st = sj_set_buckets_multiple(fns[c], 0, 0, MULT);
        if (!st && cf->rule == RULE_LIST) st = sj_set_buckets(fns[c], 0, 0, list_bounds, 3);
        if (!st && cf->rule == RULE_PROFILE) st = sj_set_profile(fns[c], 0, 0, PROF_MIN, PROF_OPT, PROF_MAX);
        if (st) {
            fprintf(stderr, "%s: %s: %s\n", cf->name, sj_status_name(st), sj_last_error());
            return 1;
        }
    }

    int n_distinct = expected_entries(RULE_NONE, lens);
    if (!quiet) {
        printf("buckets: x [S, %d] -> layer norm -> linear %d->%d -> gelu -> linear %d->%d -> + x, CPU\n", D, D, FF,
               FF, D);
        printf("%d requests, %d distinct lengths:", N_REQ, n_distinct);
        for (int i = 0; i < N_REQ; i++) printf(" %d", lens[i]);
        printf("\n");
    }

    /* The baseline first: its outputs are the reference for the rest. The
     * others then run at once, one thread each. sj_call may be called from
     * any thread, and in SYNC mode a compile runs on the calling thread, so
     * their compiles overlap on several cores; each function still sees the
     * stream in order, so its entries are what a single thread would get. */
    for (int i = 0; i < N_REQ; i++) reqs.ref[i] = xmalloc((size_t)lens[i] * D * sizeof(float));
    static run runs[N_CFG];
    pthread_t th[N_CFG];
    for (int c = 0; c < N_CFG; c++) runs[c] = (run){.s = &reqs, .fn = fns[c], .is_ref = c == C_NONE};
    serve(&runs[C_NONE]);
    for (int c = C_NONE + 1; c < N_CFG; c++)
        if (pthread_create(&th[c], NULL, serve, &runs[c])) {
            fprintf(stderr, "cannot start a thread\n");
            return 1;
        }
    for (int c = C_NONE + 1; c < N_CFG; c++) pthread_join(th[c], NULL);
    double worst = 0;
    for (int c = 0; c < N_CFG; c++) {
        worst = runs[c].max_rel > worst ? runs[c].max_rel : worst;
        if (quiet) continue;
        printf("\n%s: %s; %.0f ms compiling\n", configs[c].name, configs[c].how, runs[c].st.compile_ms);
        if (runs[c].n_rejected) printf("    first rejection: %s\n", runs[c].reject_msg);
        if (c != C_NONE) print_entries(&runs[c], lens);
        else printf("    one static entry per distinct length (--explain shows the pow2 function's)\n");
    }
    if (explain) {
        printf("\n");
        sj_fn_explain(fns[C_POW2], stdout);
    }

    /* The baseline's longest output against double precision. */
    int lng = 0;
    for (int i = 1; i < N_REQ; i++) lng = lens[i] > lens[lng] ? i : lng;
    double *yd = xmalloc((size_t)lens[lng] * D * sizeof(double)), ref_err = 0;
    block_ref(&w, reqs.x + (size_t)lng * D, lens[lng], yd);
    int ref_bad = 0;
    for (size_t k = 0; k < (size_t)lens[lng] * D; k++) {
        double d = fabs(reqs.ref[lng][k] - yd[k]) / (fabs(yd[k]) > 1 ? fabs(yd[k]) : 1);
        ref_err = d > ref_err ? d : ref_err;
        ref_bad += !(d <= 1e-4);
    }

    printf("\n%-13s %-42s %7s %7s %6s %8s %5s %8s\n", "config", "rule", "lengths", "entries", "traces", "compiles",
           "fused", "rejected");
    for (int c = 0; c < N_CFG; c++) {
        const sj_stats *s = &runs[c].st;
        printf("%-13s %-42s %7d %7llu %6llu %8llu %5llu %8d\n", configs[c].name, configs[c].how, n_distinct,
               (unsigned long long)s->entries, (unsigned long long)s->traces, (unsigned long long)s->compiles,
               (unsigned long long)(s->fused_symbolic_calls + s->fused_specialized_calls), runs[c].n_rejected);
    }

    /* The checks: entries as the stream predicts; rejected exactly the
     * lengths the rule leaves out (those past the profile, none elsewhere);
     * the text rule builds the very entries of the call it spells; results
     * equal to float rounding. */
    int mismatches = 0;
    for (int c = 0; c < N_CFG; c++) {
        const run *r = &runs[c];
        int want = expected_entries(configs[c].rule, lens), wrong = 0, want_rej = 0, lost = 0;
        for (int i = 0; i < N_REQ; i++) {
            bool out = bucket_key(configs[c].rule, lens[i]) == 0;
            want_rej += out, wrong += out != r->rejected[i];
            lost += !r->rejected[i] && r->served[i] < 0; /* no entry's calls went up */
        }
        check((int)r->st.entries == want, configs[c].name, "entries", (long long)r->st.entries, want);
        check(!wrong, configs[c].name, "requests rejected", r->n_rejected, want_rej);
        check(!lost, configs[c].name, "served requests no entry counted", lost, 0);
        mismatches += r->mismatches;
    }
    const run *a = &runs[C_POW2], *b = &runs[C_TEXT];
    bool same = a->n_ent == b->n_ent;
    for (int k = 0; same && k < a->n_ent; k++)
        same = a->ent[k].calls == b->ent[k].calls && !strcmp(a->ent[k].what, b->ent[k].what);
    check(same, configs[C_TEXT].name, "entries like pow2's", b->n_ent, a->n_ent);
    check(!mismatches, "outputs", "elements off no_buckets' by more than 1e-5", mismatches, 0);
    check(!ref_bad, "outputs", "elements off the double reference by more than 1e-4", ref_bad, 0);

    printf("\n%s: %d mismatches against no_buckets (worst %.2g); S=%d against double precision: worst %.2g; "
           "%.1f s\n", failures ? "FAIL" : "OK", mismatches, worst, lens[lng], ref_err, (now_ms() - t_start) / 1e3);

    free(yd);
    for (int i = 0; i < N_REQ; i++) free(reqs.ref[i]);
    for (int c = 0; c < N_CFG; c++) sj_fn_destroy(fns[c]);
    sj_runtime_destroy(rt_jit);
    sj_runtime_destroy(rt_eager);
    free(reqs.x);
    for (int i = 0; i < N_W; i++) free(w.p[i]);
    return failures ? 1 : 0;
}
