//! The language-modelling experiment end to end on the repo's demo text with the quick plan:
//! every kind at every size plus a variant trains, scores and lands in the report, the plot
//! and the JSON.

use difftx::experiments::corpus::{corpus_line, load_fortunes};
use difftx::experiments::lm_scaling::{
    lm_json, lm_section, plot_scaling, run_lm, LmPlan, PaperSays, SCALING_PLOT,
};
use difftx::AttentionKind;
use std::path::Path;

#[test]
fn quick_lm_run_on_the_demo_text_reports_every_kind_size_and_variant() {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("data/demo.txt");
    let text = load_fortunes(&source).unwrap();
    let plan = LmPlan::quick();
    let variant = plan.variant(
        "diff_v1 rope 500",
        AttentionKind::DiffV1,
        PaperSays::Nothing,
        |c| c.rope_theta = 500.0,
    );
    let mut notes = Vec::new();
    let runs = run_lm(&plan, &text, &[variant], 1, |n| notes.push(n.to_string())).unwrap();
    assert_eq!(runs.len(), 10);
    assert_eq!(notes.len(), 10);
    for r in &runs {
        assert_eq!(r.losses.len(), plan.train.steps as usize);
        // trained: well below the uniform ln 256 = 5.55 nats per byte
        assert!(r.val_loss.is_finite() && r.val_loss < 4.5, "{r:?}");
        assert!(r.final_loss() < r.losses[0] as f64, "{r:?}");
    }
    let v = runs.iter().find(|r| r.variant.is_some()).unwrap();
    assert_eq!((v.size, v.kind), (1, AttentionKind::DiffV1));

    let md = lm_section(&plan, &corpus_line(&source, &text), &runs);
    assert!(md.contains("demo.txt`: 35,149 bytes"), "{md}");
    for k in ["standard", "diff_v1", "diff_v2"] {
        let rows = md
            .lines()
            .filter(|l| l.starts_with(&format!("| {k} |")))
            .count();
        // 3 sizes, the fit, the ratio (diff kinds) or ablation (standard, diff_v1)
        assert!(rows >= 5, "{k}: {rows}\n{md}");
    }
    assert!(md.contains("| diff_v1 rope 500 |"), "{md}");
    assert!(md.contains("This was a smoke run"), "{md}");

    let dir = tempfile::tempdir().unwrap();
    let png = dir.path().join(SCALING_PLOT);
    plot_scaling(&plan, &runs, &png).unwrap();
    assert_eq!(&std::fs::read(&png).unwrap()[1..4], b"PNG");
    assert_eq!(lm_json(&runs)["runs"].as_array().unwrap().len(), 10);
}

#[test]
fn a_corpus_shorter_than_two_windows_is_refused_with_its_size() {
    let text = vec![b'x'; 100];
    let e = run_lm(&LmPlan::quick(), &text, &[], 1, |_| {})
        .unwrap_err()
        .to_string();
    assert!(e.contains("a corpus of 100 bytes is too short"), "{e}");
}
