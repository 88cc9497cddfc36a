//! `qsim load`: bad input exits 2 naming the flag (before any request), an
//! unreachable target exits 1 without a partial output file, the proxy's
//! `--time-scale` is validated; and a closed-loop scenario with a retry
//! policy through `qsim proxy` in front of llmock (127.0.0.1 only, ~6 s):
//! the retries go through the core's `Call`, honouring the proxy's hints in
//! scaled time.

use crate::common::qsim;
use crate::common::{free_port, llmock, stop, Proc};
use serde_json::Value;
use std::process::Stdio;

const FILE: &str = "builtin:experiments/shared-deployment.toml";

fn fails(args: &[&str], code: i32, needle: &str) {
    let o = qsim().args(args).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(code), "{args:?}: {err}");
    assert!(err.contains(needle), "{args:?}: {err:?} lacks {needle:?}");
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    assert!(o.stdout.is_empty(), "no partial output");
}

#[test]
fn bad_input_exits_2_naming_the_flag() {
    let t = "http://127.0.0.1:9";
    let base = ["load", FILE, "--target", t, "--scenario", "heavy"];
    let with = |extra: &[&'static str]| -> Vec<&str> {
        base.iter().copied().chain(extra.iter().copied()).collect()
    };
    fails(&with(&["--time-scale", "0"]), 2, "--time-scale");
    fails(&with(&["--time-scale", "500"]), 2, "--time-scale");
    fails(&with(&["--key", "Z=k"]), 2, "--key");
    fails(&with(&["--consumer-header", "a b"]), 2, "--consumer-header");
    fails(&with(&["--timeout", "0"]), 2, "--timeout");
    for bad in ["0..5", "9..3", "x", "1..", ""] {
        fails(&with(&["--token-ids", bad]), 2, "--token-ids");
    }
    fails(
        &["load", FILE, "--target", "https://x", "--scenario", "heavy"],
        2,
        "--target",
    );
    fails(&["load", FILE, "--target", t], 2, "choose one");
    fails(
        &["load", FILE, "--target", t, "--scenario", "nope"],
        2,
        "nope",
    );
}

#[test]
fn unreachable_target_exits_1_without_output_file() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("r.json");
    let port = free_port().to_string();
    let target = format!("http://127.0.0.1:{port}");
    let o = qsim()
        .args(["load", FILE, "--target", &target, "--scenario", "normal"])
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("cannot reach"));
    assert!(!out.exists());
}

#[test]
fn proxy_time_scale_is_validated() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("p.toml");
    let body = "kind = \"proxy\"\n[proxy]\nupstream = \"http://127.0.0.1:1\"\n\
                [proxy.keys]\nA = [\"k\"]\n[deployment]\ncapacity = 60\n\
                [[consumer]]\nname = \"A\"\n";
    std::fs::write(&cfg, body).unwrap();
    let o = qsim()
        .args(["proxy", "--config"])
        .arg(&cfg)
        .args(["--time-scale", "0"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--time-scale"));
    let text = body.replace("[proxy.keys]", "time_scale = 1000\n[proxy.keys]");
    std::fs::write(&cfg, text).unwrap();
    let o = qsim()
        .args(["proxy", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("proxy.time_scale"));
}

/// Two consumers with 4 closed-loop workers each against 120 RPM: every
/// worker keeps retrying 429s (exponential backoff, the proxy's hint
/// honoured) for one virtual minute, compressed 10×.
const CLOSED: &str = r#"
kind = "shared"
model = "ideal"
max_tokens = 32
input_tokens = { dist = "const", value = 40 }
output_tokens = { dist = "const", value = 8 }

[deployment]
capacity = 120
threshold = 0.9

[[consumer]]
name = "A"
reserved_pct = 50

[[consumer]]
name = "dev"

[[scenario]]
name = "closed"
duration_s = 60
load = [{ who = "all", workers = 4, think_s = 0.5, retry = { backoff = "exponential", base_s = 1, cap_s = 4, jitter_s = 0.5, max_attempts = 5, honor_hint = true, retry_on = ["429"] } }]
"#;

#[test]
fn closed_loop_with_retries_through_the_proxy() {
    crate::live!();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("closed.toml");
    std::fs::write(&file, CLOSED).unwrap();
    let cfg = dir.path().join("proxy.toml");
    let o = qsim()
        .args(["plan", "--scenarios"])
        .arg(&file)
        .arg("--emit-proxy-config")
        .arg(&cfg)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));

    let (_up, up) = llmock(&[]);
    let child = qsim()
        .args(["proxy", "--allow-placeholder-keys", "--config"])
        .arg(&cfg)
        .args(["--listen", "127.0.0.1:0", "--threads", "1"])
        .args(["--upstream", &up])
        .args(["--time-scale", "10", "--log-dir"])
        .arg(dir.path().join("log"))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut proxy = Proc(child);
    let url = &crate::common::proxy_url(&mut proxy);

    let o = qsim()
        .arg("load")
        .arg(&file)
        .args(["--target", url, "--time-scale", "10", "--threads", "1"])
        .args(["--timeout", "10s", "--compare-with-sim", "--format", "json"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let r: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(r["abandoned"], 0);
    let (mut rows, mut offered, mut admitted) = (0, 0, 0);
    for c in r["consumers"].as_array().unwrap() {
        assert_eq!(c["unanswered"], 0, "{c}");
        assert_eq!(c["other_status"].as_array().unwrap().len(), 0, "{c}");
        let n = |k: &str| c[k].as_u64().unwrap();
        assert_eq!(n("admitted") + n("limited"), n("offered"), "{c}");
        assert!(n("limited") > 0, "the workers are over the limit: {c}");
        // llmock never limits: every 429 is the proxy's (marked)
        assert_eq!(n("upstream_limited"), 0, "{c}");
        rows += n("rows");
        offered += n("offered");
        admitted += n("admitted");
    }
    eprintln!("closed loop: {rows} rows, {offered} attempts, {admitted} admitted");
    // rows were retried (the core's Call scheduled the attempts), and the
    // limiter held the minute to capacity + burst (120 + 12)
    assert!(offered > rows, "{offered} attempts for {rows} rows");
    assert!(
        (100..=134).contains(&admitted),
        "{admitted} admitted in one minute"
    );
    // the floor: A reserved 50 % = 60 RPM
    let a = &r["consumers"][0];
    assert_eq!(a["name"], "A");
    assert!(a["admitted"].as_u64().unwrap() >= 59, "{a}");
    // the plan beside it: the same consumers and minute
    assert_eq!(r["compare"].as_array().unwrap().len(), 2);

    // qsim load numbers its attempts (x-stainless-retry-count, as the
    // OpenAI SDKs do): the decision log links the retries into callers
    stop(proxy); // the log's last file is written when the proxy ends
    let o = qsim()
        .args(["whatif", "--log"])
        .arg(dir.path().join("log"))
        .arg("--policy")
        .arg(&cfg)
        .args(["--format", "json"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let w: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(w["records"].as_u64(), Some(offered), "{w}");
    let linked = w["callers_with_retries"].as_u64().unwrap();
    assert!(
        linked > 0 && linked <= rows,
        "{linked} callers with retries: {w}"
    );
}

/// Issue 37: `qsim load` through the proxy counted the upstream's 429s as
/// the proxy's ("−91.7 % against the plan" while the proxy admitted
/// exactly the plan). The proxy now marks its own refusals
/// (`x-qsim-limited-by`); `qsim load` counts the rest as the upstream's and
/// warns when they dominate. The proxy's plan allows 120 RPM; the upstream
/// (`qsim serve`, a hosted profile) 20 RPM. 60 RPM offered open-loop: the
/// proxy admits all of it and every 429 is the upstream's (warned);
/// the closed-loop workers' retries: both limit, the proxy most (no warning).
#[test]
fn upstream_429s_are_told_from_the_proxys() {
    crate::live!();
    let dir = tempfile::tempdir().unwrap();
    let closed = dir.path().join("closed.toml");
    std::fs::write(&closed, CLOSED).unwrap();
    let open = dir.path().join("open.toml");
    let i = CLOSED.find("load = ").unwrap();
    std::fs::write(
        &open,
        format!("{}load = [{{ who = \"all\", rpm = 30 }}]\n", &CLOSED[..i]),
    )
    .unwrap();
    let cfg = dir.path().join("proxy.toml");
    let o = qsim()
        .args(["plan", "--scenarios"])
        .arg(&closed)
        .arg("--emit-proxy-config")
        .arg(&cfg)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let profile = dir.path().join("up.toml");
    std::fs::write(
        &profile,
        "kind = \"hosted\"\nname = \"tight\"\n\
         [[limits]]\nname = \"RPM\"\ncounts = \"requests\"\nlimit = 20\nwindow_s = 60\n\
         [rejection]\nhint = \"retry_after_ms\"\nlatency = { dist = \"const\", value = 0.01 }\n\
         [latency]\nttft = { dist = \"const\", value = 0.05 }\ntpot = { dist = \"const\", value = 0.001 }\n",
    )
    .unwrap();
    let (_up, up) = crate::common::serve::serve(&profile, 10.0, 1);
    let child = qsim()
        .args(["proxy", "--allow-placeholder-keys", "--config"])
        .arg(&cfg)
        .args(["--listen", "127.0.0.1:0", "--threads", "1"])
        .args(["--upstream", &up])
        .args(["--time-scale", "10"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut proxy = Proc(child);
    let url = &crate::common::proxy_url(&mut proxy);
    let run = |file: &std::path::Path, format: &str| {
        let o = qsim()
            .arg("load")
            .arg(file)
            .args(["--target", url, "--time-scale", "10", "--threads", "1"])
            .args(["--timeout", "10s", "--format", format])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8(o.stdout).unwrap()
    };
    let counts = |r: &Value| {
        let (mut up429, mut all429, mut ok) = (0, 0, 0);
        for c in r["consumers"].as_array().unwrap() {
            let n = |k: &str| c[k].as_u64().unwrap();
            up429 += n("upstream_limited");
            all429 += n("limited");
            ok += n("admitted");
        }
        (up429, all429, ok)
    };
    // open loop, under the proxy's plan: every 429 is the upstream's
    let (up429, all429, ok) = counts(&serde_json::from_str(&run(&open, "json")).unwrap());
    eprintln!("open loop, 60 RPM through a 20 RPM upstream: {ok} admitted, {all429} 429s, {up429} from the upstream");
    assert!(up429 > 0 && up429 == all429, "{up429} of {all429}");
    let t = run(&open, "table");
    assert!(
        t.contains("429 by proxy") && t.contains("429 upstream"),
        "{t}"
    );
    assert!(
        t.contains("came from the upstream, not from a qsim proxy"),
        "{t}"
    );
    // closed loop: the workers' retries overrun the proxy's plan too
    let (up429, all429, ok) = counts(&serde_json::from_str(&run(&closed, "json")).unwrap());
    eprintln!("closed loop through a 20 RPM upstream: {ok} admitted, {all429} 429s, {up429} from the upstream");
    assert!(
        ok < 100,
        "the proxy alone admits 100..134 here (test above): {ok}"
    );
    assert!(up429 > 0 && 2 * up429 < all429, "{up429} of {all429}");
    assert!(!run(&closed, "table").contains("came from the upstream"));
}
