//! The scaling fits read off the measured runs: validation loss against ln(parameters) per
//! kind, and the parameter ratio at equal loss.

use super::measure::LmRun;
use crate::config::AttentionKind;
use crate::experiments::common::mean_std;
use serde::Serialize;

/// L = a + b ln N, fitted by least squares. With three sizes a power law with an irreducible
/// term (L = E + A N^-α) has as many parameters as points and would fit any three losses
/// exactly, so the straight line in ln N is the most a 3-point curve can say.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct LogFit {
    pub a: f64,
    pub b: f64,
}

impl LogFit {
    /// The least-squares line through (ln N, L); None with fewer than two distinct N.
    pub fn fit(points: &[(f64, f64)]) -> Option<LogFit> {
        let n = points.len() as f64;
        let xs: Vec<f64> = points.iter().map(|p| p.0.ln()).collect();
        let mx = xs.iter().sum::<f64>() / n;
        let my = points.iter().map(|p| p.1).sum::<f64>() / n;
        let sxx: f64 = xs.iter().map(|x| (x - mx).powi(2)).sum();
        let sxy: f64 = xs
            .iter()
            .zip(points)
            .map(|(x, p)| (x - mx) * (p.1 - my))
            .sum();
        if points.len() < 2 || sxx <= 1e-12 || !sxx.is_finite() {
            return None;
        }
        let b = sxy / sxx;
        Some(LogFit { a: my - b * mx, b })
    }

    /// The fitted loss at N parameters.
    pub fn loss_at(&self, n: f64) -> f64 {
        self.a + self.b * n.ln()
    }

    /// The parameters at which the fit reaches `loss`; None unless the loss falls with size
    /// (b < 0).
    pub fn params_for(&self, loss: f64) -> Option<f64> {
        (self.b < 0.0).then(|| ((loss - self.a) / self.b).exp())
    }
}

/// The parameter ratio at equal loss: the parameters the `diff` fit needs to reach the
/// `standard` fit's loss at `n_ref` parameters, divided by `n_ref` (below 1: the diff kind is
/// more parameter-efficient). Undefined, with the reason, unless both losses fall with size.
pub fn param_ratio(
    standard: &LogFit,
    diff: &LogFit,
    n_ref: f64,
) -> std::result::Result<f64, String> {
    if standard.b >= 0.0 {
        return Err(format!(
            "undefined: the standard loss does not fall with size (b = {:+.4})",
            standard.b
        ));
    }
    match diff.params_for(standard.loss_at(n_ref)) {
        Some(n) => Ok(n / n_ref),
        None => Err(format!(
            "undefined: this kind's loss does not fall with size (b = {:+.4})",
            diff.b
        )),
    }
}

pub(crate) fn select<'a>(runs: &'a [LmRun], label: &str, size: usize) -> Vec<&'a LmRun> {
    runs.iter()
        .filter(|r| r.label == label && r.size == size)
        .collect()
}

pub(crate) fn sizes_of(runs: &[LmRun]) -> usize {
    runs.iter()
        .filter(|r| r.variant.is_none())
        .map(|r| r.size + 1)
        .max()
        .unwrap_or(0)
}

/// The variants' labels, each once, in the order they ran.
pub(crate) fn variant_labels(runs: &[LmRun]) -> Vec<&str> {
    let mut labels: Vec<&str> = Vec::new();
    for r in runs.iter().filter(|r| r.variant.is_some()) {
        if !labels.contains(&r.label.as_str()) {
            labels.push(&r.label);
        }
    }
    labels
}

pub(crate) fn seeds_of(runs: &[LmRun]) -> Vec<u64> {
    let mut s: Vec<u64> = runs.iter().map(|r| r.seed).collect();
    s.sort_unstable();
    s.dedup();
    s
}

/// One kind's (parameters, validation loss) per size; `seed` picks one seed's runs, None the
/// mean over seeds at each size.
pub(crate) fn kind_points(
    runs: &[LmRun],
    kind: AttentionKind,
    seed: Option<u64>,
) -> Vec<(f64, f64)> {
    (0..sizes_of(runs))
        .filter_map(|s| {
            let rs: Vec<&LmRun> = select(runs, kind.as_str(), s)
                .into_iter()
                .filter(|r| seed.is_none_or(|x| r.seed == x))
                .collect();
            let v: Vec<f64> = rs.iter().map(|r| r.val_loss).collect();
            (!rs.is_empty()).then(|| (rs[0].params as f64, mean_std(&v).0))
        })
        .collect()
}

/// The fit of one kind's validation loss against its parameters over the sizes (`seed` as in
/// `kind_points`).
pub fn kind_fit(runs: &[LmRun], kind: AttentionKind, seed: Option<u64>) -> Option<LogFit> {
    LogFit::fit(&kind_points(runs, kind, seed))
}

/// The standard model's parameters at the middle size (the ratio's reference).
pub(crate) fn reference_params(runs: &[LmRun]) -> Option<f64> {
    let mid = sizes_of(runs) / 2;
    select(runs, AttentionKind::Standard.as_str(), mid)
        .first()
        .map(|r| r.params as f64)
}

/// The parameter ratio of `kind` at equal loss from the mean fits, and one per seed.
pub fn ratios(
    runs: &[LmRun],
    kind: AttentionKind,
) -> (
    std::result::Result<f64, String>,
    Vec<std::result::Result<f64, String>>,
) {
    let Some(n_ref) = reference_params(runs) else {
        return (Err("no standard runs".into()), Vec::new());
    };
    let one = |seed: Option<u64>| match (
        kind_fit(runs, AttentionKind::Standard, seed),
        kind_fit(runs, kind, seed),
    ) {
        (Some(s), Some(d)) => param_ratio(&s, &d, n_ref),
        _ => Err("undefined: fewer than two sizes".into()),
    };
    let per_seed = seeds_of(runs).into_iter().map(|s| one(Some(s))).collect();
    (one(None), per_seed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_fit_recovers_a_line_and_inverts_it() {
        let line = |a: f64, b: f64| -> Vec<(f64, f64)> {
            [1e5, 3e5, 9e5]
                .iter()
                .map(|&n| (n, a + b * f64::ln(n)))
                .collect()
        };
        let f = LogFit::fit(&line(5.0, -0.2)).unwrap();
        assert!(
            (f.a - 5.0).abs() < 1e-9 && (f.b + 0.2).abs() < 1e-9,
            "{f:?}"
        );
        assert!((f.params_for(f.loss_at(2e5)).unwrap() / 2e5 - 1.0).abs() < 1e-9);
        // least squares through points off the line: the mean of the residuals is zero
        let noisy = vec![(1e5, 3.0), (3e5, 2.5), (9e5, 2.4)];
        let g = LogFit::fit(&noisy).unwrap();
        let r: f64 = noisy.iter().map(|&(n, l)| l - g.loss_at(n)).sum();
        assert!(r.abs() < 1e-9 && g.b < 0.0, "{g:?}");
        assert!(LogFit::fit(&[(1e5, 3.0), (1e5, 2.0)]).is_none());
        assert!(LogFit::fit(&[(1e5, 3.0)]).is_none());
        assert_eq!(LogFit { a: 1.0, b: 0.0 }.params_for(1.0), None);
    }

    #[test]
    fn the_ratio_at_equal_loss_is_below_one_for_a_lower_curve_and_undefined_when_flat() {
        let standard = LogFit { a: 5.0, b: -0.2 };
        // 0.1 nats lower at every size with the same slope: ln N shifts by 0.1 / 0.2
        let better = LogFit { a: 4.9, b: -0.2 };
        let r = param_ratio(&standard, &better, 3e5).unwrap();
        assert!((r - (-0.5f64).exp()).abs() < 1e-9, "{r}");
        let worse = LogFit { a: 5.1, b: -0.2 };
        assert!((param_ratio(&standard, &worse, 3e5).unwrap() - 0.5f64.exp()).abs() < 1e-9);
        let flat = LogFit { a: 2.0, b: 0.01 };
        let e = param_ratio(&standard, &flat, 3e5).unwrap_err();
        assert!(e.contains("undefined") && e.contains("+0.0100"), "{e}");
        let e = param_ratio(&flat, &better, 3e5).unwrap_err();
        assert!(e.contains("the standard loss does not fall"), "{e}");
    }
}
