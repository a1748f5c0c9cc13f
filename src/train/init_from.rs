//! Fine-tuning: a run that starts from a model's weights (`--init-from DIR`) instead of a
//! seeded initialisation. The model brings its config and its tokenizer; the run's flags may
//! repeat them but not change them, except the two that no weight depends on: the context (the
//! length of the windows trained on) and the RoPE base θ. Changing both is context extension
//! as the paper did it (continue training at a longer context with a larger θ).

use super::checkpoint::model_dir;
use super::options::TrainOptions;
use crate::config::{AttentionKind, ModelConfig};
use crate::data::tokenizer::{Tokenizer, TOKENIZER_FILE};
use crate::error::{Error, Result};
use crate::model::Model;
use std::path::{Path, PathBuf};

/// The options of a run that starts from the model at `from` (a model directory or a run
/// folder): the model's values fill every model flag and its tokenizer the tokenizer's, after
/// checking that the flags given agree with them. Also returns the model's config, which the
/// run keeps whole (with the keys difftx does not read), and the model directory used.
pub fn options_from_model(
    opts: &TrainOptions,
    from: &Path,
) -> Result<(TrainOptions, ModelConfig, PathBuf)> {
    // 1. The model directory (a run folder's newest checkpoint) and its config
    let (dir, _) = model_dir(from)?;
    let config = crate::interop::load_config(&dir)?;
    // 2. Flags that would give another model
    check_agrees(opts, &config, &dir)?;
    // 3. Its tokenizer: tokenizer.json beside the weights, or byte-level
    let tokenizer = dir.join(TOKENIZER_FILE);
    let tokenizer = tokenizer.is_file().then_some(tokenizer);
    let own = match &tokenizer {
        Some(p) => Tokenizer::from_file(p)?,
        None => Tokenizer::for_model(&dir, &config)?,
    };
    if let Some(given) = &opts.tokenizer {
        if Tokenizer::from_file(given)?.fingerprint() != own.fingerprint() {
            return Err(Error::Invalid(format!(
                "--tokenizer {} is not the tokenizer of --init-from {} ({}); drop --tokenizer",
                given.display(),
                dir.display(),
                tokenizer
                    .as_ref()
                    .map_or("byte-level".to_string(), |p| p.display().to_string()),
            )));
        }
    }
    // 4. The options, every model setting given by the model
    let c = &config;
    let mut o = opts.clone();
    o.init_from = Some(dir.clone());
    o.tokenizer = tokenizer;
    o.preset = None;
    o.set_shape(c);
    o.max_position_embeddings = opts
        .max_position_embeddings
        .or(Some(c.max_position_embeddings));
    o.rope_theta = opts.rope_theta.or(Some(c.rope_theta));
    o.rms_norm_eps = Some(c.rms_norm_eps);
    o.tie_word_embeddings = Some(c.tie_word_embeddings);
    o.lambda_init = c.lambda_init;
    o.no_subln = Some(!c.subln);
    Ok((o, config, dir))
}

/// Refuses a model flag whose value differs from the model's, in one line naming both.
fn check_agrees(opts: &TrainOptions, c: &ModelConfig, dir: &Path) -> Result<()> {
    let differs = |flag: &str, given: String, model: String| {
        Err(Error::Invalid(format!(
            "--{flag} {given} contradicts --init-from {}, whose {} is {model}; drop --{flag}",
            dir.display(),
            flag.replace('-', "_"),
        )))
    };
    if let Some(p) = &opts.preset {
        return Err(Error::Invalid(format!(
            "--preset {p} does not apply with --init-from {}: the model's size comes from it",
            dir.display()
        )));
    }
    if let Some(a) = &opts.attention {
        let kind: AttentionKind = a.parse().map_err(Error::Invalid)?;
        if kind != c.attention {
            let hint = " (to change the attention, `difftx retrofit` first)";
            return differs(
                "attention",
                a.clone(),
                format!("{}{hint}", c.attention.as_str()),
            );
        }
    }
    let sizes = [
        ("hidden-size", opts.hidden_size, c.hidden_size),
        (
            "intermediate-size",
            opts.intermediate_size,
            c.intermediate_size,
        ),
        (
            "num-hidden-layers",
            opts.num_hidden_layers,
            c.num_hidden_layers,
        ),
        (
            "num-attention-heads",
            opts.num_attention_heads,
            c.num_attention_heads,
        ),
        (
            "num-key-value-heads",
            opts.num_key_value_heads,
            c.num_key_value_heads,
        ),
        ("head-dim", opts.head_dim, c.head_dim),
    ];
    for (flag, given, model) in sizes {
        match given {
            Some(g) if g != model => return differs(flag, g.to_string(), model.to_string()),
            _ => {}
        }
    }
    match opts.rms_norm_eps {
        Some(g) if g != c.rms_norm_eps => {
            return differs("rms-norm-eps", g.to_string(), c.rms_norm_eps.to_string())
        }
        _ => {}
    }
    match opts.tie_word_embeddings {
        Some(t) if t != c.tie_word_embeddings => differs(
            "tie-word-embeddings",
            t.to_string(),
            c.tie_word_embeddings.to_string(),
        ),
        _ => match (opts.lambda_init, opts.no_subln) {
            (Some(l), _) if Some(l) != c.lambda_init => differs(
                "lambda-init",
                l.to_string(),
                c.lambda_init
                    .map_or("the schedule".into(), |x| x.to_string()),
            ),
            (_, Some(no)) if no == c.subln => {
                differs("no-subln", no.to_string(), (!c.subln).to_string())
            }
            _ => Ok(()),
        },
    }
}

/// The model a run starts from: the weights at `dir` under the run's config (the same shapes;
/// only the context and the RoPE base may differ, which no weight depends on: the rotary
/// table is built for the run's).
pub fn start_from(dir: &Path, config: &ModelConfig) -> Result<Model> {
    let loaded = crate::interop::load(dir)?;
    let mut model = Model::zeros(config.clone())?;
    if model.layout.total != loaded.params.len() {
        return Err(Error::Invalid(format!(
            "--init-from {}: its {} parameters do not fit the run's model ({})",
            dir.display(),
            loaded.params.len(),
            model.layout.total
        )));
    }
    model.params = loaded.params;
    Ok(model)
}
