//! Attention allocation (paper Table 3) and activation outliers (Table 5), measured from the
//! rotated q and k a forward pass leaves in the workspace. The attention kernel keeps no T×T
//! matrix, so the few softmax rows needed are recomputed here in f64; no kernel changes.
//!
//! The map a head uses at one query position:
//! - `standard`: its softmax row A.
//! - `diff_v1`:  (A1 − λ·A2) / (1 − λ), λ the layer's λ — the authors' normalisation (their
//!   reply to the ICLR 2025 reviews, answer to question 4), under which the row sums to one.
//! - `diff_v2`:  the same with the per-token, per-head λ = σ(lambda_proj x) of that position.

use crate::config::AttentionKind;
use crate::error::{Error, Result};
use crate::kernels::attention::AttnShape;
use crate::model::{Model, Workspace};
use serde::Serialize;
use std::ops::Range;

/// q·k/√d of query head `j` at position `i` of sequence `bi` against keys 0..=i, in f64.
/// q: (B, T, NQ, DK), k: (B, T, NK, DK), both after RoPE.
pub fn logits_row(
    q: &[f32],
    k: &[f32],
    s: &AttnShape,
    t: usize,
    bi: usize,
    i: usize,
    j: usize,
) -> Vec<f64> {
    let dk = s.dk;
    let kh = s.k_head(j);
    let scale = 1.0 / (dk as f64).sqrt();
    let qrow = &q[((bi * t + i) * s.nq + j) * dk..][..dk];
    (0..=i)
        .map(|p| {
            let krow = &k[((bi * t + p) * s.nk + kh) * dk..][..dk];
            let d: f64 = qrow
                .iter()
                .zip(krow)
                .map(|(&a, &b)| a as f64 * b as f64)
                .sum();
            d * scale
        })
        .collect()
}

/// softmax(logits_row), in f64.
pub fn softmax_row(
    q: &[f32],
    k: &[f32],
    s: &AttnShape,
    t: usize,
    bi: usize,
    i: usize,
    j: usize,
) -> Vec<f64> {
    let mut row = logits_row(q, k, s, t, bi, i, j);
    let m = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let mut sum = 0.0;
    for x in row.iter_mut() {
        *x = (*x - m).exp();
        sum += *x;
    }
    row.iter_mut().for_each(|x| *x /= sum);
    row
}

/// (A1 − λ·A2) / (1 − λ): rows of A1 and A2 each sum to one, so this one does too.
pub fn diff_map(a1: &[f64], a2: &[f64], lambda: f64) -> Vec<f64> {
    let z = 1.0 - lambda;
    a1.iter()
        .zip(a2)
        .map(|(&x, &y)| (x - lambda * y) / z)
        .collect()
}

/// One head's attention at one query position.
#[derive(Clone, Debug, PartialEq)]
pub struct HeadRow {
    /// standard: the softmax row; diff kinds: A1 (query sub-head 2h)
    pub a1: Vec<f64>,
    /// diff kinds: A2 (query sub-head 2h + 1)
    pub a2: Option<Vec<f64>>,
    /// the λ that weights A2 (0 for standard)
    pub lambda: f64,
    /// the head's map, summing to one: A for standard, (A1 − λA2)/(1 − λ) for the diff kinds
    pub map: Vec<f64>,
}

/// Names a layer or head outside the model.
pub fn check_layer_head(model: &Model, layer: usize, head: usize) -> Result<()> {
    let c = &model.config;
    if layer >= c.num_hidden_layers {
        return Err(Error::Invalid(format!(
            "layer {layer} is out of range (the model has {} layers, 0..{})",
            c.num_hidden_layers, c.num_hidden_layers
        )));
    }
    if head >= c.num_attention_heads {
        return Err(Error::Invalid(format!(
            "head {head} is out of range (the model has {} {} heads per layer, 0..{})",
            c.num_attention_heads, c.attention, c.num_attention_heads
        )));
    }
    Ok(())
}

/// The map of output head `head` (a differential head for the diff kinds) of `layer` at query
/// position `i` of sequence `bi` of the last forward pass.
pub fn head_row(
    model: &Model,
    ws: &Workspace,
    layer: usize,
    head: usize,
    bi: usize,
    i: usize,
) -> Result<HeadRow> {
    check_layer_head(model, layer, head)?;
    let c = &model.config;
    let (b, t) = ws.last_forward();
    if bi >= b || i >= t {
        return Err(Error::Invalid(format!(
            "position ({bi}, {i}) is outside the last forward pass ({b} × {t})"
        )));
    }
    let s = crate::model::attention::shape(c);
    let a = &ws.layers[layer];
    let (q, k) = (&a.q[..b * t * s.nq * s.dk], &a.k[..b * t * s.nk * s.dk]);
    match c.attention {
        AttentionKind::Standard => {
            let a1 = softmax_row(q, k, &s, t, bi, i, head);
            Ok(HeadRow {
                map: a1.clone(),
                a1,
                a2: None,
                lambda: 0.0,
            })
        }
        AttentionKind::DiffV1 | AttentionKind::DiffV2 => {
            let a1 = softmax_row(q, k, &s, t, bi, i, 2 * head);
            let a2 = softmax_row(q, k, &s, t, bi, i, 2 * head + 1);
            let lambda = if c.attention == AttentionKind::DiffV1 {
                a.lambda_parts.0 as f64
            } else {
                a.lam[(bi * t + i) * c.num_attention_heads + head] as f64
            };
            Ok(HeadRow {
                map: diff_map(&a1, &a2, lambda),
                a1,
                a2: Some(a2),
                lambda,
            })
        }
    }
}

/// Whole T×T maps of one head over one sequence (row i = query i, zero above the diagonal).
#[derive(Clone, Debug)]
pub struct HeadMaps {
    /// Tokens in the sequence: each map is t × t, row-major.
    pub t: usize,
    /// standard: A; diff kinds: A1
    pub a1: Vec<f64>,
    /// diff kinds: A2
    pub a2: Option<Vec<f64>>,
    /// diff kinds: A1 − λ·A2 as the head applies it (not normalised), λ per row for diff_v2
    pub diff: Option<Vec<f64>>,
    /// λ of each row (0 for standard)
    pub lambda: Vec<f64>,
}

/// Runs `tokens` through the model once and returns the maps of each `(layer, head)` of
/// `picks`, in order. A prompt longer than the context, or a layer or head out of range, is an
/// error that names it.
///
/// ```
/// use difftx::prelude::*;
///
/// let model = Model::init(ModelConfig::preset(Preset::Tiny, AttentionKind::DiffV1), 0)?;
/// let ids = Tokenizer::Bytes.encode("the number is 12")?;
/// let maps = head_maps(&model, &ids, &[(0, 0), (1, 1)])?;
/// let m = &maps[0];
/// let a2 = m.a2.as_ref().expect("diff_v1 has A2");
/// for i in 0..m.t {
///     let row = |a: &[f64]| a[i * m.t..(i + 1) * m.t].iter().sum::<f64>();
///     assert!((row(&m.a1) - 1.0).abs() < 1e-9 && (row(a2) - 1.0).abs() < 1e-9);
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn head_maps(model: &Model, tokens: &[u32], picks: &[(usize, usize)]) -> Result<Vec<HeadMaps>> {
    // 1. Check everything before the forward pass.
    for &(layer, head) in picks {
        check_layer_head(model, layer, head)?;
    }
    let ctx = model.config.max_position_embeddings;
    let t = tokens.len();
    if t == 0 || t > ctx {
        return Err(Error::Invalid(format!(
            "the prompt is {t} tokens; it must have between 1 and the model's context of {ctx} tokens"
        )));
    }
    // 2. One forward pass; every map is recomputed from its q and k.
    let mut ws = Workspace::new(model, 1, t);
    model.forward(&mut ws, tokens, 1, t)?;
    let diff = model.config.attention.is_diff();
    let mut out = Vec::with_capacity(picks.len());
    for &(layer, head) in picks {
        let mut m = HeadMaps {
            t,
            a1: vec![0.0; t * t],
            a2: diff.then(|| vec![0.0; t * t]),
            diff: diff.then(|| vec![0.0; t * t]),
            lambda: vec![0.0; t],
        };
        for i in 0..t {
            let r = head_row(model, &ws, layer, head, 0, i)?;
            m.a1[i * t..i * t + i + 1].copy_from_slice(&r.a1);
            m.lambda[i] = r.lambda;
            if let (Some(a2), Some(d), Some(r2)) = (m.a2.as_mut(), m.diff.as_mut(), r.a2.as_ref()) {
                a2[i * t..i * t + i + 1].copy_from_slice(r2);
                for (p, (&x, &y)) in r.a1.iter().zip(r2).enumerate() {
                    d[i * t + p] = x - r.lambda * y;
                }
            }
        }
        out.push(m);
    }
    Ok(out)
}

impl HeadMaps {
    /// The maps as JSON: `lambda` (each row's λ), and `a1`, `a2`, `diff` (null for standard)
    /// as T rows of T values, row i attending to keys 0..=i. `attention-map --dump` and the
    /// server's /v1/attention both write this.
    pub fn to_json(&self) -> serde_json::Value {
        let rows = |x: &[f64]| x.chunks(self.t).map(|r| r.to_vec()).collect::<Vec<_>>();
        serde_json::json!({
            "lambda": self.lambda, "a1": rows(&self.a1),
            "a2": self.a2.as_deref().map(rows), "diff": self.diff.as_deref().map(rows),
        })
    }
}

/// Attention mass on the answer span and on the rest of the context ("noise").
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Allocation {
    pub answer: f64,
    pub noise: f64,
}

/// The mean, over query positions `queries` (those that predict the answer tokens), every head
/// and every layer, of the mass each head's map puts on `answer` (a span inside the context
/// 0..context) and on the rest of the context. Mass on positions after the context (the query
/// itself) counts as neither. Sequence `bi` of the last forward pass.
pub fn allocation(
    model: &Model,
    ws: &Workspace,
    bi: usize,
    queries: Range<usize>,
    answer: Range<usize>,
    context: usize,
) -> Result<Allocation> {
    if queries.is_empty() || answer.is_empty() || answer.end > context || queries.start < context {
        return Err(Error::Invalid(format!(
            "allocation needs answer positions {answer:?} inside the context 0..{context} and query positions {queries:?} after it"
        )));
    }
    let c = &model.config;
    let (mut sa, mut sn, mut n) = (0f64, 0f64, 0usize);
    for l in 0..c.num_hidden_layers {
        for h in 0..c.num_attention_heads {
            for i in queries.clone() {
                let r = head_row(model, ws, l, h, bi, i)?;
                let a: f64 = r.map[answer.clone()].iter().sum();
                let all: f64 = r.map[..context].iter().sum();
                sa += a;
                sn += all - a;
                n += 1;
            }
        }
    }
    Ok(Allocation {
        answer: sa / n as f64,
        noise: sn / n as f64,
    })
}

/// A needle episode of `len` input tokens through the model (`ws` holds one row of `len`) and
/// its allocation: the queried needle's tokens are the answer, the rest of the haystack the
/// noise, the rows those that predict the answer.
pub fn episode_allocation(
    model: &Model,
    ws: &mut Workspace,
    e: &crate::data::needle::Episode,
    len: usize,
) -> Result<Allocation> {
    model.forward(ws, &e.tokens[..len], 1, len)?;
    allocation(
        model,
        ws,
        0,
        e.answer_queries(),
        e.needle.clone(),
        e.context,
    )
}

/// The largest, 10th largest and median of a set of magnitudes.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Magnitudes {
    pub top1: f64,
    pub top10: f64,
    pub median: f64,
    pub count: usize,
}

impl Magnitudes {
    /// Of |v| for every v in `values` (which it overwrites and reorders).
    pub fn of(values: &mut [f32]) -> Result<Self> {
        let n = values.len();
        if n == 0 {
            return Err(Error::Invalid("no values to measure".into()));
        }
        values.iter_mut().for_each(|v| *v = v.abs());
        let (lower, mid, _) = values.select_nth_unstable_by(n / 2, |a, b| a.total_cmp(b));
        let mid = *mid as f64;
        let median = if n % 2 == 1 {
            mid
        } else {
            let below = lower.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
            (below + mid) / 2.0
        };
        let k = 9.min(n - 1);
        let (_, tenth, _) = values.select_nth_unstable_by(k, |a, b| b.total_cmp(a));
        let top10 = *tenth as f64;
        let top1 = values[..=k]
            .iter()
            .copied()
            .fold(f32::NEG_INFINITY, f32::max) as f64;
        Ok(Magnitudes {
            top1,
            top10,
            median,
            count: n,
        })
    }

    pub fn top1_ratio(&self) -> f64 {
        self.top1 / self.median
    }

    pub fn top10_ratio(&self) -> f64 {
        self.top10 / self.median
    }
}

/// Attention logits q·k/√d of every causal (query, key) pair, for every query head (both maps
/// of each pair for the diff kinds), every layer and every sequence of the last forward pass.
pub fn attention_logits(model: &Model, ws: &Workspace) -> Vec<f32> {
    let c = &model.config;
    let s = crate::model::attention::shape(c);
    let (b, t) = ws.last_forward();
    let mut out = Vec::with_capacity(c.num_hidden_layers * b * s.nq * t * (t + 1) / 2);
    for a in &ws.layers[..c.num_hidden_layers] {
        for bi in 0..b {
            for j in 0..s.nq {
                for i in 0..t {
                    out.extend(
                        logits_row(&a.q, &a.k, &s, t, bi, i, j)
                            .into_iter()
                            .map(|x| x as f32),
                    );
                }
            }
        }
    }
    out
}

/// Every block's output (hidden state) of the last forward pass; the workspace must keep them
/// (`Workspace::keep_hidden_states`).
pub fn hidden_states(model: &Model, ws: &Workspace) -> Result<Vec<f32>> {
    if !ws.keep_hidden {
        return Err(Error::Invalid(
            "the workspace does not keep hidden states (call keep_hidden_states before the forward pass)".into(),
        ));
    }
    let (b, t) = ws.last_forward();
    let n = b * t * model.config.hidden_size;
    Ok(ws
        .hidden
        .iter()
        .flat_map(|h| h[..n].iter().copied())
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ModelConfig, Preset};

    /// One layer, one head of dim 2, context 3; a forward pass sets the workspace's shape,
    /// then q and k are replaced by hand so that at position 2 the first map is [1, 1, 2]/4
    /// (logit ln 2 on key 2) and the second map (diff kinds) is uniform.
    fn hand_built(kind: AttentionKind) -> (Model, Workspace) {
        let mut c = ModelConfig::preset(Preset::Tiny, kind);
        c.hidden_size = 4;
        c.intermediate_size = 4;
        c.num_hidden_layers = 1;
        c.num_attention_heads = 1;
        c.num_key_value_heads = 1;
        c.head_dim = 2;
        c.max_position_embeddings = 3;
        let model = Model::init(c, 0).unwrap();
        let mut ws = Workspace::new(&model, 1, 3);
        model.forward(&mut ws, &[1, 2, 3], 1, 3).unwrap();
        let s = crate::model::attention::shape(&model.config);
        let a = &mut ws.layers[0];
        a.q.fill(0.0);
        a.k.fill(0.0);
        // query head 0 at position 2, its key head at position 2
        a.q[(2 * s.nq) * 2] = (2f32).sqrt() * (2f32).ln();
        a.k[(2 * s.nk + s.k_head(0)) * 2] = 1.0;
        a.lambda_parts.0 = 0.5;
        if kind == AttentionKind::DiffV2 {
            a.lam.fill(0.9);
            a.lam[2] = 0.5;
        }
        (model, ws)
    }

    fn close(a: &[f64], b: &[f64]) {
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).abs() < 1e-6, "{a:?} vs {b:?}");
        }
    }

    #[test]
    fn the_standard_map_is_the_softmax_row() {
        let (model, ws) = hand_built(AttentionKind::Standard);
        let r = head_row(&model, &ws, 0, 0, 0, 2).unwrap();
        close(&r.map, &[0.25, 0.25, 0.5]);
        assert!(r.a2.is_none());
        // position 1 sees keys 0 and 1, both with logit 0
        close(&head_row(&model, &ws, 0, 0, 0, 1).unwrap().map, &[0.5, 0.5]);
        // answer span = key 0, context = keys 0..2 (key 2 is the query itself)
        let al = allocation(&model, &ws, 0, 2..3, 0..1, 2).unwrap();
        assert!(
            (al.answer - 0.25).abs() < 1e-6 && (al.noise - 0.25).abs() < 1e-6,
            "{al:?}"
        );
    }

    #[test]
    fn diff_maps_follow_the_authors_normalisation() {
        // (A1 − ½A2) / (1 − ½) = 2·[¼, ¼, ½] − [⅓, ⅓, ⅓] = [1/6, 1/6, 2/3]
        for kind in [AttentionKind::DiffV1, AttentionKind::DiffV2] {
            let (model, ws) = hand_built(kind);
            let r = head_row(&model, &ws, 0, 0, 0, 2).unwrap();
            close(&r.a1, &[0.25, 0.25, 0.5]);
            close(r.a2.as_ref().unwrap(), &[1.0 / 3.0; 3]);
            assert_eq!(r.lambda, 0.5, "{kind}");
            close(&r.map, &[1.0 / 6.0, 1.0 / 6.0, 2.0 / 3.0]);
            assert!((r.map.iter().sum::<f64>() - 1.0).abs() < 1e-12);
            let al = allocation(&model, &ws, 0, 2..3, 0..1, 2).unwrap();
            assert!((al.answer - 1.0 / 6.0).abs() < 1e-6, "{kind}: {al:?}");
            assert!((al.noise - 1.0 / 6.0).abs() < 1e-6, "{kind}: {al:?}");
        }
    }

    #[test]
    fn out_of_range_layers_heads_and_positions_are_named() {
        let (model, ws) = hand_built(AttentionKind::DiffV1);
        let e = head_row(&model, &ws, 1, 0, 0, 0).unwrap_err().to_string();
        assert!(e.contains("layer 1 is out of range"), "{e}");
        let e = head_row(&model, &ws, 0, 3, 0, 0).unwrap_err().to_string();
        assert!(e.contains("head 3 is out of range"), "{e}");
        let e = head_row(&model, &ws, 0, 0, 0, 3).unwrap_err().to_string();
        assert!(e.contains("outside the last forward pass (1 × 3)"), "{e}");
    }

    #[test]
    fn head_maps_are_causal_rows_and_bad_prompts_are_named() {
        let mut c = ModelConfig::preset(Preset::Tiny, AttentionKind::DiffV1);
        c.max_position_embeddings = 8;
        let model = Model::init(c, 1).unwrap();
        let m = head_maps(&model, &[5, 6, 7, 8], &[(1, 1), (0, 0)])
            .unwrap()
            .remove(0);
        assert_eq!(m.t, 4);
        for i in 0..4 {
            let a1: f64 = m.a1[i * 4..i * 4 + 4].iter().sum();
            assert!((a1 - 1.0).abs() < 1e-9);
            assert!(m.a1[i * 4 + i + 1..i * 4 + 4].iter().all(|&x| x == 0.0));
            let d: f64 = m.diff.as_ref().unwrap()[i * 4..i * 4 + 4].iter().sum();
            assert!((d - (1.0 - m.lambda[i])).abs() < 1e-9, "row {i}: {d}");
        }
        let e = head_maps(&model, &[1; 9], &[(0, 0)])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("prompt is 9 tokens") && e.contains("context of 8"),
            "{e}"
        );
        let e = head_maps(&model, &[1; 3], &[(0, 0), (2, 0)])
            .unwrap_err()
            .to_string();
        assert!(e.contains("layer 2 is out of range"), "{e}");
    }

    #[test]
    fn magnitudes_take_top_values_and_the_median_of_absolute_values() {
        let mut v: Vec<f32> = (1..=21).map(|x| x as f32).collect();
        v[20] = -100.0;
        let m = Magnitudes::of(&mut v).unwrap();
        // |values|: 1..=20 and 100; median is the 11th smallest = 11, 10th largest = 12
        assert_eq!(
            (m.top1, m.top10, m.median, m.count),
            (100.0, 12.0, 11.0, 21)
        );
        let mut even = vec![4.0f32, -1.0, 3.0, 2.0];
        let m = Magnitudes::of(&mut even).unwrap();
        assert_eq!((m.top1, m.top10, m.median), (4.0, 1.0, 2.5));
        assert!(Magnitudes::of(&mut Vec::new()).is_err());
    }

    #[test]
    fn attention_logits_cover_every_causal_pair_of_every_query_head() {
        let (model, ws) = hand_built(AttentionKind::Standard);
        let mut l = attention_logits(&model, &ws);
        assert_eq!(l.len(), 6);
        let m = Magnitudes::of(&mut l).unwrap();
        assert!((m.top1 - 2f64.ln()).abs() < 1e-6 && m.median == 0.0);
        let (model, ws) = hand_built(AttentionKind::DiffV1);
        assert_eq!(attention_logits(&model, &ws).len(), 12);
        assert!(hidden_states(&model, &ws).is_err());
    }
}
