//! `qsim replay`'s real-time driver: an experiment's client side (a worker
//! pool with the SDK's hidden retries, the caller's own backoff and its
//! throttles, or the managed AIMD executor) run for real against an HTTP
//! endpoint, through **the same caller state machines** the simulation
//! drives in virtual time (`qsim_core::client::{Call, Managed}`).
//!
//! One coordinator owns every row's [`Call`], the pool's [`PoolShared`] (or
//! the [`Managed`] executor) and the random stream, exactly as the
//! simulator's event loop does; it sends each HTTP attempt as a tokio task
//! and takes the replies from a channel, in arrival order. Nothing here
//! decides whether or when to retry: the state machines answer
//! `Next::SendAt { at, .. }` or `Next::Done(..)` and the coordinator sleeps
//! until `at`.
//!
//! Time is model time (`clock.rs`): `now = (Instant::now() − start) ×
//! time_scale` in integer nanoseconds, so every client-side duration the state machines
//! ask for (backoff, the SDK's delays, the per-attempt timeout, the replay's
//! deadline) lasts `1/time_scale` of itself in real time, and every observed
//! duration is reported ×`time_scale`. A retry hint the endpoint sends is a
//! real-time duration (a time-scaled endpoint scales its own hints): it is
//! converted to model time (×`time_scale`), so honouring it waits exactly
//! the hint in real time.
//!
//! Every HTTP attempt is recorded ([`Attempt`]); an exchange that fails
//! without an HTTP error status (unreachable target, TLS failure, timeout,
//! an answer that is not JSON, a truncated stream) is recorded with its
//! error and reaches the retry layers as status [`EXCHANGE_FAILED`] (599),
//! so layers that retry 5xx retry it, as the OpenAI SDK retries connection
//! errors. Every row of the plan ends in the output, finished or not.

use crate::clock::Clock;
use crate::http::{self, chain, HttpClient};
use crate::sse;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::Request;
use qsim_core::client::managed::AimdParams;
use qsim_core::client::{
    Call, CallerPolicy, Managed, ManagedNext, Next, Outcome, PoolShared, Reply, Send as CallSend,
};
use qsim_core::time::Nanos;
use serde_json::{json, Value};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::{Duration, Instant};
use tokio::sync::mpsc::{unbounded_channel, UnboundedSender};
use tokio::task::AbortHandle;

/// The status an exchange that failed without an HTTP error status reaches
/// the retry layers with (a 5xx: retried where 5xx are).
pub const EXCHANGE_FAILED: u16 = 599;

/// The wire format of the target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wire {
    /// `POST {base}/chat/completions` with `model` in the body (OpenAI, and
    /// Databricks' OpenAI-compatible `…/serving-endpoints` base).
    OpenAi,
    /// `POST {base}/{model}/invocations` (Databricks serving endpoints).
    Databricks,
}

/// Where and how to send.
#[derive(Clone)]
pub struct Target {
    /// Base URL, `http(s)://host[:port][/prefix]`, no trailing slash.
    pub base: String,
    pub wire: Wire,
    pub model: String,
    /// Sent as `Authorization: Bearer …`; never logged or printed.
    pub token: Option<String>,
    /// Ask for an SSE stream (`"stream": true`) and measure TTFT.
    pub stream: bool,
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Target")
            .field("base", &self.base)
            .field("wire", &self.wire)
            .field("model", &self.model)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("stream", &self.stream)
            .finish()
    }
}

impl Target {
    /// The URL every attempt is posted to.
    pub fn url(&self) -> String {
        match self.wire {
            Wire::OpenAi => format!("{}/chat/completions", self.base),
            Wire::Databricks => format!("{}/{}/invocations", self.base, self.model),
        }
    }

    /// The request body for one prompt.
    pub fn body(&self, prompt: &str, max_tokens: u64) -> Value {
        let mut v = json!({
            "messages": [{ "role": "user", "content": prompt }],
            "max_tokens": max_tokens,
            "temperature": 0,
        });
        if self.wire == Wire::OpenAi {
            v["model"] = json!(self.model);
        }
        if self.stream {
            v["stream"] = json!(true);
            if self.wire == Wire::OpenAi {
                v["stream_options"] = json!({ "include_usage": true });
            }
        }
        v
    }
}

/// One row of the table: its index and its prompt.
#[derive(Debug, Clone)]
pub struct Row {
    pub index: u64,
    pub prompt: String,
}

/// How the rows are called (validated by the root crate from the experiment).
#[derive(Debug, Clone)]
pub enum Client {
    /// A closed-loop pool of `workers` (the caller's layers in `caller`,
    /// the retry quota and adaptive throttle in `shared`).
    Pool {
        workers: u32,
        caller: CallerPolicy,
        shared: PoolShared,
    },
    /// The managed batch executor (ai_query) with its AIMD window.
    Managed(AimdParams),
}

/// One experiment to replay.
#[derive(Debug, Clone)]
pub struct Plan {
    pub name: String,
    pub client: Client,
    pub max_tokens: u64,
    pub rows: Vec<Row>,
}

/// Time and bounds.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// Model seconds per real second (1: real time).
    pub time_scale: f64,
    /// Longest one HTTP attempt may take, model time (the SDK's timeout).
    pub attempt_timeout: Nanos,
    /// The replay of this plan stops at this model time: attempts in flight
    /// are cancelled (recorded), rows not finished are written as such.
    pub deadline: Nanos,
}

/// One HTTP attempt (or a local rejection by the adaptive throttle).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Attempt {
    pub row: u64,
    /// Caller-level attempt (1-based).
    pub attempt: u32,
    /// SDK hidden retries before this send within the caller-level attempt.
    pub sdk_retry: u32,
    /// The HTTP status, if an answer arrived.
    pub status: Option<u16>,
    /// The retry hint the answer carried (real time, as sent).
    pub hint: Option<Nanos>,
    /// Model time since the experiment's start.
    pub start: Nanos,
    /// First streamed content (streaming only), model time since start.
    pub ttft: Option<Nanos>,
    pub end: Nanos,
    pub input_tokens: Option<u64>,
    pub output_tokens: Option<u64>,
    pub finish_reason: Option<String>,
    /// `connect`, `tls`, `timeout`, `http`, `body`, `non_json`,
    /// `truncated_stream`, `bad_answer`, `status`, `local_reject`, `deadline`.
    pub error_kind: Option<&'static str>,
    pub error: Option<String>,
}

impl Attempt {
    /// Whether this attempt left the client (a local rejection did not).
    pub fn sent(&self) -> bool {
        self.error_kind != Some("local_reject")
    }
}

/// How one row ended.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RowResult {
    pub row: u64,
    /// 200, the final error status (599: a failed exchange), or `None` if
    /// the replay's deadline came first (or it was never sent).
    pub status: Option<u16>,
    pub attempts: u32,
    pub own_wait: Nanos,
    /// First send to final outcome (model time); 0 if never sent.
    pub latency: Nanos,
    pub quota_denied: bool,
    pub output_tokens: u64,
    pub finish_reason: Option<String>,
    /// The last attempt's error, if the row did not succeed.
    pub error: Option<String>,
    pub sent: bool,
}

/// What one experiment's replay observed.
#[derive(Debug, Clone, Default)]
pub struct Run {
    pub name: String,
    pub attempts: Vec<Attempt>,
    /// One per row of the plan, in row order.
    pub rows: Vec<RowResult>,
    /// First send to the last row's outcome (model time).
    pub elapsed: Nanos,
    /// SDK hidden retries scheduled.
    pub sdk_retries: u64,
    /// The deadline stopped the replay.
    pub timed_out: bool,
    /// Managed executor: the final AIMD window.
    pub final_window: Option<f64>,
}

/// What came back from one exchange (times in model ns since start).
#[derive(Debug, Default)]
struct Exchange {
    status: Option<u16>,
    hint: Option<Nanos>,
    ttft: Option<Nanos>,
    end: Nanos,
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
    finish_reason: Option<String>,
    error: Option<(&'static str, String)>,
}

impl Exchange {
    fn ok(&self) -> bool {
        self.error.is_none() && matches!(self.status, Some(200..=299))
    }
}

fn short(s: &str) -> String {
    let s = s.trim();
    let mut out: String = s.chars().take(200).collect();
    if s.chars().count() > 200 {
        out.push('…');
    }
    out.replace(['\n', '\r'], " ")
}

fn classify_client_error(e: &hyper_util::client::legacy::Error, https: bool) -> &'static str {
    let text = chain(e).to_ascii_lowercase();
    if https
        && (text.contains("tls")
            || text.contains("certificate")
            || text.contains("handshake")
            || text.contains("corrupt message")
            || text.contains("invalidcontenttype"))
    {
        "tls"
    } else if e.is_connect() {
        "connect"
    } else {
        "http"
    }
}

/// The human part of an error answer: `error.message`, `message`, or the text.
fn error_text(status: u16, body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let msg = serde_json::from_slice::<Value>(body).ok().and_then(|v| {
        v.pointer("/error/message")
            .or_else(|| v.get("message"))
            .and_then(Value::as_str)
            .map(str::to_string)
            .or_else(|| v.get("error").and_then(Value::as_str).map(str::to_string))
    });
    format!(
        "HTTP {status}: {}",
        short(&msg.unwrap_or_else(|| text.to_string()))
    )
}

fn usage(v: &Value, x: &mut Exchange) {
    if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
        if let Some(p) = u.get("prompt_tokens").and_then(Value::as_u64) {
            x.input_tokens = Some(p);
        }
        if let Some(c) = u.get("completion_tokens").and_then(Value::as_u64) {
            x.output_tokens = Some(c);
        }
    }
}

async fn exchange(
    client: &HttpClient,
    target: &Target,
    body: Bytes,
    clock: Clock,
    timeout: Duration,
) -> Exchange {
    let https = target.base.starts_with("https://");
    let mut req = Request::post(target.url())
        .header("content-type", "application/json")
        .header(
            "accept",
            if target.stream {
                "text/event-stream"
            } else {
                "application/json"
            },
        )
        .header(
            "user-agent",
            concat!("qsim-replay/", env!("CARGO_PKG_VERSION")),
        );
    if let Some(t) = &target.token {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    let mut x = Exchange::default();
    let req = match req.body(Full::new(body)) {
        Ok(r) => r,
        Err(e) => {
            x.error = Some(("http", format!("cannot build the request: {e}")));
            x.end = clock.now();
            return x;
        }
    };
    let fut = async {
        let resp = match http::send(client, req).await.0 {
            Ok(r) => r,
            Err(e) => {
                let kind = classify_client_error(&e, https);
                let label = match kind {
                    "tls" => "TLS failure",
                    "connect" => "cannot connect",
                    _ => "HTTP failure",
                };
                x.error = Some((kind, format!("{label}: {}", short(&chain(&e)))));
                return;
            }
        };
        let status = resp.status().as_u16();
        x.status = Some(status);
        let headers = resp.headers().clone();
        let sse = http::is_event_stream(&headers);
        let mut body = resp.into_body();
        if (200..300).contains(&status) && target.stream && sse {
            read_stream(&mut body, &mut x, clock).await;
            return;
        }
        if !(200..300).contains(&status) {
            // an error answer: its first ERROR_KEEP bytes (the message, a
            // retry hint), the rest read and dropped
            let mut kept = Vec::new();
            loop {
                match next_data(&mut body).await {
                    None => break,
                    Some(Ok(d)) => keep(&mut kept, &d),
                    Some(Err(e)) => {
                        x.error = Some(("body", format!("answer cut off: {}", short(&chain(&e)))));
                        return;
                    }
                }
            }
            let parsed: Option<Value> = serde_json::from_slice(&kept).ok();
            x.hint = http::retry_hint(&headers, parsed.as_ref());
            x.error = Some(("status", error_text(status, &kept)));
            return;
        }
        // a success: an answer up to ERROR_KEEP bytes is parsed whole; a
        // larger one as it arrives (a blocking task reading from a
        // channel), keeping only what is read from it (usage, the first
        // choice's finish_reason) and its first bytes (for an error
        // message), never the whole answer
        let mut head = Vec::new();
        let mut large: Option<(
            tokio::sync::mpsc::Sender<Bytes>,
            tokio::task::JoinHandle<serde_json::Result<Answer>>,
        )> = None;
        let mut parsing = true;
        loop {
            match next_data(&mut body).await {
                None => break,
                Some(Ok(d)) => match &large {
                    // the parser gone (it failed early): the rest is only read
                    Some((tx, _)) => parsing = parsing && tx.send(d).await.is_ok(),
                    None if head.len() + d.len() <= ERROR_KEEP => head.extend_from_slice(&d),
                    None => {
                        let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(4);
                        let parser = tokio::task::spawn_blocking(move || {
                            serde_json::from_reader::<_, Answer>(ChannelReader {
                                rx,
                                cur: Bytes::new(),
                            })
                        });
                        parsing = tx.send(Bytes::from(head.clone())).await.is_ok()
                            && tx.send(d).await.is_ok();
                        large = Some((tx, parser));
                    }
                },
                Some(Err(e)) => {
                    x.error = Some(("body", format!("answer cut off: {}", short(&chain(&e)))));
                    return;
                }
            }
        }
        let answer = match large {
            None => serde_json::from_slice::<Answer>(&head).ok(),
            Some((tx, parser)) => {
                drop(tx);
                parser.await.ok().and_then(Result::ok)
            }
        };
        let Some(answer) = answer else {
            x.error = Some((
                "non_json",
                format!(
                    "answer is not JSON: {:?}",
                    short(&String::from_utf8_lossy(&head))
                ),
            ));
            return;
        };
        if let Some(u) = answer.usage {
            usage(&json!({ "usage": u }), &mut x);
        }
        match answer.choices {
            Some(First(Some(f))) => x.finish_reason = f,
            _ => {
                x.error = Some((
                    "bad_answer",
                    format!(
                        "answer has no choices: {}",
                        short(&String::from_utf8_lossy(&head))
                    ),
                ))
            }
        }
    };
    if tokio::time::timeout(timeout, fut).await.is_err() {
        x.error = Some((
            "timeout",
            format!("no complete answer within {timeout:?} (real time)"),
        ));
    }
    x.end = clock.now();
    x
}

/// The first bytes of an answer kept for its error message.
const ERROR_KEEP: usize = 64 * 1024;

/// Append what fits of `d` below [`ERROR_KEEP`].
fn keep(kept: &mut Vec<u8>, d: &[u8]) {
    let room = ERROR_KEEP.saturating_sub(kept.len());
    kept.extend_from_slice(&d[..d.len().min(room)]);
}

/// The next data frame of a body (trailers skipped).
async fn next_data(body: &mut Incoming) -> Option<Result<Bytes, hyper::Error>> {
    loop {
        match body.frame().await? {
            Err(e) => return Some(Err(e)),
            Ok(f) => {
                if let Ok(d) = f.into_data() {
                    return Some(Ok(d));
                }
            }
        }
    }
}

/// What a replay reads from a JSON answer; every other field (the
/// message's content among them) is skipped as it is parsed.
#[derive(serde::Deserialize)]
struct Answer {
    #[serde(default)]
    usage: Option<Value>,
    #[serde(default)]
    choices: Option<First>,
}

/// `choices`: the first one's `finish_reason` (`Some(None)`: a first
/// choice without one; `None`: no choice).
struct First(Option<Option<String>>);

impl<'de> serde::Deserialize<'de> for First {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = First;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an array of choices")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<First, A::Error> {
                let first = seq.next_element::<Choice>()?.map(|c| c.0);
                while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
                Ok(First(first))
            }
        }
        d.deserialize_seq(V)
    }
}

/// One choice: its `finish_reason` if a string.
struct Choice(Option<String>);

impl<'de> serde::Deserialize<'de> for Choice {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Choice;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a choice object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut m: A) -> Result<Choice, A::Error> {
                let mut reason = None;
                while let Some(k) = m.next_key::<std::borrow::Cow<'de, str>>()? {
                    if k == "finish_reason" {
                        reason = m.next_value::<Value>()?.as_str().map(String::from);
                    } else {
                        m.next_value::<serde::de::IgnoredAny>()?;
                    }
                }
                Ok(Choice(reason))
            }
        }
        d.deserialize_map(V)
    }
}

/// A blocking reader of the chunks an async task sends (end: the sender
/// dropped).
struct ChannelReader {
    rx: tokio::sync::mpsc::Receiver<Bytes>,
    cur: Bytes,
}

impl std::io::Read for ChannelReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.cur.is_empty() {
            match self.rx.blocking_recv() {
                Some(b) => self.cur = b,
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.cur.len());
        buf[..n].copy_from_slice(&self.cur[..n]);
        bytes::Buf::advance(&mut self.cur, n);
        Ok(n)
    }
}

/// Read an SSE answer: TTFT at the first content, `finish_reason` and
/// `usage` from the events; no `data: [DONE]` before the end is a truncated
/// stream.
async fn read_stream(body: &mut Incoming, x: &mut Exchange, clock: Clock) {
    let mut lines = sse::Reader::default();
    let mut done = false;
    let mut chunks = 0u64;
    loop {
        let frame = match body.frame().await {
            None => break,
            Some(Ok(f)) => f,
            Some(Err(e)) => {
                x.error = Some((
                    "truncated_stream",
                    format!("stream broken after {chunks} events: {}", short(&chain(&e))),
                ));
                return;
            }
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        lines.push(&data);
        while let Some(d) = lines.next_data() {
            let payload = match d {
                sse::Data::Done => {
                    done = true;
                    continue;
                }
                sse::Data::Event(p) => p,
            };
            let v: Value = match serde_json::from_slice(payload) {
                Ok(v) => v,
                Err(_) => {
                    x.error = Some((
                        "non_json",
                        format!(
                            "stream event is not JSON: {:?}",
                            short(&String::from_utf8_lossy(payload))
                        ),
                    ));
                    return;
                }
            };
            chunks += 1;
            if let Some(c) = v.pointer("/choices/0") {
                let content = c.pointer("/delta/content").and_then(Value::as_str);
                if x.ttft.is_none() && content.is_some_and(|s| !s.is_empty()) {
                    x.ttft = Some(clock.now());
                }
                if let Some(f) = c.get("finish_reason").and_then(Value::as_str) {
                    x.finish_reason = Some(f.to_string());
                }
            }
            if let Some(e) = v.get("error") {
                x.error = Some((
                    "bad_answer",
                    format!("error event in stream: {}", short(&e.to_string())),
                ));
                return;
            }
            usage(&v, x);
        }
    }
    if !done {
        x.error = Some((
            "truncated_stream",
            format!("stream ended after {chunks} events without data: [DONE]"),
        ));
    }
}

/// A row being worked on.
struct Active {
    row: usize,
    call: Call,
    /// Index of the in-flight attempt in `Run::attempts`.
    rec: usize,
}

struct Driver {
    http: HttpClient,
    target: Target,
    clock: Clock,
    opts: Options,
    tx: UnboundedSender<(usize, Exchange)>,
    inflight: Vec<(usize, AbortHandle)>,
    run: Run,
    bodies: Vec<Bytes>,
}

impl Driver {
    /// Send the row's next attempt as a task; `slot` comes back with its reply.
    fn send(&mut self, slot: usize, a: &mut Active, now: Nanos) {
        let rec = Attempt {
            row: a.row as u64,
            attempt: a.call.attempt(),
            sdk_retry: a.call.sdk_retries(),
            start: now,
            ..Default::default()
        };
        a.rec = self.run.attempts.len();
        self.run.attempts.push(rec);
        let (http, target, clock, tx) = (
            self.http.clone(),
            self.target.clone(),
            self.clock,
            self.tx.clone(),
        );
        let body = self.bodies[a.row].clone();
        let timeout = self.clock.real(self.opts.attempt_timeout);
        let h = tokio::spawn(async move {
            let x = exchange(&http, &target, body, clock, timeout).await;
            let _ = tx.send((slot, x));
        });
        self.inflight.push((slot, h.abort_handle()));
    }

    /// Fill the attempt record from its exchange; the reply the caller sees.
    fn settle(&mut self, slot: usize, rec: usize, x: &Exchange) -> Reply {
        self.inflight.retain(|(s, _)| *s != slot);
        let r = &mut self.run.attempts[rec];
        r.status = x.status;
        r.hint = x.hint;
        r.ttft = x.ttft;
        r.end = x.end;
        r.input_tokens = x.input_tokens;
        r.output_tokens = x.output_tokens;
        r.finish_reason = x.finish_reason.clone();
        if let Some((k, e)) = &x.error {
            r.error_kind = Some(k);
            r.error = Some(e.clone());
        }
        if x.ok() {
            Reply::Ok
        } else {
            let status = match x.status {
                Some(s) if s >= 400 => s,
                _ => EXCHANGE_FAILED,
            };
            // the hint is real time (a time-scaled endpoint scales its own)
            let hint = x.hint.map(|h| self.clock.model(h));
            Reply::Error { status, hint }
        }
    }

    fn finish(&mut self, a: &Active, o: &Outcome, last: Option<&Exchange>) {
        let rr = &mut self.run.rows[a.row];
        rr.status = Some(o.status);
        rr.attempts = o.attempts;
        rr.own_wait = o.own_wait;
        rr.latency = o.latency;
        rr.quota_denied = o.quota_denied;
        rr.sent = true;
        if let Some(x) = last {
            rr.finish_reason = x.finish_reason.clone();
            if o.status == 200 {
                rr.output_tokens = x.output_tokens.unwrap_or(0);
            } else {
                rr.error = x.error.as_ref().map(|(_, e)| e.clone());
            }
        } else if o.status != 200 {
            rr.error = Some("rejected locally by the adaptive throttle".into());
        }
    }

    /// The deadline came: cancel what is in flight (recorded), leave the
    /// unfinished rows as they are (status `None`).
    fn stop(&mut self, active: &[(usize, Option<Active>)]) {
        let now = self.clock.now();
        for (_, h) in self.inflight.drain(..) {
            h.abort();
        }
        for (_, a) in active {
            if let Some(a) = a {
                let r = &mut self.run.attempts[a.rec];
                if r.end == 0 && r.error_kind.is_none() && r.status.is_none() {
                    r.end = now;
                    r.error_kind = Some("deadline");
                    r.error = Some("cancelled: the replay's --timeout passed".into());
                }
                let rr = &mut self.run.rows[a.row];
                rr.sent = true;
                rr.attempts = a.call.attempt();
                rr.error = Some("not finished: the replay's --timeout passed".into());
            }
        }
        self.run.timed_out = true;
    }
}

/// Replay one experiment (blocking: runs its own tokio runtime).
pub fn run(
    target: &Target,
    plan: &Plan,
    opts: Options,
    rng: &mut (dyn FnMut() -> f64 + std::marker::Send),
) -> Result<Run, String> {
    if !(opts.time_scale.is_finite() && opts.time_scale > 0.0) {
        return Err(format!("time scale must be > 0, got {}", opts.time_scale));
    }
    let http = http::client(&target.base, None)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the tokio runtime: {e}"))?;
    rt.block_on(async move {
        let (tx, mut rx) = unbounded_channel::<(usize, Exchange)>();
        let bodies = plan
            .rows
            .iter()
            .map(|r| Bytes::from(target.body(&r.prompt, plan.max_tokens).to_string()))
            .collect();
        let mut d = Driver {
            http,
            target: target.clone(),
            clock: Clock::new(0, opts.time_scale),
            opts,
            tx,
            inflight: Vec::new(),
            run: Run {
                name: plan.name.clone(),
                rows: plan
                    .rows
                    .iter()
                    .map(|r| RowResult {
                        row: r.index,
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            },
            bodies,
        };
        let deadline = d.clock.at(opts.deadline);
        let mut uniform = || rng();
        match &plan.client {
            Client::Pool {
                workers,
                caller,
                shared,
            } => {
                pool(
                    &mut d,
                    plan,
                    *workers,
                    caller,
                    shared.clone(),
                    &mut rx,
                    deadline,
                    &mut uniform,
                )
                .await
            }
            Client::Managed(p) => managed(&mut d, plan, p, &mut rx, deadline, &mut uniform).await,
        }
        d.run.sdk_retries = d.run.attempts.iter().filter(|a| a.sdk_retry > 0).count() as u64;
        // fix the row index of each attempt (slots held plan positions)
        for a in &mut d.run.attempts {
            a.row = plan.rows[a.row as usize].index;
        }
        Ok(d.run)
    })
}

type Rx = tokio::sync::mpsc::UnboundedReceiver<(usize, Exchange)>;

#[allow(clippy::too_many_arguments)]
async fn pool(
    d: &mut Driver,
    plan: &Plan,
    workers: u32,
    caller: &CallerPolicy,
    mut shared: PoolShared,
    rx: &mut Rx,
    deadline: Instant,
    rng: &mut impl FnMut() -> f64,
) {
    let n = plan.rows.len();
    let mut next_row = 0usize;
    // (slot, its row) — slots are workers
    let mut slots: Vec<(usize, Option<Active>)> =
        (0..workers as usize).map(|w| (w, None)).collect();
    // (model time, seq, slot): sends due
    let mut timers: BinaryHeap<Reverse<(Nanos, u64, usize)>> = BinaryHeap::new();
    let mut seq = 0u64;
    let mut last: Nanos = 0;
    // every worker takes a row at the start (ThreadPoolExecutor.map)
    for (w, s) in slots.iter_mut() {
        if next_row < n {
            s.replace(Active {
                row: next_row,
                call: Call::start(0),
                rec: 0,
            });
            next_row += 1;
            timers.push(Reverse((0, seq, *w)));
            seq += 1;
        }
    }
    loop {
        // sends that are due
        let now = d.clock.now();
        while let Some(&Reverse((at, _, w))) = timers.peek() {
            if at > now {
                break;
            }
            timers.pop();
            let mut a = slots[w].1.take().expect("active row");
            let t = d.clock.now();
            match a.call.on_send(t, &mut shared, rng) {
                CallSend::Go => {
                    d.send(w, &mut a, t);
                    slots[w].1 = Some(a);
                }
                CallSend::LocalReject => {
                    d.run.attempts.push(Attempt {
                        row: a.row as u64,
                        attempt: a.call.attempt(),
                        sdk_retry: a.call.sdk_retries(),
                        status: Some(429),
                        start: t,
                        end: t,
                        error_kind: Some("local_reject"),
                        error: Some("rejected locally by the adaptive throttle".into()),
                        ..Default::default()
                    });
                    match a
                        .call
                        .on_reply(t, Reply::LocalReject, caller, &mut shared, rng)
                    {
                        Next::SendAt { at, .. } => {
                            timers.push(Reverse((at, seq, w)));
                            seq += 1;
                            slots[w].1 = Some(a);
                        }
                        Next::Done(o) => {
                            d.finish(&a, &o, None);
                            last = last.max(t);
                            if next_row < n {
                                slots[w].1 = Some(Active {
                                    row: next_row,
                                    call: Call::start(t),
                                    rec: 0,
                                });
                                next_row += 1;
                                timers.push(Reverse((t, seq, w)));
                                seq += 1;
                            }
                        }
                    }
                }
            }
        }
        if slots.iter().all(|(_, a)| a.is_none()) {
            break;
        }
        let wake = timers
            .peek()
            .map(|Reverse((at, _, _))| d.clock.at(*at))
            .unwrap_or(deadline)
            .min(deadline);
        tokio::select! {
            msg = rx.recv() => {
                let Some((w, x)) = msg else { break };
                let mut a = slots[w].1.take().expect("active row");
                let reply = d.settle(w, a.rec, &x);
                let t = d.clock.now();
                match a.call.on_reply(t, reply, caller, &mut shared, rng) {
                    Next::SendAt { at, .. } => {
                        timers.push(Reverse((at, seq, w)));
                        seq += 1;
                        slots[w].1 = Some(a);
                    }
                    Next::Done(o) => {
                        d.finish(&a, &o, Some(&x));
                        last = last.max(t);
                        if next_row < n {
                            slots[w].1 = Some(Active { row: next_row, call: Call::start(t), rec: 0 });
                            next_row += 1;
                            timers.push(Reverse((t, seq, w)));
                            seq += 1;
                        }
                    }
                }
            }
            _ = tokio::time::sleep_until(wake.into()) => {
                if Instant::now() >= deadline {
                    d.stop(&slots);
                    break;
                }
            }
        }
    }
    d.run.elapsed = last;
}

async fn managed(
    d: &mut Driver,
    plan: &Plan,
    p: &AimdParams,
    rx: &mut Rx,
    deadline: Instant,
    rng: &mut impl FnMut() -> f64,
) {
    let n = plan.rows.len();
    let mut next_row = 0usize;
    let mut exec: Managed<usize> = Managed::new(p.clone());
    let mut slots: Vec<(usize, Option<Active>)> = Vec::new();
    let mut free: Vec<usize> = Vec::new();
    let mut last: Nanos = 0;
    let mut finished = 0usize;
    loop {
        let now = d.clock.now();
        while exec.has_room() {
            let (mut call, row) = match exec.take_eligible(now) {
                Some(x) => x,
                None if next_row < n => {
                    next_row += 1;
                    (Call::start(now), next_row - 1)
                }
                None => break,
            };
            let slot = free.pop().unwrap_or_else(|| {
                slots.push((slots.len(), None));
                slots.len() - 1
            });
            exec.on_send(now, &mut call);
            let mut a = Active { row, call, rec: 0 };
            d.send(slot, &mut a, now);
            slots[slot].1 = Some(a);
        }
        if finished == n {
            break;
        }
        let wake = exec
            .poll_timeout()
            .filter(|_| exec.has_room())
            .map(|t| d.clock.at(t))
            .unwrap_or(deadline)
            .min(deadline);
        tokio::select! {
            msg = rx.recv() => {
                let Some((slot, x)) = msg else { break };
                let a = slots[slot].1.take().expect("in flight");
                free.push(slot);
                let reply = d.settle(slot, a.rec, &x);
                let t = d.clock.now();
                match reply {
                    Reply::Ok => {
                        let o = exec.on_success(t, &a.call);
                        d.finish(&a, &o, Some(&x));
                        finished += 1;
                        last = last.max(t);
                    }
                    Reply::Error { status, hint } => {
                        let Active { row, call, rec } = a;
                        match exec.on_failure(t, call, row, status, hint, rng) {
                            ManagedNext::Done(o) => {
                                d.finish(&Active { row, call, rec }, &o, Some(&x));
                                finished += 1;
                                last = last.max(t);
                            }
                            ManagedNext::EligibleAt(_) => {}
                        }
                    }
                    Reply::LocalReject => unreachable!("a managed executor has no throttle"),
                }
            }
            _ = tokio::time::sleep_until(wake.into()) => {
                if Instant::now() >= deadline {
                    // rows parked for a retry are unfinished too
                    let mut parked = Vec::new();
                    while let Some((call, row)) = exec.take_eligible(u64::MAX) {
                        parked.push((usize::MAX, Some(Active { row, call, rec: usize::MAX })));
                    }
                    for (_, a) in &parked {
                        if let Some(a) = a {
                            let rr = &mut d.run.rows[a.row];
                            rr.sent = true;
                            rr.attempts = a.call.attempt() - 1;
                            rr.error = Some("not finished: the replay's --timeout passed".into());
                        }
                    }
                    d.stop(&slots);
                    break;
                }
            }
        }
    }
    d.run.final_window = Some(exec.window());
    d.run.elapsed = last;
}
