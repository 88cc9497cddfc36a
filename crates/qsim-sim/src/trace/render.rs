//! `qsim trace stats`' report: the table and the JSON of a
//! [`TraceStats`](super::stats::TraceStats).

use super::stats::{self, TraceStats, PERCENTILES};
use std::fmt::Write;

pub fn num(v: f64) -> String {
    if !v.is_finite() {
        return "n/a".into();
    }
    let a = v.abs();
    if a >= 100.0 || v == v.trunc() {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

fn pct_label(q: f64) -> String {
    if q == 1.0 {
        "max".into()
    } else {
        format!("p{}", (q * 100.0).round())
    }
}

fn lengths(l: &stats::LengthStats) -> String {
    let mut s = String::new();
    for (q, v) in PERCENTILES.iter().zip(&l.percentiles) {
        let _ = write!(s, "{} {}  ", pct_label(*q), num(*v));
    }
    let _ = write!(s, "mean {}", num(l.mean));
    s
}

/// The report as text.
pub fn table(st: &TraceStats, fmt: &str) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "trace {} ({fmt})", st.file);
    let _ = writeln!(s, "  requests        {}", st.requests);
    let _ = writeln!(s, "  duration        {} s", num(st.duration_s));
    let _ = writeln!(
        s,
        "  mean rate       {} /s ({} per minute)",
        num(st.mean_rate),
        num(st.mean_rate * 60.0)
    );
    let peaks: Vec<String> = st
        .peaks
        .iter()
        .map(|p| format!("{} in {} s (at {} s)", p.requests, p.window_s, p.start_s))
        .collect();
    let _ = writeln!(s, "  peak            {}", peaks.join(", "));
    let _ = writeln!(
        s,
        "  inter-arrival   mean {} s, CV {}",
        num(st.gap_mean_s),
        num(st.gap_cv)
    );
    let disp: Vec<String> = st
        .dispersion
        .iter()
        .map(|(w, d)| format!("{w} s: {}", num(*d)))
        .collect();
    let _ = writeln!(
        s,
        "  dispersion      {}  (variance/mean of counts; Poisson 1)",
        disp.join(", ")
    );
    let _ = writeln!(s, "  input tokens    {}", lengths(&st.input));
    let _ = writeln!(s, "  output tokens   {}", lengths(&st.output));
    if !st.consumers.is_empty() {
        let c: Vec<String> = st
            .consumers
            .iter()
            .map(|(n, k)| format!("{} {k}", crate::report::terminal_safe(n)))
            .collect();
        let _ = writeln!(s, "  consumers       {}", c.join(", "));
    }
    if let Some(f) = st.fitted_fields() {
        let _ = writeln!(
            s,
            "\n# fitted: the mean rate, gamma gaps of the trace's CV, log-normal lengths\n# through its p50 and p95, as a server experiment's scenario\n[[scenario]]\nname = \"fitted\"\n{}",
            f.trim_end()
        );
    }
    s
}

/// The report as JSON.
pub fn json(st: &TraceStats, fmt: &str) -> String {
    let l = |x: &stats::LengthStats| {
        let mut m = serde_json::Map::new();
        for (q, v) in PERCENTILES.iter().zip(&x.percentiles) {
            m.insert(pct_label(*q), serde_json::json!(v));
        }
        m.insert("mean".into(), serde_json::json!(x.mean));
        serde_json::Value::Object(m)
    };
    let v = serde_json::json!({
        "file": st.file,
        "format": fmt,
        "requests": st.requests,
        "duration_s": st.duration_s,
        "mean_rate_per_s": st.mean_rate,
        "peaks": st.peaks.iter().map(|p| serde_json::json!({"window_s": p.window_s, "requests": p.requests, "start_s": p.start_s})).collect::<Vec<_>>(),
        "inter_arrival_mean_s": st.gap_mean_s,
        "inter_arrival_cv": st.gap_cv,
        "index_of_dispersion": st.dispersion.iter().map(|(w, d)| serde_json::json!({"window_s": w, "value": d})).collect::<Vec<_>>(),
        "input_tokens": l(&st.input),
        "output_tokens": l(&st.output),
        "input_tokens_total": st.input_total,
        "output_tokens_total": st.output_total,
        "consumers": st.consumers.iter().map(|(n, k)| serde_json::json!({"name": n, "requests": k})).collect::<Vec<_>>(),
        "reordered": st.reordered,
        "skipped": st.skipped,
        "fitted": st.fitted_fields(),
    });
    let mut s = serde_json::to_string_pretty(&v).expect("JSON of plain values");
    s.push('\n');
    s
}
