//! qsim's simulation library: everything that simulates, with no command
//! line, no async runtime and no polars (see docs/ARCHITECTURE.md).
//!
//! - [`engine`]: virtual time, the event queue, random streams, statistics;
//! - [`config`], [`embedded`]: TOML loading with errors that carry the path;
//! - [`hosted`]: a hosted API endpoint with provider rate limits (sans-IO);
//! - [`server`]: the GPU inference server model (continuous batching, paged KV cache);
//! - [`client`]: client policies as configured (the state machines are in qsim-core);
//! - [`workload`]: open-loop arrival processes and closed-loop clients;
//! - [`trace`]: request traces (real traffic) replayed as workloads, and their statistics;
//! - [`experiment`]: experiment files, validation and the simulation drivers;
//! - [`fleet`]: pools of servers behind the core's router, prefix caches, `qsim fleet`;
//! - [`plan`]: shared-deployment scenarios and `qsim plan`;
//! - [`sweep`]: grids of overrides run in parallel;
//! - [`calibrate`]: a server profile fitted to serving benchmarks, with intervals;
//! - [`report`]: records, tables and JSON;
//! - [`work`]: the work meter (budgets by counted units).

pub mod budget;
pub mod calibrate;
pub mod client;
pub mod compare;
pub mod config;
pub mod embedded;
pub mod engine;
pub mod experiment;
pub mod fleet;
pub mod hosted;
pub mod input;
pub mod options;
pub mod plan;
pub mod recommend;
pub mod report;
pub mod run;
pub mod serve_model;
pub mod serve_spec;
pub mod server;
pub mod sim2real;
pub mod sweep;
pub mod trace;
pub mod work;
pub mod workload;

// The I/O-free core, re-exported under the paths the simulator has always used.
pub use qsim_core::{limiter, time, Uniform};
