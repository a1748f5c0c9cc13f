//! The report of `repro --long`: REPRO_LONG.md with every table as mean ± sd over seeds, the
//! plots beside it, written from the units' results alone.

use super::measure::{AtC, ModelEval, UnitResult};
use super::plan::{LongCorpus, LongPlan};
use crate::config::AttentionKind;
use crate::error::Result;
use crate::experiments::common::{compare, fmt_ms, mean_std, table_head};
use crate::report::heatmap::{plot_heatmaps, Panel};
use crate::report::lines::{plot_lines, Axes, Line, Point};
use std::fmt::Write;
use std::path::{Path, PathBuf};

pub const REPORT_FILE: &str = "REPRO_LONG.md";
pub const HEATMAP: &str = "long_heatmap.png";
pub const BY_POSITION: &str = "long_by_position.png";
pub const BY_NEEDLES: &str = "long_needles.png";

/// The results of `stage` for `kind`, in seed order.
fn of<'a>(rs: &'a [UnitResult], stage: &str, kind: AttentionKind) -> Vec<&'a UnitResult> {
    rs.iter()
        .filter(|r| r.stage == stage && r.kind == kind.as_str())
        .collect()
}

/// One number of every result's evaluation.
fn each(rs: &[&UnitResult], f: impl Fn(&ModelEval) -> f64) -> Vec<f64> {
    rs.iter()
        .filter_map(|r| r.eval.as_ref().map(&f))
        .filter(|x| !x.is_nan())
        .collect()
}

/// One of the measures at C, NaN where the model has none (an extended one).
fn at_c(e: &ModelEval, f: impl Fn(&AtC) -> f64) -> f64 {
    e.at_c.as_ref().map_or(f64::NAN, f)
}

/// Writes the report and its plots into `out`; returns the report's path.
pub fn render(
    plan: &LongPlan,
    corpus: &LongCorpus,
    rs: &[UnitResult],
    out: &Path,
    command: &str,
) -> Result<PathBuf> {
    // 1. The plots
    plot_by_position(plan, rs, &out.join(BY_POSITION))?;
    plot_needles(rs, &out.join(BY_NEEDLES))?;
    plot_heatmap(plan, rs, &out.join(HEATMAP))?;
    // 2. The sections
    let mut s = String::new();
    head(&mut s, plan, corpus, rs, command);
    sweep(&mut s, plan, rs);
    language_modelling(&mut s, plan, rs);
    retrieval(&mut s, plan, rs);
    noise_and_outliers(&mut s, plan, rs);
    ablations(&mut s, rs);
    reading(&mut s, plan, rs);
    let path = out.join(REPORT_FILE);
    crate::util::write_atomic(&path, s.as_bytes())?;
    Ok(path)
}

fn head(s: &mut String, plan: &LongPlan, corpus: &LongCorpus, rs: &[UnitResult], command: &str) {
    let hours = rs.iter().map(|r| r.train_seconds).sum::<f64>() / 3600.0;
    let _ = writeln!(s, "# Long context at real scale: `difftx repro --long`\n");
    let _ = writeln!(s, "Command: `{command}`  ");
    let _ = writeln!(
        s,
        "Machine: {}, {} threads  ",
        cpu_name(),
        rayon::current_num_threads()
    );
    let _ = writeln!(
        s,
        "Time: {hours:.2} h of training and measuring, summed over the runs  "
    );
    let tok = corpus
        .tokenizer
        .as_ref()
        .map_or("byte-level".into(), |p| p.display().to_string());
    let _ = writeln!(
        s,
        "Corpus: training {}, validation {} (split by document), tokenizer {tok}\n",
        corpus.train.display(),
        corpus.valid.display()
    );
    for line in plan.describe() {
        let _ = writeln!(s, "- {line}");
    }
    let _ = writeln!(
        s,
        "\nEvery table is mean ± sample standard deviation over the seeds (one figure: one seed)."
    );
}

fn sweep(s: &mut String, plan: &LongPlan, rs: &[UnitResult]) {
    let _ = writeln!(s, "\n## Learning-rate sweep (validation loss, seed 0)\n");
    table_head(s, &["kind"], plan.lrs.iter().map(|l| format!("lr {l}")));
    for kind in AttentionKind::ALL {
        let runs = of(rs, "sweep", kind);
        let best = super::measure::best_lr(plan, kind, rs);
        let cells: Vec<String> = plan
            .lrs
            .iter()
            .map(|&lr| {
                runs.iter().find(|r| r.lr == lr).map_or("–".into(), |r| {
                    let mark = if lr == best { " (best)" } else { "" };
                    format!("{:.4}{mark}", r.val_loss)
                })
            })
            .collect();
        let _ = writeln!(s, "| {kind} | {} |", cells.join(" | "));
    }
}

fn language_modelling(s: &mut String, plan: &LongPlan, rs: &[UnitResult]) {
    let (c, longest) = (plan.context, plan.longest());
    let _ = writeln!(s, "\n## Language modelling and the loss by position\n");
    let cols = [
        "params".to_string(),
        "lr".into(),
        format!("loss at C = {c}"),
        format!("to {longest}, not extended"),
        "at C, extended".to_string(),
        format!("to {longest}, extended"),
    ];
    table_head(s, &["kind"], cols.into_iter());
    let last = |e: &ModelEval| e.by_position.last().map_or(f64::NAN, |b| b.cumulative);
    for kind in AttentionKind::ALL {
        let (p, x) = (of(rs, "pretrain", kind), of(rs, "extend", kind));
        let params = p.first().map_or(0, |r| r.params);
        let lr = p.first().map_or(f32::NAN, |r| r.lr);
        let _ = writeln!(
            s,
            "| {kind} | {params} | {lr} | {} | {} | {} | {} |",
            fmt_ms(&each(&p, |e| e.loss_at_c), 4),
            fmt_ms(&each(&p, last), 4),
            fmt_ms(&each(&x, |e| e.loss_at_c), 4),
            fmt_ms(&each(&x, last), 4)
        );
    }
    let _ = writeln!(
        s,
        "\n\"to {longest}\": the cumulative mean loss over windows of {longest} tokens (the paper's Figure 6); a model not extended reads positions past C it was never trained at.\n\n![loss by position]({BY_POSITION})"
    );
}

fn retrieval(s: &mut String, plan: &LongPlan, rs: &[UnitResult]) {
    let _ = writeln!(
        s,
        "\n## Multi-needle retrieval in haystacks of corpus text\n\n{} needles, {} asked, {} episodes per (length, depth) cell over depths {:?}: accuracy per length.\n",
        plan.needles, plan.queries, plan.episodes, plan.depths
    );
    let lengths = plan.lengths();
    table_head(s, &["kind", "model"], lengths.iter().map(|l| l.to_string()));
    for kind in AttentionKind::ALL {
        for (stage, label) in [("pretrain", "at C"), ("extend", "extended")] {
            let runs = of(rs, stage, kind);
            let cells: Vec<String> = lengths
                .iter()
                .map(|&l| fmt_ms(&each(&runs, |e| e.at_length(l)), 3))
                .collect();
            let _ = writeln!(s, "| {kind} | {label} | {} |", cells.join(" | "));
        }
    }
    let _ = writeln!(s, "\n![retrieval heatmaps]({HEATMAP})\n\nAccuracy against the number of needles N at C (R = min(2, N)), extended models:\n");
    let ns: Vec<usize> = rs
        .iter()
        .filter_map(|r| r.eval.as_ref())
        .find(|e| !e.by_needles.is_empty())
        .map_or(Vec::new(), |e| e.by_needles.iter().map(|p| p.0).collect());
    table_head(s, &["kind"], ns.iter().map(|n| format!("N = {n}")));
    for kind in AttentionKind::ALL {
        let runs = of(rs, "extend", kind);
        let cells: Vec<String> = (0..ns.len())
            .map(|i| fmt_ms(&each(&runs, |e| e.by_needles[i].1), 3))
            .collect();
        let _ = writeln!(s, "| {kind} | {} |", cells.join(" | "));
    }
    let _ = writeln!(s, "\n![accuracy against N]({BY_NEEDLES})");
}

fn noise_and_outliers(s: &mut String, plan: &LongPlan, rs: &[UnitResult]) {
    let _ = writeln!(
        s,
        "\n## Attention noise, outliers and low-bit weights (models at C)\n\nAttention mass on the queried needle and on the rest of the haystack (Table 3; rows predicting the answer, every head and layer, episodes of {} tokens); the largest attention logit and block output over their medians on a window of validation text (Table 5); the loss at C with q8_0 and q4_0 weights less the f32 loss; \"from context\": the share of {} made-up facts, repeated through the training text, that the model answers from a passage of {} tokens stating otherwise (a contextual-hallucination proxy: higher is less hallucination).\n",
        plan.context, plan.facts, plan.fact_context.min(plan.context)
    );
    let cols = [
        "answer mass",
        "noise mass",
        "logit max/median",
        "hidden max/median",
        "Δloss q8_0",
        "Δloss q4_0",
        "from context",
    ];
    table_head(s, &["kind"], cols.iter().map(|c| c.to_string()));
    for kind in AttentionKind::ALL {
        let p = of(rs, "pretrain", kind);
        let fs: [&dyn Fn(&ModelEval) -> f64; 7] = [
            &|e| at_c(e, |a| a.answer_mass),
            &|e| at_c(e, |a| a.noise_mass),
            &|e| at_c(e, |a| a.logit_top1_ratio),
            &|e| at_c(e, |a| a.hidden_top1_ratio),
            &|e| at_c(e, |a| a.q8_0_increase),
            &|e| at_c(e, |a| a.q4_0_increase),
            &|e| at_c(e, |a| a.from_context),
        ];
        let cells: Vec<String> = fs.iter().map(|f| fmt_ms(&each(&p, f), 4)).collect();
        let _ = writeln!(s, "| {kind} | {} |", cells.join(" | "));
    }
}

fn ablations(s: &mut String, rs: &[UnitResult]) {
    let rows: Vec<&UnitResult> = rs
        .iter()
        .filter(|r| {
            (r.stage == "pretrain" && r.kind == "diff_v1" && r.seed == 0) || r.stage == "ablation"
        })
        .collect();
    if rows.len() < 2 {
        return;
    }
    let _ = writeln!(
        s,
        "\n## diff_v1's λ_init and subln (paper Table 6), seed 0\n"
    );
    table_head(
        s,
        &["variant"],
        ["validation loss".to_string(), "final mean λ".into()].into_iter(),
    );
    for r in rows {
        let v = r
            .variant
            .clone()
            .unwrap_or("the schedule 0.8 − 0.6·exp(−0.3·l)".into());
        let lambda = r.lambda.last().map_or(f64::NAN, |l| l.1);
        let _ = writeln!(s, "| {v} | {:.4} | {lambda:.3} |", r.val_loss);
    }
}

/// Each diff kind against standard on the study's main figures, in words.
fn reading(s: &mut String, plan: &LongPlan, rs: &[UnitResult]) {
    let _ = writeln!(s, "\n## Reading\n");
    let longest = plan.longest();
    let last = |e: &ModelEval| e.by_position.last().map_or(f64::NAN, |b| b.cumulative);
    for diff in [AttentionKind::DiffV1, AttentionKind::DiffV2] {
        let pair = |stage: &str, f: &dyn Fn(&ModelEval) -> f64| {
            (
                each(&of(rs, stage, diff), f),
                each(&of(rs, stage, AttentionKind::Standard), f),
            )
        };
        let (d, st) = pair("pretrain", &|e| e.loss_at_c);
        let _ = writeln!(
            s,
            "{}",
            compare("validation loss at C", diff, &d, &st, false)
        );
        let (d, st) = pair("extend", &last);
        let what = format!("loss to {longest} after extension");
        let _ = writeln!(s, "{}", compare(&what, diff, &d, &st, false));
        let (d, st) = pair("extend", &|e| e.at_length(longest));
        let what = format!("retrieval at {longest} after extension");
        let _ = writeln!(s, "{}", compare(&what, diff, &d, &st, true));
        let (d, st) = pair("pretrain", &|e| at_c(e, |a| a.noise_mass));
        let _ = writeln!(s, "{}", compare("attention noise", diff, &d, &st, false));
        let (d, st) = pair("pretrain", &|e| at_c(e, |a| a.hidden_top1_ratio));
        let _ = writeln!(
            s,
            "{}",
            compare("block-output outliers", diff, &d, &st, false)
        );
        let (d, st) = pair("pretrain", &|e| at_c(e, |a| a.q4_0_increase));
        let _ = writeln!(
            s,
            "{}",
            compare("loss increase at q4_0", diff, &d, &st, false)
        );
        let (d, st) = pair("pretrain", &|e| at_c(e, |a| a.from_context));
        let what = "answers from the context (hallucination proxy)";
        let _ = writeln!(s, "{}", compare(what, diff, &d, &st, true));
    }
}

/// Cumulative loss by position, mean over seeds, per kind, not extended and extended.
fn plot_by_position(plan: &LongPlan, rs: &[UnitResult], png: &Path) -> Result<()> {
    let mut lines = Vec::new();
    for kind in AttentionKind::ALL {
        for (stage, label) in [("pretrain", "at C"), ("extend", "extended")] {
            let runs = of(rs, stage, kind);
            let Some(first) = runs.iter().find_map(|r| r.eval.as_ref()) else {
                continue;
            };
            let points = (0..first.by_position.len())
                .map(|i| {
                    point(
                        first.by_position[i].end as f64,
                        &each(&runs, |e| e.by_position[i].cumulative),
                    )
                })
                .collect();
            lines.push(Line {
                label: format!("{kind} ({label})"),
                points,
            });
        }
    }
    let title = format!("cumulative loss by position, windows of {}", plan.longest());
    let axes = Axes {
        title: &title,
        x_label: "position",
        y_label: "cumulative mean loss (nats/token)",
        log_x: false,
        y_range: None,
    };
    plot_lines(&lines, &axes, png)
}

/// Accuracy against N per kind, extended models.
fn plot_needles(rs: &[UnitResult], png: &Path) -> Result<()> {
    let mut lines = Vec::new();
    for kind in AttentionKind::ALL {
        let runs = of(rs, "extend", kind);
        let Some(first) = runs.iter().find_map(|r| r.eval.as_ref()) else {
            continue;
        };
        let points = (0..first.by_needles.len())
            .map(|i| {
                point(
                    first.by_needles[i].0 as f64,
                    &each(&runs, |e| e.by_needles[i].1),
                )
            })
            .collect();
        lines.push(Line {
            label: kind.to_string(),
            points,
        });
    }
    let axes = Axes {
        title: "retrieval at C against the number of needles (extended models)",
        x_label: "needles N",
        y_label: "accuracy",
        log_x: false,
        y_range: Some((0.0, 1.0)),
    };
    plot_lines(&lines, &axes, png)
}

/// Depth × length accuracy of the extended models, mean over seeds, one panel per kind.
fn plot_heatmap(plan: &LongPlan, rs: &[UnitResult], png: &Path) -> Result<()> {
    let lengths = plan.lengths();
    let panels: Vec<Panel> = AttentionKind::ALL
        .iter()
        .map(|&kind| {
            let runs = of(rs, "extend", kind);
            let values = plan
                .depths
                .iter()
                .map(|&d| {
                    lengths
                        .iter()
                        .map(|&l| {
                            let v = each(&runs, |e| {
                                e.cells
                                    .iter()
                                    .find(|c| c.len == l && c.depth == d)
                                    .map_or(f64::NAN, |c| c.accuracy)
                            });
                            mean_std(&v).0
                        })
                        .collect()
                })
                .collect();
            Panel {
                title: kind.to_string(),
                values,
            }
        })
        .collect();
    let rows: Vec<String> = plan
        .depths
        .iter()
        .map(|d| format!("{:.0}%", d * 100.0))
        .collect();
    let cols: Vec<String> = lengths.iter().map(|l| l.to_string()).collect();
    let title = format!("retrieval after extension to {}", plan.longest());
    plot_heatmaps(
        &panels,
        &rows,
        &cols,
        "depth",
        "length (tokens)",
        &title,
        png,
    )
}

fn point(x: f64, ys: &[f64]) -> Point {
    let (y, sd) = mean_std(ys);
    Point { x, y, sd }
}

/// The CPU's model name, as /proc/cpuinfo gives it (or the architecture).
fn cpu_name() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}
