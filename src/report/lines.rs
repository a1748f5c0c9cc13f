//! Measurements against a variable as PNG: one line per series, markers at the points, and
//! error bars (± one standard deviation over seeds) where the series has them. The repro
//! report draws accuracy against shots or needles and loss against parameters with it.

use super::axis::Axis;
use super::plot::{
    draw_grid, draw_legend_below, draw_looked, legend_height, look, register, Look, FAMILY,
};
use crate::error::{Error, Result};
use plotters::prelude::*;
use std::path::Path;

/// One point: x, the mean, and the standard deviation over seeds when there are several.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Point {
    pub x: f64,
    pub y: f64,
    pub sd: Option<f64>,
}

/// One line of the plot.
#[derive(Clone, Debug, PartialEq)]
pub struct Line {
    pub label: String,
    pub points: Vec<Point>,
}

/// The axes and title.
#[derive(Clone, Debug, PartialEq)]
pub struct Axes<'a> {
    pub title: &'a str,
    pub x_label: &'a str,
    pub y_label: &'a str,
    /// logarithmic x axis (parameters, shots)
    pub log_x: bool,
    /// a y range to show whatever the data (accuracy: 0..1); None fits the data
    pub y_range: Option<(f64, f64)>,
}

/// Draws the lines into one PNG at `out`: ticks at the measured x values where they are few
/// (see [`choose_ticks`](super::axis::choose_ticks)), the legend in a strip under the chart.
pub fn plot_lines(lines: &[Line], axes: &Axes, out: &Path) -> Result<()> {
    register()?;
    let err = |e: String| Error::Data {
        path: out.to_path_buf(),
        msg: format!("cannot draw the plot ({e})"),
    };
    // 1. The ranges the finite points span.
    let finite: Vec<&Point> = lines
        .iter()
        .flat_map(|l| l.points.iter())
        .filter(|p| p.x.is_finite() && p.y.is_finite())
        .collect();
    if finite.is_empty() {
        return Err(err("no finite points to plot".into()));
    }
    let fold = |f: &dyn Fn(&Point) -> (f64, f64)| {
        finite
            .iter()
            .map(|p| f(p))
            .fold((f64::MAX, f64::MIN), |(a, b), (lo, hi)| {
                (a.min(lo), b.max(hi))
            })
    };
    let (x0, x1) = fold(&|p| (p.x, p.x));
    let (ymin, ymax) = axes.y_range.unwrap_or_else(|| {
        let (lo, hi) = fold(&|p| {
            let s = p.sd.unwrap_or(0.0);
            (p.y - s, p.y + s)
        });
        let pad = ((hi - lo) * 0.08).max(1e-3);
        (lo - pad, hi + pad)
    });
    if axes.log_x && x0 <= 0.0 {
        return Err(err(format!("x = {x0} cannot go on a logarithmic axis")));
    }
    // 2. The axes, x ticks at the measured values where they are few; the legend's entries.
    let xs: Vec<f64> = finite.iter().map(|p| p.x).collect();
    let x_axis = if axes.log_x {
        Axis::new(x0 / 1.15, x1 * 1.15, true, &xs)
    } else {
        let pad = (x1 - x0).max(1e-9) * 0.04;
        Axis::new(x0 - pad, x1 + pad, false, &xs)
    };
    let entries: Vec<(String, Look, bool)> = lines
        .iter()
        .enumerate()
        .map(|(i, l)| (l.label.clone(), look(i, lines.len()), true))
        .collect();
    let width = 1000;
    let labels: Vec<String> = entries.iter().map(|e| e.0.clone()).collect();
    let root =
        BitMapBackend::new(out, (width, 600 + legend_height(&labels, width))).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(e.to_string()))?;
    let (upper, lower) = root.split_vertically(600);
    let mut chart = ChartBuilder::on(&upper)
        .caption(axes.title, (FAMILY, 24))
        .margin(18)
        .x_label_area_size(50)
        .y_label_area_size(70)
        .build_cartesian_2d(x_axis, Axis::new(ymin, ymax, false, &[]))
        .map_err(|e| err(e.to_string()))?;
    draw_grid(&mut chart, axes.x_label, axes.y_label).map_err(err)?;
    // 3. Each line with its markers and error bars (plain vertical segments: plotters'
    // ErrorBar needs a feature), then the legend under the chart.
    for (l, (_, lk, _)) in lines.iter().zip(&entries) {
        let xy: Vec<(f64, f64)> = l.points.iter().map(|p| (p.x, p.y)).collect();
        draw_looked(&mut chart, &xy, lk, true).map_err(err)?;
        chart
            .draw_series(l.points.iter().filter_map(|p| {
                p.sd.map(|s| {
                    PathElement::new(
                        vec![(p.x, p.y - s), (p.x, p.y + s)],
                        lk.color.stroke_width(2),
                    )
                })
            }))
            .map_err(|e| err(e.to_string()))?;
    }
    draw_legend_below(&lower, &entries).map_err(err)?;
    root.present().map_err(|e| err(e.to_string()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_with_error_bars_draw_on_both_axis_kinds() {
        let dir = tempfile::tempdir().unwrap();
        let lines = vec![
            Line {
                label: "standard".into(),
                points: (0..4)
                    .map(|i| Point {
                        x: 2f64.powi(i),
                        y: 0.2 * i as f64,
                        sd: Some(0.05),
                    })
                    .collect(),
            },
            Line {
                label: "diff_v1".into(),
                points: vec![Point {
                    x: 1.0,
                    y: 0.4,
                    sd: None,
                }],
            },
        ];
        for log_x in [false, true] {
            let p = dir.path().join(format!("l{log_x}.png"));
            let axes = Axes {
                title: "accuracy against shots",
                x_label: "shots",
                y_label: "accuracy",
                log_x,
                y_range: Some((0.0, 1.0)),
            };
            plot_lines(&lines, &axes, &p).unwrap();
            let img = std::fs::read(&p).unwrap();
            assert!(
                img.starts_with(b"\x89PNG") && img.len() > 10_000,
                "{}",
                img.len()
            );
        }
        // nothing finite to draw is an error naming the file
        let bad = vec![Line {
            label: "x".into(),
            points: vec![Point {
                x: f64::NAN,
                y: 1.0,
                sd: None,
            }],
        }];
        let axes = Axes {
            title: "t",
            x_label: "x",
            y_label: "y",
            log_x: false,
            y_range: None,
        };
        let p = dir.path().join("bad.png");
        let e = plot_lines(&bad, &axes, &p).unwrap_err().to_string();
        assert!(e.contains("bad.png"), "{e}");
    }
}
