//! `difftx serve`: an OpenAI-compatible HTTP server over one model (docs/SERVING.md).

use anyhow::Result;
use clap::Args;
use difftx::kernels::Precision;
use difftx::serve::{serve, ServeOptions, Speculate};
use std::path::PathBuf;
use std::time::Duration;

#[derive(Args)]
pub struct ServeArgs {
    /// Model directory (native difftx, or Hugging Face llama / diffllama / difftx_diffv2), or a
    /// training run folder, which stands for its newest complete checkpoint.
    #[arg(long)]
    pub model: PathBuf,
    #[arg(long, help = super::QUANT_HELP)]
    pub quant: Option<String>,
    /// Address to listen on (0.0.0.0 for every interface).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0: one the system picks, printed on stderr).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Require `Authorization: Bearer KEY` on every API route (not /health or /metrics).
    #[arg(long, value_name = "KEY")]
    pub api_key: Option<String>,
    /// Sequences decoded together at most (continuous batching); more requests wait in the queue.
    #[arg(long, default_value_t = 16)]
    pub parallel: usize,
    /// Requests waiting for a batch slot at most; beyond that the server answers 429.
    #[arg(long, default_value_t = 256)]
    pub max_queue: usize,
    /// Prompt tokens prefilled per engine step: a newcomer's prompt is cut into chunks of
    /// this size between the running batch's decode steps. Also the prefix cache's block:
    /// requests share whole chunks.
    #[arg(long, default_value_t = 64)]
    pub prefill_chunk: usize,
    /// MiB of prompt blocks kept for later requests that start with the same tokens (a
    /// few-shot preamble, a chat history, one context scored with several continuations),
    /// evicted least recently used; 0 keeps none. Outputs are the same with it or without.
    #[arg(long, value_name = "MIB", default_value_t = 256)]
    pub prefix_cache: usize,
    /// Request bodies larger than this many bytes are refused (413).
    #[arg(long, default_value_t = 4 << 20)]
    pub max_body_bytes: usize,
    /// Seconds in-flight requests may run on after SIGTERM/SIGINT before they are cancelled.
    #[arg(long, default_value_t = 5.0)]
    pub grace: f64,
    /// Name of the model in /v1/models and in requests' `model` field [default: the
    /// directory's name].
    #[arg(long)]
    pub name: Option<String>,
    #[arg(long, default_value = "f32", help = super::KV_CACHE_HELP)]
    pub kv_cache: String,
    /// Speculative decoding by prompt lookup: each step drafts up to N tokens per sequence
    /// from what followed its last tokens earlier in its text, verified in one forward pass
    /// with the batch (fewer as the batch grows: 16 rows a step at most, none from 16
    /// sequences). Greedy answers are the same tokens with it or without, sampled ones keep
    /// their distribution (log-probabilities may differ in the last bits); /metrics counts
    /// the acceptance.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub lookup: usize,
    #[command(flatten)]
    pub draft: super::draft::DraftArgs,
}

pub fn run(a: ServeArgs, precision: Precision) -> Result<()> {
    let quant = super::quant_kind(a.quant.as_deref())?;
    let kv_cache = super::kv_kind(&a.kv_cache)?;
    let name = a.name.clone().unwrap_or_else(|| {
        let p = a.model.canonicalize().unwrap_or_else(|_| a.model.clone());
        p.file_name()
            .map_or("difftx".into(), |n| n.to_string_lossy().into_owned())
    });
    if !(a.grace >= 0.0 && a.grace.is_finite()) {
        anyhow::bail!(
            "--grace must be a number of seconds, 0 or more, got {}",
            a.grace
        );
    }
    for (flag, dir) in [
        ("--model", Some(&a.model)),
        ("--draft-model", a.draft.draft_model.as_ref()),
    ] {
        if let Some(d) = dir.filter(|d| !d.exists()) {
            anyhow::bail!("{flag} {}: no such directory", d.display());
        }
    }
    let speculate = match (a.draft.given()?, a.lookup) {
        (Some((dir, tokens)), _) => Speculate::Draft {
            dir: dir.clone(),
            tokens,
        },
        (None, 0) => Speculate::Off,
        (None, n) => Speculate::Lookup(n),
    };
    let opts = ServeOptions {
        host: a.host,
        port: a.port,
        api_key: a.api_key,
        parallel: a.parallel,
        max_queue: a.max_queue,
        chunk: a.prefill_chunk,
        max_body_bytes: a.max_body_bytes,
        prefix_cache: a.prefix_cache.saturating_mul(1 << 20),
        name,
        grace: Duration::from_secs_f64(a.grace),
        speculate,
    };
    let model = a.model.clone();
    let load = Box::new(move || {
        let (mut m, dir) = super::load_model(&model, precision).map_err(|e| format!("{e:#}"))?;
        super::quantize(&mut m, quant);
        m.kv_cache = kv_cache;
        Ok((m, dir))
    });
    serve(opts, load, |addr| {
        eprintln!("difftx serve: listening on http://{addr} (loading the model)");
    })?;
    Ok(())
}
