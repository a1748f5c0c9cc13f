//! `difftx repro --long` end to end: every unit of the plan trained through the real trainer
//! (a run cut off resumes from its checkpoint) and measured once, each result kept in
//! `OUT/results/NAME.json`, then the report written from the results. Run it again after a
//! crash or Ctrl-C and it continues where it stopped.

use super::measure::{best_lr, measure_unit, UnitResult};
use super::plan::{LongCorpus, LongPlan, Stage, TrainUnit};
use super::render::render;
use crate::error::{Error, Result};
use crate::train::{prepare_run, train, Observer, Outcome, TrainOptions};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

pub const PLAN_FILE: &str = "plan.json";

/// How a call ended: the report written, or stopped by the flag (the next call continues).
#[derive(Debug, PartialEq)]
pub enum Ended {
    Report(PathBuf),
    Interrupted,
}

/// Runs (or continues) the study `plan` over `corpus` in `out`. `observer` gives each
/// training run its progress display; `note` receives a line per unit. `command` is the
/// command line, written into the report.
pub fn run_long(
    plan: &LongPlan,
    corpus: &LongCorpus,
    out: &Path,
    command: &str,
    stop: &AtomicBool,
    observer: &mut dyn FnMut(&str) -> Box<dyn Observer>,
    note: &mut dyn FnMut(&str),
) -> Result<Ended> {
    // 1. The folder's plan: written when new, the same one when continued
    plan.validate()?;
    check_plan(plan, corpus, out)?;
    let results_dir = out.join("results");
    std::fs::create_dir_all(&results_dir).map_err(|e| Error::io(&results_dir, e))?;
    let valid = std::fs::read(&corpus.valid).map_err(|e| Error::io(&corpus.valid, e))?;
    let corpus = &with_facts(plan, corpus, out)?;
    // 2. Each unit: its kept result, or trained (resumed) and measured
    let units = plan.units();
    let mut results: Vec<UnitResult> = Vec::with_capacity(units.len());
    for (i, unit) in units.iter().enumerate() {
        let path = results_dir.join(format!("{}.json", unit.name));
        if let Some(r) = read_result(&path)? {
            results.push(r);
            continue;
        }
        let lr = unit_lr(plan, unit, &results);
        let runs = out.join("runs");
        let dir = runs.join(&unit.name);
        note(&format!(
            "[{}/{}] {} at lr {lr}",
            i + 1,
            units.len(),
            unit.name
        ));
        let t0 = Instant::now();
        let opts = plan.options(unit, corpus, lr, &runs);
        let o = train_unit(
            &opts,
            &dir,
            &out.join("token-cache"),
            stop,
            observer(&unit.name),
        )?;
        if o.is_none_or(|o| o.interrupted) {
            return Ok(Ended::Interrupted);
        }
        let r = measure_unit(plan, unit, &dir, &valid, (lr, t0.elapsed().as_secs_f64()))?;
        let json = serde_json::to_vec_pretty(&r).map_err(|e| Error::Invalid(e.to_string()))?;
        crate::util::write_atomic(&path, &json)?;
        note(&summary(&r));
        results.push(r);
    }
    // 3. The report, from the results alone
    render(plan, corpus, &results, out, command).map(Ended::Report)
}

/// The corpus with the made-up facts (`facts.rs`) written beside the study, repeated to
/// make up the plan's share of the training bytes.
fn with_facts(plan: &LongPlan, corpus: &LongCorpus, out: &Path) -> Result<LongCorpus> {
    let bytes = tree_bytes(&corpus.train);
    let facts = super::facts::facts(plan.facts, super::measure::FACTS_SEED);
    let sentence = 36; // "the capital of xxxxia is xxxx. "
    let repeats = (plan.fact_share * bytes as f64 / (plan.facts.max(1) * sentence) as f64) as usize;
    let text = super::facts::training_text(&facts, repeats.max(3), super::measure::FACTS_SEED);
    let path = out.join("facts.txt");
    crate::util::write_atomic(&path, text.as_bytes())?;
    Ok(LongCorpus {
        facts: Some(path),
        ..corpus.clone()
    })
}

/// The bytes of a file, or of every file under a folder.
fn tree_bytes(path: &Path) -> u64 {
    match std::fs::read_dir(path) {
        Ok(entries) => entries.flatten().map(|e| tree_bytes(&e.path())).sum(),
        Err(_) => std::fs::metadata(path).map_or(0, |m| m.len()),
    }
}

/// Trains one unit into `dir`, continuing a run found there; None when stopped while the
/// data was being prepared.
fn train_unit(
    opts: &TrainOptions,
    dir: &Path,
    cache: &Path,
    stop: &AtomicBool,
    mut observer: Box<dyn Observer>,
) -> Result<Option<Outcome>> {
    let resume = dir.exists();
    let p = prepare_run(opts, dir, resume, None)?;
    let data = crate::data::prepare_dataset(&p.run.data, &p.tokenizer, cache, stop);
    if stop.load(Ordering::Relaxed) {
        return Ok(None);
    }
    let data = data?;
    crate::train::trainer::check_windows(&data, p.run.model.max_position_embeddings)?;
    let o = train(
        &p.run,
        &data,
        dir,
        p.tokenizer.file(),
        resume,
        &mut *observer,
        stop,
    )?;
    Ok(Some(o))
}

/// The unit's learning rate: the sweep's own; otherwise its kind's best in the sweep (the
/// ablations are diff_v1's).
fn unit_lr(plan: &LongPlan, unit: &TrainUnit, results: &[UnitResult]) -> f32 {
    match unit.stage {
        Stage::Sweep(i) => plan.lrs[i],
        _ => best_lr(plan, unit.kind, results),
    }
}

/// Writes the plan into a new study folder; refuses a folder that holds another plan.
pub fn check_plan(plan: &LongPlan, corpus: &LongCorpus, out: &Path) -> Result<()> {
    let path = out.join(PLAN_FILE);
    let want = serde_json::json!({
        "plan": plan,
        "corpus": {"train": corpus.train, "valid": corpus.valid, "tokenizer": corpus.tokenizer},
    });
    std::fs::create_dir_all(out).map_err(|e| Error::io(out, e))?;
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            let had: serde_json::Value = serde_json::from_str(&text).map_err(|e| Error::Data {
                path: path.clone(),
                msg: format!("malformed JSON ({e})"),
            })?;
            if had != want {
                return Err(Error::Invalid(format!(
                    "{} holds a study with another plan or corpus ({}); continue it with the same flags, or pass another --out",
                    out.display(),
                    path.display()
                )));
            }
            Ok(())
        }
        Err(_) => crate::util::write_atomic(&path, want.to_string().as_bytes()),
    }
}

/// A unit's kept result, if it finished before.
fn read_result(path: &Path) -> Result<Option<UnitResult>> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Ok(None);
    };
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| Error::Data {
            path: path.to_path_buf(),
            msg: format!("malformed result ({e}); delete it to measure that unit again"),
        })
}

/// One line per finished unit.
fn summary(r: &UnitResult) -> String {
    let mut s = format!(
        "{}: {} parameters, validation loss {:.4} after {:.0} s",
        r.name, r.params, r.val_loss, r.train_seconds
    );
    if let Some(e) = &r.eval {
        let last = e.by_position.last().map_or(f64::NAN, |b| b.cumulative);
        let retrieval =
            e.cells.iter().map(|c| c.accuracy).sum::<f64>() / e.cells.len().max(1) as f64;
        s.push_str(&format!(
            "; loss at C {:.4}, to the longest length {last:.4}; retrieval {retrieval:.3}",
            e.loss_at_c
        ));
    }
    s
}
