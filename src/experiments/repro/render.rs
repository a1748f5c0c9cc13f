//! The needle experiment rendered from its measurements: the REPRO.md sections, the heatmap,
//! the line plots and results.json.

use super::measure::{weight_quant_rows, HeadLambda, KindRun, WeightQuantRow};
use super::plan::{NeedleLoss, ReproPlan};
use crate::config::AttentionKind;
use crate::error::{Error, Result};
use crate::experiments::common::{compare, fmt_ms, mean_std, notes_line, table_head, NOTES};
use crate::experiments::icl::{icl_json, icl_reference, IclRun};
use crate::experiments::lm_scaling::{lm_json, LmRun};
use crate::experiments::needle::Cell;
use crate::report::heatmap::{plot_heatmaps, Panel};
use crate::report::lines::{plot_lines, Axes, Line, Point};
use crate::util::thousands;
use serde_json::json;
use std::fmt::Write as _;
use std::path::Path;

/// The files of a run folder.
pub const REPORT_FILE: &str = "REPRO.md";
pub const HEATMAP_FILE: &str = "needle_heatmap.png";
pub const RESULTS_FILE: &str = "results.json";
pub const NEEDLES_PLOT: &str = "accuracy_vs_needles.png";
pub const LOWBIT_PLOT: &str = "lowbit_attention.png";
pub const ICL_PLOT: &str = "icl_accuracy_vs_shots.png";

fn of_kind(runs: &[KindRun], kind: AttentionKind) -> Vec<&KindRun> {
    runs.iter().filter(|r| r.kind == kind).collect()
}

fn cell_acc(runs: &[&KindRun], len: usize, depth: f64) -> Vec<f64> {
    runs.iter()
        .filter_map(|r| {
            r.measured
                .cells
                .iter()
                .find(|c| c.len == len && c.depth == depth)
                .map(|c| c.accuracy())
        })
        .collect()
}

fn depth_label(d: f64) -> String {
    format!("{:.0}%", d * 100.0)
}

pub(crate) fn write_heatmap(plan: &ReproPlan, runs: &[KindRun], path: &Path) -> Result<()> {
    let panels: Vec<Panel> = AttentionKind::ALL
        .iter()
        .map(|&k| {
            let rs = of_kind(runs, k);
            Panel {
                title: format!("{k} ({} params)", thousands(rs[0].params)),
                values: plan
                    .depths
                    .iter()
                    .map(|&d| {
                        plan.lengths
                            .iter()
                            .map(|&l| mean_std(&cell_acc(&rs, l, d)).0)
                            .collect()
                    })
                    .collect(),
            }
        })
        .collect();
    let rows: Vec<String> = plan.depths.iter().map(|&d| depth_label(d)).collect();
    let cols: Vec<String> = plan.lengths.iter().map(|l| l.to_string()).collect();
    plot_heatmaps(
        &panels,
        &rows,
        &cols,
        "needle depth",
        "context length (bytes)",
        &format!(
            "multi-needle retrieval accuracy, N = {}, mean over {} seed(s)",
            plan.needles, plan.seeds
        ),
        path,
    )
}

/// Accuracy against N and against the attention logits' bit width, one line per kind with
/// ± one standard deviation over seeds.
pub(crate) fn write_line_plots(plan: &ReproPlan, runs: &[KindRun], out: &Path) -> Result<()> {
    let lines = |f: &dyn Fn(&KindRun) -> Vec<(f64, f64)>| -> Vec<Line> {
        AttentionKind::ALL
            .iter()
            .map(|&k| {
                let rs = of_kind(runs, k);
                let xs: Vec<f64> = rs
                    .first()
                    .map_or(vec![], |r| f(r).iter().map(|p| p.0).collect());
                Line {
                    label: k.to_string(),
                    points: xs
                        .iter()
                        .enumerate()
                        .map(|(i, &x)| {
                            let ys: Vec<f64> = rs.iter().map(|r| f(r)[i].1).collect();
                            let (y, sd) = mean_std(&ys);
                            Point { x, y, sd }
                        })
                        .collect(),
                }
            })
            .collect()
    };
    let len = plan.lengths.last().copied().unwrap_or(0);
    let by_n = lines(&|r| {
        r.measured
            .by_needles
            .iter()
            .map(|&(n, a)| (n as f64, a))
            .collect()
    });
    plot_lines(
        &by_n,
        &Axes {
            title: &format!(
                "retrieval against the number of needles (length {len}, R = min(N, {}))",
                plan.queries
            ),
            x_label: "needles N",
            y_label: "accuracy",
            log_x: false,
            y_range: Some((0.0, 1.0)),
        },
        &out.join(NEEDLES_PLOT),
    )?;
    // full precision is drawn at 32 bits
    let bits = lines(&|r| {
        r.measured
            .lowbit
            .iter()
            .map(|&(b, a)| (if b == 0 { 32.0 } else { b as f64 }, a))
            .collect()
    });
    plot_lines(
        &bits,
        &Axes {
            title: &format!(
                "retrieval with absmax-quantised attention logits (length {len}; 32 = f32)"
            ),
            x_label: "bits of the attention logits",
            y_label: "accuracy",
            log_x: true,
            y_range: Some((0.0, 1.0)),
        },
        &out.join(LOWBIT_PLOT),
    )
}

/// Every number behind the report: the plan, the needle runs per kind and seed, and the other
/// experiments' runs.
pub fn results_json(
    plan: &ReproPlan,
    runs: &[KindRun],
    icl: &[IclRun],
    lm: &[LmRun],
) -> serde_json::Value {
    json!({
        "plan": plan.describe(),
        "language_modelling": lm_json(lm),
        "in_context_learning": {
            "plan": plan.icl.describe(),
            "reference_reader_by_shots": icl_reference(&plan.icl)
                .ok()
                .map(|r| r.by_shots.iter().map(|&(n, a)| json!({"shots": n, "accuracy": a})).collect::<Vec<_>>()),
            "runs": icl_json(icl),
        },
        "runs": runs.iter().map(kind_run_json).collect::<Vec<_>>(),
        "weight_quantisation": weight_quant_rows(lm),
    })
}

/// One needle run's numbers.
fn kind_run_json(r: &KindRun) -> serde_json::Value {
    json!({
        "kind": r.kind.as_str(),
        "seed": r.seed,
        "params": r.params,
        "seconds": r.seconds,
        "final_loss": r.final_loss(),
        "losses": r.losses,
        "lambda_per_step": r.lambdas,
        "retrieval": r.measured.cells.iter().map(|c| json!({
            "depth": c.depth, "length": c.len, "correct": c.correct, "total": c.total
        })).collect::<Vec<_>>(),
        "allocation": r.measured.allocation,
        "lambda_range": r.measured.lambda_range,
        "attention_logits": r.measured.logits,
        "hidden_states": r.measured.hidden,
        "lowbit": r.measured.lowbit.iter().map(|&(b, a)| json!({"bits": b, "accuracy": a})).collect::<Vec<_>>(),
        "by_needles": r.measured.by_needles.iter().map(|&(n, a)| json!({"needles": n, "accuracy": a})).collect::<Vec<_>>(),
        "diff_v2_head_lambda": r.measured.head_lambdas,
    })
}

/// Writes `results_json` to `path`.
pub(crate) fn write_results(
    plan: &ReproPlan,
    runs: &[KindRun],
    icl: &[IclRun],
    lm: &[LmRun],
    path: &Path,
) -> Result<()> {
    let v = results_json(plan, runs, icl, lm);
    let text = serde_json::to_string_pretty(&v).expect("json");
    std::fs::write(path, text).map_err(|e| Error::io(path, e))
}

/// The Markdown report of the needle experiment (the run appends the in-context learning and
/// language-modelling sections).
pub fn render_report(
    plan: &ReproPlan,
    runs: &[KindRun],
    wq: &[WeightQuantRow],
    command: &str,
    wall: f64,
) -> String {
    [
        header(plan, command, wall),
        models_table(plan),
        protocol(plan),
        training_table(runs),
        lambda_table(plan, runs),
        head_lambda_table(runs),
        retrieval_tables(plan, runs),
        needles_table(plan, runs),
        allocation_table(runs),
        outlier_table(runs),
        lowbit_table(plan, runs),
        weight_quant_section(plan, wq),
        claims(plan, runs),
    ]
    .concat()
}

/// One number of every run of `kind`, one per seed.
fn per(runs: &[KindRun], kind: AttentionKind, f: &dyn Fn(&KindRun) -> f64) -> Vec<f64> {
    of_kind(runs, kind).into_iter().map(f).collect()
}

/// The title, the smoke-run warning, the command, wall time, seeds and the plan.
fn header(plan: &ReproPlan, command: &str, wall: f64) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# difftx repro: the paper's claims, side by side\n");
    if plan.quick {
        let _ = writeln!(
            s,
            "> **Quick smoke run (`--quick`).** Tiny models trained for {} steps: these numbers show that the pipeline runs end to end, not whether the paper's claims hold.\n",
            plan.train.steps
        );
    }
    let _ = writeln!(s, "- Command: `{command}`");
    let _ = writeln!(
        s,
        "- Wall time: {wall:.0} s on {} threads",
        rayon::current_num_threads()
    );
    let seeds: Vec<String> = (0..plan.seeds).map(|x| x.to_string()).collect();
    let _ = writeln!(
        s,
        "- Seeds: {} (tables give mean ± sample standard deviation over seeds{})",
        seeds.join(", "),
        if plan.seeds < 2 {
            "; with one seed only the mean"
        } else {
            ""
        }
    );
    let _ = writeln!(s, "- Plan:");
    for line in plan.describe() {
        let _ = writeln!(s, "  - {line}");
    }
    s
}

/// Parameters and shapes of the three kinds.
fn models_table(plan: &ReproPlan) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "\n## Models\n");
    let _ = writeln!(
        s,
        "| kind | parameters | vs standard | heads | K/V heads | head dim | layers | D |"
    );
    let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---:|---:|");
    let std_params = plan.model_config(AttentionKind::Standard).num_params() as f64;
    for k in AttentionKind::ALL {
        let c = plan.model_config(k);
        let _ = writeln!(
            s,
            "| {k} | {} | {:.3} | {} | {} | {} | {} | {} |",
            thousands(c.num_params()),
            c.num_params() as f64 / std_params,
            c.num_attention_heads,
            c.num_key_value_heads,
            c.head_dim,
            c.num_hidden_layers,
            c.hidden_size
        );
    }
    s
}

/// The task, training and measurements with this plan's numbers; the reasons are in the notes.
fn protocol(plan: &ReproPlan) -> String {
    let mut s = String::new();
    let len = plan.lengths.last().copied().unwrap_or(0);
    let loss = if plan.loss == NeedleLoss::Answers {
        "the loss is on the answer digits of every query only (the other bytes are ignored, like PyTorch's ignore_index)"
    } else {
        "next-token loss on every byte"
    };
    let _ = writeln!(s, "\n## Protocol\n");
    for line in [
        format!("Task: byte-level multi-needle retrieval. A haystack of synthetic filler (Zipf-distributed pseudo-words of a seeded 200-word language) holds N = {} needles \"the magic number of CITY is NUMBER. \" ({}-digit numbers, distinct cities and numbers); R = {} queries \"what is the magic number of CITY? NUMBER\" follow it, the first asking the needle at the cell's depth, the others asking other needles.", plan.needles, plan.digits, plan.queries),
        format!("Training: every kind trains on the same episodes (they depend only on the seed), {} steps of {} episodes, each step one window length drawn from the multiples of 16 in [{}, {}] and depths uniform in [0, 1]; {loss}. The task is not tuned per kind. AdamW (β 0.9/0.95, weight decay 0.1 on matrices), peak lr {}, {} warm-up steps, cosine to lr/10, gradient clip 1. Initial weights from the same seed.", plan.train.steps, plan.train.batch, plan.train_min_len, plan.train.context, plan.train.lr, plan.train.warmup),
        format!("Retrieval: {} fresh episodes per (depth, length) cell, the same for every model (evaluation seed {}). A cell scores the query of the needle at its depth: correct when the argmax next token is right at every answer digit under teacher forcing — exactly greedy decoding of the digits. Accuracy against N scores all R queries.", plan.episodes_per_cell, plan.eval_seed),
        format!("Attention allocation (Table 3): at length {len}, {} episodes per depth, averaged over the positions that predict an answer digit, heads, layers and episodes; each head's map and the answer and noise masses are defined in `{NOTES}`.", plan.alloc_episodes),
        format!("Activation outliers (Table 5): over {} episodes at length {len}: attention logits q·kᵀ/√d of every causal pair of every query head (both maps of each pair for the diff kinds) and every block's output (hidden state); top-1 and 10th-largest |value| and the median |value|.", plan.outlier_sequences),
        format!("What a depth is, how this protocol was chosen and how to read the comparisons: `{NOTES}` in the difftx repository, section “Protocol”."),
    ] {
        let _ = writeln!(s, "- {line}");
    }
    s
}

/// Final training loss and seconds per run.
fn training_table(runs: &[KindRun]) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "\n## Training\n");
    let _ = writeln!(
        s,
        "| kind | final train loss (mean of last 10 steps) | seconds per run |"
    );
    let _ = writeln!(s, "|---|---:|---:|");
    for k in AttentionKind::ALL {
        let _ = writeln!(
            s,
            "| {k} | {} | {} |",
            fmt_ms(&per(runs, k, &|r| r.final_loss()), 3),
            fmt_ms(&per(runs, k, &|r| r.seconds), 0)
        );
    }
    s
}

/// λ per layer of the diff kinds at five points of training.
fn lambda_table(plan: &ReproPlan, runs: &[KindRun]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "\nλ over training (diff_v1: each layer's λ; diff_v2: the mean σ(lambda_proj x) of the step's last batch), mean over seeds:\n"
    );
    let steps = plan.train.steps;
    let marks: Vec<usize> = [0.0, 0.25, 0.5, 0.75, 1.0]
        .iter()
        .map(|f| ((steps as f64 * f).round() as usize).clamp(1, steps as usize))
        .collect();
    table_head(
        &mut s,
        &["kind", "layer"],
        marks.iter().map(|m| format!("step {m}")),
    );
    for k in [AttentionKind::DiffV1, AttentionKind::DiffV2] {
        for l in 0..plan.num_hidden_layers {
            let mut row = format!("| {k} | {l} |");
            for &m in &marks {
                let v = per(runs, k, &|r| {
                    r.lambdas
                        .get(m - 1)
                        .and_then(|x| x.get(l))
                        .map_or(f64::NAN, |&x| x as f64)
                });
                let _ = write!(row, " {} |", fmt_ms(&v, 3));
            }
            let _ = writeln!(s, "{row}");
        }
    }
    s
}

/// diff_v2's per-token λ per (layer, head) after training; empty without diff_v2 runs.
fn head_lambda_table(runs: &[KindRun]) -> String {
    let mut s = String::new();
    let v2 = of_kind(runs, AttentionKind::DiffV2);
    if !v2.iter().any(|r| !r.measured.head_lambdas.is_empty()) {
        return s;
    }
    let _ = writeln!(
        s,
        "\ndiff_v2's per-token λ = σ(lambda_proj x) after training, per head over the outlier episodes' tokens (mean over seeds of each statistic):\n"
    );
    table_head(
        &mut s,
        &["layer", "head"],
        ["mean", "std over tokens", "min", "max"]
            .iter()
            .map(|x| x.to_string()),
    );
    for (i, h) in v2[0].measured.head_lambdas.iter().enumerate() {
        let stat = |f: &dyn Fn(&HeadLambda) -> f64| {
            let v: Vec<f64> = v2
                .iter()
                .filter_map(|r| r.measured.head_lambdas.get(i))
                .map(f)
                .collect();
            mean_std(&v).0
        };
        let _ = writeln!(
            s,
            "| {} | {} | {:.3} | {:.3} | {:.3} | {:.3} |",
            h.layer,
            h.head,
            stat(&|x| x.mean),
            stat(&|x| x.sd),
            stat(&|x| x.min),
            stat(&|x| x.max)
        );
    }
    s
}

/// Retrieval accuracy per kind and length, then per (depth, length).
fn retrieval_tables(plan: &ReproPlan, runs: &[KindRun]) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "\n## Multi-needle retrieval (paper Section 3.4)\n");
    let _ = writeln!(s, "{}\n", notes_line("Multi-needle retrieval"));
    table_head(
        &mut s,
        &["kind", "all cells"],
        plan.lengths.iter().map(|l| format!("length {l}")),
    );
    for k in AttentionKind::ALL {
        let rs = of_kind(runs, k);
        let mut row = format!(
            "| {k} | {} |",
            fmt_ms(&per(runs, k, &|r| r.overall_accuracy()), 3)
        );
        for &l in &plan.lengths {
            let accs: Vec<f64> = rs
                .iter()
                .map(|r| {
                    let cs: Vec<&Cell> = r.measured.cells.iter().filter(|c| c.len == l).collect();
                    cs.iter().map(|c| c.correct).sum::<usize>() as f64
                        / cs.iter().map(|c| c.total).sum::<usize>().max(1) as f64
                })
                .collect();
            let _ = write!(row, " {} |", fmt_ms(&accs, 3));
        }
        let _ = writeln!(s, "{row}");
    }
    let _ = writeln!(
        s,
        "\nPer (depth, length), accuracy mean over seeds (![heatmap]({HEATMAP_FILE})):\n"
    );
    table_head(
        &mut s,
        &["kind", "depth"],
        plan.lengths.iter().map(|l| format!("{l}")),
    );
    for k in AttentionKind::ALL {
        let rs = of_kind(runs, k);
        for &d in &plan.depths {
            let mut row = format!("| {k} | {} |", depth_label(d));
            for &l in &plan.lengths {
                let _ = write!(row, " {} |", fmt_ms(&cell_acc(&rs, l, d), 2));
            }
            let _ = writeln!(s, "{row}");
        }
    }
    s
}

/// Accuracy against the number of needles at the longest length.
fn needles_table(plan: &ReproPlan, runs: &[KindRun]) -> String {
    let mut s = String::new();
    let len = plan.lengths.last().copied().unwrap_or(0);
    let _ = writeln!(s, "\nAccuracy against the number of needles N at length {len} (models trained with N = {}; {} fresh episodes per depth, all depths, every query scored; ![accuracy against N]({NEEDLES_PLOT})):\n", plan.needles, plan.lowbit_per_cell);
    table_head(
        &mut s,
        &["kind"],
        plan.needle_counts.iter().map(|n| format!("N = {n}")),
    );
    for k in AttentionKind::ALL {
        let mut row = format!("| {k} |");
        for &n in &plan.needle_counts {
            let accs = per(runs, k, &|r| {
                r.measured
                    .by_needles
                    .iter()
                    .find(|x| x.0 == n)
                    .map_or(f64::NAN, |x| x.1)
            });
            let _ = write!(row, " {} |", fmt_ms(&accs, 3));
        }
        let _ = writeln!(s, "{row}");
    }
    s
}

/// Answer and noise mass per kind, and the λ range of the diff kinds.
fn allocation_table(runs: &[KindRun]) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "\n## Attention allocation (paper Table 3)\n");
    let _ = writeln!(s, "{}\n", notes_line("Attention allocation"));
    let _ = writeln!(
        s,
        "| kind | answer mass | noise mass | λ range (diff kinds) |"
    );
    let _ = writeln!(s, "|---|---:|---:|---|");
    for k in AttentionKind::ALL {
        let lam = of_kind(runs, k)
            .iter()
            .filter_map(|r| r.measured.lambda_range)
            .fold(None, |acc: Option<(f64, f64)>, (lo, hi)| {
                Some(acc.map_or((lo, hi), |(a, b)| (a.min(lo), b.max(hi))))
            })
            .map_or("—".to_string(), |(lo, hi)| format!("{lo:.3} … {hi:.3}"));
        let _ = writeln!(
            s,
            "| {k} | {} | {} | {lam} |",
            fmt_ms(&per(runs, k, &|r| r.measured.allocation.answer), 3),
            fmt_ms(&per(runs, k, &|r| r.measured.allocation.noise), 3)
        );
    }
    s
}

/// Top and median magnitudes of the attention logits and the hidden states.
fn outlier_table(runs: &[KindRun]) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "\n## Activation outliers (paper Table 5)\n");
    let _ = writeln!(s, "{}\n", notes_line("Activation outliers"));
    let _ = writeln!(
        s,
        "| kind | logits top-1 | logits top-10 | logits median | logits top-1/median | hidden top-1 | hidden top-10 | hidden median | hidden top-1/median |"
    );
    let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for k in AttentionKind::ALL {
        let _ = writeln!(
            s,
            "| {k} | {} | {} | {} | {} | {} | {} | {} | {} |",
            fmt_ms(&per(runs, k, &|r| r.measured.logits.top1), 2),
            fmt_ms(&per(runs, k, &|r| r.measured.logits.top10), 2),
            fmt_ms(&per(runs, k, &|r| r.measured.logits.median), 3),
            fmt_ms(&per(runs, k, &|r| r.measured.logits.top1_ratio()), 1),
            fmt_ms(&per(runs, k, &|r| r.measured.hidden.top1), 2),
            fmt_ms(&per(runs, k, &|r| r.measured.hidden.top10), 2),
            fmt_ms(&per(runs, k, &|r| r.measured.hidden.median), 3),
            fmt_ms(&per(runs, k, &|r| r.measured.hidden.top1_ratio()), 1)
        );
    }
    s
}

/// Retrieval with the attention logits quantised to each bit width.
fn lowbit_table(plan: &ReproPlan, runs: &[KindRun]) -> String {
    let mut s = String::new();
    let len = plan.lengths.last().copied().unwrap_or(0);
    let _ = writeln!(s, "\n## Low-bit attention (paper Section 3.7)\n");
    let _ = writeln!(
        s,
        "{} Here: retrieval accuracy at length {len} over all depths ({} episodes per depth, the first ones of the retrieval cells), with the attention logits of every head absmax-quantised per (sequence, head) before the softmax; evaluation only, computed in f64 outside the training kernel (![low-bit plot]({LOWBIT_PLOT})).\n",
        notes_line("Low-bit attention"),
        plan.lowbit_per_cell
    );
    table_head(
        &mut s,
        &["kind", "full precision"],
        plan.lowbit_bits.iter().map(|b| format!("{b} bits")),
    );
    for k in AttentionKind::ALL {
        let mut row = format!("| {k} |");
        for bits in std::iter::once(0).chain(plan.lowbit_bits.iter().copied()) {
            let accs = per(runs, k, &|r| {
                r.measured
                    .lowbit
                    .iter()
                    .find(|x| x.0 == bits)
                    .map_or(f64::NAN, |x| x.1)
            });
            let _ = write!(row, " {} |", fmt_ms(&accs, 3));
        }
        let _ = writeln!(s, "{row}");
    }
    s
}

/// The LM models' validation loss in f32 and with weights and activations quantised
/// (`WeightQuantRow`), and a reading of the numbers.
fn weight_quant_section(plan: &ReproPlan, wq: &[WeightQuantRow]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "\n## Low-bit weights and activations (GGUF Q8_0 and Q4_0)\n"
    );
    let _ = writeln!(
        s,
        "{} Here: the language models of the language-modelling section below (validation loss in nats per byte, {} windows), scored again with every linear layer and the LM head quantised as `difftx eval --quant` does (weights in blocks of 32 with one f16 scale, each product's input quantised to int8 per block); Δ is the loss increase in percent of the f32 loss, per seed.\n",
        notes_line("Low-bit weights and activations"),
        plan.lm.val_windows
    );
    let formats: Vec<&str> = plan.lm.quant.iter().map(|q| q.as_str()).collect();
    table_head(
        &mut s,
        &["kind", "size", "params", "f32 loss"],
        formats
            .iter()
            .flat_map(|f| [format!("{f} loss"), format!("{f} Δ %")])
            .chain(["quantised".to_string()]),
    );
    let pick = |k: &str, size: usize, f: &str| {
        wq.iter()
            .find(|w| w.kind == k && w.size == size && w.format == f)
    };
    for k in AttentionKind::ALL {
        for size in 0..plan.lm.sizes.len() {
            let Some(first) = formats.first().and_then(|f| pick(k.as_str(), size, f)) else {
                continue;
            };
            let mut row = format!(
                "| {k} | {size} | {} | {} |",
                thousands(first.params),
                fmt_ms(&first.f32_loss, 3)
            );
            for f in &formats {
                let w = pick(k.as_str(), size, f);
                let (l, d) = w.map_or((vec![f64::NAN], vec![f64::NAN]), |w| {
                    (w.loss.clone(), w.increase_pct.clone())
                });
                let _ = write!(row, " {} | {} |", fmt_ms(&l, 3), fmt_ms(&d, 2));
            }
            let _ = writeln!(row, " {:.0}% |", 100.0 * first.quantised_share);
            s.push_str(&row);
        }
    }
    s.push_str(&weight_quant_reading(plan, wq, &formats));
    s
}

/// What the numbers of `weight_quant_section` say: each format's mean and largest increase,
/// each diff kind against standard at the largest size, and the matrices left f32.
fn weight_quant_reading(plan: &ReproPlan, wq: &[WeightQuantRow], formats: &[&str]) -> String {
    let mut s = String::from("\n");
    for f in formats {
        let rows: Vec<&WeightQuantRow> = wq.iter().filter(|w| w.format == *f).collect();
        let all: Vec<f64> = rows.iter().flat_map(|w| w.increase_pct.clone()).collect();
        let worst = rows.iter().max_by(|a, b| {
            mean_std(&a.increase_pct)
                .0
                .total_cmp(&mean_std(&b.increase_pct).0)
        });
        if let Some(w) = worst {
            let _ = writeln!(
                s,
                "- {f}: the loss rises by {:.2}% on average over every kind, size and seed; most for {} at size {} ({:.2}%).",
                mean_std(&all).0,
                w.kind,
                w.size,
                mean_std(&w.increase_pct).0
            );
        }
    }
    let largest = plan.lm.sizes.len().saturating_sub(1);
    let at = |k: AttentionKind, f: &str| {
        wq.iter()
            .find(|w| w.kind == k.as_str() && w.size == largest && w.format == f)
            .map_or(vec![f64::NAN], |w| w.increase_pct.clone())
    };
    for f in formats {
        for d in [AttentionKind::DiffV1, AttentionKind::DiffV2] {
            let what = format!("{f} loss increase (%) at size {largest}");
            let st = AttentionKind::Standard;
            let _ = writeln!(s, "{}", compare(&what, d, &at(d, f), &at(st, f), false));
        }
    }
    let partial: Vec<String> = wq
        .iter()
        .filter(|w| w.quantised_share < 1.0 && w.format == formats[0])
        .map(|w| {
            format!(
                "{} size {} ({:.0}%)",
                w.kind,
                w.size,
                100.0 * w.quantised_share
            )
        })
        .collect();
    if !partial.is_empty() {
        let _ = writeln!(
            s,
            "- Some matrices stayed f32 (a width not a multiple of 32), so these rows understate the quantisation error: {}.",
            partial.join(", ")
        );
    }
    if plan.quick {
        let _ = writeln!(
            s,
            "\nThis was a smoke run: read nothing into the comparisons above."
        );
    }
    s
}

/// Each diff kind against standard on every measurement, in the paper's terms.
fn claims(plan: &ReproPlan, runs: &[KindRun]) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "\n## What the retrieval models say about the claims\n");
    let st = AttentionKind::Standard;
    for d in [AttentionKind::DiffV1, AttentionKind::DiffV2] {
        type Check<'a> = (&'a str, &'a dyn Fn(&KindRun) -> f64, bool);
        let four_bit = |r: &KindRun| {
            r.measured
                .lowbit
                .iter()
                .find(|x| x.0 == 4)
                .map_or(f64::NAN, |x| x.1)
        };
        let checks: [Check; 6] = [
            (
                "retrieval accuracy",
                &|r: &KindRun| r.overall_accuracy(),
                true,
            ),
            (
                "answer mass",
                &|r: &KindRun| r.measured.allocation.answer,
                true,
            ),
            (
                "noise mass",
                &|r: &KindRun| r.measured.allocation.noise,
                false,
            ),
            (
                "top-1 attention logit",
                &|r: &KindRun| r.measured.logits.top1,
                false,
            ),
            (
                "top-1 hidden state",
                &|r: &KindRun| r.measured.hidden.top1,
                false,
            ),
            ("4-bit retrieval accuracy", &four_bit, true),
        ];
        for (what, f, higher) in checks {
            let _ = writeln!(
                s,
                "{}",
                compare(what, d, &per(runs, d, f), &per(runs, st, f), higher)
            );
        }
    }
    if plan.quick {
        let _ = writeln!(
            s,
            "\nThis was a smoke run: read nothing into the comparisons above."
        );
    }
    s
}
