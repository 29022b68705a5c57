#!/usr/bin/env python3
"""Native code vs the portable kernels (issue "Native code", its benchmark
target): every model compiled with `--target cpu` and `--target x86_64`,
compile time and run latency of both measured in one run, A and B
alternated so that load from other programs hits both alike.

    cargo build --release -p kiln-compiler --features native
    /path/to/venv/bin/python benches/real_models.py --models efficientnet_b0 convnext_tiny bert llama
    python3 benches/native.py [--models ...] [--runs 30] [--rounds 5] [--threads 1] [--profile] [--split-epilogues]

Prints one table row per model: compile time (min of --compile-rounds, each
target), run latency (min and median of `kiln run --repeat RUNS`, per
target: the least of the rounds' minima and the median of the rounds'
medians), the ratios, and how much the rounds' medians of one artifact
spread (max/min − 1: the noise). With --profile, each artifact's time per
kernel kind (one `kiln run --profile` of RUNS runs), the elementwise
groups' and the row kernels' (softmax, norms, last-axis reductions) time
and share first: what native code can speed up at most. With
--split-epilogues a third artifact, `--target x86_64 --no-row-epilogues`
(elementwise calls after row functions kept as calls of their own), runs in
the same alternation, and the table gains its columns and the ratio of
merged to split epilogues. Needs no Python packages.
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

ROOT = Path(__file__).resolve().parent.parent
KILN = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target")) / "release" / "kiln"
MODELS = ROOT / "target" / "bench-models"
TARGETS = ("cpu", "x86_64")
# The third artifact of --split-epilogues: native code without merged epilogues.
SPLIT = "split"


def compile_once(pt2: Path, art: str, target: str, cpu=None) -> float:
    split = target == SPLIT
    target = "x86_64" if split else target
    args = [str(KILN), "compile", str(pt2), "-o", art, "--target", target]
    if cpu and target != "cpu":
        args += ["--cpu", cpu]
    if split:
        args.append("--no-row-epilogues")
    t = time.perf_counter()
    subprocess.run(args, check=True, capture_output=True)
    return time.perf_counter() - t


def inputs_args(d: Path):
    args = []
    for i in range(16):
        p = d / f"input_{i}.npy"
        if not p.exists():
            break
        args += ["--input", f"{i}={p}"]
    return args


def run(art: str, d: Path, runs: int, threads: int, profile=False):
    args = [str(KILN), "run", art, "--json", "--repeat", str(runs), "--threads", str(threads)] + inputs_args(d)
    if profile:
        args.append("--profile")
    out = subprocess.run(args, check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def kernel_times(doc, runs):
    """µs per run of each kernel kind."""
    by = {}
    for p in doc.get("profile") or []:
        by[p["kernel"]] = by.get(p["kernel"], 0.0) + p["total_us"] / (runs + 1)
    return by


# The kernel kinds native code replaces: the portable fused kernel and the native call;
# the row kernels (softmax, norms, last-axis reductions) and the native row functions.
ELEMENTWISE = ("fused", "native_call")
ROWS = ("softmax", "log_softmax", "layer_norm", "rms_norm", "reduce_sum", "reduce_mean", "reduce_max", "native_kernel")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="*", default=["efficientnet_b0", "convnext_tiny", "bert", "llama"])
    ap.add_argument("--dir", type=Path, default=MODELS, help="where benches/real_models.py wrote the models")
    ap.add_argument("--runs", type=int, default=30, help="`kiln run --repeat` per round")
    ap.add_argument("--rounds", type=int, default=5, help="A/B rounds of runs")
    ap.add_argument("--compile-rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--flavour", default="aten")
    ap.add_argument("--cpu", help="--cpu levels of the x86_64 artifacts (default: the compiler's)")
    ap.add_argument("--split-epilogues", action="store_true",
                    help="also `--target x86_64 --no-row-epilogues`, in the same alternation")
    ap.add_argument("--profile", action="store_true",
                    help="also --rounds profiled A/B runs: time per kernel kind, and the elementwise groups' time")
    args = ap.parse_args()
    targets = TARGETS + ((SPLIT,) if args.split_epilogues else ())
    if not KILN.exists():
        sys.exit(f"{KILN} missing: cargo build --release -p kiln-compiler --features native")
    print(f"{KILN}; {args.rounds} rounds × {args.runs} runs, {args.threads} thread(s), "
          f"compile min of {args.compile_rounds}; load average {os.getloadavg()[0]:.1f} at start\n")
    split_head = (" | run split min / median (ms) | merged vs split min / median", "|---|---") if args.split_epilogues \
        else ("", "")
    print("| model | compile cpu (s) | compile x86_64 (s) | x86_64/cpu | run cpu min / median (ms) "
          f"| run x86_64 min / median (ms) | speed-up min / median{split_head[0]} | spread {' / '.join(targets)} |")
    print(f"|---|---|---|---|---|---|---{split_head[1]}|---|")
    profiles = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            d = args.dir / name
            pt2 = d / f"{args.flavour}.pt2"
            art = {t: os.path.join(tmp, f"{name}.{t}.kiln") for t in targets}
            comp = {t: [] for t in targets}
            for _ in range(args.compile_rounds):
                for t in targets:
                    comp[t].append(compile_once(pt2, art[t], t, args.cpu))
            mins = {t: [] for t in targets}
            meds = {t: [] for t in targets}
            for r in range(args.rounds):
                # Alternate which target goes first, too.
                order = targets if r % 2 == 0 else targets[::-1]
                for t in order:
                    lat = run(art[t], d, args.runs, args.threads)["latency"]
                    mins[t].append(lat["min_ms"])
                    meds[t].append(lat["median_ms"])
            cmin = {t: min(comp[t]) for t in targets}
            lmin = {t: min(mins[t]) for t in targets}
            lmed = {t: statistics.median(meds[t]) for t in targets}
            spread = {t: max(meds[t]) / min(meds[t]) - 1 for t in targets}
            split = ""
            if args.split_epilogues:
                split = (f" | {lmin[SPLIT]:.2f} / {lmed[SPLIT]:.2f} "
                         f"| {lmin[SPLIT] / lmin['x86_64']:.2f} / {lmed[SPLIT] / lmed['x86_64']:.2f}")
            spreads = " / ".join(f"{100 * spread[t]:.0f} %" for t in targets)
            print(f"| {name} | {cmin['cpu']:.2f} | {cmin['x86_64']:.2f} | {cmin['x86_64'] / cmin['cpu']:.2f} "
                  f"| {lmin['cpu']:.2f} / {lmed['cpu']:.2f} | {lmin['x86_64']:.2f} / {lmed['x86_64']:.2f} "
                  f"| {lmin['cpu'] / lmin['x86_64']:.2f} / {lmed['cpu'] / lmed['x86_64']:.2f}{split} "
                  f"| {spreads} |", flush=True)
            if args.profile:
                # Least time per run of each kernel kind over alternated rounds.
                best = {t: {} for t in TARGETS}
                for r in range(args.rounds):
                    for t in TARGETS if r % 2 == 0 else TARGETS[::-1]:
                        times = kernel_times(run(art[t], d, args.runs, args.threads, profile=True), args.runs)
                        for k, v in times.items():
                            best[t][k] = min(best[t].get(k, v), v)
                profiles.append((name, best))
    if profiles:
        print("\nTime per kernel kind (µs per run, least over the profiled rounds; share of their sum):\n")
        print("| model | elementwise cpu (µs) | elementwise x86_64 (µs) | speed-up | share of cpu run | "
              "rows cpu (µs) | rows x86_64 (µs) | speed-up | share of cpu run | largest kinds (cpu) |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for name, best in profiles:
            ew = {t: sum(v for k, v in best[t].items() if k in ELEMENTWISE) for t in TARGETS}
            total = sum(best["cpu"].values()) or 1.0
            top = sorted(best["cpu"].items(), key=lambda kv: -kv[1])[:5]
            tops = ", ".join(f"{k} {100 * v / total:.0f} %" for k, v in top)
            speed = ew["cpu"] / ew["x86_64"] if ew["x86_64"] else float("nan")
            rows = {t: sum(v for k, v in best[t].items() if k in ROWS) for t in TARGETS}
            rspeed = rows["cpu"] / rows["x86_64"] if rows["x86_64"] else float("nan")
            print(f"| {name} | {ew['cpu']:.0f} | {ew['x86_64']:.0f} | {speed:.2f} | {100 * ew['cpu'] / total:.1f} % "
                  f"| {rows['cpu']:.0f} | {rows['x86_64']:.0f} | {rspeed:.2f} | {100 * rows['cpu'] / total:.1f} % "
                  f"| {tops} |")
    print(f"\nload average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
