#!/usr/bin/env bash
# The GPU check: runs what prepare.sh wrote to benches/gpu/out on a PJRT device
# and compares every output with PyTorch's. Runs on the GPU machine (Python 3,
# the CUDA PJRT plugin from jax-cuda13-pjrt; no Rust, no numpy needed).
#
#   bash benches/gpu/run.sh                        # --device gpu, 50 timed runs per artifact
#   bash benches/gpu/run.sh --device pjrt:/path/xla_cpu_pjrt.so --repeat 5
#   bash benches/gpu/run.sh --only transformer     # artifacts whose name contains it
#   bash benches/gpu/run.sh --help                 # every option (--timeout per artifact, --out)
#
# Prints a table (model, IR, precision, match, median/p90 latency) and exits
# non-zero when any artifact fails to run or differs from PyTorch.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
fi
# Unbuffered, so a run cut short by a timeout still shows the rows it finished.
# Under the device tool ($OUT set) the table is also kept as $OUT/gpu-check.txt.
if [ -n "${OUT:-}" ] && [ -d "$OUT" ]; then
    python3 -u "$here/check.py" "$@" 2>&1 | tee "$OUT/gpu-check.txt"
    exit "${PIPESTATUS[0]}"
fi
exec python3 -u "$here/check.py" "$@"
