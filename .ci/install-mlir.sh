#!/usr/bin/env bash
# Installs what `cargo build -p kiln-compiler --features mlir` needs (MLIR/LLVM
# 19 from Debian 12; melior 0.22 links them statically) and prints the
# environment cargo needs. Idempotent: installs only missing packages.
#   eval "$(.ci/install-mlir.sh)"
# The default build (no features) needs none of this.
set -euo pipefail

packages=(llvm-19-dev libmlir-19-dev mlir-19-tools libclang-19-dev clang-19 libpolly-19-dev libzstd-dev zlib1g-dev)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    echo "installing: ${missing[*]}" >&2
    $sudo apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >&2
fi

prefix=$(llvm-config-19 --prefix)
# mlir-sys, tblgen and llvm-sys each look for their own variable; the machine's
# default llvm-config may be an older LLVM.
echo "export MLIR_SYS_190_PREFIX=$prefix"
echo "export TABLEGEN_190_PREFIX=$prefix"
echo "export LLVM_SYS_191_PREFIX=$prefix"
