/* NVRTC compile time of the units the CUDA backend compiles, measured
 * without a GPU (NVRTC needs none), printing JSON lines:
 *
 *   bench_nvrtc [--reps N] [--arch sm_90] [--flags "..."] [--unit NAME]
 *               [--sweep] [--split] [--threads N] [--fb] [--drop OPT]
 *               [--dump DIR]
 *
 * The units come from the real pipeline: a model function is traced
 * (jit/trace.h), fused (sj_fuse) and generated (sj_codegen_cuda), as the
 * compile worker does. Models:
 *   w4   the f16 BERT-base encoder layer of w4/w5 (bench/bench_util.h),
 *        traced at B=1, S=128: "w4.static" (every size a literal),
 *        "w4.sym" (S symbolic: the unit one entry serves every length
 *        with) and "w4.spec" (the symbolic trace specialized at S=128,
 *        what a hot shape gets);
 *   bert the encoder layer of samples/bert at all-MiniLM-L6-v2's sizes
 *        (hidden 384, 12 heads, FFN 1536), f32, scores masked by an added
 *        [B, 1, 1, S] input before the softmax: "bert.sym", "bert.spec"
 *        (S=64).
 * Each unit is compiled with the backend's NVRTC options
 * (sj_nvrtc_options for --arch, then --flags) --reps times in one
 * program (no split); a line per unit gives the source's bytes and
 * kernels, the first compile's wall ms ("process_first" on the process's
 * first: NVRTC's own start-up is paid there), the median and least wall
 * ms, the median CPU ms of the compiling thread (NVRTC runs on it: the
 * figure to compare on a loaded machine), the output's bytes (CUBIN for
 * sm_*, PTX for compute_*), and, from one more compile with -Xptxas -v,
 * the kernels' registers (sum, most) and spilled bytes: a lever that
 * changes them changed the code.
 *
 * --split compiles each unit as the CUDA backend does with
 * nvrtc_threads = --threads: split into that many programs at most
 * (sj_codegen_cuda_split), compiled at once, one thread each; the line
 * gives the wall ms of the whole and each piece's CPU ms. --sweep gives,
 * per unit, the default line, then each lever (the -lineinfo of before,
 * no --extra-device-vectorization, ptxas -O2, ptxas without expensive
 * optimizations, -Ofc=min, PTX only: what ptxas costs is the
 * difference), the prelude alone ("head_only": what every program pays),
 * and the split. --fb adds, after each unit, the same unit generated with
 * sj_codegen_opts.fallback_kernels ("<name>+fb": a row kernel's unaligned
 * path a kernel of its own); --unit NAME takes every unit whose name starts
 * with NAME; --drop OPT leaves one of the backend's own options out of
 * every compile (--drop -minimal: the options before issue 28's). Without
 * NVRTC it prints one line saying so and exits 0.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "bench/bench_util.h"
#include "jit/shapejit.h"
#include "jit/ir/graph.h"
#include "jit/trace.h"
#include "kernels/cuda/nvrtc.h"
#include "shapes/expr.h"
#include "specialize/codegen.h"
#include "specialize/codegen_cuda.h"
#include "specialize/fusion.h"

/* -- NVRTC (types restated: the bench builds without the toolkit) ----------- */

typedef struct nvrtc_prog *nvrtc_prog;
static struct {
    void *h;
    int major, minor;
    int (*Version)(int *, int *);
    int (*CreateProgram)(nvrtc_prog *, const char *, const char *, int, const char *const *, const char *const *);
    int (*CompileProgram)(nvrtc_prog, int, const char *const *);
    int (*GetCUBINSize)(nvrtc_prog, size_t *);
    int (*GetPTXSize)(nvrtc_prog, size_t *);
    int (*GetProgramLogSize)(nvrtc_prog, size_t *);
    int (*GetProgramLog)(nvrtc_prog, char *);
    int (*DestroyProgram)(nvrtc_prog *);
} nv;

static bool load_nvrtc(void) {
    const char *dirs[] = {getenv("SHAPEJIT_CUDA_LIBS"), getenv("CUDA_HOME"), "/usr/local/cuda"};
    const char *names[] = {"libnvrtc.so.13", "libnvrtc.so.12"};
    char path[512];
    for (int n = 0; n < 2 && !nv.h; n++)
        for (int i = 0; i < 4 && !nv.h; i++) {
            if (i < 3 && !dirs[i]) continue;
            if (i == 3) snprintf(path, sizeof path, "%s", names[n]);
            else snprintf(path, sizeof path, "%s%s/%s", dirs[i], i == 0 ? "" : "/lib64", names[n]);
            nv.h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        }
    if (!nv.h) return false;
#define SYM(f, s) \
    if (!(*(void **)&nv.f = dlsym(nv.h, s))) return false;
    SYM(Version, "nvrtcVersion")
    SYM(CreateProgram, "nvrtcCreateProgram")
    SYM(CompileProgram, "nvrtcCompileProgram")
    SYM(GetCUBINSize, "nvrtcGetCUBINSize")
    SYM(GetPTXSize, "nvrtcGetPTXSize")
    SYM(GetProgramLogSize, "nvrtcGetProgramLogSize")
    SYM(GetProgramLog, "nvrtcGetProgramLog")
    SYM(DestroyProgram, "nvrtcDestroyProgram")
#undef SYM
    return nv.Version(&nv.major, &nv.minor) == 0;
}

/* One compile of src; its wall ms, the output's bytes (0: failed, the log
 * printed), when log is not NULL the program's log (malloc'd), and when
 * cpu_ms is not NULL the calling thread's CPU ms (NVRTC compiles on it:
 * the work, whatever else loads the machine). */
static double thread_cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static double compile_once(const char *src, int argc, const char *const *argv, bool ptx, size_t *out_bytes,
                           char **log, double *cpu_ms) {
    nvrtc_prog prog;
    *out_bytes = 0;
    if (nv.CreateProgram(&prog, src, "unit.cu", 0, NULL, NULL)) return 0;
    double t0 = bench_now_s(), c0 = thread_cpu_s();
    int r = nv.CompileProgram(prog, argc, argv);
    double ms = (bench_now_s() - t0) * 1e3;
    if (cpu_ms) *cpu_ms = (thread_cpu_s() - c0) * 1e3;
    size_t ln = 0;
    nv.GetProgramLogSize(prog, &ln);
    char *text = calloc(1, ln + 1);
    if (text && ln) nv.GetProgramLog(prog, text);
    if (r) fprintf(stderr, "bench_nvrtc: NVRTC failed:\n%s\n", text ? text : "");
    else (ptx ? nv.GetPTXSize : nv.GetCUBINSize)(prog, out_bytes);
    if (log) *log = text;
    else free(text);
    nv.DestroyProgram(&prog);
    return ms;
}

/* -- Options ---------------------------------------------------------------- */

typedef struct config {
    const char *name;
    const char *drop[4]; /* backend options left out */
    const char *add;     /* words added (space-separated) */
    bool ptx;            /* a virtual arch: PTX, no ptxas */
} config;

static char arch[32] = "sm_90";
static const char *user_flags;
static const char *dropped_opt; /* --drop: a backend option left out of every config */

/* The argument list of cf: the backend's options less cf->drop, then
 * user_flags and cf->add. */
static int make_args(const config *cf, const char *extra, sj_nvrtc_opts *o, const char **argv) {
    char a[40], flags[1024];
    snprintf(a, sizeof a, "%s", arch);
    if (cf->ptx && !strncmp(a, "sm_", 3)) snprintf(a, sizeof a, "compute_%s", arch + 3);
    snprintf(flags, sizeof flags, "%s %s %s", user_flags ? user_flags : "", cf->add ? cf->add : "",
             extra ? extra : "");
    if (sj_nvrtc_options(a, nv.major * 100 + nv.minor, flags, o)) bench_die("options");
    int n = 0;
    for (int i = 0; i < o->argc; i++) {
        bool dropped = false;
        for (int d = 0; d < 4 && cf->drop[d]; d++) dropped |= !strcmp(o->argv[i], cf->drop[d]);
        if (dropped_opt) dropped |= !strcmp(o->argv[i], dropped_opt);
        if (!dropped) argv[n++] = o->argv[i];
    }
    return n;
}

/* -- Units ------------------------------------------------------------------ */

typedef struct unit {
    char name[32];
    char *src;
    int kernels;
} unit;

#define MAX_UNITS 16
static unit units[MAX_UNITS];
static int n_units;

static int count_kernels(const char *src) {
    int n = 0;
    for (const char *p = src; (p = strstr(p, SJ_CUDA_KERNEL_MARK)); p++) n++;
    return n;
}

static void add_unit(const char *name, char *src) {
    if (!src) bench_die("sj_codegen_cuda: out of memory");
    unit *u = &units[n_units++];
    snprintf(u->name, sizeof u->name, "%s", name);
    u->src = src;
    u->kernels = count_kernels(src);
}

/* --fb: every unit also generated with sj_codegen_opts.fallback_kernels,
 * as "<name>+fb" (right after it) */
static bool fallback_units;

/* Dimension policy: input 0's axis 1 (the sequence) symbolic, the rest
 * literal (ctx: non-NULL for the symbolic trace). */
static sj_expr seq_policy(void *ctx, sj_exprs *ex, int input, int axis, int64_t size) {
    if (!ctx || input != 0 || axis != 1 || size < 2) return sj_ex_const(ex, size);
    int *sym = ctx;
    if (*sym < 0) *sym = sj_sym_new(ex, size, 2, SJ_EX_INF);
    return sj_ex_sym(ex, *sym);
}

/* Trace model on ins, fuse, and add its units: "<tag>.static", or with a
 * symbolic sequence "<tag>.sym" and "<tag>.spec" (at the traced size). */
static void trace_units(const char *tag, sj_model_fn model, void *user, const sj_tensor *ins, int n_in,
                        bool symbolic) {
    int sym = -1;
    sj_trace_req req = {.fn_name = tag, .model = model, .user = user, .inputs = ins, .n_inputs = n_in,
                        .dim_policy = seq_policy, .dim_ctx = symbolic ? &sym : NULL};
    sj_trace_result res;
    if (sj_trace(&req, &res)) bench_die(tag);
    free(res.facts);
    sj_graph *g = res.graph;
    sj_fplan *p = sj_fuse(g, ins);
    if (!p) bench_die("sj_fuse");
    int64_t sv[64] = {0};
    int ns = sj_sym_count(g->ex);
    for (int s = 0; s < ns && s < 64; s++) sv[s] = ins[0].shape[1];
    char name[32];
    for (int f = 0; f < (fallback_units ? 2 : 1); f++) {
        sj_codegen_opts o = {.prefix = "sj_", .fallback_kernels = f == 1};
        const char *fs = f ? "+fb" : "";
        if (!symbolic) {
            snprintf(name, sizeof name, "%s.static%s", tag, fs);
            add_unit(name, sj_codegen_cuda(g, p, sv, &o, NULL));
        } else {
            snprintf(name, sizeof name, "%s.sym%s", tag, fs);
            add_unit(name, sj_codegen_cuda(g, p, NULL, &o, NULL));
            snprintf(name, sizeof name, "%s.spec%s", tag, fs);
            add_unit(name, sj_codegen_cuda(g, p, sv, &o, NULL));
        }
    }
    sj_fplan_free(p);
    sj_graph_destroy(g);
}

/* A host tensor of zeros (the trace reads descriptors only). */
static sj_tensor zeros(sj_dtype dt, int rank, const int64_t *shape) {
    sj_tensor t = {.dtype = dt, .rank = rank, .device = SJ_HOST};
    int64_t n = 1;
    for (int i = 0; i < rank; i++) t.shape[i] = shape[i], n *= shape[i];
    for (int i = rank - 1, s = 1; i >= 0; s *= (int)shape[i], i--) t.stride[i] = s;
    t.data = calloc((size_t)n, sj_dtype_size(dt));
    if (!t.data) bench_die("out of memory");
    return t;
}

static void encoder_weights(bench_encoder *w, sj_dtype dt, int64_t H, int64_t FF) {
    w->wqkv = zeros(dt, 2, (int64_t[]){H, 3 * H});
    w->bqkv = zeros(dt, 1, (int64_t[]){3 * H});
    w->wo = zeros(dt, 2, (int64_t[]){H, H});
    w->bo = zeros(dt, 1, &H);
    w->g1 = zeros(dt, 1, &H);
    w->b1 = zeros(dt, 1, &H);
    w->w1 = zeros(dt, 2, (int64_t[]){H, FF});
    w->bf1 = zeros(dt, 1, &FF);
    w->w2 = zeros(dt, 2, (int64_t[]){FF, H});
    w->bf2 = zeros(dt, 1, &H);
    w->g2 = zeros(dt, 1, &H);
    w->b2 = zeros(dt, 1, &H);
}

/* bert: samples/bert's encoder layer (post-LN, gelu, key mask added to the
 * scores before the softmax) at all-MiniLM-L6-v2's sizes, f32. Inputs: x
 * [B, S, 384], mask [B, 1, 1, S] (0 or -inf). */
enum { BERT_H = 384, BERT_NH = 12, BERT_HD = 32, BERT_FF = 1536 };
static sj_status bert_layer_model(sj_tracer *t, const sj_val *in, int n, void *u) {
    (void)n;
    const bench_encoder *w = u;
    sj_val x = in[0];
    sj_dim b = sj_dim_of(t, x, 0), s = sj_dim_of(t, x, 1);
    sj_val qkv = bench_linear(t, x, &w->wqkv, &w->bqkv);
    sj_val h[3];
    for (int i = 0; i < 3; i++) {
        sj_dim d4[4] = {b, s, sj_dim_const(t, BERT_NH), sj_dim_const(t, BERT_HD)};
        sj_val part = sj_slice(t, qkv, 2, i * BERT_H, (i + 1) * BERT_H, 1);
        h[i] = sj_permute(t, sj_reshape(t, part, 4, d4), (int[]){0, 2, 1, 3});
    }
    sj_val sc = sj_matmul(t, h[0], sj_permute(t, h[1], (int[]){0, 1, 3, 2}));
    sc = sj_add(t, sj_mul(t, sc, sj_scalar(t, 1.0 / 5.656854249492381)), in[1]);
    sj_val a = sj_matmul(t, sj_softmax(t, sc, -1), h[2]);
    sj_dim d3[3] = {b, s, sj_dim_const(t, BERT_H)};
    a = sj_reshape(t, sj_permute(t, a, (int[]){0, 2, 1, 3}), 3, d3);
    sj_val x1 = sj_layer_norm(t, sj_add(t, x, bench_linear(t, a, &w->wo, &w->bo)), sj_param(t, &w->g1),
                              sj_param(t, &w->b1), 1e-12);
    sj_val f = bench_linear(t, sj_gelu(t, bench_linear(t, x1, &w->w1, &w->bf1)), &w->w2, &w->bf2);
    return sj_output(t, sj_layer_norm(t, sj_add(t, x1, f), sj_param(t, &w->g2), sj_param(t, &w->b2), 1e-12));
}

static void make_units(void) {
    static bench_encoder w4, bert;
    encoder_weights(&w4, SJ_F16, BENCH_H, BENCH_FF);
    sj_tensor x = zeros(SJ_F16, 3, (int64_t[]){1, 128, BENCH_H});
    trace_units("w4", bench_w4_model, &w4, &x, 1, false);
    trace_units("w4", bench_w4_model, &w4, &x, 1, true);
    encoder_weights(&bert, SJ_F32, BERT_H, BERT_FF);
    sj_tensor bi[2] = {zeros(SJ_F32, 3, (int64_t[]){1, 64, BERT_H}), zeros(SJ_F32, 4, (int64_t[]){1, 1, 1, 64})};
    trace_units("bert", bert_layer_model, &bert, bi, 2, true);
}

/* -- Measuring -------------------------------------------------------------- */

static int reps = 3, threads = 2;
static bool first_done;

/* Registers summed over the kernels, the most of one, spilled bytes (from
 * ptxas -v's log). */
static void reg_info(const char *log, int *sum, int *most, int *spill) {
    *sum = *most = *spill = 0;
    for (const char *p = log; p && (p = strstr(p, "Used ")); p += 5) {
        int r = atoi(p + 5);
        *sum += r;
        if (r > *most) *most = r;
    }
    for (const char *p = log; p && (p = strstr(p, " bytes spill stores")); p++) {
        const char *q = p;
        while (q > log && q[-1] >= '0' && q[-1] <= '9') q--;
        *spill += atoi(q);
    }
}

static void measure(const unit *u, const config *cf, const char *src_override, const char *label) {
    const char *src = src_override ? src_override : u->src;
    sj_nvrtc_opts o;
    const char *argv[64];
    int argc = make_args(cf, NULL, &o, argv);
    double t[64], c[64], first = 0;
    size_t out = 0;
    int n = reps < 64 ? reps : 64;
    for (int r = 0; r < n; r++) {
        t[r] = compile_once(src, argc, argv, cf->ptx, &out, NULL, &c[r]);
        if (!out) {
            printf("{\"workload\": \"nvrtc\", \"unit\": \"%s\", \"config\": \"%s\", \"error\": \"NVRTC failed\"}\n",
                   u->name, label ? label : cf->name);
            return;
        }
        if (r == 0) first = t[0];
    }
    qsort(t, (size_t)n, sizeof t[0], bench_cmp_double);
    qsort(c, (size_t)n, sizeof c[0], bench_cmp_double);
    int sum = 0, most = 0, spill = 0;
    if (!cf->ptx) {
        sj_nvrtc_opts ov;
        const char *av[64];
        int ac = make_args(cf, "-Xptxas -v", &ov, av);
        char *log = NULL;
        size_t ob;
        compile_once(src, ac, av, false, &ob, &log, NULL);
        reg_info(log, &sum, &most, &spill);
        free(log);
    }
    printf("{\"workload\": \"nvrtc\", \"unit\": \"%s\", \"config\": \"%s\", \"arch\": \"%s\", \"nvrtc\": \"%d.%d\", "
           "\"src_bytes\": %zu, \"kernels\": %d, \"first_ms\": %.1f, \"median_ms\": %.1f, \"min_ms\": %.1f, "
           "\"cpu_median_ms\": %.1f, \"out_bytes\": %zu, \"regs_sum\": %d, \"regs_max\": %d, \"spill_bytes\": %d%s}\n",
           u->name, label ? label : cf->name, arch, nv.major, nv.minor, strlen(src), count_kernels(src),
           first, t[n / 2], t[0], c[n / 2], out, sum, most, spill,
           first_done ? "" : ", \"process_first\": true");
    first_done = true;
    fflush(stdout);
}

/* The prelude and runtime header alone: the unit up to its first kernel. */
static char *head_of(const char *src) {
    const char *k = strstr(src, "\n/* -- generated");
    size_t n = k ? (size_t)(k - src) : strlen(src);
    char *h = malloc(n + 1);
    if (!h) bench_die("out of memory");
    memcpy(h, src, n);
    h[n] = '\0';
    return h;
}

typedef struct split_job {
    char *const *pieces;
    int n;
    _Atomic int next;
    int argc;
    const char *const *argv;
    double ms[SJ_CUDA_PIECES_MAX]; /* each piece's compile, CPU ms */
} split_job;

static double median_of(double *v, int n) {
    qsort(v, (size_t)n, sizeof v[0], bench_cmp_double);
    return v[n / 2];
}

static void *split_worker(void *p) {
    split_job *j = p;
    for (int i; (i = atomic_fetch_add(&j->next, 1)) < j->n;) {
        size_t out;
        compile_once(j->pieces[i], j->argc, j->argv, false, &out, NULL, &j->ms[i]);
        if (!out) bench_die("compile (split)");
    }
    return NULL;
}

/* The unit split as the CUDA backend splits it (sj_codegen_cuda_split,
 * into `threads` programs at most) and compiled on `threads` threads at
 * once: the wall time of the whole (median of reps), each piece's CPU ms
 * (median of reps) and the slowest piece's (median over reps of each rep's
 * most: the wall time on a machine with `threads` free cores is about it
 * plus thread start). */
static void measure_split(const unit *u, const config *cf) {
    char *pieces[SJ_CUDA_PIECES_MAX];
    int n = sj_codegen_cuda_split(u->src, threads, pieces);
    if (n < 1) bench_die("sj_codegen_cuda_split");
    sj_nvrtc_opts o;
    const char *argv[64];
    int argc = make_args(cf, NULL, &o, argv);
    double t[64], most[64], per[SJ_CUDA_PIECES_MAX][64];
    int r_n = reps < 64 ? reps : 64;
    static split_job j;
    for (int r = 0; r < r_n; r++) {
        j = (split_job){.pieces = pieces, .n = n, .argc = argc, .argv = argv};
        atomic_init(&j.next, 0);
        pthread_t th[SJ_CUDA_PIECES_MAX];
        int nt = threads < n ? threads : n;
        double t0 = bench_now_s();
        for (int i = 0; i < nt; i++) pthread_create(&th[i], NULL, split_worker, &j);
        for (int i = 0; i < nt; i++) pthread_join(th[i], NULL);
        t[r] = (bench_now_s() - t0) * 1e3;
        most[r] = 0;
        for (int i = 0; i < n; i++) {
            per[i][r] = j.ms[i];
            if (j.ms[i] > most[r]) most[r] = j.ms[i];
        }
    }
    qsort(t, (size_t)r_n, sizeof t[0], bench_cmp_double);
    printf("{\"workload\": \"nvrtc\", \"unit\": \"%s\", \"config\": \"split_%s\", \"arch\": \"%s\", \"pieces\": %d, "
           "\"threads\": %d, \"median_ms\": %.1f, \"min_ms\": %.1f, \"slowest_cpu_ms\": %.1f, \"piece_cpu_ms\": [",
           u->name, cf->name, arch, n, threads, t[r_n / 2], t[0], median_of(most, r_n));
    for (int i = 0; i < n; i++) printf("%s%.1f", i ? ", " : "", median_of(per[i], r_n));
    printf("]}\n");
    fflush(stdout);
    for (int i = 0; i < n; i++) free(pieces[i]);
}

int main(int argc, char **argv) {
    bool sweep = false, only_split = false;
    const char *dump = NULL, *only = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--arch") && i + 1 < argc) snprintf(arch, sizeof arch, "%s", argv[++i]);
        else if (!strcmp(argv[i], "--flags") && i + 1 < argc) user_flags = argv[++i];
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--dump") && i + 1 < argc) dump = argv[++i];
        else if (!strcmp(argv[i], "--unit") && i + 1 < argc) only = argv[++i];
        else if (!strcmp(argv[i], "--sweep")) sweep = true;
        else if (!strcmp(argv[i], "--split")) only_split = true;
        else if (!strcmp(argv[i], "--fb")) fallback_units = true;
        else if (!strcmp(argv[i], "--drop") && i + 1 < argc) dropped_opt = argv[++i];
        else {
            fprintf(stderr,
                    "usage: bench_nvrtc [--reps N] [--arch sm_90] [--flags \"...\"] [--unit NAME] [--sweep] "
                    "[--split] [--threads N] [--fb] [--drop OPT] [--dump DIR]\n");
            return 2;
        }
    }
    if (reps < 1) reps = 1;
    if (threads < 1) threads = 1;
    if (!load_nvrtc()) {
        printf("{\"workload\": \"nvrtc\", \"skipped\": \"no NVRTC (libnvrtc.so.13/.12)\"}\n");
        return 0;
    }
    make_units();
    if (dump) {
        mkdir(dump, 0755);
        for (int i = 0; i < n_units; i++) {
            char path[512];
            snprintf(path, sizeof path, "%s/%s.cu", dump, units[i].name);
            FILE *f = fopen(path, "w");
            if (f) fputs(units[i].src, f), fclose(f);
        }
    }
    static const config base = {.name = "default"};
    static const config levers[] = {
        {.name = "lineinfo", .add = "-lineinfo"}, /* the default before issue 28 */
        {.name = "no_extra_vec", .drop = {"--extra-device-vectorization"}},
        {.name = "ptxas_O2", .add = "-Xptxas -O2"},
        {.name = "ptxas_no_expensive", .add = "-Xptxas --allow-expensive-optimizations=false"},
        {.name = "fast_compile_min", .add = "-Ofc=min"}, /* slower kernels (bench/RESULTS.md) */
        {.name = "ptx_only", .ptx = true},
    };
    for (int i = 0; i < n_units; i++) {
        const unit *u = &units[i];
        if (only && strncmp(only, u->name, strlen(only))) continue; /* w4.spec: and w4.spec+fb */
        if (only_split) {
            measure_split(u, &base);
            continue;
        }
        measure(u, &base, NULL, NULL);
        if (!sweep) continue;
        for (size_t l = 0; l < sizeof levers / sizeof levers[0]; l++) measure(u, &levers[l], NULL, NULL);
        char *head = head_of(u->src);
        measure(u, &base, head, "head_only");
        free(head);
        measure_split(u, &base);
    }
    return 0;
}
