#!/usr/bin/env bash
# Prepares the GPU check (benches/gpu/README.md). Runs on the development
# machine, which has Rust and MLIR; the GPU machine has neither.
#
#   bash benches/gpu/prepare.sh
#
# Writes benches/gpu/out/ (git-ignored), everything run.sh needs:
#   kiln                       release build without MLIR (the runtime with feature pjrt), stripped
#   artifacts/FIXTURE__IR__PRECISION.kiln
#                              every static fixture, training and Core ATen IR, f32 and bf16,
#                              compiled with --target pjrt by an MLIR build of kiln
#   fixtures/FIXTURE/          the fixture's input_*.npy and PyTorch's output_*.npy
#   MANIFEST                   commit, date, sizes
# and checks that it fits the device tool's 64 MiB carry limit.
set -euo pipefail

cd "$(dirname "$0")/../.."
out=benches/gpu/out
fixtures=(mlp cnn transformer transformer_mask)
irs=(training aten)
precisions=(f32 bf16)
carry_limit=$((64 * 1024 * 1024))

rm -rf "$out"
mkdir -p "$out/artifacts" "$out/fixtures"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The binary that travels: no MLIR (the compiler crate enables the runtime's
# pjrt feature, so `kiln run --device gpu` is in it). Copied right after the
# build: the MLIR build below replaces target/release/kiln.
echo "== building kiln (runtime side, no MLIR)" >&2
cargo build --release -p kiln-compiler
cp target/release/kiln "$out/kiln"
strip "$out/kiln"
if "$out/kiln" compile tests/fixtures/mlp/aten.pt2 -o "$work/probe.kiln" --target pjrt >/dev/null 2>&1; then
    echo "error: the binary to ship unexpectedly compiles --target pjrt (was it built with MLIR?)" >&2
    exit 1
fi

echo "== building kiln with MLIR (compiler side)" >&2
eval "$(bash .ci/install-mlir.sh)"
cargo build --release -p kiln-compiler --features mlir
# A private copy: other builds in this checkout may replace target/release/kiln
# while the loop below runs.
cp target/release/kiln "$work/kiln-mlir"

for fx in "${fixtures[@]}"; do
    mkdir -p "$out/fixtures/$fx"
    cp tests/fixtures/"$fx"/input_*.npy tests/fixtures/"$fx"/output_*.npy "$out/fixtures/$fx/"
    for ir in "${irs[@]}"; do
        for prec in "${precisions[@]}"; do
            artifact="$out/artifacts/${fx}__${ir}__${prec}.kiln"
            "$work/kiln-mlir" compile "tests/fixtures/$fx/$ir.pt2" -o "$artifact" --target pjrt --precision "$prec" >&2
        done
    done
done

bytes=$(du -sb "$out" | cut -f1)
if commit=$(git rev-parse --short HEAD 2>/dev/null); then
    git diff --quiet HEAD 2>/dev/null || commit="$commit + uncommitted changes"
else
    commit=unknown
fi
{
    echo "commit    $commit"
    echo "prepared  $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -srm)"
    echo "glibc     kiln needs up to $(objdump -T "$out/kiln" | grep -o 'GLIBC_[0-9.]*' | sort -V | tail -1)"
    echo "artifacts $(ls "$out/artifacts" | wc -l)"
    echo "size      $bytes bytes (carry limit $carry_limit)"
} > "$out/MANIFEST"
cat "$out/MANIFEST"
if [ "$bytes" -gt "$carry_limit" ]; then
    echo "error: $out is $bytes bytes, over the device tool's carry limit of 64 MiB" >&2
    exit 1
fi
echo "ready: carry benches/gpu/out and run \`bash benches/gpu/run.sh\` on the GPU machine (see benches/gpu/README.md)" >&2
