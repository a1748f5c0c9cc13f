//! `difftx train`: train on your text, with checkpoints that resume exactly.

use super::ablations;
use super::progress::{Progress, Stop};
use anyhow::{bail, Result};
use clap::Args;
use difftx::util::thousands;
use difftx::AttentionKind;
use std::path::{Path, PathBuf};

#[derive(Args)]
#[command(after_help = "Examples:
  difftx train --data notes/ --attention diff_v1 --steps 2000 --out runs/a
  difftx train --config run.toml --out runs/b          (TOML keys = flag names with _)
  difftx train --data notes/ --out runs/a --resume     (after a crash or Ctrl-C)

The run folder holds run.json, metrics.jsonl, loss.png and checkpoints/. Ctrl-C or SIGTERM
saves a checkpoint and exits with 130 or 143. More in docs/TRAINING.md.")]
pub struct TrainArgs {
    /// Run folder: metrics, plot and checkpoints go here.
    #[arg(long)]
    pub out: PathBuf,
    /// Continue from the newest complete checkpoint in --out (start fresh if there is none).
    /// The recorded settings are used; any setting given again must match them.
    #[arg(long)]
    pub resume: bool,
    /// A TOML file of settings (same names as the flags, with underscores); flags override it.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Folder for token files (reused by any run on the same data and tokenizer)
    /// [default: token-cache/ next to --out].
    #[arg(long, value_name = "DIR")]
    pub token_cache: Option<PathBuf>,
    /// With --resume: train N steps past the run's recorded end, at --min-lr.
    #[arg(long, value_name = "N", requires = "resume", value_parser = clap::value_parser!(u64).range(1..))]
    pub extend_steps: Option<u64>,
    /// Off a terminal, print a progress line every N steps [default: about twenty a run].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub log_every: Option<u64>,
    #[command(flatten)]
    pub opts: difftx::train::TrainOptions,
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

pub fn run(a: TrainArgs, precision: difftx::kernels::Precision) -> Result<()> {
    // 1. Options: the TOML file, overlaid by the flags
    let mut opts = match &a.config {
        Some(p) => difftx::train::TrainOptions::from_toml_file(p)?.overlaid(&a.opts),
        None => a.opts.clone(),
    };
    if precision == difftx::kernels::Precision::Bf16 {
        opts.bf16 = Some(true);
    }
    // 2. Everything that can be checked is checked before anything is written or printed.
    let difftx::train::PreparedRun {
        run,
        tokenizer: tok,
        options: opts,
    } = difftx::train::prepare_run(&opts, &a.out, a.resume, a.extend_steps)?;
    // A run recorded with bf16 products (or `bf16 = true` in TOML) trains with them.
    if run.train.bf16 && difftx::kernels::Precision::new(true).is_none() {
        bail!(
            "this run uses bf16 matrix products (--bf16), which need {}; this machine has none",
            difftx::kernels::Precision::bf16_requirement()
        );
    }
    // 3. Data: tokenized once into the token cache, interruptible
    let stop = Stop::new()?;
    let name = a
        .out
        .file_name()
        .map_or("train".into(), |n| n.to_string_lossy().into_owned());
    let data = difftx::data::prepare_dataset(&run.data, &tok, &token_cache(&a), &stop.flag);
    if stop.flag.load(std::sync::atomic::Ordering::Relaxed) {
        eprintln!("{name}: interrupted while preparing the data; nothing was trained");
        return Err(stop.interrupted().into());
    }
    let data = data?;
    difftx::train::trainer::check_windows(&data, run.model.max_position_embeddings)?;
    // 4. One trainer per run folder, from here to the end (the trainer takes it once more).
    let _lock = difftx::train::checkpoint::lock_run(&a.out)?;
    for n in &data.notes {
        eprintln!("{name}: {n}");
    }
    describe(&name, &run, &opts, tok.vocab_size());
    // 5. Train
    let mut progress = Progress::new(&name, a.log_every);
    let o = difftx::train::train(
        &run,
        &data,
        &a.out,
        tok.file(),
        a.resume,
        &mut progress,
        &stop.flag,
    )?;
    drop(progress);
    // 6. Report: how it ended, and the loss curve
    if o.interrupted {
        eprintln!(
            "{name}: interrupted at step {}; checkpoint {} saved — continue with the same command and --resume",
            o.step,
            o.checkpoint.display()
        );
        return Err(stop.interrupted().into());
    }
    report(&name, &run, &o, &a.out);
    Ok(())
}

/// --token-cache, or token-cache/ next to the run folder.
fn token_cache(a: &TrainArgs) -> PathBuf {
    a.token_cache.clone().unwrap_or_else(|| {
        let parent = a.out.parent().filter(|p| !p.as_os_str().is_empty());
        parent
            .unwrap_or(std::path::Path::new("."))
            .join("token-cache")
    })
}

/// The lines before the first step: the model (a preset's says how the kinds match, a model
/// fine-tuned says where it came from), its shape, the schedule and the threads.
fn describe(
    name: &str,
    run: &difftx::train::RunConfig,
    opts: &difftx::train::TrainOptions,
    vocab: usize,
) {
    let m = &run.model;
    let origin = match &run.init_from {
        Some(dir) => format!(
            "fine-tuning {}: {}{}, {} parameters",
            dir.display(),
            m.attention,
            ablations(m),
            thousands(m.num_params())
        ),
        None => format!(
            "{} {}{} — {} parameters (matched at these settings: {})",
            run.preset.as_str(),
            m.attention,
            ablations(m),
            thousands(m.num_params()),
            matched_counts(opts, vocab)
        ),
    };
    eprintln!(
        "{name}: {origin}; D {} L {} heads {}/{} d {} context {}, vocab {}",
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
    if let Some(end) = run.train.decay_steps {
        eprintln!(
            "{name}: the learning rate decays to {:.2e} by step {end}, then stays there until step {}",
            run.train.min_lr, run.train.steps
        );
    }
}

/// The lines after a run that ended (not interrupted): its losses, the model and the plot.
fn report(name: &str, run: &difftx::train::RunConfig, o: &difftx::train::Outcome, out: &Path) {
    if o.train_loss.is_nan() && o.val_loss.is_none() {
        // resumed from the final checkpoint: no step was left to take
        eprintln!("{name}: already complete at step {}", o.step);
        return;
    }
    let val = o.val_loss.map_or("-".into(), |v| format!("{v:.4}"));
    eprintln!(
        "{name}: done, {}; train loss {:.4}, val loss {val}",
        steps_done(o),
        o.train_loss
    );
    eprintln!("{name}: model {}", o.checkpoint.display());
    let label = format!("{} ({} params)", run.model.attention, thousands(o.params));
    let title = format!("{name} — {} preset", run.preset.as_str());
    match difftx::train::metrics::plot_run(out, label, &title) {
        Ok(p) => eprintln!("{name}: loss curve {}", p.display()),
        Err(e) => eprintln!("{name}: could not draw the loss plot: {e}"),
    }
}

/// "600 steps in 17 s", or for a resumed run "step 600: 400 steps in 17 s (resumed at 200)".
fn steps_done(o: &difftx::train::Outcome) -> String {
    let ran = o.step - o.first_step;
    if o.first_step == 0 {
        format!("{ran} steps in {:.0} s", o.seconds)
    } else {
        format!(
            "step {}: {ran} steps in {:.0} s (resumed at {})",
            o.step, o.seconds, o.first_step
        )
    }
}
