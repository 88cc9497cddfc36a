//! The shared-deployment article's sizing rules of thumb, checked against a configuration (and
//! the simulation), one line of reason each; and the decision flow.

use super::config::SharedFile;
use super::sim::ScenarioOutcome;
use super::{floor_met, ScenarioPair};
use crate::limiter::admission::{Limit, Semantics, BP_FULL};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Ok,
    Info,
    Warn,
    Error,
}

impl Level {
    pub fn name(self) -> &'static str {
        match self {
            Level::Ok => "ok",
            Level::Info => "info",
            Level::Warn => "warn",
            Level::Error => "error",
        }
    }
}

#[derive(Debug, Clone)]
pub struct Finding {
    pub level: Level,
    pub message: String,
}

fn f(level: Level, message: String) -> Finding {
    Finding { level, message }
}

/// Findings about the configuration alone.
pub fn static_findings(file: &SharedFile, need: Option<&[(String, f64)]>) -> Vec<Finding> {
    let l = &file.limiter;
    let u = l.unit.name().to_uppercase();
    let cap = l.capacity as f64;
    let mut v = Vec::new();
    let total_bp = l.reserved_bp_total();
    let pool_pct = (BP_FULL - total_bp) as f64 / 100.0;
    let reserved: Vec<_> = l.consumers.iter().filter(|c| c.reserved_bp > 0).collect();
    if total_bp == BP_FULL {
        v.push(f(
            Level::Error,
            format!(
                "100 % reserved: the unreserved pool is 0 {u}, so an unreserved or new consumer gets nothing until the reservations are changed; keep 10-20 % unreserved"
            ),
        ));
    } else if pool_pct < 10.0 {
        v.push(f(
            Level::Warn,
            format!(
                "unreserved pool {pool_pct:.0} % ({:.0} {u}) is under 10 %: too little for ad-hoc traffic, new consumers and overflow; keep 10-20 %",
                cap * pool_pct / 100.0
            ),
        ));
    } else if pool_pct > 20.0 && !reserved.is_empty() {
        v.push(f(
            Level::Info,
            format!("unreserved pool {pool_pct:.0} % is above the 10-20 % rule of thumb: less of capacity is guaranteed to anyone"),
        ));
    } else if !reserved.is_empty() {
        v.push(f(
            Level::Ok,
            format!(
                "unreserved pool {pool_pct:.0} % ({:.0} {u}) is within the 10-20 % rule of thumb",
                cap * pool_pct / 100.0
            ),
        ));
    }
    let th = l.threshold;
    if th < 0.7 - 1e-9 {
        v.push(f(
            Level::Warn,
            format!(
                "threshold {:.0} % is under 70 %: enforcement starts at {:.0} {u} and the burst headroom ({} units) lets spikes run far above capacity",
                th * 100.0,
                th * cap,
                l.burst_units()
            ),
        ));
    } else if th > 0.8 + 1e-9 {
        v.push(f(
            Level::Warn,
            format!(
                "threshold {:.0} % is over 80 %: only {} units of burst headroom, so small spikes already get 429s; use 70-80 %",
                th * 100.0,
                l.burst_units()
            ),
        ));
    } else {
        v.push(f(
            Level::Ok,
            format!(
                "threshold {:.0} % is within 70-80 %: enforcement starts at {:.0} {u}, burst headroom {} units absorbs short spikes",
                th * 100.0,
                th * cap,
                l.burst_units()
            ),
        ));
    }
    match l.semantics {
        Semantics::RateLimitOnly if !reserved.is_empty() => v.push(f(
            Level::Warn,
            "semantics rate-limit-only: the reservations are not enforced (one ceiling, first come first served); use strict-floors to guarantee them".into(),
        )),
        Semantics::LitellmPriority if !reserved.is_empty() => v.push(f(
            Level::Warn,
            format!(
                "semantics litellm-priority: floors hold only once {:.0} % of capacity is used in the current minute; before that, borrowers may use them",
                th * 100.0
            ),
        )),
        Semantics::Partitioned if !reserved.is_empty() => v.push(f(
            Level::Info,
            "semantics partitioned: the unreserved pool is idle whenever no unreserved consumer sends, so reserved consumers never exceed their floors in total; use strict-floors to lend it out".into(),
        )),
        _ => {}
    }
    if l.consumers.len() == 1 {
        v.push(f(
            Level::Info,
            "one consumer: reservations have nobody to protect against; rate limits alone are enough".into(),
        ));
    }
    if reserved.len() >= 2
        && reserved
            .iter()
            .all(|c| c.reserved_bp == reserved[0].reserved_bp)
        && total_bp == BP_FULL
    {
        v.push(f(
            Level::Info,
            "every consumer has the same reservation: if all are equally important, first come first served is fair and reservations are unnecessary".into(),
        ));
    }
    if reserved.len() >= 2
        && reserved
            .iter()
            .any(|c| c.reserved_bp != reserved[0].reserved_bp)
    {
        v.push(f(
            Level::Info,
            "reservations differ: make sure they follow business criticality (who needs a guaranteed minimum), not team size or traffic volume".into(),
        ));
    }
    if let Some(need) = need {
        for (name, n) in need {
            match l.consumers.iter().find(|c| &c.name == name) {
                None => v.push(f(
                    Level::Error,
                    format!("--need names {name}, which is not a consumer"),
                )),
                Some(c) => {
                    let floor = cap * c.reserved_bp as f64 / 10_000.0;
                    if floor + 1e-9 < *n {
                        v.push(f(
                            Level::Error,
                            format!("{name}: floor {floor:.0} {u} is below its stated need of {n:.0} {u}"),
                        ));
                    } else if floor > 1.5 * n {
                        v.push(f(
                            Level::Warn,
                            format!(
                                "{name}: floor {floor:.0} {u} is more than 1.5x its need of {n:.0}: size reservations to the minimum needed at peak contention, not to the peak"
                            ),
                        ));
                    }
                }
            }
        }
    }
    v.push(f(
        Level::Info,
        "before reserving, start with rate limits only and watch a week of traffic (peak RPM, who sends what, who always over-consumes)".into(),
    ));
    v.extend(size_findings(file));
    v
}

/// Findings about sizes that make admission impossible or starve the pool
/// (tiny capacities, tokens as the unit).
fn size_findings(file: &SharedFile) -> Vec<Finding> {
    let l = &file.limiter;
    let u = l.unit.name().to_uppercase();
    let mut v = Vec::new();
    let Ok(p) = crate::limiter::admission::Params::new(l.clone()) else {
        return v;
    };
    for c in &l.consumers {
        let floor = l.capacity as f64 * c.reserved_bp as f64 / BP_FULL as f64;
        if c.reserved_bp > 0 && floor < 1.0 {
            v.push(f(
                Level::Warn,
                format!(
                    "{}'s floor is {floor:.2} {u}, under one unit per minute: it admits a unit every {:.1} minutes at best and per-minute figures cannot show it (floor met: -); raise capacity or the reservation",
                    c.name,
                    1.0 / floor
                ),
            ));
        }
    }
    // what a typical request needs of capacity at admission (the core's
    // charge rule), against the most each consumer can ever be admitted
    // with (the core's `largest_need`): the proxy answers a larger one 400
    let tokens = l.unit == crate::limiter::admission::Unit::Tpm;
    let input = file.input_tokens.mean().max(1.0).round() as u64;
    let need = l
        .deploy_spec()
        .admit_charge(crate::limiter::rates::Cost {
            input_tokens: input,
            max_tokens: file.max_tokens,
        })
        .1;
    let never: Vec<String> = l
        .consumers
        .iter()
        .enumerate()
        .filter(|&(i, _)| p.largest_need(i) < need)
        .map(|(i, c)| format!("{} ({})", c.name, p.largest_need(i)))
        .collect();
    if !never.is_empty() {
        let what = if tokens {
            format!("about {need} tokens at admission (input {input} + what the accounting reserves of max_tokens {})", file.max_tokens)
        } else {
            "one request".to_string()
        };
        v.push(f(
            Level::Error,
            format!(
                "a request needs {what}, more than can ever be admitted for {} {u}: the proxy refuses every such request (400) whatever the wait; raise capacity, --burst or lower max_tokens",
                never.join(", ")
            ),
        ));
    } else if tokens {
        let small: Vec<String> = l
            .consumers
            .iter()
            .enumerate()
            .filter(|(i, c)| c.reserved_bp > 0 && p.floor_depth(*i) < need)
            .map(|(i, c)| format!("{} ({})", c.name, p.floor_depth(i)))
            .collect();
        if !small.is_empty() {
            v.push(f(
                Level::Warn,
                format!(
                    "a request charges about {need} tokens, more than the floor credits of {} tokens hold: those floors cannot admit a request by themselves and only borrowing does",
                    small.join(", ")
                ),
            ));
        }
    }
    v
}

/// Findings from the simulated scenarios.
pub fn sim_findings(file: &SharedFile, runs: &[ScenarioPair]) -> Vec<Finding> {
    let l = &file.limiter;
    let mut v = Vec::new();
    for p in runs {
        let o = &p.limited;
        for (ci, c) in o.consumers.iter().enumerate() {
            if floor_met(o, ci) == Some(false) {
                let worst = o
                    .saturated
                    .iter()
                    .enumerate()
                    .filter(|(m, &s)| s && c.offered_units_per_min[*m] as f64 >= c.floor_rpm)
                    .map(|(m, _)| c.admitted_units_per_min[m])
                    .min()
                    .unwrap_or(0);
                v.push(f(
                    Level::Error,
                    format!(
                        "{}: {} got {} of its {:.0} floor in a saturated minute under {}",
                        o.name,
                        c.name,
                        worst,
                        c.floor_rpm,
                        l.semantics.name()
                    ),
                ));
            }
            if c.offered > 0 && c.admitted == 0 {
                v.push(f(
                    Level::Error,
                    format!(
                        "{}: {} got nothing admitted ({} attempts)",
                        o.name, c.name, c.offered
                    ),
                ));
            }
        }
        v.extend(crowded_out(file, o));
        let capdeny: u64 = o
            .consumers
            .iter()
            .map(|c| c.denied[Limit::Capacity.index()])
            .sum();
        let peak_offered = (0..o.minutes())
            .map(|m| {
                o.consumers
                    .iter()
                    .map(|c| c.offered_units_per_min[m])
                    .sum::<u64>()
            })
            .max()
            .unwrap_or(0);
        if o.burst_used > 0
            && capdeny == 0
            && o.burst_depth > 0
            && peak_offered as f64 > l.threshold * l.capacity as f64
        {
            v.push(f(
                Level::Info,
                format!(
                    "{}: no rejections; the burst headroom absorbed the excess (up to {} of {} units used, {:.0} %)",
                    o.name,
                    o.burst_used,
                    o.burst_depth,
                    100.0 * o.burst_used as f64 / o.burst_depth as f64
                ),
            ));
        }
    }
    v
}

/// The article's decision flow, answered for this configuration.
pub fn decision_flow(file: &SharedFile) -> Vec<String> {
    let l = &file.limiter;
    let n = l.consumers.len();
    let mut out = Vec::new();
    if n <= 1 {
        out.push(
            "shared by several consumers? no -> rate limits alone: set the capacity and stop"
                .into(),
        );
        return out;
    }
    out.push(format!("shared by several consumers? yes ({n})"));
    let reserved = l.consumers.iter().filter(|c| c.reserved_bp > 0).count();
    let equal = l
        .consumers
        .iter()
        .all(|c| c.reserved_bp == l.consumers[0].reserved_bp);
    if equal {
        out.push("all equally important? yes (equal reservations) -> rate limits alone: first come first served is fair".into());
        return out;
    }
    out.push("all equally important? no".into());
    if reserved > 0 {
        out.push(format!(
            "does anyone need a guaranteed minimum? yes ({reserved} consumers) -> quota reservations sized to the minimum each needs at peak contention, keep 10-20 % unreserved; semantics {} ({})",
            l.semantics.name(),
            l.semantics.guarantee()
        ));
    } else {
        out.push(
            "does anyone need a guaranteed minimum? no -> per-entity rate-limit overrides (caps) on the noisy neighbour instead of reservations"
                .into(),
        );
    }
    out
}

/// Max-min fair shares ("water filling") of `left` units among `claims`:
/// nobody gets more than it claims, and whatever a small claim leaves goes
/// in equal parts to the larger ones.
pub fn water_fill(left: f64, claims: &[f64]) -> Vec<f64> {
    let mut order: Vec<usize> = (0..claims.len()).filter(|&i| claims[i] > 0.0).collect();
    order.sort_by(|&a, &b| claims[a].total_cmp(&claims[b]).then(a.cmp(&b)));
    let mut out = vec![0.0; claims.len()];
    let mut left = left.max(0.0);
    let n = order.len();
    for (k, &i) in order.iter().enumerate() {
        let give = claims[i].min(left / (n - k) as f64);
        out[i] = give;
        left -= give;
    }
    out
}

/// Each consumer's fair share of one saturated minute beyond the floors in
/// use, given its demand `d` (units that minute) — max-min fair among the
/// consumers the semantics lets draw on it: under rate-limit-only, the whole
/// capacity among everyone; under partitioned, the unreserved pool among
/// the unreserved consumers; otherwise, what the floors in use leave (the
/// pool and idle floors) among the unreserved consumers and the reserved
/// ones' demand beyond their floors. Returns (what is left to share, the
/// shares).
pub fn fair_shares(
    capacity: f64,
    semantics: Semantics,
    floors: &[f64],
    d: &[f64],
) -> (f64, Vec<f64>) {
    let reserved = |i: usize| floors[i] > 0.0;
    let n = d.len();
    let (left, claims): (f64, Vec<f64>) = match semantics {
        Semantics::RateLimitOnly => (capacity, d.to_vec()),
        Semantics::Partitioned => (
            capacity - floors.iter().sum::<f64>(),
            (0..n)
                .map(|i| if reserved(i) { 0.0 } else { d[i] })
                .collect(),
        ),
        Semantics::StrictFloors | Semantics::LitellmPriority => (
            capacity - (0..n).map(|i| d[i].min(floors[i])).sum::<f64>(),
            (0..n)
                .map(|i| {
                    if reserved(i) {
                        (d[i] - floors[i]).max(0.0)
                    } else {
                        d[i]
                    }
                })
                .collect(),
        ),
    };
    let left = left.max(0.0);
    (left, water_fill(left, &claims))
}

/// A consumer that gets far less (under half) than it is entitled to over a
/// scenario's saturated minutes — its demand up to its floor where the
/// semantics enforces floors, plus its fair share ([`fair_shares`]) of the
/// rest — while another consumer takes more than its own: why (first come,
/// first served) and what would change it. Unreserved consumers under any
/// semantics; reserved ones under rate-limit-only (elsewhere the floor
/// findings speak for them).
fn crowded_out(file: &SharedFile, o: &ScenarioOutcome) -> Vec<Finding> {
    let l = &file.limiter;
    let u = l.unit.name().to_uppercase();
    let n = o.consumers.len();
    let floors: Vec<f64> = o.consumers.iter().map(|c| c.floor_rpm).collect();
    let rlo = l.semantics == Semantics::RateLimitOnly;
    let cap = l.capacity as f64;
    // per consumer, summed over the saturated minutes: demand, admitted and
    // entitlement; and over the minutes it asked in: (minutes, demand,
    // admitted, entitlement, what was left to share)
    let mut demand = vec![0.0; n];
    let mut got = vec![0.0; n];
    let mut entitled = vec![0.0; n];
    let mut asked = vec![(0u32, 0.0, 0.0, 0.0, 0.0); n];
    for (m, _) in o.saturated.iter().enumerate().filter(|(_, &s)| s) {
        let d: Vec<f64> = o
            .consumers
            .iter()
            .map(|c| c.offered_units_per_min[m] as f64)
            .collect();
        let (left, fair) = fair_shares(cap, l.semantics, &floors, &d);
        for i in 0..n {
            let a = o.consumers[i].admitted_units_per_min[m] as f64;
            let e = if rlo { 0.0 } else { d[i].min(floors[i]) } + fair[i];
            demand[i] += d[i];
            got[i] += a;
            entitled[i] += e;
            if d[i] > 0.0 {
                let x = &mut asked[i];
                *x = (x.0 + 1, x.1 + d[i], x.2 + a, x.3 + e, x.4 + left);
            }
        }
    }
    let sat = o.saturated.iter().filter(|&&s| s).count() as f64;
    let mut v = Vec::new();
    for (i, c) in o.consumers.iter().enumerate() {
        let (mins, d, a, fair, left) = asked[i];
        let reserved = floors[i] > 0.0;
        if mins == 0 || (reserved && !rlo) {
            continue;
        }
        let k = mins as f64;
        let (d, a, fair, left) = (d / k, a / k, fair / k, left / k);
        // far less: under half of an entitlement of at least one unit a minute
        if fair < 1.0 || a >= 0.5 * fair {
            continue;
        }
        // who took it: the most admitted beyond its own entitlement (under
        // partitioned only the unreserved draw on the pool)
        let Some(t) = (0..n)
            .filter(|&j| j != i)
            .filter(|&j| l.semantics != Semantics::Partitioned || floors[j] == 0.0)
            .max_by(|&x, &y| {
                (got[x] - entitled[x])
                    .total_cmp(&(got[y] - entitled[y]))
                    .then(y.cmp(&x))
            })
            .filter(|&j| got[j] > entitled[j])
        else {
            continue;
        };
        let (name, taker) = (&c.name, &o.consumers[t].name);
        let took = got[t] / sat;
        let t_floor = if floors[t] > 0.0 {
            format!("floor {:.0}", floors[t])
        } else {
            "no floor".to_string()
        };
        let rate = demand[t] / sat;
        let (of, why) = match l.semantics {
            Semantics::RateLimitOnly => (
                format!("of the {left:.0} {u} capacity"),
                format!("one ceiling is first come, first served (reservations are not enforced), so {taker}'s {rate:.0} {u} took capacity in proportion to its rate"),
            ),
            Semantics::Partitioned => (
                format!("of the {left:.0} {u} unreserved pool"),
                format!("the unreserved pool is first come, first served among the unreserved consumers, so {taker}'s {rate:.0} {u} took it in proportion to its rate"),
            ),
            _ => (
                format!("of the {left:.0} {u} the floors in use leave"),
                format!("the unreserved pool and idle floors are first come, first served among everyone past their floor, so {taker}'s {rate:.0} {u} took them in proportion to its rate"),
            ),
        };
        let cap_taker = format!("cap {taker} with a rate limit ([consumer.limits] rpm)");
        let fix = match l.semantics {
            Semantics::RateLimitOnly if reserved => format!(
                "to protect {name}, enforce its floor of {:.0} {u} (--semantics strict-floors) or {cap_taker}",
                floors[i]
            ),
            Semantics::RateLimitOnly => format!(
                "to protect {name}, reserve it a share (reserved_pct) under a semantics that enforces it (--semantics strict-floors), use --semantics partitioned (the pool only for unreserved consumers) or {cap_taker}"
            ),
            Semantics::Partitioned => {
                format!("to protect {name}, reserve it a share (reserved_pct) or {cap_taker}")
            }
            _ => format!(
                "to protect {name}, reserve it a share (reserved_pct), use --semantics partitioned (the pool only for unreserved consumers) or {cap_taker}"
            ),
        };
        v.push(f(
            Level::Warn,
            format!(
                "{}: {name} got {a:.0} {u} under contention, less than half its fair share ({fair:.0} {of}; it asked for {d:.0}), while {taker} took {took:.0} ({t_floor}): {why}; {fix}",
                o.name
            ),
        ));
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn water_fill_gives_small_claims_all_and_splits_the_rest() {
        // 460 among 2760 and 200: the small claim whole, the rest to the big
        assert_eq!(water_fill(460.0, &[2760.0, 200.0]), vec![260.0, 200.0]);
        // four equal large claims split evenly; a zero claim gets nothing
        assert_eq!(
            water_fill(200.0, &[1000.0, 0.0, 1000.0, 1000.0, 1000.0]),
            vec![50.0, 0.0, 50.0, 50.0, 50.0]
        );
        // more than enough: every claim whole
        assert_eq!(water_fill(1000.0, &[10.0, 20.0]), vec![10.0, 20.0]);
        // nothing to share
        assert_eq!(water_fill(-5.0, &[10.0]), vec![0.0]);
    }

    #[test]
    fn fair_shares_follow_each_semantics() {
        // 1,200 per minute; floors 300, 300, 240 and an unreserved consumer;
        // demand 250, 250, 3000, 200
        let floors = [300.0, 300.0, 240.0, 0.0];
        let d = [250.0, 250.0, 3000.0, 200.0];
        // floors in use 250 + 250 + 240 leave 460: D's 200 whole, C 260 more
        let (left, s) = fair_shares(1200.0, Semantics::StrictFloors, &floors, &d);
        assert_eq!((left, s), (460.0, vec![0.0, 0.0, 260.0, 200.0]));
        let (left, s) = fair_shares(1200.0, Semantics::LitellmPriority, &floors, &d);
        assert_eq!((left, s), (460.0, vec![0.0, 0.0, 260.0, 200.0]));
        // partitioned: the pool (360) for D alone
        let (left, s) = fair_shares(1200.0, Semantics::Partitioned, &floors, &d);
        assert_eq!((left, s), (360.0, vec![0.0, 0.0, 0.0, 200.0]));
        // rate-limit-only: capacity among all, floors ignored
        let (left, s) = fair_shares(1200.0, Semantics::RateLimitOnly, &floors, &d);
        assert_eq!((left, s), (1200.0, vec![250.0, 250.0, 500.0, 200.0]));
    }
}
