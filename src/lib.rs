//! qsim: a deterministic discrete-event simulator and capacity planner for
//! shared LLM inference deployments.
//!
//! Layout (see docs/ARCHITECTURE.md):
//! - [`engine`]: virtual time, the event queue, random streams, statistics;
//! - [`limiter`]: token buckets and rate limits (sans-IO);
//! - [`hosted`]: a hosted API endpoint with provider rate limits (sans-IO);
//! - [`client`]: client retry policies, the SDK retry layer, worker pools and
//!   the managed batch executor;
//! - [`experiment`]: experiment files, validation and the simulation drivers;
//! - [`plan`]: shared-deployment scenarios and `qsim plan`;
//! - [`proxy`]: `qsim proxy` configuration (the runtime is the `qsim-live` crate);
//! - [`serve`]: `qsim serve`, the models behind an OpenAI-compatible endpoint;
//! - [`load`]: `qsim load`: a scenario compiled for the live load generator (`qsim-live`);
//! - [`server`]: the GPU inference server model (continuous batching, paged KV cache);
//! - [`workload`]: open-loop arrival processes and closed-loop clients;
//! - [`report`]: tables and JSON.

pub mod calibrate;
pub mod cli;
pub mod client;
pub mod compare;
pub mod config;
pub mod embedded;
pub mod engine;
pub mod experiment;
pub mod hosted;
pub mod load;
pub mod output;
pub mod plan;
pub mod plot;
pub mod proxy;
pub mod recommend;
pub mod replay;
pub mod report;
pub mod results;
pub mod serve;
pub mod server;
pub mod sweep;
pub mod whatif;
pub mod work;
pub mod workload;

// The I/O-free core, re-exported under the paths the simulator has always used.
pub use qsim_core::{limiter, time, Uniform};
