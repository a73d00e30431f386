/* bert: a BERT-family sentence encoder (all-MiniLM-L6-v2 and its kin) built
 * on shapejit from a model directory: config.json + model.safetensors.
 *
 * Computes what sentence-transformers computes for all-MiniLM-L6-v2:
 * embeddings (word + position + token type 0, LayerNorm), N post-LN
 * encoder layers (self-attention, GELU feed-forward), mean pooling over
 * the tokens of each sentence, L2 normalisation. A batch holds sentences
 * of different lengths; both the batch and the sequence dimension vary
 * from call to call, which is what shapejit's guards and buckets serve.
 *
 * Code a user copies or links (samples/bert): it uses only shapejit's
 * public header. Thread-safe where said. */
#ifndef SJ_SAMPLES_BERT_H
#define SJ_SAMPLES_BERT_H

#include <stdint.h>

#include <shapejit.h>

/* From config.json. */
typedef struct bert_config {
    int vocab_size;
    int hidden;          /* hidden_size */
    int heads;           /* num_attention_heads */
    int layers;          /* num_hidden_layers */
    int intermediate;    /* intermediate_size */
    int max_positions;   /* max_position_embeddings */
    int type_vocab;      /* type_vocab_size */
    double eps;          /* layer_norm_eps */
    char act[16];        /* hidden_act: "gelu" (exact erf) or "gelu_new"/"gelu_pytorch_tanh" (tanh) */
} bert_config;

typedef struct bert_model bert_model;

/* Load dir/config.json and dir/model.safetensors onto rt and create the
 * encoder's jitted function (named "bert"; SHAPEJIT_BUCKETS may name it).
 * dtype: the compute dtype (SJ_F32; SJ_F16 or SJ_BF16 too). Weights are
 * converted once here, never per call. Returns SJ_OK, or an error whose
 * bert_error() names the file, the key or tensor and what was wrong. */
sj_status bert_load(sj_runtime *rt, const char *dir, sj_dtype dtype, bert_model **out);

/* The message of the last bert_* call that failed on this thread ("" if
 * none). */
const char *bert_error(void);

/* Destroys the function and releases the weights. NULL is a no-op. Must not
 * race with bert_embed. */
void bert_free(bert_model *m);

const bert_config *bert_config_of(const bert_model *m);

/* The jitted function (for sj_fn_stats, sj_fn_explain, sj_fn_wait_idle). */
sj_fn *bert_fn(const bert_model *m);

/* Embed a batch. ids: batch x seq token ids, row-major, host memory, row b
 * holding lengths[b] tokens (1 <= lengths[b] <= seq <= max_positions) and
 * anything past them (ignored); out: batch x hidden floats, host memory,
 * each row L2-normalised. Works on the CPU and CUDA backends alike (device
 * copies are made inside). Thread-safe: calls may run concurrently. */
sj_status bert_embed(bert_model *m, const int32_t *ids, const int32_t *lengths, int batch, int seq,
                     float *out);

/* Embed a packed batch: the same as bert_embed without padding. ids: the
 * batch's token ids laid end to end (sentence b's lengths[b] tokens after
 * sentence b-1's), sum(lengths) in all, host memory; 1 <= lengths[b] <=
 * max_positions; out: batch x hidden floats, each row L2-normalised.
 * Attention runs over the packed tokens with sj_attention_varlen, so no
 * work is spent on padding. Thread-safe like bert_embed. */
sj_status bert_embed_packed(bert_model *m, const int32_t *ids, const int32_t *lengths, int batch, float *out);

/* The packed encoder's jitted function (named "bert_packed"). */
sj_fn *bert_fn_packed(const bert_model *m);

/* Prepare the function for serving before the first request, with
 * shapejit's warm-up (sj_fn_warmup): for each of the n shapes bs[2k] x
 * bs[2k + 1] (batch x seq), the entry is traced, its kernels compiled and
 * loaded, and it is run once on inputs the runtime makes, so that the
 * first request of a declared shape (and of every size in its buckets) is
 * served fused. flags: SJ_WARMUP_* (SJ_WARMUP_BACKGROUND: return once
 * traced; sj_fn_ready(bert_fn(m)) says when it is done, and done(user, ...)
 * is called then, on a library thread: see sj_warmup_done_fn). Blocking:
 * at most timeout_ms (<= 0: no limit), then SJ_ETIMEOUT (it goes on in the
 * background). A shape that fails is reported (bert_error) and the others
 * are still prepared. */
sj_status bert_warmup_shapes(bert_model *m, const int *bs, int n, unsigned flags, int timeout_ms,
                             sj_warmup_done_fn done, void *user);

/* bert_warmup_shapes, blocking, for every (batch, seq) pair of
 * batches[0..nb) x seqs[0..ns). */
sj_status bert_warmup(bert_model *m, const int *batches, int nb, const int *seqs, int ns,
                      int timeout_ms);

/* The same for the packed encoder (bert_embed_packed): batches[i]
 * sentences of lengths up to seqs[j], packed. */
sj_status bert_warmup_packed(bert_model *m, const int *batches, int nb, const int *seqs, int ns,
                             int timeout_ms);

#endif
