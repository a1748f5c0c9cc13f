//! Generation with a KV cache: each prompt is prefilled in one pass, then all sequences decode
//! together, one token per step, each new token costing time linear in its context.

use crate::error::{Error, Result};
use crate::infer::sample::{adjusted, sample, verify, Sampling, Seen};
pub use crate::infer::speculative::lookup_draft;
use crate::infer::speculative::{DraftModel, DraftState};
use crate::model::{memory::Need, KvCache, Model, Workspace};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use std::time::Instant;

#[derive(Clone, Debug)]
/// How `generate` continues the prompts.
pub struct GenerateOptions {
    /// Tokens to generate after each prompt at most.
    pub max_new_tokens: usize,
    /// How the next token is picked.
    pub sampling: Sampling,
    /// Seed of the sampling generator (same seed, same tokens).
    pub seed: u64,
    /// generation of a sequence stops after this token (it is included in the output)
    pub eos: Option<u32>,
    /// keep the last tokens of a prompt longer than the context instead of failing
    pub truncate_prompt: bool,
    /// speculative decoding by prompt lookup: up to this many tokens drafted a step from the
    /// text so far (`lookup_draft`) and verified in one forward pass (0: off)
    pub lookup: usize,
}

#[derive(Clone, Debug, Default)]
/// What `generate` produced, with its timings.
pub struct Generation {
    /// the new tokens of each prompt
    pub tokens: Vec<Vec<u32>>,
    /// the prompts as actually used (after truncation)
    pub prompt_tokens: Vec<usize>,
    /// sequences that stopped because the context was full
    pub hit_context: Vec<bool>,
    /// Seconds spent prefilling the prompts.
    pub prefill_seconds: f64,
    /// Seconds spent decoding.
    pub decode_seconds: f64,
    /// Tokens decoded (every sequence together).
    pub decode_tokens: usize,
    /// tokens drafted by speculative decoding (prompt lookup or a draft model)
    pub drafted: usize,
    /// drafted tokens that were accepted
    pub accepted: usize,
}

impl Generation {
    /// Prompt tokens per second of prefill.
    pub fn prefill_tokens_per_second(&self) -> f64 {
        self.prompt_tokens.iter().sum::<usize>() as f64 / self.prefill_seconds
    }
    /// Generated tokens per second of decode.
    pub fn decode_tokens_per_second(&self) -> f64 {
        self.decode_tokens as f64 / self.decode_seconds
    }
    /// The share of drafted tokens that were accepted (0 where none were drafted).
    pub fn acceptance(&self) -> f64 {
        self.accepted as f64 / self.drafted.max(1) as f64
    }
}

/// Generates up to `max_new_tokens` after each prompt. `on_token(prompt_index, token)` sees
/// every token as it is produced (for streaming), on a worker thread of the pool: the whole
/// generation runs there, so a decode step's parallel products fork inside the pool instead
/// of waking it from outside once per token.
///
/// ```
/// use difftx::prelude::*;
///
/// let model = Model::init(ModelConfig::preset(Preset::Tiny, AttentionKind::DiffV1), 0)?;
/// let tok = Tokenizer::Bytes;
/// let opts = GenerateOptions {
///     max_new_tokens: 8,
///     sampling: Sampling { temperature: 0.8, top_k: Some(40), ..Sampling::greedy() },
///     seed: 1,
///     eos: tok.eos_id(&model.config),
///     truncate_prompt: false,
///     lookup: 0,
/// };
/// let prompts = vec![tok.encode("Once")?, tok.encode("The")?];
/// let mut streamed = 0;
/// let g = generate(&model, &prompts, &opts, |_prompt, _token| streamed += 1)?;
/// assert_eq!(g.tokens[0].len(), 8);
/// assert_eq!(streamed, 16);
/// println!("{}", tok.decode(&g.tokens[0])?);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn generate(
    model: &Model,
    prompts: &[Vec<u32>],
    opts: &GenerateOptions,
    on_token: impl FnMut(usize, u32) + Send,
) -> Result<Generation> {
    generate_with_draft(model, None, prompts, opts, on_token)
}

/// `generate`, with speculative decoding by a draft model when `draft` is given: each step
/// the draft model proposes up to `draft.tokens` tokens (its greedy continuation) and the
/// model verifies them in one forward pass. The prompts decode one after another, each as a
/// batch of one. Greedy, the tokens are `generate`'s; sampled, their distribution is.
///
/// ```
/// use difftx::prelude::*;
///
/// let model = Model::init(ModelConfig::preset(Preset::Small, AttentionKind::DiffV1), 0)?;
/// let small = Model::init(ModelConfig::preset(Preset::Tiny, AttentionKind::Standard), 1)?;
/// // (in practice, a small model trained on the same text with the same tokenizer:
/// // `open_draft_model` opens one and checks)
/// let mut draft = DraftModel::new(&small, &model, 4)?;
/// let opts = GenerateOptions {
///     max_new_tokens: 16,
///     sampling: Sampling::greedy(),
///     seed: 0,
///     eos: None,
///     truncate_prompt: false,
///     lookup: 0,
/// };
/// let prompts = vec![Tokenizer::Bytes.encode("Once upon a time")?];
/// let fast = generate_with_draft(&model, Some(&mut draft), &prompts, &opts, |_, _| {})?;
/// let plain = generate(&model, &prompts, &opts, |_, _| {})?;
/// assert_eq!(fast.tokens, plain.tokens);
/// println!("{} of {} drafted tokens accepted", fast.accepted, fast.drafted);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn generate_with_draft(
    model: &Model,
    draft: Option<&mut DraftModel>,
    prompts: &[Vec<u32>],
    opts: &GenerateOptions,
    on_token: impl FnMut(usize, u32) + Send,
) -> Result<Generation> {
    if draft.is_some() && opts.lookup > 0 {
        return Err(Error::Invalid(
            "speculative decoding takes its drafts from prompt lookup or from a draft model, not both".into(),
        ));
    }
    crate::kernels::on_pool(|| generate_in_pool(model, draft, prompts, opts, on_token))
}

fn generate_in_pool(
    model: &Model,
    mut draft: Option<&mut DraftModel>,
    prompts: &[Vec<u32>],
    opts: &GenerateOptions,
    mut on_token: impl FnMut(usize, u32),
) -> Result<Generation> {
    opts.sampling.validate()?;
    let ctx = model.config.max_position_embeddings;
    let mut used: Vec<&[u32]> = Vec::with_capacity(prompts.len());
    for (i, p) in prompts.iter().enumerate() {
        if p.is_empty() {
            return Err(Error::Invalid(format!(
                "prompt {} is empty: at least one token is needed",
                i + 1
            )));
        }
        if p.len() > ctx {
            if !opts.truncate_prompt {
                return Err(Error::Invalid(format!(
                    "prompt {} is {} tokens, longer than the model's context of {ctx} tokens (pass --truncate-prompt to keep its end)",
                    i + 1,
                    p.len()
                )));
            }
            // Keep the end of the prompt and leave room for the new tokens.
            let keep = ctx.saturating_sub(opts.max_new_tokens).max(1);
            used.push(&p[p.len() - keep..]);
        } else {
            used.push(p);
        }
    }
    let b = used.len();
    let mut out = Generation {
        tokens: vec![Vec::new(); b],
        prompt_tokens: used.iter().map(|p| p.len()).collect(),
        hit_context: vec![false; b],
        ..Default::default()
    };
    if b == 0 || opts.max_new_tokens == 0 {
        return Ok(out);
    }
    let longest = used.iter().map(|p| p.len()).max().unwrap_or(1);
    // (a speculative step verifies up to `drafted` tokens after the last one)
    let drafted = draft.as_ref().map_or(opts.lookup, |d| d.tokens);
    // `--bf16`: weights packed once, for prefill and decode (`Workspace::keep_bf16_weights`);
    // in f32 the products of few rows (a batch's, a speculative step's) read the weights in
    // panels, as a server's decoding does (`Workspace::keep_f32_panels`), and a lone prompt
    // decoding plainly streams the weights' rows
    let panels = (b > 1 || drafted > 0) && model.quant.is_none();
    Need::inference(&model.config, &[(b, longest)], (b, ctx, model.kv_cache))
        .with_copies(model, panels)
        .check(&format!(
            "generating for {b} prompts of up to {longest} tokens with a context of {ctx}"
        ))?;
    let mut ws = Workspace::for_inference(model, b, longest.max(drafted + 1));
    ws.keep_weight_copies(model, panels);
    let mut caches: Vec<KvCache> = (0..b).map(|_| KvCache::new(model, ctx)).collect();
    let mut rng = ChaCha8Rng::seed_from_u64(opts.seed);
    let mut scratch = Vec::with_capacity(model.config.vocab_size);
    let v = model.config.vocab_size;
    // each prompt's tokens as its penalties see them, and a row of adjusted logits
    let (s, mut buf) = (&opts.sampling, Vec::new());
    let mut seen: Vec<Seen> = used.iter().map(|p| Seen::new(p, &s.penalties)).collect();
    let mut draw = |i: usize, row: &[f32], rng: &mut ChaCha8Rng| {
        let t = sample(
            adjusted(row, s, &seen[i], &[], &mut buf),
            s,
            rng,
            &mut scratch,
        );
        seen[i].push(t);
        t
    };
    // slot → prompt index; slots [0, active) are still generating
    let mut order: Vec<usize> = (0..b).collect();
    let mut last = vec![0u32; b];
    let t0 = Instant::now();
    for (i, p) in used.iter().enumerate() {
        model.forward_cached(&mut ws, &mut caches[i..i + 1], p, p.len(), false)?;
        last[i] = draw(i, &ws.logits[..v], &mut rng);
    }
    out.prefill_seconds = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    // The first tokens came from the prefills; then one decode step for all active sequences.
    let mut active = record_and_retire(
        b,
        &mut order,
        &mut caches,
        &last,
        &mut out,
        opts,
        &mut on_token,
    );
    if drafted > 0 {
        for slot in 0..active {
            let i = order[slot];
            let mut check = |row: &[f32], draft: u32, rng: &mut ChaCha8Rng| {
                let (t, ok) = verify(
                    adjusted(row, s, &seen[i], &[], &mut buf),
                    s,
                    rng,
                    &mut scratch,
                    draft,
                );
                seen[i].push(t);
                (t, ok)
            };
            let seq = Seq {
                prompt: used[i],
                index: i,
            };
            let mut source = match draft.as_deref_mut() {
                Some(d) => {
                    let state = d.state(ctx);
                    Source::Model(d, state)
                }
                None => Source::Lookup(opts.lookup),
            };
            decode_speculative(
                model,
                &mut ws,
                &mut caches[slot],
                seq,
                &mut source,
                &mut out,
                opts,
                &mut rng,
                &mut check,
                &mut on_token,
            )?;
        }
        out.decode_seconds = t1.elapsed().as_secs_f64();
        return Ok(out);
    }
    let mut inputs = vec![0u32; b];
    while active > 0 {
        for s in 0..active {
            inputs[s] = last[order[s]];
        }
        model.forward_cached(&mut ws, &mut caches[..active], &inputs[..active], 1, false)?;
        out.decode_tokens += active;
        for s in 0..active {
            last[order[s]] = draw(order[s], &ws.logits[s * v..(s + 1) * v], &mut rng);
        }
        active = record_and_retire(
            active,
            &mut order,
            &mut caches,
            &last,
            &mut out,
            opts,
            &mut on_token,
        );
    }
    out.decode_seconds = t1.elapsed().as_secs_f64();
    Ok(out)
}

/// Appends each active sequence's newest token (`last`, by prompt index), tells `on_token`, and
/// retires finished sequences by swapping them (slot and cache) behind the active ones.
/// Returns the new number of active slots.
// the decode loop's state (slots, caches, tokens, output) handed to one step of it
#[allow(clippy::too_many_arguments)]
fn record_and_retire(
    mut active: usize,
    order: &mut [usize],
    caches: &mut [KvCache],
    last: &[u32],
    out: &mut Generation,
    opts: &GenerateOptions,
    on_token: &mut impl FnMut(usize, u32),
) -> usize {
    let mut slot = 0;
    while slot < active {
        let i = order[slot];
        out.tokens[i].push(last[i]);
        on_token(i, last[i]);
        if finished(&out.tokens[i], &caches[slot], opts, &mut out.hit_context[i]) {
            active -= 1;
            order.swap(slot, active);
            caches.swap(slot, active);
            // the sequence swapped into this slot is looked at next
        } else {
            slot += 1;
        }
    }
    active
}

/// Whether a sequence is done: its last token is the end-of-text token, it has all its new
/// tokens, or its context is full (the last token could not be fed back).
fn finished(new: &[u32], cache: &KvCache, opts: &GenerateOptions, hit_context: &mut bool) -> bool {
    if opts.eos == new.last().copied() || new.len() >= opts.max_new_tokens {
        return true;
    }
    if cache.len >= cache.capacity {
        *hit_context = true;
        return true;
    }
    false
}

/// One prompt of a generation: its tokens (as used) and its index among the prompts.
struct Seq<'a> {
    prompt: &'a [u32],
    index: usize,
}

/// Where a sequence's drafts come from.
enum Source<'a, 'd> {
    /// prompt lookup, drafts of up to this many tokens
    Lookup(usize),
    /// a draft model, with the sequence's cache of it
    Model(&'a mut DraftModel<'d>, DraftState),
}

/// Decodes one sequence to its end speculatively: each step drafts up to `room` tokens from
/// `source`, feeds the last token and the draft in one forward pass, and `verify(row, drafted
/// token)` takes the drafted tokens in order while they are accepted, then the corrected
/// token (or, all accepted, one more from the last row); the caches keep the accepted
/// positions only. Without a draft a step is plain decoding. Greedy, the text is plain
/// decoding's; sampled, its distribution (`sample::verify`).
// the decode loop's state for one sequence, as `generate_in_pool` holds it
#[allow(clippy::too_many_arguments)]
fn decode_speculative(
    model: &Model,
    ws: &mut Workspace,
    cache: &mut KvCache,
    seq: Seq,
    source: &mut Source,
    out: &mut Generation,
    opts: &GenerateOptions,
    rng: &mut ChaCha8Rng,
    verify: &mut impl FnMut(&[f32], u32, &mut ChaCha8Rng) -> (u32, bool),
    on_token: &mut impl FnMut(usize, u32),
) -> Result<()> {
    let (i, v) = (seq.index, model.config.vocab_size);
    let mut text: Vec<u32> = seq.prompt.iter().chain(&out.tokens[i]).copied().collect();
    let mut done = finished(&out.tokens[i], cache, opts, &mut out.hit_context[i]);
    while !done {
        // 1. A draft that fits the tokens still wanted and the cache
        let room = (opts.max_new_tokens - out.tokens[i].len())
            .min(cache.capacity - cache.len)
            .saturating_sub(1);
        let draft = match source {
            Source::Lookup(n) => lookup_draft(&text, (*n).min(room)),
            Source::Model(d, state) => d.draft(state, &text, room)?,
        };
        let inputs: Vec<u32> = std::iter::once(*text.last().unwrap())
            .chain(draft.iter().copied())
            .collect();
        // 2. The last token and the draft in one pass, every position's logits
        let at = cache.len;
        model.forward_cached(ws, std::slice::from_mut(cache), &inputs, inputs.len(), true)?;
        // 3. The drafted tokens while accepted, then the corrected or the next token
        let mut new = Vec::with_capacity(inputs.len());
        for (k, row) in ws.logits[..inputs.len() * v].chunks(v).enumerate() {
            let (t, ok) = verify(row, draft.get(k).copied().unwrap_or(u32::MAX), rng);
            new.push(t);
            if !ok || k == draft.len() {
                break;
            }
        }
        out.drafted += draft.len();
        out.accepted += new.len() - 1;
        // the caches keep the inputs up to the last accepted draft
        cache.len = at + new.len();
        if let Source::Model(_, state) = source {
            state.keep(text.len() + new.len() - 1);
        }
        for t in new {
            out.tokens[i].push(t);
            out.decode_tokens += 1;
            on_token(i, t);
            text.push(t);
            done = finished(&out.tokens[i], cache, opts, &mut out.hit_context[i]);
            if done {
                break;
            }
        }
    }
    Ok(())
}
