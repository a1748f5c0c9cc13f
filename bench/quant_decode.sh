#!/usr/bin/env bash
# Decode and prefill speed of the weight formats against each other on one build: f32, bf16
# (`--bf16`), q8_0 and q4_0 (`--quant`), in an order that rotates from round to round.
#
#   bench/quant_decode.sh [ROUNDS]
#
# Each run is `difftx bench decode --preset $PRESET --attention standard --prompt-len $PROMPT
# --new-tokens $NEW --vocab-size $VOCAB --reps $REPS --json`. The machine is shared and noisy:
# the figures quoted are medians over rounds, and the ratios medians of each round's own ratios
# (to f32 and to bf16). PRESET=medium, PROMPT=1 (decode at depth 0; 512 for depth 512 and
# prefill 512), NEW=128 (tokens decoded), VOCAB=256, REPS=3, FORMATS="f32 bf16 q8_0 q4_0".
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5}
cargo build --release --quiet
read -r -a formats <<<"${FORMATS:-f32 bf16 q8_0 q4_0}"
flags() {
  case $1 in
    f32) ;;
    bf16) echo --bf16 ;;
    *) echo --quant "$1" ;;
  esac
}
out=$(mktemp)
trap 'rm -f "$out"' EXIT
n=${#formats[@]}
for r in $(seq "$rounds"); do
  for i in $(seq 0 $((n - 1))); do
    f=${formats[$(((i + r) % n))]}
    # shellcheck disable=SC2046
    target/release/difftx $( [ "$f" = bf16 ] && echo --bf16 ) bench decode \
      --preset "${PRESET:-medium}" --attention standard --prompt-len "${PROMPT:-1}" \
      --new-tokens "${NEW:-128}" --vocab-size "${VOCAB:-256}" --reps "${REPS:-3}" --json \
      $( [ "$f" != bf16 ] && flags "$f" ) \
      | jq -c --arg f "$f" --arg r "$r" '{round: $r, format: $f, decode: .decode_tokens_per_s, prefill: .prefill_tokens_per_s}' >>"$out"
  done
done
python3 - "$out" "${formats[@]}" <<'PY'
import json, statistics as st, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
formats = sys.argv[2:]
by = {(r["round"], r["format"]): r for r in rows}
rounds = sorted({r["round"] for r in rows}, key=int)
med = lambda v: st.median(v)
print(f"{len(rounds)} rounds; medians (tokens/s) and the medians of each round's ratios")
for f in formats:
    dec = [by[(r, f)]["decode"] for r in rounds]
    pre = [by[(r, f)]["prefill"] for r in rounds]
    line = f"{f:5} decode {med(dec):9.1f}  prefill {med(pre):9.1f}"
    for base in ("f32", "bf16"):
        if base in formats and base != f:
            rd = med([by[(r, f)]["decode"] / by[(r, base)]["decode"] for r in rounds])
            rp = med([by[(r, f)]["prefill"] / by[(r, base)]["prefill"] for r in rounds])
            line += f"  vs {base}: decode {rd:.2f}x prefill {rp:.2f}x"
    print(line)
PY
