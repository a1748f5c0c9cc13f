//! Helpers every experiment shares: matched model configs, mean ± std over seeds, the words
//! of a comparison with the paper, Markdown table headers, argmax, a batch of prompts through
//! a model. No experiment's types.

use crate::config::{swiglu_width, AttentionKind, ModelConfig, Preset};
use crate::error::{Error, Result};
use crate::model::{Model, Workspace};
use std::fmt::Write as _;

/// A byte-level model of `kind` with D, L, d and the context given: h = D / 2d differential
/// heads; standard gets 2h heads, diff_v1 h, diff_v2 2h output heads over h K/V heads (the
/// presets' matching, docs/SPEC.md), SwiGLU width from D. Every repro experiment builds its
/// models here, so the kinds always have matched parameters.
pub fn matched_config(
    kind: AttentionKind,
    hidden_size: usize,
    num_hidden_layers: usize,
    head_dim: usize,
    context: usize,
) -> ModelConfig {
    let h = hidden_size / (2 * head_dim);
    let (heads, kv) = match kind {
        AttentionKind::Standard => (2 * h, 2 * h),
        AttentionKind::DiffV1 => (h, h),
        AttentionKind::DiffV2 => (2 * h, h),
    };
    let mut c = ModelConfig::preset(Preset::Tiny, kind);
    c.hidden_size = hidden_size;
    c.intermediate_size = swiglu_width(hidden_size);
    c.num_hidden_layers = num_hidden_layers;
    c.num_attention_heads = heads;
    c.num_key_value_heads = kv;
    c.head_dim = head_dim;
    c.max_position_embeddings = context;
    c
}

/// Serializes an attention kind as its name (`standard`, `diff_v1`, `diff_v2`), for the
/// measurement structs.
pub fn kind_name<S: serde::Serializer>(
    kind: &AttentionKind,
    s: S,
) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_str(kind.as_str())
}

/// Mean training loss of the last 10 steps of `losses`.
pub fn final_loss(losses: &[f32]) -> f64 {
    let tail = &losses[losses.len().saturating_sub(10)..];
    tail.iter().map(|&x| x as f64).sum::<f64>() / tail.len().max(1) as f64
}

/// Mean and sample standard deviation (None for one value).
pub fn mean_std(v: &[f64]) -> (f64, Option<f64>) {
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    if v.len() < 2 {
        return (mean, None);
    }
    let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0);
    (mean, Some(var.sqrt()))
}

/// "0.512 ± 0.031", or "0.512" for a single seed. Numbers of a million or more are written
/// in scientific notation ("9.609e17 ± 1.664e18"), never as eighteen digits of false detail.
pub fn fmt_ms(v: &[f64], digits: usize) -> String {
    let f = |x: f64| {
        if x.abs() >= 1e6 {
            format!("{x:.digits$e}")
        } else {
            format!("{x:.digits$}")
        }
    };
    match mean_std(v) {
        (m, Some(s)) => format!("{} ± {}", f(m), f(s)),
        (m, None) => f(m),
    }
}

/// How a diff kind compares with standard on one measurement, in words.
pub(crate) fn compare(
    what: &str,
    diff: AttentionKind,
    d: &[f64],
    s: &[f64],
    paper_says_higher: bool,
) -> String {
    let (md, sd) = mean_std(d);
    let (ms, ss) = mean_std(s);
    let dir = if md > ms { "higher" } else { "lower" };
    let agrees = (md > ms) == paper_says_higher && md != ms;
    let spread = match (sd, ss) {
        (Some(a), Some(b)) => {
            if (md - ms).abs() > a + b {
                "the gap is larger than the two seed spreads added"
            } else {
                "the gap is within the seed spreads, so no difference is shown"
            }
        }
        _ => "one seed only, so the spread is unknown",
    };
    let direction = if md == ms || md.is_nan() || ms.is_nan() {
        "no difference either way".to_string()
    } else {
        format!(
            "{dir}, {} the paper's direction",
            if agrees { "in" } else { "against" }
        )
    };
    format!("- {what}: {diff} {md:.3} vs standard {ms:.3} — {direction}; {spread}.")
}

/// The Markdown file of the report's fixed prose: what the paper reports for each experiment,
/// why each protocol is as it is, and how to read the comparisons.
pub const NOTES: &str = "docs/repro-notes.md";

/// The report's pointer to one section of `NOTES`.
pub fn notes_line(section: &str) -> String {
    format!("What the paper reports: `{NOTES}` in the difftx repository, section “{section}”.")
}

/// A Markdown table's header and rule: the first column left-aligned, the rest right-aligned.
pub(crate) fn table_head(s: &mut String, fixed: &[&str], cols: impl Iterator<Item = String>) {
    let names: Vec<String> = fixed.iter().map(|f| f.to_string()).chain(cols).collect();
    let _ = writeln!(s, "| {} |", names.join(" | "));
    let _ = writeln!(s, "|---|{}", "---:|".repeat(names.len() - 1));
}

/// Index of the largest value (the first one at a tie).
pub fn argmax(row: &[f32]) -> usize {
    let mut best = 0;
    for (i, &x) in row.iter().enumerate() {
        if x > row[best] {
            best = i;
        }
    }
    best
}

/// One forward pass over a batch of prompts that all have `t` tokens (needle episodes, ICL
/// prompts); the logits are then in `ws.logits`, row b·t + p for prompt b, position p.
pub(crate) fn forward_prompts<'a>(
    model: &Model,
    ws: &mut Workspace,
    prompts: impl ExactSizeIterator<Item = &'a [u32]>,
    t: usize,
) -> Result<()> {
    let b = prompts.len();
    let mut inputs = Vec::with_capacity(b * t);
    for p in prompts {
        if p.len() != t {
            return Err(Error::Invalid(format!(
                "prompt of {} tokens in a batch of prompts of {t}",
                p.len()
            )));
        }
        inputs.extend_from_slice(p);
    }
    model.forward(ws, &inputs, b, t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mean_and_spread_print_huge_numbers_in_scientific_notation() {
        assert_eq!(fmt_ms(&[0.5, 0.6], 3), "0.550 ± 0.071");
        assert_eq!(fmt_ms(&[2.0], 1), "2.0");
        let s = fmt_ms(&[2.88e18, 0.5, 0.7], 3);
        assert_eq!(s, "9.600e17 ± 1.663e18");
    }

    #[test]
    fn every_section_the_report_points_to_is_in_the_notes() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/", "docs/repro-notes.md");
        let notes = std::fs::read_to_string(path).unwrap();
        assert!(path.ends_with(NOTES));
        for section in [
            "Protocol",
            "Multi-needle retrieval",
            "Attention allocation",
            "Activation outliers",
            "Low-bit attention",
            "In-context learning",
            "Language modelling and scaling",
            "Ablation",
        ] {
            assert!(
                notes.lines().any(|l| l == format!("## {section}")),
                "{section}"
            );
            assert!(notes_line(section).contains(&format!("“{section}”")));
        }
        // The notes stand alone: no source document is cited by file, and every relative link
        // resolves to a file of the repository.
        assert!(!notes.contains("seeds/"));
        let docs = std::path::Path::new(path).parent().unwrap();
        for link in notes.split("](").skip(1) {
            let target = link.split(')').next().unwrap().split('#').next().unwrap();
            if !target.is_empty() && !target.contains("://") {
                assert!(
                    docs.join(target).exists(),
                    "a link to {target}, not in the repository"
                );
            }
        }
    }

    #[test]
    fn mean_std_is_the_sample_standard_deviation() {
        let (m, s) = mean_std(&[1.0, 2.0, 3.0]);
        assert_eq!(m, 2.0);
        assert!((s.unwrap() - 1.0).abs() < 1e-12);
        assert_eq!(mean_std(&[0.5]), (0.5, None));
        assert_eq!(fmt_ms(&[1.0, 2.0, 3.0], 2), "2.00 ± 1.00");
        assert_eq!(fmt_ms(&[0.25], 3), "0.250");
    }

    #[test]
    fn comparisons_state_direction_and_whether_seeds_separate_the_kinds() {
        let d = AttentionKind::DiffV1;
        let c = compare("accuracy", d, &[0.5, 0.6, 0.7], &[0.1, 0.1, 0.2], true);
        assert!(c.contains("diff_v1 0.600 vs standard 0.133"), "{c}");
        assert!(
            c.contains("higher, in the paper's direction; the gap is larger"),
            "{c}"
        );
        let c = compare("noise", d, &[0.5, 0.3], &[0.3, 0.3], false);
        assert!(
            c.contains("against the paper's direction; the gap is within"),
            "{c}"
        );
        let c = compare("noise", d, &[0.2], &[0.2], false);
        assert!(c.contains("no difference either way; one seed only"), "{c}");
    }

    #[test]
    fn argmax_takes_the_first_maximum() {
        assert_eq!(argmax(&[0.0, 3.0, 1.0, 3.0]), 1);
        assert_eq!(argmax(&[-1.0]), 0);
    }
}
