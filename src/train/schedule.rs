//! Learning-rate schedule: linear warm-up, then cosine decay to a floor.

/// Learning rate of update `step` (0-based) of `steps`: rises linearly over `warmup` updates to
/// `peak`, then follows half a cosine down to `min` at the last update.
pub fn lr_at(step: u64, steps: u64, peak: f32, min: f32, warmup: u64) -> f32 {
    if step < warmup {
        return peak * (step + 1) as f32 / warmup as f32;
    }
    let span = steps.saturating_sub(warmup).saturating_sub(1).max(1);
    let p = ((step - warmup) as f64 / span as f64).min(1.0);
    let cos = 0.5 * (1.0 + (std::f64::consts::PI * p).cos());
    (min as f64 + (peak - min) as f64 * cos) as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warmup_rises_to_the_peak_then_cosine_reaches_the_floor_at_the_last_step() {
        let (steps, warm) = (100, 10);
        assert!((lr_at(0, steps, 1.0, 0.1, warm) - 0.1).abs() < 1e-7);
        assert!((lr_at(9, steps, 1.0, 0.1, warm) - 1.0).abs() < 1e-7);
        assert!((lr_at(10, steps, 1.0, 0.1, warm) - 1.0).abs() < 1e-7);
        assert!((lr_at(99, steps, 1.0, 0.1, warm) - 0.1).abs() < 1e-7);
        // halfway through the decay: (peak + min) / 2
        let mid = lr_at(10 + 89 / 2, steps, 1.0, 0.1, warm);
        assert!((mid - 0.55).abs() < 0.02, "{mid}");
        let lrs: Vec<f32> = (10..100).map(|s| lr_at(s, steps, 1.0, 0.1, warm)).collect();
        assert!(lrs.windows(2).all(|w| w[1] <= w[0]));
        // no warm-up at all
        assert_eq!(lr_at(0, 5, 2.0, 0.0, 0), 2.0);
    }
}
