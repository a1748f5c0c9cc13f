//! In-context learning rendered: the REPRO.md section, the plot and the JSON, each from the
//! measured runs.

use super::measure::{icl_reference, IclRun, IclScores};
use super::plan::IclPlan;
use crate::config::AttentionKind;
use crate::error::Result;
use crate::experiments::common::{compare, fmt_ms, mean_std, notes_line, table_head};
use crate::report::lines::{plot_lines, Axes, Line, Point};
use crate::util::thousands;
use serde_json::json;
use std::fmt::Write as _;
use std::path::Path;

fn of_kind(runs: &[IclRun], kind: AttentionKind) -> Vec<&IclRun> {
    runs.iter().filter(|r| r.kind == kind).collect()
}

fn per(runs: &[IclRun], kind: AttentionKind, f: impl Fn(&IclRun) -> f64) -> Vec<f64> {
    of_kind(runs, kind).into_iter().map(f).collect()
}

/// The `## In-context learning` section of REPRO.md.
pub fn icl_section(plan: &IclPlan, runs: &[IclRun]) -> String {
    let reference = icl_reference(plan).ok();
    let mut s = protocol(plan);
    s.push_str(&shots_table(plan, runs, reference.as_ref()));
    s.push_str(&orders_table(plan, runs, reference.as_ref()));
    s.push_str(&claims(plan, runs));
    s
}

/// The heading, where the paper's claim is, and how this run trains and evaluates.
fn protocol(plan: &IclPlan) -> String {
    let mut s = String::new();
    let n = plan.max_shots();
    let _ = writeln!(s, "## In-context learning (paper Section 3.5)\n");
    let _ = writeln!(s, "{}\n", notes_line("In-context learning"));
    let bayes = plan
        .task()
        .map(|t| t.bayes_accuracy(20_000, plan.eval_seed))
        .unwrap_or(f64::NAN);
    for line in [
        format!("Task: K = {} seeded classes of {} letters each over 16 letters; an input is {} letter(s), each from its class's letters with probability {} and uniform otherwise, so the classes overlap (the most likely class is right for {bayes:.3} of inputs). Each test episode maps the classes to K random distinct digits, so a class's label is only in the context; a shot is the input followed by its label (`d9g6…`), classes uniform.", plan.classes, plan.letters_per_class, plan.input_len, 1.0 - plan.noise),
        format!("Training: {} steps of {} windows of {} bytes full of items (each item's label is a query with the items before it as shots), the same bytes and initial-weight seeds for every kind; {} of every {} windows relabel the classes by a rotation (class c gets digit c + r mod 10), the rest at random (in pilot runs without them, the standard model did not learn random relabellings within this budget). Loss on {}; AdamW, peak lr {}, {} warm-up steps, cosine to lr/10.", plan.train.steps, plan.train.batch, plan.train.context, plan.rotated_rows(), plan.train.batch, if plan.labels_only { "the label bytes only" } else { "every byte" }, plan.train.lr, plan.train.warmup),
        format!("Evaluation: {} fixed test episodes (seed {}), random relabellings; the n-shot prompt is the first n of an episode's {n} demonstrations then the query; a prediction is the argmax of the next-token logits over the episode's K labels (chance {:.3}). Orders: {} random permutations of the {n} demonstrations of every episode; accuracy per order, best − worst and the standard deviation over orders. Reference: a reader that knows the classes (most likely class of every input, majority label of the demonstrations of the query's class).", plan.test_episodes, plan.eval_seed, 1.0 / plan.classes as f64, plan.orders),
    ] {
        let _ = writeln!(s, "- {line}");
    }
    s
}

/// Accuracy against the number of shots, per kind and for the reference reader.
fn shots_table(plan: &IclPlan, runs: &[IclRun], reference: Option<&IclScores>) -> String {
    let mut s = String::new();
    let seeds = runs.iter().map(|r| r.seed).max().map_or(0, |m| m + 1);
    let _ = writeln!(
        s,
        "\nAccuracy against the number of shots (mean ± std over {seeds} seed(s)):\n"
    );
    table_head(
        &mut s,
        &["kind", "parameters", "final train loss"],
        plan.shots.iter().map(|&k| match k {
            1 => "1 shot".to_string(),
            k => format!("{k} shots"),
        }),
    );
    for k in AttentionKind::ALL {
        let rs = of_kind(runs, k);
        if rs.is_empty() {
            continue;
        }
        let mut row = format!(
            "| {k} | {} | {} |",
            thousands(rs[0].params),
            fmt_ms(&per(runs, k, |r| r.final_loss()), 3)
        );
        for &x in &plan.shots {
            let _ = write!(row, " {} |", fmt_ms(&per(runs, k, |r| r.at(x)), 3));
        }
        let _ = writeln!(s, "{row}");
    }
    if let Some(r) = reference {
        let mut row = "| reference (knows the classes) | — | — |".to_string();
        for &(_, a) in &r.by_shots {
            let _ = write!(row, " {a:.3} |");
        }
        let _ = writeln!(s, "{row}");
    }
    s
}

/// Accuracy over the orders of the demonstrations at the largest shot count.
fn orders_table(plan: &IclPlan, runs: &[IclRun], reference: Option<&IclScores>) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "\nPermutation robustness at {} shots, {} orders (mean ± std over seeds):\n",
        plan.max_shots(),
        plan.orders
    );
    let _ = writeln!(
        s,
        "| kind | mean accuracy | best order | worst order | best − worst | std over orders | episodes whose answer depends on the order |"
    );
    let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---:|");
    for k in AttentionKind::ALL {
        if of_kind(runs, k).is_empty() {
            continue;
        }
        let _ = writeln!(
            s,
            "| {k} | {} | {} | {} | {} | {} | {} |",
            fmt_ms(&per(runs, k, |r| r.orders.mean()), 3),
            fmt_ms(&per(runs, k, |r| r.orders.best()), 3),
            fmt_ms(&per(runs, k, |r| r.orders.worst()), 3),
            fmt_ms(&per(runs, k, |r| r.spread()), 3),
            fmt_ms(&per(runs, k, |r| r.orders.std()), 3),
            fmt_ms(&per(runs, k, |r| r.orders.flipped), 3)
        );
    }
    if let Some(r) = reference {
        let o = &r.orders;
        let _ = writeln!(
            s,
            "| reference (knows the classes) | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} |",
            o.mean(),
            o.best(),
            o.worst(),
            o.spread(),
            o.std(),
            o.flipped
        );
    }
    s
}

/// Each diff kind against standard in the paper's terms, and the sampling error of an order.
fn claims(plan: &IclPlan, runs: &[IclRun]) -> String {
    let mut s = String::new();
    let n = plan.max_shots();
    let _ = writeln!(s, "\nAgainst the paper's claim:\n");
    let st = AttentionKind::Standard;
    for d in [AttentionKind::DiffV1, AttentionKind::DiffV2] {
        let (ds, ss) = (per(runs, d, |r| r.at(n)), per(runs, st, |r| r.at(n)));
        if ds.is_empty() || ss.is_empty() {
            continue;
        }
        let _ = writeln!(
            s,
            "{}",
            compare(&format!("accuracy at {n} shots"), d, &ds, &ss, true)
        );
        let _ = writeln!(
            s,
            "{}",
            compare(
                "best − worst over orders",
                d,
                &per(runs, d, |r| r.spread()),
                &per(runs, st, |r| r.spread()),
                false
            )
        );
    }
    let sd: Vec<f64> = runs.iter().map(|r| r.orders.std()).collect();
    let _ = writeln!(
        s,
        "\nWith {} test episodes one order's accuracy has a sampling error of about ±{:.3} (binomial), and part of any best − worst gap is that noise; the standard deviation over orders averaged {:.3} here.",
        plan.test_episodes,
        (0.25 / plan.test_episodes as f64).sqrt(),
        mean_std(&sd).0
    );
    if plan.quick {
        let _ = writeln!(
            s,
            "\nThis was a smoke run: read nothing into the comparisons above."
        );
    }
    s
}

/// Accuracy against shots (log x), one line per kind with ± one standard deviation over seeds,
/// and the reference reader.
pub fn plot_icl(plan: &IclPlan, runs: &[IclRun], path: &Path) -> Result<()> {
    let mut lines: Vec<Line> = AttentionKind::ALL
        .iter()
        .filter(|&&k| !of_kind(runs, k).is_empty())
        .map(|&k| Line {
            label: k.to_string(),
            points: plan
                .shots
                .iter()
                .map(|&x| {
                    let (y, sd) = mean_std(&per(runs, k, |r| r.at(x)));
                    Point { x: x as f64, y, sd }
                })
                .collect(),
        })
        .collect();
    if let Ok(r) = icl_reference(plan) {
        lines.push(Line {
            label: "reference (knows the classes)".into(),
            points: r
                .by_shots
                .iter()
                .map(|&(x, y)| Point {
                    x: x as f64,
                    y,
                    sd: None,
                })
                .collect(),
        });
    }
    let chance = 1.0 / plan.classes as f64;
    lines.push(Line {
        label: format!("chance (1/{})", plan.classes),
        points: plan
            .shots
            .iter()
            .map(|&x| Point {
                x: x as f64,
                y: chance,
                sd: None,
            })
            .collect(),
    });
    let title = format!(
        "in-context classification, K = {} (chance {:.2})",
        plan.classes,
        1.0 / plan.classes as f64
    );
    plot_lines(
        &lines,
        &Axes {
            title: &title,
            x_label: "demonstrations (shots)",
            y_label: "accuracy",
            log_x: true,
            y_range: Some((0.0, 1.0)),
        },
        path,
    )
}

/// Every number behind the section, per kind and seed.
pub fn icl_json(runs: &[IclRun]) -> serde_json::Value {
    json!(runs
        .iter()
        .map(|r| json!({
            "kind": r.kind.as_str(),
            "seed": r.seed,
            "params": r.params,
            "seconds": r.seconds,
            "eval_seconds": r.eval_seconds,
            "final_loss": r.final_loss(),
            "losses": r.losses,
            "by_shots": r.by_shots.iter().map(|&(n, a)| json!({"shots": n, "accuracy": a})).collect::<Vec<_>>(),
            "order_accuracy": r.orders.accuracy,
            "order_spread": r.spread(),
            "order_std": r.orders.std(),
            "order_flipped": r.orders.flipped,
        }))
        .collect::<Vec<_>>())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::experiments::icl::run_icl;

    #[test]
    fn the_quick_plan_runs_end_to_end_into_a_section_a_plot_and_json() {
        let plan = IclPlan::quick();
        let mut notes = Vec::new();
        let runs = run_icl(&plan, 1, |l| notes.push(l.to_string())).unwrap();
        assert_eq!((runs.len(), notes.len()), (3, 3));
        for r in &runs {
            assert_eq!(r.losses.len(), plan.train.steps as usize);
            let shots: Vec<usize> = r.by_shots.iter().map(|x| x.0).collect();
            assert_eq!(shots, plan.shots);
            assert_eq!(r.orders.accuracy.len(), plan.orders);
            // accuracies count whole test episodes
            for &a in r.by_shots.iter().map(|x| &x.1).chain(&r.orders.accuracy) {
                let k = a * plan.test_episodes as f64;
                assert!(
                    (0.0..=1.0).contains(&a) && (k - k.round()).abs() < 1e-9,
                    "{a}"
                );
            }
        }
        let md = icl_section(&plan, &runs);
        assert!(md.starts_with("## In-context learning"), "{md}");
        for kind in ["standard", "diff_v1", "diff_v2"] {
            let rows = md
                .lines()
                .filter(|l| l.starts_with(&format!("| {kind} |")))
                .count();
            assert_eq!(rows, 2, "{kind}\n{md}");
        }
        assert!(md.contains("| reference (knows the classes) |"), "{md}");
        assert!(md.contains("smoke run"), "{md}");
        let dir = tempfile::tempdir().unwrap();
        let png = dir.path().join("icl.png");
        plot_icl(&plan, &runs, &png).unwrap();
        assert_eq!(&std::fs::read(&png).unwrap()[1..4], b"PNG");
        let j = icl_json(&runs);
        assert_eq!(j.as_array().unwrap().len(), 3);
        assert_eq!(j[1]["kind"], "diff_v1");
        assert_eq!(j[2]["by_shots"].as_array().unwrap().len(), plan.shots.len());
        assert_eq!(
            j[0]["order_accuracy"].as_array().unwrap().len(),
            plan.orders
        );
    }
}
