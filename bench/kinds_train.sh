#!/usr/bin/env bash
# Training step time of two attention kinds against each other (target 3a: diff_v1 at most 10%
# slower than standard per step).
#
#   bench/kinds_train.sh [ROUNDS] [BINARY]
#
# Each round runs `difftx bench train --attention KIND` for both kinds, the order alternating
# from round to round. This machine moves between speed phases within a run, so the figure
# quoted is the median of each round's own ratio, next to the medians of both kinds.
# BINARY defaults to target/release/difftx (built first). KINDS="diff_v1 standard" (the first
# is timed against the second), PRESET=bench, BATCH=8, THREADS (default: all cores).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-8}
bin=${2:-}
if [ -z "$bin" ]; then
  cargo build --release --quiet
  bin=target/release/difftx
fi
[ -x "$bin" ] || { echo "kinds_train.sh: $bin: not an executable" >&2; exit 1; }
read -r -a kinds <<<"${KINDS:-diff_v1 standard}"
[ ${#kinds[@]} -eq 2 ] || { echo "kinds_train.sh: KINDS must name two attention kinds" >&2; exit 1; }
threads=(); [ -n "${THREADS:-}" ] && threads=(--threads "$THREADS")
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for r in $(seq "$rounds"); do
  order=("${kinds[@]}"); [ $((r % 2)) -eq 0 ] && order=("${kinds[1]}" "${kinds[0]}")
  for k in "${order[@]}"; do
    json=$("$bin" "${threads[@]}" bench train --attention "$k" --preset "${PRESET:-bench}" \
      --batch "${BATCH:-8}" --warmup 2 --steps 8 --json)
    ms=$(python3 -c "import json,sys; print(json.loads(sys.argv[1])['step_ms'])" "$json")
    echo "$r $k $ms" >>"$out"
  done
  echo -ne "\rround $r/$rounds" >&2
done
echo >&2
python3 - "$out" "${kinds[@]}" <<'PY'
import collections, statistics as st, sys
path, ka, kb = sys.argv[1:4]
ms = collections.defaultdict(dict)
for line in open(path):
    r, k, v = line.split()
    ms[r][k] = float(v)
rs = sorted(ms, key=int)
ratios = [ms[r][ka] / ms[r][kb] for r in rs]
print(f"step: {ka} median {st.median(ms[r][ka] for r in rs):.1f} ms "
      f"({min(ms[r][ka] for r in rs):.1f}-{max(ms[r][ka] for r in rs):.1f}), "
      f"{kb} median {st.median(ms[r][kb] for r in rs):.1f} ms "
      f"({min(ms[r][kb] for r in rs):.1f}-{max(ms[r][kb] for r in rs):.1f})")
print(f"{ka} time over {kb}, per round: median {st.median(ratios):.3f} "
      f"({' '.join(f'{x:.3f}' for x in ratios)})")
PY
