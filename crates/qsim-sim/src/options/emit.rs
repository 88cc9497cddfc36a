//! `qsim options FILE --emit-proxy-config OUT`: a proxy config
//! (`kind = "proxy"`) whose routes are an option's — the cheapest hybrid
//! that meets the targets, as sized — with the per-consumer limiter in
//! front of them (one consumer taking every request, at the workload's
//! peak rate with a quarter's headroom: add consumers and keys as the
//! proxy guide shows). Each upstream's `url` and `credential_env` are
//! placeholders to fill in; its limits, spill threshold, timeout, cooldown
//! and breaker are the ones simulated.

use super::{open, DeployOption, Kind, OptionsFile};
use crate::plan::routes::{self, Routes, UpstreamExtra};

/// The proxy config of option `o` of `file` (a route option).
pub fn proxy_config(file: &OptionsFile, o: &DeployOption, source: &str) -> Result<String, String> {
    let (Kind::Route(r), Some(w)) = (&o.kind, &file.workload) else {
        return Err(format!(
            "option {:?} has no routes: --emit-proxy-config needs a [workload] file",
            o.name
        ));
    };
    let routes = Routes {
        core: r.core.clone(),
        extra: r
            .ups
            .iter()
            .map(|u| UpstreamExtra {
                profile: match u {
                    open::Up::Hosted(p) => Some(p.clone()),
                    open::Up::Replicas { .. } => None,
                },
                profile_path: None,
                url: String::new(),
                credential_env: None,
                stream_idle_timeout: crate::time::secs(120.0),
                probe_path: "/v1/models".into(),
                down: Vec::new(),
            })
            .collect(),
    };
    let peak = (w.rpm * 1.25).ceil().max(1.0) as u64;
    let mut s = format!(
        "# qsim proxy config: the routes of option {name:?} ({kind}), as `qsim options`\n\
         # sized them ({source}). Fill in each upstream's url and credential_env,\n\
         # then: qsim proxy --config THIS_FILE\n\
         kind = \"proxy\"\n\n\
         [proxy]\n\
         listen = \"127.0.0.1:8080\"\n\
         limit_shape = \"openai\"\n\
         # every request is consumer \"all\" (give consumers keys: docs/guide/proxy.md)\n\
         unknown_consumer = \"all\"\n\n\
         # the per-consumer limiter in front of the routes: the workload's peak\n\
         # ({rpm} RPM) and a quarter's headroom\n\
         [deployment]\n\
         capacity = {peak}\n\
         unit = \"rpm\"\n\
         semantics = \"rate-limit-only\"\n\n\
         [[consumer]]\n\
         name = \"all\"\n\n",
        name = o.name,
        kind = super::route_kind(r),
        rpm = w.rpm,
    );
    s.push_str(&routes::emit(&routes));
    Ok(s)
}

/// The option whose routes `--emit-proxy-config` writes: the cheapest
/// hybrid meeting `targets`, else the cheapest option meeting them (with
/// its searched count, when `--fewest` found one); rows are `(option
/// index, count, outcome)`. None when no route option meets the targets.
pub fn chosen(
    file: &OptionsFile,
    rows: &[(usize, Option<u64>, &super::Outcome)],
    targets: &super::Targets,
) -> Option<DeployOption> {
    let meets = |r: &&(usize, Option<u64>, &super::Outcome)| {
        targets.missed(r.2).is_none()
            && r.2.cost_usd.is_some()
            && matches!(file.options[r.0].kind, Kind::Route(_))
    };
    let cheapest = |hybrid: bool| {
        rows.iter()
            .filter(meets)
            .filter(|r| super::is_hybrid(&file.options[r.0]) == hybrid)
            .fold(
                None,
                |b: Option<&(usize, Option<u64>, &super::Outcome)>, r| match b {
                    Some(b) if b.2.cost_usd <= r.2.cost_usd => Some(b),
                    _ => Some(r),
                },
            )
    };
    let (i, n, _) = cheapest(true).or_else(|| cheapest(false))?;
    let o = &file.options[*i];
    Some(match n {
        Some(n) => super::fewest::with_count(o, *n),
        None => o.clone(),
    })
}
