#!/usr/bin/env bash
# The retrofit demonstration of docs/FINETUNING.md: a tiny `standard` model trained 300 steps on
# Debian's fortunes, retrofitted to diff_v2, then the original and the retrofit each trained 200
# more steps on the same tokens (same seed, same windows), one plot of both, and both scored
# on the `fortunes` file. Needs `apt-get install fortunes` and a release build.
set -euo pipefail
cd "$(dirname "$0")/.."
DIFFTX=${DIFFTX:-target/release/difftx}
D=/usr/share/games/fortunes
OUT=${OUT:-runs/retrofit_fortunes}
mkdir -p "$OUT"
"$DIFFTX" --threads 2 train --data $D --preset tiny --attention standard --context 128 --batch 8 \
  --steps 300 --lr 2e-3 --eval-every 50 --val-batches 8 --seed 0 --out "$OUT/std"
"$DIFFTX" retrofit --model "$OUT/std" --attention diff_v2 --data $D/fortunes --out "$OUT/std_v2"
for m in std std_v2; do
  "$DIFFTX" --threads 2 train --init-from "$OUT/$m" --data $D --context 128 --batch 8 \
    --steps 200 --lr 5e-4 --eval-every 25 --val-batches 8 --seed 1 --out "$OUT/ft_$m"
done
"$DIFFTX" plot "$OUT/ft_std" "$OUT/ft_std_v2" --out "$OUT/retrofit_fortunes.png" \
  --title "fortunes, tiny: standard vs its diff_v2 retrofit, 200 more steps"
for m in ft_std ft_std_v2; do
  "$DIFFTX" eval --model "$OUT/$m" --data $D/fortunes --json
done
