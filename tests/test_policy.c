/* Guards, symbolic shapes and the recompile policy, end to end: sequences
 * of calls with the expected number of traces and the entry that serves
 * each call, for every policy, mark and bucket kind; limits; duck sizing;
 * 0/1 specialization; dtype and stride changes; observability. Every result
 * is compared with a fresh eager run (a new function traced for exactly that
 * call), bit for bit. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jit/shapejit.h"
#include "tests/util.h"

static sj_runtime *rt;

/* Log lines, captured. */
typedef struct sink {
    pthread_mutex_t lock;
    int n;
    char lines[64][512];
    unsigned topics[64];
} sink;
static sink logs = {.lock = PTHREAD_MUTEX_INITIALIZER};

static void log_fn(void *user, unsigned topic, const char *msg) {
    sink *s = user;
    pthread_mutex_lock(&s->lock);
    if (s->n < 64) {
        snprintf(s->lines[s->n], sizeof s->lines[0], "%s", msg);
        s->topics[s->n] = topic;
    }
    s->n++;
    pthread_mutex_unlock(&s->lock);
}

static int count_lines(unsigned topic, const char *needle) {
    int c = 0;
    for (int i = 0; i < logs.n && i < 64; i++)
        if ((logs.topics[i] & topic) && strstr(logs.lines[i], needle)) c++;
    return c;
}

static int setup(void **state) {
    sj_runtime_config cfg;
    sj_runtime_config_init(&cfg);
    cfg.backend = SJ_BACKEND_CPU;
    cfg.compile_mode = SJ_COMPILE_OFF; /* eager only: this suite is not about fused kernels */
    cfg.cache_dir = NULL;
    cfg.log_mask = SJ_LOG_WARN | SJ_LOG_RECOMPILES | SJ_LOG_GUARDS;
    cfg.log_fn = log_fn;
    cfg.log_user = &logs;
    return sj_runtime_create(&cfg, &rt) == SJ_OK ? 0 : -1;
}
static int teardown(void **state) {
    sj_runtime_destroy(rt);
    return 0;
}
static int each_setup(void **state) {
    logs.n = 0;
    return 0;
}
static int each_teardown(void **state) {
    tu_free_all();
    return 0;
}

/* -- Models ----------------------------------------------------------------------- */

static sj_status m_affine(sj_tracer *t, const sj_val *in, int n, void *u) {
    return sj_output(t, sj_add(t, sj_mul(t, in[0], sj_scalar(t, 2.0)), sj_scalar(t, 1.0)));
}

/* concat along axis 1 of x [a, b] and y [a, c]: axis 0 must match */
static sj_status m_concat(sj_tracer *t, const sj_val *in, int n, void *u) {
    return sj_output(t, sj_exp(t, sj_concat(t, in, 2, 1)));
}

/* [n, 4] -> [-1, 8] -> sum: needs n*4 divisible by 8 */
static sj_status m_reshape8(sj_tracer *t, const sj_val *in, int n, void *u) {
    return sj_output(t, sj_sum(t, sj_reshape_i(t, in[0], 2, (int64_t[]){-1, 8}), 1, 0));
}

/* x [a] + flatten(y [b, 2]): needs a == 2b */
static sj_status m_rel(sj_tracer *t, const sj_val *in, int n, void *u) {
    return sj_output(t, sj_add(t, in[0], sj_reshape_i(t, in[1], 1, (int64_t[]){-1})));
}

/* reads the length as an integer */
static sj_status m_size(sj_tracer *t, const sj_val *in, int n, void *u) {
    int64_t len = sj_size(t, in[0], 0);
    return sj_output(t, sj_mul(t, in[0], sj_scalar(t, (double)len)));
}

/* x [s, h] with a bias [h] broadcast */
static sj_status m_bias(sj_tracer *t, const sj_val *in, int n, void *u) {
    return sj_output(t, sj_gelu(t, sj_add(t, in[0], in[1])));
}

static sj_status m_matmul(sj_tracer *t, const sj_val *in, int n, void *u) {
    return sj_output(t, sj_matmul(t, in[0], in[1]));
}

/* x [s, 8] times a weight [8, 3] (u points at it) */
static sj_status m_proj(sj_tracer *t, const sj_val *in, int n, void *u) {
    return sj_output(t, sj_matmul(t, in[0], sj_param(t, u)));
}

/* -- Harness -------------------------------------------------------------------------- */

static sj_fn *make(const char *name, int n_in, sj_model_fn m, sj_dynamic dyn, const sj_fn_options *base) {
    sj_fn_options o;
    if (base) o = *base;
    else sj_fn_options_init(&o);
    o.dynamic = dyn;
    sj_fn *fn = NULL;
    assert_int_equal(sj_fn_create(rt, name, n_in, m, NULL, &o, &fn), SJ_OK);
    return fn;
}

static uint64_t entry_calls(const sj_fn *fn, int id) {
    sj_entry_info info[64];
    int n = sj_fn_entries(fn, info, 64);
    for (int i = 0; i < n && i < 64; i++)
        if (info[i].id == id) return info[i].calls;
    return 0;
}

/* Calls fn; checks the result bit for bit against a fresh static function
 * traced for exactly these inputs; returns the id of the entry that served
 * the call. */
static int call_check(sj_fn *fn, sj_model_fn m, const sj_tensor *in, int n) {
    uint64_t before[64];
    for (int i = 0; i < 64; i++) before[i] = entry_calls(fn, i);
    sj_tensor out = {0}, ref = {0};
    sj_status st = sj_call(fn, in, n, &out, 1);
    if (st) fail_msg("sj_call: %s: %s", sj_status_name(st), sj_last_error());
    sj_fn *fresh = make("fresh", n, m, SJ_DYNAMIC_STATIC, NULL);
    assert_int_equal(sj_call(fresh, in, n, &ref, 1), SJ_OK);
    sj_fn_destroy(fresh);
    assert_int_equal(out.rank, ref.rank);
    for (int a = 0; a < out.rank; a++) assert_int_equal(out.shape[a], ref.shape[a]);
    assert_memory_equal(out.data, ref.data, (size_t)tu_numel(&out) * sj_dtype_size(out.dtype));
    sj_tensor_free(rt, &out);
    sj_tensor_free(rt, &ref);
    int served = -1;
    for (int i = 0; i < 64; i++)
        if (entry_calls(fn, i) == before[i] + 1) served = i;
    return served;
}

static sj_tensor vec(sj_dtype dt, int64_t n) {
    sj_tensor t = tu_tensor(dt, 1, &n);
    tu_fill_random(&t);
    return t;
}

static sj_tensor mat(sj_dtype dt, int64_t r, int64_t c) {
    sj_tensor t = tu_tensor(dt, 2, (int64_t[]){r, c});
    tu_fill_random(&t);
    return t;
}

static uint64_t traces(const sj_fn *fn) {
    sj_stats s;
    sj_fn_stats(fn, &s);
    return s.traces;
}

static void assert_msg_has(const char *needle) {
    if (!strstr(sj_last_error(), needle)) fail_msg("message \"%s\" lacks \"%s\"", sj_last_error(), needle);
}

/* -- The three policies ----------------------------------------------------------------- */

static const int64_t seq[] = {2, 3, 4, 4, 5, 5, 6};
#define NSEQ (int)(sizeof seq / sizeof seq[0])

/* fn (m_affine) called on seq's sizes in order, each result checked: the
 * i-th call served by entry want[i]. */
static void call_seq(sj_fn *fn, const int *want) {
    for (int i = 0; i < NSEQ; i++) {
        sj_tensor x = vec(SJ_F32, seq[i]);
        assert_int_equal(call_check(fn, m_affine, &x, 1), want[i]);
    }
}

static void test_auto_sequence(void **state) {
    sj_fn *fn = make("auto", 1, m_affine, SJ_DYNAMIC_AUTO, NULL);
    call_seq(fn, (const int[NSEQ]){0, 1, 1, 1, 1, 1, 1});
    assert_int_equal(traces(fn), 2);
    sj_entry_info info[4];
    assert_int_equal(sj_fn_entries(fn, info, 4), 2);
    assert_true(info[0].symbolic);                 /* newest: symbolic in dim 0 */
    assert_string_equal(info[0].what, "symbolic in in0.size(0)");
    assert_false(info[1].symbolic);
    sj_tensor x = vec(SJ_F32, 2);                  /* [2] again: the memo still maps it to entry 0 */
    assert_int_equal(call_check(fn, m_affine, &x, 1), 0);
    sj_fn_destroy(fn);
}

static void test_static_sequence(void **state) {
    sj_fn *fn = make("static", 1, m_affine, SJ_DYNAMIC_STATIC, NULL);
    call_seq(fn, (const int[NSEQ]){0, 1, 2, 2, 3, 3, 4});
    assert_int_equal(traces(fn), 5);
    sj_stats s;
    sj_fn_stats(fn, &s);
    assert_int_equal(s.static_entries, 5);
    assert_int_equal(s.guard_failures[SJ_GUARD_SIZE], 0 + 1 + 2 + 3 + 4); /* each retrace tried every entry */
    sj_fn_destroy(fn);
}

static void test_symbolic_sequence(void **state) {
    sj_fn *fn = make("symbolic", 1, m_affine, SJ_DYNAMIC_SYMBOLIC, NULL);
    call_seq(fn, (const int[NSEQ]){0});
    assert_int_equal(traces(fn), 1);
    sj_stats s;
    sj_fn_stats(fn, &s);
    assert_int_equal(s.symbolic_entries, 1);
    assert_int_equal(s.memo_hits, 2);   /* the two repeats */
    assert_int_equal(s.guard_evals, 5); /* each new size evaluated the guards once */
    sj_fn_destroy(fn);
}

/* AUTO makes exactly the dimensions that varied symbolic. */
static void test_auto_grows_dimension_by_dimension(void **state) {
    sj_fn *fn = make("grow", 2, m_bias, SJ_DYNAMIC_AUTO, NULL);
    int64_t shapes[][2] = {{4, 8}, {5, 8}, {6, 8}, {6, 16}, {7, 16}, {3, 24}};
    int want[] = {0, 1, 1, 2, 2, 2};
    for (int i = 0; i < 6; i++) {
        sj_tensor in[2] = {mat(SJ_F32, shapes[i][0], shapes[i][1]), vec(SJ_F32, shapes[i][1])};
        assert_int_equal(call_check(fn, m_bias, in, 2), want[i]);
    }
    sj_entry_info info[4];
    assert_int_equal(sj_fn_entries(fn, info, 4), 3);
    assert_string_equal(info[1].what, "symbolic in in0.size(0)");
    assert_string_equal(info[0].what, "symbolic in in0.size(0), in0.size(1), in1.size(0)");
    assert_int_equal(info[0].n_symbols, 2); /* in0.size(1) and in1.size(0) share one (duck sizing) */
    sj_fn_destroy(fn);
}

/* -- Limits -------------------------------------------------------------------------------- */

static void test_limit_falls_back_to_symbolic(void **state) {
    sj_fn_options o;
    sj_fn_options_init(&o);
    o.recompile_limit = 3;
    sj_fn *fn = make("limited", 1, m_affine, SJ_DYNAMIC_STATIC, &o);
    for (int64_t n = 2; n <= 4; n++) {
        sj_tensor x = vec(SJ_F32, n);
        assert_int_equal(call_check(fn, m_affine, &x, 1), (int)(n - 2));
    }
    assert_int_equal(count_lines(SJ_LOG_WARN, "recompile limit"), 0);
    for (int64_t n = 5; n <= 9; n++) { /* past the limit: one symbolic entry serves them all */
        sj_tensor x = vec(SJ_F32, n);
        assert_int_equal(call_check(fn, m_affine, &x, 1), 3);
    }
    for (int64_t n = 2; n <= 4; n++) { /* the old entries keep serving */
        sj_tensor x = vec(SJ_F32, n);
        assert_int_equal(call_check(fn, m_affine, &x, 1), (int)(n - 2));
    }
    assert_int_equal(count_lines(SJ_LOG_WARN, "recompile limit reached"), 1);
    assert_int_equal(count_lines(SJ_LOG_WARN, "last failure: input 0 size mismatch at axis 0: expected 4, actual 5"), 1);
    sj_stats s;
    sj_fn_stats(fn, &s);
    assert_int_equal(s.entries, 4);
    assert_int_equal(s.limit_hits, 1);
    sj_entry_info info[8];
    sj_fn_entries(fn, info, 8);
    assert_true(info[0].fallback && info[0].symbolic);

    /* a dtype change past the limit, which the fallback cannot serve, gets
     * an entry of its own (one of a few): traced once, not on every call */
    sj_tensor h = vec(SJ_F16, 5);
    assert_int_equal(call_check(fn, m_affine, &h, 1), 4);
    assert_int_equal(call_check(fn, m_affine, &h, 1), 4);
    sj_fn_stats(fn, &s);
    assert_int_equal(s.entries, 5);
    assert_int_equal(count_lines(SJ_LOG_WARN, "recompile limit reached"), 1);
    sj_fn_destroy(fn);
}

static void test_limit_as_error(void **state) {
    sj_fn_options o;
    sj_fn_options_init(&o);
    o.recompile_limit = 2;
    o.limit_is_error = 1;
    sj_fn *fn = make("strict", 1, m_affine, SJ_DYNAMIC_STATIC, &o);
    sj_tensor a = vec(SJ_F32, 3), b = vec(SJ_F32, 4), c = vec(SJ_F32, 5), out = {0};
    call_check(fn, m_affine, &a, 1);
    call_check(fn, m_affine, &b, 1);
    assert_int_equal(sj_call(fn, &c, 1, &out, 1), SJ_ELIMIT);
    assert_msg_has("recompile limit reached");
    assert_msg_has("expected 4, actual 5");
    assert_null(out.data);
    assert_int_equal(call_check(fn, m_affine, &a, 1), 0); /* still serving */
    assert_int_equal(call_check(fn, m_affine, &b, 1), 1);
    sj_stats s;
    sj_fn_stats(fn, &s);
    assert_int_equal(s.entries, 2);
    assert_int_equal(s.errors, 1);
    sj_fn_destroy(fn);
}

static void test_runtime_total_limit(void **state) {
    sj_runtime_config cfg;
    sj_runtime_config_init(&cfg);
    cfg.compile_mode = SJ_COMPILE_OFF, cfg.cache_dir = NULL;
    cfg.total_recompile_limit = 3;
    cfg.log_mask = 0;
    sj_runtime *r;
    assert_int_equal(sj_runtime_create(&cfg, &r), SJ_OK);
    sj_fn_options o;
    sj_fn_options_init(&o);
    o.dynamic = SJ_DYNAMIC_STATIC;
    o.limit_is_error = 1;
    sj_fn *f1, *f2;
    assert_int_equal(sj_fn_create(r, "f1", 1, m_affine, NULL, &o, &f1), SJ_OK);
    assert_int_equal(sj_fn_create(r, "f2", 1, m_affine, NULL, &o, &f2), SJ_OK);
    sj_tensor out = {0};
    for (int64_t n = 2; n <= 3; n++) {
        sj_tensor x = vec(SJ_F32, n);
        assert_int_equal(sj_call(f1, &x, 1, &out, 1), SJ_OK);
        sj_tensor_free(r, &out);
    }
    sj_tensor x = vec(SJ_F32, 7);
    assert_int_equal(sj_call(f2, &x, 1, &out, 1), SJ_OK); /* f2's first entry: 3 in the runtime */
    sj_tensor_free(r, &out);
    x = vec(SJ_F32, 8);
    assert_int_equal(sj_call(f2, &x, 1, &out, 1), SJ_ELIMIT);
    assert_msg_has("in the runtime");
    sj_fn_destroy(f1); /* frees its two entries from the runtime's count */
    assert_int_equal(sj_call(f2, &x, 1, &out, 1), SJ_OK);
    sj_tensor_free(r, &out);
    sj_runtime_destroy(r);
}

/* -- Guards of every kind ------------------------------------------------------------------------ */

typedef struct fail_log {
    int n;
    sj_guard_failure f[16];
} fail_log;

static void on_fail(void *user, const sj_guard_failure *f) {
    fail_log *l = user;
    if (l->n < 16) l->f[l->n] = *f;
    l->n++;
}

/* make() with every guard failure recorded in *fl. */
static sj_fn *make_logged(const char *name, int n_in, sj_model_fn m, sj_dynamic dyn, fail_log *fl) {
    sj_fn_options o;
    sj_fn_options_init(&o);
    o.on_guard_fail = on_fail;
    o.on_guard_fail_user = fl;
    return make(name, n_in, m, dyn, &o);
}

static void test_duck_sizing(void **state) {
    fail_log fl = {0};
    sj_fn_options o;
    sj_fn_options_init(&o);
    o.on_guard_fail = on_fail;
    o.on_guard_fail_user = &fl;
    o.input_names = (const char *const[]){"x", "y"};
    sj_fn *fn = make("duck", 2, m_concat, SJ_DYNAMIC_SYMBOLIC, &o);
    sj_tensor in[2] = {mat(SJ_F32, 5, 3), mat(SJ_F32, 5, 3)};
    assert_int_equal(call_check(fn, m_concat, in, 2), 0);
    sj_entry_info info[4];
    sj_fn_entries(fn, info, 4);
    assert_int_equal(info[0].n_symbols, 2); /* 5 and 3: one symbol each, shared by x and y */
    sj_fn_destroy(fn);

    /* sizes all equal: one symbol for all four; then one input changes alone */
    fl.n = 0;
    fn = make("duck2", 2, m_concat, SJ_DYNAMIC_SYMBOLIC, &o);
    in[0] = mat(SJ_F32, 4, 4), in[1] = mat(SJ_F32, 4, 4);
    assert_int_equal(call_check(fn, m_concat, in, 2), 0);
    sj_fn_entries(fn, info, 4);
    assert_int_equal(info[0].n_symbols, 1);
    in[0] = mat(SJ_F32, 6, 6), in[1] = mat(SJ_F32, 6, 6); /* all change together: same entry */
    assert_int_equal(call_check(fn, m_concat, in, 2), 0);
    in[1] = mat(SJ_F32, 6, 7); /* y's columns alone: the duck guard fails */
    assert_int_equal(call_check(fn, m_concat, in, 2), 1);
    assert_int_equal(fl.n, 1);
    assert_int_equal(fl.f[0].kind, SJ_GUARD_DUCK);
    assert_int_equal(fl.f[0].entry, 0);
    assert_int_equal(fl.f[0].input, 1);
    assert_int_equal(fl.f[0].axis, 1);
    assert_int_equal(fl.f[0].expected, 6);
    assert_int_equal(fl.f[0].actual, 7);
    assert_string_equal(fl.f[0].input_name, "y");
    assert_non_null(strstr(fl.f[0].message, "input 'y' size mismatch at axis 1: expected 6"));
    sj_fn_entries(fn, info, 4);
    assert_int_equal(info[0].n_symbols, 2);
    in[0] = mat(SJ_F32, 9, 9), in[1] = mat(SJ_F32, 9, 5); /* served by the newer, less related entry */
    assert_int_equal(call_check(fn, m_concat, in, 2), 1);
    in[1] = mat(SJ_F32, 8, 5); /* rows differ: a shape error, no entry made */
    sj_tensor out = {0};
    assert_int_equal(sj_call(fn, in, 2, &out, 1), SJ_ESHAPE);
    assert_msg_has("concat");
    assert_int_equal(sj_fn_entries(fn, NULL, 0), 2);
    sj_stats s;
    sj_fn_stats(fn, &s);
    assert_int_equal(s.guard_failures[SJ_GUARD_DUCK], 3); /* 1, then both entries for the failed retrace */
    assert_int_equal(s.trace_errors, 1);
    sj_fn_destroy(fn);
}

static void test_zero_one_specialized(void **state) {
    fail_log fl = {0};
    sj_fn *fn = make_logged("zero_one", 2, m_bias, SJ_DYNAMIC_SYMBOLIC, &fl);
    int64_t rows[] = {5, 1, 7, 0, 1, 0, 9};
    int want[] = {0, 1, 0, 2, 1, 2, 0};
    for (int i = 0; i < 7; i++) {
        sj_tensor in[2] = {mat(SJ_F32, rows[i], 3), vec(SJ_F32, 3)};
        assert_int_equal(call_check(fn, m_bias, in, 2), want[i]);
    }
    assert_int_equal(traces(fn), 3);
    assert_int_equal(fl.f[0].kind, SJ_GUARD_RANGE); /* [1] against the symbolic entry */
    assert_int_equal(fl.f[0].expected, 2);
    assert_int_equal(fl.f[0].actual, 1);
    /* a broadcast operand of size 1 */
    sj_tensor in[2] = {mat(SJ_F32, 4, 3), vec(SJ_F32, 1)};
    assert_int_equal(call_check(fn, m_bias, in, 2), 3);
    sj_fn_destroy(fn);
}

static void test_dtype_and_stride_changes(void **state) {
    fail_log fl = {0};
    sj_fn *fn = make_logged("layout", 2, m_bias, SJ_DYNAMIC_SYMBOLIC, &fl);
    sj_tensor in[2] = {mat(SJ_F32, 4, 6), vec(SJ_F32, 6)};
    assert_int_equal(call_check(fn, m_bias, in, 2), 0);
    sj_tensor h[2] = {mat(SJ_BF16, 4, 6), vec(SJ_BF16, 6)};
    assert_int_equal(call_check(fn, m_bias, h, 2), 1);
    assert_int_equal(fl.f[0].kind, SJ_GUARD_DTYPE);
    assert_non_null(strstr(fl.f[0].message, "dtype mismatch: expected f32, actual bf16"));
    /* a transposed view: same sizes, other layout */
    sj_tensor base = mat(SJ_F32, 6, 4);
    sj_tensor tr[2] = {tu_transpose(&base, 0, 1), vec(SJ_F32, 6)};
    fl.n = 0;
    assert_int_equal(call_check(fn, m_bias, tr, 2), 2);
    assert_int_equal(fl.n, 2);
    assert_int_equal(fl.f[1].kind, SJ_GUARD_STRIDE);
    sj_tensor base2 = mat(SJ_F32, 6, 9); /* another transposed size: exact strides differ */
    sj_tensor tr2[2] = {tu_transpose(&base2, 0, 1), vec(SJ_F32, 6)};
    assert_int_equal(call_check(fn, m_bias, tr2, 2), 3);
    in[0] = mat(SJ_F32, 11, 6), in[1] = vec(SJ_F32, 6); /* contiguous again: entry 0 */
    assert_int_equal(call_check(fn, m_bias, in, 2), 0);
    sj_tensor r3 = tu_tensor(SJ_F32, 3, (int64_t[]){2, 4, 6}); /* another rank */
    tu_fill_random(&r3);
    sj_tensor in3[2] = {r3, vec(SJ_F32, 6)};
    fl.n = 0;
    assert_int_equal(call_check(fn, m_bias, in3, 2), 4);
    assert_int_equal(fl.f[fl.n - 1].kind, SJ_GUARD_RANK);
    sj_fn_destroy(fn);
}

static void test_relations(void **state) {
    fail_log fl = {0};
    sj_fn_options o;
    sj_fn_options_init(&o);
    o.on_guard_fail = on_fail;
    o.on_guard_fail_user = &fl;
    o.input_names = (const char *const[]){"x", "y"};
    /* divisibility: [n, 4] -> [-1, 8] */
    sj_fn *fn = make("div", 1, m_reshape8, SJ_DYNAMIC_SYMBOLIC, &o);
    assert_int_equal(sj_mark_static(fn, 0, 1), SJ_OK); /* so the fact is about the rows alone */
    sj_tensor x = mat(SJ_F32, 4, 4);
    assert_int_equal(call_check(fn, m_reshape8, &x, 1), 0);
    x = mat(SJ_F32, 10, 4);
    assert_int_equal(call_check(fn, m_reshape8, &x, 1), 0);
    x = mat(SJ_F32, 5, 4), x.rank = 2;
    sj_tensor out = {0};
    assert_int_equal(sj_call(fn, &x, 1, &out, 1), SJ_ESHAPE); /* the guard sent it to a retrace, which fails */
    assert_msg_has("reshape");
    assert_int_equal(fl.f[0].kind, SJ_GUARD_DIVISIBLE);
    assert_int_equal(fl.f[0].input, 0);
    assert_int_equal(fl.f[0].axis, 0);
    assert_int_equal(fl.f[0].actual, 5);
    x = mat(SJ_F32, 12, 4);
    assert_int_equal(call_check(fn, m_reshape8, &x, 1), 0);
    sj_fn_destroy(fn);

    /* x [a] + flatten(y [b, 2]): a == 2*b */
    fl.n = 0;
    fn = make("rel", 2, m_rel, SJ_DYNAMIC_SYMBOLIC, &o);
    sj_tensor in[2] = {vec(SJ_F32, 8), mat(SJ_F32, 4, 2)};
    assert_int_equal(call_check(fn, m_rel, in, 2), 0);
    in[0] = vec(SJ_F32, 10), in[1] = mat(SJ_F32, 5, 2);
    assert_int_equal(call_check(fn, m_rel, in, 2), 0);
    in[1] = mat(SJ_F32, 4, 2);
    assert_int_equal(sj_call(fn, in, 2, &out, 1), SJ_ESHAPE);
    assert_int_equal(fl.f[0].kind, SJ_GUARD_RELATION);
    assert_non_null(strstr(fl.f[0].message, "relation failed"));
    assert_int_equal(sj_fn_entries(fn, NULL, 0), 1);
    sj_fn_destroy(fn);
}

/* sj_size specializes: every new size retraces, even under SYMBOLIC */
static void test_size_read_specializes(void **state) {
    sj_fn *fn = make("size", 1, m_size, SJ_DYNAMIC_SYMBOLIC, NULL);
    for (int64_t n = 3; n <= 5; n++) {
        sj_tensor x = vec(SJ_F32, n);
        assert_int_equal(call_check(fn, m_size, &x, 1), (int)(n - 3));
    }
    sj_tensor x = vec(SJ_F32, 4);
    assert_int_equal(call_check(fn, m_size, &x, 1), 1);
    assert_int_equal(traces(fn), 3);
    sj_fn_destroy(fn);
}

/* A bad input that no trace accepts leaves nothing behind. */
static void test_bad_input_leaves_no_entry(void **state) {
    sj_fn *fn = make("mm", 2, m_matmul, SJ_DYNAMIC_AUTO, NULL);
    sj_tensor in[2] = {mat(SJ_F32, 3, 4), mat(SJ_F32, 4, 5)};
    assert_int_equal(call_check(fn, m_matmul, in, 2), 0);
    in[1] = mat(SJ_F32, 6, 5);
    sj_tensor out = {0};
    assert_int_equal(sj_call(fn, in, 2, &out, 1), SJ_ESHAPE);
    assert_msg_has("inner sizes differ: 4 vs 6");
    assert_null(out.data);
    assert_int_equal(sj_fn_entries(fn, NULL, 0), 1);
    in[0] = mat(SJ_F32, 7, 6);
    assert_int_equal(call_check(fn, m_matmul, in, 2), 1); /* dims 0 and 1 of a and dim 0 of b varied */
    in[0] = mat(SJ_F32, 2, 9), in[1] = mat(SJ_F32, 9, 5);
    assert_int_equal(call_check(fn, m_matmul, in, 2), 1);
    sj_fn_destroy(fn);
}

/* -- Marks ----------------------------------------------------------------------------------- */

static void test_mark_dynamic(void **state) {
    sj_fn_options o;
    sj_fn_options_init(&o);
    o.input_names = (const char *const[]){"x"};
    sj_fn *fn = make("marked", 1, m_affine, SJ_DYNAMIC_STATIC, &o);
    assert_int_equal(sj_mark_dynamic(fn, 0, 0, 2, 100), SJ_OK);
    for (int64_t n = 3; n <= 50; n += 7) {
        sj_tensor x = vec(SJ_F32, n);
        assert_int_equal(call_check(fn, m_affine, &x, 1), 0);
    }
    sj_tensor x = vec(SJ_F32, 200), out = {0};
    assert_int_equal(sj_call(fn, &x, 1, &out, 1), SJ_ECONSTRAINT);
    assert_msg_has("input 'x' size 200 at axis 0 is outside the range [2, 100] given to sj_mark_dynamic");
    x = vec(SJ_F32, 1); /* 1 is outside [2, 100] too */
    assert_int_equal(sj_call(fn, &x, 1, &out, 1), SJ_ECONSTRAINT);
    x = vec(SJ_F32, 99);
    assert_int_equal(call_check(fn, m_affine, &x, 1), 0);
    assert_int_equal(traces(fn), 1);

    /* bad arguments */
    assert_int_equal(sj_mark_dynamic(NULL, 0, 0, 2, 3), SJ_EINVAL);
    assert_int_equal(sj_mark_dynamic(fn, 1, 0, 2, 3), SJ_EINVAL);
    assert_msg_has("input 1 out of range");
    assert_int_equal(sj_mark_dynamic(fn, 0, 8, 2, 3), SJ_EINVAL);
    assert_int_equal(sj_mark_dynamic(fn, 0, -1, 2, 3), SJ_EINVAL);
    assert_int_equal(sj_mark_dynamic(fn, 0, 0, 5, 3), SJ_EINVAL);
    assert_int_equal(sj_mark_static(fn, 2, 0), SJ_EINVAL);
    /* a mark on an axis the input does not have */
    assert_int_equal(sj_mark_static(fn, 0, 3), SJ_OK);
    assert_int_equal(sj_call(fn, &x, 1, &out, 1), SJ_OK); /* memo: no trace needed */
    sj_tensor_free(rt, &out);
    x = vec(SJ_F32, 98);
    assert_int_equal(sj_call(fn, &x, 1, &out, 1), SJ_OK); /* the guards pass: no trace needed */
    sj_tensor_free(rt, &out);
    sj_fn_destroy(fn);
}

static void test_mark_specialized_is_error(void **state) {
    sj_fn *fn = make("marked_size", 1, m_size, SJ_DYNAMIC_AUTO, NULL);
    assert_int_equal(sj_mark_dynamic(fn, 0, 0, 2, INT64_MAX), SJ_OK);
    sj_tensor x = vec(SJ_F32, 6), out = {0};
    assert_int_equal(sj_call(fn, &x, 1, &out, 1), SJ_ECONSTRAINT);
    assert_msg_has("input 0 axis 0 was marked dynamic, but the model specializes it");
    assert_msg_has("sj_size(f32[s0], axis 0)");
    assert_int_equal(sj_fn_entries(fn, NULL, 0), 0);
    /* broadcasting a marked size against a constant one also pins it */
    sj_fn *fb = make("marked_bias", 2, m_bias, SJ_DYNAMIC_AUTO, NULL);
    assert_int_equal(sj_mark_dynamic(fb, 0, 1, 2, 64), SJ_OK);
    sj_tensor in[2] = {mat(SJ_F32, 3, 8), vec(SJ_F32, 8)};
    assert_int_equal(sj_call(fb, in, 2, &out, 1), SJ_ECONSTRAINT);
    assert_msg_has("axis 1 was marked dynamic");
    assert_msg_has("add(");
    assert_int_equal(sj_mark_dynamic(fb, 1, 0, 2, 64), SJ_OK); /* mark both: a relation, allowed */
    assert_int_equal(call_check(fb, m_bias, in, 2), 0);
    in[0] = mat(SJ_F32, 3, 12), in[1] = vec(SJ_F32, 12);
    assert_int_equal(call_check(fb, m_bias, in, 2), 0);
    sj_fn_destroy(fb);
    sj_fn_destroy(fn);
}

static void test_mark_static_under_symbolic(void **state) {
    sj_fn *fn = make("pinned", 2, m_bias, SJ_DYNAMIC_SYMBOLIC, NULL);
    assert_int_equal(sj_mark_static(fn, 0, 0), SJ_OK);
    for (int64_t r = 2; r <= 4; r++) {
        sj_tensor in[2] = {mat(SJ_F32, r, 5), vec(SJ_F32, 5)};
        assert_int_equal(call_check(fn, m_bias, in, 2), (int)(r - 2));
    }
    sj_tensor in[2] = {mat(SJ_F32, 3, 9), vec(SJ_F32, 9)}; /* columns stay symbolic */
    assert_int_equal(call_check(fn, m_bias, in, 2), 1);
    sj_fn_destroy(fn);
}

/* -- Buckets ----------------------------------------------------------------------------------- */

static void test_buckets_pow2(void **state) {
    sj_fn *fn = make("pow2", 2, m_bias, SJ_DYNAMIC_AUTO, NULL);
    assert_int_equal(sj_set_buckets_pow2(fn, 0, 0, 16, 128), SJ_OK);
    int64_t rows[] = {17, 20, 32, 33, 64, 2, 16, 100, 128, 129, 1000, 31};
    int want[] = {0, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 0};
    for (int i = 0; i < 12; i++) {
        sj_tensor in[2] = {mat(SJ_F32, rows[i], 8), vec(SJ_F32, 8)};
        assert_int_equal(call_check(fn, m_bias, in, 2), want[i]);
    }
    sj_entry_info info[8];
    sj_fn_entries(fn, info, 8);
    assert_true(info[0].bucketed);
    assert_string_equal(info[0].what, "symbolic in in0.size(0) bucket (128, inf)");
    assert_string_equal(info[4].what, "symbolic in in0.size(0) bucket (16, 32]");
    sj_fn_destroy(fn);
}

/* A second input of the same length follows the bucketed axis: one entry
 * per bucket, not one per length pinned through the equality. */
static void test_bucket_follows_equal_sizes(void **state) {
    sj_fn *fn = make("follow", 2, m_bias, SJ_DYNAMIC_AUTO, NULL);
    assert_int_equal(sj_set_buckets_pow2(fn, 0, 0, 16, 128), SJ_OK);
    int64_t rows[] = {17, 31, 32, 100, 3, 20, 70};
    int want[] = {0, 0, 0, 1, 2, 0, 1};
    for (int i = 0; i < 7; i++) {
        sj_tensor in[2] = {mat(SJ_F32, rows[i], 8), mat(SJ_F32, rows[i], 8)};
        assert_int_equal(call_check(fn, m_bias, in, 2), want[i]);
    }
    sj_stats s;
    sj_fn_stats(fn, &s);
    assert_int_equal(s.entries, 3);
    assert_int_equal(s.traces, 3);
    sj_fn_destroy(fn);
}

/* A size that only happens to equal the bucketed one (x's feature axis,
 * here 8 = the rows of the first call) follows the bucket with a symbol of
 * its own: the matmul's contraction pins that symbol to 8, not the bucket's,
 * so the next length in the bucket is served by the same entry. (With one
 * shared symbol the entry served S = 8 alone.) */
static void test_bucket_follower_pinned_elsewhere(void **state) {
    for (int dyn = SJ_DYNAMIC_AUTO; dyn <= SJ_DYNAMIC_STATIC; dyn++) {
        sj_fn *fn = make("pinned", 2, m_matmul, (sj_dynamic)dyn, NULL);
        assert_int_equal(sj_set_buckets_pow2(fn, 0, 0, 4, 16), SJ_OK);
        int64_t rows[] = {8, 5, 7, 8, 16, 9, 3};
        int want[] = {0, 0, 0, 0, 1, 1, 2};
        for (int i = 0; i < 7; i++) {
            sj_tensor in[2] = {mat(SJ_F32, rows[i], 8), mat(SJ_F32, 8, 3)};
            assert_int_equal(call_check(fn, m_matmul, in, 2), want[i]);
        }
        sj_stats s;
        sj_fn_stats(fn, &s);
        assert_int_equal(s.entries, 3);
        sj_fn_destroy(fn);
    }
}

/* x's feature axis (8) follows the bucket of its rows when the first call
 * has 8 rows; the weight pins it to 8. The entry's description leaves the
 * pinned axis out: its guard admits one size. */
static void test_bucket_follower_pinned_described(void **state) {
    sj_tensor w = mat(SJ_F32, 8, 3);
    sj_fn_options o;
    sj_fn_options_init(&o);
    o.dynamic = SJ_DYNAMIC_AUTO;
    sj_fn *fn = NULL;
    assert_int_equal(sj_fn_create(rt, "proj", 1, m_proj, &w, &o, &fn), SJ_OK);
    assert_int_equal(sj_set_buckets_pow2(fn, 0, 0, 4, 16), SJ_OK);
    int64_t rows[] = {8, 5, 7, 3};
    for (int i = 0; i < 4; i++) {
        sj_tensor x = mat(SJ_F32, rows[i], 8), out = {0};
        assert_int_equal(sj_call(fn, &x, 1, &out, 1), SJ_OK);
        assert_int_equal(out.shape[0], rows[i]);
        sj_tensor_free(rt, &out);
    }
    sj_entry_info info[4];
    assert_int_equal(sj_fn_entries(fn, info, 4), 2);
    int big = info[0].calls == 3 ? 0 : 1; /* the table lists entries in its own order */
    assert_int_equal(info[big].calls, 3);
    assert_string_equal(info[big].what, "symbolic in in0.size(0) bucket (4, 8]");
    assert_string_equal(info[1 - big].what, "symbolic in in0.size(0) bucket (1, 4]");
    sj_fn_destroy(fn);
}

static void test_buckets_list_multiple_profile(void **state) {
    sj_fn *fn = make("list", 1, m_affine, SJ_DYNAMIC_STATIC, NULL);
    assert_int_equal(sj_set_buckets(fn, 0, 0, (int64_t[]){4, 10}, 2), SJ_OK);
    int64_t sizes[] = {3, 4, 5, 10, 11, 500, 2};
    int want[] = {0, 0, 1, 1, 2, 2, 0};
    for (int i = 0; i < 7; i++) {
        sj_tensor x = vec(SJ_F32, sizes[i]);
        assert_int_equal(call_check(fn, m_affine, &x, 1), want[i]);
    }
    sj_fn_destroy(fn);

    fn = make("mult", 1, m_affine, SJ_DYNAMIC_STATIC, NULL);
    assert_int_equal(sj_set_buckets_multiple(fn, 0, 0, 8), SJ_OK);
    int64_t ms[] = {3, 8, 9, 16, 17};
    int wm[] = {0, 0, 1, 1, 2};
    for (int i = 0; i < 5; i++) {
        sj_tensor x = vec(SJ_F32, ms[i]);
        assert_int_equal(call_check(fn, m_affine, &x, 1), wm[i]);
    }
    sj_fn_destroy(fn);

    fn = make("profile", 1, m_affine, SJ_DYNAMIC_STATIC, NULL);
    assert_int_equal(sj_set_profile(fn, 0, 0, 4, 32, 64), SJ_OK);
    for (int64_t n = 4; n <= 64; n += 12) {
        sj_tensor x = vec(SJ_F32, n);
        assert_int_equal(call_check(fn, m_affine, &x, 1), 0);
    }
    sj_tensor x = vec(SJ_F32, 65), out = {0};
    assert_int_equal(sj_call(fn, &x, 1, &out, 1), SJ_ECONSTRAINT);
    assert_msg_has("outside the profile [4, 64]");
    x = vec(SJ_F32, 3);
    assert_int_equal(sj_call(fn, &x, 1, &out, 1), SJ_ECONSTRAINT);

    /* bad specs */
    assert_int_equal(sj_set_buckets(fn, 0, 0, (int64_t[]){4, 4}, 2), SJ_EINVAL);
    assert_msg_has("not increasing");
    assert_int_equal(sj_set_buckets(fn, 0, 0, NULL, 2), SJ_EINVAL);
    assert_int_equal(sj_set_buckets_pow2(fn, 0, 0, 0, 8), SJ_EINVAL);
    assert_int_equal(sj_set_buckets_multiple(fn, 0, 0, 0), SJ_EINVAL);
    assert_int_equal(sj_set_profile(fn, 0, 0, 5, 4, 8), SJ_EINVAL);
    assert_int_equal(sj_set_buckets_multiple(fn, 3, 0, 4), SJ_EINVAL);
    sj_fn_destroy(fn);
}

static void test_buckets_from_config(void **state) {
    sj_runtime_config cfg;
    sj_runtime_config_init(&cfg);
    cfg.compile_mode = SJ_COMPILE_OFF, cfg.cache_dir = NULL;
    cfg.log_mask = 0;
    cfg.buckets = "enc:0:0=mult:4;*:0:5=list:3";
    sj_runtime *r;
    assert_int_equal(sj_runtime_create(&cfg, &r), SJ_OK);
    sj_fn *fn;
    sj_fn_options o;
    sj_fn_options_init(&o);
    o.dynamic = SJ_DYNAMIC_STATIC;
    assert_int_equal(sj_fn_create(r, "enc", 1, m_affine, NULL, &o, &fn), SJ_OK);
    sj_tensor out = {0};
    for (int64_t n = 5; n <= 8; n++) {
        sj_tensor x = vec(SJ_F32, n);
        assert_int_equal(sj_call(fn, &x, 1, &out, 1), SJ_OK);
        sj_tensor_free(r, &out);
    }
    assert_int_equal(traces(fn), 1);
    sj_fn_destroy(fn);
    sj_runtime_destroy(r);

    cfg.buckets = "enc:3:0=mult:4"; /* names an input enc lacks */
    assert_int_equal(sj_runtime_create(&cfg, &r), SJ_OK);
    assert_int_equal(sj_fn_create(r, "enc", 1, m_affine, NULL, NULL, &fn), SJ_EINVAL);
    assert_msg_has("SHAPEJIT_BUCKETS names input 3");
    sj_runtime_destroy(r);

    static const char *bad[] = {"enc:0:0", "enc:0=mult:4", "enc:0:0=mult:x", "enc:0:0=wide:4", "enc:0:0=pow2:8"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cfg.buckets = bad[i];
        r = (sj_runtime *)0x1;
        assert_int_equal(sj_runtime_create(&cfg, &r), SJ_EINVAL);
        assert_null(r);
        assert_msg_has("SHAPEJIT_BUCKETS");
    }
    setenv("SHAPEJIT_BUCKETS", "a:0:1=pow2:16,512", 1);
    setenv("SHAPEJIT_RECOMPILE_LIMIT", "5", 1);
    sj_runtime_config_init(&cfg);
    cfg.compile_mode = SJ_COMPILE_OFF, cfg.cache_dir = NULL;
    assert_string_equal(cfg.buckets, "a:0:1=pow2:16,512");
    assert_int_equal(cfg.recompile_limit, 5);
    unsetenv("SHAPEJIT_BUCKETS");
    unsetenv("SHAPEJIT_RECOMPILE_LIMIT");
}

/* -- Hotness ------------------------------------------------------------------------------------- */

static void test_hotness(void **state) {
    sj_fn_options o;
    sj_fn_options_init(&o);
    o.hot_threshold = 3;
    o.specialize_threshold = 4;
    o.specialize_budget = 2;
    sj_fn *fn = make("hot", 1, m_affine, SJ_DYNAMIC_SYMBOLIC, &o);
    sj_tensor a = vec(SJ_F32, 5), b = vec(SJ_F32, 6), c = vec(SJ_F32, 7), out = {0};
    sj_stats s;
    for (int i = 0; i < 2; i++) call_check(fn, m_affine, &a, 1);
    sj_fn_stats(fn, &s);
    assert_int_equal(s.hot_entries, 0);
    call_check(fn, m_affine, &a, 1);
    sj_fn_stats(fn, &s);
    assert_int_equal(s.hot_entries, 1);
    assert_int_equal(s.hot_shapes, 0);
    call_check(fn, m_affine, &a, 1); /* 4th call of shape a */
    sj_fn_stats(fn, &s);
    assert_int_equal(s.hot_shapes, 1);
    for (int i = 0; i < 4; i++) call_check(fn, m_affine, &b, 1);
    for (int i = 0; i < 4; i++) call_check(fn, m_affine, &c, 1); /* over the budget */
    sj_fn_stats(fn, &s);
    assert_int_equal(s.hot_shapes, 2);
    char *text = tu_explain(fn);
    assert_non_null(strstr(text, "(s0=5) 4 calls [marked for specialization]"));
    assert_non_null(strstr(text, "(s0=7) 4 calls;"));
    assert_non_null(strstr(text, "(hot)"));
    free(text);
    (void)out;
    sj_fn_destroy(fn);
}

/* -- Observability --------------------------------------------------------------------------------- */

static void test_logs_explain_stats(void **state) {
    sj_fn_options o;
    sj_fn_options_init(&o);
    o.input_names = (const char *const[]){"x", "b"};
    sj_fn *fn = make("observed", 2, m_bias, SJ_DYNAMIC_AUTO, &o);
    sj_tensor in[2] = {mat(SJ_F32, 4, 8), vec(SJ_F32, 8)};
    call_check(fn, m_bias, in, 2);
    assert_int_equal(count_lines(SJ_LOG_RECOMPILES, "retrace"), 0);
    assert_true(count_lines(SJ_LOG_GUARDS, "x.size(0) == 4") == 1);
    in[0] = mat(SJ_F32, 9, 8);
    call_check(fn, m_bias, in, 2);
    assert_int_equal(count_lines(SJ_LOG_RECOMPILES, "retrace -> entry 1 (symbolic in x.size(0))"), 1);
    assert_int_equal(count_lines(SJ_LOG_RECOMPILES, "entry 0: input 'x' size mismatch at axis 0: expected 4, actual 9"), 1);
    assert_true(count_lines(SJ_LOG_GUARDS, "x.size(0) = s0 in [2, inf)") == 1);

    char *text = tu_explain(fn);
    static const char *want[] = {"fn 'observed': 2 inputs, policy auto, recompile limit 8",
                                 "2 entries (1 static, 1 symbolic)",
                                 "entry 1: symbolic in x.size(0); tier eager; 1 calls",
                                 "traced because: entry 0: input 'x' size mismatch at axis 0: expected 4, actual 9",
                                 "x.size(0) = s0 in [2, inf)",
                                 "symbols: s0 in [2, inf) hint 9",
                                 "entry 0: static; tier eager",
                                 "traced because: first call",
                                 "recent guard failures",
                                 "entry 0: input 'x' size mismatch at axis 0: expected 4, actual 9"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        if (!strstr(text, want[i])) fail_msg("explain lacks \"%s\":\n%s", want[i], text);
    free(text);
    sj_stats s;
    sj_fn_stats(fn, &s);
    assert_int_equal(s.guard_failures[SJ_GUARD_SIZE], 1);
    assert_int_equal(s.traces, 2);
    assert_int_equal(s.calls, 2);
    sj_fn_destroy(fn);
    assert_string_equal(sj_guard_kind_name(SJ_GUARD_DUCK), "equal sizes");
}

/* -- Threads ------------------------------------------------------------------------------------------ */

typedef struct worker {
    sj_fn *fn;
    int id, bad, iters;
    int64_t (*size)(int id, int it); /* the length of call `it` */
} worker;

static void *worker_main(void *arg) {
    worker *w = arg;
    for (int it = 0; it < w->iters; it++) {
        int64_t n = w->size(w->id, it);
        float x[64], y[64];
        for (int i = 0; i < n; i++) x[i] = 0.01f * (float)(i * (w->id + 1)) - 0.2f;
        sj_tensor in = sj_tensor_make(x, SJ_F32, 1, &n), out = sj_tensor_make(y, SJ_F32, 1, &n);
        if (sj_call(w->fn, &in, 1, &out, 1)) {
            w->bad++;
            continue;
        }
        for (int i = 0; i < n; i++)
            if (y[i] != x[i] * 2.0f + 1.0f) w->bad++;
    }
    return NULL;
}

/* Runs nt workers on fn; each call's result must be right. */
static void run_workers(sj_fn *fn, int nt, int iters, int64_t (*size)(int, int)) {
    pthread_t th[8];
    worker w[8];
    assert_true(nt <= 8);
    for (int i = 0; i < nt; i++) {
        w[i] = (worker){fn, i, 0, iters, size};
        assert_int_equal(pthread_create(&th[i], NULL, worker_main, &w[i]), 0);
    }
    for (int i = 0; i < nt; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(w[i].bad, 0);
    }
}

static int64_t size_mixed(int id, int it) { return 1 + (id * 5 + it * 3) % 40; }

static void test_threads_with_retraces(void **state) {
    sj_fn *fn = make("threads", 1, m_affine, SJ_DYNAMIC_AUTO, NULL);
    run_workers(fn, 8, 200, size_mixed);
    sj_stats s;
    sj_fn_stats(fn, &s);
    assert_int_equal(s.calls, 1600);
    assert_true(s.entries <= 3); /* first static size, then symbolic (and size 1) */
    sj_fn_destroy(fn);
}

/* Counts from threads calling at once are exact: the per-call counters are
 * sharded per thread (base/shard.h) and summed when read, and a shape's
 * calls move to a sharded counter when it crosses the specialize
 * threshold; both sums must lose no call. */
static int64_t size_three(int id, int it) { return 5 + it % 3; } /* three shapes, in turn */

static void test_threads_count_exactly(void **state) {
    sj_fn_options o;
    sj_fn_options_init(&o);
    o.specialize_threshold = 3;
    o.specialize_budget = 2;
    sj_fn *fn = make("counted", 1, m_affine, SJ_DYNAMIC_SYMBOLIC, &o);
    enum { NT = 8 };
    run_workers(fn, NT, 300, size_three);
    sj_stats s;
    sj_fn_stats(fn, &s);
    assert_int_equal(s.calls, NT * 300);
    assert_int_equal(s.eager_calls, NT * 300); /* this suite compiles nothing */
    assert_int_equal(s.memo_hits + s.guard_evals, NT * 300);
    assert_int_equal(s.entries, 1);
    assert_int_equal(entry_calls(fn, 0), NT * 300);
    assert_int_equal(s.hot_shapes, 2); /* the budget */
    char *text = tu_explain(fn);
    for (int n = 5; n <= 7; n++) {
        char want[64];
        snprintf(want, sizeof want, "(s0=%d) %d calls", n, NT * 100);
        if (!strstr(text, want)) fail_msg("explain lacks \"%s\":\n%s", want, text);
    }
    free(text);
    sj_fn_destroy(fn);
}

int main(void) {
#define T(f) cmocka_unit_test_setup_teardown(f, each_setup, each_teardown)
    const struct CMUnitTest tests[] = {
        T(test_auto_sequence),        T(test_static_sequence),         T(test_symbolic_sequence),
        T(test_auto_grows_dimension_by_dimension), T(test_limit_falls_back_to_symbolic), T(test_limit_as_error),
        T(test_runtime_total_limit),  T(test_duck_sizing),             T(test_zero_one_specialized),
        T(test_dtype_and_stride_changes), T(test_relations),           T(test_size_read_specializes),
        T(test_bad_input_leaves_no_entry), T(test_mark_dynamic),       T(test_mark_specialized_is_error),
        T(test_mark_static_under_symbolic), T(test_buckets_pow2), T(test_bucket_follows_equal_sizes), T(test_bucket_follower_pinned_elsewhere), T(test_bucket_follower_pinned_described), T(test_buckets_list_multiple_profile),
        T(test_buckets_from_config),  T(test_hotness),                 T(test_logs_explain_stats),
        T(test_threads_with_retraces), T(test_threads_count_exactly),
    };
    return cmocka_run_group_tests_name("policy", tests, setup, teardown);
}
