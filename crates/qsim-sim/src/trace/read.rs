//! Reading a request trace file row by row: the formats and their
//! detection, a line reader with a bounded line, the row parsers, and a
//! bounded reordering window. Memory is the window (at most
//! [`REORDER_WINDOW`] rows), one line (at most [`MAX_LINE`] bytes), the
//! read buffer and the consumer names: nothing grows with the file.
//!
//! Timestamps are absolute integer nanoseconds of the file's own clock
//! (a datetime without a time zone is read as UTC; only differences are
//! used). Rows out of time order by fewer than [`REORDER_WINDOW`] rows are
//! put in order (and counted: the callers warn); a row earlier than a row
//! already passed on is refused with its line, since sorting a whole file
//! would need memory in proportion to it.

use crate::config::ConfigError;
use serde::Deserialize;
use std::collections::{BTreeMap, VecDeque};
use std::io::{BufRead, BufReader, Read, Seek};
use std::path::Path;

/// The longest line read: a longer one is an error, never buffered.
pub const MAX_LINE: usize = 1 << 20;
/// Rows held to put slightly unsorted rows in time order.
pub const REORDER_WINDOW: usize = 65_536;
/// The most tokens a request may have (input or output).
pub const MAX_TOKENS: u64 = 1_000_000_000;
/// The most distinct consumer names a trace may have.
pub const MAX_CONSUMERS: usize = 10_000;

/// The unit of a plain CSV's time column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeUnit {
    S,
    Ms,
    Us,
    Ns,
    /// `YYYY-MM-DD HH:MM:SS[.fraction]` (or with `T`, optionally `Z`).
    Datetime,
}

impl TimeUnit {
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "s" => TimeUnit::S,
            "ms" => TimeUnit::Ms,
            "us" => TimeUnit::Us,
            "ns" => TimeUnit::Ns,
            "datetime" => TimeUnit::Datetime,
            _ => return None,
        })
    }
    /// Decimal digits of a nanosecond in one unit.
    fn digits(self) -> u32 {
        match self {
            TimeUnit::S => 9,
            TimeUnit::Ms => 6,
            TimeUnit::Us => 3,
            TimeUnit::Ns | TimeUnit::Datetime => 0,
        }
    }
}

/// The columns of a CSV trace.
#[derive(Debug, Clone, PartialEq)]
pub struct Columns {
    pub time: String,
    pub unit: TimeUnit,
    pub input: String,
    pub output: String,
}

/// A trace file's format.
#[derive(Debug, Clone, PartialEq)]
pub enum Format {
    /// Azure LLM inference trace: `TIMESTAMP,ContextTokens,GeneratedTokens`.
    Azure,
    /// BurstGPT: `Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type`.
    BurstGpt,
    /// Mooncake JSON Lines: `timestamp` (ms), `input_length`, `output_length`.
    Mooncake,
    /// `qsim proxy`'s decision log (JSON Lines).
    Proxy,
    /// A CSV with the named columns.
    Csv(Columns),
}

impl Format {
    pub fn name(&self) -> &'static str {
        match self {
            Format::Azure => "azure",
            Format::BurstGpt => "burstgpt",
            Format::Mooncake => "mooncake",
            Format::Proxy => "proxy",
            Format::Csv(_) => "csv",
        }
    }
    /// The CSV columns of a CSV format.
    fn columns(&self) -> Option<Columns> {
        let c = |t: &str, unit, i: &str, o: &str| Columns {
            time: t.into(),
            unit,
            input: i.into(),
            output: o.into(),
        };
        match self {
            Format::Azure => Some(c(
                "TIMESTAMP",
                TimeUnit::Datetime,
                "ContextTokens",
                "GeneratedTokens",
            )),
            Format::BurstGpt => Some(c(
                "Timestamp",
                TimeUnit::S,
                "Request tokens",
                "Response tokens",
            )),
            Format::Csv(c) => Some(c.clone()),
            Format::Mooncake | Format::Proxy => None,
        }
    }
}

/// One request of the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Row {
    /// Absolute time (ns) on the file's clock.
    pub t: i64,
    pub input: u32,
    pub output: u32,
    /// The consumer's index in [`Reader::consumers`] (0 without a consumer column).
    pub consumer: u32,
    /// The row's line in the file (from 1).
    pub line: u64,
}

/// The rows of a Parquet file, each as one JSON object line (see
/// [`set_parquet_rows`]).
pub type ParquetRows = Box<dyn Iterator<Item = Result<Vec<u8>, String>> + Send>;

/// Opens a Parquet file (a regular file, opened) as its rows, reading the
/// named columns: the binary registers one (polars, in qsim-results); this
/// crate has no Parquet reader of its own.
pub type ParquetOpener = fn(std::fs::File, &[&str]) -> Result<ParquetRows, String>;

static PARQUET: std::sync::OnceLock<ParquetOpener> = std::sync::OnceLock::new();

/// Register the Parquet reader (once per process; later calls are ignored).
pub fn set_parquet_rows(open: ParquetOpener) {
    let _ = PARQUET.set(open);
}

/// The fields of `qsim proxy`'s decision log the trace reads.
const PROXY_FIELDS: [&str; 10] = [
    "consumer",
    "run_unix_ms",
    "arrival_ns",
    "input_tokens",
    "usage_input",
    "usage_output",
    "settled_output",
    "max_tokens",
    "decision",
    "retry_count",
];

/// Where lines come from: the file's text, or a Parquet file's rows.
enum Src {
    Text(BufReader<std::fs::File>),
    Parquet(ParquetRows),
}

/// Lines of at most [`MAX_LINE`] bytes, without their `\n` or `\r\n`
/// (a Parquet file's rows: one line per row).
struct Lines {
    r: Src,
    buf: Vec<u8>,
    no: u64,
}

impl Lines {
    /// The next line into `self.buf`; false at the end of the file.
    fn next(&mut self) -> Result<bool, String> {
        self.buf.clear();
        let r = match &mut self.r {
            Src::Text(r) => r,
            Src::Parquet(rows) => {
                return match rows.next() {
                    None => Ok(false),
                    Some(Ok(line)) => {
                        self.buf = line;
                        self.no += 1;
                        Ok(true)
                    }
                    Some(Err(e)) => Err(e),
                };
            }
        };
        // the usual case: the whole line is in the read buffer (one search
        // for its end, one copy; the same line as the general way below)
        let avail = r
            .fill_buf()
            .map_err(|e| format!("line {}: cannot read: {e}", self.no + 1))?;
        if avail.is_empty() {
            return Ok(false);
        }
        if let Some(p) = memchr::memchr(b'\n', avail).filter(|&p| p <= MAX_LINE) {
            self.buf.extend_from_slice(&avail[..p]);
            r.consume(p + 1);
            return Ok(self.line_read());
        }
        // at most MAX_LINE bytes and the newline: a longer line stops
        // there (memory stays bounded) and is refused
        let n = r
            .take(MAX_LINE as u64 + 1)
            .read_until(b'\n', &mut self.buf)
            .map_err(|e| format!("line {}: cannot read: {e}", self.no + 1))?;
        if n == 0 {
            return Ok(false);
        }
        if self.buf.last() == Some(&b'\n') {
            self.buf.pop();
        } else if self.buf.len() > MAX_LINE {
            return Err(format!(
                "line {}: longer than {} MiB, the longest line qsim reads from a trace",
                self.no + 1,
                MAX_LINE >> 20
            ));
        }
        Ok(self.line_read())
    }

    /// A line was read into `self.buf` (without its `\n`): count it, drop
    /// a `\r` before the newline and the first line's byte-order mark.
    #[inline]
    fn line_read(&mut self) -> bool {
        self.no += 1;
        if self.buf.last() == Some(&b'\r') {
            self.buf.pop();
        }
        if self.no == 1 && self.buf.starts_with(b"\xEF\xBB\xBF") {
            self.buf.drain(..3);
        }
        true
    }
}

enum Parser {
    Csv {
        /// Column indexes of time, input, output, consumer.
        time: usize,
        input: usize,
        output: usize,
        consumer: Option<usize>,
        unit: TimeUnit,
        names: Vec<String>,
        /// The Azure layout (datetime, input, output; no consumer): rows
        /// are tried with [`azure_row`] first.
        azure: bool,
    },
    Mooncake,
    Proxy,
}

/// The rows of a trace file in time order.
pub struct Reader {
    file: String,
    format: Format,
    lines: Lines,
    parser: Parser,
    window: VecDeque<Row>,
    /// Rows held before the oldest is passed on: [`REORDER_WINDOW`], or 0
    /// for a file known to be in time order (see [`Reader::in_order`]).
    window_len: usize,
    /// The time of the last row passed on.
    last_out: Option<i64>,
    max_seen: i64,
    eof: bool,
    fields: Vec<(usize, usize)>,
    /// Rows that came after a later row (put in order).
    pub reordered: u64,
    /// Proxy-log records that are not demand (invalid requests, client
    /// retries) or have no token counts.
    pub skipped: u64,
    /// Consumer names in order of first appearance.
    pub consumers: Vec<String>,
    index: BTreeMap<String, u32>,
    /// What errors number: `line` (text), `row` (Parquet).
    unit: &'static str,
    dates: DateCache,
}

/// Split a CSV line into fields (byte ranges, quotes removed from a quoted
/// field; `""` inside quotes is kept as two bytes: no field qsim reads
/// has quotes in it).
fn split(line: &[u8], out: &mut Vec<(usize, usize)>) {
    out.clear();
    // no quotes (the common case): fields between commas, found 8 bytes
    // at a time (a word's bytes equal to a quote or a comma as bit masks)
    const ONES: u64 = 0x0101_0101_0101_0101;
    let mut start = 0;
    let mut i = 0;
    while i + 8 <= line.len() {
        let x = u64::from_le_bytes(line[i..i + 8].try_into().expect("8 bytes"));
        if zero_bytes(x ^ (ONES * b'"' as u64)) != 0 {
            out.clear();
            return split_quoted(line, out);
        }
        let mut commas = zero_bytes(x ^ (ONES * b',' as u64));
        while commas != 0 {
            let k = i + (commas.trailing_zeros() / 8) as usize;
            out.push((start, k));
            start = k + 1;
            commas &= commas - 1;
        }
        i += 8;
    }
    for (k, &b) in line.iter().enumerate().skip(i) {
        if b == b'"' {
            out.clear();
            return split_quoted(line, out);
        }
        if b == b',' {
            out.push((start, k));
            start = k + 1;
        }
    }
    out.push((start, line.len()));
}

/// 0x80 in each byte of `x` that is zero, 0 in the others (exact: no
/// carry crosses a byte).
#[inline]
fn zero_bytes(x: u64) -> u64 {
    const LOW7: u64 = 0x7F7F_7F7F_7F7F_7F7F;
    !(((x & LOW7) + LOW7) | x | LOW7)
}

/// [`split`] of a line with a quote in it.
fn split_quoted(line: &[u8], out: &mut Vec<(usize, usize)>) {
    let mut i = 0;
    loop {
        if line.get(i) == Some(&b'"') {
            let start = i + 1;
            let mut j = start;
            while j < line.len() {
                if line[j] == b'"' {
                    if line.get(j + 1) == Some(&b'"') {
                        j += 2;
                        continue;
                    }
                    break;
                }
                j += 1;
            }
            out.push((start, j.min(line.len())));
            // skip to the comma after the closing quote
            match line[j.min(line.len())..].iter().position(|&b| b == b',') {
                Some(p) => i = j + p + 1,
                None => return,
            }
        } else {
            match line[i..].iter().position(|&b| b == b',') {
                Some(p) => {
                    out.push((i, i + p));
                    i += p + 1;
                }
                None => {
                    out.push((i, line.len()));
                    return;
                }
            }
        }
    }
}

fn trim(b: &[u8]) -> &[u8] {
    let s = b
        .iter()
        .position(|c| !c.is_ascii_whitespace())
        .unwrap_or(b.len());
    let e = b
        .iter()
        .rposition(|c| !c.is_ascii_whitespace())
        .map_or(s, |e| e + 1);
    &b[s..e]
}

fn shown(b: &[u8]) -> String {
    let s = String::from_utf8_lossy(&b[..b.len().min(40)]).into_owned();
    if b.len() > 40 {
        format!("{s:?}…")
    } else {
        format!("{s:?}")
    }
}

/// A token count: digits only, at most [`MAX_TOKENS`].
fn tokens(b: &[u8]) -> Result<u32, String> {
    // digits only, no spaces, at most 9 of them (< MAX_TOKENS): one pass
    if !b.is_empty() && b.len() <= 9 {
        let mut v = 0u32;
        let mut digits = true;
        for &c in b {
            let d = c.wrapping_sub(b'0');
            if d >= 10 {
                digits = false;
                break;
            }
            v = v * 10 + d as u32;
        }
        if digits {
            return Ok(v);
        }
    }
    let b = trim(b);
    if b.first() == Some(&b'-') && b.len() > 1 && b[1..].iter().all(u8::is_ascii_digit) {
        return Err(format!("a negative token count: {}", shown(b)));
    }
    if b.is_empty() || !b.iter().all(u8::is_ascii_digit) {
        return Err(format!("not a token count (a whole number): {}", shown(b)));
    }
    let mut v: u64 = 0;
    for &c in b {
        v = v.saturating_mul(10).saturating_add((c - b'0') as u64);
    }
    if v > MAX_TOKENS {
        return Err(format!("more than {MAX_TOKENS} tokens: {}", shown(b)));
    }
    Ok(v as u32)
}

/// A decimal number of units of 10^`digits` ns (e.g. seconds: 9) as
/// integer nanoseconds, exactly (rounded to the nearest ns past 9 digits).
fn decimal_ns(b: &[u8], digits: u32) -> Result<i64, String> {
    let b = trim(b);
    let bad = || format!("not a time (a decimal number): {}", shown(b));
    let (neg, b2) = match b.first() {
        Some(b'-') => (true, &b[1..]),
        _ => (false, b),
    };
    let (int, frac) = match b2.iter().position(|&c| c == b'.') {
        Some(p) => (&b2[..p], &b2[p + 1..]),
        None => (b2, &b2[..0]),
    };
    if (int.is_empty() && frac.is_empty())
        || !int.iter().all(u8::is_ascii_digit)
        || !frac.iter().all(u8::is_ascii_digit)
    {
        return Err(bad());
    }
    let scale = 10i128.pow(digits);
    let mut v: i128 = 0;
    for &c in int {
        v = v * 10 + (c - b'0') as i128;
        if v > i64::MAX as i128 {
            return Err(format!("a time out of range: {}", shown(b)));
        }
    }
    v *= scale;
    let mut place = scale;
    for (k, &c) in frac.iter().enumerate() {
        if place > 1 {
            place /= 10;
            v += (c - b'0') as i128 * place;
        } else {
            // the first digit below a nanosecond rounds
            if k < frac.len() && c >= b'5' {
                v += 1;
            }
            break;
        }
    }
    if v > i64::MAX as i128 {
        return Err(format!("a time out of range: {}", shown(b)));
    }
    Ok(if neg { -(v as i64) } else { v as i64 })
}

/// Days from 1970-01-01 to the civil date (proleptic Gregorian; Howard
/// Hinnant's `days_from_civil`).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// `YYYY-MM-DD HH:MM:SS[.f]` (`T` for the space, a trailing `Z` allowed)
/// as ns since 1970-01-01 00:00:00, read as UTC.
pub fn datetime_ns(b: &[u8]) -> Result<i64, String> {
    match datetime_plain(b) {
        Some(t) => Ok(t),
        None => datetime_any(b),
    }
}

/// [`datetime_ns`], every case (spaces around, a `Z`, the errors).
fn datetime_any(b: &[u8]) -> Result<i64, String> {
    let b = trim(b);
    let bad = || {
        format!(
            "not a datetime (YYYY-MM-DD HH:MM:SS[.fraction]): {}",
            shown(b)
        )
    };
    let b = b.strip_suffix(b"Z").unwrap_or(b);
    if b.len() < 19 {
        return Err(bad());
    }
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let s = &b[r];
        s.iter()
            .all(u8::is_ascii_digit)
            .then(|| s.iter().fold(0i64, |a, &c| a * 10 + (c - b'0') as i64))
    };
    let sep = |i: usize, c: &[u8]| c.contains(&b[i]);
    if !(sep(4, b"-") && sep(7, b"-") && sep(10, b" T") && sep(13, b":") && sep(16, b":")) {
        return Err(bad());
    }
    let (Some(y), Some(mo), Some(d), Some(h), Some(mi), Some(s)) = (
        num(0..4),
        num(5..7),
        num(8..10),
        num(11..13),
        num(14..16),
        num(17..19),
    ) else {
        return Err(bad());
    };
    let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    let mdays = [
        31,
        if leap { 29 } else { 28 },
        31,
        30,
        31,
        30,
        31,
        31,
        30,
        31,
        30,
        31,
    ];
    if !(1..=12).contains(&mo)
        || d < 1
        || d > mdays[(mo - 1) as usize]
        || h > 23
        || mi > 59
        || s > 60
    {
        return Err(bad());
    }
    let mut frac_ns = 0i64;
    if b.len() > 19 {
        let f = &b[19..];
        if f[0] != b'.' || f.len() < 2 || f.len() > 10 || !f[1..].iter().all(u8::is_ascii_digit) {
            return Err(bad());
        }
        for k in 0..9 {
            frac_ns = frac_ns * 10 + f.get(1 + k).map_or(0, |&c| (c - b'0') as i64);
        }
    }
    // checked: a date outside what nanoseconds since 1970 hold in an i64
    // (about 1677-09-21 to 2262-04-11) is refused, never wrapped
    let secs = days_from_civil(y, mo, d) * 86_400 + h * 3600 + mi * 60 + s;
    secs.checked_mul(1_000_000_000)
        .and_then(|ns| ns.checked_add(frac_ns))
        .ok_or_else(|| {
            format!(
                "a date out of range (qsim reads 1677-09-22 to 2262-04-11): {}",
                shown(b)
            )
        })
}

/// [`datetime_ns`] of a plain `YYYY-MM-DD HH:MM:SS[.f]` (no spaces
/// around, no `Z`, a valid date and time): the same value in one pass;
/// None for anything else (which [`datetime_ns`] reads or refuses).
#[inline]
fn datetime_plain(b: &[u8]) -> Option<i64> {
    let days = plain_date(b)?;
    days.checked_mul(86_400_000_000_000)?
        .checked_add(plain_time(b)?)
}

/// The days since 1970-01-01 of a plain datetime's date (its first 10
/// bytes; None unless [`datetime_plain`] would read them).
#[inline]
fn plain_date(b: &[u8]) -> Option<i64> {
    if !(19..=29).contains(&b.len()) || b[4] != b'-' || b[7] != b'-' {
        return None;
    }
    let d = |i: usize| -> Option<i64> {
        let c = b[i].wrapping_sub(b'0');
        (c < 10).then_some(c as i64)
    };
    let y = d(0)? * 1000 + d(1)? * 100 + d(2)? * 10 + d(3)?;
    let mo = d(5)? * 10 + d(6)?;
    let day = d(8)? * 10 + d(9)?;
    let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    let mdays = match mo {
        2 if leap => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    };
    if !(1..=12).contains(&mo) || day < 1 || day > mdays {
        return None;
    }
    Some(days_from_civil(y, mo, day))
}

/// The ns since midnight of a plain datetime of 19..=29 bytes (all but
/// its first 10 bytes read; None unless [`datetime_plain`] would read them).
#[inline]
fn plain_time(b: &[u8]) -> Option<i64> {
    if (b[10] != b' ' && b[10] != b'T') || b[13] != b':' || b[16] != b':' {
        return None;
    }
    let d = |i: usize| -> Option<i64> {
        let c = b[i].wrapping_sub(b'0');
        (c < 10).then_some(c as i64)
    };
    let h = d(11)? * 10 + d(12)?;
    let mi = d(14)? * 10 + d(15)?;
    let s = d(17)? * 10 + d(18)?;
    if h > 23 || mi > 59 || s > 60 {
        return None;
    }
    let mut frac_ns = 0i64;
    if b.len() > 19 {
        if b[19] != b'.' || b.len() < 21 {
            return None;
        }
        // 1..=9 digits, as nanoseconds
        let f = &b[20..];
        for &c in f {
            let c = c.wrapping_sub(b'0');
            if c >= 10 {
                return None;
            }
            frac_ns = frac_ns * 10 + c as i64;
        }
        const POW10: [i64; 9] = [
            1,
            10,
            100,
            1_000,
            10_000,
            100_000,
            1_000_000,
            10_000_000,
            100_000_000,
        ];
        frac_ns *= POW10[9 - f.len()];
    }
    Some((h * 3600 + mi * 60 + s) * 1_000_000_000 + frac_ns)
}

/// The last plain date read and its day number: rows of a trace mostly
/// share their date, read once.
#[derive(Debug, Default, Clone, Copy)]
struct DateCache {
    date: [u8; 10],
    days: i64,
    set: bool,
}

impl DateCache {
    /// [`datetime_ns`], the date read only when it differs from the last.
    #[inline]
    fn datetime_ns(&mut self, b: &[u8]) -> Result<i64, String> {
        match self.plain(b) {
            Some(t) => Ok(t),
            None => datetime_any(b),
        }
    }

    /// [`datetime_plain`], the date read only when it differs from the last.
    #[inline]
    fn plain(&mut self, b: &[u8]) -> Option<i64> {
        if !(19..=29).contains(&b.len()) {
            return None;
        }
        let days = if self.set && b[..10] == self.date {
            self.days
        } else {
            let days = plain_date(b)?;
            self.date.copy_from_slice(&b[..10]);
            self.days = days;
            self.set = true;
            days
        };
        // out of range: None, and the general path says so
        days.checked_mul(86_400_000_000_000)?
            .checked_add(plain_time(b)?)
    }
}

/// A token count of 1 to 9 digits at `b[from..]`, and where it ends.
#[inline]
fn digits_at(b: &[u8], from: usize) -> Option<(u32, usize)> {
    let mut v = 0u32;
    let mut k = from;
    while let Some(&c) = b.get(k) {
        let d = c.wrapping_sub(b'0');
        if d >= 10 {
            break;
        }
        if k - from == 9 {
            return None;
        }
        v = v * 10 + d as u32;
        k += 1;
    }
    (k > from).then_some((v, k))
}

/// A row as the Azure format writes it, `DATETIME,INPUT,OUTPUT` (a plain
/// datetime, two counts of 1 to 9 digits, nothing else), read in one pass:
/// the values the general path (fields split at commas, [`DateCache`],
/// [`tokens`]) reads from such a line; None for any other line, which the
/// general path reads or refuses (`fast_azure_rows_read_as_the_general_path`).
#[inline]
fn azure_row(b: &[u8], dates: &mut DateCache) -> Option<(i64, u32, u32)> {
    // a plain datetime has no comma in its first 19 bytes: the first comma
    // at or after them ends the field
    let c1 = 19 + b.get(19..)?.iter().take(11).position(|&c| c == b',')?;
    let t = dates.plain(&b[..c1])?;
    let (input, k) = digits_at(b, c1 + 1)?;
    if b.get(k) != Some(&b',') {
        return None;
    }
    let (output, end) = digits_at(b, k + 1)?;
    (end == b.len()).then_some((t, input, output))
}

#[derive(Deserialize)]
struct MooncakeRow {
    timestamp: serde_json::Number,
    input_length: u64,
    output_length: u64,
}

#[derive(Deserialize)]
struct ProxyRow {
    #[serde(default)]
    consumer: String,
    run_unix_ms: u64,
    arrival_ns: u64,
    input_tokens: Option<u64>,
    usage_input: Option<u64>,
    usage_output: Option<u64>,
    settled_output: Option<u64>,
    max_tokens: Option<u64>,
    decision: String,
    retry_count: Option<u32>,
}

impl Reader {
    /// Open `path`; `format` None detects it from the first line;
    /// `consumer_column` names a CSV column holding each request's consumer
    /// (a proxy log's consumers are its logged names, always).
    pub fn open(
        path: &Path,
        format: Option<&Format>,
        consumer_column: Option<&str>,
    ) -> Result<Reader, ConfigError> {
        let file = path.display().to_string();
        let f = crate::input::open_stream(path).map_err(|r| ConfigError::new(&file, "", r))?;
        let e = |r: String| ConfigError::new(&file, "", r);
        let mut text = BufReader::with_capacity(256 << 10, f);
        // a Parquet file starts with its magic bytes
        let parquet = text
            .fill_buf()
            .map_err(|x| e(format!("cannot read: {x}")))?
            .starts_with(b"PAR1");
        let r = if parquet {
            if format.is_some_and(|f| *f != Format::Proxy) {
                return Err(e(format!(
                    "a Parquet file: qsim reads only its proxy's decision log from Parquet, not the {} format",
                    format.map_or("", Format::name)
                )));
            }
            let open = PARQUET.get().ok_or_else(|| {
                e(
                    "a Parquet file: this program has no Parquet reader (the qsim binary reads it)"
                        .into(),
                )
            })?;
            let mut f = text.into_inner();
            f.seek(std::io::SeekFrom::Start(0))
                .map_err(|x| e(format!("cannot read: {x}")))?;
            Src::Parquet(open(f, &PROXY_FIELDS).map_err(e)?)
        } else {
            Src::Text(text)
        };
        let unit = if parquet { "row" } else { "line" };
        let mut lines = Lines {
            r,
            buf: Vec::new(),
            no: 0,
        };
        if !lines.next().map_err(e)? {
            return Err(ConfigError::new(
                &file,
                "",
                "empty: no header and no requests",
            ));
        }
        let first = lines.buf.clone();
        let json = trim(&first).starts_with(b"{");
        if parquet && !String::from_utf8_lossy(&first).contains("\"arrival_ns\"") {
            return Err(e(
                "a Parquet file without an arrival_ns column: not a qsim proxy decision log".into(),
            ));
        }
        let detected = if json {
            let s = String::from_utf8_lossy(&first);
            if s.contains("\"arrival_ns\"") {
                Some(Format::Proxy)
            } else if s.contains("\"input_length\"") {
                Some(Format::Mooncake)
            } else {
                None
            }
        } else {
            let mut fields = Vec::new();
            split(&first, &mut fields);
            let names: Vec<&[u8]> = fields.iter().map(|&(a, b)| trim(&first[a..b])).collect();
            let has = |n: &str| names.contains(&n.as_bytes());
            if has("TIMESTAMP") && has("ContextTokens") && has("GeneratedTokens") {
                Some(Format::Azure)
            } else if has("Timestamp") && has("Request tokens") && has("Response tokens") {
                Some(Format::BurstGpt)
            } else {
                None
            }
        };
        let format = match (format, detected) {
            (Some(f), _) => f.clone(),
            (None, Some(d)) => d,
            (None, None) => {
                return Err(ConfigError::new(
                    &file,
                    "",
                    format!(
                        "line 1: not a header qsim recognises ({}): name the format (azure, burstgpt, mooncake, proxy, or csv with its columns)",
                        shown(&first)
                    ),
                ))
            }
        };
        let mut r = Reader {
            format: format.clone(),
            file: file.clone(),
            lines,
            parser: Parser::Mooncake,
            window: VecDeque::new(),
            window_len: REORDER_WINDOW,
            last_out: None,
            max_seen: i64::MIN,
            eof: false,
            fields: Vec::new(),
            reordered: 0,
            skipped: 0,
            consumers: Vec::new(),
            index: BTreeMap::new(),
            unit,
            dates: DateCache::default(),
        };
        match format.columns() {
            Some(cols) => {
                if json {
                    return Err(r.line_err(
                        1,
                        format!(
                            "a JSON line where the {} format has a CSV header",
                            format.name()
                        ),
                    ));
                }
                let mut fields = Vec::new();
                split(&first, &mut fields);
                let names: Vec<String> = fields
                    .iter()
                    .map(|&(a, b)| String::from_utf8_lossy(trim(&first[a..b])).into_owned())
                    .collect();
                let find = |n: &str| -> Result<usize, ConfigError> {
                    names.iter().position(|x| x == n).ok_or_else(|| {
                        ConfigError::new(
                            &file,
                            "",
                            format!(
                                "line 1: no column {n:?} in the header (it has {})",
                                names.join(", ")
                            ),
                        )
                    })
                };
                let (time, input, output) =
                    (find(&cols.time)?, find(&cols.input)?, find(&cols.output)?);
                let consumer = consumer_column.map(find).transpose()?;
                r.parser = Parser::Csv {
                    azure: (time, input, output) == (0, 1, 2)
                        && consumer.is_none()
                        && cols.unit == TimeUnit::Datetime,
                    time,
                    input,
                    output,
                    consumer,
                    unit: cols.unit,
                    names,
                };
            }
            None => {
                if !json {
                    return Err(r.line_err(
                        1,
                        format!("not a JSON line, as the {} format has", format.name()),
                    ));
                }
                if consumer_column.is_some() {
                    return Err(ConfigError::new(
                        &file,
                        "",
                        format!(
                            "a consumer column applies to CSV traces only (a {} trace: split by shares instead{})",
                            format.name(),
                            if format == Format::Proxy { ", or use its logged consumer names (the default)" } else { "" }
                        ),
                    ));
                }
                r.parser = if format == Format::Proxy {
                    Parser::Proxy
                } else {
                    Parser::Mooncake
                };
                // the first line is a row: parse it again below
                r.lines.buf = first;
                let row = r.parse_current()?;
                if let Some(row) = row {
                    r.push(row)?;
                }
            }
        }
        Ok(r)
    }

    pub fn file(&self) -> &str {
        &self.file
    }

    /// The file was read before with no row out of time order: pass each
    /// row on as it is read (the same rows in the same order as through the
    /// reordering window, without holding [`REORDER_WINDOW`] rows; a row
    /// out of order now, a file changed since, is refused as one too far
    /// out of order).
    pub fn in_order(&mut self) {
        self.window_len = 0;
    }

    /// Rows held before the oldest is passed on.
    pub fn window_len(&self) -> usize {
        self.window_len
    }

    /// The format (named or detected).
    pub fn format(&self) -> &Format {
        &self.format
    }

    fn line_err(&self, line: u64, reason: String) -> ConfigError {
        ConfigError::new(&self.file, "", format!("{} {line}: {reason}", self.unit))
    }

    fn consumer_id(&mut self, name: &[u8], line: u64, col: &str) -> Result<u32, ConfigError> {
        let name = std::str::from_utf8(name).map_err(|_| {
            self.line_err(
                line,
                format!("column {col}: a consumer name that is not UTF-8"),
            )
        })?;
        if let Some(&i) = self.index.get(name) {
            return Ok(i);
        }
        if self.consumers.len() >= MAX_CONSUMERS {
            return Err(self.line_err(
                line,
                format!("more than {MAX_CONSUMERS} distinct consumers"),
            ));
        }
        let i = self.consumers.len() as u32;
        self.consumers.push(name.to_string());
        self.index.insert(name.to_string(), i);
        Ok(i)
    }

    /// The row in `self.lines.buf` (None: a blank line or a skipped record).
    fn parse_current(&mut self) -> Result<Option<Row>, ConfigError> {
        let line = self.lines.no;
        if trim(&self.lines.buf).is_empty() {
            return Ok(None);
        }
        match &self.parser {
            Parser::Csv {
                time,
                input,
                output,
                consumer,
                unit,
                names,
                azure,
            } => {
                if *azure {
                    if let Some((t, input, output)) = azure_row(&self.lines.buf, &mut self.dates) {
                        return Ok(Some(Row {
                            t,
                            input,
                            output,
                            consumer: 0,
                            line,
                        }));
                    }
                }
                let (time, input, output, consumer, unit) =
                    (*time, *input, *output, *consumer, *unit);
                let mut fields = std::mem::take(&mut self.fields);
                split(&self.lines.buf, &mut fields);
                let buf = &self.lines.buf;
                let col = |i: usize| -> Result<&[u8], ConfigError> {
                    fields.get(i).map(|&(a, b)| &buf[a..b]).ok_or_else(|| {
                        ConfigError::new(
                            &self.file,
                            "",
                            format!(
                                "line {line}, column {} ({}): missing (the row has {} fields)",
                                i + 1,
                                names[i],
                                fields.len()
                            ),
                        )
                    })
                };
                let at = |i: usize, r: String| {
                    ConfigError::new(
                        &self.file,
                        "",
                        format!("line {line}, column {} ({}): {r}", i + 1, names[i]),
                    )
                };
                let t = match unit {
                    TimeUnit::Datetime => self.dates.datetime_ns(col(time)?),
                    u => decimal_ns(col(time)?, u.digits()),
                }
                .map_err(|r| at(time, r))?;
                let i = tokens(col(input)?).map_err(|r| at(input, r))?;
                let o = tokens(col(output)?).map_err(|r| at(output, r))?;
                let cname = match consumer {
                    Some(c) => Some((trim(col(c)?).to_vec(), names[c].clone())),
                    None => None,
                };
                self.fields = fields;
                let consumer = match cname {
                    Some((n, cn)) => self.consumer_id(&n, line, &cn)?,
                    None => 0,
                };
                Ok(Some(Row {
                    t,
                    input: i,
                    output: o,
                    consumer,
                    line,
                }))
            }
            Parser::Mooncake => {
                let de = &mut serde_json::Deserializer::from_slice(&self.lines.buf);
                let r: MooncakeRow =
                    serde_path_to_error::deserialize(de).map_err(|e| self.json_err(line, e))?;
                let t = match (r.timestamp.as_i64(), r.timestamp.as_f64()) {
                    (Some(ms), _) => ms.checked_mul(1_000_000),
                    (None, Some(ms)) if ms.is_finite() && ms.abs() < 9e12 => {
                        Some((ms * 1e6).round() as i64)
                    }
                    _ => None,
                }
                .ok_or_else(|| {
                    self.line_err(
                        line,
                        format!("field timestamp: out of range: {}", r.timestamp),
                    )
                })?;
                let tok = |v: u64, f: &str| {
                    if v > MAX_TOKENS {
                        Err(self.line_err(
                            line,
                            format!("field {f}: more than {MAX_TOKENS} tokens: {v}"),
                        ))
                    } else {
                        Ok(v as u32)
                    }
                };
                Ok(Some(Row {
                    t,
                    input: tok(r.input_length, "input_length")?,
                    output: tok(r.output_length, "output_length")?,
                    consumer: 0,
                    line,
                }))
            }
            Parser::Proxy => {
                let de = &mut serde_json::Deserializer::from_slice(&self.lines.buf);
                let r: ProxyRow =
                    serde_path_to_error::deserialize(de).map_err(|e| self.json_err(line, e))?;
                // demand only: no invalid requests (nothing was asked of the
                // model), no client retries (a consequence of the policy in force)
                if r.decision == "invalid" || r.retry_count.is_some_and(|c| c > 0) {
                    self.skipped += 1;
                    return Ok(None);
                }
                let input = r.usage_input.or(r.input_tokens);
                let output = r.usage_output.or(r.settled_output).or(r.max_tokens);
                let (Some(input), Some(output)) = (input, output) else {
                    self.skipped += 1;
                    return Ok(None);
                };
                let t = (r.run_unix_ms as i128 * 1_000_000 + r.arrival_ns as i128)
                    .try_into()
                    .map_err(|_| self.line_err(line, "field arrival_ns: out of range".into()))?;
                for (v, f) in [(input, "input tokens"), (output, "output tokens")] {
                    if v > MAX_TOKENS {
                        return Err(
                            self.line_err(line, format!("{f}: more than {MAX_TOKENS}: {v}"))
                        );
                    }
                }
                let consumer = self.consumer_id(r.consumer.as_bytes(), line, "consumer")?;
                Ok(Some(Row {
                    t,
                    input: input as u32,
                    output: output as u32,
                    consumer,
                    line,
                }))
            }
        }
    }

    fn json_err(&self, line: u64, e: serde_path_to_error::Error<serde_json::Error>) -> ConfigError {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let reason = crate::config::one_line(&inner.to_string());
        if path.is_empty() || path == "." {
            self.line_err(line, reason)
        } else {
            self.line_err(line, format!("field {path}: {reason}"))
        }
    }

    fn push(&mut self, row: Row) -> Result<(), ConfigError> {
        if let Some(last) = self.last_out {
            if row.t < last {
                return Err(self.line_err(
                    row.line,
                    format!(
                        "a timestamp earlier than a row more than {REORDER_WINDOW} rows before it (qsim puts rows in time order within {REORDER_WINDOW} rows only): sort the file by time"
                    ),
                ));
            }
        }
        if row.t < self.max_seen {
            self.reordered += 1;
            let at = self.window.partition_point(|r| r.t <= row.t);
            self.window.insert(at, row);
        } else {
            self.max_seen = row.t;
            self.window.push_back(row);
        }
        Ok(())
    }

    /// The next row in time order (rows of equal time in file order).
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> Result<Option<Row>, ConfigError> {
        loop {
            if self.window.len() > self.window_len || (self.eof && !self.window.is_empty()) {
                let r = self.window.pop_front().expect("non-empty window");
                self.last_out = Some(r.t);
                return Ok(Some(r));
            }
            if self.eof {
                return Ok(None);
            }
            let more = self
                .lines
                .next()
                .map_err(|r| ConfigError::new(&self.file, "", r))?;
            if !more {
                self.eof = true;
                continue;
            }
            if let Some(row) = self.parse_current()? {
                self.push(row)?;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn datetimes_and_decimals_parse_exactly() {
        assert_eq!(datetime_ns(b"1970-01-01 00:00:00").unwrap(), 0);
        assert_eq!(
            datetime_ns(b"1970-01-02T00:00:01.5Z").unwrap(),
            86_401_500_000_000
        );
        // 2023-11-16 is day 19,677 since the epoch (date -d 2023-11-16 +%s / 86400)
        assert_eq!(
            datetime_ns(b"2023-11-16 18:15:46.6805900").unwrap(),
            (19_677 * 86_400 + 18 * 3600 + 15 * 60 + 46) * 1_000_000_000 + 680_590_000
        );
        assert_eq!(
            datetime_ns(b"2000-03-01 00:00:00").unwrap()
                - datetime_ns(b"2000-02-28 00:00:00").unwrap(),
            2 * 86_400 * 1_000_000_000
        );
        // issue 41, case 5: dates past 2262 (or before 1677) wrapped
        // (2608-08-07 read as a time before 2023-01-01)
        for far in [
            &b"2608-08-07 00:00:00"[..],
            b"9999-12-31 23:59:59",
            b"0000-01-01 00:00:00",
            b"2262-04-12 00:00:00",
        ] {
            let e = datetime_ns(far).unwrap_err();
            assert!(e.contains("out of range"), "{e}");
            assert!(DateCache::default().datetime_ns(far).is_err());
        }
        assert!(datetime_ns(b"2262-04-11 00:00:00").is_ok());
        for bad in [
            &b"2023-02-29 00:00:00"[..],
            b"2023-11-16",
            b"2023-11-16 25:00:00",
            b"x",
        ] {
            assert!(
                datetime_ns(bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        // the one-pass reading of plain datetimes gives what the general
        // one does, or leaves the string to it
        let mut g = crate::engine::rng::stream(7, 0, 0);
        use rand::Rng as _;
        let mut plain = 0;
        let mut dates = DateCache::default();
        for _ in 0..200_000 {
            let mut v = format!(
                "{:04}-{:02}-{:02}{}{:02}:{:02}:{:02}",
                g.gen_range(1890..2110),
                g.gen_range(0..14),
                g.gen_range(0..33),
                [" ", "T", "_"][g.gen_range(0..3)],
                g.gen_range(0..26),
                g.gen_range(0..62),
                g.gen_range(0..62)
            );
            let f = g.gen_range(0..13);
            if f > 0 {
                v.push(if g.gen_range(0..20) == 0 { ',' } else { '.' });
                for _ in 1..f {
                    v.push(char::from(b'0' + g.gen_range(0..10u8)));
                }
            }
            match g.gen_range(0..20) {
                0 => v.push('Z'),
                1 => v.insert(0, ' '),
                2 => v.push('x'),
                _ => {}
            }
            let any = datetime_any(v.as_bytes());
            if let Some(t) = datetime_plain(v.as_bytes()) {
                plain += 1;
                assert_eq!(Ok(t), any, "{v}");
            }
            assert_eq!(datetime_ns(v.as_bytes()), any, "{v}");
            // the same through the date cache, after a date that may be the same
            assert_eq!(dates.datetime_ns(v.as_bytes()), any, "{v}");
            if g.gen_range(0..2) == 0 {
                assert_eq!(dates.datetime_ns(v.as_bytes()), any, "{v}");
            }
        }
        assert!(plain > 50_000, "{plain}");
        for t in [
            &b"0"[..],
            b"7",
            b"123456789",
            b"000000042",
            b"1000000000",
            b" 5",
            b"",
        ] {
            let general = {
                let b = trim(t);
                if b.is_empty() || !b.iter().all(u8::is_ascii_digit) {
                    None
                } else {
                    Some(
                        b.iter()
                            .fold(0u64, |a, &c| a.saturating_mul(10) + (c - b'0') as u64),
                    )
                    .filter(|&v| v <= MAX_TOKENS)
                }
            };
            assert_eq!(tokens(t).ok().map(u64::from), general, "{t:?}");
        }
        assert_eq!(decimal_ns(b"1.5", 9).unwrap(), 1_500_000_000);
        assert_eq!(decimal_ns(b"27482", 6).unwrap(), 27_482_000_000);
        assert_eq!(decimal_ns(b"0.0000000016", 9).unwrap(), 2);
        assert_eq!(decimal_ns(b"-2", 3).unwrap(), -2000);
        assert!(decimal_ns(b"1e3", 9).is_err());
        assert!(decimal_ns(b"", 9).is_err());
        assert_eq!(tokens(b" 42 ").unwrap(), 42);
        assert!(tokens(b"-3").unwrap_err().contains("negative"));
        assert!(tokens(b"4.5").unwrap_err().contains("whole number"));
        assert!(tokens(b"99999999999").unwrap_err().contains("more than"));
    }

    #[test]
    fn csv_fields_split_by_words_as_byte_by_byte() {
        // the plain byte-by-byte split, the reference of the word-at-a-time one
        let reference = |line: &[u8]| -> Vec<(usize, usize)> {
            let mut out = Vec::new();
            if line.contains(&b'"') {
                split_quoted(line, &mut out);
                return out;
            }
            let mut start = 0;
            for (k, &b) in line.iter().enumerate() {
                if b == b',' {
                    out.push((start, k));
                    start = k + 1;
                }
            }
            out.push((start, line.len()));
            out
        };
        let mut g = crate::engine::rng::stream(11, 0, 0);
        use rand::Rng as _;
        let alphabet = b",,,\"0a \x00\x80\xff\x2b\x2d\xac";
        let mut f = Vec::new();
        for _ in 0..100_000 {
            let n = g.gen_range(0..40);
            let quotes = g.gen_range(0..4) == 0;
            let line: Vec<u8> = (0..n)
                .map(|_| alphabet[g.gen_range(0..alphabet.len())])
                .filter(|&c| quotes || c != b'"')
                .collect();
            split(&line, &mut f);
            assert_eq!(f, reference(&line), "{line:?}");
        }
    }

    /// Rows read through [`azure_row`] are the rows (and errors) the
    /// general path gives the same lines: valid rows of several dates, and
    /// their mutations (bytes replaced, inserted, removed: spaces, quotes,
    /// signs, separators, long counts and fractions, extra fields).
    #[test]
    fn fast_azure_rows_read_as_the_general_path() {
        let dir = std::env::temp_dir().join(format!("qsim-azure-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("a.csv");
        std::fs::write(&p, "TIMESTAMP,ContextTokens,GeneratedTokens\n").unwrap();
        let mut fast = Reader::open(&p, None, None).unwrap();
        let mut general = Reader::open(&p, None, None).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        match &mut general.parser {
            Parser::Csv { azure, .. } => {
                assert!(*azure, "the Azure header's layout");
                *azure = false;
            }
            _ => panic!("a CSV parser"),
        }
        let mut g = crate::engine::rng::stream(12, 0, 0);
        use rand::Rng as _;
        let alphabet = b"0123456789-: T.,\"x\t+Z";
        let (mut through, mut refused, mut fell_back) = (0, 0, 0);
        for k in 0..200_000u64 {
            let mut line = format!(
                "20{:02}-{:02}-{:02} {:02}:{:02}:{:02}{},{},{}",
                g.gen_range(0..40),
                g.gen_range(1..13),
                g.gen_range(1..32),
                g.gen_range(0..24),
                g.gen_range(0..60),
                g.gen_range(0..61),
                match g.gen_range(0..11) {
                    0 => String::new(),
                    n => format!(".{}", &"1234567890"[..n - 1]),
                },
                &"123456789012"[..g.gen_range(0..12)],
                &"987654321098"[..g.gen_range(0..12)],
            )
            .into_bytes();
            for _ in 0..g.gen_range(0..3) {
                let at = g.gen_range(0..=line.len());
                let c = alphabet[g.gen_range(0..alphabet.len())];
                match g.gen_range(0..3) {
                    0 if at < line.len() => line[at] = c,
                    1 => line.insert(at, c),
                    _ if at < line.len() => {
                        line.remove(at);
                    }
                    _ => {}
                }
            }
            let mut cache = fast.dates;
            match azure_row(&line, &mut cache) {
                Some(_) => through += 1,
                None => fell_back += 1,
            }
            let mut rows = Vec::new();
            for r in [&mut fast, &mut general] {
                r.lines.buf = line.clone();
                r.lines.no = k + 2;
                rows.push(r.parse_current().map_err(|e| e.to_string()));
            }
            refused += rows[1].is_err() as u32;
            assert_eq!(rows[0], rows[1], "{:?}", String::from_utf8_lossy(&line));
        }
        assert!(
            through > 20_000 && fell_back > 20_000 && refused > 20_000,
            "{through} {fell_back} {refused}"
        );
    }

    #[test]
    fn csv_fields_split_with_quotes() {
        let mut f = Vec::new();
        let l = br#"a,"b,c",,d"#;
        split(l, &mut f);
        let s: Vec<&[u8]> = f.iter().map(|&(a, b)| &l[a..b]).collect();
        assert_eq!(s, vec![&b"a"[..], b"b,c", b"", b"d"]);
    }
}
