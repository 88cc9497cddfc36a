//! Issue 21 (one copy of every rule): the same recorded sequence driven
//! through the proxy's wait queue and through `qsim whatif` gives the same
//! admit / wait / reject decisions.
//!
//! (a) A fixed sequence of requests (three consumers: A waits up to 70 s
//! under 2 rpm, B waits up to 1.5 s under `concurrent = 1`, C rejects under
//! 1 rpm) is driven in virtual time through the core's waiting component
//! by [`proxy`], a driver that takes the proxy's steps in the order
//! `qsim-live/src/wait.rs` takes them (decide on arrival or predict behind
//! waiters, join, the head decides, sleep until the retry time or a wake-up
//! — a `Notify` permit —, a completion wakes every head, leaving hands the
//! head on); what it decides is written as the proxy's decision log
//! (`Record`s, as `handler.rs` fills them).
//! (b) `qsim whatif`'s replay of that log under the same policy.
//! Each request's decision (admitted at t / waited until t / refused at t
//! with which outcome and retry hint) must be the same.

use qsim_api::whatif::{replay, Replayed};
use qsim_core::limiter::admission::{
    complete, decide, ConsumerPolicy, ConsumerSpec, Decision, Grant, Limit, LimiterConfig, Params,
    Request, Semantics, State, Unit,
};
use qsim_core::limiter::wait::{self, Bound, Next, Queues, Refusal, Waiter};
use qsim_core::time::{Nanos, NEVER};
use qsim_live::record::Record;
use qsim_live::OnLimit;
use std::time::Duration;

const MS: Nanos = 1_000_000;

fn policy() -> (Params, Vec<OnLimit>) {
    let c = |name: &str, rpm, concurrent| ConsumerSpec {
        name: name.into(),
        reserved_bp: 0,
        policy: ConsumerPolicy {
            rpm,
            concurrent,
            ..Default::default()
        },
    };
    let cfg = LimiterConfig {
        capacity: 6000,
        unit: Unit::Rpm,
        threshold: 1.0,
        burst: Some(0),
        semantics: Semantics::RateLimitOnly,
        accounting: Default::default(),
        consumers: vec![
            c("A", Some(2), None),
            c("B", None, Some(1)),
            c("C", Some(1), None),
        ],
    };
    let on_limit = vec![
        OnLimit::Wait {
            max_wait: Duration::from_secs(70),
        },
        OnLimit::Wait {
            max_wait: Duration::from_millis(1500),
        },
        OnLimit::Reject,
    ];
    (Params::new(cfg).unwrap(), on_limit)
}

/// (arrival ms, consumer, duration ms): A's queue (FIFO, refusals at once by
/// prediction), B's (completion wake-ups, polls, expiry), C rejecting.
const SEQUENCE: &[(u64, usize, u64)] = &[
    (0, 0, 333),
    (10, 2, 100),
    (20, 2, 100),
    (50, 1, 420),
    (100, 0, 333),
    (150, 1, 420),
    (200, 0, 333),
    (201, 1, 420),
    (250, 1, 420),
    (300, 0, 333),
    (301, 1, 420),
    (321, 1, 420),
    (350, 0, 333),
    (600, 2, 100),
    (3101, 1, 420),
    (3130, 1, 420),
    (61000, 0, 333),
    (100000, 0, 333),
];

/// One request's fate: (decision, decided at, limit, retry hint ms).
type Fate = (&'static str, Nanos, Option<Limit>, Option<u64>);

struct Task {
    req: Request,
    arrival: Nanos,
    duration: Nanos,
    waiter: Option<Waiter>,
    ticket: u64,
    /// Sleeping until (the head: its retry time; another: its bound).
    sleep: Option<Nanos>,
    /// A `Notify` permit: a wake-up not yet consumed.
    permit: bool,
    fate: Option<Fate>,
}

/// The proxy's order of operations (`qsim-live/src/wait.rs`, `body.rs`'s
/// wake-ups on completion) in virtual time.
struct Proxy {
    p: Params,
    on_limit: Vec<OnLimit>,
    s: State,
    q: Queues<usize, usize>,
    tasks: Vec<Task>,
    /// (time, grant, output) of admitted requests.
    done: Vec<(Nanos, Grant, u64)>,
    now: Nanos,
}

impl Proxy {
    fn end(&mut self, i: usize, fate: Fate) {
        self.tasks[i].fate = Some(fate);
        self.tasks[i].sleep = None;
    }

    fn admit(&mut self, i: usize, now: Nanos, g: Grant, label: &'static str) {
        let d = now + self.tasks[i].duration;
        self.done.push((d, g, 1));
        self.end(i, (label, now, None, None));
    }

    fn refuse(&mut self, i: usize, now: Nanos, r: Refusal) {
        let hint = (r.retry_at != NEVER).then(|| qsim_live::wait_ms(r.retry_at, now));
        let label = r.outcome.map_or("refused", wait::Outcome::name);
        self.end(i, (label, now, Some(r.limit), hint));
    }

    /// Drop guard of the ticket: leave, notify the new head.
    fn leave(&mut self, i: usize) {
        let c = self.tasks[i].req.consumer;
        if let Some((_, &j)) = self.q.leave(&c, self.tasks[i].ticket) {
            self.tasks[j].permit = true;
        }
    }

    fn arrive(&mut self, i: usize, now: Nanos) {
        let req = self.tasks[i].req;
        let c = req.consumer;
        let OnLimit::Wait { max_wait } = self.on_limit[c] else {
            match decide(&self.p, &mut self.s, now, &req) {
                Decision::Admit(g) => self.admit(i, now, g, "admitted"),
                Decision::Deny { limit, retry_at } => {
                    let hint = (retry_at != NEVER).then(|| qsim_live::wait_ms(retry_at, now));
                    self.end(i, ("limited", now, Some(limit), hint));
                }
            }
            return;
        };
        let w = Waiter::new(Bound::new(now, max_wait.as_nanos() as Nanos, None, 0));
        self.tasks[i].waiter = Some(w);
        if !self.q.has(&c) {
            match decide(&self.p, &mut self.s, now, &req) {
                Decision::Admit(g) => return self.admit(i, now, g, "admitted"),
                d => {
                    if let Next::Refuse(r) = w.arrived(&d) {
                        return self.refuse(i, now, r);
                    }
                }
            }
        } else {
            let ahead = self.q.ahead(&c, None);
            let p = wait::predict(&self.p, self.s.clone(), now, c, &ahead, &req);
            if let Next::Refuse(r) = w.predicted(p) {
                return self.refuse(i, now, r);
            }
        }
        self.tasks[i].ticket = self.q.join(c, req, i);
        self.run(i, now, false);
    }

    /// The loop of `wait::admit` after joining; `timer`: resumed by its
    /// sleep (else by a wake-up, or first entered).
    fn run(&mut self, i: usize, now: Nanos, timer: bool) {
        let (req, ticket) = (self.tasks[i].req, self.tasks[i].ticket);
        let w = self.tasks[i].waiter.unwrap();
        let c = req.consumer;
        let mut timer = timer;
        loop {
            if self.q.is_head(&c, ticket) {
                let d = decide(&self.p, &mut self.s, now, &req);
                if let Decision::Admit(g) = d {
                    self.leave(i);
                    return self.admit(i, now, g, "waited");
                }
                match w.decided(now, &d) {
                    Next::Sleep(u) => {
                        if std::mem::take(&mut self.tasks[i].permit) {
                            continue; // select!: the stored permit wakes it at once
                        }
                        self.tasks[i].sleep = Some(u);
                        return;
                    }
                    Next::Refuse(r) => {
                        self.leave(i);
                        return self.refuse(i, now, r);
                    }
                    n => panic!("{n:?}"),
                }
            } else if timer && now >= w.bound.at {
                let ahead = self.q.ahead(&c, Some(ticket));
                let p = wait::predict(&self.p, self.s.clone(), now, c, &ahead, &req);
                self.leave(i);
                return self.refuse(i, now, w.expired(p));
            } else {
                if std::mem::take(&mut self.tasks[i].permit) {
                    timer = false;
                    continue;
                }
                self.tasks[i].sleep = Some(w.bound.at);
                return;
            }
        }
    }

    fn go(mut self) -> Vec<Fate> {
        let mut next_arrival = 0;
        loop {
            // a waiting task holding a permit runs now
            if let Some(i) = (0..self.tasks.len())
                .find(|&i| self.tasks[i].permit && self.tasks[i].sleep.is_some())
            {
                let now = self.now;
                self.tasks[i].permit = false;
                self.tasks[i].sleep = None;
                self.run(i, now, false);
                continue;
            }
            let arrival = self.tasks.get(next_arrival).map(|t| t.arrival);
            let completion = self.done.iter().map(|d| d.0).min();
            let timer = self.tasks.iter().filter_map(|t| t.sleep).min();
            let Some(now) = [arrival, completion, timer].into_iter().flatten().min() else {
                break;
            };
            self.now = now;
            if completion == Some(now) {
                let k = self.done.iter().position(|d| d.0 == now).unwrap();
                let (_, g, out) = self.done.remove(k);
                complete(&self.p, &mut self.s, now, &g, out);
                let heads: Vec<usize> = self.q.heads().map(|(_, _, &j)| j).collect();
                for j in heads {
                    self.tasks[j].permit = true;
                }
            } else if arrival == Some(now) {
                next_arrival += 1;
                self.arrive(next_arrival - 1, now);
            } else {
                let i = (0..self.tasks.len())
                    .find(|&i| self.tasks[i].sleep == Some(now))
                    .unwrap();
                self.tasks[i].sleep = None;
                self.tasks[i].permit = false; // the sleep won the select!
                self.run(i, now, true);
            }
        }
        self.tasks.iter().map(|t| t.fate.unwrap()).collect()
    }
}

/// (a): the proxy's fates.
fn proxy(p: &Params, on_limit: &[OnLimit]) -> Vec<Fate> {
    let tasks = SEQUENCE
        .iter()
        .map(|&(t, c, d)| Task {
            req: Request {
                consumer: c,
                input_tokens: 10,
                max_tokens: 10,
            },
            arrival: t * MS,
            duration: d * MS,
            waiter: None,
            ticket: 0,
            sleep: None,
            permit: false,
            fate: None,
        })
        .collect();
    Proxy {
        p: p.clone(),
        on_limit: on_limit.to_vec(),
        s: State::new(p, 0),
        q: Queues::new(),
        tasks,
        done: Vec::new(),
        now: 0,
    }
    .go()
}

/// The decision log the proxy writes for those fates (`handler.rs`).
fn log(fates: &[Fate], on_limit: &[OnLimit]) -> Vec<Record> {
    let names = ["A", "B", "C"];
    SEQUENCE
        .iter()
        .zip(fates)
        .enumerate()
        .map(|(i, (&(t, c, d), &(label, at, limit, hint)))| {
            let arrival = t * MS;
            let admitted = matches!(label, "admitted" | "waited");
            let decision = match (admitted, on_limit[c]) {
                (true, OnLimit::Wait { .. }) if at - arrival >= MS => "waited",
                (true, _) => "admitted",
                (false, OnLimit::Reject) => "limited",
                (false, OnLimit::Wait { .. }) => "refused_max_wait",
            };
            Record {
                id: i as u64,
                consumer: names[c].into(),
                arrival_ns: arrival,
                decided_ns: Some(at),
                input_tokens: Some(10),
                max_tokens: Some(10),
                decision: decision.into(),
                limit: limit.map(|l| l.name().into()),
                wait_ns: (decision == "waited").then_some(at - arrival),
                retry_after_ms: hint,
                status: if admitted { 200 } else { 429 },
                end_ns: admitted.then_some(at + d * MS),
                settled_output: admitted.then_some(1),
                ..Default::default()
            }
        })
        .collect()
}

/// (b): `qsim whatif`'s fates, per record.
fn whatif(recs: &[Record], p: &Params, on_limit: &[OnLimit]) -> Vec<Fate> {
    let o = replay(recs, p, on_limit, (None, None));
    assert_eq!(o.decisions.len(), recs.len(), "one decision per request");
    let mut out: Vec<Option<Fate>> = vec![None; recs.len()];
    for Replayed {
        record,
        decided,
        decision,
        limit,
        retry_after_ms,
        ..
    } in o.decisions
    {
        out[record] = Some((decision, decided, limit, retry_after_ms));
    }
    out.into_iter().map(Option::unwrap).collect()
}

#[test]
fn the_proxys_wait_queue_and_whatif_decide_alike() {
    let (p, on_limit) = policy();
    let a = proxy(&p, &on_limit);
    // the sequence exercises every path
    for label in [
        "admitted",
        "waited",
        "limited",
        "refused_max_wait",
        "expired",
    ] {
        assert!(a.iter().any(|f| f.0 == label), "no {label}: {a:#?}");
    }
    // A: two admitted, then two waiters admitted in order, the fifth
    // refused at once (its prediction behind them is beyond 70 s)
    assert_eq!((a[0].0, a[4].0), ("admitted", "admitted"), "{a:#?}");
    assert!(
        a[6].0 == "waited" && a[9].0 == "waited" && a[6].1 < a[9].1,
        "{a:#?}"
    );
    assert_eq!((a[12].0, a[12].1), ("refused_max_wait", 350 * MS), "{a:#?}");
    // B: admitted on completions, one after the other; the sixth expires
    assert_eq!((a[5].0, a[5].1), ("waited", 470 * MS), "{a:#?}");
    assert_eq!((a[11].0, a[11].1), ("expired", 1821 * MS), "{a:#?}");
    let recs = log(&a, &on_limit);
    let b = whatif(&recs, &p, &on_limit);
    for (i, (x, y)) in a.iter().zip(&b).enumerate() {
        assert_eq!(
            x, y,
            "request {i} {:?}: proxy {x:?}, whatif {y:?}\nproxy: {a:#?}\nwhatif: {b:#?}",
            SEQUENCE[i]
        );
    }
}
