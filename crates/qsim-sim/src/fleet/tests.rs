//! The fleet against the server experiment's driver, and routing between
//! pools.

use super::run::{run_observed, Observer, RunOpts};
use super::workload::{Arrival, Len, Source, Workload, SCOPE};
use super::*;
use crate::engine::RawDist;
use crate::experiment::server::{run_scenario_observed, Load, Scenario};
use crate::server::{load_profile, RouterKind};
use crate::time::secs;
use crate::workload::{ArrivalProcess, Lengths, RawArrivals};

pub(crate) fn profile(name: &str) -> Arc<ServerProfile> {
    Arc::new(
        load_profile(
            &std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join(format!("../../models/{name}.toml")),
        )
        .unwrap(),
    )
}

pub(crate) fn lengths() -> Lengths {
    Lengths::from_raw(
        "t",
        "",
        &RawDist::Lognormal {
            p50: 600.0,
            p95: 3000.0,
            min: Some(1.0),
            max: Some(8000.0),
        },
        &RawDist::Lognormal {
            p50: 180.0,
            p95: 700.0,
            min: Some(1.0),
            max: Some(2000.0),
        },
    )
    .unwrap()
}

pub(crate) fn pool(name: &str, p: Arc<ServerProfile>, replicas: u32, policy: Policy) -> PoolSpec {
    PoolSpec {
        name: name.into(),
        profile_label: p.name.clone(),
        profile: p,
        replicas,
        autoscale: None,
        policy,
        models: vec![0],
        max_tokens: None,
        min_tokens: None,
        replica_hour_usd: 1.0,
        prefix_cache: false,
        role: Role::Serve,
    }
}

#[derive(Default)]
struct Collect(Vec<Completion>);
impl Observer for Collect {
    fn completed(&mut self, c: &FleetCompletion) {
        self.0.push(c.c);
    }
}

/// A fleet of one pool gives exactly what the server experiment's driver
/// gives for the same cluster and arrivals, with each of today's routers,
/// stepwise and lazily: one pool with today's routers is today's model.
#[test]
fn one_pool_is_the_server_experiment() {
    let prof = profile("llama-3.1-8b-h100-vllm");
    for router in [
        RouterKind::RoundRobin,
        RouterKind::LeastOutstanding,
        RouterKind::LeastKv,
    ] {
        let rate = 40.0;
        let process = ArrivalProcess::new(&RawArrivals::Poisson, rate).unwrap();
        let duration = secs(120.0);
        let s = Scenario {
            index: SCOPE,
            name: "x".into(),
            description: String::new(),
            load: Load::Open {
                rpm: rate * 60.0,
                process: process.clone(),
            },
            lengths: lengths(),
            duration,
            replicas: 3,
            router,
            drain: true,
            snapshots: vec![],
            autoscale: None,
        };
        let mut want = Vec::new();
        let (r, _) =
            run_scenario_observed(prof.clone(), &s, 7, SCOPE, None, &mut |c| want.push(*c));
        let spec = FleetSpec {
            models: vec!["*".into()],
            pools: vec![pool("p", prof.clone(), 3, router.policy())],
            route: Policy::First,
            prefix_unit: None,
        };
        let w = Workload {
            source: Source::Open {
                process,
                len: Len::Dists(lengths()),
                prefix: None,
            },
            mix: vec![(0, 1.0)],
        };
        for lazy in [true, false] {
            let mut got = Collect::default();
            let opts = RunOpts {
                lazy,
                ..RunOpts::new(duration)
            };
            let fr = run_observed(&spec, &w, opts, 7, &mut got).unwrap();
            assert!(want.len() > 3000, "{}", want.len());
            assert!(
                got.0 == want,
                "{router:?} lazy {lazy}: the completions differ"
            );
            assert_eq!(
                fr.lat.e2e.quantile_s(0.99),
                r.metrics.total(r.until).e2e.quantile_s(0.99)
            );
        }
    }
}

/// Requests go only to pools serving their model and length; `first`
/// takes the first such pool in order; a request no pool serves is
/// counted, never answered.
#[test]
fn pools_by_model_and_length() {
    let prof = profile("llama-3.1-8b-h100-vllm");
    let mut short = pool("short", prof.clone(), 2, Policy::LeastOutstanding);
    short.max_tokens = Some(1000);
    short.models = vec![0];
    let mut long = pool("long", prof.clone(), 2, Policy::LeastOutstanding);
    long.models = vec![0];
    let mut other = pool("other", prof.clone(), 1, Policy::RoundRobin);
    other.models = vec![1];
    other.max_tokens = Some(500);
    let spec = FleetSpec {
        models: vec!["a".into(), "b".into()],
        pools: vec![short, long, other],
        route: Policy::First,
        prefix_unit: None,
    };
    let w = Workload {
        source: Source::Open {
            process: ArrivalProcess::new(&RawArrivals::Poisson, 20.0).unwrap(),
            len: Len::Dists(lengths()),
            prefix: None,
        },
        mix: vec![(0, 0.7), (1, 1.0)],
    };
    struct Check {
        seen: [u64; 4],
    }
    impl Observer for Check {
        fn routed(&mut self, _id: u64, a: &Arrival, _h: &[u64], to: Option<(usize, u32)>) {
            let pool = to.map(|t| t.0);
            let tokens = (a.input + a.output) as u64;
            let want = match (a.model, tokens) {
                (0, t) if t <= 1000 => Some(0),
                (0, _) => Some(1),
                (_, t) if t <= 500 => Some(2),
                _ => None,
            };
            assert_eq!(pool, want, "{a:?}");
            self.seen[pool.unwrap_or(3)] += 1;
        }
    }
    let mut c = Check { seen: [0; 4] };
    let r = run_observed(&spec, &w, RunOpts::new(secs(200.0)), 3, &mut c).unwrap();
    assert!(c.seen.iter().all(|&n| n > 50), "{:?}", c.seen);
    assert_eq!(r.unrouted, c.seen[3]);
    assert_eq!(
        r.pools.iter().map(|p| p.lat.completed).sum::<u64>() + r.unrouted,
        r.arrivals
    );
}

/// A fleet file: pools from a profile file and from a model × GPU; each
/// kind of bad input names its field.
#[test]
fn fleet_files_load_and_bad_ones_name_the_field() {
    let dir = std::env::temp_dir().join(format!("qsim-fleet-cfg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let models = concat!(env!("CARGO_MANIFEST_DIR"), "/../../models");
    std::fs::write(dir.join("c.json"), "[[512, 0.3], [2048, 0.8], [8192, 1.0]]").unwrap();
    let file = |name: &str, pools: &str, workload: &str| {
        let text = format!("kind = \"fleet\"\nduration_s = 60\n{pools}\n[workload]\n{workload}\n");
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        config::load(&p)
    };
    let two = format!(
        r#"[[pool]]
name = "short"
profile = "{models}/llama-3.1-8b-h100-vllm.toml"
replicas = 3
max_tokens = 2048
[[pool]]
name = "long"
derive = {{ model = "llama-3.1-70b", gpu = "A100-80GB-SXM", tp = 8 }}
replicas = 2"#
    );
    let ok = file("ok.toml", &two, "rate = 10\ncdf = \"c.json\"").unwrap();
    assert_eq!(ok.fleet.pools.len(), 2);
    assert_eq!(
        ok.fleet.pools[1].profile_label,
        "llama-3.1-70b@A100-80GB-SXMx8"
    );
    assert!((ok.fleet.pools[1].replica_hour_usd - 8.0 * 2.21).abs() < 1e-9);
    assert!((ok.fleet.pools[0].replica_hour_usd - 3.78).abs() < 1e-9);
    let bad = |pools: &str, workload: &str| file("bad.toml", pools, workload).unwrap_err();
    let e = bad(
        &two.replace("llama-3.1-8b-h100-vllm", "no-such"),
        "rate = 10\ncdf = \"c.json\"",
    );
    assert_eq!(e.field, "pool.0.profile", "{e}");
    let e = bad(
        &two.replace("A100-80GB-SXM", "B200"),
        "rate = 10\ncdf = \"c.json\"",
    );
    assert_eq!(e.field, "pool.1.derive.gpu", "{e}");
    let e = bad(
        &two.replace("replicas = 3", "replicas = 0")
            .replace("replicas = 2", "replicas = 0"),
        "rate = 10\ncdf = \"c.json\"",
    );
    assert_eq!(e.field, "pool", "{e}");
    assert!(e.reason.contains("no replica"), "{e}");
    let e = bad(&two.replace("2048", "9000"), "rate = 10\ncdf = \"c.json\"");
    assert_eq!(e.field, "pool.0.max_tokens", "{e}");
    assert!(e.reason.contains("outside"), "{e}");
    let e = bad(
        &format!("{two}\nmodels = [\"a\"]"),
        "rate = 10\ncdf = \"c.json\"\nmix = { b = 1.0 }",
    );
    assert_eq!(e.field, "workload.mix.b", "{e}");
    std::fs::write(dir.join("c.json"), "[[512, 0.3], [2048, 0.2], [8192, 1.0]]").unwrap();
    let e = bad(&two, "rate = 10\ncdf = \"c.json\"");
    assert_eq!(
        (e.field.as_str(), e.source.ends_with("c.json")),
        ("cdf.1", true),
        "{e}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// With a cache that never evicts and each request arriving after the
/// previous one's prompt is computed, the hit ratio is the fraction of
/// full 512-token blocks of the Mooncake sample whose hash an earlier
/// request carried: counted here from the file alone, equal to the
/// replica's count unit for unit.
#[test]
fn unbounded_cache_hits_the_repeated_blocks_of_the_mooncake_trace() {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../data/mooncake/conversation_trace_10min.jsonl");
    let text = std::fs::read_to_string(&src).unwrap();
    // the independent count, and a copy 100 s apart
    let (mut full, mut repeated) = (0u64, 0u64);
    let mut seen = std::collections::HashSet::new();
    let mut spaced = String::new();
    for (i, line) in text.lines().enumerate() {
        let mut v: serde_json::Value = serde_json::from_str(line).unwrap();
        let input = v["input_length"].as_u64().unwrap();
        let hashes: Vec<u64> = v["hash_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| h.as_u64().unwrap())
            .collect();
        let f = &hashes[..(input / 512) as usize];
        full += f.len() as u64;
        repeated += f.iter().filter(|h| seen.contains(*h)).count() as u64;
        seen.extend(f.iter().copied());
        v["timestamp"] = serde_json::json!(i as u64 * 100_000);
        spaced += &format!("{v}\n");
    }
    assert!(full > 20_000 && repeated * 4 > full, "{repeated} of {full}");
    let dir = std::env::temp_dir().join(format!("qsim-fleet-mc-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("spaced.jsonl");
    std::fs::write(&path, spaced).unwrap();
    let mut p = (*profile("llama-3.1-8b-h100-vllm")).clone();
    p.total_blocks = 40_000_000;
    p.max_model_len = 1 << 20;
    let mut pool = pool("one", Arc::new(p), 1, Policy::First);
    pool.prefix_cache = true;
    let spec = FleetSpec {
        models: vec!["*".into()],
        pools: vec![pool],
        route: Policy::First,
        prefix_unit: Some(512),
    };
    let w = Workload {
        source: Source::Hashed(Arc::new(
            workload::HashedSpec::scan(&path, 512, 1.0).unwrap(),
        )),
        mix: vec![(0, 1.0)],
    };
    let r = super::run::run(&spec, &w, RunOpts::new(secs(1e6)), 1).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(r.arrivals, text.lines().count() as u64);
    let s = r.prefix();
    assert_eq!((s.units, s.hit_units), (full, repeated));
}

/// Drive a timed component until it has nothing left to do.
fn drain<T: crate::engine::Timed>(t: &mut T) {
    while let Some(at) = t.poll_timeout() {
        t.handle_timeout(at);
    }
}

/// Prefill/decode disaggregation, one request alone: its TTFT is the
/// prefill pool's prefill, then the KV transfer (prompt × KV bytes per
/// token over the link), then the decode replica's first step with the
/// prompt's KV already there; each part measured on its own cluster. A
/// prompt within `local_max` skips the prefill pool: exactly a plain pool.
#[test]
fn disaggregated_ttft_is_prefill_then_transfer_then_decode() {
    let prof = profile("llama-3.1-8b-h100-vllm");
    let link = PrefillLink {
        pool: 1,
        bytes_per_s: 25e9,
        local_max: 100,
    };
    let spec = |role: Role| FleetSpec {
        models: vec!["*".into()],
        pools: vec![
            PoolSpec {
                role,
                ..pool("decode", prof.clone(), 2, Policy::LeastOutstanding)
            },
            PoolSpec {
                role: Role::Prefill,
                ..pool("prefill", prof.clone(), 1, Policy::LeastOutstanding)
            },
        ],
        route: Policy::First,
        prefix_unit: None,
    };
    for input in [3000u32, 100] {
        let req = Request {
            id: 0,
            input_tokens: input,
            output_tokens: 50,
        };
        let mut f = Fleet::new(&spec(Role::Decode(link)), 3);
        // the decode pool (its two idle replicas tie: the ROUTER stream picks)
        assert!(matches!(f.submit(1000, req, 0, &[]), Some((0, _))));
        drain(&mut f);
        let got = f.poll_completion().expect("it leaves");
        assert!(f.poll_completion().is_none());
        assert_eq!((got.pool, got.c.arrival), (0, 1000));
        let mut want = Cluster::with_policy(prof.clone(), 1, Policy::LeastOutstanding, 0);
        if input > link.local_max {
            let mut p = Cluster::with_policy(prof.clone(), 1, Policy::LeastOutstanding, 0);
            p.submit(
                1000,
                Request {
                    output_tokens: 1,
                    ..req
                },
            );
            drain(&mut p);
            let done = p.poll_completion().unwrap().finished;
            let bytes = input as f64 * prof.kv_bytes_per_token;
            let at = done + (bytes / link.bytes_per_s * 1e9).ceil() as Nanos;
            want.submit_hashed(at, req, &[], input);
            let d = f.disagg_stats();
            assert_eq!((d.remote, d.local, d.transfers), (1, 0, 1));
            assert_eq!(d.transfer_ns, at - done);
        } else {
            want.submit(1000, req);
            assert_eq!(f.disagg_stats().local, 1);
        }
        drain(&mut want);
        let w = want.poll_completion().unwrap();
        assert_eq!(
            (got.c.first_token, got.c.finished),
            (w.first_token, w.finished),
            "input {input}"
        );
        // TTFT composed of both parts: more than the decode replica's own
        // first step, less than the whole request prefilled there
        if input > link.local_max {
            let mut alone = Cluster::with_policy(prof.clone(), 1, Policy::LeastOutstanding, 0);
            alone.submit(1000, req);
            drain(&mut alone);
            let a = alone.poll_completion().unwrap();
            assert!(
                got.c.first_token > a.first_token,
                "a transfer costs time alone"
            );
            assert!(got.c.first_token - w.arrival < a.first_token - 1000);
        }
    }
}
