#!/usr/bin/env python3
"""sentence-transformers (PyTorch eager) on the same encoder, sentences and
batches as bench_bert: the GPU peer of issue 27.

    python3 bench/st_bert_peer.py MODEL_DIR SENTENCES [--batches 1,8,32]
        [--dtypes f32,f16] [--seconds 3] [--device cuda]

MODEL_DIR holds config.json, model.safetensors and vocab.txt (a BERT model
directory; sentence-transformers adds mean pooling, and the L2
normalisation is applied after it, as all-MiniLM-L6-v2's pipeline does).
Tokenization is done once, outside the timed region (as in bench_bert);
each timed step is the model's forward on one batch, padded to its longest
sentence, with the device synchronized. Prints one JSON line per (dtype,
batch): sentences/s and p50/p99 ms of a batch.
"""
import argparse
import json
import time

import numpy as np
import torch
from sentence_transformers import SentenceTransformer


def sync(device):
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model_dir")
    ap.add_argument("sentences")
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--dtypes", default="f32,f16")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()
    texts = [l.rstrip("\n") for l in open(a.sentences, encoding="utf-8") if l.strip()]
    for dt in a.dtypes.split(","):
        model = SentenceTransformer(a.model_dir, device=a.device)
        model.max_seq_length = 512
        if dt == "f16":
            model = model.half()
        model.eval()
        for b in [int(x) for x in a.batches.split(",")]:
            feats = []
            for i in range(0, len(texts), b):
                f = model.tokenize(texts[i:i + b])
                feats.append((len(texts[i:i + b]), {k: v.to(a.device) for k, v in f.items() if torch.is_tensor(v)}))
            with torch.inference_mode():
                for _, f in feats[:3]:
                    model(dict(f))
                sync(a.device)
                lat, done, t0 = [], 0, time.perf_counter()
                while time.perf_counter() - t0 < a.seconds:
                    for n, f in feats:
                        s = time.perf_counter()
                        e = model(dict(f))["sentence_embedding"]
                        e = torch.nn.functional.normalize(e, dim=1)
                        sync(a.device)
                        lat.append(time.perf_counter() - s)
                        done += n
                el = time.perf_counter() - t0
            lat = np.array(lat) * 1e3
            print(json.dumps({"bench": "bert_gpu", "impl": "sentence_transformers_eager", "dtype": dt, "batch": b,
                              "sentences": len(texts), "sentences_per_s": round(done / el, 1),
                              "p50_ms": round(float(np.percentile(lat, 50)), 3),
                              "p99_ms": round(float(np.percentile(lat, 99)), 3)}), flush=True)


if __name__ == "__main__":
    main()
