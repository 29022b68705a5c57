#!/usr/bin/env python3
"""Quantized models (CNNs, and the transformers of real_models.py), kiln vs ONNX Runtime, in one run: latency of each model in
f32 and quantized (kiln `--quantize int8-dynamic` / `int8-static`, ONNX
Runtime's `quantize_dynamic` / `quantize_static` (QDQ, per-channel weights)
on the same ONNX export), and each quantized output's cosine against its
runtime's f32 output on the same input.

    cargo build --release -p kiln-compiler
    /path/to/venv/bin/python benches/real_models.py --models resnet18 mobilenet_v2   # once
    /path/to/venv/bin/python benches/quant_models.py [--models resnet18 mobilenet_v2] [--threads 1 2] [--runs 30]
        [--baseline path/to/other/kiln] [--cpu-time --rounds 3]

`--baseline`: another kiln binary (say main's) compiles and runs the
int8-static model too, measured in the same loop (an A/B column and its
ratio to ONNX Runtime's static model).

`--cpu-time` (with `--baseline`): on a loaded machine wall-clock latency
mostly measures the other jobs; this mode measures CPU time per run
instead — `perf stat -e task-clock` of `kiln run --repeat R+1` less that of
`--repeat 1` (so loading is not counted) for both kiln binaries, the
process CPU time of R runs of ONNX Runtime's static QDQ model in this
process — the three alternated, `--rounds` rounds, one table row per
round.

Calibration (both runtimes): 8 samples, the model's input scaled and
shifted. Needs torch, onnx and onnxruntime; never run in CI. Prints
Markdown; results with the command go to benches/RESULTS.md. The runtimes
are measured interleaved per model and thread count, so load from other
jobs hits them alike: the ratios matter more than the times.
"""
import argparse
import os
import subprocess
import time
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import KILN, REAL, bench_kiln, inputs_of, median_ms, onnx_export, ort_runner  # noqa: E402


def samples(x, n=8):
    rng = np.random.default_rng(0)
    if np.issubdtype(x.dtype, np.integer):  # token ids: others from the same vocabulary range
        return [rng.integers(0, int(x.max()) + 1, x.shape).astype(x.dtype) for _ in range(n)]
    return [(x * (0.6 + 0.1 * i) + rng.normal(0, 0.1, x.shape)).astype(np.float32) for i in range(n)]


def write_calibration(d: Path, xs):
    for i, x in enumerate(xs):
        (d / f"sample_{i}").mkdir(parents=True, exist_ok=True)
        np.save(d / f"sample_{i}" / "input_0.npy", x)


def kiln_compile(pt2: Path, out: Path, mode, calib: Path, kiln=KILN):
    args = [str(kiln), "compile", str(pt2), "-o", str(out)]
    if mode:
        args += ["--quantize", mode]
        if mode.startswith("int8-static"):
            args += ["--calibration", str(calib)]
    subprocess.run(args, check=True, capture_output=True)


def kiln_output(art: Path, d: Path, tmp: Path):
    out = tmp / (art.stem + "_out")
    subprocess.run([str(KILN), "run", str(art), "--input", f"0={d / 'input_0.npy'}", "--output-dir", str(out)],
                   check=True, capture_output=True)
    return np.load(out / "output_0.npy")


def ort_quantized(onnx_path: Path, tmp: Path, xs_calib):
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_dynamic, \
        quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    # One self-contained file: the quantization tools lose external data.
    import onnx
    single = tmp / "single.onnx"
    onnx.save_model(onnx.load(str(onnx_path)), str(single), save_as_external_data=False)
    onnx_path = single
    pre = tmp / "pre.onnx"
    try:
        quant_pre_process(str(onnx_path), str(pre))
    except Exception:  # its symbolic shape inference fails on some exports (BERT's -inf mask)
        quant_pre_process(str(onnx_path), str(pre), skip_symbolic_shape=True)
    dyn = tmp / "dynamic.onnx"
    quantize_dynamic(str(pre), str(dyn), weight_type=QuantType.QInt8, per_channel=True)

    class Reader(CalibrationDataReader):
        def __init__(self, name):
            self.it = iter([{name: x} for x in xs_calib])

        def get_next(self):
            return next(self.it, None)

    import onnxruntime as ort
    name = ort.InferenceSession(str(pre), providers=["CPUExecutionProvider"]).get_inputs()[0].name
    st = tmp / "static.onnx"
    quantize_static(str(pre), str(st), Reader(name), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    return dyn, st


def kiln_task_clock_ms(kiln, art, d: Path, n_inputs, repeat, threads):
    """CPU milliseconds (`perf stat -e task-clock`) of `kiln run --repeat repeat`."""
    args = ["perf", "stat", "-x,", "-e", "task-clock", str(kiln), "run", str(art), "--repeat", str(repeat),
            "--threads", str(threads)]
    for i in range(n_inputs):
        args += ["--input", f"{i}={d / f'input_{i}.npy'}"]
    env = dict(os.environ, KILN_NUM_THREADS=str(threads))
    err = subprocess.run(args, check=True, capture_output=True, text=True, env=env).stderr
    line = next(ln for ln in err.splitlines() if "task-clock" in ln)
    return float(line.split(",")[0])


def kiln_cpu_ms_per_run(kiln, art, d: Path, n_inputs, runs, threads):
    """CPU time per run: R + 1 runs less 1 run (loading and the first run's setup cancel)."""
    many = kiln_task_clock_ms(kiln, art, d, n_inputs, runs + 1, threads)
    one = kiln_task_clock_ms(kiln, art, d, n_inputs, 1, threads)
    return (many - one) / runs


def ort_cpu_ms_per_run(run, runs):
    for _ in range(min(10, runs)):  # warm-up
        run()
    t = time.process_time()
    for _ in range(runs):
        run()
    return (time.process_time() - t) * 1e3 / runs


def cpu_time_ab(args):
    """`--cpu-time`: kiln and `--baseline` int8-static and ONNX Runtime's static QDQ model, CPU time per run,
    alternated round by round."""
    print(f"CPU ms per run (task-clock), {args.runs} runs per measurement, baseline {args.baseline}\n")
    print("| model | threads | round | kiln int8-static | baseline int8-static | ORT static QDQ | kiln / baseline "
          "| kiln / ORT | baseline / ORT |")
    print("|---|---|---|---|---|---|---|---|---|")
    for model in args.models:
        d = REAL / model
        xs = inputs_of(d)
        with tempfile.TemporaryDirectory() as t:
            tmp = Path(t)
            calib_xs = samples(xs[0])
            write_calibration(tmp / "calib", calib_xs)
            arts = {"new": tmp / "new.kiln", "base": tmp / "base.kiln"}
            kiln_compile(d / "aten.pt2", arts["new"], "int8-static", tmp / "calib")
            kiln_compile(d / "aten.pt2", arts["base"], "int8-static", tmp / "calib", kiln=args.baseline)
            onnx_path = tmp / "model.onnx"
            if not onnx_export(d / "aten.pt2", xs, str(onnx_path)):
                raise SystemExit(f"{model}: no ONNX export")
            _, static = ort_quantized(onnx_path, tmp, calib_xs)
            for threads in args.threads:
                ort = ort_runner(str(static), xs, threads)
                for r in range(args.rounds):
                    k = kiln_cpu_ms_per_run(KILN, arts["new"], d, len(xs), args.runs, threads)
                    b = kiln_cpu_ms_per_run(args.baseline, arts["base"], d, len(xs), args.runs, threads)
                    o = ort_cpu_ms_per_run(ort, args.runs)
                    print(f"| {model} | {threads} | {r + 1} | {k:.2f} | {b:.2f} | {o:.2f} | {k / b:.2f} | {k / o:.2f} "
                          f"| {b / o:.2f} |", flush=True)


def cosine(a, b):
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="*", default=["resnet18", "mobilenet_v2"])
    ap.add_argument("--threads", type=int, nargs="*", default=[1])
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--baseline", type=Path, help="another kiln binary: its int8-static model measured alongside")
    ap.add_argument("--cpu-time", action="store_true", help="with --baseline: CPU time per run, alternated rounds")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    if args.cpu_time:
        if not args.baseline:
            raise SystemExit("--cpu-time needs --baseline")
        return cpu_time_ab(args)
    base_cols = " baseline int8-static | baseline / ORT static |" if args.baseline else ""
    print("| model | threads | kiln f32 ms | kiln int8-dyn | kiln int8-static | ORT f32 ms | ORT dyn | ORT static "
          "| kiln static / ORT static | cos kiln dyn / static | cos ORT dyn / static |" + base_cols)
    print("|---|---|---|---|---|---|---|---|---|---|---|" + ("---|---|" if args.baseline else ""))
    for model in args.models:
        d = REAL / model
        xs = inputs_of(d)
        with tempfile.TemporaryDirectory() as t:
            tmp = Path(t)
            calib_xs = samples(xs[0])
            write_calibration(tmp / "calib", calib_xs)
            arts = {}
            for mode in [None, "int8-dynamic", "int8-static"]:
                arts[mode] = tmp / f"{mode or 'f32'}.kiln"
                kiln_compile(d / "aten.pt2", arts[mode], mode, tmp / "calib")
            if args.baseline:
                base_art = tmp / "baseline_int8-static.kiln"
                kiln_compile(d / "aten.pt2", base_art, "int8-static", tmp / "calib", kiln=args.baseline)
            outs = {m: kiln_output(a, d, tmp) for m, a in arts.items()}
            onnx_path = tmp / "model.onnx"
            have_ort = onnx_export(d / "aten.pt2", xs, str(onnx_path))
            ort_models = {}
            if have_ort:
                ort_models["f32"] = onnx_path
                try:
                    ort_models["dyn"], ort_models["static"] = ort_quantized(onnx_path, tmp, calib_xs)
                except Exception as e:  # ONNX Runtime's quantization tools fail on some exports
                    print(f"  onnxruntime quantization failed for {model}: {type(e).__name__}: {e}"[:300],
                          file=sys.stderr)
                import onnxruntime as ort
                ort_outs = {}
                for k, p in ort_models.items():
                    sess = ort.InferenceSession(str(p), providers=["CPUExecutionProvider"])
                    ort_outs[k] = sess.run(None, {sess.get_inputs()[0].name: xs[0]})[0]
            for threads in args.threads:
                k = {m: bench_kiln(str(a), d, len(xs), args.runs, threads) for m, a in arts.items()}
                base = bench_kiln(str(base_art), d, len(xs), args.runs, threads, kiln=args.baseline) \
                    if args.baseline else None
                o = {key: median_ms(ort_runner(str(p), xs, threads), args.runs) for key, p in ort_models.items()}
                cos_k = f"{cosine(outs['int8-dynamic'], outs[None]):.5f} / {cosine(outs['int8-static'], outs[None]):.5f}"
                ms = lambda key: f"{o[key]:.2f}" if key in o else "-"  # noqa: E731
                ratio = f"{k['int8-static'] / o['static']:.2f}" if "static" in o else "-"
                cos_o = (f"{cosine(ort_outs['dyn'], ort_outs['f32']):.5f} / "
                         f"{cosine(ort_outs['static'], ort_outs['f32']):.5f}") if "static" in o else "-"
                print(f"| {model} | {threads} | {k[None]:.2f} | {k['int8-dynamic']:.2f} | {k['int8-static']:.2f} "
                      f"| {ms('f32')} | {ms('dyn')} | {ms('static')} | {ratio} | {cos_k} | {cos_o} |"
                      + (f" {base:.2f} | {base / o['static']:.2f} |" if base is not None and "static" in o else
                         (" - | - |" if args.baseline else "")))


if __name__ == "__main__":
    main()
