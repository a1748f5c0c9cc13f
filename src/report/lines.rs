//! Measurements against a variable as PNG: one line per series, markers at the points, and
//! error bars (± one standard deviation over seeds) where the series has them. The repro
//! report draws accuracy against shots or needles and loss against parameters with it.

use super::plot::{register, COLORS, FAMILY};
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

/// Draws the lines into one PNG at `out`.
pub fn plot_lines(lines: &[Line], axes: &Axes, out: &Path) -> Result<()> {
    register()?;
    let err = |e: String| Error::Data {
        path: out.to_path_buf(),
        msg: format!("cannot draw the plot ({e})"),
    };
    let pts = || lines.iter().flat_map(|l| l.points.iter());
    if pts().all(|p| !(p.x.is_finite() && p.y.is_finite())) {
        return Err(err("no finite points to plot".into()));
    }
    let fold = |f: &dyn Fn(&Point) -> (f64, f64)| {
        pts()
            .filter(|p| p.x.is_finite() && p.y.is_finite())
            .map(f)
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
    let root = BitMapBackend::new(out, (1000, 640)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(e.to_string()))?;
    let mut builder = ChartBuilder::on(&root);
    builder
        .caption(axes.title, (FAMILY, 24))
        .margin(18)
        .x_label_area_size(50)
        .y_label_area_size(70);
    // Both axis types draw the same way; only the coordinate system differs.
    macro_rules! draw {
        ($chart:expr) => {{
            let mut chart = $chart.map_err(|e| err(e.to_string()))?;
            chart
                .configure_mesh()
                .x_desc(axes.x_label)
                .y_desc(axes.y_label)
                .x_label_formatter(&|x| short(*x))
                .y_label_formatter(&|y| format!("{y:.2}"))
                .label_style((FAMILY, 17))
                .axis_desc_style((FAMILY, 19))
                .light_line_style(RGBColor(235, 235, 235))
                .draw()
                .map_err(|e| err(e.to_string()))?;
            for (i, l) in lines.iter().enumerate() {
                let c = COLORS[i % COLORS.len()];
                let xy: Vec<(f64, f64)> = l.points.iter().map(|p| (p.x, p.y)).collect();
                chart
                    .draw_series(LineSeries::new(xy.iter().copied(), c.stroke_width(3)))
                    .map_err(|e| err(e.to_string()))?
                    .label(l.label.clone())
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 24, y)], c.stroke_width(3))
                    });
                chart
                    .draw_series(xy.iter().map(|&p| Circle::new(p, 5, c.filled())))
                    .map_err(|e| err(e.to_string()))?;
                // error bars as plain vertical segments (plotters' ErrorBar needs a feature)
                chart
                    .draw_series(l.points.iter().filter_map(|p| {
                        p.sd.map(|s| {
                            PathElement::new(
                                vec![(p.x, p.y - s), (p.x, p.y + s)],
                                c.stroke_width(2),
                            )
                        })
                    }))
                    .map_err(|e| err(e.to_string()))?;
            }
            super::plot::draw_legend(&mut chart).map_err(err)?;
        }};
    }
    let pad = (x1 - x0).max(1e-9) * 0.04;
    if axes.log_x {
        draw!(builder.build_cartesian_2d((x0 / 1.15..x1 * 1.15).log_scale(), ymin..ymax));
    } else {
        draw!(builder.build_cartesian_2d(x0 - pad..x1 + pad, ymin..ymax));
    }
    root.present().map_err(|e| err(e.to_string()))?;
    Ok(())
}

/// Axis numbers: 3,000,000 → "3M", 150,000 → "150k", 16 → "16", 0.5 → "0.5".
fn short(x: f64) -> String {
    let a = x.abs();
    if a >= 1e6 {
        format!("{}M", trim(x / 1e6))
    } else if a >= 1e4 {
        format!("{}k", trim(x / 1e3))
    } else {
        trim(x)
    }
}

fn trim(x: f64) -> String {
    let s = format!("{x:.2}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axis_numbers_are_short() {
        assert_eq!(short(3_000_000.0), "3M");
        assert_eq!(short(150_000.0), "150k");
        assert_eq!(short(16.0), "16");
        assert_eq!(short(0.5), "0.5");
    }

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
