#!/usr/bin/env bash
# Decode speed of two attention kinds against each other (target 3b: diff_v2 at most 5% slower
# than standard), and optionally of two builds of difftx against each other (an A/B of a change).
#
#   bench/kinds_decode.sh [ROUNDS] [BINARY...]
#
# Each round runs `difftx bench decode --attention KIND` for every (binary, kind), in an order
# that rotates from round to round. This machine moves between speed phases within a run, so
# the figures quoted are medians of each round's own ratios, not ratios of medians.
# BINARY defaults to target/release/difftx (built first). KINDS="diff_v2 standard" (the first
# is timed against the second), PRESET=bench, REPS=5 (decodes per run, median), THREADS.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-12}; shift || true
bins=("$@")
if [ ${#bins[@]} -eq 0 ]; then
  cargo build --release --quiet
  bins=(target/release/difftx)
fi
for b in "${bins[@]}"; do
  [ -x "$b" ] || { echo "kinds_decode.sh: $b: not an executable" >&2; exit 1; }
done
read -r -a kinds <<<"${KINDS:-diff_v2 standard}"
[ ${#kinds[@]} -eq 2 ] || { echo "kinds_decode.sh: KINDS must name two attention kinds" >&2; exit 1; }
threads=(); [ -n "${THREADS:-}" ] && threads=(--threads "$THREADS")
runs=()
for bi in "${!bins[@]}"; do for k in "${kinds[@]}"; do runs+=("$bi $k"); done; done
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for r in $(seq "$rounds"); do
  for i in $(seq 0 $((${#runs[@]} - 1))); do
    read -r bi k <<<"${runs[$(((i + r) % ${#runs[@]}))]}"
    json=$("${bins[$bi]}" bench decode --attention "$k" --preset "${PRESET:-bench}" \
      --reps "${REPS:-5}" "${threads[@]}" --json)
    tps=$(python3 -c "import json,sys; print(json.loads(sys.argv[1])['decode_tokens_per_s'])" "$json")
    echo "$r $bi $k $tps" >>"$out"
  done
  echo -ne "\rround $r/$rounds" >&2
done
echo >&2
python3 - "$out" "${kinds[@]}" "${bins[@]}" <<'PY'
import collections, statistics as st, sys
path, ka, kb, bins = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
tps = collections.defaultdict(dict)
for line in open(path):
    r, bi, k, v = line.split()
    tps[(int(bi), r)][k] = float(v)
rounds = sorted({r for _, r in tps}, key=int)
def show(label, xs):
    print(f"{label}: median {st.median(xs):.3f} (rounds {' '.join(f'{x:.3f}' for x in xs)})")
for bi, b in enumerate(bins):
    t = [tps[(bi, r)] for r in rounds]
    print(f"{b}: {ka} median {st.median(x[ka] for x in t):,.0f} tok/s, {kb} {st.median(x[kb] for x in t):,.0f}")
    show(f"  {ka} time over {kb}", [x[kb] / x[ka] for x in t])
for bi in range(1, len(bins)):
    for k in (ka, kb):
        show(f"{k}: {bins[bi]} time over {bins[0]}", [tps[(0, r)][k] / tps[(bi, r)][k] for r in rounds])
PY
