"""Configuration of difftx's DIFF V2 model for Hugging Face transformers.

Written by `difftx export --format hf` next to the weights of a `diff_v2` model; loaded with
`AutoConfig.from_pretrained(dir, trust_remote_code=True)`. The keys are difftx's own
(docs/SPEC.md): `num_attention_heads` counts differential heads H (the model runs 2H query
heads), `num_key_value_heads` counts key/value heads H_kv.
"""

from transformers import PretrainedConfig


class DifftxDiffV2Config(PretrainedConfig):
    model_type = "difftx_diffv2"
    keys_to_ignore_at_inference = ["cache", "past_key_values"]

    def __init__(
        self,
        vocab_size=256,
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=128,
        rope_theta=10000.0,
        rms_norm_eps=1e-5,
        initializer_range=0.02,
        tie_word_embeddings=False,
        use_cache=True,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
        **kwargs,
    ):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.head_dim = head_dim
        self.max_position_embeddings = max_position_embeddings
        self.rope_theta = rope_theta
        self.rms_norm_eps = rms_norm_eps
        self.initializer_range = initializer_range
        self.use_cache = use_cache
        self.bos_token_id = bos_token_id
        self.eos_token_id = eos_token_id
        self.pad_token_id = pad_token_id
        if head_dim % 2 != 0:
            raise ValueError(f"head_dim ({head_dim}) must be even for RoPE")
        if num_attention_heads % num_key_value_heads != 0:
            raise ValueError(
                f"num_attention_heads ({num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({num_key_value_heads})"
            )
        super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)
