//! The cheapest mix of a hybrid (`qsim options FILE --fewest` on a
//! `route = [ … ]` option): how many provisioned units (or replicas, or an
//! autoscaler's minimum) its first upstream should have, the rest spilling
//! to the next ones, for the lowest cost that meets the targets.
//!
//! **Search.** First the fewest count that meets the targets, as
//! [`super::fewest`] finds it (counts 1, 2, 4, … then bisection; more is
//! assumed never to hurt). Then counts above it — one more, then steps of
//! a quarter (`n + max(1, n/4)`) — while requests still spill (with no
//! spill a larger count only adds its own cost) and until the cost has
//! risen twice in a row or the cap is reached: the cost of a mix is the
//! first upstream's, which grows with the count, plus the spill's, which
//! shrinks, so it is assumed to fall to one minimum and rise after it.
//! Every count reported was simulated; the cheapest of those that met the
//! targets is the answer. Each run is the option with its count replaced,
//! exactly as `--set option[I].route[0].provisioned.units=N` would run it.

use super::fewest::{knob, with_count, Found};
use super::{run_as, OptionsFile, Outcome, Targets};

/// The cheapest mix of option `i` (a hybrid) meeting `targets`.
pub fn search(file: &OptionsFile, i: usize, seed: u64, targets: &Targets) -> Found {
    let o = &file.options[i];
    let Some((k, from, cap)) = knob(o) else {
        // a pay-per-token first upstream: nothing to count
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
            mix: true,
        };
    };
    let mut runs = 0u32;
    let mut eval = |n: u64| {
        runs += 1;
        let r = run_as(file, &with_count(o, n), i, seed);
        let why = targets.missed(&r);
        (r, why)
    };
    // the fewest count that meets (doubling, then bisection)
    let mut lo: Option<(u64, String)> = None;
    let mut n = 1u64;
    let (first, first_run) = loop {
        let (r, why) = eval(n);
        match why {
            None => break (n, r),
            Some(why) if n >= cap => {
                return Found {
                    name: o.name.clone(),
                    knob: Some(k),
                    from,
                    count: None,
                    outcome: r,
                    below: None,
                    none: format!("{n} misses ({why})"),
                    runs,
                    mix: true,
                }
            }
            Some(why) => {
                lo = Some((n, why));
                n = (n * 2).min(cap);
            }
        }
    };
    let (mut hn, mut hr) = (first, first_run);
    let mut below = lo;
    while let Some(ln) = below.as_ref().map(|b| b.0).filter(|&ln| hn - ln > 1) {
        let mid = ln + (hn - ln) / 2;
        let (r, why) = eval(mid);
        match why {
            None => (hn, hr) = (mid, r),
            Some(why) => below = Some((mid, why)),
        }
    }
    // above it: while requests spill, until the cost rose twice in a row
    let cost = |r: &Outcome| r.cost_usd.unwrap_or(f64::INFINITY);
    let (mut best_n, mut best) = (hn, hr.clone());
    let (mut prev_cost, mut rises) = (cost(&hr), 0);
    let mut cur = hn;
    let mut spill = hr.spilled.unwrap_or(0);
    while spill > 0 && rises < 2 && cur < cap {
        cur = (cur + (cur / 4).max(1)).min(cap);
        let (r, why) = eval(cur);
        let c = cost(&r);
        rises = if c > prev_cost { rises + 1 } else { 0 };
        prev_cost = c;
        spill = r.spilled.unwrap_or(0);
        if why.is_none() && c < cost(&best) {
            (best_n, best) = (cur, r);
        }
    }
    Found {
        name: o.name.clone(),
        knob: Some(k),
        from,
        count: Some(best_n),
        outcome: best,
        below: if best_n == hn { below } else { None },
        none: String::new(),
        runs,
        mix: true,
    }
}
