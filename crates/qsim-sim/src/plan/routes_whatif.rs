//! `qsim whatif` under other routes: the requests a proxy's decision log
//! shows admitted, replayed at their logged decision times through the
//! gateway (`qsim_core::gateway`) of a proposed config, against a model of
//! the upstreams made from the log's own attempts.
//!
//! **The upstreams' replies.** Each logged attempt (the record's `trail`:
//! upstream, result, sent, replied) is a sample of its upstream at the time
//! it was sent. A replayed attempt at upstream `u` at time `t` gets the
//! result of `u`'s latest logged attempt sent at or before `t` (else its
//! first), after that attempt's latency; so an upstream that failed from
//! 10:02 until it answered again at 10:05 fails every replayed attempt in
//! that span, and one that was rate limited is rate limited (without a
//! hint: its cooldown is the proposed one). A success takes the latency
//! of the request's own answering attempt, and its answer ends as long
//! after as it did in the log. An upstream the log never saw answers every
//! attempt. The proposed upstreams' own limits and the route decide where
//! each attempt goes; nothing else (no retries by callers: a request the
//! gateway answers with an error counts as an error the client saw).
//!
//! Deterministic: the weighted choices draw from a SplitMix64 stream of
//! seed 0; events at equal times run in the order they were scheduled.

use crate::engine::EventQueue;
use crate::limiter::rates::Cost;
use crate::time::Nanos;
use qsim_core::gateway::{Config, Gateway, Refused, Reply, Step, Ticket};
use std::collections::BTreeMap;

/// One logged attempt.
#[derive(Debug, Clone, PartialEq)]
pub struct LoggedAttempt {
    pub upstream: String,
    pub reply: Reply,
    /// Core times (ns).
    pub sent: Nanos,
    pub replied: Nanos,
}

/// One logged request the limiter admitted.
#[derive(Debug, Clone, PartialEq)]
pub struct LoggedRequest {
    /// When it was decided (admitted).
    pub at: Nanos,
    pub model: String,
    pub input_tokens: u64,
    pub max_tokens: u64,
    pub output_tokens: u64,
    /// When its answer ended (settled).
    pub end: Option<Nanos>,
    pub attempts: Vec<LoggedAttempt>,
    /// The status the client got.
    pub status: u16,
}

/// A reply name as the decision log writes it (`Reply::name`).
pub fn reply_named(name: &str) -> Option<Reply> {
    Some(match name {
        "ok" => Reply::Ok,
        "rate_limited" => Reply::RateLimited { hint: None },
        "server_error" => Reply::ServerError,
        "timeout" => Reply::Timeout,
        "refused" => Reply::Refused,
        "client_error" => Reply::ClientError,
        _ => return None,
    })
}

/// A record's `trail` (`upstream,result,sent,replied;…`, times after
/// `arrival`) as attempts; None if it does not parse.
pub fn parse_trail(trail: &str, arrival: Nanos) -> Option<Vec<LoggedAttempt>> {
    trail
        .split(';')
        .filter(|a| !a.is_empty())
        .map(|a| {
            let mut it = a.rsplitn(4, ',');
            let replied: Nanos = it.next()?.parse().ok()?;
            let sent: Nanos = it.next()?.parse().ok()?;
            let reply = reply_named(it.next()?)?;
            let upstream = it.next()?.to_string();
            Some(LoggedAttempt {
                upstream,
                reply,
                sent: arrival.saturating_add(sent),
                replied: arrival.saturating_add(replied),
            })
        })
        .collect()
}

/// Counts per upstream.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct UpCounts {
    pub name: String,
    pub attempts: u64,
    /// Requests whose answer it gave (any status).
    pub answered: u64,
    pub ok: u64,
    pub rate_limited: u64,
    pub failures: u64,
}

/// Observed and what-if, side by side.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct RouteWhatif {
    pub requests: u64,
    /// Upstreams of the log and of the proposed routes, the log's first.
    pub observed: Vec<UpCounts>,
    pub whatif: Vec<UpCounts>,
    /// Requests whose client saw an upstream error (5xx, 429, timeout,
    /// refused) or the gateway's refusal.
    pub observed_errors: u64,
    pub whatif_errors: u64,
    /// The proposed gateway's refusals: limited, unavailable; and requests
    /// no proposed route serves.
    pub refused: [u64; 2],
    pub no_route: u64,
}

/// The model of one upstream: its logged attempts by time sent.
struct Samples(Vec<(Nanos, Reply, Nanos)>);

impl Samples {
    fn at(&self, t: Nanos) -> Option<(Reply, Nanos)> {
        let i = self.0.partition_point(|s| s.0 <= t);
        let s = if i == 0 {
            self.0.first()?
        } else {
            &self.0[i - 1]
        };
        Some((s.1, s.2))
    }
}

#[derive(Clone, Copy)]
enum Ev {
    Start(usize),
    Reply {
        req: usize,
        upstream: usize,
        reply: Reply,
    },
    Finish(usize),
}

/// Replay `reqs` through `cfg`'s gateway.
pub fn replay(reqs: &[LoggedRequest], cfg: &Config) -> RouteWhatif {
    let mut names: Vec<String> = Vec::new();
    let index = |n: &str, names: &mut Vec<String>| match names.iter().position(|x| x == n) {
        Some(i) => i,
        None => {
            names.push(n.to_string());
            names.len() - 1
        }
    };
    // the observed side, and the samples
    let mut samples: BTreeMap<String, Vec<(Nanos, Reply, Nanos)>> = BTreeMap::new();
    let mut observed: Vec<UpCounts> = Vec::new();
    let mut out = RouteWhatif {
        requests: reqs.len() as u64,
        ..RouteWhatif::default()
    };
    for r in reqs {
        for (k, a) in r.attempts.iter().enumerate() {
            let i = index(&a.upstream, &mut names);
            if observed.len() <= i {
                observed.resize(i + 1, UpCounts::default());
            }
            let c = &mut observed[i];
            c.name = a.upstream.clone();
            c.attempts += 1;
            match a.reply {
                Reply::Ok => c.ok += 1,
                Reply::RateLimited { .. } => c.rate_limited += 1,
                r if r.is_failure() => c.failures += 1,
                _ => {}
            }
            if k + 1 == r.attempts.len() {
                c.answered += 1;
            }
            samples.entry(a.upstream.clone()).or_default().push((
                a.sent,
                a.reply,
                a.replied.saturating_sub(a.sent),
            ));
        }
        if is_error(r.status) {
            out.observed_errors += 1;
        }
    }
    for u in &cfg.upstreams {
        index(&u.name, &mut names);
    }
    let model: Vec<Option<Samples>> = cfg
        .upstreams
        .iter()
        .map(|u| {
            samples.remove(&u.name).map(|mut v| {
                v.sort_by_key(|s| s.0);
                Samples(v)
            })
        })
        .collect();
    let mut whatif: Vec<UpCounts> = names
        .iter()
        .map(|n| UpCounts {
            name: n.clone(),
            ..UpCounts::default()
        })
        .collect();
    let up_index: Vec<usize> = cfg
        .upstreams
        .iter()
        .map(|u| names.iter().position(|n| *n == u.name).expect("indexed"))
        .collect();
    let mut gw = Gateway::new(cfg.clone(), 0).expect("checked when loaded");
    let mut seed = 0u64;
    let mut below = move |n: u64| {
        seed = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = seed;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        ((z as u128 * n as u128) >> 64) as u64
    };
    let mut order: Vec<usize> = (0..reqs.len()).collect();
    order.sort_by_key(|&i| (reqs[i].at, i));
    let t0 = order.first().map_or(0, |&i| reqs[i].at);
    let mut q: EventQueue<Ev> = EventQueue::starting_at(t0);
    for &i in &order {
        q.schedule(reqs[i].at, Ev::Start(i));
    }
    let mut tickets: Vec<Option<Ticket>> = vec![None; reqs.len()];
    let cost = |r: &LoggedRequest| Cost {
        input_tokens: r.input_tokens,
        max_tokens: r.max_tokens,
    };
    // the logged latency of a success: its answering attempt's, and the
    // answer's length after it
    let ok_times = |r: &LoggedRequest| -> (Nanos, Nanos) {
        match r.attempts.last() {
            Some(a) if a.reply == Reply::Ok => (
                a.replied.saturating_sub(a.sent),
                r.end.map_or(0, |e| e.saturating_sub(a.replied)),
            ),
            _ => (0, 0),
        }
    };
    let send =
        |q: &mut EventQueue<Ev>, now: Nanos, req: usize, u: usize, whatif: &mut Vec<UpCounts>| {
            whatif[up_index[u]].attempts += 1;
            let (reply, lat) = match &model[u] {
                Some(s) => match s.at(now).expect("a sampled upstream has samples") {
                    (Reply::Ok, _) => (Reply::Ok, ok_times(&reqs[req]).0),
                    (r, l) => (r, l),
                },
                None => (Reply::Ok, ok_times(&reqs[req]).0),
            };
            q.schedule(
                now.saturating_add(lat),
                Ev::Reply {
                    req,
                    upstream: u,
                    reply,
                },
            );
        };
    while let Some((now, Some(ev))) = q.step(&mut crate::engine::NoDeadlines) {
        match ev {
            Ev::Start(i) => {
                let r = &reqs[i];
                let Some(route) = cfg.route_for(&r.model) else {
                    out.no_route += 1;
                    out.whatif_errors += 1;
                    continue;
                };
                let (t, step) = gw.start(now, route, cost(r), &mut below);
                tickets[i] = Some(t);
                match step {
                    Step::Send { upstream, .. } => send(&mut q, now, i, upstream, &mut whatif),
                    Step::Refuse { why, .. } => {
                        out.refused[(why == Refused::Unavailable) as usize] += 1;
                        out.whatif_errors += 1;
                    }
                    Step::Answer => {}
                }
            }
            Ev::Reply {
                req,
                upstream,
                reply,
            } => {
                let t = tickets[req].as_mut().expect("started");
                let c = &mut whatif[up_index[upstream]];
                match reply {
                    Reply::Ok => c.ok += 1,
                    Reply::RateLimited { .. } => c.rate_limited += 1,
                    r if r.is_failure() => c.failures += 1,
                    _ => {}
                }
                match gw.on_reply(now, t, reply, &mut below) {
                    Step::Send { upstream, .. } => send(&mut q, now, req, upstream, &mut whatif),
                    Step::Refuse { why, .. } => {
                        out.refused[(why == Refused::Unavailable) as usize] += 1;
                        out.whatif_errors += 1;
                    }
                    Step::Answer => {
                        whatif[up_index[upstream]].answered += 1;
                        if reply == Reply::Ok {
                            q.schedule(now.saturating_add(ok_times(&reqs[req]).1), Ev::Finish(req));
                        } else if reply != Reply::ClientError {
                            out.whatif_errors += 1;
                        }
                    }
                }
            }
            Ev::Finish(i) => {
                if let Some(t) = tickets[i].as_mut() {
                    gw.finish(now, t, reqs[i].output_tokens);
                }
            }
        }
    }
    observed.resize(names.len(), UpCounts::default());
    for (i, n) in names.iter().enumerate() {
        observed[i].name = n.clone();
    }
    out.observed = observed;
    out.whatif = whatif;
    out
}

/// A status the client saw as an upstream's or the gateway's error.
fn is_error(status: u16) -> bool {
    status == 429 || status >= 500
}

/// The section of the what-if report.
pub fn render(w: &RouteWhatif) -> String {
    let mut t = crate::report::table::Table::new([
        "upstream",
        "attempts",
        "answered",
        "429s",
        "failures",
        "what-if attempts",
        "answered",
        "429s",
        "failures",
    ]);
    for (o, x) in w.observed.iter().zip(&w.whatif) {
        t.row([
            o.name.clone(),
            o.attempts.to_string(),
            o.answered.to_string(),
            o.rate_limited.to_string(),
            o.failures.to_string(),
            x.attempts.to_string(),
            x.answered.to_string(),
            x.rate_limited.to_string(),
            x.failures.to_string(),
        ]);
    }
    format!(
        "\nroutes: the {} admitted requests through the proposed routes (upstreams replying as logged)\n{}\
         errors the clients saw: observed {}, what-if {} (refused by the gateway: {} limited, {} unavailable; no route: {})\n",
        w.requests,
        t.render(),
        w.observed_errors,
        w.whatif_errors,
        w.refused[0],
        w.refused[1],
        w.no_route
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trails_parse_back() {
        let a = parse_trail("ptu,refused,10,20;paygo,ok,25,900", 1000).unwrap();
        assert_eq!(a.len(), 2);
        assert_eq!(a[0].upstream, "ptu");
        assert_eq!(a[0].reply, Reply::Refused);
        assert_eq!((a[1].sent, a[1].replied), (1025, 1900));
        assert!(parse_trail("x,nonsense,1,2", 0).is_none());
    }
}
