/* Fusion and memory planning: a traced graph becomes a fused plan, a list
 * of kernel groups run in order, over storage whose addresses are symbolic
 * expressions evaluated per call.
 *
 * Groups
 *   POINTWISE  a DAG of elementwise nodes (unary, binary, compare, where,
 *              cast) with one iteration space: the shape every value the
 *              group stores has. Generated code.
 *   ROW        one row op over the innermost axis (softmax, layer norm,
 *              RMS norm, or sum/mean/amax over the last axis) with its
 *              elementwise prologue (nodes over the row op's input shape,
 *              before it) and epilogue (nodes over its output shape, after
 *              it). Iteration space: the row op's input shape; the last axis
 *              is the row. Generated code.
 *   NODE       one graph node run by its eager kernel (matmul through BLAS,
 *              attention, gather, concat); or a float matrix product and
 *              the add of a bias along its last axis that the graph marks
 *              as the product's (sj_node.fold): the product's kernel adds
 *              the bias as it writes (`bias`).
 * Epilogues
 *   A POINTWISE group that comes right after a float matrix product's
 *   NODE group, reads the product's result in place (contiguous, no view
 *   of it) and iterates over exactly the result's shape is the product's
 *   epilogue: element e of its iteration space reads element e of the
 *   product, so a product kernel may run the group over the elements of
 *   each block of result rows (and columns) it has finished, while they
 *   are in cache, instead of a second pass over the whole result (the
 *   executor's choice: the device's matmul_epi kernel). Its stores' lifetimes start
 *   at the product, so the arena never places them over anything the
 *   product still reads.
 * View nodes (reshape, permute, slice) fold into layouts and belong to no
 * group. A reshape whose operand's layout cannot be viewed in the new shape
 * becomes a POINTWISE group copying the operand into a contiguous buffer.
 *
 * Memory
 *   Every value that is read from memory has a layout: a store plus an
 *   element offset and element strides over its own shape (all
 *   expressions). Stores are the call's inputs, the parameters, the caller's
 *   outputs (contiguous), and arena buffers. Arena buffers whose lifetimes
 *   (first writing group .. last reading group) do not overlap share bytes;
 *   their offsets and the arena size are expressions.
 *
 * Accesses
 *   For generated groups the plan gives every load and store as an access
 *   over the group's iteration space (already collapsed: adjacent axes merged
 *   where every access allows, never the row axis of a ROW group): an
 *   element offset and one stride per iteration axis, 0 on broadcast axes.
 *   Code generators need no knowledge of views or broadcasting.
 *
 * All expressions live in the graph's pool (added when the plan is built,
 * before the entry is published), so one sj_ex_eval_all gives them all.
 */
#ifndef SJ_FUSION_H
#define SJ_FUSION_H

#include <stdbool.h>
#include <stdio.h>

#include "jit/ir/graph.h"

typedef enum sj_store_kind {
    SJ_ST_INPUT,  /* index: input position */
    SJ_ST_PARAM,  /* index: param position (g->params) */
    SJ_ST_OUTPUT, /* index: output position; the caller's contiguous buffer */
    SJ_ST_ARENA,  /* bytes at `offset` in the call's arena */
} sj_store_kind;

typedef struct sj_store {
    sj_store_kind kind;
    int32_t index;
    sj_dtype dtype;
    sj_expr bytes;  /* ARENA: size in bytes, a multiple of 64 */
    sj_expr offset; /* ARENA: byte offset in the arena, a multiple of 64 */
} sj_store;

/* Where a value's elements are: store base + (offset + sum idx[k]*stride[k])
 * elements, over the value's own shape. */
typedef struct sj_layout {
    int32_t store; /* index into plan->stores; -1: no memory (a constant, or a
                      value that lives only inside a generated group) */
    sj_expr offset;
    sj_expr stride[SJ_MAX_RANK];
} sj_layout;

/* A load or store of one value in a generated group, over the group's
 * (collapsed) iteration space. */
typedef struct sj_access {
    int32_t val;                  /* graph value */
    int32_t store;                /* plan->stores index */
    sj_expr offset;               /* elements */
    sj_expr stride[SJ_MAX_RANK];  /* elements per step of each iteration axis; 0: broadcast */
} sj_access;

typedef enum sj_group_kind { SJ_G_POINTWISE, SJ_G_ROW, SJ_G_NODE } sj_group_kind;

typedef struct sj_group {
    sj_group_kind kind;
    char name[16];        /* "k3": the generated function's name */
    int32_t *nodes;       /* graph nodes in topological order (views excluded);
                             NODE: exactly one */
    int n_nodes;
    int32_t row_node;     /* ROW: the row op (also in nodes); else -1 */
    int32_t bias;         /* NODE of two nodes (a matmul, then an add of this
                             value): the bias, with a size-1 axis or none
                             before its last; else -1. The group's result is
                             the add's. */
    int32_t epilogue;     /* NODE (a float matrix product): the plan index of
                             the POINTWISE group that may run inside the
                             product as its epilogue (see "Epilogues"); else
                             -1 */
    int32_t epilogue_of;  /* POINTWISE: the NODE group it is the epilogue
                             of; else -1 */
    /* NODE, a generated product (sj_fuse_opts.gemm; see "Generated
     * products"): gemm_tile indexes sj_gemm_cuda_tiles() (the tile the
     * unit's kernel uses), -1 for every other group; gemm_epi the
     * SJ_GEMM_* flags of what the kernel does besides the product (its
     * bias when `bias` >= 0 is always inside); gemm_res the residual it
     * adds (SJ_GEMM_RES), else -1; gemm_out the value it writes: the
     * epilogue group's one store when SJ_GEMM_EPI, else the group's
     * result. */
    int32_t gemm_tile;
    int32_t gemm_ln;      /* SJ_GEMM_LN: the layer_norm node inside; else -1 */
    int8_t gemm_tiles[4]; /* the kernel's variants (the autotuner's candidates):
                             gemm_nv tiles of sj_gemm_cuda_tiles() chosen by
                             sj_gemm_cuda_candidates, gemm_tiles[0] == gemm_tile */
    int gemm_nv;
    uint32_t gemm_epi;
    int32_t gemm_res;
    int32_t gemm_out;
    /* Iteration space (generated groups), collapsed. ROW: the last axis is
     * the row (length = the row op's input last size). */
    int rank;
    sj_expr shape[SJ_MAX_RANK];
    sj_expr numel;        /* product of shape */
    sj_expr rows;         /* ROW: numel / row length; POINTWISE: numel / last size */
    sj_access *loads;     /* values read from memory (not computed in the group) */
    int n_loads;
    sj_access *stores;    /* values the group writes (used elsewhere, or outputs) */
    int n_stores;
} sj_group;

/* sj_group.gemm_epi */
enum {
    SJ_GEMM_EPI = 1,  /* the epilogue group runs inside: skip it */
    SJ_GEMM_GELU = 2, /* exact GELU after the bias */
    SJ_GEMM_RELU = 4, /* ReLU after the bias */
    SJ_GEMM_RES = 8,  /* + gemm_res after the activation (then the cast to gemm_out's dtype) */
    /* the graph holds in f16 (the kernel rounds there, as eager would):
     * the product's result, the activation's, the residual add's */
    SJ_GEMM_R_PROD = 16,
    SJ_GEMM_R_ACT = 32,
    SJ_GEMM_R_RES = 64,
    SJ_GEMM_ROUNDS = SJ_GEMM_R_PROD | SJ_GEMM_R_ACT | SJ_GEMM_R_RES,
    /* the next group, a ROW group ([an add of gemm_res to the product's
     * result,] the layer_norm gemm_ln of that), runs inside: skip it
     * (never with SJ_GEMM_EPI); the kernel writes the add's value to the
     * product's result (gemm_out, read by nothing else) and the layer
     * norm's output */
    SJ_GEMM_LN = 128,
};

typedef struct sj_fplan {
    sj_group *groups;
    int n_groups;
    sj_store *stores;
    int n_stores;
    sj_layout *layouts;   /* one per graph value (g->n_vals) */
    sj_expr arena_bytes;  /* the planned arena */
    sj_expr naive_bytes;  /* every arena buffer on its own (for explain) */
    int n_generated;      /* POINTWISE + ROW groups */
    int n_gemm;           /* NODE groups with a generated product (gemm_tile >= 0) */
    int n_gemm_ln;        /* of which with a LayerNorm inside (SJ_GEMM_LN) */
    /* Outputs the plan cannot write in place (an input, a parameter, a
     * constant, a view, or the same value twice): copied after the groups
     * run, from the value's layout. */
    bool *output_copy;    /* g->n_outputs */
} sj_fplan;

/* The value a NODE group writes: its last node's (a product's bias add, or
 * its one node). */
static inline int32_t sj_group_out(const sj_graph *g, const sj_group *G) {
    return g->nodes[G->nodes[G->n_nodes - 1]].out;
}

/* Build the plan for g, adding its expressions to g->ex. traced: the
 * inputs the graph was traced with: an input that was contiguous is
 * addressed with contiguous strides computed from its (symbolic) sizes, any
 * other with its exact strides (the entry's guards pin exactly that). NULL
 * on allocation failure. Every graph is plannable (any node can be a NODE
 * group). */
sj_fplan *sj_fuse(sj_graph *g, const sj_tensor *traced);

/* Generated products
 *   With sj_fuse_opts.gemm (the CUDA device with cfg.cuda_gemm), a NODE
 *   group of an f16 matrix product A [.., M, K] @ B [K, N] (its bias add
 *   folded or not) whose A is contiguous from element 0, whose B is a
 *   parameter contiguous [K, N] from element 0 (N and K constants that a
 *   tile of sj_gemm_cuda_tiles() divides: up to 4 such tiles, the
 *   kernel's variants, which the device times once compiled: from sm_90
 *   two split-K clusters for the rows a fixed M gives, or 16, then tiles
 *   of one block; sj_gemm_cuda_candidates),
 *   whose bias (if any) is f16 or f32 with unit stride over N, and whose
 *   result is contiguous from element 0, is a generated product
 *   (gemm_tile >= 0): the CUDA code generator emits a kernel for it
 *   (specialize/codegen_gemm_cuda.h) and the executor launches it instead
 *   of the device's product. Its epilogue group (the f32 rule above,
 *   extended to f16 results for these products only) runs inside the
 *   kernel when it is exactly the chain the kernel does: an optional GELU
 *   (exact) or ReLU of the product's result, an optional add of a value
 *   of the result's shape stored contiguously from element 0 (f16 or
 *   f32), an optional cast to f16 or f32, each node on the previous one's
 *   result, only the last stored, and the product's result read by
 *   nothing else (SJ_GEMM_EPI); an f16 product's epilogue group that is
 *   not such a chain is no epilogue (it runs after, as before).
 *   A generated product with no epilogue group inside, whose result (f16,
 *   read by nothing else, not an output) the next group reads as a ROW
 *   group of exactly [an add of it and a residual (the rule above: its
 *   shape, contiguous from element 0, f16 or f32; the add's result f16),]
 *   a layer_norm of that over the last axis, gamma and beta (each
 *   optional) f16 or f32 vectors of N with unit stride, its output f16 or
 *   f32 contiguous from element 0, N a multiple of 64 up to 4096, takes
 *   that group inside too (SJ_GEMM_LN, gemm_ln): the transformer layer's
 *   x + proj(a) and LayerNorm in the product's kernel (codegen_gemm_cuda.h
 *   "LayerNorm inside") when sj_fuse_opts.gemm_ln asks. The group is still
 *   compiled: the device's product (a pick of -1, a misaligned operand)
 *   runs it after. */
typedef struct sj_fuse_opts {
    bool gemm; /* mark generated products */
    bool gemm_ln; /* and LayerNorms inside them (SJ_GEMM_LN; cfg.cuda_gemm_ln) */
    /* The device's compute capability (major x 10 + minor; 0: unknown)
     * and multiprocessors: which tiles a generated product's variants are
     * (sj_gemm_cuda_candidates; split-K clusters from 90) */
    int gemm_arch, gemm_units;
    /* Symbols the trace's facts pin to a constant (bit s: symbol s equals
     * its hint on every call the entry serves; the guards check it, e.g.
     * an input's inner size pinned by a product with a constant weight):
     * the plan may take their sizes as constants where it needs them. */
    uint64_t pinned;
} sj_fuse_opts;
sj_fplan *sj_fuse_ex(sj_graph *g, const sj_tensor *traced, const sj_fuse_opts *o);
void sj_fplan_free(sj_fplan *p);

/* One line per group ("k0 pointwise [s0, 4096]: mul add gelu sigmoid mul;
 * loads x a b; stores y") and the memory plan, for explain and the fusion
 * log. sym_vals (may be NULL) evaluates sizes. */
void sj_fplan_print(const sj_graph *g, const sj_fplan *p, const int64_t *sym_vals, FILE *out, const char *indent);

/* Is the node a row op that a ROW group can be built around (softmax, norms,
 * reductions over the last axis)? */
bool sj_fuse_is_row_op(const sj_graph *g, const sj_node *n);

#endif /* SJ_FUSION_H */
