//! HTTP plumbing shared by every driver here: the server side (response
//! bodies, the OpenAI-style error answer, the accept loop with graceful
//! shutdown on SIGINT/SIGTERM), the client side (the one client builder,
//! with its TLS connector), and the reading of an answer's retry hint.
//!
//! **The client.** One builder ([`client`]) for the proxy's upstream,
//! `qsim load`, `qsim replay` and `qsim calibrate server`'s benchmark: TCP
//! without Nagle, a 10 s connect timeout, idle pooled connections dropped
//! after 4 s, and TLS for `https://` bases — rustls on ring through
//! hyper-rustls, trusting the system's root certificates plus, optionally,
//! the CA certificates of a PEM file (a private CA); the same connector
//! also speaks plain http. Every driver sends through [`send`], which sends
//! a request again when its pooled connection turns out closed before any
//! answer.

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{HeaderMap, HeaderValue};
use hyper::{Request, Response, StatusCode};
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use qsim_core::time::{Nanos, NEVER};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use serde_json::Value;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Every response body the servers here send.
pub type RespBody = UnsyncBoxBody<Bytes, BoxError>;

/// A whole body.
pub fn full(b: impl Into<Bytes>) -> RespBody {
    Full::new(b.into())
        .map_err(|never: Infallible| match never {})
        .boxed_unsync()
}

/// A JSON answer (`body` is JSON text).
pub fn json_response(status: StatusCode, body: impl Into<Bytes>) -> Response<RespBody> {
    let mut r = Response::new(full(body));
    *r.status_mut() = status;
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

/// Append `s` as a JSON string.
pub fn json_str(b: &mut Vec<u8>, s: &str) {
    // writing into a Vec cannot fail
    let _ = serde_json::to_writer(&mut *b, s);
}

/// An OpenAI-style error body, `{"error":{"message","type","param","code"}}`
/// (written directly: building a `Value` and formatting it was a third of
/// the proxy's 429 path's instructions).
pub fn error(status: StatusCode, kind: &str, code: &str, message: &str) -> Response<RespBody> {
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

/// 405 for a known route asked with another method.
pub fn method_not_allowed() -> Response<RespBody> {
    error(
        StatusCode::METHOD_NOT_ALLOWED,
        "invalid_request_error",
        "method_not_allowed",
        "method not allowed on this route",
    )
}

/// 404 for an unknown route.
pub fn not_found() -> Response<RespBody> {
    error(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        "not_found",
        "unknown route",
    )
}

/// The endpoint name of a Databricks serving-endpoints invocation path,
/// `/serving-endpoints/{name}/invocations` (a name without `/`).
pub fn invocations(path: &str) -> Option<&str> {
    let rest = path.strip_prefix("/serving-endpoints/")?;
    let name = rest.strip_suffix("/invocations")?;
    (!name.is_empty() && !name.contains('/')).then_some(name)
}

/// Whether a request path could name another path upstream than the one
/// routed here: a dot segment (`.`, `..`, also percent-encoded: `%2e`), an
/// encoded slash or backslash (`%2F`, `%5C`), a backslash, or an encoded
/// percent sign (`%25`: decoded twice by some servers). Such paths are
/// refused (400) before anything is forwarded with the proxy's credential.
pub fn unsafe_path(path: &str) -> bool {
    if path.contains('\\') {
        return true;
    }
    let lower = path.to_ascii_lowercase();
    if ["%2f", "%5c", "%25"].iter().any(|e| lower.contains(e)) {
        return true;
    }
    lower
        .split('/')
        .any(|seg| matches!(seg.replace("%2e", ".").as_str(), "." | ".."))
}

/// The upstream URL of a request: the base, then the request's path and
/// query. A base ending in `/serving-endpoints` (a Databricks workspace's
/// serving endpoints, as their docs write it) is not repeated for a path
/// that starts with it: `https://W/serving-endpoints` and `https://W` both
/// send `/serving-endpoints/chat/completions` to
/// `https://W/serving-endpoints/chat/completions`.
pub fn upstream_url(base: &str, path_and_query: &str) -> String {
    const SE: &str = "/serving-endpoints";
    let base = match base.strip_suffix(SE) {
        Some(b)
            if path_and_query
                .strip_prefix(SE)
                .is_some_and(|r| r.is_empty() || r.starts_with(['/', '?'])) =>
        {
            b
        }
        _ => base,
    };
    format!("{base}{path_and_query}")
}

/// A URL with its userinfo (`user:password@`) replaced by `***@`, for
/// printing.
pub fn redact_userinfo(url: &str) -> String {
    let (scheme, rest) = match url.split_once("://") {
        Some((s, r)) => (Some(s), r),
        None => (None, url),
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (auth, tail) = rest.split_at(end);
    let auth = match auth.rsplit_once('@') {
        Some((_, host)) => format!("***@{host}"),
        None => auth.to_string(),
    };
    match scheme {
        Some(s) => format!("{s}://{auth}{tail}"),
        None => format!("{auth}{tail}"),
    }
}

/// Tag an answer with its request id (`x-request-id`).
pub fn with_request_id(mut r: Response<RespBody>, id: u64) -> Response<RespBody> {
    if let Ok(v) = HeaderValue::from_str(&id.to_string()) {
        r.headers_mut().insert("x-request-id", v);
    }
    r
}

/// SIGINT or SIGTERM (SIGINT alone where there is no SIGTERM handler).
pub async fn shutdown_signal() {
    #[cfg(unix)]
    {
        let Ok(mut term) =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        else {
            let _ = tokio::signal::ctrl_c().await;
            return;
        };
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

/// How a server's connections are read: the request head's deadline
/// (`None`: hyper's default, 30 s) and what is told when a connection is
/// closed by it (`true`: part of a request head had arrived; `false`: the
/// connection was idle, nothing sent since its start or its last answer).
#[derive(Clone, Default)]
pub struct ConnLimits {
    pub header_read_timeout: Option<Duration>,
    pub on_header_timeout: Option<Arc<dyn Fn(bool) + Send + Sync>>,
}

/// Serve HTTP/1.1 connections with `handle` until SIGINT/SIGTERM; each
/// connection is watched by `graceful` (the caller drains it). `limits`:
/// read each new connection's [`ConnLimits`] (at accept).
pub async fn accept_until_shutdown<H, F, L>(
    listener: &tokio::net::TcpListener,
    graceful: &GracefulShutdown,
    limits: L,
    handle: H,
) where
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<RespBody>> + Send + 'static,
    L: Fn() -> ConnLimits,
{
    let mut shutdown = std::pin::pin!(shutdown_signal());
    let open = Arc::new(AtomicUsize::new(0));
    loop {
        tokio::select! {
            r = listener.accept() => {
                let (stream, _) = match r {
                    Ok(x) => x,
                    Err(e) => { tracing::warn!(error = %e, "accept"); continue; }
                };
                let _ = stream.set_nodelay(true);
                let handle = handle.clone();
                let svc = hyper::service::service_fn(move |req| {
                    let f = handle(req);
                    async move { Ok::<_, Infallible>(f.await) }
                });
                let lim = limits();
                let stream = Watched { io: stream, partial: Arc::new(AtomicBool::new(false)) };
                let partial = stream.partial.clone();
                let mut b = hyper::server::conn::http1::Builder::new();
                b.timer(TokioTimer::new());
                if let Some(t) = lim.header_read_timeout {
                    b.header_read_timeout(t);
                }
                let conn = b.serve_connection(TokioIo::new(stream), svc);
                let conn = graceful.watch(conn);
                open.fetch_add(1, Ordering::Relaxed);
                let open = open.clone();
                tokio::spawn(async move {
                    if let Err(e) = conn.await {
                        if e.is_timeout() {
                            if let Some(f) = &lim.on_header_timeout {
                                f(partial.load(Ordering::Relaxed));
                            }
                        }
                    }
                    if open.fetch_sub(1, Ordering::AcqRel) == 1 {
                        // the last connection closed: return freed memory
                        trim_heap();
                    }
                });
            }
            _ = &mut shutdown => break,
        }
    }
}

/// Give the allocator's free memory back to the system (glibc keeps the
/// heap of thousands of closed connections otherwise: RSS 12 MB idle,
/// 31 MB after 2,000 slow bodies were closed). Called when a server's
/// last open connection closes, so never under steady traffic.
fn trim_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free pages; it has no preconditions
    unsafe {
        libc::malloc_trim(0);
    }
}

/// A server connection that knows whether bytes arrived since it last
/// wrote (part of a request head, when the head's deadline closes it).
struct Watched {
    io: tokio::net::TcpStream,
    partial: Arc<AtomicBool>,
}

impl tokio::io::AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.io).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.partial.store(true, Ordering::Relaxed);
        }
        r
    }
}

impl tokio::io::AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.io).poll_write(cx, buf);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.partial.store(false, Ordering::Relaxed);
        }
        r
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.partial.store(false, Ordering::Relaxed);
        }
        r
    }
    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

pub type Connector = HttpsConnector<HttpConnector>;

/// The one HTTP client.
pub type HttpClient = Client<Connector, Full<Bytes>>;

/// Idle pooled connections are dropped after this, before the shortest
/// keep-alive common servers use (uvicorn's 5 s, vLLM's server): a pooled
/// connection the server had already closed failed a request (`SendRequest`)
/// under bursty load.
const POOL_IDLE: Duration = Duration::from_secs(4);

/// Connecting (TCP, then TLS) may take this long.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The client for a base URL (`https://…`: TLS with the system's roots and
/// the CA certificates `ca` holds, if given: PEM bytes the caller read
/// through the bounded input reader, and the name to report them by).
pub fn client(base: &str, ca: Option<(&str, &[u8])>) -> Result<HttpClient, String> {
    let c = connector(base.starts_with("https://"), ca)?;
    Ok(Client::builder(TokioExecutor::new())
        .pool_idle_timeout(POOL_IDLE)
        .build(c))
}

/// How many times [`send`] sends a request again after its connection
/// closed before any answer.
pub const RESENDS: u32 = 3;

/// Send `req` on `client`; when the connection closes before any byte of
/// an answer ([`closed_before_answer`]), send a copy again, at most
/// [`RESENDS`] times (the pool then hands out another connection or opens
/// a new one). Returns the answer or the last error, and how many times
/// the request was sent again.
///
/// Why: a server may close a keep-alive connection just after an answer
/// (llama.cpp's server closes one after each streamed answer, after 100
/// requests, and after 5 s idle), and the pool may hand it out again before
/// its task has read the close; the request written on it is then lost.
/// On a loaded 2-core machine that happens more than once to one request
/// now and then.
pub async fn send(
    client: &HttpClient,
    req: Request<Full<Bytes>>,
) -> (
    Result<Response<Incoming>, hyper_util::client::legacy::Error>,
    u32,
) {
    let (parts, body) = req.into_parts();
    let copy = |body: Full<Bytes>| {
        let mut r = Request::new(body);
        *r.method_mut() = parts.method.clone();
        *r.uri_mut() = parts.uri.clone();
        *r.version_mut() = parts.version;
        *r.headers_mut() = parts.headers.clone();
        r
    };
    let mut resent = 0;
    loop {
        match client.request(copy(body.clone())).await {
            Err(e) if resent < RESENDS && closed_before_answer(&e) => resent += 1,
            r => return (r, resent),
        }
    }
}

/// Whether a client request failed because the connection closed (or was
/// reset) before the answer's headers: typically a pooled keep-alive
/// connection that the server closed as the request went out on it, which
/// its handler never saw. (A server that dies while working on a request
/// looks the same; a caller that sends again accepts doing that one twice.)
pub fn closed_before_answer(e: &hyper_util::client::legacy::Error) -> bool {
    use std::error::Error as _;
    let mut src = e.source();
    while let Some(s) = src {
        if let Some(h) = s.downcast_ref::<hyper::Error>() {
            if h.is_incomplete_message() || h.is_canceled() {
                return true;
            }
        }
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            if matches!(
                io.kind(),
                std::io::ErrorKind::ConnectionReset
                    | std::io::ErrorKind::BrokenPipe
                    | std::io::ErrorKind::UnexpectedEof
            ) {
                return true;
            }
        }
        src = s.source();
    }
    false
}

/// The certificates in PEM bytes (at least one), or why not; `name`
/// names them in the error (the file they were read from). The bytes come
/// from the caller, read through the bounded input reader: this crate
/// opens no input file.
pub fn parse_ca_pem(name: &str, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{name}: not PEM certificates: {e}"))?;
    if certs.is_empty() {
        return Err(format!(
            "{name}: no PEM certificate (-----BEGIN CERTIFICATE-----) in it"
        ));
    }
    Ok(certs)
}

/// The connector. `tls`: load roots (only when the base is https; reading
/// the system's store takes a few ms).
pub fn connector(tls: bool, ca: Option<(&str, &[u8])>) -> Result<Connector, String> {
    let mut http = HttpConnector::new();
    http.set_nodelay(true);
    http.set_connect_timeout(Some(CONNECT_TIMEOUT));
    http.enforce_http(false);
    let mut roots = rustls::RootCertStore::empty();
    if tls {
        let native = rustls_native_certs::load_native_certs();
        let (ok, _bad) = roots.add_parsable_certificates(native.certs);
        if ok == 0 && ca.is_none() {
            tracing::warn!("no system root certificates found: https upstreams will fail to verify (set proxy.upstream_ca_file)");
        }
        if let Some((name, pem)) = ca {
            for c in parse_ca_pem(name, pem)? {
                roots
                    .add(c)
                    .map_err(|e| format!("{name}: unusable CA certificate: {e}"))?;
            }
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(HttpsConnectorBuilder::new()
        .with_tls_config(cfg)
        .https_or_http()
        .enable_http1()
        .wrap_connector(http))
}

/// The message of an error chain, outermost first (a cause whose text an
/// outer message already holds is not repeated).
pub fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts = vec![e.to_string()];
    let mut src = e.source();
    while let Some(s) = src {
        let t = s.to_string();
        if !parts.iter().any(|p| p.contains(&t)) {
            parts.push(t);
        }
        src = s.source();
    }
    parts.join(": ")
}

/// Whether an answer's `content-type` is an SSE stream.
pub fn is_event_stream(h: &HeaderMap) -> bool {
    h.get(hyper::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"))
}

/// An answer's retry hint as sent, in integer nanoseconds: the
/// `retry-after-ms` header (milliseconds), else `retry-after` (seconds),
/// else the JSON body's `"retry_after"` (seconds, Databricks). A value that
/// is not a non-negative decimal number (an HTTP date, garbage) is no hint,
/// never 0; a fraction of a nanosecond rounds up; a value too large for
/// `Nanos` is `NEVER`. Which time base the hint is in (the real time of the
/// answer, or a time-scaled proxy's model time) is the caller's to say.
pub fn retry_hint(headers: &HeaderMap, body: Option<&Value>) -> Option<Nanos> {
    let header = |name: &str, unit| {
        let v = headers.get(name)?.to_str().ok()?;
        decimal_ns(v, unit)
    };
    header("retry-after-ms", 1_000_000)
        .or_else(|| header("retry-after", 1_000_000_000))
        .or_else(|| match body?.get("retry_after")? {
            Value::Number(n) => decimal_ns(&n.to_string(), 1_000_000_000),
            _ => None,
        })
}

/// A non-negative decimal number (`12`, `1.5`, `.25`, `2e-3`) of `unit_ns`
/// units, in nanoseconds (rounded up; saturating at `NEVER`).
fn decimal_ns(s: &str, unit_ns: u64) -> Option<Nanos> {
    let s = s.trim();
    let (mant, exp) = match s.find(['e', 'E']) {
        Some(i) => (&s[..i], s[i + 1..].parse::<i32>().ok()?),
        None => (s, 0),
    };
    let (int, frac) = mant.split_once('.').unwrap_or((mant, ""));
    let digits = || int.bytes().chain(frac.bytes());
    if int.len() + frac.len() == 0 || !digits().all(|b| b.is_ascii_digit()) {
        return None;
    }
    // the significant digits (at most 30: beyond that only whether any
    // further one is nonzero matters, for rounding up)
    let mut n: u128 = 0;
    let mut shift: i64 = exp as i64 - frac.len() as i64;
    let mut sticky = false;
    let mut sig = 0;
    for b in digits() {
        let d = (b - b'0') as u128;
        if n == 0 && d == 0 {
            continue;
        }
        if sig < 30 {
            n = n * 10 + d;
            sig += 1;
        } else {
            // a digit dropped: one power of ten more
            shift += 1;
            sticky |= d != 0;
        }
    }
    if n == 0 {
        return Some(0);
    }
    let v = n * unit_ns as u128;
    let ns: u128 = if shift >= 0 {
        if shift > 38 {
            u128::MAX
        } else {
            v.saturating_mul(10u128.pow(shift as u32))
        }
    } else if -shift > 38 {
        1
    } else {
        let d = 10u128.pow((-shift) as u32);
        v.div_ceil(d) + u128::from(sticky && v.is_multiple_of(d))
    };
    Some(ns.min(NEVER as u128) as Nanos)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_that_could_leave_the_route_are_unsafe() {
        for bad in [
            "/serving-endpoints/../invocations",
            "/serving-endpoints/./x/invocations",
            "/serving-endpoints/%2e%2e/invocations",
            "/serving-endpoints/.%2E/invocations",
            "/serving-endpoints/x%2Fy/invocations",
            "/serving-endpoints/x%2f..%2fy/invocations",
            "/serving-endpoints/x%5Cy/invocations",
            "/serving-endpoints/x\\y/invocations",
            "/serving-endpoints/%252e%252e/invocations",
            "/v1/chat/completions/..",
        ] {
            assert!(unsafe_path(bad), "{bad}");
        }
        for ok in [
            "/serving-endpoints/my-ep_1/invocations",
            "/serving-endpoints/a.b/invocations",
            "/serving-endpoints/chat/completions",
            "/v1/chat/completions",
            "/serving-endpoints/...x/invocations",
        ] {
            assert!(!unsafe_path(ok), "{ok}");
        }
    }

    #[test]
    fn upstream_base_with_or_without_serving_endpoints() {
        for base in ["https://w", "https://w/serving-endpoints"] {
            assert_eq!(
                upstream_url(base, "/serving-endpoints/chat/completions"),
                "https://w/serving-endpoints/chat/completions"
            );
            assert_eq!(
                upstream_url(base, "/serving-endpoints/ep/invocations?x=1"),
                "https://w/serving-endpoints/ep/invocations?x=1"
            );
        }
        assert_eq!(
            upstream_url("http://h:1/prefix", "/v1/chat/completions"),
            "http://h:1/prefix/v1/chat/completions"
        );
        assert_eq!(
            upstream_url("http://h/serving-endpoints", "/v1/chat/completions"),
            "http://h/serving-endpoints/v1/chat/completions"
        );
        assert_eq!(
            upstream_url("http://h/x-serving-endpoints", "/serving-endpoints-2/x"),
            "http://h/x-serving-endpoints/serving-endpoints-2/x"
        );
    }

    #[test]
    fn userinfo_is_redacted() {
        assert_eq!(
            redact_userinfo("http://user:pw@host:8000/x?a=b@c"),
            "http://***@host:8000/x?a=b@c"
        );
        assert_eq!(redact_userinfo("https://h/p"), "https://h/p");
        assert_eq!(redact_userinfo("http://a@b@h"), "http://***@h");
    }

    #[test]
    fn decimals_in_integer_nanoseconds() {
        let s = 1_000_000_000;
        assert_eq!(decimal_ns("2", s), Some(2 * s));
        assert_eq!(decimal_ns(" 1.5 ", s), Some(1_500_000_000));
        assert_eq!(decimal_ns("0.7", s), Some(700_000_000));
        assert_eq!(decimal_ns(".25", s), Some(250_000_000));
        assert_eq!(decimal_ns("2e-3", s), Some(2_000_000));
        assert_eq!(decimal_ns("1E2", 1_000_000), Some(100_000_000));
        assert_eq!(decimal_ns("0", s), Some(0));
        assert_eq!(decimal_ns("0.0000000001", s), Some(1), "rounded up");
        assert_eq!(decimal_ns("1500", 1_000_000), Some(1_500_000_000));
        assert_eq!(decimal_ns("99999999999999999999999", s), Some(NEVER));
        assert_eq!(decimal_ns("1e300", s), Some(NEVER));
        for bad in [
            "",
            ".",
            "abc",
            "-1",
            "1.2.3",
            "NaN",
            "inf",
            "1e",
            "0x10",
            "1 s",
            "Wed, 21 Oct 2015 07:28:00 GMT",
        ] {
            assert_eq!(decimal_ns(bad, s), None, "{bad:?}");
        }
    }

    #[test]
    fn hints_from_headers_then_body() {
        let mut h = HeaderMap::new();
        assert_eq!(retry_hint(&h, None), None);
        let body = serde_json::json!({"retry_after": 0.25});
        assert_eq!(retry_hint(&h, Some(&body)), Some(250_000_000));
        h.insert("retry-after", HeaderValue::from_static("2"));
        assert_eq!(retry_hint(&h, Some(&body)), Some(2_000_000_000));
        h.insert("retry-after-ms", HeaderValue::from_static("1500"));
        assert_eq!(retry_hint(&h, None), Some(1_500_000_000));
        // an unreadable header is no hint; the next one is read
        h.insert("retry-after-ms", HeaderValue::from_static("soon"));
        assert_eq!(retry_hint(&h, None), Some(2_000_000_000));
        h.insert("retry-after", HeaderValue::from_static("Wed, 21 Oct 2015"));
        assert_eq!(retry_hint(&h, None), None);
    }
}
