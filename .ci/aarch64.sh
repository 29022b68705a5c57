#!/usr/bin/env bash
# aarch64 check: cross-builds kiln-isa, kiln-kernels, kiln-runtime and
# kiln-runner for aarch64-unknown-linux-gnu and runs their tests under
# qemu-user (the NEON kernel table against the generic one, every kernel test
# on the NEON table, the integer kernels' tests again on a CPU without the
# dot product and on qemu's `max`, the SVE int8 and f32 kernels and the
# SME GEMM at several vector lengths, the runtime's loader/session/state
# tests), runs clippy
# -D warnings for that target, and builds the runtime-only runner `kiln-run`
# twice: linked with the cross gcc (glibc 2.34+, JetPack 6) and with zig for
# glibc 2.17 (every Jetson still in the field), checking the symbol versions
# the second one needs. It writes the command that runs the gcc-linked runner
# under qemu to $KILN_A64_RUNNER_FILE (default target/aarch64-runner) for the
# end-to-end test tests/tests/e2e/aarch64_e2e.rs (artifacts compiled on x86-64,
# run on aarch64, compared with PyTorch and the x86-64 run), and runs that
# test's fixture check with the glibc 2.17 runner itself. Works on a fresh
# Debian 12 (bookworm) x86-64 machine; installs only what is missing (root or
# sudo), so reruns are cheap. Speed under qemu means nothing: this checks
# correctness only.
#
#   KILN_A64_ROUTE=auto|rustup|debian  where the aarch64 standard library comes from:
#     rustup  `rustup target add` for the toolchain in use (needs the Rust
#             distribution server);
#     debian  Debian's rustc-web + cargo-web + rust-web-clippy (bookworm-security),
#             with the arm64 std unpacked from libstd-rust-web-dev:arm64 (apt only);
#     auto    (default) rustup when that works, else debian.
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive CARGO_TERM_COLOR=never
T=aarch64-unknown-linux-gnu
route=${KILN_A64_ROUTE:-auto}
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
start=$SECONDS
# The host toolchain and target dir, before the Debian route replaces them:
# the end-to-end test at the end is a host build and reuses the suite's.
host_path=$PATH
host_target=${CARGO_TARGET_DIR:-$PWD/target}
runner_file=${KILN_A64_RUNNER_FILE:-$host_target/aarch64-runner}
cache=${KILN_CI_CACHE:-$HOME/.cache/kiln-ci}

# Installs the named apt packages that are not installed yet.
apt_install() {
    local missing=() p
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "${p%%=*}" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    if ((${#missing[@]})); then
        echo "installing: ${missing[*]}"
        $sudo apt-get update -qq
        $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
    fi
}

# Cross linker (gcc 12) with the aarch64 glibc, and qemu user mode.
apt_install gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user-static

# The aarch64 standard library for the compiler that builds the tests.
if [ "$route" != debian ] && command -v rustup >/dev/null && timeout 300 rustup target add "$T"; then
    route=rustup
else
    [ "$route" = rustup ] && { echo "aarch64.sh: rustup target add $T failed" >&2; exit 1; }
    route=debian
    apt_install rustc-web cargo-web
    v=$(dpkg-query -W -f='${Version}' rustc-web)
    apt_install "rust-web-clippy=$v"
    # Only the arm64 rlibs are needed: installing libstd-rust-web-dev:arm64
    # would pull libc6:arm64, libllvm:arm64, ... (~1 GB) through multiarch.
    # rustc-web's sysroot is /usr, so they go to /usr/lib/rustlib/$T.
    marker=/usr/lib/rustlib/$T/.kiln-libstd-version
    if [ "$(cat "$marker" 2>/dev/null)" != "$v" ]; then
        dpkg --print-foreign-architectures | grep -qx arm64 || $sudo dpkg --add-architecture arm64
        $sudo apt-get update -qq
        d=$(mktemp -d)
        (cd "$d" && apt-get download -q "libstd-rust-web-dev:arm64=$v" && dpkg-deb -x ./*.deb x)
        $sudo rm -rf "/usr/lib/rustlib/$T"
        $sudo cp -a "$d/x/usr/lib/rustlib/$T" /usr/lib/rustlib/
        echo "$v" | $sudo tee "$marker" >/dev/null
        rm -rf "$d"
    fi
    # Debian's cargo, rustc, cargo-clippy and clippy-driver ahead of rustup's
    # proxies (else /usr/bin/cargo runs rustup's rustc from PATH), in a target
    # dir of their own so the two compilers' builds do not evict each other.
    export PATH="/usr/bin:$PATH" RUSTC=/usr/bin/rustc RUSTDOC=/usr/bin/rustdoc
    export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target}/debian-rustc"
fi
echo "aarch64 route: $route ($(cargo --version); $(rustc --version))"

# Link with the cross gcc; run test binaries under qemu with the cross glibc.
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER=qemu-aarch64-static
export QEMU_LD_PREFIX=/usr/aarch64-linux-gnu
# Point the guest's ld.so at the cross glibc too: with libc6:arm64 installed it
# otherwise mixes /lib/aarch64-linux-gnu/libc.so.6 with the cross ld.so and the
# first thread spawn hangs (cargo test sits at "running N tests").
export QEMU_SET_ENV=LD_LIBRARY_PATH=/usr/aarch64-linux-gnu/lib
# Jetson Orin-like (NEON, fp16, dotprod, no SVE); qemu's default `max` has SVE.
export QEMU_CPU=cortex-a76

# No aarch64 PJRT plugin exists here: the plugin tests must skip, not try
# to load the x86-64 plugins the suite's environment names.
unset KILN_TEST_XLA_CPU_PLUGIN KILN_TEST_LIBTPU KILN_PJRT_PLUGIN
crates=(-p kiln-isa -p kiln-kernels -p kiln-runtime -p kiln-runner)
cargo test "${crates[@]}" --target "$T"
# The integer kernels' variants against generic on two more CPUs (~80 s):
# cortex-a57 (Jetson Nano/TX2: no dot product, so the plain NEON int8 GEMM
# is the table's) and qemu's `max` (dotprod with SVE and i8mm: the SVE
# `smmla` variant, `sve_i8mm`, is the table's) at its default 512-bit
# vector (64 bytes, named here so that the run says it).
for cpu in cortex-a57 max,sve-default-vector-length=64; do
    QEMU_CPU=$cpu cargo test -p kiln-kernels --target "$T" --test quant
done
# The SVE int8 kernels read the vector length at run time: their tests
# again at 128 and 256 bits (Neoverse V2/N2, Graviton3), and the variant
# list at 1024 bits, where they are not offered (~15 s of CPU).
for vl in 16 32; do
    QEMU_CPU=max,sve-default-vector-length=$vl cargo test -p kiln-kernels --target "$T" --test quant -- \
        sve_ variants_are_listed qconv_int8 results_do_not_depend
done
QEMU_CPU=max,sve-default-vector-length=128 cargo test -p kiln-kernels --target "$T" --test quant -- variants_are_listed
# The SVE and SME tables on qemu's `max` (SVE, SVE2, SME without SME2) at
# 128-, 256- and 512-bit vectors and streaming vectors of 128, 256, 512 and
# 1024 bits: the SVE GEMM's 8×12, 8×24 and 8×48 tiles and the SME GEMM's
# 8×8, 16×16, 32×32 and a predicated 32×32 — each table's GEMM against
# generic (`gemm_f32`) and bit for bit against the NEON kernel (plain and
# with every fused epilogue: `sve_`, `sme::`), SVE exp / sigmoid / SiLU bit
# for bit against NEON's, every tile width each length holds
# (`aarch64::sve::`), the driver's GEMM tests on every table
# (`generic::gemm::`), detection and the tables' entries, and both GEMMs in
# a thread that lowered its vector lengths (`lowered`: the Rust tile). The cortex-a76 run
# above checks that neither table is listed there.
for lengths in "16 16" "32 32" "64 64" "64 128"; do
    read -r vl svl <<<"$lengths"
    cpu="max,sve-default-vector-length=$vl,sme-default-vector-length=$svl"
    QEMU_CPU=$cpu cargo test -p kiln-kernels --target "$T" --test variants -- gemm_f32 sve_ sme:: detection plugged lowered
    QEMU_CPU=$cpu cargo test -p kiln-kernels --target "$T" --lib -- aarch64::sve:: aarch64::sme:: generic::gemm::
done
cargo clippy "${crates[@]}" --all-targets --target "$T" -- -D warnings

# The runtime-only runner, linked with the cross gcc.
cargo build -p kiln-runner --bin kiln-run --target "$T"
a64_target=$(cd "${CARGO_TARGET_DIR:-target}" && pwd)
runner="qemu-aarch64-static -L $QEMU_LD_PREFIX -E LD_LIBRARY_PATH=$QEMU_LD_PREFIX/lib -cpu $QEMU_CPU $a64_target/$T/debug/kiln-run"
mkdir -p "$(dirname "$runner_file")"
echo "$runner" >"$runner_file"
echo "aarch64 runner: $runner (written to $runner_file)"

# The same runner for glibc 2.17 (JetPack 4/5 run glibc 2.27/2.31; gcc-linked
# binaries need 2.34): zig from PyPI as the linker through cargo-zigbuild.
zig_dir="$cache/ziglang"
if [ ! -x "$zig_dir/ziglang/zig" ]; then
    wheels=$(mktemp -d)
    python3 -m pip download --quiet --no-deps --dest "$wheels" "ziglang==0.13.0"
    rm -rf "$zig_dir" && mkdir -p "$zig_dir"
    python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' "$wheels"/ziglang-*.whl "$zig_dir"
    chmod +x "$zig_dir/ziglang/zig"
    rm -rf "$wheels"
fi
zigbuild_version=0.19.8
zigbuild_root="$cache/cargo-zigbuild-$zigbuild_version"
[ -x "$zigbuild_root/bin/cargo-zigbuild" ] ||
    env -u RUSTC -u RUSTDOC -u CARGO_TARGET_DIR PATH="$host_path" \
        cargo install --quiet --locked --root "$zigbuild_root" cargo-zigbuild --version "$zigbuild_version"
# Its own target dir and no linker override: cargo does not relink when only
# the linker changes, so a shared dir would keep the gcc-linked binary.
env -u CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER PATH="$zig_dir/ziglang:$PATH" \
    "$zigbuild_root/bin/cargo-zigbuild" zigbuild -p kiln-runner --bin kiln-run \
    --target "$T.2.17" --target-dir "$a64_target/zig"
zig_runner_bin="$a64_target/zig/$T/debug/kiln-run"
newest=$(aarch64-linux-gnu-objdump -T "$zig_runner_bin" | grep -oE 'GLIBC_[0-9.]+' | sort -uV | tail -1)
echo "glibc 2.17 runner needs up to $newest"
if [ "$(printf '%s\n' "$newest" GLIBC_2.17 | sort -V | tail -1)" != GLIBC_2.17 ]; then
    echo "aarch64.sh: the zig-linked kiln-run needs $newest (> GLIBC_2.17)" >&2
    exit 1
fi
zig_runner="qemu-aarch64-static -L $QEMU_LD_PREFIX -E LD_LIBRARY_PATH=$QEMU_LD_PREFIX/lib -cpu $QEMU_CPU $zig_runner_bin"

# The glibc 2.17 runner through the end-to-end fixture check (a host build:
# the suite's toolchain, target dir and features).
(
    export PATH="$host_path" CARGO_TARGET_DIR="$host_target" KILN_A64_RUNNER="$zig_runner"
    unset RUSTC RUSTDOC
    cargo test --workspace ${KILN_HOST_TEST_FEATURES:+--features "$KILN_HOST_TEST_FEATURES"} \
        --test e2e -- aarch64_e2e::fixtures_match_pytorch_and_x86_64
)
echo "aarch64 check passed in $((SECONDS - start)) s"
