#!/usr/bin/env bash
# Quality under quantisation (issue 23), on models trained on real text:
#   1. train `standard`, `diff_v1` and `diff_v2` at the `small` preset (context 256, the same
#      seed and token budget) on Debian's fortunes corpus, holding out the file `fortunes`;
#   2. `difftx eval --quant f32|q8_0|q4_0` of each on the held-out file: the loss change
#      against f32, judged against the targets (q8_0 within 0.5%, q4_0 within 4%);
#   3. the `standard` model through llama.cpp (scripts/gguf_parity.sh with FORMATS="q8_0
#      q4_0"): greedy continuations of difftx on the checkpoint and llama.cpp on the f32 GGUF
#      must be the same text (and the q8_0 / q4_0 pairs are reported), and llama-perplexity's
#      change at q8_0 / q4_0 against its f32, beside difftx's on the same model and text.
#
#   scripts/quant_quality.sh
#
# Environment: OUT (run folders, default runs/quant_quality), STEPS (default 300), NEW (greedy
# tokens per prompt, default 100), THREADS (default 2), DIFFTX (default target/release/difftx),
# LLAMACPP_DIR (as bench/llamacpp.sh; its `build` makes the tools), SKIP_TRAIN=1 to reuse the
# runs in OUT. Needs `apt-get install fortunes` and python3. Not part of CI: 24.5 minutes at a
# load average of 6-10 on 2 cores (2026-11-25). Exits 1 if a target is missed, an f32 greedy
# continuation differs or llama-perplexity gives no estimate.
set -euo pipefail
cd "$(dirname "$0")/.."
DIFFTX=${DIFFTX:-target/release/difftx}
OUT=${OUT:-runs/quant_quality}
steps=${STEPS:-300}
threads=${THREADS:-2}
corpus=/usr/share/games/fortunes
heldout=$corpus/fortunes
[ -f "$heldout" ] || { echo "quant_quality: $heldout not found (apt-get install fortunes)" >&2; exit 2; }
[ -x "$DIFFTX" ] || cargo build --release --quiet
status=0

# 1. The training files: every text of the corpus but the held-out one (no .dat indexes, no
#    .u8 links to the same texts).
train=()
for f in "$corpus"/*; do
  [ -L "$f" ] || [[ $f == *.dat ]] || [ "$f" = "$heldout" ] || train+=("$f")
done
echo "training on ${#train[@]} files ($(cat "${train[@]}" | wc -c) bytes), held out: $heldout ($(wc -c < "$heldout") bytes)"
# a byte unigram model of the training text, scored on the held-out text (nats per byte):
# what a model that learned no context would reach
unigram=$(python3 - "$heldout" "${train[@]}" <<'PY'
import collections, math, sys
held, train = open(sys.argv[1], "rb").read(), b"".join(open(f, "rb").read() for f in sys.argv[2:])
c = collections.Counter(train)
n = len(train) + 256  # add-one smoothing over the 256 byte values
print(f"{-sum(math.log((c[b] + 1) / n) for b in held) / len(held):.4f}")
PY
)
echo "unigram loss on the held-out text: $unigram nats/byte"

for kind in standard diff_v1 diff_v2; do
  [ "${SKIP_TRAIN:-0}" = 1 ] && continue
  rm -rf "${OUT:?}/$kind"
  /usr/bin/time -f "$kind: trained in %e s wall" "$DIFFTX" --threads "$threads" train \
    --data "${train[@]}" --val-data "$heldout" --preset small --attention "$kind" \
    --context 256 --batch 8 --steps "$steps" --lr 2e-3 --eval-every 100 --val-batches 8 \
    --ckpt-every "$steps" --seed 0 --log-every 100 --out "$OUT/$kind"
done

# 2. Each kind at f32, q8_0 and q4_0 on the held-out text; the loss change and the verdicts.
rows=()
for kind in standard diff_v1 diff_v2; do
  losses=()
  for q in f32 q8_0 q4_0; do
    fl=(); [ "$q" = f32 ] || fl=(--quant "$q")
    e=$("$DIFFTX" --threads "$threads" eval "${fl[@]}" --model "$OUT/$kind" --data "$heldout" --json 2>/dev/null)
    echo "$kind $q: $e"
    losses+=("$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["loss"])' "$e")")
  done
  rows+=("$kind ${losses[*]}")
done
python3 - "$unigram" "${rows[@]}" <<'PY' || status=1
import sys
unigram, bad = float(sys.argv[1]), False
print(f"\n| kind | f32 loss | q8_0 | q4_0 |  (held-out loss, nats/byte; unigram {unigram:.4f})")
print("| --- | ---: | ---: | ---: |")
for row in sys.argv[2:]:
    kind, f, q8, q4 = row.split()
    f, q8, q4 = float(f), float(q8), float(q4)
    cells = []
    for q, limit in ((q8, 0.5), (q4, 4.0)):
        d = 100 * (q / f - 1)
        ok = abs(d) <= limit
        bad |= not ok
        cells.append(f"{q:.4f} ({d:+.3f}%, {'pass' if ok else 'FAIL'} at {limit}%)")
    bad |= f >= unigram
    print(f"| {kind} | {f:.4f}{'' if f < unigram else ' (NOT below unigram)'} | {cells[0]} | {cells[1]} |")
sys.exit(1 if bad else 0)
PY

# 3. The standard model in llama.cpp: greedy text and perplexity at f32, q8_0 and q4_0.
echo
FORMATS="q8_0 q4_0" THREADS=$threads DIFFTX=$DIFFTX \
  scripts/gguf_parity.sh "$OUT/standard" "$heldout" "${NEW:-100}" || status=1
echo "quant_quality: $([ "$status" = 0 ] && echo 'all targets met, f32 greedy text equal' || echo 'a target missed, an f32 greedy text differs or a perplexity is missing (above)')"
exit "$status"
