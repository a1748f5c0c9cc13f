#!/usr/bin/env bash
# The runs behind docs/benchmarks-log.md's "TRAINING.md: standard, diff_v1 and diff_v2 on
# fortunes" (docs/TRAINING.md says how to run such a comparison): standard, diff_v1 and diff_v2 at the `small` preset (context
# shortened to 256) on Debian's `fortunes` corpus, with the same seed and token budget, then one
# plot of all three. Needs `apt-get install fortunes` and a release build.
set -euo pipefail
cd "$(dirname "$0")/.."
DIFFTX=${DIFFTX:-target/release/difftx}
OUT=${OUT:-runs/fortunes}
for kind in standard diff_v1 diff_v2; do
  /usr/bin/time -f "$kind: %e s wall" "$DIFFTX" --threads 2 train \
    --data /usr/share/games/fortunes --preset small --attention "$kind" \
    --context 256 --batch 8 --steps 400 --lr 2e-3 \
    --eval-every 50 --val-batches 8 --ckpt-every 200 --seed 0 \
    --out "$OUT/$kind"
done
"$DIFFTX" plot "$OUT/standard" "$OUT/diff_v1" "$OUT/diff_v2" --out "$OUT/fortunes_small.png" \
  --title "fortunes, small preset (context 256): 400 steps × 2048 tokens"
