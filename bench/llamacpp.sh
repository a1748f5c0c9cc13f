#!/usr/bin/env bash
# llama.cpp next to difftx on the same weights.
#
#   bench/llamacpp.sh build                     build llama.cpp (once; cached in $LLAMACPP_DIR)
#   bench/llamacpp.sh bench [ROUNDS] [FORMAT...] export one freshly initialised `standard` model
#                                               at each FORMAT (default: f32 bf16; any name that
#                                               `difftx export --format gguf --quant` takes), then
#                                               per round and format run `llama-bench -p 512 -n 128
#                                               -d 0,DEPTH` and `difftx bench decode` (prompt 1 and
#                                               DEPTH, 128 new tokens) one after the other at the same
#                                               threads, and print medians and difftx/llama.cpp ratios
#
# difftx runs a format as: f32 the default, bf16 with --bf16, any other NAME with --quant NAME.
#
# llama.cpp is built from the source vendored in PyPI's llama-cpp-python sdist (so only PyPI is
# needed): cmake and ninja come from pip, the build is native (-DGGML_NATIVE=ON), Release.
# Environment: LLAMACPP_DIR (default $HOME/.cache/difftx/llama.cpp), THREADS (default 2),
# PRESET (default medium; its context must hold DEPTH + 128 tokens), VOCAB (the model's
# vocabulary, default 256; 32000 sizes the LM head as a real tokenizer's), DEPTH (the second
# decode depth, default 512; 1920 at PRESET=large, whose context is 2048), KV (difftx's --kv-cache,
# default f32; llama.cpp's own cache is f16, so KV=bf16 compares caches of equal width), JOBS (build parallelism,
# default 2), DIFFTX (a difftx binary to run instead of building this checkout: for a machine
# without cargo, with a llama.cpp build copied into LLAMACPP_DIR/build/bin). Not part of CI.
# On a shared, loaded machine run it as
# `OMP_WAIT_POLICY=passive bench/llamacpp.sh bench`: llama.cpp's OpenMP threads otherwise spin
# for each other and its decode drops ten-fold (docs/BENCHMARKS.md); difftx uses no OpenMP.
set -euo pipefail
cd "$(dirname "$0")/.."
LLAMACPP_DIR=${LLAMACPP_DIR:-$HOME/.cache/difftx/llama.cpp}
what=${1:-bench}; shift || true
case $what in build|bench) ;; *) echo "usage: bench/llamacpp.sh build | bench [ROUNDS] [FORMAT...]" >&2; exit 2 ;; esac

# 1. Build llama.cpp once: download the sdist, unpack it, configure and build the given tools
#    (those not built yet).
build_llamacpp() {
  local bin="$LLAMACPP_DIR/build/bin" t missing=()
  for t in "$@"; do [ -x "$bin/$t" ] || missing+=("$t"); done
  [ ${#missing[@]} -eq 0 ] && return
  mkdir -p "$LLAMACPP_DIR"
  python3 -m pip install --quiet cmake ninja
  if [ ! -d "$LLAMACPP_DIR/src" ]; then
    local dl="$LLAMACPP_DIR/download"
    mkdir -p "$dl"
    python3 -m pip download --quiet --no-binary llama-cpp-python --no-deps -d "$dl" llama-cpp-python
    local sdist; sdist=$(ls "$dl"/llama_cpp_python-*.tar.gz | head -1)
    mkdir -p "$LLAMACPP_DIR/unpacked"
    tar -xzf "$sdist" -C "$LLAMACPP_DIR/unpacked"
    # The sdist carries git metadata; cmake's git calls rewrite its index on every configure,
    # which re-triggers configure forever under ninja. The build does not need it.
    local vendored; vendored=$(ls -d "$LLAMACPP_DIR"/unpacked/llama_cpp_python-*/vendor/llama.cpp | head -1)
    rm -rf "$vendored/.git" "$vendored/../../.git"
    mv "$vendored" "$LLAMACPP_DIR/src"
    rm -rf "$LLAMACPP_DIR/unpacked"
  fi
  nice -n 10 cmake -S "$LLAMACPP_DIR/src" -B "$LLAMACPP_DIR/build" -G Ninja \
    -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DCMAKE_BUILD_TYPE=Release
  nice -n 10 cmake --build "$LLAMACPP_DIR/build" -j "${JOBS:-2}" --target "${missing[@]}"
  echo "llama.cpp tools in $bin"
}

if [ "$what" = build ]; then
  # what this script and scripts/gguf_parity.sh run, then the tools for users
  build_llamacpp llama-simple llama-bench llama-perplexity llama-cli llama-server llama-speculative
  exit 0
fi
build_llamacpp llama-bench

# 2. The same freshly initialised `standard` model, exported once per format.
rounds=${1:-3}; shift || true
formats=("$@"); [ ${#formats[@]} -gt 0 ] || formats=(f32 bf16)
threads=${THREADS:-2}
preset=${PRESET:-medium}
depth=${DEPTH:-512}
bin=${DIFFTX:-}
if [ -z "$bin" ]; then cargo build --release --quiet; bin=target/release/difftx; fi
llama=$LLAMACPP_DIR/build/bin
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
vocab=${VOCAB:-256}
"$bin" init --preset "$preset" --attention standard --vocab-size "$vocab" --out "$tmp/model" 2>/dev/null
for f in "${formats[@]}"; do
  "$bin" export --model "$tmp/model" --format gguf --quant "$f" --out "$tmp/$f.gguf" 2>/dev/null
done
# difftx's switch for a format: f32 is the default, bf16 is --bf16, the others --quant NAME
difftx_flags() {
  case $1 in f32) ;; bf16) echo --bf16 ;; *) echo --quant "$1" ;; esac
  echo --kv-cache "${KV:-f32}"
}
field() { python3 -c "import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])" "$1" "$2"; }
# llama-bench's JSON: the tokens/s of (n_prompt, n_gen, n_depth)
llama_ts() { python3 -c "
import json,sys
for r in json.loads(sys.argv[1]):
    if (r['n_prompt'], r['n_gen'], r['n_depth']) == tuple(map(int, sys.argv[2:5])): print(r['avg_ts'])" "$@"; }
summary() { python3 - "$@" <<'PY'
import statistics, sys
label, llama, ours = sys.argv[1], list(map(float, sys.argv[2].split())), list(map(float, sys.argv[3].split()))
ml, md = statistics.median(llama), statistics.median(ours)
print(f"{label}: llama.cpp median {ml:,.0f} tok/s, difftx median {md:,.0f} tok/s | difftx/llama.cpp {md / ml:.2f}x ({len(ours)} rounds)")
PY
}

# 3. Alternate llama-bench and difftx bench decode per round and format; medians and ratios.
#    A format whose run fails on either side is reported (which side, how) and left out of the
#    later rounds; the others go on, and the script exits 1 at the end.
declare -A L=() D=() failed=()
# (set -e does not reach inside a function called before ||: each step says its own failure)
one_round() {
  local f=$1 r=$2 lb d0 dd p512 fl vals
  lb=$("$llama/llama-bench" -m "$tmp/$f.gguf" -p 512 -n 128 -d "0,$depth" -t "$threads" -r 3 -o json 2>"$tmp/err") ||
    { local rc=$?; echo "$f: llama-bench failed on the GGUF (exit $rc); its last words:" >&2; tail -n 5 "$tmp/err" >&2
      # 132: SIGILL, as llama.cpp's sapphirerapids variant did on q8_0/q4_0 under a sandbox
      [ "$rc" != 132 ] || echo "$f: an illegal instruction in llama.cpp; a build with every CPU variant can be steered off the one it loaded (above) by moving that libggml-cpu-*.so aside" >&2
      return 1; }
  read -r -a fl <<< "$(difftx_flags "$f" | tr '\n' ' ')"
  run() {
    "$bin" --threads "$threads" bench decode "${fl[@]}" --model "$tmp/model" --reps 3 --json "$@" ||
      { echo "$f: difftx bench decode failed (exit $?): $bin ${fl[*]} $*" >&2; return 1; }
  }
  d0=$(run --prompt-len 1 --new-tokens 128) || return 1
  dd=$(run --prompt-len "$depth" --new-tokens 128) || return 1
  # prefill 512 from the depth run when it is 512, else from a run of its own
  p512=$dd; [ "$depth" = 512 ] || p512=$(run --prompt-len 512 --new-tokens 8) || return 1
  vals=("$(llama_ts "$lb" 0 128 0)" "$(field "$d0" decode_tokens_per_s)"
        "$(llama_ts "$lb" 0 128 "$depth")" "$(field "$dd" decode_tokens_per_s)"
        "$(llama_ts "$lb" 512 0 0)" "$(field "$p512" prefill_tokens_per_s)")
  L[$f,tg0]+=" ${vals[0]}"; D[$f,tg0]+=" ${vals[1]}"
  L[$f,tgd]+=" ${vals[2]}"; D[$f,tgd]+=" ${vals[3]}"
  L[$f,pp512]+=" ${vals[4]}"; D[$f,pp512]+=" ${vals[5]}"
  printf "%s round %s (llama.cpp / difftx tok/s): decode d0 %.0f / %.0f, decode d$depth %.0f / %.0f, prefill 512 %.0f / %.0f\n" \
    "$f" "$r" "${vals[@]}"
}
for r in $(seq "$rounds"); do
  for f in "${formats[@]}"; do
    [ -z "${failed[$f]:-}" ] || continue
    one_round "$f" "$r" || failed[$f]=1
  done
done
sdist=$(ls "$LLAMACPP_DIR"/download/*.tar.gz 2>/dev/null | head -1 || true)
from=$LLAMACPP_DIR; [ -z "$sdist" ] || from=$(basename "$sdist")
echo "preset $preset (standard, vocabulary $vocab), $threads threads, difftx KV cache ${KV:-f32}, llama.cpp from $from"
for f in "${formats[@]}"; do
  if [ -z "${D[$f,tg0]:-}" ]; then echo "$f: no round completed (see above)"; continue; fi
  summary "$f decode at depth 0 (tg128)" "${L[$f,tg0]}" "${D[$f,tg0]}"
  summary "$f decode at depth $depth (tg128 @ d$depth)" "${L[$f,tgd]}" "${D[$f,tgd]}"
  summary "$f prefill 512 (pp512)" "${L[$f,pp512]}" "${D[$f,pp512]}"
done
[ ${#failed[@]} -eq 0 ] || { echo "failed: ${!failed[*]}" >&2; exit 1; }
