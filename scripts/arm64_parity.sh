#!/usr/bin/env bash
# The same model on x86-64 and on ARM64 (under qemu-user): the training losses of the demo's
# diff_v1 model step by step, the validation loss of a trained model, and its greedy text in f32,
# q8_0 and q4_0, from an x86-64 build and from an aarch64 build at `-cpu max` and `-cpu
# cortex-a72`. Prints one table; exits 1 where the text differs or a loss is off by more than
# its bound (training 1e-3 relative at any step, the trained model's loss 1e-5).
#
#   bash scripts/arm64_parity.sh [OUT]     (OUT default: runs/arm64_parity; needs what
#                                           scripts/test_arm64.sh installs; ~30 min)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-runs/arm64_parity}
mkdir -p "$out"
target=aarch64-unknown-linux-gnu
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
cargo build --release --locked
cargo build --release --locked --target "$target"
x86=target/release/difftx
arm=target/$target/release/difftx
run() { # run CPU ARGS...: the x86 binary for CPU "x86", else the aarch64 one under qemu
  local cpu=$1; shift
  if [ "$cpu" = x86 ]; then "$x86" "$@"; else qemu-aarch64 -L /usr/aarch64-linux-gnu -cpu "$cpu" "$arm" "$@"; fi
}
cpus=(x86 max cortex-a72)

# 1. Training: the demo's diff_v1 model for STEPS steps (default 20) on each, loss by loss.
# (The whole demo under qemu takes hours: 49 steps of its 600 took 40 minutes here.)
steps=${STEPS:-20}
for cpu in x86 max; do
  rm -rf "$out/train-$cpu"
  run $cpu train --data data/demo.txt --preset tiny --attention diff_v1 --steps "$steps" \
    --threads 2 --out "$out/train-$cpu" >/dev/null 2>&1
done

# 2. One model trained on x86, then scored and continued greedily everywhere
model=$out/model
if [ ! -d "$model/checkpoints" ]; then
  "$x86" train --data data/demo.txt --preset tiny --attention diff_v1 --steps 300 --threads 2 \
    --out "$model" >/dev/null 2>&1
fi
fail=0
printf '%-11s %-6s %-12s %s\n' cpu quant val_loss "greedy text (40 tokens)"
for cpu in "${cpus[@]}"; do
  loss=$(run $cpu eval --model "$model" --data data/demo.txt --threads 2 --json 2>/dev/null \
    | python3 -c 'import json,sys; print(json.load(sys.stdin)["loss"])')
  echo "$loss" > "$out/loss-$cpu.txt"
  for quant in f32 q8_0 q4_0; do
    flag=(); [ $quant = f32 ] || flag=(--quant $quant)
    run $cpu generate --model "$model" --prompt "The " --max-new-tokens 40 --temperature 0 \
      --threads 2 "${flag[@]}" 2>/dev/null > "$out/text-$cpu-$quant.txt"
    printf '%-11s %-6s %-12s %s\n' "$cpu" "$quant" "$loss" "$(tr '\n' ' ' < "$out/text-$cpu-$quant.txt" | cut -c1-60)"
    cmp -s "$out/text-x86-$quant.txt" "$out/text-$cpu-$quant.txt" || { echo "  text differs from x86's"; fail=1; }
  done
  python3 - "$(cat "$out/loss-x86.txt")" "$loss" <<'EOF' || fail=1
import sys
a, b = map(float, sys.argv[1:])
rel = abs(a - b) / abs(a)
print(f"  loss vs x86: relative difference {rel:.2e}")
sys.exit(0 if rel <= 1e-5 else 1)
EOF
done
python3 - "$out/train-x86/metrics.jsonl" "$out/train-max/metrics.jsonl" <<'EOF' || fail=1
import json, sys
# each step's training loss, x86 against aarch64 (-cpu max)
runs = [{r["step"]: r["loss"] for r in map(json.loads, open(p)) if "loss" in r} for p in sys.argv[1:]]
steps = sorted(set(runs[0]) & set(runs[1]))
worst = max(abs(runs[0][s] - runs[1][s]) / runs[0][s] for s in steps)
print(f"training: {len(steps)} steps, losses {runs[0][steps[-1]]:.6f} (x86) and "
      f"{runs[1][steps[-1]]:.6f} (aarch64) at the last; largest relative difference {worst:.1e}")
sys.exit(0 if steps and worst <= 1e-3 else 1)
EOF
exit $fail
