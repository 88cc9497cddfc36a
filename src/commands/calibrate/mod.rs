//! `qsim calibrate`: fit a profile to observations.
//!
//! `hosted` fits a hosted profile (the binding quota bucket and the latency
//! model) to a `qsim replay` attempt log; see [`hosted`]. `server` fits a
//! server profile's iteration-time coefficients to vLLM serving benchmarks;
//! see [`server`].

pub mod bench;
pub mod hosted;
pub mod server;

use crate::cli::common::CliError;

#[derive(clap::Subcommand, Debug)]
pub enum CalibrateCmd {
    /// Fit a hosted profile (binding quota bucket, accounting mode, TTFT,
    /// per-token time, 429 latency) to a `qsim replay` attempts.csv.
    Hosted(hosted::HostedArgs),
    /// Fit a server profile's iteration-time coefficients to vLLM
    /// benchmark_serving result JSON files (one per request rate).
    Server(server::ServerArgs),
    /// Measure an OpenAI-compatible server as vLLM's benchmark_serving.py
    /// does (Poisson arrivals, streaming) and write its result JSON.
    Bench(bench::BenchArgs),
}

pub fn run_cli(cmd: CalibrateCmd) -> Result<(), CliError> {
    match cmd {
        CalibrateCmd::Hosted(a) => hosted::run_cli(a),
        CalibrateCmd::Server(a) => server::run_cli(a),
        CalibrateCmd::Bench(a) => bench::run_cli(a),
    }
}
