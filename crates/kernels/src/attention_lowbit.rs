//! Low-bit attention (paper Section 3.7), for evaluation only: the attention logits
//! q·kᵀ/√d are absmax fake-quantised to a number of bits before the softmax. The training
//! kernel is untouched; a forward pass takes this path when `Workspace::logit_bits` is set
//! (no KV cache, and no backward after it: it saves no log-sum-exp).

use super::attention::AttnShape;
use rayon::prelude::*;

/// Absmax fake-quantisation to `bits` signed levels: Δ = max|x| / (2^(bits−1) − 1),
/// x → round(x / Δ)·Δ (halves away from zero). All zeros stay zeros.
pub fn absmax_quantize(x: &mut [f64], bits: u32) {
    let levels = ((1u64 << (bits.clamp(2, 53) - 1)) - 1) as f64;
    let amax = x.iter().fold(0f64, |m, &v| m.max(v.abs()));
    if amax == 0.0 {
        return;
    }
    let step = amax / levels;
    x.iter_mut().for_each(|v| *v = (*v / step).round() * step);
}

/// q: (B, T, NQ, DK), k: (B, T, NK, DK), v: (B, T, NV, DV) → o: (B, T, NQ, DV). Causal
/// softmax attention in f64 whose logits are absmax-quantised to `bits` per (sequence, query
/// head) — one scale for the head's whole causal logit matrix, as a per-tensor int kernel
/// would use — before the softmax.
// attention_forward's operands with the logits' bit width
#[allow(clippy::too_many_arguments)]
pub fn quantized_attention_forward(
    o: &mut [f32],
    q: &[f32],
    k: &[f32],
    v: &[f32],
    b: usize,
    t: usize,
    s: &AttnShape,
    bits: u32,
) {
    let (nq, nk, nv, dk, dv) = (s.nq, s.nk, s.nv, s.dk, s.dv);
    assert_eq!(o.len(), b * t * nq * dv);
    let scale = 1.0 / (dk as f64).sqrt();
    o.par_chunks_mut(t * nq * dv)
        .enumerate()
        .for_each(|(bi, o)| {
            let (q, k, v) = (
                &q[bi * t * nq * dk..(bi + 1) * t * nq * dk],
                &k[bi * t * nk * dk..(bi + 1) * t * nk * dk],
                &v[bi * t * nv * dv..(bi + 1) * t * nv * dv],
            );
            // the causal logits of one head, row i holding keys 0..=i
            let mut logits = vec![0f64; t * (t + 1) / 2];
            let mut acc = vec![0f64; dv];
            for j in 0..nq {
                let (kh, vh) = (s.k_head(j), s.v_head(j));
                let mut at = 0;
                for i in 0..t {
                    let qr = &q[(i * nq + j) * dk..][..dk];
                    for p in 0..=i {
                        let kr = &k[(p * nk + kh) * dk..][..dk];
                        let d: f64 = qr.iter().zip(kr).map(|(&a, &b)| a as f64 * b as f64).sum();
                        logits[at] = d * scale;
                        at += 1;
                    }
                }
                absmax_quantize(&mut logits, bits);
                let mut at = 0;
                for i in 0..t {
                    let row = &mut logits[at..at + i + 1];
                    at += i + 1;
                    let m = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    let mut sum = 0.0;
                    row.iter_mut().for_each(|x| {
                        *x = (*x - m).exp();
                        sum += *x;
                    });
                    acc.fill(0.0);
                    for (p, &w) in row.iter().enumerate() {
                        let vr = &v[(p * nv + vh) * dv..][..dv];
                        for (a, &x) in acc.iter_mut().zip(vr) {
                            *a += w * x as f64;
                        }
                    }
                    let out = &mut o[(i * nq + j) * dv..][..dv];
                    for (y, &a) in out.iter_mut().zip(&acc) {
                        *y = (a / sum) as f32;
                    }
                }
            }
        });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absmax_rounds_to_the_nearest_of_the_signed_levels() {
        // 3 bits: levels ±3, step 1/3
        let mut x = vec![1.0, -0.5, 0.26, 0.0];
        absmax_quantize(&mut x, 3);
        let want = [1.0, -2.0 / 3.0, 1.0 / 3.0, 0.0];
        for (a, b) in x.iter().zip(want) {
            assert!((a - b).abs() < 1e-12, "{x:?}");
        }
        let mut z = vec![0.0; 3];
        absmax_quantize(&mut z, 4);
        assert_eq!(z, vec![0.0; 3]);
    }
}
