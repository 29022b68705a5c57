#!/usr/bin/env python3
"""int8-static CNNs layer by layer, kiln vs ONNX Runtime: each kiln
convolution's time (`kiln run --profile --json`, the least of `--reps`
profiles of `--runs` runs) beside the ONNX Runtime static QDQ model's
`QLinearConv` node in the same place (`enable_profiling`, median `dur` of
its `_kernel_time` events), one thread each, and the other nodes' total.

    cargo build --release -p kiln-compiler
    /path/to/venv/bin/python benches/quant_layers.py [--models resnet18 mobilenet_v2] [--runs 30] [--reps 3]

Convolutions are paired in execution order (kiln's instructions and ONNX
Runtime's nodes both follow the program), so a row pairs the same layer
while both run every convolution as one node — except where the two
schedule a block's branches differently (ResNet's 1×1 downsample: kiln
runs it before the block's second 3×3, ONNX Runtime after; the ratio of
such a pair is meaningless, the sum of the pair is not). ONNX Runtime's
`QLinearAdd` nodes are kiln's residual adds, fused into kiln's
convolutions. Never run in CI; prints Markdown.
"""
import argparse
import collections
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import KILN, REAL, inputs_of, onnx_export, ort_kernel_times  # noqa: E402
from quant_models import kiln_compile, ort_quantized, samples, write_calibration  # noqa: E402


def kiln_layers(art: Path, d: Path, runs: int, reps: int):
    """[(instr, kernel, origin, µs per run)] in execution order, the least of `reps` profiles."""
    best = {}
    for _ in range(reps):
        args = [str(KILN), "run", str(art), "--input", f"0={d / 'input_0.npy'}", "--threads", "1", "--repeat",
                str(runs), "--profile", "--json"]
        for p in json.loads(subprocess.run(args, check=True, capture_output=True, text=True).stdout)["profile"]:
            us = p["total_us"] / p["runs"]  # the warm-up and reported runs are profiled too
            key = p["instr"]
            if key not in best or us < best[key][2]:
                best[key] = (p["kernel"], p["origin"].split(" at ")[0], us)
    return [(i, *best[i]) for i in sorted(best)]


def ort_nodes(model: Path, x, runs: int, tmp: Path):
    """[(op, name, median µs)] of one-thread ONNX Runtime, in execution order (its trace file in `tmp`)."""
    import onnxruntime as ort
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = opts.inter_op_num_threads = 1
    opts.enable_profiling = True
    opts.profile_file_prefix = str(tmp / "ort_profile")
    sess = ort.InferenceSession(str(model), opts, providers=["CPUExecutionProvider"])
    feed = {sess.get_inputs()[0].name: x}
    for _ in range(runs + 5):
        sess.run(None, feed)
    nodes = ort_kernel_times(sess.end_profiling())
    return [(op, n, float(np.median(durs[5:]))) for n, (op, _, durs) in nodes.items()]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="*", default=["resnet18", "mobilenet_v2"])
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    for model in args.models:
        d = REAL / model
        xs = inputs_of(d)
        with tempfile.TemporaryDirectory() as t:
            tmp = Path(t)
            calib = samples(xs[0])
            write_calibration(tmp / "calib", calib)
            kiln_compile(d / "aten.pt2", tmp / "static.kiln", "int8-static", tmp / "calib")
            if not onnx_export(d / "aten.pt2", xs, str(tmp / "model.onnx")):
                raise SystemExit(f"{model}: no ONNX export")
            _, static = ort_quantized(tmp / "model.onnx", tmp, calib)
            kiln = kiln_layers(tmp / "static.kiln", d, args.runs, args.reps)
            ort = ort_nodes(static, xs[0], args.runs, tmp)
        convs = iter([n for n in ort if n[0] == "QLinearConv"])
        print(f"\n{model}, 1 thread, µs per run\n")
        print("| instr | kiln kernel | kiln µs | ORT QLinearConv µs | kiln / ORT | layer |")
        print("|---|---|---|---|---|---|")
        k_conv = o_conv = 0.0
        for instr, kernel, origin, us in kiln:
            o = next(convs, None) if kernel == "quant_conv" else None
            if o:
                k_conv, o_conv = k_conv + us, o_conv + o[2]
            cells = f"{o[2]:.1f} | {us / o[2]:.2f}" if o else "- | -"
            print(f"| {instr} | {kernel} | {us:.1f} | {cells} | {origin} |")
        k_total = sum(r[3] for r in kiln)
        o_total = sum(n[2] for n in ort)
        by_op = collections.Counter()
        for op, _, us in ort:
            by_op[op] += us
        others = ", ".join(f"{op} {us:.0f}" for op, us in by_op.most_common() if op != "QLinearConv")
        print(f"\nconvolutions: kiln {k_conv:.0f} µs, ORT {o_conv:.0f} µs ({k_conv / o_conv:.2f}); "
              f"all: kiln {k_total:.0f} µs, ORT {o_total:.0f} µs ({k_total / o_total:.2f}); ORT's other nodes: {others}")


if __name__ == "__main__":
    main()
