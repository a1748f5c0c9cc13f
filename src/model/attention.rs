//! The three attention kinds. All run the same causal kernel (kernels/attention.rs); they differ
//! in how q, k and v are laid out (`shape`) and in how pairs of head outputs are combined:
//!
//! - `standard`: the kernel's output is the attention output.
//! - `diff_v1`:  head_i = (1 − λ_init) · subln(attn1_i − λ · attn2_i), one λ per layer,
//!   λ = exp(λ_q1·λ_k1) − exp(λ_q2·λ_k2) + λ_init (the Table 6 ablations: a constant λ_init,
//!   and head_i = attn1_i − λ · attn2_i without subln).
//! - `diff_v2`:  out_i = attn_{2i} − σ(lambda_proj x)_i · attn_{2i+1}, a λ per token and head.
//!
//! Because (A1 − λA2)V = A1V − λ(A2V), the combination happens after the kernel; its backward
//! is `do1 = dO`, `do2 = −λ·dO`, `dλ = −Σ dO·o2`.

use crate::config::{AttentionKind, ModelConfig};
use crate::kernels::attention::AttnShape;
pub use crate::kernels::attention::Lambda;
use crate::kernels::dot;
use rayon::prelude::*;

pub fn shape(c: &ModelConfig) -> AttnShape {
    AttnShape {
        nq: c.n_query_heads(),
        nk: c.n_key_heads(),
        nv: c.num_key_value_heads,
        dk: c.head_dim,
        dv: c.value_head_dim(),
        diff_pairs: c.attention == AttentionKind::DiffV1,
    }
}

/// λ = exp(λ_q1·λ_k1) − exp(λ_q2·λ_k2) + λ_init (paper Eq. 2), and the two exponentials,
/// which the backward needs.
pub fn lambda_full(lambdas: [&[f32]; 4], lambda_init: f32) -> (f32, f32, f32) {
    let [q1, k1, q2, k2] = lambdas;
    let e1 = dot(q1, k1).exp();
    let e2 = dot(q2, k2).exp();
    (e1 - e2 + lambda_init, e1, e2)
}

/// Accumulates the gradients of the four λ vectors from dλ. In the forward pass this was
/// `λ = exp(q1·k1) − exp(q2·k2) + λ_init`, so d q1 = dλ·e1·k1, d k1 = dλ·e1·q1, and the second
/// pair the same with −e2.
pub fn lambda_full_backward(
    grads: [&mut [f32]; 4],
    lambdas: [&[f32]; 4],
    e1: f32,
    e2: f32,
    dlambda: f32,
) {
    let [gq1, gk1, gq2, gk2] = grads;
    let [q1, k1, q2, k2] = lambdas;
    for (g, x, s) in [(gq1, k1, e1), (gk1, q1, e1), (gq2, k2, -e2), (gk2, q2, -e2)] {
        for (g, &x) in g.iter_mut().zip(x) {
            *g += dlambda * s * x;
        }
    }
}

/// o: (N, 2H, DV), the kernel's output with attn1 and attn2 of pair i at heads 2i and 2i+1;
/// out: (N, H, DV) = attn1 − λ·attn2.
pub fn diff_combine_forward(out: &mut [f32], o: &[f32], lambda: Lambda, h: usize, dv: usize) {
    out.par_chunks_mut(h * dv)
        .zip(o.par_chunks(2 * h * dv))
        .enumerate()
        .for_each(|(n, (out, o))| {
            for (i, out) in out.chunks_mut(dv).enumerate() {
                let lam = lambda.at(n * h + i);
                let (a1, a2) = o[2 * i * dv..(2 * i + 2) * dv].split_at(dv);
                for ((y, &x1), &x2) in out.iter_mut().zip(a1).zip(a2) {
                    *y = x1 - lam * x2;
                }
            }
        });
}

/// The combine's backward, given dout (N, H, DV), the gradient of attn1 − λ·attn2: the maps'
/// own gradients are do1 = dout and do2 = −λ·dout, which the paired attention backward
/// derives from dout itself. Writes dlambda (N, H) = −Σ dout·attn2 per row and head (for
/// diff_v1 the caller sums it) and delta (N, 2H) = rowsum(do ∘ o) for the attention backward
/// (`attention_delta`): do1·attn1, and do2·attn2 = λ·dlambda.
pub fn diff_combine_backward(
    dlambda: &mut [f32],
    delta: &mut [f32],
    dout: &[f32],
    o: &[f32],
    lambda: Lambda,
    h: usize,
    dv: usize,
) {
    dlambda
        .par_chunks_mut(h)
        .zip(delta.par_chunks_mut(2 * h))
        .zip(dout.par_chunks(h * dv))
        .zip(o.par_chunks(2 * h * dv))
        .enumerate()
        .for_each(|(n, (((dl, delta), dout), o))| {
            for (i, dy) in dout.chunks(dv).enumerate() {
                let lam = lambda.at(n * h + i);
                let (o1, o2) = o[2 * i * dv..(2 * i + 2) * dv].split_at(dv);
                dl[i] = -dot(dy, o2);
                delta[2 * i] = dot(dy, o1);
                delta[2 * i + 1] = lam * dl[i];
            }
        });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{check_grad, dot64, randn};

    #[test]
    fn combine_gradients_match_finite_differences() {
        let (n, h, dv) = (3, 2, 4);
        let o = randn(n * 2 * h * dv, 1, 1.0);
        let lam = randn(n * h, 2, 1.0);
        let r = randn(n * h * dv, 3, 1.0);
        let f = |o: &[f32], lam: &[f32]| {
            let mut y = vec![0.0; n * h * dv];
            diff_combine_forward(&mut y, o, Lambda::PerToken(lam), h, dv);
            dot64(&y, &r)
        };
        let mut dl = vec![0.0; n * h];
        let mut delta = vec![0.0; n * 2 * h];
        let lambda = Lambda::PerToken(&lam);
        diff_combine_backward(&mut dl, &mut delta, &r, &o, lambda, h, dv);
        // the maps' gradients the paired attention backward takes from r: (r, −λ·r)
        let mut d_o = Vec::with_capacity(o.len());
        for (ri, &l) in r.chunks(dv).zip(&lam) {
            d_o.extend_from_slice(ri);
            d_o.extend(ri.iter().map(|&x| -l * x));
        }
        check_grad("combine do", &o, &d_o, |o| f(o, &lam));
        check_grad("combine dlambda", &lam, &dl, |l| f(&o, l));
        // the attention's row sums, as attention_delta computes them from do and o
        let mut want = vec![0.0; n * 2 * h];
        crate::kernels::attention::attention_delta(&mut want, &d_o, &o, 2 * h, dv);
        for (got, want) in delta.iter().zip(&want) {
            assert!(
                (got - want).abs() < 1e-5 * (1.0 + want.abs()),
                "{got} vs {want}"
            );
        }
    }

    #[test]
    fn lambda_reparameterisation_gradient_matches_finite_differences() {
        let v = randn(4 * 5, 4, 0.3);
        let split = |v: &[f32]| -> [Vec<f32>; 4] {
            std::array::from_fn(|i| v[i * 5..(i + 1) * 5].to_vec())
        };
        let lam = |v: &[f32]| {
            let s = split(v);
            lambda_full([&s[0], &s[1], &s[2], &s[3]], 0.2).0 as f64
        };
        let s = split(&v);
        let (_, e1, e2) = lambda_full([&s[0], &s[1], &s[2], &s[3]], 0.2);
        let mut g = vec![0.0; 20];
        let (g01, g23) = g.split_at_mut(10);
        let (g0, g1) = g01.split_at_mut(5);
        let (g2, g3) = g23.split_at_mut(5);
        lambda_full_backward([g0, g1, g2, g3], [&s[0], &s[1], &s[2], &s[3]], e1, e2, 1.0);
        check_grad("lambda vectors", &v, &g, lam);
    }
}
