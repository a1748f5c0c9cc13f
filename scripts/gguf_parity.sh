#!/usr/bin/env bash
# Proof that an exported GGUF file is the same model in llama.cpp: greedy continuations of a
# few prompts by `difftx generate` on the checkpoint and by llama.cpp's `llama-simple` on the
# f32 GGUF must be the same text; then, for each other format, llama.cpp on that format's
# export against difftx running the same format (told apart, not required equal), and
# llama-perplexity of every file next to `difftx eval` at the same format, with each tool's
# change against its own f32.
#
#   scripts/gguf_parity.sh MODEL [TEXT] [NEW_TOKENS]
#
# MODEL: a `standard` model directory or training run (e.g. runs/fortunes/standard from
# scripts/train_fortunes.sh); TEXT: a file to score (default: Debian's fortunes "literature");
# NEW_TOKENS: tokens per continuation (default 100). Needs llama.cpp built by
# `bench/llamacpp.sh build` (LLAMACPP_DIR as there) and a release build of difftx.
# PROMPTS (newline-separated) overrides the prompts; FORMATS (space-separated, default bf16)
# the formats beside f32: any that `difftx export --format gguf --quant` takes, run by difftx
# as --bf16 or --quant NAME. Exits 1 if an f32 continuation differs or llama-perplexity gives
# no estimate.
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:?usage: scripts/gguf_parity.sh MODEL [TEXT] [NEW_TOKENS]}
text=${2:-/usr/share/games/fortunes/literature}
n=${3:-100}
bin=${DIFFTX:-target/release/difftx}
llama=${LLAMACPP_DIR:-$HOME/.cache/difftx/llama.cpp}/build/bin
threads=${THREADS:-2}
prompts=${PROMPTS:-$'The secret of\nQ:\tWhat do you call\nYou will be'}
read -r -a others <<< "${FORMATS:-bf16}"
formats=(f32 "${others[@]}")
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
# difftx's switch for a format: f32 is the default, bf16 is --bf16, the others --quant NAME
difftx_flags() { case $1 in f32) ;; bf16) echo --bf16 ;; *) echo --quant "$1" ;; esac; }

# 1. Export at every format.
for q in "${formats[@]}"; do
  "$bin" export --model "$model" --format gguf --quant "$q" --out "$tmp/$q.gguf" 2>/dev/null
done

# 2. Greedy continuations, prompt by prompt and format by format (llama-simple prints the
#    prompt, then the text). f32 must agree; the other formats are reported.
declare -A same
total=0
while IFS= read -r prompt; do
  total=$((total + 1))
  for q in "${formats[@]}"; do
    read -r -a fl <<< "$(difftx_flags "$q")"
    d=$("$bin" --threads "$threads" generate "${fl[@]}" --model "$model" --prompt "$prompt" --temperature 0 --max-new-tokens "$n" 2>/dev/null)
    l=$("$llama/llama-simple" -m "$tmp/$q.gguf" -n "$n" "$prompt" 2>/dev/null)
    l=${l#"$prompt"}
    [ "$q" = f32 ] && d_f32=$d
    verdict=DIFFERENT; [ "$d" = "$l" ] && { verdict=SAME; same[$q]=$((${same[$q]:-0} + 1)); }
    echo "=== prompt $total: $(printf '%q' "$prompt"), $n tokens, $q: $verdict"
    echo "--- difftx generate ${fl[*]:-(f32)} (checkpoint):"; echo "$d"
    if [ "$d" = "$l" ]; then echo "--- llama.cpp llama-simple ($q GGUF): the same text"
    else echo "--- llama.cpp llama-simple ($q GGUF):"; echo "$l"; fi
    if [ "$q" != f32 ]; then
      [ "$d" = "$d_f32" ] && echo "--- (difftx's $q text equals its f32 text)" || echo "--- (difftx's $q text differs from its f32 text)"
    fi
  done
done <<< "$prompts"
for q in "${formats[@]}"; do
  echo "$q GGUF: ${same[$q]:-0} of $total greedy continuations equal difftx's at $q"
done

# 3. Perplexity: difftx eval scores every token in windows of the context length; llama-perplexity
# scores the second half of each context-length chunk, so the two differ by design. Compare
# each tool's formats with its own f32: the loss (ln PPL) and the perplexity, relative.
ppl_missing=0
ctx=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['max_position_embeddings'])" "$(ls -d "$model"/checkpoints/step-* 2>/dev/null | tail -1 || echo "$model")/config.json")
for q in "${formats[@]}"; do
  read -r -a fl <<< "$(difftx_flags "$q")"
  e=$("$bin" --threads "$threads" eval "${fl[@]}" --model "$model" --data "$text" --json 2>/dev/null)
  # llama-perplexity (ggml 0.25.3) sometimes exits 0 without printing its last chunk and the
  # final estimate (2 of 3 runs by hand on a loaded machine; it logs through a worker
  # thread): up to three tries, each scoring the same text the same way.
  for try in 1 2 3; do
    "$llama/llama-perplexity" -m "$tmp/$q.gguf" -f "$text" -c "$ctx" -b "$ctx" -t "$threads" > "$tmp/ppl.log" 2>&1 || true
    grep -q 'Final estimate' "$tmp/ppl.log" && break
    echo "llama-perplexity on the $q file: no final estimate (try $try of 3)" >&2
  done
  if ! p=$(grep -o 'Final estimate: PPL = [0-9.]* +/- [0-9.]*' "$tmp/ppl.log"); then
    p="no estimate"; ppl_missing=1
    echo "llama-perplexity on the $q file gave no estimate; its last lines:" >&2; tail -5 "$tmp/ppl.log" >&2
  fi
  echo "$q: difftx eval $e | llama-perplexity (c $ctx): $p"
  python3 - "$q" "$e" "$p" "$tmp/ref" <<'PY'
import json, math, os, re, sys
q, e, p, ref = sys.argv[1:]
loss = json.loads(e)["loss"]
m = re.search(r"PPL = ([0-9.]+)", p)
ppl = float(m.group(1)) if m else float("nan")
if q == "f32":
    open(ref, "w").write(f"{loss} {ppl}")
else:
    l0, p0 = map(float, open(ref).read().split())
    print(f"{q} against f32: difftx loss {100 * (loss / l0 - 1):+.4f}% (ppl {100 * (math.exp(loss - l0) - 1):+.4f}%) | "
          f"llama.cpp ln PPL {100 * (math.log(ppl) / math.log(p0) - 1):+.4f}% (PPL {100 * (ppl / p0 - 1):+.4f}%)")
PY
done
[ "${same[f32]:-0}" = "$total" ] && [ "$ppl_missing" = 0 ]
