//! The caller as a sans-IO state machine (in the style of quinn-proto).
//!
//! One [`Call`] is one row (one logical request) of a client: it owns the
//! caller-level attempt number, the SDK's hidden retries within the current
//! attempt, the previous backoff delay and the caller's own total wait. The
//! driver — the simulator's event loop in virtual time, or the live replay
//! client in real time — sends HTTP attempts and reports what came back; the
//! call answers with what to do next:
//!
//! ```text
//! let mut call = Call::start(now);
//! loop {
//!     if call.on_send(now, &mut shared, &mut rng) == Send::LocalReject {
//!         reply = Reply::LocalReject                // the adaptive throttle said no
//!     } else {
//!         reply = http(now)                         // Ok, or Error { status, hint }
//!     }
//!     match call.on_reply(now, reply, &policy, &mut shared, &mut rng) {
//!         Next::SendAt { at, .. } => now = at,      // sleep, then the next attempt
//!         Next::Done(outcome) => break,             // success or final error
//!     }
//! }
//! ```
//!
//! Layers, innermost first: the optional adaptive throttle (a local 429 at
//! once), the SDK's hidden retries (the OpenAI Python SDK retries twice by
//! default), then the caller's own [`RetryPolicy`], whose retries an optional
//! [`RetryQuota`] must pay for. The throttle and the quota are shared by all
//! workers of one client ([`PoolShared`]). Random draws (jitter) come from
//! the driver through [`Uniform`], in a fixed order: the throttle's draw
//! before a send, then at most one delay draw per reply.
//!
//! The managed batch executor (`ai_query`) is [`Managed`]: an AIMD
//! concurrency window over a queue of rows, re-queueing throttled rows.

use super::managed::{AimdController, AimdParams};
use super::policy::{RetryPolicy, SdkRetry};
use super::throttle::{AdaptiveThrottle, RetryQuota};
use crate::time::{secs, Nanos};
use crate::Uniform;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

/// The caller's configured layers (immutable; shared by every row).
#[derive(Debug, Clone, PartialEq)]
pub struct CallerPolicy {
    pub retry: RetryPolicy,
    /// The SDK's hidden retry layer, if on.
    pub sdk: Option<SdkRetry>,
}

/// State shared by all workers of one client: the retry quota and the
/// adaptive throttle (each optional). Fresh for each experiment.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PoolShared {
    pub quota: Option<RetryQuota>,
    pub throttle: Option<AdaptiveThrottle>,
}

/// What one HTTP attempt came back with, as the caller sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reply {
    /// A success (2xx).
    Ok,
    /// An error status from the endpoint, with the retry hint it carried
    /// (`Retry-After`, `retry-after-ms` or a body field), if any.
    Error { status: u16, hint: Option<Nanos> },
    /// Rejected by the client's own adaptive throttle before it left: the
    /// caller sees a 429 without a hint, and the throttle records nothing.
    LocalReject,
}

/// Whether an attempt may leave (see [`Call::on_send`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Send {
    Go,
    LocalReject,
}

/// Which layer scheduled a retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layer {
    /// The SDK's hidden retry (invisible to the caller's code).
    Sdk,
    /// The caller's own retry policy (a sleep the caller pays for).
    Own,
}

/// How a row ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    /// 200, or the status of the final error (429 for a local rejection).
    pub status: u16,
    /// Caller-level attempts (1-based; SDK retries not counted).
    pub attempts: u32,
    /// Total of the caller's own sleeps for this row.
    pub own_wait: Nanos,
    /// First send to final outcome, including every wait.
    pub latency: Nanos,
    /// The policy wanted another attempt but the retry quota could not pay.
    pub quota_denied: bool,
}

/// What the driver does next with a row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Send the next attempt at `at` (after the SDK's or the caller's sleep).
    SendAt { at: Nanos, layer: Layer },
    /// The row is finished.
    Done(Outcome),
}

/// One row's call: everything that survives between attempts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Call {
    first_send: Nanos,
    sent_at: Nanos,
    attempt: u32,
    sdk_n: u32,
    own_wait: Nanos,
    prev_delay: Nanos,
}

impl Call {
    /// A row whose first attempt is sent at `now`.
    pub fn start(now: Nanos) -> Self {
        Call {
            first_send: now,
            sent_at: now,
            attempt: 1,
            sdk_n: 0,
            own_wait: 0,
            prev_delay: 0,
        }
    }

    /// Caller-level attempt number (1-based).
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// SDK retries used within the current caller-level attempt.
    pub fn sdk_retries(&self) -> u32 {
        self.sdk_n
    }

    /// When the last HTTP attempt left.
    pub fn sent_at(&self) -> Nanos {
        self.sent_at
    }

    /// The caller's own total wait so far.
    pub fn own_wait(&self) -> Nanos {
        self.own_wait
    }

    /// An attempt is about to leave at `now`: the adaptive throttle, if any,
    /// rejects it locally with probability `max(0, (requests − K·accepts) /
    /// (requests + 1))` (one draw, only when a throttle is configured).
    pub fn on_send(&mut self, now: Nanos, shared: &mut PoolShared, rng: &mut impl Uniform) -> Send {
        self.sent_at = now;
        if let Some(t) = shared.throttle.as_mut() {
            if rng.unit() < t.reject_probability(now) {
                t.record(now, false);
                return Send::LocalReject;
            }
        }
        Send::Go
    }

    fn done(&self, now: Nanos, status: u16, quota_denied: bool) -> Next {
        Next::Done(Outcome {
            status,
            attempts: self.attempt,
            own_wait: self.own_wait,
            latency: now.saturating_sub(self.first_send),
            quota_denied,
        })
    }

    /// The reply to the last attempt arrived at `now`.
    pub fn on_reply(
        &mut self,
        now: Nanos,
        reply: Reply,
        policy: &CallerPolicy,
        shared: &mut PoolShared,
        rng: &mut impl Uniform,
    ) -> Next {
        let (status, hint) = match reply {
            Reply::Ok => {
                if let Some(t) = shared.throttle.as_mut() {
                    t.record(now, true);
                }
                if let Some(q) = shared.quota.as_mut() {
                    q.on_success(self.attempt > 1);
                }
                return self.done(now, 200, false);
            }
            Reply::Error { status, hint } => {
                if let Some(t) = shared.throttle.as_mut() {
                    // a backend overload rejection is not an accept
                    t.record(now, status != 429);
                }
                (status, hint)
            }
            Reply::LocalReject => (429, None),
        };
        // 1) the SDK's hidden layer
        if let Some(s) = policy.sdk.as_ref() {
            if s.should_retry(self.sdk_n, status, hint) {
                let d = s.delay(self.sdk_n, hint, rng);
                self.sdk_n += 1;
                return Next::SendAt {
                    at: now.saturating_add(d),
                    layer: Layer::Sdk,
                };
            }
        }
        // 2) the caller's own policy sees the exception; a retry quota, if
        //    any, must pay for the retry
        let wants = policy.retry.should_retry(self.attempt, status);
        let paid = wants && shared.quota.as_mut().is_none_or(|q| q.try_acquire());
        if !paid {
            return self.done(now, status, wants);
        }
        let d = policy.retry.delay(self.attempt, self.prev_delay, hint, rng);
        self.prev_delay = d;
        self.own_wait = self.own_wait.saturating_add(d);
        self.attempt += 1;
        self.sdk_n = 0;
        Next::SendAt {
            at: now.saturating_add(d),
            layer: Layer::Own,
        }
    }
}

/// What the managed executor does with a failed row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ManagedNext {
    /// The row is re-queued and becomes eligible at this time (the driver
    /// wakes the executor then).
    EligibleAt(Nanos),
    /// The row exhausted `max_attempts`: an error row (`failOnError => false`).
    Done(Outcome),
}

/// The managed batch executor (modelled on Databricks `ai_query`): the
/// engine decides concurrency (an AIMD window), retries and pacing; a 429
/// never reaches the caller unless a row exhausts `max_attempts`.
///
/// `T` is the driver's per-row payload (e.g. the prompt), parked with the
/// row's [`Call`] while it waits to be eligible again.
#[derive(Debug, Clone)]
pub struct Managed<T> {
    p: AimdParams,
    ctl: AimdController,
    inflight: usize,
    /// Throttled rows waiting to be eligible again: (eligible_at, seq).
    waiting: BinaryHeap<Reverse<(Nanos, u64)>>,
    parked: BTreeMap<u64, (Call, T)>,
    seq: u64,
}

impl<T> Managed<T> {
    pub fn new(p: AimdParams) -> Self {
        Managed {
            ctl: AimdController::new(p.clone()),
            p,
            inflight: 0,
            waiting: BinaryHeap::new(),
            parked: BTreeMap::new(),
            seq: 0,
        }
    }

    /// Whether the window has room for another row in flight.
    pub fn has_room(&self) -> bool {
        self.inflight < self.ctl.limit()
    }

    /// A re-queued row that is eligible at `now`, earliest first (retries go
    /// before new rows).
    pub fn take_eligible(&mut self, now: Nanos) -> Option<(Call, T)> {
        match self.waiting.peek() {
            Some(Reverse((t, s))) if *t <= now => {
                let s = *s;
                self.waiting.pop();
                self.parked.remove(&s)
            }
            _ => None,
        }
    }

    /// The earliest time a re-queued row becomes eligible.
    pub fn poll_timeout(&self) -> Option<Nanos> {
        self.waiting.peek().map(|Reverse((t, _))| *t)
    }

    /// A row (new or re-queued) is sent at `now`.
    pub fn on_send(&mut self, now: Nanos, call: &mut Call) {
        call.sent_at = now;
        self.inflight += 1;
    }

    /// A row in flight succeeded at `now`.
    pub fn on_success(&mut self, now: Nanos, call: &Call) -> Outcome {
        self.inflight -= 1;
        self.ctl.on_success();
        Outcome {
            status: 200,
            attempts: call.attempt,
            own_wait: 0,
            latency: now.saturating_sub(call.first_send),
            quota_denied: false,
        }
    }

    /// A row in flight failed at `now` with `status` (and a retry hint):
    /// a 429 shrinks the window (once per congestion epoch); the row is
    /// re-queued after the hint, or after `min(base·2^(n−1), cap)·U[0.5, 1)`
    /// for its n-th failure, unless it has used `max_attempts`.
    pub fn on_failure(
        &mut self,
        now: Nanos,
        mut call: Call,
        row: T,
        status: u16,
        hint: Option<Nanos>,
        rng: &mut impl Uniform,
    ) -> ManagedNext {
        self.inflight -= 1;
        if status == 429 {
            self.ctl.on_throttle(now, call.sent_at);
        }
        if call.attempt >= self.p.max_attempts {
            return ManagedNext::Done(Outcome {
                status,
                attempts: call.attempt,
                own_wait: 0,
                latency: now.saturating_sub(call.first_send),
                quota_denied: false,
            });
        }
        let d = hint.unwrap_or_else(|| {
            let n = (call.attempt - 1).min(62) as i32;
            let base = (self.p.retry_base_s * 2f64.powi(n)).min(self.p.retry_cap_s);
            secs(base * (0.5 + 0.5 * rng.unit()))
        });
        call.attempt += 1;
        let at = now.saturating_add(d);
        self.waiting.push(Reverse((at, self.seq)));
        self.parked.insert(self.seq, (call, row));
        self.seq += 1;
        ManagedNext::EligibleAt(at)
    }

    /// The current AIMD window (fractional).
    pub fn window(&self) -> f64 {
        self.ctl.window()
    }

    /// Rows in flight.
    pub fn inflight(&self) -> usize {
        self.inflight
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::policy::{Backoff, StatusSet};
    use crate::time::NS_PER_SEC;

    fn article() -> CallerPolicy {
        CallerPolicy {
            retry: RetryPolicy {
                backoff: Backoff::Exponential {
                    base: 1.0,
                    cap: 32.0,
                    jitter: 1.0,
                },
                max_attempts: 8,
                retry_on: StatusSet::parse(&["429".into(), "5xx".into()]).unwrap(),
                honor_hint: true,
            },
            sdk: Some(SdkRetry::default()),
        }
    }

    /// Drive one row against an endpoint that always answers 429 without a
    /// hint: 8 caller attempts, each with 2 SDK retries, then a final 429.
    #[test]
    fn always_429_exhausts_sdk_then_own_attempts() {
        let p = article();
        let mut shared = PoolShared::default();
        let mut rng = crate::test_rng(7);
        let mut now = 0;
        let mut call = Call::start(now);
        let (mut sdk, mut own, mut own_sum) = (0, 0, 0);
        let out = loop {
            assert_eq!(call.on_send(now, &mut shared, &mut rng), Send::Go);
            let reply = Reply::Error {
                status: 429,
                hint: None,
            };
            match call.on_reply(now, reply, &p, &mut shared, &mut rng) {
                Next::SendAt { at, layer } => {
                    let d = at - now;
                    match layer {
                        Layer::Sdk => {
                            sdk += 1;
                            // min(0.5·2^n, 8)·(1 − 0.25·U): within [0.375, 8] s
                            assert!((375_000_000..=8 * NS_PER_SEC).contains(&d), "{d}");
                            assert!(call.sdk_retries() <= 2);
                        }
                        Layer::Own => {
                            own += 1;
                            // attempt n (1-based, before the increment) slept min(2^(n-1), 32) + U[0,1)
                            let n = call.attempt() - 1;
                            let lo = (1u64 << (n - 1)).min(32) * NS_PER_SEC;
                            assert!(d >= lo && d < lo + NS_PER_SEC, "attempt {n}: {d}");
                            own_sum += d;
                        }
                    }
                    now = at;
                }
                Next::Done(o) => break o,
            }
        };
        assert_eq!(out.status, 429);
        assert_eq!(out.attempts, 8);
        assert_eq!(own, 7);
        assert_eq!(sdk, 8 * 2);
        assert_eq!(out.own_wait, own_sum);
        assert_eq!(out.latency, now);
        assert!(!out.quota_denied);
    }

    #[test]
    fn hint_replaces_the_exponential_term_and_non_retryable_ends_at_once() {
        let p = CallerPolicy {
            sdk: None,
            ..article()
        };
        let mut shared = PoolShared::default();
        let mut rng = crate::test_rng(8);
        let mut call = Call::start(0);
        let hint = Some(3 * NS_PER_SEC);
        match call.on_reply(
            0,
            Reply::Error { status: 429, hint },
            &p,
            &mut shared,
            &mut rng,
        ) {
            Next::SendAt {
                at,
                layer: Layer::Own,
            } => {
                assert!((3 * NS_PER_SEC..4 * NS_PER_SEC).contains(&at), "{at}")
            }
            n => panic!("{n:?}"),
        }
        let n = call.on_reply(
            10 * NS_PER_SEC,
            Reply::Error {
                status: 400,
                hint: None,
            },
            &p,
            &mut shared,
            &mut rng,
        );
        assert_eq!(
            n,
            Next::Done(Outcome {
                status: 400,
                attempts: 2,
                own_wait: call.own_wait(),
                latency: 10 * NS_PER_SEC,
                quota_denied: false
            })
        );
    }

    #[test]
    fn retry_quota_pays_for_retries_and_refuses_when_empty() {
        let p = CallerPolicy {
            sdk: None,
            ..article()
        };
        // capacity 10, cost 5: two retries paid, the third refused
        let mut shared = PoolShared {
            quota: Some(RetryQuota::new(10, 5, 1)),
            throttle: None,
        };
        let mut rng = crate::test_rng(9);
        let mut call = Call::start(0);
        let err = Reply::Error {
            status: 503,
            hint: None,
        };
        for _ in 0..2 {
            assert!(matches!(
                call.on_reply(0, err, &p, &mut shared, &mut rng),
                Next::SendAt {
                    layer: Layer::Own,
                    ..
                }
            ));
        }
        match call.on_reply(0, err, &p, &mut shared, &mut rng) {
            Next::Done(o) => {
                assert!(o.quota_denied);
                assert_eq!(o.attempts, 3);
            }
            n => panic!("{n:?}"),
        }
        assert_eq!(shared.quota.as_ref().unwrap().level(), 0);
    }

    #[test]
    fn local_reject_is_a_429_the_throttle_does_not_count_twice() {
        let p = CallerPolicy {
            retry: RetryPolicy::none(),
            sdk: None,
        };
        // K = 2: after 10 requests with no accepts, p(reject) = 10/11
        let mut t = AdaptiveThrottle::new(2.0, 120 * NS_PER_SEC);
        for i in 0..10 {
            t.record(i, false);
        }
        let mut shared = PoolShared {
            quota: None,
            throttle: Some(t),
        };
        let mut always_low = || 0.0;
        let mut call = Call::start(100);
        assert_eq!(
            call.on_send(100, &mut shared, &mut always_low),
            Send::LocalReject
        );
        let before = shared.clone();
        let n = call.on_reply(100, Reply::LocalReject, &p, &mut shared, &mut always_low);
        assert_eq!(
            shared, before,
            "a local rejection is recorded once, at send"
        );
        assert!(matches!(
            n,
            Next::Done(Outcome {
                status: 429,
                attempts: 1,
                ..
            })
        ));
    }

    #[test]
    fn managed_requeues_until_max_attempts() {
        let p = AimdParams {
            max_attempts: 3,
            ..AimdParams::default()
        };
        let mut m: Managed<u32> = Managed::new(p);
        let mut rng = crate::test_rng(10);
        assert!(m.has_room());
        let mut call = Call::start(0);
        m.on_send(0, &mut call);
        let at = match m.on_failure(0, call, 7, 429, None, &mut rng) {
            // first failure: min(1·2^0, 30)·U[0.5, 1) s
            ManagedNext::EligibleAt(at) => {
                assert!((NS_PER_SEC / 2..NS_PER_SEC).contains(&at), "{at}");
                at
            }
            n => panic!("{n:?}"),
        };
        assert_eq!(m.poll_timeout(), Some(at));
        assert!(m.take_eligible(at - 1).is_none());
        let (mut call, row) = m.take_eligible(at).unwrap();
        assert_eq!((call.attempt(), row), (2, 7));
        m.on_send(at, &mut call);
        let at2 = match m.on_failure(at, call, row, 503, Some(NS_PER_SEC), &mut rng) {
            ManagedNext::EligibleAt(t) => t,
            n => panic!("{n:?}"),
        };
        assert_eq!(at2, at + NS_PER_SEC, "a hint replaces the backoff");
        let (mut call, row) = m.take_eligible(at2).unwrap();
        m.on_send(at2, &mut call);
        match m.on_failure(at2, call, row, 429, None, &mut rng) {
            ManagedNext::Done(o) => {
                assert_eq!((o.status, o.attempts, o.latency), (429, 3, at2))
            }
            n => panic!("{n:?}"),
        }
        assert_eq!(m.inflight(), 0);
        assert!(m.window() < 8.0, "429s shrank the window");
    }
}
