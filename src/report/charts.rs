//! The report's charts: PNGs drawn with plotters in the report's own font, each committed whole
//! (a chart that cannot be written leaves no file). Line charts, the loss curve with its
//! smoothing, histograms and grouped bars with intervals; every axis labels whole numbers
//! without decimals. Knows nothing of stages or runs: `super` and `pipeline compare` pass the
//! numbers.

use std::path::Path;

use anyhow::{anyhow, Result};
use plotters::prelude::*;

use crate::store;

/// The font every chart's text is drawn with (no system fonts needed).
const FONT: &[u8] = include_bytes!("../../assets/DejaVuSans.ttf");

fn register_font() -> Result<()> {
    static ONCE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let ok = ONCE.get_or_init(|| {
        plotters::style::register_font("sans-serif", FontStyle::Normal, FONT).is_ok()
    });
    if *ok {
        Ok(())
    } else {
        Err(anyhow!(
            "the report's font (assets/DejaVuSans.ttf) does not load"
        ))
    }
}

/// Line colours that read on white (Okabe and Ito's palette without its yellow).
const COLOURS: [RGBColor; 7] = [
    RGBColor(0, 114, 178),
    RGBColor(213, 94, 0),
    RGBColor(0, 158, 115),
    RGBColor(204, 121, 167),
    RGBColor(230, 159, 0),
    RGBColor(86, 180, 233),
    RGBColor(0, 0, 0),
];

/// Draws a chart into a temporary file beside `path` (keeping `.png`, which the drawing
/// backend reads) and commits it ([`store::commit_file_via`]): a chart that cannot be written
/// whole (a full disk) is never left half-written under its name.
pub(super) fn commit_png(path: &Path, draw: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
    let stem = path
        .file_stem()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    store::commit_file_via(path, &format!(".{stem}.tmp.png"), draw).map(|_| ())
}

/// An x-axis labeller for categories at x = 0, 1, 2, ...: `labels[i]` at integer `i`, nothing
/// between them.
pub fn category_labels(labels: Vec<String>) -> impl Fn(f64) -> String {
    move |x: f64| {
        let i = x.round();
        if (x - i).abs() > 0.01 || i < 0.0 {
            return String::new();
        }
        labels.get(i as usize).cloned().unwrap_or_default()
    }
}

/// [`draw_line_chart`] committed whole.
pub fn line_chart(
    path: &Path,
    title: &str,
    axes: (&str, &str),
    series: &[(String, Vec<(f64, f64)>)],
    x_label: Option<&dyn Fn(f64) -> String>,
    y_range: Option<(f64, f64)>,
) -> Result<()> {
    commit_png(path, |tmp| {
        draw_line_chart(tmp, title, axes, series, x_label, y_range)
    })
}

/// [`draw_histogram`] committed whole.
pub(super) fn histogram(path: &Path, title: &str, x_desc: &str, values: &[u64]) -> Result<()> {
    commit_png(path, |tmp| draw_histogram(tmp, title, x_desc, values))
}

/// An axis label: a whole number without decimals (`1600`, not `1600.0`), else the fewest
/// decimals (up to 3) that show the tick.
pub fn tick(x: &f64) -> String {
    if (x - x.round()).abs() < 1e-9 {
        return format!("{:.0}", x.round() + 0.0);
    }
    let s = format!("{x:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// One series of a [`bar_chart`]: its name and, per category, a value (NaN: no bar) and an
/// optional interval (low, high) drawn as a whisker.
pub type Bars = (String, Vec<(f64, Option<(f64, f64)>)>);

/// Grouped bars: per category (x labels), one bar per series side by side, so every series
/// shows wherever the others are; intervals as whiskers. Committed whole.
pub fn bar_chart(
    path: &Path,
    title: &str,
    axes: (&str, &str),
    categories: &[String],
    series: &[Bars],
    y_range: Option<(f64, f64)>,
) -> Result<()> {
    commit_png(path, |tmp| {
        draw_bar_chart(tmp, title, axes, categories, series, y_range)
    })
}

fn draw_bar_chart(
    path: &Path,
    title: &str,
    (x_desc, y_desc): (&str, &str),
    categories: &[String],
    series: &[Bars],
    y_range: Option<(f64, f64)>,
) -> Result<()> {
    let top = series
        .iter()
        .flat_map(|s| s.1.iter())
        .map(|&(v, i)| i.map_or(v, |(_, hi)| hi.max(v)))
        .fold(0.0f64, f64::max);
    let (y0, y1) = y_range.unwrap_or((0.0, (top * 1.08).max(1e-9)));
    let n = categories.len().max(1);
    let root = canvas(path)?;
    let legend = series.len() > 1;
    let mut builder = frame(&root, title);
    if legend {
        builder.margin_right(LEGEND_WIDTH + 12);
    }
    let mut chart = builder
        .build_cartesian_2d(-0.5..n as f64 - 0.5, y0..y1)
        .map_err(chart_err)?;
    let labels = category_labels(categories.to_vec());
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n)
        .x_label_formatter(&|x| labels(*x))
        .y_label_formatter(&tick)
        .x_desc(x_desc)
        .y_desc(y_desc)
        .draw()
        .map_err(chart_err)?;
    // the bars of a category fill 80% of its width
    let w = 0.8 / series.len().max(1) as f64;
    for (i, (name, values)) in series.iter().enumerate() {
        let color = COLOURS[i % COLOURS.len()];
        let left = |c: usize| c as f64 - 0.4 + i as f64 * w;
        chart
            .draw_series(
                values
                    .iter()
                    .enumerate()
                    .filter(|(_, v)| v.0.is_finite())
                    .map(|(c, &(v, _))| {
                        Rectangle::new([(left(c), y0), (left(c) + w * 0.9, v)], color.filled())
                    }),
            )
            .map_err(chart_err)?;
        chart
            .draw_series(values.iter().enumerate().filter_map(|(c, &(_, iv))| {
                let (lo, hi) = iv?;
                let x = left(c) + w * 0.45;
                Some(PathElement::new(
                    vec![(x, lo), (x, hi)],
                    BLACK.stroke_width(2),
                ))
            }))
            .map_err(chart_err)?;
        if legend {
            legend_entry(&root, i, name, color, Swatch::Block)?;
        }
    }
    root.present().map_err(chart_err)?;
    Ok(())
}

/// The legend's width, right of the plot (it never covers a line).
const LEGEND_WIDTH: u32 = 150;

/// How a legend entry shows its series: a bar's block, a line's stroke, a dot.
#[derive(Clone, Copy)]
enum Swatch {
    Block,
    Line,
    Dot,
}

/// Entry `i` of a chart's legend, in the right margin outside the plot: the swatch, then the
/// series' name.
fn legend_entry(
    root: &DrawingArea<BitMapBackend<'_>, plotters::coord::Shift>,
    i: usize,
    name: &str,
    color: RGBColor,
    swatch: Swatch,
) -> Result<()> {
    let x = (root.dim_in_pixel().0 - LEGEND_WIDTH) as i32;
    let y = 60 + 24 * i as i32;
    match swatch {
        Swatch::Block => root.draw(&Rectangle::new(
            [(x, y - 6), (x + 22, y + 6)],
            color.filled(),
        )),
        Swatch::Line => root.draw(&PathElement::new(
            vec![(x, y), (x + 22, y)],
            color.stroke_width(3),
        )),
        Swatch::Dot => root.draw(&Circle::new((x + 11, y), 3, color.filled())),
    }
    .map_err(chart_err)?;
    root.draw(&Text::new(
        name.to_string(),
        (x + 28, y - 8),
        ("sans-serif", 15).into_font().color(&BLACK),
    ))
    .map_err(chart_err)
}

fn chart_err<E: std::fmt::Display>(e: E) -> anyhow::Error {
    anyhow!("drawing a chart: {e}")
}

/// An 800 x 450 white PNG canvas at `path`, with the report's font registered.
fn canvas(path: &Path) -> Result<DrawingArea<BitMapBackend<'_>, plotters::coord::Shift>> {
    register_font()?;
    let root = BitMapBackend::new(path, (800, 450)).into_drawing_area();
    root.fill(&WHITE).map_err(chart_err)?;
    Ok(root)
}

/// Every chart's title, margins and axis label areas.
fn frame<'a, 'b>(
    root: &'a DrawingArea<BitMapBackend<'b>, plotters::coord::Shift>,
    title: &str,
) -> ChartBuilder<'a, 'b, BitMapBackend<'b>> {
    let mut b = ChartBuilder::on(root);
    b.caption(title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70);
    b
}

/// Lines over a shared x axis; `x_label` names the ticks of a categorical axis (then padded by
/// half a category each side), `y_range` fixes the y axis (accuracies: 0 to 100).
fn draw_line_chart(
    path: &Path,
    title: &str,
    (x_desc, y_desc): (&str, &str),
    series: &[(String, Vec<(f64, f64)>)],
    x_label: Option<&dyn Fn(f64) -> String>,
    y_range: Option<(f64, f64)>,
) -> Result<()> {
    let pts = series.iter().flat_map(|s| s.1.iter());
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for &(x, y) in pts {
        (x0, x1, y0, y1) = (x0.min(x), x1.max(x), y0.min(y), y1.max(y));
    }
    if x0 > x1 {
        (x0, x1, y0, y1) = (0.0, 1.0, 0.0, 1.0);
    }
    let pad = ((y1 - y0) * 0.05).max(1e-12);
    let (y0, y1) = y_range.unwrap_or((y0 - pad, y1 + pad));
    let (x0, x1) = match x_label {
        Some(_) => (x0 - 0.5, x1 + 0.5),
        None if x1 > x0 => (x0, x1),
        None => (x0, x0 + 1.0),
    };
    let root = canvas(path)?;
    let legend = series.len() > 1;
    let mut builder = frame(&root, title);
    if legend {
        builder.margin_right(LEGEND_WIDTH + 12);
    }
    let mut chart = builder
        .build_cartesian_2d(x0..x1, y0..y1)
        .map_err(chart_err)?;
    let mut mesh = chart.configure_mesh();
    mesh.x_desc(x_desc).y_desc(y_desc);
    let fmt = |x: &f64| x_label.map_or_else(|| tick(x), |f| f(*x));
    if x_label.is_some() {
        mesh.x_labels(series.iter().map(|s| s.1.len()).max().unwrap_or(1));
    }
    mesh.x_label_formatter(&fmt)
        .y_label_formatter(&tick)
        .draw()
        .map_err(chart_err)?;
    for (i, (name, pts)) in series.iter().enumerate() {
        let color = COLOURS[i % COLOURS.len()];
        chart
            .draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))
            .map_err(chart_err)?;
        chart
            .draw_series(pts.iter().map(|&p| Circle::new(p, 3, color.filled())))
            .map_err(chart_err)?;
        if legend {
            legend_entry(&root, i, name, color, Swatch::Line)?;
        }
    }
    root.present().map_err(chart_err)?;
    Ok(())
}

/// The EMA weight for a curve of `n` points: TensorBoard's 0.9 once there are enough points
/// for it to mean something, less for short runs.
pub(super) fn smoothing_weight(n: usize) -> f64 {
    match n {
        0..=9 => 0.5,
        10..=49 => 0.8,
        _ => 0.9,
    }
}

/// The debiased exponential moving average of `pts` (TensorBoard's smoothing): the first point
/// is the first value, not pulled toward zero.
pub(super) fn smooth(pts: &[(f64, f64)], weight: f64) -> Vec<(f64, f64)> {
    let mut avg = 0.0;
    pts.iter()
        .enumerate()
        .map(|(i, &(x, y))| {
            avg = avg * weight + (1.0 - weight) * y;
            (x, avg / (1.0 - weight.powi(i as i32 + 1)))
        })
        .collect()
}

/// The per-step loss as dots and its smoothed curve as a line over them.
pub(super) fn draw_loss_chart(
    path: &Path,
    title: &str,
    raw: &[(f64, f64)],
    smoothed: &[(f64, f64)],
) -> Result<()> {
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for &(x, y) in raw.iter().chain(smoothed).filter(|p| p.1.is_finite()) {
        (x0, x1, y0, y1) = (x0.min(x), x1.max(x), y0.min(y), y1.max(y));
    }
    if x0 > x1 {
        (x0, x1, y0, y1) = (0.0, 1.0, 0.0, 1.0);
    }
    let pad = ((y1 - y0) * 0.05).max(1e-12);
    let x1 = if x1 > x0 { x1 } else { x0 + 1.0 };
    let root = canvas(path)?;
    let mut builder = frame(&root, title);
    builder.margin_right(LEGEND_WIDTH + 12);
    let mut chart = builder
        .build_cartesian_2d(x0..x1, (y0 - pad)..(y1 + pad))
        .map_err(chart_err)?;
    chart
        .configure_mesh()
        .x_label_formatter(&tick)
        .y_label_formatter(&tick)
        .x_desc("step")
        .y_desc("loss")
        .draw()
        .map_err(chart_err)?;
    let light = RGBColor(150, 150, 150);
    chart
        .draw_series(
            raw.iter()
                .filter(|p| p.1.is_finite())
                .map(|&p| Circle::new(p, 2, light.filled())),
        )
        .map_err(chart_err)?;
    chart
        .draw_series(LineSeries::new(
            smoothed.iter().copied(),
            COLOURS[0].stroke_width(2),
        ))
        .map_err(chart_err)?;
    for (i, (label, color, dot)) in [("per step", light, true), ("smoothed", COLOURS[0], false)]
        .into_iter()
        .enumerate()
    {
        let swatch = if dot { Swatch::Dot } else { Swatch::Line };
        legend_entry(&root, i, label, color, swatch)?;
    }
    root.present().map_err(chart_err)?;
    Ok(())
}

/// A histogram of `values` (sorted) in up to 40 equal bins.
fn draw_histogram(path: &Path, title: &str, x_desc: &str, values: &[u64]) -> Result<()> {
    let (lo, hi) = (values[0] as f64, *values.last().expect("non-empty") as f64);
    let bins = 40usize;
    let width = ((hi - lo) / bins as f64).max(1.0);
    let mut counts = vec![0u64; bins];
    for &v in values {
        let b = (((v as f64 - lo) / width) as usize).min(bins - 1);
        counts[b] += 1;
    }
    let top = *counts.iter().max().unwrap_or(&1) as f64;
    let root = canvas(path)?;
    let mut chart = frame(&root, title)
        .build_cartesian_2d(lo..lo + width * bins as f64, 0.0..top * 1.05)
        .map_err(chart_err)?;
    chart
        .configure_mesh()
        .x_label_formatter(&tick)
        .y_label_formatter(&tick)
        .x_desc(x_desc)
        .y_desc("samples")
        .draw()
        .map_err(chart_err)?;
    chart
        .draw_series(counts.iter().enumerate().map(|(i, &c)| {
            let x = lo + i as f64 * width;
            Rectangle::new([(x, 0.0), (x + width, c as f64)], COLOURS[0].filled())
        }))
        .map_err(chart_err)?;
    root.present().map_err(chart_err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_whole_numbers_without_decimals() {
        assert_eq!(tick(&1600.0), "1600");
        assert_eq!(tick(&-0.0), "0");
        assert_eq!(tick(&2.5), "2.5");
        assert_eq!(tick(&0.125), "0.125");
        assert_eq!(tick(&1e-4), "0");
    }

    #[test]
    fn charts_are_pngs() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("l.png");
        let series = vec![
            ("a".to_string(), vec![(0.0, 1.0), (1.0, 0.5), (2.0, 0.25)]),
            ("b".to_string(), vec![(0.0, 0.9), (2.0, 0.1)]),
        ];
        let names = ["one".to_string(), "two".into(), "three".into()];
        let label = move |x: f64| names.get(x as usize).cloned().unwrap_or_default();
        line_chart(&p, "t", ("x", "y"), &series, Some(&label), Some((0.0, 1.0))).unwrap();
        let raw: Vec<(f64, f64)> = (0..30)
            .map(|i| (i as f64, 3.0 - 0.05 * i as f64 + (i % 3) as f64))
            .collect();
        let sm = smooth(&raw, smoothing_weight(raw.len()));
        assert_eq!(sm[0], raw[0]);
        // smoothing shrinks the step-to-step spread
        let spread = |v: &[(f64, f64)]| v.windows(2).map(|w| (w[1].1 - w[0].1).abs()).sum::<f64>();
        assert!(spread(&sm) < spread(&raw) / 3.0);
        let l = dir.path().join("loss.png");
        commit_png(&l, |tmp| draw_loss_chart(tmp, "t", &raw, &sm)).unwrap();
        assert_eq!(&std::fs::read(&l).unwrap()[..4], b"\x89PNG");
        let b = dir.path().join("b.png");
        let cats = vec!["0-3".to_string(), "4-7".into()];
        let bars = vec![
            (
                "a".to_string(),
                vec![(10.0, Some((8.0, 12.0))), (5.0, None)],
            ),
            ("b".to_string(), vec![(7.0, None), (0.0, Some((0.0, 1.0)))]),
        ];
        bar_chart(&b, "t", ("x", "y"), &cats, &bars, Some((0.0, 100.0))).unwrap();
        let h = dir.path().join("h.png");
        histogram(&h, "t", "tokens", &[1, 2, 2, 3, 50, 51]).unwrap();
        histogram(&dir.path().join("one.png"), "t", "tokens", &[7]).unwrap();
        for f in [&p, &h, &b] {
            let bytes = std::fs::read(f).unwrap();
            assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
            assert!(bytes.len() > 2000);
        }
        // no temporary left beside them
        let names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(names.iter().all(|n| !n.starts_with('.')), "{names:?}");
    }

    /// A chart that fails while drawn (a full disk) leaves neither a half-written PNG under its
    /// name nor its temporary.
    #[test]
    fn a_chart_that_fails_leaves_no_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.png");
        let e = commit_png(&p, |tmp| {
            std::fs::write(tmp, b"\x89PNG half").unwrap();
            Err(anyhow!("No space left on device"))
        })
        .unwrap_err();
        assert!(format!("{e:#}").contains("No space left"), "{e:#}");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}
