#!/usr/bin/env bash
# aarch64 check: cross-builds kiln-isa and kiln-kernels for
# aarch64-unknown-linux-gnu, runs their tests under qemu-user (the NEON kernel
# table against the generic one, and every kernel test on the NEON table), and
# runs clippy -D warnings for that target. Works on a fresh Debian 12 (bookworm)
# x86-64 machine; installs only what is missing (root or sudo), so reruns are
# cheap. Speed under qemu means nothing: this checks correctness only.
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

cargo test -p kiln-isa -p kiln-kernels --target "$T"
cargo clippy -p kiln-kernels --all-targets --target "$T" -- -D warnings
echo "aarch64 check passed in $((SECONDS - start)) s"
