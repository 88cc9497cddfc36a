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
