#!/usr/bin/env python3
"""Continue training a difftx export with PyTorch + transformers on many processes, then save a
directory difftx reads back (docs/SCALE_OUT.md).

  # 2 processes on one CPU machine (gloo)
  torchrun --nproc_per_node 2 scripts/train_hf.py --model m_hf --data corpus/ --out m_trained
  # 8 GPUs on each of 4 machines (nccl): the same script, only the launcher differs
  torchrun --nnodes 4 --nproc_per_node 8 --rdzv_backend c10d --rdzv_endpoint HOST:29500 \\
      scripts/train_hf.py --model m_hf --data corpus/ --out m_trained --bf16 --fsdp

--model is any directory AutoModelForCausalLM loads (a `difftx export --format hf`, diff_v2
included with trust_remote_code). The backend is nccl when CUDA is present, else gloo. Data
parallel: DDP by default; --fsdp shards with FSDP2 (`fully_shard` on every decoder layer named
by the model's `_no_split_modules`, then on the whole model). Each process draws its own
windows of --context + 1 tokens from the token stream (seeded by --seed and its rank); the
loss printed is the mean over processes. Rank 0 saves the result with save_pretrained (plus
the tokenizer) and, with --eval FILE, prints transformers' loss on FILE computed the way
`difftx eval` does: non-overlapping windows of max_position_embeddings + 1 tokens that overlap
by one, the mean cross-entropy over every predicted token.
"""

import argparse
import json
import math
import os
import time
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

warnings.filterwarnings("ignore")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402

hf_logging.set_verbosity_error()
hf_logging.disable_progress_bar()


def read_text(path, skip=None):
    """A file, or every file of a directory (sorted, skipping strfile's .dat and .u8 indexes
    and the file `skip`, the held-out evaluation text)."""
    p = Path(path)
    skip = Path(skip).resolve() if skip else None
    files = sorted(f for f in p.iterdir() if f.is_file() and f.suffix not in (".dat", ".u8")
                   and f.resolve() != skip) if p.is_dir() else [p]
    return "".join(f.read_text(encoding="utf-8", errors="replace") for f in files)


def tokenize(tok, text):
    return torch.tensor(tok(text, add_special_tokens=False)["input_ids"], dtype=torch.long)


@torch.no_grad()
def eval_loss(model, ids, t, device):
    """difftx eval's rule (src/infer/loss.rs): windows start at 0, t, 2t, ...; each predicts up
    to t tokens; the mean over every predicted token."""
    total, count = 0.0, 0
    for s in range(0, len(ids) - 1, t):
        n = min(t, len(ids) - 1 - s)
        x = ids[s:s + n][None].to(device)
        y = ids[s + 1:s + n + 1][None].to(device)
        logits = model(input_ids=x, use_cache=False).logits.float()
        total += F.cross_entropy(logits[0], y[0], reduction="sum").item()
        count += n
    return total / count, count


def wrap(model, args, device):
    """DDP, or FSDP2 with one unit per decoder layer."""
    if args.fsdp:
        from torch.distributed.fsdp import fully_shard
        names = set(model._no_split_modules)
        for m in model.modules():
            if type(m).__name__ in names:
                fully_shard(m)
        return fully_shard(model)
    ids = [device.index] if device.type == "cuda" else None
    return torch.nn.parallel.DistributedDataParallel(model, device_ids=ids)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--data", required=True, help="text file or directory of text files")
    ap.add_argument("--out", required=True)
    ap.add_argument("--eval", help="text file whose loss rank 0 prints after training (left out of --data)")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--batch", type=int, default=8, help="windows per process and step")
    ap.add_argument("--context", type=int, default=0, help="0: max_position_embeddings")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1, help="CPU threads per process")
    ap.add_argument("--fsdp", action="store_true", help="FSDP2 instead of DDP")
    ap.add_argument("--bf16", action="store_true", help="autocast matmuls to bf16 (GPU)")
    ap.add_argument("--grad-checkpointing", action="store_true")
    args = ap.parse_args()

    # 1. processes: nccl on GPUs, gloo on CPUs
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if cuda:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    # 2. the model and the token stream
    model = AutoModelForCausalLM.from_pretrained(args.model, trust_remote_code=True, dtype=torch.float32).to(device)
    if args.grad_checkpointing:
        model.gradient_checkpointing_enable()
    model.train()
    tok = AutoTokenizer.from_pretrained(args.model, trust_remote_code=True)
    ids = tokenize(tok, read_text(args.data, skip=args.eval))
    t = args.context or model.config.max_position_embeddings
    ddp = wrap(model, args, device)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / args.warmup) * 0.5 * (1 + math.cos(math.pi * min(s, args.steps) / args.steps)))
    g = torch.Generator().manual_seed(args.seed * 1000 + rank)
    if rank == 0:
        print(json.dumps({"world": world, "backend": dist.get_backend(), "device": str(device),
                          "tokens": len(ids), "context": t, "batch_per_process": args.batch,
                          "params": sum(p.numel() for p in model.parameters()), "fsdp": args.fsdp}), flush=True)

    # 3. training: every process its own windows, gradients averaged by DDP / FSDP
    log = []
    t0 = time.time()
    for step in range(args.steps):
        starts = torch.randint(0, len(ids) - t - 1, (args.batch,), generator=g)
        x = torch.stack([ids[s:s + t] for s in starts]).to(device)
        y = torch.stack([ids[s + 1:s + t + 1] for s in starts]).to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.bf16):
            logits = ddp(input_ids=x, use_cache=False).logits
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        mean = mean.item() / world
        log.append(mean)
        if rank == 0:
            print(json.dumps({"step": step + 1, "loss": round(mean, 4), "lr": sched.get_last_lr()[0],
                              "s": round(time.time() - t0, 1)}), flush=True)

    # 4. rank 0 saves and evaluates; under FSDP the full state is gathered first and loaded into
    #    a plain (unsharded) copy, so the saved code is the model's own
    if args.fsdp:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
        state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0:
        if args.fsdp:
            model = AutoModelForCausalLM.from_pretrained(args.model, trust_remote_code=True, dtype=torch.float32)
            model.load_state_dict(state)
            model.to(device)
        out = Path(args.out)
        model.save_pretrained(out)
        tok.save_pretrained(out)
        result = {"first_loss": log[0], "last_loss": log[-1], "steps": args.steps}
        if args.eval:
            model.eval()
            ev, n = eval_loss(model, tokenize(tok, read_text(args.eval)), model.config.max_position_embeddings, device)
            result.update({"eval_loss": ev, "eval_tokens": n, "eval_file": args.eval})
        print(json.dumps(result), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
