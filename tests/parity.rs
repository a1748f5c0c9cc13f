//! Parity with the PyTorch reference (scripts/reference.py, float64): for every fixture, the
//! logits, loss, every block's output and every parameter's gradient. Like llm.c's
//! test_gpt2.c it prints the error of each tensor, so the first one that disagrees names the
//! culprit (`cargo test --test parity -- --nocapture`).

use difftx::model::checkpoint::{decode_f32, read_safetensors};
use difftx::model::{KvCache, Model, Workspace};
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
    // one sequence of 2,048 tokens: the attention over 32 key tiles, rotary angles far out
    "diff_v1_long_2048",
    "diff_v2_long_2048",
];

/// The long fixtures' logits once more through the KV cache, as a server would compute them:
/// the first half prefilled in one pass, then one token at a time at depths 1,024–2,047.
const LONG: &[&str] = &["diff_v1_long_2048", "diff_v2_long_2048"];

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

/// A fixture's model and the bytes of its reference tensors.
fn fixture(case: &str) -> (Model, Vec<u8>) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(case);
    let model = Model::load(&dir).unwrap();
    (
        model,
        read_safetensors(&dir.join("reference.safetensors")).unwrap(),
    )
}

/// The reference's token sequences, flattened, and their batch and length (inputs + 1).
fn tokens(st: &SafeTensors) -> (Vec<u32>, usize, usize) {
    let tv = st.tensor("tokens").unwrap();
    assert_eq!(tv.dtype(), Dtype::I32);
    let tokens = tv
        .data()
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as u32)
        .collect();
    (tokens, tv.shape()[0], tv.shape()[1])
}

fn run(case: &str) {
    let (model, bytes) = fixture(case);
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let (tokens, b, t1) = tokens(&st);
    let t = t1 - 1;
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

#[test]
fn long_fixtures_match_pytorch_through_the_kv_cache() {
    for case in LONG {
        let (model, bytes) = fixture(case);
        let st = SafeTensors::deserialize(&bytes).unwrap();
        let (tokens, b, t1) = tokens(&st);
        assert_eq!(b, 1);
        let (t, half, v) = (t1 - 1, (t1 - 1) / 2, model.config.vocab_size);
        let mut got = Vec::with_capacity(t * v);
        let mut ws = Workspace::new(&model, 1, half);
        let mut cache = [KvCache::new(&model, t)];
        model
            .forward_cached(&mut ws, &mut cache, &tokens[..half], half, true)
            .unwrap();
        got.extend_from_slice(&ws.logits[..half * v]);
        for &token in &tokens[half..t] {
            model
                .forward_cached(&mut ws, &mut cache, &[token], 1, false)
                .unwrap();
            got.extend_from_slice(&ws.logits[..v]);
        }
        let (want, _) = tensor(&st, "logits");
        let (first, rest) = (
            rel(&got[..half * v], &want[..half * v]),
            rel(&got[half * v..], &want[half * v..]),
        );
        println!(
            "{case}: logits through the cache, prefill rel err {first:.2e}, decode {rest:.2e}"
        );
        assert!(
            first < 1e-5 && rest < 1e-5,
            "{case}: prefill {first:.2e}, decode {rest:.2e}"
        );
    }
}
