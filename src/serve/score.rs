//! A token's score: its log-probability and the likeliest tokens at its position.

/// A token's log-probability under the model and the most likely tokens at its position.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenScore {
    /// its log-probability
    pub logprob: f32,
    /// (token, log-probability), most likely first
    pub top: Vec<(u32, f32)>,
}

/// `token`'s log-probability under `logits` and the `top` most likely tokens (log-softmax in
/// f64: the same numbers `difftx eval`'s cross-entropy gives, up to rounding).
pub fn score(logits: &[f32], token: u32, top: usize) -> TokenScore {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let lse = max
        + logits
            .iter()
            .map(|&x| (x as f64 - max).exp())
            .sum::<f64>()
            .ln();
    let lp = |x: f32| (x as f64 - lse) as f32;
    let mut best: Vec<(u32, f32)> = Vec::with_capacity(top + 1);
    if top > 0 {
        for (i, &x) in logits.iter().enumerate() {
            if best.len() < top || x > best[best.len() - 1].1 {
                let at = best.partition_point(|b| b.1 >= x);
                best.insert(at, (i as u32, x));
                best.truncate(top);
            }
        }
    }
    TokenScore {
        logprob: lp(logits[token as usize]),
        top: best.into_iter().map(|(i, x)| (i, lp(x))).collect(),
    }
}
