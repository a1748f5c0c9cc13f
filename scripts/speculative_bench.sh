#!/usr/bin/env bash
# Speculative decoding with a draft model against plain decoding, batch 1, greedy: a `medium`
# standard model and a `tiny` draft, both trained on the built-in text (data/demo.txt,
# byte-level, context 256), continuing a passage of it. Alternating rounds of `bench decode`
# (3 repetitions each, medians), the tokens/s and the drafts accepted printed per round.
#
#   bash scripts/speculative_bench.sh [OUT_DIR] [ROUNDS]    (training: ~25 min on 2 cores)
#
# DIFFTX (default target/release/difftx), THREADS (2), K (draft tokens a step, 4), QUANT
# (e.g. q8_0; default f32) pick the binary and the settings.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-runs/speculative}; rounds=${2:-3}
bin=${DIFFTX:-target/release/difftx}; t=${THREADS:-2}
[ -x "$bin" ] || cargo build --release --locked
mkdir -p "$out"
# 1. The model (160 steps from scratch, then 240 more at a lower rate) and the draft
if [ ! -d "$out/medium2" ]; then
  "$bin" --threads "$t" train --data data/demo.txt --preset medium --attention standard \
    --max-position-embeddings 256 --batch 4 --steps 160 --lr 1e-3 --warmup 16 --out "$out/medium"
  "$bin" --threads "$t" train --data data/demo.txt --init-from "$out/medium" --batch 4 \
    --steps 240 --lr 6e-4 --warmup 10 --out "$out/medium2"
fi
[ -d "$out/draft" ] || "$bin" --threads "$t" train --data data/demo.txt --preset tiny \
  --attention standard --max-position-embeddings 256 --batch 8 --steps 500 --lr 3e-3 \
  --warmup 20 --out "$out/draft"
# 2. The prompt: 110 bytes of the text; 128 new tokens
python3 - "$out/prompt.txt" <<'PY'
import sys
t = open("data/demo.txt").read()
i = t.find('  "The Program"')
open(sys.argv[1], "w").write(t[i:i + 110])
PY
quant=(); [ -n "${QUANT:-}" ] && quant=(--quant "$QUANT")
for r in $(seq "$rounds"); do
  for mode in plain draft; do
    extra=(); [ $mode = draft ] && extra=(--draft-model "$out/draft" --draft-tokens "${K:-4}")
    "$bin" --threads "$t" bench decode --model "$out/medium2" --prompt-file "$out/prompt.txt" \
      --new-tokens 128 --reps 3 --json "${quant[@]}" "${extra[@]}" 2>/dev/null |
      python3 -c 'import sys,json; d=json.load(sys.stdin); print(sys.argv[1], sys.argv[2], "%.1f tok/s," % d["decode_tokens_per_s"], d["accepted"], "of", d["drafted"], "drafted accepted")' "round $r" "$mode"
  done
done
