"""difftx's DIFF V2 model (`attention: diff_v2`, docs/SPEC.md) for Hugging Face transformers.

Written by `difftx export --format hf` next to the weights; loaded with
`AutoModelForCausalLM.from_pretrained(dir, trust_remote_code=True)`. The tensors keep difftx's
names and row orders, so a directory goes back into difftx bit for bit:

- RoPE is interleaved: dims 2j and 2j+1 of a head rotate together by pos * theta^(-2j/d).
- `q_proj` holds 2H query heads of width d; heads 2i and 2i+1 form differential head i. Query
  head j reads key/value head j // (2H / H_kv), so a pair shares K and V.
- lambda_i = sigmoid(lambda_proj x)_i per token and head, x the output of input_layernorm;
  out_i = attn_{2i} - lambda_i * attn_{2i+1}; the H outputs (H * d) go to `o_proj`.
- No per-head norm, no lambda_init. SwiGLU MLP, RMSNorm before attention and MLP.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers import initialization as init
from transformers.cache_utils import Cache, DynamicCache
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast

from .configuration_difftx import DifftxDiffV2Config


class DifftxRMSNorm(nn.Module):
    def __init__(self, size, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x):
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return (x * self.weight.float()).to(dtype)


def rope_cos_sin(positions, head_dim, theta, dtype):
    """cos and sin of pos * theta^(-2j/d), computed in float64 like difftx's table: (B, T, d/2)."""
    j = torch.arange(head_dim // 2, dtype=torch.float64, device=positions.device)
    freq = torch.pow(torch.tensor(float(theta), dtype=torch.float64), -2.0 * j / head_dim)
    angle = positions.to(torch.float64)[..., None] * freq
    return angle.cos().to(dtype), angle.sin().to(dtype)


def apply_rope(x, cos, sin):
    """x: (B, heads, T, d); pairs (2j, 2j+1) rotate by the angle of j."""
    a, b = x[..., 0::2], x[..., 1::2]
    cos, sin = cos[:, None], sin[:, None]
    return torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)


class DifftxDiffV2Attention(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.layer_idx = layer_idx
        self.h = config.num_attention_heads
        self.h_kv = config.num_key_value_heads
        self.d = config.head_dim
        self.theta = config.rope_theta
        dm = config.hidden_size
        self.q_proj = nn.Linear(dm, 2 * self.h * self.d, bias=False)
        self.k_proj = nn.Linear(dm, self.h_kv * self.d, bias=False)
        self.v_proj = nn.Linear(dm, self.h_kv * self.d, bias=False)
        self.o_proj = nn.Linear(self.h * self.d, dm, bias=False)
        self.o_proj.difftx_depth_scaled = True
        self.lambda_proj = nn.Linear(dm, self.h, bias=False)

    def forward(self, x, positions, mask, cache=None):
        # 1. q (2H heads), k and v (H_kv heads), and lambda per token and head
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, 2 * self.h, self.d).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.h_kv, self.d).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.h_kv, self.d).transpose(1, 2)
        lam = torch.sigmoid(self.lambda_proj(x))
        # 2. interleaved RoPE, then the cache
        cos, sin = rope_cos_sin(positions, self.d, self.theta, q.dtype)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if cache is not None:
            k, v = cache.update(k, v, self.layer_idx)
        # 3. causal attention, query head j on key/value head j // (2H / H_kv)
        group = 2 * self.h // self.h_kv
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=1.0 / math.sqrt(self.d))
        # 4. out_i = attn_{2i} - lambda_i * attn_{2i+1}
        o = o.transpose(1, 2).reshape(b, t, self.h, 2, self.d)
        out = o[..., 0, :] - lam[..., None] * o[..., 1, :]
        return self.o_proj(out.reshape(b, t, self.h * self.d))


class DifftxMLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        dm, f = config.hidden_size, config.intermediate_size
        self.gate_proj = nn.Linear(dm, f, bias=False)
        self.up_proj = nn.Linear(dm, f, bias=False)
        self.down_proj = nn.Linear(f, dm, bias=False)
        self.down_proj.difftx_depth_scaled = True

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DifftxDiffV2DecoderLayer(GradientCheckpointingLayer):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.input_layernorm = DifftxRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = DifftxDiffV2Attention(config, layer_idx)
        self.post_attention_layernorm = DifftxRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = DifftxMLP(config)

    def forward(self, hidden_states, positions=None, mask=None, cache=None, use_cache=False):
        h = hidden_states + self.self_attn(self.input_layernorm(hidden_states), positions, mask, cache)
        return h + self.mlp(self.post_attention_layernorm(h))


class DifftxDiffV2PreTrainedModel(PreTrainedModel):
    config_class = DifftxDiffV2Config
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["DifftxDiffV2DecoderLayer"]
    _supports_cache_class = True

    @torch.no_grad()
    def _init_weights(self, module):
        """As difftx's `Model::init`: every matrix N(0, 0.02), lambda_proj included (so lambda
        starts near sigmoid(0) = 1/2); o_proj and down_proj scaled by 1/sqrt(2L); norms ones.
        transformers calls this for each module that owns parameters; weights loaded from a
        checkpoint are marked initialised and kept."""
        std = self.config.initializer_range
        if isinstance(module, nn.Linear):
            if getattr(module, "difftx_depth_scaled", False):
                std = std / math.sqrt(2 * self.config.num_hidden_layers)
            init.normal_(module.weight, 0.0, std)
        elif isinstance(module, nn.Embedding):
            init.normal_(module.weight, 0.0, std)
        elif isinstance(module, DifftxRMSNorm):
            init.ones_(module.weight)


def causal_mask(attention_mask, past, t, total, device):
    """Boolean (B or 1, 1, t, total): query i (at cache position past + i) sees key j when
    j <= past + i and attention_mask (B, total), if given, marks j as a real token."""
    q_pos = torch.arange(past, past + t, device=device)[:, None]
    k_pos = torch.arange(total, device=device)[None, :]
    mask = (k_pos <= q_pos)[None, None]
    if attention_mask is not None and attention_mask.dim() == 2:
        mask = mask & attention_mask[:, None, None, -total:].bool()
        # a padding query that sees nothing sees everything instead: its output is unused, but
        # a row of NaNs would reach real tokens through the next layer's values
        mask = mask | ~mask.any(-1, keepdim=True)
    return mask


class DifftxDiffV2Model(DifftxDiffV2PreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            [DifftxDiffV2DecoderLayer(config, l) for l in range(config.num_hidden_layers)]
        )
        self.norm = DifftxRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.gradient_checkpointing = False
        self.post_init()

    def get_input_embeddings(self):
        return self.embed_tokens

    def set_input_embeddings(self, value):
        self.embed_tokens = value

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, cache=None,
                inputs_embeds=None, use_cache=None, past_key_values=None, **kwargs):
        # 1. embeddings, the cache, positions
        cache = cache if cache is not None else past_key_values
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("give exactly one of input_ids and inputs_embeds")
        h = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        use_cache = self.config.use_cache if use_cache is None else use_cache
        if use_cache and cache is None and not (self.gradient_checkpointing and self.training):
            cache = DynamicCache(config=self.config)
        past = cache.get_seq_length() if cache is not None else 0
        t = h.shape[1]
        if position_ids is None:
            position_ids = torch.arange(past, past + t, device=h.device)[None].expand(h.shape[0], t)
        mask = causal_mask(attention_mask, past, t, past + t, h.device)
        # 2. the blocks (hidden states passed positionally, for gradient checkpointing)
        for layer in self.layers:
            h = layer(h, positions=position_ids, mask=mask, cache=cache, use_cache=use_cache)
        return BaseModelOutputWithPast(last_hidden_state=self.norm(h), cache=cache)


class DifftxDiffV2ForCausalLM(DifftxDiffV2PreTrainedModel, GenerationMixin):
    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}

    def __init__(self, config):
        super().__init__(config)
        self.model = DifftxDiffV2Model(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self):
        return self.model.embed_tokens

    def set_input_embeddings(self, value):
        self.model.embed_tokens = value

    def get_output_embeddings(self):
        return self.lm_head

    def set_output_embeddings(self, value):
        self.lm_head = value

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, cache=None,
                inputs_embeds=None, labels=None, use_cache=None, past_key_values=None,
                logits_to_keep=0, **kwargs):
        out = self.model(input_ids=input_ids, attention_mask=attention_mask,
                         position_ids=position_ids, cache=cache, inputs_embeds=inputs_embeds,
                         use_cache=use_cache, past_key_values=past_key_values)
        h = out.last_hidden_state
        if isinstance(logits_to_keep, int) and logits_to_keep > 0:
            h = h[:, -logits_to_keep:]
        logits = self.lm_head(h)
        loss = None
        if labels is not None:
            # logits[t] predicts labels[t + 1]; -100 is ignored; mean over the rest
            loss = F.cross_entropy(logits[:, :-1].float().reshape(-1, logits.shape[-1]),
                                   labels[:, 1:].reshape(-1).to(logits.device), ignore_index=-100)
        return CausalLMOutputWithPast(loss=loss, logits=logits, cache=out.cache)
