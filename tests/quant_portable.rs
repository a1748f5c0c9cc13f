//! `--quant` on a CPU without AVX2: the quantised products run on the portable engine (plain
//! integer loops), and the model's logits are those of the SIMD engine this CPU has (VNNI,
//! AVX2 or SDOT, which give the same bits) and near f32's.
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
/// and where this CPU has a SIMD engine, they are its, bit for bit: both take the same integer
/// dot products and scale them with the same convert, product and FMA in the same order
/// (`every_engine_gives_the_same_bits` in the kernels, product by product; here through a
/// whole model, where a difference would also move a later layer's int8 rounding).
#[test]
fn the_portable_engine_gives_the_simd_engines_logits_near_f32() {
    let tokens: Vec<u32> = (0..40).map(|i| (i * 37 % 256) as u32).collect();
    let native_engine = Engine::detect();
    if native_engine == Engine::Portable {
        eprintln!("this CPU has neither AVX512-VNNI nor AVX2: the portable engine runs either way");
    }
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
            let worst = max_diff(&portable, &native);
            eprintln!("{kind} {q}: portable vs native engine, max |diff| {worst:.2e}");
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert!(
                bits(&portable) == bits(&native),
                "{kind} {q}: portable vs native engine: max |diff| {worst} (spread {spread})"
            );
        }
    }
}
