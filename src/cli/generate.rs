//! `difftx generate`: continue prompts with the KV cache, streaming a single prompt.

use anyhow::{bail, Context, Result};
use clap::Args;
use difftx::data::Tokenizer;
use difftx::infer::Penalties;
use std::path::PathBuf;

#[derive(Args)]
pub struct GenerateArgs {
    /// Model directory (native difftx, or Hugging Face llama / diffllama / difftx_diffv2), or a
    /// training run folder, which stands for its newest complete checkpoint.
    #[arg(long)]
    pub model: PathBuf,
    #[arg(long, help = super::QUANT_HELP)]
    pub quant: Option<String>,
    #[arg(long, default_value = "f32", help = super::KV_CACHE_HELP)]
    pub kv_cache: String,
    /// Prompt text; repeat the flag (or mix with --prompt-file) to generate a batch, whose
    /// continuations print each under a line `=== prompt I of N ===` (or see --json).
    #[arg(long)]
    pub prompt: Vec<String>,
    /// Read a prompt from a file (the whole file is one prompt); may be repeated.
    #[arg(long)]
    pub prompt_file: Vec<PathBuf>,
    /// Tokens to generate after each prompt (fewer if the end-of-text token or the end of the
    /// context comes first).
    #[arg(long, default_value_t = 100)]
    pub max_new_tokens: usize,
    /// 0 is greedy decoding.
    #[arg(long, default_value_t = 0.8)]
    pub temperature: f32,
    /// Sample only among the K most likely tokens.
    #[arg(long)]
    pub top_k: Option<usize>,
    /// Sample only among the most likely tokens whose probabilities add up to P.
    #[arg(long)]
    pub top_p: Option<f32>,
    /// Take this off the logit of every token generated so far, once (OpenAI's presence
    /// penalty, in [-2, 2]; positive values steer away from repeats, greedy decoding included).
    #[arg(long, default_value_t = Penalties::NONE.presence, allow_negative_numbers = true)]
    pub presence_penalty: f32,
    /// Take this off a token's logit for every time it was generated so far (OpenAI's frequency
    /// penalty, in [-2, 2]).
    #[arg(long, default_value_t = Penalties::NONE.frequency, allow_negative_numbers = true)]
    pub frequency_penalty: f32,
    /// Divide the positive logit of every token in the prompt or generated so far by this, and
    /// multiply a negative one (transformers' and vLLM's repetition penalty; 1 is none, 1.1–1.3
    /// are common).
    #[arg(long, default_value_t = Penalties::NONE.repetition, allow_negative_numbers = true)]
    pub repetition_penalty: f32,
    /// Seed of the sampling generator (same seed, same text).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Keep the end of a prompt longer than the context instead of failing.
    #[arg(long)]
    pub truncate_prompt: bool,
    /// Speculative decoding by prompt lookup: draft up to N tokens a step from what followed
    /// the last 3 (else 2, else 1) tokens earlier in the text, and verify them in one forward
    /// pass. Greedy text is unchanged, sampled text keeps its distribution; fastest where the
    /// output repeats the prompt (code, quotes, edits). `--stats` reports the acceptance.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub lookup: usize,
    #[command(flatten)]
    pub draft: super::draft::DraftArgs,
    /// Print prefill and decode tokens/s to stderr.
    #[arg(long)]
    pub stats: bool,
    /// Print one JSON object per prompt on stdout (prompt, continuation, token counts, whether
    /// the context filled, and the batch's prefill and decode seconds) instead of the text.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: GenerateArgs, precision: difftx::kernels::Precision) -> Result<()> {
    use std::io::Write;
    let sampling = difftx::infer::Sampling {
        temperature: a.temperature,
        top_k: a.top_k,
        top_p: a.top_p,
        penalties: Penalties {
            presence: a.presence_penalty,
            frequency: a.frequency_penalty,
            repetition: a.repetition_penalty,
        },
    };
    sampling.validate()?;
    let quant = super::quant_kind(a.quant.as_deref())?;
    let kv_cache = super::kv_kind(&a.kv_cache)?;
    let (mut model, dir) = super::load_model(&a.model, precision)?;
    super::quantize(&mut model, quant);
    model.kv_cache = kv_cache;
    let tok = Tokenizer::for_model(&dir, &model.config)?;
    let draft_model = a.draft.load(&model, &tok)?;
    let mut draft = draft_model
        .as_ref()
        .map(|d| difftx::infer::DraftModel::new(d, &model, a.draft.draft_tokens))
        .transpose()?;
    let mut texts = a.prompt.clone();
    for f in &a.prompt_file {
        texts.push(std::fs::read_to_string(f).with_context(|| format!("{}", f.display()))?);
    }
    if texts.is_empty() {
        bail!("give a prompt with --prompt TEXT or --prompt-file FILE");
    }
    let prompts = texts
        .iter()
        .map(|t| tok.encode(t))
        .collect::<difftx::Result<Vec<_>>>()?;
    let opts = difftx::infer::GenerateOptions {
        max_new_tokens: a.max_new_tokens,
        sampling,
        seed: a.seed,
        eos: tok.eos_id(&model.config),
        truncate_prompt: a.truncate_prompt,
        lookup: a.lookup,
    };
    let single = prompts.len() == 1 && !a.json;
    let mut stream = difftx::data::tokenizer::TextStream::default();
    let g =
        difftx::infer::generate_with_draft(&model, draft.as_mut(), &prompts, &opts, |_, id| {
            // One prompt streams as it goes; a batch prints each continuation at the end.
            if single {
                if let Ok(piece) = stream.push(&tok, id) {
                    let mut stdout = std::io::stdout().lock();
                    let _ = stdout.write_all(piece.as_bytes());
                    let _ = stdout.flush();
                }
            }
        })?;
    let mut stdout = std::io::stdout().lock();
    if single {
        let _ = stdout.write_all(stream.finish(&tok)?.as_bytes());
        let _ = writeln!(stdout);
    } else if a.json {
        for (i, ids) in g.tokens.iter().enumerate() {
            let line = serde_json::json!({
                "prompt": texts[i],
                "continuation": tok.decode(ids)?,
                "prompt_tokens": g.prompt_tokens[i],
                "new_tokens": ids.len(),
                "hit_context": g.hit_context[i],
                "prefill_seconds": g.prefill_seconds,
                "decode_seconds": g.decode_seconds,
                "batch": prompts.len(),
            });
            let _ = writeln!(stdout, "{line}");
        }
    } else {
        // A batch: each continuation under a line naming its prompt, since a continuation
        // may hold blank lines of its own.
        for (i, ids) in g.tokens.iter().enumerate() {
            let _ = writeln!(stdout, "=== prompt {} of {} ===", i + 1, g.tokens.len());
            let _ = writeln!(stdout, "{}", tok.decode(ids)?);
        }
    }
    for (i, &full) in g.hit_context.iter().enumerate() {
        if full {
            eprintln!(
                "warning: prompt {}: stopped at the context limit ({} tokens) after {} new tokens",
                i + 1,
                model.config.max_position_embeddings,
                g.tokens[i].len()
            );
        }
    }
    if a.stats {
        eprintln!(
            "prefill: {} tokens in {:.3} s ({:.0} tokens/s); decode: {} tokens in {:.3} s ({:.1} tokens/s), batch {}",
            g.prompt_tokens.iter().sum::<usize>(),
            g.prefill_seconds,
            g.prefill_tokens_per_second(),
            g.decode_tokens,
            g.decode_seconds,
            g.decode_tokens_per_second(),
            prompts.len()
        );
        if a.lookup > 0 || draft.is_some() {
            let by = if a.lookup > 0 {
                "lookup"
            } else {
                "draft model"
            };
            eprintln!(
                "{by}: {} of {} drafted tokens accepted ({:.0}%)",
                g.accepted,
                g.drafted,
                100.0 * g.acceptance()
            );
        }
    }
    Ok(())
}
