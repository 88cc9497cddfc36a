//! The proxy: hyper server, routes, admission, forwarding.
//!
//! The policy in force is a [`Gen`] (generation): the validated config and
//! the compiled limiter `Params`, swapped whole on SIGHUP (`reload.rs`). A
//! request keeps the generation it arrived under; its decision and
//! completion are taken on the state of the generation in force then (the
//! in-process state and its generation sit behind one mutex, so the two
//! always match; a consumer is found again by name after a reload).

use crate::body::{BoxError, Settle, Tracked};
use crate::clock::Clock;
use crate::metrics::{Metrics, ReasonLabel, RejectLabel, RouteLabel, StatusLabel};
use crate::reload::Reloader;
use crate::store::{FailMode, RedisState, StateBackend};
use crate::tls::Connector;
use crate::wait::Waits;
use crate::{estimate, LimitShape, OnLimit, ProxyConfig};
use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderMap, HeaderName, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
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
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant};
use tracing::Instrument;

type RespBody = UnsyncBoxBody<Bytes, BoxError>;

/// A lock that a panicking holder did not poison for good.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// One generation of the policy: what a reload replaces.
pub struct Gen {
    /// 1 at start, +1 per successful reload.
    pub id: u64,
    pub params: Arc<Params>,
    pub cfg: ProxyConfig,
    keys: BTreeMap<String, usize>,
    pub names: Vec<String>,
    /// The names as metric labels (cloned per request without allocating).
    pub labels: Vec<Arc<String>>,
}

impl Gen {
    pub fn new(id: u64, cfg: ProxyConfig, params: Arc<Params>) -> Gen {
        Gen {
            id,
            keys: cfg.keys.iter().cloned().collect(),
            names: cfg
                .limiter
                .consumers
                .iter()
                .map(|c| c.name.clone())
                .collect(),
            labels: cfg
                .limiter
                .consumers
                .iter()
                .map(|c| Arc::new(c.name.clone()))
                .collect(),
            params,
            cfg,
        }
    }
}

/// Compile a config's limiter (with its lease).
pub fn compile(cfg: &ProxyConfig) -> Result<Params, String> {
    let mut p = Params::new(cfg.limiter.clone())?;
    if let Some(l) = cfg.lease {
        p = p.with_lease(l)?;
    }
    Ok(p)
}

/// The in-process limiter state and the generation whose `Params` it fits.
pub struct Local {
    pub gen: Arc<Gen>,
    pub state: State,
}

/// Where this process keeps the limiter state.
pub enum Store {
    /// Behind a mutex held only for the decision itself (no await inside).
    Local(Mutex<Local>),
    /// In a Redis shared with other replicas (read, decide, compare-and-set).
    Redis(RedisState),
}

/// Shared by every request of one proxy process.
pub struct App {
    gen: RwLock<Arc<Gen>>,
    pub store: Store,
    /// The core's time: 0 at start in-process; with a shared state, the wall
    /// clock at start since [`SHARED_EPOCH_UNIX_S`], so replicas' times
    /// agree up to their clocks' skew (the core's effective time absorbs it).
    pub clock: Clock,
    pub metrics: Metrics,
    client: Client<Connector, Full<Bytes>>,
    next_id: AtomicU64,
    pub waits: Waits,
    /// Completions being written to the shared state (awaited at shutdown).
    pub pending_writes: AtomicUsize,
    pub reload: Option<Reloader>,
    /// The decision log (`[proxy] log`), written off the request path.
    pub log: Option<Arc<crate::record::DecisionLog>>,
    pub time_scale: f64,
    /// `--profile`: the shadow model's channel (drift.rs).
    pub drift: Option<crate::drift::Drift>,
}

impl App {
    pub fn consumer_label(&self, gen: &Gen, c: usize) -> crate::metrics::ConsumerLabel {
        crate::metrics::ConsumerLabel {
            consumer: gen.labels[c].clone(),
        }
    }
    /// The core's `now` (see [`Clock`]).
    pub fn now(&self) -> Nanos {
        self.clock.now()
    }
    /// The generation in force.
    pub fn current(&self) -> Arc<Gen> {
        self.gen.read().unwrap_or_else(|e| e.into_inner()).clone()
    }
    pub fn set_current(&self, g: Arc<Gen>) {
        *self.gen.write().unwrap_or_else(|e| e.into_inner()) = g;
    }
}

/// 2025-01-01T00:00:00Z: the origin of the core's time when replicas share a
/// state (keeps times small: ~3.2e16 ns per year).
pub const SHARED_EPOCH_UNIX_S: u64 = 1_735_689_600;

/// The result of one admission decision.
pub enum Outcome {
    /// Admitted (or forwarded unlimited, fail open: a guard without grant).
    Admit(Settle),
    Deny {
        limit: Limit,
        retry_at: Nanos,
        now: Nanos,
    },
    /// The shared state is unreachable.
    Unavailable(FailMode, String),
}

/// One decision by the core's `decide`, in-process or on the shared state.
/// `gen`/`req`: the request's generation and consumer index in it.
pub async fn decide_once(
    app: &Arc<App>,
    gen: &Arc<Gen>,
    req: LimRequest,
    arrived: Instant,
    id: u64,
) -> Outcome {
    match &app.store {
        Store::Local(m) => {
            let mut l = lock(m);
            let now = app.now();
            let Local { gen: cur, state } = &mut *l;
            let req = if cur.id == gen.id {
                req
            } else {
                // reloaded since the request arrived: its consumer by name
                let name = &gen.names[req.consumer];
                match cur.names.iter().position(|n| n == name) {
                    Some(c) => LimRequest { consumer: c, ..req },
                    None => {
                        return Outcome::Deny {
                            limit: Limit::Capacity,
                            retry_at: NEVER,
                            now,
                        }
                    }
                }
            };
            match decide(&cur.params, state, now, &req) {
                Decision::Admit(g) => {
                    let cur = cur.clone();
                    drop(l);
                    let mut s = Settle::new(app.clone(), cur, Some(g), arrived, id);
                    s.decided = now;
                    Outcome::Admit(s)
                }
                Decision::Deny { limit, retry_at } => Outcome::Deny {
                    limit,
                    retry_at,
                    now,
                },
            }
        }
        Store::Redis(r) => {
            // in its own task: a client leaving must neither cancel a batch
            // being committed for other requests too, nor lose a grant (the
            // guard made in the task settles it when dropped)
            let (a, g) = (app.clone(), gen.clone());
            let task = tokio::spawn(async move {
                let Store::Redis(r) = &a.store else {
                    return Err("internal: not a shared state".to_string());
                };
                let (d, now) = r.decide(&g.params, &|| a.now(), &req).await?;
                Ok(match d {
                    Decision::Admit(gr) => {
                        let mut s = Settle::new(a.clone(), g.clone(), Some(gr), arrived, id);
                        s.decided = now;
                        Outcome::Admit(s)
                    }
                    Decision::Deny { limit, retry_at } => Outcome::Deny {
                        limit,
                        retry_at,
                        now,
                    },
                })
            });
            match task.await {
                Ok(Ok(o)) => o,
                Ok(Err(e)) => Outcome::Unavailable(r.fail, e),
                Err(e) => Outcome::Unavailable(r.fail, format!("decision task failed: {e}")),
            }
        }
    }
}

/// A copy of the state in force, its generation and the time it is read at
/// (`None`: the shared state is unreachable).
pub async fn snapshot(app: &Arc<App>) -> Option<(Arc<Gen>, State, Nanos)> {
    match &app.store {
        Store::Local(m) => {
            let l = lock(m);
            Some((l.gen.clone(), l.state.clone(), app.now()))
        }
        Store::Redis(r) => {
            let g = app.current();
            let now = app.now();
            r.snapshot(&g.params, now).await.ok().map(|s| (g, s, now))
        }
    }
}

/// A proxy whose limiter is compiled and configuration checked; `run` binds
/// and serves.
pub struct Proxy {
    cfg: ProxyConfig,
    params: Arc<Params>,
    connector: Connector,
    reload: Option<Reloader>,
    encoder: Option<crate::record::Encoder>,
}

impl Proxy {
    /// Compile the limiter and the upstream's TLS settings (errors are
    /// configuration errors: nothing is bound yet).
    pub fn new(cfg: ProxyConfig) -> Result<Proxy, String> {
        let params = Arc::new(compile(&cfg)?);
        let connector = crate::tls::connector(
            cfg.upstream.starts_with("https://"),
            cfg.upstream_ca_file.as_deref(),
        )?;
        Ok(Proxy {
            cfg,
            params,
            connector,
            reload: None,
            encoder: None,
        })
    }

    /// On SIGHUP, call `f` for a new validated config (the file read again)
    /// and put it in force (see `reload.rs`).
    pub fn with_reload(mut self, f: Reloader) -> Proxy {
        self.reload = Some(f);
        self
    }

    /// Write the decision log as Parquet with this encoder (else JSON Lines).
    pub fn with_log_encoder(mut self, e: crate::record::Encoder) -> Proxy {
        self.encoder = Some(e);
        self
    }

    /// Bind, print `qsim proxy: listening on http://ADDR` on stdout, and
    /// serve until SIGINT/SIGTERM (then finish in-flight requests, up to the
    /// drain timeout).
    pub fn run(self) -> Result<(), String> {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        if let Some(t) = self.cfg.threads {
            b.worker_threads(t.max(1));
        }
        let rt = b
            .enable_all()
            .build()
            .map_err(|e| format!("tokio runtime: {e}"))?;
        let r = rt.block_on(self.serve());
        // connections still open after the drain timeout are dropped here
        // (their guards settle in-process state as they go)
        rt.shutdown_timeout(Duration::from_secs(1));
        r
    }

    async fn serve(self) -> Result<(), String> {
        let _ = tracing_subscriber::fmt()
            .with_writer(std::io::stderr)
            .with_max_level(log_level())
            .with_target(false)
            .try_init();
        let listener = tokio::net::TcpListener::bind(self.cfg.listen)
            .await
            .map_err(|e| format!("cannot listen on {}: {e}", self.cfg.listen))?;
        let addr: SocketAddr = listener.local_addr().map_err(|e| e.to_string())?;
        // Idle upstream connections are dropped after 4 s, before the
        // shortest keep-alive common servers use (uvicorn's 5 s): a pooled
        // connection the upstream has already closed failed a forwarded
        // request with a 502 (`SendRequest`) under bursty load.
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(4))
            .build(self.connector);
        let drain = self.cfg.drain_timeout;
        let gen = Arc::new(Gen::new(1, self.cfg, self.params));
        let (store, base) = match &gen.cfg.state {
            StateBackend::InProcess => (
                Store::Local(Mutex::new(Local {
                    gen: gen.clone(),
                    state: State::new(&gen.params, 0),
                })),
                0,
            ),
            StateBackend::Redis { addr, fail } => {
                let r = RedisState::new(addr.clone(), *fail, &gen.params, gen.cfg.lease);
                tracing::info!(%addr, key = %r.key, fail_mode = fail.name(), "limiter state shared in redis");
                let wall = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_err(|e| format!("system clock before 1970: {e}"))?
                    .as_nanos()
                    .saturating_sub(SHARED_EPOCH_UNIX_S as u128 * 1_000_000_000);
                (Store::Redis(r), wall as Nanos)
            }
        };
        let clock = Clock::new(base, gen.cfg.time_scale);
        let mut metrics = Metrics::new();
        let drift = match &gen.cfg.drift {
            Some(d) => Some(crate::drift::Drift::start(
                d.clone(),
                clock,
                &mut metrics.registry,
            )?),
            None => None,
        };
        let log = match &gen.cfg.log {
            None => None,
            Some(lc) => {
                let parquet = self.encoder.is_some();
                let l = crate::record::DecisionLog::start(lc.clone(), self.encoder)?;
                metrics.registry.register(
                    "log_records_dropped",
                    "Decision-log records dropped because the writer was behind",
                    l.dropped.clone(),
                );
                metrics.registry.register(
                    "log_records_written",
                    "Decision-log records written (Parquet: in finished files; JSON Lines: in the open file too)",
                    (*l.written).clone(),
                );
                tracing::info!(dir = %lc.dir.display(), parquet, "decision log on");
                Some(Arc::new(l))
            }
        };
        let app = Arc::new(App {
            gen: RwLock::new(gen.clone()),
            store,
            clock,
            metrics,
            log,
            time_scale: gen.cfg.time_scale,
            client,
            next_id: AtomicU64::new(1),
            waits: Waits::default(),
            pending_writes: AtomicUsize::new(0),
            reload: self.reload,
            drift,
        });
        app.metrics.generation.set(1);
        println!("qsim proxy: listening on http://{addr}");
        tracing::info!(%addr, upstream = %gen.cfg.upstream, consumers = gen.names.len(), "listening");
        drop(gen);
        tokio::spawn(crate::reload::on_sighup(app.clone()));
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
        // stop accepting: new connections are refused from here on
        drop(listener);
        let open = app.metrics.in_flight.get();
        tracing::info!(
            in_flight = open,
            drain_timeout_s = drain.as_secs_f64(),
            "shutting down: finishing in-flight requests"
        );
        let drained = tokio::time::timeout(drain, graceful.shutdown())
            .await
            .is_ok();
        // completions being written to the shared state
        let t = Instant::now();
        while app.pending_writes.load(Ordering::Acquire) > 0 && t.elapsed() < Duration::from_secs(2)
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        if let Some(l) = &app.log {
            l.close();
        }
        if drained {
            tracing::info!("drained: every in-flight request finished; exiting");
        } else {
            tracing::warn!(
                in_flight = app.metrics.in_flight.get(),
                "drain timeout: closing the requests still open (their reservations are released)"
            );
        }
        Ok(())
    }
}

/// The log level: `QSIM_LOG` (error, warn, info, debug, trace), default info.
fn log_level() -> tracing::Level {
    std::env::var("QSIM_LOG")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(tracing::Level::INFO)
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

fn json_response(status: StatusCode, body: Vec<u8>) -> Response<RespBody> {
    let mut r = Response::new(full(body));
    *r.status_mut() = status;
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

/// Append `s` as a JSON string.
fn json_str(b: &mut Vec<u8>, s: &str) {
    // writing into a Vec cannot fail
    let _ = serde_json::to_writer(&mut *b, s);
}

/// An OpenAI-style error body, `{"error":{"message","type","param","code"}}`
/// (written directly: building a `Value` and formatting it was a third of
/// the 429 path's instructions).
fn error(status: StatusCode, kind: &str, code: &str, message: &str) -> Response<RespBody> {
    let mut b = Vec::with_capacity(96 + message.len());
    b.extend_from_slice(b"{\"error\":{\"message\":");
    json_str(&mut b, message);
    b.extend_from_slice(b",\"type\":");
    json_str(&mut b, kind);
    b.extend_from_slice(b",\"param\":null,\"code\":");
    json_str(&mut b, code);
    b.extend_from_slice(b"}}");
    json_response(status, b)
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
                .get_or_create(&RouteLabel { route: name })
                .inc();
            // every event of a request names its `id` itself; the span (its
            // route too) only at debug: formatting a span per request at
            // info cost ~6 % of the 429 path's instructions
            let span = tracing::debug_span!("request", id, route = name);
            let mut rec = crate::record::Pending::new(&app, id);
            let r = proxy(app.clone(), req, id, &mut rec).instrument(span).await;
            rec.answered(r.status().as_u16());
            r
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
fn identify(gen: &Gen, h: &HeaderMap) -> Option<usize> {
    let key = match &gen.cfg.consumer_header {
        None => h
            .get(hyper::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .map(|v| v.strip_prefix("Bearer ").unwrap_or(v).trim()),
        Some(name) => h.get(name.as_str()).and_then(|v| v.to_str().ok()),
    };
    key.and_then(|k| gen.keys.get(k).copied())
        .or(gen.cfg.unknown_consumer)
}

/// The client's deadline, in seconds from now: the configured header, else
/// the OpenAI SDKs' `x-stainless-timeout` (Node) or
/// `x-stainless-read-timeout` (Python: its read timeout, i.e. how long it
/// waits for the first byte of the answer).
pub fn deadline(configured: Option<&str>, h: &HeaderMap) -> Option<Duration> {
    configured
        .into_iter()
        .chain(["x-stainless-timeout", "x-stainless-read-timeout"])
        .find_map(|n| {
            let s: f64 = h.get(n)?.to_str().ok()?.trim().parse().ok()?;
            (s.is_finite() && s >= 0.0).then(|| Duration::from_secs_f64(s.min(1e9)))
        })
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

async fn proxy(
    app: Arc<App>,
    req: Request<Incoming>,
    id: u64,
    rec: &mut crate::record::Pending,
) -> Response<RespBody> {
    let arrived = Instant::now();
    let gen = app.current();
    let (parts, body) = req.into_parts();
    let consumer = identify(&gen, &parts.headers);
    rec.set(|r| {
        r.generation = gen.id;
        r.consumer = consumer.map_or(String::new(), |c| gen.names[c].clone());
        r.retry_count = parts
            .headers
            .get("x-stainless-retry-count")
            .and_then(|v| v.to_str().ok()?.trim().parse().ok());
    });
    let Some(consumer) = consumer else {
        return invalid(
            &app,
            StatusCode::UNAUTHORIZED,
            "unknown_consumer",
            "missing or unknown consumer key",
        );
    };
    let max = gen.cfg.max_body_bytes;
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
        None | Some(Value::Null) => gen.cfg.default_max_tokens,
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
    rec.set(|r| {
        r.input_tokens = Some(input_tokens);
        r.max_tokens = Some(max_tokens);
        r.stream = stream;
    });
    let waits = matches!(gen.cfg.on_limit[consumer], OnLimit::Wait { .. });
    let deciding = waits.then(Instant::now);
    let outcome = match gen.cfg.on_limit[consumer] {
        OnLimit::Reject => decide_once(&app, &gen, lreq, arrived, id).await,
        OnLimit::Wait { max_wait } => {
            let d = deadline(gen.cfg.deadline_header.as_deref(), &parts.headers);
            crate::wait::admit(&app, &gen, lreq, arrived, id, max_wait, d).await
        }
    };
    // a consumer that waits: its time in the limiter is a wait, not the
    // proxy's own time (see the overhead histogram)
    let held = deciding.map_or(Duration::ZERO, |d| d.elapsed());
    let mut guard = match outcome {
        Outcome::Admit(mut g) => {
            if g.has_grant() {
                app.metrics
                    .admitted
                    .get_or_create(&app.consumer_label(&gen, consumer))
                    .inc();
            }
            let decided = g.decided;
            rec.set(|r| {
                r.decided_ns = Some(decided);
                let w = decided.saturating_sub(r.arrival_ns);
                // admitted after a wait: held at least a (virtual) millisecond
                r.decision = if waits && w >= 1_000_000 {
                    "waited"
                } else {
                    "admitted"
                }
                .into();
                r.wait_ns = (r.decision == "waited").then_some(w);
            });
            g.rec = rec.rec.take();
            g
        }
        Outcome::Unavailable(FailMode::Open, e) => {
            app.metrics
                .state_unavailable
                .get_or_create(&ReasonLabel {
                    reason: "fail_open".into(),
                })
                .inc();
            tracing::warn!(id, error = %e, "limiter state unavailable: forwarded unlimited (fail open)");
            let mut g = Settle::new(app.clone(), gen.clone(), None, arrived, id);
            rec.set(|r| r.decision = "forwarded_unlimited".into());
            g.rec = rec.rec.take();
            g
        }
        Outcome::Unavailable(FailMode::Closed, e) => {
            app.metrics
                .state_unavailable
                .get_or_create(&ReasonLabel {
                    reason: "fail_closed".into(),
                })
                .inc();
            tracing::warn!(id, error = %e, "limiter state unavailable: refused (fail closed)");
            rec.set(|r| r.decision = "unavailable".into());
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
        Outcome::Deny {
            limit,
            retry_at,
            now,
        } => {
            app.metrics
                .rejected
                .get_or_create(&RejectLabel {
                    consumer: gen.labels[consumer].clone(),
                    limit: limit.name(),
                })
                .inc();
            // debug: one line per 429 is most of the 429 path's cost at INFO
            // (the counts are in /metrics)
            tracing::debug!(id, consumer = %gen.names[consumer], limit = limit.name(),
                retry_in_ms = wait_ms(retry_at, now), "limited");
            rec.set(|r| {
                r.decided_ns = Some(now);
                r.limit = Some(limit.name().into());
                r.retry_after_ms = (retry_at != NEVER).then(|| wait_ms(retry_at, now));
                r.decision = match gen.cfg.on_limit[consumer] {
                    OnLimit::Reject => "limited",
                    OnLimit::Wait { max_wait } => {
                        // the bound wait.rs held it to: the deadline's or max_wait
                        let d = deadline(gen.cfg.deadline_header.as_deref(), &parts.headers);
                        match d {
                            Some(d) if d.saturating_sub(gen.cfg.deadline_margin) < max_wait => {
                                "refused_deadline"
                            }
                            _ => "refused_max_wait",
                        }
                    }
                }
                .into();
            });
            let r = limited(&gen, consumer, limit, retry_at, now, input_tokens);
            let own = arrived.elapsed().saturating_sub(held);
            app.metrics.overhead.observe(own.as_secs_f64());
            return r;
        }
    };

    let pq = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/");
    let mut up = Request::builder()
        .method(Method::POST)
        .uri(format!("{}{}", gen.cfg.upstream, pq));
    let h = up.headers_mut().expect("fresh builder");
    for (k, v) in parts.headers.iter() {
        let n = k.as_str();
        if HOP.contains(&n)
            || n == "host"
            || n == "content-length"
            || n == "authorization"
            || n == "content-type"
            || gen.cfg.consumer_header.as_deref() == Some(n)
        {
            continue;
        }
        h.append(k.clone(), v.clone());
    }
    if let Some(c) = &gen.cfg.credential {
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
        tracing::warn!(id, reason, error = %msg, "upstream failed");
        error(status, "upstream_error", reason, &msg)
    };
    let timeout = gen.cfg.upstream_timeout;
    if let Some(d) = &app.drift {
        let req = crate::serve::GenRequest {
            input_tokens,
            max_tokens: Some(max_tokens),
            prompt_hash: crate::serve::prompt_hash(&body),
            output_tokens: None,
        };
        guard.drift = Some(d.start_request(id, app.now(), req));
    }
    let mut failed = |reason: &'static str, status: StatusCode| {
        if let Some(r) = guard.rec.as_mut() {
            r.error = Some(reason.into());
            r.status = status.as_u16();
        }
    };
    // the proxy's own time before forwarding (a request held by on_limit =
    // wait counts from its admission)
    let own = arrived.elapsed().saturating_sub(held);
    app.metrics.overhead.observe(own.as_secs_f64());
    let resp = match tokio::time::timeout(timeout, app.client.request(up)).await {
        Err(_) => {
            failed("upstream_timeout", StatusCode::GATEWAY_TIMEOUT);
            return upstream_error(
                "upstream_timeout",
                StatusCode::GATEWAY_TIMEOUT,
                format!("the upstream did not answer within {timeout:?}"),
            );
        }
        Ok(Err(e)) => {
            let mut msg = format!("the upstream could not be reached: {e}");
            let mut src = std::error::Error::source(&e);
            while let Some(s) = src {
                msg.push_str(&format!(": {s}"));
                src = s.source();
            }
            failed("upstream_unreachable", StatusCode::BAD_GATEWAY);
            return upstream_error("upstream_unreachable", StatusCode::BAD_GATEWAY, msg);
        }
        Ok(Ok(r)) => r,
    };
    let status = resp.status();
    if let Some(r) = guard.rec.as_mut() {
        r.status = status.as_u16();
        r.upstream_status = Some(status.as_u16());
    }
    if let Some(t) = &mut guard.drift {
        t.status = status.as_u16();
    }
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
        gen.cfg.stream_idle_timeout,
    );
    Response::from_parts(rparts, tracked.boxed_unsync())
}

/// Milliseconds from `now` to `retry_at`, rounded up.
pub fn wait_ms(retry_at: Nanos, now: Nanos) -> u64 {
    retry_at.saturating_sub(now).div_ceil(1_000_000)
}

pub fn limited(
    gen: &Gen,
    consumer: usize,
    limit: Limit,
    retry_at: Nanos,
    now: Nanos,
    input_tokens: u64,
) -> Response<RespBody> {
    let name = &gen.names[consumer];
    if limit == Limit::MaxInputTokens {
        let m = gen.cfg.limiter.consumers[consumer]
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
    match gen.cfg.limit_shape {
        LimitShape::Fmapi => {
            let mut b = Vec::with_capacity(128);
            b.extend_from_slice(b"{\"error_code\":\"REQUEST_LIMIT_EXCEEDED\",\"message\":");
            json_str(
                &mut b,
                &format!("Exceeded {} limit for consumer {name}", limit.name()),
            );
            b.push(b'}');
            json_response(StatusCode::TOO_MANY_REQUESTS, b)
        }
        LimitShape::OpenAi => {
            let ms = wait_ms(retry_at, now);
            let msg = format!(
                "Rate limit reached for consumer {name} on {}: retry in {}.{:03} s",
                limit.name(),
                ms / 1000,
                ms % 1000
            );
            let mut r = error(
                StatusCode::TOO_MANY_REQUESTS,
                "requests",
                "rate_limit_exceeded",
                &msg,
            );
            let h = r.headers_mut();
            if retry_at != NEVER {
                h.insert(
                    HeaderName::from_static("retry-after"),
                    HeaderValue::from(ms.div_ceil(1000).max(1)),
                );
                h.insert(
                    HeaderName::from_static("retry-after-ms"),
                    HeaderValue::from(ms),
                );
            }
            let pol = gen.cfg.limiter.consumers[consumer].policy;
            let (kind, lim) = match limit {
                Limit::Rpm => ("requests", pol.rpm),
                Limit::TokensPerHour => ("tokens", pol.tokens_per_hour),
                Limit::Concurrent => ("requests", pol.concurrent.map(u64::from)),
                _ => match gen.cfg.limiter.unit {
                    Unit::Rpm => ("requests", Some(gen.cfg.limiter.capacity)),
                    Unit::Tpm => ("tokens", Some(gen.cfg.limiter.capacity)),
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
                h.insert(HeaderName::from_static(kl), HeaderValue::from(l));
            }
            h.insert(HeaderName::from_static(kr), HeaderValue::from_static("0"));
            if retry_at != NEVER {
                if let Ok(v) = HeaderValue::from_str(&format!("{ms}ms")) {
                    h.insert(HeaderName::from_static(ks), v);
                }
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

    #[test]
    fn deadline_from_the_configured_header_then_the_sdks() {
        let mut h = HeaderMap::new();
        assert_eq!(deadline(None, &h), None);
        h.insert(
            "x-stainless-read-timeout",
            HeaderValue::from_static("600.0"),
        );
        assert_eq!(deadline(None, &h), Some(Duration::from_secs(600)));
        h.insert("x-stainless-timeout", HeaderValue::from_static("2.5"));
        assert_eq!(deadline(None, &h), Some(Duration::from_millis(2500)));
        h.insert("x-deadline", HeaderValue::from_static("0.25"));
        assert_eq!(
            deadline(Some("x-deadline"), &h),
            Some(Duration::from_millis(250))
        );
        // unreadable values are skipped
        h.insert("x-deadline", HeaderValue::from_static("soon"));
        assert_eq!(
            deadline(Some("x-deadline"), &h),
            Some(Duration::from_millis(2500))
        );
        h.insert("x-stainless-timeout", HeaderValue::from_static("-1"));
        assert_eq!(deadline(None, &h), Some(Duration::from_secs(600)));
    }
}
