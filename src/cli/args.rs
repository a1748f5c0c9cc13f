//! The command line's grammar: `Cli`, its subcommands and the parser `command()`. Kept apart
//! from `main` so that `tests/docs_commands.rs` parses the docs' commands with this same parser.

use clap::{CommandFactory, Parser, Subcommand};

#[derive(Parser)]
#[command(name = "difftx", version, about = "Train, run and evaluate Differential Transformer language models on a CPU.", long_about = None)]
pub struct Cli {
    /// Worker threads (default: all cores). Results are bit-identical for a given thread count.
    #[arg(long, global = true)]
    pub threads: Option<usize>,
    /// Matrix products in bf16 with f32 accumulation; weights, gradients and AdamW stay f32.
    /// Needs AVX512_BF16 on x86-64 (AMD Zen 4, Intel Cooper Lake or later), the bf16 extension
    /// on ARM64 (Apple M2, AWS Graviton 3 or later).
    #[arg(long, global = true)]
    pub bf16: bool,
    #[command(subcommand)]
    pub cmd: Cmd,
}

// Each command's help opens with one line of what it does and one example; the first line is
// also its line in `difftx --help`. `tests/docs_commands.rs` parses every example.
#[derive(Subcommand)]
pub enum Cmd {
    /// Train a tiny diff_v1 model and its matched standard baseline on the built-in text,
    /// compare their validation losses and plot both (22–80 s on 2 cores).
    ///
    /// Example: difftx demo --out runs/demo
    Demo(super::demo::DemoArgs),
    /// Train a model on your text, with checkpoints that survive crashes and resume exactly.
    ///
    /// Example: difftx train --data texts/ --preset small --attention diff_v1 --steps 2000 --out runs/a
    ///
    /// Guide: docs/TRAINING.md.
    Train(Box<super::train::TrainArgs>),
    /// Tokenizers: train a byte-level BPE tokenizer.json on your text.
    ///
    /// Example: difftx tokenizer train --data texts/ --vocab-size 4096 --out tok.json
    #[command(subcommand)]
    Tokenizer(super::tokenizer::TokenizerCmd),
    /// Overlay the loss curves of several runs in one PNG.
    ///
    /// Example: difftx plot runs/a runs/b --out compare.png
    Plot(super::plot::PlotArgs),
    /// Mean next-token loss and perplexity of a text file under a model.
    ///
    /// Example: difftx eval --model runs/a --data text.txt
    Eval(super::eval::EvalArgs),
    /// Generate text after a prompt; the continuation streams to stdout, the rest to stderr.
    ///
    /// Example: difftx generate --model runs/a --prompt "Once" --max-new-tokens 50
    Generate(super::generate::GenerateArgs),
    /// Train standard, diff_v1 and diff_v2 at matched parameters on the same data and measure
    /// the paper's claims side by side in OUT/REPRO.md.
    ///
    /// Example: difftx repro --quick --out runs/repro-quick
    ///
    /// Guide: docs/REPRO.md.
    Repro(super::repro::ReproArgs),
    /// Score a model on multi-needle retrieval: accuracy per context length × needle depth.
    ///
    /// Example: difftx needle --model runs/n --filler text.txt
    Needle(super::needle::NeedleArgs),
    /// Draw one head's attention over a prompt (A1, A2 and A1 − λA2 for the diff kinds).
    ///
    /// Example: difftx attention-map --model runs/a --prompt "the number is 12" --layer 0 --head 0 --out map.png
    AttentionMap(super::attention_map::AttentionMapArgs),
    /// Write a model for Hugging Face transformers (`--format hf`) or llama.cpp (`--format gguf`).
    ///
    /// Example: difftx export --model runs/a --format gguf --quant q8_0 --out m.gguf
    ///
    /// Guides: docs/INTEROP.md, docs/GGUF.md.
    Export(super::export::ExportArgs),
    /// Serve a model over an OpenAI-compatible HTTP API, with continuous batching.
    ///
    /// Example: difftx serve --model runs/a --port 8080
    ///
    /// Guide: docs/SERVING.md.
    #[cfg(feature = "serve")]
    Serve(Box<super::serve::ServeArgs>),
    /// Create a model directory with freshly initialised weights from a preset.
    ///
    /// Example: difftx init --preset tiny --attention diff_v1 --out m/
    Init(super::init::InitArgs),
    /// Turn a standard (Llama) model into diff_v2 (same logits) or diff_v1 (near them).
    ///
    /// Example: difftx retrofit --model llama/ --attention diff_v2 --data val.txt --out llama_v2/
    ///
    /// Guide: docs/FINETUNING.md.
    Retrofit(super::retrofit::RetrofitArgs),
    /// Benchmarks: training step, decoding, serving load, matrix products, memory.
    ///
    /// Example: difftx bench decode --preset bench --attention diff_v1
    ///
    /// Figures and how to reproduce them: docs/BENCHMARKS.md.
    #[command(subcommand)]
    Bench(super::bench::BenchCmd),
    /// Print the presets and their parameter counts for every attention kind.
    ///
    /// Example: difftx presets
    Presets,
}

/// The commands that run no matrix products of their own in bf16: `--bf16` is hidden from
/// their help and refused on their command line.
pub const NO_BF16: &[&str] = &["tokenizer", "plot", "repro", "export", "init", "presets"];

/// The parser: `Cli` with `--bf16` hidden where it would do nothing. A subcommand that
/// holds its own hidden `--bf16` is left out when clap copies the global flags down.
pub fn command() -> clap::Command {
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
