//! `qsim serve`: an OpenAI-compatible (and Databricks serving-endpoints
//! compatible) endpoint that answers from a model instead of a GPU.
//!
//! The model is a sans-IO [`Backend`] (the root crate implements it for a
//! hosted-API profile and for the GPU server `Cluster`): `submit(now, …)`,
//! `poll_timeout()`, `handle_timeout(now)`, each emitting [`Event`]s
//! (tokens, completions, failures) for request ids. This module is only the
//! real-time driver around it:
//!
//! - the clock (`clock.rs`, the one clock of the real-time drivers): model
//!   time `now = (Instant::now() − start) × time_scale` in integer ns, so
//!   every modelled duration (latencies, limit windows, retry hints) lasts
//!   `1/time_scale` of itself in real time;
//! - one driver thread owns the deadline: it sleeps on a condition variable
//!   until the backend's `poll_timeout()` (converted to an `Instant`), or
//!   until a submission wakes it, then calls `handle_timeout(now)` and hands
//!   the events to the waiting connections. A late wake-up does not shift
//!   the model (the backend processes every deadline at its own time); it
//!   only delays delivery;
//! - HTTP (hyper 1): request parsing and validation (OpenAI-style 400s), the
//!   JSON answer or the SSE stream (one chunk per token as the model emits
//!   it, `usage` at the end), and the 429/500 answers in the shape the
//!   backend names.
//!
//! The backend is behind one mutex, held without any `await`: a submission
//! first advances the model to `now` (so events are processed in time order
//! whoever triggers them), then submits.

use crate::clock::Clock;
use crate::estimate;
use crate::http::{self, error, BoxError, RespBody};
use crate::sse;
use crate::sync::lock;
use bytes::Bytes;
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderName, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use qsim_core::time::Nanos;
use serde_json::{json, Map, Value};
use std::collections::{BTreeMap, VecDeque};
use std::io::Write;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

pub use qsim_core::model::{Backend, Event, Failure, Finish, GenRequest, Invalid, RetryHint};

/// Request bodies above this are answered 413.
pub const MAX_BODY_BYTES: usize = 4 << 20;

/// How to serve.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// Port 0: any free port (printed on stdout's first line).
    pub listen: SocketAddr,
    /// Model seconds per real second (> 0).
    pub time_scale: f64,
}

struct Core<B> {
    backend: B,
    waiters: BTreeMap<u64, UnboundedSender<Event>>,
    events: Vec<Event>,
    stop: bool,
}

impl<B> Core<B> {
    /// Hand the collected events to their connections (a connection that
    /// left is ignored: the model goes on as it would).
    fn dispatch(&mut self) {
        for e in self.events.drain(..) {
            let id = e.id();
            let terminal = e.terminal();
            if let Some(tx) = self.waiters.get(&id) {
                let _ = tx.send(e);
            }
            if terminal {
                self.waiters.remove(&id);
            }
        }
    }
}

struct App<B> {
    core: Mutex<Core<B>>,
    wake: Condvar,
    clock: Clock,
    name: String,
    next_id: AtomicU64,
}

impl<B> App<B> {
    fn lock(&self) -> MutexGuard<'_, Core<B>> {
        lock(&self.core)
    }
}

/// Bind, print `listening on http://ADDR` as stdout's first line, and serve
/// until SIGINT/SIGTERM.
pub fn run<B: Backend>(cfg: ServeConfig, backend: B) -> Result<(), String> {
    if !(cfg.time_scale.is_finite() && cfg.time_scale > 0.0) {
        return Err(format!("time scale must be > 0, got {}", cfg.time_scale));
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("tokio runtime: {e}"))?;
    rt.block_on(serve(cfg, backend))
}

fn driver<B: Backend>(app: Arc<App<B>>) {
    let mut g = app.lock();
    loop {
        if g.stop {
            return;
        }
        let now = app.clock.now();
        let c = &mut *g;
        c.backend.handle_timeout(now, &mut c.events);
        c.dispatch();
        g = match g.backend.poll_timeout() {
            Some(t) => {
                let wait = app.clock.at(t).saturating_duration_since(Instant::now());
                if wait.is_zero() {
                    continue;
                }
                app.wake
                    .wait_timeout(g, wait)
                    .unwrap_or_else(|e| e.into_inner())
                    .0
            }
            None => app.wake.wait(g).unwrap_or_else(|e| e.into_inner()),
        };
    }
}

async fn serve<B: Backend>(cfg: ServeConfig, backend: B) -> Result<(), String> {
    let listener = tokio::net::TcpListener::bind(cfg.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", cfg.listen))?;
    let addr: SocketAddr = listener.local_addr().map_err(|e| e.to_string())?;
    let app = Arc::new(App {
        name: backend.name().to_string(),
        core: Mutex::new(Core {
            backend,
            waiters: BTreeMap::new(),
            events: Vec::new(),
            stop: false,
        }),
        wake: Condvar::new(),
        clock: Clock::new(0, cfg.time_scale),
        next_id: AtomicU64::new(1),
    });
    let d = app.clone();
    let thread = std::thread::Builder::new()
        .name("qsim-serve-driver".into())
        .spawn(move || driver(d))
        .map_err(|e| format!("driver thread: {e}"))?;
    {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "listening on http://{addr}");
        let _ = out.flush();
    }
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let a = app.clone();
    http::accept_until_shutdown(
        &listener,
        &graceful,
        http::ConnLimits::default,
        move |req| handle(a.clone(), req),
    )
    .await;
    drop(listener);
    tokio::select! {
        _ = graceful.shutdown() => {}
        _ = tokio::time::sleep(Duration::from_secs(30)) => {}
    }
    app.lock().stop = true;
    app.wake.notify_all();
    let _ = thread.join();
    Ok(())
}

/// A JSON answer.
fn json_response(status: StatusCode, v: &Value) -> Response<RespBody> {
    http::json_response(status, v.to_string())
}

fn bad(code: &str, message: &str) -> Response<RespBody> {
    error(
        StatusCode::BAD_REQUEST,
        "invalid_request_error",
        code,
        message,
    )
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Api {
    Chat,
    Completions,
}

enum Route {
    Health,
    Models,
    /// The API, or `None` for `invocations` (decided by the body), and the
    /// endpoint name from the path.
    Generate(Option<Api>, Option<String>),
}

fn route(path: &str) -> Option<Route> {
    match path {
        "/healthz" => Some(Route::Health),
        "/v1/models" => Some(Route::Models),
        "/v1/chat/completions" | "/serving-endpoints/chat/completions" => {
            Some(Route::Generate(Some(Api::Chat), None))
        }
        "/v1/completions" => Some(Route::Generate(Some(Api::Completions), None)),
        p => http::invocations(p).map(|name| Route::Generate(None, Some(name.to_string()))),
    }
}

async fn handle<B: Backend>(app: Arc<App<B>>, req: Request<Incoming>) -> Response<RespBody> {
    let id = app.next_id.fetch_add(1, Ordering::Relaxed);
    let resp = match (route(req.uri().path()), req.method()) {
        (Some(Route::Health), &Method::GET) => Response::new(http::full("ok\n")),
        (Some(Route::Models), &Method::GET) => json_response(
            StatusCode::OK,
            &json!({"object": "list", "data": [
                {"id": app.name, "object": "model", "created": 0, "owned_by": "qsim"}]}),
        ),
        (Some(Route::Generate(api, endpoint)), &Method::POST) => {
            generate(&app, req, id, api, endpoint).await
        }
        (Some(_), _) => http::method_not_allowed(),
        (None, _) => http::not_found(),
    };
    http::with_request_id(resp, id)
}

/// FNV-1a, 64 bit.
fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// FNV-1a of the prompt's JSON text (`messages`, else `prompt`), as
/// [`GenRequest::prompt_hash`] (for the proxy's drift shadow).
pub fn prompt_hash(body: &Value) -> u64 {
    let prompt = body.get("messages").or_else(|| body.get("prompt"));
    fnv1a(prompt.map(|p| p.to_string()).unwrap_or_default().as_bytes())
}

/// The parsed parts of a generation request.
struct Parsed {
    api: Api,
    model: String,
    stream: bool,
    include_usage: bool,
    req: GenRequest,
}

/// Validate a request body the way the OpenAI API does (the fields this
/// endpoint reads), or say why not.
fn parse(
    body: &Value,
    api: Option<Api>,
    endpoint: Option<String>,
) -> Result<Parsed, (&'static str, String)> {
    let o = body.as_object().ok_or((
        "invalid_json",
        "the request body must be a JSON object".into(),
    ))?;
    let api = match api {
        Some(a) => a,
        None if o.contains_key("messages") => Api::Chat,
        None if o.contains_key("prompt") => Api::Completions,
        None => {
            return Err((
                "missing_required_parameter",
                "the body needs `messages` (chat) or `prompt` (completions)".into(),
            ))
        }
    };
    let model = match (o.get("model"), endpoint) {
        (Some(Value::String(m)), _) if !m.is_empty() => m.clone(),
        (None | Some(Value::Null), Some(e)) => e,
        (None | Some(Value::Null), None) => {
            return Err((
                "missing_required_parameter",
                "you must provide a model parameter".into(),
            ))
        }
        (Some(v), _) => return Err(("invalid_type", format!("`model` must be a string, got {v}"))),
    };
    match api {
        Api::Chat => {
            let ms = o.get("messages").and_then(Value::as_array).ok_or((
                "missing_required_parameter",
                "`messages` must be a non-empty array".to_string(),
            ))?;
            if ms.is_empty() {
                return Err((
                    "invalid_value",
                    "`messages` must be a non-empty array".into(),
                ));
            }
            for (i, m) in ms.iter().enumerate() {
                let role_ok = m.get("role").is_some_and(Value::is_string);
                let content_ok = match m.get("content") {
                    None | Some(Value::Null) => {
                        m.get("role").and_then(Value::as_str) == Some("assistant")
                    }
                    Some(Value::String(_)) | Some(Value::Array(_)) => true,
                    Some(_) => false,
                };
                if !m.is_object() || !role_ok || !content_ok {
                    return Err((
                        "invalid_value",
                        format!("messages[{i}] must be an object with a string `role` and a string or array `content`"),
                    ));
                }
            }
        }
        Api::Completions => match o.get("prompt") {
            Some(Value::String(_)) => {}
            Some(Value::Array(a))
                if (!a.is_empty() && a.iter().all(Value::is_u64))
                    || (a.len() == 1 && a[0].is_string()) => {}
            Some(Value::Array(a))
                if a.len() > 1 && a.iter().all(|x| x.is_string() || x.is_array()) =>
            {
                return Err((
                    "unsupported_value",
                    "a batch of prompts is not supported: send one prompt per request".into(),
                ))
            }
            None | Some(Value::Null) => {
                return Err((
                    "missing_required_parameter",
                    "you must provide a `prompt`".into(),
                ))
            }
            Some(_) => {
                return Err((
                    "invalid_type",
                    "`prompt` must be a string or an array of token ids".into(),
                ))
            }
        },
    }
    let stated = match o.get("max_tokens") {
        None | Some(Value::Null) => o.get("max_completion_tokens"),
        s => s,
    };
    let max_tokens = match stated {
        None | Some(Value::Null) => None,
        Some(v) => match v.as_u64() {
            Some(n) if n > 0 => Some(n),
            _ => {
                return Err((
                    "invalid_value",
                    format!("max_tokens must be a positive integer, got {v}"),
                ))
            }
        },
    };
    let stream = match o.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(v) => {
            return Err((
                "invalid_type",
                format!("`stream` must be a boolean, got {v}"),
            ))
        }
    };
    match o.get("n") {
        None | Some(Value::Null) => {}
        Some(v) if v.as_u64() == Some(1) => {}
        Some(v) => {
            return Err((
                "unsupported_value",
                format!("only n = 1 is supported, got {v}"),
            ))
        }
    }
    let include_usage = body
        .pointer("/stream_options/include_usage")
        .and_then(Value::as_bool)
        == Some(true);
    let prompt = match api {
        Api::Chat => o.get("messages"),
        Api::Completions => o.get("prompt"),
    };
    let prompt_hash = fnv1a(prompt.map(|p| p.to_string()).unwrap_or_default().as_bytes());
    Ok(Parsed {
        api,
        model,
        stream,
        include_usage,
        req: GenRequest {
            input_tokens: estimate::input_tokens(body),
            max_tokens,
            prompt_hash,
            output_tokens: None,
        },
    })
}

async fn generate<B: Backend>(
    app: &Arc<App<B>>,
    req: Request<Incoming>,
    id: u64,
    api: Option<Api>,
    endpoint: Option<String>,
) -> Response<RespBody> {
    let too_large = || {
        error(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            "body_too_large",
            &format!("request body over {MAX_BODY_BYTES} bytes"),
        )
    };
    let bytes = match Limited::new(req.into_body(), MAX_BODY_BYTES)
        .collect()
        .await
    {
        Ok(c) => c.to_bytes(),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => return too_large(),
        Err(e) => return bad("body_read", &format!("cannot read the request body: {e}")),
    };
    let body: Value = match serde_json::from_slice(&bytes) {
        Ok(v) => v,
        Err(e) => return bad("invalid_json", &format!("malformed JSON: {e}")),
    };
    let p = match parse(&body, api, endpoint) {
        Ok(p) => p,
        Err((code, msg)) => return bad(code, &msg),
    };
    let (tx, mut rx) = unbounded_channel();
    {
        let mut g = app.lock();
        let c = &mut *g;
        let now = app.clock.now();
        c.backend.handle_timeout(now, &mut c.events);
        c.dispatch();
        let r = c.backend.submit(now, id, &p.req, &mut c.events);
        if let Err(inv) = r {
            c.dispatch();
            return bad(inv.code, &inv.message);
        }
        c.waiters.insert(id, tx);
        c.dispatch();
    }
    app.wake.notify_one();
    let meta = Meta {
        id: match p.api {
            Api::Chat => format!("chatcmpl-qsim-{id}"),
            Api::Completions => format!("cmpl-qsim-{id}"),
        },
        api: p.api,
        model: p.model,
        created: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        include_usage: p.include_usage,
        salt: p.req.prompt_hash,
    };
    if p.stream {
        // the status is known with the first event: a refusal is a plain
        // JSON error, an answer an SSE stream from its first token on
        let Some(first) = rx.recv().await else {
            return server_error();
        };
        match first {
            Event::Failed { failure, .. } => failed(&failure, &meta, &app.clock),
            e => {
                let mut s = Sse {
                    rx,
                    meta,
                    sent: 0,
                    pending: VecDeque::new(),
                    finished: false,
                };
                s.push(e);
                let mut r = Response::new(s.boxed_unsync());
                let h = r.headers_mut();
                h.insert(
                    hyper::header::CONTENT_TYPE,
                    HeaderValue::from_static("text/event-stream"),
                );
                h.insert(
                    hyper::header::CACHE_CONTROL,
                    HeaderValue::from_static("no-cache"),
                );
                r
            }
        }
    } else {
        let mut tokens = 0;
        while let Some(e) = rx.recv().await {
            match e {
                Event::Tokens { n, .. } => tokens += n,
                Event::Failed { failure, .. } => return failed(&failure, &meta, &app.clock),
                Event::Done {
                    prompt_tokens,
                    completion_tokens,
                    finish,
                    ..
                } => {
                    debug_assert_eq!(tokens, completion_tokens);
                    return json_response(
                        StatusCode::OK,
                        &meta.whole(prompt_tokens, completion_tokens, finish),
                    );
                }
            }
        }
        server_error()
    }
}

fn server_error() -> Response<RespBody> {
    error(
        StatusCode::INTERNAL_SERVER_ERROR,
        "server_error",
        "internal_error",
        "The server had an error while processing your request.",
    )
}

/// Token `k` of an answer: a word (the text has no meaning; one token, one
/// word, one SSE chunk).
fn word(salt: u64, k: u64) -> &'static str {
    const W: [&str; 16] = [
        " the",
        " model",
        " answers",
        " with",
        " simulated",
        " tokens",
        " at",
        " the",
        " modelled",
        " pace",
        " and",
        " reports",
        " its",
        " usage",
        " at",
        " last.",
    ];
    W[((salt.wrapping_add(k)) % W.len() as u64) as usize]
}

struct Meta {
    id: String,
    api: Api,
    model: String,
    created: u64,
    include_usage: bool,
    salt: u64,
}

fn usage(p: u64, c: u64) -> Value {
    json!({"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c})
}

impl Meta {
    fn text(&self, from: u64, to: u64) -> String {
        (from..to).map(|k| word(self.salt, k)).collect()
    }

    fn whole(&self, p: u64, c: u64, finish: Finish) -> Value {
        let text = self.text(0, c);
        let choice = match self.api {
            Api::Chat => json!({"index": 0, "message": {"role": "assistant", "content": text},
                                "logprobs": null, "finish_reason": finish.name()}),
            Api::Completions => json!({"index": 0, "text": text, "logprobs": null,
                                       "finish_reason": finish.name()}),
        };
        json!({"id": self.id, "object": self.object(false), "created": self.created,
               "model": self.model, "choices": [choice], "usage": usage(p, c)})
    }

    fn object(&self, chunk: bool) -> &'static str {
        match (self.api, chunk) {
            (Api::Chat, false) => "chat.completion",
            (Api::Chat, true) => "chat.completion.chunk",
            (Api::Completions, _) => "text_completion",
        }
    }

    fn chunk(&self, choices: Value, usage: Option<Value>) -> Bytes {
        let mut m = Map::new();
        m.insert("id".into(), json!(self.id));
        m.insert("object".into(), json!(self.object(true)));
        m.insert("created".into(), json!(self.created));
        m.insert("model".into(), json!(self.model));
        m.insert("choices".into(), choices);
        if let Some(u) = usage {
            m.insert("usage".into(), u);
        }
        sse::event(&Value::Object(m).to_string())
    }

    /// One chunk per token `k` (the first carries the role).
    fn token_chunk(&self, k: u64) -> Bytes {
        let w = word(self.salt, k);
        let choice = match self.api {
            Api::Chat if k == 0 => {
                json!({"index": 0, "delta": {"role": "assistant", "content": w}, "logprobs": null, "finish_reason": null})
            }
            Api::Chat => {
                json!({"index": 0, "delta": {"content": w}, "logprobs": null, "finish_reason": null})
            }
            Api::Completions => {
                json!({"index": 0, "text": w, "logprobs": null, "finish_reason": null})
            }
        };
        self.chunk(json!([choice]), None)
    }

    /// The last chunks: the finish reason (with `usage` on it unless the
    /// client asked for the separate usage chunk), then `[DONE]`.
    fn end_chunks(&self, p: u64, c: u64, finish: Finish) -> Bytes {
        let choice = match self.api {
            Api::Chat => {
                json!({"index": 0, "delta": {}, "logprobs": null, "finish_reason": finish.name()})
            }
            Api::Completions => {
                json!({"index": 0, "text": "", "logprobs": null, "finish_reason": finish.name()})
            }
        };
        let mut b = Vec::new();
        if self.include_usage {
            b.extend_from_slice(&self.chunk(json!([choice]), None));
            b.extend_from_slice(&self.chunk(json!([]), Some(usage(p, c))));
        } else {
            b.extend_from_slice(&self.chunk(json!([choice]), Some(usage(p, c))));
        }
        b.extend_from_slice(sse::DONE);
        Bytes::from(b)
    }
}

/// The SSE body: frames made from the model's events as they come.
struct Sse {
    rx: UnboundedReceiver<Event>,
    meta: Meta,
    sent: u64,
    pending: VecDeque<Bytes>,
    finished: bool,
}

impl Sse {
    fn push(&mut self, e: Event) {
        match e {
            Event::Tokens { n, .. } => {
                let mut b = Vec::new();
                for k in self.sent..self.sent + n {
                    b.extend_from_slice(&self.meta.token_chunk(k));
                }
                self.sent += n;
                self.pending.push_back(Bytes::from(b));
            }
            Event::Done {
                prompt_tokens,
                completion_tokens,
                finish,
                ..
            } => {
                self.pending.push_back(self.meta.end_chunks(
                    prompt_tokens,
                    completion_tokens,
                    finish,
                ));
                self.finished = true;
            }
            Event::Failed { .. } => {
                // cannot happen after the first token; end the stream with an error event
                self.pending.push_back(sse::event(
                    r#"{"error":{"message":"the model failed mid-stream","type":"server_error"}}"#,
                ));
                self.finished = true;
            }
        }
    }
}

impl Body for Sse {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        loop {
            if let Some(b) = self.pending.pop_front() {
                return Poll::Ready(Some(Ok(Frame::data(b))));
            }
            if self.finished {
                return Poll::Ready(None);
            }
            match self.rx.poll_recv(cx) {
                Poll::Ready(Some(e)) => self.push(e),
                Poll::Ready(None) => return Poll::Ready(Some(Err("the model stopped".into()))),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

/// A refusal in the shape the profile gives; retry hints in real time
/// (model duration / time scale), rounded up to the shape's unit.
fn failed(f: &Failure, meta: &Meta, clock: &Clock) -> Response<RespBody> {
    let (limit, hint, body) = match f {
        Failure::ServerError => return server_error(),
        Failure::RateLimited { limit, hint, body } => (limit, hint, body),
    };
    // the hint in real nanoseconds, rounded up to `unit` nanoseconds
    let real = |d: Nanos, unit: u128| clock.real(d).as_nanos().div_ceil(unit);
    let parsed: Option<Map<String, Value>> = body
        .as_deref()
        .and_then(|b| serde_json::from_str::<Value>(b).ok())
        .and_then(|v| match v {
            Value::Object(m) => Some(m),
            _ => None,
        });
    let mut v = match (parsed, hint) {
        (Some(m), _) => Value::Object(m),
        (None, RetryHint::BodyRetryAfter(_)) => json!({
            "error_code": "REQUEST_LIMIT_EXCEEDED",
            "message": format!("REQUEST_LIMIT_EXCEEDED: Exceeded {limit} rate limit for {}.", meta.model),
            "limit_type": limit,
        }),
        (None, _) => json!({"error": {
            "message": format!("Rate limit reached for {} on {limit}. Please try again later.", meta.model),
            "type": "requests", "param": null, "code": "rate_limit_exceeded"}}),
    };
    if let (RetryHint::BodyRetryAfter(d), Value::Object(m)) = (hint, &mut v) {
        // seconds with millisecond precision, rounded up
        let ms = real(*d, 1_000_000);
        m.insert("retry_after".into(), json!(ms as f64 / 1e3));
    }
    let mut r = json_response(StatusCode::TOO_MANY_REQUESTS, &v);
    let mut set = |k: &'static str, val: String| {
        if let Ok(val) = HeaderValue::from_str(&val) {
            r.headers_mut().insert(HeaderName::from_static(k), val);
        }
    };
    match hint {
        RetryHint::RetryAfter(d) => set("retry-after", real(*d, 1_000_000_000).to_string()),
        RetryHint::RetryAfterMs(d) => set("retry-after-ms", real(*d, 1_000_000).to_string()),
        RetryHint::None | RetryHint::BodyRetryAfter(_) => {}
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes() {
        assert!(matches!(
            route("/v1/chat/completions"),
            Some(Route::Generate(Some(Api::Chat), None))
        ));
        assert!(matches!(
            route("/serving-endpoints/x/invocations"),
            Some(Route::Generate(None, Some(ref n))) if n == "x"
        ));
        assert!(route("/serving-endpoints/a/b/invocations").is_none());
        assert!(route("/v2/chat").is_none());
    }

    #[test]
    fn parse_validates_and_estimates() {
        let ok = parse(
            &json!({"model": "m", "messages": [{"role": "user", "content": "12345678"}], "max_tokens": 5}),
            Some(Api::Chat),
            None,
        )
        .unwrap();
        assert_eq!(ok.req.input_tokens, 2 + 4);
        assert_eq!(ok.req.max_tokens, Some(5));
        let ids = parse(
            &json!({"model": "m", "prompt": [1, 2, 3, 4, 5, 6, 7]}),
            Some(Api::Completions),
            None,
        )
        .unwrap();
        assert_eq!(ids.req.input_tokens, 7);
        assert_eq!(ids.req.max_tokens, None);
        let inv = parse(&json!({"prompt": "abcd"}), None, Some("ep".into())).unwrap();
        assert_eq!((inv.api, inv.model.as_str()), (Api::Completions, "ep"));
        for (b, code) in [
            (
                json!({"messages": [{"role": "user", "content": "x"}]}),
                "missing_required_parameter",
            ),
            (json!({"model": "m", "messages": []}), "invalid_value"),
            (
                json!({"model": "m", "messages": [{"content": "x"}]}),
                "invalid_value",
            ),
            (
                json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 0}),
                "invalid_value",
            ),
            (
                json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": -3}),
                "invalid_value",
            ),
            (
                json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": "yes"}),
                "invalid_type",
            ),
            (
                json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "n": 2}),
                "unsupported_value",
            ),
            (
                json!({"model": 3, "messages": [{"role": "user", "content": "x"}]}),
                "invalid_type",
            ),
        ] {
            assert_eq!(
                parse(&b, Some(Api::Chat), None).err().map(|e| e.0),
                Some(code),
                "{b}"
            );
        }
        assert_eq!(
            parse(
                &json!({"model": "m", "prompt": ["a", "b"]}),
                Some(Api::Completions),
                None
            )
            .err()
            .map(|e| e.0),
            Some("unsupported_value")
        );
        assert_eq!(
            parse(
                &json!({"model": "m", "prompt": 3}),
                Some(Api::Completions),
                None
            )
            .err()
            .map(|e| e.0),
            Some("invalid_type")
        );
    }

    #[test]
    fn same_prompt_same_hash() {
        let a =
            json!({"model": "a", "messages": [{"role": "user", "content": "x"}], "max_tokens": 3});
        let b =
            json!({"model": "b", "messages": [{"role": "user", "content": "x"}], "max_tokens": 9});
        let pa = parse(&a, Some(Api::Chat), None).unwrap();
        let pb = parse(&b, Some(Api::Chat), None).unwrap();
        assert_eq!(pa.req.prompt_hash, pb.req.prompt_hash);
    }
}
