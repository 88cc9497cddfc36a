//! The proxy's decision log: one [`Record`] per request (no prompt text, no
//! key or credential: the consumer's name only), written off the request
//! path.
//!
//! The request path fills a small struct and hands it to [`DecisionLog::push`]
//! (a `try_send` into a bounded channel: never blocks; a full channel drops
//! the record and counts it on `/metrics` as
//! `qsim_proxy_log_records_dropped`). One writer thread batches the records
//! into rotating files in the log directory:
//!
//! - Parquet when the proxy is given an encoder ([`Encoder`]: the root crate
//!   passes qsim-results' polars writer), else JSON Lines;
//! - a file is rotated when it reaches `max_file_bytes` (Parquet: estimated
//!   from the bytes per row of the files written so far, and at most
//!   65,536 records: they are held in memory until the file is written) or
//!   `max_file_age`;
//! - every file is written under a `.tmp` name and renamed once complete
//!   (`decisions-<start unix ms>-<seq>.parquet|jsonl`, names sort in time
//!   order), so a reader never sees half a file; after a kill -9, a restart
//!   finalises the stale JSON Lines `.tmp` up to its last complete line and
//!   deletes a stale Parquet `.tmp` (an encoder killed mid-write), and then
//!   starts a new file;
//! - after each rotation, the oldest finished files are deleted while the
//!   directory's finished files exceed `max_total_bytes`.
//!
//! Records not yet in a finished file when the process is killed (at most
//! one rotation's worth) are lost; a graceful shutdown finishes the file.

use crate::clock::Clock;
use crate::sync::lock;
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, SyncSender, TryRecvError, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One request's record. Times are the core's clock (virtual under a time
/// scale), nanoseconds since the proxy's clock start (see `clock.rs`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// The proxy's request id (the `x-request-id` answer header).
    pub id: u64,
    /// The proxy process's start (wall clock, ms since the Unix epoch): one
    /// value per run (a restart starts a new one).
    pub run_unix_ms: u64,
    /// The limiter's time scale in that run (1: real time).
    pub time_scale: f64,
    /// The consumer's name ("" when unidentified: a 401).
    pub consumer: String,
    /// The core's time at arrival.
    pub arrival_ns: u64,
    /// The wall clock at arrival, ms since the Unix epoch.
    pub arrival_unix_ms: u64,
    /// The core's time of the final admission decision (absent when none
    /// was taken: invalid requests, shared state unreachable).
    pub decided_ns: Option<u64>,
    /// The proxy's estimate of the prompt's tokens.
    pub input_tokens: Option<u64>,
    pub max_tokens: Option<u64>,
    pub stream: bool,
    /// admitted | waited (admitted after waiting) | limited |
    /// refused_deadline | refused_max_wait | unavailable |
    /// forwarded_unlimited (shared state down, fail open) | invalid |
    /// client_gone (left before a decision)
    pub decision: Cow<'static, str>,
    /// The limit that denied (limited / refused_*).
    pub limit: Option<Cow<'static, str>>,
    /// decided − arrival for a waited request.
    pub wait_ns: Option<u64>,
    /// The retry hint given with a 429 (ms, the limiter's exact retry time).
    pub retry_after_ms: Option<u64>,
    /// The status the client got.
    pub status: u16,
    /// The upstream's status (forwarded requests).
    pub upstream_status: Option<u16>,
    /// Arrival to the first byte of the upstream's answer (core ns).
    pub ttft_ns: Option<u64>,
    /// The core's time when the request's reservation was settled.
    pub end_ns: Option<u64>,
    /// The upstream's `usage` (prompt / completion tokens), when it sent one.
    pub usage_input: Option<u64>,
    pub usage_output: Option<u64>,
    /// The output tokens the limiter was settled with (usage, else the
    /// streamed chunks counted).
    pub settled_output: Option<u64>,
    /// The client's `x-stainless-retry-count` (the OpenAI SDKs' attempt
    /// number: 0 first, 1 first retry, …).
    pub retry_count: Option<u32>,
    /// Why a forwarded request failed (upstream_timeout, client_disconnect, …).
    pub error: Option<Cow<'static, str>>,
    /// The policy generation (1 at start, +1 per reload).
    pub generation: u64,
    /// The request's `model` (the route it took), when it names one.
    #[serde(default)]
    pub model: Option<String>,
    /// The upstream whose answer the client got (or the last one tried).
    #[serde(default)]
    pub upstream: Option<String>,
    /// Attempts sent to upstreams (retries across upstreams included).
    #[serde(default)]
    pub attempts: Option<u32>,
    /// Each attempt, `;`-separated: `upstream,result,sent,replied` (the
    /// result as the gateway took it: ok, rate_limited, server_error,
    /// timeout, refused, client_error; times in core ns after arrival).
    #[serde(default)]
    pub trail: Option<String>,
}

/// Encodes a batch of records as one file's bytes (Parquet).
pub type Encoder = Arc<dyn Fn(&[Record]) -> Result<Vec<u8>, String> + Send + Sync>;

/// Where and how the log is written.
#[derive(Clone)]
pub struct LogConfig {
    pub dir: PathBuf,
    pub max_file_bytes: u64,
    pub max_total_bytes: u64,
    /// A file is finished at the latest this long after its first record.
    pub max_file_age: Duration,
    /// Records waiting for the writer; beyond, records are dropped (counted).
    pub queue: usize,
}

impl std::fmt::Debug for LogConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogConfig")
            .field("dir", &self.dir)
            .field("max_file_bytes", &self.max_file_bytes)
            .field("max_total_bytes", &self.max_total_bytes)
            .field("max_file_age", &self.max_file_age)
            .field("queue", &self.queue)
            .finish()
    }
}

enum Msg {
    Rec(Box<Record>),
    Close,
}

/// The log's handle on the request path.
pub struct DecisionLog {
    tx: SyncSender<Msg>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    pub dropped: prometheus_client::metrics::counter::Counter,
    pub written: Arc<prometheus_client::metrics::counter::Counter>,
    pub run_unix_ms: u64,
}

/// How often the writer takes the queued records.
const POLL: Duration = Duration::from_millis(50);

/// The most records a Parquet file holds (the writer keeps a file's records
/// in memory until it is finished: this bounds that memory, ~300 B each).
const MAX_PARQUET_ROWS: usize = 65_536;

/// The file name prefix of finished log files.
pub const PREFIX: &str = "decisions-";

pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl DecisionLog {
    /// Create the directory, recover stale `.tmp` files and start the writer.
    pub fn start(cfg: LogConfig, enc: Option<Encoder>) -> Result<DecisionLog, String> {
        std::fs::create_dir_all(&cfg.dir).map_err(|e| {
            format!(
                "{}: cannot create the log directory: {e}",
                cfg.dir.display()
            )
        })?;
        recover(&cfg.dir)?;
        let run_unix_ms = unix_ms();
        let (tx, rx) = std::sync::mpsc::sync_channel(cfg.queue.max(1));
        let written = Arc::new(prometheus_client::metrics::counter::Counter::default());
        let w = Writer {
            cfg,
            enc,
            run: run_unix_ms,
            seq: 0,
            buf: Vec::new(),
            jsonl: None,
            opened: None,
            bytes_per_row: 64.0,
            written: written.clone(),
        };
        let thread = std::thread::Builder::new()
            .name("qsim-decision-log".into())
            .spawn(move || w.run(rx))
            .map_err(|e| format!("cannot start the log writer: {e}"))?;
        Ok(DecisionLog {
            tx,
            thread: Mutex::new(Some(thread)),
            dropped: Default::default(),
            written,
            run_unix_ms,
        })
    }

    /// Hand a record to the writer; never blocks (dropped and counted when
    /// the writer is behind).
    pub fn push(&self, r: Box<Record>) {
        match self.tx.try_send(Msg::Rec(r)) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                self.dropped.inc();
            }
        }
    }

    /// Finish the current file and stop the writer (at shutdown).
    pub fn close(&self) {
        let _ = self.tx.send(Msg::Close);
        if let Some(t) = lock(&self.thread).take() {
            let _ = t.join();
        }
    }
}

struct Writer {
    cfg: LogConfig,
    enc: Option<Encoder>,
    run: u64,
    seq: u64,
    /// Parquet: the records of the current file.
    buf: Vec<Record>,
    /// JSON Lines: the open `.tmp` file, its final name and bytes written.
    jsonl: Option<(std::io::BufWriter<std::fs::File>, PathBuf, PathBuf, u64)>,
    /// When the current file got its first record.
    opened: Option<Instant>,
    bytes_per_row: f64,
    written: Arc<prometheus_client::metrics::counter::Counter>,
}

impl Writer {
    /// Polls the channel every [`POLL`] instead of blocking on it: a
    /// receiver parked in `recv` makes every `try_send` on the request path
    /// wake it (a futex syscall and a context switch per request).
    fn run(mut self, rx: Receiver<Msg>) {
        loop {
            std::thread::sleep(POLL);
            loop {
                match rx.try_recv() {
                    Ok(Msg::Rec(r)) => self.add(*r),
                    Ok(Msg::Close) | Err(TryRecvError::Disconnected) => {
                        self.finish();
                        return;
                    }
                    Err(TryRecvError::Empty) => break,
                }
            }
            if let Some((w, ..)) = self.jsonl.as_mut() {
                let _ = w.flush();
            }
            if self
                .opened
                .is_some_and(|t| t.elapsed() >= self.cfg.max_file_age)
            {
                self.finish();
            }
        }
    }

    fn name(&mut self, ext: &str) -> (PathBuf, PathBuf) {
        self.seq += 1;
        let f = format!("{PREFIX}{:013}-{:06}.{ext}", self.run, self.seq);
        let fin = self.cfg.dir.join(&f);
        let tmp = self.cfg.dir.join(format!("{f}.tmp"));
        (tmp, fin)
    }

    fn add(&mut self, r: Record) {
        self.opened.get_or_insert_with(Instant::now);
        if self.enc.is_some() {
            self.buf.push(r);
            if self.buf.len() as f64 * self.bytes_per_row >= self.cfg.max_file_bytes as f64
                || self.buf.len() >= MAX_PARQUET_ROWS
            {
                self.finish();
            }
            return;
        }
        if self.jsonl.is_none() {
            let (tmp, fin) = self.name("jsonl");
            match std::fs::File::create(&tmp) {
                Ok(f) => self.jsonl = Some((std::io::BufWriter::new(f), tmp, fin, 0)),
                Err(e) => {
                    tracing::warn!(error = %e, file = %tmp.display(), "decision log: cannot create");
                    return;
                }
            }
        }
        let Some((w, _, _, n)) = self.jsonl.as_mut() else {
            return;
        };
        let mut line = serde_json::to_vec(&r).unwrap_or_default();
        line.push(b'\n');
        if w.write_all(&line).is_ok() {
            *n += line.len() as u64;
            self.written.inc();
        }
        if *n >= self.cfg.max_file_bytes {
            self.finish();
        }
    }

    /// Finish the current file (rename it into place) and apply the cap.
    fn finish(&mut self) {
        self.opened = None;
        if let Some((mut w, tmp, fin, _)) = self.jsonl.take() {
            let ok = w.flush().is_ok() && w.get_ref().sync_all().is_ok();
            drop(w);
            if !ok || std::fs::rename(&tmp, &fin).is_err() {
                tracing::warn!(file = %tmp.display(), "decision log: cannot finish the file");
            }
        }
        if !self.buf.is_empty() {
            let rows = std::mem::take(&mut self.buf);
            let enc = self.enc.clone().expect("buffered only with an encoder");
            let (tmp, fin) = self.name("parquet");
            let res = enc(&rows).and_then(|bytes| {
                let mut f = std::fs::File::create(&tmp).map_err(|e| e.to_string())?;
                f.write_all(&bytes).map_err(|e| e.to_string())?;
                f.sync_all().map_err(|e| e.to_string())?;
                std::fs::rename(&tmp, &fin).map_err(|e| e.to_string())?;
                Ok(bytes.len())
            });
            match res {
                Ok(n) => {
                    self.written.inc_by(rows.len() as u64);
                    // the next file's rows from this one's size (at least 8 B)
                    self.bytes_per_row = (n as f64 / rows.len() as f64).max(8.0);
                }
                Err(e) => {
                    let _ = std::fs::remove_file(&tmp);
                    tracing::warn!(error = %e, file = %fin.display(), "decision log: cannot write");
                }
            }
        }
        cap(&self.cfg.dir, self.cfg.max_total_bytes);
    }
}

/// The finished log files of a directory, oldest first (by name).
pub fn files(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                n.starts_with(PREFIX) && (n.ends_with(".parquet") || n.ends_with(".jsonl"))
            })
        })
        .collect();
    v.sort();
    Ok(v)
}

/// Delete the oldest finished files while their total exceeds `max`.
fn cap(dir: &Path, max: u64) {
    let Ok(fs) = files(dir) else { return };
    let sizes: Vec<u64> = fs
        .iter()
        .map(|p| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0))
        .collect();
    let mut total: u64 = sizes.iter().sum();
    for (p, s) in fs.iter().zip(sizes) {
        if total <= max {
            break;
        }
        if std::fs::remove_file(p).is_ok() {
            total -= s;
        }
    }
}

/// Stale `.tmp` files of a killed run: JSON Lines finished up to the last
/// complete line, Parquet deleted (it was being written when killed).
/// The length of a file up to and including its last newline (0: none),
/// read backwards in 64 KiB blocks.
fn last_line_end(p: &Path) -> std::io::Result<u64> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = std::fs::File::open(p)?;
    let mut end = f.metadata()?.len();
    let mut buf = vec![0u8; 64 * 1024];
    while end > 0 {
        let n = end.min(buf.len() as u64);
        let start = end - n;
        f.seek(SeekFrom::Start(start))?;
        f.read_exact(&mut buf[..n as usize])?;
        if let Some(i) = buf[..n as usize].iter().rposition(|&b| b == b'\n') {
            return Ok(start + i as u64 + 1);
        }
        end = start;
    }
    Ok(0)
}

fn recover(dir: &Path) -> Result<(), String> {
    let rd = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for e in rd.flatten() {
        let p = e.path();
        let Some(n) = p.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        if !n.starts_with(PREFIX) {
            continue;
        }
        if let Some(fin) = n.strip_suffix(".tmp") {
            if !e.file_type().is_ok_and(|t| t.is_file()) {
                // not a log this proxy wrote (a directory, a device, a link)
                continue;
            }
            if fin.ends_with(".jsonl") {
                // cut after the last whole line, found from the end (the
                // file is never read whole)
                let keep = last_line_end(&p).unwrap_or(0);
                if keep == 0 {
                    let _ = std::fs::remove_file(&p);
                } else {
                    let _ = std::fs::OpenOptions::new()
                        .write(true)
                        .open(&p)
                        .and_then(|f| f.set_len(keep))
                        .and_then(|_| std::fs::rename(&p, dir.join(fin)));
                }
            } else {
                let _ = std::fs::remove_file(&p);
            }
        }
    }
    Ok(())
}

/// A request's record while the request is decided: filled as the request
/// goes, moved into the admitted request's `Settle` (`body.rs`) (which
/// logs it when settled), or logged here when the request ends earlier (an
/// invalid request, a 429, the client leaving before a decision).
pub struct Pending {
    pub rec: Option<Box<Record>>,
    log: Option<Arc<DecisionLog>>,
}

impl Pending {
    /// A request's record (`log`: the decision log, if on), arriving now.
    pub fn new(log: Option<&Arc<DecisionLog>>, clock: &Clock, id: u64) -> Pending {
        let rec = log.map(|l| {
            Box::new(Record {
                id,
                run_unix_ms: l.run_unix_ms,
                time_scale: clock.scale(),
                arrival_ns: clock.now(),
                arrival_unix_ms: unix_ms(),
                ..Default::default()
            })
        });
        Pending {
            rec,
            log: log.cloned(),
        }
    }
    /// Fill the record (when the log is on).
    #[inline]
    pub fn set(&mut self, f: impl FnOnce(&mut Record)) {
        if let Some(r) = self.rec.as_mut() {
            f(r)
        }
    }
    /// The answer the client got (when the record was not handed on).
    pub fn answered(&mut self, status: u16) {
        self.set(|r| {
            r.status = status;
            if r.decision.is_empty() {
                r.decision = "invalid".into();
            }
        });
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if let (Some(mut r), Some(l)) = (self.rec.take(), self.log.as_ref()) {
            if r.decision.is_empty() {
                r.decision = "client_gone".into();
            }
            l.push(r);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(id: u64) -> Box<Record> {
        Box::new(Record {
            id,
            consumer: "A".into(),
            decision: "admitted".into(),
            status: 200,
            ..Default::default()
        })
    }

    #[test]
    fn jsonl_rotates_caps_and_recovers() {
        let d = tempfile::tempdir().unwrap();
        let cfg = LogConfig {
            dir: d.path().to_path_buf(),
            max_file_bytes: 2_000,
            max_total_bytes: 10_000,
            max_file_age: Duration::from_secs(60),
            queue: 100_000,
        };
        let log = DecisionLog::start(cfg.clone(), None).unwrap();
        for i in 0..500 {
            log.push(rec(i));
        }
        log.close();
        let fs = files(d.path()).unwrap();
        assert!(fs.len() > 2, "{fs:?}");
        let total: u64 = fs.iter().map(|p| std::fs::metadata(p).unwrap().len()).sum();
        assert!(total <= 10_000, "{total}");
        // the newest records are kept, every line parses
        let mut last = 0;
        for f in &fs {
            for l in std::fs::read_to_string(f).unwrap().lines() {
                let r: Record = serde_json::from_str(l).unwrap();
                last = r.id;
            }
        }
        assert_eq!(last, 499);
        // a killed run's half line is cut, the rest finished
        let stale = d
            .path()
            .join(format!("{PREFIX}0000000000001-000001.jsonl.tmp"));
        let line = serde_json::to_string(&*rec(7)).unwrap();
        std::fs::write(&stale, format!("{line}\n{{\"id\": 8, \"cons")).unwrap();
        let log = DecisionLog::start(cfg, None).unwrap();
        log.close();
        let fin = d.path().join(format!("{PREFIX}0000000000001-000001.jsonl"));
        assert_eq!(std::fs::read_to_string(fin).unwrap(), format!("{line}\n"));
        assert!(!stale.exists());
    }

    #[test]
    fn a_full_queue_drops_and_counts() {
        let d = tempfile::tempdir().unwrap();
        let cfg = LogConfig {
            dir: d.path().to_path_buf(),
            max_file_bytes: 1 << 20,
            max_total_bytes: 1 << 30,
            max_file_age: Duration::from_secs(60),
            queue: 1,
        };
        let log = DecisionLog::start(cfg, None).unwrap();
        for i in 0..10_000 {
            log.push(rec(i));
        }
        log.close();
        let dropped = log.dropped.get();
        assert!(dropped > 0);
        assert_eq!(dropped + log.written.get(), 10_000);
    }
}
