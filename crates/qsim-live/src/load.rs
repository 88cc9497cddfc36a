//! `qsim load`'s driver: plays a compiled shared-deployment scenario against
//! a real OpenAI-compatible endpoint (typically a `qsim proxy`) with tokio.
//!
//! Nothing here reads a file or draws the scenario's randomness itself: the
//! root crate compiles the scenario into a [`LoadConfig`] — the open-loop
//! arrival times (the simulator's seeded arrival streams), the closed-loop
//! workers, each consumer's identity, each load's [`CallerPolicy`] — and
//! hands over a [`Draws`] that yields input lengths and retry jitter from the
//! simulator's streams.
//!
//! Every row (one logical request) is one tokio task driving the core's
//! caller state machine [`Call`] — the very code the simulation drivers run:
//! `on_send`, one HTTP attempt, `on_reply` → `Next::SendAt { at }` (then
//! `sleep_until(at)`) or `Next::Done`. Open-loop rows are spawned by one
//! dispatcher task at their arrival times; a closed-loop worker is a task
//! that runs its rows one after another with its think time between them.
//!
//! Time is virtual (`clock.rs`): `now = real elapsed × time_scale` in
//! integer ns, and a virtual deadline `at` is slept until
//! `start + at / time_scale` (rounded up). Retry hints read from the answer
//! (`retry-after-ms`, `retry-after`: `http::retry_hint`) are taken as
//! virtual time: a `qsim proxy` run with the same `--time-scale` states
//! them so (with scale 1 it is plain real time).
//!
//! Bounded: no attempt is sent at or after the scenario's end (the
//! simulation stops there too) or after `max_requests` attempts; each
//! attempt has a real-time `timeout`; rows still in flight `timeout` after
//! the end are abandoned and counted as unanswered.

use crate::clock::Clock;
use crate::http::{self, HttpClient};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request};
use qsim_core::client::{Call, CallerPolicy, Next, PoolShared, Reply, Send};
use qsim_core::limiter::rates::OutputAccounting;
use qsim_core::stats::sorted;
use qsim_core::time::{Nanos, NS_PER_SEC};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const MINUTE: Nanos = 60 * NS_PER_SEC;

/// How a consumer identifies itself to the target.
#[derive(Clone)]
pub struct Identity {
    pub name: String,
    /// `None`: `Authorization: Bearer KEY`; `Some(h)`: header `h: KEY`.
    pub header: Option<String>,
    pub key: String,
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Identity")
            .field("name", &self.name)
            .field("header", &self.header)
            .field("key", &"<redacted>")
            .finish()
    }
}

/// One open-loop arrival: a row of `consumer` driven by load line `load`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Arrival {
    pub at: Nanos,
    pub consumer: u32,
    pub load: u32,
    /// A trace row's input tokens; `None`: drawn ([`Draws::input_tokens`]).
    pub input_tokens: Option<u32>,
}

/// One closed-loop worker: sends a row, waits for its outcome (retries
/// included), thinks, sends the next, from `start` until `stop`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Worker {
    pub consumer: u32,
    pub load: u32,
    pub start: Nanos,
    pub stop: Nanos,
    pub think: Nanos,
}

/// How admitted units are counted per minute (the plan's
/// `admitted_per_min` records are in the limiter's capacity unit).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Units {
    /// One per request.
    Requests,
    /// Input tokens plus output tokens as the limiter settles them:
    /// `reserve_refund` and `on_completion` count the answer's
    /// `usage.completion_tokens`, `reserve_no_refund` counts `max_tokens`
    /// (offered: input + `max_tokens`, or input alone for `on_completion`).
    Tokens(OutputAccounting),
}

/// The random draws of a scenario, from the simulator's streams.
pub trait Draws: std::marker::Send {
    /// The input length (tokens) of `consumer`'s next row.
    fn input_tokens(&mut self, consumer: usize) -> u32;
    /// A uniform draw in [0, 1) for the caller state machine (retry jitter).
    fn unit(&mut self) -> f64;
}

/// A compiled scenario and where to send it.
#[derive(Debug, Clone)]
pub struct LoadConfig {
    /// Base URL `http://host:port` (no trailing slash).
    pub target: String,
    /// Request path, e.g. `/v1/chat/completions`.
    pub path: String,
    /// The request body's `model`.
    pub model: String,
    pub max_tokens: u64,
    pub consumers: Vec<Identity>,
    /// Per load line: its caller policy (retries through [`Call`]).
    pub policies: Vec<CallerPolicy>,
    /// Open-loop arrivals, in time order.
    pub arrivals: Vec<Arrival>,
    pub workers: Vec<Worker>,
    /// Virtual length of the scenario: no attempt is sent at or after it.
    pub duration: Nanos,
    pub time_scale: f64,
    /// At most this many HTTP attempts in all.
    pub max_requests: u64,
    /// Real-time limit of one attempt (headers and body).
    pub timeout: Duration,
    pub units: Units,
    /// Worker threads of the tokio runtime (`None`: one per core).
    pub threads: Option<usize>,
    /// Prompts as token ids (`None`: a chat message of the input length).
    pub prompt_ids: Option<PromptIds>,
}

/// Prompts given as token ids: `ids(row, n)` is row `row`'s prompt of `n`
/// token ids, sent as `{"prompt": [ids…]}` (OpenAI's `/v1/completions`), so
/// an engine counts exactly the input length the scenario draws, and
/// (drawn per row) no two prompts share a prefix an engine's prefix cache
/// could serve. Rows are numbered by the scenario: open-loop arrivals in
/// order from 0, then closed-loop worker `w`'s `k`-th send as
/// `arrivals + (w << 32) + k`.
#[derive(Clone)]
pub struct PromptIds(pub Arc<dyn Fn(u64, u32) -> Vec<u32> + std::marker::Send + Sync>);

impl std::fmt::Debug for PromptIds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PromptIds")
    }
}

/// What one consumer saw.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ConsumerObs {
    pub name: String,
    /// Rows started (open-loop arrivals and closed-loop sends).
    pub rows: u64,
    /// HTTP attempts sent (first tries and retries), as `offered` in the plan.
    pub offered: u64,
    /// Attempts answered 2xx (forwarded and served).
    pub admitted: u64,
    /// Attempts answered 429 (by the proxy or forwarded from the upstream).
    pub limited: u64,
    /// Of those, the 429s that do not carry a qsim proxy's
    /// [`crate::LIMITED_BY`] mark: the upstream's (or, without a proxy in
    /// front, every 429).
    pub upstream_limited: u64,
    /// Attempts answered with another status (the status and count).
    pub other_status: Vec<(u16, u64)>,
    /// Attempts without an answer (connection error or timeout).
    pub unanswered: u64,
    /// Rows that ended without success after their retries.
    pub failed: u64,
    /// Attempts sent and not answered yet (0 in a report).
    pub in_flight: u64,
    /// Per virtual minute in which the attempt was due.
    pub offered_per_min: Vec<u64>,
    pub admitted_per_min: Vec<u64>,
    /// In the limiter's capacity unit (see [`Units`]).
    pub offered_units_per_min: Vec<u64>,
    pub admitted_units_per_min: Vec<u64>,
    /// Per attempt answered 2xx: virtual time from its send to the last
    /// byte of its answer (at most `max_requests` of them).
    pub e2e_ok: Vec<Nanos>,
}

/// The outcome of a load run.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadReport {
    pub consumers: Vec<ConsumerObs>,
    pub minutes: usize,
    /// Per virtual second: some attempt due in it was answered 429.
    pub limited_sec: Vec<bool>,
    /// Attempts sent in all.
    pub attempts: u64,
    /// Rows not continued because `max_requests` was reached (the
    /// dispatcher then starts no more rows).
    pub cut_by_max_requests: u64,
    /// Rows still in flight when the run gave up waiting (their attempts
    /// are counted as unanswered).
    pub abandoned: u64,
    pub wall: Duration,
    pub time_scale: f64,
    /// How late attempts left after their due time (virtual): mean, max,
    /// and how many were over one (virtual) second late. Attempts are
    /// counted in the minute they were due, as the simulator counts them.
    pub lag_mean: Nanos,
    pub lag_max: Nanos,
    pub lag_over_1s: u64,
}

impl LoadReport {
    /// The E2E (send to last byte, virtual seconds) of every attempt
    /// answered 2xx, over all consumers, ascending.
    pub fn e2e_ok_s(&self) -> Vec<f64> {
        let v: Vec<f64> = self
            .consumers
            .iter()
            .flat_map(|c| c.e2e_ok.iter().map(|&d| d as f64 / 1e9))
            .collect();
        sorted(&v)
    }

    /// Full minutes in which every second — and the last second before the
    /// minute — saw a 429: the target was limiting throughout (the plan's
    /// definition of a saturated minute, from the client's side).
    pub fn saturated(&self, duration: Nanos) -> Vec<bool> {
        let full = (duration / MINUTE) as usize;
        (0..full)
            .map(|m| {
                m > 0
                    && self.limited_sec[m * 60 - 1..((m + 1) * 60).min(self.limited_sec.len())]
                        .iter()
                        .all(|&x| x)
            })
            .collect()
    }
}

struct Shared {
    cfg: LoadConfig,
    clock: Clock,
    client: HttpClient,
    draws: Mutex<Box<dyn Draws>>,
    pools: Vec<Mutex<PoolShared>>,
    obs: Mutex<(Vec<ConsumerObs>, Vec<bool>)>,
    attempts: AtomicU64,
    cut: AtomicU64,
    stopped: AtomicBool,
    /// Rows (and closed-loop workers) running.
    live: AtomicU64,
    /// Unexpected answers printed so far.
    warned: AtomicU64,
    /// Send lag behind schedule (virtual ns): sum, max, and attempts over 1 s.
    lag_sum: AtomicU64,
    lag_max: AtomicU64,
    lag_over_1s: AtomicU64,
}

/// Counts a running task in `Shared::live` until dropped (also when aborted).
struct Live<'a>(&'a AtomicU64);

impl Drop for Live<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Shared {
    /// Virtual now.
    fn now(&self) -> Nanos {
        self.clock.now()
    }
    /// The real instant of virtual time `at`.
    fn real(&self, at: Nanos) -> tokio::time::Instant {
        self.clock.instant_at(at)
    }
    fn lag(&self, lag: Nanos) {
        self.lag_sum.fetch_add(lag, Ordering::Relaxed);
        self.lag_max.fetch_max(lag, Ordering::Relaxed);
        if lag > NS_PER_SEC {
            self.lag_over_1s.fetch_add(1, Ordering::Relaxed);
        }
    }
    fn input_tokens(&self, consumer: usize) -> u32 {
        self.draws
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .input_tokens(consumer)
    }
    async fn sleep_until(&self, at: Nanos) {
        tokio::time::sleep_until(self.real(at)).await;
    }
    fn obs<R>(&self, f: impl FnOnce(&mut Vec<ConsumerObs>, &mut Vec<bool>) -> R) -> R {
        let mut g = self.obs.lock().unwrap_or_else(|e| e.into_inner());
        let (a, b) = &mut *g;
        f(a, b)
    }
}

/// What came back for one attempt.
enum Answer {
    Status {
        status: u16,
        hint: Option<Nanos>,
        output_tokens: u64,
        /// Virtual time from the send to the answer's last byte.
        e2e: Nanos,
        /// A 429 made by a qsim proxy's limiter (it carries
        /// [`crate::LIMITED_BY`]), not forwarded from the upstream.
        by_proxy: bool,
    },
    /// No answer (connection error or timeout), and why.
    None(#[allow(dead_code)] String),
}

/// The body of one row: a single user message whose length makes the
/// proxy's estimate (`ceil(chars / 4) + 4`) equal to `input_tokens`.
pub fn request_body(model: &str, input_tokens: u32, max_tokens: u64) -> Value {
    let chars = 4 * (input_tokens.max(5) as usize - 4);
    let text: String = "lorem ipsum dolor sit amet "
        .chars()
        .cycle()
        .take(chars)
        .collect();
    json!({
        "model": model,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": max_tokens,
    })
}

/// One HTTP attempt; `retries`: the row's attempts before this one, sent as
/// `x-stainless-retry-count` as the OpenAI SDKs do (so that a proxy's
/// decision log links a retry to the attempt it repeats: `qsim whatif`).
async fn attempt(sh: &Shared, consumer: usize, body: &Bytes, retries: u32) -> Answer {
    let id = &sh.cfg.consumers[consumer];
    let mut req = Request::builder()
        .method(Method::POST)
        .uri(format!("{}{}", sh.cfg.target, sh.cfg.path))
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .header("x-stainless-retry-count", retries);
    req = match &id.header {
        None => req.header(hyper::header::AUTHORIZATION, format!("Bearer {}", id.key)),
        Some(h) => req.header(h.as_str(), id.key.as_str()),
    };
    let req = match req.body(Full::new(body.clone())) {
        Ok(r) => r,
        Err(e) => return Answer::None(format!("bad request: {e}")),
    };
    let fut = async {
        let sent = sh.now();
        let resp = http::send(&sh.client, req)
            .await
            .0
            .map_err(|e| e.to_string())?;
        let status = resp.status().as_u16();
        let hint = http::retry_hint(resp.headers(), None);
        let by_proxy = resp.headers().contains_key(crate::LIMITED_BY);
        let bytes = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| format!("reading the answer: {e}"))?
            .to_bytes();
        let e2e = sh.now().saturating_sub(sent);
        if !(200..300).contains(&status)
            && status != 429
            && sh.warned.fetch_add(1, Ordering::Relaxed) < 5
        {
            // the first few unexpected answers, on stderr (the report counts them all)
            let text = String::from_utf8_lossy(&bytes);
            let text: String = text.chars().take(300).collect();
            eprintln!("qsim load: {}: HTTP {status}: {text}", id.name);
        }
        let output_tokens = serde_json::from_slice::<Value>(&bytes)
            .ok()
            .and_then(|v| {
                v.pointer("/usage/completion_tokens")
                    .and_then(Value::as_u64)
            })
            .unwrap_or(0);
        Ok::<_, String>(Answer::Status {
            status,
            hint,
            output_tokens,
            e2e,
            by_proxy,
        })
    };
    let why = match tokio::time::timeout(sh.cfg.timeout, fut).await {
        Ok(Ok(a)) => return a,
        Ok(Err(e)) => e,
        Err(_) => format!("no answer within {:?}", sh.cfg.timeout),
    };
    if sh.warned.fetch_add(1, Ordering::Relaxed) < 5 {
        eprintln!("qsim load: {}: {why}", id.name);
    }
    Answer::None(why)
}

/// Run one row from `first` (virtual): attempts through the core's `Call`
/// until it is done, the scenario ends, or `max_requests` is reached.
async fn row(sh: Arc<Shared>, consumer: usize, load: usize, first: Nanos, input: u32, index: u64) {
    let body = match &sh.cfg.prompt_ids {
        None => request_body(&sh.cfg.model, input, sh.cfg.max_tokens),
        Some(p) => json!({
            "model": sh.cfg.model,
            "prompt": (p.0)(index, input),
            "max_tokens": sh.cfg.max_tokens,
        }),
    };
    let body = Bytes::from(body.to_string());
    let policy = &sh.cfg.policies[load];
    sh.obs(|o, _| o[consumer].rows += 1);
    let mut call = Call::start(first);
    let mut at = first;
    let mut sent: u32 = 0;
    loop {
        if at >= sh.cfg.duration || sh.stopped.load(Ordering::Relaxed) {
            return;
        }
        sh.sleep_until(at).await;
        let now = sh.now();
        // counted in the minute it was due (the simulator's time of the
        // attempt); how late it actually left is reported as lag
        let lag = now.saturating_sub(at);
        let send = {
            let mut pool = sh.pools[load].lock().unwrap_or_else(|e| e.into_inner());
            let mut d = sh.draws.lock().unwrap_or_else(|e| e.into_inner());
            call.on_send(now, &mut pool, &mut || d.unit())
        };
        let reply = if send == Send::LocalReject {
            Reply::LocalReject
        } else {
            if sh.attempts.fetch_add(1, Ordering::Relaxed) >= sh.cfg.max_requests {
                // the bound is reached: no row sends again, none is started
                sh.cut.fetch_add(1, Ordering::Relaxed);
                sh.stopped.store(true, Ordering::Relaxed);
                return;
            }
            let m = ((at / MINUTE) as usize).min(sh.cfg.duration.div_ceil(MINUTE) as usize - 1);
            let sec =
                ((at / NS_PER_SEC) as usize).min(sh.cfg.duration.div_ceil(NS_PER_SEC) as usize - 1);
            sh.lag(lag);
            let charge = match sh.cfg.units {
                Units::Requests => 1,
                Units::Tokens(OutputAccounting::OnCompletion) => input as u64,
                Units::Tokens(_) => input as u64 + sh.cfg.max_tokens,
            };
            sh.obs(|o, _| {
                let c = &mut o[consumer];
                c.offered += 1;
                c.offered_per_min[m] += 1;
                c.offered_units_per_min[m] += charge;
                c.in_flight += 1;
            });
            let answer = attempt(&sh, consumer, &body, sent).await;
            sent += 1;
            sh.obs(|o, _| o[consumer].in_flight -= 1);
            match answer {
                Answer::None(_) => {
                    sh.obs(|o, _| {
                        o[consumer].unanswered += 1;
                        o[consumer].failed += 1;
                    });
                    return;
                }
                Answer::Status {
                    status,
                    hint,
                    output_tokens,
                    e2e,
                    by_proxy,
                } => {
                    sh.obs(|o, limited| {
                        let c = &mut o[consumer];
                        match status {
                            200..=299 => {
                                c.admitted += 1;
                                c.admitted_per_min[m] += 1;
                                c.e2e_ok.push(e2e);
                                c.admitted_units_per_min[m] += match sh.cfg.units {
                                    Units::Requests => 1,
                                    Units::Tokens(OutputAccounting::ReserveNoRefund) => charge,
                                    Units::Tokens(_) => input as u64 + output_tokens,
                                };
                            }
                            429 => {
                                c.limited += 1;
                                if !by_proxy {
                                    c.upstream_limited += 1;
                                }
                                limited[sec] = true;
                            }
                            s => match c.other_status.iter_mut().find(|(x, _)| *x == s) {
                                Some((_, n)) => *n += 1,
                                None => {
                                    c.other_status.push((s, 1));
                                    c.other_status.sort();
                                }
                            },
                        }
                    });
                    if (200..300).contains(&status) {
                        Reply::Ok
                    } else {
                        Reply::Error { status, hint }
                    }
                }
            }
        };
        let now = sh.now();
        let next = {
            let mut pool = sh.pools[load].lock().unwrap_or_else(|e| e.into_inner());
            let mut d = sh.draws.lock().unwrap_or_else(|e| e.into_inner());
            call.on_reply(now, reply, policy, &mut pool, &mut || d.unit())
        };
        match next {
            Next::SendAt { at: t, .. } => at = t,
            Next::Done(o) => {
                if o.status != 200 {
                    sh.obs(|obs, _| obs[consumer].failed += 1);
                }
                return;
            }
        }
    }
}

/// Run the scenario against the target; blocks until done (at most the
/// scenario's length plus `timeout`, in real time).
pub fn run(cfg: LoadConfig, draws: Box<dyn Draws>) -> Result<LoadReport, String> {
    if !(cfg.time_scale > 0.0 && cfg.time_scale.is_finite()) {
        return Err(format!("time scale must be > 0, got {}", cfg.time_scale));
    }
    if cfg.duration == 0 {
        return Err("empty scenario".into());
    }
    let mut b = tokio::runtime::Builder::new_multi_thread();
    if let Some(t) = cfg.threads {
        b.worker_threads(t.max(1));
    }
    let rt = b
        .enable_all()
        .build()
        .map_err(|e| format!("tokio runtime: {e}"))?;
    rt.block_on(drive(cfg, draws))
}

async fn drive(cfg: LoadConfig, draws: Box<dyn Draws>) -> Result<LoadReport, String> {
    let minutes = cfg.duration.div_ceil(MINUTE) as usize;
    let seconds = cfg.duration.div_ceil(NS_PER_SEC) as usize;
    let obs: Vec<ConsumerObs> = cfg
        .consumers
        .iter()
        .map(|c| ConsumerObs {
            name: c.name.clone(),
            offered_per_min: vec![0; minutes],
            admitted_per_min: vec![0; minutes],
            offered_units_per_min: vec![0; minutes],
            admitted_units_per_min: vec![0; minutes],
            ..Default::default()
        })
        .collect();
    let client = http::client(&cfg.target, None)?;
    // the target must answer before the clock starts
    let probe = Request::builder()
        .method(Method::GET)
        .uri(format!("{}/healthz", cfg.target))
        .body(Full::new(Bytes::new()))
        .map_err(|e| format!("--target: {e}"))?;
    match tokio::time::timeout(Duration::from_secs(10), client.request(probe)).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => return Err(format!("cannot reach {}: {e}", cfg.target)),
        Err(_) => return Err(format!("cannot reach {}: no answer in 10 s", cfg.target)),
    }
    let pools = cfg
        .policies
        .iter()
        .map(|_| Mutex::new(PoolShared::default()))
        .collect();
    let sh = Arc::new(Shared {
        clock: Clock::new(0, cfg.time_scale),
        client,
        draws: Mutex::new(draws),
        pools,
        obs: Mutex::new((obs, vec![false; seconds])),
        attempts: AtomicU64::new(0),
        cut: AtomicU64::new(0),
        stopped: AtomicBool::new(false),
        live: AtomicU64::new(0),
        warned: AtomicU64::new(0),
        lag_sum: AtomicU64::new(0),
        lag_max: AtomicU64::new(0),
        lag_over_1s: AtomicU64::new(0),
        cfg,
    });
    let open_rows = sh.cfg.arrivals.len() as u64;
    for (wi, w) in sh.cfg.workers.clone().into_iter().enumerate() {
        let sh = sh.clone();
        sh.live.fetch_add(1, Ordering::SeqCst);
        tokio::spawn(async move {
            let _live = Live(&sh.live);
            let mut t = w.start;
            let mut k = 0u64;
            while t < w.stop && !sh.stopped.load(Ordering::Relaxed) {
                sh.sleep_until(t).await;
                let start = sh.now().max(t);
                let input = sh.input_tokens(w.consumer as usize);
                let index = open_rows + ((wi as u64) << 32) + k;
                k += 1;
                row(
                    sh.clone(),
                    w.consumer as usize,
                    w.load as usize,
                    start,
                    input,
                    index,
                )
                .await;
                t = sh.now().saturating_add(w.think);
            }
        });
    }
    // the dispatcher of open-loop rows: in arrival order, so the rows take
    // their input lengths in the simulator's order
    let disp = {
        let sh = sh.clone();
        tokio::spawn(async move {
            for (index, a) in sh.cfg.arrivals.clone().into_iter().enumerate() {
                if sh.stopped.load(Ordering::Relaxed) || a.at >= sh.cfg.duration {
                    break;
                }
                sh.sleep_until(a.at).await;
                sh.live.fetch_add(1, Ordering::SeqCst);
                let input = match a.input_tokens {
                    Some(n) => n,
                    None => sh.input_tokens(a.consumer as usize),
                };
                let sh2 = sh.clone();
                tokio::spawn(async move {
                    let _live = Live(&sh2.live);
                    row(
                        sh2.clone(),
                        a.consumer as usize,
                        a.load as usize,
                        a.at,
                        input,
                        index as u64,
                    )
                    .await;
                });
            }
        })
    };
    let _ = disp.await;
    // rows still running: wait for them up to `timeout` after the end
    let give_up = sh.real(sh.cfg.duration) + sh.cfg.timeout;
    while sh.live.load(Ordering::SeqCst) > 0 && tokio::time::Instant::now() < give_up {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    sh.stopped.store(true, Ordering::SeqCst);
    let abandoned = sh.live.load(Ordering::SeqCst);
    let wall = sh.clock.elapsed();
    // attempts still without an answer are unanswered (their rows abandoned;
    // the runtime's shutdown cancels them)
    let (consumers, limited_sec) = sh.obs(|o, l| {
        for c in o.iter_mut() {
            c.unanswered += c.in_flight;
            c.failed += c.in_flight;
            c.in_flight = 0;
        }
        (o.clone(), l.clone())
    });
    Ok(LoadReport {
        consumers,
        minutes,
        limited_sec,
        attempts: sh.attempts.load(Ordering::Relaxed).min(sh.cfg.max_requests),
        cut_by_max_requests: sh.cut.load(Ordering::Relaxed),
        abandoned,
        wall,
        time_scale: sh.cfg.time_scale,
        lag_mean: sh
            .lag_sum
            .load(Ordering::Relaxed)
            .checked_div(sh.attempts.load(Ordering::Relaxed).min(sh.cfg.max_requests))
            .unwrap_or(0),
        lag_max: sh.lag_max.load(Ordering::Relaxed),
        lag_over_1s: sh.lag_over_1s.load(Ordering::Relaxed),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_length_gives_the_proxy_estimate() {
        for n in [5u32, 16, 116, 300] {
            let b = request_body("m", n, 256);
            assert_eq!(crate::estimate::input_tokens(&b), n as u64);
        }
    }
}
