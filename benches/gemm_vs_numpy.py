#!/usr/bin/env python3
"""f32 GEMM: kiln vs numpy's OpenBLAS, at the same thread count, in one run.

    cargo build --release -p kiln-kernels --example gemm_gflops
    /work/torchvenv/bin/python benches/gemm_vs_numpy.py [--threads 1] [--isa x86-64-v3]

Runs kiln's `gemm_gflops` example (best of several runs per size) and
numpy's `a @ b` (OpenBLAS, `OPENBLAS_NUM_THREADS` pinned before numpy is
imported) on the same shapes, then prints a Markdown table: square n×n and
skinny [m, 512] × [512, 2048] (kiln with the weight packed once, numpy
with the transposed weight view, as a linear layer does), and the linear
layers of the BERT/Llama benchmark models (kiln's fused linear with its
bias and activation; numpy's `x @ w.T + b`, activation not counted).
`--isa` runs kiln on that level's kernel table instead of the best one
(e.g. the AVX2 table on an AVX-512 machine). Never run in CI;
results with this command go to benches/RESULTS.md.
"""
import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "target" / "release" / "examples" / "gemm_gflops"


def best_time(fn):
    fn()
    best, started, runs = float("inf"), time.perf_counter(), 0
    while runs < 3 or (time.perf_counter() - started < 0.5 and runs < 1000):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
        runs += 1
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--isa", help="kiln's kernel table level (default: the best this CPU runs)")
    ap.add_argument("--example", type=Path, default=EXAMPLE, help="the built gemm_gflops example")
    args = ap.parse_args()
    for var in ["OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"]:
        os.environ[var] = str(args.threads)
    import numpy as np  # after pinning the BLAS threads

    if not args.example.exists():
        sys.exit(f"{args.example} missing: cargo build --release -p kiln-kernels --example gemm_gflops")
    cmd = [str(args.example), str(args.threads)] + ([args.isa] if args.isa else [])
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    kiln = [json.loads(line) for line in out.splitlines() if line.strip()]

    rng = np.random.default_rng(0)
    rows = []
    for r in kiln:
        if r["kind"] == "square":
            n = r["n"]
            a, b = rng.standard_normal((n, n), dtype=np.float32), rng.standard_normal((n, n), dtype=np.float32)
            secs = best_time(lambda: a @ b)
            rows.append((f"square {n}", r["gflops"], 2 * n**3 / secs / 1e9, r["variant"]))
        elif r["kind"] == "conv3x3":
            continue  # kiln only (numpy has no convolution): see the raw JSON lines
        elif r["kind"] == "linear":
            m, k, n = r["m"], r["k"], r["n"]
            x, w = rng.standard_normal((m, k), dtype=np.float32), rng.standard_normal((n, k), dtype=np.float32)
            bias = rng.standard_normal(n, dtype=np.float32)
            secs = best_time(lambda: x @ w.T + bias)
            act = "" if r["activation"] == "none" else f" +{r['activation']}"
            rows.append((f"linear {m}×{k}→{n}{act}", r["gflops"], 2 * m * k * n / secs / 1e9, r["variant"]))
        else:
            m, k, n = r["m"], r["k"], r["n"]
            x, w = rng.standard_normal((m, k), dtype=np.float32), rng.standard_normal((n, k), dtype=np.float32)
            secs = best_time(lambda: x @ w.T)
            rows.append((f"skinny m={m} ({k}→{n})", r["gflops"], 2 * m * k * n / secs / 1e9, r["variant"]))
    print(f"threads: {args.threads}; numpy {np.__version__}")
    print("| shape | kiln GFLOP/s | numpy (OpenBLAS) GFLOP/s | kiln / numpy | kiln microkernel |")
    print("|---|---|---|---|---|")
    for name, k_gf, np_gf, variant in rows:
        print(f"| {name} | {k_gf:.1f} | {np_gf:.1f} | {k_gf / np_gf:.2f} | {variant} |")


if __name__ == "__main__":
    main()
