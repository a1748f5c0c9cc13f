//! Load a model and continue a prompt with a sampler.
//!
//! ```text
//! cargo run --release --example generate -- [MODEL_DIR] [PROMPT]
//! ```
//!
//! MODEL_DIR is a difftx or Hugging Face model directory, or a training run folder (its
//! newest checkpoint). Without one, an untrained tiny diff_v1 model is made in a temporary
//! directory, so the text is noise; the calls are the same.

use difftx::prelude::*;
use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> std::result::Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let mut _temp = None; // a made-up model's directory lives until the end
    let dir = match args.next() {
        Some(d) => PathBuf::from(d),
        None => {
            let t = tempfile::tempdir()?;
            let config = ModelConfig::preset(Preset::Tiny, AttentionKind::DiffV1);
            Model::init(config, 0)?.save(t.path())?;
            eprintln!("no model given: an untrained tiny diff_v1 model");
            let dir = t.path().to_path_buf();
            _temp = Some(t);
            dir
        }
    };
    let prompt = args.next().unwrap_or_else(|| "Once upon a time".into());

    let (model, tok) = open_model(&dir)?;
    let opts = GenerateOptions {
        max_new_tokens: 32,
        sampling: Sampling {
            temperature: 0.8,
            top_k: Some(40),
            top_p: Some(0.95),
            ..Sampling::greedy()
        },
        seed: 0,
        eos: tok.eos_id(&model.config),
        truncate_prompt: true,
        lookup: 0,
    };
    opts.sampling.validate()?;
    let prompts = vec![tok.encode(&prompt)?];
    let g = generate(&model, &prompts, &opts, |_, _| {})?;

    println!("prompt: {prompt:?}");
    println!("continuation: {:?}", tok.decode(&g.tokens[0])?);
    println!("new tokens: {}", g.tokens[0].len());
    println!("decode: {:.0} tokens/s", g.decode_tokens_per_second());
    Ok(())
}
