//! Picking the next token from logits: greedy, or temperature with optional top-k / top-p.

use crate::error::{Error, Result};
use rand::Rng;

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampling {
    /// 0: greedy (argmax)
    pub temperature: f32,
    /// keep only the k most likely tokens
    pub top_k: Option<usize>,
    /// keep the smallest set of most likely tokens whose probability reaches p
    pub top_p: Option<f32>,
}

impl Sampling {
    pub fn greedy() -> Self {
        Sampling {
            temperature: 0.0,
            top_k: None,
            top_p: None,
        }
    }

    /// Refuses settings that cannot sample: a negative or NaN temperature, top-k of 0, top-p
    /// outside (0, 1].
    pub fn validate(&self) -> Result<()> {
        if let Some(p) = self.top_p {
            if !(p > 0.0 && p <= 1.0) {
                return Err(Error::Invalid(format!(
                    "--top-p must be in (0, 1], got {p}"
                )));
            }
        }
        if self.top_k == Some(0) {
            return Err(Error::Invalid("--top-k must be at least 1".into()));
        }
        if self.temperature.is_nan() || self.temperature < 0.0 {
            return Err(Error::Invalid(format!(
                "--temperature must be 0 (greedy) or positive, got {}",
                self.temperature
            )));
        }
        Ok(())
    }
}

/// The index of the largest logit (the first one on ties).
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in logits.iter().enumerate() {
        if x > logits[best] {
            best = i;
        }
    }
    best as u32
}

/// Draws a token; `scratch` holds (probability, id) pairs and is reused between calls.
pub fn sample(
    logits: &[f32],
    s: &Sampling,
    rng: &mut impl Rng,
    scratch: &mut Vec<(f32, u32)>,
) -> u32 {
    if s.temperature <= 0.0 {
        return argmax(logits);
    }
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    scratch.clear();
    scratch.extend(
        logits
            .iter()
            .enumerate()
            .map(|(i, &x)| (((x - max) / s.temperature).exp(), i as u32)),
    );
    // Most likely first; ties keep token order so the draw is reproducible.
    scratch.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    let mut keep = scratch.len();
    if let Some(k) = s.top_k {
        keep = keep.min(k.max(1));
    }
    let total: f32 = scratch[..keep].iter().map(|p| p.0).sum();
    if let Some(p) = s.top_p {
        let mut acc = 0.0;
        for (i, q) in scratch[..keep].iter().enumerate() {
            acc += q.0 / total;
            if acc >= p {
                keep = i + 1;
                break;
            }
        }
    }
    let total: f32 = scratch[..keep].iter().map(|p| p.0).sum();
    let mut u = rng.random::<f32>() * total;
    for &(p, id) in &scratch[..keep] {
        if u < p {
            return id;
        }
        u -= p;
    }
    scratch[keep - 1].1
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    #[test]
    fn greedy_picks_the_first_maximum() {
        assert_eq!(argmax(&[0.1, 3.0, -1.0, 3.0]), 1);
    }

    #[test]
    fn top_k_and_top_p_never_draw_outside_the_kept_set() {
        let logits = [2.0, 1.9, 0.0, -1.0, 1.8];
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let mut scratch = Vec::new();
        let k2 = Sampling {
            temperature: 1.0,
            top_k: Some(2),
            top_p: None,
        };
        let mut seen = [0usize; 5];
        for _ in 0..2000 {
            seen[sample(&logits, &k2, &mut rng, &mut scratch) as usize] += 1;
        }
        assert!(seen[0] > 0 && seen[1] > 0, "{seen:?}");
        assert_eq!(seen[2] + seen[3] + seen[4], 0, "{seen:?}");
        // top-p 0.5: p(0) ≈ 0.36 alone is short of 0.5, with token 1 it passes.
        let p = Sampling {
            temperature: 1.0,
            top_k: None,
            top_p: Some(0.5),
        };
        let mut seen = [0usize; 5];
        for _ in 0..2000 {
            seen[sample(&logits, &p, &mut rng, &mut scratch) as usize] += 1;
        }
        assert_eq!(seen[2] + seen[3] + seen[4], 0, "{seen:?}");
        assert!(seen[0] > seen[1] && seen[1] > 0, "{seen:?}");
    }

    #[test]
    fn temperature_sampling_follows_the_softmax() {
        let logits = [0.0, (3f32).ln()]; // probabilities 1/4, 3/4
        let s = Sampling {
            temperature: 1.0,
            top_k: None,
            top_p: None,
        };
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let mut scratch = Vec::new();
        let ones = (0..20000)
            .filter(|_| sample(&logits, &s, &mut rng, &mut scratch) == 1)
            .count();
        assert!((ones as f64 / 20000.0 - 0.75).abs() < 0.015, "{ones}");
    }
}
