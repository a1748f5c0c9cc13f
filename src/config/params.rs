//! The named parameter table: every tensor of the checkpoint at an offset in one flat buffer.
//! Parameters, gradients and AdamW moments all share this layout, so the optimizer and the
//! gradient norm are single loops.

use super::{AttentionKind, ModelConfig};
use std::ops::Range;

/// One tensor: its Hugging Face style name, torch shape and place in the flat buffer.
#[derive(Clone, Debug)]
pub struct ParamSpec {
    pub name: String,
    pub shape: Vec<usize>,
    pub offset: usize,
    /// Weight decay applies to matrices only, never to norms or lambdas.
    pub decay: bool,
}

impl ParamSpec {
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
    pub fn range(&self) -> Range<usize> {
        self.offset..self.offset + self.numel()
    }
}

/// Ranges of one block's tensors in the flat buffer.
#[derive(Clone, Debug)]
pub struct LayerParams {
    pub input_layernorm: Range<usize>,
    pub q_proj: Range<usize>,
    pub k_proj: Range<usize>,
    pub v_proj: Range<usize>,
    pub o_proj: Range<usize>,
    /// diff_v1: lambda_q1, lambda_k1, lambda_q2, lambda_k2 (each of length d)
    pub lambdas: Option<[Range<usize>; 4]>,
    /// diff_v1: the per-head RMSNorm weight over 2d (absent when the config turns subln off)
    pub subln: Option<Range<usize>>,
    /// diff_v2: D -> H per-token lambda logits
    pub lambda_proj: Option<Range<usize>>,
    pub post_attention_layernorm: Range<usize>,
    pub gate_proj: Range<usize>,
    pub up_proj: Range<usize>,
    pub down_proj: Range<usize>,
}

#[derive(Clone, Debug)]
pub struct ParamLayout {
    pub specs: Vec<ParamSpec>,
    pub embed_tokens: Range<usize>,
    pub layers: Vec<LayerParams>,
    pub norm: Range<usize>,
    /// `None` when tied to `embed_tokens`.
    pub lm_head: Option<Range<usize>>,
    pub total: usize,
}

struct Builder {
    specs: Vec<ParamSpec>,
    total: usize,
}

impl Builder {
    fn add(&mut self, name: String, shape: &[usize], decay: bool) -> Range<usize> {
        let spec = ParamSpec {
            name,
            shape: shape.to_vec(),
            offset: self.total,
            decay,
        };
        self.total += spec.numel();
        let r = spec.range();
        self.specs.push(spec);
        r
    }
}

impl ParamLayout {
    pub fn new(c: &ModelConfig) -> Self {
        let (dm, d, f, v) = (c.hidden_size, c.head_dim, c.intermediate_size, c.vocab_size);
        let mut b = Builder {
            specs: Vec::new(),
            total: 0,
        };
        let embed_tokens = b.add("model.embed_tokens.weight".into(), &[v, dm], true);
        let mut layers = Vec::with_capacity(c.num_hidden_layers);
        for i in 0..c.num_hidden_layers {
            let p = |s: &str| format!("model.layers.{i}.{s}");
            let input_layernorm = b.add(p("input_layernorm.weight"), &[dm], false);
            let q_proj = b.add(
                p("self_attn.q_proj.weight"),
                &[c.n_query_heads() * d, dm],
                true,
            );
            let k_proj = b.add(
                p("self_attn.k_proj.weight"),
                &[c.n_key_heads() * d, dm],
                true,
            );
            let v_proj = b.add(
                p("self_attn.v_proj.weight"),
                &[c.num_key_value_heads * c.value_head_dim(), dm],
                true,
            );
            let o_proj = b.add(p("self_attn.o_proj.weight"), &[dm, c.attn_out_dim()], true);
            let (mut lambdas, mut subln, mut lambda_proj) = (None, None, None);
            match c.attention {
                AttentionKind::Standard => {}
                AttentionKind::DiffV1 => {
                    lambdas = Some(
                        ["lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"]
                            .map(|n| b.add(p(&format!("self_attn.{n}")), &[d], false)),
                    );
                    subln = c
                        .subln
                        .then(|| b.add(p("self_attn.subln.weight"), &[2 * d], false));
                }
                AttentionKind::DiffV2 => {
                    lambda_proj = Some(b.add(
                        p("self_attn.lambda_proj.weight"),
                        &[c.num_attention_heads, dm],
                        true,
                    ));
                }
            }
            let post_attention_layernorm =
                b.add(p("post_attention_layernorm.weight"), &[dm], false);
            let gate_proj = b.add(p("mlp.gate_proj.weight"), &[f, dm], true);
            let up_proj = b.add(p("mlp.up_proj.weight"), &[f, dm], true);
            let down_proj = b.add(p("mlp.down_proj.weight"), &[dm, f], true);
            layers.push(LayerParams {
                input_layernorm,
                q_proj,
                k_proj,
                v_proj,
                o_proj,
                lambdas,
                subln,
                lambda_proj,
                post_attention_layernorm,
                gate_proj,
                up_proj,
                down_proj,
            });
        }
        let norm = b.add("model.norm.weight".into(), &[dm], false);
        let lm_head =
            (!c.tie_word_embeddings).then(|| b.add("lm_head.weight".into(), &[v, dm], true));
        ParamLayout {
            specs: b.specs,
            embed_tokens,
            layers,
            norm,
            lm_head,
            total: b.total,
        }
    }

    /// The range of the output embedding (lm_head, or embed_tokens when tied).
    pub fn lm_head_range(&self) -> Range<usize> {
        self.lm_head.clone().unwrap_or(self.embed_tokens.clone())
    }

    pub fn find(&self, name: &str) -> Option<&ParamSpec> {
        self.specs.iter().find(|s| s.name == name)
    }
}
