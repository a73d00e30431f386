#!/usr/bin/env python3
"""ONNX Runtime's CPU provider on the same BERT-family sentence encoder,
built from the same weights (config.json + model.safetensors) with the
`onnx` package, as the peer of bench_bert (bench/bench_bert.c).

    python3 bench/ort_bert_peer.py MODEL_DIR SENTENCES [--threads 1,2]
        [--batches 1,8,32] [--seconds 3] [--optimize] [--check REF.jsonl]

The graph is what sentence-transformers computes for all-MiniLM-L6-v2:
embeddings (word + position + token type 0, LayerNorm), N post-LN layers,
mean pooling over the attention mask, L2 normalisation. ORT runs it with
all graph optimizations; --optimize also runs ORT's transformer optimizer
(onnxruntime.transformers, model_type bert) first. Tokenization (the
`tokenizers` package, from tokenizer.json) is outside the timed region, as
it is in bench_bert.

Prints one JSON line per (threads, batch): sentences/s over a stream of the
sentences in batches (each padded to its longest), and single-request
latency percentiles at batch 1. Needs numpy, onnx, onnxruntime, tokenizers
(pip).
"""
import argparse
import json
import os
import struct
import sys
import tempfile
import time

import numpy as np


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        base = 8 + n
        data = f.read()
    out = {}
    for name, v in header.items():
        if name == "__metadata__":
            continue
        a, b = v["data_offsets"]
        dt = {"F32": np.float32, "F16": np.float16, "I64": np.int64}[v["dtype"]]
        out[name] = np.frombuffer(data[a:b], dtype=dt).reshape(v["shape"]).astype(
            np.float32 if dt != np.int64 else np.int64)
    return out


def build_onnx(cfg, w, path):
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    H = cfg["hidden_size"]
    nh = cfg["num_attention_heads"]
    dh = H // nh
    eps = cfg["layer_norm_eps"]
    nodes, inits = [], []

    def init(name, arr):
        inits.append(numpy_helper.from_array(np.ascontiguousarray(arr), name))
        return name

    cnt = [0]

    def node(op, ins, **attrs):
        cnt[0] += 1
        out = f"{op.lower()}_{cnt[0]}"
        nodes.append(helper.make_node(op, ins, [out], **attrs))
        return out

    def linear(x, prefix):
        y = node("MatMul", [x, init(prefix + ".wT", w[prefix + ".weight"].T)])
        return node("Add", [y, init(prefix + ".b", w[prefix + ".bias"])])

    def layer_norm(x, prefix):
        return node("LayerNormalization",
                    [x, init(prefix + ".g", w[prefix + ".weight"]), init(prefix + ".beta", w[prefix + ".bias"])],
                    axis=-1, epsilon=eps)

    def gelu(x):
        # exact erf form: 0.5 x (1 + erf(x / sqrt 2))
        e = node("Erf", [node("Div", [x, init(f"sqrt2_{cnt[0]}", np.array(np.sqrt(2.0), np.float32))])])
        one = init(f"one_{cnt[0]}", np.array(1.0, np.float32))
        half = init(f"half_{cnt[0]}", np.array(0.5, np.float32))
        return node("Mul", [node("Mul", [x, node("Add", [e, one])]), half])

    ids = "input_ids"
    mask = "attention_mask"
    shape_ids = node("Shape", [ids])
    seq = node("Slice", [shape_ids, init("one_a", np.array([1], np.int64)), init("two_a", np.array([2], np.int64))])
    pos = node("Slice", [init("pos", w["embeddings.position_embeddings.weight"]), init("zero_a", np.array([0], np.int64)),
                         seq, init("axis0", np.array([0], np.int64))])
    x = node("Add", [node("Gather", [init("word", w["embeddings.word_embeddings.weight"]), ids]), pos])
    x = node("Add", [x, init("type0", w["embeddings.token_type_embeddings.weight"][0])])
    x = layer_norm(x, "embeddings.LayerNorm")
    maskf = node("Cast", [mask], to=TensorProto.FLOAT)
    # additive key mask [B, 1, 1, S]: 0 for tokens, -10000 for padding
    bias = node("Mul", [node("Sub", [init("onef", np.array(1.0, np.float32)), maskf]),
                        init("neg", np.array(-10000.0, np.float32))])
    bias = node("Unsqueeze", [bias, init("ax12", np.array([1, 2], np.int64))])
    heads_shape = init("heads_shape", np.array([0, 0, nh, dh], np.int64))
    merge_shape = init("merge_shape", np.array([0, 0, H], np.int64))
    scale = init("scale", np.array(1.0 / np.sqrt(dh), np.float32))
    for i in range(cfg["num_hidden_layers"]):
        p = f"encoder.layer.{i}."
        q = node("Transpose", [node("Reshape", [linear(x, p + "attention.self.query"), heads_shape])], perm=[0, 2, 1, 3])
        k = node("Transpose", [node("Reshape", [linear(x, p + "attention.self.key"), heads_shape])], perm=[0, 2, 3, 1])
        v = node("Transpose", [node("Reshape", [linear(x, p + "attention.self.value"), heads_shape])], perm=[0, 2, 1, 3])
        s = node("Add", [node("Mul", [node("MatMul", [q, k]), scale]), bias])
        a = node("MatMul", [node("Softmax", [s], axis=-1), v])
        a = node("Reshape", [node("Transpose", [a], perm=[0, 2, 1, 3]), merge_shape])
        x = layer_norm(node("Add", [linear(a, p + "attention.output.dense"), x]), p + "attention.output.LayerNorm")
        h = gelu(linear(x, p + "intermediate.dense"))
        x = layer_norm(node("Add", [linear(h, p + "output.dense"), x]), p + "output.LayerNorm")
    m3 = node("Unsqueeze", [maskf, init("ax2", np.array([2], np.int64))])
    summed = node("ReduceSum", [node("Mul", [x, m3]), init("ax1", np.array([1], np.int64))], keepdims=0)
    count = node("ReduceSum", [maskf, init("ax1b", np.array([1], np.int64))], keepdims=1)
    mean = node("Div", [summed, node("Max", [count, init("tiny", np.array(1e-9, np.float32))])])
    norm = node("Sqrt", [node("ReduceSum", [node("Mul", [mean, mean]), init("ax1c", np.array([1], np.int64))],
                               keepdims=1)])
    out = node("Div", [mean, node("Max", [norm, init("tiny2", np.array(1e-12, np.float32))])])
    nodes.append(helper.make_node("Identity", [out], ["embedding"]))
    graph = helper.make_graph(
        nodes, "bert",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
         helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "seq"])],
        [helper.make_tensor_value_info("embedding", TensorProto.FLOAT, ["batch", H])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)


def batches_of(ids_list, b):
    for i in range(0, len(ids_list), b):
        chunk = ids_list[i:i + b]
        S = max(len(t) for t in chunk)
        ids = np.zeros((len(chunk), S), np.int64)
        mask = np.zeros((len(chunk), S), np.int64)
        for r, t in enumerate(chunk):
            ids[r, :len(t)] = t
            mask[r, :len(t)] = 1
        yield ids, mask


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model_dir")
    ap.add_argument("sentences")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--optimize", action="store_true")
    ap.add_argument("--check", default=None, help="reference JSON lines with 'embedding' to compare against")
    a = ap.parse_args()

    import onnxruntime as ort
    from tokenizers import Tokenizer

    cfg = json.load(open(os.path.join(a.model_dir, "config.json")))
    w = read_safetensors(os.path.join(a.model_dir, "model.safetensors"))
    tmp = tempfile.mkdtemp()
    path = os.path.join(tmp, "bert.onnx")
    build_onnx(cfg, w, path)
    variant = "ort"
    if a.optimize:
        from onnxruntime.transformers import optimizer
        opt = optimizer.optimize_model(path, model_type="bert", num_heads=cfg["num_attention_heads"],
                                       hidden_size=cfg["hidden_size"], opt_level=0)
        path = os.path.join(tmp, "bert_opt.onnx")
        opt.save_model_to_file(path)
        variant = "ort_optimized"
    tok = Tokenizer.from_file(os.path.join(a.model_dir, "tokenizer.json"))
    tok.enable_truncation(max_length=cfg["max_position_embeddings"])
    tok.no_padding()  # tokenizer.json pads to 128; batches pad to their longest here
    texts = [l.rstrip("\n") for l in open(a.sentences, encoding="utf-8") if l.strip()]
    ids_list = [e.ids for e in tok.encode_batch(texts)]
    tokens = sum(len(t) for t in ids_list)

    for threads in [int(x) for x in a.threads.split(",")]:
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        if a.check and threads == int(a.threads.split(",")[0]):
            ref = [json.loads(l)["embedding"] for l in open(a.check)]
            worst = 1.0
            for (ids, mask), r in zip(batches_of(ids_list, 1), ref):
                e = sess.run(None, {"input_ids": ids, "attention_mask": mask})[0][0].astype(np.float64)
                r = np.array(r)
                worst = min(worst, float(e @ r / np.linalg.norm(e) / np.linalg.norm(r)))
            print(f"# {variant}: min cosine against the reference {worst:.9f}", file=sys.stderr)
        for b in [int(x) for x in a.batches.split(",")]:
            feeds = [{"input_ids": i, "attention_mask": m} for i, m in batches_of(ids_list, b)]
            for f in feeds[:3]:
                sess.run(None, f)  # warm up
            lat = []
            done = 0
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < a.seconds or done < len(ids_list):
                for f in feeds:
                    s = time.perf_counter()
                    sess.run(None, f)
                    lat.append(time.perf_counter() - s)
                    done += f["input_ids"].shape[0]
            el = time.perf_counter() - t0
            lat = np.array(lat) * 1e3
            print(json.dumps({"bench": "bert_cpu", "impl": variant, "threads": threads, "batch": b,
                              "sentences": len(ids_list), "tokens_per_pass": tokens,
                              "sentences_per_s": round(done / el, 1),
                              "p50_ms": round(float(np.percentile(lat, 50)), 3),
                              "p99_ms": round(float(np.percentile(lat, 99)), 3)}), flush=True)


if __name__ == "__main__":
    main()
