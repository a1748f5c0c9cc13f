//! `difftx tokenizer train`: a byte-level BPE tokenizer.json from your text.

use anyhow::Result;
use clap::{Args, Subcommand};
use difftx::util::thousands;
use std::path::PathBuf;

#[derive(Subcommand)]
pub enum TokenizerCmd {
    /// Train a byte-level BPE tokenizer (GPT-2 style) and write it as a tokenizer.json.
    ///
    /// Example: difftx tokenizer train --data texts/ --vocab-size 4096 --out tok.json
    ///
    /// Use it with `difftx train --tokenizer tok.json`.
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
    eprintln!("wrote {} ({} tokens)", a.out.display(), thousands(n));
    if n < a.vocab_size {
        eprintln!(
            "note: --vocab-size {} asked for more tokens than this text yields: BPE stopped at {} when no pair of tokens was left to merge",
            thousands(a.vocab_size),
            thousands(n)
        );
    }
    Ok(())
}
