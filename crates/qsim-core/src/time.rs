//! Virtual time: integer nanoseconds since the start of a simulation.
//!
//! The cores never read a clock; they are handed `now: Nanos`.

/// Nanoseconds since the simulation (or proxy) epoch.
pub type Nanos = u64;

pub const NS_PER_SEC: u64 = 1_000_000_000;
pub const NS_PER_MS: u64 = 1_000_000;
/// A time that never comes (used for "never admissible").
pub const NEVER: Nanos = u64::MAX;

/// The longest duration an input may give, in seconds: 1e9 s (about 31.7
/// years). The clock holds `u64::MAX` ns ≈ 1.8e10 s, so a time plus such a
/// duration, or a sum of up to 18 of them, still fits without saturating.
pub const MAX_SECS: f64 = 1e9;

/// Why a number of seconds is not a valid duration.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum TimeError {
    /// NaN or infinite.
    NotFinite(f64),
    /// Below 0 (or not above 0 where a positive duration is required).
    TooSmall { got: f64, positive: bool },
    /// Above [`MAX_SECS`].
    TooLarge(f64),
}

/// A number for a message: plain when short, else in scientific notation
/// (`1e300`, not 301 digits).
pub fn show(v: f64) -> String {
    let a = v.abs();
    if v.is_finite() && a != 0.0 && !(1e-4..1e10).contains(&a) {
        format!("{v:e}")
    } else {
        format!("{v}")
    }
}

impl core::fmt::Display for TimeError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let range = |positive: bool| {
            if positive {
                "(0, 1e9] seconds (1e9 s is about 31 years)"
            } else {
                "[0, 1e9] seconds (1e9 s is about 31 years)"
            }
        };
        match *self {
            TimeError::NotFinite(v) => {
                write!(
                    f,
                    "must be a finite number in {}, got {}",
                    range(false),
                    show(v)
                )
            }
            TimeError::TooSmall { got, positive } => {
                write!(f, "must be in {}, got {}", range(positive), show(got))
            }
            TimeError::TooLarge(v) => write!(
                f,
                "must be in {}, got {}: longer durations do not fit the nanosecond clock",
                range(false),
                show(v)
            ),
        }
    }
}

impl std::error::Error for TimeError {}

/// Checked seconds to nanoseconds: `s` must be finite and in
/// `[0, MAX_SECS]`; rounded to the nearest nanosecond. Use it for every
/// duration that comes from input; [`secs`] is for values already bounded.
pub fn try_secs(s: f64) -> Result<Nanos, TimeError> {
    if !s.is_finite() {
        Err(TimeError::NotFinite(s))
    } else if s < 0.0 {
        Err(TimeError::TooSmall {
            got: s,
            positive: false,
        })
    } else if s > MAX_SECS {
        Err(TimeError::TooLarge(s))
    } else {
        Ok((s * NS_PER_SEC as f64).round() as Nanos)
    }
}

/// [`try_secs`] for a duration that must be above 0.
pub fn try_secs_positive(s: f64) -> Result<Nanos, TimeError> {
    match try_secs(s)? {
        _ if s <= 0.0 => Err(TimeError::TooSmall {
            got: s,
            positive: true,
        }),
        n => Ok(n),
    }
}

/// The units [`parse_duration`] accepts, as its errors explain them.
pub const DURATION_UNITS: &str =
    "accepted units are ms, s, m and h (e.g. 1500ms, 2s, 5m, 1h; a bare number is seconds)";

/// The one parser of a duration written by a person (a command-line flag):
/// a number with the unit `ms`, `s`, `m` (or `min`) or `h`, or a bare number
/// of seconds (`2s`, `1.5`, `1500ms`, `5m`, `1h`). It must be above 0 and at most [`MAX_SECS`], and is
/// rounded to the nearest nanosecond (at least 1 ns). A bad value is an
/// error, never zero.
pub fn parse_duration(text: &str) -> Result<Nanos, String> {
    let t = text.trim();
    let num_end = t
        .find(|c: char| !(c.is_ascii_digit() || matches!(c, '.' | '-' | '+' | 'e' | 'E')))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(num_end);
    let scale = match unit.trim() {
        "" | "s" => 1.0,
        "ms" => 1e-3,
        "m" | "min" => 60.0,
        "h" => 3600.0,
        u => return Err(format!("unknown unit {u:?}: {DURATION_UNITS}")),
    };
    let v = match num.parse::<f64>() {
        Ok(v) if v.is_finite() => v * scale,
        _ => return Err(format!("{text:?} is not a duration; {DURATION_UNITS}")),
    };
    if v <= 0.0 {
        return Err(format!("must be a duration > 0; {DURATION_UNITS}"));
    }
    match try_secs(v) {
        Ok(0) => Err(format!("must be at least 1 ns, got {text:?}")),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

/// Seconds (f64) to nanoseconds, rounded to the nearest nanosecond, clamped
/// at 0 and saturating at [`NEVER`]. For values computed inside a
/// simulation from validated inputs (see [`try_secs`] for input).
#[inline]
pub fn secs(s: f64) -> Nanos {
    if s <= 0.0 || s.is_nan() {
        0
    } else if s >= (u64::MAX / NS_PER_SEC) as f64 {
        NEVER
    } else {
        (s * NS_PER_SEC as f64).round() as Nanos
    }
}

/// Nanoseconds to seconds.
#[inline]
pub fn to_secs(n: Nanos) -> f64 {
    n as f64 / NS_PER_SEC as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_their_unit_and_never_become_zero() {
        assert_eq!(parse_duration("2s"), Ok(2 * NS_PER_SEC));
        assert_eq!(parse_duration(" 1500ms "), Ok(1_500_000_000));
        assert_eq!(parse_duration("1.5"), Ok(1_500_000_000));
        // issue 41, case 8: `options --help` showed `--within 5m`, refused
        assert_eq!(parse_duration("5m"), Ok(300 * NS_PER_SEC));
        assert_eq!(parse_duration("2 min"), Ok(120 * NS_PER_SEC));
        assert_eq!(parse_duration("1h"), Ok(3600 * NS_PER_SEC));
        for bad in [
            "", "s", "abc", "2 days", "0", "-1s", "0ms", "1e-12", "nan", "inf", "1e300", "1e6h",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad:?} parsed");
        }
        assert!(parse_duration("2d").unwrap_err().contains("unknown unit"));
    }
    #[test]
    fn round_trip() {
        assert_eq!(secs(1.5), 1_500_000_000);
        assert_eq!(secs(-1.0), 0);
        assert_eq!(to_secs(250_000_000), 0.25);
        assert_eq!(secs(1e30), NEVER);
    }

    #[test]
    fn checked_conversion() {
        assert_eq!(try_secs(1.5), Ok(1_500_000_000));
        assert_eq!(try_secs(0.0), Ok(0));
        assert_eq!(try_secs(MAX_SECS), Ok(1_000_000_000_000_000_000));
        assert!(matches!(try_secs(1e10), Err(TimeError::TooLarge(_))));
        assert!(matches!(try_secs(-1.0), Err(TimeError::TooSmall { .. })));
        assert!(matches!(try_secs(f64::NAN), Err(TimeError::NotFinite(_))));
        assert!(try_secs_positive(0.0).is_err());
        assert_eq!(try_secs_positive(2.0), Ok(2 * NS_PER_SEC));
        // 18 maximal durations still fit the clock
        assert!(try_secs(MAX_SECS).unwrap().checked_mul(18).is_some());
        let m = try_secs(1e12).unwrap_err().to_string();
        assert!(m.contains("[0, 1e9]") && m.contains("got 1e12"), "{m}");
        assert_eq!(show(1e300), "1e300");
        assert_eq!(show(2.5), "2.5");
    }

    /// `secs` is exact up to the clock's end (u64::MAX ns ≈ 1.8e10 s) and
    /// saturates only beyond it; negative and NaN give 0.
    #[test]
    fn secs_saturates_only_past_the_clock() {
        assert_eq!(secs(1e9), 1_000_000_000 * NS_PER_SEC);
        assert_eq!(secs(1.8e10), 18_000_000_000 * NS_PER_SEC);
        assert_eq!(secs(1.9e10), NEVER);
        assert_eq!(secs(f64::NAN), 0);
        assert_eq!(secs(0.0), 0);
        assert_eq!(secs(1e-9), 1);
    }

    /// Scientific notation only outside [1e-4, 1e10), and never for 0 or
    /// non-finite values; every message names the range and the value.
    #[test]
    fn show_and_messages() {
        assert_eq!(show(0.0), "0");
        assert_eq!(show(1e-4), "0.0001");
        assert_eq!(show(5e-5), "5e-5");
        assert_eq!(show(-5e-5), "-5e-5");
        assert_eq!(show(9.5e9), "9500000000");
        assert_eq!(show(1e10), "1e10");
        assert_eq!(show(-1e10), "-1e10");
        assert_eq!(show(f64::INFINITY), "inf");
        let nan = TimeError::NotFinite(f64::NAN).to_string();
        assert_eq!(
            nan,
            "must be a finite number in [0, 1e9] seconds (1e9 s is about 31 years), got NaN"
        );
        let neg = try_secs_positive(0.0).unwrap_err().to_string();
        assert_eq!(
            neg,
            "must be in (0, 1e9] seconds (1e9 s is about 31 years), got 0"
        );
        let neg = try_secs(-2.0).unwrap_err().to_string();
        assert_eq!(
            neg,
            "must be in [0, 1e9] seconds (1e9 s is about 31 years), got -2"
        );
        assert_eq!(
            try_secs_positive(-1.0),
            Err(TimeError::TooSmall {
                got: -1.0,
                positive: false
            })
        );
        assert_eq!(try_secs_positive(1e-9), Ok(1));
        assert_eq!(
            try_secs(MAX_SECS + 1.0),
            Err(TimeError::TooLarge(MAX_SECS + 1.0))
        );
        assert_eq!(to_secs(NS_PER_SEC * 3 / 2), 1.5);
    }
}
