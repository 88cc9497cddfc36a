//! Issue 40 through the doors: several upstreams behind a route in `qsim
//! run` (the FMAPI batch spilling from provisioned units to pay-per-token)
//! and hybrids in `qsim options` (their verdict, `--emit-proxy-config`
//! loading back in `qsim proxy`); bad routes exit 2 naming the field, in a
//! proxy config and in a hosted experiment file alike.

use crate::common::qsim;
use std::path::Path;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn run(args: &[&str]) -> (i32, String, String) {
    let out = qsim().args(args).current_dir(ROOT).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The value of `metric` in `qsim run --format csv`'s records (median over
/// seeds is not needed: one seed).
fn record(csv: &str, subject: &str, metric: &str) -> f64 {
    csv.lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            (f.len() >= 4 && f[1] == subject && f[2] == metric).then(|| f[3].parse().unwrap())
        })
        .unwrap_or_else(|| panic!("no {subject} {metric} in\n{csv}"))
}

#[test]
fn the_batch_spills_from_provisioned_units_to_pay_per_token() {
    let (code, out, err) = run(&["run", "experiments/fmapi-spillover.toml", "--format", "csv"]);
    assert_eq!(code, 0, "{err}");
    for e in ["backoff", "direct"] {
        let ok = record(&out, e, "ok");
        let ptu = record(&out, e, "upstream.ptu.ok");
        let paygo = record(&out, e, "upstream.paygo.ok");
        // every row answered, by one upstream or the other: some by each
        assert_eq!(ok, 200.0, "{e}");
        assert_eq!(ptu + paygo, ok, "{e}: every answer counted once");
        assert!(ptu > 0.0 && paygo > 0.0, "{e}: ptu {ptu}, paygo {paygo}");
        // the gateway spills at the units' own limit: no attempt wasted on a 429
        assert_eq!(record(&out, e, "upstream.ptu.http_429"), 0.0, "{e}");
    }
    // the same for any thread count and run
    let (_, again, _) = run(&["run", "experiments/fmapi-spillover.toml", "--format", "csv"]);
    assert_eq!(out, again);
}

#[test]
fn options_put_the_cheapest_hybrid_beside_the_pure_options() {
    let (code, out, err) = run(&["options", "experiments/options-daily.toml"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("spilled"), "{out}");
    assert!(
        out.contains("cheapest hybrid:")
            || out.contains("no hybrid wins:")
            || out.contains("no hybrid meets"),
        "{out}"
    );
    assert!(out.contains("the cheapest of its upstreams alone"), "{out}");
    // the winner's routes as a proxy config, the limiter in front: it loads
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("proxy.toml");
    let (code, _, err) = run(&[
        "options",
        "experiments/options-daily.toml",
        "--emit-proxy-config",
        cfg.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    let text = std::fs::read_to_string(&cfg).unwrap();
    assert!(
        text.contains("[[upstream]]") && text.contains("[[route]]"),
        "{text}"
    );
    assert!(
        text.contains("[deployment]") && text.contains("[[consumer]]"),
        "{text}"
    );
    // as emitted: the credentials are placeholders, named
    let args = qsim_api::proxy::Spec {
        config: cfg.clone(),
        ..Default::default()
    };
    let e = qsim_api::proxy::load(&args).unwrap_err();
    assert!(e.field.ends_with("credential_env"), "{e:?}");
    // filled in (credential = "none"), it loads: the routes as simulated
    let filled = regex_free_fill(&text);
    std::fs::write(&cfg, &filled).unwrap();
    let c = qsim_api::proxy::load(&args).unwrap_or_else(|e| panic!("{e}\n{filled}"));
    assert!(c.routes.from_tables);
    assert!(c.routes.core.upstreams.len() >= 2, "{filled}");
}

/// Every `credential_env = "…"` line replaced by `credential = "none"`.
fn regex_free_fill(text: &str) -> String {
    text.lines()
        .map(|l| {
            if l.starts_with("credential_env") {
                "credential = \"none\"".to_string()
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

const PROXY: &str = r#"kind = "proxy"
[proxy]
unknown_consumer = "all"
[deployment]
capacity = 100
[[consumer]]
name = "all"

[[upstream]]
name = "ptu"
url = "http://127.0.0.1:9"
credential = "none"
[[upstream]]
name = "paygo"
url = "http://127.0.0.1:10"
credential_env = "QSIM_TEST_PAYGO_KEY"

[[route]]
model = "*"
upstreams = ["ptu", "paygo"]
fallback = "small"
[[route]]
model = "small"
upstreams = ["paygo"]
policy = "weighted"
weights = [2]
"#;

fn proxy_exit2(dir: &Path, text: &str, field: &str, reason: &str) {
    let p = dir.join("bad.toml");
    std::fs::write(&p, text).unwrap();
    let (code, out, err) = run(&["proxy", "--config", p.to_str().unwrap()]);
    assert_eq!(code, 2, "{text}\n{err}");
    assert!(out.is_empty(), "nothing bound or printed: {out}");
    assert!(
        err.contains(&format!(": {field}: ")),
        "{err:?} lacks the field {field}"
    );
    assert!(err.contains(reason), "{err:?} lacks {reason:?}");
    assert_eq!(err.lines().count(), 1, "one line: {err}");
}

#[test]
fn bad_routes_exit_2_naming_the_field() {
    let d = tempfile::tempdir().unwrap();
    let cases: &[(&str, &str, &str, &str)] = &[
        (
            "upstreams = [\"ptu\", \"paygo\"]",
            "upstreams = [\"ptu\", \"nope\"]",
            "route.0.upstreams.1",
            "no upstream named \"nope\"",
        ),
        (
            "upstreams = [\"paygo\"]\n",
            "upstreams = [\"paygo\"]\nfallback = \"*\"\n",
            "route.1.fallback",
            "a fallback cycle",
        ),
        (
            "weights = [2]",
            "weights = [0]",
            "route.1.weights.0",
            "positive integer",
        ),
        (
            "weights = [2]",
            "weights = [-1]",
            "route.1.weights.0",
            "positive integer",
        ),
        (
            "credential_env = \"QSIM_TEST_PAYGO_KEY\"\n",
            "\n",
            "upstream.paygo.credential_env",
            "missing",
        ),
    ];
    for (from, to, field, reason) in cases {
        assert!(PROXY.contains(from), "{from}");
        proxy_exit2(d.path(), &PROXY.replacen(from, to, 1), field, reason);
    }
    // a credential variable that is not set
    proxy_exit2(
        d.path(),
        PROXY,
        "upstream.paygo.credential_env",
        "QSIM_TEST_PAYGO_KEY is not set",
    );
}

#[test]
fn bad_routes_in_a_hosted_file_exit_2_too() {
    let d = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(Path::new(ROOT).join("experiments/fmapi-spillover.toml"))
        .unwrap()
        .replace("../models/", &format!("{ROOT}/models/"));
    for (from, to, field) in [
        (
            "upstreams = [\"ptu\", \"paygo\"]",
            "upstreams = [\"ptu\", \"x\"]",
            "route.0.upstreams.1",
        ),
        (
            "upstreams = [\"ptu\", \"paygo\"]",
            "upstreams = [\"ptu\", \"paygo\"]\npolicy = \"weighted\"\nweights = [1, 0]",
            "route.0.weights.1",
        ),
        (
            "name = \"paygo\"\n",
            "name = \"paygo\"\nurl = \"http://x\"\n",
            "upstream.paygo.url",
        ),
    ] {
        assert!(text.contains(from), "{from}");
        let p = d.path().join("bad.toml");
        std::fs::write(&p, text.replacen(from, to, 1)).unwrap();
        let (code, out, err) = run(&["run", p.to_str().unwrap()]);
        assert_eq!(code, 2, "{err}");
        assert!(out.is_empty());
        assert!(
            err.contains(&format!(": {field}: ")),
            "{err:?} lacks {field}"
        );
    }
}
