//! The contextual-hallucination proxy (paper Section 3.6, in miniature): made-up facts
//! ("the capital of zorvia is plenth.") are repeated through the training data, so each model
//! learns them; at test time a passage of validation text states the opposite ("the capital
//! of zorvia is drell.") and the model is asked again. Answering from the context, not from
//! memory, is what the paper calls not hallucinating.

use crate::data::Tokenizer;
use crate::error::{Error, Result};
use crate::model::{Model, Workspace};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// One made-up fact, and the answer a test passage states instead.
#[derive(Clone, Debug, PartialEq)]
pub struct Fact {
    pub country: String,
    pub capital: String,
    pub contradiction: String,
}

/// `n` facts from `seed`: distinct made-up names of consonant–vowel syllables.
pub fn facts(n: usize, seed: u64) -> Vec<Fact> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut seen = std::collections::HashSet::new();
    let mut name = |rng: &mut ChaCha8Rng, syllables: usize| loop {
        const CONS: &[u8] = b"bdfgklmnprstvz";
        const VOWELS: &[u8] = b"aeiou";
        let mut w = String::new();
        for _ in 0..syllables {
            w.push(CONS[rng.random_range(0..CONS.len())] as char);
            w.push(VOWELS[rng.random_range(0..VOWELS.len())] as char);
        }
        if seen.insert(w.clone()) {
            return w;
        }
    };
    (0..n)
        .map(|_| Fact {
            country: format!("{}ia", name(&mut rng, 2)),
            capital: name(&mut rng, 2),
            contradiction: name(&mut rng, 2),
        })
        .collect()
}

/// The training text of the facts: each stated `repeats` times, in a shuffled order.
pub fn training_text(facts: &[Fact], repeats: usize, seed: u64) -> String {
    let mut order: Vec<usize> = (0..facts.len() * repeats)
        .map(|i| i % facts.len())
        .collect();
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0xfac7);
    for i in (1..order.len()).rev() {
        order.swap(i, rng.random_range(0..=i));
    }
    let mut s = String::new();
    for i in order {
        let f = &facts[i];
        s.push_str(&format!("the capital of {} is {}. ", f.country, f.capital));
    }
    s.push('\n');
    s
}

/// The share of `facts` the model answers from the context: for each, a passage of `len`
/// tokens of `filler` text with the contradicting statement in its middle, then "the capital
/// of COUNTRY is"; the context's answer counts when its continuation is more likely than
/// the memorised one.
pub fn from_context_rate(
    model: &Model,
    tok: &Tokenizer,
    facts: &[Fact],
    filler: &str,
    len: usize,
) -> Result<f64> {
    let mut ws = Workspace::new(model, 1, len);
    let mut from_context = 0;
    for (i, f) in facts.iter().enumerate() {
        let said = format!(" the capital of {} is {}. ", f.country, f.contradiction);
        let ask = format!("\nthe capital of {} is", f.country);
        let start = (i * 7919) % filler.len().max(1);
        let mut pick =
            |a: &str| logprob(model, &mut ws, tok, (filler, start), (&said, &ask), a, len);
        let context = pick(&format!(" {}.", f.contradiction))?;
        let memory = pick(&format!(" {}.", f.capital))?;
        from_context += usize::from(context > memory);
    }
    Ok(from_context as f64 / facts.len().max(1) as f64)
}

/// The log-probability of `answer` after a passage: filler from `start` around `said`, then
/// `ask`, the whole at most `len` tokens (the filler trimmed to fit).
fn logprob(
    model: &Model,
    ws: &mut Workspace,
    tok: &Tokenizer,
    (filler, start): (&str, usize),
    (said, ask): (&str, &str),
    answer: &str,
    len: usize,
) -> Result<f64> {
    // 1. The passage, as long as fits: half the filler before the statement, half after
    let tail = format!("{said}{ask}{answer}");
    let fixed = tok.encode(&tail)?.len() + 2;
    if fixed >= len {
        return Err(Error::Invalid(format!(
            "a hallucination passage needs more than {len} tokens"
        )));
    }
    let start = (start..filler.len())
        .find(|&i| filler.is_char_boundary(i))
        .unwrap_or(filler.len());
    let words: Vec<&str> = filler[start..]
        .split_whitespace()
        .chain(filler.split_whitespace())
        .collect();
    let mut n = (len - fixed) / 2;
    let (ids, offsets, text) = loop {
        let half = n / 2;
        let text = format!(
            "{} {said}{} {ask}{answer}",
            words[..half.min(words.len())].join(" "),
            words[half.min(words.len())..n.min(words.len())].join(" ")
        );
        let (ids, offsets) = tok.encode_offsets(&text)?;
        if ids.len() <= len || n == 0 {
            break (ids, offsets, text);
        }
        n = (n * len / ids.len()).saturating_sub(1);
    };
    // 2. The answer's tokens, scored after the tokens before them
    let answer_at = text.len() - answer.len();
    let first = offsets
        .iter()
        .position(|&(_, end)| end > answer_at)
        .unwrap_or(ids.len())
        .max(1);
    let t = ids.len() - 1;
    model.forward(ws, &ids[..t], 1, t)?;
    let v = model.config.vocab_size;
    let mut lp = 0.0;
    for p in first..ids.len() {
        let row = &ws.logits[(p - 1) * v..p * v];
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
        let z: f64 = row.iter().map(|&x| (x as f64 - max).exp()).sum();
        lp += row[ids[p] as usize] as f64 - max - z.ln();
    }
    Ok(lp)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{AttentionKind, ModelConfig, Preset};

    #[test]
    fn facts_are_distinct_and_their_text_states_each_as_often() {
        let f = facts(20, 3);
        let names: std::collections::HashSet<_> = f
            .iter()
            .flat_map(|x| [&x.country, &x.capital, &x.contradiction])
            .collect();
        assert_eq!(names.len(), 60);
        let text = training_text(&f, 4, 3);
        for x in &f {
            let s = format!("the capital of {} is {}.", x.country, x.capital);
            assert_eq!(text.matches(&s).count(), 4);
            assert!(!text.contains(&x.contradiction));
        }
        assert_eq!(facts(20, 3), f);
    }

    /// A fresh model gives a rate in [0, 1] over passages that fit the window.
    #[test]
    fn the_rate_of_a_fresh_model_is_a_share() {
        let mut c = ModelConfig::preset(Preset::Tiny, AttentionKind::DiffV2);
        c.max_position_embeddings = 128;
        let m = Model::init(c, 1).unwrap();
        let filler = "one two three four five six seven eight nine ten ".repeat(40);
        let r = from_context_rate(&m, &Tokenizer::Bytes, &facts(4, 1), &filler, 128).unwrap();
        assert!((0.0..=1.0).contains(&r));
        assert!(from_context_rate(&m, &Tokenizer::Bytes, &facts(1, 1), &filler, 40).is_err());
    }
}
