//! Request traces as workloads: a file of real requests (arrival time,
//! input and output tokens, optionally a consumer) replayed instead of
//! drawn from a distribution.
//!
//! - [`read`]: the formats (Azure LLM inference CSV, BurstGPT CSV, Mooncake
//!   JSON Lines, `qsim proxy`'s decision log, a CSV with named columns),
//!   detection from the first line, and the streaming reader;
//! - [`TraceSpec`]: a validated `trace = { file = …, … }` (the same fields
//!   as the `qsim trace` flags): the window, rate scale, time compression,
//!   loops and consumer mapping;
//! - [`TraceSource`]: the replay, one arrival at a time, as
//!   [`crate::workload::OpenLoop`] yields them;
//! - [`stats`]: `qsim trace stats` (rates, burstiness, lengths, a fitted
//!   synthetic workload).
//!
//! The replay of a row at time `t` (ns after the file's first row) with
//! the options: rows with `from ≤ t < to` are kept, at `(t − from) /
//! compress` (rounded to the ns; exact when compress = 1), each sent
//! `floor(scale)` times plus once more with probability `frac(scale)` (a
//! draw per row from the run's ARRIVALS stream; the copies arrive together),
//! and the whole is repeated `loops` times, loop `k` shifted by `k ×
//! period`: `period` is `(to − from) / compress` when `to` is given, else the
//! replayed span plus one mean gap (so a looped trace keeps its mean rate).

pub mod cache;
pub mod read;
pub mod render;
pub mod stats;

use crate::config::{resolve_relative, ConfigError};
use crate::engine::rng::{component, stream, unit, Rng};
use crate::time::{Nanos, MAX_SECS};
use cache::{CacheReader, Copied};
use read::{Columns, Format, Reader, Row, TimeUnit};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// A trace as written in a file (`trace = { file = "…", … }`) or given by
/// `qsim trace` flags.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RawTrace {
    /// The trace file (relative to the file naming it).
    pub file: String,
    /// azure | burstgpt | mooncake | proxy | csv (default: from the first line).
    pub format: Option<String>,
    /// csv: the columns of time, input and output tokens, and the time's
    /// unit (s, ms, us, ns or datetime).
    pub time_column: Option<String>,
    pub time_unit: Option<String>,
    pub input_column: Option<String>,
    pub output_column: Option<String>,
    /// A CSV column naming each request's consumer.
    pub consumer_column: Option<String>,
    /// Requests split among consumers by share (each request drawn).
    pub shares: Option<BTreeMap<String, f64>>,
    /// The window, seconds after the first row: [from_s, to_s).
    pub from_s: Option<f64>,
    pub to_s: Option<f64>,
    /// Requests per row (2: the same pattern at twice the traffic).
    pub scale: Option<f64>,
    /// Time compression (2: the trace in half the time).
    pub compress: Option<f64>,
    /// Times the trace is replayed back to back.
    pub loops: Option<i64>,
}

/// How requests map to consumers.
#[derive(Debug, Clone, PartialEq)]
pub enum Consumers {
    /// One consumer (index 0).
    One,
    /// By a CSV column, or a proxy log's logged names.
    Column,
    /// By share: names and cumulative shares (the last is 1).
    Shares(Vec<(String, f64)>),
}

/// What a scan of the trace found (once per loop, before scale).
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    /// Rows in the window.
    pub rows: u64,
    /// Replay time of the last row of one loop.
    pub last: Nanos,
    /// Consumer names (by column: in order of first appearance).
    pub consumers: Vec<String>,
    /// Rows put in time order.
    pub reordered: u64,
    /// Proxy-log records skipped (invalid, retries, no token counts).
    pub skipped: u64,
    /// Tokens of the rows in the window.
    pub input_total: u64,
    pub output_total: u64,
    /// Arrivals per window of one loop (bounded: see [`RateSeries`]), for
    /// the memory estimate's backlog.
    pub arrivals: RateSeries,
}

/// The most windows a [`RateSeries`] keeps.
pub const MAX_RATE_POINTS: usize = 1440;

/// Requests per window of arrival, windows of a minute doubled (pairs
/// merged) whenever more than [`MAX_RATE_POINTS`] would be needed: memory
/// and plots follow the cap, never the trace's span.
#[derive(Debug, Clone, PartialEq)]
pub struct RateSeries {
    /// The window (s): 60 × a power of two.
    pub window_s: u64,
    /// Requests per window, from the first arrival's.
    pub counts: Vec<u64>,
}

impl Default for RateSeries {
    fn default() -> Self {
        RateSeries {
            window_s: 60,
            counts: Vec::new(),
        }
    }
}

impl RateSeries {
    #[inline]
    pub fn add(&mut self, since_first: u64) {
        let mut i = since_first / (self.window_s * 1_000_000_000);
        while i >= MAX_RATE_POINTS as u64 {
            let merged: Vec<u64> = self.counts.chunks(2).map(|c| c.iter().sum()).collect();
            self.counts = merged;
            self.window_s *= 2;
            i = since_first / (self.window_s * 1_000_000_000);
        }
        let i = i as usize;
        if i >= self.counts.len() {
            self.counts.resize(i + 1, 0);
        }
        self.counts[i] += 1;
    }
}

/// A validated trace workload.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceSpec {
    pub path: PathBuf,
    /// Named, else detected from the first line (always Some once validated).
    pub format: Option<Format>,
    pub consumer_column: Option<String>,
    pub consumers: Consumers,
    pub from: Nanos,
    pub to: Option<Nanos>,
    pub scale: f64,
    pub compress: f64,
    pub loops: u32,
    /// Loop period (0 when not looping).
    pub period: Nanos,
    /// The scan's findings (None if not scanned).
    pub summary: Option<Summary>,
    /// The rows the scan read, copied for the replays (see [`cache`]).
    pub copy: Copied,
    /// Where the fields came from and their prefix (`from_raw`'s `file`
    /// and `at`), for errors found while replaying: a row past the bounds
    /// names the field that put it there (`compress`, `loops`).
    pub source: (String, String),
}

/// The latest replay time a trace may reach: [`MAX_SECS`] (1e9 s), the
/// bound every duration in qsim has.
pub const MAX_REPLAY_NS: Nanos = 1_000_000_000 * 1_000_000_000;

/// The most a trace's rows may be multiplied by.
pub const MAX_SCALE: f64 = 1000.0;

fn secs_field(file: &str, field: &str, v: f64) -> Result<Nanos, ConfigError> {
    if !(v.is_finite() && (0.0..=MAX_SECS).contains(&v)) {
        return Err(ConfigError::new(
            file,
            field,
            format!("must be in [0, 1e9] seconds, got {v}"),
        ));
    }
    crate::time::try_secs(v).map_err(|e| ConfigError::new(file, field, e.to_string()))
}

impl TraceSpec {
    /// Validate `raw` (`file` names the source of the fields in errors,
    /// `at` their prefix, e.g. `scenario.0.trace.`; the trace path is
    /// relative to the file `base`, or as given when `base` is empty). `scan` reads the trace once to check every row
    /// and fill [`TraceSpec::summary`] (always when looping: the period
    /// needs it).
    pub fn from_raw(
        file: &str,
        at: &str,
        base: &Path,
        raw: &RawTrace,
        scan: bool,
    ) -> Result<TraceSpec, ConfigError> {
        let fld = |x: &str| format!("{at}{x}");
        let path = if base.as_os_str().is_empty() {
            // a path from the command line: as given
            PathBuf::from(&raw.file)
        } else {
            resolve_relative(base, &raw.file)
        };
        let csv_given = raw.time_column.is_some()
            || raw.input_column.is_some()
            || raw.output_column.is_some()
            || raw.time_unit.is_some();
        let format = match raw.format.as_deref() {
            None if csv_given => {
                return Err(ConfigError::new(
                    file,
                    fld("format"),
                    "columns are named for format = \"csv\" only: set it",
                ))
            }
            None => None,
            Some("azure") => Some(Format::Azure),
            Some("burstgpt") => Some(Format::BurstGpt),
            Some("mooncake") => Some(Format::Mooncake),
            Some("proxy") => Some(Format::Proxy),
            Some("csv") => {
                let need = |v: &Option<String>, n: &str| {
                    v.clone().ok_or_else(|| {
                        ConfigError::new(file, fld(n), "needed for format = \"csv\"")
                    })
                };
                let unit = match raw.time_unit.as_deref() {
                    None => TimeUnit::S,
                    Some(u) => TimeUnit::parse(u).ok_or_else(|| {
                        ConfigError::new(
                            file,
                            fld("time_unit"),
                            format!("unknown unit {u:?}; expected s, ms, us, ns or datetime"),
                        )
                    })?,
                };
                Some(Format::Csv(Columns {
                    time: need(&raw.time_column, "time_column")?,
                    unit,
                    input: need(&raw.input_column, "input_column")?,
                    output: need(&raw.output_column, "output_column")?,
                }))
            }
            Some(other) => {
                return Err(ConfigError::new(
                    file,
                    fld("format"),
                    format!(
                        "unknown trace format {other:?}; expected azure, burstgpt, mooncake, proxy or csv"
                    ),
                ))
            }
        };
        if csv_given && !matches!(format, Some(Format::Csv(_))) && format.is_some() {
            return Err(ConfigError::new(
                file,
                fld("format"),
                "columns are named for format = \"csv\" only",
            ));
        }
        let from = secs_field(file, &fld("from_s"), raw.from_s.unwrap_or(0.0))?;
        let to = raw
            .to_s
            .map(|v| secs_field(file, &fld("to_s"), v))
            .transpose()?;
        if to.is_some_and(|t| t <= from) {
            return Err(ConfigError::new(file, fld("to_s"), "must be after from_s"));
        }
        let pos = |v: Option<f64>, n: &str, max: f64| -> Result<f64, ConfigError> {
            let v = v.unwrap_or(1.0);
            if v.is_finite() && v > 0.0 && v <= max {
                Ok(v)
            } else {
                Err(ConfigError::new(
                    file,
                    fld(n),
                    format!("must be in (0, {max}], got {v}"),
                ))
            }
        };
        let scale = pos(raw.scale, "scale", MAX_SCALE)?;
        let compress = pos(raw.compress, "compress", 1e6)?;
        let loops = match raw.loops.unwrap_or(1) {
            l @ 1..=1_000_000 => l as u32,
            l => {
                return Err(ConfigError::new(
                    file,
                    fld("loops"),
                    format!("must be in 1..=1000000, got {l}"),
                ))
            }
        };
        // the format from the first line when not named (the consumers of
        // a proxy log are its logged names)
        let format = match format {
            Some(f) => f,
            None => Reader::open(&path, None, raw.consumer_column.as_deref())?
                .format()
                .clone(),
        };
        let format = Some(format);
        let consumers = match (&raw.consumer_column, &raw.shares) {
            (Some(_), Some(_)) => {
                return Err(ConfigError::new(
                    file,
                    fld("shares"),
                    "give a consumer column or shares, not both",
                ))
            }
            (Some(_), None) => Consumers::Column,
            (None, Some(s)) => {
                if s.is_empty() {
                    return Err(ConfigError::new(file, fld("shares"), "no consumers"));
                }
                let total: f64 = s.values().sum();
                let mut acc = 0.0;
                let mut v = Vec::new();
                for (n, &w) in s {
                    if !(w.is_finite() && w > 0.0) {
                        return Err(ConfigError::new(
                            file,
                            fld(&format!("shares.{n}")),
                            format!("must be > 0, got {w}"),
                        ));
                    }
                    acc += w / total;
                    v.push((n.clone(), acc));
                }
                v.last_mut().expect("non-empty").1 = 1.0;
                Consumers::Shares(v)
            }
            (None, None) if format == Some(Format::Proxy) => Consumers::Column,
            (None, None) => Consumers::One,
        };
        let mut spec = TraceSpec {
            path,
            format,
            consumer_column: raw.consumer_column.clone(),
            consumers,
            from,
            to,
            scale,
            compress,
            loops,
            period: 0,
            summary: None,
            copy: Copied::default(),
            source: (file.to_string(), at.to_string()),
        };
        if scan || loops > 1 {
            let (s, copy) = spec.scan_copy()?;
            if s.rows == 0 {
                return Err(ConfigError::new(
                    spec.path.display().to_string(),
                    "",
                    if from > 0 || to.is_some() {
                        "no requests in the window"
                    } else {
                        "no requests (a header only?)"
                    },
                ));
            }
            if loops > 1 {
                spec.period = match to {
                    Some(t) => ((t - from) as f64 / compress).round() as Nanos,
                    None if s.rows >= 2 => {
                        // the first row of the window to the last, plus one mean gap
                        let first = spec.first_replay_time()?;
                        let span = s.last - first;
                        s.last + span / (s.rows - 1)
                    }
                    None => {
                        return Err(ConfigError::new(
                            file,
                            fld("loops"),
                            "looping a single request needs a window end (to_s)",
                        ))
                    }
                }
                .max(1);
                if (spec.period as u128) * (loops as u128) > MAX_REPLAY_NS as u128 {
                    return Err(ConfigError::new(
                        file,
                        fld("loops"),
                        "the looped trace lasts more than 1e9 s",
                    ));
                }
            }
            spec.summary = Some(s);
            spec.copy = copy;
        }
        Ok(spec)
    }

    fn reader(&self) -> Result<Reader, ConfigError> {
        let mut r = Reader::open(
            &self.path,
            self.format.as_ref(),
            self.consumer_column.as_deref(),
        )?;
        // scanned and found in time order: no reordering window (the
        // scan read every row the replay reads, and as far ahead)
        if self.summary.as_ref().is_some_and(|s| s.reordered == 0) {
            r.in_order();
        }
        Ok(r)
    }

    /// The rows of a replay: the scan's copy when there is one, else the file.
    fn rows(&self) -> Result<Rows, ConfigError> {
        match (&self.copy.0, &self.summary) {
            (Some(c), Some(_)) => Ok(Rows::Copy(CacheReader::new(c.clone()))),
            _ => Ok(Rows::Text(Box::new(self.reader()?))),
        }
    }

    /// Replay time of the window's first row (one loop, before scale).
    fn first_replay_time(&self) -> Result<Nanos, ConfigError> {
        let mut one = self.clone();
        one.loops = 1;
        one.scale = 1.0;
        let mut src = TraceSource::open(&one, 0, 0)?;
        Ok(src.next()?.map_or(0, |a| a.at))
    }

    /// Read the whole trace once (one loop, scale 1): every row checked.
    pub fn scan(&self) -> Result<Summary, ConfigError> {
        Ok(self.scan_copy()?.0)
    }

    /// [`scan`](Self::scan), also copying the rows read for the replays
    /// (none if the copy could not be written).
    fn scan_copy(&self) -> Result<(Summary, Copied), ConfigError> {
        let mut one = self.clone();
        one.loops = 1;
        one.scale = 1.0;
        one.copy = Copied::default();
        let mut src = TraceSource::open_with(&one, 0, 0, cache::Writer::create())?;
        let (mut rows, mut last, mut input_total, mut output_total) = (0u64, 0, 0u64, 0u64);
        let mut first = None;
        let mut arrivals = RateSeries::default();
        while let Some(a) = src.next()? {
            rows += 1;
            last = a.at;
            arrivals.add(a.at - *first.get_or_insert(a.at));
            input_total += a.input as u64;
            output_total += a.output as u64;
        }
        let copy = Copied(src.record.take().and_then(cache::Writer::finish));
        Ok((
            Summary {
                rows,
                last,
                consumers: src.consumer_names(),
                reordered: src.reordered(),
                skipped: src.skipped(),
                input_total,
                output_total,
                arrivals,
            },
            copy,
        ))
    }

    /// Requests replayed over all loops (the scale's expected count), and
    /// the mean output tokens, once scanned.
    pub fn expected(&self) -> Option<(f64, f64)> {
        let s = self.summary.as_ref()?;
        let mean_out = s.output_total as f64 / (s.rows.max(1)) as f64;
        Some((s.rows as f64 * self.scale * self.loops as f64, mean_out))
    }

    /// The last arrival of the replay (all loops), once scanned.
    pub fn last_arrival(&self) -> Option<Nanos> {
        let s = self.summary.as_ref()?;
        Some(s.last + (self.loops as u64 - 1) * self.period)
    }

    /// The trace's name as shown in reports.
    pub fn label(&self) -> String {
        self.path.display().to_string()
    }
}

/// One replayed request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Arrival {
    pub at: Nanos,
    pub input: u32,
    pub output: u32,
    pub consumer: u32,
}

/// Where a replay's rows come from.
enum Rows {
    Text(Box<Reader>),
    Copy(CacheReader),
}

/// A trace replayed as an open-loop source: one row read ahead.
pub struct TraceSource {
    spec: TraceSpec,
    reader: Rows,
    /// The scan's copy being written (see [`TraceSpec::scan`]).
    record: Option<cache::Writer>,
    rng: Rng,
    origin: Option<i64>,
    /// The current row's arrival and the copies of it still to send.
    cur: Option<Arrival>,
    copies: u32,
    loop_k: u32,
    /// The next arrival (read ahead), or None at the end.
    next: Option<Arrival>,
    done: bool,
    /// The scale's whole part and fraction (copies of every row, and the
    /// chance of one more).
    scale: (u32, f64),
}

impl TraceSource {
    /// Open the trace for a run; `seed` and `scope` choose the stream of
    /// the scale's and the shares' draws (ARRIVALS, as an open loop's).
    pub fn open(spec: &TraceSpec, seed: u64, scope: u64) -> Result<TraceSource, ConfigError> {
        Self::open_with(spec, seed, scope, None)
    }

    /// [`open`](Self::open), copying every row read to `record`.
    fn open_with(
        spec: &TraceSpec,
        seed: u64,
        scope: u64,
        record: Option<cache::Writer>,
    ) -> Result<TraceSource, ConfigError> {
        let mut s = TraceSource {
            reader: spec.rows()?,
            record,
            spec: spec.clone(),
            rng: stream(seed, scope, component::ARRIVALS),
            origin: None,
            cur: None,
            copies: 0,
            loop_k: 0,
            next: None,
            done: false,
            scale: {
                let whole = spec.scale.floor();
                (whole as u32, spec.scale - whole)
            },
        };
        s.next = s.advance()?;
        Ok(s)
    }

    /// The consumer names requests are mapped to (index = `Arrival::consumer`).
    pub fn consumer_names(&self) -> Vec<String> {
        match &self.spec.consumers {
            Consumers::One => vec![String::new()],
            Consumers::Column => match &self.reader {
                Rows::Text(r) => r.consumers.clone(),
                Rows::Copy(_) => self.scanned().consumers.clone(),
            },
            Consumers::Shares(v) => v.iter().map(|(n, _)| n.clone()).collect(),
        }
    }

    /// The scan's findings (a replay from the scan's copy has them).
    fn scanned(&self) -> &Summary {
        self.spec
            .summary
            .as_ref()
            .expect("a copy comes with its scan")
    }

    /// Rows put in time order so far (from the copy: the scan's count).
    pub fn reordered(&self) -> u64 {
        match &self.reader {
            Rows::Text(r) => r.reordered,
            Rows::Copy(_) => self.scanned().reordered,
        }
    }

    /// Proxy-log records skipped so far (from the copy: the scan's count).
    pub fn skipped(&self) -> u64 {
        match &self.reader {
            Rows::Text(r) => r.skipped,
            Rows::Copy(_) => self.scanned().skipped,
        }
    }

    /// The next row of the file (or of the scan's copy), copied when scanning.
    #[inline]
    fn next_row(&mut self) -> Result<Option<Row>, ConfigError> {
        match &mut self.reader {
            Rows::Text(r) => {
                let row = r.next()?;
                if let (Some(w), Some(row)) = (self.record.as_mut(), row.as_ref()) {
                    w.push(row);
                }
                Ok(row)
            }
            Rows::Copy(c) => c.read_row().map_err(|e| {
                ConfigError::new(
                    self.spec.path.display().to_string(),
                    "",
                    format!("cannot read the copy of its rows made when it was checked: {e}"),
                )
            }),
        }
    }

    fn consumer(&mut self, row: u32) -> u32 {
        match &self.spec.consumers {
            Consumers::One => 0,
            Consumers::Column => row,
            Consumers::Shares(v) => {
                let u = unit(&mut self.rng);
                v.iter().position(|&(_, c)| u < c).unwrap_or(v.len() - 1) as u32
            }
        }
    }

    fn advance(&mut self) -> Result<Option<Arrival>, ConfigError> {
        loop {
            if self.done {
                return Ok(None);
            }
            if self.copies > 0 {
                self.copies -= 1;
                let mut a = self.cur.expect("a current row");
                a.consumer = self.consumer(a.consumer);
                return Ok(Some(a));
            }
            let row = match self.next_row()? {
                Some(r) => {
                    let origin = *self.origin.get_or_insert(r.t);
                    let rel = r.t.saturating_sub(origin) as u64;
                    if rel < self.spec.from {
                        continue;
                    }
                    if self.spec.to.is_some_and(|to| rel >= to) {
                        None
                    } else {
                        Some((r, rel - self.spec.from))
                    }
                }
                None => None,
            };
            let Some((r, rel)) = row else {
                // the end of a loop
                self.loop_k += 1;
                if self.loop_k >= self.spec.loops {
                    self.done = true;
                    return Ok(None);
                }
                self.reader = self.spec.rows()?;
                continue;
            };
            let at = self.replay_time(rel)?;
            let (whole, frac) = self.scale;
            self.copies = whole + (frac > 0.0 && unit(&mut self.rng) < frac) as u32;
            self.cur = Some(Arrival {
                at,
                input: r.input,
                output: r.output,
                consumer: r.consumer,
            });
        }
    }

    /// The replay time of a row `rel` ns after the window's start: time
    /// compressed, then shifted by its loop — the checked clock: a row
    /// later than [`MAX_REPLAY_NS`] (1e9 s) is an error naming what put it
    /// there (the trace's own span, `compress` or `loops`), never a wrapped
    /// or saturated time that would collapse rows onto one instant.
    fn replay_time(&self, rel: Nanos) -> Result<Nanos, ConfigError> {
        let (file, at) = &self.spec.source;
        // the field as given: a file's path to it, or (flags: no file) its
        // bare name, which the command line names as its flag
        let err = |field: &str, why: String| {
            if file.is_empty() {
                ConfigError::new("", field, format!("{}: {why}", self.spec.label()))
            } else {
                ConfigError::new(file.clone(), format!("{at}{field}"), why)
            }
        };
        if rel > MAX_REPLAY_NS {
            return Err(ConfigError::new(
                self.spec.label(),
                "",
                format!(
                    "a row {} s after the first: a trace may span at most 1e9 s",
                    rel / 1_000_000_000
                ),
            ));
        }
        let c = self.spec.compress;
        let t = if c == 1.0 {
            rel
        } else {
            let t = (rel as f64 / c).round();
            if t > MAX_REPLAY_NS as f64 {
                return Err(err(
                    "compress",
                    format!(
                        "{} puts a row {} s after the first, past 1e9 s",
                        crate::time::show(c),
                        crate::time::show((t * 1e-9).round())
                    ),
                ));
            }
            t as Nanos
        };
        let shift = (self.loop_k as u128) * (self.spec.period as u128);
        let at = t as u128 + shift;
        if at > MAX_REPLAY_NS as u128 {
            return Err(err(
                "loops",
                "the looped trace lasts more than 1e9 s".into(),
            ));
        }
        Ok(at as Nanos)
    }

    /// The next arrival, or None at the end (an error in the file: the
    /// row's line and column).
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> Result<Option<Arrival>, ConfigError> {
        let a = self.next;
        if a.is_some() {
            self.next = self.advance()?;
        }
        Ok(a)
    }

    /// Time of the next arrival, if any.
    pub fn peek(&self) -> Option<Nanos> {
        self.next.map(|a| a.at)
    }

    /// Take the next arrival as an open loop's `(time, input, output)`,
    /// for a trace checked when its experiment was loaded: a file that
    /// changed since and no longer reads is a panic naming it.
    pub fn pop(&mut self) -> Option<Arrival> {
        match self.next() {
            Ok(a) => a,
            Err(e) => panic!("the trace changed since it was checked: {e}"),
        }
    }
}

#[cfg(test)]
mod tests;
