//! `difftx tokenizer train`: a byte-level BPE tokenizer.json from your text.

use anyhow::Result;
use clap::{Args, Subcommand};
use std::path::PathBuf;

#[derive(Subcommand)]
pub enum TokenizerCmd {
    /// Train a byte-level BPE tokenizer (GPT-2 style) and write it as a Hugging Face
    /// tokenizer.json, for `difftx train --tokenizer`.
    Train(TokenizerTrainArgs),
}

#[derive(Args)]
pub struct TokenizerTrainArgs {
    /// Text files, folders or glob patterns.
    #[arg(long, num_args = 1.., required = true, value_name = "PATH")]
    pub data: Vec<String>,
    /// Vocabulary size, including the 256 byte symbols.
    #[arg(long)]
    pub vocab_size: usize,
    /// Where to write tokenizer.json.
    #[arg(long)]
    pub out: PathBuf,
}

pub fn run(cmd: TokenizerCmd) -> Result<()> {
    match cmd {
        TokenizerCmd::Train(a) => train(a),
    }
}

fn train(a: TokenizerTrainArgs) -> Result<()> {
    let n = difftx::data::corpus::train_bpe(&a.data, a.vocab_size, &a.out)?;
    eprintln!("wrote {} ({n} tokens)", a.out.display());
    Ok(())
}
