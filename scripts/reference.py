#!/usr/bin/env python3
"""Plain-PyTorch reference for the difftx model family (see docs/SPEC.md), and the parity fixtures.

One model definition, written functionally over a dict of named parameters whose names and
layouts are exactly the native checkpoint layout (torch Linear weights, [out, in]; y = x @ W.T):

    model.embed_tokens.weight                         (V, D)
    model.layers.{i}.input_layernorm.weight           (D)
    model.layers.{i}.self_attn.q_proj.weight          (H*d | 2H*d, D)
    model.layers.{i}.self_attn.k_proj.weight          (H_kv*d | 2H_kv*d, D)
    model.layers.{i}.self_attn.v_proj.weight          (H_kv*d | H_kv*2d, D)
    model.layers.{i}.self_attn.o_proj.weight          (D, H*d | H*2d)
    model.layers.{i}.self_attn.lambda_q1/k1/q2/k2     (d)        diff_v1
    model.layers.{i}.self_attn.subln.weight           (2d)       diff_v1 (absent if subln off)
    model.layers.{i}.self_attn.lambda_proj.weight     (H, D)     diff_v2
    model.layers.{i}.post_attention_layernorm.weight  (D)
    model.layers.{i}.mlp.gate_proj/up_proj.weight     (I, D)
    model.layers.{i}.mlp.down_proj.weight             (D, I)
    model.norm.weight                                 (D)
    lm_head.weight                                    (V, D)     absent when tied

Dimension names: B batch, T time, D hidden, V vocab, H heads, Hkv kv heads, d head dim, I ffn.

Two attention paths share everything else:
  * attn_impl="naive": explicit masked softmax; used in float64 for the fixtures.
  * attn_impl="sdpa":  F.scaled_dot_product_attention(is_causal=True); used by the benchmark.

Running this file writes tests/fixtures/<case>/{config.json, model.safetensors,
reference.safetensors} after self-checks (a second, loop-based diff_v1 attention; gradcheck of
every attention kind; naive vs sdpa agreement).
"""

import argparse
import json
import math
import os
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

ATTENTIONS = ("standard", "diff_v1", "diff_v2")


# ----------------------------------------------------------------------------------------------
# config


def make_config(attention, vocab_size, hidden_size, intermediate_size, num_hidden_layers,
                num_attention_heads, num_key_value_heads, head_dim, max_position_embeddings,
                rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=False,
                lambda_init=None, subln=True):
    """lambda_init (a constant) and subln=False are diff_v1's Table 6 ablations; like the Rust
    side, the keys are written only when they differ from the paper."""
    cfg = {
        "model_type": "difftx",
        "attention": attention,
        "vocab_size": vocab_size,
        "hidden_size": hidden_size,
        "intermediate_size": intermediate_size,
        "num_hidden_layers": num_hidden_layers,
        "num_attention_heads": num_attention_heads,
        "num_key_value_heads": num_key_value_heads,
        "head_dim": head_dim,
        "max_position_embeddings": max_position_embeddings,
        "rope_theta": float(rope_theta),
        "rms_norm_eps": float(rms_norm_eps),
        "tie_word_embeddings": bool(tie_word_embeddings),
    }
    if lambda_init is not None:
        cfg["lambda_init"] = float(lambda_init)
    if not subln:
        cfg["subln"] = False
    check_config(cfg)
    return cfg


def check_config(cfg):
    assert cfg["attention"] in ATTENTIONS, f"attention: unknown kind {cfg['attention']!r}"
    H, Hkv, d = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    assert H % Hkv == 0, f"num_attention_heads ({H}) must divide by num_key_value_heads ({Hkv})"
    assert d % 2 == 0, f"head_dim ({d}) must be even for RoPE"
    if cfg["attention"] != "diff_v1":
        assert "lambda_init" not in cfg and cfg.get("subln", True), "ablations are diff_v1 only"
    assert 0.0 <= cfg.get("lambda_init", 0.0) < 1.0, "lambda_init must be in [0, 1)"


def lambda_init_fn(layer, cfg=None):
    """diff_v1 lambda_init = 0.8 - 0.6 * exp(-0.3 * l), l the 0-based layer index, unless the
    config sets a constant `lambda_init`."""
    if cfg is not None and cfg.get("lambda_init") is not None:
        return cfg["lambda_init"]
    return 0.8 - 0.6 * math.exp(-0.3 * layer)


# ----------------------------------------------------------------------------------------------
# parameters


def param_shapes(cfg):
    """Ordered {name: shape} of every parameter, in the native checkpoint layout."""
    V, D, I = cfg["vocab_size"], cfg["hidden_size"], cfg["intermediate_size"]
    H, Hkv, d = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    kind = cfg["attention"]
    shapes = {"model.embed_tokens.weight": (V, D)}
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        shapes[p + "input_layernorm.weight"] = (D,)
        if kind == "standard":
            shapes[p + "self_attn.q_proj.weight"] = (H * d, D)
            shapes[p + "self_attn.k_proj.weight"] = (Hkv * d, D)
            shapes[p + "self_attn.v_proj.weight"] = (Hkv * d, D)
            shapes[p + "self_attn.o_proj.weight"] = (D, H * d)
        elif kind == "diff_v1":
            shapes[p + "self_attn.q_proj.weight"] = (2 * H * d, D)
            shapes[p + "self_attn.k_proj.weight"] = (2 * Hkv * d, D)
            shapes[p + "self_attn.v_proj.weight"] = (Hkv * 2 * d, D)
            shapes[p + "self_attn.o_proj.weight"] = (D, H * 2 * d)
            for n in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
                shapes[p + "self_attn." + n] = (d,)
            if cfg.get("subln", True):
                shapes[p + "self_attn.subln.weight"] = (2 * d,)
        else:  # diff_v2
            shapes[p + "self_attn.q_proj.weight"] = (2 * H * d, D)
            shapes[p + "self_attn.k_proj.weight"] = (Hkv * d, D)
            shapes[p + "self_attn.v_proj.weight"] = (Hkv * d, D)
            shapes[p + "self_attn.o_proj.weight"] = (D, H * d)
            shapes[p + "self_attn.lambda_proj.weight"] = (H, D)
        shapes[p + "post_attention_layernorm.weight"] = (D,)
        shapes[p + "mlp.gate_proj.weight"] = (I, D)
        shapes[p + "mlp.up_proj.weight"] = (I, D)
        shapes[p + "mlp.down_proj.weight"] = (D, I)
    shapes["model.norm.weight"] = (D,)
    if not cfg["tie_word_embeddings"]:
        shapes["lm_head.weight"] = (V, D)
    return shapes


def num_params(cfg):
    return sum(math.prod(s) for s in param_shapes(cfg).values())


def init_params(cfg, seed, dtype=torch.float64, linear_std=0.1, lambda_std=0.1, norm_std=0.1,
                embed_std=0.5):
    """Random parameters. Linears N(0, linear_std), lambda vectors N(0, lambda_std),
    every norm weight 1 + N(0, norm_std), embedding N(0, embed_std)."""
    g = torch.Generator().manual_seed(seed)
    params = {}
    for name, shape in param_shapes(cfg).items():
        z = torch.randn(shape, generator=g, dtype=torch.float64)
        if name == "model.embed_tokens.weight":
            t = z * embed_std
        elif "norm" in name or "subln" in name:
            t = 1.0 + z * norm_std
        elif ".lambda_q" in name or ".lambda_k" in name:
            t = z * lambda_std
        else:
            t = z * linear_std
        params[name] = t.to(dtype)
    return params


# ----------------------------------------------------------------------------------------------
# building blocks


def rmsnorm(x, w, eps):
    """x: (..., C), w: (C). x / sqrt(mean(x^2) + eps) * w."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope_cos_sin(T, d, theta, dtype, device=None):
    """cos, sin: (T, d/2); pair j of dims (2j, 2j+1) at position t turns by t * theta^(-2j/d)."""
    j = torch.arange(0, d // 2, dtype=torch.float64, device=device)
    inv_freq = theta ** (-2.0 * j / d)
    pos = torch.arange(T, dtype=torch.float64, device=device)
    ang = pos[:, None] * inv_freq[None, :]
    return ang.cos().to(dtype), ang.sin().to(dtype)


def rope(x, cos, sin):
    """Interleaved RoPE. x: (B, n, T, d); cos, sin: (T, d/2).
    out[2j] = x[2j] cos - x[2j+1] sin;  out[2j+1] = x[2j] sin + x[2j+1] cos."""
    xe, xo = x[..., 0::2], x[..., 1::2]
    oe = xe * cos - xo * sin
    oo = xe * sin + xo * cos
    return torch.stack((oe, oo), dim=-1).flatten(-2)


def repeat_kv(x, n_rep):
    """x: (B, Hkv, T, e) -> (B, Hkv*n_rep, T, e); output head j is input head j // n_rep."""
    if n_rep == 1:
        return x
    return x.repeat_interleave(n_rep, dim=1)


def causal_attention(q, k, v, attn_impl):
    """q, k: (B, n, T, d); v: (B, n, T, e) -> (B, n, T, e). softmax(q k^T / sqrt(d) + causal) v."""
    if attn_impl == "sdpa":
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return causal_softmax(q, k) @ v


def causal_softmax(q, k):
    """q, k: (B, n, T, d) -> attention probabilities (B, n, T, T)."""
    T, d = q.shape[-2], q.shape[-1]
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(d)
    mask = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1)


def linear(x, w):
    """x: (..., in), w: (out, in) -> (..., out)."""
    return x @ w.t()


# ----------------------------------------------------------------------------------------------
# the three attentions


def attention_standard(P, p, cfg, x, cos, sin, attn_impl):
    """x: (B, T, D) -> (B, T, D)."""
    B, T, _ = x.shape
    H, Hkv, d = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    q = linear(x, P[p + "q_proj.weight"]).view(B, T, H, d).transpose(1, 2)
    k = linear(x, P[p + "k_proj.weight"]).view(B, T, Hkv, d).transpose(1, 2)
    v = linear(x, P[p + "v_proj.weight"]).view(B, T, Hkv, d).transpose(1, 2)
    q, k = rope(q, cos, sin), rope(k, cos, sin)
    k, v = repeat_kv(k, H // Hkv), repeat_kv(v, H // Hkv)
    y = causal_attention(q, k, v, attn_impl)                      # (B, H, T, d)
    y = y.transpose(1, 2).reshape(B, T, H * d)
    return linear(y, P[p + "o_proj.weight"])


def diff_v1_lambda(P, p, cfg, layer):
    lambda_init = lambda_init_fn(layer, cfg)
    lambda_1 = torch.exp(torch.dot(P[p + "lambda_q1"], P[p + "lambda_k1"]))
    lambda_2 = torch.exp(torch.dot(P[p + "lambda_q2"], P[p + "lambda_k2"]))
    lambda_full = lambda_1 - lambda_2 + lambda_init
    return lambda_full, lambda_init


def diff_v1_qkv(P, p, cfg, x, cos, sin):
    """Returns q1, q2, k1, k2: (B, H, T, d) (k already repeated to H) and v: (B, H, T, 2d)."""
    B, T, _ = x.shape
    H, Hkv, d = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    q = linear(x, P[p + "q_proj.weight"]).view(B, T, 2 * H, d).transpose(1, 2)
    k = linear(x, P[p + "k_proj.weight"]).view(B, T, 2 * Hkv, d).transpose(1, 2)
    v = linear(x, P[p + "v_proj.weight"]).view(B, T, Hkv, 2 * d).transpose(1, 2)
    q, k = rope(q, cos, sin), rope(k, cos, sin)
    q1, q2 = q[:, 0::2], q[:, 1::2]        # diff head i: sub-heads 2i, 2i+1
    k1, k2 = k[:, 0::2], k[:, 1::2]        # kv group g: sub-heads 2g, 2g+1
    n_rep = H // Hkv                       # diff head i uses group i // n_rep
    return q1, q2, repeat_kv(k1, n_rep), repeat_kv(k2, n_rep), repeat_kv(v, n_rep)


def attention_diff_v1(P, p, cfg, x, cos, sin, attn_impl, layer):
    """x: (B, T, D) -> (B, T, D). head_i = subln((A1 - lambda A2) V) * (1 - lambda_init), or
    (A1 - lambda A2) V without subln (the ablation drops the norm and its scale together)."""
    B, T, _ = x.shape
    H, d = cfg["num_attention_heads"], cfg["head_dim"]
    q1, q2, k1, k2, v = diff_v1_qkv(P, p, cfg, x, cos, sin)
    lambda_full, lambda_init = diff_v1_lambda(P, p, cfg, layer)
    if attn_impl == "sdpa":
        # (A1 - lambda A2) V = A1 V - lambda (A2 V): two ordinary SDPA calls against the same
        # 2d-dim V (measured on CPU faster than one call over concatenated maps, or than zero-
        # padding q/k to 2d, or than splitting V into d-dim halves).
        attn1 = F.scaled_dot_product_attention(q1, k1, v, is_causal=True)   # (B, H, T, 2d)
        attn2 = F.scaled_dot_product_attention(q2, k2, v, is_causal=True)
        y = attn1 - lambda_full * attn2
    else:
        attn1 = causal_softmax(q1, k1)                             # (B, H, T, T)
        attn2 = causal_softmax(q2, k2)
        y = (attn1 - lambda_full * attn2) @ v                      # (B, H, T, 2d)
    if cfg.get("subln", True):
        y = rmsnorm(y, P[p + "subln.weight"], cfg["rms_norm_eps"]) * (1.0 - lambda_init)
    y = y.transpose(1, 2).reshape(B, T, H * 2 * d)
    return linear(y, P[p + "o_proj.weight"])


def attention_diff_v2(P, p, cfg, x, cos, sin, attn_impl):
    """x: (B, T, D) -> (B, T, D). out_i = attn_{2i} - sigmoid(lambda_proj(x))_i attn_{2i+1}."""
    B, T, _ = x.shape
    H, Hkv, d = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    q = linear(x, P[p + "q_proj.weight"]).view(B, T, 2 * H, d).transpose(1, 2)
    k = linear(x, P[p + "k_proj.weight"]).view(B, T, Hkv, d).transpose(1, 2)
    v = linear(x, P[p + "v_proj.weight"]).view(B, T, Hkv, d).transpose(1, 2)
    q, k = rope(q, cos, sin), rope(k, cos, sin)
    n_rep = 2 * H // Hkv                   # query head j uses kv head j // n_rep
    y = causal_attention(q, repeat_kv(k, n_rep), repeat_kv(v, n_rep), attn_impl)  # (B, 2H, T, d)
    lam = torch.sigmoid(linear(x, P[p + "lambda_proj.weight"]))  # (B, T, H)
    lam = lam.transpose(1, 2).unsqueeze(-1)                       # (B, H, T, 1)
    y = y[:, 0::2] - lam * y[:, 1::2]                             # (B, H, T, d)
    y = y.transpose(1, 2).reshape(B, T, H * d)
    return linear(y, P[p + "o_proj.weight"])


# ----------------------------------------------------------------------------------------------
# the model


def forward(P, cfg, idx, attn_impl="naive", return_hidden=False):
    """P: {name: tensor}; idx: (B, T) int64 -> logits (B, T, V) [, hidden list of (B, T, D)]."""
    B, T = idx.shape
    eps = cfg["rms_norm_eps"]
    emb = P["model.embed_tokens.weight"]
    cos, sin = rope_cos_sin(T, cfg["head_dim"], cfg["rope_theta"], emb.dtype, emb.device)
    x = emb[idx]
    hidden = []
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        h = rmsnorm(x, P[p + "input_layernorm.weight"], eps)
        a = p + "self_attn."
        if cfg["attention"] == "standard":
            x = x + attention_standard(P, a, cfg, h, cos, sin, attn_impl)
        elif cfg["attention"] == "diff_v1":
            x = x + attention_diff_v1(P, a, cfg, h, cos, sin, attn_impl, l)
        else:
            x = x + attention_diff_v2(P, a, cfg, h, cos, sin, attn_impl)
        h = rmsnorm(x, P[p + "post_attention_layernorm.weight"], eps)
        gate = linear(h, P[p + "mlp.gate_proj.weight"])
        up = linear(h, P[p + "mlp.up_proj.weight"])
        x = x + linear(F.silu(gate) * up, P[p + "mlp.down_proj.weight"])
        hidden.append(x)
    x = rmsnorm(x, P["model.norm.weight"], eps)
    head = emb if cfg["tie_word_embeddings"] else P["lm_head.weight"]
    logits = linear(x, head)
    return (logits, hidden) if return_hidden else logits


def loss_fn(P, cfg, tokens, attn_impl="naive"):
    """tokens: (B, T+1); mean cross-entropy over all B*T positions."""
    logits = forward(P, cfg, tokens[:, :-1], attn_impl)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))


class DiffTx(nn.Module):
    """nn.Module wrapper (for optimisers / torch.compile) over the functional model above.
    Parameter names are the native names; state_dict() is a native checkpoint."""

    def __init__(self, cfg, params, attn_impl="sdpa"):
        super().__init__()
        self.cfg = cfg
        self.attn_impl = attn_impl
        self.names = list(params.keys())
        self.params = nn.ParameterList([nn.Parameter(params[n]) for n in self.names])

    def named_native(self):
        return dict(zip(self.names, self.params))

    def forward(self, idx):
        return forward(self.named_native(), self.cfg, idx, self.attn_impl)


# ----------------------------------------------------------------------------------------------
# self-checks


def diff_v1_attention_loops(P, p, cfg, x, layer):
    """Second, independent diff_v1 attention: per batch, per head, per query row, numpy float64,
    softmax over the causal prefix only, explicit (A1 - lambda A2) row times V."""
    P = {k: v.detach().double().numpy() for k, v in P.items()}
    x = x.detach().double().numpy()
    B, T, D = x.shape
    H, Hkv, d = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    eps, theta = cfg["rms_norm_eps"], cfg["rope_theta"]
    Wq, Wk, Wv, Wo = (P[p + n + "_proj.weight"] for n in "qkvo")
    lam_init = cfg["lambda_init"] if "lambda_init" in cfg else 0.8 - 0.6 * math.exp(-0.3 * layer)
    subln = cfg.get("subln", True)
    lam = (math.exp(float(np.dot(P[p + "lambda_q1"], P[p + "lambda_k1"])))
           - math.exp(float(np.dot(P[p + "lambda_q2"], P[p + "lambda_k2"]))) + lam_init)

    def rot(vec, t):
        out = np.empty_like(vec)
        for j in range(d // 2):
            a = t * theta ** (-2.0 * j / d)
            c, s = math.cos(a), math.sin(a)
            out[2 * j] = vec[2 * j] * c - vec[2 * j + 1] * s
            out[2 * j + 1] = vec[2 * j] * s + vec[2 * j + 1] * c
        return out

    out = np.zeros((B, T, D))
    for b in range(B):
        q = x[b] @ Wq.T
        k = x[b] @ Wk.T
        v = x[b] @ Wv.T
        heads = []
        for i in range(H):
            g = i // (H // Hkv)
            head = np.zeros((T, 2 * d))
            for t in range(T):
                q1 = rot(q[t, (2 * i) * d:(2 * i + 1) * d], t)
                q2 = rot(q[t, (2 * i + 1) * d:(2 * i + 2) * d], t)
                s1 = np.array([q1 @ rot(k[u, (2 * g) * d:(2 * g + 1) * d], u) for u in range(t + 1)])
                s2 = np.array([q2 @ rot(k[u, (2 * g + 1) * d:(2 * g + 2) * d], u) for u in range(t + 1)])
                a1 = np.exp(s1 / math.sqrt(d) - (s1 / math.sqrt(d)).max())
                a1 /= a1.sum()
                a2 = np.exp(s2 / math.sqrt(d) - (s2 / math.sqrt(d)).max())
                a2 /= a2.sum()
                row = a1 - lam * a2
                o = row @ v[:t + 1, g * 2 * d:(g + 1) * 2 * d]
                if subln:
                    o = o / math.sqrt(np.mean(o * o) + eps) * P[p + "subln.weight"] * (1.0 - lam_init)
                head[t] = o
            heads.append(head)
        out[b] = np.concatenate(heads, axis=1) @ Wo.T
    return out


def self_check(verbose=True):
    torch.manual_seed(0)
    # 1. diff_v1 attention two ways (mha and gqa, non-zero layer index for lambda_init; then the
    #    two ablations).
    for Hkv, ablation in ((2, {}), (1, {}), (2, {"lambda_init": 0.5}), (1, {"subln": False})):
        cfg = make_config("diff_v1", 17, 16, 32, 2, 2, Hkv, 4, 8, **ablation)
        P = init_params(cfg, seed=123 + Hkv)
        x = torch.randn(2, 7, 16, dtype=torch.float64)
        cos, sin = rope_cos_sin(7, 4, cfg["rope_theta"], torch.float64)
        p = "model.layers.1.self_attn."
        main = attention_diff_v1(P, p, cfg, x, cos, sin, "naive", 1)
        loops = diff_v1_attention_loops(P, p, cfg, x, 1)
        err = np.abs(main.numpy() - loops).max()
        assert err < 1e-12, f"diff_v1 attention (H_kv={Hkv} {ablation}) disagrees with the loop version: {err}"
        if verbose:
            print(f"check: diff_v1 attention vs per-head loops (H_kv={Hkv} {ablation}): max |diff| = {err:.2e}")

    # 2. gradcheck of the whole model (every parameter) for each kind, tied and GQA mixed in.
    tiny = [
        make_config("standard", 11, 8, 16, 2, 2, 1, 4, 8, tie_word_embeddings=True),
        make_config("diff_v1", 11, 8, 16, 2, 2, 1, 4, 8),
        make_config("diff_v1", 11, 8, 16, 2, 2, 2, 4, 8, tie_word_embeddings=True),
        make_config("diff_v2", 11, 8, 16, 2, 2, 1, 4, 8),
        make_config("diff_v1", 11, 8, 16, 2, 2, 1, 4, 8, lambda_init=0.8),
        make_config("diff_v1", 11, 8, 16, 2, 2, 1, 4, 8, subln=False),
    ]
    for cfg in tiny:
        P = init_params(cfg, seed=7)
        names = list(P.keys())
        tokens = torch.randint(0, cfg["vocab_size"], (1, 6))
        for impl in ("naive", "sdpa"):
            def f(*ts):
                return loss_fn(dict(zip(names, ts)), cfg, tokens, impl)
            inputs = tuple(P[n].clone().requires_grad_(True) for n in names)
            ok = torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-7, rtol=1e-5)
            assert ok
        if verbose:
            print(f"check: gradcheck {cfg['attention']} (H_kv={cfg['num_key_value_heads']}, "
                  f"tied={cfg['tie_word_embeddings']}, lambda_init={cfg.get('lambda_init')}, "
                  f"subln={cfg.get('subln', True)}) passed for naive and sdpa paths")

    # 3. float32 sdpa path (the benchmark's) agrees with the float64 naive path.
    for kind, H in (("standard", 4), ("diff_v1", 2), ("diff_v2", 2)):
        cfg = make_config(kind, 48, 32, 64, 2, H, H // 2, 8, 16)
        P = init_params(cfg, seed=3)
        idx = torch.randint(0, 48, (2, 12))
        ref = forward(P, cfg, idx, "naive")
        got = forward({k: v.float() for k, v in P.items()}, cfg, idx, "sdpa").double()
        err = (ref - got).abs().max().item()
        assert err < 1e-4 * max(1.0, ref.abs().max().item()), f"{kind}: sdpa f32 vs naive f64 {err}"
        if verbose:
            print(f"check: {kind} sdpa float32 vs naive float64 logits: max |diff| = {err:.2e}")


# ----------------------------------------------------------------------------------------------
# fixtures

CASES = [
    # name, attention, H, H_kv, tied[, diff_v1 ablation]; a case's seed is its index, so new
    # cases go at the end and leave the others' files unchanged.
    ("standard_mha_untied", "standard", 4, 4, False),
    ("standard_gqa_tied", "standard", 4, 2, True),
    ("diff_v1_mha_untied", "diff_v1", 2, 2, False),
    ("diff_v1_gqa_tied", "diff_v1", 2, 1, True),
    ("diff_v1_gqa_untied", "diff_v1", 2, 1, False),
    ("diff_v2_mha_untied", "diff_v2", 2, 2, False),
    ("diff_v2_gqa_tied", "diff_v2", 2, 1, True),
    # paper Table 6
    ("diff_v1_lambda_init_const", "diff_v1", 2, 2, False, {"lambda_init": 0.8}),
    ("diff_v1_no_subln", "diff_v1", 2, 1, True, {"subln": False}),
]
B, T = 2, 12
# The same model family at one long length: a single sequence of 2,048 tokens (32 of the
# attention kernels' 64-key tiles, rotary angles far past the short cases' 16 positions), a
# model small enough that the fixture stays small. Seeds continue after CASES.
LONG_CASES = [
    ("diff_v1_long_2048", "diff_v1", 2, 1, True),
    ("diff_v2_long_2048", "diff_v2", 2, 1, True),
]
LONG_B, LONG_T = 1, 2048
SHORT_DIMS = dict(vocab_size=48, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  head_dim=8, max_position_embeddings=16)
LONG_DIMS = dict(vocab_size=16, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                 head_dim=8, max_position_embeddings=LONG_T)


def write_case(out_dir, case_index, name, kind, H, Hkv, tied, ablation=None,
               b=B, t=T, dims=SHORT_DIMS):
    from safetensors.torch import save_file

    cfg = make_config(kind, num_attention_heads=H, num_key_value_heads=Hkv, rope_theta=10000.0,
                      rms_norm_eps=1e-5, tie_word_embeddings=tied, **dims, **(ablation or {}))
    seed = 1000 + case_index
    # Round the weights to float32 first: the file holds f32, and the reference is computed from
    # exactly those values (in float64).
    P = {k: v.float().double() for k, v in init_params(cfg, seed).items()}
    g = torch.Generator().manual_seed(seed + 500)
    tokens = torch.randint(0, cfg["vocab_size"], (b, t + 1), generator=g)

    leaves = {k: v.clone().requires_grad_(True) for k, v in P.items()}
    logits, hidden = forward(leaves, cfg, tokens[:, :-1], "naive", return_hidden=True)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
    names = list(leaves.keys())
    grads = torch.autograd.grad(loss, [leaves[n] for n in names])

    d = Path(out_dir) / name
    d.mkdir(parents=True, exist_ok=True)
    with open(d / "config.json", "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    save_file({k: v.float().contiguous() for k, v in P.items()}, str(d / "model.safetensors"))
    ref = {
        "tokens": tokens.to(torch.int32).contiguous(),
        "logits": logits.detach().float().contiguous(),
        "loss": loss.detach().float().reshape(1),
    }
    for i, h in enumerate(hidden):
        ref[f"hidden.{i}"] = h.detach().float().contiguous()
    for n, gr in zip(names, grads):
        ref[f"grad.{n}"] = gr.float().contiguous()
    save_file(ref, str(d / "reference.safetensors"))
    print(f"{name:26s} loss {loss.item():.6f}  params {num_params(cfg):6d}")


def main():
    root = Path(__file__).resolve().parent.parent
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(root / "tests" / "fixtures"))
    ap.add_argument("--skip-checks", action="store_true", help="skip the self-checks")
    ap.add_argument("--cases", nargs="+", metavar="NAME",
                    choices=[c[0] for c in CASES + LONG_CASES],
                    help="write only these fixtures [default: all]")
    args = ap.parse_args()
    torch.set_num_threads(min(2, os.cpu_count() or 1))
    if not args.skip_checks:
        self_check()
    for i, case in enumerate(CASES):
        if args.cases is None or case[0] in args.cases:
            write_case(args.out, i, *case)
    for i, case in enumerate(LONG_CASES):
        if args.cases is None or case[0] in args.cases:
            write_case(args.out, len(CASES) + i, *case, b=LONG_B, t=LONG_T, dims=LONG_DIMS)


if __name__ == "__main__":
    sys.exit(main())
