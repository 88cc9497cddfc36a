//! `qsim replay`: an experiment file's client side run for real against an
//! endpoint. This module compiles the experiment into the live driver's
//! plans (`qsim_live::replay`: the same `Call`/`Managed` state machines the
//! simulation runs), makes or reads the rows, guards the budget, and writes
//! the attempt log, the per-row outcomes and the summary records (the same
//! `(seed, subject, metric, value)` schema as `qsim run`, so the same report
//! renders them and `qsim compare` reads them).

pub use qsim_live::replay::Wire;
use qsim_live::replay::{self as live, Attempt, Run, Target};
use qsim_results::Values;
use qsim_sim::config::ConfigError;
use qsim_sim::engine::rng::{component, draws, stream};
use qsim_sim::engine::DurationHist;
use qsim_sim::experiment::config::{ClientKind, Experiment};
use qsim_sim::experiment::hosted::HostedResult;
use qsim_sim::experiment::HostedSuite;
use qsim_sim::report;
use qsim_sim::report::records::{PointRecords, Records};
use qsim_sim::report::Format;
use qsim_sim::time::Nanos;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// What `qsim replay` is asked (a plain spec; the fields are the flags but
/// `--out`, which the door writes).
#[derive(Debug, Clone, PartialEq)]
pub struct Spec {
    /// The experiment file (a hosted-API experiment, `kind = "hosted"`).
    pub file: PathBuf,
    /// The endpoint's base URL, as an OpenAI SDK's `base_url`
    /// (`http://127.0.0.1:8000/v1`, `https://WORKSPACE/serving-endpoints`);
    /// a bare `http://host:port` gets `/v1`.
    pub target: String,
    /// The model name sent (default: the experiment's endpoint profile name).
    pub model: Option<String>,
    /// The wire format.
    pub wire: Wire,
    /// Ask for SSE streams (and record TTFT).
    pub stream: bool,
    /// The environment variable holding the bearer token (never printed).
    pub token_env: Option<String>,
    /// Read the prompts from this CSV or JSONL file (its first `rows` rows)
    /// instead of generating them as the experiment does.
    pub rows: Option<PathBuf>,
    /// The column (CSV header or JSONL key) holding the prompt.
    pub prompt_column: String,
    /// Model seconds per real second: every client-side duration (backoff,
    /// SDK delays, timeouts, the cool-down) is divided by it, every observed
    /// duration multiplied (for time-scaled endpoints such as `qsim serve
    /// --time-scale`).
    pub time_scale: f64,
    /// Stop the whole replay after this long (model time; `s` or `ms`).
    pub timeout: qsim_sim::time::Nanos,
    /// Longest one HTTP attempt may take (model time; the OpenAI SDK's 600 s).
    pub attempt_timeout: qsim_sim::time::Nanos,
    /// Spend the budget against a target that is not on this machine
    /// (refused without it, naming `--yes`).
    pub yes: bool,
    /// Seed of the client's random draws (jitter) and the generated rows.
    pub seed: u64,
    /// The report's format.
    pub format: Format,
    /// Override a scalar in the file (as `qsim run --set`).
    pub sets: Vec<String>,
    /// Replay only these experiments (comma-separated names).
    pub only: Vec<String>,
}

/// A replay's outcome: every experiment's run (and the client kind it
/// reports as), the summary records (`qsim run`'s schema) and the report.
#[derive(Debug, Clone)]
pub struct Replayed {
    pub target_url: String,
    pub runs: Vec<(Run, &'static str)>,
    pub records: Records,
    /// The report in the spec's format.
    pub text: String,
}

impl Replayed {
    /// The attempt log (attempts.csv / .parquet).
    pub fn attempts_table(&self) -> Table {
        attempts_table(&self.just_runs())
    }
    /// The per-row outcomes (rows.csv / .parquet).
    pub fn rows_table(&self) -> Table {
        rows_table(&self.just_runs())
    }
    /// The summary records as CSV (summary.csv).
    pub fn summary_csv(&self) -> String {
        report::records::to_csv(&[PointRecords {
            params: vec![],
            records: self.records.clone(),
        }])
    }
    fn just_runs(&self) -> Vec<Run> {
        self.runs.iter().map(|(r, _)| r.clone()).collect()
    }
    /// Why the replay failed (exit 1) when not one attempt reached the
    /// target: every attempt sent failed to connect or in the TLS handshake.
    pub fn unreached(&self) -> Option<String> {
        unreached(&self.runs, &self.target_url)
    }
}

/// A results table: named, typed columns (qsim-results' one table type).
pub type Table = Vec<qsim_results::NamedColumn>;

/// Named columns from (name, values) pairs.
fn cols(c: Vec<(&str, Values)>) -> Table {
    c.into_iter()
        .map(|(n, v)| qsim_results::NamedColumn::new(n, v))
        .collect()
}

fn s(ns: Nanos) -> f64 {
    ns as f64 / 1e9
}

/// The attempt log of every experiment, one row per HTTP attempt.
pub fn attempts_table(runs: &[Run]) -> Table {
    let all: Vec<(&str, &Attempt)> = runs
        .iter()
        .flat_map(|r| r.attempts.iter().map(move |a| (r.name.as_str(), a)))
        .collect();
    let u =
        |f: &dyn Fn(&Attempt) -> Option<u64>| Values::U64(all.iter().map(|(_, a)| f(a)).collect());
    let fl =
        |f: &dyn Fn(&Attempt) -> Option<f64>| Values::F64(all.iter().map(|(_, a)| f(a)).collect());
    let st = |f: &dyn Fn(&Attempt) -> Option<String>| {
        Values::Str(all.iter().map(|(_, a)| f(a)).collect())
    };
    cols(vec![
        (
            "experiment",
            Values::Str(all.iter().map(|(n, _)| Some(n.to_string())).collect()),
        ),
        ("row", u(&|a| Some(a.row))),
        ("attempt", u(&|a| Some(a.attempt as u64))),
        ("sdk_retry", u(&|a| Some(a.sdk_retry as u64))),
        ("status", u(&|a| a.status.map(u64::from))),
        ("retry_hint_s", fl(&|a| a.hint.map(s))),
        ("start_s", fl(&|a| Some(s(a.start)))),
        (
            "ttft_s",
            fl(&|a| a.ttft.map(|t| s(t.saturating_sub(a.start)))),
        ),
        ("end_s", fl(&|a| Some(s(a.end)))),
        ("input_tokens", u(&|a| a.input_tokens)),
        ("output_tokens", u(&|a| a.output_tokens)),
        ("finish_reason", st(&|a| a.finish_reason.clone())),
        ("error_kind", st(&|a| a.error_kind.map(str::to_string))),
        ("error", st(&|a| a.error.clone())),
    ])
}

/// Every row of every experiment, finished or not.
pub fn rows_table(runs: &[Run]) -> Table {
    let all: Vec<(&str, &live::RowResult)> = runs
        .iter()
        .flat_map(|r| r.rows.iter().map(move |x| (r.name.as_str(), x)))
        .collect();
    cols(vec![
        (
            "experiment",
            Values::Str(all.iter().map(|(n, _)| Some(n.to_string())).collect()),
        ),
        (
            "row",
            Values::U64(all.iter().map(|(_, r)| Some(r.row)).collect()),
        ),
        (
            "status",
            Values::U64(all.iter().map(|(_, r)| r.status.map(u64::from)).collect()),
        ),
        (
            "attempts",
            Values::U64(all.iter().map(|(_, r)| Some(r.attempts as u64)).collect()),
        ),
        (
            "latency_s",
            Values::F64(
                all.iter()
                    .map(|(_, r)| r.status.map(|_| s(r.latency)))
                    .collect(),
            ),
        ),
        (
            "own_wait_s",
            Values::F64(all.iter().map(|(_, r)| Some(s(r.own_wait))).collect()),
        ),
        (
            "output_tokens",
            Values::U64(all.iter().map(|(_, r)| Some(r.output_tokens)).collect()),
        ),
        (
            "finish_reason",
            Values::Str(all.iter().map(|(_, r)| r.finish_reason.clone()).collect()),
        ),
        (
            "error",
            Values::Str(all.iter().map(|(_, r)| r.error.clone()).collect()),
        ),
    ])
}

/// The error kinds a replay reports, in report order.
pub const ERROR_KINDS: &[&str] = &[
    "status",
    "connect",
    "tls",
    "timeout",
    "http",
    "body",
    "non_json",
    "truncated_stream",
    "bad_answer",
    "deadline",
];

/// One experiment's observation as the simulator's result type, so the
/// same records, report and comparison apply.
pub fn observed(run: &Run, client: &'static str) -> HostedResult {
    let mut r = HostedResult {
        name: run.name.clone(),
        client,
        elapsed: run.elapsed,
        total: 0,
        ok: 0,
        rejected_429: 0,
        failed_other: 0,
        latency: DurationHist::new(),
        own_wait: 0,
        output_tokens: 0,
        input_tokens: 0,
        price: None,
        provisioned: None,
        truncated: 0,
        retried: 0,
        max_attempts: 0,
        max_wait: 0,
        http_requests: 0,
        http_429: 0,
        sdk_retries: run.sdk_retries,
        local_rejects: 0,
        quota_denied: 0,
        limit_hits: vec![],
        final_concurrency: run.final_window,
    };
    for row in &run.rows {
        let Some(status) = row.status else { continue };
        r.total += 1;
        r.latency.record(row.latency);
        r.own_wait += row.own_wait;
        r.max_wait = r.max_wait.max(row.own_wait);
        r.max_attempts = r.max_attempts.max(row.attempts);
        r.retried += (row.attempts > 1) as u64;
        r.quota_denied += row.quota_denied as u64;
        match status {
            200 => {
                r.ok += 1;
                r.output_tokens += row.output_tokens;
                r.truncated += (row.finish_reason.as_deref() == Some("length")) as u64;
            }
            429 => r.rejected_429 += 1,
            _ => r.failed_other += 1,
        }
    }
    for a in &run.attempts {
        if a.sent() {
            r.http_requests += 1;
            r.http_429 += (a.status == Some(429)) as u64;
        } else {
            r.local_rejects += 1;
        }
    }
    r
}

/// The replay's records: `qsim run`'s metrics, plus rows not finished and
/// attempt errors by kind.
pub fn records(seed: u64, runs: &[(Run, &'static str)]) -> Records {
    let mut out = Records::default();
    for (run, client) in runs {
        report::hosted::records(&mut out, seed, &[observed(run, client)]);
        let unfinished = run.rows.iter().filter(|r| r.status.is_none()).count();
        out.push(seed, &run.name, "rows_unfinished", unfinished as f64);
        let errs = run
            .attempts
            .iter()
            .filter(|a| a.sent() && a.error_kind.is_some());
        out.push(
            seed,
            &run.name,
            "attempt_errors",
            errs.clone().count() as f64,
        );
        for k in ERROR_KINDS {
            let n = errs.clone().filter(|a| a.error_kind == Some(k)).count();
            out.push(seed, &run.name, &format!("attempt_errors.{k}"), n as f64);
        }
    }
    out
}

/// Whether a URL's host is this machine (127.0.0.0/8, ::1, localhost).
pub fn is_loopback(url: &str) -> bool {
    let rest = url.split_once("://").map_or(url, |x| x.1);
    let auth = rest.split('/').next().unwrap_or("");
    let host = auth.rsplit_once('@').map_or(auth, |x| x.1);
    let host = if let Some(h) = host.strip_prefix('[') {
        h.split(']').next().unwrap_or("")
    } else {
        host.split(':').next().unwrap_or("")
    };
    host.eq_ignore_ascii_case("localhost")
        || host == "::1"
        || host
            .parse::<std::net::Ipv4Addr>()
            .is_ok_and(|a| a.is_loopback())
}

/// Validate `--target` and make the base URL.
fn base_url(target: &str, wire: Wire) -> Result<String, ConfigError> {
    let bad = |r: &str| ConfigError::new("--target", "", format!("{target:?}: {r}"));
    let rest = target
        .strip_prefix("http://")
        .or_else(|| target.strip_prefix("https://"))
        .ok_or_else(|| bad("expected an http:// or https:// URL"))?;
    if rest.is_empty() || rest.starts_with('/') {
        return Err(bad("no host"));
    }
    if target.parse::<qsim_live::Uri>().is_err() {
        return Err(bad("not a valid URL"));
    }
    let base = target.trim_end_matches('/').to_string();
    let has_path = rest.trim_end_matches('/').contains('/');
    Ok(if !has_path && wire == Wire::OpenAi {
        format!("{base}/v1")
    } else {
        base
    })
}

/// Prompts from a CSV (header row) or JSONL file: the `col` of each row.
/// A missing column is bad input naming it (exit 2).
pub fn read_prompts(path: &Path, col: &str) -> Result<Vec<String>, ConfigError> {
    let f = path.display().to_string();
    if matches!(
        path.extension()
            .and_then(|e| e.to_str())
            .map(|e| e.to_ascii_lowercase())
            .as_deref(),
        Some("parquet" | "pq")
    ) {
        // Parquet through qsim-results (polars)
        return qsim_results::read_column(path, col, &qsim_sim::input::load_data).map_err(|e| {
            let field = if e.reason.contains(col) {
                "--prompt-column"
            } else {
                ""
            };
            ConfigError::new(&f, field, e.reason)
        });
    }
    let text = qsim_sim::input::read_text(path, qsim_sim::input::Kind::Data)
        .map_err(|e| ConfigError::new(&f, "", e))?;
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .unwrap_or("")
        .to_ascii_lowercase();
    match ext.as_str() {
        "jsonl" | "ndjson" => {
            let mut out = Vec::new();
            for (i, line) in text.lines().enumerate() {
                if line.trim().is_empty() {
                    continue;
                }
                let v: serde_json::Value = serde_json::from_str(line).map_err(|e| {
                    ConfigError::new(&f, format!("line {}", i + 1), format!("not JSON: {e}"))
                })?;
                let p = v.get(col).ok_or_else(|| {
                    let keys: Vec<&str> = v
                        .as_object()
                        .map(|o| o.keys().map(String::as_str).collect())
                        .unwrap_or_default();
                    ConfigError::new(
                        &f,
                        "--prompt-column",
                        format!(
                            "no key {col:?} on line {}; it has {}",
                            i + 1,
                            if keys.is_empty() {
                                "none".to_string()
                            } else {
                                keys.join(", ")
                            }
                        ),
                    )
                })?;
                out.push(match p {
                    serde_json::Value::String(s) => s.clone(),
                    other => other.to_string(),
                });
            }
            Ok(out)
        }
        "csv" => {
            let mut r = csv::Reader::from_reader(text.as_bytes());
            let headers = r
                .headers()
                .map_err(|e| ConfigError::new(&f, "", format!("bad CSV header: {e}")))?
                .clone();
            let k = headers.iter().position(|h| h == col).ok_or_else(|| {
                ConfigError::new(
                    &f,
                    "--prompt-column",
                    format!(
                        "no column {col:?}; the file has {}",
                        headers.iter().collect::<Vec<_>>().join(", ")
                    ),
                )
            })?;
            let mut out = Vec::new();
            for (i, rec) in r.records().enumerate() {
                let rec = rec.map_err(|e| {
                    ConfigError::new(&f, format!("row {}", i + 1), format!("bad CSV: {e}"))
                })?;
                out.push(rec.get(k).unwrap_or("").to_string());
            }
            Ok(out)
        }
        other => Err(ConfigError::new(
            &f,
            "",
            format!("rows files are .csv or .jsonl (got {other:?})"),
        )),
    }
}

/// Three-letter words: each is one token for common tokenizers and four
/// bytes (one token for byte/4 estimates) with its space.
const WORDS: &[&str] = &[
    "the", "food", "was", "and", "our", "but", "not", "too", "far", "bad", "new", "old", "hot",
    "set", "fun", "big", "low", "top", "day", "way",
];

fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A generated prompt of about `tokens` tokens for row `i` (distinct per row).
pub fn generated_prompt(i: u64, tokens: u64) -> String {
    let mut p = format!("Summarise review {i} in three sentences:");
    let words = tokens.saturating_sub(6).max(1);
    for k in 0..words {
        p.push(' ');
        let w = WORDS[(mix(i.wrapping_mul(1_000_003) ^ k) % WORDS.len() as u64) as usize];
        p.push_str(if k == 0 { "the" } else { w });
    }
    p
}

/// The rows of one experiment: generated as the simulation draws them (row
/// `i`'s input size from the same workload stream), or the file's first
/// `rows` prompts.
fn plan_rows(
    suite: &HostedSuite,
    e: &Experiment,
    seed: u64,
    file: Option<&[String]>,
) -> Vec<live::Row> {
    match file {
        Some(prompts) => prompts
            .iter()
            .take(e.rows as usize)
            .enumerate()
            .map(|(i, p)| live::Row {
                index: i as u64,
                prompt: p.clone(),
            })
            .collect(),
        None => {
            let mut rng = stream(seed, 0, component::WORKLOAD);
            (0..e.rows)
                .map(|i| {
                    let input = suite.input_tokens.sample(&mut rng).round().max(1.0) as u64;
                    let _natural = suite.output_tokens.sample(&mut rng);
                    live::Row {
                        index: i,
                        prompt: generated_prompt(i, input),
                    }
                })
                .collect()
        }
    }
}

fn client_of(e: &Experiment) -> (live::Client, &'static str) {
    match &e.client {
        ClientKind::Pool {
            workers,
            caller,
            shared,
        } => (
            live::Client::Pool {
                workers: *workers,
                caller: caller.clone(),
                shared: shared.clone(),
            },
            "pool",
        ),
        ClientKind::Managed(p) => (live::Client::Managed(p.clone()), "managed"),
    }
}

/// Requests one row may cost at most.
fn max_requests_per_row(e: &Experiment) -> u64 {
    match &e.client {
        ClientKind::Pool { caller, .. } => {
            let sdk = caller.sdk.as_ref().map_or(0, |s| s.max_retries as u64);
            caller.retry.max_attempts.max(1) as u64 * (1 + sdk)
        }
        ClientKind::Managed(p) => p.max_attempts.max(1) as u64,
    }
}

/// What the replay may spend: (lines to print, first-attempt requests).
fn budget(plans: &[(live::Plan, &Experiment)]) -> String {
    let mut out = String::new();
    let (mut req_lo, mut req_hi, mut tok_lo, mut tok_hi) = (0u64, 0u64, 0u64, 0u64);
    for (p, e) in plans {
        let input: u64 = p.rows.iter().map(|r| r.prompt.len() as u64 / 4 + 1).sum();
        let n = p.rows.len() as u64;
        let per = max_requests_per_row(e);
        let first = input + n * p.max_tokens;
        out.push_str(&format!(
            "  {}: {n} rows, {n}..{} requests, ~{first} tokens for first attempts (~{input} input + {} max_tokens), at most ~{} tokens\n",
            p.name,
            n * per,
            n * p.max_tokens,
            first * per
        ));
        req_lo += n;
        req_hi += n * per;
        tok_lo += first;
        tok_hi += first * per;
    }
    out.push_str(&format!(
        "  total: {req_lo}..{req_hi} requests, ~{tok_lo}..{tok_hi} tokens (input estimated at 4 bytes per token)\n"
    ));
    out
}

pub fn run(a: &Spec, log: &mut dyn FnMut(&str)) -> Result<Replayed, crate::Error> {
    if !(a.time_scale.is_finite() && a.time_scale > 0.0) {
        return Err(ConfigError::new(
            "--time-scale",
            "",
            format!("must be > 0, got {}", a.time_scale),
        )
        .into());
    }
    let wire = a.wire;
    let base = base_url(&a.target, wire)?;
    let token = match &a.token_env {
        None => None,
        Some(var) => Some(std::env::var(var).map_err(|_| {
            ConfigError::new(
                "--token-env",
                "",
                format!("the environment variable {var} is not set"),
            )
        })?),
    };
    let ef = qsim_sim::experiment::load_file(&a.file, &a.sets)?;
    let fname = a.file.display().to_string();
    let Some(mut suite) = ef.into_hosted() else {
        return Err(ConfigError::new(
            &fname,
            "kind",
            "qsim replay runs hosted-API experiments (kind = \"hosted\"): their client side is what it replays",
        )
        .into());
    };
    suite.retain_only(&a.only)?;
    let prompts = match &a.rows {
        None => None,
        Some(p) => Some(read_prompts(p, &a.prompt_column)?),
    };
    if let Some(p) = &prompts {
        if p.is_empty() {
            return Err(ConfigError::new(
                a.rows.as_ref().unwrap().display().to_string(),
                "",
                "no rows",
            )
            .into());
        }
    }
    let model = a
        .model
        .clone()
        .unwrap_or_else(|| suite.profile.name.clone());
    let target = Target {
        base,
        wire,
        model: model.clone(),
        token,
        stream: a.stream,
    };
    let plans: Vec<(live::Plan, &Experiment)> = suite
        .experiments
        .iter()
        .map(|e| {
            let (client, _) = client_of(e);
            (
                live::Plan {
                    name: e.name.clone(),
                    client,
                    max_tokens: e.max_tokens,
                    rows: plan_rows(&suite, e, a.seed, prompts.as_deref()),
                },
                e,
            )
        })
        .collect();
    let url = target.url();
    let spend = budget(&plans);
    if !is_loopback(&url) {
        log(&format!(
            "qsim replay: about to send to {url} (model {model}):\n{spend}"
        ));
        if !a.yes {
            return Err(ConfigError::new(
                "--yes",
                "",
                format!("the target {url} is not on this machine: rerun with --yes to spend the budget printed above"),
            )
            .into());
        }
    }
    let total = a.timeout;
    let attempt_timeout = a.attempt_timeout;
    let started = std::time::Instant::now();
    let mut runs: Vec<(Run, &'static str)> = Vec::new();
    for (k, (plan, e)) in plans.iter().enumerate() {
        let used = (started.elapsed().as_secs_f64() * a.time_scale * 1e9) as Nanos;
        let mut rng = stream(a.seed, 1 + e.index, component::CLIENT);
        let mut u = draws(&mut rng);
        let opts = live::Options {
            time_scale: a.time_scale,
            attempt_timeout,
            deadline: total.saturating_sub(used),
        };
        log(&format!(
            "qsim replay: {} ({} rows) -> {url}\n",
            plan.name,
            plan.rows.len()
        ));
        let run = live::run(&target, plan, opts, &mut u).map_err(crate::Error::Io)?;
        let (_, client) = client_of(e);
        let timed_out = run.timed_out;
        runs.push((run, client));
        if timed_out {
            // the rest are not started: their rows are written as such
            for (p, e2) in &plans[k + 1..] {
                runs.push((
                    Run {
                        name: p.name.clone(),
                        rows: p
                            .rows
                            .iter()
                            .map(|r| live::RowResult {
                                row: r.index,
                                error: Some("not started: the replay's --timeout passed".into()),
                                ..Default::default()
                            })
                            .collect(),
                        timed_out: true,
                        ..Default::default()
                    },
                    client_of(e2).1,
                ));
            }
            break;
        }
        if k + 1 < plans.len() && suite.cooldown > 0 {
            let real =
                std::time::Duration::from_secs_f64(suite.cooldown as f64 / 1e9 / a.time_scale);
            log(&format!(
                "qsim replay: cool-down {:.1} s (real)\n",
                real.as_secs_f64()
            ));
            std::thread::sleep(real);
        }
    }
    let records = records(a.seed, &runs);
    // the report: `qsim run`'s, about the target instead of a profile
    let mut view = suite.clone();
    let mut profile = (*suite.profile).clone();
    profile.name = model;
    profile.limits.clear();
    view.profile = Arc::new(profile);
    view.profile_path = url;
    view.title = format!("replay: {}", suite.title);
    let text = match a.format {
        Format::Csv => report::records::to_csv(&[PointRecords {
            params: vec![],
            records: records.clone(),
        }]),
        Format::Json => {
            let sp = records.spreads();
            let aggs = report::hosted::aggregate(&view, &sp);
            let mut v = report::hosted::render_json(&view, &fname, a.seed, &aggs);
            let extra: serde_json::Map<String, serde_json::Value> = runs
                .iter()
                .map(|(r, _)| {
                    let mut m = serde_json::Map::new();
                    m.insert(
                        "rows_unfinished".into(),
                        sp.get(&r.name, "rows_unfinished").median.into(),
                    );
                    for k in std::iter::once("attempt_errors".to_string())
                        .chain(ERROR_KINDS.iter().map(|k| format!("attempt_errors.{k}")))
                    {
                        m.insert(k.clone(), (sp.get(&r.name, &k).median as u64).into());
                    }
                    (r.name.clone(), m.into())
                })
                .collect();
            v["replay"] = serde_json::json!({
                "target": target.url(),
                "time_scale": a.time_scale,
                "experiments": extra,
            });
            report::json_text(&v)
        }
        Format::Table => {
            let sp = records.spreads();
            let aggs = report::hosted::aggregate(&view, &sp);
            let mut t = report::hosted::render_table(&view, &fname, a.seed, &aggs);
            let mut tab = report::table::Table::new(
                std::iter::once("attempt errors".to_string())
                    .chain(runs.iter().map(|(r, _)| r.name.clone())),
            );
            let mut keys = vec!["rows_unfinished".to_string(), "attempt_errors".to_string()];
            keys.extend(ERROR_KINDS.iter().map(|k| format!("attempt_errors.{k}")));
            for k in keys {
                if k.contains('.') && runs.iter().all(|(r, _)| sp.get(&r.name, &k).median == 0.0) {
                    continue;
                }
                tab.row(
                    std::iter::once(k.clone()).chain(
                        runs.iter()
                            .map(|(r, _)| format!("{}", sp.get(&r.name, &k).median as u64)),
                    ),
                );
            }
            t.push('\n');
            t.push_str(&tab.render());
            if a.time_scale != 1.0 {
                t.push_str(&format!(
                    "\ntimes are model time: observed real durations x {}\n",
                    a.time_scale
                ));
            }
            t
        }
    };
    Ok(Replayed {
        target_url: target.url(),
        runs,
        records,
        text,
    })
}

/// Exit 1 (after the records and the report are written) when not one
/// attempt reached the target: every attempt sent failed to connect or in
/// the TLS handshake (a target that is down, a wrong port or scheme).
fn unreached(runs: &[(Run, impl Sized)], url: &str) -> Option<String> {
    let mut sent = runs
        .iter()
        .flat_map(|(r, _)| &r.attempts)
        .filter(|a| a.sent())
        .peekable();
    let Some(first) = sent.peek().map(|a| (*a).clone()) else {
        return None;
    };
    let mut n = 0;
    for a in sent {
        if !matches!(a.error_kind, Some("connect" | "tls")) {
            return None;
        }
        n += 1;
    }
    Some(format!(
        "replay: no request reached {url}: all {n} attempts failed ({})",
        first.error.as_deref().unwrap_or("no answer")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_hosts_only() {
        for u in [
            "http://127.0.0.1:8000/v1",
            "http://127.3.2.1",
            "http://localhost:9/x",
            "http://[::1]:8000",
            "https://user@127.0.0.1/serving-endpoints",
        ] {
            assert!(is_loopback(u), "{u}");
        }
        for u in [
            "https://adb-1.azuredatabricks.net/serving-endpoints",
            "http://10.0.0.1:8000",
            "http://127.0.0.1.example.com",
            "http://[::2]:80",
        ] {
            assert!(!is_loopback(u), "{u}");
        }
    }

    #[test]
    fn base_urls() {
        let b = |t: &str, w| base_url(t, w).map_err(|e| e.to_string());
        assert_eq!(
            b("http://127.0.0.1:8000", Wire::OpenAi).unwrap(),
            "http://127.0.0.1:8000/v1"
        );
        assert_eq!(
            b("http://127.0.0.1:8000/", Wire::OpenAi).unwrap(),
            "http://127.0.0.1:8000/v1"
        );
        assert_eq!(
            b("https://h/serving-endpoints/", Wire::Databricks).unwrap(),
            "https://h/serving-endpoints"
        );
        assert_eq!(b("http://h:1/v1", Wire::OpenAi).unwrap(), "http://h:1/v1");
        assert!(b("ftp://h", Wire::OpenAi)
            .unwrap_err()
            .contains("http:// or https://"));
        assert!(b("http://", Wire::OpenAi).unwrap_err().contains("no host"));
    }

    #[test]
    fn generated_prompts_are_distinct_and_about_the_asked_size() {
        let a = generated_prompt(1, 250);
        let b = generated_prompt(2, 250);
        assert_ne!(a, b);
        assert!(a.starts_with("Summarise review 1 in three sentences: the "));
        let words = a.split(' ').count() as u64;
        assert!((245..=255).contains(&words), "{words}");
        assert_eq!(generated_prompt(1, 250), a, "deterministic");
    }
}
