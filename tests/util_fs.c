/* Temporary directories, files, log capture, clocks and threads for the
 * tests; see tests/util.h. */
/* cmocka.h needs these first, in this order */
/* clang-format off */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
/* clang-format on */

#include "tests/util.h"

#include <ftw.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

/* -- Logs ------------------------------------------------------------------ */

void tu_log_sink(void *user, unsigned topic, const char *msg) {
    tu_logbook *lb = user;
    (void)topic;
    pthread_mutex_lock(&lb->lock);
    int w = snprintf(lb->text + lb->len, sizeof lb->text - lb->len, "%s\n", msg);
    if (w > 0) lb->len += (size_t)w < sizeof lb->text - lb->len ? (size_t)w : sizeof lb->text - 1 - lb->len;
    pthread_mutex_unlock(&lb->lock);
}

bool tu_logged(tu_logbook *lb, const char *what) {
    pthread_mutex_lock(&lb->lock);
    bool found = strstr(lb->text, what) != NULL;
    pthread_mutex_unlock(&lb->lock);
    return found;
}

/* -- Directories ------------------------------------------------------------ */

int tu_mkdtemp(char *dir, size_t n, const char *name) {
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, n, "%s/%s-XXXXXX", tmp && *tmp ? tmp : "/tmp", name);
    return mkdtemp(dir) ? 0 : -1;
}

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

void tu_rmtree(const char *dir) { nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS); }

int tu_fixture_setup(void **state, const char *name) {
    tu_fixture *f = calloc(1, sizeof *f);
    if (!f) return -1;
    if (tu_mkdtemp(f->dir, sizeof f->dir, name)) {
        free(f);
        return -1;
    }
    pthread_mutex_init(&f->log.lock, NULL);
    f->rt.cfg.log_mask = SJ_LOG_ALL;
    f->rt.cfg.log_fn = tu_log_sink;
    f->rt.cfg.log_user = &f->log;
    f->rt.log = (sj_log_sink){f->rt.cfg.log_mask, f->rt.cfg.log_fn, f->rt.cfg.log_user, NULL, NULL};
    *state = f;
    return 0;
}

int tu_fixture_teardown(void **state) {
    tu_fixture *f = *state;
    tu_rmtree(f->dir);
    pthread_mutex_destroy(&f->log.lock);
    free(f);
    return 0;
}

/* -- Clocks, files, threads ---------------------------------------------------- */

double tu_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* sj_runtime_config_init's defaults for backend, quiet and with no disk
 * cache: what tu_cpu_config and tu_cuda_config start from. */
static sj_runtime_config quiet_config(sj_backend_kind backend) {
    sj_runtime_config cfg;
    sj_runtime_config_init(&cfg);
    cfg.backend = backend;
    cfg.log_mask = 0;
    cfg.cache_dir = NULL;
    return cfg;
}

sj_runtime_config tu_cpu_config(void) {
    sj_runtime_config cfg = quiet_config(SJ_BACKEND_CPU);
    cfg.exec_threads = 1;
    return cfg;
}

sj_runtime_config tu_cuda_config(void) { return quiet_config(SJ_BACKEND_CUDA); }

bool tu_cuda_present(void) {
    sj_runtime_config cfg = tu_cuda_config();
    sj_runtime *probe = NULL;
    if (sj_runtime_create(&cfg, &probe) != SJ_OK) {
        printf("skipped: no CUDA device (%s)\n", sj_last_error());
        return false;
    }
    sj_runtime_destroy(probe);
    return true;
}

static int64_t clock_read(void *c) { return atomic_load(&((tu_clock *)c)->ns); }

void tu_clock_use(sj_runtime_config *cfg, tu_clock *c) {
    cfg->clock_ns = clock_read;
    cfg->clock_user = c;
}

void tu_clock_advance_ms(tu_clock *c, int64_t ms) { atomic_fetch_add(&c->ns, ms * INT64_C(1000000)); }

char *tu_explain(const sj_fn *fn) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    assert_non_null(f);
    sj_fn_explain(fn, f);
    fclose(f);
    return text;
}

void tu_flip_byte(const char *path, long offset) {
    FILE *fp = fopen(path, "r+b");
    assert_non_null(fp);
    assert_int_equal(fseek(fp, offset, SEEK_SET), 0);
    int ch = fgetc(fp);
    assert_int_equal(fseek(fp, offset, SEEK_SET), 0);
    fputc(ch ^ 0xff, fp);
    assert_int_equal(fclose(fp), 0);
}

void tu_expect_file(const char *path, const void *data, size_t len) {
    FILE *fp = fopen(path, "r");
    assert_non_null(fp);
    char *text = malloc(len + 16);
    assert_non_null(text);
    size_t n = fread(text, 1, len + 16, fp);
    fclose(fp);
    assert_int_equal(n, len);
    assert_memory_equal(text, data, n);
    free(text);
}

void tu_run_threads(int n, void *(*fn)(void *), void *jobs, size_t job_size) {
    pthread_t *th = calloc((size_t)n, sizeof *th);
    assert_non_null(th);
    int started = 0;
    while (started < n && pthread_create(&th[started], NULL, fn, (char *)jobs + (size_t)started * job_size) == 0)
        started++;
    for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
    free(th);
    assert_int_equal(started, n);
}
