//! `qsim proxy`: the proxy's configuration file (`kind = "proxy"`) →
//! [`qsim_live::ProxyConfig`], and `qsim plan --emit-proxy-config`.
//!
//! The limiter tables (`[deployment]`, `[defaults]`, `[[consumer]]`) are
//! those of a shared-deployment file and go through the very same
//! validation ([`qsim_sim::plan::config::limiter_config`]); `[proxy]` holds the
//! HTTP side. Every error names the field and exits 2 before any port is
//! bound. The runtime (tokio, hyper) is in `crates/qsim-live`.

use qsim_live::{FailMode, LimitShape, OnLimit, ProxyConfig, StateBackend};
use qsim_sim::config::{from_value, read_toml, ConfigError};
use qsim_sim::limiter::admission::{LimiterConfig, BP_FULL};
use qsim_sim::limiter::rates::OutputAccounting;
use qsim_sim::plan::config::{limiter_config, RawConsumer, RawDeployment, RawPolicy};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::fmt::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

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

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawProxy {
    listen: Option<String>,
    upstream: Option<String>,
    credential_env: Option<String>,
    consumer_header: Option<String>,
    unknown_consumer: Option<String>,
    limit_shape: Option<String>,
    max_body_bytes: Option<i64>,
    default_max_tokens: Option<i64>,
    header_read_timeout_s: Option<f64>,
    body_read_timeout_s: Option<f64>,
    upstream_timeout_s: Option<f64>,
    stream_idle_timeout_s: Option<f64>,
    lease_s: Option<f64>,
    threads: Option<i64>,
    state: Option<String>,
    state_fail: Option<String>,
    time_scale: Option<f64>,
    /// "reject" (default) or "wait": every consumer's, unless overridden
    on_limit: Option<String>,
    /// the longest a waiting request is held (default 30 s)
    max_wait_s: Option<f64>,
    deadline_header: Option<String>,
    deadline_margin_s: Option<f64>,
    upstream_ca_file: Option<PathBuf>,
    drain_timeout_s: Option<f64>,
    /// the upstream's profile (relative to this file): drift on
    profile: Option<PathBuf>,
    drift: Option<RawDrift>,
    /// consumer name → its keys
    #[serde(default)]
    keys: BTreeMap<String, Vec<String>>,
    /// consumer name → its own on_limit / max_wait_s
    #[serde(default)]
    consumers: BTreeMap<String, RawConsumerProxy>,
    /// the decision log
    log: Option<RawLog>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawLog {
    dir: Option<PathBuf>,
    /// a file is finished at this size (default 64)
    max_file_mb: Option<f64>,
    /// the oldest files are deleted beyond this total (default 1024)
    max_total_mb: Option<f64>,
    /// a file is finished at the latest this long after its first record (default 60)
    max_file_age_s: Option<f64>,
    /// records waiting for the writer before new ones are dropped (default 65536)
    queue: Option<i64>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawConsumerProxy {
    on_limit: Option<String>,
    max_wait_s: Option<f64>,
}

/// `[proxy.drift]`: the band, the time a drift must last, the estimator.
#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawDrift {
    band: Option<[f64; 2]>,
    for_s: Option<f64>,
    window_s: Option<f64>,
    min_samples: Option<i64>,
    replicas: Option<i64>,
    seed: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawProxyFile {
    kind: String,
    title: Option<String>,
    #[serde(default)]
    proxy: RawProxy,
    deployment: RawDeployment,
    defaults: Option<RawPolicy>,
    consumer: Vec<RawConsumer>,
}

/// A request head (line and headers, a few hundred bytes) that takes longer
/// than this is a slow client or an attack: 10 s is generous even on a bad
/// mobile link, and longer than the idle keep-alive of common HTTP clients
/// (httpx 5 s, hyper's pool here 4 s), so a pooled connection is not
/// closed under a client about to reuse it.
const DEFAULT_HEADER_READ_TIMEOUT_S: f64 = 10.0;

/// A whole request body (at most `max_body_bytes`, 1 MiB by default) in
/// this long: at least ~35 KB/s for the largest default body, far below
/// any real client's upload rate; prompts are usually a few KB.
const DEFAULT_BODY_READ_TIMEOUT_S: f64 = 30.0;

fn pos_secs(f: &str, field: &str, v: Option<f64>, default: f64) -> Result<Duration, ConfigError> {
    let x = v.unwrap_or(default);
    if x.is_finite() && x > 0.0 && x <= 86_400.0 {
        Ok(Duration::from_secs_f64(x))
    } else {
        Err(ConfigError::new(
            f,
            field,
            format!("must be in (0, 86400] seconds, got {x}"),
        ))
    }
}

/// Read and validate a proxy config with the flags applied. Nothing is bound.
pub fn load(args: &ProxyArgs) -> Result<ProxyConfig, ConfigError> {
    let f = &args.config.display().to_string();
    let v = read_toml(&args.config)?;
    let raw: RawProxyFile = from_value(f, v)?;
    qsim_sim::config::expect_kind(f, &raw.kind, "proxy", "a proxy config")?;
    let _ = raw.title;
    let limiter = limiter_config(f, &raw.deployment, raw.defaults, &raw.consumer)?;
    if limiter.reserved_bp_total() > BP_FULL {
        return Err(ConfigError::new(f, "consumer", "reservations exceed 100 %"));
    }
    let p = raw.proxy;
    let flag_or = |flag: &Option<String>, file: &Option<String>, name: &str| {
        flag.clone()
            .map(|x| (x, format!("--{}", name.replace('_', "-"))))
            .or_else(|| file.clone().map(|x| (x, format!("proxy.{name}"))))
    };
    let err_at = |at: &str, reason: String| {
        if at.starts_with("--") {
            ConfigError::new(at, "", reason)
        } else {
            ConfigError::new(f, at, reason)
        }
    };

    let (listen_s, at) = flag_or(&args.listen, &p.listen, "listen")
        .unwrap_or(("127.0.0.1:8080".into(), "proxy.listen".into()));
    let listen: SocketAddr = listen_s.parse().map_err(|_| {
        err_at(
            &at,
            format!("expected an address like 127.0.0.1:8080, got {listen_s:?}"),
        )
    })?;

    let (up, at) = flag_or(&args.upstream, &p.upstream, "upstream")
        .ok_or_else(|| ConfigError::new(f, "proxy.upstream", "missing (or give --upstream)"))?;
    let up = up.trim_end_matches('/').to_string();
    let rest = up
        .strip_prefix("http://")
        .or_else(|| up.strip_prefix("https://"))
        .ok_or_else(|| {
            err_at(
                &at,
                format!("expected http[s]://host[:port][/prefix], got {up:?}"),
            )
        })?;
    if rest.is_empty() || up.parse::<qsim_live::Uri>().is_err() {
        return Err(err_at(&at, format!("not a valid URL: {up:?}")));
    }

    let credential = match flag_or(&args.credential_env, &p.credential_env, "credential_env") {
        None => None,
        Some((var, at)) => match std::env::var(&var) {
            Ok(c) if !c.is_empty() => Some(c),
            _ => {
                return Err(err_at(
                    &at,
                    format!(
                        "environment variable {var} is not set (it holds the upstream credential)"
                    ),
                ))
            }
        },
    };

    let consumer_header = match &p.consumer_header {
        None => None,
        Some(h) if h.eq_ignore_ascii_case("authorization") => None,
        Some(h) => {
            let h = h.to_ascii_lowercase();
            if h.is_empty()
                || !h
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            {
                return Err(ConfigError::new(
                    f,
                    "proxy.consumer_header",
                    format!("not a header name: {h:?}"),
                ));
            }
            Some(h)
        }
    };

    // by name, and each key once: linear in the config's size
    let by_name: BTreeMap<&str, usize> = limiter
        .consumers
        .iter()
        .enumerate()
        .map(|(i, c)| (c.name.as_str(), i))
        .collect();
    let index = |name: &str| by_name.get(name).copied();
    let unknown_consumer = match p.unknown_consumer.as_deref() {
        None | Some("reject") => None,
        Some(n) => Some(index(n).ok_or_else(|| {
            ConfigError::new(
                f,
                "proxy.unknown_consumer",
                format!("expected \"reject\" or a consumer name, got {n:?}"),
            )
        })?),
    };

    let mut keys: Vec<(String, usize)> = Vec::new();
    let mut seen: std::collections::BTreeSet<&str> = std::collections::BTreeSet::new();
    for (name, ks) in &p.keys {
        let at = format!("proxy.keys.{name}");
        let c = index(name)
            .ok_or_else(|| ConfigError::new(f, &at, format!("no consumer named {name:?}")))?;
        for k in ks {
            if k.trim().is_empty() || k.trim() != k {
                return Err(ConfigError::new(
                    f,
                    &at,
                    "keys must be non-empty, without surrounding spaces",
                ));
            }
            if !seen.insert(k.as_str()) {
                // the key itself is never printed
                return Err(ConfigError::new(f, &at, "a key is given twice"));
            }
            keys.push((k.clone(), c));
        }
    }
    if keys.is_empty() && unknown_consumer.is_none() {
        return Err(ConfigError::new(
            f,
            "proxy.keys",
            "no consumer keys and unknown_consumer = \"reject\": every request would be refused",
        ));
    }

    let limit_shape = match flag_or(&args.limit_shape, &p.limit_shape, "limit_shape") {
        None => LimitShape::OpenAi,
        Some((s, at)) => LimitShape::parse(&s)
            .ok_or_else(|| err_at(&at, format!("expected \"openai\" or \"fmapi\", got {s:?}")))?,
    };
    let max_body_bytes = match p.max_body_bytes {
        None => 1 << 20,
        Some(x) if (1..=(1i64 << 30)).contains(&x) => x as usize,
        Some(x) => {
            return Err(ConfigError::new(
                f,
                "proxy.max_body_bytes",
                format!("must be in 1..=1073741824, got {x}"),
            ))
        }
    };
    let default_max_tokens = match p.default_max_tokens {
        None => 4096,
        Some(x) if x > 0 => x as u64,
        Some(x) => {
            return Err(ConfigError::new(
                f,
                "proxy.default_max_tokens",
                format!("must be > 0, got {x}"),
            ))
        }
    };
    let header_read_timeout = pos_secs(
        f,
        "proxy.header_read_timeout_s",
        p.header_read_timeout_s,
        DEFAULT_HEADER_READ_TIMEOUT_S,
    )?;
    let body_read_timeout = pos_secs(
        f,
        "proxy.body_read_timeout_s",
        p.body_read_timeout_s,
        DEFAULT_BODY_READ_TIMEOUT_S,
    )?;
    let upstream_timeout = pos_secs(f, "proxy.upstream_timeout_s", p.upstream_timeout_s, 600.0)?;
    let stream_idle_timeout = pos_secs(
        f,
        "proxy.stream_idle_timeout_s",
        p.stream_idle_timeout_s,
        120.0,
    )?;
    let lease = p
        .lease_s
        .map(|x| pos_secs(f, "proxy.lease_s", Some(x), 1.0).map(|d| d.as_nanos() as u64))
        .transpose()?;
    let threads = match (args.threads, p.threads) {
        (Some(0), _) => return Err(ConfigError::new("--threads", "", "must be >= 1")),
        (Some(t), _) => Some(t),
        (None, Some(t)) if (1..=1024).contains(&t) => Some(t as usize),
        (None, Some(t)) => {
            return Err(ConfigError::new(
                f,
                "proxy.threads",
                format!("must be in 1..=1024, got {t}"),
            ))
        }
        (None, None) => None,
    };
    let fail = match flag_or(&args.state_fail, &p.state_fail, "state_fail") {
        None => FailMode::Closed,
        Some((s, at)) => match s.as_str() {
            "open" => FailMode::Open,
            "closed" => FailMode::Closed,
            _ => {
                return Err(err_at(
                    &at,
                    format!("expected \"open\" or \"closed\", got {s:?}"),
                ))
            }
        },
    };
    let state = match flag_or(&args.state, &p.state, "state") {
        None => StateBackend::InProcess,
        Some((s, _)) if s == "memory" => StateBackend::InProcess,
        Some((s, at)) => {
            let addr = s
                .strip_prefix("redis://")
                .map(|r| r.trim_end_matches('/'))
                .filter(|r| {
                    r.rsplit_once(':').is_some_and(|(h, port)| {
                        !h.is_empty()
                            && !h.contains('@')
                            && port.parse::<u16>().is_ok_and(|x| x > 0)
                    })
                })
                .ok_or_else(|| {
                    err_at(
                        &at,
                        format!("expected \"memory\" or redis://HOST:PORT, got {s:?}"),
                    )
                })?;
            StateBackend::Redis {
                addr: addr.to_string(),
                fail,
            }
        }
    };
    let time_scale = match (args.time_scale, p.time_scale) {
        (Some(x), _) => (x, "--time-scale"),
        (None, Some(x)) => (x, "proxy.time_scale"),
        (None, None) => (1.0, ""),
    };
    if !(time_scale.0 > 0.0 && time_scale.0 <= 100.0) {
        return Err(err_at(
            time_scale.1,
            format!("must be in (0, 100], got {}", time_scale.0),
        ));
    }
    let header_name = |field: &str, h: &str| {
        let h = h.to_ascii_lowercase();
        if h.is_empty()
            || !h
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err(ConfigError::new(
                f,
                field,
                format!("not a header name: {h:?}"),
            ));
        }
        Ok(h)
    };
    let on_limit_of = |field: &str, s: &str, max_wait: Duration| match s {
        "reject" => Ok(OnLimit::Reject),
        "wait" => Ok(OnLimit::Wait { max_wait }),
        _ => Err(ConfigError::new(
            f,
            field,
            format!("expected \"reject\" or \"wait\", got {s:?}"),
        )),
    };
    let max_wait = pos_secs(f, "proxy.max_wait_s", p.max_wait_s, 30.0)?;
    let default_on_limit = on_limit_of(
        "proxy.on_limit",
        p.on_limit.as_deref().unwrap_or("reject"),
        max_wait,
    )?;
    let mut on_limit = vec![default_on_limit; limiter.consumers.len()];
    for (name, c) in &p.consumers {
        let at = format!("proxy.consumers.{name}");
        let i = index(name)
            .ok_or_else(|| ConfigError::new(f, &at, format!("no consumer named {name:?}")))?;
        let mw = match c.max_wait_s {
            Some(x) => pos_secs(f, &format!("{at}.max_wait_s"), Some(x), 30.0)?,
            None => max_wait,
        };
        let ol = match &c.on_limit {
            Some(s) => s.as_str(),
            None if matches!(default_on_limit, OnLimit::Wait { .. }) => "wait",
            None => "reject",
        };
        on_limit[i] = on_limit_of(&format!("{at}.on_limit"), ol, mw)?;
    }
    let deadline_header = p
        .deadline_header
        .as_deref()
        .map(|h| header_name("proxy.deadline_header", h))
        .transpose()?;
    let deadline_margin = match p.deadline_margin_s {
        None => Duration::from_millis(50),
        Some(x) if x.is_finite() && (0.0..=3600.0).contains(&x) => Duration::from_secs_f64(x),
        Some(x) => {
            return Err(ConfigError::new(
                f,
                "proxy.deadline_margin_s",
                format!("must be in [0, 3600] seconds, got {x}"),
            ))
        }
    };
    let drain_timeout = pos_secs(f, "proxy.drain_timeout_s", p.drain_timeout_s, 30.0)?;
    let upstream_ca_file = match &p.upstream_ca_file {
        None => None,
        Some(path) => {
            // relative to the config file
            let path = match args.config.parent() {
                Some(dir) if path.is_relative() => dir.join(path),
                _ => path.clone(),
            };
            // bounded: a regular file only, a configuration's cap
            let pem =
                qsim_sim::input::read_bytes(&path, qsim_sim::input::Kind::Config).map_err(|e| {
                    ConfigError::new(
                        f,
                        "proxy.upstream_ca_file",
                        format!("{}: {e}", path.display()),
                    )
                })?;
            qsim_live::tls::parse_ca_pem(&path.display().to_string(), &pem)
                .map_err(|e| ConfigError::new(f, "proxy.upstream_ca_file", e))?;
            Some((path, std::sync::Arc::<[u8]>::from(pem)))
        }
    };
    let (upstream_ca_file, upstream_ca_pem) = match upstream_ca_file {
        Some((p, pem)) => (Some(p), Some(pem)),
        None => (None, None),
    };
    let log = log_config(f, args, p.log)?;
    let profile = match (&args.profile, &p.profile) {
        (Some(path), _) => Some((path.clone(), "--profile".to_string())),
        (None, Some(path)) => Some((
            match args.config.parent() {
                Some(dir) if path.is_relative() => dir.join(path),
                _ => path.clone(),
            },
            "proxy.profile".to_string(),
        )),
        (None, None) => None,
    };
    let drift = match profile {
        None if p.drift.is_some() => {
            return Err(ConfigError::new(
                f,
                "proxy.drift",
                "needs the upstream's profile (proxy.profile or --profile)",
            ))
        }
        None => None,
        Some((path, at)) => Some(drift_config(f, &path, &at, p.drift.unwrap_or_default())?),
    };
    let cfg = ProxyConfig {
        log,
        listen,
        upstream: up,
        credential,
        consumer_header,
        keys,
        unknown_consumer,
        limit_shape,
        max_body_bytes,
        default_max_tokens,
        header_read_timeout,
        body_read_timeout,
        upstream_timeout,
        stream_idle_timeout,
        lease,
        limiter,
        threads,
        state,
        time_scale: time_scale.0,
        on_limit,
        deadline_header,
        deadline_margin,
        upstream_ca_file,
        upstream_ca_pem,
        drain_timeout,
        drift,
    };
    Ok(cfg)
}

/// `[proxy.log]` and `--log-dir` (the flag wins for the directory; a
/// relative `dir` is relative to the config file).
fn log_config(
    f: &str,
    args: &ProxyArgs,
    raw: Option<RawLog>,
) -> Result<Option<qsim_live::record::LogConfig>, ConfigError> {
    let raw = match (raw, &args.log_dir) {
        (None, None) => return Ok(None),
        (r, _) => r.unwrap_or_default(),
    };
    let dir = match (&args.log_dir, &raw.dir) {
        (Some(d), _) => d.clone(),
        (None, Some(d)) => match args.config.parent() {
            Some(p) if d.is_relative() => p.join(d),
            _ => d.clone(),
        },
        (None, None) => {
            return Err(ConfigError::new(
                f,
                "proxy.log.dir",
                "missing (or give --log-dir)",
            ))
        }
    };
    // an existing path that is not a directory: a configuration error
    // naming what gave it (exit 2 before any port is bound)
    if dir.exists() && !dir.is_dir() {
        let given = if args.log_dir.is_some() {
            "--log-dir"
        } else {
            "proxy.log.dir"
        };
        return Err(ConfigError::new(
            f,
            given,
            format!("{}: not a directory", dir.display()),
        ));
    }
    let mb = |field: &str, v: Option<f64>, default: f64| {
        let x = v.unwrap_or(default);
        if x.is_finite() && x > 0.0 && x <= 1e7 {
            Ok((x * 1e6) as u64)
        } else {
            Err(ConfigError::new(
                f,
                field,
                format!("must be in (0, 1e7] MB, got {x}"),
            ))
        }
    };
    let max_file_bytes = mb("proxy.log.max_file_mb", raw.max_file_mb, 64.0)?;
    let max_total_bytes = mb("proxy.log.max_total_mb", raw.max_total_mb, 1024.0)?;
    if max_total_bytes < max_file_bytes {
        return Err(ConfigError::new(
            f,
            "proxy.log.max_total_mb",
            "must be at least max_file_mb",
        ));
    }
    let max_file_age = pos_secs(f, "proxy.log.max_file_age_s", raw.max_file_age_s, 60.0)?;
    let queue = match raw.queue {
        None => 65_536,
        Some(q) if (1..=(1 << 24)).contains(&q) => q as usize,
        Some(q) => {
            return Err(ConfigError::new(
                f,
                "proxy.log.queue",
                format!("must be in 1..=16777216, got {q}"),
            ))
        }
    };
    Ok(Some(qsim_live::record::LogConfig {
        dir,
        max_file_bytes,
        max_total_bytes,
        max_file_age,
        queue,
    }))
}

/// `--profile` / `proxy.profile` and `[proxy.drift]` → the shadow model's
/// factory and the alert's settings.
fn drift_config(
    f: &str,
    path: &std::path::Path,
    at: &str,
    raw: RawDrift,
) -> Result<qsim_live::DriftConfig, ConfigError> {
    use qsim_live::serve::Backend;
    use qsim_sim::serve_model::{load_profile, HostedBackend, Profile, ServerBackend};
    let profile = load_profile(path).map_err(|e| {
        if path.exists() {
            e
        } else {
            let why = format!("cannot read {}", path.display());
            if at.starts_with("--") {
                ConfigError::new(at, "", why)
            } else {
                ConfigError::new(f, at, why)
            }
        }
    })?;
    // replica k is seeded seed + k (default 1000: not `qsim serve`'s
    // default seed, whose draws would otherwise be copied exactly)
    let seed = raw.seed.unwrap_or(1000);
    let (name, backend): (String, qsim_live::ShadowFactory) = match profile {
        Profile::Hosted(p) => (
            p.name.clone(),
            std::sync::Arc::new(move |k| {
                // drift reads first-token and end times only
                Box::new(
                    HostedBackend::new(p.clone(), p.serve.clone(), seed.wrapping_add(k)).coarse(),
                ) as Box<dyn Backend>
            }),
        ),
        Profile::Server(p) => (
            p.name.clone(),
            std::sync::Arc::new(move |k| {
                Box::new(ServerBackend::new(
                    p.clone(),
                    p.serve.clone(),
                    seed.wrapping_add(k),
                )) as Box<dyn Backend>
            }),
        ),
    };
    let band = raw.band.unwrap_or([0.67, 1.5]);
    if !(band[0].is_finite()
        && band[1].is_finite()
        && band[0] > 0.0
        && band[0] <= 1.0
        && band[1] >= 1.0)
    {
        return Err(ConfigError::new(
            f,
            "proxy.drift.band",
            format!(
                "expected [low, high] with 0 < low <= 1 <= high, got [{}, {}]",
                band[0], band[1]
            ),
        ));
    }
    let ns = |d: Duration| d.as_nanos() as u64;
    let sustain = ns(pos_secs(f, "proxy.drift.for_s", raw.for_s, 60.0)?);
    let window = ns(pos_secs(f, "proxy.drift.window_s", raw.window_s, 30.0)?);
    let min_samples = match raw.min_samples {
        None => 20,
        Some(n) if (1..=1_000_000).contains(&n) => n as usize,
        Some(n) => {
            return Err(ConfigError::new(
                f,
                "proxy.drift.min_samples",
                format!("must be in 1..=1000000, got {n}"),
            ))
        }
    };
    let replicas = match raw.replicas {
        None => 4,
        Some(n) if (1..=64).contains(&n) => n as usize,
        Some(n) => {
            return Err(ConfigError::new(
                f,
                "proxy.drift.replicas",
                format!("must be in 1..=64, got {n}"),
            ))
        }
    };
    Ok(qsim_live::DriftConfig {
        profile: name,
        backend,
        band: (band[0], band[1]),
        sustain,
        window,
        min_samples,
        replicas,
    })
}

/// The consumers whose keys are still the placeholder `--emit-proxy-config`
/// writes (`key-NAME`): anyone who read the plan could use them.
pub fn placeholder_keys(cfg: &ProxyConfig) -> Vec<&str> {
    let names = &cfg.limiter.consumers;
    cfg.keys
        .iter()
        .filter(|(k, c)| k.strip_prefix("key-") == Some(names[*c].name.as_str()))
        .map(|(_, c)| names[*c].name.as_str())
        .collect()
}

/// [`load`], then refuse a config whose keys are still the emitted
/// placeholders (unless `--allow-placeholder-keys`: then a WARN on stderr).
pub fn load_checked(args: &ProxyArgs) -> Result<ProxyConfig, ConfigError> {
    let cfg = load(args)?;
    if let Some(name) = placeholder_keys(&cfg).first() {
        let f = args.config.display().to_string();
        let field = format!("proxy.keys.{name}");
        if !args.allow_placeholder_keys {
            return Err(ConfigError::new(
                &f,
                &field,
                format!(
                    "still the placeholder \"key-{name}\" that --emit-proxy-config writes: \
                     replace it with a secret key (--allow-placeholder-keys: accept it, for a local test)"
                ),
            ));
        }
        eprintln!(
            "qsim proxy: WARN {f}: {field}: the placeholder key \"key-{name}\" is in use \
             (--allow-placeholder-keys); anyone who read the plan can use it"
        );
    }
    Ok(cfg)
}

/// [`load`] again on SIGHUP: the same validation, its error as one line
/// (`qsim: FILE: FIELD: reason`, as at start).
pub fn reload(args: &ProxyArgs) -> Result<ProxyConfig, String> {
    load_checked(args).map_err(|e| {
        let e = crate::cli::common::name_fields(e, Some(&args.config), &[]);
        format!("qsim: {e}")
    })
}

fn accounting_name(a: OutputAccounting) -> &'static str {
    match a {
        OutputAccounting::ReserveRefund => "reserve_refund",
        OutputAccounting::ReserveNoRefund => "reserve_no_refund",
        OutputAccounting::OnCompletion => "on_completion",
    }
}

/// Every `[proxy]` setting: name, default, what it does. Written as
/// comments into the emitted config; docs/guide/proxy.md's table lists the
/// same (a test checks both).
pub const SETTINGS: &[(&str, &str, &str)] = &[
    ("listen", "\"127.0.0.1:8080\"", "address to listen on (port 0: any free port)"),
    ("upstream", "(required)", "upstream base URL, http[s]://host[:port][/prefix]; a /serving-endpoints suffix is not repeated"),
    ("credential_env", "(none)", "environment variable holding the upstream credential (sent as a bearer token)"),
    ("consumer_header", "\"authorization\"", "header identifying the consumer (default: Authorization: Bearer KEY)"),
    ("unknown_consumer", "\"reject\"", "a missing or unknown key: 401, or the name of a consumer whose policy applies"),
    ("limit_shape", "\"openai\"", "over-limit answer: \"openai\" (429 with retry headers) or \"fmapi\""),
    ("max_body_bytes", "1048576", "request bodies above this are answered 413"),
    ("default_max_tokens", "4096", "reserved when a request states no max_tokens"),
    ("header_read_timeout_s", "10", "a request head must arrive within this (also an idle keep-alive connection's limit), else the connection is closed"),
    ("body_read_timeout_s", "30", "a request body must arrive within this, else 408 and the connection closed"),
    ("upstream_timeout_s", "600", "until the upstream's response headers (then 504)"),
    ("stream_idle_timeout_s", "120", "longest upstream silence inside a response body"),
    ("lease_s", "600", "concurrency lease: a slot not released by then is reclaimed"),
    ("threads", "one per core", "worker threads"),
    ("state", "\"memory\"", "where the limiter state lives: \"memory\" or redis://HOST:PORT"),
    ("state_fail", "\"closed\"", "shared state unreachable: \"closed\" (503) or \"open\" (forward unlimited)"),
    ("time_scale", "1", "the limiter's clock runs this many times faster (tests)"),
    ("on_limit", "\"reject\"", "over-limit requests: \"reject\" (429) or \"wait\" (held up to max_wait_s)"),
    ("max_wait_s", "30", "longest a waiting request is held"),
    ("deadline_header", "(none)", "request header with the client's deadline in seconds (before x-stainless-timeout)"),
    ("deadline_margin_s", "0.05", "kept before a request's deadline for the upstream's first byte"),
    ("upstream_ca_file", "(none)", "PEM file of extra CA certificates for an https upstream"),
    ("drain_timeout_s", "30", "on SIGTERM/SIGINT: how long in-flight requests may take to finish"),
    ("profile", "(none)", "the upstream's profile: drift alerts ([proxy.drift])"),
    ("keys", "(required)", "[proxy.keys]: consumer name -> its bearer keys"),
    ("consumers", "(none)", "[proxy.consumers.NAME]: a consumer's own on_limit / max_wait_s"),
    ("log", "(off)", "[proxy.log]: the decision log (dir, max_file_mb 64, max_total_mb 1024, max_file_age_s 60, queue 65536)"),
    ("drift", "(off)", "[proxy.drift]: band [0.67, 1.5], for_s 60, window_s 30, min_samples 20, replicas 4, seed 1000"),
];

/// A proxy config enforcing `lim` (the limiter a plan sized): `[proxy]` with
/// placeholders to fill (upstream, keys), every other setting as a comment
/// with its default, then the limiter tables in the shared-deployment
/// schema, each consumer's effective limits spelled out.
pub fn emit_config(lim: &LimiterConfig, source: &str) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# qsim proxy config: the limiter sized by `qsim plan` ({source}).\n\
         # Run: qsim proxy --config THIS_FILE  (fill in upstream and keys first:\n\
         # qsim proxy refuses to start with the placeholder keys key-NAME)\n\
         kind = \"proxy\"\n\n\
         [proxy]\n\
         listen = \"127.0.0.1:8080\"\n\
         upstream = \"http://127.0.0.1:8000\"\n\
         limit_shape = \"openai\"\n\
         unknown_consumer = \"reject\"\n\
         # Every [proxy] setting, with its default (docs/guide/proxy.md):"
    );
    for (name, default, what) in SETTINGS {
        let _ = writeln!(s, "# {name:<22} default {default}: {what}");
    }
    let _ = writeln!(
        s,
        "\n# consumer name -> the bearer keys that identify it (replace these)\n[proxy.keys]"
    );
    for c in &lim.consumers {
        let _ = writeln!(s, "{} = [\"key-{}\"]", toml_key(&c.name), c.name);
    }
    let _ = writeln!(
        s,
        "\n[deployment]\ncapacity = {}\nunit = \"{}\"\nthreshold = {}",
        lim.capacity,
        lim.unit.name(),
        lim.threshold
    );
    if let Some(b) = lim.burst {
        let _ = writeln!(s, "burst = {b}");
    }
    let _ = writeln!(
        s,
        "semantics = \"{}\"\naccounting = \"{}\"",
        lim.semantics.name(),
        accounting_name(lim.accounting)
    );
    for c in &lim.consumers {
        let _ = writeln!(
            s,
            "\n[[consumer]]\nname = {}\nreserved_pct = {}",
            toml::Value::String(c.name.clone()),
            c.reserved_bp as f64 / 100.0
        );
        let p = c.policy;
        let fields = [
            ("rpm", p.rpm),
            ("tokens_per_hour", p.tokens_per_hour),
            ("concurrent", p.concurrent.map(u64::from)),
            ("max_input_tokens", p.max_input_tokens),
        ];
        if fields.iter().any(|(_, v)| v.is_some()) {
            let _ = writeln!(s, "[consumer.limits]");
            for (k, v) in fields {
                if let Some(v) = v {
                    let _ = writeln!(s, "{k} = {v}");
                }
            }
        }
    }
    s
}

fn toml_key(k: &str) -> String {
    if !k.is_empty()
        && k.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        k.to_string()
    } else {
        toml::Value::String(k.to_string()).to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn emitted_config_loads_back_to_the_same_limiter() {
        let (f, _) = qsim_sim::plan::build(&qsim_sim::plan::PlanSpec {
            capacity: Some("1000".into()),
            reserve: Some("30,20,30".into()),
            ..Default::default()
        })
        .unwrap();
        let text = emit_config(&f.limiter, "test");
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("proxy.toml");
        // as emitted: `qsim proxy` refuses the placeholder keys, naming the field
        std::fs::write(&p, &text).unwrap();
        let args = ProxyArgs {
            config: p.clone(),
            ..Default::default()
        };
        let e = load_checked(&args).unwrap_err();
        assert_eq!(e.source, p.display().to_string());
        assert!(e.field.starts_with("proxy.keys."), "{e:?}");
        assert!(e.reason.contains("placeholder"), "{e:?}");
        assert!(load_checked(&ProxyArgs {
            allow_placeholder_keys: true,
            ..args.clone()
        })
        .is_ok());
        // the keys filled in: it loads back to the same limiter
        let filled = text.replace("[\"key-", "[\"secret-");
        assert_ne!(filled, text);
        std::fs::write(&p, &filled).unwrap();
        let cfg = load_checked(&args).unwrap();
        assert_eq!(cfg.limiter, f.limiter);
        assert_eq!(cfg.keys.len(), f.limiter.consumers.len());
        assert!(placeholder_keys(&cfg).is_empty());
    }

    #[test]
    fn every_setting_is_in_the_emitted_config_and_the_guide() {
        let guide = include_str!("../../docs/guide/proxy.md");
        let (f, _) = qsim_sim::plan::build(&qsim_sim::plan::PlanSpec {
            capacity: Some("1000".into()),
            ..Default::default()
        })
        .unwrap();
        let text = emit_config(&f.limiter, "test");
        for (name, default, _) in SETTINGS {
            assert!(
                text.contains(&format!("# {name} ")),
                "{name} not in the emitted config"
            );
            let row = format!("| `{name}` | {default} |");
            assert!(
                guide.contains(&row),
                "docs/guide/proxy.md has no row {row:?}"
            );
        }
        // every field RawProxy accepts is listed (a config with each one
        // set to a wrong type fails on that field, not as unknown)
        for (name, _, _) in SETTINGS {
            let t = format!("{name} = []");
            let v: toml::Value = toml::from_str(&t).unwrap();
            let e = serde_json::to_string(&v).unwrap();
            let r: Result<RawProxy, _> = serde_json::from_str(&e);
            let msg = r.err().map(|e| e.to_string()).unwrap_or_default();
            assert!(!msg.contains("unknown field"), "{name}: {msg}");
        }
    }
}
