/* Bounded waits on the compiler (issue 25, item 1): fake compilers written
 * as shell scripts into a temporary directory hang, hang on --version,
 * leave a background child holding their output, or need arguments in
 * SHAPEJIT_CC. Whatever they do, calls are served (eagerly, with correct
 * results), and sj_runtime_create, sj_fn_destroy and sj_runtime_destroy
 * return. No wall time is asserted tightly: each test runs under a 30 s
 * alarm(), which kills the program if a wait is unbounded. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/bounded.h"
#include "jit/shapejit.h"
#include "tests/util.h"

#define ALARM_S 30
#define N 8

static char dir[256];

static sj_status m_add1(sj_tracer *t, const sj_val *in, int n, void *u) {
    (void)n, (void)u;
    return sj_output(t, sj_add(t, in[0], sj_scalar(t, 1.0)));
}

/* Writes dir/name as an executable shell script with body. */
static const char *script(const char *name, const char *body) {
    static char path[4][512];
    static int k;
    char *p = path[k++ % 4];
    snprintf(p, 512, "%s/%s", dir, name);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fprintf(f, "#!/bin/sh\n%s\n", body);
    fclose(f);
    assert_int_equal(chmod(p, 0755), 0);
    return p;
}

static int count_lines(const char *name) {
    char p[512];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "r");
    if (!f) return 0;
    int n = 0, ch;
    while ((ch = fgetc(f)) != EOF) n += ch == '\n';
    fclose(f);
    return n;
}

static sj_runtime_config config(sj_compile_mode mode, const char *cc, int timeout_ms) {
    sj_runtime_config cfg = tu_cpu_config();
    cfg.compile_mode = mode;
    cfg.cc = cc;
    cfg.hot_threshold = 1;
    cfg.compile_timeout_ms = timeout_ms;
    return cfg;
}

/* One call of x + 1 over N floats, checked. */
static void call_checked(sj_fn *fn) {
    float x[N], y[N];
    for (int i = 0; i < N; i++) x[i] = (float)i * 0.5f, y[i] = -1;
    sj_tensor in = sj_tensor_make(x, SJ_F32, 1, (int64_t[]){N});
    sj_tensor out = sj_tensor_make(y, SJ_F32, 1, (int64_t[]){N});
    assert_int_equal(sj_call(fn, &in, 1, &out, 1), SJ_OK);
    for (int i = 0; i < N; i++) assert_true(y[i] == x[i] + 1.0f);
}

/* With cc as the compiler (compiling synchronously, no timeout to speak
 * of), a function `name` of x + 1 serves `calls` checked calls: one
 * compile, no failure, a call served fused. */
static void compiles_with(const char *cc, const char *name, int calls) {
    sj_runtime_config cfg = config(SJ_COMPILE_SYNC, cc, 600000);
    sj_runtime *rt = NULL;
    assert_int_equal(sj_runtime_create(&cfg, &rt), SJ_OK);
    sj_fn *fn = NULL;
    assert_int_equal(sj_fn_create(rt, name, 1, m_add1, NULL, NULL, &fn), SJ_OK);
    for (int i = 0; i < calls; i++) call_checked(fn);
    sj_stats s;
    sj_fn_stats(fn, &s);
    assert_int_equal(s.compile_failures, 0);
    assert_int_equal(s.compiles, 1);
    assert_true(s.fused_symbolic_calls + s.fused_specialized_calls >= 1);
    sj_runtime_destroy(rt);
}

static int setup(void **state) {
    (void)state;
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/sj-waits-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    assert_non_null(mkdtemp(dir));
    alarm(ALARM_S);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    alarm(0);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd)) {
    }
    return 0;
}

/* -- A compiler that never finishes ------------------------------------------ */

/* `sleep` is a child of the script: killing only the script would leave it
 * holding the output pipe. */
static const char *hang_script(void) {
    char body[1024];
    snprintf(body, sizeof body,
             "case \"$1\" in --version) echo fake 1.0; exit 0;; esac\n"
             "echo run >> '%s/runs'\n"
             "touch '%s/started'\n"
             "sleep 1000",
             dir, dir);
    return script("hang.sh", body);
}

static void sync_call_with_hanging_compiler(void **state) {
    (void)state;
    sj_runtime_config cfg = config(SJ_COMPILE_SYNC, hang_script(), 300);
    sj_runtime *rt = NULL;
    assert_int_equal(sj_runtime_create(&cfg, &rt), SJ_OK);
    sj_fn *fn = NULL;
    assert_int_equal(sj_fn_create(rt, "hang", 1, m_add1, NULL, NULL, &fn), SJ_OK);
    call_checked(fn); /* the compile is killed at 300 ms; served eagerly */
    for (int i = 0; i < 5; i++) call_checked(fn);
    sj_stats s;
    sj_fn_stats(fn, &s);
    assert_int_equal(s.compile_failures, 1);
    assert_int_equal(s.fused_symbolic_calls + s.fused_specialized_calls, 0);
    assert_int_equal(s.calls, 6);
    /* recorded: not compiled again on every call */
    assert_int_equal(count_lines("runs"), 1);
    sj_fn_destroy(fn);
    sj_runtime_destroy(rt);
}

static void destroy_during_hanging_async_compile(void **state) {
    (void)state;
    /* the timeout is far away: destroy must cancel, not wait for it */
    sj_runtime_config cfg = config(SJ_COMPILE_ASYNC, hang_script(), 600000);
    sj_runtime *rt = NULL;
    assert_int_equal(sj_runtime_create(&cfg, &rt), SJ_OK);
    sj_fn *fn = NULL, *fn2 = NULL;
    assert_int_equal(sj_fn_create(rt, "hang", 1, m_add1, NULL, NULL, &fn), SJ_OK);
    assert_int_equal(sj_fn_create(rt, "hang2", 1, m_add1, NULL, NULL, &fn2), SJ_OK);
    char started[512];
    snprintf(started, sizeof started, "%s/started", dir);
    for (int i = 0; i < 2000 && access(started, F_OK); i++) {
        call_checked(fn);
        nanosleep(&(struct timespec){0, 5000000}, NULL);
    }
    assert_int_equal(access(started, F_OK), 0);
    call_checked(fn); /* eager while the compiler hangs */
    assert_int_equal(sj_fn_wait_idle(fn, 50), SJ_ETIMEOUT);
    sj_fn_destroy(fn); /* returns: the compiler is killed */
    /* the second one's compile hangs too; the runtime's destroy ends it */
    unlink(started);
    for (int i = 0; i < 2000 && access(started, F_OK); i++) {
        call_checked(fn2);
        nanosleep(&(struct timespec){0, 5000000}, NULL);
    }
    assert_int_equal(access(started, F_OK), 0);
    sj_runtime_destroy(rt);
}

/* -- The probe at sj_runtime_create --------------------------------------------- */

static void version_hang_does_not_hang_create(void **state) {
    (void)state;
    char body[512];
    snprintf(body, sizeof body, "echo run >> '%s/runs'\nsleep 1000", dir);
    const char *cc = script("hangall.sh", body);
    /* compiles off: the compiler is never run, not even probed */
    sj_runtime_config cfg = config(SJ_COMPILE_OFF, cc, 600000);
    sj_runtime *rt = NULL;
    assert_int_equal(sj_runtime_create(&cfg, &rt), SJ_OK);
    sj_fn *fn = NULL;
    assert_int_equal(sj_fn_create(rt, "off", 1, m_add1, NULL, NULL, &fn), SJ_OK);
    call_checked(fn);
    call_checked(fn);
    sj_runtime_destroy(rt);
    assert_int_equal(count_lines("runs"), 0);
    /* compiles on: the probe is bounded by the timeout */
    cfg = config(SJ_COMPILE_SYNC, cc, 300);
    assert_int_equal(sj_runtime_create(&cfg, &rt), SJ_OK);
    assert_int_equal(count_lines("runs"), 1);
    assert_int_equal(sj_fn_create(rt, "sync", 1, m_add1, NULL, NULL, &fn), SJ_OK);
    call_checked(fn); /* its compile hangs as well: killed, eager */
    call_checked(fn);
    sj_runtime_destroy(rt);
}

/* -- A compiler whose background child keeps the output open -------------------- */

static void background_child_holding_stdout(void **state) {
    (void)state;
    /* the child outlives the test's alarm: waiting for end of output fails */
    const char *cc = script("bg.sh", "(sleep 60) &\nexec cc \"$@\"");
    compiles_with(cc, "bg", 2);
}

/* -- SHAPEJIT_CC with arguments ------------------------------------------------- */

static void cc_with_arguments(void **state) {
    (void)state;
    char body[512];
    snprintf(body, sizeof body,
             "[ \"$1\" = --sj-marker ] || exit 3\nshift\necho \"$@\" >> '%s/runs'\nexec \"$@\"", dir);
    const char *wrap = script("wrap.sh", body);
    char cc[600];
    snprintf(cc, sizeof cc, "%s --sj-marker  cc", wrap); /* two blanks: empty words dropped */
    compiles_with(cc, "args", 1);
    assert_int_equal(count_lines("runs"), 2); /* --version, then the compile */
    /* through the environment too */
    setenv("SHAPEJIT_CC", cc, 1);
    sj_runtime_config cfg;
    sj_runtime_config_init(&cfg);
    assert_string_equal(cfg.cc, cc);
    unsetenv("SHAPEJIT_CC");
}

/* -- Work that cannot be interrupted (NVRTC) ----------------------------------- */

/* A job that sleeps until released by the test (or its own deadline),
 * then marks itself finished; release frees it and counts. */
typedef struct slow_job {
    atomic_int go, ran;
    int sleep_ms;
} slow_job;

static atomic_int released;

static void slow_run(void *p) {
    slow_job *j = p;
    for (int i = 0; i < j->sleep_ms && !atomic_load(&j->go); i++) usleep(1000);
    atomic_store(&j->ran, 1);
}

static void slow_release(void *p) {
    free(p);
    atomic_fetch_add(&released, 1);
}

static slow_job *slow_new(int sleep_ms) {
    slow_job *j = calloc(1, sizeof *j);
    assert_non_null(j);
    j->sleep_ms = sleep_ms;
    return j;
}

static int64_t ms_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void bounded_run_finishes(void **state) {
    (void)state;
    slow_job *j = slow_new(20);
    assert_int_equal(sj_run_bounded("job", slow_run, slow_release, j, 5000, NULL, NULL), SJ_OK);
    assert_int_equal(atomic_load(&j->ran), 1); /* the caller's again */
    free(j);
}

/* Past the timeout the caller returns; the job finishes later and releases
 * itself; at SJ_BOUNDED_MAX_ABANDONED abandoned runs new runs are refused
 * until one ends. */
static void bounded_run_abandons_and_caps(void **state) {
    (void)state;
    atomic_store(&released, 0);
    slow_job *jobs[SJ_BOUNDED_MAX_ABANDONED];
    for (int i = 0; i < SJ_BOUNDED_MAX_ABANDONED; i++) {
        jobs[i] = slow_new(20000);
        int64_t t0 = ms_now();
        int cancelled = -1;
        assert_int_equal(sj_run_bounded("job", slow_run, slow_release, jobs[i], 50, NULL, &cancelled), SJ_ETIMEOUT);
        assert_true(ms_now() - t0 < 5000);
        assert_int_equal(cancelled, 0);
        assert_non_null(strstr(sj_last_error(), "still running after 50 ms"));
    }
    assert_int_equal(sj_bounded_abandoned(), SJ_BOUNDED_MAX_ABANDONED);
    slow_job *extra = slow_new(1);
    assert_int_equal(sj_run_bounded("job", slow_run, slow_release, extra, 50, NULL, NULL), SJ_EBACKEND);
    assert_non_null(strstr(sj_last_error(), "still running"));
    assert_int_equal(atomic_load(&extra->ran), 0); /* refused: nothing ran, still ours */
    assert_int_equal(atomic_load(&released), 0);
    for (int i = 0; i < SJ_BOUNDED_MAX_ABANDONED; i++) atomic_store(&jobs[i]->go, 1);
    while (sj_bounded_abandoned() > 0) usleep(1000); /* the alarm bounds this */
    assert_int_equal(atomic_load(&released), SJ_BOUNDED_MAX_ABANDONED);
    assert_int_equal(sj_run_bounded("job", slow_run, slow_release, extra, 5000, NULL, NULL), SJ_OK);
    free(extra);
}

/* A cancel flag set while waiting ends the wait within its poll. */
static atomic_int cancel_flag;

static void *set_cancel_later(void *p) {
    (void)p;
    usleep(100 * 1000);
    atomic_store(&cancel_flag, 1);
    return NULL;
}

static void bounded_run_cancelled(void **state) {
    (void)state;
    atomic_store(&released, 0);
    atomic_store(&cancel_flag, 0);
    slow_job *j = slow_new(20000);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, set_cancel_later, NULL), 0);
    int cancelled = 0;
    int64_t t0 = ms_now();
    assert_int_equal(sj_run_bounded("job", slow_run, slow_release, j, 0, &cancel_flag, &cancelled), SJ_ETIMEOUT);
    assert_true(ms_now() - t0 < 5000);
    assert_int_equal(cancelled, 1);
    assert_non_null(strstr(sj_last_error(), "cancelled"));
    pthread_join(th, NULL);
    atomic_store(&j->go, 1);
    while (sj_bounded_abandoned() > 0) usleep(1000);
    assert_int_equal(atomic_load(&released), 1);
}

/* exit() waits for an abandoned run: a child abandons a job that writes a
 * file 300 ms later, then exits at once; the file must be there. */
static char exit_mark[600];

static void mark_run(void *p) {
    (void)p;
    usleep(300 * 1000);
    FILE *f = fopen(exit_mark, "w");
    if (f) fclose(f);
}

static void bounded_run_waited_for_at_exit(void **state) {
    (void)state;
    snprintf(exit_mark, sizeof exit_mark, "%s/exit-mark", dir);
    pid_t p = fork();
    if (p == 0) {
        sj_status st = sj_run_bounded("job", mark_run, NULL, NULL, 10, NULL, NULL);
        exit(st == SJ_ETIMEOUT ? 0 : 3);
    }
    int status = -1;
    assert_int_equal(waitpid(p, &status, 0), p);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    assert_int_equal(access(exit_mark, F_OK), 0);
}

int main(int argc, char **argv) {
    signal(SIGPIPE, SIG_IGN);
    if (argc > 1) cmocka_set_test_filter(argv[1]); /* one test: the alarm ends the whole program */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(sync_call_with_hanging_compiler, setup, teardown),
        cmocka_unit_test_setup_teardown(destroy_during_hanging_async_compile, setup, teardown),
        cmocka_unit_test_setup_teardown(version_hang_does_not_hang_create, setup, teardown),
        cmocka_unit_test_setup_teardown(background_child_holding_stdout, setup, teardown),
        cmocka_unit_test_setup_teardown(cc_with_arguments, setup, teardown),
        cmocka_unit_test_setup_teardown(bounded_run_finishes, setup, teardown),
        cmocka_unit_test_setup_teardown(bounded_run_abandons_and_caps, setup, teardown),
        cmocka_unit_test_setup_teardown(bounded_run_cancelled, setup, teardown),
        cmocka_unit_test_setup_teardown(bounded_run_waited_for_at_exit, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
