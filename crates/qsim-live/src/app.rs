//! The proxy's shared state: the policy in force (a [`Gen`]eration: the
//! validated config and the compiled limiter `Params`, swapped whole on
//! SIGHUP by `reload.rs`), where the limiter state lives ([`Store`]), and
//! everything one proxy process shares between requests ([`App`]).
//!
//! A request keeps the generation it arrived under; its decision and
//! completion are taken on the state of the generation in force then (the
//! in-process state and its generation sit behind one mutex, so the two
//! always match; a consumer is found again by name after a reload).
//!
//! This module imports none of its users (the handler, the admission, the
//! waiting queues' driver, the settlement, the reload).

use crate::clock::Clock;
use crate::config::ProxyConfig;
use crate::drift::Drift;
use crate::http::HttpClient;
use crate::metrics::{ConsumerLabel, Metrics};
use crate::queue::Waits;
use crate::record::DecisionLog;
use crate::store::RedisState;
use qsim_core::limiter::admission::{Params, State};
use qsim_core::time::Nanos;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize};
use std::sync::{Arc, Mutex, RwLock};

/// Reads and validates the config again (on SIGHUP); `Err` is the one-line
/// reason.
pub type Reloader = Box<dyn Fn() -> Result<ProxyConfig, String> + Send + Sync>;

/// One generation of the policy: what a reload replaces.
pub struct Gen {
    /// 1 at start, +1 per successful reload.
    pub id: u64,
    pub params: Arc<Params>,
    pub cfg: ProxyConfig,
    pub keys: BTreeMap<String, usize>,
    pub names: Vec<String>,
    /// The names as metric labels (cloned per request without allocating).
    pub labels: Vec<Arc<String>>,
}

impl Gen {
    pub fn new(id: u64, cfg: ProxyConfig, params: Arc<Params>) -> Gen {
        Gen {
            id,
            keys: cfg.keys.iter().cloned().collect(),
            names: cfg
                .limiter
                .consumers
                .iter()
                .map(|c| c.name.clone())
                .collect(),
            labels: cfg
                .limiter
                .consumers
                .iter()
                .map(|c| Arc::new(c.name.clone()))
                .collect(),
            params,
            cfg,
        }
    }
}

/// Compile a config's limiter (with its lease).
pub fn compile(cfg: &ProxyConfig) -> Result<Params, String> {
    let mut p = Params::new(cfg.limiter.clone())?;
    if let Some(l) = cfg.lease {
        p = p.with_lease(l)?;
    }
    Ok(p)
}

/// The in-process limiter state and the generation whose `Params` it fits.
pub struct Local {
    pub gen: Arc<Gen>,
    pub state: State,
}

/// Where this process keeps the limiter state.
pub enum Store {
    /// Behind a mutex held only for the decision itself (no await inside).
    Local(Mutex<Local>),
    /// In a Redis shared with other replicas (read, decide, compare-and-set).
    Redis(RedisState),
}

/// Shared by every request of one proxy process.
pub struct App {
    pub gen: RwLock<Arc<Gen>>,
    pub store: Store,
    /// The core's time: 0 at start in-process; with a shared state, the wall
    /// clock at start since [`SHARED_EPOCH_UNIX_S`], so replicas' times
    /// agree up to their clocks' skew (the core's effective time absorbs it).
    pub clock: Clock,
    pub metrics: Metrics,
    pub client: HttpClient,
    pub next_id: AtomicU64,
    pub waits: Waits,
    /// Completions being written to the shared state (awaited at shutdown).
    pub pending_writes: AtomicUsize,
    /// The drain timeout passed at shutdown: the answers still open are
    /// being cut by the proxy (logged as `drain_timeout`, not as the
    /// client's disconnect).
    pub cut: std::sync::atomic::AtomicBool,
    pub reload: Option<Reloader>,
    /// The decision log (`[proxy] log`), written off the request path.
    pub log: Option<Arc<DecisionLog>>,
    /// `--profile`: the shadow model's channel (drift.rs).
    pub drift: Option<Drift>,
}

impl App {
    pub fn consumer_label(&self, gen: &Gen, c: usize) -> ConsumerLabel {
        ConsumerLabel {
            consumer: gen.labels[c].clone(),
        }
    }
    /// The core's `now` (see [`Clock`]).
    pub fn now(&self) -> Nanos {
        self.clock.now()
    }
    /// The generation in force.
    pub fn current(&self) -> Arc<Gen> {
        self.gen.read().unwrap_or_else(|e| e.into_inner()).clone()
    }
    pub fn set_current(&self, g: Arc<Gen>) {
        *self.gen.write().unwrap_or_else(|e| e.into_inner()) = g;
    }
}

/// 2025-01-01T00:00:00Z: the origin of the core's time when replicas share a
/// state (keeps times small: ~3.2e16 ns per year).
pub const SHARED_EPOCH_UNIX_S: u64 = 1_735_689_600;
