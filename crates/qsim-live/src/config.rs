//! The proxy's configuration, as the root crate hands it over validated
//! (it parses the same `[deployment]`/`[defaults]`/`[[consumer]]` tables as
//! a shared-deployment file).

use crate::drift::DriftConfig;
use crate::record::LogConfig;
use crate::store::StateBackend;
use qsim_core::limiter::admission::LimiterConfig;
use qsim_core::time::Nanos;
use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// What a consumer's over-limit request gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnLimit {
    /// An immediate 429 in the configured shape.
    Reject,
    /// Held until the limiter admits it (FIFO per consumer, see `wait.rs`),
    /// or a 429 at once when the predicted wait exceeds `max_wait` or the
    /// request's own deadline.
    Wait { max_wait: Duration },
}

/// The shape of an over-limit answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitShape {
    /// OpenAI: 429 with `retry-after`, `retry-after-ms` and `x-ratelimit-*`
    /// headers derived from the limiter's exact retry time.
    OpenAi,
    /// Databricks FMAPI: 429 `{"error_code":"REQUEST_LIMIT_EXCEEDED",…}`, no hint.
    Fmapi,
}

impl LimitShape {
    pub fn parse(s: &str) -> Option<LimitShape> {
        match s {
            "openai" => Some(LimitShape::OpenAi),
            "fmapi" => Some(LimitShape::Fmapi),
            _ => None,
        }
    }
}

/// A validated proxy configuration.
#[derive(Clone)]
pub struct ProxyConfig {
    /// Address to listen on (port 0: any free port, printed at start).
    pub listen: SocketAddr,
    /// Upstream base URL, `http[s]://host[:port][/prefix]` (no trailing slash);
    /// the request's path is appended.
    pub upstream: String,
    /// Sent upstream as `Authorization: Bearer …`; never logged or printed.
    pub credential: Option<String>,
    /// The header identifying the consumer; `None` = `Authorization: Bearer KEY`.
    pub consumer_header: Option<String>,
    /// Consumer key → consumer index (never logged).
    pub keys: Vec<(String, usize)>,
    /// A missing or unknown key: `None` = 401, `Some(i)` = consumer `i`'s policy.
    pub unknown_consumer: Option<usize>,
    pub limit_shape: LimitShape,
    /// Request bodies above this are answered 413.
    pub max_body_bytes: usize,
    /// Reserved when a request does not state `max_tokens`.
    pub default_max_tokens: u64,
    /// A client connection's request head (line and headers) must arrive
    /// within this, from the connection's start or the end of its previous
    /// answer (then the connection is closed); also bounds an idle
    /// keep-alive connection.
    pub header_read_timeout: Duration,
    /// A request's whole body must arrive within this, from the handler's
    /// start (then 408 and the connection closed).
    pub body_read_timeout: Duration,
    /// Until the upstream's response headers arrive (then 504).
    pub upstream_timeout: Duration,
    /// Longest silence of the upstream inside a response body (then the
    /// stream is ended with an error and the reservation settled).
    pub stream_idle_timeout: Duration,
    /// Concurrency lease (default: the core's `DEFAULT_LEASE`).
    pub lease: Option<Nanos>,
    pub limiter: LimiterConfig,
    /// Worker threads of the tokio runtime (`None`: one per core).
    pub threads: Option<usize>,
    /// Where the limiter state lives (in-process, or a shared Redis).
    pub state: StateBackend,
    /// The limiter's clock runs this many times faster than real time (1:
    /// real time). Compressed time for tests against `qsim load
    /// --time-scale` with the same factor; retry hints are then in scaled time.
    pub time_scale: f64,
    /// Per consumer (the order of `limiter.consumers`): reject or wait.
    pub on_limit: Vec<OnLimit>,
    /// A request header holding the client's deadline in seconds from its
    /// arrival, read before the OpenAI SDKs' `x-stainless-timeout` /
    /// `x-stainless-read-timeout`.
    pub deadline_header: Option<String>,
    /// Kept before a request's deadline for the upstream's first byte: a
    /// request is held only if it is admitted at least this long before.
    pub deadline_margin: Duration,
    /// PEM file of extra CA certificates trusted for an https upstream
    /// (besides the system's roots).
    pub upstream_ca_file: Option<PathBuf>,
    /// The CA file's PEM bytes, read through the bounded input reader when
    /// the configuration was loaded (this crate opens no input file).
    pub upstream_ca_pem: Option<std::sync::Arc<[u8]>>,
    /// On SIGTERM/SIGINT: how long in-flight requests may take to finish.
    pub drain_timeout: Duration,
    /// The decision log (`None`: off).
    pub log: Option<LogConfig>,
    /// `--profile`: predict the upstream from its profile and flag drift.
    pub drift: Option<DriftConfig>,
}

impl fmt::Debug for ProxyConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProxyConfig")
            .field("listen", &self.listen)
            .field("upstream", &self.upstream)
            .field(
                "credential",
                &self.credential.as_ref().map(|_| "<redacted>"),
            )
            .field("consumer_header", &self.consumer_header)
            .field("keys", &format_args!("<{} redacted>", self.keys.len()))
            .field("unknown_consumer", &self.unknown_consumer)
            .field("limit_shape", &self.limit_shape)
            .field("max_body_bytes", &self.max_body_bytes)
            .field("default_max_tokens", &self.default_max_tokens)
            .field("header_read_timeout", &self.header_read_timeout)
            .field("body_read_timeout", &self.body_read_timeout)
            .field("upstream_timeout", &self.upstream_timeout)
            .field("stream_idle_timeout", &self.stream_idle_timeout)
            .field("lease", &self.lease)
            .field("limiter", &self.limiter)
            .field("state", &self.state)
            .field("time_scale", &self.time_scale)
            .field("on_limit", &self.on_limit)
            .field("deadline_header", &self.deadline_header)
            .field("deadline_margin", &self.deadline_margin)
            .field("upstream_ca_file", &self.upstream_ca_file)
            .field("drain_timeout", &self.drain_timeout)
            .field("log", &self.log)
            .field("drift", &self.drift)
            .finish()
    }
}
