//! Issue 21 (one copy of every rule): a shared scenario's consumers take
//! the same client layers as a hosted experiment's pool — the SDK's hidden
//! retries, the adaptive throttle, the retry quota — and `qsim plan`'s
//! driver runs them through the whole caller protocol (`on_send`, every
//! reply including successes). The test: the same callers against the same
//! limit give the same sequence of per-attempt outcomes in the plan's
//! driver (`plan::sim`) as in the hosted experiment driver
//! (`experiment::hosted`).
//!
//! The common deterministic setting, built explicitly:
//! - one consumer, one closed-loop load of `WORKERS` workers with no think
//!   time: the plan's closed loop is the hosted pool (a worker takes the
//!   next row when its row ends);
//! - the limit: the hosted endpoint has one limit, 30 requests per 60 s;
//!   the plan's limiter is `rate-limit-only` with capacity 30 rpm and a
//!   burst of 30, which compiles to the same token bucket (30 per 60 s, full
//!   at time 0), and no other limit;
//! - no latency noise: rejections take 5 ms in both; the plan's server is
//!   the ideal backend (no queueing; TTFT 35 ms, then 18 ms per further
//!   token), and the hosted profile's TTFT and time per token are the
//!   constants 17 ms and 18 ms, so both answer an admitted request of `n`
//!   output tokens after exactly 17 + 18·n ms;
//! - the same rows: both drivers draw a row's input and natural output
//!   length from stream `(seed, 0, WORKLOAD)` in row order (the plan's token
//!   stream of consumer 0 in scenario 0 is that stream), with the same
//!   distributions and `max_tokens`;
//! - the same caller draws: the hosted driver draws experiment 0's jitter
//!   and throttle draws from `(seed, 1, CLIENT)`, the plan from its
//!   scenario's client stream; the plan's driver is handed the hosted one
//!   (`Probe::client_rng`), so both draw the same numbers in event order.
//!
//! Where the two drivers legitimately differ, and how the test keeps it out:
//! - retry hints: the plan's limiter tells the caller the exact time the
//!   bucket refills (measured from the reply), a hosted endpoint a hint of
//!   its profile's shape (none here); the callers are set to ignore hints
//!   (`honor_hint = false`; the SDK's `hint_max_s = 0` with
//!   `hint_over_max = "backoff"`) and the compared reply drops the hint;
//! - the end: the plan stops at the scenario's end, the hosted pool when its
//!   rows run out; only attempts answered before the scenario's end are
//!   compared, and the hosted run is given rows enough to outlast it.
//!
//! Everything else of each attempt must agree: when it left, its row, its
//! caller-level attempt and SDK retry numbers, when the reply came, whether
//! it was admitted, refused by the limit (429) or rejected locally by the
//! throttle, and what the caller did next (an SDK-hidden retry, its own
//! retry, or done, with the outcome's latency and waits).

use qsim_sim::client::trace::Attempt;
use qsim_sim::client::{Next, Reply};
use qsim_sim::engine::rng::{component, stream};
use qsim_sim::experiment::hosted::run_suite_observed;
use qsim_sim::experiment::HostedSuite;
use qsim_sim::plan::config::SharedFile;
use qsim_sim::plan::sim::{run_scenario_probed, IdealBackend, Probe};
use qsim_sim::time::NS_PER_SEC;

const WORKERS: u32 = 4;
const DURATION_S: u64 = 600;

const ENDPOINT: &str = r#"
kind = "hosted"
name = "one-limit"

[[limits]]
name = "RPM"
counts = "requests"
limit = 30
window_s = 60

[rejection]
hint = "none"
latency = { dist = "const", value = 0.005 }

[latency]
ttft = { dist = "const", value = 0.017 }
tpot = { dist = "const", value = 0.018 }
"#;

/// What both files share: lengths, `max_tokens`, the SDK layer's settings.
const COMMON: &str = r#"
max_tokens = 256
sdk_retries = true
input_tokens = { dist = "uniform", min = 100, max = 800 }
output_tokens = { dist = "lognormal", p50 = 120, p95 = 400, min = 5 }

[sdk]
max_retries = 2
hint_max_s = 0
hint_over_max = "backoff"
"#;

/// The callers' own layers, as a hosted `[[experiment]]` and a shared
/// `[[scenario.load]]` both write them.
const THROTTLE: &str = r#"
retry = { backoff = "exponential", base_s = 1, cap_s = 8, jitter_s = 1, max_attempts = 4, honor_hint = false }
throttle = { k = 1.5, window_s = 30 }
"#;

const QUOTA: &str = r#"
retry = { backoff = "full_jitter", base_s = 0.5, cap_s = 4, max_attempts = 6, honor_hint = false }
retry_quota = { capacity = 40, cost = 5, success_increment = 1 }
"#;

fn hosted(layers: &str, seed: u64) -> Vec<Attempt> {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("endpoint.toml"), ENDPOINT).unwrap();
    let path = dir.path().join("suite.toml");
    let text = format!(
        "kind = \"hosted\"\nendpoint = \"endpoint.toml\"\nrows = 20000\nworkers = {WORKERS}\n\
         cooldown_s = 0\n{COMMON}\n[[experiment]]\nname = \"callers\"\nclient = \"pool\"\n{layers}"
    );
    let suite = HostedSuite::from_value(&path, toml::from_str(&text).unwrap()).unwrap();
    let mut seen = Vec::new();
    run_suite_observed(&suite, seed, &mut |a| seen.push(*a));
    seen
}

fn shared(layers: &str) -> SharedFile {
    let text = format!(
        "kind = \"shared\"\nmodel = \"ideal\"\nreject_latency_ms = 5\n{COMMON}\n\
         [deployment]\ncapacity = 30\nunit = \"rpm\"\nsemantics = \"rate-limit-only\"\nburst = 30\n\n\
         [[consumer]]\nname = \"app\"\n\n\
         [[scenario]]\nname = \"callers\"\nduration_s = {DURATION_S}\n\n\
         [[scenario.load]]\nwho = \"app\"\nworkers = {WORKERS}\n{layers}"
    );
    SharedFile::from_value("plan_callers.toml", toml::from_str(&text).unwrap()).unwrap()
}

fn plan(layers: &str, seed: u64) -> Vec<Attempt> {
    let file = shared(layers);
    let mut seen = Vec::new();
    let mut observe = |a: &Attempt| seen.push(*a);
    let probe = Probe {
        client_rng: Some(stream(seed, 1, component::CLIENT)),
        observe: Some(&mut observe),
    };
    let mut backend = IdealBackend::seed_nim();
    run_scenario_probed(&file, 0, Some(&file.limiter), &mut backend, seed, probe);
    seen
}

/// An attempt without its reply's hint (the one legitimate difference).
fn unhinted(mut a: Attempt) -> Attempt {
    if let Reply::Error { status, .. } = a.reply {
        a.reply = Reply::Error { status, hint: None };
    }
    a
}

#[derive(Debug, Default, PartialEq)]
struct Kinds {
    admitted: usize,
    limited: usize,
    local: usize,
    sdk_retries: usize,
    own_retries: usize,
    surfaced_429: usize,
}

fn kinds(seen: &[Attempt]) -> Kinds {
    let mut k = Kinds::default();
    for a in seen {
        match a.reply {
            Reply::Ok => k.admitted += 1,
            Reply::Error { .. } => k.limited += 1,
            Reply::LocalReject => k.local += 1,
        }
        match a.next {
            Next::SendAt {
                layer: qsim_sim::client::Layer::Sdk,
                ..
            } => k.sdk_retries += 1,
            Next::SendAt { .. } => k.own_retries += 1,
            Next::Done(o) if o.status == 429 => k.surfaced_429 += 1,
            Next::Done(_) => {}
        }
    }
    k
}

/// Both drivers' attempts answered before the scenario's end, compared one
/// by one; returns the kinds of attempts compared.
fn same_attempts(layers: &str, seed: u64) -> Kinds {
    let end = DURATION_S * NS_PER_SEC;
    let p: Vec<Attempt> = plan(layers, seed).into_iter().map(unhinted).collect();
    let h_all = hosted(layers, seed);
    let last_row = p.iter().map(|a| a.row).max().unwrap();
    assert!(
        h_all
            .iter()
            .any(|a| a.replied >= end && a.row > last_row + WORKERS as u64),
        "the hosted run must outlast the scenario with rows to spare"
    );
    let h: Vec<Attempt> = h_all
        .into_iter()
        .filter(|a| a.replied < end)
        .map(unhinted)
        .collect();
    for (i, (a, b)) in p.iter().zip(&h).enumerate() {
        assert_eq!(
            a, b,
            "attempt {i} differs (plan left, hosted right); the {} before agree",
            i
        );
    }
    assert_eq!(
        p.len(),
        h.len(),
        "the plan saw {} attempts before the end, the hosted driver {}",
        p.len(),
        h.len()
    );
    kinds(&p)
}

/// SDK hidden retries and an adaptive throttle: the issue's acceptance case.
#[test]
fn sdk_retries_and_throttle_agree_with_the_hosted_driver() {
    for seed in [1, 7] {
        let k = same_attempts(THROTTLE, seed);
        // the comparison covers every layer: admitted and limited attempts,
        // local rejections by the throttle, SDK-hidden and own retries, and
        // rows that surfaced a 429 to the caller
        assert!(k.admitted > 100, "seed {seed}: {k:?}");
        assert!(k.limited > 50, "seed {seed}: {k:?}");
        assert!(k.local > 10, "seed {seed}: {k:?}");
        assert!(k.sdk_retries > 10, "seed {seed}: {k:?}");
        assert!(k.own_retries > 10, "seed {seed}: {k:?}");
        assert!(k.surfaced_429 > 0, "seed {seed}: {k:?}");
    }
}

/// SDK hidden retries and a retry quota that runs dry.
#[test]
fn sdk_retries_and_retry_quota_agree_with_the_hosted_driver() {
    let k = same_attempts(QUOTA, 3);
    assert!(k.sdk_retries > 10 && k.own_retries > 10, "{k:?}");
    assert!(k.surfaced_429 > 0, "{k:?}");
    // the quota refused retries the policy wanted
    let quota_denied = plan(QUOTA, 3)
        .iter()
        .filter(|a| matches!(a.next, Next::Done(o) if o.quota_denied))
        .count();
    assert!(quota_denied > 0, "the quota never ran dry: {k:?}");
}
