/* Portable kernel bundles (kernels/bundle.h) and the shapejit-cache tool
 * (tools/sjcache.c, SJ_CACHE_TOOL or build/bin/shapejit-cache): kernels
 * compiled into cache A, exported, imported into a fresh cache B, where a
 * runtime reaches fused code without running the compiler, in sync and
 * async modes, and without any compiler (cc_version pinned), results checked against float64; a tampered, truncated
 * or foreign-key bundle refused with nothing written; bad usage explained. */
/* cmocka.h needs these first, in this order */
/* clang-format off */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
/* clang-format on */

#include <fcntl.h>
#include <math.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kernels/bundle.h"
#include "kernels/cache.h"
#include "tests/util.h"

extern char **environ;

#define KEY "bundle-test-key"
#define N_SHAPES 3
static const int64_t shapes[N_SHAPES][2] = {{4, 16}, {6, 24}, {3, 40}};
static char tmp[PATH_MAX];
static const char *pin_version; /* run_model's cc_version */

/* -- The model: y = gelu(x * 2 + r); x [S, H], r [H] ----------------------------------- */

static sj_status model(sj_tracer *t, const sj_val *in, int n, void *user) {
    (void)n, (void)user;
    return sj_output(t, sj_gelu(t, sj_add(t, sj_mul(t, in[0], sj_scalar(t, 2.0)), in[1])));
}

typedef struct run_result {
    uint64_t compiles, cache_hits, fused, failures;
    int wrong;
} run_result;

/* Every shape called on a runtime over cache dir with the key; cc: the
 * compiler (a missing one proves nothing is compiled). Async: calls until
 * the compile from the cache is in, bounded. */
static run_result run_model(const char *dir, const char *key, sj_compile_mode mode, const char *cc) {
    run_result res = {0};
    sj_runtime_config cfg;
    sj_runtime_config_init(&cfg);
    cfg.backend = SJ_BACKEND_CPU;
    cfg.compile_mode = mode;
    cfg.exec_threads = 1;
    cfg.cache_dir = dir;
    cfg.cache_key = key;
    cfg.cc = cc;
    cfg.cc_version = pin_version;
    cfg.remote_cache_url = NULL;
    cfg.log_mask = 0;
    sj_runtime *rt = NULL;
    if (sj_runtime_create(&cfg, &rt)) fail_msg("sj_runtime_create: %s", sj_last_error());
    for (int k = 0; k < N_SHAPES; k++) {
        sj_fn_options o;
        sj_fn_options_init(&o);
        o.dynamic = SJ_DYNAMIC_STATIC;
        o.hot_threshold = 1;
        sj_fn *fn = NULL;
        assert_int_equal(sj_fn_create(rt, "bundle_model", 2, model, NULL, &o, &fn), SJ_OK);
        const int64_t *s = shapes[k];
        float x[64 * 64], r[64], y[64 * 64];
        for (int64_t i = 0; i < s[0] * s[1]; i++) x[i] = (float)tu_uniform(-2, 2);
        for (int64_t i = 0; i < s[1]; i++) r[i] = (float)tu_uniform(-1, 1);
        sj_tensor in[2] = {sj_tensor_make(x, SJ_F32, 2, s), sj_tensor_make(r, SJ_F32, 1, &s[1])};
        sj_tensor out = sj_tensor_make(y, SJ_F32, 2, s);
        sj_stats st;
        for (int c = 0; c < 2; c++) { /* async: the first call is eager and queues the compile */
            if (sj_call(fn, in, 2, &out, 1)) fail_msg("sj_call: %s", sj_last_error());
            for (int64_t i = 0; i < s[0] * s[1]; i++) {
                double v = 2.0 * x[i] + r[i % s[1]], g = 0.5 * v * (1 + erf(v / sqrt(2.0)));
                if (fabs(g - y[i]) > 1e-5 * fmax(1, fabs(g))) res.wrong++;
            }
            if (mode == SJ_COMPILE_ASYNC && c == 0) assert_int_equal(sj_fn_wait_idle(fn, 60000), SJ_OK);
        }
        sj_fn_stats(fn, &st);
        res.compiles += st.compiles, res.cache_hits += st.compile_cache_hits;
        res.fused += st.fused_specialized_calls, res.failures += st.compile_failures;
        sj_fn_destroy(fn);
    }
    sj_runtime_destroy(rt);
    return res;
}

/* -- The tool ----------------------------------------------------------------------------- */

typedef struct tool_out {
    int status; /* exit status */
    char text[8192]; /* stdout and stderr */
} tool_out;

/* Runs shapejit-cache with args (NULL-terminated) and SHAPEJIT_CACHE_KEY =
 * key (NULL: unset). */
static tool_out tool(const char *key, const char *const *args) {
    const char *bin = getenv("SJ_CACHE_TOOL") ? getenv("SJ_CACHE_TOOL") : "build/bin/shapejit-cache";
    if (access(bin, X_OK)) fail_msg("%s not found (make tools, or set SJ_CACHE_TOOL)", bin);
    char outp[PATH_MAX + 16];
    snprintf(outp, sizeof outp, "%s/tool.out", tmp);
    const char *argv[16] = {"shapejit-cache"};
    int n = 1;
    while (args[n - 1]) argv[n] = args[n - 1], n++;
    argv[n] = NULL;
    if (key) setenv("SHAPEJIT_CACHE_KEY", key, 1);
    else unsetenv("SHAPEJIT_CACHE_KEY");
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, outp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    pid_t pid;
    assert_int_equal(posix_spawn(&pid, bin, &fa, NULL, (char *const *)argv, environ), 0);
    posix_spawn_file_actions_destroy(&fa);
    unsetenv("SHAPEJIT_CACHE_KEY");
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    tool_out o = {.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128};
    FILE *f = fopen(outp, "r");
    assert_non_null(f);
    size_t got = fread(o.text, 1, sizeof o.text - 1, f);
    o.text[got] = '\0';
    fclose(f);
    return o;
}

#define EXPECT_TOOL(o, status_, what)                                                                    \
    do {                                                                                                 \
        if ((o).status != (status_) || !strstr((o).text, what))                                          \
            fail_msg("shapejit-cache: exit %d (want %d), output lacks '%s':\n%s", (o).status, status_, what, \
                     (o).text);                                                                          \
    } while (0)

static int count_so(const char *dir) {
    int n = 0;
    char cmd[PATH_MAX + 64];
    snprintf(cmd, sizeof cmd, "ls %s 2>/dev/null | grep -c '\\.so$'", dir);
    FILE *p = popen(cmd, "r");
    if (p) {
        if (fscanf(p, "%d", &n) != 1) n = 0;
        pclose(p);
    }
    return n;
}

static char dir_a[PATH_MAX], bundle[PATH_MAX];

static int setup(void **state) {
    (void)state;
    if (tu_mkdtemp(tmp, sizeof tmp, "sj-bundle")) return -1;
    snprintf(dir_a, sizeof dir_a, "%s/cache-a", tmp);
    snprintf(bundle, sizeof bundle, "%s/kernels.sjb", tmp);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    tu_rmtree(tmp);
    return 0;
}

/* -- Tests ----------------------------------------------------------------------------------- */

/* A -> bundle -> B: a runtime on B is fused from its first call (sync) or
 * after its background load (async), with no compiler run. */
static void test_export_import(void **state) {
    (void)state;
    run_result a = run_model(dir_a, KEY, SJ_COMPILE_SYNC, NULL);
    assert_int_equal(a.wrong, 0);
    assert_int_equal(a.compiles, N_SHAPES);
    assert_int_equal(a.cache_hits, 0);
    assert_int_equal(count_so(dir_a), N_SHAPES);

    tool_out o = tool(KEY, (const char *[]){"export", dir_a, bundle, NULL});
    EXPECT_TOOL(o, 0, "exported 3 kernels");
    o = tool(KEY, (const char *[]){"verify", bundle, NULL});
    EXPECT_TOOL(o, 0, "3 kernels");
    EXPECT_TOOL(o, 0, "signature verified");
    o = tool(KEY, (const char *[]){"list", bundle, NULL});
    EXPECT_TOOL(o, 0, ".so ");
    o = tool(NULL, (const char *[]){"list", bundle, NULL});
    EXPECT_TOOL(o, 0, "signature not checked (no key)");

    for (int m = 0; m < 2; m++) {
        char b[PATH_MAX];
        snprintf(b, sizeof b, "%s/cache-b%d", tmp, m);
        o = tool(KEY, (const char *[]){"import", bundle, b, NULL});
        EXPECT_TOOL(o, 0, "imported 3 of 3 kernels");
        assert_int_equal(count_so(b), N_SHAPES);
        sj_compile_mode mode = m ? SJ_COMPILE_ASYNC : SJ_COMPILE_SYNC;
        run_result r = run_model(b, KEY, mode, NULL);
        assert_int_equal(r.wrong, 0);
        assert_int_equal(r.failures, 0);
        assert_int_equal(r.compiles, N_SHAPES);
        assert_int_equal(r.cache_hits, N_SHAPES); /* no compiler run */
        if (m) assert_true(r.fused >= N_SHAPES); /* the second call surely; the first if the load won the race */
        else assert_int_equal(r.fused, 2 * N_SHAPES);
    }
    /* a machine without a compiler (PATH leads nowhere): the kernels' keys
     * name the compiler's version, so it is pinned to the version line of
     * the compiler that made them; without the pin every lookup misses and
     * the compiles fail (the calls stay right, eager) */
    char b[PATH_MAX], version[256] = "", *path = strdup(getenv("PATH") ? getenv("PATH") : "/usr/bin:/bin");
    FILE *p = popen("cc --version", "r");
    assert_non_null(p);
    assert_non_null(fgets(version, sizeof version, p));
    pclose(p);
    version[strcspn(version, "\n")] = '\0';
    snprintf(b, sizeof b, "%s/cache-b0", tmp);
    setenv("PATH", tmp, 1);
    run_result r = run_model(b, KEY, SJ_COMPILE_SYNC, NULL);
    assert_int_equal(r.wrong, 0);
    assert_int_equal(r.failures, N_SHAPES);
    assert_int_equal(r.fused, 0);
    pin_version = version;
    r = run_model(b, KEY, SJ_COMPILE_SYNC, NULL);
    pin_version = NULL;
    setenv("PATH", path, 1);
    free(path);
    assert_int_equal(r.wrong, 0);
    assert_int_equal(r.failures, 0);
    assert_int_equal(r.cache_hits, N_SHAPES);
    assert_int_equal(r.fused, 2 * N_SHAPES);

    /* the library: a bundle read back holds exactly A's verified bytes */
    sj_bundle *bd = NULL;
    assert_int_equal(sj_bundle_read(bundle, KEY, &bd), SJ_OK);
    assert_true(sj_bundle_verified(bd));
    assert_int_equal(sj_bundle_count(bd), N_SHAPES);
    sj_cache *c = NULL;
    assert_int_equal(sj_cache_open_keyed(dir_a, 0, KEY, NULL, &c), SJ_OK);
    for (int i = 0; i < N_SHAPES; i++) {
        const sj_bundle_entry *e = sj_bundle_entry_at(bd, i);
        void *data;
        size_t len;
        assert_true(sj_cache_load(c, e->key, e->ext, &data, &len));
        assert_int_equal(len, e->len);
        assert_memory_equal(data, e->data, len);
        free(data);
    }
    sj_cache_close(c);
    sj_bundle_free(bd);
}

/* Every byte of the bundle matters: one flipped, the bundle cut short, or
 * another key, and nothing is imported (the target is not even created). */
static void test_tampered(void **state) {
    (void)state;
    FILE *f = fopen(bundle, "rb");
    assert_non_null(f);
    static uint8_t good[1 << 20];
    size_t len = fread(good, 1, sizeof good, f);
    fclose(f);
    assert_true(len > 100 && len < sizeof good);
    char bad[PATH_MAX + 8], target[PATH_MAX];
    snprintf(bad, sizeof bad, "%s/bad.sjb", tmp);
    snprintf(target, sizeof target, "%s/never", tmp);
    size_t offsets[] = {0, 9, len / 2, len - 40, len - 1};
    for (size_t i = 0; i < sizeof offsets / sizeof *offsets; i++) {
        good[offsets[i]] ^= 0x20;
        f = fopen(bad, "wb");
        fwrite(good, 1, len, f);
        fclose(f);
        good[offsets[i]] ^= 0x20;
        tool_out o = tool(KEY, (const char *[]){"import", bad, target, NULL});
        EXPECT_TOOL(o, 1, offsets[i] == 0 ? "not a shapejit kernel bundle" : "signature does not match");
        o = tool(KEY, (const char *[]){"verify", bad, NULL});
        assert_int_equal(o.status, 1);
        assert_int_equal(access(target, F_OK), -1);
    }
    f = fopen(bad, "wb"); /* cut short */
    fwrite(good, 1, len - 7, f);
    fclose(f);
    EXPECT_TOOL(tool(KEY, (const char *[]){"import", bad, target, NULL}), 1, "signature does not match");
    EXPECT_TOOL(tool("another key", (const char *[]){"import", bundle, target, NULL}), 1, "signature does not match");
    assert_int_equal(access(target, F_OK), -1);
    /* the library agrees, at every length: an error with a message, never a crash */
    for (size_t n = 0; n < len; n += 1 + n / 64) {
        sj_bundle *b = NULL;
        assert_int_equal(sj_bundle_parse(good, n, KEY, &b), SJ_EINVAL);
        assert_null(b);
        assert_int_equal(sj_bundle_parse(good, n, NULL, &b), SJ_EINVAL);
        assert_true(strlen(sj_last_error()) > 10);
    }
}

/* The wrong key on export refuses every kernel and leaves the cache whole;
 * bad usage says what is wrong (exit status 2); missing things are named. */
static void test_usage(void **state) {
    (void)state;
    char out[PATH_MAX + 8];
    snprintf(out, sizeof out, "%s/other.sjb", tmp);
    EXPECT_TOOL(tool("another key", (const char *[]){"export", dir_a, out, NULL}), 1, "none of the 3 kernels");
    assert_int_equal(access(out, F_OK), -1);
    assert_int_equal(count_so(dir_a), N_SHAPES); /* nothing deleted */
    EXPECT_TOOL(tool(KEY, (const char *[]){NULL}), 2, "no command");
    EXPECT_TOOL(tool(KEY, (const char *[]){"frobnicate", NULL}), 2, "unknown command 'frobnicate'");
    EXPECT_TOOL(tool(KEY, (const char *[]){"export", dir_a, NULL}), 2, "export takes 2 arguments, got 1");
    EXPECT_TOOL(tool(KEY, (const char *[]){"--key-file", NULL}), 2, "--key-file needs a path");
    EXPECT_TOOL(tool(NULL, (const char *[]){"export", dir_a, out, NULL}), 1, "no key");
    EXPECT_TOOL(tool(NULL, (const char *[]){"import", bundle, out, NULL}), 1, "no key");
    EXPECT_TOOL(tool(NULL, (const char *[]){"verify", bundle, NULL}), 1, "no key");
    char missing[PATH_MAX + 16];
    snprintf(missing, sizeof missing, "%s/missing", tmp);
    EXPECT_TOOL(tool(KEY, (const char *[]){"export", missing, out, NULL}), 1, "no such directory");
    EXPECT_TOOL(tool(KEY, (const char *[]){"list", missing, NULL}), 1, "No such file");
    EXPECT_TOOL(tool(KEY, (const char *[]){"verify", "/etc/passwd", NULL}), 1, "not a shapejit kernel bundle");
    /* --key-file: the key from a file (a trailing newline dropped) */
    char kf[PATH_MAX + 8];
    snprintf(kf, sizeof kf, "%s/key", tmp);
    FILE *f = fopen(kf, "w");
    fprintf(f, "%s\n", KEY);
    fclose(f);
    EXPECT_TOOL(tool(NULL, (const char *[]){"--key-file", kf, "verify", bundle, NULL}), 0, "signature verified");
    EXPECT_TOOL(tool(NULL, (const char *[]){"--key-file", missing, "verify", bundle, NULL}), 1, "cannot read the key file");
    EXPECT_TOOL(tool(NULL, (const char *[]){"--help", NULL}), 0, "usage: shapejit-cache");
    /* the library: import of an unverified bundle refused */
    sj_bundle *b = NULL;
    assert_int_equal(sj_bundle_read(bundle, NULL, &b), SJ_OK);
    assert_false(sj_bundle_verified(b));
    assert_int_equal(sj_bundle_import(b, out, KEY, NULL), SJ_EINVAL);
    assert_non_null(strstr(sj_last_error(), "not verified"));
    sj_bundle_free(b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_export_import),
        cmocka_unit_test(test_tampered),
        cmocka_unit_test(test_usage),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
