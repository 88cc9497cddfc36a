//! Drift (issue 14, item 3), live on 127.0.0.1: `qsim serve` of the haiku
//! profile as the upstream, `qsim proxy --profile` of the same profile in
//! front of it, four client threads streaming through the proxy.
//!
//! Time is compressed ×10 on both (`--time-scale 10`): every modelled
//! duration lasts a tenth of itself, and the proxy's clock (which times the
//! upstream's answers and drives the shadow model) runs ×10, so 12 real
//! seconds are 120 model seconds. The drift settings are the defaults
//! (band [0.67, 1.5], 60 s sustained, 30 s window, ≥ 20 samples).
//!
//! - control: the same upstream for 240 model seconds → no alert at any
//!   point, and the ratios estimated (≥ 20 samples) and inside the band;
//! - drift: after 120 model seconds the upstream is restarted on the same
//!   port with a copy of the profile whose TTFT and per-token time are ×2 →
//!   `qsim_proxy_drift_alert{metric="ttft"}` (and e2e, itl) go to 1 within
//!   120 model seconds of the restart, with a warning in the proxy's log.

use crate::common::serve as serve_helpers;

use crate::common::{free_port, http, metric, metrics, proxy, Proc};
use serve_helpers::{model, serve_at};
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const SCALE: f64 = 10.0;

/// `qsim serve PROFILE` on a fixed port (a restarted upstream is found at
/// the same address).
fn serve_on(profile: &Path, port: u16) -> Proc {
    serve_at(profile, &format!("127.0.0.1:{port}"), SCALE, 1).0
}

/// Client threads streaming chat completions through the proxy until
/// `stop`; returns the handles and the count of 200s.
fn load(
    url: &str,
    threads: usize,
    stop: Arc<AtomicBool>,
) -> (Vec<std::thread::JoinHandle<()>>, Arc<AtomicU64>) {
    let ok = Arc::new(AtomicU64::new(0));
    let hs = (0..threads)
        .map(|i| {
            let (url, stop, ok) = (url.to_string(), stop.clone(), ok.clone());
            std::thread::spawn(move || {
                let mut k = 0;
                while !stop.load(Ordering::Relaxed) {
                    let body = format!(
                        r#"{{"model":"databricks-claude-haiku-4-5","stream":true,"max_tokens":256,"messages":[{{"role":"user","content":"Summarise review {i}-{k} of a kettle in three sentences."}}]}}"#
                    );
                    let (st, _, _) = http(
                        &url,
                        "POST",
                        "/v1/chat/completions",
                        &[
                            ("authorization", "Bearer key-a"),
                            ("content-type", "application/json"),
                        ],
                        body.as_bytes(),
                    );
                    if st == 200 {
                        ok.fetch_add(1, Ordering::Relaxed);
                    }
                    k += 1;
                }
            })
        })
        .collect();
    (hs, ok)
}

const CONFIG: &str = "[proxy.keys]\nA = [\"key-a\"]\n\
    [deployment]\ncapacity = 100000\n\
    [[consumer]]\nname = \"A\"\n";

fn alerts(m: &[(String, f64)]) -> Vec<(&'static str, f64)> {
    ["ttft", "itl", "e2e", "upstream_429"]
        .iter()
        .map(|k| {
            (
                *k,
                metric(m, &format!("qsim_proxy_drift_alert{{metric=\"{k}\"}}")),
            )
        })
        .collect()
}

fn start(dir: &tempfile::TempDir, name: &str) -> (Proc, Proc, String, u16) {
    let port = free_port();
    let up = serve_on(&model("databricks-claude-haiku-4-5.toml"), port);
    let profile = model("databricks-claude-haiku-4-5.toml");
    let cfg = format!(
        "time_scale = 10\nprofile = \"{}\"\n{CONFIG}",
        profile.display()
    );
    let (px, url) = proxy(dir, name, &format!("http://127.0.0.1:{port}"), &cfg);
    (up, px, url, port)
}

#[test]
fn an_unchanged_upstream_raises_no_alert() {
    crate::live!();
    let dir = tempfile::tempdir().unwrap();
    let (_up, _px, url, _) = start(&dir, "control");
    let m = metrics(&url);
    assert_eq!(
        alerts(&m).iter().map(|a| a.1).sum::<f64>(),
        0.0,
        "alert gauges exported at 0: {m:?}"
    );
    let stop = Arc::new(AtomicBool::new(false));
    let (hs, ok) = load(&url, 4, stop.clone());
    let t0 = Instant::now();
    let run = Duration::from_secs_f64(240.0 / SCALE);
    while t0.elapsed() < run {
        std::thread::sleep(Duration::from_millis(250));
        let m = metrics(&url);
        let a = alerts(&m);
        assert!(
            a.iter().all(|x| x.1 == 0.0),
            "alert on an unchanged upstream at {:.0} model s: {a:?}\n{}",
            t0.elapsed().as_secs_f64() * SCALE,
            std::fs::read_to_string(dir.path().join("control.log")).unwrap_or_default()
        );
    }
    stop.store(true, Ordering::Relaxed);
    for h in hs {
        h.join().unwrap();
    }
    let m = metrics(&url);
    for k in ["ttft", "itl", "e2e", "upstream_429"] {
        let l = format!("{{metric=\"{k}\"}}");
        let n = metric(&m, &format!("qsim_proxy_drift_samples{l}"));
        let r = metric(&m, &format!("qsim_proxy_drift_ratio{l}"));
        eprintln!(
            "control {k}: predicted {:.4} observed {:.4} ratio {r:.3} samples {n}",
            metric(&m, &format!("qsim_proxy_drift_predicted{l}")),
            metric(&m, &format!("qsim_proxy_drift_observed{l}"))
        );
        assert!(n >= 20.0, "{k}: {n} samples");
        assert!((0.67..=1.5).contains(&r), "{k}: ratio {r}");
    }
    assert!(ok.load(Ordering::Relaxed) >= 100, "answers: {ok:?}");
}

#[test]
fn a_doubled_latency_is_flagged_within_two_minutes() {
    crate::live!();
    let dir = tempfile::tempdir().unwrap();
    let (up, _px, url, port) = start(&dir, "drift");
    // the same profile with TTFT and per-token time ×2
    let text = std::fs::read_to_string(model("databricks-claude-haiku-4-5.toml")).unwrap();
    let slow = text
        .replace(
            "ttft = { dist = \"lognormal\", p50 = 0.5, p95 = 1.0 }",
            "ttft = { dist = \"lognormal\", p50 = 1.0, p95 = 2.0 }",
        )
        .replace(
            "tpot = { dist = \"lognormal\", p50 = 0.008, p95 = 0.013 }",
            "tpot = { dist = \"lognormal\", p50 = 0.016, p95 = 0.026 }",
        );
    assert_ne!(slow, text, "the profile's latency lines changed");
    let slow_path = dir.path().join("haiku-x2.toml");
    std::fs::write(&slow_path, slow).unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let (hs, ok) = load(&url, 4, stop.clone());
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs_f64(120.0 / SCALE) {
        std::thread::sleep(Duration::from_millis(250));
        let a = alerts(&metrics(&url));
        assert!(
            a.iter().all(|x| x.1 == 0.0),
            "alert before the change: {a:?}"
        );
    }
    let before = metrics(&url);
    let n = metric(&before, "qsim_proxy_drift_samples{metric=\"ttft\"}");
    assert!(n >= 20.0, "estimated before the change: {n} samples");
    // the upstream slows down: restarted on the same port with ×2 latencies
    drop(up);
    let _slow = serve_on(&slow_path, port);
    let t1 = Instant::now();
    let mut flagged = None;
    let mut outside = None;
    while t1.elapsed() < Duration::from_secs_f64(120.0 / SCALE) {
        std::thread::sleep(Duration::from_millis(100));
        let m = metrics(&url);
        if outside.is_none() && metric(&m, "qsim_proxy_drift_ratio{metric=\"ttft\"}") > 1.5 {
            outside = Some(t1.elapsed().as_secs_f64() * SCALE);
        }
        if metric(&m, "qsim_proxy_drift_alert{metric=\"ttft\"}") == 1.0 {
            flagged = Some((t1.elapsed().as_secs_f64() * SCALE, m));
            break;
        }
    }
    stop.store(true, Ordering::Relaxed);
    for h in hs {
        h.join().unwrap();
    }
    let log = std::fs::read_to_string(dir.path().join("drift.log")).unwrap();
    let (after, m) = flagged.unwrap_or_else(|| {
        panic!(
            "no ttft alert within 120 model s of the change: {:?}\n{log}",
            metrics(&url)
        )
    });
    eprintln!(
        "ttft ratio above 1.5 {:.0} model s, alert {after:.0} model s after the change",
        outside.unwrap_or(f64::NAN)
    );
    for k in ["ttft", "e2e"] {
        let l = format!("{{metric=\"{k}\"}}");
        let r = metric(&m, &format!("qsim_proxy_drift_ratio{l}"));
        eprintln!(
            "drift {k}: predicted {:.4} observed {:.4} ratio {r:.3} alert {}",
            metric(&m, &format!("qsim_proxy_drift_predicted{l}")),
            metric(&m, &format!("qsim_proxy_drift_observed{l}")),
            metric(&m, &format!("qsim_proxy_drift_alert{l}"))
        );
        assert!(r > 1.5, "{k}: ratio {r}");
    }
    assert_eq!(
        metric(&m, "qsim_proxy_drift_alert{metric=\"upstream_429\"}"),
        0.0
    );
    assert!(
        log.contains("WARN")
            && log
                .contains("drift: the upstream no longer behaves like its profile metric=\"ttft\""),
        "{log}"
    );
    assert_eq!(
        log.matches("no longer behaves like its profile metric=\"ttft\"")
            .count(),
        1,
        "warned once"
    );
    assert!(ok.load(Ordering::Relaxed) >= 100);
}

/// Bad drift settings: one line naming the field, exit 2, nothing bound.
#[test]
fn bad_drift_settings_exit_2_naming_the_field() {
    crate::live!();
    let dir = tempfile::tempdir().unwrap();
    let haiku = model("databricks-claude-haiku-4-5.toml");
    let cases = [
        (
            "[proxy.drift]\nfor_s = 30\n".to_string(),
            "proxy.drift: needs the upstream's profile",
        ),
        (
            format!(
                "profile = \"{}\"\n[proxy.drift]\nband = [1.2, 1.5]\n",
                haiku.display()
            ),
            "proxy.drift.band: expected [low, high] with 0 < low <= 1 <= high",
        ),
        (
            format!(
                "profile = \"{}\"\n[proxy.drift]\nwindow_s = 0\n",
                haiku.display()
            ),
            "proxy.drift.window_s: must be in (0, 86400] seconds",
        ),
        (
            format!(
                "profile = \"{}\"\n[proxy.drift]\ncolour = 1\n",
                haiku.display()
            ),
            "colour",
        ),
        (
            "profile = \"no-such-profile.toml\"\n".to_string(),
            "bad4.toml: proxy.profile: cannot read",
        ),
    ];
    for (i, (extra, want)) in cases.iter().enumerate() {
        let path = dir.path().join(format!("bad{i}.toml"));
        std::fs::write(
            &path,
            crate::common::proxy_config("http://127.0.0.1:9", &format!("{extra}{CONFIG}")),
        )
        .unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_qsim"))
            .args(["proxy", "--config"])
            .arg(&path)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{extra}: {err}");
        assert!(out.stdout.is_empty(), "nothing bound: {extra}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(err.starts_with("qsim: "), "{err}");
        assert!(err.contains(want), "{extra}: {err}");
    }
}
