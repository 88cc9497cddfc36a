//! Issue 40, live and counted: two `qsim serve` upstreams — a provisioned
//! profile (Azure gpt-4o, 15 PTUs) and a pay-per-token one (Databricks
//! FMAPI) — behind `qsim proxy` with the route of
//! `experiments/fmapi-spillover.toml`, and the FMAPI batch replayed through
//! it (`qsim replay`, the article's backoff client).
//!
//! - **Spillover**: the requests the pay-per-token upstream answered (the
//!   proxy's `qsim_proxy_upstream_attempts_total{result="ok"}`), median of
//!   [`DRAWS`] runs, lie in the simulation's 90 % interval over 100 seeds.
//! - **The primary killed mid-run**: no row fails; no attempt goes to the
//!   primary while it cools down after a failure (counted in the decision
//!   log's trails); traffic is back on the primary after it returns.
//! - **Reload**: a SIGHUP with bad routes keeps the old ones; a good one
//!   lets the requests in flight finish (200, settled) and puts the new
//!   routes in force.
//!
//! Counted outcomes only: no verdict rests on a time or a speed.
//!
//! **Prompts.** `qsim replay` generates a prompt of about one word per
//! token; the proxy and `qsim serve` count input tokens by their estimate
//! (`ceil(chars / 4)` + 4 per message, `qsim_live::estimate`), about 1.5
//! per generated word: the provisioned units would drain half again as fast
//! as simulated. So the rows are given (`--rows`): 200 prompts whose
//! estimate is an input length drawn as the experiment draws it (normal,
//! mean 250, sd 15, at least 150).

use crate::common::serve::{qsim, serve_at};
use crate::common::{free_port, stop, Proc};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const EXP: &str = "experiments/fmapi-spillover.toml";
/// Live runs whose median is compared (one run is one draw).
const DRAWS: u64 = 3;

/// The PTU profile with the article's answer lengths for `qsim serve`
/// (the shipped profile has no `[serve]` table; the simulation takes the
/// lengths from the experiment file).
fn ptu_profile(dir: &Path) -> PathBuf {
    let p = dir.join("ptu.toml");
    let text = std::fs::read_to_string(Path::new(ROOT).join("models/azure-openai-gpt-4o-ptu.toml"))
        .unwrap()
        + "\n[serve]\noutput_tokens = { dist = \"normal\", mean = 168, sd = 30, min = 40 }\ndefault_max_tokens = 4096\n";
    std::fs::write(&p, text).unwrap();
    p
}

/// `n` prompts whose estimate is an input length drawn as the experiment
/// draws it (see the module's note), as a JSONL rows file.
fn rows(dir: &Path, n: usize, seed: u64) -> PathBuf {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut unit = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s >> 11) as f64 / (1u64 << 53) as f64
    };
    let filler = "lorem ipsum dolor sit amet ".repeat(200);
    let mut out = String::new();
    for i in 0..n {
        // Box–Muller
        let (u1, u2) = (unit().max(1e-12), unit());
        let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
        let tokens = (250.0 + 15.0 * z).round().max(150.0) as usize;
        let text = format!("review {i}: {filler}");
        let prompt = &text[..4 * (tokens - 4)];
        out.push_str(&serde_json::json!({ "prompt": prompt }).to_string());
        out.push('\n');
    }
    let p = dir.join(format!("rows-{n}-{seed}.jsonl"));
    std::fs::write(&p, out).unwrap();
    p
}

/// Two upstreams (the ptu one at `ptu_port`) and the proxy config in front
/// of them: the experiment's route, the upstreams' profiles for their
/// limits, `extra` appended to each upstream, a decision log.
fn config(dir: &Path, ptu: &str, paygo: &str, extra: &str, scale: f64) -> PathBuf {
    let text = format!(
        r#"kind = "proxy"
[proxy]
listen = "127.0.0.1:0"
unknown_consumer = "all"
time_scale = {scale}
[proxy.log]
dir = "{log}"
[deployment]
capacity = 100000
[[consumer]]
name = "all"

[[upstream]]
name = "ptu"
url = "{ptu}"
credential = "none"
profile = "{ptu_profile}"
cooldown_s = 1
{extra}
[[upstream]]
name = "paygo"
url = "{paygo}"
credential = "none"
profile = "{ROOT}/models/databricks-claude-haiku-4-5.toml"
cooldown_s = 1
{extra}
[[route]]
model = "*"
upstreams = ["ptu", "paygo"]
"#,
        log = dir.join("log").display(),
        ptu_profile = dir.join("ptu.toml").display(),
    );
    let p = dir.join("proxy.toml");
    std::fs::write(&p, text).unwrap();
    p
}

fn start_proxy(cfg: &Path, dir: &Path) -> (Proc, String) {
    let log = std::fs::File::create(dir.join("proxy.log")).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_qsim"))
        .args(["proxy", "--config"])
        .arg(cfg)
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .expect("qsim proxy");
    let mut p = Proc(child);
    let url = crate::common::proxy_url(&mut p);
    (p, url)
}

/// (rows ok, 429s surfaced, other errors) of a replay's JSON report.
fn replayed(json: &str) -> (u64, u64, u64) {
    let v: serde_json::Value = serde_json::from_str(json).unwrap();
    let e = &v["experiments"][0];
    let n = |k: &str| e[k].as_u64().unwrap();
    (n("ok"), n("rejected_429"), n("failed_other"))
}

fn metric(url: &str, key: &str) -> f64 {
    let m = crate::common::metrics(url);
    m.iter().filter(|(k, _)| k == key).map(|(_, v)| *v).sum()
}

/// The 5th and 95th percentiles (linear between order statistics, as
/// qsim's reports compute them) of `upstream.paygo.ok` over 100 seeds.
fn simulated_interval() -> (f64, f64) {
    // into a file: a pipe would fill before the helper reads it
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("sim.csv");
    let (code, _, err) = qsim(
        &[
            "run",
            EXP,
            "--only",
            "backoff",
            "--seeds",
            "100",
            "--format",
            "csv",
            "--out",
            csv.to_str().unwrap(),
        ],
        Duration::from_secs(120),
    );
    assert_eq!(code, 0, "{err}");
    let out = std::fs::read_to_string(&csv).unwrap();
    let mut v: Vec<f64> = out
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            (f.len() == 4 && f[2] == "upstream.paygo.ok").then(|| f[3].parse().unwrap())
        })
        .collect();
    assert_eq!(v.len(), 100);
    v.sort_by(f64::total_cmp);
    let q = |p: f64| {
        let h = (v.len() - 1) as f64 * p;
        let (lo, hi) = (h.floor() as usize, h.ceil() as usize);
        v[lo] + (v[hi] - v[lo]) * (h - lo as f64)
    };
    (q(0.05), q(0.95))
}

#[test]
fn spillover_counts_lie_in_the_simulations_interval() {
    crate::live!();
    let dir = tempfile::tempdir().unwrap();
    let ptu = ptu_profile(dir.path());
    let mut counts = Vec::new();
    for k in 1..=DRAWS {
        let (s1, u1) = serve_at(&ptu, "127.0.0.1:0", 1.0, k);
        let (s2, u2) = serve_at(
            &Path::new(ROOT).join("models/databricks-claude-haiku-4-5.toml"),
            "127.0.0.1:0",
            1.0,
            100 + k,
        );
        let cfg = config(dir.path(), &u1, &u2, "", 1.0);
        let (p, url) = start_proxy(&cfg, dir.path());
        let rows = rows(dir.path(), 200, k);
        let (code, out, err) = qsim(
            &[
                "replay",
                EXP,
                "--only",
                "backoff",
                "--target",
                &url,
                "--seed",
                &k.to_string(),
                "--rows",
                rows.to_str().unwrap(),
                "--timeout",
                "600s",
                "--format",
                "json",
            ],
            Duration::from_secs(300),
        );
        assert_eq!(code, 0, "{err}");
        assert_eq!(replayed(&out), (200, 0, 0), "{out}");
        let paygo = metric(
            &url,
            "qsim_proxy_upstream_attempts_total{upstream=\"paygo\",result=\"ok\"}",
        );
        let ptu_ok = metric(
            &url,
            "qsim_proxy_upstream_attempts_total{upstream=\"ptu\",result=\"ok\"}",
        );
        assert_eq!(
            paygo + ptu_ok,
            200.0,
            "every answer from one upstream or the other"
        );
        counts.push(paygo);
        stop(p);
        drop((s1, s2));
    }
    counts.sort_by(f64::total_cmp);
    let median = counts[counts.len() / 2];
    let (lo, hi) = simulated_interval();
    eprintln!("spillover (requests the pay-per-token upstream answered): live {counts:?}, simulated 90 % interval [{lo}, {hi}]");
    assert!(
        (lo..=hi).contains(&median),
        "live median {median} outside the simulated 90 % interval [{lo}, {hi}]"
    );
}

/// The real time of an attempt of record `r` at core offset `ns`.
fn real_ms(r: &qsim_live::record::Record, ns: u64, scale: f64) -> f64 {
    r.arrival_unix_ms as f64 + ns as f64 / 1e6 / scale
}

#[test]
fn the_primary_killed_mid_run_costs_no_row_and_traffic_returns() {
    crate::live!();
    const SCALE: f64 = 5.0;
    let dir = tempfile::tempdir().unwrap();
    let ptu = ptu_profile(dir.path());
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let (s1, u1) = serve_at(&ptu, &addr, SCALE, 1);
    let (_s2, u2) = serve_at(
        &Path::new(ROOT).join("models/databricks-claude-haiku-4-5.toml"),
        "127.0.0.1:0",
        SCALE,
        101,
    );
    let cfg = config(
        dir.path(),
        &u1,
        &u2,
        "probe_interval_s = 0.5\nprobe_path = \"/v1/models\"\n",
        SCALE,
    );
    let (p, url) = start_proxy(&cfg, dir.path());
    // three callers: the pay-per-token upstream alone can take their load,
    // so the primary's outage need cost no row
    let rows = rows(dir.path(), 240, 1);
    let replay = {
        let (url, rows) = (url.clone(), rows.clone());
        std::thread::spawn(move || {
            qsim(
                &[
                    "replay",
                    EXP,
                    "--only",
                    "backoff",
                    "--set",
                    "rows=240",
                    "--set",
                    "workers=3",
                    "--target",
                    &url,
                    "--rows",
                    rows.to_str().unwrap(),
                    "--time-scale",
                    &SCALE.to_string(),
                    "--timeout",
                    "3000s",
                    "--format",
                    "json",
                ],
                Duration::from_secs(400),
            )
        })
    };
    let now_ms = || {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis() as f64
    };
    // kill the primary once it has answered some, bring it back 3 s later
    let t = Instant::now();
    while metric(
        &url,
        "qsim_proxy_upstream_attempts_total{upstream=\"ptu\",result=\"ok\"}",
    ) < 40.0
    {
        assert!(
            t.elapsed() < Duration::from_secs(120),
            "the primary never answered"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let killed = now_ms();
    stop(s1);
    std::thread::sleep(Duration::from_secs(3));
    let back = now_ms();
    let (_s1, _) = serve_at(&ptu, &addr, SCALE, 2);
    let (code, out, err) = replay.join().unwrap();
    assert_eq!(code, 0, "{err}");
    // no client-visible error: every row answered (the config allows the
    // callers' 429 retries; none failed)
    assert_eq!(replayed(&out), (240, 0, 0), "{out}");
    let cooldowns = metric(
        &url,
        "qsim_proxy_upstream_cooldowns_total{upstream=\"ptu\"}",
    );
    assert!(cooldowns >= 1.0, "the primary's failures started cooldowns");
    // the probes found it down, then back
    let probes = |r: &str| {
        metric(
            &url,
            &format!("qsim_proxy_upstream_probes_total{{upstream=\"ptu\",result=\"{r}\"}}"),
        )
    };
    assert!(
        probes("failed") >= 1.0 && probes("ok") >= 1.0,
        "probes: {} failed, {} ok",
        probes("failed"),
        probes("ok")
    );
    stop(p);
    let recs = qsim_api::whatif::read_log(&dir.path().join("log")).unwrap();
    // every attempt, in core time: (upstream, result, sent, replied)
    let mut attempts = Vec::new();
    let mut back_on_primary = 0;
    for r in &recs {
        let Some(trail) = &r.trail else { continue };
        for a in qsim_sim::plan::routes_whatif::parse_trail(trail, r.arrival_ns).unwrap() {
            let sent_ms = real_ms(r, a.sent - r.arrival_ns, SCALE);
            if a.upstream == "ptu" && a.reply == qsim_core::gateway::Reply::Ok && sent_ms > back {
                back_on_primary += 1;
            }
            attempts.push(a);
        }
    }
    let failed: Vec<_> = attempts
        .iter()
        .filter(|a| a.upstream == "ptu" && a.reply.is_failure())
        .collect();
    assert!(!failed.is_empty(), "attempts met the dead primary");
    // the cooldown (1 s of core time) honoured: no attempt at the primary
    // sent after a failure's reply and before its cooldown's end
    let cooldown = 1_000_000_000u64;
    let violations = failed
        .iter()
        .map(|f| {
            attempts
                .iter()
                .filter(|a| {
                    a.upstream == "ptu" && a.sent > f.replied && a.sent < f.replied + cooldown
                })
                .count()
        })
        .sum::<usize>();
    eprintln!(
        "killed at {killed}, back at {back}: {} attempts met the dead primary, {cooldowns} cooldowns, \
         {violations} attempts inside a cooldown, {back_on_primary} answered by the primary after it returned",
        failed.len()
    );
    assert_eq!(
        violations, 0,
        "an attempt went to the primary while it cooled down"
    );
    assert!(
        back_on_primary > 0,
        "no traffic back on the primary after it returned"
    );

    // what-if: the same requests under routes without the primary
    let policy = dir.path().join("paygo-only.toml");
    let text = std::fs::read_to_string(&cfg).unwrap().replace(
        "upstreams = [\"ptu\", \"paygo\"]",
        "upstreams = [\"paygo\"]",
    );
    std::fs::write(&policy, text).unwrap();
    let (code, out, err) = qsim(
        &[
            "whatif",
            "--log",
            dir.path().join("log").to_str().unwrap(),
            "--policy",
            policy.to_str().unwrap(),
        ],
        Duration::from_secs(60),
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("routes: the 2"), "{out}");
    let ptu_row = out
        .lines()
        .find(|l| l.starts_with("ptu "))
        .expect("the ptu row");
    let cells: Vec<&str> = ptu_row.split_whitespace().collect();
    assert_eq!(
        cells[5], "0",
        "no what-if attempt at an upstream the routes left out: {ptu_row}"
    );
}

#[test]
fn sighup_keeps_the_routes_on_bad_ones_and_lets_requests_finish_on_good_ones() {
    crate::live!();
    let dir = tempfile::tempdir().unwrap();
    let ptu = ptu_profile(dir.path());
    let (_s1, u1) = serve_at(&ptu, "127.0.0.1:0", 1.0, 1);
    let (_s2, u2) = serve_at(
        &Path::new(ROOT).join("models/databricks-claude-haiku-4-5.toml"),
        "127.0.0.1:0",
        1.0,
        2,
    );
    let cfg = config(dir.path(), &u1, &u2, "", 1.0);
    let (p, url) = start_proxy(&cfg, dir.path());
    let pid = p.0.id().to_string();
    let hup = || {
        assert!(Command::new("kill")
            .args(["-HUP", &pid])
            .status()
            .unwrap()
            .success())
    };
    let reloads = |r: &str| metric(&url, &format!("qsim_proxy_reloads_total{{result=\"{r}\"}}"));
    let wait = |what: &dyn Fn() -> bool| {
        let t = Instant::now();
        while !what() {
            assert!(t.elapsed() < Duration::from_secs(20), "never happened");
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let ask = |n: usize| -> Vec<std::thread::JoinHandle<u16>> {
        (0..n)
            .map(|_| {
                let url = url.clone();
                std::thread::spawn(move || {
                    let (code, _, _) = crate::common::http(
                        &url,
                        "POST",
                        "/v1/chat/completions",
                        &[("content-type", "application/json")],
                        br#"{"model":"m","messages":[{"role":"user","content":"hello"}],"max_tokens":200}"#,
                    );
                    code
                })
            })
            .collect()
    };
    let ok = |u: &str| {
        metric(
            &url,
            &format!("qsim_proxy_upstream_attempts_total{{upstream=\"{u}\",result=\"ok\"}}"),
        )
    };
    // the SIGHUP handler is installed by a task spawned at start: let it run
    wait(&|| metric(&url, "qsim_proxy_policy_generation") == 1.0);
    std::thread::sleep(Duration::from_millis(300));
    // bad routes: an unknown upstream; the old routes stay (requests still go to ptu first)
    let good = std::fs::read_to_string(&cfg).unwrap();
    std::fs::write(
        &cfg,
        good.replace(
            "upstreams = [\"ptu\", \"paygo\"]",
            "upstreams = [\"ptu\", \"nope\"]",
        ),
    )
    .unwrap();
    hup();
    wait(&|| reloads("error") >= 1.0);
    for h in ask(3) {
        assert_eq!(h.join().unwrap(), 200);
    }
    assert_eq!(ok("ptu"), 3.0, "the old routes in force");
    // a good reload (paygo first) with requests in flight (answers of ~2.5 s)
    let in_flight = ask(4);
    wait(&|| metric(&url, "qsim_proxy_upstream_in_flight{upstream=\"ptu\"}") >= 4.0);
    std::fs::write(
        &cfg,
        good.replace(
            "upstreams = [\"ptu\", \"paygo\"]",
            "upstreams = [\"paygo\", \"ptu\"]",
        ),
    )
    .unwrap();
    hup();
    wait(&|| reloads("ok") >= 1.0);
    for h in in_flight {
        assert_eq!(
            h.join().unwrap(),
            200,
            "a request in flight survives the reload"
        );
    }
    assert_eq!(ok("ptu"), 7.0);
    assert_eq!(
        metric(&url, "qsim_proxy_upstream_in_flight{upstream=\"ptu\"}"),
        0.0,
        "settled"
    );
    for h in ask(2) {
        assert_eq!(h.join().unwrap(), 200);
    }
    assert_eq!(ok("paygo"), 2.0, "the new routes in force");
    assert_eq!(metric(&url, "qsim_proxy_in_flight"), 0.0);
    stop(p);
}
