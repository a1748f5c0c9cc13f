//! Speculative decoding's drafts: a few tokens guessed cheaply, then verified by the model in
//! one forward pass (`generate`, the server's engine). Two sources:
//!
//! - prompt lookup: the tokens that followed the text's last tokens where they occurred
//!   before (`lookup_draft`), free to compute, good on text that repeats its context;
//! - a draft model: a smaller model with the same tokenizer, its greedy continuation. Each
//!   sequence keeps the draft model's KV cache of the text (`DraftState`), fed with the
//!   tokens accepted since its last draft.
//!
//! Either way the proposal is a function of the text so far (a draft is certain of its
//! token), so `sample::verify`'s rule for a certain proposal leaves the output distribution
//! the model's own; greedy, the text is plain decoding's token for token.

use crate::error::{Error, Result};
use crate::infer::sample::argmax;
use crate::model::{KvCache, Model, Workspace};

/// Prompt tokens a draft model takes in one pass while it catches up with the text.
pub const DRAFT_CHUNK: usize = 256;

/// A draft model and how many tokens it drafts a step.
pub struct DraftModel<'d> {
    model: &'d Model,
    /// tokens drafted a step at most
    pub tokens: usize,
    ws: Workspace,
}

impl<'d> DraftModel<'d> {
    /// `draft` drafting up to `tokens` a step for `target`: refused unless the two share a
    /// vocabulary size (the caller checks that they share a tokenizer) and `tokens` ≥ 1.
    pub fn new(draft: &'d Model, target: &Model, tokens: usize) -> Result<Self> {
        let (d, t) = (draft.config.vocab_size, target.config.vocab_size);
        if d != t {
            return Err(Error::Invalid(format!(
                "the draft model's vocabulary has {d} tokens and the model's {t}: a draft model needs the same tokenizer"
            )));
        }
        if tokens == 0 {
            return Err(Error::Invalid(
                "a draft model needs to draft at least 1 token a step".into(),
            ));
        }
        let chunk = DRAFT_CHUNK.min(draft.config.max_position_embeddings);
        Ok(DraftModel {
            model: draft,
            tokens,
            ws: Workspace::for_inference(draft, 1, chunk),
        })
    }

    /// The draft model.
    pub fn model(&self) -> &'d Model {
        self.model
    }

    /// A sequence's draft state: the draft model's cache, for texts of up to `capacity`
    /// tokens (or the draft model's context, if shorter).
    pub fn state(&self, capacity: usize) -> DraftState {
        let cap = capacity.min(self.model.config.max_position_embeddings);
        DraftState {
            cache: KvCache::new(self.model, cap),
        }
    }

    /// Up to `n` tokens (at most `self.tokens`) continuing `text`, greedy, after feeding the
    /// draft model what `state` has not seen of `text`. None where the text no longer fits
    /// the draft model's cache (the step decodes plainly).
    pub fn draft(&mut self, state: &mut DraftState, text: &[u32], n: usize) -> Result<Vec<u32>> {
        let n = n.min(self.tokens);
        let cache = &mut state.cache;
        if n == 0 || text.is_empty() || text.len() + n - 1 > cache.capacity {
            return Ok(Vec::new());
        }
        // 1. Catch up: the text the cache lacks (its last token at least, whose logits draw
        // the first token), a chunk at a time
        let v = self.model.config.vocab_size;
        cache.len = cache.len.min(text.len() - 1);
        for piece in text[cache.len..].chunks(self.ws.seq) {
            let one = std::slice::from_mut(cache);
            self.model
                .forward_cached(&mut self.ws, one, piece, piece.len(), false)?;
        }
        // 2. Its greedy continuation, one token a pass
        let mut out = vec![argmax(&self.ws.logits[..v])];
        while out.len() < n {
            let one = std::slice::from_mut(cache);
            let last = &out[out.len() - 1..];
            self.model
                .forward_cached(&mut self.ws, one, last, 1, false)?;
            out.push(argmax(&self.ws.logits[..v]));
        }
        Ok(out)
    }
}

/// One sequence's draft-model cache: the text so far, and the draft's own tokens until the
/// model verified them (`keep`).
pub struct DraftState {
    cache: KvCache,
}

impl DraftState {
    /// After verification, the text's first `valid` tokens stand (the text before the draft
    /// and the drafted tokens accepted): the cache forgets what it held beyond them.
    pub fn keep(&mut self, valid: usize) {
        self.cache.len = self.cache.len.min(valid);
    }
}

/// Prompt lookup's draft: the tokens that followed the latest earlier occurrence of the text's
/// last 3 tokens (else 2, else 1), up to `n` of them; none where the text has no such
/// repeat.
pub fn lookup_draft(text: &[u32], n: usize) -> Vec<u32> {
    if n == 0 {
        return Vec::new();
    }
    for g in (1..=3).rev() {
        if text.len() <= g {
            continue;
        }
        let tail = &text[text.len() - g..];
        // occurrences that end before the text's last token, the latest first
        if let Some(start) = (0..text.len() - g).rev().find(|&j| &text[j..j + g] == tail) {
            let from = start + g;
            return text[from..(from + n).min(text.len())].to_vec();
        }
    }
    Vec::new()
}
