//! Whole-model gradient checks: for every attention kind, with MHA and GQA, tied and untied
//! embeddings (and diff_v1's Table 6 ablations), the analytic gradient of the mean loss w.r.t. every tensor against central
//! finite differences along directions in that tensor's parameter space.

use difftx::{AttentionKind, Model, ModelConfig, Preset, Workspace};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn small(kind: AttentionKind, kv: usize, tied: bool) -> ModelConfig {
    let mut c = ModelConfig::preset(Preset::Tiny, kind);
    c.vocab_size = 29;
    c.hidden_size = 16;
    c.intermediate_size = 24;
    c.num_hidden_layers = 2;
    c.head_dim = 4;
    c.num_attention_heads = if kind == AttentionKind::Standard {
        4
    } else {
        2
    };
    c.num_key_value_heads = kv;
    c.max_position_embeddings = 8;
    c.tie_word_embeddings = tied;
    c
}

fn loss_of(model: &Model, ws: &mut Workspace, x: &[u32], y: &[u32], b: usize, t: usize) -> f64 {
    model.forward(ws, x, b, t).unwrap();
    model.loss(ws, y).unwrap() as f64
}

fn check(config: ModelConfig) {
    let label = format!(
        "{} H={} Hkv={} tied={} lambda_init={:?} subln={}",
        config.attention,
        config.num_attention_heads,
        config.num_key_value_heads,
        config.tie_word_embeddings,
        config.lambda_init,
        config.subln
    );
    let mut model = Model::init(config.clone(), 3).unwrap();
    // Larger weights than the 0.02 init so that every path carries signal.
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    for spec in model.layout.specs.clone() {
        let norm = spec.name.ends_with("norm.weight") || spec.name.ends_with("subln.weight");
        for p in &mut model.params[spec.range()] {
            let r: f32 = rng.random::<f32>() * 2.0 - 1.0;
            *p = if norm { 1.0 + 0.2 * r } else { 0.3 * r };
        }
    }
    let (b, t) = (2, 7);
    let x: Vec<u32> = (0..b * t)
        .map(|_| rng.random_range(0..config.vocab_size as u32))
        .collect();
    let y: Vec<u32> = (0..b * t)
        .map(|_| rng.random_range(0..config.vocab_size as u32))
        .collect();
    let mut ws = Workspace::new(&model, b, t);
    loss_of(&model, &mut ws, &x, &y, b, t);
    let mut grads = vec![0.0; model.num_params()];
    model.backward(&mut ws, &mut grads);
    // Step 1e-2 along a unit direction: truncation O(h²) ≈ 1e-4 relative; the f32 loss (≈ 3.4)
    // rounds at ≈ 3e-7, i.e. ≈ 2e-5 in the difference quotient. Along the gradient itself the
    // derivative is ‖g‖, so a 1% tolerance on it cannot hide a wrong term.
    let h = 1e-2f32;
    for spec in model.layout.specs.clone() {
        let r = spec.range();
        let g = &grads[r.clone()];
        let gnorm = g.iter().map(|v| (*v as f64).powi(2)).sum::<f64>().sqrt();
        assert!(gnorm > 1e-6, "{label}: {} has a zero gradient", spec.name);
        // Half along the gradient, half random: checks magnitude and direction.
        let noise: Vec<f64> = (0..g.len())
            .map(|_| rng.random::<f64>() * 2.0 - 1.0)
            .collect();
        let nn = noise.iter().map(|v| v * v).sum::<f64>().sqrt();
        let mut dir: Vec<f64> = g
            .iter()
            .zip(&noise)
            .map(|(&g, n)| g as f64 / gnorm + n / nn)
            .collect();
        let dn = dir.iter().map(|v| v * v).sum::<f64>().sqrt();
        dir.iter_mut().for_each(|v| *v /= dn);
        let analytic: f64 = g.iter().zip(&dir).map(|(&g, d)| g as f64 * d).sum();
        let orig = model.params[r.clone()].to_vec();
        let mut at = |s: f32, model: &mut Model| {
            for ((p, o), d) in model.params[r.clone()].iter_mut().zip(&orig).zip(&dir) {
                *p = o + s * *d as f32;
            }
            loss_of(model, &mut ws, &x, &y, b, t)
        };
        let fd = (at(h, &mut model) - at(-h, &mut model)) / (2.0 * h as f64);
        model.params[r.clone()].copy_from_slice(&orig);
        let err = (fd - analytic).abs() / gnorm;
        assert!(err < 1e-2, "{label}: {}: finite difference {fd:.6e} vs analytic {analytic:.6e} (error {err:.2e} of ‖g‖ {gnorm:.3e})", spec.name);
    }
}

#[test]
fn standard_gradients_match_finite_differences() {
    check(small(AttentionKind::Standard, 4, false));
    check(small(AttentionKind::Standard, 2, true));
}

#[test]
fn diff_v1_gradients_match_finite_differences() {
    check(small(AttentionKind::DiffV1, 2, false));
    check(small(AttentionKind::DiffV1, 1, true));
}

#[test]
fn diff_v1_ablation_gradients_match_finite_differences() {
    // paper Table 6: one constant λ_init, and no subln (nor its (1 − λ_init) scale)
    check(ModelConfig {
        lambda_init: Some(0.8),
        ..small(AttentionKind::DiffV1, 2, false)
    });
    check(ModelConfig {
        subln: false,
        ..small(AttentionKind::DiffV1, 1, true)
    });
}

#[test]
fn diff_v2_gradients_match_finite_differences() {
    check(small(AttentionKind::DiffV2, 2, true));
    check(small(AttentionKind::DiffV2, 1, false));
}
