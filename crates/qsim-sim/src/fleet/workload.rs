//! A fleet's requests: arrival times, token counts, the model asked for
//! and (for prefix caching) the block hashes of the prompt.
//!
//! - distributions of input and output tokens (as in server experiments);
//! - a token-length CDF in vllm-sr-sim's format: a JSON array of
//!   `[total tokens, cumulative fraction]` (or `{"cdf": [...]}`), lengths
//!   increasing, fractions non-decreasing in [0, 1] and ending at 1; a
//!   request's total is uniform within its bucket (the first bucket from
//!   1), split into input `⌊total × input_share⌋` (at least 1) and output
//!   the rest (at least 1), as vllm-sr-sim's `CdfWorkload` does;
//! - a request trace (any format `qsim trace` reads);
//! - a trace with block hashes (Mooncake's JSON Lines: `timestamp` ms,
//!   `input_length`, `output_length`, `hash_ids`, one hash per block of
//!   `block_tokens`, 512 in Mooncake's release), read as a stream;
//! - synthetic shared prefixes on an open loop ([`Synthetic`]): system
//!   prompts shared by groups of requests, and multi-turn sessions whose
//!   every turn repeats the conversation so far.
//!
//! The model of each request is drawn by the mix's shares. Every source
//! holds one arrival ahead (no per-request storage; sessions: the active
//! ones).

use crate::config::ConfigError;
use crate::engine::rng::{component, stream, unit, Rng};
use crate::time::{Nanos, NEVER};
use crate::trace::{TraceSource, TraceSpec};
use crate::workload::{ArrivalProcess, Lengths, OpenLoop};
use serde::Deserialize;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::path::PathBuf;
use std::sync::Arc;

/// A validated token-length CDF: (total tokens, cumulative fraction),
/// lengths strictly increasing, fractions non-decreasing, the last 1.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenCdf {
    pub points: Vec<(u32, f64)>,
    /// The first bucket starts after this length (0: at 1).
    pub base: u32,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum RawCdf {
    Array(Vec<(f64, f64)>),
    Object { cdf: Vec<(f64, f64)> },
}

impl TokenCdf {
    /// Read a CDF file (bounded, see [`crate::input`]); errors name the
    /// file and the entry (`cdf[3]`).
    pub fn load(path: &Path) -> Result<TokenCdf, ConfigError> {
        let name = path.display().to_string();
        let text = crate::input::read_text(path, crate::input::Kind::Config)
            .map_err(|r| ConfigError::new(&name, "", r))?;
        crate::config::note_read(&name, &text);
        Self::parse(&name, &text)
    }

    /// Parse and validate the JSON text of a CDF named `name`.
    pub fn parse(name: &str, text: &str) -> Result<TokenCdf, ConfigError> {
        let raw: RawCdf = serde_json::from_str(text).map_err(|e| {
            ConfigError::new(
                name,
                "cdf",
                format!(
                    "not a token-length CDF (a JSON array of [tokens, cumulative fraction] pairs, or {{\"cdf\": [...]}}): {e}"
                ),
            )
        })?;
        let pts = match raw {
            RawCdf::Array(v) | RawCdf::Object { cdf: v } => v,
        };
        Self::from_points(name, &pts)
    }

    /// Validate points (errors name `cdf[i]`).
    pub fn from_points(name: &str, pts: &[(f64, f64)]) -> Result<TokenCdf, ConfigError> {
        if pts.is_empty() {
            return Err(ConfigError::new(name, "cdf", "no points"));
        }
        let mut out = Vec::with_capacity(pts.len());
        let (mut prev_len, mut prev_f) = (0u32, 0.0f64);
        for (i, &(len, f)) in pts.iter().enumerate() {
            let at = format!("cdf[{i}]");
            if !((1.0..=16_777_216.0).contains(&len) && len.fract() == 0.0) {
                return Err(ConfigError::new(
                    name,
                    at,
                    format!("token length must be a whole number in 1..=16777216, got {len}"),
                ));
            }
            let len = len as u32;
            if len <= prev_len {
                return Err(ConfigError::new(
                    name,
                    at,
                    format!("token lengths must increase: {len} after {prev_len}"),
                ));
            }
            if !(f.is_finite() && (0.0..=1.0).contains(&f)) {
                return Err(ConfigError::new(
                    name,
                    at,
                    format!("cumulative fraction must be in [0, 1], got {f}"),
                ));
            }
            if f < prev_f {
                return Err(ConfigError::new(
                    name,
                    at,
                    format!("not monotone: cumulative fraction {f} after {prev_f}"),
                ));
            }
            out.push((len, f));
            (prev_len, prev_f) = (len, f);
        }
        if prev_f != 1.0 {
            return Err(ConfigError::new(
                name,
                format!("cdf[{}]", pts.len() - 1),
                format!("the cumulative fraction must reach 1, ends at {prev_f}"),
            ));
        }
        Ok(TokenCdf {
            points: out,
            base: 0,
        })
    }

    /// The longest total a draw can give: the first length whose
    /// fraction is 1.
    pub fn max_len(&self) -> u32 {
        self.points
            .iter()
            .find(|p| p.1 >= 1.0)
            .map_or(self.points[self.points.len() - 1].0, |p| p.0)
    }

    /// The distribution of draws in `above < total <= at_most` (the same
    /// uniform spread within each bucket), or `None` if none falls there.
    pub fn restrict(&self, above: Option<u32>, at_most: Option<u32>) -> Option<TokenCdf> {
        let a = above.unwrap_or(self.base).max(self.base);
        let b = at_most.unwrap_or(u32::MAX);
        let mut pts = Vec::new();
        let (mut pl, mut pf) = (self.base, 0.0f64);
        let mut mass = 0.0;
        for &(len, f) in &self.points {
            let (lo, hi) = (pl.max(a), len.min(b));
            if hi > lo && f > pf {
                mass += (f - pf) * (hi - lo) as f64 / (len - pl) as f64;
                pts.push((hi, mass));
            }
            (pl, pf) = (len, f);
        }
        if mass <= 0.0 {
            return None;
        }
        for p in &mut pts {
            p.1 /= mass;
        }
        let last = pts.len() - 1;
        pts[last].1 = 1.0;
        Some(TokenCdf {
            points: pts,
            base: a,
        })
    }

    /// The shortest total a draw can give.
    pub fn min_len(&self) -> u32 {
        let mut prev = self.base;
        for &(len, f) in &self.points {
            if f > 0.0 {
                return prev + 1;
            }
            prev = len;
        }
        prev
    }

    /// Fraction of requests with total ≤ `x` tokens (linear within a
    /// bucket, as the draws are uniform there).
    pub fn fraction_below(&self, x: f64) -> f64 {
        let (mut pl, mut pf) = (self.base as f64, 0.0f64);
        if x <= pl {
            return 0.0;
        }
        for &(len, f) in &self.points {
            let len = len as f64;
            if x <= len {
                return pf + (f - pf) * ((x - pl) / (len - pl)).clamp(0.0, 1.0);
            }
            (pl, pf) = (len, f);
        }
        1.0
    }

    /// Mean total tokens.
    pub fn mean(&self) -> f64 {
        let (mut pl, mut pf, mut m) = (self.base as f64, 0.0f64, 0.0f64);
        for &(len, f) in &self.points {
            let len = len as f64;
            // uniform integers in [pl + 1, len]
            m += (f - pf) * (pl + 1.0 + len) / 2.0;
            (pl, pf) = (len, f);
        }
        m
    }

    /// One total: the bucket by a uniform draw, then uniform within it.
    pub fn sample(&self, rng: &mut Rng) -> u32 {
        let u = unit(rng);
        let mut prev = self.base;
        for &(len, f) in &self.points {
            if u < f {
                let span = (len - prev) as f64;
                let k = (unit(rng) * span) as u32;
                return prev + 1 + k.min(len - prev - 1);
            }
            prev = len;
        }
        prev
    }
}

/// How token counts are drawn.
#[derive(Debug, Clone, PartialEq)]
pub enum Len {
    /// Input and output distributions.
    Dists(Lengths),
    /// A CDF of totals split by the input share.
    Cdf {
        cdf: Arc<TokenCdf>,
        input_share: f64,
    },
}

impl Len {
    /// (input, output), each ≥ 1.
    #[inline]
    pub fn sample(&self, rng: &mut Rng) -> (u32, u32) {
        match self {
            Len::Dists(l) => l.sample(rng),
            Len::Cdf { cdf, input_share } => split(cdf.sample(rng), *input_share),
        }
    }
}

/// A total split as vllm-sr-sim does: input ⌊total × share⌋ (≥ 1), output
/// the rest (≥ 1).
#[inline]
pub fn split(total: u32, share: f64) -> (u32, u32) {
    let input = ((total as f64 * share) as u32).max(1);
    (input, total.saturating_sub(input).max(1))
}

/// Shared prefixes drawn on an open loop, in units of `unit` tokens.
#[derive(Debug, Clone, PartialEq)]
pub struct Synthetic {
    pub unit: u32,
    /// System prompts: how many, and their length in tokens; each request
    /// (each session) takes one uniformly, before its own tokens.
    pub system_prompts: u32,
    pub system_tokens: u32,
    /// Multi-turn sessions: how many are active at once (each arrival
    /// continues one of them, uniformly), and their mean number of turns
    /// (geometric); 0: every request stands alone. A turn's prompt is the
    /// conversation so far (the previous prompt and its answer) followed
    /// by the new drawn input.
    pub sessions: u32,
    pub turns: f64,
    /// A session ends rather than grow a prompt past this many tokens.
    pub max_prompt: u32,
}

/// A trace with block hashes, validated by a scan at load.
#[derive(Debug, Clone, PartialEq)]
pub struct HashedSpec {
    pub path: PathBuf,
    /// Tokens per hash (Mooncake: 512).
    pub block_tokens: u32,
    /// Times divided by this (2: the trace in half the time).
    pub compress: f64,
    pub rows: u64,
    /// The shortest and longest totals (input + output).
    pub min_total: u64,
    pub max_total: u64,
}

/// Where requests come from.
#[derive(Debug, Clone)]
pub enum Source {
    /// An arrival process with token counts drawn from `len` (and shared
    /// prefixes, if any).
    Open {
        process: ArrivalProcess,
        len: Len,
        prefix: Option<Synthetic>,
    },
    /// A request trace's times and token counts.
    Trace(Arc<TraceSpec>),
    /// A trace with block hashes.
    Hashed(Arc<HashedSpec>),
}

/// The longest line of a hashed trace (a request of ~500,000 blocks).
const MAX_LINE: u64 = 8 << 20;

#[derive(Deserialize)]
struct HashedRow {
    timestamp: f64,
    input_length: u64,
    output_length: u64,
    #[serde(default)]
    hash_ids: Vec<u64>,
}

/// Rows of a hashed trace, one line at a time.
struct HashedReader {
    lines: BufReader<std::fs::File>,
    buf: Vec<u8>,
    line: u64,
    name: String,
    block_tokens: u32,
    last: f64,
}

/// A row: (time in ms, input, output); the hashes into `hashes`.
type Row = (f64, u32, u32);

impl HashedReader {
    fn open(path: &Path, block_tokens: u32) -> Result<Self, ConfigError> {
        let name = path.display().to_string();
        let f = crate::input::open_stream(path).map_err(|r| ConfigError::new(&name, "", r))?;
        Ok(HashedReader {
            lines: BufReader::with_capacity(1 << 16, f),
            buf: Vec::new(),
            line: 0,
            name,
            block_tokens,
            last: f64::NEG_INFINITY,
        })
    }

    fn next(&mut self, hashes: &mut Vec<u64>) -> Result<Option<Row>, ConfigError> {
        loop {
            self.buf.clear();
            self.line += 1;
            let n = (&mut self.lines)
                .take(MAX_LINE + 1)
                .read_until(b'\n', &mut self.buf)
                .map_err(|e| ConfigError::new(&self.name, "", format!("cannot read: {e}")))?;
            if n == 0 {
                return Ok(None);
            }
            let here = format!("line {}", self.line);
            if n as u64 > MAX_LINE {
                return Err(ConfigError::new(
                    &self.name,
                    here,
                    format!("longer than {MAX_LINE} bytes"),
                ));
            }
            let text = std::str::from_utf8(&self.buf)
                .map_err(|_| ConfigError::new(&self.name, &here, "not UTF-8"))?
                .trim();
            if text.is_empty() {
                continue;
            }
            let r: HashedRow = serde_json::from_str(text).map_err(|e| {
                ConfigError::new(
                    &self.name,
                    &here,
                    format!("not a row with timestamp, input_length, output_length, hash_ids: {e}"),
                )
            })?;
            if !(r.timestamp.is_finite() && r.timestamp >= 0.0 && r.timestamp <= 1e15) {
                return Err(ConfigError::new(
                    &self.name,
                    format!("{here}.timestamp"),
                    format!("must be milliseconds in [0, 1e15], got {}", r.timestamp),
                ));
            }
            if r.timestamp < self.last {
                return Err(ConfigError::new(
                    &self.name,
                    format!("{here}.timestamp"),
                    format!(
                        "{} is before the previous row's {}: rows must be in time order",
                        r.timestamp, self.last
                    ),
                ));
            }
            self.last = r.timestamp;
            for (f, v) in [
                ("input_length", r.input_length),
                ("output_length", r.output_length),
            ] {
                if !(1..=16_777_216).contains(&v) {
                    return Err(ConfigError::new(
                        &self.name,
                        format!("{here}.{f}"),
                        format!("must be in 1..=16777216, got {v}"),
                    ));
                }
            }
            let blocks = r.input_length.div_ceil(self.block_tokens as u64);
            if r.hash_ids.len() as u64 > blocks {
                return Err(ConfigError::new(
                    &self.name,
                    format!("{here}.hash_ids"),
                    format!(
                        "{} hashes for {} input tokens: at most one per {} tokens ({blocks})",
                        r.hash_ids.len(),
                        r.input_length,
                        self.block_tokens
                    ),
                ));
            }
            hashes.clear();
            hashes.extend_from_slice(&r.hash_ids);
            return Ok(Some((
                r.timestamp,
                r.input_length as u32,
                r.output_length as u32,
            )));
        }
    }
}

impl HashedSpec {
    /// Scan the whole trace once (every row checked), keeping nothing but
    /// its length and the range of totals.
    pub fn scan(path: &Path, block_tokens: u32, compress: f64) -> Result<HashedSpec, ConfigError> {
        let mut r = HashedReader::open(path, block_tokens)?;
        let mut h = Vec::new();
        let (mut rows, mut lo, mut hi) = (0u64, u64::MAX, 0u64);
        while let Some((_, i, o)) = r.next(&mut h)? {
            rows += 1;
            let t = i as u64 + o as u64;
            lo = lo.min(t);
            hi = hi.max(t);
        }
        if rows == 0 {
            return Err(ConfigError::new(path.display().to_string(), "", "no rows"));
        }
        Ok(HashedSpec {
            path: path.to_path_buf(),
            block_tokens,
            compress,
            rows,
            min_total: lo,
            max_total: hi,
        })
    }
}

/// A validated workload.
#[derive(Debug, Clone)]
pub struct Workload {
    pub source: Source,
    /// (model index, cumulative share), shares summing to 1; one entry:
    /// every request asks for that model.
    pub mix: Vec<(u16, f64)>,
}

/// One request as the workload gives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Arrival {
    pub at: Nanos,
    pub input: u32,
    pub output: u32,
    pub model: u16,
}

enum Inner {
    Open(Box<OpenLoop>),
    Trace(Box<TraceSource>),
    Hashed {
        reader: Box<HashedReader>,
        compress: f64,
        /// The next row, read ahead, and its hashes.
        next: Option<(Nanos, u32, u32)>,
        next_hashes: Vec<u64>,
        end: Nanos,
        left: u64,
    },
}

/// A session in progress (multi-turn synthetic prefixes).
#[derive(Debug, Clone, Copy)]
struct Session {
    id: u64,
    group: u32,
    /// Tokens of the conversation so far (after the system prompt).
    context: u32,
    turns_left: u32,
}

/// The workload's requests in time order, one ahead.
pub struct Requests {
    inner: Inner,
    /// Token counts drawn here (a CDF), not by the open loop.
    cdf: Option<Len>,
    mix: Vec<(u16, f64)>,
    rng: Rng,
    synthetic: Option<Synthetic>,
    sessions: Vec<Option<Session>>,
    next_session: u64,
    next_request: u64,
    /// The block hashes of the request last popped.
    hashes: Vec<u64>,
}

/// A block hash from (kind, owner, index): splitmix64 of the three.
#[inline]
fn block_hash(kind: u64, owner: u64, k: u64) -> u64 {
    let mut z = kind
        .wrapping_mul(0x9e37_79b9_7f4a_7c15)
        .wrapping_add(owner.wrapping_mul(0xbf58_476d_1ce4_e5b9))
        .wrapping_add(k.wrapping_mul(0x94d0_49bb_1331_11eb));
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Random-stream scope of a fleet run's workload (and its first pool's
/// cluster, see [`super::Fleet::new`]).
pub const SCOPE: u64 = 0x39;

impl Requests {
    /// From time 0 until `end` (exclusive), at most `limit` requests.
    pub fn new(w: &Workload, seed: u64, end: Nanos, limit: u64) -> Result<Self, ConfigError> {
        let mut synthetic = None;
        let inner = match &w.source {
            Source::Hashed(spec) => {
                let mut reader = Box::new(HashedReader::open(&spec.path, spec.block_tokens)?);
                let mut next_hashes = Vec::new();
                let next = reader
                    .next(&mut next_hashes)?
                    .map(|(ms, i, o)| (ms_to_ns(ms, spec.compress), i, o));
                Inner::Hashed {
                    reader,
                    compress: spec.compress,
                    next,
                    next_hashes,
                    end,
                    left: limit,
                }
            }
            Source::Open {
                process,
                len,
                prefix,
            } => {
                synthetic = prefix.clone();
                Inner::Open(Box::new(OpenLoop::new(
                    process.clone(),
                    match len {
                        Len::Dists(l) => l.clone(),
                        // the CDF is drawn here: the open loop's own lengths
                        // are not used (a constant it never draws from)
                        Len::Cdf { .. } => Lengths {
                            input: crate::engine::Sampler::constant(1.0),
                            output: crate::engine::Sampler::constant(1.0),
                        },
                    },
                    seed,
                    SCOPE,
                    0,
                    end,
                    limit,
                )))
            }
            Source::Trace(spec) => Inner::Trace(Box::new(TraceSource::open(spec, seed, SCOPE)?)),
        };
        let sessions = vec![None; synthetic.as_ref().map_or(0, |s| s.sessions as usize)];
        Ok(Requests {
            inner,
            cdf: w.cdf_len().cloned(),
            mix: w.mix.clone(),
            rng: stream(seed, SCOPE, component::WORKLOAD),
            synthetic,
            sessions,
            next_session: 0,
            next_request: 0,
            hashes: Vec::new(),
        })
    }

    /// The block hashes of the request last popped (empty without).
    #[inline]
    pub fn hashes(&self) -> &[u64] {
        &self.hashes
    }

    /// Shared prefixes for a request of `input` drawn tokens: its prompt
    /// length, its hashes into `self.hashes`.
    fn prefix(&mut self, input: u32, output: u32) -> u32 {
        let Some(sy) = &self.synthetic else {
            return input;
        };
        let (u, sys) = (sy.unit, sy.system_tokens);
        let req = self.next_request;
        self.next_request += 1;
        let pick = |rng: &mut Rng, n: u32| ((unit(rng) * n as f64) as u32).min(n.saturating_sub(1));
        // (group, owner of the tokens after the system prompt, tokens of
        // the conversation before this turn's input)
        let (group, owner, context) = if self.sessions.is_empty() {
            (
                pick(&mut self.rng, sy.system_prompts),
                (1u64 << 63) | req,
                0,
            )
        } else {
            let k = pick(&mut self.rng, sy.sessions) as usize;
            let s = match self.sessions[k] {
                Some(s)
                    if s.turns_left > 0
                        && sys as u64 + s.context as u64 + input as u64 <= sy.max_prompt as u64 =>
                {
                    s
                }
                _ => {
                    // a new session: its number of turns is geometric
                    let p = 1.0 / sy.turns.max(1.0);
                    let mut turns = 1u32;
                    while turns < 10_000 && unit(&mut self.rng) >= p {
                        turns += 1;
                    }
                    self.next_session += 1;
                    Session {
                        id: self.next_session,
                        group: pick(&mut self.rng, sy.system_prompts),
                        context: 0,
                        turns_left: turns,
                    }
                }
            };
            self.sessions[k] = Some(Session {
                context: s.context.saturating_add(input).saturating_add(output),
                turns_left: s.turns_left - 1,
                ..s
            });
            (s.group, s.id, s.context)
        };
        let prompt = sys.saturating_add(context).saturating_add(input);
        self.hashes.clear();
        let units = prompt.div_ceil(u);
        for k in 0..units as u64 {
            let h = if sys > 0 && (k + 1) * u as u64 <= sys as u64 {
                block_hash(1, group as u64, k)
            } else {
                block_hash(2, owner, k)
            };
            self.hashes.push(h);
        }
        prompt
    }

    /// The next arrival's time.
    #[inline]
    pub fn peek(&self) -> Option<Nanos> {
        match &self.inner {
            Inner::Open(o) => o.peek(),
            Inner::Trace(t) => t.peek(),
            Inner::Hashed {
                next, end, left, ..
            } => next.filter(|n| n.0 < *end && *left > 0).map(|n| n.0),
        }
    }

    /// The next request.
    pub fn pop(&mut self) -> Option<Arrival> {
        let peeked = self.peek()?;
        let (at, mut input, mut output) = match &mut self.inner {
            Inner::Open(o) => o.pop()?,
            Inner::Trace(t) => {
                let a = t.pop()?;
                (a.at, a.input, a.output)
            }
            Inner::Hashed {
                reader,
                compress,
                next,
                next_hashes,
                left,
                ..
            } => {
                let row = next.take()?;
                std::mem::swap(&mut self.hashes, next_hashes);
                *left -= 1;
                *next = reader
                    .next(next_hashes)
                    .unwrap_or_else(|e| panic!("the trace changed since it was checked: {e}"))
                    .map(|(ms, i, o)| (ms_to_ns(ms, *compress), i, o));
                row
            }
        };
        debug_assert_eq!(at, peeked);
        if let Some(l) = &self.cdf {
            (input, output) = l.sample(&mut self.rng);
        }
        if self.synthetic.is_some() {
            input = self.prefix(input, output);
        }
        let model = if self.mix.len() == 1 {
            self.mix[0].0
        } else {
            let u = unit(&mut self.rng);
            self.mix
                .iter()
                .find(|m| u < m.1)
                .unwrap_or(&self.mix[self.mix.len() - 1])
                .0
        };
        Some(Arrival {
            at,
            input,
            output,
            model,
        })
    }
}

/// A trace time in ms, compressed, in ns (the clock's range is checked at
/// load: timestamps ≤ 1e15 ms).
fn ms_to_ns(ms: f64, compress: f64) -> Nanos {
    ((ms / compress) * 1e6).round().min((NEVER - 1) as f64) as Nanos
}

impl Workload {
    /// The tokens each block hash covers, if the requests carry hashes.
    pub fn prefix_unit(&self) -> Option<u32> {
        match &self.source {
            Source::Hashed(h) => Some(h.block_tokens),
            Source::Open {
                prefix: Some(s), ..
            } => Some(s.unit),
            _ => None,
        }
    }

    /// The CDF lengths, if the source draws from one.
    pub fn cdf_len(&self) -> Option<&Len> {
        match &self.source {
            Source::Open {
                len: l @ Len::Cdf { .. },
                ..
            } => Some(l),
            _ => None,
        }
    }

    /// The range of totals (input + output) the workload can give, when
    /// known before the run (distributions: their clamps; a CDF: its
    /// buckets; a trace: unknown).
    pub fn total_range(&self) -> Option<(u64, u64)> {
        match &self.source {
            // shared prefixes lengthen the prompts: no fixed range
            Source::Open {
                prefix: Some(_), ..
            } => None,
            Source::Open {
                len: Len::Cdf { cdf, .. },
                ..
            } => Some((cdf.min_len().max(2) as u64, cdf.max_len().max(2) as u64)),
            Source::Open {
                len: Len::Dists(l), ..
            } => {
                let lo = l.input.min.max(1.0) + l.output.min.max(1.0);
                let hi = l.input.max + l.output.max;
                Some((lo as u64, hi.min(u64::MAX as f64 / 2.0) as u64))
            }
            Source::Hashed(h) => Some((h.min_total, h.max_total)),
            Source::Trace(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cdf_is_checked_entry_by_entry() {
        let ok = TokenCdf::parse("c.json", "[[64, 0.1], [128, 0.5], [256, 1.0]]").unwrap();
        assert_eq!(ok.points.len(), 3);
        assert_eq!((ok.min_len(), ok.max_len()), (1, 256));
        let obj = TokenCdf::parse("c.json", r#"{"cdf": [[10, 0.0], [20, 1.0]]}"#).unwrap();
        assert_eq!((obj.min_len(), obj.max_len()), (11, 20));
        let err = |t: &str| TokenCdf::parse("c.json", t).unwrap_err();
        let e = err("[[64, 0.5], [128, 0.4], [256, 1.0]]");
        assert_eq!(e.field, "cdf.1");
        assert!(e.reason.contains("not monotone"), "{}", e.reason);
        let e = err("[[64, 0.5], [128, 0.9]]");
        assert_eq!(e.field, "cdf.1");
        assert!(e.reason.contains("must reach 1"), "{}", e.reason);
        assert_eq!(err("[[64, 0.5], [64, 1.0]]").field, "cdf.1");
        assert_eq!(err("[[0, 0.5], [64, 1.0]]").field, "cdf.0");
        assert_eq!(err("[[8, 1.5]]").field, "cdf.0");
        assert_eq!(err("[]").field, "cdf");
        assert_eq!(err("{\"x\": 1}").field, "cdf");
    }

    /// Draws fall in their buckets in the CDF's proportions, uniform
    /// within (the mean as computed from the points).
    #[test]
    fn draws_follow_the_cdf() {
        let c = TokenCdf::parse("c", "[[100, 0.25], [1000, 0.75], [2000, 1.0]]").unwrap();
        let mut rng = stream(3, 0, 1);
        let n = 200_000;
        let (mut b, mut sum) = ([0u32; 3], 0f64);
        for _ in 0..n {
            let x = c.sample(&mut rng);
            assert!((1..=2000).contains(&x));
            b[if x <= 100 {
                0
            } else if x <= 1000 {
                1
            } else {
                2
            }] += 1;
            sum += x as f64;
        }
        let share = |k: usize| b[k] as f64 / n as f64;
        assert!((share(0) - 0.25).abs() < 0.005 && (share(1) - 0.5).abs() < 0.005);
        assert!((sum / n as f64 / c.mean() - 1.0).abs() < 0.01);
        assert!((c.fraction_below(550.0) - 0.5).abs() < 1e-12);
        assert_eq!(split(1000, 0.8), (800, 200));
        // restricted to (500, 1500]: 500 of bucket 2's 900 (mass 0.5 ×
        // 5/9) and 500 of bucket 3's 1000 (mass 0.25 × 1/2)
        let r = c.restrict(Some(500), Some(1500)).unwrap();
        let m2 = 0.5 * 500.0 / 900.0;
        let m3 = 0.25 * 0.5;
        assert_eq!(r.points.len(), 2);
        assert_eq!((r.base, r.points[0].0, r.points[1].0), (500, 1000, 1500));
        assert!((r.points[0].1 - m2 / (m2 + m3)).abs() < 1e-12);
        assert!((c.fraction_below(1500.0) - c.fraction_below(500.0) - (m2 + m3)).abs() < 1e-12);
        let mut rng = stream(4, 0, 1);
        for _ in 0..10_000 {
            assert!((501..=1500).contains(&r.sample(&mut rng)));
        }
        assert_eq!((r.min_len(), r.max_len()), (501, 1500));
        assert!(c.restrict(Some(2000), None).is_none());
        assert_eq!(split(1, 0.8), (1, 1));
    }
}
