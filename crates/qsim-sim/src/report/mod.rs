//! Reports: plain-text tables and JSON, and aggregation over seeds.

/// A report's output format (the doors map their flags to it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Format {
    #[default]
    Table,
    Json,
    /// The tidy records, one per (point, seed, subject, metric).
    Csv,
}

pub mod cost;
pub mod hosted;
pub mod records;
pub mod server;
pub mod sweep;
pub mod table;

/// Median and 90 % interval (5th and 95th percentiles, nearest rank) of a sample.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Spread {
    pub median: f64,
    pub lo: f64,
    pub hi: f64,
}

pub fn spread(values: &[f64]) -> Spread {
    assert!(!values.is_empty());
    let v = qsim_core::stats::sorted(values);
    let q = |p: f64| qsim_core::stats::quantile(&v, p);
    Spread {
        median: q(0.5),
        lo: q(0.05),
        hi: q(0.95),
    }
}

/// A spread as text: `median [lo–hi]` over several runs, else the value;
/// `d` decimals (0: an integer).
pub fn fmt_spread(s: &Spread, d: i32, runs: usize) -> String {
    let f = |x: f64| {
        if d == 0 {
            format!("{}", x.round() as i64)
        } else {
            format!("{:.*}", d as usize, x)
        }
    };
    if runs > 1 {
        format!("{} [{}–{}]", f(s.median), f(s.lo), f(s.hi))
    } else {
        f(s.median)
    }
}

/// The first lines of a text report: title, what ran, and the seeds.
pub fn header(title: &str, what: &str, seed: u64, runs: usize) -> String {
    let mut out = String::new();
    if !title.is_empty() {
        out.push_str(title);
        out.push('\n');
    }
    out.push_str(what);
    if runs > 1 {
        out.push_str(&format!(
            ", {runs} seeds from {seed}: median [90% interval]\n\n"
        ));
    } else {
        out.push_str(&format!(", seed {seed}\n\n"));
    }
    out
}

/// A JSON report as text: pretty-printed, with a final newline.
pub fn json_text(v: &serde_json::Value) -> String {
    let mut s = serde_json::to_string_pretty(v).expect("a JSON value always serializes");
    s.push('\n');
    s
}

/// Round to `d` decimals for stable, readable JSON.
pub fn round(x: f64, d: i32) -> f64 {
    let m = 10f64.powi(d);
    (x * m).round() / m
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn spread_of_range() {
        let v: Vec<f64> = (0..=100).map(|x| x as f64).collect();
        let s = spread(&v);
        assert_eq!(s.median, 50.0);
        assert_eq!(s.lo, 5.0);
        assert_eq!(s.hi, 95.0);
        assert_eq!(spread(&[3.0]).median, 3.0);
    }
}

/// Text read from a data file (a consumer name in a log or trace), made
/// safe to print on a terminal: control characters (escape sequences,
/// newlines, carriage returns, backspaces) and Unicode's bidirectional
/// overrides are shown escaped (`\u{1b}`, `\n`), so such text can neither
/// drive the terminal nor forge a line of the report. Everything else is
/// as given.
pub fn terminal_safe(s: &str) -> std::borrow::Cow<'_, str> {
    let unsafe_char =
        |c: char| c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}');
    if !s.chars().any(unsafe_char) {
        return std::borrow::Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if unsafe_char(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

#[cfg(test)]
mod safe_tests {
    #[test]
    fn control_characters_and_bidi_overrides_are_escaped() {
        use super::terminal_safe as t;
        assert_eq!(t("team-a"), "team-a");
        assert_eq!(t("équipe 東"), "équipe 東");
        assert_eq!(t("a\x1b[31mred"), "a\\u{1b}[31mred");
        assert_eq!(t("x\nforged line"), "x\\nforged line");
        assert_eq!(t("r\rb\u{202e}"), "r\\rb\\u{202e}");
    }
}
