//! Retrofitting a `standard` (Llama) model into differential attention, to be fine-tuned from
//! there (`difftx retrofit`, then `difftx train --init-from`).
//!
//! - `diff_v2` starts exactly where the original is. Each query head i becomes the pair
//!   (2i, 2i + 1) of two copies of itself, in the same K/V group; `lambda_proj` is zero, so
//!   λ = σ(0) = ½ and the pair's output is attn − ½·attn = ½·attn; `o_proj` is doubled, which
//!   gives back the original head. Not a stationary point: the pair's second head receives
//!   −½ times the first head's gradient, so the two part at once, and `lambda_proj` receives
//!   σ'(0)·(−Σ dO·attn).
//! - `diff_v1` has no exact start: its per-head norm cannot be the identity, and its two maps
//!   of width d/2 cannot reproduce one softmax over d. Its shapes, with head_dim d/2, equal the
//!   original's tensor for tensor, so every projection is kept: diff head i's Q1 and K1 are the
//!   first half of the original head's query and key dims, Q2 and K2 the second half, its
//!   value head of width d the original one; λ's vectors are seeded as a fresh model's, subln's
//!   gain is one. Each map then attends with half of what the original head compared; the
//!   loss gap against the original says how far that start is (`difftx retrofit --data`).

use super::Model;
use crate::config::{AttentionKind, ModelConfig};
use crate::error::{Error, Result};

/// The retrofitted model: `src` (a `standard` model) as `kind`, seeded with `seed` where a
/// tensor is new and has no exact value (diff_v1's λ vectors).
pub fn retrofit(src: &Model, kind: AttentionKind, seed: u64) -> Result<Model> {
    // 1. A standard model, into a diff kind
    let c = &src.config;
    if c.attention != AttentionKind::Standard {
        return Err(Error::Invalid(format!(
            "retrofit starts from a standard (Llama) model; this one is already {}",
            c.attention
        )));
    }
    // 2. The new config: the same heads, for diff_v1 of half the width (the same tensors)
    let config = match kind {
        AttentionKind::Standard => {
            return Err(Error::Invalid(
                "retrofit --attention must be diff_v1 or diff_v2".into(),
            ))
        }
        AttentionKind::DiffV2 => ModelConfig {
            attention: kind,
            ..c.clone()
        },
        AttentionKind::DiffV1 => {
            if !c.head_dim.is_multiple_of(4) {
                return Err(Error::Invalid(format!(
                    "retrofit to diff_v1 halves the head dim {}, which must stay even for RoPE",
                    c.head_dim
                )));
            }
            ModelConfig {
                attention: kind,
                head_dim: c.head_dim / 2,
                lambda_init: None,
                subln: true,
                ..c.clone()
            }
        }
    };
    // 3. A fresh model of that config, every tensor the original has copied into it
    let mut dst = Model::init(config, seed)?;
    dst.precision = src.precision;
    let (d, dm) = (c.head_dim, c.hidden_size);
    for spec in dst.layout.specs.clone() {
        let name = spec.name.as_str();
        let out = &mut dst.params[spec.range()];
        match src.tensor(name) {
            // diff_v2: query heads 2i and 2i + 1 are both head i, (2H·d, D) from (H·d, D)
            Some(from) if kind == AttentionKind::DiffV2 && name.ends_with("q_proj.weight") => {
                for (i, head) in from.chunks(d * dm).enumerate() {
                    out[2 * i * d * dm..(2 * i + 1) * d * dm].copy_from_slice(head);
                    out[(2 * i + 1) * d * dm..(2 * i + 2) * d * dm].copy_from_slice(head);
                }
            }
            // diff_v2: ½·attn doubled is attn
            Some(from) if kind == AttentionKind::DiffV2 && name.ends_with("o_proj.weight") => {
                out.iter_mut().zip(from).for_each(|(o, &x)| *o = 2.0 * x);
            }
            Some(from) => out.copy_from_slice(from),
            // diff_v2's λ logits start at zero: λ = σ(0) = ½
            None if name.ends_with("lambda_proj.weight") => out.fill(0.0),
            // diff_v1's λ vectors keep their seeded values, subln its unit gain
            None => {}
        }
    }
    Ok(dst)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Workspace;

    fn standard_gqa() -> Model {
        let mut c = ModelConfig::preset(crate::config::Preset::Tiny, AttentionKind::Standard);
        c.num_key_value_heads = c.num_attention_heads / 2;
        Model::init(c, 7).unwrap()
    }

    fn logits(m: &Model, tokens: &[u32]) -> Vec<f32> {
        let mut ws = Workspace::new(m, 1, tokens.len());
        m.forward(&mut ws, tokens, 1, tokens.len()).unwrap();
        ws.logits[..tokens.len() * m.config.vocab_size].to_vec()
    }

    #[test]
    fn diff_v2_retrofit_gives_the_original_logits() {
        let src = standard_gqa();
        let dst = retrofit(&src, AttentionKind::DiffV2, 0).unwrap();
        let tokens: Vec<u32> = (0..48).map(|i| (i * 37 % 256) as u32).collect();
        let (a, b) = (logits(&src, &tokens), logits(&dst, &tokens));
        let worst = a
            .iter()
            .zip(&b)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max);
        assert!(worst <= 1e-5, "largest logit difference {worst}");
    }

    #[test]
    fn retrofit_refuses_a_diff_model_and_standard_as_target() {
        let src = standard_gqa();
        let v2 = retrofit(&src, AttentionKind::DiffV2, 0).unwrap();
        let e = retrofit(&v2, AttentionKind::DiffV1, 0)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("already diff_v2"), "{e}");
        let e = retrofit(&src, AttentionKind::Standard, 0)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("diff_v1 or diff_v2"), "{e}");
    }

    #[test]
    fn every_new_diff_v2_tensor_moves_on_the_first_batch() {
        let src = standard_gqa();
        let m = retrofit(&src, AttentionKind::DiffV2, 0).unwrap();
        let t = 32;
        let tokens: Vec<u32> = (0..t + 1).map(|i| (i * 53 % 256) as u32).collect();
        let mut ws = Workspace::new(&m, 1, t);
        m.forward(&mut ws, &tokens[..t], 1, t).unwrap();
        m.loss(&mut ws, &tokens[1..]).unwrap();
        let mut g = vec![0f32; m.params.len()];
        m.backward(&mut ws, &mut g);
        let (d, dm) = (m.config.head_dim, m.config.hidden_size);
        for p in &m.layout.layers {
            // λ's logits: σ'(0)·(−Σ dO·attn), not zero
            let gl = &g[p.lambda_proj.unwrap().range()];
            assert!(gl.iter().any(|&x| x != 0.0), "lambda_proj has no gradient");
            // the pair's second query head: −½ times the first's gradient
            let gq = &g[p.q_proj.range()];
            for pair in gq.chunks(2 * d * dm) {
                let (first, second) = pair.split_at(d * dm);
                let scale = first.iter().map(|x| x.abs()).fold(0f32, f32::max);
                assert!(scale > 0.0, "q_proj head without gradient");
                for (a, b) in first.iter().zip(second) {
                    assert!((b + 0.5 * a).abs() <= 1e-4 * scale, "{b} vs −½·{a}");
                }
            }
        }
    }
}
