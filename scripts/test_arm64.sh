#!/usr/bin/env bash
# difftx's tests on ARM64 (aarch64 Linux), from an x86-64 Linux machine: cross-built, then run
# under Debian's qemu-user at two CPU levels: `-cpu max` (NEON, dotprod, i8mm, bf16) and
# `-cpu cortex-a72` (NEON only), so both the feature paths and the fallbacks run.
#
#   bash scripts/test_arm64.sh            installs what is missing (as root: apt-get, rustup)
#   TESTS='kernels::' bash scripts/...    a filter for the library's tests [default: all]
#
# Runs: the library's unit tests (every kernel's tests, the model, inference, data) and the
# PyTorch / transformers parity tests (tests/parity.rs). On an ARM64 machine itself, plain
# `cargo test` runs everything natively instead.
set -euo pipefail
cd "$(dirname "$0")/.."
target=aarch64-unknown-linux-gnu

# 1. The cross toolchain and qemu-user, installed when missing
need=()
command -v qemu-aarch64 >/dev/null || need+=(qemu-user)
command -v aarch64-linux-gnu-gcc >/dev/null || need+=(gcc-aarch64-linux-gnu)
[ -e /usr/aarch64-linux-gnu/lib/libc.so.6 ] || need+=(libc6-dev-arm64-cross)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    echo "test_arm64.sh: missing ${need[*]}; install them (Debian: apt-get install ${need[*]})" >&2
    exit 1
  fi
  apt-get update -qq && apt-get install -y -qq "${need[@]}" >/dev/null
fi
if ! rustup target list --installed | grep -qx "$target"; then
  rustup target add "$target"
fi

# 2. Cross-built once, run at each CPU level
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
for cpu in max cortex-a72; do
  echo "== aarch64 under qemu -cpu $cpu"
  CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -L /usr/aarch64-linux-gnu -cpu $cpu" \
    cargo test --locked --release --target "$target" --lib --test parity -- ${TESTS:-}
done
