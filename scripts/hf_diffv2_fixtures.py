#!/usr/bin/env python3
"""Fixtures for difftx's diff_v2 export to Hugging Face transformers (docs/INTEROP.md).

  cargo build --release && python scripts/hf_diffv2_fixtures.py [--out tests/fixtures/hf]

For each case it writes a small native difftx diff_v2 model with seeded random weights
(<out>/<case>/native/config.json + model.safetensors), exports it with the built binary
(`target/release/difftx export --format hf`, into a temporary directory), loads the export with
AutoModelForCausalLM.from_pretrained(..., trust_remote_code=True) (float32, CPU, 1 thread) and
stores what transformers computes:

  <out>/<case>/expected.json          ids, loss, greedy continuation, the export's file digests
  <out>/<case>/expected.safetensors   logits [T, V] F32 of the ids

Cases: diffv2_gqa (H 2 differential heads = 4 query heads over H_kv 1, untied) and
diffv2_tied (H 2, H_kv 2, tied embeddings). The Rust test (tests/hf_interop.rs) exports the
same native weights itself, checks that its files are byte-identical to the ones transformers
ran (xxh3-128 digests from manifest.json), and compares logits, loss and greedy tokens.

The script also checks, and fails loudly otherwise: greedy generation with and without the KV
cache agree, and a left-padded batch generates what each prompt generates alone; gradients with gradient checkpointing equal those without; a save_pretrained of
the loaded model has the same tensors bit for bit; `_init_weights` gives lambda_proj a std near
0.02 (difftx's N(0, 0.02)).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

warnings.filterwarnings("ignore")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
from transformers import AutoModelForCausalLM  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402

hf_logging.set_verbosity_error()
hf_logging.disable_progress_bar()

ROOT = Path(__file__).resolve().parent.parent
BIN = ROOT / "target" / "release" / "difftx"
CASES = {
    "diffv2_gqa": dict(heads=2, kv=1, tied=False, seed=11),
    "diffv2_tied": dict(heads=2, kv=2, tied=True, seed=12),
}
D, F, L, HEAD_DIM, V, CTX = 64, 128, 2, 16, 256, 64
# fixed token ids (bytes of a short text) for logits and loss, and a prompt to continue
TEXT = b"Differential attention cancels common-mode noise."
PROMPT = b"The cat "
NEW_TOKENS = 24


def native_config(case):
    c = CASES[case]
    return {
        "model_type": "difftx", "attention": "diff_v2", "vocab_size": V, "hidden_size": D,
        "intermediate_size": F, "num_hidden_layers": L, "num_attention_heads": c["heads"],
        "num_key_value_heads": c["kv"], "head_dim": HEAD_DIM, "max_position_embeddings": CTX,
        "rope_theta": 10000.0, "rms_norm_eps": 1e-5, "tie_word_embeddings": c["tied"],
        "tokenizer": "byte",
    }


def native_weights(case):
    """difftx's tensor names and shapes (docs/SPEC.md); matrices N(0, 0.15), lambda_proj
    N(0, 0.5) (so lambda varies per token), norm weights 1 + N(0, 0.1), seeded."""
    c = CASES[case]
    h, kv, d = c["heads"], c["kv"], HEAD_DIM
    shapes = {"model.embed_tokens.weight": [V, D], "model.norm.weight": [D]}
    if not c["tied"]:
        shapes["lm_head.weight"] = [V, D]
    for l in range(L):
        p = f"model.layers.{l}."
        shapes.update({
            p + "input_layernorm.weight": [D], p + "post_attention_layernorm.weight": [D],
            p + "self_attn.q_proj.weight": [2 * h * d, D], p + "self_attn.k_proj.weight": [kv * d, D],
            p + "self_attn.v_proj.weight": [kv * d, D], p + "self_attn.o_proj.weight": [D, h * d],
            p + "self_attn.lambda_proj.weight": [h, D], p + "mlp.gate_proj.weight": [F, D],
            p + "mlp.up_proj.weight": [F, D], p + "mlp.down_proj.weight": [D, F],
        })
    g = torch.Generator().manual_seed(c["seed"])
    out = {}
    for name in sorted(shapes):
        z = torch.randn(shapes[name], generator=g, dtype=torch.float64)
        if name.endswith("norm.weight"):
            t = 1.0 + 0.1 * z
        elif "lambda_proj" in name:
            t = 0.5 * z
        else:
            t = 0.15 * z
        out[name] = t.to(torch.float32).contiguous()
    return out


def manifest_digests(d):
    return {k: v["xxh3_128"] for k, v in json.loads((d / "manifest.json").read_text())["files"].items()}


def checks(model, export_dir, ids):
    """The properties the fixture does not store; each raises on failure."""
    # 1. greedy generation with the KV cache equals generation without it
    p = torch.tensor([list(PROMPT)])
    a = model.generate(p, max_new_tokens=NEW_TOKENS, do_sample=False, use_cache=True)
    b = model.generate(p, max_new_tokens=NEW_TOKENS, do_sample=False, use_cache=False)
    assert torch.equal(a, b), "cache and no-cache generation differ"
    # 1b. a left-padded batch generates what each prompt generates alone
    short = list(PROMPT[3:])
    alone = model.generate(torch.tensor([short]), max_new_tokens=NEW_TOKENS, do_sample=False)
    pad = len(PROMPT) - len(short)
    batch = model.generate(torch.tensor([list(PROMPT), [0] * pad + short]), do_sample=False,
                           attention_mask=torch.tensor([[1] * len(PROMPT), [0] * pad + [1] * len(short)]),
                           max_new_tokens=NEW_TOKENS, pad_token_id=0)
    assert torch.equal(batch[0], a[0]), "batched generation differs (first prompt)"
    assert torch.equal(batch[1, len(PROMPT):], alone[0, len(short):]), "left-padded generation differs"
    # 2. gradient checkpointing: the same gradients
    def grads():
        model.zero_grad()
        model(ids, labels=ids).loss.backward()
        return {n: q.grad.clone() for n, q in model.named_parameters()}
    model.train()
    g0 = grads()
    model.gradient_checkpointing_enable()
    g1 = grads()
    model.gradient_checkpointing_disable()
    model.eval()
    for n in g0:
        assert torch.allclose(g0[n], g1[n], rtol=1e-5, atol=1e-7), f"checkpointed gradient of {n} differs"
    assert all(g.abs().sum() > 0 for g in g0.values()), "a parameter has no gradient"
    # 3. save_pretrained keeps every tensor bit for bit
    with tempfile.TemporaryDirectory() as t:
        model.save_pretrained(t)
        mine, theirs = load_file(Path(t) / "model.safetensors"), load_file(export_dir / "model.safetensors")
        assert mine.keys() == theirs.keys(), (sorted(mine), sorted(theirs))
        for k in mine:
            assert torch.equal(mine[k], theirs[k]), f"save_pretrained changed {k}"
    # 4. a fresh model from the config: lambda_proj ~ N(0, 0.02)
    fresh = AutoModelForCausalLM.from_config(model.config, trust_remote_code=True)
    std = fresh.model.layers[0].self_attn.lambda_proj.weight.std().item()
    assert 0.015 < std < 0.025, f"lambda_proj init std {std}"
    return len(g0)


def make(case, out):
    # 1. the native model, exported by difftx
    case_dir = out / case
    native = case_dir / "native"
    native.mkdir(parents=True, exist_ok=True)
    (native / "config.json").write_text(json.dumps(native_config(case), indent=2) + "\n")
    save_file(native_weights(case), str(native / "model.safetensors"), metadata={"format": "pt"})
    tmp = Path(tempfile.mkdtemp()) / "export"
    subprocess.run([str(BIN), "export", "--format", "hf", "--model", str(native), "--out", str(tmp)],
                   check=True, capture_output=True)
    # 2. transformers on the export
    model = AutoModelForCausalLM.from_pretrained(tmp, trust_remote_code=True, dtype=torch.float32)
    model.eval()
    ids = torch.tensor([list(TEXT)])
    with torch.no_grad():
        o = model(ids, labels=ids)
        gen = model.generate(torch.tensor([list(PROMPT)]), max_new_tokens=NEW_TOKENS, do_sample=False)
    new_ids = gen[0, len(PROMPT):].tolist()
    n_params = checks(model, tmp, ids)
    # 3. what the Rust test compares
    save_file({"logits": o.logits[0].contiguous()}, str(case_dir / "expected.safetensors"))
    exp = {
        "made_by": "scripts/hf_diffv2_fixtures.py",
        "transformers_version": __import__("transformers").__version__,
        "torch_version": torch.__version__,
        "ids": list(TEXT),
        "loss": o.loss.item(),
        "loss_rule": "model(ids, labels=ids).loss: mean cross-entropy of logits[t] against ids[t+1]",
        "prompt_ids": list(PROMPT),
        "max_new_tokens": NEW_TOKENS,
        "new_ids": new_ids,
        "export_xxh3_128": manifest_digests(tmp),
    }
    (case_dir / "expected.json").write_text(json.dumps(exp, indent=1) + "\n")
    print(f"{case}: loss {o.loss.item():.6f}, greedy {new_ids}, {n_params} tensors checked")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(ROOT / "tests" / "fixtures" / "hf"))
    a = ap.parse_args()
    torch.set_num_threads(1)
    if not BIN.exists():
        sys.exit(f"{BIN} not found: run `cargo build --release` first")
    for case in CASES:
        make(case, Path(a.out))


if __name__ == "__main__":
    main()
