"""The GPU check's driver (run through run.sh; see README.md).

Runs every artifact in out/artifacts with `kiln run --device DEVICE --repeat N
--json`, compares its outputs with PyTorch's (out/fixtures), prints one table
row per artifact and exits non-zero on any mismatch or failed run.

Tolerances: f32 artifacts elementwise |got - want| <= atol + rtol * |want|
(rtol 1e-4, atol 1e-5); bf16 artifacts relative L2 error
||got - want|| / ||want|| <= 3e-2 (per-element error depends on each value's
exponent). Non-float outputs must match exactly.

Needs only Python 3's standard library (numpy is not required).
"""

import argparse
import ast
import json
import math
import os
import pathlib
import struct
import subprocess
import sys
import tempfile

RTOL, ATOL = 1e-4, 1e-5
BF16_REL_L2 = 3e-2

# .npy descr (without byte order) -> struct code
NPY_CODES = {"f4": "f", "f8": "d", "f2": "e", "i8": "q", "i4": "i", "i2": "h", "i1": "b", "u1": "B", "b1": "?"}


def read_npy(path):
    """(descr, shape, values) of a C-order little-endian .npy file."""
    data = pathlib.Path(path).read_bytes()
    if data[:6] != b"\x93NUMPY":
        raise ValueError(f"{path}: not a .npy file")
    major = data[6]
    if major == 1:
        (hlen,), start = struct.unpack("<H", data[8:10]), 10
    else:
        (hlen,), start = struct.unpack("<I", data[8:12]), 12
    header = ast.literal_eval(data[start:start + hlen].decode("latin1"))
    descr, shape = header["descr"], tuple(header["shape"])
    if header.get("fortran_order"):
        raise ValueError(f"{path}: Fortran order is not supported")
    if descr[0] == ">" or descr[1:] not in NPY_CODES:
        raise ValueError(f"{path}: unsupported dtype {descr}")
    code = NPY_CODES[descr[1:]]
    count = math.prod(shape)
    body = data[start + hlen:]
    values = struct.unpack(f"<{count}{code}", body[:count * struct.calcsize(code)])
    return descr[1:], shape, values


def compare(got_path, want_path, precision):
    """(ok, measure text) for one output."""
    gd, gs, g = read_npy(got_path)
    wd, ws, w = read_npy(want_path)
    if (gd, gs) != (wd, ws):
        return False, f"dtype/shape {gd}{list(gs)} != {wd}{list(ws)}"
    if gd[0] not in "f":
        bad = sum(a != b for a, b in zip(g, w))
        return bad == 0, f"{bad} elements differ"
    if precision == "bf16":
        diff = math.sqrt(sum((a - b) ** 2 for a, b in zip(g, w)))
        norm = max(math.sqrt(sum(b * b for b in w)), 1e-12)
        rel = diff / norm
        return rel <= BF16_REL_L2, f"rel L2 {rel:.2e}"
    worst, where, max_abs = 0.0, None, 0.0
    for i, (a, b) in enumerate(zip(g, w)):
        if math.isnan(a) and math.isnan(b):
            continue
        err = abs(a - b)
        excess = err - RTOL * abs(b) - ATOL
        if math.isnan(excess) or excess > worst:
            worst, where = (math.inf if math.isnan(excess) else excess), i
        if not math.isnan(err):
            max_abs = max(max_abs, err)
    if where is None:
        return True, f"max |err| {max_abs:.1e}"
    return False, f"element {where}: {g[where]} vs {w[where]} (beyond rtol {RTOL} atol {ATOL})"


def run_one(kiln, artifact, fixture_dir, device, repeat, timeout, outdir):
    inputs = sorted(fixture_dir.glob("input_*.npy"))
    cmd = [str(kiln), "run", str(artifact), "--device", device, "--repeat", str(repeat), "--json", "--output-dir", str(outdir)]
    for p in inputs:
        cmd += ["--input", f"{p.stem[len('input_'):]}={p}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout).strip().splitlines()
        raise RuntimeError(lines[-1] if lines else f"exit status {proc.returncode}")
    return json.loads(proc.stdout)


def main():
    here = pathlib.Path(__file__).resolve().parent
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="gpu", help="kiln run --device: gpu (default), tpu, pjrt:PATH")
    ap.add_argument("--repeat", type=int, default=50, help="timed runs per artifact (after one warm-up)")
    ap.add_argument("--out", default=str(here / "out"), help="what prepare.sh wrote")
    ap.add_argument("--timeout", type=int, default=120, help="seconds per artifact (includes plugin start-up and compile)")
    ap.add_argument("--only", default="", help="substring filter on artifact names")
    args = ap.parse_args()

    out = pathlib.Path(args.out)
    kiln = out / "kiln"
    artifacts = sorted(p for p in (out / "artifacts").glob("*.kiln") if args.only in p.name)
    if not kiln.is_file() or not artifacts:
        print(f"nothing to run in {out}: run benches/gpu/prepare.sh first and carry benches/gpu/out", file=sys.stderr)
        return 2
    manifest = out / "MANIFEST"
    if manifest.is_file():
        print(manifest.read_text().rstrip())
    print(f"device {args.device}, {args.repeat} timed runs per artifact\n")

    header = f"{'model':<18} {'ir':<9} {'precision':<9} {'match':<6} {'median ms':>10} {'p90 ms':>8}  {'device / detail'}"
    print(header)
    print("-" * len(header))
    failures = 0
    with tempfile.TemporaryDirectory(prefix="kiln-gpu-check-") as tmp:
        for artifact in artifacts:
            model, ir, precision = artifact.stem.split("__")
            outdir = pathlib.Path(tmp) / artifact.stem
            row = f"{model:<18} {ir:<9} {precision:<9}"
            try:
                report = run_one(kiln, artifact, out / "fixtures" / model, args.device, args.repeat, args.timeout, outdir)
            except (RuntimeError, subprocess.TimeoutExpired, json.JSONDecodeError) as e:
                failures += 1
                print(f"{row} {'FAIL':<6} {'-':>10} {'-':>8}  {e}")
                continue
            checks = []
            for ref in sorted((out / "fixtures" / model).glob("output_*.npy")):
                try:
                    checks.append(compare(outdir / ref.name, ref, precision))
                except (OSError, ValueError) as e:
                    checks.append((False, str(e)))
            ok = bool(checks) and all(c[0] for c in checks)
            failures += not ok
            lat = report.get("latency") or {}
            acc = report.get("accelerator") or {}
            where = f"{acc.get('device_kind', 'cpu')} ({acc.get('compiled', 0)} compiled, {acc.get('cache_hits', 0)} cached)"
            measures = "; ".join(c[1] for c in checks)
            print(f"{row} {'ok' if ok else 'BAD':<6} {lat.get('median_ms', math.nan):>10.3f} {lat.get('p90_ms', math.nan):>8.3f}  {where}; {measures}")
    print(f"\n{len(artifacts) - failures} of {len(artifacts)} artifacts match PyTorch")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
