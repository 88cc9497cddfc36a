//! The proxy: hyper server, routes, admission, forwarding.

use crate::body::{BoxError, Settle, Tracked};
use crate::metrics::{ConsumerLabel, Metrics, ReasonLabel, RejectLabel, RouteLabel, StatusLabel};
use crate::store::{FailMode, RedisState, StateBackend};
use crate::{estimate, LimitShape, ProxyConfig};
use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderMap, HeaderName, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use qsim_core::limiter::admission::{
    decide, Decision, Limit, Params, Request as LimRequest, State, Unit,
};
use qsim_core::time::{Nanos, NEVER};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tracing::Instrument;

type RespBody = UnsyncBoxBody<Bytes, BoxError>;

/// Where this process keeps the limiter state.
pub enum Store {
    /// Behind a mutex held only for the decision itself (no await inside).
    Local(Mutex<State>),
    /// In a Redis shared with other replicas (read, decide, compare-and-set).
    Redis(RedisState),
}

/// Shared by every request of one proxy process.
pub struct App {
    pub params: Arc<Params>,
    pub store: Store,
    /// The core's time at `start`: 0 in-process; with a shared state, the
    /// wall clock at start since [`SHARED_EPOCH_UNIX_S`], so replicas' times
    /// agree up to their clocks' skew (the core's effective time absorbs it).
    base: Nanos,
    pub metrics: Metrics,
    pub consumer_names: Vec<String>,
    start: Instant,
    cfg: ProxyConfig,
    keys: BTreeMap<String, usize>,
    client: Client<HttpConnector, Full<Bytes>>,
    next_id: AtomicU64,
}

impl App {
    /// Nanoseconds since the proxy started (monotonic): the core's `now`;
    /// with `time_scale` X ≠ 1, (base + real elapsed) × X (compressed time
    /// for tests: limiter refills, retry hints and leases run X times faster).
    pub fn now(&self) -> Nanos {
        let real = self.base as u128 + self.start.elapsed().as_nanos();
        let x = self.cfg.time_scale;
        let t = if x == 1.0 {
            real
        } else {
            (real as f64 * x) as u128
        };
        t.min(NEVER as u128 - 1) as Nanos
    }
    pub fn consumer_label(&self, c: usize) -> ConsumerLabel {
        ConsumerLabel {
            consumer: self.consumer_names[c].clone(),
        }
    }
}

/// 2025-01-01T00:00:00Z: the origin of the core's time when replicas share a
/// state (keeps times small: ~3.2e16 ns per year).
pub const SHARED_EPOCH_UNIX_S: u64 = 1_735_689_600;

/// A proxy whose limiter is compiled and configuration checked; `run` binds
/// and serves.
pub struct Proxy {
    cfg: ProxyConfig,
    params: Arc<Params>,
}

impl Proxy {
    /// Compile the limiter (errors are configuration errors: nothing is bound yet).
    pub fn new(cfg: ProxyConfig) -> Result<Proxy, String> {
        let mut p = Params::new(cfg.limiter.clone())?;
        if let Some(l) = cfg.lease {
            p = p.with_lease(l)?;
        }
        Ok(Proxy {
            cfg,
            params: Arc::new(p),
        })
    }

    /// Bind, print `qsim proxy: listening on http://ADDR` on stdout, and
    /// serve until SIGINT/SIGTERM (then finish in-flight requests, up to 30 s).
    pub fn run(self) -> Result<(), String> {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        if let Some(t) = self.cfg.threads {
            b.worker_threads(t.max(1));
        }
        let rt = b
            .enable_all()
            .build()
            .map_err(|e| format!("tokio runtime: {e}"))?;
        rt.block_on(self.serve())
    }

    async fn serve(self) -> Result<(), String> {
        let _ = tracing_subscriber::fmt()
            .with_writer(std::io::stderr)
            .with_max_level(tracing::Level::INFO)
            .with_target(false)
            .try_init();
        let listener = tokio::net::TcpListener::bind(self.cfg.listen)
            .await
            .map_err(|e| format!("cannot listen on {}: {e}", self.cfg.listen))?;
        let addr: SocketAddr = listener.local_addr().map_err(|e| e.to_string())?;
        let mut conn = HttpConnector::new();
        conn.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build(conn);
        let (store, base) = match &self.cfg.state {
            StateBackend::InProcess => (Store::Local(Mutex::new(State::new(&self.params, 0))), 0),
            StateBackend::Redis { addr, fail } => {
                let r = RedisState::new(addr.clone(), *fail, &self.params, self.cfg.lease);
                tracing::info!(%addr, key = %r.key, fail_mode = fail.name(), "limiter state shared in redis");
                let wall = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_err(|e| format!("system clock before 1970: {e}"))?
                    .as_nanos()
                    .saturating_sub(SHARED_EPOCH_UNIX_S as u128 * 1_000_000_000);
                (Store::Redis(r), wall as Nanos)
            }
        };
        let app = Arc::new(App {
            consumer_names: self
                .cfg
                .limiter
                .consumers
                .iter()
                .map(|c| c.name.clone())
                .collect(),
            keys: self.cfg.keys.iter().cloned().collect(),
            params: self.params,
            store,
            base,
            metrics: Metrics::new(),
            start: Instant::now(),
            cfg: self.cfg,
            client,
            next_id: AtomicU64::new(1),
        });
        println!("qsim proxy: listening on http://{addr}");
        tracing::info!(%addr, upstream = %app.cfg.upstream, consumers = app.consumer_names.len(), "listening");
        let graceful = hyper_util::server::graceful::GracefulShutdown::new();
        let mut shutdown = std::pin::pin!(shutdown_signal());
        loop {
            tokio::select! {
                r = listener.accept() => {
                    let (stream, _) = match r {
                        Ok(x) => x,
                        Err(e) => { tracing::warn!(error = %e, "accept"); continue; }
                    };
                    let _ = stream.set_nodelay(true);
                    let app = app.clone();
                    let svc = hyper::service::service_fn(move |req| {
                        let app = app.clone();
                        async move { Ok::<_, Infallible>(handle(app, req).await) }
                    });
                    let conn = hyper::server::conn::http1::Builder::new()
                        .timer(TokioTimer::new())
                        .serve_connection(TokioIo::new(stream), svc);
                    let conn = graceful.watch(conn);
                    tokio::spawn(async move { let _ = conn.await; });
                }
                _ = &mut shutdown => break,
            }
        }
        drop(listener);
        tracing::info!("shutting down: finishing in-flight requests");
        tokio::select! {
            _ = graceful.shutdown() => {}
            _ = tokio::time::sleep(Duration::from_secs(30)) => {
                tracing::warn!("in-flight requests still open after 30 s");
            }
        }
        Ok(())
    }
}

async fn shutdown_signal() {
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("SIGTERM handler");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

fn full(b: impl Into<Bytes>) -> RespBody {
    Full::new(b.into())
        .map_err(|never: Infallible| match never {})
        .boxed_unsync()
}

fn json_response(status: StatusCode, v: &Value) -> Response<RespBody> {
    let mut r = Response::new(full(v.to_string()));
    *r.status_mut() = status;
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

/// An OpenAI-style error body.
fn error(status: StatusCode, kind: &str, code: &str, message: &str) -> Response<RespBody> {
    json_response(
        status,
        &json!({"error": {"message": message, "type": kind, "param": null, "code": code}}),
    )
}

enum Route {
    Health,
    Metrics,
    Proxy(&'static str),
}

fn route(path: &str) -> Option<Route> {
    match path {
        "/healthz" => Some(Route::Health),
        "/metrics" => Some(Route::Metrics),
        "/v1/chat/completions" => Some(Route::Proxy("chat")),
        "/v1/completions" => Some(Route::Proxy("completions")),
        "/serving-endpoints/chat/completions" => Some(Route::Proxy("serving_chat")),
        p => {
            let rest = p.strip_prefix("/serving-endpoints/")?;
            let name = rest.strip_suffix("/invocations")?;
            (!name.is_empty() && !name.contains('/')).then_some(Route::Proxy("invocations"))
        }
    }
}

async fn handle(app: Arc<App>, req: Request<Incoming>) -> Response<RespBody> {
    let id = app.next_id.fetch_add(1, Ordering::Relaxed);
    let mut resp = match (route(req.uri().path()), req.method()) {
        (Some(Route::Health), &Method::GET) => Response::new(full("ok\n")),
        (Some(Route::Metrics), &Method::GET) => {
            let mut r = Response::new(full(app.metrics.encode()));
            r.headers_mut().insert(
                hyper::header::CONTENT_TYPE,
                HeaderValue::from_static(
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                ),
            );
            r
        }
        (Some(Route::Proxy(name)), &Method::POST) => {
            app.metrics
                .requests
                .get_or_create(&RouteLabel { route: name.into() })
                .inc();
            let span = tracing::info_span!("request", id, route = name);
            proxy(app.clone(), req, id).instrument(span).await
        }
        (Some(_), _) => error(
            StatusCode::METHOD_NOT_ALLOWED,
            "invalid_request_error",
            "method_not_allowed",
            "method not allowed on this route",
        ),
        (None, _) => error(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            "not_found",
            "unknown route",
        ),
    };
    if let Ok(v) = HeaderValue::from_str(&id.to_string()) {
        resp.headers_mut().insert("x-request-id", v);
    }
    resp
}

fn invalid(app: &App, status: StatusCode, reason: &str, message: &str) -> Response<RespBody> {
    app.metrics
        .invalid
        .get_or_create(&ReasonLabel {
            reason: reason.into(),
        })
        .inc();
    let kind = if status == StatusCode::UNAUTHORIZED {
        "authentication_error"
    } else {
        "invalid_request_error"
    };
    error(status, kind, reason, message)
}

/// The consumer of a request: its key in the configured header (or the
/// bearer token), or the default consumer, or `None` (401).
fn identify(app: &App, h: &HeaderMap) -> Option<usize> {
    let key = match &app.cfg.consumer_header {
        None => h
            .get(hyper::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .map(|v| v.strip_prefix("Bearer ").unwrap_or(v).trim()),
        Some(name) => h.get(name.as_str()).and_then(|v| v.to_str().ok()),
    };
    key.and_then(|k| app.keys.get(k).copied())
        .or(app.cfg.unknown_consumer)
}

const HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

async fn proxy(app: Arc<App>, req: Request<Incoming>, id: u64) -> Response<RespBody> {
    let arrived = Instant::now();
    let (parts, body) = req.into_parts();
    let Some(consumer) = identify(&app, &parts.headers) else {
        return invalid(
            &app,
            StatusCode::UNAUTHORIZED,
            "unknown_consumer",
            "missing or unknown consumer key",
        );
    };
    let max = app.cfg.max_body_bytes;
    let too_large = || {
        invalid(
            &app,
            StatusCode::PAYLOAD_TOO_LARGE,
            "body_too_large",
            &format!("request body over {max} bytes"),
        )
    };
    if let Some(len) = parts
        .headers
        .get(hyper::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
    {
        if len > max as u64 {
            return too_large();
        }
    }
    let bytes = match Limited::new(body, max).collect().await {
        Ok(c) => c.to_bytes(),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => return too_large(),
        Err(e) => {
            return invalid(
                &app,
                StatusCode::BAD_REQUEST,
                "body_read",
                &format!("cannot read the request body: {e}"),
            )
        }
    };
    let mut body: Value = match serde_json::from_slice(&bytes) {
        Ok(v @ Value::Object(_)) => v,
        Ok(_) => {
            return invalid(
                &app,
                StatusCode::BAD_REQUEST,
                "invalid_json",
                "the request body must be a JSON object",
            )
        }
        Err(e) => {
            return invalid(
                &app,
                StatusCode::BAD_REQUEST,
                "invalid_json",
                &format!("malformed JSON: {e}"),
            )
        }
    };
    let stated = body
        .get("max_tokens")
        .or_else(|| body.get("max_completion_tokens"));
    let max_tokens = match stated {
        None | Some(Value::Null) => app.cfg.default_max_tokens,
        Some(v) => match v.as_i64() {
            Some(n) if n > 0 => n as u64,
            _ => {
                return invalid(
                    &app,
                    StatusCode::BAD_REQUEST,
                    "invalid_max_tokens",
                    &format!("max_tokens must be a positive integer, got {v}"),
                )
            }
        },
    };
    let stream = body.get("stream").and_then(Value::as_bool) == Some(true);
    let input_tokens = estimate::input_tokens(&body);
    // ask the upstream for usage on streams when the client did not
    let mut forward = bytes;
    if stream {
        let has = body
            .pointer("/stream_options/include_usage")
            .and_then(Value::as_bool)
            == Some(true);
        if !has {
            let o = body.as_object_mut().expect("checked object");
            match o.get_mut("stream_options") {
                Some(Value::Object(so)) => {
                    so.insert("include_usage".into(), Value::Bool(true));
                }
                _ => {
                    o.insert("stream_options".into(), json!({"include_usage": true}));
                }
            }
            forward = Bytes::from(body.to_string());
        }
    }
    let lreq = LimRequest {
        consumer,
        input_tokens,
        max_tokens,
    };
    let mut early_guard = None;
    let (decision, now) = match &app.store {
        Store::Local(m) => {
            let now = app.now();
            let mut s = m.lock().unwrap_or_else(|e| e.into_inner());
            (Ok(decide(&app.params, &mut s, now, &lreq)), now)
        }
        Store::Redis(r) => {
            // in its own task: a client leaving must neither cancel a batch
            // being committed for other requests too, nor lose a grant (the
            // guard made in the task settles it when dropped)
            let a = app.clone();
            let task = tokio::spawn(async move {
                let r = match &a.store {
                    Store::Redis(r) => r.decide(&a.params, &|| a.now(), &lreq).await,
                    Store::Local(_) => Err("internal: not a shared state".to_string()),
                };
                r.map(|(d, now)| {
                    let g = match d {
                        Decision::Admit(g) => Some(Settle::new(a.clone(), Some(g), arrived)),
                        Decision::Deny { .. } => None,
                    };
                    (d, now, g)
                })
            });
            match task.await {
                Ok(Ok((d, now, g))) => {
                    early_guard = g;
                    (Ok(d), now)
                }
                Ok(Err(e)) => (Err((r.fail, e)), app.now()),
                Err(e) => (
                    Err((r.fail, format!("decision task failed: {e}"))),
                    app.now(),
                ),
            }
        }
    };
    let grant = match decision {
        Ok(Decision::Admit(g)) => Some(g),
        Err((FailMode::Open, e)) => {
            app.metrics
                .state_unavailable
                .get_or_create(&ReasonLabel {
                    reason: "fail_open".into(),
                })
                .inc();
            tracing::warn!(id, error = %e, "limiter state unavailable: forwarded unlimited (fail open)");
            None
        }
        Err((FailMode::Closed, e)) => {
            app.metrics
                .state_unavailable
                .get_or_create(&ReasonLabel {
                    reason: "fail_closed".into(),
                })
                .inc();
            tracing::warn!(id, error = %e, "limiter state unavailable: refused (fail closed)");
            let mut r = error(
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                "limiter_state_unavailable",
                "the shared limiter state is unreachable; retry shortly",
            );
            r.headers_mut()
                .insert("retry-after", HeaderValue::from_static("1"));
            return r;
        }
        Ok(Decision::Deny { limit, retry_at }) => {
            app.metrics
                .rejected
                .get_or_create(&RejectLabel {
                    consumer: app.consumer_names[consumer].clone(),
                    limit: limit.name().into(),
                })
                .inc();
            tracing::info!(id, consumer = %app.consumer_names[consumer], limit = limit.name(), "limited");
            return limited(&app, consumer, limit, retry_at, now, input_tokens);
        }
    };
    if grant.is_some() {
        app.metrics
            .admitted
            .get_or_create(&app.consumer_label(consumer))
            .inc();
    }
    let guard = match early_guard {
        Some(g) => g,
        None => Settle::new(app.clone(), grant, arrived),
    };

    let pq = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/");
    let mut up = Request::builder()
        .method(Method::POST)
        .uri(format!("{}{}", app.cfg.upstream, pq));
    let h = up.headers_mut().expect("fresh builder");
    for (k, v) in parts.headers.iter() {
        let n = k.as_str();
        if HOP.contains(&n)
            || n == "host"
            || n == "content-length"
            || n == "authorization"
            || n == "content-type"
            || app.cfg.consumer_header.as_deref() == Some(n)
        {
            continue;
        }
        h.append(k.clone(), v.clone());
    }
    if let Some(c) = &app.cfg.credential {
        if let Ok(mut v) = HeaderValue::from_str(&format!("Bearer {c}")) {
            v.set_sensitive(true);
            h.insert(hyper::header::AUTHORIZATION, v);
        }
    }
    // the body was parsed as JSON whatever the client called it
    h.insert(
        hyper::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    let up = match up.body(Full::new(forward)) {
        Ok(r) => r,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                "bad_request",
                &format!("cannot forward: {e}"),
            )
        }
    };
    let upstream_error = |reason: &str, status: StatusCode, msg: String| {
        app.metrics
            .upstream_errors
            .get_or_create(&ReasonLabel {
                reason: reason.into(),
            })
            .inc();
        tracing::warn!(id, reason, "upstream failed");
        error(status, "upstream_error", reason, &msg)
    };
    let resp = match tokio::time::timeout(app.cfg.upstream_timeout, app.client.request(up)).await {
        Err(_) => {
            return upstream_error(
                "upstream_timeout",
                StatusCode::GATEWAY_TIMEOUT,
                format!(
                    "the upstream did not answer within {:?}",
                    app.cfg.upstream_timeout
                ),
            )
        }
        Ok(Err(e)) => {
            return upstream_error(
                "upstream_unreachable",
                StatusCode::BAD_GATEWAY,
                format!("the upstream could not be reached: {e}"),
            )
        }
        Ok(Ok(r)) => r,
    };
    let status = resp.status();
    app.metrics
        .upstream_status
        .get_or_create(&StatusLabel {
            status: status.as_u16().to_string(),
        })
        .inc();
    let (mut rparts, rbody) = resp.into_parts();
    let sse = rparts
        .headers
        .get(hyper::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    for n in HOP {
        rparts.headers.remove(n);
    }
    let tracked = Tracked::new(
        rbody,
        guard,
        status.is_success(),
        sse,
        app.cfg.stream_idle_timeout,
    );
    Response::from_parts(rparts, tracked.boxed_unsync())
}

/// Milliseconds from `now` to `retry_at`, rounded up.
fn wait_ms(retry_at: Nanos, now: Nanos) -> u64 {
    retry_at.saturating_sub(now).div_ceil(1_000_000)
}

fn limited(
    app: &App,
    consumer: usize,
    limit: Limit,
    retry_at: Nanos,
    now: Nanos,
    input_tokens: u64,
) -> Response<RespBody> {
    let name = &app.consumer_names[consumer];
    if limit == Limit::MaxInputTokens {
        let m = app.cfg.limiter.consumers[consumer]
            .policy
            .max_input_tokens
            .unwrap_or(0);
        return error(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "max_input_tokens",
            &format!("{name}: the prompt (~{input_tokens} tokens) exceeds max_input_tokens = {m}"),
        );
    }
    match app.cfg.limit_shape {
        LimitShape::Fmapi => json_response(
            StatusCode::TOO_MANY_REQUESTS,
            &json!({"error_code": "REQUEST_LIMIT_EXCEEDED",
                    "message": format!("Exceeded {} limit for consumer {name}", limit.name())}),
        ),
        LimitShape::OpenAi => {
            let ms = wait_ms(retry_at, now);
            let msg = format!(
                "Rate limit reached for consumer {name} on {}: retry in {:.3} s",
                limit.name(),
                ms as f64 / 1e3
            );
            let mut r = error(
                StatusCode::TOO_MANY_REQUESTS,
                "requests",
                "rate_limit_exceeded",
                &msg,
            );
            let h = r.headers_mut();
            let mut set = |k: &'static str, v: String| {
                if let Ok(v) = HeaderValue::from_str(&v) {
                    h.insert(HeaderName::from_static(k), v);
                }
            };
            if retry_at != NEVER {
                set("retry-after", ms.div_ceil(1000).max(1).to_string());
                set("retry-after-ms", ms.to_string());
            }
            let pol = app.cfg.limiter.consumers[consumer].policy;
            let (kind, lim) = match limit {
                Limit::Rpm => ("requests", pol.rpm),
                Limit::TokensPerHour => ("tokens", pol.tokens_per_hour),
                Limit::Concurrent => ("requests", pol.concurrent.map(u64::from)),
                _ => match app.cfg.limiter.unit {
                    Unit::Rpm => ("requests", Some(app.cfg.limiter.capacity)),
                    Unit::Tpm => ("tokens", Some(app.cfg.limiter.capacity)),
                },
            };
            let (kl, kr, ks) = if kind == "requests" {
                (
                    "x-ratelimit-limit-requests",
                    "x-ratelimit-remaining-requests",
                    "x-ratelimit-reset-requests",
                )
            } else {
                (
                    "x-ratelimit-limit-tokens",
                    "x-ratelimit-remaining-tokens",
                    "x-ratelimit-reset-tokens",
                )
            };
            if let Some(l) = lim {
                set(kl, l.to_string());
            }
            set(kr, "0".into());
            if retry_at != NEVER {
                set(ks, format!("{ms}ms"));
            }
            r
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes() {
        assert!(matches!(
            route("/v1/chat/completions"),
            Some(Route::Proxy("chat"))
        ));
        assert!(matches!(
            route("/serving-endpoints/my-llm/invocations"),
            Some(Route::Proxy("invocations"))
        ));
        assert!(route("/serving-endpoints//invocations").is_none());
        assert!(route("/serving-endpoints/a/b/invocations").is_none());
        assert!(route("/v2/x").is_none());
    }

    #[test]
    fn wait_rounds_up() {
        assert_eq!(wait_ms(1_000_001, 0), 2);
        assert_eq!(wait_ms(5, 10), 0);
    }
}
