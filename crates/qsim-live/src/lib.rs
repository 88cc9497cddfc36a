//! qsim's real-time driver: `qsim proxy`, an HTTP proxy in front of an
//! OpenAI-compatible (or Databricks serving-endpoints) upstream that admits
//! requests with **the same admission limiter** the simulator runs
//! (`qsim_core::limiter::admission`), driven by a monotonic clock.
//!
//! The core never reads a clock: this crate does. Time is
//! `Instant::now() − start` in integer nanoseconds (`qsim_core::time::Nanos`),
//! handed to `decide` per HTTP request and to `complete` when the upstream's
//! answer ends (settled against its `usage`). The limiter's `Params` are
//! compiled once and shared (`Arc`); its `State` lives in-process behind a
//! mutex held only for the decision itself (no await inside), or in a Redis
//! shared by several replicas (`store.rs`: the same `decide_pure` /
//! `complete`, written back by compare-and-set).
//!
//! [`serve`] is the other real-time driver: `qsim serve`'s HTTP side around
//! a sans-IO model backend (the root crate's hosted and server models).
//!
//! Configuration is parsed and validated by the root crate (`qsim proxy`
//! reads the same `[deployment]`/`[defaults]`/`[[consumer]]` tables as a
//! shared-deployment file); this crate receives a validated [`ProxyConfig`].
//!
//! Modules (none imports one that imports it back; `scripts/module-cycles.py`):
//!
//! - the proxy: `config` (the validated configuration), `app` (the shared
//!   state: the policy generation in force, the limiter state's home, what
//!   every request shares), `admit` (one decision, in-process or shared),
//!   `queue` and `wait` (`on_limit = "wait"`: the per-consumer queues and
//!   their driver), `body` (the settlement guard and the tracked answer),
//!   `respond` (the 429 answer), `handler` (routes and the request handler),
//!   `reload` (SIGHUP), `server` (start-up and shutdown), `store` (the
//!   state in Redis), `record` (the decision log), `drift` (the shadow
//!   model), `metrics`, `estimate` (input tokens);
//! - the other drivers: [`serve`] (`qsim serve`), [`load`] (`qsim load`),
//!   [`replay`] (`qsim replay`), [`bench`](mod@bench) (the benchmark client);
//! - shared by all: `clock` (the one clock: model time ↔ real time), `http`
//!   (response bodies and errors, the accept loop, the one client builder
//!   with its TLS connector, retry hints), `sse` (the one SSE reader and
//!   writer), `sync` (poison-tolerant locking), [`tls`] (the CA-file path
//!   the root crate reads). The sans-IO model interface is
//!   `qsim_core::model`, re-exported from [`serve`].

mod admit;
mod app;
pub mod bench;
mod body;
mod clock;
mod config;
pub mod drift;
pub mod estimate;
mod handler;
mod http;
pub mod load;
mod metrics;
mod queue;
pub mod record;
mod reload;
pub mod replay;
mod respond;
pub mod serve;
mod server;
mod sse;
mod store;
mod sync;
pub mod tls;
mod wait;

/// How the proxy compiles its config's limiter (with its lease).
pub use app::compile as compile_limiter;
/// The one clock (model time ↔ real time) and the one retry-hint reader,
/// for drivers outside this crate (the Python package's Pacer).
pub use clock::Clock;
pub use config::{LimitShape, OnLimit, ProxyConfig};
pub use drift::{DriftConfig, ShadowFactory};
/// The output tokens the proxy reserves for a request body.
pub use handler::output_bound;
pub use http::retry_hint;
pub use hyper::Uri;
/// The retry hint the proxy announces (whole milliseconds, rounded up);
/// `qsim whatif` replays callers with it.
pub use respond::{wait_ms, LIMITED_BY};
pub use server::Proxy;
pub use store::{FailMode, StateBackend};
