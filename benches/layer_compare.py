#!/usr/bin/env python3
"""kiln against ONNX Runtime layer by layer on a CNN, at one thread count.

    cargo build --release -p kiln-compiler
    /path/to/venv/bin/python benches/layer_compare.py --model mobilenet_v2 [--runs 50] [--rounds 3] [--threads 1]
    /path/to/venv/bin/python benches/layer_compare.py --model efficientnet_b0 --kiln /tmp/kiln-main

The model is target/bench-models/<model>/aten.pt2 (benches/real_models.py).
kiln's side is `kiln run --profile --json` (mean µs per instruction, each
with the torch node it came from); ONNX Runtime's is its own profiler
(`SessionOptions.enable_profiling`, a `dur` in µs per node run). The two
alternate in rounds of `--runs` runs; a layer's time is its fastest run
(`min_us` in kiln's profile), the one least disturbed by other jobs on a
shared machine — sums and means there mostly measure the load. Both follow the graph's order, so the n-th
convolution of one is the n-th of the other; kernel and input sizes are
checked to agree. ONNX Runtime fuses an activation (and, in its NCHWc layout, a
residual add) into the convolution, and kiln fuses the same into its
`conv_fused`, so a convolution row compares like with like. What is not a
convolution (layout reorders, pools, adds, means, the classifier) is
summed per op kind under the per-kind table. Where ONNX Runtime runs an
activation as a node of its own (EfficientNet's SiLU as `QuickGelu`),
the rows leave it out of ONNX Runtime's side while kiln's
include it: the last line adds them back for the whole model.

Prints Markdown: one row per convolution (kind, shape, kiln µs, ORT µs,
kiln / ORT), then the same summed per layer kind and shape class. Loaded
machines inflate both sides alike only roughly; run it on a quiet machine
or compare ratios, not times.
"""
import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import KILN, REAL, onnx_export, ort_kernel_times  # noqa: E402


def torch_convs(pt2: Path):
    """(node name, kind, shape text, (weight shape, input H×W)) per aten.convolution in graph order."""
    ep = torch.export.load(str(pt2))
    convs = []
    for node in ep.graph.nodes:
        if node.op != "call_function" or "convolution" not in str(node.target):
            continue
        x, w = node.args[0].meta["val"], node.args[1].meta["val"]
        stride, groups = node.args[3], node.args[8]
        kind, shape = layer_kind(tuple(x.shape), tuple(w.shape), stride[0], groups, not convs)
        convs.append((node.name, kind, shape, (tuple(w.shape), tuple(x.shape[2:]))))
    return convs


def layer_kind(x, w, stride, groups, first):
    """A layer's kind (stem, depthwise, expand, project, SE, dense) and its shape as text."""
    cin, h, wd = x[1], x[2], x[3]
    cout, kh, kw = w[0], w[2], w[3]
    shape = f"{cin}→{cout} {h}×{wd}"
    if first:
        return f"stem {kh}×{kw} s{stride}", shape
    if groups == cin and groups > 1:
        return f"depthwise {kh}×{kw} s{stride}", f"{cin} {h}×{wd}"
    if (kh, kw) == (1, 1):
        if h * wd == 1:
            return "SE 1×1", shape
        return ("expand 1×1" if cout > cin else "project 1×1"), shape
    return f"dense {kh}×{kw} s{stride}", shape


def kiln_compile(kiln: Path, pt2: Path, tmp):
    art = os.path.join(tmp, "model.kiln")
    subprocess.run([str(kiln), "compile", str(pt2), "-o", art], check=True, capture_output=True)
    return art


def kiln_round(kiln: Path, art, inputs, runs, threads):
    """µs of each instruction over one `kiln run --profile`: its fastest
    execution (`min_us`), or the mean where this kiln's profile has no
    minimum (older builds), with which of the two it is."""
    args = [str(kiln), "run", art, "--json", "--profile", "--repeat", str(runs), "--threads", str(threads)]
    for i, path in enumerate(inputs):
        args += ["--input", f"{i}={path}"]
    out = json.loads(subprocess.run(args, check=True, capture_output=True, text=True).stdout)
    has_min = all("min_us" in e for e in out["profile"])
    # total_us sums every run of the profiled session: the warm-up run, the
    # `--repeat` timed runs and the run whose outputs are reported.
    per_run = runs + 2
    times = {(e["instr"], e["kernel"], e["origin"]): e["min_us"] if has_min else e["total_us"] / per_run
             for e in out["profile"]}
    return times, has_min


def kiln_split(per_instr):
    """Convolution µs by torch node name; everything else by kernel name."""
    by_node, other = {}, collections.Counter()
    for (_, kernel, origin), us in per_instr.items():
        m = re.search(r"from `([^`]+)`", origin)
        if kernel == "conv_fused" and m:
            by_node[m.group(1)] = by_node.get(m.group(1), 0.0) + us
        else:
            other[kernel] += us
    return by_node, other


class OrtSession:
    def __init__(self, pt2: Path, inputs, threads, tmp):
        import onnxruntime as ort

        xs = [np.load(p) for p in inputs]
        onnx = os.path.join(tmp, "model.onnx")
        if not onnx_export(pt2, xs, onnx):
            sys.exit(f"{pt2}: no ONNX export")
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        opts.enable_profiling = True
        opts.profile_file_prefix = os.path.join(tmp, "ort")
        self.sess = ort.InferenceSession(onnx, opts, providers=["CPUExecutionProvider"])
        self.feed = {i.name: x for i, x in zip(self.sess.get_inputs(), xs)}
        self.sess.run(None, self.feed)  # warm-up, dropped from the trace below

    def run(self, runs):
        for _ in range(runs):
            self.sess.run(None, self.feed)

    def fastest(self):
        """Per node in execution order (ONNX Runtime's own topological order,
        not always the program's): (name, op, shapes, µs of its fastest run)."""
        nodes = ort_kernel_times(self.sess.end_profiling())
        # durs[0] is the warm-up run's.
        return [(name, op, shapes, float(min(durs[1:]))) for name, (op, shapes, durs) in nodes.items()]


def ort_split(nodes):
    """Convolutions as (name, µs, (weight shape, input H×W)) in order; other µs by op."""
    convs, other = [], collections.Counter()
    for name, op, shapes, us in nodes:
        if op in ("Conv", "FusedConv"):
            x, w = (tuple(next(iter(s.values()))) for s in shapes[:2])
            convs.append((name, us, (w, x[2:4])))
        else:
            other[op] += us
    return convs, other


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="mobilenet_v2")
    ap.add_argument("--runs", type=int, default=50, help="runs per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--kiln", type=Path, default=KILN)
    ap.add_argument("--root", type=Path, default=REAL, help="where <model>/aten.pt2 lives")
    args = ap.parse_args()
    d = args.root / args.model
    pt2 = d / "aten.pt2"
    inputs = sorted(str(p) for p in d.glob("input_*.npy"))
    convs = torch_convs(pt2)
    with tempfile.TemporaryDirectory() as tmp:
        art = kiln_compile(args.kiln, pt2, tmp)
        ort = OrtSession(pt2, inputs, args.threads, tmp)
        # Rounds alternate between the two, so that both meet the machine's
        # load alike; each instruction or node keeps its fastest run.
        k_best, k_min = {}, True
        for _ in range(args.rounds):
            times, has_min = kiln_round(args.kiln, art, inputs, args.runs, args.threads)
            k_min &= has_min
            for key, us in times.items():
                k_best[key] = min(k_best.get(key, float("inf")), us)
            ort.run(args.runs)
        o_conv, o_other = ort_split(ort.fastest())
    k_conv, k_other = kiln_split(k_best)
    o_conv = match_in_order(convs, o_conv)
    kiln_stat = "fastest run" if k_min else f"mean of a round's runs (this kiln reports no min_us)"
    print(f"{args.model}, {args.threads} thread(s), {args.rounds} alternated rounds of {args.runs} runs; "
          f"µs per layer: ONNX Runtime fastest run, kiln {kiln_stat}, over the rounds\n")
    print("| # | torch node | kind | shape | kiln µs | ORT µs | kiln / ORT |")
    print("|---|---|---|---|---|---|---|")
    kinds = collections.defaultdict(lambda: [0, 0.0, 0.0])
    for i, ((node, kind, shape, _), o_us) in enumerate(zip(convs, o_conv)):
        k_us = k_conv.get(node)
        if k_us is None:  # folded into another instruction (kiln's profile names it elsewhere)
            continue
        print(f"| {i} | {node} | {kind} | {shape} | {k_us:.1f} | {o_us:.1f} | {k_us / o_us:.2f} |")
        key = (kind, spatial_class(shape))
        kinds[key][0] += 1
        kinds[key][1] += k_us
        kinds[key][2] += o_us
    print("\n| kind | spatial | layers | kiln µs | ORT µs | kiln / ORT | kiln − ORT µs |")
    print("|---|---|---|---|---|---|---|")
    tot_k = tot_o = 0.0
    for (kind, spatial), (n, k_us, o_us) in sorted(kinds.items(), key=lambda kv: kv[1][2] - kv[1][1]):
        tot_k, tot_o = tot_k + k_us, tot_o + o_us
        print(f"| {kind} | {spatial} | {n} | {k_us:.0f} | {o_us:.0f} | {k_us / o_us:.2f} | {k_us - o_us:+.0f} |")
    print(f"| all convolutions | | {sum(v[0] for v in kinds.values())} | {tot_k:.0f} | {tot_o:.0f} | "
          f"{tot_k / tot_o:.2f} | {tot_k - tot_o:+.0f} |")
    print("\nNot convolutions (µs per run): kiln " + other_text(k_other) + "; ONNX Runtime " + other_text(o_other))
    # kiln applies every activation in its convolution's epilogue; ONNX
    # Runtime fuses only some (Clip, Relu) and runs the rest as nodes of
    # their own, which the rows above leave out of its side.
    separate = sum(us for op, us in o_other.items() if op in SEPARATE_ACTIVATIONS)
    if separate:
        print(f"\nONNX Runtime ran {separate:.0f} µs of activations outside its convolutions (kiln's are in its "
              f"rows): convolutions with them {tot_o + separate:.0f} µs, kiln / ORT {tot_k / (tot_o + separate):.2f}")


def match_in_order(convs, o_conv):
    """ONNX Runtime's time for each of the program's convolutions, both in
    graph order. ONNX Runtime's NCHWc layout pads channel counts up to its
    block (8 or 16), so a pair must agree on the kernel size and the input
    size, and ONNX Runtime's channel counts must be at least the program's."""
    if len(o_conv) != len(convs):
        sys.exit(f"ONNX Runtime ran {len(o_conv)} convolutions, the program has {len(convs)}")
    for (node, _, _, (w, hw)), (name, _, (o_w, o_hw)) in zip(convs, o_conv):
        same = w[2:] == o_w[2:] and hw == o_hw and o_w[0] >= w[0] and o_w[1] >= w[1]
        if not same:
            sys.exit(f"{node} (weight {w}, input {hw}) does not match ONNX Runtime's {name} ({o_w}, {o_hw})")
    return [us for _, us, _ in o_conv]


# ONNX Runtime ops that are a convolution's activation when not fused into it.
SEPARATE_ACTIVATIONS = {"QuickGelu", "Sigmoid", "HardSigmoid", "HardSwish", "Relu", "Clip"}


def spatial_class(shape):
    return shape.split()[-1]


def other_text(counter):
    parts = [f"{op} {us:.0f}" for op, us in counter.most_common()]
    return ", ".join(parts) + f" (sum {sum(counter.values()):.0f})"


if __name__ == "__main__":
    main()
