//! qsim's plots and HTML reports, drawn from plain data (no dependency on
//! the simulator): line charts with 90 % interval bands, latency CDFs,
//! heatmaps over two swept parameters, the server's queue and E2E over time,
//! the plan's admitted rate per minute against floors and capacity, a
//! Pareto scatter, a forest plot of prediction against observation, and a
//! labelled scatter against a target ([`scatter`]).
//! Every figure is written as PNG (plotters' bitmap backend) or SVG (its SVG
//! backend; also as a string for inline HTML).
//!
//! Text is laid out with the DejaVu Sans font compiled into the crate
//! (`fonts/DejaVuSans.ttf`, Bitstream Vera license: redistribution
//! permitted, see `fonts/LICENSE-DejaVu.txt`) through plotters' `ab_glyph`
//! feature, so no system font or fontconfig is needed.

pub mod check;
pub mod html;
pub mod robust;
pub mod scatter;

use plotters::chart::MeshStyle;
use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use std::ops::Range;
use std::path::Path;
use std::sync::Once;

/// The series colours, in order (Tableau 10): a figure draws at most
/// [`MAX_SERIES`] series per panel, each in its own colour.
pub const PALETTE: [(u8, u8, u8); 10] = [
    (0x4e, 0x79, 0xa7),
    (0xf2, 0x8e, 0x2b),
    (0xe1, 0x57, 0x59),
    (0x76, 0xb7, 0xb2),
    (0x59, 0xa1, 0x4f),
    (0xed, 0xc9, 0x48),
    (0xb0, 0x7a, 0xa1),
    (0xff, 0x9d, 0xa7),
    (0x9c, 0x75, 0x5f),
    (0xba, 0xb0, 0xac),
];

/// Most series one panel draws (one colour each).
pub const MAX_SERIES: usize = PALETTE.len();

/// Colour of reference lines (capacity) and of the Pareto scatter's
/// dominated points.
pub const REFERENCE: (u8, u8, u8) = (0x20, 0x20, 0x20);
pub const DOMINATED: (u8, u8, u8) = (0xa0, 0xa0, 0xa0);

const FONT: &[u8] = include_bytes!("../fonts/DejaVuSans.ttf");
const FAMILY: &str = "sans-serif";

fn fonts() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        if plotters::style::register_font(FAMILY, FontStyle::Normal, FONT).is_err() {
            panic!("the embedded DejaVu Sans font is a valid TrueType file");
        }
    });
}

fn color(i: usize) -> RGBColor {
    let (r, g, b) = PALETTE[i % PALETTE.len()];
    RGBColor(r, g, b)
}

fn rgb(c: (u8, u8, u8)) -> RGBColor {
    RGBColor(c.0, c.1, c.2)
}

/// A drawing error (an I/O error writing the file, or a plotters error).
#[derive(Debug, Clone, PartialEq)]
pub struct PlotError(pub String);

impl std::fmt::Display for PlotError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for PlotError {}

fn err<E: std::fmt::Display>(e: E) -> PlotError {
    PlotError(e.to_string())
}

/// One line of a chart: `(x, y)` points, optionally a band `(x, lo, hi)`
/// (the 90 % interval over seeds) drawn translucent in the line's colour.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
    pub band: Vec<(f64, f64, f64)>,
}

/// A dashed horizontal line in the colour of series `series` (a consumer's
/// floor), or in [`REFERENCE`] black when `series` is None (capacity).
#[derive(Debug, Clone, PartialEq)]
pub struct HLine {
    pub label: String,
    pub y: f64,
    pub series: Option<usize>,
}

/// How the x axis maps values.
#[derive(Debug, Clone, Default, PartialEq)]
pub enum XAxis {
    #[default]
    Linear,
    /// Logarithmic (values must be > 0).
    Log,
    /// Categories at x = 0, 1, 2, … labelled with these names.
    Categories(Vec<String>),
}

/// A chart of lines (with bands and reference lines).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LineChart {
    pub title: String,
    /// Axis labels, with units: "workers", "elapsed (s)".
    pub x_label: String,
    pub y_label: String,
    pub x_axis: XAxis,
    pub series: Vec<Series>,
    pub hlines: Vec<HLine>,
    /// Draw a marker at every point (sweeps: the measured points).
    pub markers: bool,
    /// Fixed y range; None: from the data (from 0 when all y ≥ 0).
    pub y_range: Option<(f64, f64)>,
    /// Where the legend goes.
    pub legend: Legend,
}

/// The corner of a chart's legend.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Legend {
    #[default]
    UpperRight,
    /// For CDFs: their upper left is empty.
    UpperLeft,
}

/// A heatmap: `cells[row][col]` is the value at (`x_values[col]`,
/// `y_values[row]`); None draws a grey cell. Each cell shows its value.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Heatmap {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    /// What the colour means, with its unit: "elapsed (s)".
    pub value_label: String,
    pub x_values: Vec<String>,
    pub y_values: Vec<String>,
    pub cells: Vec<Vec<Option<f64>>>,
    /// Decimals of the values written in the cells.
    pub decimals: usize,
}

/// One configuration of a Pareto scatter: its label and the two objectives
/// (both minimised), e.g. elapsed and p95 latency in seconds.
#[derive(Debug, Clone, PartialEq)]
pub struct ParetoPoint {
    pub label: String,
    pub x: f64,
    pub y: f64,
}

/// Front points labelled on a Pareto scatter (the first, by x).
pub const PARETO_LABELS: usize = 12;

/// A Pareto scatter: every point in grey, the front (points no other point
/// beats on both objectives) in colour, joined, the first
/// [`PARETO_LABELS`] labelled.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Pareto {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub points: Vec<ParetoPoint>,
}

/// One panel of a figure.
#[derive(Debug, Clone, PartialEq)]
pub enum Panel {
    Lines(LineChart),
    Heatmap(Heatmap),
    Pareto(Pareto),
    Forest(Forest),
    /// Labelled points against a target ([`scatter`]).
    Scatter(scatter::Scatter),
}

/// One row of a [`Forest`]: a prediction's 90 % interval and median and an
/// observation, all in the same unit (e.g. % of the predicted median).
/// `observed` NaN: not drawn (the label says why).
#[derive(Debug, Clone, PartialEq)]
pub struct ForestRow {
    pub label: String,
    pub lo: f64,
    pub median: f64,
    pub hi: f64,
    pub observed: f64,
    /// Drawn in green when true, red when false.
    pub agrees: bool,
}

/// Prediction against observation, one row per metric (a forest plot): the
/// interval as a black bar, the median as a tick, the observation as a dot
/// (green: agrees, red: does not), and the band ±`tolerance` around 0
/// shaded when given. No legend: `x_label` says what the marks mean.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Forest {
    pub title: String,
    pub x_label: String,
    pub rows: Vec<ForestRow>,
    pub tolerance: Option<f64>,
}

/// Colours of an observation that agrees / does not.
pub const AGREES: (u8, u8, u8) = (0x59, 0xa1, 0x4f);
pub const DISAGREES: (u8, u8, u8) = (0xe1, 0x57, 0x59);

/// A figure: panels laid out in a grid of `cols` columns, `width × height`
/// pixels in all.
#[derive(Debug, Clone, PartialEq)]
pub struct Figure {
    pub width: u32,
    pub height: u32,
    pub cols: usize,
    pub panels: Vec<Panel>,
}

/// Default size of a one-panel figure.
pub const WIDTH: u32 = 960;
pub const HEIGHT: u32 = 600;

impl Figure {
    /// One panel, [`WIDTH`] × [`HEIGHT`].
    pub fn single(panel: Panel) -> Figure {
        Figure {
            width: WIDTH,
            height: HEIGHT,
            cols: 1,
            panels: vec![panel],
        }
    }

    /// Panels in `cols` columns, each `w × h` pixels.
    pub fn grid(panels: Vec<Panel>, cols: usize, w: u32, h: u32) -> Figure {
        let cols = cols.clamp(1, panels.len().max(1));
        let rows = panels.len().div_ceil(cols).max(1);
        Figure {
            width: w * cols as u32,
            height: h * rows as u32,
            cols,
            panels,
        }
    }

    /// Write the figure to `path`: PNG if it ends in `.png`, SVG if `.svg`.
    pub fn save(&self, path: &Path) -> Result<(), PlotError> {
        fonts();
        let size = (self.width, self.height);
        match path.extension().and_then(|e| e.to_str()) {
            Some("png") => {
                let root = BitMapBackend::new(path, size).into_drawing_area();
                self.draw(&root)?;
                root.present().map_err(err)
            }
            Some("svg") => {
                let svg = self.svg()?;
                std::fs::write(path, svg).map_err(|e| PlotError(format!("{}: {e}", path.display())))
            }
            _ => Err(PlotError(format!(
                "{}: a plot file must end in .png or .svg",
                path.display()
            ))),
        }
    }

    /// The figure as SVG text (for a file or inline in HTML).
    pub fn svg(&self) -> Result<String, PlotError> {
        fonts();
        let mut s = String::new();
        {
            let root =
                SVGBackend::with_string(&mut s, (self.width, self.height)).into_drawing_area();
            self.draw(&root)?;
            root.present().map_err(err)?;
        }
        Ok(s)
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), PlotError> {
        root.fill(&WHITE).map_err(err)?;
        let cols = self.cols.max(1);
        let rows = self.panels.len().div_ceil(cols).max(1);
        let areas = root.split_evenly((rows, cols));
        for (p, area) in self.panels.iter().zip(areas.iter()) {
            match p {
                Panel::Lines(c) => draw_lines(area, c)?,
                Panel::Heatmap(h) => draw_heatmap(area, h)?,
                Panel::Pareto(s) => draw_pareto(area, s)?,
                Panel::Forest(f) => draw_forest(area, f)?,
                Panel::Scatter(s) => draw_scatter(area, s)?,
            }
        }
        Ok(())
    }
}

/// A number for a tick label: short, no trailing zeros.
pub fn fmt_num(v: f64) -> String {
    if !v.is_finite() {
        return "–".into();
    }
    let a = v.abs();
    let s = if a != 0.0 && !(1e-3..1e6).contains(&a) {
        format!("{v:.1e}")
    } else if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    };
    if s.contains('.') && !s.contains('e') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

/// Two significant digits (log-axis ticks).
fn fmt_sig(v: f64) -> String {
    if !v.is_finite() || v == 0.0 {
        return fmt_num(v);
    }
    let e = v.abs().log10().floor() as i32;
    let m = 10f64.powi(e - 1);
    fmt_num((v / m).round() * m)
}

fn pad(lo: f64, hi: f64, from_zero: bool) -> (f64, f64) {
    let (mut lo, hi) = if lo.is_finite() && hi.is_finite() {
        (lo, hi)
    } else {
        (0.0, 1.0)
    };
    if from_zero && lo >= 0.0 {
        lo = 0.0;
    }
    if hi - lo <= f64::EPSILON * hi.abs().max(1.0) {
        let d = if hi == 0.0 { 1.0 } else { hi.abs() * 0.1 };
        return (lo - if from_zero && lo == 0.0 { 0.0 } else { d }, hi + d);
    }
    let d = (hi - lo) * 0.05;
    (if from_zero && lo == 0.0 { 0.0 } else { lo - d }, hi + d)
}

/// The least and the greatest of `values` (∞ and −∞ when there are none).
fn extent(values: impl IntoIterator<Item = f64>) -> (f64, f64) {
    values
        .into_iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| {
            (a.min(v), b.max(v))
        })
}

/// The tick label at `v` on a categorical axis (category i at i): its name
/// at a category, none between or beyond them.
fn category(names: &[String], v: f64) -> String {
    let i = v.round();
    if (v - i).abs() < 1e-6 && i >= 0.0 && (i as usize) < names.len() {
        names[i as usize].clone()
    } else {
        String::new()
    }
}

/// A chart's coordinates: f64 on both axes.
type Xy = Cartesian2d<RangedCoordf64, RangedCoordf64>;

/// The frame of every chart: the caption (`title_size` px), a 12 px margin,
/// the x tick labels' area 48 px high, the y tick labels' `y_area` px wide.
fn frame<'c, DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    title: &str,
    title_size: u32,
    y_area: u32,
    x: Range<f64>,
    y: Range<f64>,
) -> Result<ChartContext<'c, DB, Xy>, PlotError> {
    ChartBuilder::on(area)
        .caption(title, (FAMILY, title_size))
        .margin(12)
        .x_label_area_size(48)
        .y_label_area_size(y_area)
        .build_cartesian_2d(x, y)
        .map_err(err)
}

/// How a chart's axes look: tick labels and axis titles (px), and the bold
/// grid lines' colour, with at most one light line between two (None: no
/// grid).
#[derive(Clone, Copy)]
struct Look {
    labels: u32,
    titles: u32,
    grid: Option<RGBColor>,
}

/// Line charts and the Pareto scatter.
const CHART: Look = Look {
    labels: 14,
    titles: 16,
    grid: Some(RGBColor(0xdd, 0xdd, 0xdd)),
};

/// The forest plot: smaller text, a paler grid.
const FOREST: Look = Look {
    labels: 13,
    titles: 14,
    grid: Some(RGBColor(0xee, 0xee, 0xee)),
};

/// The heatmap: no grid over its cells.
const CELLS: Look = Look {
    grid: None,
    ..CHART
};

/// The axes of `chart`: their titles (no y title: None), tick label
/// formatters (x, y) and look; the caller adds tick counts and draws.
fn axes<'a, 'b, DB: DrawingBackend>(
    chart: &'b mut ChartContext<'a, DB, Xy>,
    x_desc: &str,
    y_desc: Option<&str>,
    [xf, yf]: [&'b dyn Fn(&f64) -> String; 2],
    look: Look,
) -> MeshStyle<'a, 'b, RangedCoordf64, RangedCoordf64, DB> {
    let mut mesh = chart.configure_mesh();
    mesh.x_desc(x_desc)
        .x_label_formatter(xf)
        .y_label_formatter(yf)
        .label_style((FAMILY, look.labels))
        .axis_desc_style((FAMILY, look.titles));
    if let Some(y) = y_desc {
        mesh.y_desc(y);
    }
    match look.grid {
        Some(bold) => {
            mesh.light_line_style(RGBColor(0xf3, 0xf3, 0xf3))
                .max_light_lines(1)
                .bold_line_style(bold);
        }
        None => {
            mesh.disable_mesh();
        }
    }
    mesh
}

/// `text` at `at`, `size` px in `ink`, its `h` and `v` sides on the point.
fn anchored(
    text: String,
    at: (f64, f64),
    size: u32,
    ink: RGBColor,
    (h, v): (HPos, VPos),
) -> Text<'static, (f64, f64), String> {
    let style = (FAMILY, size).into_font().color(&ink).pos(Pos::new(h, v));
    Text::new(text, at, style)
}

/// A series' mark in the legend: a box in its colour.
fn key(col: RGBColor) -> impl Fn((i32, i32)) -> Rectangle<(i32, i32)> {
    move |(x, y)| Rectangle::new([(x, y - 5), (x + 16, y + 5)], col.filled())
}

/// The legend (the series' names and keys) in a box at `pos`.
fn legend<'a, DB: DrawingBackend + 'a>(
    chart: &mut ChartContext<'a, DB, Xy>,
    pos: SeriesLabelPosition,
) -> Result<(), PlotError> {
    chart
        .configure_series_labels()
        .position(pos)
        .background_style(WHITE.mix(0.85))
        .border_style(RGBColor(0xbb, 0xbb, 0xbb))
        .label_font((FAMILY, 14))
        .draw()
        .map_err(err)
}

/// A marker at `at` pointing outwards past the axis' end: up (a cut y
/// axis), right (a cut x axis), or up and right (both); `px` is the size of
/// one pixel in data units (x, y).
fn beyond_mark(
    at: (f64, f64),
    up: bool,
    right: bool,
    px: (f64, f64),
    col: RGBColor,
) -> Polygon<(f64, f64)> {
    let tip: [(f64, f64); 3] = match (up, right) {
        (true, false) => [(0.0, 8.0), (-5.0, -1.0), (5.0, -1.0)],
        (false, true) => [(8.0, 0.0), (-1.0, 5.0), (-1.0, -5.0)],
        _ => [(7.0, 7.0), (-3.0, 5.0), (5.0, -3.0)],
    };
    let pts = tip
        .iter()
        .map(|&(dx, dy)| (at.0 + dx * px.0, at.1 + dy * px.1))
        .collect::<Vec<_>>();
    Polygon::new(pts, col.filled())
}

/// A cut axis ([`robust`]): where it ends, and per drawn point whether it
/// lies beyond.
#[derive(Clone, Copy)]
struct Cut(Option<f64>);

impl Cut {
    fn over(self, v: f64) -> bool {
        self.0.is_some_and(|c| v > c)
    }
    fn clamp(self, v: f64) -> f64 {
        match self.0 {
            Some(c) if v > c => c,
            _ => v,
        }
    }
}

/// The caption of a chart with cut axes: its title, then what was cut.
/// `xs`/`ys` are the drawn points' coordinates (as drawn), `show_x`/`show_y`
/// format an axis value as its tick labels do.
fn cut_title(
    title: &str,
    (xc, yc): (Cut, Cut),
    pts: &[(f64, f64)],
    show_x: &dyn Fn(f64) -> String,
    show_y: &dyn Fn(f64) -> String,
) -> String {
    let mut notes = Vec::new();
    for (c, axis, arrow, get, show) in [
        (
            xc,
            "x",
            "▶",
            (|p: &(f64, f64)| p.0) as fn(&(f64, f64)) -> f64,
            show_x,
        ),
        (yc, "y", "▲", |p: &(f64, f64)| p.1, show_y),
    ] {
        if let Some(at) = c.0 {
            let beyond: Vec<f64> = pts.iter().map(get).filter(|&v| v > at).collect();
            let (_, max) = extent(beyond.iter().copied());
            if !beyond.is_empty() {
                notes.push(robust::note(
                    axis,
                    &show(at),
                    beyond.len(),
                    &show(max),
                    arrow,
                ));
            }
        }
    }
    if notes.is_empty() {
        title.to_string()
    } else {
        format!("{title} — {}", notes.join("; "))
    }
}

fn draw_lines<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    c: &LineChart,
) -> Result<(), PlotError> {
    let log = matches!(c.x_axis, XAxis::Log);
    let tx = |x: f64| if log { x.max(1e-12).log10() } else { x };
    let drawn = &c.series[..c.series.len().min(MAX_SERIES)];
    let xs: Vec<f64> = c
        .series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0))
        .filter(|x| x.is_finite() && (!log || *x > 0.0))
        .map(tx)
        .collect();
    let (mut x0, mut x1) = extent(xs.iter().copied());
    let mut xc = Cut(None);
    if let XAxis::Categories(cats) = &c.x_axis {
        x0 = -0.5;
        x1 = cats.len().max(1) as f64 - 0.5;
    } else {
        // a few far values do not stretch the axis (robust.rs)
        xc = Cut(robust::cut(&xs, x0));
        if let Some(cx) = xc.0 {
            x1 = cx;
        }
        (x0, x1) = pad(x0, x1, false);
        if !log
            && x0 < 0.0
            && x1 > 0.0
            && c.series.iter().all(|s| s.points.iter().all(|p| p.0 >= 0.0))
        {
            x0 = 0.0;
        }
    }
    let mut yc = Cut(None);
    let (y0, y1) = match c.y_range {
        Some(r) => r,
        None => {
            let ys: Vec<f64> = c
                .series
                .iter()
                .flat_map(|s| {
                    s.points
                        .iter()
                        .map(|p| p.1)
                        .chain(s.band.iter().flat_map(|b| [b.1, b.2]))
                })
                .filter(|y| y.is_finite())
                .collect();
            let (lo, hi) = extent(ys.iter().copied());
            let (hlo, hhi) = extent(c.hlines.iter().map(|h| h.y).filter(|y| y.is_finite()));
            let start = if lo >= 0.0 { 0.0 } else { lo };
            // the reference lines stay in view
            yc = Cut(robust::cut(&ys, start)
                .map(|cy| cy.max(hhi))
                .filter(|&cy| cy < hi));
            pad(lo.min(hlo), yc.0.unwrap_or(hi).max(hhi), true)
        }
    };
    let cats = match &c.x_axis {
        XAxis::Categories(v) => v.clone(),
        _ => vec![],
    };
    // whole-number data (minutes, workers): label whole ticks only
    let whole = !log
        && c.series
            .iter()
            .all(|s| s.points.iter().all(|p| p.0.fract() == 0.0));
    let xf = |v: &f64| -> String {
        if !cats.is_empty() {
            category(&cats, *v)
        } else if log {
            fmt_sig(10f64.powf(*v))
        } else if whole && (v - v.round()).abs() > 1e-9 {
            String::new()
        } else {
            fmt_num(*v)
        }
    };
    let yf = |v: &f64| fmt_num(*v);
    // every drawn point as drawn, for the caption's note on cut axes
    let pts_all: Vec<(f64, f64)> = drawn
        .iter()
        .flat_map(|s| s.points.iter())
        .filter(|p| p.0.is_finite() && p.1.is_finite())
        .map(|p| (tx(p.0), p.1))
        .collect();
    let show_x = |v: f64| {
        if log {
            fmt_sig(10f64.powf(v))
        } else {
            fmt_num(v)
        }
    };
    let title = cut_title(&c.title, (xc, yc), &pts_all, &show_x, &|v| fmt_num(v));
    let mut chart = frame(area, &title, 20, 72, x0..x1, y0..y1)?;
    let mut mesh = axes(&mut chart, &c.x_label, Some(&c.y_label), [&xf, &yf], CHART);
    if !cats.is_empty() {
        mesh.x_labels(cats.len().max(2) * 2 + 1);
    } else if log {
        mesh.x_labels(8);
    }
    mesh.draw().map_err(err)?;
    let clamp = |(x, y): (f64, f64)| (xc.clamp(x), yc.clamp(y));
    let (xr, yr) = chart.plotting_area().get_pixel_range();
    let px = (
        (x1 - x0) / (xr.end - xr.start).max(1) as f64,
        (y1 - y0) / (yr.end - yr.start).max(1) as f64,
    );
    for (i, s) in drawn.iter().enumerate() {
        let col = color(i);
        if !s.band.is_empty() {
            let mut poly: Vec<(f64, f64)> = s.band.iter().map(|b| clamp((tx(b.0), b.2))).collect();
            poly.extend(s.band.iter().rev().map(|b| clamp((tx(b.0), b.1))));
            chart
                .draw_series(std::iter::once(Polygon::new(poly, col.mix(0.18).filled())))
                .map_err(err)?;
        }
        let raw: Vec<(f64, f64)> = s
            .points
            .iter()
            .filter(|p| p.0.is_finite() && p.1.is_finite())
            .map(|p| (tx(p.0), p.1))
            .collect();
        let pts: Vec<(f64, f64)> = raw.iter().map(|&p| clamp(p)).collect();
        chart
            .draw_series(LineSeries::new(pts.clone(), col.stroke_width(2)))
            .map_err(err)?
            .label(s.name.as_str())
            .legend(key(col));
        if c.markers {
            chart
                .draw_series(
                    raw.iter()
                        .filter(|p| !xc.over(p.0) && !yc.over(p.1))
                        .map(|&p| Circle::new(p, 3, col.filled())),
                )
                .map_err(err)?;
        }
        chart
            .draw_series(
                raw.iter()
                    .filter(|p| xc.over(p.0) || yc.over(p.1))
                    .map(|&p| beyond_mark(clamp(p), yc.over(p.1), xc.over(p.0), px, col)),
            )
            .map_err(err)?;
    }
    // the series' floors and the reference lines; series lines at the same
    // height (consumers sharing a floor) are one line whose dashes take
    // each one's colour in turn, its label in the reference ink
    let span = x1 - x0;
    let mut done = vec![false; c.hlines.len()];
    for (k, h) in c.hlines.iter().enumerate() {
        if done[k] {
            continue;
        }
        let group: Vec<usize> = match h.series {
            None => vec![k],
            Some(_) => (k..c.hlines.len())
                .filter(|&j| c.hlines[j].series.is_some() && c.hlines[j].y == h.y)
                .collect(),
        };
        for &j in &group {
            done[j] = true;
        }
        let cols: Vec<RGBColor> = group
            .iter()
            .map(|&j| match c.hlines[j].series {
                Some(i) => color(i),
                None => rgb(REFERENCE),
            })
            .collect();
        let w = if h.series.is_none() { 2 } else { 1 };
        // dashes as one path per dash: 12 px on, 6 px off
        let on = span / 80.0;
        let mut x = x0;
        let mut dashes = Vec::new();
        while x < x1 {
            let style = cols[dashes.len() % cols.len()].stroke_width(w);
            dashes.push(PathElement::new(
                vec![(x, h.y), ((x + on).min(x1), h.y)],
                style,
            ));
            x += on * 1.5;
        }
        chart.draw_series(dashes).map_err(err)?;
        let label = group
            .iter()
            .map(|&j| c.hlines[j].label.as_str())
            .find(|l| !l.is_empty());
        if let Some(label) = label {
            let ink = if cols.len() == 1 {
                cols[0]
            } else {
                rgb(REFERENCE)
            };
            let anchor = (x0 + span * 0.01, h.y);
            let text = anchored(
                label.to_string(),
                anchor,
                12,
                ink,
                (HPos::Left, VPos::Bottom),
            );
            chart.draw_series([text]).map_err(err)?;
        }
    }
    if !c.series.is_empty() {
        let pos = match c.legend {
            Legend::UpperRight => SeriesLabelPosition::UpperRight,
            Legend::UpperLeft => SeriesLabelPosition::UpperLeft,
        };
        legend(&mut chart, pos)?;
    }
    Ok(())
}

/// Viridis, interpolated between 6 anchors; `t` in [0, 1].
pub fn viridis(t: f64) -> (u8, u8, u8) {
    const A: [(f64, f64, f64); 6] = [
        (68.0, 1.0, 84.0),
        (65.0, 68.0, 135.0),
        (42.0, 120.0, 142.0),
        (34.0, 168.0, 132.0),
        (122.0, 209.0, 81.0),
        (253.0, 231.0, 37.0),
    ];
    let t = if t.is_finite() {
        t.clamp(0.0, 1.0)
    } else {
        0.0
    };
    let x = t * (A.len() - 1) as f64;
    let i = (x.floor() as usize).min(A.len() - 2);
    let f = x - i as f64;
    let l = |a: f64, b: f64| (a + (b - a) * f).round() as u8;
    (
        l(A[i].0, A[i + 1].0),
        l(A[i].1, A[i + 1].1),
        l(A[i].2, A[i + 1].2),
    )
}

/// Grey of a heatmap cell without a value.
pub const MISSING: (u8, u8, u8) = (0xd8, 0xd8, 0xd8);

fn draw_heatmap<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    h: &Heatmap,
) -> Result<(), PlotError> {
    let nx = h.x_values.len().max(1);
    let ny = h.y_values.len().max(1);
    let (vmin, vmax) = extent(
        h.cells
            .iter()
            .flatten()
            .flatten()
            .copied()
            .filter(|v| v.is_finite()),
    );
    let title = if vmin.is_finite() {
        format!(
            "{} — colour: {} from {} (dark) to {} (light)",
            h.title,
            h.value_label,
            fmt_num(vmin),
            fmt_num(vmax)
        )
    } else {
        h.title.clone()
    };
    let (xr, yr) = (-0.5..nx as f64 - 0.5, -0.5..ny as f64 - 0.5);
    let mut chart = frame(area, &title, 18, 80, xr, yr)?;
    let xf = |v: &f64| category(&h.x_values, *v);
    let yf = |v: &f64| category(&h.y_values, *v);
    axes(&mut chart, &h.x_label, Some(&h.y_label), [&xf, &yf], CELLS)
        .x_labels(nx * 2 + 1)
        .y_labels(ny * 2 + 1)
        .draw()
        .map_err(err)?;
    let span = if vmax > vmin { vmax - vmin } else { 1.0 };
    let mut cells = Vec::new();
    let mut labels = Vec::new();
    for row in 0..ny {
        for col in 0..nx {
            let v = h.cells.get(row).and_then(|r| r.get(col)).copied().flatten();
            let (fill, text) = match v {
                Some(v) if v.is_finite() => {
                    let t = (v - vmin) / span;
                    let c = viridis(t);
                    let ink = if t > 0.6 { BLACK } else { WHITE };
                    (rgb(c), Some((format!("{:.*}", h.decimals, v), ink)))
                }
                _ => (rgb(MISSING), Some(("–".to_string(), BLACK))),
            };
            let (x, y) = (col as f64, row as f64);
            cells.push(Rectangle::new(
                [(x - 0.5, y - 0.5), (x + 0.5, y + 0.5)],
                fill.filled(),
            ));
            if let Some((t, ink)) = text {
                labels.push((t, (x, y), ink));
            }
        }
    }
    chart.draw_series(cells).map_err(err)?;
    let fs = if nx * ny > 150 { 11 } else { 16 };
    let mid = (HPos::Center, VPos::Center);
    chart
        .draw_series(
            labels
                .into_iter()
                .map(|(t, p, ink)| anchored(t, p, fs, ink, mid)),
        )
        .map_err(err)?;
    Ok(())
}

fn draw_forest<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    f: &Forest,
) -> Result<(), PlotError> {
    let n = f.rows.len().max(1);
    let tol = f.tolerance.filter(|t| t.is_finite() && *t > 0.0);
    let (x0, x1) = extent(
        f.rows
            .iter()
            .flat_map(|r| [r.lo, r.median, r.hi, r.observed])
            .chain(tol.into_iter().flat_map(|t| [-t, t]))
            .filter(|v| v.is_finite()),
    );
    let (x0, x1) = pad(x0, x1, false);
    let width = f.rows.iter().map(|r| r.label.chars().count()).max();
    let y_area = (width.unwrap_or(8) as u32 * 8 + 16).clamp(80, 420);
    let mut chart = frame(area, &f.title, 18, y_area, x0..x1, -0.5..n as f64 - 0.5)?;
    // row 0 at the top
    let y = |i: usize| (n - 1 - i) as f64;
    let names: Vec<String> = f.rows.iter().rev().map(|r| r.label.clone()).collect();
    let yf = |v: &f64| category(&names, *v);
    let xf = |v: &f64| fmt_num(*v);
    axes(&mut chart, &f.x_label, None, [&xf, &yf], FOREST)
        .y_labels(n * 2 + 1)
        .draw()
        .map_err(err)?;
    if let Some(t) = tol {
        chart
            .draw_series([Rectangle::new(
                [(-t, -0.5), (t, n as f64 - 0.5)],
                RGBColor(0xe8, 0xf0, 0xf8).filled(),
            )])
            .map_err(err)?;
    }
    let ink = rgb(REFERENCE);
    chart
        .draw_series(
            f.rows.iter().enumerate().map(|(i, r)| {
                PathElement::new(vec![(r.lo, y(i)), (r.hi, y(i))], ink.stroke_width(3))
            }),
        )
        .map_err(err)?;
    chart
        .draw_series(f.rows.iter().enumerate().map(|(i, r)| {
            PathElement::new(
                vec![(r.median, y(i) - 0.25), (r.median, y(i) + 0.25)],
                ink.stroke_width(2),
            )
        }))
        .map_err(err)?;
    chart
        .draw_series(
            f.rows
                .iter()
                .enumerate()
                .filter(|(_, r)| r.observed.is_finite())
                .map(|(i, r)| {
                    let col = rgb(if r.agrees { AGREES } else { DISAGREES });
                    Circle::new((r.observed, y(i)), 6, col.filled())
                }),
        )
        .map_err(err)?;
    Ok(())
}

/// Indices of the Pareto front of `points` (both coordinates minimised):
/// the points that no other point matches or beats on both with one
/// strictly better, sorted by x. Non-finite points are never on it.
pub fn pareto_front(points: &[ParetoPoint]) -> Vec<usize> {
    let ok = |p: &ParetoPoint| p.x.is_finite() && p.y.is_finite();
    let mut front: Vec<usize> = (0..points.len())
        .filter(|&i| ok(&points[i]))
        .filter(|&i| {
            let p = &points[i];
            !points
                .iter()
                .any(|q| ok(q) && q.x <= p.x && q.y <= p.y && (q.x < p.x || q.y < p.y))
        })
        .collect();
    front.sort_by(|&a, &b| {
        points[a]
            .x
            .total_cmp(&points[b].x)
            .then(points[a].y.total_cmp(&points[b].y))
            .then(a.cmp(&b))
    });
    front
}

fn draw_pareto<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    s: &Pareto,
) -> Result<(), PlotError> {
    let fin: Vec<&ParetoPoint> = s
        .points
        .iter()
        .filter(|p| p.x.is_finite() && p.y.is_finite())
        .collect();
    let xs: Vec<f64> = fin.iter().map(|p| p.x).collect();
    let ys: Vec<f64> = fin.iter().map(|p| p.y).collect();
    let (x0, x1) = extent(xs.iter().copied());
    let (y0, y1) = extent(ys.iter().copied());
    // a few far configurations do not stretch the axes (robust.rs)
    let (xc, yc) = (Cut(robust::cut(&xs, x0)), Cut(robust::cut(&ys, y0)));
    let (x0, x1) = pad(x0, xc.0.unwrap_or(x1), false);
    let (y0, y1) = pad(y0, yc.0.unwrap_or(y1), false);
    let all: Vec<(f64, f64)> = fin.iter().map(|p| (p.x, p.y)).collect();
    let show = |v: f64| fmt_num(v);
    let title = cut_title(&s.title, (xc, yc), &all, &show, &show);
    let mut chart = frame(area, &title, 20, 72, x0..x1, y0..y1)?;
    let f = |v: &f64| fmt_num(*v);
    axes(&mut chart, &s.x_label, Some(&s.y_label), [&f, &f], CHART)
        .draw()
        .map_err(err)?;
    let (xr, yr) = chart.plotting_area().get_pixel_range();
    let px = (
        (x1 - x0) / (xr.end - xr.start).max(1) as f64,
        (y1 - y0) / (yr.end - yr.start).max(1) as f64,
    );
    let inside = |p: &(f64, f64)| !xc.over(p.0) && !yc.over(p.1);
    let clamp = |p: (f64, f64)| (xc.clamp(p.0), yc.clamp(p.1));
    // points beyond a cut axis: a marker at the edge, pointing outwards
    let beyond = |pts: &[(f64, f64)], col: RGBColor| -> Vec<Polygon<(f64, f64)>> {
        pts.iter()
            .filter(|p| !inside(p))
            .map(|&p| beyond_mark(clamp(p), yc.over(p.1), xc.over(p.0), px, col))
            .collect()
    };
    let grey = rgb(DOMINATED);
    let front = pareto_front(&s.points);
    chart
        .draw_series(
            all.iter()
                .filter(|p| inside(p))
                .map(|&p| Circle::new(p, 4, grey.filled())),
        )
        .map_err(err)?
        .label(format!("all configurations ({})", fin.len()))
        .legend(key(grey));
    chart.draw_series(beyond(&all, grey)).map_err(err)?;
    let col = color(0);
    let fp: Vec<(f64, f64)> = front
        .iter()
        .map(|&i| (s.points[i].x, s.points[i].y))
        .collect();
    chart
        .draw_series(LineSeries::new(
            fp.iter().map(|&p| clamp(p)).collect::<Vec<_>>(),
            col.stroke_width(2),
        ))
        .map_err(err)?
        .label(format!("Pareto front ({})", fp.len()))
        .legend(key(col));
    chart
        .draw_series(
            fp.iter()
                .filter(|p| inside(p))
                .map(|&p| Circle::new(p, 6, col.filled())),
        )
        .map_err(err)?;
    chart.draw_series(beyond(&fp, col)).map_err(err)?;
    let corner = (HPos::Left, VPos::Bottom);
    chart
        .draw_series(front.iter().take(PARETO_LABELS).map(|&i| {
            let p = &s.points[i];
            anchored(p.label.clone(), clamp((p.x, p.y)), 12, BLACK, corner)
        }))
        .map_err(err)?;
    legend(&mut chart, SeriesLabelPosition::UpperRight)
}

// ---- the labelled scatter against a target (data in `scatter`) ----

/// Is an axis over `values` logarithmic: all > 0, spanning more than 20×.
fn log_axis(values: &[f64]) -> bool {
    let (lo, hi) = extent(values.iter().copied().filter(|v| v.is_finite()));
    lo.is_finite() && lo > 0.0 && hi / lo > 20.0
}

fn draw_scatter<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    s: &scatter::Scatter,
) -> Result<(), PlotError> {
    let pts: Vec<&scatter::ScatterPoint> = s
        .points
        .iter()
        .filter(|p| p.x.is_finite() && p.y.is_finite())
        .collect();
    let mut xs: Vec<f64> = pts.iter().map(|p| p.x).collect();
    if let Some(v) = s.vline.as_ref().filter(|v| v.x.is_finite()) {
        xs.push(v.x);
    }
    let ys: Vec<f64> = pts.iter().map(|p| p.y).collect();
    let (lx, ly) = (log_axis(&xs), log_axis(&ys));
    let tx = move |x: f64| if lx { x.log10() } else { x };
    let ty = move |y: f64| if ly { y.log10() } else { y };
    let txs: Vec<f64> = xs.iter().map(|&x| tx(x)).collect();
    let tys: Vec<f64> = ys.iter().map(|&y| ty(y)).collect();
    let (x0, x1) = extent(txs.iter().copied());
    let (y0, y1) = extent(tys.iter().copied());
    // a few far points do not stretch the axes (robust.rs); the target
    // line stays in view
    let start = |lo: f64, log: bool| if !log && lo >= 0.0 { 0.0 } else { lo };
    let vx = s
        .vline
        .as_ref()
        .filter(|v| v.x.is_finite())
        .map_or(f64::NEG_INFINITY, |v| tx(v.x));
    let xc = Cut(robust::cut(&txs, start(x0, lx))
        .map(|c| c.max(vx))
        .filter(|&c| c < x1));
    let yc = Cut(robust::cut(&tys, start(y0, ly)));
    let (x0, x1) = pad(x0, xc.0.unwrap_or(x1), !lx);
    // room above the highest point for its label
    let (y0, y1) = pad(y0, yc.0.unwrap_or(y1), !ly);
    let y1 = y1 + (y1 - y0) * 0.05;
    let drawn: Vec<(f64, f64)> = pts.iter().map(|p| (tx(p.x), ty(p.y))).collect();
    let show = |log: bool| {
        move |v: f64| {
            if log {
                fmt_sig(10f64.powf(v))
            } else {
                fmt_num(v)
            }
        }
    };
    let title = cut_title(&s.title, (xc, yc), &drawn, &show(lx), &show(ly));
    let mut chart = frame(area, &title, 18, 72, x0..x1, y0..y1)?;
    let xf = |v: &f64| {
        if lx {
            fmt_sig(10f64.powf(*v))
        } else {
            fmt_num(*v)
        }
    };
    let yf = |v: &f64| {
        if ly {
            fmt_sig(10f64.powf(*v))
        } else {
            fmt_num(*v)
        }
    };
    let x_label = format!("{}{}", s.x_label, if lx { " (log scale)" } else { "" });
    let y_label = format!("{}{}", s.y_label, if ly { " (log scale)" } else { "" });
    axes(&mut chart, &x_label, Some(&y_label), [&xf, &yf], CHART)
        .draw()
        .map_err(err)?;
    if let Some(v) = s.vline.as_ref().filter(|v| v.x.is_finite()) {
        let x = tx(v.x);
        let ink = rgb(REFERENCE);
        // dashes as one path per dash
        let span = y1 - y0;
        let on = span / 50.0;
        let mut y = y0;
        let mut dashes = Vec::new();
        while y < y1 {
            dashes.push(vec![(x, y), (x, (y + on).min(y1))]);
            y += on * 1.5;
        }
        let style = ink.stroke_width(2);
        chart
            .draw_series(dashes.into_iter().map(move |d| PathElement::new(d, style)))
            .map_err(err)?;
        let at = (x, y1 - span * 0.01);
        // beside the line, on the side with more room
        let (text, side) = if x > (x0 + x1) / 2.0 {
            (format!("{} ", v.label), HPos::Right)
        } else {
            (format!(" {}", v.label), HPos::Left)
        };
        chart
            .draw_series([anchored(text, at, 12, ink, (side, VPos::Top))])
            .map_err(err)?;
    }
    let grey = rgb(DOMINATED);
    let blue = color(0);
    let red = rgb(scatter::CHOSEN);
    let (xr, yr) = chart.plotting_area().get_pixel_range();
    let px = (
        (x1 - x0) / (xr.end - xr.start).max(1) as f64,
        (y1 - y0) / (yr.end - yr.start).max(1) as f64,
    );
    let inside = |p: &scatter::ScatterPoint| !xc.over(tx(p.x)) && !yc.over(ty(p.y));
    // a point beyond a cut axis is drawn at the edge, as a marker pointing
    // outwards
    let at = |p: &scatter::ScatterPoint| (xc.clamp(tx(p.x)), yc.clamp(ty(p.y)));
    let beyond = |ps: &[&&scatter::ScatterPoint], col: RGBColor| -> Vec<Polygon<(f64, f64)>> {
        ps.iter()
            .filter(|p| !inside(p))
            .map(|p| beyond_mark(at(p), yc.over(ty(p.y)), xc.over(tx(p.x)), px, col))
            .collect()
    };
    let count = |m: &[scatter::Mark]| pts.iter().filter(|p| m.contains(&p.mark)).count();
    let misses: Vec<_> = pts
        .iter()
        .filter(|p| p.mark == scatter::Mark::Misses)
        .collect();
    chart
        .draw_series(
            misses
                .iter()
                .filter(|p| inside(p))
                .map(|p| Circle::new(at(p), 5, grey.filled())),
        )
        .map_err(err)?
        .label(format!("misses a target ({})", misses.len()))
        .legend(key(grey));
    chart.draw_series(beyond(&misses, grey)).map_err(err)?;
    let meets: Vec<_> = pts
        .iter()
        .filter(|p| p.mark != scatter::Mark::Misses)
        .collect();
    chart.draw_series(beyond(&meets, blue)).map_err(err)?;
    chart
        .draw_series(
            meets
                .iter()
                .filter(|p| inside(p))
                .map(|p| Circle::new(at(p), 5, blue.filled())),
        )
        .map_err(err)?
        .label(format!(
            "meets the targets ({})",
            count(&[scatter::Mark::Meets, scatter::Mark::Chosen])
        ))
        .legend(key(blue));
    let chosen: Vec<_> = pts
        .iter()
        .filter(|p| p.mark == scatter::Mark::Chosen)
        .collect();
    if let Some(c) = chosen.first() {
        chart
            .draw_series(
                chosen
                    .iter()
                    .map(|p| Circle::new(at(p), 10, red.stroke_width(3))),
            )
            .map_err(err)?
            .label(format!("cheapest meeting them: {}", c.label))
            .legend(key(red));
    }
    // labels: beside each point, on the side (of eight, in order) that
    // overlaps least — first the plot's edge, then the labels placed before
    // (the chosen point's first) and the other points' marks; text width
    // estimated at 7 px a character
    let (xr, yr) = chart.plotting_area().get_pixel_range();
    let marks: Vec<(i32, i32)> = pts.iter().map(|p| chart.backend_coord(&at(p))).collect();
    let mut order: Vec<usize> = (0..pts.len()).collect();
    order.sort_by_key(|&i| pts[i].mark != scatter::Mark::Chosen);
    let mut placed: Vec<[i32; 4]> = Vec::new();
    let mut texts = Vec::new();
    let overlap =
        |b: &[i32; 4], o: &[i32; 4]| b[0] < o[2] && o[0] < b[2] && b[1] < o[3] && o[1] < b[3];
    for i in order {
        let p = pts[i];
        let (px, py) = marks[i];
        let (w, h) = (7 * p.label.chars().count() as i32, 13);
        let sides = [
            (8, -3, HPos::Left, VPos::Bottom),
            (8, 3, HPos::Left, VPos::Top),
            (-8, -3, HPos::Right, VPos::Bottom),
            (-8, 3, HPos::Right, VPos::Top),
            (8, -12, HPos::Left, VPos::Bottom),
            (8, 12, HPos::Left, VPos::Top),
            (-8, -12, HPos::Right, VPos::Bottom),
            (-8, 12, HPos::Right, VPos::Top),
        ];
        let boxed = |&(dx, dy, hp, vp): &(i32, i32, HPos, VPos)| {
            let x0 = if matches!(hp, HPos::Left) {
                px + dx
            } else {
                px + dx - w
            };
            let y0 = if matches!(vp, VPos::Top) {
                py + dy
            } else {
                py + dy - h
            };
            [x0, y0, x0 + w, y0 + h]
        };
        let cost = |b: &[i32; 4]| {
            let out = !(b[0] >= xr.start && b[2] <= xr.end && b[1] >= yr.start && b[3] <= yr.end);
            let labels = placed.iter().filter(|o| overlap(b, o)).count();
            let others = marks
                .iter()
                .enumerate()
                .filter(|&(j, &(x, y))| j != i && overlap(b, &[x - 6, y - 6, x + 6, y + 6]))
                .count();
            (out, labels + others)
        };
        // the least cost; ties: the first side
        let side = sides
            .iter()
            .min_by_key(|s| cost(&boxed(s)))
            .expect("eight sides");
        placed.push(boxed(side));
        let (dx, dy, hp, vp) = *side;
        let style = (FAMILY, 12).into_font().color(&BLACK).pos(Pos::new(hp, vp));
        texts.push(EmptyElement::at(at(p)) + Text::new(p.label.clone(), (dx, dy), style));
    }
    chart.draw_series(texts).map_err(err)?;
    legend(&mut chart, SeriesLabelPosition::LowerRight)
}

// ---- the figures qsim draws, from plain data ----

/// Metric against a swept parameter: one line per series, with its 90 %
/// interval band.
pub fn metric_lines(chart: LineChart) -> Figure {
    Figure::single(Panel::Lines(LineChart {
        markers: true,
        ..chart
    }))
}

/// A heatmap over two swept parameters.
pub fn heatmap(h: Heatmap) -> Figure {
    let w = (160 + 90 * h.x_values.len() as u32).clamp(WIDTH, 2400);
    let hh = (140 + 40 * h.y_values.len() as u32).clamp(HEIGHT, 2000);
    Figure {
        width: w,
        height: hh,
        cols: 1,
        panels: vec![Panel::Heatmap(h)],
    }
}

/// Latency CDFs, one per policy: `series` are (name, [(latency s, fraction
/// of rows ≤ it)]). The x axis is logarithmic when latencies span more than
/// a factor of 20 — up to the axis' robust end ([`robust`]: a few far
/// latencies are drawn at the edge and do not decide the scale).
pub fn latency_cdf(title: &str, x_label: &str, series: Vec<(String, Vec<(f64, f64)>)>) -> Figure {
    let xs: Vec<f64> = series
        .iter()
        .flat_map(|s| s.1.iter().map(|p| p.0))
        .filter(|x| *x > 0.0 && x.is_finite())
        .collect();
    let (lo, hi) = extent(xs.iter().copied());
    let hi = robust::cut(&xs, lo).unwrap_or(hi);
    let log = lo.is_finite() && hi / lo > 20.0;
    Figure::single(Panel::Lines(LineChart {
        title: title.into(),
        x_label: x_label.into(),
        y_label: "fraction of requests ≤ latency".into(),
        x_axis: if log { XAxis::Log } else { XAxis::Linear },
        series: series
            .into_iter()
            .map(|(name, points)| Series {
                name,
                points,
                band: vec![],
            })
            .collect(),
        hlines: vec![],
        markers: false,
        y_range: Some((0.0, 1.02)),
        legend: Legend::UpperLeft,
    }))
}

/// The server over time, one scenario per series.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ServerSeries {
    pub name: String,
    /// Sample times (s) and, at each, the requests waiting for the engine,
    /// and the median E2E (s) of the requests finished since the previous
    /// sample (NaN if none finished).
    pub t_s: Vec<f64>,
    pub waiting: Vec<f64>,
    pub e2e_p50_s: Vec<f64>,
}

/// Two panels sharing the time axis: the waiting queue, and E2E.
pub fn server_over_time(title: &str, scenarios: &[ServerSeries]) -> Figure {
    // one panel: `what` of every scenario over time
    let panel = |what: &str, y_label: &str, f: &dyn Fn(&ServerSeries) -> &Vec<f64>| {
        let series = scenarios
            .iter()
            .map(|s| Series {
                name: s.name.clone(),
                points: s.t_s.iter().copied().zip(f(s).iter().copied()).collect(),
                band: vec![],
            })
            .collect();
        Panel::Lines(LineChart {
            title: format!("{title}: {what}"),
            x_label: "time (s)".into(),
            y_label: y_label.into(),
            series,
            ..Default::default()
        })
    };
    let queue = panel("requests waiting", "waiting queue (requests)", &|s| {
        &s.waiting
    });
    let e2e = panel(
        "E2E p50 of requests finished in each interval",
        "E2E p50 (s)",
        &|s| &s.e2e_p50_s,
    );
    Figure::grid(vec![queue, e2e], 1, WIDTH, 460)
}

/// One consumer of a plan scenario: its admitted units per minute and its
/// floor (units per minute; None if it has none).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PlanConsumer {
    pub name: String,
    pub admitted_per_min: Vec<f64>,
    /// Per minute, the 90 % interval over seeds (empty: no band).
    pub band: Vec<(f64, f64)>,
    pub floor: Option<f64>,
}

/// One scenario of a plan.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PlanScenario {
    pub name: String,
    pub consumers: Vec<PlanConsumer>,
}

/// The plan: one panel per scenario (two columns), each consumer's admitted
/// rate per minute with its floor dashed in its colour, and the
/// deployment's capacity as a black dashed line. `unit` names the capacity
/// unit ("requests" or "tokens").
pub fn plan_minutes(title: &str, unit: &str, capacity: f64, scenarios: &[PlanScenario]) -> Figure {
    let panels = scenarios
        .iter()
        .map(|s| {
            let mut hlines = vec![HLine {
                label: format!("capacity {} {unit}/min", fmt_num(capacity)),
                y: capacity,
                series: None,
            }];
            for (i, c) in s.consumers.iter().enumerate() {
                if let Some(f) = c.floor {
                    // one label for the consumers sharing a floor
                    let same: Vec<&str> = s
                        .consumers
                        .iter()
                        .filter(|o| o.floor == Some(f))
                        .map(|o| o.name.as_str())
                        .collect();
                    let first = same.first() == Some(&c.name.as_str());
                    hlines.push(HLine {
                        label: if first {
                            format!("{} floor {}", same.join(", "), fmt_num(f))
                        } else {
                            String::new()
                        },
                        y: f,
                        series: Some(i),
                    });
                }
            }
            Panel::Lines(LineChart {
                title: format!("{title}: {}", s.name),
                x_label: "minute".into(),
                y_label: format!("admitted ({unit}/min)"),
                series: s
                    .consumers
                    .iter()
                    .map(|c| Series {
                        name: c.name.clone(),
                        points: c
                            .admitted_per_min
                            .iter()
                            .enumerate()
                            .map(|(m, &v)| (m as f64 + 1.0, v))
                            .collect(),
                        band: c
                            .band
                            .iter()
                            .enumerate()
                            .map(|(m, &(lo, hi))| (m as f64 + 1.0, lo, hi))
                            .collect(),
                    })
                    .collect(),
                hlines,
                markers: true,
                ..Default::default()
            })
        })
        .collect();
    Figure::grid(panels, 2, 760, 440)
}

/// The Pareto scatter of configurations: elapsed (x) against p95 latency
/// (y), both minimised, the front highlighted.
pub fn pareto(title: &str, x_label: &str, y_label: &str, points: Vec<ParetoPoint>) -> Figure {
    Figure::single(Panel::Pareto(Pareto {
        title: title.into(),
        x_label: x_label.into(),
        y_label: y_label.into(),
        points,
    }))
}

/// Prediction against observation (`qsim compare`): one row per metric,
/// its height growing with the rows.
pub fn forest(f: Forest) -> Figure {
    let h = (120 + 34 * f.rows.len() as u32).clamp(HEIGHT / 2, 2400);
    Figure {
        width: WIDTH,
        height: h,
        cols: 1,
        panels: vec![Panel::Forest(f)],
    }
}

/// Scatters side by side (two columns), each panel 760 × 560.
pub fn scatter_figure(panels: Vec<scatter::Scatter>) -> Figure {
    Figure::grid(
        panels.into_iter().map(Panel::Scatter).collect(),
        2,
        760,
        560,
    )
}
