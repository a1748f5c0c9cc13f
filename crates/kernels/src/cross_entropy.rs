//! Softmax cross-entropy of logits against target tokens.

use super::{exp_nonpos, reduce_lanes, MAX, SUM};
use rayon::prelude::*;

const CHUNK: usize = 16;

/// A target that takes no part in the loss (PyTorch's `ignore_index`): its loss and its
/// gradient are zero and the mean is over the other targets. Used to train on answer tokens only.
pub const IGNORE: u32 = u32::MAX;

/// logits: (N, V), targets: (N); writes losses (N) = lse − logit[target] (0 for `IGNORE`) and
/// lse (N) for the backward.
pub fn cross_entropy_forward(
    losses: &mut [f32],
    lse: &mut [f32],
    logits: &[f32],
    targets: &[u32],
    v: usize,
) {
    losses
        .par_chunks_mut(CHUNK)
        .zip(lse.par_chunks_mut(CHUNK))
        .zip(logits.par_chunks(v * CHUNK))
        .zip(targets.par_chunks(CHUNK))
        .for_each(|(((loss, lse), logits), targets)| {
            for (((loss, lse), row), &t) in
                loss.iter_mut().zip(lse).zip(logits.chunks(v)).zip(targets)
            {
                let max = reduce_lanes(row, |x| x, MAX);
                let sum = reduce_lanes(row, |x| exp_nonpos(x - max), SUM);
                *lse = max + sum.ln();
                *loss = if t == IGNORE {
                    0.0
                } else {
                    *lse - row[t as usize]
                };
            }
        });
}

/// Writes dlogits (N, V) = (softmax(logits) − onehot(target)) · dloss, the logits feeding
/// only the loss (zero rows for `IGNORE`). `dloss` is the same for every row (1/counted for a
/// mean).
pub fn cross_entropy_backward(
    dlogits: &mut [f32],
    logits: &[f32],
    lse: &[f32],
    targets: &[u32],
    v: usize,
    dloss: f32,
) {
    dlogits
        .par_chunks_mut(v * CHUNK)
        .zip(logits.par_chunks(v * CHUNK))
        .zip(lse.par_chunks(CHUNK))
        .zip(targets.par_chunks(CHUNK))
        .for_each(|(((dl, logits), lse), targets)| {
            for (((dl, row), &lse), &t) in
                dl.chunks_mut(v).zip(logits.chunks(v)).zip(lse).zip(targets)
            {
                if t == IGNORE {
                    dl.fill(0.0);
                    continue;
                }
                for (d, &x) in dl.iter_mut().zip(row) {
                    *d = exp_nonpos(x - lse) * dloss;
                }
                dl[t as usize] -= dloss;
            }
        });
}

/// How many targets count in the loss (all but `IGNORE`).
pub fn counted(targets: &[u32]) -> usize {
    targets.iter().filter(|&&t| t != IGNORE).count()
}

/// Mean of the per-token losses over the counted targets, summed in f64 in a fixed order.
pub fn mean_loss(losses: &[f32], counted: usize) -> f32 {
    (losses.iter().map(|&l| l as f64).sum::<f64>() / counted as f64) as f32
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{check_grad, randn};

    #[test]
    fn cross_entropy_gradient_matches_finite_differences() {
        let (n, v) = (6, 9);
        let logits = randn(n * v, 1, 2.0);
        let targets: Vec<u32> = (0..n as u32).map(|i| (i * 4) % v as u32).collect();
        let mean = |x: &[f32]| {
            let (mut l, mut s) = (vec![0.0; n], vec![0.0; n]);
            cross_entropy_forward(&mut l, &mut s, x, &targets, v);
            l.iter().map(|&l| l as f64).sum::<f64>() / n as f64
        };
        let (mut l, mut s) = (vec![0.0; n], vec![0.0; n]);
        cross_entropy_forward(&mut l, &mut s, &logits, &targets, v);
        let mut d = vec![0.0; n * v];
        cross_entropy_backward(&mut d, &logits, &s, &targets, v, 1.0 / n as f32);
        check_grad("cross-entropy dlogits", &logits, &d, mean);
    }

    #[test]
    fn ignored_targets_cost_nothing_and_get_no_gradient() {
        let (n, v) = (6, 9);
        let logits = randn(n * v, 2, 2.0);
        let targets: Vec<u32> = vec![1, IGNORE, 4, IGNORE, IGNORE, 8];
        let kept = counted(&targets);
        assert_eq!(kept, 3);
        let mean = |x: &[f32]| {
            let (mut l, mut s) = (vec![0.0; n], vec![0.0; n]);
            cross_entropy_forward(&mut l, &mut s, x, &targets, v);
            mean_loss(&l, kept) as f64
        };
        // the mean over the counted rows equals the loss of those rows alone
        let rows = [0usize, 2, 5];
        let sub: Vec<f32> = rows
            .iter()
            .flat_map(|&r| logits[r * v..(r + 1) * v].to_vec())
            .collect();
        let (mut l, mut s) = (vec![0.0; 3], vec![0.0; 3]);
        cross_entropy_forward(&mut l, &mut s, &sub, &[1, 4, 8], v);
        assert!((mean(&logits) - mean_loss(&l, 3) as f64).abs() < 1e-6);
        let (mut l, mut s) = (vec![0.0; n], vec![0.0; n]);
        cross_entropy_forward(&mut l, &mut s, &logits, &targets, v);
        let mut d = vec![1.0; n * v];
        cross_entropy_backward(&mut d, &logits, &s, &targets, v, 1.0 / kept as f32);
        assert!(d[v..2 * v].iter().all(|&g| g == 0.0));
        check_grad(
            "cross-entropy dlogits with ignored targets",
            &logits,
            &d,
            mean,
        );
    }

    #[test]
    fn uniform_logits_cost_log_v() {
        let v = 256;
        let (mut l, mut s) = (vec![0.0; 1], vec![0.0; 1]);
        cross_entropy_forward(&mut l, &mut s, &vec![0.5; v], &[3], v);
        assert!((l[0] - (v as f32).ln()).abs() < 1e-5);
    }
}
