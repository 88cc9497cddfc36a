//! The HTML reports of `qsim run`, `qsim sweep` and `qsim plan` opened in
//! headless Chromium (Debian's, installed by scripts/plot-deps.sh): the page
//! renders (a screenshot of the window's size showing the plots' series
//! colours) and logs nothing to the console. A missing Chromium fails the
//! test; it is never skipped.

use assert_cmd::Command;
use qsim_plot::check::png_palette;
use std::path::{Path, PathBuf};

const WINDOW: (u32, u32) = (1280, 2400);

fn chromium() -> PathBuf {
    let p = std::env::var_os("QSIM_CHROMIUM")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/chromium"));
    assert!(
        p.is_file(),
        "{} not found: scripts/plot-deps.sh installs Chromium (apt-get install chromium)",
        p.display()
    );
    p
}

/// Open `page` headless; return the console lines Chromium logged and the
/// screenshot's bytes.
fn open(page: &Path, dir: &Path) -> (Vec<String>, Vec<u8>) {
    let profile = tempfile::tempdir_in(dir).unwrap();
    let shot = dir.join(format!(
        "{}.png",
        page.file_stem().unwrap().to_string_lossy()
    ));
    let out = std::process::Command::new("timeout")
        .arg("120")
        .arg(chromium())
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            "--enable-logging=stderr",
            "--v=0",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg(format!("--window-size={},{}", WINDOW.0, WINDOW.1))
        .arg(format!("--screenshot={}", shot.display()))
        .arg(format!("file://{}", page.canonicalize().unwrap().display()))
        .output()
        .expect("run chromium");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "chromium failed: {err}");
    let console = err
        .lines()
        .filter(|l| l.contains(":CONSOLE"))
        .map(str::to_string)
        .collect();
    let png = std::fs::read(&shot).unwrap_or_else(|e| panic!("no screenshot ({e}): {err}"));
    (console, png)
}

fn qsim(args: &[&str]) {
    let out = Command::cargo_bin("qsim")
        .unwrap()
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The capture works: a page that logs an error is caught.
#[test]
fn console_messages_are_caught() {
    crate::live!(Browser);
    let d = tempfile::tempdir().unwrap();
    let page = d.path().join("bad.html");
    std::fs::write(
        &page,
        "<!DOCTYPE html><html><body><p>x</p>\
         <script>console.error('qsim-marker')</script></body></html>",
    )
    .unwrap();
    let (console, png) = open(&page, d.path());
    assert!(
        console.iter().any(|l| l.contains("qsim-marker")),
        "{console:?}"
    );
    assert_eq!(png_palette(&png).unwrap().0, WINDOW);
}

#[test]
fn reports_render_without_console_errors() {
    crate::live!(Browser);
    let d = tempfile::tempdir().unwrap();
    let page = |n: &str| d.path().join(format!("{n}.html"));
    let (run, sweep, plan) = (page("run"), page("sweep"), page("plan"));
    qsim(&[
        "run",
        "experiments/fmapi-pacing.toml",
        "--seeds",
        "2",
        "--html",
        run.to_str().unwrap(),
    ]);
    qsim(&[
        "sweep",
        "experiments/fmapi-pacing.toml",
        "--vary",
        "workers=4,8,16",
        "--vary",
        "max_tokens=128,256",
        "--html",
        sweep.to_str().unwrap(),
    ]);
    qsim(&["plan", "--html", plan.to_str().unwrap()]);
    // series colours each page's first screen must show: 3 experiments;
    // 6 sweep lines; 4 consumers
    for (p, colours) in [
        (&run, vec![0, 1, 2]),
        (&sweep, (0..6).collect()),
        (&plan, vec![0, 1, 2, 3]),
    ] {
        let (console, png) = open(p, d.path());
        assert!(console.is_empty(), "{}: {console:?}", p.display());
        let (size, seen) = png_palette(&png).unwrap();
        assert_eq!(size, WINDOW, "{}", p.display());
        for c in &colours {
            assert!(
                seen.contains(c),
                "{}: colour {c} not on screen ({seen:?})",
                p.display()
            );
        }
    }
}

/// A window's width for [`fits`]: a laptop's browser.
const NARROW: u32 = 1300;

/// A script appended to a copy of a report (the reports have none): it
/// writes, for every table, whether it runs past the page's edge or
/// scrolls inside its box, into a `<pre id="qsim-fit">` that `--dump-dom`
/// prints.
const PROBE: &str = "<script>addEventListener('load',()=>{\
const W=document.documentElement.clientWidth;const o=[];\
if(document.documentElement.scrollWidth>W)o.push('page '+document.documentElement.scrollWidth);\
document.querySelectorAll('table').forEach((t,i)=>{const r=t.getBoundingClientRect();\
const p=t.parentElement;if(r.right>W||p.scrollWidth>p.clientWidth)\
o.push('table '+i+' of '+t.rows[0].cells.length+' columns: '+Math.round(r.width)+' px wide, its box '+p.clientWidth+' px');});\
const e=document.createElement('pre');e.id='qsim-fit';e.textContent='tables '+document.querySelectorAll('table').length+'; '+o.join('; ');\
document.body.appendChild(e);});</script>";

/// Open a copy of `page` with [`PROBE`] in a window [`NARROW`] px wide:
/// the number of tables and the ones that do not fit.
fn fits(page: &Path, dir: &Path) -> (usize, String) {
    let html = std::fs::read_to_string(page).unwrap();
    assert!(
        !html.contains("<script"),
        "{}: a report has no script",
        page.display()
    );
    let probe = dir.join(format!(
        "probe-{}",
        page.file_name().unwrap().to_string_lossy()
    ));
    std::fs::write(&probe, html.replace("</body>", &format!("{PROBE}</body>"))).unwrap();
    let profile = tempfile::tempdir_in(dir).unwrap();
    let out = std::process::Command::new("timeout")
        .arg("120")
        .arg(chromium())
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--dump-dom",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg(format!("--window-size={NARROW},1000"))
        .arg(format!(
            "file://{}",
            probe.canonicalize().unwrap().display()
        ))
        .output()
        .expect("run chromium");
    let dom = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (_, rest) = dom
        .split_once("<pre id=\"qsim-fit\">tables ")
        .unwrap_or_else(|| panic!("{}: the probe did not run", page.display()));
    let line = &rest[..rest.find("</pre>").unwrap()];
    let (n, bad) = line.split_once("; ").unwrap();
    (n.parse().unwrap(), bad.to_string())
}

/// The reports' tables fit a window 1,300 px wide: none runs past the page
/// or hides columns behind a scroll bar (issue 37: the summary table of a
/// run of nine experiments over three seeds was 1,672 px wide; the sweep's
/// 1,750). The probe catches a table that does not fit.
#[test]
fn summary_tables_fit_a_1300_px_window() {
    crate::live!(Browser);
    let d = tempfile::tempdir().unwrap();
    // the probe works: one unbreakable cell wider than the window
    let wide = d.path().join("wide.html");
    let mut doc = qsim_plot::html::Document::new("wide");
    doc.push(qsim_plot::html::Block::Table {
        header: vec!["x".into()],
        rows: vec![vec!["9".repeat(400)]],
    });
    std::fs::write(&wide, doc.render()).unwrap();
    let (n, bad) = fits(&wide, d.path());
    assert_eq!(n, 1);
    assert!(bad.contains("table 0 of 1 columns"), "{bad:?}");
    let page = |n: &str| d.path().join(format!("{n}.html"));
    let (run, sweep, plan) = (page("run"), page("sweep"), page("plan"));
    qsim(&[
        "run",
        "experiments/fmapi-policies.toml",
        "--seeds",
        "3",
        "--html",
        run.to_str().unwrap(),
    ]);
    qsim(&[
        "sweep",
        "experiments/fmapi-pacing.toml",
        "--vary",
        "workers=4,8,16",
        "--vary",
        "max_tokens=128,256",
        "--html",
        sweep.to_str().unwrap(),
    ]);
    qsim(&["plan", "--html", plan.to_str().unwrap()]);
    for p in [&run, &sweep, &plan] {
        let (n, bad) = fits(p, d.path());
        assert!(n >= 1, "{}: a table", p.display());
        assert_eq!(bad, "", "{}: at {NARROW} px", p.display());
    }
}
