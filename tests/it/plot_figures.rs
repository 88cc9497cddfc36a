//! (qsim-plot) Every figure type drawn as PNG and SVG from plain data, and checked: a
//! valid PNG/SVG of the stated size, with the stated number of series.

use qsim_plot::check::{
    png_palette, png_size, svg_circles, svg_filled_rects, svg_legend, svg_series, svg_size,
};
use qsim_plot::*;
use std::path::Path;

/// Draw `f` as `name.png` and `name.svg` in `dir`; return the SVG text
/// after checking both files' sizes and that the PNG shows exactly the
/// palette colours `colors`.
fn draw(dir: &Path, name: &str, f: &Figure, colors: &[usize]) -> String {
    let png = dir.join(format!("{name}.png"));
    let svg = dir.join(format!("{name}.svg"));
    f.save(&png).unwrap();
    f.save(&svg).unwrap();
    let bytes = std::fs::read(&png).unwrap();
    assert_eq!(
        png_size(&bytes),
        Some((f.width, f.height)),
        "{name}.png header"
    );
    let (size, seen) = png_palette(&bytes).unwrap();
    assert_eq!(size, (f.width, f.height));
    assert_eq!(seen, colors, "{name}.png: series colours shown");
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(
        text.trim_end().ends_with("</svg>"),
        "{name}.svg is complete"
    );
    assert_eq!(
        svg_size(&text),
        Some((f.width, f.height)),
        "{name}.svg size"
    );
    assert_eq!(f.svg().unwrap(), text, "save and svg() agree");
    text
}

fn band_series(name: &str, k: f64) -> Series {
    Series {
        name: name.into(),
        points: (1..=6).map(|i| (4.0 * i as f64, k * i as f64)).collect(),
        band: (1..=6)
            .map(|i| (4.0 * i as f64, 0.8 * k * i as f64, 1.2 * k * i as f64))
            .collect(),
    }
}

#[test]
fn metric_lines_with_bands() {
    let d = tempfile::tempdir().unwrap();
    for n in [1usize, 3, 7] {
        let f = metric_lines(LineChart {
            title: "elapsed vs workers".into(),
            x_label: "workers".into(),
            y_label: "elapsed (s)".into(),
            series: (0..n)
                .map(|i| band_series(&format!("s{i}"), i as f64 + 1.0))
                .collect(),
            ..Default::default()
        });
        let want: Vec<usize> = (0..n).collect();
        let svg = draw(d.path(), &format!("lines{n}"), &f, &want);
        assert_eq!(svg_series(&svg), want);
        assert_eq!(svg_legend(&svg).len(), n);
        assert_eq!(svg.matches("<polygon").count(), n, "one band per series");
        assert_eq!((WIDTH, HEIGHT), (f.width, f.height));
    }
}

#[test]
fn latency_cdfs_per_policy() {
    let d = tempfile::tempdir().unwrap();
    let series: Vec<(String, Vec<(f64, f64)>)> = (0..4)
        .map(|i| {
            let pts = (0..=100)
                .map(|q| {
                    (
                        0.5 * (i + 1) as f64 * (1.0 + q as f64 / 10.0),
                        q as f64 / 100.0,
                    )
                })
                .collect();
            (format!("policy-{i}"), pts)
        })
        .collect();
    let f = latency_cdf("CDF", "row latency (s)", series);
    let svg = draw(d.path(), "cdf", &f, &[0, 1, 2, 3]);
    assert_eq!(svg_series(&svg), vec![0, 1, 2, 3]);
    assert_eq!(svg_legend(&svg).len(), 4);
    assert!(svg.contains("fraction of requests"));
}

#[test]
fn heatmap_cells() {
    let d = tempfile::tempdir().unwrap();
    let (nx, ny) = (5usize, 3usize);
    let cells = (0..ny)
        .map(|r| {
            (0..nx)
                .map(|c| (r + c != 5).then_some((r * nx + c) as f64))
                .collect()
        })
        .collect();
    let f = heatmap(Heatmap {
        title: "exp".into(),
        x_label: "workers".into(),
        y_label: "max_tokens".into(),
        value_label: "elapsed (s)".into(),
        x_values: (0..nx).map(|i| (8 * (i + 1)).to_string()).collect(),
        y_values: (0..ny).map(|i| (128 * (i + 1)).to_string()).collect(),
        cells,
        decimals: 1,
    });
    let svg = draw(d.path(), "heat", &f, &[]);
    assert_eq!(svg_filled_rects(&svg), nx * ny, "one rectangle per cell");
    assert!(svg_series(&svg).is_empty());
    // every value is written in its cell, the missing one as a dash
    assert!(svg.contains("\n7.0\n"), "cell text");
    assert!(svg.contains("\n–\n"), "missing cell");
}

#[test]
fn server_queue_and_e2e_over_time() {
    let d = tempfile::tempdir().unwrap();
    let sc: Vec<ServerSeries> = (0..3)
        .map(|i| ServerSeries {
            name: format!("scenario-{i}"),
            t_s: (1..=50).map(|t| t as f64).collect(),
            waiting: (1..=50).map(|t| (t * i) as f64).collect(),
            e2e_p50_s: (1..=50)
                .map(|t| {
                    if t == 7 {
                        f64::NAN
                    } else {
                        1.0 + (t * i) as f64 / 10.0
                    }
                })
                .collect(),
        })
        .collect();
    let f = server_over_time("seed 1", &sc);
    let svg = draw(d.path(), "server", &f, &[0, 1, 2]);
    // two panels, three scenarios each
    assert_eq!(svg_series(&svg), vec![0, 1, 2, 0, 1, 2]);
    assert_eq!(svg_legend(&svg).len(), 6);
    assert_eq!((f.width, f.height), (WIDTH, 2 * 460));
}

#[test]
fn plan_admitted_floors_and_capacity() {
    let d = tempfile::tempdir().unwrap();
    let consumers = |n: usize| -> Vec<PlanConsumer> {
        (0..n)
            .map(|i| PlanConsumer {
                name: format!("C{i}"),
                admitted_per_min: (0..5).map(|m| 100.0 * (i + 1) as f64 + m as f64).collect(),
                band: (0..5)
                    .map(|m| (90.0 + m as f64, 110.0 + m as f64))
                    .collect(),
                floor: (i < 2).then_some(300.0),
            })
            .collect()
    };
    let sc: Vec<PlanScenario> = ["normal", "heavy", "burst"]
        .iter()
        .map(|n| PlanScenario {
            name: n.to_string(),
            consumers: consumers(4),
        })
        .collect();
    let f = plan_minutes("seed 1", "requests", 1000.0, &sc);
    assert_eq!((f.width, f.height), (2 * 760, 2 * 440));
    let svg = draw(d.path(), "plan", &f, &[0, 1, 2, 3]);
    let want: Vec<usize> = [0, 1, 2, 3].iter().cycle().take(12).copied().collect();
    assert_eq!(svg_series(&svg), want, "4 consumers in each of 3 panels");
    assert_eq!(svg_legend(&svg).len(), 12);
    assert_eq!(svg.matches("capacity 1000 requests/min").count(), 3);
    assert_eq!(
        svg.matches("C0, C1 floor 300").count(),
        3,
        "a shared floor labelled once per panel"
    );
}

#[test]
fn pareto_front_highlighted() {
    let d = tempfile::tempdir().unwrap();
    // even indices: a trade-off curve (the front); odd: each dominated by
    // the point before it
    let pts: Vec<ParetoPoint> = (0..30)
        .map(|i| {
            let k = (i / 2) as f64;
            let (x, y) = (10.0 + k, 5.0 + 60.0 / (1.0 + k));
            let d = if i % 2 == 1 { 1.5 } else { 0.0 };
            ParetoPoint {
                label: format!("cfg{i}"),
                x: x + d,
                y: y + d,
            }
        })
        .collect();
    let front = pareto_front(&pts);
    assert_eq!(front, (0..30).step_by(2).collect::<Vec<_>>());
    for &i in &front {
        let p = &pts[i];
        assert!(!pts
            .iter()
            .any(|q| q.x <= p.x && q.y <= p.y && (q.x < p.x || q.y < p.y)));
    }
    let f = pareto(
        "elapsed vs p95",
        "elapsed (s)",
        "latency p95 (s)",
        pts.clone(),
    );
    let svg = draw(d.path(), "pareto", &f, &[0]);
    assert_eq!(svg_series(&svg), vec![0], "the front is one line");
    assert_eq!(svg_legend(&svg).len(), 2, "all points, and the front");
    assert_eq!(svg_circles(&svg, DOMINATED), pts.len());
    assert_eq!(svg_circles(&svg, PALETTE[0]), front.len());
    for (k, &i) in front.iter().enumerate() {
        let labelled = svg.contains(&format!("\ncfg{i}\n"));
        assert_eq!(labelled, k < PARETO_LABELS, "front point {i} labelled");
    }
    assert!(
        !svg.contains("\ncfg1\n"),
        "dominated points are not labelled"
    );
}

#[test]
fn bad_extension_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let f = pareto("p", "x", "y", vec![]);
    assert!(f.save(&d.path().join("x.jpg")).is_err());
    assert!(!d.path().join("x.jpg").exists());
}

/// Every legend entry's swatch is the colour of the line it names, in every
/// figure kind with a legend; a floor's label is in the colour of its
/// dashes (the reference ink when several consumers share the floor, whose
/// dashes then show each one's colour). Issue 37: the label of a floor two
/// consumers shared was in the first one's colour, over a line drawn in
/// the second's.
#[test]
fn legends_match_their_lines_in_every_figure_kind() {
    use qsim_plot::check::{svg_dash_rows, svg_legend_entries, svg_series_lines, svg_texts};
    let hex = |c: (u8, u8, u8)| format!("#{:02X}{:02X}{:02X}", c.0, c.1, c.2);
    // (name, points) of every series: each legend entry names one, and a
    // line of the entry's colour has that series' number of points
    let lines_match = |what: &str, svg: &str, series: &[(String, usize)]| {
        let legend = svg_legend_entries(svg);
        let lines = svg_series_lines(svg);
        assert!(!legend.is_empty(), "{what}: a legend");
        for (label, colour) in &legend {
            let Some((_, n)) = series.iter().find(|s| &s.0 == label) else {
                continue;
            };
            assert!(
                lines.iter().any(|l| &l.0 == colour && l.1 == *n),
                "{what}: legend {label} in {colour}, but no line of {n} points in that colour: {lines:?}"
            );
            assert!(
                !lines.iter().any(|l| &l.0 != colour && l.1 == *n),
                "{what}: {label}'s line ({n} points) is drawn in another colour than its legend's {colour}: {lines:?}"
            );
        }
        legend
    };
    // line charts: series of 3, 4, 5, … points
    let series: Vec<Series> = (0..4)
        .map(|i| Series {
            name: format!("s{i}"),
            points: (0..3 + i)
                .map(|k| (k as f64, (k * (i + 1)) as f64))
                .collect(),
            band: vec![],
        })
        .collect();
    let named: Vec<(String, usize)> = series
        .iter()
        .map(|s| (s.name.clone(), s.points.len()))
        .collect();
    let f = metric_lines(LineChart {
        title: "lines".into(),
        series: series.clone(),
        ..Default::default()
    });
    assert_eq!(lines_match("lines", &f.svg().unwrap(), &named).len(), 4);
    let cdf = latency_cdf(
        "cdf",
        "latency (s)",
        series
            .iter()
            .map(|s| (s.name.clone(), s.points.clone()))
            .collect(),
    );
    assert_eq!(lines_match("cdf", &cdf.svg().unwrap(), &named).len(), 4);
    let sc: Vec<ServerSeries> = (0..3)
        .map(|i| ServerSeries {
            name: format!("s{i}"),
            t_s: (0..3 + i).map(|t| t as f64).collect(),
            waiting: (0..3 + i).map(|t| t as f64).collect(),
            e2e_p50_s: (0..3 + i).map(|t| 1.0 + t as f64).collect(),
        })
        .collect();
    let server = server_over_time("server", &sc).svg().unwrap();
    assert_eq!(lines_match("server", &server, &named).len(), 6);
    // the plan: A and C share a floor of 300, B has 200, dev none
    let floors = [Some(300.0), Some(200.0), Some(300.0), None];
    let consumers: Vec<PlanConsumer> = ["A", "B", "C", "dev"]
        .iter()
        .enumerate()
        .map(|(i, n)| PlanConsumer {
            name: n.to_string(),
            admitted_per_min: (0..2 + i).map(|m| 100.0 + (10 * m * i) as f64).collect(),
            band: vec![],
            floor: floors[i],
        })
        .collect();
    let plan_named: Vec<(String, usize)> = consumers
        .iter()
        .map(|c| (c.name.clone(), c.admitted_per_min.len()))
        .collect();
    let plan = plan_minutes(
        "plan",
        "requests",
        1000.0,
        &[PlanScenario {
            name: "heavy".into(),
            consumers,
        }],
    )
    .svg()
    .unwrap();
    let legend = lines_match("plan", &plan, &plan_named);
    let colour_of = |name: &str| {
        legend
            .iter()
            .find(|e| e.0 == name)
            .map(|e| e.1.clone())
            .unwrap()
    };
    let rows = svg_dash_rows(&plan);
    let labels: Vec<_> = svg_texts(&plan)
        .into_iter()
        .filter(|t| t.0.contains(" floor "))
        .collect();
    assert_eq!(labels.len(), 2, "one label per floor height: {labels:?}");
    for (text, fill, _, y) in &labels {
        let names: Vec<&str> = text.split(" floor ").next().unwrap().split(", ").collect();
        let (_, dashes) = rows
            .iter()
            .find(|r| r.0 as f64 == *y)
            .unwrap_or_else(|| panic!("no dashes at {text:?}'s height {y}: {rows:?}"));
        let mut want: Vec<String> = names.iter().map(|n| colour_of(n)).collect();
        want.sort();
        let mut got = dashes.clone();
        got.sort();
        assert_eq!(got, want, "{text}: its dashes show each consumer's colour");
        let ink = if names.len() == 1 {
            want[0].clone()
        } else {
            hex(REFERENCE)
        };
        assert_eq!(fill, &ink, "{text}: label colour");
    }
    // the Pareto scatter: the front's line in the front's legend colour
    let pts: Vec<ParetoPoint> = (0..6)
        .map(|i| ParetoPoint {
            label: format!("p{i}"),
            x: i as f64,
            y: 10.0 - i as f64 + (i % 2) as f64 * 3.0,
        })
        .collect();
    let front = pareto_front(&pts).len();
    let svg = pareto("p", "x", "y", pts).svg().unwrap();
    let legend = svg_legend_entries(&svg);
    let lines = svg_series_lines(&svg);
    let entry = legend
        .iter()
        .find(|e| e.0.starts_with("Pareto front"))
        .unwrap();
    assert_eq!(lines, vec![(entry.1.clone(), front)]);
    let all = legend
        .iter()
        .find(|e| e.0.starts_with("all configurations"))
        .unwrap();
    assert_eq!(all.1, hex(DOMINATED));
    // the labelled scatter: each mark's legend colour is its points' colour
    let svg = scatter_figure(vec![scatter::Scatter {
        title: "s".into(),
        x_label: "x".into(),
        y_label: "y".into(),
        points: vec![
            scatter::ScatterPoint {
                label: "a".into(),
                x: 1.0,
                y: 1.0,
                mark: scatter::Mark::Meets,
            },
            scatter::ScatterPoint {
                label: "b".into(),
                x: 2.0,
                y: 2.0,
                mark: scatter::Mark::Misses,
            },
        ],
        vline: None,
    }])
    .svg()
    .unwrap();
    let legend = svg_legend_entries(&svg);
    for (label, colour) in &legend {
        let c = if label.starts_with("misses") {
            DOMINATED
        } else {
            PALETTE[0]
        };
        assert_eq!(colour, &hex(c), "{label}");
        assert_eq!(svg_circles(&svg, c), 1, "{label}: its point in its colour");
    }
}

/// One far value does not stretch an axis (issue 37: an outlier stretched
/// a latency axis to 4,800 s): the axis ends at the 99th percentile, the
/// points beyond are drawn at the edge as markers pointing outwards, and
/// the caption says so. Data without such outliers keep their full range.
#[test]
fn one_outlier_does_not_stretch_an_axis() {
    use qsim_plot::check::{svg_markers, svg_texts};
    // tick labels: the numbers written on the axes (the title aside)
    let ticks = |svg: &str| -> Vec<f64> {
        svg_texts(svg)
            .into_iter()
            .filter_map(|t| t.0.parse::<f64>().ok())
            .collect()
    };
    // latency CDFs of 30-60 s, one row of one policy at 4,800 s
    let series: Vec<(String, Vec<(f64, f64)>)> = (0..3)
        .map(|i| {
            let mut pts: Vec<(f64, f64)> = (0..=200)
                .map(|q| (30.0 + i as f64 + 30.0 * q as f64 / 200.0, q as f64 / 200.0))
                .collect();
            if i == 1 {
                pts.last_mut().unwrap().0 = 4800.0;
            }
            (format!("policy-{i}"), pts)
        })
        .collect();
    let svg = latency_cdf("CDF", "row latency (s)", series.clone())
        .svg()
        .unwrap();
    let max_tick = ticks(&svg).into_iter().fold(0.0, f64::max);
    assert!(
        max_tick < 100.0,
        "x ticks end near the data, not at 4,800: {max_tick}"
    );
    assert!(!svg.contains("log scale"));
    assert!(
        svg.contains("x axis cut at the 99th percentile") && svg.contains("up to 4800"),
        "the caption says the axis is cut"
    );
    // the policy with the outlier marks it at the edge
    assert!(svg_markers(&svg, PALETTE[1]) >= 1, "the outlier's marker");
    // a server's queue over time with one spike: the y axis is cut
    let sc = vec![ServerSeries {
        name: "s".into(),
        t_s: (1..=240).map(|t| t as f64).collect(),
        waiting: (1..=240)
            .map(|t| if t == 100 { 4800.0 } else { (t % 7) as f64 })
            .collect(),
        e2e_p50_s: (1..=240).map(|t| 1.0 + (t % 5) as f64 / 10.0).collect(),
    }];
    let svg = server_over_time("seed 1", &sc).svg().unwrap();
    assert!(
        svg.contains("y axis cut at the 99th percentile"),
        "queue panel"
    );
    assert_eq!(svg.matches("axis cut").count(), 1, "only the queue panel");
    assert_eq!(svg_markers(&svg, PALETTE[0]), 1, "the spike's marker");
    // (the time axis runs to 250 s; the queue's ticks stay under 10)
    let t = ticks(&svg);
    assert!(t.iter().all(|&t| t <= 250.0), "{t:?}");
    // the Pareto scatter: one configuration far off in x
    let mut pts: Vec<ParetoPoint> = (0..200)
        .map(|i| ParetoPoint {
            label: format!("c{i}"),
            x: 60.0 + (i % 20) as f64,
            y: 5.0 + (i / 20) as f64,
        })
        .collect();
    pts[7].x = 4800.0;
    let svg = pareto("p", "elapsed (s)", "p95 (s)", pts).svg().unwrap();
    assert!(svg.contains("x axis cut at the 99th percentile"));
    assert!(svg_markers(&svg, DOMINATED) >= 1);
    assert!(ticks(&svg).into_iter().all(|t| t < 100.0));
    // no outlier, no cut: the CDFs without the far row, a sweep's few
    // points, the plan's minutes
    let mut calm = series;
    calm[1].1.last_mut().unwrap().0 = 61.0;
    let svg = latency_cdf("CDF", "row latency (s)", calm).svg().unwrap();
    assert!(!svg.contains("axis cut"));
    let f = metric_lines(LineChart {
        title: "elapsed vs workers".into(),
        series: vec![Series {
            name: "s".into(),
            points: vec![(1.0, 4800.0), (2.0, 2400.0), (4.0, 1200.0), (8.0, 600.0)],
            band: vec![],
        }],
        ..Default::default()
    });
    assert!(
        !f.svg().unwrap().contains("axis cut"),
        "a sweep's points are all data"
    );
}
