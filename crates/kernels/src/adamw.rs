//! AdamW with decoupled weight decay (Loshchilov & Hutter), in the order torch.optim.AdamW uses.

use rayon::prelude::*;

const CHUNK: usize = 1 << 14;

#[derive(Clone, Copy, Debug)]
pub struct AdamWParams {
    pub lr: f32,
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
    pub weight_decay: f32,
}

/// One update of params p with gradients g and moments m, v (all the same length); `t` is the
/// 1-based step, `decay` whether weight decay applies to this tensor.
pub fn adamw_update(
    p: &mut [f32],
    g: &[f32],
    m: &mut [f32],
    v: &mut [f32],
    h: &AdamWParams,
    t: u64,
    decay: bool,
) {
    let bc1 = 1.0 - (h.beta1 as f64).powi(t as i32);
    let bc2 = 1.0 - (h.beta2 as f64).powi(t as i32);
    let step = (h.lr as f64 / bc1) as f32;
    let bc2_sqrt = bc2.sqrt() as f32;
    let shrink = if decay {
        1.0 - h.lr * h.weight_decay
    } else {
        1.0
    };
    p.par_chunks_mut(CHUNK)
        .zip(g.par_chunks(CHUNK))
        .zip(m.par_chunks_mut(CHUNK))
        .zip(v.par_chunks_mut(CHUNK))
        .for_each(|(((p, g), m), v)| {
            for (((p, &g), m), v) in p.iter_mut().zip(g).zip(m).zip(v) {
                *m = h.beta1 * *m + (1.0 - h.beta1) * g;
                *v = h.beta2 * *v + (1.0 - h.beta2) * g * g;
                *p = *p * shrink - step * *m / (v.sqrt() / bc2_sqrt + h.eps);
            }
        });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_step_moves_each_weight_by_lr_against_its_gradient_sign() {
        // At t = 1, m̂ = g and v̂ = g², so the step is lr·g/(|g| + eps) ≈ lr·sign(g).
        let h = AdamWParams {
            lr: 0.1,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.5,
        };
        let mut p = vec![1.0, 1.0];
        let (mut m, mut v) = (vec![0.0; 2], vec![0.0; 2]);
        adamw_update(&mut p, &[3.0, -0.01], &mut m, &mut v, &h, 1, true);
        let shrunk = 1.0 - 0.1 * 0.5;
        assert!((p[0] - (shrunk - 0.1)).abs() < 1e-6, "{}", p[0]);
        assert!((p[1] - (shrunk + 0.1)).abs() < 1e-5, "{}", p[1]);
        let mut q = vec![1.0];
        adamw_update(&mut q, &[3.0], &mut [0.0], &mut [0.0], &h, 1, false);
        assert!(
            (q[0] - 0.9).abs() < 1e-6,
            "no decay on this tensor: {}",
            q[0]
        );
    }
}
