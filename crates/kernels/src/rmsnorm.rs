//! RMSNorm: out = x / sqrt(mean(x²) + eps) · w, times a constant `gain` (1 but for diff_v1's
//! subln, whose fixed (1 − λ_init) scale rides along instead of taking a pass of its own).

use super::{dot, dot3, ensure, with_thread_buffer, Grad, ROW_CHUNK};
use rayon::prelude::*;

/// x: (N, C) rows, w: (C), out: (N, C); rstd: (N) saved for the backward. With `kept`, x is
/// also copied there in the same pass: a block's input, which the residual update then
/// overwrites, saved for the backward without a serial copy of its own.
// llm.c's layernorm signature, plus the kept input and subln's fixed gain
#[allow(clippy::too_many_arguments)]
pub fn rmsnorm_forward(
    out: &mut [f32],
    rstd: &mut [f32],
    x: &[f32],
    kept: Option<&mut [f32]>,
    w: &[f32],
    gain: f32,
    c: usize,
    eps: f32,
) {
    let norm = |out: &mut [f32], rstd: &mut [f32], x: &[f32]| {
        for ((o, r), x) in out.chunks_mut(c).zip(rstd.iter_mut()).zip(x.chunks(c)) {
            let ms = dot(x, x) / c as f32;
            *r = 1.0 / (ms + eps).sqrt();
            for ((o, &x), &w) in o.iter_mut().zip(x).zip(w) {
                *o = x * *r * w * gain;
            }
        }
    };
    let rows = out
        .par_chunks_mut(c * ROW_CHUNK)
        .zip(rstd.par_chunks_mut(ROW_CHUNK))
        .zip(x.par_chunks(c * ROW_CHUNK));
    match kept {
        None => rows.for_each(|((out, rstd), x)| norm(out, rstd, x)),
        Some(kept) => {
            assert_eq!(kept.len(), x.len(), "rmsnorm: kept copy of x");
            rows.zip(kept.par_chunks_mut(c * ROW_CHUNK))
                .for_each(|(((out, rstd), x), kept)| {
                    kept.copy_from_slice(x);
                    norm(out, rstd, x);
                });
        }
    }
}

/// Writes or accumulates dx (`Grad`) and accumulates dw. In the forward pass
/// `out = x · r · w · gain` with r = rstd, so with d = gain · dout,
/// dx = r·(w·d) − x·r³/C·Σ(w·d·x) and dw += d·x·r.
// llm.c's layernorm signature, plus subln's fixed gain
#[allow(clippy::too_many_arguments)]
pub fn rmsnorm_backward(
    dx: Grad,
    dw: &mut [f32],
    dout: &[f32],
    x: &[f32],
    w: &[f32],
    gain: f32,
    rstd: &[f32],
    c: usize,
) {
    let (dx, add) = dx.parts();
    // dw is a sum over rows: each chunk of rows adds its own part while its rows are in cache,
    // and the parts are added in order (deterministic, whatever the thread count).
    with_thread_buffer(&DW_PARTS, |parts| {
        let parts = ensure(parts, rstd.len().div_ceil(ROW_CHUNK) * c);
        dx.par_chunks_mut(c * ROW_CHUNK)
            .zip(dout.par_chunks(c * ROW_CHUNK))
            .zip(x.par_chunks(c * ROW_CHUNK))
            .zip(rstd.par_chunks(ROW_CHUNK))
            .zip(parts.par_chunks_mut(c))
            .for_each(|((((dx, dout), x), rstd), part)| {
                part.fill(0.0);
                for (((dx, dout), x), &r) in dx
                    .chunks_mut(c)
                    .zip(dout.chunks(c))
                    .zip(x.chunks(c))
                    .zip(rstd)
                {
                    let k = gain * dot3(dout, w, x) * r * r * r / c as f32;
                    for ((((dx, &d), &w), &x), p) in
                        dx.iter_mut().zip(dout).zip(w).zip(x).zip(part.iter_mut())
                    {
                        let g = r * w * (d * gain) - k * x;
                        *dx = if add { *dx + g } else { g };
                        *p += d * gain * x * r;
                    }
                }
            });
        for part in parts.chunks(c) {
            for (dw, &p) in dw.iter_mut().zip(part) {
                *dw += p;
            }
        }
    });
}

/// Sizes this thread's partial sums for norms of up to `rows` rows of `c` columns.
pub(crate) fn reserve(rows: usize, c: usize) {
    with_thread_buffer(&DW_PARTS, |parts| {
        ensure(parts, rows.div_ceil(ROW_CHUNK) * c);
    });
}

thread_local! {
    /// `rmsnorm_backward`'s partial sums of dw, one row of C per chunk of rows.
    static DW_PARTS: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{check_grad, dot64, randn};

    #[test]
    fn rmsnorm_gradients_match_finite_differences() {
        let (n, c, eps) = (5, 12, 1e-5);
        let x = randn(n * c, 1, 1.0);
        let w = randn(c, 2, 1.0);
        let r = randn(n * c, 3, 1.0);
        // 1 for the block norms; 0.2 as diff_v1's subln carries (1 − λ_init) at λ_init 0.8
        for gain in [1.0, 0.2] {
            let f = |x: &[f32], w: &[f32]| {
                let (mut out, mut rstd) = (vec![0.0; n * c], vec![0.0; n]);
                rmsnorm_forward(&mut out, &mut rstd, x, None, w, gain, c, eps);
                (out, rstd)
            };
            let (_, rstd) = f(&x, &w);
            let (mut dx, mut dw) = (vec![0.0; n * c], vec![0.0; c]);
            rmsnorm_backward(Grad::Add(&mut dx), &mut dw, &r, &x, &w, gain, &rstd, c);
            check_grad("rmsnorm dx", &x, &dx, |x| dot64(&f(x, &w).0, &r));
            check_grad("rmsnorm dw", &w, &dw, |w| dot64(&f(&x, w).0, &r));
            // Set overwrites stale values; Add adds to what is there
            let (mut set, mut add) = (vec![7.0; n * c], vec![1.0; n * c]);
            rmsnorm_backward(Grad::Set(&mut set), &mut dw, &r, &x, &w, gain, &rstd, c);
            rmsnorm_backward(Grad::Add(&mut add), &mut dw, &r, &x, &w, gain, &rstd, c);
            for ((s, a), d) in set.iter().zip(&add).zip(&dx) {
                assert_eq!(s, d);
                assert!((a - (d + 1.0)).abs() < 1e-6, "{a} vs {d} + 1");
            }
        }
    }

    /// dw over rows in several chunks (each adds its own part) is the sum over every row.
    #[test]
    fn dw_sums_every_chunk_of_rows() {
        let (n, c, gain) = (3 * ROW_CHUNK + 5, 24, 0.7);
        let (x, w, d) = (randn(n * c, 5, 1.0), randn(c, 6, 1.0), randn(n * c, 7, 1.0));
        let (mut out, mut rstd) = (vec![0.0; n * c], vec![0.0; n]);
        rmsnorm_forward(&mut out, &mut rstd, &x, None, &w, gain, c, 1e-5);
        let (mut dx, mut dw) = (vec![0.0; n * c], vec![0.5; c]);
        rmsnorm_backward(Grad::Set(&mut dx), &mut dw, &d, &x, &w, gain, &rstd, c);
        for j in 0..c {
            let want: f64 = 0.5
                + (0..n)
                    .map(|i| (d[i * c + j] * gain * x[i * c + j] * rstd[i]) as f64)
                    .sum::<f64>();
            assert!(
                (dw[j] as f64 - want).abs() < 1e-4,
                "dw[{j}] {} vs {want}",
                dw[j]
            );
        }
    }

    #[test]
    fn rmsnorm_output_has_unit_rms_before_weight() {
        let (n, c) = (3, 64);
        let x = randn(n * c, 4, 3.0);
        let (mut out, mut rstd) = (vec![0.0; n * c], vec![0.0; n]);
        rmsnorm_forward(&mut out, &mut rstd, &x, None, &vec![1.0; c], 1.0, c, 1e-5);
        for row in out.chunks(c) {
            let ms: f32 = row.iter().map(|v| v * v).sum::<f32>() / c as f32;
            assert!((ms - 1.0).abs() < 1e-4, "{ms}");
        }
    }

    /// Keeping the input is the plain forward (the same bits) plus an exact copy of x.
    #[test]
    fn keeping_the_input_copies_it_and_normalises_alike() {
        let (n, c) = (2 * ROW_CHUNK + 3, 40);
        let (x, w) = (randn(n * c, 8, 2.0), randn(c, 9, 1.0));
        let (mut want, mut want_rstd) = (vec![0.0; n * c], vec![0.0; n]);
        rmsnorm_forward(&mut want, &mut want_rstd, &x, None, &w, 1.0, c, 1e-5);
        let (mut out, mut rstd, mut kept) = (vec![0.0; n * c], vec![0.0; n], vec![0.0; n * c]);
        rmsnorm_forward(&mut out, &mut rstd, &x, Some(&mut kept), &w, 1.0, c, 1e-5);
        assert_eq!(out, want);
        assert_eq!(rstd, want_rstd);
        assert_eq!(kept, x);
    }
}
