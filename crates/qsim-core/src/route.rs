//! Routing: which target takes a request, as one sans-IO component.
//!
//! A *target* is whatever a request can be sent to: a replica of a pool, a
//! pool of a fleet, an upstream of a gateway route. The driver describes the
//! targets at the moment of choice through [`Targets`] (only the figures
//! the policy reads are asked for, so a policy that ignores prefix caches
//! never makes the driver look one up), and a [`Router`] answers with an
//! index. Ties are broken by an integer draw the driver supplies
//! ([`Below`]): the simulator's seeded stream, or the proxy's generator, so
//! that both drivers given the same draws choose the same targets.
//!
//! Used by the GPU server's replica router (`qsim-sim` `server::Cluster`),
//! by fleets (a pool per target: by length, spillover, scorers) and by the
//! gateway's upstream choice (`First` for priority/spillover order,
//! `Weighted` for balancing; health and cooldowns make a target closed).
//!
//! ```text
//! let mut r = Router::new(Policy::LeastOutstanding);
//! let i = r.pick(&view, &mut below)?;   // None: no target is open
//! ```

use serde::{Deserialize, Serialize};

/// An integer draw in `[0, n)` (`n >= 2`) supplied by the driver, for ties
/// and weighted choice. The simulator passes its ChaCha stream's
/// `gen_range(0..n)`; a closure `FnMut(u64) -> u64` is one.
pub trait Below {
    fn below(&mut self, n: u64) -> u64;
}

impl<F: FnMut(u64) -> u64> Below for F {
    #[inline]
    fn below(&mut self, n: u64) -> u64 {
        self(n)
    }
}

/// What the router may ask of the targets at the moment of choice. Indices
/// are `0..len()`; the order matters to [`Policy::First`] and
/// [`Policy::Spill`] (priority order) and to [`Policy::RoundRobin`].
pub trait Targets {
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Takes new requests now (ready; not draining; not cooling down or
    /// behind an open circuit; under its own limit). Closed targets are
    /// never chosen.
    #[inline]
    fn open(&self, _i: usize) -> bool {
        true
    }
    /// Requests waiting + running.
    fn outstanding(&self, i: usize) -> u64;
    /// Requests waiting (queue depth); by default the outstanding count.
    #[inline]
    fn waiting(&self, i: usize) -> u64 {
        self.outstanding(i)
    }
    /// KV-cache blocks in use, and the capacity (0 when unknown).
    #[inline]
    fn kv(&self, _i: usize) -> (u64, u64) {
        (0, 0)
    }
    /// Blocks of this request's prefix the target has cached (0 without
    /// prefix caching), and the request's blocks in all ([`Policy::Scored`]).
    #[inline]
    fn prefix_hit(&self, _i: usize) -> (u64, u64) {
        (0, 0)
    }
}

/// Thresholds past which a target spills to the next in order.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, Default)]
pub struct Spill {
    /// Spill when this many requests or more are waiting.
    pub max_waiting: Option<u64>,
    /// Spill when the KV cache is this full or fuller (a fraction in (0, 1]).
    pub max_kv: Option<f64>,
}

/// Weights of llm-d-style scorers, each score in `[0, 1]` (higher is
/// better); the target with the highest weighted sum wins, ties at random.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, Default)]
pub struct Scorers {
    /// `(max − waiting) / (max − min)` over the open targets (1 when equal).
    pub queue: f64,
    /// `1 − kv_used / kv_total`.
    pub kv: f64,
    /// The share of the request's blocks the target has cached.
    pub prefix: f64,
}

/// How a router chooses among the open targets.
#[derive(Debug, Clone, PartialEq)]
pub enum Policy {
    /// The first open target in order (priority; fallback order).
    First,
    /// The next open target after the previous choice.
    RoundRobin,
    /// At random in proportion to the weights (one per target, > 0).
    Weighted(Vec<u64>),
    /// Fewest outstanding (ties at random).
    LeastOutstanding,
    /// Fewest KV blocks in use, then fewest outstanding (ties at random).
    LeastKv,
    /// The first open target in order not past the thresholds; when every
    /// open target is past them, the last open one (the overflow).
    Spill(Spill),
    /// The highest weighted score (ties at random).
    Scored(Scorers),
}

impl Policy {
    /// The policy reads nothing of the targets but whether they are open
    /// and their outstanding counts (a driver may then keep the targets'
    /// other figures stale between choices).
    pub fn reads_outstanding_only(&self) -> bool {
        matches!(
            self,
            Policy::First | Policy::RoundRobin | Policy::Weighted(_) | Policy::LeastOutstanding
        )
    }

    /// The policy's name in configs and reports.
    pub fn name(&self) -> &'static str {
        match self {
            Policy::First => "first",
            Policy::RoundRobin => "round_robin",
            Policy::Weighted(_) => "weighted",
            Policy::LeastOutstanding => "least_outstanding",
            Policy::LeastKv => "least_kv",
            Policy::Spill(_) => "spill",
            Policy::Scored(_) => "scored",
        }
    }
}

/// A policy and its own state (the round-robin position).
#[derive(Debug, Clone, PartialEq)]
pub struct Router {
    policy: Policy,
    rr: usize,
}

impl Router {
    pub fn new(policy: Policy) -> Self {
        Router { policy, rr: 0 }
    }

    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The chosen target, or `None` when no target is open. Draws from
    /// `below` only to break a tie among two or more equal targets, or for
    /// [`Policy::Weighted`] when two or more targets are open.
    pub fn pick<T: Targets + ?Sized, B: Below + ?Sized>(
        &mut self,
        t: &T,
        below: &mut B,
    ) -> Option<usize> {
        let n = t.len();
        match &self.policy {
            Policy::First => (0..n).find(|&i| t.open(i)),
            Policy::RoundRobin => {
                for k in 0..n {
                    let i = (self.rr + k) % n;
                    if t.open(i) {
                        self.rr = (i + 1) % n;
                        return Some(i);
                    }
                }
                None
            }
            Policy::Weighted(w) => {
                let weight = |i: usize| w.get(i).copied().unwrap_or(0);
                let total: u64 = (0..n)
                    .filter(|&i| t.open(i))
                    .map(weight)
                    .fold(0u64, u64::saturating_add);
                if total == 0 {
                    return None;
                }
                let open: Vec<usize> = (0..n).filter(|&i| t.open(i) && weight(i) > 0).collect();
                if open.len() == 1 {
                    return Some(open[0]);
                }
                let mut x = below.below(total);
                for i in open {
                    let wi = weight(i);
                    if x < wi {
                        return Some(i);
                    }
                    x -= wi;
                }
                None
            }
            Policy::LeastOutstanding => min_key(t, below, |i| (t.outstanding(i), 0)),
            Policy::LeastKv => min_key(t, below, |i| (t.kv(i).0, t.outstanding(i))),
            Policy::Spill(s) => {
                let past = |i: usize| {
                    s.max_waiting.is_some_and(|m| t.waiting(i) >= m)
                        || s.max_kv.is_some_and(|m| {
                            let (used, total) = t.kv(i);
                            total > 0 && used as f64 >= m * total as f64
                        })
                };
                let mut last = None;
                for i in 0..n {
                    if t.open(i) {
                        if !past(i) {
                            return Some(i);
                        }
                        last = Some(i);
                    }
                }
                last
            }
            Policy::Scored(w) => {
                let w = *w;
                let open = || (0..n).filter(|&i| t.open(i));
                let (mut qmin, mut qmax) = (u64::MAX, 0u64);
                if w.queue != 0.0 {
                    for i in open() {
                        let q = t.waiting(i);
                        qmin = qmin.min(q);
                        qmax = qmax.max(q);
                    }
                }
                let score = |i: usize| -> f64 {
                    let mut s = 0.0;
                    if w.queue != 0.0 {
                        let q = t.waiting(i);
                        s += w.queue
                            * if qmax > qmin {
                                (qmax - q) as f64 / (qmax - qmin) as f64
                            } else {
                                1.0
                            };
                    }
                    if w.kv != 0.0 {
                        let (used, total) = t.kv(i);
                        if total > 0 {
                            s += w.kv * (1.0 - used.min(total) as f64 / total as f64);
                        }
                    }
                    if w.prefix != 0.0 {
                        let (hit, all) = t.prefix_hit(i);
                        if all > 0 {
                            s += w.prefix * hit.min(all) as f64 / all as f64;
                        }
                    }
                    s
                };
                let mut best = f64::NEG_INFINITY;
                let mut ties: Vec<usize> = Vec::new();
                for i in open() {
                    let s = score(i);
                    if s > best {
                        best = s;
                        ties.clear();
                        ties.push(i);
                    } else if s == best {
                        ties.push(i);
                    }
                }
                match ties.len() {
                    0 => None,
                    1 => Some(ties[0]),
                    k => Some(ties[below.below(k as u64) as usize]),
                }
            }
        }
    }
}

/// The open target with the smallest key; among `k >= 2` equal ones the
/// `below(k)`-th in index order. One pass for the minimum and its count,
/// a second only on a tie.
#[inline]
fn min_key<T, B, K>(t: &T, below: &mut B, key: K) -> Option<usize>
where
    T: Targets + ?Sized,
    B: Below + ?Sized,
    K: Fn(usize) -> (u64, u64),
{
    let n = t.len();
    let (mut best, mut ties, mut first) = ((u64::MAX, u64::MAX), 0u64, None);
    for i in 0..n {
        if !t.open(i) {
            continue;
        }
        let x = key(i);
        if first.is_none() || x < best {
            (best, ties, first) = (x, 1, Some(i));
        } else if x == best {
            ties += 1;
        }
    }
    if ties <= 1 {
        return first;
    }
    let mut k = below.below(ties);
    for i in 0..n {
        if t.open(i) && key(i) == best {
            if k == 0 {
                return Some(i);
            }
            k -= 1;
        }
    }
    unreachable!("an open target has the minimum key")
}

/// Prefill/decode disaggregation's one choice (BLIS's and llm-d's
/// decode-first flow): the decode replica is chosen first, then the
/// request's prompt is prefilled on the prefill pool unless what that
/// replica would compute itself (the `prompt` less the `cached` prefix it
/// holds) is at most `local_max` tokens (short prompts and cached prefixes
/// skip the prefill pool and its KV transfer).
#[inline]
pub fn remote_prefill(prompt: u32, cached: u32, local_max: u32) -> bool {
    prompt.saturating_sub(cached) > local_max
}

#[cfg(test)]
mod tests {
    #[test]
    fn prefill_goes_remote_past_the_local_share() {
        use super::remote_prefill;
        assert!(remote_prefill(1000, 0, 0));
        assert!(!remote_prefill(1000, 0, 1000));
        assert!(remote_prefill(1001, 0, 1000));
        assert!(!remote_prefill(1000, 512, 488));
        assert!(remote_prefill(1000, 512, 487));
        assert!(!remote_prefill(100, 200, 0));
    }

    use super::*;

    struct View {
        open: Vec<bool>,
        out: Vec<u64>,
        kv: Vec<(u64, u64)>,
        hit: Vec<(u64, u64)>,
    }

    impl View {
        fn new(out: &[u64]) -> Self {
            View {
                open: vec![true; out.len()],
                out: out.to_vec(),
                kv: vec![(0, 100); out.len()],
                hit: vec![(0, 0); out.len()],
            }
        }
    }

    impl Targets for View {
        fn len(&self) -> usize {
            self.out.len()
        }
        fn open(&self, i: usize) -> bool {
            self.open[i]
        }
        fn outstanding(&self, i: usize) -> u64 {
            self.out[i]
        }
        fn kv(&self, i: usize) -> (u64, u64) {
            self.kv[i]
        }
        fn prefix_hit(&self, i: usize) -> (u64, u64) {
            self.hit[i]
        }
    }

    fn never(_: u64) -> u64 {
        panic!("no draw expected")
    }

    #[test]
    fn first_and_round_robin_skip_closed_targets() {
        let mut v = View::new(&[0, 0, 0]);
        v.open[0] = false;
        assert_eq!(Router::new(Policy::First).pick(&v, &mut never), Some(1));
        let mut rr = Router::new(Policy::RoundRobin);
        let got: Vec<_> = (0..4).map(|_| rr.pick(&v, &mut never).unwrap()).collect();
        assert_eq!(got, [1, 2, 1, 2]);
        v.open = vec![false; 3];
        assert_eq!(rr.pick(&v, &mut never), None);
        assert_eq!(Router::new(Policy::First).pick(&v, &mut never), None);
    }

    #[test]
    fn least_outstanding_draws_only_on_a_tie() {
        let v = View::new(&[3, 1, 2]);
        let mut r = Router::new(Policy::LeastOutstanding);
        assert_eq!(r.pick(&v, &mut never), Some(1));
        let v = View::new(&[1, 4, 1, 1]);
        let mut asked = vec![];
        let mut b = |n: u64| {
            asked.push(n);
            2
        };
        assert_eq!(r.pick(&v, &mut b), Some(3));
        assert_eq!(asked, [3]);
    }

    #[test]
    fn least_kv_breaks_kv_ties_by_outstanding() {
        let mut v = View::new(&[5, 2, 9]);
        v.kv = vec![(10, 100), (10, 100), (3, 100)];
        assert_eq!(Router::new(Policy::LeastKv).pick(&v, &mut never), Some(2));
        v.kv[2] = (10, 100);
        assert_eq!(Router::new(Policy::LeastKv).pick(&v, &mut never), Some(1));
    }

    #[test]
    fn weighted_follows_the_draw_over_open_targets() {
        let mut v = View::new(&[0, 0, 0]);
        let mut r = Router::new(Policy::Weighted(vec![1, 3, 6]));
        let pick = |r: &mut Router, v: &View, x: u64| {
            r.pick(v, &mut |n: u64| {
                assert!(x < n);
                x
            })
        };
        assert_eq!(pick(&mut r, &v, 0), Some(0));
        assert_eq!(pick(&mut r, &v, 1), Some(1));
        assert_eq!(pick(&mut r, &v, 3), Some(1));
        assert_eq!(pick(&mut r, &v, 4), Some(2));
        assert_eq!(pick(&mut r, &v, 9), Some(2));
        v.open[2] = false;
        assert_eq!(pick(&mut r, &v, 3), Some(1));
        v.open[1] = false;
        assert_eq!(r.pick(&v, &mut never), Some(0));
    }

    #[test]
    fn spill_takes_the_first_target_under_its_thresholds_else_the_last() {
        let mut v = View::new(&[4, 0, 7]);
        let s = Spill {
            max_waiting: Some(4),
            max_kv: Some(0.9),
        };
        let mut r = Router::new(Policy::Spill(s));
        assert_eq!(r.pick(&v, &mut never), Some(1));
        v.kv[1] = (95, 100);
        assert_eq!(r.pick(&v, &mut never), Some(2));
        v.out[2] = 4;
        assert_eq!(r.pick(&v, &mut never), Some(2), "all past: the last open");
        v.open[2] = false;
        assert_eq!(r.pick(&v, &mut never), Some(1));
    }

    #[test]
    fn scored_weighs_queue_kv_and_prefix() {
        let mut v = View::new(&[0, 8, 4]);
        v.kv = vec![(90, 100), (0, 100), (50, 100)];
        v.hit = vec![(0, 10), (0, 10), (10, 10)];
        let only = |q, k, p| {
            Router::new(Policy::Scored(Scorers {
                queue: q,
                kv: k,
                prefix: p,
            }))
        };
        assert_eq!(only(1.0, 0.0, 0.0).pick(&v, &mut never), Some(0));
        assert_eq!(only(0.0, 1.0, 0.0).pick(&v, &mut never), Some(1));
        assert_eq!(only(0.0, 0.0, 1.0).pick(&v, &mut never), Some(2));
        // queue 0.5 + kv 0.5 + prefix 1.0 beats the others' 1.0 + 0.1 and 0 + 1.0
        assert_eq!(only(1.0, 1.0, 1.0).pick(&v, &mut never), Some(2));
    }
}
