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
    /// the scored tokens (the prompt's, echoed, then the generated ones)
    rows: Vec<Row>,
    pub finish: Option<&'static str>,
    pub error: Option<String>,
    /// rows and characters already streamed
    rows_sent: usize,
    chars_sent: usize,
}

/// One scored token: its text and bytes, its log-probability (None for the first prompt
/// token, which nothing predicts) and the most likely tokens in its place.
struct Row {
    text: String,
    bytes: Option<Vec<u8>>,
    logprob: Option<f32>,
    /// (text, bytes, log-probability), most likely first
    top: Vec<(String, Option<Vec<u8>>, f32)>,
}

impl Row {
    fn new(tok: &Tokenizer, id: u32, score: Option<&TokenScore>) -> Row {
        let top = score.map_or(Vec::new(), |s| {
            let top = s
                .top
                .iter()
                .map(|&(t, lp)| (piece(tok, t), tok.token_bytes(t), lp));
            top.collect()
        });
        Row {
            text: piece(tok, id),
            bytes: tok.token_bytes(id),
            logprob: score.map(|s| s.logprob),
            top,
        }
    }
}

impl Choice {
    /// A choice whose echoed prompt is `prompt` (its first token is unscored).
    pub fn new(tok: &Tokenizer, prompt: &[u32], echo_rows: bool) -> Self {
        let rows = if echo_rows {
            vec![Row::new(tok, prompt[0], None)]
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
                for (i, s) in scores.iter().enumerate() {
                    self.rows.push(Row::new(tok, prompt[at + i], Some(s)));
                }
            }
            Event::Token(id, score) => {
                self.generated += 1;
                if let Some(s) = score {
                    self.rows.push(Row::new(tok, id, Some(&s)));
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

    /// Log-probability rows from `from` on, in the legacy shape (`/v1/completions`), with text
    /// offsets counted in characters from `offset`; each row's alternatives as a dict by text,
    /// the likelier first where two decode alike.
    pub fn logprobs(&self, from: usize, mut offset: usize) -> Value {
        let (mut tokens, mut lps, mut tops, mut offs) = (vec![], vec![], vec![], vec![]);
        for r in &self.rows[from.min(self.rows.len())..] {
            tokens.push(json!(r.text));
            lps.push(json!(r.logprob));
            tops.push(match r.logprob {
                None => Value::Null,
                Some(_) => {
                    let mut m = Map::new();
                    for (t, _, lp) in &r.top {
                        m.entry(t.clone()).or_insert(json!(lp));
                    }
                    Value::Object(m)
                }
            });
            offs.push(json!(offset));
            offset += r.text.chars().count();
        }
        json!({"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offs})
    }

    /// Log-probability rows from `from` on, in the chat shape (`/v1/chat/completions`):
    /// `{"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob",
    /// "bytes"}, …]}, …]}`.
    pub fn chat_logprobs(&self, from: usize) -> Value {
        let entry =
            |t: &str, b: &Option<Vec<u8>>, lp: f32| json!({"token": t, "logprob": lp, "bytes": b});
        let content: Vec<Value> = self.rows[from.min(self.rows.len())..]
            .iter()
            .map(|r| {
                let mut e = entry(&r.text, &r.bytes, r.logprob.unwrap_or(f32::NAN));
                e["top_logprobs"] = r.top.iter().map(|(t, b, lp)| entry(t, b, *lp)).collect();
                e
            })
            .collect();
        json!({ "content": content })
    }

    /// The rows not streamed yet, in the legacy shape with their offsets, or in the chat shape.
    pub fn fresh_logprobs(&mut self, chat: bool) -> Value {
        let v = match chat {
            true => self.chat_logprobs(self.rows_sent),
            false => self.logprobs(self.rows_sent, self.chars_sent),
        };
        for r in &self.rows[self.rows_sent..] {
            self.chars_sent += r.text.chars().count();
        }
        self.rows_sent = self.rows.len();
        v
    }
}

/// One token's text.
pub fn piece(tok: &Tokenizer, id: u32) -> String {
    tok.decode(&[id]).unwrap_or_default()
}
