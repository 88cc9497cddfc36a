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

pub use config::{LimitShape, OnLimit, ProxyConfig};
pub use drift::{DriftConfig, ShadowFactory};
pub use hyper::Uri;
pub use server::Proxy;
pub use store::{FailMode, StateBackend};
