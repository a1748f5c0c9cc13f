//! Interleaved rotary position embedding: dims 2j and 2j+1 rotate together by pos · θ^(−2j/d).

use super::ROW_CHUNK;
use rayon::prelude::*;

/// cos and sin of pos · θ^(−2j/d), (max_pos, d/2) each.
#[derive(Clone, Debug)]
pub struct RopeTable {
    pub cos: Vec<f32>,
    pub sin: Vec<f32>,
    pub half: usize,
    pub max_pos: usize,
}

impl RopeTable {
    pub fn new(head_dim: usize, max_pos: usize, theta: f64) -> Self {
        let half = head_dim / 2;
        let (mut cos, mut sin) = (
            Vec::with_capacity(max_pos * half),
            Vec::with_capacity(max_pos * half),
        );
        for p in 0..max_pos {
            for j in 0..half {
                let freq = theta.powf(-2.0 * j as f64 / head_dim as f64);
                let a = p as f64 * freq;
                cos.push(a.cos() as f32);
                sin.push(a.sin() as f32);
            }
        }
        RopeTable {
            cos,
            sin,
            half,
            max_pos,
        }
    }
}

/// x: (B, T, NH, d) in place; token t of sequence b sits at position pos0[b] + t (`pos0` holds
/// one start per sequence, or a single start shared by all).
/// `inverse` applies the transposed rotation, which is also the backward pass.
fn rotate(x: &mut [f32], table: &RopeTable, t: usize, nh: usize, pos0: &[usize], inverse: bool) {
    let half = table.half;
    let row = nh * 2 * half;
    let b = x.len() / (row * t);
    assert!(
        pos0.len() == 1 || pos0.len() == b,
        "rope: {} starts for {b} sequences",
        pos0.len()
    );
    let last = pos0.iter().max().copied().unwrap_or(0) + t;
    assert!(
        last <= table.max_pos,
        "rope: position {last} beyond table {}",
        table.max_pos
    );
    let sign = if inverse { -1.0 } else { 1.0 };
    x.par_chunks_mut(row * ROW_CHUNK)
        .enumerate()
        .for_each(|(ci, chunk)| {
            for (ri, r) in chunk.chunks_mut(row).enumerate() {
                let n = ci * ROW_CHUNK + ri;
                let p = pos0[if pos0.len() == 1 { 0 } else { n / t }] + n % t;
                let (cos, sin) = (
                    &table.cos[p * half..(p + 1) * half],
                    &table.sin[p * half..(p + 1) * half],
                );
                for head in r.chunks_mut(2 * half) {
                    for ((pair, &c), &s) in head.chunks_exact_mut(2).zip(cos).zip(sin) {
                        let (a, b) = (pair[0], pair[1]);
                        let s = sign * s;
                        pair[0] = a * c - b * s;
                        pair[1] = a * s + b * c;
                    }
                }
            }
        });
}

/// x: (B, T, NH, d) rotated in place; sequence b starts at position pos0[b] (or pos0[0] for all).
pub fn rope_forward(x: &mut [f32], table: &RopeTable, t: usize, nh: usize, pos0: &[usize]) {
    rotate(x, table, t, nh, pos0, false);
}

/// dx: (B, T, NH, d), the gradient w.r.t. the rotated x, turned in place into the gradient
/// w.r.t. the input. The forward is an orthogonal rotation R, so its backward is Rᵀ.
pub fn rope_backward(dx: &mut [f32], table: &RopeTable, t: usize, nh: usize, pos0: &[usize]) {
    rotate(dx, table, t, nh, pos0, true);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{check_grad, dot64, randn};

    #[test]
    fn rope_gradient_matches_finite_differences() {
        let (b, t, nh, d) = (2, 5, 3, 8);
        let table = RopeTable::new(d, 16, 10000.0);
        let x = randn(b * t * nh * d, 1, 1.0);
        let r = randn(x.len(), 2, 1.0);
        let mut dx = r.clone();
        rope_backward(&mut dx, &table, t, nh, &[3, 5]);
        check_grad("rope dx", &x, &dx, |x| {
            let mut y = x.to_vec();
            rope_forward(&mut y, &table, t, nh, &[3, 5]);
            dot64(&y, &r)
        });
    }

    #[test]
    fn rope_rotates_adjacent_pairs_by_position_times_frequency() {
        let d = 4;
        let table = RopeTable::new(d, 8, 100.0);
        // one head, sequence of 3 tokens, each (1, 0, 1, 0)
        let mut x = [1.0, 0.0, 1.0, 0.0].repeat(3);
        rope_forward(&mut x, &table, 3, 1, &[0]);
        for p in 0..3 {
            let a0 = p as f32; // j = 0: frequency 1
            let a1 = p as f32 * 100f32.powf(-0.5); // j = 1: frequency θ^(-2/4)
            let r = &x[p * 4..p * 4 + 4];
            assert!((r[0] - a0.cos()).abs() < 1e-6 && (r[1] - a0.sin()).abs() < 1e-6);
            assert!((r[2] - a1.cos()).abs() < 1e-6 && (r[3] - a1.sin()).abs() < 1e-6);
        }
    }
}
