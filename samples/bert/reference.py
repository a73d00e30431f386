#!/usr/bin/env python3
"""A float64 reference of the BERT-family sentence encoder in samples/bert,
computed with numpy from the same files: what sentence-transformers computes
for all-MiniLM-L6-v2 (word + position + token-type-0 embeddings and
LayerNorm, post-LN encoder layers with exact-erf GELU, mean pooling over
the attention mask, L2 normalisation), with tokens from the `tokenizers`
package and tokenizer.json.

    python3 samples/bert/reference.py MODEL_DIR SENTENCES OUT.jsonl

writes one JSON line per non-empty line of SENTENCES:
    {"text": ..., "ids": [...], "embedding": [...]}   (float64)
"""
import json
import math
import os
import struct
import sys

import numpy as np


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    dts = {"F32": np.float32, "F16": np.float16, "BF16": None, "I64": np.int64}
    out = {}
    for name, v in header.items():
        if name == "__metadata__":
            continue
        a, b = v["data_offsets"]
        if v["dtype"] == "BF16":
            u = np.frombuffer(data[a:b], dtype=np.uint16).astype(np.uint32) << 16
            arr = u.view(np.float32)
        else:
            arr = np.frombuffer(data[a:b], dtype=dts[v["dtype"]])
        out[name] = arr.reshape(v["shape"]).astype(np.float64)
    return out


def erf(x):
    return np.vectorize(math.erf)(x)


def layer_norm(x, g, b, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * g + b


def encode(cfg, w, ids):
    H = cfg["hidden_size"]
    nh = cfg["num_attention_heads"]
    dh = H // nh
    eps = cfg["layer_norm_eps"]
    S = len(ids)
    x = (w["embeddings.word_embeddings.weight"][ids] + w["embeddings.position_embeddings.weight"][:S] +
         w["embeddings.token_type_embeddings.weight"][0])
    x = layer_norm(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"], eps)
    for i in range(cfg["num_hidden_layers"]):
        p = f"encoder.layer.{i}."
        lin = lambda t, n: t @ w[p + n + ".weight"].T + w[p + n + ".bias"]
        q = lin(x, "attention.self.query").reshape(S, nh, dh).transpose(1, 0, 2)
        k = lin(x, "attention.self.key").reshape(S, nh, dh).transpose(1, 0, 2)
        v = lin(x, "attention.self.value").reshape(S, nh, dh).transpose(1, 0, 2)
        s = q @ k.transpose(0, 2, 1) / math.sqrt(dh)
        s = np.exp(s - s.max(-1, keepdims=True))
        a = (s / s.sum(-1, keepdims=True)) @ v
        a = a.transpose(1, 0, 2).reshape(S, H)
        x = layer_norm(x + lin(a, "attention.output.dense"), w[p + "attention.output.LayerNorm.weight"],
                       w[p + "attention.output.LayerNorm.bias"], eps)
        h = lin(x, "intermediate.dense")
        if cfg["hidden_act"] == "gelu":
            h = 0.5 * h * (1 + erf(h / math.sqrt(2)))
        else:
            h = 0.5 * h * (1 + np.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h ** 3)))
        x = layer_norm(x + lin(h, "output.dense"), w[p + "output.LayerNorm.weight"], w[p + "output.LayerNorm.bias"],
                       eps)
    e = x.mean(0)
    return e / max(np.linalg.norm(e), 1e-12)


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    model_dir, sentences, out = sys.argv[1:]
    from tokenizers import Tokenizer

    cfg = json.load(open(os.path.join(model_dir, "config.json")))
    w = read_safetensors(os.path.join(model_dir, "model.safetensors"))
    tok = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    tok.enable_truncation(max_length=cfg["max_position_embeddings"])
    tok.no_padding()
    texts = [l.rstrip("\n") for l in open(sentences, encoding="utf-8") if l.strip()]
    tmp = out + ".tmp"
    with open(tmp, "w") as f:
        for t in texts:
            ids = tok.encode(t).ids
            e = encode(cfg, w, np.array(ids))
            f.write(json.dumps({"text": t, "ids": ids, "embedding": [float(v) for v in e]}) + "\n")
    os.replace(tmp, out)


if __name__ == "__main__":
    main()
