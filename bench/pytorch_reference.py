#!/usr/bin/env python3
"""PyTorch float32 eager (or torch.compile) training-step benchmark on the SPEC `bench` preset.

Model: vocab 256, D 256, L 4, d 32, T 256, B 8, SwiGLU width 704, untied embeddings;
diff_v1 H=4 (H_kv 4), standard H=8 (H_kv 8), diff_v2 H=8 (H_kv 4), as difftx's `bench` preset. The model definition is the
one in scripts/reference.py, on its SDPA path (F.scaled_dot_product_attention, is_causal=True).

A step is: forward, mean cross-entropy, backward, AdamW (lr 1e-3, betas (0.9, 0.95),
weight_decay 0.1 on matrices only, gradient clipping at norm 1). Prints the median step time over --steps timed steps after
--warmup untimed ones; with --json, exactly one JSON object on stdout.
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import reference  # noqa: E402

BENCH = dict(vocab_size=256, hidden_size=256, intermediate_size=704, num_hidden_layers=4,
             head_dim=32, max_position_embeddings=256, rope_theta=10000.0, rms_norm_eps=1e-5,
             tie_word_embeddings=False)
# difftx's `medium` preset (the "larger preset" of the performance targets): D 512, L 8, d 64.
MEDIUM = dict(BENCH, hidden_size=512, intermediate_size=1408, num_hidden_layers=8, head_dim=64,
              max_position_embeddings=1024)
PRESETS = {"bench": BENCH, "medium": MEDIUM}
HEADS = {"standard": 8, "diff_v1": 4, "diff_v2": 8}
KV_HEADS = {"standard": 8, "diff_v1": 4, "diff_v2": 4}
B, T = 8, 256
DIFF_V1_PARAMS = 3_345_408


def main():
    ap = argparse.ArgumentParser(description="PyTorch training-step benchmark (SPEC bench preset)")
    ap.add_argument("--attention", choices=reference.ATTENTIONS, default="diff_v1")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--compile", action="store_true", help="torch.compile the model")
    ap.add_argument("--bf16", action="store_true",
                    help="mixed precision as difftx --bf16: forward and loss under torch.autocast "
                         "(bf16 matmuls in oneDNN: AMX or AVX512_BF16), f32 weights, gradients and AdamW")
    ap.add_argument("--heads", type=int, default=None,
                    help="override num_attention_heads (default: the preset's, see HEADS)")
    ap.add_argument("--kv-heads", type=int, default=None,
                    help="override num_key_value_heads (default: the preset's, or = --heads when given)")
    ap.add_argument("--preset", choices=sorted(PRESETS), default="bench")
    ap.add_argument("--batch", type=int, default=8, help="sequences per step")
    ap.add_argument("--seq", type=int, default=None, help="context length (default: the preset's)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true", help="print one JSON object and nothing else")
    args = ap.parse_args()
    assert args.steps >= 1, "--steps must be at least 1"

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    H = args.heads or HEADS[args.attention]
    Hkv = args.kv_heads or (KV_HEADS[args.attention] if args.heads is None else H)
    B, T = args.batch, args.seq or PRESETS[args.preset]["max_position_embeddings"]
    preset = dict(PRESETS[args.preset])
    if args.seq:
        preset["max_position_embeddings"] = args.seq
    cfg = reference.make_config(args.attention, num_attention_heads=H, num_key_value_heads=Hkv,
                                **preset)
    # Usual small-model init for training (values do not affect timing).
    params = reference.init_params(cfg, seed=args.seed, dtype=torch.float32, linear_std=0.02,
                                   lambda_std=0.1, norm_std=0.0, embed_std=0.02)
    model = reference.DiffTx(cfg, params, attn_impl="sdpa")
    n_params = sum(p.numel() for p in model.parameters())
    assert n_params == reference.num_params(cfg)
    if args.attention == "diff_v1" and (H, Hkv) == (4, 4) and args.preset == "bench":
        assert n_params == DIFF_V1_PARAMS, f"bench diff_v1 has {n_params} params, want {DIFF_V1_PARAMS}"

    # As difftx: weight decay on matrices only, gradient clipping at global norm 1.
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.95))
    fwd = torch.compile(model) if args.compile else model
    g = torch.Generator().manual_seed(args.seed + 1)
    V = cfg["vocab_size"]

    def step():
        tokens = torch.randint(0, V, (B, T + 1), generator=g)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
            logits = fwd(tokens[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, V).float(), tokens[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss.item()

    log = (lambda *a: print(*a, file=sys.stderr)) if args.json else print
    for i in range(args.warmup):
        t0 = time.perf_counter()
        loss = step()
        log(f"warmup {i}: {1e3 * (time.perf_counter() - t0):.1f} ms  loss {loss:.4f}")
    times = []
    for i in range(args.steps):
        t0 = time.perf_counter()
        loss = step()
        times.append(time.perf_counter() - t0)
        log(f"step {i}: {1e3 * times[-1]:.1f} ms  loss {loss:.4f}")
    med = statistics.median(times)
    result = {
        "impl": "pytorch",
        "attention": args.attention,
        "params": n_params,
        "step_ms": round(med * 1e3, 3),
        "tokens_per_second": round(B * T / med, 1),
        "threads": args.threads,
        "compile": bool(args.compile),
        "bf16": bool(args.bf16),
        "steps": args.steps,
    }
    if args.json:
        print(json.dumps(result))
    else:
        print(f"pytorch {torch.__version__} {args.attention}: params {n_params:,}  "
              f"median step {result['step_ms']:.1f} ms  {result['tokens_per_second']:.0f} tokens/s  "
              f"(H {H}, H_kv {Hkv}, threads {args.threads}, compile {bool(args.compile)}, bf16 {bool(args.bf16)}, B {B}, T {T}, "
              f"{args.steps} steps after {args.warmup} warm-up)")


if __name__ == "__main__":
    main()
