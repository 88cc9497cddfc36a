//! Routes and upstreams: the `[[upstream]]` and `[[route]]` tables of a
//! proxy config (`kind = "proxy"`) and of a hosted experiment file, parsed
//! and validated once into the core's [`gateway::Config`] — the config the
//! proxy and the simulation both drive (`qsim_core::gateway`).
//!
//! ```toml
//! [[upstream]]
//! name = "ptu"
//! profile = "../models/azure-openai-gpt-4o-ptu.toml"  # its limits (and, simulated, its model)
//! provisioned = { units = 30 }          # the profile's units replaced
//! limits = [ { name = "RPM", counts = "requests", limit = 2700, window_s = 60 } ]
//! max_in_flight = 64                    # unanswered requests at once
//! timeout_s = 60                        # until the reply's head (then a timeout)
//! cooldown_s = 5                        # after a failure, or a 429 without a hint
//! breaker = { failures = 3, open_s = 30, probes = 1 }
//! probe_interval_s = 5                  # probe it this often while unhealthy
//! url = "https://…"                     # the proxy's: base URL,
//! credential_env = "PTU_KEY"            #   credential (or credential = "none"),
//! stream_idle_timeout_s = 120           #   longest silence inside an answer,
//! probe_path = "/health"                #   what a probe GETs
//! down = [[600, 900]]                   # the simulation's: outages (s)
//!
//! [[route]]
//! model = "*"                           # a model name, or "*" for any other
//! upstreams = ["ptu", "paygo"]
//! policy = "first"                      # or "weighted", with weights = [3, 1]
//! fallback = "gpt-4o-mini"              # another route: its upstreams after these
//! max_attempts = 2                      # default: every upstream of the route
//! ```
//!
//! A route's tiers are its own upstreams, then its fallback route's (and
//! that one's fallback's …), an upstream already in an earlier tier left
//! out. Errors name the field: an unknown upstream or fallback, a fallback
//! cycle, a weight that is not a positive integer, an upstream of a proxy
//! without `url` or without credentials (`credential_env`, or
//! `credential = "none"` for one that needs none).

use crate::config::{duration_s, read_toml, resolve_relative, ConfigError};
use crate::hosted::provisioned::RawOverride;
use crate::hosted::HostedProfile;
use crate::limiter::rates::{Counts, LimitSpec, OutputAccounting};
use crate::time::{secs, Nanos};
use qsim_core::gateway::{Breaker, Config, Route, Tier, Upstream, ANY_MODEL};
use qsim_core::route::Policy;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

/// Which door reads the tables: the proxy's fields (`url`, credentials,
/// `stream_idle_timeout_s`, `probe_path`) or the simulation's (`down`;
/// `profile` required: it is the upstream's model).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Door {
    Proxy,
    Sim,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLimit {
    name: String,
    counts: Counts,
    limit: i64,
    window_s: f64,
    #[serde(default)]
    accounting: OutputAccounting,
}

#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct RawBreaker {
    failures: Option<i64>,
    open_s: Option<f64>,
    probes: Option<i64>,
}

/// One `[[upstream]]` table as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawUpstream {
    pub name: String,
    pub profile: Option<String>,
    provisioned: Option<RawOverride>,
    #[serde(default)]
    limits: Vec<RawLimit>,
    max_in_flight: Option<i64>,
    timeout_s: Option<f64>,
    cooldown_s: Option<f64>,
    breaker: Option<RawBreaker>,
    probe_interval_s: Option<f64>,
    // the proxy's
    pub url: Option<String>,
    pub credential_env: Option<String>,
    pub credential: Option<String>,
    stream_idle_timeout_s: Option<f64>,
    probe_path: Option<String>,
    // the simulation's
    down: Option<Vec<[f64; 2]>>,
}

/// One `[[route]]` table as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRoute {
    model: String,
    upstreams: Vec<String>,
    policy: Option<String>,
    weights: Option<Vec<i64>>,
    fallback: Option<String>,
    max_attempts: Option<i64>,
}

/// What an upstream has besides its decision settings.
#[derive(Debug, Clone)]
pub struct UpstreamExtra {
    /// The profile it was given (its limits are in the core config; the
    /// simulation runs its model).
    pub profile: Option<Arc<HostedProfile>>,
    pub profile_path: Option<String>,
    /// The proxy's: base URL (no trailing slash), the environment variable
    /// holding its credential (None: `credential = "none"`), stream idle
    /// timeout, probe path.
    pub url: String,
    pub credential_env: Option<String>,
    pub stream_idle_timeout: Nanos,
    pub probe_path: String,
    /// The simulation's outages, `[from, to)` in ns, sorted, disjoint.
    pub down: Vec<(Nanos, Nanos)>,
}

/// Validated upstreams and routes.
#[derive(Debug, Clone)]
pub struct Routes {
    pub core: Config,
    pub extra: Vec<UpstreamExtra>,
}

/// Defaults that come from elsewhere in the file (`[proxy]`'s timeouts).
#[derive(Debug, Clone, Copy)]
pub struct Defaults {
    pub timeout: Nanos,
    pub stream_idle_timeout: Nanos,
}

impl Default for Defaults {
    fn default() -> Self {
        Defaults {
            timeout: secs(600.0),
            stream_idle_timeout: secs(120.0),
        }
    }
}

/// Default cooldown after a failure, or a 429 without a hint.
pub const DEFAULT_COOLDOWN_S: f64 = 5.0;
/// Default breaker: opens after 3 consecutive failures, for 30 s, one probe.
pub const DEFAULT_BREAKER: (u32, f64, u32) = (3, 30.0, 1);

fn list(names: impl Iterator<Item = String>) -> String {
    names.collect::<Vec<_>>().join(", ")
}

/// Parse and check `upstreams` and `routes` of `file` (the file they are
/// in: profiles are resolved against it).
pub fn parse(
    file: &Path,
    upstreams: &[RawUpstream],
    routes: &[RawRoute],
    door: Door,
    d: Defaults,
) -> Result<Routes, ConfigError> {
    let fname = file.display().to_string();
    let f = fname.as_str();
    if upstreams.is_empty() {
        return Err(ConfigError::new(
            f,
            "upstream",
            "at least one [[upstream]] is needed with [[route]]",
        ));
    }
    if routes.is_empty() {
        return Err(ConfigError::new(
            f,
            "route",
            "at least one [[route]] is needed with [[upstream]]",
        ));
    }
    let mut core_ups = Vec::with_capacity(upstreams.len());
    let mut extra = Vec::with_capacity(upstreams.len());
    let mut by_name: BTreeMap<&str, usize> = BTreeMap::new();
    for (i, u) in upstreams.iter().enumerate() {
        let at = |x: &str| format!("upstream[{i}].{x}");
        let err = |x: &str, r: String| ConfigError::new(f, at(x), r);
        if u.name.trim().is_empty()
            || u.name.trim() != u.name
            || u.name.contains([',', ';'])
            || by_name.contains_key(u.name.as_str())
        {
            return Err(err(
                "name",
                format!(
                    "must be a non-empty name (no surrounding spaces, commas or semicolons) used once, got {:?}",
                    u.name
                ),
            ));
        }
        by_name.insert(u.name.as_str(), i);
        // fields of the other door
        let wrong: &[(&str, bool)] = match door {
            Door::Proxy => &[("down", u.down.is_some())],
            Door::Sim => &[
                ("url", u.url.is_some()),
                ("credential_env", u.credential_env.is_some()),
                ("credential", u.credential.is_some()),
                ("stream_idle_timeout_s", u.stream_idle_timeout_s.is_some()),
                ("probe_path", u.probe_path.is_some()),
            ],
        };
        if let Some((name, _)) = wrong.iter().find(|(_, set)| *set) {
            return Err(err(
                name,
                match door {
                    Door::Proxy => "a simulation's field (outages): not in a proxy config".into(),
                    Door::Sim => "a proxy's field: a simulated upstream is its `profile`".into(),
                },
            ));
        }
        // the profile: its limits (and, simulated, its model)
        let profile = match &u.profile {
            None => {
                if door == Door::Sim {
                    return Err(err(
                        "profile",
                        "missing: the hosted profile that simulates this upstream".into(),
                    ));
                }
                if u.provisioned.is_some() {
                    return Err(err(
                        "provisioned",
                        "overrides a profile's [provisioned] table: give `profile`".into(),
                    ));
                }
                None
            }
            Some(p) => {
                let path = resolve_relative(file, p);
                if let Some(why) = crate::config::source_problem("hosted profile", &path) {
                    return Err(err("profile", why));
                }
                let v = read_toml(&path)?;
                let mut prof = HostedProfile::from_value(&path.display().to_string(), v)?;
                if let Some(o) = &u.provisioned {
                    prof.override_provisioned(f, o)
                        .map_err(|e| ConfigError::new(f, at(&e.field), e.reason))?;
                }
                Some((Arc::new(prof), path.display().to_string()))
            }
        };
        let mut limits: Vec<LimitSpec> = profile
            .as_ref()
            .map(|(p, _)| p.limits.clone())
            .unwrap_or_default();
        for (k, l) in u.limits.iter().enumerate() {
            let lf = |x: &str| at(&format!("limits[{k}].{x}"));
            if l.limit <= 0 {
                return Err(ConfigError::new(
                    f,
                    lf("limit"),
                    format!("must be > 0, got {}", l.limit),
                ));
            }
            duration_s(f, &lf("window_s"), l.window_s, true)?;
            if l.name.trim().is_empty() || limits.iter().any(|x| x.name == l.name) {
                return Err(ConfigError::new(
                    f,
                    lf("name"),
                    format!(
                        "must be a non-empty name not already a limit, got {:?}",
                        l.name
                    ),
                ));
            }
            limits.push(LimitSpec {
                name: l.name.clone(),
                counts: l.counts,
                limit: l.limit as u64,
                window: secs(l.window_s),
                accounting: l.accounting,
            });
        }
        let max_in_flight = match u.max_in_flight {
            None => None,
            Some(m) if (1..=1_000_000).contains(&m) => Some(m as u64),
            Some(m) => {
                return Err(err(
                    "max_in_flight",
                    format!("must be in 1..=1000000, got {m}"),
                ))
            }
        };
        let pos = |x: &str, v: Option<f64>, dflt: Nanos| -> Result<Nanos, ConfigError> {
            match v {
                None => Ok(dflt),
                Some(s) => {
                    duration_s(f, &at(x), s, true)?;
                    Ok(secs(s))
                }
            }
        };
        let timeout = pos("timeout_s", u.timeout_s, d.timeout)?;
        let cooldown = match u.cooldown_s {
            None => secs(DEFAULT_COOLDOWN_S),
            Some(s) => secs(duration_s(f, &at("cooldown_s"), s, false)?),
        };
        let b = u.breaker.clone().unwrap_or_default();
        let failures = match b.failures {
            None => DEFAULT_BREAKER.0,
            Some(x) if (0..=1_000_000).contains(&x) => x as u32,
            Some(x) => {
                return Err(err(
                    "breaker.failures",
                    format!("must be in 0..=1000000 (0: never opens), got {x}"),
                ))
            }
        };
        let open_for = pos("breaker.open_s", b.open_s, secs(DEFAULT_BREAKER.1))?;
        let probes = match b.probes {
            None => DEFAULT_BREAKER.2,
            Some(x) if (1..=1_000_000).contains(&x) => x as u32,
            Some(x) => {
                return Err(err(
                    "breaker.probes",
                    format!("must be in 1..=1000000, got {x}"),
                ))
            }
        };
        let probe_every = match u.probe_interval_s {
            None => None,
            Some(s) => Some(pos("probe_interval_s", Some(s), 0)?),
        };
        // the proxy's: where and as whom
        let url = match (door, &u.url) {
            (Door::Proxy, None) => {
                return Err(err(
                    "url",
                    "missing: the upstream's base URL, http[s]://host[:port][/prefix]".into(),
                ))
            }
            (Door::Proxy, Some(x)) => {
                let x = x.trim_end_matches('/').to_string();
                let rest = x
                    .strip_prefix("http://")
                    .or_else(|| x.strip_prefix("https://"))
                    .unwrap_or("");
                if rest.is_empty() || rest.starts_with('/') || rest.contains(char::is_whitespace) {
                    return Err(err(
                        "url",
                        format!("expected http[s]://host[:port][/prefix], got {x:?}"),
                    ));
                }
                x
            }
            (Door::Sim, _) => String::new(),
        };
        let credential_env = match (door, &u.credential_env, u.credential.as_deref()) {
            (Door::Sim, ..) => None,
            (Door::Proxy, Some(_), Some(_)) => {
                return Err(err(
                    "credential",
                    "give either credential_env or credential = \"none\", not both".into(),
                ))
            }
            (Door::Proxy, Some(v), None) if !v.trim().is_empty() => Some(v.clone()),
            (Door::Proxy, Some(_), None) => {
                return Err(err(
                    "credential_env",
                    "must name an environment variable".into(),
                ))
            }
            (Door::Proxy, None, Some("none")) => None,
            (Door::Proxy, None, Some(o)) => {
                return Err(err(
                    "credential",
                    format!("only \"none\" (no credential) is allowed here, got {o:?}: put a credential in an environment variable and name it in credential_env"),
                ))
            }
            (Door::Proxy, None, None) => {
                return Err(err(
                    "credential_env",
                    "missing: the environment variable holding this upstream's credential (or credential = \"none\" for an upstream that needs none)".into(),
                ))
            }
        };
        let stream_idle_timeout = pos(
            "stream_idle_timeout_s",
            u.stream_idle_timeout_s,
            d.stream_idle_timeout,
        )?;
        let probe_path = match &u.probe_path {
            None => "/v1/models".to_string(),
            Some(p) if p.starts_with('/') && !p.contains(char::is_whitespace) => p.clone(),
            Some(p) => {
                return Err(err(
                    "probe_path",
                    format!("expected a path starting with /, got {p:?}"),
                ))
            }
        };
        let mut down = Vec::new();
        for (k, w) in u.down.iter().flatten().enumerate() {
            let df = at(&format!("down[{k}]"));
            let a = duration_s(f, &df, w[0], false)?;
            let b = duration_s(f, &df, w[1], false)?;
            if b <= a || down.last().is_some_and(|&(_, e)| secs(a) < e) {
                return Err(ConfigError::new(
                    f,
                    df,
                    format!("expected [from_s, to_s] with from < to, after the previous outage, got [{a}, {b}]"),
                ));
            }
            down.push((secs(a), secs(b)));
        }
        core_ups.push(Upstream {
            name: u.name.clone(),
            limits,
            max_in_flight,
            timeout,
            cooldown,
            breaker: Breaker {
                failures,
                open_for,
                probes,
            },
            probe_every,
        });
        let (profile, profile_path) = match profile {
            Some((p, path)) => (Some(p), Some(path)),
            None => (None, None),
        };
        extra.push(UpstreamExtra {
            profile,
            profile_path,
            url,
            credential_env,
            stream_idle_timeout,
            probe_path,
            down,
        });
    }
    // routes: their own tier, then the fallbacks'
    let mut by_model: BTreeMap<&str, usize> = BTreeMap::new();
    let mut own: Vec<Tier> = Vec::with_capacity(routes.len());
    for (r, rt) in routes.iter().enumerate() {
        let at = |x: &str| format!("route[{r}].{x}");
        if rt.model.trim().is_empty() || by_model.contains_key(rt.model.as_str()) {
            return Err(ConfigError::new(
                f,
                at("model"),
                format!(
                    "must be a non-empty model name (or \"{ANY_MODEL}\") used once, got {:?}",
                    rt.model
                ),
            ));
        }
        by_model.insert(rt.model.as_str(), r);
        if rt.upstreams.is_empty() {
            return Err(ConfigError::new(
                f,
                at("upstreams"),
                "at least one upstream is needed",
            ));
        }
        let mut idx = Vec::with_capacity(rt.upstreams.len());
        for (k, n) in rt.upstreams.iter().enumerate() {
            let Some(&u) = by_name.get(n.as_str()) else {
                return Err(ConfigError::new(
                    f,
                    at(&format!("upstreams[{k}]")),
                    format!(
                        "no upstream named {n:?}; the file has {}",
                        list(upstreams.iter().map(|u| format!("{:?}", u.name)))
                    ),
                ));
            };
            if idx.contains(&u) {
                return Err(ConfigError::new(
                    f,
                    at(&format!("upstreams[{k}]")),
                    format!("upstream {n:?} is named twice"),
                ));
            }
            idx.push(u);
        }
        let policy = match (rt.policy.as_deref(), &rt.weights) {
            (None | Some("first"), None) => Policy::First,
            (None | Some("first"), Some(_)) => {
                return Err(ConfigError::new(
                    f,
                    at("weights"),
                    "weights need policy = \"weighted\"",
                ))
            }
            (Some("weighted"), None) => {
                return Err(ConfigError::new(
                    f,
                    at("weights"),
                    "missing: one positive integer weight per upstream",
                ))
            }
            (Some("weighted"), Some(w)) => {
                if w.len() != idx.len() {
                    return Err(ConfigError::new(
                        f,
                        at("weights"),
                        format!(
                            "one weight per upstream: {} weights for {} upstreams",
                            w.len(),
                            idx.len()
                        ),
                    ));
                }
                if let Some((k, x)) = w.iter().enumerate().find(|(_, &x)| x <= 0) {
                    return Err(ConfigError::new(
                        f,
                        at(&format!("weights[{k}]")),
                        format!("must be a positive integer, got {x}"),
                    ));
                }
                Policy::Weighted(w.iter().map(|&x| x as u64).collect())
            }
            (Some(p), _) => {
                return Err(ConfigError::new(
                    f,
                    at("policy"),
                    format!("expected \"first\" or \"weighted\", got {p:?}"),
                ))
            }
        };
        own.push(Tier {
            upstreams: idx,
            policy,
        });
    }
    let mut core_routes = Vec::with_capacity(routes.len());
    for (r, rt) in routes.iter().enumerate() {
        let at = |x: &str| format!("route[{r}].{x}");
        // follow the fallbacks: a route seen twice is a cycle
        let mut chain = vec![r];
        let mut cur = r;
        while let Some(fb) = &routes[cur].fallback {
            let Some(&next) = by_model.get(fb.as_str()) else {
                return Err(ConfigError::new(
                    f,
                    format!("route[{cur}].fallback"),
                    format!(
                        "no route for model {fb:?}; the file has {}",
                        list(routes.iter().map(|r| format!("{:?}", r.model)))
                    ),
                ));
            };
            if chain.contains(&next) {
                chain.push(next);
                return Err(ConfigError::new(
                    f,
                    format!("route[{cur}].fallback"),
                    format!(
                        "a fallback cycle: {}",
                        chain
                            .iter()
                            .map(|&i| format!("{:?}", routes[i].model))
                            .collect::<Vec<_>>()
                            .join(" -> ")
                    ),
                ));
            }
            chain.push(next);
            cur = next;
        }
        let mut seen: Vec<usize> = Vec::new();
        let mut tiers = Vec::with_capacity(chain.len());
        for &c in &chain {
            let t = &own[c];
            let keep: Vec<usize> = (0..t.upstreams.len())
                .filter(|&k| !seen.contains(&t.upstreams[k]))
                .collect();
            if keep.is_empty() {
                continue;
            }
            let ups: Vec<usize> = keep.iter().map(|&k| t.upstreams[k]).collect();
            seen.extend(&ups);
            let policy = match &t.policy {
                Policy::Weighted(w) => Policy::Weighted(keep.iter().map(|&k| w[k]).collect()),
                p => p.clone(),
            };
            tiers.push(Tier {
                upstreams: ups,
                policy,
            });
        }
        if seen.len() > qsim_core::gateway::MAX_ROUTE_UPSTREAMS {
            return Err(ConfigError::new(
                f,
                at("upstreams"),
                format!(
                    "at most {} upstreams per route (fallbacks included), got {}",
                    qsim_core::gateway::MAX_ROUTE_UPSTREAMS,
                    seen.len()
                ),
            ));
        }
        let max_attempts = match rt.max_attempts {
            None => seen.len() as u32,
            Some(m) if m >= 1 && m as usize <= seen.len() => m as u32,
            Some(m) => {
                return Err(ConfigError::new(
                    f,
                    at("max_attempts"),
                    format!(
                        "must be in 1..={} (the route's upstreams, fallbacks included), got {m}",
                        seen.len()
                    ),
                ))
            }
        };
        core_routes.push(Route {
            model: rt.model.clone(),
            tiers,
            max_attempts,
        });
    }
    let core = Config {
        upstreams: core_ups,
        routes: core_routes,
    };
    // the core's own rules (none should fail after the checks above)
    core.check()
        .map_err(|e| ConfigError::new(f, e.field, e.reason))?;
    Ok(Routes { core, extra })
}

/// The `[[upstream]]` and `[[route]]` tables that give `routes` again (for
/// `--emit-proxy-config`): limits written out, the proxy's fields as
/// placeholders to fill (`url`, `credential_env`).
pub fn emit(routes: &Routes) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let q = |x: &str| toml::Value::String(x.to_string()).to_string();
    let num = |ns: Nanos| {
        let v = ns as f64 / 1e9;
        format!("{v}")
    };
    for (u, x) in routes.core.upstreams.iter().zip(&routes.extra) {
        let _ = writeln!(s, "[[upstream]]\nname = {}", q(&u.name));
        let _ = writeln!(
            s,
            "url = \"http://127.0.0.1:8000\"   # fill in\ncredential_env = {}   # fill in (or credential = \"none\")",
            q(&format!("{}_KEY", u.name.to_ascii_uppercase().replace(|c: char| !c.is_ascii_alphanumeric(), "_")))
        );
        if let Some(p) = &x.profile {
            let _ = writeln!(s, "# limits of the profile {:?}", p.name);
        }
        if !u.limits.is_empty() {
            let _ = writeln!(s, "limits = [");
            for l in &u.limits {
                let counts = match l.counts {
                    Counts::Requests => "requests",
                    Counts::InputTokens => "input_tokens",
                    Counts::OutputTokens => "output_tokens",
                    Counts::Tokens => "tokens",
                };
                let acc = match l.accounting {
                    OutputAccounting::ReserveRefund => "reserve_refund",
                    OutputAccounting::ReserveNoRefund => "reserve_no_refund",
                    OutputAccounting::OnCompletion => "on_completion",
                };
                let _ = writeln!(
                    s,
                    "  {{ name = {}, counts = \"{counts}\", limit = {}, window_s = {}, accounting = \"{acc}\" }},",
                    q(&l.name),
                    l.limit,
                    num(l.window)
                );
            }
            let _ = writeln!(s, "]");
        }
        if let Some(m) = u.max_in_flight {
            let _ = writeln!(s, "max_in_flight = {m}");
        }
        let _ = writeln!(
            s,
            "timeout_s = {}\ncooldown_s = {}\nbreaker = {{ failures = {}, open_s = {}, probes = {} }}",
            num(u.timeout),
            num(u.cooldown),
            u.breaker.failures,
            num(u.breaker.open_for),
            u.breaker.probes
        );
        if let Some(p) = u.probe_every {
            let _ = writeln!(s, "probe_interval_s = {}", num(p));
        }
        s.push('\n');
    }
    // one route per model: the flattened tiers, first tier's policy kept
    // (fallback routes are written as they were flattened: each route's
    // upstreams tier by tier; tiers after the first become fallbacks only
    // when they are another route's, which this form cannot know, so a
    // route's tiers are written as one ordered list when every tier is
    // `first`)
    for r in &routes.core.routes {
        let names: Vec<String> = r
            .upstreams()
            .map(|u| q(&routes.core.upstreams[u].name))
            .collect();
        let _ = writeln!(
            s,
            "[[route]]\nmodel = {}\nupstreams = [{}]",
            q(&r.model),
            names.join(", ")
        );
        match (r.tiers.len(), &r.tiers[0].policy) {
            (1, Policy::Weighted(w)) => {
                let ws: Vec<String> = w.iter().map(|x| x.to_string()).collect();
                let _ = writeln!(s, "policy = \"weighted\"\nweights = [{}]", ws.join(", "));
            }
            _ => {
                let _ = writeln!(s, "policy = \"first\"");
            }
        }
        let _ = writeln!(s, "max_attempts = {}\n", r.max_attempts);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_str(text: &str, door: Door) -> Result<Routes, ConfigError> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct F {
            #[serde(default)]
            upstream: Vec<RawUpstream>,
            #[serde(default)]
            route: Vec<RawRoute>,
        }
        let v: toml::Value = toml::from_str(text).unwrap();
        let f: F = crate::config::from_value("t.toml", v)?;
        parse(
            Path::new("t.toml"),
            &f.upstream,
            &f.route,
            door,
            Defaults::default(),
        )
    }

    const TWO: &str = r#"
[[upstream]]
name = "a"
url = "http://127.0.0.1:1"
credential = "none"
limits = [ { name = "RPM", counts = "requests", limit = 10, window_s = 60 } ]
[[upstream]]
name = "b"
url = "http://127.0.0.1:2"
credential_env = "B_KEY"
[[upstream]]
name = "c"
url = "http://127.0.0.1:3"
credential = "none"
[[route]]
model = "*"
upstreams = ["a", "b"]
fallback = "small"
[[route]]
model = "small"
upstreams = ["c", "a"]
policy = "weighted"
weights = [2, 1]
"#;

    #[test]
    fn fallbacks_flatten_into_tiers() {
        let r = parse_str(TWO, Door::Proxy).unwrap();
        let any = &r.core.routes[0];
        assert_eq!(any.tiers.len(), 2);
        assert_eq!(any.tiers[0].upstreams, [0, 1]);
        // "a" already in the first tier: the fallback's tier keeps "c" and its weight
        assert_eq!(any.tiers[1].upstreams, [2]);
        assert_eq!(any.tiers[1].policy, Policy::Weighted(vec![2]));
        assert_eq!(any.max_attempts, 3);
        assert_eq!(r.core.routes[1].max_attempts, 2);
        assert_eq!(r.extra[1].credential_env.as_deref(), Some("B_KEY"));
        assert_eq!(r.core.upstreams[0].limits.len(), 1);
    }

    #[test]
    fn bad_routes_name_the_field() {
        let cases: &[(&str, &str, &str)] = &[
            (
                "upstreams = [\"a\", \"b\"]\nfallback",
                "upstreams = [\"a\", \"x\"]\nfallback",
                "route.0.upstreams.1",
            ),
            (
                "model = \"small\"\nupstreams = [\"c\", \"a\"]",
                "model = \"small\"\nfallback = \"*\"\nupstreams = [\"c\", \"a\"]",
                "route.1.fallback",
            ),
            ("weights = [2, 1]", "weights = [2, 0]", "route.1.weights.1"),
            ("weights = [2, 1]", "weights = [2, -3]", "route.1.weights.1"),
            (
                "credential_env = \"B_KEY\"\n",
                "\n",
                "upstream.1.credential_env",
            ),
            (
                "fallback = \"small\"",
                "fallback = \"big\"",
                "route.0.fallback",
            ),
            ("name = \"c\"", "name = \"a\"", "upstream.2.name"),
        ];
        for (from, to, field) in cases {
            assert!(TWO.contains(from), "{from}");
            let text = TWO.replacen(from, to, 1);
            let e = parse_str(&text, Door::Proxy).unwrap_err();
            assert_eq!(&e.field, field, "{to}: {e:?}");
        }
        let e = parse_str(
            &TWO.replacen(
                "fallback = \"small\"",
                "fallback = \"small\"\nmax_attempts = 4",
                1,
            ),
            Door::Proxy,
        )
        .unwrap_err();
        assert_eq!(e.field, "route.0.max_attempts");
        assert!(e.reason.contains("1..=3"), "{e:?}");
        // a cycle names its models
        let e = parse_str(
            &TWO.replacen(
                "model = \"small\"\n",
                "model = \"small\"\nfallback = \"*\"\n",
                1,
            ),
            Door::Proxy,
        )
        .unwrap_err();
        assert!(e.reason.contains("\"*\" -> \"small\" -> \"*\""), "{e:?}");
        // the simulation refuses the proxy's fields
        let e = parse_str(TWO, Door::Sim).unwrap_err();
        assert_eq!(e.field, "upstream.0.url");
    }

    #[test]
    fn emitted_tables_parse_back_to_the_same_config() {
        let r = parse_str(&TWO.replace("fallback = \"small\"\n", ""), Door::Proxy).unwrap();
        let text = emit(&r);
        let back = parse_str(&text, Door::Proxy).unwrap();
        assert_eq!(back.core, r.core, "{text}");
    }
}
