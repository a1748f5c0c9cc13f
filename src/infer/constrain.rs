//! The constraint a sequence's sampler applies: any JSON object (JSON mode) or JSON valid
//! under a schema, over the vocabulary's bytes (`json.rs`, `json_schema.rs`).

use super::json::JsonMachine;
use super::json_schema::{Schema, SchemaMachine};
use std::sync::Arc;

/// JSON mode or a schema's for one sequence: the automaton after the tokens so far, and the
/// vocabulary's bytes (`None`: a special token, never allowed).
#[derive(Clone)]
pub struct JsonConstraint {
    grammar: Grammar,
    vocab: Arc<Vec<Option<Vec<u8>>>>,
}

/// Any JSON object (JSON mode), or JSON that validates against a schema.
#[derive(Clone)]
enum Grammar {
    Object(JsonMachine),
    Schema(Box<SchemaMachine>, Arc<Schema>),
}

impl JsonConstraint {
    /// At the start of the text, over a vocabulary of these tokens' bytes: any JSON object.
    pub fn new(vocab: Arc<Vec<Option<Vec<u8>>>>) -> Self {
        JsonConstraint {
            grammar: Grammar::Object(JsonMachine::default()),
            vocab,
        }
    }

    /// At the start of the text: JSON that validates against `schema`.
    pub fn with_schema(vocab: Arc<Vec<Option<Vec<u8>>>>, schema: Arc<Schema>) -> Self {
        JsonConstraint {
            grammar: Grammar::Schema(Box::default(), schema),
            vocab,
        }
    }

    /// Whether the object has closed (the sequence is over).
    pub fn done(&self) -> bool {
        match &self.grammar {
            Grammar::Object(m) => m.done(),
            Grammar::Schema(m, _) => m.done(),
        }
    }

    /// `row` with every token that would leave JSON set to −∞, in `out`; with `left` tokens of
    /// budget (this one included), also every token after which the object could no longer
    /// close in the `left − 1` tokens after it (at a byte a token). So the object always
    /// closes in time where the vocabulary has the closing bytes as single tokens (byte-level
    /// and byte-level BPE vocabularies do); where it has not, the budget is not enforced.
    pub fn mask<'a>(&self, row: &[f32], left: usize, out: &'a mut Vec<f32>) -> &'a [f32] {
        match &self.grammar {
            Grammar::Object(m0) => self.mask_by(row, left, out, |bytes| {
                let mut m = *m0;
                m.feed(bytes).then(|| m.to_close())
            }),
            Grammar::Schema(m0, s) => self.mask_by(row, left, out, |bytes| {
                let mut m = **m0;
                m.feed(s, bytes).then(|| m.to_close(s))
            }),
        }
    }

    /// `mask` over `after`: the bytes that close the text after a token's, None where the
    /// token leaves the grammar.
    fn mask_by<'a>(
        &self,
        row: &[f32],
        left: usize,
        out: &'a mut Vec<f32>,
        after: impl Fn(&[u8]) -> Option<usize>,
    ) -> &'a [f32] {
        out.clear();
        out.resize(row.len(), f32::NEG_INFINITY);
        // the second pass, without the budget, runs only where the first kept nothing
        for budget in [true, false] {
            let mut any = false;
            for (t, bytes) in self.vocab.iter().enumerate().take(row.len()) {
                let Some(bytes) = bytes.as_deref().filter(|b| !b.is_empty()) else {
                    continue;
                };
                if after(bytes).is_some_and(|c| !budget || c < left) {
                    out[t] = row[t];
                    any = true;
                }
            }
            if any {
                break;
            }
        }
        out
    }

    /// Takes the token drawn.
    pub fn advance(&mut self, token: u32) {
        if let Some(Some(bytes)) = self.vocab.get(token as usize) {
            match &mut self.grammar {
                Grammar::Object(m) => m.feed(bytes),
                Grammar::Schema(m, s) => m.feed(s, bytes),
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Masked draws over a byte vocabulary always give an object, closed within the budget.
    #[test]
    fn masked_random_draws_always_close_within_the_budget() {
        let vocab: Vec<Option<Vec<u8>>> = (0..=255u8).map(|b| Some(vec![b])).collect();
        let vocab = Arc::new(vocab);
        let mut state = 12345u64;
        for budget in [2, 5, 16, 40] {
            for _ in 0..50 {
                let mut c = JsonConstraint::new(vocab.clone());
                let (mut out, mut text) = (Vec::new(), Vec::new());
                for left in (1..=budget).rev() {
                    let row = vec![0.0; 256];
                    let allowed: Vec<u32> = c
                        .mask(&row, left, &mut out)
                        .iter()
                        .enumerate()
                        .filter(|(_, v)| v.is_finite())
                        .map(|(t, _)| t as u32)
                        .collect();
                    state = state
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let t = allowed[(state >> 33) as usize % allowed.len()];
                    c.advance(t);
                    text.push(t as u8);
                    if c.done() {
                        break;
                    }
                }
                assert!(
                    c.done(),
                    "budget {budget}: {}",
                    String::from_utf8_lossy(&text)
                );
                let v: serde_json::Value = serde_json::from_slice(&text).unwrap();
                assert!(v.is_object());
            }
        }
    }
}
