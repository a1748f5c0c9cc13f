#!/usr/bin/env bash
# Training step time of two builds of difftx against each other (an A/B of a kernel change).
#
#   bench/builds_train.sh ROUNDS OLD_BINARY NEW_BINARY
#
# Each round runs `difftx bench train` with both binaries, the order alternating from round to
# round. This machine moves between speed phases within a run, so the figure quoted is the
# median of each round's own NEW/OLD ratio, next to the medians of both sides.
# ATTENTION=diff_v1, PRESET=bench, BATCH=8, THREADS (default: all cores).
set -euo pipefail
[ $# -eq 3 ] || { echo "usage: bench/builds_train.sh ROUNDS OLD_BINARY NEW_BINARY" >&2; exit 1; }
rounds=$1; old=$2; new=$3
for b in "$old" "$new"; do
  [ -x "$b" ] || { echo "builds_train.sh: $b: not an executable" >&2; exit 1; }
done
threads=(); [ -n "${THREADS:-}" ] && threads=(--threads "$THREADS")
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for r in $(seq "$rounds"); do
  order=("$old" "$new"); [ $((r % 2)) -eq 0 ] && order=("$new" "$old")
  for b in "${order[@]}"; do
    json=$("$b" "${threads[@]}" bench train --attention "${ATTENTION:-diff_v1}" \
      --preset "${PRESET:-bench}" --batch "${BATCH:-8}" --warmup 2 --steps 8 --json)
    ms=$(python3 -c "import json,sys; print(json.loads(sys.argv[1])['step_ms'])" "$json")
    [ "$b" = "$old" ] && side=old || side=new
    echo "$r $side $ms" >>"$out"
  done
  echo -ne "\rround $r/$rounds" >&2
done
echo >&2
python3 - "$out" <<'PY'
import collections, statistics, sys
ms = collections.defaultdict(dict)
for line in open(sys.argv[1]):
    r, side, v = line.split()
    ms[r][side] = float(v)
old = statistics.median(m["old"] for m in ms.values())
new = statistics.median(m["new"] for m in ms.values())
ratios = [m["new"] / m["old"] for m in ms.values()]
print(f"step: old median {old:.1f} ms, new median {new:.1f} ms | new/old per round: median "
      f"{statistics.median(ratios):.3f} (" + " ".join(f"{x:.3f}" for x in ratios) + ")")
PY
