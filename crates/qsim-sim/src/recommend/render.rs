//! `qsim recommend`'s report: the table and the JSON.

use super::constraint::metric_keys;
use super::constraint::{ELAPSED, HTTP_429, OK, P50, P95, TRUNCATED};
use super::{Constraint, Origin, Recommendation, Scored};
use crate::report::table::Table;
use crate::report::{round, Spread};
use serde_json::{json, Value};

const SHOWN: &[(usize, &str, usize)] = &[
    (ELAPSED, "elapsed_s", 1),
    (OK, "ok", 0),
    (P50, "p50_s", 2),
    (P95, "p95_s", 2),
    (TRUNCATED, "truncated", 0),
    (HTTP_429, "http_429", 0),
];

fn cell(s: &Spread, d: usize) -> String {
    format!(
        "{} [{}–{}]",
        fmt_num_fixed(s.median, d),
        fmt_num_fixed(s.lo, d),
        fmt_num_fixed(s.hi, d)
    )
}

fn fmt_num_fixed(x: f64, d: usize) -> String {
    format!("{x:.d$}")
}

/// The "meets" cell: yes, or no with the constraints it fails.
fn meets(s: &Scored, cons: &[Constraint]) -> String {
    let failed: Vec<&str> = cons
        .iter()
        .zip(&s.checks)
        .filter(|(_, k)| !k.holds)
        .map(|(c, _)| c.text.as_str())
        .collect();
    if failed.is_empty() {
        "yes".into()
    } else {
        format!("no: {}", failed.join(", "))
    }
}

fn table_of(rows: &[(String, &Scored)], cons: &[Constraint]) -> String {
    let mut h = vec!["configuration".to_string()];
    h.extend(SHOWN.iter().map(|s| s.1.to_string()));
    h.push("meets".into());
    let mut t = Table::new(h);
    for (label, s) in rows {
        let mut r = vec![label.clone()];
        r.extend(
            SHOWN
                .iter()
                .map(|&(m, _, d)| cell(&s.evidence.spreads[m], d)),
        );
        r.push(meets(s, cons));
        t.row(r);
    }
    t.render()
}

impl Recommendation {
    fn runs(&self) -> u64 {
        (self.evaluated.len() + self.baselines.len()) as u64 * self.seeds
    }

    pub fn render_table(&self) -> String {
        let mut out = format!(
            "recommend for {}: {} seeds from {} per configuration, objective {}{}\n",
            self.file,
            self.seeds,
            self.seed,
            self.objective,
            match self.client {
                super::ClientChoice::Any => String::new(),
                c => format!(", clients: {}", c.name()),
            }
        );
        if self.constraints.is_empty() {
            out.push_str("constraints: none (--no-default-constraints)\n");
        } else if self.defaults_dropped {
            out.push_str("constraints (the defaults dropped: --no-default-constraints):\n");
        } else {
            out.push_str("constraints (a constraint on the same metric replaces a default; --no-default-constraints drops them):\n");
        }
        for c in &self.constraints {
            let mark = c.origin.mark();
            out.push_str(&format!(
                "  {}{}\n",
                c.text,
                if mark.is_empty() {
                    String::new()
                } else {
                    format!("  ({mark})")
                }
            ));
        }
        out.push_str(&format!(
            "searched: a grid of {} configurations, {}then {} round(s) of local refinement: {} configurations, {} runs\n\n",
            self.grid_size,
            match self.widened {
                Some((mt, n)) => format!(
                    "max_tokens widened to {mt} as truncation bound ({n} configurations), "
                ),
                None => String::new(),
            },
            self.rounds,
            self.evaluated.len(),
            self.runs()
        ));
        if let Some(w) = self.winner {
            let s = &self.evaluated[w];
            out.push_str(&format!("winner: {}\n", s.config.label()));
            for (c, k) in self.constraints.iter().zip(&s.checks) {
                out.push_str(&format!("  {}: {}\n", c.text, k.detail));
            }
            out.push('\n');
            let mut rows = vec![(format!("winner: {}", s.config.label()), s)];
            for &i in &self.runner_ups {
                let r = &self.evaluated[i];
                rows.push((r.config.label(), r));
            }
            out.push_str("winner and the best configuration of each other policy (median [90% interval] over seeds):\n");
            out.push_str(&table_of(&rows, &self.constraints));
        }
        if self.winner.is_none() {
            out.push_str(&format!(
                "no configuration meets the constraints; the closest configuration of each policy (ranked by how far it misses them; median [90% interval] over seeds):\n{}",
                table_of(
                    &self
                        .closest
                        .iter()
                        .map(|&i| (self.evaluated[i].config.label(), &self.evaluated[i]))
                        .collect::<Vec<_>>(),
                    &self.constraints
                )
            ));
            if let (Some(b), Some(&c)) = (&self.binding, self.closest.first()) {
                let s = &self.evaluated[c];
                out.push_str(&format!(
                    "\nbinding constraint: {} (the closest configuration, {}, misses it{}: {})\nto meet it, widen {}\n",
                    self.constraints[b.constraint].text,
                    s.config.label(),
                    if s.failed() > 1 { " by most" } else { "" },
                    b.detail,
                    b.widen
                ));
            }
        }
        out.push_str("\nthe file's own experiments, each alone on the same seeds:\n");
        let rows: Vec<(String, &Scored)> =
            self.baselines.iter().map(|(n, s)| (n.clone(), s)).collect();
        out.push_str(&table_of(&rows, &self.constraints));
        out.push_str("\nPareto front, median elapsed vs median p95 (configurations meeting the other constraints):\n");
        let mut t = Table::new(["configuration", "elapsed_s", "p95_s", "meets all"]);
        for p in &self.front {
            t.row([
                p.label.clone(),
                fmt_num_fixed(p.elapsed_s, 1),
                fmt_num_fixed(p.p95_s, 2),
                if p.meets_constraints { "yes" } else { "no" }.to_string(),
            ]);
        }
        out.push_str(&t.render());
        if let Some(w) = self.winner {
            out.push_str("\nas an experiment (an [[experiment]] to paste into the file):\n");
            out.push_str(&self.evaluated[w].config.toml(self.sdk_retries));
            out.push_str(&self.render_pool_settings());
        }
        out
    }

    /// The thread-pool settings of the winner (or, for a managed winner, of
    /// the closest pool configuration searched): which, and the settings.
    pub fn pool_settings(&self) -> Option<(String, Vec<(String, String)>)> {
        let w = &self.evaluated[self.winner?];
        if let Some(s) = w.config.pool_settings(self.sdk.as_ref()) {
            return Some(("the winner".into(), s));
        }
        let a = &self.evaluated[self.pool_alternative?];
        let s = a.config.pool_settings(self.sdk.as_ref())?;
        Some((
            format!(
                "not equivalent (the winner is the managed executor, whose adaptive AIMD window a fixed thread pool does not have): the closest thread pool searched, {} (elapsed {} s against the winner's {} s; meets the constraints: {})",
                a.config.label(),
                fmt_num_fixed(a.median_elapsed(), 1),
                fmt_num_fixed(w.median_elapsed(), 1),
                meets(a, &self.constraints)
            ),
            s,
        ))
    }

    fn render_pool_settings(&self) -> String {
        let Some(w) = self.winner else {
            return String::new();
        };
        let mut out = String::from("\nas thread-pool settings");
        match self.pool_settings() {
            None => out.push_str(
                ": none, the winner is the managed executor (an adaptive AIMD window) and no thread pool was searched (--client managed): --client any or pool finds the closest\n",
            ),
            Some((which, settings)) => {
                if self.evaluated[w].config.is_managed() {
                    out.push_str(&format!(", {which}:\n"));
                } else {
                    out.push_str(&format!(" ({which}):\n"));
                }
                let width = settings.iter().map(|s| s.0.chars().count()).max().unwrap_or(0);
                for (k, v) in settings {
                    let pad = width - k.chars().count();
                    out.push_str(&format!("  {k}{}  {v}\n", " ".repeat(pad)));
                }
            }
        }
        out
    }

    fn config_json(&self, s: &Scored, name: Option<&str>) -> Value {
        let mut metrics = serde_json::Map::new();
        for (i, key) in metric_keys().enumerate() {
            let sp = &s.evidence.spreads[i];
            metrics.insert(
                key.to_string(),
                json!({
                    "median": round(sp.median, 4),
                    "lo": round(sp.lo, 4),
                    "hi": round(sp.hi, 4),
                    "per_seed": s.evidence.per_seed.iter().map(|m| round(m[i], 4)).collect::<Vec<_>>(),
                }),
            );
        }
        let checks: Vec<Value> = self
            .constraints
            .iter()
            .zip(&s.checks)
            .map(|(c, k)| json!({"constraint": c.text, "holds": k.holds, "detail": k.detail, "miss": round(k.gap, 4)}))
            .collect();
        let mut v = json!({
            "meets_constraints": s.feasible(),
            "constraints": checks,
            "metrics": metrics,
        });
        match name {
            Some(n) => v["experiment"] = json!(n),
            None => {
                v["label"] = json!(s.config.label());
                v["policy"] = json!(s.config.policy);
                v["workers"] = json!(s.config.workers);
                v["max_tokens"] = json!(s.config.max_tokens);
                v["params"] = Value::Object(
                    s.config
                        .params()
                        .into_iter()
                        .map(|(k, x)| (k.to_string(), json!(round(x, 4))))
                        .collect(),
                );
                v["toml"] = json!(s.config.toml(self.sdk_retries));
            }
        }
        v
    }

    pub fn render_json(&self) -> Value {
        json!({
            "file": self.file,
            "seed": self.seed,
            "seeds": self.seeds,
            "objective": self.objective,
            "client": self.client.name(),
            "constraints": self.constraints.iter().map(|c| json!({
                "constraint": c.text,
                "default": c.origin == Origin::Default,
                "origin": match c.origin {
                    Origin::Given => "--constraint",
                    Origin::Default => "default",
                    Origin::ZeroFailed => "--zero-failed",
                },
            })).collect::<Vec<_>>(),
            "defaults_dropped": self.defaults_dropped,
            "search": {
                "grid": self.grid_size,
                "widened_max_tokens": self.widened.map(|w| w.0),
                "refinement_rounds": self.rounds,
                "configurations": self.evaluated.len(),
                "runs": self.runs(),
            },
            "winner": self.winner.map(|w| self.config_json(&self.evaluated[w], None)),
            "runner_ups": self.runner_ups.iter().map(|&i| self.config_json(&self.evaluated[i], None)).collect::<Vec<_>>(),
            "thread_pool": self.pool_settings().map(|(which, settings)| json!({
                "from": which,
                "settings": settings.into_iter().map(|(k, v)| json!({"setting": k, "value": v})).collect::<Vec<_>>(),
            })),
            "closest": self.closest.iter().map(|&i| self.config_json(&self.evaluated[i], None)).collect::<Vec<_>>(),
            "binding": self.binding.as_ref().map(|b| json!({
                "constraint": self.constraints[b.constraint].text,
                "detail": b.detail,
                "widen": b.widen,
            })),
            "baselines": self.baselines.iter().map(|(n, s)| self.config_json(s, Some(n))).collect::<Vec<_>>(),
            "pareto_front": self.front.iter().map(|p| json!({
                "label": p.label,
                "elapsed_s": round(p.elapsed_s, 4),
                "latency_p95_s": round(p.p95_s, 4),
                "meets_constraints": p.meets_constraints,
            })).collect::<Vec<_>>(),
        })
    }

    /// Why nothing qualifies, in a line: the binding constraint, the
    /// closest configuration and what to widen.
    pub fn unmet(&self) -> String {
        let binding = match &self.binding {
            Some(b) => format!(
                "; binding: {} (the closest misses it: {}); widen {}",
                self.constraints[b.constraint].text, b.detail, b.widen
            ),
            None => String::new(),
        };
        format!(
            "{}: none of the {} configurations searched meets the constraints{binding} (the report shows the closest of each policy)",
            self.file,
            self.evaluated.len(),
        )
    }
}
