//! `on_limit = "wait"`: the rules that hold an over-limit request until the
//! admission limiter admits it, instead of refusing it at once. Sans-IO:
//! every call takes `now` and the decisions the driver took with
//! [`decide`]; it returns what the driver does next and, for a waiting
//! request, the time it decides again (its next deadline). Two drivers run
//! it: the live proxy (`qsim-live/src/wait.rs`, tokio sleeps and wake-ups)
//! and `qsim whatif` (virtual time, one event queue), so the prediction of
//! a replay and the proxy's behaviour are one set of rules.
//!
//! **Order.** Waiting requests of one consumer form a FIFO queue
//! ([`Queues`]): a request joins it on its first denial, or on arrival when
//! requests of its consumer are already waiting (so a newcomer never takes
//! the capacity a waiter is about to get), and only the head decides
//! ([`Queues::is_head`]): at the limiter's retry time, or sooner when a
//! completion may have freed capacity (the driver wakes every head,
//! [`Queues::heads`]); leaving the queue hands the head to the next one
//! ([`Queues::leave`] names it, the driver wakes it). Across consumers there
//! is no queue: the limiter's semantics arbitrate.
//!
//! **Bound.** A request is held at most until its [`Bound`]:
//! `min(arrival + deadline − margin, arrival + max_wait)` (the deadline: the
//! client's own timeout, when known). [`Waiter`] turns each decision into a
//! [`Next`] step:
//!
//! - on arrival with nobody of its consumer waiting ([`Waiter::arrived`]):
//!   admitted; refused at once when the retry time is beyond the bound
//!   (outcome `refused_max_wait` or `refused_deadline`, whichever bound is
//!   the nearer), or is [`NEVER`] (not counted as a wait); else it joins;
//! - on arrival behind waiters ([`Waiter::predicted`]): the [`predict`]ed
//!   admission time (the core's `decide` on a copy of the state, each waiter
//!   ahead admitted at its own earliest time) beyond the bound: refused at
//!   once with that time; else it joins;
//! - as the head ([`Waiter::decided`]): admitted (`admitted`); a `concurrent`
//!   denial decides again after [`CONCURRENT_POLL`] (or on a completion); a
//!   retry time within the bound: sleep until it; beyond the bound: refused
//!   (`refused_*`); past its bound or never: `expired`;
//! - still queued behind others at its bound ([`Waiter::expired`]): refused
//!   (`expired`) with its prediction as the retry time.

use crate::limiter::admission::{decide, Decision, Limit, Params, Request, State};
use crate::time::{Nanos, NEVER};
use std::collections::{BTreeMap, VecDeque};

/// How often a head denied by `concurrent` decides again without a wake-up
/// (completions on other replicas sharing the state do not wake it).
pub const CONCURRENT_POLL: Nanos = 100_000_000;

/// How a waiting consumer's request ended (the proxy's metric label
/// `qsim_proxy_waits_total{outcome}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Outcome {
    /// Admitted after joining the queue.
    Admitted,
    /// Refused: its retry time is beyond `arrival + max_wait`.
    RefusedMaxWait,
    /// Refused: its retry time is beyond its deadline (less the margin).
    RefusedDeadline,
    /// Refused: still not admitted at its bound.
    Expired,
    /// The shared state was unreachable (a live driver's failure).
    Unavailable,
}

impl Outcome {
    pub fn name(self) -> &'static str {
        match self {
            Outcome::Admitted => "admitted",
            Outcome::RefusedMaxWait => "refused_max_wait",
            Outcome::RefusedDeadline => "refused_deadline",
            Outcome::Expired => "expired",
            Outcome::Unavailable => "unavailable",
        }
    }
}

/// How long a request may be held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bound {
    /// The latest time it may be admitted.
    pub at: Nanos,
    /// `at − arrival`.
    pub hold: Nanos,
    /// The refusal when its retry time is beyond `at`: `RefusedDeadline`
    /// when the deadline is the nearer bound, else `RefusedMaxWait`.
    pub refusal: Outcome,
}

impl Bound {
    /// A request arriving at `arrival`, of a consumer waiting up to
    /// `max_wait`, with the client's `deadline` (a duration from arrival,
    /// when known) less `margin`.
    pub fn new(arrival: Nanos, max_wait: Nanos, deadline: Option<Nanos>, margin: Nanos) -> Bound {
        let (hold, refusal) = match deadline {
            Some(d) if d.saturating_sub(margin) < max_wait => {
                (d.saturating_sub(margin), Outcome::RefusedDeadline)
            }
            _ => (max_wait, Outcome::RefusedMaxWait),
        };
        let hold = hold.min(NEVER / 2);
        Bound {
            at: arrival.saturating_add(hold),
            hold,
            refusal,
        }
    }
}

/// A predicted admission time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pred {
    /// At this time, the last denial being by this limit.
    At(Nanos, Limit),
    /// Never by the passage of time alone.
    Never(Limit),
    /// Not predictable (a concurrency slot).
    Unknown,
}

impl Pred {
    /// The limit and retry time a refusal announces.
    pub fn hint(self) -> (Limit, Nanos) {
        match self {
            Pred::At(t, l) => (l, t),
            Pred::Never(l) => (l, NEVER),
            Pred::Unknown => (Limit::Concurrent, NEVER),
        }
    }
}

/// When `req` would be admitted behind `ahead` (the requests of its
/// consumer queued before it, oldest first): the core's [`decide`] on `s`
/// (a copy of the state, read at `now`), each request ahead admitted at its
/// own earliest time, then `req`. A projection: it assumes no completion and
/// no other consumer's admission in between. Every request is decided as
/// consumer `consumer` (its index in `p`, which may differ from the index
/// the request was queued with, after a reload).
pub fn predict<'a>(
    p: &Params,
    mut s: State,
    now: Nanos,
    consumer: usize,
    ahead: impl IntoIterator<Item = &'a Request>,
    req: &Request,
) -> Pred {
    let mut t = now;
    let mut last = Limit::Capacity;
    for r in ahead.into_iter().copied().chain(std::iter::once(*req)) {
        let r = Request { consumer, ..r };
        let mut tries = 0;
        loop {
            match decide(p, &mut s, t, &r) {
                Decision::Admit(_) => break,
                Decision::Deny {
                    limit: Limit::Concurrent,
                    ..
                } => return Pred::Unknown,
                Decision::Deny { limit, retry_at } => {
                    last = limit;
                    if retry_at == NEVER {
                        return Pred::Never(limit);
                    }
                    t = t.max(retry_at);
                    tries += 1;
                    if tries > 64 {
                        return Pred::Unknown;
                    }
                }
            }
        }
    }
    Pred::At(t, last)
}

/// A refusal: the answer's limit and retry time, and the outcome it counts
/// as (`None`: not a wait at all, e.g. a request no wait can admit).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refusal {
    pub limit: Limit,
    pub retry_at: Nanos,
    pub outcome: Option<Outcome>,
}

/// What the driver does next with a request of a waiting consumer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// The decision handed in admitted it.
    Admit,
    /// Answer it now (429).
    Refuse(Refusal),
    /// Join the back of its consumer's queue ([`Queues::join`]); as the
    /// head, decide again at once.
    Join,
    /// The head: decide again at this time, or sooner when woken.
    Sleep(Nanos),
}

/// One request of a waiting consumer: its bound, and the rules that turn
/// each decision about it into the next step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Waiter {
    pub bound: Bound,
}

impl Waiter {
    pub fn new(bound: Bound) -> Waiter {
        Waiter { bound }
    }

    fn refuse(limit: Limit, retry_at: Nanos, outcome: Outcome) -> Next {
        Next::Refuse(Refusal {
            limit,
            retry_at,
            outcome: Some(outcome),
        })
    }

    /// Nobody of its consumer waiting: the decision taken on arrival.
    pub fn arrived(&self, d: &Decision) -> Next {
        match *d {
            Decision::Admit(_) => Next::Admit,
            Decision::Deny { limit, retry_at } if retry_at == NEVER => Next::Refuse(Refusal {
                limit,
                retry_at,
                outcome: None,
            }),
            Decision::Deny { limit, retry_at }
                if limit != Limit::Concurrent && retry_at > self.bound.at =>
            {
                Self::refuse(limit, retry_at, self.bound.refusal)
            }
            Decision::Deny { .. } => Next::Join,
        }
    }

    /// Requests of its consumer waiting: its prediction behind them.
    pub fn predicted(&self, p: Pred) -> Next {
        match p {
            Pred::At(t, limit) if t > self.bound.at => Self::refuse(limit, t, self.bound.refusal),
            Pred::Never(limit) => Next::Refuse(Refusal {
                limit,
                retry_at: NEVER,
                outcome: None,
            }),
            _ => Next::Join,
        }
    }

    /// The head of its queue: the decision taken at `now`.
    pub fn decided(&self, now: Nanos, d: &Decision) -> Next {
        match *d {
            Decision::Admit(_) => Next::Admit,
            Decision::Deny { limit, retry_at } => {
                if retry_at == NEVER || now >= self.bound.at {
                    Self::refuse(limit, retry_at, Outcome::Expired)
                } else if limit == Limit::Concurrent {
                    Next::Sleep(self.bound.at.min(now.saturating_add(CONCURRENT_POLL)))
                } else if retry_at > self.bound.at {
                    Self::refuse(limit, retry_at, self.bound.refusal)
                } else {
                    Next::Sleep(retry_at)
                }
            }
        }
    }

    /// Still queued behind others at its bound: refused, announcing its
    /// prediction behind them.
    pub fn expired(&self, p: Pred) -> Refusal {
        let (limit, retry_at) = p.hint();
        Refusal {
            limit,
            retry_at,
            outcome: Some(Outcome::Expired),
        }
    }
}

struct Entry<T> {
    ticket: u64,
    req: Request,
    item: T,
}

/// The waiting requests: one FIFO queue per consumer (keyed by `K`, e.g. the
/// consumer's name, so a reload that reorders consumers keeps the queues),
/// each entry carrying the driver's `T` (a wake-up handle, an event id).
pub struct Queues<K, T> {
    next: u64,
    len: usize,
    queues: BTreeMap<K, VecDeque<Entry<T>>>,
}

impl<K: Ord, T> Default for Queues<K, T> {
    fn default() -> Self {
        Queues {
            next: 0,
            len: 0,
            queues: BTreeMap::new(),
        }
    }
}

impl<K: Ord + Clone, T> Queues<K, T> {
    pub fn new() -> Self {
        Self::default()
    }

    /// Every waiting request.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether requests of `k` are waiting (a newcomer then queues behind).
    pub fn has<Q>(&self, k: &Q) -> bool
    where
        K: std::borrow::Borrow<Q>,
        Q: Ord + ?Sized,
    {
        self.queues.get(k).is_some_and(|q| !q.is_empty())
    }

    /// The requests queued ahead of `ticket` (all of them for `None`),
    /// oldest first.
    pub fn ahead<Q>(&self, k: &Q, ticket: Option<u64>) -> Vec<Request>
    where
        K: std::borrow::Borrow<Q>,
        Q: Ord + ?Sized,
    {
        self.queues.get(k).map_or(Vec::new(), |q| {
            q.iter()
                .take_while(|e| Some(e.ticket) != ticket)
                .map(|e| e.req)
                .collect()
        })
    }

    /// Queue `req` at the back of `k`'s queue; its ticket.
    pub fn join(&mut self, k: K, req: Request, item: T) -> u64 {
        let ticket = self.next;
        self.next += 1;
        self.queues
            .entry(k)
            .or_default()
            .push_back(Entry { ticket, req, item });
        self.len += 1;
        ticket
    }

    /// Whether `ticket` is the head of `k`'s queue (the only one that decides).
    pub fn is_head<Q>(&self, k: &Q, ticket: u64) -> bool
    where
        K: std::borrow::Borrow<Q>,
        Q: Ord + ?Sized,
    {
        self.queues
            .get(k)
            .and_then(|q| q.front())
            .is_some_and(|e| e.ticket == ticket)
    }

    /// The driver's item of `ticket` in `k`'s queue.
    pub fn get<Q>(&self, k: &Q, ticket: u64) -> Option<&T>
    where
        K: std::borrow::Borrow<Q>,
        Q: Ord + ?Sized,
    {
        self.queues
            .get(k)?
            .iter()
            .find(|e| e.ticket == ticket)
            .map(|e| &e.item)
    }

    /// Mutable [`get`](Self::get).
    pub fn get_mut<Q>(&mut self, k: &Q, ticket: u64) -> Option<&mut T>
    where
        K: std::borrow::Borrow<Q>,
        Q: Ord + ?Sized,
    {
        self.queues
            .get_mut(k)?
            .iter_mut()
            .find(|e| e.ticket == ticket)
            .map(|e| &mut e.item)
    }

    /// `ticket` leaves `k`'s queue (admitted, refused, or gone). When it was
    /// the head, the new head (ticket and item) is returned: the driver
    /// wakes it to decide.
    pub fn leave<Q>(&mut self, k: &Q, ticket: u64) -> Option<(u64, &T)>
    where
        K: std::borrow::Borrow<Q>,
        Q: Ord + ?Sized,
    {
        let q = self.queues.get_mut(k)?;
        let i = q.iter().position(|e| e.ticket == ticket)?;
        q.remove(i);
        self.len -= 1;
        if q.is_empty() {
            self.queues.remove(k);
            return None;
        }
        let q = self.queues.get(k)?;
        (i == 0).then(|| q.front().map(|e| (e.ticket, &e.item)))?
    }

    /// Every queue's head (key, ticket, item): the driver wakes them when
    /// capacity may have freed up (a completion, a reload).
    pub fn heads(&self) -> impl Iterator<Item = (&K, u64, &T)> {
        self.queues
            .iter()
            .filter_map(|(k, q)| q.front().map(|e| (k, e.ticket, &e.item)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::admission::{ConsumerPolicy, ConsumerSpec, LimiterConfig, Semantics, Unit};
    use crate::time::NS_PER_SEC;

    fn req(c: usize) -> Request {
        Request {
            consumer: c,
            input_tokens: 1,
            max_tokens: 1,
        }
    }

    /// `per_minute` admissions per minute, no burst: one every 60/per_minute s.
    fn params(per_minute: u64) -> Params {
        let cfg = LimiterConfig {
            capacity: per_minute,
            unit: Unit::Rpm,
            threshold: 1.0,
            burst: Some(0),
            semantics: Semantics::RateLimitOnly,
            accounting: Default::default(),
            consumers: vec![ConsumerSpec {
                name: "A".into(),
                reserved_bp: 0,
                policy: ConsumerPolicy::default(),
            }],
        };
        Params::new(cfg).unwrap()
    }

    fn deny(limit: Limit, retry_at: Nanos) -> Decision {
        Decision::Deny { limit, retry_at }
    }

    #[test]
    fn bound_is_the_nearer_of_deadline_and_max_wait() {
        let b = Bound::new(10, 100, None, 5);
        assert_eq!((b.at, b.refusal), (110, Outcome::RefusedMaxWait));
        let b = Bound::new(10, 100, Some(50), 5);
        assert_eq!(
            (b.at, b.hold, b.refusal),
            (55, 45, Outcome::RefusedDeadline)
        );
        let b = Bound::new(10, 100, Some(500), 5);
        assert_eq!(b.refusal, Outcome::RefusedMaxWait);
        assert_eq!(Bound::new(1, NEVER, None, 0).at, 1 + NEVER / 2);
    }

    #[test]
    fn arrival_head_and_expiry_steps() {
        let w = Waiter::new(Bound::new(0, 1000, None, 0));
        let p = params(60);
        let admit = decide(&p, &mut State::new(&p, 0), 0, &req(0));
        assert_eq!(w.arrived(&admit), Next::Admit);
        assert_eq!(w.decided(5, &admit), Next::Admit);
        assert_eq!(w.arrived(&deny(Limit::Rpm, 500)), Next::Join);
        assert_eq!(w.arrived(&deny(Limit::Concurrent, 5000)), Next::Join);
        let r = |limit, retry_at, o| {
            Next::Refuse(Refusal {
                limit,
                retry_at,
                outcome: o,
            })
        };
        assert_eq!(
            w.arrived(&deny(Limit::Rpm, 1001)),
            r(Limit::Rpm, 1001, Some(Outcome::RefusedMaxWait))
        );
        assert_eq!(
            w.arrived(&deny(Limit::MaxInputTokens, NEVER)),
            r(Limit::MaxInputTokens, NEVER, None)
        );
        assert_eq!(w.predicted(Pred::At(900, Limit::Rpm)), Next::Join);
        assert_eq!(w.predicted(Pred::Unknown), Next::Join);
        assert_eq!(
            w.predicted(Pred::At(1001, Limit::Rpm)),
            r(Limit::Rpm, 1001, Some(Outcome::RefusedMaxWait))
        );
        assert_eq!(w.decided(10, &deny(Limit::Rpm, 500)), Next::Sleep(500));
        assert_eq!(
            w.decided(10, &deny(Limit::Concurrent, 5000)),
            Next::Sleep(1000)
        );
        assert_eq!(
            w.decided(10, &deny(Limit::Rpm, 2000)),
            r(Limit::Rpm, 2000, Some(Outcome::RefusedMaxWait))
        );
        assert_eq!(
            w.decided(1000, &deny(Limit::Rpm, 1000)),
            r(Limit::Rpm, 1000, Some(Outcome::Expired))
        );
        let w = Waiter::new(Bound::new(0, NS_PER_SEC, None, 0));
        assert_eq!(
            w.decided(0, &deny(Limit::Concurrent, NEVER - 1)),
            Next::Sleep(CONCURRENT_POLL)
        );
    }

    #[test]
    fn prediction_admits_each_waiter_ahead_at_its_earliest_time() {
        // one admission per second
        let p = params(60);
        let mut s = State::new(&p, 0);
        assert!(decide(&p, &mut s, 0, &req(0)).is_admit());
        let ahead = [req(0), req(0)];
        match predict(&p, s.clone(), 0, 0, &ahead, &req(0)) {
            // two ahead at 1 s and 2 s, this one at 3 s
            Pred::At(t, Limit::Capacity) => assert_eq!(t, 3 * NS_PER_SEC),
            x => panic!("{x:?}"),
        }
        // nobody ahead: the limiter's own retry time
        let Decision::Deny { retry_at, .. } = decide(&p, &mut s.clone(), 0, &req(0)) else {
            panic!()
        };
        assert_eq!(
            predict(&p, s, 0, 0, [], &req(0)),
            Pred::At(retry_at, Limit::Capacity)
        );
    }

    #[test]
    fn only_the_head_decides_and_leaving_hands_it_on() {
        let mut q: Queues<String, u32> = Queues::new();
        assert!(!q.has("A"));
        let a = q.join("A".into(), req(0), 1);
        let b = q.join("A".into(), req(0), 2);
        let c = q.join("B".into(), req(1), 3);
        assert!(q.has("A") && q.is_head("A", a) && !q.is_head("A", b));
        assert_eq!(q.ahead("A", Some(b)).len(), 1);
        assert_eq!(q.ahead("A", None).len(), 2);
        let heads: Vec<_> = q.heads().map(|(_, t, &i)| (t, i)).collect();
        assert_eq!(heads, vec![(a, 1), (c, 3)]);
        // a non-head leaving changes no head
        let d = q.join("A".into(), req(0), 4);
        assert_eq!(q.leave("A", b), None);
        assert_eq!(q.leave("A", a), Some((d, &4)));
        assert_eq!(q.leave("A", d), None);
        assert!(!q.has("A"));
        assert_eq!(q.len(), 1);
    }
}
