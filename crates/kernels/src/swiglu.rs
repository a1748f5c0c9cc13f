//! SwiGLU gate: h = silu(gate) · up, the middle of down(silu(gate x) · up x).

use super::sigmoid;
use rayon::prelude::*;

const CHUNK: usize = 4096;

/// gate, up, h: (N, F) flat.
pub fn swiglu_forward(h: &mut [f32], gate: &[f32], up: &[f32]) {
    h.par_chunks_mut(CHUNK)
        .zip(gate.par_chunks(CHUNK))
        .zip(up.par_chunks(CHUNK))
        .for_each(|((h, g), u)| {
            for ((h, &g), &u) in h.iter_mut().zip(g).zip(u) {
                *h = g * sigmoid(g) * u;
            }
        });
}

/// Writes dgate and dup (their only contribution). In the forward `h = g·σ(g)·u`, so
/// dup = dh·g·σ(g) and dgate = dh·u·σ(g)·(1 + g·(1 − σ(g))).
pub fn swiglu_backward(dgate: &mut [f32], dup: &mut [f32], dh: &[f32], gate: &[f32], up: &[f32]) {
    dgate
        .par_chunks_mut(CHUNK)
        .zip(dup.par_chunks_mut(CHUNK))
        .zip(dh.par_chunks(CHUNK))
        .zip(gate.par_chunks(CHUNK))
        .zip(up.par_chunks(CHUNK))
        .for_each(|((((dg, du), dh), g), u)| {
            for ((((dg, du), &dh), &g), &u) in dg.iter_mut().zip(du).zip(dh).zip(g).zip(u) {
                let s = sigmoid(g);
                *du = dh * g * s;
                *dg = dh * u * s * (1.0 + g * (1.0 - s));
            }
        });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{check_grad, dot64, randn};

    #[test]
    fn swiglu_gradients_match_finite_differences() {
        let n = 40;
        let (g, u, r) = (randn(n, 1, 2.0), randn(n, 2, 1.0), randn(n, 3, 1.0));
        let f = |g: &[f32], u: &[f32]| {
            let mut h = vec![0.0; n];
            swiglu_forward(&mut h, g, u);
            dot64(&h, &r)
        };
        // stale values in the buffers must be overwritten, not added to
        let (mut dg, mut du) = (vec![7.0; n], vec![-3.0; n]);
        swiglu_backward(&mut dg, &mut du, &r, &g, &u);
        check_grad("swiglu dgate", &g, &dg, |g| f(g, &u));
        check_grad("swiglu dup", &u, &du, |u| f(&g, u));
    }
}
