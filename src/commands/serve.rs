//! `qsim serve`: a hosted or server profile behind an OpenAI-compatible
//! endpoint. The models as sans-IO backends are `qsim_sim::serve_model`; the
//! HTTP side and the real-time driver are `qsim_live::serve`.

use qsim_live::serve::ServeConfig;
use qsim_sim::config::ConfigError;
use qsim_sim::serve_model::{load_profile, HostedBackend, Profile, ServerBackend};
use std::net::SocketAddr;
use std::path::PathBuf;

/// `qsim serve` arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// A hosted-API profile (kind = "hosted") or a server profile (kind = "server").
    pub profile: PathBuf,
    /// Address to listen on, e.g. 127.0.0.1:8000 (port 0: any free port;
    /// stdout's first line says which).
    #[arg(long)]
    pub listen: String,
    /// Run this many times faster than real time: every modelled duration,
    /// limit window and retry hint is divided by it.
    #[arg(long, default_value_t = 1.0)]
    pub time_scale: f64,
    /// Seed of the model's random streams.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

/// Validate everything, then bind and serve (nothing is bound on an error).
pub fn run(args: &ServeArgs) -> Result<(), crate::cli::common::CliError> {
    use crate::cli::common::CliError;
    let listen: SocketAddr = args.listen.parse().map_err(|e| {
        CliError::Config(ConfigError::new(
            "--listen",
            "",
            format!(
                "{:?} is not an address like 127.0.0.1:8000: {e}",
                args.listen
            ),
        ))
    })?;
    if !(args.time_scale.is_finite() && args.time_scale > 0.0 && args.time_scale <= 1e6) {
        return Err(CliError::Config(ConfigError::new(
            "--time-scale",
            "",
            format!("must be in (0, 1e6], got {}", args.time_scale),
        )));
    }
    let profile = load_profile(&args.profile)?;
    let cfg = ServeConfig {
        listen,
        time_scale: args.time_scale,
    };
    let r = match profile {
        Profile::Hosted(p) => {
            let s = p.serve.clone();
            qsim_live::serve::run(cfg, HostedBackend::new(p, s, args.seed))
        }
        Profile::Server(p) => {
            let s = p.serve.clone();
            qsim_live::serve::run(cfg, ServerBackend::new(p, s, args.seed))
        }
    };
    r.map_err(CliError::Io)
}
