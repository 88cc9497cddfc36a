//! `qsim proxy`: its flags, mapped to [`qsim_api::proxy::Spec`] (the
//! config's loading and checks are `qsim_api::proxy`; the runtime is
//! `qsim_live::Proxy`).

use std::path::PathBuf;

/// `qsim proxy` flags; each overrides the file's `[proxy]` field of the same name.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ProxyArgs {
    /// The proxy config (TOML, kind = "proxy"; `qsim plan --emit-proxy-config` writes one).
    #[arg(long)]
    pub config: PathBuf,
    /// Listen address, e.g. 127.0.0.1:8080 (port 0: any free port, printed at start).
    #[arg(long)]
    pub listen: Option<String>,
    /// Upstream base URL, e.g. http://127.0.0.1:8000 or https://HOST/serving-endpoints/..
    #[arg(long)]
    pub upstream: Option<String>,
    /// Environment variable holding the upstream credential (sent as a bearer token, never logged).
    #[arg(long)]
    pub credential_env: Option<String>,
    /// Over-limit answer shape: openai or fmapi.
    #[arg(long)]
    pub limit_shape: Option<String>,
    /// Worker threads (default: one per core).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Where the limiter state lives: "memory" (default) or redis://HOST:PORT
    /// (shared by every replica with the same limiter configuration).
    #[arg(long)]
    pub state: Option<String>,
    /// With a shared state, what to do while it is unreachable: open (forward
    /// unlimited) or closed (answer 503). Default: closed.
    #[arg(long)]
    pub state_fail: Option<String>,
    /// Compressed time for tests: the limiter's clock runs X times faster
    /// than real time (in (0, 100]; default 1). Pair with `qsim load --time-scale X`.
    #[arg(long, allow_negative_numbers = true)]
    pub time_scale: Option<f64>,
    /// Write the decision log (one record per request, no prompt text or
    /// keys) into this directory (`[proxy.log] dir`); Parquet files.
    #[arg(long)]
    pub log_dir: Option<PathBuf>,
    /// Accept the placeholder keys `--emit-proxy-config` writes
    /// (`key-NAME`, which `qsim load` sends by default) instead of refusing
    /// to start: for a local test only (a WARN at start says so).
    #[arg(long)]
    pub allow_placeholder_keys: bool,
    /// The upstream's profile (kind = "hosted" or "server"): predict TTFT,
    /// ITL, E2E and 429s for the forwarded load and flag drift on /metrics.
    #[arg(long)]
    pub profile: Option<PathBuf>,
}

impl ProxyArgs {
    pub fn spec(&self) -> qsim_api::proxy::Spec {
        qsim_api::proxy::Spec {
            config: self.config.clone(),
            listen: self.listen.clone(),
            upstream: self.upstream.clone(),
            credential_env: self.credential_env.clone(),
            limit_shape: self.limit_shape.clone(),
            threads: self.threads,
            state: self.state.clone(),
            state_fail: self.state_fail.clone(),
            time_scale: self.time_scale,
            log_dir: self.log_dir.clone(),
            allow_placeholder_keys: self.allow_placeholder_keys,
            profile: self.profile.clone(),
        }
    }
}
