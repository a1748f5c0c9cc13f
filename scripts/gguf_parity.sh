#!/usr/bin/env bash
# Proof that an exported GGUF file is the same model in llama.cpp: greedy continuations of a
# few prompts by `difftx generate` on the checkpoint and by llama.cpp's `llama-simple` on the
# f32 GGUF must be the same text; then the bf16 export's continuations (told apart, not
# required equal) and llama-perplexity of the f32 and bf16 files next to `difftx eval`.
#
#   scripts/gguf_parity.sh MODEL [TEXT] [NEW_TOKENS]
#
# MODEL: a `standard` model directory or training run (e.g. runs/fortunes/standard from
# scripts/train_fortunes.sh); TEXT: a file to score (default: Debian's fortunes "literature");
# NEW_TOKENS: tokens per continuation (default 100). Needs llama.cpp built by
# `bench/llamacpp.sh build` (LLAMACPP_DIR as there) and a release build of difftx.
# PROMPTS (newline-separated) overrides the prompts. Exits 1 if an f32 continuation differs.
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:?usage: scripts/gguf_parity.sh MODEL [TEXT] [NEW_TOKENS]}
text=${2:-/usr/share/games/fortunes/literature}
n=${3:-100}
bin=${DIFFTX:-target/release/difftx}
llama=${LLAMACPP_DIR:-$HOME/.cache/difftx/llama.cpp}/build/bin
threads=${THREADS:-2}
prompts=${PROMPTS:-$'The secret of\nQ:\tWhat do you call\nYou will be'}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

# 1. Export at f32 and bf16.
for q in f32 bf16; do
  "$bin" export --model "$model" --format gguf --quant "$q" --out "$tmp/$q.gguf" 2>/dev/null
done

# 2. Greedy continuations, prompt by prompt (llama-simple prints the prompt, then the text).
same=0; total=0
while IFS= read -r prompt; do
  total=$((total + 1))
  d=$("$bin" --threads "$threads" generate --model "$model" --prompt "$prompt" --temperature 0 --max-new-tokens "$n" 2>/dev/null)
  for q in f32 bf16; do
    l=$("$llama/llama-simple" -m "$tmp/$q.gguf" -n "$n" "$prompt" 2>/dev/null)
    printf -v "l_$q" '%s' "${l#"$prompt"}"
  done
  verdict=DIFFERENT; [ "$d" = "$l_f32" ] && { verdict=SAME; same=$((same + 1)); }
  echo "=== prompt $total: $(printf '%q' "$prompt"), $n tokens: f32 $verdict"
  echo "--- difftx generate (checkpoint):"; echo "$d"
  echo "--- llama.cpp llama-simple (f32 GGUF):"; echo "$l_f32"
  if [ "$l_bf16" = "$d" ]; then echo "--- llama.cpp (bf16 GGUF): the same text"
  else echo "--- llama.cpp (bf16 GGUF), differs:"; echo "$l_bf16"; fi
done <<< "$prompts"
echo "f32 GGUF: $same of $total greedy continuations equal difftx's"

# 3. Perplexity: difftx eval scores every token in windows of the context length; llama-perplexity
# scores the second half of each context-length chunk, so the two differ by design. Compare
# each tool's f32 and bf16.
ctx=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['max_position_embeddings'])" "$(ls -d "$model"/checkpoints/step-* 2>/dev/null | tail -1 || echo "$model")/config.json")
for q in f32 bf16; do
  flag=(); [ "$q" = bf16 ] && flag=(--bf16)
  e=$("$bin" --threads "$threads" "${flag[@]}" eval --model "$model" --data "$text" --json 2>/dev/null)
  p=$("$llama/llama-perplexity" -m "$tmp/$q.gguf" -f "$text" -c "$ctx" -b "$ctx" -t "$threads" 2>&1 | grep -o 'Final estimate: PPL = [0-9.]* +/- [0-9.]*' || echo "no estimate")
  echo "$q: difftx eval $e | llama-perplexity (c $ctx): $p"
done
[ "$same" = "$total" ]
