//! The model loop behind the server: continuous batching over one model on one thread.
//!
//! Requests (`Job`s) arrive through a bounded queue. Each engine step
//!
//! ```text
//! 1. admit queued jobs while fewer than `parallel` sequences run
//! 2. prefill the next chunk of newcomers, up to `chunk` tokens in all (each alone, B = 1,
//!    every position's logits when it is scored), admitting those queued meanwhile; a
//!    prompt's end sends its first token, and one sequence a step joins the decoding batch
//!    while others decode (`Engine::step` says why)
//! 3. decode one token for every sequence in the decoding batch (B running, t = 1), or,
//!    speculating, verify each sequence's draft in one pass (B running, t = 1 + draft)
//! 4. hand each new token to its job's sink; retire finished and cancelled sequences
//! ```
//!
//! so a newcomer joins the running batch at a token boundary and its prefill, cut into chunks,
//! never stalls the others for more than one chunk. A `MapsJob` (the attention maps of a short
//! prompt, for `/v1/attention`) runs whole when it is taken from the queue, before a step's
//! decode: one forward pass of at most
//! `MAX_MAP_TOKENS` tokens. An `EmbedJob` (`/v1/embeddings`) runs whole likewise: one forward
//! pass per input, each up to the context, so long inputs hold the decoding batch up for as
//! long as a prefill of theirs would. Every sequence has its own KV cache and
//! its own seeded sampler, so a request's tokens do not depend on what else runs beside it.

use super::prefix::{PrefixCache, PrefixGauges, Scored, MAX_TOP};
pub use super::score::{score, TokenScore};
use crate::error::{Error, Result};
use crate::experiments::attention_stats::{head_maps, HeadMaps};
use crate::infer::constrain::JsonConstraint;
use crate::infer::sample::{adjusted, sample, verify, Sampling, Seen};
use crate::infer::speculative::{lookup_draft, DraftModel, DraftState, DRAFT_CHUNK};
use crate::model::{memory::Need, KvCache, Model, Workspace};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::Duration;

/// What the queue carries: a prompt to continue, or the attention maps of a prompt.
pub enum Task {
    Complete(Box<Job>),
    Maps(MapsJob),
    Embed(EmbedJob),
}

/// The embeddings of `inputs` (checked by the caller: each 1 to the context's tokens), handed
/// to `reply`; computed, like a `MapsJob`, between two engine steps.
pub struct EmbedJob {
    pub inputs: Vec<Vec<u32>>,
    pub reply: EmbedReply,
}

/// Where an `EmbedJob`'s vectors (one per input) go.
pub type EmbedReply = Box<dyn FnOnce(Result<Vec<Vec<f32>>>) + Send>;

/// The longest prompt whose attention maps the server computes: they run between two decode
/// steps, and their JSON grows with the square of the length.
pub const MAX_MAP_TOKENS: usize = 128;

/// The maps of each `(layer, head)` of `picks` over `prompt` (checked by the caller), handed to
/// `reply`.
pub struct MapsJob {
    pub prompt: Vec<u32>,
    pub picks: Vec<(usize, usize)>,
    pub reply: Box<dyn FnOnce(Result<Vec<HeadMaps>>) + Send>,
}

/// One request for the engine: a prompt to continue (or only to score).
pub struct Job {
    pub prompt: Vec<u32>,
    /// new tokens to generate at most; 0 only scores the prompt (with `echo`)
    pub max_tokens: usize,
    pub sampling: Sampling,
    pub seed: u64,
    /// generation stops after this token (it is included)
    pub eos: Option<u32>,
    /// the log-probability of each new token, and this many most likely alternatives
    pub logprobs: Option<usize>,
    /// (token id, bias) added to the logits of each new token before it is drawn and scored
    pub logit_bias: Vec<(u32, f32)>,
    /// also score every prompt token after the first (`Event::Prompt`)
    pub echo: bool,
    /// JSON mode: the tokens are kept to one JSON object, which ends the job when it closes
    pub json: Option<JsonConstraint>,
    /// receives the job's events; returns false when nobody listens any more, which cancels
    /// the job at its next token
    pub sink: Box<dyn FnMut(Event) -> bool + Send>,
}

#[derive(Debug)]
pub enum Event {
    /// scores of prompt tokens 1.. (in order, one chunk's worth at a time)
    Prompt(Vec<TokenScore>),
    /// a new token, scored when the job asked for log-probabilities
    Token(u32, Option<TokenScore>),
    /// the job is over: `Length` (max_tokens or the cache), `Stop` (end-of-text token)
    Done(Finish),
    /// the job failed (the message says why); the others go on
    Failed(String),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    Length,
    Stop,
}

impl Finish {
    pub fn as_str(self) -> &'static str {
        match self {
            Finish::Length => "length",
            Finish::Stop => "stop",
        }
    }
}

#[derive(Clone, Copy, Debug)]
pub struct EngineOptions {
    /// sequences decoded together at most
    pub parallel: usize,
    /// prompt tokens prefilled per engine step
    pub chunk: usize,
    /// bytes of prompt blocks kept for later requests (`prefix.rs`); 0 keeps none
    pub prefix_cache: usize,
    /// speculative decoding by prompt lookup, drafts of up to this many tokens (0: off; a
    /// draft model instead: `Engine::with_draft`)
    pub lookup: usize,
}

/// The rows a speculative step verifies at most, all sequences' together: drafts shorten as
/// the batch grows (a sequence's draft of n tokens costs n + 1 rows), and at 16 sequences
/// and more the engine decodes plainly, where the batch itself fills the products.
const SPEC_ROWS: usize = 16;

/// What the engine is doing, read by the server's metrics.
#[derive(Default)]
pub struct EngineGauges {
    pub running: AtomicUsize,
    pub queued: AtomicUsize,
    pub prefix: Arc<PrefixGauges>,
    /// speculative decoding: tokens drafted, and those of them accepted
    pub drafted: AtomicUsize,
    pub accepted: AtomicUsize,
}

/// A sequence in the batch: its job, cache, sampler and progress.
struct Seq {
    job: Job,
    rng: ChaCha8Rng,
    /// prompt tokens prefilled so far
    fed: usize,
    /// new tokens so far; the last one is fed at the next decode step
    generated: usize,
    last: u32,
    /// the tokens its penalties look at
    seen: Seen,
    /// prefix caching: the key of its last block in the cache (None before the first), the
    /// parent of its next; None when it keeps no more (no cache, or a block's parent evicted)
    chain: Option<Option<u64>>,
    /// speculating: the prompt and the tokens generated so far (empty otherwise)
    text: Vec<u32>,
    /// with a draft model, its cache of `text`
    draft: Option<DraftState>,
}

pub struct Engine<'m> {
    model: &'m Model,
    opts: EngineOptions,
    /// running sequences; those past their prefill come first, `decoding` of them
    seqs: Vec<Seq>,
    /// each running sequence's KV cache, in the order of `seqs`
    caches: Vec<KvCache>,
    decoding: usize,
    /// sequences that may still join the decoding batch in this step
    joins_left: usize,
    decode_ws: Workspace,
    prefill_ws: Workspace,
    scratch: Vec<(f32, u32)>,
    /// a row of logits with a job's `logit_bias` and penalties applied
    adjusted: Vec<f32>,
    /// a row with JSON mode's mask
    masked: Vec<f32>,
    /// prompt blocks kept across requests (`--prefix-cache`)
    prefix: Option<PrefixCache>,
    /// speculative decoding: tokens drafted a step at most (0: off), the draft model if
    /// drafts come from one (else from prompt lookup), and the workspace that verifies them
    spec: usize,
    draft: Option<DraftModel<'m>>,
    spec_ws: Option<Workspace>,
    gauges: Arc<EngineGauges>,
}

impl<'m> Engine<'m> {
    pub fn new(model: &'m Model, opts: EngineOptions, gauges: Arc<EngineGauges>) -> Result<Self> {
        if opts.parallel == 0 || opts.chunk == 0 {
            return Err(Error::Invalid(
                "the engine needs parallel >= 1 and chunk >= 1".into(),
            ));
        }
        let ctx = model.config.max_position_embeddings;
        let chunk = opts.chunk.min(ctx);
        // (prompt lookup's drafts are verified in a workspace of their own)
        let mut workspaces = vec![(opts.parallel, 1), (1, chunk)];
        if opts.lookup > 0 {
            workspaces.push((opts.parallel, opts.lookup + 1));
        }
        // the weights a second time (bf16 copies with `--bf16`, else f32 panels), one copy
        // that both workspaces read
        let panels = model.quant.is_none();
        let mut need = Need::inference(
            &model.config,
            &workspaces,
            (opts.parallel, ctx, model.kv_cache),
        )
        .with_copies(model, panels);
        need.kv = need.kv.saturating_add(opts.prefix_cache);
        need.check(&format!(
            "serving --parallel {} sequences of up to {ctx} tokens",
            opts.parallel
        ))?;
        let prefix = prefix_cache(model, chunk, opts.prefix_cache, &gauges)?;
        let mut decode_ws = Workspace::for_inference(model, opts.parallel, 1);
        decode_ws.keep_weight_copies(model, panels);
        let mut prefill_ws = Workspace::for_inference(model, 1, chunk);
        prefill_ws.share_weight_copies(&decode_ws);
        let mut engine = Engine {
            model,
            opts: EngineOptions { chunk, ..opts },
            seqs: Vec::new(),
            caches: Vec::new(),
            decoding: 0,
            joins_left: 0,
            decode_ws,
            prefill_ws,
            scratch: Vec::with_capacity(model.config.vocab_size),
            adjusted: Vec::with_capacity(model.config.vocab_size),
            masked: Vec::with_capacity(model.config.vocab_size),
            prefix,
            spec: 0,
            draft: None,
            spec_ws: None,
            gauges,
        };
        if opts.lookup > 0 {
            engine.speculate(opts.lookup);
        }
        Ok(engine)
    }

    /// Turns speculative decoding on, drafts of up to `tokens`: the workspace that verifies
    /// every sequence's draft in one pass, reading the decoding workspace's weight copies.
    fn speculate(&mut self, tokens: usize) {
        let mut ws = Workspace::for_inference(self.model, self.opts.parallel, tokens + 1);
        ws.share_weight_copies(&self.decode_ws);
        self.spec = tokens;
        self.spec_ws = Some(ws);
    }

    /// Speculative decoding with `draft`'s drafts (its greedy continuation, `draft.tokens` a
    /// step at most) instead of prompt lookup's.
    pub fn with_draft(mut self, draft: DraftModel<'m>) -> Result<Self> {
        let rows = (self.opts.parallel, draft.tokens + 1);
        let c = &draft.model().config;
        let chunk = (1, DRAFT_CHUNK.min(c.max_position_embeddings));
        let caches = (
            self.opts.parallel,
            c.max_position_embeddings,
            self.model.kv_cache,
        );
        // the draft model with its caches and workspace, and the model's verifying workspace
        let mut need = Need::inference(c, &[chunk], caches);
        let verify = Workspace::bytes_for(&self.model.config, rows.0, rows.1);
        need.workspace = need.workspace.saturating_add(verify);
        need.check("a draft model beside every sequence")?;
        self.speculate(draft.tokens);
        self.draft = Some(draft);
        Ok(self)
    }

    /// Serves jobs from `queue` until every sender is gone and the batch is empty, on a worker
    /// of the compute pool (as `generate` runs): the steps' parallel products fork from inside
    /// the pool instead of waking it from outside at every step, which the HTTP threads and the
    /// clients on the same cores made late (1.8× the time a token under load). The other
    /// workers are not kept polling between steps (`on_pool_quiet`): that CPU time is the HTTP
    /// side's.
    pub fn run(&mut self, queue: Receiver<Task>) {
        crate::kernels::on_pool_quiet(move || self.serve(&queue))
    }

    fn serve(&mut self, queue: &Receiver<Task>) {
        // 1. Admit, waiting while idle; 2–4 in `step`.
        while self.admit_queued(queue) {
            self.gauges
                .running
                .store(self.seqs.len(), Ordering::Relaxed);
            if let Err(e) = self.step(queue) {
                // a failure of the step itself: every sequence in it is told, the loop goes on
                for mut s in self.seqs.drain(..) {
                    (s.job.sink)(Event::Failed(e.to_string()));
                }
                self.caches.clear();
                self.decoding = 0;
            }
            self.gauges
                .running
                .store(self.seqs.len(), Ordering::Relaxed);
        }
    }

    /// Phase 1: takes queued jobs while fewer than `parallel` sequences run, waiting for one
    /// when none runs; a maps job runs at once. False once every sender is gone and nothing runs.
    fn admit_queued(&mut self, queue: &Receiver<Task>) -> bool {
        while self.seqs.len() < self.opts.parallel {
            let task = if self.seqs.is_empty() {
                match queue.recv_timeout(Duration::from_millis(200)) {
                    Ok(j) => j,
                    Err(RecvTimeoutError::Timeout) => continue,
                    Err(RecvTimeoutError::Disconnected) => return false,
                }
            } else {
                match queue.try_recv() {
                    Ok(j) => j,
                    Err(_) => break,
                }
            };
            self.gauges.queued.fetch_sub(1, Ordering::Relaxed);
            match task {
                Task::Complete(job) => self.admit(*job),
                Task::Maps(m) => (m.reply)(head_maps(self.model, &m.prompt, &m.picks)),
                Task::Embed(e) => (e.reply)(crate::infer::embed(self.model, &e.inputs)),
            }
        }
        true
    }

    fn admit(&mut self, mut job: Job) {
        let cap = job.prompt.len() + job.max_tokens;
        if job.prompt.is_empty() || cap > self.model.config.max_position_embeddings {
            (job.sink)(Event::Failed(format!(
                "prompt of {} tokens plus max_tokens {} does not fit the context of {}",
                job.prompt.len(),
                job.max_tokens,
                self.model.config.max_position_embeddings
            )));
            return;
        }
        let mut cache = KvCache::new(self.model, cap);
        let (fed, chain, scores) = match self.prefix.as_mut() {
            Some(p) => match take_prefix(p, &job, &mut cache) {
                Ok(took) => took,
                Err(e) => {
                    (job.sink)(Event::Failed(e.to_string()));
                    return;
                }
            },
            None => (0, None, Vec::new()),
        };
        if !scores.is_empty() && !(job.sink)(Event::Prompt(scores)) {
            return;
        }
        self.caches.push(cache);
        let speculating = self.spec > 0;
        self.seqs.push(Seq {
            rng: ChaCha8Rng::seed_from_u64(job.seed),
            seen: Seen::new(&job.prompt, &job.sampling.penalties),
            text: if speculating {
                job.prompt.clone()
            } else {
                Vec::new()
            },
            draft: self.draft.as_ref().map(|d| d.state(cap)),
            job,
            fed,
            generated: 0,
            last: 0,
            chain,
        });
    }

    /// One engine step: prefill chunks, then one decode step over the running batch.
    ///
    /// Jobs queued while the step prefilled others are admitted and join that prefill while
    /// its budget lasts, so that a newcomer's first token waits for the prefill ahead of it
    /// but not also for a decode step. Arrivals come in bunches (the requests of a bunch are
    /// prefilled in one step, finish in one step, and their clients ask again at once), so
    /// while others decode, one sequence a step joins the decoding batch: a second that
    /// finishes its prefill in the same step has its first token sent and joins at the next
    /// step, and the bunch's next requests arrive a step apart.
    fn step(&mut self, queue: &Receiver<Task>) -> Result<()> {
        self.joins_left = if self.decoding == 0 { usize::MAX } else { 1 };
        let budget = self.prefill(self.opts.chunk)?;
        // (only while sequences run: with none, `admit_queued` would wait for a job here,
        // and the gauges would show the last step's batch meanwhile)
        if budget < self.opts.chunk && budget > 0 && !self.seqs.is_empty() {
            self.admit_queued(queue);
            self.prefill(budget)?;
        }
        if self.decoding > 0 {
            self.decode()?;
        }
        Ok(())
    }

    /// Phase 2 for as many newcomers as fit `budget` prompt tokens in all (at least one
    /// when the budget is whole), each by one chunk of its own: a sequence's chunks fall at
    /// the same places whatever else runs, so its numbers do too. A sequence whose prompt is
    /// in joins the decoding batch while this step's joins last; else it waits, ready, and
    /// the prefill stops there. Returns the budget left.
    fn prefill(&mut self, mut budget: usize) -> Result<usize> {
        let mut k = 0;
        while let Some(s) = self.seqs.get(self.decoding + k) {
            let left = s.job.prompt.len() - s.fed;
            if left == 0 {
                if self.joins_left == 0 {
                    break;
                }
                self.join(self.decoding + k);
                continue;
            }
            let size = left.min(self.opts.chunk);
            if size > budget && budget < self.opts.chunk {
                break;
            }
            budget = budget.saturating_sub(size);
            let (decoding, len) = (self.decoding, self.seqs.len());
            self.prefill_chunk(self.decoding + k)?;
            // still prefilling: on to the next; ready: stop; else the slot now holds another
            if (self.decoding, self.seqs.len()) == (decoding, len) {
                let s = &self.seqs[self.decoding + k];
                if s.fed == s.job.prompt.len() {
                    break;
                }
                k += 1;
            }
            if budget == 0 {
                break;
            }
        }
        Ok(budget)
    }

    /// Moves ready sequence `i` among the decoding ones.
    fn join(&mut self, i: usize) {
        self.swap(i, self.decoding);
        self.decoding += 1;
        self.joins_left = self.joins_left.saturating_sub(1);
    }

    /// Phase 2: prefills the next chunk of sequence `i` (one still prefilling). At the prompt's end
    /// its first token is drawn and sent, and it joins the decoding sequences or waits ready.
    fn prefill_chunk(&mut self, i: usize) -> Result<()> {
        let v = self.model.config.vocab_size;
        let s = &mut self.seqs[i];
        let (start, n) = (s.fed, s.job.prompt.len());
        let end = (start + self.opts.chunk).min(n);
        let all = s.job.echo;
        self.model.forward_cached(
            &mut self.prefill_ws,
            &mut self.caches[i..i + 1],
            &s.job.prompt[start..end],
            end - start,
            all,
        )?;
        s.fed = end;
        let logits = std::mem::take(&mut self.prefill_ws.logits);
        self.keep_block(i, start, &logits, all);
        let r = self.after_prefill(i, start, &logits, all, v);
        self.prefill_ws.logits = logits;
        r
    }

    /// Keeps the chunk [start, fed) of sequence `i` in the prefix cache when it is a whole
    /// block (with its scores when `all` computed every position's logits).
    fn keep_block(&mut self, i: usize, start: usize, logits: &[f32], all: bool) {
        let (Some(p), s) = (self.prefix.as_mut(), &mut self.seqs[i]) else {
            return;
        };
        let Some(parent) = s.chain else { return };
        let tokens = &s.job.prompt[start..s.fed];
        if tokens.len() != p.block {
            s.chain = None;
            return;
        }
        let v = self.model.config.vocab_size;
        let scored = (all && !p.has(parent, tokens, true)).then(|| Scored {
            scores: (0..tokens.len() - 1)
                .map(|r| score(&logits[r * v..(r + 1) * v], tokens[r + 1], MAX_TOP))
                .collect(),
            last_logits: logits[(tokens.len() - 1) * v..tokens.len() * v].to_vec(),
        });
        let cache = &self.caches[i];
        s.chain = p
            .insert(
                parent,
                tokens,
                || cache.cut(start, start + tokens.len()),
                scored,
            )
            .map(Some);
    }

    /// Hands out the prompt scores of the chunk [start, fed) of sequence `i`; at the prompt's
    /// end draws its first token and joins it to the decoding sequences while the step's
    /// joins last (else it waits, ready, for the next step's).
    fn after_prefill(
        &mut self,
        i: usize,
        start: usize,
        logits: &[f32],
        all: bool,
        v: usize,
    ) -> Result<()> {
        let s = &mut self.seqs[i];
        let (end, n) = (s.fed, s.job.prompt.len());
        if all {
            // row r predicts prompt token start + r + 1, while there is one
            let scores: Vec<TokenScore> = (start..end.min(n - 1))
                .map(|p| {
                    let row = &logits[(p - start) * v..(p - start + 1) * v];
                    score(row, s.job.prompt[p + 1], s.job.logprobs.unwrap_or(0))
                })
                .collect();
            if !scores.is_empty() && !(s.job.sink)(Event::Prompt(scores)) {
                self.retire(i);
                return Ok(());
            }
        }
        if end < n {
            return Ok(());
        }
        if s.job.max_tokens == 0 {
            (s.job.sink)(Event::Done(Finish::Length));
            self.retire(i);
            return Ok(());
        }
        let last = if all { (end - 1 - start) * v } else { 0 };
        let slot = if self.joins_left > 0 {
            self.join(i);
            self.decoding - 1
        } else {
            i
        };
        self.emit(slot, &logits[last..last + v], None);
        Ok(())
    }

    /// Phase 3: one token for every decoding sequence, speculatively where it may be.
    fn decode(&mut self) -> Result<()> {
        match self.draft_len() {
            0 => self.decode_plainly(),
            n => self.decode_speculatively(n),
        }
    }

    /// Feeds every decoding sequence its last token (B = decoding, t = 1) and emits the next.
    fn decode_plainly(&mut self) -> Result<()> {
        let b = self.decoding;
        let v = self.model.config.vocab_size;
        let inputs: Vec<u32> = self.seqs[..b].iter().map(|s| s.last).collect();
        self.model.forward_cached(
            &mut self.decode_ws,
            &mut self.caches[..b],
            &inputs,
            1,
            false,
        )?;
        let logits = std::mem::take(&mut self.decode_ws.logits);
        // from the last slot down, so retiring one moves only slots already handled
        for slot in (0..b).rev() {
            self.emit(slot, &logits[slot * v..(slot + 1) * v], None);
        }
        self.decode_ws.logits = logits;
        Ok(())
    }

    /// Tokens a speculative step drafts a sequence at most (0: decode plainly): up to `spec`,
    /// `SPEC_ROWS` rows verified in all, and within every sequence's tokens still wanted and
    /// its cache, so that each one's draft (padded to the longest) fits.
    fn draft_len(&self) -> usize {
        let b = self.decoding;
        let mut n = self.spec.min((SPEC_ROWS / b).saturating_sub(1));
        for (s, c) in self.seqs[..b].iter().zip(&self.caches) {
            let room = (s.job.max_tokens - s.generated).min(c.capacity - c.len);
            n = n.min(room.saturating_sub(1));
        }
        n
    }

    /// Speculative decoding: each decoding sequence's draft of up to `n` tokens (prompt
    /// lookup's or the draft model's), verified with its last token in one pass
    /// (B = decoding, t = 1 + the longest draft, shorter drafts padded); each takes its
    /// drafted tokens while accepted, then the corrected one or one more (`emit`), and its
    /// cache keeps the positions accepted.
    fn decode_speculatively(&mut self, n: usize) -> Result<()> {
        let (b, v) = (self.decoding, self.model.config.vocab_size);
        // 1. The drafts, each padded with its sequence's last token to the longest
        let mut drafts = Vec::with_capacity(b);
        for s in &mut self.seqs[..b] {
            drafts.push(match (self.draft.as_mut(), s.draft.as_mut()) {
                (Some(d), Some(state)) => d.draft(state, &s.text, n)?,
                _ => lookup_draft(&s.text, n),
            });
        }
        let t = 1 + drafts.iter().map(Vec::len).max().unwrap_or(0);
        if t == 1 {
            return self.decode_plainly();
        }
        let mut inputs = Vec::with_capacity(b * t);
        for (s, d) in self.seqs[..b].iter().zip(&drafts) {
            inputs.push(s.last);
            inputs.extend(d);
            inputs.extend(std::iter::repeat_n(s.last, t - 1 - d.len()));
        }
        // 2. One pass, every position's logits
        let ws = self
            .spec_ws
            .as_mut()
            .expect("speculating without its workspace");
        self.model
            .forward_cached(ws, &mut self.caches[..b], &inputs, t, true)?;
        let logits = std::mem::take(&mut ws.logits);
        // 3. From the last slot down (retiring one moves only slots already handled): the
        // drafted tokens while accepted, the cache grown by each, then the corrected one
        for slot in (0..b).rev() {
            let d = &drafts[slot];
            self.caches[slot].len -= t - 1;
            let (mut accepted, mut running) = (0, true);
            for j in 0..=d.len() {
                let row = &logits[(slot * t + j) * v..(slot * t + j + 1) * v];
                let took;
                (took, running) = self.emit(slot, row, d.get(j).copied());
                if !running || !took {
                    break;
                }
                accepted += 1;
                self.caches[slot].len += 1;
            }
            self.gauges.drafted.fetch_add(d.len(), Ordering::Relaxed);
            self.gauges.accepted.fetch_add(accepted, Ordering::Relaxed);
            // the draft model's cache keeps the text before the last token (a retired
            // sequence's slot holds one handled already, or none)
            if running {
                let s = &mut self.seqs[slot];
                if let Some(state) = s.draft.as_mut() {
                    state.keep(s.text.len() - 1);
                }
            }
        }
        self.spec_ws.as_mut().expect("speculating").logits = logits;
        Ok(())
    }

    /// Phase 4: draws decoding sequence `slot`'s next token from `row` (speculating, verifies
    /// `draft` with it: `sample::verify`), hands it to the job, and retires the sequence when
    /// it is finished or nobody listens. Returns whether the token is the draft, and whether
    /// the sequence still runs.
    fn emit(&mut self, slot: usize, row: &[f32], draft: Option<u32>) -> (bool, bool) {
        let s = &mut self.seqs[slot];
        let (j, adj) = (&s.job, &mut self.adjusted);
        let row = adjusted(row, &j.sampling, &s.seen, &j.logit_bias, adj);
        let cache = &self.caches[slot];
        // tokens this one included before the job ends at max_tokens or the cache's end
        let left = (j.max_tokens - s.generated).min(cache.capacity + 1 - cache.len);
        let row = match &j.json {
            Some(c) => c.mask(row, left, &mut self.masked),
            None => row,
        };
        let (tok, took) = match draft {
            Some(d) => verify(row, &j.sampling, &mut s.rng, &mut self.scratch, d),
            None => (
                sample(row, &j.sampling, &mut s.rng, &mut self.scratch),
                false,
            ),
        };
        s.seen.push(tok);
        if self.spec > 0 {
            s.text.push(tok);
        }
        if let Some(c) = s.job.json.as_mut() {
            c.advance(tok);
        }
        let scored = s.job.logprobs.map(|k| score(row, tok, k));
        s.generated += 1;
        s.last = tok;
        let listening = (s.job.sink)(Event::Token(tok, scored));
        let finish = if s.job.eos == Some(tok) || s.job.json.as_ref().is_some_and(|c| c.done()) {
            Some(Finish::Stop)
        } else if s.generated >= s.job.max_tokens
            || self.caches[slot].len >= self.caches[slot].capacity
        {
            Some(Finish::Length)
        } else {
            None
        };
        if let Some(f) = finish.filter(|_| listening) {
            (s.job.sink)(Event::Done(f));
        }
        let running = listening && finish.is_none();
        if !running {
            self.retire(slot);
        }
        (took, running)
    }

    /// Removes sequence `i`, keeping the decoding ones first.
    fn retire(&mut self, i: usize) {
        let mut i = i;
        if i < self.decoding {
            self.decoding -= 1;
            self.swap(i, self.decoding);
            i = self.decoding;
        }
        let last = self.seqs.len() - 1;
        self.swap(i, last);
        self.seqs.pop();
        self.caches.pop();
    }

    /// Exchanges two sequences with their caches.
    fn swap(&mut self, a: usize, b: usize) {
        self.seqs.swap(a, b);
        self.caches.swap(a, b);
    }
}

/// The prefix cache of `budget` bytes in blocks of the prefill chunk, None when `budget`
/// is 0; an error when it cannot hold one block.
fn prefix_cache(
    model: &Model,
    chunk: usize,
    budget: usize,
    gauges: &EngineGauges,
) -> Result<Option<PrefixCache>> {
    if budget == 0 {
        return Ok(None);
    }
    let c = &model.config;
    let block = KvCache::bytes_for(c, model.kv_cache, chunk);
    if budget < block {
        return Err(Error::Invalid(format!(
            "a prefix cache of {:.1} MiB cannot hold one block of {chunk} prompt tokens ({:.1} MiB with this model and KV cache): give more, or 0 to keep none",
            budget as f64 / (1 << 20) as f64,
            block as f64 / (1 << 20) as f64
        )));
    }
    Ok(Some(PrefixCache::new(chunk, budget, gauges.prefix.clone())))
}

/// Takes the blocks `job`'s prompt starts with from the prefix cache into its `cache`: the
/// tokens now cached, the key of the last block taken (the parent of the next), and the
/// scores of the positions they cover when the job scores its prompt.
fn take_prefix(
    p: &mut PrefixCache,
    job: &Job,
    cache: &mut KvCache,
) -> Result<(usize, Option<Option<u64>>, Vec<TokenScore>)> {
    let hit = p.lookup(&job.prompt, job.echo);
    let top = job.logprobs.unwrap_or(0);
    let mut scores = Vec::new();
    for (rows, scored) in &hit.blocks {
        let end = cache.len + rows.tokens;
        cache.append(rows)?;
        if let (true, Some(sc)) = (job.echo, scored) {
            scores.extend(sc.scores.iter().map(|x| TokenScore {
                logprob: x.logprob,
                top: x.top[..top.min(x.top.len())].to_vec(),
            }));
            scores.push(score(&sc.last_logits, job.prompt[end], top));
        }
    }
    Ok((cache.len, Some(hit.key), scores))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{AttentionKind, ModelConfig, Preset};
    use std::sync::mpsc::{sync_channel, SyncSender};
    use std::sync::Mutex;

    /// Tokens each job's sink has received.
    type Seen = Arc<Mutex<Vec<usize>>>;

    fn job(id: usize, seen: &Seen) -> Job {
        let seen = seen.clone();
        Job {
            prompt: (0..5).map(|t| (t * 7 + id as u32) % 50).collect(),
            max_tokens: 8,
            sampling: Sampling::greedy(),
            seed: 1,
            eos: None,
            logprobs: None,
            logit_bias: Vec::new(),
            echo: false,
            json: None,
            sink: Box::new(move |e| {
                if let Event::Token(..) = e {
                    seen.lock().unwrap()[id] += 1;
                }
                true
            }),
        }
    }

    fn tiny() -> Model {
        Model::init(
            ModelConfig::preset(Preset::Tiny, AttentionKind::Standard),
            1,
        )
        .unwrap()
    }

    /// An engine of 8 slots and 64-token chunks over `model`.
    fn engine(model: &Model, gauges: Arc<EngineGauges>) -> Engine<'_> {
        let opts = EngineOptions {
            parallel: 8,
            chunk: 64,
            prefix_cache: 0,
            lookup: 0,
        };
        Engine::new(model, opts, gauges).unwrap()
    }

    /// Queues `job` as the HTTP side does, counted in the gauges.
    fn enqueue(tx: &SyncSender<Task>, gauges: &EngineGauges, job: Job) {
        gauges.queued.fetch_add(1, Ordering::Relaxed);
        tx.send(Task::Complete(Box::new(job))).unwrap();
    }

    fn seen(s: &Seen) -> Vec<usize> {
        s.lock().unwrap().clone()
    }

    #[test]
    fn a_bunch_gets_its_first_tokens_at_once_and_joins_the_batch_one_a_step() {
        let model = tiny();
        let mut e = engine(&model, Arc::default());
        let (s, (_tx, rx)) = (Arc::new(Mutex::new(vec![0; 5])), sync_channel(4));
        // 1. At idle a bunch joins whole: first tokens from the prefill, one more each decoded.
        e.admit(job(0, &s));
        e.admit(job(1, &s));
        e.step(&rx).unwrap();
        assert_eq!((e.decoding, seen(&s)), (2, vec![2, 2, 0, 0, 0]));
        // 2. While others decode: all three prefilled would be one bunch; the first joins and
        //    the second waits ready (its first token sent), which stops the prefill there.
        for id in 2..5 {
            e.admit(job(id, &s));
        }
        e.step(&rx).unwrap();
        assert_eq!((e.decoding, seen(&s)), (3, vec![3, 3, 2, 1, 0]));
        // 3. The ready one joins at the next step; the third is prefilled and waits.
        e.step(&rx).unwrap();
        assert_eq!((e.decoding, seen(&s)), (4, vec![4, 4, 3, 2, 1]));
        e.step(&rx).unwrap();
        assert_eq!((e.decoding, seen(&s)), (5, vec![5, 5, 4, 3, 2]));
    }

    #[test]
    fn a_job_queued_during_a_prefill_is_prefilled_before_the_decode() {
        let model = tiny();
        let gauges = Arc::new(EngineGauges::default());
        let mut e = engine(&model, gauges.clone());
        let (s, (tx, rx)) = (Arc::new(Mutex::new(vec![0; 3])), sync_channel(4));
        e.admit(job(0, &s));
        e.step(&rx).unwrap();
        // job 2 is queued while job 1's prefill runs (here: before the step, not yet admitted)
        e.admit(job(1, &s));
        enqueue(&tx, &gauges, job(2, &s));
        e.step(&rx).unwrap();
        assert_eq!((e.decoding, seen(&s)), (2, vec![3, 2, 1]));
        // a step that prefills nobody does not look at the queue before its decode
        enqueue(&tx, &gauges, job(0, &s));
        e.step(&rx).unwrap();
        assert_eq!(e.seqs.len(), 3);
    }

    /// Every event a job's sink received, printed (f32s print as their exact bits).
    type Log = Arc<Mutex<Vec<String>>>;

    fn logged(prompt: Vec<u32>, echo: bool, log: &Log) -> Job {
        let log = log.clone();
        Job {
            prompt,
            max_tokens: 6,
            logprobs: Some(3),
            echo,
            sink: Box::new(move |e| {
                // prompt scores one by one: the cache sends those of its blocks at once
                let mut l = log.lock().unwrap();
                match e {
                    Event::Prompt(scores) => l.extend(scores.iter().map(|x| format!("{x:?}"))),
                    e => l.push(format!("{e:?}")),
                }
                true
            }),
            ..job(0, &Arc::new(Mutex::new(vec![0])))
        }
    }

    /// Runs each (prompt, echo) alone to its end, in order, on `e`: their event logs.
    fn run_each(e: &mut Engine, jobs: &[(Vec<u32>, bool)]) -> Vec<Vec<String>> {
        let (_tx, rx) = sync_channel(1);
        jobs.iter()
            .map(|(prompt, echo)| {
                let log = Log::default();
                e.admit(logged(prompt.clone(), *echo, &log));
                while !e.seqs.is_empty() {
                    e.step(&rx).unwrap();
                }
                let l = log.lock().unwrap().clone();
                l
            })
            .collect()
    }

    fn with_prefix(model: &Model, budget: usize, gauges: Arc<EngineGauges>) -> Engine<'_> {
        let opts = EngineOptions {
            parallel: 4,
            chunk: 16,
            prefix_cache: budget,
            lookup: 0,
        };
        Engine::new(model, opts, gauges).unwrap()
    }

    #[test]
    fn the_prefix_cache_gives_the_same_bits_for_every_kind_and_kv_cache() {
        let shared: Vec<u32> = (0..40).map(|t| (t * 11 + 3) % 97).collect();
        let with = |tail: std::ops::Range<u32>| [&shared[..], &tail.collect::<Vec<_>>()].concat();
        let (a, b, c) = (with(200..210), with(230..235), with(100..120));
        // scored after unscored: the unscored blocks are not taken, the scored ones are made
        let jobs = [
            (a.clone(), false),
            (b.clone(), false),
            (b, true),
            (c.clone(), true),
            (c, false),
            (a, true),
        ];
        for kind in AttentionKind::ALL {
            for kv in crate::model::KvKind::ALL {
                let mut model = Model::init(ModelConfig::preset(Preset::Tiny, kind), 3).unwrap();
                model.kv_cache = kv;
                let cold = run_each(&mut with_prefix(&model, 0, Arc::default()), &jobs);
                let gauges = Arc::new(EngineGauges::default());
                let warm = run_each(&mut with_prefix(&model, 64 << 20, gauges.clone()), &jobs);
                for (i, (w, c)) in warm.iter().zip(&cold).enumerate() {
                    let at = w.iter().zip(c).position(|(x, y)| x != y);
                    assert_eq!((w.len(), at), (c.len(), None), "{kind} {kv} job {i}");
                }
                let g = &gauges.prefix;
                let n = |x: &std::sync::atomic::AtomicU64| x.load(Ordering::Relaxed);
                // b takes the two blocks of the shared 40 tokens; the scored b finds them
                // unscored and scores them; the scored c takes them, c three (its own third
                // too), the scored a two (its third is unscored)
                assert_eq!((n(&g.lookups), n(&g.hits)), (6, 4), "{kind} {kv}");
                assert_eq!(n(&g.tokens_saved), 32 + 32 + 48 + 32, "{kind} {kv}");
                assert!(
                    cold[5].iter().any(|e| e.starts_with("TokenScore")),
                    "echo scores sent"
                );
            }
        }
    }

    #[test]
    fn a_prefix_cache_under_pressure_evicts_and_stays_exact() {
        let model = tiny();
        let block = KvCache::bytes_for(&model.config, model.kv_cache, 16);
        let gauges = Arc::new(EngineGauges::default());
        // room for three blocks and their extras: five prompts of three blocks each compete
        let mut warm = with_prefix(&model, 3 * block + 4096, gauges.clone());
        let prompt = |i: u32| -> Vec<u32> { (0..50).map(|t| (t * 7 + i * 13) % 120).collect() };
        let jobs: Vec<(Vec<u32>, bool)> = [0, 1, 2, 0, 3, 1, 4, 0]
            .iter()
            .map(|&i| (prompt(i), false))
            .collect();
        let cold = run_each(&mut engine(&model, Arc::default()), &jobs);
        assert_eq!(run_each(&mut warm, &jobs), cold);
        let g = &gauges.prefix;
        assert!(g.evictions.load(Ordering::Relaxed) > 0);
        assert!(g.bytes.load(Ordering::Relaxed) as usize <= 3 * block + 4096);
        assert!(warm.prefix.as_ref().unwrap().bytes() <= 3 * block + 4096);
    }

    #[test]
    fn a_prefix_cache_too_small_for_one_block_is_refused() {
        let model = tiny();
        let opts = EngineOptions {
            parallel: 2,
            chunk: 16,
            prefix_cache: 1000,
            lookup: 0,
        };
        let e = Engine::new(&model, opts, Arc::default()).err().unwrap();
        assert!(e.to_string().contains("cannot hold one block of 16"), "{e}");
    }

    #[test]
    fn a_step_left_with_no_sequence_does_not_wait_on_the_queue() {
        let model = tiny();
        let gauges = Arc::new(EngineGauges::default());
        let mut e = engine(&model, gauges.clone());
        let (s, (tx, rx)) = (Arc::new(Mutex::new(vec![0; 2])), sync_channel(4));
        // a scoring job (max_tokens 0) is prefilled and retired in the step's prefill; the job
        // queued meanwhile waits for the next step's admission, not inside this one
        e.admit(Job {
            max_tokens: 0,
            ..job(0, &s)
        });
        enqueue(&tx, &gauges, job(1, &s));
        e.step(&rx).unwrap();
        assert!(e.seqs.is_empty());
        assert_eq!(gauges.queued.load(Ordering::Relaxed), 1);
    }

    /// Runs `prompts` together (greedy, 24 tokens each) on `e`: each one's tokens.
    fn together(e: &mut Engine, prompts: &[Vec<u32>]) -> Vec<Vec<u32>> {
        let (_tx, rx) = sync_channel(1);
        let out: Vec<Arc<Mutex<Vec<u32>>>> = prompts.iter().map(|_| Arc::default()).collect();
        for (p, o) in prompts.iter().zip(&out) {
            let o = o.clone();
            e.admit(Job {
                prompt: p.clone(),
                max_tokens: 24,
                sink: Box::new(move |ev| {
                    if let Event::Token(t, _) = ev {
                        o.lock().unwrap().push(t);
                    }
                    true
                }),
                ..job(0, &Arc::new(Mutex::new(vec![0])))
            });
        }
        while !e.seqs.is_empty() {
            e.step(&rx).unwrap();
        }
        out.iter().map(|o| o.lock().unwrap().clone()).collect()
    }

    /// Speculative decoding in the engine, by prompt lookup and by a draft model, gives
    /// plain decoding's greedy tokens for every kind, sequences decoding together (drafts
    /// padded to the longest, some accepted, some not) and apart; the gauges count them.
    #[test]
    fn speculating_decodes_the_plain_greedy_tokens_together() {
        let prompts: Vec<Vec<u32>> = ["the cat sat on the mat, the cat", "abcabcabc", "xyz", "no"]
            .iter()
            .map(|t| t.bytes().map(u32::from).collect())
            .collect();
        for kind in AttentionKind::ALL {
            let model = Model::init(ModelConfig::preset(Preset::Tiny, kind), 1).unwrap();
            // a draft that mostly agrees: the model with its weights nudged
            let mut nudged = model.clone();
            for (i, p) in nudged.params.iter_mut().enumerate() {
                *p += 2e-4 * ((i * 7919 % 13) as f32 - 6.0);
            }
            let opts = |lookup| EngineOptions {
                parallel: 4,
                chunk: 16,
                prefix_cache: 0,
                lookup,
            };
            let plain = together(
                &mut Engine::new(&model, opts(0), Arc::default()).unwrap(),
                &prompts,
            );
            for by in ["lookup", "draft"] {
                let gauges = Arc::new(EngineGauges::default());
                let mut e = Engine::new(
                    &model,
                    opts(if by == "lookup" { 4 } else { 0 }),
                    gauges.clone(),
                )
                .unwrap();
                if by == "draft" {
                    e = e
                        .with_draft(DraftModel::new(&nudged, &model, 3).unwrap())
                        .unwrap();
                }
                assert_eq!(together(&mut e, &prompts), plain, "{kind} {by}");
                assert_eq!(
                    together(&mut e, &prompts[..1]),
                    plain[..1],
                    "{kind} {by} alone"
                );
                let (d, a) = (
                    gauges.drafted.load(Ordering::Relaxed),
                    gauges.accepted.load(Ordering::Relaxed),
                );
                assert!(a > 0 && a < d, "{kind} {by}: {a} of {d} accepted");
            }
        }
    }
}
