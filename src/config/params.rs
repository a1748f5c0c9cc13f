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

/// Where one tensor lies in the flat buffer: `len` values from `offset`. `Copy`, unlike the
/// `Range` it stands for (`range`), so that a layer's spans pass around without clones.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    pub offset: usize,
    pub len: usize,
}

impl Span {
    /// offset..offset + len, to index the flat buffers with.
    pub fn range(self) -> Range<usize> {
        self.offset..self.offset + self.len
    }
    /// The first offset past the span.
    pub fn end(self) -> usize {
        self.offset + self.len
    }
}

/// Spans of one block's tensors in the flat buffer.
#[derive(Clone, Copy, Debug)]
pub struct LayerParams {
    pub input_layernorm: Span,
    pub q_proj: Span,
    pub k_proj: Span,
    pub v_proj: Span,
    pub o_proj: Span,
    /// diff_v1: lambda_q1, lambda_k1, lambda_q2, lambda_k2 (each of length d)
    pub lambdas: Option<[Span; 4]>,
    /// diff_v1: the per-head RMSNorm weight over 2d (absent when the config turns subln off)
    pub subln: Option<Span>,
    /// diff_v2: D -> H per-token lambda logits
    pub lambda_proj: Option<Span>,
    pub post_attention_layernorm: Span,
    pub gate_proj: Span,
    pub up_proj: Span,
    pub down_proj: Span,
}

#[derive(Clone, Debug)]
pub struct ParamLayout {
    pub specs: Vec<ParamSpec>,
    pub embed_tokens: Span,
    pub layers: Vec<LayerParams>,
    pub norm: Span,
    /// `None` when tied to `embed_tokens`.
    pub lm_head: Option<Span>,
    pub total: usize,
}

struct Builder {
    specs: Vec<ParamSpec>,
    total: usize,
}

impl Builder {
    fn add(&mut self, name: String, shape: &[usize], decay: bool) -> Span {
        let spec = ParamSpec {
            name,
            shape: shape.to_vec(),
            offset: self.total,
            decay,
        };
        let span = Span {
            offset: self.total,
            len: spec.numel(),
        };
        self.total += span.len;
        self.specs.push(spec);
        span
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

    /// The span of the output embedding (lm_head, or embed_tokens when tied).
    pub fn lm_head_span(&self) -> Span {
        self.lm_head.unwrap_or(self.embed_tokens)
    }

    pub fn find(&self, name: &str) -> Option<&ParamSpec> {
        self.specs.iter().find(|s| s.name == name)
    }
}
