//! Needle episodes under a model's own tokenizer (BPE): the text of a byte-level episode,
//! tokenized whole, so that the model reads its haystack, needles and queries as it reads any
//! text. Tokens are not bytes, so the filler's length is searched for: the longest stretch
//! whose episode fits in t + 1 tokens. What is left is padded after the last answer, where
//! nothing that is scored can see it.

use super::{
    needle_text, place_points, query_text, Episode, Filler, NeedleTask, SyntheticLanguage,
};
use crate::data::tokenizer::Tokenizer;
use crate::error::{Error, Result};
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use std::ops::Range;

/// At most this many bytes of filler per token an episode may hold: more than any English
/// BPE token's length, so the filler drawn always suffices unless its text is short.
const BYTES_PER_TOKEN: usize = 16;

/// An episode's text and where its parts lie, in bytes.
struct Text {
    text: String,
    needle: Range<usize>,
    number: Range<usize>,
    query: usize,
    answers: Vec<Range<usize>>,
    filler_before: usize,
    filler_len: usize,
}

impl NeedleTask {
    /// The episode of `episode` under `tok`: at most t + 1 tokens of text, padded to t + 1
    /// with its last token; ranges in tokens (the tokens that cover the bytes).
    pub(super) fn episode_tokenized(
        &self,
        tok: &Tokenizer,
        rng: &mut ChaCha8Rng,
        t: usize,
        depth: f64,
    ) -> Result<Episode> {
        // 1. The needles, the filler to draw from, the other needles' depths
        self.validate()?;
        if !(0.0..=1.0).contains(&depth) {
            return Err(Error::Invalid(format!("depth {depth} is outside [0, 1]")));
        }
        let (cities, numbers) = self.draw_needles(rng);
        let source = filler_source(&self.filler, rng, (t + 1) * BYTES_PER_TOKEN)?;
        let others: Vec<f64> = (1..self.needles).map(|_| rng.random()).collect();
        let build = |f: usize| {
            let filler = word_prefix(&source, f);
            let text = self.assemble(filler, depth, &others, &cities, &numbers);
            let (ids, offsets) = tok.encode_offsets(&text.text)?;
            Ok::<_, Error>((text, ids, offsets))
        };
        // 2. The longest filler whose episode fits: bisect over its length in bytes
        let total = t + 1;
        let (mut lo, mut hi) = (0, source.len());
        let mut best = build(0)?;
        if best.1.len() > total {
            return Err(Error::Invalid(format!(
                "a window of {t} tokens cannot hold {} needles of {} digits and the query (this episode needs {} tokens)",
                self.needles,
                self.digits,
                best.1.len() - 1
            )));
        }
        let whole = build(hi)?;
        if whole.1.len() <= total {
            return Err(Error::Invalid(format!(
                "the filler has {} bytes, too few for a haystack of {t} tokens",
                source.len()
            )));
        }
        while hi - lo > 1 && best.1.len() < total {
            let mid = lo + (hi - lo) / 2;
            let tried = build(mid)?;
            if tried.1.len() <= total {
                (lo, best) = (mid, tried);
            } else {
                hi = mid;
            }
        }
        // 3. Byte ranges to token ranges; pad to t + 1
        let (text, mut ids, offsets) = best;
        let tokens_of = |r: &Range<usize>| covering(&offsets, r);
        let answers: Vec<Range<usize>> = text.answers.iter().map(tokens_of).collect();
        let context = offsets
            .iter()
            .position(|&(_, end)| end > text.query)
            .unwrap_or(ids.len());
        let last = *ids.last().expect("an episode has tokens");
        ids.resize(total, last);
        Ok(Episode {
            tokens: ids,
            context,
            needle: tokens_of(&text.needle),
            number: tokens_of(&text.number),
            answer: answers[0].clone(),
            answers,
            city: cities[0],
            filler_before: text.filler_before,
            filler_len: text.filler_len,
        })
    }

    /// The episode's text over `filler`, as the byte-level episode lays it out.
    fn assemble(
        &self,
        filler: &str,
        depth: f64,
        others: &[f64],
        cities: &[&'static str],
        numbers: &[String],
    ) -> Text {
        let f = filler.len();
        let offsets: Vec<usize> = others.iter().map(|u| (u * f as f64) as usize).collect();
        let points = place_points(filler.as_bytes(), depth, &offsets);
        let needles: Vec<String> = (0..self.needles)
            .map(|i| needle_text(cities[i], &numbers[i]))
            .collect();
        let mut bytes = Vec::with_capacity(f + 64 * self.needles);
        let placed = self.haystack(&mut bytes, filler.as_bytes(), &points, &needles);
        let query = bytes.len();
        let mut answers = Vec::with_capacity(self.queries);
        for i in 0..self.queries {
            bytes.extend_from_slice(query_text(cities[i]).as_bytes());
            answers.push(bytes.len()..bytes.len() + self.digits);
            bytes.extend_from_slice(numbers[i].as_bytes());
        }
        bytes.push(b'\n');
        Text {
            // filler cut at spaces, needles and queries ASCII: whole characters
            text: String::from_utf8(bytes).expect("an episode of whole characters"),
            needle: placed.needle,
            number: placed.number,
            query,
            answers,
            filler_before: placed.filler_before,
            filler_len: f,
        }
    }
}

/// Up to `cap` bytes of filler text, from the first word boundary of a seeded stretch (so
/// that it starts on a whole character).
fn filler_source(filler: &Filler, rng: &mut ChaCha8Rng, cap: usize) -> Result<String> {
    let bytes = match filler {
        Filler::Synthetic(lang) => SyntheticLanguage::text(lang, rng, cap),
        Filler::Text(text) => {
            let n = cap.min(text.len());
            let start = rng.random_range(0..=text.len() - n);
            text[start..start + n].to_vec()
        }
    };
    let from = bytes
        .iter()
        .position(|&b| b == b' ')
        .map_or(bytes.len(), |p| p + 1);
    Ok(String::from_utf8_lossy(&bytes[from..]).into_owned())
}

/// The longest prefix of `text` of at most `n` bytes that ends after a space (a word
/// boundary, as the synthetic filler does); all of it when `n` covers it.
fn word_prefix(text: &str, n: usize) -> &str {
    if n >= text.len() {
        return text;
    }
    let cut = text.as_bytes()[..n]
        .iter()
        .rposition(|&b| b == b' ')
        .map_or(0, |p| p + 1);
    &text[..cut]
}

/// The tokens whose bytes meet `bytes`: the first through the last.
fn covering(offsets: &[(usize, usize)], bytes: &Range<usize>) -> Range<usize> {
    let first = offsets
        .iter()
        .position(|&(a, b)| b > bytes.start && a < bytes.end);
    let last = offsets
        .iter()
        .rposition(|&(a, b)| b > bytes.start && a < bytes.end);
    match (first, last) {
        (Some(f), Some(l)) => f..l + 1,
        _ => 0..0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use std::sync::Arc;

    fn bpe() -> Arc<Tokenizer> {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/hf/llama_gqa/tokenizer.json"
        );
        Arc::new(Tokenizer::from_file(std::path::Path::new(path)).unwrap())
    }

    /// Under a BPE tokenizer an episode is t + 1 tokens, nearly all of them text (the filler
    /// as long as fits), and its ranges cover what they name: the answers decode to the
    /// numbers, the needle to its sentence, the context ends where the query starts.
    #[test]
    fn a_bpe_episode_fits_its_window_and_its_ranges_hold_their_text() {
        let tok = bpe();
        let mut task = NeedleTask::synthetic(6, 2, 3, 4);
        task.tokenizer = Some(tok.clone());
        let mut rng = ChaCha8Rng::seed_from_u64(9);
        for &depth in &super::super::DEPTHS {
            for t in [200, 701] {
                let e = task.episode(&mut rng, t, depth).unwrap();
                assert_eq!(e.tokens.len(), t + 1);
                let dec = |r: &Range<usize>| tok.decode(&e.tokens[r.clone()]).unwrap();
                let number = dec(&e.number).trim().trim_end_matches('.').to_string();
                assert_eq!(number.len(), 3, "{number:?}");
                assert_eq!(dec(&e.answer).trim(), number);
                assert!(dec(&e.needle).contains(&format!("magic number of {}", e.city)));
                let query = dec(&(e.context..e.answer.start));
                assert!(query.contains(&format!("what is the magic number of {}?", e.city)));
                assert_eq!(e.answers.len(), 2);
                assert!(e.answers[0].end <= e.answers[1].start);
                // padding is a few tokens at most: the filler search got close
                let text = tok.decode(&e.tokens).unwrap();
                let real = tok.encode(text.trim_end_matches('\n')).unwrap().len() + 1;
                assert!(real + 8 > t, "{real} of {}", t + 1);
                let want = (depth * e.filler_len as f64).round() as usize;
                assert!(e.filler_before >= want && e.filler_before <= want + 12);
            }
        }
        // the byte path is untouched by a byte-level tokenizer
        let mut bytes = NeedleTask::synthetic(2, 1, 2, 4);
        let plain = bytes
            .episode(&mut ChaCha8Rng::seed_from_u64(1), 160, 0.5)
            .unwrap();
        bytes.tokenizer = Some(Arc::new(Tokenizer::Bytes));
        let same = bytes
            .episode(&mut ChaCha8Rng::seed_from_u64(1), 160, 0.5)
            .unwrap();
        assert_eq!(plain, same);
    }

    /// Too short a window, or filler text too short for one haystack: one error each.
    #[test]
    fn a_bpe_episode_names_what_does_not_fit() {
        let mut task = NeedleTask::synthetic(6, 2, 4, 1);
        task.tokenizer = Some(bpe());
        let mut rng = ChaCha8Rng::seed_from_u64(0);
        let e = task.episode(&mut rng, 20, 0.5).unwrap_err().to_string();
        assert!(e.contains("window of 20 tokens"), "{e}");
        task.filler = Filler::Text(Arc::new(b"just a few words of text here ".to_vec()));
        let e = task.episode(&mut rng, 400, 0.5).unwrap_err().to_string();
        assert!(e.contains("too few for a haystack of 400 tokens"), "{e}");
    }
}
