//! Loss curves as PNG: the training loss (smoothed) as a thin line and the validation loss as a
//! thick line with markers, one colour per run, so runs can be compared at a glance.
//! Text is drawn with the DejaVu Sans font the repository ships (assets/), registered once.

use crate::error::{Error, Result};
use plotters::prelude::*;
use plotters::style::FontStyle;
use std::path::Path;

const FONT: &[u8] = include_bytes!("../../assets/DejaVuSans.ttf");
pub(crate) const FAMILY: &str = "sans-serif";

/// The legend of every line chart: upper right, on a near-white box.
pub(crate) fn draw_legend<'a, DB, CT>(
    chart: &mut ChartContext<'a, DB, CT>,
) -> std::result::Result<(), String>
where
    DB: DrawingBackend + 'a,
    CT: plotters::coord::CoordTranslate,
{
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.9))
        .border_style(RGBColor(180, 180, 180))
        .label_font((FAMILY, 17))
        .draw()
        .map_err(|e| e.to_string())
}

/// Colour-blind-safe colours (Okabe–Ito), one per run.
pub(crate) const COLORS: [RGBColor; 6] = [
    RGBColor(0, 114, 178),
    RGBColor(213, 94, 0),
    RGBColor(0, 158, 115),
    RGBColor(204, 121, 167),
    RGBColor(230, 159, 0),
    RGBColor(86, 180, 233),
];

pub(crate) fn register() -> Result<()> {
    static ONCE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let ok = *ONCE
        .get_or_init(|| plotters::style::register_font(FAMILY, FontStyle::Normal, FONT).is_ok());
    if ok {
        Ok(())
    } else {
        Err(Error::Invalid("cannot load the built-in plot font".into()))
    }
}

/// One run's curves: a label, its training loss at every step and its validation loss where
/// measured, as (step, loss) points in step order.
pub struct Series {
    pub label: String,
    pub train: Vec<(f64, f64)>,
    pub val: Vec<(f64, f64)>,
}

/// Bias-corrected exponential moving average of the training loss, (step, value) points.
fn smoothed(train: &[(f64, f64)]) -> Vec<(f64, f64)> {
    let beta = if train.len() > 200 { 0.95 } else { 0.8 };
    let (mut avg, mut w) = (0f64, 0f64);
    train
        .iter()
        .map(|&(step, loss)| {
            avg = beta * avg + (1.0 - beta) * loss;
            w = beta * w + (1.0 - beta);
            (step, avg / w)
        })
        .collect()
}

/// Draws every series into one PNG at `out`.
pub fn plot_runs(series: &[Series], title: &str, out: &Path) -> Result<()> {
    register()?;
    let err = |e: String| Error::Data {
        path: out.to_path_buf(),
        msg: format!("cannot draw the plot ({e})"),
    };
    let trains: Vec<Vec<(f64, f64)>> = series.iter().map(|s| smoothed(&s.train)).collect();
    let vals: Vec<Vec<(f64, f64)>> = series.iter().map(|s| s.val.clone()).collect();
    let xmax = series
        .iter()
        .flat_map(|s| s.train.last().into_iter().chain(s.val.last()))
        .map(|p| p.0)
        .fold(1.0, f64::max);
    // The y range leaves out the first few percent of training, where the loss falls from
    // log(V): otherwise the part worth comparing is a flat line at the bottom.
    let settled = |p: &&(f64, f64)| p.0 >= 0.03 * xmax;
    let ys: Vec<f64> = trains
        .iter()
        .chain(&vals)
        .flat_map(|v| v.iter().filter(settled).map(|p| p.1))
        .filter(|y| y.is_finite())
        .collect();
    if ys.is_empty() {
        return Err(err("no finite losses to plot".into()));
    }
    let (lo, hi) = ys
        .iter()
        .fold((f64::MAX, f64::MIN), |(a, b), &y| (a.min(y), b.max(y)));
    let pad = ((hi - lo) * 0.08).max(0.02);
    let (ymin, ymax) = ((lo - pad).max(0.0), hi + pad);

    let root = BitMapBackend::new(out, (1100, 680)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(e.to_string()))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, (FAMILY, 26))
        .margin(18)
        .x_label_area_size(50)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..xmax, ymin..ymax)
        .map_err(|e| err(e.to_string()))?;
    chart
        .configure_mesh()
        .x_desc("step")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| format!("{y:.2}"))
        .y_desc("loss (nats per token)")
        .label_style((FAMILY, 17))
        .axis_desc_style((FAMILY, 19))
        .light_line_style(RGBColor(235, 235, 235))
        .draw()
        .map_err(|e| err(e.to_string()))?;
    for (i, s) in series.iter().enumerate() {
        let c = COLORS[i % COLORS.len()];
        chart
            .draw_series(LineSeries::new(
                trains[i].iter().copied(),
                c.mix(0.45).stroke_width(2),
            ))
            .map_err(|e| err(e.to_string()))?
            .label(format!("{} train (smoothed)", s.label))
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 24, y)], c.mix(0.45).stroke_width(2))
            });
        if !vals[i].is_empty() {
            chart
                .draw_series(LineSeries::new(vals[i].iter().copied(), c.stroke_width(3)))
                .map_err(|e| err(e.to_string()))?
                .label(format!(
                    "{} validation{}",
                    s.label,
                    vals[i]
                        .last()
                        .map_or(String::new(), |v| format!(" (final {:.3})", v.1))
                ))
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 24, y)], c.stroke_width(3))
                });
            chart
                .draw_series(vals[i].iter().map(|&p| Circle::new(p, 4, c.filled())))
                .map_err(|e| err(e.to_string()))?;
        }
    }
    draw_legend(&mut chart).map_err(err)?;
    root.present().map_err(|e| err(e.to_string()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plot_writes_a_png_with_drawn_text_and_curves() {
        let train: Vec<(f64, f64)> = (1..=50).map(|s| (s as f64, 5.0 / s as f64 + 1.0)).collect();
        let val: Vec<(f64, f64)> = (1..=5)
            .map(|i| (10.0 * i as f64, 0.5 / i as f64 + 1.1))
            .collect();
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.png");
        let series = [
            Series {
                label: "a".into(),
                train: train.clone(),
                val: val.clone(),
            },
            Series {
                label: "b".into(),
                train: train[..30].to_vec(),
                val: val[..3].to_vec(),
            },
        ];
        plot_runs(&series, "test", &p).unwrap();
        let bytes = std::fs::read(&p).unwrap();
        assert_eq!(&bytes[1..4], b"PNG");
        // a blank white 1100×680 image compresses to a few KB; curves and text make it larger
        assert!(bytes.len() > 15_000, "{} bytes", bytes.len());
    }
}
