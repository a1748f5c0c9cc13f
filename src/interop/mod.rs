//! Moving models between difftx and Hugging Face transformers, and loading either kind.

pub mod hf;

use crate::error::Result;
use crate::model::checkpoint::read_config;
use crate::model::Model;
use std::path::Path;

/// Loads a model directory of either kind: native difftx (`config.json` +
/// `model.safetensors`), or a Hugging Face `llama` / `diffllama` directory, converted exactly on
/// load (see `hf`). The directory's `config.json` decides which. A directory with a
/// `manifest.json` (every directory difftx writes) is verified against it first: a damaged
/// file is an error naming it.
pub fn load(dir: &Path) -> Result<Model> {
    crate::util::manifest::verify(dir)?;
    let (cpath, json) = read_config(dir)?;
    match json.get("model_type").and_then(|v| v.as_str()) {
        Some("llama" | "diffllama") => hf::load(dir, &json),
        _ => Model::load_native(dir, &cpath, &json),
    }
}
