//! The run-time work budget: what the simulation drivers actually do,
//! counted while they do it, against `--max-requests`.
//!
//! The up-front estimate ([`crate::budget`]) refuses hopeless
//! inputs at once; this meter is the guarantee. Every driver (hosted pool
//! and managed executor, server scenarios, shared scenarios) counts its
//! work in the same units as the estimate — a simulated request or engine
//! iteration is one, a hosted-API attempt a quarter, a step over a large
//! cluster one per [`REPLICAS_PER_REQUEST`] replicas — locally, and adds
//! it to the shared [`Meter`] every [`FLUSH`] units or when it ends. Once
//! the meter is over its limit, every driver stops at its next flush and
//! the command refuses with exit 2 before writing anything.
//!
//! Refusal depends only on the input: a deterministic run's total work is
//! deterministic, the meter only ever holds work that was really done, and
//! it only grows. If the total is within the limit, no flush ever sees the
//! meter over it and everything runs; if the total is over, either some
//! driver stopped (the meter was over then, and stays over) or all work was
//! added and the meter is over at the end. So the run is refused iff its
//! total work exceeds the budget, whatever the thread count or timing.
//!
//! The meter is installed for the current thread with [`scope`] and handed
//! to rayon's worker threads with [`current`] and [`enter`]; a driver
//! started outside any scope counts nothing (library use, live mode).

use crate::config::ConfigError;
use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Units per simulated request or engine iteration (a hosted-API attempt
/// is one unit: a quarter of a request, see
/// [`HOSTED_ATTEMPT_WORK`](crate::budget::HOSTED_ATTEMPT_WORK)).
pub const UNITS_PER_REQUEST: u64 = 4;

/// Replicas a server driver's step looks at for the work of one request:
/// the cluster scans every replica for its next deadline on every step,
/// 2 to 6 ns a replica (more once the replicas outgrow the caches), so 32
/// replicas cost about an engine iteration (~130 ns). Measured with
/// nim-load.toml's "normal" scenario: the same 1.0 M iterations took 0.11
/// CPU-s on 64 replicas and 0.85 CPU-s on 512; on 4096 replicas a step
/// took ~26 µs.
pub const REPLICAS_PER_REQUEST: u64 = 32;

/// Units of one driver step over a cluster of `replicas` replicas (the
/// replica scan; none under [`REPLICAS_PER_REQUEST`] / [`UNITS_PER_REQUEST`]
/// replicas, where the step's own work is counted as a request or an
/// iteration).
pub fn step_units(replicas: u32) -> u64 {
    replicas as u64 * UNITS_PER_REQUEST / REPLICAS_PER_REQUEST
}

/// A driver adds its work to the shared meter every `FLUSH` units (and
/// when it ends): an atomic add per ~16,000 requests, nothing in between
/// but a comparison.
pub const FLUSH: u64 = 1 << 16;

/// The shared counter of one command's work.
#[derive(Debug)]
pub struct Meter {
    used: AtomicU64,
    limit: u64,
}

impl Meter {
    /// A meter refusing more than `max_requests` requests (and iterations).
    pub fn new(max_requests: u64) -> Self {
        Meter {
            used: AtomicU64::new(0),
            limit: max_requests.saturating_mul(UNITS_PER_REQUEST),
        }
    }

    /// Work counted so far, in units.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// The work counted so far exceeds the budget.
    pub fn over(&self) -> bool {
        self.used() > self.limit
    }

    fn add(&self, units: u64) -> bool {
        let before = self.used.fetch_add(units, Ordering::Relaxed);
        before.saturating_add(units) > self.limit
    }
}

thread_local! {
    static CURRENT: RefCell<Option<Arc<Meter>>> = const { RefCell::new(None) };
}

/// The meter of the current thread, to hand to other threads ([`enter`]).
pub fn current() -> Option<Arc<Meter>> {
    CURRENT.with(|c| c.borrow().clone())
}

/// Run `f` with `meter` as the current thread's meter (restored after).
pub fn enter<R>(meter: Option<Arc<Meter>>, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<Arc<Meter>>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let prev = self.0.take();
            CURRENT.with(|c| *c.borrow_mut() = prev);
        }
    }
    let prev = CURRENT.with(|c| std::mem::replace(&mut *c.borrow_mut(), meter));
    let _restore = Restore(prev);
    f()
}

/// Run `f` under a fresh meter of `max_requests`; the meter comes back
/// with the result (check it with [`check`] before writing any output).
pub fn scope<R>(max_requests: u64, f: impl FnOnce() -> R) -> (R, Arc<Meter>) {
    let m = Arc::new(Meter::new(max_requests));
    let r = enter(Some(m.clone()), f);
    (r, m)
}

/// Refuse (exit 2, one line naming `source`) if the current thread's meter
/// is over its budget: the run was stopped, and its results are partial.
pub fn check(source: &str) -> Result<(), ConfigError> {
    match current() {
        Some(m) if m.over() => Err(exceeded(source, &m)),
        _ => Ok(()),
    }
}

/// The run-time refusal. The message is the same whatever the thread count
/// (how far past the budget the run got when it stopped is not).
pub fn exceeded(source: &str, m: &Meter) -> ConfigError {
    exceeded_advising(
        source,
        m,
        "raise it with --max-requests N, or shorten the run",
    )
}

/// [`exceeded`] with another way out (`advice`), for a command whose
/// `--max-requests` means something else.
pub fn exceeded_advising(source: &str, m: &Meter, advice: &str) -> ConfigError {
    let max = m.limit / UNITS_PER_REQUEST;
    ConfigError::new(
        source,
        "",
        format!(
            "work budget: exceeded after simulating more than {} requests and engine iterations (a hosted-API attempt counts 1/4); the run was stopped and nothing written; {advice}",
            crate::budget::count(max as f64),
        ),
    )
}

/// One driver's count: local, added to the meter at flushes and on drop.
#[derive(Debug)]
pub struct Tally {
    meter: Option<Arc<Meter>>,
    /// Units already added to the meter.
    added: u64,
    /// The next total at which to flush (`u64::MAX`: never, no meter).
    next: u64,
    stopped: bool,
}

impl Default for Tally {
    fn default() -> Self {
        Self::new()
    }
}

impl Tally {
    /// A tally on the current thread's meter (none: counts nothing). Its
    /// first [`at`](Tally::at) flushes, so a driver started after the
    /// budget ran out stops at once.
    pub fn new() -> Self {
        let meter = current();
        let next = if meter.is_some() { 0 } else { u64::MAX };
        Tally {
            meter,
            added: 0,
            next,
            stopped: false,
        }
    }

    /// The driver has done `total` units of work since it started; false
    /// once the budget is exceeded (the driver should stop: its result is
    /// thrown away).
    #[inline]
    pub fn at(&mut self, total: u64) -> bool {
        if total < self.next {
            return true;
        }
        self.flush(total)
    }

    /// The driver was stopped by the budget.
    pub fn stopped(&self) -> bool {
        self.stopped
    }

    #[cold]
    #[inline(never)]
    fn flush(&mut self, total: u64) -> bool {
        let Some(m) = &self.meter else {
            return true;
        };
        let over = m.add(total.saturating_sub(self.added));
        self.added = self.added.max(total);
        self.next = total.saturating_add(FLUSH);
        if over {
            self.stopped = true;
            self.next = 0;
        }
        !self.stopped
    }

    /// The driver ended having done `total` units.
    pub fn finish(mut self, total: u64) {
        self.flush(total);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_meter_counts_nothing_and_never_stops() {
        let mut t = Tally::new();
        assert!(t.at(u64::MAX - 1));
        assert!(!t.stopped());
        assert!(check("x").is_ok());
    }

    #[test]
    fn refused_iff_total_exceeds_the_budget() {
        for (total, over) in [(4 * 1000, false), (4 * 1000 + 1, true)] {
            let ((), m) = scope(1000, || {
                let mut t = Tally::new();
                for u in 1..=total {
                    if !t.at(u) {
                        break;
                    }
                }
                t.finish(total);
            });
            assert_eq!(m.over(), over, "{total}");
        }
    }

    #[test]
    fn a_tally_started_after_the_budget_ran_out_stops_at_once() {
        let ((), m) = scope(10, || {
            Tally::new().finish(1000);
            let mut t = Tally::new();
            assert!(!t.at(0));
            assert!(check("f")
                .unwrap_err()
                .to_string()
                .contains("--max-requests"));
        });
        assert!(m.over());
        // the meter is gone outside the scope
        assert!(check("f").is_ok());
    }

    #[test]
    fn meters_reach_other_threads_only_when_handed_over() {
        let ((), m) = scope(1, || {
            let cur = current();
            std::thread::scope(|s| {
                s.spawn(|| Tally::new().finish(100));
                s.spawn(move || enter(cur, || Tally::new().finish(100)));
            });
        });
        assert_eq!(m.used(), 100);
    }
}
