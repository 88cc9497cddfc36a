//! The proxy's routes and its request handler: identify the consumer, read
//! and check the body, decide (at once, or held by `wait.rs`), forward
//! upstream, and hand the answer back wrapped in the settlement
//! (`body.rs`).

use crate::admit::{decide_once, Outcome};
use crate::app::{App, Gen};
use crate::body::{Settle, Tracked};
use crate::config::OnLimit;
use crate::estimate;
use crate::http::{self, error, RespBody};
use crate::metrics::{PhaseLabel, ReasonLabel, RejectLabel, RouteLabel, StatusLabel};
use crate::record::Pending;
use crate::respond::{limited, wait_ms};
use crate::store::FailMode;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderMap, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use qsim_core::limiter::admission::Request as LimRequest;
use qsim_core::model::GenRequest;
use qsim_core::time::NEVER;
use qsim_core::units::Units;
use serde_json::{json, Value};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::Instrument;

enum Route {
    Health,
    Metrics,
    Proxy(&'static str),
    /// Dot segments or encoded slashes (see [`http::unsafe_path`]): 400.
    Unsafe,
}

fn route(path: &str) -> Option<Route> {
    match path {
        p if http::unsafe_path(p) => Some(Route::Unsafe),
        "/healthz" => Some(Route::Health),
        "/metrics" => Some(Route::Metrics),
        "/v1/chat/completions" => Some(Route::Proxy("chat")),
        "/v1/completions" => Some(Route::Proxy("completions")),
        "/serving-endpoints/chat/completions" => Some(Route::Proxy("serving_chat")),
        p => http::invocations(p).map(|_| Route::Proxy("invocations")),
    }
}

/// Answer one request.
pub async fn handle(app: Arc<App>, req: Request<Incoming>) -> Response<RespBody> {
    let id = app.next_id.fetch_add(1, Ordering::Relaxed);
    let resp = match (route(req.uri().path()), req.method()) {
        (Some(Route::Health), &Method::GET) => Response::new(http::full("ok\n")),
        (Some(Route::Metrics), &Method::GET) => {
            let mut r = Response::new(http::full(app.metrics.encode()));
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
            let mut rec = Pending::new(app.log.as_ref(), &app.clock, id);
            let r = proxy(app.clone(), req, id, &mut rec).instrument(span).await;
            rec.answered(r.status().as_u16());
            r
        }
        (Some(Route::Unsafe), _) => invalid(
            &app,
            StatusCode::BAD_REQUEST,
            "invalid_path",
            "the path has a dot segment or an encoded slash, backslash or percent sign",
        ),
        (Some(_), _) => http::method_not_allowed(),
        (None, _) => http::not_found(),
    };
    http::with_request_id(resp, id)
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
            .map(bearer_token),
        Some(name) => h.get(name.as_str()).and_then(|v| v.to_str().ok()),
    };
    key.and_then(|k| gen.keys.get(k).copied())
        .or(gen.cfg.unknown_consumer)
}

/// The token of an `Authorization` value: after the scheme `Bearer`, in
/// any case (RFC 7235: the scheme is case-insensitive) and followed by
/// spaces; a value without that scheme is the key itself.
fn bearer_token(v: &str) -> &str {
    let v = v.trim();
    match v.get(..7) {
        Some(s) if s.eq_ignore_ascii_case("bearer ") => v[7..].trim(),
        _ => v,
    }
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
    rec: &mut Pending,
) -> Response<RespBody> {
    let arrived = Instant::now();
    let gen = app.current();
    let (parts, body) = req.into_parts();
    let asked = match read(&app, &gen, &parts, body, rec).await {
        Ok(a) => a,
        Err(r) => return r,
    };
    let (guard, held) = match admission(&app, &gen, &parts.headers, &asked, arrived, id, rec).await
    {
        Ok(x) => x,
        Err(r) => return r,
    };
    forward(&app, &gen, &parts, asked, guard, arrived, held, id).await
}

/// A request read and checked: who asks, and for what.
struct Asked {
    consumer: usize,
    /// The body as parsed (the drift shadow hashes its prompt).
    body: Value,
    /// The body as forwarded (`stream_options.include_usage` added to a
    /// stream that did not ask for it).
    forward: Bytes,
    max_tokens: u64,
    input_tokens: u64,
    stream: bool,
}

/// Identify the consumer and read the body (401, 413, 400 otherwise).
async fn read(
    app: &App,
    gen: &Gen,
    parts: &hyper::http::request::Parts,
    body: Incoming,
    rec: &mut Pending,
) -> Result<Asked, Response<RespBody>> {
    let consumer = identify(gen, &parts.headers);
    rec.set(|r| {
        r.generation = gen.id;
        r.consumer = consumer.map_or(String::new(), |c| gen.names[c].clone());
        r.retry_count = parts
            .headers
            .get("x-stainless-retry-count")
            .and_then(|v| v.to_str().ok()?.trim().parse().ok());
    });
    let Some(consumer) = consumer else {
        return Err(invalid(
            app,
            StatusCode::UNAUTHORIZED,
            "unknown_consumer",
            "missing or unknown consumer key",
        ));
    };
    let max = gen.cfg.max_body_bytes;
    let too_large = || {
        invalid(
            app,
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
            return Err(too_large());
        }
    }
    let limit = gen.cfg.body_read_timeout;
    let bytes = match tokio::time::timeout(limit, Limited::new(body, max).collect()).await {
        Err(_) => return Err(body_timeout(app, limit)),
        Ok(r) => r,
    };
    let bytes = match bytes {
        Ok(c) => c.to_bytes(),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => return Err(too_large()),
        Err(e) => {
            return Err(invalid(
                app,
                StatusCode::BAD_REQUEST,
                "body_read",
                &format!("cannot read the request body: {e}"),
            ))
        }
    };
    let mut body: Value = match serde_json::from_slice(&bytes) {
        Ok(v @ Value::Object(_)) => v,
        Ok(_) => {
            return Err(invalid(
                app,
                StatusCode::BAD_REQUEST,
                "invalid_json",
                "the request body must be a JSON object",
            ))
        }
        Err(e) => {
            return Err(invalid(
                app,
                StatusCode::BAD_REQUEST,
                "invalid_json",
                &format!("malformed JSON: {e}"),
            ))
        }
    };
    let max_tokens = match output_bound(&body, gen.cfg.default_max_tokens) {
        Ok(n) => n,
        Err((field, e)) => {
            // the code names the field: invalid_max_tokens, invalid_n, …
            let code = match field {
                "n" => "invalid_n",
                "best_of" => "invalid_best_of",
                "max_completion_tokens" => "invalid_max_completion_tokens",
                "max_output_tokens" => "invalid_max_output_tokens",
                _ => "invalid_max_tokens",
            };
            return Err(invalid(app, StatusCode::BAD_REQUEST, code, &e));
        }
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
    Ok(Asked {
        consumer,
        body,
        forward,
        max_tokens,
        input_tokens,
        stream,
    })
}

/// The fields that cap a request's output tokens (OpenAI chat and
/// completions, the Responses API, Databricks serving endpoints): the
/// upstream may honour any of them, so the largest one stated is the bound.
const OUTPUT_CAPS: [&str; 3] = ["max_tokens", "max_completion_tokens", "max_output_tokens"];
/// The fields that multiply it (choices returned, candidates generated).
const OUTPUT_MULTIPLIERS: [&str; 2] = ["n", "best_of"];

/// The most output tokens a request body allows the upstream to produce,
/// which the limiter reserves: the largest stated cap (a `null` one is not
/// stated; none stated: `default`) times the largest multiplier, in
/// saturating [`Units`] (a product past `u64::MAX` is `u64::MAX`, which no
/// limit holds). A field that is not a positive integer is an error: the
/// field's name and the message.
pub fn output_bound(body: &Value, default: u64) -> Result<u64, (&'static str, String)> {
    let field = |f: &'static str| -> Result<Option<u64>, (&'static str, String)> {
        match body.get(f) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => match v.as_u64() {
                Some(n) if n > 0 => Ok(Some(n)),
                _ => Err((f, format!("{f} must be a positive integer, got {v}"))),
            },
        }
    };
    let mut cap = None;
    for f in OUTPUT_CAPS {
        cap = cap.max(field(f)?);
    }
    let mut mult = 1;
    for f in OUTPUT_MULTIPLIERS {
        mult = mult.max(field(f)?.unwrap_or(1));
    }
    Ok((Units(cap.unwrap_or(default)) * mult).get())
}

/// 408 for a body not read within `body_read_timeout` (hyper then closes
/// the connection: the rest of the body is never read).
fn body_timeout(app: &App, limit: Duration) -> Response<RespBody> {
    app.metrics
        .read_timeouts
        .get_or_create(&PhaseLabel { phase: "body" })
        .inc();
    let mut r = invalid(
        app,
        StatusCode::REQUEST_TIMEOUT,
        "body_timeout",
        &format!("the request body did not arrive within {limit:?}"),
    );
    r.headers_mut()
        .insert(hyper::header::CONNECTION, HeaderValue::from_static("close"));
    r
}

/// The admission decision (at once, or held by `wait.rs`): the admitted
/// request's settlement guard and how long it was held, or the answer (a
/// 429, a 400, a 503 when the shared state is down and fails closed).
async fn admission(
    app: &Arc<App>,
    gen: &Arc<Gen>,
    headers: &HeaderMap,
    asked: &Asked,
    arrived: Instant,
    id: u64,
    rec: &mut Pending,
) -> Result<(Settle, Duration), Response<RespBody>> {
    let Asked {
        consumer,
        input_tokens,
        max_tokens,
        stream,
        ..
    } = *asked;
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
        OnLimit::Reject => decide_once(app, gen, lreq, arrived, id).await,
        OnLimit::Wait { max_wait } => {
            let d = deadline(gen.cfg.deadline_header.as_deref(), headers);
            crate::wait::admit(app, gen, lreq, arrived, id, max_wait, d).await
        }
    };
    // a consumer that waits: its time in the limiter is a wait, not the
    // proxy's own time (see the overhead histogram)
    let held = deciding.map_or(Duration::ZERO, |d| d.elapsed());
    let unavailable = |reason: &str| {
        app.metrics
            .state_unavailable
            .get_or_create(&ReasonLabel {
                reason: reason.into(),
            })
            .inc()
    };
    let guard = match outcome {
        Outcome::Admit(mut g) => {
            if g.has_grant() {
                app.metrics
                    .admitted
                    .get_or_create(&app.consumer_label(gen, consumer))
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
            unavailable("fail_open");
            // debug: the outage is logged once per transition (store.rs)
            tracing::debug!(id, error = %e, "limiter state unavailable: forwarded unlimited (fail open)");
            let mut g = Settle::new(app.clone(), gen.clone(), None, arrived, id);
            rec.set(|r| r.decision = "forwarded_unlimited".into());
            g.rec = rec.rec.take();
            g
        }
        Outcome::Unavailable(FailMode::Closed, e) => {
            unavailable("fail_closed");
            tracing::debug!(id, error = %e, "limiter state unavailable: refused (fail closed)");
            rec.set(|r| r.decision = "unavailable".into());
            let mut r = error(
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                "limiter_state_unavailable",
                "the shared limiter state is unreachable; retry shortly",
            );
            r.headers_mut()
                .insert("retry-after", HeaderValue::from_static("1"));
            return Err(r);
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
                        let d = deadline(gen.cfg.deadline_header.as_deref(), headers);
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
            let r = limited(gen, &lreq, limit, retry_at, now);
            let own = arrived.elapsed().saturating_sub(held);
            app.metrics.overhead.observe(own.as_secs_f64());
            return Err(r);
        }
    };

    Ok((guard, held))
}

/// Send an admitted request upstream; its answer, wrapped in the guard.
#[allow(clippy::too_many_arguments)]
async fn forward(
    app: &Arc<App>,
    gen: &Gen,
    parts: &hyper::http::request::Parts,
    asked: Asked,
    mut guard: Settle,
    arrived: Instant,
    held: Duration,
    id: u64,
) -> Response<RespBody> {
    let Asked {
        body,
        forward,
        max_tokens,
        input_tokens,
        ..
    } = asked;
    let pq = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/");
    let mut up = Request::builder()
        .method(Method::POST)
        .uri(http::upstream_url(&gen.cfg.upstream, pq));
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
        let req = GenRequest {
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
    // a pooled connection the upstream had closed: sent again (`http::send`)
    let resp = match tokio::time::timeout(timeout, http::send(&app.client, up)).await {
        Err(_) => {
            failed("upstream_timeout", StatusCode::GATEWAY_TIMEOUT);
            return upstream_error(
                "upstream_timeout",
                StatusCode::GATEWAY_TIMEOUT,
                format!("the upstream did not answer within {timeout:?}"),
            );
        }
        Ok((Err(e), _)) => {
            let msg = format!("the upstream could not be reached: {}", http::chain(&e));
            failed("upstream_unreachable", StatusCode::BAD_GATEWAY);
            return upstream_error("upstream_unreachable", StatusCode::BAD_GATEWAY, msg);
        }
        Ok((Ok(r), _)) => r,
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
    let sse = http::is_event_stream(&rparts.headers);
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

    /// Issue 41, case 10: `Authorization: bearer KEY` (lowercase scheme,
    /// which RFC 7235 allows) got a 401.
    #[test]
    fn the_bearer_scheme_is_case_insensitive() {
        for v in ["Bearer k1", "bearer k1", "BEARER   k1 ", "k1", " BeArEr k1"] {
            assert_eq!(bearer_token(v), "k1", "{v:?}");
        }
        assert_eq!(bearer_token("Bearerk1"), "Bearerk1");
    }

    /// Issue 26 (2): `{"max_tokens": 1, "max_completion_tokens": 90000}`
    /// reserved 1 token; `"max_tokens": null` fell back to the default even
    /// with `max_completion_tokens` set; `n` was ignored.
    #[test]
    fn the_largest_output_cap_times_the_choices_is_reserved() {
        let b = |v: Value| output_bound(&v, 256);
        assert_eq!(
            b(json!({"max_tokens": 1, "max_completion_tokens": 90000})),
            Ok(90000)
        );
        assert_eq!(
            b(json!({"max_tokens": null, "max_completion_tokens": 700})),
            Ok(700)
        );
        assert_eq!(b(json!({"max_output_tokens": 50})), Ok(50));
        assert_eq!(b(json!({})), Ok(256));
        assert_eq!(b(json!({"n": 4})), Ok(1024));
        assert_eq!(b(json!({"max_tokens": 10, "n": 3, "best_of": 5})), Ok(50));
        assert_eq!(b(json!({"max_tokens": u64::MAX, "n": 2})), Ok(u64::MAX));
        for (bad, field) in [
            (json!({"max_completion_tokens": 0}), "max_completion_tokens"),
            (json!({"max_tokens": "9"}), "max_tokens"),
            (json!({"n": -1}), "n"),
            (json!({"best_of": 0}), "best_of"),
            (json!({"max_tokens": 1.5}), "max_tokens"),
        ] {
            let (f, e) = b(bad.clone()).unwrap_err();
            assert_eq!(f, field, "{bad}");
            assert!(e.contains("must be a positive integer"), "{bad}: {e}");
        }
    }
}
