//! `--plot DIR` and `--html FILE` on `qsim run`, `qsim sweep` and `qsim
//! plan`: the files each writes, checked as valid PNG/SVG of the stated
//! size with the stated number of series; the report on stdout unchanged;
//! bad targets refused before any run.

use crate::common::qsim;
use qsim_plot::check::{elements, png_palette, svg_filled_rects, svg_series, svg_size};
use std::path::Path;

/// Run qsim with `args`, expecting success; its stdout.
fn ok(args: &[&str]) -> String {
    let out = qsim().args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Run qsim with `args`, expecting exit 2 with `needle` on stderr.
fn refused(args: &[&str], needle: &str) {
    let out = qsim().args(args).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
    assert!(err.contains(needle), "{args:?}: {err:?} lacks {needle:?}");
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    assert!(out.stdout.is_empty());
}

fn files(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// Check `NAME.png` and `NAME.svg` in `dir`: both `w × h`, the SVG's
/// series lines are `series` (palette indices, panel after panel), and the
/// PNG shows exactly the distinct colours of those series.
fn figure(dir: &Path, name: &str, (w, h): (u32, u32), series: &[usize]) -> String {
    let svg = std::fs::read_to_string(dir.join(format!("{name}.svg"))).unwrap();
    assert_eq!(svg_size(&svg), Some((w, h)), "{name}.svg");
    assert_eq!(svg_series(&svg), series, "{name}.svg series");
    let png = std::fs::read(dir.join(format!("{name}.png"))).unwrap();
    let (size, seen) = png_palette(&png).unwrap();
    assert_eq!(size, (w, h), "{name}.png");
    let mut want = series.to_vec();
    want.sort_unstable();
    want.dedup();
    assert_eq!(seen, want, "{name}.png colours");
    svg
}

/// A self-contained page: no scripts, nothing loaded from elsewhere.
fn self_contained(html: &str) {
    assert!(html.starts_with("<!DOCTYPE html>"));
    assert!(!html.to_lowercase().contains("<script"));
    for attr in ["src=", "href="] {
        for (i, _) in html.match_indices(attr) {
            let v = &html[i + attr.len()..];
            assert!(v.starts_with("\"data:"), "external resource: {}", &v[..40]);
        }
    }
    assert!(!html.contains("url("), "no CSS resources");
}

#[test]
fn run_hosted_latency_cdf() {
    let d = tempfile::tempdir().unwrap();
    let plots = d.path().join("plots");
    let html = d.path().join("run.html");
    let base = ["run", "experiments/fmapi-pacing.toml", "--seeds", "2"];
    let plain = ok(&base);
    let mut args = base.to_vec();
    let (p, h) = (plots.to_str().unwrap(), html.to_str().unwrap());
    args.extend(["--plot", p, "--html", h]);
    assert_eq!(ok(&args), plain, "stdout unchanged by --plot/--html");
    assert_eq!(files(&plots), ["latency-cdf.png", "latency-cdf.svg"]);
    // three experiments: direct, backoff, ai_query
    let svg = figure(&plots, "latency-cdf", (960, 600), &[0, 1, 2]);
    for name in ["exp1-direct", "exp2-backoff", "exp3-ai-query"] {
        assert!(svg.contains(name));
    }
    let page = std::fs::read_to_string(&html).unwrap();
    self_contained(&page);
    assert_eq!(page.matches("<svg").count(), 1);
    assert!(page.contains("<table>") && page.contains("latency p95 (s)"));
    assert!(page.contains("exp2-backoff"));
    // the same again: byte-identical figures
    let again = d.path().join("again");
    let mut args = base.to_vec();
    args.extend(["--plot", again.to_str().unwrap()]);
    ok(&args);
    for f in files(&plots) {
        assert_eq!(
            std::fs::read(plots.join(&f)).unwrap(),
            std::fs::read(again.join(&f)).unwrap(),
            "{f}"
        );
    }
}

#[test]
fn run_server_queue_and_e2e() {
    let d = tempfile::tempdir().unwrap();
    let plots = d.path().join("p");
    let p = plots.to_str().unwrap();
    let base = [
        "run",
        "experiments/nim-load.toml",
        "--set",
        "duration_s=120",
    ];
    let plain = ok(&base);
    let mut args = base.to_vec();
    args.extend(["--plot", p]);
    assert_eq!(ok(&args), plain);
    assert_eq!(
        files(&plots),
        [
            "e2e-cdf.png",
            "e2e-cdf.svg",
            "server-over-time.png",
            "server-over-time.svg"
        ]
    );
    // seven scenarios; two panels (queue, E2E)
    let seven: Vec<usize> = (0..7).collect();
    let two: Vec<usize> = seven.iter().chain(&seven).copied().collect();
    let svg = figure(&plots, "server-over-time", (960, 920), &two);
    // the queue is sampled at 240 fixed times (every 0.5 s of 120 s)
    let lines = elements(&svg, "polyline");
    let first = lines
        .iter()
        .find(|e| e.contains(&("stroke-width", "2")))
        .unwrap();
    let pts = first.iter().find(|(n, _)| *n == "points").unwrap().1;
    assert_eq!(pts.split_whitespace().count(), 240);
    figure(&plots, "e2e-cdf", (960, 600), &seven);
}

#[test]
fn plan_admitted_per_minute() {
    let d = tempfile::tempdir().unwrap();
    let plots = d.path().join("p");
    let html = d.path().join("plan.html");
    let plain = ok(&["plan", "--seeds", "2"]);
    let (p, h) = (plots.to_str().unwrap(), html.to_str().unwrap());
    let out = ok(&["plan", "--seeds", "2", "--plot", p, "--html", h]);
    assert_eq!(out, plain);
    assert_eq!(files(&plots), ["plan-admitted.png", "plan-admitted.svg"]);
    // six scenarios (two columns, three rows of 760 × 440), four consumers each
    let four: Vec<usize> = (0..4).cycle().take(24).collect();
    let svg = figure(&plots, "plan-admitted", (1520, 1320), &four);
    assert_eq!(svg.matches("capacity 1000 requests/min").count(), 6);
    let page = std::fs::read_to_string(&html).unwrap();
    self_contained(&page);
    assert!(page.contains("heavy/A"), "the per-consumer table");
    // `qsim run` on the shared file draws the same figure
    let again = d.path().join("run");
    ok(&[
        "run",
        "experiments/shared-deployment.toml",
        "--seeds",
        "2",
        "--plot",
        again.to_str().unwrap(),
    ]);
    assert_eq!(
        std::fs::read(plots.join("plan-admitted.svg")).unwrap(),
        std::fs::read(again.join("plan-admitted.svg")).unwrap()
    );
}

#[test]
fn sweep_lines_and_heatmaps() {
    let d = tempfile::tempdir().unwrap();
    let plots = d.path().join("p");
    let html = d.path().join("sweep.html");
    let base = [
        "sweep",
        "experiments/fmapi-pacing.toml",
        "--vary",
        "workers=4,8,16",
        "--vary",
        "max_tokens=128,256",
        "--seeds",
        "2",
    ];
    let plain = ok(&base);
    let mut args = base.to_vec();
    let (p, h) = (plots.to_str().unwrap(), html.to_str().unwrap());
    args.extend(["--plot", p, "--html", h, "--threads", "2"]);
    assert_eq!(ok(&args), plain);
    let mut want = Vec::new();
    for m in ["elapsed-s", "latency-p95-s"] {
        for e in ["exp1-direct", "exp2-backoff", "exp3-ai-query"] {
            want.push(format!("heatmap-{m}-{e}.png"));
            want.push(format!("heatmap-{m}-{e}.svg"));
        }
    }
    for m in ["elapsed-s", "latency-p95-s", "ok", "rejected-429"] {
        want.push(format!("sweep-{m}.png"));
        want.push(format!("sweep-{m}.svg"));
    }
    want.sort();
    assert_eq!(files(&plots), want);
    // 3 experiments × 2 max_tokens = 6 lines over workers
    let six: Vec<usize> = (0..6).collect();
    for m in ["elapsed-s", "latency-p95-s", "ok", "rejected-429"] {
        let svg = figure(&plots, &format!("sweep-{m}"), (960, 600), &six);
        assert_eq!(svg.matches("<polygon").count(), 6, "90 % bands");
    }
    // a heatmap: workers (3) × max_tokens (2) cells
    let svg = figure(&plots, "heatmap-elapsed-s-exp2-backoff", (960, 600), &[]);
    assert_eq!(svg_filled_rects(&svg), 6);
    let page = std::fs::read_to_string(&html).unwrap();
    self_contained(&page);
    assert_eq!(page.matches("<svg").count(), 10);
    // the CSV output takes plots too, and the figures do not depend on threads
    let csv_dir = d.path().join("csv");
    let mut args = base.to_vec();
    args.extend([
        "--format",
        "csv",
        "--threads",
        "1",
        "--plot",
        csv_dir.to_str().unwrap(),
    ]);
    ok(&args);
    for f in files(&plots) {
        assert_eq!(
            std::fs::read(plots.join(&f)).unwrap(),
            std::fs::read(csv_dir.join(&f)).unwrap(),
            "{f}"
        );
    }
}

#[test]
fn bad_targets_are_refused_before_running() {
    let d = tempfile::tempdir().unwrap();
    let full = d.path().join("full");
    std::fs::create_dir(&full).unwrap();
    std::fs::write(full.join("keep.txt"), "x").unwrap();
    let html = d.path().join("r.html");
    let (f, h) = (full.to_str().unwrap(), html.to_str().unwrap());
    let run = ["run", "experiments/fmapi-pacing.toml"];
    let with = |extra: &[&str]| -> Vec<String> {
        run.iter().chain(extra).map(|s| s.to_string()).collect()
    };
    let refuse = |extra: &[&str], needle: &str| {
        let a = with(extra);
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        refused(&a, needle);
    };
    // a non-empty directory: only with --force; nothing written
    refuse(&["--plot", f, "--html", h], "is not empty; add --force");
    assert_eq!(files(&full), ["keep.txt"]);
    assert!(!html.exists());
    // a file where the directory should be
    let file = full.join("keep.txt");
    refuse(&["--plot", file.to_str().unwrap()], "is not a directory");
    // a missing parent
    let deep = d.path().join("no/such/dir");
    refuse(&["--plot", deep.to_str().unwrap()], "parent directory");
    // an existing --html file: only with --force
    std::fs::write(&html, "old").unwrap();
    refuse(&["--html", h], "--html");
    assert_eq!(std::fs::read_to_string(&html).unwrap(), "old");
    // plots need the whole grid
    refused(
        &[
            "sweep",
            "experiments/fmapi-pacing.toml",
            "--vary",
            "workers=4,8",
            "--shard",
            "0/2",
            "--format",
            "csv",
            "--plot",
            d.path().join("s").to_str().unwrap(),
        ],
        "--shard",
    );
    assert!(!d.path().join("s").exists());
    // with --force: written into the non-empty directory, the other file kept
    let mut a = with(&["--plot", f, "--html", h, "--force"]);
    a.push("--seeds=1".into());
    let a: Vec<&str> = a.iter().map(String::as_str).collect();
    ok(&a);
    assert_eq!(
        files(&full),
        ["keep.txt", "latency-cdf.png", "latency-cdf.svg"]
    );
    assert!(std::fs::read_to_string(&html).unwrap().contains("<svg"));
}
