//! Helpers for the kernel gradient checks (tests only).

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

pub fn randn(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n)
        .map(|_| (rng.random::<f32>() * 2.0 - 1.0) * scale * 1.7)
        .collect()
}

/// Σ out · r in f64: the scalar objective whose gradient w.r.t. `out` is `r`.
pub fn dot64(a: &[f32], b: &[f32]) -> f64 {
    a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum()
}

/// Central finite differences of `f` at `x`, one element at a time, compared with `analytic`
/// by ‖a − fd‖ / ‖fd‖. The kernels run in f32: with step h = 1e-2 on O(1) inputs the
/// truncation error is O(h²) ≈ 1e-4 relative and f32 rounding of an O(100)-term objective
/// contributes ≈ 1e-5 / h, so 2e-3 separates rounding from a wrong formula (which errs by O(1)).
pub fn check_grad(name: &str, x: &[f32], analytic: &[f32], mut f: impl FnMut(&[f32]) -> f64) {
    const H: f32 = 1e-2;
    const TOL: f64 = 2e-3;
    let mut xp = x.to_vec();
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for i in 0..x.len() {
        xp[i] = x[i] + H;
        let fp = f(&xp);
        xp[i] = x[i] - H;
        let fm = f(&xp);
        xp[i] = x[i];
        let fd = (fp - fm) / (2.0 * H as f64);
        num += (analytic[i] as f64 - fd).powi(2);
        den += fd * fd;
    }
    let rel = (num / den.max(1e-30)).sqrt();
    assert!(den > 0.0, "{name}: gradient is identically zero");
    assert!(rel < TOL, "{name}: relative error {rel:.2e} >= {TOL:.0e}");
}
