//! Multi-needle retrieval episodes (paper Section 3.4) at byte level: pure data, no model.
//!
//! An episode of a window of T input tokens is T + 1 bytes:
//!
//! ```text
//! haystack: filler with N needles "the magic number of CITY is NUMBER. " inserted at word
//!           boundaries; the queried needle at depth p (p of the filler bytes come before it),
//!           the other N − 1 at seeded random depths
//! queries:  R times "\nwhat is the magic number of CITY? NUMBER", the needle at depth p
//!           asked first, then R − 1 of the others; the episode ends with "\n"
//! ```
//!
//! Filler comes from a seeded synthetic language (Zipf-distributed pseudo-words built from
//! consonant–vowel syllables) or from consecutive bytes of a text. Tokens are bytes, or under
//! a model's own tokenizer (BPE) the same text tokenized whole (`needle/tokenized.rs`).
//!
//! `fill_rows` makes a training batch of episodes: `difftx repro` trains on them
//! (experiments/repro), and so does `difftx train --needles N` over its own text.

mod tokenized;

use crate::data::tokenizer::Tokenizer;
use crate::error::{Error, Result};
use crate::kernels::cross_entropy::IGNORE;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::HashSet;
use std::ops::Range;
use std::sync::Arc;

/// Lower-case city names of at most 6 letters.
pub const CITIES: [&str; 24] = [
    "paris", "tokyo", "lima", "oslo", "cairo", "delhi", "rome", "quito", "dakar", "hanoi", "seoul",
    "berlin", "madrid", "lagos", "dublin", "athens", "vienna", "havana", "manila", "riga", "sofia",
    "kyiv", "bern", "doha",
];

/// Depths of the queried needle: the fraction of the filler that comes before it.
pub const DEPTHS: [f64; 5] = [0.0, 0.25, 0.5, 0.75, 1.0];

/// A seeded synthetic language: `words` ranked by frequency, word r drawn with weight 1/r.
#[derive(Clone, Debug)]
pub struct SyntheticLanguage {
    pub words: Vec<String>,
    /// cumulative Zipf probabilities
    cdf: Vec<f64>,
}

impl SyntheticLanguage {
    /// `vocab` distinct words of 1–3 consonant–vowel syllables; no word is a city name.
    pub fn new(seed: u64, vocab: usize) -> Self {
        const CONS: &[u8] = b"bcdfghjklmnprstvwz";
        const VOWELS: &[u8] = b"aeiou";
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut seen: HashSet<String> = CITIES.iter().map(|c| c.to_string()).collect();
        let mut words = Vec::with_capacity(vocab);
        while words.len() < vocab.max(1) {
            let syllables = rng.random_range(1..=3);
            let mut w = String::new();
            for _ in 0..syllables {
                w.push(CONS[rng.random_range(0..CONS.len())] as char);
                w.push(VOWELS[rng.random_range(0..VOWELS.len())] as char);
            }
            if seen.insert(w.clone()) {
                words.push(w);
            }
        }
        let mut acc = 0.0;
        let mut cdf: Vec<f64> = (1..=words.len())
            .map(|r| {
                acc += 1.0 / r as f64;
                acc
            })
            .collect();
        cdf.iter_mut().for_each(|c| *c /= acc);
        SyntheticLanguage { words, cdf }
    }

    fn word(&self, rng: &mut ChaCha8Rng) -> &str {
        let u: f64 = rng.random();
        let i = self.cdf.partition_point(|&c| c < u);
        &self.words[i.min(self.words.len() - 1)]
    }

    /// Exactly `n` bytes of sentences: words separated by spaces, a period every 6–14 words,
    /// ending in a space (so that a needle placed at the end starts a word).
    fn text(&self, rng: &mut ChaCha8Rng, n: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(n + 16);
        let mut left = rng.random_range(6..=14);
        while out.len() < n {
            out.extend_from_slice(self.word(rng).as_bytes());
            left -= 1;
            if left == 0 {
                out.push(b'.');
                left = rng.random_range(6..=14);
            }
            out.push(b' ');
        }
        out.truncate(n.saturating_sub(1));
        if n > 0 {
            out.push(b' ');
        }
        out
    }
}

/// Which bytes of a needle episode the training loss is on (the others are `IGNORE`d).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NeedleLoss {
    /// the answer digits of every query
    Answers,
    /// every byte after the haystack: the queries and their answers
    QueriesAndAnswers,
    /// every byte
    Everything,
}

impl NeedleLoss {
    pub const ALL: [NeedleLoss; 3] = [
        NeedleLoss::Answers,
        NeedleLoss::QueriesAndAnswers,
        NeedleLoss::Everything,
    ];

    /// The name `--needle-loss` takes.
    pub fn as_str(self) -> &'static str {
        match self {
            NeedleLoss::Answers => "answers",
            NeedleLoss::QueriesAndAnswers => "queries",
            NeedleLoss::Everything => "everything",
        }
    }

    /// In words, for reports.
    pub fn describe(self) -> &'static str {
        match self {
            NeedleLoss::Answers => "the answers",
            NeedleLoss::QueriesAndAnswers => "the queries and answers",
            NeedleLoss::Everything => "every byte",
        }
    }
}

impl std::str::FromStr for NeedleLoss {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        NeedleLoss::ALL
            .into_iter()
            .find(|l| l.as_str() == s)
            .ok_or_else(|| format!("unknown needle loss `{s}` (answers, queries or everything)"))
    }
}

/// Where the haystack's filler comes from.
#[derive(Clone, Debug)]
pub enum Filler {
    Synthetic(SyntheticLanguage),
    /// consecutive bytes of a text, from a seeded random offset
    Text(Arc<Vec<u8>>),
}

impl Filler {
    fn bytes(&self, rng: &mut ChaCha8Rng, n: usize) -> Result<Vec<u8>> {
        match self {
            Filler::Synthetic(lang) => Ok(lang.text(rng, n)),
            Filler::Text(text) => {
                if text.len() < n {
                    return Err(Error::Invalid(format!(
                        "the filler text has {} bytes, fewer than the {n} a haystack needs",
                        text.len()
                    )));
                }
                let start = rng.random_range(0..=text.len() - n);
                Ok(text[start..start + n].to_vec())
            }
        }
    }
}

/// The task: N needles per haystack, R of them queried, NUMBERs of `digits` digits, and the
/// filler.
#[derive(Clone, Debug)]
pub struct NeedleTask {
    pub needles: usize,
    /// R ≤ N
    pub queries: usize,
    pub digits: usize,
    pub filler: Filler,
    /// A tokenizer other than bytes (a model's `tokenizer.json`) to tokenize episodes with;
    /// None: byte-level.
    pub tokenizer: Option<Arc<Tokenizer>>,
}

/// One episode: T + 1 byte tokens; the model reads `tokens[..T]` and predicts `tokens[1..]`.
#[derive(Clone, Debug, PartialEq)]
pub struct Episode {
    pub tokens: Vec<u32>,
    /// the haystack is `tokens[..context]`; the query starts at `context`
    pub context: usize,
    /// the queried needle's sentence "the magic number of CITY is NUMBER." (no trailing space)
    pub needle: Range<usize>,
    /// the queried NUMBER inside the needle
    pub number: Range<usize>,
    /// the answer digits of the needle at the depth (after the first query)
    pub answer: Range<usize>,
    /// the answer digits of all R queries; `answers[0] == answer`
    pub answers: Vec<Range<usize>>,
    /// the city of the needle at the depth
    pub city: &'static str,
    /// filler bytes before the queried needle, and in the whole haystack
    pub filler_before: usize,
    pub filler_len: usize,
}

impl Episode {
    /// The depth actually realised: the fraction of the filler before the queried needle.
    pub fn depth(&self) -> f64 {
        if self.filler_len == 0 {
            0.0
        } else {
            self.filler_before as f64 / self.filler_len as f64
        }
    }

    /// Input positions whose next token is a digit of the depth needle's answer.
    pub fn answer_queries(&self) -> Range<usize> {
        self.answer.start - 1..self.answer.end - 1
    }

    /// Targets that train on the answer digits of all R queries only: `tokens[1..]` with
    /// every other position `IGNORE`.
    pub fn answer_targets(&self) -> Vec<u32> {
        let mut y = vec![IGNORE; self.tokens.len() - 1];
        for a in &self.answers {
            for p in a.clone() {
                y[p - 1] = self.tokens[p];
            }
        }
        y
    }

    /// Targets that train on the queries and answers (every byte after the haystack):
    /// `tokens[1..]` with the haystack's positions `IGNORE`.
    pub fn query_targets(&self) -> Vec<u32> {
        let mut y = self.tokens[1..].to_vec();
        y[..self.context].fill(IGNORE);
        y
    }

    /// The targets of `loss`.
    pub fn targets(&self, loss: NeedleLoss) -> Vec<u32> {
        match loss {
            NeedleLoss::Answers => self.answer_targets(),
            NeedleLoss::QueriesAndAnswers => self.query_targets(),
            NeedleLoss::Everything => self.tokens[1..].to_vec(),
        }
    }
}

/// A training batch: `b` fresh episodes of `t` input tokens, each with its queried needle at
/// a uniform random depth, written into `x[..b·t]` (inputs) and `y[..b·t]` (the targets of
/// `loss`). Everything is drawn from `rng`, so the batch depends only on its state.
pub fn fill_rows(
    task: &NeedleTask,
    loss: NeedleLoss,
    rng: &mut ChaCha8Rng,
    (x, y): (&mut [u32], &mut [u32]),
    b: usize,
    t: usize,
) -> Result<()> {
    for r in 0..b {
        let depth: f64 = rng.random();
        let e = task.episode(rng, t, depth)?;
        x[r * t..(r + 1) * t].copy_from_slice(&e.tokens[..t]);
        y[r * t..(r + 1) * t].copy_from_slice(&e.targets(loss));
    }
    Ok(())
}

fn needle_text(city: &str, number: &str) -> String {
    format!("the magic number of {city} is {number}. ")
}

fn query_text(city: &str) -> String {
    format!("\nwhat is the magic number of {city}? ")
}

/// The first word boundary at or after `o` in `filler` (0, just after a space, or the end).
fn snap(filler: &[u8], o: usize) -> usize {
    (o..filler.len())
        .find(|&i| i == 0 || filler[i - 1] == b' ')
        .unwrap_or(filler.len())
}

/// Where the queried needle landed in a haystack: its sentence, its number, and the filler
/// bytes before it.
struct Placed {
    needle: Range<usize>,
    number: Range<usize>,
    filler_before: usize,
}

/// Insertion points (filler offset, tie rank, needle) of `n` needles in `filler`, sorted: needle
/// 0 at `depth`, the others at seeded random depths, each snapped to a word boundary. At a tie
/// the queried needle goes first for depths up to one half and last beyond, so that 0% and
/// 100% are the haystack's ends.
fn insertion_points(
    rng: &mut ChaCha8Rng,
    filler: &[u8],
    depth: f64,
    n: usize,
) -> Vec<(usize, u8, usize)> {
    let f = filler.len();
    let others: Vec<usize> = (1..n).map(|_| rng.random_range(0..=f)).collect();
    place_points(filler, depth, &others)
}

/// `insertion_points` with the other needles' offsets given.
fn place_points(filler: &[u8], depth: f64, others: &[usize]) -> Vec<(usize, u8, usize)> {
    let f = filler.len();
    let answer_rank = if depth <= 0.5 { 0 } else { 2 };
    let mut points: Vec<(usize, u8, usize)> = vec![(
        snap(filler, (depth * f as f64).round() as usize),
        answer_rank,
        0,
    )];
    for (i, &o) in others.iter().enumerate() {
        points.push((snap(filler, o.min(f)), 1, i + 1));
    }
    points.sort();
    points
}

impl NeedleTask {
    /// A task with filler from the synthetic language of `language_seed` (200 words).
    pub fn synthetic(needles: usize, queries: usize, digits: usize, language_seed: u64) -> Self {
        NeedleTask {
            needles,
            queries,
            digits,
            filler: Filler::Synthetic(SyntheticLanguage::new(language_seed, 200)),
            tokenizer: None,
        }
    }

    /// The fewest input tokens an episode can have (no filler, the longest city names).
    pub fn min_len(&self) -> usize {
        let longest = CITIES.iter().map(|c| c.len()).max().unwrap_or(0);
        let number = "0".repeat(self.digits);
        let lc = "x".repeat(longest);
        self.needles * needle_text(&lc, &number).len()
            + self.queries * (query_text(&lc).len() + self.digits)
    }

    /// Checks N, R and the digits, naming the first that is out of range.
    pub fn validate(&self) -> Result<()> {
        if self.needles == 0 || self.needles > CITIES.len() {
            return Err(Error::Invalid(format!(
                "needles ({}) must be between 1 and {}",
                self.needles,
                CITIES.len()
            )));
        }
        if self.digits == 0 || self.digits > 9 {
            return Err(Error::Invalid(format!(
                "digits ({}) must be between 1 and 9",
                self.digits
            )));
        }
        if self.queries == 0 || self.queries > self.needles {
            return Err(Error::Invalid(format!(
                "queries ({}) must be between 1 and the number of needles ({})",
                self.queries, self.needles
            )));
        }
        Ok(())
    }

    /// An episode of `t` input tokens with the queried needle at `depth` ∈ [0, 1]: bytes, or
    /// under the task's `tokenizer` the same text tokenized whole (`tokenized.rs`).
    pub fn episode(&self, rng: &mut ChaCha8Rng, t: usize, depth: f64) -> Result<Episode> {
        match self.tokenizer.as_deref() {
            Some(tok) if tok.file().is_some() => self.episode_tokenized(tok, rng, t, depth),
            _ => self.episode_bytes(rng, t, depth),
        }
    }

    /// The byte-level episode: exactly t + 1 bytes.
    fn episode_bytes(&self, rng: &mut ChaCha8Rng, t: usize, depth: f64) -> Result<Episode> {
        self.validate()?;
        if !(0.0..=1.0).contains(&depth) {
            return Err(Error::Invalid(format!("depth {depth} is outside [0, 1]")));
        }
        let n = self.needles;
        let (cities, numbers) = self.draw_needles(rng);
        let needles: Vec<String> = (0..n)
            .map(|i| needle_text(cities[i], &numbers[i]))
            .collect();
        let queries: Vec<String> = (0..self.queries).map(|i| query_text(cities[i])).collect();
        let fixed = needles.iter().map(|s| s.len()).sum::<usize>()
            + queries.iter().map(|q| q.len() + self.digits).sum::<usize>()
            + 1;
        let total = t + 1;
        if total < fixed {
            return Err(Error::Invalid(format!(
                "a window of {t} tokens cannot hold {n} needles of {} digits and the query (this episode needs at least {} tokens)",
                self.digits,
                fixed - 1
            )));
        }
        let filler = self.filler.bytes(rng, total - fixed)?;
        let f = filler.len();
        let points = insertion_points(rng, &filler, depth, n);
        let mut bytes: Vec<u8> = Vec::with_capacity(total);
        let hay = self.haystack(&mut bytes, &filler, &points, &needles);
        let context = bytes.len();
        let mut answers = Vec::with_capacity(self.queries);
        for (q, number) in queries.iter().zip(&numbers) {
            bytes.extend_from_slice(q.as_bytes());
            answers.push(bytes.len()..bytes.len() + self.digits);
            bytes.extend_from_slice(number.as_bytes());
        }
        bytes.push(b'\n');
        debug_assert_eq!(bytes.len(), total);
        Ok(Episode {
            tokens: bytes.into_iter().map(u32::from).collect(),
            context,
            needle: hay.needle,
            number: hay.number,
            answer: answers[0].clone(),
            answers,
            city: cities[0],
            filler_before: hay.filler_before,
            filler_len: f,
        })
    }

    /// N distinct cities (partial Fisher–Yates) and N distinct numbers of `digits` digits;
    /// needle 0 is the queried one.
    fn draw_needles(&self, rng: &mut ChaCha8Rng) -> (Vec<&'static str>, Vec<String>) {
        let n = self.needles;
        let mut idx: Vec<usize> = (0..CITIES.len()).collect();
        for i in 0..n {
            let j = rng.random_range(i..idx.len());
            idx.swap(i, j);
        }
        let cities: Vec<&'static str> = idx[..n].iter().map(|&i| CITIES[i]).collect();
        let mut numbers: Vec<String> = Vec::with_capacity(n);
        while numbers.len() < n {
            let mut s = String::with_capacity(self.digits);
            s.push((b'1' + rng.random_range(0..9u8)) as char);
            for _ in 1..self.digits {
                s.push((b'0' + rng.random_range(0..10u8)) as char);
            }
            if !numbers.contains(&s) {
                numbers.push(s);
            }
        }
        (cities, numbers)
    }

    /// Appends the filler with the needles inserted at `points` (sorted, from
    /// `insertion_points`) to `bytes`; says where the queried needle landed.
    fn haystack(
        &self,
        bytes: &mut Vec<u8>,
        filler: &[u8],
        points: &[(usize, u8, usize)],
        needles: &[String],
    ) -> Placed {
        let (mut at, mut placed) = (
            0,
            Placed {
                needle: 0..0,
                number: 0..0,
                filler_before: 0,
            },
        );
        for &(o, _, i) in points {
            bytes.extend_from_slice(&filler[at..o]);
            at = o;
            if i == 0 {
                let start = bytes.len();
                let text = &needles[0];
                placed.needle = start..start + text.len() - 1;
                let num_at = start + text.len() - 2 - self.digits;
                placed.number = num_at..num_at + self.digits;
                placed.filler_before = o;
            }
            bytes.extend_from_slice(needles[i].as_bytes());
        }
        bytes.extend_from_slice(&filler[at..]);
        placed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(e: &Episode, r: Range<usize>) -> String {
        e.tokens[r].iter().map(|&b| b as u8 as char).collect()
    }

    fn hay_count(e: &Episode, s: &str) -> usize {
        text(e, 0..e.context).matches(s).count()
    }

    #[test]
    fn the_queried_needle_sits_at_its_depth_and_holds_the_answer() {
        let task = NeedleTask::synthetic(4, 2, 4, 7);
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        for &depth in &DEPTHS {
            for _ in 0..20 {
                let e = task.episode(&mut rng, 400, depth).unwrap();
                assert_eq!(e.tokens.len(), 401);
                // the needle starts within one word (at most 7 bytes) after its depth
                let want = (depth * e.filler_len as f64).round() as usize;
                assert!(
                    e.filler_before >= want && e.filler_before <= want + 7,
                    "depth {depth}: {} of {}",
                    e.filler_before,
                    e.filler_len
                );
                if depth == 0.0 {
                    assert_eq!(e.needle.start, 0);
                }
                if depth == 1.0 {
                    // the last thing before the query is the queried needle and its space
                    assert_eq!(e.needle.end + 1, e.context);
                }
                let needle = text(&e, e.needle.clone());
                let number = text(&e, e.number.clone());
                assert_eq!(
                    needle,
                    format!("the magic number of {} is {number}.", e.city)
                );
                assert_eq!(text(&e, e.answer.clone()), number);
                assert_eq!(
                    text(&e, e.context..e.answer.start),
                    format!("\nwhat is the magic number of {}? ", e.city)
                );
                // the second query asks another needle of the haystack, right after the first
                assert_eq!(e.answers.len(), 2);
                let second = text(&e, e.answer.end..e.answers[1].start);
                let other = second.trim_start_matches("\nwhat is the magic number of ");
                let city = other.trim_end_matches("? ");
                assert_ne!(city, e.city);
                let n2 = text(&e, e.answers[1].clone());
                assert_eq!(hay_count(&e, &format!("number of {city} is {n2}.")), 1);
                // answer-only targets: exactly the 2 × 4 answer digits count
                let y = e.answer_targets();
                let kept: Vec<usize> = (0..y.len()).filter(|&i| y[i] != IGNORE).collect();
                assert_eq!(kept.len(), 8);
                assert!(kept.iter().all(|&i| y[i] == e.tokens[i + 1]));
                assert_eq!(kept[0], e.answer.start - 1);
                assert_eq!(e.tokens[400], b'\n' as u32);
                // the city is named by exactly one needle in the haystack
                let hay = text(&e, 0..e.context);
                assert_eq!(hay.matches("the magic number of ").count(), 4);
                assert_eq!(hay.matches(&format!("number of {} is", e.city)).count(), 1);
                assert_eq!(e.answer_queries(), e.answer.start - 1..e.answer.end - 1);
            }
        }
    }

    #[test]
    fn episodes_are_determined_by_the_seed() {
        let task = NeedleTask::synthetic(3, 1, 3, 1);
        let make = |seed| {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            (0..5)
                .map(|i| task.episode(&mut rng, 256, DEPTHS[i]).unwrap())
                .collect::<Vec<_>>()
        };
        assert_eq!(make(11), make(11));
        assert_ne!(make(11), make(12));
        // a different language seed changes the filler, not the layout rules
        let other = NeedleTask::synthetic(3, 1, 3, 2);
        let mut r1 = ChaCha8Rng::seed_from_u64(11);
        let e = other.episode(&mut r1, 256, 0.5).unwrap();
        assert_ne!(e.tokens, make(11)[2].tokens);
    }

    #[test]
    fn a_window_too_short_for_the_needles_is_named() {
        let task = NeedleTask::synthetic(6, 2, 4, 1);
        let mut rng = ChaCha8Rng::seed_from_u64(0);
        let e = task.episode(&mut rng, 100, 0.5).unwrap_err().to_string();
        assert!(
            e.contains("window of 100 tokens") && e.contains("6 needles"),
            "{e}"
        );
        assert!(task.min_len() > 100);
        // min_len always fits, whatever cities are drawn
        for _ in 0..50 {
            task.episode(&mut rng, task.min_len(), 1.0).unwrap();
        }
    }

    #[test]
    fn text_filler_is_a_slice_of_the_text() {
        let src: Vec<u8> = b"one two three four five six seven eight nine ten ".repeat(20);
        let task = NeedleTask {
            needles: 2,
            queries: 1,
            digits: 3,
            filler: Filler::Text(Arc::new(src.clone())),
            tokenizer: None,
        };
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        for depth in DEPTHS {
            let e = task.episode(&mut rng, 200, depth).unwrap();
            // the haystack without its needles is one contiguous slice of the text
            let mut hay = text(&e, 0..e.context);
            while let Some(a) = hay.find("the magic number of ") {
                let b = a + hay[a..].find(". ").unwrap() + 2;
                hay.replace_range(a..b, "");
            }
            assert_eq!(hay.len(), e.filler_len);
            assert!(src.windows(hay.len()).any(|w| w == hay.as_bytes()), "{hay}");
        }
    }
}
