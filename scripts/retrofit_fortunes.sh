#!/usr/bin/env bash
# The retrofit demonstration of docs/FINETUNING.md (its figures: docs/benchmarks-log.md, "FINETUNING.md:
# a retrofit on real text"). A tiny `standard` model is trained on
# Debian's fortunes with needle episodes mixed in (`train --needles`: each window a stretch of
# the fortunes with 2 "the magic number of CITY is NUMBER." sentences inserted and both asked
# for at the end; the loss on every byte), then retrofitted to diff_v2. The original and the
# retrofit each train further on the same episodes (same seed, same windows), one plot of
# both; then each is scored on multi-needle retrieval (`difftx needle`, fortunes as the
# haystack) and on the `fortunes` file (`difftx eval`). Needs `apt-get install fortunes` and a
# release build. On 2026-11-25 it took 23 minutes on 2 threads of a machine shared with
# another training run (load 3-6); STEPS and MORE shorten it.
set -euo pipefail
cd "$(dirname "$0")/.."
DIFFTX=${DIFFTX:-target/release/difftx}
D=/usr/share/games/fortunes
OUT=${OUT:-runs/retrofit_fortunes}
STEPS=${STEPS:-3000}   # the standard model's first run
MORE=${MORE:-1500}     # then each of the two models
TASK=(--needles 2 --needle-digits 2 --needle-loss everything --context 256 --batch 8)
mkdir -p "$OUT"
"$DIFFTX" --threads 2 train --data $D --preset tiny --attention standard "${TASK[@]}" \
  --steps "$STEPS" --lr 2e-3 --eval-every 100 --val-batches 8 --seed 0 --out "$OUT/std"
"$DIFFTX" retrofit --model "$OUT/std" --attention diff_v2 --data $D/fortunes --out "$OUT/std_v2"
for m in std std_v2; do
  "$DIFFTX" --threads 2 train --init-from "$OUT/$m" --data $D "${TASK[@]}" \
    --steps "$MORE" --lr 5e-4 --eval-every 100 --val-batches 8 --seed 1 --out "$OUT/ft_$m"
done
"$DIFFTX" plot "$OUT/ft_std" "$OUT/ft_std_v2" --out "$OUT/retrofit_fortunes.png" \
  --title "fortunes + needles, tiny: standard vs its diff_v2 retrofit, $MORE more steps"
for m in std ft_std ft_std_v2; do
  "$DIFFTX" --threads 2 needle --model "$OUT/$m" --filler $D/fortunes --needles 2 --digits 2 \
    --lengths 192,224,256 --episodes 40 --json > "$OUT/needle_$m.json"
  "$DIFFTX" --threads 2 needle --model "$OUT/$m" --filler $D/fortunes --needles 2 --digits 2 \
    --lengths 192,224,256 --episodes 40
  "$DIFFTX" --threads 2 eval --model "$OUT/$m" --data $D/fortunes --json
done
