//! The options report: one row per option, then the cheapest one that
//! finished in time with no failed row.

use super::{cheapest, OptionsFile, Outcome};
use crate::report::table::Table;
use crate::time::{to_secs, Nanos};

/// The report of `outcomes` (of `file`, run with `seed`); `within` names the
/// deadline of the verdict, if any.
pub fn render(
    file: &OptionsFile,
    outcomes: &[Outcome],
    seed: u64,
    within: Option<Nanos>,
) -> String {
    let b = &file.batch;
    let mut out = String::new();
    if !file.title.is_empty() {
        out.push_str(&format!("{}\n", file.title));
    }
    out.push_str(&format!(
        "batch: {} rows of {}, {} workers, max_tokens {}; seed {seed}\n\n",
        b.rows, file.batch_file, b.workers, b.max_tokens
    ));
    let mut t = Table::new([
        "option",
        "kind",
        "done (s)",
        "ok",
        "failed",
        "429s",
        "TTFT p95 (s)",
        "E2E p95 (s)",
        "cost ($)",
    ]);
    for o in outcomes {
        t.row([
            o.name.clone(),
            o.kind.clone(),
            format!("{:.1}", to_secs(o.elapsed)),
            o.ok.to_string(),
            o.failed.to_string(),
            o.http_429.to_string(),
            o.ttft_p95_s.map_or("-".into(), |x| format!("{x:.2}")),
            format!("{:.2}", o.e2e_p95_s),
            o.cost_usd.map_or("-".into(), |c| format!("{c:.4}")),
        ]);
    }
    out.push_str(&t.render());
    if let Some(w) = within {
        out.push('\n');
        match cheapest(outcomes, w) {
            Some(o) => out.push_str(&format!(
                "cheapest finishing within {:.0} s with no failed row: {} (${:.4})\n",
                to_secs(w),
                o.name,
                o.cost_usd.unwrap_or(0.0)
            )),
            None => out.push_str(&format!(
                "no priced option finished within {:.0} s with no failed row\n",
                to_secs(w)
            )),
        }
    }
    out
}
