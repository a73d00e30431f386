/* Private to the fusion pass (fusion.c builds groups, fusion_plan.c turns
 * them into a plan): the builder state and the expression helpers both
 * use. */
#ifndef SJ_FUSION_INT_H
#define SJ_FUSION_INT_H

#include "specialize/fusion.h"

/* Accesses one generated group may have (the fused executor's limit). A
 * group's node count plus operand count bounds its accesses; groups stop
 * growing at this. */
#define SJ_FUSE_MAX_ACCESSES (2 * SJ_MAX_INPUTS + 64)

/* A group under construction. */
typedef struct sj_fuse_grp {
    sj_group_kind kind;
    bool alive;           /* false once merged into another group */
    int32_t *nodes;       /* in the order added (sorted when the plan is made) */
    int n_nodes, cap;
    int cost;             /* nodes plus operands: bounds loads + stores */
    int32_t row_node;     /* ROW: the row op; else -1 */
    int rank;             /* iteration shape (uncollapsed) */
    sj_expr shape[SJ_MAX_RANK];
} sj_fuse_grp;

typedef struct sj_fuse_st {
    sj_graph *g;
    sj_exprs *ex;
    const sj_tensor *traced;
    bool gemm;            /* sj_fuse_opts.gemm */
    bool gemm_ln;         /* sj_fuse_opts.gemm_ln */
    int gemm_arch, gemm_units; /* sj_fuse_opts' */
    uint64_t pinned;      /* sj_fuse_opts.pinned */
    bool oom;             /* an allocation failed (expressions included) */
    /* per value */
    int32_t *root;        /* the value whose memory it is: itself, or for a
                             folded view the root of its operand */
    int32_t *vgroup;      /* group computing it; -1 for inputs, params,
                             constants and folded views */
    sj_expr *voff;        /* virtual layout: element offset ... */
    sj_expr *vst;         /* ... and strides, SJ_MAX_RANK per value */
    bool *copy;           /* a view node's result that must be copied */
    /* groups: at most one per node */
    sj_fuse_grp *gr;
    int n_gr;
    int words;            /* uint64 words of a group bitset */
    uint64_t *dep;        /* per group: groups it reads directly */
    uint64_t *vdep;       /* per group: groups it reads through a view */
    uint64_t *scratch;    /* 4 bitsets */
} sj_fuse_st;

/* Expression builders: an allocation failure sets b->oom (checked once at
 * the end) and yields a harmless id. */
sj_expr sj_fuse_chk(sj_fuse_st *b, sj_expr e);
sj_expr sj_fuse_const(sj_fuse_st *b, int64_t c);
sj_expr sj_fuse_mul(sj_fuse_st *b, sj_expr x, sj_expr y);
sj_expr sj_fuse_add(sj_fuse_st *b, sj_expr x, sj_expr y);
bool sj_fuse_is_one(const sj_fuse_st *b, sj_expr e);
/* Row-major contiguous strides of shape[0 .. rank). */
void sj_fuse_contig(sj_fuse_st *b, int rank, const sj_expr *shape, sj_expr *stride);

/* Order the groups, decide stores, plan the arena and build accesses
 * (fusion_plan.c). NULL on allocation failure. */
sj_fplan *sj_fuse_finish(sj_fuse_st *b);

#endif /* SJ_FUSION_INT_H */
