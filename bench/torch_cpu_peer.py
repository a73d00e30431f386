#!/usr/bin/env python3
"""PyTorch on the CPU for w1-w3 at their largest sizes: the reference for
bench_cpu, run on the same machine in the same call.

    python3 bench/torch_cpu_peer.py [--modes eager,compile_static,compile_dynamic]

The models and byte counts are those of ../shared/peers/torch_peer.py (which
runs on CUDA only); f32, random inputs, all of torch's CPU threads, the
median of 20 calls after 3 warm-up calls (torch.compile compiles in the
warm-up). One JSON object per line, joinable with bench_cpu's on workload
and S.
"""
import argparse, json, time

import torch
import torch.nn.functional as F


def w1(x, a, b):
    return F.gelu(x * a + b) * torch.sigmoid(x)


def w2(x, r, g, b):
    h = x + r
    return F.gelu(F.layer_norm(h, (h.shape[-1],), g, b, 1e-5)), h


def w3(scores, mask):
    return torch.softmax(scores * 0.125 + mask, dim=-1)


def inputs(name):
    if name == "w1":
        S, H = 16384, 4096
        return S, (torch.randn(S, H), torch.randn(H), torch.randn(H)), (2 * S * H + 2 * H) * 4
    if name == "w2":
        S, H = 32768, 768
        return S, (torch.randn(S, H), torch.randn(S, H), torch.randn(H), torch.randn(H)), (4 * S * H + 2 * H) * 4
    S, BH = 2048, 12
    m = torch.zeros(BH, 1, S)
    m[..., (3 * S) // 4:] = -1e4
    return S, (torch.randn(BH, S, S), m), (2 * BH * S * S + BH * S) * 4


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--modes", default="eager,compile_static,compile_dynamic")
    ap.add_argument("--workloads", default="w1,w2,w3")
    args = ap.parse_args()
    fns = {"w1": w1, "w2": w2, "w3": w3}
    print(json.dumps({"torch": torch.__version__, "threads": torch.get_num_threads()}), flush=True)
    for name in args.workloads.split(","):
        S, ins, nbytes = inputs(name)
        for mode in args.modes.split(","):
            torch._dynamo.reset()
            f = fns[name]
            if mode == "compile_static":
                f = torch.compile(f, dynamic=False)
            elif mode == "compile_dynamic":
                f = torch.compile(f, dynamic=True)
            t0 = time.perf_counter()
            for _ in range(3):
                f(*ins)
            warm_s = time.perf_counter() - t0
            ts = []
            for _ in range(20):
                t0 = time.perf_counter()
                f(*ins)
                ts.append(time.perf_counter() - t0)
            ts.sort()
            ms = ts[len(ts) // 2] * 1e3
            print(json.dumps({"workload": name, "mode": mode, "backend": "torch_cpu", "dtype": "float32", "S": S,
                              "median_ms": round(ms, 4), "GBps": round(nbytes / ms / 1e6, 3),
                              "warmup_s": round(warm_s, 2)}), flush=True)


if __name__ == "__main__":
    main()
