//! One optimisation step: forward, loss, backward, global-norm clipping, AdamW.
//! Gradients and both moments share the parameter layout, allocated once.

use crate::error::Result;
use crate::kernels::adamw::{adamw_update, AdamWParams};
use crate::model::{Model, Workspace};
use rayon::prelude::*;

/// AdamW with global-norm clipping over a model's flat parameters: the state a custom training loop keeps between steps.
///
/// ```
/// use difftx::prelude::*;
///
/// let mut config = ModelConfig::preset(Preset::Tiny, AttentionKind::DiffV1);
/// config.max_position_embeddings = 16;
/// let mut model = Model::init(config, 0)?;
/// let hp = AdamWParams { lr: 1e-3, beta1: 0.9, beta2: 0.95, eps: 1e-8, weight_decay: 0.1 };
/// let mut opt = Optimizer::new(&model, hp, 1.0);
/// let (b, t) = (2, 16);
/// let mut ws = Workspace::new(&model, b, t);
/// let text = Tokenizer::Bytes.encode(&"abcabcabc".repeat(8))?;
/// let (x, y) = (&text[..b * t], &text[1..b * t + 1]);
/// let first = opt.step(&mut model, &mut ws, x, y, b, t, 3e-3)?;
/// let mut last = first;
/// for _ in 0..10 {
///     last = opt.step(&mut model, &mut ws, x, y, b, t, 3e-3)?;
/// }
/// assert!(last.loss < first.loss);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Optimizer {
    /// AdamW's hyper-parameters (the learning rate is given per step).
    pub hp: AdamWParams,
    /// The gradient of every parameter, in the model's layout.
    pub grads: Vec<f32>,
    /// AdamW's first moment.
    pub m: Vec<f32>,
    /// AdamW's second moment.
    pub v: Vec<f32>,
    /// number of updates done
    pub t: u64,
    /// clip the global gradient norm to this (0: off)
    pub clip: f32,
    /// `grad_norm`'s per-chunk sums
    norm_parts: Vec<f64>,
}

/// Gradients per task in `zero_grad` and `grad_norm`.
const CHUNK: usize = 1 << 14;

/// Σ g² in f64, in LANES running sums (g[i] goes to sum i % LANES) added at the end: one sum
/// would be a chain of dependent additions, four cycles each.
fn sum_squares(g: &[f32]) -> f64 {
    const LANES: usize = 32;
    let mut acc = [0f64; LANES];
    let mut it = g.chunks_exact(LANES);
    for c in &mut it {
        for (a, &x) in acc.iter_mut().zip(c) {
            *a += x as f64 * x as f64;
        }
    }
    for (a, &x) in acc.iter_mut().zip(it.remainder()) {
        *a += x as f64 * x as f64;
    }
    acc.iter().sum()
}

/// What one step measured.
#[derive(Clone, Copy, Debug)]
pub struct TrainStep {
    /// Mean loss of the batch, in nats per token.
    pub loss: f32,
    /// Global L2 norm of the gradients before clipping.
    pub grad_norm: f32,
}

impl Optimizer {
    /// An optimizer for `model` with zeroed gradients and moments; `clip` 0 turns clipping off.
    pub fn new(model: &Model, hp: AdamWParams, clip: f32) -> Self {
        let n = model.num_params();
        Optimizer {
            hp,
            grads: crate::kernels::zeroed(n),
            m: crate::kernels::zeroed(n),
            v: crate::kernels::zeroed(n),
            t: 0,
            clip,
            norm_parts: Vec::new(),
        }
    }

    /// Global L2 norm of the gradients: squares summed in f64 over fixed chunks across the
    /// pool, then the chunks' sums in layout order, so the result does not depend on the
    /// thread count.
    pub fn grad_norm(&mut self) -> f32 {
        let (grads, parts) = (&self.grads, &mut self.norm_parts);
        parts.resize(grads.len().div_ceil(CHUNK), 0.0);
        crate::kernels::on_pool(|| {
            parts
                .par_iter_mut()
                .zip(grads.par_chunks(CHUNK))
                .for_each(|(s, g)| *s = sum_squares(g));
        });
        parts.iter().sum::<f64>().sqrt() as f32
    }

    /// Sets every gradient to zero.
    pub fn zero_grad(&mut self) {
        let grads = &mut self.grads;
        crate::kernels::on_pool(|| grads.par_chunks_mut(CHUNK).for_each(|g| g.fill(0.0)));
    }

    /// Forward, loss and backward of one (micro-)batch of inputs (B, T) and their next-token
    /// targets; the gradient of its mean loss is added to `grads`. Returns the mean loss.
    // one micro-batch: the model, its workspace, the tokens and their (B, T)
    #[allow(clippy::too_many_arguments)]
    pub fn accumulate(
        &mut self,
        model: &Model,
        ws: &mut Workspace,
        inputs: &[u32],
        targets: &[u32],
        b: usize,
        t: usize,
    ) -> Result<f32> {
        // On a pool thread, the step's parallel ops are worker-local forks (see kernels::on_pool).
        crate::kernels::on_pool(|| {
            model.forward(ws, inputs, b, t)?;
            let loss = model.loss(ws, targets)?;
            model.backward(ws, &mut self.grads);
            Ok(loss)
        })
    }

    /// Multiplies every gradient by `s` (1 / micro-batches after gradient accumulation).
    pub fn scale_grads(&mut self, s: f32) {
        let grads = &mut self.grads;
        crate::kernels::on_pool(|| crate::kernels::scale(grads, s));
    }

    /// Clips the gradients to the global norm `clip` (`grad_norm` is their current norm) and
    /// applies one AdamW update at learning rate `lr`.
    pub fn apply(&mut self, model: &mut Model, grad_norm: f32, lr: f32) {
        if self.clip > 0.0 && grad_norm > self.clip {
            self.scale_grads(self.clip / grad_norm);
        }
        self.t += 1;
        let hp = AdamWParams { lr, ..self.hp };
        let (grads, m, v, t) = (&self.grads, &mut self.m, &mut self.v, self.t);
        crate::kernels::on_pool(|| {
            for spec in &model.layout.specs {
                let r = spec.range();
                adamw_update(
                    &mut model.params[r.clone()],
                    &grads[r.clone()],
                    &mut m[r.clone()],
                    &mut v[r],
                    &hp,
                    t,
                    spec.decay,
                );
            }
        });
    }

    /// One full step on inputs (B, T) and their next-token targets, at learning rate `lr`.
    // `accumulate`'s arguments plus the step's learning rate
    #[allow(clippy::too_many_arguments)]
    pub fn step(
        &mut self,
        model: &mut Model,
        ws: &mut Workspace,
        inputs: &[u32],
        targets: &[u32],
        b: usize,
        t: usize,
        lr: f32,
    ) -> Result<TrainStep> {
        // One call on the pool for the whole step (the calls inside run directly).
        crate::kernels::on_pool(|| {
            self.zero_grad();
            let loss = self.accumulate(model, ws, inputs, targets, b, t)?;
            let grad_norm = self.grad_norm();
            self.apply(model, grad_norm, lr);
            Ok(TrainStep { loss, grad_norm })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{AttentionKind, ModelConfig, Preset};

    #[test]
    fn sum_squares_matches_a_plain_f64_sum() {
        for n in [0, 1, 31, 32, 33, 1000] {
            let g: Vec<f32> = (0..n)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
                .collect();
            let want: f64 = g.iter().map(|&x| x as f64 * x as f64).sum();
            let got = sum_squares(&g);
            assert!(
                (got - want).abs() <= 1e-12 * want.max(1.0),
                "n {n}: {got} vs {want}"
            );
        }
    }

    #[test]
    fn two_accumulated_half_batches_give_the_full_batch_gradient() {
        let mut c = ModelConfig::preset(Preset::Tiny, AttentionKind::DiffV1);
        c.max_position_embeddings = 16;
        let model = Model::init(c, 1).unwrap();
        let (b, t) = (4, 16);
        let x: Vec<u32> = (0..(b * t) as u32).map(|i| (i * 37 + 11) % 256).collect();
        let y: Vec<u32> = (0..(b * t) as u32).map(|i| (i * 53 + 7) % 256).collect();
        let hp = AdamWParams {
            lr: 0.0,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.0,
        };
        let mut ws = Workspace::new(&model, b, t);
        let mut full = Optimizer::new(&model, hp, 0.0);
        full.zero_grad();
        let loss = full.accumulate(&model, &mut ws, &x, &y, b, t).unwrap();
        let mut acc = Optimizer::new(&model, hp, 0.0);
        acc.zero_grad();
        let h = b / 2 * t;
        let l1 = acc
            .accumulate(&model, &mut ws, &x[..h], &y[..h], b / 2, t)
            .unwrap();
        let l2 = acc
            .accumulate(&model, &mut ws, &x[h..], &y[h..], b / 2, t)
            .unwrap();
        acc.scale_grads(0.5);
        assert!(((l1 + l2) / 2.0 - loss).abs() < 1e-5);
        let diff: f64 = full
            .grads
            .iter()
            .zip(&acc.grads)
            .map(|(a, b)| ((a - b) as f64).powi(2))
            .sum::<f64>()
            .sqrt();
        let rel = diff / full.grad_norm() as f64;
        assert!(rel < 1e-5, "relative difference {rel:e}");
        assert!(full.grad_norm() > 0.1);
    }
}
