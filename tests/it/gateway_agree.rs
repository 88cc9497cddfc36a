//! Issue 40, "same decisions": for random route configs (upstreams with
//! their own limits, concurrency caps, cooldowns and breakers; a route of
//! one or two tiers, first or weighted, with a fallback route) and random
//! reply sequences, the simulation's router and the proxy choose the same
//! upstreams.
//!
//! The one config is written twice, as a hosted experiment file (each
//! upstream simulated by a profile) and as a proxy config (the same
//! profile for its limits, a URL and no credential), and loaded by each
//! door's own loader: the core configs they give are equal. Then each side
//! is driven through its own code — the simulation's
//! `hosted::routed::Upstreams` (attempts answered as the sequence says:
//! an HTTP status with a `retry-after-ms` hint, a timeout, a refused
//! connection) and the proxy's `qsim_live::gateway::LiveGateway` (the
//! same answers as an HTTP head, its hint read from the headers) — with
//! the same draws, and every step (the upstream chosen, the refusal and
//! its time, the answer) is the same.

use proptest::prelude::*;
use qsim_core::gateway::Step;
use qsim_core::limiter::rates::Cost;
use qsim_live::gateway::{LiveGateway, Outcome};
use qsim_sim::hosted::routed::{Attempt, AttemptReply, Next, Upstreams};
use std::fmt::Write;

fn cases() -> u32 {
    std::env::var("QSIM_PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(400)
}

/// SplitMix64, the tests' draws (both sides get their own copy).
#[derive(Clone)]
struct Draws(u64);
impl Draws {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

#[derive(Debug, Clone)]
struct Up {
    rpm: Option<u64>,
    tpm: Option<u64>,
    max_in_flight: Option<u64>,
    cooldown_ms: u64,
    failures: u64,
    open_ms: u64,
    timeout_ms: u64,
}

fn up() -> impl Strategy<Value = Up> {
    (
        prop::option::of(1u64..8),
        prop::option::of(200u64..3000),
        prop::option::of(1u64..4),
        0u64..4000,
        0u64..4,
        1000u64..20000,
        500u64..10000,
    )
        .prop_map(
            |(rpm, tpm, max_in_flight, cooldown_ms, failures, open_ms, timeout_ms)| Up {
                rpm,
                tpm,
                max_in_flight,
                cooldown_ms,
                failures,
                open_ms,
                timeout_ms,
            },
        )
}

/// The tables both files share, and the door's own fields per upstream.
fn tables(
    ups: &[Up],
    order: &[usize],
    cut: usize,
    weights: &Option<Vec<u64>>,
    proxy: bool,
) -> String {
    let mut s = String::new();
    for (i, u) in ups.iter().enumerate() {
        let _ = writeln!(s, "[[upstream]]\nname = \"u{i}\"\nprofile = \"p{i}.toml\"");
        let mut limits = vec![];
        if let Some(t) = u.tpm {
            limits.push(format!(
                "{{ name = \"TPM\", counts = \"tokens\", limit = {t}, window_s = 60 }}"
            ));
        }
        if !limits.is_empty() {
            let _ = writeln!(s, "limits = [{}]", limits.join(", "));
        }
        if let Some(m) = u.max_in_flight {
            let _ = writeln!(s, "max_in_flight = {m}");
        }
        let _ = writeln!(
            s,
            "cooldown_s = {}\ntimeout_s = {}\nbreaker = {{ failures = {}, open_s = {} }}",
            u.cooldown_ms as f64 / 1000.0,
            u.timeout_ms as f64 / 1000.0,
            u.failures,
            u.open_ms as f64 / 1000.0
        );
        if proxy {
            let _ = writeln!(
                s,
                "url = \"http://127.0.0.1:{}\"\ncredential = \"none\"",
                9 + i
            );
        }
        s.push('\n');
    }
    let names = |xs: &[usize]| {
        xs.iter()
            .map(|i| format!("\"u{i}\""))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let (a, b) = order.split_at(cut);
    let _ = writeln!(s, "[[route]]\nmodel = \"*\"\nupstreams = [{}]", names(a));
    if !b.is_empty() {
        let _ = writeln!(
            s,
            "fallback = \"m1\"\n\n[[route]]\nmodel = \"m1\"\nupstreams = [{}]",
            names(b)
        );
        if let Some(w) = weights {
            let ws: Vec<String> = w.iter().take(b.len()).map(|x| x.to_string()).collect();
            let _ = writeln!(s, "policy = \"weighted\"\nweights = [{}]", ws.join(", "));
        }
    } else if let Some(w) = weights {
        let ws: Vec<String> = w.iter().take(a.len()).map(|x| x.to_string()).collect();
        let _ = writeln!(s, "policy = \"weighted\"\nweights = [{}]", ws.join(", "));
    }
    s
}

fn profile(rpm: Option<u64>) -> String {
    format!(
        "kind = \"hosted\"\nname = \"p\"\n[[limits]]\nname = \"RPM\"\ncounts = \"requests\"\nlimit = {}\nwindow_s = 60\n\
         [rejection]\nhint = \"retry_after_ms\"\nlatency = {{ dist = \"const\", value = 0.05 }}\n\
         [latency]\nttft = {{ dist = \"const\", value = 0.2 }}\ntpot = {{ dist = \"const\", value = 0.01 }}\n",
        rpm.unwrap_or(1_000_000)
    )
}

/// An attempt's answer as the sequence gives it.
#[derive(Debug, Clone, Copy)]
enum Ans {
    Status(u16, Option<u64>),
    Timeout,
    Refused,
}

fn ans(k: u64, hint_ms: u64) -> Ans {
    match k % 10 {
        0..=3 => Ans::Status(200, None),
        4 => Ans::Status(429, None),
        5 => Ans::Status(429, Some(hint_ms)),
        6 => Ans::Status(500, None),
        7 => Ans::Timeout,
        8 => Ans::Refused,
        _ => Ans::Status(400, None),
    }
}

/// What a step is, in the terms both sides share (the simulation's
/// refusal is a 429 or 503 with a hint; the proxy's `Step::Refuse`).
#[derive(Debug, Clone, PartialEq)]
enum Said {
    Send(usize),
    Refuse(u16, Option<u64>),
    Answer,
}

#[test]
fn the_simulation_and_the_proxy_choose_the_same_upstreams() {
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: cases(),
        failure_persistence: None,
        rng_seed: proptest::test_runner::RngSeed::Fixed(0x40_0a9e),
        ..ProptestConfig::default()
    });
    let configs = (
        prop::collection::vec(up(), 1..5),
        any::<u64>(),
        prop::option::of(prop::collection::vec(1u64..6, 4)),
        any::<u64>(),
    );
    let checked = std::cell::Cell::new(0u64);
    let r = runner.run(&configs, |(ups, shuffle, weights, seed)| {
        checked.set(checked.get() + one(&ups, shuffle, &weights, seed)?);
        Ok(())
    });
    if let Err(e) = r {
        panic!("{e}");
    }
    let checked = checked.get();
    assert!(
        checked > cases() as u64 * 20,
        "only {checked} steps compared"
    );
}

fn one(
    ups: &[Up],
    shuffle: u64,
    weights: &Option<Vec<u64>>,
    seed: u64,
) -> Result<u64, TestCaseError> {
    let n = ups.len();
    let mut d = Draws(shuffle);
    let mut order: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        order.swap(i, d.below(i as u64 + 1) as usize);
    }
    let cut = if n > 1 {
        1 + d.below(n as u64) as usize
    } else {
        1
    };
    let cut = cut.min(n);
    let dir = tempfile::tempdir().unwrap();
    for (i, u) in ups.iter().enumerate() {
        std::fs::write(dir.path().join(format!("p{i}.toml")), profile(u.rpm)).unwrap();
    }
    let sim = format!(
        "kind = \"hosted\"\nrows = 1\nmax_tokens = 10\nworkers = 1\n\
         input_tokens = {{ dist = \"const\", value = 10 }}\noutput_tokens = {{ dist = \"const\", value = 10 }}\n\
         [[experiment]]\nname = \"e\"\nclient = \"pool\"\n\n{}",
        tables(ups, &order, cut, weights, false)
    );
    let proxy = format!(
        "kind = \"proxy\"\n[proxy]\nunknown_consumer = \"all\"\n[deployment]\ncapacity = 1000\n[[consumer]]\nname = \"all\"\n\n{}",
        tables(ups, &order, cut, weights, true)
    );
    let (sp, pp) = (dir.path().join("sim.toml"), dir.path().join("proxy.toml"));
    std::fs::write(&sp, &sim).unwrap();
    std::fs::write(&pp, &proxy).unwrap();
    let v: toml::Value = toml::from_str(&sim).unwrap();
    let suite = qsim_sim::experiment::HostedSuite::from_value(&sp, v)
        .map_err(|e| TestCaseError::fail(format!("{e}\n{sim}")))?;
    let routes = suite.routes.clone().expect("routed");
    let cfg = qsim_api::proxy::load(&qsim_api::proxy::Spec {
        config: pp,
        ..Default::default()
    })
    .map_err(|e| TestCaseError::fail(format!("{e}\n{proxy}")))?;
    // the one config, as each door reads it
    prop_assert_eq!(&routes.core, &cfg.routes.core);

    let mut simgw = Upstreams::new(&routes, 0, 1, 0);
    let live = LiveGateway::new(cfg.routes.clone(), 0, 0).unwrap();
    let (mut ds, mut dp) = (Draws(seed), Draws(seed));
    let mut seq = Draws(seed ^ 0x5eed);
    // requests in flight: (sim ticket, proxy hold, attempt upstream, cost)
    let mut live_reqs: Vec<(
        qsim_core::gateway::Ticket,
        qsim_live::gateway::Hold,
        usize,
        Cost,
    )> = Vec::new();
    let mut now = 0u64;
    let mut steps = 0;
    let said_sim = |n: &Next| match n {
        Next::Again(a) => Said::Send(a.upstream),
        Next::Answer(c) if c.upstream.is_none() => Said::Refuse(c.status, c.hint),
        Next::Answer(_) => Said::Answer,
    };
    let said_proxy = |s: &Step, now: u64| match *s {
        Step::Send { upstream, .. } => Said::Send(upstream),
        Step::Refuse { why, retry_at } => Said::Refuse(
            match why {
                qsim_core::gateway::Refused::Limited => 429,
                qsim_core::gateway::Refused::Unavailable => 503,
            },
            retry_at.map(|t| t - now),
        ),
        Step::Answer => Said::Answer,
    };
    for _ in 0..seq.below(150) + 30 {
        now += seq.below(2500) * 1_000_000;
        if live_reqs.is_empty() || seq.below(3) == 0 {
            let cost = Cost {
                input_tokens: 1 + seq.below(300),
                max_tokens: 1 + seq.below(300),
            };
            let (t, sn) = simgw.start_with(now, cost, 10, &mut |k: u64| ds.below(k));
            let (h, st) = live
                .start_with(now, "any-model", cost, &mut |k: u64| dp.below(k))
                .expect("the route for every model");
            let (a, b) = (said_sim(&sn), said_proxy(&st, now));
            prop_assert_eq!(&a, &b, "start at {}", now);
            steps += 1;
            if let Said::Send(u) = a {
                live_reqs.push((t, h, u, cost));
            }
            continue;
        }
        let i = seq.below(live_reqs.len() as u64) as usize;
        let (mut t, mut h, u, cost) = live_reqs.swap_remove(i);
        let answer = ans(seq.next(), seq.below(3000));
        let sim_reply = match answer {
            Ans::Status(200, _) => AttemptReply::Ok { output: 5 },
            Ans::Status(s, hint) => AttemptReply::Status {
                status: s,
                hint: hint.map(|ms| ms * 1_000_000),
            },
            Ans::Timeout => AttemptReply::Timeout,
            Ans::Refused => AttemptReply::Refused,
        };
        let proxy_outcome = match answer {
            Ans::Status(s, hint) => {
                let mut hm = qsim_live::HeaderMap::new();
                if let Some(ms) = hint {
                    hm.insert("retry-after-ms", ms.to_string().parse().unwrap());
                }
                Outcome::of_head(s, &hm, 1.0)
            }
            Ans::Timeout => Outcome::Timeout,
            Ans::Refused => Outcome::Unreachable,
        };
        let sn = simgw.reply_with(
            &mut t,
            Attempt {
                at: now,
                upstream: u,
                reply: sim_reply,
                limit: None,
            },
            cost,
            10,
            &mut |k: u64| ds.below(k),
        );
        let st = live.reply_with(now, &mut h, proxy_outcome, &mut |k: u64| dp.below(k));
        let (a, b) = (said_sim(&sn), said_proxy(&st, now));
        prop_assert_eq!(&a, &b, "reply {:?} of upstream {} at {}", answer, u, now);
        steps += 1;
        match a {
            Said::Send(v) => live_reqs.push((t, h, v, cost)),
            // the simulation settles a success at its reply: so does the proxy here
            Said::Answer if matches!(answer, Ans::Status(200, _)) => {
                live.end(now, &mut h, 5);
            }
            _ => {}
        }
    }
    Ok(steps)
}
