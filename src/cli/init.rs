//! `difftx init`: a model directory with freshly initialised weights.

use super::ablations;
use anyhow::Result;
use clap::Args;
use difftx::{AttentionKind, Model, ModelConfig, Preset};
use std::path::PathBuf;

#[derive(Args)]
pub struct InitArgs {
    /// Model size: tiny, bench, small, medium or large (`difftx presets` shows each shape).
    #[arg(long, default_value = "tiny")]
    pub preset: Preset,
    /// standard, diff_v1 or diff_v2
    #[arg(long, default_value = "diff_v1")]
    pub attention: AttentionKind,
    /// Seed of the initial weights (same seed, same weights).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// diff_v1 ablation (paper Table 6): one constant λ_init in [0, 1) for every layer
    /// [default: the paper's per-layer schedule].
    #[arg(long, value_name = "X")]
    pub lambda_init: Option<f64>,
    /// diff_v1 ablation (paper Table 6): no per-head RMSNorm (subln) and no (1 − λ_init) scale.
    #[arg(long)]
    pub no_subln: bool,
    /// Vocabulary size [default: 256, the bytes]; more is for speed measurements only.
    #[arg(long, value_name = "N")]
    pub vocab_size: Option<usize>,
    /// Context length in tokens [default: the preset's].
    #[arg(long, value_name = "N")]
    pub context: Option<usize>,
    /// RoPE base θ [default: 10000].
    #[arg(long, value_name = "X")]
    pub rope_theta: Option<f64>,
    /// Output model directory.
    #[arg(long)]
    pub out: PathBuf,
}

pub fn run(a: InitArgs) -> Result<()> {
    let preset = super::preset_config(a.preset, a.attention, a.vocab_size)?;
    let config = ModelConfig {
        lambda_init: a.lambda_init,
        subln: !a.no_subln,
        max_position_embeddings: a.context.unwrap_or(preset.max_position_embeddings),
        rope_theta: a.rope_theta.unwrap_or(preset.rope_theta),
        ..preset
    };
    let model = Model::init(config, a.seed)?;
    model.save(&a.out)?;
    eprintln!(
        "wrote {} ({} {}{}, context {}, {} parameters)",
        a.out.display(),
        a.preset.as_str(),
        a.attention,
        ablations(&model.config),
        model.config.max_position_embeddings,
        model.num_params()
    );
    Ok(())
}
