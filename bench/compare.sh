#!/usr/bin/env bash
# Side-by-side benchmarks, alternating difftx and PyTorch rounds so both see the same machine,
# then the median of each side and their ratio.
#
#   bench/compare.sh train  [ROUNDS] [KIND...]  training step, `bench` preset: difftx vs PyTorch eager
#                                               (COMPILE=1 adds torch.compile; PRESET=medium BATCH=2 for the larger model;
#                                               BF16=1: bf16 matmuls on both sides, difftx --bf16 vs torch.autocast)
#   bench/compare.sh decode [ROUNDS] [KIND...]  prefill and batch-1 decode: difftx vs HF transformers eager
#                                               on the same weights (exported with `difftx export`);
#                                               BF16=1: difftx --bf16 vs transformers in bfloat16
# Needs: pip install torch safetensors numpy transformers. THREADS (default 2) for both sides.
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:-train}; shift || true
rounds=${1:-3}; shift || true
kinds=("$@"); [ ${#kinds[@]} -gt 0 ] || kinds=(diff_v1 standard)
threads=${THREADS:-2}
preset=${PRESET:-bench}
bf16=(); [ "${BF16:-0}" = 1 ] && bf16=(--bf16)
cargo build --release --quiet
bin=target/release/difftx
field() { python3 -c "import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])" "$1" "$2"; }
summary() { python3 - "$@" <<'PY'
import statistics, sys
label, unit, higher = sys.argv[1], sys.argv[2], sys.argv[3] == "higher"
cols = [(n, list(map(float, v.split()))) for n, v in zip(sys.argv[4::2], sys.argv[5::2])]
med = {n: statistics.median(v) for n, v in cols}
base = cols[0][0]
parts = [f"{n} median {m:.1f} {unit}" for n, m in med.items()]
ratios = [f"{base}/{n} {(med[base] / m if higher else m / med[base]):.2f}x" for n, m in med.items() if n != base]
print(f"{label}: " + ", ".join(parts) + " | speed " + ", ".join(ratios))
PY
}
tmp=$(mktemp -d)
for kind in "${kinds[@]}"; do
  if [ "$what" = train ]; then
    seq_args=(); py_seq=()
    if [ -n "${SEQ:-}" ]; then seq_args=(--seq "$SEQ"); fi
    d_all=""; p_all=""; c_all=""
    for r in $(seq "$rounds"); do
      d=$($bin --threads "$threads" "${bf16[@]}" bench train --preset "$preset" --batch "${BATCH:-8}" --attention "$kind" "${seq_args[@]}" --warmup 2 --steps 8 --json)
      p=$(python3 bench/pytorch_reference.py --preset "$preset" --batch "${BATCH:-8}" ${SEQ:+--seq "$SEQ"} --attention "$kind" --threads "$threads" "${bf16[@]}" --warmup 2 --steps 8 --json 2>/dev/null)
      d_all+=" $(field "$d" step_ms)"; p_all+=" $(field "$p" step_ms)"
      line="$kind round $r: difftx $(field "$d" step_ms) ms (peak RSS $(( $(field "$d" peak_rss_bytes) / 1048576 )) MiB), pytorch eager $(field "$p" step_ms) ms"
      if [ "${COMPILE:-0}" = 1 ]; then
        c=$(python3 bench/pytorch_reference.py --preset "$preset" --batch "${BATCH:-8}" ${SEQ:+--seq "$SEQ"} --attention "$kind" --threads "$threads" "${bf16[@]}" --warmup 3 --steps 8 --compile --json 2>/dev/null)
        c_all+=" $(field "$c" step_ms)"; line+=", torch.compile $(field "$c" step_ms) ms"
      fi
      echo "$line"
    done
    if [ "${COMPILE:-0}" = 1 ]; then
      summary "$kind train step" ms lower difftx "$d_all" pytorch_eager "$p_all" torch_compile "$c_all"
    else
      summary "$kind train step" ms lower difftx "$d_all" pytorch_eager "$p_all"
    fi
  else
    "$bin" init --preset "$preset" --attention "$kind" --out "$tmp/$kind" 2>/dev/null
    "$bin" export --model "$tmp/$kind" --format hf --out "$tmp/${kind}_hf" 2>/dev/null
    dd=""; hd=""; dp=""; hp=""
    for r in $(seq "$rounds"); do
      d=$($bin --threads "$threads" "${bf16[@]}" bench decode --model "$tmp/$kind" --prompt-len 128 --new-tokens 128 --reps 3 --json)
      h=$(python3 bench/hf_decode.py "$tmp/${kind}_hf" --threads "$threads" "${bf16[@]}" --prompt-len 128 --new-tokens 128 --reps 3 2>/dev/null | tail -1)
      dd+=" $(field "$d" decode_tokens_per_s)"; hd+=" $(field "$h" decode_tokens_per_s)"
      dp+=" $(field "$d" prefill_tokens_per_s)"; hp+=" $(field "$h" prefill_tokens_per_s)"
      echo "$kind round $r: decode difftx $(field "$d" decode_tokens_per_s) tok/s, transformers $(field "$h" decode_tokens_per_s) tok/s; prefill difftx $(field "$d" prefill_tokens_per_s), transformers $(field "$h" prefill_tokens_per_s)"
    done
    summary "$kind decode (batch 1)" tok/s higher difftx "$dd" transformers "$hd"
    summary "$kind prefill (128 tokens)" tok/s higher difftx "$dp" transformers "$hp"
  fi
done
rm -rf "$tmp"
