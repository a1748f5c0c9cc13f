//! Chart axes with ticks where a reader looks for them: at the measured x values when there
//! are few of them (4, 6, 8, 16, 32 bits; 1, 2, 3 needles), else at round numbers (1, 2, 5 ×
//! 10^k; on a logarithmic axis powers of ten, filled in with 2 and 5 or every digit when the
//! range spans less than a decade or two). plotters' own axes pick ticks from the range only,
//! which put ticks at 10/20/30 under points at 4/6/8/16/32 and 1.2, 1.4 under whole numbers.

use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint, Ranged};
use std::ops::Range;

/// At most this many of the data's own values become ticks.
const MAX_VALUE_TICKS: usize = 10;
/// Neighbouring value ticks at least this fraction of the axis apart, so labels do not collide.
const MIN_GAP: f64 = 0.06;

/// One axis from `lo` to `hi`, linear or logarithmic, with its tick positions.
#[derive(Clone, Debug, PartialEq)]
pub struct Axis {
    pub lo: f64,
    pub hi: f64,
    pub log: bool,
    pub ticks: Vec<f64>,
}

impl Axis {
    /// The axis over `lo..hi` with ticks chosen for `values` (see [`choose_ticks`]).
    pub fn new(lo: f64, hi: f64, log: bool, values: &[f64]) -> Axis {
        Axis {
            lo,
            hi,
            log,
            ticks: choose_ticks(values, lo, hi, log),
        }
    }

    /// Position along the axis before scaling: the value itself, or its logarithm.
    fn t(&self, v: f64) -> f64 {
        if self.log {
            v.max(f64::MIN_POSITIVE).ln()
        } else {
            v
        }
    }

    /// Where `v` lies, 0 at `lo` and 1 at `hi`.
    pub fn fraction(&self, v: f64) -> f64 {
        (self.t(v) - self.t(self.lo)) / (self.t(self.hi) - self.t(self.lo))
    }
}

impl Ranged for Axis {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, v: &f64, limit: (i32, i32)) -> i32 {
        let f = self.fraction(*v);
        limit.0 + (f * (limit.1 - limit.0) as f64).round() as i32
    }

    /// The ticks for the labelled grid lines; no extra light lines between them.
    fn key_points<H: KeyPointHint>(&self, hint: H) -> Vec<f64> {
        if hint.weight().allow_light_points() {
            Vec::new()
        } else {
            self.ticks.clone()
        }
    }

    fn range(&self) -> Range<f64> {
        self.lo..self.hi
    }
}

/// Ticks for an axis over `lo..hi`: the distinct `values` inside it when they are at most
/// `MAX_VALUE_TICKS` and no two closer than `MIN_GAP` of the axis, else round numbers.
pub fn choose_ticks(values: &[f64], lo: f64, hi: f64, log: bool) -> Vec<f64> {
    let axis = Axis {
        lo,
        hi,
        log,
        ticks: Vec::new(),
    };
    let mut v: Vec<f64> = values
        .iter()
        .copied()
        .filter(|&x| x.is_finite() && x >= lo && x <= hi && (!log || x > 0.0))
        .collect();
    v.sort_by(f64::total_cmp);
    v.dedup();
    let spread = v
        .windows(2)
        .all(|w| axis.fraction(w[1]) - axis.fraction(w[0]) >= MIN_GAP);
    if !v.is_empty() && v.len() <= MAX_VALUE_TICKS && spread {
        return v;
    }
    if log && lo > 0.0 {
        log_ticks(lo, hi)
    } else {
        linear_ticks(lo, hi)
    }
}

/// Multiples of a round step (1, 2 or 5 × 10^k) giving five to nine ticks.
fn linear_ticks(lo: f64, hi: f64) -> Vec<f64> {
    if hi <= lo || !(hi - lo).is_finite() {
        return vec![lo];
    }
    let raw = (hi - lo) / 8.0;
    let p = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * p)
        .find(|&s| s >= raw)
        .unwrap_or(10.0 * p);
    let first = (lo / step).ceil() as i64;
    let last = (hi / step).floor() as i64;
    (first..=last).map(|i| round_sig(i as f64 * step)).collect()
}

/// Powers of ten in range; if fewer than three, also 2 and 5 times them; if still fewer than
/// three, every digit times them.
fn log_ticks(lo: f64, hi: f64) -> Vec<f64> {
    let (e0, e1) = (lo.log10().floor() as i32, hi.log10().ceil() as i32);
    let mut ticks = Vec::new();
    for mantissas in [
        &[1.0][..],
        &[1.0, 2.0, 5.0],
        &[1., 2., 3., 4., 5., 6., 7., 8., 9.],
    ] {
        ticks = (e0..=e1)
            .flat_map(|e| mantissas.iter().map(move |m| round_sig(m * 10f64.powi(e))))
            .filter(|&x| x >= lo && x <= hi)
            .collect();
        if ticks.len() >= 3 {
            break;
        }
    }
    // a range of many decades: every other power, so labels do not crowd
    while ticks.len() > 12 {
        ticks = ticks.into_iter().step_by(2).collect();
    }
    ticks
}

/// Tick labels: 3,000,000 → "3M", 150,000 → "150k", 16 → "16", 0.25 → "0.25", 2.105 → "2.105".
pub fn tick_label(x: f64) -> String {
    let trim = |x: f64| {
        let s = format!("{x:.4}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    };
    let a = x.abs();
    if a >= 1e6 {
        format!("{}M", trim(x / 1e6))
    } else if a >= 1e4 {
        format!("{}k", trim(x / 1e3))
    } else {
        trim(x)
    }
}

/// `x` to 12 significant digits, so 3 × 0.1 labels as 0.3, not 0.30000000000000004.
fn round_sig(x: f64) -> f64 {
    if x == 0.0 {
        return 0.0;
    }
    format!("{x:.11e}").parse().unwrap_or(x)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn few_measured_values_are_the_ticks() {
        // the low-bit plot: 4/6/8/16/32 bits on a log axis padded by 1.15
        let bits = [16.0, 8.0, 6.0, 4.0, 32.0];
        assert_eq!(
            choose_ticks(&bits, 4.0 / 1.15, 32.0 * 1.15, true),
            vec![4.0, 6.0, 8.0, 16.0, 32.0]
        );
        // accuracy against N: whole numbers, each once though three lines share them
        let n = [1.0, 2.0, 3.0, 1.0, 2.0, 3.0];
        assert_eq!(choose_ticks(&n, 0.92, 3.08, false), vec![1.0, 2.0, 3.0]);
        // ICL shots
        let shots = [1.0, 2.0, 4.0, 8.0, 16.0, 31.0];
        assert_eq!(choose_ticks(&shots, 1.0 / 1.15, 31.0 * 1.15, true), shots);
    }

    #[test]
    fn crowded_or_many_values_get_round_ticks() {
        // the scaling plot: three sizes, each three nearly equal parameter counts
        let params = [
            139_584.0, 139_776.0, 140_096.0, 381_600.0, 381_888.0, 383_328.0, 918_656.0, 919_040.0,
            922_752.0,
        ];
        assert_eq!(
            choose_ticks(&params, 139_584.0 / 1.15, 922_752.0 * 1.15, true),
            vec![200_000.0, 500_000.0, 1_000_000.0]
        );
        // a training curve: 60 steps of 10
        let steps: Vec<f64> = (1..=60).map(|i| 10.0 * i as f64).collect();
        assert_eq!(
            choose_ticks(&steps, 0.0, 600.0, false),
            vec![0.0, 100.0, 200.0, 300.0, 400.0, 500.0, 600.0]
        );
        // accuracy 0..1 with no values: steps of 0.2, labelled without float noise
        assert_eq!(
            choose_ticks(&[], 0.0, 1.0, false),
            vec![0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
        );
        // many decades: powers of ten, thinned
        let wide = choose_ticks(&[], 1.0, 1e30, true);
        assert!(wide.len() <= 12 && wide[0] == 1.0, "{wide:?}");
    }

    #[test]
    fn tick_labels_are_short() {
        assert_eq!(tick_label(3_000_000.0), "3M");
        assert_eq!(tick_label(150_000.0), "150k");
        assert_eq!(tick_label(16.0), "16");
        assert_eq!(tick_label(0.5), "0.5");
        assert_eq!(tick_label(2.105), "2.105");
        assert_eq!(tick_label(0.0), "0");
    }

    #[test]
    fn the_axis_maps_ends_to_the_pixel_range() {
        let a = Axis::new(10.0, 1000.0, true, &[]);
        assert_eq!(a.map(&10.0, (0, 200)), 0);
        assert_eq!(a.map(&100.0, (0, 200)), 100);
        assert_eq!(a.map(&1000.0, (0, 200)), 200);
        let l = Axis::new(0.0, 4.0, false, &[]);
        assert_eq!(l.map(&1.0, (100, 0)), 75);
    }
}
