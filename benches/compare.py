#!/usr/bin/env python3
"""Latency of kiln's CPU runtime vs PyTorch eager vs ONNX Runtime, in one run,
on the same models and inputs, at each thread count asked for; prints the
ratio table (kiln / ONNX Runtime: below 1 means kiln is faster).

    cargo build --release -p kiln-compiler
    /path/to/venv/bin/python benches/compare.py [--runs 200] [--threads 1 2] [--models mlp cnn transformer]
    /path/to/venv/bin/python benches/real_models.py            # the real-size models, once
    /path/to/venv/bin/python benches/compare.py --real [--models mlp resnet18 mobilenet_v2 bert llama]
    /path/to/venv/bin/python benches/compare.py --real --baseline /path/to/main/kiln [--rounds 3]

`--baseline` compares this build with another kiln binary (and ONNX Runtime),
alternated round by round, by minimum latency (see `ab`).

Without --real the models are the committed fixtures (tests/fixtures/<model>);
with it, the real-size programs that benches/real_models.py writes under
target/bench-models. Needs torch (and optionally onnxruntime + onnx +
onnxscript) in the Python environment; never run in CI. Prints Markdown;
results with the command that produced them go to benches/RESULTS.md.
The three runtimes are measured interleaved per model and thread count, so
load from other jobs on the machine hits them alike; the ratios matter more
than the times.
"""
import argparse
import contextlib
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
REAL = ROOT / "target" / "bench-models"
KILN = ROOT / "target" / "release" / "kiln"


def inputs_of(d: Path):
    out, i = [], 0
    while (d / f"input_{i}.npy").exists():
        out.append(np.load(d / f"input_{i}.npy"))
        i += 1
    return out


def median_ms(fn, runs):
    for _ in range(min(10, runs)):  # warm-up
        fn()
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def torch_runner(pt2: Path, xs):
    module = torch.export.load(str(pt2)).module()
    ts = [torch.from_numpy(x) for x in xs]

    def run():
        with torch.no_grad():
            module(*ts)

    return run


def onnx_export(pt2: Path, xs, path):
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        return False
    module = torch.export.load(str(pt2)).module()
    ts = tuple(torch.from_numpy(x) for x in xs)
    try:
        with contextlib.redirect_stdout(sys.stderr):  # keep the table clean
            torch.onnx.export(module, ts, path, dynamo=True)
    except Exception as e:  # export coverage differs per model
        print(f"  onnx export failed for {pt2}: {type(e).__name__}: {e}"[:200], file=sys.stderr)
        return False
    return True


def ort_kernel_times(trace_path):
    """ONNX Runtime's profile trace (`SessionOptions.enable_profiling`): per
    node, in the order it first ran, (op, input shapes, [µs of each run])."""
    nodes = {}
    for e in json.load(open(trace_path)):
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            name = e["name"][: -len("_kernel_time")]
            args = e["args"]
            nodes.setdefault(name, (args.get("op_name", "?"), args.get("input_type_shape"), []))[2].append(e["dur"])
    return nodes


def ort_runner(path, xs, threads):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
    feed = {i.name: x for i, x in zip(sess.get_inputs(), xs)}
    return lambda: sess.run(None, feed)


def kiln_has_threads_flag(kiln=KILN):
    out = subprocess.run([str(kiln), "run", "--help"], capture_output=True, text=True).stdout
    return "--threads" in out


def bench_kiln(art, d: Path, n_inputs, runs, threads, kiln=KILN, stat="median_ms"):
    args = [str(kiln), "run", art, "--json", "--repeat", str(runs)]
    if kiln_has_threads_flag(kiln):
        args += ["--threads", str(threads)]
    elif threads != 1:
        return None  # this kiln runs one thread only
    for i in range(n_inputs):
        args += ["--input", f"{i}={d / f'input_{i}.npy'}"]
    env = dict(os.environ, KILN_NUM_THREADS=str(threads))
    out = subprocess.run(args, check=True, capture_output=True, text=True, env=env).stdout
    return json.loads(out)["latency"][stat]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--threads", type=int, nargs="*", default=[1])
    ap.add_argument("--real", action="store_true", help="the real-size models of benches/real_models.py")
    ap.add_argument("--models", nargs="*")
    ap.add_argument("--flavour", default="aten")
    ap.add_argument("--baseline", type=Path,
                    help="another kiln binary (e.g. main's build): A/B against it, the two alternated "
                         "--rounds times; each cell is the best of the rounds' minimum latencies")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    if args.baseline:
        return ab(args)
    root = REAL if args.real else FIXTURES
    models = args.models or (["mlp", "resnet18", "mobilenet_v2", "bert", "llama"] if args.real
                             else ["mlp", "cnn", "transformer"])
    if not KILN.exists():
        sys.exit(f"{KILN} missing: run `cargo build --release -p kiln-compiler` first")
    print(f"torch {torch.__version__}, median of {args.runs} runs, {args.flavour}.pt2, {root.relative_to(ROOT)}\n")
    print("| model | threads | kiln (ms) | PyTorch eager (ms) | ONNX Runtime (ms) | kiln / ORT |")
    print("|---|---|---|---|---|---|")
    fmt = lambda v: "n/a" if v is None else f"{v:.4f}"
    with tempfile.TemporaryDirectory() as tmp:
        for name in models:
            d = root / name
            pt2 = d / f"{args.flavour}.pt2"
            xs = inputs_of(d)
            art = os.path.join(tmp, f"{name}.kiln")
            subprocess.run([str(KILN), "compile", str(pt2), "-o", art], check=True, capture_output=True)
            onnx = os.path.join(tmp, f"{name}.onnx")
            has_onnx = onnx_export(pt2, xs, onnx)
            run_torch = torch_runner(pt2, xs)
            for threads in args.threads:
                torch.set_num_threads(threads)
                k = bench_kiln(art, d, len(xs), args.runs, threads)
                t = median_ms(run_torch, args.runs)
                o = median_ms(ort_runner(onnx, xs, threads), args.runs) if has_onnx else None
                ratio = "n/a" if k is None or o is None else f"{k / o:.2f}"
                print(f"| {name} | {threads} | {fmt(k)} | {fmt(t)} | {fmt(o)} | {ratio} |", flush=True)


def ab(args):
    """kiln (target/release/kiln) against `--baseline` and ONNX Runtime, the
    three alternated `--rounds` times on the same inputs; minimum latency
    per run of `--runs` (min of the rounds): on a shared machine the
    minimum is the run least disturbed by others."""
    root = REAL if args.real else FIXTURES
    models = args.models or ["resnet18", "mobilenet_v2"]
    print(f"min of {args.rounds} rounds × {args.runs} runs, {args.flavour}.pt2, baseline {args.baseline}\n")
    print("| model | threads | baseline kiln (ms) | kiln (ms) | ONNX Runtime (ms) | kiln / baseline | kiln / ORT |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for name in models:
            d = root / name
            pt2 = d / f"{args.flavour}.pt2"
            xs = inputs_of(d)
            arts = {}
            for tag, kiln in [("base", args.baseline), ("new", KILN)]:
                arts[tag] = os.path.join(tmp, f"{name}-{tag}.kiln")
                subprocess.run([str(kiln), "compile", str(pt2), "-o", arts[tag]], check=True, capture_output=True)
            onnx = os.path.join(tmp, f"{name}.onnx")
            if not onnx_export(pt2, xs, onnx):
                onnx = None
            for threads in args.threads:
                best = {"base": float("inf"), "new": float("inf"), "ort": float("inf")}
                ort = ort_runner(onnx, xs, threads) if onnx else None
                for _ in range(args.rounds):
                    for tag, kiln in [("base", args.baseline), ("new", KILN)]:
                        v = bench_kiln(arts[tag], d, len(xs), args.runs, threads, kiln, "min_ms")
                        best[tag] = min(best[tag], v if v is not None else float("inf"))
                    if ort:
                        for _ in range(min(10, args.runs)):
                            ort()
                        for _ in range(args.runs):
                            t = time.perf_counter()
                            ort()
                            best["ort"] = min(best["ort"], (time.perf_counter() - t) * 1e3)
                b, k, o = best["base"], best["new"], best["ort"]
                ratio = "n/a" if o == float("inf") else f"{k / o:.2f}"
                print(f"| {name} | {threads} | {b:.3f} | {k:.3f} | {o:.3f} | {k / b:.2f} | {ratio} |", flush=True)


if __name__ == "__main__":
    main()
