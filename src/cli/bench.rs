//! `difftx bench …`: speed and memory benchmarks (train step, matmul, decode, attention,
//! memory, bf16 against f32).

use super::percent;
use super::progress::progress;
use anyhow::{bail, Result};
use clap::{Args, Subcommand};
use difftx::kernels::Precision;
use difftx::util::thousands;
use difftx::{AttentionKind, Model, ModelConfig, Preset};
use std::path::PathBuf;

#[derive(Subcommand)]
pub enum BenchCmd {
    /// Median time of a full training step (forward, backward, AdamW) on random tokens.
    ///
    /// Example: difftx bench train --preset bench --attention diff_v1
    Train(BenchTrainArgs),
    /// GFLOP/s of one matrix product: difftx's kernels (f32, bf16, q8_0, q4_0) against the
    /// `gemm` crate, alternating.
    ///
    /// Example: difftx bench matmul --m 512 --n 2816 --k 512 --layout nt
    ///
    /// bf16 runs where the CPU has bf16 products (see --bf16); with --layout nt the weights are also packed
    /// beforehand and quantised, as inference runs them.
    Matmul(BenchMatmulArgs),
    /// Prefill and greedy decode tokens/s, at batch 1 or --batch N.
    ///
    /// Example: difftx bench decode --preset medium --attention standard --quant q8_0
    Decode(BenchDecodeArgs),
    /// One layer's attention kernel, forward and backward, on a preset's head layout.
    ///
    /// Example: difftx bench attention --preset bench
    Attention(BenchAttentionArgs),
    /// Peak memory of a training step against what the buffers add up to.
    ///
    /// Example: difftx bench memory --preset small --seq 4096 --batch 8
    Memory(BenchMemoryArgs),
    /// The same short training run in f32 and in bf16: step times, loss curves, a PNG.
    ///
    /// Example: difftx bench bf16 --preset bench --plot bf16_loss.png
    Bf16(BenchBf16Args),
    /// Content digests: XXH3-128 over a file, or a model's manifest check against its load.
    ///
    /// Example: difftx bench digest model/
    Digest(BenchDigestArgs),
    /// Closed-loop load on a running OpenAI-compatible server (difftx serve, llama-server).
    ///
    /// Example: difftx bench serve --url http://127.0.0.1:8080 --clients 1,16
    ///
    /// Per client count: aggregate tokens/s, p50/p99 time to first token and per-token
    /// latency, errors and, with --pid, the server's peak RSS.
    Serve(BenchServeArgs),
}

pub fn run(cmd: BenchCmd, precision: Precision) -> Result<()> {
    match cmd {
        BenchCmd::Train(a) => train(a, precision),
        BenchCmd::Bf16(a) => bf16(a),
        BenchCmd::Memory(a) => memory(a, precision),
        BenchCmd::Attention(a) => attention(a, precision),
        BenchCmd::Decode(a) => decode(a, precision),
        BenchCmd::Matmul(a) => matmul(a),
        BenchCmd::Digest(a) => digest(a),
        BenchCmd::Serve(a) => serve_load(a),
    }
}

#[derive(Args)]
pub struct BenchServeArgs {
    /// The server: http://HOST:PORT.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    pub url: String,
    /// Client counts, one level each, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,4,16,64")]
    pub clients: Vec<usize>,
    /// Tokens each request asks for (greedy; `ignore_eos` where the server knows it).
    #[arg(long, default_value_t = 128)]
    pub tokens: usize,
    /// Seconds each level runs.
    #[arg(long, default_value_t = 30.0)]
    pub seconds: f64,
    /// Start client i at i·S/C seconds (closed-loop clients started together stay in waves),
    /// and count tokens/s and latencies from the last client's start: the steady state.
    #[arg(long, default_value_t = 0.0)]
    pub stagger: f64,
    /// Probability that a request hangs up after a random number of tokens (a soak's
    /// cancellations, counted apart from errors).
    #[arg(long, default_value_t = 0.0)]
    pub disconnect: f64,
    /// The server's process id: its resident memory while each level runs, and its peak.
    #[arg(long)]
    pub pid: Option<u32>,
    /// Seconds between readings of the server's resident memory (with --pid).
    #[arg(long, default_value_t = 10.0)]
    pub rss_every: f64,
    /// The `model` field to send (llama-server ignores it).
    #[arg(long)]
    pub model: Option<String>,
    /// One JSON object per level on stdout instead of the table.
    #[arg(long)]
    pub json: bool,
}

fn serve_load(a: BenchServeArgs) -> Result<()> {
    use difftx::experiments::serve_load::{level, parse_url, LoadOptions};
    let o = LoadOptions {
        addr: parse_url(&a.url)?,
        tokens: a.tokens,
        seconds: a.seconds,
        model: a.model,
        disconnect: a.disconnect,
        stagger: a.stagger,
        pid: a.pid,
        rss_every: a.rss_every,
    };
    o.check(&a.clients)?;
    if !a.json {
        println!("clients  requests  tok/s    TTFT p50/p99 ms    per-token p50/p99 ms  errors  peak RSS MiB");
    }
    for &c in &a.clients {
        let r = level(&o, c)?;
        if a.json {
            println!("{}", serde_json::to_string(&r)?);
            continue;
        }
        let rss = r
            .peak_rss_mib
            .map(|m| format!("{m:.0}"))
            .unwrap_or_default();
        println!(
            "{:7}  {:8}  {:6.1}  {:8.1} / {:8.1}  {:8.2} / {:8.2}  {:6}  {rss}",
            c,
            r.requests,
            r.tokens_per_s,
            r.ttft_p50_ms,
            r.ttft_p99_ms,
            r.token_p50_ms,
            r.token_p99_ms,
            r.errors
        );
        if let Some(e) = r.first_errors.first() {
            println!("         first error: {e}");
        }
        if let (Some(first), Some(last)) = (r.rss_mib_series.first(), r.rss_mib_series.last()) {
            let mid = r.rss_mib_series[r.rss_mib_series.len() / 2];
            println!(
                "         RSS MiB first / middle / last: {first:.0} / {mid:.0} / {last:.0} ({} readings); cancelled {}",
                r.rss_mib_series.len(),
                r.cancelled
            );
        }
    }
    Ok(())
}

#[derive(Args)]
pub struct BenchDigestArgs {
    /// A file (its digest's throughput is measured) or a model directory with a manifest.json
    /// (its verification and its whole load are timed, alternating).
    pub path: PathBuf,
    /// Timed rounds; medians are reported.
    #[arg(long, default_value_t = 5)]
    pub rounds: usize,
}

fn digest(a: BenchDigestArgs) -> Result<()> {
    use difftx::util::manifest::{digest_file, verify};
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let time = |f: &mut dyn FnMut() -> Result<()>| -> Result<f64> {
        let t = std::time::Instant::now();
        f()?;
        Ok(t.elapsed().as_secs_f64())
    };
    let rounds = a.rounds.max(1);
    // 1. A file: XXH3-128 throughput (the first read warms the page cache, untimed)
    if a.path.is_file() {
        let (size, _) = digest_file(&a.path).map_err(|e| difftx::Error::io(&a.path, e))?;
        let mut ts = Vec::new();
        for _ in 0..rounds {
            ts.push(time(&mut || {
                digest_file(&a.path).map_err(|e| difftx::Error::io(&a.path, e))?;
                Ok(())
            })?);
        }
        let t = median(ts);
        println!(
            "{}: {} bytes, xxh3-128 in {:.1} ms median of {rounds}: {:.2} GB/s",
            a.path.display(),
            thousands(size as usize),
            1e3 * t,
            size as f64 / t / 1e9
        );
        return Ok(());
    }
    // 2. A directory: verification against the whole load (which verifies too), alternating
    if !verify(&a.path)? {
        bail!("{}: no manifest.json to verify", a.path.display());
    }
    let (mut tv, mut tl) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        tv.push(time(&mut || Ok(verify(&a.path).map(|_| ())?))?);
        tl.push(time(&mut || {
            Ok(difftx::interop::load(&a.path).map(|_| ())?)
        })?);
    }
    let (v, l) = (median(tv), median(tl));
    println!(
        "{}: verify {:.1} ms, whole load {:.1} ms (medians of {rounds}, alternating): verification is {} of the load",
        a.path.display(),
        1e3 * v,
        1e3 * l,
        percent(v / l)
    );
    Ok(())
}

/// The model a benchmark builds: a preset of one attention kind, its batch and context.
#[derive(Args)]
pub struct BenchShape {
    /// tiny, bench, small, medium or large (`difftx presets` shows each shape)
    #[arg(long, default_value = "bench")]
    pub preset: Preset,
    /// standard, diff_v1 or diff_v2
    #[arg(long, default_value = "diff_v1")]
    pub attention: AttentionKind,
    /// Sequences per step.
    #[arg(long, default_value_t = 8)]
    pub batch: usize,
    /// Override the preset's context length.
    #[arg(long)]
    pub seq: Option<usize>,
}

impl BenchShape {
    fn config(&self) -> Result<ModelConfig> {
        let mut c = ModelConfig::preset(self.preset, self.attention);
        if let Some(t) = self.seq {
            c.max_position_embeddings = t;
        }
        if self.batch == 0 || c.max_position_embeddings == 0 {
            bail!("--batch and --seq must be positive");
        }
        Ok(c)
    }
}

#[derive(Args)]
pub struct BenchTrainArgs {
    #[command(flatten)]
    pub shape: BenchShape,
    /// Steps run first and not timed (buffers, caches and thread pools settle).
    #[arg(long, default_value_t = 3)]
    pub warmup: usize,
    /// Timed steps; the median is reported, with the min and max.
    #[arg(long, default_value_t = 10)]
    pub steps: usize,
    /// Print one JSON object on stdout (step_ms, tokens_per_second, peak_rss_bytes, ...).
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
pub struct BenchBf16Args {
    #[command(flatten)]
    pub shape: BenchShape,
    /// Training steps of each run.
    #[arg(long, default_value_t = 300)]
    pub steps: u64,
    /// Peak learning rate (warm-up, then cosine to a tenth).
    #[arg(long, default_value_t = 1e-3)]
    pub lr: f32,
    /// Linear warm-up steps of the learning rate.
    #[arg(long, default_value_t = 30)]
    pub warmup: u64,
    /// Text to train on, byte-level: a file, or a folder of fortune files. Default: Debian's
    /// fortunes (/usr/share/games/fortunes) where installed, else the built-in demo text.
    #[arg(long)]
    pub corpus: Option<PathBuf>,
    /// Write both loss curves (means over 10 steps) to this PNG.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Print one JSON object on stdout (both curves included).
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
pub struct BenchMemoryArgs {
    #[command(flatten)]
    pub shape: BenchShape,
    /// Print one JSON object on stdout.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
pub struct BenchAttentionArgs {
    #[command(flatten)]
    pub shape: BenchShape,
    /// Timed repetitions of the forward and the backward; the median is reported.
    #[arg(long, default_value_t = 5)]
    pub reps: usize,
    /// Print one JSON object on stdout.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
pub struct BenchDecodeArgs {
    /// A model directory or training run folder; without it, a freshly initialised
    /// --preset/--attention model.
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Preset of the fresh model (without --model).
    #[arg(long, default_value = "bench")]
    pub preset: Preset,
    /// Attention kind of the fresh model (without --model): standard, diff_v1 or diff_v2.
    #[arg(long, default_value = "diff_v1")]
    pub attention: AttentionKind,
    /// Vocabulary of the fresh model (without --model) [default: the preset's 256 bytes];
    /// 32000 measures decoding at a real tokenizer's LM head.
    #[arg(long)]
    pub vocab_size: Option<usize>,
    #[arg(long, help = super::QUANT_HELP)]
    pub quant: Option<String>,
    #[arg(long, default_value = "f32", help = super::KV_CACHE_HELP)]
    pub kv_cache: String,
    /// Prompt tokens (prefill) [default: 128, or half the context if that is less].
    #[arg(long)]
    pub prompt_len: Option<usize>,
    /// Tokens decoded after the prompt [default: 128, or what the context has left].
    #[arg(long)]
    pub new_tokens: Option<usize>,
    /// Timed repetitions; the median is reported.
    #[arg(long, default_value_t = 3)]
    pub reps: usize,
    /// Sequences decoded together (each its own seeded random prompt), with the products that
    /// `serve --parallel N` uses (a sequence's numbers do not depend on the others); tokens/s
    /// counts every sequence's tokens.
    #[arg(long, default_value_t = 1)]
    pub batch: usize,
    /// Also measure read bandwidth, of main memory (before and after each repetition, since a
    /// shared machine's rate moves from minute to minute) and of a buffer the size of the
    /// weights and KV cache (cache-resident where it fits), and compare each token's time with
    /// reading those bytes once at each rate.
    #[arg(long)]
    pub bandwidth: bool,
    /// Also time each phase of the prefill and of a decoding step (the norms, the q/k/v
    /// products, the attention with its cache writes, o_proj, the MLP, the LM head) and print
    /// where their time goes (the medians over the repetitions; the clock costs a few
    /// microseconds a step).
    #[arg(long)]
    pub phases: bool,
    /// Decode after this text (its first --prompt-len tokens, all of them by default) instead
    /// of random tokens: with --lookup, a text whose continuation repeats it.
    #[arg(long, value_name = "FILE")]
    pub prompt_file: Option<PathBuf>,
    /// Speculative decoding by prompt lookup with drafts of up to N tokens (as `generate
    /// --lookup N`); the acceptance is printed.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub lookup: usize,
    #[command(flatten)]
    pub draft: super::draft::DraftArgs,
    /// Print one JSON object on stdout.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
pub struct BenchMatmulArgs {
    /// M = N = K unless --m/--n/--k are given.
    #[arg(long, default_value_t = 1024)]
    pub size: usize,
    /// Rows of A and C.
    #[arg(long)]
    pub m: Option<usize>,
    /// Columns of B and C.
    #[arg(long)]
    pub n: Option<usize>,
    /// The shared dimension: columns of A, rows of B.
    #[arg(long)]
    pub k: Option<usize>,
    /// Timed repetitions per backend; the median is reported.
    #[arg(long, default_value_t = 20)]
    pub reps: usize,
    /// Operand storage: nn (both row-major), nt (B stored transposed: X·Wᵀ, a linear layer's
    /// forward) or tn (A stored transposed: dYᵀ·X, its weight gradient).
    #[arg(long, default_value = "nn", value_parser = ["nn", "nt", "tn"])]
    pub layout: String,
    /// A and C from main memory, as inside a training step (whose activations do not stay in
    /// the caches): each repetition takes the next of enough copies of them to overflow the L3.
    /// B (a weight) stays cached.
    #[arg(long)]
    pub cold: bool,
    /// One JSON object per backend on stdout.
    #[arg(long)]
    pub json: bool,
}

fn train(a: BenchTrainArgs, precision: Precision) -> Result<()> {
    let config = a.shape.config()?;
    if a.steps == 0 {
        bail!("--steps must be positive");
    }
    let pb = progress((a.warmup + a.steps) as u64, "steps");
    let r = difftx::experiments::bench::bench_train(
        &config,
        precision,
        a.shape.batch,
        a.warmup,
        a.steps,
        |_, _| pb.inc(1),
    )?;
    pb.finish_and_clear();
    if a.json {
        println!("{}", serde_json::to_string(&r)?);
    } else {
        let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
        println!(
            "{} {} ({} params), batch {} × {} tokens, {} threads, {} matrix products",
            a.shape.preset.as_str(),
            r.attention,
            r.params,
            r.batch,
            r.seq,
            r.threads,
            r.precision
        );
        println!(
            "step {:.1} ms median (min {:.1}, max {:.1}) over {} steps  |  {:.0} tokens/s  |  {:.1} GFLOP/s ({:.2} GFLOP/step)",
            r.step_ms,
            r.step_ms_min,
            r.step_ms_max,
            r.steps,
            r.tokens_per_second,
            r.gflops,
            r.flops_per_step / 1e9
        );
        println!(
            "memory: peak RSS {:.1} MiB; params+grads+AdamW {:.1} MiB; activations+scratch {:.1} MiB",
            mib(r.peak_rss_bytes),
            mib(r.state_bytes),
            mib(r.workspace_bytes)
        );
    }
    Ok(())
}

fn bf16(a: BenchBf16Args) -> Result<()> {
    use difftx::experiments::corpus::{load_fortunes, FORTUNES_DIR};
    use difftx::report::lines::{plot_lines, Axes, Line, Point};
    let config = a.shape.config()?;
    if a.steps == 0 {
        bail!("--steps must be positive");
    }
    let (text, source) = match &a.corpus {
        Some(p) => (load_fortunes(p)?, p.display().to_string()),
        None if std::path::Path::new(FORTUNES_DIR).is_dir() => (
            load_fortunes(std::path::Path::new(FORTUNES_DIR))?,
            FORTUNES_DIR.to_string(),
        ),
        None => (
            difftx::experiments::demo::DEMO_TEXT.as_bytes().to_vec(),
            "the built-in demo text".to_string(),
        ),
    };
    let run = difftx::train::in_memory::ShortRun {
        steps: a.steps,
        batch: a.shape.batch,
        context: config.max_position_embeddings,
        lr: a.lr,
        warmup: a.warmup.min(a.steps),
    };
    eprintln!(
        "bench bf16: {} {}, {} steps × {} × {} bytes of {source} ({} bytes), f32 then bf16",
        a.shape.preset.as_str(),
        config.attention,
        run.steps,
        run.batch,
        run.context,
        thousands(text.len())
    );
    let pb = progress(2 * a.steps, "steps");
    let r = difftx::experiments::bench::bench_bf16(&config, &run, &text, |tag, _| {
        pb.set_message(tag.to_string());
        pb.inc(1)
    })?;
    pb.finish_and_clear();
    if let Some(path) = &a.plot {
        let line = |p: &difftx::experiments::bench::PrecisionRun| Line {
            label: format!("{} products (val {:.4})", p.precision, p.val_loss),
            points: difftx::experiments::bench::window_means(&p.losses)
                .into_iter()
                .enumerate()
                .map(|(i, y)| Point {
                    x: ((i + 1) * difftx::experiments::bench::WINDOW).min(p.losses.len()) as f64,
                    y,
                    sd: None,
                })
                .collect(),
        };
        let title = format!(
            "{} {}: training loss, f32 vs bf16 matrix products (max gap {})",
            a.shape.preset.as_str(),
            r.attention,
            percent(r.max_window_rel_diff)
        );
        plot_lines(
            &[line(&r.f32), line(&r.bf16)],
            &Axes {
                title: &title,
                x_label: "step",
                y_label: "training loss (nats/byte, 10-step means)",
                log_x: false,
                y_range: None,
            },
            path,
        )?;
        eprintln!("bench bf16: wrote {}", path.display());
    }
    if a.json {
        println!("{}", serde_json::to_string(&r)?);
    } else {
        let tail = |p: &difftx::experiments::bench::PrecisionRun| {
            let w = &p.losses[p
                .losses
                .len()
                .saturating_sub(difftx::experiments::bench::WINDOW)..];
            w.iter().sum::<f32>() / w.len() as f32
        };
        println!(
            "{} ({} params), batch {} × {} tokens, {} threads",
            r.attention, r.params, r.batch, r.seq, r.threads
        );
        for p in [&r.f32, &r.bf16] {
            println!(
                "{:>4}: step {:.1} ms median  |  final training loss {:.4}  |  val loss {:.4}",
                p.precision,
                p.step_ms,
                tail(p),
                p.val_loss
            );
        }
        println!(
            "bf16 vs f32: {:.2}× faster per step; loss curves (10-step means) differ by at most {}, {} at the end; val loss by {} ({} 1%)",
            r.speedup,
            percent(r.max_window_rel_diff),
            percent(r.final_rel_diff),
            percent(r.val_rel_diff),
            if r.max_window_rel_diff <= 0.01 && r.val_rel_diff <= 0.01 { "within" } else { "NOT within" }
        );
    }
    Ok(())
}

fn memory(a: BenchMemoryArgs, precision: Precision) -> Result<()> {
    let config = a.shape.config()?;
    let r = difftx::experiments::bench::bench_train(
        &config,
        precision,
        a.shape.batch,
        0,
        1,
        |_, _| {},
    )?;
    let computed = r.state_bytes + r.workspace_bytes;
    let ratio = r.peak_rss_bytes as f64 / computed as f64;
    if a.json {
        println!(
            "{}",
            serde_json::json!({
                "preset": a.shape.preset.as_str(), "attention": r.attention, "batch": r.batch, "seq": r.seq,
                "params": r.params, "state_bytes": r.state_bytes, "workspace_bytes": r.workspace_bytes,
                "computed_bytes": computed, "peak_rss_bytes": r.peak_rss_bytes, "ratio": ratio,
                "step_ms": r.step_ms
            })
        );
    } else {
        let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
        println!(
            "{} {} ({} params), batch {} × {} tokens: params+grads+AdamW {:.1} MiB + activations and scratch {:.1} MiB = {:.1} MiB computed; peak RSS {:.1} MiB ({:.3}× computed). Attention keeps no T×T matrix.",
            a.shape.preset.as_str(), r.attention, r.params, r.batch, r.seq, mib(r.state_bytes), mib(r.workspace_bytes), mib(computed), mib(r.peak_rss_bytes), ratio
        );
    }
    Ok(())
}

fn attention(a: BenchAttentionArgs, precision: Precision) -> Result<()> {
    let c = a.shape.config()?;
    let r =
        difftx::experiments::bench::bench_attention(&c, precision, a.shape.batch, a.reps.max(1));
    if a.json {
        println!("{}", serde_json::to_string(&r)?);
    } else {
        println!(
            "{} attention, batch {} × {} tokens, {} threads: forward {:.2} ms ({:.1} GFLOP/s), backward {:.2} ms ({:.1} GFLOP/s)",
            r.attention, r.batch, r.seq, r.threads, r.forward_ms, r.forward_gflops, r.backward_ms, r.backward_gflops
        );
    }
    Ok(())
}

fn decode(a: BenchDecodeArgs, precision: Precision) -> Result<()> {
    let quant = super::quant_kind(a.quant.as_deref())?;
    let kv_cache = super::kv_kind(&a.kv_cache)?;
    let (mut model, tok) = match &a.model {
        Some(_) if a.vocab_size.is_some() => {
            bail!("--vocab-size sizes a fresh model; a --model keeps its own vocabulary")
        }
        Some(dir) => {
            let (m, dir) = super::load_model(dir, precision)?;
            let tok = difftx::data::Tokenizer::for_model(&dir, &m.config)?;
            (m, tok)
        }
        None => {
            let config = super::preset_config(a.preset, a.attention, a.vocab_size)?;
            let mut m = Model::init(config, 0)?;
            m.precision = precision;
            (m, difftx::data::Tokenizer::Bytes)
        }
    };
    super::quantize(&mut model, quant);
    model.kv_cache = kv_cache;
    let draft = a.draft.load(&model, &tok)?;
    let ctx = model.config.max_position_embeddings;
    let text = match &a.prompt_file {
        Some(f) => {
            let t = std::fs::read_to_string(f)
                .map_err(|e| anyhow::anyhow!("cannot read --prompt-file {}: {e}", f.display()))?;
            Some(tok.encode(&t)?)
        }
        None => None,
    };
    let prompt_len = match (&text, a.prompt_len) {
        (Some(t), Some(n)) if n > t.len() => bail!(
            "--prompt-len {n} is longer than --prompt-file's {} tokens",
            t.len()
        ),
        (Some(t), None) => t.len().min(ctx.saturating_sub(1)).max(1),
        (_, n) => n.unwrap_or(128.min(ctx / 2).max(1)),
    };
    let new_tokens = a
        .new_tokens
        .unwrap_or(128.min(ctx.saturating_sub(prompt_len)).max(1));
    let r = difftx::experiments::bench::bench_decode(
        &model,
        prompt_len,
        new_tokens,
        a.reps,
        a.batch,
        (a.bandwidth, a.phases),
        difftx::experiments::bench::DecodeSource {
            prompt: text,
            lookup: a.lookup,
            draft: draft.as_ref().map(|d| (d, a.draft.draft_tokens)),
        },
    )?;
    if a.json {
        println!("{}", serde_json::to_string(&r)?);
    } else {
        // what a step reads: the weights, and the cache rows each sequence attends to (the
        // mean step's)
        let kv_step = r.kv_bytes_per_token * r.batch as u64;
        let bw_bytes = r.weight_bytes + kv_step;
        let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
        println!(
            "{} ({} params), {} threads, {} weights, {} KV cache: prefill {} tokens {:.0} tokens/s; decode {} tokens at batch {} {:.1} tokens/s ({:.2} ms/step; a step reads ≥ {:.1} MiB, {:.2} MiB of it the KV cache)",
            r.attention,
            r.params,
            r.threads,
            r.precision,
            r.kv_cache,
            r.batch * r.prompt_len,
            r.prefill_tokens_per_s,
            r.batch * r.new_tokens,
            r.batch,
            r.decode_tokens_per_s,
            1e3 * r.batch as f64 / r.decode_tokens_per_s,
            mib(bw_bytes),
            mib(kv_step)
        );
        if r.lookup > 0 {
            println!(
                "prompt lookup (drafts of up to {}): {} of {} drafted tokens accepted in the last repetition",
                r.lookup, r.accepted, r.drafted
            );
        }
        if r.draft > 0 {
            println!(
                "draft model ({} params, drafts of up to {}): {} of {} drafted tokens accepted in the last repetition",
                r.draft_params, r.draft, r.accepted, r.drafted
            );
        }
        if a.bandwidth {
            let ms = 1e3 * r.batch as f64 / r.decode_tokens_per_s;
            let bound_ms = |gbs: f64| bw_bytes as f64 / (gbs * 1e9) * 1e3;
            // each repetition against the mean of the rates read just before and after it
            let mut ratios: Vec<f64> = (r.decode_s.iter().zip(r.memory_gbs.windows(2)))
                .map(|(s, g)| 1e3 * s / r.new_tokens as f64 / bound_ms((g[0] + g[1]) / 2.0))
                .collect();
            let gbs = &r.memory_gbs;
            let (lo, hi) = (
                gbs.iter().copied().fold(f64::MAX, f64::min),
                gbs.iter().copied().fold(0.0, f64::max),
            );
            let each: Vec<String> = ratios.iter().map(|x| format!("{x:.2}×")).collect();
            ratios.sort_by(|x, y| x.total_cmp(y));
            println!(
                "decode {ms:.3} ms/step; main memory read at {lo:.1}–{hi:.1} GB/s before and after each repetition; against reading the weights and the KV rows a step reads once at the rate of its own minutes, each repetition took {} (median {:.2}×)",
                each.join(", "),
                ratios[ratios.len() / 2]
            );
            // The same bytes read again and again, as decoding reads them: where they
            // fit in a cache this is the tighter bound.
            let gbs = difftx::experiments::bench::read_gbs(bw_bytes as usize);
            println!(
                "reading those {:.1} MiB over and over runs at {gbs:.1} GB/s: {:.3} ms, {:.2}× that bound",
                bw_bytes as f64 / (1u64 << 20) as f64,
                bound_ms(gbs),
                ms / bound_ms(gbs)
            );
        }
        if a.phases {
            print_phases(&r);
        }
    }
    Ok(())
}

/// "a prefill, 42.1 ms: mlp …" and "a decoding step, 2.20 ms: attention 0.87 ms (40%), …,
/// other 0.05 ms (2%)", the phases from the longest.
fn print_phases(r: &difftx::experiments::bench::DecodeBench) {
    let prefill = format!("a prefill of {} tokens", r.batch * r.prompt_len);
    println!(
        "{}",
        phase_line(&prefill, r.prefill_s_median, &r.prefill_phases)
    );
    let step = r.decode_s_median / r.new_tokens as f64;
    println!("{}", phase_line("a decoding step", step, &r.phases));
}

/// One line of where `total` seconds went: each phase and its share, then the rest as "other".
fn phase_line(what: &str, total: f64, phases: &[difftx::experiments::bench::PhaseTime]) -> String {
    let mut parts: Vec<(&str, f64)> = phases.iter().map(|p| (p.phase, p.seconds)).collect();
    parts.sort_by(|a, b| b.1.total_cmp(&a.1));
    let timed: f64 = parts.iter().map(|p| p.1).sum();
    parts.push(("other", (total - timed).max(0.0)));
    let shown: Vec<String> = parts
        .iter()
        .map(|(name, s)| format!("{name} {:.3} ms ({:.0}%)", 1e3 * s, 100.0 * s / total))
        .collect();
    format!("{what}, {:.3} ms: {}", 1e3 * total, shown.join(", "))
}

fn matmul(a: BenchMatmulArgs) -> Result<()> {
    let (m, n, k) = (
        a.m.unwrap_or(a.size),
        a.n.unwrap_or(a.size),
        a.k.unwrap_or(a.size),
    );
    if m * n * k == 0 || a.reps == 0 {
        bail!("matrix sizes and --reps must be positive");
    }
    if !a.json {
        if let Some(peak) = difftx::experiments::bench::fma_peak_gflops() {
            println!("FMA peak of one core (AVX-512, registers only): {peak:.1} GFLOP/s");
        }
        if let Some(peak) = difftx::experiments::bench::dot_bf16_peak_gflops() {
            println!(
                "bf16 dot-product peak of one core (VDPBF16PS, registers only): {peak:.1} GFLOP/s"
            );
        }
    }
    let layout = (a.layout == "tn", a.layout == "nt");
    for r in difftx::experiments::bench::bench_matmul(m, n, k, layout, a.reps, a.cold) {
        if a.json {
            println!("{}", serde_json::to_string(&r)?);
        } else {
            println!(
                "{:<22} {m}x{n}x{k} {}{}: {:.3} ms  {:.1} GFLOP/s  ({} threads)",
                r.backend,
                a.layout,
                if a.cold { " cold" } else { "" },
                r.ms,
                r.gflops,
                r.threads
            );
        }
    }
    Ok(())
}
