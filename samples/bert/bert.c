/* bert: a BERT-family sentence encoder on shapejit (see bert.h).
 *
 * Weights come from model.safetensors through sj_weights; the linear
 * layers' weights (stored [out, in] as PyTorch keeps them) are transposed
 * once at load into [in, out] in the compute dtype, and on a CUDA runtime
 * uploaded once; every traced entry shares them. The model function:
 *
 *   x = LayerNorm(word[ids] + pos[0:S] + type[0])
 *   per layer:  a = attention(q(x), k(x), v(x), lengths)   (heads split)
 *               x = LayerNorm(x + out(a));  x = LayerNorm(x + down(gelu(up(x))))
 *   e = sum(x * mask, seq) / lengths;  e / max(|e|, 1e-12)
 *
 * Inputs of the jitted function: ids i32 [B, S] and lengths i32 [B]. The
 * positions (the first S rows of the position table, a view: sj_slice_dim
 * with the symbolic S) and the padding mask (arange(S) < lengths, [B, S, 1])
 * are built in the graph, so neither installs a guard on S.
 *
 * The packed encoder (bert_embed_packed) computes the same with no padding:
 * the B sentences' tokens laid end to end, T in all. Every per-token op
 * runs on [T, hidden]; attention is sj_attention_varlen over [T, heads,
 * dh] with the offsets, so a token sees only its own sentence. Inputs:
 * ids i32 [T], offsets i32 [B+1] (cumulative starts), positions i32 [T]
 * (each token's place in its own sentence: the host has the lengths at
 * hand, and a position input costs what a segment-id input for an
 * in-graph arange(T) - offsets[segment] would), pool f32 [B, T] (1/len_b
 * on sentence b's tokens, 0 elsewhere). Mean pooling is the product
 * pool @ x: the graph API has no segment sum, and the product is one
 * sgemm of B T hidden multiply-adds, well under 1% of an encoder layer's
 * per-token work for any batch the server makes. */
#include "samples/bert/bert.h"

#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#define MAX_LAYERS 48

typedef struct linear {
    sj_tensor w; /* [in, out], compute dtype */
    sj_tensor b; /* [out], compute dtype */
} linear;

typedef struct layer {
    linear qkv; /* query, key and value in one product: [in, 3 x hidden] */
    linear o, up, down;
    sj_tensor ln1_g, ln1_b, ln2_g, ln2_b;
} layer;

struct bert_model {
    sj_runtime *rt;
    bert_config cfg;
    sj_dtype dtype;
    bool cuda;
    sj_weights *weights;
    sj_tensor word, pos, type0, ln_g, ln_b;
    layer layers[MAX_LAYERS];
    /* tensors this model allocated (transposed weights), freed at bert_free */
    sj_tensor *owned;
    int n_owned, cap_owned;
    sj_fn *fn;
    sj_fn *packed; /* the packed encoder (packed_model) */
};

/* -- Errors ------------------------------------------------------------------ */

static _Thread_local char last_error[512];

static sj_status set_error(sj_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static sj_status set_error(sj_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return st;
}

const char *bert_error(void) { return last_error; }

/* -- Loading ----------------------------------------------------------------- */

static int json_int(json_t *root, const char *key, int *out, const char *path) {
    json_t *v = json_object_get(root, key);
    if (!json_is_integer(v) || json_integer_value(v) <= 0 || json_integer_value(v) > 1000000) {
        set_error(SJ_EINVAL, "%s: key '%s' missing or not a positive integer", path, key);
        return -1;
    }
    *out = (int)json_integer_value(v);
    return 0;
}

static sj_status read_config(const char *dir, bert_config *c) {
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_error_t err;
    json_t *root = json_load_file(path, 0, &err);
    if (!root || !json_is_object(root)) {
        json_decref(root);
        return set_error(SJ_EINVAL, "%s: %s", path, root ? "not a JSON object" : err.text);
    }
    memset(c, 0, sizeof *c);
    int bad = json_int(root, "vocab_size", &c->vocab_size, path) || json_int(root, "hidden_size", &c->hidden, path) ||
              json_int(root, "num_attention_heads", &c->heads, path) ||
              json_int(root, "num_hidden_layers", &c->layers, path) ||
              json_int(root, "intermediate_size", &c->intermediate, path) ||
              json_int(root, "max_position_embeddings", &c->max_positions, path) ||
              json_int(root, "type_vocab_size", &c->type_vocab, path);
    json_t *eps = json_object_get(root, "layer_norm_eps"), *act = json_object_get(root, "hidden_act");
    if (!bad && (!json_is_number(eps) || json_number_value(eps) <= 0)) {
        set_error(SJ_EINVAL, "%s: key 'layer_norm_eps' missing or not a positive number", path);
        bad = -1;
    }
    if (!bad && (!json_is_string(act) || (strcmp(json_string_value(act), "gelu") &&
                                          strcmp(json_string_value(act), "gelu_new") &&
                                          strcmp(json_string_value(act), "gelu_pytorch_tanh")))) {
        set_error(SJ_EINVAL, "%s: key 'hidden_act' must be gelu, gelu_new or gelu_pytorch_tanh", path);
        bad = -1;
    }
    if (!bad && (c->hidden % c->heads || c->layers > MAX_LAYERS)) {
        set_error(SJ_EINVAL, "%s: hidden_size %d not a multiple of num_attention_heads %d, or more than %d layers",
                  path, c->hidden, c->heads, MAX_LAYERS);
        bad = -1;
    }
    if (!bad) {
        c->eps = json_number_value(eps);
        snprintf(c->act, sizeof c->act, "%s", json_string_value(act));
    }
    json_decref(root);
    return bad ? SJ_EINVAL : SJ_OK;
}

static sj_status get(bert_model *m, const char *name, int rank, const int64_t *shape, sj_tensor *out) {
    return sj_weights_get(m->weights, name, m->dtype, rank, shape, out);
}

/* The model's own copy of a tensor: kept until bert_free. */
static sj_status keep(bert_model *m, const sj_tensor *t) {
    if (m->n_owned == m->cap_owned) {
        int cap = m->cap_owned ? 2 * m->cap_owned : 64;
        sj_tensor *v = realloc(m->owned, (size_t)cap * sizeof *v);
        if (!v) return SJ_ENOMEM;
        m->owned = v, m->cap_owned = cap;
    }
    m->owned[m->n_owned++] = *t;
    return SJ_OK;
}

/* A linear layer made of n stored ones side by side (n = 1: one layer;
 * query, key and value: n = 3, one product instead of three): each weight
 * [out, in] in the file -> columns [i * out, (i + 1) * out) of [in, n *
 * out] in the compute dtype, on the runtime's device, and the biases
 * likewise. The stored bytes (host, any float dtype) are converted to f32
 * on the host, transposed, then converted and, on CUDA, uploaded by one
 * sj_tensor_copy each. */
static sj_status load_linear(bert_model *m, const char *const *prefixes, int n, int in, int out, linear *l) {
    char name[256];
    int64_t cols = (int64_t)n * out;
    sj_tensor t = sj_tensor_make(NULL, SJ_F32, 2, (int64_t[]){in, cols});
    sj_tensor bt = sj_tensor_make(NULL, SJ_F32, 1, &cols);
    sj_tensor f = sj_tensor_make(NULL, SJ_F32, 2, (int64_t[]){out, in});
    sj_status st = sj_tensor_alloc(m->rt, &t);
    if (!st) st = sj_tensor_alloc(m->rt, &bt);
    if (!st) st = sj_tensor_alloc(m->rt, &f);
    for (int p = 0; p < n && !st; p++) {
        sj_tensor stored;
        snprintf(name, sizeof name, "%s.weight", prefixes[p]);
        if ((st = sj_weights_info(m->weights, name, &stored))) break;
        if (stored.rank != 2 || stored.shape[0] != out || stored.shape[1] != in) {
            st = set_error(SJ_ESHAPE, "tensor '%s': wrong shape: expected [%d, %d]", name, out, in);
            break;
        }
        if ((st = sj_tensor_copy(m->rt, &f, &stored))) break;
        const float *src = f.data;
        float *dst = (float *)t.data + (size_t)p * out;
        for (int i = 0; i < out; i++)
            for (int j = 0; j < in; j++) dst[(size_t)j * cols + i] = src[(size_t)i * in + j];
        snprintf(name, sizeof name, "%s.bias", prefixes[p]);
        if ((st = sj_weights_info(m->weights, name, &stored))) break;
        if (stored.rank != 1 || stored.shape[0] != out) {
            st = set_error(SJ_ESHAPE, "tensor '%s': wrong shape: expected [%d]", name, out);
            break;
        }
        sj_tensor part = bt;
        part.data = (float *)bt.data + (size_t)p * out;
        part.shape[0] = out;
        st = sj_tensor_copy(m->rt, &part, &stored);
    }
    sj_tensor w = sj_tensor_make(NULL, m->dtype, 2, (int64_t[]){in, cols});
    sj_tensor b = sj_tensor_make(NULL, m->dtype, 1, &cols);
    w.device = b.device = m->cuda ? SJ_CUDA : SJ_HOST;
    if (!st && !(st = sj_tensor_alloc(m->rt, &w)) && !(st = sj_tensor_copy(m->rt, &w, &t)) && !(st = keep(m, &w))) {
        l->w = w;
        if (!(st = sj_tensor_alloc(m->rt, &b)) && !(st = sj_tensor_copy(m->rt, &b, &bt)) && !(st = keep(m, &b)))
            l->b = b;
        else
            sj_tensor_free(m->rt, &b);
    } else {
        sj_tensor_free(m->rt, &w);
    }
    sj_tensor_free(m->rt, &f);
    sj_tensor_free(m->rt, &t);
    sj_tensor_free(m->rt, &bt);
    return st;
}

static sj_status load_weights(bert_model *m, const char *dir) {
    char path[4096], name[256];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    sj_status st = sj_weights_open(m->rt, path, &m->weights);
    if (st) return st;
    const bert_config *c = &m->cfg;
    int64_t H = c->hidden, I = c->intermediate;
    if ((st = get(m, "embeddings.word_embeddings.weight", 2, (int64_t[]){c->vocab_size, H}, &m->word)) ||
        (st = get(m, "embeddings.position_embeddings.weight", 2, (int64_t[]){c->max_positions, H}, &m->pos)) ||
        (st = get(m, "embeddings.LayerNorm.weight", 1, &H, &m->ln_g)) ||
        (st = get(m, "embeddings.LayerNorm.bias", 1, &H, &m->ln_b)))
        return st;
    sj_tensor type;
    if ((st = get(m, "embeddings.token_type_embeddings.weight", 2, (int64_t[]){c->type_vocab, H}, &type))) return st;
    m->type0 = type; /* row 0: the first H elements */
    m->type0.rank = 1;
    m->type0.shape[0] = H;
    m->type0.stride[0] = 1;
    for (int i = 0; i < c->layers; i++) {
        layer *L = &m->layers[i];
        char p[128];
        snprintf(p, sizeof p, "encoder.layer.%d.", i);
        char qn[160], kn[160], vn[160];
        snprintf(qn, sizeof qn, "%sattention.self.query", p);
        snprintf(kn, sizeof kn, "%sattention.self.key", p);
        snprintf(vn, sizeof vn, "%sattention.self.value", p);
        if ((st = load_linear(m, (const char *const[]){qn, kn, vn}, 3, H, H, &L->qkv))) return st;
#define LIN(field, sub, in, out)                                                                  \
    snprintf(name, sizeof name, "%s%s", p, sub);                                                  \
    if ((st = load_linear(m, (const char *const[]){name}, 1, in, out, &L->field))) return st;
        LIN(o, "attention.output.dense", H, H)
        LIN(up, "intermediate.dense", H, I)
        LIN(down, "output.dense", I, H)
#undef LIN
#define LN(field, sub)                                                                            \
    snprintf(name, sizeof name, "%s%s", p, sub);                                                  \
    if ((st = get(m, name, 1, &H, &L->field))) return st;
        LN(ln1_g, "attention.output.LayerNorm.weight")
        LN(ln1_b, "attention.output.LayerNorm.bias")
        LN(ln2_g, "output.LayerNorm.weight")
        LN(ln2_b, "output.LayerNorm.bias")
#undef LN
    }
    return SJ_OK;
}

/* -- The model function ---------------------------------------------------------- */

static sj_val lin(sj_tracer *t, sj_val x, const linear *l) {
    return sj_add(t, sj_matmul(t, x, sj_param(t, &l->w)), sj_param(t, &l->b));
}

/* [B, S, H] -> [B, heads, S, dh] */
static sj_val split_heads(sj_tracer *t, sj_val x, int heads, int dh) {
    sj_dim d[4] = {sj_dim_of(t, x, 0), sj_dim_of(t, x, 1), sj_dim_const(t, heads), sj_dim_const(t, dh)};
    return sj_permute(t, sj_reshape(t, x, 4, d), (const int[]){0, 2, 1, 3});
}

static sj_status model(sj_tracer *t, const sj_val *in, int n, void *user) {
    (void)n;
    const bert_model *m = user;
    const bert_config *c = &m->cfg;
    int dh = c->hidden / c->heads;
    sj_val ids = in[0], lengths = in[1];
    sj_dim S = sj_dim_of(t, ids, 1), B = sj_dim_of(t, ids, 0), one = sj_dim_const(t, 1);
    sj_val pos = sj_slice_dim(t, sj_param(t, &m->pos), 0, sj_dim_const(t, 0), S); /* [S, H] */
    sj_val x = sj_add(t, sj_gather(t, sj_param(t, &m->word), ids), pos);
    /* mask [B, S, 1]: 1 for the first lengths[b] tokens of row b, 0 for padding */
    sj_val iota = sj_reshape(t, sj_arange(t, S, SJ_I32), 2, (sj_dim[]){one, S});
    sj_val mask = sj_cast(t, sj_lt(t, iota, sj_reshape(t, lengths, 2, (sj_dim[]){B, one})), SJ_F32);
    mask = sj_reshape(t, mask, 3, (sj_dim[]){B, S, one});
    x = sj_add(t, x, sj_param(t, &m->type0));
    x = sj_layer_norm(t, x, sj_param(t, &m->ln_g), sj_param(t, &m->ln_b), c->eps);
    bool tanh_gelu = strcmp(c->act, "gelu") != 0;
    for (int i = 0; i < c->layers; i++) {
        const layer *L = &m->layers[i];
        sj_val qkv = lin(t, x, &L->qkv); /* [B, S, 3 x hidden] */
        sj_val q = split_heads(t, sj_slice(t, qkv, 2, 0, c->hidden, 1), c->heads, dh);
        sj_val k = split_heads(t, sj_slice(t, qkv, 2, c->hidden, 2 * c->hidden, 1), c->heads, dh);
        sj_val v = split_heads(t, sj_slice(t, qkv, 2, 2 * c->hidden, 3 * c->hidden, 1), c->heads, dh);
        sj_val a = sj_attention(t, q, k, v, lengths, 1.0 / sqrt((double)dh), 0);
        sj_dim d[3] = {sj_dim_of(t, x, 0), sj_dim_of(t, x, 1), sj_dim_const(t, c->hidden)};
        a = sj_reshape(t, sj_permute(t, a, (const int[]){0, 2, 1, 3}), 3, d);
        x = sj_layer_norm(t, sj_add(t, x, lin(t, a, &L->o)), sj_param(t, &L->ln1_g), sj_param(t, &L->ln1_b), c->eps);
        sj_val h = lin(t, x, &L->up);
        h = tanh_gelu ? sj_gelu_tanh(t, h) : sj_gelu(t, h);
        x = sj_layer_norm(t, sj_add(t, x, lin(t, h, &L->down)), sj_param(t, &L->ln2_g), sj_param(t, &L->ln2_b),
                          c->eps);
    }
    if (m->dtype != SJ_F32) x = sj_cast(t, x, SJ_F32);
    sj_val summed = sj_sum(t, sj_mul(t, x, mask), 1, 0);                          /* [B, H] */
    sj_dim d2[2] = {sj_dim_of(t, lengths, 0), sj_dim_const(t, 1)};
    sj_val count = sj_reshape(t, sj_cast(t, lengths, SJ_F32), 2, d2);            /* [B, 1] */
    sj_val mean = sj_div(t, summed, count);
    sj_val norm = sj_sqrt(t, sj_sum(t, sj_mul(t, mean, mean), 1, 1));
    return sj_output(t, sj_div(t, mean, sj_maximum(t, norm, sj_scalar(t, 1e-12))));
}

/* [T, hidden] -> [T, heads, dh] (a view: no permute for the varlen op) */
static sj_val packed_heads(sj_tracer *t, sj_val x, int heads, int dh) {
    sj_dim d[3] = {sj_dim_of(t, x, 0), sj_dim_const(t, heads), sj_dim_const(t, dh)};
    return sj_reshape(t, x, 3, d);
}

static sj_status packed_model(sj_tracer *t, const sj_val *in, int n, void *user) {
    (void)n;
    const bert_model *m = user;
    const bert_config *c = &m->cfg;
    int dh = c->hidden / c->heads;
    sj_val ids = in[0], offsets = in[1], positions = in[2], pool = in[3];
    sj_val x = sj_add(t, sj_gather(t, sj_param(t, &m->word), ids), sj_gather(t, sj_param(t, &m->pos), positions));
    x = sj_add(t, x, sj_param(t, &m->type0));
    x = sj_layer_norm(t, x, sj_param(t, &m->ln_g), sj_param(t, &m->ln_b), c->eps);
    bool tanh_gelu = strcmp(c->act, "gelu") != 0;
    for (int i = 0; i < c->layers; i++) {
        const layer *L = &m->layers[i];
        sj_val qkv = lin(t, x, &L->qkv); /* [T, 3 x hidden] */
        sj_val q = packed_heads(t, sj_slice(t, qkv, 1, 0, c->hidden, 1), c->heads, dh);
        sj_val k = packed_heads(t, sj_slice(t, qkv, 1, c->hidden, 2 * c->hidden, 1), c->heads, dh);
        sj_val v = packed_heads(t, sj_slice(t, qkv, 1, 2 * c->hidden, 3 * c->hidden, 1), c->heads, dh);
        sj_val a = sj_attention_varlen(t, q, k, v, offsets, 1.0 / sqrt((double)dh), 0);
        sj_dim d[2] = {sj_dim_of(t, x, 0), sj_dim_const(t, c->hidden)};
        a = sj_reshape(t, a, 2, d);
        x = sj_layer_norm(t, sj_add(t, x, lin(t, a, &L->o)), sj_param(t, &L->ln1_g), sj_param(t, &L->ln1_b), c->eps);
        sj_val h = lin(t, x, &L->up);
        h = tanh_gelu ? sj_gelu_tanh(t, h) : sj_gelu(t, h);
        x = sj_layer_norm(t, sj_add(t, x, lin(t, h, &L->down)), sj_param(t, &L->ln2_g), sj_param(t, &L->ln2_b),
                          c->eps);
    }
    if (m->dtype != SJ_F32) x = sj_cast(t, x, SJ_F32);
    sj_val mean = sj_matmul(t, pool, x);                                          /* [B, hidden] */
    sj_val norm = sj_sqrt(t, sj_sum(t, sj_mul(t, mean, mean), 1, 1));
    return sj_output(t, sj_div(t, mean, sj_maximum(t, norm, sj_scalar(t, 1e-12))));
}

/* -- Public ------------------------------------------------------------------ */

sj_status bert_load(sj_runtime *rt, const char *dir, sj_dtype dtype, bert_model **out) {
    last_error[0] = 0;
    if (!out) return set_error(SJ_EINVAL, "bert_load: out is NULL");
    *out = NULL;
    if (!rt || !dir) return set_error(SJ_EINVAL, "bert_load: rt or dir is NULL");
    if (dtype != SJ_F32 && dtype != SJ_F16 && dtype != SJ_BF16)
        return set_error(SJ_EINVAL, "bert_load: dtype %s: f32, f16 or bf16 only", sj_dtype_name(dtype));
    bert_model *m = calloc(1, sizeof *m);
    if (!m) return set_error(SJ_ENOMEM, "bert_load: out of memory");
    m->rt = rt;
    m->dtype = dtype;
    m->cuda = sj_runtime_backend(rt) == SJ_BACKEND_CUDA;
    sj_status st = read_config(dir, &m->cfg);
    if (!st && (st = load_weights(m, dir))) set_error(st, "%s", sj_last_error());
    if (!st) {
        sj_fn_options o;
        sj_fn_options_init(&o);
        o.dynamic = SJ_DYNAMIC_AUTO;
        o.input_names = (const char *const[]){"ids", "lengths"};
        o.recompile_limit = 64; /* 6 sequence buckets x 8 batch buckets, and room */
        st = sj_fn_create(rt, "bert", 2, model, m, &o, &m->fn);
        /* one entry per power-of-two bucket of the sequence length and of
         * the batch: exact sizes are passed at run time (no padding to the
         * bucket), and the buckets bound how many entries a stream makes */
        if (!st) st = sj_set_buckets_pow2(m->fn, 0, 1, 16, m->cfg.max_positions);
        if (!st) st = sj_set_buckets_pow2(m->fn, 0, 0, 2, 256);
        if (!st) {
            /* the packed encoder: buckets on the total tokens T and on the
             * offsets' B+1 bound its entries the same way */
            o.input_names = (const char *const[]){"ids", "offsets", "positions", "pool"};
            st = sj_fn_create(rt, "bert_packed", 4, packed_model, m, &o, &m->packed);
        }
        if (!st) st = sj_set_buckets_pow2(m->packed, 0, 0, 16, 1 << 16);
        if (!st) st = sj_set_buckets_pow2(m->packed, 1, 0, 2, 512);
        if (st) set_error(st, "%s", sj_last_error());
    }
    if (st) {
        bert_free(m);
        return st;
    }
    *out = m;
    return SJ_OK;
}

void bert_free(bert_model *m) {
    if (!m) return;
    sj_fn_destroy(m->fn);
    sj_fn_destroy(m->packed);
    for (int i = 0; i < m->n_owned; i++) sj_tensor_free(m->rt, &m->owned[i]);
    free(m->owned);
    sj_weights_close(m->weights);
    free(m);
}

const bert_config *bert_config_of(const bert_model *m) { return m ? &m->cfg : NULL; }

sj_fn *bert_fn(const bert_model *m) { return m ? m->fn : NULL; }

sj_fn *bert_fn_packed(const bert_model *m) { return m ? m->packed : NULL; }

/* Call fn on n (at most 4) host inputs (device copies on a CUDA runtime),
 * the result into the host tensor res. */
static sj_status call_n(bert_model *m, sj_fn *fn, const sj_tensor *host, int n, sj_tensor *res) {
    if (!m->cuda) return sj_call(fn, host, n, res, 1);
    sj_tensor dev[4] = {{0}}, dout = {0};
    sj_status st = SJ_OK;
    for (int i = 0; i < n && !st; i++) {
        dev[i] = host[i];
        dev[i].data = NULL;
        dev[i].device = SJ_CUDA;
        if (!(st = sj_tensor_alloc(m->rt, &dev[i]))) st = sj_tensor_copy(m->rt, &dev[i], &host[i]);
    }
    if (!st) st = sj_call(fn, dev, n, &dout, 1);
    if (!st) st = sj_tensor_copy(m->rt, res, &dout);
    sj_tensor_free(m->rt, &dout);
    for (int i = 0; i < n; i++) sj_tensor_free(m->rt, &dev[i]);
    return st;
}

sj_status bert_embed(bert_model *m, const int32_t *ids, const int32_t *lengths, int batch, int seq, float *out) {
    if (!m || !ids || !lengths || !out) return set_error(SJ_EINVAL, "bert_embed: NULL argument");
    if (batch < 1 || seq < 1 || seq > m->cfg.max_positions)
        return set_error(SJ_EINVAL, "bert_embed: batch %d x seq %d (seq at most %d)", batch, seq,
                         m->cfg.max_positions);
    for (int b = 0; b < batch; b++)
        if (lengths[b] < 1 || lengths[b] > seq)
            return set_error(SJ_EINVAL, "bert_embed: lengths[%d] = %d outside [1, %d]", b, lengths[b], seq);
    sj_tensor host[2] = {sj_tensor_make((void *)ids, SJ_I32, 2, (int64_t[]){batch, seq}),
                         sj_tensor_make((void *)lengths, SJ_I32, 1, (int64_t[]){batch})};
    sj_tensor res = sj_tensor_make(out, SJ_F32, 2, (int64_t[]){batch, m->cfg.hidden});
    sj_status st = call_n(m, m->fn, host, 2, &res);
    if (st) set_error(st, "bert_embed: %s", sj_last_error());
    return st;
}

sj_status bert_warmup_shapes(bert_model *m, const int *bs, int n, unsigned flags, int timeout_ms,
                             sj_warmup_done_fn done, void *user) {
    last_error[0] = 0;
    if (!m || n < 1 || !bs) return set_error(SJ_EINVAL, "bert_warmup_shapes: no model or no shapes");
    /* the encoder's two inputs per shape; data NULL: the runtime makes
     * them (ids and lengths 0: every key masked, the results NaN and
     * discarded; the kernels run all the same) */
    sj_tensor *t = calloc((size_t)n * 2, sizeof *t);
    if (!t) return set_error(SJ_ENOMEM, "bert_warmup_shapes: out of memory");
    for (int k = 0; k < n; k++) {
        int64_t B = bs[2 * k], S = bs[2 * k + 1];
        if (B < 1 || S < 1 || S > m->cfg.max_positions) {
            free(t);
            return set_error(SJ_EINVAL, "bert_warmup_shapes: batch %lld x seq %lld (seq at most %d)", (long long)B,
                             (long long)S, m->cfg.max_positions);
        }
        t[2 * k + 0] = sj_tensor_make(NULL, SJ_I32, 2, (int64_t[]){B, S});
        t[2 * k + 1] = sj_tensor_make(NULL, SJ_I32, 1, (int64_t[]){B});
    }
    sj_warmup_spec spec = {.n_shapes = n, .shapes = t, .timeout_ms = timeout_ms > 0 ? timeout_ms : 0,
                           .on_done = done, .on_done_user = user};
    sj_status st = sj_fn_warmup(m->fn, &spec, flags); /* copies the descriptors */
    free(t);
    if (st) set_error(st, "bert_warmup: %s", sj_last_error());
    return st;
}

sj_status bert_warmup(bert_model *m, const int *batches, int nb, const int *seqs, int ns, int timeout_ms) {
    last_error[0] = 0;
    if (!m || nb < 1 || ns < 1 || !batches || !seqs) return set_error(SJ_EINVAL, "bert_warmup: no batches or seqs");
    int *bs = malloc(sizeof *bs * 2 * (size_t)nb * (size_t)ns);
    if (!bs) return set_error(SJ_ENOMEM, "bert_warmup: out of memory");
    for (int i = 0; i < nb; i++)
        for (int j = 0; j < ns; j++) bs[2 * (i * ns + j)] = batches[i], bs[2 * (i * ns + j) + 1] = seqs[j];
    sj_status st = bert_warmup_shapes(m, bs, nb * ns, 0, timeout_ms, NULL, NULL);
    free(bs);
    return st;
}

sj_status bert_embed_packed(bert_model *m, const int32_t *ids, const int32_t *lengths, int batch, float *out) {
    if (!m || !ids || !lengths || !out) return set_error(SJ_EINVAL, "bert_embed_packed: NULL argument");
    if (batch < 1) return set_error(SJ_EINVAL, "bert_embed_packed: batch %d", batch);
    int64_t T = 0;
    for (int b = 0; b < batch; b++) {
        if (lengths[b] < 1 || lengths[b] > m->cfg.max_positions)
            return set_error(SJ_EINVAL, "bert_embed_packed: lengths[%d] = %d outside [1, %d]", b, lengths[b],
                             m->cfg.max_positions);
        T += lengths[b];
    }
    if (T > INT32_MAX) return set_error(SJ_EINVAL, "bert_embed_packed: %lld tokens, more than 2^31 - 1", (long long)T);
    int32_t *off = malloc((size_t)(batch + 1) * sizeof *off), *pos = malloc((size_t)T * sizeof *pos);
    float *pool = calloc((size_t)batch * (size_t)T, sizeof *pool);
    if (!off || !pos || !pool) {
        free(off), free(pos), free(pool);
        return set_error(SJ_ENOMEM, "bert_embed_packed: out of memory for %lld tokens", (long long)T);
    }
    off[0] = 0;
    for (int b = 0; b < batch; b++) {
        off[b + 1] = off[b] + lengths[b];
        for (int i = 0; i < lengths[b]; i++) {
            pos[off[b] + i] = i;
            pool[(size_t)b * T + off[b] + i] = 1.0f / (float)lengths[b];
        }
    }
    sj_tensor host[4] = {sj_tensor_make((void *)ids, SJ_I32, 1, (int64_t[]){T}),
                         sj_tensor_make(off, SJ_I32, 1, (int64_t[]){batch + 1}),
                         sj_tensor_make(pos, SJ_I32, 1, (int64_t[]){T}),
                         sj_tensor_make(pool, SJ_F32, 2, (int64_t[]){batch, T})};
    sj_tensor res = sj_tensor_make(out, SJ_F32, 2, (int64_t[]){batch, m->cfg.hidden});
    sj_status st = call_n(m, m->packed, host, 4, &res);
    free(off), free(pos), free(pool);
    if (st) set_error(st, "bert_embed_packed: %s", sj_last_error());
    return st;
}

/* bert_warmup_packed: each (batch, seq) pair run twice (the first call
 * traces, the second makes the entry hot), sentences of lengths that vary
 * within the batch, packed. */
static sj_status warmup_packed(bert_model *m, const int *batches, int nb, const int *seqs, int ns, int timeout_ms) {
    if (!m || (nb && !batches) || (ns && !seqs)) return SJ_EINVAL;
    int H = m->cfg.hidden;
    for (int i = 0; i < nb; i++)
        for (int j = 0; j < ns; j++) {
            int B = batches[i], S = seqs[j];
            if (B < 1 || S < 1 || S > m->cfg.max_positions) return SJ_EINVAL;
            int32_t *ids = calloc((size_t)B * S, sizeof *ids), *len = malloc((size_t)B * sizeof *len);
            float *out = malloc((size_t)B * H * sizeof *out);
            sj_status st = ids && len && out ? SJ_OK : SJ_ENOMEM;
            for (int b = 0; !st && b < B; b++) len[b] = S - (b % S); /* lengths vary within the batch */
            for (size_t k = 0; !st && k < (size_t)B * S; k++) ids[k] = 1000 + (int32_t)(k % 1000);
            for (int rep = 0; !st && rep < 2; rep++)
                st = bert_embed_packed(m, ids, len, B, out);
            free(ids), free(len), free(out);
            if (st) return st;
        }
    return sj_fn_wait_idle(m->packed, timeout_ms);
}

sj_status bert_warmup_packed(bert_model *m, const int *batches, int nb, const int *seqs, int ns, int timeout_ms) {
    return warmup_packed(m, batches, nb, seqs, ns, timeout_ms);
}
