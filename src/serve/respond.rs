//! One choice of an answer, built from the engine's events: its text (cut at a stop string),
//! its tokens and log-probabilities in the legacy completions shape, and its finish reason.
//! Streamed and whole answers are built by the same code, so they say the same.

use super::engine::{Event, TokenScore};
use crate::data::tokenizer::{TextStream, Tokenizer};
use serde_json::{json, Map, Value};

pub struct Choice {
    /// the generated text so far, cut at the first stop string
    pub text: String,
    /// how much of `text` has been handed out (streaming)
    emitted: usize,
    stream: TextStream,
    pub generated: usize,
    /// legacy logprobs rows: token text, log-probability (None for the first prompt token),
    /// alternatives
    rows: Vec<(String, Option<f32>, Option<Value>)>,
    pub finish: Option<&'static str>,
    pub error: Option<String>,
    /// rows and characters already streamed
    rows_sent: usize,
    chars_sent: usize,
}

impl Choice {
    /// A choice whose echoed prompt is `prompt` (its first token is unscored).
    pub fn new(tok: &Tokenizer, prompt: &[u32], echo_rows: bool) -> Self {
        let rows = if echo_rows {
            vec![(piece(tok, prompt[0]), None, None)]
        } else {
            Vec::new()
        };
        Choice {
            text: String::new(),
            emitted: 0,
            stream: TextStream::default(),
            generated: 0,
            rows,
            finish: None,
            error: None,
            rows_sent: 0,
            chars_sent: 0,
        }
    }

    /// Takes one event; returns false once the choice is over (finished, stopped or failed).
    pub fn take(&mut self, ev: Event, tok: &Tokenizer, prompt: &[u32], stops: &[String]) -> bool {
        match ev {
            Event::Prompt(scores) => {
                let at = self.rows.len();
                for (i, s) in scores.into_iter().enumerate() {
                    let id = prompt[at + i];
                    self.rows
                        .push((piece(tok, id), Some(s.logprob), Some(top(tok, &s))));
                }
            }
            Event::Token(id, score) => {
                self.generated += 1;
                if let Some(s) = score {
                    self.rows
                        .push((piece(tok, id), Some(s.logprob), Some(top(tok, &s))));
                }
                let new = self.stream.push(tok, id).unwrap_or_default();
                self.text.push_str(&new);
                if self.cut_at_stop(stops, new.len()) {
                    self.finish = Some("stop");
                    return false;
                }
            }
            Event::Done(f) => {
                let rest = self.stream.finish(tok).unwrap_or_default();
                self.text.push_str(&rest);
                if !self.cut_at_stop(stops, rest.len()) {
                    self.finish = Some(f.as_str());
                } else {
                    self.finish = Some("stop");
                }
                return false;
            }
            Event::Failed(e) => {
                self.error = Some(e);
                return false;
            }
        }
        true
    }

    /// Cuts `text` before the first stop string, looking only where the last `added` bytes
    /// could complete one; true when it did.
    fn cut_at_stop(&mut self, stops: &[String], added: usize) -> bool {
        let longest = stops.iter().map(String::len).max().unwrap_or(0);
        let mut from = self.text.len().saturating_sub(added + longest);
        while !self.text.is_char_boundary(from) {
            from -= 1;
        }
        let hit = stops
            .iter()
            .filter_map(|s| self.text[from..].find(s.as_str()).map(|i| from + i))
            .min();
        if let Some(at) = hit {
            self.text.truncate(at);
            return true;
        }
        false
    }

    /// The text not yet handed out that can no longer turn into a stop string: a tail that
    /// begins some stop string is held back until the choice is over.
    pub fn next_piece(&mut self, stops: &[String]) -> String {
        let mut safe = self.text.len();
        if self.finish.is_none() && self.error.is_none() {
            for s in stops {
                for k in (1..s.len()).rev() {
                    if s.is_char_boundary(k) && self.text.ends_with(&s[..k]) {
                        safe = safe.min(self.text.len() - k);
                        break;
                    }
                }
            }
        }
        let safe = safe.max(self.emitted);
        let out = self.text[self.emitted..safe].to_string();
        self.emitted = safe;
        out
    }

    /// Log-probability rows from `from` on, in the legacy shape, with text offsets counted in
    /// characters from `offset`.
    pub fn logprobs(&self, from: usize, mut offset: usize) -> Value {
        let (mut tokens, mut lps, mut tops, mut offs) = (vec![], vec![], vec![], vec![]);
        for (t, lp, top) in &self.rows[from.min(self.rows.len())..] {
            tokens.push(json!(t));
            lps.push(json!(lp));
            tops.push(top.clone().unwrap_or(Value::Null));
            offs.push(json!(offset));
            offset += t.chars().count();
        }
        json!({"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offs})
    }

    /// The rows not streamed yet, with their offsets.
    pub fn fresh_logprobs(&mut self) -> Value {
        let v = self.logprobs(self.rows_sent, self.chars_sent);
        for (t, _, _) in &self.rows[self.rows_sent..] {
            self.chars_sent += t.chars().count();
        }
        self.rows_sent = self.rows.len();
        v
    }
}

/// One token's text.
pub fn piece(tok: &Tokenizer, id: u32) -> String {
    tok.decode(&[id]).unwrap_or_default()
}

fn top(tok: &Tokenizer, s: &TokenScore) -> Value {
    let mut m = Map::new();
    for &(id, lp) in &s.top {
        m.entry(piece(tok, id)).or_insert(json!(lp));
    }
    Value::Object(m)
}
