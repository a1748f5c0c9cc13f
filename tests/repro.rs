//! `difftx repro` through the binary: the quick smoke run writes a report with a row for every
//! kind and a heatmap; bad input fails with one line.

mod common;
use common::*;

#[test]
fn quick_repro_writes_a_report_with_a_row_for_every_kind() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("repro");
    let o = difftx(&[
        "--threads",
        "2",
        "repro",
        "--quick",
        "--out",
        out.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    let md = std::fs::read_to_string(out.join("REPRO.md")).unwrap();
    assert!(
        md.contains("Command: `difftx --threads 2 repro --quick --out "),
        "{md}"
    );
    assert!(md.contains("Quick smoke run"), "{md}");
    for kind in ["standard", "diff_v1", "diff_v2"] {
        let rows = md
            .lines()
            .filter(|l| l.starts_with(&format!("| {kind} |")))
            .count();
        // models, training, retrieval, 5 depth rows, allocation, outliers
        assert!(rows >= 10, "{kind}: {rows} rows\n{md}");
        assert!(out
            .join("models")
            .join(format!("{kind}-seed0"))
            .join("config.json")
            .exists());
    }
    for section in [
        "## Multi-needle retrieval",
        "## In-context learning",
        "## Language modelling and scaling",
        "## Ablation",
    ] {
        assert!(md.contains(section), "{section} missing\n{md}");
    }
    // the ablation rows name both Table 6 variants
    assert!(md.contains("| diff_v1 without subln |"), "{md}");
    assert!(md.contains("| diff_v1, λ_init 0.8 constant |"), "{md}");
    for png in [
        "needle_heatmap.png",
        "accuracy_vs_needles.png",
        "lowbit_attention.png",
        "icl_accuracy_vs_shots.png",
        "lm_scaling.png",
    ] {
        let bytes = std::fs::read(out.join(png)).unwrap();
        assert_eq!(&bytes[1..4], b"PNG", "{png}");
        assert!(
            md.contains(&format!("]({png})")),
            "{png} is not linked\n{md}"
        );
    }
    let results: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).unwrap()).unwrap();
    let runs = results["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 3);
    // 3 kinds (1 seed) for in-context learning; 3 kinds × 3 sizes + 2 ablations for the LM part
    let icl = &results["in_context_learning"];
    assert_eq!(icl["runs"].as_array().unwrap().len(), 3, "{icl}");
    assert!(icl["reference_reader_by_shots"].as_array().unwrap().len() >= 2);
    let lm = &results["language_modelling"];
    let lm_runs = lm.as_array().or_else(|| lm["runs"].as_array()).unwrap();
    assert_eq!(lm_runs.len(), 11, "{lm}");
    for r in runs {
        // 2 lengths × 5 depths
        assert_eq!(r["retrieval"].as_array().unwrap().len(), 10);
        let (a, n) = (
            r["allocation"]["answer"].as_f64().unwrap(),
            r["allocation"]["noise"].as_f64().unwrap(),
        );
        assert!(a.is_finite() && n.is_finite(), "{r}");
    }
    assert_weight_quantisation(&md, &results, lm_runs);
}

/// The low-bit weights and activations section and its JSON: a row per kind, size and format
/// (3 × 3 × 2), finite losses whose f32 column is the language-modelling run's own validation
/// loss, q8_0 within 2% of f32 and q4_0 within 10%, and the blocks in use (some loss differs).
fn assert_weight_quantisation(
    md: &str,
    results: &serde_json::Value,
    lm_runs: &[serde_json::Value],
) {
    let section = md
        .split("## Low-bit weights and activations (GGUF Q8_0 and Q4_0)")
        .nth(1)
        .expect("the weight quantisation section")
        .split("\n## ")
        .next()
        .unwrap();
    assert!(md.find("## Low-bit attention") < md.find("## Low-bit weights"));
    assert!(
        section.contains("| q8_0 loss | q8_0 Δ % | q4_0 loss | q4_0 Δ % |"),
        "{section}"
    );
    for kind in ["standard", "diff_v1", "diff_v2"] {
        let rows = section
            .lines()
            .filter(|l| l.starts_with(&format!("| {kind} |")));
        assert_eq!(rows.count(), 3, "{kind}\n{section}");
    }
    assert!(section.contains("- q4_0: the loss rises by"), "{section}");
    let wq = results["weight_quantisation"].as_array().unwrap();
    assert_eq!(wq.len(), 18, "{wq:?}");
    let mut changed = std::collections::HashSet::new();
    for w in wq {
        let num = |k: &str| w[k][0].as_f64().unwrap();
        let (f32_loss, loss, inc) = (num("f32_loss"), num("loss"), num("increase_pct"));
        assert!(
            f32_loss.is_finite() && loss.is_finite() && loss > 0.0,
            "{w}"
        );
        assert!(
            (inc - 100.0 * (loss - f32_loss) / f32_loss).abs() < 1e-9,
            "{w}"
        );
        let own = lm_runs
            .iter()
            .find(|r| r["variant"] == false && r["kind"] == w["kind"] && r["size"] == w["size"])
            .expect("the LM run");
        assert_eq!(own["val_loss"].as_f64().unwrap(), f32_loss, "{w}");
        let bound = if w["format"] == "q8_0" { 2.0 } else { 10.0 };
        assert!(inc.abs() < bound, "{w}");
        let share = w["quantised_share"].as_f64().unwrap();
        assert!(share > 0.0 && share <= 1.0, "{w}");
        if loss != f32_loss {
            changed.insert(w["format"].as_str().unwrap().to_string());
        }
    }
    assert_eq!(changed.len(), 2, "no format changed any loss: {wq:?}");
}

#[test]
fn repro_rejects_zero_seeds_in_one_line() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("r");
    let o = difftx(&[
        "repro",
        "--quick",
        "--seeds",
        "0",
        "--out",
        out.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(
        err.starts_with("error: ") && err.contains("--seeds"),
        "{err}"
    );
    assert!(!out.exists());
}

#[test]
fn dry_run_states_the_full_plan_without_training() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("r");
    let o = difftx(&["repro", "--dry-run", "--out", out.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("full run: 3 kinds × 3 seed(s)"), "{err}");
    assert!(err.contains("2 needles"), "{err}");
    // the default corpus, Debian's fortunes, is named whether or not this machine has it
    assert!(
        err.contains("corpus: ") && err.contains("fortunes"),
        "{err}"
    );
    assert!(!out.exists());
    // a corpus given by hand is read and described
    let demo = concat!(env!("CARGO_MANIFEST_DIR"), "/data/demo.txt");
    let o = difftx(&[
        "repro",
        "--dry-run",
        "--corpus",
        demo,
        "--out",
        out.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("corpus: ") && err.contains("demo.txt"),
        "{err}"
    );
    assert!(!out.exists());
    // ... and a missing one is a one-line error naming it
    let gone = tmp.path().join("no-such-corpus.txt");
    let o = difftx(&[
        "repro",
        "--dry-run",
        "--corpus",
        gone.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    let last = err.trim_end().lines().last().unwrap_or_default();
    assert!(
        last.starts_with("error: ") && last.contains("no-such-corpus.txt"),
        "{err}"
    );
}

#[test]
fn attention_map_draws_a_png_and_names_bad_input_in_one_line() {
    let tmp = tempfile::tempdir().unwrap();
    for kind in ["diff_v1", "standard"] {
        let model = tmp.path().join(kind);
        let o = difftx(&[
            "init",
            "--attention",
            kind,
            "--out",
            model.to_str().unwrap(),
        ]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let png = tmp.path().join(format!("{kind}.png"));
        let m = model.to_str().unwrap();
        let o = difftx(&[
            "attention-map",
            "--model",
            m,
            "--prompt",
            "the magic number of oslo is 123",
            "--layer",
            "1",
            "--head",
            "1",
            "--out",
            png.to_str().unwrap(),
        ]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        assert_eq!(&std::fs::read(&png).unwrap()[1..4], b"PNG");
        let long = "x".repeat(129);
        for (args, needle) in [
            (["--layer", "2", "--head", "0"], "layer 2 is out of range"),
            (["--layer", "0", "--head", "9"], "head 9 is out of range"),
        ] {
            let mut all = vec![
                "attention-map",
                "--model",
                m,
                "--prompt",
                "abc",
                "--out",
                "/dev/null",
            ];
            all.extend(args);
            let o = difftx(&all);
            let err = String::from_utf8_lossy(&o.stderr);
            assert_eq!(o.status.code(), Some(1), "{err}");
            assert_eq!(err.trim_end().lines().count(), 1, "{err}");
            assert!(err.contains(needle), "{err}");
        }
        let o = difftx(&[
            "attention-map",
            "--model",
            m,
            "--prompt",
            &long,
            "--layer",
            "0",
            "--head",
            "0",
            "--out",
            "/dev/null",
        ]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
        assert!(
            err.contains("prompt is 129 tokens") && err.contains("context of 128"),
            "{err}"
        );
    }
}

/// The shape in a .npy file's header, checking the magic and the float32 dtype on the way.
fn npy_shape(bytes: &[u8]) -> Vec<usize> {
    assert_eq!(&bytes[..8], b"\x93NUMPY\x01\x00");
    let n = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
    let header = std::str::from_utf8(&bytes[10..10 + n]).unwrap();
    assert!(header.contains("'descr': '<f4'"), "{header}");
    let tuple = header.split("'shape': (").nth(1).unwrap();
    let tuple = &tuple[..tuple.find(')').unwrap()];
    let shape: Vec<usize> = tuple
        .split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|s| s.trim().parse().unwrap())
        .collect();
    let count: usize = shape.iter().product();
    assert_eq!(bytes.len(), 10 + n + 4 * count, "{header}");
    shape
}

#[test]
fn attention_map_dumps_npy_and_draws_every_head_of_a_layer() {
    let tmp = tempfile::tempdir().unwrap();
    let prompt = "oslo 123";
    for (kind, maps) in [("diff_v1", 3), ("standard", 1)] {
        let model = tmp.path().join(kind);
        let o = difftx(&[
            "init",
            "--attention",
            kind,
            "--out",
            model.to_str().unwrap(),
        ]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let config: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(model.join("config.json")).unwrap())
                .unwrap();
        let heads = config["num_attention_heads"].as_u64().unwrap() as usize;
        let (png, npy) = (tmp.path().join("all.png"), tmp.path().join("all.npy"));
        let m = model.to_str().unwrap();
        let base = [
            "attention-map",
            "--model",
            m,
            "--prompt",
            prompt,
            "--layer",
            "0",
        ];
        let mut args = base.to_vec();
        args.extend(["--all-heads", "--out", png.to_str().unwrap()]);
        args.extend(["--dump", npy.to_str().unwrap()]);
        let o = difftx(&args);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        assert_eq!(&std::fs::read(&png).unwrap()[1..4], b"PNG");
        let bytes = std::fs::read(&npy).unwrap();
        assert_eq!(npy_shape(&bytes), vec![heads, maps, 8, 8]);
        // row 0 of A (or A1) of head 0 is all on key 0: 1.0, then zeros
        let hlen = 10 + u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
        let first = f32::from_le_bytes(bytes[hlen..hlen + 4].try_into().unwrap());
        assert!((first - 1.0).abs() < 1e-6, "{first}");
        // one head: shape (1, maps, T, T)
        let mut args = base.to_vec();
        args.extend(["--head", "1", "--out", png.to_str().unwrap()]);
        args.extend(["--dump", npy.to_str().unwrap()]);
        let o = difftx(&args);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        assert_eq!(
            npy_shape(&std::fs::read(&npy).unwrap()),
            vec![1, maps, 8, 8]
        );
    }
    // an unknown dump format is one line naming the file
    let m = tmp.path().join("standard");
    let o = difftx(&[
        "attention-map",
        "--model",
        m.to_str().unwrap(),
        "--prompt",
        prompt,
        "--layer",
        "0",
        "--head",
        "0",
        "--out",
        "/dev/null",
        "--dump",
        "maps.txt",
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(err.contains("maps.txt") && err.contains(".npy"), "{err}");
}

/// `repro --long --quick`: every stage runs, the report has its sections and plots, each unit's
/// result is kept; run again it continues (a unit whose result is gone is trained again, to
/// the same figures); another plan in the same folder, or a corpus folder that is missing,
/// is refused in one line.
#[test]
fn long_quick_study_runs_every_stage_and_continues_where_it_stopped() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("long");
    let o = out.to_str().unwrap();
    let run = |extra: &[&str]| {
        difftx(
            &[
                &["--threads", "2", "repro", "--long", "--quick", "--out", o][..],
                extra,
            ]
            .concat(),
        )
    };
    ok(&run(&[]));
    let md = std::fs::read_to_string(out.join("REPRO_LONG.md")).unwrap();
    for section in [
        "## Learning-rate sweep",
        "## Language modelling and the loss by position",
        "## Multi-needle retrieval in haystacks of corpus text",
        "## Attention noise, outliers and low-bit weights",
        "## diff_v1's λ_init and subln",
        "## Reading",
    ] {
        assert!(md.contains(section), "{section} missing:\n{md}");
    }
    for kind in ["standard", "diff_v1", "diff_v2"] {
        assert!(md.contains(&format!("| {kind} | 1")), "{kind}:\n{md}");
    }
    for png in [
        "long_heatmap.png",
        "long_by_position.png",
        "long_needles.png",
    ] {
        assert!(
            std::fs::metadata(out.join(png)).unwrap().len() > 2000,
            "{png}"
        );
    }
    let results = std::fs::read_dir(out.join("results")).unwrap().count();
    assert_eq!(results, 14);
    // the extended model's validation loss (the trainer's, at 2C) is the report's loss to 2C
    let r: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("results/extend-diff_v1-s0.json")).unwrap())
            .unwrap();
    let last = r["eval"]["by_position"].as_array().unwrap().last().unwrap()["cumulative"].clone();
    let (a, b) = (last.as_f64().unwrap(), r["val_loss"].as_f64().unwrap());
    assert!((a - b).abs() < 1e-5 * b, "{a} vs {b}");
    // continued: only the unit whose result is gone runs, to the same figures
    let section =
        |md: &str| md[md.find("## Language").unwrap()..md.find("## Reading").unwrap()].to_string();
    std::fs::remove_file(out.join("results/extend-diff_v2-s0.json")).unwrap();
    std::fs::remove_dir_all(out.join("runs/extend-diff_v2-s0")).unwrap();
    let err = ok(&run(&[]));
    assert!(
        err.contains("[14/14] extend-diff_v2-s0") && !err.contains("[1/14]"),
        "{err}"
    );
    let again = std::fs::read_to_string(out.join("REPRO_LONG.md")).unwrap();
    assert_eq!(section(&again), section(&md));
    // another plan in the same folder; a corpus folder without its files
    fails_with(
        &run(&["--seeds", "2"]),
        &["holds a study with another plan"],
    );
    let nowhere = tmp.path().join("nowhere");
    let args = [
        "repro",
        "--long",
        "--corpus",
        nowhere.to_str().unwrap(),
        "--out",
        o,
    ];
    fails_with(&difftx(&args), &["nowhere", "scripts/long_corpus.sh"]);
}
