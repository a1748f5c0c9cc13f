//! Loss curves as PNG: the training loss (smoothed) as a thin line and the validation loss as a
//! thick line with markers, one colour per run, so runs can be compared at a glance.
//! Text is drawn with the DejaVu Sans font the repository ships (assets/), registered once.

use super::axis::{tick_label, Axis};
use crate::error::{Error, Result};
use plotters::coord::ranged1d::Ranged;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use plotters::style::FontStyle;
use std::path::Path;

const FONT: &[u8] = include_bytes!("../../assets/DejaVuSans.ttf");
pub(crate) const FAMILY: &str = "sans-serif";

/// How line `i` of `n` is drawn, so lines that coincide stay visible: the first is solid and
/// widest with the largest marker, each later one narrower, dashed, with a smaller marker of
/// another shape, so a line drawn over an earlier one leaves the earlier one's edges and gaps
/// showing.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Look {
    pub color: RGBColor,
    pub width: u32,
    /// dash length and gap in pixels; None is a solid line
    pub dash: Option<(u32, u32)>,
    /// 0 circle, 1 triangle, 2 square, 3 cross
    pub marker: usize,
    pub marker_size: u32,
}

pub(crate) fn look(i: usize, n: usize) -> Look {
    let rank = (n.max(1) - 1).saturating_sub(i) as u32; // 0 for the last line drawn
    Look {
        color: COLORS[i % COLORS.len()],
        width: 2 + rank.min(3),
        dash: [
            None,
            Some((14, 6)),
            Some((6, 5)),
            Some((18, 5)),
            Some((3, 4)),
        ][i % 5],
        marker: i % 4,
        marker_size: 4 + rank.min(4),
    }
}

/// Draws one line in `look`, with its markers at the points unless `markers` is false.
pub(crate) fn draw_looked<'a, DB, X, Y>(
    chart: &mut ChartContext<'a, DB, Cartesian2d<X, Y>>,
    xy: &[(f64, f64)],
    look: &Look,
    markers: bool,
) -> std::result::Result<(), String>
where
    DB: DrawingBackend + 'a,
    X: Ranged<ValueType = f64>,
    Y: Ranged<ValueType = f64>,
{
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    let style = look.color.stroke_width(look.width);
    match look.dash {
        None => chart
            .draw_series(LineSeries::new(xy.iter().copied(), style))
            .map_err(e)?,
        Some((dash, gap)) => chart
            .draw_series(DashedLineSeries::new(xy.iter().copied(), dash, gap, style))
            .map_err(e)?,
    };
    if !markers {
        return Ok(());
    }
    let (c, s) = (look.color.filled(), look.marker_size as i32);
    match look.marker {
        0 => chart.draw_series(xy.iter().map(|&p| Circle::new(p, s, c))),
        1 => chart.draw_series(xy.iter().map(|&p| TriangleMarker::new(p, s + 1, c))),
        2 => {
            chart.draw_series(xy.iter().map(|&p| {
                EmptyElement::at(p) + Rectangle::new([(-s + 1, -s + 1), (s - 1, s - 1)], c)
            }))
        }
        _ => chart.draw_series(
            xy.iter()
                .map(|&p| Cross::new(p, s, look.color.stroke_width(2))),
        ),
    }
    .map_err(e)?;
    Ok(())
}

/// Legend rows for the strip under a chart: as many columns as the longest label allows.
pub(crate) fn legend_height(labels: &[String], width: u32) -> u32 {
    let (_, rows) = legend_grid(labels, width);
    20 + 26 * rows as u32
}

fn legend_grid(labels: &[String], width: u32) -> (usize, usize) {
    // DejaVu Sans at 16 px averages about 8.5 px a character; 60 px for the sample and gap
    let longest = labels.iter().map(|l| l.chars().count()).max().unwrap_or(0);
    let col = (longest as f64 * 8.5 + 70.0) as u32;
    let cols = ((width.saturating_sub(40)) / col.max(1)).clamp(1, 4) as usize;
    (cols, labels.len().div_ceil(cols))
}

/// The legend in its own strip under the chart, off the data: one sample line (with its
/// marker) and label per entry, in columns.
pub(crate) fn draw_legend_below<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    entries: &[(String, Look, bool)],
) -> std::result::Result<(), String> {
    let labels: Vec<String> = entries.iter().map(|e| e.0.clone()).collect();
    let (w, _) = area.dim_in_pixel();
    let (cols, _) = legend_grid(&labels, w);
    let col_w = (w as i32 - 40) / cols as i32;
    let font = TextStyle::from((FAMILY, 16).into_font());
    for (i, (label, look, markers)) in entries.iter().enumerate() {
        let (x, y) = (30 + (i % cols) as i32 * col_w, 14 + (i / cols) as i32 * 26);
        let style = look.color.stroke_width(look.width);
        let segs: Vec<(i32, i32)> = match look.dash {
            None => vec![(0, 40)],
            Some((d, g)) => (0..40)
                .step_by((d + g) as usize)
                .map(|a| (a, (a + d as i32).min(40)))
                .collect(),
        };
        for (a, b) in segs {
            area.draw(&PathElement::new(vec![(x + a, y), (x + b, y)], style))
                .map_err(|e| e.to_string())?;
        }
        if *markers {
            let (c, s, p) = (look.color.filled(), look.marker_size as i32, (x + 20, y));
            match look.marker {
                0 => area.draw(&Circle::new(p, s, c)),
                1 => area.draw(&TriangleMarker::new(p, s + 1, c)),
                2 => area.draw(&Rectangle::new(
                    [(p.0 - s + 1, p.1 - s + 1), (p.0 + s - 1, p.1 + s - 1)],
                    c,
                )),
                _ => area.draw(&Cross::new(p, s, look.color.stroke_width(2))),
            }
            .map_err(|e| e.to_string())?;
        }
        area.draw(&Text::new(
            label.clone(),
            (x + 50, y),
            font.pos(Pos::new(HPos::Left, VPos::Center)),
        ))
        .map_err(|e| e.to_string())?;
    }
    Ok(())
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

impl Series {
    /// The same curves with x and y multiplied by the factors (steps to tokens seen, nats to
    /// bits).
    pub fn scaled(self, x: f64, y: f64) -> Series {
        let f = |v: Vec<(f64, f64)>| v.into_iter().map(|(a, b)| (a * x, b * y)).collect();
        Series {
            label: self.label,
            train: f(self.train),
            val: f(self.val),
        }
    }
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

/// The axes of a loss plot: what x and y measure, and optionally a second x axis along the
/// top, as its label and its value per unit of the bottom one (tokens seen per step).
#[derive(Clone, Debug, PartialEq)]
pub struct LossAxes<'a> {
    pub title: &'a str,
    pub x_label: &'a str,
    pub y_label: &'a str,
    pub top: Option<(&'a str, f64)>,
}

impl<'a> LossAxes<'a> {
    /// Steps along x, nats per token up y.
    pub fn steps(title: &'a str) -> LossAxes<'a> {
        LossAxes {
            title,
            x_label: "step",
            y_label: "loss (nats per token)",
            top: None,
        }
    }
}

/// `c` blended halfway to white: the smoothed training curve under the validation line.
fn pale(c: RGBColor) -> RGBColor {
    let m = |v: u8| ((v as u16 + 255) / 2) as u8;
    RGBColor(m(c.0), m(c.1), m(c.2))
}

/// Draws every series into one PNG at `out`, the legend in a strip under the chart.
pub fn plot_runs(series: &[Series], axes: &LossAxes, out: &Path) -> Result<()> {
    register()?;
    let err = |e: String| Error::Data {
        path: out.to_path_buf(),
        msg: format!("cannot draw the plot ({e})"),
    };
    // 1. The curves and the ranges they span.
    let trains: Vec<Vec<(f64, f64)>> = series.iter().map(|s| smoothed(&s.train)).collect();
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
        .chain(series.iter().map(|s| &s.val))
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

    // 2. The legend entries: per run, the smoothed training curve and the validation line.
    let n = series.len();
    let mut entries = Vec::new();
    for (i, s) in series.iter().enumerate() {
        let l = look(i, n);
        let train = Look {
            color: pale(l.color),
            dash: None,
            ..l
        };
        entries.push((format!("{} train (smoothed)", s.label), train, false));
        if let Some(v) = s.val.last() {
            entries.push((
                format!("{} validation (final {:.3})", s.label, v.1),
                l,
                true,
            ));
        }
    }

    // 3. Chart above, legend strip below.
    let width = 1100;
    let labels: Vec<String> = entries.iter().map(|e| e.0.clone()).collect();
    let strip = legend_height(&labels, width);
    let root = BitMapBackend::new(out, (width, 640 + strip)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(e.to_string()))?;
    let (upper, lower) = root.split_vertically(640);
    let x_axis = Axis::new(0.0, xmax, false, &[]);
    let y_axis = Axis::new(ymin, ymax, false, &[]);
    // plotters repeats the primary labels on a top label area, so the top axis is drawn by
    // hand into a wider top margin
    let upper = upper
        .titled(axes.title, (FAMILY, 26))
        .map_err(|e| err(e.to_string()))?;
    let mut chart = ChartBuilder::on(&upper)
        .margin(18)
        .margin_top(if axes.top.is_some() { 64 } else { 12 })
        .x_label_area_size(50)
        .y_label_area_size(70)
        .build_cartesian_2d(x_axis, y_axis)
        .map_err(|e| err(e.to_string()))?;
    draw_grid(&mut chart, axes.x_label, axes.y_label).map_err(err)?;
    if let Some((label, per)) = axes.top {
        draw_top_axis(&root, &chart, label, xmax, per, ymax).map_err(err)?;
    }
    draw_curves(&mut chart, &trains, series, &entries, ymax).map_err(err)?;
    draw_legend_below(&lower, &entries).map_err(err)?;
    root.present().map_err(|e| err(e.to_string()))?;
    Ok(())
}

/// A second x axis along the top of the chart: ticks at round values of x × `per` (tokens
/// seen), each above the step it falls on.
fn draw_top_axis<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    chart: &ChartContext<DB, Cartesian2d<Axis, Axis>>,
    label: &str,
    xmax: f64,
    per: f64,
    ymax: f64,
) -> std::result::Result<(), String> {
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    let font = TextStyle::from((FAMILY, 17).into_font());
    let top = chart.backend_coord(&(0.0, ymax)).1;
    let (left, right) = (
        chart.backend_coord(&(0.0, ymax)).0,
        chart.backend_coord(&(xmax, ymax)).0,
    );
    area.draw(&PathElement::new(vec![(left, top), (right, top)], BLACK))
        .map_err(e)?;
    for t in Axis::new(0.0, xmax * per, false, &[]).ticks {
        let x = chart.backend_coord(&(t / per, ymax)).0;
        area.draw(&PathElement::new(vec![(x, top), (x, top - 5)], BLACK))
            .map_err(e)?;
        area.draw(&Text::new(
            tick_label(t),
            (x, top - 8),
            font.pos(Pos::new(HPos::Center, VPos::Bottom)),
        ))
        .map_err(e)?;
    }
    area.draw(&Text::new(
        label.to_string(),
        ((left + right) / 2, top - 34),
        TextStyle::from((FAMILY, 19).into_font()).pos(Pos::new(HPos::Center, VPos::Bottom)),
    ))
    .map_err(e)?;
    Ok(())
}

/// Every run's smoothed training curve, then its validation line in the look of its entry.
fn draw_curves<'a, DB, X, Y>(
    chart: &mut ChartContext<'a, DB, Cartesian2d<X, Y>>,
    trains: &[Vec<(f64, f64)>],
    series: &[Series],
    entries: &[(String, Look, bool)],
    top: f64,
) -> std::result::Result<(), String>
where
    DB: DrawingBackend + 'a,
    X: Ranged<ValueType = f64>,
    Y: Ranged<ValueType = f64>,
{
    let mut e = entries.iter();
    for (i, s) in series.iter().enumerate() {
        if let Some((_, l, _)) = e.next() {
            for part in below(&trains[i], top) {
                draw_looked(chart, &part, l, false)?;
            }
        }
        if !s.val.is_empty() {
            if let Some((_, l, _)) = e.next() {
                for part in below(&s.val, top) {
                    draw_looked(chart, &part, l, true)?;
                }
            }
        }
    }
    Ok(())
}

/// The parts of a line at or below `top`, the chart's upper edge: a part that comes down from
/// above starts on the edge where the line crosses it, and one that rises above ends there, so
/// that the loss of the first steps (left above the range) does not run flat along the edge.
fn below(xy: &[(f64, f64)], top: f64) -> Vec<Vec<(f64, f64)>> {
    let edge = |a: (f64, f64), b: (f64, f64)| {
        let t = (top - a.1) / (b.1 - a.1);
        (a.0 + t * (b.0 - a.0), top)
    };
    let (mut parts, mut part) = (Vec::new(), Vec::new());
    let mut prev: Option<(f64, f64)> = None;
    for &p in xy {
        let inside = p.1 <= top;
        match prev {
            Some(q) if (q.1 <= top) != inside && q.1.is_finite() && p.1.is_finite() => {
                part.push(edge(q, p));
                if inside {
                    part.push(p);
                } else {
                    parts.push(std::mem::take(&mut part));
                }
            }
            _ if inside => part.push(p),
            _ => {}
        }
        prev = Some(p);
    }
    if !part.is_empty() {
        parts.push(part);
    }
    parts
}

/// The grid, ticks and axis names of a chart on `Axis` coordinates, in the house style (the
/// loss curves and the experiments' line charts share it).
pub(crate) fn draw_grid<DB: DrawingBackend>(
    chart: &mut ChartContext<DB, Cartesian2d<Axis, Axis>>,
    x_label: &str,
    y_label: &str,
) -> std::result::Result<(), String> {
    chart
        .configure_mesh()
        .x_desc(x_label)
        .y_desc(y_label)
        .x_label_formatter(&|x| tick_label(*x))
        .y_label_formatter(&|y| tick_label(*y))
        .label_style((FAMILY, 17))
        .axis_desc_style((FAMILY, 19))
        .bold_line_style(RGBColor(225, 225, 225))
        .draw()
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_above_the_top_enters_and_leaves_on_the_edge() {
        // falls from 5 to 1 through the top at 3 (crossing at x = 1.5), spikes to 4 between
        // x = 3 and 5 (crossings at 3.5 and 4.5), ends below
        let xy = [
            (0.0, 5.0),
            (1.0, 4.0),
            (2.0, 2.0),
            (3.0, 2.0),
            (4.0, 4.0),
            (5.0, 2.0),
            (6.0, 1.0),
        ];
        let parts = below(&xy, 3.0);
        assert_eq!(
            parts,
            vec![
                vec![(1.5, 3.0), (2.0, 2.0), (3.0, 2.0), (3.5, 3.0)],
                vec![(4.5, 3.0), (5.0, 2.0), (6.0, 1.0)],
            ]
        );
        assert_eq!(
            below(&[(0.0, 1.0), (1.0, 2.0)], 3.0),
            vec![vec![(0.0, 1.0), (1.0, 2.0)]]
        );
        assert!(below(&[(0.0, 4.0), (1.0, 5.0)], 3.0).is_empty());
    }

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
        plot_runs(&series, &LossAxes::steps("test"), &p).unwrap();
        let bytes = std::fs::read(&p).unwrap();
        assert_eq!(&bytes[1..4], b"PNG");
        // a blank white 1100×680 image compresses to a few KB; curves and text make it larger
        assert!(bytes.len() > 15_000, "{} bytes", bytes.len());
    }
}
