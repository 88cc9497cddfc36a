//! The simulator's models as endpoints: `qsim serve` (and the proxy's drift
//! shadow) drive these implementations of the core's sans-IO model
//! interface ([`Backend`], `qsim_core::model`) with the simulator's own
//! models, unchanged; the HTTP side and the real-time driver are in
//! `qsim_live::serve`:
//!
//! - a hosted profile ([`HostedBackend`]): [`HostedEndpoint::call`] decides
//!   each request (provider limits, all-or-nothing, reserve/refund as the
//!   profile's accounting says; the 429's limit, hint and body; the reject
//!   latency; TTFT and per-token time drawn from the endpoint's seeded
//!   stream) and [`HostedEndpoint::complete`] settles it at its `done_at`,
//!   exactly as the simulation driver does. Token `k` of `n` (1-based) is
//!   emitted at `arrival + ttft + (k − 1)·(done_at − arrival − ttft)/n` and
//!   the answer ends at `done_at` = `arrival + ttft + n·tpot`;
//! - a server profile ([`ServerBackend`]): one [`Cluster`] (one replica)
//!   stepped at its `poll_timeout`; tokens are streamed as iterations end
//!   ([`Cluster::progress`]) and answers end with the cluster's completions.
//!
//! Output length: the profile's optional `[serve] output_tokens`
//! distribution, drawn once per prompt (a stream keyed by the seed and the
//! prompt's hash: the same prompt gets the same length, as at temperature 0)
//! and capped at the request's `max_tokens`; without it, exactly
//! `max_tokens`. A request without `max_tokens` is given `[serve]
//! default_max_tokens` (default 4096), which a hosted profile also reserves.
//! Input tokens: counted by the HTTP side (`qsim_live::estimate::input_tokens`: token ids exactly, else an estimate).

use crate::config::{read_toml, ConfigError};
use crate::engine::rng::{component, stream, Rng};
use crate::hosted::{HintShape, HostedEndpoint, HostedProfile, Reply};
use crate::limiter::rates::Cost;
use crate::serve_spec::ServeSpec;
use crate::server::{Cluster, Request, RouterKind, ServerProfile};
use crate::time::Nanos;
use qsim_core::model::{Backend, Event, Failure, Finish, GenRequest, Invalid, RetryHint};
use rand::SeedableRng;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::sync::Arc;

/// The answer to a request: (max_tokens, output tokens, finish reason).
/// The natural length comes from a stream of its own per (seed,
/// prompt), so it does not depend on other requests.
pub fn answer(spec: &ServeSpec, seed: u64, req: &GenRequest) -> (u64, u64, Finish) {
    let max = req.max_tokens.unwrap_or(spec.default_max_tokens);
    let natural = match (&spec.output_tokens, req.output_tokens) {
        (_, Some(n)) => n,
        (None, None) => max,
        (Some(s), None) => {
            let mut r = Rng::seed_from_u64(seed ^ 0x5345_5256_455f_4f55);
            r.set_stream(req.prompt_hash);
            crate::hosted::natural_output(s, &mut r)
        }
    };
    if natural >= max {
        (max, max, Finish::Length)
    } else {
        (max, natural, Finish::Stop)
    }
}

/// A hosted-API profile as a backend.
pub struct HostedBackend {
    endpoint: HostedEndpoint,
    serve: ServeSpec,
    seed: u64,
    /// (time, sequence, id): each request's next event.
    due: BinaryHeap<Reverse<(Nanos, u64, u64)>>,
    seq: u64,
    pending: BTreeMap<u64, Pending>,
    /// Only the first token and the end are events (the rest of the tokens
    /// come in one event at the end): for a shadow that reads TTFT and E2E
    /// only (drift), not for streaming.
    coarse: bool,
}

enum Pending {
    Answer {
        cost: Cost,
        first: Nanos,
        span: Nanos,
        out: u64,
        sent: u64,
        done_at: Nanos,
        finish: Finish,
    },
    Refused(Failure),
}

impl HostedBackend {
    pub fn new(profile: Arc<HostedProfile>, serve: ServeSpec, seed: u64) -> Self {
        HostedBackend {
            endpoint: HostedEndpoint::new(profile, 0, stream(seed, 0, component::ENDPOINT)),
            serve,
            seed,
            due: BinaryHeap::new(),
            seq: 0,
            pending: BTreeMap::new(),
            coarse: false,
        }
    }

    /// Emit the first token and then the rest at the end, not each token
    /// at its own time: the same answers (first-token and end times, token
    /// counts, limits), one deadline per answer instead of one per token.
    pub fn coarse(mut self) -> Self {
        self.coarse = true;
        self
    }

    fn schedule(&mut self, t: Nanos, id: u64) {
        self.due.push(Reverse((t, self.seq, id)));
        self.seq += 1;
    }
}

impl Backend for HostedBackend {
    fn name(&self) -> &str {
        &self.endpoint.profile().name
    }

    fn submit(
        &mut self,
        now: Nanos,
        id: u64,
        req: &GenRequest,
        _out: &mut Vec<Event>,
    ) -> Result<(), Invalid> {
        let (max, natural, _) = answer(&self.serve, self.seed, req);
        let cost = Cost {
            input_tokens: req.input_tokens,
            max_tokens: max,
        };
        match self.endpoint.call(now, cost, natural) {
            Reply::Ok {
                done_at,
                output_tokens,
                ttft,
            } => {
                let first = now + ttft;
                let finish = if output_tokens >= max {
                    Finish::Length
                } else {
                    Finish::Stop
                };
                self.pending.insert(
                    id,
                    Pending::Answer {
                        cost,
                        first,
                        span: done_at - first,
                        out: output_tokens,
                        sent: 0,
                        done_at,
                        finish,
                    },
                );
                self.schedule(first, id);
            }
            Reply::RateLimited { at, limit, hint } => {
                let p = self.endpoint.profile();
                let hint = match (p.hint, hint) {
                    (_, None) | (HintShape::None, _) => RetryHint::None,
                    (HintShape::RetryAfterHeader, Some(h)) => RetryHint::RetryAfter(h),
                    (HintShape::RetryAfterMs, Some(h)) => RetryHint::RetryAfterMs(h),
                    (HintShape::BodyRetryAfter, Some(h)) => RetryHint::BodyRetryAfter(h),
                };
                let f = Failure::RateLimited {
                    limit: p.limits[limit].name.clone(),
                    hint,
                    body: p.reject_body.clone(),
                };
                self.pending.insert(id, Pending::Refused(f));
                self.schedule(at, id);
            }
            Reply::ServerError { at } => {
                self.pending
                    .insert(id, Pending::Refused(Failure::ServerError));
                self.schedule(at, id);
            }
        }
        Ok(())
    }

    fn poll_timeout(&self) -> Option<Nanos> {
        self.due.peek().map(|Reverse((t, _, _))| *t)
    }

    fn handle_timeout(&mut self, now: Nanos, out: &mut Vec<Event>) {
        while let Some(&Reverse((t, _, id))) = self.due.peek() {
            if t > now {
                break;
            }
            self.due.pop();
            let Some(p) = self.pending.get_mut(&id) else {
                continue;
            };
            match p {
                Pending::Refused(f) => {
                    out.push(Event::Failed {
                        id,
                        failure: f.clone(),
                    });
                    self.pending.remove(&id);
                }
                Pending::Answer {
                    cost,
                    first,
                    span,
                    out: n,
                    sent,
                    done_at,
                    finish,
                } => {
                    if *sent < *n {
                        // every token due by `now` (token k+1 at first + span·k/n)
                        let due = if *span == 0 || now >= *done_at {
                            *n
                        } else {
                            let k = ((now - *first) as u128 * *n as u128 / *span as u128) as u64;
                            (k + 1).min(*n)
                        };
                        out.push(Event::Tokens { id, n: due - *sent });
                        *sent = due;
                        let next = if due < *n && !self.coarse {
                            *first + ((*span as u128 * due as u128).div_ceil(*n as u128)) as Nanos
                        } else {
                            *done_at
                        };
                        let next = next.max(t);
                        self.schedule(next, id);
                    } else {
                        // the answer ends: settle at its own time, as the
                        // simulation does
                        let (cost, n, done_at, finish) = (*cost, *n, *done_at, *finish);
                        self.endpoint.complete(done_at, cost, n);
                        out.push(Event::Done {
                            id,
                            prompt_tokens: cost.input_tokens,
                            completion_tokens: n,
                            finish,
                        });
                        self.pending.remove(&id);
                    }
                }
            }
        }
    }
}

/// A server profile (one replica) as a backend.
pub struct ServerBackend {
    cluster: Cluster,
    serve: ServeSpec,
    seed: u64,
    /// id → (tokens sent, prompt tokens, finish reason), while in the server.
    inflight: BTreeMap<u64, (u64, u64, Finish)>,
}

impl ServerBackend {
    pub fn new(profile: Arc<ServerProfile>, serve: ServeSpec, seed: u64) -> Self {
        ServerBackend {
            cluster: Cluster::new(profile, 1, RouterKind::LeastOutstanding, seed),
            serve,
            seed,
            inflight: BTreeMap::new(),
        }
    }

    fn collect(&mut self, out: &mut Vec<Event>) {
        let inflight = &mut self.inflight;
        self.cluster.progress(|id, generated| {
            if let Some((sent, _, _)) = inflight.get_mut(&id) {
                let g = generated as u64;
                if g > *sent {
                    out.push(Event::Tokens { id, n: g - *sent });
                    *sent = g;
                }
            }
        });
        while let Some(c) = self.cluster.poll_completion() {
            let Some((sent, prompt, finish)) = self.inflight.remove(&c.id) else {
                continue;
            };
            let n = c.output_tokens as u64;
            if n > sent {
                out.push(Event::Tokens {
                    id: c.id,
                    n: n - sent,
                });
            }
            out.push(Event::Done {
                id: c.id,
                prompt_tokens: prompt,
                completion_tokens: n,
                finish,
            });
        }
    }
}

impl Backend for ServerBackend {
    fn name(&self) -> &str {
        &self.cluster.profile().name
    }

    fn submit(
        &mut self,
        now: Nanos,
        id: u64,
        req: &GenRequest,
        out: &mut Vec<Event>,
    ) -> Result<(), Invalid> {
        let (max, n, finish) = answer(&self.serve, self.seed, req);
        let p = self.cluster.profile();
        let too_long = || {
            Invalid {
            code: "context_length_exceeded",
            message: format!(
                "This model's maximum context length is {} tokens. However, you requested {} tokens ({} in the messages, {} in the completion).",
                p.max_model_len,
                req.input_tokens + max,
                req.input_tokens,
                max
            ),
        }
        };
        let (Ok(input_tokens), Ok(output_tokens)) =
            (u32::try_from(req.input_tokens), u32::try_from(n))
        else {
            return Err(too_long());
        };
        // vLLM checks the prompt plus max_tokens against the context length
        if req.input_tokens + max > p.max_model_len as u64 {
            return Err(too_long());
        }
        let r = Request {
            id,
            input_tokens,
            output_tokens,
        };
        if let Some(why) = self.cluster.reject_reason(&r) {
            return Err(Invalid {
                code: "invalid_value",
                message: format!("the model cannot run this request: {why}"),
            });
        }
        self.inflight.insert(id, (0, req.input_tokens, finish));
        self.cluster.submit(now, r);
        self.collect(out);
        Ok(())
    }

    fn poll_timeout(&self) -> Option<Nanos> {
        self.cluster.poll_timeout()
    }

    fn handle_timeout(&mut self, now: Nanos, out: &mut Vec<Event>) {
        self.cluster.handle_timeout(now);
        self.collect(out);
    }
}

/// A profile of either kind, validated, with its `[serve]` table.
pub enum Profile {
    Hosted(Arc<HostedProfile>),
    Server(Arc<ServerProfile>),
}

/// Read and validate a profile for `qsim serve` (errors name the field).
pub fn load_profile(path: &std::path::Path) -> Result<Profile, ConfigError> {
    let file = path.display().to_string();
    let v = read_toml(path)?;
    let kind = v.get("kind").and_then(|k| k.as_str()).unwrap_or_default();
    match kind {
        "hosted" => {
            let p = HostedProfile::from_value(&file, v)?;
            if let Some(b) = &p.reject_body {
                let ok = matches!(
                    serde_json::from_str::<serde_json::Value>(b),
                    Ok(serde_json::Value::Object(_))
                );
                if !ok {
                    return Err(ConfigError::new(
                        &file,
                        "rejection.body",
                        "must be a JSON object (it is the 429's body)",
                    ));
                }
            }
            Ok(Profile::Hosted(Arc::new(p)))
        }
        "server" => Ok(Profile::Server(Arc::new(ServerProfile::from_value(
            &file, v,
        )?))),
        other => Err(ConfigError::new(
            &file,
            "kind",
            format!("qsim serve needs a profile: kind = \"hosted\" or \"server\", got {other:?}"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::NEVER;

    fn req(max: Option<u64>, hash: u64) -> GenRequest {
        GenRequest {
            input_tokens: 100,
            max_tokens: max,
            prompt_hash: hash,
            output_tokens: None,
        }
    }

    #[test]
    fn answer_length_is_the_distribution_capped_or_max_tokens() {
        use crate::engine::RawDist;
        use crate::serve_spec::DEFAULT_MAX_TOKENS;
        let exact = ServeSpec::default();
        assert_eq!(
            answer(&exact, 1, &req(Some(77), 5)),
            (77, 77, Finish::Length)
        );
        assert_eq!(
            answer(&exact, 1, &req(None, 5)),
            (DEFAULT_MAX_TOKENS, DEFAULT_MAX_TOKENS, Finish::Length)
        );
        let d: RawDist =
            toml::from_str("dist = \"normal\"\nmean = 168\nsd = 30\nmin = 40").unwrap();
        let s = ServeSpec {
            output_tokens: Some(d.validate().unwrap()),
            default_max_tokens: 256,
        };
        let a = answer(&s, 1, &req(Some(256), 42));
        assert_eq!(
            a,
            answer(&s, 1, &req(Some(256), 42)),
            "same prompt, same answer"
        );
        let lens: Vec<u64> = (0..400)
            .map(|h| answer(&s, 1, &req(Some(256), h)).1)
            .collect();
        let mean = lens.iter().sum::<u64>() as f64 / 400.0;
        assert!((mean - 168.0).abs() < 6.0, "mean {mean}");
        assert!(lens.iter().all(|&l| (40..=256).contains(&l)));
        let capped = answer(&s, 1, &req(Some(100), 42));
        assert!(capped.1 <= 100);
    }

    /// The hosted backend settles each answer at its own `done_at` and
    /// streams every token before it, in time order.
    #[test]
    fn hosted_backend_streams_every_token_before_done() {
        let path = std::path::Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../models/databricks-claude-haiku-4-5.toml"
        ));
        let Profile::Hosted(p) = load_profile(path).unwrap() else {
            panic!("hosted")
        };
        let s = p.serve.clone();
        let mut b = HostedBackend::new(p, s, 7);
        let mut out = Vec::new();
        for id in 0..100 {
            b.submit(0, id, &req(Some(256), id), &mut out).unwrap();
        }
        assert!(out.is_empty());
        let mut t = 0;
        while let Some(d) = b.poll_timeout() {
            assert!(d >= t);
            t = d;
            b.handle_timeout(t, &mut out);
        }
        let ok: Vec<_> = out
            .iter()
            .filter(|e| matches!(e, Event::Done { .. }))
            .collect();
        let limited = out
            .iter()
            .filter(|e| matches!(e, Event::Failed { .. }))
            .count();
        // OTPM 20,000 reserves 256 each: 78 fit at once
        assert_eq!((ok.len(), limited), (78, 22));
        for id in 0..100u64 {
            let toks: u64 = out
                .iter()
                .map(|e| match e {
                    Event::Tokens { id: i, n } if *i == id => *n,
                    _ => 0,
                })
                .sum();
            let done = out.iter().find_map(|e| match e {
                Event::Done {
                    id: i,
                    completion_tokens,
                    ..
                } if *i == id => Some(*completion_tokens),
                _ => None,
            });
            match done {
                Some(n) => assert_eq!(toks, n),
                None => assert_eq!(toks, 0),
            }
        }
    }

    /// The coarse backend (drift's shadow) gives each answer the same
    /// first-token and end times, token count and outcome as the streaming
    /// one, with two token events per answer instead of one per token.
    #[test]
    fn coarse_hosted_backend_has_the_same_first_token_and_end_times() {
        let path = std::path::Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../models/databricks-claude-haiku-4-5.toml"
        ));
        let Profile::Hosted(p) = load_profile(path).unwrap() else {
            panic!("hosted")
        };
        // per id: (first token time, end time, tokens, done or failed), and
        // the number of token events
        type Timed = BTreeMap<u64, (Option<Nanos>, Nanos, u64, bool)>;
        let run = |mut b: HostedBackend| -> (Timed, usize) {
            let mut m: Timed = BTreeMap::new();
            let mut out = Vec::new();
            let mut token_events = 0;
            let mut next_id = 0u64;
            // arrivals every 50 ms for 30 s: over OTPM part of the time
            let mut t: Nanos = 0;
            loop {
                let arrival = (next_id < 600).then_some(next_id * 50_000_000);
                let t1 = match (arrival, b.poll_timeout()) {
                    (Some(a), Some(d)) => a.min(d),
                    (Some(a), None) => a,
                    (None, Some(d)) => d,
                    (None, None) => break,
                };
                assert!(t1 >= t);
                t = t1;
                b.handle_timeout(t, &mut out);
                if arrival == Some(t) {
                    b.submit(t, next_id, &req(Some(256), next_id), &mut out)
                        .unwrap();
                    next_id += 1;
                }
                for e in out.drain(..) {
                    match e {
                        Event::Tokens { id, n } => {
                            token_events += 1;
                            let r = m.entry(id).or_insert((None, 0, 0, false));
                            r.0.get_or_insert(t);
                            r.2 += n;
                        }
                        Event::Done { id, .. } => {
                            let r = m.entry(id).or_insert((None, 0, 0, false));
                            (r.1, r.3) = (t, true);
                        }
                        Event::Failed { id, .. } => {
                            m.entry(id).or_insert((None, 0, 0, false)).1 = t;
                        }
                    }
                }
            }
            (m, token_events)
        };
        let (fine, fine_events) = run(HostedBackend::new(p.clone(), p.serve.clone(), 5));
        let (coarse, coarse_events) =
            run(HostedBackend::new(p.clone(), p.serve.clone(), 5).coarse());
        assert_eq!(fine.len(), 600);
        assert_eq!(fine, coarse);
        let done = fine.values().filter(|r| r.3).count();
        assert!(done > 100 && done < 600, "{done} answered of 600");
        assert!(
            coarse_events <= 2 * done,
            "{coarse_events} events for {done}"
        );
        assert!(
            fine_events > 20 * coarse_events,
            "{fine_events} vs {coarse_events}"
        );
    }

    /// Per id: (tokens streamed, Done's completion tokens or Failed).
    fn outcomes(ev: &[Event]) -> BTreeMap<u64, (u64, Option<u64>)> {
        let mut m: BTreeMap<u64, (u64, Option<u64>)> = BTreeMap::new();
        for e in ev {
            match e {
                Event::Tokens { id, n } => m.entry(*id).or_default().0 += n,
                Event::Done {
                    id,
                    completion_tokens,
                    ..
                } => m.entry(*id).or_default().1 = Some(*completion_tokens),
                Event::Failed { id, .. } => {
                    m.entry(*id).or_default();
                }
            }
        }
        m
    }

    /// Drive a backend: submissions every `gap` ns (the driver first
    /// advances the model to `now`), wake-ups either exactly at each
    /// deadline or only every `late` ns; returns the outcomes.
    fn drive(b: &mut dyn Backend, n: u64, gap: Nanos, late: Option<Nanos>) -> Vec<Event> {
        let mut out = Vec::new();
        let mut t = 0;
        let mut next = 0;
        let mut id = 0;
        loop {
            let wake = match (b.poll_timeout(), late) {
                (Some(d), None) => d,
                (Some(d), Some(l)) => d.div_ceil(l) * l,
                (None, _) => NEVER,
            };
            let arrive = if id < n { next } else { NEVER };
            if wake == NEVER && arrive == NEVER {
                return out;
            }
            t = t.max(wake.min(arrive));
            b.handle_timeout(t, &mut out);
            if t == arrive {
                b.submit(t, id, &req(Some(200), id % 7), &mut out).unwrap();
                id += 1;
                next += gap;
            }
        }
    }

    /// The model does not depend on when the driver wakes up (a late
    /// wake-up only delays delivery): the same seed and submissions give the
    /// same answers, woken at every deadline or only every 50 ms.
    #[test]
    fn late_wakeups_change_no_answer() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/");
        for (file, gap) in [
            ("databricks-claude-haiku-4-5.toml", 5_000_000),
            ("llama-3.1-8b-h100-vllm.toml", 20_000_000),
        ] {
            let make = || -> Box<dyn Backend> {
                match load_profile(&std::path::Path::new(dir).join(file)).unwrap() {
                    Profile::Hosted(p) => {
                        let s = p.serve.clone();
                        Box::new(HostedBackend::new(p, s, 3))
                    }
                    Profile::Server(p) => {
                        let s = p.serve.clone();
                        Box::new(ServerBackend::new(p, s, 3))
                    }
                }
            };
            let exact = drive(&mut *make(), 300, gap, None);
            let late = drive(&mut *make(), 300, gap, Some(50_000_000));
            let (a, b) = (outcomes(&exact), outcomes(&late));
            assert_eq!(a.len(), 300, "{file}");
            assert_eq!(a, b, "{file}");
            assert!(a.values().all(|(t, d)| d.is_none_or(|d| d == *t)));
            assert!(a.values().any(|(_, d)| d.is_some()));
        }
    }
}
