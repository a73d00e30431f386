/* The tunables table (base/tunables.h): defaults, environment parsing and
 * checks derive from it, and README's environment table says the same. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "base/tunables.h"

static int64_t field(const sj_runtime_config *c, sj_tunable_id id) { return sj_tunable_get(c, id); }

/* Every row: the default is in range, and sj_runtime_config_init sets it. */
static void test_defaults(void **state) {
    (void)state;
    for (int i = 0; i < SJ_TUNE_COUNT; i++) unsetenv(sj_tunables[i].env);
    sj_runtime_config c;
    sj_runtime_config_init(&c);
    for (int i = 0; i < SJ_TUNE_COUNT; i++) {
        const sj_tunable *t = &sj_tunables[i];
        assert_true(t->is_unsigned || (t->dflt >= t->lo && t->dflt <= t->hi));
        assert_true(field(&c, (sj_tunable_id)i) == t->dflt);
    }
    assert_int_equal(c.recompile_limit, 8);
    assert_int_equal(c.cuda_graphs, 64);
    assert_true(c.cache_max_bytes == (UINT64_C(1) << 30));
    assert_true(c.specialize_max_bytes == 0); /* no budget unless asked for */
    assert_int_equal(sj_tunables_check(&c, "t"), SJ_OK);
}

/* The environment: a value at each end of the range is taken; one past it,
 * or one that does not parse, is ignored (the default stays). */
static void test_env_ranges(void **state) {
    (void)state;
    for (int i = 0; i < SJ_TUNE_COUNT; i++) {
        const sj_tunable *t = &sj_tunables[i];
        if (t->is_unsigned || t->size == 8) continue;
        char v[64];
        sj_runtime_config c;
        snprintf(v, sizeof v, "%lld", (long long)t->hi);
        setenv(t->env, v, 1);
        sj_runtime_config_init(&c);
        assert_true(field(&c, (sj_tunable_id)i) == t->hi);
        snprintf(v, sizeof v, "%lld", (long long)t->lo);
        setenv(t->env, v, 1);
        sj_runtime_config_init(&c);
        assert_true(field(&c, (sj_tunable_id)i) == t->lo);
        snprintf(v, sizeof v, "%lld", (long long)t->hi + 1);
        setenv(t->env, v, 1);
        sj_runtime_config_init(&c);
        assert_true(field(&c, (sj_tunable_id)i) == t->dflt);
        setenv(t->env, "4294967296", 1); /* would wrap to 0 as an int */
        sj_runtime_config_init(&c);
        assert_true(field(&c, (sj_tunable_id)i) == t->dflt);
        setenv(t->env, "12x", 1);
        sj_runtime_config_init(&c);
        assert_true(field(&c, (sj_tunable_id)i) == t->dflt);
        unsetenv(t->env);
    }
    setenv("SHAPEJIT_CACHE_MAX_BYTES", "-5", 1);
    sj_runtime_config c;
    sj_runtime_config_init(&c);
    assert_true(c.cache_max_bytes == (UINT64_C(1) << 30));
    setenv("SHAPEJIT_CACHE_MAX_BYTES", "12345", 1);
    sj_runtime_config_init(&c);
    assert_true(c.cache_max_bytes == 12345);
    unsetenv("SHAPEJIT_CACHE_MAX_BYTES");
    setenv("SHAPEJIT_SPECIALIZE_MAX_BYTES", "1048576", 1);
    sj_runtime_config_init(&c);
    assert_true(c.specialize_max_bytes == 1048576);
    setenv("SHAPEJIT_SPECIALIZE_MAX_BYTES", "1M", 1); /* no suffixes: ignored */
    sj_runtime_config_init(&c);
    assert_true(c.specialize_max_bytes == 0);
    unsetenv("SHAPEJIT_SPECIALIZE_MAX_BYTES");
}

/* The config: a field out of range is SJ_EINVAL naming it and its range,
 * from sj_runtime_create as from the table's check. */
static void test_config_checks(void **state) {
    (void)state;
    sj_runtime_config c;
    sj_runtime_config_init(&c);
    c.backend = SJ_BACKEND_CPU;
    c.compile_mode = SJ_COMPILE_OFF;
    c.cache_dir = NULL;
    c.specialize_budget = 0;
    sj_runtime *rt = NULL;
    assert_int_equal(sj_runtime_create(&c, &rt), SJ_EINVAL);
    assert_null(rt);
    assert_non_null(strstr(sj_last_error(), "specialize_budget 0 out of range (1 .. 1000000)"));
    c.specialize_budget = 4;
    c.blas_threads = -2;
    assert_int_equal(sj_runtime_create(&c, &rt), SJ_EINVAL);
    assert_non_null(strstr(sj_last_error(), "blas_threads -2 out of range (-1 .. 1024)"));
    c.blas_threads = 0;
    assert_int_equal(sj_runtime_create(&c, &rt), SJ_OK);
    sj_runtime_destroy(rt);
}

/* README's environment table: a row for every variable of the table, with
 * its default and its range. */
static void test_readme_agrees(void **state) {
    (void)state;
    const char *path = getenv("SJ_README") ? getenv("SJ_README") : "README.md";
    FILE *f = fopen(path, "r");
    if (!f) {
        print_message("skipped: %s not found (run from the repository root)\n", path);
        skip();
    }
    static char text[1 << 20];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = 0;
    for (int i = 0; i < SJ_TUNE_COUNT; i++) {
        const sj_tunable *t = &sj_tunables[i];
        char key[96], want[160];
        snprintf(key, sizeof key, "| `%s` |", t->env);
        const char *row = strstr(text, key);
        if (!row) fail_msg("README's environment table has no row for %s", t->env);
        const char *end = strchr(row, '\n');
        size_t len = end ? (size_t)(end - row) : strlen(row);
        char line[1024];
        snprintf(line, sizeof line, "%.*s", (int)len, row);
        if (t->is_unsigned) snprintf(want, sizeof want, "%lld .. %llu |", (long long)t->lo, (unsigned long long)UINT64_MAX);
        else snprintf(want, sizeof want, "%lld .. %lld |", (long long)t->lo, (long long)t->hi);
        if (!strstr(line, want)) fail_msg("README's row for %s lacks the range '%s': %s", t->env, want, line);
        snprintf(want, sizeof want, "| `%lld` |", (long long)t->dflt);
        if (!strstr(line, want)) fail_msg("README's row for %s lacks the default '%s': %s", t->env, want, line);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_env_ranges),
        cmocka_unit_test(test_config_checks),
        cmocka_unit_test(test_readme_agrees),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
