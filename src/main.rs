//! The `difftx` command line. `main` parses and routes; each command's arguments and printing
//! live in `cli/` (one file per command), and everything that computes lives in the library.

#![deny(clippy::undocumented_unsafe_blocks)]
#![deny(unsafe_op_in_unsafe_fn)]

mod cli;

use anyhow::{bail, Result};
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use difftx::kernels::Precision;

#[derive(Parser)]
#[command(name = "difftx", version, about = "Train, run and evaluate Differential Transformer language models on a CPU.", long_about = None)]
struct Cli {
    /// Worker threads (default: all cores). Results are bit-identical for a given thread count.
    #[arg(long, global = true)]
    threads: Option<usize>,
    /// Matrix products in bf16 with f32 accumulation; weights, gradients and AdamW stay f32.
    /// Needs AVX512_BF16 (AMD Zen 4, Intel Cooper Lake or later).
    #[arg(long, global = true)]
    bf16: bool,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Quick demo: train a tiny diff_v1 model and its matched standard baseline on the built-in
    /// text (about 22 s on 2 cores once built), compare their validation losses and plot both.
    Demo(cli::demo::DemoArgs),
    /// Train a model on your text, with checkpoints that survive crashes and resume exactly.
    Train(Box<cli::train::TrainArgs>),
    /// Tokenizers: train a byte-level BPE tokenizer.json on your text.
    #[command(subcommand)]
    Tokenizer(cli::tokenizer::TokenizerCmd),
    /// Overlay the loss curves of several runs in one PNG.
    Plot(cli::plot::PlotArgs),
    /// Mean next-token cross-entropy and perplexity of a text file under a model.
    Eval(cli::eval::EvalArgs),
    /// Generate text after a prompt; the continuation streams to stdout, everything else to stderr.
    Generate(cli::generate::GenerateArgs),
    /// Train standard, diff_v1 and diff_v2 at matched parameters on the same multi-needle data
    /// and measure the paper's claims side by side: OUT/REPRO.md, OUT/needle_heatmap.png.
    Repro(cli::repro::ReproArgs),
    /// Score a model on multi-needle retrieval (the task `repro` trains on): accuracy per
    /// context length × depth of the needle asked for.
    Needle(cli::needle::NeedleArgs),
    /// Draw one head's attention over a prompt: A1, A2 and A1 − λA2 side by side for the diff
    /// kinds, the softmax map for standard.
    AttentionMap(cli::attention_map::AttentionMapArgs),
    /// Write a model in another format: `--format hf` gives a directory that Hugging Face
    /// transformers loads (standard → llama, diff_v1 → diffllama, diff_v2 → its own remote code),
    /// `--format gguf` a file that llama.cpp runs (standard only).
    Export(cli::export::ExportArgs),
    /// An OpenAI-compatible HTTP server (completions, chat, streaming, echo log-probabilities)
    /// with continuous batching; see docs/SERVING.md.
    #[cfg(feature = "serve")]
    Serve(Box<cli::serve::ServeArgs>),
    /// Create a model directory with freshly initialised weights from a preset.
    Init(cli::init::InitArgs),
    /// Turn a standard (Llama) model into diff_v2 (exactly: the same logits) or diff_v1 (near
    /// it), to fine-tune with `train --init-from`.
    Retrofit(cli::retrofit::RetrofitArgs),
    /// Benchmarks (speed and memory); compare with bench/pytorch_reference.py.
    #[command(subcommand)]
    Bench(cli::bench::BenchCmd),
    /// Print the presets and their parameter counts for every attention kind.
    Presets,
}

fn main() {
    let matches = command().get_matches();
    // Die quietly on a closed pipe (`difftx … | head`), as Unix tools do, instead of panicking.
    // Not the server: a client that hangs up must cost it one request, not the process (its
    // HTTP stack writes with writev, which raises SIGPIPE on a reset connection).
    if matches.subcommand_name() != Some("serve") {
        // SAFETY: restoring the default disposition of SIGPIPE before any thread starts.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    if let Err(e) = try_main(cli, matches.subcommand_name().unwrap_or("")) {
        // A run stopped by a signal has said so; it exits as shells report a signal (130, 143).
        if let Some(cli::progress::Interrupted(code)) = e.downcast_ref() {
            std::process::exit(*code);
        }
        // One line: the error and its causes, no backtrace.
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

/// The commands that run no matrix products of their own in bf16: `--bf16` is hidden from
/// their help and refused on their command line.
const NO_BF16: &[&str] = &["tokenizer", "plot", "repro", "export", "init", "presets"];

/// The parser: `Cli` with `--bf16` hidden where it would do nothing. A subcommand that
/// holds its own hidden `--bf16` is left out when clap copies the global flags down.
fn command() -> clap::Command {
    fn hide_bf16(c: clap::Command) -> clap::Command {
        let subs: Vec<String> = c.get_subcommands().map(|s| s.get_name().into()).collect();
        let flag = clap::Arg::new("bf16")
            .long("bf16")
            .action(clap::ArgAction::SetTrue)
            .hide(true);
        subs.into_iter()
            .fold(c.arg(flag), |c, s| c.mut_subcommand(s, hide_bf16))
    }
    NO_BF16
        .iter()
        .fold(Cli::command(), |c, name| c.mut_subcommand(name, hide_bf16))
}

fn try_main(cli: Cli, name: &str) -> Result<()> {
    if cli.bf16 && name == "repro" {
        bail!("--bf16 does not apply to `difftx repro`: its experiments run in f32, as the published report's do; leave it off");
    }
    if cli.bf16 && NO_BF16.contains(&name) {
        bail!("--bf16 changes nothing for `difftx {name}`, which runs no matrix products; leave it off");
    }
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
        Cmd::Demo(a) => cli::demo::run(a, precision),
        Cmd::Train(a) => cli::train::run(*a, precision),
        Cmd::Tokenizer(c) => cli::tokenizer::run(c),
        Cmd::Plot(a) => cli::plot::run(a),
        Cmd::Eval(a) => cli::eval::run(a, precision),
        Cmd::Generate(a) => cli::generate::run(a, precision),
        Cmd::Repro(a) => cli::repro::run(a),
        Cmd::Needle(a) => cli::needle::run(a, precision),
        Cmd::AttentionMap(a) => cli::attention_map::run(a, precision),
        Cmd::Export(a) => cli::export::run(a),
        Cmd::Init(a) => cli::init::run(a),
        Cmd::Retrofit(a) => cli::retrofit::run(a, precision),
        #[cfg(feature = "serve")]
        Cmd::Serve(a) => cli::serve::run(*a, precision),
        Cmd::Bench(c) => cli::bench::run(c, precision),
        Cmd::Presets => {
            cli::presets::run();
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Cli;
    use clap::CommandFactory;

    /// Every flag of every command says what it does in `--help`.
    #[test]
    fn every_flag_has_a_description() {
        fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for a in cmd.get_arguments() {
                let id = a.get_id().as_str();
                if id != "help" && id != "version" && a.get_help().is_none() {
                    missing.push(format!("{path} --{id}"));
                }
            }
            for s in cmd.get_subcommands() {
                walk(s, &format!("{path} {}", s.get_name()), missing);
            }
        }
        let mut missing = Vec::new();
        walk(&Cli::command(), "difftx", &mut missing);
        assert!(missing.is_empty(), "flags without help: {missing:?}");
        Cli::command().debug_assert();
        super::command().debug_assert();
    }

    /// `--bf16` shows in the help of the commands it changes, and only there.
    #[test]
    fn bf16_is_in_the_help_where_it_matters() {
        let help = |path: &[&str]| {
            let mut c = super::command();
            c.build();
            let mut sub = &mut c;
            for p in path {
                sub = sub.find_subcommand_mut(p).unwrap();
            }
            sub.render_long_help().to_string()
        };
        for p in [
            &["eval"][..],
            &["train"],
            &["generate"],
            &["bench", "decode"],
        ] {
            assert!(help(p).contains("--bf16"), "{p:?}");
        }
        for p in [
            &["plot"][..],
            &["presets"],
            &["tokenizer", "train"],
            &["repro"],
        ] {
            assert!(!help(p).contains("--bf16"), "{p:?}");
        }
    }
}
