//! Prefix caching: the KV rows of prompts kept across requests, so that a request whose
//! prompt starts like an earlier one's (a few-shot preamble, a chat history, one context
//! scored with several continuations) prefills only what is new.
//!
//! The cache is paged in blocks of the engine's prefill chunk: block k of a prompt holds the
//! rows of its tokens [k·B, (k+1)·B), keyed by a hash of every token up to its end and
//! checked against its own tokens and its parent's key. A cold request prefills exactly
//! those chunks, and a chunk's rows depend only on the tokens up to its end, so a request
//! that takes blocks and prefills the rest computes the same numbers as one that prefills
//! everything: outputs and log-probabilities are bit-identical with the cache or without.
//!
//! A block counts the blocks that continue it (its children); only childless blocks are
//! evicted, least recently used first, while the cache holds more than its budget of bytes.
//! Blocks are copied into a request's own KV cache when it is admitted, so a running request
//! never holds a block and eviction never waits for one.
//!
//! For requests that score their prompt (`echo`), a block also keeps the scores of its
//! positions (with the 20 most likely tokens each, truncated to what a request asks) and
//! its last position's logits (to score the token after it), taken from a prefill that
//! computed every position's logits as such a request does.

use super::score::TokenScore;
use crate::model::KvBlock;
use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};

/// The most likely tokens a block keeps per scored position: the API's limit.
pub const MAX_TOP: usize = 20;

/// The counters `/metrics` reports.
#[derive(Default)]
pub struct PrefixGauges {
    /// requests looked up
    pub lookups: AtomicU64,
    /// requests that took at least one block
    pub hits: AtomicU64,
    /// prompt tokens not prefilled thanks to the cache
    pub tokens_saved: AtomicU64,
    /// blocks evicted to stay within the budget
    pub evictions: AtomicU64,
    /// blocks held now
    pub blocks: AtomicU64,
    /// bytes held now
    pub bytes: AtomicU64,
}

/// A scored block's extras: the scores of its positions but the last, whose next token is
/// in the block, and the logits of its last position.
pub struct Scored {
    /// position p's score of token p + 1, with the `MAX_TOP` most likely tokens
    pub scores: Vec<TokenScore>,
    /// the logits of the block's last position
    pub last_logits: Vec<f32>,
}

struct Block {
    parent: Option<u64>,
    tokens: Vec<u32>,
    rows: KvBlock,
    scored: Option<Scored>,
    children: usize,
    used: u64,
}

impl Block {
    fn bytes(&self) -> usize {
        let scores = self.scored.as_ref().map_or(0, |s| {
            s.last_logits.len() * 4 + s.scores.iter().map(|x| 8 + x.top.len() * 8).sum::<usize>()
        });
        self.rows.bytes() + self.tokens.len() * 4 + scores
    }
}

/// A hit: the blocks a prompt starts with, in order.
pub struct Hit<'a> {
    /// each block's rows, and its scores where it keeps them
    pub blocks: Vec<(&'a KvBlock, Option<&'a Scored>)>,
    /// the key of the last block taken (the parent of the prompt's next block)
    pub key: Option<u64>,
}

/// The cache of prompt blocks under a budget of bytes.
pub struct PrefixCache {
    /// tokens per block (the engine's prefill chunk)
    pub block: usize,
    budget: usize,
    bytes: usize,
    clock: u64,
    blocks: HashMap<u64, Block>,
    /// the counters it updates
    pub gauges: std::sync::Arc<PrefixGauges>,
}

/// The key of a block: its parent's key and its own tokens, hashed.
pub fn key(parent: Option<u64>, tokens: &[u32]) -> u64 {
    let mut h = DefaultHasher::new();
    parent.hash(&mut h);
    tokens.hash(&mut h);
    h.finish()
}

impl PrefixCache {
    /// An empty cache of blocks of `block` tokens holding at most `budget` bytes.
    pub fn new(block: usize, budget: usize, gauges: std::sync::Arc<PrefixGauges>) -> Self {
        PrefixCache {
            block,
            budget,
            bytes: 0,
            clock: 0,
            blocks: HashMap::new(),
            gauges,
        }
    }

    /// The blocks `prompt` starts with, leaving at least one token to prefill (whose logits
    /// the first new token is drawn from); with `scored`, only blocks that keep scores.
    /// Marks them used and counts the lookup.
    pub fn lookup(&mut self, prompt: &[u32], scored: bool) -> Hit<'_> {
        // 1. Walk the chain of full blocks from the start while each is cached
        let mut keys = Vec::new();
        let mut parent = None;
        for chunk in prompt[..prompt.len().saturating_sub(1)].chunks_exact(self.block) {
            let k = key(parent, chunk);
            match self.blocks.get(&k) {
                Some(b) if b.parent == parent && b.tokens == chunk => {
                    if scored && b.scored.is_none() {
                        break;
                    }
                    keys.push(k);
                    parent = Some(k);
                }
                _ => break,
            }
        }
        // 2. Mark them used, count, and hand them out
        self.clock += 1;
        for k in &keys {
            if let Some(b) = self.blocks.get_mut(k) {
                b.used = self.clock;
            }
        }
        let g = &self.gauges;
        g.lookups.fetch_add(1, Ordering::Relaxed);
        if !keys.is_empty() {
            g.hits.fetch_add(1, Ordering::Relaxed);
            let saved = (keys.len() * self.block) as u64;
            g.tokens_saved.fetch_add(saved, Ordering::Relaxed);
        }
        let blocks = keys
            .iter()
            .map(|k| {
                let b = &self.blocks[k];
                (&b.rows, b.scored.as_ref())
            })
            .collect();
        Hit {
            blocks,
            key: keys.last().copied(),
        }
    }

    /// Whether the block after `parent` with `tokens` is cached (with scores, if `scored`).
    pub fn has(&self, parent: Option<u64>, tokens: &[u32], scored: bool) -> bool {
        self.blocks.get(&key(parent, tokens)).is_some_and(|b| {
            b.parent == parent && b.tokens == tokens && (!scored || b.scored.is_some())
        })
    }

    /// Keeps the block after `parent` (None: the prompt's first) of `tokens`, or adds scores
    /// to the one kept; then evicts while over budget. Returns its key, or None when its
    /// parent is no longer cached (the chain is broken: its descendants are not kept).
    pub fn insert(
        &mut self,
        parent: Option<u64>,
        tokens: &[u32],
        rows: impl FnOnce() -> KvBlock,
        scored: Option<Scored>,
    ) -> Option<u64> {
        // 1. A block without its parent could never be found
        if parent.is_some_and(|p| !self.blocks.contains_key(&p)) {
            return None;
        }
        let k = key(parent, tokens);
        self.clock += 1;
        // 2. Kept already (or a colliding block, left alone): add scores it lacks
        if let Some(b) = self.blocks.get_mut(&k) {
            if b.tokens != tokens || b.parent != parent {
                return None;
            }
            b.used = self.clock;
            if b.scored.is_none() && scored.is_some() {
                self.bytes -= b.bytes();
                b.scored = scored;
                self.bytes += b.bytes();
            }
        } else {
            let b = Block {
                parent,
                tokens: tokens.to_vec(),
                rows: rows(),
                scored,
                children: 0,
                used: self.clock,
            };
            self.bytes += b.bytes();
            self.blocks.insert(k, b);
            if let Some(p) = parent.and_then(|p| self.blocks.get_mut(&p)) {
                p.children += 1;
            }
        }
        // 3. Back under the budget, the least recently used leaves first
        self.evict(k);
        self.publish();
        self.blocks.contains_key(&k).then_some(k)
    }

    /// Evicts childless blocks, least recently used first, until the cache fits its budget
    /// (`keep`, the block just used, goes last).
    fn evict(&mut self, keep: u64) {
        while self.bytes > self.budget {
            let victim = self
                .blocks
                .iter()
                .filter(|(_, b)| b.children == 0)
                .min_by_key(|(k, b)| (**k == keep, b.used))
                .map(|(k, _)| *k);
            let Some(v) = victim else { break };
            let b = self.blocks.remove(&v).expect("the victim is cached");
            self.bytes -= b.bytes();
            if let Some(p) = b.parent.and_then(|p| self.blocks.get_mut(&p)) {
                p.children -= 1;
            }
            self.gauges.evictions.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn publish(&self) {
        let g = &self.gauges;
        g.blocks.store(self.blocks.len() as u64, Ordering::Relaxed);
        g.bytes.store(self.bytes as u64, Ordering::Relaxed);
    }

    /// Bytes held now.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}
