//! Picking the next token from logits: greedy, or temperature with optional top-k / top-p,
//! after the logits are adjusted for what the sequence has already seen (`Penalties`).

use crate::error::{Error, Result};
use rand::Rng;
use std::collections::HashMap;

#[derive(Clone, Copy, Debug, PartialEq)]
/// How the next token is picked from the logits.
pub struct Sampling {
    /// 0: greedy (argmax)
    pub temperature: f32,
    /// keep only the k most likely tokens
    pub top_k: Option<usize>,
    /// keep the smallest set of most likely tokens whose probability reaches p
    pub top_p: Option<f32>,
    /// what the tokens already seen take off the logits (`adjusted`)
    pub penalties: Penalties,
}

impl Sampling {
    /// Argmax decoding, no penalties: the same tokens every time.
    pub fn greedy() -> Self {
        Sampling {
            temperature: 0.0,
            top_k: None,
            top_p: None,
            penalties: Penalties::NONE,
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
        let flags = [
            "--presence-penalty",
            "--frequency-penalty",
            "--repetition-penalty",
        ];
        self.penalties
            .check(flags)
            .map_err(|(_, m)| Error::Invalid(m))
    }
}

/// Penalties on the tokens a sequence has already seen, as OpenAI's API (presence, frequency)
/// and transformers and vLLM (repetition) define them. For token j, generated c_j times so far
/// (the prompt does not count) and `seen` if the prompt or the generated tokens hold it:
///
/// ```text
/// l_j ← l_j / repetition if l_j > 0, l_j · repetition otherwise    (where seen)
/// l_j ← l_j − frequency · c_j − presence · [c_j > 0]
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Penalties {
    /// taken once off each generated token's logit (`presence_penalty`, in [-2, 2])
    pub presence: f32,
    /// taken off a token's logit for every time it was generated (`frequency_penalty`, in
    /// [-2, 2])
    pub frequency: f32,
    /// divides a seen token's positive logit, multiplies a negative one (`repetition_penalty`,
    /// positive; 1 is none, above 1 discourages repeats)
    pub repetition: f32,
}

impl Penalties {
    /// No penalty at all.
    pub const NONE: Penalties = Penalties {
        presence: 0.0,
        frequency: 0.0,
        repetition: 1.0,
    };

    /// Whether no penalty applies (then nothing is recorded or adjusted).
    pub fn is_none(&self) -> bool {
        *self == Self::NONE
    }

    /// The first penalty outside its range, as (its name in `names`, presence, frequency and
    /// repetition's, and a one-line message naming it and its value).
    pub fn check(
        &self,
        names: [&'static str; 3],
    ) -> std::result::Result<(), (&'static str, String)> {
        for (name, v) in names.into_iter().zip([self.presence, self.frequency]) {
            if !(-2.0..=2.0).contains(&v) {
                return Err((name, format!("{name} must be in [-2, 2], got {v}")));
            }
        }
        let (name, r) = (names[2], self.repetition);
        if !(r > 0.0 && r.is_finite()) {
            return Err((name, format!("{name} must be positive (1: none), got {r}")));
        }
        Ok(())
    }
}

/// What a sequence's penalties look at: for each token it has seen, how often it was generated
/// and whether its prompt holds it. Empty (and never filled) without penalties.
#[derive(Clone, Debug, Default)]
pub struct Seen {
    tokens: HashMap<u32, (u32, bool)>,
    /// whether the sequence has penalties (else nothing is recorded)
    on: bool,
}

impl Seen {
    /// A sequence that has read `prompt`, for penalties `p`.
    pub fn new(prompt: &[u32], p: &Penalties) -> Seen {
        let mut seen = Seen {
            on: !p.is_none(),
            ..Seen::default()
        };
        if seen.on {
            for &t in prompt {
                seen.tokens.entry(t).or_default().1 = true;
            }
        }
        seen
    }

    /// Records a generated token.
    pub fn push(&mut self, token: u32) {
        if self.on {
            self.tokens.entry(token).or_default().0 += 1;
        }
    }
}

/// The logits a token is drawn (and scored) from: `row` with `bias` added ((token, bias), as
/// OpenAI's `logit_bias`), then the sampling's penalties over `seen`, in `buf`; `row` itself
/// where there is neither. (vLLM's order: biases, then penalties.)
pub fn adjusted<'a>(
    row: &'a [f32],
    s: &Sampling,
    seen: &Seen,
    bias: &[(u32, f32)],
    buf: &'a mut Vec<f32>,
) -> &'a [f32] {
    let p = &s.penalties;
    if bias.is_empty() && p.is_none() {
        return row;
    }
    buf.clear();
    buf.extend_from_slice(row);
    for &(t, b) in bias {
        buf[t as usize] += b;
    }
    for (&t, &(count, _)) in &seen.tokens {
        let l = &mut buf[t as usize];
        if *l > 0.0 {
            *l /= p.repetition;
        } else {
            *l *= p.repetition;
        }
        if count > 0 {
            *l -= p.frequency * count as f32 + p.presence;
        }
    }
    buf
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

/// Draws a token: greedy at temperature 0, else from softmax(logits / temperature) cut to
/// the top-k, then to the top-p most likely tokens.
pub fn sample(
    logits: &[f32],
    s: &Sampling,
    rng: &mut impl Rng,
    scratch: &mut Vec<(f32, u32)>,
) -> u32 {
    if s.temperature <= 0.0 {
        return argmax(logits);
    }
    let keep = kept(logits, s, scratch);
    draw(&scratch[..keep], rng, None)
}

/// Verifies a drafted token as speculative decoding does (the rejection rule of Leviathan et
/// al. 2023 and Chen et al. 2023 for a draft that proposes `draft` with certainty): greedy,
/// the argmax, accepted when it is the draft; sampled, the draft accepted with probability
/// p(draft), else a token drawn from p with the draft taken out and renormalised, so that
/// the token's distribution is p's either way. Returns (token, whether it is the draft).
pub fn verify(
    logits: &[f32],
    s: &Sampling,
    rng: &mut impl Rng,
    scratch: &mut Vec<(f32, u32)>,
    draft: u32,
) -> (u32, bool) {
    if s.temperature <= 0.0 {
        let t = argmax(logits);
        return (t, t == draft);
    }
    let keep = kept(logits, s, scratch);
    let set = &scratch[..keep];
    let total: f32 = set.iter().map(|p| p.0).sum();
    let p_draft = set
        .iter()
        .find(|p| p.1 == draft)
        .map_or(0.0, |p| p.0 / total);
    if rng.random::<f32>() < p_draft {
        return (draft, true);
    }
    (draw(set, rng, Some(draft)), false)
}

/// Fills `scratch` with (weight, token), most likely first (ties in token order, so that a
/// draw is reproducible), weights exp((l − max) / temperature); returns how many the top-k
/// and top-p cuts keep.
fn kept(logits: &[f32], s: &Sampling, scratch: &mut Vec<(f32, u32)>) -> usize {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    scratch.clear();
    scratch.extend(
        logits
            .iter()
            .enumerate()
            .map(|(i, &x)| (((x - max) / s.temperature).exp(), i as u32)),
    );
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
    keep
}

/// A token drawn from `set` in proportion to its weights, leaving out `except`.
fn draw(set: &[(f32, u32)], rng: &mut impl Rng, except: Option<u32>) -> u32 {
    let weight = |p: &(f32, u32)| if Some(p.1) == except { 0.0 } else { p.0 };
    let total: f32 = set.iter().map(weight).sum();
    let mut u = rng.random::<f32>() * total;
    for p in set {
        if u < weight(p) {
            return p.1;
        }
        u -= weight(p);
    }
    // rounding left u at the end: the last token that may be drawn
    set.iter()
        .rev()
        .find(|p| weight(p) > 0.0)
        .unwrap_or(&set[0])
        .1
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    /// The speculative rule keeps the distribution: over many draws, each token's frequency
    /// is its probability after temperature, top-k and top-p, whatever the draft (inside the
    /// kept set, outside it); a draft is accepted at the rate of its probability; greedy
    /// verification is the argmax, accepted only when it is the draft.
    #[test]
    fn verifying_a_draft_draws_from_the_unchanged_distribution() {
        let logits = [2.0, 1.0, 0.5, -1.0, 0.0];
        let mut scratch = Vec::new();
        for (top_k, top_p, draft) in [
            (None, None, 1),
            (None, None, 3),
            (Some(3), None, 4),
            (None, Some(0.8), 0),
        ] {
            let s = Sampling {
                temperature: 0.7,
                top_k,
                top_p,
                ..Sampling::greedy()
            };
            let n = 200_000;
            let mut rng = ChaCha8Rng::seed_from_u64(7);
            let (mut plain, mut spec, mut accepted) = ([0usize; 5], [0usize; 5], 0);
            for _ in 0..n {
                plain[sample(&logits, &s, &mut rng, &mut scratch) as usize] += 1;
                let (t, ok) = verify(&logits, &s, &mut rng, &mut scratch, draft);
                spec[t as usize] += 1;
                accepted += ok as usize;
                assert_eq!(ok, t == draft);
            }
            for t in 0..5 {
                let (a, b) = (plain[t] as f64 / n as f64, spec[t] as f64 / n as f64);
                assert!(
                    (a - b).abs() < 0.006,
                    "{top_k:?} {top_p:?} draft {draft}: token {t} {a} vs {b}"
                );
            }
            let rate = accepted as f64 / n as f64;
            let p_draft = plain[draft as usize] as f64 / n as f64;
            assert!(
                (rate - p_draft).abs() < 0.006,
                "acceptance {rate} vs p {p_draft}"
            );
        }
        let g = Sampling::greedy();
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        assert_eq!(verify(&logits, &g, &mut rng, &mut scratch, 0), (0, true));
        assert_eq!(verify(&logits, &g, &mut rng, &mut scratch, 2), (0, false));
    }

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
            ..Sampling::greedy()
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
            top_p: Some(0.5),
            ..Sampling::greedy()
        };
        let mut seen = [0usize; 5];
        for _ in 0..2000 {
            seen[sample(&logits, &p, &mut rng, &mut scratch) as usize] += 1;
        }
        assert_eq!(seen[2] + seen[3] + seen[4], 0, "{seen:?}");
        assert!(seen[0] > seen[1] && seen[1] > 0, "{seen:?}");
    }

    /// Each token's logit under the three penalties, worked by hand from the rules in
    /// `Penalties`' doc: unseen, prompt only, generated once, generated twice and in the
    /// prompt, a zero logit in the prompt; `logit_bias` added before them.
    #[test]
    fn penalties_adjust_each_seen_token_by_its_rule() {
        let row = [2.0, -1.0, 0.5, 3.0, 0.0, 1.0];
        let p = Penalties {
            presence: 0.5,
            frequency: 0.25,
            repetition: 2.0,
        };
        let s = Sampling {
            penalties: p,
            ..Sampling::greedy()
        };
        let mut seen = Seen::new(&[1, 4, 3], &p);
        for t in [3, 2, 3] {
            seen.push(t);
        }
        let mut buf = Vec::new();
        let got = adjusted(&row, &s, &seen, &[(5, -3.0)], &mut buf).to_vec();
        // 0: unseen; 1: prompt, negative → ×2; 2: once → /2 − 0.25 − 0.5;
        // 3: twice (and prompt) → /2 − 0.5 − 0.5; 4: 0 stays 0; 5: unseen, biased by −3
        assert_eq!(got, [2.0, -2.0, -0.5, 0.5, 0.0, -2.0]);
        // the bias comes first: 1 + 3 = 4 in the prompt → /2
        let got = adjusted(&row, &s, &seen, &[(1, 3.0)], &mut buf).to_vec();
        assert_eq!(got[1], 1.0);
        // no penalties and no bias: the row itself, and nothing is recorded
        let none = Sampling::greedy();
        let mut quiet = Seen::new(&[1, 2], &none.penalties);
        quiet.push(1);
        assert!(quiet.tokens.is_empty());
        assert!(std::ptr::eq(
            adjusted(&row, &none, &quiet, &[], &mut buf),
            &row[..]
        ));
    }

    #[test]
    fn penalties_out_of_range_are_named() {
        let names = ["p", "f", "r"];
        let with = |presence, frequency, repetition| Penalties {
            presence,
            frequency,
            repetition,
        };
        assert_eq!(with(2.0, -2.0, 0.01).check(names), Ok(()));
        for (bad, name) in [
            (with(2.5, 0.0, 1.0), "p"),
            (with(0.0, -2.1, 1.0), "f"),
            (with(0.0, f32::NAN, 1.0), "f"),
            (with(0.0, 0.0, 0.0), "r"),
            (with(0.0, 0.0, f32::INFINITY), "r"),
        ] {
            assert_eq!(bad.check(names).unwrap_err().0, name, "{bad:?}");
        }
    }

    #[test]
    fn temperature_sampling_follows_the_softmax() {
        let logits = [0.0, (3f32).ln()]; // probabilities 1/4, 3/4
        let s = Sampling {
            temperature: 1.0,
            ..Sampling::greedy()
        };
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let mut scratch = Vec::new();
        let ones = (0..20000)
            .filter(|_| sample(&logits, &s, &mut rng, &mut scratch) == 1)
            .count();
        assert!((ones as f64 / 20000.0 - 0.75).abs() < 0.015, "{ones}");
    }
}
