//! `difftx repro` end to end: every model of the plan trained and measured, then the run folder
//! written from the measurements.

use super::measure::{measure, train_needle, weight_quant_rows, KindRun};
use super::plan::ReproPlan;
use super::render::{
    render_report, write_heatmap, write_line_plots, write_results, HEATMAP_FILE, ICL_PLOT,
    REPORT_FILE, RESULTS_FILE,
};
use crate::config::AttentionKind;
use crate::error::{Error, Result};
use crate::experiments::corpus::Corpus;
use crate::experiments::icl::{icl_section, plot_icl, run_icl, IclRun};
use crate::experiments::lm_scaling::{lm_section, plot_scaling, run_lm, LmRun, SCALING_PLOT};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Runs the whole plan into `out`; `note` receives progress lines. `command` is the exact
/// command line, written into the report.
pub fn run_repro(
    plan: &ReproPlan,
    corpus: &Corpus,
    out: &Path,
    command: &str,
    mut note: impl FnMut(&str),
) -> Result<PathBuf> {
    plan.validate()?;
    let started = Instant::now();
    // every progress line says how long the run has taken so far
    let mut note = move |line: &str| {
        let t = started.elapsed().as_secs();
        note(&format!("[{:02}:{:02}] {line}", t / 60, t % 60))
    };
    std::fs::create_dir_all(out).map_err(|e| Error::io(out, e))?;
    let runs = run_needles(plan, out, &mut note)?;
    let icl = run_icl(&plan.icl, plan.seeds, &mut note)?;
    let lm = run_lm(
        &plan.lm,
        &corpus.text,
        &plan.ablations(),
        plan.seeds,
        &mut note,
    )?;
    let wall = started.elapsed().as_secs_f64();
    write_run(plan, out, &runs, &icl, &lm)?;
    let wq = weight_quant_rows(&lm);
    let mut report = render_report(plan, &runs, &wq, command, wall);
    report.push('\n');
    report.push_str(&icl_section(&plan.icl, &icl));
    report.push_str(&format!("\n![accuracy against shots]({ICL_PLOT})\n"));
    report.push('\n');
    report.push_str(&lm_section(&plan.lm, &corpus.line, &lm));
    let path = out.join(REPORT_FILE);
    std::fs::write(&path, report).map_err(|e| Error::io(&path, e))?;
    Ok(path)
}

/// Trains and measures the needle model of every kind with every seed, saving each model in
/// `out/models/KIND-seedS`.
fn run_needles(plan: &ReproPlan, out: &Path, note: &mut impl FnMut(&str)) -> Result<Vec<KindRun>> {
    let task = plan.task();
    let mut runs: Vec<KindRun> = Vec::new();
    for seed in 0..plan.seeds as u64 {
        for kind in AttentionKind::ALL {
            let t0 = Instant::now();
            let trained = train_needle(plan.model_config(kind), plan, &task, seed, |_, _| {})?;
            let seconds = t0.elapsed().as_secs_f64();
            let measured = measure(&trained.model, plan, &task)?;
            let dir = out.join("models").join(format!("{kind}-seed{seed}"));
            trained.model.save(&dir)?;
            let r = KindRun::new(kind, seed, trained, seconds, measured);
            note(&format!(
                "{kind} seed {seed}: {} steps in {:.0} s, final loss {:.3}, retrieval {:.3}, answer/noise mass {:.3}/{:.3}",
                plan.train.steps,
                seconds,
                r.final_loss(),
                r.overall_accuracy(),
                r.measured.allocation.answer,
                r.measured.allocation.noise
            ));
            runs.push(r);
        }
    }
    Ok(runs)
}

/// The plots and results.json of a run, from its measurements.
fn write_run(
    plan: &ReproPlan,
    out: &Path,
    runs: &[KindRun],
    icl: &[IclRun],
    lm: &[LmRun],
) -> Result<()> {
    write_heatmap(plan, runs, &out.join(HEATMAP_FILE))?;
    write_line_plots(plan, runs, out)?;
    plot_scaling(&plan.lm, lm, &out.join(SCALING_PLOT))?;
    plot_icl(&plan.icl, icl, &out.join(ICL_PLOT))?;
    write_results(plan, runs, icl, lm, &out.join(RESULTS_FILE))
}
