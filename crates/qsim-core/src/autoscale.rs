//! The autoscaler: how many replicas a deployment should have, as a sans-IO
//! state machine (issue 25).
//!
//! Every `interval` the driver hands it `now` and an [`Observation`] of the
//! whole deployment; it keeps the last `window / interval` samples of the
//! chosen [`Metric`], and wants `desired = ⌈mean / target⌉` replicas
//! (clamped to `[min, max]`; `target` is per replica). Against the replicas
//! it has asked for so far (`provisioned`: ready or still starting):
//!
//! - **scale up** at once when `desired > provisioned`: the new replicas are
//!   ready `cold_start` later (the driver starts them; they serve nothing
//!   before);
//! - **scale down** only after `desired` has stayed below `provisioned` at
//!   every sample for `scale_down_delay`, to the largest `desired` seen
//!   over that time (Kubernetes' stabilization window); the driver drains the
//!   replicas it removes (no new requests; gone when empty).
//!
//! The metric is sampled, not integrated: a sample is the state at the
//! tick (queue length, concurrency, KV use) or the arrivals since the
//! previous tick (request rate), like an autoscaler scraping a metrics
//! endpoint. Before the window has filled, the mean is over the samples
//! taken so far.

use crate::time::{Nanos, NEVER, NS_PER_SEC};
use std::collections::VecDeque;

/// What the autoscaler watches, summed over the ready replicas.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Metric {
    /// Requests waiting (not yet in a running batch).
    QueueLength,
    /// Requests in the server (waiting + running).
    Concurrency,
    /// KV cache in use, as a fraction of one replica's cache (the sum over
    /// replicas: 1.5 = one and a half replicas' worth).
    KvUse,
    /// Arrivals per minute.
    RequestRate,
}

impl Metric {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "queue_length" => Some(Metric::QueueLength),
            "concurrency" => Some(Metric::Concurrency),
            "kv_use" => Some(Metric::KvUse),
            "request_rate" => Some(Metric::RequestRate),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Metric::QueueLength => "queue_length",
            Metric::Concurrency => "concurrency",
            Metric::KvUse => "kv_use",
            Metric::RequestRate => "request_rate",
        }
    }
}

/// The autoscaler's settings.
#[derive(Debug, Clone, PartialEq)]
pub struct Params {
    pub min: u32,
    pub max: u32,
    pub metric: Metric,
    /// The metric's target per replica (request rate: requests per minute).
    pub target: f64,
    /// The averaging window.
    pub window: Nanos,
    /// Sampling (and decision) period.
    pub interval: Nanos,
    /// From the decision to scale up until the new replica serves (the
    /// cold start: container start, weights loaded, warm-up).
    pub cold_start: Nanos,
    /// How long `desired` must stay below the replicas before scaling down.
    pub scale_down_delay: Nanos,
}

impl Params {
    /// Check the settings; the error names the field (as in a config file's
    /// `autoscale` table) and the reason.
    pub fn check(&self) -> Result<(), (&'static str, String)> {
        if self.min < 1 {
            return Err(("min", format!("must be at least 1, got {}", self.min)));
        }
        if self.max < self.min {
            return Err((
                "max",
                format!("must be at least min ({}), got {}", self.min, self.max),
            ));
        }
        if !(self.target.is_finite() && self.target > 0.0) {
            return Err(("target", format!("must be above 0, got {}", self.target)));
        }
        if self.interval == 0 || self.interval == NEVER {
            return Err(("interval_s", "must be above 0".into()));
        }
        if self.window < self.interval {
            return Err(("window_s", "must be at least interval_s".into()));
        }
        if self.window / self.interval > 1_000_000 {
            return Err((
                "window_s",
                "more than 1,000,000 samples in one window".into(),
            ));
        }
        Ok(())
    }

    fn samples(&self) -> usize {
        (self.window / self.interval) as usize
    }
}

/// The deployment as the driver sees it at a tick (sums over ready replicas).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Observation {
    pub waiting: f64,
    pub outstanding: f64,
    /// Σ over replicas of KV blocks in use / blocks.
    pub kv_use: f64,
    /// Arrivals since the start (a counter; the autoscaler takes differences).
    pub arrivals: u64,
}

/// A change of the number of replicas, decided at `at`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    pub at: Nanos,
    pub from: u32,
    pub to: u32,
    /// Scale up: when the new replicas serve (`at + cold_start`); scale
    /// down: `at` (the removed replicas stop taking requests at once).
    pub ready_at: Nanos,
}

/// The autoscaler's state.
#[derive(Debug, Clone)]
pub struct Autoscaler {
    p: Params,
    samples: VecDeque<f64>,
    last_arrivals: u64,
    next: Nanos,
    provisioned: u32,
    /// Since when `desired` has been below `provisioned`, and its largest
    /// value since then.
    below: Option<(Nanos, u32)>,
}

impl Autoscaler {
    /// Starting at `now` with `min` replicas ready; the first sample is
    /// taken at `now + interval`. `p` must have passed [`Params::check`].
    pub fn new(p: Params, now: Nanos) -> Self {
        Autoscaler {
            samples: VecDeque::with_capacity(p.samples()),
            last_arrivals: 0,
            next: now.saturating_add(p.interval),
            provisioned: p.min,
            below: None,
            p,
        }
    }

    pub fn params(&self) -> &Params {
        &self.p
    }

    /// Replicas asked for so far (ready or starting).
    pub fn provisioned(&self) -> u32 {
        self.provisioned
    }

    /// The next tick.
    pub fn poll_timeout(&self) -> Nanos {
        self.next
    }

    /// The mean of the window's samples (0 before the first).
    pub fn mean(&self) -> f64 {
        if self.samples.is_empty() {
            0.0
        } else {
            self.samples.iter().sum::<f64>() / self.samples.len() as f64
        }
    }

    /// A tick at `now` (at or after [`poll_timeout`](Self::poll_timeout)):
    /// take a sample of `obs`, maybe decide a change.
    pub fn on_tick(&mut self, now: Nanos, obs: &Observation) -> Option<Decision> {
        let dt = self.p.interval as f64 / NS_PER_SEC as f64;
        let v = match self.p.metric {
            Metric::QueueLength => obs.waiting,
            Metric::Concurrency => obs.outstanding,
            Metric::KvUse => obs.kv_use,
            Metric::RequestRate => {
                (obs.arrivals.saturating_sub(self.last_arrivals)) as f64 * 60.0 / dt
            }
        };
        self.last_arrivals = obs.arrivals;
        if self.samples.len() == self.p.samples() {
            self.samples.pop_front();
        }
        self.samples.push_back(v);
        // the next tick on the grid after `now`
        while self.next <= now {
            self.next = self.next.saturating_add(self.p.interval);
        }
        let want = (self.mean() / self.p.target).ceil();
        let desired = if want.is_finite() {
            want.clamp(self.p.min as f64, self.p.max as f64) as u32
        } else {
            self.p.max
        };
        let from = self.provisioned;
        if desired > from {
            self.below = None;
            self.provisioned = desired;
            return Some(Decision {
                at: now,
                from,
                to: desired,
                ready_at: now.saturating_add(self.p.cold_start),
            });
        }
        if desired == from {
            self.below = None;
            return None;
        }
        let (since, hold) = match self.below {
            Some((s, h)) => (s, h.max(desired)),
            None => (now, desired),
        };
        if now - since >= self.p.scale_down_delay {
            // still below the new count: its wait starts now
            self.below = (desired < hold).then_some((now, desired));
            self.provisioned = hold;
            return Some(Decision {
                at: now,
                from,
                to: hold,
                ready_at: now,
            });
        }
        self.below = Some((since, hold));
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Nanos = NS_PER_SEC;

    fn params() -> Params {
        Params {
            min: 1,
            max: 5,
            metric: Metric::Concurrency,
            target: 10.0,
            window: 60 * S,
            interval: S,
            cold_start: 120 * S,
            scale_down_delay: 300 * S,
        }
    }

    /// Drive `a` from the tick after `from` to `to` with `obs(t)`; the decisions.
    fn drive(a: &mut Autoscaler, to: Nanos, obs: impl Fn(Nanos) -> Observation) -> Vec<Decision> {
        let mut out = vec![];
        while a.poll_timeout() <= to {
            let t = a.poll_timeout();
            out.extend(a.on_tick(t, &obs(t)));
        }
        out
    }

    fn conc(v: f64) -> Observation {
        Observation {
            outstanding: v,
            ..Default::default()
        }
    }

    #[test]
    fn a_step_scales_up_when_the_window_mean_passes_the_target_then_cold_starts() {
        let mut a = Autoscaler::new(params(), 0);
        // 5 in flight until 600 s, then 25 (2.5 replicas' worth)
        let d = drive(&mut a, 3600 * S, |t| {
            conc(if t <= 600 * S { 5.0 } else { 25.0 })
        });
        // window of 60 samples: at 600 + k s the mean is (5·(60 − k) + 25·k)/60;
        // above 10 from k = 16 (mean 10.33), above 20 from k = 46 (20.33)
        assert_eq!(
            d,
            vec![
                Decision {
                    at: 616 * S,
                    from: 1,
                    to: 2,
                    ready_at: 736 * S
                },
                Decision {
                    at: 646 * S,
                    from: 2,
                    to: 3,
                    ready_at: 766 * S
                },
            ]
        );
    }

    #[test]
    fn scale_down_waits_its_delay_and_keeps_the_largest_desired() {
        let mut a = Autoscaler::new(params(), 0);
        let load = |t: Nanos| {
            conc(if t <= 100 * S {
                45.0
            } else if t <= 200 * S {
                15.0
            } else {
                0.0
            })
        };
        let d = drive(&mut a, 2000 * S, load);
        // up: mean > 10 at 3 s (45·3/3), > 20 at 1 s already: one decision to 5 at 1 s
        assert_eq!(
            d[0],
            Decision {
                at: S,
                from: 1,
                to: 5,
                ready_at: 121 * S
            }
        );
        // desired falls below 5 when the mean drops to ≤ 40: at 100 + k s the
        // mean is (45·(60 − k) + 15·k)/60 ≤ 40 from k = 10 → below since 110 s,
        // 300 s later (410 s) down to the largest desired since (4)
        assert_eq!(
            d[1],
            Decision {
                at: 410 * S,
                from: 5,
                to: 4,
                ready_at: 410 * S
            }
        );
        // from 410 s desired is 1 (the window is all zeros since 260 s):
        // below 4 since 410 s → down to 1 at 710 s
        assert_eq!(
            d[2],
            Decision {
                at: 710 * S,
                from: 4,
                to: 1,
                ready_at: 710 * S
            }
        );
        assert_eq!(d.len(), 3);
    }

    #[test]
    fn request_rate_counts_arrivals_per_minute() {
        let p = Params {
            metric: Metric::RequestRate,
            target: 600.0,
            window: 10 * S,
            ..params()
        };
        let mut a = Autoscaler::new(p, 0);
        // 20 arrivals a second = 1200 rpm from 0: the mean is 1200 at once
        let d = drive(&mut a, 5 * S, |t| Observation {
            arrivals: 20 * (t / S),
            ..Default::default()
        });
        assert_eq!(
            d,
            vec![Decision {
                at: S,
                from: 1,
                to: 2,
                ready_at: 121 * S
            }]
        );
        assert!((a.mean() - 1200.0).abs() < 1e-9);
    }

    #[test]
    fn bad_settings_name_their_field() {
        let bad = |f: fn(&mut Params)| {
            let mut p = params();
            f(&mut p);
            p.check().unwrap_err().0
        };
        assert_eq!(bad(|p| p.min = 0), "min");
        assert_eq!(bad(|p| p.max = 0), "max");
        assert_eq!(bad(|p| p.target = f64::NAN), "target");
        assert_eq!(bad(|p| p.target = -1.0), "target");
        assert_eq!(bad(|p| p.window = 0), "window_s");
        assert_eq!(bad(|p| p.interval = 0), "interval_s");
        assert!(params().check().is_ok());
    }
}
