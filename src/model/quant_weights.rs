//! The quantised copy of a model's weights that inference reads with `--quant q8_0|q4_0`:
//! every linear layer's matrix and the LM head in GGUF blocks of 32 (`kernels::quant`), taken
//! once at load (`Model::quantize`). Every forward pass then multiplies by the blocks; norms,
//! λ, RoPE, the embedding lookup and the softmax read the f32 parameters.

use super::Model;
use crate::kernels::gemm::Weight;
use crate::kernels::quant::{QuantKind, QuantMatrix};
use std::ops::Range;

pub struct QuantWeights {
    pub kind: QuantKind,
    /// parameters in the model's layout (to check the copy belongs to it)
    len: usize,
    /// (offset of the matrix in the layout, its blocks), by offset
    mats: Vec<(usize, QuantMatrix)>,
    /// the matrices left f32: their rows are not a whole number of blocks
    pub kept_f32: Vec<String>,
}

impl QuantWeights {
    /// `model`'s linear layers and LM head in `kind` blocks, but for matrices whose width
    /// (input features) is not a multiple of 32, which stay f32 (named in `kept_f32`).
    pub fn new(model: &Model, kind: QuantKind) -> Self {
        let head = model.layout.lm_head_span().offset;
        let embed = model.layout.embed_tokens.offset;
        let (mut mats, mut kept_f32) = (Vec::new(), Vec::new());
        // the input embedding is a lookup, not a product, unless it is also the LM head
        let linear = |s: &&crate::config::params::ParamSpec| {
            s.shape.len() == 2 && (s.offset != embed || s.offset == head)
        };
        for spec in model.layout.specs.iter().filter(linear) {
            let (rows, cols) = (spec.shape[0], spec.shape[1]);
            match QuantMatrix::new(kind, &model.params[spec.range()], rows, cols) {
                Some(m) => mats.push((spec.offset, m)),
                None => kept_f32.push(spec.name.clone()),
            }
        }
        mats.sort_by_key(|m| m.0);
        QuantWeights {
            kind,
            len: model.params.len(),
            mats,
            kept_f32,
        }
    }

    /// Whether this copy was taken from parameters of `n` values.
    pub(crate) fn fits(&self, n: usize) -> bool {
        self.len == n
    }

    /// The blocks of the matrix at `offset`, if it was quantised.
    pub fn matrix(&self, offset: usize) -> Option<&QuantMatrix> {
        let i = self.mats.binary_search_by_key(&offset, |m| m.0).ok()?;
        Some(&self.mats[i].1)
    }

    /// The weight at `r` of `params`, with its blocks where `quant` holds them, else with the
    /// bf16 copies of `bf16` (`Bf16Weights::weight_of`).
    pub(crate) fn weight_of<'a>(
        quant: Option<&'a Self>,
        bf16: Option<&'a super::bf16_weights::Bf16Weights>,
        params: &'a [f32],
        r: Range<usize>,
    ) -> Weight<'a> {
        match quant.and_then(|q| q.matrix(r.start)) {
            Some(m) => Weight {
                quant: Some(m),
                ..Weight::from(&params[r])
            },
            None => super::bf16_weights::Bf16Weights::weight_of(bf16, params, r),
        }
    }

    /// Bytes of every matrix's blocks.
    pub fn bytes(&self) -> usize {
        self.mats.iter().map(|m| m.1.bytes()).sum()
    }

    /// Parameters held as blocks.
    pub fn params(&self) -> usize {
        self.mats.iter().map(|m| m.1.rows * m.1.cols).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{AttentionKind, ModelConfig, Preset};
    use crate::model::{KvCache, Workspace};

    fn logits(m: &Model, tokens: &[u32]) -> Vec<f32> {
        let mut ws = Workspace::new(m, 1, tokens.len());
        m.forward(&mut ws, tokens, 1, tokens.len()).unwrap();
        ws.logits[..tokens.len() * m.config.vocab_size].to_vec()
    }

    /// Every kind, both formats: the quantised model's logits stay near f32's (int8 and int4
    /// errors), and decoding token by token (matrix-vector products) gives the logits of
    /// one forward over the whole text (the blocked GEMM), up to the few int8 roundings of
    /// the input that the attention kernels' different summation order can flip.
    #[test]
    fn quantised_logits_track_f32_and_decoding_matches_the_full_forward() {
        let tokens: Vec<u32> = (0..40).map(|i| (i * 37 % 256) as u32).collect();
        for kind in AttentionKind::ALL {
            let f = Model::init(ModelConfig::preset(Preset::Tiny, kind), 7).unwrap();
            let want = logits(&f, &tokens);
            let spread = (want.iter().map(|v| v * v).sum::<f32>() / want.len() as f32).sqrt();
            for (q, tol) in [(QuantKind::Q8_0, 0.03), (QuantKind::Q4_0, 0.3)] {
                let mut m = f.clone();
                assert!(m.quantize(q).is_empty());
                let got = logits(&m, &tokens);
                let err = (got
                    .iter()
                    .zip(&want)
                    .map(|(a, b)| (a - b).powi(2))
                    .sum::<f32>()
                    / want.len() as f32)
                    .sqrt();
                assert!(
                    err < tol * spread,
                    "{kind} {q}: rms error {err} vs spread {spread}"
                );
                assert!(err > 0.0, "{kind} {q}: the blocks were not used");
                let v = m.config.vocab_size;
                let mut ws = Workspace::new(&m, 1, tokens.len());
                let mut cache = [KvCache::new(&m, tokens.len())];
                for (i, &t) in tokens.iter().enumerate() {
                    m.forward_cached(&mut ws, &mut cache, &[t], 1, false)
                        .unwrap();
                    for (a, b) in ws.logits[..v].iter().zip(&got[i * v..(i + 1) * v]) {
                        assert!(
                            (a - b).abs() < 0.03 * spread,
                            "{kind} {q} token {i}: {a} vs {b}"
                        );
                    }
                }
            }
        }
    }

    /// A SwiGLU width off the block size: the down projections stay f32 and are named; the
    /// rest is quantised and the model still runs.
    #[test]
    fn widths_off_the_block_stay_f32_and_are_named() {
        let mut c = ModelConfig::preset(Preset::Tiny, AttentionKind::DiffV1);
        c.intermediate_size = 200;
        let mut m = Model::init(c, 1).unwrap();
        let kept = m.quantize(QuantKind::Q8_0);
        assert_eq!(
            kept,
            [
                "model.layers.0.mlp.down_proj.weight",
                "model.layers.1.mlp.down_proj.weight"
            ]
        );
        let q = m.quant.as_ref().unwrap();
        assert!(q.params() > 0 && q.bytes() < 2 * q.params());
        assert!(logits(&m, &[1, 2, 3]).iter().all(|v| v.is_finite()));
    }
}
