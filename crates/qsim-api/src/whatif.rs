//! `qsim whatif`: the proxy's decision log (`[proxy.log]`, see
//! `crates/qsim-live/src/record.rs`) replayed through the same limiter
//! (`qsim_core::limiter::admission`) under a proposed policy, in virtual
//! time, reported per consumer and per minute beside what was observed.
//!
//! **Arrivals.** Each logged request the limiter decided (admitted, waited,
//! limited, refused, or refused because the shared state was down) is
//! replayed at the core time of its decision (`decided_ns`, else its
//! arrival; a waiter's at its arrival), with its estimated input tokens and `max_tokens`. Admitted
//! requests complete after their observed duration (decision to settlement)
//! with their observed settled output; a request the log never saw admitted
//! takes its caller's other attempt's figures, else its consumer's median.
//! Invalid requests (401/400/413) never reached the limiter and are not
//! replayed. Several proxy runs in one directory (restarts) are laid on one
//! time line by their start's wall clock (times of a shared-state clock,
//! already common to all runs, are kept).
//!
//! **Callers.** A request carrying `x-stainless-retry-count: k` (the OpenAI
//! SDKs' attempt number) is linked to an earlier denied attempt `k − 1` of
//! the same consumer (the one whose retry hint points closest to it): the
//! chain is replayed as one caller. Its first attempt arrives at its logged
//! time; when the replayed limiter denies an attempt, the caller's next one
//! comes at the replayed retry time plus the lag the caller showed after
//! the logged hint (or, without a hint, after its logged gap); a caller
//! admitted sooner sends no further attempt; one denied more often retries
//! up to the most attempts its consumer's callers made in the log. Requests
//! without the header are independent arrivals.
//!
//! **Waiting.** A consumer with `on_limit = "wait"` in the proposed policy
//! is replayed through the proxy's own waiting rules
//! (`qsim_core::limiter::wait`, the component `qsim-live/src/wait.rs`
//! drives), in the proxy's order of operations: its requests queue FIFO per
//! consumer (a newcomer behind waiters joins the queue, refused at once when
//! its prediction behind them is beyond its bound), only the head decides,
//! at the limiter's retry time, on a completion, or (a `concurrent` denial)
//! every 100 ms, and a head admitted or refused hands the turn to the next
//! one at once. The client's deadline is not logged, so only `max_wait`
//! bounds a wait. A logged request that waited (or was refused as a waiter)
//! is replayed at its arrival, not at the end of its wait. A refused caller
//! retries after the hint the proxy gives (`qsim_live::wait_ms`: whole
//! milliseconds, rounded up).
//!
//! **Events.** One [`EventQueue`] (the simulation engine's): at equal times,
//! events run in the order they were scheduled.
//!
//! **Restarts.** The limiter state starts empty at the window's start. A
//! log that spans several proxy runs (their `run_unix_ms` differ: the
//! proxy was restarted on the same directory) held a fresh in-memory
//! limiter in each: the what-if's limiter starts afresh at each later
//! run's start too (completions of requests admitted before it no longer
//! credit the new state; waiting requests keep waiting), and the output
//! says so. Runs on a shared-state clock (Redis) kept their state across
//! restarts and are replayed as one limiter, as they ran. Minutes are
//! counted from the window's start (default: the first replayed request).

use qsim_core::limiter::admission::{complete, decide, Decision, Limit, Params, Request, State};
use qsim_core::limiter::wait::{self, Bound, Next, Queues, Refusal, Waiter};
use qsim_core::time::{Nanos, NEVER};
use qsim_live::record::Record;
use qsim_live::OnLimit;
use qsim_results::{NamedColumn, Values};
use qsim_sim::config::ConfigError;
use qsim_sim::engine::EventQueue;
use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::{Path, PathBuf};

pub use qsim_sim::plan::routes_whatif::RouteWhatif;

/// What to replay: a decision log, a proposed policy, a window.
#[derive(Debug, Clone, Default)]
pub struct Spec {
    /// The proxy's decision-log directory (`[proxy.log] dir`).
    pub log: PathBuf,
    /// The proposed policy: a proxy config (kind = "proxy", e.g. from
    /// `qsim plan --emit-proxy-config`); with `[[upstream]]`/`[[route]]`
    /// tables, the admitted requests are replayed through its routes too.
    pub policy: PathBuf,
    /// Only the requests in FROM..TO (seconds of the log's time from its
    /// first request, `90`, `90s`, `2m`; either side may be left out).
    pub window: Option<String>,
}

/// How a [`Whatif`] is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Per consumer and minute, observed/what-if; the routes' table after.
    Table,
    Json,
    Csv,
}

impl Format {
    /// `table`, `json` or `csv` (the error names `--format`).
    pub fn parse(s: &str) -> Result<Format, ConfigError> {
        match s {
            "table" => Ok(Format::Table),
            "json" => Ok(Format::Json),
            "csv" => Ok(Format::Csv),
            f => Err(ConfigError::new(
                "--format",
                "",
                format!("expected table, json or csv, got {f:?}"),
            )),
        }
    }
}

/// A log replayed under a proposed policy.
#[derive(Debug)]
pub struct Whatif {
    /// The log directory and the policy file, as given.
    pub log: String,
    pub policy: String,
    /// The limiter's replay, per consumer and minute.
    pub outcome: Outcome,
    /// The admitted requests through the policy's routes (when it has
    /// `[[upstream]]`/`[[route]]` tables).
    pub routes: Option<RouteWhatif>,
}

/// Replay the decision log of `spec.log` under the policy `spec.policy`:
/// the limiter's decisions per consumer and minute beside the logged ones,
/// and (with routes) where the admitted requests would have gone. Bad
/// input (the window, the policy, the log) is an [`crate::Error::Config`]
/// naming it.
///
/// ```no_run
/// use qsim_api::whatif::{run, Format, Spec};
/// let w = run(&Spec {
///     log: "decisions".into(),
///     policy: "p40.toml".into(),
///     window: Some("..2m".into()),
/// })?;
/// print!("{}", w.render(Format::Table));
/// # Ok::<(), qsim_api::Error>(())
/// ```
pub fn run(spec: &Spec) -> Result<Whatif, crate::Error> {
    let window = match &spec.window {
        Some(w) => parse_window(w)?,
        None => (None, None),
    };
    let (params, on_limit, routes) = load_policy(&spec.policy)?;
    let recs = read_log(&spec.log)?;
    let outcome = replay(&recs, &params, &on_limit, window);
    let routes = routes
        .map(|cfg| qsim_sim::plan::routes_whatif::replay(&logged_requests(&recs, window), &cfg));
    Ok(Whatif {
        log: spec.log.display().to_string(),
        policy: spec.policy.display().to_string(),
        outcome,
        routes,
    })
}

impl Whatif {
    /// The report: a table (the routes' after the limiter's), JSON or CSV
    /// (the limiter's rows only).
    pub fn render(&self, format: Format) -> String {
        let mut s = render(self, format);
        if let (Some(w), Format::Table) = (&self.routes, format) {
            s.push_str(&qsim_sim::plan::routes_whatif::render(w));
        }
        s
    }

    /// Write `whatif.csv` and `whatif.parquet` (per consumer and minute)
    /// into `dir`; an existing `whatif.csv` only with `force`.
    pub fn write_tables(&self, dir: &Path, force: bool) -> Result<(), crate::Error> {
        std::fs::create_dir_all(dir)
            .map_err(|e| crate::Error::Io(format!("{}: {e}", dir.display())))?;
        let stem = dir.join("whatif");
        if !force && stem.with_extension("csv").exists() {
            return Err(ConfigError::new(
                "--out",
                "",
                format!(
                    "{}: exists (use --force)",
                    stem.with_extension("csv").display()
                ),
            )
            .into());
        }
        qsim_results::write_table(&stem, &table_columns(&self.outcome))
            .map(|_| ())
            .map_err(|e| crate::Error::Io(e.to_string()))
    }
}

// ---------------------------------------------------------------- the files

/// The records as named columns (the Parquet file's schema).
pub fn columns(rs: &[Record]) -> Vec<NamedColumn> {
    let u = |f: &dyn Fn(&Record) -> Option<u64>| Values::U64(rs.iter().map(f).collect());
    let s = |f: &dyn Fn(&Record) -> Option<String>| Values::Str(rs.iter().map(f).collect());
    let u32s = |f: &dyn Fn(&Record) -> Option<u32>| Values::U32(rs.iter().map(f).collect());
    vec![
        NamedColumn::new("id", u(&|r| Some(r.id))),
        NamedColumn::new("run_unix_ms", u(&|r| Some(r.run_unix_ms))),
        NamedColumn::new(
            "time_scale",
            Values::F64(rs.iter().map(|r| Some(r.time_scale)).collect()),
        ),
        NamedColumn::new("consumer", s(&|r| Some(r.consumer.clone()))),
        NamedColumn::new("arrival_ns", u(&|r| Some(r.arrival_ns))),
        NamedColumn::new("arrival_unix_ms", u(&|r| Some(r.arrival_unix_ms))),
        NamedColumn::new("decided_ns", u(&|r| r.decided_ns)),
        NamedColumn::new("input_tokens", u(&|r| r.input_tokens)),
        NamedColumn::new("max_tokens", u(&|r| r.max_tokens)),
        NamedColumn::new(
            "stream",
            Values::Bool(rs.iter().map(|r| Some(r.stream)).collect()),
        ),
        NamedColumn::new("decision", s(&|r| Some(r.decision.to_string()))),
        NamedColumn::new("limit", s(&|r| r.limit.as_ref().map(|x| x.to_string()))),
        NamedColumn::new("wait_ns", u(&|r| r.wait_ns)),
        NamedColumn::new("retry_after_ms", u(&|r| r.retry_after_ms)),
        NamedColumn::new("status", u32s(&|r| Some(r.status as u32))),
        NamedColumn::new(
            "upstream_status",
            u32s(&|r| r.upstream_status.map(u32::from)),
        ),
        NamedColumn::new("ttft_ns", u(&|r| r.ttft_ns)),
        NamedColumn::new("end_ns", u(&|r| r.end_ns)),
        NamedColumn::new("usage_input", u(&|r| r.usage_input)),
        NamedColumn::new("usage_output", u(&|r| r.usage_output)),
        NamedColumn::new("settled_output", u(&|r| r.settled_output)),
        NamedColumn::new("retry_count", u32s(&|r| r.retry_count)),
        NamedColumn::new("error", s(&|r| r.error.as_ref().map(|x| x.to_string()))),
        NamedColumn::new("generation", u(&|r| Some(r.generation))),
        NamedColumn::new("model", s(&|r| r.model.clone())),
        NamedColumn::new("upstream", s(&|r| r.upstream.clone())),
        NamedColumn::new("attempts", u32s(&|r| r.attempts)),
        NamedColumn::new("trail", s(&|r| r.trail.clone())),
    ]
}

/// The proxy's Parquet encoder for its decision log (qsim-results' polars).
pub fn encoder() -> qsim_live::record::Encoder {
    std::sync::Arc::new(|rs: &[Record]| {
        let mut df = qsim_results::table::frame(&columns(rs)).map_err(|e| e.to_string())?;
        qsim_results::table::parquet_bytes(&mut df).map_err(|e| e.to_string())
    })
}

fn parquet_records(path: &Path) -> Result<Vec<Record>, String> {
    let cols =
        qsim_results::read_parquet_text(path, &qsim_sim::input::load_data).map_err(|e| e.reason)?;
    let n = cols.first().map_or(0, |c| c.1.len());
    let col = |name: &str| -> Result<&Vec<Option<String>>, String> {
        cols.iter()
            .find(|c| c.0 == name)
            .map(|c| &c.1)
            .ok_or_else(|| format!("no column {name:?}: not a qsim decision log"))
    };
    let num = |name: &str, i: usize, v: &Option<String>| -> Result<Option<u64>, String> {
        v.as_deref()
            .map(|s| s.parse::<u64>())
            .transpose()
            .map_err(|_| format!("column {name:?}: row {}: not a count", i + 1))
    };
    let names = [
        "id",
        "run_unix_ms",
        "time_scale",
        "consumer",
        "arrival_ns",
        "arrival_unix_ms",
        "decided_ns",
        "input_tokens",
        "max_tokens",
        "stream",
        "decision",
        "limit",
        "wait_ns",
        "retry_after_ms",
        "status",
        "upstream_status",
        "ttft_ns",
        "end_ns",
        "usage_input",
        "usage_output",
        "settled_output",
        "retry_count",
        "error",
        "generation",
    ];
    let c: Vec<&Vec<Option<String>>> = names.iter().map(|n| col(n)).collect::<Result<_, _>>()?;
    let opt = |name: &str, i: usize| -> Option<String> {
        cols.iter()
            .find(|c| c.0 == name)
            .and_then(|c| c.1[i].clone())
    };
    let mut out = Vec::with_capacity(n);
    // one row across every column
    #[allow(clippy::needless_range_loop)]
    for i in 0..n {
        let u = |k: usize| num(names[k], i, &c[k][i]);
        let req = |k: usize| -> Result<u64, String> {
            u(k)?.ok_or_else(|| format!("column {:?}: row {}: no value", names[k], i + 1))
        };
        let s = |k: usize| c[k][i].clone();
        out.push(Record {
            id: req(0)?,
            run_unix_ms: req(1)?,
            time_scale: s(2).and_then(|x| x.parse().ok()).unwrap_or(1.0),
            consumer: s(3).unwrap_or_default(),
            arrival_ns: req(4)?,
            arrival_unix_ms: req(5)?,
            decided_ns: u(6)?,
            input_tokens: u(7)?,
            max_tokens: u(8)?,
            stream: s(9).as_deref() == Some("true"),
            decision: s(10).unwrap_or_default().into(),
            limit: s(11).map(Into::into),
            wait_ns: u(12)?,
            retry_after_ms: u(13)?,
            status: req(14)? as u16,
            upstream_status: u(15)?.map(|x| x as u16),
            ttft_ns: u(16)?,
            end_ns: u(17)?,
            usage_input: u(18)?,
            usage_output: u(19)?,
            settled_output: u(20)?,
            retry_count: u(21)?.map(|x| x as u32),
            error: s(22).map(Into::into),
            generation: req(23)?,
            // the gateway's columns (absent from logs written before them)
            model: opt("model", i),
            upstream: opt("upstream", i),
            attempts: opt("attempts", i).and_then(|x| x.parse().ok()),
            trail: opt("trail", i),
        });
    }
    Ok(out)
}

/// Every record of a decision-log directory (its finished Parquet and JSON
/// Lines files, `.tmp` files ignored).
pub fn read_log(dir: &Path) -> Result<Vec<Record>, ConfigError> {
    let d = dir.display().to_string();
    if !dir.is_dir() {
        return Err(ConfigError::new(
            "--log",
            "",
            format!("{d}: not a directory"),
        ));
    }
    let files = qsim_live::record::files(dir)
        .map_err(|e| ConfigError::new("--log", "", format!("{d}: {e}")))?;
    if files.is_empty() {
        return Err(ConfigError::new(
            "--log",
            "",
            format!("{d}: no decision-log files (decisions-*.parquet / .jsonl)"),
        ));
    }
    let mut out = Vec::new();
    for f in files {
        let name = f.display().to_string();
        let bad = |r: String| ConfigError::new(&name, "", r);
        if name.ends_with(".parquet") {
            out.extend(parquet_records(&f).map_err(bad)?);
        } else {
            let text = qsim_sim::input::read_text(&f, qsim_sim::input::Kind::Data).map_err(bad)?;
            for (i, l) in text.lines().enumerate() {
                if l.trim().is_empty() {
                    continue;
                }
                out.push(serde_json::from_str(l).map_err(|e| bad(format!("line {}: {e}", i + 1)))?);
            }
        }
    }
    Ok(out)
}

// ---------------------------------------------------------------- window

/// `FROM..TO` in ns (either side optional).
pub fn parse_window(s: &str) -> Result<(Option<Nanos>, Option<Nanos>), ConfigError> {
    let bad = |r: String| ConfigError::new("--window", "", r);
    let (a, b) = s.split_once("..").ok_or_else(|| {
        bad(format!(
            "expected FROM..TO (seconds, e.g. 60..180), got {s:?}"
        ))
    })?;
    let one = |x: &str| -> Result<Option<Nanos>, ConfigError> {
        let x = x.trim();
        if x.is_empty() {
            return Ok(None);
        }
        let (num, mul) = if let Some(v) = x.strip_suffix('h') {
            (v, 3600.0)
        } else if let Some(v) = x.strip_suffix('m') {
            (v, 60.0)
        } else if let Some(v) = x.strip_suffix('s') {
            (v, 1.0)
        } else {
            (x, 1.0)
        };
        let v: f64 = num
            .trim()
            .parse()
            .map_err(|_| bad(format!("not a time: {x:?}")))?;
        if !(v.is_finite() && v >= 0.0 && v * mul < 1e9) {
            return Err(bad(format!("must be in [0, 1e9) seconds, got {x:?}")));
        }
        Ok(Some((v * mul * 1e9) as Nanos))
    };
    let (f, t) = (one(a)?, one(b)?);
    if let (Some(f), Some(t)) = (f, t) {
        if t <= f {
            return Err(bad(format!("TO must be after FROM, got {s:?}")));
        }
    }
    Ok((f, t))
}

// ---------------------------------------------------------------- replay

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Counts {
    pub offered: u64,
    pub admitted: u64,
    pub rejected: u64,
    pub waited: u64,
}

/// Per (consumer, minute): observed, what-if.
pub type Table = BTreeMap<(usize, u64), (Counts, Counts)>;

/// The limiter's replay: per consumer and minute, observed and what-if.
#[derive(Debug)]
pub struct Outcome {
    pub consumers: Vec<String>,
    pub table: Table,
    /// Per replayed attempt, in the order decided.
    pub decisions: Vec<Replayed>,
    pub records: usize,
    pub replayed: usize,
    pub unmatched: usize,
    pub callers_with_retries: usize,
    /// Proxy runs among the replayed records (restarts + 1; 0 if none).
    pub runs: usize,
    /// Times (from the window's start) at which the what-if's limiter
    /// started afresh: the later runs' starts (none for runs sharing their
    /// state through a shared-state clock).
    pub restarts: Vec<Nanos>,
    /// The runs share one limiter state (a shared-state clock).
    pub shared_state: bool,
}

/// One caller: its logged attempts (record indices), oldest first.
struct Chain {
    consumer: usize,
    attempts: Vec<usize>,
    max_attempts: usize,
    /// Per attempt after the first: the lag after the hint (or the gap).
    lags: Vec<(bool, Nanos)>,
    duration: Nanos,
    output: u64,
}

fn is_denied(d: &str) -> bool {
    matches!(
        d,
        "limited" | "refused_deadline" | "refused_max_wait" | "unavailable"
    )
}
fn is_admitted(d: &str) -> bool {
    matches!(d, "admitted" | "waited" | "forwarded_unlimited")
}

/// The median ([`qsim_core::stats::quantile`]) rounded to an integer; 0 for
/// no values.
fn median(v: &[u64]) -> u64 {
    if v.is_empty() {
        return 0;
    }
    let s = qsim_core::stats::sorted(&v.iter().map(|&x| x as f64).collect::<Vec<_>>());
    qsim_core::stats::quantile(&s, 0.5).round() as u64
}

/// What the replay decided for one attempt.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Replayed {
    /// The record replayed (the logged attempt, or the caller's last one
    /// for an attempt beyond those logged).
    pub record: usize,
    /// The caller's attempt (0: its first).
    pub attempt: usize,
    pub consumer: usize,
    /// When it arrived at the limiter.
    pub arrived: Nanos,
    /// When it was admitted or refused.
    pub decided: Nanos,
    /// admitted | waited (admitted after joining its consumer's queue) |
    /// limited (a consumer that rejects) | the waiting component's refusal
    /// (refused_max_wait, expired, …) | refused (no wait could admit it).
    pub decision: &'static str,
    /// The denying limit and the retry hint (ms) of a refusal.
    pub limit: Option<Limit>,
    pub retry_after_ms: Option<u64>,
}

#[derive(Clone, Copy)]
enum Ev {
    /// A completion of a grant of the limiter of restart `.2` (ignored by
    /// a later one).
    Complete(qsim_core::limiter::admission::Grant, u64, usize),
    /// A proxy restart: a fresh limiter state.
    Restart,
    Attempt {
        chain: usize,
        k: usize,
        since: Nanos,
    },
    /// A waiting request's timer or wake-up; stale unless `epoch` is its
    /// current one (a wake-up cancels its earlier timer, as the proxy's
    /// `select!` drops its sleep).
    Wake { c: usize, ticket: u64, epoch: u32 },
}

/// A waiting request: its attempt and its rules.
struct Held {
    chain: usize,
    k: usize,
    since: Nanos,
    waiter: Waiter,
    epoch: u32,
}

/// The what-if's event loop: the proxy's order of operations
/// (`qsim-live/src/wait.rs`) in virtual time.
struct Replayer<'a> {
    params: &'a Params,
    on_limit: &'a [OnLimit],
    recs: &'a [Record],
    sel: &'a [(usize, usize, Nanos)],
    chains: &'a [Chain],
    start: Nanos,
    state: State,
    /// Restarts so far (the limiter a grant belongs to).
    restart: usize,
    waits: Queues<usize, Held>,
    q: EventQueue<Ev>,
    table: Table,
    decisions: Vec<Replayed>,
}

impl Replayer<'_> {
    fn counts(&mut self, c: usize, t: Nanos) -> &mut Counts {
        let m = t.saturating_sub(self.start) / 60_000_000_000;
        &mut self.table.entry((c, m)).or_default().1
    }

    fn record(&self, chain: usize, k: usize) -> usize {
        let ch = &self.chains[chain];
        self.sel[ch.attempts[k.min(ch.attempts.len() - 1)]].0
    }

    fn request(&self, chain: usize, k: usize) -> Request {
        let rec = &self.recs[self.record(chain, k)];
        Request {
            consumer: self.chains[chain].consumer,
            input_tokens: rec.input_tokens.unwrap_or(0),
            max_tokens: rec.max_tokens.unwrap_or(0),
        }
    }

    fn log(&mut self, chain: usize, k: usize, since: Nanos, t: Nanos, d: &'static str) {
        self.decisions.push(Replayed {
            record: self.record(chain, k),
            attempt: k,
            consumer: self.chains[chain].consumer,
            arrived: since,
            decided: t,
            decision: d,
            limit: None,
            retry_after_ms: None,
        });
    }

    /// An attempt arrives: decided at once, or (a waiting consumer) queued
    /// behind its consumer's waiters.
    fn attempt(&mut self, t: Nanos, chain: usize, k: usize, since: Nanos) {
        let c = self.chains[chain].consumer;
        let req = self.request(chain, k);
        self.counts(c, t).offered += 1;
        let OnLimit::Wait { max_wait } = self.on_limit[c] else {
            match decide(self.params, &mut self.state, t, &req) {
                Decision::Admit(g) => self.admitted(t, chain, k, since, g, false),
                Decision::Deny { limit, retry_at } => {
                    self.refused(t, chain, k, since, limit, retry_at, "limited")
                }
            }
            return;
        };
        // the client's deadline is not logged: only max_wait bounds
        let max_wait = max_wait.as_nanos().min(NEVER as u128 / 2) as Nanos;
        let waiter = Waiter::new(Bound::new(t, max_wait, None, 0));
        let next = if !self.waits.has(&c) {
            match decide(self.params, &mut self.state, t, &req) {
                Decision::Admit(g) => return self.admitted(t, chain, k, since, g, false),
                d => waiter.arrived(&d),
            }
        } else {
            let ahead = self.waits.ahead(&c, None);
            waiter.predicted(wait::predict(
                self.params,
                self.state.clone(),
                t,
                c,
                &ahead,
                &req,
            ))
        };
        match next {
            Next::Refuse(r) => self.refusal(t, chain, k, since, r),
            Next::Join => {
                let held = Held {
                    chain,
                    k,
                    since,
                    waiter,
                    epoch: 0,
                };
                let ticket = self.waits.join(c, req, held);
                self.turn(t, c, ticket);
            }
            Next::Admit | Next::Sleep(_) => unreachable!("an arrival either decides or joins"),
        }
    }

    /// A queued request's turn at `t`: the head decides; another waits for
    /// its bound (or to become the head).
    fn turn(&mut self, t: Nanos, c: usize, ticket: u64) {
        let Some(h) = self.waits.get(&c, ticket) else {
            return;
        };
        let (chain, k, since, waiter) = (h.chain, h.k, h.since, h.waiter);
        let req = self.request(chain, k);
        let next = if self.waits.is_head(&c, ticket) {
            let d = decide(self.params, &mut self.state, t, &req);
            if let Decision::Admit(g) = d {
                self.leave(t, c, ticket);
                return self.admitted(t, chain, k, since, g, true);
            }
            waiter.decided(t, &d)
        } else if t >= waiter.bound.at {
            let ahead = self.waits.ahead(&c, Some(ticket));
            let p = wait::predict(self.params, self.state.clone(), t, c, &ahead, &req);
            Next::Refuse(waiter.expired(p))
        } else {
            Next::Sleep(waiter.bound.at)
        };
        match next {
            Next::Refuse(r) => {
                self.leave(t, c, ticket);
                self.refusal(t, chain, k, since, r);
            }
            Next::Sleep(until) => {
                if let Some(h) = self.waits.get_mut(&c, ticket) {
                    h.epoch += 1;
                    let epoch = h.epoch;
                    self.q
                        .schedule(until.max(t + 1), Ev::Wake { c, ticket, epoch });
                }
            }
            Next::Admit | Next::Join => unreachable!("a denial neither admits nor joins"),
        }
    }

    /// `ticket` leaves its queue; a new head is woken at once.
    fn leave(&mut self, t: Nanos, c: usize, ticket: u64) {
        if let Some((ticket, h)) = self.waits.leave(&c, ticket) {
            let epoch = h.epoch;
            self.q.schedule(t, Ev::Wake { c, ticket, epoch });
        }
    }

    fn admitted(
        &mut self,
        t: Nanos,
        chain: usize,
        k: usize,
        since: Nanos,
        g: qsim_core::limiter::admission::Grant,
        waited: bool,
    ) {
        let c = self.chains[chain].consumer;
        let w = self.counts(c, t);
        w.admitted += 1;
        if waited {
            w.waited += 1;
        }
        self.log(
            chain,
            k,
            since,
            t,
            if waited { "waited" } else { "admitted" },
        );
        let ch = &self.chains[chain];
        let (done, out) = (t.saturating_add(ch.duration), ch.output);
        self.q.schedule(done, Ev::Complete(g, out, self.restart));
    }

    fn refusal(&mut self, t: Nanos, chain: usize, k: usize, since: Nanos, r: Refusal) {
        let d = r.outcome.map_or("refused", wait::Outcome::name);
        self.refused(t, chain, k, since, r.limit, r.retry_at, d);
    }

    /// A 429: the caller retries (as it did in the log) after the hint the
    /// proxy gives (`qsim_live::wait_ms`).
    #[allow(clippy::too_many_arguments)]
    fn refused(
        &mut self,
        t: Nanos,
        chain: usize,
        k: usize,
        since: Nanos,
        limit: Limit,
        retry_at: Nanos,
        decision: &'static str,
    ) {
        let c = self.chains[chain].consumer;
        self.counts(c, t).rejected += 1;
        self.log(chain, k, since, t, decision);
        let hint = (retry_at != NEVER).then(|| qsim_live::wait_ms(retry_at, t));
        if let Some(d) = self.decisions.last_mut() {
            d.limit = Some(limit);
            d.retry_after_ms = hint;
        }
        let ch = &self.chains[chain];
        if k + 1 >= ch.max_attempts {
            return;
        }
        let (hinted, lag) = ch
            .lags
            .get(k)
            .or(ch.lags.last())
            .copied()
            .unwrap_or((true, 0));
        let next = if hinted {
            let Some(ms) = hint else {
                return;
            };
            t + ms * 1_000_000 + lag
        } else {
            t + lag
        };
        self.q.schedule(
            next,
            Ev::Attempt {
                chain,
                k: k + 1,
                since: next,
            },
        );
    }
}

/// The replay (see the module doc). `times[i]`: record i on the common
/// time line.
/// The records the limiter decided, on the log's common time line (runs
/// laid out by their start; a waiter at its arrival), in `window` (from the
/// first one's time), sorted: (record, time); and the window's start and end.
pub fn timeline(
    recs: &[Record],
    window: (Option<Nanos>, Option<Nanos>),
) -> (Vec<(usize, Nanos)>, Nanos, Option<Nanos>) {
    let first_run = recs.iter().map(|r| r.run_unix_ms).min().unwrap_or(0);
    let time = |r: &Record| -> Nanos {
        // a waiter's decision is the end of its wait: it arrived before
        let t = match &*r.decision {
            "waited" | "refused_deadline" | "refused_max_wait" => r.arrival_ns,
            _ => r.decided_ns.unwrap_or(r.arrival_ns),
        };
        // a shared-state clock (ns since 2025) is common to every run already
        if r.arrival_ns > 1_000_000_000_000_000 {
            return t;
        }
        let off = (r.run_unix_ms - first_run) as f64 * 1e6 * r.time_scale.max(1e-9);
        t.saturating_add(off as Nanos)
    };
    let mut idx: Vec<(usize, Nanos)> = (0..recs.len())
        .filter(|&i| {
            let d = &*recs[i].decision;
            is_denied(d) || is_admitted(d)
        })
        .map(|i| (i, time(&recs[i])))
        .collect();
    idx.sort_by_key(|&(i, t)| (t, recs[i].run_unix_ms, recs[i].id));
    let t_first = idx.first().map_or(0, |&(_, t)| t);
    let start = window.0.map_or(t_first, |f| t_first + f);
    let end = window.1.map(|t| t_first + t);
    idx.retain(|&(_, t)| t >= start && end.is_none_or(|e| t < e));
    (idx, start, end)
}

pub fn replay(
    recs: &[Record],
    params: &Params,
    on_limit: &[OnLimit],
    window: (Option<Nanos>, Option<Nanos>),
) -> Outcome {
    let names: Vec<String> = params
        .config()
        .consumers
        .iter()
        .map(|c| c.name.clone())
        .collect();
    let (in_window, start, end) = timeline(recs, window);
    let first_run = recs.iter().map(|r| r.run_unix_ms).min().unwrap_or(0);
    let mut unmatched = 0;
    let mut sel: Vec<(usize, usize, Nanos)> = Vec::new(); // (record, consumer, t)
    for (i, t) in in_window {
        match names.iter().position(|n| *n == recs[i].consumer) {
            Some(c) => sel.push((i, c, t)),
            None => unmatched += 1,
        }
    }
    let minute = |t: Nanos| t.saturating_sub(start) / 60_000_000_000;
    let mut table: Table = BTreeMap::new();

    // proxy runs among the replayed records: each later run's start is a
    // restart (a fresh limiter), unless the runs share a state's clock
    let mut run_starts: BTreeMap<u64, (Nanos, bool)> = BTreeMap::new();
    for &(i, _, _) in &sel {
        let r = &recs[i];
        let off = (r.run_unix_ms - first_run) as f64 * 1e6 * r.time_scale.max(1e-9);
        let e = run_starts
            .entry(r.run_unix_ms)
            .or_insert((off as Nanos, false));
        e.1 |= r.arrival_ns > 1_000_000_000_000_000;
    }
    let runs = run_starts.len();
    let shared_state = runs > 1 && run_starts.values().all(|&(_, shared)| shared);
    // a run on a shared-state clock found the state its predecessors left
    let restarts: Vec<Nanos> = run_starts
        .values()
        .filter(|&&(t, shared)| !shared && t > start && end.is_none_or(|e| t < e))
        .map(|&(t, _)| t - start)
        .collect();

    // observed
    for &(i, c, t) in &sel {
        let r = &recs[i];
        let o = &mut table.entry((c, minute(t))).or_default().0;
        o.offered += 1;
        if is_admitted(&r.decision) {
            o.admitted += 1;
        } else {
            o.rejected += 1;
        }
        if r.decision == "waited" {
            o.waited += 1;
        }
    }

    // per consumer: medians of duration and output of admitted requests
    let mut durs: Vec<Vec<u64>> = vec![Vec::new(); names.len()];
    let mut outs: Vec<Vec<u64>> = vec![Vec::new(); names.len()];
    let dur_of = |r: &Record| -> Option<(Nanos, u64)> {
        let (d, e) = (r.decided_ns?, r.end_ns?);
        is_admitted(&r.decision).then(|| (e.saturating_sub(d), r.settled_output.unwrap_or(0)))
    };
    for &(i, c, _) in &sel {
        if let Some((d, o)) = dur_of(&recs[i]) {
            durs[c].push(d);
            outs[c].push(o);
        }
    }
    let med_dur: Vec<u64> = durs.iter().map(|v| median(v)).collect();
    let med_out: Vec<u64> = outs.iter().map(|v| median(v)).collect();

    // chains: link retries (x-stainless-retry-count k) to a denied attempt k−1
    let mut parent: Vec<Option<usize>> = vec![None; sel.len()];
    let mut child: Vec<bool> = vec![false; sel.len()];
    let mut open: BTreeMap<(usize, u32), Vec<usize>> = BTreeMap::new();
    let mut max_rc: Vec<u32> = vec![0; names.len()];
    for (j, &(i, c, t)) in sel.iter().enumerate() {
        let r = &recs[i];
        if let Some(k) = r.retry_count {
            max_rc[c] = max_rc[c].max(k);
            if k >= 1 {
                if let Some(cands) = open.get_mut(&(c, k - 1)) {
                    let best = cands
                        .iter()
                        .enumerate()
                        .rev()
                        .take(1000)
                        .min_by_key(|&(_, &p)| {
                            let (pi, _, pt) = sel[p];
                            let hint = recs[pi]
                                .retry_after_ms
                                .map_or(0, |ms| (ms as f64 * 1e6) as Nanos);
                            (pt + hint).abs_diff(t)
                        })
                        .map(|(pos, &p)| (pos, p));
                    if let Some((pos, p)) = best {
                        cands.remove(pos);
                        parent[j] = Some(p);
                        child[p] = true;
                    }
                }
            }
            if is_denied(&r.decision) {
                open.entry((c, k)).or_default().push(j);
            }
        }
    }
    let mut chains: Vec<Chain> = Vec::new();
    let mut chain_of: Vec<usize> = vec![usize::MAX; sel.len()];
    for j in 0..sel.len() {
        let ch = match parent[j] {
            Some(p) => chain_of[p],
            None => {
                chains.push(Chain {
                    consumer: sel[j].1,
                    attempts: Vec::new(),
                    max_attempts: 1,
                    lags: Vec::new(),
                    duration: 0,
                    output: 0,
                });
                chains.len() - 1
            }
        };
        chain_of[j] = ch;
        chains[ch].attempts.push(j);
    }
    let mut callers_with_retries = 0;
    for ch in &mut chains {
        let c = ch.consumer;
        let n = ch.attempts.len();
        if n > 1 {
            callers_with_retries += 1;
        }
        for w in ch.attempts.windows(2) {
            let (pi, _, pt) = sel[w[0]];
            let t = sel[w[1]].2;
            ch.lags.push(match recs[pi].retry_after_ms {
                Some(ms) => (true, t.saturating_sub(pt + ms * 1_000_000)),
                None => (false, t.saturating_sub(pt)),
            });
        }
        let last = &recs[sel[ch.attempts[n - 1]].0];
        let has_header = recs[sel[ch.attempts[0]].0].retry_count.is_some();
        // admitted in the log: it would have retried as its consumer's callers did
        ch.max_attempts = if has_header && is_admitted(&last.decision) {
            n.max(max_rc[c] as usize + 1)
        } else {
            n
        };
        let logged = ch.attempts.iter().find_map(|&j| dur_of(&recs[sel[j].0]));
        let (d, o) = logged.unwrap_or((med_dur[c], med_out[c]));
        let cap = recs[sel[ch.attempts[0]].0].max_tokens.unwrap_or(u64::MAX);
        ch.duration = d;
        ch.output = o.min(cap);
    }

    // the what-if: one event queue (the engine's), the core's limiter and
    // its waiting component
    let mut r = Replayer {
        params,
        on_limit,
        recs,
        sel: &sel,
        chains: &chains,
        start,
        state: State::new(params, start),
        restart: 0,
        waits: Queues::new(),
        q: EventQueue::new(),
        table,
        decisions: Vec::new(),
    };
    // restarts first: at equal times, a run's first request meets its fresh limiter
    for &t in &restarts {
        r.q.schedule(start + t, Ev::Restart);
    }
    for (ci, ch) in chains.iter().enumerate() {
        let t = sel[ch.attempts[0]].2;
        r.q.schedule(
            t,
            Ev::Attempt {
                chain: ci,
                k: 0,
                since: t,
            },
        );
    }
    while let Some((t, ev)) = r.q.pop() {
        match ev {
            Ev::Restart => {
                r.state = State::new(params, t);
                r.restart += 1;
            }
            Ev::Complete(g, out, restart) => {
                if restart == r.restart {
                    complete(params, &mut r.state, t, &g, out);
                }
                // capacity or a slot may have freed up: every head decides
                let heads: Vec<(usize, u64, u32)> =
                    r.waits.heads().map(|(&c, k, h)| (c, k, h.epoch)).collect();
                for (c, ticket, epoch) in heads {
                    r.q.schedule(t, Ev::Wake { c, ticket, epoch });
                }
            }
            Ev::Attempt { chain, k, since } => r.attempt(t, chain, k, since),
            Ev::Wake { c, ticket, epoch } => {
                if r.waits.get(&c, ticket).is_some_and(|h| h.epoch == epoch) {
                    r.turn(t, c, ticket);
                }
            }
        }
    }
    let Replayer {
        table, decisions, ..
    } = r;
    Outcome {
        consumers: names,
        table,
        decisions,
        records: recs.len(),
        replayed: sel.len(),
        unmatched,
        callers_with_retries,
        runs,
        restarts,
        shared_state,
    }
}

// ---------------------------------------------------------------- output

fn render(w: &Whatif, format: Format) -> String {
    let o = &w.outcome;
    let mut s = String::new();
    match format {
        Format::Table => {
            let _ = writeln!(
                s,
                "qsim whatif: {} records, {} replayed under {} ({} of consumers not in the policy, {} callers with retries)",
                o.records,
                o.replayed,
                w.policy,
                o.unmatched,
                o.callers_with_retries
            );
            if let Some(note) = runs_note(o) {
                let _ = writeln!(s, "{note}");
            }
            let _ = writeln!(
                s,
                "{:<10} {:>6}  {:>17}  {:>17}  {:>17}  {:>15}",
                "consumer",
                "minute",
                "offered obs/what",
                "admitted obs/what",
                "rejected obs/what",
                "waited obs/what"
            );
            // one line: consumer, minute (or "all"), observed/what-if per count
            let line = |s: &mut String,
                        name: &str,
                        minute: &dyn std::fmt::Display,
                        ob: &Counts,
                        wi: &Counts| {
                let _ = writeln!(
                    s,
                    "{:<10} {:>6}  {:>8}/{:<8}  {:>8}/{:<8}  {:>8}/{:<8}  {:>7}/{:<7}",
                    name,
                    minute,
                    ob.offered,
                    wi.offered,
                    ob.admitted,
                    wi.admitted,
                    ob.rejected,
                    wi.rejected,
                    ob.waited,
                    wi.waited
                );
            };
            let mut totals: BTreeMap<usize, (Counts, Counts)> = BTreeMap::new();
            for (&(c, m), (ob, wi)) in &o.table {
                line(&mut s, &o.consumers[c], &m, ob, wi);
                let t = totals.entry(c).or_default();
                add(&mut t.0, ob);
                add(&mut t.1, wi);
            }
            for (c, (ob, wi)) in totals {
                line(&mut s, &o.consumers[c], &"all", &ob, &wi);
            }
        }
        Format::Csv => {
            s.push_str("consumer,minute,observed_offered,whatif_offered,observed_admitted,whatif_admitted,observed_rejected,whatif_rejected,observed_waited,whatif_waited\n");
            for (&(c, m), (ob, wi)) in &o.table {
                let _ = writeln!(
                    s,
                    "{},{m},{},{},{},{},{},{},{},{}",
                    o.consumers[c],
                    ob.offered,
                    wi.offered,
                    ob.admitted,
                    wi.admitted,
                    ob.rejected,
                    wi.rejected,
                    ob.waited,
                    wi.waited
                );
            }
        }
        Format::Json => {
            let rows: Vec<serde_json::Value> = o
                .table
                .iter()
                .map(|(&(c, m), (ob, wi))| {
                    serde_json::json!({"consumer": o.consumers[c], "minute": m,
                        "observed": ob, "whatif": wi})
                })
                .collect();
            let v = serde_json::json!({
                "log": w.log,
                "policy": w.policy,
                "records": o.records,
                "replayed": o.replayed,
                "unmatched": o.unmatched,
                "callers_with_retries": o.callers_with_retries,
                "runs": o.runs,
                "shared_state": o.shared_state,
                "restarts_s": o.restarts.iter().map(|&t| t as f64 / 1e9).collect::<Vec<_>>(),
                "rows": rows,
            });
            s = serde_json::to_string_pretty(&v).unwrap_or_default();
            s.push('\n');
        }
    }
    s
}

/// The line that says how a log of several proxy runs was replayed.
pub fn runs_note(o: &Outcome) -> Option<String> {
    if o.runs <= 1 {
        return None;
    }
    if o.shared_state {
        return Some(format!(
            "the log spans {} proxy runs sharing their limiter state (a shared-state clock): replayed as one limiter, as they ran",
            o.runs
        ));
    }
    let at: Vec<String> = o
        .restarts
        .iter()
        .map(|&t| format!("{:.1} s", t as f64 / 1e9))
        .collect();
    Some(format!(
        "the log spans {} proxy runs: the what-if's limiter starts afresh at each restart, as the proxy's did ({} in the window{}{})",
        o.runs,
        at.len(),
        if at.is_empty() { "" } else { ", at " },
        at.join(", ")
    ))
}

fn add(a: &mut Counts, b: &Counts) {
    a.offered += b.offered;
    a.admitted += b.admitted;
    a.rejected += b.rejected;
    a.waited += b.waited;
}

fn table_columns(o: &Outcome) -> Vec<NamedColumn> {
    type Row<'a> = (&'a (usize, u64), &'a (Counts, Counts));
    let rows: Vec<Row> = o.table.iter().collect();
    let u = |f: &dyn Fn(&(Counts, Counts)) -> u64| {
        Values::U64(rows.iter().map(|(_, v)| Some(f(v))).collect())
    };
    vec![
        NamedColumn::new(
            "consumer",
            Values::Str(
                rows.iter()
                    .map(|(k, _)| Some(o.consumers[k.0].clone()))
                    .collect(),
            ),
        ),
        NamedColumn::new(
            "minute",
            Values::U64(rows.iter().map(|(k, _)| Some(k.1)).collect()),
        ),
        NamedColumn::new("observed_offered", u(&|v| v.0.offered)),
        NamedColumn::new("whatif_offered", u(&|v| v.1.offered)),
        NamedColumn::new("observed_admitted", u(&|v| v.0.admitted)),
        NamedColumn::new("whatif_admitted", u(&|v| v.1.admitted)),
        NamedColumn::new("observed_rejected", u(&|v| v.0.rejected)),
        NamedColumn::new("whatif_rejected", u(&|v| v.1.rejected)),
        NamedColumn::new("observed_waited", u(&|v| v.0.waited)),
        NamedColumn::new("whatif_waited", u(&|v| v.1.waited)),
    ]
}

/// The policy file: a proxy config (its limiter and each consumer's on_limit).
fn load_policy(
    path: &Path,
) -> Result<(Params, Vec<OnLimit>, Option<qsim_core::gateway::Config>), ConfigError> {
    let args = crate::proxy::Spec {
        config: path.to_path_buf(),
        ..Default::default()
    };
    let cfg =
        crate::proxy::load(&args).map_err(|e| qsim_sim::config::name_fields(e, Some(path), &[]))?;
    let f = path.display().to_string();
    let mut p =
        Params::new(cfg.limiter.clone()).map_err(|r| ConfigError::new(&f, "deployment", r))?;
    if let Some(l) = cfg.lease {
        p = p
            .with_lease(l)
            .map_err(|r| ConfigError::new(&f, "proxy.lease_s", r))?;
    }
    let routes = cfg.routes.from_tables.then(|| cfg.routes.core.clone());
    Ok((p, cfg.on_limit, routes))
}

/// The admitted records in `window` as the route what-if takes them, on
/// the log's common time line (each record's times shifted with it).
pub fn logged_requests(
    recs: &[Record],
    window: (Option<Nanos>, Option<Nanos>),
) -> Vec<qsim_sim::plan::routes_whatif::LoggedRequest> {
    use qsim_sim::plan::routes_whatif::{parse_trail, LoggedRequest};
    timeline(recs, window)
        .0
        .into_iter()
        .filter(|&(i, _)| is_admitted(&recs[i].decision))
        .map(|(i, t)| {
            let r = &recs[i];
            // admitted: its time is its decision's, shifted by its run's start
            let off = t.saturating_sub(r.decided_ns.unwrap_or(r.arrival_ns));
            LoggedRequest {
                at: t,
                model: r.model.clone().unwrap_or_default(),
                input_tokens: r.input_tokens.unwrap_or(0),
                max_tokens: r.max_tokens.unwrap_or(0),
                output_tokens: r.settled_output.unwrap_or(0),
                end: r.end_ns.map(|e| e + off),
                attempts: r
                    .trail
                    .as_deref()
                    .and_then(|tr| parse_trail(tr, r.arrival_ns + off))
                    .unwrap_or_default(),
                status: r.status,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use qsim_core::limiter::admission::{
        ConsumerPolicy, ConsumerSpec, LimiterConfig, Semantics, Unit,
    };

    fn params(rpm_a: Option<u64>) -> Params {
        let mut cfg: LimiterConfig = LimiterConfig {
            capacity: 60,
            unit: Unit::Rpm,
            threshold: 1.0,
            burst: Some(0),
            semantics: Semantics::RateLimitOnly,
            accounting: Default::default(),
            consumers: vec![ConsumerSpec {
                name: "A".into(),
                reserved_bp: 0,
                policy: ConsumerPolicy::default(),
            }],
        };
        cfg.consumers[0].policy.rpm = rpm_a;
        Params::new(cfg).unwrap()
    }

    #[test]
    fn window_parses_and_rejects() {
        assert_eq!(
            parse_window("60..180").unwrap(),
            (Some(60_000_000_000), Some(180_000_000_000))
        );
        assert_eq!(parse_window("1m..").unwrap(), (Some(60_000_000_000), None));
        assert!(parse_window("5").is_err());
        assert!(parse_window("9..3").is_err());
        assert!(parse_window("x..3").is_err());
    }

    #[test]
    fn retries_are_replayed_as_callers() {
        // one caller denied once (hint 1000 ms), retrying 1.5 s later
        let r = |id, t: u64, d: &'static str, rc, hint| Record {
            id,
            consumer: "A".into(),
            arrival_ns: t,
            decided_ns: Some(t),
            input_tokens: Some(1),
            max_tokens: Some(1),
            decision: d.into(),
            retry_after_ms: hint,
            retry_count: Some(rc),
            status: if d == "admitted" { 200 } else { 429 },
            end_ns: (d == "admitted").then_some(t + 1),
            settled_output: Some(1),
            ..Default::default()
        };
        let recs = vec![
            r(1, 0, "admitted", 0, None),
            r(2, 1, "limited", 0, Some(1000)),
            r(3, 1_500_000_001, "admitted", 1, None),
        ];
        // the same policy: the same outcome
        let p = params(None);
        let o = replay(&recs, &p, &[OnLimit::Reject], (None, None));
        assert_eq!(o.callers_with_retries, 1);
        let (ob, wi) = o.table[&(0, 0)];
        assert_eq!(ob, wi, "{ob:?} {wi:?}");
        assert_eq!((wi.offered, wi.admitted, wi.rejected), (3, 2, 1));
    }
}
