//! The Pacer's core: the third driver of the caller's state machine.
//!
//! One [`PacerCore`] is one client (a pool of `workers`, or the managed
//! executor): it owns what the simulation's driver owns for one experiment
//! (`experiment/hosted.rs`: every row's [`Call`], the pool's
//! [`PoolShared`] — retry quota and adaptive throttle — or the
//! [`Managed`] executor, and the client's random stream, the same
//! `(seed, 1 + experiment index, CLIENT)` stream), behind one mutex held
//! only for a decision. The Python driver (`python/qsim/_pacer.py`) asks
//! it before every send (`send`: go, or a local rejection by the
//! throttle) and after every reply (`reply`: the next send time, or done),
//! and only sleeps, sends and reports. Draws come in the order the driver
//! asks, as in the simulation's event loop.
//!
//! Time is model time in integer nanoseconds: the one clock of the
//! real-time drivers (`qsim_live::Clock`: real elapsed × `time_scale`),
//! or the caller's own `now` (an injected virtual clock, for tests). A
//! retry hint is read by the one hint reader (`qsim_live::retry_hint`:
//! `retry-after-ms`, `Retry-After`, body `retry_after`) and, being real
//! time, converted to model time (× `time_scale`), as `qsim replay` does.
//!
//! Every attempt is recorded as `qsim replay` records it
//! (`qsim_live::replay::{Attempt, RowResult}`), so the attempt log has
//! replay's columns.

use crate::errors;
use crate::policy::Policy;
use pyo3::prelude::*;
use pyo3::types::PyList;
use qsim_core::client::managed::AimdParams;
use qsim_core::client::{
    Call, CallerPolicy, Managed, ManagedNext, Next, Outcome, PoolShared, Reply, Send,
};
use qsim_core::time::Nanos;
use qsim_live::replay::{Attempt, RowResult};
use qsim_live::Clock;
use qsim_results::{NamedColumn, Values};
use qsim_sim::engine::rng::{component, stream, unit, Rng};
use qsim_sim::experiment::config::ClientKind;
use std::sync::Mutex;

/// The status an exchange that failed without an HTTP error status (an
/// exception: timeout, connection error, anything unknown) reaches the
/// retry layers with: a 5xx, retried where 5xx are (`qsim replay`'s).
pub const EXCHANGE_FAILED: u16 = qsim_live::replay::EXCHANGE_FAILED;

enum Mode {
    Pool {
        caller: CallerPolicy,
        shared: PoolShared,
    },
    Managed {
        exec: Managed<u64>,
        /// rows of the current map, and the next one to start
        rows: u64,
        next: u64,
    },
}

/// A row in progress: its call, the log index of its attempt in flight.
struct Active {
    row: u64,
    call: Call,
    rec: usize,
    /// what the last reply said, for the row's result
    output_tokens: Option<u64>,
    finish_reason: Option<String>,
    error: Option<String>,
}

struct Core {
    mode: Mode,
    rng: Rng,
    /// rows in progress, by slot (reused)
    slots: Vec<Option<Active>>,
    free: Vec<usize>,
    next_row: u64,
    log: bool,
    attempts: Vec<Attempt>,
    rows: Vec<RowResult>,
    sdk_retries: u64,
    /// first and last model time seen (elapsed of the log), and when the
    /// last row finished
    first: Option<Nanos>,
    last: Nanos,
    last_done: Nanos,
    closed: bool,
}

#[pyclass(frozen, module = "qsim._qsim")]
pub struct PacerCore {
    core: Mutex<Core>,
    clock: Clock,
    /// the policy as validated (for repr / to_dict)
    policy: Policy,
    seed: u64,
}

fn lock(m: &Mutex<Core>) -> std::sync::MutexGuard<'_, Core> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The reply as the caller sees it, from what the Python side reported.
struct Reported {
    ok: bool,
    status: Option<u16>,
    hint: Option<Nanos>,
}

impl PacerCore {
    fn now(&self, now: Option<Nanos>) -> Nanos {
        now.unwrap_or_else(|| self.clock.now())
    }

    fn reply_of(&self, r: &Reported) -> Reply {
        if r.ok {
            Reply::Ok
        } else {
            let status = match r.status {
                Some(s) if s >= 400 => s,
                _ => EXCHANGE_FAILED,
            };
            Reply::Error {
                status,
                hint: r.hint.map(|h| self.clock.model(h)),
            }
        }
    }
}

impl Core {
    fn touch(&mut self, now: Nanos) {
        if self.first.is_none() {
            self.first = Some(now);
        }
        self.last = self.last.max(now);
    }

    fn slot(&mut self, a: Active) -> usize {
        match self.free.pop() {
            Some(s) => {
                self.slots[s] = Some(a);
                s
            }
            None => {
                self.slots.push(Some(a));
                self.slots.len() - 1
            }
        }
    }

    fn take(&mut self, slot: usize) -> PyResult<Active> {
        let a = self
            .slots
            .get_mut(slot)
            .and_then(Option::take)
            .ok_or_else(|| errors::qsim(format!("no row in progress at slot {slot}")))?;
        self.free.push(slot);
        Ok(a)
    }

    fn active(&mut self, slot: usize) -> PyResult<&mut Active> {
        self.slots
            .get_mut(slot)
            .and_then(Option::as_mut)
            .ok_or_else(|| errors::qsim(format!("no row in progress at slot {slot}")))
    }

    /// Log an attempt leaving now; its log index.
    fn log_send(&mut self, row: u64, call: &Call, now: Nanos) -> usize {
        if !self.log {
            return usize::MAX;
        }
        self.attempts.push(Attempt {
            row,
            attempt: call.attempt(),
            sdk_retry: call.sdk_retries(),
            start: now,
            ..Default::default()
        });
        self.attempts.len() - 1
    }

    fn finish(&mut self, a: &Active, o: &Outcome) {
        self.last_done = self.last_done.max(self.last);
        if !self.log {
            return;
        }
        self.rows.push(RowResult {
            row: a.row,
            status: Some(o.status),
            attempts: o.attempts,
            own_wait: o.own_wait,
            latency: o.latency,
            quota_denied: o.quota_denied,
            output_tokens: if o.status == 200 {
                a.output_tokens.unwrap_or(0)
            } else {
                0
            },
            finish_reason: a.finish_reason.clone(),
            error: if o.status == 200 {
                None
            } else {
                a.error.clone()
            },
            sent: true,
        });
    }
}

/// A finished row as Python sees it: (status, attempts, own_wait_ns,
/// latency_ns, quota_denied).
type OutcomeTuple = (u16, u32, u64, u64, bool);

fn outcome_tuple(o: &Outcome) -> OutcomeTuple {
    (o.status, o.attempts, o.own_wait, o.latency, o.quota_denied)
}

/// What to do next: `(False, at_ns, sdk_layer)` send again at `at`, or
/// `(True, outcome)`.
#[derive(IntoPyObject)]
pub enum NextPy {
    SendAt(bool, u64, bool),
    Done(bool, OutcomeTuple),
}

#[pymethods]
impl PacerCore {
    /// `policy_json`: a policy dict as JSON, or None with `file` (an
    /// experiment file, `builtin:` for an embedded one), `experiment` (its
    /// name) and `sets` (`--set` overrides).
    #[new]
    #[pyo3(signature = (policy_json=None, file=None, experiment=None, sets=vec![], seed=1, time_scale=1.0, log=true))]
    fn new(
        policy_json: Option<&str>,
        file: Option<&str>,
        experiment: Option<&str>,
        sets: Vec<String>,
        seed: u64,
        time_scale: f64,
        log: bool,
    ) -> PyResult<Self> {
        if !(time_scale.is_finite() && time_scale > 0.0) {
            return Err(errors::config(qsim_sim::config::ConfigError::new(
                "time_scale",
                "",
                format!("must be > 0, got {time_scale}"),
            )));
        }
        let policy = match (policy_json, file) {
            (Some(j), None) => crate::policy::from_dict(j),
            (None, Some(f)) => crate::policy::from_file(f, experiment, &sets),
            _ => {
                return Err(errors::qsim(
                    "give a policy (dict or keyword arguments) or an experiment file, not both",
                ))
            }
        }
        .map_err(errors::config)?;
        let mode = match &policy.client {
            ClientKind::Pool { caller, shared, .. } => Mode::Pool {
                caller: caller.clone(),
                shared: shared.clone(),
            },
            ClientKind::Managed(p) => Mode::Managed {
                exec: Managed::new(p.clone()),
                rows: 0,
                next: 0,
            },
        };
        Ok(PacerCore {
            core: Mutex::new(Core {
                mode,
                rng: stream(seed, policy.scope, component::CLIENT),
                slots: Vec::new(),
                free: Vec::new(),
                next_row: 0,
                log,
                attempts: Vec::new(),
                rows: Vec::new(),
                sdk_retries: 0,
                first: None,
                last: 0,
                last_done: 0,
                closed: false,
            }),
            clock: Clock::new(0, time_scale),
            policy,
            seed,
        })
    }

    /// "pool" or "managed".
    #[getter]
    fn client(&self) -> &'static str {
        match self.policy.client {
            ClientKind::Pool { .. } => "pool",
            ClientKind::Managed(_) => "managed",
        }
    }

    /// At most this many calls in flight (the pool's workers; the managed
    /// executor's window ceiling).
    #[getter]
    fn workers(&self) -> u32 {
        match &self.policy.client {
            ClientKind::Pool { workers, .. } => *workers,
            ClientKind::Managed(p) => p.max.floor().max(1.0) as u32,
        }
    }

    #[getter]
    fn name(&self) -> &str {
        &self.policy.name
    }

    /// The experiment's rows and max_tokens (what the simulation sized;
    /// from a policy dict: 1 and 1).
    #[getter]
    fn rows_planned(&self) -> u64 {
        self.policy.rows
    }

    #[getter]
    fn max_tokens(&self) -> u64 {
        self.policy.max_tokens
    }

    #[getter]
    fn seed(&self) -> u64 {
        self.seed
    }

    #[getter]
    fn time_scale(&self) -> f64 {
        self.clock.scale()
    }

    /// Whether the SDK's hidden retry layer is on (the Pacer makes those
    /// retries itself; the SDK's own must be off).
    #[getter]
    fn sdk_retries(&self) -> bool {
        matches!(&self.policy.client, ClientKind::Pool { caller, .. } if caller.sdk.is_some())
    }

    /// The validated policy, in qsim's terms (Debug form of the core's
    /// types).
    fn describe(&self) -> String {
        match &self.policy.client {
            ClientKind::Pool {
                workers,
                caller,
                shared,
            } => format!(
                "pool of {workers} workers; retry {:?}; sdk {:?}; quota {:?}; throttle {}",
                caller.retry,
                caller.sdk,
                shared.quota,
                if shared.throttle.is_some() {
                    "on"
                } else {
                    "off"
                }
            ),
            ClientKind::Managed(p) => format!("managed executor {p:?}"),
        }
    }

    /// The managed executor's parameters, if managed.
    fn managed_params(&self) -> Option<(f64, f64, f64, u32)> {
        match &self.policy.client {
            ClientKind::Managed(AimdParams {
                initial,
                min,
                max,
                max_attempts,
                ..
            }) => Some((*initial, *min, *max, *max_attempts)),
            _ => None,
        }
    }

    /// Model time now (ns).
    fn now_ns(&self) -> u64 {
        self.clock.now()
    }

    /// Real seconds until model time `at` (≤ 0: due).
    fn wait_s(&self, at: u64) -> f64 {
        let now = self.clock.now();
        if at <= now {
            return 0.0;
        }
        self.clock.real(at - now).as_secs_f64()
    }

    fn close(&self) {
        lock(&self.core).closed = true;
    }

    #[getter]
    fn closed(&self) -> bool {
        lock(&self.core).closed
    }

    /// The retry quota's level (None: no quota).
    fn quota_level(&self) -> Option<u32> {
        match &lock(&self.core).mode {
            Mode::Pool { shared, .. } => shared.quota.as_ref().map(|q| q.level()),
            _ => None,
        }
    }

    /// The managed executor's window (None: a pool).
    fn window(&self) -> Option<f64> {
        match &lock(&self.core).mode {
            Mode::Managed { exec, .. } => Some(exec.window()),
            _ => None,
        }
    }

    // ---- the pool: one row per call ----

    /// A row starts (its worker slot already held): its slot id.
    #[pyo3(signature = (now=None))]
    fn begin(&self, now: Option<u64>) -> PyResult<usize> {
        let now = self.now(now);
        let mut c = lock(&self.core);
        if c.closed {
            return Err(errors::ClosedError::new_err("the Pacer is closed"));
        }
        if !matches!(c.mode, Mode::Pool { .. }) {
            return Err(errors::qsim(
                "a managed-executor Pacer paces rows through pacer.map(fn, rows), not single calls",
            ));
        }
        c.touch(now);
        let row = c.next_row;
        c.next_row += 1;
        let a = Active {
            row,
            call: Call::start(now),
            rec: usize::MAX,
            output_tokens: None,
            finish_reason: None,
            error: None,
        };
        Ok(c.slot(a))
    }

    /// The row's attempt is about to leave: True to send it, False if the
    /// adaptive throttle rejected it locally (then call `reply` with
    /// `local_reject=True`).
    #[pyo3(signature = (slot, now=None))]
    fn send(&self, slot: usize, now: Option<u64>) -> PyResult<bool> {
        let now = self.now(now);
        let mut guard = lock(&self.core);
        let c = &mut *guard;
        if c.closed {
            return Err(errors::ClosedError::new_err("the Pacer is closed"));
        }
        c.touch(now);
        let Mode::Pool { shared, .. } = &mut c.mode else {
            return Err(errors::qsim("not a pool"));
        };
        let a = c.slots[slot]
            .as_mut()
            .ok_or_else(|| errors::qsim("no row in progress"))?;
        let rng = &mut c.rng;
        let go = a.call.on_send(now, shared, &mut || unit(rng)) == Send::Go;
        let (row, call) = (a.row, a.call);
        let rec = c.log_send(row, &call, now);
        c.active(slot)?.rec = rec;
        if !go && rec != usize::MAX {
            let r = &mut c.attempts[rec];
            r.status = Some(429);
            r.end = now;
            r.error_kind = Some("local_reject");
            r.error = Some("rejected locally by the adaptive throttle".into());
        }
        Ok(go)
    }

    /// The reply to the row's attempt (or its local rejection) at `now`:
    /// what to do next. `ok`: a success; else `status` (None: no HTTP
    /// status, an exception) and the hint's headers (name, value) and body.
    #[pyo3(signature = (slot, ok, status=None, headers=vec![], body=None, error_kind=None, error=None, input_tokens=None, output_tokens=None, finish_reason=None, local_reject=false, now=None))]
    #[allow(clippy::too_many_arguments)]
    fn reply(
        &self,
        slot: usize,
        ok: bool,
        status: Option<u16>,
        headers: Vec<(String, String)>,
        body: Option<&str>,
        error_kind: Option<String>,
        error: Option<String>,
        input_tokens: Option<u64>,
        output_tokens: Option<u64>,
        finish_reason: Option<String>,
        local_reject: bool,
        now: Option<u64>,
    ) -> PyResult<NextPy> {
        let now = self.now(now);
        let hint = if ok || local_reject {
            None
        } else {
            hint_of(&headers, body)
        };
        let reply = if local_reject {
            Reply::LocalReject
        } else {
            self.reply_of(&Reported { ok, status, hint })
        };
        let mut guard = lock(&self.core);
        let c = &mut *guard;
        c.touch(now);
        let a = c.slots[slot]
            .as_mut()
            .ok_or_else(|| errors::qsim("no row in progress"))?;
        if !local_reject {
            a.output_tokens = output_tokens;
            a.finish_reason = finish_reason.clone();
            a.error = error.clone();
            if a.rec != usize::MAX {
                let r = &mut c.attempts[a.rec];
                r.status = if ok {
                    Some(status.unwrap_or(200))
                } else {
                    status
                };
                r.hint = hint;
                r.end = now;
                r.input_tokens = input_tokens;
                r.output_tokens = output_tokens;
                r.finish_reason = finish_reason;
                r.error_kind = error_kind.as_deref().map(error_kind_static);
                r.error = error;
            }
        } else {
            a.error = Some("rejected locally by the adaptive throttle".into());
        }
        let Mode::Pool { caller, shared } = &mut c.mode else {
            return Err(errors::qsim("not a pool"));
        };
        let rng = &mut c.rng;
        let next = a
            .call
            .on_reply(now, reply, caller, shared, &mut || unit(rng));
        match next {
            Next::SendAt { at, layer } => {
                if layer == qsim_core::client::Layer::Sdk {
                    c.sdk_retries += 1;
                }
                Ok(NextPy::SendAt(
                    false,
                    at,
                    layer == qsim_core::client::Layer::Sdk,
                ))
            }
            Next::Done(o) => {
                let a = c.take(slot)?;
                c.finish(&a, &o);
                Ok(NextPy::Done(true, outcome_tuple(&o)))
            }
        }
    }

    /// The attempt in flight at `slot` saw its first streamed token now
    /// (its TTFT, as `qsim replay --stream` records it; the first mark counts).
    #[pyo3(signature = (slot, now=None))]
    fn first_token(&self, slot: usize, now: Option<u64>) {
        let now = self.now(now);
        let mut guard = lock(&self.core);
        let c = &mut *guard;
        if let Some(Some(a)) = c.slots.get(slot) {
            if let Some(r) = c.attempts.get_mut(a.rec) {
                if r.ttft.is_none() {
                    r.ttft = Some(now);
                }
            }
        }
    }

    /// A row given up by the driver (KeyboardInterrupt, close): freed, logged
    /// as not finished.
    fn abandon(&self, slot: usize) {
        let mut c = lock(&self.core);
        if let Ok(a) = c.take(slot) {
            if c.log {
                if a.rec != usize::MAX && c.attempts[a.rec].end == 0 {
                    let now = self.clock.now();
                    let r = &mut c.attempts[a.rec];
                    if r.status.is_none() && r.error_kind.is_none() {
                        r.end = now;
                        r.error_kind = Some("deadline");
                        r.error = Some("cancelled: the call was interrupted".into());
                    }
                }
                c.rows.push(RowResult {
                    row: a.row,
                    attempts: a.call.attempt(),
                    error: Some("not finished: the call was interrupted".into()),
                    sent: true,
                    ..Default::default()
                });
            }
        }
    }

    // ---- the managed executor: pacer.map ----

    /// A map over `rows` rows starts.
    fn m_start(&self, rows: u64) -> PyResult<()> {
        let mut c = lock(&self.core);
        match &mut c.mode {
            Mode::Managed { rows: r, next, .. } => {
                if *next < *r {
                    return Err(errors::qsim("a map is already running on this Pacer"));
                }
                *r = rows;
                *next = 0;
                Ok(())
            }
            _ => Err(errors::qsim("not a managed executor")),
        }
    }

    /// Rows to send now, as the window allows (re-queued rows that are
    /// eligible first, then new ones): [(slot, row index)].
    #[pyo3(signature = (now=None))]
    fn m_dispatch(&self, now: Option<u64>) -> PyResult<Vec<(usize, u64)>> {
        let now = self.now(now);
        let mut guard = lock(&self.core);
        let c = &mut *guard;
        if c.closed {
            return Err(errors::ClosedError::new_err("the Pacer is closed"));
        }
        c.touch(now);
        let mut out = Vec::new();
        loop {
            let Mode::Managed { exec, rows, next } = &mut c.mode else {
                return Err(errors::qsim("not a managed executor"));
            };
            if !exec.has_room() {
                break;
            }
            let (mut call, row) = match exec.take_eligible(now) {
                Some(x) => x,
                None if *next < *rows => {
                    *next += 1;
                    (Call::start(now), *next - 1)
                }
                None => break,
            };
            exec.on_send(now, &mut call);
            let rec = c.log_send(row, &call, now);
            let slot = c.slot(Active {
                row,
                call,
                rec,
                output_tokens: None,
                finish_reason: None,
                error: None,
            });
            out.push((slot, row));
        }
        Ok(out)
    }

    /// When the executor next has a re-queued row to send (only while the
    /// window has room; a full window waits for a reply).
    fn m_poll(&self) -> Option<u64> {
        match &lock(&self.core).mode {
            Mode::Managed { exec, .. } => exec.poll_timeout().filter(|_| exec.has_room()),
            _ => None,
        }
    }

    /// The reply to a managed row's attempt: `(True, outcome)` finished (a
    /// success, or an error row after `max_attempts`), or `(False, at, False)`
    /// re-queued until `at`.
    #[pyo3(signature = (slot, ok, status=None, headers=vec![], body=None, error_kind=None, error=None, input_tokens=None, output_tokens=None, finish_reason=None, now=None))]
    #[allow(clippy::too_many_arguments)]
    fn m_reply(
        &self,
        slot: usize,
        ok: bool,
        status: Option<u16>,
        headers: Vec<(String, String)>,
        body: Option<&str>,
        error_kind: Option<String>,
        error: Option<String>,
        input_tokens: Option<u64>,
        output_tokens: Option<u64>,
        finish_reason: Option<String>,
        now: Option<u64>,
    ) -> PyResult<NextPy> {
        let now = self.now(now);
        let hint = if ok { None } else { hint_of(&headers, body) };
        let reply = self.reply_of(&Reported { ok, status, hint });
        let mut guard = lock(&self.core);
        let c = &mut *guard;
        c.touch(now);
        let mut a = c.take(slot)?;
        a.output_tokens = output_tokens;
        a.finish_reason = finish_reason.clone();
        a.error = error.clone();
        if a.rec != usize::MAX {
            let r = &mut c.attempts[a.rec];
            r.status = if ok {
                Some(status.unwrap_or(200))
            } else {
                status
            };
            r.hint = hint;
            r.end = now;
            r.input_tokens = input_tokens;
            r.output_tokens = output_tokens;
            r.finish_reason = finish_reason;
            r.error_kind = error_kind.as_deref().map(error_kind_static);
            r.error = error;
        }
        let Mode::Managed { exec, .. } = &mut c.mode else {
            return Err(errors::qsim("not a managed executor"));
        };
        match reply {
            Reply::Ok => {
                let o = exec.on_success(now, &a.call);
                c.finish(&a, &o);
                Ok(NextPy::Done(true, outcome_tuple(&o)))
            }
            Reply::Error { status, hint } => {
                let rng = &mut c.rng;
                let row = a.row;
                match exec.on_failure(now, a.call, row, status, hint, &mut || unit(rng)) {
                    ManagedNext::Done(o) => {
                        c.finish(&a, &o);
                        Ok(NextPy::Done(true, outcome_tuple(&o)))
                    }
                    ManagedNext::EligibleAt(at) => Ok(NextPy::SendAt(false, at, false)),
                }
            }
            Reply::LocalReject => unreachable!("a managed executor has no throttle"),
        }
    }

    // ---- the log ----

    /// The attempt log as columns, in `qsim replay`'s attempts.csv order
    /// (experiment, row, attempt, sdk_retry, status, retry_hint_s, start_s,
    /// ttft_s, end_s, input_tokens, output_tokens, finish_reason,
    /// error_kind, error): [(name, dtype, values)].
    fn attempts<'py>(
        &self,
        py: Python<'py>,
    ) -> PyResult<Vec<(String, &'static str, Bound<'py, PyList>)>> {
        let c = lock(&self.core);
        let s = |ns: Nanos| ns as f64 / 1e9;
        let a = &c.attempts;
        let u = |f: &dyn Fn(&Attempt) -> Option<u64>| Values::U64(a.iter().map(f).collect());
        let fl = |f: &dyn Fn(&Attempt) -> Option<f64>| Values::F64(a.iter().map(f).collect());
        let st = |f: &dyn Fn(&Attempt) -> Option<String>| Values::Str(a.iter().map(f).collect());
        let cols = vec![
            NamedColumn::new("experiment", st(&|_| Some(self.policy.name.clone()))),
            NamedColumn::new("row", u(&|a| Some(a.row))),
            NamedColumn::new("attempt", u(&|a| Some(a.attempt as u64))),
            NamedColumn::new("sdk_retry", u(&|a| Some(a.sdk_retry as u64))),
            NamedColumn::new("status", u(&|a| a.status.map(u64::from))),
            NamedColumn::new("retry_hint_s", fl(&|a| a.hint.map(s))),
            NamedColumn::new("start_s", fl(&|a| Some(s(a.start)))),
            NamedColumn::new(
                "ttft_s",
                fl(&|a| a.ttft.map(|t| s(t.saturating_sub(a.start)))),
            ),
            NamedColumn::new("end_s", fl(&|a| Some(s(a.end)))),
            NamedColumn::new("input_tokens", u(&|a| a.input_tokens)),
            NamedColumn::new("output_tokens", u(&|a| a.output_tokens)),
            NamedColumn::new("finish_reason", st(&|a| a.finish_reason.clone())),
            NamedColumn::new("error_kind", st(&|a| a.error_kind.map(str::to_string))),
            NamedColumn::new("error", st(&|a| a.error.clone())),
        ];
        cols.iter().map(|c| crate::sim::column(py, c)).collect()
    }

    /// The rows' outcomes as columns in rows.csv's order (experiment, row,
    /// status, attempts, latency_s, own_wait_s, output_tokens,
    /// finish_reason, error), in the order the rows finished.
    fn rows<'py>(
        &self,
        py: Python<'py>,
    ) -> PyResult<Vec<(String, &'static str, Bound<'py, PyList>)>> {
        let c = lock(&self.core);
        let s = |ns: Nanos| ns as f64 / 1e9;
        let r = &c.rows;
        let cols = vec![
            NamedColumn::new(
                "experiment",
                Values::Str(r.iter().map(|_| Some(self.policy.name.clone())).collect()),
            ),
            NamedColumn::new("row", Values::U64(r.iter().map(|x| Some(x.row)).collect())),
            NamedColumn::new(
                "status",
                Values::U64(r.iter().map(|x| x.status.map(u64::from)).collect()),
            ),
            NamedColumn::new(
                "attempts",
                Values::U64(r.iter().map(|x| Some(x.attempts as u64)).collect()),
            ),
            NamedColumn::new(
                "latency_s",
                Values::F64(r.iter().map(|x| x.status.map(|_| s(x.latency))).collect()),
            ),
            NamedColumn::new(
                "own_wait_s",
                Values::F64(r.iter().map(|x| Some(s(x.own_wait))).collect()),
            ),
            NamedColumn::new(
                "output_tokens",
                Values::U64(r.iter().map(|x| Some(x.output_tokens)).collect()),
            ),
            NamedColumn::new(
                "finish_reason",
                Values::Str(r.iter().map(|x| x.finish_reason.clone()).collect()),
            ),
            NamedColumn::new(
                "error",
                Values::Str(r.iter().map(|x| x.error.clone()).collect()),
            ),
        ];
        cols.iter().map(|c| crate::sim::column(py, c)).collect()
    }

    /// The run's summary records (`seed,subject,metric,value`, as `qsim
    /// replay` writes summary.csv and `qsim run --format csv` prints them):
    /// what `qsim compare` takes as an observation. The conversion of the
    /// log into the simulation's result type is `qsim replay`'s
    /// (`observed`, src/commands/replay.rs), until issue 37 makes it one
    /// library function both call.
    #[pyo3(signature = (seed=1))]
    fn summary_csv(&self, seed: u64) -> String {
        use qsim_sim::experiment::hosted::HostedResult;
        let c = lock(&self.core);
        let mut r = HostedResult {
            name: self.policy.name.clone(),
            client: match self.policy.client {
                ClientKind::Pool { .. } => "pool",
                ClientKind::Managed(_) => "managed",
            },
            elapsed: c.last_done.saturating_sub(c.first.unwrap_or(0)),
            total: 0,
            ok: 0,
            rejected_429: 0,
            failed_other: 0,
            latency: qsim_sim::engine::DurationHist::new(),
            own_wait: 0,
            output_tokens: 0,
            input_tokens: 0,
            price: None,
            provisioned: None,
            truncated: 0,
            retried: 0,
            max_attempts: 0,
            max_wait: 0,
            http_requests: 0,
            http_429: 0,
            sdk_retries: c.attempts.iter().filter(|a| a.sdk_retry > 0).count() as u64,
            local_rejects: 0,
            quota_denied: 0,
            limit_hits: vec![],
            final_concurrency: match &c.mode {
                Mode::Managed { exec, .. } => Some(exec.window()),
                _ => None,
            },
        };
        for row in &c.rows {
            let Some(status) = row.status else { continue };
            r.total += 1;
            r.latency.record(row.latency);
            r.own_wait += row.own_wait;
            r.max_wait = r.max_wait.max(row.own_wait);
            r.max_attempts = r.max_attempts.max(row.attempts);
            r.retried += (row.attempts > 1) as u64;
            r.quota_denied += row.quota_denied as u64;
            match status {
                200 => {
                    r.ok += 1;
                    r.output_tokens += row.output_tokens;
                    r.truncated += (row.finish_reason.as_deref() == Some("length")) as u64;
                }
                429 => r.rejected_429 += 1,
                _ => r.failed_other += 1,
            }
        }
        for a in &c.attempts {
            if a.sent() {
                r.http_requests += 1;
                r.http_429 += (a.status == Some(429)) as u64;
            } else {
                r.local_rejects += 1;
            }
        }
        let mut out = qsim_sim::report::records::Records::default();
        qsim_sim::report::hosted::records(&mut out, seed, &[r]);
        let unfinished = c.rows.iter().filter(|r| r.status.is_none()).count();
        out.push(
            seed,
            &self.policy.name,
            "rows_unfinished",
            unfinished as f64,
        );
        qsim_sim::report::records::to_csv(&[qsim_sim::report::records::PointRecords {
            params: vec![],
            records: out,
        }])
    }

    /// Counts so far: (rows finished, attempts sent, local rejects, SDK
    /// retries, elapsed model ns from the first to the last event).
    fn counts(&self) -> (usize, usize, usize, u64, u64) {
        let c = lock(&self.core);
        let local = c
            .attempts
            .iter()
            .filter(|a| a.error_kind == Some("local_reject"))
            .count();
        (
            c.rows.len(),
            c.attempts.len() - local,
            local,
            c.sdk_retries,
            c.last - c.first.unwrap_or(c.last),
        )
    }
}

/// The one retry-hint reader over the reported headers and body.
fn hint_of(headers: &[(String, String)], body: Option<&str>) -> Option<Nanos> {
    let mut h = hyper::HeaderMap::new();
    for (k, v) in headers {
        if let (Ok(k), Ok(v)) = (
            hyper::header::HeaderName::from_bytes(k.as_bytes()),
            hyper::header::HeaderValue::from_str(v),
        ) {
            h.append(k, v);
        }
    }
    let parsed: Option<serde_json::Value> = body.and_then(|b| serde_json::from_str(b).ok());
    qsim_live::retry_hint(&h, parsed.as_ref())
}

/// The error kinds of the attempt log (`qsim replay`'s, plus `exception`:
/// a callable's exception that is no HTTP error, timeout or connection
/// failure).
fn error_kind_static(k: &str) -> &'static str {
    match k {
        "status" => "status",
        "connect" => "connect",
        "tls" => "tls",
        "timeout" => "timeout",
        "http" => "http",
        "body" => "body",
        "non_json" => "non_json",
        "truncated_stream" => "truncated_stream",
        "bad_answer" => "bad_answer",
        "local_reject" => "local_reject",
        "deadline" => "deadline",
        _ => "exception",
    }
}
