#!/usr/bin/env bash
# difftx's tests on ARM64 (aarch64 Linux), from an x86-64 Linux machine: cross-built, then run
# under Debian's qemu-user at two CPU levels: `-cpu max` (NEON, dotprod, i8mm, bf16) and
# `-cpu cortex-a72` (NEON only), so both the feature paths and the fallbacks run.
#
#   bash scripts/test_arm64.sh          the kernels crate's tests (what CI runs, ~5 min cold)
#   bash scripts/test_arm64.sh --full   also the library's unit tests and the PyTorch /
#                                       transformers parity tests (tests/parity.rs), in release
#                                       (a cold cross build of the whole crate: ~15 min)
#
# Installs what is missing (as root: apt-get for qemu-user and the cross gcc, rustup for the
# target). Under emulation the two finite-difference checks of the attention's backward are
# skipped (about a minute natively, hours under qemu); every other kernel test runs. Each run
# also checks that the kernels picked are the ones the emulated CPU calls for
# (DIFFTX_EXPECT_KERNELS, read by the kernels' `picks` tests). On an ARM64 machine itself, or
# on any other host, plain `cargo test` is the test suite and this script has nothing to add.
set -euo pipefail
cd "$(dirname "$0")/.."
target=aarch64-unknown-linux-gnu
full=0
case "${1:-}" in
  --full) full=1 ;;
  "") ;;
  *) echo "test_arm64.sh: unknown option '$1' (expected --full or nothing)" >&2; exit 2 ;;
esac
if [ "$(uname -s)-$(uname -m)" != Linux-x86_64 ]; then
  echo "test_arm64.sh: skipped: emulating ARM64 needs an x86-64 Linux host; cargo test ran natively"
  exit 0
fi

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
  echo "test_arm64.sh: installing ${need[*]}"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
if ! rustup target list --installed | grep -qx "$target"; then
  rustup target add "$target"
fi

# 2. Cross-built once, run at each CPU level: the kernels (f32 NEON; SDOT where dotprod is and
# SMMLA for Q8_0's GEMM where i8mm is too, the NEON integer engine (smlal, sadalp) where it is
# not; BFMMLA where bf16 is, `--bf16` refused where not)
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
skip=(--skip attention::tests::backward_matches_finite_differences
      --skip attention::tests::paired_backward_matches_finite_differences)
for cpu in max cortex-a72; do
  case $cpu in
    max) expect="f32=neon quant=smmla bf16=bfmmla" ;;
    cortex-a72) expect="f32=neon quant=neon bf16=none" ;;
  esac
  echo "== aarch64 under qemu -cpu $cpu (expecting $expect)"
  export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -L /usr/aarch64-linux-gnu -cpu $cpu"
  DIFFTX_EXPECT_KERNELS="$expect" \
    cargo test --locked -p difftx-kernels --target "$target" -- "${skip[@]}"
  if [ $full = 1 ]; then
    DIFFTX_EXPECT_KERNELS="$expect" \
      cargo test --locked --release --target "$target" --lib --test parity -- "${skip[@]}"
  fi
done
