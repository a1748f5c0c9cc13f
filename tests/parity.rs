//! Parity with the PyTorch reference (scripts/reference.py, float64): for every fixture, the
//! logits, loss, every block's output and every parameter's gradient. Like llm.c's
//! test_gpt2.c it prints the error of each tensor, so the first one that disagrees names the
//! culprit (`cargo test --test parity -- --nocapture`).

use difftx::model::checkpoint::{decode_f32, read_safetensors};
use difftx::{Model, Workspace};
use safetensors::{Dtype, SafeTensors};
use std::path::Path;

const CASES: &[&str] = &[
    "standard_mha_untied",
    "standard_gqa_tied",
    "diff_v1_mha_untied",
    "diff_v1_gqa_tied",
    "diff_v1_gqa_untied",
    "diff_v2_mha_untied",
    "diff_v2_gqa_tied",
    // paper Table 6: lambda_init 0.8 for every layer; no subln and no (1 − λ_init) scale
    "diff_v1_lambda_init_const",
    "diff_v1_no_subln",
];

fn tensor(st: &SafeTensors, name: &str) -> (Vec<f32>, Vec<usize>) {
    let v = st
        .tensor(name)
        .unwrap_or_else(|_| panic!("reference lacks `{name}`"));
    let mut out = vec![0.0; v.shape().iter().product()];
    decode_f32(v.dtype(), v.data(), &mut out).unwrap();
    (out, v.shape().to_vec())
}

/// ‖a − b‖ / ‖b‖
fn rel(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let num: f64 = a
        .iter()
        .zip(b)
        .map(|(&x, &y)| (x as f64 - y as f64).powi(2))
        .sum();
    let den: f64 = b.iter().map(|&y| (y as f64).powi(2)).sum();
    (num / den).sqrt()
}

fn run(case: &str) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(case);
    let model = Model::load(&dir).unwrap();
    let bytes = read_safetensors(&dir.join("reference.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let tv = st.tensor("tokens").unwrap();
    assert_eq!(tv.dtype(), Dtype::I32);
    let (b, t1) = (tv.shape()[0], tv.shape()[1]);
    let t = t1 - 1;
    let tokens: Vec<u32> = tv
        .data()
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as u32)
        .collect();
    let (x, y): (Vec<u32>, Vec<u32>) = tokens
        .chunks(t1)
        .flat_map(|s| s[..t].iter().copied().zip(s[1..].iter().copied()))
        .unzip();

    let mut ws = Workspace::new(&model, b, t);
    ws.keep_hidden_states(&model);
    model.forward(&mut ws, &x, b, t).unwrap();
    let loss = model.loss(&mut ws, &y).unwrap();
    let mut grads = vec![0.0; model.num_params()];
    model.backward(&mut ws, &mut grads);

    let mut worst: Vec<(String, f64, f64)> = Vec::new();
    let (ref_logits, _) = tensor(&st, "logits");
    let n = b * t * model.config.vocab_size;
    worst.push(("logits".into(), rel(&ws.logits[..n], &ref_logits), 1e-5));
    let (ref_loss, _) = tensor(&st, "loss");
    worst.push((
        "loss".into(),
        ((loss - ref_loss[0]) / ref_loss[0]).abs() as f64,
        1e-5,
    ));
    for l in 0..model.config.num_hidden_layers {
        let (h, _) = tensor(&st, &format!("hidden.{l}"));
        worst.push((
            format!("hidden.{l}"),
            rel(&ws.hidden[l][..h.len()], &h),
            1e-5,
        ));
    }
    for spec in &model.layout.specs {
        let (g, shape) = tensor(&st, &format!("grad.{}", spec.name));
        assert_eq!(shape, spec.shape, "{case}: grad.{} shape", spec.name);
        worst.push((
            format!("grad.{}", spec.name),
            rel(&grads[spec.range()], &g),
            1e-4,
        ));
    }
    println!("{case}: loss {loss:.6} (reference {:.6})", ref_loss[0]);
    for (name, err, tol) in &worst {
        println!("  {name:<55} rel err {err:.2e}  (tol {tol:.0e})");
    }
    let bad: Vec<_> = worst
        .iter()
        .filter(|(_, e, tol)| e.is_nan() || e >= tol)
        .collect();
    assert!(
        bad.is_empty(),
        "{case}: first disagreeing tensor {:?}",
        bad[0]
    );
}

#[test]
fn every_fixture_matches_pytorch() {
    for case in CASES {
        run(case);
    }
}
