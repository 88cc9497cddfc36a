//! Inverse planning: `qsim plan --need A=250,B=150,C=250 --e2e-p95 2s`.
//!
//! Search: for capacities from `Σneed / 0.9` upward (a 10 % unreserved pool,
//! the rule of thumb), in 5 % steps, reserve `need_i / C` for each named
//! consumer (rounded up to 0.01 %), scale the scenario loads by (open loads' rates, trace loads' `scale`)
//! `C / file capacity` (so each scenario keeps its overload factor), and
//! simulate every scenario: the first capacity at which every named consumer
//! gets at least its need in every saturated minute (whenever it asked for
//! that much) wins. Then the smallest replica count (1, 2, 3, …, 64) whose
//! server meets the E2E p95 target in every scenario at that capacity.
//!
//! Consumers of the file that `--need` does not name keep their load but
//! lose their reservation (they share the unreserved pool); a name that is
//! not a consumer is refused. Every step is charged against the work budget
//! before it runs. A latency target below a lower bound (TTFT plus the 95th
//! percentile output length × the fastest inter-token gap, i.e. a batch of
//! one) is refused at once, and the replica search stops when doubling the
//! replicas no longer improves the E2E p95: both exit 1 with the reason.

use super::config::{Arrival, SharedFile};
use super::{simulate, Model, PlanError};
use crate::budget::{min_step_s, Budget, Cost};
use crate::config::ConfigError;
use crate::limiter::admission::{ConsumerSpec, BP_FULL};
use crate::time::to_secs;
use serde_json::{json, Value};

fn scaled(f: &SharedFile, capacity: u64, need: &[(String, f64)]) -> Option<SharedFile> {
    let mut g = f.clone();
    let factor = capacity as f64 / f.limiter.capacity as f64;
    for s in &mut g.scenarios {
        for l in &mut s.loads {
            match &mut l.arrival {
                Arrival::Open { rpm, ramp_to_rpm } => {
                    *rpm *= factor;
                    *ramp_to_rpm *= factor;
                }
                // the same pattern at `factor` times the traffic
                Arrival::Trace { spec, .. } => spec.scale *= factor,
                Arrival::Closed { .. } => {}
            }
        }
    }
    g.limiter.capacity = capacity;
    let template = f.limiter.consumers[0].clone();
    let mut cs: Vec<ConsumerSpec> = Vec::new();
    for (n, x) in need {
        let bp = ((x / capacity as f64) * BP_FULL as f64).ceil() as u32;
        let mut c = f
            .limiter
            .consumers
            .iter()
            .find(|c| &c.name == n)
            .cloned()
            .unwrap_or(template.clone());
        c.name = n.clone();
        c.reserved_bp = bp.max(1);
        cs.push(c);
    }
    // consumers without a need keep their load, without a reservation
    for c in &f.limiter.consumers {
        if !need.iter().any(|(n, _)| n == &c.name) {
            let mut c = c.clone();
            c.reserved_bp = 0;
            cs.push(c);
        }
    }
    g.limiter.consumers = cs;
    (g.limiter.reserved_bp_total() <= BP_FULL).then_some(g)
}

/// Does every named consumer get its need in every saturated minute?
fn needs_met(g: &SharedFile, need: &[(String, f64)], model: &Model, seed: u64) -> (bool, String) {
    let runs = simulate(g, model, seed, false);
    for p in &runs {
        let o = &p.limited;
        for (n, x) in need {
            let Some(c) = o.consumers.iter().find(|c| &c.name == n) else {
                continue;
            };
            for (m, &sat) in o.saturated.iter().enumerate() {
                if sat
                    && c.offered_units_per_min[m] as f64 >= *x
                    && (c.admitted_units_per_min[m] as f64) < 0.99 * x
                {
                    return (
                        false,
                        format!(
                            "{n} got {} < {x:.0} in minute {} of {}",
                            c.admitted_units_per_min[m],
                            m + 1,
                            o.name
                        ),
                    );
                }
            }
        }
    }
    (true, String::new())
}

fn worst_e2e_p95(g: &SharedFile, model: &Model, seed: u64) -> (f64, String) {
    let runs = simulate(g, model, seed, false);
    let mut worst = (0.0, String::new());
    for p in &runs {
        let v = p.limited.server.e2e.quantile_s(0.95);
        if v > worst.0 {
            worst = (v, p.limited.name.clone());
        }
    }
    worst
}

/// The smallest E2E p95 any replica count can reach: TTFT plus the 95th
/// percentile output length (of 20,000 draws) × the fastest inter-token gap.
/// Returns (bound in s, p95 output tokens, ITL in s).
pub fn e2e_p95_lower_bound(f: &SharedFile, model: &Model, seed: u64) -> (f64, f64, f64) {
    let mut rng = crate::engine::rng::stream(
        seed,
        u64::MAX >> 16,
        crate::engine::rng::component::WORKLOAD,
    );
    let mut outs: Vec<f64> = (0..20_000)
        .map(|_| f.output_tokens.sample(&mut rng).round().max(1.0))
        .collect();
    outs.sort_by(f64::total_cmp);
    let p95 = outs[(outs.len() as f64 * 0.95) as usize - 1];
    let (ttft, itl) = match model {
        Model::Ideal => (0.035, 0.018),
        Model::Server { profile, .. } => {
            let step = min_step_s(profile);
            (to_secs(profile.ingress) + step, step)
        }
    };
    (ttft + (p95 - 1.0) * itl, p95, itl)
}

/// Charge `c` to the run's work and refuse if it no longer fits the budget.
fn charge(spent: &mut Cost, c: Cost, budget: &Budget) -> Result<(), ConfigError> {
    spent.then(c);
    spent.check("--need", budget)
}

/// Check `--need` names against the file's consumers.
pub fn check_names(f: &SharedFile, need: &[(String, f64)]) -> Result<(), ConfigError> {
    for (n, _) in need {
        if !f.limiter.consumers.iter().any(|c| &c.name == n) {
            let names: Vec<&str> = f
                .limiter
                .consumers
                .iter()
                .map(|c| c.name.as_str())
                .collect();
            return Err(ConfigError::new(
                "--need",
                "",
                format!(
                    "no consumer named {n:?}; the consumers are {} (rename them with --names)",
                    names.join(", ")
                ),
            ));
        }
    }
    Ok(())
}

pub fn plan(
    f: &SharedFile,
    model: &Model,
    need: &[(String, f64)],
    e2e_p95: Option<f64>,
    seed: u64,
    budget: &Budget,
    spent: &mut Cost,
) -> Result<(Option<SharedFile>, Value), PlanError> {
    check_names(f, need)?;
    let total: f64 = need.iter().map(|(_, x)| x).sum();
    let mut lines = Vec::new();
    let mut cap = (total / 0.9).ceil() as u64;
    lines.push(format!(
        "needs add up to {total:.0} {}; with a 10 % unreserved pool the search starts at {cap}",
        f.limiter.unit.name()
    ));
    let unnamed: Vec<&str> = f
        .limiter
        .consumers
        .iter()
        .filter(|c| c.reserved_bp > 0 && !need.iter().any(|(n, _)| n == &c.name))
        .map(|c| c.name.as_str())
        .collect();
    if !unnamed.is_empty() {
        lines.push(format!(
            "no need given for {}: kept without a reservation (they share the unreserved pool)",
            unnamed.join(", ")
        ));
    }
    if let Some(target) = e2e_p95 {
        let (bound, p95_out, itl) = e2e_p95_lower_bound(f, model, seed);
        if bound > target {
            return Err(PlanError::Unmet(format!(
                "--e2e-p95: target {target:.2} s is below what any replica count can reach: E2E p95 is at least {bound:.2} s (TTFT plus the 95th percentile output of {p95_out:.0} tokens x the fastest inter-token gap {:.1} ms, a batch of one, with {})",
                itl * 1e3,
                model.name()
            )));
        }
    }
    let mut found: Option<SharedFile> = None;
    for _ in 0..40 {
        if let Some(g) = scaled(f, cap, need) {
            charge(
                spent,
                super::budget::search_step(f, model, cap, f.replicas)?,
                budget,
            )?;
            let (ok, why) = needs_met(&g, need, model, seed);
            // a step stopped by the run-time work budget decides nothing
            crate::work::check("--need")?;
            if ok {
                lines.push(format!(
                    "capacity {cap}: every need met in every saturated minute of every scenario ({})",
                    g.limiter.semantics.name()
                ));
                found = Some(g);
                break;
            }
            lines.push(format!("capacity {cap}: not enough ({why})"));
        }
        cap = ((cap as f64) * 1.05).ceil() as u64;
    }
    let Some(mut g) = found else {
        return Err(PlanError::Unmet(format!(
            "--need: no capacity up to {cap} meets every need ({})",
            lines.last().map_or("", |l| l.as_str())
        )));
    };
    let mut replicas = None;
    if let Some(target) = e2e_p95 {
        let mut at_half = f64::INFINITY;
        for r in 1..=64u32 {
            g.replicas = r;
            charge(
                spent,
                super::budget::search_step(&g, model, g.limiter.capacity, r)?,
                budget,
            )?;
            let (p95, worst) = worst_e2e_p95(&g, model, seed);
            crate::work::check("--need")?;
            if p95 <= target {
                lines.push(format!(
                    "{r} replica(s): E2E p95 {p95:.2} s <= {target:.2} s in every scenario (worst: {worst})"
                ));
                replicas = Some(r);
                break;
            }
            if r == 1 || r.is_power_of_two() {
                lines.push(format!(
                    "{r} replica(s): E2E p95 {p95:.2} s in {worst} > {target:.2} s"
                ));
                // no queueing left to remove: more replicas cannot help
                if r >= 2 && p95 >= 0.99 * at_half {
                    return Err(PlanError::Unmet(format!(
                        "--e2e-p95: target {target:.2} s is not met: E2E p95 {p95:.2} s with {r} replicas, {at_half:.2} s with {}; more replicas no longer help (the rest is output length x inter-token gap)",
                        r / 2
                    )));
                }
                at_half = p95;
            }
            if matches!(model, Model::Ideal) {
                lines.push(format!(
                    "the ideal server has no queueing, so more replicas cannot help: E2E p95 {p95:.2} s is set by output length x ITL"
                ));
                break;
            }
        }
        if replicas.is_none() {
            return Err(PlanError::Unmet(format!(
                "--e2e-p95: no replica count up to 64 meets E2E p95 <= {target:.2} s ({})",
                lines.last().map_or("", |l| l.as_str())
            )));
        }
    }
    let reservations: Vec<Value> = g
        .limiter
        .consumers
        .iter()
        .filter(|c| c.reserved_bp > 0)
        .map(|c| json!({"consumer": c.name, "reserved_pct": c.reserved_bp as f64 / 100.0}))
        .collect();
    let v = json!({
        "feasible": e2e_p95.is_none() || replicas.is_some(),
        "capacity": g.limiter.capacity,
        "replicas": replicas,
        "reservations": reservations,
        "unreserved_pct": (BP_FULL - g.limiter.reserved_bp_total()) as f64 / 100.0,
        "explanation": lines,
    });
    if let Some(r) = replicas {
        g.replicas = r;
    }
    Ok((Some(g), v))
}
