//! The waiting requests of `on_limit = "wait"` consumers: the core's
//! per-consumer FIFO queues (`qsim_core::limiter::wait::Queues`, keyed by
//! consumer name) behind a mutex, each entry's wake-up a tokio `Notify`
//! (see `wait.rs`, which drives them).

use crate::sync::lock;
use prometheus_client::metrics::gauge::Gauge;
use qsim_core::limiter::admission::Request;
use qsim_core::limiter::wait::Queues;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::Notify;

/// The waiting requests, one FIFO queue per consumer (by name, so a reload
/// that reorders consumers keeps the queues).
#[derive(Default)]
pub struct Waits {
    count: AtomicUsize,
    queues: Mutex<Queues<String, Arc<Notify>>>,
}

impl Waits {
    pub fn has(&self, name: &str) -> bool {
        self.count.load(Ordering::Acquire) > 0 && lock(&self.queues).has(name)
    }

    /// The requests queued ahead of `ticket` (all of them for `None`).
    pub fn ahead(&self, name: &str, ticket: Option<u64>) -> Vec<Request> {
        lock(&self.queues).ahead(name, ticket)
    }

    /// Queue `req` at the back of its consumer's queue (`waiting`: the
    /// gauge of waiting requests).
    pub fn join<'a>(&'a self, name: &str, req: Request, waiting: &Gauge) -> Ticket<'a> {
        let wake = Arc::new(Notify::new());
        let ticket = lock(&self.queues).join(name.to_string(), req, wake.clone());
        self.count.fetch_add(1, Ordering::AcqRel);
        waiting.inc();
        Ticket {
            waits: self,
            waiting: waiting.clone(),
            name: name.to_string(),
            ticket,
            wake,
        }
    }

    /// Wake every queue's head (capacity may have freed up: a completion,
    /// a reload).
    pub fn wake_heads(&self) {
        if self.count.load(Ordering::Acquire) == 0 {
            return;
        }
        for (_, _, wake) in lock(&self.queues).heads() {
            wake.notify_one();
        }
    }
}

/// A place in a consumer's queue; leaving it (admitted, refused, or the
/// client gone: the future dropped) hands the head to the next one.
pub struct Ticket<'a> {
    waits: &'a Waits,
    waiting: Gauge,
    name: String,
    pub ticket: u64,
    pub wake: Arc<Notify>,
}

impl Ticket<'_> {
    pub fn is_head(&self) -> bool {
        lock(&self.waits.queues).is_head(&self.name, self.ticket)
    }
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        let w = self.waits;
        if let Some((_, next)) = lock(&w.queues).leave(&self.name, self.ticket) {
            next.notify_one();
        }
        w.count.fetch_sub(1, Ordering::AcqRel);
        self.waiting.dec();
    }
}
