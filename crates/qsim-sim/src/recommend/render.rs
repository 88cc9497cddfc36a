//! `qsim recommend`'s report: the table and the JSON.

use super::constraint::metric_keys;
use super::constraint::{ELAPSED, HTTP_429, OK, P50, P95, TRUNCATED};
use super::{order, Recommendation, Scored};
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

fn table_of(rows: &[(String, &Scored)]) -> String {
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
        let failed = s.checks.iter().filter(|c| !c.0).count();
        r.push(if failed == 0 {
            "yes".into()
        } else {
            format!("no ({failed} failed)")
        });
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
            "recommend for {}: {} seeds from {} per configuration, objective {}\n",
            self.file, self.seeds, self.seed, self.objective
        );
        out.push_str("constraints:\n");
        for c in &self.constraints {
            out.push_str(&format!(
                "  {}{}\n",
                c.text,
                if c.default { "  (default)" } else { "" }
            ));
        }
        out.push_str(&format!(
            "searched: a grid of {} configurations, then {} round(s) of local refinement: {} configurations, {} runs\n\n",
            self.grid_size,
            self.rounds,
            self.evaluated.len(),
            self.runs()
        ));
        if let Some(w) = self.winner {
            let s = &self.evaluated[w];
            out.push_str(&format!("winner: {}\n", s.config.label()));
            for (c, (_, how)) in self.constraints.iter().zip(&s.checks) {
                out.push_str(&format!("  {}: {how}\n", c.text));
            }
            out.push('\n');
            let mut rows = vec![(format!("winner: {}", s.config.label()), s)];
            for &i in &self.runner_ups {
                let r = &self.evaluated[i];
                rows.push((r.config.label(), r));
            }
            out.push_str("winner and the best configuration of each other policy (median [90% interval] over seeds):\n");
            out.push_str(&table_of(&rows));
        }
        out.push_str("\nthe file's own experiments, each alone on the same seeds:\n");
        let rows: Vec<(String, &Scored)> =
            self.baselines.iter().map(|(n, s)| (n.clone(), s)).collect();
        out.push_str(&table_of(&rows));
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
            out.push_str("\nas an experiment:\n");
            out.push_str(&self.evaluated[w].config.toml(self.sdk_retries));
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
            .map(|(c, (ok, how))| json!({"constraint": c.text, "holds": ok, "detail": how}))
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
            "constraints": self.constraints.iter().map(|c| json!({"constraint": c.text, "default": c.default})).collect::<Vec<_>>(),
            "search": {
                "grid": self.grid_size,
                "refinement_rounds": self.rounds,
                "configurations": self.evaluated.len(),
                "runs": self.runs(),
            },
            "winner": self.winner.map(|w| self.config_json(&self.evaluated[w], None)),
            "runner_ups": self.runner_ups.iter().map(|&i| self.config_json(&self.evaluated[i], None)).collect::<Vec<_>>(),
            "baselines": self.baselines.iter().map(|(n, s)| self.config_json(s, Some(n))).collect::<Vec<_>>(),
            "pareto_front": self.front.iter().map(|p| json!({
                "label": p.label,
                "elapsed_s": round(p.elapsed_s, 4),
                "latency_p95_s": round(p.p95_s, 4),
                "meets_constraints": p.meets_constraints,
            })).collect::<Vec<_>>(),
        })
    }

    /// Why nothing qualifies: the closest configuration and what it fails.
    pub fn unmet(&self) -> String {
        // the fewest failed constraints, then the best objective
        let c = &self.evaluated[order(&self.evaluated, self.obj)[0]];
        let fails: Vec<String> = self
            .constraints
            .iter()
            .zip(&c.checks)
            .filter(|(_, (ok, _))| !ok)
            .map(|(k, (_, how))| format!("{} ({how})", k.text))
            .collect();
        format!(
            "{}: none of the {} configurations searched meets the constraints; the closest, {}, fails {}",
            self.file,
            self.evaluated.len(),
            c.config.label(),
            fails.join("; ")
        )
    }
}
