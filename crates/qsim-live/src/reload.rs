//! Policy reload on SIGHUP, without dropping a request.
//!
//! The config file is read and validated again (by the caller's
//! [`Reloader`](crate::app::Reloader): the same `load` as at start). Invalid → logged, counted
//! (`qsim_proxy_reloads_total{result="error"}`), and the policy in force
//! stays. Valid → a new generation ([`Gen`]) is put in force at once:
//! requests already admitted keep going (they hold their own generation) and
//! are settled on the new state; requests arriving from then on are decided
//! under the new policy; waiting requests are woken to decide again.
//!
//! The in-process limiter state is carried over by the core's
//! `carry_over`: each bucket keeps its deficit (what was taken and not yet
//! refilled) in the bucket of the same role — pool, deployment bucket, a
//! consumer's floor or own limit, matched by consumer name — so a reload
//! grants no fresh burst and forgets no recent use; concurrency leases
//! follow their consumer. An unchanged limiter keeps its state as is.
//!
//! Fixed at start (a change is logged and ignored until a restart): the
//! listen address, the upstream and its CA file, the state backend, the
//! worker threads. With a state shared in Redis the limiter itself cannot
//! be reloaded (its key names the configuration, and every replica must
//! switch together): such a reload is refused and logged; the other
//! settings (keys, shapes, waiting, timeouts) are reloaded.

use crate::app::{compile, App, Gen, Store};
use crate::config::ProxyConfig;
use crate::metrics::ResultLabel;
use crate::sync::lock;
use qsim_core::limiter::admission::carry_over;
use std::sync::Arc;

pub async fn on_sighup(app: Arc<App>) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut hup = match signal(SignalKind::hangup()) {
            Ok(h) => h,
            Err(e) => {
                tracing::warn!(error = %e, "no SIGHUP handler: reload unavailable");
                return;
            }
        };
        while hup.recv().await.is_some() {
            let r = match &app.reload {
                None => Err("this proxy was started without a config file to reload".into()),
                Some(f) => f().and_then(|cfg| apply(&app, cfg)),
            };
            let result = match r {
                Ok(id) => {
                    tracing::info!(generation = id, "policy reloaded");
                    app.metrics.generation.set(id as i64);
                    "ok"
                }
                Err(e) => {
                    tracing::error!(error = %e, "policy reload failed: the policy in force stays");
                    "error"
                }
            };
            app.metrics
                .reloads
                .get_or_create(&ResultLabel {
                    result: result.into(),
                })
                .inc();
        }
    }
    #[cfg(not(unix))]
    let _ = app;
}

/// Put a validated config in force; the new generation's id.
pub fn apply(app: &Arc<App>, mut cfg: ProxyConfig) -> Result<u64, String> {
    let old = app.current();
    let fixed = [
        ("listen", cfg.listen != old.cfg.listen),
        ("upstream", cfg.upstream != old.cfg.upstream),
        (
            "upstream_ca_file",
            cfg.upstream_ca_file != old.cfg.upstream_ca_file,
        ),
        ("state", cfg.state != old.cfg.state),
        ("threads", cfg.threads != old.cfg.threads),
    ];
    for (what, changed) in fixed {
        if changed {
            tracing::warn!(
                setting = what,
                "changed in the config: takes effect at the next restart, not on reload"
            );
        }
    }
    cfg.listen = old.cfg.listen;
    cfg.upstream = old.cfg.upstream.clone();
    cfg.upstream_ca_file = old.cfg.upstream_ca_file.clone();
    cfg.upstream_ca_pem = old.cfg.upstream_ca_pem.clone();
    cfg.state = old.cfg.state.clone();
    cfg.threads = old.cfg.threads;
    let params = compile(&cfg)?;
    let same = params == *old.params;
    let params = if same {
        old.params.clone()
    } else {
        Arc::new(params)
    };
    match &app.store {
        Store::Redis(_) => {
            if !same {
                return Err("the limiter changed but its state is shared in Redis: restart every replica with the new config".into());
            }
            let gen = Arc::new(Gen::new(old.id + 1, cfg, params));
            app.set_current(gen.clone());
            app.waits.wake_heads();
            Ok(gen.id)
        }
        Store::Local(m) => {
            let mut l = lock(m);
            let gen = Arc::new(Gen::new(l.gen.id.max(old.id) + 1, cfg, params));
            if !same {
                let now = app.now();
                l.state = carry_over(&l.gen.params, &l.state, &gen.params, now);
            }
            l.gen = gen.clone();
            // under the state's lock: a decision sees both or neither
            app.set_current(gen.clone());
            drop(l);
            app.waits.wake_heads();
            Ok(gen.id)
        }
    }
}
