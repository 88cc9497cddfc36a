//! `qsim proxy`: the start-up (the limiter compiled, the state's home,
//! the clock, the drift shadow and the decision log), the accept loop, and
//! the graceful shutdown. The shared state is `app.rs`; the routes and the
//! request handler are `handler.rs`.

use crate::app::{compile, App, Gen, Local, Reloader, Store, SHARED_EPOCH_UNIX_S};
use crate::clock::Clock;
use crate::config::ProxyConfig;
use crate::drift::Drift;
use crate::http::{self, HttpClient};
use crate::metrics::{Metrics, PhaseLabel};
use crate::queue::Waits;
use crate::record::{DecisionLog, Encoder};
use crate::store::{RedisState, StateBackend};
use qsim_core::limiter::admission::{Params, State};
use qsim_core::time::Nanos;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

/// A proxy whose limiter is compiled and configuration checked; `run` binds
/// and serves.
pub struct Proxy {
    cfg: ProxyConfig,
    params: Arc<Params>,
    client: HttpClient,
    reload: Option<Reloader>,
    encoder: Option<Encoder>,
}

impl Proxy {
    /// Compile the limiter and the upstream's TLS settings (errors are
    /// configuration errors: nothing is bound yet).
    pub fn new(cfg: ProxyConfig) -> Result<Proxy, String> {
        let params = Arc::new(compile(&cfg)?);
        let name = cfg
            .upstream_ca_file
            .as_ref()
            .map_or(String::new(), |p| p.display().to_string());
        let client = http::client(
            &cfg.upstream,
            cfg.upstream_ca_pem
                .as_deref()
                .map(|pem| (name.as_str(), pem)),
        )?;
        Ok(Proxy {
            cfg,
            params,
            client,
            reload: None,
            encoder: None,
        })
    }

    /// On SIGHUP, call `f` for a new validated config (the file read again)
    /// and put it in force (see `reload.rs`).
    pub fn with_reload(mut self, f: Reloader) -> Proxy {
        self.reload = Some(f);
        self
    }

    /// Write the decision log as Parquet with this encoder (else JSON Lines).
    pub fn with_log_encoder(mut self, e: Encoder) -> Proxy {
        self.encoder = Some(e);
        self
    }

    /// Bind, print `qsim proxy: listening on http://ADDR` on stdout, and
    /// serve until SIGINT/SIGTERM (then finish in-flight requests, up to the
    /// drain timeout).
    pub fn run(self) -> Result<(), String> {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        if let Some(t) = self.cfg.threads {
            b.worker_threads(t.max(1));
        }
        let rt = b
            .enable_all()
            .build()
            .map_err(|e| format!("tokio runtime: {e}"))?;
        let r = rt.block_on(self.serve());
        // connections still open after the drain timeout are dropped here
        // (their guards settle in-process state as they go)
        rt.shutdown_timeout(Duration::from_secs(1));
        r
    }

    async fn serve(self) -> Result<(), String> {
        let _ = tracing_subscriber::fmt()
            .with_writer(std::io::stderr)
            .with_max_level(log_level())
            .with_target(false)
            .try_init();
        let listener = tokio::net::TcpListener::bind(self.cfg.listen)
            .await
            .map_err(|e| format!("cannot listen on {}: {e}", self.cfg.listen))?;
        let addr: SocketAddr = listener.local_addr().map_err(|e| e.to_string())?;
        let drain = self.cfg.drain_timeout;
        let gen = Arc::new(Gen::new(1, self.cfg, self.params));
        let (store, base) = match &gen.cfg.state {
            StateBackend::InProcess => (
                Store::Local(Mutex::new(Local {
                    gen: gen.clone(),
                    state: State::new(&gen.params, 0),
                })),
                0,
            ),
            StateBackend::Redis { addr, fail } => {
                let r = RedisState::new(addr.clone(), *fail, &gen.params, gen.cfg.lease);
                tracing::info!(%addr, key = %r.key, fail_mode = fail.name(), "limiter state shared in redis");
                let wall = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_err(|e| format!("system clock before 1970: {e}"))?
                    .as_nanos()
                    .saturating_sub(SHARED_EPOCH_UNIX_S as u128 * 1_000_000_000);
                (Store::Redis(r), wall as Nanos)
            }
        };
        let clock = Clock::new(base, gen.cfg.time_scale);
        let mut metrics = Metrics::new();
        let drift = match &gen.cfg.drift {
            Some(d) => Some(Drift::start(d.clone(), clock, &mut metrics.registry)?),
            None => None,
        };
        let log = match &gen.cfg.log {
            None => None,
            Some(lc) => {
                let parquet = self.encoder.is_some();
                let l = DecisionLog::start(lc.clone(), self.encoder)?;
                metrics.registry.register(
                    "log_records_dropped",
                    "Decision-log records dropped because the writer was behind",
                    l.dropped.clone(),
                );
                metrics.registry.register(
                    "log_records_written",
                    "Decision-log records written (Parquet: in finished files; JSON Lines: in the open file too)",
                    (*l.written).clone(),
                );
                tracing::info!(dir = %lc.dir.display(), parquet, "decision log on");
                Some(Arc::new(l))
            }
        };
        let app = Arc::new(App {
            gen: RwLock::new(gen.clone()),
            store,
            clock,
            metrics,
            log,
            client: self.client,
            next_id: AtomicU64::new(1),
            waits: Waits::default(),
            pending_writes: AtomicUsize::new(0),
            cut: std::sync::atomic::AtomicBool::new(false),
            reload: self.reload,
            drift,
        });
        app.metrics.generation.set(1);
        println!("qsim proxy: listening on http://{addr}");
        tracing::info!(%addr, upstream = %http::redact_userinfo(&gen.cfg.upstream), consumers = gen.names.len(), "listening");
        drop(gen);
        tokio::spawn(crate::reload::on_sighup(app.clone()));
        let graceful = hyper_util::server::graceful::GracefulShutdown::new();
        let a = app.clone();
        let m = app.clone();
        let on_header_timeout: Arc<dyn Fn(bool) + Send + Sync> = Arc::new(move |partial| {
            let phase = if partial { "headers" } else { "idle" };
            m.metrics
                .read_timeouts
                .get_or_create(&PhaseLabel { phase })
                .inc();
            tracing::debug!(phase, "connection closed: request head not read in time");
        });
        let l = app.clone();
        let limits = move || http::ConnLimits {
            header_read_timeout: Some(l.current().cfg.header_read_timeout),
            on_header_timeout: Some(on_header_timeout.clone()),
        };
        http::accept_until_shutdown(&listener, &graceful, limits, move |req| {
            crate::handler::handle(a.clone(), req)
        })
        .await;
        // stop accepting: new connections are refused from here on
        drop(listener);
        let open = app.metrics.in_flight.get();
        tracing::info!(
            in_flight = open,
            drain_timeout_s = drain.as_secs_f64(),
            "shutting down: finishing in-flight requests"
        );
        let drained = tokio::time::timeout(drain, graceful.shutdown())
            .await
            .is_ok();
        if !drained {
            // the requests still open are cut by us from here on
            app.cut.store(true, Ordering::Release);
        }
        // completions being written to the shared state
        let t = Instant::now();
        while app.pending_writes.load(Ordering::Acquire) > 0 && t.elapsed() < Duration::from_secs(2)
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        if let Some(l) = &app.log {
            l.close();
        }
        if drained {
            tracing::info!("drained: every in-flight request finished; exiting");
        } else {
            tracing::warn!(
                in_flight = app.metrics.in_flight.get(),
                "drain timeout: closing the requests still open (their reservations are released)"
            );
        }
        Ok(())
    }
}

/// The log level: `QSIM_LOG` (error, warn, info, debug, trace), default info.
fn log_level() -> tracing::Level {
    std::env::var("QSIM_LOG")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(tracing::Level::INFO)
}
