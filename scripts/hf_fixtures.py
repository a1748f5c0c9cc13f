#!/usr/bin/env python3
"""Hugging Face transformers fixtures for difftx's `llama` / `diffllama` import (see docs/SPEC.md,
"Hugging Face interop", and scripts/HF_DIFFLLAMA_NOTES.md for how HF's DiffLlama computes).

Three modes:

  python scripts/hf_fixtures.py [--out tests/fixtures/hf]
      Trains a tiny byte-level BPE tokenizer, builds four small random HF models, saves each as
      an HF model directory and writes the HF outputs next to it:

        <out>/<case>/config.json                 HF config (see the case list for its rope form)
        <out>/<case>/generation_config.json      HF generation config (eos id)
        <out>/<case>/model.safetensors           or model-0000k-of-0000n.safetensors + index
        <out>/<case>/tokenizer.json              HF tokenizers format (+ tokenizer_config.json)
        <out>/<case>/expected.json               prompt, ids, loss, greedy continuation, ...
        <out>/<case>/expected.safetensors        logits [T, V] F32, loss_token_nll [T-1] F32,
                                                 prompt_ids / loss_ids / generated_ids I64

      Cases:
        llama_gqa              LlamaForCausalLM, H 4, Hkv 2, d 16, untied, f32, legacy
                               top-level "rope_theta": 500000 (config.json post-edited)
        diffllama_gqa          DiffLlamaForCausalLM, same sizes (4 HF heads = 2 differential
                               pairs, Hkv 2), tied, f32, legacy top-level "rope_theta": 10000
        llama_bf16_sharded     Llama, tied, bf16 weights in >= 2 shards + index.json,
                               "rope_parameters" form (theta 10000); expected outputs computed
                               in f32 from the bf16-rounded weights
        diffllama_rope_params  DiffLlama, D 48, L 3, 4 HF heads / 4 kv heads (MHA), d 16
                               (H*d != D), rms_norm_eps 1e-6, untied, "rope_parameters" form
                               with theta 50000; the eos row of lm_head is set so that greedy
                               generation stops at <|endoftext|> before max_new_tokens.

      Every expected output is computed from the model re-loaded from the written directory
      (AutoModelForCausalLM, dtype float32, attn_implementation="eager"), on CPU, 1 thread.
      The script also converts each HF model to the native difftx layout (hf_to_native below:
      row permutations only, plus subln.weight = 1) and checks scripts/reference.py's forward
      against the HF logits.

  python scripts/hf_fixtures.py --check-export DIR --prompt TEXT --max-new-tokens N
      Loads DIR with AutoModelForCausalLM / AutoTokenizer, greedy-generates, prints one JSON line
      {"ids": [new ids], "text": new text, "prompt_ids": [...], "stopped_by_eos": bool, ...}.

  python scripts/hf_fixtures.py --decode-bench DIR --threads N --new-tokens N [--prompt-len P]
      HF eager batch-1 speed: prefill tokens/s for a P-token prompt, decode tokens/s (greedy,
      use_cache=True, after a warm-up), printed as one JSON line.
"""

import argparse
import copy
import hashlib
import importlib.util
import json
import math
import os
import shutil
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

warnings.filterwarnings("ignore")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

import transformers  # noqa: E402
from transformers import (  # noqa: E402
    AutoModelForCausalLM,
    AutoTokenizer,
    DiffLlamaConfig,
    DiffLlamaForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
)
from transformers.utils import logging as hf_logging  # noqa: E402

hf_logging.set_verbosity_error()
hf_logging.disable_progress_bar()

ROOT = Path(__file__).resolve().parent.parent
EOS = "<|endoftext|>"
VOCAB_SIZE = 320
TRAIN_TEXT = "/usr/share/common-licenses/GPL-3"
PROMPT = "The licenses for most software are designed"
# ~200 characters, tokenized the same way as the prompt (no special tokens added).
LOSS_TEXT = ("When we speak of free software, we are referring to freedom, not price. Our General "
             "Public Licenses are designed to make sure that you have the freedom to distribute "
             "copies of free software.")
MAX_NEW_TOKENS = 20
LOSS_RULE = ("labels = input_ids (the loss text's ids, no BOS/EOS added); "
             "model(input_ids, labels=labels).loss: HF shifts internally, logits[t] predicts "
             "ids[t+1], cross-entropy (natural log) over the vocab in float32, mean over the T-1 "
             "positions t = 0..T-2; loss_token_nll[t] = -log_softmax(logits[t])[ids[t+1]].")


# ----------------------------------------------------------------------------------------------
# tokenizer


def train_tokenizer(text_path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    text = Path(text_path).read_text(encoding="utf-8")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([text], trainer)
    assert tok.get_vocab_size() == VOCAB_SIZE, tok.get_vocab_size()
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS)
    info = {
        "kind": "byte-level BPE (tokenizers), ByteLevel pre-tokenizer add_prefix_space=false, "
                "no normalizer, no BOS, no template post-processing",
        "vocab_size": tok.get_vocab_size(),
        "special_tokens": {EOS: tok.token_to_id(EOS)},
        "trained_on": str(text_path),
        "trained_on_sha256": hashlib.sha256(text.encode("utf-8")).hexdigest(),
    }
    return wrapped, info


# ----------------------------------------------------------------------------------------------
# models


def reinit_(model, seed, std=0.1, norm_std=0.1, lambda_std=0.3):
    """Every Linear / embedding weight N(0, std), every RMSNorm weight 1 + N(0, norm_std), DiffLlama
    lambda_* vectors N(0, lambda_std). Parameters are visited in sorted-name order with one
    generator, so the result depends only on the seed and the shapes."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
            z = torch.randn(p.shape, generator=g, dtype=torch.float64)
            if name.endswith("norm.weight"):
                t = 1.0 + norm_std * z
            elif ".lambda_" in name:
                t = lambda_std * z
            else:
                assert name.endswith(".weight"), name
                t = std * z
            p.copy_(t.to(p.dtype))


CASES = {
    "llama_gqa": dict(
        arch="llama", seed=4, tie=False, save_dtype="float32", rope_form="rope_theta",
        rope_theta=500000.0,
        sizes=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                   max_position_embeddings=128)),
    "diffllama_gqa": dict(
        arch="diffllama", seed=2, tie=True, save_dtype="float32", rope_form="rope_theta",
        rope_theta=10000.0,
        sizes=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                   max_position_embeddings=128)),
    "llama_bf16_sharded": dict(
        arch="llama", seed=3, tie=True, save_dtype="bfloat16", rope_form="rope_parameters",
        rope_theta=10000.0, max_shard_size="100KB",
        sizes=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                   max_position_embeddings=128)),
    "diffllama_rope_params": dict(
        arch="diffllama", seed=5, tie=False, save_dtype="float32", rope_form="rope_parameters",
        rope_theta=50000.0, force_eos_at=11, rms_norm_eps=1e-6,
        sizes=dict(hidden_size=48, intermediate_size=96, num_hidden_layers=3,
                   num_attention_heads=4, num_key_value_heads=4, head_dim=16,
                   max_position_embeddings=128)),
}


def build_model(case, vocab_size, eos_id):
    kw = dict(case["sizes"], vocab_size=vocab_size, tie_word_embeddings=case["tie"],
              bos_token_id=None, eos_token_id=eos_id, pad_token_id=None,
              rope_parameters={"rope_type": "default", "rope_theta": case["rope_theta"]},
              attention_bias=False, hidden_act="silu")
    if "rms_norm_eps" in case:
        kw["rms_norm_eps"] = case["rms_norm_eps"]
    if case["arch"] == "llama":
        kw["mlp_bias"] = False
        cfg = LlamaConfig(**kw)
        cls = LlamaForCausalLM
    else:
        cfg = DiffLlamaConfig(**kw)
        cls = DiffLlamaForCausalLM
    cfg._attn_implementation = "eager"
    torch.manual_seed(case["seed"])
    model = cls(cfg).float().eval()
    reinit_(model, case["seed"])
    if case["tie"]:
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    return model


def load_dir(path, dtype=torch.float32):
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="eager")
    return model.eval()


def to_legacy_rope(config_path):
    """Rewrite config.json from transformers-5 form {"rope_parameters": {"rope_type": "default",
    "rope_theta": X}} to the transformers-4 form {"rope_theta": X, "rope_scaling": null}."""
    cfg = json.loads(Path(config_path).read_text())
    rp = cfg.pop("rope_parameters")
    assert rp == {"rope_type": "default", "rope_theta": rp["rope_theta"]}, rp
    cfg["rope_theta"] = rp["rope_theta"]
    cfg["rope_scaling"] = None
    Path(config_path).write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


# ----------------------------------------------------------------------------------------------
# HF -> native difftx layout (docs/SPEC.md), used for the cross-check against scripts/reference.py


def rope_perm(d):
    """native row r of a head <- HF row rope_perm(d)[r]: (2j, 2j+1) <- (j, j + d/2)."""
    out = []
    for j in range(d // 2):
        out += [j, j + d // 2]
    return torch.tensor(out)


def hf_to_native(model):
    """Returns (native cfg dict, native params {name: float64 tensor}). Exact: row permutations of
    q_proj/k_proj/v_proj, and subln.weight = ones(2d) for diffllama."""
    c = model.config
    sd = {k: v.detach().to(torch.float64).clone() for k, v in model.state_dict().items()}
    tie = bool(c.tie_word_embeddings)
    if tie:
        sd.pop("lm_head.weight", None)
    H, Hkv, d, D = c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.hidden_size
    perm = rope_perm(d)
    diff = c.model_type == "diffllama"
    for l in range(c.num_hidden_layers):
        p = f"model.layers.{l}.self_attn."
        q = sd[p + "q_proj.weight"].view(H, d, D)[:, perm]
        k = sd[p + "k_proj.weight"].view(Hkv, d, D)[:, perm]
        v = sd[p + "v_proj.weight"].view(Hkv, d, D)
        if diff:
            # native sub-head 2i <- HF head i, 2i+1 <- HF head i + H/2 (same for k with Hkv);
            # native v head g (2d rows) <- [HF v head g ; HF v head g + Hkv/2]
            qo = [h for i in range(H // 2) for h in (i, i + H // 2)]
            ko = [h for g in range(Hkv // 2) for h in (g, g + Hkv // 2)]
            q, k, v = q[qo], k[ko], v[ko]
            sd[p + "subln.weight"] = torch.ones(2 * d, dtype=torch.float64)
        sd[p + "q_proj.weight"] = q.reshape(-1, D)
        sd[p + "k_proj.weight"] = k.reshape(-1, D)
        sd[p + "v_proj.weight"] = v.reshape(-1, D)
    rp = c.rope_parameters
    assert rp["rope_type"] == "default", rp
    cfg = {
        "model_type": "difftx",
        "attention": "diff_v1" if diff else "standard",
        "vocab_size": c.vocab_size,
        "hidden_size": D,
        "intermediate_size": c.intermediate_size,
        "num_hidden_layers": c.num_hidden_layers,
        "num_attention_heads": H // 2 if diff else H,
        "num_key_value_heads": Hkv // 2 if diff else Hkv,
        "head_dim": d,
        "max_position_embeddings": c.max_position_embeddings,
        "rope_theta": float(rp["rope_theta"]),
        "rms_norm_eps": float(c.rms_norm_eps),
        "tie_word_embeddings": tie,
    }
    return cfg, sd


def load_reference():
    path = Path(__file__).resolve().parent / "reference.py"
    if not path.exists():
        return None
    spec = importlib.util.spec_from_file_location("difftx_reference", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# ----------------------------------------------------------------------------------------------
# expected outputs


def _byte_decoder():
    """inverse of the GPT-2 byte -> printable-unicode table used by the ByteLevel pre-tokenizer"""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) \
        + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def token_bytes(tok, ids):
    """raw bytes of byte-level tokens (special tokens as their UTF-8 text)"""
    dec = _byte_decoder()
    out = bytearray()
    special = set(tok.all_special_ids)
    for i in ids:
        t = tok.convert_ids_to_tokens(i)
        out += t.encode("utf-8") if i in special else bytes(dec[ch] for ch in t)
    return bytes(out)


def greedy(model, ids, max_new_tokens, eos_id):
    inp = torch.tensor([ids])
    out = model.generate(inp, attention_mask=torch.ones_like(inp), max_new_tokens=max_new_tokens,
                         do_sample=False, use_cache=True, eos_token_id=eos_id,
                         pad_token_id=eos_id, return_dict_in_generate=True, output_scores=True)
    new = out.sequences[0, len(ids):].tolist()
    # top-1 minus top-2 of the (unprocessed, greedy => identical) scores at each step
    margins = []
    for s in out.scores:
        top = torch.topk(s[0].float(), 2).values
        margins.append(float(top[0] - top[1]))
    return new, margins


def compute_expected(model, tok, eos_id):
    enc = tok(PROMPT)
    prompt_ids = list(enc["input_ids"])
    raw_ids = tok.backend_tokenizer.encode(PROMPT, add_special_tokens=False).ids
    bos_added = prompt_ids != raw_ids
    loss_ids = list(tok(LOSS_TEXT)["input_ids"])
    mpe = model.config.max_position_embeddings
    assert len(loss_ids) <= mpe and len(prompt_ids) + MAX_NEW_TOKENS <= mpe
    with torch.no_grad():
        logits = model(torch.tensor([prompt_ids])).logits[0].float().contiguous()
        x = torch.tensor([loss_ids])
        out = model(x, labels=x)
        lp = torch.log_softmax(out.logits[0].float(), dim=-1)
        nll = -lp[:-1].gather(1, x[0, 1:, None])[:, 0]
        loss = float(out.loss)
        assert abs(loss - float(nll.mean())) < 1e-5, (loss, float(nll.mean()))
    new_ids, margins = greedy(model, prompt_ids, MAX_NEW_TOKENS, eos_id)
    # the same greedy continuation, recomputed without the KV cache, from full forwards
    seq = list(prompt_ids)
    with torch.no_grad():
        for _ in range(len(new_ids)):
            nxt = int(model(torch.tensor([seq])).logits[0, -1].argmax())
            seq.append(nxt)
            if nxt == eos_id:
                break
    assert seq[len(prompt_ids):] == new_ids, (seq[len(prompt_ids):], new_ids)
    stopped = len(new_ids) < MAX_NEW_TOKENS and new_ids[-1] == eos_id
    exp = {
        "prompt": PROMPT,
        "prompt_ids": prompt_ids,
        "bos_added": bos_added,
        "eos_token": EOS,
        "eos_token_id": eos_id,
        "logits": {"tensor": "logits", "shape": list(logits.shape), "dtype": "F32",
                   "rule": "float32 forward of prompt_ids (batch 1, no cache); row t = logits "
                           "after token t"},
        "loss_text": LOSS_TEXT,
        "loss_ids": loss_ids,
        "loss": loss,
        "loss_rule": LOSS_RULE,
        "generate": {
            "call": f"model.generate(prompt_ids, max_new_tokens={MAX_NEW_TOKENS}, "
                    "do_sample=False, use_cache=True)",
            "max_new_tokens": MAX_NEW_TOKENS,
            "new_ids": new_ids,
            "new_text": tok.decode(new_ids, skip_special_tokens=False),
            "new_bytes_hex": token_bytes(tok, new_ids).hex(),
            "new_text_is_lossy": token_bytes(tok, new_ids).decode("utf-8", "replace")
            != token_bytes(tok, new_ids).decode("utf-8", "ignore"),
            "stopped_by_eos": stopped,
            "eos_included_in_new_ids": stopped,
            "min_top1_top2_margin": min(margins),
        },
    }
    tensors = {
        "logits": logits,
        "loss_token_nll": nll.float().contiguous(),
        "prompt_ids": torch.tensor(prompt_ids, dtype=torch.int64),
        "loss_ids": torch.tensor(loss_ids, dtype=torch.int64),
        "generated_ids": torch.tensor(new_ids, dtype=torch.int64),
    }
    return exp, tensors


def diff_lambdas(model):
    out = []
    for l, layer in enumerate(model.model.layers):
        a = layer.self_attn
        l1 = math.exp(float(torch.sum(a.lambda_q1.double() * a.lambda_k1.double())))
        l2 = math.exp(float(torch.sum(a.lambda_q2.double() * a.lambda_k2.double())))
        out.append({"layer": l, "lambda_init": a.lambda_init, "lambda_1": l1, "lambda_2": l2,
                    "lambda_full": l1 - l2 + a.lambda_init})
    return out


def force_eos(model, prompt_ids, eos_id, step):
    """Set lm_head.weight[eos] so that greedy decoding (unchanged before) emits eos at `step`
    (0-based new-token index) at the latest. Only for untied models."""
    assert not model.config.tie_word_embeddings
    new_ids, _ = greedy(model, prompt_ids, step + 1, eos_id)
    assert eos_id not in new_ids[:step]
    seq = torch.tensor([prompt_ids + new_ids[:step]])
    with torch.no_grad():
        hs = model.model(seq).last_hidden_state[0].double()    # final-norm outputs
        h = hs[-1]
        prev = hs[len(prompt_ids) - 1:-1]                         # the earlier decode steps
        # u: h minus its projection on the earlier steps' hidden states, so that eos's logit
        # is ~0 (not the max) at the earlier steps and target at this one
        qb, _ = torch.linalg.qr(prev.T)
        u = h - qb @ (qb.T @ h)
        logits = model.lm_head(h.float()[None])[0].double()
        logits[eos_id] = -float("inf")
        target = float(logits.max()) + 2.0
        model.lm_head.weight[eos_id] = (u * (target / float(u @ h))).float()


# ----------------------------------------------------------------------------------------------
# fixture generation


def write_case(name, case, out_dir, tok, tok_info, ref, log):
    from safetensors.torch import save_file

    eos_id = tok.convert_tokens_to_ids(EOS)
    d = out_dir / name
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    model = build_model(case, len(tok), eos_id)
    if case.get("force_eos_at") is not None:
        force_eos(model, list(tok(PROMPT)["input_ids"]), eos_id, case["force_eos_at"])

    save_kw = {"safe_serialization": True}
    if "max_shard_size" in case:
        save_kw["max_shard_size"] = case["max_shard_size"]
    if case["save_dtype"] == "bfloat16":
        # round the weights to bf16 in place (kept as f32 in memory; the non-persistent RoPE
        # inv_freq buffer must stay f32, so no model.to(bf16) round trip), save a bf16 copy
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(p.to(torch.bfloat16).float())
        copy.deepcopy(model).to(torch.bfloat16).save_pretrained(d, **save_kw)
    else:
        model.save_pretrained(d, **save_kw)
    tok.save_pretrained(d)
    # in-memory reference, f32 (for bf16: the bf16-rounded weights back in f32)
    with torch.no_grad():
        ref_logits = model(torch.tensor([tok(PROMPT)["input_ids"]])).logits[0]

    cfg_path = d / "config.json"
    raw = json.loads(cfg_path.read_text())
    assert "rope_parameters" in raw and "rope_theta" not in raw, sorted(raw)
    if case["rope_form"] == "rope_theta":
        to_legacy_rope(cfg_path)
    raw = json.loads(cfg_path.read_text())

    loaded = load_dir(d)
    assert loaded.config._attn_implementation == "eager"
    assert loaded.config.rope_parameters == {"rope_type": "default",
                                             "rope_theta": case["rope_theta"]}, \
        loaded.config.rope_parameters
    # the saved weights are exactly the in-memory ones (bf16 case: bf16-rounded, upcast exactly)
    sd_mem, sd_disk = model.state_dict(), loaded.state_dict()
    assert sorted(sd_mem) == sorted(sd_disk)
    for k in sd_mem:
        assert torch.equal(sd_mem[k], sd_disk[k]), k
        assert sd_disk[k].dtype == torch.float32, (k, sd_disk[k].dtype)
    exp, tensors = compute_expected(loaded, tok, eos_id)
    assert torch.equal(tensors["logits"], ref_logits.float()), "reload changed the logits"
    # if this fixture's rope form was edited: transformers loads the other form identically
    if case["rope_form"] == "rope_theta":
        alt = d.parent / (name + ".alt.tmp")
        shutil.copytree(d, alt)
        c = json.loads((alt / "config.json").read_text())
        c["rope_parameters"] = {"rope_type": "default", "rope_theta": c.pop("rope_theta")}
        c.pop("rope_scaling")
        (alt / "config.json").write_text(json.dumps(c))
        with torch.no_grad():
            alt_logits = load_dir(alt)(torch.tensor([exp["prompt_ids"]])).logits[0]
        shutil.rmtree(alt)
        assert torch.equal(alt_logits, tensors["logits"])

    # cross-check: HF -> native layout -> scripts/reference.py (float64, naive attention)
    xcheck = None
    if ref is not None:
        ncfg, nparams = hf_to_native(loaded)
        ref.check_config(ncfg)
        assert set(nparams) == set(ref.param_shapes(ncfg)), \
            set(nparams) ^ set(ref.param_shapes(ncfg))
        for k, s in ref.param_shapes(ncfg).items():
            assert tuple(nparams[k].shape) == tuple(s), (k, nparams[k].shape, s)
        with torch.no_grad():
            nl = ref.forward(nparams, ncfg, torch.tensor([exp["prompt_ids"]]))[0]
        err = float((nl - tensors["logits"].double()).abs().max())
        scale = float(tensors["logits"].abs().max())
        assert err < 1e-4 * max(1.0, scale), (name, err)
        xcheck = {"native_config": ncfg, "max_abs_diff_vs_reference_py_f64": err}
        log(f"  {name}: HF f32 vs native reference.py f64 max |diff| = {err:.2e} "
            f"(max |logit| {scale:.2f})")
    else:
        log(f"  {name}: scripts/reference.py not found, cross-check skipped")

    files = sorted(p.name for p in d.iterdir())
    exp = {
        "case": name,
        "model_type": raw["model_type"],
        "architectures": raw.get("architectures"),
        "saved_dtype": case["save_dtype"],
        "compute_dtype": "float32",
        "attn_implementation": "eager",
        "rope_config_form": case["rope_form"],
        "rope_theta": case["rope_theta"],
        "tie_word_embeddings": case["tie"],
        "seed": case["seed"],
        "weight_init": "Linear/embedding N(0, 0.1); RMSNorm weights 1 + N(0, 0.1); "
                       "DiffLlama lambda_q1/k1/q2/k2 N(0, 0.3)"
                       + ("; lm_head row of eos set so greedy stops at eos"
                          if case.get("force_eos_at") is not None else ""),
        "model_files": [f for f in files if f not in ("expected.json", "expected.safetensors")],
        "tokenizer": tok_info,
        **exp,
    }
    if raw["model_type"] == "diffllama":
        exp["diff_lambda"] = diff_lambdas(loaded)
    if xcheck is not None:
        exp["native_crosscheck"] = xcheck
    exp["generated_by"] = {"script": "scripts/hf_fixtures.py",
                           "transformers": transformers.__version__,
                           "torch": torch.__version__.split("+")[0]}
    (d / "expected.json").write_text(json.dumps(exp, indent=2) + "\n")
    save_file(tensors, str(d / "expected.safetensors"), metadata={"prompt": PROMPT})
    g = exp["generate"]
    log(f"  {name}: T={len(exp['prompt_ids'])} loss={exp['loss']:.6f} "
        f"new={len(g['new_ids'])} eos_stop={g['stopped_by_eos']} "
        f"min_margin={g['min_top1_top2_margin']:.4f}")


def generate_all(args):
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    out_dir = Path(args.out)
    if not out_dir.is_absolute():
        out_dir = ROOT / out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    log = lambda s: print(s, file=sys.stderr)  # noqa: E731
    tok, tok_info = train_tokenizer(args.train_text)
    log(f"tokenizer: vocab {tok_info['vocab_size']}, eos id {tok_info['special_tokens'][EOS]}")
    ref = None if args.no_crosscheck else load_reference()
    names = args.cases.split(",") if args.cases else list(CASES)
    for name in names:
        write_case(name, CASES[name], out_dir, tok, tok_info, ref, log)
    total = sum(f.stat().st_size for f in out_dir.rglob("*") if f.is_file())
    log(f"wrote {out_dir} ({total / 1024:.0f} KiB)")
    assert total < 2 * 1024 * 1024, total


# ----------------------------------------------------------------------------------------------
# --check-export / --decode-bench


def parse_dtype(s):
    return "auto" if s == "auto" else getattr(torch, s)


def check_export(args):
    torch.set_num_threads(max(1, args.threads or 1))
    # trust_remote_code: a diff_v2 export brings its own model code (modeling_difftx.py)
    tok = AutoTokenizer.from_pretrained(args.check_export, trust_remote_code=True)
    model = AutoModelForCausalLM.from_pretrained(
        args.check_export, dtype=parse_dtype(args.dtype), attn_implementation=args.attn,
        trust_remote_code=True).eval()
    ids = list(tok(args.prompt)["input_ids"])
    gc = model.generation_config
    eos = gc.eos_token_id if gc.eos_token_id is not None else model.config.eos_token_id
    if eos is None:
        eos = tok.eos_token_id
    eos_list = eos if isinstance(eos, list) else ([eos] if eos is not None else [])
    inp = torch.tensor([ids])
    with torch.no_grad():
        out = model.generate(inp, attention_mask=torch.ones_like(inp),
                             max_new_tokens=args.max_new_tokens, do_sample=False, use_cache=True,
                             eos_token_id=eos, pad_token_id=eos_list[0] if eos_list else None)
    new = out[0, len(ids):].tolist()
    try:
        raw = token_bytes(tok, new).hex()
    except KeyError:  # not a byte-level tokenizer
        raw = None
    print(json.dumps({
        "ids": new,
        "text": tok.decode(new, skip_special_tokens=False),
        "bytes_hex": raw,
        "prompt_ids": ids,
        "stopped_by_eos": bool(new) and new[-1] in eos_list and len(new) < args.max_new_tokens,
        "model_type": model.config.model_type,
        "dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
    }))


def decode_bench(args):
    torch.set_num_threads(args.threads)
    dev = torch.device(args.device)
    model = AutoModelForCausalLM.from_pretrained(
        args.decode_bench, dtype=parse_dtype(args.dtype), attn_implementation=args.attn)
    model = model.to(dev).eval()
    V = model.config.vocab_size
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, V, (1, args.prompt_len), generator=g).to(dev)
    n_params = sum(p.numel() for p in model.parameters())
    from transformers import DynamicCache

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    def prefill():
        with torch.no_grad():
            cache = DynamicCache(config=model.config)
            out = model(prompt, past_key_values=cache, use_cache=True)
        return out

    def decode(n):
        """greedy batch-1 decode of n tokens after a prefill; returns seconds for the n steps."""
        with torch.no_grad():
            out = prefill()
            cache = out.past_key_values
            nxt = out.logits[:, -1:].argmax(-1)
            sync()
            t0 = time.perf_counter()
            for _ in range(n):
                out = model(nxt, past_key_values=cache, use_cache=True)
                cache = out.past_key_values
                nxt = out.logits[:, -1:].argmax(-1)
            sync()
            return time.perf_counter() - t0

    # warm-up
    prefill()
    decode(min(8, args.new_tokens))
    sync()
    pre = []
    for _ in range(args.reps):
        t0 = time.perf_counter()
        prefill()
        sync()
        pre.append(time.perf_counter() - t0)
    dec = [decode(args.new_tokens) for _ in range(args.reps)]
    # end-to-end generate() (prefill + decode, min_new_tokens forces the full length)
    with torch.no_grad():
        am = torch.ones_like(prompt)
        model.generate(prompt, attention_mask=am, max_new_tokens=4, min_new_tokens=4,
                       do_sample=False, pad_token_id=0)
        sync()
        t0 = time.perf_counter()
        model.generate(prompt, attention_mask=am, max_new_tokens=args.new_tokens,
                       min_new_tokens=args.new_tokens, do_sample=False, use_cache=True,
                       pad_token_id=0)
        sync()
        t_gen = time.perf_counter() - t0
    p_med, d_med = statistics.median(pre), statistics.median(dec)
    print(json.dumps({
        "impl": f"hf-transformers-{transformers.__version__}",
        "model_dir": str(args.decode_bench),
        "model_type": model.config.model_type,
        "params": n_params,
        "device": str(dev),
        "dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
        "attn_implementation": model.config._attn_implementation,
        "threads": args.threads,
        "batch": 1,
        "prompt_len": args.prompt_len,
        "new_tokens": args.new_tokens,
        "reps": args.reps,
        "prefill_s_median": p_med,
        "prefill_tokens_per_s": args.prompt_len / p_med,
        "decode_s_median": d_med,
        "decode_tokens_per_s": args.new_tokens / d_med,
        "generate_s": t_gen,
        "generate_new_tokens_per_s": args.new_tokens / t_gen,
        "torch": torch.__version__,
    }))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="tests/fixtures/hf",
                    help="fixture directory (relative paths are relative to the repo root)")
    ap.add_argument("--cases", default=None, help="comma-separated subset of: " + ",".join(CASES))
    ap.add_argument("--train-text", default=TRAIN_TEXT, help="tokenizer training text")
    ap.add_argument("--no-crosscheck", action="store_true",
                    help="skip the HF -> native -> scripts/reference.py cross-check")
    ap.add_argument("--check-export", metavar="DIR", default=None)
    ap.add_argument("--prompt", default=PROMPT)
    ap.add_argument("--max-new-tokens", type=int, default=MAX_NEW_TOKENS)
    ap.add_argument("--decode-bench", metavar="DIR", default=None)
    ap.add_argument("--threads", type=int, default=None,
                    help="torch threads (--decode-bench: required; --check-export: default 1)")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16", "auto"],
                    help="dtype the HF model is loaded in (check-export / decode-bench)")
    ap.add_argument("--attn", default="eager", choices=["eager", "sdpa"],
                    help="attn_implementation (check-export / decode-bench)")
    args = ap.parse_args()
    if args.check_export and args.decode_bench:
        ap.error("--check-export and --decode-bench are exclusive")
    if args.check_export:
        check_export(args)
    elif args.decode_bench:
        if args.threads is None:
            ap.error("--decode-bench needs --threads")
        decode_bench(args)
    else:
        generate_all(args)


if __name__ == "__main__":
    main()
