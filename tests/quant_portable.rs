//! `--quant` on a CPU without AVX2: the quantised products run on the portable engine (plain
//! integer loops), and the model's logits are those of the SIMD engine this CPU has (VNNI or
//! AVX2, which give the same bits) and near f32's.
//! `kernels::quant::force_portable` makes this CPU take that path. One test in this file:
//! the switch is process-wide.

use difftx::kernels::quant::{force_portable, Engine, QuantKind};
use difftx::model::KvCache;
use difftx::{AttentionKind, Model, ModelConfig, Preset, Workspace};

/// The logits of one forward over `tokens` (the blocked GEMM), then those of decoding them
/// one by one through the KV cache (the matrix-vector products), one after the other.
fn logits(m: &Model, tokens: &[u32]) -> Vec<f32> {
    let (t, v) = (tokens.len(), m.config.vocab_size);
    let mut ws = Workspace::new(m, 1, t);
    m.forward(&mut ws, tokens, 1, t).unwrap();
    let mut out = ws.logits[..t * v].to_vec();
    let mut cache = [KvCache::new(m, t)];
    for &tok in tokens {
        m.forward_cached(&mut ws, &mut cache, &[tok], 1, false)
            .unwrap();
        out.extend_from_slice(&ws.logits[..v]);
    }
    out
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max)
}

fn rms(a: &[f32], b: &[f32]) -> f32 {
    let s: f32 = a.iter().zip(b).map(|(x, y)| (x - y).powi(2)).sum();
    (s / a.len() as f32).sqrt()
}

/// Every kind, Q8_0 and Q4_0, prefill and decode: forced onto the portable engine, the
/// quantised model's logits stay within the quantisation error of f32's (RMS under 3% of the
/// logits' spread for Q8_0, 30% for Q4_0, the bounds of the model's own quantisation test);
/// and where this CPU has a SIMD engine, they are its: both take the same integer dot
/// products and differ only in the order they add the blocks' scaled sums, which can flip a
/// later layer's int8 rounding of its input. Measured (2026-11-25): five cases agree to f32
/// rounding (max 4e-7), diff_v1 Q4_0 has one such flip (max 3.0e-3, 1.3% of the spread; RMS
/// 1e-4); the bounds, max 3% and RMS 0.1% of the spread, are far below what a wrong product
/// gives (the Q4_0 quantisation error alone is an RMS of 11–17% of the spread).
#[test]
fn the_portable_engine_gives_the_simd_engines_logits_near_f32() {
    let tokens: Vec<u32> = (0..40).map(|i| (i * 37 % 256) as u32).collect();
    let native_engine = Engine::detect();
    let simd = native_engine != Engine::Portable;
    if !simd {
        eprintln!("this CPU has neither AVX512-VNNI nor AVX2: the portable engine runs either way");
    }
    let mut any_apart = 0f32;
    for kind in AttentionKind::ALL {
        let f = Model::init(ModelConfig::preset(Preset::Tiny, kind), 7).unwrap();
        let want = logits(&f, &tokens);
        let spread = (want.iter().map(|v| v * v).sum::<f32>() / want.len() as f32).sqrt();
        for (q, tol) in [(QuantKind::Q8_0, 0.03), (QuantKind::Q4_0, 0.3)] {
            let mut m = f.clone();
            assert!(m.quantize(q).is_empty(), "{kind} {q}: a matrix kept f32");
            let native = logits(&m, &tokens);
            force_portable(true);
            assert_eq!(Engine::detect(), Engine::Portable);
            let portable = logits(&m, &tokens);
            force_portable(false);
            let err = rms(&portable, &want);
            eprintln!("{kind} {q}: portable vs f32, rms {err:.2e} (spread {spread:.3})");
            assert!(
                err < tol * spread,
                "{kind} {q}: rms {err} vs spread {spread}"
            );
            assert!(err > 0.0, "{kind} {q}: the blocks were not used");
            let (worst, apart) = (max_diff(&portable, &native), rms(&portable, &native));
            eprintln!(
                "{kind} {q}: portable vs native engine, max |diff| {worst:.2e}, rms {apart:.2e}"
            );
            any_apart = any_apart.max(worst);
            assert!(
                worst <= 0.03 * spread && apart <= 1e-3 * spread,
                "{kind} {q}: portable vs native engine: max {worst}, rms {apart} (spread {spread})"
            );
        }
    }
    // the two engines add in different orders: logits equal to the last bit in every case
    // would mean the switch did not take effect
    assert!(!simd || any_apart > 0.0, "the forced engine did not run");
}
