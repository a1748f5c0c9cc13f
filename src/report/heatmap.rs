//! Side-by-side heatmaps (one panel per model kind) of values in [0, 1], such as retrieval
//! accuracy per (depth, context length), each cell labelled with its value.

use super::plot::{register, FAMILY};
use crate::error::{Error, Result};
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use plotters::style::FontTransform;
use std::path::Path;

/// One panel: a title and `values[row][col]` in [0, 1].
pub struct Panel {
    pub title: String,
    pub values: Vec<Vec<f64>>,
}

/// White (0) to dark blue (1).
fn shade(v: f64) -> RGBColor {
    let v = v.clamp(0.0, 1.0);
    let mix = |a: f64, b: f64| (a + (b - a) * v).round() as u8;
    RGBColor(mix(255.0, 8.0), mix(255.0, 69.0), mix(255.0, 148.0))
}

/// Draws the panels left to right into one PNG; `rows` and `cols` label the cells (row 0 at
/// the top), `row_desc` and `col_desc` the axes.
pub fn plot_heatmaps(
    panels: &[Panel],
    rows: &[String],
    cols: &[String],
    row_desc: &str,
    col_desc: &str,
    title: &str,
    out: &Path,
) -> Result<()> {
    register()?;
    let err = |e: String| Error::Data {
        path: out.to_path_buf(),
        msg: format!("cannot draw the heatmap ({e})"),
    };
    if panels.is_empty() || rows.is_empty() || cols.is_empty() {
        return Err(err("nothing to draw".into()));
    }
    let (pw, ph) = (360i32, 420i32);
    let (left, top, bottom, right) = (92i32, 56i32, 64i32, 16i32);
    let width = (pw * panels.len() as i32) as u32;
    let root = BitMapBackend::new(out, (width, (ph + 40) as u32)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(e.to_string()))?;
    let root = root
        .titled(title, (FAMILY, 24))
        .map_err(|e| err(e.to_string()))?;
    let label = TextStyle::from((FAMILY, 15).into_font()).pos(Pos::new(HPos::Center, VPos::Center));
    let right_label =
        TextStyle::from((FAMILY, 15).into_font()).pos(Pos::new(HPos::Right, VPos::Center));
    for (pi, panel) in panels.iter().enumerate() {
        let x0 = pi as i32 * pw + left;
        let (gw, gh) = (pw - left - right, ph - top - bottom);
        let (cw, rh) = (gw / cols.len() as i32, gh / rows.len() as i32);
        root.draw(&Text::new(
            panel.title.clone(),
            (x0 + gw / 2, top / 2),
            TextStyle::from((FAMILY, 19).into_font()).pos(Pos::new(HPos::Center, VPos::Center)),
        ))
        .map_err(|e| err(e.to_string()))?;
        for (r, row) in panel.values.iter().enumerate() {
            for (c, &v) in row.iter().enumerate() {
                let (cx, cy) = (x0 + c as i32 * cw, top + r as i32 * rh);
                root.draw(&Rectangle::new(
                    [(cx, cy), (cx + cw, cy + rh)],
                    shade(v).filled(),
                ))
                .map_err(|e| err(e.to_string()))?;
                root.draw(&Rectangle::new(
                    [(cx, cy), (cx + cw, cy + rh)],
                    RGBColor(200, 200, 200).stroke_width(1),
                ))
                .map_err(|e| err(e.to_string()))?;
                let ink: &'static RGBColor = if v > 0.55 { &WHITE } else { &BLACK };
                root.draw(&Text::new(
                    format!("{v:.2}"),
                    (cx + cw / 2, cy + rh / 2),
                    label.color(ink),
                ))
                .map_err(|e| err(e.to_string()))?;
            }
        }
        for (r, name) in rows.iter().enumerate() {
            root.draw(&Text::new(
                name.clone(),
                (x0 - 8, top + r as i32 * rh + rh / 2),
                right_label.clone(),
            ))
            .map_err(|e| err(e.to_string()))?;
        }
        for (c, name) in cols.iter().enumerate() {
            root.draw(&Text::new(
                name.clone(),
                (x0 + c as i32 * cw + cw / 2, top + gh + 14),
                label.clone(),
            ))
            .map_err(|e| err(e.to_string()))?;
        }
        root.draw(&Text::new(
            col_desc.to_string(),
            (x0 + gw / 2, top + gh + 40),
            label.clone(),
        ))
        .map_err(|e| err(e.to_string()))?;
        root.draw(&Text::new(
            row_desc.to_string(),
            (x0 - left + 4, top - 14),
            TextStyle::from((FAMILY, 15).into_font()).pos(Pos::new(HPos::Left, VPos::Center)),
        ))
        .map_err(|e| err(e.to_string()))?;
    }
    root.present().map_err(|e| err(e.to_string()))?;
    Ok(())
}

/// Pale red (0) to dark red (1), for negative values.
fn shade_negative(v: f64) -> RGBColor {
    let v = v.clamp(0.0, 1.0);
    let mix = |a: f64, b: f64| (a + (b - a) * v).round() as u8;
    RGBColor(mix(255.0, 165.0), mix(255.0, 15.0), mix(255.0, 21.0))
}

/// One attention map: T×T values, row i = query i; `signed` maps colour negatives red.
pub struct MapPanel {
    pub title: String,
    pub t: usize,
    pub values: Vec<f64>,
    pub signed: bool,
}

/// How the maps are laid out: title lines above everything, the prompt's tokens (one label
/// per position, see [`token_label`]), panels per row and each map's side in pixels.
pub struct MapLayout<'a> {
    pub title: &'a [String],
    pub tokens: &'a [String],
    pub cols: usize,
    pub side: i32,
}

/// A token as an axis label: spaces as ␣, newlines as ↵, tabs as →, other control bytes as
/// \xNN, at most 10 characters (longer ones end in …).
pub fn token_label(tok: &str) -> String {
    let mut s = String::new();
    for c in tok.chars() {
        match c {
            ' ' => s.push('␣'),
            '\n' => s.push('↵'),
            '\t' => s.push('→'),
            c if c.is_control() => s.push_str(&format!("\\x{:02x}", c as u32)),
            c => s.push(c),
        }
    }
    if s.chars().count() > 10 {
        s = s.chars().take(9).collect::<String>() + "…";
    }
    s
}

/// Label every `stride`-th position so that neighbouring labels are at least `min_px` apart
/// on a map of `side` pixels and `t` positions.
pub fn label_stride(t: usize, side: i32, min_px: i32) -> usize {
    let cell = side as f64 / t.max(1) as f64;
    ((min_px as f64 / cell).ceil() as usize).max(1)
}

/// The colour of a value scaled to [-1, 1]: blue for positive, red for negative (signed maps).
fn map_color(v: f64, signed: bool) -> RGBColor {
    if v < 0.0 && signed {
        shade_negative(-v)
    } else {
        shade(v)
    }
}

// Pixels around each map: token labels left and below, the colour bar and its numbers right.
const MAP_LEFT: i32 = 96;
const MAP_TOP: i32 = 34;
const MAP_BOTTOM: i32 = 72;
const MAP_RIGHT: i32 = 96;
const TITLE_LINE: i32 = 28;

/// Draws attention maps in a grid, each scaled to its own largest |value|, with the prompt's
/// tokens along both axes (rows: queries, columns: keys) and a colour bar giving the scale.
pub fn plot_attention_maps(panels: &[MapPanel], layout: &MapLayout, out: &Path) -> Result<()> {
    register()?;
    let err = |e: String| Error::Data {
        path: out.to_path_buf(),
        msg: format!("cannot draw the attention map ({e})"),
    };
    let t = panels.first().map_or(0, |p| p.t);
    if t == 0 || panels.iter().any(|p| p.t != t || p.values.len() != t * t) {
        return Err(err("no T×T map to draw".into()));
    }
    // 1. The canvas: title lines, then rows of panels.
    let side = layout.side;
    let (pw, ph) = (MAP_LEFT + side + MAP_RIGHT, MAP_TOP + side + MAP_BOTTOM);
    let cols = layout.cols.clamp(1, panels.len());
    let rows = panels.len().div_ceil(cols) as i32;
    let head = 12 + TITLE_LINE * layout.title.len() as i32;
    let width = pw * cols as i32;
    let root =
        BitMapBackend::new(out, (width as u32, (head + rows * ph) as u32)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(e.to_string()))?;
    // 2. The title, each line shrunk until it fits the width, so nothing is cut.
    for (i, line) in layout.title.iter().enumerate() {
        let mut size = 22.0;
        while size > 9.0 {
            let (w, _) = root
                .estimate_text_size(line, &TextStyle::from((FAMILY, size).into_font()))
                .map_err(|e| err(e.to_string()))?;
            if (w as i32) < width - 16 {
                break;
            }
            size -= 1.0;
        }
        root.draw(&Text::new(
            line.clone(),
            (width / 2, 8 + TITLE_LINE * i as i32 + TITLE_LINE / 2),
            TextStyle::from((FAMILY, size).into_font()).pos(Pos::new(HPos::Center, VPos::Center)),
        ))
        .map_err(|e| err(e.to_string()))?;
    }
    // 3. Each panel at its place in the grid.
    for (pi, p) in panels.iter().enumerate() {
        let x0 = (pi % cols) as i32 * pw + MAP_LEFT;
        let y0 = head + (pi / cols) as i32 * ph + MAP_TOP;
        draw_map(&root, p, layout.tokens, (x0, y0), side).map_err(err)?;
    }
    root.present().map_err(|e| err(e.to_string()))?;
    Ok(())
}

/// One map with its top-left corner at `at`: the cells, the panel title, the token labels and
/// the colour bar.
fn draw_map<DB: DrawingBackend>(
    root: &DrawingArea<DB, plotters::coord::Shift>,
    p: &MapPanel,
    tokens: &[String],
    (x0, y0): (i32, i32),
    side: i32,
) -> std::result::Result<(), String> {
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    let t = p.t;
    let scale = p.values.iter().fold(0f64, |m, &v| m.max(v.abs()));
    let scale = if scale > 0.0 { scale } else { 1.0 };
    let edge = |i: usize| (i as f64 * side as f64 / t as f64).round() as i32;
    // 1. The cells of the lower triangle (query i sees keys 0..=i).
    for i in 0..t {
        for c in 0..=i {
            let color = map_color(p.values[i * t + c] / scale, p.signed);
            root.draw(&Rectangle::new(
                [
                    (x0 + edge(c), y0 + edge(i)),
                    (x0 + edge(c + 1), y0 + edge(i + 1)),
                ],
                color.filled(),
            ))
            .map_err(e)?;
        }
    }
    root.draw(&Rectangle::new(
        [(x0, y0), (x0 + side, y0 + side)],
        RGBColor(150, 150, 150).stroke_width(1),
    ))
    .map_err(e)?;
    root.draw(&Text::new(
        p.title.clone(),
        (x0 + side / 2, y0 - 16),
        TextStyle::from((FAMILY, 17).into_font()).pos(Pos::new(HPos::Center, VPos::Center)),
    ))
    .map_err(e)?;
    // 2. Token labels, thinned to one per 13 pixels: queries left, keys below (turned).
    let font = (FAMILY, 12).into_font();
    let stride = label_stride(t, side, 13);
    for (i, tok) in tokens.iter().enumerate().take(t).step_by(stride) {
        let mid = (edge(i) + edge(i + 1)) / 2;
        let label = format!("{} {i}", token_label(tok));
        root.draw(&Text::new(
            label.clone(),
            (x0 - 4, y0 + mid),
            TextStyle::from(font.clone()).pos(Pos::new(HPos::Right, VPos::Center)),
        ))
        .map_err(e)?;
        root.draw(&Text::new(
            format!("{i} {}", token_label(tok)),
            (x0 + mid, y0 + side + 4),
            TextStyle::from(font.transform(FontTransform::Rotate90))
                .pos(Pos::new(HPos::Left, VPos::Center)),
        ))
        .map_err(e)?;
    }
    // 3. The colour bar: +scale at the top, 0 (or −scale, signed) at the bottom.
    let (bx, bw) = (x0 + side + 12, 14);
    let lo = if p.signed { -1.0 } else { 0.0 };
    for y in 0..side {
        let v = 1.0 - (1.0 - lo) * (y as f64 + 0.5) / side as f64;
        root.draw(&Rectangle::new(
            [(bx, y0 + y), (bx + bw, y0 + y + 1)],
            map_color(v, p.signed).filled(),
        ))
        .map_err(e)?;
    }
    root.draw(&Rectangle::new(
        [(bx, y0), (bx + bw, y0 + side)],
        RGBColor(150, 150, 150).stroke_width(1),
    ))
    .map_err(e)?;
    let ticks: &[f64] = if p.signed {
        &[1.0, 0.5, 0.0, -0.5, -1.0]
    } else {
        &[1.0, 0.5, 0.0]
    };
    for &f in ticks {
        let y = y0 + ((1.0 - f) / (1.0 - lo) * side as f64).round() as i32;
        root.draw(&PathElement::new(
            vec![(bx + bw, y), (bx + bw + 4, y)],
            BLACK,
        ))
        .map_err(e)?;
        root.draw(&Text::new(
            format!("{:.3}", f * scale),
            (bx + bw + 6, y),
            TextStyle::from((FAMILY, 12).into_font()).pos(Pos::new(HPos::Left, VPos::Center)),
        ))
        .map_err(e)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heatmap_writes_a_png_with_every_panel() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("h.png");
        let panels: Vec<Panel> = ["standard", "diff_v1", "diff_v2"]
            .iter()
            .enumerate()
            .map(|(i, t)| Panel {
                title: t.to_string(),
                values: (0..5)
                    .map(|r| (0..3).map(|c| ((r + c + i) % 4) as f64 / 3.0).collect())
                    .collect(),
            })
            .collect();
        let rows: Vec<String> = ["0%", "25%", "50%", "75%", "100%"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let cols: Vec<String> = ["128", "256", "512"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        plot_heatmaps(&panels, &rows, &cols, "depth", "context", "t", &p).unwrap();
        let bytes = std::fs::read(&p).unwrap();
        assert_eq!(&bytes[1..4], b"PNG");
        assert!(bytes.len() > 10_000, "{} bytes", bytes.len());
        assert_eq!(shade(0.0), RGBColor(255, 255, 255));
        assert_eq!(shade(1.0), RGBColor(8, 69, 148));
    }

    #[test]
    fn attention_maps_draw_signed_and_unsigned_panels() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.png");
        let t = 12;
        let tri = |f: &dyn Fn(usize, usize) -> f64| -> Vec<f64> {
            (0..t * t)
                .map(|x| if x % t <= x / t { f(x / t, x % t) } else { 0.0 })
                .collect()
        };
        let panels = [
            MapPanel {
                title: "A1".into(),
                t,
                values: tri(&|i, _| 1.0 / (i + 1) as f64),
                signed: false,
            },
            MapPanel {
                title: "A1 − λA2".into(),
                t,
                values: tri(&|i, c| if c == i { 0.8 } else { -0.05 }),
                signed: true,
            },
        ];
        let tokens: Vec<String> = (0..t).map(|i| format!("t{i}")).collect();
        let layout = MapLayout {
            title: &["maps".to_string()],
            tokens: &tokens,
            cols: 2,
            side: 240,
        };
        plot_attention_maps(&panels, &layout, &p).unwrap();
        let bytes = std::fs::read(&p).unwrap();
        assert_eq!(&bytes[1..4], b"PNG");
        assert!(bytes.len() > 5_000, "{} bytes", bytes.len());
        // labels: whitespace made visible, long tokens cut; thinned to fit the side
        assert_eq!(token_label(" the\n"), "␣the↵");
        assert_eq!(token_label("\u{1}"), "\\x01");
        assert_eq!(token_label("abcdefghijkl"), "abcdefghi…");
        assert_eq!(label_stride(31, 420, 13), 1);
        assert_eq!(label_stride(103, 420, 13), 4);
        assert_eq!(label_stride(128, 300, 13), 6);
        let bad = [MapPanel {
            title: "x".into(),
            t: 3,
            values: vec![0.0; 8],
            signed: false,
        }];
        assert!(plot_attention_maps(&bad, &layout, &p).is_err());
    }
}
