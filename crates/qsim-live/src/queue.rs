//! The waiting requests of `on_limit = "wait"` consumers: one FIFO queue
//! per consumer, its head the only one that decides (see `wait.rs`, which
//! drives them).

use crate::sync::lock;
use prometheus_client::metrics::gauge::Gauge;
use qsim_core::limiter::admission::Request;
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::Notify;

struct Entry {
    ticket: u64,
    wake: Arc<Notify>,
    req: Request,
}

/// The waiting requests, one FIFO queue per consumer (by name, so a reload
/// that reorders consumers keeps the queues).
#[derive(Default)]
pub struct Waits {
    count: AtomicUsize,
    next: AtomicU64,
    queues: Mutex<BTreeMap<String, VecDeque<Entry>>>,
}

impl Waits {
    pub fn has(&self, name: &str) -> bool {
        self.count.load(Ordering::Acquire) > 0
            && lock(&self.queues).get(name).is_some_and(|q| !q.is_empty())
    }

    /// The requests queued ahead of `ticket` (all of them for `None`).
    pub fn ahead(&self, name: &str, ticket: Option<u64>) -> Vec<Request> {
        lock(&self.queues).get(name).map_or(Vec::new(), |q| {
            q.iter()
                .take_while(|e| Some(e.ticket) != ticket)
                .map(|e| e.req)
                .collect()
        })
    }

    /// Queue `req` at the back of its consumer's queue (`waiting`: the
    /// gauge of waiting requests).
    pub fn join<'a>(&'a self, name: &str, req: Request, waiting: &Gauge) -> Ticket<'a> {
        let ticket = self.next.fetch_add(1, Ordering::Relaxed);
        let wake = Arc::new(Notify::new());
        lock(&self.queues)
            .entry(name.to_string())
            .or_default()
            .push_back(Entry {
                ticket,
                wake: wake.clone(),
                req,
            });
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
        for q in lock(&self.queues).values() {
            if let Some(h) = q.front() {
                h.wake.notify_one();
            }
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
        lock(&self.waits.queues)
            .get(&self.name)
            .and_then(|q| q.front())
            .is_some_and(|e| e.ticket == self.ticket)
    }
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        let w = self.waits;
        let mut qs = lock(&w.queues);
        if let Some(q) = qs.get_mut(&self.name) {
            if let Some(i) = q.iter().position(|e| e.ticket == self.ticket) {
                q.remove(i);
                if i == 0 {
                    if let Some(h) = q.front() {
                        h.wake.notify_one();
                    }
                }
            }
            if q.is_empty() {
                qs.remove(&self.name);
            }
        }
        w.count.fetch_sub(1, Ordering::AcqRel);
        self.waiting.dec();
    }
}
