//! The `difftx` command line: a thin layer over the library.

#![deny(clippy::undocumented_unsafe_blocks)]
#![deny(unsafe_op_in_unsafe_fn)]

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use difftx::data::Tokenizer;
use difftx::kernels::Precision;
use difftx::util::thousands;
use difftx::{AttentionKind, Model, ModelConfig, Preset};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Instant;

#[derive(Parser)]
#[command(name = "difftx", version, about = "Train, run and evaluate Differential Transformer language models on a CPU.", long_about = None)]
struct Cli {
    /// Worker threads (default: all cores). Results are bit-identical for a given thread count.
    #[arg(long, global = true)]
    threads: Option<usize>,
    /// Matrix products (linear layers, LM head and the attention's tiles, forward and backward)
    /// with bf16 operands, accumulated in f32 (AVX512_BF16 dot products, or Intel's AMX tile
    /// unit where the CPU has one); weights, gradients, AdamW state and the softmax stay f32.
    /// Decoding reads a bf16 copy of the weights (half the memory traffic). Off by default.
    /// Needs a CPU with AVX512_BF16 (AMD Zen 4 or later, Intel Cooper Lake or later).
    #[arg(long, global = true)]
    bf16: bool,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Quick demo: train a tiny diff_v1 model and its matched standard baseline on the built-in
    /// text (one to two minutes on 2 cores), compare their validation losses and plot both.
    Demo(DemoArgs),
    /// Train a model on your text, with checkpoints that survive crashes and resume exactly.
    Train(Box<TrainArgs>),
    /// Tokenizers: train a byte-level BPE tokenizer.json on your text.
    #[command(subcommand)]
    Tokenizer(TokenizerCmd),
    /// Overlay the loss curves of several runs in one PNG.
    Plot(PlotArgs),
    /// Mean next-token cross-entropy and perplexity of a text file under a model.
    Eval(EvalArgs),
    /// Generate text after a prompt; the continuation streams to stdout, everything else to stderr.
    Generate(GenerateArgs),
    /// Train standard, diff_v1 and diff_v2 at matched parameters on the same multi-needle data
    /// and measure the paper's claims side by side: OUT/REPRO.md, OUT/needle_heatmap.png.
    Repro(ReproArgs),
    /// Draw one head's attention over a prompt: A1, A2 and A1 − λA2 side by side for the diff
    /// kinds, the softmax map for standard.
    AttentionMap(AttentionMapArgs),
    /// Write a model in another format: `--format hf` gives a directory that Hugging Face
    /// transformers loads (standard → llama, diff_v1 → diffllama).
    Export(ExportArgs),
    /// Create a model directory with freshly initialised weights from a preset.
    Init(InitArgs),
    /// Benchmarks (speed and memory); compare with bench/pytorch_reference.py.
    #[command(subcommand)]
    Bench(BenchCmd),
    /// Print the presets and their parameter counts for every attention kind.
    Presets,
}

#[derive(Args)]
struct EvalArgs {
    /// Model directory: native difftx (config.json, model.safetensors, optional tokenizer.json)
    /// or a Hugging Face llama / diffllama directory.
    #[arg(long)]
    model: PathBuf,
    /// UTF-8 text file to score, tokenized with the model's tokenizer.
    #[arg(long)]
    data: PathBuf,
    /// Windows evaluated at once.
    #[arg(long, default_value_t = 8)]
    batch: usize,
    /// Print one JSON object {"loss", "perplexity", "tokens"} on stdout.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
#[command(after_help = "Examples:
  difftx repro --quick --out runs/repro-quick      (smoke run, about 15 s on 2 cores)
  difftx repro --dry-run --out runs/repro          (print what the full run will do)
  difftx repro --out runs/repro                    (full run: 3 kinds × 3 seeds, about 50 min)")]
struct ReproArgs {
    /// Smoke run: tiny models, few steps, two context lengths; CI runs it.
    #[arg(long)]
    quick: bool,
    /// Seeds per kind [default: 3, or 1 with --quick].
    #[arg(long)]
    seeds: Option<usize>,
    /// Training steps of each needle model, overriding the plan's (to time or shorten a run).
    #[arg(long)]
    steps: Option<u64>,
    /// Text for the language-modelling and ablation part: a text file or a folder of fortune
    /// files [default: /usr/share/games/fortunes (Debian's `fortunes`; scripts/repro.sh
    /// installs it), or the built-in demo text with --quick].
    #[arg(long)]
    corpus: Option<PathBuf>,
    /// Output folder: REPRO.md, needle_heatmap.png, results.json, models/.
    #[arg(long)]
    out: PathBuf,
    /// Print the plan and exit without training.
    #[arg(long)]
    dry_run: bool,
}

#[derive(Args)]
struct AttentionMapArgs {
    /// Model directory (config.json, model.safetensors, optional tokenizer.json).
    #[arg(long)]
    model: PathBuf,
    /// Prompt text, tokenized with the model's tokenizer; at most the model's context.
    #[arg(long)]
    prompt: String,
    /// Layer, from 0.
    #[arg(long)]
    layer: usize,
    /// Head, from 0 (a differential head for the diff kinds).
    #[arg(long)]
    head: usize,
    /// The PNG to write.
    #[arg(long)]
    out: PathBuf,
}

#[derive(Args)]
struct GenerateArgs {
    /// Model directory: native difftx (config.json, model.safetensors, optional tokenizer.json)
    /// or a Hugging Face llama / diffllama directory.
    #[arg(long)]
    model: PathBuf,
    /// Prompt text; repeat the flag (or mix with --prompt-file) to generate a batch.
    #[arg(long)]
    prompt: Vec<String>,
    /// Read a prompt from a file (the whole file is one prompt); may be repeated.
    #[arg(long)]
    prompt_file: Vec<PathBuf>,
    /// Tokens to generate after each prompt (fewer if the end-of-text token or the end of the
    /// context comes first).
    #[arg(long, default_value_t = 100)]
    max_new_tokens: usize,
    /// 0 is greedy decoding.
    #[arg(long, default_value_t = 0.8)]
    temperature: f32,
    /// Sample only among the K most likely tokens.
    #[arg(long)]
    top_k: Option<usize>,
    /// Sample only among the most likely tokens whose probabilities add up to P.
    #[arg(long)]
    top_p: Option<f32>,
    /// Seed of the sampling generator (same seed, same text).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Keep the end of a prompt longer than the context instead of failing.
    #[arg(long)]
    truncate_prompt: bool,
    /// Print prefill and decode tokens/s to stderr.
    #[arg(long)]
    stats: bool,
}

#[derive(Args)]
struct DemoArgs {
    /// Training steps per model (8 windows of 128 bytes each).
    #[arg(long, default_value_t = 600)]
    steps: u64,
    /// Seed of the initial weights and of the window sampler.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Folder for the two runs (OUT/diff_v1, OUT/standard; an earlier demo's are replaced)
    /// and the comparison plot OUT/loss.png.
    #[arg(long, default_value = "runs/demo")]
    out: PathBuf,
}

#[derive(Args)]
#[command(after_help = "Examples:
  difftx train --data notes/ --attention diff_v1 --steps 2000 --out runs/a
  difftx train --config run.toml --out runs/b          (TOML keys = flag names with _)
  difftx train --data notes/ --out runs/a --resume     (after a crash or Ctrl-C)

The run folder holds run.json, metrics.jsonl, loss.png and checkpoints/step-N/ (each a model
directory that `difftx eval --model` loads, plus optimizer.safetensors and trainer_state.json).
Ctrl-C or SIGTERM saves a checkpoint and exits; a second Ctrl-C exits at once.")]
struct TrainArgs {
    /// Run folder: metrics, plot and checkpoints go here.
    #[arg(long)]
    out: PathBuf,
    /// Continue from the newest complete checkpoint in --out (start fresh if there is none).
    /// The recorded settings are used; any setting given again must match them.
    #[arg(long)]
    resume: bool,
    /// A TOML file of settings (same names as the flags, with underscores); flags override it.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Folder for token files (reused by any run on the same data and tokenizer)
    /// [default: token-cache/ next to --out].
    #[arg(long, value_name = "DIR")]
    token_cache: Option<PathBuf>,
    #[command(flatten)]
    opts: difftx::train::TrainOptions,
}

#[derive(Subcommand)]
enum TokenizerCmd {
    /// Train a byte-level BPE tokenizer (GPT-2 style) and write it as a Hugging Face
    /// tokenizer.json, for `difftx train --tokenizer`.
    Train(TokenizerTrainArgs),
}

#[derive(Args)]
struct TokenizerTrainArgs {
    /// Text files, folders or glob patterns.
    #[arg(long, num_args = 1.., required = true, value_name = "PATH")]
    data: Vec<String>,
    /// Vocabulary size, including the 256 byte symbols.
    #[arg(long)]
    vocab_size: usize,
    /// Where to write tokenizer.json.
    #[arg(long)]
    out: PathBuf,
}

#[derive(Args)]
struct PlotArgs {
    /// Run folders (each with metrics.jsonl and run.json).
    #[arg(required = true, value_name = "RUN")]
    runs: Vec<PathBuf>,
    /// The PNG to write.
    #[arg(long)]
    out: PathBuf,
    /// Title above the plot [default: the run names].
    #[arg(long)]
    title: Option<String>,
}

#[derive(Args)]
struct ExportArgs {
    /// Model directory (native difftx, or a Hugging Face llama / diffllama).
    #[arg(long)]
    model: PathBuf,
    /// Target format; `hf` is the only one.
    #[arg(long, default_value = "hf")]
    format: String,
    /// Output directory.
    #[arg(long)]
    out: PathBuf,
}

#[derive(Args)]
struct InitArgs {
    #[arg(long, default_value = "tiny")]
    preset: Preset,
    /// standard, diff_v1 or diff_v2
    #[arg(long, default_value = "diff_v1")]
    attention: AttentionKind,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// diff_v1 ablation (paper Table 6): one constant λ_init for every layer, in [0, 1)
    /// [default: the schedule 0.8 − 0.6·exp(−0.3·l) of layer l].
    #[arg(long, value_name = "X")]
    lambda_init: Option<f64>,
    /// diff_v1 ablation (paper Table 6): no per-head RMSNorm (subln) and no (1 − λ_init) scale.
    #[arg(long)]
    no_subln: bool,
    /// Output model directory.
    #[arg(long)]
    out: PathBuf,
}

#[derive(Subcommand)]
enum BenchCmd {
    /// Median time of a full training step (forward, backward, AdamW) on random tokens.
    Train(BenchTrainArgs),
    /// GFLOP/s of one matrix product, difftx's f32 kernel against the `gemm` crate (and bf16
    /// where the CPU has AVX512_BF16), alternating.
    Matmul(BenchMatmulArgs),
    /// Prefill and batch-1 greedy decode tokens/s (compare with bench/hf_decode.py).
    Decode(BenchDecodeArgs),
    /// One layer's attention kernel, forward and backward, on a preset's head layout.
    Attention(BenchAttentionArgs),
    /// Peak memory of a training step against what the buffers add up to.
    Memory(BenchMemoryArgs),
    /// The same short training run with f32 and with bf16 matrix products: step times,
    /// how far apart the loss curves end up, and both curves in a PNG.
    Bf16(BenchBf16Args),
}

#[derive(Args)]
struct BenchBf16Args {
    #[command(flatten)]
    shape: BenchShape,
    /// Training steps of each run.
    #[arg(long, default_value_t = 300)]
    steps: u64,
    /// Peak learning rate (warm-up, then cosine to a tenth).
    #[arg(long, default_value_t = 1e-3)]
    lr: f32,
    #[arg(long, default_value_t = 30)]
    warmup: u64,
    /// Text to train on, byte-level: a file, or a folder of fortune files. Default: Debian's
    /// fortunes (/usr/share/games/fortunes) where installed, else the built-in demo text.
    #[arg(long)]
    corpus: Option<PathBuf>,
    /// Write both loss curves (means over 10 steps) to this PNG.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// Print one JSON object on stdout (both curves included).
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct BenchMemoryArgs {
    #[command(flatten)]
    shape: BenchShape,
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct BenchAttentionArgs {
    #[command(flatten)]
    shape: BenchShape,
    #[arg(long, default_value_t = 5)]
    reps: usize,
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct BenchDecodeArgs {
    /// A model directory; without it, a freshly initialised --preset/--attention model.
    #[arg(long)]
    model: Option<PathBuf>,
    #[arg(long, default_value = "bench")]
    preset: Preset,
    #[arg(long, default_value = "diff_v1")]
    attention: AttentionKind,
    #[arg(long, default_value_t = 128)]
    prompt_len: usize,
    #[arg(long, default_value_t = 128)]
    new_tokens: usize,
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// Also measure read bandwidth, of main memory and of a buffer the size of the weights and
    /// KV cache (cache-resident where it fits), and compare each token's time with reading
    /// those bytes once at each rate.
    #[arg(long)]
    bandwidth: bool,
    /// Print one JSON object on stdout.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct BenchMatmulArgs {
    /// M = N = K unless --m/--n/--k are given.
    #[arg(long, default_value_t = 1024)]
    size: usize,
    #[arg(long)]
    m: Option<usize>,
    #[arg(long)]
    n: Option<usize>,
    #[arg(long)]
    k: Option<usize>,
    #[arg(long, default_value_t = 20)]
    reps: usize,
    /// Operand storage: nn (both row-major), nt (B stored transposed: X·Wᵀ, a linear layer's
    /// forward) or tn (A stored transposed: dYᵀ·X, its weight gradient).
    #[arg(long, default_value = "nn", value_parser = ["nn", "nt", "tn"])]
    layout: String,
    /// A and C from main memory, as inside a training step (whose activations do not stay in
    /// the caches): each repetition takes the next of enough copies of them to overflow the L3.
    /// B (a weight) stays cached.
    #[arg(long)]
    cold: bool,
    /// One JSON object per backend on stdout.
    #[arg(long)]
    json: bool,
}

/// The model a benchmark builds: a preset of one attention kind, its batch and context.
#[derive(Args)]
struct BenchShape {
    /// tiny, small, bench or medium
    #[arg(long, default_value = "bench")]
    preset: Preset,
    /// standard, diff_v1 or diff_v2
    #[arg(long, default_value = "diff_v1")]
    attention: AttentionKind,
    /// Sequences per step.
    #[arg(long, default_value_t = 8)]
    batch: usize,
    /// Override the preset's context length.
    #[arg(long)]
    seq: Option<usize>,
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
struct BenchTrainArgs {
    #[command(flatten)]
    shape: BenchShape,
    #[arg(long, default_value_t = 3)]
    warmup: usize,
    #[arg(long, default_value_t = 10)]
    steps: usize,
    /// Print one JSON object on stdout (step_ms, tokens_per_second, peak_rss_bytes, ...).
    #[arg(long)]
    json: bool,
}

fn progress(len: u64, what: &str) -> ProgressBar {
    let pb = ProgressBar::new(len);
    if std::io::stderr().is_terminal() {
        pb.set_style(
            ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} {per_sec} ETA {eta}")
                .expect("template")
                .progress_chars("=> "),
        );
        pb.set_message(what.to_string());
    } else {
        pb.set_draw_target(ProgressDrawTarget::hidden());
    }
    pb
}

fn eval(a: EvalArgs, precision: Precision) -> Result<()> {
    let mut model = difftx::interop::load(&a.model)?;
    model.precision = precision;
    let tok = Tokenizer::for_model(&a.model, &model.config)?;
    let text = std::fs::read(&a.data).with_context(|| format!("{}", a.data.display()))?;
    let text = String::from_utf8(text)
        .map_err(|e| anyhow::anyhow!("{}: not UTF-8 text ({e})", a.data.display()))?;
    let ids = tok.encode(&text)?;
    if ids.len() < 2 {
        bail!(
            "{}: {} token(s) after tokenization; need at least 2 to score a next token",
            a.data.display(),
            ids.len()
        );
    }
    let pb = progress(0, "eval");
    let r = difftx::eval::evaluate_loss(&model, &ids, a.batch, |done, total| {
        pb.set_length(total as u64);
        pb.set_position(done as u64);
    })?;
    pb.finish_and_clear();
    if a.json {
        println!(
            "{}",
            serde_json::json!({"loss": r.loss, "perplexity": r.perplexity, "tokens": r.tokens})
        );
    } else {
        println!(
            "loss {:.4} nats/token  perplexity {:.3}  ({} tokens)",
            r.loss, r.perplexity, r.tokens
        );
    }
    Ok(())
}

fn repro(a: ReproArgs) -> Result<()> {
    use difftx::eval::lm_scaling::FORTUNES_DIR;
    use difftx::eval::repro::{run_repro, Corpus, ReproPlan};
    let mut plan = if a.quick {
        ReproPlan::quick()
    } else {
        ReproPlan::full()
    };
    if let Some(n) = a.seeds {
        plan.seeds = n;
    }
    if let Some(n) = a.steps {
        plan.steps = n;
        plan.warmup = plan.warmup.min(n / 10);
    }
    plan.validate()?;
    for line in plan.describe() {
        eprintln!("repro: {line}");
    }
    let corpus = match (&a.corpus, a.quick) {
        (Some(p), _) => Corpus::load(p)?,
        (None, true) => Corpus {
            text: difftx::demo::DEMO_TEXT.as_bytes().to_vec(),
            line: format!(
                "the built-in demo text (data/demo.txt, {} bytes; the last 10% is validation)",
                difftx::demo::DEMO_TEXT.len()
            ),
        },
        // A dry run states the plan even where the default corpus is not installed yet.
        (None, false) => match Corpus::load(std::path::Path::new(FORTUNES_DIR)) {
            Err(e) if a.dry_run => Corpus {
                text: Vec::new(),
                line: format!("{e} (scripts/repro.sh installs it)"),
            },
            r => r?,
        },
    };
    eprintln!("repro: corpus: {}", corpus.line);
    if a.dry_run {
        return Ok(());
    }
    let command = std::env::args()
        .enumerate()
        .map(|(i, arg)| {
            if i == 0 {
                "difftx".to_string()
            } else if arg.is_empty() || arg.contains(char::is_whitespace) {
                format!("'{arg}'")
            } else {
                arg
            }
        })
        .collect::<Vec<_>>()
        .join(" ");
    let report = run_repro(&plan, &corpus, &a.out, &command, |line| {
        eprintln!("repro: {line}")
    })?;
    eprintln!("repro: wrote {}", report.display());
    Ok(())
}

fn attention_map(a: AttentionMapArgs, precision: Precision) -> Result<()> {
    use difftx::report::heatmap::{plot_attention_maps, MapPanel};
    let mut model = difftx::interop::load(&a.model)?;
    model.precision = precision;
    let tok = Tokenizer::for_model(&a.model, &model.config)?;
    let ids = tok.encode(&a.prompt)?;
    let m = difftx::eval::attention_stats::head_maps(&model, &ids, a.layer, a.head)?;
    let kind = model.config.attention;
    let t = m.t;
    let panels = match (m.a2, m.diff) {
        (Some(a2), Some(diff)) => {
            let lam = match kind {
                AttentionKind::DiffV1 => format!("λ = {:.3}", m.lambda[0]),
                _ => format!(
                    "λ per token, mean {:.3}",
                    m.lambda.iter().sum::<f64>() / t as f64
                ),
            };
            vec![
                MapPanel {
                    title: "A1".into(),
                    t,
                    values: m.a1,
                    signed: false,
                },
                MapPanel {
                    title: "A2".into(),
                    t,
                    values: a2,
                    signed: false,
                },
                MapPanel {
                    title: format!("A1 − λ·A2 ({lam})"),
                    t,
                    values: diff,
                    signed: true,
                },
            ]
        }
        _ => vec![MapPanel {
            title: "softmax(QKᵀ/√d)".into(),
            t,
            values: m.a1,
            signed: false,
        }],
    };
    let title = format!(
        "{}: {kind}, layer {}, head {}, {t} tokens",
        a.model.display(),
        a.layer,
        a.head
    );
    plot_attention_maps(&panels, &title, &a.out)?;
    eprintln!("wrote {}", a.out.display());
    Ok(())
}

fn stop_flag() -> Result<Arc<AtomicBool>> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [SIGINT, SIGTERM] {
        // The first signal asks for a checkpoint and a clean exit; a second one exits at once.
        signal_hook::flag::register_conditional_shutdown(sig, 128 + sig, stop.clone())?;
        signal_hook::flag::register(sig, stop.clone())?;
    }
    Ok(stop)
}

/// Progress for a training run: a bar on a terminal, nothing otherwise.
struct Progress {
    pb: ProgressBar,
    name: String,
    last_draw: Instant,
    val: Option<f64>,
    tok_s: f64,
}

impl Progress {
    fn new(name: &str) -> Self {
        let pb = ProgressBar::new(0);
        if std::io::stderr().is_terminal() {
            pb.set_style(
                ProgressStyle::with_template(
                    "{prefix} [{bar:25}] step {pos}/{len} {msg} ETA {eta}",
                )
                .expect("template")
                .progress_chars("=> "),
            );
            pb.set_prefix(name.to_string());
        } else {
            pb.set_draw_target(ProgressDrawTarget::hidden());
        }
        Progress {
            pb,
            name: name.to_string(),
            last_draw: Instant::now(),
            val: None,
            tok_s: 0.0,
        }
    }
}

impl difftx::train::Observer for Progress {
    fn note(&mut self, msg: &str) {
        self.pb.suspend(|| eprintln!("{}: {msg}", self.name));
    }
    fn start(&mut self, first: u64, steps: u64) {
        self.pb.set_length(steps);
        self.pb.set_position(first);
        self.pb.reset_eta();
    }
    fn step(&mut self, r: &difftx::train::StepReport) {
        self.pb.set_position(r.step);
        self.tok_s = if self.tok_s == 0.0 {
            r.tokens_per_s
        } else {
            0.9 * self.tok_s + 0.1 * r.tokens_per_s
        };
        if r.val_loss.is_some() {
            self.val = r.val_loss;
        }
        // Redraw at most 4 times a second, so the loop formats almost nothing.
        if self.last_draw.elapsed().as_millis() >= 250 || r.val_loss.is_some() {
            self.last_draw = Instant::now();
            let val = self.val.map_or(String::new(), |v| format!(" val {v:.3}"));
            self.pb.set_message(format!(
                "loss {:.3}{val} lr {:.1e} {:.0} tok/s",
                r.loss, r.lr, self.tok_s
            ));
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.pb.finish_and_clear();
    }
}

fn demo(a: DemoArgs) -> Result<()> {
    let stop = stop_flag()?;
    let data = difftx::demo::demo_dataset();
    eprintln!(
        "difftx demo: tiny preset, byte-level, {} training / {} validation bytes of the built-in text (GNU GPL v3), {} steps each",
        data.train.len(),
        data.val.len(),
        a.steps
    );
    let (runs, plot) = difftx::demo::run_demo(
        &a.out,
        a.steps,
        a.seed,
        |kind| Box::new(Progress::new(kind.as_str())),
        &stop,
    )?;
    println!(
        "{:<10} {:>10} {:>12} {:>10} {:>8}",
        "attention", "params", "train loss", "val loss", "seconds"
    );
    for r in &runs {
        println!(
            "{:<10} {:>10} {:>12.3} {:>10.3} {:>8.0}",
            r.attention.as_str(),
            r.params,
            r.train_loss,
            r.val_loss,
            r.seconds
        );
    }
    println!(
        "(losses in nats per byte; uniform guessing is {:.3})",
        256f64.ln()
    );
    println!("loss curves: {}", plot.display());
    Ok(())
}

/// Parameter counts of the three kinds at these settings (a kind whose settings do not
/// resolve is left out; the diff_v1 ablations apply to diff_v1 only).
fn matched_counts(opts: &difftx::train::TrainOptions, vocab: usize) -> String {
    AttentionKind::ALL
        .iter()
        .filter_map(|k| {
            let mut o = difftx::train::TrainOptions {
                attention: Some(k.as_str().into()),
                ..opts.clone()
            };
            if *k != AttentionKind::DiffV1 {
                (o.lambda_init, o.no_subln) = (None, None);
            }
            o.resolve(vocab)
                .ok()
                .map(|r| format!("{k} {}", thousands(r.model.num_params())))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The paper's Table 6 ablations a diff_v1 config turns on, as " (…)", or "".
fn ablations(m: &ModelConfig) -> String {
    let on: Vec<String> = [
        m.lambda_init.map(|l| format!("constant λ_init {l}")),
        (!m.subln).then(|| "no subln".to_string()),
    ]
    .into_iter()
    .flatten()
    .collect();
    if on.is_empty() {
        String::new()
    } else {
        format!(" ({})", on.join(", "))
    }
}

fn train(a: TrainArgs, precision: Precision) -> Result<()> {
    let mut opts = match &a.config {
        Some(p) => difftx::train::TrainOptions::from_toml_file(p)?.overlaid(&a.opts),
        None => a.opts.clone(),
    };
    if precision == Precision::Bf16 {
        opts.bf16 = Some(true);
    }
    // Everything that can be checked is checked before anything is written or printed.
    let recorded = if a.resume {
        difftx::train::checkpoint::latest_run(&a.out)?
    } else {
        if let Some((step, _)) = difftx::train::checkpoint::list_checkpoints(&a.out)?.last() {
            bail!(
                "{} already holds a training run (checkpoint {}); pass --resume to continue it or choose another --out",
                a.out.display(),
                difftx::train::checkpoint::checkpoint_name(*step)
            );
        }
        None
    };
    if let Some(r) = &recorded {
        opts = r.to_options().overlaid(&opts);
    }
    let tok = match &opts.tokenizer {
        Some(p) => Tokenizer::from_file(p)?,
        None => Tokenizer::Bytes,
    };
    let run = opts.resolve(tok.vocab_size())?;
    if let Some((k, was, now)) = recorded.as_ref().and_then(|r| r.first_difference(&run)) {
        bail!(
            "--resume: {k} is {now}, but the run in {} used {was}",
            a.out.display()
        );
    }
    // A run recorded with bf16 products (or `bf16 = true` in TOML) trains with them.
    if run.train.bf16 && Precision::new(true).is_none() {
        bail!("this run uses bf16 matrix products (--bf16), which need a CPU with AVX512_BF16 (AMD Zen 4 or later, Intel Cooper Lake or later); this machine has none");
    }
    if run.data.data.is_empty() {
        bail!("no training data: pass --data FILE|FOLDER|GLOB");
    }
    let stop = stop_flag()?;
    let cache = a.token_cache.clone().unwrap_or_else(|| {
        let parent = a.out.parent().filter(|p| !p.as_os_str().is_empty());
        parent
            .unwrap_or(std::path::Path::new("."))
            .join("token-cache")
    });
    let name = a
        .out
        .file_name()
        .map_or("train".into(), |n| n.to_string_lossy().into_owned());
    let data = difftx::data::prepare_dataset(&run.data, &tok, &cache, &stop)?;
    difftx::train::trainer::check_windows(&data, run.model.max_position_embeddings)?;
    for n in &data.notes {
        eprintln!("{name}: {n}");
    }
    let m = &run.model;
    eprintln!(
        "{name}: {} {}{} — {} parameters (matched at these settings: {}); D {} L {} heads {}/{} d {} context {}, vocab {}",
        run.preset.as_str(),
        m.attention,
        ablations(m),
        thousands(m.num_params()),
        matched_counts(&opts, tok.vocab_size()),
        m.hidden_size,
        m.num_hidden_layers,
        m.num_attention_heads,
        m.num_key_value_heads,
        m.head_dim,
        m.max_position_embeddings,
        m.vocab_size
    );
    eprintln!(
        "{name}: {} steps × {} tokens ({} windows × {} accumulated × {}), {} threads, {} matrix products",
        run.train.steps,
        run.train.tokens_per_step(m.max_position_embeddings),
        run.train.batch,
        run.train.grad_accum,
        m.max_position_embeddings,
        rayon::current_num_threads(),
        if run.train.bf16 { "bf16" } else { "f32" }
    );
    let mut progress = Progress::new(&name);
    let o = difftx::train::train(
        &run,
        &data,
        &a.out,
        tok.file(),
        a.resume,
        &mut progress,
        &stop,
    )?;
    drop(progress);
    let val = o.val_loss.map_or("-".into(), |v| format!("{v:.4}"));
    if o.interrupted {
        eprintln!(
            "{name}: interrupted at step {}; checkpoint {} saved — continue with the same command and --resume",
            o.step,
            o.checkpoint.display()
        );
    } else if o.train_loss.is_nan() && o.val_loss.is_none() {
        // resumed from the final checkpoint: no step was left to take
        eprintln!("{name}: already complete at step {}", o.step);
    } else {
        eprintln!(
            "{name}: done, {} steps in {:.0} s; train loss {:.4}, val loss {val}",
            o.step, o.seconds, o.train_loss
        );
        eprintln!("{name}: model {}", o.checkpoint.display());
        let label = format!("{} ({} params)", run.model.attention, thousands(o.params));
        let title = format!("{name} — {} preset", run.preset.as_str());
        match difftx::train::metrics::plot_run(&a.out, label, &title) {
            Ok(p) => eprintln!("{name}: loss curve {}", p.display()),
            Err(e) => eprintln!("{name}: could not draw the loss plot: {e}"),
        }
    }
    Ok(())
}

fn tokenizer_train(a: TokenizerTrainArgs) -> Result<()> {
    let n = difftx::data::corpus::train_bpe(&a.data, a.vocab_size, &a.out)?;
    eprintln!("wrote {} ({n} tokens)", a.out.display());
    Ok(())
}

fn plot(a: PlotArgs) -> Result<()> {
    let mut loaded = Vec::new();
    for r in &a.runs {
        let records =
            difftx::train::metrics::read_metrics(&r.join(difftx::train::metrics::METRICS_FILE))?;
        let info = r.join(difftx::train::trainer::RUN_FILE);
        let text = std::fs::read_to_string(&info).with_context(|| info.display().to_string())?;
        let v: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| anyhow::anyhow!("{}: malformed JSON ({e})", info.display()))?;
        let kind = v["run"]["model"]["attention"].as_str().unwrap_or("?");
        let params = v["params"].as_u64().unwrap_or(0) as usize;
        let name = r
            .file_name()
            .map_or(String::new(), |n| n.to_string_lossy().into_owned());
        let label = if name == kind {
            format!("{kind} ({} params)", thousands(params))
        } else {
            format!("{name}: {kind} ({} params)", thousands(params))
        };
        loaded.push((label, records));
    }
    let series: Vec<_> = loaded
        .iter()
        .map(|(label, records)| difftx::train::metrics::loss_series(label.clone(), records))
        .collect();
    let title = a.title.clone().unwrap_or_else(|| {
        a.runs
            .iter()
            .map(|r| r.display().to_string())
            .collect::<Vec<_>>()
            .join(" vs ")
    });
    difftx::report::plot::plot_runs(&series, &title, &a.out)?;
    eprintln!("wrote {}", a.out.display());
    Ok(())
}

fn generate(a: GenerateArgs, precision: Precision) -> Result<()> {
    use std::io::Write;
    if let Some(p) = a.top_p {
        if !(p > 0.0 && p <= 1.0) {
            bail!("--top-p must be in (0, 1], got {p}");
        }
    }
    if a.top_k == Some(0) {
        bail!("--top-k must be at least 1");
    }
    if a.temperature.is_nan() || a.temperature < 0.0 {
        bail!(
            "--temperature must be 0 (greedy) or positive, got {}",
            a.temperature
        );
    }
    let mut model = difftx::interop::load(&a.model)?;
    model.precision = precision;
    let tok = Tokenizer::for_model(&a.model, &model.config)?;
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
        sampling: difftx::infer::Sampling {
            temperature: a.temperature,
            top_k: a.top_k,
            top_p: a.top_p,
        },
        seed: a.seed,
        eos: tok.eos_id(&model.config),
        truncate_prompt: a.truncate_prompt,
    };
    let single = prompts.len() == 1;
    let mut stream = difftx::data::tokenizer::TextStream::default();
    let g = difftx::infer::generate(&model, &prompts, &opts, |_, id| {
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
    } else {
        for ids in &g.tokens {
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
    }
    Ok(())
}

fn export(a: ExportArgs) -> Result<()> {
    if a.format != "hf" {
        bail!("--format `{}` is not supported (expected hf)", a.format);
    }
    let model = difftx::interop::load(&a.model)?;
    difftx::interop::hf::export(&model, &a.model, &a.out)?;
    eprintln!(
        "wrote {} ({} as Hugging Face {}; load it with AutoModelForCausalLM.from_pretrained)",
        a.out.display(),
        model.config.attention,
        if model.config.attention == AttentionKind::Standard {
            "llama"
        } else {
            "diffllama"
        }
    );
    Ok(())
}

fn init(a: InitArgs) -> Result<()> {
    let config = ModelConfig {
        lambda_init: a.lambda_init,
        subln: !a.no_subln,
        ..ModelConfig::preset(a.preset, a.attention)
    };
    let model = Model::init(config, a.seed)?;
    model.save(&a.out)?;
    eprintln!(
        "wrote {} ({} {}{}, {} parameters)",
        a.out.display(),
        a.preset.as_str(),
        a.attention,
        ablations(&model.config),
        model.num_params()
    );
    Ok(())
}

/// A relative difference as a percentage with two decimals, or two significant digits where
/// those decimals would print a gap as 0.00%.
fn percent(rel: f64) -> String {
    let p = 100.0 * rel;
    if p == 0.0 || p >= 0.01 {
        format!("{p:.2}%")
    } else {
        format!("{p:.1e}%")
    }
}

fn bench_bf16(a: BenchBf16Args) -> Result<()> {
    use difftx::eval::lm_scaling::{load_fortunes, FORTUNES_DIR};
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
            difftx::demo::DEMO_TEXT.as_bytes().to_vec(),
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
    let r = difftx::bench::bench_bf16(&config, &run, &text, |tag, _| {
        pb.set_message(tag.to_string());
        pb.inc(1)
    })?;
    pb.finish_and_clear();
    if let Some(path) = &a.plot {
        let line = |p: &difftx::bench::PrecisionRun| Line {
            label: format!("{} products (val {:.4})", p.precision, p.val_loss),
            points: difftx::bench::window_means(&p.losses)
                .into_iter()
                .enumerate()
                .map(|(i, y)| Point {
                    x: ((i + 1) * difftx::bench::WINDOW).min(p.losses.len()) as f64,
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
        let tail = |p: &difftx::bench::PrecisionRun| {
            let w = &p.losses[p.losses.len().saturating_sub(difftx::bench::WINDOW)..];
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

fn bench_train(a: BenchTrainArgs, p: Precision) -> Result<()> {
    let config = a.shape.config()?;
    if a.steps == 0 {
        bail!("--steps must be positive");
    }
    let pb = progress((a.warmup + a.steps) as u64, "steps");
    let r = difftx::bench::bench_train(&config, p, a.shape.batch, a.warmup, a.steps, |_, _| {
        pb.inc(1)
    })?;
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

fn presets() {
    println!(
        "{:<8} {:>12} {:>12} {:>12}",
        "preset", "standard", "diff_v1", "diff_v2"
    );
    for p in Preset::ALL {
        let n = |k| ModelConfig::preset(p, k).num_params();
        println!(
            "{:<8} {:>12} {:>12} {:>12}",
            p.as_str(),
            n(AttentionKind::Standard),
            n(AttentionKind::DiffV1),
            n(AttentionKind::DiffV2)
        );
    }
}

fn run(cli: Cli) -> Result<()> {
    if let Some(n) = cli.threads {
        if n == 0 {
            bail!("--threads must be at least 1");
        }
        rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .build_global()?;
    }
    let Some(precision) = Precision::new(cli.bf16) else {
        bail!("--bf16 needs a CPU with AVX512_BF16 (AMD Zen 4 or later, Intel Cooper Lake or later); this machine has none, so leave it off");
    };
    match cli.cmd {
        Cmd::Demo(a) => demo(a),
        Cmd::Train(a) => train(*a, precision),
        Cmd::Tokenizer(TokenizerCmd::Train(a)) => tokenizer_train(a),
        Cmd::Plot(a) => plot(a),
        Cmd::Eval(a) => eval(a, precision),
        Cmd::Generate(a) => generate(a, precision),
        Cmd::Repro(a) => repro(a),
        Cmd::AttentionMap(a) => attention_map(a, precision),
        Cmd::Init(a) => init(a),
        Cmd::Export(a) => export(a),
        Cmd::Bench(BenchCmd::Train(a)) => bench_train(a, precision),
        Cmd::Bench(BenchCmd::Bf16(a)) => bench_bf16(a),
        Cmd::Bench(BenchCmd::Memory(a)) => {
            let config = a.shape.config()?;
            let r = difftx::bench::bench_train(&config, precision, a.shape.batch, 0, 1, |_, _| {})?;
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
        Cmd::Bench(BenchCmd::Attention(a)) => {
            let c = a.shape.config()?;
            let r = difftx::bench::bench_attention(&c, a.shape.batch, a.reps.max(1));
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
        Cmd::Bench(BenchCmd::Decode(a)) => {
            let mut model = match &a.model {
                Some(dir) => difftx::interop::load(dir)?,
                None => Model::init(ModelConfig::preset(a.preset, a.attention), 0)?,
            };
            model.precision = precision;
            if a.prompt_len == 0 || a.new_tokens == 0 {
                bail!("--prompt-len and --new-tokens must be positive");
            }
            if a.prompt_len + a.new_tokens > model.config.max_position_embeddings {
                bail!(
                    "--prompt-len {} + --new-tokens {} exceed the context of {} tokens",
                    a.prompt_len,
                    a.new_tokens,
                    model.config.max_position_embeddings
                );
            }
            let r = difftx::bench::bench_decode(&model, a.prompt_len, a.new_tokens, a.reps)?;
            if a.json {
                println!("{}", serde_json::to_string(&r)?);
            } else {
                let bw_bytes = r.weight_bytes + r.kv_cache_bytes;
                println!(
                    "{} ({} params), {} threads, {} weights: prefill {} tokens {:.0} tokens/s; decode {} tokens at batch 1 {:.1} tokens/s ({:.2} ms/token; reads ≥ {:.1} MiB/token)",
                    r.attention,
                    r.params,
                    r.threads,
                    r.precision,
                    r.prompt_len,
                    r.prefill_tokens_per_s,
                    r.new_tokens,
                    r.decode_tokens_per_s,
                    1e3 / r.decode_tokens_per_s,
                    bw_bytes as f64 / (1u64 << 20) as f64
                );
                if a.bandwidth {
                    let ms = 1e3 / r.decode_tokens_per_s;
                    let bound_ms = |gbs: f64| bw_bytes as f64 / (gbs * 1e9) * 1e3;
                    let gbs = difftx::bench::memory_read_gbs();
                    println!(
                        "decode {ms:.3} ms/token; memory reads at {gbs:.1} GB/s would take {:.3} ms for the weights and the full KV cache: {:.2}× that bound",
                        bound_ms(gbs),
                        ms / bound_ms(gbs)
                    );
                    // The same bytes read again and again, as decoding reads them: where they
                    // fit in a cache this is the tighter bound.
                    let gbs = difftx::bench::read_gbs(bw_bytes as usize);
                    println!(
                        "reading those {:.1} MiB over and over runs at {gbs:.1} GB/s: {:.3} ms, {:.2}× that bound",
                        bw_bytes as f64 / (1u64 << 20) as f64,
                        bound_ms(gbs),
                        ms / bound_ms(gbs)
                    );
                }
            }
            Ok(())
        }
        Cmd::Bench(BenchCmd::Matmul(a)) => {
            let (m, n, k) = (
                a.m.unwrap_or(a.size),
                a.n.unwrap_or(a.size),
                a.k.unwrap_or(a.size),
            );
            if m * n * k == 0 || a.reps == 0 {
                bail!("matrix sizes and --reps must be positive");
            }
            if !a.json {
                if let Some(peak) = difftx::bench::fma_peak_gflops() {
                    println!("FMA peak of one core (AVX-512, registers only): {peak:.1} GFLOP/s");
                }
                if let Some(peak) = difftx::bench::dot_bf16_peak_gflops() {
                    println!(
                        "bf16 dot-product peak of one core (VDPBF16PS, registers only): {peak:.1} GFLOP/s"
                    );
                }
            }
            let layout = (a.layout == "tn", a.layout == "nt");
            for r in difftx::bench::bench_matmul(m, n, k, layout, a.reps, a.cold) {
                if a.json {
                    println!("{}", serde_json::to_string(&r)?);
                } else {
                    println!(
                        "{:<11} {m}x{n}x{k} {}{}: {:.3} ms  {:.1} GFLOP/s  ({} threads)",
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
        Cmd::Presets => {
            presets();
            Ok(())
        }
    }
}

fn main() {
    // Die quietly on a closed pipe (`difftx … | head`), as Unix tools do, instead of panicking.
    // SAFETY: restoring the default disposition of SIGPIPE before any thread starts.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let cli = Cli::parse();
    if let Err(e) = run(cli) {
        // One line: the error and its causes, no backtrace.
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
