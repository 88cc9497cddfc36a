//! The inverse of the options comparison (`qsim options FILE --fewest`):
//! for each option the fewest of what it buys that meets the targets —
//! provisioned units (a hosted profile with `[provisioned]`), fixed
//! replicas, or an autoscaler's `min` (its `max` kept) — and what that
//! costs; pay-per-token options have nothing to count and run as written.
//!
//! **Search.** Counts 1, 2, 4, … (capped at the knob's largest valid value:
//! 1,000,000 units, 4096 replicas, the autoscaler's `max`) until one meets
//! the targets, then bisection between the last count that missed and the
//! first that met: at most `2 ⌈log2 cap⌉ + 1` simulated runs per option
//! (reported). The search stops without an answer when the cap misses, or
//! when doubling the count changed nothing at all (the same rows ok and
//! failed, completion time and p95s): more is then assumed not to help.
//!
//! **Monotonicity assumption.** More units, replicas or a higher minimum
//! never make the batch slower, fail more rows or raise a p95. It is not
//! guaranteed (another count routes and paces rows differently, and a
//! client's retries interact with a rate limit), so where it fails the
//! search can miss a smaller count that meets the targets. What it reports
//! always holds: the found count was simulated and met the targets, and
//! the count one below (when above 1) was simulated and missed them.
//!
//! Every run is the option with its count replaced, exactly as `--set
//! option.NAME.replicas=N` (or `provisioned.units`, `autoscale.min`) would
//! run it with the same seed.

use super::{run_as, DeployOption, Kind, OptionsFile, Outcome, Targets};
use crate::hosted::provisioned::RawOverride;
use std::sync::Arc;

/// What an option's search varies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Knob {
    Units,
    Replicas,
    AutoscaleMin,
}

impl Knob {
    /// The option's field the count replaces.
    pub fn field(self) -> &'static str {
        match self {
            Knob::Units => "provisioned.units",
            Knob::Replicas => "replicas",
            Knob::AutoscaleMin => "autoscale.min",
        }
    }
}

/// Largest provisioned unit count and fixed replica count a file may ask
/// for (as validated).
pub const MAX_UNITS: u64 = 1_000_000;
pub const MAX_REPLICAS: u64 = 4096;

/// The option's knob, its value in the file, and the search's cap; None
/// for pay-per-token.
pub fn knob(o: &DeployOption) -> Option<(Knob, u64, u64)> {
    match &o.kind {
        Kind::Hosted(s) => s
            .profile
            .provisioned
            .map(|p| (Knob::Units, p.units, MAX_UNITS)),
        Kind::Replicas {
            autoscale: Some(a), ..
        } => Some((Knob::AutoscaleMin, a.min as u64, a.max as u64)),
        Kind::Replicas { replicas, .. } => Some((Knob::Replicas, *replicas as u64, MAX_REPLICAS)),
        // a route: its first upstream's count
        Kind::Route(r) => match &r.ups[0] {
            super::open::Up::Hosted(p) => p.provisioned.map(|p| (Knob::Units, p.units, MAX_UNITS)),
            super::open::Up::Replicas {
                autoscale: Some(a), ..
            } => Some((Knob::AutoscaleMin, a.min as u64, a.max as u64)),
            super::open::Up::Replicas { replicas, .. } => {
                Some((Knob::Replicas, *replicas as u64, MAX_REPLICAS))
            }
        },
    }
}

/// `o` with its count set to `n` (within the knob's valid range).
pub fn with_count(o: &DeployOption, n: u64) -> DeployOption {
    let mut v = o.clone();
    match &mut v.kind {
        Kind::Hosted(s) => {
            let mut p = (*s.profile).clone();
            p.override_provisioned(
                "",
                &RawOverride {
                    units: Some(n.clamp(1, MAX_UNITS) as i64),
                    ..RawOverride::default()
                },
            )
            .expect("a provisioned profile takes 1..=1000000 units");
            s.profile = Arc::new(p);
        }
        Kind::Replicas {
            replicas,
            autoscale,
            ..
        } => set_replicas(replicas, autoscale, n),
        Kind::Route(r) => {
            let hybrid = r.ups.len() > 1;
            match &mut r.ups[0] {
                super::open::Up::Hosted(p) => {
                    let mut q = (**p).clone();
                    q.override_provisioned(
                        "",
                        &RawOverride {
                            units: Some(n.clamp(1, MAX_UNITS) as i64),
                            ..RawOverride::default()
                        },
                    )
                    .expect("a provisioned profile takes 1..=1000000 units");
                    // the gateway's copy of the upstream's limits (a hybrid's)
                    if hybrid {
                        r.core.upstreams[0].limits = q.limits.clone();
                    }
                    *p = Arc::new(q);
                }
                super::open::Up::Replicas {
                    replicas,
                    autoscale,
                    ..
                } => set_replicas(replicas, autoscale, n),
            }
        }
    }
    v
}

fn set_replicas(replicas: &mut u32, autoscale: &mut Option<qsim_core::autoscale::Params>, n: u64) {
    let n = n.clamp(1, MAX_REPLICAS) as u32;
    *replicas = n;
    if let Some(a) = autoscale {
        a.min = n.min(a.max);
        *replicas = a.min;
    }
}

/// One option's search.
#[derive(Debug, Clone)]
pub struct Found {
    pub name: String,
    /// None: pay-per-token, run as written.
    pub knob: Option<Knob>,
    /// The count in the file.
    pub from: u64,
    /// The fewest that met the targets (None: none found, or nothing to
    /// count).
    pub count: Option<u64>,
    /// The run at `count` (pay-per-token: as written; none found: the last
    /// count simulated).
    pub outcome: Outcome,
    /// The count one below `count` and why it missed (None at count 1).
    pub below: Option<(u64, String)>,
    /// Why the search found nothing (empty otherwise).
    pub none: String,
    /// Simulated runs.
    pub runs: u32,
    /// A hybrid: `count` is its cheapest mix (of the counts tried), not
    /// the fewest.
    pub mix: bool,
}

impl Found {
    /// Does this row's outcome meet the targets (a found count, or a
    /// pay-per-token option that meets them as written)?
    pub fn meets(&self, t: &Targets) -> bool {
        t.missed(&self.outcome).is_none() && (self.knob.is_none() || self.count.is_some())
    }
}

/// Two runs alike in everything the targets look at.
fn same(a: &Outcome, b: &Outcome) -> bool {
    (a.ok, a.failed, a.elapsed) == (b.ok, b.failed, b.elapsed)
        && a.e2e_p95_s.to_bits() == b.e2e_p95_s.to_bits()
        && a.ttft_p95_s.map(f64::to_bits) == b.ttft_p95_s.map(f64::to_bits)
}

/// The fewest count of option `i` (not a hybrid: [`super::search`]) that
/// meets `targets`, run with `seed`.
pub fn search(file: &OptionsFile, i: usize, seed: u64, targets: &Targets) -> Found {
    let o = &file.options[i];
    let Some((k, from, cap)) = knob(o) else {
        let outcome = run_as(file, o, i, seed);
        return Found {
            name: o.name.clone(),
            knob: None,
            from: 0,
            count: None,
            outcome,
            below: None,
            none: String::new(),
            runs: 1,
            mix: false,
        };
    };
    let hosted = match &o.kind {
        Kind::Hosted(_) => true,
        Kind::Route(r) => r
            .ups
            .iter()
            .any(|u| matches!(u, super::open::Up::Hosted(_))),
        Kind::Replicas { .. } => false,
    };
    if targets.ttft_p95.is_some() && hosted {
        // no count changes that: one run, as written
        return Found {
            name: o.name.clone(),
            knob: Some(k),
            from,
            count: None,
            outcome: run_as(file, o, i, seed),
            below: None,
            none: "a TTFT target: the hosted model does not measure TTFT".into(),
            runs: 1,
            mix: false,
        };
    }
    let mut runs = 0u32;
    let mut eval = |n: u64| {
        runs += 1;
        let r = run_as(file, &with_count(o, n), i, seed);
        let why = targets.missed(&r);
        (r, why)
    };
    // the largest count known to miss (with why), the first known to meet
    let mut lo: Option<(u64, Outcome, String)> = None;
    let mut n = 1u64;
    let hi = loop {
        let (r, why) = eval(n);
        let Some(why) = why else {
            break (n, r);
        };
        let none = if n >= cap {
            Some(format!("{n} misses ({why})"))
        } else {
            match &lo {
                Some((p, pr, _)) if same(pr, &r) => Some(format!(
                    "{p} → {n} changed nothing ({why}): more is assumed not to help"
                )),
                _ => None,
            }
        };
        if let Some(none) = none {
            return Found {
                name: o.name.clone(),
                knob: Some(k),
                from,
                count: None,
                outcome: r,
                below: None,
                none,
                runs,
                mix: false,
            };
        }
        lo = Some((n, r, why));
        n = (n * 2).min(cap);
    };
    let (mut hn, mut hr) = hi;
    let mut below = lo.map(|(n, _, why)| (n, why));
    while let Some(ln) = below.as_ref().map(|b| b.0).filter(|&ln| hn - ln > 1) {
        let mid = ln + (hn - ln) / 2;
        let (r, why) = eval(mid);
        match why {
            None => (hn, hr) = (mid, r),
            Some(why) => below = Some((mid, why)),
        }
    }
    Found {
        name: o.name.clone(),
        knob: Some(k),
        from,
        count: Some(hn),
        outcome: hr,
        below,
        none: String::new(),
        runs,
        mix: false,
    }
}

/// The cheapest row meeting `targets` (ties: the first in the file).
pub fn cheapest<'a>(found: &'a [Found], targets: &Targets) -> Option<&'a Found> {
    found
        .iter()
        .filter(|f| f.meets(targets) && f.outcome.cost_usd.is_some())
        .fold(None, |best: Option<&Found>, f| match best {
            Some(b) if b.outcome.cost_usd <= f.outcome.cost_usd => Some(b),
            _ => Some(f),
        })
}

/// What a row's count means in words: "23 units", "2 replicas",
/// "autoscale.min 2".
pub fn count_words(k: Knob, n: u64) -> String {
    match k {
        Knob::Units if n == 1 => "1 unit".into(),
        Knob::Units => format!("{n} units"),
        Knob::Replicas if n == 1 => "1 replica".into(),
        Knob::Replicas => format!("{n} replicas"),
        Knob::AutoscaleMin => format!("autoscale.min {n}"),
    }
}
