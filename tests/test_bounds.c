/* Bounds and the log contract (issue 25, item 3): strides whose span passes
 * 2^48 are rejected; SHAPEJIT_BUCKETS numbers are range-checked before they
 * are narrowed to int; an empty input with NULL data runs through fused
 * kernels (UBSan: no offset from NULL); one log call is one line, whatever
 * a compiler prints or a function is named; dump file names carry no
 * control characters; past the recompile limit a size the fallback entry
 * cannot serve is traced once, not on every call. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "jit/shapejit.h"
#include "tests/util.h"

static sj_status m_add1(sj_tracer *t, const sj_val *in, int n, void *u) {
    (void)n, (void)u;
    return sj_output(t, sj_add(t, in[0], sj_scalar(t, 1.0)));
}

static sj_runtime_config config(sj_compile_mode mode) {
    sj_runtime_config cfg = tu_cpu_config();
    cfg.compile_mode = mode;
    cfg.hot_threshold = 1;
    return cfg;
}

/* -- Strides ------------------------------------------------------------------ */

static void huge_stride_rejected(void **state) {
    (void)state;
    sj_runtime_config cfg = config(SJ_COMPILE_OFF);
    sj_runtime *rt;
    sj_fn *fn;
    assert_int_equal(sj_runtime_create(&cfg, &rt), SJ_OK);
    assert_int_equal(sj_fn_create(rt, "f", 1, m_add1, NULL, NULL, &fn), SJ_OK);
    float x[4] = {1, 2, 3, 4}, y[2];
    int64_t bad[] = {INT64_C(1) << 62, INT64_C(1) << 48, INT64_MAX};
    for (int k = 0; k < 3; k++) {
        sj_tensor in = sj_tensor_make(x, SJ_F32, 1, (int64_t[]){2});
        in.stride[0] = bad[k];
        sj_tensor out = sj_tensor_make(y, SJ_F32, 1, (int64_t[]){2});
        assert_int_equal(sj_call(fn, &in, 1, &out, 1), SJ_EINVAL);
        assert_non_null(strstr(sj_last_error(), "stride"));
    }
    /* two axes whose spans add past the bound */
    sj_tensor in = sj_tensor_make(x, SJ_F32, 2, (int64_t[]){2, 2});
    in.stride[0] = INT64_C(1) << 47, in.stride[1] = INT64_C(1) << 47;
    sj_tensor out2 = sj_tensor_make(x, SJ_F32, 2, (int64_t[]){2, 2});
    assert_int_equal(sj_call(fn, &in, 1, &out2, 1), SJ_EINVAL);
    /* a size-1 axis takes any stride; an empty tensor too */
    sj_tensor one = sj_tensor_make(x, SJ_F32, 2, (int64_t[]){1, 2});
    one.stride[0] = INT64_C(1) << 62;
    sj_tensor out = sj_tensor_make(y, SJ_F32, 2, (int64_t[]){1, 2});
    assert_int_equal(sj_call(fn, &one, 1, &out, 1), SJ_OK);
    assert_true(y[0] == 2 && y[1] == 3);
    sj_runtime_destroy(rt);
}

/* -- SHAPEJIT_BUCKETS --------------------------------------------------------------- */

static void bucket_numbers_range_checked(void **state) {
    (void)state;
    const char *bad[] = {"f:4294967296:0=pow2:2,8", "f:0:4294967296=pow2:2,8", "f:-1:0=pow2:2,8",
                         "f:0:9=pow2:2,8", "f:64:0=pow2:2,8", "f:99999999999999999999:0=pow2:2,8"};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        sj_runtime_config cfg = config(SJ_COMPILE_OFF);
        cfg.buckets = bad[k];
        sj_runtime *rt = NULL;
        assert_int_equal(sj_runtime_create(&cfg, &rt), SJ_EINVAL);
        assert_non_null(strstr(sj_last_error(), "out of range"));
        /* the environment: reported and ignored */
        setenv("SHAPEJIT_BUCKETS", bad[k], 1);
        sj_runtime_config_init(&cfg);
        unsetenv("SHAPEJIT_BUCKETS");
        assert_null(cfg.buckets);
    }
    sj_runtime_config cfg = config(SJ_COMPILE_OFF);
    cfg.buckets = "f:63:7=pow2:2,8";
    sj_runtime *rt = NULL;
    assert_int_equal(sj_runtime_create(&cfg, &rt), SJ_OK);
    sj_runtime_destroy(rt);
}

/* -- Empty inputs with NULL data through fused kernels ------------------------------ */

static void empty_null_input_fused(void **state) {
    (void)state;
    sj_runtime_config cfg = config(SJ_COMPILE_SYNC);
    sj_runtime *rt;
    sj_fn *fn;
    assert_int_equal(sj_runtime_create(&cfg, &rt), SJ_OK);
    assert_int_equal(sj_fn_create(rt, "empty", 1, m_add1, NULL, NULL, &fn), SJ_OK);
    for (int i = 0; i < 3; i++) {
        sj_tensor in = sj_tensor_make(NULL, SJ_F32, 2, (int64_t[]){0, 4});
        sj_tensor out = sj_tensor_make(NULL, SJ_F32, 2, (int64_t[]){0, 4});
        assert_int_equal(sj_call(fn, &in, 1, &out, 1), SJ_OK);
        sj_tensor_free(rt, &out); /* allocated by the call */
    }
    sj_runtime_destroy(rt);
}

/* -- One log call, one line ------------------------------------------------------- */

static int lines, bad_lines;

static void on_log(void *user, unsigned topic, const char *msg) {
    (void)user, (void)topic;
    lines++;
    if (strchr(msg, '\n') || strchr(msg, '\r')) bad_lines++;
}

static void log_lines_are_lines(void **state) {
    (void)state;
    char dir[256];
    snprintf(dir, sizeof dir, "%s/sj-bounds-XXXXXX", getenv("TMPDIR") && *getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    assert_non_null(mkdtemp(dir));
    char cc[300], dump[300];
    snprintf(cc, sizeof cc, "%s/cc.sh", dir);
    snprintf(dump, sizeof dump, "%s/dump", dir);
    FILE *f = fopen(cc, "w");
    assert_non_null(f);
    /* a failing compile with three lines of diagnostics */
    fprintf(f, "#!/bin/sh\ncase \"$1\" in --version) echo fake; exit 0;; esac\n"
               "echo 'k.c:1: error: one' >&2\necho 'k.c:2: error: two' >&2\necho 'three' >&2\nexit 1\n");
    fclose(f);
    chmod(cc, 0755);
    sj_runtime_config cfg = config(SJ_COMPILE_SYNC);
    cfg.cc = cc;
    cfg.dump_dir = dump;
    cfg.log_mask = SJ_LOG_ALL;
    cfg.log_fn = on_log;
    sj_runtime *rt;
    sj_fn *fn;
    assert_int_equal(sj_runtime_create(&cfg, &rt), SJ_OK);
    assert_int_equal(sj_fn_create(rt, "evil\nname\r\x01/x", 1, m_add1, NULL, NULL, &fn), SJ_OK);
    float x[4] = {1, 2, 3, 4}, y[4];
    sj_tensor in = sj_tensor_make(x, SJ_F32, 1, (int64_t[]){4});
    sj_tensor out = sj_tensor_make(y, SJ_F32, 1, (int64_t[]){4});
    assert_int_equal(sj_call(fn, &in, 1, &out, 1), SJ_OK); /* compile fails: eager */
    assert_true(y[3] == 5);
    sj_runtime_destroy(rt);
    assert_true(lines > 0);
    assert_int_equal(bad_lines, 0);
    DIR *d = opendir(dump);
    int files = 0;
    for (struct dirent *de; d && (de = readdir(d));) {
        if (de->d_name[0] == '.') continue;
        files++;
        for (const char *p = de->d_name; *p; p++) assert_true((unsigned char)*p >= 0x20);
    }
    if (d) closedir(d);
    assert_true(files > 0);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd)) {
    }
}

/* -- Past the recompile limit -------------------------------------------------------- */

static void size_one_past_limit_traced_once(void **state) {
    (void)state;
    sj_runtime_config cfg = config(SJ_COMPILE_OFF);
    cfg.recompile_limit = 1;
    sj_runtime *rt;
    sj_fn *fn;
    assert_int_equal(sj_runtime_create(&cfg, &rt), SJ_OK);
    assert_int_equal(sj_fn_create(rt, "lim", 1, m_add1, NULL, NULL, &fn), SJ_OK);
    float x[8] = {1, 2, 3, 4, 5, 6, 7, 8}, y[8];
    int64_t sizes[] = {5, 6, 7, 1, 1, 1, 1, 0, 0, 0};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        sj_tensor in = sj_tensor_make(x, SJ_F32, 1, (int64_t[]){sizes[k]});
        sj_tensor out = sj_tensor_make(y, SJ_F32, 1, (int64_t[]){sizes[k]});
        assert_int_equal(sj_call(fn, &in, 1, &out, 1), SJ_OK);
        for (int64_t i = 0; i < sizes[k]; i++) assert_true(y[i] == x[i] + 1);
    }
    sj_stats s;
    sj_fn_stats(fn, &s);
    /* 5: static entry; 6: the fallback (symbolic); 1 and 0: one each */
    assert_int_equal(s.traces, 4);
    sj_runtime_destroy(rt);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(huge_stride_rejected),
        cmocka_unit_test(bucket_numbers_range_checked),
        cmocka_unit_test(empty_null_input_fused),
        cmocka_unit_test(log_lines_are_lines),
        cmocka_unit_test(size_one_past_limit_traced_once),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
