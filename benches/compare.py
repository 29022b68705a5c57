#!/usr/bin/env python3
"""Latency of the fixture models: kiln's CPU runtime vs PyTorch eager vs ONNX
Runtime, in one run, single-threaded, same inputs.

    cargo build --release -p kiln-compiler
    /path/to/venv/bin/python benches/compare.py [--runs 200] [--models mlp cnn transformer]

Needs torch (and optionally onnxruntime + onnx + onnxscript) in the Python
environment; never run in CI. Prints a Markdown table; results with the command
that produced them are recorded in benches/RESULTS.md.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
KILN = ROOT / "target" / "release" / "kiln"


def inputs_of(d: Path):
    out, i = [], 0
    while (d / f"input_{i}.npy").exists():
        out.append(np.load(d / f"input_{i}.npy"))
        i += 1
    return out


def median_ms(fn, runs):
    fn()  # warm-up
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def bench_torch(pt2: Path, xs, runs):
    module = torch.export.load(str(pt2)).module()
    ts = [torch.from_numpy(x) for x in xs]
    with torch.no_grad():
        return median_ms(lambda: module(*ts), runs)


def bench_ort(pt2: Path, xs, runs):
    try:
        import onnxruntime as ort
    except ImportError:
        return None
    module = torch.export.load(str(pt2)).module()
    ts = tuple(torch.from_numpy(x) for x in xs)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "m.onnx")
        try:
            torch.onnx.export(module, ts, path, dynamo=True)
        except Exception as e:  # export coverage differs per model
            print(f"  onnx export failed for {pt2}: {type(e).__name__}: {e}"[:200], file=sys.stderr)
            return None
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        opts.inter_op_num_threads = 1
        sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
        feed = {i.name: x for i, x in zip(sess.get_inputs(), xs)}
        return median_ms(lambda: sess.run(None, feed), runs)


def bench_kiln(pt2: Path, d: Path, runs):
    with tempfile.TemporaryDirectory() as tmp:
        art = os.path.join(tmp, "m.kiln")
        subprocess.run([str(KILN), "compile", str(pt2), "-o", art], check=True, capture_output=True)
        args = [str(KILN), "run", art, "--json", "--repeat", str(runs)]
        for i in range(len(inputs_of(d))):
            args += ["--input", f"{i}={d / f'input_{i}.npy'}"]
        out = subprocess.run(args, check=True, capture_output=True, text=True).stdout
        return json.loads(out)["latency"]["median_ms"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--models", nargs="*", default=["mlp", "cnn", "transformer"])
    ap.add_argument("--flavour", default="aten")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if not KILN.exists():
        sys.exit(f"{KILN} missing: run `cargo build --release -p kiln-compiler` first")
    print(f"torch {torch.__version__}, 1 thread, median of {args.runs} runs, {args.flavour}.pt2\n")
    print("| model | kiln (ms) | PyTorch eager (ms) | ONNX Runtime (ms) |")
    print("|---|---|---|---|")
    for name in args.models:
        d = FIXTURES / name
        pt2 = d / f"{args.flavour}.pt2"
        xs = inputs_of(d)
        k = bench_kiln(pt2, d, args.runs)
        t = bench_torch(pt2, xs, args.runs)
        o = bench_ort(pt2, xs, args.runs)
        fmt = lambda v: "n/a" if v is None else f"{v:.4f}"
        print(f"| {name} | {fmt(k)} | {fmt(t)} | {fmt(o)} |")


if __name__ == "__main__":
    main()
