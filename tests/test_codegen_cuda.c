/* CUDA code generation through the real pipeline: the fusion tests' model
 * functions (tests/util_patterns.c, shared with test_fusion) are traced
 * (static, or every size >= 2 symbolic), fused, and every plan's generated
 * groups emitted in both forms.
 *
 * Everywhere (no GPU needed): each unit compiles with NVRTC for sm_90,
 * with the CUDA backend's options, without errors or warnings; the launch
 * rule's dimensions; the text of both forms; no 64-bit division in the
 * PTX of float kernels (index math divides per row, never per element).
 *
 * With a CUDA device (the driver loaded with dlopen, cuInit succeeding):
 * each plan runs with its generated kernels on the device, launched with
 * sj_cuda_launch's dimensions (NODE groups and output copies on the host,
 * between device copies of every store), outputs poisoned first, and is
 * compared with eager execution on the CPU, at the traced sizes and, for
 * symbolic plans, at three other sizes (one with a size-2 edge); every run
 * once more with every input's device base one element off 16-byte
 * alignment (the kernels' scalar path). Without one it prints
 * "skipped: no CUDA device" after the compile checks and passes.
 *
 * The compile checks load NVRTC themselves with dlopen (tests/util_nvrtc.h:
 * libnvrtc.so.13 from $SHAPEJIT_CUDA_LIBS, $CUDA_HOME/lib64, /usr/local/cuda/lib64, then
 * the loader's path), so they run in any build; the device runs use the
 * runtime's device services (kernels/cuda/cuda_dev.h: sj_cuda_open, its
 * allocator, copies and driver table) and need a build with SJ_WITH_CUDA.
 * SJ_SHOW_CODE=1 prints w1 and w2; SJ_TEST_VERBOSE=1 every run.
 */
/* cmocka.h needs these first, in this order */
/* clang-format off */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
/* clang-format on */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench/bench_util.h"
#include "jit/exec.h"
#include "jit/runtime.h"
#include "jit/trace.h"
#include "kernels/cpu/eager.h"
#include "kernels/cuda/nvrtc.h"
#include "specialize/codegen_cuda.h"
#include "specialize/fusion.h"
#include "tests/util_patterns.h"
#include "tests/util_cuda.h"
#ifdef SJ_WITH_CUDA
#include "kernels/cuda/cuda_dev.h"
#endif

#define S(...) ((const int64_t[]){__VA_ARGS__})

/* -- NVRTC and the device (tests/util_cuda.h) -------------------------------- */

/* NVRTC, and device 0 when there is one (arch is then its own) */
static tu_cuda cu;

/* -- Compiling ---------------------------------------------------------------- */

static struct {
    int units;
    int vector_runs, fallback_runs; /* launches of split pairs' kernels (gpu_run) */
    double total_s, max_s;
    size_t bytes;
    char slowest[96];
} stats;

/* Compile src with the CUDA backend's options for arch; assert no errors
 * and no warnings (the log is printed otherwise). Returns the CUBIN (or
 * the PTX, for a virtual arch) when out is not NULL. */
static void nvrtc_compile(const char *src, const char *arch, const char *what, char **out, size_t *out_len) {
    nvrtc_prog prog;
    sj_nvrtc_opts o;
    int maj = 0, min = 0;
    cu.nv.Version(&maj, &min);
    assert_int_equal(sj_nvrtc_options(arch, maj * 100 + min, NULL, &o), SJ_OK);
    assert_int_equal(cu.nv.CreateProgram(&prog, src, "unit.cu", 0, NULL, NULL), 0);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int r = cu.nv.CompileProgram(prog, o.argc, o.argv);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    tu_nvrtc_check(&cu.nv, prog, r, what, getenv("SJ_TEST_VERBOSE") ? src : NULL);
    if (strstr(arch, "sm_")) {
        stats.units++;
        stats.total_s += s;
        stats.bytes += strlen(src);
        if (s > stats.max_s) {
            stats.max_s = s;
            snprintf(stats.slowest, sizeof stats.slowest, "%s", what);
        }
        printf("  nvrtc %-44s %6zu bytes %6.3f s\n", what, strlen(src), s);
    }
    if (out) tu_nvrtc_output(&cu.nv, prog, !strstr(arch, "sm_"), out, out_len);
    cu.nv.DestroyProgram(&prog);
}

/* -- Environment ---------------------------------------------------------------- */

static sj_runtime *rt;
static sj_pool arena_pool;

static int setup_all(void **state) {
    const char *seed = getenv("SJ_TEST_SEED");
    tu_seed(seed ? strtoull(seed, NULL, 0) : 0xc0da);
    if (sj_runtime_create(NULL, &rt)) return -1;
    sj_pool_init(&arena_pool, rt);
    tu_cuda_open(&cu);
    return 0;
}

static int teardown_all(void **state) {
    tu_cuda_close(&cu);
    sj_pool_destroy(&arena_pool);
    sj_runtime_destroy(rt);
    return 0;
}

/* -- Running on the device ----------------------------------------------------------- */

typedef struct unit {
    void *mod;                           /* CUmodule */
    int variants[256];                   /* functions per group (sj_codegen_opts.variants) */
    int fallbacks[256];                  /* a fallback kernel <name>_fb (sj_codegen_opts.fallbacks) */
    void *fns[256][SJ_CG_VARIANTS_MAX];  /* CUfunction per group and launch variant */
    void *fb[256];                       /* CUfunction of the fallback kernel, where there is one */
} unit;

#ifdef SJ_WITH_CUDA

/* A driver call that must succeed. */
static void cu_ok(CUresult r, const char *what) {
    if (SJ_CU(cu.dev, r, what)) fail_msg("%s", sj_last_error());
}

static void unit_load(const sj_fplan *p, const char *cubin, const char *prefix, unit *u) {
    CUmodule mod;
    cu_ok(cu.dev->api.ModuleLoadData(&mod, cubin), "cuModuleLoadData");
    u->mod = mod;
    assert_true(p->n_groups <= 256);
    for (int gi = 0; gi < p->n_groups; gi++) {
        if (p->groups[gi].kind == SJ_G_NODE) continue;
        int nv = u->variants[gi];
        assert_true(nv >= 1 && nv <= SJ_CG_VARIANTS_MAX);
        for (int v = 0; v < nv; v++) {
            char name[64];
            CUfunction f;
            if (nv == 1) snprintf(name, sizeof name, "%s%s", prefix, p->groups[gi].name);
            else snprintf(name, sizeof name, "%s%s_v%d", prefix, p->groups[gi].name, v);
            cu_ok(cu.dev->api.ModuleGetFunction(&f, mod, name), name);
            u->fns[gi][v] = f;
        }
        if (u->fallbacks[gi]) {
            char name[64];
            CUfunction f;
            assert_int_equal(nv, 1);
            snprintf(name, sizeof name, "%s%s_fb", prefix, p->groups[gi].name);
            cu_ok(cu.dev->api.ModuleGetFunction(&f, mod, name), name);
            u->fb[gi] = f;
        }
    }
}

static void unit_free(unit *u) {
    if (u->mod) cu.dev->api.ModuleUnload((CUmodule)u->mod);
    u->mod = NULL;
}

/* Elements from a descriptor's data pointer to its last element, plus one
 * (strides >= 0). */
static int64_t extent(const sj_tensor *t) {
    int64_t e = 1;
    for (int a = 0; a < t->rank; a++) {
        if (t->shape[a] == 0) return 0;
        e += (t->shape[a] - 1) * t->stride[a];
    }
    return e;
}

/* A host descriptor for value v from its layout (as the fused executor). */
static void layout_desc(const sj_graph *g, const sj_fplan *p, const int64_t *exv, void *const *bases, int32_t v,
                        sj_tensor *t) {
    const sj_value *val = &g->vals[v];
    const sj_layout *l = &p->layouts[v];
    memset(t, 0, sizeof *t);
    t->dtype = val->dtype;
    t->rank = val->rank;
    for (int i = 0; i < val->rank; i++) t->shape[i] = exv[val->shape[i]];
    if (l->store < 0) {
        t->data = (void *)&g->consts[val->index].bits;
        return;
    }
    t->data = (char *)bases[l->store] + (size_t)exv[l->offset] * sj_dtype_size(val->dtype);
    for (int i = 0; i < val->rank; i++) t->stride[i] = exv[l->stride[i]];
}

/* A store's host memory and its device copy. */
typedef struct dstore {
    void *host;
    size_t bytes;
    CUdeviceptr alloc, base; /* base: the store's start on the device */
    bool written;            /* outputs and the arena: copied back around NODE groups */
} dstore;

static void sync_stores(dstore *ds, int n, bool to_host) {
    for (int s = 0; s < n; s++) {
        if (!ds[s].bytes || (to_host && !ds[s].written)) continue;
        sj_status st = to_host ? sj_cuda_to_host(cu.dev, ds[s].host, ds[s].base, ds[s].bytes)
                               : sj_cuda_to_device(cu.dev, ds[s].base, ds[s].host, ds[s].bytes);
        if (st) fail_msg("%s", sj_last_error());
    }
}

static CUdeviceptr dev_alloc(size_t bytes) {
    CUdeviceptr p = sj_cuda_alloc(cu.dev, bytes ? bytes : 1, cu.dev->stream);
    if (!p) fail_msg("%s", sj_last_error());
    return p;
}

/* Run plan p of g on the device: generated groups through u, launched
 * with sj_cuda_launch's dimensions; NODE groups and output copies on the
 * host, between copies of every store. outs: contiguous host tensors.
 * shift: every input's device base one element past an aligned address. */
static void gpu_run(const sj_graph *g, const sj_fplan *p, const unit *u, const sj_tensor *ins, sj_tensor *outs,
                    const int64_t *sv, bool shift, const char *what) {
    int n_ex = sj_ex_count(g->ex), ns = sj_sym_count(g->ex);
    int64_t *exv = malloc((size_t)n_ex * sizeof *exv);
    dstore *ds = calloc((size_t)p->n_stores + 1, sizeof *ds);
    void **hb = calloc((size_t)p->n_stores + 1, sizeof *hb);
    sj_tensor *rv = calloc((size_t)g->n_vals + 1, sizeof *rv);
    assert_true(exv && ds && hb && rv);
    sj_ex_eval_all(g->ex, sv, exv);
    size_t arena = (size_t)exv[p->arena_bytes];
    char *harena = aligned_alloc(64, arena + 64);
    assert_non_null(harena);
    memset(harena, 0xA5, arena + 64); /* poison */
    CUdeviceptr darena = dev_alloc(arena);
    for (int s = 0; s < p->n_stores; s++) {
        const sj_store *so = &p->stores[s];
        dstore *d = &ds[s];
        const sj_tensor *t = so->kind == SJ_ST_INPUT ? &ins[so->index]
                             : so->kind == SJ_ST_PARAM ? &g->params[so->index]
                             : so->kind == SJ_ST_OUTPUT ? &outs[so->index]
                                                        : NULL;
        if (t) {
            size_t es = sj_dtype_size(t->dtype), off = shift && so->kind == SJ_ST_INPUT ? es : 0;
            d->host = t->data;
            d->bytes = (size_t)extent(t) * es;
            d->alloc = dev_alloc(d->bytes + off);
            d->base = d->alloc + off;
            d->written = so->kind == SJ_ST_OUTPUT;
        } else {
            d->host = harena + exv[so->offset];
            d->bytes = (size_t)exv[so->bytes];
            d->base = darena + (CUdeviceptr)exv[so->offset];
            d->written = true;
        }
        hb[s] = d->host;
    }
    sync_stores(ds, p->n_stores, false);
    for (int gi = 0; gi < p->n_groups; gi++) {
        const sj_group *gr = &p->groups[gi];
        if (gr->kind == SJ_G_NODE) {
            sync_stores(ds, p->n_stores, true);
            const sj_node *n = &g->nodes[gr->nodes[0]];
            const int32_t *in = sj_node_ins(g, n);
            for (int k = 0; k < n->n_in; k++)
                if (in[k] >= 0) layout_desc(g, p, exv, hb, in[k], &rv[in[k]]);
            if (gr->bias >= 0) layout_desc(g, p, exv, hb, gr->bias, &rv[gr->bias]);
            sj_tensor y;
            layout_desc(g, p, exv, hb, sj_group_out(g, gr), &y);
            assert_int_equal(sj_exec_node(g, n, rv, gr->bias >= 0 ? &rv[gr->bias] : NULL, &y), SJ_OK);
            sync_stores(ds, p->n_stores, false);
            continue;
        }
        sj_launch L;
        if (!sj_cuda_launch(gr, exv, cu.dev->sm_count, &L)) continue;
        CUdeviceptr ptrs[2 * SJ_MAX_INPUTS + 64];
        long long syms[64];
        void *args[2 * SJ_MAX_INPUTS + 64 + 64];
        int na = 0;
        assert_true(ns <= 64 && gr->n_loads + gr->n_stores <= (int)(sizeof ptrs / sizeof ptrs[0]));
        for (int k = 0; k < gr->n_loads + gr->n_stores; k++) {
            const sj_access *x = k < gr->n_loads ? &gr->loads[k] : &gr->stores[k - gr->n_loads];
            ptrs[k] = ds[x->store].base;
            args[na++] = &ptrs[k];
        }
        for (int i = 0; i < ns; i++) {
            syms[i] = sv[i];
            args[na++] = &syms[i];
        }
        if (getenv("SJ_TEST_VERBOSE"))
            fprintf(stderr, "    %s: grid (%u, %u) block (%u, %u) smem %u\n", gr->name, L.grid[0], L.grid[1],
                    L.block[0], L.block[1], L.smem);
        sj_cuda_bind(cu.dev);
        /* a group of one function has it for every launch (as sj_compiled's slots) */
        int v = u->variants[gi] == 1 ? 0 : L.variant;
        assert_true(v >= 0 && v < u->variants[gi]);
        void *fn = u->fns[gi][v];
        /* a split pair: the fallback for calls the vector kernel refuses
         * (the shifted inputs of run_and_compare) */
        void *vp[2 * SJ_MAX_INPUTS + 64];
        for (int k = 0; k < gr->n_loads + gr->n_stores; k++) vp[k] = (void *)(uintptr_t)ptrs[k];
        if (u->fallbacks[gi] && !sj_cuda_vec_ok(g, gr, exv, vp)) fn = u->fb[gi], stats.fallback_runs++;
        else if (u->fallbacks[gi]) stats.vector_runs++;
        cu_ok(cu.dev->api.LaunchKernel((CUfunction)fn, L.grid[0], L.grid[1], L.grid[2], L.block[0],
                                       L.block[1], L.block[2], L.smem, cu.dev->stream, args, NULL),
              tu_label("%s: launch %s", what, gr->name));
        cu_ok(cu.dev->api.StreamSynchronize(cu.dev->stream), tu_label("%s: run %s", what, gr->name));
    }
    sync_stores(ds, p->n_stores, true);
    for (int i = 0; i < g->n_outputs; i++) {
        if (!p->output_copy[i]) continue;
        sj_tensor src;
        layout_desc(g, p, exv, hb, g->outputs[i], &src);
        assert_int_equal(sj_cpu_copy(&src, &outs[i]), SJ_OK);
    }
    for (int s = 0; s < p->n_stores; s++) sj_cuda_free(cu.dev, ds[s].alloc, cu.dev->stream);
    sj_cuda_free(cu.dev, darena, cu.dev->stream);
    free(harena);
    free(rv);
    free(hb);
    free(ds);
    free(exv);
}

/* Eager on the CPU, then the plan on the device (inputs aligned, then
 * shifted); every output compared. */
static void run_and_compare(const sj_graph *g, const sj_fplan *p, const unit *u, const sj_tensor *ins,
                            const int64_t *sv, const char *what) {
    sj_tensor eo[16], fo[16];
    sj_exec x;
    tu_pattern_eager(rt, &arena_pool, g, ins, sv, what, &x, eo, fo);
    for (int shift = 0; shift < 2; shift++) {
        for (int i = 0; i < g->n_outputs; i++) tu_poison(&fo[i]);
        gpu_run(g, p, u, ins, fo, sv, shift, what);
        for (int i = 0; i < g->n_outputs; i++) {
            const char *lb = tu_label("%s out%d%s", what, i, shift ? " shifted" : "");
            if (!tu_check_like_eager(&fo[i], &eo[i], lb)) fail_msg("%s: output %d differs from eager", lb, i);
        }
    }
}

#else /* no device services in this build: compile checks only */

static void unit_load(const sj_fplan *p, const char *cubin, const char *prefix, unit *u) {}
static void unit_free(unit *u) {}
static void run_and_compare(const sj_graph *g, const sj_fplan *p, const unit *u, const sj_tensor *ins,
                            const int64_t *sv, const char *what) {}

#endif /* SJ_WITH_CUDA */

/* -- Harness ---------------------------------------------------------------------- */

static unit units[2]; /* per form: specialized, symbolic */

/* Generate one form, compile it (for sm_90, or the device's arch), and on
 * a device load it. */
static void build(const sj_graph *g, const sj_fplan *p, const int64_t *sv, int form, const char *what) {
    const char *prefix = form ? "sym_" : "spec_";
    unit *u = &units[form];
    size_t len;
    memset(u, 0, sizeof *u);
    assert_true(p->n_groups <= 256);
    /* the specialized form with its row kernels' fallbacks as kernels of
     * their own (launched for unaligned calls: sj_cuda_vec_ok), the
     * symbolic one without (one kernel holding both paths) */
    const sj_codegen_opts o = {.prefix = prefix, .variants = u->variants, .fallbacks = u->fallbacks,
                               .fallback_kernels = form == 0};
    char *src = sj_codegen_cuda(g, p, sv, &o, &len);
    assert_non_null(src);
    assert_int_equal(strlen(src), len);
    char *cubin = NULL;
    size_t cubin_len = 0;
    if (p->n_generated > 0) {
        nvrtc_compile(src, cu.arch, what, cu.have_gpu ? &cubin : NULL, &cubin_len);
        if (cu.have_gpu) unit_load(p, cubin, prefix, u);
    }
    free(cubin);
    free(src);
}

static void run(const sj_graph *g, const sj_fplan *p, int form, const sj_tensor *ins, const int64_t *sv,
                tu_ref_fn ref, const char *what) {
    run_and_compare(g, p, &units[form], ins, sv, what);
}

static void unload(int form) { unit_free(&units[form]); }

/* Trace pt at random sizes (or `force`), static or symbolic; fuse;
 * generate and compile both forms; on a device, run at the traced sizes
 * and, symbolic, at three other sizes (the first with a size-2 edge). */
static void run_pattern(const tu_pattern *pt, bool symbolic, sj_dtype dt, const int64_t *force) {
    const tu_pattern_target tg = {build, run, unload, cu.have_gpu};
    tu_run_pattern(pt, symbolic, dt, force, &tg);
}

static void run_both(const tu_pattern *pt, sj_dtype dt) {
    if (!cu.have_nvrtc) skip();
    run_pattern(pt, false, dt, NULL);
    run_pattern(pt, true, dt, NULL);
}

/* -- Tests: NVRTC options ----------------------------------------------------------- */

/* The NVRTC argument list (what the CUDA backend and nvrtc_compile below
 * pass): the generator's options, then the flags' words; the limits. */
static void test_nvrtc_options(void **state) {
    (void)state;
    sj_nvrtc_opts o;
    assert_int_equal(sj_nvrtc_options("sm_90", 1300, NULL, &o), SJ_OK);
    assert_int_equal(o.argc, 5);
    assert_string_equal(o.argv[0], "--gpu-architecture=sm_90");
    assert_string_equal(o.argv[1], "--std=c++17");
    assert_string_equal(o.argv[2], "-default-device");
    assert_string_equal(o.argv[3], "--extra-device-vectorization"); /* no -lineinfo: the same code, 2.7x the bytes */
    assert_string_equal(o.argv[4], "-minimal"); /* NVRTC 12.4 on */
    /* an NVRTC before 12.4 (or unknown) has no -minimal */
    assert_int_equal(sj_nvrtc_options("sm_90", 1203, NULL, &o), SJ_OK);
    assert_int_equal(o.argc, 4);
    assert_int_equal(sj_nvrtc_options("sm_90", 0, NULL, &o), SJ_OK);
    assert_int_equal(o.argc, 4);
    assert_int_equal(sj_nvrtc_options("sm_90", 1204, NULL, &o), SJ_OK);
    assert_int_equal(o.argc, 5);
    assert_int_equal(sj_nvrtc_options("sm_90", 1300, NULL, &o), SJ_OK);
    const int own = o.argc;
    assert_int_equal(sj_nvrtc_options("compute_80", 1300, "", &o), SJ_OK);
    assert_int_equal(o.argc, own);
    assert_string_equal(o.argv[0], "--gpu-architecture=compute_80");
    assert_int_equal(sj_nvrtc_options("sm_90", 1300, "\t -DA=1   -Xptxas=-O1\t--use_fast_math ", &o), SJ_OK);
    assert_int_equal(o.argc, own + 3);
    assert_string_equal(o.argv[own], "-DA=1");
    assert_string_equal(o.argv[own + 1], "-Xptxas=-O1");
    assert_string_equal(o.argv[own + 2], "--use_fast_math");

    /* 16 words fit, 17 do not; 511 characters fit, 512 do not */
    char flags[SJ_NVRTC_FLAGS_LEN + 2] = "";
    for (int i = 0; i < SJ_NVRTC_MAX_FLAGS; i++) snprintf(flags + strlen(flags), 8, "-DX%d ", i);
    assert_int_equal(sj_nvrtc_options("sm_90", 1300, flags, &o), SJ_OK);
    assert_int_equal(o.argc, own + SJ_NVRTC_MAX_FLAGS);
    assert_string_equal(o.argv[o.argc - 1], "-DX15");
    strcat(flags, "-DX16");
    assert_int_equal(sj_nvrtc_options("sm_90", 1300, flags, &o), SJ_EINVAL);
    assert_non_null(strstr(sj_last_error(), "nvrtc_flags: more than 16 options"));
    memset(flags, 0, sizeof flags);
    memcpy(flags, "-DLONG=", 7);
    memset(flags + 7, 'x', SJ_NVRTC_FLAGS_LEN - 7);
    assert_int_equal(sj_nvrtc_options("sm_90", 1300, flags, &o), SJ_OK);
    assert_int_equal((int)strlen(o.argv[own]), SJ_NVRTC_FLAGS_LEN);
    flags[SJ_NVRTC_FLAGS_LEN] = 'x';
    assert_int_equal(sj_nvrtc_options("sm_90", 1300, flags, &o), SJ_EINVAL);
    assert_non_null(strstr(sj_last_error(), "nvrtc_flags: 512 characters, more than the 511 allowed"));
}

/* -- Tests: the launch rule ---------------------------------------------------------- */

/* A group of `kind` over [rows, n]: expression ids 0 (rows) and 1 (n). */
static sj_launch launch_of(sj_group_kind kind, int64_t rows, int64_t n, int sms, int *ret) {
    sj_group gr = {.kind = kind, .rank = 2, .rows = 0, .shape = {0, 1}, .row_node = -1};
    int64_t exv[2] = {rows, n};
    sj_launch L;
    *ret = sj_cuda_launch(&gr, exv, sms, &L);
    return L;
}

static void test_launch_rule(void **state) {
    int r;
    sj_launch L = launch_of(SJ_G_POINTWISE, 9, 4096, 132, &r);
    assert_int_equal(r, 1);
    assert_true(L.block[0] == 256 && L.block[1] == 1 && L.grid[0] == 2 && L.grid[1] == 9 && L.smem == 0);
    L = launch_of(SJ_G_POINTWISE, 100000, 2049, 132, &r); /* rows looped: 64 blocks per SM */
    assert_true(r == 1 && L.grid[0] == 2 && L.grid[1] == 132 * 64 / 2 && L.grid[2] == 1);
    L = launch_of(SJ_G_POINTWISE, 10000000, 1, 0, &r); /* no SM count: at least one block */
    assert_true(r == 1 && L.grid[0] == 1 && L.grid[1] == 64);
    launch_of(SJ_G_POINTWISE, 0, 7, 132, &r);
    assert_int_equal(r, 0);
    launch_of(SJ_G_POINTWISE, 7, 0, 132, &r);
    assert_int_equal(r, 0);
    /* a warp per row up to 1024; fewer rows per block when rows are few */
    L = launch_of(SJ_G_ROW, 50000, 768, 132, &r);
    assert_true(r == 1 && L.block[0] == 32 && L.block[1] == 8 && L.grid[0] == 6250 && L.smem == 8 * 768 * 4);
    L = launch_of(SJ_G_ROW, 200000, 768, 132, &r); /* rows looped past 64 blocks per SM */
    assert_true(r == 1 && L.block[1] == 8 && L.grid[0] == 132 * 64);
    L = launch_of(SJ_G_ROW, 9, 1024, 132, &r);
    assert_true(r == 1 && L.block[0] == 32 && L.block[1] == 1 && L.grid[0] == 9 && L.smem == 4096);
    /* a block per row past 1024: >= 8 elements a thread, cached up to 8192 */
    L = launch_of(SJ_G_ROW, 9, 1025, 132, &r);
    assert_true(r == 1 && L.block[0] == 256 && L.block[1] == 1 && L.grid[0] == 9 && L.smem == 1025 * 4);
    L = launch_of(SJ_G_ROW, 9, 4096, 132, &r);
    assert_true(L.block[0] == 512 && L.smem == 4096 * 4);
    L = launch_of(SJ_G_ROW, 9, 8192, 132, &r); /* at most 512 threads */
    assert_true(L.block[0] == 512 && L.smem == 8192 * 4);
    L = launch_of(SJ_G_ROW, 3, 9000, 132, &r);
    assert_true(L.block[0] == 512 && L.smem == 0 && L.grid[0] == 3);
    L = launch_of(SJ_G_ROW, (int64_t)1 << 40, 4, 132, &r);
    assert_true(r == 1 && L.grid[0] == 132 * 64);
    L = launch_of(SJ_G_ROW, (int64_t)1 << 40, 4, 0, &r); /* no SM count: up to 2^31 - 1 */
    assert_true(r == 1 && L.grid[0] == 2147483647u);
    /* rows of length 0 still run (sums are 0, means NaN); no rows: nothing */
    L = launch_of(SJ_G_ROW, 3, 0, 132, &r);
    assert_true(r == 1 && L.smem == 0);
    launch_of(SJ_G_ROW, 0, 5, 132, &r);
    assert_int_equal(r, 0);
    /* the variant of a symbolic row kernel, for every row length: the
     * first whose longest row it fits, with the launch's thread count */
    static const unsigned nts[4] = {32, 32, 256, 512};
    static const int64_t nmax[4] = {512, 1024, 2048, INT64_MAX};
    for (int64_t n = 0; n <= 20000; n += n < 2100 ? 1 : 97) {
        L = launch_of(SJ_G_ROW, 5, n, 132, &r);
        assert_true(r == 1 && L.variant >= 0 && L.variant < 4 && L.block[0] == nts[L.variant]);
        assert_true(n <= nmax[L.variant] && (L.variant == 0 || n > nmax[L.variant - 1]));
    }
    L = launch_of(SJ_G_ROW, 5, (int64_t)1 << 40, 132, &r);
    assert_true(r == 1 && L.variant == 3 && L.block[0] == 512);
    L = launch_of(SJ_G_POINTWISE, 5, 1000, 132, &r);
    assert_true(r == 1 && L.variant == 0);
}

/* -- Tests: text and PTX ---------------------------------------------------------------- */

/* Trace pt once at d, symbolic or not; fuse. */
static sj_fplan *plan_as(const tu_pattern *pt, const int64_t *d, sj_dtype dt, bool sym, sj_graph **g, int64_t *sv) {
    sj_tensor in[16];
    pt->make(d, dt, in);
    tu_pol pl = {.sym = sym, .fixed = pt->fixed};
    return tu_pattern_plan(pt, in, &pl, g, sv);
}
static sj_fplan *plan_of(const tu_pattern *pt, const int64_t *d, sj_dtype dt, sj_graph **g, int64_t *sv) {
    return plan_as(pt, d, dt, true, g, sv);
}

static void test_codegen_text(void **state) {
    const tu_pattern *pts[2] = {&tu_pat_w1, &tu_pat_w2};
    const int64_t *dims[2] = {S(9, 4096), S(9, 768)};
    for (int i = 0; i < 2; i++) {
        sj_graph *g;
        int64_t sv[64];
        sj_fplan *p = plan_of(pts[i], dims[i], SJ_F32, &g, sv);
        int nv_spec[4] = {0}, nv_sym[4] = {0};
        assert_true(p->n_groups <= 4);
        char *spec = sj_codegen_cuda(g, p, sv, &(sj_codegen_opts){.prefix = "w_", .variants = nv_spec}, NULL);
        char *sym = sj_codegen_cuda(g, p, NULL, &(sj_codegen_opts){.prefix = "w_", .variants = nv_sym}, NULL);
        assert_non_null(spec);
        assert_non_null(sym);
        /* specialized: one kernel per group; symbolic: a row kernel has a
         * variant per row thread count, each naming a minimum of 3 resident
         * blocks, around one body templated on that count */
        assert_int_equal(nv_spec[0], 1);
        assert_int_equal(nv_sym[0], i == 0 ? 1 : 4);
        char head[160];
        snprintf(head, sizeof head, "extern \"C\" __global__ void __launch_bounds__(%s) w_k0(const float *__restrict__ p0",
                 i == 0 ? "256" : "512");
        assert_non_null(strstr(spec, head));
        if (i == 0) {
            assert_non_null(strstr(sym, "__launch_bounds__(256) w_k0("));
            assert_non_null(strstr(sym, ", long long s0, long long s1) {"));
        } else {
            /* rows up to 512 and 1024 (a warp's: in 4 and 8 chunks of
             * registers a lane, bounded by the block alone), up to 2048 (256
             * threads: in 2 chunks), longer (512 threads: registers up to
             * 4096, then shared memory, then recomputed past 8192) */
            assert_null(strstr(sym, " w_k0("));
            static const char *heads[4] = {"__launch_bounds__(256) w_k0_v0(const float",
                                           "__launch_bounds__(256) w_k0_v1(const float",
                                           "__launch_bounds__(512, 3) w_k0_v2(const float",
                                           "__launch_bounds__(512, 3) w_k0_v3(const float"};
            static const char *nts[4] = {"nt = 32;", "nt = 32;", "nt = 256;", "nt = 512;"};
            static const char *rcs[4] = {"constexpr int RC = 4;\nfloat rc[RC][4];", "constexpr int RC = 8;\nfloat rc[RC][4];",
                                         "constexpr int RC = 2;\nfloat rc[RC][4];", "constexpr int RC = 2;\nfloat rc[RC][4];"};
            const char *at[5];
            for (int v = 0; v < 4; v++) {
                at[v] = strstr(sym, heads[v]);
                assert_non_null(at[v]);
                assert_true(!v || at[v] > at[v - 1]);
            }
            at[4] = sym + strlen(sym);
            for (int v = 0; v < 4; v++) {
                char *k = strndup(at[v], (size_t)(at[v + 1] - at[v]));
                assert_non_null(strstr(k, ", long long s0, long long s1) {\n"));
                assert_non_null(strstr(k, nts[v]));
                assert_null(strstr(k, "blockDim.x;"));
                assert_non_null(strstr(k, rcs[v]));
                assert_true(!strstr(k, "if (n1 <= 8 * nt) {") == (v < 3));
                assert_true(!strstr(k, "if (n1 <= 8192) {") == (v < 3));
                assert_true(!strstr(k, "float cx[4];") == (v < 3)); /* the row in shared memory, 16 bytes a move */
                assert_true(!strstr(k, "#pragma unroll 1\nfor (int64_t j0 = 4 * tid;") == (v < 3));
                free(k);
            }
        }
        assert_non_null(strstr(spec, "sj_rt_geluf"));
        assert_null(strstr(spec, "(s0)")); /* specialized: literals only */
        assert_non_null(strstr(sym, "(s1)"));
        if (i == 0) {
            assert_non_null(strstr(spec, "sj_ld4(p0 + o0 + c + h * 1024, x0 + 4 * h);"));
            assert_non_null(strstr(sym, "(n1 & 3) == 0"));
        } else {
            assert_non_null(strstr(spec, "sj_cu_reduce("));
            assert_null(strstr(spec, "n1 <= 8192")); /* 768: cached only */
            assert_non_null(strstr(sym, "if (n1 <= 8192) {"));
            /* 16-byte chunks, the row in registers: 768 = 6 chunks of a warp's lanes */
            assert_non_null(strstr(spec, "constexpr int RC = 6;"));
            assert_non_null(strstr(spec, "nt = 32;"));
            assert_non_null(strstr(spec, "sj_ld4(p0 + o0 + j0, x0);"));
            assert_non_null(strstr(spec, "rc[i][jj] = x;"));
            assert_null(strstr(sym, "blockDim.x;"));
        }
        tu_codegen_done(spec, sym, p, g);
    }
    /* a trace without symbols is generated with sym_vals NULL, every size a
     * literal: its row kernels take the specialized launch bounds (no minimum) */
    sj_graph *g;
    int64_t sv[64];
    sj_fplan *p = plan_as(&tu_pat_w2, S(9, 768), SJ_F32, false, &g, sv);
    const sj_codegen_opts o = {.prefix = "w_"};
    char *stat = sj_codegen_cuda(g, p, NULL, &o, NULL);
    assert_non_null(stat);
    assert_non_null(strstr(stat, "__launch_bounds__(512) w_k0("));
    free(stat);
    sj_fplan_free(p);
    sj_graph_destroy(g);
}

/* Launch bounds of symbolic row kernels over a known row length (rows
 * symbolic, the length a constant: a hidden size the weights fix). Last in
 * the run but one: its random inputs would shift every later test's. */
static void test_known_row_bounds(void **state) {
    sj_graph *g;
    int64_t sv[64];
    sj_fplan *p;
    /* a norm: one kernel; 768 takes 6 register chunks a lane, so it is
     * bounded by its block alone (under a 3-block minimum it spilled) */
    tu_pol pl = {.sym = true, .fixed = (const int64_t[]){768, 0}};
    sj_tensor in[16];
    tu_pat_w2.make(S(9, 768), SJ_F32, in);
    p = tu_pattern_plan(&tu_pat_w2, in, &pl, &g, sv);
    int nv[4] = {0};
    char *sym = sj_codegen_cuda(g, p, NULL, &(sj_codegen_opts){.prefix = "w_", .variants = nv}, NULL);
    assert_non_null(sym);
    assert_int_equal(nv[0], 1);
    assert_non_null(strstr(sym, "(s0)"));
    assert_non_null(strstr(sym, "constexpr int RC = 6;"));
    assert_non_null(strstr(sym, "__launch_bounds__(512) w_k0("));
    free(sym);
    sj_fplan_free(p);
    sj_graph_destroy(g);
    /* reductions over a known length cache nothing: they keep the minimum */
    tu_pol pr = {.sym = true, .fixed = (const int64_t[]){768, 0}};
    tu_pat_reduce.make(S(9, 768), SJ_F32, in);
    p = tu_pattern_plan(&tu_pat_reduce, in, &pr, &g, sv);
    sym = sj_codegen_cuda(g, p, NULL, &(sj_codegen_opts){.prefix = "r_"}, NULL);
    assert_non_null(sym);
    int rows = 0;
    for (const char *at = sym; (at = strstr(at, "__launch_bounds__(512, 3) r_")); at++) rows++;
    assert_true(rows >= 6); /* sum, mean, amax and the i32 ones */
    assert_null(strstr(sym, "__launch_bounds__(512) r_"));
    free(sym);
    sj_fplan_free(p);
    sj_graph_destroy(g);
}

/* Index math divides per row (32-bit when the row count fits, literal
 * divisors when specialized), never per element: the PTX of float
 * kernels has no 64-bit division or remainder. */
static void test_no_div64(void **state) {
    if (!cu.have_nvrtc) skip();
    const struct {
        const tu_pattern *pt;
        const int64_t *d;
        bool sym_too; /* rank <= 2 groups: no row division at all */
    } cases[] = {
        {&tu_pat_w1, S(9, 4096), true},  {&tu_pat_w2, S(9, 768), true},    {&tu_pat_w3, S(12, 9), false},
        {&tu_pat_rows, S(5, 40), true},  {&tu_pat_views, S(5, 40), false}, {&tu_pat_reduce, S(7, 33), true},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        sj_graph *g;
        int64_t sv[64];
        sj_fplan *p = plan_of(cases[i].pt, cases[i].d, SJ_F32, &g, sv);
        for (int form = 0; form < (cases[i].sym_too ? 2 : 1); form++) {
            char *src = sj_codegen_cuda(g, p, form ? NULL : sv, &(sj_codegen_opts){.prefix = "k_"}, NULL), *ptx = NULL;
            size_t n = 0;
            const char *what = tu_label("%s %s ptx", cases[i].pt->name, form ? "sym" : "spec");
            nvrtc_compile(src, "compute_90", what, &ptx, &n);
            ptx = realloc(ptx, n + 1);
            ptx[n] = 0;
            const char *bad[] = {"div.s64", "div.u64", "rem.s64", "rem.u64"};
            for (int b = 0; b < 4; b++)
                if (strstr(ptx, bad[b])) fail_msg("%s: %s in the PTX", what, bad[b]);
            free(ptx);
            free(src);
        }
        sj_fplan_free(p);
        sj_graph_destroy(g);
    }
}

/* -- Tests: patterns ----------------------------------------------------------------------- */

static void test_w1(void **state) {
    run_both(&tu_pat_w1, SJ_F32);
    run_both(&tu_pat_w1_big, SJ_F32);
}
static void test_w2(void **state) { run_both(&tu_pat_w2, SJ_F32); }
static void test_w3(void **state) {
    run_both(&tu_pat_w3, SJ_F32);
    run_both(&tu_pat_w3_masked, SJ_F32);
}
static void test_matmul_gelu(void **state) {
    tu_params[0] = tu_rnd(SJ_F32, 2, S(24, 40));
    tu_params[1] = tu_rnd(SJ_F32, 1, S(40));
    run_both(&tu_pat_mmgelu, SJ_F32);
    tu_params[0] = tu_rnd(SJ_F16, 2, S(24, 40));
    tu_params[1] = tu_rnd(SJ_F16, 1, S(40));
    run_both(&tu_pat_mmbias, SJ_F16); /* its products run on the host, as every NODE group here */
}
static void test_views(void **state) {
    run_both(&tu_pat_views, SJ_F32);
    run_both(&tu_pat_strided, SJ_F32);
    run_both(&tu_pat_reshape, SJ_F32);
}
static void test_reduce(void **state) {
    run_both(&tu_pat_reduce, SJ_F32);
    run_both(&tu_pat_reduce_long, SJ_F32);
}
static void test_rows(void **state) {
    run_both(&tu_pat_rows, SJ_F32);
    run_both(&tu_pat_rows_mid, SJ_F32);
    run_both(&tu_pat_rows_long, SJ_F32);
}
/* Layer norms of rows far from zero: the f32 mean's rounding, scaled by
 * rstd, would be a hundred times the tolerance without the kernels' mean
 * correction. Run last, so that no other test's random inputs move. */
static void test_ln_offset(void **state) {
    run_both(&tu_pat_ln_offset, SJ_F32);
    run_both(&tu_pat_ln_offset_long, SJ_F32);
}
static void test_casts_where(void **state) { run_both(&tu_pat_casts, SJ_F32); }
static void test_ints(void **state) { run_both(&tu_pat_ints, SJ_F32); }
static void test_shared_outputs(void **state) {
    run_both(&tu_pat_shared, SJ_F32);
    run_both(&tu_pat_outs, SJ_F32);
}
static void test_half(void **state) {
    run_both(&tu_pat_w1, SJ_F16);
    run_both(&tu_pat_w1, SJ_BF16);
    run_both(&tu_pat_w2, SJ_BF16);
    run_both(&tu_pat_w3, SJ_F16);
    run_both(&tu_pat_reduce, SJ_BF16);
    run_both(&tu_pat_rows, SJ_F16);
    run_both(&tu_pat_rows_mid, SJ_F16);
    run_both(&tu_pat_rows_long, SJ_BF16);
}

/* sizes 2 everywhere, and empty spaces (nothing launched, outputs still
 * right), rows of length 0 (sum 0, mean NaN) */
static void test_edges(void **state) {
    if (!cu.have_nvrtc) skip();
    run_pattern(&tu_pat_w1, true, SJ_F32, S(2, 2));
    run_pattern(&tu_pat_w2, true, SJ_F32, S(2, 2));
    run_pattern(&tu_pat_w3, true, SJ_F32, S(2, 2));
    run_pattern(&tu_pat_rows, true, SJ_F32, S(2, 2));
    run_pattern(&tu_pat_w1, false, SJ_F32, S(0, 7));
    run_pattern(&tu_pat_w2, true, SJ_F32, S(0, 7));
    run_pattern(&tu_pat_reduce, true, SJ_F32, S(0, 5));
    run_pattern(&tu_pat_sum0, false, SJ_F32, S(3, 0));
}

/* more rows than grid.y (65535) and a warp-per-row grid of thousands of
 * blocks: the kernels' row loops; the vector path (4 | H) and not */
static void test_many_rows(void **state) {
    if (!cu.have_nvrtc) skip();
    run_pattern(&tu_pat_w1, true, SJ_F32, S(70000, 4));
    run_pattern(&tu_pat_w1, false, SJ_F16, S(66000, 3));
    run_pattern(&tu_pat_w2, true, SJ_F32, S(70001, 5));
    run_pattern(&tu_pat_reduce, true, SJ_F32, S(65537, 2));
}

/* A symbolic row kernel is a kernel per row thread count, each with the
 * paths of the rows it is launched for: one symbolic unit, run at row
 * lengths through every variant and path (vector or scalar; registers,
 * shared memory or recomputed), matches the reference. */
static void test_row_variants(void **state) {
    if (!cu.have_nvrtc) skip();
    static const int64_t ns[] = {5,    256,  511,  512,  516,  1000, 1023, 1024, 1025,
                                 1028, 2048, 2052, 4096, 4100, 6001, 8192, 8196, 9063};
    const tu_pattern *pt = &tu_pat_rows;
    sj_tensor tin[16], rin[16];
    pt->make(S(3, 64), SJ_F32, tin);
    tu_pol pl = {.sym = true, .fixed = pt->fixed};
    sj_graph *g;
    int64_t sv[64] = {0};
    sj_fplan *p = tu_pattern_plan(pt, tin, &pl, &g, sv);
    build(g, p, NULL, 1, "rows f32 sym (variants)");
    int seen[SJ_CG_VARIANTS_MAX] = {0};
    for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) {
        pt->make(S(3, ns[i]), SJ_F32, rin);
        assert_true(tu_same_signature(&pl, tin, rin, pt->n_in));
        for (int k = 0; k < pl.n; k++) sv[k] = rin[pl.in[k]].shape[pl.ax[k]];
        for (int gi = 0; gi < p->n_groups; gi++) {
            if (p->groups[gi].kind != SJ_G_ROW) continue;
            assert_int_equal(units[1].variants[gi], 4); /* every row group: its row length unknown */
            int64_t exv[4096];
            assert_true(sj_ex_count(g->ex) <= 4096);
            sj_ex_eval_all(g->ex, sv, exv);
            sj_launch L;
            if (sj_cuda_launch(&p->groups[gi], exv, 132, &L)) seen[L.variant]++;
        }
        char what[96];
        snprintf(what, sizeof what, "rows f32 sym (variants: n = %lld)", (long long)ns[i]);
        if (cu.have_gpu) run(g, p, 1, rin, sv, pt->ref, what);
    }
    assert_true(seen[0] > 0 && seen[1] > 0 && seen[2] > 0 && seen[3] > 0);
    unload(1);
    sj_fplan_free(p);
    sj_graph_destroy(g);
}

/* -- Tests: target architecture and split units ------------------------------------ */

/* The architecture a device gets: its own where NVRTC lists it (a
 * CUBIN), else PTX of the newest one below it. */
static void test_cuda_target(void **state) {
    (void)state;
    char a[32];
    const int nvrtc124[] = {50, 52, 53, 60, 61, 62, 70, 72, 75, 80, 86, 87, 89, 90};
    assert_true(sj_nvrtc_target(9, 0, nvrtc124, 14, a, sizeof a));
    assert_string_equal(a, "sm_90a"); /* Hopper's own: warpgroup products */
    assert_true(sj_nvrtc_target(8, 6, nvrtc124, 14, a, sizeof a));
    assert_string_equal(a, "sm_86");
    assert_false(sj_nvrtc_target(10, 0, nvrtc124, 14, a, sizeof a)); /* Blackwell, older NVRTC */
    assert_string_equal(a, "compute_90");
    assert_false(sj_nvrtc_target(8, 8, nvrtc124, 14, a, sizeof a)); /* between two listed */
    assert_string_equal(a, "compute_87");
    assert_true(sj_nvrtc_target(12, 0, NULL, 0, a, sizeof a)); /* no list: the device's */
    assert_string_equal(a, "sm_120");
    assert_true(sj_nvrtc_target(3, 5, nvrtc124, 14, a, sizeof a)); /* older than all: NVRTC says why */
    assert_string_equal(a, "sm_35");
    if (!cu.have_nvrtc) return;
    int n = 0, archs[128];
    assert_int_equal(cu.nv.GetNumSupportedArchs(&n), 0);
    assert_true(n > 0 && n <= 128);
    assert_int_equal(cu.nv.GetSupportedArchs(archs), 0);
    assert_true(sj_nvrtc_target(9, 0, archs, n, a, sizeof a)); /* this NVRTC knows Hopper */
    assert_string_equal(a, "sm_90a");
}

/* The machine code of each kernel in a CUBIN: its .text.<name> section
 * (ELF64, little-endian), or NULL. */
static const unsigned char *elf_text(const char *elf, size_t len, const char *kernel, size_t *n) {
    uint64_t shoff;
    uint16_t shentsize, shnum, shstrndx;
    assert_true(len > 64 && !memcmp(elf, "\x7f" "ELF", 4));
    memcpy(&shoff, elf + 0x28, 8);
    memcpy(&shentsize, elf + 0x3a, 2);
    memcpy(&shnum, elf + 0x3c, 2);
    memcpy(&shstrndx, elf + 0x3e, 2);
    uint64_t stroff;
    memcpy(&stroff, elf + shoff + (uint64_t)shstrndx * shentsize + 0x18, 8);
    char want[160];
    snprintf(want, sizeof want, ".text.%s", kernel);
    for (unsigned i = 0; i < shnum; i++) {
        const char *sh = elf + shoff + (uint64_t)i * shentsize;
        uint32_t name;
        uint64_t off, size;
        memcpy(&name, sh, 4);
        memcpy(&off, sh + 0x18, 8);
        memcpy(&size, sh + 0x20, 8);
        if (!strcmp(elf + stroff + name, want)) {
            *n = size;
            return (const unsigned char *)elf + off;
        }
    }
    return NULL;
}

/* The kernels' names of a unit (after each mark: `... void <launch
 * bounds> NAME(`), at most cap; their count. */
static int kernel_names(const char *src, char names[][64], int cap) {
    int n = 0;
    for (const char *p = strstr(src, SJ_CUDA_KERNEL_MARK); p; p = strstr(p + 1, SJ_CUDA_KERNEL_MARK)) {
        const char *paren = strchr(strchr(p, ')') + 1, '(');
        const char *b = paren;
        while (b[-1] != ' ') b--;
        assert_true(n < cap && paren - b < 64);
        snprintf(names[n++], 64, "%.*s", (int)(paren - b), b);
    }
    return n;
}

/* The f16 encoder layer of w4/w5 (bench/bench_util.h), static and with
 * the sequence symbolic: each unit split into 1, 2, 3 and 16 pieces holds
 * every kernel once, after the whole prelude; with NVRTC, the unit and its
 * 3 pieces compile for sm_90, and every kernel's machine code is the same
 * bytes either way (the split changes no kernel: the CUDA backend compiles
 * pieces at once and leaves the split out of the cache key). */
static sj_expr encoder_seq_policy(void *ctx, sj_exprs *ex, int input, int axis, int64_t size) {
    int *sym = ctx;
    if (!sym || input != 0 || axis != 1 || size < 2) return sj_ex_const(ex, size);
    if (*sym < 0) *sym = sj_sym_new(ex, size, 2, SJ_EX_INF);
    return sj_ex_sym(ex, *sym);
}

/* The f16 encoder layer's weights (tracked tensors, contents unread) and
 * its input x [1, 96, H]. */
static void encoder_f16(bench_encoder *w, sj_tensor *x) {
    const int64_t H = BENCH_H, FF = BENCH_FF;
    *w = (bench_encoder){
        tu_tensor(SJ_F16, 2, S(H, 3 * H)), tu_tensor(SJ_F16, 1, S(3 * H)), tu_tensor(SJ_F16, 2, S(H, H)),
        tu_tensor(SJ_F16, 1, S(H)),        tu_tensor(SJ_F16, 1, S(H)),     tu_tensor(SJ_F16, 1, S(H)),
        tu_tensor(SJ_F16, 2, S(H, FF)),    tu_tensor(SJ_F16, 1, S(FF)),    tu_tensor(SJ_F16, 2, S(FF, H)),
        tu_tensor(SJ_F16, 1, S(H)),        tu_tensor(SJ_F16, 1, S(H)),     tu_tensor(SJ_F16, 1, S(H)),
    };
    *x = tu_tensor(SJ_F16, 3, S(1, 96, H));
}

/* The encoder (w) traced at x, static (form 0) or with the sequence
 * symbolic (form 1), into *res (its facts freed; the caller destroys the
 * graph). */
static void trace_encoder(bench_encoder *w, sj_tensor *x, int form, sj_trace_result *res) {
    int sym = -1;
    sj_trace_req req = {.fn_name = "encoder", .model = bench_w4_model, .user = w, .inputs = x, .n_inputs = 1,
                        .dim_policy = encoder_seq_policy, .dim_ctx = form ? &sym : NULL};
    assert_int_equal(sj_trace(&req, res), SJ_OK);
    free(res->facts);
}

static void test_split_encoder(void **state) {
    (void)state;
    bench_encoder w;
    sj_tensor x;
    encoder_f16(&w, &x);
    for (int form = 0; form < 2; form++) {
        sj_trace_result res;
        trace_encoder(&w, &x, form, &res);
        sj_fplan *p = sj_fuse(res.graph, &x);
        assert_non_null(p);
        char *src = sj_codegen_cuda(res.graph, p, NULL, &(sj_codegen_opts){.prefix = "sj_"}, NULL);
        assert_non_null(src);
        const char *mark = strstr(src, SJ_CUDA_KERNEL_MARK);
        assert_non_null(mark);
        size_t head = (size_t)(mark - src);
        char names[64][64];
        int k = kernel_names(src, names, 64);
        assert_true(k >= 3);
        const int maxes[] = {1, 2, 3, 16};
        for (size_t m = 0; m < sizeof maxes / sizeof maxes[0]; m++) {
            char *pieces[SJ_CUDA_PIECES_MAX];
            int n = sj_codegen_cuda_split(src, maxes[m], pieces);
            assert_int_equal(n, maxes[m] < k ? maxes[m] : k);
            int seen[64] = {0};
            for (int i = 0; i < n; i++) {
                assert_memory_equal(pieces[i], src, head);
                char pn[64][64];
                int pk = kernel_names(pieces[i], pn, 64);
                assert_true(pk >= 1 || n == 1);
                for (int j = 0; j < pk; j++)
                    for (int q = 0; q < k; q++) seen[q] += !strcmp(pn[j], names[q]);
            }
            for (int q = 0; q < k; q++) assert_int_equal(seen[q], 1);
            if (n == 1) assert_string_equal(pieces[0], src);
            if (cu.have_nvrtc && maxes[m] == 3) {
                char *whole;
                size_t wl;
                nvrtc_compile(src, "sm_90", form ? "encoder f16 sym" : "encoder f16 static", &whole, &wl);
                for (int i = 0; i < n; i++) {
                    char *part, what[64];
                    size_t pl;
                    snprintf(what, sizeof what, "encoder f16 %s (piece %d of %d)", form ? "sym" : "static", i + 1, n);
                    nvrtc_compile(pieces[i], "sm_90", what, &part, &pl);
                    char pn[64][64];
                    int pk = kernel_names(pieces[i], pn, 64);
                    for (int j = 0; j < pk; j++) {
                        size_t a_n, b_n;
                        const unsigned char *a = elf_text(whole, wl, pn[j], &a_n), *b = elf_text(part, pl, pn[j], &b_n);
                        assert_non_null(a);
                        assert_non_null(b);
                        assert_int_equal(a_n, b_n);
                        assert_memory_equal(a, b, a_n);
                    }
                    free(part);
                }
                free(whole);
            }
            for (int i = 0; i < n; i++) free(pieces[i]);
        }
        char *one[1];
        assert_int_equal(sj_codegen_cuda_split("no kernels", 4, one), 1);
        assert_string_equal(one[0], "no kernels");
        free(one[0]);
        assert_int_equal(sj_codegen_cuda_split(src, 0, one), 0);
        free(src);
        sj_fplan_free(p);
        sj_graph_destroy(res.graph);
    }
}

/* The text of kernel `name` (from its signature to the next kernel), or
 * NULL; malloc'd. */
static char *kernel_text(const char *src, const char *name) {
    char sig[80];
    snprintf(sig, sizeof sig, ") %s(", name);
    const char *at = strstr(src, sig);
    if (!at) return NULL;
    const char *end = strstr(at, SJ_CUDA_KERNEL_MARK);
    return strndup(at, end ? (size_t)(end - at) : strlen(at));
}

/* sj_codegen_opts.fallback_kernels: the f16 encoder's layer norms (rows of
 * 768, one kernel each, with a vector path) become a vector kernel and an
 * element-by-element one, <name>_fb; the vector kernel holds no
 * element-by-element pass (merged back, this fails), the fallback no
 * vector access, and no program of the split unit holds both; they compile
 * without a warning. sj_cuda_vec_ok, the launch's choice between them, is
 * the kernel's flag: aligned bases take the vector kernel, a base one
 * element off, a row length not a multiple of 4 or a row stride not a
 * multiple of 4 the fallback. (On a device, every pattern's specialized
 * form runs split, shifted inputs through the fallback: build, gpu_run.) */
static void test_fallback_split(void **state) {
    (void)state;
    bench_encoder w;
    sj_tensor x;
    encoder_f16(&w, &x);
    for (int form = 0; form < 2; form++) {
        sj_trace_result res;
        trace_encoder(&w, &x, form, &res);
        sj_graph *g = res.graph;
        sj_fplan *p = sj_fuse(g, &x);
        assert_non_null(p);
        int nv[64] = {0}, fb[64] = {0}, fb_off[64] = {0};
        assert_true(p->n_groups <= 64);
        char *src = sj_codegen_cuda(g, p, NULL,
                                    &(sj_codegen_opts){.prefix = "sj_", .variants = nv, .fallbacks = fb,
                                                       .fallback_kernels = true},
                                    NULL);
        char *one = sj_codegen_cuda(g, p, NULL, &(sj_codegen_opts){.prefix = "sj_", .fallbacks = fb_off}, NULL);
        assert_non_null(src);
        assert_non_null(one);
        int n_fb = 0;
        for (int gi = 0; gi < p->n_groups; gi++) {
            const sj_group *G = &p->groups[gi];
            assert_int_equal(fb_off[gi], 0); /* off by default */
            assert_true(!fb[gi] || (G->kind == SJ_G_ROW && nv[gi] == 1));
            if (!fb[gi]) continue;
            n_fb++;
            char name[64];
            snprintf(name, sizeof name, "sj_%s", G->name);
            char *vk = kernel_text(src, name), *whole = kernel_text(one, name);
            snprintf(name, sizeof name, "sj_%s_fb", G->name);
            char *fk = kernel_text(src, name);
            assert_non_null(vk);
            assert_non_null(fk);
            assert_non_null(whole);
            assert_null(kernel_text(one, name));
            /* the one kernel has both paths; the pair one each */
            assert_non_null(strstr(whole, "sj_ld4(p0 + o0 + j0, x0);"));
            assert_non_null(strstr(whole, "p0[o0 + j]"));
            assert_non_null(strstr(vk, "sj_ld4(p0 + o0 + j0, x0);"));
            assert_non_null(strstr(vk, "if (vec) {"));
            assert_null(strstr(vk, "p0[o0 + j]"));
            assert_null(strstr(vk, "} else {"));
            assert_non_null(strstr(fk, "p0[o0 + j]"));
            assert_non_null(strstr(fk, "#pragma unroll 1\nfor (int64_t j = tid; j < n"));
            assert_null(strstr(fk, "sj_ld4("));
            assert_null(strstr(fk, "vec"));
            /* a warp's rows: both bounded by their block, 32 x 8 threads */
            char lb[96];
            snprintf(lb, sizeof lb, "__launch_bounds__(256) sj_%s(", G->name);
            assert_non_null(strstr(src, lb));
            snprintf(lb, sizeof lb, "__launch_bounds__(256) sj_%s_fb(", G->name);
            assert_non_null(strstr(src, lb));
            /* the vector kernel is the one kernel less its fallback */
            assert_true(strlen(vk) < strlen(whole));
            assert_memory_equal(vk, whole, (size_t)(strstr(vk, "if (vec) {") - vk));
            /* no program of the split holds both */
            char *pieces[SJ_CUDA_PIECES_MAX];
            int n = sj_codegen_cuda_split(src, SJ_CUDA_PIECES_MAX, pieces);
            assert_true(n >= 2);
            char vsig[80], fsig[80];
            snprintf(vsig, sizeof vsig, ") sj_%s(", G->name);
            snprintf(fsig, sizeof fsig, ") sj_%s_fb(", G->name);
            int with_v = 0, with_f = 0;
            for (int i = 0; i < n; i++) {
                bool hv = strstr(pieces[i], vsig) != NULL, hf = strstr(pieces[i], fsig) != NULL;
                assert_false(hv && hf);
                with_v += hv, with_f += hf;
                free(pieces[i]);
            }
            assert_int_equal(with_v, 1);
            assert_int_equal(with_f, 1);

            /* the launch's choice */
            int n_ex = sj_ex_count(g->ex);
            int64_t *exv = calloc((size_t)n_ex, sizeof *exv), sv[8] = {128, 128, 128, 128, 128, 128, 128, 128};
            assert_non_null(exv);
            sj_ex_eval_all(g->ex, sv, exv);
            void *ptrs[64];
            assert_true(G->n_loads + G->n_stores <= 64);
            for (int k = 0; k < G->n_loads + G->n_stores; k++) ptrs[k] = (void *)(uintptr_t)(0x10000 * (k + 1));
            assert_true(sj_cuda_vec_ok(g, G, exv, ptrs));
            for (int k = 0; k < G->n_loads + G->n_stores; k++) {
                const sj_access *a = k < G->n_loads ? &G->loads[k] : &G->stores[k - G->n_loads];
                if (exv[a->stride[G->rank - 1]] == 0) continue; /* broadcast: any address */
                void *was = ptrs[k];
                ptrs[k] = (char *)was + 2; /* one f16 element */
                assert_false(sj_cuda_vec_ok(g, G, exv, ptrs));
                ptrs[k] = (char *)was + 8; /* four */
                assert_true(sj_cuda_vec_ok(g, G, exv, ptrs));
                ptrs[k] = was;
                if (G->rank > 1) { /* a row stride not a multiple of 4 */
                    int64_t st = exv[a->stride[0]];
                    exv[a->stride[0]] = st + 2;
                    assert_false(sj_cuda_vec_ok(g, G, exv, ptrs));
                    exv[a->stride[0]] = st;
                }
            }
            int64_t len = exv[G->shape[G->rank - 1]];
            exv[G->shape[G->rank - 1]] = len - 2;
            assert_false(sj_cuda_vec_ok(g, G, exv, ptrs));
            exv[G->shape[G->rank - 1]] = len;
            free(exv);
            free(vk);
            free(fk);
            free(whole);
        }
        assert_int_equal(n_fb, 2); /* the two layer norms */
        if (cu.have_nvrtc) {
            char *pieces[SJ_CUDA_PIECES_MAX];
            int n = sj_codegen_cuda_split(src, SJ_CUDA_PIECES_MAX, pieces);
            for (int i = 0; i < n; i++) {
                char what[64];
                snprintf(what, sizeof what, "encoder f16 %s split pair (piece %d of %d)", form ? "sym" : "static",
                         i + 1, n);
                nvrtc_compile(pieces[i], "sm_90", what, NULL, NULL);
                free(pieces[i]);
            }
        }
        free(src);
        free(one);
        sj_fplan_free(p);
        sj_graph_destroy(g);
    }
}

/* The encoder layer with its products generated (sj_fuse_opts.gemm: the
 * CUDA device with cuda_gemm on), static and symbolic: the four products
 * marked (query-key-value, output, and the feed-forward pair, the first
 * with its GELU inside), one function each; with NVRTC the unit and its
 * 3 pieces compile for sm_90 without a warning (the products' macros and
 * helpers stay in their namespaces). */
static void test_gemm_encoder(void **state) {
    (void)state;
    bench_encoder w;
    sj_tensor x;
    encoder_f16(&w, &x);
    for (int form = 0; form < 2; form++) {
        sj_trace_result res;
        trace_encoder(&w, &x, form, &res);
        sj_fplan *p = sj_fuse_ex(res.graph, &x, &(sj_fuse_opts){.gemm = true});
        assert_non_null(p);
        assert_int_equal(p->n_gemm, 4);
        int variants[64] = {0}, gelu_inside = 0;
        assert_true(p->n_groups <= 64);
        char *src = sj_codegen_cuda(res.graph, p, NULL, &(sj_codegen_opts){.prefix = "sj_", .variants = variants}, NULL);
        assert_non_null(src);
        for (int gi = 0; gi < p->n_groups; gi++) {
            const sj_group *G = &p->groups[gi];
            if (G->gemm_tile >= 0) assert_int_equal(variants[gi], G->gemm_nv);
            gelu_inside += (G->gemm_epi & ~(uint32_t)SJ_GEMM_ROUNDS) == (SJ_GEMM_EPI | SJ_GEMM_GELU);
        }
        assert_int_equal(gelu_inside, 1);
        /* static: M (96 rows) a constant of the kernels; symbolic: their argument */
        assert_non_null(strstr(src, form ? " * M symbolic, N" : " * M specialized, N"));
        assert_null(strstr(src, form ? " * M specialized, N" : " * M symbolic, N"));
        assert_non_null(strstr(src, form ? "const long long M = M_arg;" : "const long long M = 96LL;"));
        if (cu.have_nvrtc) {
            nvrtc_compile(src, "sm_90", form ? "encoder gemm sym" : "encoder gemm static", NULL, NULL);
            char *pieces[SJ_CUDA_PIECES_MAX];
            int n = sj_codegen_cuda_split(src, 3, pieces);
            assert_int_equal(n, 3);
            for (int i = 0; i < n; i++) {
                char what[64];
                snprintf(what, sizeof what, "encoder gemm %s (piece %d of %d)", form ? "sym" : "static", i + 1, n);
                nvrtc_compile(pieces[i], "sm_90", what, NULL, NULL);
                free(pieces[i]);
            }
        }
        free(src);
        sj_fplan_free(p);
        sj_graph_destroy(res.graph);
    }
}

static void test_summary(void **state) {
    if (!cu.have_nvrtc) {
        printf("skipped: no NVRTC (libnvrtc.so.13)\n");
        return;
    }
    int maj = 0, min = 0;
    cu.nv.Version(&maj, &min);
    printf("NVRTC %d.%d: %d units for %s, %.2f s in all, %.3f s on average, %.3f s at most (%s), %zu KB of source\n",
           maj, min, stats.units, cu.arch, stats.total_s,
           stats.units ? stats.total_s / stats.units : 0.0, stats.max_s, stats.slowest, stats.bytes / 1024);
    if (!cu.have_gpu) printf("skipped: no CUDA device (%s)\n", cu.no_gpu_why);
#ifdef SJ_WITH_CUDA
    else {
        printf("ran on the device: %s, sm_%d%d, %d SMs; split row kernels: %d vector, %d fallback launches\n",
               cu.dev->name, cu.dev->cc_major, cu.dev->cc_minor, cu.dev->sm_count, stats.vector_runs,
               stats.fallback_runs);
        /* both kernels of split pairs ran: aligned calls and shifted ones */
        assert_true(stats.vector_runs > 0);
        assert_true(stats.fallback_runs > 0);
    }
#endif
}

int main(void) {
#define T(f) cmocka_unit_test_teardown(f, tu_teardown)
    const struct CMUnitTest tests[] = {
        T(test_nvrtc_options), T(test_launch_rule), T(test_codegen_text), T(test_no_div64), T(test_w1),   T(test_w2),
        T(test_w3),          T(test_matmul_gelu),  T(test_views),    T(test_reduce), T(test_rows),
        T(test_casts_where), T(test_ints),         T(test_shared_outputs), T(test_half), T(test_edges),
        T(test_many_rows),   T(test_row_variants), T(test_known_row_bounds), T(test_ln_offset), T(test_cuda_target),
        T(test_split_encoder), T(test_fallback_split), T(test_gemm_encoder), T(test_summary),
    };
    return cmocka_run_group_tests(tests, setup_all, teardown_all);
}
