//! `qsim proxy`'s routes: the `[[upstream]]` and `[[route]]` tables, parsed
//! and checked by `qsim_sim::plan::routes` (the schema the simulation
//! reads too), each credential read from its environment variable here
//! (a process concern), → `qsim_live::Routes`. Without tables, the single
//! `[proxy] upstream` as one route.

use qsim_live::{Routes, UpstreamHttp};
use qsim_sim::config::ConfigError;
use qsim_sim::plan::config::{RawRoute, RawUpstream};
use qsim_sim::plan::routes::{self, Defaults, Door};
use std::path::Path;
use std::time::Duration;

/// The routes of a proxy config (`single`: the `upstream` URL and
/// credential, used when there are no tables). [`super::load`] calls it.
///
/// ```no_run
/// use std::time::Duration;
/// // no tables: the single upstream as one route
/// let r = qsim_api::proxy::routes::routes(
///     "proxy.toml".as_ref(),
///     &[],
///     &[],
///     ("http://127.0.0.1:8000", &None),
///     Duration::from_secs(600),
///     Duration::from_secs(120),
/// )?;
/// assert!(!r.from_tables && r.core.upstreams.len() == 1);
/// # Ok::<(), qsim_sim::config::ConfigError>(())
/// ```
pub fn routes(
    config: &Path,
    upstreams: &[RawUpstream],
    raw_routes: &[RawRoute],
    single: (&str, &Option<String>),
    timeout: Duration,
    stream_idle: Duration,
) -> Result<Routes, ConfigError> {
    let d = Defaults {
        timeout: timeout.as_nanos() as u64,
        stream_idle_timeout: stream_idle.as_nanos() as u64,
    };
    if upstreams.is_empty() && raw_routes.is_empty() {
        return Ok(Routes::single(
            single.0,
            single.1.clone(),
            timeout,
            stream_idle,
        ));
    }
    let r = routes::parse(config, upstreams, raw_routes, Door::Proxy, d)?;
    let f = config.display().to_string();
    let http = r
        .extra
        .iter()
        .enumerate()
        .map(|(i, x)| {
            let credential = match &x.credential_env {
                None => None,
                Some(var) => match std::env::var(var) {
                    Ok(c) if !c.is_empty() => Some(c),
                    _ => {
                        return Err(ConfigError::new(
                            &f,
                            format!("upstream[{i}].credential_env"),
                            format!("environment variable {var} is not set (it holds the credential of upstream {:?})", r.core.upstreams[i].name),
                        ))
                    }
                },
            };
            Ok(UpstreamHttp {
                url: x.url.clone(),
                credential,
                stream_idle_timeout: Duration::from_nanos(x.stream_idle_timeout),
                probe_path: x.probe_path.clone(),
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Routes {
        core: r.core,
        http,
        from_tables: true,
    })
}
